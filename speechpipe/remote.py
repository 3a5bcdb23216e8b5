"""Object storage through fsspec: ``s3://``, ``gs://``, ``az://``, ``hf://`` and any other
fsspec protocol whose package is installed (``pip install speechpipe[s3]`` for S3).

A remote file is read in **range requests** of ``block_size`` bytes, block by block, the next
block fetched by a thread while the current one is read: at most two blocks are held per open
stream (the bounded buffer) whatever the file's size, one request in flight.
Each request is retried with exponential backoff on a transient failure -- an HTTP 5xx
(503 "slow down" included), a connection reset or dropped mid-body, a timeout -- and a block
that arrives short is continued with a range request from the byte where it stopped: a dropped
connection never restarts the file and never returns it short. A request that still fails
after ``retries`` attempts raises :class:`~speechpipe.errors.DataError` naming the URL, the
byte range and the number of attempts; an absent object raises
:class:`~speechpipe.errors.MissingDataError` at once (not retried). An S3 object is
pinned when it is opened: each range request asks for the ETag (and, on a versioned bucket,
the version) seen then (``If-Match``), so an object overwritten while it is read raises a
:class:`~speechpipe.errors.DataError` saying so, never a mix of two versions. The storage
library may retry first on its own (s3fs retries S3's "slow down" and bodies cut
mid-transfer; botocore retried 5xx answers before speechpipe set its ``config_kwargs``
``retries={"total_max_attempts": 1}`` and ``connect_timeout``/``read_timeout`` to
``timeout``, unless ``storage_options`` give their own): these attempts wrap its. Every
call -- the size request, each range request, a listing -- is given up on after ``timeout``
seconds, whatever the library does meanwhile.

Credentials come from where the storage library looks for them (for S3, botocore's chain:
``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, ``~/.aws/credentials`` and its profiles, an
instance role); ``storage_options`` of :class:`RemoteOptions` go to the file system as they
are (``endpoint_url``, ``profile``, ``key``/``secret``, ``anon``...). Their values are never
put in an error message or a ``repr``.

Used by :func:`speechpipe.pipes.sources._files.open_stream` (and so by ``open``, ``read_shard``,
``sharded_shuffle``, the manifest parsers) and by :class:`speechpipe.index.ShardIndex` for an
index kept in the bucket.
"""

from __future__ import annotations

import io
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

from .errors import DataError, MissingDataError, redact

__all__ = ["ProgressDeadline", "RemoteOptions", "http_request", "is_remote", "join_url",
           "object_version", "open_http", "open_remote", "read_remote_bytes",
           "remote_filesystem", "remote_glob", "remote_info"]

_SCHEME = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]+)://")
_INSTALL = "pip install 'speechpipe[s3]' (fsspec and s3fs), or the fsspec package of {0}://"


def is_remote(name: str) -> bool:
    """True for a ``scheme://`` URL (``s3://``, ``gs://``, ``http://``...); a Windows drive
    (``C:/``) or a local path is not one.

    >>> is_remote("s3://bucket/data-00000.tar"), is_remote("data/a.tar")
    (True, False)
    """
    return "://" in name and bool(_SCHEME.match(name)) and not name.startswith("file://")


def join_url(folder: str, name: str) -> str:
    """``folder`` + ``/`` + ``name`` for URLs.

    >>> join_url("s3://bucket/corpus/", "data-00000.tar")
    's3://bucket/corpus/data-00000.tar'
    """
    return folder.rstrip("/") + "/" + name


class ProgressDeadline:
    """The overall deadline of an HTTP transfer, beyond the socket's per-read timeout: each
    ``window`` bytes of the body (1 MiB) must arrive within ``timeout`` seconds, so a server
    that sends a byte now and then -- never silent long enough for a socket timeout -- is
    given up on after ``timeout`` seconds, while a long download at a sane rate is not.

    >>> d = ProgressDeadline(60.0, "http://h/a.tar")
    >>> d.check(4096)  # in time: nothing happens
    """

    def __init__(self, timeout: float, source: str, window: int = 1 << 20) -> None:
        self.timeout, self.source, self.window = timeout, source, window
        self._start, self._got = time.monotonic(), 0

    def check(self, n: int) -> None:
        """Count ``n`` bytes just received; raise when the current window took too long."""
        self._got += n
        elapsed = time.monotonic() - self._start
        if self._got >= self.window:
            self._start, self._got = time.monotonic(), 0
        elif elapsed > self.timeout:
            raise DataError(
                f"the server sent {self._got} bytes in {elapsed:.1f} s, under "
                f"{self.window >> 10} KiB in the {self.timeout:g} s timeout: stalled or far too "
                "slow (the timeout bounds each MiB of the transfer, not only each socket read)",
                source=self.source)


def open_http(request, timeout: float):
    """``urllib.request.urlopen(request, timeout=timeout)`` whose answer -- the status line and
    the headers -- must arrive within ``timeout`` seconds in all (urllib bounds each socket
    read only, so a server sending a header byte now and then would hold it forever): past
    the deadline the connection is shut and ``TimeoutError`` raised. The body's deadline is
    :class:`ProgressDeadline`'s."""
    import http.client
    import socket
    import threading
    import urllib.request

    sockets: list = []
    fired = threading.Event()

    def remember(connection_class):
        class Connection(connection_class):
            def connect(self):
                super().connect()
                sockets.append(self.sock)
        return Connection

    class HTTP(urllib.request.HTTPHandler):
        def http_open(self, req):
            return self.do_open(remember(http.client.HTTPConnection), req)

    class HTTPS(urllib.request.HTTPSHandler):
        def https_open(self, req):
            return self.do_open(remember(http.client.HTTPSConnection), req,
                                context=self._context)

    def shut() -> None:
        fired.set()
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    timer = threading.Timer(timeout, shut)
    timer.daemon = True
    timer.start()
    try:
        return urllib.request.build_opener(HTTP, HTTPS).open(request, timeout=timeout)
    except Exception:
        if fired.is_set():
            raise TimeoutError(f"no complete answer within {timeout:g} s") from None
        raise
    finally:
        timer.cancel()


def http_request(url: str, headers: Mapping[str, str] | None = None):
    """A ``urllib.request.Request`` for an ``http(s)://`` URL; credentials in its userinfo
    (``https://user:password@host/...``) become a Basic ``Authorization`` header rather than
    part of the host name (where urllib would fail on them and print them).

    >>> r = http_request("https://alice:pw@example.org:8080/a.tar")
    >>> r.full_url, r.get_header("Authorization")
    ('https://example.org:8080/a.tar', 'Basic YWxpY2U6cHc=')
    """
    import base64
    import urllib.parse
    import urllib.request

    parts = urllib.parse.urlsplit(url)
    headers = dict(headers or {})
    if "@" in parts.netloc:
        userinfo, _, host = parts.netloc.rpartition("@")
        user, _, password = userinfo.partition(":")
        token = f"{urllib.parse.unquote(user)}:{urllib.parse.unquote(password)}"
        headers["Authorization"] = "Basic " + base64.b64encode(token.encode()).decode("ascii")
        url = urllib.parse.urlunsplit(parts._replace(netloc=host))
    return urllib.request.Request(url, headers=headers)


@dataclass(frozen=True)
class RemoteOptions:
    """How remote (fsspec) files are read.

    Args:
        storage_options: keyword arguments of the fsspec file system (for S3, s3fs's:
            ``endpoint_url``, ``profile``, ``key``, ``secret``, ``anon``, ``client_kwargs``,
            ``config_kwargs``...). ``None``: the library's defaults, credentials from the
            environment and config files. Never shown in messages.
        block_size: bytes per range request, and the most a stream holds in memory.
        retries: attempts per range request before giving up (1: no retry).
        backoff: seconds before the first retry, doubled for each next one (at most 30 s).
        timeout: seconds one request (a size request, a range request) may take in all
            before it counts as a failed attempt (for S3 also botocore's connect and read
            timeouts, unless ``storage_options["config_kwargs"]`` set them).
        cache_dir: the node-local folder where the mapped tables of shard indexes read from
            object storage are kept, one per index and version, shared by every process on
            the node (:meth:`speechpipe.index.ShardIndex.read`); ``None``: ``$SPEECHPIPE_CACHE_DIR``,
            else ``$XDG_CACHE_HOME/speechpipe``, else a folder of this user's in the temporary
            folder (:func:`speechpipe.node_cache.index_cache_dir`).

    >>> RemoteOptions(storage_options={"key": "AKIA", "secret": "hush"}, retries=3)
    RemoteOptions(storage_options={'key': '***', 'secret': '***'}, block_size=8388608, \
retries=3, backoff=0.5, timeout=60.0)
    >>> RemoteOptions(retries=0)
    Traceback (most recent call last):
    ...
    ValueError: retries must be an int >= 1, got 0
    """

    storage_options: Mapping[str, Any] | None = field(default=None, repr=False)
    block_size: int = 8 << 20
    retries: int = 5
    backoff: float = 0.5
    timeout: float = 60.0
    cache_dir: str | None = field(default=None, repr=False)  # where, not what: no fingerprint

    def __post_init__(self) -> None:
        if self.storage_options is not None and not isinstance(self.storage_options, Mapping):
            raise TypeError("storage_options must be a mapping or None, got "
                            f"{type(self.storage_options).__name__}")
        for name, low in (("block_size", 1), ("retries", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        if not isinstance(self.backoff, (int, float)) or self.backoff < 0:
            raise ValueError(f"backoff must be >= 0 seconds, got {self.backoff!r}")
        if not isinstance(self.timeout, (int, float)) or self.timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {self.timeout!r}")
        if self.cache_dir is not None:
            if not isinstance(self.cache_dir, (str, os.PathLike)) or not os.fspath(self.cache_dir):
                raise TypeError(f"cache_dir must be a folder path or None, got "
                                f"{self.cache_dir!r}")
            object.__setattr__(self, "cache_dir", os.fspath(self.cache_dir))

    def __repr__(self) -> str:
        hidden = (None if self.storage_options is None
                  else {k: "***" for k in self.storage_options})
        cache = "" if self.cache_dir is None else f", cache_dir={self.cache_dir!r}"
        return (f"RemoteOptions(storage_options={hidden}, block_size={self.block_size}, "
                f"retries={self.retries}, backoff={self.backoff}, timeout={self.timeout}"
                f"{cache})")

    def secrets(self) -> list[str]:
        """Every string value of ``storage_options`` (nested ones too): what messages hide."""
        found: list[str] = []

        def walk(value: Any) -> None:
            if isinstance(value, str) and len(value) >= 4:
                found.append(value)
            elif isinstance(value, Mapping):
                for v in value.values():
                    walk(v)
            elif isinstance(value, (list, tuple)):
                for v in value:
                    walk(v)

        walk(dict(self.storage_options or {}))
        return found


_DEFAULT = RemoteOptions()
_SMALL_READS = 1 << 16  # the buffer of small reads (tar headers) above the block
_MAX_BACKOFF = 30.0


def _options(options: RemoteOptions | None) -> RemoteOptions:
    if options is None:
        return _DEFAULT
    if not isinstance(options, RemoteOptions):
        raise TypeError(f"remote must be a RemoteOptions or None, got {options!r}")
    return options


def _redact(text: str, options: RemoteOptions) -> str:
    for secret in options.secrets():
        text = text.replace(secret, "***")
    return redact(text)


def _filesystem(url: str, options: RemoteOptions):
    """``(file system, path)`` for ``url``; the install line when its package is missing."""
    try:
        import fsspec
    except ImportError as exc:  # pragma: no cover - fsspec is a dependency of torch's stack
        raise ImportError(f"reading {url} needs fsspec: {_INSTALL.format('s3')}") from exc
    protocol = _SCHEME.match(url).group(1)
    kwargs = dict(options.storage_options or {})
    if protocol in ("s3", "s3a"):  # botocore: our deadline per attempt, our retries only
        config = dict(kwargs.get("config_kwargs") or {})
        config.setdefault("connect_timeout", options.timeout)
        config.setdefault("read_timeout", options.timeout)
        config.setdefault("retries", {"total_max_attempts": 1})
        kwargs["config_kwargs"] = config
    try:
        return fsspec.core.url_to_fs(url, **kwargs)
    except ImportError as exc:
        raise ImportError(f"reading {url} needs a package for {protocol}://: "
                          f"{_INSTALL.format(protocol)} ({exc})") from exc
    except ValueError as exc:
        raise ValueError(f"{redact(url)}: {_redact(str(exc), options)}") from None


def remote_filesystem(url: str, options: RemoteOptions | None = None):
    """``(fsspec file system, path)`` for ``url`` with ``options``' storage options (for
    writers: ``pack --out s3://...``); the install line when the protocol's package is
    missing."""
    return _filesystem(url, _options(options))


def _describe(exc: BaseException, options: RemoteOptions) -> str:
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return _redact(text, options)[:300]


class _RangeReader(io.RawIOBase):
    """A remote file read block by block in range requests of ``block_size`` bytes, retried
    with backoff and continued at the byte where a short or dropped transfer stopped. While
    one block is read, the next is fetched by a thread: at most two blocks are held, and one
    request is in flight at a time."""

    def __init__(self, fs, path: str, url: str, size: int, options: RemoteOptions,
                 pin: Mapping[str, str | None] | None = None) -> None:
        super().__init__()
        self._fs, self._path, self.name = fs, path, url
        self._size, self._options = size, options
        self._pin = pin or {}  # the object's ETag / VersionId when opened (S3)
        self._block, self._at = b"", 0  # the current block, and the read position in it
        self._next: int = 0  # offset of the next block
        self._ahead = None  # the next block's Future
        self._pool = None  # a one-thread executor, made at the first block

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def _fetch_block(self, start: int) -> bytes:
        return self._fetch(start, min(start + self._options.block_size, self._size))

    def _advance(self) -> bool:
        """Make the next block current (fetched ahead, or now); False at the end."""
        if self._next >= self._size:
            return False
        if self._ahead is None:
            block = self._fetch_block(self._next)
        else:
            ahead, self._ahead = self._ahead, None
            block = ahead.result()  # raises the fetch's error, here in the reader's thread
        self._block, self._at = block, 0
        self._next += len(block)
        if self._next < self._size:
            if self._pool is None:
                import concurrent.futures

                self._pool = concurrent.futures.ThreadPoolExecutor(1, "speechpipe-remote")
            self._ahead = self._pool.submit(self._fetch_block, self._next)
        return True

    def readinto(self, buffer) -> int:
        if self._at >= len(self._block) and not self._advance():
            return 0
        view = memoryview(buffer).cast("B")
        n = min(len(view), len(self._block) - self._at)
        view[:n] = memoryview(self._block)[self._at:self._at + n]
        self._at += n
        return n

    def close(self) -> None:
        if self._pool is not None:  # a request in flight finishes in its thread, unread
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = self._ahead = None
        self._block = b""
        super().close()

    def _fetch(self, start: int, end: int) -> bytes:
        """Bytes ``[start, end)``: exactly that many, or an error naming the URL."""
        parts: list[bytes] = []
        at, failures, last = start, 0, None
        while at < end:
            try:
                data = self._request(at, end)
            except _Changed as exc:
                raise DataError(
                    f"the object changed while it was read (its ETag was {exc.args[0]} when "
                    f"it was opened; bytes {at}-{end - 1} are of another version): it was "
                    "overwritten; read it again once it is replaced, or replace objects under "
                    "new names", source=self.name) from None
            except FileNotFoundError:
                raise MissingDataError("no such object (it was there when opened)",
                                       source=self.name) from None
            except PermissionError as exc:
                raise DataError(f"access denied: {_describe(exc, self._options)}",
                                source=self.name) from None
            except (TypeError, ValueError, AttributeError) as exc:  # a setup error: no retry
                raise ValueError(f"{redact(self.name)}: {_describe(exc, self._options)}") from None
            except Exception as exc:  # noqa: BLE001 - 5xx, resets, timeouts: all retried
                data, last = b"", exc
            if len(data) > end - at:
                raise DataError(f"asked for bytes {at}-{end - 1}, got {len(data)} bytes: the "
                                "server ignores byte ranges", source=self.name)
            if data:
                parts.append(data)
                at += len(data)  # a short block: continue from where it stopped
                continue
            failures += 1
            if failures >= self._options.retries:
                reason = _describe(last, self._options) if last else "empty response"
                raise DataError(
                    f"gave up reading bytes {at}-{end - 1} after {failures} attempts "
                    f"({reason})", source=self.name) from None
            time.sleep(min(self._options.backoff * 2 ** (failures - 1), _MAX_BACKOFF))
        return b"".join(parts)

    def _request(self, start: int, end: int) -> bytes:
        fs, timeout = self._fs, self._options.timeout
        if getattr(fs, "async_impl", False):
            from fsspec.asyn import sync

            if self._pin.get("etag") and hasattr(fs, "_call_s3"):
                return sync(fs.loop, self._pinned_range, start, end, timeout=timeout)
            return sync(fs.loop, fs._cat_file, self._path, start=start, end=end,
                        timeout=timeout)
        return fs.cat_file(self._path, start=start, end=end)

    async def _pinned_range(self, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of the object as it was when opened (S3: ``If-Match`` its
        ETag, and its version on a versioned bucket); a change raises :class:`_Changed`."""
        fs, etag, version = self._fs, self._pin["etag"], self._pin.get("version")
        bucket, key, _ = fs.split_path(self._path)
        extra = {"VersionId": version} if version else {}
        try:
            response = await fs._call_s3("get_object", Bucket=bucket, Key=key,
                                         Range=f"bytes={start}-{end - 1}", IfMatch=etag, **extra)
        except Exception as exc:  # noqa: BLE001 - only a failed precondition is named here
            text = str(exc).lower()
            if "precondition" in text or "pre-condition" in text:
                raise _Changed(etag) from None
            raise
        body = response["Body"]
        try:
            return await body.read()
        finally:
            body.close()


class _Changed(Exception):
    """A range request found the object changed since it was opened (args: the old ETag)."""


def _call(fs, method: str, timeout: float, *args, **kwargs):
    """``fs.<method>(*args)``, given up after ``timeout`` seconds in all (an asynchronous
    file system's coroutine under fsspec's ``sync`` deadline; a synchronous one as it is)."""
    if getattr(fs, "async_impl", False):
        from fsspec.asyn import sync

        return sync(fs.loop, getattr(fs, "_" + method), *args, timeout=timeout, **kwargs)
    return getattr(fs, method)(*args, **kwargs)


def _stat(fs, path: str, url: str, options: RemoteOptions) -> dict:
    """The object's info (size, and for S3 its ETag and VersionId), retried like a range
    request, each attempt within ``options.timeout``."""
    for attempt in range(1, options.retries + 1):
        try:
            info = _call(fs, "info", options.timeout, path)
        except FileNotFoundError:
            raise MissingDataError("no such object", source=url) from None
        except PermissionError as exc:
            raise DataError(f"access denied: {_describe(exc, options)}", source=url) from None
        except (TypeError, ValueError, AttributeError) as exc:  # a setup error: no retry
            raise ValueError(f"{redact(url)}: {_describe(exc, options)}") from None
        except Exception as exc:  # noqa: BLE001 - transient: retried
            if attempt == options.retries:
                raise DataError(f"gave up asking for its size after {attempt} attempts "
                                f"({_describe(exc, options)})", source=url) from None
            time.sleep(min(options.backoff * 2 ** (attempt - 1), _MAX_BACKOFF))
            continue
        if info.get("type") == "directory":
            raise DataError("is a folder, not a file", source=url)
        return info
    raise AssertionError("unreachable")  # pragma: no cover


def remote_info(url: str, options: RemoteOptions | None = None) -> dict:
    """The object's info as the store gives it (one size request, retried like a range
    request): ``size``, and for S3 its ``ETag`` and, on a versioned bucket, ``VersionId``;
    other stores their own fields (:func:`object_version` picks what names a version).

    Raises:
        MissingDataError: no such object.
        DataError: access denied, or the request failed ``retries`` times.
    """
    options = _options(options)
    fs, path = _filesystem(url, options)
    try:  # asked of the store, not of a listing this process cached (s3fs keeps them)
        fs.invalidate_cache(path)
    except Exception:  # noqa: BLE001 - a file system without a cache
        pass
    return _stat(fs, path, url, options)


#: Fields of an object's info that name its content (an ETag, a version, a generation, a
#: digest): a change of content changes one of them.
_STRONG = ("ETag", "etag", "VersionId", "version_id", "generation", "md5Hash", "md5",
           "content_md5", "sha256")
#: Fields that change when an object is rewritten, but not surely with its content.
_WEAK = ("size", "mtime", "LastModified", "last_modified", "last-modified", "updated",
         "created", "modified")


def object_version(info: Mapping[str, Any]) -> tuple[dict, bool]:
    """``({field: text}, strong)``: what names the version of the object whose ``info``
    (:func:`remote_info`) this is, and whether a field of it names the content (an ETag, a
    version id, a generation, a digest: ``strong``) or only its size and times.

    >>> object_version({"size": 10, "ETag": '"abc"', "type": "file"})
    ({'ETag': '"abc"', 'size': '10'}, True)
    >>> object_version({"size": 10, "created": 1.5})
    ({'size': '10', 'created': '1.5'}, False)
    """
    found = {k: str(info[k]) for k in _STRONG + _WEAK if info.get(k) is not None}
    return found, any(k in found for k in _STRONG)


def open_remote(url: str, options: RemoteOptions | None = None, *,
                info: Mapping[str, Any] | None = None) -> io.BufferedReader:
    """Open a remote file for sequential binary reading (see the module docs): blocks of
    ``options.block_size`` bytes, each one range request, the next fetched while one is read.

    Raises:
        MissingDataError: no such object.
        DataError: a range request failed ``retries`` times, access was denied.
        ImportError: no fsspec package for the protocol; the message has the install line.

    >>> open_remote("memory://speechpipe-doc/absent.tar")
    Traceback (most recent call last):
    ...
    speechpipe.errors.MissingDataError: memory://speechpipe-doc/absent.tar: no such object

    ``info``: the object's info from :func:`remote_info` (no size request then): the read is
    pinned to that version (S3: a change since raises the error above).
    """
    options = _options(options)
    fs, path = _filesystem(url, options)
    if info is None:
        info = _stat(fs, path, url, options)
    pin = {"etag": info.get("ETag"), "version": info.get("VersionId")}
    raw = _RangeReader(fs, path, url, int(info["size"]), options, pin)
    return io.BufferedReader(raw, min(options.block_size, _SMALL_READS))


def read_remote_bytes(url: str, options: RemoteOptions | None = None, *,
                      info: Mapping[str, Any] | None = None) -> bytes:
    """The whole remote file (a small one: an index, a manifest); ``info``: as
    :func:`open_remote`'s."""
    with open_remote(url, options, info=info) as f:
        return f.read()


def remote_glob(pattern: str, options: RemoteOptions | None = None) -> list[str]:
    """URLs matching a glob pattern (``s3://bucket/corpus/data-*.tar``), sorted."""
    options = _options(options)
    fs, path = _filesystem(pattern, options)
    try:
        found = _call(fs, "glob", options.timeout * options.retries, path)
    except Exception as exc:  # noqa: BLE001 - named with the pattern
        raise DataError(f"cannot list: {_describe(exc, options)}", source=pattern) from None
    return sorted(fs.unstrip_protocol(p) for p in found)
