"""A node's cache of derived files, and the file format they share.

**The cache.** What cannot be kept beside its source -- the mapped tables of shard indexes
in object storage or in a folder that cannot be written, the row tables and duration
selections of manifests in such a folder -- and what every process of a node would otherwise
compute for itself (an epoch's plan of ``plan_batches``) is kept in one folder per node,
shared by every process on it.

One file per source and version: its name is made of a digest of the source (the URL, or the
index's absolute path) and a digest of the version (an object's ETag / version id / size, a
local file's size, modification time and inode), so that a changed source gets a new file
and a process never maps a table of another version. A file is built once under a lock
(:func:`file_lock` on ``<source digest>.lock``: processes that start at once wait for the
first and map what it wrote); when a new version is written, the files of the source's older
versions are removed (a process that mapped one keeps its pages), so versions do not pile up.

The folder (:func:`index_cache_dir`): the argument (``RemoteOptions(cache_dir=)``,
``ShardIndex.read(cache_dir=)``, ``plan_batches(plan_cache=)``), else
``$SPEECHPIPE_CACHE_DIR``, else ``$XDG_CACHE_HOME/speechpipe``, else ``speechpipe-<uid>`` in
the temporary folder (created for this user only). Keep it on a node-local disk: the lock is
an ``flock``. On a file system without ``flock`` (:func:`file_lock` says so in ``locked``,
with one warning per process) nothing waits: processes that start at once each build their
own copy and rename it into place (each rename is whole; the last one stays) -- correct,
only slower.

**The format** (:func:`write_mapped`, :func:`read_mapped`; little-endian): 8 bytes of magic,
a 64-bit header length, the JSON header (what the file holds, each array's dtype, offset and
length), then the arrays, each aligned to 64 bytes. A cached file also records a CRC-32 of
each array (:func:`array_sums`, in the header's ``"sums"``): a file whose size and header are
whole but whose bytes are not (a crash after the rename, before the data reached the disk; a
damaged disk) is found by :func:`sums_match` the first time a process maps it, and built
again.

>>> import tempfile
>>> folder = index_cache_dir(tempfile.mkdtemp())
>>> path, stem = versioned_path(folder, "s3://bucket/corpus/index.jsonl", {"ETag": '"1"'})
>>> os.path.basename(path).startswith(stem + "-"), path.endswith(".spmap")
(True, True)
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import tempfile
import time
import warnings
import zlib
from typing import Any, Callable, Mapping

import numpy as np

from .errors import DataError, MissingDataError

__all__ = ["CACHE_ENV", "array_sums", "drop_other_versions", "file_lock", "index_cache_dir",
           "read_mapped", "sums_match", "versioned_path", "write_mapped"]

#: The environment variable naming the cache folder.
CACHE_ENV = "SPEECHPIPE_CACHE_DIR"
_STALE_TEMP_S = 3600.0  # a half-written file (a killed writer) older than this is removed
_MAGIC = b"SPMAP\x00v1"
_ALIGN = 64
_SUM_CHUNK = 1 << 24  # bytes summed at a time
#: Files whose sums this process has checked: ``{path: (inode, size, mtime_ns)}`` (a forked
#: DataLoader worker inherits what its parent checked).
_CHECKED: dict[str, tuple] = {}
_NO_FLOCK_WARNED: list[bool] = []


def index_cache_dir(cache_dir: str | os.PathLike | None = None) -> str | None:
    """The node's cache folder, created if absent; ``None`` (with a warning saying why and
    what it costs) where it cannot be used -- then each process builds its own tables and
    plans.

    ``cache_dir``, else ``$SPEECHPIPE_CACHE_DIR``, else ``$XDG_CACHE_HOME/speechpipe``, else
    ``<temporary folder>/speechpipe-<uid>``; the last must belong to this user and be writable
    by no one else (the temporary folder is shared).
    """
    explicit = os.fspath(cache_dir) if cache_dir is not None else os.environ.get(CACHE_ENV)
    xdg = os.environ.get("XDG_CACHE_HOME")
    if explicit:
        folder, private = explicit, False
    elif xdg:
        folder, private = os.path.join(xdg, "speechpipe"), False
    else:
        uid = os.getuid() if hasattr(os, "getuid") else "user"
        folder, private = os.path.join(tempfile.gettempdir(), f"speechpipe-{uid}"), True
    why = None
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        st = os.lstat(folder)
    except OSError as exc:
        why = f"cannot be made: {exc.strerror or exc}"
    else:
        if not stat.S_ISDIR(st.st_mode):
            why = "is not a folder (a link or a file)"
        elif private and hasattr(os, "getuid") and (st.st_uid != os.getuid()
                                                    or st.st_mode & 0o022):
            why = "belongs to another user or others may write it"
        elif not os.access(folder, os.W_OK | os.X_OK):
            why = "cannot be written"
    if why is not None:
        warnings.warn(f"speechpipe's cache folder {folder} {why}: each process builds its own "
                      "tables of remote or read-only indexes and manifests, and plans each "
                      f"epoch itself (set {CACHE_ENV}, or RemoteOptions(cache_dir=...), to a "
                      "folder of yours on a local disk)", RuntimeWarning, stacklevel=2)
    return folder if why is None else None


def _digest(text: str) -> str:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=10).hexdigest()


def versioned_path(folder: str, source: str, version: Mapping[str, Any], *,
                   suffix: str = ".spmap", kind: str = "index") -> tuple[str, str]:
    """``(path, stem)``: the cache file of ``source`` at ``version`` in ``folder``, and the
    prefix every version of ``source`` shares (``<kind>-<digest of source>``; ``kind``: what
    the file is, ``index``, ``rows``, ``within``)."""
    stem = f"{kind}-" + _digest(source)
    tag = _digest(json.dumps(dict(version), sort_keys=True, default=str))
    return os.path.join(folder, f"{stem}-{tag}{suffix}"), stem


def drop_other_versions(folder: str, stem: str, keep: str, *,
                        spare: Callable[[str], bool] | None = None) -> list[str]:
    """Remove the files of ``stem``'s other versions from ``folder`` (and half-written ones
    older than an hour) but ``keep`` and the names ``spare`` spares; the names removed. A
    process that mapped one keeps its pages."""
    removed = []
    try:
        names = os.listdir(folder)
    except OSError:
        return removed
    now = time.time()
    for name in names:
        path = os.path.join(folder, name)
        if not name.startswith(stem + "-") or path == keep or name.endswith(".lock") \
                or (spare is not None and spare(name)):
            continue
        try:
            if name.endswith(".tmp") and now - os.stat(path).st_mtime < _STALE_TEMP_S:
                continue  # another process may be writing it now
            os.remove(path)
            removed.append(name)
        except OSError:
            pass
    return removed


class file_lock:
    """An exclusive ``flock`` on ``path`` while a cache file is built (processes starting at
    once build it once); ``create``: make the lock file if absent. ``locked`` says whether it
    is held: no lock where the file system has none (``flock`` raises ``ENOLCK``,
    ``EOPNOTSUPP``...: a warning, once per process) or the lock file cannot be opened -- each
    process then builds its own copy (correct: every copy is renamed into place whole; only
    slower)."""

    def __init__(self, path: str, *, create: bool = False) -> None:
        self.path = path
        self.create = create
        self.fd = None
        self.locked = False

    def __enter__(self) -> "file_lock":
        try:
            import fcntl

            flags = os.O_RDWR | os.O_CREAT if self.create else os.O_RDONLY
            self.fd = os.open(self.path, flags, 0o600)
        except (ImportError, OSError):
            self.fd = None
            return self
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        except OSError as exc:
            os.close(self.fd)
            self.fd = None
            if not _NO_FLOCK_WARNED:
                _NO_FLOCK_WARNED.append(True)
                warnings.warn(f"no flock on {os.path.dirname(self.path) or '.'} "
                              f"({exc.strerror or exc}): the processes of this node that start "
                              "at once each build their own copy of a cached table or plan "
                              f"(put {CACHE_ENV} on a node-local disk)", RuntimeWarning,
                              stacklevel=2)
            return self
        self.locked = True
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            os.close(self.fd)  # releases the lock
            self.fd = None
        self.locked = False



# --------------------------------------------------------------------------- the file format


def write_mapped(path: str, header: Mapping[str, Any],
                 arrays: Mapping[str, np.ndarray | tuple[str, int]], *,
                 mode_of: str | None = None, sums: bool = False) -> str:
    """Write a mapped file atomically (a temporary file renamed into place).

    Args:
        path: where.
        header: JSON-serialisable fields kept in the header (``"arrays"`` is added).
        arrays: ``{name: array}``; a value ``(file, nbytes)`` copies a raw file's bytes as a
            ``uint8`` array without loading it.
        mode_of: a file whose permission bits the new file takes (whoever may read the text
            may read its table); by default read-write for the owner, readable by all.
        sums: record each array's CRC-32 in the header (``"sums"``: :func:`array_sums`) and
            flush the data to the disk before the rename (a file of a node's cache).
    """
    if sums:
        header = {**header, "sums": array_sums(arrays)}
    layout: dict[str, dict] = {}
    offset = 0
    for name, value in arrays.items():
        dtype, count = ((np.dtype(np.uint8), int(value[1])) if isinstance(value, tuple)
                        else (value.dtype, int(value.size)))
        layout[name] = {"dtype": dtype.str, "offset": offset, "count": count}
        offset = _aligned(offset + dtype.itemsize * count)
    head = json.dumps({**header, "arrays": layout}).encode("utf-8")
    base = _aligned(16 + len(head))
    for entry in layout.values():
        entry["offset"] += base
    head = json.dumps({**header, "arrays": layout}).encode("utf-8")
    if _aligned(16 + len(head)) != base:  # the offsets grew a digit: one more round
        shift = _aligned(16 + len(head)) - base
        for entry in layout.values():
            entry["offset"] += shift
        head = json.dumps({**header, "arrays": layout}).encode("utf-8")
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".tmp",
                               dir=os.path.dirname(os.path.abspath(path)))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(_MAGIC + len(head).to_bytes(8, "little") + head)
            for name, value in arrays.items():
                f.write(b"\0" * (layout[name]["offset"] - f.tell()))
                if isinstance(value, tuple):
                    with open(value[0], "rb") as raw:
                        shutil.copyfileobj(raw, f, 1 << 20)
                else:
                    f.write(np.ascontiguousarray(value).tobytes())
            if sums:
                f.flush()
                os.fsync(f.fileno())
        mode = 0o644 if mode_of is None else stat.S_IMODE(os.stat(mode_of).st_mode)
        os.chmod(tmp, mode | stat.S_IRUSR | stat.S_IWUSR)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    if sums:
        _CHECKED[path] = _identity(path)  # what this process wrote is what it summed
    return path


def read_mapped(path: str) -> tuple[dict, dict[str, np.ndarray]]:
    """``(header, {name: read-only memory-mapped array})`` of a :func:`write_mapped` file.

    Raises:
        MissingDataError: no such file.
        DataError: not such a file, or cut short.
    """
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            start = f.read(16)
            length = int.from_bytes(start[8:16], "little")
            if len(start) < 16 or start[:8] != _MAGIC or length > size - 16:
                raise DataError("not a speechpipe mapped file (bad magic or header length)",
                                source=path)
            head = f.read(length)
    except FileNotFoundError as exc:
        raise MissingDataError("no mapped file here", source=path) from exc
    try:
        header = json.loads(head)
        layout = header["arrays"]
    except (ValueError, KeyError, TypeError) as exc:
        raise DataError(f"unreadable mapped-file header ({exc})", source=path) from None
    arrays = {}
    for name, entry in layout.items():
        dtype, offset, count = np.dtype(entry["dtype"]), entry["offset"], entry["count"]
        if offset + dtype.itemsize * count > size:
            raise DataError(f"mapped file cut short: array {name!r} ends at byte "
                            f"{offset + dtype.itemsize * count} of {size}", source=path)
        arrays[name] = (np.zeros(0, dtype) if count == 0 else
                        np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=(count,)))
    return header, arrays


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def array_sums(arrays: Mapping[str, np.ndarray | tuple[str, int]]) -> dict[str, int]:
    """The CRC-32 of each array's bytes (a ``(file, nbytes)`` value: of the file's bytes), as
    :func:`write_mapped` records them with ``sums=True``.

    >>> array_sums({"a": np.arange(3, dtype=np.int32)})
    {'a': 494276218}
    """
    out = {}
    for name, value in arrays.items():
        crc = 0
        if isinstance(value, tuple):
            with open(value[0], "rb") as raw:
                while chunk := raw.read(_SUM_CHUNK):
                    crc = zlib.crc32(chunk, crc)
        else:
            flat = np.ascontiguousarray(value).reshape(-1).view(np.uint8)
            for start in range(0, flat.size, _SUM_CHUNK):
                crc = zlib.crc32(flat[start:start + _SUM_CHUNK], crc)
        out[name] = crc
    return out


def _identity(path: str) -> tuple | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def sums_match(path: str, header: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> bool:
    """Whether the arrays mapped from ``path`` have the CRC-32s its header records: checked
    once per process and file (the file's inode, size and modification time; a forked worker
    inherits what its parent checked). ``False`` for a file without sums, or any mismatch."""
    recorded = header.get("sums")
    if not isinstance(recorded, dict) or set(recorded) != set(arrays):
        return False
    identity = _identity(path)
    if identity is not None and _CHECKED.get(path) == identity:
        return True
    try:
        if array_sums(arrays) != {k: recorded[k] for k in arrays}:
            return False
    except (TypeError, ValueError, AttributeError):  # not an array
        return False
    _CHECKED[path] = identity
    return True
