"""Virtual streams on real gloo groups and DataLoader workers (issue 29).

``plan_batches`` over shards (a real index) and over mapped manifest rows, through
``build_loader`` with 0, 1, 2 and 4 workers in groups of 1, 2 and 4 ranks (one subprocess per
rank, ``tcp://127.0.0.1``). Phase 1 runs two unbroken epochs for every (W, K) and lets rank 0
save ``loader.state_dict()`` at chosen steps (and after epoch 0); phase 2 builds loaders on
other topologies (W', K'), loads those states and runs the rest of the epoch and the next one.

Invariants:
- for a fixed seed, every (W, K) trains at step ``s`` on batches ``sW .. sW+W-1`` of one global
  sequence -- byte-identical tensors and keys -- (the last step repeats the epoch's first
  batches: ``uneven="pad"``), and every rank takes the same number of steps;
- a state saved by rank 0 under (W, K) and loaded by every rank under (W', K') gives the rest
  of the unbroken epoch -- every remaining batch once over the ranks, no sample twice, none
  lost -- and then the next epoch exactly; no run hangs (hard timeouts).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_virtual_streams import (  # noqa: E402
    collate, row_pipe, shard_pipe, write_rows, write_shards,
)
from speechpipe.testing import join_rank_group, run_ranks  # noqa: E402

WORLDS = (1, 2, 4)
WORKERS = (0, 1, 2, 4)
ROADS = ("shards", "rows")
PROCESS_TIMEOUT = 240  # seconds a whole group may take
#: (W, K) -> (W', K') resumed, and where: a step of epoch 0, or "end" (after epoch 0).
PAIRS = [((2, 2), (4, 1), 5), ((4, 1), (1, 0), 3), ((1, 0), (2, 2), 11), ((1, 2), (4, 4), 7),
         ((2, 0), (1, 4), 9), ((4, 2), (2, 1), 2), ((1, 4), (2, 0), 17), ((2, 1), (1, 1), 4),
         ((4, 4), (4, 0), 6), ((2, 4), (4, 2), 1), ((1, 1), (1, 2), 0), ((4, 0), (2, 4), 4),
         ((2, 2), (1, 0), "end"), ((1, 0), (4, 2), "end")]


def digest(batch: dict) -> str:
    """Keys and the tensor's bytes, dtype and shape: equal only for byte-identical batches."""
    x = batch["x"]
    h = hashlib.sha256(json.dumps(list(batch["key"])).encode())
    h.update(f"{x.dtype}{tuple(x.shape)}".encode())
    h.update(x.numpy().tobytes())
    return h.hexdigest()[:20]


#: The derived default (streams="auto" over 150 rows with buckets of 2: several streams,
#: fewer than 8), phase 1 only.
AUTO_ROAD, AUTO_WORKERS = "rows-auto", (0, 2)


def auto_pipe(rows: str, streams="auto"):
    import speechpipe as sp

    return sp.IterableWrapper([rows]).read_manifest_files().plan_batches(
        budget=20.0, streams=streams, seed=0, bucket_buffer=2, shuffle_window=5).collate(
            collate_fn=collate)


def make_pipe(ctx: dict, road: str):
    if road == AUTO_ROAD:
        return auto_pipe(ctx["rows"])
    return shard_pipe(ctx["shards"]) if road == "shards" else row_pipe(ctx["rows"])


def run_epochs(loader, epochs: int, save_at=()) -> tuple[list, dict]:
    """``epochs`` passes (the loader's epoch on): each pass's batch digests and keys, and the
    states taken after each step of ``save_at`` in the first pass (or after it, ``"end"``),
    by ``str(step)``."""
    passes, states = [], {}
    for _ in range(epochs):
        seen = []
        for step, batch in enumerate(loader):
            seen.append([digest(batch), list(batch["key"])])
            if not passes and step in save_at:
                states[str(step)] = loader.state_dict()
        passes.append(seen)
        if len(passes) == 1 and "end" in save_at:
            states["end"] = loader.state_dict()
    return passes, states


def _rank_main(rank: int, world: int, ctx: dict, out: str) -> None:
    import torch.distributed as dist

    import speechpipe as sp

    results: dict = {}
    for road in ROADS + ((AUTO_ROAD,) if ctx["phase"] == 1 else ()):
        if ctx["phase"] == 1:
            for workers in (WORKERS if road != AUTO_ROAD else AUTO_WORKERS):
                saves = [at for (saved, _, at) in PAIRS if saved == (world, workers)]
                loader = sp.build_loader(make_pipe(ctx, road), num_workers=workers, seed=0)
                passes, states = run_epochs(loader, 2, saves)
                results[f"{road}/{workers}"] = {"passes": passes,
                                                "states": states if rank == 0 else {}}
                dist.barrier()
        else:
            for i, (saved, (w, workers), _) in enumerate(PAIRS):
                if w != world:
                    continue
                loader = sp.build_loader(make_pipe(ctx, road), num_workers=workers, seed=0)
                loader.load_state_dict(ctx["states"][road][i])  # rank 0's, on every rank
                epoch = loader.epoch
                passes, _ = run_epochs(loader, 2)
                results[f"{road}/{i}"] = {"passes": passes, "epoch": epoch}
                dist.barrier()
    with open(out, "w") as f:
        json.dump(results, f)
    dist.destroy_process_group()


def run_group(tmp: str, world: int, ctx: dict) -> list[dict]:
    """``ctx`` in a fresh gloo group of ``world`` subprocesses: each rank's results. Every
    process is killed after PROCESS_TIMEOUT seconds (never hangs)."""
    return run_ranks(__file__, world, ctx, tmp, f"{ctx['phase']}-{world}",
                     timeout=PROCESS_TIMEOUT, env={"OMP_NUM_THREADS": "1"})


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Phase 1 (unbroken runs, states saved) and phase 2 (states resumed) for every world."""
    tmp = str(tmp_path_factory.mktemp("virtual_ddp"))
    ctx = {"shards": write_shards(os.path.join(tmp, "shards")), "rows": write_rows(tmp)}
    unbroken = {w: run_group(tmp, w, {**ctx, "phase": 1}) for w in WORLDS}
    states = {road: [unbroken[saved[0]][0][f"{road}/{saved[1]}"]["states"][str(at)]
                     for saved, _, at in PAIRS] for road in ROADS}
    resumed = {w: run_group(tmp, w, {**ctx, "phase": 2, "states": states}) for w in WORLDS}
    return unbroken, states, resumed


def reference(unbroken: dict, road: str) -> list[list]:
    """The global sequence of each epoch: one rank, no worker."""
    return [[d for d, _ in epoch] for epoch in unbroken[1][0][f"{road}/0"]["passes"]]


def expected(sequence: list, world: int, rank: int, start: int = 0) -> list:
    """What rank ``rank`` of ``world`` trains on from global batch ``start``: step s gets
    batch ``start + s * world + rank``, past the end the epoch's first ones (pad)."""
    n = len(sequence)
    steps = -(-max(0, n - start) // world)
    return [sequence[(start + s * world + rank) % n] for s in range(steps)]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("road", ROADS)
def test_every_world_and_worker_count_trains_on_the_same_global_batches(runs, road):
    unbroken, _, _ = runs
    sequences = reference(unbroken, road)
    assert sequences[0] != sequences[1] and len(sequences[0]) > 20
    for world in WORLDS:
        for workers in WORKERS:
            for rank in range(world):
                passes = unbroken[world][rank][f"{road}/{workers}"]["passes"]
                for epoch, sequence in enumerate(sequences):
                    got = [d for d, _ in passes[epoch]]
                    assert got == expected(sequence, world, rank), (world, workers, rank, epoch)


@pytest.mark.timeout(900)
def test_the_derived_number_of_streams_trains_on_the_same_global_batches_everywhere(
        runs, tmp_path):
    """streams="auto" derives V from the data and the bucket buffer only (here neither 1 nor
    the old default 8): every (W, K) trains on one global sequence, the one that V given
    explicitly gives."""
    import speechpipe as sp

    unbroken, _, _ = runs
    sequences = reference(unbroken, AUTO_ROAD)
    assert sequences[0] != sequences[1] and len(sequences[0]) > 20
    rows = write_rows(str(tmp_path))  # the same 150 rows
    v = auto_pipe(rows).datapipe.num_streams
    assert 1 < v < 8
    given, _ = run_epochs(sp.build_loader(auto_pipe(rows, streams=v), seed=0), 2)
    assert [[d for d, _ in epoch] for epoch in given] == sequences
    for world in WORLDS:
        for workers in AUTO_WORKERS:
            for rank in range(world):
                passes = unbroken[world][rank][f"{AUTO_ROAD}/{workers}"]["passes"]
                for epoch, sequence in enumerate(sequences):
                    got = [d for d, _ in passes[epoch]]
                    assert got == expected(sequence, world, rank), (world, workers, rank, epoch)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("road", ROADS)
def test_a_state_saved_on_one_topology_resumes_exactly_on_another(runs, road):
    unbroken, states, resumed = runs
    sequences = reference(unbroken, road)
    keys = [{d: k for epoch in unbroken[1][0][f"{road}/0"]["passes"] for d, k in epoch}]
    for i, ((w, k), (w2, k2), at) in enumerate(PAIRS):
        state = states[road][i]
        start = 0 if at == "end" else (at + 1) * w
        assert state["batches"] == start and state["epoch"] == (1 if at == "end" else 0)
        ranks = [resumed[w2][r][f"{road}/{i}"] for r in range(w2)]
        epoch = state["epoch"]
        for r, run in enumerate(ranks):
            assert run["epoch"] == epoch
            assert [d for d, _ in run["passes"][0]] == expected(sequences[epoch], w2, r, start), (
                (w, k), (w2, k2), at, r)
            if epoch + 1 < len(sequences):  # the next epoch, from its start
                assert [d for d, _ in run["passes"][1]] == expected(sequences[epoch + 1], w2, r)
        # over the ranks: the rest of the epoch once (no sample twice, none lost) + repeats
        n = len(sequences[epoch])
        real = [d for r, run in enumerate(ranks) for s, (d, _) in enumerate(run["passes"][0])
                if start + s * w2 + r < n]
        assert sorted(real) == sorted(sequences[epoch][start:])
        samples = [key for d in real for key in keys[0][d]]
        assert len(samples) == len(set(samples))


# --------------------------------------------------------------------------- docs/resume.md

PAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                    "docs",
                    "resume.md")


def _run(command: list[str], cwd: str, **env: str) -> str:
    full = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(PAGE)),
                GLOO_SOCKET_IFNAME=os.environ.get("GLOO_SOCKET_IFNAME", "lo"),
                OMP_NUM_THREADS="1", **env)
    done = subprocess.run(command, cwd=cwd, env=full, text=True, capture_output=True,
                          timeout=300)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    return done.stdout


def steps_of(out: str, rank: int) -> list[str]:
    """The keys each step of ``rank`` printed, in order. Two ranks print to one pipe, so a
    line of one may land inside the other's (seen under load): the lines are found by their
    pattern (the demo's keys are digits and dashes), not by line starts."""
    import re

    return [keys for r, keys in re.findall(r"rank (\d+) step \d+: ([0-9,-]+)", out)
            if int(r) == rank]


@pytest.mark.timeout(600)
def test_the_resume_page_saves_on_2_ranks_x_2_workers_and_resumes_on_1_rank_without(tmp_path):
    """docs/resume.md's blocks in an empty folder (its training script runs there as one
    process: the unbroken epoch), then the page's two commands: torchrun on 2 ranks with 2
    workers each, stopped with a checkpoint after step 2, and python with no workers."""
    import re

    with open(PAGE, encoding="utf-8") as f:
        page = f.read()
    blocks = re.findall(r"```python\n(.*?)```", page, re.S)
    unbroken = steps_of(_run([sys.executable, "-c", "\n".join(blocks)], str(tmp_path)), 0)
    script = next(b for b in blocks if b.startswith("# train_resume.py"))
    (tmp_path / "train_resume.py").write_text(script)
    commands = re.search(r"```sh\n(STOP_AT=.*?)```", page, re.S).group(1).splitlines()
    assert commands[0].startswith("STOP_AT=2 WORKERS=2 torchrun --standalone --nproc-per-node=2")
    two = _run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node=2", "train_resume.py"], str(tmp_path), STOP_AT="2",
               WORKERS="2")
    assert [steps_of(two, r) for r in (0, 1)] == [unbroken[0:6:2], unbroken[1:6:2]]
    assert commands[1].startswith("python train_resume.py")
    one = _run([sys.executable, "train_resume.py"], str(tmp_path))
    assert "rank 0: starts at global batch 6, 10 steps" in one
    assert steps_of(one, 0) == unbroken[6:] and len(unbroken) == 16
    keys = [k for line in steps_of(two, 0) + steps_of(two, 1) + steps_of(one, 0)
            for k in line.split(",")]
    assert len(keys) == len(set(keys)) == 36  # the demo corpus once: none twice, none lost


if __name__ == "__main__":
    _rank_main(*join_rank_group())
