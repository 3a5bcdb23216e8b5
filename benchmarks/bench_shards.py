"""Reading a sharded corpus: speechpipe's shard streaming beside the alternatives.

One corpus of 80-dim float32 features (lengths drawn from LibriSpeech train-clean-100's
published durations, 100 frames/s), written as Kaldi arks + feats.scp and packed by
``speechpipe.pack.pack_data`` into tar shards. On it, side by side:

(a) raw sequential read of the shard bytes (4 MiB reads; the ceiling);
(b) speechpipe: ``list of shards -> sharded_shuffle(1000) -> decode -> batch(16) ->
    collate(PadCollate)`` (two-level shuffle; local shards are memory-mapped and, cold, read
    ahead by a thread without the GIL, the defaults -- ``ShardReadOptions(mmap=False)``
    measures the ``read`` path instead), with workers in ``speechpipe.loader.build_loader`` (its
    defaults: workers' state snapshots every 100 batches, batches collated into reused shared
    memory); with ``--ablation``, also (b') the same with ``ShardReadOptions(readahead=False)``
    (the kernel asked for read-ahead with ``madvise`` from the reader's thread instead);
(c) map-style random reads through feats.scp offsets (``kaldiio.load_mat``) with a
    shuffled ``torch.utils.data.DataLoader(batch_size=16, collate_fn=PadCollate)``;
(d) webdataset's own reader: ``WebDataset(shards, shardshuffle=...).shuffle(1000).decode()
    .map(to key/feats/text).batched(16, collation_fn=PadCollate)``.

The consumer is what a training loop does, the same for (b), (c) and (d): utterances are
grouped into batches of 16 and padded by :class:`speechpipe.pipes.collate.PadCollate` (fields
``key``, ``feats``, ``text``) *in the process that reads them* (the DataLoader worker when
there are workers, where PadCollate allocates the batch in shared memory, so one batch -- not
each utterance -- crosses the process boundary), and the main process touches every padded
batch (``batch["feats"].sum()``), so every feature byte is really read and copied once into a
batch. (a) only reads the bytes into memory.

Then where the shards are kept (issue 22), warm, workers 0 and 2, (b)'s pipeline reading:
(b) the local tar shards; (e) the same shards gzip-compressed (``.tar.gz``, level 9 as
``pack --compress gz`` writes them) and (f) zstd-compressed (``.tar.zst``, level 3), both read
sequentially through the decompressor; (g) the plain shards in a bucket of moto's S3 server
(a separate process on 127.0.0.1, so its work is not on the reader's GIL), read through
fsspec/s3fs in 8 MiB range requests (:mod:`speechpipe.remote`). Reported: utt/s, MB/s of the
bytes read (compressed ones for (e), (f)), the sizes, and the ratios to (b). A local S3 server
measures the request and copy overhead of the remote path, not a network.

Each in the main process (workers 0) and with DataLoader workers 2, with the page cache
evicted for the data files before each run (``posix_fadvise(POSIX_FADV_DONTNEED)``: cold) and
after a warming read (warm). torch runs one intra-op thread in the main process (as in
DataLoader workers): the padding and the sum are small, and two OpenMP threads spin-waiting
on a busy 2-CPU machine made identical runs differ tenfold. The readers take turns run by run
(the order rotated each round), so that a slow spell of the machine falls on all of them.
Reported: utterances/s and MB/s of the data files (medians of the runs; DataLoader start-up is
inside the timing) and the ratios (b)/(a), (b)/(c), (b)/(d) with the range of the per-round
ratios; "main busy", the main thread's CPU time over the wall time
(``time.thread_time``, median) -- without workers the rest is the reader waiting, for the disk
or for its read-ahead thread: where the time goes cold --; then a profile of (b), warm,
workers 0 (where it goes warm).

    python -m benchmarks bench_shards               # ~3 GB corpus, 3 runs each
    python -m benchmarks bench_shards --ablation    # and (b'): read-ahead thread off
    python -m benchmarks bench_shards --tiny        # 60 utterances, 1 run (smoke test)
    python -m benchmarks bench_shards --no-storage  # without (e)-(g)
    python -m benchmarks bench_shards --storage-only  # (b) and (e)-(g) only
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import gzip
import io
import os
import pstats
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Any, Callable, NamedTuple

import numpy as np
import torch

import speechpipe  # noqa: F401  (registers the pipes)
from speechpipe.index import ShardIndex
from speechpipe.loader import build_loader
from speechpipe.pipes._core import IterableWrapper
from speechpipe.pipes.collate import PadCollate
from speechpipe.pipes.shards import ShardReadOptions
from speechpipe.remote import RemoteOptions
from speechpipe.testing import S3_TEST_CREDENTIALS, sample_durations, upload_folder

DIM = 80
BATCH = 16
# The fields every reader's batches hold (PadCollate pads feats and adds feats_len).
FIELDS = ("key", "feats", "text")


def collate_fn() -> PadCollate:
    return PadCollate(fields=FIELDS)


def make_corpus(root: str, n: int, shard_size: int, seed: int = 0) -> tuple[list[str], str]:
    """Write (once) arks + feats.scp + text and pack them; returns (shard paths, feats.scp)."""
    import kaldiio

    from speechpipe.pack import pack_data

    scp = os.path.join(root, "feats.scp")
    shards_dir = os.path.join(root, "shards")
    if not os.path.exists(os.path.join(shards_dir, "index.jsonl")):
        os.makedirs(root, exist_ok=True)
        frames = np.round(sample_durations("librispeech-train-clean-100", n, seed) * 100)
        rng = np.random.default_rng(seed)
        keys = [f"utt{i:07d}" for i in range(n)]
        with kaldiio.WriteHelper(f"ark,scp:{root}/feats.ark,{scp}") as writer:
            for key, t in zip(keys, frames.astype(int)):
                writer(key, rng.standard_normal((t, DIM), dtype=np.float32))
        with open(os.path.join(root, "text"), "w") as f:
            f.writelines(f"{k} SOME WORDS FOR {k}\n" for k in keys)
        pack_data([scp], [os.path.join(root, "text")], shards_dir,
                  utts_per_shard=shard_size, num_workers=2, progress=False)
    return ShardIndex.read(shards_dir).paths(), scp


def evict(paths: list[str]) -> None:
    """Drop the files from the page cache (the next read comes from the disk: cold)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def warm(paths: list[str]) -> None:
    """Read the files once so that they are in the page cache (warm)."""
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while f.read(16 << 20):
                pass


def raw_read(paths, workers):
    class Raw(torch.utils.data.IterableDataset):
        def __iter__(self):
            info = torch.utils.data.get_worker_info()
            mine = paths if info is None else paths[info.id::info.num_workers]
            for path in mine:
                with open(path, "rb", buffering=0) as f:
                    while chunk := f.read(4 << 20):
                        yield len(chunk)

    return Raw(), 0  # counts chunks, not utterances


class SpeechpipeBatches:
    """(b)'s pipeline; with workers it runs in :func:`speechpipe.loader.build_loader`, with its
    defaults (workers collating into reused shared memory)."""

    def __init__(self, pipe):
        self.pipe = pipe

    def __iter__(self):
        return iter(self.pipe)


def speechpipe_reader(paths, workers, read_options: ShardReadOptions | None = None):
    return SpeechpipeBatches(
        IterableWrapper(paths).sharded_shuffle(buffer_size=1000, seed=0,
                                               read_options=read_options).decode()
        .batch(BATCH).collate(collate_fn=collate_fn()))


# -------------------------------------------------------------------- where shards are kept


def compressed_copies(paths: list[str], root: str, kind: str) -> list[str]:
    """The shards compressed once (``.tar.gz`` level 9, ``.tar.zst`` level 3, as ``pack
    --compress`` writes them) into ``root/shards-<kind>``; returns their paths."""
    folder = os.path.join(root, f"shards-{kind}")
    os.makedirs(folder, exist_ok=True)
    out = []
    for path in paths:
        target = os.path.join(folder, os.path.basename(path) + "." + kind)
        if not os.path.exists(target):
            with open(path, "rb") as src, open(target + ".tmp", "wb") as dst:
                if kind == "gz":
                    with gzip.GzipFile(fileobj=dst, mode="wb", mtime=0) as z:
                        shutil.copyfileobj(src, z, 4 << 20)
                else:
                    import zstandard

                    with zstandard.ZstdCompressor(level=3).stream_writer(
                            dst, closefd=False) as z:
                        shutil.copyfileobj(src, z, 4 << 20)
            os.replace(target + ".tmp", target)
        out.append(target)
    return out


@contextlib.contextmanager
def s3_server(folder: str):
    """moto's S3 server in its own process on 127.0.0.1, ``folder`` uploaded to
    ``s3://bench/shards``; yields the storage options."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    endpoint = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                             str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(endpoint, timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        upload_folder(endpoint, folder, "bench", "shards")
        yield {"endpoint_url": endpoint, **S3_TEST_CREDENTIALS}
    finally:
        proc.terminate()
        proc.wait()


def storage_rows(paths: list[str], root: str, n: int, runs: int) -> list[dict]:
    """(b) local tar beside (e) .tar.gz, (f) .tar.zst and (g) S3 (moto), warm."""
    size = sum(os.path.getsize(p) for p in paths)
    gz, zst = (compressed_copies(paths, root, kind) for kind in ("gz", "zst"))
    with s3_server(os.path.dirname(paths[0])) as storage:
        urls = [f"s3://bench/shards/{os.path.basename(p)}" for p in paths]
        remote = ShardReadOptions(remote=RemoteOptions(storage_options=storage))
        readers = [
            Reader("(b) local .tar", lambda w: speechpipe_reader(paths, w), paths, size),
            Reader("(e) local .tar.gz", lambda w: speechpipe_reader(gz, w), gz,
                   sum(os.path.getsize(p) for p in gz)),
            Reader("(f) local .tar.zst", lambda w: speechpipe_reader(zst, w), zst,
                   sum(os.path.getsize(p) for p in zst)),
            Reader("(g) S3, moto on 127.0.0.1", lambda w: speechpipe_reader(urls, w, remote),
                   [], size),
        ]
        rows = []
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # as in run()
        try:
            for workers in (0, 2):
                rows.extend(measure(readers, workers, False, runs))
        finally:
            torch.set_num_threads(threads)
    for row in rows:
        assert row["items"] == n, (row["name"], row["items"], n)  # every utterance, once
        row["utt_s"] = row["items"] / row["seconds"]
    return rows


def storage_table(rows: list[dict]) -> str:
    head = f"{'where the shards are':<28} {'wk':>2} {'utt/s':>8} {'MB/s':>8} {'MB':>8}"
    out = [head, "-" * len(head)]
    for r in rows:
        out.append(f"{r['name']:<28} {r['workers']:>2} {r['utt_s']:>8.0f} {r['mb_s']:>8.0f} "
                   f"{r['bytes'] / 1e6:>8.1f}")
    out.append("")
    out.append("ratios to (b) local .tar, utt/s: of the medians [range of the per-round ratios]")
    for workers in (0, 2):
        get = {r["name"][:3]: r for r in rows if r["workers"] == workers}
        out.append(f"workers {workers}: " + ", ".join(
            f"{k}/(b) {_ratio(get[k], get['(b)'], 'utt/s')}" for k in ("(e)", "(f)", "(g)")))
    return "\n".join(out)


class ScpDataset(torch.utils.data.Dataset):
    """Map-style: one utterance per index, read through its feats.scp offset.

    Batched and padded by the DataLoader (``batch_size=16, collate_fn=PadCollate``)."""

    def __init__(self, scp: str, text: str):
        with open(scp) as f:
            self.entries = [line.split(None, 1) for line in f]
        with open(text) as f:
            self.text = dict(line.rstrip("\n").split(" ", 1) for line in f)

    def __len__(self):
        return len(self.entries)

    def __getitem__(self, i):
        import kaldiio

        key, value = self.entries[i]
        return {"key": key, "feats": kaldiio.load_mat(value.strip()), "text": self.text[key]}


def _wds_sample(sample: dict) -> dict:
    # webdataset names fields by extension: give PadCollate the same fields as (b) and (c).
    return {"key": sample["__key__"], "feats": sample["feats.npy"], "text": sample["txt"]}


def webdataset_reader(paths, workers):
    import webdataset as wds

    return (wds.WebDataset(paths, shardshuffle=len(paths), seed=0, empty_check=False,
                           nodesplitter=wds.split_by_node, workersplitter=wds.split_by_worker)
            .shuffle(1000).decode().map(_wds_sample)
            .batched(BATCH, collation_fn=collate_fn(), partial=True))


def consume(dataset, workers: int, map_style: bool = False) -> int:
    """Iterate like a training loop: batches of 16 padded where they are read (the worker),
    every padded batch touched in the main process; returns the number of utterances."""
    if map_style:
        iterable = torch.utils.data.DataLoader(
            dataset, batch_size=BATCH, shuffle=True, collate_fn=collate_fn(),
            num_workers=workers, generator=torch.Generator().manual_seed(0))
    elif workers == 0:
        iterable = dataset
    elif isinstance(dataset, SpeechpipeBatches):  # speechpipe's own loader (as in the README)
        # batched with torch's batch(16) as every contender here: a loader with no position
        # to save (build_loader refuses torch's batch in a resumable one)
        iterable = build_loader(dataset.pipe, num_workers=workers, seed=0, resumable=False)
    else:  # the dataset yields whole batches
        iterable = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=workers)
    count = 0
    for batch in iterable:
        if isinstance(batch, dict):
            feats = batch["feats"]
            assert feats.ndim == 3 and feats.shape[2] == DIM and len(batch["key"]) <= BATCH
            assert batch["feats_len"].shape == (len(batch["key"]),)
            float(feats.sum())  # touch every padded value in the main process
            count += len(batch["key"])
        else:  # (a): chunk sizes
            count += 1
    return count


class Reader(NamedTuple):
    """One contender: how to build it for a number of workers, and the data files it reads."""

    name: str
    build: Callable[[int], Any]
    files: list[str]
    data_bytes: int
    map_style: bool = False


def one_run(reader: Reader, workers: int, cold: bool) -> tuple[int, float, float]:
    """(items, seconds, main thread's CPU seconds) of one run, cache made cold or warm first."""
    if cold:
        evict(reader.files)
    else:
        warm(reader.files)
    start, cpu = time.perf_counter(), time.thread_time()
    count = consume(reader.build(workers), workers, map_style=reader.map_style)
    return count, time.perf_counter() - start, time.thread_time() - cpu


def measure(readers: list[Reader], workers: int, cold: bool, runs: int) -> list[dict]:
    """Every reader ``runs`` times, taking turns run by run (the order rotated each round), so
    that a slow spell of the machine falls on all of them; a row per reader with its per-round
    wall times."""
    times: dict[str, list[float]] = {r.name: [] for r in readers}
    busy: dict[str, list[float]] = {r.name: [] for r in readers}
    counts: dict[str, int] = {}
    for round_ in range(runs):
        shift = round_ % len(readers)
        for reader in readers[shift:] + readers[:shift]:
            counts[reader.name], wall, cpu = one_run(reader, workers, cold)
            times[reader.name].append(wall)
            busy[reader.name].append(cpu / wall)
    rows = []
    for reader in readers:
        seconds = statistics.median(times[reader.name])
        rows.append({"name": reader.name, "workers": workers, "cache": "cold" if cold else "warm",
                     "items": counts[reader.name], "bytes": reader.data_bytes,
                     "seconds": seconds,
                     "rounds": times[reader.name], "mb_s": reader.data_bytes / 1e6 / seconds,
                     "busy": statistics.median(busy[reader.name])})
    return rows


def run(n: int, shard_size: int, runs: int, root: str, ablation: bool = False) -> list[dict]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _run(n, shard_size, runs, root, ablation)
    finally:
        torch.set_num_threads(threads)


def _run(n: int, shard_size: int, runs: int, root: str, ablation: bool) -> list[dict]:
    paths, scp = make_corpus(root, n, shard_size)
    shard_bytes = sum(os.path.getsize(p) for p in paths)
    ark = os.path.join(root, "feats.ark")
    text = os.path.join(root, "text")
    print(f"corpus: {n} utterances, {len(paths)} shards, {shard_bytes / 1e9:.2f} GB of shards, "
          f"{os.path.getsize(ark) / 1e9:.2f} GB of arks")
    readers = [
        Reader("(a) raw sequential read", lambda w: raw_read(paths, w)[0], paths, shard_bytes),
        Reader("(b) speechpipe sharded_shuffle", lambda w: speechpipe_reader(paths, w), paths,
               shard_bytes),
        Reader("(c) map-style scp reads", lambda w: ScpDataset(scp, text), [ark],
               os.path.getsize(ark), map_style=True),
        Reader("(d) webdataset", lambda w: webdataset_reader(paths, w), paths, shard_bytes),
    ]
    if ablation:
        off = ShardReadOptions(readahead=False)
        readers.insert(2, Reader("(b') speechpipe, read-ahead off",
                                 lambda w: speechpipe_reader(paths, w, off), paths,
                                 shard_bytes))
    rows = []
    for cold in (True, False):
        for workers in (0, 2):
            rows.extend(measure(readers, workers, cold, runs))
    for row in rows:
        if row["name"].startswith("(a)"):
            row["utt_s"] = float("nan")
        else:
            assert row["items"] == n, (row["name"], row["items"], n)  # every utterance, once
            row["utt_s"] = row["items"] / row["seconds"]
    return rows


def _ratio(b: dict, other: dict, unit: str) -> str:
    """``b``'s rate over ``other``'s (of the medians), with the range of the per-round ratios."""
    work = "bytes" if unit == "MB/s" else "items"
    median = (b[work] / b["seconds"]) / (other[work] / other["seconds"])
    per_round = [(b[work] / s) / (other[work] / o) for s, o in zip(b["rounds"], other["rounds"])]
    if len(per_round) < 2:
        return f"{median:.2f}"
    return f"{median:.2f} [{min(per_round):.2f}-{max(per_round):.2f}]"


def table(rows: list[dict]) -> str:
    head = f"{'reader':<32} {'cache':<5} {'wk':>2} {'utt/s':>8} {'MB/s':>8} {'main busy':>9}"
    out = [head, "-" * len(head)]
    for r in rows:
        out.append(f"{r['name']:<32} {r['cache']:<5} {r['workers']:>2} {r['utt_s']:>8.0f} "
                   f"{r['mb_s']:>8.0f} {r['busy']:>9.2f}")
    out.append("")
    out.append("ratios: of the medians [range of the per-round ratios]")
    for cache in ("cold", "warm"):
        for workers in (0, 2):
            get = {r["name"][:3]: r for r in rows
                   if r["cache"] == cache and r["workers"] == workers}
            b = get["(b)"]
            line = (f"{cache} workers {workers}: (b)/(a) MB/s {_ratio(b, get['(a)'], 'MB/s')}, "
                    f"(b)/(c) utt/s {_ratio(b, get['(c)'], 'utt/s')}, "
                    f"(b)/(d) utt/s {_ratio(b, get['(d)'], 'utt/s')}")
            ablated = get.get("(b'")  # the name's first three characters
            if ablated is not None:
                line += f", (b)/(b') {_ratio(b, ablated, 'utt/s')}"
            out.append(line)
    return "\n".join(out)


def profile(paths: list[str], top: int = 12) -> str:
    for path in paths:  # warm
        with open(path, "rb", buffering=0) as f:
            while f.read(16 << 20):
                pass
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    profiler = cProfile.Profile()
    try:
        profiler.enable()
        consume(speechpipe_reader(paths, 0), 0)
        profiler.disable()
    finally:
        torch.set_num_threads(threads)
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--utterances", type=int, default=7500, help="about 3 GB at 80 dims")
    parser.add_argument("--shard-size", type=int, default=500)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--root", default=None, help="corpus folder (reused if present)")
    parser.add_argument("--ablation", action="store_true",
                        help="also run (b) with the read-ahead thread off")
    parser.add_argument("--no-storage", action="store_true",
                        help="skip (e)-(g): compressed shards and S3 (moto)")
    parser.add_argument("--storage-only", action="store_true",
                        help="only (b) beside (e)-(g)")
    args = parser.parse_args(argv)
    if args.tiny:
        with tempfile.TemporaryDirectory() as root:
            rows = run(60, 20, 1, root, ablation=True)
            print(table(rows))
            if not args.no_storage:
                print(storage_table(storage_rows(make_corpus(root, 60, 20)[0], root, 60, 1)))
        return
    root = args.root or os.path.join(tempfile.gettempdir(),
                                     f"speechpipe-bench-shards-{args.utterances}")
    if not args.storage_only:
        rows = run(args.utterances, args.shard_size, args.runs, root, args.ablation)
        print(table(rows))
    paths = make_corpus(root, args.utterances, args.shard_size)[0]
    if not args.no_storage:
        print(storage_table(storage_rows(paths, root, args.utterances, args.runs)))
    if not args.storage_only:
        print("profile of (b), warm, workers 0 (by own time):")
        print(profile(paths))


if __name__ == "__main__":
    main()
