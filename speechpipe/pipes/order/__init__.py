"""Order: shard assignment and epoch plans, the streaming road, shuffles, sample lists, mixing.

This is the package's face: other packages and
users import from here, never from its ``_modules``.
"""

from ._assignment import (
    assign_shards, BALANCE, dist_world, EQUALIZE, LEVELS, ShardAssignment, ShardSplit,
    shuffle_shards, split_balance, split_shards, SplitBalance, uneven_split, UnevenSplitWarning,
)
from ._entries import common_tail, index_entries, path_parts
from ._lists import (
    FeistelOrder, SampleShuffler, SampleShufflerIterDataPipe, SampleSplitter,
    SampleSplitterIterDataPipe, source_rows,
)
from ._mixing import (
    mix_by_weight, NamedZipperIterDataPipe, pass_epoch, ReplacementSamplerIterDataPipe,
    sample_with_replacement, SourceStats, STOP, WeightedMixerIterDataPipe, zip_by_name,
)
from ._plans import EpochPlan, EpochProgress, PlannedShard
from ._streaming import (
    FORMATS, read_shard, shard_assignment, ShardedShuffler, ShardedShufflerIterDataPipe,
)
from ._window import drain_pool, join_by_key, KeyJoinerIterDataPipe, shuffle_buffer, shuffle_window

__all__ = [
    "BALANCE",
    "EQUALIZE",
    "EpochPlan",
    "EpochProgress",
    "FORMATS",
    "FeistelOrder",
    "KeyJoinerIterDataPipe",
    "LEVELS",
    "NamedZipperIterDataPipe",
    "PlannedShard",
    "ReplacementSamplerIterDataPipe",
    "STOP",
    "SampleShuffler",
    "SampleShufflerIterDataPipe",
    "SampleSplitter",
    "SampleSplitterIterDataPipe",
    "ShardAssignment",
    "ShardSplit",
    "ShardedShuffler",
    "ShardedShufflerIterDataPipe",
    "SourceStats",
    "SplitBalance",
    "UnevenSplitWarning",
    "WeightedMixerIterDataPipe",
    "assign_shards",
    "common_tail",
    "index_entries",
    "join_by_key",
    "mix_by_weight",
    "pass_epoch",
    "path_parts",
    "read_shard",
    "sample_with_replacement",
    "shard_assignment",
    "shuffle_buffer",
    "shuffle_shards",
    "shuffle_window",
    "split_balance",
    "split_shards",
    "uneven_split",
    "zip_by_name",
]
