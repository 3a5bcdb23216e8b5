"""Several sources: zip_by_name, mix_by_weight, sample_with_replacement.

Invariants: a weighted mix draws sources in proportion to the weights; without replacement
every source keeps its own order and nothing is yielded twice; ``until`` / ``stop`` /
``samples_per_epoch`` decide exactly where an epoch ends, and every restart of a source is
counted and reads it with a new epoch; the same seed and epoch give the same output, another
epoch another output; pickled pipes give the same output.
"""

from __future__ import annotations

import itertools
import math
import operator
import pickle
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import speechpipe  # noqa: F401
from speechpipe.errors import DataError
from speechpipe.pipes._core import IterableWrapper, registered_iter_names, SequenceWrapper
from speechpipe.pipes._core import registered_map_names
from speechpipe.pipes._core import propagate_epoch
from speechpipe.pipes.batching import PaddedArea
from speechpipe.pipes.collate import PadCollate
from speechpipe.pipes.order._mixing import NamedZipper, ReplacementSampler, WeightedMixer
from speechpipe.pipes.order import mix_by_weight, pass_epoch, SourceStats, zip_by_name


def items(prefix, n):
    return IterableWrapper([f"{prefix}{i}" for i in range(n)])


def shuffled(n, seed=0):
    """A seeded random pipe: the ints 1..n as batches of one, in a shuffled order."""
    return IterableWrapper(list(range(1, n + 1))).block_batch(
        budget=PaddedArea(budget=math.inf, max_samples=1), shuffle_window=n, seed=seed
    ).map(operator.itemgetter(0))


def chi_square(counts, weights):
    total, wsum = sum(counts.values()), sum(weights.values())
    return sum((counts[k] - total * w / wsum) ** 2 / (total * w / wsum) for k, w in weights.items())


# --------------------------------------------------------------------------- registration


def test_functional_names_are_registered_and_new():
    iter_names = registered_iter_names()
    assert {"zip_by_name", "mix_by_weight", "sample_with_replacement"} <= iter_names
    assert "sample_with_replacement" in registered_map_names()


# --------------------------------------------------------------------------- mix_by_weight


def test_long_weighted_mix_follows_the_weights():
    weights = {"a": 5.0, "b": 3.0, "c": 2.0}
    pipe = WeightedMixer({k: items(k, 7) for k in weights}, weights=weights, endless=True,
                         samples_per_epoch=30_000, tag_field=None, seed=3)
    counts = Counter(s[0] for s in pipe)
    assert sum(counts.values()) == 30_000
    # 2 degrees of freedom: 13.8 is the 0.1 % point; a bias of 1 % of the draws gives > 40.
    assert chi_square(counts, weights) < 13.8
    for k, w in weights.items():
        assert abs(counts[k] / 30_000 - w / 10) < 0.01
    assert pipe.stats.taken == dict(counts)


def test_weights_given_as_sequence_follow_the_sources_order():
    pipe = items("a", 5).mix_by_weight(items("b", 5), names=("a", "b"), weights=(1, 9),
                                       endless=True, samples_per_epoch=10_000)
    counts = Counter(s[0] for s in pipe)
    assert abs(counts["b"] / 10_000 - 0.9) < 0.01


def test_stop_first_ends_when_an_exhausted_source_is_drawn():
    pipe = WeightedMixer({"small": items("s", 3), "big": items("b", 1000)},
                         weights={"small": 1, "big": 1}, stop="first", seed=0)
    out = list(pipe)
    assert [x for x in out if x[0] == "s"] == ["s0", "s1", "s2"]
    assert [x for x in out if x[0] == "b"] == [f"b{i}" for i in range(len(out) - 3)]
    assert len(out) < 1003
    assert pipe.stats.ended == {"small": 1, "big": 0}
    assert pipe.stats.restarts == {"small": 0, "big": 0}
    assert pipe.epochs_completed == 1


def test_stop_first_is_the_default():
    pipe = WeightedMixer({"a": items("a", 2), "b": items("b", 500)}, weights={"a": 1, "b": 1})
    assert pipe.stop == "first" and len(list(pipe)) < 502


def test_stop_all_yields_every_sample_once_in_each_sources_order():
    sources = {"a": items("a", 5), "b": items("b", 40), "c": items("c", 1)}
    pipe = WeightedMixer(sources, weights={"a": 1, "b": 2, "c": 3}, stop="all", seed=5)
    out = list(pipe)
    assert len(out) == len(pipe) == 46
    for name, n in (("a", 5), ("b", 40), ("c", 1)):
        assert [x for x in out if x[0] == name] == [f"{name}{i}" for i in range(n)]
    assert pipe.stats.ended == {"a": 1, "b": 1, "c": 1}


def test_stop_all_renormalises_the_weights_of_the_remaining_sources():
    # "c" runs out almost at once; the rest must then follow a:b = 1:4, not 1:4 diluted by c.
    sources = {"a": items("a", 4000), "b": items("b", 16000), "c": items("c", 2)}
    out = list(WeightedMixer(sources, weights={"a": 1, "b": 4, "c": 1000}, stop="all", seed=1))
    head = Counter(x[0] for x in out[2:10_002])
    assert abs(head["a"] / 10_000 - 0.2) < 0.015


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(0, 12), min_size=1, max_size=4),
       weights=st.lists(st.floats(0.01, 100), min_size=4, max_size=4),
       seed=st.integers(0, 2**31))
def test_stop_all_is_an_interleaving_of_the_sources(sizes, weights, seed):
    names = [f"s{i}" for i in range(len(sizes))]
    sources = {n: IterableWrapper([(n, j) for j in range(k)]) for n, k in zip(names, sizes)}
    pipe = WeightedMixer(sources, weights=dict(zip(names, weights)), stop="all", seed=seed)
    out = list(pipe)
    assert len(out) == sum(sizes)
    for n, k in zip(names, sizes):
        assert [x for x in out if x[0] == n] == [(n, j) for j in range(k)]


def test_endless_with_samples_per_epoch_has_exact_length_and_counts_source_epochs():
    pipe = WeightedMixer({"a": items("a", 3)}, weights={"a": 1}, endless=True,
                         samples_per_epoch=10)
    assert len(pipe) == 10
    out = list(pipe)
    assert out == ["a0", "a1", "a2"] * 3 + ["a0"]
    # 10 samples of a 3-sample source: three passes ran out, each followed by a restart.
    assert pipe.stats.ended == {"a": 3} and pipe.stats.restarts == {"a": 3}
    assert pipe.epochs_completed == 1
    list(pipe)
    assert pipe.epochs_completed == 2


def test_a_pass_stopped_early_is_not_a_completed_epoch():
    pipe = WeightedMixer({"a": items("a", 3)}, weights={"a": 1}, endless=True,
                         samples_per_epoch=10)
    assert list(itertools.islice(pipe, 4)) == ["a0", "a1", "a2", "a0"]
    assert pipe.epochs_completed == 0


def test_endless_without_samples_per_epoch_never_ends_and_has_no_length():
    pipe = WeightedMixer({"a": items("a", 2), "b": items("b", 3)}, weights={"a": 1, "b": 1},
                         endless=True)
    assert len(list(itertools.islice(pipe, 5000))) == 5000
    with pytest.raises(TypeError, match="never ends"):
        len(pipe)


def test_len_is_a_type_error_for_stop_first_and_unsized_sources():
    with pytest.raises(TypeError, match=r"stop='first'\) has no length"):
        len(WeightedMixer({"a": items("a", 2)}, weights={"a": 1}))
    unsized = items("b", 2).filter(bool)
    with pytest.raises(TypeError, match="source 'b' has none"):
        len(WeightedMixer({"a": items("a", 2), "b": unsized}, weights=(1, 1), stop="all"))


def test_restarted_source_gets_a_new_epoch_and_the_first_pass_the_mixers():
    pipe = WeightedMixer({"x": shuffled(20, seed=4)}, weights={"x": 1}, endless=True,
                         samples_per_epoch=60).set_epoch(2)
    out = list(pipe)
    passes = [out[0:20], out[20:40], out[40:60]]
    assert all(sorted(p) == list(range(1, 21)) for p in passes)
    assert passes[0] != passes[1] != passes[2] != passes[0]
    # pass 0 of the mixer's epoch 2 reads the source at epoch 2; restart k at pass_epoch(2, k)
    alone = shuffled(20, seed=4)
    for k in range(3):
        propagate_epoch(alone, pass_epoch(2, k))
        assert passes[k] == list(alone)


def test_tag_field_names_the_source_and_is_off_by_default():
    a = IterableWrapper([{"key": "a1"}])
    b = IterableWrapper([{"key": "b1"}])
    tagged = list(WeightedMixer({"libri": a, "cv": b}, weights=(1, 1), stop="all",
                                tag_field="corpus"))
    assert sorted((s["key"], s["corpus"]) for s in tagged) == [("a1", "libri"), ("b1", "cv")]
    plain = list(WeightedMixer({"libri": a, "cv": b}, weights=(1, 1), stop="all"))
    assert all(set(s) == {"key"} for s in plain)


def test_tag_field_does_not_mutate_the_source_samples():
    sample = {"key": "a1"}
    mixed = list(mix_by_weight({"a": [sample]}, {"a": 1}, __import__("random").Random(0),
                               tag_field="corpus"))
    assert mixed == [{"key": "a1", "corpus": "a"}] and sample == {"key": "a1"}


def test_tag_field_already_holding_another_value_is_an_error_naming_the_key():
    a = IterableWrapper([{"key": "u7", "corpus": "other"}])
    with pytest.raises(DataError, match=r"source 'a' \(key 'u7'\): sample already has a field "
                                        r"'corpus' = 'other'"):
        list(WeightedMixer({"a": a}, weights=(1,), tag_field="corpus"))


def test_tag_field_on_non_dict_samples_is_an_error_naming_the_source():
    with pytest.raises(DataError, match=r"mix_by_weight source 'a': tag_field='corpus' needs "
                                        r"dict samples, got a str"):
        list(WeightedMixer({"a": items("a", 1)}, weights=(1,), tag_field="corpus"))


def test_endless_mix_of_an_empty_source_is_an_error_not_a_hang():
    with pytest.raises(DataError, match=r"mix_by_weight source 'e': empty when read again"):
        list(WeightedMixer({"a": items("a", 3), "e": IterableWrapper([])}, weights=(1, 1),
                           endless=True, samples_per_epoch=50))


def test_mix_report_shows_shares_and_weights():
    pipe = WeightedMixer({"a": items("a", 2), "b": items("b", 2)}, weights={"a": 3, "b": 1},
                         stop="all")
    list(pipe)
    report = pipe.stats.report()
    assert report.splitlines()[0] == "mix_by_weight (stop='all'): 4 samples"
    assert "  a: 2 taken (50.0 %; weight 75.0 %), ran out 1x, restarted 0x" in report


# --------------------------------------------------------------------------- zip_by_name


def test_until_shortest_stops_at_the_shortest_without_restarts():
    pipe = NamedZipper({"a": items("a", 3), "b": items("b", 5)})
    assert list(pipe) == [{"a": f"a{i}", "b": f"b{i}"} for i in range(3)]
    assert len(pipe) == 3
    assert pipe.stats.restarts == {"a": 0, "b": 0} and pipe.stats.ended == {"a": 1, "b": 0}


def test_until_longest_restarts_the_shorter_sources_and_counts_it():
    pipe = NamedZipper({"a": items("a", 2), "b": items("b", 5)}, until="longest")
    out = list(pipe)
    assert [s["a"] for s in out] == ["a0", "a1", "a0", "a1", "a0"]
    assert [s["b"] for s in out] == [f"b{i}" for i in range(5)]
    assert len(pipe) == 5
    assert pipe.stats.restarts == {"a": 2, "b": 0}
    assert pipe.stats.taken == {"a": 5, "b": 5} and pipe.stats.steps == 5


def test_until_a_name_lets_that_source_define_the_epoch():
    pipe = NamedZipper({"sup": items("s", 4), "unsup": items("u", 10)}, until="sup")
    out = list(pipe)
    assert [s["sup"] for s in out] == ["s0", "s1", "s2", "s3"] and len(pipe) == 4
    pipe = NamedZipper({"sup": items("s", 4), "unsup": items("u", 3)}, until="unsup")
    out = list(pipe)
    assert [s["sup"] for s in out] == ["s0", "s1", "s2"] and len(pipe) == 3
    pipe = NamedZipper({"sup": items("s", 7), "unsup": items("u", 3)}, until="sup")
    list(pipe)
    assert pipe.stats.restarts == {"sup": 0, "unsup": 2}
    assert pipe.stats.report().splitlines() == [
        "zip_by_name (until='sup'): 7 steps",
        "  sup: 7 taken, ran out 1x, restarted 0x",
        "  unsup: 7 taken, ran out 2x, restarted 2x",
    ]


@settings(max_examples=40, deadline=None)
@given(lengths=st.lists(st.integers(1, 9), min_size=1, max_size=4))
def test_until_longest_takes_the_longest_and_restarts_ceil_minus_one(lengths):
    names = [f"s{i}" for i in range(len(lengths))]
    pipe = NamedZipper({n: items(n, k) for n, k in zip(names, lengths)}, until="longest")
    longest = max(lengths)
    assert len(list(pipe)) == longest == len(pipe)
    assert pipe.stats.restarts == {n: -(-longest // k) - 1 for n, k in zip(names, lengths)}


def test_positional_sources_with_names_and_step_order():
    pipe = items("b", 2).zip_by_name(items("a", 2), names=("second", "first"))
    assert [list(step) for step in pipe] == [["second", "first"]] * 2


def test_restarted_zip_source_reads_a_new_order():
    pipe = NamedZipper({"sup": items("s", 30), "x": shuffled(10, seed=9)}, until="sup")
    got = [step["x"] for step in pipe]
    passes = [got[0:10], got[10:20], got[20:30]]
    assert all(sorted(p) == list(range(1, 11)) for p in passes)
    assert passes[0] != passes[1] and passes[1] != passes[2]


def test_zip_set_epoch_reaches_the_sources():
    pipe = NamedZipper({"x": shuffled(12, seed=1), "y": shuffled(12, seed=2)})
    first = list(pipe)
    assert list(pipe) != first  # a new pass is the next epoch (issue 17)
    assert list(pipe.set_epoch(0)) == first
    assert list(pipe.set_epoch(1)) != first
    assert list(pipe.set_epoch(0)) == first


def test_empty_source_under_until_shortest_gives_no_steps():
    assert list(NamedZipper({"a": items("a", 3), "e": IterableWrapper([])})) == []


def test_empty_source_that_must_be_restarted_is_an_error():
    with pytest.raises(DataError, match=r"zip_by_name source 'e': empty when read again"):
        list(NamedZipper({"a": items("a", 3), "e": IterableWrapper([])}, until="a"))


def test_zip_len_without_source_length_is_a_type_error_naming_it():
    with pytest.raises(TypeError, match=r"until='longest'\) has no length: source 'b'"):
        len(NamedZipper({"a": items("a", 2), "b": items("b", 2).filter(bool)}, until="longest"))
    # with until="a", only "a"'s length matters
    assert len(NamedZipper({"a": items("a", 2), "b": items("b", 2).filter(bool)}, until="a")) == 2


def test_sup_and_unsup_batches_end_to_end():
    rng = np.random.default_rng(0)

    def corpus(prefix, n, with_text):
        samples = []
        for i in range(n):
            sample = {"key": f"{prefix}{i}",
                      "audio": rng.standard_normal(int(rng.integers(50, 400))).astype(np.float32)}
            if with_text:
                sample["text"] = f"utterance {i}"
            samples.append(sample)
        return samples

    sup = IterableWrapper(corpus("s", 20, True)).block_batch(PaddedArea(1200), seed=1).collate(
        collate_fn=PadCollate())
    unsup = IterableWrapper(corpus("u", 60, False)).block_batch(PaddedArea(2000), seed=2).collate(
        collate_fn=PadCollate())
    train = NamedZipper({"sup": sup, "unsup": unsup}, until="sup")
    steps = list(train)
    assert steps and all(set(step) == {"sup", "unsup"} for step in steps)
    for step in steps:
        assert set(step["sup"]) == {"key", "audio", "audio_len", "text"}
        assert set(step["unsup"]) == {"key", "audio", "audio_len"}
        b, t = step["sup"]["audio"].shape
        assert b * t <= 1200 or b == 1
        b, t = step["unsup"]["audio"].shape
        assert b * t <= 2000 or b == 1
    # one pass over the supervised data: every supervised key exactly once
    sup_keys = [k for step in steps for k in step["sup"]["key"]]
    assert sorted(sup_keys) == sorted(f"s{i}" for i in range(20))
    assert train.stats.ended["sup"] == 1 and train.stats.steps == len(steps)
    # same seeds, same epoch: same batches
    again = [(step["sup"]["key"], step["unsup"]["key"]) for step in train.set_epoch(0)]
    assert again == [(step["sup"]["key"], step["unsup"]["key"]) for step in steps]


# ------------------------------------------------------------------- sample_with_replacement


def test_sampler_draws_num_samples_with_replacement_from_a_map_pipe():
    pipe = SequenceWrapper(list("abcd")).sample_with_replacement(500, seed=2)
    out = list(pipe)
    assert len(out) == len(pipe) == 500 and set(out) == set("abcd")


def test_sampler_accepts_a_list_and_an_iter_pipe_alike():
    from_list = list(ReplacementSampler(list("abc"), 50, seed=4))
    from_iter = list(IterableWrapper(list("abc")).sample_with_replacement(50, seed=4))
    assert from_list == from_iter


def test_sampler_weights_set_proportions_and_zero_is_never_drawn():
    weights = [0.0, 1.0, 3.0]
    out = Counter(ReplacementSampler(list("xyz"), 20_000, weights=weights, seed=0))
    assert out["x"] == 0
    assert chi_square(out, {"y": 1.0, "z": 3.0}) < 10.83  # 1 dof, 0.1 % point


def test_sampler_endless_and_no_length():
    pipe = ReplacementSampler(list("ab"), None)
    assert len(list(itertools.islice(pipe, 3000))) == 3000
    with pytest.raises(TypeError, match="draws forever"):
        len(pipe)


def test_sampler_weight_count_of_an_iter_source_is_checked_when_read():
    pipe = IterableWrapper(list("abc")).sample_with_replacement(5, weights=[1, 2])
    with pytest.raises(ValueError, match="weights has 2 entries for 3 items"):
        list(pipe)


def test_sampler_of_an_empty_iter_source_is_an_error():
    with pytest.raises(ValueError, match="empty source"):
        list(IterableWrapper([]).sample_with_replacement(5))


# --------------------------------------------------------------------------- seeds and pickling


def test_same_seed_same_order_and_another_epoch_another_order():
    def mixer():
        return WeightedMixer({"a": items("a", 50), "b": items("b", 50)}, weights=(1, 2),
                             stop="all", seed=11)

    assert list(mixer()) == list(mixer())
    assert list(mixer().set_epoch(1)) != list(mixer())
    assert list(WeightedMixer({"a": items("a", 50), "b": items("b", 50)}, weights=(1, 2),
                              stop="all", seed=12)) != list(mixer())
    sampler = ReplacementSampler(list(range(100)), 100, seed=3)
    assert list(sampler) == list(ReplacementSampler(list(range(100)), 100, seed=3))
    assert list(sampler.set_epoch(1)) != list(sampler.set_epoch(0))


@pytest.mark.parametrize("make", [
    lambda: NamedZipper({"a": items("a", 3), "b": shuffled(7, seed=1)}, until="longest"),
    lambda: WeightedMixer({"a": items("a", 5), "b": shuffled(9)}, weights=(1, 1), endless=True,
                          samples_per_epoch=40, tag_field=None, seed=2).set_epoch(3),
    lambda: SequenceWrapper(list(range(10))).sample_with_replacement(30, seed=5),
], ids=["zip_by_name", "mix_by_weight", "sample_with_replacement"])
def test_pickle_round_trip_gives_the_same_output(make):
    pipe = make()
    clone = pickle.loads(pickle.dumps(make()))
    assert list(clone) == list(pipe)


def test_propagate_epoch_reaches_pipes_through_map_and_collate():
    inner = IterableWrapper([1, 2]).block_batch(PaddedArea(10))
    outer = inner.collate(collate_fn=len).map(str)
    assert propagate_epoch(outer, 5) == 1 and inner.epoch == 5


def test_propagate_epoch_stops_at_a_nested_mixer():
    inner = shuffled(4)
    nested = WeightedMixer({"x": inner}, weights=(1,), stop="all")
    top = nested.map(str)
    assert propagate_epoch(top, 6) == 1  # the nested mixer, not the pipes below it
    assert nested.epoch == 6 and inner.datapipe.epoch == 0


def test_pass_epoch_first_pass_is_the_epoch_and_restarts_differ():
    assert pass_epoch(0, 0) == 0 and pass_epoch(9, 0) == 9
    derived = {pass_epoch(e, k) for e in range(5) for k in range(1, 5)}
    assert len(derived) == 20 and not derived & set(range(100))


def test_source_stats_reset_zeroes_every_count():
    s = SourceStats("x", ("a",))
    s.steps, s.taken["a"], s.ended["a"], s.restarts["a"] = 3, 3, 1, 1
    s.reset()
    assert (s.steps, s.taken, s.ended, s.restarts) == (0, {"a": 0}, {"a": 0}, {"a": 0})


def test_plain_zip_function_works_on_lists():
    assert list(zip_by_name({"a": [1, 2], "b": [3, 4, 5]}, until="b")) == [
        {"a": 1, "b": 3}, {"a": 2, "b": 4}, {"a": 1, "b": 5}]


# --------------------------------------------------------------------------- bad arguments


A, B = items("a", 1), items("b", 1)


@pytest.mark.parametrize("build, error, message", [
    (lambda: NamedZipper(A, B), ValueError, r"needs names=\(\.\.\.\) for 2 positional"),
    (lambda: NamedZipper({"a": A}, names=("a",)), ValueError, "names only with positional"),
    (lambda: NamedZipper(A, B, names=("a",)), ValueError, "names has 1 entries for 2 sources"),
    (lambda: NamedZipper(A, B, names=("a", "a")), ValueError, "names must be unique"),
    (lambda: NamedZipper(A, names="a"), TypeError, "names must be a sequence of strings"),
    (lambda: NamedZipper({}), ValueError, "needs at least one source"),
    (lambda: NamedZipper({"": A}), TypeError, "non-empty strings, got ''"),
    (lambda: NamedZipper({"a": [1, 2]}), TypeError, "source 'a' must be an IterDataPipe, got list"),
    (lambda: NamedZipper({"a": A, "b": A}), ValueError, "sources 'a' and 'b' are the same pipe"),
    (lambda: NamedZipper({"a": A}, until="b"), ValueError, r"until must be .* got 'b'"),
    (lambda: NamedZipper({"longest": A}, until="longest"), ValueError, "must differ from"),
    (lambda: WeightedMixer({"a": A, "b": B}, weights={"a": 1}), ValueError,
     r"missing \['b'\], unknown \[\]"),
    (lambda: WeightedMixer({"a": A}, weights={"a": 1, "z": 2}), ValueError,
     r"missing \[\], unknown \['z'\]"),
    (lambda: WeightedMixer({"a": A, "b": B}, weights=(1,)), ValueError,
     "weights has 1 entries for 2 sources"),
    (lambda: WeightedMixer({"a": A}, weights={"a": 0}), ValueError,
     r"weights\['a'\] must be a positive finite number, got 0.0"),
    (lambda: WeightedMixer({"a": A}, weights={"a": -1}), ValueError, r"weights\['a'\]"),
    (lambda: WeightedMixer({"a": A}, weights={"a": math.inf}), ValueError, "got inf"),
    (lambda: WeightedMixer({"a": A}, weights={"a": math.nan}), ValueError, "got nan"),
    (lambda: WeightedMixer({"a": A}, weights={"a": "1"}), TypeError,
     r"weights\['a'\] must be a number, got '1'"),
    (lambda: WeightedMixer({"a": A}, weights={"a": True}), TypeError,
     "must be a number, got True"),
    (lambda: WeightedMixer({"a": A}, weights=3), TypeError, "weights must be a mapping"),
    (lambda: WeightedMixer({"a": A}, weights=(1,), stop="any"), ValueError,
     r"stop must be one of \('first', 'all'\), got 'any'"),
    (lambda: WeightedMixer({"a": A}, weights=(1,), stop="all", endless=True), ValueError,
     "stop='all' has no effect with endless=True"),
    (lambda: WeightedMixer({"a": A}, weights=(1,), samples_per_epoch=5), ValueError,
     "samples_per_epoch=5 needs endless=True"),
    (lambda: WeightedMixer({"a": A}, weights=(1,), endless=True, samples_per_epoch=0),
     ValueError, "samples_per_epoch must be an int >= 1 or None, got 0"),
    (lambda: WeightedMixer({"a": A}, weights=(1,), endless="yes"), TypeError,
     "endless must be a bool, got 'yes'"),
    (lambda: WeightedMixer({"a": A}, weights=(1,), tag_field=""), TypeError,
     "tag_field must be a non-empty string"),
    (lambda: WeightedMixer({"a": A}, weights=(1,), seed=1.5), TypeError, "seed must be an int"),
    (lambda: ReplacementSampler(list("ab"), 0), ValueError,
     "num_samples must be an int >= 1 or None, got 0"),
    (lambda: ReplacementSampler("ab", 3), TypeError, "source must be a MapDataPipe"),
    (lambda: ReplacementSampler([], 3), ValueError, "source is empty"),
    (lambda: ReplacementSampler(list("ab"), 3, weights=[1]), ValueError,
     "weights has 1 entries for 2 items"),
    (lambda: ReplacementSampler(list("ab"), 3, weights=[0, 0]), ValueError, "not all be 0"),
    (lambda: ReplacementSampler(list("ab"), 3, weights=[1, -2]), ValueError,
     r"weights\[1\] must be a finite number >= 0, got -2.0"),
    (lambda: ReplacementSampler(list("ab"), 3, weights="ab"), TypeError,
     "weights must be a sequence of numbers"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_bad_arguments_are_named(build, error, message):
    with pytest.raises(error, match=message):
        build()


def test_set_epoch_rejects_negative_epochs():
    with pytest.raises(ValueError, match="epoch must be an int >= 0, got -1"):
        NamedZipper({"a": A}).set_epoch(-1)
