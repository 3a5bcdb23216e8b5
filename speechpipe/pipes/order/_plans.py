"""Epoch plans: the shards one process reads in one epoch, and the epoch's progress.

``sharded_shuffle`` (:mod:`speechpipe.pipes.order._streaming`) reads its shards whole and in sequence,
so with a shard index the epoch is known before it starts:

- :class:`EpochPlan` / :class:`PlannedShard`: the shards one process reads in one epoch, in
  reading order, with their utterance counts and bytes from the index
  (:meth:`ShardedShufflerIterDataPipe.epoch_plan
  <speechpipe.pipes.order._streaming.ShardedShufflerIterDataPipe.epoch_plan>`);
- :class:`EpochProgress`: the epoch's progress and ETA from a plan.

Plain data and arithmetic: nothing here reads a shard.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from ...seeding import Position

__all__ = ["EpochPlan", "EpochProgress", "PlannedShard"]


@dataclass(frozen=True)
class PlannedShard:
    """One shard of an epoch plan: its name, and its utterances, bytes and utterance lengths
    (in the index's order and unit) from the index (``None`` without an index)."""

    name: str
    count: int | None = None
    bytes: int | None = None
    lengths: tuple[float, ...] | None = field(default=None, repr=False)


@dataclass(frozen=True)
class EpochPlan:
    """The shards one process reads in one epoch, in reading order.

    Attributes:
        epoch: the epoch planned.
        position: the process (rank, worker) it is planned for.
        shards: the :class:`PlannedShard` entries, in the order they are read.
    """

    epoch: int
    position: Position
    shards: tuple[PlannedShard, ...]

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.shards]

    @property
    def total_count(self) -> int | None:
        """Utterances in the plan, or ``None`` if a count is unknown (no index)."""
        if any(s.count is None for s in self.shards):
            return None
        return sum(s.count for s in self.shards)

    @property
    def total_bytes(self) -> int | None:
        """Bytes of the plan's shards, or ``None`` if a size is unknown (no index)."""
        if any(s.bytes is None for s in self.shards):
            return None
        return sum(s.bytes for s in self.shards)


class EpochProgress:
    """Progress and ETA of one process's epoch, from its :class:`EpochPlan`.

    The count is exact: the plan holds every utterance this process will yield (unless a
    shard is skipped under ``on_error="skip"``). Time is extrapolated from the rate so far:
    by bytes when ``consumed_bytes`` is given and the plan knows its shards' sizes (better
    when shards hold utterances of different lengths), else by samples.

    **The buffer bound.** Samples come out of a shuffle buffer of ``buffer_size`` B, so the
    reader is ahead of the samples yielded by at most B: after ``n`` samples have been
    yielded, between ``n`` and ``n + B`` have been read. :meth:`remaining_shards` therefore
    gives a range: the shards not yet finished if the reader stood at ``n + B`` (fewest) and
    at ``n`` (most); the reader's true position is within B samples of ``n``.

    Args:
        plan: the epoch plan (from ``sharded_shuffle(..., index=...).epoch_plan()``), or its
            shards; every count must be known.
        buffer_size: the shuffle buffer of the pipe that yields the samples.

    >>> from speechpipe.seeding import Position
    >>> plan = EpochPlan(0, Position(), (PlannedShard("a", 100, 1000),
    ...                                  PlannedShard("b", 100, 3000)))
    >>> progress = EpochProgress(plan, buffer_size=10)
    >>> progress.remaining_samples(150), progress.remaining_shards(150)
    (50, (1, 1))
    >>> progress.remaining_shards(95)
    (1, 2)
    >>> progress.remaining_seconds(50, elapsed=10.0)  # 50 samples in 10 s, 150 to go
    30.0
    >>> progress.remaining_seconds(50, elapsed=10.0, consumed_bytes=500)  # 3500 bytes to go
    70.0
    """

    def __init__(self, plan: EpochPlan | Sequence[PlannedShard], *, buffer_size: int = 0):
        shards = tuple(plan.shards if isinstance(plan, EpochPlan) else plan)
        for s in shards:
            if not isinstance(s, PlannedShard):
                raise TypeError(f"plan must hold PlannedShard entries, got {s!r}")
            if s.count is None:
                raise ValueError(
                    f"shard {s.name!r} has no count: plan with an index "
                    "(sharded_shuffle(..., index=True))"
                )
        if not isinstance(buffer_size, int) or buffer_size < 0:
            raise ValueError(f"buffer_size must be an int >= 0, got {buffer_size!r}")
        self.shards = shards
        self.buffer_size = buffer_size
        self.total_samples = sum(s.count for s in shards)
        self.lost = 0  # utterances of the plan that will not come (record_lost)
        self.total_bytes = (None if any(s.bytes is None for s in shards)
                            else sum(s.bytes for s in shards))
        self._ends = []  # cumulative counts: shard i is fully read once _ends[i] samples are
        total = 0
        for s in shards:
            total += s.count
            self._ends.append(total)

    def record_lost(self, utterances: int) -> None:
        """The epoch comes out short: ``utterances`` of the plan will never come (a shard
        skipped under ``on_error="skip"``; ``sharded_shuffle``'s ``diagnostics.lost`` counts
        them from the index). The total, the fraction done and the sample-rate ETA count
        without them from now on.

        >>> from speechpipe.seeding import Position
        >>> progress = EpochProgress(EpochPlan(0, Position(), (PlannedShard("a", 100),
        ...                                                    PlannedShard("b", 100))))
        >>> progress.record_lost(49)
        >>> progress.total_samples, progress.remaining_samples(100), progress.fraction_done(151)
        (151, 51, 1.0)
        """
        if not isinstance(utterances, int) or not 0 <= utterances <= self.total_samples:
            raise ValueError(f"utterances must be an int from 0 to {self.total_samples}, "
                             f"got {utterances!r}")
        self.lost += utterances
        self.total_samples -= utterances

    def _check(self, consumed: int) -> int:
        if not isinstance(consumed, int) or consumed < 0:
            raise ValueError(f"consumed must be an int >= 0, got {consumed!r}")
        if consumed > self.total_samples:
            raise ValueError(
                f"consumed {consumed} samples but the plan holds {self.total_samples}"
            )
        return consumed

    def remaining_samples(self, consumed: int) -> int:
        """Samples still to come after ``consumed`` (exact)."""
        return self.total_samples - self._check(consumed)

    def fraction_done(self, consumed: int) -> float:
        """``consumed / total`` (1.0 for an empty plan)."""
        self._check(consumed)
        return consumed / self.total_samples if self.total_samples else 1.0

    def _unfinished(self, read: int) -> int:
        return sum(1 for end in self._ends if end > read)

    def remaining_shards(self, consumed: int) -> tuple[int, int]:
        """``(fewest, most)`` shards the reader has not finished after ``consumed`` samples
        were yielded: the reader stands between ``consumed`` and ``consumed + buffer_size``."""
        self._check(consumed)
        ahead = min(consumed + self.buffer_size, self.total_samples)
        return self._unfinished(ahead), self._unfinished(consumed)

    def remaining_seconds(
        self, consumed: int, elapsed: float, consumed_bytes: int | None = None
    ) -> float | None:
        """Seconds left at the rate so far; ``None`` before anything was consumed.

        Args:
            consumed: samples yielded so far this epoch.
            elapsed: seconds since the epoch started.
            consumed_bytes: bytes of those samples (e.g. the sum of their raw fields'
                sizes); with the plan's bytes, the rate is measured in bytes.
        """
        remaining = self.remaining_samples(consumed)
        if elapsed < 0:
            raise ValueError(f"elapsed must be >= 0 seconds, got {elapsed!r}")
        if remaining == 0:
            return 0.0
        if consumed_bytes is not None and self.total_bytes is not None:
            if not isinstance(consumed_bytes, int) or consumed_bytes < 0:
                raise ValueError(f"consumed_bytes must be an int >= 0, got {consumed_bytes!r}")
            if consumed_bytes == 0:
                return None
            return elapsed * max(self.total_bytes - consumed_bytes, 0) / consumed_bytes
        if consumed == 0:
            return None
        return elapsed * remaining / consumed
