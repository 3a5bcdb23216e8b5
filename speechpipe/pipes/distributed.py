"""Distribution: who reads which shard, and how every rank takes the same number of steps.

Data-parallel training (DDP) runs one process per GPU (a **rank**), each with its own
DataLoader (and its **workers**), and all-reduces gradients at every step. Two things must
hold: the ranks read disjoint parts of the data, and they take **the same number of steps** --
a rank that runs out of batches while the others wait in an all-reduce hangs the job (the most
common way speech training dies at the end of an epoch).

**Splitting** (used by ``sharded_shuffle``, :mod:`speechpipe.pipes.sharding`):

- :func:`assign_shards`: the epoch's shard order (shuffled with ``(seed, epoch)``, identical on
  every rank and worker) split between ranks, then between each rank's workers, **balanced by
  total length** from the shard index (greedy longest-first over weight classes, then
  max/min refinement; see :func:`assign_shards`), or by count without an index. Optionally
  **equal shard counts** per rank: repeat shards (as webdataset) or drop the remainder (as
  CAT), counted.
- :class:`ShardSplit`: those choices, given to ``sharded_shuffle(split=...)``.
- :class:`ShardAssignment` / :class:`SplitBalance` / :func:`split_balance` /
  :func:`shard_assignment`: the result and its balance (max/min total frames per rank).

**All ranks share the epoch seed.** The shard order is drawn from ``(seed, epoch)`` alone, so
every process computes the same order and the same assignment without talking to the others;
only the sample buffer is seeded per ``(rank, worker)``.

**Uneven inputs** (in the main process, after the DataLoader):

- :class:`EqualSteps` (``for batch in EqualSteps(loader, policy=...)``), also as a pipe,
  ``equalize_steps`` (:class:`StepEqualizerIterDataPipe`). Policies: ``"stop"`` (all ranks
  stop when the first runs out, CAT's rule), ``"pad"`` (ranks that run out replay their own
  batches until the longest finishes), ``"plan"`` (the step count computed from the index
  before the epoch; no collective per step). Per-step policies cost one all-reduce of two
  int64 per batch on a gloo group with a timeout, so a rank that fails, stalls or dies gives
  the others a :class:`DistributedStepError` naming it instead of a hang.
- :class:`StepPlanner` / :class:`StepPlan`: the epoch's batch count per rank, from the
  index, the split and the batching run on lengths alone; the plan takes the min, mean or
  max over ranks (its ``target``).
- :class:`StepStats`: what a pass dropped and repeated, per epoch; ``print(stats.report())``.

**Map-style road**: :class:`~speechpipe.pipes.views.BatchView` with ``world_size=W`` already
gives every rank the same number of samples at every step and the same number of steps
(SpeeChain's ``ngpu`` rule); it needs none of the above.
"""

from __future__ import annotations

import bisect
import collections
import heapq
import math
import time
import traceback
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Iterable, Iterator

from ..errors import SpeechpipeError
from ._base import IterDataPipe, functional_datapipe

__all__ = [
    "BALANCE",
    "DistributedStepError",
    "EQUALIZE",
    "EqualSteps",
    "POLICIES",
    "ShardAssignment",
    "ShardSplit",
    "SplitBalance",
    "StepEqualizer",
    "StepEqualizerIterDataPipe",
    "StepPlan",
    "StepPlanner",
    "StepStats",
    "TARGETS",
    "assign_shards",
    "batch_samples",
    "shard_assignment",
    "split_balance",
]

#: How shards are balanced between ranks: by total length from the index, or by count.
BALANCE = ("length", "count")
#: How shard counts are made equal per rank (``None``: they are not).
EQUALIZE = (None, "repeat", "drop")
#: Uneven-input policies of :class:`EqualSteps`.
POLICIES = ("stop", "pad", "plan")
#: Which rank's batch count a plan takes: the fewest (drop only), the mean, the most (repeat).
TARGETS = ("min", "mean", "max")

# Shards whose weights are within this relative tolerance are one weight class: classes are
# assigned largest first (LPT), shards within a class in the epoch's shuffled order, so the
# split changes from epoch to epoch while keeping LPT's balance.
_CLASS_TOLERANCE = 0.05

# Per-step states exchanged by EqualSteps, ordered worst first (the all-reduce takes MIN).
_FAILED, _EMPTY, _EXHAUSTED, _HAVE = 0, 1, 2, 3
_STATE_NAMES = {_FAILED: "failed", _EMPTY: "had no batch at all", _EXHAUSTED: "ran out",
                _HAVE: "has a batch"}

_DEFAULT_TIMEOUT = 600.0  # seconds; torch's default for NCCL groups


class DistributedStepError(SpeechpipeError, RuntimeError):
    """The ranks cannot take their next step together: a rank failed loading its batch,
    stalled past the timeout, died, cannot pad, or the ranks disagree on the plan. The
    message names the rank (when known), the step and the epoch."""


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

    >>> ShardSplit(equalize="repeat")
    ShardSplit(balance='length', equalize='repeat')
    """

    balance: str = "length"
    equalize: str | None = None

    def __post_init__(self) -> None:
        if self.balance not in BALANCE:
            raise ValueError(f"balance must be one of {BALANCE}, got {self.balance!r}")
        if self.equalize not in EQUALIZE:
            raise ValueError(f"equalize must be one of {EQUALIZE}, got {self.equalize!r}")


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


def _dist_world() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _check_count(value: Any, name: str, minimum: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


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

    The same ``names`` (the epoch's order from
    :func:`~speechpipe.pipes.sharding.shuffle_shards`, identical everywhere) give the same
    assignment on every process, with no communication.

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
        world_size = _dist_world()[1]
    _check_count(world_size, "world_size", 1)
    _check_count(num_workers, "num_workers", 1)
    split = ShardSplit() if split is None else split
    if not isinstance(split, ShardSplit):
        raise TypeError(f"split must be a ShardSplit, got {split!r}")
    by_length = weights is not None and split.balance == "length"
    if by_length:
        w_of = []
        for name in names:
            try:
                w = float(weights[name])
            except KeyError:
                raise ValueError(f"shard {name!r} has no weight") from None
            if not w >= 0:
                raise ValueError(f"shard {name!r} has weight {w!r}; weights must be >= 0")
            w_of.append(w)
    else:
        w_of = [1.0] * len(names)
        unit = "shards"
    n = len(names)
    repeated: list[str] = []
    dropped: list[str] = []
    cap = None
    if split.equalize == "drop" and n % world_size:
        if n < world_size:
            raise ValueError(
                f"equalize='drop' with {n} shard(s) for {world_size} ranks would drop every "
                "shard; use equalize='repeat' or fewer ranks"
            )
        keep = n - n % world_size
        dropped = names[keep:]
        dropped_w = sum(w_of[keep:])
        names, w_of = names[:keep], w_of[:keep]
    elif split.equalize == "repeat" and n % world_size and n:
        extra = world_size - n % world_size
        copies = [i % n for i in range(extra)]
        repeated = [names[i] for i in copies]
        repeated_w = sum(w_of[i] for i in copies)
        names, w_of = names + repeated, w_of + [w_of[i] for i in copies]
    if split.equalize is not None:
        cap = len(names) // world_size
    rank_items = _greedy(range(len(names)), w_of, world_size, cap=cap,
                         names=names if repeated else None)
    if by_length:
        _refine(rank_items, w_of, swaps_only=cap is not None,
                names=names if repeated else None, rounds=4 * world_size)
    parts = []
    for items in rank_items:
        by_worker = _greedy(items, w_of, num_workers)
        parts.append(tuple(tuple(names[i] for i in worker) for worker in by_worker))
    totals = tuple(float(sum(w_of[i] for i in items)) for items in rank_items)
    return ShardAssignment(
        tuple(parts), totals, unit, tuple(repeated), tuple(dropped),
        repeated_weight=float(repeated_w) if repeated else 0.0,
        dropped_weight=float(dropped_w) if dropped else 0.0,
    )


def shard_assignment(
    sharded: Any,
    epoch: int | None = None,
    *,
    world_size: int | None = None,
    num_workers: int = 1,
) -> ShardAssignment:
    """The assignment a ``sharded_shuffle`` pipe makes in ``epoch`` (default: its current
    one), for every rank: lists the shards and reads the index (if the pipe has one), reads no
    shard. ``print(shard_assignment(pipe).report())`` shows the per-rank balance and the
    repeated or dropped shards.

    Args:
        sharded: a ``sharded_shuffle`` pipe (:class:`~speechpipe.pipes.sharding.ShardedShuffler`).
        epoch: the epoch (default: the pipe's current epoch).
        world_size: ranks (default: ``torch.distributed``'s, else 1).
        num_workers: DataLoader workers per rank (1 without workers).
    """
    from .sharding import ShardedShufflerIterDataPipe, shuffle_shards

    if not isinstance(sharded, ShardedShufflerIterDataPipe):
        raise TypeError(f"sharded must be a sharded_shuffle pipe, got {sharded!r}")
    epoch = sharded.epoch if epoch is None else _check_count(epoch, "epoch", 0)
    names = sharded._names()
    entries = sharded._entries(names)
    weights = None if entries is None else {n: e.total_length for n, e in entries.items()}
    unit = _index_unit(sharded)
    return assign_shards(shuffle_shards(names, sharded.seed, epoch), world_size=world_size,
                         num_workers=num_workers, weights=weights, split=sharded.split,
                         unit=unit)


def _index_unit(sharded: Any) -> str:
    index = sharded.index if not isinstance(sharded.index, bool) else sharded._loaded_index
    return getattr(index, "length_unit", "frames")


# --------------------------------------------------------------------------------------------
# Planning the steps of an epoch from the index
# --------------------------------------------------------------------------------------------


def _target_steps(target: str, low: int, high: int, total: int, world: int) -> int:
    if target == "min":
        return low
    if target == "max":
        return high
    return total // world


@dataclass(frozen=True)
class StepPlan:
    """Batches per rank in one epoch and the steps every rank takes.

    Attributes:
        epoch: the epoch planned.
        rank_batches: batches each rank's loader yields (a lower bound when not ``exact``).
        exact: whether ``rank_batches`` are exact.
        target: ``"min"``, ``"mean"`` or ``"max"`` (see :class:`StepPlanner`).
    """

    epoch: int
    rank_batches: tuple[int, ...]
    exact: bool
    target: str = "min"

    @property
    def steps(self) -> int:
        """The steps every rank takes: the min, mean (rounded down) or max of the ranks'."""
        if not self.rank_batches:
            return 0
        return _target_steps(self.target, min(self.rank_batches), max(self.rank_batches),
                             sum(self.rank_batches), len(self.rank_batches))

    @property
    def dropped_batches(self) -> int:
        """Batches left unused over all ranks (a lower bound when not ``exact``)."""
        return sum(max(0, b - self.steps) for b in self.rank_batches)

    @property
    def repeated_batches(self) -> int:
        """Batches repeated over all ranks (by ranks with fewer batches than the steps)."""
        return sum(max(0, self.steps - b) for b in self.rank_batches)


class StepPlanner:
    """The number of batches each rank yields in an epoch, computed from the shard index.

    Re-does on metadata what the ranks' pipelines will do on data: the shard order of
    ``sharded`` (its seed and epoch), the same split (:func:`assign_shards`, with the pipe's
    ``split`` and ``num_workers`` workers per rank), each worker's sample order through the
    same seeded shuffle buffer (``derive_rng(seed, epoch, rank, worker, "samples")``), and
    then ``batching`` on the **lengths** of the index.

    ``batching`` is one of:

    - an ``int`` ``B``: torch's ``batch(B)`` (``drop_last=False``): ``ceil(n / B)`` batches
      per worker. **Exact.**
    - a callable ``lengths (list of numbers, in the worker's sample order) -> iterable of
      batches``, e.g. ``lambda ls: IterableWrapper(ls, deepcopy=False).bucket_by_length(2000,
      boundaries=b).block_batch(batch_len=60000)`` -- the same batching stages as the pipeline,
      with a constraint whose ``length`` is ``None`` (bare lengths are measured as they are).
      **Exact** when (a) the stages between ``sharded_shuffle`` and the batching are 1:1 (e.g.
      ``decode``, ``map``; no ``filter``, no torch ``shuffle``), (b) the batching measures the
      same lengths as the index holds (same unit), (c) its batch count depends only on the
      order of the lengths (true of ``bucket_by_length`` with fixed ``boundaries`` or
      ``boundaries_fn``, ``block_batch`` and ``batch``; not of ``bucket_by_length``'s
      ``num_buckets``, estimated from the data after epoch 0), and (d) no shard is skipped
      (``on_error="raise"``).
    - a :class:`~speechpipe.pipes.constraints.BatchConstraint`: a **lower bound** for any order:
      a batch never holds more than the budget of real length, so a worker yields at least
      ``max(ceil(sum / budget), ceil(n / max_samples))`` batches plus one per oversize
      sample (``oversize="emit"``). Conservative: use it when the pipeline filters or the
      lengths differ; the plan then drops the batches above the bound, counted.

    **Target.** The steps every rank takes: ``"min"`` (default) the fewest batches of any
    rank -- the others drop the rest, nothing is repeated; ``"max"`` the most -- the others
    repeat batches (as ``pad``, with no collective per step); ``"mean"`` the mean, rounded
    down -- ranks above drop, ranks below repeat (the trade webdataset's ``with_epoch`` makes,
    here with each rank's exact count). All three are counted in :class:`StepStats`.

    Args:
        sharded: the ``sharded_shuffle`` pipe, with an index.
        batching: see above.
        num_workers: the DataLoader's ``num_workers`` (0 or more).
        world_size: ranks (default: ``torch.distributed``'s, else 1).
        oversize: the batching's ``oversize`` (for the lower bound).
        target: ``"min"``, ``"mean"`` or ``"max"``.

    >>> import os, tempfile
    >>> from speechpipe.index import ShardEntry, ShardIndex
    >>> from speechpipe import IterableWrapper
    >>> from speechpipe.pipes.shard_writer import ShardWriter
    >>> out = tempfile.mkdtemp()
    >>> with ShardWriter(os.path.join(out, "data-%05d.tar"), maxcount=4) as writer:
    ...     for i in range(10):  # shards of 4, 4 and 2 utterances
    ...         writer.write({"key": f"u{i}", "txt": "x"})
    >>> entries = [ShardEntry(os.path.basename(p), c, 0, tuple(f"k{j}" for j in range(c)),
    ...                       tuple([100.0] * c)) for p, c in zip(writer.paths, [4, 4, 2])]
    >>> _ = ShardIndex(out, entries).write()
    >>> pipe = IterableWrapper(writer.paths).sharded_shuffle(buffer_size=1, index=True)
    >>> plan = StepPlanner(pipe, 3, world_size=2).plan(0)  # batches of 3 utterances
    >>> plan.rank_batches, plan.steps  # 4 + 2 utterances on one rank, 4 on the other
    ((2, 2), 2)
    """

    def __init__(
        self,
        sharded: Any,
        batching: int | Callable[[list], Iterable] | Any,
        *,
        num_workers: int = 0,
        world_size: int | None = None,
        oversize: str = "emit",
        target: str = "min",
    ) -> None:
        from .constraints import OVERSIZE, BatchConstraint
        from .sharding import ShardedShufflerIterDataPipe

        if not isinstance(sharded, ShardedShufflerIterDataPipe):
            raise TypeError(f"sharded must be a sharded_shuffle pipe, got {sharded!r}")
        if sharded.index is None:
            raise ValueError(
                "StepPlanner needs the shard index: build the pipe with "
                "sharded_shuffle(..., index=True) (or index=ShardIndex(...))"
            )
        if isinstance(batching, bool) or not (
            isinstance(batching, (int, BatchConstraint)) or callable(batching)
        ):
            raise TypeError(
                f"batching must be a batch size, a BatchConstraint or a callable, got {batching!r}"
            )
        if isinstance(batching, int) and batching < 1:
            raise ValueError(f"batching must be >= 1 as a batch size, got {batching!r}")
        _check_count(num_workers, "num_workers", 0)
        if world_size is not None:
            _check_count(world_size, "world_size", 1)
        if oversize not in OVERSIZE:
            raise ValueError(f"oversize must be one of {OVERSIZE}, got {oversize!r}")
        if target not in TARGETS:
            raise ValueError(f"target must be one of {TARGETS}, got {target!r}")
        self.sharded = sharded
        self.batching = batching
        self.num_workers = num_workers
        self.world_size = world_size
        self.oversize = oversize
        self.target = target

    @property
    def exact(self) -> bool:
        """True if the count is exact (batch size or callable), False for a lower bound."""
        from .constraints import BatchConstraint

        return not isinstance(self.batching, BatchConstraint)

    def _setup(self, epoch: int | None):
        from .sharding import shuffle_shards

        sharded = self.sharded
        epoch = sharded.epoch if epoch is None else _check_count(epoch, "epoch", 0)
        names = sharded._names()
        entries = sharded._entries(names)
        world = self.world_size if self.world_size is not None else _dist_world()[1]
        workers = max(1, self.num_workers)
        weights = {n: e.total_length for n, e in entries.items()}
        assignment = assign_shards(shuffle_shards(names, sharded.seed, epoch), world_size=world,
                                   num_workers=workers, weights=weights, split=sharded.split)
        return epoch, entries, assignment

    def _worker_batches(self, epoch: int, entries, shards: list[str], rank: int, worker: int):
        from .constraints import BatchConstraint
        from .sharding import _SAMPLES_SALT, shuffle_buffer
        from ..seeding import derive_rng

        lengths = [n for name in shards for n in entries[name].lengths]
        if isinstance(self.batching, int):
            return -(-len(lengths) // self.batching)
        if isinstance(self.batching, BatchConstraint):
            return _lower_bound(lengths, self.batching, self.oversize)
        sharded = self.sharded
        rng = derive_rng(sharded.seed, epoch, rank, worker, _SAMPLES_SALT)
        ordered = list(shuffle_buffer(lengths, sharded.buffer_size, rng))
        return sum(1 for _ in self.batching(ordered))

    def rank_batches(self, epoch: int | None = None, rank: int | None = None) -> int:
        """Batches ``rank`` (default: this process's) yields in ``epoch`` (default: the pipe's
        current epoch), over its workers."""
        epoch, entries, assignment = self._setup(epoch)
        rank = _dist_world()[0] if rank is None else rank
        if not 0 <= rank < assignment.world_size:
            raise ValueError(f"rank must be in [0, {assignment.world_size}), got {rank!r}")
        return sum(self._worker_batches(epoch, entries, assignment.shards(rank, w), rank, w)
                   for w in range(assignment.num_workers))

    def plan(self, epoch: int | None = None) -> StepPlan:
        """Batches of every rank in ``epoch`` (computes all ranks: ``world_size`` times the
        work of :meth:`rank_batches`)."""
        epoch, entries, assignment = self._setup(epoch)
        per_rank = tuple(
            sum(self._worker_batches(epoch, entries, assignment.shards(r, w), r, w)
                for w in range(assignment.num_workers))
            for r in range(assignment.world_size)
        )
        return StepPlan(epoch, per_rank, self.exact, self.target)

    def steps(self, epoch: int | None = None) -> int:
        """Steps every rank takes in ``epoch`` (:attr:`StepPlan.steps` of :meth:`plan`)."""
        return self.plan(epoch).steps


def _lower_bound(lengths: Sequence, constraint: Any, oversize: str) -> int:
    """Fewest batches any order of ``lengths`` can be packed into under ``constraint``."""
    from .constraints import TwoDimensional

    if not lengths:
        return 0
    empty = constraint.empty()
    normal = [n for n in lengths if constraint.within(constraint.add(empty, n))]
    over = len(lengths) - len(normal)
    bound = 0
    if normal:
        if isinstance(constraint, TwoDimensional):
            bound = max(math.ceil(sum(n[0] for n in normal) / constraint.budget_in),
                        math.ceil(sum(n[1] for n in normal) / constraint.budget_out))
        else:
            budget = getattr(constraint, "budget", math.inf)
            total = sum(n[0] if isinstance(n, tuple) else n for n in normal)
            bound = math.ceil(total / budget) if math.isfinite(budget) else 1
        if constraint.max_samples is not None:
            bound = max(bound, math.ceil(len(normal) / constraint.max_samples))
        bound = max(bound, 1)
    return bound + (over if oversize == "emit" else 0)


# --------------------------------------------------------------------------------------------
# Equal steps on every rank
# --------------------------------------------------------------------------------------------


def batch_samples(batch: Any) -> int:
    """Samples in a batch: ``len`` of a list, of a dict's ``"key"`` list (as ``PadCollate``
    keeps it) or of its first field, or the first dimension of a tensor.

    >>> batch_samples([{"key": "a"}, {"key": "b"}]), batch_samples({"key": ["a", "b", "c"]})
    (2, 3)
    """
    if isinstance(batch, Mapping):
        value = batch["key"] if "key" in batch else next(iter(batch.values()), None)
        return batch_samples(value) if value is not None else 0
    shape = getattr(batch, "shape", None)
    if shape is not None and len(shape) >= 1:
        return int(shape[0])
    if isinstance(batch, Sequence) and not isinstance(batch, (str, bytes)):
        return len(batch)
    raise TypeError(
        f"cannot count the samples of a {type(batch).__name__} batch; pass count_fn= to "
        "EqualSteps"
    )


@dataclass
class StepStats:
    """What one pass of :class:`EqualSteps` did on this rank.

    Attributes:
        policy, rank, world_size, epoch: the pass.
        steps: steps taken (the same on every rank).
        batches / samples: batches and samples of this rank's own data yielded.
        dropped_batches / dropped_samples: batches of this rank's data not yielded (``stop``
            and ``plan``: the ones after the last step).
        drained: True if the dropped counts are complete (the loader was read to its end);
            False if it was left unread (``count_dropped=False``): they are then lower bounds.
        repeated_batches / repeated_samples: batches yielded a second time (``pad``, and
            ``plan`` when the loader ran short of the plan).
        ended_by: ``stop``: the lowest rank that ran out first.
        planned: ``plan``: the steps agreed on.
        collectives / wait_seconds: all-reduces made and time spent in them.
    """

    policy: str
    rank: int = 0
    world_size: int = 1
    epoch: int | None = None
    steps: int = 0
    batches: int = 0
    samples: int = 0
    dropped_batches: int = 0
    dropped_samples: int = 0
    drained: bool = True
    repeated_batches: int = 0
    repeated_samples: int = 0
    ended_by: int | None = None
    planned: int | None = None
    collectives: int = 0
    wait_seconds: float = 0.0

    def report(self) -> str:
        where = f"rank {self.rank}/{self.world_size}"
        epoch = "" if self.epoch is None else f" epoch {self.epoch}"
        lines = [f"equalize_steps ({self.policy}){epoch}, {where}: {self.steps} steps, "
                 f"{self.batches} batches / {self.samples} samples of its own data"]
        more = "" if self.drained else " at least (loader not drained)"
        if self.dropped_batches or not self.drained:
            lines.append(f"  dropped{more}: {self.dropped_batches} batches, "
                         f"{self.dropped_samples} samples")
        if self.repeated_batches:
            lines.append(f"  repeated: {self.repeated_batches} batches, "
                         f"{self.repeated_samples} samples")
        if self.ended_by is not None:
            lines.append(f"  ended when rank {self.ended_by} ran out")
        if self.planned is not None:
            lines.append(f"  planned steps: {self.planned}")
        lines.append(f"  {self.collectives} collective(s), {self.wait_seconds:.3f} s waiting")
        return "\n".join(lines)


_GROUPS: dict[float, tuple[Any, Any]] = {}


def _signal_group(timeout: float):
    """A gloo group with ``timeout`` for CPU-side signalling, made once per default group and
    timeout (``new_group`` is collective: every rank reaches this in the same order)."""
    import torch.distributed as dist

    world = dist.distributed_c10d._get_default_group()
    cached = _GROUPS.get(timeout)
    if cached is not None and cached[0] is world:
        return cached[1]
    group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout))
    _GROUPS[timeout] = (world, group)
    return group


class _Signals:
    """The per-step exchange: every rank contributes ``(state, rank)``; one all-reduce(MIN)
    of two int64 gives the worst and the best ``(state, rank)`` over the ranks."""

    def __init__(self, group, timeout: float, stats: StepStats) -> None:
        import torch
        import torch.distributed as dist

        self.dist = dist
        self.torch = torch
        self.active = dist.is_available() and dist.is_initialized()
        self.timeout = timeout
        self.stats = stats
        if self.active:
            self.group = group if group is not None else _signal_group(timeout)
            self.rank = dist.get_rank()
            self.world = dist.get_world_size()
        else:
            self.group, self.rank, self.world = None, 0, 1

    def _all_reduce(self, values: list[int], what: str, op: str = "MIN") -> list[int]:
        if not self.active:
            return values
        tensor = self.torch.tensor(values, dtype=self.torch.int64)
        start = time.perf_counter()
        try:
            self.dist.all_reduce(tensor, op=getattr(self.dist.ReduceOp, op), group=self.group)
        except RuntimeError as exc:
            waited = time.perf_counter() - start
            if waited >= 0.9 * self.timeout:
                cause = (f"no answer within the timeout ({self.timeout:g} s): a rank stalled "
                         "(or spends longer than the timeout between steps, e.g. validating "
                         "alone; raise timeout=)")
            else:
                cause = "another rank died or left the loop (its connection closed)"
            raise DistributedStepError(
                f"equalize_steps: rank {self.rank}: the all-reduce {what} failed after "
                f"{waited:.1f} s: {cause} -- check the other ranks' logs ({exc})"
            ) from exc
        finally:
            self.stats.collectives += 1
            self.stats.wait_seconds += time.perf_counter() - start
        return tensor.tolist()

    def exchange(self, state: int, what: str) -> tuple[tuple[int, int], tuple[int, int]]:
        """``((worst state, its lowest rank), (best state, its lowest rank))``."""
        w = self.world
        key = state * w + self.rank
        best_key = (_HAVE - state) * w + self.rank  # MIN of this = best state, lowest rank
        worst, best = self._all_reduce([key, best_key], what)
        return divmod(worst, w), (_HAVE - best // w, best % w)

    def agree(self, value: int, what: str) -> tuple[int, int]:
        """``(min, max)`` of ``value`` over the ranks."""
        low, neg_high = self._all_reduce([value, -value], what)
        return low, -neg_high

    def total(self, value: int, what: str) -> int:
        """The sum of ``value`` over the ranks."""
        return self._all_reduce([value], what, op="SUM")[0]


def _check_timeout(timeout: Any) -> float:
    if isinstance(timeout, timedelta):
        timeout = timeout.total_seconds()
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout must be a number of seconds > 0 or a timedelta, got {timeout!r}")
    return float(timeout)


class EqualSteps:
    """Make every rank take the same number of steps: wrap the DataLoader in the main process.

    ``for batch in EqualSteps(loader, policy="stop"): ...`` yields ``loader``'s batches
    (whatever they are) so that all ranks of the ``torch.distributed`` job take the same
    number of steps in every pass. It runs in the main process, after the DataLoader, so
    DataLoader workers are fine. Outside ``torch.distributed`` it passes batches through
    (``plan`` still cuts at the planned steps).

    Policies:

    - ``"stop"``: every step, each rank fetches its next batch and the ranks all-reduce one
      pair of int64 (who has a batch); when any rank has none, every rank stops (CAT's rule:
      the first rank to run out ends the epoch). The batches fetched for that last step and,
      with ``count_dropped``, the rest of each rank's loader (read to the end without being
      yielded) are counted as dropped.
    - ``"pad"``: the same exchange; a rank that ran out yields its own batches again -- the
      first ``pad_cache`` batches of its pass, kept in memory and cycled (so no worker restart
      and no I/O; do not modify batches in place) -- until no rank has data left. Repeats are
      counted. A rank with no batch at all while others have data is an error (give it data:
      ``ShardSplit(equalize="repeat")``).
    - ``"plan"``: the steps are known before the epoch: ``steps`` is an int, a callable
      ``epoch -> int`` (called with ``set_epoch``'s epoch) or a :class:`StepPlanner` (this
      rank's batch count from the index). At the start of the pass the ranks agree with one
      all-reduce (two with ``target="mean"``): a planner's ranks take the min, mean or max
      of their counts (its ``target``); ints that differ between ranks are an error. Then
      every rank takes exactly that many steps with **no collective per step**. Batches
      beyond the plan are dropped (counted; drained with ``count_dropped``); a rank whose
      loader ends first repeats its cached batches (as ``pad``), counted -- expected with a
      planner's ``"mean"``/``"max"`` target, otherwise a warning (the plan was not a lower
      bound: a filter, a skipped shard, another length unit).

    Why a cache and not a second pass over the loader: a DataLoader over a DataPipe creates
    a gloo group and broadcasts a seed at every ``iter()`` (a collective), so one rank cannot
    restart its loader alone; the cache also costs no I/O and no worker start.

    **Never hangs.** The exchange runs on a gloo group created for it (CPU tensors, also
    when the model uses NCCL) with ``timeout``. A rank whose loader raises tells the others in
    the same exchange before re-raising: they raise :class:`DistributedStepError` naming it.
    A rank that dies makes the others' exchange fail at once (gloo sees the connection
    close); one that stalls makes it time out after ``timeout`` seconds; both raise
    :class:`DistributedStepError`. Choose ``timeout`` longer than anything a rank does
    between two steps that the others do not wait for (rank 0 validating or saving a
    checkpoint alone). Every rank must iterate the same way: leaving the loop early on
    one rank only leaves the others waiting until the timeout.

    Args:
        loader: any iterable of batches (a DataLoader, a pipe); ``iter()`` is called once per
            pass.
        policy: ``"stop"``, ``"pad"`` or ``"plan"``.
        steps: for ``"plan"``: an int, a callable ``epoch -> int``, or a :class:`StepPlanner`.
        timeout: seconds (or a ``timedelta``) a collective may wait (default 600).
        group: a process group to signal on instead of the gloo group made for ``timeout``.
        pad_cache: batches kept for ``pad`` (and for a short ``plan``).
        count_dropped: read the rest of the loader after the last step to count what is
            dropped (``stop``, ``plan``); False leaves it unread (counts are then lower bounds).
        count_fn: samples in a batch (default :func:`batch_samples`).

    Attributes:
        stats: :class:`StepStats` of the last (or current) pass.

    >>> steps = EqualSteps([["a", "b"], ["c"]], policy="stop")
    >>> list(steps), steps.stats.steps, steps.stats.samples
    ([['a', 'b'], ['c']], 2, 3)
    >>> planned = EqualSteps([["a", "b"], ["c"], ["d"]], policy="plan", steps=2)
    >>> list(planned), planned.stats.dropped_batches, len(planned)
    ([['a', 'b'], ['c']], 1, 2)
    """

    def __init__(
        self,
        loader: Iterable,
        policy: str = "stop",
        *,
        steps: int | Callable[[int], int] | StepPlanner | None = None,
        timeout: float | timedelta = _DEFAULT_TIMEOUT,
        group: Any = None,
        pad_cache: int = 4,
        count_dropped: bool = True,
        count_fn: Callable[[Any], int] | None = None,
    ) -> None:
        if isinstance(loader, (str, bytes)) or not isinstance(loader, Iterable):
            raise TypeError(f"loader must be an iterable of batches, got {loader!r}")
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
        if policy == "plan":
            if steps is None:
                raise ValueError("policy='plan' needs steps= (an int, epoch -> int, or a "
                                 "StepPlanner)")
            if isinstance(steps, bool) or not (
                isinstance(steps, (int, StepPlanner)) or callable(steps)
            ):
                raise TypeError(f"steps must be an int, a callable or a StepPlanner, got {steps!r}")
            if isinstance(steps, int) and steps < 0:
                raise ValueError(f"steps must be >= 0, got {steps!r}")
            if isinstance(steps, StepPlanner):
                workers = getattr(loader, "num_workers", None)
                if isinstance(workers, int) and max(1, workers) != max(1, steps.num_workers):
                    raise ValueError(
                        f"the StepPlanner plans for num_workers={steps.num_workers} but the "
                        f"loader has num_workers={workers}"
                    )
        elif steps is not None:
            raise ValueError(f"steps= is for policy='plan', not {policy!r}")
        _check_count(pad_cache, "pad_cache", 1)
        if count_fn is not None and not callable(count_fn):
            raise TypeError(f"count_fn must be callable, got {count_fn!r}")
        self.loader = loader
        self.policy = policy
        self.steps = steps
        self.timeout = _check_timeout(timeout)
        self.group = group
        self.pad_cache = pad_cache
        self.count_dropped = bool(count_dropped)
        self.count_fn = count_fn or batch_samples
        self.epoch: int | None = None
        self.stats = StepStats(policy)

    def set_epoch(self, epoch: int) -> EqualSteps:
        """The epoch of the next pass (for ``steps`` callables and planners, and the report)."""
        self.epoch = _check_count(epoch, "epoch", 0)
        return self

    def __len__(self) -> int:
        if self.policy == "plan" and isinstance(self.steps, int):
            return self.steps
        raise TypeError(
            f"EqualSteps(policy={self.policy!r}) has no len(): the steps are known only when "
            "the ranks agree (use policy='plan' with an int, or StepPlanner.steps())"
        )

    def __iter__(self) -> Iterator[Any]:
        stats = StepStats(self.policy, epoch=self.epoch)
        self.stats = stats
        signals = _Signals(self.group, self.timeout, stats)
        stats.rank, stats.world_size = signals.rank, signals.world
        if self.policy == "plan":
            yield from self._planned(signals, stats)
        else:
            yield from self._synced(signals, stats)

    # -- helpers

    def _drain(self, it: Iterator, stats: StepStats) -> None:
        if not self.count_dropped:
            stats.drained = False
            return
        for batch in it:
            stats.dropped_batches += 1
            stats.dropped_samples += self.count_fn(batch)

    def _own(self, batch: Any, cache: list, stats: StepStats) -> Any:
        stats.batches += 1
        stats.samples += self.count_fn(batch)
        if len(cache) < self.pad_cache:
            cache.append(batch)
        return batch

    def _repeat(self, cache: list, stats: StepStats) -> Any:
        batch = cache[stats.repeated_batches % len(cache)]
        stats.repeated_batches += 1
        stats.repeated_samples += self.count_fn(batch)
        return batch

    def _synced(self, signals: _Signals, stats: StepStats) -> Iterator[Any]:
        end = object()
        it = iter(self.loader)
        cache: list = []
        exhausted = False
        epoch = "" if self.epoch is None else f" of epoch {self.epoch}"
        try:
            while True:
                batch, error = end, None
                if not exhausted:
                    try:
                        batch = next(it, end)
                    except Exception as exc:  # tell the others, then raise it here
                        error = exc
                exhausted = exhausted or (batch is end and error is None)
                if error is not None:
                    state = _FAILED
                elif batch is not end:
                    state = _HAVE
                else:
                    state = _EXHAUSTED if cache else _EMPTY
                what = f"before step {stats.steps}{epoch}"
                (worst, worst_rank), (best, _) = signals.exchange(state, what)
                if error is not None:
                    # The loader's finished frames (a DataLoader iterator among their locals)
                    # are cleared so that its workers shut down below, not whenever the
                    # traceback is collected; the traceback's lines and message stay.
                    traceback.clear_frames(error.__traceback__)
                    raise error
                if worst == _FAILED:
                    raise DistributedStepError(
                        f"equalize_steps: rank {worst_rank} failed loading its batch for step "
                        f"{stats.steps}{epoch} (its own traceback is in its log); rank "
                        f"{signals.rank} stops too so that no rank waits for it"
                    )
                if self.policy == "stop":
                    if worst == _HAVE:
                        stats.steps += 1
                        yield self._own(batch, cache, stats)
                        continue
                    stats.ended_by = worst_rank
                    if batch is not end:
                        stats.dropped_batches += 1
                        stats.dropped_samples += self.count_fn(batch)
                    if not exhausted:
                        self._drain(it, stats)
                    return
                # pad
                if best != _HAVE:
                    return
                if worst == _EMPTY:
                    raise DistributedStepError(
                        f"equalize_steps(policy='pad'): rank {worst_rank} has no batch at all in "
                        f"this pass{epoch}, so it has nothing to repeat while others still have "
                        "data; give every rank data (ShardSplit(equalize='repeat'), fewer ranks) "
                        "or use policy='stop'"
                    )
                stats.steps += 1
                if batch is end:
                    yield self._repeat(cache, stats)
                else:
                    yield self._own(batch, cache, stats)
        finally:
            it = None  # DataLoader workers shut down now, not when a traceback is freed

    def _planned_steps(self, signals: _Signals, stats: StepStats) -> int:
        epoch = self.epoch
        if isinstance(self.steps, StepPlanner):
            planner = self.steps
            local = planner.rank_batches(epoch, signals.rank if signals.active else 0)
            low, high = signals.agree(local, "agreeing on the planned steps")
            total = (signals.total(local, "agreeing on the planned steps")
                     if planner.target == "mean" else 0)
            return _target_steps(planner.target, low, high, total, signals.world)
        local = self.steps if isinstance(self.steps, int) else self.steps(epoch)
        if isinstance(local, bool) or not isinstance(local, int) or local < 0:
            raise ValueError(f"steps({epoch!r}) must return an int >= 0, got {local!r}")
        low, high = signals.agree(local, "agreeing on the planned steps")
        if low != high:
            raise DistributedStepError(
                f"equalize_steps(policy='plan'): the ranks were given different step counts "
                f"(from {low} to {high}; rank {signals.rank} has {local}); every rank must "
                "compute the same plan (same shard list, index, seed and epoch)"
            )
        return low

    def _planned(self, signals: _Signals, stats: StepStats) -> Iterator[Any]:
        steps = self._planned_steps(signals, stats)
        stats.planned = steps
        end = object()
        it = iter(self.loader)
        cache: list = []
        exhausted = False
        try:
            for _ in range(steps):
                batch = end if exhausted else next(it, end)
                if batch is end:
                    exhausted = True
                    if not cache:
                        raise DistributedStepError(
                            f"equalize_steps(policy='plan'): rank {signals.rank}'s loader yielded "
                            f"nothing but the plan has {steps} steps; the plan does not match the "
                            "data (another index, a filter, skipped shards?)"
                        )
                    stats.steps += 1
                    yield self._repeat(cache, stats)
                    continue
                stats.steps += 1
                yield self._own(batch, cache, stats)
            expected = isinstance(self.steps, StepPlanner) and self.steps.target != "min"
            if exhausted and not expected:
                warnings.warn(
                    f"equalize_steps(policy='plan'): rank {signals.rank}'s loader ended after "
                    f"{stats.batches} of {steps} planned steps; {stats.repeated_batches} batch(es) "
                    "were repeated so that every rank still takes the same steps. The plan was "
                    "not a lower bound for this data (a filter, skipped shards, another unit?)",
                    RuntimeWarning,
                    stacklevel=2,
                )
            if not exhausted:
                self._drain(it, stats)
        finally:
            it = None

# --------------------------------------------------------------------------------------------
# The pipe form
# --------------------------------------------------------------------------------------------


@functional_datapipe("equalize_steps")
class StepEqualizerIterDataPipe(IterDataPipe):
    """Give every rank the same number of steps (functional name: ``equalize_steps``).

    The pipe form of :class:`EqualSteps`, for a pipe iterated in the main process -- in
    particular one wrapping the DataLoader: ``IterableWrapper(loader, deepcopy=False)
    .equalize_steps(policy="stop")``. Consumes batches (any objects) and yields the same
    batches, cut (``stop``, ``plan``) or extended with repeats (``pad``) so that all ranks
    take the same number of steps; see :class:`EqualSteps` for the policies and the timeout.
    It must not run inside DataLoader workers (they cannot talk to the other ranks): placed
    before a DataLoader with workers, it raises ``RuntimeError`` when iterated there. A
    DataLoader hides the pipe inside it from graph walks: call ``speechpipe.set_epoch`` on
    that pipe, not on this one.

    Args:
        source_datapipe: batches.
        policy: ``"stop"``, ``"pad"`` or ``"plan"``.
        **kwargs: the options of :class:`EqualSteps` (``steps``, ``timeout``, ``group``,
            ``pad_cache``, ``count_dropped``, ``count_fn``).

    ``self.stats`` is the :class:`StepStats` of the last pass.

    >>> from speechpipe import IterableWrapper
    >>> pipe = IterableWrapper([[1, 2], [3], [4]]).equalize_steps(policy="plan", steps=2)
    >>> list(pipe), pipe.stats.dropped_batches
    ([[1, 2], [3]], 1)
    """

    def __init__(self, source_datapipe: Iterable, policy: str = "stop", **kwargs: Any) -> None:
        self.source_datapipe = source_datapipe
        self._steps = EqualSteps(source_datapipe, policy, **kwargs)

    @property
    def stats(self) -> StepStats:
        return self._steps.stats

    def set_epoch(self, epoch: int) -> StepEqualizerIterDataPipe:
        """The epoch of the next pass (see :meth:`EqualSteps.set_epoch`)."""
        self._steps.set_epoch(epoch)
        return self

    def __iter__(self) -> Iterator[Any]:
        import torch.utils.data

        if torch.utils.data.get_worker_info() is not None:
            raise RuntimeError(
                "equalize_steps runs in the main process, after the DataLoader: wrap the "
                "loader (IterableWrapper(loader, deepcopy=False).equalize_steps(...) or "
                "EqualSteps(loader)), not a pipe given to a DataLoader with workers"
            )
        yield from self._steps

    def __len__(self) -> int:
        return len(self._steps)


StepEqualizer = StepEqualizerIterDataPipe
