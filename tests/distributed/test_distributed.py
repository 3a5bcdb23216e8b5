"""Distribution: duration-balanced shard splitting and equal steps on real process groups (#5).

Shards are real tar files (speechpipe's ShardWriter) with a real ``index.jsonl``: 7 shards of
uneven counts (9 x 6 and a partial shard of 4) and skewed lengths (long, medium, short
utterances), for 2 and 3 ranks. The distributed tests spawn real ``torch.distributed`` gloo
groups on 127.0.0.1 (one subprocess per rank, ``init_method=tcp://127.0.0.1:PORT``); each rank
runs a list of scenarios in one group -- a DDP-style loop that all-reduces a tensor at every
step -- and writes what it saw to JSON, which the tests below check. Groups are reused across
scenarios (spawning is the slow part); the scenarios that break a group (a stalled rank, a
dead rank) run last.

Invariants:
- every rank takes the same number of steps in every epoch, whatever the policy, with
  DataLoader workers 0 and 2, and no run hangs (hard timeouts on every process and test);
- ``stop`` takes the fewest batches of any rank and drops (and counts) the rest; ``pad`` takes
  the most and repeats (and counts) batches; ``plan`` takes exactly the planned steps with one
  collective per epoch, and the plan equals the batches each rank really yields;
- no sample is yielded twice in an epoch except the declared repeats;
- all ranks share the epoch seed: the same shard order and assignment everywhere, and the
  same batches for the same seed across runs;
- a rank that fails, stalls or dies makes the others raise ``DistributedStepError`` naming
  the problem within the timeout;
- the split is balanced by length, deterministic, different per epoch, and independent of
  the number of DataLoader workers.
"""

from __future__ import annotations

import collections
import json
import os
import random
import shutil
import tarfile
import time
import warnings

import pytest
import torch

from speechpipe.testing import join_rank_group, run_ranks
import speechpipe
from speechpipe.errors import DataError
from speechpipe.index import ShardEntry, ShardIndex
from speechpipe.pipes.order import _streaming as sharding
from speechpipe.pipes._core import IterableWrapper
from speechpipe.pipes.order import (
    assign_shards, ShardSplit, shuffle_shards, split_balance, split_shards,
)
from speechpipe.pipes.batching import LengthUnitError, PaddedArea
from speechpipe.pipes.distributed import DistributedStepError, EqualSteps
from speechpipe.pipes.shards import ShardWriter
from speechpipe.pipes.order import shard_assignment
from speechpipe.pipes.distributed import batch_samples, StepPlanner
from speechpipe.seeding import Position

# (count, shortest, longest) frames per shard: uneven counts, skewed lengths.
SHARDS = [(9, 250, 350), (9, 250, 350), (9, 120, 180), (9, 120, 180), (9, 40, 80),
          (9, 40, 80), (4, 40, 350)]
TOTAL = sum(count for count, _, _ in SHARDS)
BUDGET = 800  # padded frames per batch
SEED = 1
PROCESS_TIMEOUT = 100  # seconds a whole spawned session may take


# --------------------------------------------------------------------------------------------
# fixtures shared by the test process and the rank processes
# --------------------------------------------------------------------------------------------


def write_corpus(folder: str) -> list[str]:
    """7 tar shards with samples {key, txt=<frames>} and their index.jsonl."""
    os.makedirs(folder, exist_ok=True)
    entries = []
    for i, (count, low, high) in enumerate(SHARDS):
        rng = random.Random(i)
        lengths = [rng.randint(low, high) for _ in range(count)]
        keys = [f"s{i}_{j}" for j in range(count)]
        path = os.path.join(folder, f"data-{i:05d}.tar")
        with ShardWriter(path) as writer:
            for key, n in zip(keys, lengths):
                writer.write({"key": key, "txt": str(n)})
        entries.append(ShardEntry(os.path.basename(path), count, os.path.getsize(path),
                                  tuple(keys), tuple(float(n) for n in lengths)))
    ShardIndex(folder, entries).write()
    return [os.path.join(folder, e.name) for e in entries]


def parse(sample: dict) -> dict:
    return {"key": sample["key"], "num_frames": int(sample["txt"])}


def parse_x4(sample: dict) -> dict:
    """A pipeline that measures 4 times the index's lengths (another unit)."""
    return {"key": sample["key"], "num_frames": 4 * int(sample["txt"])}


def batching(pipe, seed: int = SEED):
    """The batching stages, used on samples by the pipeline and on lengths by the planner."""
    return pipe.bucket_by_length(8, boundaries=[150]).block_batch(
        budget=PaddedArea(BUDGET), shuffle_window=3, seed=seed)


def plan_batching(lengths: list):
    return batching(IterableWrapper(lengths, deepcopy=False))


def build(paths, *, seed=SEED, split=None, buffer_size=4):
    sharded = IterableWrapper(paths).sharded_shuffle(buffer_size=buffer_size, seed=seed,
                                                     index=True, split=split)
    return sharded, batching(sharded.map(parse), seed)


def as_list(batch):
    return batch


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(str(tmp_path_factory.mktemp("corpus")))


def all_keys():
    return {f"s{i}_{j}" for i, (count, _, _) in enumerate(SHARDS) for j in range(count)}


# --------------------------------------------------------------------------------------------
# splitting (no processes)
# --------------------------------------------------------------------------------------------


def test_assign_shards_parts_are_disjoint_and_cover_every_shard():
    names = [f"n{i}" for i in range(23)]
    weights = {n: float(random.Random(n).randint(1, 100)) for n in names}
    for world, workers in ((1, 1), (3, 1), (4, 3), (8, 2)):
        a = assign_shards(names, world_size=world, num_workers=workers, weights=weights)
        parts = [a.shards(r, w) for r in range(world) for w in range(workers)]
        flat = [n for part in parts for n in part]
        assert sorted(flat) == sorted(names) and len(flat) == len(set(flat))
        for part in parts:  # each process reads its shards in the epoch's order
            assert part == sorted(part, key=names.index)


def test_length_balance_beats_count_balance_on_skewed_shards():
    # Invariant: by length the per-rank totals are far closer than by count (the split the
    # issue replaces), for skewed shards (length groups of different durations).
    rng = random.Random(0)
    names = [f"n{i}" for i in range(70)]
    weights = {n: (30000.0 if i % 7 == 0 else 9000.0) + rng.uniform(-300, 300)
               for i, n in enumerate(names)}
    names = shuffle_shards(names, 0, 3)
    by_length = assign_shards(names, world_size=8, weights=weights).balance()
    counted = assign_shards(names, world_size=8, weights=weights,
                            split=ShardSplit(balance="count"))
    by_count = split_balance([sum(weights[n] for n in counted.rank_shards(r))
                              for r in range(8)])
    # Largest-first: the spread is at most one shard of the last (smallest) class.
    assert by_length.max - by_length.min <= 9300
    assert by_count.max - by_count.min > 3 * 9300
    assert by_length.max_over_min < by_count.max_over_min


def test_split_differs_per_epoch_and_is_the_same_for_the_same_epoch():
    names = [f"n{i}" for i in range(40)]
    weights = {n: 1000.0 + i % 3 for i, n in enumerate(names)}
    splits = [assign_shards(shuffle_shards(names, 5, e), world_size=4, weights=weights)
              for e in (0, 0, 1)]
    assert splits[0] == splits[1]
    assert splits[0].parts != splits[2].parts


def test_without_weights_the_split_is_count_round_robin_per_rank_then_worker():
    names = [f"n{i}" for i in range(11)]
    a = assign_shards(names, world_size=2, num_workers=3)
    assert a.unit == "shards" and a.rank_totals == (6.0, 5.0)
    for rank in range(2):
        assert a.rank_shards(rank) != [] and sorted(a.rank_shards(rank)) == sorted(names[rank::2])
        for worker in range(3):
            assert a.shards(rank, worker) == names[rank::2][worker::3]


def test_a_ranks_shards_do_not_depend_on_the_number_of_workers():
    names = [f"n{i}" for i in range(17)]
    weights = {n: float(100 + 37 * i % 50) for i, n in enumerate(names)}
    for rank in range(3):
        parts = {w: sorted(assign_shards(names, world_size=3, num_workers=w,
                                         weights=weights).rank_shards(rank)) for w in (1, 2, 4)}
        assert parts[1] == parts[2] == parts[4]


def test_equalize_repeat_gives_equal_counts_and_declares_the_repeats():
    names = [f"n{i}" for i in range(7)]
    weights = {n: float(10 + i) for i, n in enumerate(names)}
    a = assign_shards(names, world_size=3, weights=weights, split=ShardSplit(equalize="repeat"))
    assert a.shard_counts() == [3, 3, 3]
    assert a.repeated == ("n0", "n1") and a.dropped == ()
    assert a.repeated_weight == 21.0
    flat = collections.Counter(n for r in range(3) for n in a.rank_shards(r))
    assert flat == collections.Counter(names + ["n0", "n1"])
    for r in range(3):  # a copy never lands on the rank of its original when avoidable
        assert len(set(a.rank_shards(r))) == 3
    assert "repeated 2 shard(s) (21 frames)" in a.report()


def test_equalize_drop_gives_equal_counts_and_drops_the_last_of_the_epoch_order():
    names = [f"n{i}" for i in range(8)]
    epochs = [assign_shards(shuffle_shards(names, 0, e), world_size=3,
                            split=ShardSplit(equalize="drop")) for e in range(4)]
    for e, a in enumerate(epochs):
        assert a.shard_counts() == [2, 2, 2]
        assert list(a.dropped) == shuffle_shards(names, 0, e)[6:]
        assert "dropped 2 shard(s)" in a.report()
    assert len({a.dropped for a in epochs}) > 1  # not the same shards every epoch


def test_equalize_drop_with_fewer_shards_than_ranks_is_refused():
    with pytest.raises(ValueError, match="would drop every shard"):
        assign_shards(["a", "b"], world_size=3, split=ShardSplit(equalize="drop"))


def test_equalize_repeat_with_fewer_shards_than_ranks_gives_every_rank_one():
    a = assign_shards(["a", "b"], world_size=5, split=ShardSplit(equalize="repeat"))
    assert a.shard_counts() == [1] * 5 and len(a.repeated) == 3


def test_world_size_comes_from_the_argument_without_torch_distributed():
    assert assign_shards(["a", "b", "c"]).world_size == 1
    assert assign_shards(["a", "b", "c"], world_size=2).world_size == 2


@pytest.mark.parametrize("kwargs, message", [
    (dict(world_size=0), "world_size must be an int >= 1, got 0"),
    (dict(world_size=2, num_workers=0), "num_workers must be an int >= 1, got 0"),
    (dict(world_size=2, weights={"a": 1.0}), "shard 'b' has no weight"),
    (dict(world_size=2, weights={"a": 1.0, "b": -2.0}), "shard 'b' has weight -2.0"),
])
def test_assign_shards_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        assign_shards(["a", "b"], **kwargs)


@pytest.mark.parametrize("kwargs, message", [
    (dict(balance="bytes"), "balance must be one of"),
    (dict(equalize="pad"), "equalize must be one of"),
])
def test_shard_split_rejects_bad_options(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ShardSplit(**kwargs)


def test_sharded_shuffle_rejects_a_split_that_is_not_a_shard_split(corpus):
    with pytest.raises(TypeError, match="split must be a ShardSplit"):
        IterableWrapper(corpus).sharded_shuffle(split="repeat")


def test_split_balance_reports_max_over_min_and_max_over_mean():
    b = split_balance([90.0, 100.0, 110.0])
    assert b.max_over_min == pytest.approx(110 / 90) and b.max_over_mean == pytest.approx(1.1)
    assert "max/min 1.2222" in b.report()
    assert split_balance([0.0, 5.0]).max_over_min == float("inf")


def test_sharded_shuffle_reads_the_length_balanced_split_of_its_position(corpus, monkeypatch):
    index = ShardIndex.read(os.path.dirname(corpus[0]))
    weights = {p: e.total_length for p, e in zip(index.paths(), index.shards)}
    seen = collections.Counter()
    for rank in range(3):
        for worker in range(2):
            position = Position(rank=rank, world_size=3, worker=worker, num_workers=2)
            monkeypatch.setattr(sharding, "process_position", lambda p=position: p)
            sharded = IterableWrapper(corpus).sharded_shuffle(buffer_size=1, seed=SEED,
                                                              index=True).set_epoch(2)
            sources = list(dict.fromkeys(s["source"] for s in sharded))
            assert sources == split_shards(shuffle_shards(corpus, SEED, 2), position,
                                           weights=weights)
            seen.update(s["key"] for s in sharded)
    assert set(seen) == all_keys() and set(seen.values()) == {1}


def test_shard_assignment_reports_a_pipes_split_with_repeats(corpus):
    sharded = IterableWrapper(corpus).sharded_shuffle(
        index=True, seed=SEED, split=ShardSplit(equalize="repeat"))
    a = shard_assignment(sharded, 0, world_size=3)
    assert a.shard_counts() == [3, 3, 3] and len(a.repeated) == 2
    assert a.balance().max_over_min >= 1.0 and "shards per rank min 3 / max 3" in a.report()


# --------------------------------------------------------------------------------------------
# planning and EqualSteps in one process
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("level", ["shard", "sample"])
def test_step_planner_is_exact_for_budget_batching_through_shuffle_buffers(corpus, monkeypatch,
                                                                           workers, level):
    # Simulate every (rank, worker) in this process and count the batches it really yields.
    # With a sample-level split (issue 18), the plans hold each process's share of samples.
    split = ShardSplit(level=level)
    sharded, _ = build(corpus, split=split)
    planner = StepPlanner(sharded, plan_batching, num_workers=workers, world_size=3)
    for epoch in range(3):
        actual = []
        for rank in range(3):
            total = 0
            for worker in range(workers):
                position = Position(rank=rank, world_size=3, worker=worker, num_workers=workers)
                monkeypatch.setattr(sharding, "process_position", lambda p=position: p)
                shards, pipe = build(corpus, split=split)
                speechpipe.set_epoch(pipe, epoch)
                total += sum(1 for _ in pipe)
            actual.append(total)
        assert planner.plan(epoch).rank_batches == tuple(actual)
        assert planner.plan(epoch).exact


def test_step_planner_lower_bound_never_exceeds_the_real_count(corpus):
    sharded, _ = build(corpus)
    exact = StepPlanner(sharded, plan_batching, world_size=3)
    bound = StepPlanner(sharded, PaddedArea(budget=BUDGET), world_size=3)
    assert not bound.exact
    for epoch in range(3):
        for low, real in zip(bound.plan(epoch).rank_batches, exact.plan(epoch).rank_batches):
            assert 0 < low <= real


def test_step_planner_with_a_batch_size_counts_ceil_per_worker(corpus):
    sharded, _ = build(corpus)
    plan = StepPlanner(sharded, 4, num_workers=2, world_size=2).plan(0)
    a = shard_assignment(sharded, 0, world_size=2, num_workers=2)
    index = ShardIndex.read(os.path.dirname(corpus[0])).by_path()
    expected = tuple(sum(-(-sum(index[s].count for s in a.shards(r, w)) // 4) for w in range(2))
                     for r in range(2))
    assert plan.rank_batches == expected


def test_step_plan_targets_take_the_min_mean_or_max_and_count_drops_and_repeats():
    from speechpipe.pipes.distributed import StepPlan

    plans = {t: StepPlan(0, (10, 13, 20), True, t) for t in ("min", "mean", "max")}
    assert {t: p.steps for t, p in plans.items()} == {"min": 10, "mean": 14, "max": 20}
    assert (plans["min"].dropped_batches, plans["min"].repeated_batches) == (13, 0)
    assert (plans["mean"].dropped_batches, plans["mean"].repeated_batches) == (6, 5)
    assert (plans["max"].dropped_batches, plans["max"].repeated_batches) == (0, 17)


def test_step_planner_rejects_an_unknown_target(corpus):
    sharded, _ = build(corpus)
    with pytest.raises(ValueError, match="target must be one of"):
        StepPlanner(sharded, 4, target="median")


def test_step_planner_needs_an_index(corpus):
    with pytest.raises(ValueError, match="needs the shard index"):
        StepPlanner(IterableWrapper(corpus).sharded_shuffle(), 4)


def duration_batching(pipe, seed: int = SEED):
    """The batching of ``batching`` said in seconds (the index counts 10 ms frames)."""
    budget = PaddedArea(budget=BUDGET / 100, length="duration")
    return pipe.bucket_by_length(8, boundaries=[1.5], budget=budget).block_batch(
        budget=budget, shuffle_window=3, seed=seed)


@pytest.mark.parametrize("workers", [1, 2])
def test_step_planner_on_durations_is_exact_on_the_audio_road(corpus, monkeypatch, workers):
    # Issue 32.2: durations_from_index + PaddedArea(length="duration") is the audio road; the
    # planner fed bare floats to the constraint (TypeError: argument of type 'float' is not
    # iterable). Now the index's lengths carry their unit and are measured in seconds.
    def build_durations():
        sharded = IterableWrapper(corpus).sharded_shuffle(buffer_size=4, seed=SEED, index=True)
        return sharded, duration_batching(sharded.durations_from_index())

    sharded, _ = build_durations()
    planner = StepPlanner(sharded, lambda ls: duration_batching(IterableWrapper(ls)),
                          num_workers=workers, world_size=2)
    for epoch in range(2):
        actual = []
        for rank in range(2):
            total = 0
            for worker in range(workers):
                position = Position(rank=rank, world_size=2, worker=worker, num_workers=workers)
                monkeypatch.setattr(sharding, "process_position", lambda p=position: p)
                _, pipe = build_durations()
                speechpipe.set_epoch(pipe, epoch)
                total += sum(1 for _ in pipe)
            actual.append(total)
        assert planner.plan(epoch).rank_batches == tuple(actual)
    # the same batching in frames plans the same batches (the index counts frames)
    assert planner.plan(0) == StepPlanner(sharded, plan_batching, num_workers=workers,
                                          world_size=2).plan(0)


def test_step_planner_refuses_to_plan_frames_on_an_index_in_seconds(tmp_path, corpus):
    # Issue 32.1: the index counted seconds, the batching frames (batch_len=3000): the plan
    # had 5 steps where the loader yielded 31. A constraint that cannot measure the index's
    # unit is now a named error, not a plan in another unit.
    folder = tmp_path / "seconds"
    shutil.copytree(os.path.dirname(corpus[0]), folder)
    index = ShardIndex.read(str(folder))
    ShardIndex(str(folder), [ShardEntry(e.name, e.count, e.bytes, e.keys,
                                        tuple(n / 100 for n in e.lengths))
                             for e in index.shards], "seconds").write()
    sharded = IterableWrapper(sorted(str(p) for p in folder.glob("*.tar"))).sharded_shuffle(
        buffer_size=4, seed=SEED, index=True)
    for batching_ in (plan_batching, PaddedArea(budget=BUDGET)):
        with pytest.raises(LengthUnitError, match=r"the shard index counts seconds but the "
                           r"constraint measures frames of feats or audio samples \(length=None"):
            StepPlanner(sharded, batching_).plan(0)
    # measured in seconds, it plans what the frames index planned
    seconds = StepPlanner(sharded, lambda ls: duration_batching(IterableWrapper(ls)))
    frames = StepPlanner(build(corpus)[0], plan_batching)
    assert seconds.plan(0).rank_batches == frames.plan(0).rank_batches


def test_a_plan_that_batches_otherwise_than_the_loader_warns_with_the_figures(corpus):
    # Issue 32.1: the pipeline measured 4x the index's lengths (frames of features against an
    # index of another unit); each rank dropped most of its batches with rc 0 and no warning.
    sharded, _ = build(corpus)
    pipe = batching(sharded.map(parse_x4))
    planner = StepPlanner(sharded, plan_batching)
    steps = EqualSteps(pipe, "plan", steps=planner)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        list(steps)
    s = steps.stats
    planned, own = planner.rank_batches(0, 0), s.batches + s.dropped_batches
    assert own > 2 * planned and s.planned_batches == planned == s.steps
    by_kind = {w.category.__name__: str(w.message) for w in caught}
    assert (f"rank 0's loader yielded {own} batches of its own data but the StepPlanner "
            f"counted {planned}") in by_kind["PlanMismatchWarning"]
    assert "the index counts frames" in by_kind["PlanMismatchWarning"]
    assert s.world == {"batches": s.batches, "samples": s.samples,
                       "dropped_batches": s.dropped_batches, "dropped_samples": s.dropped_samples,
                       "repeated_batches": 0, "repeated_samples": 0}
    assert s.samples + s.dropped_samples == TOTAL
    assert (f"{s.dropped_batches} batches / {s.dropped_samples} samples of {TOTAL}"
            in by_kind["UnevenStepsWarning"])
    # the plan that matches warns of nothing
    exact = EqualSteps(build(corpus)[1], "plan", steps=planner)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        list(exact)
    assert not [w for w in caught if "Plan" in w.category.__name__ or
                "UnevenSteps" in w.category.__name__]


def test_equal_steps_outside_torch_distributed_passes_batches_through(corpus):
    _, pipe = build(corpus)
    expected = [[s["key"] for s in b] for b in pipe]
    for policy in ("stop", "pad"):
        steps = EqualSteps(speechpipe.set_epoch(pipe, 0), policy)  # the same epoch again
        assert [[s["key"] for s in b] for b in steps] == expected
        assert steps.stats.steps == len(expected) and steps.stats.samples == TOTAL
        assert steps.stats.collectives == 0 and steps.stats.dropped_batches == 0


def test_plan_cuts_at_the_planned_steps_and_counts_the_rest_as_dropped():
    steps = EqualSteps([[1, 2], [3], [4, 5, 6]], "plan", steps=1)
    assert list(steps) == [[1, 2]]
    assert (steps.stats.dropped_batches, steps.stats.dropped_samples) == (2, 4)
    assert "dropped: 2 batches, 4 samples" in steps.stats.report()


def test_plan_without_draining_says_the_dropped_counts_are_lower_bounds():
    steps = EqualSteps([[1, 2], [3], [4]], "plan", steps=1, count_dropped=False)
    list(steps)
    assert not steps.stats.drained and "at least (loader not drained)" in steps.stats.report()


def test_plan_longer_than_the_data_repeats_cached_batches_with_a_warning():
    steps = EqualSteps([[1, 2], [3]], "plan", steps=5)
    with pytest.warns(RuntimeWarning, match="ended after 2 of 5 planned steps; 3 batch"):
        out = list(steps)
    assert out == [[1, 2], [3], [1, 2], [3], [1, 2]]
    assert (steps.stats.repeated_batches, steps.stats.repeated_samples) == (3, 5)


def test_plan_with_an_empty_loader_is_an_error():
    with pytest.raises(DistributedStepError, match="yielded nothing but the plan has 2 steps"):
        list(EqualSteps([], "plan", steps=2))


def test_plan_steps_may_be_a_function_of_the_epoch():
    steps = EqualSteps([[1], [2], [3]], "plan", steps=lambda epoch: epoch + 1)
    assert [len(list(steps.set_epoch(e))) for e in range(3)] == [1, 2, 3]


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(policy="sync"), ValueError, "policy must be one of"),
    (dict(policy="plan"), ValueError, "policy='plan' needs steps="),
    (dict(policy="stop", steps=3), ValueError, "steps= is for policy='plan', not 'stop'"),
    (dict(policy="plan", steps=-1), ValueError, "steps must be >= 0, got -1"),
    (dict(policy="plan", steps="3"), TypeError, "steps must be an int, a callable"),
    (dict(timeout=0), ValueError, "timeout must be a number of seconds > 0"),
    (dict(pad_cache=0), ValueError, "pad_cache must be an int >= 1, got 0"),
    (dict(count_fn=3), TypeError, "count_fn must be callable"),
    (dict(check_every=-1), ValueError, "check_every must be an int >= 0, got -1"),
])
def test_equal_steps_rejects_bad_arguments(kwargs, error, message):
    with pytest.raises(error, match=message):
        EqualSteps([[1]], **kwargs)


def test_equal_steps_rejects_a_loader_that_is_not_iterable():
    with pytest.raises(TypeError, match="loader must be an iterable of batches"):
        EqualSteps(3)


def test_a_planner_for_other_workers_than_the_loaders_is_refused(corpus):
    sharded, pipe = build(corpus)
    loader = torch.utils.data.DataLoader(pipe, batch_size=None, num_workers=2)
    with pytest.raises(ValueError, match="plans for num_workers=0 but the loader has "
                                         "num_workers=2"):
        EqualSteps(loader, "plan", steps=StepPlanner(sharded, plan_batching))


def fail_on_s2(sample: dict) -> dict:
    if sample["key"].startswith("s2_"):
        raise DataError("cannot decode", source="data-00002.tar", key=sample["key"])
    return sample


@pytest.mark.parametrize("policy", ["stop", "pad"])
def test_a_failing_loaders_workers_are_shut_down_when_its_error_leaves(corpus, policy):
    import multiprocessing

    sharded = IterableWrapper(corpus).sharded_shuffle(buffer_size=4, seed=SEED, index=True)
    pipe = batching(sharded.map(parse).map(fail_on_s2))
    loader = torch.utils.data.DataLoader(pipe, batch_size=None, num_workers=2)
    with pytest.raises(DataError, match="data-00002.tar"):
        for _ in EqualSteps(loader, policy):
            pass
    assert multiprocessing.active_children() == []  # not left for the garbage collector


def test_equal_steps_has_a_length_only_for_an_int_plan():
    assert len(EqualSteps([[1]], "plan", steps=7)) == 7
    with pytest.raises(TypeError, match="has no len"):
        len(EqualSteps([[1]], "stop"))


def test_equalize_steps_pipe_refuses_to_run_inside_dataloader_workers():
    pipe = IterableWrapper([[1], [2]]).equalize_steps(policy="stop")
    loader = torch.utils.data.DataLoader(pipe, batch_size=None, num_workers=1)
    with pytest.raises(RuntimeError, match="equalize_steps runs in the main process"):
        list(loader)


def test_batch_samples_counts_lists_dicts_and_tensors():
    assert batch_samples([1, 2, 3]) == 3
    assert batch_samples({"key": ["a", "b"], "audio": torch.zeros(2, 9)}) == 2
    assert batch_samples({"audio": torch.zeros(4, 9)}) == 4
    with pytest.raises(TypeError, match="pass count_fn= to EqualSteps"):
        batch_samples(object())


# --------------------------------------------------------------------------------------------
# the rank processes
# --------------------------------------------------------------------------------------------


def _ddp_loop(batches, record: dict) -> None:
    """A DDP-style loop: one all-reduce on the default group per step, like gradient sync."""
    import torch.distributed as dist

    steps = []
    for batch in batches:
        tensor = torch.tensor([float(len(batch))])
        dist.all_reduce(tensor)
        steps.append([s["key"] for s in batch])
    record.setdefault("epochs", []).append(steps)


def _stats(stats) -> dict:
    return {k: v for k, v in vars(stats).items() if k != "wait_seconds"}


def _policy_scenario(ctx, policy, workers, *, split=None, bound=False, seed=SEED,
                     target="min"):
    sharded, pipe = build(ctx["paths"], split=split, seed=seed)
    loader = torch.utils.data.DataLoader(pipe, batch_size=None, num_workers=workers,
                                         collate_fn=as_list)
    planner = StepPlanner(sharded, PaddedArea(budget=BUDGET) if bound else plan_batching,
                          num_workers=workers, target=target)
    exact = StepPlanner(sharded, plan_batching, num_workers=workers)
    steps = EqualSteps(loader, policy, steps=planner if policy == "plan" else None, timeout=60)
    record = {"stats": [], "plan": []}
    for epoch in range(2):
        speechpipe.set_epoch(pipe, epoch)
        steps.set_epoch(epoch)
        record["plan"].append(list(exact.plan(epoch).rank_batches))
        _ddp_loop(steps, record)
        record["stats"].append(_stats(steps.stats))
    record["assignment"] = [
        [shard_assignment(sharded, e).rank_shards(r) for r in range(ctx["world"])]
        for e in range(2)]
    return record


def _seed_scenario(ctx, rank, world):
    import torch.distributed as dist

    sharded, _ = build(ctx["paths"])
    mine = {"order": shuffle_shards(ctx["paths"], SEED, 1),
            "assignment": shard_assignment(sharded, 1).rank_shards(rank)}
    gathered = [None] * world
    dist.all_gather_object(gathered, mine)
    return {"gathered": gathered}


def _map_scenario(ctx, rank, world, workers):
    import torch.distributed as dist

    from speechpipe.pipes.batching import BatchView

    index = ShardIndex.read(os.path.dirname(ctx["paths"][0]))
    lengths = dict(zip((k for s in index.shards for k in s.keys), index.lengths()))
    dataset = {k: {"key": k, "num_frames": int(n)} for k, n in lengths.items()}
    view = BatchView(lengths, budget=BUDGET, world_size=world, seed=SEED)
    record = {"sizes": [], "keys": [], "repeated": view.stats.repeated}
    for epoch in range(2):
        sampler = view.sampler(epoch, rank=rank)
        loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler,
                                             num_workers=workers, collate_fn=as_list)
        sizes, keys = [], []
        for batch in loader:
            gathered = [None] * world
            dist.all_gather_object(gathered, len(batch))  # equal instances on every rank?
            sizes.append(gathered)
            keys.append([s["key"] for s in batch])
        record["sizes"].append(sizes)
        record["keys"].append(keys)
    return record


def _error_scenario(ctx, rank, world, workers):
    """One shard truncated: the rank that reads it fails mid-epoch, the others must stop."""
    sharded, pipe = build(ctx["broken"])
    loader = torch.utils.data.DataLoader(pipe, batch_size=None, num_workers=workers,
                                         collate_fn=as_list)
    steps = EqualSteps(loader, "pad", timeout=60)
    record = {}
    try:
        _ddp_loop(steps, record)
        record["error"] = None
    except Exception as exc:  # the test checks which
        record.update(error=type(exc).__name__, message=str(exc), at=time.time())
    record["stats"] = _stats(steps.stats)
    record["left"] = time.time()  # EqualSteps has shut the loader's workers down by now
    return record


def _stall_scenario(ctx, rank, world):
    """The last rank stalls before its second batch for longer than the 3 s timeout."""
    _, pipe = build(ctx["paths"])

    def stalling():
        for i, batch in enumerate(pipe):
            if rank == world - 1 and i == 1:
                time.sleep(8)
            yield batch

    class Loader:
        def __iter__(self):
            return stalling()

    record = {"start": time.time()}
    try:
        _ddp_loop(EqualSteps(Loader(), "stop", timeout=3), record)
        record["error"] = None
    except Exception as exc:
        record.update(error=type(exc).__name__, message=str(exc), at=time.time())
    return record


def _die_scenario(ctx, rank, world, write, kill: bool = False):
    """Rank 1 raises in its training step (after the step's all-reduce) and its process ends;
    with ``kill``, it is killed there (SIGKILL: no finalizer, no message)."""
    import signal

    import torch.distributed as dist

    _, pipe = build(ctx["paths"])
    record = {}
    try:
        for step, batch in enumerate(EqualSteps(pipe, "stop", timeout=60)):
            dist.all_reduce(torch.tensor([1.0]))
            if rank == 1 and step == 1:
                record["raised_at"] = time.time()
                write(record)
                if kill:
                    os.kill(os.getpid(), signal.SIGKILL)
                raise RuntimeError("rank 1 fails in its training step")
        record["error"] = None
    except DistributedStepError as exc:
        record.update(error=type(exc).__name__, message=str(exc), at=time.time())
    return record


def _plan_failure_scenario(ctx, rank, world, at: int) -> dict:
    """policy='plan': rank 1's loader raises at its batch ``at`` (0: the first) and the
    process lives on for 15 s (a real script logs or saves a checkpoint); the others must stop
    within the timeout naming it, not wait in the training loop's all-reduce (issue 23.2)."""
    sharded, pipe = build(ctx["paths"])

    def failing():
        for i, batch in enumerate(pipe):
            if rank == 1 and i == at:
                raise DataError("cannot decode", source="data-00003.tar", key="s3_4")
            yield batch

    class Loader:
        def __iter__(self):
            return failing()

    steps = EqualSteps(Loader(), "plan", steps=4, timeout=30)
    record = {"start": time.time()}
    try:
        _ddp_loop(steps, record)
        record["error"] = None
    except Exception as exc:
        record.update(error=type(exc).__name__, message=str(exc), at=time.time())
    record["stats"] = _stats(steps.stats)
    if rank == 1:
        time.sleep(15)  # alive, its gloo connections open
        record["woke"] = time.time()
    return record


def _empty_rank_scenario(ctx, target: str) -> dict:
    """One shard for two ranks: one rank has no batch. policy='plan' (with a planner's
    target, or an int) must stop every rank, naming it -- not leave the others waiting in the
    training loop's all-reduce (issue 23)."""
    sharded, pipe = build(ctx["paths"])
    steps = 5 if target == "int" else StepPlanner(sharded, plan_batching, target=target)
    record = {"start": time.time()}
    try:
        _ddp_loop(EqualSteps(pipe, "plan", steps=steps, timeout=20), record)
        record["error"] = None
    except DistributedStepError as exc:
        record.update(error=type(exc).__name__, message=str(exc), at=time.time())
    return record


def _mismatch_scenario(ctx) -> dict:
    """Issue 32.1 on real ranks: the plan counts the index's frames, the pipeline measures 4x
    as much. Every rank's warnings and stats, for two epochs."""
    sharded, _ = build(ctx["paths"])
    pipe = batching(sharded.map(parse_x4))
    steps = EqualSteps(pipe, "plan", steps=StepPlanner(sharded, plan_batching), timeout=60)
    record: dict = {"stats": [], "warned": []}
    for epoch in range(2):
        speechpipe.set_epoch(pipe, epoch)
        steps.set_epoch(epoch)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _ddp_loop(steps, record)
        record["stats"].append(_stats(steps.stats))
        record["warned"].append({w.category.__name__: str(w.message) for w in caught})
    record["report"] = steps.stats.report()
    return record


def write_few_shards(folder: str) -> list[str]:
    """2 shards of 37 and 13 samples (few shards for 2 ranks x 2 workers), with an index."""
    os.makedirs(folder, exist_ok=True)
    entries = []
    for i, count in enumerate((37, 13)):
        path = os.path.join(folder, f"data-{i:05d}.tar")
        keys = [f"f{i}_{j:02d}" for j in range(count)]
        with ShardWriter(path) as writer:
            for key in keys:
                writer.write({"key": key, "txt": "100"})
        entries.append(ShardEntry(os.path.basename(path), count, os.path.getsize(path),
                                  tuple(keys), (100.0,) * count))
    ShardIndex(folder, entries).write()
    return [os.path.join(folder, e.name) for e in entries]


def _key_of(sample: dict) -> str:
    return sample["key"]


def _few_shards_scenario(ctx: dict, level: str) -> dict:
    """2 shards, 2 ranks, 2 DataLoader workers: the keys each rank reads, its len(), and the
    warnings of an epoch started in this process."""
    split = ShardSplit(level=level)
    sharded = IterableWrapper(ctx["few"]).sharded_shuffle(buffer_size=4, seed=SEED,
                                                          index=True, split=split)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        next(iter(sharded))
    loader = torch.utils.data.DataLoader(sharded.map(_key_of), batch_size=None, num_workers=2)
    return {"keys": list(loader), "len": len(sharded),
            "warned": [str(w.message) for w in caught if "UnevenSplit" in w.category.__name__]}


def _scenario(name: str, ctx: dict, rank: int, world: int, write):
    kind, _, arg = name.partition(":")
    if kind == "few":
        return _few_shards_scenario(ctx, arg)
    if kind == "emptyrank":
        return _empty_rank_scenario(ctx, arg)
    if kind in ("stop", "pad", "plan"):
        return _policy_scenario(ctx, kind, int(arg))
    if kind == "again":  # the same as stop:2, a second run
        return _policy_scenario(ctx, "stop", 2)
    if kind == "mean":
        return _policy_scenario(ctx, "plan", int(arg), target="mean")
    if kind == "bound":
        return _policy_scenario(ctx, "plan", int(arg), bound=True)
    if kind in ("repeat", "drop"):
        return _policy_scenario(ctx, "stop" if kind == "drop" else "pad", int(arg),
                                split=ShardSplit(equalize=kind))
    if kind == "seed":
        return _seed_scenario(ctx, rank, world)
    if kind == "map":
        return _map_scenario(ctx, rank, world, int(arg))
    if kind == "error":
        return _error_scenario(ctx, rank, world, int(arg))
    if kind == "stall":
        return _stall_scenario(ctx, rank, world)
    if kind == "die":
        return _die_scenario(ctx, rank, world, write)
    if kind == "kill":
        return _die_scenario(ctx, rank, world, write, kill=True)
    if kind == "mismatch":
        return _mismatch_scenario(ctx)
    if kind == "planfail":
        return _plan_failure_scenario(ctx, rank, world, int(arg))
    if kind == "resumeworld":
        return _resume_world_scenario(ctx, rank, world)
    if kind == "spawn":
        return _spawn_scenario(arg)
    if kind == "plainspawn":
        return _plain_spawn_scenario(ctx)
    raise ValueError(name)


def _plain_spawn_scenario(ctx: dict) -> dict:
    """Keys each rank reads through a plain torch DataLoader with 2 spawned workers."""
    from speechpipe.pipes._core import IterableWrapper

    pipe = IterableWrapper(ctx["paths"]).sharded_shuffle(buffer_size=1, seed=SEED)
    loader = torch.utils.data.DataLoader(pipe, batch_size=None, num_workers=2,
                                         multiprocessing_context="spawn")
    return {"keys": sorted(s["key"] for s in loader)}


def _resume_world_scenario(ctx, rank, world):
    """A state saved by a loader on 1 process, loaded on every rank of this group: refused
    naming the world size, then accepted with allow_changes (from the next epoch); the keys
    every rank reads then, gathered."""
    import torch.distributed as dist

    from speechpipe.errors import ResumeError
    from speechpipe.loader import ResumeWarning, build_loader

    state = torch.load(ctx["state"], weights_only=True)
    _, pipe = build(ctx["paths"])
    loader = build_loader(pipe)
    try:
        loader.load_state_dict(state)
        refused = None
    except ResumeError as error:
        refused = {"message": str(error), "differences": error.differences}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader.load_state_dict(state, allow_changes=("world_size",))
    warned = [str(w.message) for w in caught if issubclass(w.category, ResumeWarning)]
    epoch = loader.epoch
    keys = [sample["key"] for batch in loader for sample in batch]
    gathered = [None] * world
    dist.all_gather_object(gathered, keys)
    return {"refused": refused, "warned": warned, "epoch": epoch, "keys": gathered}


def _spawn_scenario(context: str) -> dict:
    """Items each rank reads through build_loader with 2 workers started by ``context``."""
    from speechpipe.loader import build_loader
    from speechpipe.pipes._core import IterableWrapper

    pipe = IterableWrapper(range(48)).sharding_filter().batch(3)
    loader = build_loader(pipe, num_workers=2, multiprocessing_context=context,
                          resumable=False)  # torch's sharding_filter and batch
    return {"items": sorted(int(i) for batch in loader for i in batch)}


def _rank_main(rank: int, world: int, ctx: dict, out: str) -> None:
    import torch.distributed as dist

    ctx["world"] = world
    results: dict = {}

    def write(partial=None):
        if partial is not None:
            results[current] = partial
        with open(f"{out}.tmp", "w") as f:
            json.dump(results, f)
        os.replace(f"{out}.tmp", out)

    for current in ctx["scenarios"]:
        dist.barrier()  # scenarios in lock-step
        results[current] = _scenario(current, ctx, rank, world, write)
        write()
    if ctx["scenarios"][-1] not in ("die", "kill"):
        dist.barrier()
    dist.destroy_process_group()


def run_group(tmp, world: int, ctx: dict, expect_exit: dict | None = None) -> list[dict]:
    """Run ``ctx["scenarios"]`` in a fresh gloo group of ``world`` subprocesses; return each
    rank's results. Kills every process after PROCESS_TIMEOUT seconds (never hangs)."""
    return run_ranks(__file__, world, ctx, str(tmp), f"of-{world}", timeout=PROCESS_TIMEOUT,
                     expect_exit=expect_exit)


@pytest.mark.parametrize("context", ["spawn", "fork"])
def test_workers_started_by_spawn_know_their_rank(tmp_path, context):
    """Spawned workers begin without the process group; each rank must still read its own
    share (a worker seeing rank 0 everywhere would make every rank read the same items)."""
    results = run_group(str(tmp_path), 2, {"scenarios": [f"spawn:{context}"]})
    items = [r[f"spawn:{context}"]["items"] for r in results]
    assert sorted(items[0] + items[1]) == list(range(48))
    assert not set(items[0]) & set(items[1])


def test_a_state_saved_on_one_process_is_refused_by_two_ranks_naming_the_world_size(
        tmp_path, corpus):
    """Issue 29: a state saved on 1 process and restored on 2 ranks gave rank 0 none of the
    remaining keys, without a word (at snapshot_every=100). Now load_state_dict raises
    ResumeError on every rank, naming the world size; allow_changes=("world_size",) starts
    the next epoch on the new topology, every key once over the ranks."""
    from speechpipe.loader import build_loader

    _, pipe = build(corpus)
    loader = build_loader(pipe)
    it = iter(loader)
    next(it), next(it)
    state = loader.state_dict()
    del it
    torch.save(state, str(tmp_path / "state.pt"))
    results = run_group(str(tmp_path), 2, {"paths": corpus, "scenarios": ["resumeworld"],
                                           "state": str(tmp_path / "state.pt")})
    records = [r["resumeworld"] for r in results]
    for r in records:
        assert r["refused"]["differences"] == [["loader", "world_size", 1, 2]]
        assert "  - loader world_size: 1 -> 2\n" in r["refused"]["message"]
        assert r["warned"] == ["resuming with changes (allow_changes): loader world_size: 1 -> 2"
                               ". They take effect from epoch 1, which starts now; the rest of "
                               "epoch 0 after the saved step is skipped"]
        assert r["epoch"] == 1
    keys = records[0]["keys"]
    assert keys == records[1]["keys"]  # gathered: the same on every rank
    assert sorted(keys[0] + keys[1]) == sorted(all_keys()) and keys[0] and keys[1]


def test_a_plain_dataloader_with_spawned_workers_splits_shards_by_rank(tmp_path, corpus):
    """The pipe itself carries the rank into spawned workers (sharded_shuffle splits shards
    by rank in the worker): no rank reads another's shards."""
    results = run_group(str(tmp_path), 2, {"paths": corpus, "scenarios": ["plainspawn"]})
    keys = [r["plainspawn"]["keys"] for r in results]
    index = ShardIndex.read(os.path.dirname(corpus[0]))
    assert sorted(keys[0] + keys[1]) == sorted(k for e in index.shards for k in e.keys)
    assert not set(keys[0]) & set(keys[1])


def _broken_copy(paths: list[str], folder: str, world: int) -> tuple[list[str], str, int]:
    """A copy of the corpus whose shard read last by some rank in epoch 0 is truncated (so
    the failure comes mid-epoch); returns the paths, that shard and that rank."""
    shutil.copytree(os.path.dirname(paths[0]), folder)
    broken = [os.path.join(folder, os.path.basename(p)) for p in paths]
    sharded, _ = build(broken)
    a = shard_assignment(sharded, 0, world_size=world)
    rank = 1
    victim = a.rank_shards(rank)[-1]
    with tarfile.open(victim) as tar:
        last = tar.getmembers()[-1]
    with open(victim, "r+b") as f:
        f.truncate(last.offset_data + 1)  # cuts the last member's payload short
    return broken, victim, rank


GROUP3 = ["seed", "stop:0", "stop:2", "again", "pad:0", "pad:2", "plan:0", "plan:2", "bound:0",
          "mean:2", "repeat:0", "drop:2", "map:0", "error:2", "stall"]
GROUP2 = ["stop:2", "pad:0", "plan:2", "map:2", "mismatch", "error:0", "die"]


@pytest.fixture(scope="module")
def group3(corpus, tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("group3"))
    broken, victim, victim_rank = _broken_copy(corpus, os.path.join(tmp, "broken"), 3)
    ctx = {"paths": corpus, "broken": broken, "scenarios": GROUP3}
    return {"results": run_group(tmp, 3, ctx), "victim": victim, "victim_rank": victim_rank}


@pytest.fixture(scope="module")
def group2(corpus, tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("group2"))
    broken, victim, victim_rank = _broken_copy(corpus, os.path.join(tmp, "broken"), 2)
    ctx = {"paths": corpus, "broken": broken, "scenarios": GROUP2}
    return {"results": run_group(tmp, 2, ctx, expect_exit={1: 1}), "victim": victim,
            "victim_rank": victim_rank}


@pytest.fixture
def group(request):
    return request.getfixturevalue(request.param)


def _ran(*kinds):
    """``(group fixture, scenario)`` pairs of the scenarios of these kinds, for parametrize."""
    return [(g, name) for g, names in (("group3", GROUP3), ("group2", GROUP2))
            for name in names if name.partition(":")[0] in kinds]


def _records(group, name):
    return [r[name] for r in group["results"] if name in r]


def _check_equal_steps(records):
    for epoch in range(2):
        steps = {len(r["epochs"][epoch]) for r in records}
        assert len(steps) == 1, f"epoch {epoch}: ranks took {steps} steps"
        assert {r["stats"][epoch]["steps"] for r in records} == steps


# --------------------------------------------------------------------------------------------
# the distributed tests
# --------------------------------------------------------------------------------------------


@pytest.mark.timeout(150)
def test_all_ranks_share_the_epoch_seed_and_the_shard_assignment(group3):
    gathered = group3["results"][0]["seed"]["gathered"]
    assert all(g["order"] == gathered[0]["order"] for g in gathered)
    parts = [g["assignment"] for g in gathered]
    flat = [s for part in parts for s in part]
    assert sorted(flat) == sorted(gathered[0]["order"]) and len(set(flat)) == len(flat)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("group, name", _ran("stop"), indirect=["group"])
def test_stop_takes_the_fewest_batches_and_counts_what_it_drops(group, name):
    records = _records(group, name)
    _check_equal_steps(records)
    uneven = False
    for epoch in range(2):
        plan = records[0]["plan"][epoch]  # exact batches per rank, computed from the index
        uneven |= max(plan) > min(plan)
        stats = [r["stats"][epoch] for r in records]
        assert stats[0]["steps"] == min(plan)
        assert stats[0]["ended_by"] == plan.index(min(plan))
        for rank, s in enumerate(stats):
            assert s["batches"] + s["dropped_batches"] == plan[rank] and s["drained"]
            # one exchange per step, one at the end, one summing the pass's counts
            assert s["repeated_batches"] == 0 and s["collectives"] == s["steps"] + 2
        yielded = [k for r in records for batch in r["epochs"][epoch] for k in batch]
        assert len(yielded) == len(set(yielded))  # no sample twice
        assert len(yielded) + sum(s["dropped_samples"] for s in stats) == TOTAL
    assert uneven, "the corpus must give the ranks different batch counts"


@pytest.mark.timeout(150)
@pytest.mark.parametrize("group, name", _ran("pad"), indirect=["group"])
def test_pad_takes_the_most_batches_and_repeats_only_declared_batches(group, name):
    records = _records(group, name)
    _check_equal_steps(records)
    for epoch in range(2):
        plan = records[0]["plan"][epoch]
        stats = [r["stats"][epoch] for r in records]
        assert stats[0]["steps"] == max(plan)
        seen = collections.Counter()
        for rank, (r, s) in enumerate(zip(records, stats)):
            batches = r["epochs"][epoch]
            own, pads = batches[:s["batches"]], batches[s["batches"]:]
            assert s["batches"] == plan[rank] and s["dropped_batches"] == 0
            assert len(pads) == s["repeated_batches"] == max(plan) - plan[rank]
            assert sum(map(len, pads)) == s["repeated_samples"]
            for i, pad in enumerate(pads):  # the rank's first batches, cycled
                assert pad == own[i % min(len(own), 4)]
            seen.update(k for batch in own for k in batch)
        assert set(seen) == all_keys() and set(seen.values()) == {1}


@pytest.mark.timeout(150)
@pytest.mark.parametrize("group, name", _ran("plan"), indirect=["group"])
def test_plan_is_exact_takes_the_planned_steps_and_one_collective_per_epoch(group, name):
    records = _records(group, name)
    _check_equal_steps(records)
    for epoch in range(2):
        plan = records[0]["plan"][epoch]
        for rank, r in enumerate(records):
            s = r["stats"][epoch]
            assert s["planned"] == s["steps"] == min(plan)
            # the agreement at the start, none per step, the counts summed at the end
            assert s["collectives"] == 2
            assert s["batches"] + s["dropped_batches"] == plan[rank]  # the plan was exact
            assert s["repeated_batches"] == 0


@pytest.mark.timeout(150)
def test_a_plan_the_loaders_disagree_with_warns_on_every_rank_with_the_worlds_totals(group2):
    # Issue 32.1: each rank dropped 26-27 of its 31-32 batches with rc 0; only rank 0's stats
    # line showed it. Now every rank warns with its figures; rank 0 warns with the world's
    # totals, which every rank's stats hold.
    records = _records(group2, "mismatch")
    _check_equal_steps(records)
    for epoch in range(2):
        stats = [r["stats"][epoch] for r in records]
        totals = {name: sum(s[name] for s in stats) for name in stats[0]["world"]}
        for rank, (r, s) in enumerate(zip(records, stats)):
            assert s["world"] == totals
            own = s["batches"] + s["dropped_batches"]
            assert own >= 2 * s["planned_batches"]
            warned = r["warned"][epoch]
            assert (f"rank {rank}'s loader yielded {own} batches of its own data but the "
                    f"StepPlanner counted {s['planned_batches']}") in warned["PlanMismatchWarning"]
            assert ("UnevenStepsWarning" in warned) == (rank == 0)
        assert totals["samples"] + totals["dropped_samples"] == TOTAL
        assert (f"over 2 rank(s), {totals['dropped_batches']} batches / "
                f"{totals['dropped_samples']} samples of {TOTAL}"
                in records[0]["warned"][epoch]["UnevenStepsWarning"])
    assert "all 2 ranks: " in records[1]["report"]


@pytest.mark.timeout(150)
def test_plan_with_a_lower_bound_drops_more_but_keeps_steps_equal(group3):
    records = _records(group3, "bound:0")
    _check_equal_steps(records)
    for epoch in range(2):
        plan = records[0]["plan"][epoch]
        s = [r["stats"][epoch] for r in records]
        assert s[0]["steps"] <= min(plan)
        assert sum(x["dropped_batches"] for x in s) == sum(p - s[0]["steps"] for p in plan)


@pytest.mark.timeout(150)
def test_plan_to_the_mean_drops_above_and_repeats_below_without_a_warning(group3):
    records = _records(group3, "mean:2")
    _check_equal_steps(records)
    for epoch in range(2):
        plan = records[0]["plan"][epoch]
        steps = sum(plan) // len(plan)
        for rank, r in enumerate(records):
            s = r["stats"][epoch]
            assert s["planned"] == s["steps"] == steps and s["collectives"] == 3
            assert s["dropped_batches"] == max(0, plan[rank] - steps)
            assert s["repeated_batches"] == max(0, steps - plan[rank])
            assert s["batches"] == min(plan[rank], steps)


@pytest.mark.timeout(150)
def test_same_seed_gives_the_same_batches_across_runs_and_epochs_differ(group3):
    first, second = _records(group3, "stop:2"), _records(group3, "again")
    for a, b in zip(first, second):
        assert a["epochs"] == b["epochs"]
    assert first[0]["epochs"][0] != first[0]["epochs"][1]


@pytest.mark.timeout(150)
def test_workers_do_not_change_which_samples_a_rank_reads(group3):
    # pad yields every own batch; with 0 and 2 workers a rank reads the same samples.
    for r0, r2 in zip(_records(group3, "pad:0"), _records(group3, "pad:2")):
        for epoch in range(2):
            own0 = {k for b in r0["epochs"][epoch][:r0["stats"][epoch]["batches"]] for k in b}
            own2 = {k for b in r2["epochs"][epoch][:r2["stats"][epoch]["batches"]] for k in b}
            assert own0 == own2


@pytest.mark.timeout(150)
def test_equalize_repeat_and_drop_give_equal_shard_counts_and_declared_samples(group3):
    index = ShardIndex.read(os.path.dirname(group3["results"][0]["seed"]["gathered"][0]
                                            ["order"][0])).by_path()
    for name, equalize in (("repeat:0", "repeat"), ("drop:2", "drop")):
        records = _records(group3, name)
        _check_equal_steps(records)
        for epoch in range(2):
            assignment = records[0]["assignment"][epoch]
            assert {len(a) for a in assignment} == {3 if equalize == "repeat" else 2}
            read = collections.Counter(s for a in assignment for s in a)
            expected = sum(index[s].count * n for s, n in read.items())
            if equalize == "repeat":
                assert sum(read.values()) == 9 and sorted(read.values())[-2:] == [2, 2]
            else:
                assert sum(read.values()) == 6 and set(read.values()) == {1}
            stats = [r["stats"][epoch] for r in records]
            yielded = sum(len(b) for r in records for b in r["epochs"][epoch])
            repeats = sum(s["repeated_samples"] for s in stats)
            drops = sum(s["dropped_samples"] for s in stats)
            assert yielded - repeats + drops == expected


@pytest.mark.timeout(150)
@pytest.mark.parametrize("group, name", _ran("map"), indirect=["group"])
def test_map_style_view_gives_every_rank_equal_instances_per_step(group, name):
    records = _records(group, name)
    for epoch in range(2):
        steps = {len(r["sizes"][epoch]) for r in records}
        assert len(steps) == 1
        for sizes in records[0]["sizes"][epoch]:
            assert len(set(sizes)) == 1 and sizes[0] > 0
        keys = collections.Counter(k for r in records for b in r["keys"][epoch] for k in b)
        assert set(keys) == all_keys()
        assert sum(keys.values()) - TOTAL == records[0]["repeated"]  # the view's declared repeats


@pytest.mark.timeout(150)
@pytest.mark.parametrize("group, name", _ran("error"), indirect=["group"])
def test_a_rank_failing_mid_epoch_makes_the_others_fail_fast_naming_it(group, name):
    records = _records(group, name)
    victim, victim_rank = group["victim"], group["victim_rank"]
    failed = records[victim_rank]
    assert failed["error"] == "DataError" and os.path.basename(victim) in failed["message"]
    assert failed["stats"]["steps"] > 0  # mid-epoch
    for rank, r in enumerate(records):
        if rank == victim_rank:
            continue
        assert r["error"] == "DistributedStepError"
        assert f"rank {victim_rank} failed loading its batch for step" in r["message"]
        assert r["stats"]["steps"] == failed["stats"]["steps"]
        assert abs(r["at"] - failed["at"]) < 5.0


@pytest.mark.timeout(150)
def test_a_stalled_rank_makes_the_others_fail_within_the_timeout(group3):
    records = _records(group3, "stall")
    for r in records[:-1]:
        assert r["error"] == "DistributedStepError"
        assert "no answer within the timeout (3 s): a rank stalled" in r["message"]
        assert "rank(s) 2 did not answer a roll call" in r["message"]  # the stalled rank
        assert 2.5 <= r["at"] - r["start"] < 3 + 6.0
    assert records[-1]["error"] == "DistributedStepError"  # the sleeper too, when it wakes


@pytest.mark.timeout(150)
def test_a_rank_that_dies_makes_the_others_fail_fast_not_at_the_timeout(group2):
    alive, dead = group2["results"]
    assert "raised_at" in dead["die"]
    r = alive["die"]
    assert r["error"] == "DistributedStepError"
    assert "another rank died or left the loop (its connection closed)" in r["message"]
    assert "rank(s) 1 did not answer a roll call" in r["message"]  # issue 23: name it
    assert r["at"] - dead["die"]["raised_at"] < 10.0  # the group's timeout is 60 s


if __name__ == "__main__":
    _rank_main(*join_rank_group(timeout=60))


@pytest.mark.timeout(150)
def test_plan_with_a_rank_that_has_no_shard_stops_every_rank_naming_it(tmp_path, corpus):
    """Issue 23: one shard, two ranks, StepPlanner(target="max"/"mean") or an int: the empty
    rank raised while the other waited in its all-reduce, past EqualSteps' timeout."""
    names = ["emptyrank:max", "emptyrank:mean", "emptyrank:int"]
    results = run_group(str(tmp_path), 2, {"paths": corpus[:1], "scenarios": names})
    for name in names:
        records = [r[name] for r in results]
        messages = {r["message"] for r in records}
        assert all(r["error"] == "DistributedStepError" for r in records), records
        assert len(messages) == 1 and "yielded nothing but the plan has" in messages.pop()
        assert max(r["at"] - r["start"] for r in records) < 15  # at the epoch's start



@pytest.mark.timeout(150)
def test_few_shards_on_two_ranks_with_two_workers_sample_split_loses_nothing(tmp_path):
    """Issue 18, case 8: 2 shards on 2 ranks x 2 workers. Whole shards: rank 0 warns at the
    start with the figures (37 / 13 utterances, 24 dropped by ranks stopping together) and
    the fixes; a rank reads 37 or 13. ShardSplit(level="sample"): every sample once over the
    ranks and workers -- nothing dropped, nothing twice -- each rank's len() exact, no warning."""
    few = write_few_shards(str(tmp_path / "few"))
    results = run_group(str(tmp_path), 2, {"few": few, "scenarios": ["few:shard", "few:sample"]})
    whole = [r["few:shard"] for r in results]
    assert len(whole[0]["warned"]) == 1 and whole[1]["warned"] == []
    message = whole[0]["warned"][0]
    assert "2 shard(s) for 2 rank(s) x 1 worker(s)" in message  # started in the main process
    assert "give the ranks 37 / 13 utterances" in message or "13 / 37" in message
    assert "drop about 24 utterances (48% of the audio) per epoch" in message
    assert sorted(len(w["keys"]) for w in whole) == [13, 37]
    split = [r["few:sample"] for r in results]
    keys = split[0]["keys"] + split[1]["keys"]
    expected = [f"f0_{j:02d}" for j in range(37)] + [f"f1_{j:02d}" for j in range(13)]
    assert sorted(keys) == expected  # nothing dropped, nothing twice
    assert [len(r["keys"]) for r in split] == [r["len"] for r in split] == [25, 25]
    assert split[0]["warned"] == split[1]["warned"] == []


def test_plan_with_a_failing_rank_that_lives_on_stops_every_rank_naming_it(tmp_path, corpus):
    """Issue 23.2: with policy='plan' (no collective per step) a rank whose loader raises
    while its process lives on left the others in the training loop's all-reduce until it
    exited. Now every rank stops at the same step, well before the failing rank wakes: the
    failing one with its own error, the others naming it and its error. A failure on the
    first batch stops every rank at the epoch's agreement. Then a rank is SIGKILLed (stop
    policy): the survivors name it. Three ranks: the failure reaches rank 2 too, which shares
    no all-reduce pair with it only by chance."""
    names = ["planfail:0", "planfail:2", "kill"]
    results = run_group(str(tmp_path), 3, {"paths": corpus, "scenarios": names},
                        expect_exit={1: -9})
    for name, step in (("planfail:0", 0), ("planfail:2", 2)):
        records = [r[name] for r in results]
        failed = records[1]
        assert failed["error"] == "DataError" and "data-00003.tar" in failed["message"]
        assert len({r["stats"]["steps"] for r in records}) == 1  # all stopped at one step
        assert failed["stats"]["steps"] == step + (step > 0)  # the failure's step, + a stand-in
        for r in (records[0], records[2]):
            assert r["error"] == "DistributedStepError", r
            what = "its first batch" if step == 0 else f"its batch for step {step}"
            assert f"rank 1 failed loading {what}" in r["message"]
            assert "DataError: data-00003.tar (key 's3_4'): cannot decode" in r["message"]
            assert r["at"] - failed["at"] < 5.0 and r["at"] < failed["woke"] - 8
    alive = [results[0]["kill"], results[2]["kill"]]
    for r in alive:
        assert r["error"] == "DistributedStepError"
        assert "rank(s) 1 did not answer a roll call" in r["message"]
        assert r["at"] - results[1]["kill"]["raised_at"] < 10.0
