"""Manifests: JSON-lines and TSV files listing utterances, read into samples and written back.

A manifest has one utterance per line: a JSON object per line (``.jsonl``, ``.json``, NeMo
and lhotse style) or a tab-separated row under a header (``.tsv``, Common Voice style); either
may be gzipped (``.jsonl.gz``, ``.tsv.gz``). Each line becomes a sample dict whose ``key`` names
the utterance; the audio a manifest points to is read by a later stage (``load_audio``).

- :class:`ManifestParserIterDataPipe` (``parse_manifest``) turns ``(path, stream)`` pairs, as
  torch's ``open_files`` or speechpipe's ``open`` yield them, into samples;
- :func:`read_manifest` reads one local manifest file (the same parser, no pipe);
- :func:`write_manifest` writes samples as deterministic JSON lines.

Every malformed line raises :class:`~speechpipe.errors.DataError` naming ``file:line``: invalid
JSON (with its column), a line that is not an object, a missing or empty key, a TSV row with the
wrong number of columns, a number that does not parse, a duplicate key (naming both lines),
invalid UTF-8, a truncated or corrupt gzip stream.
"""

from __future__ import annotations

import csv
import gzip
import json
import math
import os
import posixpath
from typing import IO, Any, Iterable, Iterator, Mapping

import numpy as np

from ...diagnostics import Diagnostics, check_on_error
from ...errors import DataError, MissingDataError
from ...remote import RemoteOptions, is_remote
from ...sample import DURATION, KEY, NUM_FRAMES, SOURCE, Sample
from .._core import functional_datapipe, IterDataPipe
from ._files import check_path_stream, iter_text_lines, open_stream
from ...compact import ManifestTable
from ._selection import within

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
    "TSV_KEY_COLUMNS",
    "TSV_NUMBER_COLUMNS",
    "iter_manifest",
    "read_manifest",
    "write_manifest",
    "write_manifest_table",
]

#: Values of ``format=``: ``"auto"`` picks by extension.
FORMATS = ("auto", "jsonl", "tsv")
#: JSON fields taken as the key, in order, when a line has no ``"key"``.
JSON_KEY_FIELDS = (KEY, "id", "utt_id", "utt", "sid")
#: TSV header columns taken as the key, in order (``path``: Common Voice's clip name).
TSV_KEY_COLUMNS = (KEY, "id", "utt_id", "path")
#: Key columns that hold a file path: the key is the file's stem (``clips/a_1.mp3`` -> ``a_1``).
PATH_KEY_COLUMNS = ("path", "audio_filepath")
#: TSV columns parsed to numbers; every other TSV value stays a string.
TSV_NUMBER_COLUMNS = {DURATION: float, "offset": float, NUM_FRAMES: int}

_EXTENSIONS = {".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".tsv": "tsv"}
_BOM = "\ufeff"


def _format_of(path: str, format: str) -> tuple[str, bool]:
    """``(format, gzipped)`` of a manifest from its name (``.gz`` means gzipped)."""
    name = path.lower()
    gzipped = name.endswith(".gz")
    if gzipped:
        name = name[: -len(".gz")]
    if format != "auto":
        return format, gzipped
    fmt = _EXTENSIONS.get(posixpath.splitext(name)[1])
    if fmt is None:
        raise DataError(
            "cannot tell the manifest format from the extension (expected .jsonl, .json, "
            ".tsv, optionally .gz); pass format='jsonl' or format='tsv'",
            source=path,
        )
    return fmt, gzipped


def _stem(value: str) -> str:
    base = posixpath.basename(value.replace("\\", "/"))
    stem, _ = posixpath.splitext(base)
    return stem or base


def _key_from(value: Any, field: str, path: str, lineno: int) -> str:
    if not isinstance(value, str):
        raise DataError(
            f"key field {field!r} must be a string, got {type(value).__name__} {value!r}",
            source=path,
            line=lineno,
        )
    key = _stem(value) if field in PATH_KEY_COLUMNS else value
    if not key.strip():
        raise DataError(f"empty key in field {field!r}", source=path, line=lineno)
    return key


def _parse_json_line(path: str, lineno: int, text: str, key_column: str | None) -> Sample:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(
            f"invalid JSON at column {exc.colno}: {exc.msg}", source=path, line=lineno
        ) from exc
    except (ValueError, RecursionError) as exc:  # a number too long, nesting too deep
        raise DataError(f"invalid JSON: {exc}", source=path, line=lineno) from exc
    if not isinstance(obj, dict):
        raise DataError(
            f"expected a JSON object, got a JSON {type(obj).__name__}", source=path, line=lineno
        )
    candidates = (key_column,) if key_column is not None else JSON_KEY_FIELDS
    field = next((f for f in candidates if f in obj), None)
    if field is None:
        raise DataError(
            f"no key: the object has none of the fields {list(candidates)}",
            source=path,
            line=lineno,
        )
    obj[KEY] = _key_from(obj[field], field, path, lineno)
    return obj


class _TsvRows:
    """Parse TSV lines under a header (csv, ``QUOTE_NONE``: quotes are plain characters)."""

    def __init__(self, path: str, key_column: str | None) -> None:
        self.path = path
        self.key_column = key_column
        self.header: list[str] | None = None
        self.key_field = ""

    def _split(self, lineno: int, text: str) -> list[str]:
        try:
            rows = list(csv.reader([text], delimiter="\t", quoting=csv.QUOTE_NONE, strict=True))
        except csv.Error as exc:
            raise DataError(f"bad TSV line: {exc}", source=self.path, line=lineno) from exc
        return rows[0] if rows else []

    def set_header(self, lineno: int, text: str) -> None:
        header = self._split(lineno, text)
        seen: dict[str, int] = {}
        for i, column in enumerate(header):
            if column in seen:
                raise DataError(
                    f"header repeats column {column!r} (columns {seen[column] + 1} and {i + 1})",
                    source=self.path,
                    line=lineno,
                )
            seen[column] = i
        candidates = (self.key_column,) if self.key_column is not None else TSV_KEY_COLUMNS
        field = next((c for c in candidates if c in seen), None)
        if field is None:
            raise DataError(
                f"no key column: the header {header} has none of {list(candidates)}",
                source=self.path,
                line=lineno,
            )
        self.header = header
        self.key_field = field

    def parse(self, lineno: int, text: str) -> Sample:
        """A row as a sample (call :meth:`set_header` first)."""
        header = self.header or []
        values = self._split(lineno, text)
        if len(values) != len(header):
            raise DataError(
                f"expected {len(header)} tab-separated columns (as in the header), "
                f"got {len(values)}",
                source=self.path,
                line=lineno,
            )
        sample: Sample = dict(zip(header, values))
        for column, kind in TSV_NUMBER_COLUMNS.items():
            if column in sample:
                sample[column] = self._number(lineno, column, sample[column], kind)
        sample[KEY] = _key_from(sample[self.key_field], self.key_field, self.path, lineno)
        return sample

    def _number(self, lineno: int, column: str, value: str, kind: type) -> int | float:
        try:
            number = kind(value)
        except ValueError as exc:
            raise DataError(
                f"column {column!r}: {value!r} is not {'an int' if kind is int else 'a number'}",
                source=self.path,
                line=lineno,
            ) from exc
        if not math.isfinite(number):
            raise DataError(
                f"column {column!r}: {value!r} is not a finite number",
                source=self.path,
                line=lineno,
            )
        return number


def iter_manifest(
    path: str,
    stream: IO,
    format: str = "auto",
    *,
    key_column: str | None = None,
    on_error: str = "raise",
    diagnostics: Diagnostics | None = None,
) -> Iterator[Sample]:
    """Parse one manifest stream into samples, one per non-blank line.

    The function behind ``parse_manifest``: see :class:`ManifestParserIterDataPipe` for the
    formats and the fields. The stream is closed when the generator ends (exhausted, closed or
    failed). Under ``on_error="skip"`` a bad line is dropped and counted in ``diagnostics``
    (an error that ends the stream, such as a truncated gzip, drops the rest of the file).

    >>> import io
    >>> lines = b'{"id": "u1", "text": "hi"}\\n\\n{"key": "u2", "duration": 1.5}\\n'
    >>> [s["key"] for s in iter_manifest("m.jsonl", io.BytesIO(lines))]
    ['u1', 'u2']
    """
    check_on_error(on_error)
    if diagnostics is None:
        diagnostics = Diagnostics("parse_manifest")
    path = os.fspath(path)
    try:
        fmt, gzipped = _format_of(path, format)
        tsv = _TsvRows(path, key_column) if fmt == "tsv" else None
        seen: dict[str, int] = {}
        lines = iter_text_lines(stream, source=path, gzipped=gzipped)
        try:
            for lineno, text in lines:  # a DataError from here ends the file
                if isinstance(text, str):
                    if lineno == 1 and text.startswith(_BOM):
                        text = text[1:]
                    if not (text.strip() if tsv is None else text.rstrip("\r\n")):
                        continue  # a blank line (in TSV only an empty one: tabs are columns)
                try:
                    if isinstance(text, DataError):  # a line that is not UTF-8
                        raise text
                    if tsv is not None and tsv.header is None:
                        tsv.set_header(lineno, text)
                        continue
                    if tsv is not None:
                        sample = tsv.parse(lineno, text)
                    else:
                        sample = _parse_json_line(path, lineno, text, key_column)
                    key = sample[KEY]
                    if key in seen:
                        raise DataError(
                            f"duplicate key {key!r}, first on line {seen[key]}",
                            source=path,
                            line=lineno,
                        )
                except DataError as err:
                    if tsv is not None and tsv.header is None:
                        raise  # without a header no row can be read: the file fails
                    diagnostics.handle(on_error, err, _reason(err))
                    continue
                seen[key] = lineno
                sample.setdefault(SOURCE, f"{path}:{lineno}")
                yield sample
        finally:
            lines.close()
    except DataError as err:  # the file as a whole: bad name, header, stream
        diagnostics.handle(on_error, err, "unreadable manifest")
    finally:
        stream.close()


_REASONS = (
    ("invalid JSON", "invalid JSON"),
    ("expected a JSON object", "not a JSON object"),
    ("expected ", "wrong column count"),
    ("not valid UTF-8", "invalid UTF-8"),
    ("duplicate key", "duplicate key"),
    ("no key", "no key"),
    ("key field", "bad key"),
    ("empty key", "bad key"),
    ("column ", "bad number"),
)


def check_manifest_options(format: str, key_column: str | None) -> None:
    """The manifest readers' common arguments, checked: a ``ValueError`` or ``TypeError``
    names the argument and its value."""
    if format not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {format!r}")
    if key_column is not None and (not isinstance(key_column, str) or not key_column):
        raise TypeError(f"key_column must be a non-empty str or None, got {key_column!r}")


def _reason(err: DataError) -> str:
    """The diagnostics category of a bad line."""
    return next((r for prefix, r in _REASONS if err.reason.startswith(prefix)), "bad line")


@functional_datapipe("parse_manifest")
class ManifestParserIterDataPipe(IterDataPipe[Sample]):
    """Parse manifest streams into samples (functional name: ``parse_manifest``).

    Consumes ``(path, stream)`` pairs, binary or text streams (from torch's ``open_files`` or
    speechpipe's ``open``), and yields one sample dict per non-blank line, in file order, with
    ``key`` (``str``), ``source`` (``"path:line"``, unless the line has its own) and the line's
    fields. Each stream is closed once its manifest has been read. The audio a manifest points
    to is loaded by a later stage (``load_audio``).

    - **JSON lines** (``.jsonl``, ``.json``, ``.ndjson``): each line a JSON object, kept as
      parsed. Its key is the string field ``key``, else ``id``, ``utt_id``, ``utt`` or ``sid``
      (copied to ``key``).
    - **TSV** (``.tsv``; Common Voice): the first line is a tab-separated header; values are
      read with ``csv.QUOTE_NONE`` (quotes are plain text) and stay strings, except
      ``duration``, ``offset`` (float) and ``num_frames`` (int). The key column is ``key``,
      ``id``, ``utt_id`` or ``path``; from a ``path`` the key is the file stem
      (``common_voice_en_1.mp3`` -> ``common_voice_en_1``).

    A ``.gz`` suffix means the stream is gzipped (it must then be binary). Blank lines are
    skipped (in TSV only empty ones, since tabs are columns); a UTF-8 byte-order mark on the
    first line is ignored.

    Args:
        source_datapipe: pipe of ``(path, stream)`` pairs.
        format: ``"auto"`` (by extension), ``"jsonl"`` or ``"tsv"``.
        key_column: the field or column holding the key, instead of the defaults above
            (``audio_filepath`` for NeMo manifests: the key is then the file stem).
        on_error: ``"raise"`` a :class:`~speechpipe.errors.DataError` naming ``file:line`` for
            a bad line (invalid JSON, not an object, no or empty key, wrong column count, bad
            number, duplicate key, invalid UTF-8), or ``"skip"`` it, count it in
            ``self.diagnostics`` and warn at the end of the pass (counts cover the current
            pass). A file that cannot be read on (truncated gzip, bad header, unknown
            extension) is skipped from there on.

    >>> import io
    >>> from speechpipe import IterableWrapper
    >>> tsv = "client_id\\tpath\\tsentence\\nc1\\tcommon_voice_en_1.mp3\\tSay \\"hi\\"; go.\\n"
    >>> pairs = IterableWrapper([("train.tsv", io.StringIO(tsv))], deepcopy=False)
    >>> [(s["key"], s["sentence"]) for s in pairs.parse_manifest()]
    [('common_voice_en_1', 'Say "hi"; go.')]
    """

    def __init__(
        self,
        source_datapipe: IterDataPipe[tuple[str, IO]],
        format: str = "auto",
        *,
        key_column: str | None = None,
        on_error: str = "raise",
    ) -> None:
        check_manifest_options(format, key_column)
        self.source_datapipe = source_datapipe
        self.format = format
        self.key_column = key_column
        self.on_error = check_on_error(on_error)
        self.diagnostics = Diagnostics("parse_manifest")

    def __iter__(self) -> Iterator[Sample]:
        self.diagnostics.reset()
        for item in self.source_datapipe:
            path, stream = check_path_stream(item, "parse_manifest")
            yield from iter_manifest(
                path,
                stream,
                self.format,
                key_column=self.key_column,
                on_error=self.on_error,
                diagnostics=self.diagnostics,
            )
        self.diagnostics.warn_if_skipped()

    def __len__(self) -> int:
        raise TypeError(
            "parse_manifest yields one sample per manifest line: the count is unknown until "
            "the manifests are read"
        )


ManifestParser = ManifestParserIterDataPipe


def _numbered_lines(raw: Iterable[bytes], source: str):
    """The manifest parser's numbering and decoding of lines, for the row tables."""
    return iter_text_lines(raw, source=source)


class ManifestRows:
    """The rows of one or more local JSON-lines manifests, by position, each parsed only when
    asked for: what ``shuffle_samples`` orders without holding the rows (its source's
    ``row_table()``). Positions run over the files in order; ``kept`` (sorted positions, as
    ``filter_by_duration`` leaves them) restricts the rows to a subset.

    Per row it holds nothing in Python: the tables are memory-mapped
    (:class:`~speechpipe.compact.ManifestTable`), ``kept`` is 4 bytes per kept row.
    """

    def __init__(self, tables: list[ManifestTable], key_column: str | None,
                 kept: np.ndarray | None = None) -> None:
        self.tables = tables
        self.key_column = key_column
        self.bases = np.cumsum([0] + [len(t) for t in tables])
        self.kept = kept

    @property
    def total(self) -> int:
        """Rows in all files (before ``kept``)."""
        return int(self.bases[-1])

    def __len__(self) -> int:
        return self.total if self.kept is None else int(self.kept.size)

    def restricted(self, kept: np.ndarray) -> "ManifestRows":
        """These rows, keeping only the positions ``kept`` (sorted, of all files' rows)."""
        return ManifestRows(self.tables, self.key_column, kept)

    def within(self, low: float | None, high: float | None, check) -> tuple:
        """``filter_by_duration``'s selection of these rows (``kept`` ignored), computed once
        per file and range and mapped by every process after: see :func:`._selection.within`."""
        return within(self, low, high, check)

    def samples(self, indices: list[int]) -> Iterator[Sample]:
        """The ``i``-th rows (of ``kept`` when set) for ``i`` in ``indices``, each parsed when
        it is taken; their offsets, line numbers and bytes are read first, in one gather per
        file in the file's order (not a Python call per array element)."""
        positions = np.asarray(indices, np.int64)
        if self.kept is not None:
            positions = self.kept[positions].astype(np.int64)
        files = np.searchsorted(self.bases, positions, "right") - 1
        raw: list = [None] * positions.size
        for f in np.unique(files).tolist():
            at = np.flatnonzero(files == f)
            at = at[np.argsort(positions[at], kind="stable")]
            for n, line_text in zip(at.tolist(), self.tables[f].rows_at(
                    positions[at] - self.bases[f])):
                raw[n] = (f, *line_text)
        for f, lineno, text in raw:
            path = self.tables[f].path
            sample = _parse_json_line(path, lineno, text, self.key_column)
            sample.setdefault(SOURCE, f"{path}:{lineno}")
            yield sample

    def chunks(self) -> Iterator[tuple[int, ManifestTable]]:
        """``(first position, table)`` per file."""
        for base, table in zip(self.bases.tolist(), self.tables):
            yield base, table

    def parse_row(self, position: int) -> Sample:
        """The sample at a position of all files' rows (``kept`` ignored)."""
        f = int(np.searchsorted(self.bases, np.int64(position), "right")) - 1
        table = self.tables[f]
        lineno, text = table.row(position - int(self.bases[f]))
        sample = _parse_json_line(table.path, lineno, text, self.key_column)
        sample.setdefault(SOURCE, f"{table.path}:{lineno}")
        return sample

    def sample(self, i: int) -> Sample:
        """The ``i``-th row (of ``kept`` when set), parsed."""
        return self.parse_row(int(self.kept[i]) if self.kept is not None else i)

    def find(self, key: str) -> Sample | None:
        """The sample with ``key`` among these rows, or ``None``."""
        return self.find_many([key])[0]

    def find_many(self, keys: list[str]) -> list[Sample | None]:
        """:meth:`find` for each key (one vectorised search per file)."""
        found: list[Sample | None] = [None] * len(keys)
        for base, table in self.chunks():
            for i, rows in enumerate(table.rows_of_many(keys)):
                for r in rows:
                    if found[i] is not None:
                        break
                    position = base + r
                    if self.kept is not None:
                        # in the array's own dtype: a Python int would cast (copy) the array
                        at = int(np.searchsorted(self.kept, self.kept.dtype.type(position)))
                        if at >= self.kept.size or int(self.kept[at]) != position:
                            continue
                    sample = self.parse_row(position)
                    if sample[KEY] == keys[i]:
                        found[i] = sample
        return found

    def repeated_key(self) -> Sample | None:
        """A sample whose key another file also has, or ``None`` (within a file, building
        the table refused repeats)."""
        for j in range(1, len(self.tables)):
            later = self.tables[j].hashes
            for i in range(j):
                earlier = self.tables[i].hashes
                if not (earlier.size and later.size):
                    continue
                at = np.minimum(np.searchsorted(earlier, later), earlier.size - 1)
                for h in np.unique(later[earlier[at] == later]).tolist():
                    key_rows = self.tables[j].hash_rows[np.searchsorted(later, h)]
                    sample = self.parse_row(int(self.bases[j]) + int(key_rows))
                    if any(self.parse_row(int(self.bases[i]) + r)[KEY] == sample[KEY]
                           for r in self.tables[i].rows_of(sample[KEY])):
                        return sample
        return None


@functional_datapipe("read_manifest_files")
class ManifestFileReaderIterDataPipe(IterDataPipe[Sample]):
    """Read local manifest files into samples (functional name: ``read_manifest_files``).

    Consumes local manifest paths; yields what ``open_files(mode="b").parse_manifest()``
    yields for them (see :class:`ManifestParserIterDataPipe` for formats, keys and errors),
    one file after another. Unlike that pair, it also offers ``shuffle_samples`` a mapped row
    table of JSON-lines manifests (``.jsonl``, ``.jsonl.gz``...) with ``on_error="raise"``:
    each file's :class:`~speechpipe.compact.ManifestTable`, read from the sidecar beside it
    (``train.jsonl.gz.spmap``, written by ``prepare``) or built and written there when missing
    or stale, so that the rows are ordered without being held and each is parsed when yielded.
    The tables are opened once per process and kept across passes (a ``stat`` per pass checks
    they are current).

    Args:
        source_datapipe: local manifest paths.
        format: ``"auto"`` (by extension), ``"jsonl"`` or ``"tsv"``.
        key_column: the field or column holding the key (see ``parse_manifest``).
        on_error: ``"raise"`` or ``"skip"`` a bad line (see ``parse_manifest``).

    >>> import os, tempfile
    >>> from speechpipe import IterableWrapper
    >>> path = os.path.join(tempfile.mkdtemp(), "m.jsonl")
    >>> _ = write_manifest(path, [{"key": "a", "duration": 1.0}, {"key": "b", "duration": 2.0}])
    >>> [s["key"] for s in IterableWrapper([path]).read_manifest_files()]
    ['a', 'b']
    >>> [s["key"] for s in IterableWrapper([path]).read_manifest_files().shuffle_samples(seed=0)]
    ['b', 'a']
    """

    def __init__(self, source_datapipe: Iterable[str], format: str = "auto", *,
                 key_column: str | None = None, on_error: str = "raise") -> None:
        check_manifest_options(format, key_column)
        self.source_datapipe = source_datapipe
        self.format = format
        self.key_column = key_column
        self.on_error = check_on_error(on_error)
        self.diagnostics = Diagnostics("read_manifest_files")
        self._tables: dict[str, ManifestTable] = {}

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_tables"] = {}  # mapped in each process that reads
        return state

    def __iter__(self) -> Iterator[Sample]:
        self.diagnostics.reset()
        for path in self.source_datapipe:
            if not isinstance(path, (str, os.PathLike)):
                raise TypeError(f"read_manifest_files reads paths, got {path!r}")
            path = os.fspath(path)
            try:
                stream = open(path, "rb")
            except FileNotFoundError as exc:
                raise MissingDataError("no such manifest", source=path) from exc
            yield from iter_manifest(path, stream, self.format, key_column=self.key_column,
                                     on_error=self.on_error, diagnostics=self.diagnostics)
        self.diagnostics.warn_if_skipped()

    def __len__(self) -> int:
        raise TypeError("read_manifest_files yields one sample per manifest line: the count "
                        "is unknown until the manifests are read (shuffle_samples over it "
                        "knows it from the row tables)")

    def row_table(self) -> ManifestRows | None:
        """The mapped rows of the manifests, or ``None`` where a path is not a local
        JSON-lines file or bad lines are skipped (then the rows are read as samples)."""
        if self.on_error != "raise":
            return None
        paths = list(self.source_datapipe)
        if not all(isinstance(p, (str, os.PathLike)) for p in paths):
            return None  # the pass names the bad item
        paths = [os.fspath(p) for p in paths]
        if not all(isinstance(p, str) and not is_remote(p) and os.path.isfile(p)
                   for p in paths):
            return None
        try:
            if not all(_format_of(p, self.format)[0] == "jsonl" for p in paths):
                return None
        except DataError:
            return None
        tables = []
        for path in paths:
            table = self._tables.get(path)
            if table is None or not table.is_current():
                key_column = self.key_column
                table = ManifestTable.open(
                    path, lambda n, text, p=path: _parse_json_line(p, n, text, key_column),
                    key_column=key_column, numbered=_numbered_lines)
                self._tables[path] = table
            tables.append(table)
        return ManifestRows(tables, self.key_column)


ManifestFileReader = ManifestFileReaderIterDataPipe


def write_manifest_table(path: str | os.PathLike, *, key_column: str | None = None) -> str:
    """Write the mapped row table of a local JSON-lines manifest beside it
    (``<path>.spmap``, :class:`~speechpipe.compact.ManifestTable`) unless a current one is
    there, and return its path: what ``prepare`` does after writing each manifest, so that
    the first training pass maps it instead of building it in every worker.

    Raises:
        DataError: a malformed line (naming the file and line), a duplicate key.

    >>> import tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "m.jsonl.gz")
    >>> _ = write_manifest(path, [{"key": "a", "duration": 1.0}])
    >>> os.path.basename(write_manifest_table(path))
    'm.jsonl.gz.spmap'
    """
    path = os.fspath(path)
    if _format_of(path, "auto")[0] != "jsonl":
        raise ValueError(f"{path}: a row table is written for JSON-lines manifests only")
    table = ManifestTable.open(path, lambda n, text: _parse_json_line(path, n, text, key_column),
                               key_column=key_column, numbered=_numbered_lines)
    if table.sidecar is None:
        raise OSError(f"{path}: the row table could not be written beside it")
    return table.sidecar


def read_manifest(
    path: str | os.PathLike, format: str = "auto", *, key_column: str | None = None,
    remote: RemoteOptions | None = None,
) -> Iterator[Sample]:
    """Read the samples of one manifest file (``.jsonl``, ``.tsv``, optionally ``.gz``), local
    or at an object-storage URL (``s3://...``, read with ``remote``:
    :class:`~speechpipe.remote.RemoteOptions`).

    The same parser as ``parse_manifest``, for scripts and recipes; bad lines raise
    :class:`~speechpipe.errors.DataError`, an absent file
    :class:`~speechpipe.errors.MissingDataError`. Returns a generator: the file is opened on
    its first ``next()`` and closed when it ends.

    >>> import tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "m.jsonl.gz")
    >>> write_manifest(path, [{"key": "u1", "text": "hello"}])
    1
    >>> [(s["key"], s["text"]) for s in read_manifest(path)]
    [('u1', 'hello')]
    """
    if format not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {format!r}")
    return _read_manifest(os.fspath(path), format, key_column, remote)


def _read_manifest(path: str, format: str, key_column: str | None,
                   remote: RemoteOptions | None) -> Iterator[Sample]:
    if not is_remote(path) and os.path.isdir(path):
        inside = sorted(n for n in os.listdir(path) if n.endswith((".jsonl.gz", ".jsonl")))
        raise DataError("a folder, not a manifest: name its manifest files"
                        + (f" (it holds {inside[:5]}{' ...' if len(inside) > 5 else ''})"
                           if inside else " (it holds none)"), source=path)
    try:
        stream = open_stream(path, remote=remote) if is_remote(path) else open(path, "rb")
    except FileNotFoundError as exc:
        raise MissingDataError("no such manifest", source=path) from exc
    with stream:
        yield from iter_manifest(path, stream, format, key_column=key_column)


def _to_json(sample: Mapping[str, Any], index: int) -> str:
    key = sample.get(KEY)
    if not isinstance(key, str) or not key:
        raise ValueError(f"sample {index} has no non-empty string 'key' (got {key!r})")
    for field in sample:
        if not isinstance(field, str):
            raise TypeError(f"sample {key!r}: field name {field!r} is not a string")
    try:
        return json.dumps(
            sample, sort_keys=True, ensure_ascii=False, allow_nan=False, default=_np_scalar
        )
    except (TypeError, ValueError):
        pass
    for field, value in sample.items():  # find the field to blame
        try:
            json.dumps(value, allow_nan=False, default=_np_scalar)
        except TypeError as exc:
            raise TypeError(
                f"sample {key!r}: field {field!r} ({type(value).__name__}) is not "
                f"JSON-serializable; manifests hold strings and numbers, not arrays ({exc})"
            ) from None
        except ValueError as exc:
            raise ValueError(f"sample {key!r}: field {field!r}: {exc} ({value!r})") from None
    raise TypeError(f"sample {key!r} is not JSON-serializable")


def _np_scalar(value: Any) -> Any:
    if isinstance(value, np.generic) and not isinstance(value, (np.void, np.object_)):
        item = value.item()
        if isinstance(item, (bool, int, float, str)):
            return item
    raise TypeError(f"{type(value).__name__} is not JSON-serializable")


class ManifestWriter:
    """Write samples one at a time to a JSON-lines manifest (gzipped if ``path`` ends with
    ``.gz``), for manifests too large to hold in memory or several written in one pass.

    The file is written next to ``path`` and renamed into place by :meth:`close` (a
    ``with`` block closes on success); :meth:`abort` (or an exception in the ``with`` block)
    removes it, so an existing manifest is always a complete one. Format and checks are
    :func:`write_manifest`'s.

    Args:
        path: the manifest to write.

    >>> import tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "m.jsonl.gz")
    >>> with ManifestWriter(path) as writer:
    ...     writer.write({"key": "u1", "duration": 1.5})
    ...     writer.write({"key": "u2", "duration": 0.5})
    >>> writer.count, [s["key"] for s in read_manifest(path)]
    (2, ['u1', 'u2'])
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = os.fspath(path)
        self.count = 0
        self._tmp = f"{self.path}.tmp{os.getpid()}"
        self._seen: dict[str, int] = {}
        self._raw: IO[bytes] | None = open(self._tmp, "wb")
        self._out: IO[bytes] = self._raw
        if self.path.endswith(".gz"):
            self._out = gzip.GzipFile(filename="", mode="wb", fileobj=self._raw, mtime=0)

    def write(self, sample: Mapping[str, Any]) -> None:
        """Append one sample.

        Raises:
            TypeError: not a dict, or a field holding a non-JSON value (names key and field).
            ValueError: no string key, a key already written, a NaN or infinite number.
        """
        if self._raw is None:
            raise ValueError(f"{self.path}: the writer is closed")
        index = self.count
        if not isinstance(sample, Mapping):
            raise TypeError(f"sample {index} is a {type(sample).__name__}, not a dict")
        line = _to_json(sample, index)
        key = sample[KEY]
        if key in self._seen:
            raise ValueError(f"duplicate key {key!r} (samples {self._seen[key]} and {index})")
        self._seen[key] = index
        try:
            data = line.encode("utf-8")
        except UnicodeEncodeError:  # lone surrogates: write them \u-escaped
            data = json.dumps(sample, sort_keys=True, allow_nan=False,
                              default=_np_scalar).encode("ascii")
        self._out.write(data + b"\n")
        self.count += 1

    def close(self) -> None:
        """Finish the file and rename it into place."""
        if self._raw is None:
            return
        try:
            if self._out is not self._raw:
                self._out.close()
            self._raw.close()
        except BaseException:
            self.abort()
            raise
        self._raw = None
        os.replace(self._tmp, self.path)

    def abort(self) -> None:
        """Close and remove the unfinished file (``path`` is left as it was)."""
        if self._raw is not None:
            try:
                if self._out is not self._raw:
                    self._out.close()
            finally:
                self._raw.close()
                self._raw = None
        if os.path.exists(self._tmp):
            os.remove(self._tmp)

    def __enter__(self) -> "ManifestWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def write_manifest(path: str | os.PathLike, samples: Iterable[Mapping[str, Any]]) -> int:
    """Write samples as JSON lines (gzipped if ``path`` ends with ``.gz``); return the count.

    The output is deterministic: fields sorted, UTF-8 text unescaped, gzip without a
    timestamp, so the same samples give the same bytes. The file is written next to ``path``
    and renamed into place once complete. Each sample needs a non-empty string ``key``, unique
    in the file; values must be JSON-serializable (numpy scalars are written as numbers).
    :class:`ManifestWriter` writes one sample at a time.

    Raises:
        TypeError: a field holds an array or another non-JSON value (names key and field).
        ValueError: a sample without a string key, a repeated key, a NaN or infinite number.

    >>> import tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "m.jsonl")
    >>> write_manifest(path, [{"text": "hi", "key": "u1", "duration": 1.25}])
    1
    >>> with open(path, encoding="utf-8") as f:
    ...     print(f.read(), end="")
    {"duration": 1.25, "key": "u1", "text": "hi"}
    """
    with ManifestWriter(path) as writer:
        for sample in samples:
            writer.write(sample)
    return writer.count
