"""ViewSampler over virtual streams on real gloo groups: the map-style DataLoader road (issue 29).

``StatefulDataLoader(dataset, batch_sampler=view.sampler())`` over ``BatchView(streams=4)`` in
groups of 1 and 2 ranks with 0 and 2 workers (the sampler takes its rank and world size from
``torch.distributed``). ``build_loader`` takes iterable pipelines only (a map-style dataset goes
through ``batch_by_view``, tests/batching/test_view_streams_ddp.py), so these tests drive
torchdata's ``StatefulDataLoader`` directly, as a map-style training script does.

Invariants: every (W, K) trains at step ``s`` on global batches ``sW .. sW+W-1`` of one sequence
(byte-identical tensors); the ``StatefulDataLoader`` state rank 0 saved under (W, K) -- with
steps taken after its last snapshot -- given to every rank's sampler under (W', K') resumes
the rest of the unbroken epoch (each remaining batch once over the ranks: no key twice, none
lost) and then the next epoch exactly.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_virtual_streams_ddp import expected  # noqa: E402
from speechpipe.testing import batch_digest, join_rank_group, run_ranks  # noqa: E402

WORLDS = (1, 2)
WORKERS = (0, 2)
SNAPSHOT_EVERY = 3  # with workers: a state between two snapshots counts the steps since
#: (W, K) saved -> (W', K') resumed, after this step of epoch 0.
PAIRS = [((2, 2), (1, 0), 4), ((1, 0), (2, 1), 9)]

LENGTHS = {f"m{i:03d}": 1.0 + (i * 11) % 17 / 4 for i in range(160)}


class Corpus(torch.utils.data.Dataset):
    """A map-style dataset indexed by key: a sample of ``10 * duration`` values from its key."""

    def __getitem__(self, key):
        n = int(LENGTHS[key] * 10)
        return {"key": key, "x": np.full(n, int(key[1:]), np.float32)}


def collate(samples: list) -> dict:
    n = max(len(s["x"]) for s in samples)
    x = torch.zeros(len(samples), n)
    for i, s in enumerate(samples):
        x[i, :len(s["x"])] = torch.from_numpy(s["x"])
    return {"key": [s["key"] for s in samples], "x": x}


def make_view():
    import speechpipe as sp

    return sp.BatchView(LENGTHS, budget=20.0, streams=4, seed=3)


def make_loader(sampler, workers: int):
    from torchdata.stateful_dataloader import StatefulDataLoader

    return StatefulDataLoader(Corpus(), batch_sampler=sampler, num_workers=workers,
                              collate_fn=collate, snapshot_every_n_steps=SNAPSHOT_EVERY)


def _epoch(loader, save_at=None, path=None) -> list:
    seen = []
    for step, batch in enumerate(loader):
        seen.append([batch_digest(batch, 20), list(batch["key"])])
        if step == save_at and path is not None:
            torch.save(loader.state_dict(), path)
    return seen


def _rank_main(rank: int, world: int, ctx: dict, out: str) -> None:
    import torch.distributed as dist

    results: dict = {}
    for i, (saved, (w2, k2), at) in enumerate(PAIRS):
        if ctx["phase"] == 1:
            continue
        if w2 == world:  # every rank loads rank 0's state into its own sampler
            sampler = make_view().sampler()
            sampler.load_state_dict(torch.load(os.path.join(ctx["folder"], f"state{i}.pt"),
                                               weights_only=False))
            loader = make_loader(sampler, k2)
            epoch = sampler.epoch
            record = {"epoch": epoch, "len": len(loader), "passes": [_epoch(loader)]}
            sampler.set_epoch(epoch + 1)
            record["passes"].append(_epoch(loader))
            results[str(i)] = record
            dist.barrier()
    if ctx["phase"] == 1:
        for workers in WORKERS:
            sampler = make_view().sampler()
            loader = make_loader(sampler, workers)
            saves = [(i, at) for i, (saved, _, at) in enumerate(PAIRS)
                     if saved == (world, workers)]
            passes, lengths = [], []
            for epoch in range(2):
                sampler.set_epoch(epoch)
                lengths.append(len(loader))
                i, at = saves[0] if saves and epoch == 0 else (None, None)
                path = os.path.join(ctx["folder"], f"state{i}.pt") if rank == 0 else None
                passes.append(_epoch(loader, at, path))
            results[str(workers)] = {"passes": passes, "lens": lengths}
            dist.barrier()
    with open(out, "w") as f:
        json.dump(results, f)
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("view_sampler_ddp"))
    env = {"OMP_NUM_THREADS": "1"}
    unbroken = {w: run_ranks(__file__, w, {"phase": 1, "folder": tmp}, tmp, f"1-{w}",
                             timeout=240, env=env) for w in WORLDS}
    resumed = {w: run_ranks(__file__, w, {"phase": 2, "folder": tmp}, tmp, f"2-{w}",
                            timeout=240, env=env) for w in WORLDS}
    return unbroken, resumed


def _sequences(unbroken) -> list:
    return [[d for d, _ in epoch] for epoch in unbroken[1][0]["0"]["passes"]]


@pytest.mark.timeout(600)
def test_the_sampler_gives_every_world_and_worker_count_the_same_global_batches(runs):
    unbroken, _ = runs
    sequences = _sequences(unbroken)
    view = make_view()
    assert [view.batches(e) for e in range(2)] == [
        [k for _, k in epoch] for epoch in unbroken[1][0]["0"]["passes"]]
    assert sequences[0] != sequences[1] and len(sequences[0]) > 20
    for world in WORLDS:
        for workers in WORKERS:
            for rank in range(world):
                run = unbroken[world][rank][str(workers)]
                for epoch, sequence in enumerate(sequences):
                    got = [d for d, _ in run["passes"][epoch]]
                    assert got == expected(sequence, world, rank), (world, workers, rank, epoch)
                    assert run["lens"][epoch] == len(got) == -(-len(sequence) // world)


@pytest.mark.timeout(600)
def test_a_sampler_state_saved_on_one_topology_resumes_exactly_on_another(runs):
    unbroken, resumed = runs
    sequences = _sequences(unbroken)
    keys = {d: k for epoch in unbroken[1][0]["0"]["passes"] for d, k in epoch}
    for i, ((w, k), (w2, k2), at) in enumerate(PAIRS):
        start, n = (at + 1) * w, len(sequences[0])
        ranks = [resumed[w2][r][str(i)] for r in range(w2)]
        for r, run in enumerate(ranks):
            assert run["epoch"] == 0
            rest = [d for d, _ in run["passes"][0]]
            assert rest == expected(sequences[0], w2, r, start), ((w, k), (w2, k2), r)
            assert run["len"] == len(rest)
            assert [d for d, _ in run["passes"][1]] == expected(sequences[1], w2, r)
        real = [d for r, run in enumerate(ranks) for s, (d, _) in enumerate(run["passes"][0])
                if start + s * w2 + r < n]
        assert sorted(real) == sorted(sequences[0][start:])  # every remaining batch once
        samples = [key for d in real for key in keys[d]]
        assert len(samples) == len(set(samples))  # no key twice
        done = {key for d in sequences[0][:start] for key in keys[d]}
        assert done | set(samples) == set(LENGTHS) and not done & set(samples)  # none lost


if __name__ == "__main__":
    _rank_main(*join_rank_group())
