"""speechpipe.set_epoch: one call reseeds a whole pipeline for an epoch."""

from __future__ import annotations

import pytest

import speechpipe
from speechpipe.demo import build_demo_pipe


def keys(pipe):
    return [k for batch in pipe for k in batch["key"]]


def test_same_seed_and_epoch_replay_the_same_batches_through_torch_shuffle():
    pipe = build_demo_pipe(batch_size=6)  # fixed-size batches: the order is torch's shuffle
    first = keys(speechpipe.set_epoch(pipe, 3, seed=11))
    assert keys(speechpipe.set_epoch(pipe, 3, seed=11)) == first
    assert keys(speechpipe.set_epoch(pipe, 4, seed=11)) != first
    assert keys(speechpipe.set_epoch(pipe, 3, seed=12)) != first


def test_budget_batches_follow_the_epoch():
    pipe = build_demo_pipe(budget_seconds=20)
    first = [b["key"] for b in speechpipe.set_epoch(pipe, 0, seed=1)]
    assert [b["key"] for b in speechpipe.set_epoch(pipe, 0, seed=1)] == first
    assert [b["key"] for b in speechpipe.set_epoch(pipe, 1, seed=1)] != first


def test_epoch_reaches_speechpipe_pipes_below_torch_stages():
    pipe = build_demo_pipe(budget_seconds=20)  # ... block_batch -> collate
    speechpipe.set_epoch(pipe, 5)
    block_batch = pipe.datapipe
    assert type(block_batch).__name__ == "BlockBatcherIterDataPipe" and block_batch.epoch == 5
    assert block_batch.source_datapipe.epoch == 5  # bucket_by_length


def test_negative_epoch_is_rejected():
    with pytest.raises(ValueError, match="epoch must be an int >= 0"):
        speechpipe.set_epoch(build_demo_pipe(), -1)
