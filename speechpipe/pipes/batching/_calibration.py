"""Batch budgets sized to the accelerator's memory, measured with the user's own training step.

:func:`calibrate_budget` splits the corpus's lengths into buckets, and for each bucket runs the
caller's training step on the worst batch of that bucket -- ``n`` utterances of the bucket's
longest length, with its longest transcript -- searching the largest ``n`` whose peak memory
stays within a limit (doubling, then bisecting; an out-of-memory error counts as over the
limit). When the corpus has transcripts, one more step at each bucket's cap with half its
longest transcript tells the memory per frame from the memory per token (the worst batches
alone cannot when transcripts grow with the audio). The measurements then give:

* :attr:`Calibration.caps`: the largest batch of each bucket (``n`` at the bucket's longest);
* :meth:`Calibration.quadratic`: a :class:`~speechpipe.pipes.batching._constraints.Quadratic` budget
  fitted to them (least squares of ``memory = base + a·n·L + b·n·L²``, so ``q = a / b`` and
  ``budget = (limit - base) / a``), for ``bucket_by_length`` + ``block_batch``:
  ``budget=calibration.quadratic(length=...)``;
* :meth:`Calibration.two_dimensional`: a
  :class:`~speechpipe.pipes.batching._constraints.TwoDimensional` budget over inputs and
  outputs fitted to them (least squares of ``memory = base + a·n·L + c·n·U``, ``U`` the
  transcript's length): any batch within ``n·L <= budget_in`` and ``n·U <= budget_out`` needs
  at most ``base + a·budget_in + c·budget_out = limit``; the headroom is split between the two
  at the ratio of outputs to inputs that admits the most audio in the buckets' worst batches,
  then both budgets are scaled down where a bucket's measured cap is below what they allow;
* :meth:`Calibration.padded_area`: the linear budget (``n·L``) the caps allow in every bucket.

On CUDA the peak memory is ``torch.cuda.max_memory_allocated`` (reset before each step) and
the limit a fraction of the device's memory; elsewhere the caller passes ``memory`` (a
function returning the bytes of the last step) and ``limit``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ._constraints import PaddedArea, Quadratic, TwoDimensional

__all__ = ["Calibration", "calibrate_budget"]


@dataclass
class Calibration:
    """What :func:`calibrate_budget` measured and what it makes of it.

    Attributes:
        limit: the memory limit (bytes or the caller's unit).
        buckets: per bucket ``(longest length, longest output length)``.
        caps: per bucket, the largest batch size within the limit (0: not even one).
        measurements: every step run: ``(n, length, output_length, memory)``, ``memory``
            ``math.inf`` for an out-of-memory error.
    """

    limit: float
    buckets: list[tuple[float, float]]
    caps: list[int]
    measurements: list[tuple[int, float, float, float]] = field(default_factory=list)

    def fit(self) -> tuple[float, float, float]:
        """``(base, a, b)`` of ``memory = base + a·n·L + b·n·L²``, least squares over the
        steps that ran on a bucket's worst batch (the steps with half a transcript, for
        :meth:`two_dimensional`, are left out: this fit has no term for the outputs)."""
        worst = set(self.buckets)
        rows = [(1.0, n * length, n * length * length, memory)
                for n, length, out, memory in self.measurements
                if math.isfinite(memory) and (length, out) in worst]
        return _least_squares(rows)

    def quadratic(self, *, length: Any = None, max_samples: int | None = None) -> Quadratic:
        """A :class:`Quadratic` budget fitted to the measurements (``length``: how samples
        are measured, in the unit of the calibration's lengths)."""
        base, a, b = self.fit()
        if a <= 0:
            raise ValueError(f"the fitted memory per length unit is {a!r}, not > 0: the "
                             "measurements do not grow with the batch")
        q = a / b if b > 0 else 1e30  # no quadratic term: a padded area
        return Quadratic(budget=(self.limit - base) / a, q=q, max_samples=max_samples,
                         length=length)

    def fit_two_dimensional(self) -> tuple[float, float, float]:
        """``(base, a, c)`` of ``memory = base + a·n·L + c·n·U`` (``U``: the output length),
        least squares over the steps that ran."""
        rows = [(1.0, n * length, n * out, memory)
                for n, length, out, memory in self.measurements if math.isfinite(memory)]
        if not any(row[2] for row in rows):
            raise ValueError("no measured step has an output length: calibrate with "
                             "(length, output_length) pairs for a TwoDimensional budget")
        return _least_squares(rows)

    # long: the split of the headroom between the two budgets and the check against the caps
    def two_dimensional(self, *, ratio: float | None = None, length: Any = None,
                        output: str = "tokens", max_samples: int | None = None
                        ) -> TwoDimensional:
        """A :class:`TwoDimensional` budget fitted to the measurements: ``n × longest input
        <= budget_in`` and ``n × longest output <= budget_out`` (``length`` and ``output``
        as :class:`TwoDimensional` takes them, in the calibration's units).

        The fit ``memory = base + a·n·L + c·n·U`` bounds a batch within both budgets by
        ``base + a·budget_in + c·budget_out``, set to the limit; ``ratio`` (outputs per
        input unit, ``budget_out / budget_in``) splits it, by default the ratio among the
        buckets' (longest output / longest input) that admits the most audio (``n × L``)
        summed over their worst batches. Both budgets are then scaled down, if needed, so
        that no bucket's worst batch is allowed more utterances than its measured cap (a
        model with terms the fit lacks, such as attention's ``n·L²``, stays within the
        limit where it was measured).
        """
        base, a, c = self.fit_two_dimensional()
        if a <= 0:
            raise ValueError(f"the fitted memory per input unit is {a!r}, not > 0: the "
                             "measurements do not grow with the batch")
        if ratio is not None and not (isinstance(ratio, (int, float)) and ratio > 0):
            raise ValueError(f"ratio must be a number > 0, got {ratio!r}")
        headroom = self.limit - base
        if not headroom > 0:
            raise ValueError(f"the fitted memory of an empty batch ({base:.4g}) is not below "
                             f"the limit ({self.limit:.4g})")
        c = max(c, 0.0)  # outputs that cost nothing measurable
        worst = [(top, out, cap) for (top, out), cap in zip(self.buckets, self.caps)
                 if top > 0 and out > 0]

        def budgets(r: float) -> tuple[float, float]:
            budget_in = headroom / (a + c * r)
            return budget_in, (budget_in * r if c > 0 else math.inf)

        def allowed(budget_in: float, budget_out: float, top: float, out: float) -> float:
            return min(budget_in / top, budget_out / out)

        if ratio is None:
            ratios = sorted({out / top for top, out, _ in worst})
            if not ratios:
                raise ValueError("no bucket has an output length: calibrate with "
                                 "(length, output_length) pairs for a TwoDimensional budget")
            ratio = max(ratios, key=lambda r: sum(
                math.floor(allowed(*budgets(r), top, out)) * top for top, out, _ in worst))
        budget_in, budget_out = budgets(ratio)
        scale = 1.0
        for top, out, cap in worst:  # the measured caps are the truth at the worst batches
            n = allowed(budget_in, budget_out, top, out)
            if cap and math.floor(n) > cap:
                scale = min(scale, cap / n)
        return TwoDimensional(budget_in=budget_in * scale, budget_out=budget_out * scale,
                              max_samples=max_samples, length=length, output=output)

    def padded_area(self, *, length: Any = None) -> PaddedArea:
        """The largest ``n × L`` budget every bucket's measured cap allows."""
        allowed = [cap * top for cap, (top, _) in zip(self.caps, self.buckets) if cap]
        if not allowed:
            raise ValueError("no bucket fits even one utterance within the limit")
        return PaddedArea(budget=min(allowed), length=length)


def _buckets(lengths: Sequence[tuple[float, float]], num_buckets: int,
             boundaries: Sequence[float] | None) -> list[tuple[float, float]]:
    ordered = sorted(lengths)
    if boundaries is None:  # equal-count buckets
        edges = [ordered[max(0, (i * len(ordered)) // num_buckets - 1)][0]
                 for i in range(1, num_buckets)]
    else:
        edges = list(boundaries)
    groups: list[list[tuple[float, float]]] = [[] for _ in range(len(edges) + 1)]
    for pair in ordered:
        index = sum(1 for e in edges if pair[0] > e)
        groups[index].append(pair)
    return [(max(p[0] for p in g), max(p[1] for p in g)) for g in groups if g]


def _largest(fits: Callable[[int, float, float], bool], top: float, out: float,
             max_batch: int) -> int:
    """The largest ``n <= max_batch`` that fits: doubling, then bisecting (0: not even one)."""
    good, bad = 0, None
    n = 1
    while n <= max_batch:  # double until over the limit
        if fits(n, top, out):
            good, n = n, n * 2
        else:
            bad = n
            break
    if bad is None:
        return good
    while bad - good > 1:  # bisect between the last fit and the first miss
        middle = (good + bad) // 2
        if fits(middle, top, out):
            good = middle
        else:
            bad = middle
    return good


# long: argument checks, the search per bucket and a 26-line docstring
def calibrate_budget(
    step_fn: Callable[[int, float, float], Any],
    lengths: Sequence[float] | Sequence[tuple[float, float]],
    *,
    num_buckets: int = 4,
    boundaries: Sequence[float] | None = None,
    memory: Callable[[], float] | None = None,
    limit: float | None = None,
    fraction: float = 0.9,
    max_batch: int = 4096,
) -> Calibration:
    """Find, per length bucket, the largest batch the training step runs within a memory limit.

    Args:
        step_fn: ``step_fn(n, length, output_length)`` runs one training step (forward,
            backward, optimiser step) on a batch of ``n`` utterances of ``length`` with
            transcripts of ``output_length`` (in the units of ``lengths``), e.g. zero
            features of ``(n, length, 80)`` and tokens of ``(n, output_length)``.
        lengths: the corpus's lengths (``compute_lengths``, an index's), or
            ``(length, output_length)`` pairs.
        num_buckets: equal-count buckets when no ``boundaries`` are given.
        boundaries: increasing lengths separating the buckets (``bucket_by_length``'s).
        memory: returns the peak memory of the last step; on CUDA by default
            ``torch.cuda.max_memory_allocated`` (reset before each step).
        limit: the memory the steps may use; on CUDA by default ``fraction`` of the device's.
        fraction: of the device's memory, when ``limit`` is not given (CUDA).
        max_batch: the largest batch tried.

    With output lengths, one more step per bucket runs at its cap with half the bucket's
    longest output (for :meth:`Calibration.two_dimensional`'s fit).

    >>> def step(n, length, out):  # a model whose step needs 100 + n × length² bytes
    ...     step.peak = 100 + n * length ** 2
    >>> cal = calibrate_budget(step, [10, 20, 30, 40], num_buckets=2,
    ...                        memory=lambda: step.peak, limit=20_000)
    >>> cal.buckets, cal.caps
    ([(20, 0), (40, 0)], [49, 12])
    """
    import torch

    if not callable(step_fn):
        raise TypeError(f"step_fn must be callable, got {step_fn!r}")
    pairs = [tuple(x) if isinstance(x, (tuple, list)) else (x, 0) for x in lengths]
    if not pairs:
        raise ValueError("lengths is empty")
    for pair in pairs:
        if len(pair) != 2 or not all(isinstance(v, (int, float)) and v >= 0 for v in pair):
            raise ValueError(f"lengths must hold numbers >= 0 or (length, output) pairs, got "
                             f"{pair!r}")
    if not isinstance(num_buckets, int) or isinstance(num_buckets, bool) or num_buckets < 1:
        raise ValueError(f"num_buckets must be an int >= 1, got {num_buckets!r}")
    if not isinstance(max_batch, int) or isinstance(max_batch, bool) or max_batch < 1:
        raise ValueError(f"max_batch must be an int >= 1, got {max_batch!r}")
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction!r}")
    cuda = torch.cuda.is_available()
    if memory is None:
        if not cuda:
            raise ValueError("memory is required without a CUDA device: a function returning "
                             "the peak memory of the last step")
        memory = torch.cuda.max_memory_allocated
    if limit is None:
        if not cuda:
            raise ValueError("limit is required without a CUDA device")
        limit = fraction * torch.cuda.get_device_properties(torch.cuda.current_device()) \
            .total_memory
    if not limit > 0:
        raise ValueError(f"limit must be > 0, got {limit!r}")
    oom = (torch.cuda.OutOfMemoryError,) if hasattr(torch.cuda, "OutOfMemoryError") else ()
    measurements: list[tuple[int, float, float, float]] = []

    def fits(n: int, top: float, out: float) -> bool:
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        try:
            step_fn(n, top, out)
            used = float(memory())
        except oom:
            used = math.inf
            if cuda:
                torch.cuda.empty_cache()
        measurements.append((n, top, out, used))
        return used <= limit

    buckets = _buckets(pairs, num_buckets, boundaries)
    caps = [_largest(fits, top, out, max_batch) for top, out in buckets]
    for (top, out), cap in zip(buckets, caps):
        if cap and out:  # half the transcript at the cap: memory per token apart from per frame
            fits(cap, top, out / 2)
    return Calibration(limit=float(limit), buckets=buckets, caps=caps, measurements=measurements)


def _least_squares(rows: list[tuple[float, float, float, float]]) -> tuple[float, float, float]:
    """The three coefficients of ``memory = x0·r0 + x1·r1 + x2·r2`` over rows
    ``(r0, r1, r2, memory)``, least squares with the columns scaled to 1."""
    import numpy as np

    if len(rows) < 3:
        raise ValueError(f"need at least 3 measured steps to fit, got {len(rows)}")
    data = np.array(rows, dtype=np.float64)
    scale = np.abs(data[:, :3]).max(axis=0)
    solution, *_ = np.linalg.lstsq(data[:, :3] / scale, data[:, 3], rcond=None)
    x0, x1, x2 = (solution / scale).tolist()
    return x0, x1, x2
