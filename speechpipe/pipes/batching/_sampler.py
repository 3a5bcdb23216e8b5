"""The map-style DataLoader road of a :class:`~speechpipe.pipes.batching._views.BatchView`:
its batches of keys as a ``batch_sampler``, with a state that ``StatefulDataLoader`` saves.

``torchdata``'s ``StatefulDataLoader`` asks its ``batch_sampler`` for ``state_dict()`` (without
workers when its own state is taken; with workers each time it hands out the index list of a
step it will snapshot, in the main process, where the batch sampler runs) and gives it back
through ``load_state_dict`` when its own state is loaded on the same number of workers. A
:class:`ViewSampler`'s state is one position: the view's batches consumed in the epoch. Over a
view with virtual streams (``BatchView(streams=V)``) that position counts **global** batches,
so it resumes any world size and number of workers: give the new topology's sampler the state
(its own, or the whole ``StatefulDataLoader`` state rank 0 saved, in which it finds its own)
and build a fresh DataLoader over it (a ``StatefulDataLoader`` refuses its own state saved
with another number of workers: torchdata's ``AssertionError``).
"""

from __future__ import annotations

import copy
import hashlib
import types
from typing import Any, Hashable, Iterator, Mapping

from ...errors import DataError, ResumeError, check_int
from ...seeding import derive_seed, process_position
from .._core import FINGERPRINT_VERSION, describe_differences, differences, stage_fields

__all__ = ["ViewSampler"]

#: Where a ``StatefulDataLoader`` state keeps its batch sampler's state: without workers at
#: its top, with workers in the main process's snapshot.
_SAMPLER_STATE = "_index_sampler_state"


class ViewSampler:
    """The key lists of one epoch of a :class:`BatchView`, as a DataLoader ``batch_sampler``.

    ``DataLoader(dataset, batch_sampler=view.sampler(epoch), collate_fn=..., num_workers=...,
    pin_memory=..., generator=sampler.generator())`` loads ``dataset[key]`` for the keys of
    each batch, in the view's order, in the workers; ``len(loader)`` is exact. ``dataset`` is
    any map-style dataset indexed by the view's keys (a ``MapDataPipe``, a dict-backed
    ``Dataset``). Reuse one sampler across epochs with :meth:`set_epoch`. The batch sampler
    runs in the main process, so the order does not depend on the number of workers.

    **Over virtual streams** (``BatchView(streams=V)``) rank ``r`` of ``W`` gets the whole
    global batches ``s * W + r`` of the epoch's plan (past its end, with ``uneven="pad"``, the
    epoch's first ones; ``"drop"`` leaves them out), ``len()`` counts this rank's steps, and
    ``start_step`` and the state count global batches: a state saved on any (world size,
    workers) resumes any other (:meth:`load_state_dict`).

    Args:
        view: the batching view.
        epoch: the epoch drawn.
        rank: this process's rank: for a view with ``world_size > 1`` its part of each batch
            (None: the global batches); over streams, by default ``torch.distributed``'s.
        world_size: over streams, the ranks (by default ``torch.distributed``'s); without
            streams, if given, it must equal the view's.
        start_step: batches of this epoch to skip (resuming; over streams, global batches).

    >>> from speechpipe.pipes.batching import BatchView, SampleCount
    >>> view = BatchView({"a": 1, "b": 2, "c": 3}, budget=SampleCount(2), shuffle=False)
    >>> sampler = view.sampler()
    >>> list(sampler), len(sampler)
    ([['c', 'b'], ['a']], 2)
    >>> state = sampler.state_dict()  # after the epoch: its 2 batches consumed
    >>> state["epoch"], state["batches"]
    (0, 2)
    """

    def __init__(self, view: Any, epoch: int = 0, *, rank: int | None = None,
                 world_size: int | None = None, start_step: int = 0) -> None:
        if not isinstance(getattr(type(view), "batching_view", None), property):  # a BatchView
            raise TypeError(f"view must be a BatchView, got {view!r}")
        if view.streams is None:
            view._check_rank(rank, world_size)
        else:
            if world_size is not None:
                check_int("world_size", world_size, 1)
            if rank is not None and not (isinstance(rank, int) and not isinstance(rank, bool)
                                         and 0 <= rank < (world_size or rank + 1)):
                raise ValueError(f"rank must be an int in [0, {world_size}), got {rank!r}")
        self.view = view
        self.rank = rank
        self.world_size = world_size
        self._live: dict | None = None  # the running (or last) pass
        self._loaded: int | None = None  # the epoch of a position loaded for the next pass
        self._fingerprint: dict | None = None
        self.set_epoch(epoch, start_step=start_step)

    def set_epoch(self, epoch: int, *, start_step: int | None = None) -> ViewSampler:
        """Draw ``epoch`` next, skipping ``start_step`` batches (returns the sampler); by
        default none, or the position :meth:`load_state_dict` loaded for this epoch."""
        epoch = check_int("epoch", epoch, 0)
        if start_step is None:
            start_step = self.start_step if self._loaded == epoch else 0
        self.epoch, self.start_step = epoch, self.view._check_start(start_step)
        self._loaded = self._loaded if self._loaded == epoch else None
        self._live = None
        return self

    def _where(self) -> tuple[int, int]:
        """(rank, world size) of the global batches over streams."""
        where = process_position()
        world = self.world_size if self.world_size is not None else where.world_size
        rank = self.rank if self.rank is not None else where.rank
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} is not in a world of {world}")
        return rank, world

    def __iter__(self) -> Iterator[list[Hashable]]:
        # Not a generator: the pass starts (and its state says so) when iter() is called,
        # as a StatefulDataLoader takes its first snapshot right after.
        view, epoch, start = self.view, self.epoch, self.start_step
        world = 1
        if view.streams is None:
            keys = view.batches(epoch, rank=self.rank, start_step=start)
        else:
            rank, world = self._where()
            keys = view.batches(epoch, rank=rank, world_size=world, start_step=start)
        self._loaded = None
        live = self._live = {"epoch": epoch, "start": start, "steps": 0, "world": world}
        return _counted(keys, live)

    def __len__(self) -> int:
        if self.view.streams is None:
            return len(self.view) - self.start_step
        return self.view.plan(self.epoch).steps(self._where()[1], start=self.start_step,
                                                uneven=self.view.uneven)

    def generator(self):
        """A ``torch.Generator`` seeded from ``(seed, epoch, rank)``, for the DataLoader's
        ``generator=``: worker seeds (``random``, ``numpy``, ``torch`` in each worker) are then
        reproducible, as SpeeChain's seeded ``worker_init_fn``."""
        import torch

        rank = (self.rank or 0) if self.view.streams is None else self._where()[0]
        seed = derive_seed(self.view.seed, self.epoch, rank, 0, "workers")
        return torch.Generator().manual_seed(seed)

    # ---------------------------------------------------------------- state

    def _epoch_batches(self, epoch: int) -> int:
        view = self.view
        return len(view) if view.streams is None else len(view.plan(epoch))

    def _consumed(self, epoch: int, position: int, world: int) -> int:
        """``position`` as the epoch's batches consumed: a pass that ran to its end (a padded
        last step, or ``"drop"`` leaving fewer than ``world`` batches) consumed the epoch."""
        total = self._epoch_batches(epoch)
        if self.view.uneven == "drop" and self.view.streams is not None \
                and total - position < world:
            return total
        return min(position, total)

    def state_dict(self) -> dict:
        """Where the sampler stands: ``{"epoch", "batches", "world_size", "fingerprint"}`` --
        the batches of the epoch consumed by the steps handed out so far (global batches over
        streams; the world size it was saved on, which the position does not depend on) and
        what decides the batches (:meth:`fingerprint`). With DataLoader workers the sampler
        runs ahead of the training loop (prefetch): save the ``StatefulDataLoader``'s state,
        which holds the sampler's as of a step it returned, and the steps since."""
        live = self._live
        if live is None:  # no pass since set_epoch: the start of the next one
            epoch, batches, world = self.epoch, self.start_step, 1
        else:
            epoch, world = live["epoch"], live["world"]
            batches = self._consumed(epoch, live["start"] + live["steps"] * world, world)
        return {"epoch": epoch, "batches": batches, "world_size": world,
                "fingerprint": copy.deepcopy(self.fingerprint())}

    def load_state_dict(self, state: Mapping) -> None:
        """Start the next pass where ``state`` stood: a :meth:`state_dict`, or the whole state
        of a ``StatefulDataLoader`` over a ViewSampler (this sampler's part is found in it,
        and the steps it took after its last snapshot are counted). Over streams the state
        may come from any world size and number of workers; the next :meth:`set_epoch` of
        the same epoch keeps the position.

        Raises:
            ResumeError: the state belongs to another view (each difference named: budget,
                seed, streams, lengths...).
            DataError: its position is past the end of its epoch.
        """
        state, since = _own_state(state)
        saved = state.get("fingerprint")
        if not isinstance(saved, Mapping) or saved.get("version") != FINGERPRINT_VERSION:
            raise ResumeError(f"the state has no fingerprint of version {FINGERPRINT_VERSION} "
                              f"(got {saved!r:.80}): it is not a ViewSampler's")
        found = differences(saved, self.fingerprint())
        if found:
            lines = "\n".join(f"  - {line}" for line in describe_differences(found))
            raise ResumeError(
                f"this state belongs to another view: {len(found)} difference"
                f"{'s' if len(found) != 1 else ''} in what decides the batches (saved -> "
                f"current):\n{lines}\nResume it with the view it was saved with", found)
        epoch = check_int("epoch", state.get("epoch"), 0)
        batches = state.get("batches")
        if not isinstance(batches, int) or isinstance(batches, bool) or batches < 0:
            raise ResumeError(f"the state's position must be an int >= 0, got {batches!r}")
        total = self._epoch_batches(epoch)
        if batches > total:
            raise DataError(
                f"the state's position {batches} is past the end of epoch {epoch}, which has "
                f"{total} batches: the state does not belong to this view (or was edited)",
                source="ViewSampler")
        if since:
            world = check_int("world_size", state.get("world_size", 1), 1)
            batches = self._consumed(epoch, batches + since * world, world)
        self.set_epoch(epoch, start_step=batches)
        self._loaded = epoch

    def fingerprint(self) -> dict:
        """What decides the view's batches (a loader fingerprint's shape: one stage,
        ``BatchView``, with its settings and a digest of the keys and their lengths)."""
        if self._fingerprint is None:
            view = self.view
            settings = types.SimpleNamespace(
                constraint=view.constraint, batches_fn=view.batches_fn, streams=view.streams,
                seed=view.seed, shuffle=view.shuffle, descending=view.descending,
                batches_per_epoch=view.batches_per_epoch, oversize=view.oversize,
                world_size=view.world_size, uneven=view.uneven)
            fields = {**stage_fields(settings), "lengths": _lengths_digest(view.lengths)}
            self._fingerprint = {"version": FINGERPRINT_VERSION, "loader": {},
                                 "stages": [["0:BatchView", fields]]}
        return self._fingerprint


def _counted(keys: list, live: dict) -> Iterator[list[Hashable]]:
    for batch in keys:
        live["steps"] += 1
        yield batch


def _own_state(state: Any) -> tuple[Mapping, int]:
    """A ViewSampler's state, and the steps taken after it, from its own state or a
    ``StatefulDataLoader``'s."""
    if not isinstance(state, Mapping):
        raise TypeError(f"state must be a dict from ViewSampler.state_dict() or "
                        f"StatefulDataLoader.state_dict(), got {state!r:.80}")
    since = 0
    if "_snapshot" in state:  # with workers: the main process's snapshot, and steps since
        since = state.get("_steps_since_snapshot", 0)
        snapshot = state["_snapshot"]
        main = snapshot.get("_main_snapshot") if isinstance(snapshot, Mapping) else None
        state = main.get(_SAMPLER_STATE) if isinstance(main, Mapping) else None
        if not isinstance(since, int) or isinstance(since, bool) or since < 0:
            raise ResumeError(f"the DataLoader state's steps since its snapshot must be an "
                              f"int >= 0, got {since!r}")
    elif _SAMPLER_STATE in state:  # without workers: taken with the loader's own
        state = state[_SAMPLER_STATE]
    if not isinstance(state, Mapping):
        raise TypeError("the DataLoader state holds no ViewSampler state: was its "
                        "batch_sampler a ViewSampler?")
    return state, since


def _lengths_digest(lengths: Mapping) -> dict:
    """``{"items": n, "digest": ...}`` of the keys and their lengths (in key order)."""
    joined = "\0".join(f"{k!r}\t{v!r}" for k, v in sorted(lengths.items(),
                                                          key=lambda kv: repr(kv[0])))
    digest = hashlib.sha256(joined.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return {"items": len(lengths), "digest": digest}
