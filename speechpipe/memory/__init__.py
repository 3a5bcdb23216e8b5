"""Memory machinery: mapped shard files, read-ahead, shared-memory transfer of batches.

This is the package's face: other packages and
users import from here, never from its ``_modules``.
"""

from ._mmap import copied_out, MappedFile, NETWORK_FILE_SYSTEMS
from ._readahead import ReadAhead, start_readahead, supported
from ._transfer import (
    forget_segments, forget_table, install, keep_table_while, MAX_BYTES, MIN_BYTES, new_table,
    PooledBatch, PoolStats, release_now, SLOTS, take,
)

__all__ = [
    "MAX_BYTES",
    "MIN_BYTES",
    "MappedFile",
    "NETWORK_FILE_SYSTEMS",
    "PoolStats",
    "PooledBatch",
    "ReadAhead",
    "SLOTS",
    "copied_out",
    "forget_table",
    "install",
    "keep_table_while",
    "new_table",
    "release_now",
    "start_readahead",
    "supported",
    "take",
]
