"""Thread stages and the move to the device, under the name they shared before the split.

The thread stages (``prefetch_in_thread``, ``map_in_threads``, :func:`start`) live in
:mod:`speechpipe.pipes.threads`; the conversion to torch tensors and the move to a device
(``move_to_device``, :func:`to_device`) in :mod:`speechpipe.pipes.device`. This module
re-exports both, so that ``from speechpipe.pipes.concurrency import ...`` keeps working, and
``graph_nodes`` (from :mod:`speechpipe.pipes._graph`), which it offered before.
"""

from __future__ import annotations

from ._graph import graph_nodes
from .device import _LEAVES  # noqa: F401  (loader.py imports it from here)
from .device import DeviceMover, DeviceMoverIterDataPipe, to_device
from .threads import (
    Running,
    ThreadMapper,
    ThreadMapperIterDataPipe,
    ThreadPrefetcher,
    ThreadPrefetcherIterDataPipe,
    map_items_in_threads,
    prefetch_items,
    start,
)

__all__ = [
    "DeviceMover",
    "DeviceMoverIterDataPipe",
    "Running",
    "ThreadMapper",
    "ThreadMapperIterDataPipe",
    "ThreadPrefetcher",
    "ThreadPrefetcherIterDataPipe",
    "graph_nodes",
    "map_items_in_threads",
    "prefetch_items",
    "start",
    "to_device",
]
