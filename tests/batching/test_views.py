"""Batching views (SpeeChain's Iterator): batches planned from lengths, data loaded per batch.

Invariants:
- without batches_per_epoch and with world_size=1, every key of the view appears in exactly one
  batch of every epoch (oversize keys: alone under "emit", absent and counted under "drop");
- no batch of more than one rank group exceeds the budget;
- the same seed gives the same batches; each epoch draws its own order; shuffle=False never
  changes the order;
- start_step=k yields the tail of the uninterrupted epoch and loads nothing for the k skipped;
- with world_size=W every batch splits into W parts of equal size and every rank runs the
  same number of steps.
"""

from __future__ import annotations

import functools
import pickle
from collections.abc import Mapping

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import speechpipe  # noqa: F401
from speechpipe.errors import DataError, MissingDataError
from speechpipe.pipes._core import IterDataPipe, MapDataPipe, SequenceWrapper
from speechpipe.pipes.batching import PaddedArea, SumOfLengths, TwoDimensional
from speechpipe.pipes.collate import PadCollate
from speechpipe.pipes.batching import compute_lengths, read_data_len, select_keys
from speechpipe.pipes.batching import BatchView, epoch_batches, shard_batch, ViewLoaderIterDataPipe
from speechpipe import SampleCount

FAST = settings(max_examples=40, deadline=None)

length_dicts = st.dictionaries(
    st.text("abcdefgh", min_size=1, max_size=4), st.integers(1, 300), max_size=50
)


class CountingMap(Mapping):
    """A key -> sample mapping that counts lookups (to prove what was loaded)."""

    def __init__(self, lengths):
        self.lengths = dict(lengths)
        self.loaded = []

    def __getitem__(self, key):
        self.loaded.append(key)
        n = self.lengths[key]
        return {"key": key, "audio": np.full(n, 0.5, np.float32)}

    def __iter__(self):
        return iter(self.lengths)

    def __len__(self):
        return len(self.lengths)


def _write(path, text):
    path.write_text(text, encoding="utf-8")
    return str(path)


def _flat(batches):
    return [key for batch in batches for key in batch]


LENGTHS = {f"u{i:02d}": 10 + (i * 37) % 90 for i in range(40)}


# --------------------------------------------------------------------------- budget and keys


@FAST
@given(length_dicts, st.integers(50, 400), st.sampled_from(["emit", "drop"]))
def test_budget_holds_and_every_key_once_per_epoch(lengths, budget, oversize):
    view = BatchView(lengths, budget=budget, oversize=oversize, seed=3)
    over = {k for k, n in lengths.items() if n > budget}
    for epoch in (0, 1):
        batches = view.batches(epoch)
        for batch in batches:
            if len(batch) > 1:
                assert len(batch) * max(lengths[k] for k in batch) <= budget
        keys = _flat(batches)
        expected = set(lengths) - over if oversize == "drop" else set(lengths)
        assert sorted(keys) == sorted(expected)  # each exactly once
        if oversize == "emit":
            assert all([k] in batches for k in over)
    assert view.stats.oversize_emitted == (len(over) if oversize == "emit" else 0)
    assert view.stats.oversize_dropped == (len(over) if oversize == "drop" else 0)
    assert view.stats.over_budget == 0


@FAST
@given(length_dicts, st.integers(100, 500))
def test_other_cost_models_hold_their_budget(lengths, budget):
    view = BatchView(lengths, budget=SumOfLengths(budget=budget, max_samples=5))
    for batch in view.batching_view:
        if len(batch) > 1:
            assert sum(lengths[k] for k in batch) <= budget and len(batch) <= 5
    assert sorted(_flat(view.batching_view)) == sorted(lengths)


def test_two_dimensional_budget_with_pair_lengths():
    lengths = {f"u{i}": (100 + i * 10, 5 + i) for i in range(20)}
    view = BatchView(lengths, budget=TwoDimensional(budget_in=600, budget_out=40))
    for batch in view.batching_view:
        n = len(batch)
        assert n * max(lengths[k][0] for k in batch) <= 600
        assert n * max(lengths[k][1] for k in batch) <= 40
    with pytest.raises(ValueError, match=r"TwoDimensional needs \(input, output\) pairs"):
        BatchView({"a": 3}, budget=TwoDimensional(budget_in=6, budget_out=4))


def test_stats_report_describes_the_view():
    view = BatchView({"a": 5, "b": 3, "c": 30}, budget=10)
    report = view.stats.report()
    assert "3 samples" in report and "1 emitted alone" in report
    assert view.stats.batches == len(view.batching_view) == 2


# --------------------------------------------------------------------------- order


@FAST
@given(length_dicts, st.integers(0, 10_000), st.integers(0, 50))
def test_same_seed_gives_the_same_batches(lengths, seed, epoch):
    a = BatchView(lengths, budget=300, seed=seed)
    b = BatchView(dict(reversed(list(lengths.items()))), budget=300, seed=seed)
    assert a.batches(epoch) == b.batches(epoch)


def test_each_epoch_draws_its_own_order_of_the_same_batches():
    view = BatchView(LENGTHS, budget=200, seed=1)
    orders = [view.batches(e) for e in range(4)]
    assert len(view.batching_view) >= 10
    assert all(sorted(o) == sorted(view.batching_view) for o in orders)
    assert len({tuple(map(tuple, o)) for o in orders}) == 4
    assert BatchView(LENGTHS, budget=200, seed=2).batches(0) != orders[0]


def test_shuffle_false_keeps_the_sorted_order_in_every_epoch():
    view = BatchView(LENGTHS, budget=200, shuffle=False)
    assert view.batches(0) == view.batches(5) == view.batching_view


@pytest.mark.parametrize("descending", [True, False])
def test_keys_are_sorted_by_length_with_ties_by_key(descending):
    lengths = {"d": 5, "a": 5, "c": 9, "b": 1, "e": 9}
    view = BatchView(lengths, budget=SampleCount(1), shuffle=False, descending=descending)
    order = _flat(view.batching_view)
    expected = ["c", "e", "a", "d", "b"] if descending else ["b", "a", "d", "c", "e"]
    assert order == expected


def test_piece_batches_have_a_fixed_count():
    view = BatchView(LENGTHS, budget=SampleCount(6), shuffle=False)
    sizes = [len(b) for b in view.batching_view]
    assert sizes == [6] * 6 + [4]
    assert _flat(view.batching_view) == sorted(LENGTHS, key=lambda k: (-LENGTHS[k], k))


def test_without_any_batching_option_one_utterance_per_rank_per_step():
    assert BatchView({"a": 1, "b": 2, "c": 3}).batching_view == [["c"], ["b"], ["a"]]
    assert BatchView({"a": 1, "b": 2}, world_size=2).batching_view == [["b", "a"]]


# --------------------------------------------------------------------------- batches_per_epoch


def _speechain_clip(batches, size, epoch):
    """SpeeChain's build_loader window for shuffle=False (its epochs count from 1)."""
    n = len(batches)
    cursor = (size * epoch) % n
    out = []
    while len(out) < size:
        take = min(size - len(out), n - cursor)
        out += batches[cursor:cursor + take]
        cursor = 0
    return out


@pytest.mark.parametrize("size", [1, 4, 9, 25])
def test_batches_per_epoch_unshuffled_is_speechains_cyclic_window(size):
    view = BatchView(LENGTHS, budget=300, shuffle=False, batches_per_epoch=size)
    assert len(view) == size
    for epoch in range(4):
        assert view.batches(epoch) == _speechain_clip(view.batching_view, size, epoch)


def test_batches_per_epoch_clip_uses_every_batch_once_per_round():
    view = BatchView(LENGTHS, budget=300, seed=4)
    n = len(view.batching_view)
    clipped = BatchView(LENGTHS, budget=300, seed=4, batches_per_epoch=4)
    assert len(clipped) == 4 and n % 4 != 0
    stream = [b for e in range(n) for b in clipped.batches(e)]  # n epochs = 4 rounds
    assert all(len(clipped.batches(e)) == 4 for e in range(n))
    assert stream[:n] == view.batches(0)  # epoch 0 is the start of the shuffled list
    assert stream[n:2 * n] == view.batches(1)
    for r in range(4):
        assert sorted(stream[r * n:(r + 1) * n]) == sorted(view.batching_view)


def test_batches_per_epoch_extend_supplements_with_the_next_round():
    view = BatchView(LENGTHS, budget=300, seed=4)
    n = len(view.batching_view)
    extended = BatchView(LENGTHS, budget=300, seed=4, batches_per_epoch=2 * n + 3)
    epoch0 = extended.batches(0)
    assert len(epoch0) == len(extended) == 2 * n + 3
    assert epoch0 == view.batches(0) + view.batches(1) + view.batches(2)[:3]
    assert extended.batches(1)[: n - 3] == view.batches(2)[3:]


# --------------------------------------------------------------------------- start_step


@pytest.mark.parametrize("start", [0, 1, 4])
def test_start_step_skips_without_loading_and_yields_the_epoch_tail(start):
    view = BatchView(LENGTHS, budget=300, seed=9)
    full = view.batches(2)
    assert view.batches(2, start_step=start) == full[start:]
    source = CountingMap(LENGTHS)
    pipe = ViewLoaderIterDataPipe(source, view, epoch=2, start_step=start)
    assert source.loaded == []  # nothing loaded by the constructor
    assert len(pipe) == len(full) - start
    got = [[s["key"] for s in batch] for batch in pipe]
    assert got == full[start:]
    assert source.loaded == _flat(full[start:])  # skipped batches never loaded


def test_start_step_past_the_epoch_is_rejected():
    view = BatchView(LENGTHS, budget=300)
    with pytest.raises(ValueError, match=r"start_step must be <= \d+ .*got 999"):
        view.batches(0, start_step=999)


def test_set_epoch_changes_the_order_and_resets_start_step():
    view = BatchView(LENGTHS, budget=300)
    pipe = SequenceWrapper(CountingMap(LENGTHS)).batch_by_view(view, start_step=2)
    assert len(pipe) == len(view) - 2
    pipe.set_epoch(3)
    assert len(pipe) == len(view)
    assert [[s["key"] for s in b] for b in pipe] == view.batches(3)


# --------------------------------------------------------------------------- world size


@FAST
@given(length_dicts, st.integers(2, 4), st.integers(60, 600))
def test_world_size_gives_every_rank_the_same_count_at_every_step(lengths, world, budget):
    view = BatchView(lengths, budget=budget, world_size=world, seed=1)
    glob = view.batches(1)
    per_rank = [view.batches(1, rank=r, world_size=world) for r in range(world)]
    assert all(len(p) == len(glob) == len(view) for p in per_rank)
    for step, batch in enumerate(glob):
        assert len(batch) % world == 0
        parts = [p[step] for p in per_rank]
        assert {len(part) for part in parts} == {len(batch) // world}
        assert sorted(_flat(parts)) == sorted(batch)
        if len(batch) > world:  # more than one rank group: within budget
            assert len(batch) * max(lengths[k] for k in batch) <= budget
    keys = _flat(glob)
    assert set(keys) == set(lengths)
    assert len(keys) - len(lengths) == view.stats.repeated < world


def test_rank_zero_gets_the_shortest_of_each_rank_group():
    lengths = {"a": 9, "b": 8, "c": 7, "d": 6}
    view = BatchView(lengths, budget=SampleCount(4), world_size=2, shuffle=False)
    assert view.batches(0, rank=0) == [["b", "d"]]
    assert view.batches(0, rank=1) == [["a", "c"]]
    assert shard_batch(["d", "c", "b", "a"], 0, 2, descending=False) == ["d", "b"]


def test_world_size_mismatch_and_bad_rank_are_rejected():
    view = BatchView(LENGTHS, budget=300, world_size=2)
    with pytest.raises(ValueError, match="world_size=4 differs from the view's world_size=2"):
        view.batches(0, rank=0, world_size=4)
    with pytest.raises(ValueError, match=r"rank must be an int in \[0, 2\), got 2"):
        view.batches(0, rank=2)
    with pytest.raises(ValueError, match="cannot be split evenly"):
        shard_batch(["a", "b", "c"], 0, 2)
    with pytest.raises(ValueError, match="SampleCount must be a multiple of world_size=2, got 3"):
        BatchView(LENGTHS, budget=SampleCount(3), world_size=2)


def test_pipe_needs_a_rank_when_the_view_spans_several_ranks():
    view = BatchView(LENGTHS, budget=300, world_size=2)
    with pytest.raises(ValueError, match="formed for world_size=2 .* world size 1"):
        list(SequenceWrapper(CountingMap(LENGTHS)).batch_by_view(view))
    pipe = SequenceWrapper(CountingMap(LENGTHS)).batch_by_view(view, rank=1)
    assert [[s["key"] for s in b] for b in pipe] == view.batches(0, rank=1)


# --------------------------------------------------------------------------- hooks and groups


def _pairs(keys, lengths, batch_size=2, **conf):
    """A custom strategy: pairs of keys in sorted order, records what it was given."""
    if "budget" in conf:
        batch_size = conf["budget"].size
    _pairs.calls.append((list(keys), dict(lengths), dict(conf), batch_size))
    return [list(keys[i:i + batch_size]) for i in range(0, len(keys), batch_size)]


_pairs.calls = []


def test_batches_fn_hook_gets_sorted_keys_lengths_and_options():
    _pairs.calls.clear()
    lengths = {"a": 1, "b": 4, "c": 3, "d": 2, "e": 5}
    view = BatchView(lengths, batches_fn=_pairs, budget=SampleCount(3), shuffle=False)
    keys, got_lengths, conf, batch_size = _pairs.calls[0]
    assert keys == ["e", "b", "c", "d", "a"] and got_lengths == lengths and batch_size == 3
    assert view.batching_view == [["e", "b", "c"], ["d", "a"]]


def test_batches_fn_with_world_size_uses_speechains_carry_rule():
    lengths = {"a": 1, "b": 4, "c": 3, "d": 2, "e": 5}
    view = BatchView(lengths, batches_fn=functools.partial(_pairs, batch_size=3), world_size=2,
                     shuffle=False)
    # [e b c] [d a] -> [e b] carry c -> [c d] carry a -> [a a] (repeated to fill)
    assert view.batching_view == [["e", "b"], ["c", "d"], ["a", "a"]]
    assert view.stats.repeated == 1


def _bad(keys, lengths):
    return [["nope"]]


def test_batches_fn_returning_unknown_keys_is_rejected():
    with pytest.raises(ValueError, match="batches_fn _bad returned key 'nope' .*not in lengths"):
        BatchView({"a": 1}, batches_fn=_bad)


def test_group_info_from_files_and_dicts(tmp_path):
    spk = _write(tmp_path / "utt2spk", "a s1\nb s2\nc s1\nz s9\n")
    view = BatchView({"a": 1, "b": 2, "c": 3}, group_info={"speaker": spk,
                                                           "gender": {"a": "f", "b": "m",
                                                                      "c": "f"}})
    assert view.group_info == {"speaker": {"a": "s1", "b": "s2", "c": "s1"},
                               "gender": {"a": "f", "b": "m", "c": "f"}}
    assert BatchView({"a": 1}).group_info is None


def test_group_info_missing_label_names_the_file_and_key(tmp_path):
    spk = _write(tmp_path / "utt2spk", "a s1\n")
    view = BatchView({"a": 1, "b": 2}, group_info={"speaker": spk})
    with pytest.raises(DataError, match=r"utt2spk \(key 'b'\): group 'speaker' has no label"):
        view.group_info


def test_group_info_files_must_not_overlap(tmp_path):
    one = _write(tmp_path / "one", "a s1\n")
    two = _write(tmp_path / "two", "b s2\na s3\n")
    view = BatchView({"a": 1, "b": 2}, group_info={"speaker": [one, two]})
    with pytest.raises(DataError, match=r"two:2 \(key 'a'\): key is also in .*one:1"):
        view.group_info


# --------------------------------------------------------------------------- data_len files


def test_read_data_len_merges_several_files_in_order(tmp_path):
    a = _write(tmp_path / "utt2num_frames.1", "u2 98\nu1 120\n")
    b = _write(tmp_path / "utt2dur", "u3 2.5\n\n")
    assert list(read_data_len([a, b]).items()) == [("u2", 98), ("u1", 120), ("u3", 2.5)]
    assert read_data_len(tmp_path / "utt2dur") == {"u3": 2.5}


def test_read_data_len_key_in_two_files_names_both_files_and_the_key(tmp_path):
    a = _write(tmp_path / "len_a", "u1 10\nu2 20\n")
    b = _write(tmp_path / "len_b", "u3 30\nu2 21\n")
    with pytest.raises(DataError) as err:
        read_data_len([a, b])
    assert "len_b:2" in str(err.value) and "len_a:2" in str(err.value)
    assert "(key 'u2')" in str(err.value)


@pytest.mark.parametrize("line, reason", [
    ("u2", "expected '<key> <value>'"),
    ("u2 abc", "got 'abc'"),
    ("u2 -3", "got '-3'"),
    ("u2 nan", "got 'nan'"),
    ("u2 12 13", "got '12 13'"),
])
def test_read_data_len_malformed_line_names_file_and_line(tmp_path, line, reason):
    path = _write(tmp_path / "utt2num_frames", f"u1 5\n{line}\n")
    with pytest.raises(DataError, match=r"utt2num_frames:2.*" + reason.replace("(", r"\(")):
        read_data_len(path)


def test_read_data_len_duplicate_key_and_missing_file(tmp_path):
    path = _write(tmp_path / "dup", "u1 5\nu1 6\n")
    with pytest.raises(DataError, match=r"dup:2 \(key 'u1'\): duplicate key"):
        read_data_len(path)
    with pytest.raises(MissingDataError, match="absent"):
        read_data_len(tmp_path / "absent")


def test_compute_lengths_caches_and_reuses(tmp_path):
    cache = tmp_path / "utt2num_samples"
    source = CountingMap({"a": 3, "b": 7})
    assert compute_lengths(source, cache=cache) == {"a": 3, "b": 7}
    assert sorted(source.loaded) == ["a", "b"]
    again = CountingMap({"a": 3, "b": 7, "c": 2})
    assert compute_lengths(again, ["b", "a"], cache=cache) == {"b": 7, "a": 3}
    assert again.loaded == []  # covered by the cache: nothing loaded
    assert compute_lengths(again, cache=cache) == {"a": 3, "b": 7, "c": 2}
    assert again.loaded == ["c"]  # only the missing key
    assert read_data_len(cache) == {"a": 3, "b": 7, "c": 2}


def test_compute_lengths_names_the_key_it_cannot_measure():
    with pytest.raises(DataError, match=r"\(key 'x'\): cannot measure the sample"):
        compute_lengths({"x": {"text": "hi"}})
    with pytest.raises(DataError, match=r"\(key 'y'\): key is missing from the source"):
        compute_lengths({}, ["y"])
    with pytest.raises(ValueError, match="without whitespace, got 'a b'"):
        compute_lengths({"a b": {"num_frames": 3}}, cache="unused")


def test_select_keys_modes():
    lengths = {k: i for i, k in enumerate("abcdefghij")}
    assert list(select_keys(lengths, "order", 3)) == ["a", "b", "c"]
    assert list(select_keys(lengths, "rev_order", 0.2)) == ["i", "j"]
    picked = select_keys(lengths, "random", 4, seed=5)
    assert len(picked) == 4 and picked == select_keys(lengths, "random", 4, seed=5)
    meta = {k: -i for i, k in enumerate("abcdefghij")}
    assert list(select_keys(lengths, "min", 2, meta=meta)) == ["i", "j"]
    assert list(select_keys(lengths, "middle", 2, meta=meta)) == ["e", "f"]
    with pytest.raises(ValueError, match="mode 'min' needs meta="):
        select_keys(lengths, "min", 2)
    with pytest.raises(DataError, match=r"meta \(key 'b'\): key has no value"):
        select_keys(lengths, "max", 2, meta={"a": 1})


# --------------------------------------------------------------------------- torch integration


def test_view_and_pipe_pickle_to_the_same_batches():
    view = BatchView(LENGTHS, batches_fn=functools.partial(_pairs, batch_size=4), seed=7,
                     batches_per_epoch=5, group_info={"g": {k: "x" for k in LENGTHS}})
    clone = pickle.loads(pickle.dumps(view))
    assert [clone.batches(e) for e in range(3)] == [view.batches(e) for e in range(3)]
    assert clone.group_info == view.group_info
    pipe = SequenceWrapper(CountingMap(LENGTHS)).batch_by_view(view, epoch=1)
    copy = pickle.loads(pickle.dumps(pipe))
    assert [[s["key"] for s in b] for b in copy] == view.batches(1)


def test_batch_by_view_is_registered_on_map_pipes_only_and_collates():
    assert "batch_by_view" in MapDataPipe.functions
    assert "batch_by_view" not in IterDataPipe.functions
    lengths = {"a": 5, "b": 3, "c": 9}
    view = BatchView(lengths, budget=10, shuffle=False)
    pipe = SequenceWrapper(CountingMap(lengths)).batch_by_view(view).collate(
        collate_fn=PadCollate())
    batches = list(pipe)
    assert [b["key"] for b in batches] == [["c"], ["a", "b"]]
    assert batches[1]["audio"].shape == (2, 5) and batches[1]["audio_len"].tolist() == [5, 3]


def test_missing_source_key_names_the_key():
    view = BatchView({"a": 1, "b": 2}, budget=SampleCount(2))
    with pytest.raises(DataError, match=r"\(key 'b'\): batch_by_view: key of the view not found"):
        list(ViewLoaderIterDataPipe({"a": {"num_frames": 1}}, view))


def test_dataloader_batch_sampler_with_two_workers():
    dataset = SequenceWrapper(CountingMap(LENGTHS), deepcopy=False)
    view = BatchView(LENGTHS, budget=300, seed=5)
    sampler = view.sampler(epoch=1, start_step=2)
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler, num_workers=2,
                                         collate_fn=PadCollate(), generator=sampler.generator())
    assert len(loader) == len(view) - 2
    got = [batch["key"] for batch in loader]
    assert got == view.batches(1, start_step=2)
    sampler.set_epoch(2)
    assert [batch["key"] for batch in loader] == view.batches(2)


def test_pipe_in_a_dataloader_with_two_workers_keeps_the_view_order():
    view = BatchView(LENGTHS, budget=300, seed=5)
    pipe = SequenceWrapper(CountingMap(LENGTHS), deepcopy=False).batch_by_view(view, epoch=4)
    loader = torch.utils.data.DataLoader(pipe, batch_size=None, num_workers=2)
    assert [[s["key"] for s in batch] for batch in loader] == view.batches(4)


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(budget=0), ValueError, "budget must be > 0, got 0"),
    (dict(budget="10"), TypeError, "budget must be seconds \\(a number\\) or a constraint"),
    (dict(budget=10, max_samples=2), TypeError, "max_samples"),
    (dict(batches_per_epoch=0), ValueError, "batches_per_epoch must be an int >= 1, got 0"),
    (dict(oversize="keep"), ValueError, "oversize must be one of .*got 'keep'"),
    (dict(world_size=0), ValueError, "world_size must be an int >= 1, got 0"),
    (dict(seed=1.5), TypeError, "seed must be an int, got 1.5"),
    (dict(shuffle="yes"), TypeError, "shuffle must be a bool, got 'yes'"),
    (dict(batches_fn=3), TypeError, "batches_fn must be callable, got 3"),
    (dict(group_info={"spk": 3}), TypeError, r"group_info\['spk'\] must be a path"),
])
def test_constructor_rejects_bad_arguments(kwargs, error, message):
    with pytest.raises(error, match=message):
        BatchView({"a": 1}, **kwargs)


@pytest.mark.parametrize("lengths, message", [
    ({"a": -1}, r"lengths\['a'\] must be a finite number >= 0.*got -1"),
    ({"a": float("nan")}, r"lengths\['a'\] .*got nan"),
    ({"a": "3"}, r"lengths\['a'\] .*got '3'"),
    ({"a": 1, "b": (1, 2)}, "all numbers or all tuples"),
])
def test_constructor_rejects_bad_lengths(lengths, message):
    with pytest.raises(ValueError, match=message):
        BatchView(lengths)


def test_constructor_rejects_a_path_for_lengths():
    with pytest.raises(TypeError, match="read it with read_data_len"):
        BatchView("data/utt2num_frames")


def test_pipe_rejects_bad_arguments():
    view = BatchView({"a": 1})
    with pytest.raises(TypeError, match="view must be a BatchView, got 3"):
        ViewLoaderIterDataPipe({}, 3)
    with pytest.raises(TypeError, match="source_datapipe must be a MapDataPipe or a mapping"):
        ViewLoaderIterDataPipe(5, view)
    with pytest.raises(ValueError, match="epoch must be an int >= 0, got -1"):
        ViewLoaderIterDataPipe({}, view, epoch=-1)
    with pytest.raises(ValueError, match=r"start_step must be <= 1 .*got 2"):
        ViewLoaderIterDataPipe({}, view, start_step=2)


def test_epoch_batches_of_an_empty_view_is_empty():
    assert epoch_batches([], 3, batches_per_epoch=4) == []
    view = BatchView({}, budget=10, batches_per_epoch=4)
    assert len(view) == 0 and view.batches(2) == []


def test_dataloader_tells_the_pipe_its_rank_and_refuses_a_second_sharding_pipe():
    from torch.utils.data.graph_settings import apply_sharding

    view = BatchView(LENGTHS, budget=300, world_size=2, seed=2)
    pipe = SequenceWrapper(CountingMap(LENGTHS), deepcopy=False).batch_by_view(view)
    apply_sharding(pipe, 2, 1)  # what a DataLoader on rank 1 of 2 does (num_workers=0)
    assert [[s["key"] for s in b] for b in pipe] == view.batches(0, rank=1)
    single = SequenceWrapper(CountingMap(LENGTHS)).batch_by_view(BatchView(LENGTHS))
    apply_sharding(single, 2, 0)
    with pytest.raises(ValueError, match="formed for world_size=1 but .* world size 2"):
        list(single)
    with pytest.raises(RuntimeError, match="Sharding twice"):
        apply_sharding(pipe.sharding_filter(), 2, 0)


def test_explicit_rank_with_dataloader_workers():
    view = BatchView(LENGTHS, budget=300, world_size=2, seed=2)
    pipe = SequenceWrapper(CountingMap(LENGTHS), deepcopy=False).batch_by_view(view, rank=1)
    loader = torch.utils.data.DataLoader(pipe, batch_size=None, num_workers=2)
    assert [[s["key"] for s in b] for b in loader] == view.batches(0, rank=1)


def test_compute_lengths_writes_plain_numbers(tmp_path):
    cache = tmp_path / "utt2len"
    compute_lengths({"a": {"n": 5}}, cache=cache, length=lambda s: np.int64(s["n"]))
    assert cache.read_text() == "a 5\n"
    with pytest.raises(DataError, match=r"\(key 'a'\): the measured length is not a number"):
        compute_lengths({"a": {"n": 5}}, length=lambda s: "five")


def test_read_data_len_refuses_underscored_numbers(tmp_path):
    path = _write(tmp_path / "utt2num_frames", "u1 1_000\n")
    with pytest.raises(DataError, match=r"utt2num_frames:1 \(key 'u1'\).*got '1_000'"):
        read_data_len(path)
