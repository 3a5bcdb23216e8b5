"""Compact, memory-mapped forms of what planning an epoch reads: a manifest's row table
(:class:`ManifestTable`) and a shard index's table (:class:`IndexTable`, read through
:class:`speechpipe.index.ShardIndex`).

A JSON-lines manifest stays the readable truth; beside it (``train.jsonl.gz`` ->
``train.jsonl.gz.spmap``) a binary sidecar holds, per row, what ordering and filtering need
without parsing the rows: its byte offset in the (uncompressed: a gzipped manifest's text is
stored decompressed in the sidecar) text, its line number, its duration in seconds (NaN where
the row has none), and the 64-bit hashes of the keys, sorted, with the row of each (to find a
held sample again by key). The sidecar is memory-mapped: every process on a node maps the same
pages and none holds a Python object per row. It records the manifest's size and modification
time and is rebuilt when they no longer match (stale).

The file format is :func:`speechpipe.node_cache.write_mapped`'s (a JSON header, then the arrays,
each aligned to 64 bytes).

>>> import os, tempfile, json
>>> path = os.path.join(tempfile.mkdtemp(), "m.jsonl")
>>> with open(path, "w") as f:
...     _ = f.write('{"key": "a", "duration": 1.5}\\n\\n{"key": "b", "duration": 0.5}\\n')
>>> def parse(lineno, text):
...     return json.loads(text)
>>> table = ManifestTable.open(path, parse)
>>> len(table), table.durations.tolist(), table.lines.tolist()
(2, [1.5, 0.5], [1, 3])
>>> table.row(1), table.rows_of("b")
((3, '{"key": "b", "duration": 0.5}\\n'), [1])
"""

from __future__ import annotations

import gzip
import hashlib
import math
import os
import tempfile
import warnings
import zlib
from array import array
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

from .errors import DataError, MissingDataError
from .node_cache import (
    drop_other_versions, file_lock, index_cache_dir, read_mapped, sums_match, versioned_path,
    write_mapped,
)
from .sample import KEY, sample_duration

__all__ = ["IndexTable", "MAPPED_SUFFIX", "ManifestTable", "MappedKeys", "MappedLengths",
           "build_index_table", "index_dtype", "key_hash"]

#: The sidecar's name is the text file's name plus this suffix.
MAPPED_SUFFIX = ".spmap"
_MANIFEST_FORMAT = "speechpipe-manifest-rows"
_MANIFEST_VERSION = 1
_BOM = "\ufeff"
_ROW_ARRAYS = ("starts", "lines", "durations", "hashes", "hash_rows")

#: ``parse(line number, text) -> sample dict with a string "key"`` (raises DataError).
Parser = Callable[[int, str], Mapping[str, Any]]
#: ``numbered(raw byte lines, source) -> (line number, text or the DataError of a bad line)``:
#: how the manifest reader numbers and decodes lines (``iter_text_lines``), so that a table
#: is built from exactly the lines a pass parses.
Numbered = Callable[[Iterable[bytes], str], Iterator[tuple[int, "str | DataError"]]]


def _numbered(raw: Iterable[bytes], source: str) -> Iterator[tuple[int, str | DataError]]:
    """Strict UTF-8 lines, numbered from 1 (the default of :meth:`ManifestTable.open`)."""
    for number, line in enumerate(raw, start=1):
        try:
            yield number, line.decode("utf-8")
        except UnicodeDecodeError as exc:
            yield number, DataError(f"not valid UTF-8 ({exc.reason})", source=source,
                                    line=number)


def index_dtype(n: int) -> np.dtype:
    """The narrowest signed integer dtype holding positions ``0..n`` (int32 below 2**31).

    >>> index_dtype(10), index_dtype(2**31)
    (dtype('int32'), dtype('int64'))
    """
    return np.dtype(np.int32 if n < 2**31 - 1 else np.int64)


def key_hash(key: str) -> int:
    """A key's 64-bit hash (blake2b; the same in every process and run).

    >>> key_hash("u1") == key_hash("u1") != key_hash("u2")
    True
    """
    data = key.encode("utf-8", "surrogatepass")
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


# --------------------------------------------------------------------------- manifests


def _signature(path: str) -> dict:
    return {"source_size": (st := os.stat(path)).st_size, "source_mtime_ns": st.st_mtime_ns}


def _is_current(path: str, header: dict) -> bool:
    """Whether the file at ``path`` has the size and modification time in ``header``."""
    try:
        return all(header.get(k) == v for k, v in _signature(path).items())
    except OSError:
        return False


class ManifestTable:
    """The mapped row table of one local JSON-lines manifest (``.jsonl``, ``.jsonl.gz``).

    Arrays (read-only, memory-mapped): ``starts`` (``rows + 1`` byte offsets into the
    uncompressed text; a row ends at its first newline), ``lines`` (each row's line number),
    ``durations`` (seconds, float64; NaN where the row has none or it is not a number),
    ``hashes`` (:func:`key_hash` of each key, sorted) and ``hash_rows`` (the row of each).
    Open it with :meth:`open`, which builds or rebuilds the sidecar when missing or stale."""

    def __init__(self, path: str, sidecar: str | None, header: dict,
                 arrays: dict[str, np.ndarray], text: np.ndarray) -> None:
        self.path = path
        self.sidecar = sidecar
        self.header = header
        # plain ndarray views of the maps (np.memmap's own indexing costs ~20 us a call)
        self.starts, self.lines, self.durations, self.hashes, self.hash_rows, self.text = (
            np.asarray(a) for a in (*(arrays[k] for k in _ROW_ARRAYS), text))
        self.text_file: tuple | None = None  # (file, offset, inode) of a mapped text

    def __len__(self) -> int:
        return int(self.lines.size)

    def row(self, i: int) -> tuple[int, str]:  # (line number, text, its newline kept)
        return int(self.lines[i]), _line(self.text[self.starts[i]:self.starts[i + 1]].tobytes())

    def rows_at(self, rows: np.ndarray) -> list[tuple[int, str]]:
        """:meth:`row` of each of ``rows`` (an integer array), their offsets and line numbers
        gathered at once; a mapped text is read with ``pread`` (a page fault per row read at
        random in a large text costs several times a read from the page cache) from 16 rows."""
        spans = zip(self.starts[rows].tolist(), self.starts[rows + 1].tolist())
        fd = self._text_fd() if rows.size >= 16 else None  # an open per call
        try:
            raws = [self.text[a:b].tobytes() if fd is None else
                    os.pread(fd, b - a, self.text_file[1] + a) for a, b in spans]
        finally:
            if fd is not None:
                os.close(fd)
        return [(n, _line(raw)) for n, raw in zip(self.lines[rows].tolist(), raws)]

    def _text_fd(self) -> int | None:  # the file whose text is mapped, while it is that file
        try:
            fd = os.open(self.text_file[0], os.O_RDONLY) if self.text_file else None
        except OSError:
            return None
        return fd if fd is None or os.fstat(fd).st_ino == self.text_file[2] else os.close(fd)

    def rows_of(self, key: str) -> list[int]:
        """The rows whose key hashes as ``key`` does (a caller checks the parsed key)."""
        return self.rows_of_many([key])[0]

    def rows_of_many(self, keys: list[str]) -> list[list[int]]:
        """:meth:`rows_of` for each key, in one search of the sorted hashes."""
        wanted = np.array([key_hash(k) for k in keys], dtype=np.uint64)
        lo = np.searchsorted(self.hashes, wanted, "left").tolist()
        hi = np.searchsorted(self.hashes, wanted, "right").tolist()
        return [sorted(self.hash_rows[a:b].tolist()) for a, b in zip(lo, hi)]

    def is_current(self) -> bool:
        """Whether the manifest still has the size and modification time it was built from."""
        return _is_current(self.path, self.header)

    @classmethod
    def open(cls, path: str, parse: Parser, *, key_column: str | None = None,
             write: bool = True, numbered: Numbered = _numbered) -> "ManifestTable":
        """The table of the manifest at ``path``: its sidecar mapped when current, else built
        (and, with ``write``, written beside it; where the folder cannot be written, in the
        node's cache folder, :mod:`speechpipe.node_cache`, built once per node under a lock
        and checked by its CRC-32s; where that cannot be used either, the table is held in
        this process's memory instead, with a warning).

        Args:
            path: a local ``.jsonl`` (``.json``, ``.ndjson``), optionally ``.gz``.
            parse: turns a line into a sample (the manifest parser: its errors name the line).
            key_column: what the parser takes keys from (recorded: another one rebuilds).
            write: write a new or rebuilt sidecar beside the manifest.
            numbered: how lines are numbered and decoded (see :data:`Numbered`).

        Raises:
            DataError: a bad line (``parse``'s error), invalid UTF-8, a cut gzip, a repeated key.
        """
        sidecar = path + MAPPED_SUFFIX
        try:
            sig = _signature(path)
        except FileNotFoundError as exc:
            raise MissingDataError("no such manifest", source=path) from exc
        try:
            header, arrays = read_mapped(sidecar)
        except (MissingDataError, DataError):
            header = None
        want = {"format": _MANIFEST_FORMAT, "version": _MANIFEST_VERSION,
                "key_column": key_column, **sig}
        if header is not None and all(header.get(k) == v for k, v in want.items()):
            return cls._of(path, sidecar, header, arrays)
        if write and not os.access(os.path.dirname(os.path.abspath(path)), os.W_OK):
            table = _cached_rows(path, want, lambda out: build_manifest_table(
                path, parse, key_column=key_column, numbered=numbered, out=out))
            if table is not None:
                return table
        return build_manifest_table(path, parse, key_column=key_column, write=write,
                                    numbered=numbered)

    @classmethod
    def _of(cls, path: str, sidecar: str | None, header: dict,
            arrays: dict[str, np.ndarray]) -> "ManifestTable":
        if "text" in arrays:
            text = arrays["text"]
        elif header["source_size"] == 0:
            text = np.zeros(0, np.uint8)
        else:
            text = np.memmap(path, dtype=np.uint8, mode="r")
        table = cls(path, sidecar, header, arrays, text)
        if isinstance(text, np.memmap) and text.filename:
            table.text_file = (text.filename, text.offset, os.stat(text.filename).st_ino)
        return table


def _cached_rows(path: str, want: dict, build: Callable[[str], Any]) -> ManifestTable | None:
    """The row table of ``path`` (a manifest in a folder that cannot be written) in the
    node's cache folder, one file per manifest and version (``rows-<digest>-<digest>``),
    built by ``build(place)`` once per node; ``None`` without a usable folder."""
    folder = index_cache_dir()
    if folder is None:
        return None
    version = {**want, "inode": os.stat(path).st_ino}
    place, stem = versioned_path(folder, os.path.abspath(path), version, kind="rows")

    def current() -> ManifestTable | None:
        try:
            header, arrays = read_mapped(place)
        except (MissingDataError, DataError):
            return None
        if any(header.get(k) != v for k, v in want.items()) \
                or not sums_match(place, header, arrays):
            return None
        return ManifestTable._of(path, place, header, arrays)

    table = current()
    if table is None:
        with file_lock(os.path.join(folder, stem + ".lock"), create=True):
            table = current()
            if table is None:
                try:
                    build(place)
                except OSError:
                    return None
                drop_other_versions(folder, stem, place)
                table = current()
    return table


def _line(raw: bytes) -> str:  # a row's bytes to its first newline (kept), decoded
    return (raw[:raw.find(b"\n") + 1] if b"\n" in raw else raw).decode("utf-8")


def _scan(path: str, parse: Parser, numbered: Numbered, text_out) -> tuple[dict, int]:
    """Read the manifest once: ``({starts, lines, durations, hashes}, text bytes)``, the
    arrays built in ``array`` buffers (a few bytes per row, never the rows); the
    uncompressed text is copied to ``text_out`` when given (a gzipped manifest)."""
    gzipped = path.lower().endswith(".gz")
    starts, lines, durations, hashes = array("q"), array("q"), array("d"), array("Q")
    position = {"start": 0, "end": 0}

    def raw_lines(stream) -> Iterator[bytes]:
        number = 0
        while True:
            try:
                raw = next(stream, None)
            except (EOFError, OSError, zlib.error) as exc:
                what = "truncated or corrupt gzip stream" if gzipped else "read failed"
                raise DataError(f"{what} after line {number}: {exc}", source=path) from exc
            if raw is None:
                return
            number += 1
            position["start"] = position["end"]
            position["end"] += len(raw)
            if text_out is not None:
                text_out.write(raw)
            yield raw

    with open(path, "rb") as f:
        stream = gzip.GzipFile(fileobj=f, mode="rb") if gzipped else f
        for lineno, text in numbered(raw_lines(iter(stream)), path):
            if isinstance(text, DataError):
                raise text
            start = position["start"]
            if lineno == 1 and text.startswith(_BOM):
                text = text[1:]
                start += len(_BOM.encode("utf-8"))
            if not text.strip():
                continue
            sample = parse(lineno, text)
            starts.append(start)
            lines.append(lineno)
            hashes.append(key_hash(sample[KEY]))
            try:
                durations.append(float(sample_duration(sample)))
            except (KeyError, TypeError, ValueError):
                durations.append(math.nan)
    starts.append(position["end"])
    return {"starts": starts, "lines": lines, "durations": durations, "hashes": hashes}, \
        position["end"]


def build_manifest_table(path: str, parse: Parser, *, key_column: str | None = None,
                         write: bool = True, numbered: Numbered = _numbered,
                         out: str | None = None) -> ManifestTable:
    """Read the manifest at ``path`` once and build its :class:`ManifestTable` (see
    :meth:`ManifestTable.open`, which calls this when the sidecar is missing or stale).
    ``out``: a file of the node's cache to write it to (with its sums; an ``OSError`` raised)
    instead of the sidecar beside the manifest."""
    sig = _signature(path)
    text_tmp = text_out = None
    if path.lower().endswith(".gz"):
        try:
            fd, text_tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".txt",
                                            dir=os.path.dirname(os.path.abspath(path)))
        except OSError:
            fd, text_tmp = tempfile.mkstemp(suffix=".txt")
        text_out = os.fdopen(fd, "wb")
    try:
        scanned, text_size = _scan(path, parse, numbered, text_out)
        if text_out is not None:
            text_out.close()
        n = len(scanned["lines"])
        header = {"format": _MANIFEST_FORMAT, "version": _MANIFEST_VERSION,
                  "key_column": key_column, "rows": n, **sig}
        hash_arr = np.frombuffer(scanned.pop("hashes"), dtype=np.uint64)
        order = np.argsort(hash_arr, kind="stable").astype(index_dtype(n))
        arrays: dict[str, Any] = {
            "starts": np.frombuffer(scanned["starts"], dtype=np.int64),
            "lines": np.frombuffer(scanned["lines"], dtype=np.int64),
            "durations": np.frombuffer(scanned["durations"], dtype=np.float64),
            "hashes": hash_arr[order], "hash_rows": order,
        }
        text_file = path if text_tmp is None else text_tmp
        text = (np.memmap(text_file, dtype=np.uint8, mode="r") if text_size
                else np.zeros(0, np.uint8))
        table = ManifestTable(path, None, header, arrays, text)
        _check_unique(table, parse)
        if text_tmp is not None:
            arrays["text"] = (text_tmp, text_size)
        if out is not None:  # the node's cache: an OSError is the caller's
            write_mapped(out, header, arrays, mode_of=path, sums=True)
            return table
        try:
            if not write:
                raise _NotWritten
            write_mapped(path + MAPPED_SUFFIX, header, arrays, mode_of=path)
        except (OSError, _NotWritten) as exc:
            if write:
                warnings.warn(f"{path}: could not write its row table beside it ({exc}); "
                              "this process holds it in memory instead", stacklevel=3)
            if text_tmp is not None:
                table.text = np.array(text)  # a copy: the temporary file goes
            return table
        header, mapped = read_mapped(path + MAPPED_SUFFIX)
        return ManifestTable._of(path, path + MAPPED_SUFFIX, header, mapped)
    finally:
        if text_out is not None:
            text_out.close()
        if text_tmp is not None and os.path.exists(text_tmp):
            os.remove(text_tmp)


class _NotWritten(Exception):  # the caller asked for a table held in memory (write=False)
    pass


def _check_unique(table: ManifestTable, parse: Parser) -> None:
    """A key twice in the manifest is a DataError naming both lines (as the parser's)."""
    same = np.flatnonzero(table.hashes[1:] == table.hashes[:-1])
    if same.size == 0:
        return
    groups: dict[int, set[int]] = {}
    for i in same.tolist():
        groups.setdefault(int(table.hashes[i]), set()).update(
            (int(table.hash_rows[i]), int(table.hash_rows[i + 1])))
    first_error = None
    for rows in groups.values():
        seen: dict[str, int] = {}
        for r in sorted(rows):
            lineno, text = table.row(r)
            key = parse(lineno, text)[KEY]
            if key in seen:
                error = (lineno, DataError(f"duplicate key {key!r}, first on line {seen[key]}",
                                           source=table.path, line=lineno))
                if first_error is None or error[0] < first_error[0]:
                    first_error = error
                break
            seen[key] = lineno
    if first_error is not None:
        raise first_error[1]


# --------------------------------------------------------------------------- shard indexes

_INDEX_FORMAT = "speechpipe-shard-index-table"
_INDEX_VERSION = 2

#: What :func:`build_index_table` takes per shard: ``(name, count, bytes, keys, lengths,
#: line)`` -- an entry of ``index.jsonl``, checked, and its line number there.
IndexRow = tuple[str, int, int, "Sequence[str]", "Sequence[float]", int]


class MappedLengths(Sequence):
    """A shard's utterance lengths as a read-only sequence over a memory-mapped array (what
    :attr:`speechpipe.index.ShardEntry.lengths` holds for an index read from its table): items
    are Python floats, a slice is another view (no copy), and it compares equal to a tuple of
    the same numbers.

    >>> view = MappedLengths(np.array([3.0, 1.0, 2.0]))
    >>> view[0], view[1:], sum(view), view == (3.0, 1.0, 2.0)
    (3.0, (1.0, 2.0), 6.0, True)
    """

    __slots__ = ("array", "_total", "span")

    def __init__(self, array: np.ndarray, total: float | None = None,
                 span: tuple | None = None) -> None:
        self.array = array
        self._total = total
        self.span = span  # (table, start, stop): a whole shard's lengths in its table

    def __len__(self) -> int:
        return int(self.array.shape[0])

    def __getitem__(self, i):
        if isinstance(i, slice):
            return MappedLengths(self.array[i])
        return float(self.array[i])

    def __iter__(self) -> Iterator[float]:
        return iter(self.array.tolist())

    def total(self) -> float:
        """The sum, added in order as Python's ``sum`` adds (the same float to the last bit)."""
        if self._total is None:
            self._total = float(np.cumsum(self.array)[-1]) if len(self) else 0.0
        return self._total

    def __eq__(self, other) -> bool:
        if isinstance(other, MappedLengths):
            return bool(np.array_equal(self.array, other.array))
        if isinstance(other, (tuple, list)):
            return tuple(self) == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return repr(tuple(self))

    def __reduce__(self):  # pickled (sent to a spawned worker): mapped again there
        if self.span is not None and self.span[0].sidecar is not None:
            table, start, stop = self.span
            return _remapped_lengths, (table.sidecar, table.signature(), start, stop)
        return tuple, (tuple(self),)


class MappedKeys(Sequence):
    """A shard's keys, read from a mapped :class:`IndexTable` when asked for (no Python
    string per utterance is held); :meth:`position` finds a key by its hash.

    Compares equal to a tuple of the same keys; pickles as one.
    """

    __slots__ = ("table", "shard", "start", "stop")

    def __init__(self, table: "IndexTable", shard: int) -> None:
        self.table = table
        self.shard = shard
        self.start = int(table.starts[shard])
        self.stop = int(table.starts[shard + 1])

    def __len__(self) -> int:
        return self.stop - self.start

    def __getitem__(self, i):
        if isinstance(i, slice):
            return tuple(self.table.key(j) for j in range(self.start, self.stop)[i])
        n = len(self)
        if not -n <= i < n:
            raise IndexError("key index out of range")
        return self.table.key(self.start + (i % n))

    def __iter__(self) -> Iterator[str]:
        return self.table.keys_of(self.start, self.stop)

    def position(self, key: str) -> int | None:
        """Where ``key`` is in the shard (``None``: not there), by hash, then checked."""
        return self.table.find(self.shard, key)

    def __contains__(self, key) -> bool:
        return isinstance(key, str) and self.position(key) is not None

    def __eq__(self, other) -> bool:
        if isinstance(other, (MappedKeys, tuple, list)):
            return tuple(self) == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return repr(tuple(self))

    def __reduce__(self):
        if self.table.sidecar is not None:
            return _remapped_keys, (self.table.sidecar, self.table.signature(), self.shard)
        return tuple, (tuple(self),)


class IndexTable:
    """The mapped table of a shard index (``index.jsonl`` -> ``index.jsonl.spmap``): what
    planning an epoch reads, shared by every process that maps it.

    Per shard: ``counts``, ``bytes``, ``totals`` (the sum of its lengths), ``lines`` (its line
    in ``index.jsonl``), ``starts`` (``shards + 1`` offsets of its utterances in the
    per-utterance arrays) and its name (``names`` bytes at ``name_starts``). Per utterance:
    ``lengths`` (float64, the index's unit), ``codes`` (the place of each length in
    ``distinct``, the sorted distinct lengths: what is measured once per distinct length),
    keys (``keys`` bytes at ``key_starts``), and,
    within each shard's range, the :func:`key_hash` of its keys sorted (``hashes``) with the
    position of each in the shard (``hash_pos``). ``header`` holds the index's own header
    (``index_header``: unit, audio format, rates) and the size and modification time of the
    ``index.jsonl`` it was built from.
    """

    def __init__(self, path: str, sidecar: str | None, header: dict,
                 arrays: Mapping[str, np.ndarray]) -> None:
        self.path = path
        self.sidecar = sidecar
        self.header = header
        for name in ("counts", "bytes", "totals", "lines", "starts", "name_starts", "names",
                     "lengths", "key_starts", "keys", "hashes", "hash_pos", "distinct",
                     "codes"):
            setattr(self, name, np.asarray(arrays[name]))

    def __len__(self) -> int:
        """Shards."""
        return int(self.counts.shape[0])

    @property
    def index_header(self) -> dict:
        return dict(self.header.get("index_header") or {})

    def name(self, i: int) -> str:
        return self.names[int(self.name_starts[i]):int(self.name_starts[i + 1])
                          ].tobytes().decode("utf-8", "surrogatepass")

    def key(self, j: int) -> str:
        """The key of utterance ``j`` (over all shards)."""
        return self.keys[int(self.key_starts[j]):int(self.key_starts[j + 1])
                         ].tobytes().decode("utf-8", "surrogatepass")

    def keys_of(self, start: int, stop: int) -> Iterator[str]:
        bounds = self.key_starts[start:stop + 1].tolist()
        if not bounds:
            return iter(())
        blob = self.keys[bounds[0]:bounds[-1]].tobytes()
        base = bounds[0]
        return (blob[a - base:b - base].decode("utf-8", "surrogatepass")
                for a, b in zip(bounds, bounds[1:]))

    def lengths_of(self, i: int) -> MappedLengths:
        start, stop = int(self.starts[i]), int(self.starts[i + 1])
        return MappedLengths(self.lengths[start:stop], float(self.totals[i]),
                             (self, start, stop))

    def find(self, i: int, key: str) -> int | None:
        """The position of ``key`` in shard ``i`` (``None``: not there)."""
        lo, hi = int(self.starts[i]), int(self.starts[i + 1])
        wanted = np.uint64(key_hash(key))
        hashes = self.hashes[lo:hi]
        at = int(np.searchsorted(hashes, wanted, "left"))
        while at < hi - lo and hashes[at] == wanted:
            pos = int(self.hash_pos[lo + at])
            if self.key(lo + pos) == key:
                return pos
            at += 1
        return None

    def signature(self) -> tuple:
        """What identifies this table's content: the size and time of its index."""
        return (self.header.get("source_size"), self.header.get("source_mtime_ns"),
                len(self), int(self.starts[-1]))

    def is_current(self) -> bool:
        """Whether the index still has the size and modification time it was built from."""
        return _is_current(self.path, self.header)

    def fits(self) -> bool:
        """Whether the arrays fit together (counts, offsets and lengths agree): a check of a
        table read from a cache before it is trusted."""
        n = self.header.get("utterances")
        return (len(self.starts) == len(self) + 1 and int(self.starts[-1]) == n
                and len(self.lengths) == n and len(self.codes) == n
                and len(self.hashes) == n and len(self.hash_pos) == n
                and len(self.key_starts) == n + 1 and int(self.key_starts[-1]) == len(self.keys)
                and int(self.name_starts[-1]) == len(self.names))

    @classmethod
    def open(cls, path: str, rows: Callable[[], tuple[dict, Iterable[IndexRow]]], *,
             write: bool = True) -> "IndexTable | None":
        """The table of the local index at ``path``: its sidecar (``path + ".spmap"``) mapped
        when current, else built from ``rows()`` (``(the index's header, its entries)``,
        checked by the caller) and written beside it; processes that find it missing at once
        build it once (a lock on the index). ``None`` where that folder cannot be written
        (:meth:`speechpipe.index.ShardIndex.read` then keeps it in the node's cache folder).
        """
        st = os.stat(path)
        sig = {"source_size": st.st_size, "source_mtime_ns": st.st_mtime_ns}
        beside = path + MAPPED_SUFFIX
        table = cls._current(path, beside, sig)
        if table is not None:
            return table
        if write and os.access(os.path.dirname(os.path.abspath(path)), os.W_OK):
            with file_lock(path):
                table = cls._current(path, beside, sig)
                if table is not None:
                    return table
                header, entries = rows()
                try:
                    build_index_table(beside, header, entries, source=path, mode_of=path)
                except OSError:
                    pass
                else:
                    table = cls._current(path, beside, sig)
                    if table is not None:
                        return table
        return None

    @classmethod
    def mapped(cls, place: str, path: str) -> "IndexTable":
        """The table in the file ``place`` (of the index ``path``), mapped.

        Raises:
            MissingDataError: no such file.
            DataError: not an index table of this version, or cut short.
        """
        header, arrays = read_mapped(place)
        if header.get("format") != _INDEX_FORMAT or header.get("version") != _INDEX_VERSION:
            raise DataError("not a shard index table of this version", source=place)
        try:
            return cls(path, place, header, arrays)
        except KeyError as exc:
            raise DataError(f"shard index table without its {exc} array", source=place) from None

    @classmethod
    def _current(cls, path: str, place: str, sig: dict) -> "IndexTable | None":
        try:
            table = cls.mapped(place, path)
        except (MissingDataError, DataError):
            return None
        return table if all(table.header.get(k) == v for k, v in sig.items()) else None

    @classmethod
    def build(cls, header: dict, entries: Iterable[IndexRow], *, source: str) -> "IndexTable":
        """A table of ``entries`` not tied to a local file (an index read from a URL), in a
        temporary file mapped and then removed."""
        fd, tmp = tempfile.mkstemp(prefix="speechpipe-index-", suffix=MAPPED_SUFFIX)
        os.close(fd)
        try:
            build_index_table(tmp, header, entries, source=source)
            head, arrays = read_mapped(tmp)
        finally:
            os.remove(tmp)  # the maps keep the pages
        return cls(source, None, head, arrays)


#: Tables mapped again in this process for pickled views, by sidecar path.
_REMAPPED: dict[str, IndexTable] = {}


def _remapped(sidecar: str, signature: tuple) -> IndexTable:
    table = _REMAPPED.get(sidecar)
    if table is None or table.signature() != tuple(signature):
        try:
            header, arrays = read_mapped(sidecar)
        except MissingDataError:
            raise DataError("the index's table is gone since this index was sent here (the "
                            "index changed and its table was replaced): read it again",
                            source=sidecar) from None
        path = header.get("cache_source") or sidecar[:-len(MAPPED_SUFFIX)]
        table = IndexTable(path, sidecar, header, arrays)
        if table.signature() != tuple(signature):
            raise DataError("the index's table changed since this index was sent here (the "
                            "index was rewritten): read it again", source=sidecar)
        _REMAPPED[sidecar] = table
    return table


def _remapped_keys(sidecar: str, signature: tuple, shard: int) -> MappedKeys:
    return MappedKeys(_remapped(sidecar, signature), shard)


def _remapped_lengths(sidecar: str, signature: tuple, start: int, stop: int) -> MappedLengths:
    table = _remapped(sidecar, signature)
    shard = int(np.searchsorted(table.starts, start, "right")) - 1
    total = float(table.totals[shard]) if stop > start else 0.0
    return MappedLengths(table.lengths[start:stop], total,
                         (table, start, stop))


def build_index_table(out: str, header: dict, entries: Iterable[IndexRow], *, source: str,
                      mode_of: str | None = None, extra: Mapping[str, Any] | None = None,
                      sums: bool = False) -> str:
    """Write the :class:`IndexTable` of a shard index's ``header`` and checked ``entries`` to
    ``out`` (atomically). ``source``: the local ``index.jsonl`` whose size and modification
    time the table records, or a URL; ``extra``: more header fields (a cached table's
    source and version); ``sums``: record the arrays' CRC-32s (a node's cache file)."""
    sig = {} if not os.path.isfile(source) else _signature(source)
    counts, sizes, totals, lines = array("q"), array("q"), array("d"), array("q")
    starts, name_starts, key_starts = array("q", [0]), array("q", [0]), array("q", [0])
    names, keys = bytearray(), bytearray()
    lengths, hashes, hash_pos = array("d"), array("Q"), array("q")
    for name, count, size, shard_keys, shard_lengths, line in entries:
        counts.append(count)
        sizes.append(size)
        lines.append(line)
        values = [float(n) for n in shard_lengths]
        totals.append(float(sum(values)))
        lengths.extend(values)
        starts.append(starts[-1] + count)
        names += name.encode("utf-8", "surrogatepass")
        name_starts.append(len(names))
        shard_hashes = []
        for key in shard_keys:
            data = key.encode("utf-8", "surrogatepass")
            keys += data
            key_starts.append(len(keys))
            shard_hashes.append(int.from_bytes(
                hashlib.blake2b(data, digest_size=8).digest(), "little"))
        order = sorted(range(count), key=shard_hashes.__getitem__)
        hashes.extend(shard_hashes[p] for p in order)
        hash_pos.extend(order)
    n = starts[-1]
    distinct, codes = np.unique(np.frombuffer(lengths, np.float64), return_inverse=True)
    arrays = {
        "counts": np.frombuffer(counts, np.int64), "bytes": np.frombuffer(sizes, np.int64),
        "totals": np.frombuffer(totals, np.float64), "lines": np.frombuffer(lines, np.int64),
        "starts": np.frombuffer(starts, np.int64),
        "name_starts": np.frombuffer(name_starts, np.int64),
        "names": np.frombuffer(bytes(names), np.uint8),
        "lengths": np.frombuffer(lengths, np.float64),
        "key_starts": np.frombuffer(key_starts, np.int64),
        "keys": np.frombuffer(bytes(keys), np.uint8),
        "hashes": np.frombuffer(hashes, np.uint64),
        "hash_pos": np.frombuffer(hash_pos, np.int64).astype(index_dtype(n)),
        "distinct": distinct, "codes": codes.reshape(-1).astype(index_dtype(distinct.size)),
    }
    head = {"format": _INDEX_FORMAT, "version": _INDEX_VERSION, "index_header": header,
            "shards": len(counts), "utterances": n, **sig, **(extra or {})}
    return write_mapped(out, head, arrays, mode_of=mode_of, sums=sums)
