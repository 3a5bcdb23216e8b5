"""The default number of virtual streams, derived from the data (issue 29).

``plan_batches(streams="auto")`` (the default) and ``BatchView(streams="auto")`` plan over
the most streams, up to 8, that each hold a bucket buffer's worth of items (over shards at
most one per shard): a small corpus is not cut into starved streams, a large one keeps 8, the
plan stays the same for any topology, and a state records the ``V`` used.
"""

from __future__ import annotations

import os
import random

import pytest

import speechpipe as sp
from speechpipe.index import ShardEntry, ShardIndex
from speechpipe.pipes.batching import PaddedArea
from speechpipe.pipes.sources import write_manifest
from speechpipe.testing import sample_durations


def manifest(folder, rows: int, *, name: str = "m.jsonl", corpus: str = "aishell-1-train",
             seed: int = 0) -> str:
    """``rows`` rows with durations of ``corpus``'s distribution."""
    path = os.path.join(str(folder), name)
    durations = sample_durations(corpus, rows, seed, usable_only=True)
    write_manifest(path, [{"key": f"r{i:06d}", "duration": round(float(d), 2)}
                          for i, d in enumerate(durations)])
    return path


def rows_pipe(path: str, **options):
    return sp.IterableWrapper([path]).read_manifest_files().plan_batches(200.0, seed=0,
                                                                         **options)


def index(folder, shards: int, per_shard: int) -> tuple[list[str], ShardIndex]:
    """An index (in memory, nothing packed: planning reads only the index)."""
    rng = random.Random(shards * 1000 + per_shard)
    entries = [ShardEntry(f"d-{s:04d}.tar", per_shard, 0,
                          tuple(f"s{s}_{m}" for m in range(per_shard)),
                          tuple(round(rng.uniform(1.0, 15.0), 2) for _ in range(per_shard)))
               for s in range(shards)]
    built = ShardIndex(str(folder), entries, length_unit="seconds")
    return [os.path.join(str(folder), e.name) for e in entries], built


def shard_pipe(names, built, **options):
    return sp.IterableWrapper(names).plan_batches(200.0, index=built, seed=0, **options)


def per_stream(buffer: int) -> int:
    """Items each derived stream holds at least: STREAM_BUCKETS bucket buffers."""
    from speechpipe.pipes.batching._stream_count import STREAM_BUCKETS

    return STREAM_BUCKETS * buffer


@pytest.mark.parametrize("buffer", [2000, 500, 3])
def test_the_rule_at_its_boundaries(buffer):
    """floor(items / (STREAM_BUCKETS x bucket_buffer)) streams, at least 1, at most 8 and,
    over shards, the shards."""
    from speechpipe.pipes.batching._stream_count import derived_streams

    p = per_stream(buffer)
    for items, shards, v in ((0, None, 1), (1, None, 1), (p - 1, None, 1), (p, None, 1),
                             (2 * p - 1, None, 1), (2 * p, None, 2), (3 * p, None, 3),
                             (8 * p - 1, None, 7), (8 * p, None, 8), (100 * p, None, 8),
                             (100 * p, 3, 3), (100 * p, 1, 1), (5 * p, 40, 5), (5 * p, 0, 1)):
        assert derived_streams(items, buffer, shards) == v, (items, buffer, shards)


def test_the_rule_scales_with_the_bucket_buffer():
    from speechpipe.pipes.batching._stream_count import derived_streams

    assert derived_streams(600, 2000) == derived_streams(3000, 2000) == 1  # small corpora
    assert derived_streams(8 * per_stream(500), 500) == 8
    assert derived_streams(8 * per_stream(500), 2000) == 2  # 4 x the buffer: 4 x the items
    assert derived_streams(10**7, 2000) == 8


def test_a_view_derives_its_streams_from_its_keys():
    from speechpipe.pipes.batching._stream_count import VIEW_STREAM_ITEMS, view_streams

    k = VIEW_STREAM_ITEMS
    assert [view_streams("auto", n) for n in (0, 600, 2 * k - 1, 2 * k, 8 * k, 10**8)] == [
        1, 1, 1, 2, 8, 8]
    assert view_streams(3, 10) == 3
    for bad in ("eight", "Auto", 0, 1.5):
        with pytest.raises((TypeError, ValueError)):
            view_streams(bad, 10)


@pytest.mark.filterwarnings("ignore:filter_by_duration skipped")
def test_the_manifest_road_derives_v_at_the_boundaries(tmp_path):
    """Through the pipe: the kept rows and the pipe's own bucket buffer decide."""
    p = per_stream(2)
    for rows, buffer, v in ((2 * p - 1, 2, 1), (2 * p, 2, 2), (8 * p - 1, 2, 7), (8 * p, 2, 8),
                            (8 * p, 8, 2), (8 * p, 2000, 1)):
        path = manifest(tmp_path, rows, name=f"m{rows}.jsonl")
        assert rows_pipe(path, bucket_buffer=buffer).num_streams == v, (rows, buffer)
        assert rows_pipe(path, bucket_buffer=buffer, streams=None).num_streams == v
        assert rows_pipe(path, bucket_buffer=buffer, streams=3).num_streams == 3
    kept = sp.IterableWrapper([path]).read_manifest_files().filter_by_duration(1.0, 4.0)
    expected = min(8, sum(1 for _ in kept) // p)
    assert 1 < expected < 8  # the rows the filter keeps, not the manifest's
    assert kept.plan_batches(200.0, bucket_buffer=2).num_streams == expected


def test_the_shard_road_derives_v_from_members_buffer_and_shards(tmp_path):
    p = per_stream(1)
    for shards, members, buffer, v in ((12, 6 * p, 1, 6), (12, 6 * p, 3, 2),
                                       (12, 6 * p, 200, 1), (3, 30 * p, 1, 3),
                                       (20, 20 * p, 1, 8), (1, 3 * p, 1, 1)):
        names, built = index(tmp_path, shards, members // shards)
        assert shard_pipe(names, built, bucket_buffer=buffer).num_streams == v, (
            shards, members, buffer)


def test_a_small_manifest_plans_as_one_stream_and_pads_as_one(tmp_path):
    """600 rows (the recipes' bucket buffer of 2,000): one stream, not 8 starved ones --
    the plan of streams=1, 5 points of padding efficiency above streams=8's."""
    path = manifest(tmp_path, 600)
    default = rows_pipe(path)
    one, eight = rows_pipe(path, streams=1), rows_pipe(path, streams=8)
    assert default.num_streams == 1
    for epoch in (0, 1):
        assert default.plan(epoch) == one.plan(epoch) != eight.plan(epoch)
    efficiency = default.plan(0).stats.efficiency
    assert efficiency == one.plan(0).stats.efficiency
    assert efficiency > eight.plan(0).stats.efficiency + 0.05


def test_a_small_shard_index_plans_as_one_stream(tmp_path):
    """600 members in 6 shards: one stream (the old default: one per shard, 6)."""
    names, built = index(tmp_path, 6, 100)
    default = shard_pipe(names, built)
    assert default.num_streams == 1
    assert default.plan(0) == shard_pipe(names, built, streams=1).plan(0)
    assert default.plan(0) != shard_pipe(names, built, streams=6).plan(0)


def test_a_large_corpus_still_gets_eight_streams(tmp_path):
    """At the default bucket buffer (2,000): 8 streams from 8 x STREAM_BUCKETS buffers on, the
    plan of streams=8 (an index in memory: planning reads only the index)."""
    members = 8 * per_stream(2000)
    names, built = index(tmp_path, 40, members // 40)
    default = shard_pipe(names, built)
    assert default.num_streams == 8
    assert default.plan(0) == shard_pipe(names, built, streams=8).plan(0)
    names, built = index(tmp_path, 40, members // 40 - 1)
    assert shard_pipe(names, built).num_streams == 7
    path = manifest(tmp_path, 8 * per_stream(10))
    assert rows_pipe(path, bucket_buffer=10).num_streams == 8
    assert rows_pipe(path, bucket_buffer=10).plan(0) == rows_pipe(
        path, bucket_buffer=10, streams=8).plan(0)


def test_a_bad_spelling_of_streams_is_refused(tmp_path):
    path = manifest(tmp_path, 10)
    for bad in ("eight", "AUTO", 0, -1, True):
        with pytest.raises((TypeError, ValueError), match="streams"):
            rows_pipe(path, streams=bad)
    with pytest.raises(ValueError, match="streams"):
        sp.BatchView({"a": 1.0}, budget=5.0, streams="several")


# --------------------------------------------------------------------------- states


def collate(batch: list) -> dict:
    return {"key": [s["key"] for s in batch]}


def keys_of(loader) -> list:
    return [list(b["key"]) for b in loader]


def saved_at_step_1(path: str, **options) -> tuple[dict, list]:
    """The state after step 1 of a loader over ``path`` (bucket buffer 2), and the keys of
    the unbroken epoch."""
    def make():
        return rows_pipe(path, bucket_buffer=2, **options).collate(collate_fn=collate)

    unbroken = keys_of(sp.build_loader(make(), seed=0))
    loader = sp.build_loader(make(), seed=0)
    for step, _ in enumerate(loader):
        if step == 1:
            return loader.state_dict(), unbroken


def test_a_state_refuses_a_pipeline_that_derives_another_v_by_name(tmp_path):
    """The fingerprint holds the V used: the same manifest path with fewer rows (another
    derived V; nothing else it records differs) is refused, naming num_streams."""
    path = manifest(tmp_path, 4 * per_stream(2))  # 4 streams of buckets of 2
    state, _ = saved_at_step_1(path)
    manifest(tmp_path, 2 * per_stream(2))  # the same path, half the rows: 2 streams
    again = rows_pipe(path, bucket_buffer=2).collate(collate_fn=collate)
    with pytest.raises(sp.ResumeError, match=r"num_streams: 4 -> 2"):
        sp.build_loader(again, seed=0).load_state_dict(state)


def test_a_state_saved_with_the_derived_v_resumes_with_that_v_given(tmp_path):
    """What a state records is the V used, not its spelling: streams=4 given resumes a state
    whose 4 streams were derived (and back), with the unbroken run's rest of the epoch."""
    path = manifest(tmp_path, 4 * per_stream(2))
    state, unbroken = saved_at_step_1(path)
    given = sp.build_loader(rows_pipe(path, bucket_buffer=2, streams=4).collate(
        collate_fn=collate), seed=0)
    given.load_state_dict(state)
    assert keys_of(given) == unbroken[2:]
    state, _ = saved_at_step_1(path, streams=4)
    derived = sp.build_loader(rows_pipe(path, bucket_buffer=2).collate(collate_fn=collate),
                              seed=0)
    derived.load_state_dict(state)
    assert keys_of(derived) == unbroken[2:]


def test_a_view_with_derived_streams_plans_as_the_v_it_derived():
    from speechpipe.pipes.batching._stream_count import VIEW_STREAM_ITEMS

    rng = random.Random(4)
    small = {f"k{i}": rng.uniform(1.0, 15.0) for i in range(600)}
    auto = sp.BatchView(small, budget=200.0, streams="auto")
    assert auto.streams == 1
    assert auto.batches(0) == sp.BatchView(small, budget=200.0, streams=1).batches(0)
    assert auto.batches(0) != sp.BatchView(small, budget=200.0, streams=8).batches(0)
    large = {f"k{i}": rng.uniform(1.0, 15.0) for i in range(2 * VIEW_STREAM_ITEMS)}
    assert sp.BatchView(large, budget=200.0, streams="auto").streams == 2
    assert sp.BatchView(small, budget=200.0).streams is None  # no streams unless asked
    with pytest.raises(TypeError):
        sp.BatchView(small, budget=PaddedArea(200.0)).plan(0)
