"""Virtual streams (``plan_batches``) beside the streaming road: throughput and padding.

The same FLAC shards (16 kHz, durations drawn from LibriSpeech train-clean-100's published
percentiles; the shard index counts seconds), the same budget (padded seconds), bucket edges
(from the index) and buffers, through ``build_loader`` with 0 and 2 workers:

- **stream**: ``sharded_shuffle -> durations_from_index -> bucket_by_length -> block_batch ->
  collate(DecodeCollate)`` -- each process batches its own shards (batches depend on the
  number of workers and ranks);
- **planned**: ``plan_batches(streams=8) -> collate(DecodeCollate)`` -- the epoch's batches
  planned on the index over 8 virtual streams, the same for any topology; each worker reads
  its batches' members (issue 29);
- **planned-1**: the same with one stream (``streams=1``): the road's own cost, without the
  partial batches at the ends of 8 streams.

Rounds alternate the two (medians, per-round ranges): audio seconds per second of a whole pass
(from building the loader to its last batch), time to the first batch, and the padding
efficiency of the decoded batches (``sum(audio_len) / (B x T)`` over the pass).

With ``--recipe``, the recipes' road instead (issue 29): ``train_pipeline`` over a local
JSON-lines manifest of FLAC files (the same durations), 80-bin fbank, speed perturbation
(0.9, 1.0, 1.1), the recipe's budget and bucket buffer (200 s, 2,000), ``streams=None`` (the
streaming road: ``shuffle_samples -> load -> perturb -> fbank -> bucket_by_length ->
block_batch``) against ``streams=8`` and ``streams=1`` (the planned road: ``plan_batches`` on
the mapped rows, then each batch loaded and transformed): audio seconds (after perturbation) per second of a
whole pass, time to the first batch, and the padding efficiency of the fbank batches
(``sum(feats_len) / (B x T)``).

With ``--reads``, what the planned road reads (no audio; computed from the plans, the
streaming road's from ``sharded_shuffle``'s ``epoch_plans``): each process of ``plan_batches``
reads every shard holding a member of one of its batches (whole: a tar is read from its
start), so a shard is read by as many processes as its members' batches reach. The figure is
the shards read in an epoch by all ``W x K`` processes together, over the shards of the
corpus (1.00: each read once, the streaming road's), for ``V`` streams and topologies, on an
index of ``--utterances`` WenetSpeech-like utterances, 2,000 per shard (budget 20,000 frames).

    python -m benchmarks bench_streams           # 2,000 utterances, 3 rounds
    python -m benchmarks bench_streams --tiny    # 200 (40 --recipe) utterances, 1 round
    python -m benchmarks bench_streams --recipe --utterances 600   # the recipes' road
    python -m benchmarks bench_streams --reads --utterances 1000000  # reads per epoch
    python -m benchmarks bench_streams --node-copies --utterances 600  # S3, node copies

With ``--node-copies``, the planned road over the same FLAC shards kept in moto's S3 server
(127.0.0.1, behind speechpipe.testing's recording proxy), 2 DataLoader workers, reading only
(each sample's key and audio bytes touched, nothing decoded), ``V`` = 8 and 3, with node copies
(``ShardReadOptions(node_copy_bytes=8 GiB)``, a fresh cache folder each round) and without
(``None``): per epoch (the second one finds the first's copies), the megabytes fetched (the
range requests' bytes), the downloads (requests from a shard's byte 0) and the wall time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import numpy as np

import speechpipe  # noqa: F401  (registers the pipes)
from speechpipe.index import ShardEntry, ShardIndex
from speechpipe.loader import build_loader
from speechpipe.pipes._core import IterableWrapper
from speechpipe.pipes.batching import PaddedArea
from speechpipe.pipes.collate import DecodeCollate
from speechpipe.pipes.shards import ShardWriter
from speechpipe.testing import sample_durations

RATE = 16000
ROADS = ("stream", "planned", "planned-1")


def make_shards(root: str, n: int, per_shard: int, seed: int = 0) -> list[str]:
    """FLAC utterances of noise at LibriSpeech-like durations, with an index in seconds."""
    folder = os.path.join(root, f"flac-{n}-{per_shard}")
    if not os.path.exists(os.path.join(folder, "index.jsonl")):
        os.makedirs(folder, exist_ok=True)
        rng = np.random.default_rng(seed)
        durations = sample_durations("librispeech-train-clean-100", n, seed, usable_only=True)
        keys: list[list[str]] = []
        lengths: list[list[float]] = []
        with ShardWriter(os.path.join(folder, "data-%05d.tar"), maxcount=per_shard) as writer:
            for i, seconds in enumerate(durations):
                size = int(seconds * RATE)
                audio = (rng.standard_normal(size) * 0.1).astype(np.float32)
                if i % per_shard == 0:
                    keys.append([])
                    lengths.append([])
                keys[-1].append(f"a{i:06d}")
                lengths[-1].append(size / RATE)
                writer.write({"key": f"a{i:06d}", "flac": audio, "sample_rate": RATE})
        entries = [ShardEntry(os.path.basename(p), len(k), os.path.getsize(p), tuple(k),
                              tuple(x)) for p, k, x in zip(writer.paths, keys, lengths)]
        ShardIndex(folder, entries, length_unit="seconds").write()
    return ShardIndex.read(folder).paths()


def pipeline(road: str, paths: list[str], budget: float, buffer: int, bucket: int):
    index = ShardIndex.read(os.path.dirname(paths[0]))
    constraint = PaddedArea(budget=budget, length="duration")
    boundaries = index.boundaries(4)
    collate = DecodeCollate(fields=("key", "audio", "sample_rate"))
    if road == "stream":
        pipe = (IterableWrapper(paths).sharded_shuffle(buffer, seed=0, index=index)
                .durations_from_index()
                .bucket_by_length(bucket, boundaries=boundaries, budget=constraint, seed=0)
                .block_batch(budget=constraint, seed=0))
    else:
        pipe = IterableWrapper(paths).plan_batches(
            budget=constraint, index=index, streams=1 if road == "planned-1" else 8,
            seed=0, buffer_size=buffer, bucket_buffer=bucket, boundaries=boundaries)
    return pipe.collate(collate_fn=collate)


def one_pass(road: str, paths: list[str], workers: int, budget: float, buffer: int,
             bucket: int) -> dict:
    start = time.perf_counter()
    loader = build_loader(pipeline(road, paths, budget, buffer, bucket), num_workers=workers,
                          seed=0)
    first = None
    real = padded = 0
    for batch in loader:
        if first is None:
            first = time.perf_counter() - start
        lengths = batch["audio_len"]
        real += int(lengths.sum())
        padded += int(lengths.numel() * batch["audio"].shape[1])
    seconds = time.perf_counter() - start
    return {"audio_s_per_s": real / RATE / seconds, "first_s": first or 0.0,
            "efficiency": real / padded if padded else 0.0}


def _median_range(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def run(n: int, per_shard: int, rounds: int, budget: float, buffer: int, bucket: int) -> str:
    root = os.path.join(tempfile.gettempdir(), "speechpipe-bench-streams")
    paths = make_shards(root, n, per_shard)
    return _table(f"{n} utterances in {len(paths)} shards, budget {budget:g} padded s, shuffle "
                  f"buffer {buffer}, bucket buffer {bucket}",
                  {road: (lambda w, road=road: one_pass(road, paths, w, budget, buffer, bucket))
                   for road in ROADS}, rounds)


def _table(title: str, contenders: dict, rounds: int) -> str:
    """``contenders`` (``{road: pass(workers) -> figures}``) with 0 and 2 workers, the roads
    taking turns round by round: medians, audio-s/s with its range."""
    lines = [f"{title}, {rounds} round(s); load average {os.getloadavg()[0]:.1f} at the start",
             f"{'road':<10} {'workers':>7} {'audio-s/s median (range)':>26} "
             f"{'first batch s':>14} {'padding eff.':>12}"]
    for workers in (0, 2):
        results: dict[str, list[dict]] = {road: [] for road in contenders}
        for _ in range(rounds):
            for road, one in contenders.items():
                results[road].append(one(workers))
        for road, rows in results.items():
            lines.append(
                f"{road:<10} {workers:>7} {_median_range([r['audio_s_per_s'] for r in rows]):>26}"
                f" {statistics.median(r['first_s'] for r in rows):>14.2f}"
                f" {statistics.median(r['efficiency'] for r in rows):>12.4f}")
    lines.append(f"load average {os.getloadavg()[0]:.1f} at the end")
    return "\n".join(lines)


def make_manifest(root: str, n: int, seed: int = 0) -> str:
    """FLAC files of quiet noise at LibriSpeech-like durations and their local manifest."""
    import json

    import soundfile

    folder = os.path.join(root, f"recipe-{n}")
    path = os.path.join(folder, "train.jsonl")
    if not os.path.exists(path):
        os.makedirs(folder, exist_ok=True)
        rng = np.random.default_rng(seed)
        rows = []
        for i, seconds in enumerate(sample_durations("librispeech-train-clean-100", n, seed,
                                                     usable_only=True)):
            audio = (rng.standard_normal(int(seconds * RATE)) * 0.01).astype(np.float32)
            flac = os.path.join(folder, f"u{i:06d}.flac")
            soundfile.write(flac, audio, RATE)
            rows.append({"key": f"u{i:06d}", "audio_path": flac,
                         "duration": audio.shape[0] / RATE, "text": "a"})
        with open(path + ".tmp", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
        os.replace(path + ".tmp", path)
    return path


def recipe_pass(streams: int | None, manifest: str, workers: int, budget: float) -> dict:
    from speechpipe.recipes import train_pipeline

    start = time.perf_counter()
    pipe = train_pipeline(manifest, budget=budget, seed=0, speed_perturb=(0.9, 1.0, 1.1),
                          streams=streams)
    loader = build_loader(pipe, num_workers=workers, seed=0)
    first = None
    audio = 0.0
    real = padded = 0
    for batch in loader:
        if first is None:
            first = time.perf_counter() - start
        audio += float(batch["duration"].sum())
        lengths = batch["feats_len"]
        real += int(lengths.sum())
        padded += int(lengths.numel() * batch["feats"].shape[1])
    seconds = time.perf_counter() - start
    return {"audio_s_per_s": audio / seconds, "first_s": first or 0.0,
            "efficiency": real / padded if padded else 0.0}


def run_recipe(n: int, rounds: int, budget: float) -> str:
    root = os.path.join(tempfile.gettempdir(), "speechpipe-bench-streams")
    manifest = make_manifest(root, n)
    roads = {"streaming": None, "streams=8": 8, "streams=1": 1}
    return _table(f"train_pipeline over {n} FLAC utterances, fbank, speed (0.9, 1.0, 1.1), "
                  f"budget {budget:g} padded s",
                  {road: (lambda w, v=v: recipe_pass(v, manifest, w, budget))
                   for road, v in roads.items()}, rounds)


#: (W, K) of the reads table.
TOPOLOGIES = ((1, 2), (2, 2), (1, 8), (4, 4), (8, 4), (16, 4))


def synthetic_index(n: int, per_shard: int = 2000) -> tuple[list[str], ShardIndex]:
    """An in-memory index of ``n`` WenetSpeech-like utterances (lengths in frames); the shards
    need not exist: the reads are computed from the plans."""
    frames = np.maximum(1, (sample_durations("wenetspeech-l", n, 0) * 100).astype(np.int64))
    entries = []
    for s, start in enumerate(range(0, n, per_shard)):
        part = frames[start:start + per_shard].tolist()
        entries.append(ShardEntry(f"data-{s:05d}.tar", len(part), 0,
                                  tuple(f"u{start + i}" for i in range(len(part))), tuple(part)))
    index = ShardIndex("/nonexistent-bench-streams", entries, length_unit="frames")
    return [os.path.join(index.root, e.name) for e in entries], index


def corpus_reads(plan, road, topology: tuple[int, int]) -> float:
    """Shards read by all the processes of ``topology`` in the plan's epoch, over the shards."""
    world, workers = topology
    shards = [np.unique(np.searchsorted(road.offsets, plan.batch(i), "right") - 1)
              for i in range(len(plan))]
    reads = 0
    for rank in range(world):
        for worker in range(workers):
            positions = plan.positions(rank, world, worker, workers, start=0, uneven="pad")
            reads += len(np.unique(np.concatenate([shards[p % len(plan)] for p in positions])))
    return reads / len(road.names)


def run_reads(n: int, streams: tuple[int, ...]) -> str:
    paths, index = synthetic_index(n)
    lines = [f"shard reads per epoch over the corpus's {len(paths)} shards ({n} utterances, "
             "2,000 per shard, budget 20,000 frames); 1.00 = each shard read once",
             f"{'road':<14}" + "".join(f"{f'{w}x{k}':>8}" for w, k in TOPOLOGIES)]
    row = []
    for world, workers in TOPOLOGIES:  # the streaming road: each process's own shards
        plans = (IterableWrapper(paths).sharded_shuffle(1000, seed=0, index=index)
                 .epoch_plans(0, world_size=world, num_workers=workers))
        row.append(sum(len(p.names) for rank in plans for p in rank) / len(paths))
    lines.append(f"{'streaming':<14}" + "".join(f"{r:>8.2f}" for r in row))
    for v in streams:
        pipe = IterableWrapper(paths).plan_batches(PaddedArea(20000), streams=v, seed=0,
                                                   index=index)
        plan, road = pipe.plan(0), pipe.road()
        lines.append(f"{f'planned V={v}':<14}" + "".join(
            f"{corpus_reads(plan, road, t):>8.2f}" for t in TOPOLOGIES))
    return "\n".join(lines)


def _fetched(requests: list) -> tuple[int, int]:
    """(bytes, downloads) of the shards' GETs the proxy recorded: the bytes of each range
    request, and the requests from a shard's byte 0."""
    total = starts = 0
    for method, path, rng, _ in requests:
        if method != "GET" or not path.rsplit("/", 1)[-1].startswith("data-") or not rng:
            continue
        first, _, last = rng.partition("=")[2].partition("-")
        total += int(last) - int(first) + 1
        starts += first == "0"
    return total, starts


def copies_epochs(urls: list[str], remote, copies: bool, streams: int, budget: float,
                  proxy, cache: str) -> list[dict]:
    """Two epochs of the planned road over the bucket's shards with 2 workers, reading only
    (keys and bytes touched, no decoding): wall time and what was fetched, per epoch."""
    from speechpipe.pipes.shards import ShardReadOptions

    os.environ["SPEECHPIPE_CACHE_DIR"] = cache
    read = ShardReadOptions(remote=remote, node_copy_bytes=(8 << 30) if copies else None)
    index = ShardIndex.read(urls[0].rsplit("/", 1)[0], remote=remote)
    pipe = IterableWrapper(urls).plan_batches(
        budget=PaddedArea(budget=budget, length="duration"), index=index, streams=streams,
        seed=0, boundaries=index.boundaries(4), read_options=read).collate(
        collate_fn=lambda batch: [len(s["key"]) + len(s["flac"]) for s in batch])
    loader = build_loader(pipe, num_workers=2, seed=0)
    out = []
    for epoch in range(2):
        proxy.clear()
        start = time.perf_counter()
        touched = sum(sum(b) for b in loader)
        seconds = time.perf_counter() - start
        fetched, downloads = _fetched(list(proxy.requests))
        out.append({"seconds": seconds, "mb": fetched / 1e6, "downloads": downloads,
                    "touched": touched})
    return out


def run_node_copies(n: int, per_shard: int, rounds: int, budget: float,
                    streams: tuple[int, ...]) -> str:
    """``plan_batches`` over FLAC shards in moto's S3 (127.0.0.1, through a recording proxy),
    2 DataLoader workers, with and without node copies (a fresh cache folder each round)."""
    import shutil

    from speechpipe.remote import RemoteOptions
    from speechpipe.testing import S3_TEST_CREDENTIALS, FaultProxy, serve_s3, upload_folder

    root = os.path.join(tempfile.gettempdir(), "speechpipe-bench-streams")
    paths = make_shards(root, n, per_shard)
    corpus_mb = sum(os.path.getsize(p) for p in paths) / 1e6
    cache = tempfile.mkdtemp(prefix="bench-node-copies-")
    lines = [f"{n} utterances in {len(paths)} shards ({corpus_mb:.1f} MB) in moto's S3 on "
             f"127.0.0.1, plan_batches, 2 workers, reading only; {rounds} round(s); load "
             f"average {os.getloadavg()[0]:.1f} at the start",
             f"{'V':>3} {'copies':>7} {'epoch':>5} {'MB fetched (range)':>22} "
             f"{'downloads':>9} {'wall s median (range)':>22}"]
    with serve_s3() as endpoint, FaultProxy(endpoint) as proxy:
        folder = upload_folder(endpoint, os.path.dirname(paths[0]), "bench-copies", "corpus")
        urls = [f"{folder}/{os.path.basename(p)}" for p in paths]
        remote = RemoteOptions(storage_options={"endpoint_url": proxy.url,
                                                **S3_TEST_CREDENTIALS})
        for v in streams:
            runs: dict[bool, list[list[dict]]] = {True: [], False: []}
            for _ in range(rounds):
                for copies in (True, False):  # alternating; a cold node cache each time
                    shutil.rmtree(cache, ignore_errors=True)
                    runs[copies].append(copies_epochs(urls, remote, copies, v, budget, proxy,
                                                      cache))
            for copies in (True, False):
                for e in range(2):
                    rows = [r[e] for r in runs[copies]]
                    lines.append(
                        f"{v:>3} {'yes' if copies else 'no':>7} {e:>5} "
                        f"{_median_range([r['mb'] for r in rows]):>22} "
                        f"{statistics.median(r['downloads'] for r in rows):>9.0f} "
                        f"{_median_range2([r['seconds'] for r in rows]):>22}")
    shutil.rmtree(cache, ignore_errors=True)
    lines.append(f"load average {os.getloadavg()[0]:.1f} at the end")
    return "\n".join(lines)


def _median_range2(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--utterances", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--budget", type=float, default=200.0, help="padded seconds per batch")
    parser.add_argument("--recipe", action="store_true",
                        help="train_pipeline's streaming road against streams=8")
    parser.add_argument("--reads", action="store_true",
                        help="shard reads per epoch of the planned road, by V and topology")
    parser.add_argument("--node-copies", action="store_true",
                        help="the planned road over S3 shards with and without node copies")
    args = parser.parse_args(argv)
    if args.tiny:  # every table
        print(run(200, 25, 1, 100.0, 50, 60))
        print(run_recipe(40, 1, 100.0))
        print(run_reads(40_000, (1, 8)))
        print(run_node_copies(40, 10, 1, 100.0, (3,)))
    elif args.node_copies:
        print(run_node_copies(args.utterances, 25, args.rounds, args.budget, (8, 3)))
    elif args.reads:
        print(run_reads(args.utterances, (1, 8, 32, 64)))
    elif args.recipe:
        print(run_recipe(args.utterances, args.rounds, args.budget))
    else:
        print(run(args.utterances, 100, args.rounds, args.budget, 500, 600))


if __name__ == "__main__":
    main()
