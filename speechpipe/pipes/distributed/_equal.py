"""Distribution: how every rank takes the same number of steps.

Data-parallel training (DDP) runs one process per GPU (a **rank**), each with its own
DataLoader (and its **workers**), and all-reduces gradients at every step. Two things must
hold: the ranks read disjoint parts of the data, and they take **the same number of steps** --
a rank that runs out of batches while the others wait in an all-reduce hangs the job (the most
common way speech training dies at the end of an epoch).

**Splitting** happens in the reader, ``sharded_shuffle``, with the pure functions of
:mod:`speechpipe.pipes.order._assignment`: :func:`~speechpipe.pipes.order._assignment.assign_shards`
balances the epoch's shard order (shuffled with ``(seed, epoch)``, identical on every rank and
worker) between ranks by total length and can equalise shard counts
(:class:`~speechpipe.pipes.order._assignment.ShardSplit`);
:func:`~speechpipe.pipes.order._streaming.shard_assignment` shows what a pipe assigns. These names
(and ``ShardAssignment``, ``SplitBalance``, ``split_balance``, ``BALANCE``, ``EQUALIZE``) stay
importable from here.

**Uneven inputs** (in the main process, after the DataLoader):

- :class:`EqualSteps` (``for batch in EqualSteps(loader, policy=...)``), also as a pipe,
  ``equalize_steps`` (:class:`StepEqualizerIterDataPipe`). Policies: ``"stop"`` (all ranks
  stop when the first runs out, CAT's rule), ``"pad"`` (ranks that run out replay their own
  batches until the longest finishes), ``"plan"`` (the step count computed from the index
  before the epoch; no collective per step: a failing rank is heard through the process
  group's store). Per-step policies cost one all-reduce of two int64 per batch on a gloo
  group with a timeout, so a rank that fails, stalls or dies gives the others a
  :class:`DistributedStepError` naming it instead of a hang.
- :class:`~speechpipe.pipes.distributed._steps.StepPlanner` / :class:`~speechpipe.pipes.distributed._steps.StepPlan`
  (:mod:`speechpipe.pipes.distributed._steps`, also importable from here): the epoch's batch count per
  rank, from the index, the split and the batching run on lengths alone; the plan takes the
  min, mean or max over ranks (its ``target``).
- :class:`~speechpipe.pipes.distributed._steps.StepStats`: what a pass dropped and repeated, per epoch;
  ``print(stats.report())``.

**Map-style road**: :class:`~speechpipe.pipes.batching._views.BatchView` with ``world_size=W`` already
gives every rank the same number of samples at every step and the same number of steps
(SpeeChain's ``ngpu`` rule); it needs none of the above.
"""

from __future__ import annotations

import itertools
import time
import traceback
import warnings
from datetime import timedelta
from typing import Any, Callable, Iterable, Iterator

from ...errors import check_int, SpeechpipeError
from .._core import functional_datapipe, IterDataPipe
from ._steps import (
    TARGETS, StepPlan, StepPlanner, StepStats, batch_samples, index_unit, stream_planner,
    target_steps,
)

__all__ = [
    "DistributedStepError",
    "EqualSteps",
    "POLICIES",
    "PlanMismatchWarning",
    "StepEqualizer",
    "StepEqualizerIterDataPipe",
    "UnevenStepsWarning",
]

#: Uneven-input policies of :class:`EqualSteps`.
POLICIES = ("stop", "pad", "plan")

# Per-step states exchanged by EqualSteps, ordered worst first (the all-reduce takes MIN).
_FAILED, _EMPTY, _EXHAUSTED, _HAVE = 0, 1, 2, 3
_STATE_NAMES = {_FAILED: "failed", _EMPTY: "had no batch at all", _EXHAUSTED: "ran out",
                _HAVE: "has a batch"}

_DEFAULT_TIMEOUT = 600.0  # seconds; torch's default for NCCL groups


class DistributedStepError(SpeechpipeError, RuntimeError):
    """The ranks cannot take their next step together: a rank failed loading its batch,
    stalled past the timeout, died, cannot pad, or the ranks disagree on the plan. The
    message names the rank (when known), the step and the epoch."""



class PlanMismatchWarning(UserWarning):
    """A ``plan`` pass's loader yielded a batch count more than 5 % away from what the
    exact :class:`~speechpipe.pipes.steps.StepPlanner` counted for this rank: the plan and
    the pipeline batch differently. Warned on every rank, with the figures."""


class UnevenStepsWarning(UserWarning):
    """Over all ranks, a pass of :class:`EqualSteps` dropped or repeated more than 5 % of the
    samples to give every rank the same steps. Warned once per pass, on rank 0, with the
    world's totals (also in ``stats.world``)."""


#: Share of the world's samples dropped or repeated in a pass above which it is warned, and
#: relative gap between a rank's planned and real batch count above which that is warned.
_UNEVEN_SHARE = 0.05

_COUNTS = ("batches", "samples", "dropped_batches", "dropped_samples", "repeated_batches",
           "repeated_samples")

_GROUPS: dict[float, tuple[Any, Any]] = {}
_PASSES = itertools.count()  # distributed passes of EqualSteps in this process
_ROLL_CALL = 2.0  # seconds the ranks left wait for each other after a failure


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
            self.serial = next(_PASSES)  # the same on every rank: passes run in lock-step
        else:
            self.group, self.rank, self.world, self.serial = None, 0, 1, 0

    @property
    def store(self):
        """The signalling group's key-value store (torch.distributed's, on the master)."""
        try:
            return self.group.get_group_store()
        except (AttributeError, RuntimeError):  # a group= that keeps no store of its own
            return self.dist.distributed_c10d._get_default_store()

    def roll_call(self, where: str) -> str:
        """After a failed exchange: every rank that reaches this writes its key and waits up
        to ``_ROLL_CALL`` seconds for the others'; the ranks that do not answer are named (a
        process that died, or one stuck outside the loop)."""
        prefix = f"speechpipe/roll_call/{self.serial}/{where}"
        try:
            store = self.store
            store.set(f"{prefix}/{self.rank}", "here")
            keys = [f"{prefix}/{r}" for r in range(self.world)]
            deadline = time.monotonic() + min(_ROLL_CALL, self.timeout)
            while True:
                missing = [r for r, key in enumerate(keys) if not store.check([key])]
                if not missing or time.monotonic() >= deadline:
                    break
                time.sleep(0.05)
        except Exception as exc:  # the store lives in rank 0's process (torchrun: the agent)
            return (f"; the store did not answer either ({type(exc).__name__}), so the rank "
                    "hosting it (rank 0 with init_method tcp://) is likely the one that died")
        if not missing:
            return ""
        names = ", ".join(map(str, missing))
        return (f"; rank(s) {names} did not answer a roll call within "
                f"{min(_ROLL_CALL, self.timeout):g} s: died, or stuck outside the loop")

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
            absent = self.roll_call(f"{self.stats.collectives}")
            raise DistributedStepError(
                f"equalize_steps: rank {self.rank}: the all-reduce {what} failed after "
                f"{waited:.1f} s: {cause}{absent} -- check the other ranks' logs ({exc})"
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

    def agree(self, value: int, what: str, have: bool = True,
              failed: bool = False) -> tuple[int, int, int | None, int | None, int]:
        """In one all-reduce: ``(min, max)`` of ``value`` over the ranks, the lowest rank
        whose ``have`` is False and the lowest whose ``failed`` is True (None if none), and a
        stamp common to the ranks and new in every pass (the earliest clock reading)."""
        w, r = self.world, self.rank
        low, neg_high, empty, broken, stamp = self._all_reduce(
            [value, -value, w + r if have else r, r if failed else w + r, time.time_ns()], what)
        return (low, -neg_high, empty if empty < w else None, broken if broken < w else None,
                stamp)

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
    :class:`DistributedStepError`, naming the ranks that do not answer a roll call in the
    store afterwards (up to 2 s). Choose ``timeout`` longer than anything a rank does
    between two steps that the others do not wait for (rank 0 validating or saving a
    checkpoint alone). Every rank must iterate the same way: leaving the loop early on
    one rank only leaves the others waiting until the timeout.

    **Failures under** ``plan``. With no exchange per step, the ranks hear of a failure
    through the group's key-value store (the one torch.distributed already has): a rank whose
    loader raises writes its rank, step and error there and goes on yielding its cached
    batches (counted as repeats), and every rank looks at the key before every
    ``check_every``-th step (one store round trip, no collective) and at the end of the pass.
    All ranks stop at the same step, the first check after the failure: the failing rank
    raises its own error, the others :class:`DistributedStepError` naming it and its error --
    none is left waiting in the training loop's all-reduce for a rank that stopped (and
    which may live on, writing logs or a checkpoint). The failing rank so trains on up to
    ``check_every`` repeated batches before raising. A rank that *dies* during a ``plan``
    pass ends the others in your own collective (gloo: "Connection closed by peer"), which
    ``EqualSteps`` does not see; with ``stop``/``pad`` it is named.

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
        check_every: for ``"plan"``: steps between two looks at the store for a failed rank
            (1: every step, one store round trip; its cost: benchmarks/bench_distributed.py);
            0 turns the channel off (a failing rank then leaves the others in the training
            loop's collective until it exits or the process group's own timeout). The
            guarantee that all ranks stop at the same step assumes the loop synchronizes at
            every checked step: with gradient accumulation over G steps (DDP's ``no_sync``),
            use a multiple of G.

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
        check_every: int = 1,
    ) -> None:
        if isinstance(loader, (str, bytes)) or not isinstance(loader, Iterable):
            raise TypeError(f"loader must be an iterable of batches, got {loader!r}")
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
        if policy == "plan":
            if steps is None and stream_planner(loader) is not None:
                steps = StepPlanner(loader)  # plan_batches: the plan knows the steps
            if steps is None:
                raise ValueError("policy='plan' needs steps= (an int, epoch -> int, or a "
                                 "StepPlanner), or a loader over a plan_batches pipeline")
            if isinstance(steps, bool) or not (
                isinstance(steps, (int, StepPlanner)) or callable(steps)
            ):
                raise TypeError(f"steps must be an int, a callable or a StepPlanner, got {steps!r}")
            if isinstance(steps, int) and steps < 0:
                raise ValueError(f"steps must be >= 0, got {steps!r}")
            if isinstance(steps, StepPlanner) and steps.streams is None:
                workers = getattr(loader, "num_workers", None)
                if isinstance(workers, int) and max(1, workers) != max(1, steps.num_workers):
                    raise ValueError(
                        f"the StepPlanner plans for num_workers={steps.num_workers} but the "
                        f"loader has num_workers={workers}"
                    )
        elif steps is not None:
            raise ValueError(f"steps= is for policy='plan', not {policy!r}")
        check_int("pad_cache", pad_cache, 1)
        check_int("check_every", check_every, 0)
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
        self.check_every = check_every
        self.epoch: int | None = None
        self.stats = StepStats(policy)

    def set_epoch(self, epoch: int) -> EqualSteps:
        """The epoch of the next pass (for ``steps`` callables and planners, and the report)."""
        self.epoch = check_int("epoch", epoch, 0)
        return self

    def __len__(self) -> int:
        if self.policy == "plan" and isinstance(self.steps, int):
            return self.steps
        if self.policy == "plan" and isinstance(self.steps, StepPlanner) and \
                self.steps.streams is not None:  # the same on every rank: no collective
            return self.steps.steps(self.epoch)
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
        self._sum_over_ranks(signals, stats)

    def _sum_over_ranks(self, signals: _Signals, stats: StepStats) -> None:
        """After a whole pass: every rank's counts summed (one all-reduce) into
        ``stats.world``, and on rank 0 an :class:`UnevenStepsWarning` when more than 5 % of
        the world's samples were dropped or repeated."""
        values = [getattr(stats, name) for name in _COUNTS]
        if signals.active and signals.world > 1:
            epoch = "" if self.epoch is None else f" of epoch {self.epoch}"
            values = signals._all_reduce(values, f"summing the counts of the pass{epoch}",
                                         op="SUM")
        world = stats.world = dict(zip(_COUNTS, values))
        data = world["samples"] + world["dropped_samples"]  # every sample of the pass, once
        lost = world["dropped_samples"] + world["repeated_samples"]
        if signals.rank != 0 or not data or lost <= _UNEVEN_SHARE * data:
            return
        epoch = "" if self.epoch is None else f" epoch {self.epoch}"
        warnings.warn(
            f"equalize_steps(policy={self.policy!r}){epoch}: over {signals.world} rank(s), "
            f"{world['dropped_batches']} batches / {world['dropped_samples']} samples of "
            f"{data} ({world['dropped_samples'] / data:.1%}) were dropped and "
            f"{world['repeated_batches']} / {world['repeated_samples']} "
            f"({world['repeated_samples'] / data:.1%}) repeated so that every rank takes "
            f"{stats.steps} steps (each rank's figures: its EqualSteps.stats, "
            "loader.uneven.stats). Fewer drops: more, smaller shards (pack --utts-per-shard), "
            "ShardSplit(level='sample'), StepPlanner(target='mean'), or a plan that batches "
            "as the pipeline does", UnevenStepsWarning, stacklevel=3)

    def _check_plan(self, signals: _Signals, stats: StepStats, exhausted: bool) -> None:
        """Warn (:class:`PlanMismatchWarning`, on this rank) when an exact planner's count
        for this rank is more than 5 % away from the batches its loader really yielded."""
        planned = stats.planned_batches
        if planned is None or not self.steps.exact or not (stats.drained or exhausted):
            return
        own = stats.batches + stats.dropped_batches
        if abs(own - planned) <= _UNEVEN_SHARE * planned:
            return
        epoch = "" if self.epoch is None else f" epoch {self.epoch}"
        unit = "global batches" if self.steps.streams is not None else index_unit(
            self.steps.sharded)[0]
        warnings.warn(
            f"equalize_steps(policy='plan'){epoch}: rank {signals.rank}'s loader yielded "
            f"{own} batches of its own data but the StepPlanner counted {planned} "
            f"({(own - planned) / max(planned, 1):+.0%}); every rank took {stats.steps} steps, "
            f"so this rank dropped {stats.dropped_batches} batches / {stats.dropped_samples} "
            f"samples and repeated {stats.repeated_batches}. The plan batches otherwise than "
            f"the pipeline: the index counts {unit} -- does the batching measure the same "
            "(frames of features computed from audio are not the index's samples: measure "
            "durations with length='duration')? -- or a filter, skipped shards, bucket edges "
            "estimated from the data", PlanMismatchWarning, stacklevel=3)

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
                    _raise_own(error)
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

    def _planned_steps(self, signals: _Signals, have: bool,
                       failure: BaseException | None) -> tuple[int, int]:
        """The epoch's steps and the pass's stamp, agreed by every rank in the one exchange of
        the epoch, which also tells every rank whether some rank has no batch at all or failed
        loading its first one (it cannot follow a plan: with no collective per step, the
        others would wait for it in the training loop's all-reduce; so every rank stops here,
        naming it)."""
        epoch = self.epoch
        what = "agreeing on the planned steps"
        if failure is not None:
            _store_reason(signals, f"first/{signals.serial}/{signals.rank}", failure)
        if isinstance(self.steps, StepPlanner):
            planner = self.steps
            local = planner.rank_batches(epoch, signals.rank if signals.active else 0)
            signals.stats.planned_batches = local
            low, high, empty, broken, stamp = signals.agree(local, what, have, failure is not None)
            self._refuse_broken_rank(signals, broken, failure)
            total = signals.total(local, what) if planner.target == "mean" else 0
            steps = target_steps(planner.target, low, high, total, signals.world)
            self._refuse_empty_rank(empty, steps)
            return steps, stamp
        local = self.steps if isinstance(self.steps, int) else self.steps(epoch)
        if isinstance(local, bool) or not isinstance(local, int) or local < 0:
            raise ValueError(f"steps({epoch!r}) must return an int >= 0, got {local!r}")
        low, high, empty, broken, stamp = signals.agree(local, what, have, failure is not None)
        self._refuse_broken_rank(signals, broken, failure)
        self._refuse_empty_rank(empty, low)
        if low != high:
            raise DistributedStepError(
                f"equalize_steps(policy='plan'): the ranks were given different step counts "
                f"(from {low} to {high}; rank {signals.rank} has {local}); every rank must "
                "compute the same plan (same shard list, index, seed and epoch)"
            )
        return low, stamp

    def _refuse_broken_rank(self, signals: _Signals, rank: int | None,
                            failure: BaseException | None) -> None:
        if rank is None:
            return
        if failure is not None:
            _raise_own(failure)
        reason = _read_reason(signals, f"first/{signals.serial}/{rank}")
        epoch = "" if self.epoch is None else f" of epoch {self.epoch}"
        raise DistributedStepError(
            f"equalize_steps(policy='plan'): rank {rank} failed loading its first batch"
            f"{epoch}{reason}; rank {signals.rank} stops too so that no rank waits for it "
            "(its own traceback is in its log)")

    def _refuse_empty_rank(self, rank: int | None, steps: int) -> None:
        if rank is not None and steps > 0:
            raise DistributedStepError(
                f"equalize_steps(policy='plan'): rank {rank}'s loader yielded nothing but the "
                f"plan has {steps} steps (epoch {self.epoch}), so no rank can follow it; give "
                "every rank data (more or smaller shards: pack --shard-size; "
                "ShardSplit(equalize='repeat'); fewer ranks) or use policy='stop'")

    # long: one pass of the plan, with the failure channel's report, checks and stand-ins
    def _planned(self, signals: _Signals, stats: StepStats) -> Iterator[Any]:
        end = object()
        it = iter(self.loader)
        cache: list = []
        exhausted = False
        failure = None  # this rank's loader error, raised at the step every rank stops at
        try:
            try:
                first = next(it, end)
            except Exception as exc:
                if not signals.active:
                    raise
                first, failure, it = end, exc, None
            steps, stamp = self._planned_steps(signals, first is not end, failure)
            stats.planned = steps
            channel = (_FailureChannel(signals, stamp, self.check_every, stats, self.epoch)
                       if signals.world > 1 and self.check_every else None)
            if not steps and first is not end:  # a plan of no steps: the batch read is dropped
                it = itertools.chain([first], it)
            for step in range(steps):
                if channel is not None and step:
                    channel.check(step, failure)
                batch = first if step == 0 else end if exhausted else _NEXT
                if batch is _NEXT:
                    try:
                        batch = next(it, end)
                    except Exception as exc:
                        if channel is None:
                            raise
                        # Tell the others, then keep stepping on cached batches until every
                        # rank stops at the same check: it must not leave them waiting in
                        # the training loop's collective.
                        channel.report(step, exc)
                        traceback.clear_frames(exc.__traceback__)
                        failure, it, batch = exc, None, end
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
            if channel is not None and steps:
                channel.check(steps, failure, final=True)
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
            if isinstance(self.steps, StepPlanner):
                self._check_plan(signals, stats, exhausted)
        finally:
            it = None


_NEXT = object()  # the next batch is to be read from the loader
_REASON_CHARS = 400  # of a failing rank's error message, carried to the others by the store


def _raise_own(error: BaseException):
    # The loader's finished frames (a DataLoader iterator among their locals) are cleared so
    # that its workers shut down now, not whenever the traceback is collected; the
    # traceback's lines and message stay.
    traceback.clear_frames(error.__traceback__)
    raise error


def _reason(error: BaseException) -> str:
    """An error as one line of at most ``_REASON_CHARS`` characters, for the store."""
    return " ".join(f"{type(error).__name__}: {error}".split())[:_REASON_CHARS]


def _store_reason(signals: _Signals, key: str, error: BaseException) -> None:
    signals.store.set(f"speechpipe/equal_steps/{key}", _reason(error))


def _read_reason(signals: _Signals, key: str) -> str:
    try:
        return f" ({signals.store.get(f'speechpipe/equal_steps/{key}').decode()})"
    except Exception:  # the reason is a courtesy: the rank is named without it
        return ""


class _FailureChannel:
    """How the ranks of one ``plan`` pass hear that a rank's loader failed, with no collective
    per step.

    The failing rank appends ``rank, step, reason`` to one key of the signalling group's store
    (the store torch.distributed already has) and keeps stepping on its cached batches; every
    rank checks the key (one store round trip) before every ``every``-th step and at the end
    of the pass, and stops at the first check after the earliest failure's step. That check is
    the same on every rank: a failure at step ``s`` is in the store before its rank yields step
    ``s``, so before any rank's collective of step ``s`` completes and it reaches step ``s + 1``;
    a failure a rank sees early (at or before its step) waits for the same check. The failing
    rank raises its own error there, the others :class:`DistributedStepError` naming it.
    """

    def __init__(self, signals: _Signals, stamp: int, every: int, stats: StepStats,
                 epoch: int | None) -> None:
        self.signals = signals
        self.store = signals.store
        self.key = f"speechpipe/equal_steps/{stamp}/failed"
        self.every = every
        self.stats = stats
        self.epoch = "" if epoch is None else f" of epoch {epoch}"

    def report(self, step: int, error: BaseException) -> None:
        self.store.append(self.key, f"{self.signals.rank}\t{step}\t{_reason(error)}\n")

    def check(self, step: int, own: BaseException | None, final: bool = False) -> None:
        """Stop here if a rank failed before ``step`` (on a check step)."""
        if step % self.every and not final:
            return
        self.stats.checks += 1
        rank = self.signals.rank
        try:
            found = self.store.check([self.key])
            records = self.store.get(self.key).decode() if found else ""
        except Exception as exc:
            raise DistributedStepError(
                f"equalize_steps(policy='plan'): rank {rank}: the store did not answer before "
                f"step {step}{self.epoch} ({type(exc).__name__}): the rank hosting it (rank 0 "
                "with init_method tcp://, or torchrun's agent) died or is unreachable"
            ) from exc
        failures = []
        for line in records.splitlines():
            who, at, reason = line.split("\t", 2)
            if int(at) < step:
                failures.append((int(at), int(who), reason))
        if not failures:
            return
        if own is not None:
            _raise_own(own)
        named = "; ".join(f"rank {who} failed loading its batch for step {at}{self.epoch} "
                          f"({reason})" for at, who, reason in sorted(failures))
        where = "at the end of the pass" if final else f"before step {step}"
        raise DistributedStepError(
            f"equalize_steps(policy='plan'): {named}; rank {rank} stops {where} with it, so "
            "that no rank waits for another in the training loop (the failing rank's "
            "traceback is in its log)")

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
            ``pad_cache``, ``count_dropped``, ``count_fn``, ``check_every``).

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

