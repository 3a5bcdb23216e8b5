"""Kaldi tables: ``scp``/``text`` files parsed into ``(key, value)`` entries.

A Kaldi table is one ``<key> <value>`` line each, sorted by key with ``LC_ALL=C sort``.
``parse_scp`` (:class:`ScpParserIterDataPipe`, plain function :func:`parse_scp_lines`) turns
``(path, stream)`` pairs from torch's ``open_files`` or speechpipe's ``open`` into one
:class:`ScpEntry` ``(key, value)`` per line, which remembers its file and line so that every
later error can name them; :func:`read_scp_table` reads a whole table into a dict for
lookups. Resolving the values (matrices, audio, segments) is :mod:`speechpipe.pipes.kaldi._loaders`'s
job.
"""

from __future__ import annotations

import os
import re
import unicodedata
from typing import Any, Iterable, Iterator, NamedTuple

from ...diagnostics import Diagnostics, check_on_error
from ...errors import DataError, MissingDataError
from .._core import functional_datapipe, IterDataPipe
from ...remote import RemoteOptions, is_remote
from ..sources import check_path_stream, iter_text_lines, open_stream

__all__ = [
    "ScpEntry",
    "ScpParser",
    "ScpParserIterDataPipe",
    "parse_scp_lines",
    "read_scp_table",
]

# Kaldi splits on ASCII whitespace only (C locale isspace); Python's str.split() would also
# split on U+00A0, U+3000 ... which may occur inside a transcript.
WHITESPACE = " \t\n\r\v\f"
SPLIT = re.compile(r"[ \t\n\r\v\f]+")


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


class Location(NamedTuple):
    """Location of an entry, spread into error constructors with ``**where._asdict()``."""

    source: str | None
    line: int | None
    key: str | None


def location(entry: Any) -> Location:
    key = entry[0] if isinstance(entry[0], str) else None
    return Location(getattr(entry, "source", None), getattr(entry, "line", None), key)


def table_error(cls: type, reason: str, where: Location) -> Exception:
    return cls(reason, source=where.source, line=where.line, key=where.key)


def check_pair(entry: Any, stage: str) -> None:
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
    :func:`~speechpipe.pipes.sources._files.iter_text_lines`: ``bytes`` lines (and a UTF-8 text
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
    readable = _readable_lines(lines, source, on_error, diagnostics)
    try:
        for number, stripped in readable:
            problem = _line_problem(stripped, allow_empty)
            if problem is not None:
                diagnostics.handle(
                    on_error, DataError(problem, source=source, line=number), "malformed line"
                )
                continue
            parts = SPLIT.split(stripped, maxsplit=1)
            key = parts[0]
            value = parts[1] if len(parts) == 2 else ""
            refused = _refused_key(key, number, seen, previous if check_sorted else None, source)
            if refused is not None:
                diagnostics.handle(on_error, *refused)
                continue
            seen[key] = number
            previous = key
            yield ScpEntry(key, value, source=source, line=number)
    finally:
        readable.close()


def _readable_lines(
    lines: Iterable[str | bytes], source: str, on_error: str, diagnostics: Diagnostics
) -> Iterator[tuple[int, str]]:
    """``(line number, stripped text)`` of the non-blank lines that decode.

    An undecodable line is raised or skipped (``on_error``); a stream that cannot be read on
    is raised, or under ``"skip"`` ends the lines.
    """
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
            stripped = text.strip(WHITESPACE)
            if stripped:
                yield number, stripped
    finally:
        numbered.close()


def _refused_key(
    key: str, number: int, seen: dict[str, int], previous: str | None, source: str
) -> tuple[DataError, str] | None:
    """``(error, diagnostics reason)`` for a key already ``seen`` (key -> line) or, when a
    ``previous`` key is given, out of ``LC_ALL=C sort`` order after it; None if the key is fine.
    """
    if key in seen:
        return DataError(
            f"duplicate key (first on line {seen[key]})", source=source, line=number, key=key
        ), "duplicate key"
    if previous is not None and key < previous:
        # str order is code point order, which is UTF-8 byte order: LC_ALL=C sort's.
        return DataError(
            f"key is out of order after {previous!r}: Kaldi tables must be sorted "
            "with 'LC_ALL=C sort' (or pass check_sorted=False)",
            source=source,
            line=number,
            key=key,
        ), "unsorted key"
    return None


def _line_problem(stripped: str, allow_empty: bool) -> str | None:
    """Why a non-blank, stripped line is malformed, or None."""
    if "\x00" in stripped:
        return "line contains a NUL byte"
    key = SPLIT.split(stripped, maxsplit=1)[0]
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
    >>> from speechpipe import IterableWrapper
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
    remote: RemoteOptions | None = None,
) -> dict[str, ScpEntry]:
    """Read a whole Kaldi table into ``{key: ScpEntry}`` (for lookups such as ``wav.scp``).

    Args:
        path: the table file, or its object-storage URL (``s3://bucket/data/train/text``).
        allow_empty, on_error, diagnostics: as in :func:`parse_scp_lines`.
        remote: how a URL is read (:class:`~speechpipe.remote.RemoteOptions`).

    Raises:
        MissingDataError: the file or object does not exist.
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
        stream = open_stream(path, remote=remote) if is_remote(path) else open(path, "rb")
    except FileNotFoundError as exc:  # a MissingDataError for a remote object
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

