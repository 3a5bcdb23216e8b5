"""Virtual streams: an epoch's batches planned on metadata, the same for any ranks and workers.

The streaming road (``sharded_shuffle -> bucket_by_length -> block_batch``) batches inside
each process: with another number of DataLoader workers or ranks, every process reads another
share of the data, so the batches differ and a checkpoint cannot move to another topology.
``plan_batches`` (:class:`BatchPlannerIterDataPipe`) plans the epoch's batches instead, once,
on the lengths of a shard index or of a manifest's mapped rows (nothing is read but
metadata), over ``V`` **virtual streams**:

1. the shards (shuffled with ``(seed, epoch)``) are split between the ``V`` streams, balanced
   by total length (:func:`~speechpipe.pipes.order.assign_shards` with ``V`` parts); manifest
   rows are permuted (:class:`~speechpipe.pipes.order.FeistelOrder`) and dealt out;
2. each stream runs the streaming road's own algorithms on its lengths, with generators from
   ``(seed, epoch, stream)``: a sample shuffle buffer
   (:func:`~speechpipe.pipes.order.shuffle_buffer`, shards only), length buckets
   (:func:`~speechpipe.pipes.batching._buckets.bucket_groups`), budget packing
   (:func:`~speechpipe.pipes.batching._buckets.pack_batches`) and a batch shuffle window;
3. the streams' batches are interleaved into one global sequence ``b0, b1, ...``: round robin
   over the streams not yet exhausted (:func:`plan_stream_batches`, a :class:`StreamPlan`).

**How many streams.** ``V`` is given, or derived from the data and the batching settings
alone (``streams="auto"``, the default): each stream buckets only its share, so the default
gives every stream at least 20 bucket buffers' worth of items, from 1 stream (small corpora,
which then pad as one stream) up to 8 (:mod:`~speechpipe.pipes.batching._stream_count`).

The sequence is a function of ``(seed, epoch, V, data, batching settings)`` only. Rank ``r`` of
``W`` trains at step ``s`` on ``b[s * W + r]``; its DataLoader worker ``k`` of ``K`` produces the
rank's steps ``s`` with ``s % K == k``, which the DataLoader's round robin over workers hands
back in step order -- so the order reaching the training loop does not depend on ``K``, and a
run on 2 ranks sees at its step ``s`` what a run on 1 rank sees at steps ``2s`` and ``2s + 1``.
Each process then reads only the samples of its batches (mapped manifest rows by position;
shards read with :func:`~speechpipe.pipes.order.read_shard`, keeping the members its batches
need). Every rank takes the same number of steps, known before the epoch: ``ceil(N / W)``
(``uneven="pad"``: the last step's missing batches repeat the epoch's first ones) or
``floor(N / W)`` (``"drop"``) -- no collective is needed.

**Planned once per node.** An epoch's plan is written by the first process of a node that
needs it into the node's cache folder and mapped by every other (``plan_cache``,
:mod:`speechpipe.pipes.batching._plan_cache`): the main process (``len(loader)``) and the
DataLoader workers of every rank plan it once between them.

**Resume on any topology.** The position is one number, the global batches consumed, so the
state rank 0's loader returns (:meth:`speechpipe.loader.Loader.state_dict`) resumes every rank of
any world size and number of workers: the rest of the epoch is the unbroken run's.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from array import array
from typing import Any, Iterator

import numpy as np

from ...errors import DataError, check_int
from ...index import ShardEntry, ShardIndex
from ...sample import KEY
from ...seeding import derive_rng, derive_seed, process_position
from .._core import IterDataPipe, SampleSource, Seeded, check_seed, functional_datapipe
from ..order import (
    FeistelOrder, assign_shards, index_entries, read_shard, shuffle_buffer, shuffle_shards,
    source_rows,
)
from ..order import shuffle_window as window_shuffle
from ..shards import node_copy_samples
from ._buckets import bucket_groups, pack_batches
from ._plan_cache import cached_plan, plan_key, rows_key, shards_key
from ._stream_count import AUTO, check_streams, derived_streams
from ._planning import (
    batch_figures, bucket_order, fast_constraint, interleave, item_array, measured, pack_order,
    window_order,
)
from ._constraints import (
    BatchConstraint, BatchStats, IndexLength, OVERSIZE, batch_budget,
)

__all__ = [
    "BatchPlanner",
    "BatchPlannerIterDataPipe",
    "StreamPlan",
    "UNEVEN",
    "plan_stream_batches",
]

#: What the last step does when the epoch's batches do not fill every rank: ``"pad"`` repeats
#: the epoch's first batches (``ceil(N / W)`` steps), ``"drop"`` leaves the last ``N mod W``.
UNEVEN = ("pad", "drop")
STREAM_SALT = "virtual-stream"


# --------------------------------------------------------------------------- the plan


class StreamPlan:
    """One epoch's global sequence of batches over virtual streams, held in numpy arrays (a
    few bytes per utterance: no Python object per batch or utterance, so the copies forked
    DataLoader workers inherit stay shared).

    Batch ``i`` is ``items[offsets[i]:offsets[i + 1]]`` (:meth:`batch`); build one from
    Python batches with :meth:`from_batches`.

    Attributes:
        epoch: the epoch planned.
        streams: ``V``.
        offsets: ``int64``, ``len(self) + 1`` batch boundaries in ``items``.
        items: the item numbers of every batch, one after the other (what they number is the
            road's: a manifest row, a member of a shard); ``int32`` when they fit.
        owners: ``int32``, the stream each batch comes from.
        stats: padding and batch sizes, measured on the planned lengths.
    """

    __slots__ = ("epoch", "streams", "offsets", "items", "owners", "stats")

    def __init__(self, epoch: int, streams: int, offsets: np.ndarray, items: np.ndarray,
                 owners: np.ndarray, stats: BatchStats | None = None) -> None:
        self.epoch, self.streams = epoch, streams
        self.offsets = np.asarray(offsets, np.int64)
        self.items = np.asarray(items)
        self.owners = np.asarray(owners, np.int32)
        self.stats = stats if stats is not None else BatchStats("plan_batches")
        for array in (self.offsets, self.items, self.owners):
            array.flags.writeable = False

    @classmethod
    def from_batches(cls, epoch: int, streams: int, batches: Sequence[Sequence[int]],
                     stream_of: Sequence[int], stats: BatchStats | None = None) -> StreamPlan:
        """A plan from Python batches of item numbers and each batch's stream."""
        sizes = [len(b) for b in batches]
        flat = [i for b in batches for i in b]
        return cls(epoch, streams, np.cumsum([0] + sizes), item_array(flat), stream_of, stats)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StreamPlan):
            return NotImplemented
        return (self.epoch, self.streams) == (other.epoch, other.streams) and all(
            np.array_equal(a, b) for a, b in ((self.offsets, other.offsets),
                                              (self.items, other.items),
                                              (self.owners, other.owners)))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (f"StreamPlan(epoch={self.epoch}, streams={self.streams}, batches={len(self)}, "
                f"items={len(self.items)})")

    @property
    def nbytes(self) -> int:
        """Bytes the plan's arrays hold."""
        return self.offsets.nbytes + self.items.nbytes + self.owners.nbytes

    def batch(self, i: int) -> np.ndarray:
        """The item numbers of batch ``i`` (a view)."""
        return self.items[self.offsets[i]:self.offsets[i + 1]]

    @property
    def batches(self) -> tuple[tuple[int, ...], ...]:
        """Every batch as a tuple of ints: Python objects made on each call (to look at a
        small plan; the pipe reads :meth:`batch`)."""
        flat = self.items.tolist()
        bounds = self.offsets.tolist()
        return tuple(tuple(flat[a:b]) for a, b in zip(bounds, bounds[1:]))

    @property
    def stream_of(self) -> tuple[int, ...]:
        """The stream of each batch, as a tuple of ints (made on each call)."""
        return tuple(self.owners.tolist())

    def steps(self, world_size: int = 1, *, start: int = 0, uneven: str = "pad") -> int:
        """Steps every rank takes from global batch ``start`` on (the same on every rank).

        >>> plan = StreamPlan.from_batches(0, 1, ((0,), (1,), (2,)), (0, 0, 0))
        >>> plan.steps(2), plan.steps(2, uneven="drop"), plan.steps(2, start=2)
        (2, 1, 1)
        """
        n = len(self)
        left = max(0, n - start)
        if not n:
            return 0
        return -(-left // world_size) if uneven == "pad" else left // world_size

    def positions(self, rank: int = 0, world_size: int = 1, worker: int = 0,
                  num_workers: int = 1, *, start: int = 0, uneven: str = "pad") -> list[int]:
        """The global positions one process produces, in order: rank ``rank``'s steps ``s``
        with ``s % num_workers == worker``, each ``start + s * world_size + rank``; a
        position past the end (``uneven="pad"``) stands for batch ``position % len(self)``.

        >>> plan = StreamPlan.from_batches(0, 1, tuple((i,) for i in range(5)), (0,) * 5)
        >>> plan.positions(1, 2), plan.positions(0, 2, 1, 2), plan.positions(1, 2, start=2)
        ([1, 3, 5], [2], [3, 5])
        """
        steps = self.steps(world_size, start=start, uneven=uneven)
        return [start + s * world_size + rank for s in range(worker, steps, num_workers)]


# long: the plan of one stream is one chain of the road's generators, read here in one place
def plan_stream_batches(
    streams: Iterable[Iterable[tuple[int, Any]]],
    constraint: BatchConstraint,
    *,
    seed: int,
    epoch: int,
    buffer_size: int = 1,
    bucket_buffer: int = 2000,
    boundaries: Sequence[float] | None = None,
    shuffle_window: int = 100,
    oversize: str = "emit",
) -> StreamPlan:
    """The global batch sequence of an epoch from each stream's items in reading order.

    Args:
        streams: per stream, ``(item number, length)`` pairs in the order the stream reads
            them (iterables, read one stream after the other; lengths as the constraint
            measures them, e.g. :class:`IndexLength`).
        constraint: the budget.
        seed, epoch: with the stream number, the seeds of the stream's generators.
        buffer_size: the stream's sample shuffle buffer (1: reading order).
        bucket_buffer: items held by the stream's length buckets.
        boundaries: bucket edges (``None``: one bucket, sorted within the buffer).
        shuffle_window: batches of a stream emitted in random order within this window.
        oversize: ``"emit"`` or ``"drop"`` an item over the budget alone.

    >>> from speechpipe.pipes.batching import PaddedArea
    >>> items = [[(0, 3.0), (1, 1.0), (2, 2.0)], [(3, 5.0), (4, 5.0)]]
    >>> plan = plan_stream_batches(items, PaddedArea(6.0), seed=0, epoch=0, shuffle_window=1)
    >>> plan.batches, plan.stream_of
    (((1, 2), (4,), (0,), (3,)), (0, 1, 0, 1))
    >>> plan.batch(1), plan.nbytes
    (array([4], dtype=int32), 76)
    """
    if oversize not in OVERSIZE:
        raise ValueError(f"oversize must be one of {OVERSIZE}, got {oversize!r}")
    options = dict(seed=seed, epoch=epoch, buffer_size=buffer_size, bucket_buffer=bucket_buffer,
                   boundaries=boundaries, shuffle_window=shuffle_window, oversize=oversize)
    if fast_constraint(constraint):
        streams = [list(items) for items in streams]
        arrays = _as_arrays(streams)
        if arrays is not None:
            return plan_arrays(arrays[0], arrays[1], arrays[2], constraint, **options)
    return _plan_items(streams, constraint, **options)


def _as_arrays(streams: list[list[tuple[int, Any]]]) -> tuple[list, str | None, Any] | None:
    """Streams of ``(item, length)`` as arrays, with the lengths' unit and rate (``None``:
    bare numbers); ``None`` when they are not all ints with lengths of one kind."""
    kinds, arrays = set(), []
    for items in streams:
        numbers = [i for i, _ in items]
        lengths = [n for _, n in items]
        for n in lengths:
            if type(n) is IndexLength:
                kinds.add((n.unit, n.sample_rate))
            elif type(n) in (float, int) or isinstance(n, (np.floating, np.integer)):
                kinds.add(None)
            else:
                return None
        if len(kinds) > 1 or not all(type(i) is int or isinstance(i, np.integer)
                                     for i in numbers):
            return None
        arrays.append((np.array(numbers, np.int64), np.array(lengths, np.float64)))
    unit, rate = next(iter(kinds)) if kinds and None not in kinds else (None, None)
    return arrays, unit, rate


def _plan_items(streams: Iterable[Iterable[tuple[int, Any]]], constraint: BatchConstraint, *,
                seed: int, epoch: int, buffer_size: int, bucket_buffer: int,
                boundaries: Sequence[float] | None, shuffle_window: int,
                oversize: str) -> StreamPlan:
    """:func:`plan_stream_batches` item by item: the streaming road's own generators (any
    constraint and length)."""
    stats = BatchStats("plan_batches")
    measure = constraint.measure

    def length(item: tuple[int, Any]) -> Any:
        return measure(item[1])

    sizes, flat = [], []
    for v, items in enumerate(streams):  # one stream at a time: only its buffers are held
        rng = derive_rng(seed, epoch, v, 0, STREAM_SALT, "samples")
        ties = derive_rng(seed, epoch, v, 0, STREAM_SALT, "buckets")
        order = derive_rng(seed, epoch, v, 0, STREAM_SALT, "batches")
        read = shuffle_buffer(items, buffer_size, rng) if buffer_size > 1 else iter(items)
        groups = bucket_groups(read, buffer_size=bucket_buffer, boundaries=boundaries,
                               measure=length, rng=ties)
        packed = (batch for group in groups for batch in pack_batches(
            group, constraint, oversize=oversize, stats=stats, lengths=length))
        mine_sizes, mine = array("q"), array("q")
        for batch in window_shuffle(packed, shuffle_window, order):
            mine_sizes.append(len(batch))
            mine.extend(i for i, _ in batch)
        sizes.append(np.frombuffer(mine_sizes, np.int64))
        flat.append(np.frombuffer(mine, np.int64))
    return StreamPlan(epoch, len(sizes), *interleave(sizes, flat), stats)


def plan_arrays(streams: Sequence[tuple[np.ndarray, np.ndarray]], unit: str | None,
                rate: int | None, constraint: BatchConstraint, *, seed: int, epoch: int,
                buffer_size: int = 1, bucket_buffer: int = 2000,
                boundaries: Sequence[float] | None = None, shuffle_window: int = 100,
                oversize: str = "emit") -> StreamPlan:
    """:func:`plan_stream_batches` over streams given as arrays: per stream, its item numbers
    and their lengths (``IndexLength(length, unit, rate)`` each; ``unit=None``: bare lengths),
    in reading order. The same plan, computed with numpy (:mod:`._planning`: no Python object
    or random draw per item) where the constraint allows; item by item otherwise.

    >>> from speechpipe.pipes.batching import PaddedArea
    >>> items = [(np.array([0, 1, 2]), np.array([3.0, 1.0, 2.0])), (np.array([3, 4]),
    ...          np.array([5.0, 5.0]))]
    >>> plan_arrays(items, None, None, PaddedArea(6.0), seed=0, epoch=0, shuffle_window=1
    ...             ).batches
    ((1, 2), (4,), (0,), (3,))
    """
    if oversize not in OVERSIZE:
        raise ValueError(f"oversize must be one of {OVERSIZE}, got {oversize!r}")
    options = dict(seed=seed, epoch=epoch, buffer_size=buffer_size, bucket_buffer=bucket_buffer,
                   boundaries=boundaries, shuffle_window=shuffle_window, oversize=oversize)
    planned = None
    if fast_constraint(constraint) and max(buffer_size, shuffle_window) <= 2**32:
        planned = _planned(streams, unit, rate, constraint, **options)
    if planned is None:  # item by item
        return _plan_items([_pairs(items, lengths, unit, rate) for items, lengths in streams],
                           constraint, **options)
    return planned


def _pairs(items: np.ndarray, lengths: np.ndarray, unit: str | None, rate: int | None
           ) -> Iterator[tuple[int, Any]]:
    for item, length in zip(items.tolist(), np.asarray(lengths, np.float64).tolist()):
        yield item, (length if unit is None else IndexLength(length, unit, rate))


# long: one stream after the other, each through the road's three stages on arrays
def _planned(streams: Sequence[tuple[np.ndarray, np.ndarray]], unit: str | None,
             rate: int | None, constraint: BatchConstraint, *, seed: int, epoch: int,
             buffer_size: int, bucket_buffer: int, boundaries: Sequence[float] | None,
             shuffle_window: int, oversize: str) -> StreamPlan | None:
    """:func:`plan_arrays` with numpy, or ``None`` where lengths need the per-item road."""
    sizes, flat, figures, over = [], [], [], 0
    for v, (items, values) in enumerate(streams):
        lengths = measured(values, unit, rate, constraint)
        items = np.asarray(items, np.int64)
        if buffer_size > 1:
            read = window_order(len(items), buffer_size,
                                derive_rng(seed, epoch, v, 0, STREAM_SALT, "samples"))
            items, lengths = items[read], lengths[read]
        grouped, groups = bucket_order(lengths, boundaries, bucket_buffer,
                                       derive_rng(seed, epoch, v, 0, STREAM_SALT, "buckets"))
        lengths = lengths[grouped]
        packed = pack_order(lengths, groups, constraint, oversize)
        if packed is None:
            return None
        at, size, oversized = packed
        over += oversized
        figures.append((size, *batch_figures(lengths, at, size, constraint)))
        order = window_order(len(at), shuffle_window,
                             derive_rng(seed, epoch, v, 0, STREAM_SALT, "batches"))
        at, size = at[order], size[order]
        ends = np.cumsum(size)
        gather = np.repeat(at - (ends - size), size) + np.arange(ends[-1] if len(ends) else 0)
        sizes.append(size)
        flat.append(items[grouped][gather])
    return StreamPlan(epoch, len(sizes), *interleave(sizes, flat),
                      _stats(figures, over, oversize))


def _stats(figures: list[tuple[np.ndarray, ...]], over: int, oversize: str) -> BatchStats:
    """The :class:`BatchStats` that packing the batches one by one adds up (the same floats:
    running sums in packing order)."""
    stats = BatchStats("plan_batches")
    size, real, padded, cost = (np.concatenate(parts) if parts else np.zeros(0)
                                for parts in zip(*figures)) if figures else [np.zeros(0)] * 4
    stats.batches, stats.samples = len(size), int(size.sum())
    if len(size):
        stats.real = float(np.cumsum(real)[-1])
        stats.padded = float(np.cumsum(padded)[-1])
        stats.largest_cost = max(0.0, float(cost.max()))
    stats.sizes = size.astype(np.int64).tolist()
    if oversize == "emit":
        stats.oversize_emitted = over
    else:
        stats.oversize_dropped = over
    return stats


# --------------------------------------------------------------------------- the two roads


class _ShardRoad:
    """Items of a shard index: item ``offsets[s] + m`` is member ``m`` of shard ``names[s]``
    (names in the source's order)."""

    def __init__(self, names: list[str], entries: dict[str, ShardEntry], unit: str,
                 rate: int | None, bucket_buffer: int) -> None:
        self.names = names
        self.entries = entries
        self.unit, self.rate = unit, rate
        self.offsets = np.cumsum([0] + [entries[n].count for n in names]).astype(np.int64)
        self.number = {n: i for i, n in enumerate(names)}
        self.bucket_buffer = bucket_buffer

    def default_streams(self) -> int:
        """:func:`derived_streams` of the members, the bucket buffer and the shards."""
        return derived_streams(int(self.offsets[-1]), self.bucket_buffer, len(self.names))

    def plan_key(self) -> dict:
        """What the plans read of the data (:func:`shards_key`, computed once)."""
        if getattr(self, "_key", None) is None:
            self._key = shards_key(self.names, self.entries, self.unit, self.rate)
        return self._key

    def streams(self, seed: int, epoch: int, streams: int) -> list[tuple[np.ndarray, ...]]:
        """Per stream, its items and their lengths (in the index's unit) in reading order."""
        order = shuffle_shards(self.names, seed, epoch)
        weights = {n: self.entries[n].total_length for n in self.names}
        split = assign_shards(order, world_size=streams, num_workers=1, weights=weights,
                              unit=self.unit)
        return _Streams(streams, lambda v: self._items(split.shards(v, 0)))

    def _items(self, names: list[str]) -> tuple[np.ndarray, np.ndarray]:
        if not names:
            return np.zeros(0, np.int64), np.zeros(0, np.float64)
        shards = [self.number[name] for name in names]
        counts = np.diff(self.offsets)[shards]
        ends = np.cumsum(counts)
        items = np.repeat(self.offsets[shards] - (ends - counts), counts) + np.arange(ends[-1])
        lengths = [getattr(self.entries[name].lengths, "array", self.entries[name].lengths)
                   for name in names]
        return items, np.concatenate([np.asarray(n, np.float64) for n in lengths])

    def fetch(self, batches: list[np.ndarray], read_options: Any) -> Iterator[list]:
        """The samples of each batch, each shard read once while some batch still needs it
        (only the members still needed are kept; the count of uses left is an array per
        shard in reading, made when it is read)."""
        flat = np.concatenate(batches) if batches else np.zeros(0, np.int64)
        shard_of = np.searchsorted(self.offsets, flat, "right") - 1
        by_shard = np.argsort(shard_of, kind="stable")  # this process's items, shard by shard
        bounds = np.searchsorted(shard_of[by_shard], np.arange(len(self.names) + 1))
        left = np.diff(bounds)  # uses left of each shard
        held: dict[int, tuple[np.ndarray, dict[int, Any]]] = {}
        at = 0
        for batch in batches:
            samples = []
            shards, at = shard_of[at:at + len(batch)].tolist(), at + len(batch)
            for item, s in zip(batch.tolist(), shards):
                m = item - int(self.offsets[s])
                if s not in held:
                    members = flat[by_shard[bounds[s]:bounds[s + 1]]] - self.offsets[s]
                    uses = np.bincount(members, minlength=self.entries[self.names[s]].count)
                    held[s] = uses, self._read(self.names[s], np.flatnonzero(uses).tolist(),
                                               read_options)
                uses, found = held[s]
                samples.append(found[m])
                uses[m] -= 1
                if not uses[m]:
                    del found[m]
                left[s] -= 1
                if not left[s]:
                    del held[s]
            yield samples

    def _read(self, name: str, members: list[int], read_options: Any) -> dict[int, Any]:
        keys = self.entries[name].keys
        wanted = {keys[m]: m for m in members}
        found = {}
        samples = node_copy_samples(name, read_options)  # remote, compressed: once per node
        if samples is None:
            samples = read_shard(name, read_options=read_options)
        for sample in samples:
            m = wanted.get(sample[KEY])
            if m is not None:
                found[m] = sample
        missing = [keys[m] for m in members if m not in found]
        if missing:
            raise DataError(f"plan_batches: {len(missing)} member(s) of the index are not in "
                            "the shard (the shard changed since the index was written)",
                            source=name, key=missing[0])
        return found


class _RowRoad:
    """Items of mapped manifest rows: item ``i`` is row ``i`` (of the kept rows). Durations
    are read from the mapped tables at each plan, not held."""

    unit, rate = "seconds", None  # durations

    def __init__(self, rows: Any, bucket_buffer: int) -> None:
        self.rows = rows
        self.bucket_buffer = bucket_buffer
        durations = self.durations()
        self.count = len(durations)
        bad = np.flatnonzero(~np.isfinite(durations))
        if bad.size:
            sample = rows.sample(int(bad[0]))
            raise DataError("plan_batches: a manifest row without a duration (the plan "
                            "batches by duration)", source=sample.get("source"),
                            key=sample.get(KEY))

    def durations(self) -> np.ndarray:
        rows = self.rows
        durations = np.concatenate([np.asarray(t.durations, np.float64) for t in rows.tables]) \
            if rows.tables else np.zeros(0)
        return durations[rows.kept] if rows.kept is not None else durations

    def default_streams(self) -> int:
        """:func:`derived_streams` of the rows and the bucket buffer."""
        return derived_streams(self.count, self.bucket_buffer)

    def plan_key(self) -> dict:
        """What the plans read of the data (:func:`rows_key`, computed once)."""
        if getattr(self, "_key", None) is None:
            self._key = rows_key(self.durations())
        return self._key

    def streams(self, seed: int, epoch: int, streams: int) -> list[tuple[np.ndarray, ...]]:
        """Per stream, its rows and their durations in reading order."""
        durations = self.durations()
        key = derive_seed(seed, epoch, 0, 0, STREAM_SALT, "rows")

        def stream(v: int) -> tuple[np.ndarray, np.ndarray]:
            items = FeistelOrder(len(durations), key, v, streams).take()
            return items, durations[items]

        return _Streams(streams, stream)

    def fetch(self, batches: list[np.ndarray], read_options: Any) -> Iterator[list]:
        for batch in batches:
            yield [self.rows.sample(i) for i in batch.tolist()]


class _Streams(Sequence):
    """Each stream's arrays made when it is planned (one stream's arrays held at a time)."""

    def __init__(self, count: int, make: Any) -> None:
        self.count, self.make = count, make

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, v: int) -> tuple[np.ndarray, np.ndarray]:
        if not 0 <= v < self.count:
            raise IndexError(v)
        return self.make(v)


# --------------------------------------------------------------------------- the pipe


@functional_datapipe("plan_batches")
class BatchPlannerIterDataPipe(Seeded, SampleSource, IterDataPipe[list]):
    """Batches planned on metadata over virtual streams (functional name: ``plan_batches``).

    Consumes shard names with an ``index`` (``True``: the ``index.jsonl`` beside them, or a
    :class:`~speechpipe.index.ShardIndex`), or ``read_manifest_files`` over local JSON-lines
    manifests with durations (their mapped rows); yields batches -- lists of samples: raw ones
    of the shards (follow with ``.collate(collate_fn=DecodeCollate(...))``) or parsed rows --
    the same global sequence of batches for any number of ranks and DataLoader workers (see
    the module documentation). ``len()`` is this process's steps in the epoch.

    Args:
        source_datapipe: shard names, or a ``read_manifest_files`` pipe.
        budget, max_samples: the budget, as ``block_batch``'s (seconds, or a constraint);
            the index's lengths are measured in the budget's unit
            (:class:`~speechpipe.pipes.batching.IndexLength`), manifests in seconds.
        streams: ``V``, or ``"auto"`` (default; ``None``: the same): the most streams, up
            to 8, that each hold 20 x ``bucket_buffer`` items, over shards at most one per
            shard (:func:`derived_streams`; a small corpus gets 1). Fixed for a run: a state
            records the ``V`` used and refuses a pipeline that gives or derives another.
            More streams mix more shards into each stretch; any ``V`` serves any topology.
        seed: the base seed of every stream's generators ``(seed, epoch, stream)``.
        buffer_size: each stream's sample shuffle buffer (shards; rows are permuted whole).
        bucket_buffer: items each stream's length buckets hold.
        boundaries: bucket edges in the measured unit (``None``: one bucket).
        shuffle_window: each stream's batch shuffle window.
        oversize: ``"emit"`` or ``"drop"`` a sample over the budget alone.
        uneven: ``"pad"`` (default) or ``"drop"`` (:data:`UNEVEN`).
        index: the shard index (shards road).
        read_options: how shards are read (:class:`~speechpipe.pipes.shards.ShardReadOptions`).
        plan_cache: ``True`` (default): each epoch's plan is made once per node, in the
            node's cache folder (:mod:`speechpipe.node_cache`), and mapped by every other
            process; a folder: that cache folder; ``False``: each process plans for itself.
            The batches are the same either way.

    >>> import os, tempfile
    >>> from speechpipe import IterableWrapper
    >>> from speechpipe.pipes.sources import write_manifest
    >>> path = os.path.join(tempfile.mkdtemp(), "m.jsonl")
    >>> _ = write_manifest(path, [{"key": f"u{i}", "duration": 1.0 + i % 3} for i in range(8)])
    >>> pipe = IterableWrapper([path]).read_manifest_files().plan_batches(
    ...     6.0, streams=2, seed=0)
    >>> batches = [[s["key"] for s in b] for b in pipe]
    >>> sorted(k for b in batches for k in b) == sorted(f"u{i}" for i in range(8)), len(pipe)
    (True, 4)
    """

    topology_free = True  # the loader saves one position for every rank and worker
    draws_in_sequence = False
    decides_batches = ("constraint", "num_streams", "seed", "buffer_size", "bucket_buffer",
                       "boundaries", "shuffle_window", "oversize", "uneven", "index")

    def __init__(
        self,
        source_datapipe: Any,
        budget: float | BatchConstraint | None = None,
        *,
        max_samples: int | None = None,
        streams: int | str | None = AUTO,
        seed: int = 0,
        buffer_size: int = 1000,
        bucket_buffer: int = 2000,
        boundaries: Sequence[float] | None = None,
        shuffle_window: int = 100,
        oversize: str = "emit",
        uneven: str = "pad",
        index: ShardIndex | bool | None = None,
        read_options: Any = None,
        plan_cache: bool | str | os.PathLike = True,
    ) -> None:
        if not isinstance(plan_cache, (bool, str, os.PathLike)):
            raise TypeError(f"plan_cache must be True, False or a folder, got {plan_cache!r}")
        self.constraint = batch_budget(budget, max_samples=max_samples, required=True)
        streams = check_streams(streams)
        for name, value in (("buffer_size", buffer_size), ("bucket_buffer", bucket_buffer),
                            ("shuffle_window", shuffle_window)):
            check_int(name, value, 1)
        if boundaries is not None:
            boundaries = [float(b) for b in boundaries]
            if any(b >= c for b, c in zip(boundaries, boundaries[1:])):
                raise ValueError(f"boundaries must increase strictly, got {boundaries}")
        if oversize not in OVERSIZE:
            raise ValueError(f"oversize must be one of {OVERSIZE}, got {oversize!r}")
        if uneven not in UNEVEN:
            raise ValueError(f"uneven must be one of {UNEVEN}, got {uneven!r}")
        if not (index is None or isinstance(index, (bool, ShardIndex))):
            raise TypeError(f"index must be None, True or a ShardIndex, got {index!r}")
        self.source_datapipe = source_datapipe
        self.streams = streams
        self.seed = check_seed(seed)
        self.epoch = 0
        self.start = 0
        self.buffer_size = buffer_size
        self.bucket_buffer = bucket_buffer
        self.boundaries = boundaries
        self.shuffle_window = shuffle_window
        self.oversize = oversize
        self.uneven = uneven
        self.index = None if index is False else index
        self.read_options = read_options
        self.plan_cache = plan_cache
        self._road: Any = None
        self._plan: StreamPlan | None = None

    def __getstate__(self) -> dict:
        state = super().__getstate__()
        state["_road"] = state["_plan"] = None  # planned again in each process
        return state

    def set_epoch(self, epoch: int, *, start: int = 0) -> "BatchPlannerIterDataPipe":
        """Draw ``epoch`` in the next pass, from global batch ``start`` on (resuming)."""
        super().set_epoch(epoch)
        self.start = check_int("start", start, 0)
        return self

    # -- planning

    def road(self) -> Any:
        """The items the plan numbers: the manifests' rows or the index's shard members."""
        if self._road is None:
            rows = source_rows(self.source_datapipe)
            if rows is not None:
                self._road = _RowRoad(rows, self.bucket_buffer)
            else:
                self._road = self._shard_road()
        return self._road

    def _shard_road(self) -> _ShardRoad:
        if self.index is None:
            raise ValueError("plan_batches plans on metadata: give shard names with index=True "
                             "(or a ShardIndex), or read_manifest_files over JSON-lines "
                             "manifests with durations")
        names = [str(n) for n in self.source_datapipe]
        remote = self.read_options.remote if self.read_options is not None else None
        index = (self.index if isinstance(self.index, ShardIndex)
                 else ShardIndex.for_shards(sorted(set(names)), remote=remote))
        return _ShardRoad(names, index_entries(names, index), index.length_unit,
                          index.sample_rate, self.bucket_buffer)

    @property
    def num_streams(self) -> int:
        """``V``: the ``streams`` given, else the road's default (:func:`derived_streams`:
        reads the count of rows or members). A state's fingerprint records it."""
        return self.streams if self.streams != AUTO else self.road().default_streams()

    def plan(self, epoch: int | None = None) -> StreamPlan:
        """The epoch's global batch sequence (default: the current epoch); reads metadata."""
        epoch = self.epoch if epoch is None else check_int("epoch", epoch, 0)
        if self._plan is None or self._plan.epoch != epoch:
            road = self.road()
            settings = dict(
                seed=self.seed,
                buffer_size=self.buffer_size if isinstance(road, _ShardRoad) else 1,
                bucket_buffer=self.bucket_buffer, boundaries=self.boundaries,
                shuffle_window=self.shuffle_window, oversize=self.oversize)

            def make() -> StreamPlan:
                return plan_arrays(road.streams(self.seed, epoch, self.num_streams),
                                   road.unit, road.rate, self.constraint, epoch=epoch,
                                   **settings)

            if self.plan_cache is False:
                self._plan = make()
            else:
                key = plan_key(self, road, self.num_streams, self.constraint, settings)
                self._plan = cached_plan(key, epoch, make, StreamPlan, cache_dir=None if
                                         self.plan_cache is True else self.plan_cache)
        return self._plan

    def _positions(self, start: int) -> list[int]:
        where = process_position()
        return self.plan().positions(where.rank, where.world_size, where.worker,
                                     where.num_workers, start=start, uneven=self.uneven)

    # -- passes

    def __iter__(self) -> Iterator[list]:
        self._begin_pass()
        state, _ = self._take_resume()
        start = self.start if state is None else check_int("start", state["start"], 0)
        if state is not None:
            self.epoch = check_int("epoch", state["epoch"], 0)
        plan = self.plan()
        n = len(plan)
        if start > n:
            raise DataError(f"plan_batches: global batch {start} is past the end of epoch "
                            f"{self.epoch}, which has {n} global batches (an edited state, or "
                            "one of other data?)", source=type(self).__name__)
        positions = self._positions(start)
        skip = 0 if state is None else check_int("next", state["next"], 0)
        if skip > len(positions):
            raise DataError(f"plan_batches: the state says this process yielded {skip} batches "
                            f"of epoch {self.epoch} from global batch {start}, but it has "
                            f"{len(positions)} there", source=type(self).__name__)
        items = [plan.batch(p % n) for p in positions[skip:]]
        live = self._live = {"epoch": self.epoch, "start": start, "next": skip}
        try:
            for batch in self.road().fetch(items, self.read_options):
                live["next"] += 1
                yield batch
        finally:
            self._live = None

    def __len__(self) -> int:
        return len(self._positions(self.start))

    def _snapshot(self, live: dict) -> dict:
        """Epoch, start and the batches this process has yielded: nothing is held."""
        return dict(live)


BatchPlanner = BatchPlannerIterDataPipe
