"""Virtual streams (issue 29): batches planned on metadata, the same for any topology.

In one process (the quick lane): the plan's global sequence and the positions each (rank,
worker) produces; the DataLoader's round robin over workers and ranks stepping together give
back the one sequence for every world size and number of workers; both roads (a shard index,
mapped manifest rows) yield every sample once per epoch, through ``build_loader`` too; a
state saved by the loader is one global position, resumes under another number of workers,
and refuses another V, budget, seed or shard list by name. Real process groups and workers:
``tests/batching/test_virtual_streams_ddp.py``.
"""

from __future__ import annotations

import os
import random

import pytest
import torch

import speechpipe as sp
from speechpipe.index import ShardEntry, ShardIndex
from speechpipe.pipes.batching import PaddedArea, StreamPlan, plan_stream_batches
from speechpipe.pipes.shards import ShardWriter
from speechpipe.pipes.sources import write_manifest


def write_shards(folder: str, shards: int = 12, per_shard: int = 10) -> list[str]:
    """Tar shards of ``{key, dat: n bytes}`` with an index counting n (frames)."""
    os.makedirs(folder, exist_ok=True)
    entries = []
    for i in range(shards):
        rng = random.Random(i)
        keys = [f"s{i}_{j}" for j in range(per_shard)]
        lengths = [rng.randint(20, 200) for _ in keys]
        path = os.path.join(folder, f"data-{i:05d}.tar")
        with ShardWriter(path) as writer:
            for key, n in zip(keys, lengths):
                writer.write({"key": key, "dat": bytes([i]) * n})
        entries.append(ShardEntry(os.path.basename(path), per_shard, os.path.getsize(path),
                                  tuple(keys), tuple(float(n) for n in lengths)))
    ShardIndex(folder, entries).write()
    return [os.path.join(folder, e.name) for e in entries]


def write_rows(folder: str, rows: int = 150) -> str:
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "train.jsonl")
    write_manifest(path, [{"key": f"r{i:04d}", "duration": 1.0 + (i * 7) % 13 / 2}
                          for i in range(rows)])
    return path


def collate(batch: list) -> dict:
    """Keys and a padded tensor of the samples' bytes (shards) or durations (rows)."""
    if "dat" in batch[0]:
        n = max(len(s["dat"]) for s in batch)
        x = torch.zeros(len(batch), n, dtype=torch.uint8)
        for i, s in enumerate(batch):
            x[i, :len(s["dat"])] = torch.frombuffer(bytearray(s["dat"]), dtype=torch.uint8)
    else:
        x = torch.tensor([s["duration"] for s in batch], dtype=torch.float64)
    return {"key": [s["key"] for s in batch], "x": x}


def shard_pipe(paths, *, streams=4, budget=800, seed=0):
    return sp.IterableWrapper(paths).plan_batches(
        budget=PaddedArea(budget), index=True, streams=streams, seed=seed, buffer_size=8,
        bucket_buffer=12, boundaries=[100], shuffle_window=3).collate(collate_fn=collate)


def row_pipe(path, *, streams=4, budget=20.0, seed=0):
    return sp.IterableWrapper([path]).read_manifest_files().plan_batches(
        budget=budget, streams=streams, seed=seed, bucket_buffer=30,
        shuffle_window=5).collate(collate_fn=collate)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("virtual")
    return {"shards": write_shards(str(folder / "shards")), "rows": write_rows(str(folder))}


def as_delivered(plan: StreamPlan, world: int, workers: int, *, start: int = 0,
                 uneven: str = "pad") -> list[list[int]]:
    """What each rank's training loop receives, step by step: its workers' positions handed
    back by the DataLoader's round robin (worker ``s % K`` at step ``s``)."""
    out = []
    for rank in range(world):
        mine = [iter(plan.positions(rank, world, k, workers, start=start, uneven=uneven))
                for k in range(workers)]
        steps = plan.steps(world, start=start, uneven=uneven)
        out.append([next(mine[s % workers]) for s in range(steps)])
    return out


# --------------------------------------------------------------------------- the plan


def test_every_topology_trains_on_one_global_sequence():
    """With W ranks, step s trains on batches sW..sW+W-1, whatever the number of workers; the
    last step repeats the first batches (pad) or is left out (drop)."""
    items = [[(v * 100 + i, float(1 + (i * 5) % 9)) for i in range(23 + v)] for v in range(3)]
    plan = plan_stream_batches(items, PaddedArea(12.0), seed=3, epoch=0, bucket_buffer=6,
                               boundaries=[4.0], shuffle_window=2)
    n = len(plan)
    assert sorted(i for b in plan.batches for i in b) == sorted(i for s in items for i, _ in s)
    for world in (1, 2, 4):
        for workers in (1, 2, 4):
            got = as_delivered(plan, world, workers)
            steps = -(-n // world)
            assert got == [[s * world + r for s in range(steps)] for r in range(world)]
            dropped = as_delivered(plan, world, workers, uneven="drop")
            assert dropped == [[s * world + r for s in range(n // world)] for r in range(world)]
            resumed = as_delivered(plan, world, workers, start=5)
            assert sorted(p for rank in resumed for p in rank if p < n) == list(range(5, n))


def test_streams_are_interleaved_round_robin_and_seeded_per_stream():
    items = [[(0, 1.0), (1, 1.0)], [(2, 1.0)], [(3, 1.0), (4, 1.0), (5, 1.0)]]
    plan = plan_stream_batches(items, PaddedArea(1.0), seed=0, epoch=0, shuffle_window=1)
    assert plan.stream_of == (0, 1, 2, 0, 2, 2)
    assert plan == plan_stream_batches(items, PaddedArea(1.0), seed=0, epoch=0, shuffle_window=1)
    other = plan_stream_batches(items, PaddedArea(3.0), seed=0, epoch=1, shuffle_window=4,
                                bucket_buffer=3)
    assert sorted(i for b in other.batches for i in b) == list(range(6))


@pytest.mark.parametrize("road", ["shards", "rows"])
def test_each_road_yields_every_sample_once_per_epoch(corpus, road):
    pipe = shard_pipe(corpus["shards"]) if road == "shards" else row_pipe(corpus["rows"])
    total = 120 if road == "shards" else 150
    for epoch in (0, 1):
        sp.set_epoch(pipe, epoch)
        keys = [k for batch in pipe for k in batch["key"]]
        assert len(keys) == len(set(keys)) == total
    planner = pipe.datapipe
    assert len(planner.plan(1)) == len(pipe) and planner.plan(0) != planner.plan(1)
    assert planner.plan(0).stats.efficiency > 0.8


def test_the_shard_road_measures_the_index_unit_and_needs_an_index(corpus):
    with pytest.raises(ValueError, match="index=True"):
        list(sp.IterableWrapper(corpus["shards"]).plan_batches(budget=PaddedArea(800)))
    index = ShardIndex.read(os.path.dirname(corpus["shards"][0]))
    seconds = ShardIndex(index.root, index.shards, length_unit="seconds")
    with pytest.raises(sp.LengthUnitError):  # frames asked of an index in seconds
        list(sp.IterableWrapper(corpus["shards"]).plan_batches(budget=PaddedArea(800),
                                                               index=seconds))


def test_a_manifest_row_without_a_duration_is_named(tmp_path):
    path = str(tmp_path / "m.jsonl")
    write_manifest(path, [{"key": "a", "duration": 1.0}, {"key": "b"}])
    with pytest.raises(sp.DataError, match="without a duration") as info:
        list(sp.IterableWrapper([path]).read_manifest_files().plan_batches(budget=5.0))
    assert info.value.key == "b"


# --------------------------------------------------------------------------- the loader


def keys_of(loader) -> list[list[str]]:
    return [list(batch["key"]) for batch in loader]


@pytest.mark.parametrize("road", ["shards", "rows"])
def test_a_state_is_one_global_position_and_resumes_the_rest_of_the_epoch(corpus, road):
    make = (lambda: shard_pipe(corpus["shards"])) if road == "shards" else (
        lambda: row_pipe(corpus["rows"]))
    unbroken = keys_of(sp.build_loader(make(), seed=0))
    loader = sp.build_loader(make(), seed=0)
    for step, _ in enumerate(loader):
        if step == 6:
            state = loader.state_dict()
            break
    assert state["batches"] == 7 and state["dataloader"] is None
    assert "num_workers" not in state["fingerprint"]["loader"]
    resumed = sp.build_loader(make(), seed=0)
    resumed.load_state_dict(state)
    assert resumed.state_dict()["batches"] == 7  # loaded, not yet iterated
    assert keys_of(resumed) == unbroken[7:]
    assert resumed.state_dict() == {**state, "epoch": 1, "batches": 0}
    assert keys_of(resumed) == keys_of(sp.build_loader(make(), seed=0).set_epoch(1))
    moved = sp.build_loader(make(), seed=0)
    moved.load_state_dict(state)
    moved.set_epoch(0)  # the loop's own set_epoch, the state's epoch: the position stays
    assert keys_of(moved) == unbroken[7:]
    moved.load_state_dict(state)
    moved.set_epoch(1)  # another epoch: from its start
    assert keys_of(moved) == keys_of(sp.build_loader(make(), seed=0).set_epoch(1))


@pytest.mark.parametrize("change, field", [
    (dict(streams=3), "streams"), (dict(budget=600), "budget"), (dict(seed=1), "seed"),
    ("shards", "iterable"), ("stages", "stages")])
def test_a_state_refuses_another_plan_by_name(corpus, change, field):
    loader = sp.build_loader(shard_pipe(corpus["shards"]), seed=0)
    next(iter(loader))
    state = loader.state_dict()
    if change == "shards":
        other = shard_pipe(corpus["shards"][:-1])
    elif change == "stages":
        other = shard_pipe(corpus["shards"]).map(lambda b: b)
    else:
        other = shard_pipe(corpus["shards"], **change)
    with pytest.raises(sp.ResumeError, match=field):
        sp.build_loader(other, seed=0).load_state_dict(state)


def frames(sample: dict) -> dict:
    return {**sample, "num_frames": len(sample["dat"])}


def test_a_topology_bound_state_is_refused_by_a_planned_loader_and_back(corpus):
    bound = sp.IterableWrapper(corpus["shards"]).sharded_shuffle(
        buffer_size=4, index=True).map(frames).block_batch(budget=PaddedArea(800)).collate(
            collate_fn=collate)
    loader = sp.build_loader(bound, seed=0)
    next(iter(loader))
    with pytest.raises(sp.ResumeError, match="num_workers"):
        sp.build_loader(shard_pipe(corpus["shards"]), seed=0).load_state_dict(
            loader.state_dict())
    planned = sp.build_loader(shard_pipe(corpus["shards"]), seed=0)
    next(iter(planned))
    with pytest.raises(sp.ResumeError, match="positions"):
        sp.build_loader(bound, seed=0).load_state_dict(planned.state_dict())


def test_a_changed_budget_allowed_on_purpose_starts_the_next_epoch(corpus):
    loader = sp.build_loader(shard_pipe(corpus["shards"]), seed=0)
    next(iter(loader))
    state = loader.state_dict()
    other = sp.build_loader(shard_pipe(corpus["shards"], budget=600), seed=0)
    with pytest.warns(sp.ResumeWarning, match="epoch 1"):
        other.load_state_dict(state, allow_changes=("budget",))
    assert other.epoch == 1 and other.state_dict()["batches"] == 0


def test_an_impossible_global_position_is_refused_by_name(corpus):
    loader = sp.build_loader(shard_pipe(corpus["shards"]), seed=0)
    next(iter(loader))
    state = loader.state_dict()
    for bad in (-1, "3", None):
        with pytest.raises(sp.ResumeError, match="global batch position"):
            sp.build_loader(shard_pipe(corpus["shards"]), seed=0).load_state_dict(
                {**state, "batches": bad})


def test_the_plan_holds_a_few_bytes_per_utterance(tmp_path):
    """Issue 28's rule: no Python object per utterance. The manifest road's plan (and what
    the pipe keeps to plan the next epoch) stays under 8 bytes per row; tuples of ints per
    batch held about 40, a list of durations 32 more."""
    import gc
    import tracemalloc

    rows = 20_000
    path = str(tmp_path / "big.jsonl")
    write_manifest(path, [{"key": f"r{i}", "duration": 0.5 + (i * 7919) % 1000 / 100}
                          for i in range(rows)])
    pipe = sp.IterableWrapper([path]).read_manifest_files().plan_batches(
        budget=60.0, streams=4, seed=0, boundaries=[2.0, 5.0])
    pipe.road()  # the manifest's mapped table, which the plan reads (a file-backed map)
    row_pipe(write_rows(str(tmp_path / "warm"), rows=20)).datapipe.plan(0)  # imports done
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        plan = pipe.plan(0)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert sum(len(b) for b in plan.batches) == rows
    assert plan.nbytes < 6 * rows
    assert held < 8 * rows, f"{held / rows:.1f} bytes per row held"


@pytest.mark.parametrize("road", ["shards", "rows"])
def test_a_position_past_the_end_of_the_epoch_is_refused_by_name(corpus, road):
    """A state whose global position is past the epoch's batches (edited, or of other data the
    fingerprint did not tell apart) is a DataError, not an empty rest of the epoch; the last
    batch's state (a padded last step repeats the first batches) stands at the epoch's end."""
    make = (lambda: shard_pipe(corpus["shards"])) if road == "shards" else (
        lambda: row_pipe(corpus["rows"]))
    total = len(make().datapipe.plan(0))
    loader = sp.build_loader(make(), seed=0)
    next(iter(loader))
    state = loader.state_dict()
    for bad in (total + 1, total + 7, 10**9):
        with pytest.raises(sp.DataError, match=f"position {bad} is past the end of epoch 0, "
                                               f"which has {total} global batches"):
            sp.build_loader(make(), seed=0).load_state_dict({**state, "batches": bad})
    at_end = sp.build_loader(make(), seed=0)
    at_end.load_state_dict({**state, "batches": total})
    assert keys_of(at_end) == []  # the epoch is over; the next pass is epoch 1
    pipe = make()
    pipe.datapipe.set_epoch(0, start=total + 1)  # by hand, without a loader
    with pytest.raises(sp.DataError, match="past the end of epoch 0"):
        list(pipe)


@pytest.mark.parametrize("road", ["shards", "rows"])
def test_the_state_at_a_padded_last_step_stands_at_the_end_of_the_epoch(corpus, road,
                                                                        monkeypatch):
    """Rank 0 of W after the last step of an epoch whose batches do not fill the ranks: that
    step repeated first batches, and the state says the epoch's end (not past it), which
    resumes on the empty rest of the epoch."""
    make = (lambda: shard_pipe(corpus["shards"])) if road == "shards" else (
        lambda: row_pipe(corpus["rows"]))
    total = len(make().datapipe.plan(0))
    world = next(w for w in range(2, 9) if total % w)
    monkeypatch.setattr("speechpipe.seeding._pinned", (0, world))  # rank 0 of `world`
    loader = sp.build_loader(make(), seed=0)
    batches = iter(loader)
    for _ in range(-(-total // world)):
        next(batches)
    state = loader.state_dict()
    assert state["batches"] == total and state["epoch"] == 0
    resumed = sp.build_loader(make(), seed=0)
    resumed.load_state_dict(state)
    assert keys_of(resumed) == [] and resumed.epoch == 1


# --------------------------------------------------------------------------- equal steps


@pytest.mark.parametrize("road", ["shards", "rows"])
def test_step_planner_and_equal_steps_count_over_streams(corpus, road):
    """StepPlanner takes a plan_batches pipeline (or a loader over one) and counts its steps
    exactly from the plan; EqualSteps(policy="plan") finds it by itself, and len() of the
    loader is the steps of the pass, a resumed one's too. (Ranks: the gloo test.)"""
    make = (lambda: shard_pipe(corpus["shards"])) if road == "shards" else (
        lambda: row_pipe(corpus["rows"]))
    pipe = make()
    planner = sp.StepPlanner(pipe)
    total = len(pipe.datapipe.plan(0))
    assert planner.exact and planner.steps(0) == total == len(list(pipe))
    assert sp.StepPlanner(pipe, world_size=4).plan(1).rank_batches == (
        (-(-len(pipe.datapipe.plan(1)) // 4),) * 4)
    with pytest.raises(TypeError, match="batches itself"):
        sp.StepPlanner(pipe, 3)
    for workers in (0, 2):
        loader = sp.build_loader(make(), seed=0, num_workers=workers, uneven="plan")
        assert isinstance(loader.uneven.steps, sp.StepPlanner)
        assert len(loader) == total == len(list(loader))
        assert loader.uneven.stats.steps == total and loader.uneven.stats.dropped_batches == 0
        assert len(loader) == len(pipe.datapipe.plan(1)) == len(list(loader))
    state = {**sp.build_loader(make(), seed=0).state_dict(), "batches": 5}
    resumed = sp.build_loader(make(), seed=0, uneven="plan")
    resumed.load_state_dict(state)
    assert len(resumed) == total - 5 == len(list(resumed))
    wrapped = sp.EqualSteps(sp.build_loader(make(), seed=0), "plan")  # found in the loader
    assert len(wrapped) == total == len(list(wrapped))


# --------------------------------------------------------------------------- BatchView


VIEW_LENGTHS = {f"v{i:03d}": 1.0 + (i * 7) % 13 / 2 for i in range(150)}
VIEW_DATA = {k: {"key": k, "duration": v} for k, v in VIEW_LENGTHS.items()}


def view_pipe(*, streams=4, budget=20.0, seed=0, uneven="pad"):
    view = sp.BatchView(VIEW_LENGTHS, budget=budget, streams=streams, seed=seed, uneven=uneven)
    return sp.SequenceWrapper(VIEW_DATA).batch_by_view(view).collate(collate_fn=collate)


def rank_runs(monkeypatch, world: int, workers: int, state=None, epochs: int = 1) -> list:
    """Each rank's batches (keys) of ``world`` ranks, one after the other in this process
    (the rank pinned as a worker process pins it)."""
    out = []
    for rank in range(world):
        monkeypatch.setattr("speechpipe.seeding._pinned", (rank, world))
        loader = sp.build_loader(view_pipe(), seed=0, num_workers=workers)
        if state is not None:
            loader.load_state_dict(state)
        out.append([keys_of(loader) for _ in range(epochs)])
    monkeypatch.setattr("speechpipe.seeding._pinned", None)
    return out


def test_a_view_over_streams_is_one_global_sequence_for_any_topology(monkeypatch):
    """BatchView(streams=V) through batch_by_view: rank r of W trains at step s on global
    batch sW + r of one sequence, whatever W and the number of workers; two epochs differ."""
    reference = keys_of(sp.build_loader(view_pipe(), seed=0))
    view = view_pipe().datapipe.view
    assert [view._streams.keys_of(b) for b in view.plan(0).batches] == reference
    assert sorted(k for b in reference for k in b) == sorted(VIEW_LENGTHS)
    other = view.batches(1)  # the same streams and sizes (ties of length drawn anew)
    assert other != reference and sorted(map(len, other)) == sorted(map(len, reference))
    n = len(reference)
    for world in (1, 2, 4):
        steps = -(-n // world)
        for workers in (0, 2):
            runs = rank_runs(monkeypatch, world, workers)
            for rank, (got,) in enumerate(runs):
                assert got == [reference[(s * world + rank) % n] for s in range(steps)], (
                    world, workers, rank)


@pytest.mark.parametrize("saved, resumed, at", [
    ((2, 2), (1, 0), 4), ((1, 0), (4, 1), 9), ((4, 1), (2, 0), 2), ((1, 2), (2, 2), 0),
    ((2, 0), (4, 2), "end")])
def test_a_view_state_resumes_exactly_on_another_topology(monkeypatch, saved, resumed, at):
    reference = [keys_of(loader) for loader in [sp.build_loader(view_pipe(), seed=0)]
                 for _ in range(2)]
    world, workers = saved
    monkeypatch.setattr("speechpipe.seeding._pinned", (0, world))
    loader = sp.build_loader(view_pipe(), seed=0, num_workers=workers)
    if at == "end":
        keys_of(loader)
    else:
        for step, _ in enumerate(loader):
            if step == at:
                break
    state = loader.state_dict()
    epoch, start = (1, 0) if at == "end" else (0, (at + 1) * world)
    assert (state["epoch"], state["batches"]) == (epoch, start)
    world2, workers2 = resumed
    runs = rank_runs(monkeypatch, world2, workers2, state, epochs=2)
    n = len(reference[epoch])
    for rank, (rest, following) in enumerate(runs):
        steps = -(-(n - start) // world2)
        assert rest == [reference[epoch][(start + s * world2 + rank) % n] for s in range(steps)]
        if epoch == 0:
            assert following == [reference[1][(s * world2 + rank) % n]
                                 for s in range(-(-n // world2))]
    real = [k for rank, (rest, _) in enumerate(runs) for s, b in enumerate(rest)
            if start + s * world2 + rank < n for k in b]
    assert sorted(real) == sorted(k for b in reference[epoch][start:] for k in b)
    assert len(real) == len(set(real))  # none twice, none lost


def test_a_view_over_streams_refuses_what_it_cannot_serve(monkeypatch):
    with pytest.raises(ValueError, match="any world size|every world size"):
        sp.BatchView(VIEW_LENGTHS, budget=20.0, streams=4, world_size=2)
    loader = sp.build_loader(view_pipe(), seed=0)
    next(iter(loader))
    state = loader.state_dict()
    for change in (dict(streams=3), dict(seed=1), dict(budget=15.0)):
        with pytest.raises(sp.ResumeError, match="view"):
            sp.build_loader(view_pipe(**change), seed=0).load_state_dict(state)
    with pytest.raises(sp.ResumeError, match="streams=4.*streams=5"):
        sp.build_loader(view_pipe(streams=5), seed=0).load_state_dict(state)
    total = len(view_pipe().datapipe.view.plan(0))
    with pytest.raises(sp.DataError, match="past the end of epoch 0"):
        sp.build_loader(view_pipe(), seed=0).load_state_dict({**state, "batches": total + 1})
    monkeypatch.setattr("speechpipe.seeding._pinned", (1, 4))
    assert len(sp.build_loader(view_pipe(), seed=0)) == -(-total // 4)
    assert len(sp.build_loader(view_pipe(uneven="drop"), seed=0)) == total // 4


def test_step_planner_counts_a_view_over_streams(monkeypatch):
    total = len(view_pipe().datapipe.view.plan(0))
    monkeypatch.setattr("speechpipe.seeding._pinned", (1, 4))
    for uneven, steps in (("pad", -(-total // 4)), ("drop", total // 4)):
        loader = sp.build_loader(view_pipe(uneven=uneven), seed=0, uneven="plan")
        assert sp.StepPlanner(loader).steps() == len(loader) == steps == len(list(loader))
    state = {**sp.build_loader(view_pipe(), seed=0).state_dict(), "batches": 6}
    resumed = sp.build_loader(view_pipe(), seed=0, uneven="plan")
    resumed.load_state_dict(state)
    assert len(resumed) == -(-(total - 6) // 4) == len(list(resumed))


@pytest.mark.parametrize("uneven", [None, "plan"])
@pytest.mark.parametrize("road", ["shards", "rows"])
def test_len_of_the_loader_counts_the_epoch_set_before_the_pass(corpus, road, uneven):
    """``loader.set_epoch(e)`` then ``len(loader)``: epoch e's steps, not the last pass's
    (the planner learnt its epoch only when the pass began)."""
    make = (lambda: shard_pipe(corpus["shards"])) if road == "shards" else (
        lambda: row_pipe(corpus["rows"]))
    plans = make().datapipe
    counts = {e: len(plans.plan(e)) for e in range(12)}
    epoch = next(e for e in range(1, 12) if counts[e] != counts[0])
    loader = sp.build_loader(make(), seed=0, uneven=uneven)
    assert len(loader) == counts[0]
    loader.set_epoch(epoch)
    assert len(loader) == counts[epoch] == len(list(loader))
