"""ViewSampler over virtual streams and views over streams with two-dimensional lengths (issue 29).

In one process, ranks given as arguments (real gloo groups: tests/batching/
test_view_sampler_ddp.py): the map-style DataLoader's ``batch_sampler`` serves rank ``r`` of
``W`` the global batches ``sW + r`` of a ``BatchView(streams=V)``'s plan with any number of
workers, counts its steps exactly, saves one global position inside torchdata's
``StatefulDataLoader`` state and resumes it on another topology; a state of another view is
refused by name. A view over streams takes ``(input, output)`` pairs under ``TwoDimensional``
(and ``SampleCount``) as a view without streams does.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from torchdata.stateful_dataloader import StatefulDataLoader

import speechpipe as sp
from speechpipe.pipes.batching import BatchStats, SampleCount, TwoDimensional
from speechpipe.testing import batch_digest

LENGTHS = {f"m{i:03d}": 1.0 + (i * 11) % 17 / 4 for i in range(150)}
DATA = {k: {"key": k, "x": np.full(int(v * 10), i, np.float32)}
        for i, (k, v) in enumerate(LENGTHS.items())}


def collate(samples: list) -> dict:
    n = max(len(s["x"]) for s in samples)
    x = torch.zeros(len(samples), n)
    for i, s in enumerate(samples):
        x[i, :len(s["x"])] = torch.from_numpy(s["x"])
    return {"key": [s["key"] for s in samples], "x": x}


def view(**change) -> sp.BatchView:
    options = dict(budget=20.0, streams=4, seed=3)
    options.update(change)
    lengths = options.pop("lengths", LENGTHS)
    return sp.BatchView(lengths, **options)


def loader(sampler, workers: int = 0, **options) -> StatefulDataLoader:
    return StatefulDataLoader(sp.SequenceWrapper(DATA), batch_sampler=sampler,
                              num_workers=workers, collate_fn=collate, **options)


def digests(batches) -> list:
    return [batch_digest(b, 20) for b in batches]


def expected(sequence: list, world: int, rank: int, start: int = 0, uneven: str = "pad"
             ) -> list:
    n = len(sequence)
    left = max(0, n - start)
    steps = -(-left // world) if uneven == "pad" else left // world
    return [sequence[(start + s * world + rank) % n] for s in range(steps)]


# --------------------------------------------------------------------------- serving


@pytest.mark.parametrize("uneven", ["pad", "drop"])
def test_the_sampler_serves_each_rank_its_global_batches_for_any_worker_count(uneven):
    v = view(uneven=uneven)
    reference = digests(loader(v.sampler(1)))  # epoch 1, one process
    assert [b for b in v.batches(1)] == [list(b["key"]) for b in loader(v.sampler(1))]
    n = len(reference)
    assert n == len(v.plan(1)) and n % 4  # the last step of 4 ranks is uneven
    for world in (1, 2, 4):
        for workers in (0, 2):
            for rank in range(world):
                sampler = v.sampler(1, rank=rank, world_size=world)
                got = digests(loader(sampler, workers))
                assert got == expected(reference, world, rank, uneven=uneven), (
                    world, workers, rank)
                assert len(sampler) == len(got)
                assert len(sampler) == (-(-n // world) if uneven == "pad" else n // world)


def test_the_sampler_takes_its_rank_from_the_process(monkeypatch):
    v = view()
    reference = v.batches(0)
    monkeypatch.setattr("speechpipe.seeding._pinned", (1, 2))
    sampler = v.sampler()
    assert list(sampler) == expected(reference, 2, 1) and len(sampler) == -(-len(reference) // 2)
    with pytest.raises(ValueError, match="rank must be an int in"):
        v.sampler(rank=2, world_size=2)


# --------------------------------------------------------------------------- state


@pytest.mark.parametrize("saved, resumed, at", [
    ((2, 2), (1, 0), 4), ((1, 0), (2, 1), 9), ((4, 2), (3, 0), 1), ((1, 2), (4, 2), 0)])
def test_a_dataloader_state_resumes_on_another_topology_through_the_sampler(saved, resumed, at):
    v = view()
    reference = [digests(loader(v.sampler(e))) for e in range(2)]
    keys = [v.batches(e) for e in range(2)]
    world, workers = saved
    sampler = v.sampler(0, rank=0, world_size=world)
    running = loader(sampler, workers, snapshot_every_n_steps=3)
    for step, _ in enumerate(running):
        if step == at:
            state = running.state_dict()
            break
    start, n = (at + 1) * world, len(reference[0])
    if workers:  # between two snapshots: the steps since the last one count
        assert state["_steps_since_snapshot"] == (at + 1) % 3
    world2, workers2 = resumed
    real = []
    for rank in range(world2):
        sampler = v.sampler(rank=rank, world_size=world2)
        sampler.load_state_dict(state)
        sampler.set_epoch(0)  # the loaded epoch: the position stays
        assert (sampler.epoch, sampler.start_step) == (0, start)
        rest = loader(sampler, workers2)
        assert len(rest) == -(-(n - start) // world2)
        got = digests(rest)
        assert got == expected(reference[0], world2, rank, start)
        real += [k for s, b in enumerate(expected(keys[0], world2, rank, start))
                 if start + s * world2 + rank < n for k in b]
        sampler.set_epoch(1)  # the next epoch from its start
        assert digests(rest) == expected(reference[1], world2, rank)
    done = [k for b in keys[0][:start] for k in b]
    assert len(real) == len(set(real)) and sorted(done + real) == sorted(LENGTHS)


@pytest.mark.parametrize("workers", [0, 2])
def test_the_dataloaders_own_restore_on_the_same_topology_goes_through_the_sampler(workers):
    v = view()
    reference = digests(loader(v.sampler(0, rank=1, world_size=2)))
    sampler = v.sampler(0, rank=1, world_size=2)
    running = loader(sampler, workers, snapshot_every_n_steps=2)
    taken = []
    for step, batch in enumerate(running):
        taken.append(batch_digest(batch, 20))
        if step == 4:
            state = running.state_dict()
            break
    own = (state["_snapshot"]["_main_snapshot"] if workers else state)["_index_sampler_state"]
    assert own["epoch"] == 0 and own["world_size"] == 2
    assert own["batches"] == (10 if not workers else 8)  # with workers: the last snapshot's
    again = v.sampler(0, rank=1, world_size=2)
    restored = loader(again, workers, snapshot_every_n_steps=2)
    restored.load_state_dict(state)
    assert taken + digests(restored) == reference


def test_a_state_after_the_epoch_stands_at_its_end_and_an_unstarted_one_at_its_start():
    for uneven in ("pad", "drop"):
        v = view(uneven=uneven)
        sampler = v.sampler(0, rank=0, world_size=4)
        list(loader(sampler))
        assert sampler.state_dict()["batches"] == len(v.plan(0))  # the epoch consumed
        resumed = v.sampler(rank=0, world_size=1)
        resumed.load_state_dict(sampler.state_dict())
        assert len(resumed) == 0 and list(resumed) == []
    sampler = v.sampler(1, start_step=5)
    assert (sampler.state_dict()["epoch"], sampler.state_dict()["batches"]) == (1, 5)


def test_a_state_of_another_view_is_refused_by_name():
    sampler = view().sampler(0)
    it = iter(sampler)
    next(it), next(it)
    state = sampler.state_dict()
    changed_lengths = dict(LENGTHS, m007=LENGTHS["m007"] + 0.25)
    for change, named in ((dict(budget=15.0), "constraint.budget: 20.0 -> 15.0"),
                          (dict(seed=4), "seed: 3 -> 4"), (dict(streams=5), "streams: 4 -> 5"),
                          (dict(uneven="drop"), "uneven: 'pad' -> 'drop'"),
                          (dict(lengths=changed_lengths), "lengths: 150 items")):
        with pytest.raises(sp.ResumeError, match="another view") as error:
            view(**change).sampler().load_state_dict(state)
        assert named in str(error.value), (change, str(error.value))
        assert len(error.value.differences) == 1
    with pytest.raises(sp.DataError, match="past the end of epoch 0"):
        view().sampler().load_state_dict({**state, "batches": len(view().plan(0)) + 1})
    with pytest.raises(TypeError, match="no ViewSampler state"):
        view().sampler().load_state_dict({"_num_yielded": 3, "_index_sampler_state": None})
    with pytest.raises(sp.ResumeError, match="fingerprint"):
        view().sampler().load_state_dict({"epoch": 0, "batches": 2})


def test_a_sampler_without_streams_saves_its_position_too():
    v = sp.BatchView(LENGTHS, budget=20.0, seed=3, world_size=2)
    reference = digests(loader(v.sampler(1, rank=1)))
    sampler = v.sampler(1, rank=1)
    running = loader(sampler, 2)
    for step, _ in enumerate(running):
        if step == 3:
            state = running.state_dict()
            break
    again = v.sampler(rank=1)
    again.load_state_dict(state)
    assert again.epoch == 1 and digests(loader(again)) == reference[4:]
    with pytest.raises(sp.ResumeError, match="world_size: 2 -> 1"):
        sp.BatchView(LENGTHS, budget=20.0, seed=3).sampler().load_state_dict(state)


# --------------------------------------------------------------------------- two dimensions


def pair_lengths(n: int = 160) -> dict:
    rng = random.Random(7)
    return {f"p{i:03d}": (rng.randint(40, 300), rng.randint(3, 60)) for i in range(n)}


PAIRS = pair_lengths()
PAIR_DATA = {k: {"key": k, "x": torch.full((a,), i, dtype=torch.float32),
                 "y": torch.full((b,), i % 97, dtype=torch.int64)}
             for i, (k, (a, b)) in enumerate(PAIRS.items())}


def pad_pairs(samples: list) -> dict:
    x = torch.nn.utils.rnn.pad_sequence([s["x"] for s in samples], batch_first=True)
    y = torch.nn.utils.rnn.pad_sequence([s["y"] for s in samples], batch_first=True)
    return {"key": [s["key"] for s in samples], "x": x, "y": y}


def test_a_two_dimensional_view_over_streams_batches_within_both_budgets():
    budget = TwoDimensional(budget_in=1500, budget_out=240)
    lengths = dict(PAIRS, p000=(90, 300))  # its output alone is over the budget
    v = sp.BatchView(lengths, budget=budget, streams=4, seed=1)
    for epoch in range(2):
        batches = v.batches(epoch)
        assert sorted(k for b in batches for k in b) == sorted(lengths)  # each key once
        for batch in batches:
            if len(batch) > 1:
                assert len(batch) * max(lengths[k][0] for k in batch) <= 1500
                assert len(batch) * max(lengths[k][1] for k in batch) <= 240
        assert ["p000"] in batches  # emitted alone
        assert max(map(len, batches)) > 2
    assert v.batches(0) != v.batches(1)
    # the statistics of a view without streams: padding on the input side, the constraint's
    # cost, oversize samples
    stats = BatchStats("plan_batches")
    for batch in v.batching_view:
        stats.add_batch([lengths[k] for k in batch], budget)
    assert v.stats.efficiency == pytest.approx(stats.efficiency) and v.stats.efficiency > 0.9
    assert (v.stats.real, v.stats.padded, v.stats.largest_cost, sorted(v.stats.sizes)) == (
        stats.real, stats.padded, stats.largest_cost, sorted(stats.sizes))  # sizes: packed order
    assert v.stats.oversize_emitted == 1 and v.stats.over_budget == 0
    dropped = sp.BatchView(lengths, budget=budget, streams=4, seed=1, oversize="drop")
    assert dropped.stats.oversize_dropped == 1
    assert "p000" not in {k for b in dropped.batching_view for k in b}
    with pytest.raises(ValueError, match="PaddedArea needs numbers as lengths"):
        sp.BatchView(PAIRS, budget=sp.PaddedArea(100), streams=2)
    with pytest.raises(ValueError, match=r"TwoDimensional needs \(input, output\) pairs"):
        sp.BatchView(LENGTHS, budget=budget, streams=2)


def test_a_two_dimensional_view_over_streams_is_the_same_for_any_topology(monkeypatch):
    v = sp.BatchView(PAIRS, budget=TwoDimensional(1500, 240), streams=4, seed=2)

    def pairs_loader(sampler, workers):
        return StatefulDataLoader(sp.SequenceWrapper(PAIR_DATA), batch_sampler=sampler,
                                  num_workers=workers, collate_fn=pad_pairs)

    reference = digests(pairs_loader(v.sampler(0), 0))
    assert len(reference) > 20
    for world in (1, 2, 3):
        for workers in (0, 2):
            for rank in range(world):
                got = digests(pairs_loader(v.sampler(0, rank=rank, world_size=world), workers))
                assert got == expected(reference, world, rank), ("sampler", world, workers, rank)
                monkeypatch.setattr("speechpipe.seeding._pinned", (rank, world))
                pipe = sp.SequenceWrapper(PAIR_DATA).batch_by_view(v).collate(
                    collate_fn=pad_pairs)
                got = digests(sp.build_loader(pipe, num_workers=workers, seed=0))
                monkeypatch.setattr("speechpipe.seeding._pinned", None)
                assert got == expected(reference, world, rank), ("pipe", world, workers, rank)


def test_a_count_over_pairs_plans_on_the_input_side():
    v = sp.BatchView(PAIRS, budget=SampleCount(4), streams=3, seed=0)
    batches = v.batching_view
    assert sorted(k for b in batches for k in b) == sorted(PAIRS)
    assert max(map(len, batches)) == 4
    inputs = sp.BatchView({k: a for k, (a, _) in PAIRS.items()}, budget=SampleCount(4),
                          streams=3, seed=0)
    assert batches == inputs.batching_view and v.stats.padded == inputs.stats.padded
