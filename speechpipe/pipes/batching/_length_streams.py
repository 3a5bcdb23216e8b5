"""Virtual streams over an in-memory table of lengths: the map-style road's planning
(:class:`~speechpipe.pipes.batching.BatchView` with ``streams=V``), by
:func:`~speechpipe.pipes.batching._streams.plan_stream_batches`' planning."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from ...errors import check_int
from ...seeding import derive_seed
from ..order import FeistelOrder
from ._constraints import BatchConstraint, SampleCount
from ._streams import STREAM_SALT, StreamPlan, plan_arrays, plan_stream_batches

__all__ = ["LengthStreams", "dealt_items"]


def dealt_items(n: int, key: int, streams: int) -> list[np.ndarray]:
    """Items ``0 .. n - 1`` dealt to ``streams`` virtual streams: a keyed permutation
    (:class:`~speechpipe.pipes.order.FeistelOrder`), stream ``v`` reading its positions
    ``v, v + V, ...``; each stream's items in reading order.

    >>> [s.tolist() for s in dealt_items(3, key=5, streams=2)]
    [[2, 1], [0]]
    """
    return [FeistelOrder(n, key, v, streams).take() for v in range(streams)]


class LengthStreams:
    """Virtual streams over an in-memory table of lengths, for a :class:`~speechpipe.pipes.
    batching.BatchView` with ``streams=V``: the keys (sorted) are items ``0 .. n - 1``, dealt
    once to the ``V`` streams (:func:`dealt_items`, the same deal every epoch, so every epoch
    has the same batches in another order, as a view's); each stream sorts its keys by length
    (one bucket as large as the stream), packs them within the budget and shuffles its
    batches (``shuffle``); :func:`plan_stream_batches` interleaves them: plan_batches' planning.

    Lengths are numbers, or ``(input, output)`` pairs (:class:`~speechpipe.pipes.batching.
    TwoDimensional`: packed within both budgets, sorted and padding counted on the input side,
    as a view without streams does; a ``SampleCount`` plans on the input side alone).

    >>> from speechpipe.pipes.batching import PaddedArea, TwoDimensional
    >>> streams = LengthStreams({"a": 5, "b": 3, "c": 9, "d": 2}, PaddedArea(10), streams=2)
    >>> [streams.keys_of(b) for b in streams.plan(0).batches]
    [['d', 'b'], ['a'], ['c']]
    >>> pairs = LengthStreams({"a": (5, 9), "b": (3, 1), "c": (4, 2)}, TwoDimensional(10, 4),
    ...                       streams=1, shuffle=False)
    >>> [pairs.keys_of(b) for b in pairs.plan(0).batches]  # a: 9 outputs alone, emitted first
    [['a'], ['b', 'c']]
    """

    def __init__(self, lengths: dict, constraint: BatchConstraint, *, streams: int,
                 seed: int = 0, shuffle: bool = True, oversize: str = "emit") -> None:
        self.keys = sorted(lengths)
        # (n,) numbers, or (n, 2) pairs
        self.lengths = np.array([lengths[k] for k in self.keys], np.float64)
        self.constraint, self.streams = constraint, check_int("streams", streams, 1)
        self.seed, self.shuffle, self.oversize = seed, shuffle, oversize
        self._plan: StreamPlan | None = None

    def plan(self, epoch: int) -> StreamPlan:
        """The global batch sequence of ``epoch`` (items: positions in :attr:`keys`)."""
        if self._plan is None or self._plan.epoch != epoch:
            n = max(1, len(self.keys))
            key = derive_seed(self.seed, 0, 0, 0, STREAM_SALT, "view")
            dealt = dealt_items(len(self.lengths), key, self.streams)
            options = dict(seed=self.seed, epoch=epoch, bucket_buffer=n,
                           shuffle_window=n if self.shuffle else 1, oversize=self.oversize)
            lengths = self.lengths
            if lengths.ndim == 2 and not isinstance(self.constraint, SampleCount):
                self._plan = plan_stream_batches(  # pairs: item by item (tuples)
                    (zip(items.tolist(), map(tuple, lengths[items].tolist())) for items in dealt),
                    self.constraint, **options)
            else:  # numbers, or a count over pairs: planned on the input side
                lengths = lengths if lengths.ndim == 1 else lengths[:, 0]
                self._plan = plan_arrays([(items, lengths[items]) for items in dealt], None,
                                         None, self.constraint, **options)
        return self._plan

    def keys_of(self, items: Iterable[int]) -> list:
        return [self.keys[i] for i in items]
