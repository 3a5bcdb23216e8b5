"""Batch budgets: the cost models that size a batch, and the statistics of a batching pass.

Speech utterances run from 1 s to 30 s. Fixed-size batches either waste the GPU on padding or
run out of memory; speechpipe batches by a **budget** instead, measured by a cost model, a
**constraint**:

=====================  ===================================================================
constraint             cost of a batch of ``n`` samples, kept within the budget
=====================  ===================================================================
:class:`PaddedArea`    ``n × max_len`` -- the padded tensor's size (SpeeChain's "rectangles
                       of similar area", lhotse's ``max_duration``); the default
:class:`SumOfLengths`  ``Σ len`` -- the real frames, ignoring padding
:class:`Quadratic`     ``n × (max_len + max_len² / q)`` -- attention's quadratic memory
:class:`TwoDimensional` ``n × max_in ≤ budget_in`` and ``n × max_out ≤ budget_out`` (e.g.
                       frames and tokens, both bounded)
:class:`SampleCount`   ``n`` -- a fixed number of samples whatever their lengths
                       (SpeeChain's piece batches)
=====================  ===================================================================

Each budget model takes an optional ``max_samples`` cap. A batch of two or more samples never
exceeds its budget; a single sample whose cost alone exceeds it is an **oversize** sample,
emitted alone (``oversize="emit"``) or dropped (``oversize="drop"``), and counted either way
in :class:`BatchStats`.

Every batching stage is sized by one argument, ``budget=``: a number of seconds (the padded
duration ``n × longest``; with an optional ``max_samples=N``) or one of these constraints for
any other unit or model (``PaddedArea(3000)``: frames of ``feats``, else audio samples;
``SampleCount(n)``: batches of a fixed count); :func:`batch_budget` turns it into the
constraint, for every stage.

The algorithms and pipes that pack batches under a budget are in
:mod:`speechpipe.pipes.batching._buckets` (streaming) and :mod:`speechpipe.pipes.batching._views` (planned from
lengths).
"""

from __future__ import annotations

import statistics
import warnings
from abc import ABC, abstractmethod
from collections.abc import Mapping  # isinstance on typing.Mapping costs ~1 us per sample
from dataclasses import dataclass, field
from numbers import Integral, Real
from typing import Any, Callable, Sequence, Union

from ...diagnostics import Ledger
from ...sample import sample_duration, sample_length
from ...errors import SpeechpipeError
from ...sample import DURATION
from ...sample import NUM_FRAMES

__all__ = [
    "BatchConstraint",
    "BatchStats",
    "BudgetWarning",
    "IndexLength",
    "LengthUnitError",
    "OVERSIZE",
    "PaddedArea",
    "Quadratic",
    "SampleCount",
    "SumOfLengths",
    "TwoDimensional",
    "batch_budget",
]

Length = Union[int, float, tuple]
LengthFn = Union[str, Callable[[Any], Length], None]

#: What to do with a sample whose cost alone exceeds the budget.
OVERSIZE = ("emit", "drop")

#: Seconds per frame of the index's ``frames`` unit (10 ms, Kaldi's and ``pack``'s shift).
_FRAME_SHIFT = 0.01


class LengthUnitError(SpeechpipeError, ValueError):
    """A constraint cannot measure a length of the shard index in its own unit: the plan
    would batch one unit and the pipeline another. The message names both units."""


class IndexLength(float):
    """A length from the shard index, in the index's unit (what
    :class:`~speechpipe.pipes.steps.StepPlanner` hands the batching it re-runs).

    It is the index's number (``float(length)``: frames, audio samples or seconds, as
    ``unit`` says), so arithmetic on it works as on a bare length; a constraint measures it in
    its own unit (:meth:`BatchConstraint.measure`): seconds for ``length="duration"`` (or
    :func:`~speechpipe.sample.sample_duration`), whatever the index counts; the index's own
    number for ``length=None`` (frames of ``feats``, else audio samples) when the index counts
    frames or samples; frames for ``length="num_frames"``. Any other measure is a
    :class:`LengthUnitError` naming both units, not a plan in another unit.

    >>> n = IndexLength(48000.0, "samples", 16000)
    >>> n + 0, n.seconds, PaddedArea(60.0, length="duration").measure(n)
    (48000.0, 3.0, 3.0)
    >>> PaddedArea(3000).measure(IndexLength(4.5, "seconds"))
    Traceback (most recent call last):
    speechpipe.pipes.batching._constraints.LengthUnitError: the shard index counts seconds but the...
    """

    __slots__ = ("unit", "sample_rate")

    def __new__(cls, value: float, unit: str, sample_rate: int | None = None) -> IndexLength:
        self = super().__new__(cls, value)
        if unit not in ("frames", "samples", "seconds"):
            raise ValueError(f"unit must be 'frames', 'samples' or 'seconds', got {unit!r}")
        self.unit = unit
        self.sample_rate = sample_rate
        return self

    def __reduce__(self):
        return (IndexLength, (float(self), self.unit, self.sample_rate))

    @property
    def seconds(self) -> float:
        """The length in seconds (frames of 10 ms; samples at the index's rate)."""
        if self.unit == "seconds":
            return float(self)
        if self.unit == "frames":
            return float(self) * _FRAME_SHIFT
        return float(self) / (self.sample_rate or 16000)

    def measured(self, length: LengthFn) -> float:
        """This length as a constraint whose ``length`` is ``length`` measures it."""
        if length is None:
            if self.unit == "seconds":
                raise self._mismatch("frames of feats or audio samples (length=None)")
            return float(self)
        if length == DURATION or length is sample_duration:
            return self.seconds
        if length == NUM_FRAMES:
            if self.unit == "frames":
                return float(self)
            return self.seconds / _FRAME_SHIFT
        name = length if isinstance(length, str) else getattr(length, "__name__", repr(length))
        raise self._mismatch(f"{name!r}, which the index does not hold")

    def _mismatch(self, measures: str) -> LengthUnitError:
        return LengthUnitError(
            f"the shard index counts {self.unit} but the constraint measures {measures}: the "
            "plan would batch one unit and the pipeline another. Measure durations "
            "(block_batch(budget=seconds) or PaddedArea(budget=seconds, length='duration'), "
            "after durations_from_index or decode), whatever the index counts; or pack with "
            "the unit the batching measures (pack length_unit='frames' for features)")


# --------------------------------------------------------------------------- cost models


class BatchConstraint(ABC):
    """A batch budget. Subclasses are small frozen dataclasses with ``budget`` and
    ``max_samples``; packing keeps an immutable tuple *state* per open batch.

    Subclasses implement :meth:`empty`, :meth:`add`, :meth:`within` and :meth:`cost`.
    :meth:`measure` gives a sample's length: by default :func:`speechpipe.sample.sample_length`
    (frames if the sample has ``feats``, else audio samples), or the field / callable given as
    ``length``.
    """

    length: LengthFn = None
    max_samples: int | None = None

    def measure(self, sample: Any) -> Length:
        length = self.length
        if type(sample) is not dict:  # (dict samples, the common case, skip the ABC checks)
            if type(sample) is IndexLength:  # planning from an index: its unit checked
                return sample.measured(length)
            if length is None:
                if not isinstance(sample, Mapping):
                    return sample  # a bare length, in whatever unit the caller planned
            elif not isinstance(length, str) and length is not sample_duration:
                return length(sample)  # the caller's own function measures anything (an index)
            elif isinstance(sample, Real) and not isinstance(sample, bool):
                return sample  # a bare length: a field name or duration measures samples
        if length is None:
            return sample_length(sample)
        if isinstance(length, str):
            return sample_length(sample, length)
        return length(sample)

    @abstractmethod
    def empty(self) -> tuple:
        """State of an empty batch."""

    @abstractmethod
    def add(self, state: tuple, length: Length) -> tuple:
        """State after adding a sample of ``length``."""

    @abstractmethod
    def within(self, state: tuple) -> bool:
        """True if a batch in ``state`` respects the budget (and the sample cap)."""

    @abstractmethod
    def cost(self, lengths: Sequence[Length]) -> float:
        """The cost of a batch with these lengths, in the budget's unit."""

    def fits(self, lengths: Sequence[Length]) -> bool:
        """True if a batch of these lengths respects the budget."""
        state = self.empty()
        for n in lengths:
            state = self.add(state, n)
        return self.within(state)

    def __post_init__(self) -> None:  # run by every dataclass subclass
        self._check()

    def _check(self) -> None:
        for name in ("budget", "budget_in", "budget_out"):
            value = getattr(self, name, None)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be > 0, got {value!r}")
        if self.max_samples is not None and (
            not isinstance(self.max_samples, int) or self.max_samples < 1
        ):
            raise ValueError(f"max_samples must be a positive int or None, got {self.max_samples!r}")
        if self.length is not None and not (isinstance(self.length, str) or callable(self.length)):
            raise TypeError(f"length must be a field name, a callable or None, got {self.length!r}")

    def _count_ok(self, n: int) -> bool:
        return self.max_samples is None or n <= self.max_samples


@dataclass(frozen=True)
class PaddedArea(BatchConstraint):
    """Budget on the padded area ``n × max_len`` (the default cost model).

    Args:
        budget: largest ``n × max_len`` allowed, in the length's unit (frames, samples).
        max_samples: optional cap on ``n``.
        length: field name or callable measuring a sample (default: ``sample_length``).

    >>> c = PaddedArea(budget=1000)
    >>> c.cost([100, 300, 200]), c.fits([100, 300, 200]), c.fits([400, 400, 400])
    (900, True, False)
    """

    budget: float
    max_samples: int | None = None
    length: LengthFn = None

    def empty(self):
        return (0, 0)

    def add(self, state, length):
        n, top = state
        return (n + 1, length if length > top else top)

    def within(self, state):
        n, top = state
        return n * top <= self.budget and self._count_ok(n)

    def cost(self, lengths):
        return len(lengths) * max(lengths) if lengths else 0


@dataclass(frozen=True)
class SumOfLengths(BatchConstraint):
    """Budget on the sum of lengths (real frames; padding not counted).

    >>> SumOfLengths(budget=500).fits([100, 300, 100]), SumOfLengths(budget=499).fits([100, 300, 100])
    (True, False)
    """

    budget: float
    max_samples: int | None = None
    length: LengthFn = None

    def empty(self):
        return (0, 0)

    def add(self, state, length):
        return (state[0] + 1, state[1] + length)

    def within(self, state):
        return state[1] <= self.budget and self._count_ok(state[0])

    def cost(self, lengths):
        return sum(lengths)


@dataclass(frozen=True)
class Quadratic(BatchConstraint):
    """Budget for attention: each sample counts ``len + len² / q``, then padded.

    The cost is ``n × (max_len + max_len² / q)``; with a large ``q`` it tends to
    :class:`PaddedArea`.

    >>> Quadratic(budget=2000, q=100).cost([100, 50])
    400.0
    """

    budget: float
    q: float = 1000.0
    max_samples: int | None = None
    length: LengthFn = None

    def __post_init__(self):
        super().__post_init__()
        if not self.q > 0:
            raise ValueError(f"q must be > 0, got {self.q!r}")

    def empty(self):
        return (0, 0)

    def add(self, state, length):
        n, top = state
        return (n + 1, length if length > top else top)

    def within(self, state):
        n, top = state
        return n * (top + top * top / self.q) <= self.budget and self._count_ok(n)

    def cost(self, lengths):
        if not lengths:
            return 0.0
        top = max(lengths)
        return len(lengths) * (top + top * top / self.q)


@dataclass(frozen=True)
class TwoDimensional(BatchConstraint):
    """Two padded budgets at once: inputs (e.g. frames) and outputs (e.g. tokens).

    A sample's length is a pair ``(input, output)``; by default input is
    :func:`~speechpipe.sample.sample_length` and output is the length of ``tokens`` (or the
    ``output`` field named).

    >>> c = TwoDimensional(budget_in=1000, budget_out=40)
    >>> c.fits([(300, 10), (200, 12)]), c.fits([(300, 10), (200, 25)])
    (True, False)
    """

    budget_in: float
    budget_out: float
    max_samples: int | None = None
    length: LengthFn = None
    output: str = "tokens"

    def measure(self, sample):
        if type(sample) is IndexLength:
            raise sample._mismatch("pairs (input, output); the index holds one length per "
                                   "utterance: plan with a batch size or a one-dimensional "
                                   "constraint")
        if not isinstance(sample, Mapping):
            return tuple(sample)
        if self.length is not None and not isinstance(self.length, str):
            return self.length(sample)
        return (sample_length(sample, self.length), sample_length(sample, self.output))

    def empty(self):
        return (0, 0, 0)

    def add(self, state, length):
        n, a, b = state
        x, y = length
        return (n + 1, x if x > a else a, y if y > b else b)

    def within(self, state):
        n, a, b = state
        return n * a <= self.budget_in and n * b <= self.budget_out and self._count_ok(n)

    def cost(self, lengths):
        if not lengths:
            return 0
        return len(lengths) * max(x for x, _ in lengths)


@dataclass(frozen=True)
class SampleCount(BatchConstraint):
    """A fixed number of samples per batch, whatever their lengths (SpeeChain's piece batches:
    ``budget=SampleCount(n)``).

    A batch holds at most ``size`` samples, so packing fills each batch with ``size`` samples
    (the last one fewer). Lengths never count against it: no sample is oversize. ``size`` is
    also the batch's ``max_samples``. Its :meth:`cost` is the padded area ``n × max_len`` (the
    input side of a pair), what :class:`BatchStats` reports as a batch's cost.

    Args:
        size: samples per batch, an int >= 1.
        length: field name or callable measuring a sample (used only for statistics).

    >>> c = SampleCount(2)
    >>> c.fits([100, 300]), c.fits([1, 1, 1]), c.cost([100, 300]), c.max_samples
    (True, False, 600, 2)
    """

    size: int
    length: LengthFn = None

    def __post_init__(self):
        if not isinstance(self.size, Integral) or isinstance(self.size, bool) or self.size < 1:
            raise ValueError(f"size must be an int >= 1, got {self.size!r}")
        super().__post_init__()

    @property
    def max_samples(self) -> int:
        return self.size

    def empty(self):
        return (0,)

    def add(self, state, length):
        return (state[0] + 1,)

    def within(self, state):
        return state[0] <= self.size

    def cost(self, lengths):
        return len(lengths) * max(primary_measure(n) for n in lengths) if lengths else 0


def primary_measure(length: Length) -> float:
    """The time length used for padding statistics (the input side of a pair)."""
    return length[0] if isinstance(length, tuple) else length


# --------------------------------------------------------------------------- the one way


#: ``batch_budget``'s ``length`` when a number of seconds is given: the samples' durations.
SECONDS = sample_duration


def batch_budget(
    budget: float | BatchConstraint | None,
    *,
    max_samples: int | None = None,
    length: LengthFn = SECONDS,
    required: bool = False,
) -> BatchConstraint | None:
    """The constraint that sizes a batch, from a stage's ``budget=``: the one way to say it.

    ``budget`` is either a **number of seconds** -- the padded duration of a batch, ``n ×``
    its longest sample's duration, as lhotse's ``max_duration``: ``PaddedArea(budget,
    max_samples=max_samples, length=length)`` -- or a
    :class:`BatchConstraint`, for any other unit or cost model: ``PaddedArea(3000)`` counts
    frames of ``feats`` (else audio samples), ``SumOfLengths``, ``Quadratic``,
    ``TwoDimensional``, and ``SampleCount(n)`` for batches of a fixed count. ``block_batch``,
    ``bucket_by_length``, ``BatchView``, ``form_batches`` and the recipes' pipelines take it.

    Args:
        budget: seconds (a number > 0) or a :class:`BatchConstraint`.
        max_samples: cap on samples per batch, with a number only (a constraint has its own).
        length: what a number measures (default: the samples' durations in seconds;
            ``BatchView`` passes ``None``: its lengths are given, in their own unit).
        required: ``None`` is an error.

    Returns:
        The constraint, or ``None`` when none was given and none is required.

    Raises:
        ValueError: ``budget`` missing while required, not > 0, or ``max_samples`` with a
            constraint.
        TypeError: ``budget`` is neither a number nor a constraint (a string, a bool).

    >>> batch_budget(200.0).length.__name__, batch_budget(200.0).budget
    ('sample_duration', 200.0)
    >>> batch_budget(6000, max_samples=32, length=None)
    PaddedArea(budget=6000, max_samples=32, length=None)
    >>> batch_budget(SampleCount(8))
    SampleCount(size=8, length=None)
    >>> batch_budget(None, required=True)
    Traceback (most recent call last):
    ValueError: give a budget: seconds (a number) or a constraint such as PaddedArea(3000) ...
    """
    if budget is None:
        if required:
            raise ValueError("give a budget: seconds (a number) or a constraint such as "
                             "PaddedArea(3000) for frames")
        if max_samples is not None:
            raise ValueError("max_samples goes with a budget in seconds")
        return None
    if isinstance(budget, BatchConstraint):
        if max_samples is not None:
            raise ValueError(f"max_samples goes with a budget in seconds; a constraint has its "
                             f"own: {type(budget).__name__}(..., max_samples={max_samples!r})")
        return budget
    if isinstance(budget, bool) or not isinstance(budget, Real):
        raise TypeError("budget must be seconds (a number) or a constraint (PaddedArea, "
                        f"SumOfLengths, Quadratic, TwoDimensional, SampleCount), got {budget!r}")
    return PaddedArea(budget=budget, max_samples=max_samples, length=length)


# --------------------------------------------------------------------------- statistics


class BudgetWarning(UserWarning):
    """A budget far off the data: most batches of a pass were a single sample longer than the
    budget (too small, or in another unit), or one batch held most of a pass of many samples,
    or a batch of padded durations above an hour (too large)."""


#: A pass of at least this many samples whose largest batch holds half of them or more is
#: batched by a budget far too large for its data.
_LARGE_PASS = 64
#: Seconds of padded audio in one batch above which a budget counted in seconds is warned of:
#: an hour, some 10x the largest batches that train on one GPU (lhotse's max_duration of
#: 200-1000 s).
_LARGE_BATCH_SECONDS = 3600.0


def _unit_of(constraint: BatchConstraint) -> str:
    """What a constraint's costs count, in words."""
    length = constraint.length
    if length == DURATION or length is sample_duration:
        return "seconds"
    if length is None:
        return "frames of feats, else audio samples"
    return f"units of {length if isinstance(length, str) else 'its length function'}"


@dataclass
class BatchStats(Ledger):
    """What a batching pass produced; :meth:`report` prints it.

    Padding efficiency is real ÷ padded length (frames or samples, the input side for
    two-dimensional budgets): 1.0 means no padding at all.
    """

    stage: str = "batching"
    batches: int = 0
    samples: int = 0
    real: float = 0.0
    padded: float = 0.0
    largest_cost: float = 0.0
    over_budget: int = 0
    oversize_emitted: int = 0
    oversize_dropped: int = 0
    sizes: list[int] = field(default_factory=list)

    def add_batch(self, lengths: Sequence[Length], constraint: BatchConstraint) -> None:
        primary = [primary_measure(n) for n in lengths]
        self.batches += 1
        self.samples += len(lengths)
        self.real += sum(primary)
        self.padded += len(primary) * max(primary)
        cost = constraint.cost(list(lengths))
        self.largest_cost = max(self.largest_cost, cost)
        if len(lengths) > 1 and not constraint.fits(lengths):
            self.over_budget += 1
        self.sizes.append(len(lengths))

    @property
    def efficiency(self) -> float:
        return self.real / self.padded if self.padded else 1.0

    def reset(self) -> None:
        self.__init__(self.stage)

    def to_dict(self) -> dict:
        """The figures as plain data (what a DataLoader worker reports)."""
        return {name: getattr(self, name) for name in self.__dataclass_fields__
                if name != "stage"}

    def merge(self, data: dict) -> None:
        """Add another pass's figures (:meth:`to_dict` of another worker's stats)."""
        for name in ("batches", "samples", "real", "padded", "over_budget", "oversize_emitted",
                     "oversize_dropped"):
            setattr(self, name, getattr(self, name) + data[name])
        self.largest_cost = max(self.largest_cost, data["largest_cost"])
        self.sizes.extend(data["sizes"])

    def warn_if_budget_too_small(self, constraint: BatchConstraint) -> None:
        """Warn (:class:`BudgetWarning`, with the figures) when most batches of the pass were
        one sample too long for the budget on its own: the budget is then in the wrong unit
        or too small, and batching does nothing."""
        if self.batches >= 4 and self.oversize_emitted * 2 > self.batches:
            warnings.warn(
                f"{self.stage}: {self.oversize_emitted} of {self.batches} batches are one "
                f"sample whose cost alone exceeds the budget ({constraint!r}; the largest cost "
                f"was {self.largest_cost:g}); the budget is too small or in another unit than "
                "the samples' lengths -- a budget number counts seconds; PaddedArea(n) counts "
                "frames of feats, else audio samples", BudgetWarning, stacklevel=3)

    def warn_if_budget_too_large(self, constraint: BatchConstraint) -> None:
        """Warn (:class:`BudgetWarning`, with the figures and the unit) when the budget is far
        too large for the data: a pass of 64 samples or more whose largest batch holds half
        of them or more (one or two batches where a GPU wanted dozens), or a budget in
        seconds that let a batch cost more than an hour of padded audio."""
        if not self.batches or isinstance(constraint, SampleCount):
            return
        largest = max(self.sizes)
        unit = _unit_of(constraint)
        whole = self.samples >= _LARGE_PASS and 2 * largest >= self.samples
        hour = unit == "seconds" and self.largest_cost > _LARGE_BATCH_SECONDS
        if not (whole or hour):
            return
        what = (f"its largest batch holds {largest} of the pass's {self.samples} samples "
                f"({self.batches} batch(es))" if whole else
                f"a batch cost {self.largest_cost:g} s of padded audio (more than "
                f"{_LARGE_BATCH_SECONDS:g} s)")
        warnings.warn(
            f"{self.stage}: {what}; the largest batch cost {self.largest_cost:g} "
            f"{unit} under {constraint!r}: a budget this large runs a GPU out of memory and "
            "takes few steps per epoch. Is it in another unit than the samples' lengths? "
            "a budget number and length='duration' count seconds; PaddedArea(n) counts frames "
            "of feats, else audio samples (a few hundred seconds per GPU is usual)",
            BudgetWarning, stacklevel=3)

    def report(self) -> str:
        if not self.batches:
            return f"{self.stage}: no batches"
        sizes = sorted(self.sizes)
        return "\n".join(
            [
                f"{self.stage}: {self.batches} batches, {self.samples} samples",
                f"  padding efficiency {self.efficiency:.4f} (real / padded length)",
                f"  batch size min {sizes[0]} / median {statistics.median(sizes):g} / "
                f"max {sizes[-1]}",
                f"  largest batch cost {self.largest_cost:g}; batches over budget "
                f"{self.over_budget}",
                f"  oversize samples: {self.oversize_emitted} emitted alone, "
                f"{self.oversize_dropped} dropped",
            ]
        )
