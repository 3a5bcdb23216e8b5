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

Planning time, side by side (issue 28: an epoch planned in every process): the array planner
`plan_batches` uses (numpy over each stream: `speechpipe/pipes/batching/_planning.py`) and the
per-item planner it replaced (the streaming road's generators item by item, still the road of
constraints the array planner does not take), on the same streams; each round in a fresh
process (`python -m benchmarks.bench_plan_memory --time ROAD PATH PLANNER`, the metadata read
first, then one epoch planned and timed), median and range over `--rounds`; `--no-per-item`
leaves the slow contender out (minutes at 15M). Both planners' plans are compared (sha256 of
the arrays) in each round.

    python -m benchmarks.bench_plan_memory --manifest /data/wenet_1000000.jsonl.gz
    python -m benchmarks.bench_plan_memory --index /data/index_1000000
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc

import numpy as np

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


def measure(name: str, build) -> str:
    pipe = build()
    pipe.road()  # the metadata (mapped tables, the index), held before any plan
    build().plan(1)  # warm: imports and first-use caches
    arrays, plan = held_bytes(lambda: pipe.plan(0))
    utterances = len(plan.items)
    tuples, _ = held_bytes(lambda: plan.batches)
    return (f"| {name} | {utterances:,} | {len(plan):,} | {arrays / utterances:.2f} | "
            f"{tuples / utterances:.2f} |")


def plan_once(road: str, path: str, planner: str) -> str:
    """One epoch planned by ``planner`` (``arrays`` or ``per-item``) in this process: seconds,
    the plan's digest, the load average."""
    from speechpipe.pipes.batching import _streams

    pipe = manifest_pipe(path) if road == "manifest" else index_pipe(path)
    pipe.road()
    if planner == "per-item":  # the per-item planner over the same streams
        def items_only(streams, unit, rate, constraint, **options):
            return _streams._plan_items(
                [_streams._pairs(i, n, unit, rate) for i, n in streams], constraint, **options)
        _streams.plan_arrays = items_only
    started = time.perf_counter()
    plan = pipe.plan(0)
    seconds = time.perf_counter() - started
    digest = hashlib.sha256()
    for array, dtype in ((plan.offsets, "<i8"), (plan.items, "<i8"), (plan.owners, "<i4")):
        digest.update(np.ascontiguousarray(array, dtype).tobytes())
    return f"{seconds:.4f} {digest.hexdigest()[:16]} {os.getloadavg()[0]:.2f}"


def timed(road: str, path: str, planners: list[str], rounds: int) -> str:
    """Fresh processes, the planners alternating; a row of medians (ranges) and loads."""
    times = {p: [] for p in planners}
    digests, loads = set(), []
    for _ in range(rounds):
        for planner in planners:
            out = subprocess.run(
                [sys.executable, "-m", "benchmarks.bench_plan_memory", "--time", road, path,
                 planner], check=True, capture_output=True, text=True).stdout.split()
            times[planner].append(float(out[0]))
            digests.add(out[1])
            loads.append(float(out[2]))
    if len(digests) != 1:
        raise SystemExit(f"the planners' plans differ: {sorted(digests)}")
    cells = [f"{statistics.median(t):.2f} ({min(t):.2f}-{max(t):.2f})" for t in times.values()]
    if len(planners) == 1:
        cells.append("-")
    return (f"| {road} | {' | '.join(cells)} | {min(loads):.1f}-{max(loads):.1f} |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--utterances", type=int, default=200_000,
                        help="rows of the manifest written here (without --manifest)")
    parser.add_argument("--manifest", help="a JSON-lines manifest with durations")
    parser.add_argument("--index", help="a folder with a shard index.jsonl")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-per-item", action="store_true",
                        help="time the array planner only")
    parser.add_argument("--no-memory", action="store_true",
                        help="time only (the tuples' side builds a Python int per utterance)")
    parser.add_argument("--time", nargs=3, metavar=("ROAD", "PATH", "PLANNER"),
                        help=argparse.SUPPRESS)  # one timed plan (a fresh process)
    args = parser.parse_args(argv)
    if args.time:
        print(plan_once(*args.time))
        return
    rounds = 1 if args.tiny else args.rounds
    planners = ["arrays"] + ([] if args.no_per_item else ["per-item"])
    with tempfile.TemporaryDirectory() as tmp:
        manifest = args.manifest
        if manifest is None:
            manifest = os.path.join(tmp, "rows.jsonl")
            n = 5_000 if args.tiny else args.utterances
            write_manifest(manifest, [{"key": f"u{i}", "duration": 0.5 + (i * 7919) % 1500 / 100}
                                      for i in range(n)])
        roads = [("manifest", manifest)] + ([("index", args.index)] if args.index else [])
        if not args.no_memory:
            print("| road | utterances | batches | arrays B/utt | tuples B/utt |")
            print("|---|---|---|---|---|")
            for road, path in roads:
                build = (lambda: manifest_pipe(path)) if road == "manifest" else (
                    lambda: index_pipe(path))
                print(measure(f"{road}", build), flush=True)
        print(f"\nplanning one epoch, s, median (range) of {rounds} fresh processes:\n")
        print("| road | array planner | per-item planner | load |")
        print("|---|---|---|---|")
        for road, path in roads:
            print(timed(road, path, planners, rounds), flush=True)


if __name__ == "__main__":
    main()
