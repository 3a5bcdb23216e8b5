"""speechpipe: composable, functional datapipes for speech training data.

Importing speechpipe registers every functional name (``open``, ``list_shards``,
``parse_scp``, ``read_shards``, ``decode``, ...) on torch's ``IterDataPipe``.
"""

__version__ = "0.1.0"

from .pipes import (  # noqa: E402,F401  (registration)
    audio, batching, collate, decode, device, distributed, kaldi, manifests, mixing, order,
    sharding, shards, sources, text, threads, views,
)
from .epochs import set_epoch  # noqa: E402

__all__ = ["set_epoch"]
