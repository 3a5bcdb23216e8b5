"""Shard assignment: the epoch's shard order and who reads which shard -- pure functions.

The two-level shuffle of ``sharded_shuffle`` (:mod:`speechpipe.pipes.order._streaming`) starts here:

- :func:`shuffle_shards`: the epoch's shard order, shuffled with ``(seed, epoch)`` -- identical
  on every rank and DataLoader worker;
- :func:`assign_shards`: that order split between ranks, then between each rank's workers,
  **balanced by total length** from the shard index (greedy longest-first over weight
  classes, then max/min refinement; see :func:`assign_shards`), or by count without an
  index. Optionally **equal shard counts** per rank: repeat shards (as webdataset) or drop
  the remainder (as CAT), counted;
- :func:`split_shards`: one process's part of it;
- :class:`ShardSplit`: those choices, given to ``sharded_shuffle(split=...)``; for a small
  corpus of few shards, ``ShardSplit(level="sample")`` splits samples instead of shards;
- :func:`uneven_split`: what a whole-shard split drops or repeats when ranks stop together,
  warned (:class:`UnevenSplitWarning`) when it is more than a few percent;
- :class:`ShardAssignment` / :class:`SplitBalance` / :func:`split_balance`: the result and its
  balance (max/min total frames per rank).

**All ranks share the epoch seed.** The shard order is drawn from ``(seed, epoch)`` alone, so
every process computes the same order and the same assignment without talking to the others;
only the sample buffer is seeded per ``(rank, worker)``.

Nothing here reads a shard or imports torch's DataPipes: names and weights in, names out.
"""

from __future__ import annotations

import bisect
import collections
import heapq
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Iterable, NamedTuple

from ...errors import check_int
from ...seeding import Position, derive_rng

__all__ = [
    "BALANCE",
    "EQUALIZE",
    "LEVELS",
    "ShardAssignment",
    "ShardSplit",
    "SplitBalance",
    "UnevenSplitWarning",
    "assign_shards",
    "shuffle_shards",
    "split_balance",
    "split_shards",
    "uneven_split",
]

#: How shards are balanced between ranks: by total length from the index, or by count.
BALANCE = ("length", "count")
#: How shard counts are made equal per rank (``None``: they are not).
EQUALIZE = (None, "repeat", "drop")
#: What is split between ranks and workers: whole shards, or the samples of every shard.
LEVELS = ("shard", "sample")
#: The share of an epoch a whole-shard split may drop (or repeat) before it is warned about.
UNEVEN_TOLERANCE = 0.05

# Shards whose weights are within this relative tolerance are one weight class: classes are
# assigned largest first (LPT), shards within a class in the epoch's shuffled order, so the
# split changes from epoch to epoch while keeping LPT's balance.
_CLASS_TOLERANCE = 0.05

# Salt of the shard order's random stream (part of the public determinism contract: changing
# it changes every epoch's order).
_SHARDS_SALT = "shards"


# --------------------------------------------------------------------------------------------
# Level 1: the shard list
# --------------------------------------------------------------------------------------------


def shuffle_shards(names: Iterable[str], seed: int, epoch: int) -> list[str]:
    """The epoch's shard order: ``names`` shuffled with ``derive_rng(seed, epoch, 0, 0,
    "shards")``.

    Rank and worker are deliberately left out, so every process computes the *same* order and
    :func:`split_shards` can hand each one a disjoint part of it.

    >>> names = [f"data-{i}.tar" for i in range(6)]
    >>> shuffle_shards(names, 0, 1) == shuffle_shards(names, 0, 1)
    True
    >>> sorted(shuffle_shards(names, 0, 1)) == names
    True
    """
    order = list(names)
    derive_rng(seed, epoch, 0, 0, _SHARDS_SALT).shuffle(order)
    return order


def split_shards(
    names: Sequence[str],
    position: Position,
    *,
    weights: Mapping[str, float] | None = None,
    split: ShardSplit | None = None,
) -> list[str]:
    """The shards this process reads: its part of :func:`assign_shards` for ``position``.

    The epoch's order is split first between the ``world_size`` ranks, then each rank's part
    between its ``num_workers`` DataLoader workers -- balanced by total length when
    ``weights`` (total length per shard, from the index) are given, else round robin by count
    (rank ``r`` gets ``names[r::world_size]``, its worker ``w`` every ``num_workers``-th of
    those). Given the same ``names`` everywhere (:func:`shuffle_shards`), the processes read
    disjoint parts whose union is every shard once (unless ``split`` equalises counts by
    repeating or dropping shards). A rank's shards do not depend on the number of workers.
    :func:`assign_shards` is the one place that decides who reads what.

    Args:
        names: the epoch's shard order, identical on every process.
        position: this process (:func:`speechpipe.seeding.process_position`).
        weights: ``{name: total length}`` to balance by length.
        split: a :class:`ShardSplit` (balance, equal counts).

    >>> from speechpipe.seeding import Position
    >>> names = ["a", "b", "c", "d", "e"]
    >>> split_shards(names, Position(rank=0, world_size=1, worker=1, num_workers=2))
    ['b', 'd']
    >>> split_shards(names, Position(rank=1, world_size=2, worker=0, num_workers=2))
    ['b']
    >>> split_shards(names, Position(rank=1, world_size=2),
    ...              weights={"a": 5, "b": 1, "c": 1, "d": 1, "e": 1})
    ['b', 'c', 'd', 'e']
    """
    check_position(position)
    assignment = assign_shards(names, world_size=position.world_size,
                               num_workers=position.num_workers, weights=weights, split=split)
    return assignment.shards(position.rank, position.worker)


def check_position(position: Position) -> Position:
    slots = position.world_size * position.num_workers
    slot = position.rank * position.num_workers + position.worker
    if not (0 <= position.rank < position.world_size and 0 <= position.worker
            < position.num_workers) or not 0 <= slot < slots:
        raise ValueError(f"position {position} is outside its own world and worker counts")
    return position


# --------------------------------------------------------------------------------------------
# Splitting shards between ranks and workers
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ShardSplit:
    """How ``sharded_shuffle`` splits the epoch's shards between ranks and workers.

    Args:
        balance: ``"length"`` (default): balance the total length per rank (then per worker)
            using the shard index's lengths; without an index it falls back to ``"count"``,
            round robin over the epoch's shard order.
        equalize: ``None`` (default): shard counts per rank may differ (by one or more);
            ``"repeat"``: ranks short of ``ceil(n / ranks)`` shards get repeats of the first
            shards of the epoch's order (webdataset's way), each on another rank than its
            original when possible; ``"drop"``: the last ``n mod ranks`` shards of the epoch's
            order are left out this epoch (CAT's way; a different set every epoch). Both are
            counted in :class:`ShardAssignment`.
        level: ``"shard"`` (default): each shard is read by one process. ``"sample"``: for
            a small corpus of fewer shards than ranks × workers (or of shards too uneven to
            share out), every process reads every shard, in the epoch's order, and keeps
            every ``S``-th sample read from its slot on (``S`` = ranks × workers, slot =
            worker × ranks + rank: sample ``i`` goes to rank ``i % ranks``, whatever the
            number of workers): nothing dropped or repeated, counts within one of each other
            (exact ``len()`` with the index), resumable, at the cost of reading the corpus
            ``S`` times. ``equalize`` does not apply (``balance`` neither).

    >>> ShardSplit(equalize="repeat")
    ShardSplit(balance='length', equalize='repeat', level='shard')
    """

    balance: str = "length"
    equalize: str | None = None
    level: str = "shard"

    def __post_init__(self) -> None:
        if self.balance not in BALANCE:
            raise ValueError(f"balance must be one of {BALANCE}, got {self.balance!r}")
        if self.equalize not in EQUALIZE:
            raise ValueError(f"equalize must be one of {EQUALIZE}, got {self.equalize!r}")
        if self.level not in LEVELS:
            raise ValueError(f"level must be one of {LEVELS}, got {self.level!r}")
        if self.level == "sample" and self.equalize is not None:
            raise ValueError("equalize applies to whole shards; level='sample' already gives "
                             "every process an equal share, within one sample")


@dataclass(frozen=True)
class SplitBalance:
    """Total length per rank and its spread.

    Attributes:
        totals: total length (or shard count) per rank.
        max_over_min: largest / smallest total (``inf`` if a rank has nothing; 1.0 is perfect).
        max_over_mean: largest / mean total: the slowest rank's epoch relative to a perfect
            split (what a ``stop`` epoch loses is roughly ``1 - min/max``).
    """

    totals: tuple[float, ...]
    unit: str = "frames"

    @property
    def max(self) -> float:
        return max(self.totals) if self.totals else 0.0

    @property
    def min(self) -> float:
        return min(self.totals) if self.totals else 0.0

    @property
    def mean(self) -> float:
        return sum(self.totals) / len(self.totals) if self.totals else 0.0

    @property
    def max_over_min(self) -> float:
        if self.max == 0:
            return 1.0
        return self.max / self.min if self.min > 0 else math.inf

    @property
    def max_over_mean(self) -> float:
        return self.max / self.mean if self.mean > 0 else 1.0

    def report(self) -> str:
        return (f"{len(self.totals)} ranks, {self.unit} per rank min {self.min:g} / mean "
                f"{self.mean:.6g} / max {self.max:g}; max/min {self.max_over_min:.4f}, "
                f"max/mean {self.max_over_mean:.4f}")


def split_balance(totals: Sequence[float], unit: str = "frames") -> SplitBalance:
    """The balance of per-rank totals.

    >>> b = split_balance([100, 120, 110])
    >>> round(b.max_over_min, 2), round(b.max_over_mean, 3)
    (1.2, 1.091)
    """
    return SplitBalance(tuple(float(t) for t in totals), unit)


@dataclass(frozen=True)
class ShardAssignment:
    """The shards every process reads in one epoch (:func:`assign_shards`).

    Attributes:
        parts: ``parts[rank][worker]``: shard names in reading order (the epoch's order).
        rank_totals: total weight per rank (frames from the index, or shard counts).
        unit: ``"frames"`` (or the index's unit) when balanced by length, ``"shards"``
            when by count.
        repeated: names added as repeats (``equalize="repeat"``), one per copy.
        dropped: names left out (``equalize="drop"``).
        repeated_weight / dropped_weight: their total weight.
    """

    parts: tuple[tuple[tuple[str, ...], ...], ...]
    rank_totals: tuple[float, ...]
    unit: str
    repeated: tuple[str, ...] = ()
    dropped: tuple[str, ...] = ()
    repeated_weight: float = 0.0
    dropped_weight: float = 0.0
    level: str = "shard"

    @property
    def world_size(self) -> int:
        return len(self.parts)

    @property
    def num_workers(self) -> int:
        return len(self.parts[0]) if self.parts else 1

    def shards(self, rank: int, worker: int = 0) -> list[str]:
        """The shards of ``rank``'s ``worker`` (worker 0 of 1 without DataLoader workers)."""
        return list(self.parts[rank][worker])

    def rank_shards(self, rank: int) -> list[str]:
        """All the shards ``rank`` reads (over its workers), in the epoch's order per worker."""
        return [name for part in self.parts[rank] for name in part]

    def shard_counts(self) -> list[int]:
        return [sum(len(part) for part in rank) for rank in self.parts]

    def balance(self) -> SplitBalance:
        """Per-rank totals and their max/min, max/mean."""
        return split_balance(self.rank_totals, self.unit)

    def report(self) -> str:
        if self.level == "sample":
            return (f"sample split: every process reads all {len(self.parts[0][0])} shard(s) "
                    f"and keeps every {self.world_size * self.num_workers}-th sample")
        counts = self.shard_counts()
        lines = [f"shard split: {self.balance().report()}",
                 f"  shards per rank min {min(counts)} / max {max(counts)}"]
        if self.repeated:
            lines.append(f"  repeated {len(self.repeated)} shard(s) ({self.repeated_weight:g} "
                         f"{self.unit}) to equalise shard counts")
        if self.dropped:
            lines.append(f"  dropped {len(self.dropped)} shard(s) ({self.dropped_weight:g} "
                         f"{self.unit}) to equalise shard counts")
        return "\n".join(lines)


class UnevenSplitWarning(UserWarning):
    """Warned when an epoch starts whose whole-shard split gives the ranks such different
    shares that ranks stepping together drop (or repeat) more than a few percent of it."""


# long: the message names every figure and fix; the arithmetic is ~20 lines
def uneven_split(assignment: ShardAssignment, counts: Mapping[str, int] | None = None,
                 lengths: Mapping[str, float] | None = None,
                 tolerance: float = UNEVEN_TOLERANCE) -> str | None:
    """What a whole-shard split loses, as a warning's text, or ``None`` when it is within
    ``tolerance`` of the epoch (so with one rank: its idle workers, if any, lose nothing).

    Ranks that step together stop with the rank that has the least (``stop``), dropping the
    others' surplus, or pad up to the most (``pad``), repeating the difference. The share is
    measured on ``lengths`` (total length per shard, from the index: what budget batches
    see), else on ``counts`` (utterances per shard), else on shard counts; with ``counts``,
    it is also given in utterances.

    >>> a = assign_shards(["a", "b"], world_size=2, num_workers=2)
    >>> print(uneven_split(a, {"a": 185, "b": 13}))  # doctest: +ELLIPSIS
    2 shard(s) for 2 rank(s) x 2 worker(s): whole shards give the ranks 185 / 13 ... 172 ...
    """
    slots = assignment.world_size * assignment.num_workers
    if assignment.world_size == 1 or assignment.level == "sample":
        return None
    ranks = [assignment.rank_shards(r) for r in range(assignment.world_size)]
    weights = lengths if lengths is not None else counts
    measure = [sum(weights[n] for n in names) if weights is not None else len(names)
               for names in ranks]
    total = sum(measure) or 1
    dropped = sum(m - min(measure) for m in measure) / total
    repeated = sum(max(measure) - m for m in measure) / total
    idle = sum(1 for rank in assignment.parts for part in rank if not part)
    if max(dropped, repeated) <= tolerance:  # idle workers alone lose nothing
        return None
    shards = len({n for names in ranks for n in names})
    what = " of the audio" if lengths is not None else ""
    drop, pad = f"{100 * dropped:.0f}%{what}", f"{100 * repeated:.0f}%"
    if counts is not None:
        utterances = sum(counts[n] for n in set(n for names in ranks for n in names))
        per_rank = " / ".join(str(sum(counts[n] for n in names)) for names in ranks)
        given = f"give the ranks {per_rank} utterances per epoch"
        drop = f"about {round(dropped * utterances)} utterances ({drop})"
        pad = f"about {round(repeated * utterances)} ({pad})"
        size = f"pack --utts-per-shard {max(1, utterances // (4 * slots))}"
    else:
        given = f"give the ranks {' / '.join(str(len(n)) for n in ranks)} shards"
        size = "pack with a smaller --utts-per-shard"
    return (
        f"{shards} shard(s) for {assignment.world_size} rank(s) x {assignment.num_workers} "
        f"worker(s): whole shards {given}; ranks stepping together drop {drop} per epoch "
        f"stopping with the shortest rank, or repeat {pad} padding to the longest; {idle} of "
        f"{slots} workers read no shard. Fix: more shards than ranks x workers ({size}: "
        "several shards per worker), or, for a small corpus, split samples instead of shards: "
        "sharded_shuffle(split=ShardSplit(level='sample'))")


def _weight_class(weight: float) -> float:
    if weight <= 0:
        return -math.inf
    return math.floor(math.log(weight) / math.log1p(_CLASS_TOLERANCE))


def _greedy(
    items: Sequence[int],
    weights: Sequence[float],
    parts: int,
    *,
    cap: int | None = None,
    names: Sequence[str] | None = None,
) -> list[list[int]]:
    """Assign item positions to ``parts``, longest weight class first, each item to the part
    with the smallest total (ties: lowest part), at most ``cap`` items per part; with
    ``names``, an item avoids a part already holding the same name when another has room.
    Each part's items come back in position order."""
    order = sorted(items, key=lambda i: (-_weight_class(weights[i]), i))
    heap = [(0.0, p) for p in range(parts)]
    counts = [0] * parts
    held: list[set[str]] | None = [set() for _ in range(parts)] if names is not None else None
    out: list[list[int]] = [[] for _ in range(parts)]
    for i in order:
        skipped = []
        choice = None
        while heap:
            load, p = heapq.heappop(heap)
            if held is not None and names[i] in held[p]:
                skipped.append((load, p))
                continue
            choice = (load, p)
            break
        if choice is None:  # every part with room already holds this name
            skipped.sort()
            choice = skipped.pop(0)
        for entry in skipped:
            heapq.heappush(heap, entry)
        load, p = choice
        out[p].append(i)
        counts[p] += 1
        if held is not None:
            held[p].add(names[i])
        if cap is None or counts[p] < cap:
            heapq.heappush(heap, (load + weights[i], p))
    for part in out:
        part.sort()
    return out


def _refine(
    parts: list[list[int]],
    weights: Sequence[float],
    *,
    swaps_only: bool,
    names: Sequence[str] | None = None,
    rounds: int,
) -> None:
    """Narrow the gap between the heaviest and the lightest part, in place: at most ``rounds``
    times, move one item from the heaviest to the lightest part (unless ``swaps_only``, which
    keeps counts) or swap one pair, whichever leaves the two closest; stop when nothing
    narrows it. With ``names``, no part receives a name it already holds."""
    totals = [sum(weights[i] for i in part) for part in parts]
    count = len(parts)
    for _ in range(rounds):
        hi = max(range(count), key=lambda p: (totals[p], -p))
        lo = min(range(count), key=lambda p: (totals[p], p))
        gap = totals[hi] - totals[lo]
        if gap <= 0:
            break
        hi_names = collections.Counter(names[i] for i in parts[hi]) if names else None
        lo_names = collections.Counter(names[i] for i in parts[lo]) if names else None
        best: tuple[float, int, int | None] | None = None
        if not swaps_only:
            for a in parts[hi]:
                d = weights[a]
                if 0 < d < gap and not (lo_names and lo_names[names[a]]):
                    if best is None or abs(gap - 2 * d) < best[0]:
                        best = (abs(gap - 2 * d), a, None)
        lo_sorted = sorted(parts[lo], key=lambda i: (weights[i], i))
        lo_weights = [weights[i] for i in lo_sorted]
        for a in parts[hi]:
            k = bisect.bisect_left(lo_weights, weights[a] - gap / 2)
            for j in (k - 1, k):
                if not 0 <= j < len(lo_sorted):
                    continue
                b = lo_sorted[j]
                d = weights[a] - weights[b]
                if not 0 < d < gap:
                    continue
                if names and ((lo_names[names[a]] - (names[a] == names[b]) > 0)
                              or (hi_names[names[b]] - (names[a] == names[b]) > 0)):
                    continue
                if best is None or abs(gap - 2 * d) < best[0]:
                    best = (abs(gap - 2 * d), a, b)
        if best is None:
            break
        _, a, b = best
        parts[hi].remove(a)
        parts[lo].append(a)
        totals[hi] -= weights[a]
        totals[lo] += weights[a]
        if b is not None:
            parts[lo].remove(b)
            parts[hi].append(b)
            totals[lo] -= weights[b]
            totals[hi] += weights[b]
    for part in parts:
        part.sort()


def dist_world() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


# long: the docstring is the split's specification; the code is 26 lines
def assign_shards(
    names: Sequence[str],
    *,
    world_size: int | None = None,
    num_workers: int = 1,
    weights: Mapping[str, float] | None = None,
    split: ShardSplit | None = None,
    unit: str = "frames",
) -> ShardAssignment:
    """Split the epoch's shard order between ``world_size`` ranks and their workers.

    The same ``names`` (the epoch's order from :func:`shuffle_shards`, identical everywhere)
    give the same assignment on every process, with no communication.

    1. **Equalise** (``split.equalize``): ``"drop"`` leaves out the last ``n mod world_size``
       shards of the order; ``"repeat"`` appends copies of the first shards of the order until
       ``n`` is a multiple of ``world_size``; every rank then gets exactly ``n / world_size``.
    2. **Ranks**: with ``weights`` (total length per shard, from the index) and
       ``balance="length"``, greedy longest-processing-time: shards are grouped into weight
       classes (within 5 % of each other), classes are taken largest first and, within a class,
       in the epoch's order; each shard goes to the rank with the smallest total so far
       (capped at ``n / world_size`` shards when equalising; a repeat avoids the rank holding
       its original). Because equal-weight shards keep the shuffled order, the split differs
       from epoch to epoch; because classes go largest first, the short and partial shards
       come last and fill the gaps. Then up to ``4 * world_size`` refinement rounds each
       move one shard from the heaviest to the lightest rank, or swap a pair between them
       (only swaps when equalising, so counts stay equal), whichever brings the two closest.
       Without weights (or ``balance="count"``) every shard weighs 1: plain round robin,
       rank ``r`` gets ``names[r::world_size]``.
    3. **Workers**: each rank's shards are split the same way between its ``num_workers``
       workers (by length, no cap). A rank's shards do not depend on ``num_workers``.

    Each process reads its shards in the epoch's order.

    Args:
        names: the epoch's shard order (duplicates allowed: a shard listed twice is read twice).
        world_size: ranks; default ``torch.distributed``'s world size when initialised, else 1.
        num_workers: DataLoader workers per rank (1 without workers).
        weights: ``{name: total length}``; missing names are an error.
        split: a :class:`ShardSplit` (default: balance by length, no equalising).
        unit: the weights' unit, for reports.

    Raises:
        ValueError: ``equalize="drop"`` with fewer shards than ranks (everything would be
            dropped), a name without a weight, a negative weight.

    >>> a = assign_shards(["a", "b", "c", "d", "e"], world_size=2,
    ...                   weights={"a": 9, "b": 1, "c": 1, "d": 1, "e": 8})
    >>> a.rank_shards(0), a.rank_shards(1), a.rank_totals
    (['a', 'c'], ['b', 'd', 'e'], (10.0, 10.0))
    >>> assign_shards(["a", "b", "c"], world_size=2).rank_shards(0)  # by count: round robin
    ['a', 'c']
    >>> a = assign_shards(["a", "b", "c"], world_size=2, split=ShardSplit(equalize="repeat"))
    >>> a.rank_shards(0), a.rank_shards(1), a.repeated
    (['a', 'c'], ['b', 'a'], ('a',))
    """
    names = [str(n) for n in names]
    if world_size is None:
        world_size = dist_world()[1]
    check_int("world_size", world_size, 1)
    check_int("num_workers", num_workers, 1)
    split = ShardSplit() if split is None else split
    if not isinstance(split, ShardSplit):
        raise TypeError(f"split must be a ShardSplit, got {split!r}")
    if split.level == "sample":  # everyone reads everything; the samples are split
        total = float(sum(_shard_weights(names, weights))) if weights is not None else len(names)
        every = tuple(names)
        return ShardAssignment(tuple((every,) * num_workers for _ in range(world_size)),
                               (total / world_size,) * world_size,
                               unit if weights is not None else "shards", level="sample")
    by_length = weights is not None and split.balance == "length"
    if by_length:
        w_of = _shard_weights(names, weights)
    else:
        w_of = [1.0] * len(names)
        unit = "shards"
    equal = _equalize(names, w_of, world_size, split.equalize)
    names, w_of = equal.names, equal.weights
    cap = len(names) // world_size if split.equalize is not None else None
    rank_items = _split_ranks(names, w_of, world_size, cap=cap,
                              avoid_repeats=bool(equal.repeated), refine=by_length)
    parts = []
    for items in rank_items:
        by_worker = _greedy(items, w_of, num_workers)
        parts.append(tuple(tuple(names[i] for i in worker) for worker in by_worker))
    totals = tuple(float(sum(w_of[i] for i in items)) for items in rank_items)
    return ShardAssignment(
        tuple(parts), totals, unit, tuple(equal.repeated), tuple(equal.dropped),
        repeated_weight=equal.repeated_weight, dropped_weight=equal.dropped_weight,
    )


def _shard_weights(names: Sequence[str], weights: Mapping[str, float]) -> list[float]:
    """The weight of each name, checked: every name has one, and none is negative (or NaN)."""
    w_of = []
    for name in names:
        try:
            w = float(weights[name])
        except KeyError:
            raise ValueError(f"shard {name!r} has no weight") from None
        if not w >= 0:
            raise ValueError(f"shard {name!r} has weight {w!r}; weights must be >= 0")
        w_of.append(w)
    return w_of


class _Equalized(NamedTuple):
    names: list[str]
    weights: list[float]
    repeated: list[str]
    dropped: list[str]
    repeated_weight: float = 0.0
    dropped_weight: float = 0.0


def _equalize(names: list[str], w_of: list[float], world_size: int,
              equalize: str | None) -> _Equalized:
    """The shards after making their count a multiple of ``world_size`` (step 1 of
    :func:`assign_shards`): ``"drop"`` leaves out the last ``n mod world_size``, ``"repeat"``
    appends copies of the first ones; with the names and total weight repeated or dropped."""
    n = len(names)
    if equalize == "drop" and n % world_size:
        if n < world_size:
            raise ValueError(
                f"equalize='drop' with {n} shard(s) for {world_size} ranks would drop every "
                "shard; use equalize='repeat' or fewer ranks"
            )
        keep = n - n % world_size
        return _Equalized(names[:keep], w_of[:keep], [], names[keep:],
                          dropped_weight=float(sum(w_of[keep:])))
    if equalize == "repeat" and n % world_size and n:
        extra = world_size - n % world_size
        copies = [i % n for i in range(extra)]
        repeated = [names[i] for i in copies]
        return _Equalized(names + repeated, w_of + [w_of[i] for i in copies], repeated, [],
                          repeated_weight=float(sum(w_of[i] for i in copies)))
    return _Equalized(names, w_of, [], [])


def _split_ranks(names: list[str], w_of: list[float], world_size: int, *, cap: int | None,
                 avoid_repeats: bool, refine: bool) -> list[list[int]]:
    """Each rank's shard positions (step 2 of :func:`assign_shards`): greedy by weight class,
    at most ``cap`` per rank, a repeat kept off the rank of its original when
    ``avoid_repeats``; then, when ``refine`` (balancing by length), max/min refinement --
    swaps only under a cap, so that counts stay equal."""
    avoid = names if avoid_repeats else None
    rank_items = _greedy(range(len(names)), w_of, world_size, cap=cap, names=avoid)
    if refine:
        _refine(rank_items, w_of, swaps_only=cap is not None, names=avoid, rounds=4 * world_size)
    return rank_items

