"""A node's cache of derived files: the mapped tables of shard indexes that cannot be kept
beside their text (an index in object storage; a local index in a folder that cannot be
written), shared by every process on the node.

One file per source and version: its name is made of a digest of the source (the URL, or the
index's absolute path) and a digest of the version (an object's ETag / version id / size, a
local file's size, modification time and inode), so that a changed source gets a new file
and a process never maps a table of another version. A file is built once under a lock
(:func:`file_lock` on ``<source digest>.lock``: processes that start at once wait for the
first and map what it wrote); when a new version is written, the files of the source's older
versions are removed (a process that mapped one keeps its pages), so versions do not pile up.

The folder (:func:`index_cache_dir`): the argument (``RemoteOptions(cache_dir=)``,
``ShardIndex.read(cache_dir=)``), else ``$SPEECHPIPE_CACHE_DIR``, else
``$XDG_CACHE_HOME/speechpipe``, else ``speechpipe-<uid>`` in the temporary folder (created
for this user only). Keep it on a node-local disk: the lock is an ``flock``.

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
import stat
import tempfile
import time
import warnings
from typing import Any, Mapping

__all__ = ["CACHE_ENV", "drop_other_versions", "file_lock", "index_cache_dir",
           "versioned_path"]

#: The environment variable naming the cache folder.
CACHE_ENV = "SPEECHPIPE_CACHE_DIR"
_STALE_TEMP_S = 3600.0  # a half-written file (a killed writer) older than this is removed


def index_cache_dir(cache_dir: str | os.PathLike | None = None) -> str | None:
    """The node's cache folder, created if absent; ``None`` (with a warning saying why and
    what it costs) where it cannot be used -- then each process builds its own table.

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
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        st = os.lstat(folder)
    except OSError as exc:
        return _unusable(folder, f"cannot be made: {exc.strerror or exc}")
    if not stat.S_ISDIR(st.st_mode):
        return _unusable(folder, "is not a folder (a link or a file)")
    if private and hasattr(os, "getuid") and (st.st_uid != os.getuid()
                                              or st.st_mode & 0o022):
        return _unusable(folder, "belongs to another user or others may write it")
    if not os.access(folder, os.W_OK | os.X_OK):
        return _unusable(folder, "cannot be written")
    return folder


def _unusable(folder: str, why: str) -> None:
    warnings.warn(f"speechpipe's cache folder {folder} {why}: each process builds its own "
                  f"table of a remote or read-only shard index (set {CACHE_ENV}, or "
                  "RemoteOptions(cache_dir=...), to a folder of yours on a local disk)",
                  RuntimeWarning, stacklevel=3)
    return None


def _digest(text: str) -> str:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=10).hexdigest()


def versioned_path(folder: str, source: str, version: Mapping[str, Any], *,
                   suffix: str = ".spmap") -> tuple[str, str]:
    """``(path, stem)``: the cache file of ``source`` at ``version`` in ``folder``, and the
    prefix every version of ``source`` shares (``index-<digest of source>``)."""
    stem = "index-" + _digest(source)
    tag = _digest(json.dumps(dict(version), sort_keys=True, default=str))
    return os.path.join(folder, f"{stem}-{tag}{suffix}"), stem


def drop_other_versions(folder: str, stem: str, keep: str) -> list[str]:
    """Remove the files of ``stem``'s other versions from ``folder`` (and half-written ones
    older than an hour); the names removed. A process that mapped one keeps its pages."""
    removed = []
    try:
        names = os.listdir(folder)
    except OSError:
        return removed
    now = time.time()
    for name in names:
        path = os.path.join(folder, name)
        if not name.startswith(stem + "-") or path == keep or name.endswith(".lock"):
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
    once build it once); ``create``: make the lock file if absent. No lock where the file
    system has none (each process may then build its own copy: correct, only slower)."""

    def __init__(self, path: str, *, create: bool = False) -> None:
        self.path = path
        self.create = create
        self.fd = None

    def __enter__(self) -> "file_lock":
        try:
            import fcntl

            flags = os.O_RDWR | os.O_CREAT if self.create else os.O_RDONLY
            self.fd = os.open(self.path, flags, 0o600)
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        except (ImportError, OSError):
            if self.fd is not None:
                os.close(self.fd)
            self.fd = None
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            os.close(self.fd)  # releases the lock
            self.fd = None
