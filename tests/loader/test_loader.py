"""build_loader and PipeDataset: pipes inside torch's DataLoader (issue 6).

Invariants: with any number of workers every sample comes out once per epoch (none twice,
none lost); the same seed gives the same batches; set_epoch reaches the workers, persistent
ones included; batches arrive collated (one transfer per batch); resident memory stays flat
over many epochs.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import speechpipe  # noqa: F401  (registers the pipes)
from speechpipe import PaddedArea
from speechpipe.errors import DataError, MissingDataError
from speechpipe.loader import Loader, PipeDataset, SharedEpoch, build_loader
from speechpipe.pipes._core import IterableWrapper, SequenceWrapper
from speechpipe.pipes.collate import PadCollate
from speechpipe.pipes.shards import ShardWriter
from speechpipe.pipes.batching import BatchView

DIM = 4


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("shards")
    rng = np.random.default_rng(0)
    with ShardWriter(str(root / "data-%05d.tar"), maxcount=15) as writer:
        for i in range(120):
            writer.write({"key": f"u{i:03d}",
                          "feats.npy": np.full((int(rng.integers(4, 50)), DIM), i, np.float32)})
    return writer.paths


def stream(paths, seed: int = 0):
    return (IterableWrapper(paths).sharded_shuffle(buffer_size=20, seed=seed).decode()
            .bucket_by_length(30, seed=seed).block_batch(PaddedArea(200), seed=seed)
            .collate(collate_fn=PadCollate()))


def keys_per_epoch(loader: Loader, epochs) -> list[list[tuple]]:
    out = []
    for epoch in epochs:
        loader.set_epoch(epoch)
        out.append([tuple(batch["key"]) for batch in loader])
    return out


# ------------------------------------------------------------------------------ sharding


@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker")
@pytest.mark.parametrize("workers", [0, 2, 3])
def test_every_sample_comes_out_once_per_epoch_with_any_number_of_workers(shards, workers):
    loader = build_loader(stream(shards), num_workers=workers, seed=0)
    for batches in keys_per_epoch(loader, [0, 1]):
        keys = [k for batch in batches for k in batch]
        assert len(keys) == 120 and set(keys) == {f"u{i:03d}" for i in range(120)}


def test_torch_sharding_filter_is_applied_in_the_workers():
    pipe = IterableWrapper(list(range(60))).shuffle().sharding_filter().batch(4)
    loader = build_loader(pipe, num_workers=2, seed=3, resumable=False)  # torch's stages
    for batches in keys_per_epoch_plain(loader, [0, 1]):
        assert sorted(x for b in batches for x in b) == list(range(60))


def keys_per_epoch_plain(loader, epochs):
    out = []
    for epoch in epochs:
        loader.set_epoch(epoch)
        out.append([list(b) for b in loader])
    return out


def test_the_same_seed_gives_the_same_batches_and_workers_differ(shards):
    one = keys_per_epoch(build_loader(stream(shards), num_workers=2, seed=0), [0])
    two = keys_per_epoch(build_loader(stream(shards), num_workers=2, seed=0), [0])
    assert one == two
    assert one != keys_per_epoch(build_loader(stream(shards, seed=1), num_workers=2), [0])


def test_set_epoch_reaches_persistent_workers(shards):
    persistent = build_loader(stream(shards), num_workers=2, persistent_workers=True)
    epochs = keys_per_epoch(persistent, [0, 1, 2])
    assert epochs[0] != epochs[1] != epochs[2]
    for epoch in (1, 2):  # what fresh workers give at that epoch
        fresh = build_loader(stream(shards), num_workers=2)
        assert keys_per_epoch(fresh, [epoch])[0] == epochs[epoch]
    assert persistent.epoch == 3  # epoch 2's pass ran to its end: the next is epoch 3


@pytest.mark.parametrize("workers, persistent", [(0, False), (2, False), (2, True)])
def test_epochs_advance_by_themselves_without_set_epoch(shards, workers, persistent):
    """Issue 17: a new pass over a loader is the next epoch unless the user sets one, so the
    same order never comes twice in a row silently (webdataset#172)."""
    expected = keys_per_epoch(build_loader(stream(shards), num_workers=workers), [0, 1, 2, 3])
    assert len(set(map(tuple, expected))) == 4
    loader = build_loader(stream(shards), num_workers=workers, persistent_workers=persistent)
    passes = [[tuple(b["key"]) for b in loader] for _ in range(2)]
    assert passes == expected[:2]
    assert loader.epoch == 2
    for _ in loader:  # epoch 2, left early: the next pass is epoch 3 all the same
        break
    assert [tuple(b["key"]) for b in loader] == expected[3]
    loader.set_epoch(1)  # an epoch set by the user is used as it is
    assert [tuple(b["key"]) for b in loader] == expected[1]


def test_a_checkpoint_after_the_loop_names_the_next_epoch(shards):
    """Issue 23: after ``for batch in loader`` has ended, the state is the start of the next
    epoch (restoring it does not replay the epoch that ended)."""
    loader = build_loader(stream(shards), seed=0)
    first = [tuple(b["key"]) for b in loader]
    state = loader.state_dict()
    assert state["epoch"] == 1 and loader.epoch == 1
    again = build_loader(stream(shards), seed=0)
    again.load_state_dict(state)
    assert again.epoch == 1
    resumed = [tuple(b["key"]) for b in again]
    assert resumed == [tuple(b["key"]) for b in loader] and resumed != first


def test_shared_epoch_is_read_by_the_dataset_at_each_pass(shards):
    dataset = PipeDataset(stream(shards))
    first = [tuple(b["key"]) for b in dataset]
    dataset.set_epoch(1)
    assert [tuple(b["key"]) for b in dataset] != first
    dataset.set_epoch(0)
    assert [tuple(b["key"]) for b in dataset] == first
    with pytest.raises(ValueError, match="epoch must be an int >= 0, got -1"):
        SharedEpoch().set(-1)


# ------------------------------------------------------------------------------ batches


def test_batches_arrive_collated_one_transfer_per_batch(shards):
    loader = build_loader(stream(shards), num_workers=2, prefetch_factor=3)
    batches = list(loader)
    assert all(isinstance(b["feats"], torch.Tensor) and b["feats"].ndim == 3 for b in batches)
    assert sum(len(b["key"]) for b in batches) == 120 and len(batches) < 120


def test_the_view_path_gives_the_same_batches_with_and_without_workers():
    data = {f"v{i}": {"key": f"v{i}", "feats": np.ones((i % 17 + 1, DIM), np.float32)}
            for i in range(60)}
    view = BatchView({k: len(s["feats"]) for k, s in data.items()}, budget=60, seed=2)

    def pipe():
        return SequenceWrapper(data).batch_by_view(view).collate(collate_fn=PadCollate())

    plain = keys_per_epoch(build_loader(pipe()), [0, 1])
    workers = keys_per_epoch(build_loader(pipe(), num_workers=2, persistent_workers=True),
                             [0, 1])
    assert plain == workers
    assert len(build_loader(pipe(), num_workers=2)) == len(view)


def test_device_moves_batches_in_the_main_process(shards):
    loader = build_loader(stream(shards), device="meta")
    batch = next(iter(loader))
    assert batch["feats"].device.type == "meta" and isinstance(batch["key"], list)


def test_uneven_policy_and_hook_wrap_the_dataloader(shards):
    stopped = build_loader(stream(shards), uneven="stop")
    assert sum(len(b["key"]) for b in stopped) == 120  # one process: every batch
    seen = []

    def hook(dataloader):
        seen.append(dataloader)
        return (batch for batch in [next(iter(dataloader))])

    hooked = build_loader(stream(shards), uneven=hook)
    assert seen == [hooked.dataloader] and len(list(hooked)) == 1


@pytest.mark.parametrize("kwargs, message", [
    ({"prefetch_factor": 2}, "prefetch_factor needs num_workers > 0"),
    ({"persistent_workers": True}, "persistent_workers=True needs num_workers > 0"),
    ({"num_workers": -1}, "num_workers must be an int >= 0, got -1"),
    ({"num_workers": 1, "prefetch_factor": 0}, "prefetch_factor must be an int >= 1, got 0"),
    ({"device": "gpu7"}, "device must name a torch device"),
    ({"uneven": 3}, "uneven must be a policy name or a callable"),
    ({"snapshot_every": 0}, "snapshot_every must be an int >= 1, got 0"),
])
def test_build_loader_validates_its_arguments(shards, kwargs, message):
    with pytest.raises((ValueError, TypeError), match=message):
        build_loader(stream(shards), **kwargs)


def test_pipe_dataset_refuses_what_is_not_an_iterable_pipe():
    with pytest.raises(TypeError, match="turn a MapDataPipe into batches"):
        PipeDataset(SequenceWrapper([1, 2]))
    with pytest.raises(TypeError, match="pipe must be an IterDataPipe, got list"):
        PipeDataset([1, 2])


# ------------------------------------------------------------------------------ memory


def _rss_kib(pid: int | str = "self") -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_resident_memory_stays_flat_over_twenty_epochs(tmp_path):
    # 200 utterances of 80-dim features, ~13 MB per epoch. Bound: 16 MiB of growth over 20
    # epochs in the main process and in each persistent worker -- leaking even 7 % of each
    # epoch's data, or one epoch's buffers per epoch, would exceed it.
    rng = np.random.default_rng(1)
    with ShardWriter(str(tmp_path / "data-%05d.tar"), maxcount=25) as writer:
        for i in range(200):
            writer.write({"key": f"m{i:03d}", "feats.npy": rng.standard_normal(
                (int(rng.integers(100, 300)), 80), dtype=np.float32)})
    pipe = (IterableWrapper(writer.paths).sharded_shuffle(buffer_size=50).decode()
            .prefetch_in_thread(8).bucket_by_length(60).block_batch(PaddedArea(3000))
            .collate(collate_fn=PadCollate()))
    loader = build_loader(pipe, num_workers=1, persistent_workers=True)
    keys_per_epoch(loader, [0, 1])  # warm up: allocator pools, imports, worker start
    worker = loader.dataloader._iterator._workers[0].pid
    main_before, worker_before = _rss_kib(), _rss_kib(worker)
    for epoch in range(2, 22):
        loader.set_epoch(epoch)
        assert sum(len(b["key"]) for b in loader) == 200
    main_growth, worker_growth = _rss_kib() - main_before, _rss_kib(worker) - worker_before
    assert main_growth < 16 * 1024, f"main process grew {main_growth} KiB"
    assert worker_growth < 16 * 1024, f"worker grew {worker_growth} KiB"


def test_as_tensors_converts_arrays_anywhere_and_leaves_key_lists_alone():
    from speechpipe.loader import as_tensors

    keys = ["u1", "u2"]
    batch = {"feats": np.zeros((2, 3), np.float32), "key": keys, "n": 3,
             "nested": [np.ones(2, np.int64), "x"], "pair": (np.zeros(1), 1.5),
             "scalar": np.float32(0.5)}
    out = as_tensors(batch)
    assert out["key"] is keys and out["n"] == 3
    assert isinstance(out["feats"], torch.Tensor) and out["feats"].shape == (2, 3)
    assert isinstance(out["nested"][0], torch.Tensor) and out["nested"][1] == "x"
    assert isinstance(out["pair"][0], torch.Tensor) and out["pair"][1] == 1.5
    assert isinstance(out["scalar"], torch.Tensor)
    assert np.shares_memory(out["feats"].numpy(), batch["feats"])


def _scp_pipe(paths):
    return (IterableWrapper(paths).sharding_filter().open_files(mode="b").parse_scp()
            .map(tuple))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_data_error_in_a_worker_keeps_its_file_line_and_reason(tmp_path, workers):
    """torch rebuilds a worker's exception from its text; the location survives as attributes
    and as the start of the message, with the worker's traceback kept below it."""
    good, bad = tmp_path / "a.scp", tmp_path / "b.scp"
    good.write_text("u1 x\nu2 y\n", encoding="utf-8")
    bad.write_text("u3 z\nu4\nu5 w\n", encoding="utf-8")
    loader = build_loader(_scp_pipe([str(good), str(bad)]), num_workers=workers, seed=0,
                          resumable=False)  # a sharding_filter pipeline
    with pytest.raises(DataError) as caught:
        list(loader)
    error = caught.value
    assert (error.source, error.line) == (str(bad), 2)
    assert error.reason.startswith("expected '<key> <value>'")
    assert str(error).startswith(f"{bad}:2: expected '<key> <value>'")
    if workers:
        assert "DataLoader worker process" in str(error)  # torch's account follows
        assert "speechpipe-location" not in str(error)


def test_a_missing_file_in_a_worker_is_still_a_missing_data_error_with_its_source(tmp_path):
    pipe = IterableWrapper([str(tmp_path / "nowhere.tar")]).sharding_filter().open().read_shards()
    with pytest.raises(MissingDataError) as caught:
        list(build_loader(pipe, num_workers=1, seed=0, resumable=False))
    assert caught.value.source == str(tmp_path / "nowhere.tar")
    assert isinstance(caught.value, FileNotFoundError)


def test_a_marked_message_that_is_not_json_leaves_the_error_unlocated():
    from speechpipe.errors import DataError

    error = DataError("Caught DataError.\nspeechpipe-location: {not json}")
    assert error.source is None and error.line is None
    assert "{not json}" in str(error)


# ------------------------------------------------------------------------------ skip counts


def _with_duration(sample):
    return {**sample, "duration": len(sample["feats"]) / 10}


def _skipping(paths):
    """A pipeline whose pipes count what they drop: durations filtered, oversize dropped."""
    return (IterableWrapper(paths).sharded_shuffle(buffer_size=20, seed=0).decode()
            .map(_with_duration)
            .filter_by_duration(1.0, 4.5, warn=False)
            .block_batch(PaddedArea(40), oversize="drop", seed=0)
            .collate(collate_fn=PadCollate()))


def _ledgers_of(pipe):
    from speechpipe.diagnostics import Diagnostics
    from speechpipe.pipes._core import graph_nodes
    from speechpipe.pipes.batching import BatchStats

    out = {}
    for node in graph_nodes(pipe):
        for attr in ("diagnostics", "stats"):
            ledger = getattr(node, attr, None)
            if isinstance(ledger, Diagnostics):
                out[type(node).__name__] = dict(ledger.counts)
            elif isinstance(ledger, BatchStats):
                out[type(node).__name__] = (ledger.samples, ledger.oversize_dropped)
                out["sizes"] = sorted(ledger.sizes)
    return out


@pytest.mark.parametrize("persistent", [False, True])
def test_skip_counts_of_the_workers_reach_the_main_process_pipes(shards, persistent):
    """With workers, the main process's pipes never run; after a pass they hold the sum of the
    workers' counts, equal to those of the same epoch run without workers."""
    alone = _skipping(shards)
    for _ in build_loader(alone, num_workers=0):
        pass
    expected = _ledgers_of(alone)
    expected.pop("sizes")  # the batches themselves differ: each worker packs its own stream
    assert sum(expected["DurationFilterIterDataPipe"].values()) > 0  # the data does skip
    assert expected["BlockBatcherIterDataPipe"][1] > 0
    pipe = _skipping(shards)
    loader = build_loader(pipe, num_workers=2, persistent_workers=persistent)
    for epoch in range(2):  # the second pass replaces the first's counts, not adds to them
        loader.set_epoch(0)
        batches = list(loader)
        counts = _ledgers_of(pipe)
        assert counts.pop("sizes") == sorted(len(b["key"]) for b in batches)
        assert counts == expected


def test_a_pass_left_early_reports_nothing_and_the_next_full_pass_counts_alone(shards):
    pipe = _skipping(shards)
    loader = build_loader(pipe, num_workers=2)
    for _ in loader:
        break
    assert _ledgers_of(pipe)["sizes"] == []  # the abandoned pass: nothing added up
    batches = list(loader)
    alone = _skipping(shards)
    list(build_loader(alone, num_workers=0))
    counts, expected = _ledgers_of(pipe), _ledgers_of(alone)
    assert counts.pop("sizes") == sorted(len(b["key"]) for b in batches)
    expected.pop("sizes")
    assert counts == expected


def test_token_counts_of_the_workers_reach_the_main_process_tokenize(tmp_path):
    """tokenize's stats (what pipeline_report prints) are summed over the workers too, as
    the README's recipe block shows: not zero in the main process after a pass."""
    from speechpipe.pipes.text import CharTokenizer

    texts = ["ab ba", "abc", "a", "bca b", "cab", "b a c", "ab", "zz"]
    tok = CharTokenizer.build(texts[:-1])  # "z" is unknown: <unk> counted
    rows = [{"key": f"u{i}", "text": t, "feats": np.zeros((i + 1, DIM), np.float32)}
            for i, t in enumerate(texts)]

    def pipe():
        return (IterableWrapper(rows).shuffle_samples(seed=0)
                .tokenize(tok, max_unk_rate=None)
                .block_batch(PaddedArea(8), seed=0).collate(collate_fn=PadCollate()))

    def token_stats(p):
        node = p
        while type(node).__name__ != "TokenizerIterDataPipe":
            node = node.source_datapipe if hasattr(node, "source_datapipe") else node.datapipe
        return node.stats

    alone = pipe()
    list(build_loader(alone, num_workers=0))
    expected = token_stats(alone)
    assert (expected.samples, expected.unk_tokens) == (8, 2)
    workers = pipe()
    list(build_loader(workers, num_workers=2))
    got = token_stats(workers)
    assert (got.samples, got.tokens, got.unk_tokens, got.samples_with_unk, got.unknown) == (
        expected.samples, expected.tokens, expected.unk_tokens, expected.samples_with_unk,
        expected.unknown)
    assert got.examples == ["u7"]


def test_the_reports_folder_goes_with_the_loader(shards):
    import gc
    import os

    loader = build_loader(_skipping(shards), num_workers=1)
    list(loader)
    folder = loader.dataset._reports
    assert os.path.isdir(folder) and not os.listdir(folder)  # collected and cleared
    del loader
    gc.collect()
    assert not os.path.exists(folder)


def test_the_end_of_epoch_report_shows_what_a_skipped_shard_lost(tmp_path):
    # Issue 18, case 3: with workers, the loss counted in each worker reaches the main
    # process's pipes, and so the end-of-epoch report (sp.pipeline_report).
    from speechpipe.index import ShardEntry, ShardIndex

    with ShardWriter(str(tmp_path / "data-%05d.tar"), maxcount=10) as writer:
        for i in range(40):
            writer.write({"key": f"u{i:03d}", "txt": "x"})
    entries = [ShardEntry(os.path.basename(p), 10, os.path.getsize(p),
                          tuple(f"u{i:03d}" for i in range(n * 10, n * 10 + 10)), (100.0,) * 10)
               for n, p in enumerate(writer.paths)]
    ShardIndex(str(tmp_path), entries).write()
    with open(writer.paths[1], "r+b") as f:
        f.truncate(1500)  # inside the second member (100 frames: 1 s per utterance)
    pipe = (IterableWrapper(writer.paths)
            .sharded_shuffle(buffer_size=1, index=True, on_error="skip")
            .map(lambda s: s["key"]))
    loader = build_loader(pipe, num_workers=2, resumable=False)
    keys = list(loader)  # (each worker warns in its own process)
    lost = 40 - len(keys)
    assert 9 <= lost <= 10 and len(set(keys)) == len(keys)
    report = speechpipe.pipeline_report(loader.dataset.pipe)  # the end-of-epoch report
    assert f"skipped 1 item(s), losing {lost} utterance(s) ({lost:.1f} s)" in report
    assert f"came out short: {40 - lost} of the 40 utterances planned (len()) came out" in report


_AFTER_A_WORKER_ERROR = """
import speechpipe as sp
from speechpipe.pipes._core._base import IterableWrapper

def boom(x):
    if x == 3:
        raise ValueError("bad item")
    return x

def main():
    loader = sp.build_loader(IterableWrapper(list(range(8))).sharding_filter().map(boom),
                             num_workers=2, resumable=False)
    try:
        list(loader)
    except ValueError as exc:
        print("caught:", exc)
    again = sp.build_loader(IterableWrapper(list(range(8))).sharding_filter(), num_workers=2,
                            resumable=False)
    print(sorted(int(x) for x in again))

main()
"""


def test_no_assertion_from_a_dead_loaders_del_after_an_error_in_a_worker(tmp_path):
    # Issue 18, case 9: the failed loader's DataLoader iterator, kept alive by the exception's
    # traceback, was inherited by the next loader's forked workers and collected there: its
    # __del__ printed "AssertionError: can only test a child process". Its own process.
    import subprocess
    import sys

    script = tmp_path / "after_error.py"
    script.write_text(_AFTER_A_WORKER_ERROR)
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(speechpipe.__file__))}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "caught: " in done.stdout and "[0, 1, 2, 3, 4, 5, 6, 7]" in done.stdout
    assert "can only test a child process" not in done.stderr
    assert "Exception ignored" not in done.stderr


def test_garbage_is_collected_before_forking_only_after_a_pass_that_did_not_end(monkeypatch):
    # A full gc.collect() before every pass's fork cost 78 of the main process's 175 CPU-ms in
    # an epoch of bench_pipeline's audio road (issue 20); it is needed only when an earlier
    # pass's iterator may still be alive (an exception's traceback, a pass left early).
    from speechpipe import loader as loader_module

    calls = []
    monkeypatch.setattr(loader_module.gc, "collect", lambda *a: calls.append(a) or 0)
    monkeypatch.setattr(loader_module, "_collect_before_fork", False)
    loader = build_loader(IterableWrapper(list(range(8))).sharding_filter(), num_workers=2,
                             resumable=False)
    assert sorted(int(x) for x in loader) == list(range(8))
    assert sorted(int(x) for x in loader) == list(range(8))
    assert calls == []  # two passes that ended: no collection
    for _ in loader:
        break  # left early
    assert sorted(int(x) for x in loader) == list(range(8))
    assert len(calls) == 1  # collected once, before the next pass forked
    assert sorted(int(x) for x in loader) == list(range(8))
    assert len(calls) == 1


def test_skips_in_workers_are_warned_once_per_pass_by_the_main_process_counted_once(capfd):
    # Issue 32.5: filter_by_duration before the split between workers warned in every worker
    # every epoch, and pipeline_report said 'skipped 36 item(s)' for 18 utterances (each
    # worker counted the whole list).
    import warnings

    import speechpipe as sp
    from speechpipe.diagnostics import SkippedInputWarning

    rows = [{"key": f"u{i:02d}", "duration": 0.5 if i % 4 == 0 else 2.0} for i in range(24)]
    pipe = (sp.IterableWrapper(rows).filter_by_duration(1.0)
            .shuffle_samples(seed=0).batch(4))
    loader = sp.build_loader(pipe, num_workers=2, seed=0, resumable=False)
    for epoch in range(2):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            keys = [s["key"] for batch in loader for s in batch]
        assert len(keys) == 18
        skipped = [str(w.message) for w in caught if w.category is SkippedInputWarning]
        assert skipped == ["filter_by_duration skipped 6 item(s):\n  shorter than 1.0 s: 6 "
                           "(e.g. key 'u00' (0.50 s))"], skipped
        assert "filter_by_duration skipped 6 item(s)" in sp.pipeline_report(pipe)
    assert "SkippedInputWarning" not in capfd.readouterr().err  # nothing from the workers


def test_a_worker_whose_loader_is_gone_writes_no_report_and_says_nothing(tmp_path):
    """A loop left early and a script ending: the loader (and its reports folder) is collected
    while a worker ends its pass; nobody will read its report, so no warning (a full disk, where
    the folder still exists, still warns)."""
    import warnings

    from speechpipe.worker_reports import write_report

    pipe = IterableWrapper([1, 2])
    gone = tmp_path / "reports"  # never made: the folder was removed
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        write_report(str(gone), 0, pipe)
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    (blocked / "worker-0.json.tmp").mkdir()  # the write fails with the folder there
    with pytest.warns(RuntimeWarning, match="could not report"):
        write_report(str(blocked), 0, pipe)
