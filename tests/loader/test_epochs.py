"""speechpipe.set_epoch: one call reseeds a whole pipeline for an epoch."""

from __future__ import annotations

import re

import pytest

import speechpipe
from speechpipe.demo import build_demo_pipe
from speechpipe import PaddedArea, SampleCount


def keys(pipe):
    return [k for batch in pipe for k in batch["key"]]


def test_same_seed_and_epoch_replay_the_same_batches_through_torch_shuffle():
    pipe = build_demo_pipe(budget=SampleCount(6))  # fixed-size batches: torch's shuffle's order
    first = keys(speechpipe.set_epoch(pipe, 3, seed=11))
    assert keys(speechpipe.set_epoch(pipe, 3, seed=11)) == first
    assert keys(speechpipe.set_epoch(pipe, 4, seed=11)) != first
    assert keys(speechpipe.set_epoch(pipe, 3, seed=12)) != first


def test_budget_batches_follow_the_epoch():
    pipe = build_demo_pipe(budget=20)
    first = [b["key"] for b in speechpipe.set_epoch(pipe, 0, seed=1)]
    assert [b["key"] for b in speechpipe.set_epoch(pipe, 0, seed=1)] == first
    assert [b["key"] for b in speechpipe.set_epoch(pipe, 1, seed=1)] != first


def test_epoch_reaches_speechpipe_pipes_below_torch_stages():
    pipe = build_demo_pipe(budget=20)  # ... block_batch -> collate
    speechpipe.set_epoch(pipe, 5)
    block_batch = pipe.datapipe
    assert type(block_batch).__name__ == "BlockBatcherIterDataPipe" and block_batch.epoch == 5
    assert block_batch.source_datapipe.epoch == 5  # bucket_by_length


def test_negative_epoch_is_rejected():
    with pytest.raises(ValueError, match="epoch must be an int >= 0"):
        speechpipe.set_epoch(build_demo_pipe(), -1)


# ------------------------------------------------------------------------------ issue 17


ROWS = [{"key": f"u{i:02d}", "num_frames": 5 + (7 * i) % 23} for i in range(40)]


def _pipeline(seed: int = 0):
    return (speechpipe.IterableWrapper(ROWS).shuffle_samples(seed=seed)
            .bucket_by_length(16, seed=seed).block_batch(PaddedArea(60), seed=seed))


def _keys(pipe) -> list:
    return [[s["key"] for s in batch] for batch in pipe]


def test_a_new_pass_over_a_pipeline_is_the_next_epoch():
    """Forgetting set_epoch repeated the same order every epoch, silently (webdataset#172)."""
    pipe = _pipeline()
    passes = [_keys(pipe) for _ in range(3)]
    expected = [_keys(speechpipe.set_epoch(_pipeline(), e)) for e in range(3)]
    assert passes == expected and passes[0] != passes[1] != passes[2]
    assert _keys(speechpipe.set_epoch(pipe, 1)) == expected[1]  # a set epoch is used as it is
    assert _keys(pipe) == expected[2]  # and the next pass follows it


def test_a_plain_dataloader_in_a_fresh_interpreter_neither_repeats_nor_warns(tmp_path):
    """torch's DataLoader without build_loader gives workers a fresh copy every epoch: the
    order repeated, with an EpochWarning (issue 18). Issue 32.12: the epoch now advances on
    the main process's pipe, where torch calls set_seed before the workers start."""
    import subprocess
    import sys

    script = tmp_path / "bare.py"
    script.write_text(
        "import torch, speechpipe\n"
        "rows = [{'key': f'u{i}', 'num_frames': 3 + i} for i in range(8)]\n"
        "pipe = speechpipe.IterableWrapper(rows).shuffle_samples(seed=0)\n"
        "loader = torch.utils.data.DataLoader(pipe, batch_size=None, num_workers=1)\n"
        "print([s['key'] for s in loader] == [s['key'] for s in loader])\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False"  # a new order in the second epoch
    assert "EpochWarning" not in out.stderr


def test_a_plain_torch_dataloader_with_fresh_workers_moves_to_the_next_epoch(recwarn):
    # Issue 32.12: with non-persistent workers (fresh copies each epoch) a plain torch
    # DataLoader repeated the first epoch's order every epoch, with a warning. torch calls
    # set_seed on the main process's pipe before the workers start: the epoch advances there.
    import torch

    import speechpipe as sp

    rows = [{"key": f"u{i:02d}"} for i in range(16)]
    pipe = sp.IterableWrapper(rows).shuffle_samples(seed=3)
    loader = torch.utils.data.DataLoader(pipe, batch_size=None, num_workers=2)
    orders = [[s["key"] for s in loader] for _ in range(3)]
    # the same samples each epoch, in a new order each epoch
    assert all(sorted(o) == sorted(r["key"] for r in rows) for o in orders)
    assert orders[0] != orders[1] != orders[2]
    assert not [w for w in recwarn if w.category.__name__ == "EpochWarning"]
    # an epoch given by set_epoch wins, and is the order of that epoch
    sp.set_epoch(pipe, 7)
    again = [s["key"] for s in loader]
    sp.set_epoch(pipe, 7)
    assert [s["key"] for s in loader] == again


def _loader_orders(pipe, epochs, **loader_kwargs):
    import torch

    loader = torch.utils.data.DataLoader(pipe, batch_size=None, **loader_kwargs)
    return [[s["key"] for s in loader] for _ in range(epochs)]


@pytest.mark.parametrize("loader_kwargs", [
    {"num_workers": 0}, {"num_workers": 2}, {"num_workers": 2, "persistent_workers": True}])
def test_a_plain_dataloader_gives_exactly_the_orders_of_epochs_0_1_2(loader_kwargs, recwarn):
    # Issue 32.12, second round: the epoch is told from torch's calls of set_seed (two per
    # iterator with workers, one in each worker's process), without reading call frames
    import speechpipe as sp

    rows = [{"key": f"u{i:02d}"} for i in range(16)]
    pipe = sp.IterableWrapper(rows).shuffle_samples(seed=5)
    orders = _loader_orders(pipe, 3, **loader_kwargs)
    expected = [_loader_orders(sp.set_epoch(sp.IterableWrapper(rows).shuffle_samples(seed=5),
                                            e), 1, **loader_kwargs)[0] for e in range(3)]
    assert orders == expected and expected[0] != expected[1] != expected[2]
    assert not [w for w in recwarn if w.category.__name__ == "EpochWarning"]


def test_a_worker_copied_after_a_set_seed_that_did_not_count_says_so(capfd):
    # a set_seed call by hand shifts the pairs torch's calls come in: the worker cannot
    # trust its epoch, and says what it does (keeps it) instead of repeating silently
    import torch

    import speechpipe as sp

    rows = [{"key": f"u{i:02d}"} for i in range(8)]
    pipe = sp.IterableWrapper(rows).shuffle_samples(seed=5)
    pipe.set_seed(1)
    loader = torch.utils.data.DataLoader(pipe, batch_size=None, num_workers=1,
                                         multiprocessing_context="spawn")
    keys = [s["key"] for s in loader]  # the worker warns in its process: on stderr
    assert sorted(keys) == [r["key"] for r in rows]
    err = capfd.readouterr().err
    assert re.search(r"EpochWarning: SampleShufflerIterDataPipe was copied into a DataLoader "
                     r"worker after a set_seed call that did not count as a new epoch "
                     r"\(torch [^ ]+ seeds pipes in an order speechpipe does not know, or "
                     r"set_seed was called by hand\): this worker keeps epoch 0", err), err
