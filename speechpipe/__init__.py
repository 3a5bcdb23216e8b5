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

from .pipes import (  # noqa: E402,F401  (registration)
    audio, augment, batching, cmvn, collate, decode, device, distributed, features,
    hf_datasets, kaldi, kaldi_tables, lhotse_io, manifests, mixing, noise, order, sample_lists,
    sharding, shards, sources, text, text_normalization, threads, tokenizers, views,
)
from .demo import DEMO_CORPUS  # noqa: E402
from .diagnostics import BufferStats, Diagnostics, SkippedInputWarning  # noqa: E402
from .epochs import set_epoch  # noqa: E402
from .errors import (  # noqa: E402
    AudioFormatError, ChannelMismatchError, DataError, MissingDataError, SampleRateError,
    SpeechpipeError, UnsafeInputError, UnsupportedCodecError,
)
from .index import ShardEntry, ShardIndex  # noqa: E402
from .loader import Loader, PipeDataset, build_loader  # noqa: E402
from .pack import PackOptions, PackReport, pack_data  # noqa: E402
from .pipes._base import IterableWrapper, SequenceWrapper  # noqa: E402
from .pipes._restore import ResumeWarning  # noqa: E402
from .pipes._state import EpochWarning  # noqa: E402
from .pipes.assignment import UnevenSplitWarning  # noqa: E402
from .pipes.cmvn import CmvnStats, compute_cmvn_stats  # noqa: E402
from .pipes.codecs import encode_audio  # noqa: E402
from .pipes.collate import DecodeCollate, PadCollate  # noqa: E402
from .pipes.concurrency import start, to_device  # noqa: E402
from .pipes.constraints import (  # noqa: E402
    BatchConstraint, BatchStats, BudgetWarning, PaddedArea, Quadratic, SampleCount, SumOfLengths,
    TwoDimensional,
)
from .pipes.distributed import (  # noqa: E402
    DistributedStepError, EqualSteps, ShardSplit, StepPlanner, StepStats, shard_assignment,
)
from .pipes.hf_datasets import read_hf_dataset  # noqa: E402
from .pipes.kaldi_fbank import (  # noqa: E402
    FbankOptions, LogMelOptions, MfccOptions, fbank, log_mel, mfcc,
)
from .pipes.lhotse_io import read_lhotse, read_lhotse_shar, write_lhotse  # noqa: E402
from .pipes.manifests import write_manifest_table  # noqa: E402
from .pipes.shard_writer import ShardWriter  # noqa: E402
from .pipes.sharding import EpochProgress, kaldi_arks  # noqa: E402
from .pipes.shards import ShardReadOptions  # noqa: E402
from .pipes.text_normalization import TextNormalizer  # noqa: E402
from .pipes.tokenizers import (  # noqa: E402
    CharTokenizer, SentencePieceTokenizer, WordTokenizer, build_tokenizer, load_tokenizer,
)
from .pipes.views import BatchView, compute_lengths, read_data_len, select_keys  # noqa: E402
from .recipes import (  # noqa: E402
    FrontEnd, eval_pipeline, get_recipe, manifest_path, pipeline_report, train_pipeline,
)
from .remote import RemoteOptions  # noqa: E402
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
    "FrontEnd",
    "IterableWrapper",
    "Loader",
    "LogMelOptions",
    "MfccOptions",
    "MissingDataError",
    "PackOptions",
    "PackReport",
    "PadCollate",
    "PaddedArea",
    "PipeDataset",
    "PipelineNode",
    "Quadratic",
    "RemoteOptions",
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
    "SumOfLengths",
    "TextNormalizer",
    "TwoDimensional",
    "UnevenSplitWarning",
    "UnsafeInputError",
    "UnsupportedCodecError",
    "WordTokenizer",
    "build_loader",
    "build_tokenizer",
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
    "mfcc",
    "pack_data",
    "pipeline_report",
    "read_data_len",
    "read_hf_dataset",
    "read_lhotse",
    "read_lhotse_shar",
    "recipes",
    "select_keys",
    "set_epoch",
    "shard_assignment",
    "start",
    "to_device",
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
