"""Few shards for many processes: what ``ShardSplit(level="sample")`` costs one process.

A small corpus packed into fewer shards than ranks x workers cannot be split by whole shards
without dropping or repeating much of it (``sharded_shuffle`` warns, issue 18). The sample-level
split fixes the counts, but every process then reads every shard and keeps one sample in ``S``
(``S`` = ranks x workers). This measures, for one process of ``ranks x workers`` (rank 0,
worker 0, simulated in this process), the wall time of one epoch of ``sharded_shuffle(...)
-> decode`` over real tar shards of float32 feature matrices already in the page cache:

- ``shard``: the whole-shard split (this process reads its shards, if any);
- ``sample``: the sample-level split (this process reads all shards, keeps its share).

Rows: samples this process yields, seconds per epoch (median and range over rounds, taken in
turns so a slow spell falls on both), and the ratio of the two per yielded sample. Decoding is
only paid for kept samples; the extra cost is reading (and skipping) the others' bytes.

    python -m benchmarks bench_few_shards            # 2 shards x 2000 utterances, 2 x 2
    python -m benchmarks bench_few_shards --tiny     # 2 shards x 50 utterances, 1 round
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
from speechpipe.pipes.order import _streaming as sharding
from speechpipe.pipes._core import IterableWrapper
from speechpipe.pipes.order import ShardSplit
from speechpipe.pipes.shards import ShardWriter
from speechpipe.seeding import Position

DIM = 80


def make_corpus(root: str, shards: int, per_shard: int) -> list[str]:
    """``shards`` tar shards of ``per_shard`` utterances (80-dim float32, 100-700 frames)."""
    rng = np.random.default_rng(0)
    paths, entries = [], []
    for s in range(shards):
        path = os.path.join(root, f"data-{s:05d}.tar")
        frames = rng.integers(100, 700, per_shard)
        keys = [f"s{s}_{i:05d}" for i in range(per_shard)]
        with ShardWriter(path) as writer:
            for key, n in zip(keys, frames):
                writer.write({"key": key, "feats.npy": np.zeros((int(n), DIM), np.float32),
                              "txt": "x"})
        paths.append(path)
        entries.append(ShardEntry(os.path.basename(path), per_shard, os.path.getsize(path),
                                  tuple(keys), tuple(float(n) for n in frames)))
    ShardIndex(root, entries).write()
    return paths


def one_epoch(paths: list[str], level: str) -> tuple[int, float]:
    pipe = IterableWrapper(paths).sharded_shuffle(buffer_size=100, index=True,
                                                  split=ShardSplit(level=level)).decode()
    start = time.perf_counter()
    count = sum(1 for _ in pipe)
    return count, time.perf_counter() - start


def run(paths: list[str], ranks: int, workers: int, rounds: int) -> list[tuple]:
    position = Position(rank=0, world_size=ranks, worker=0, num_workers=workers)
    real = sharding.process_position
    sharding.process_position = lambda: position
    times: dict[str, list[float]] = {"shard": [], "sample": []}
    counts: dict[str, int] = {}
    try:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the uneven-split warning is the point here
            for level in times:  # warm the page cache
                one_epoch(paths, level)
            for r in range(rounds):
                for level in (("shard", "sample") if r % 2 == 0 else ("sample", "shard")):
                    counts[level], seconds = one_epoch(paths, level)
                    times[level].append(seconds)
    finally:
        sharding.process_position = real
    return [(level, counts[level], statistics.median(t), min(t), max(t))
            for level, t in times.items()]


def table(rows: list[tuple]) -> str:
    lines = ["| split | samples yielded | s per epoch (median) | range | s per sample |",
             "|---|---|---|---|---|"]
    per = {}
    for level, count, median, low, high in rows:
        per[level] = median / count if count else float("nan")
        lines.append(f"| {level} | {count} | {median:.3f} | {low:.3f}-{high:.3f} | "
                     f"{per[level] * 1e3:.3f} ms |")
    lines.append(f"ratio sample/shard per yielded sample: {per['sample'] / per['shard']:.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--per-shard", type=int, default=2000)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    per_shard, rounds = (50, 1) if args.tiny else (args.per_shard, args.rounds)
    with tempfile.TemporaryDirectory() as root:
        paths = make_corpus(root, 2, per_shard)
        print(f"2 shards x {per_shard} utterances; rank 0 worker 0 of {args.ranks} ranks x "
              f"{args.workers} workers; {rounds} round(s)")
        print(table(run(paths, args.ranks, args.workers, rounds)))


if __name__ == "__main__":
    main()
