"""An epoch's plan computed once per node (issue 29): ``plan_batches(plan_cache=)``.

Plannings are counted in every process (``plan_arrays`` replaced by a wrapper that appends a
line to a file; forked processes and DataLoader workers inherit it): several processes that
start together, or a loader's main process and its 2 workers, plan an epoch once; a changed
seed, budget, number of streams or data plans again; a plan file cut short, with corrupted
bytes or another key is planned again (never read wrong); an unusable cache folder, a budget
and a file system without ``flock`` plan per process;
the batches, ``StepPlanner``'s counts and a resumed epoch are the same with and without the
cache.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import sys
import time
import warnings

import numpy as np
import pytest
import torch

import speechpipe as sp
from speechpipe import node_cache
from speechpipe.pipes.batching import PaddedArea
from speechpipe.pipes.batching import _plan_cache, _streams

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_virtual_streams import collate, keys_of, write_rows, write_shards  # noqa: E402


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("plan_cache")
    return {"shards": write_shards(str(folder / "shards")), "rows": write_rows(str(folder)),
            "folder": str(folder)}


@pytest.fixture
def counted(monkeypatch, tmp_path):
    """The file each planning (in any process forked from here) adds a line to."""
    counter = str(tmp_path / "plannings")
    real = _streams.plan_arrays

    def plan_arrays(*args, **kwargs):
        with open(counter, "a") as f:
            f.write(f"{os.getpid()}\n")
        return real(*args, **kwargs)

    monkeypatch.setattr(_streams, "plan_arrays", plan_arrays)

    def count() -> int:
        try:
            with open(counter) as f:
                return len(f.read().split())
        except FileNotFoundError:
            return 0

    return count


def planner(corpus, road, *, cache, seed=0, budget=None, streams=4, path=None):
    if road == "shards":
        return sp.IterableWrapper(corpus["shards"]).plan_batches(
            budget=PaddedArea(budget or 800), index=True, streams=streams, seed=seed,
            buffer_size=8, bucket_buffer=12, boundaries=[100], shuffle_window=3,
            plan_cache=cache)
    return sp.IterableWrapper([path or corpus["rows"]]).read_manifest_files().plan_batches(
        budget=budget or 20.0, streams=streams, seed=seed, bucket_buffer=30, shuffle_window=5,
        plan_cache=cache)


def digest(plan) -> str:
    h = hashlib.sha256()
    for array in (plan.offsets, plan.items, plan.owners):
        h.update(np.ascontiguousarray(array).tobytes())
    h.update(repr((plan.epoch, plan.streams, plan.stats)).encode())
    return h.hexdigest()


def _plan_in_child(corpus, road, cache, epoch, barrier, out):
    barrier.wait()
    out.put(digest(planner(corpus, road, cache=cache).plan(epoch)))


def plan_in_processes(corpus, road, cache, n=4, epoch=0) -> list[str]:
    """``n`` forked processes that start planning at once; each one's plan digest."""
    context = multiprocessing.get_context("fork")
    barrier, out = context.Barrier(n), context.Queue()
    children = [context.Process(target=_plan_in_child,
                                args=(corpus, road, cache, epoch, barrier, out))
                for _ in range(n)]
    for child in children:
        child.start()
    got = [out.get(timeout=60) for _ in children]
    for child in children:
        child.join(30)
        assert child.exitcode == 0
    return got


@pytest.mark.parametrize("road", ["rows", "shards"])
def test_processes_that_start_together_plan_an_epoch_once(corpus, counted, tmp_path, road):
    alone = digest(planner(corpus, road, cache=False).plan(0))
    assert counted() == 1
    got = plan_in_processes(corpus, road, str(tmp_path / "cache"))
    assert got == [alone] * 4
    assert counted() == 2  # one of the four planned; the others waited and mapped it
    assert plan_in_processes(corpus, road, str(tmp_path / "cache")) == [alone] * 4
    assert counted() == 2  # later processes map it
    assert plan_in_processes(corpus, road, False) == [alone] * 4
    assert counted() == 6  # without the cache each plans


def test_a_loader_with_two_workers_plans_each_epoch_once_and_yields_the_same_batches(
        corpus, counted, tmp_path):
    """Workers forked for each epoch inherit the main process's plan; persistent workers
    (and workers of other ranks, spawned workers) need it again in every later epoch."""
    def run(cache):
        loader = sp.build_loader(planner(corpus, "rows", cache=cache).collate(
            collate_fn=collate), seed=0, num_workers=2, persistent_workers=True)
        out = []
        for epoch in range(2):
            loader.set_epoch(epoch)
            steps = len(loader)
            batches = list(loader)
            assert len(batches) == steps
            out.append(batches)
        return out

    cached = run(str(tmp_path / "cache"))
    assert counted() == 2  # the main process planned each epoch; its workers mapped it
    own = run(False)
    assert counted() == 2 + 2 + 2  # main each epoch, each worker in epoch 1
    assert [[b["key"] for b in e] for e in cached] == [[b["key"] for b in e] for e in own]
    for a, b in zip(sum(cached, []), sum(own, [])):
        assert a["x"].dtype == b["x"].dtype and torch.equal(a["x"], b["x"])


@pytest.mark.parametrize("road", ["rows", "shards"])
def test_a_changed_seed_budget_streams_epoch_or_data_plans_again(corpus, counted, tmp_path,
                                                                 road):
    cache = str(tmp_path / "cache")
    first = planner(corpus, road, cache=cache).plan(0)
    assert counted() == 1
    assert planner(corpus, road, cache=cache).plan(0) == first and counted() == 1
    changes = [dict(seed=1), dict(budget=600 if road == "shards" else 15.0), dict(streams=3)]
    for change in changes:
        before = counted()
        plan = planner(corpus, road, cache=cache, **change).plan(0)
        assert counted() == before + 1, change  # planned again
        assert planner(corpus, road, cache=cache, **change).plan(0) == plan  # then mapped
        assert counted() == before + 1
        assert plan == planner(corpus, road, cache=False, **change).plan(0) != first
    before = counted()
    planner(corpus, road, cache=cache).plan(1)
    assert counted() == before + 1  # another epoch
    if road == "rows":  # one row's duration changed: other data
        path = os.path.join(str(tmp_path), "other.jsonl")
        with open(corpus["rows"]) as f:
            lines = f.readlines()
        assert '"duration": 1.0' in lines[0]
        lines[0] = lines[0].replace('"duration": 1.0', '"duration": 1.5')
        with open(path, "w") as f:
            f.writelines(lines)
        other = planner(corpus, road, cache=cache, path=path).plan(0)
        assert counted() == before + 2
        assert other == planner(corpus, road, cache=False, path=path).plan(0) != first


def _plan_file(cache: str, epoch: int = 0) -> str:
    names = [n for n in os.listdir(cache) if n.startswith("plan-") and n.endswith(
        f"-e{epoch}.spmap")]
    assert len(names) == 1, names
    return os.path.join(cache, names[0])


@pytest.mark.parametrize("damage", ["cut", "bytes", "key", "garbage"])
def test_a_cut_or_corrupt_plan_file_is_planned_again_never_read_wrong(corpus, counted,
                                                                      tmp_path, monkeypatch,
                                                                      damage):
    cache = str(tmp_path / "cache")
    first = planner(corpus, "rows", cache=False).plan(0)
    planner(corpus, "rows", cache=cache).plan(0)
    place = _plan_file(cache)
    header, arrays = node_cache.read_mapped(place)
    size = os.path.getsize(place)
    with open(place, "r+b") as f:
        if damage == "cut":
            f.truncate(size - 64)
        elif damage == "bytes":  # header and size intact, one item of the plan changed
            at = header["arrays"]["items"]["offset"] + 4 * 3
            f.seek(at)
            value = int.from_bytes(f.read(4), "little")
            f.seek(at)
            f.write((value ^ 1).to_bytes(4, "little"))
        elif damage == "key":
            text = f.read()
            f.seek(0)
            f.write(text.replace(b'"seed\\": 0', b'"seed\\": 7'))
        else:
            f.write(b"\0" * size)
    monkeypatch.setattr(node_cache, "_CHECKED", {})  # a new process: nothing checked yet
    again = planner(corpus, "rows", cache=cache).plan(0)
    assert counted() == 3
    assert again == first and again.stats == first.stats
    monkeypatch.setattr(node_cache, "_CHECKED", {})
    assert planner(corpus, "rows", cache=cache).plan(0) == first and counted() == 3  # mended


def test_a_key_mismatch_in_a_file_of_the_right_name_is_not_taken(corpus, counted, tmp_path):
    cache = str(tmp_path / "cache")
    planner(corpus, "rows", cache=cache).plan(0)
    place = _plan_file(cache)
    planner(corpus, "rows", cache=cache, seed=5).plan(0)
    other = [os.path.join(cache, n) for n in os.listdir(cache)
             if n.endswith(".spmap") and os.path.join(cache, n) != place]
    os.replace(other[0], place)  # seed 5's plan under seed 0's name
    plan = planner(corpus, "rows", cache=cache).plan(0)
    assert counted() == 3
    assert plan == planner(corpus, "rows", cache=False).plan(0)


def test_an_unusable_cache_folder_plans_in_each_process(corpus, counted, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.warns(RuntimeWarning, match="plans each epoch itself"):
        plan = planner(corpus, "rows", cache=str(blocker / "cache")).plan(0)
    assert plan == planner(corpus, "rows", cache=False).plan(0)
    assert counted() == 2


def test_a_budget_planned_item_by_item_is_cached_too(corpus, counted, tmp_path):
    def make(cache):
        return sp.IterableWrapper([corpus["rows"]]).read_manifest_files().plan_batches(
            budget=sp.SumOfLengths(20.0, length="duration"), streams=2, plan_cache=cache)

    cache = str(tmp_path / "cache")
    plans = [make(cache).plan(0) for _ in range(2)]
    assert counted() == 1
    assert plans[0] == plans[1] == make(False).plan(0)
    assert plans[1].stats == make(False).plan(0).stats


def test_two_epochs_per_key_are_kept_and_stale_plans_removed(corpus, counted, tmp_path):
    cache = str(tmp_path / "cache")
    pipe = planner(corpus, "rows", cache=cache)
    pipe.plan(0)
    stale = [os.path.join(cache, "plan-0123456789abcdef01234567-e3.spmap"),
             os.path.join(cache, "plan-0123456789abcdef01234567.lock")]
    for path in stale:
        with open(path, "wb") as f:
            f.write(b"x")
        old = time.time() - (_plan_cache.PLAN_DAYS + 1) * 86400
        os.utime(path, (old, old))
    for epoch in range(1, 5):
        pipe.plan(epoch)
    names = sorted(n for n in os.listdir(cache) if n.endswith(".spmap"))
    assert [n.rsplit("-", 1)[1] for n in names] == ["e3.spmap", "e4.spmap"]
    assert not any(os.path.exists(p) for p in stale)
    assert counted() == 5


def test_without_flock_each_process_plans_for_itself_and_none_waits(corpus, counted,
                                                                    tmp_path, monkeypatch):
    import errno
    import fcntl

    def no_flock(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    monkeypatch.setattr(node_cache, "_NO_FLOCK_WARNED", [])
    alone = digest(planner(corpus, "rows", cache=False).plan(0))
    cache = str(tmp_path / "cache")
    with pytest.warns(RuntimeWarning, match="no flock"):
        assert digest(planner(corpus, "rows", cache=cache).plan(0)) == alone
    assert counted() == 2
    os.remove(_plan_file(cache))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = plan_in_processes(corpus, "rows", cache)
    assert got == [alone] * 4
    assert 3 <= counted() <= 6  # each that found no file planned; none hung
    assert digest(planner(corpus, "rows", cache=cache).plan(0)) == alone  # a whole file


@pytest.mark.parametrize("road", ["rows", "shards"])
def test_step_planner_and_a_resumed_epoch_are_the_same_with_the_cache(corpus, counted,
                                                                      tmp_path, road):
    cache = str(tmp_path / "cache")

    def make(value):
        return planner(corpus, road, cache=value).collate(collate_fn=collate)

    for world in (1, 2, 4):
        assert sp.StepPlanner(make(cache), world_size=world).plan(1).rank_batches == \
            sp.StepPlanner(make(False), world_size=world).plan(1).rank_batches
    saved = sp.build_loader(make(cache), seed=0)
    taken = iter(saved)
    for _ in range(3):
        next(taken)
    state = saved.state_dict()
    rest = {}
    for value in (cache, False):
        resumed = sp.build_loader(make(value), seed=0, num_workers=2)
        resumed.load_state_dict(state)
        rest[value] = keys_of(resumed)
    assert rest[cache] == rest[False] and rest[cache]


def test_the_recipes_planned_road_keys_its_plans_by_the_speed_factors_too(corpus, counted,
                                                                          tmp_path):
    from speechpipe.recipes._planned import RowPlanner

    def make(cache, factors):
        rows = sp.IterableWrapper([corpus["rows"]]).read_manifest_files()
        return RowPlanner(rows, 20.0, speed_factors=factors, streams=2, plan_cache=cache)

    cache = str(tmp_path / "cache")
    slowed = [make(cache, (0.9, 1.0, 1.1)).plan(0) for _ in range(2)]
    assert counted() == 1
    assert slowed[1] == make(False, (0.9, 1.0, 1.1)).plan(0)
    other = make(cache, (0.8, 1.2)).plan(0)
    assert counted() == 3
    assert other == make(False, (0.8, 1.2)).plan(0) != slowed[0]
    assert make(cache, None).plan(0) == make(False, None).plan(0) != slowed[0]
