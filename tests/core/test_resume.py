"""Exact mid-epoch resume (speechpipe.loader + the resumable pipes), issue 6.

Invariant: for a pipeline whose samples come from ``sharded_shuffle`` or ``batch_by_view``,
the batches that follow ``load_state_dict(state)`` -- in a new process, with the same number
of workers -- equal the batches that followed ``state_dict()`` in the uninterrupted run, at any
step, including inside a shuffle buffer and across an epoch boundary. A restore reads again at
most the samples held in buffers and the current shard's prefix, never the epoch so far.

This file is also a script: ``python tests/core/test_resume.py <case.json>`` is the "new process"
of the subprocess tests.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
import torch

import speechpipe  # noqa: F401  (registers the pipes)
from speechpipe.errors import DataError, ResumeError
from speechpipe.index import ShardEntry, ShardIndex
from speechpipe import ResumeWarning
from speechpipe.loader import PipeDataset, build_loader
from speechpipe.pipes._core import IterableWrapper, SequenceWrapper
from speechpipe.pipes.collate import PadCollate
from speechpipe.pipes.shards import ShardWriter
from speechpipe.pipes.batching import BatchView
from speechpipe import PaddedArea
from speechpipe import SampleCount

DIM = 4
EPOCHS = 2


# ------------------------------------------------------------------------------ fixtures


def write_corpus(root: str, n: int = 200, per_shard: int = 20, seed: int = 0) -> list[str]:
    """Tar shards of ``feats.npy`` (frames, DIM) + ``txt``, with an index.jsonl."""
    rng = np.random.default_rng(seed)
    frames = rng.integers(5, 60, size=n)
    with ShardWriter(os.path.join(root, "data-%05d.tar"), maxcount=per_shard) as writer:
        for i, t in enumerate(frames):
            writer.write({"key": f"u{i:04d}", "txt": f"text {i}",
                          "feats.npy": np.full((int(t), DIM), i, np.float32)})
    entries = []
    for s, path in enumerate(writer.paths):
        ids = range(s * per_shard, min(n, (s + 1) * per_shard))
        entries.append(ShardEntry(os.path.basename(path), len(ids), os.path.getsize(path),
                                  tuple(f"u{i:04d}" for i in ids),
                                  tuple(float(frames[i]) for i in ids)))
    ShardIndex(root, entries).write()
    return writer.paths


def stream_pipe(paths: list[str], *, threads: bool = False, num_buckets: int | None = None):
    """sharded_shuffle -> decode -> bucket_by_length -> block_batch -> collate."""
    samples = IterableWrapper(paths).sharded_shuffle(buffer_size=30, seed=1, index=True)
    samples = samples.decode()
    if threads:
        samples = samples.prefetch_in_thread(5).map_in_threads(lambda s: s, num_threads=2)
    return (samples.bucket_by_length(40, seed=2, num_buckets=num_buckets)
            .block_batch(PaddedArea(300), shuffle_window=4, seed=3)
            .collate(collate_fn=PadCollate()))


def view_data(n: int = 120) -> dict:
    rng = np.random.default_rng(5)
    return {f"v{i:03d}": {"key": f"v{i:03d}",
                          "feats": np.full((int(rng.integers(3, 40)), DIM), i, np.float32)}
            for i in range(n)}


def view_pipe():
    data = view_data()
    view = BatchView({k: len(s["feats"]) for k, s in data.items()}, budget=200, seed=4)
    return SequenceWrapper(data).batch_by_view(view).collate(collate_fn=PadCollate())


def _with_feats(row: dict) -> dict:
    """A deterministic one-to-one stage between the source and the buffers (as load_audio)."""
    return {**row, "feats": np.full((row["frames"], DIM), int(row["key"][1:]), np.float32)}


def manifest_pipe():
    """shuffle_samples over manifest rows -> load -> bucket_by_length -> block_batch -> collate
    (the recipes' road)."""
    rng = np.random.default_rng(7)
    rows = [{"key": f"m{i:03d}", "frames": int(rng.integers(3, 50))} for i in range(150)]
    return (IterableWrapper(rows).shuffle_samples(seed=6).map(_with_feats)
            .bucket_by_length(30, seed=2).block_batch(PaddedArea(250), shuffle_window=4, seed=3)
            .collate(collate_fn=PadCollate()))


def mapped_manifest_pipe(case: dict):
    """manifest_pipe's rows written to a JSON-lines file, read through its mapped row table
    (read_manifest_files: each row parsed when shuffle_samples yields it; issue 28)."""
    path = case["manifest"]
    if not os.path.exists(path):
        from speechpipe.pipes.sources import write_manifest

        rng = np.random.default_rng(7)
        write_manifest(path, [{"key": f"m{i:03d}", "frames": int(rng.integers(3, 50))}
                              for i in range(150)])
    return (IterableWrapper([path]).read_manifest_files().shuffle_samples(seed=6)
            .map(_with_feats).bucket_by_length(30, seed=2)
            .block_batch(PaddedArea(250), shuffle_window=4, seed=3)
            .collate(collate_fn=PadCollate()))


def recipe_pipe(case: dict):
    """A recipe's own builder over manifests prepare wrote from the demo corpus (real speech)."""
    from speechpipe.recipes import librispeech

    if case["builder"] == "train":
        return librispeech.librispeech_train(case["manifests"], ["dev-clean"], seed=0,
                                             budget=12.0, bucket_buffer=8,
                                             streams=case.get("streams"))
    return librispeech.librispeech_valid(case["manifests"], ["dev-clean"], budget=SampleCount(3))


def summary(batch: dict) -> list:
    # the sum in float64, rounded: a float32 sum's last bit follows torch's thread count, which
    # another test module may have changed in this process (not in the resuming one)
    return [list(batch["key"]), round(float(batch["feats"].double().sum()), 2),
            list(batch["feats"].shape)]


def build(case: dict):
    pipe = {"view": view_pipe, "manifest": manifest_pipe,
            "mapped": lambda: mapped_manifest_pipe(case),
            "recipe": lambda: recipe_pipe(case)}.get(
        case["path"], lambda: stream_pipe(case["paths"], num_buckets=case.get("buckets")))()
    # snapshot_every=1: every state comes from the workers' pipes themselves (the held-sample
    # machinery); larger values restore the last snapshot and fetch the batches since again.
    snapshot = {} if case.get("snapshot_every") == "default" else {
        "snapshot_every": case.get("snapshot_every", 1)}
    return build_loader(pipe, num_workers=case["workers"],
                        persistent_workers=case["workers"] > 0, seed=0, **snapshot)


def run_from(loader, start_epoch: int, epochs: int, fresh: bool) -> list:
    out = []
    for epoch in range(start_epoch, epochs):
        if fresh or epoch > start_epoch:
            loader.set_epoch(epoch)
        out.extend([epoch] + summary(batch) for batch in loader)
    return out


def uninterrupted_with_states(case: dict, cuts: list[int]) -> tuple[list, dict]:
    """The whole run, saving loader.state_dict() after each step in ``cuts`` and, for a cut
    ``"end-<epoch>"``, after that epoch's loop has ended (issue 23: the commonest checkpoint)."""
    loader, out, states, step = build(case), [], {}, 0
    for epoch in range(EPOCHS):
        loader.set_epoch(epoch)
        for batch in loader:
            out.append([epoch] + summary(batch))
            step += 1
            if step in cuts:
                states[step] = loader.state_dict()
        if f"end-{epoch}" in cuts:
            states[f"end-{epoch}"] = loader.state_dict()
            states[f"end-{epoch}"]["_at"] = step
    return out, states


def resumed(case: dict, state: dict) -> list:
    loader = build(case)
    state = dict(state)
    if state.pop("_at", None) is not None:  # after a loop: the docstring's training loop
        loader.load_state_dict(state)
        return run_from(loader, loader.epoch, EPOCHS, fresh=True)
    loader.load_state_dict(state)
    return run_from(loader, loader.epoch, EPOCHS, fresh=False)


def _child(case_file: str) -> None:
    with open(case_file) as f:
        case = json.load(f)
    results = {}
    for step, path in case["states"].items():
        state = torch.load(path, weights_only=True)  # plain containers: no pickled objects
        results[step] = resumed(case, state)
    print(json.dumps(results))


def _resume_in_new_process(tmp_path, case: dict, cuts: list[int]) -> None:
    full, states = uninterrupted_with_states(case, cuts)
    assert sorted(map(str, states)) == sorted(map(str, cuts)), "a cut point is past the end"
    if case["workers"] and case.get("snapshot_every", 1) != 1 and case.get("streams") is None:
        # the case is there for cuts between two snapshots: the new process fetches the
        # batches since the last snapshot again; at least one cut must be such a cut
        since = [_steps_since_snapshot(state) for state in states.values()]
        assert max(since) > 0, since
    files = {}
    for step, state in states.items():
        files[step] = str(tmp_path / f"state-{step}.pt")
        torch.save(state, files[step])
    case_file = tmp_path / "case.json"
    case_file.write_text(json.dumps({**case, "states": files}))
    out = subprocess.run([sys.executable, __file__, str(case_file)], capture_output=True,
                         text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-4000:]
    results = json.loads(out.stdout.strip().splitlines()[-1])
    for step in cuts:
        at = states[step]["_at"] if str(step).startswith("end-") else step
        assert results[str(step)] == full[at:], f"resumed after step {step} differs"


def _steps_since_snapshot(state: Any) -> int:
    """StatefulDataLoader's count of batches yielded since its last snapshot, in a state."""
    if isinstance(state, dict):
        if "_steps_since_snapshot" in state:
            return int(state["_steps_since_snapshot"])
        return max((_steps_since_snapshot(v) for v in state.values()), default=-1)
    return -1


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(str(tmp_path_factory.mktemp("corpus")))


def _epoch_len(case: dict) -> int:
    loader = build(case)
    return sum(1 for _ in loader)


# ------------------------------------------------------------------------------ new process


@pytest.mark.parametrize("workers, snapshot_every", [(0, 1), (2, 1), (2, 10), (2, "default")])
def test_streaming_path_resumes_exactly_in_a_new_process(tmp_path, corpus, workers,
                                                         snapshot_every):
    case = {"path": "stream", "workers": workers, "paths": corpus,
            "snapshot_every": snapshot_every}
    n = _epoch_len(case)
    # 1: the shuffle and bucket buffers are full and nothing is finished; n - 1, n: the end
    # of epoch 0; n + 2: inside epoch 1 (the state carries the epoch); end-0, end-1: after the
    # loop of each epoch has ended.
    _resume_in_new_process(tmp_path, case, [1, 4, n - 1, n, n + 2, "end-0", "end-1"])


@pytest.mark.parametrize("workers", [0, 2])
def test_estimated_bucket_boundaries_resume_exactly_in_a_new_process(tmp_path, corpus, workers):
    # issue 23: boundaries estimated in epoch 0 were not in the state: cuts near the end of
    # epoch 0 (0 workers) and inside epoch 1 (2 persistent workers) gave a different epoch 1
    case = {"path": "stream", "workers": workers, "paths": corpus, "buckets": 3,
            "snapshot_every": 1}
    n = _epoch_len(case)
    _resume_in_new_process(tmp_path, case, [n - 3, n - 2, n - 1, n, n + 2, n + 5, "end-0"])


@pytest.mark.parametrize("workers", [0, 2])
def test_random_access_path_resumes_exactly_in_a_new_process(tmp_path, workers):
    case = {"path": "view", "workers": workers}
    n = _epoch_len(case)
    _resume_in_new_process(tmp_path, case, [1, 3, n - 1, n + 1, "end-0", "end-1"])


@pytest.mark.parametrize("workers", [0, 2])
def test_manifest_path_resumes_exactly_in_a_new_process(tmp_path, workers):
    # issue 17: the recipes' road (manifest rows, shuffle_samples, buffers) resumes exactly
    case = {"path": "manifest", "workers": workers, "snapshot_every": 3}
    n = _epoch_len(case)
    _resume_in_new_process(tmp_path, case, [1, 4, n - 1, n, n + 2, "end-0", "end-1"])


@pytest.mark.parametrize("workers", [0, 2])
def test_mapped_manifest_path_resumes_exactly_in_a_new_process(tmp_path, workers):
    # issue 28: shuffle_samples over a manifest's mapped row table (rows parsed as yielded,
    # held samples found again by key hash) resumes as exactly as over rows held in memory
    case = {"path": "mapped", "workers": workers, "snapshot_every": 3,
            "manifest": str(tmp_path / "rows.jsonl.gz")}
    n = _epoch_len(case)
    assert os.path.exists(case["manifest"] + ".spmap")
    _resume_in_new_process(tmp_path, case, [1, 4, n - 1, n, n + 2, "end-0", "end-1"])


@pytest.fixture(scope="module")
def demo_manifests(tmp_path_factory):
    from speechpipe.demo import DEMO_CORPUS
    from speechpipe.recipes.librispeech import prepare_librispeech

    out = tmp_path_factory.mktemp("manifests")
    prepare_librispeech(DEMO_CORPUS, out, parts=["dev-clean"], progress=False)
    return str(out)


@pytest.mark.parametrize("builder, workers, streams", [
    ("train", 0, None), ("train", 2, None), ("train", 2, "auto"), ("valid", 2, None)])
def test_a_recipes_loader_resumes_exactly_in_a_new_process(tmp_path, demo_manifests, builder,
                                                           workers, streams):
    # issue 17: build_loader(librispeech_train(...), num_workers=2) raised at its first
    # checkpoint (torch's shuffle); every builder of a recipe resumes exactly now, on the
    # streaming road (streams=None: cuts between two workers' snapshots) and on the planned
    # road, the training builders' default (one global position)
    case = {"path": "recipe", "builder": builder, "manifests": demo_manifests,
            "workers": workers, "snapshot_every": 2, "streams": streams}
    n = _epoch_len(case)
    assert n >= 4
    _resume_in_new_process(tmp_path, case, [1, n // 2, n - 1, "end-0"])


# ------------------------------------------------------------------------------ in process


def _keys(batch) -> tuple:
    return tuple(batch["key"]) if isinstance(batch, dict) else tuple(s["key"] for s in batch)


def _cut_and_resume(make, cut: int) -> tuple[list, list, dict]:
    full = [_keys(b) for b in PipeDataset(make())]
    dataset = PipeDataset(make())
    it = iter(dataset)
    head = [_keys(next(it)) for _ in range(cut)]
    state = dataset.state_dict()
    it.close()
    again = PipeDataset(make())
    again.load_state_dict(state)
    return full, head + [_keys(b) for b in again], state


def test_a_cut_inside_the_shuffle_buffer_holds_samples_and_resumes_exactly(corpus):
    full, joined, state = _cut_and_resume(lambda: stream_pipe(corpus), 2)
    shuffler = next(s for path, s in state["stages"].items() if "ShardedShuffler" in path)
    assert shuffler["buffer"] and not shuffler["drain"]  # cut with samples in the buffer
    below = [s for path, s in state["stages"].items() if "ShardedShuffler" not in path]
    assert sum(len(_identities(s)) for s in below) > 0  # and in the stages below it
    assert joined == full


@pytest.mark.parametrize("cut", [0, 1, 5, 11, 17, 23])
def test_every_cut_point_resumes_exactly(corpus, cut):
    full, joined, _ = _cut_and_resume(lambda: stream_pipe(corpus), cut)
    assert joined == full


def test_the_end_of_the_stream_drains_exactly(corpus):
    n = len([b for b in PipeDataset(stream_pipe(corpus))])
    for cut in (n - 3, n - 1, n):  # window and buckets draining, then nothing left
        full, joined, _ = _cut_and_resume(lambda: stream_pipe(corpus), cut)
        assert joined == full


def test_thread_stages_in_the_chain_resume_exactly(corpus):
    for cut in (1, 6):
        full, joined, state = _cut_and_resume(lambda: stream_pipe(corpus, threads=True), cut)
        assert joined == full
        held = [s for p, s in state["stages"].items() if "Thread" in p]
        assert len(held) == 2


@pytest.mark.parametrize("oversize", ["emit", "drop"])
def test_block_batch_on_a_plain_stream_resumes_exactly(corpus, oversize):
    def make():
        return (IterableWrapper(corpus).sharded_shuffle(buffer_size=7, seed=3).decode()
                .block_batch(PaddedArea(150), oversize=oversize, shuffle_window=3, seed=1))

    for cut in (1, 4, 9):
        full, joined, _ = _cut_and_resume(make, cut)
        assert joined == full


def test_kaldi_arks_resume_exactly(tmp_path):
    import kaldiio

    rng = np.random.default_rng(0)
    arks = []
    for a in range(3):
        ark = str(tmp_path / f"raw.{a}.ark")
        with kaldiio.WriteHelper(f"ark:{ark}") as writer:
            for i in range(10):
                writer(f"a{a}u{i}", rng.standard_normal((int(rng.integers(3, 30)), 2),
                                                        dtype=np.float32))
        arks.append(ark)

    def make():
        return (IterableWrapper(arks).sharded_shuffle(buffer_size=6, format="ark", seed=2)
                .bucket_by_length(8, seed=1).block_batch(PaddedArea(60), seed=5))

    for cut in (1, 3, 7):
        full, joined, _ = _cut_and_resume(make, cut)
        assert joined == full


def test_a_restore_reads_again_only_held_samples_and_the_current_prefix(corpus, monkeypatch):
    import speechpipe.pipes.order._streaming as sharding

    reads: collections.Counter = collections.Counter()
    original = sharding.read_shard

    def counting(name, **kwargs):
        for sample in original(name, **kwargs):
            reads[name] += 1
            yield sample

    monkeypatch.setattr(sharding, "read_shard", counting)
    index = ShardIndex.read(os.path.dirname(corpus[0]))
    keys = {os.path.join(index.root, e.name): list(e.keys) for e in index.shards}
    for cut in (3, 12):
        dataset = PipeDataset(stream_pipe(corpus))
        it = iter(dataset)
        consumed = sum(len(next(it)["key"]) for _ in range(cut))
        state = dataset.state_dict()
        it.close()
        reader = next(s for p, s in state["stages"].items() if "ShardedShuffler" in p)
        plan = sharding.ShardedShuffler(corpus, seed=1, index=True).epoch_plan(0).names
        current, offset = reader["shard"], reader["offset"]
        held: dict[str, set] = {}
        for stage in state["stages"].values():
            for src, key in _identities(stage):
                held.setdefault(src, set()).add(key)

        reads.clear()
        again = PipeDataset(stream_pipe(corpus))
        again.load_state_dict(state)
        assert sum(len(b["key"]) for b in again) + consumed == 200
        # shards read before the current one: only those holding a held sample
        done = set(plan[:current])
        assert {name for name in reads if name in done} <= set(held)
        # every sample read beyond what an uninterrupted run reads after the cut is a held
        # sample's shard prefix (read once) or the current shard's prefix
        new = len(keys[plan[current]]) - offset + sum(len(keys[n]) for n in plan[current + 1:])
        bound = offset + sum(max(keys[src].index(k) for k in ks) + 1
                             for src, ks in held.items() if src != plan[current])
        assert sum(reads.values()) - new <= bound
        assert bound < 200  # not the epoch again


def _identities(stage_state: dict) -> list:
    out = []
    for name in ("buffer", "open"):
        out.extend(stage_state.get(name, []))
    for name in ("pool", "pending"):
        for batch in stage_state.get(name, []):
            out.extend(batch)
    for bucket in stage_state.get("buckets", []):
        out.extend(item[:2] for item in bucket)
    out.extend(stage_state.get("held", []))
    return out


# ------------------------------------------------------------------------------ refusals


def test_torch_shuffle_cannot_be_saved_and_says_why(corpus):
    dataset = PipeDataset(IterableWrapper(corpus).sharded_shuffle(buffer_size=4).shuffle())
    it = iter(dataset)
    next(it)
    state = dataset.state_dict()  # the DataLoader asks at every step: no error there
    it.close()
    with pytest.raises(TypeError, match="shuffle keeps its buffer.*sharded_shuffle"):
        PipeDataset(IterableWrapper(corpus).sharded_shuffle(4).shuffle()).load_state_dict(state)
    with pytest.raises(TypeError, match="shuffle keeps its buffer.*resumable=False"):
        build_loader(IterableWrapper(corpus).sharded_shuffle(buffer_size=4).shuffle())  # issue 17
    loader = build_loader(IterableWrapper(corpus).sharded_shuffle(buffer_size=4).shuffle(),
                          resumable=False)
    next(iter(loader))
    with pytest.raises(TypeError, match="resumable=False"):
        loader.state_dict()  # a loader built without resume says so


def test_a_pipeline_without_a_resumable_source_cannot_be_saved():
    samples = [{"key": f"u{i}", "feats": np.zeros((i + 1, 2), np.float32)} for i in range(9)]
    dataset = PipeDataset(IterableWrapper(samples).block_batch(PaddedArea(10)))
    it = iter(dataset)
    next(it)
    state = dataset.state_dict()
    it.close()
    with pytest.raises(TypeError, match="do not come from a source that knows its position"):
        dataset.load_state_dict(state)
    # issue 17: the loader refuses it when it is built, naming the sources to start from
    with pytest.raises(TypeError, match="shuffle_samples or split_samples.*resumable=False"):
        build_loader(IterableWrapper(samples).block_batch(PaddedArea(10)))
    resumable = IterableWrapper(samples).split_samples().block_batch(PaddedArea(10))
    assert len(list(build_loader(resumable))) > 0


def test_a_state_of_another_pipeline_is_refused(corpus):
    dataset = PipeDataset(view_pipe())
    it = iter(dataset)
    next(it)
    state = dataset.state_dict()
    it.close()
    other = PipeDataset(stream_pipe(corpus))
    other.load_state_dict(state)
    with pytest.raises(ResumeError, match="saved from another pipeline"):  # a ValueError
        next(iter(other))


def test_a_changed_shard_list_is_refused_naming_it(corpus):
    dataset = PipeDataset(stream_pipe(corpus))
    it = iter(dataset)
    next(it)
    state = dataset.state_dict()
    it.close()
    other = PipeDataset(stream_pipe(corpus[:-1]))
    other.load_state_dict(state)
    with pytest.raises(DataError, match="resume: this process reads 9 shards.*saved reading 10"):
        next(iter(other))


def test_a_held_sample_missing_from_its_shard_is_named(tmp_path):
    paths = write_corpus(str(tmp_path), n=40, per_shard=10)

    def make():
        return (IterableWrapper(paths).sharded_shuffle(buffer_size=15, seed=0).decode()
                .block_batch(PaddedArea(10**6, max_samples=2), shuffle_window=1))

    dataset = PipeDataset(make())
    it = iter(dataset)
    next(it)
    state = dataset.state_dict()
    it.close()
    reader = next(s for p, s in state["stages"].items() if "ShardedShuffler" in p)
    src = reader["buffer"][0][0]
    reader["buffer"].append([src, "nope"])
    again = PipeDataset(make())
    again.load_state_dict(state)
    with pytest.raises(DataError, match=r"data-0000\d\.tar \(key 'nope'\): resume: 1 held"):
        next(iter(again))


def _audio_shards(folder, samples_per_step: int) -> list[str]:
    """Ten silent FLAC utterances at 8 kHz in shards of five (utterance i has
    ``samples_per_step × (i + 1)`` samples)."""
    with ShardWriter(str(folder / "data-%05d.tar"), maxcount=5) as writer:
        for i in range(10):
            writer.write({"key": f"a{i}", "sample_rate": 8000,
                          "flac": np.zeros(samples_per_step * (i + 1), np.float32)})
    return writer.paths


def _restored_after_one_batch(make) -> PipeDataset:
    """A new dataset of ``make()`` loaded with the state taken after its first batch."""
    dataset = PipeDataset(make())
    it = iter(dataset)
    next(it)
    state = dataset.state_dict()
    it.close()
    again = PipeDataset(make())
    again.load_state_dict(state)
    return again


def test_resuming_with_random_stages_drawing_in_sequence_warns(tmp_path):
    paths = _audio_shards(tmp_path, 80)

    def make():
        return (IterableWrapper(paths).sharded_shuffle(buffer_size=4).decode()
                .perturb_volume(seed=0).block_batch(PaddedArea(10**6, max_samples=2)))

    again = _restored_after_one_batch(make)
    with pytest.warns(ResumeWarning, match="VolumePerturber"):
        next(iter(again), None)


@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("dither", [0.0, 1.0])
def test_features_warn_on_resume_only_when_they_dither(tmp_path, dither, batched):
    """compute_features (and compute_features(batched=True) after collate, issue 20) draw only for
    dither: without it a resume repeats the run and says nothing (every recipe's resume
    warned before)."""
    import warnings

    from speechpipe.pipes.collate import PadCollate

    paths = _audio_shards(tmp_path, 800)

    def make():
        samples = IterableWrapper(paths).sharded_shuffle(buffer_size=4).decode()
        if batched:
            return (samples.block_batch(PaddedArea(10**6, max_samples=2))
                    .collate(PadCollate(fields=("key", "audio", "sample_rate")))
                    .compute_features("fbank", batched=True, dither=dither, num_mel_bins=10,
                                            device="cpu"))
        return (samples.compute_features("fbank", dither=dither, num_mel_bins=10)
                .block_batch(PaddedArea(10**6, max_samples=2)))

    again = _restored_after_one_batch(make)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        next(iter(again), None)
    said = [w for w in caught if issubclass(w.category, ResumeWarning)]
    assert bool(said) == bool(dither)


# ------------------------------------------------------------------------------ impossible states


def _edited(make, edit) -> PipeDataset:
    """A new dataset of ``make()`` loaded with the state taken after 2 batches, edited."""
    dataset = PipeDataset(make())
    it = iter(dataset)
    next(it), next(it)
    state = dataset.state_dict()
    it.close()
    for path, stage in state["stages"].items():
        edit(path, stage)
    again = PipeDataset(make())
    again.load_state_dict(state)
    return again


def _shard_stream(paths: list[str], index: bool):
    return lambda: (IterableWrapper(paths).sharded_shuffle(buffer_size=6, seed=1, index=index)
                    .decode().block_batch(PaddedArea(120), shuffle_window=2, seed=3))


@pytest.mark.parametrize("index", [True, False])
def test_a_shard_offset_past_the_shards_count_is_refused(tmp_path, index):
    # issue 29: an offset edited past the shard's count read 21 of 48 keys without a word
    make = _shard_stream(write_corpus(str(tmp_path), n=48, per_shard=8), index)

    def edit(path, stage):
        if "ShardedShuffler" in path:
            assert stage["seen"] >= 9 and stage["offset"] < 8
            stage["offset"] = 9

    said = "but the index counts 8" if index else "but it has 8"
    with pytest.raises(DataError, match=rf"data-0000\d\.tar: resume: the state says 9 samples "
                                        rf"of this shard were read, {said}; the state was edited"):
        list(_edited(make, edit))


@pytest.mark.parametrize("field, value, said", [
    ("offset", -1, "the state's offset must be an int >= 0, got -1"),
    ("shard", 6, "the state is at shard 6 of 6, past the last one"),
    ("offset", 40, "the state has read 40 samples of its shard but \\d+ in all"),
])
def test_an_impossible_shard_position_is_refused(tmp_path, field, value, said):
    make = _shard_stream(write_corpus(str(tmp_path), n=48, per_shard=8), True)

    def edit(path, stage):
        if "ShardedShuffler" in path:
            stage[field] = value

    with pytest.raises(DataError, match=f"resume: {said}"):
        list(_edited(make, edit))


@pytest.mark.parametrize("value", [-1, 200, "3"])
def test_a_sample_list_position_past_its_count_is_refused(value):
    make = manifest_pipe  # 150 rows, one process

    def edit(path, stage):
        if "SampleShuffler" in path:
            stage["next"] = value

    with pytest.raises(DataError, match=f"resume: shuffle_samples's state is at sample "
                                        f"{value!r} of this process's 150; the state was edited"):
        list(_edited(make, edit))


if __name__ == "__main__":
    _child(sys.argv[1])
