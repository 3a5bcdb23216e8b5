"""Where data comes from: shard and file patterns, opening paths, URLs and commands, manifests.

This is the package's face: other packages and
users import from here, never from its ``_modules``.
"""

from ._files import (
    check_path_stream, expand_patterns, is_url, iter_text_lines, open_stream,
    ShardListerIterDataPipe, StreamOpenerIterDataPipe,
)
from ._manifests import (
    FORMATS, iter_manifest, JSON_KEY_FIELDS, ManifestFileReader, ManifestFileReaderIterDataPipe,
    ManifestParser, ManifestParserIterDataPipe, ManifestRows, ManifestWriter, PATH_KEY_COLUMNS,
    read_manifest, TSV_KEY_COLUMNS, TSV_NUMBER_COLUMNS, write_manifest, write_manifest_table,
)

__all__ = [
    "FORMATS",
    "JSON_KEY_FIELDS",
    "ManifestFileReader",
    "ManifestFileReaderIterDataPipe",
    "ManifestParser",
    "ManifestParserIterDataPipe",
    "ManifestRows",
    "ManifestWriter",
    "PATH_KEY_COLUMNS",
    "ShardListerIterDataPipe",
    "StreamOpenerIterDataPipe",
    "TSV_KEY_COLUMNS",
    "TSV_NUMBER_COLUMNS",
    "check_path_stream",
    "expand_patterns",
    "is_url",
    "iter_manifest",
    "iter_text_lines",
    "open_stream",
    "read_manifest",
    "write_manifest",
    "write_manifest_table",
]
