"""Concurrency: background threads for I/O and decoding, the move to the device.

This is the package's face: other packages and
users import from here, never from its ``_modules``.
"""

from ._device import DeviceMover, DeviceMoverIterDataPipe, LEAVES, to_device
from ._threads import (
    map_items_in_threads, prefetch_items, Running, start, ThreadMapper,
    ThreadMapperIterDataPipe, ThreadPrefetcher, ThreadPrefetcherIterDataPipe,
)

__all__ = [
    "DeviceMover",
    "DeviceMoverIterDataPipe",
    "Running",
    "ThreadMapper",
    "ThreadMapperIterDataPipe",
    "ThreadPrefetcher",
    "ThreadPrefetcherIterDataPipe",
    "map_items_in_threads",
    "prefetch_items",
    "start",
    "to_device",
]
