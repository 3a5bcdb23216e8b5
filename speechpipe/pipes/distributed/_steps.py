"""Step planning: how many batches each rank yields in an epoch, from the shard index.

Data-parallel ranks must take the same number of steps (see :mod:`speechpipe.pipes.
distributed`). The ``"plan"`` policy of :class:`~speechpipe.pipes.distributed._equal.EqualSteps`
knows that number before the epoch, with no collective per step:

- :class:`StepPlanner` / :class:`StepPlan`: the epoch's batch count per rank, from the
  index, the split and the batching run on lengths alone; the plan takes the min, mean or
  max over ranks (its ``target``).
- :class:`StepStats`: what a pass of ``EqualSteps`` dropped and repeated, per epoch;
  ``print(stats.report())``; :func:`batch_samples`: the samples of a batch it counts.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import numpy as np

from ...errors import check_int
from ...seeding import process_position
from .._core import graph_nodes, IterDataPipe
from ..batching import BatchConstraint, IndexLength, OVERSIZE, TwoDimensional
from ..order import dist_world, EpochPlan, ShardedShufflerIterDataPipe

__all__ = [
    "StepPlan",
    "StepPlanner",
    "StepStats",
    "TARGETS",
    "batch_samples",
    "stream_planner",
]


#: Which rank's batch count a plan takes: the fewest (drop only), the mean, the most (repeat).
TARGETS = ("min", "mean", "max")


# --------------------------------------------------------------------------------------------
# Planning the steps of an epoch from the index
# --------------------------------------------------------------------------------------------


def target_steps(target: str, low: int, high: int, total: int, world: int) -> int:
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
        return target_steps(self.target, min(self.rank_batches), max(self.rank_batches),
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

    Re-does on metadata what the ranks' pipelines will do on data, through the reader's own
    plan: the shards every worker of every rank reads (``sharded.epoch_plans``: the pipe's
    shard order, seed, epoch and ``split``, with ``num_workers`` workers per rank), each
    worker's sample order through the same seeded shuffle buffer (``sharded.sample_order``),
    and then ``batching`` on the **lengths** of the index.

    ``batching`` is one of:

    - an ``int`` ``B``: torch's ``batch(B)`` (``drop_last=False``): ``ceil(n / B)`` batches
      per worker. **Exact.**
    - a callable ``lengths (list of numbers, in the worker's sample order) -> iterable of
      batches``, e.g. ``lambda ls: IterableWrapper(ls, deepcopy=False).bucket_by_length(2000,
      boundaries=b).block_batch(PaddedArea(60000))`` -- the same batching stages as the
      pipeline.
      The lengths are :class:`~speechpipe.pipes.constraints.IndexLength` numbers that carry
      the index's unit, so the constraints measure them in their own unit, as they measure
      the pipeline's samples: seconds for ``length="duration"`` (the audio road:
      ``durations_from_index``), the index's frames or samples for ``length=None``; a
      constraint that cannot measure the index's unit (``length=None`` on an index in
      seconds) raises :class:`~speechpipe.pipes.batching.LengthUnitError` instead of
      planning in another unit. **Exact** when (a) the stages between ``sharded_shuffle`` and
      the batching are 1:1 (e.g. ``decode``, ``map``; no ``filter``, no torch ``shuffle``),
      (b) the batching measures what the index holds (the index in samples of the audio, the
      pipeline measuring audio samples, not frames of features computed from it: measure
      durations then), (c) its batch count depends only on the
      order of the lengths (true of ``bucket_by_length`` with fixed ``boundaries`` or
      ``boundaries_fn``, ``block_batch`` and ``batch``; not of ``bucket_by_length``'s
      ``num_buckets``, estimated from the data after epoch 0), and (d) no shard is skipped
      (``on_error="raise"``).
    - a :class:`~speechpipe.pipes.batching._buckets.BatchConstraint`: a **lower bound** for any order:
      a batch never holds more than the budget of real length, so a worker yields at least
      ``max(ceil(sum / budget), ceil(n / max_samples))`` batches plus one per oversize
      sample (``oversize="emit"``). Conservative: use it when the pipeline filters or the
      lengths differ; the plan then drops the batches above the bound, counted.

    **Over virtual streams.** Given a ``plan_batches`` pipeline (or a loader over one: see
    :func:`stream_planner`) and no ``batching``, the count is the plan's own
    (:meth:`~speechpipe.pipes.batching.StreamPlan.steps`): every rank takes the same steps,
    ``ceil`` or ``floor`` of the epoch's global batches over the ranks (its ``uneven``), from
    the global batch the pass starts at (a resumed epoch counts what is left). **Exact**, the
    same on every rank, for any number of workers, and known without a collective.

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
    >>> from speechpipe.pipes.shards import ShardWriter
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
        batching: int | Callable[[list], Iterable] | Any = None,
        *,
        num_workers: int = 0,
        world_size: int | None = None,
        oversize: str = "emit",
        target: str = "min",
    ) -> None:
        self.streams = None if isinstance(sharded, ShardedShufflerIterDataPipe) else \
            stream_planner(sharded)
        if self.streams is not None and batching is not None:
            raise TypeError("a plan_batches pipeline batches itself: give StepPlanner no "
                            f"batching, got {batching!r}")
        if self.streams is not None:
            batching = 0  # unused: the plan counts
        elif not isinstance(sharded, ShardedShufflerIterDataPipe):
            raise TypeError(f"sharded must be a sharded_shuffle pipe or a plan_batches "
                            f"pipeline, got {sharded!r}")
        elif sharded.index is None:
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
        if isinstance(batching, int) and batching < 1 and self.streams is None:
            raise ValueError(f"batching must be >= 1 as a batch size, got {batching!r}")
        check_int("num_workers", num_workers, 0)
        if world_size is not None:
            check_int("world_size", world_size, 1)
        if oversize not in OVERSIZE:
            raise ValueError(f"oversize must be one of {OVERSIZE}, got {oversize!r}")
        if target not in TARGETS:
            raise ValueError(f"target must be one of {TARGETS}, got {target!r}")
        self.sharded = sharded
        self.batching = batching if self.streams is None else None
        self.num_workers = num_workers
        self.world_size = world_size
        self.oversize = oversize
        self.target = target

    @property
    def exact(self) -> bool:
        """True if the count is exact (batch size, callable, virtual streams), False for a
        lower bound."""
        return not isinstance(self.batching, BatchConstraint)

    def _stream_steps(self, epoch: int | None) -> tuple[int, int, int]:
        """Over virtual streams: ``(epoch, world size, steps of every rank)``, from the global
        batch the planner's pass starts at when ``epoch`` is its current one."""
        planner = self.streams
        epoch = planner.epoch if epoch is None else check_int("epoch", epoch, 0)
        world = self.world_size if self.world_size is not None else \
            process_position().world_size
        start = planner.start if epoch == planner.epoch else 0
        return epoch, world, planner.plan(epoch).steps(world, start=start,
                                                       uneven=planner.uneven)

    def _plans(self, epoch: int | None) -> tuple[tuple[EpochPlan, ...], ...]:
        """Every worker's epoch plan, ``plans[rank][worker]``, from the pipe (one split)."""
        sharded = self.sharded
        epoch = sharded.epoch if epoch is None else check_int("epoch", epoch, 0)
        world = self.world_size if self.world_size is not None else dist_world()[1]
        return sharded.epoch_plans(epoch, world_size=world, num_workers=max(1, self.num_workers))

    def _worker_batches(self, plan: EpochPlan) -> int:
        unit, rate = index_unit(self.sharded)
        if isinstance(self.batching, int):
            return -(-sum(len(shard.lengths) for shard in plan.shards) // self.batching)
        if isinstance(self.batching, BatchConstraint):  # from the mapped lengths
            measured = self.__dict__.setdefault("_measured", {})
            return _array_lower_bound(plan, self.batching, self.oversize, unit, rate, measured)
        ordered = list(self.sharded.sample_order(plan, _index_lengths(plan, unit, rate,
                                                                      self.__dict__)))
        return sum(1 for _ in self.batching(ordered))

    def rank_batches(self, epoch: int | None = None, rank: int | None = None) -> int:
        """Batches ``rank`` (default: this process's) yields in ``epoch`` (default: the pipe's
        current epoch), over its workers."""
        if self.streams is not None:
            _, world, steps = self._stream_steps(epoch)
            if rank is not None and not 0 <= rank < world:
                raise ValueError(f"rank must be in [0, {world}), got {rank!r}")
            return steps
        plans = self._plans(epoch)
        rank = dist_world()[0] if rank is None else rank
        if not 0 <= rank < len(plans):
            raise ValueError(f"rank must be in [0, {len(plans)}), got {rank!r}")
        return sum(self._worker_batches(plan) for plan in plans[rank])

    def plan(self, epoch: int | None = None) -> StepPlan:
        """Batches of every rank in ``epoch`` (computes all ranks: ``world_size`` times the
        work of :meth:`rank_batches`)."""
        if self.streams is not None:
            epoch, world, steps = self._stream_steps(epoch)
            return StepPlan(epoch, (steps,) * world, True, self.target)
        plans = self._plans(epoch)
        per_rank = tuple(sum(self._worker_batches(plan) for plan in rank) for rank in plans)
        return StepPlan(plans[0][0].epoch, per_rank, self.exact, self.target)

    def steps(self, epoch: int | None = None) -> int:
        """Steps every rank takes in ``epoch`` (:attr:`StepPlan.steps` of :meth:`plan`)."""
        return self.plan(epoch).steps


def stream_planner(pipeline: Any) -> Any:
    """The stage of a pipeline that plans over virtual streams (``plan_batches``, or
    ``batch_by_view`` over a view with streams; of a loader, DataLoader or dataset over one:
    their ``dataset`` / ``pipe``), or ``None`` if it has none.

    >>> from speechpipe import IterableWrapper
    >>> stream_planner(IterableWrapper(["a.tar"]).plan_batches(60.0, index=True)) is not None
    True
    >>> stream_planner(IterableWrapper([1, 2])) is None
    True
    """
    seen = 0
    while not isinstance(pipeline, IterDataPipe) and seen < 3:  # Loader -> PipeDataset -> pipe
        inner = getattr(pipeline, "dataset", None)  # not `or`: a dataset's truth is its len()
        pipeline = inner if inner is not None else getattr(pipeline, "pipe", None)
        seen += 1
    if not isinstance(pipeline, IterDataPipe):
        return None
    found = [n for n in graph_nodes(pipeline) if getattr(n, "topology_free", False) is True]
    if len(found) > 1:
        raise ValueError(f"the pipeline has {len(found)} plan_batches stages: one counts the "
                         "steps")
    return found[0] if found else None


def index_unit(sharded: Any) -> tuple[str, int | None]:
    """The unit of the index lengths the pipe planned with, and the audio's rate."""
    index = sharded.index if not isinstance(sharded.index, bool) else getattr(
        sharded, "_loaded_index", None)
    return getattr(index, "length_unit", "frames"), getattr(index, "sample_rate", None)


def _plan_codes(plan: EpochPlan) -> tuple[Any, np.ndarray] | None:
    """``(table, codes)``: a worker's lengths as their places in the mapped table's distinct
    lengths, in reading order, when every shard of the plan is a whole shard of one table;
    else ``None``."""
    spans = [getattr(s.lengths, "span", None) for s in plan.shards]
    if not spans or any(sp is None or sp[0] is not spans[0][0] for sp in spans):
        return None
    table = spans[0][0]
    return table, np.concatenate([table.codes[start:stop] for _, start, stop in spans])


def _index_lengths(plan: EpochPlan, unit: str, rate: int | None, cache: dict
                   ) -> Iterator[IndexLength]:
    """A worker's lengths as :class:`IndexLength` numbers, in reading order. From a mapped
    table: one object per distinct length of the table (made once, kept in ``cache`` across
    the workers and epochs of a planner), handed out by the table's codes -- the list the
    batching gets holds references, not an object per utterance; else one per length."""
    coded = _plan_codes(plan)
    if coded is None:
        return (IndexLength(n, unit, rate) for shard in plan.shards for n in shard.lengths)
    table, where = coded
    shared = cache.get("_interned")
    if shared is None or shared[0] is not table or shared[1] != (unit, rate):
        shared = (table, (unit, rate),
                  [IndexLength(n, unit, rate) for n in table.distinct.tolist()])
        cache["_interned"] = shared
    objects = shared[2]
    step = 4096  # codes turned into Python ints a slice at a time
    return itertools.chain.from_iterable(map(objects.__getitem__, where[i:i + step].tolist())
                                         for i in range(0, where.size, step))


def _array_lower_bound(plan: EpochPlan, constraint: Any, oversize: str, unit: str,
                       rate: int | None, cache: dict) -> int:
    """The fewest batches any order of the plan's lengths can be packed into under
    ``constraint``, computed without a Python object per utterance: each distinct length is
    measured once (``cache`` keeps them across the workers of a plan), and the sums are
    added in order, as ``sum`` adds them (the same bound to the last bit)."""
    if not any(len(s.lengths) for s in plan.shards):
        return 0  # a worker with nothing to read this epoch
    coded = _plan_codes(plan)
    if coded is not None:
        table, where = coded
        key = (id(table), unit, rate)
        if cache.get("table") is not table or cache.get("key") != key:
            cache.clear()
            cache.update(_measured(table.distinct, constraint, unit, rate), table=table,
                         key=key)
        known = cache
    else:
        parts = [np.asarray(getattr(s.lengths, "array", s.lengths), dtype=np.float64)
                 for s in plan.shards]
        lengths = np.concatenate(parts) if parts else np.zeros(0)
        known = _measured(np.unique(lengths), constraint, unit, rate)
        where = np.searchsorted(known["lengths"], lengths)
    if where.size == 0:
        return 0
    fits = known["fits"][where]
    normal = int(fits.sum())
    over = where.size - normal
    bound = 0
    if normal:
        def total(part: int) -> float:
            return float(np.cumsum(known["measures"][:, part][where[fits]])[-1])

        if isinstance(constraint, TwoDimensional):
            bound = max(math.ceil(total(0) / constraint.budget_in),
                        math.ceil(total(1) / constraint.budget_out))
        else:
            budget = getattr(constraint, "budget", math.inf)
            bound = math.ceil(total(0) / budget) if math.isfinite(budget) else 1
        if constraint.max_samples is not None:
            bound = max(bound, math.ceil(normal / constraint.max_samples))
        bound = max(bound, 1)
    return bound + (over if oversize == "emit" else 0)


def _measured(distinct: np.ndarray, constraint: Any, unit: str, rate: int | None) -> dict:
    """For sorted distinct ``lengths``: ``measures`` (the constraint's measure of each, one
    column per part of a tuple) and ``fits`` (whether one alone is within the budget)."""
    empty = constraint.empty()
    measures, fits = [], []
    for n in distinct.tolist():
        m = constraint.measure(IndexLength(n, unit, rate))
        measures.append([float(x) for x in m] if isinstance(m, tuple) else [float(m)])
        fits.append(constraint.within(constraint.add(empty, m)))
    return {"lengths": distinct, "measures": np.array(measures, dtype=np.float64).reshape(
        len(measures), -1 if measures else 1), "fits": np.array(fits, dtype=bool)}


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
    """What one pass of :class:`~speechpipe.pipes.distributed._equal.EqualSteps` did on this rank.

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
        checks: ``plan``: store checks for a failed rank (see ``EqualSteps``' ``check_every``).
        planned_batches: ``plan`` with a :class:`StepPlanner`: the batches of this rank's own
            data the plan counted (compared with ``batches + dropped_batches`` after the pass).
        world: after a whole pass, the counts summed over every rank (``batches``,
            ``samples``, ``dropped_batches``, ``dropped_samples``, ``repeated_batches``,
            ``repeated_samples``; one all-reduce at the end of the pass); None before.
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
    checks: int = 0
    planned_batches: int | None = None
    world: dict[str, int] | None = None

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
            lines.append(f"  planned steps: {self.planned}"
                         + ("" if self.planned_batches is None else
                            f" (this rank's data: {self.planned_batches} batches planned)"))
        if self.world is not None and self.world_size > 1:
            w = self.world
            lines.append(f"  all {self.world_size} ranks: {w['batches']} batches / "
                         f"{w['samples']} samples yielded, dropped {w['dropped_batches']} / "
                         f"{w['dropped_samples']}, repeated {w['repeated_batches']} / "
                         f"{w['repeated_samples']}")
        lines.append(f"  {self.collectives} collective(s), {self.wait_seconds:.3f} s waiting"
                     + (f", {self.checks} store check(s)" if self.checks else ""))
        return "\n".join(lines)

