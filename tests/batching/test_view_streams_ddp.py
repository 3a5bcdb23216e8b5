"""BatchView over virtual streams on real gloo groups and DataLoader workers (issue 29).

``batch_by_view`` over ``BatchView(streams=4)`` through ``build_loader`` in groups of 1, 2 and
4 ranks with 0 and 2 workers: every (W, K) trains at step ``s`` on batches ``sW .. sW+W-1`` of
one global sequence (byte-identical tensors), and a state rank 0 saved under (W, K) resumes
every rank of another (W', K') on the rest of the unbroken epoch and then the next one.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_virtual_streams import view_pipe  # noqa: E402
from test_virtual_streams_ddp import expected, run_epochs  # noqa: E402
from speechpipe.testing import join_rank_group, run_ranks  # noqa: E402

WORLDS = (1, 2, 4)
WORKERS = (0, 2)
#: (W, K) saved -> (W', K') resumed, at a step of epoch 0 or "end" (after epoch 0).
PAIRS = [((2, 2), (1, 0), 4), ((1, 0), (4, 2), 9), ((4, 2), (2, 0), 2), ((1, 2), (2, 2), 0),
         ((2, 0), (4, 0), "end"), ((4, 0), (1, 2), 1)]


def _rank_main(rank: int, world: int, ctx: dict, out: str) -> None:
    import torch.distributed as dist

    import speechpipe as sp

    results: dict = {}
    if ctx["phase"] == 1:
        for workers in WORKERS:
            saves = [at for (saved, _, at) in PAIRS if saved == (world, workers)]
            loader = sp.build_loader(view_pipe(), num_workers=workers, seed=0)
            passes, states = run_epochs(loader, 2, saves)
            results[str(workers)] = {"passes": passes, "states": states if rank == 0 else {}}
            dist.barrier()
    else:
        for i, (_, (w, workers), _) in enumerate(PAIRS):
            if w == world:
                loader = sp.build_loader(view_pipe(), num_workers=workers, seed=0)
                loader.load_state_dict(ctx["states"][i])  # rank 0's, on every rank
                results[str(i)] = {"epoch": loader.epoch, "passes": run_epochs(loader, 2)[0]}
                dist.barrier()
    with open(out, "w") as f:
        json.dump(results, f)
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("view_ddp"))
    env = {"OMP_NUM_THREADS": "1"}
    unbroken = {w: run_ranks(__file__, w, {"phase": 1}, tmp, f"1-{w}", timeout=240, env=env)
                for w in WORLDS}
    states = [unbroken[saved[0]][0][str(saved[1])]["states"][str(at)]
              for saved, _, at in PAIRS]
    resumed = {w: run_ranks(__file__, w, {"phase": 2, "states": states}, tmp, f"2-{w}",
                            timeout=240, env=env) for w in WORLDS}
    return unbroken, states, resumed


@pytest.mark.timeout(900)
def test_every_world_and_worker_count_trains_on_the_same_view_batches(runs):
    unbroken, _, _ = runs
    sequences = [[d for d, _ in epoch] for epoch in unbroken[1][0]["0"]["passes"]]
    assert sequences[0] != sequences[1] and len(sequences[0]) > 20
    for world in WORLDS:
        for workers in WORKERS:
            for rank in range(world):
                passes = unbroken[world][rank][str(workers)]["passes"]
                for epoch, sequence in enumerate(sequences):
                    got = [d for d, _ in passes[epoch]]
                    assert got == expected(sequence, world, rank), (world, workers, rank, epoch)


@pytest.mark.timeout(900)
def test_a_view_state_saved_on_one_topology_resumes_exactly_on_another(runs):
    unbroken, states, resumed = runs
    sequences = [[d for d, _ in epoch] for epoch in unbroken[1][0]["0"]["passes"]]
    keys = {d: k for epoch in unbroken[1][0]["0"]["passes"] for d, k in epoch}
    for i, ((w, k), (w2, k2), at) in enumerate(PAIRS):
        start = 0 if at == "end" else (at + 1) * w
        epoch = 1 if at == "end" else 0
        assert (states[i]["batches"], states[i]["epoch"]) == (start, epoch)
        ranks = [resumed[w2][r][str(i)] for r in range(w2)]
        for r, run in enumerate(ranks):
            assert run["epoch"] == epoch
            assert [d for d, _ in run["passes"][0]] == expected(sequences[epoch], w2, r, start), (
                (w, k), (w2, k2), at, r)
            if epoch == 0:
                assert [d for d, _ in run["passes"][1]] == expected(sequences[1], w2, r)
        n = len(sequences[epoch])
        real = [d for r, run in enumerate(ranks) for s, (d, _) in enumerate(run["passes"][0])
                if start + s * w2 + r < n]
        assert sorted(real) == sorted(sequences[epoch][start:])
        samples = [key for d in real for key in keys[d]]
        assert len(samples) == len(set(samples))


if __name__ == "__main__":
    _rank_main(*join_rank_group())
