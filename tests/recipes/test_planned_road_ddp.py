"""The recipes' planned road on real gloo groups: ``train_pipeline(streams=4)`` (issue 29).

The demo corpus (36 real FLAC utterances) prepared into a local manifest, trained with speed
perturbation (0.9, 1.0, 1.1) and noise (the corpus's own utterances, p = 0.5), 80-bin fbank
with dither 1.0 (drawn in the workers, per utterance and epoch),
through ``build_loader`` in groups of 1 and 2 ranks (one subprocess per rank,
``tcp://127.0.0.1``) with 0, 1 and 2 DataLoader workers. Phase 1 runs two unbroken epochs per
(W, K) and lets rank 0 save ``loader.state_dict()`` at chosen steps; phase 2 loads rank 0's
state on every rank of another topology (W', K') and runs the rest of the epoch and the next.

Invariants:
- for W in {1, 2} x K in {0, 2} (and 2 x 1), rank r trains at step s on global batch
  ``s * W + r`` of one sequence: byte-identical tensors (sha256 of every tensor and the keys);
- the moves 2x2 -> 1x0, 1x0 -> 2x1 and 2x1 -> 1x2 give the rest of the unbroken epoch
  (every remaining batch once over the ranks: no sample twice, none lost) and then the next
  epoch exactly; no run hangs (hard timeouts).
"""

from __future__ import annotations

import json

import pytest

from speechpipe.testing import batch_digest, join_rank_group, run_ranks

WORKERS = {1: (0, 2), 2: (0, 1, 2)}
#: (W, K) saved -> (W', K') resumed, at a step of epoch 0.
PAIRS = [((2, 2), (1, 0), 3), ((1, 0), (2, 1), 5), ((2, 1), (1, 2), 2)]
PROCESS_TIMEOUT = 400


def digest(batch: dict) -> str:
    return batch_digest(batch, 20)


def make_pipe(manifest: str):
    import speechpipe as sp

    return sp.train_pipeline(manifest, budget=20.0, streams=4, seed=5,
                             speed_perturb=(0.9, 1.0, 1.1), noise=[manifest], noise_p=0.5,
                             feature_options={"dither": 1.0})


def run_epochs(loader, save_at=()) -> tuple[list, dict]:
    passes, states = [], {}
    for _ in range(2):
        seen = []
        for step, batch in enumerate(loader):
            seen.append([digest(batch), list(batch["key"])])
            if not passes and step in save_at:
                states[str(step)] = loader.state_dict()
        passes.append(seen)
    return passes, states


def _rank_main(rank: int, world: int, ctx: dict, out: str) -> None:
    import torch.distributed as dist

    import speechpipe as sp

    results: dict = {}
    if ctx["phase"] == 1:
        for workers in WORKERS[world]:
            saves = [at for (saved, _, at) in PAIRS if saved == (world, workers)]
            loader = sp.build_loader(make_pipe(ctx["manifest"]), num_workers=workers, seed=0)
            passes, states = run_epochs(loader, saves)
            results[str(workers)] = {"passes": passes, "states": states if rank == 0 else {}}
            dist.barrier()
    else:
        for i, (_, (w, workers), _) in enumerate(PAIRS):
            if w != world:
                continue
            loader = sp.build_loader(make_pipe(ctx["manifest"]), num_workers=workers, seed=0)
            loader.load_state_dict(ctx["states"][i])  # rank 0's, on every rank
            epoch = loader.epoch
            passes, _ = run_epochs(loader)
            results[str(i)] = {"passes": passes, "epoch": epoch}
            dist.barrier()
    with open(out, "w") as f:
        json.dump(results, f)
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from speechpipe.demo import DEMO_CORPUS
    from speechpipe.recipes.librispeech import prepare_librispeech

    tmp = str(tmp_path_factory.mktemp("planned_ddp"))
    manifest = str(prepare_librispeech(DEMO_CORPUS, tmp, parts=["dev-clean"],
                                       progress=False)["dev-clean"])

    def group(world: int, ctx: dict) -> list[dict]:
        return run_ranks(__file__, world, ctx, tmp, f"{ctx['phase']}-{world}",
                         timeout=PROCESS_TIMEOUT, env={"OMP_NUM_THREADS": "1"})

    unbroken = {w: group(w, {"manifest": manifest, "phase": 1}) for w in WORKERS}
    states = [unbroken[w][0][str(k)]["states"][str(at)] for (w, k), _, at in PAIRS]
    resumed = {w: group(w, {"manifest": manifest, "phase": 2, "states": states})
               for w in WORKERS}
    return unbroken, states, resumed


def expected(sequence: list, world: int, rank: int, start: int = 0) -> list:
    """Rank ``rank`` of ``world`` from global batch ``start``: step s gets batch
    ``start + s * world + rank``, past the end the epoch's first ones (pad)."""
    n = len(sequence)
    steps = -(-max(0, n - start) // world)
    return [sequence[(start + s * world + rank) % n] for s in range(steps)]


@pytest.mark.timeout(1200)
def test_every_world_and_worker_count_trains_on_the_same_global_batches(runs):
    unbroken, _, _ = runs
    sequences = [[d for d, _ in epoch] for epoch in unbroken[1][0]["0"]["passes"]]
    assert sequences[0] != sequences[1] and len(sequences[0]) >= 10
    for world, counts in WORKERS.items():
        for workers in counts:
            for rank in range(world):
                passes = unbroken[world][rank][str(workers)]["passes"]
                for epoch, sequence in enumerate(sequences):
                    got = [d for d, _ in passes[epoch]]
                    assert got == expected(sequence, world, rank), (world, workers, rank, epoch)


@pytest.mark.timeout(1200)
def test_a_state_moves_between_topologies_with_nothing_twice_and_nothing_lost(runs):
    unbroken, states, resumed = runs
    sequences = [[d for d, _ in epoch] for epoch in unbroken[1][0]["0"]["passes"]]
    keys = {d: k for epoch in unbroken[1][0]["0"]["passes"] for d, k in epoch}
    for i, ((w, k), (w2, k2), at) in enumerate(PAIRS):
        state, start = states[i], (at + 1) * w
        assert state["batches"] == start and state["epoch"] == 0
        ranks = [resumed[w2][r][str(i)] for r in range(w2)]
        for r, run in enumerate(ranks):
            assert run["epoch"] == 0
            assert [d for d, _ in run["passes"][0]] == expected(sequences[0], w2, r, start), (
                (w, k), (w2, k2), r)
            assert [d for d, _ in run["passes"][1]] == expected(sequences[1], w2, r)
        n = len(sequences[0])
        real = [d for r, run in enumerate(ranks) for s, (d, _) in enumerate(run["passes"][0])
                if start + s * w2 + r < n]
        assert sorted(real) == sorted(sequences[0][start:])
        before = [key for d in sequences[0][:start] for key in keys[d]]
        after = [key for d in real for key in keys[d]]
        assert len(after) == len(set(after)) and not set(before) & set(after)
        assert len(before) + len(after) == 36  # the corpus once: none twice, none lost


if __name__ == "__main__":
    _rank_main(*join_rank_group(timeout=200))
