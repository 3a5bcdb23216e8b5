"""Batching: budgets (constraints), lengths tables, buckets and block batches, batching views,
batches planned over virtual streams.

This is the package's face: other packages and
users import from here, never from its ``_modules``.
"""

from ._buckets import (
    BlockBatcherIterDataPipe, bucket_groups, DurationFilterIterDataPipe,
    LengthBucketerIterDataPipe, pack_batches,
)
from ._calibration import calibrate_budget, Calibration
from ._constraints import (
    batch_budget, BatchConstraint, BatchStats, BudgetWarning, IndexLength, LengthUnitError,
    OVERSIZE, PaddedArea, Quadratic, SampleCount, SumOfLengths, TwoDimensional,
)
from ._lengths import (
    compute_lengths, IndexDurationReaderIterDataPipe, read_data_len, select_keys,
    SELECTION_MODES,
)
from ._streams import (
    BatchPlanner, BatchPlannerIterDataPipe, plan_stream_batches, StreamPlan, UNEVEN,
)
from ._sampler import ViewSampler
from ._views import (
    BatchView, epoch_batches, form_batches, shard_batch, ViewLoader, ViewLoaderIterDataPipe,
)

__all__ = [
    "BatchConstraint",
    "BatchPlanner",
    "BatchPlannerIterDataPipe",
    "BatchStats",
    "BatchView",
    "BlockBatcherIterDataPipe",
    "BudgetWarning",
    "Calibration",
    "DurationFilterIterDataPipe",
    "IndexDurationReaderIterDataPipe",
    "IndexLength",
    "LengthBucketerIterDataPipe",
    "LengthUnitError",
    "OVERSIZE",
    "PaddedArea",
    "Quadratic",
    "SELECTION_MODES",
    "SampleCount",
    "StreamPlan",
    "SumOfLengths",
    "TwoDimensional",
    "UNEVEN",
    "ViewLoader",
    "ViewLoaderIterDataPipe",
    "ViewSampler",
    "batch_budget",
    "bucket_groups",
    "calibrate_budget",
    "compute_lengths",
    "epoch_batches",
    "form_batches",
    "pack_batches",
    "plan_stream_batches",
    "read_data_len",
    "select_keys",
    "shard_batch",
]
