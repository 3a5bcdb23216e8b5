"""Kaldi data directories: scp/text tables, ark files and references, wav.scp and segments.

This is the package's face: other packages and
users import from here, never from its ``_modules``.
"""

from ._ark import ArkRef, iter_ark, kaldi_arks, parse_ark_ref
from ._loaders import (
    KINDS, load_scp_entries, parse_segment, RECORDING, ScpLoader, ScpLoaderIterDataPipe,
    Segment, SegmentLoader, SegmentLoaderIterDataPipe, slice_segments,
)
from ._tables import parse_scp_lines, read_scp_table, ScpEntry, ScpParser, ScpParserIterDataPipe
from ._values import read_matrix, read_wav_value

__all__ = [
    "ArkRef",
    "KINDS",
    "RECORDING",
    "ScpEntry",
    "ScpLoader",
    "ScpLoaderIterDataPipe",
    "ScpParser",
    "ScpParserIterDataPipe",
    "Segment",
    "SegmentLoader",
    "SegmentLoaderIterDataPipe",
    "iter_ark",
    "kaldi_arks",
    "load_scp_entries",
    "parse_ark_ref",
    "parse_scp_lines",
    "parse_segment",
    "read_matrix",
    "read_scp_table",
    "read_wav_value",
    "slice_segments",
]
