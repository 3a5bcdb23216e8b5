"""The plan of ``plan_batches`` pinned: digests of a plan's arrays for fixed inputs.

The other virtual-stream tests compare runs of the same code with each other (topologies,
resumes); these compare the plan with the digests recorded from the per-item planner that
``plan_batches`` had before it was vectorised (session 12, issue 28's planning time), so a
change of order, boundary or random draw cannot slip through. Each case goes through the
generic ``plan_stream_batches`` (items and lengths as iterables) or through the pipe's roads
(a hand-built shard index, mapped manifest rows), with shuffle buffers, buckets, oversize
samples, sample caps and each constraint.
"""

from __future__ import annotations

import hashlib
import os
import random

import numpy as np
import pytest

import speechpipe as sp
from speechpipe.index import ShardEntry, ShardIndex
from speechpipe.pipes.batching import (
    PaddedArea, Quadratic, SampleCount, StreamPlan, SumOfLengths, plan_stream_batches,
)
from speechpipe.pipes.batching import IndexLength
from speechpipe.pipes.sources import write_manifest


def digest(plan: StreamPlan) -> str:
    h = hashlib.sha256()
    for array, dtype in ((plan.offsets, "<i8"), (plan.items, "<i8"), (plan.owners, "<i4")):
        h.update(np.ascontiguousarray(array, dtype).tobytes())
    h.update(repr((plan.epoch, plan.streams, plan.stats.batches, plan.stats.samples,
                   plan.stats.oversize_emitted, plan.stats.oversize_dropped,
                   plan.stats.over_budget, plan.stats.sizes)).encode())
    return h.hexdigest()[:16]


def frame_streams(seed: int, streams: int = 4, per_stream: int = 700, unit: str = "frames"):
    rng = random.Random(seed)
    out, item = [], 0
    for _ in range(streams):
        mine = []
        for _ in range(per_stream + rng.randrange(50)):
            n = rng.randint(20, 200) if rng.random() > 0.01 else rng.randint(801, 1200)
            mine.append((item, IndexLength(float(n), unit, 16000)))
            item += 1
        out.append(mine)
    return out


def second_streams(seed: int, streams: int = 3, per_stream: int = 900):
    rng = random.Random(seed)
    out, item = [], 0
    for _ in range(streams):
        mine = []
        for _ in range(per_stream + rng.randrange(50)):
            mine.append((item, IndexLength(round(rng.uniform(0.5, 24.0), 2), "seconds")))
            item += 1
        out.append(mine)
    return out


CASES = {
    "area-buckets-buffer": (lambda: frame_streams(1), PaddedArea(800), dict(
        buffer_size=37, bucket_buffer=120, boundaries=[60, 100, 150], shuffle_window=7)),
    "area-drop-cap": (lambda: frame_streams(2), PaddedArea(800, max_samples=5), dict(
        buffer_size=1, bucket_buffer=64, boundaries=[100], shuffle_window=1,
        oversize="drop")),
    "area-one-bucket": (lambda: frame_streams(3, 5), PaddedArea(2000), dict(
        buffer_size=1000, bucket_buffer=2000, shuffle_window=100)),
    "quadratic": (lambda: frame_streams(4), Quadratic(3000, q=200.0), dict(
        buffer_size=13, bucket_buffer=50, boundaries=[80, 160], shuffle_window=9)),
    "sample-count": (lambda: frame_streams(5), SampleCount(6), dict(
        buffer_size=5, bucket_buffer=33, boundaries=[100], shuffle_window=4)),
    "sum-of-lengths": (lambda: frame_streams(6), SumOfLengths(900), dict(
        buffer_size=9, bucket_buffer=40, shuffle_window=5)),
    "seconds": (lambda: second_streams(7), sp.pipes.batching.batch_budget(30.0), dict(
        buffer_size=1, bucket_buffer=300, boundaries=[2.0, 4.0, 8.0], shuffle_window=50)),
    "seconds-of-samples": (lambda: frame_streams(8, 2, 300, unit="samples"),
                           PaddedArea(0.05, length="duration"), dict(
        buffer_size=3, bucket_buffer=20, boundaries=[0.006], shuffle_window=2)),
}

PINNED = {
    "area-buckets-buffer": "f7cb9a07ad32f851",
    "area-drop-cap": "b60f696de1551e6c",
    "area-one-bucket": "e7c6b7f1ff878bd0",
    "quadratic": "0096c9c0adb9efea",
    "sample-count": "888fb8edf0d0a743",
    "sum-of-lengths": "30ccd400f5a63fdf",
    "seconds": "021e0c20297b5cad",
    "seconds-of-samples": "7b6dd206b62aacf5",
    "shard-road-0": "f16b1ba2a74ae8dc",
    "shard-road-1": "06e093b4e82d0ed3",
    "row-road-0": "b486f387e79a6200",
    "row-road-3": "05b2dab5d985df73",
}


def check(name: str, plan: StreamPlan) -> None:
    found = digest(plan)
    if os.environ.get("SPEECHPIPE_PRINT_PINS"):
        print(f"    {name!r}: {found!r},")
        return
    assert found == PINNED[name], f"{name}: the plan changed ({found})"


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_generic_planner_plans_as_pinned(name):
    make, constraint, options = CASES[name]
    for epoch in (0, 1):
        plan = plan_stream_batches(make(), constraint, seed=11, epoch=epoch, **options)
        assert sorted(plan.items.tolist()) == sorted(
            i for s in make() for i, n in s
            if options.get("oversize") != "drop" or constraint.fits([constraint.measure(n)]))
        if epoch == 1:
            check(name, plan)


def hand_index(folder: str, shards: int = 40) -> list[str]:
    rng = random.Random(3)
    entries = []
    for i in range(shards):
        count = rng.randint(5, 90)
        lengths = tuple(float(rng.randint(20, 900)) for _ in range(count))
        entries.append(ShardEntry(f"data-{i:05d}.tar", count, 1000, tuple(
            f"s{i}_{j}" for j in range(count)), lengths))
    ShardIndex(folder, entries).write()
    return [os.path.join(folder, e.name) for e in entries]


def test_the_shard_road_plans_as_pinned(tmp_path):
    names = hand_index(str(tmp_path))
    pipe = sp.IterableWrapper(names).plan_batches(
        budget=PaddedArea(2400), index=ShardIndex.read(str(tmp_path)), streams=6, seed=5,
        buffer_size=40, bucket_buffer=90, boundaries=[200, 500], shuffle_window=6)
    for epoch in (0, 1):
        check(f"shard-road-{epoch}", pipe.plan(epoch))


def test_the_row_road_plans_as_pinned(tmp_path):
    path = str(tmp_path / "rows.jsonl")
    rng = random.Random(9)
    write_manifest(path, [{"key": f"r{i:05d}", "duration": round(rng.uniform(0.3, 26.0), 2)}
                          for i in range(5000)])
    pipe = sp.IterableWrapper([path]).read_manifest_files().plan_batches(
        budget=45.0, streams=5, seed=2, bucket_buffer=400, boundaries=[3.0, 6.0, 12.0],
        shuffle_window=30)
    for epoch in (0, 3):
        check(f"row-road-{epoch}", pipe.plan(epoch))


# --------------------------------------------------------------------------- the array road


def test_the_array_road_plans_what_the_per_item_road_plans():
    """Random streams, constraints and settings: the numpy planner (``plan_arrays``) gives
    the per-item planner's plan, array for array, and the same statistics (the same floats)."""
    from speechpipe.pipes.batching import _streams

    rng = random.Random(20)
    for trial in range(60):
        unit = rng.choice([None, "frames", "seconds", "samples"])
        streams = []
        for v in range(rng.randint(1, 5)):
            n = rng.choice([0, 1, 3, rng.randint(5, 400)])
            items = np.array(rng.sample(range(10_000), n), np.int64)
            values = np.array([rng.choice([float(rng.randint(0, 300)), rng.uniform(0, 40)])
                               for _ in range(n)])
            streams.append((items, values))
        budget = {None: 200.0, "frames": 600.0, "seconds": 60.0, "samples": 0.02}[unit]
        length = "duration" if unit in ("seconds", "samples") else None
        constraint = rng.choice([
            PaddedArea(budget, length=length),
            PaddedArea(budget, max_samples=rng.randint(1, 6), length=length),
            Quadratic(budget * 3, q=50.0, length=length),
            SampleCount(rng.randint(1, 9), length=length)])
        options = dict(seed=rng.randrange(100), epoch=rng.randrange(3),
                       buffer_size=rng.choice([1, 2, 7, 64, 5000]),
                       bucket_buffer=rng.choice([1, 2, 9, 100, 5000]),
                       boundaries=rng.choice([None, [20.0], [5.0, 50.0, 120.0]]),
                       shuffle_window=rng.choice([1, 2, 5, 100]),
                       oversize=rng.choice(["emit", "drop"]))
        fast = _streams.plan_arrays(streams, unit, 16000, constraint, **options)
        slow = _streams._plan_items([_streams._pairs(i, n, unit, 16000) for i, n in streams],
                                    constraint, **options)
        assert fast == slow, (trial, unit, constraint, options)
        assert fast.stats.to_dict() == slow.stats.to_dict(), (trial, constraint, options)


def test_the_roads_plan_on_arrays(tmp_path, monkeypatch):
    """Neither road plans item by item under a budget in seconds or frames (the per-item
    planner is not called)."""
    from speechpipe.pipes.batching import _streams

    def refused(*args, **kwargs):
        raise AssertionError("planned item by item")

    os.makedirs(tmp_path / "shards")
    names = hand_index(str(tmp_path / "shards"))
    path = str(tmp_path / "rows.jsonl")
    write_manifest(path, [{"key": f"r{i}", "duration": 1.0 + i % 7} for i in range(300)])
    monkeypatch.setattr(_streams, "_plan_items", refused)
    shards = sp.IterableWrapper(names).plan_batches(
        budget=PaddedArea(2400), index=ShardIndex.read(str(tmp_path / "shards")), streams=3,
        boundaries=[200, 500])
    rows = sp.IterableWrapper([path]).read_manifest_files().plan_batches(budget=30.0, streams=3)
    assert len(shards.plan(0).items) == sum(e.count for e in ShardIndex.read(
        str(tmp_path / "shards")).shards)
    assert len(rows.plan(0).items) == 300


def test_the_group_sort_is_the_exact_lexsort_where_its_key_cannot_tell():
    """Lengths closer than the 20-bit key resolves, equal ties, equal lengths and ties: the
    group sort still gives ``np.lexsort((ties, lengths, group))``."""
    from speechpipe.pipes.batching import _planning

    rng = np.random.default_rng(4)
    for lengths, ties in (
        (np.array([1.0, 1.0 + 1e-12, 1.0, 5e6, 1.0 + 2e-12, 0.0]), rng.random(6)),
        (np.array([3.0, 2.0, 3.0, 2.0, 3.0, 1.0]), np.array([0.5, 0.5, 0.5, 0.25, 0.5, 0.5])),
        (rng.integers(0, 5, 500).astype(float), rng.integers(0, 3, 500) / 4),
        (rng.random(500), rng.random(500)),
    ):
        sizes = np.array([2, len(lengths) - 3, 1])
        group = np.repeat(np.arange(3), sizes)
        assert _planning._group_sort(sizes, lengths, ties).tolist() == np.lexsort(
            (ties, lengths, group)).tolist()
