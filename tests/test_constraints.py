"""The cost models that size a batch, and the one way to say which (batch_constraint).

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
    batch_constraint, PaddedArea, Quadratic, SampleCount, SumOfLengths, TwoDimensional,
)
from speechpipe.pipes.batching import BatchView, form_batches

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


# --- batch_constraint: one way to size a batch ------------------------------------------

def test_shorthands_name_constraints():
    assert batch_constraint(batch_len=100) == PaddedArea(budget=100)
    assert batch_constraint(batch_len=100, max_samples=4) == PaddedArea(budget=100, max_samples=4)
    assert batch_constraint(batch_size=8) == SampleCount(8)
    assert batch_constraint(SumOfLengths(budget=5)) == SumOfLengths(budget=5)
    assert batch_constraint() is None


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(constraint=PaddedArea(5), batch_len=5), ValueError,
     "give batch_len or constraint, not both"),
    (dict(constraint=PaddedArea(5), batch_len=5, required=True), ValueError,
     "give exactly one of batch_len and constraint"),
    (dict(required=True), ValueError, "give exactly one of batch_len and constraint"),
    (dict(batch_len=5, batch_size=2), ValueError,
     r"give batch_size \(piece batches\) or batch_len/constraint \(block batches\), not both"),
    (dict(constraint=PaddedArea(5), max_samples=3), ValueError, "max_samples goes with batch_len"),
    (dict(batch_size=2, max_samples=3), ValueError, "max_samples goes with batch_len"),
    (dict(batch_len="5"), TypeError, "batch_len must be a number, got '5'"),
    (dict(batch_len=0), ValueError, "budget must be > 0, got 0"),
    (dict(batch_size=2.0), TypeError, "batch_size must be an int, got 2.0"),
    (dict(batch_size=0), ValueError, "batch_size must be >= 1, got 0"),
    (dict(constraint=10), TypeError, "constraint must be a BatchConstraint, got 10"),
])
def test_conflicts_and_bad_values_are_named(kwargs, error, message):
    with pytest.raises(error, match=message):
        batch_constraint(**kwargs)


def test_each_stage_gives_the_same_batches_for_a_shorthand_and_its_constraint():
    lengths = [int(n) for n in np.random.default_rng(3).integers(1, 400, size=120)]

    def streaming(**size):
        pipe = IterableWrapper(lengths).bucket_by_length(30).block_batch(seed=1, **size)
        return list(pipe)

    assert streaming(batch_len=900) == streaming(constraint=PaddedArea(budget=900))
    keyed = {f"u{i:03d}": n for i, n in enumerate(lengths)}
    assert (BatchView(keyed, batch_len=900).batching_view
            == BatchView(keyed, constraint=PaddedArea(budget=900)).batching_view)
    for world in (1, 2):
        by_size = BatchView(keyed, batch_size=4, world_size=world)
        by_count = BatchView(keyed, constraint=SampleCount(4), world_size=world)
        assert by_size.batching_view == by_count.batching_view
        assert by_size.stats.to_dict() == by_count.stats.to_dict()
    keys = sorted(keyed)
    assert (form_batches(keys, keyed, batch_size=6, world_size=2)
            == form_batches(keys, keyed, constraint=SampleCount(6), world_size=2))


def test_piece_batches_take_pairs_of_lengths_too():
    view = BatchView({"a": (5, 1), "b": (3, 2), "c": (9, 1)}, constraint=SampleCount(2),
                     shuffle=False)
    assert view.batching_view == [["c", "a"], ["b"]]
    with pytest.raises(ValueError, match="batch_size must be a multiple of world_size=2, got 3"):
        BatchView({"a": 1}, constraint=SampleCount(3), world_size=2)
