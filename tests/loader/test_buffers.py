"""What the buffering stages hold (issue 23, item 8): ``buffers`` of ``sharded_shuffle``,
``bucket_by_length`` and ``block_batch`` count samples and array bytes now and at peak, and
``pipeline_report`` shows them, per worker after a loader pass with workers.

The expected peaks are computed here from the stages' documented behaviour (arrival order,
output order, window / buffer sizes) and the arrays' own ``nbytes``, not from the counters.
"""

from __future__ import annotations

import os
import random
import weakref

import numpy as np
import pytest
import torch

import speechpipe
from speechpipe.diagnostics import BufferStats
from speechpipe.loader import PipeDataset, build_loader
from speechpipe.pipes._core import IterableWrapper
from speechpipe.pipes._core import graph_nodes
from speechpipe.pipes.batching._buckets import BlockBatcher, LengthBucketer
from speechpipe.pipes.batching import bucket_groups
from speechpipe.pipes.collate import PadCollate
from speechpipe.pipes.order import shuffle_window
from speechpipe.pipes.shards import ShardWriter
from speechpipe.pipes.shards import ShardReadOptions
from speechpipe import PaddedArea

DIM = 8
SEED = 3


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("shards")
    with ShardWriter(str(root / "data-%05d.tar"), maxcount=20) as writer:
        for i in range(80):  # frames 5..41: every sample's feats has a known, distinct size
            writer.write({"key": f"u{i:03d}",
                          "feats.npy": np.full((5 + (i * 7) % 37, DIM), i, np.float32)})
    return writer.paths


def array_bytes(sample: dict) -> int:
    return sum(v.nbytes for v in sample.values() if isinstance(v, np.ndarray))


def raw_bytes(sample: dict) -> int:
    return sum(len(v) for v in sample.values() if isinstance(v, (bytes, memoryview)))


def window_peak(arrivals: list, departures: list, window: int, size) -> tuple[int, int]:
    """(samples, bytes) at peak of a shuffle window of ``window`` items: after each arrival
    from the ``window``-th on, the next item of ``departures`` leaves."""
    held, peak_n, peak_b, out = {}, 0, 0, iter(departures)
    for t, item in enumerate(arrivals):
        held[item[0]] = item[1]
        peak_n = max(peak_n, sum(len(v) for v in held.values()))
        peak_b = max(peak_b, sum(size(s) for v in held.values() for s in v))
        if t >= window - 1:
            del held[next(out)]
    return peak_n, peak_b


def decoded(paths):
    return IterableWrapper(paths).sharded_shuffle(buffer_size=1, seed=SEED).decode()


def test_bucket_buffers_peak_is_the_largest_full_bucket(shards):
    arrivals = list(decoded(shards))
    pipe = decoded(shards).bucket_by_length(buffer_size=12, seed=SEED)
    groups = list(pipe)
    # one bucket: it fills with 12 consecutive samples and leaves whole
    chunks = [arrivals[i:i + 12] for i in range(0, len(arrivals), 12)]
    assert sorted(map(len, groups)) == sorted(map(len, chunks))
    stats = pipe.buffers
    assert stats.peak_samples == 12
    assert stats.peak_bytes == max(sum(array_bytes(s) for s in c) for c in chunks)
    assert (stats.samples, stats.bytes) == (0, 0)  # everything left by the end


def test_block_batch_window_peak_is_the_held_batches_bytes(shards):
    def batches(window):
        return decoded(shards).block_batch(PaddedArea(120), shuffle_window=window, seed=SEED)

    packed = [tuple(s["key"] for s in b) for b in batches(1)]  # packing order, no window
    sizes = {s["key"]: array_bytes(s) for s in decoded(shards)}
    pipe = batches(5)
    out = [tuple(s["key"] for s in b) for b in pipe]
    assert sorted(out) == sorted(packed) and out != packed
    expected = window_peak([(b, b) for b in packed], out, 5, sizes.__getitem__)
    assert (pipe.buffers.peak_samples, pipe.buffers.peak_bytes) == expected
    assert pipe.buffers.peak_bytes > 0


@pytest.fixture(scope="module")
def big_shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("big")
    with ShardWriter(str(root / "big-%05d.tar"), maxcount=6) as writer:
        for i in range(12):  # 70 kB to 92 kB: payloads of 64 KiB and more are mapped views
            writer.write({"key": f"b{i:02d}",
                          "feats.npy": np.full((2200 + 60 * i, DIM), i, np.float32)})
    return writer.paths


@pytest.mark.parametrize("which", ["small", "big"])
def test_shard_buffer_counts_the_undecoded_bytes_it_holds(shards, big_shards, which):
    paths = shards if which == "small" else big_shards
    options = ShardReadOptions(mmap=True, readahead=False)
    raw = IterableWrapper(paths).sharded_shuffle(buffer_size=1, seed=SEED, read_options=options)
    arrivals = [(s["key"], (s,)) for s in raw]
    kinds = {type(s[0]["feats.npy"]) for _, s in arrivals}
    assert kinds == ({bytes} if which == "small" else {memoryview})
    sizes = {s[0]["key"]: raw_bytes(s[0]) for _, s in arrivals}
    pipe = IterableWrapper(paths).sharded_shuffle(buffer_size=5, seed=SEED, read_options=options)
    out = [s["key"] for s in pipe]
    expected = window_peak(arrivals, out, 5, lambda s: sizes[s["key"]])
    assert expected[0] == 5
    assert (pipe.buffers.peak_samples, pipe.buffers.peak_bytes) == expected
    # a view counts as its own bytes, not its mapping's (the whole shard)
    assert pipe.buffers.peak_bytes < 5 * max(sizes.values()) < sum(map(os.path.getsize, paths))


def _bucketed_window(shards):
    return (decoded(shards).bucket_by_length(buffer_size=12, seed=SEED)
            .block_batch(PaddedArea(120), shuffle_window=5, seed=SEED))


def _resumed_after_four_batches(shards) -> tuple[dict, PipeDataset]:
    """The state of ``_bucketed_window`` after 4 batches, and a new dataset it is loaded in."""
    first = PipeDataset(_bucketed_window(shards), seed=SEED)
    it = iter(first)
    for _ in range(4):
        next(it)
    state = first.state_dict()
    again = PipeDataset(_bucketed_window(shards), seed=SEED)
    again.load_state_dict(state)
    return state, again


def test_a_resumed_window_is_counted_and_leaves_nothing_behind(shards):
    state, again = _resumed_after_four_batches(shards)
    window = [b for b in state["stages"].values() if "pool" in b]
    rest = list(again)
    assert rest
    nodes = {type(n).__name__: n for n in graph_nodes(again.pipe)}
    for name in ("LengthBucketerIterDataPipe", "BlockBatcherIterDataPipe"):
        stats = nodes[name].buffers
        assert (stats.samples, stats.bytes) == (0, 0), name  # what was restored, left
    held = sum(len(b) for b in window[0]["pool"])
    assert nodes["BlockBatcherIterDataPipe"].buffers.peak_samples >= held > 0


def test_pipeline_report_has_a_buffers_line_per_stage(shards):
    pipe = (IterableWrapper(shards).sharded_shuffle(buffer_size=9, seed=SEED).decode()
            .bucket_by_length(buffer_size=12, seed=SEED).block_batch(PaddedArea(120), seed=SEED))
    list(pipe)
    report = speechpipe.pipeline_report(pipe)
    for stage in ("sharded_shuffle", "bucket_by_length", "block_batch"):
        assert f"{stage} buffers: " in report
    assert "bucket_by_length buffers: 12 sample(s)" in report


def test_with_two_workers_each_workers_buffers_reach_the_main_process(shards):
    pipe = (IterableWrapper(shards).sharded_shuffle(buffer_size=9, seed=SEED).decode()
            .bucket_by_length(buffer_size=12, seed=SEED).block_batch(PaddedArea(120), seed=SEED)
            .collate(collate_fn=PadCollate()))
    loader = build_loader(pipe, num_workers=2, seed=SEED)
    assert sum(len(b["key"]) for b in loader) == 80
    nodes = {type(n).__name__: n for n in graph_nodes(pipe)}
    buckets = nodes["LengthBucketerIterDataPipe"].buffers
    assert [w["worker"] for w in buckets.workers] == [0, 1]
    assert all(w["peak_samples"] == 12 for w in buckets.workers)  # 40 samples per worker
    # each worker's bytes at peak: 12 of its samples' arrays, at least the 12 smallest
    smallest = 12 * 5 * DIM * 4
    assert all(w["peak_bytes"] >= smallest for w in buckets.workers)
    report = speechpipe.pipeline_report(loader.dataset.pipe)
    assert "bucket_by_length buffers at peak (array bytes), per worker: worker 0: 12" in report
    assert "block_batch buffers at peak (array bytes), per worker: worker 0: " in report
    assert "; worker 1: " in report


def test_buffer_stats_count_tensors_and_views_as_their_own_bytes():
    stats = BufferStats("s")
    storage = torch.zeros(1000)
    first = [{"audio": storage[:10], "feats": np.zeros((3, 2), np.float64)}]
    stats.add(first)
    stats.add({"audio": memoryview(bytes(100))[:10]})
    stats.remove(first)
    assert (stats.samples, stats.bytes, stats.peak_samples, stats.peak_bytes) == (1, 10, 2, 98)


def test_prefetch_in_thread_counts_the_items_read_ahead():
    import time

    rows = [{"key": f"u{i}", "audio": torch.zeros(1000 + i)} for i in range(12)]
    pipe = IterableWrapper(rows).prefetch_in_thread(buffer_size=4)
    it = iter(pipe)
    first = next(it)
    deadline, last, since = time.monotonic() + 20, -1, time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - since < 0.5:
        if pipe.buffers.samples != last:  # the thread reads ahead while this consumer waits
            last, since = pipe.buffers.samples, time.monotonic()
        time.sleep(0.01)
    n = pipe.buffers.samples  # read and not yet yielded: at most buffer_size
    assert 1 <= n <= 4
    assert pipe.buffers.bytes == sum(r["audio"].nbytes for r in rows[1:1 + n])
    rest = list(it)
    assert [r["key"] for r in [first] + rest] == [r["key"] for r in rows]
    stats = pipe.buffers
    assert n <= stats.peak_samples <= 4 and (stats.samples, stats.bytes) == (0, 0)
    assert stats.peak_bytes <= sum(r["audio"].nbytes for r in rows[-4:])


def test_shuffle_samples_holds_its_whole_source_for_the_pass():
    rows = [{"key": f"u{i}", "feats": np.zeros((i + 1, DIM), np.float32)} for i in range(7)]
    pipe = IterableWrapper(rows).shuffle_samples(seed=SEED)
    it = iter(pipe)
    next(it)
    assert (pipe.buffers.samples, pipe.buffers.bytes) == (7, sum(array_bytes(r) for r in rows))
    list(it)
    assert (pipe.buffers.samples, pipe.buffers.peak_samples) == (0, 7)


def test_bucket_by_length_keeps_no_head_sample_alive_after_it_left():
    # with num_buckets, the first buffer_size samples (the head the boundaries are estimated
    # from) were kept alive for the whole pass by the head list, outside the buffer's count
    import gc
    import weakref

    arrays = []

    class Rows:
        def __iter__(self):
            for i in range(200):
                feats = np.zeros((1 + 8 * (i % 2), DIM), np.float32)
                if i < 8:
                    arrays.append(weakref.ref(feats))
                yield {"key": f"u{i:03d}", "feats": feats}

    pipe = IterableWrapper(Rows(), deepcopy=False).bucket_by_length(buffer_size=8, num_buckets=2)
    it = iter(pipe)
    first = [s["key"] for s in next(it)]
    assert sorted(first) == ["u000", "u002", "u004", "u006"]  # the short bucket, all head
    for _ in range(20):
        next(it)
    gc.collect()
    assert [arrays[i]() for i in (0, 2, 4, 6)] == [None] * 4


class Measured:
    """A sample field with ``nbytes`` that counts how often it is read."""

    reads = 0

    def __init__(self, nbytes: int) -> None:
        self._nbytes = nbytes

    @property
    def nbytes(self) -> int:
        Measured.reads += 1
        return self._nbytes


@pytest.mark.parametrize("stage", ["sharded_shuffle", "bucket_by_length", "block_batch"])
def test_each_buffering_stage_measures_a_sample_once(stage):
    # Issue 23: counting walked every sample's values twice per stage (in and out), about
    # 1 us per sample per stage; the bytes counted as an item enters are kept beside it and
    # taken out with it, not walked again (only the tail drained at the end of the stream is).
    rows = [{"key": f"u{i:03d}", "feats": Measured(10 * (1 + i % 7)), "n": i % 7}
            for i in range(100)]
    meter = BufferStats(stage)
    Measured.reads = 0
    if stage == "sharded_shuffle":  # its sample buffer: 10 samples
        out = list(shuffle_window(rows, 10, random.Random(SEED), meter=meter))
    elif stage == "bucket_by_length":  # 10 samples in 2 buckets
        out = [s for g in bucket_groups(iter(rows), buffer_size=10, boundaries=[3],
                                        measure=lambda s: s["n"], rng=random.Random(SEED),
                                        meter=meter) for s in g]
    else:  # block_batch's window: 5 batches of 4
        batches = [rows[i:i + 4] for i in range(0, 100, 4)]
        out = [s for b in shuffle_window(batches, 5, random.Random(SEED), meter=meter)
               for s in b]
    assert sorted(s["key"] for s in out) == [r["key"] for r in rows]
    assert (meter.samples, meter.bytes) == (0, 0)  # everything counted out again
    assert meter.peak_bytes >= 10 * meter.peak_samples > 0
    assert Measured.reads <= 100 + 20  # once in each; a drained tail of < 20 walked again


class Token:
    """A sample field that can be weakly referenced: alive while its sample is."""


class Watched:
    """A plain iterable of samples (no torch hook around it: torch's own pipes keep the item
    they yielded last while they make the next) that, at each read and as each output
    arrives, counts the samples the consumer was handed and dropped which are still alive,
    that is, kept by the stages."""

    def __init__(self, n: int) -> None:
        self.n, self.refs, self.dropped, self.kept = n, {}, set(), []

    def __iter__(self):
        for i in range(self.n):
            self.kept.append(self.alive())
            yield self.sample(i)  # no local here names it

    def sample(self, i: int) -> dict:
        token = Token()
        self.refs[f"u{i:03d}"] = weakref.ref(token)
        return {"key": f"u{i:03d}", "token": token,
                "feats": np.zeros((1 + (i * 7) % 40, DIM), np.float32)}

    def alive(self) -> int:
        return sum(self.refs[k]() is not None for k in self.dropped)

    def consume(self, pipe) -> int:
        """Iterate ``pipe``, dropping each output at once (and counting, as each next one
        arrives, the earlier ones still alive); the outputs' count."""
        count = 0
        for out in pipe:
            self.kept.append(self.alive())
            keys = [s["key"] for s in (out if isinstance(out, list) else [out])]
            del out
            self.dropped.update(keys)
            count += 1
        return count


@pytest.mark.parametrize("build", [
    lambda src: LengthBucketer(src, buffer_size=30, boundaries=[10, 20, 30]),
    lambda src: LengthBucketer(src, buffer_size=30, num_buckets=3),
    lambda src: BlockBatcher(src, budget=PaddedArea(60), shuffle_window=1),
    lambda src: BlockBatcher(src, budget=PaddedArea(60), shuffle_window=5, seed=SEED),
    lambda src: BlockBatcher(LengthBucketer(src, buffer_size=30, boundaries=[10, 20, 30]),
                             budget=PaddedArea(60), shuffle_window=1),
    lambda src: BlockBatcher(LengthBucketer(src, buffer_size=30, num_buckets=3),
                             budget=PaddedArea(60), shuffle_window=5, seed=SEED),
], ids=["bucket", "bucket-estimated", "block", "block-window", "bucket-block",
        "bucket-estimated-block-window"])
def test_samples_handed_over_are_not_kept_by_the_stages(build):
    # Issue 23: "the second emitted group of bucket_by_length stays alive". It did, for the
    # whole pass: the loop variable that counted the resumed buckets in (none, on a fresh
    # pass) was left naming the last bucket, whose first group then stayed alive. Locals
    # also kept what a stage had handed over last: bucket_by_length its last group (while
    # block_batch handed out its batches and while it read on), block_batch the group its
    # batches came from (the first one for the whole pass, through the chain that put it
    # back in front) and its last batch; at the end of the stream, bucket_by_length kept
    # every group left until the pass ended.
    source = Watched(300)
    assert source.consume(build(source)) > 10
    assert max(source.kept) == 0, source.kept




def test_a_resumed_pass_keeps_no_restored_sample_it_handed_over(shards):
    # the samples read again for a resumed pass stayed in the stages' resume dict for the
    # whole pass, and the loops that counted the resumed window and buckets in left their
    # variables on the last restored batch and bucket
    state, again = _resumed_after_four_batches(shards)
    restored: set[str] = set()  # the keys the state holds (every "uNNN" string in it)

    def walk(value):
        if isinstance(value, str) and len(value) == 4 and value.startswith("u"):
            restored.add(value)
        elif isinstance(value, (list, tuple, dict)):
            for item in value.values() if isinstance(value, dict) else value:
                walk(item)

    walk(state["stages"])
    assert len(restored) > 10
    handed, kept = [], []
    for batch in again:  # restored samples handed over earlier, still alive as each arrives
        kept.append(sum(ref() is not None for ref in handed))
        handed.extend(weakref.ref(s["feats"]) for s in batch if s["key"] in restored)
        del batch
    assert len(handed) == len(restored) and max(kept) == 0, kept
