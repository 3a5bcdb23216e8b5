"""The cost models that size a batch, and the one way to say which (batch_budget).

Invariant: each shorthand gives the same batches as the constraint it names
(batch_len=B is PaddedArea(budget=B), batch_size=N is SampleCount(N)), in every stage that
takes it.
"""

from __future__ import annotations

import numpy as np
import pytest

import speechpipe  # noqa: F401
from speechpipe.pipes._core import IterableWrapper
from speechpipe.pipes.batching import pack_batches
from speechpipe.pipes.batching import (
    batch_budget, PaddedArea, Quadratic, SampleCount, SumOfLengths, TwoDimensional,
)
from speechpipe.pipes.batching import BatchView
from speechpipe.sample import sample_duration

# --- cost models ------------------------------------------------------------------------

def test_costs_of_each_model():
    assert PaddedArea(budget=1).cost([3, 5, 4]) == 15
    assert SumOfLengths(budget=1).cost([3, 5, 4]) == 12
    assert Quadratic(budget=1, q=10).cost([3, 10]) == 2 * (10 + 100 / 10)
    assert TwoDimensional(budget_in=1, budget_out=1).cost([(3, 1), (5, 9)]) == 10


def test_max_samples_caps_the_count():
    c = PaddedArea(budget=10**9, max_samples=3)
    assert [len(b) for b in pack_batches([1] * 7, c)] == [3, 3, 1]


def test_two_dimensional_measures_frames_and_tokens():
    c = TwoDimensional(budget_in=1000, budget_out=30)
    sample = {"feats": np.zeros((120, 80), np.float32), "tokens": np.arange(12)}
    assert c.measure(sample) == (120, 12)
    batches = list(pack_batches([sample] * 5, c))
    assert [len(b) for b in batches] == [2, 2, 1]  # 3 × 12 tokens = 36 > 30


def test_constraint_measures_a_named_field():
    c = PaddedArea(budget=100, length="tokens")
    assert c.measure({"audio": np.zeros(999), "tokens": [1, 2, 3]}) == 3


@pytest.mark.parametrize("bad", [0, -5])
def test_constraints_reject_non_positive_budgets(bad):
    with pytest.raises(ValueError, match="budget must be > 0"):
        PaddedArea(budget=bad)
    with pytest.raises(ValueError, match="max_samples must be a positive int"):
        PaddedArea(budget=10, max_samples=bad)
    with pytest.raises(ValueError, match="q must be > 0"):
        Quadratic(budget=10, q=bad)



# --- SampleCount ------------------------------------------------------------------------

def test_sample_count_fills_batches_whatever_the_lengths():
    assert list(pack_batches([5, 500, 1, 9000, 3], SampleCount(2))) == [[5, 500], [1, 9000], [3]]
    assert SampleCount(3).cost([(4, 1), (7, 2)]) == 14  # padded area of the input side
    with pytest.raises(ValueError, match="size must be an int >= 1, got 0"):
        SampleCount(0)


# --- batch_budget: one way to size a batch ----------------------------------------------

def test_a_number_is_seconds_and_a_constraint_is_itself():
    seconds = batch_budget(100)
    assert seconds == PaddedArea(budget=100, length=sample_duration)
    assert batch_budget(100, max_samples=4) == PaddedArea(100, max_samples=4,
                                                          length=sample_duration)
    assert batch_budget(100, length=None) == PaddedArea(budget=100)  # a view's own unit
    assert batch_budget(SampleCount(8)) == SampleCount(8)
    assert batch_budget(SumOfLengths(budget=5)) == SumOfLengths(budget=5)
    assert batch_budget(None) is None


@pytest.mark.parametrize("args, kwargs, error, message", [
    ((None,), dict(required=True), ValueError, "give a budget: seconds"),
    ((PaddedArea(5),), dict(max_samples=3), ValueError,
     r"max_samples goes with a budget in seconds; a constraint has its own: PaddedArea"),
    ((None,), dict(max_samples=3), ValueError, "max_samples goes with a budget in seconds"),
    (("5",), {}, TypeError, "budget must be seconds \\(a number\\) or a constraint"),
    ((True,), {}, TypeError, "budget must be seconds"),
    ((0,), {}, ValueError, "budget must be > 0, got 0"),
    ((-3.0,), {}, ValueError, "budget must be > 0"),
])
def test_bad_budgets_are_named(args, kwargs, error, message):
    with pytest.raises(error, match=message):
        batch_budget(*args, **kwargs)


@pytest.mark.parametrize("stage, name", [
    (lambda **kw: IterableWrapper([1]).block_batch(**kw), "constraint"),
    (lambda **kw: IterableWrapper([1]).block_batch(**kw), "batch_len"),
    (lambda **kw: IterableWrapper([1]).block_batch(**kw), "max_duration"),
    (lambda **kw: IterableWrapper([1]).bucket_by_length(**kw), "constraint"),
    (lambda **kw: BatchView({"a": 1}, **kw), "batch_len"),
    (lambda **kw: BatchView({"a": 1}, **kw), "batch_size"),
    (lambda **kw: BatchView({"a": 1}, **kw), "constraint"),
])
def test_the_old_spellings_are_gone(stage, name):
    with pytest.raises(TypeError, match=name):
        stage(**{name: 10})


def test_seconds_measure_durations_and_a_constraint_its_own_unit():
    samples = [{"key": f"u{i}", "duration": d, "feats": np.zeros((int(d * 100), 2))}
               for i, d in enumerate([1.0, 2.0, 3.0, 4.0])]

    def keys(budget):
        pipe = IterableWrapper(samples).block_batch(budget, shuffle_window=1)
        return [[s["key"] for s in batch] for batch in pipe]

    assert keys(9.0) == [["u0", "u1", "u2"], ["u3"]]  # 3 x 3 s within 9 s
    assert keys(8.9) == [["u0", "u1"], ["u2", "u3"]]  # 3 x 3 s > 8.9 s; 2 x 4 s within
    assert keys(PaddedArea(900)) == keys(9.0)  # the same in frames of feats
    assert keys(SampleCount(3)) == [["u0", "u1", "u2"], ["u3"]]


def test_each_stage_gives_the_same_batches_for_a_number_and_its_constraint():
    lengths = [int(n) for n in np.random.default_rng(3).integers(1, 400, size=120)]

    def streaming(budget):
        pipe = IterableWrapper(lengths).bucket_by_length(30).block_batch(budget, seed=1)
        return list(pipe)

    assert streaming(900) == streaming(PaddedArea(budget=900))  # bare lengths as they are
    keyed = {f"u{i:03d}": n for i, n in enumerate(lengths)}
    assert (BatchView(keyed, budget=900).batching_view
            == BatchView(keyed, budget=PaddedArea(budget=900)).batching_view)
    for world in (1, 2):
        assert BatchView(keyed, world_size=world).batching_view == BatchView(
            keyed, budget=SampleCount(world), world_size=world).batching_view


def test_piece_batches_take_pairs_of_lengths_too():
    view = BatchView({"a": (5, 1), "b": (3, 2), "c": (9, 1)}, budget=SampleCount(2),
                     shuffle=False)
    assert view.batching_view == [["c", "a"], ["b"]]
    with pytest.raises(ValueError, match="SampleCount must be a multiple of world_size=2, got 3"):
        BatchView({"a": 1}, budget=SampleCount(3), world_size=2)


def test_a_length_function_measures_numbers_too():
    # c14dde4 (one spelling) took every number as a bare length, even with the caller's own
    # length function: sample indices batched by their length table were measured as the
    # indices themselves (bench_batching's streaming road: batches 3.3 x over the budget)
    table = [500, 10, 20, 500]
    constraint = PaddedArea(budget=1000, length=lambda i: table[i])
    assert [constraint.measure(i) for i in range(4)] == table
    batches = list(IterableWrapper([0, 1, 2, 3]).block_batch(constraint, shuffle_window=1))
    assert [sorted(b) for b in batches] == [[0, 1], [2, 3]]
    assert PaddedArea(budget=1000).measure(7) == 7  # no length function: a bare length
    assert PaddedArea(budget=1000, length="duration").measure(7.5) == 7.5
