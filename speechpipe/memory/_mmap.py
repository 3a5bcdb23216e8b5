"""Mapping local shard files: which streams are mapped, and a mapping read like a stream.

:func:`speechpipe.pipes.shards._reader.iter_tar_members` reads a shard through :class:`MappedFile`
when :meth:`MappedFile.open` maps it (that module's docs, "Memory-mapped shards", say what a
reader sees). Mapped are local regular files read as they are (a ``FileIO``, a plain
``BufferedReader`` over one, or either in torch's ``StreamWrapper``), from the stream's
position to the file's size when it is opened; not mapped (``open`` returns ``None``) are
other streams, files on a network or FUSE file system when asked to check
(:data:`NETWORK_FILE_SYSTEMS`, from ``/proc/self/mounts``), and any file once this process
holds as many mappings with a descriptor as it may (below).

Reading ahead: a mapped file of 16 MiB or more on Linux gets a read-ahead thread
(:mod:`speechpipe.memory._readahead`) unless it is turned off; otherwise the kernel is asked
(``madvise(MADV_WILLNEED)``) to read up to ``_READ_AHEAD`` bytes ahead of the reader, half a
window at a time.

Resident pages: a sample held in a buffer keeps its shard's mapping alive, and every page of a
mapping that was touched counts in the process's RSS while it lives. So the reader drops the
pages it has passed from the page table (``madvise(MADV_DONTNEED)``; they stay in the page
cache, and a view read later faults its own pages back in) every ``_DROP_STEP`` bytes, and with
them those of the finished shards whose views live on; consumers that copy views out
(collation) report the bytes with :func:`copied_out`, which drops the finished shards' pages
every ``_DROP_STEP`` bytes too, so draining the buffers at an epoch's end, when no reader is
left, does not bring the held samples back into RSS.

Descriptors: before Python 3.13 a mapping holds a duplicate of its file's descriptor until it
is unmapped, which happens with its last payload view. Samples held in buffers keep their
shard's mapping alive, so with small shards and large buffers a process can hold dozens;
there, a shard is mapped only while the live mappings stay under a quarter of the soft limit
of open files (``RLIMIT_NOFILE``), and read (payloads copied) past it.

Measurements: benchmarks/README.md, "Shard reading".
"""

from __future__ import annotations

import io
import mmap
import os
import stat
import sys
import threading
import weakref
from typing import Any

from . import _readahead

__all__ = ["MappedFile", "NETWORK_FILE_SYSTEMS", "copied_out"]

# Where no read-ahead thread runs, the kernel is asked to have the next _READ_AHEAD bytes read
# (Measurements: benchmarks/README.md, "Shard reading", for the window's size).
_READ_AHEAD = 1 << 23
# Every _DROP_STEP bytes read (or copied out by collation), the pages more than _DROP_STEP
# behind the reader and those of the finished mappings held alive by views leave the page table
# (module docs, "Resident pages"). 8 MiB: the pipeline peaks at 387 MiB against 461 with
# 64 MiB, no slower (Measurements: benchmarks/README.md, "Peak RSS of mapped shards").
_DROP_STEP = 1 << 23
_finished: weakref.WeakSet = weakref.WeakSet()  # mappings read to the end, still alive
_finished_lock = threading.Lock()
_copied = 0  # bytes consumers copied out of views since the finished mappings were dropped
# Python 3.13+ can map without keeping a duplicate of the file descriptor; before, each
# mapping holds one until it is unmapped.
_MMAP_KWARGS: dict = {"trackfd": False} if sys.version_info >= (3, 13) else {}
# Where a mapping holds a descriptor, live mappings hold at most 1/_FD_SHARE of the soft limit
# of open files (RLIMIT_NOFILE, often 1024; see the module docs).
_FD_SHARE = 4
_live_mappings = 0
_live_lock = threading.Lock()


def _fd_budget() -> int:
    """How many live mappings may hold a descriptor in this process."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):  # no resource module (Windows)
        return 128
    if soft == resource.RLIM_INFINITY or soft <= 0:
        return 1 << 16
    return max(8, soft // _FD_SHARE)


def _may_map() -> bool:
    return bool(_MMAP_KWARGS) or _live_mappings < _fd_budget()


def _count_mapping(mapping: mmap.mmap) -> None:
    """Count ``mapping`` among the live ones until it is unmapped or collected."""
    global _live_mappings
    if _MMAP_KWARGS:  # it holds no descriptor
        return
    with _live_lock:
        _live_mappings += 1
    weakref.finalize(mapping, _uncount_mapping)


def _uncount_mapping() -> None:
    global _live_mappings
    with _live_lock:
        _live_mappings -= 1


def _local_file(stream: Any) -> Any | None:
    """The file object behind ``stream`` when it reads a local file's bytes unchanged (a
    ``FileIO`` or a plain ``BufferedReader`` over one, possibly in torch's ``StreamWrapper``);
    ``None`` for anything else (sockets, pipes, decompressors, ``BytesIO``, subclasses)."""
    if type(stream).__name__ == "StreamWrapper":  # torch's open_files; not imported here
        stream = getattr(stream, "file_obj", None)
    if type(stream) is io.BufferedReader:
        raw = stream.raw
    elif type(stream) is io.FileIO:
        raw = stream
    else:
        return None
    if type(raw) is not io.FileIO or stream.closed or not stream.readable():
        return None
    return stream


#: File systems whose read errors would reach a mapped page as SIGBUS: shards there are read,
#: not mapped, unless ``ShardReadOptions(mmap=True)`` asks for it (``fuse.*``: sshfs, s3fs...).
NETWORK_FILE_SYSTEMS = frozenset({
    "9p", "afs", "beegfs", "ceph", "cifs", "glusterfs", "gpfs", "lustre", "ncpfs", "nfs", "nfs4",
    "smb3", "smbfs", "virtiofs",
})
_mount_table: list[tuple[str, str]] | None = None


def _mounts() -> list[tuple[str, str]]:
    """``(mount point, file system type)`` of this process's mounts, longest point first
    (read once from ``/proc/self/mounts``; empty where there is none)."""
    global _mount_table
    if _mount_table is None:
        table = []
        try:
            with open("/proc/self/mounts", encoding="utf-8", errors="replace") as f:
                for line in f:
                    fields = line.split()
                    if len(fields) >= 3:  # spaces in mount points are written as \040
                        table.append((fields[1].replace("\\040", " "), fields[2]))
        except OSError:
            pass
        table.sort(key=lambda m: len(m[0]), reverse=True)
        _mount_table = table
    return _mount_table


def _on_network_fs(path: str) -> bool:
    """Whether ``path`` lies on a network or FUSE file system (see NETWORK_FILE_SYSTEMS)."""
    real = os.path.realpath(path)
    for point, fstype in _mounts():
        if real == point or real.startswith(point.rstrip("/") + "/"):
            return fstype in NETWORK_FILE_SYSTEMS or fstype.startswith("fuse")
    return False


class MappedFile:
    """A read-only mapping of a shard file, read from ``start`` like a stream.

    ``read`` copies (headers); ``view`` hands out zero-copy slices of the mapping (payloads).
    Reads stop at the mapped size: past it they come back short, as a stream's would at its
    end, and nothing beyond the mapping is ever touched. ``shrunk`` tells whether the file has
    become shorter than the mapping since (touching the cut part would raise SIGBUS).
    """

    __slots__ = ("map", "file", "buffer", "start", "pos", "size", "ahead", "helper", "drop_at")

    def __init__(self, mapping: mmap.mmap, start: int, file: Any, readahead: bool = True) -> None:
        self.map = mapping
        self.file = file
        self.buffer = memoryview(mapping)
        self.start = self.pos = start
        self.size = len(mapping)
        self.ahead = start - start % mmap.PAGESIZE  # read-ahead asked for up to here
        self.drop_at = start + 2 * _DROP_STEP  # pages behind the reader are dropped from here
        # Large files on Linux: a thread reads the file ahead of us (see _readahead); for the
        # others, madvise as we go.
        self.helper = _readahead.start_readahead(mapping, file.fileno(), start, readahead)
        if self.helper is not None:
            self.ahead = self.size  # no inline madvise

    @classmethod
    def open(cls, stream: Any, *, check_fs: bool = False,
             readahead: bool = True) -> MappedFile | None:
        """Map the local file behind ``stream`` from its current position, or ``None``
        (also, with ``check_fs``, for a file on a network or FUSE file system); with
        ``readahead``, a large file is read ahead by a thread (see the module docs)."""
        file = _local_file(stream)
        if file is None:
            return None
        name = getattr(file, "name", None)
        if check_fs and isinstance(name, str) and _on_network_fs(name):
            return None
        if not _may_map():  # as many mappings hold a descriptor as this process allows
            return None
        try:
            fd = file.fileno()
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            start = file.tell()
            mapping = mmap.mmap(fd, 0, access=mmap.ACCESS_READ, **_MMAP_KWARGS)
        except (OSError, ValueError):  # empty file, no mmap on this file system, ...
            return None
        if start >= len(mapping):
            mapping.close()
            return None
        _count_mapping(mapping)
        return cls(mapping, start, file, readahead)

    def _read_ahead(self, end: int) -> None:
        # Keep the kernel reading up to a window ahead of the reader (asked for half a window
        # at a time), as it does for sequential reads; pages not asked for are read on demand.
        # With a helper thread, only tell it where we are when it waits for us.
        if end + _READ_AHEAD // 2 <= self.ahead or self.ahead >= self.size:
            helper = self.helper
            if helper is not None and end >= helper.resume_at:
                helper.advance(end)
            return
        stop = max(end, self.ahead) + _READ_AHEAD
        stop = self.size if stop >= self.size else stop - stop % mmap.PAGESIZE
        try:
            self.map.madvise(mmap.MADV_WILLNEED, self.ahead, stop - self.ahead)
        except (AttributeError, OSError, ValueError):  # no madvise here: reads still work
            pass
        self.ahead = stop

    def read(self, n: int) -> bytes:
        end = min(self.pos + n, self.size)
        self._read_ahead(end)
        data = self.buffer[self.pos:end].tobytes()
        self.pos = end
        return data

    def view(self, n: int) -> memoryview:
        end = min(self.pos + n, self.size)
        self._read_ahead(end)
        data = self.buffer[self.pos:end]
        self.pos = end
        if end >= self.drop_at:
            _drop(self.map, end - _DROP_STEP)
            _drop_finished()
            self.drop_at = end + _DROP_STEP
        return data

    def skip(self, n: int) -> None:
        self.pos = min(self.pos + n, self.size)

    def shrunk(self) -> int | None:
        """The file's size now if it is smaller than the mapping, else ``None`` (also when
        the stream was closed: the mapping does not need it)."""
        if self.file.closed:
            return None
        try:
            now = os.fstat(self.file.fileno()).st_size
        except (OSError, ValueError):
            return None
        return now if now < self.size else None

    def release(self, finished: bool = False) -> None:
        """Unmap now unless payload views or a read-ahead thread still use the mapping (then
        it goes with them). A reader that ``finished`` the file lets its read-ahead thread
        finish too (the views handed out will be read); one that stopped early stops it."""
        if self.helper is not None:
            if finished:
                self.helper.advance(self.size)
            else:
                self.helper.stop()
        self.buffer.release()
        try:
            self.map.close()
        except BufferError:  # payload views live on: so does the mapping
            if finished:
                with _finished_lock:
                    _finished.add(self.map)


def _drop_finished() -> None:
    with _finished_lock:  # readers may run in threads
        finished = list(_finished)
    for mapping in finished:
        _drop(mapping)


def copied_out(nbytes: int) -> None:
    """A consumer (collation; the audio decoders, which read a payload from a copy) has copied
    ``nbytes`` out of read-only payload views: every ``_DROP_STEP`` bytes, the pages of the
    finished mappings leave the page table again (module docs, "Resident pages"). Without it,
    the samples still buffered when the last shard ends -- thousands at the end of an epoch --
    are read back in with no reader left to drop them."""
    global _copied
    _copied += nbytes
    if _copied >= _DROP_STEP:
        _copied = 0
        _drop_finished()


def _drop(mapping: mmap.mmap, end: int | None = None) -> None:
    """Take the pages of ``mapping`` before ``end`` (default: all) out of this process's page
    table (they stay in the page cache; views of them still read correctly, faulting them back
    in)."""
    try:
        end = len(mapping) if end is None else end
        end -= end % mmap.PAGESIZE
        if end > 0:
            mapping.madvise(mmap.MADV_DONTNEED, 0, end)
    except (AttributeError, OSError, ValueError):  # closed, or no madvise: only RSS differs
        pass
