"""Derived seeds: every random choice in speechpipe comes from (seed, epoch, rank, worker).

One helper, :func:`derive_seed`, turns the tuple into a 64-bit seed with a hash, so that
nearby tuples give unrelated streams (``seed + epoch`` would make seed 1 epoch 0 equal seed 0
epoch 1). :func:`process_position` reads the rank from ``torch.distributed`` when it is
initialised and the worker from the DataLoader, so pipes never read environment variables,
time or pids. DataLoader workers started by ``spawn`` or ``forkserver`` (the default on macOS,
and on Linux from Python 3.14) begin without the process group: :func:`pin_rank`, called in
the worker when the pipeline is unpickled -- by :class:`speechpipe.loader.PipeDataset` and by
every seeded speechpipe pipe (``sharded_shuffle``, ``bucket_by_length``, ``block_batch``, the
audio augmentations...) with the rank of the process that pickled it -- gives them their rank.
A pipeline of torch's pipes only (e.g. ``sharding_filter``) gets its rank from the DataLoader.
"""

from __future__ import annotations

import hashlib
import random
import struct
from dataclasses import dataclass

__all__ = ["CarriesRank", "Position", "derive_rng", "derive_seed", "pin_rank",
           "process_position"]

_pinned: tuple[int, int] | None = None  # (rank, world size) given to this worker process


def derive_seed(seed: int, epoch: int = 0, rank: int = 0, worker: int = 0, *salt: int | str) -> int:
    """A 64-bit seed from ``(seed, epoch, rank, worker, *salt)``.

    >>> derive_seed(0, 1) == derive_seed(0, 1)
    True
    >>> derive_seed(1, 0) != derive_seed(0, 1)
    True
    """
    h = hashlib.blake2b(digest_size=8)
    for part in (seed, epoch, rank, worker, *salt):
        if isinstance(part, str):
            h.update(b"s" + part.encode("utf-8"))
        else:
            h.update(b"i" + struct.pack("<q", int(part)))
    return int.from_bytes(h.digest(), "little")


def derive_rng(seed: int, epoch: int = 0, rank: int = 0, worker: int = 0, *salt) -> random.Random:
    """A ``random.Random`` seeded with :func:`derive_seed`.

    >>> derive_rng(3, 2).random() == derive_rng(3, 2).random()
    True
    """
    return random.Random(derive_seed(seed, epoch, rank, worker, *salt))


@dataclass(frozen=True)
class Position:
    """Where this process stands: distributed rank and world size, DataLoader worker."""

    rank: int = 0
    world_size: int = 1
    worker: int = 0
    num_workers: int = 1


def pin_rank(rank: int, world_size: int) -> None:
    """Set the rank :func:`process_position` reports when ``torch.distributed`` is not
    initialised in this process (a DataLoader worker started by ``spawn``).

    >>> pin_rank(0, 1)
    """
    global _pinned
    if not (isinstance(rank, int) and isinstance(world_size, int) and 0 <= rank < world_size):
        raise ValueError(f"need 0 <= rank < world_size, got {rank}, {world_size}")
    _pinned = (rank, world_size)


def process_position() -> Position:
    """Rank from ``torch.distributed`` (if initialised) and worker from the DataLoader.

    >>> process_position()
    Position(rank=0, world_size=1, worker=0, num_workers=1)
    """
    import torch.distributed as dist
    import torch.utils.data

    rank, world = 0, 1
    if dist.is_available() and dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
    elif _pinned is not None:
        rank, world = _pinned
    info = torch.utils.data.get_worker_info()
    if info is None:
        return Position(rank, world, 0, 1)
    return Position(rank, world, info.id, info.num_workers)


def _distributed_initialized() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


class CarriesRank:
    """Mixin of objects that go to DataLoader workers: the pickle holds the rank and world size
    of the process that made it, and unpickling in a process without ``torch.distributed``
    (a worker started by spawn) pins them there (:func:`pin_rank`).

    >>> class Thing(CarriesRank):
    ...     pass
    >>> state = Thing().__getstate__()
    >>> state["_pickled_rank"]
    (0, 1)
    >>> copy = Thing.__new__(Thing)
    >>> copy.__setstate__(state)
    >>> "_pickled_rank" in copy.__dict__
    False
    """

    def __getstate__(self) -> dict:
        state = dict(super().__getstate__() or {})  # object's and IterDataPipe's: __dict__
        where = process_position()
        state["_pickled_rank"] = (where.rank, where.world_size)
        return state

    def __setstate__(self, state: dict) -> None:
        state = dict(state)
        rank = state.pop("_pickled_rank", None)
        self.__dict__.update(state)
        if rank is not None and not _distributed_initialized():
            pin_rank(*rank)
