"""Tar shards in webdataset naming: the tar format, reading shards into samples, writing them.

This is the package's face: other packages and
users import from here, never from its ``_modules``.
"""

from ._copies import COPIES_FOLDER, node_copy_samples
from ._reader import (
    group_by_key, iter_tar_members, ShardReaderIterDataPipe, ShardReadOptions,
    split_member_name,
)
from ._tar import BLOCK, iter_members, MappedReader, StreamReader, TRUNCATED
from ._writer import encode_field, ShardWriter, write_shard

__all__ = [
    "BLOCK",
    "COPIES_FOLDER",
    "MappedReader",
    "ShardReadOptions",
    "ShardReaderIterDataPipe",
    "ShardWriter",
    "StreamReader",
    "TRUNCATED",
    "encode_field",
    "group_by_key",
    "iter_members",
    "iter_tar_members",
    "node_copy_samples",
    "split_member_name",
    "write_shard",
]
