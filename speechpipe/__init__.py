"""speechpipe: composable, functional datapipes for speech training data.

``import speechpipe as sp`` registers every functional name (``sharded_shuffle``, ``decode``,
``bucket_by_length``, ``block_batch``, ...) on torch's ``IterDataPipe`` and reaches every name
a pipeline needs, one dot from the package: the source wrappers, the cost models and batching
view, the collate, the shard index and writer, the loader, the uneven-input stage, the
tokenizers, the Kaldi-compatible features (``sp.fbank``...), the readers of what other tools
wrote (lhotse, Hugging Face datasets, object storage), the errors, and the recipes
(``sp.recipes.librispeech``...).
"""

__version__ = "0.1.0"

from . import pipes  # noqa: F401  (registration: every functional name)
from .demo import DEMO_CORPUS  # noqa: E402
from .diagnostics import BufferStats, Diagnostics, SkippedInputWarning  # noqa: E402
from .epochs import set_epoch  # noqa: E402
from .errors import (  # noqa: E402
    AudioFormatError, ChannelMismatchError, DataError, FolderLockedError, MissingDataError,
    OutputError, ResumeError, redact,
    SampleRateError, SpeechpipeError, UnsafeInputError, UnsupportedCodecError,
)
from .index import ShardEntry, ShardIndex  # noqa: E402
from .loader import Loader, PipeDataset, build_loader  # noqa: E402
from .pack import (  # noqa: E402
    PackReport, merge_pack, pack_data, pack_task, plan_pack,
)
from .pipes._core import Buffering, IterableWrapper, SequenceWrapper
from .pipes._core import ResumeWarning
from .pipes._core import EpochWarning
from .pipes.order import UnevenSplitWarning
from .pipes.audio import CmvnStats, compute_cmvn_stats, merge_cmvn_stats
from .pipes.decode import encode_audio
from .pipes.collate import DecodeCollate, PadCollate  # noqa: E402
from .pipes.concurrency import start  # noqa: E402
from .pipes.batching import (
    BatchConstraint, BatchStats, BudgetWarning, IndexLength, LengthUnitError, PaddedArea,
    Quadratic, SampleCount, SumOfLengths, TwoDimensional,
)
from .pipes.distributed import (
    DistributedStepError, EqualSteps, PlanMismatchWarning, StepPlanner, StepStats,
    UnevenStepsWarning,
)
from .pipes.order import shard_assignment, ShardSplit
from .pipes.interop import read_hf_dataset
from .pipes.audio import fbank, FbankOptions, log_mel, LogMelOptions, mfcc, MfccOptions
from .pipes.interop import read_lhotse, read_lhotse_shar, write_lhotse
from .pipes.shards import ShardWriter
from .pipes.order import EpochProgress
from .pipes.kaldi import kaldi_arks
from .pipes.sources import write_manifest_table
from .pipes.shards import ShardReadOptions  # noqa: E402
from .pipes.text import TextNormalizer
from .pipes.text import (
    build_tokenizer, CharTokenizer, load_tokenizer, SentencePieceTokenizer, WordTokenizer,
)
from .pipes.batching import BatchView, compute_lengths, read_data_len, select_keys
from .pipes.batching import Calibration, calibrate_budget
from .pipes.batching import StreamPlan
from .recipes import (  # noqa: E402
    FrontEnd, eval_pipeline, get_recipe, manifest_path, manifest_samples, pipeline_report,
    train_pipeline,
)
from .remote import RemoteOptions  # noqa: E402
from .telemetry import Telemetry  # noqa: E402
from .stats import corpus_stats  # noqa: E402
from . import recipes  # noqa: E402,F401

for _corpus in recipes.RECIPES:  # sp.recipes.<corpus> without an import of its own
    get_recipe(_corpus)
del _corpus

__all__ = [
    "AudioFormatError",
    "BatchConstraint",
    "BatchStats",
    "BatchView",
    "BudgetWarning",
    "BufferStats",
    "Buffering",
    "Calibration",
    "ChannelMismatchError",
    "CharTokenizer",
    "CmvnStats",
    "DEMO_CORPUS",
    "DataError",
    "DecodeCollate",
    "Diagnostics",
    "DistributedStepError",
    "EpochProgress",
    "EpochWarning",
    "EqualSteps",
    "FbankOptions",
    "FolderLockedError",
    "FrontEnd",
    "IndexLength",
    "IterableWrapper",
    "LengthUnitError",
    "Loader",
    "LogMelOptions",
    "MfccOptions",
    "MissingDataError",
    "OutputError",
    "PackReport",
    "PadCollate",
    "PaddedArea",
    "PipeDataset",
    "PipelineNode",
    "PlanMismatchWarning",
    "Quadratic",
    "RemoteOptions",
    "ResumeError",
    "ResumeWarning",
    "SampleCount",
    "SampleRateError",
    "SentencePieceTokenizer",
    "SequenceWrapper",
    "ShardEntry",
    "ShardIndex",
    "ShardReadOptions",
    "ShardSplit",
    "ShardWriter",
    "SkippedInputWarning",
    "SpeechpipeError",
    "StepPlanner",
    "StepStats",
    "StreamPlan",
    "SumOfLengths",
    "Telemetry",
    "TextNormalizer",
    "TwoDimensional",
    "UnevenSplitWarning",
    "UnevenStepsWarning",
    "UnsafeInputError",
    "UnsupportedCodecError",
    "WordTokenizer",
    "build_loader",
    "build_tokenizer",
    "calibrate_budget",
    "compute_cmvn_stats",
    "compute_lengths",
    "corpus_stats",
    "encode_audio",
    "eval_pipeline",
    "fbank",
    "get_recipe",
    "kaldi_arks",
    "load_tokenizer",
    "log_mel",
    "manifest_path",
    "manifest_samples",
    "merge_cmvn_stats",
    "merge_pack",
    "mfcc",
    "pack_data",
    "pack_task",
    "pipeline_report",
    "plan_pack",
    "read_data_len",
    "read_hf_dataset",
    "read_lhotse",
    "read_lhotse_shar",
    "recipes",
    "redact",
    "select_keys",
    "set_epoch",
    "shard_assignment",
    "start",
    "train_pipeline",
    "write_lhotse",
    "write_manifest_table",
]


def __getattr__(name: str):
    """``sp.PipelineNode`` imports ``torchdata.nodes`` on first use, not with speechpipe."""
    if name == "PipelineNode":
        from .nodes import PipelineNode

        return PipelineNode
    raise AttributeError(f"module 'speechpipe' has no attribute {name!r}")
