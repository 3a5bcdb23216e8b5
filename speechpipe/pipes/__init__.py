"""Pipe classes, one package per stage of the flow. Importing this package registers them.

The flow, in the order a sample travels: ``sources`` -> ``shards`` / ``kaldi`` / ``interop``
-> ``decode`` -> ``audio`` / ``text`` -> ``order`` -> ``batching`` -> ``collate`` ->
``concurrency`` -> ``distributed``; ``_core`` holds the DataPipe base, the state protocol, the
restore driver and the graph walk. Each package's ``__init__`` is its face: other packages
import from the face, never from a ``_module`` of another package.
"""

from . import (  # noqa: F401  (registration: each package registers its functional names)
    _core, sources, shards, decode, kaldi, interop, audio, text, order, batching, collate,
    concurrency, distributed,
)
