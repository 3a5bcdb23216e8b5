"""What other tools wrote: lhotse manifests and Shar, Hugging Face datasets.

This is the package's face: other packages and
users import from here, never from its ``_modules``.
"""

from ._hf import (
    HF_INDEX, HfAudioLoader, HfAudioLoaderIterDataPipe, HfDatasetParser,
    HfDatasetParserIterDataPipe, iter_hf_rows, read_hf_dataset,
)
from ._lhotse import (
    cut_row, iter_lhotse, iter_shar, LHOTSE_CUT, LhotseLoader, LhotseLoaderIterDataPipe,
    LhotseParser, LhotseParserIterDataPipe, LhotseSharParser, LhotseSharParserIterDataPipe,
    load_cut, read_lhotse, read_lhotse_shar, write_lhotse,
)

__all__ = [
    "HF_INDEX",
    "HfAudioLoader",
    "HfAudioLoaderIterDataPipe",
    "HfDatasetParser",
    "HfDatasetParserIterDataPipe",
    "LHOTSE_CUT",
    "LhotseLoader",
    "LhotseLoaderIterDataPipe",
    "LhotseParser",
    "LhotseParserIterDataPipe",
    "LhotseSharParser",
    "LhotseSharParserIterDataPipe",
    "cut_row",
    "iter_hf_rows",
    "iter_lhotse",
    "iter_shar",
    "load_cut",
    "read_hf_dataset",
    "read_lhotse",
    "read_lhotse_shar",
    "write_lhotse",
]
