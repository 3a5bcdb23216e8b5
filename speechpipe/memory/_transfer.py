"""Reused shared memory for batches sent from DataLoader workers to the main process.

A batch collated in a DataLoader worker is sent to the main process in shared memory. torch
makes a fresh shared segment for every batch: the worker creates it and faults in every page
as the rows are copied in (zero-filled by the kernel), the main process maps it and faults in
every page again, and both free it: for a batch of megabytes, most of the worker's time per
batch, enough to bound a loader whose workers fill the cores.

With :func:`speechpipe.loader.build_loader` (``reuse_shared_memory=True``, the default with
workers), each worker keeps a small pool of shared segments (*slots*) and collates into them
(:class:`~speechpipe.pipes.collate.PadCollate` asks :func:`take`): a slot's pages are
already there, nothing is created. A slot is reused only after the main process has let go
of the batch that used it:

- the main process owns a table of flags in shared memory, one row per worker, one int64 per
  slot: 0 means free; the worker writes a tag (its pid and a sequence number, never 0) when
  it hands the slot out with a batch;
- the batch travels as :class:`PooledBatch` (the batch plus its slots' tags); unpickled in the
  main process it becomes the plain batch again, and for each slot a weak reference to the
  main process's storage is registered (:func:`_rebuild`);
- a slot's segment crosses to the main process once: torch passes every shared storage as a
  file descriptor, which costs a connection to the sending worker (its resource-sharer
  thread, with an authentication handshake, which the worker's interpreter must answer).
  The main process keeps each slot's segment
  mapped and records its generation in a second shared table; while it matches, the worker
  sends only where the tensor lies in the slot (:class:`_SlotRef`), and the main process
  gives the batch a view of the mapping with a storage of its own, whose death frees the
  slot. With workers that are not persistent, a pass's mappings are let go when it ends
  (or when the next pass starts, if it was left early); batches still held keep theirs;
- tensors under :data:`MIN_BYTES` (lengths, counts, small labels) travel as bytes inside the
  pickle (:class:`_Inline`), not as shared memory;
- whenever a batch arrives (and when a pass starts), the main process clears the flag of
  every registered slot whose storage has died (no tensor of it left: the batch was consumed,
  or copied by the pin-memory thread) -- only if the flag still holds that batch's tag, so a
  slot that a later worker took in between is never freed by mistake;
- a worker takes a slot only when its flag is 0 or holds another process's tag (a batch of an
  earlier worker of the loader: its memory is that worker's segment). With no free slot large
  enough (the main process holds many batches, or a batch never reached it), the worker makes
  a fresh segment as torch does: slower, never wrong.

Limits: at most :data:`SLOTS` slots and :data:`MAX_BYTES` per worker, and a slot is made
only while ``/dev/shm`` has room for four more of its size (shared memory stays allocated
while the worker lives; where ``/dev/shm`` is small, as Docker's default 64 MB, slots are
rarely made and batches go as torch sends them; ``reuse_shared_memory=False`` turns slots
off); only tensors of :data:`MIN_BYTES` or more use slots; a collated tensor the worker drops
instead of yielding, or a batch the main process discards (a pass left early with persistent
workers), keeps its slot until the worker exits.

Measurements: benchmarks/README.md, "Worker transfer".
"""

from __future__ import annotations

import itertools
import math
import os
import threading
import weakref
from typing import Any

import numpy as np
import torch
from torch.multiprocessing.reductions import StorageWeakRef

__all__ = [
    "MAX_BYTES", "MIN_BYTES", "PoolStats", "PooledBatch", "SLOTS", "forget_table", "install",
    "keep_table_while", "new_table", "release_now", "take",
]

#: Slots per worker.
SLOTS = 16
#: Shared memory a worker keeps in its slots, at most.
MAX_BYTES = 512 << 20
#: Tensors smaller than this are allocated as torch does.
MIN_BYTES = 64 << 10
_ROUND = 1 << 20  # slot capacities are whole MiB, with a quarter of headroom when grown


class PoolStats:
    """Counts of one worker's pool (for tests and benchmarks)."""

    def __init__(self) -> None:
        self.reused = 0  # tensors placed in a slot that already existed
        self.created = 0  # slots created or grown
        self.fallbacks = 0  # tensors given a fresh segment: no free slot fitted

    def __repr__(self) -> str:
        return (f"PoolStats(reused={self.reused}, created={self.created}, "
                f"fallbacks={self.fallbacks})")


class _Pool:
    """A worker's slots: shared storages, and the worker's row of the main process's flags."""

    def __init__(self, key: str, worker: int, flags: torch.Tensor, known: torch.Tensor) -> None:
        self.key = key
        self.worker = worker
        self.flags = flags[worker].numpy()  # shared with the main process
        self.known = known[worker].numpy()  # the main process's mapped generation per slot
        self.known[:] = 0  # a new process: the main process maps none of its slots
        self.storages: list[torch.UntypedStorage | None] = [None] * len(self.flags)
        self.gens = [0] * len(self.flags)  # generation of each slot's segment (never 0)
        self.handed: dict[int, tuple[int, int]] = {}  # data_ptr -> (slot, tag)
        self.tags = itertools.count(1)
        self.generations = itertools.count(1)
        self.pid_bits = os.getpid() & 0x7FFFFFFF
        self.base = self.pid_bits << 32
        self.lock = threading.Lock()
        self.stats = PoolStats()

    def take(self, nbytes: int) -> torch.UntypedStorage | None:
        """A slot's storage of at least ``nbytes``, flagged as handed out; None: no slot."""
        with self.lock:
            # Free: flag 0, or a tag of another process -- an earlier worker of this loader
            # (workers are new each epoch unless persistent) whose batch the main process has
            # not let go of, or never received: its memory is that worker's segment, not one
            # of these, and the main process clears a flag only if it still holds its tag.
            # (A slot handed out by this process holds this process's tag: never free.)
            free = [s for s in range(len(self.flags))
                    if self.flags[s] == 0 or int(self.flags[s]) >> 32 != self.pid_bits]
            fitting = [s for s in free if self.storages[s] is not None
                       and self.storages[s].nbytes() >= nbytes]
            if fitting:
                slot = min(fitting, key=lambda s: self.storages[s].nbytes())
                self.stats.reused += 1
            else:
                slot = self._grow(free, nbytes)
                if slot is None:
                    self.stats.fallbacks += 1
                    return None
            storage = self.storages[slot]
            tag = self.base | (next(self.tags) & 0xFFFFFFFF)  # never 0: base holds the pid
            self.flags[slot] = tag
            self.handed[storage.data_ptr()] = (slot, tag)
            return storage

    def _grow(self, free: list[int], nbytes: int) -> int | None:
        """Make (or enlarge) a free slot for ``nbytes``, within :data:`MAX_BYTES`."""
        if not free:
            return None
        empty = [s for s in free if self.storages[s] is None]
        slot = empty[0] if empty else max(free, key=lambda s: self.storages[s].nbytes())
        capacity = -(-int(nbytes * 1.25) // _ROUND) * _ROUND
        held = sum(s.nbytes() for i, s in enumerate(self.storages) if s is not None and i != slot)
        if held + capacity > MAX_BYTES or _shm_free() < 4 * capacity:
            return None
        self.storages[slot] = None  # the old segment goes before the new one is made
        self.storages[slot] = torch.UntypedStorage._new_shared(capacity)
        self.gens[slot] = self.base | (next(self.generations) & 0xFFFFFFFF)
        self.stats.created += 1
        return slot

    def wrap(self, item: Any) -> Any:
        """``item`` as a :class:`PooledBatch` naming the slots its tensors use, and sending its
        small tensors inline (or as is: no tensor in it)."""
        entries = []
        small = False
        with self.lock:
            for path, tensor in _tensors(item):
                found = (self.handed.pop(tensor.untyped_storage().data_ptr(), None)
                         if self.handed else None)
                if found is not None:
                    entries.append((found[0], found[1], path))
                elif _inline(tensor):
                    small = True
        if not entries and not small:
            return item
        return PooledBatch(item, self.key, self.worker, entries, self)

    def pickled(self, item: Any, entries: list) -> Any:
        """``item`` with its slot tensors as :class:`_SlotRef` (the segment itself only when
        the main process has not mapped it yet) and its small tensors as numpy arrays."""
        slots = {}
        for slot, _, path in entries:
            tensor = _at(item, path)
            storage = self.storages[slot]
            gen = self.gens[slot]
            mapped = int(self.known[slot]) == gen
            slots[path] = _SlotRef(slot, gen, None if mapped else storage, tensor.dtype,
                                   tuple(tensor.shape), tuple(tensor.stride()),
                                   tensor.storage_offset())
        return _replace(item, slots)


def _shm_free() -> float:
    """Free bytes of the shared-memory file system (``/dev/shm``), or infinity if unknown.

    A slot is kept only while four more of its size would still fit, so that slots never
    take the room torch's own fresh segments need (a full ``/dev/shm`` is a SIGBUS, not an
    error, when a page is first written).
    """
    try:
        stat = os.statvfs("/dev/shm")
    except (OSError, AttributeError):
        return float("inf")
    return float(stat.f_bavail) * stat.f_frsize


_pool: _Pool | None = None  # this worker's pool, installed by speechpipe.loader.PipeDataset


def install(worker: int, key: str, flags: torch.Tensor, known: torch.Tensor) -> _Pool:
    """Give this process (a DataLoader worker) a pool over ``flags[worker]``."""
    global _pool
    if _pool is None or _pool.key != key or _pool.worker != worker:
        _pool = _Pool(key, worker, flags, known)
    return _pool


def take(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor | None:
    """An uninitialised tensor for a batch: in one of this worker's slots, or, when small, in
    private memory (it is sent inline); None when pooling is off here or no slot is free (the
    caller then allocates as torch does)."""
    pool = _pool
    if pool is None:
        return None
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes < MIN_BYTES:
        return torch.empty(shape, dtype=dtype) if dtype in _NUMPY_DTYPES else None
    storage = pool.take(nbytes)
    if storage is None:
        return None
    out = torch.empty(0, dtype=dtype)
    return out.set_(storage, 0, shape)


def _tensors(item: Any, path: tuple = (), depth: int = 0):
    """``(path, tensor)`` of the tensors in a batch (dicts, lists, tuples; a few levels)."""
    if isinstance(item, torch.Tensor):
        yield path, item
    elif depth < 4 and isinstance(item, dict):
        for key, value in item.items():
            yield from _tensors(value, path + (key,), depth + 1)
    elif depth < 4 and isinstance(item, (list, tuple)):
        for i, value in enumerate(item):
            yield from _tensors(value, path + (i,), depth + 1)


def _at(item: Any, path: tuple) -> Any:
    for step in path:
        item = item[step]
    return item


# dtypes that travel inline as numpy arrays (not bfloat16 and the like: numpy lacks them)
_NUMPY_DTYPES = frozenset((torch.float16, torch.float32, torch.float64, torch.int8, torch.int16,
                           torch.int32, torch.int64, torch.uint8, torch.bool, torch.complex64,
                           torch.complex128))


def _inline(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is sent as bytes in the pickle rather than as shared memory: small,
    on the CPU, a plain tensor of a dtype numpy has (its bytes are copied once; sharing it
    would pass a file descriptor, a connection to the worker per tensor)."""
    return (type(tensor) is torch.Tensor and tensor.device.type == "cpu"
            and not tensor.requires_grad and tensor.dtype in _NUMPY_DTYPES
            and tensor.numel() * tensor.element_size() < MIN_BYTES)


def _replace(item: Any, slots: dict, path: tuple = (), depth: int = 0) -> Any:
    """A copy of ``item``'s containers with the tensors at ``slots``' paths replaced by their
    references and small tensors by numpy arrays (the same walk as :func:`_tensors`)."""
    if isinstance(item, torch.Tensor):
        if path in slots:
            return slots[path]
        if _inline(item):
            return _Inline(item.resolve_conj().resolve_neg().numpy())  # (self if unset)
        return item
    if depth < 4 and isinstance(item, dict):
        return type(item)((key, _replace(value, slots, path + (key,), depth + 1))
                          for key, value in item.items()) if type(item) is dict else item
    if depth < 4 and isinstance(item, (list, tuple)) and type(item) in (list, tuple):
        return type(item)(_replace(value, slots, path + (i,), depth + 1)
                          for i, value in enumerate(item))
    return item


class _Inline:
    """A small tensor in transit, as a numpy array (pickled by value)."""

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def __reduce__(self):
        return (_Inline, (self.array,))


class _SlotRef:
    """A tensor in transit that lives in a worker's slot: where it is in the slot's segment,
    and the segment itself only the first time (the main process then keeps it mapped)."""

    __slots__ = ("slot", "gen", "storage", "dtype", "shape", "stride", "offset")

    def __init__(self, slot, gen, storage, dtype, shape, stride, offset) -> None:
        self.slot, self.gen, self.storage = slot, gen, storage
        self.dtype, self.shape, self.stride, self.offset = dtype, shape, stride, offset

    def __reduce__(self):
        return (_SlotRef, (self.slot, self.gen, self.storage, self.dtype, self.shape,
                           self.stride, self.offset))


class PooledBatch:
    """A batch in transit from a worker, with the slots its tensors use; unpickled in the main
    process it is the plain batch again (see the module documentation)."""

    __slots__ = ("item", "key", "worker", "entries", "pool")

    def __init__(self, item: Any, key: str, worker: int, entries: list,
                 pool: _Pool | None = None) -> None:
        self.item, self.key, self.worker, self.entries = item, key, worker, entries
        self.pool = pool

    def __reduce__(self):
        item = self.item if self.pool is None else self.pool.pickled(self.item, self.entries)
        return (_rebuild, (item, self.key, self.worker, self.entries))


# ----------------------------------------------------------------------------- main process

_flags: dict[str, torch.Tensor] = {}  # the flag tables of this process's loaders, by key
_known: dict[str, torch.Tensor] = {}  # their tables of mapped slot generations
_maps: dict[tuple[str, int, int], tuple[int, torch.UntypedStorage]] = {}  # -> (gen, segment)
_live: list[tuple[StorageWeakRef, Any, int, int, int]] = []  # (ref, flags, worker, slot, tag)
_lock = threading.Lock()


def new_table(num_workers: int) -> tuple[str, torch.Tensor, torch.Tensor]:
    """A loader's tables, registered in this (the main) process: the slot flags and the
    generation of each slot's segment that this process keeps mapped (0: none)."""
    key = os.urandom(8).hex()
    flags = torch.zeros((num_workers, SLOTS), dtype=torch.int64).share_memory_()
    known = torch.zeros((num_workers, SLOTS), dtype=torch.int64).share_memory_()
    _flags[key] = flags
    _known[key] = known
    return key, flags, known


def forget_table(key: str) -> None:
    _flags.pop(key, None)
    _known.pop(key, None)
    forget_segments(key)


def forget_segments(key: str) -> None:
    """Unmap the workers' segments kept for the loader ``key`` (its workers are gone: a pass
    of workers that are not persistent has ended, or the next starts; batches still held keep
    their own segment alive)."""
    with _lock:
        for name in [name for name in _maps if name[0] == key]:
            del _maps[name]
        known = _known.get(key)
        if known is not None:
            known.numpy()[:] = 0


def keep_table_while(owner: Any, key: str) -> None:
    """Unregister the table ``key`` when ``owner`` is garbage collected."""
    weakref.finalize(owner, forget_table, key)


class _Segment:
    """Holds a mapped segment while a batch's view of it lives (numpy's array interface)."""

    __slots__ = ("segment", "__array_interface__")

    def __init__(self, segment: torch.UntypedStorage) -> None:
        self.segment = segment
        self.__array_interface__ = {"data": (segment.data_ptr(), False), "version": 3,
                                    "shape": (segment.nbytes(),), "typestr": "|u1"}


def _set(item: Any, path: tuple, value: Any) -> Any:
    """``item`` with the value at ``path`` replaced (containers were copied when pickled)."""
    if not path:
        return value
    parent = _at(item, path[:-1])
    if isinstance(parent, tuple):  # rebuild the tuple up the path
        changed = parent[:path[-1]] + (value,) + parent[path[-1] + 1:]
        return _set(item, path[:-1], changed)
    parent[path[-1]] = value
    return item


def _rebuild(item: Any, key: str, worker: int, entries: list) -> Any:
    item = _restore_inline(item)
    table = _flags.get(key)
    if table is None:  # not the process that built the loader: nothing to release
        return _materialise_here(item, entries)
    flags = table.numpy()
    known = _known[key].numpy()
    with _lock:
        _release_expired()
        for slot, tag, path in entries:
            value = _at(item, path)
            if isinstance(value, _SlotRef):
                value = _view(key, worker, value, known)
                item = _set(item, path, value)
            _live.append((StorageWeakRef(value.untyped_storage()), flags, worker, slot, tag))
    return item


def _view(key: str, worker: int, ref: _SlotRef, known: Any) -> torch.Tensor:
    """The tensor ``ref`` stands for, with a storage of its own over the kept mapping (its
    death frees the slot); maps the segment when it came along (under ``_lock``)."""
    name = (key, worker, ref.slot)
    if ref.storage is not None:
        _maps[name] = (ref.gen, ref.storage)
        known[worker, ref.slot] = ref.gen
    gen, segment = _maps.get(name, (None, None))
    if gen != ref.gen:  # pragma: no cover - the worker sends a segment until it is known here
        raise RuntimeError(f"speechpipe.memory._transfer: worker {worker}'s slot {ref.slot} arrived "
                           f"without its memory (generation {ref.gen:#x}, mapped {gen})")
    base = torch.from_numpy(np.asarray(_Segment(segment)))
    out = torch.empty(0, dtype=ref.dtype)
    return out.set_(base.view(ref.dtype).untyped_storage(), ref.offset, ref.shape, ref.stride)


def _materialise_here(item: Any, entries: list) -> Any:
    """Slot references as plain tensors, in a process that keeps no mappings."""
    for _, _, path in entries:
        ref = _at(item, path)
        if isinstance(ref, _SlotRef):
            if ref.storage is None:
                raise RuntimeError("speechpipe.memory._transfer: a batch of a loader's worker was "
                                   "unpickled in a process other than the loader's")
            out = torch.empty(0, dtype=ref.dtype)
            item = _set(item, path, out.set_(ref.storage, ref.offset, ref.shape, ref.stride))
    return item


def _restore_inline(item: Any, depth: int = 0) -> Any:
    if isinstance(item, _Inline):
        return torch.from_numpy(item.array)
    if depth < 4 and type(item) is dict:
        for name, value in item.items():
            if isinstance(value, (_Inline, dict, list, tuple)):
                item[name] = _restore_inline(value, depth + 1)
        return item
    if depth < 4 and type(item) is list:
        for i, value in enumerate(item):
            if isinstance(value, (_Inline, dict, list, tuple)):
                item[i] = _restore_inline(value, depth + 1)
        return item
    if depth < 4 and type(item) is tuple:
        return tuple(_restore_inline(value, depth + 1) for value in item)
    return item


def _release_expired() -> None:
    """Free the slots whose batches the main process no longer holds (under ``_lock``)."""
    if not _live:
        return
    kept = []
    for entry in _live:
        ref, flags, worker, slot, tag = entry
        if ref.expired():
            if flags[worker, slot] == tag:  # a later batch may have the slot: leave it
                flags[worker, slot] = 0
        else:
            kept.append(entry)
    _live[:] = kept


def release_now() -> None:
    """Free the slots whose batches the main process no longer holds (a pass starting)."""
    with _lock:
        _release_expired()
