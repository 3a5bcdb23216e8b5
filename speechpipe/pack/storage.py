"""Where a pack is written: a local folder, or a folder of object storage (any fsspec URL,
``s3://bucket/corpus``), behind the few operations a pack needs.

A shard is always written to a local temporary file first; :meth:`Storage.publish` then puts
it under its final name -- a rename in a local folder, one upload to object storage (an S3 PUT
or multipart upload makes the object visible only once complete): a final name never holds a
partial shard. Object storage has no lock here: one pack (or one task of a plan) per URL at a
time is the user's to ensure.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from typing import Any

from ..errors import DataError, MissingDataError
from ..remote import RemoteOptions, is_remote, join_url, remote_filesystem

__all__: list[str] = []


class Storage:
    """A pack's output folder: local paths, or URLs read and written through fsspec with
    ``remote``'s storage options (picklable: the file system is made where it is used)."""

    def __init__(self, root: str, remote: RemoteOptions | None = None) -> None:
        self.root = root.rstrip("/") if is_remote(root) else root
        self.remote = remote
        self.is_url = is_remote(root)
        self._fs: Any = None

    def __getstate__(self) -> dict:
        return {"root": self.root, "remote": self.remote, "is_url": self.is_url, "_fs": None}

    @property
    def fs(self):
        if self._fs is None:
            self._fs = remote_filesystem(self.root, self.remote)[0]
        return self._fs

    def _path(self, path: str) -> str:
        return remote_filesystem(path, self.remote)[1] if self.is_url else path

    def _call(self, what: str, path: str, fn, *args: Any) -> Any:
        """``fn(*args)`` on the file system, retried on transient faults; a named
        :class:`~speechpipe.errors.DataError` when it keeps failing."""
        options = self.remote or RemoteOptions()
        for attempt in range(1, options.retries + 1):
            try:
                return fn(*args)
            except FileNotFoundError:
                raise
            except (TypeError, ValueError, AttributeError, PermissionError) as exc:
                raise DataError(f"cannot {what}: {type(exc).__name__}: "
                                f"{_hide(str(exc), options)}", source=path) from None
            except Exception as exc:  # noqa: BLE001 - resets, 5xx, a server gone: retried
                if attempt == options.retries:
                    raise DataError(f"cannot {what} after {attempt} attempts "
                                    f"({type(exc).__name__}: {_hide(str(exc), options)})",
                                    source=path) from None
                time.sleep(min(options.backoff * 2 ** (attempt - 1), 30.0))
        raise AssertionError("unreachable")  # pragma: no cover

    # -- names

    def join(self, folder: str, *names: str) -> str:
        if self.is_url:
            for name in names:
                folder = join_url(folder, name)
            return folder
        return os.path.join(folder, *names)

    def relative(self, path: str) -> str:
        if self.is_url:
            return path[len(self.root) + 1:] if path != self.root else "."
        return os.path.relpath(path, self.root).replace(os.sep, "/")

    def split(self, path: str) -> tuple[str, str]:
        return tuple(path.rsplit("/", 1)) if self.is_url else os.path.split(path)

    # -- queries

    def isdir(self, path: str) -> bool:
        if not self.is_url:
            return os.path.isdir(path)
        return bool(self._call("list", path, self.fs.isdir, self._path(path)))

    def isfile(self, path: str) -> bool:
        if not self.is_url:
            return os.path.isfile(path)
        return bool(self._call("look up", path, self.fs.isfile, self._path(path)))

    def listdir(self, path: str) -> list[str]:
        """Names in a folder (none if it does not exist)."""
        if not self.is_url:
            try:
                return os.listdir(path)
            except FileNotFoundError:
                return []
        try:
            found = self._call("list", path, self.fs.ls, self._path(path), False)
        except FileNotFoundError:
            return []
        self.fs.invalidate_cache()
        return [p.rstrip("/").rsplit("/", 1)[-1] for p in found]

    def size(self, path: str) -> int:
        """The file's size in bytes; ``FileNotFoundError`` if absent."""
        if not self.is_url:
            return os.path.getsize(path)
        return int(self._call("look up", path, self.fs.size, self._path(path)))

    # -- changes

    def makedirs(self, path: str) -> None:
        if not self.is_url:
            os.makedirs(path, exist_ok=True)  # object storage: folders are name prefixes

    def remove(self, path: str) -> None:
        if not self.is_url:
            os.remove(path)
            return
        try:
            self._call("delete", path, self.fs.rm_file, self._path(path))
        except FileNotFoundError:
            pass
        self.fs.invalidate_cache()

    def rmdir_if_empty(self, path: str) -> None:
        if not self.is_url and not os.listdir(path):
            os.rmdir(path)

    def local_tmp(self, final: str, tmp_name: str) -> str:
        """A local path for writing the file that becomes ``final``: beside it (then renamed)
        in a local folder, in a fresh temporary folder for object storage."""
        if not self.is_url:
            return os.path.join(os.path.dirname(final), tmp_name)
        return os.path.join(tempfile.mkdtemp(prefix="speechpipe-pack-"), tmp_name)

    def publish(self, tmp: str, final: str) -> None:
        """Put the complete local file ``tmp`` under ``final`` (and remove ``tmp``)."""
        if not self.is_url:
            os.replace(tmp, final)
            return
        try:
            self._call("upload the shard", final, self.fs.put_file, tmp, self._path(final))
        finally:
            shutil.rmtree(os.path.dirname(tmp), ignore_errors=True)
        self.fs.invalidate_cache()

    def write_bytes(self, path: str, data: bytes) -> None:
        """Write a small file whole (an index, a plan): renamed into place locally, one PUT
        in object storage."""
        if not self.is_url:
            with open(f"{path}.tmp", "wb") as f:
                f.write(data)
            os.replace(f"{path}.tmp", path)
            return
        self._call("write", path, self.fs.pipe_file, self._path(path), data)
        self.fs.invalidate_cache()

    def read_bytes(self, path: str) -> bytes:
        if not self.is_url:
            with open(path, "rb") as f:
                return f.read()
        try:
            return self._call("read", path, self.fs.cat_file, self._path(path))
        except FileNotFoundError:
            raise MissingDataError("no such object", source=path) from None


def _hide(text: str, options: RemoteOptions) -> str:
    for secret in options.secrets():
        text = text.replace(secret, "***")
    return text[:300]
