"""Kaldi data directories: ``scp``/``text`` tables, ark matrices, ``wav.scp`` and ``segments``.

A Kaldi data directory is a set of tables, one ``<key> <value>`` line each, sorted by key with
``LC_ALL=C sort``. This module turns them into samples in three verbs:

- ``parse_scp`` (:class:`ScpParserIterDataPipe`, plain function :func:`parse_scp_lines`):
  ``(path, stream)`` pairs from torch's ``open_files`` or speechpipe's ``open`` to one
  :class:`ScpEntry` ``(key, value)`` per line, which remembers its file and line so that every
  later error can name them. Serves ``feats.scp``, ``wav.scp``, ``segments``, ``utt2spk``
  and ``text`` (``allow_empty=True``: an utterance may have an empty transcript).
- ``load_scp`` (:class:`ScpLoaderIterDataPipe`, plain function :func:`load_scp_entries`):
  resolves each entry's value to a sample: ``kind="feats"`` reads a matrix from an ark
  (``raw.ark:1234``, ranges ``raw.ark:1234[0:9]``, float, double and compressed matrices, with
  kaldiio), ``kind="wav"`` reads audio (a path, a wav stored in an ark, or an opt-in
  ``cmd |`` pipe), ``kind="text"`` keeps the value as the transcript.
- ``load_segments`` (:class:`SegmentLoaderIterDataPipe`, plain function
  :func:`slice_segments`): entries of a ``segments`` file plus the ``wav.scp`` they refer to,
  to one sample per segment holding only that slice of the recording.

Joining tables by key (``text`` with ``feats.scp``) is ``join_by_key``'s job. A typical chain::

    IterableWrapper(["data/train/feats.scp"]).open_files(mode="b").parse_scp().load_scp("feats")

Shell commands in tables (``sox x.wav -t wav - |``) run only with ``allow_commands=True``, and
nothing stored in an ark is ever unpickled (kaldiio's ``PKL`` objects are refused).
"""

from __future__ import annotations

import io
import os
import re
import struct
import subprocess
import unicodedata
from collections import OrderedDict
from typing import Any, BinaryIO, Iterable, Iterator, Mapping, NamedTuple

import numpy as np
import soundfile
from kaldiio.matio import read_kaldi

from ..diagnostics import Diagnostics, check_on_error
from ..errors import DataError, MissingDataError, UnsafeInputError
from ..sample import AUDIO, FEATS, KEY, SAMPLE_RATE, TEXT, Sample
from ._base import IterDataPipe, functional_datapipe
from .decode import read_audio
from .sources import check_path_stream, iter_text_lines

__all__ = [
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
    "load_scp_entries",
    "parse_scp_lines",
    "parse_segment",
    "read_matrix",
    "read_scp_table",
    "read_wav_value",
    "slice_segments",
]

#: What ``load_scp`` can make of a value: a feature matrix, audio, or a transcript.
KINDS = ("feats", "wav", "text")

#: Sample field set by ``load_segments``: the recording id a segment was cut from.
RECORDING = "recording"

# Kaldi splits on ASCII whitespace only (C locale isspace); Python's str.split() would also
# split on U+00A0, U+3000 ... which may occur inside a transcript.
_WHITESPACE = " \t\n\r\v\f"
_SPLIT = re.compile(r"[ \t\n\r\v\f]+")

# <path>[:<offset>][<range>]; the lazy path lets a trailing ":<digits>" be the offset.
_ARK_REF = re.compile(r"(?P<path>.+?)(?::(?P<offset>[0-9]+))?(?:\[(?P<range>[^\[\]]*)\])?", re.S)

_MAX_STDERR = 800  # characters of a failing command's stderr shown in the error

_BINARY_TYPES = ("FM", "FV", "DM", "DV", "CM", "CM2", "CM3")


# --------------------------------------------------------------------------- entries


class ScpEntry(tuple):
    """One table line: a ``(key, value)`` pair that remembers its file and line.

    Unpacks and compares like the plain tuple; ``.source`` (file name) and ``.line`` (1-based)
    travel with it, also through pickling (DataLoader workers), so that a later stage can say
    ``wav.scp:17 (key 'utt1'): ...``. ``load_scp`` and ``load_segments`` also accept plain
    ``(key, value)`` tuples; their errors then name the key only.

    >>> import pickle
    >>> entry = ScpEntry("utt1", "/data/utt1.wav", source="wav.scp", line=3)
    >>> key, value = entry
    >>> entry == ("utt1", "/data/utt1.wav"), entry.source, entry.line
    (True, 'wav.scp', 3)
    >>> copy = pickle.loads(pickle.dumps(entry))
    >>> copy, copy.source, copy.line
    (ScpEntry('utt1', '/data/utt1.wav', source='wav.scp', line=3), 'wav.scp', 3)
    """

    source: str | None
    line: int | None

    def __new__(
        cls, key: str, value: str, source: str | None = None, line: int | None = None
    ) -> ScpEntry:
        self = super().__new__(cls, (key, value))
        self.source = source
        self.line = line
        return self

    @property
    def key(self) -> str:
        return self[0]

    @property
    def value(self) -> str:
        return self[1]

    def __getnewargs__(self) -> tuple[str, str, str | None, int | None]:
        return (self[0], self[1], self.source, self.line)

    def __reduce__(self):
        return (type(self), self.__getnewargs__())

    def __repr__(self) -> str:
        return f"ScpEntry({self[0]!r}, {self[1]!r}, source={self.source!r}, line={self.line!r})"


class _Where(NamedTuple):
    """Location of an entry, spread into error constructors with ``**where._asdict()``."""

    source: str | None
    line: int | None
    key: str | None


def _where(entry: Any) -> _Where:
    key = entry[0] if isinstance(entry[0], str) else None
    return _Where(getattr(entry, "source", None), getattr(entry, "line", None), key)


def _error(cls: type, reason: str, where: _Where) -> Exception:
    return cls(reason, source=where.source, line=where.line, key=where.key)


def _check_pair(entry: Any, stage: str) -> None:
    if not (isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[0], str)
            and isinstance(entry[1], str)):
        raise TypeError(
            f"{stage} consumes (key, value) string pairs such as parse_scp's ScpEntry, "
            f"got {entry!r}"
        )


# --------------------------------------------------------------------------- parse_scp


def parse_scp_lines(
    lines: Iterable[str | bytes],
    *,
    source: str,
    allow_empty: bool = False,
    check_sorted: bool = False,
    on_error: str = "raise",
    diagnostics: Diagnostics | None = None,
) -> Iterator[ScpEntry]:
    """Parse Kaldi table lines into :class:`ScpEntry` ``(key, value)`` pairs.

    The key is the first whitespace-separated token, the value the rest of the line with
    surrounding whitespace removed (inner spaces kept: ``text`` values and ``cmd |`` values
    contain spaces). Blank lines are skipped. Lines are read and decoded by
    :func:`~speechpipe.pipes.sources.iter_text_lines`: ``bytes`` lines (and a UTF-8 text
    stream, through its binary buffer) as UTF-8, each on its own, so a bad line is named and,
    under ``on_error="skip"``, skipped alone.

    Args:
        lines: ``str`` or ``bytes`` lines, e.g. a text or binary file object.
        source: file name used in errors and stored on each entry.
        allow_empty: accept a key without a value (Kaldi ``text`` files: an empty transcript);
            otherwise such a line is malformed.
        check_sorted: require keys in ``LC_ALL=C sort`` order, as Kaldi does; an out-of-order
            key is then an error naming its line.
        on_error: ``"raise"`` a :class:`DataError` at the first bad line, or ``"skip"`` the
            line and count it in ``diagnostics``.
        diagnostics: where skipped lines are counted (a new one if not given).

    Raises:
        DataError: a malformed line (no value, NUL byte, control character in the key, byte
            order mark), invalid UTF-8, a duplicate key (naming the earlier line) or, with
            ``check_sorted``, an unsorted key; the message starts with ``file:line``. Also a
            stream that cannot be read on (a read failure, a non-UTF-8 text stream that
            failed to decode): under ``"skip"`` the rest of that stream is dropped.

    >>> import io
    >>> for entry in parse_scp_lines(io.BytesIO(b"u1 a.wav\\nu2 sox b.wav -t wav - |\\n\\n"),
    ...                              source="wav.scp"):
    ...     print(entry)
    ScpEntry('u1', 'a.wav', source='wav.scp', line=1)
    ScpEntry('u2', 'sox b.wav -t wav - |', source='wav.scp', line=2)
    """
    check_on_error(on_error)
    if diagnostics is None:
        diagnostics = Diagnostics("parse_scp")
    seen: dict[str, int] = {}
    previous: str | None = None
    numbered = iter_text_lines(lines, source=source)
    try:
        while True:
            try:
                number, text = next(numbered)
            except StopIteration:
                return
            except DataError as exc:  # the stream cannot be read on
                diagnostics.handle(on_error, exc, "unreadable table")
                return
            if isinstance(text, DataError):
                diagnostics.handle(on_error, text, "undecodable line")
                continue
            stripped = text.strip(_WHITESPACE)
            if not stripped:
                continue
            problem = _line_problem(stripped, allow_empty)
            if problem is not None:
                diagnostics.handle(
                    on_error, DataError(problem, source=source, line=number), "malformed line"
                )
                continue
            parts = _SPLIT.split(stripped, maxsplit=1)
            key = parts[0]
            value = parts[1] if len(parts) == 2 else ""
            if key in seen:
                diagnostics.handle(
                    on_error,
                    DataError(
                        f"duplicate key (first on line {seen[key]})",
                        source=source,
                        line=number,
                        key=key,
                    ),
                    "duplicate key",
                )
                continue
            if check_sorted and previous is not None and key < previous:
                # str order is code point order, which is UTF-8 byte order: LC_ALL=C sort's.
                diagnostics.handle(
                    on_error,
                    DataError(
                        f"key is out of order after {previous!r}: Kaldi tables must be sorted "
                        "with 'LC_ALL=C sort' (or pass check_sorted=False)",
                        source=source,
                        line=number,
                        key=key,
                    ),
                    "unsorted key",
                )
                continue
            seen[key] = number
            previous = key
            yield ScpEntry(key, value, source=source, line=number)
    finally:
        numbered.close()


def _line_problem(stripped: str, allow_empty: bool) -> str | None:
    """Why a non-blank, stripped line is malformed, or None."""
    if "\x00" in stripped:
        return "line contains a NUL byte"
    key = _SPLIT.split(stripped, maxsplit=1)[0]
    if key.startswith("\ufeff"):
        return "key starts with a byte-order mark (U+FEFF); save the file without it"
    for char in key:
        if unicodedata.category(char) == "Cc":
            return f"key {key!r} contains the control character U+{ord(char):04X}"
    if not allow_empty and key == stripped:
        return (
            f"expected '<key> <value>', got only the key {key!r} (pass allow_empty=True "
            "for a Kaldi text file whose transcripts may be empty)"
        )
    return None


@functional_datapipe("parse_scp")
class ScpParserIterDataPipe(IterDataPipe[ScpEntry]):
    """Parse Kaldi tables into ``(key, value)`` entries (functional name: ``parse_scp``).

    Consumes ``(path, stream)`` pairs, as torch's ``open_files`` (``mode="b"`` or ``"r"``) and
    speechpipe's ``open`` yield, and yields one :class:`ScpEntry` per non-blank line, in file
    order, carrying ``.source`` and ``.line`` for later errors (see :func:`parse_scp_lines`
    for the line rules). Keys must be unique within a file. Each stream is read to its end
    and closed before the next pair is requested. Use ``load_scp`` or ``load_segments`` next.

    Args:
        source_datapipe: pipe of ``(path, stream)`` pairs.
        allow_empty: accept keys without a value (Kaldi ``text``: empty transcripts).
        check_sorted: require ``LC_ALL=C sort`` order within each file, as Kaldi does.
        on_error: ``"raise"`` at the first malformed, duplicate or unsorted line, or
            ``"skip"`` it; skips are counted in ``self.diagnostics`` (reset at the start of
            each pass) and warned about (``SkippedInputWarning``) at the end of the pass.

    >>> import os, tempfile
    >>> from speechpipe.pipes._base import IterableWrapper
    >>> tmp = tempfile.TemporaryDirectory()
    >>> path = os.path.join(tmp.name, "text")
    >>> with open(path, "w", encoding="utf-8") as f:
    ...     _ = f.write("u1 HELLO WORLD\\nu2\\n")
    >>> [tuple(e) for e in IterableWrapper([path]).open_files(mode="b").parse_scp(allow_empty=True)]
    [('u1', 'HELLO WORLD'), ('u2', '')]
    >>> tmp.cleanup()
    """

    def __init__(
        self,
        source_datapipe: IterDataPipe,
        *,
        allow_empty: bool = False,
        check_sorted: bool = False,
        on_error: str = "raise",
    ) -> None:
        for name, flag in (("allow_empty", allow_empty), ("check_sorted", check_sorted)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be a bool, got {flag!r}")
        self.source_datapipe = source_datapipe
        self.allow_empty = allow_empty
        self.check_sorted = check_sorted
        self.on_error = check_on_error(on_error)
        self.diagnostics = Diagnostics("parse_scp")

    def __iter__(self) -> Iterator[ScpEntry]:
        self.diagnostics.reset()
        for item in self.source_datapipe:
            path, stream = check_path_stream(item, "parse_scp")
            try:
                yield from parse_scp_lines(
                    stream,
                    source=path,
                    allow_empty=self.allow_empty,
                    check_sorted=self.check_sorted,
                    on_error=self.on_error,
                    diagnostics=self.diagnostics,
                )
            finally:
                stream.close()
        self.diagnostics.warn_if_skipped()

    def __len__(self) -> int:
        raise TypeError("parse_scp has no length: the number of lines is known only once read")


ScpParser = ScpParserIterDataPipe


def read_scp_table(
    path: str | os.PathLike,
    *,
    allow_empty: bool = False,
    on_error: str = "raise",
    diagnostics: Diagnostics | None = None,
) -> dict[str, ScpEntry]:
    """Read a whole Kaldi table into ``{key: ScpEntry}`` (for lookups such as ``wav.scp``).

    Args:
        path: the table file.
        allow_empty, on_error, diagnostics: as in :func:`parse_scp_lines`.

    Raises:
        MissingDataError: the file does not exist.
        DataError: as :func:`parse_scp_lines`.

    >>> import os, tempfile
    >>> tmp = tempfile.TemporaryDirectory()
    >>> path = os.path.join(tmp.name, "wav.scp")
    >>> with open(path, "w") as f:
    ...     _ = f.write("rec1 /data/rec1.flac\\n")
    >>> read_scp_table(path)["rec1"].value
    '/data/rec1.flac'
    >>> tmp.cleanup()
    """
    path = os.fspath(path)
    try:
        stream = open(path, "rb")
    except FileNotFoundError as exc:
        raise MissingDataError("table file not found", source=path) from exc
    except OSError as exc:
        raise DataError(f"cannot open table: {exc.strerror or exc}", source=path) from exc
    with stream:
        return {
            entry[0]: entry
            for entry in parse_scp_lines(
                stream,
                source=path,
                allow_empty=allow_empty,
                on_error=on_error,
                diagnostics=diagnostics,
            )
        }


# --------------------------------------------------------------------------- values


def _is_command(value: str) -> bool:
    return value.endswith("|")


def _resolve(path: str, root: str | None) -> str:
    if root is not None and not os.path.isabs(path):
        return os.path.join(root, path)
    return path


def _check_value(value: str, where: _Where) -> None:
    if not value:
        raise _error(DataError, "empty value: expected a path or an ark reference", where)
    if value.startswith("|"):
        raise _error(
            DataError,
            f"{value!r} is an output pipe ('| cmd'); an input command ends with '|'",
            where,
        )
    if "\x00" in value:
        raise _error(DataError, "value contains a NUL byte", where)


def _run_command(value: str, *, allow_commands: bool, where: _Where) -> bytes:
    """Run a Kaldi ``cmd |`` value and return its stdout."""
    command = value[:-1].strip(_WHITESPACE)
    if not allow_commands:
        raise _error(
            UnsafeInputError,
            f"{value!r} is a shell command; speechpipe runs commands from tables only when "
            "asked: pass allow_commands=True if you trust this file",
            where,
        )
    if not command:
        raise _error(DataError, "empty command before '|'", where)
    try:
        done = subprocess.run(
            command, shell=True, stdin=subprocess.DEVNULL, capture_output=True, check=False
        )
    except OSError as exc:
        raise _error(DataError, f"cannot run command {command!r}: {exc}", where) from exc
    if done.returncode != 0:
        tail = done.stderr.decode("utf-8", errors="replace").strip()[-_MAX_STDERR:]
        raise _error(
            DataError,
            f"command {command!r} failed with exit status {done.returncode}"
            + (f"; stderr: {tail}" if tail else " (no stderr)"),
            where,
        )
    return done.stdout


class _OpenFiles:
    """A few ark files kept open during one pass: scp entries usually walk an ark in order."""

    def __init__(self, size: int = 4) -> None:
        self.size = size
        self._files: OrderedDict[str, BinaryIO] = OrderedDict()

    def get(self, path: str, where: _Where, what: str) -> BinaryIO:
        stream = self._files.get(path)
        if stream is not None:
            self._files.move_to_end(path)
            return stream
        try:
            stream = open(path, "rb")
        except FileNotFoundError as exc:
            raise _error(MissingDataError, f"{what} not found: {path}", where) from exc
        except OSError as exc:
            raise _error(DataError, f"cannot open {what} {path}: {exc.strerror or exc}",
                         where) from exc
        self._files[path] = stream
        if len(self._files) > self.size:
            self._files.popitem(last=False)[1].close()
        return stream

    def close(self) -> None:
        while self._files:
            self._files.popitem()[1].close()


def _size_of(stream: BinaryIO) -> int:
    position = stream.tell()
    size = stream.seek(0, io.SEEK_END)
    stream.seek(position)
    return size


class _Header:
    """Reads an object's header from a stream, raising DataError when it is cut short."""

    def __init__(self, stream: BinaryIO, name: str, where: _Where) -> None:
        self.stream, self.name, self.where = stream, name, where

    def take(self, n: int) -> bytes:
        data = self.stream.read(n)
        if len(data) < n:
            raise _error(DataError, f"{self.name}: truncated object header", self.where)
        return data

    def int32(self, marker: bool = True) -> int:
        if marker and self.take(1) != b"\x04":
            raise _error(DataError, f"{self.name}: bad size marker in the header", self.where)
        return struct.unpack("<i", self.take(4))[0]


def _check_matrix_object(stream: BinaryIO, name: str, where: _Where) -> None:
    """Refuse what the matrix reader must not see, and check declared sizes fit the file.

    The stream is positioned at the object; kaldiio would unpickle ``PKL`` objects and would
    allocate whatever a corrupt header declares, so both are caught here first.
    """
    start = stream.tell()
    available = _size_of(stream) - start
    head = _Header(stream, name, where)
    magic = stream.read(5)
    if len(magic) < 5:
        raise _error(
            DataError, f"{name}: {len(magic)} bytes left in the file, too few for a matrix", where
        )
    if magic.startswith(b"PKL"):
        raise _error(
            UnsafeInputError, f"{name} holds a pickled object; speechpipe never unpickles", where
        )
    if magic[:4] in (b"RIFF", b"fLaC") or magic == b"AUDIO":
        raise _error(
            DataError, f"{name} holds audio, not a feature matrix (use kind='wav')", where
        )
    need = 0
    if magic.startswith(b"NPY"):
        stream.seek(start + 3)
        width = head.take(1)[0]
        if not 0 < width <= 8:
            raise _error(DataError, f"{name}: bad NPY length header", where)
        need = 4 + width + int.from_bytes(head.take(width), "little")
    elif magic.startswith(b"\x00B"):
        stream.seek(start + 2)
        if magic[2:3] == b"\x04":
            raise _error(DataError, f"{name} holds an integer vector, not a matrix", where)
        token = bytearray()
        while len(token) <= 4:
            char = head.take(1)
            if char == b" ":
                break
            token += char
        kind = token.decode("latin-1")
        if kind not in _BINARY_TYPES:
            raise _error(
                DataError,
                f"{name}: unsupported binary object type {kind!r} (expected one of "
                f"{', '.join(_BINARY_TYPES)})",
                where,
            )
        if kind in ("CM", "CM2", "CM3"):
            head.take(8)  # min and range of the compressed values
            rows, cols = head.int32(marker=False), head.int32(marker=False)
            per_value = {"CM": 1, "CM2": 2, "CM3": 1}[kind]
            body = (8 * cols if kind == "CM" else 0) + per_value * rows * cols
        else:
            per_value = 4 if kind[0] == "F" else 8
            rows = head.int32()
            cols = head.int32() if kind[1] == "M" else 1
            body = per_value * rows * cols
        if rows < 0 or cols < 0:
            raise _error(DataError, f"{name}: negative size {rows} x {cols} in header", where)
        need = stream.tell() - start + body
    if need > available:
        raise _error(
            DataError,
            f"{name}: truncated: the object needs {need} bytes, {available} are left in the file",
            where,
        )
    stream.seek(start)


def _parse_range(text: str, shape: tuple[int, ...], name: str, where: _Where) -> tuple:
    """Kaldi's ``[r1:r2]`` / ``[r1:r2,c1:c2]`` (inclusive bounds; empty means all)."""
    parts = text.split(",")
    if len(parts) > 2:
        raise _error(DataError, f"{name}: bad range [{text}]: at most rows,cols", where)
    index = []
    for part, size, axis in zip(parts, shape, ("row", "column")):
        part = part.strip()
        if part in ("", ":"):
            index.append(slice(None))
            continue
        bounds = part.split(":")
        if len(bounds) != 2 or not all(b.strip().isdigit() for b in bounds):
            raise _error(DataError, f"{name}: bad range [{text}]: expected first:last", where)
        first, last = (int(b) for b in bounds)
        if first > last:
            raise _error(
                DataError, f"{name}: bad range [{text}]: first {axis} {first} > last {last}", where
            )
        if last >= size:
            raise _error(
                DataError,
                f"{name}: {axis} range {first}:{last} is outside the matrix's {size} {axis}s",
                where,
            )
        index.append(slice(first, last + 1))
    return tuple(index)


def _decode_matrix(stream: BinaryIO, name: str, where: _Where) -> np.ndarray:
    _check_matrix_object(stream, name, where)
    try:
        with np.errstate(all="ignore"):
            array = read_kaldi(stream)
    # kaldiio reports corrupt data with assert, struct.error, ValueError, RuntimeError,
    # IndexError, UnicodeDecodeError...: any of them means the bytes are not a matrix.
    except Exception as exc:
        raise _error(
            DataError, f"{name}: cannot read a matrix: {type(exc).__name__}: {exc}", where
        ) from exc
    if not isinstance(array, np.ndarray) or array.ndim != 2:
        shape = getattr(array, "shape", type(array).__name__)
        raise _error(DataError, f"{name}: expected a matrix (frames, dim), got {shape}", where)
    if array.dtype.kind not in "fiub":
        raise _error(DataError, f"{name}: expected numbers, got dtype {array.dtype}", where)
    return array


def _read_matrix(
    value: str, *, root: str | None, allow_commands: bool, files: _OpenFiles, where: _Where
) -> np.ndarray:
    _check_value(value, where)
    if _is_command(value):
        stdout = _run_command(value, allow_commands=allow_commands, where=where)
        return _decode_matrix(io.BytesIO(stdout), f"output of {value!r}", where).astype(
            np.float32
        )
    match = _ARK_REF.fullmatch(value)
    if match is None:  # cannot happen: the pattern matches every non-empty string
        raise _error(DataError, f"cannot parse ark reference {value!r}", where)
    path = _resolve(match["path"], root)
    offset = int(match["offset"] or 0)
    name = f"{path}:{offset}"
    stream = files.get(path, where, "ark file")
    try:
        size = os.fstat(stream.fileno()).st_size
    except OSError as exc:
        raise _error(DataError, f"cannot stat {path}: {exc}", where) from exc
    if offset >= size:
        raise _error(
            DataError, f"{name}: offset {offset} is past the end of the file ({size} bytes)",
            where,
        )
    stream.seek(offset)
    array = _decode_matrix(stream, name, where)
    if match["range"] is not None:
        array = array[_parse_range(match["range"], array.shape, name, where)]
    return np.ascontiguousarray(array, dtype=np.float32)


def read_matrix(
    value: str,
    *,
    root: str | None = None,
    allow_commands: bool = False,
    source: str | None = None,
    line: int | None = None,
    key: str | None = None,
) -> np.ndarray:
    """Read a ``feats.scp`` value (``raw.ark:1234``, ``raw.ark:1234[0:9]``) as float32.

    Float, double and compressed (``CM``, ``CM2``, ``CM3``) matrices, text-ark matrices and
    kaldiio's ``NPY`` objects are read with kaldiio; ranges follow Kaldi (inclusive
    ``[first-row:last-row]`` or ``[rows,cols]``, empty means all) and must fit the matrix. A
    path without ``:offset`` reads the object at the start of the file.

    Args:
        value: the table value.
        root: directory for relative ark paths (default: the current directory, as Kaldi).
        allow_commands: allow ``cmd |`` values, whose stdout is read as one matrix.
        source, line, key: where the value came from, for error messages.

    Returns:
        ``float32`` array ``(frames, dim)``.

    Raises:
        MissingDataError: the ark file does not exist.
        UnsafeInputError: a command without ``allow_commands``, or a pickled object.
        DataError: a bad offset or range, a truncated or corrupt ark, not a matrix.

    >>> import os, tempfile, numpy as np, kaldiio
    >>> tmp = tempfile.TemporaryDirectory()
    >>> ark = os.path.join(tmp.name, "raw.ark")
    >>> kaldiio.save_ark(ark, {"u1": np.arange(12, dtype=np.float32).reshape(4, 3)})
    >>> read_matrix(f"{ark}:3[1:2]")
    array([[3., 4., 5.],
           [6., 7., 8.]], dtype=float32)
    >>> tmp.cleanup()
    """
    files = _OpenFiles()
    try:
        return _read_matrix(
            value,
            root=None if root is None else os.fspath(root),
            allow_commands=allow_commands,
            files=files,
            where=_Where(source, line, key),
        )
    finally:
        files.close()


def _relocated(exc: DataError | MissingDataError, what: str, where: _Where) -> Exception:
    """An error from read_audio, re-raised at the table line that named the audio."""
    return _error(type(exc), f"{what}: {exc.reason}", where)


def _audio_bytes_in_ark(stream: BinaryIO, name: str, where: _Where) -> bytes:
    """The encoded audio stored at the stream's position (RIFF wav, kaldiio AUDIO, FLAC)."""
    start = stream.tell()
    available = _size_of(stream) - start
    head = _Header(stream, name, where)
    magic = stream.read(5)
    if not magic:
        raise _error(DataError, f"{name}: the offset is at or past the end of the file", where)
    if magic[:4] == b"RIFF":
        stream.seek(start + 4)
        declared = struct.unpack("<I", head.take(4))[0] + 8
        stream.seek(start)
        # Streamed wavs may declare a size they do not have; soundfile copes with a short one.
        return stream.read(min(declared, available))
    if magic == b"AUDIO":
        width = head.take(1)[0]
        if not 0 < width <= 8:
            raise _error(DataError, f"{name}: bad AUDIO length header", where)
        length = int.from_bytes(head.take(width), "little")
        if length > available - 6 - width:
            raise _error(
                DataError,
                f"{name}: truncated: the audio needs {length} bytes, "
                f"{available - 6 - width} are left in the file",
                where,
            )
        return head.take(length)
    if magic[:4] == b"fLaC":
        stream.seek(start)
        return stream.read()
    raise _error(
        DataError,
        f"{name} does not hold audio (expected RIFF, fLaC or AUDIO, found {magic!r})",
        where,
    )


def _read_wav(
    value: str, *, root: str | None, allow_commands: bool, files: _OpenFiles, where: _Where
) -> tuple[np.ndarray, int]:
    _check_value(value, where)
    if _is_command(value):
        stdout = _run_command(value, allow_commands=allow_commands, where=where)
        what = f"output of {value!r}"
        data: Any = stdout
    else:
        path = _resolve(value, root)
        match = _ARK_REF.fullmatch(value)
        ark = _resolve(match["path"], root) if match and match["offset"] else None
        if not os.path.exists(path) and ark is not None and match["range"] is None \
                and os.path.isfile(ark):
            offset = int(match["offset"])
            what = f"{ark}:{offset}"
            stream = files.get(ark, where, "ark file")
            stream.seek(offset)
            data = _audio_bytes_in_ark(stream, what, where)
        else:
            what, data = path, path
    try:
        return read_audio(data, source=where.source, key=where.key)
    except (DataError, MissingDataError) as exc:
        raise _relocated(exc, what, where) from exc


def read_wav_value(
    value: str,
    *,
    root: str | None = None,
    allow_commands: bool = False,
    source: str | None = None,
    line: int | None = None,
    key: str | None = None,
) -> tuple[np.ndarray, int]:
    """Read the audio a ``wav.scp`` value names: ``(float32 audio, sample_rate)``.

    The value is an audio file (any format soundfile reads), a wav stored in an ark
    (``wav.ark:123``, used when no file is literally named so), or a ``cmd |`` whose stdout
    is an audio file (only with ``allow_commands``; a non-zero exit status is a DataError
    showing the command and the end of its stderr).

    Args:
        value: the table value.
        root: directory for relative paths (default: the current directory, as Kaldi).
        allow_commands: run ``cmd |`` values with the shell.
        source, line, key: where the value came from, for error messages.

    Raises:
        MissingDataError: the audio file or the ark does not exist.
        UnsafeInputError: a command without ``allow_commands``.
        DataError: undecodable audio, a failing command, a bad ark offset.

    >>> import os, tempfile, numpy as np, soundfile
    >>> tmp = tempfile.TemporaryDirectory()
    >>> soundfile.write(os.path.join(tmp.name, "a.wav"), np.zeros(800, np.float32), 8000)
    >>> audio, rate = read_wav_value("a.wav", root=tmp.name)
    >>> audio.shape, rate
    ((800,), 8000)
    >>> tmp.cleanup()
    """
    files = _OpenFiles()
    try:
        return _read_wav(
            value,
            root=None if root is None else os.fspath(root),
            allow_commands=allow_commands,
            files=files,
            where=_Where(source, line, key),
        )
    finally:
        files.close()


# --------------------------------------------------------------------------- load_scp


def load_scp_entries(
    entries: Iterable[tuple[str, str]],
    kind: str,
    *,
    root: str | None = None,
    allow_commands: bool = False,
    on_error: str = "raise",
    diagnostics: Diagnostics | None = None,
) -> Iterator[Sample]:
    """Resolve ``(key, value)`` entries to samples of one ``kind``.

    - ``"feats"``: ``{"key", "feats"}``, float32 ``(frames, dim)`` (:func:`read_matrix`);
    - ``"wav"``: ``{"key", "audio", "sample_rate"}`` (:func:`read_wav_value`);
    - ``"text"``: ``{"key", "text"}``, the value as is.

    Args:
        entries: :class:`ScpEntry` (errors then name file and line) or plain pairs.
        kind: one of :data:`KINDS`.
        root: directory for relative paths.
        allow_commands: allow ``cmd |`` values.
        on_error: ``"raise"``, or ``"skip"`` entries whose data is missing or bad (an
            :class:`UnsafeInputError` is skipped too, and counted under its own reason).
        diagnostics: where skips are counted (a new one if not given).

    >>> list(load_scp_entries([("u1", "HELLO WORLD")], "text"))
    [{'key': 'u1', 'text': 'HELLO WORLD'}]
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    check_on_error(on_error)
    if diagnostics is None:
        diagnostics = Diagnostics("load_scp")
    root = None if root is None else os.fspath(root)
    files = _OpenFiles()
    try:
        for entry in entries:
            _check_pair(entry, "load_scp")
            key, value = entry
            where = _where(entry)
            try:
                if kind == "text":
                    sample: Sample = {KEY: key, TEXT: value}
                elif kind == "feats":
                    feats = _read_matrix(
                        value, root=root, allow_commands=allow_commands, files=files,
                        where=where,
                    )
                    sample = {KEY: key, FEATS: feats}
                else:
                    audio, rate = _read_wav(
                        value, root=root, allow_commands=allow_commands, files=files,
                        where=where,
                    )
                    sample = {KEY: key, AUDIO: audio, SAMPLE_RATE: rate}
            except (DataError, MissingDataError) as exc:
                diagnostics.handle(on_error, exc, _reason(exc, kind))
                continue
            yield sample
    finally:
        files.close()


def _reason(exc: Exception, kind: str) -> str:
    if isinstance(exc, UnsafeInputError):
        return "unsafe value (command not allowed)"
    if isinstance(exc, MissingDataError):
        return f"missing {kind} data"
    return f"bad {kind} data"


@functional_datapipe("load_scp")
class ScpLoaderIterDataPipe(IterDataPipe[Sample]):
    """Resolve Kaldi table entries to samples (functional name: ``load_scp``).

    Consumes :class:`ScpEntry` from ``parse_scp`` (or plain ``(key, value)`` pairs) and yields
    one sample dict per entry, in order (:func:`load_scp_entries`):

    - ``kind="feats"``: ``{"key", "feats"}``, ``feats`` float32 ``(frames, dim)`` read from
      ``ark:offset`` values (float, double or compressed; Kaldi ranges ``[0:9]``);
    - ``kind="wav"``: ``{"key", "audio", "sample_rate"}`` from an audio path, a wav stored in
      an ark, or an opt-in ``cmd |``;
    - ``kind="text"``: ``{"key", "text"}``.

    Errors name the table file, line and key, and the ark or audio path. For a ``segments``
    file use ``load_segments``; to combine tables by key use ``join_by_key``.

    Args:
        source_datapipe: pipe of entries.
        kind: ``"feats"``, ``"wav"`` or ``"text"``.
        root: directory that relative paths are joined with; by default they are relative
            to the current directory, as in Kaldi (run from the recipe directory).
        allow_commands: run ``cmd |`` values with the shell; without it they raise
            :class:`~speechpipe.errors.UnsafeInputError`.
        on_error: ``"raise"``, or ``"skip"`` entries whose data is missing or bad, counted
            in ``self.diagnostics`` (reset each pass) and warned about at the end of a pass.

    >>> import os, tempfile, numpy as np, kaldiio
    >>> from speechpipe.pipes._base import IterableWrapper
    >>> tmp = tempfile.TemporaryDirectory()
    >>> feats = {"u1": np.ones((5, 3), np.float32), "u2": np.zeros((2, 3), np.float32)}
    >>> with kaldiio.WriteHelper(f"ark,scp:{tmp.name}/raw.ark,{tmp.name}/feats.scp") as w:
    ...     for k, m in feats.items():
    ...         w(k, m)
    >>> pipe = IterableWrapper([f"{tmp.name}/feats.scp"]).open_files(mode="b").parse_scp()
    >>> [(s["key"], s["feats"].shape) for s in pipe.load_scp("feats")]
    [('u1', (5, 3)), ('u2', (2, 3))]
    >>> tmp.cleanup()
    """

    def __init__(
        self,
        source_datapipe: IterDataPipe,
        kind: str,
        *,
        root: str | os.PathLike | None = None,
        allow_commands: bool = False,
        on_error: str = "raise",
    ) -> None:
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        if root is not None and not isinstance(root, (str, os.PathLike)):
            raise TypeError(f"root must be a directory path or None, got {root!r}")
        if not isinstance(allow_commands, bool):
            raise TypeError(f"allow_commands must be a bool, got {allow_commands!r}")
        self.source_datapipe = source_datapipe
        self.kind = kind
        self.root = None if root is None else os.fspath(root)
        self.allow_commands = allow_commands
        self.on_error = check_on_error(on_error)
        self.diagnostics = Diagnostics("load_scp")

    def __iter__(self) -> Iterator[Sample]:
        self.diagnostics.reset()
        yield from load_scp_entries(
            self.source_datapipe,
            self.kind,
            root=self.root,
            allow_commands=self.allow_commands,
            on_error=self.on_error,
            diagnostics=self.diagnostics,
        )
        self.diagnostics.warn_if_skipped()

    def __len__(self) -> int:
        if self.on_error != "raise":
            raise TypeError("load_scp(on_error='skip') has no length: skips are unknown ahead")
        return len(self.source_datapipe)


ScpLoader = ScpLoaderIterDataPipe


# --------------------------------------------------------------------------- segments


class Segment(NamedTuple):
    """One line of a Kaldi ``segments`` file, parsed."""

    recording: str
    start: float
    end: float  # -1: to the end of the recording
    channel: int | None


def parse_segment(entry: tuple[str, str]) -> Segment:
    """Parse a ``segments`` entry (``ScpEntry`` from ``parse_scp``); errors name file and line.

    >>> parse_segment(ScpEntry("utt1", "rec1 0.5 2.25", "segments", 1))
    Segment(recording='rec1', start=0.5, end=2.25, channel=None)
    """
    return _parse_segment(entry[1], _where(entry))


def _parse_segment(value: str, where: _Where) -> Segment:
    fields = _SPLIT.split(value.strip(_WHITESPACE)) if value.strip(_WHITESPACE) else []
    if len(fields) not in (3, 4):
        raise _error(
            DataError,
            "expected '<utterance-id> <recording-id> <start-sec> <end-sec> [<channel>]', "
            f"got {len(fields) + 1} fields",
            where,
        )
    times = []
    for name, text in (("start", fields[1]), ("end", fields[2])):
        try:
            number = float(text)
        except ValueError:
            number = float("nan")
        if not np.isfinite(number):
            raise _error(DataError, f"{name} time {text!r} is not a number of seconds", where)
        times.append(number)
    start, end = times
    if start < 0:
        raise _error(DataError, f"start time {start} is negative", where)
    if end != -1 and end <= start:
        raise _error(
            DataError, f"end time {end} is not after start time {start} (use -1 for 'to the "
            "end of the recording')", where,
        )
    channel = None
    if len(fields) == 4:
        if not fields[3].isdigit():
            raise _error(DataError, f"channel {fields[3]!r} is not a channel number", where)
        channel = int(fields[3])
    return Segment(fields[0], start, end, channel)


class _Recordings:
    """Per-pass lookups of the recordings segments are cut from.

    Plain files are measured once with ``soundfile.info`` and then only the slice is read;
    recordings from commands or arks are decoded whole, and the last one is kept (segments
    files are sorted, so the segments of a recording come together).
    """

    def __init__(
        self, table: Mapping[str, ScpEntry], root: str | None, allow_commands: bool,
        table_name: str,
    ) -> None:
        self.table, self.root, self.allow_commands = table, root, allow_commands
        self.table_name = table_name
        self.info: dict[str, tuple[int, int] | Exception] = {}
        self.decoded: tuple[str, np.ndarray, int] | Exception | None = None
        self.decoded_id: str | None = None
        self.files = _OpenFiles()

    def _file(self, entry: ScpEntry) -> str | None:
        """The audio file a wav.scp value names, or None if it must be decoded whole."""
        value = entry[1]
        if not value or _is_command(value) or value.startswith("|"):
            return None
        path = _resolve(value, self.root)
        match = _ARK_REF.fullmatch(value)
        if not os.path.exists(path) and match and match["offset"] and match["range"] is None \
                and os.path.isfile(_resolve(match["path"], self.root)):
            return None
        return path

    def get(self, reco: str, where: _Where) -> tuple[str | None, Any, int, int]:
        """``(path or None, audio or None, rate, frames)`` of a recording."""
        entry = self.table.get(reco)
        if entry is None:
            raise _error(
                DataError, f"unknown recording {reco!r}: not in {self.table_name}", where
            )
        at = _where(entry)
        here = f"recording {reco!r} ({at.source}:{at.line})" if at.line else f"recording {reco!r}"
        path = self._file(entry)
        if path is not None:
            cached = self.info.get(reco)
            if cached is None:
                try:
                    info = soundfile.info(path)
                    cached = (int(info.samplerate), int(info.frames))
                except (soundfile.LibsndfileError, RuntimeError, TypeError, ValueError) as exc:
                    if os.path.exists(path):
                        cached = DataError(f"{here}: cannot decode audio {path}: {exc}")
                    else:
                        cached = MissingDataError(f"{here}: audio file not found: {path}")
                self.info[reco] = cached
            if isinstance(cached, Exception):
                raise _error(type(cached), cached.reason, where) from cached
            return path, None, cached[0], cached[1]
        if self.decoded_id != reco:
            try:
                audio, rate = _read_wav(
                    entry[1], root=self.root, allow_commands=self.allow_commands,
                    files=self.files, where=at,
                )
                self.decoded = (reco, audio, rate)
            except (DataError, MissingDataError) as exc:
                self.decoded = exc
            self.decoded_id = reco
        if isinstance(self.decoded, Exception):
            exc = self.decoded
            raise _error(type(exc), f"{here}: {exc.reason}", where) from exc
        _, audio, rate = self.decoded
        return None, audio, rate, audio.shape[0]

    def close(self) -> None:
        self.files.close()


def slice_segments(
    entries: Iterable[tuple[str, str]],
    recordings: Mapping[str, ScpEntry],
    *,
    root: str | None = None,
    allow_commands: bool = False,
    on_error: str = "raise",
    diagnostics: Diagnostics | None = None,
    table_name: str = "wav.scp",
    max_overshoot: float = 0.5,
) -> Iterator[Sample]:
    """Cut the segments of a Kaldi ``segments`` file out of their recordings.

    Each entry is ``(utterance-id, "<recording-id> <start-sec> <end-sec> [<channel>]")``; an
    end of ``-1`` means the end of the recording. Sample indices are ``round(seconds *
    sample_rate)``; only the slice of an audio file is read. The optional channel (Kaldi's
    fifth field) picks one channel of a multi-channel recording.

    Args:
        entries: entries of the segments file (:class:`ScpEntry` or plain pairs).
        recordings: ``{recording-id: wav.scp entry}``, e.g. from :func:`read_scp_table`.
        root, allow_commands: as in :func:`read_wav_value`.
        on_error: ``"raise"``, or ``"skip"`` bad segments, counted in ``diagnostics``.
        diagnostics: where skips are counted (a new one if not given).
        table_name: name of the recordings table, for error messages.
        max_overshoot: seconds a segment may end past its recording and be truncated to the
            recording's end (Kaldi's ``extract-segments --max-overshoot``, also 0.5 s);
            further is an error.

    Yields:
        ``{"key": utterance-id, "audio", "sample_rate", "recording": recording-id}``.

    Raises:
        DataError: a malformed segment (field count, non-numeric or negative time, end not
            after start, bad channel), an unknown recording, a segment past the end of its
            recording; the message names the segments file, line and utterance.

    >>> import os, tempfile, numpy as np, soundfile
    >>> tmp = tempfile.TemporaryDirectory()
    >>> path = os.path.join(tmp.name, "rec.wav")
    >>> soundfile.write(path, np.linspace(-1, 1, 100, dtype=np.float32), 10, subtype="FLOAT")
    >>> [s["audio"].shape for s in slice_segments([("utt", "rec 1.5 2.5")], {"rec": ("rec", path)})]
    [(10,)]
    >>> tmp.cleanup()
    """
    check_on_error(on_error)
    if diagnostics is None:
        diagnostics = Diagnostics("load_segments")
    lookup = _Recordings(
        recordings, None if root is None else os.fspath(root), allow_commands, table_name
    )
    try:
        for entry in entries:
            _check_pair(entry, "load_segments")
            where = _where(entry)
            try:
                sample = _cut(
                    entry[0], _parse_segment(entry[1], where), lookup, where, max_overshoot
                )
            except (DataError, MissingDataError) as exc:
                reason = "bad segment" if isinstance(exc, DataError) else "missing recording"
                diagnostics.handle(on_error, exc, reason)
                continue
            yield sample
    finally:
        lookup.close()


def _cut(
    key: str, segment: Segment, lookup: _Recordings, where: _Where, max_overshoot: float
) -> Sample:
    path, whole, rate, frames = lookup.get(segment.recording, where)
    start = round(segment.start * rate)
    stop = frames if segment.end == -1 else round(segment.end * rate)
    if frames < stop <= frames + round(max_overshoot * rate):
        stop = frames  # Kaldi's tolerance: segment times are rounded, recordings are not
    if stop > frames:
        raise _error(
            DataError,
            f"segment ends at {segment.end} s (sample {stop}), past the end of recording "
            f"{segment.recording!r} ({frames} samples, {frames / rate:.3f} s)",
            where,
        )
    if start >= stop:
        raise _error(
            DataError,
            f"segment [{segment.start}, {segment.end}] s has no samples in recording "
            f"{segment.recording!r} ({frames} samples at {rate} Hz)",
            where,
        )
    if path is not None:
        try:
            audio, rate = read_audio(path, start=start, stop=stop, key=key)
        except (DataError, MissingDataError) as exc:
            raise _relocated(exc, path, where) from exc
    else:
        audio = whole[start:stop].copy()
    if segment.channel is not None:
        channels = 1 if audio.ndim == 1 else audio.shape[1]
        if segment.channel >= channels:
            raise _error(
                DataError,
                f"channel {segment.channel} does not exist: recording {segment.recording!r} "
                f"has {channels} channel(s)",
                where,
            )
        if audio.ndim == 2:
            audio = np.ascontiguousarray(audio[:, segment.channel])
    return {KEY: key, AUDIO: audio, SAMPLE_RATE: rate, RECORDING: segment.recording}


@functional_datapipe("load_segments")
class SegmentLoaderIterDataPipe(IterDataPipe[Sample]):
    """Cut Kaldi ``segments`` out of their recordings (functional name: ``load_segments``).

    Consumes :class:`ScpEntry` from ``parse_scp`` over a ``segments`` file (``<utt>
    <recording-id> <start-sec> <end-sec>``, end ``-1`` = to the end) and yields one sample
    per segment, in order: ``{"key": utt, "audio", "sample_rate", "recording": recording-id}``
    holding only that slice (:func:`slice_segments`). The ``wav_scp`` table is read at the
    start of each pass, not when the pipe is built. For whole recordings use
    ``load_scp("wav")``.

    Args:
        source_datapipe: pipe of segments entries.
        wav_scp: path of the ``wav.scp`` mapping recording ids to audio (paths, wavs in
            arks, or ``cmd |`` with ``allow_commands``).
        root: directory that relative paths in ``wav_scp`` are joined with (default: the
            current directory, as Kaldi).
        allow_commands: run ``cmd |`` recordings with the shell (each command runs once for
            consecutive segments of its recording).
        max_overshoot: seconds a segment may end past its recording and be truncated (Kaldi's
            default, 0.5); a segment ending further out is an error.
        on_error: ``"raise"``, or ``"skip"`` bad segments (and bad ``wav_scp`` lines),
            counted in ``self.diagnostics`` (reset each pass) and warned about at its end.

    >>> import os, tempfile, numpy as np, soundfile
    >>> from speechpipe.pipes._base import IterableWrapper
    >>> tmp = tempfile.TemporaryDirectory()
    >>> soundfile.write(f"{tmp.name}/rec1.flac", np.zeros(16000, np.float32), 8000)
    >>> with open(f"{tmp.name}/wav.scp", "w") as f:
    ...     _ = f.write(f"rec1 {tmp.name}/rec1.flac\\n")
    >>> with open(f"{tmp.name}/segments", "w") as f:
    ...     _ = f.write("rec1-a rec1 0.0 0.5\\nrec1-b rec1 1.5 -1\\n")
    >>> pipe = IterableWrapper([f"{tmp.name}/segments"]).open_files(mode="b").parse_scp()
    >>> [(s["key"], s["audio"].shape, s["recording"])
    ...  for s in pipe.load_segments(f"{tmp.name}/wav.scp")]
    [('rec1-a', (4000,), 'rec1'), ('rec1-b', (4000,), 'rec1')]
    >>> tmp.cleanup()
    """

    def __init__(
        self,
        source_datapipe: IterDataPipe,
        wav_scp: str | os.PathLike,
        *,
        root: str | os.PathLike | None = None,
        allow_commands: bool = False,
        max_overshoot: float = 0.5,
        on_error: str = "raise",
    ) -> None:
        if not isinstance(wav_scp, (str, os.PathLike)):
            raise TypeError(f"wav_scp must be the path of a wav.scp file, got {wav_scp!r}")
        if root is not None and not isinstance(root, (str, os.PathLike)):
            raise TypeError(f"root must be a directory path or None, got {root!r}")
        if not isinstance(allow_commands, bool):
            raise TypeError(f"allow_commands must be a bool, got {allow_commands!r}")
        self.source_datapipe = source_datapipe
        self.wav_scp = os.fspath(wav_scp)
        self.root = None if root is None else os.fspath(root)
        if not max_overshoot >= 0:
            raise ValueError(f"max_overshoot must be >= 0 seconds, got {max_overshoot}")
        self.allow_commands = allow_commands
        self.max_overshoot = float(max_overshoot)
        self.on_error = check_on_error(on_error)
        self.diagnostics = Diagnostics("load_segments")

    def __iter__(self) -> Iterator[Sample]:
        self.diagnostics.reset()
        recordings = read_scp_table(
            self.wav_scp, on_error=self.on_error, diagnostics=self.diagnostics
        )
        yield from slice_segments(
            self.source_datapipe,
            recordings,
            root=self.root,
            allow_commands=self.allow_commands,
            on_error=self.on_error,
            diagnostics=self.diagnostics,
            table_name=self.wav_scp,
            max_overshoot=self.max_overshoot,
        )
        self.diagnostics.warn_if_skipped()

    def __len__(self) -> int:
        if self.on_error != "raise":
            raise TypeError(
                "load_segments(on_error='skip') has no length: skips are unknown ahead"
            )
        return len(self.source_datapipe)


SegmentLoader = SegmentLoaderIterDataPipe
