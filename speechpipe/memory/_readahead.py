"""Reading a memory-mapped shard ahead of its reader, in a thread that does not hold the GIL.

A mapped shard (:mod:`speechpipe.pipes.shards._reader`) is read by touching its pages: a page not yet
in the page cache costs a wait for the disk in the thread that touches it -- the training
loop's own thread when there are no DataLoader workers. :class:`ReadAhead` moves that wait to a
helper thread that runs up to ``_AHEAD`` bytes ahead of the reader, one ``_CHUNK`` at a time,
``os.preadv`` of the chunk into one small reused buffer: the kernel reads the file with its
sequential read-ahead and copies each page once, so every page is in the page cache *and* has
been touched by a CPU before the reader needs it (on a virtual machine whose memory the host
backs lazily, the first CPU access to a page the disk has just filled costs the host's fault,
charged to whichever thread touches it first).

``os.preadv`` releases the GIL; the helper takes it only between chunks: a Python thread asking
for the GIL while another runs Python code waits up to the switch interval, so a helper working
in small steps falls behind a busy reader.

The helper does not enter pages in the mapping's page table (``MADV_POPULATE_READ``, as it did
before issue 23.8): a pipeline's buffers put thousands of samples between the reader and the
consumer that touches their bytes, pages passed by the reader leave the page table again
(:mod:`speechpipe.memory._mmap`, "Resident pages"), so pages populated ahead of the reader were
dropped before they were used and only counted in the process's RSS meanwhile (370 MiB of
the issue's pipeline's peak).

A file found in the page cache when it is opened (``mincore`` at ``_PROBES`` places) gets no
helper: there is nothing to read.

No helper (:func:`start` returns ``None``) for files under ``_MIN_SIZE``, on other systems
than Linux, and when not wanted (``ShardReadOptions(readahead=False)``): the caller then
asks the kernel for read-ahead (``MADV_WILLNEED``) as it reads.

Measurements: benchmarks/README.md, "Shard reading" (why the copy, why large steps, and the
throughput with and without the helper, cold and warm) and "Peak RSS of mapped shards".
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
import threading
from typing import Any

__all__ = ["ReadAhead", "start_readahead", "supported"]

_CHUNK = 64 << 20
_AHEAD = 256 << 20
_MIN_SIZE = 16 << 20
# One buffer per helper, used for every iovec of a preadv: 256 KiB stays in the CPU's cache and
# 256 iovecs cover a 64 MiB chunk (IOV_MAX is 1024 on Linux).
_BUFFER = 256 << 10
# Residency is sampled at _PROBES places of _PROBE bytes.
_PROBES = 16
_PROBE = 256 << 10

_libc: Any = None


def _load_libc() -> Any:
    global _libc
    if _libc is None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        libc.mincore.restype = ctypes.c_int
        _libc = libc
    return _libc


def supported() -> bool:
    """Whether helpers can run here (Linux, with ``os.preadv``)."""
    return sys.platform.startswith("linux") and hasattr(os, "preadv")


def _address(mapping: mmap.mmap) -> int:
    """The address of ``mapping``'s first byte (read-only buffers have no ctypes accessor)."""
    import numpy as np

    view = np.frombuffer(mapping, dtype=np.uint8)
    try:
        return view.ctypes.data
    finally:
        del view  # release the buffer export: the mapping must stay closable


class ReadAhead:
    """The helper thread of one mapped file; made by :func:`start`.

    The reader reports its position with :meth:`advance` (called when the helper waits for it)
    and, when it stops before the end of the file, ends the helper with :meth:`stop`. A reader
    that got to the end leaves the helper to finish on its own: the payloads it handed out are
    still to be read. The helper holds a buffer export of the mapping while it runs, so the
    mapping cannot be closed under it (``mmap.close`` raises ``BufferError``); it is unmapped
    when the helper and the payload views are gone.

    Attributes (for tests and diagnosis):
        copied: bytes read with ``preadv``.
        reached: where the helper has got to (a byte offset).
    """

    __slots__ = ("resume_at", "reader", "copied", "reached", "_stop", "_wake", "_thread")

    def __init__(self, reader: int) -> None:
        self.resume_at = float("inf")  # the reader wakes the helper once it passes this
        self.reader = reader
        self.copied = 0
        self.reached = 0
        self._stop = False
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def advance(self, position: int) -> None:
        """The reader is at ``position``: let a waiting helper go on."""
        self.reader = position
        self.resume_at = float("inf")
        self._wake.set()

    def stop(self) -> None:
        """End the helper: it finishes the chunk it is reading (if any), then exits."""
        self._stop = True
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()


def start_readahead(mapping: mmap.mmap, fd: int, start: int, wanted: bool = True) -> ReadAhead | None:
    """Start a helper for ``mapping`` (of the file open as ``fd``) from ``start``; ``None``
    when not ``wanted``, not :func:`supported`, the rest of the file is under ``_MIN_SIZE`` or
    in the page cache already."""
    size = len(mapping)
    if not wanted or size - start < _MIN_SIZE or not supported():
        return None
    first = start - start % mmap.PAGESIZE
    try:
        libc = _load_libc()
        address = _address(mapping)
        if _resident(libc, address + first, size - first):
            return None
        own_fd = os.dup(fd)
    except (OSError, AttributeError, ValueError):
        return None
    state = ReadAhead(start)
    pin = memoryview(mapping)  # released by the thread when it ends
    thread = threading.Thread(target=_run, args=(state, pin, own_fd, first),
                              name="speechpipe-shard-readahead", daemon=True)
    state._thread = thread
    try:
        thread.start()
    except RuntimeError:  # no more threads (interpreter shutting down, limits)
        pin.release()
        os.close(own_fd)
        return None
    return state


def _resident(libc: Any, address: int, length: int) -> bool:
    """Whether the pages at ``_PROBES`` evenly spaced places of the range (``_PROBE`` bytes
    each) are all in the page cache: a sample, since ``mincore`` over a whole shard costs a
    noticeable part of a warm pass (benchmarks/README.md, "Shard reading"). A file read in part
    only comes out cold (unless every probe falls in the part read) and is read again."""
    probe = min(_PROBE, length)
    vector = (ctypes.c_ubyte * -(-probe // mmap.PAGESIZE))()
    last = length - probe
    for i in range(_PROBES):
        offset = last * i // (_PROBES - 1)
        offset -= offset % mmap.PAGESIZE
        if libc.mincore(address + offset, probe, vector) != 0:
            return False
        if bytes(vector).find(0) >= 0:  # the low bit is "resident"; the others are 0
            return False
    return True


def _run(state: ReadAhead, pin: memoryview, fd: int, pos: int) -> None:
    """The helper's loop. ``pin`` (a view of the whole mapping) keeps the mapping mapped until
    the loop ends; ``fd`` is its own descriptor. It touches nothing of the reader's but
    ``state``."""
    size = len(pin)
    try:
        buffers = [bytearray(_BUFFER)] * (_CHUNK // _BUFFER)
        while pos < size and not state._stop:
            if pos >= state.reader + _AHEAD:  # far enough ahead: wait for the reader
                state._wake.clear()
                state.resume_at = pos - _AHEAD
                if state.reader < pos - _AHEAD:
                    state._wake.wait(1.0)
                continue
            n = min(_CHUNK, size - pos)
            got = os.preadv(fd, buffers[:-(-n // _BUFFER)], pos)
            state.copied += got
            if got < n:  # the file shrank: the reader says so itself
                break
            pos += n
            state.reached = pos
    except OSError:  # an I/O error: the reader meets it itself (see shards' SIGBUS note)
        pass
    finally:
        os.close(fd)
        pin.release()
