"""Node copies: a remote or compressed shard read by ``plan_batches`` fetched once per node.

``plan_batches``' shard road plans one global batch sequence; each process (rank x DataLoader
worker) reads, whole, every shard holding a member of one of its batches, so a shard is read
by several processes of a node (benchmarks/README.md, "What the planned shard road reads"). A
local plain tar is mapped, its pages shared; but a shard in object storage (``s3://``,
``http(s)://``...) would be downloaded by each of them, and a compressed one (``.tar.gz``,
``.tar.zst``) decompressed by each.

:func:`node_copy_samples` reads such a shard from a **node copy** instead: the first process
of the node that needs it downloads / decompresses it into a plain tar in the node's cache
folder (:func:`speechpipe.node_cache.index_cache_dir`, its ``shard-copies`` folder), under a
temporary name renamed into place once whole, under a lock (:func:`~speechpipe.node_cache.
file_lock`), so that processes that need it at once wait and then map what it wrote; every
process reads the copy as a local mapped tar. Samples keep the original shard's name as their
``source`` and errors name the original.

- **One copy per source and version** (:func:`~speechpipe.node_cache.versioned_path`): an
  object's ETag / version id / size (:func:`~speechpipe.remote.remote_info`: one size request
  per process and shard read, no GET once copied; an ``http(s)://`` URL's ``HEAD``: ETag,
  Last-Modified, length), a local file's size, modification time and inode. A changed source
  gets a new copy and its older ones are removed. A store that names no version (a size
  alone) is read directly. The copy's name carries its byte count: a copy cut short (a damaged
  disk) is never read, nor a ``.tmp`` left by a writer that was killed (removed after an hour).
- **Checked as it is written**: the tar is walked as it is written, as the reader walks it --
  each header checked, a member over ``max_member_bytes`` refused before a byte of it is read
  or decompressed (:class:`~speechpipe.errors.DataError` naming the shard and the member, as a
  direct read raises it): no decompression bomb through the copy; a truncated or corrupt
  shard raises while it is copied, and nothing is renamed into place.
- **Bounded** by ``ShardReadOptions(node_copy_bytes=)``: the copies kept add up to at most
  that many bytes; the least recently used (their modification time, renewed at each use) are
  removed beyond it. A copy removed while a process reads it stays readable there (Linux keeps
  an open or mapped file's pages); a process that finds its copy removed before it opened it
  makes it again. A shard larger than the budget is not copied (read directly, as before; a
  marker says so to the node's other processes). Without a usable cache folder
  (``index_cache_dir``'s warning says why), or where writing fails (a full disk: a warning),
  shards are read directly.
"""

from __future__ import annotations

import os
import tempfile
import time
import warnings
from typing import Any, BinaryIO, Iterable, Iterator

from ...errors import MissingDataError, redact
from ...index import shard_compression
from ...node_cache import drop_other_versions, file_lock, index_cache_dir, versioned_path
from ...remote import is_remote, object_version, open_http, open_remote, remote_info
from ...remote import http_request, RemoteOptions
from ...sample import Sample
from ..sources import open_stream
from ._reader import decompressed_reader, group_by_key, iter_plain_members, ShardReadOptions
from ._tar import iter_members, StreamReader

__all__ = ["COPIES_FOLDER", "node_copy_samples"]

#: The folder of the node copies inside the node's cache folder.
COPIES_FOLDER = "shard-copies"
_TRIES = 3  # a copy removed (by another process's budget) before it was opened: made again
_STALE_TEMP_S = 3600.0  # a .tmp older than this is a killed writer's: removed
_OVER = ".over"  # marker: this version is larger than the budget (read directly)
_HTTP = ("http://", "https://")


class _TooBig(Exception):
    """The copy grew past the budget while it was written."""


class _WriteFailed(Exception):
    """Writing the copy failed (``args[0]``: the ``OSError``)."""


def node_copy_samples(name: str,
                      read_options: ShardReadOptions | None) -> Iterable[Sample] | None:
    """The raw samples of shard ``name`` read from its node copy (made now if it is not
    there), as :func:`~speechpipe.pipes.order.read_shard` gives them (to be read once);
    ``None`` where no copy
    is used -- a local plain tar or a ``pipe:`` command, ``node_copy_bytes=None``, no usable
    cache folder, a shard larger than the budget, a store naming no version, a copy that could
    not be written -- and the caller reads the shard directly.

    Raises:
        MissingDataError, DataError: as reading the shard directly raises them, naming it
            (an absent object, a download that failed its retries, a truncated or corrupt
            shard, a member over ``max_member_bytes``).
    """
    options = read_options if read_options is not None else ShardReadOptions()
    budget = options.node_copy_bytes
    compression = shard_compression(name)
    if (not budget or name.startswith("pipe:")
            or not (is_remote(name) or compression is not None)):
        return None
    folder = _copies_folder(options.remote)
    if folder is None:
        return None
    stream = _open_copy(name, options, folder)
    return None if stream is None else _Samples(stream, name, options)


class _Samples:
    """The samples of an opened copy, read once; the file is closed when they are read, the
    reading stops, or this object goes unread."""

    def __init__(self, stream: BinaryIO, name: str, options: ShardReadOptions) -> None:
        self.stream, self.name, self.options = stream, name, options

    def __iter__(self) -> Iterator[Sample]:
        stream, self.stream = self.stream, None
        if stream is None:
            raise RuntimeError(f"the node copy of {redact(self.name)} was read already")
        try:
            yield from group_by_key(iter_plain_members(stream, self.name, self.options),
                                    source=self.name)
        finally:
            stream.close()

    def __del__(self) -> None:
        if getattr(self, "stream", None) is not None:
            self.stream.close()


def _copies_folder(remote: RemoteOptions | None) -> str | None:
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        base = index_cache_dir(remote.cache_dir if remote is not None else None)
    for warning in said:  # index_cache_dir's warning, with what it costs here
        warnings.warn(f"{warning.message}; and plan_batches reads remote and compressed "
                      "shards without node copies (each process downloads or decompresses "
                      "every shard it needs)", warning.category, stacklevel=3)
    if base is None:
        return None
    folder = os.path.join(base, COPIES_FOLDER)
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
    except OSError as exc:
        warnings.warn(f"cannot make {folder} ({exc.strerror or exc}): remote and compressed "
                      "shards are read by each process", RuntimeWarning, stacklevel=3)
        return None
    return folder


def _open_copy(name: str, options: ShardReadOptions, folder: str) -> BinaryIO | None:
    """The copy of ``name`` opened (made under the lock if it is not there), or ``None``."""
    found = _version(name, options)
    if found is None:
        return None
    source, version, info = found
    prefix, stem = versioned_path(folder, source, version, suffix="")
    budget = options.node_copy_bytes
    for _ in range(_TRIES):
        path = _find(prefix, budget)
        if path is None:
            with file_lock(os.path.join(folder, stem + ".lock"), create=True):
                path = _find(prefix, budget) or _make(name, options, (folder, prefix, stem),
                                                      info, version)
        if path is None or path == _OVER:
            return None
        try:
            stream = open(path, "rb")
        except FileNotFoundError:  # removed by another process's budget since: again
            continue
        try:
            os.utime(stream.fileno())  # used now: the last to be removed
        except OSError:
            pass
        return stream
    return None


def _find(prefix: str, budget: int) -> str | None:
    """The whole copy of ``prefix``'s version (``<prefix>.<bytes>.tar`` of that many bytes),
    ``_OVER`` where it is larger than ``budget`` (a marker ``<prefix>.over<bytes>`` of a
    budget at least this one), else ``None`` (a copy cut short removed)."""
    folder, base = os.path.split(prefix)
    try:
        names = [n for n in os.listdir(folder) if n.startswith(base + ".")]
    except OSError:
        return None
    for found in names:
        marked = found[len(base):]
        if marked.startswith(_OVER) and marked[len(_OVER):].isdigit() \
                and int(marked[len(_OVER):]) >= budget:
            return _OVER
    for found in (n for n in names if n.endswith(".tar")):
        path = os.path.join(folder, found)
        try:
            whole = os.stat(path).st_size == int(found[len(base) + 1:-len(".tar")])
        except (OSError, ValueError):
            continue
        if whole:
            return path
        try:
            os.remove(path)  # cut short: never read
        except OSError:
            pass
    return None


def _version(name: str, options: ShardReadOptions) -> tuple[str, dict, Any] | None:
    """``(source, version, info)`` naming the copy of ``name``; ``None`` where nothing names
    a version (read directly)."""
    if not is_remote(name):
        try:
            st = os.stat(name)
        except OSError:
            return None  # the direct read names the error
        return os.path.abspath(name), {"size": st.st_size, "mtime_ns": st.st_mtime_ns,
                                       "inode": st.st_ino}, None
    if name.startswith(_HTTP):
        info = _http_info(name, options.remote)
        version = {k: v for k, v in info.items() if k != "size"}
        return (redact(name), info, None) if version else None
    info = remote_info(name, options.remote)
    version, strong = object_version(info)
    if not strong and set(version) <= {"size"}:
        return None  # a size alone does not name a version
    endpoint = dict(options.remote.storage_options or {}).get("endpoint_url") \
        if options.remote is not None else None
    if endpoint:  # the same bucket and key behind another endpoint is another object
        version["endpoint"] = str(endpoint)
    return redact(name), version, info


def _http_info(url: str, remote: RemoteOptions | None) -> dict:
    """What a ``HEAD`` of ``url`` says of its version: ETag, Last-Modified, length."""
    request = http_request(url)
    request.method = "HEAD"
    try:
        with open_http(request, remote.timeout if remote is not None else 60.0) as answer:
            headers = answer.headers
    except Exception:  # noqa: BLE001 - no version known: the direct read names any error
        return {}
    found = {"etag": headers.get("ETag"), "last-modified": headers.get("Last-Modified"),
             "size": headers.get("Content-Length")}
    return {k: v for k, v in found.items() if v}


def _make(name: str, options: ShardReadOptions, where: tuple[str, str, str], info: Any,
          version: dict) -> str | None:
    """Write the copy (under the lock), older versions and least recently used copies
    removed; its path, ``_OVER`` (larger than the budget) or ``None`` (not written)."""
    folder, prefix, stem = where
    budget = options.node_copy_bytes
    plain_size = int(info["size"]) if info is not None and shard_compression(name) is None \
        else None
    if plain_size is not None and plain_size > budget:
        return _mark_over(prefix, budget)
    _evict(folder, budget - (plain_size or 0), keep=None)  # room for it, where known
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=os.path.basename(prefix) + ".", suffix=".tmp",
                                   dir=folder)
        with os.fdopen(fd, "wb") as out:
            size = _fill(out, name, options, info)
            out.flush()
            os.fsync(out.fileno())
        if name.startswith(_HTTP) and _http_info(name, options.remote) != version:
            _remove(tmp)  # changed while it was downloaded: read directly
            return None
        path = f"{prefix}.{size}.tar"
        os.replace(tmp, path)
    except _TooBig:
        _remove(tmp)
        return _mark_over(prefix, budget)
    except MissingDataError:  # the shard's own error: as a direct read raises it
        _remove(tmp)
        raise
    except (_WriteFailed, OSError) as exc:  # the copy's: a full disk, a vanished folder
        _remove(tmp)
        error = exc.args[0] if isinstance(exc, _WriteFailed) else exc
        warnings.warn(f"cannot write the node copy of {redact(name)} in {folder} "
                      f"({error.strerror or error}): this process reads it directly",
                      RuntimeWarning, stacklevel=4)
        return None
    except BaseException:
        _remove(tmp)
        raise
    drop_other_versions(folder, stem, path)
    _evict(folder, budget, keep=path)
    return path


def _fill(out: BinaryIO, name: str, options: ShardReadOptions, info: Any) -> int:
    """Copy ``name`` (downloaded, decompressed) into ``out``, walking its tar as it goes; the
    bytes written."""
    budget = options.node_copy_bytes
    compression = shard_compression(name)
    if info is not None:  # pinned to the version the copy is named by
        stream = open_remote(name, options.remote, info=info)
    else:
        remote = options.remote
        stream = open_stream(name, remote=remote,
                             timeout=remote.timeout if remote is not None else 60.0)
    read, close = stream.read, None
    if compression is not None:
        read, close = decompressed_reader(stream, compression, name)
    written = 0

    def tee(n: int) -> bytes:
        nonlocal written
        data = read(n)
        written += len(data)
        if written > budget:
            raise _TooBig()
        try:
            out.write(data)
        except OSError as exc:  # not the shard's error: the walk would name it as one
            raise _WriteFailed(exc) from exc
        return data

    try:
        for _ in iter_members(StreamReader(tee, name), options.max_member_bytes):
            pass
    finally:
        if close is not None:
            close()
        stream.close()
    return written


def _mark_over(prefix: str, budget: int) -> str:
    try:
        with open(f"{prefix}{_OVER}{budget}", "wb"):
            pass
    except OSError:
        pass
    return _OVER


def _remove(path: str | None) -> None:
    if path is None:
        return
    try:
        os.remove(path)
    except OSError:
        pass


def _evict(folder: str, budget: int, keep: str | None) -> None:
    """Remove the least recently used copies until those left add up to ``budget`` bytes at
    most (``keep`` stays); ``.tmp`` files older than an hour go too."""
    now = time.time()
    copies = []
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for found in names:
        path = os.path.join(folder, found)
        try:
            st = os.stat(path)
        except OSError:
            continue
        if found.endswith(".tmp"):
            if now - st.st_mtime > _STALE_TEMP_S:
                _remove(path)
        elif found.endswith(".tar"):
            copies.append((st.st_mtime, path, st.st_size))
    total = sum(size for _, _, size in copies)
    for _, path, size in sorted(copies):
        if total <= budget:
            break
        if path != keep:
            _remove(path)
            total -= size
