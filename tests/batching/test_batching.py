"""pack_batches, bucket_by_length and block_batch (the cost models: test_constraints.py).

Invariants (checked on random length lists with hypothesis): no batch of two or more samples
exceeds its budget; every sample appears exactly once per epoch unless the oversize policy
drops it, and then it is counted; the same seed gives the same batches; another epoch gives
another order.
"""

from __future__ import annotations

import collections
import pickle
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import speechpipe  # noqa: F401
from speechpipe.pipes._core import IterableWrapper, IterDataPipe
from speechpipe.pipes.batching._buckets import BlockBatcher, LengthBucketer
from speechpipe.sample import estimate_boundaries
from speechpipe.pipes.batching import pack_batches
from speechpipe.pipes.batching import (
    BatchStats, BudgetWarning, PaddedArea, Quadratic, SampleCount, SumOfLengths,
)

lengths_st = st.lists(st.integers(min_value=1, max_value=3000), min_size=0, max_size=300)
budget_st = st.integers(min_value=50, max_value=20000)


def constraints(budget, cap=None):
    return [PaddedArea(budget=budget, max_samples=cap), SumOfLengths(budget=budget, max_samples=cap),
            Quadratic(budget=budget, q=500, max_samples=cap)]


def samples_of(lengths):
    return [{"key": f"u{i}", "num_frames": n} for i, n in enumerate(lengths)]


# --- pack_batches (property based) ------------------------------------------------------

@settings(max_examples=150, deadline=None)
@given(lengths=lengths_st, budget=budget_st, cap=st.one_of(st.none(), st.integers(1, 50)),
       oversize=st.sampled_from(["emit", "drop"]))
def test_pack_never_exceeds_budget_and_keeps_every_sample(lengths, budget, cap, oversize):
    for c in constraints(budget, cap):
        stats = BatchStats()
        batches = list(pack_batches(lengths, c, oversize=oversize, stats=stats))
        for batch in batches:
            assert len(batch) == 1 or c.fits(batch)
        alone_over = [n for n in lengths if not c.fits([n])]
        flat = [n for b in batches for n in b]
        fitting = [n for n in lengths if c.fits([n])]
        assert [n for n in flat if c.fits([n])] == fitting  # order of the rest is kept
        expected = lengths if oversize == "emit" else fitting
        assert sorted(flat) == sorted(expected)  # nothing lost but the counted oversize
        if oversize == "emit":
            assert stats.oversize_emitted == len(alone_over) and stats.oversize_dropped == 0
        else:
            assert stats.oversize_dropped == len(alone_over) and stats.oversize_emitted == 0
        assert stats.over_budget == 0
        assert stats.samples == len(flat) and stats.batches == len(batches)


# --- bucket_by_length + block_batch -------------------------------------------------------

def streaming(lengths, *, budget, buffer=64, seed=0, epoch=0, window=8, **kw):
    pipe = IterableWrapper(samples_of(lengths)).bucket_by_length(buffer, seed=seed, **kw)
    pipe = pipe.block_batch(PaddedArea(budget), shuffle_window=window, seed=seed)
    pipe.set_epoch(epoch)
    pipe.source_datapipe.set_epoch(epoch)
    return pipe


@pytest.mark.filterwarnings("ignore::speechpipe.pipes.batching._constraints.BudgetWarning")  # tiny budgets
@settings(max_examples=60, deadline=None)
@given(lengths=lengths_st, budget=budget_st, buffer=st.integers(1, 80),
       buckets=st.one_of(st.none(), st.integers(1, 8)))
def test_streaming_every_sample_once_and_within_budget(lengths, budget, buffer, buckets):
    pipe = streaming(lengths, budget=budget, buffer=buffer, num_buckets=buckets)
    batches = list(pipe)
    keys = [s["key"] for b in batches for s in b]
    assert sorted(keys) == sorted(s["key"] for s in samples_of(lengths))
    c = PaddedArea(budget=budget)
    for b in batches:
        assert len(b) == 1 or c.fits([s["num_frames"] for s in b])
    assert pipe.stats.over_budget == 0
    assert pipe.stats.oversize_emitted == sum(1 for n in lengths if n > budget)


@pytest.mark.filterwarnings("ignore::speechpipe.pipes.batching._constraints.BudgetWarning")  # tiny budgets
@settings(max_examples=30, deadline=None)
@given(lengths=st.lists(st.integers(1, 3000), min_size=1, max_size=200), budget=budget_st)
def test_same_seed_same_batches(lengths, budget):
    def keys(p):
        return [[s["key"] for s in b] for b in p]

    assert keys(streaming(lengths, budget=budget, seed=7)) == keys(
        streaming(lengths, budget=budget, seed=7))


def test_another_epoch_gives_another_order():
    lengths = list(np.random.default_rng(0).integers(100, 2000, size=400))
    orders = {tuple(tuple(s["key"] for s in b) for b in streaming(lengths, budget=6000, epoch=e))
              for e in range(3)}
    assert len(orders) == 3


def test_batches_are_not_emitted_length_sorted():
    lengths = list(np.random.default_rng(1).integers(100, 2000, size=600))
    pipe = streaming(lengths, budget=8000, buffer=600, window=50)
    maxima = [max(s["num_frames"] for s in b) for b in pipe]
    assert maxima != sorted(maxima) and maxima != sorted(maxima, reverse=True)


def test_sorted_groups_pad_less_than_arrival_order():
    rng = np.random.default_rng(2)
    lengths = list(rng.integers(100, 2000, size=2000))
    bucketed = streaming(lengths, budget=20000, buffer=2000)
    list(bucketed)
    plain = IterableWrapper(samples_of(lengths)).block_batch(PaddedArea(20000))
    list(plain)
    assert bucketed.stats.efficiency > 0.98 and plain.stats.efficiency < 0.8


def test_oversize_drop_is_counted_and_reported():
    pipe = IterableWrapper(samples_of([5, 50, 6])).block_batch(PaddedArea(20), oversize="drop",
                                                                shuffle_window=1)
    assert [[s["num_frames"] for s in b] for b in pipe] == [[5, 6]]
    assert pipe.stats.oversize_dropped == 1
    assert "0 emitted alone, 1 dropped" in pipe.stats.report()


def test_report_shows_efficiency_and_batch_sizes():
    pipe = IterableWrapper([10, 12, 20, 30]).block_batch(PaddedArea(40), shuffle_window=1)
    assert list(pipe) == [[10, 12], [20], [30]]
    report = pipe.stats.report()
    assert "3 batches, 4 samples" in report
    assert f"padding efficiency {72 / 74:.4f}" in report
    assert "batch size min 1 / median 1 / max 2" in report


def test_bucket_by_length_holds_at_most_buffer_size():
    pulled = []

    def source():
        for i, n in enumerate(np.random.default_rng(3).integers(1, 100, size=500)):
            pulled.append(i)
            yield int(n)

    emitted = 0
    for group in LengthBucketer(IterableWrapper(source()), 40, boundaries=[20, 50, 80]):
        assert len(pulled) - emitted <= 40
        emitted += len(group)
    assert emitted == 500


def test_groups_stay_within_given_boundaries():
    lengths = list(np.random.default_rng(4).integers(1, 100, size=300))
    groups = list(LengthBucketer(IterableWrapper(lengths), 50, boundaries=[25, 60]))
    for g in groups:
        assert g == sorted(g)
        assert len({(n >= 25) + (n >= 60) for n in g}) == 1


def test_boundaries_are_estimated_lazily_from_each_pass():
    class Counting(IterDataPipe):
        def __init__(self, values):
            self.values, self.iterated = values, 0

        def __iter__(self):
            self.iterated += 1
            yield from self.values

    values = [int(n) for n in np.random.default_rng(5).integers(1, 1000, size=400)]
    src = Counting(values)
    pipe = LengthBucketer(src, 100, num_buckets=4)
    assert src.iterated == 0 and pipe.estimated_boundaries is None
    first = list(pipe)
    bounds = pipe.estimated_boundaries
    assert bounds is not None and len(bounds) == 3
    assert sorted(n for g in first for n in g) == sorted(values)
    assert src.iterated == 1
    list(pipe)  # the same data: the same estimate; each pass estimates from its own head
    assert pipe.estimated_boundaries == bounds and src.iterated == 2
    src.values = [n * 10 for n in values]  # (issue 23: epoch 0's estimate made a resumed
    list(pipe)                             # epoch differ; each pass now depends on itself)
    assert pipe.estimated_boundaries == [b * 10 for b in bounds]


def test_boundaries_from_a_callable_are_read_at_first_iteration():
    calls = []

    def from_index():
        calls.append(1)
        return [10, 20]

    pipe = LengthBucketer(IterableWrapper([5, 15, 25]), 10, boundaries=from_index)
    assert calls == []
    assert sorted(map(tuple, pipe)) == [(5,), (15,), (25,)]
    list(pipe)
    assert calls == [1]


def test_estimate_boundaries_are_equal_count_quantiles():
    assert estimate_boundaries([1, 2, 3, 4, 5, 6, 7, 8], 2) == [5]
    assert estimate_boundaries([3, 3, 3, 3], 3) == [3]
    assert estimate_boundaries([], 3) == []


def test_block_batch_validates_arguments():
    src = IterableWrapper([1])
    with pytest.raises(ValueError, match="give a budget: seconds"):
        BlockBatcher(src)
    with pytest.raises(ValueError, match="oversize must be one of"):
        BlockBatcher(src, PaddedArea(10), oversize="keep")
    with pytest.raises(ValueError, match="shuffle_window must be an int >= 1"):
        BlockBatcher(src, PaddedArea(10), shuffle_window=0)
    with pytest.raises(ValueError, match="max_samples goes with a budget in seconds"):
        BlockBatcher(src, budget=PaddedArea(budget=5), max_samples=3)
    with pytest.raises(ValueError, match="epoch must be an int >= 0"):
        BlockBatcher(src, PaddedArea(10)).set_epoch(-1)
    with pytest.raises(ValueError, match="buffer_size must be an int >= 1"):
        LengthBucketer(src, 0)
    with pytest.raises(ValueError, match="boundaries must increase strictly"):
        LengthBucketer(src, 10, boundaries=[5, 5])


def test_mixing_groups_and_samples_is_a_type_error():
    with pytest.raises(TypeError, match="either samples or the groups"):
        list(IterableWrapper([[1, 2], 3]).block_batch(PaddedArea(10)))


def test_block_batch_has_no_length():
    with pytest.raises(TypeError):
        len(IterableWrapper([1, 2]).block_batch(PaddedArea(10)))


def test_pickled_pipe_gives_the_same_batches():
    lengths = list(np.random.default_rng(6).integers(1, 500, size=200))
    pipe = streaming(lengths, budget=2000, seed=3, epoch=2)
    clone = pickle.loads(pickle.dumps(pipe))
    assert [[s["key"] for s in b] for b in pipe] == [[s["key"] for s in b] for b in clone]


def test_workers_get_distinct_seeds_and_reproducible_batches():
    lengths = list(np.random.default_rng(7).integers(1, 500, size=300))

    def run():
        pipe = (IterableWrapper(samples_of(lengths)).sharding_filter()
                .bucket_by_length(50).block_batch(PaddedArea(3000), seed=1))
        loader = torch.utils.data.DataLoader(pipe, batch_size=None, num_workers=2,
                                             collate_fn=lambda b: [s["key"] for s in b])
        return list(loader)

    first = run()
    assert first == run()
    keys = [k for b in first for k in b]
    assert collections.Counter(keys) == collections.Counter(s["key"] for s in samples_of(lengths))


def test_block_batch_states_taken_every_step_equal_states_taken_once():
    """block_batch keeps the identities of the batches it holds between states: a state
    taken after states at every earlier step is the state taken once at that step."""
    samples = [{"key": f"u{i:03d}", "source": "s.tar", "n": int(n)}
               for i, n in enumerate(np.random.default_rng(5).integers(5, 60, 300))]

    def pipe():
        return (IterableWrapper(samples, deepcopy=False)
                .bucket_by_length(80, budget=PaddedArea(budget=200, length=_n), seed=1)
                .block_batch(PaddedArea(budget=200, length=_n), seed=1,
                             shuffle_window=8))

    every, once = pipe(), pipe()
    it_every, it_once = iter(every), iter(once)
    for step in range(40):
        next(it_every)
        next(it_once)
        taken = every.state_dict()
        if step in (3, 17, 39):
            assert taken == once.state_dict()


def _n(sample: dict) -> int:
    return sample["n"]


# ------------------------------------------------------------------------------ units (issue 17)


def _utterances(seconds):
    return [{"key": f"u{i}", "audio": np.zeros(int(s * 16000), np.float32), "sample_rate": 16000}
            for i, s in enumerate(seconds)]


def test_a_number_is_a_budget_in_seconds():
    rows = _utterances([1.0, 2.0, 1.5, 3.0, 2.5, 0.5])
    batches = list(IterableWrapper(rows).block_batch(4.0, shuffle_window=1))
    for batch in batches:
        longest = max(len(s["audio"]) / 16000 for s in batch)
        assert len(batch) * longest <= 4.0
    assert sum(len(b) for b in batches) == 6 and max(len(b) for b in batches) > 1
    with pytest.raises(TypeError, match="budget must be seconds"):
        IterableWrapper(rows).block_batch("4")


def test_a_budget_that_makes_most_batches_one_sample_warns_with_the_figures():
    # issue 17: batch_len=60_000 on 16 kHz audio read as samples: 89 oversize utterances came
    # out alone, silently
    rows = _utterances([4.0, 5.0, 6.0, 4.5, 5.5, 3.0])
    pipe = IterableWrapper(rows).block_batch(PaddedArea(60_000), shuffle_window=1)
    with pytest.warns(BudgetWarning, match=r"5 of 6 batches are one sample .*PaddedArea\(n\) "
                                           r"counts frames of feats, else audio samples"):
        list(pipe)
    assert pipe.stats.oversize_emitted == 5  # the 3 s one fits: 48,000 samples
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a budget that fits: no warning
        list(IterableWrapper(rows).block_batch(20.0, shuffle_window=1))


def test_a_budget_far_too_large_warns_with_the_figures_and_the_unit():
    # Issue 32.4: max_duration=3000 meant as frames gave one batch of all 95 utterances, a
    # budget of 20000 s one batch of 544: an OOM on a GPU, silently.
    rows = [{"key": f"u{i}", "duration": 2.0 + (i % 7) * 0.5} for i in range(95)]
    pipe = IterableWrapper(rows).block_batch(3000, shuffle_window=1)
    with pytest.warns(BudgetWarning, match=r"block_batch: its largest batch holds 95 of the "
                                           r"pass's 95 samples \(1 batch\(es\)\); the largest "
                                           r"batch cost 475 seconds under PaddedArea\(budget=3000"):
        assert len(list(pipe)) == 1
    # many batches, but each more than an hour of padded audio
    hours = [{"key": f"h{i}", "duration": 20.0} for i in range(800)]
    with pytest.warns(BudgetWarning, match=r"a batch cost 4000 s of padded audio \(more than "
                                           r"3600 s\).*a budget number and "
                                           r"length='duration' count seconds"):
        list(IterableWrapper(hours).block_batch(4000, shuffle_window=1))
    # frames: the unit is said
    frames = [{"key": f"f{i}", "num_frames": 300} for i in range(70)]
    with pytest.warns(BudgetWarning, match=r"cost 21000 frames of feats, else audio samples"):
        list(IterableWrapper(frames).block_batch(PaddedArea(10**6), shuffle_window=1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # budgets that fit the data: no warning
        list(IterableWrapper(rows).block_batch(60.0, shuffle_window=1))
        list(IterableWrapper(rows[:20]).block_batch(3000, shuffle_window=1))
        list(IterableWrapper(frames).block_batch(SampleCount(70), shuffle_window=1))
