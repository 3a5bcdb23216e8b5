"""The streaming road's batching algorithms on arrays, for planning an epoch on metadata.

:func:`~speechpipe.pipes.order.shuffle_window`, :func:`~speechpipe.pipes.batching._buckets.
bucket_groups` and :func:`~speechpipe.pipes.batching._buckets.pack_batches` read one item at a
time (a Python object, a random draw, a budget check per item): seconds per million items.
Planning an epoch (``plan_batches``) runs them on lengths only, so here they are computed with
numpy over whole streams -- the same results to the item, from the same random draws:

- :class:`Words` reads a ``random.Random``'s 32-bit outputs in bulk (numpy's ``MT19937`` is the
  same generator, started from the ``random.Random``'s state), and gives ``random()`` and
  ``randrange(n)`` as CPython computes them (53-bit floats; rejection of ``k``-bit draws);
- :func:`window_order` is the sliding-window shuffle's order: the slot each draw empties was
  last filled by the item read at that slot's previous draw, found by one stable sort;
- :func:`bucket_order` runs the buckets event by event (a group leaves when the buffer is
  full: one step per group, not per item) and sorts every group at once;
- :func:`pack_order` packs sorted groups: with lengths ascending, a batch of ``k`` items ending
  at item ``j`` fits when ``k <= m(j)`` (``m(j)``: the most items of ``j``'s cost the budget
  holds), and ``j + 1 - m(j)`` increases along a group, so each batch's end is one search.

Only constraints whose cost is ``n`` times a nondecreasing function of the longest length
(:class:`PaddedArea`, :class:`Quadratic`, :class:`SampleCount`) on finite lengths ``>= 0``
take this road (:func:`fast_constraint`); the callers fall back to the per-item algorithms
for any other (``SumOfLengths`` adds floats in packing order, ``TwoDimensional`` pairs).
"""

from __future__ import annotations

import random
from array import array
from typing import Any, Sequence

import numpy as np

from ...sample import DURATION, NUM_FRAMES, sample_duration
from ._constraints import BatchConstraint, IndexLength, PaddedArea, Quadratic, SampleCount

__all__ = [
    "Words", "batch_figures", "bucket_order", "fast_constraint", "interleave", "item_array",
    "measured", "pack_order", "window_order",
]

_TWO_53 = 1.0 / 9007199254740992.0


class Words:
    """The 32-bit outputs of a ``random.Random`` from its current state on, read in bulk.

    >>> rng = random.Random(3)
    >>> words = Words(rng)
    >>> words.randoms(2).tolist() == [rng.random(), rng.random()]
    True
    >>> words.randbelow(10, 3).tolist() == [rng.randrange(10) for _ in range(3)]
    True
    >>> words.rng().random() == rng.random()
    True
    """

    def __init__(self, rng: random.Random) -> None:
        _, internal, _ = rng.getstate()
        self.start = {"bit_generator": "MT19937",
                      "state": {"key": np.array(internal[:624], np.uint32),
                                "pos": int(internal[624])}}
        self.bits = np.random.MT19937(0)
        self.bits.state = self.start
        self.buffer = np.zeros(0, np.uint64)
        self.pos = 0  # in buffer
        self.base = 0  # words used before buffer[0]
        self.marks = [(0, self.start)]  # (words drawn, the generator's state then)

    def _ahead(self, n: int) -> np.ndarray:
        """The next ``n`` words, not yet used."""
        short = self.pos + n - len(self.buffer)
        if short > 0:
            self.marks.append((self.base + len(self.buffer), self.bits.state))
            more = self.bits.random_raw(max(short, 4096))
            self.base += self.pos
            self.buffer = np.concatenate([self.buffer[self.pos:], more])
            self.pos = 0
        return self.buffer[self.pos:self.pos + n]

    def take(self, n: int) -> np.ndarray:
        words = self._ahead(n)
        self.pos += n
        return words

    def randoms(self, n: int) -> np.ndarray:
        """``n`` calls of ``random()``."""
        w = self.take(2 * n)
        return ((w[0::2] >> np.uint64(5)) * 67108864.0 + (w[1::2] >> np.uint64(6))) * _TWO_53

    def randbelow(self, n: int, count: int) -> np.ndarray:
        """``count`` calls of ``randrange(n)`` (``1 <= n <= 2**32``)."""
        shift = np.uint64(32 - n.bit_length())
        want = count + count // 2 + 64
        while True:
            r = self._ahead(want) >> shift
            ok = r < np.uint64(n)
            kept = np.flatnonzero(ok)
            if len(kept) >= count or not count:
                used = int(kept[count - 1]) + 1 if count else 0
                self.pos += used
                return r[kept[:count]].astype(np.int64)
            want *= 2

    def rng(self) -> random.Random:
        """A ``random.Random`` standing where these words stop (for the rare draws left)."""
        used = self.base + self.pos
        drawn, state = [mark for mark in self.marks if mark[0] <= used][-1]
        bits = np.random.MT19937(0)
        bits.state = state
        bits.random_raw(used - drawn)
        state = bits.state["state"]
        rng = random.Random()
        rng.setstate((3, tuple(int(x) for x in state["key"]) + (int(state["pos"]),), None))
        return rng


def window_order(n: int, window: int, rng: random.Random) -> np.ndarray:
    """The order in which :func:`~speechpipe.pipes.order.shuffle_window` emits ``n`` items
    with ``window`` and ``rng`` (drawing what it draws).

    >>> from speechpipe.pipes.order import shuffle_window
    >>> window_order(9, 4, random.Random(1)).tolist() == list(
    ...     shuffle_window(range(9), 4, random.Random(1)))
    True
    """
    if window <= 1 or not n:
        return np.arange(n, dtype=np.int64)
    if n < window:  # no draw while reading: the end's shuffle only
        rest = list(range(n))
        rng.shuffle(rest)
        return np.array(rest, np.int64)
    words = Words(rng)
    steps = n - window + 1  # a draw after each item from the window-th on
    drawn = words.randbelow(window, steps)
    # the pool is ``window`` slots; draw t empties slot drawn[t] (emitting what it holds) and
    # fills it with item window-1+t (the one just read; drawing the last slot emits it)
    order = np.argsort(drawn.astype(np.uint16) if window <= 2**16 else drawn, kind="stable")
    slots = drawn[order]
    same = np.flatnonzero(slots[1:] == slots[:-1]) + 1  # entries with an earlier one of a slot
    previous = np.full(steps, -1, np.int64)
    previous[order[same]] = order[same - 1]
    last = window - 1
    emitted = np.where(drawn == last, last + np.arange(steps),
                       np.where(previous >= 0, last + previous, drawn))
    final = np.flatnonzero(np.r_[slots[1:] != slots[:-1], True])  # each slot's last draw
    pool = np.arange(last, dtype=np.int64)
    inside = slots[final] < last
    pool[slots[final][inside]] = last + order[final][inside]
    rest = pool.tolist()
    words.rng().shuffle(rest)
    return np.concatenate([emitted, np.array(rest, np.int64)])


def bucket_order(lengths: np.ndarray, boundaries: Sequence[float] | None, buffer_size: int,
                 rng: random.Random) -> tuple[np.ndarray, np.ndarray]:
    """What :func:`~speechpipe.pipes.batching._buckets.bucket_groups` emits for items of
    ``lengths`` (primary lengths, in reading order): the items' positions, group after group
    and sorted within each, and the groups' sizes.

    >>> import random
    >>> bucket_order(np.array([5.0, 1, 9, 2, 8, 3]), [4], 4, random.Random(0))
    (array([1, 3, 0, 4, 2, 5]), array([2, 3, 1]))
    """
    n = len(lengths)
    words = Words(rng)
    ties = words.randoms(n)
    cuts = list(boundaries or [])
    which = np.zeros(n, np.int64)  # bisect_right over the cuts: how many are <= the length
    for cut in cuts:
        which += lengths >= cut
    members = [np.flatnonzero(which == b) for b in range(len(cuts) + 1)]
    taken = [0] * len(members)
    counts = np.zeros(len(members), np.int64)  # held, bucket by bucket
    groups, read, held = [], 0, 0
    while n - read >= buffer_size - held:  # the buffer fills: the fullest bucket leaves
        counts += np.bincount(which[read:read + buffer_size - held], minlength=len(members))
        read += buffer_size - held
        fullest = int(np.argmax(counts))  # the first of the fullest, as max() takes
        count = int(counts[fullest])
        groups.append(members[fullest][taken[fullest]:taken[fullest] + count])
        taken[fullest] += count
        counts[fullest] = 0
        held = buffer_size - count
    rest = [b for b in range(len(members)) if taken[b] < len(members[b])]
    words.rng().shuffle(rest)  # the end: what is left, bucket by bucket in random order
    groups.extend(members[b][taken[b]:] for b in rest)
    sizes = np.array([len(g) for g in groups], np.int64)
    flat = np.concatenate(groups) if groups else np.zeros(0, np.int64)
    return flat[_group_sort(sizes, lengths[flat], ties[flat])], sizes


def _group_sort(sizes: np.ndarray, lengths: np.ndarray, ties: np.ndarray) -> np.ndarray:
    """``np.lexsort((ties, lengths, group))`` for groups of ``sizes`` one after the other
    (positions break what is left), computed as a sort of a 64-bit key in each group -- the
    length scaled to 20 bits, the tie's leading 44 bits -- and checked: the key never orders
    two items against their exact order unless two neighbours share a key or a scaled length
    (then the lexsort)."""
    n = len(lengths)
    if not n:
        return np.zeros(0, np.int64)
    low, high = float(lengths.min()), float(lengths.max())
    scale = (2.0**20 - 1) / (high - low) if high > low else 0.0
    with np.errstate(invalid="ignore"):
        scaled = np.clip(np.floor((lengths - low) * scale), 0, 2**20 - 1).astype(np.uint64)
    key = (scaled << np.uint64(44)) | (ties * 2.0**44).astype(np.uint64)
    order = np.empty(n, np.int64)
    ends = np.cumsum(sizes).tolist()
    for lo, hi in zip([0] + ends, ends):  # group by group: sorts that stay in the cache
        order[lo:hi] = np.argsort(key[lo:hi]) + lo
    # neighbours in a group: distinct keys, lengths not decreasing -> the exact order (a
    # smaller scaled length is a smaller length; an equal one, a smaller tie)
    k, x = key[order], lengths[order]
    bad = (k[1:] == k[:-1]) | ~(x[1:] >= x[:-1])
    bad[np.cumsum(sizes)[:-1] - 1] = False  # a group's first item after the last one's
    if bad.any():
        return np.lexsort((ties, lengths, np.repeat(np.arange(len(sizes)), sizes)))
    return order


def fast_constraint(constraint: BatchConstraint) -> bool:
    """Whether :func:`pack_order` packs as :func:`pack_batches` does under ``constraint``."""
    return type(constraint) in (PaddedArea, Quadratic, SampleCount)


def measured(values: np.ndarray, unit: str | None, rate: int | None,
             constraint: BatchConstraint) -> np.ndarray:
    """``constraint.measure`` of each ``IndexLength(value, unit, rate)`` (``unit=None``: bare
    lengths, measured as they are), as :meth:`IndexLength.measured` computes it; a unit the
    constraint cannot measure raises its error (when there is a value)."""
    values = np.asarray(values, np.float64)
    if unit is None:
        return values
    length = constraint.length
    if len(values):
        IndexLength(float(values[0]), unit, rate).measured(length)  # raises as an item would
    if length is None or (length == NUM_FRAMES and unit == "frames"):
        return values
    shift = IndexLength(1.0, "frames").seconds  # a frame's seconds
    if unit == "seconds":
        seconds = values
    elif unit == "frames":
        seconds = values * shift
    else:
        seconds = values / (rate or 16000)
    if length == DURATION or length is sample_duration:
        return seconds
    return seconds / shift  # num_frames of an index counting seconds or samples


def _capacity(cost: np.ndarray, budget: float) -> np.ndarray:
    """The most items ``k`` with ``k * cost <= budget`` (``float(k) * cost`` as Python
    computes it), for costs ``> 0``."""
    k = np.floor(budget / cost)
    for _ in range(2):
        k = np.where((k + 1) * cost <= budget, k + 1, k)
        k = np.where(k * cost > budget, k - 1, k)
    return k


# long: the packing of all groups at once, one array step after the other
def pack_order(lengths: np.ndarray, sizes: np.ndarray, constraint: BatchConstraint,
               oversize: str) -> tuple[np.ndarray, np.ndarray, int] | None:
    """:func:`pack_batches` over each group of ascending ``lengths`` (groups of ``sizes``, one
    after the other): the batches in emission order as their first positions and sizes, and
    the number of oversize items (emitted alone or dropped, as ``oversize`` says); ``None``
    where the lengths do not allow it (not ascending, negative or not finite: the caller
    packs item by item).

    >>> pack_order(np.array([1.0, 2, 3, 3, 9, 30]), np.array([6]), PaddedArea(10), "emit")
    (array([0, 3, 5, 4]), array([3, 1, 1, 1]), 1)
    """
    n = len(lengths)
    if not n:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), 0
    if not np.all(np.isfinite(lengths)) or lengths.min() < 0:
        return None
    heads = np.cumsum(sizes) - sizes
    group = np.repeat(np.arange(len(sizes)), sizes)
    inner = np.ones(n, bool)
    inner[heads] = False  # an item after another of its group
    if np.any(inner[1:] & (lengths[1:] < lengths[:-1])):
        return None
    if type(constraint) is SampleCount:
        fits = np.ones(n, bool)
        room = np.full(n, float(constraint.size))
    else:
        cost = lengths if type(constraint) is PaddedArea else (
            lengths + lengths * lengths / constraint.q)
        fits = cost <= constraint.budget
        room = np.full(n, float(n))
        positive = cost > 0
        room[positive] = np.minimum(_capacity(cost[positive], constraint.budget), n)
        if constraint.max_samples is not None:
            room = np.minimum(room, constraint.max_samples)
    if np.any(inner[1:] & fits[1:] & ~fits[:-1]):
        return None  # an item fitting alone after one that does not (not monotone)
    packed = np.flatnonzero(fits)  # every group's items that fit alone: a head of the group
    earliest = np.maximum(packed + 1 - room[packed].astype(np.int64), heads[group[packed]])
    if np.any(earliest[1:] < earliest[:-1]):
        return None
    # the next batch's first: how many items may start a batch at or before each (linear)
    following = np.cumsum(np.bincount(earliest, minlength=n))[packed]
    starts, step = array("q"), memoryview(following)
    s = 0
    while s < len(packed):  # one step per batch
        starts.append(s)
        s = step[s]
    first = np.frombuffer(starts, np.int64) if len(starts) else np.zeros(0, np.int64)
    count = np.diff(np.r_[first, len(packed)])
    first = packed[first]
    owner = group[first]
    closes = np.r_[owner[1:] != owner[:-1], True][:len(owner)]  # a group's last batch
    single = np.flatnonzero(~fits)
    over = len(single)
    if oversize == "drop":
        single = single[:0]
    at = np.r_[first, single]
    size = np.r_[count, np.ones(len(single), np.int64)]
    when = np.r_[np.where(closes, 2, 0), np.ones(len(single), np.int64)]
    order = np.lexsort((at, when, np.r_[owner, group[single]]))
    return at[order], size[order], over


def batch_figures(lengths: np.ndarray, at: np.ndarray, size: np.ndarray,
                  constraint: BatchConstraint) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each batch's sum of lengths (added in order, as ``sum`` adds), padded length and cost
    (:meth:`BatchConstraint.cost`), for :class:`BatchStats`; batches of ascending lengths at
    ``at`` of ``size`` items."""
    top = lengths[at + size - 1] if len(at) else np.zeros(0)
    padded = size * top
    cost = size * (top + top * top / constraint.q) if type(constraint) is Quadratic else padded
    real = np.zeros(len(at))
    for column in range(int(size.max()) if len(size) else 0):
        live = np.flatnonzero(size > column)
        real[live] += lengths[at[live] + column]
    return real, padded, cost


def item_array(items: Any) -> np.ndarray:
    """Item numbers as ``int32`` when they fit, else ``int64``."""
    array = np.asarray(items, np.int64)
    if not array.size or (array.min() >= 0 and array.max() < 2**31):
        return array.astype(np.int32)
    return array


def interleave(sizes: list[np.ndarray], items: list[np.ndarray]) -> tuple[np.ndarray, ...]:
    """Round robin over the streams not yet exhausted: batch ``i`` of every stream (in stream
    order), then batch ``i + 1``...; each stream's batches given as their sizes and its items
    one after the other. Returns the global offsets, items and owners."""
    counts = [len(s) for s in sizes]
    owner = np.repeat(np.arange(len(sizes), dtype=np.int32), counts)
    depth = np.concatenate([np.arange(c, dtype=np.int64) for c in counts]) if counts \
        else np.zeros(0, np.int64)
    order = np.lexsort((owner, depth))  # by depth, then stream
    all_sizes = np.concatenate(sizes) if sizes else np.zeros(0, np.int64)
    starts = np.cumsum(np.concatenate([[0], all_sizes]))[:-1]  # in the streams' items
    flat = np.concatenate(items) if items else np.zeros(0, np.int64)
    sizes_out = all_sizes[order]
    offsets = np.concatenate([[0], np.cumsum(sizes_out)]).astype(np.int64)
    # item j of global batch b: flat[starts[order[b]] + j]
    gather = np.repeat(starts[order] - offsets[:-1], sizes_out) + np.arange(offsets[-1])
    return offsets, item_array(flat[gather]), owner[order]
