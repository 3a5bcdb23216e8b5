"""Equal steps over virtual streams on real gloo groups (issue 29).

``build_loader(..., uneven="plan")`` over a ``plan_batches`` pipeline: the loader's
``EqualSteps`` finds the planner (:class:`speechpipe.StepPlanner` over streams), and on every
rank of groups of 1, 2 and 4 ranks, with 0 and 2 workers, both roads and ``uneven`` "pad"
and "drop": ``len(loader)`` before the pass, ``StepPlanner(pipe).steps()`` and the steps the
rank's loop really takes are one number -- the plan's ``ceil`` / ``floor`` of the epoch's
global batches over the ranks -- over two epochs and a pass resumed from rank 0's state.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_virtual_streams import collate, write_rows, write_shards  # noqa: E402
from speechpipe.testing import join_rank_group, run_ranks  # noqa: E402

WORLDS = (1, 2, 4)
WORKERS = (0, 2)
CASES = [(road, uneven) for road in ("shards", "rows") for uneven in ("pad", "drop")]


def make_pipe(ctx: dict, road: str, uneven: str):
    import speechpipe as sp
    from speechpipe.pipes.batching import PaddedArea

    if road == "shards":
        planned = sp.IterableWrapper(ctx["shards"]).plan_batches(
            budget=PaddedArea(800), index=True, streams=4, seed=0, buffer_size=8,
            bucket_buffer=12, boundaries=[100], shuffle_window=3, uneven=uneven)
    else:
        planned = sp.IterableWrapper([ctx["rows"]]).read_manifest_files().plan_batches(
            budget=20.0, streams=4, seed=0, bucket_buffer=30, shuffle_window=5, uneven=uneven)
    return planned.collate(collate_fn=collate)


def _rank_main(rank: int, world: int, ctx: dict, out: str) -> None:
    import torch.distributed as dist

    import speechpipe as sp

    results: dict = {}
    for road, uneven in CASES:
        for workers in WORKERS:
            loader = sp.build_loader(make_pipe(ctx, road, uneven), num_workers=workers, seed=0,
                                     uneven="plan")
            planner = sp.StepPlanner(make_pipe(ctx, road, uneven))
            passes = []
            for epoch in (0, 1):
                counted = [len(loader), planner.steps(epoch)]
                taken = sum(1 for _ in loader)
                passes.append(counted + [taken, len(loader.dataset.pipe.datapipe.plan(epoch))])
            resumed = sp.build_loader(make_pipe(ctx, road, uneven), num_workers=workers, seed=0,
                                      uneven="plan")
            resumed.load_state_dict({**loader.state_dict(), "epoch": 0, "batches": 5})
            counted = [len(resumed), sp.StepPlanner(resumed).steps()]
            passes.append(counted + [sum(1 for _ in resumed),
                           len(resumed.dataset.pipe.datapipe.plan(0)) - 5])
            results[f"{road}/{uneven}/{workers}"] = passes
            dist.barrier()
    with open(out, "w") as f:
        json.dump(results, f)
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("stream_steps"))
    ctx = {"shards": write_shards(os.path.join(tmp, "shards"), shards=9, per_shard=10),
           "rows": write_rows(tmp, rows=130)}
    return {w: run_ranks(__file__, w, ctx, tmp, f"steps-{w}", timeout=300,
                         env={"OMP_NUM_THREADS": "1"}) for w in WORLDS}


@pytest.mark.timeout(900)
@pytest.mark.parametrize("world", WORLDS)
def test_the_planned_steps_are_the_steps_every_rank_takes(runs, world):
    padded = 0  # cases whose last step repeats first batches
    for road, uneven in CASES:
        for workers in WORKERS:
            totals = set()
            for rank in range(world):
                for i, (length, planned, taken, total) in enumerate(
                        runs[world][rank][f"{road}/{uneven}/{workers}"]):
                    steps = -(-total // world) if uneven == "pad" else total // world
                    where = (road, uneven, workers, rank, i)
                    assert length == planned == taken == steps, where
                    totals.add((i, total))
            assert len(totals) == 3  # every rank planned the same epochs
            padded += sum(1 for _, t in totals if t % world and uneven == "pad")
    assert padded or world == 1


if __name__ == "__main__":
    _rank_main(*join_rank_group())
