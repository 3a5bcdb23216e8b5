"""The memory a `plan_batches` plan holds per utterance, and the time to plan an epoch.

Issue 28's rule: no Python object per utterance in a process (at most a few bytes per
utterance per worker). Side by side, for one epoch's plan over virtual streams: the plan as
`StreamPlan` holds it (numpy arrays: batch offsets, the items one after the other, each batch's
stream) and the same plan as Python tuples of ints per batch (what the first `plan_batches`
held, and what `StreamPlan.batches` still builds on demand). Bytes are traced allocations
(`tracemalloc`) made by planning / building that remain held, divided by the utterances; time
is the planning of one epoch without tracing, median and range over rounds.

Roads: mapped manifest rows (`--manifest`, a JSON-lines manifest with durations; default: one
written here with `--utterances` rows) and a shard index (`--index FOLDER`: its `index.jsonl`;
the shards themselves are not read).

    python -m benchmarks.bench_plan_memory --manifest /data/wenet_1000000.jsonl.gz
    python -m benchmarks.bench_plan_memory --index /data/index_1000000
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import tempfile
import time
import tracemalloc

import speechpipe as sp
from speechpipe.index import ShardIndex
from speechpipe.pipes.batching import PaddedArea
from speechpipe.pipes.sources import write_manifest


def manifest_pipe(path: str):
    return sp.IterableWrapper([path]).read_manifest_files().plan_batches(
        budget=60.0, streams=8, seed=0, boundaries=[2.0, 4.0, 8.0])


def index_pipe(folder: str):
    index = ShardIndex.read(folder)
    names = [os.path.join(folder, e.name) for e in index.shards]
    budget = 60.0 if index.length_unit == "seconds" else PaddedArea(60000)
    edges = [2.0, 4.0, 8.0] if index.length_unit == "seconds" else [200, 400, 800]
    return sp.IterableWrapper(names).plan_batches(budget=budget, index=index, streams=8,
                                                  seed=0, boundaries=edges)


def held_bytes(make) -> tuple[int, object]:
    """Bytes that ``make()`` allocates and its result keeps (imports done beforehand)."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = make()
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before, kept
    finally:
        tracemalloc.stop()


def measure(name: str, build, rounds: int) -> str:
    pipe = build()
    pipe.road()  # the metadata (mapped tables, the index), held before any plan
    build().plan(1)  # warm: imports and first-use caches
    arrays, plan = held_bytes(lambda: pipe.plan(0))
    utterances = len(plan.items)
    tuples, _ = held_bytes(lambda: plan.batches)
    times = []
    for epoch in range(rounds):
        started = time.perf_counter()
        pipe.plan(2 + epoch)
        times.append(time.perf_counter() - started)
    load = os.getloadavg()[0]
    return (f"| {name} | {utterances:,} | {len(plan):,} | {arrays / utterances:.2f} | "
            f"{tuples / utterances:.2f} | {statistics.median(times):.2f} "
            f"({min(times):.2f}-{max(times):.2f}) | {load:.1f} |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--utterances", type=int, default=200_000,
                        help="rows of the manifest written here (without --manifest)")
    parser.add_argument("--manifest", help="a JSON-lines manifest with durations")
    parser.add_argument("--index", help="a folder with a shard index.jsonl")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    rounds = 1 if args.tiny else args.rounds
    print("| road | utterances | batches | arrays B/utt | tuples B/utt | plan s median "
          "(range) | load |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        manifest = args.manifest
        if manifest is None:
            manifest = os.path.join(tmp, "rows.jsonl")
            n = 5_000 if args.tiny else args.utterances
            write_manifest(manifest, [{"key": f"u{i}", "duration": 0.5 + (i * 7919) % 1500 / 100}
                                      for i in range(n)])
        print(measure("manifest rows", lambda: manifest_pipe(manifest), rounds), flush=True)
        if args.index:
            print(measure("shard index", lambda: index_pipe(args.index), rounds), flush=True)


if __name__ == "__main__":
    main()
