"""examples/asr/train.py at a tiny size, on the shipped demo corpus: it converges on a fixed set
of batches, and a run stopped and resumed equals the unbroken run (batches and weights), in
one process with DataLoader workers and under ``torchrun`` with two gloo ranks (issue 33)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "examples", "asr", "train.py")
TINY = ["--d-model", "64", "--layers", "2", "--heads", "4", "--vocab-size", "64",
        "--budget-seconds", "30", "--log-every", "1000", "--threads", "1"]


@pytest.fixture(scope="module")
def train():
    spec = importlib.util.spec_from_file_location("asr_train_example", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    threads = torch.get_num_threads()  # --threads 1: OpenMP spinning on a busy machine
    yield module
    torch.set_num_threads(threads)


def log(out: str, rank: int = 0) -> list[dict]:
    with open(os.path.join(out, f"log-rank{rank}.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def weights(out: str, step: int, rank: int = 0) -> dict:
    path = os.path.join(out, f"checkpoint-{step}", f"rank{rank}.pt")
    return torch.load(path, weights_only=False)


def assert_same_state(a: dict, b: dict, *, buffers: bool = True) -> None:
    assert a["step"] == b["step"]
    assert a["model"].keys() == b["model"].keys()
    for name in a["model"]:
        if buffers or not name.endswith(("running_mean", "running_var", "batches_tracked")):
            assert torch.equal(a["model"][name], b["model"][name]), name
    moments_a = a["optimizer"]["state"]
    moments_b = b["optimizer"]["state"]
    assert moments_a.keys() == moments_b.keys()
    for index in moments_a:
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(moments_a[index][key], moments_b[index][key])


def test_loss_falls_on_a_fixed_set_of_batches(train, tmp_path):
    # Invariant: 30 optimiser steps on the same batch bring its CTC loss below 0.8 x step 0's.
    summary = train.main(TINY + ["--out", str(tmp_path), "--steps", "31", "--fixed-batches",
                                 "1", "--dropout", "0", "--warmup", "1"])
    losses = summary["losses"]
    assert len(losses) == 31
    assert losses[30] < 0.8 * losses[0], losses
    entries = log(str(tmp_path))
    assert all(e["keys"] == entries[0]["keys"] for e in entries)  # one batch, over and over
    assert 0.0 <= summary["wer"] and summary["utterances"] == 36  # validated: every utterance


@pytest.mark.parametrize("persistent", [[], ["--persistent-workers"]],
                         ids=["fresh-workers", "persistent-workers"])
def test_stopped_and_resumed_run_equals_the_unbroken_one(train, tmp_path, persistent):
    # Invariant: stop at step 5 (a checkpoint of model, optimiser, loader and generator), a
    # fresh loop resumes: its batches, losses and final weights are the unbroken run's. With
    # 2 DataLoader workers (fresh at each epoch, or persistent), gradient accumulation over 2
    # batches, dropout on, and the 14 steps crossing epochs (the demo corpus gives 6 batches
    # an epoch at this budget).
    common = TINY + ["--steps", "14", "--accum", "2", "--workers", "2", "--warmup", "4",
                     "--dropout", "0.1"] + persistent
    whole, broken = str(tmp_path / "whole"), str(tmp_path / "broken")
    train.main(common + ["--out", whole])
    first = train.main(common + ["--out", broken, "--stop-after", "5"])
    assert first["step"] == 5 and "wer" not in first
    second = train.main(common + ["--out", broken, "--resume"])
    assert second["step"] == 14
    assert log(broken) == log(whole)
    epochs = {k for e in log(whole) for batch in e["keys"] for k in batch}
    assert len(epochs) == 36  # every utterance was trained on: the run spans epochs
    assert_same_state(weights(broken, 14), weights(whole, 14))
    assert not os.path.exists(os.path.join(broken, "checkpoint-14", "rank0.pt.tmp"))


def test_resume_without_a_checkpoint_names_the_folder(train, tmp_path):
    with pytest.raises(FileNotFoundError, match=f"no checkpoint for rank 0 in {tmp_path}"):
        train.main(TINY + ["--out", str(tmp_path), "--steps", "2", "--resume"])


def test_greedy_decoding_merges_repeats_and_drops_blanks(train):
    class Ids:  # a tokenizer that spells ids
        def decode(self, ids):
            return "".join("_abc"[i] for i in ids)

    frames = [1, 1, 0, 1, 2, 2, 0, 0, 3, 3]  # a a - a b b - - c c
    log_probs = torch.full((2, 10, 4), -10.0)
    for t, i in enumerate(frames):
        log_probs[0, t, i] = 0.0
        log_probs[1, t, i] = 0.0
    texts = train.greedy_decode(log_probs, torch.tensor([10, 4]), Ids())
    assert texts == ["aabc", "aa"]


def test_torchrun_two_ranks_resume_exactly(tmp_path):
    # Invariant: under torchrun (2 gloo ranks, EqualSteps), each rank's batches and the
    # final weights of a run stopped at step 3 and resumed equal the unbroken run's.
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    common = TINY + ["--steps", "6", "--accum", "2", "--warmup", "2"]

    def run(*extra: str) -> None:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   "--nproc-per-node=2", SCRIPT, *common, *extra]
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300,
                              cwd=str(tmp_path))
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    whole, broken = str(tmp_path / "whole"), str(tmp_path / "broken")
    run("--out", whole)
    run("--out", broken, "--stop-after", "3")
    run("--out", broken, "--resume")
    for rank in (0, 1):
        assert log(broken, rank) == log(whole, rank)
        assert_same_state(weights(broken, 6, rank), weights(whole, 6, rank))
    firsts = [{k for b in log(whole, r)[0]["keys"] for k in b} for r in (0, 1)]
    assert firsts[0] and firsts[1] and not firsts[0] & firsts[1]  # each rank, its own share
    # DDP kept the weights equal (batch norm statistics: each rank's own last batch)
    assert_same_state(weights(whole, 6, 0), weights(whole, 6, 1), buffers=False)
