"""Where data comes from: shard and file patterns, and opening paths, URLs and commands.

Verbs:

- ``list_shards`` (:class:`ShardListerIterDataPipe`): brace and glob patterns such as
  ``data/{10_1000,1000_2000}/data-*.tar`` or ``data/10_1000/data-0000{0..9}.tar`` to a sorted
  list of paths or URLs (:func:`expand_patterns` is the plain function).
- ``open`` (:class:`StreamOpenerIterDataPipe`): paths, ``http(s)://`` URLs, object-storage
  URLs of any installed fsspec protocol (``s3://``, ``gs://``, ``az://``, ``hf://``...; read
  in retried, resumable range requests, :mod:`speechpipe.remote`) and, only when the caller
  opts in, ``pipe:`` shell commands to ``(name, binary stream)`` pairs, the element shape that
  torch's ``open_files`` yields, so every parser accepts either.

Reading what was opened, for the line-based parsers (``parse_scp``, ``parse_manifest``):
:func:`check_path_stream` checks a ``(path, stream)`` element and :func:`iter_text_lines`
numbers and decodes the lines of a binary or text stream (gzipped or not), naming the file and
line of any that is not UTF-8.

Each stream is closed by the opener itself when the consumer asks for the next element (or
stops iterating): a consumer must finish with a stream before advancing. Nothing is closed
in ``__del__``.
"""

from __future__ import annotations

import codecs
import glob
import gzip
import io
import os
import shlex
import subprocess
import tempfile
import urllib.error
import urllib.request
import zlib
from http.client import HTTPException
from typing import IO, Any, BinaryIO, Iterable, Iterator

import braceexpand

from ...errors import DataError, MissingDataError, UnsafeInputError
from ...index import ShardIndex
from ...remote import RemoteOptions, is_remote, open_remote, remote_glob
from .._core import functional_datapipe, IterDataPipe
from ...index import is_folder_url
from ...remote import ProgressDeadline
from ...remote import http_request
from ...remote import open_http

__all__ = [
    "ShardListerIterDataPipe",
    "StreamOpenerIterDataPipe",
    "check_path_stream",
    "expand_patterns",
    "is_url",
    "iter_text_lines",
    "open_stream",
]

_URL_PREFIXES = ("http://", "https://")
_PIPE_PREFIX = "pipe:"
_GLOB_CHARS = frozenset("*?[")


def is_url(name: str) -> bool:
    """True for URLs: ``http(s)://`` and any other ``scheme://`` (``s3://``, ``gs://``...).

    >>> is_url("https://host/data-00001.tar"), is_url("s3://b/a.tar"), is_url("data/a.tar")
    (True, True, False)
    """
    return is_remote(name)


def expand_patterns(patterns: str | os.PathLike | Iterable[str | os.PathLike], *,
                    remote: RemoteOptions | None = None) -> list[str]:
    """Expand brace and glob patterns to a sorted list of paths or URLs.

    Braces are expanded first (``{a,b}``, ``{0..9}``, ``{00..15}``), then each local result
    with ``*``, ``?`` or ``[`` is globbed; a result without them must exist. A local
    ``*.list`` file stands for the shards it lists, one per line (:func:`read_shard_list`:
    WeNet's ``data.list``). A folder written
    by ``pack`` stands for its shards, as its index lists them -- every length group's when
    it holds group folders (:meth:`~speechpipe.index.ShardIndex.read`), so that files left
    beside them by another pack are never read; the same for such a folder in a bucket
    (``s3://bucket/corpus/shards``: a URL ending in ``/`` or whose last part has no dot). An
    object-storage URL (``s3://bucket/corpus/data-*.tar``) is globbed by listing the bucket;
    a shard URL without glob characters is kept unchecked (opening it says if it is
    missing). ``http(s)://`` URLs and ``pipe:`` commands are brace-expanded only. ``~`` is
    expanded.

    Args:
        patterns: one pattern or several.
        remote: how object storage is reached (:class:`~speechpipe.remote.RemoteOptions`:
            ``storage_options`` such as ``endpoint_url``); ``None``: the defaults.

    Returns:
        Every match of every pattern, sorted. Repeats are kept (naming a shard twice is a way
        to oversample it).

    Raises:
        MissingDataError: a pattern (or one of its brace expansions) matched nothing; the
            message shows the pattern.

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> for g in ("10_1000", "1000_2000"):
    ...     (d / g).mkdir()
    ...     for i in range(3):
    ...         _ = (d / g / f"data-{i:05d}.tar").write_bytes(b"")
    >>> [p[len(str(d)):] for p in expand_patterns(f"{d}/{{10_1000,1000_2000}}/data-*.tar")]
    ['/1000_2000/data-00000.tar', '/1000_2000/data-00001.tar', '/1000_2000/data-00002.tar', '/10_1000/data-00000.tar', '/10_1000/data-00001.tar', '/10_1000/data-00002.tar']
    >>> len(expand_patterns(f"{d}/10_1000/data-0000{{0..2}}.tar"))
    3
    """
    if isinstance(patterns, (str, os.PathLike)):
        patterns = [patterns]
    found: list[str] = []
    for pattern in patterns:
        pattern = os.fspath(pattern)
        if not isinstance(pattern, str) or not pattern:
            raise ValueError(f"a pattern must be a non-empty string, got {pattern!r}")
        for name in braceexpand.braceexpand(pattern):
            found.extend(_expand_one(name, pattern, remote))
    return sorted(found)


def _expand_one(name: str, pattern: str, remote: RemoteOptions | None) -> list[str]:
    if is_url(name) and not name.startswith(_URL_PREFIXES) and _GLOB_CHARS.intersection(name):
        matches = remote_glob(name, remote)
        if not matches:
            where = pattern if name == pattern else f"{pattern} (expanded to {name})"
            raise MissingDataError("no object matches this pattern", source=where)
        return matches
    if is_folder_url(name):  # pack's output folder in a bucket: as a local one
        return ShardIndex.read(name, remote=remote).paths()
    if is_url(name) or name.startswith(_PIPE_PREFIX):
        return [name]
    name = os.path.expanduser(name)
    if _GLOB_CHARS.intersection(name):
        matches = glob.glob(name)
        if not matches:
            where = pattern if name == pattern else f"{pattern} (expanded to {name})"
            raise MissingDataError("no file matches this pattern", source=where)
        return matches
    if not os.path.exists(name):
        where = pattern if name == pattern else f"{pattern} (expanded to {name})"
        raise MissingDataError("no such file", source=where)
    if os.path.isdir(name):
        return ShardIndex.read(name).paths()
    if name.endswith(SHARD_LIST_SUFFIX):
        return read_shard_list(name)
    return [name]


#: A local file named ``*.list`` is a list of shards, one per line (WeNet's ``data.list``).
SHARD_LIST_SUFFIX = ".list"


def read_shard_list(path: str) -> list[str]:
    """The shards a list file names, one path or URL per line (WeNet's ``data.list`` in
    shard mode); blank lines and ``#`` comments are skipped, relative paths are relative to
    the list's folder. What it names is opened only when read, like any shard.

    Raises:
        DataError: a line holding a JSON sample (a raw-mode ``data.list``: samples, not
            shards), naming the file and the line.

    >>> import os, tempfile
    >>> d = tempfile.mkdtemp(); p = os.path.join(d, "data.list")
    >>> with open(p, "w") as f:
    ...     _ = f.write("shards/a.tar\\n\\n# b\\nhttps://h/b.tar\\n")
    >>> [s[len(d):] if s.startswith(d) else s for s in read_shard_list(p)]
    ['/shards/a.tar', 'https://h/b.tar']
    """
    folder = os.path.dirname(os.path.abspath(path))
    out = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if line.startswith("{"):
                raise DataError("this list holds JSON samples (a raw-mode WeNet data.list), "
                                "not shards: read it as a manifest (read_manifest), or pack "
                                "it into shards", source=path, line=number)
            if is_url(line) or line.startswith(_PIPE_PREFIX) or os.path.isabs(line):
                out.append(line)
            else:
                out.append(os.path.join(folder, line))
    return out


@functional_datapipe("list_shards")
class ShardListerIterDataPipe(IterDataPipe[str]):
    """Expand brace/glob patterns to sorted paths or URLs (functional name: ``list_shards``).

    Consumes patterns (a string, a list of strings, or a pipe yielding strings) and yields the
    sorted matches of each pattern (:func:`expand_patterns`). Nothing is listed until
    iteration starts, so the pipe can be built before the files exist.

    Args:
        patterns: a pattern, a list of patterns, or an ``IterDataPipe`` of patterns.
        remote: how object-storage URLs are listed (:class:`~speechpipe.remote.RemoteOptions`).

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> for i in range(3):
    ...     _ = (d / f"data-{i:05d}.tar").write_bytes(b"")
    >>> [p[-14:] for p in ShardLister(f"{d}/data-0000{{0..2}}.tar")]
    ['data-00000.tar', 'data-00001.tar', 'data-00002.tar']
    """

    def __init__(self, patterns: str | Iterable[str] | IterDataPipe, *,
                 remote: RemoteOptions | None = None) -> None:
        if isinstance(patterns, (str, os.PathLike)):
            patterns = [os.fspath(patterns)]
        elif not isinstance(patterns, IterDataPipe):
            patterns = list(patterns)
            for p in patterns:
                if not isinstance(p, (str, os.PathLike)):
                    raise TypeError(f"patterns must be strings, got {p!r}")
        if remote is not None and not isinstance(remote, RemoteOptions):
            raise TypeError(f"remote must be a RemoteOptions or None, got {remote!r}")
        self.patterns = patterns
        self.remote = remote

    def __iter__(self) -> Iterator[str]:
        for pattern in self.patterns:
            yield from expand_patterns(pattern, remote=self.remote)


ShardLister = ShardListerIterDataPipe


class _CheckedStream(io.RawIOBase):
    """A read-only wrapper that turns transport failures into errors naming the source."""

    def __init__(self, raw, name: str, timeout: float | None = None) -> None:
        super().__init__()
        self._raw = raw
        self.name = name
        self._deadline = None if timeout is None else ProgressDeadline(timeout, name)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        try:
            if self._deadline is None:
                n = self._raw.readinto(buffer)
            else:  # what one socket read brings, so the deadline is checked between reads
                view = memoryview(buffer).cast("B")
                data = self._raw.read1(len(view))
                n = len(data)
                view[:n] = data
                self._deadline.check(n)
        except (HTTPException, OSError) as exc:
            raise DataError(f"read failed: {exc!r}", source=self.name) from exc
        if n == 0 and len(buffer) > 0:
            # http.client reports a connection closed before Content-Length bytes arrived as
            # a plain end of data; the bytes still owed tell the difference.
            missing = getattr(self._raw, "length", None)
            if missing:
                raise DataError(
                    f"transfer cut short: the server closed the connection with {missing} "
                    "bytes of the announced Content-Length still to come",
                    source=self.name,
                )
        return n

    def close(self) -> None:
        if not self.closed:
            try:
                self._raw.close()
            finally:
                super().close()


class _CommandStream(io.RawIOBase):
    """stdout of a ``pipe:`` command; a non-zero exit after a full read is an error."""

    def __init__(self, command: str, name: str) -> None:
        super().__init__()
        self.name = name
        self.command = command
        self._stderr = tempfile.TemporaryFile()
        self._proc = subprocess.Popen(
            command, shell=True, stdout=subprocess.PIPE, stderr=self._stderr
        )
        self._eof = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = self._proc.stdout.readinto(buffer)
        if n == 0 and len(buffer) > 0:
            self._eof = True
        return n

    def close(self) -> None:
        if self.closed:
            return
        try:
            self._proc.stdout.close()
            if self._eof:
                code = self._proc.wait()
                if code != 0:
                    self._stderr.seek(0)
                    tail = self._stderr.read()[-500:].decode("utf-8", "replace").strip()
                    raise DataError(
                        f"command exited with status {code}: {tail or '(no stderr)'}",
                        source=self.name,
                    )
            else:  # the consumer stopped early: end the command quietly
                self._proc.kill()
                self._proc.wait()
        finally:
            self._stderr.close()
            super().close()


def open_stream(
    name: str, *, allow_pipes: bool = False, timeout: float = 60.0, buffer_size: int = 1 << 20,
    remote: RemoteOptions | None = None,
) -> BinaryIO:
    """Open a path, URL or (opt-in) ``pipe:`` command for binary reading.

    The caller owns the stream and must close it. Errors name the path or URL:
    :class:`MissingDataError` for an absent file or object, an HTTP 404/410 or an unreachable
    host, :class:`DataError` for another HTTP error status, a transfer cut short while reading
    or an object-storage range request that failed ``remote.retries`` times,
    :class:`UnsafeInputError` for ``pipe:`` without ``allow_pipes=True``. Object-storage URLs
    (``s3://``...) are read as :mod:`speechpipe.remote` says, with ``remote``'s options
    (default: ``RemoteOptions(timeout=timeout)``).

    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "x.bin")
    >>> with open(path, "wb") as f:
    ...     _ = f.write(b"abc")
    >>> with open_stream(path) as f:
    ...     f.read()
    b'abc'
    """
    if name.startswith(_PIPE_PREFIX):
        if not allow_pipes:
            raise UnsafeInputError(
                "refusing to run a shell command; pass allow_pipes=True to open 'pipe:' names",
                source=name,
            )
        command = name[len(_PIPE_PREFIX):]
        if not shlex.split(command):
            raise ValueError(f"empty command in {name!r}")
        return io.BufferedReader(_CommandStream(command, name), buffer_size)
    if is_url(name) and not name.startswith(_URL_PREFIXES):
        return open_remote(name, remote or RemoteOptions(timeout=timeout))
    if is_url(name):
        try:
            response = open_http(http_request(name), timeout)
        except urllib.error.HTTPError as exc:
            exc.close()
            if exc.code in (404, 410):
                raise MissingDataError(f"HTTP {exc.code} {exc.reason}", source=name) from exc
            raise DataError(f"HTTP {exc.code} {exc.reason}", source=name) from exc
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, TimeoutError):  # the server is there but does not answer
                raise DataError(f"no answer within the {timeout:g} s timeout: the server is "
                                "down or overloaded (not a missing file)", source=name) from exc
            raise MissingDataError(f"cannot reach: {reason}", source=name) from exc
        return io.BufferedReader(_CheckedStream(response, name, timeout), buffer_size)
    try:
        return open(name, "rb", buffering=buffer_size)
    except FileNotFoundError as exc:
        raise MissingDataError("no such file", source=name) from exc
    except IsADirectoryError as exc:
        raise DataError("is a directory, not a file", source=name) from exc


@functional_datapipe("open")
class StreamOpenerIterDataPipe(IterDataPipe[tuple[str, BinaryIO]]):
    """Open paths, URLs and opt-in commands as binary streams (functional name: ``open``).

    Consumes names (local paths, ``http://``/``https://`` URLs, ``pipe:<command>``) and yields
    ``(name, binary stream)`` pairs, like torch's ``open_files(mode="b")`` but also for URLs.
    Each stream is opened when its element is produced and closed when the consumer asks for
    the next element or stops iterating: finish with a stream before advancing.

    Args:
        source_datapipe: pipe of names (e.g. from ``list_shards``).
        allow_pipes: allow ``pipe:`` names, which run a shell command and read its stdout; a
            non-zero exit status after the whole output was read raises :class:`DataError`.
        timeout: seconds to wait for an HTTP server to answer, and the most each MiB of a
            transfer may take (a server that sends a byte now and then is given up on).
        buffer_size: read buffer in bytes.
        remote: how object-storage URLs are read (:class:`~speechpipe.remote.RemoteOptions`:
            ``storage_options``, retries, block size, timeout); ``None``: the defaults with
            ``timeout``.

    >>> import tempfile, os
    >>> from speechpipe import IterableWrapper
    >>> path = os.path.join(tempfile.mkdtemp(), "x.bin")
    >>> with open(path, "wb") as f:
    ...     _ = f.write(b"abc")
    >>> [(os.path.basename(n), s.read()) for n, s in IterableWrapper([path]).open()]
    [('x.bin', b'abc')]
    """

    holds_nothing = True  # item by item: nothing kept between two yields

    def __init__(
        self,
        source_datapipe: IterDataPipe[str],
        *,
        allow_pipes: bool = False,
        timeout: float = 60.0,
        buffer_size: int = 1 << 20,
        remote: RemoteOptions | None = None,
    ) -> None:
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        if buffer_size <= 0:
            raise ValueError(f"buffer_size must be > 0 bytes, got {buffer_size}")
        self.source_datapipe = source_datapipe
        self.allow_pipes = bool(allow_pipes)
        self.timeout = timeout
        self.buffer_size = buffer_size
        if remote is not None and not isinstance(remote, RemoteOptions):
            raise TypeError(f"remote must be a RemoteOptions or None, got {remote!r}")
        self.remote = remote

    def __iter__(self) -> Iterator[tuple[str, BinaryIO]]:
        for name in self.source_datapipe:
            if not isinstance(name, (str, os.PathLike)):
                raise TypeError(f"open expects path or URL strings, got {name!r}")
            name = os.fspath(name)
            stream = open_stream(
                name,
                allow_pipes=self.allow_pipes,
                timeout=self.timeout,
                buffer_size=self.buffer_size,
                remote=self.remote,
            )
            try:
                yield name, stream
            finally:
                stream.close()

    def __len__(self) -> int:
        return len(self.source_datapipe)


StreamOpener = StreamOpenerIterDataPipe


# --------------------------------------------------------------------------- reading lines


def check_path_stream(item: Any, verb: str) -> tuple[str, IO]:
    """Check that a pipe element is a ``(path, stream)`` pair; return it with a ``str`` path.

    The element shape of torch's ``open_files`` and speechpipe's ``open``, which the parsers
    consume.

    Args:
        item: the element.
        verb: functional name of the consuming pipe, for the error message.

    Raises:
        TypeError: ``item`` is not a ``(path, stream)`` pair; the message names ``verb`` and
            shows how to open files first.

    >>> import io, pathlib
    >>> check_path_stream((pathlib.Path("data/text"), io.BytesIO()), "parse_scp")[0]
    'data/text'
    >>> check_path_stream("data/text", "parse_scp")
    Traceback (most recent call last):
    TypeError: parse_scp consumes (path, stream) pairs ..., got 'data/text'; e.g. ...
    """
    if (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], (str, os.PathLike))
            and hasattr(item[1], "__iter__") and not isinstance(item[1], (str, bytes))):
        return os.fspath(item[0]), item[1]
    raise TypeError(
        f"{verb} consumes (path, stream) pairs as yielded by open_files(mode='b') or open, "
        f"got {item!r}; e.g. IterableWrapper([path]).open_files(mode='b').{verb}()"
    )


def _bypass_text_layer(stream: Any) -> Any:
    """What to iterate for the lines of ``stream``: the stream itself or its binary buffer.

    torch's ``StreamWrapper`` is unwrapped. A strict UTF-8 text stream is replaced by its
    binary buffer, which :func:`iter_text_lines` decodes line by line.
    """
    inner = getattr(stream, "file_obj", stream)  # torch's StreamWrapper
    if not isinstance(inner, io.TextIOBase):
        return inner
    buffer = getattr(inner, "buffer", None)
    try:
        utf8 = codecs.lookup(getattr(inner, "encoding", None) or "").name == "utf-8"
    except LookupError:
        utf8 = False
    if buffer is not None and utf8 and getattr(inner, "errors", "strict") == "strict":
        return buffer
    return inner


def _utf8_line(raw: bytes | bytearray, number: int, source: str) -> str | DataError:
    """A line's text, or the ``DataError`` naming it when it is not UTF-8."""
    try:
        return bytes(raw).decode("utf-8")
    except UnicodeDecodeError as exc:
        error = DataError(f"not valid UTF-8 ({exc.reason} at byte {exc.start + 1} of the line)",
                          source=source, line=number)
        error.__cause__ = exc
        return error


def iter_text_lines(
    lines: Iterable[str | bytes], *, source: str, gzipped: bool = False
) -> Iterator[tuple[int, str | DataError]]:
    """Number and decode the lines of a binary or text stream, naming any bad line.

    Yields ``(line number, text)`` per line, numbered from 1, line ends kept. ``bytes`` lines
    are decoded as UTF-8 one at a time, so a line that is not UTF-8 is named exactly: in its
    place comes ``(line number, DataError)`` and iteration goes on with the next line; the
    caller raises or skips it. A strict UTF-8 text stream handed over unread (``open(path)``,
    torch's ``open_files(mode="r")``, whose ``StreamWrapper`` is unwrapped) is read through
    its binary buffer for that reason. Any other text stream decodes itself, and a failure
    there ends the stream.

    Args:
        lines: a binary or text stream, or any iterable of ``str``/``bytes`` lines. The
            caller owns it and closes it.
        source: file name used in errors.
        gzipped: ``lines`` is a gzip-compressed binary stream.

    Raises:
        DataError: the stream cannot be read on: a truncated or corrupt gzip stream, a read
            failure, a text stream that failed to decode itself, a gzipped text stream. The
            lines before it have been yielded.
        TypeError: ``lines`` is one ``str`` or ``bytes``, or yields something else.

    >>> import io
    >>> stream = io.BytesIO(b"u1 a\\nu2 \\xff\\nu3 c\\n")
    >>> for number, text in iter_text_lines(stream, source="text"):
    ...     print(number, repr(text) if isinstance(text, str) else f"error: {text}")
    1 'u1 a\\n'
    2 error: text:2: not valid UTF-8 (invalid start byte at byte 4 of the line)
    3 'u3 c\\n'
    """
    if isinstance(lines, (str, bytes, bytearray)):
        raise TypeError(
            "lines must be an iterable of lines (a file object or a list), not one "
            f"{type(lines).__name__}; use .splitlines() first"
        )
    lines = _bypass_text_layer(lines)
    if gzipped:
        if isinstance(lines, io.TextIOBase):
            raise DataError("a gzipped file must be opened in binary mode", source=source)
        lines = gzip.GzipFile(fileobj=lines, mode="rb")
    number = 0
    iterator = iter(lines)
    try:
        while True:
            try:
                raw = next(iterator)
            except StopIteration:
                return
            except UnicodeDecodeError as exc:  # a text stream's own decoding: it cannot resume
                raise DataError(
                    f"not valid {exc.encoding} text at or after this line ({exc.reason}); "
                    "open the file in binary mode (open_files(mode='b')) to have each line "
                    "decoded as UTF-8 and the bad one named",
                    source=source,
                    line=number + 1,
                ) from exc
            except (EOFError, OSError, zlib.error) as exc:
                what = "truncated or corrupt gzip stream" if gzipped else "read failed"
                raise DataError(f"{what} after line {number}: {exc}", source=source) from exc
            number += 1
            if isinstance(raw, str):
                yield number, raw
            elif isinstance(raw, (bytes, bytearray)):
                yield number, _utf8_line(raw, number, source)
            else:
                raise TypeError(f"{source}:{number}: lines must be str or bytes, got {raw!r}")
    finally:
        if gzipped:
            lines.close()  # the GzipFile only: the caller's stream stays open
