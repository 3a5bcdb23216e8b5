"""The map-style DataLoader road of a :class:`~speechpipe.pipes.batching._views.BatchView`:
its batches of keys as a ``batch_sampler``."""

from __future__ import annotations

from typing import Any, Hashable, Iterator

from ...errors import check_int
from ...seeding import derive_seed

__all__ = ["ViewSampler"]


class ViewSampler:
    """The key lists of one epoch of a :class:`BatchView`, as a DataLoader ``batch_sampler``.

    ``DataLoader(dataset, batch_sampler=view.sampler(epoch), collate_fn=..., num_workers=...,
    pin_memory=..., generator=sampler.generator())`` loads ``dataset[key]`` for the keys of
    each batch, in the view's order, in the workers; ``len(loader)`` is exact. ``dataset`` is
    any map-style dataset indexed by the view's keys (a ``MapDataPipe``, a dict-backed
    ``Dataset``). Reuse one sampler across epochs with :meth:`set_epoch`.

    Args:
        view: the batching view.
        epoch: the epoch drawn.
        rank: this process's rank for a view with ``world_size > 1`` (its part of each batch);
            None for the global batches.
        start_step: batches of this epoch to skip (resuming).

    >>> from speechpipe.pipes.batching import BatchView, SampleCount
    >>> view = BatchView({"a": 1, "b": 2, "c": 3}, budget=SampleCount(2), shuffle=False)
    >>> sampler = view.sampler()
    >>> list(sampler), len(sampler)
    ([['c', 'b'], ['a']], 2)
    """

    def __init__(self, view: Any, epoch: int = 0, *, rank: int | None = None,
                 start_step: int = 0) -> None:
        if not isinstance(getattr(type(view), "batching_view", None), property):  # a BatchView
            raise TypeError(f"view must be a BatchView, got {view!r}")
        view._check_rank(rank, None)
        self.view = view
        self.rank = rank
        self.set_epoch(epoch, start_step=start_step)

    def set_epoch(self, epoch: int, *, start_step: int = 0) -> ViewSampler:
        """Draw ``epoch`` next, skipping ``start_step`` batches (returns the sampler)."""
        self.epoch = check_int("epoch", epoch, 0)
        self.start_step = self.view._check_start(start_step)
        return self

    def __iter__(self) -> Iterator[list[Hashable]]:
        yield from self.view.batches(self.epoch, rank=self.rank, start_step=self.start_step)

    def __len__(self) -> int:
        return len(self.view) - self.start_step

    def generator(self):
        """A ``torch.Generator`` seeded from ``(seed, epoch, rank)``, for the DataLoader's
        ``generator=``: worker seeds (``random``, ``numpy``, ``torch`` in each worker) are then
        reproducible, as SpeeChain's seeded ``worker_init_fn``."""
        import torch

        seed = derive_seed(self.view.seed, self.epoch, self.rank or 0, 0, "workers")
        return torch.Generator().manual_seed(seed)
