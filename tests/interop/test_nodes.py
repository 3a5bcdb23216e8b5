"""torchdata.nodes (issue 22): a speechpipe pipeline as a BaseNode with its own state.

Invariant: under ``torchdata.nodes.Loader``, cutting a run after k batches, taking the
loader's state and resuming a new loader from it gives exactly the rest of the uninterrupted
run -- with the pipeline alone, and under ParallelMapper workers (threads and processes) --
and the restore re-reads only what the pipeline's stages held, not the stream before the cut.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import soundfile
import torch
from torchdata.nodes import Batcher, Loader, ParallelMapper

import speechpipe as sp
from speechpipe.testing import cut_and_resume

RATE = 8000


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    root = tmp_path_factory.mktemp("nodes")
    rng = np.random.default_rng(0)
    out = []
    for i in range(24):
        n = int(RATE * (0.2 + 0.05 * (i % 7)))
        path = str(root / f"u{i:02d}.wav")
        soundfile.write(path, (rng.standard_normal(n) * 0.1).astype(np.float32), RATE)
        out.append({"key": f"u{i:02d}", "audio_path": path, "duration": n / RATE})
    return out


LOADS: list[str] = []


def _counted(row: dict) -> dict:
    LOADS.append(row["key"])
    return row


def _train(rows: list) -> sp.PipelineNode:
    pipe = sp.train_pipeline(
        rows, budget=1.2, features="fbank", seed=5, bucket_buffer=8,
        input=lambda p: p.map(_counted).load_audio(offset_field="offset",
                                                   duration_field="duration",
                                                   whole_without_offset=True))
    return sp.PipelineNode(pipe)


def _summary(batch: dict) -> tuple:
    return tuple(batch["key"]), round(float(batch["feats"].sum()), 3)


def test_a_train_pipeline_resumes_exactly_under_a_nodes_loader(rows):
    full = [_summary(b) for b in Loader(_train(rows))]
    assert len(full) >= 5
    for k in (1, 3):
        loader = Loader(_train(rows))
        it = iter(loader)
        head = [_summary(next(it)) for _ in range(k)]
        state = json.loads(json.dumps(loader.state_dict()))  # a small, JSON-friendly state
        LOADS.clear()
        again = Loader(_train(rows))
        again.load_state_dict(state)
        rest = [_summary(b) for b in again]
        assert head + rest == full
        # the restore read again what the stages held, not the batches before the cut
        assert len(LOADS) < len(rows)


def test_each_pass_of_the_loader_is_the_next_epoch(rows):
    loader = Loader(_train(rows))
    first, second = [[_summary(b) for b in loader] for _ in range(2)]
    assert first != second
    assert sorted(k for s in first for k in s[0]) == sorted(k for s in second for k in s[0])
    fresh = sp.PipelineNode(_train(rows).dataset.pipe, epoch=1)
    assert [_summary(b) for b in Loader(fresh)] == second


def test_a_state_taken_at_the_end_of_a_pass_resumes_at_the_next_epoch(rows):
    loader = Loader(_train(rows))
    list(loader)
    state = loader.state_dict()
    second = [_summary(b) for b in loader]
    again = Loader(_train(rows))
    again.load_state_dict(state)
    assert [_summary(b) for b in again] == second


def _load(row: dict) -> dict:
    audio, _ = soundfile.read(row["audio_path"], dtype="float32")
    return {"key": row["key"], "audio": torch.from_numpy(audio)}


def _mapped(rows: list, method: str) -> Batcher:
    source = sp.PipelineNode(sp.IterableWrapper(rows).shuffle_samples(seed=3))
    node = ParallelMapper(source, _load, num_workers=2, method=method, in_order=True)
    return Batcher(node, batch_size=5, drop_last=False)


def _keys_and_sums(batch: list) -> list:
    return [(s["key"], round(float(s["audio"].sum()), 4)) for s in batch]


@pytest.mark.parametrize("method", ["thread", "process"])
def test_resume_is_exact_under_parallel_mapper_workers(rows, method):
    full, resumed = cut_and_resume(lambda: Loader(_mapped(rows, method)), 2, _keys_and_sums)
    assert sorted(k for b in full for k, _ in b) == sorted(r["key"] for r in rows)
    assert resumed == full


def test_a_pipeline_that_cannot_resume_is_refused(rows):
    with pytest.raises(TypeError, match="torch's shuffle keeps its buffer"):
        sp.PipelineNode(sp.IterableWrapper(rows).shuffle())
