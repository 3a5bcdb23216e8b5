"""Who owns a pack folder: one run at a time.

A run of ``pack`` (or a ``--plan-only`` / ``--merge`` step) holds ``.speechpipe-pack.lock`` in
the output folder for as long as it writes there; a ``--task i/N`` holds
``.speechpipe-pack-task-<i>-of-<N>.lock`` (tasks of one plan write different shards and run at
once, but never beside a whole run, and never twice the same task). A lock file is a JSON line
naming its holder (``pid``, ``host``, what it runs) and is held with ``flock``, which the kernel
releases when the holder dies: a lock file left by a dead process is *stale*. A stale lock of
a process of this host that no longer runs is taken over with a warning; a lock naming another
host is never taken over (its pid cannot be checked from here): the error says which run holds
it and to delete the file if that run is gone.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
import warnings
from typing import Any

from ..errors import FolderLockedError

__all__: list[str] = []

LOCK_NAME = ".speechpipe-pack.lock"
_TASK_LOCK = ".speechpipe-pack-task-{0}-of-{1}.lock"


def task_lock_name(task: int, tasks: int) -> str:
    """The lock file name of task ``task`` of ``tasks`` (1-based)."""
    return _TASK_LOCK.format(task, tasks)


def _is_lock_name(name: str) -> bool:
    return name == LOCK_NAME or (name.startswith(".speechpipe-pack-task-")
                                 and name.endswith(".lock"))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a process of another user: alive
        return True
    return True


def _describe(holder: dict[str, Any] | None) -> str:
    if not holder:
        return "a run that left no details"
    started = holder.get("started")
    when = (time.strftime(" since %Y-%m-%d %H:%M:%S UTC", time.gmtime(started))
            if isinstance(started, (int, float)) else "")
    return (f"pid {holder.get('pid')} on host {holder.get('host')!r} "
            f"({holder.get('what', 'pack')}{when})")


def _read_holder(fd: int) -> dict[str, Any] | None:
    os.lseek(fd, 0, os.SEEK_SET)
    data = os.read(fd, 4096)
    try:
        holder = json.loads(data.decode("utf-8")) if data.strip() else None
    except (UnicodeDecodeError, ValueError):
        return None
    return holder if isinstance(holder, dict) else None


class FolderLock:
    """An exclusive, released-on-death lock on one file of a pack folder.

    ``with FolderLock(folder, what="pack"):`` -- raises
    :class:`~speechpipe.errors.FolderLockedError` naming the holder when another live run
    holds it; takes over (with a warning) a lock left by a dead process of this host.
    """

    def __init__(self, folder: str, what: str, name: str = LOCK_NAME) -> None:
        self.folder = folder
        self.path = os.path.join(folder, name)
        self.what = what
        self._fd: int | None = None

    def acquire(self) -> "FolderLock":
        os.makedirs(self.folder, exist_ok=True)
        me = {"pid": os.getpid(), "host": socket.gethostname(), "what": self.what,
              "started": time.time()}
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                holder = _read_holder(fd)
                os.close(fd)
                if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    raise
                raise FolderLockedError(
                    f"this pack folder is in use by {_describe(holder)}: wait for it to end "
                    "(two runs writing one folder would mix their shards and index), or pack "
                    "into another folder", source=self.path) from None
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if not same:  # released and deleted between our open and flock: try again
                os.close(fd)
                continue
            break
        try:
            holder = _read_holder(fd)
            if holder is not None or os.fstat(fd).st_size:
                self._take_over(holder)
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)
            os.write(fd, (json.dumps(me) + "\n").encode("utf-8"))
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return self

    def _take_over(self, holder: dict[str, Any] | None) -> None:
        """The file holds a holder, but no process holds the flock: whoever wrote it died (or
        runs on a host whose locks this one cannot see). Take it over only when that is sure."""
        pid, host = (holder or {}).get("pid"), (holder or {}).get("host")
        if holder is not None and host != socket.gethostname():
            raise FolderLockedError(
                f"this pack folder is locked by {_describe(holder)}, another host: if that run "
                f"is gone, delete {self.path} and run again", source=self.path)
        if isinstance(pid, int) and pid != os.getpid() and _pid_alive(pid):
            raise FolderLockedError(
                f"this pack folder is locked by {_describe(holder)}, which still runs but "
                f"does not hold the lock (a file system without flock?): if that run is not a "
                f"pack, delete {self.path} and run again", source=self.path)
        warnings.warn(f"{self.path}: taking over a stale lock of {_describe(holder)}: that "
                      "process no longer runs (killed?); its unfinished files are replaced",
                      stacklevel=3)

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            os.remove(self.path)  # first: a waiter that opened it sees another inode
        except FileNotFoundError:
            pass
        finally:
            os.close(fd)

    def __enter__(self) -> "FolderLock":
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


def live_locks(folder: str, *, ignore: str | None = None) -> list[tuple[str, str]]:
    """``(lock file, holder)`` of every lock in ``folder`` (but ``ignore``) held right now."""
    found = []
    try:
        names = sorted(os.listdir(folder))
    except FileNotFoundError:
        return []
    for name in names:
        if not _is_lock_name(name) or name == ignore:
            continue
        path = os.path.join(folder, name)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError:
                found.append((path, _describe(_read_holder(fd))))
            else:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
    return found


def refuse_if_locked(folder: str, *, ignore: str | None = None) -> None:
    """Raise :class:`FolderLockedError` if another run holds a lock in ``folder``."""
    held = live_locks(folder, ignore=ignore)
    if held:
        path, holder = held[0]
        raise FolderLockedError(
            f"this pack folder is in use by {holder}: wait for it to end, or pack into another "
            f"folder ({len(held)} lock(s) held)", source=path)
