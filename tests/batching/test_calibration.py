"""calibrate_budget on a memory model the test defines: the caps and the fitted Quadratic budget
are the known answers (within 5 %), and block_batch with that budget stays within the limit
(issue 33)."""

from __future__ import annotations

import math
import random

import pytest

import speechpipe as sp

BASE, LINEAR, SQUARE, PER_TOKEN = 5e6, 4000.0, 30.0, 200.0
LIMIT = 4e9


class Model:
    """Peak bytes of a training step on n utterances of L frames and `out` tokens."""

    def __init__(self, per_token: float = PER_TOKEN) -> None:
        self.per_token = per_token
        self.peak = 0.0
        self.steps = 0

    def step(self, n, length, out):
        self.steps += 1
        self.peak = BASE + n * (LINEAR * length + SQUARE * length ** 2 + self.per_token * out)

    def memory(self):
        return self.peak

    def largest(self, length, out):
        return math.floor((LIMIT - BASE) / (LINEAR * length + SQUARE * length ** 2
                                            + self.per_token * out))


@pytest.fixture(scope="module")
def lengths():
    rng = random.Random(0)
    frames = [rng.randint(100, 2000) for _ in range(1000)]
    return [(f, f // 8 + rng.randint(0, 20)) for f in frames]  # (frames, tokens)


def test_caps_are_the_largest_batches_of_each_bucket(lengths):
    model = Model()
    cal = sp.calibrate_budget(model.step, lengths, num_buckets=4, memory=model.memory,
                              limit=LIMIT)
    assert len(cal.buckets) == 4 and len(cal.caps) == 4
    for (top, out), cap in zip(cal.buckets, cal.caps):
        true = model.largest(top, out)  # the worst batch: the longest, the longest transcript
        assert abs(cap - true) <= 0.05 * true, (top, out, cap, true)
        assert cap == true  # the search is exact on a deterministic step
    assert cal.buckets[-1][0] == max(f for f, _ in lengths)
    assert cal.buckets[-1][1] == max(t for f, t in lengths if f > cal.buckets[-2][0])
    assert model.steps < 4 * 25  # doubling then bisecting: tens of steps, not thousands


def test_the_fitted_quadratic_recovers_the_model_and_batches_within_the_limit(lengths):
    model = Model(per_token=0.0)  # memory = base + n (a L + b L²): what Quadratic describes
    cal = sp.calibrate_budget(model.step, [f for f, _ in lengths], memory=model.memory,
                              limit=LIMIT, num_buckets=6)
    base, a, b = cal.fit()
    assert a == pytest.approx(LINEAR, rel=0.05) and b == pytest.approx(SQUARE, rel=0.05)
    budget = cal.quadratic()
    assert budget.q == pytest.approx(LINEAR / SQUARE, rel=0.05)
    assert budget.budget == pytest.approx((LIMIT - BASE) / LINEAR, rel=0.05)
    frames = [f for f, _ in lengths]
    pipe = sp.IterableWrapper(frames).bucket_by_length(1000, budget=budget, seed=0)
    batches = list(pipe.block_batch(budget, seed=0))
    assert sorted(f for b in batches for f in b) == sorted(frames)
    for batch in batches:  # every batch fits the memory the model says it takes
        model.step(len(batch), max(batch), 0)
        assert model.peak <= LIMIT * 1.05, (len(batch), max(batch))
    for top in (200, 800, 2000):  # the budget admits the largest batch, within 5 %
        true = model.largest(top, 0)
        allowed = max(n for n in range(1, 2 * true) if budget.fits([top] * n))
        assert abs(allowed - true) <= 0.05 * true, (top, allowed, true)


def test_an_out_of_memory_error_counts_as_over_the_limit(monkeypatch):
    import torch

    class Oom(RuntimeError):
        pass

    monkeypatch.setattr(torch.cuda, "OutOfMemoryError", Oom)
    peak = {}

    def step(n, length, out):
        if n > 10:
            raise Oom("CUDA out of memory")
        peak["bytes"] = n

    cal = sp.calibrate_budget(step, [5, 6], num_buckets=1, memory=lambda: peak["bytes"],
                              limit=1000)
    assert cal.caps == [10]
    assert any(math.isinf(m[3]) for m in cal.measurements)


def test_a_padded_area_from_the_caps(lengths):
    model = Model()
    cal = sp.calibrate_budget(model.step, lengths, memory=model.memory, limit=LIMIT)
    area = cal.padded_area()
    assert area.budget == min(c * top for c, (top, _) in zip(cal.caps, cal.buckets))


@pytest.mark.parametrize("kwargs, error, message", [
    ({"lengths": []}, ValueError, "lengths is empty"),
    ({"lengths": [(1, 2, 3)]}, ValueError, r"lengths must hold numbers >= 0 or \(length, "
                                           r"output\) pairs, got \(1, 2, 3\)"),
    ({"num_buckets": 0}, ValueError, "num_buckets must be an int >= 1, got 0"),
    ({"max_batch": 0}, ValueError, "max_batch must be an int >= 1, got 0"),
    ({"limit": -1}, ValueError, "limit must be > 0, got -1"),
    ({"fraction": 1.5}, ValueError, r"fraction must be in \(0, 1\], got 1.5"),
    ({"step_fn": 3}, TypeError, "step_fn must be callable, got 3"),
])
def test_bad_arguments_are_named(kwargs, error, message):
    args = {"step_fn": lambda n, length, out: None, "lengths": [10], "memory": lambda: 1,
            "limit": 100, **kwargs}
    with pytest.raises(error, match=message):
        sp.calibrate_budget(args.pop("step_fn"), args.pop("lengths"), **args)


def test_without_cuda_memory_and_limit_are_required(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="memory is required without a CUDA device"):
        sp.calibrate_budget(lambda n, length, out: None, [10], limit=100)
    with pytest.raises(ValueError, match="limit is required without a CUDA device"):
        sp.calibrate_budget(lambda n, length, out: None, [10], memory=lambda: 1)


PER_FRAME, PER_TOKEN_2D = 4000.0, 40000.0  # tokens as dear as frames: the split matters


class LinearModel:
    """Peak bytes of a step: base + n (a L + c U): what TwoDimensional describes."""

    def __init__(self) -> None:
        self.peak = 0.0
        self.steps = []

    def step(self, n, length, out):
        self.steps.append((n, length, out))
        self.peak = BASE + n * (PER_FRAME * length + PER_TOKEN_2D * out)

    def memory(self):
        return self.peak

    @staticmethod
    def largest(length, out):
        return math.floor((LIMIT - BASE) / (PER_FRAME * length + PER_TOKEN_2D * out))


@pytest.fixture(scope="module")
def proportional():
    """(frames, tokens) with transcripts growing with the audio, as in speech corpora."""
    rng = random.Random(1)
    frames = [rng.randint(100, 2000) for _ in range(1000)]
    return [(f, max(1, round(f / 8 * rng.uniform(0.9, 1.1)))) for f in frames]


def test_the_fitted_two_dimensional_recovers_the_model_and_the_largest_batches(proportional):
    model = LinearModel()
    cal = sp.calibrate_budget(model.step, proportional, num_buckets=6, memory=model.memory,
                              limit=LIMIT)
    # each bucket's worst batch, then one step at its cap with half its longest transcript
    for (top, out), cap in zip(cal.buckets, cal.caps):
        assert cap == model.largest(top, out)
        assert (cap, top, out / 2) in model.steps
    base, a, c = cal.fit_two_dimensional()
    assert a == pytest.approx(PER_FRAME, rel=0.05) and c == pytest.approx(PER_TOKEN_2D, rel=0.05)
    assert base == pytest.approx(BASE, rel=0.05)
    budget = cal.two_dimensional()
    assert isinstance(budget, sp.TwoDimensional)
    # a batch within both budgets needs at most the limit
    assert BASE + PER_FRAME * budget.budget_in + PER_TOKEN_2D * budget.budget_out \
        == pytest.approx(LIMIT, rel=1e-6)
    for (top, out), cap in zip(cal.buckets, cal.caps):  # the largest batch, within 5 %
        allowed = max(n for n in range(1, 2 * cap) if budget.fits([(top, out)] * n))
        assert cap * 0.95 <= allowed <= cap, (top, out, allowed, cap)
    pipe = sp.IterableWrapper(proportional).bucket_by_length(1000, budget=budget, seed=0)
    batches = list(pipe.block_batch(budget=budget, seed=0))
    assert sorted(p for b in batches for p in b) == sorted(proportional)
    for batch in batches:  # every batch within the limit, by the model's own measure
        model.step(len(batch), max(f for f, _ in batch), max(t for _, t in batch))
        assert model.peak <= LIMIT, batch


def test_without_the_half_transcript_steps_the_two_costs_could_not_be_told_apart(proportional):
    """The worst batches alone have transcripts in one proportion to the audio: frames and
    tokens are collinear there and the least squares cannot split them."""
    model = LinearModel()
    exact = [(8 * (f // 8), f // 8) for f, _ in proportional]  # tokens exactly proportional
    cal = sp.calibrate_budget(model.step, exact, num_buckets=4, memory=model.memory,
                              limit=LIMIT)
    base, a, c = cal.fit_two_dimensional()
    assert a == pytest.approx(PER_FRAME, rel=0.05) and c == pytest.approx(PER_TOKEN_2D, rel=0.05)
    worst_only = sp.Calibration(limit=cal.limit, buckets=cal.buckets, caps=cal.caps,
                                measurements=[m for m in cal.measurements
                                              if m[2] in {out for _, out in cal.buckets}])
    _, a2, c2 = worst_only.fit_two_dimensional()
    assert a2 != pytest.approx(PER_FRAME, rel=0.05) or c2 != pytest.approx(PER_TOKEN_2D, rel=0.05)


def test_the_two_dimensional_budget_keeps_to_the_caps_when_the_model_is_quadratic(lengths):
    """Attention's n L² is no term of the fit: the budgets are scaled to the measured caps."""
    model = Model()
    cal = sp.calibrate_budget(model.step, lengths, num_buckets=4, memory=model.memory,
                              limit=LIMIT)
    budget = cal.two_dimensional()
    for (top, out), cap in zip(cal.buckets, cal.caps):
        allowed = max(n for n in range(1, 2 * cap) if budget.fits([(top, out)] * n))
        assert allowed <= cap
        model.step(allowed, top, out)
        assert model.peak <= LIMIT


def test_two_dimensional_needs_output_lengths_and_a_positive_ratio(proportional):
    model = Model(per_token=0.0)
    cal = sp.calibrate_budget(model.step, [f for f, _ in proportional], memory=model.memory,
                              limit=LIMIT)
    with pytest.raises(ValueError, match="no measured step has an output length"):
        cal.two_dimensional()
    model = LinearModel()
    cal = sp.calibrate_budget(model.step, proportional, memory=model.memory, limit=LIMIT)
    with pytest.raises(ValueError, match="ratio must be a number > 0, got 0"):
        cal.two_dimensional(ratio=0)
    given = cal.two_dimensional(ratio=0.125, output="text_len")
    assert given.budget_out == pytest.approx(0.125 * given.budget_in)
    assert given.output == "text_len"


def test_the_half_transcript_steps_stay_out_of_the_quadratic_fit(lengths):
    model = Model()
    cal = sp.calibrate_budget(model.step, lengths, num_buckets=4, memory=model.memory,
                              limit=LIMIT)
    worst = [m for m in cal.measurements if (m[1], m[2]) in set(cal.buckets)]
    assert len(worst) == len(cal.measurements) - len(cal.buckets)  # one half step a bucket
    alone = sp.Calibration(limit=cal.limit, buckets=cal.buckets, caps=cal.caps,
                           measurements=worst)
    assert cal.fit() == alone.fit()
