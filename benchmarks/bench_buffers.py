"""What counting a buffer's samples and bytes costs each buffering stage, per sample.

Every buffering stage tells a :class:`~speechpipe.diagnostics.BufferStats` of each item that
enters and leaves its buffer (``pipeline_report``'s "buffers" lines). This times the three
buffering algorithms of a streaming pipeline on in-memory samples shaped like decoded
feature samples (``key``, ``source``, ``text`` and an 80-dim float32 ``feats`` array), with
the meter and without (``meter=None``), side by side:

- ``sharded_shuffle``: its sample buffer, :func:`~speechpipe.pipes.order._window.shuffle_window`
  over samples before ``decode`` (a ``memoryview`` of a mapped shard, ``bytes``), window 1,000;
- ``bucket_by_length``: :func:`~speechpipe.pipes.batching._buckets.bucket_groups`, buffer 1,000,
  4 buckets;
- ``block_batch``: its batch window, ``shuffle_window`` over batches of 30 samples,
  window 100 (the default);
- ``add+remove``: the meter alone, one ``add`` and one ``remove`` per sample.

CPU time (``time.process_time``) per sample in µs: min, median and [range] over rounds taken
in turns (off, on, off, on, ...), and what counting adds (on - off, of the mins). Nothing is
asserted; on a loaded machine read the figures as rough.

    python -m benchmarks bench_buffers            # 200,000 samples, 5 rounds
    python -m benchmarks bench_buffers --tiny     # 2,000 samples, 2 rounds (smoke test)
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable

import numpy as np

from speechpipe.diagnostics import BufferStats
from speechpipe.pipes.batching import bucket_groups
from speechpipe.pipes.order import shuffle_window

DIM = 80
BATCH = 30


def make_samples(n: int) -> tuple[list[dict], list[dict]]:
    """``n`` decoded sample dicts (1,000 distinct arrays of 50-549 frames shared among them),
    and the same ``n`` as a shard reader gives them before ``decode``: the ``.npy`` payload a
    view of a mapped shard (a ``memoryview``), the transcript ``bytes``."""
    rng = np.random.default_rng(0)
    arrays = [np.zeros((int(f), DIM), np.float32) for f in rng.integers(50, 550, 1000)]
    shard = memoryview(bytes(max(a.nbytes for a in arrays) + 128))
    decoded, raw = [], []
    for i in range(n):
        feats = arrays[i % len(arrays)]
        decoded.append({"key": f"u{i:07d}", "source": "data-00000.tar",
                        "text": "a short transcript", "feats": feats})
        raw.append({"key": f"u{i:07d}", "source": "data-00000.tar",
                    "txt": b"a short transcript", "feats.npy": shard[:feats.nbytes + 128]})
    return decoded, raw


def _frames(sample: dict) -> int:
    return sample["feats"].shape[0]


def stages(samples: list[dict], raw: list[dict]) -> dict[str, Callable[[BufferStats | None], int]]:
    """Each stage as a function of its meter (or None), returning the items it emitted."""
    batches = [samples[i:i + BATCH] for i in range(0, len(samples), BATCH)]

    def sharded_shuffle(meter):  # its buffer holds samples before decode
        return sum(1 for _ in shuffle_window(raw, 1000, random.Random(0), meter=meter))

    def bucket_by_length(meter):
        groups = bucket_groups(iter(samples), buffer_size=1000, boundaries=[150, 300, 450],
                               measure=_frames, rng=random.Random(0), meter=meter)
        return sum(1 for _ in groups)

    def block_batch(meter):
        return sum(1 for _ in shuffle_window(batches, 100, random.Random(0), meter=meter))

    def add_remove(meter):
        if meter is None:
            for _ in samples:
                pass
            return len(samples)
        add, remove = meter.add, meter.remove
        for sample in samples:
            add(sample)
            remove(sample)
        return len(samples)

    return {"sharded_shuffle": sharded_shuffle, "bucket_by_length": bucket_by_length,
            "block_batch": block_batch, "add+remove": add_remove}


def measure(run: Callable, samples: int, rounds: int) -> dict[str, list[float]]:
    """µs of CPU per sample, per round, without and with the meter, in turns."""
    times: dict[str, list[float]] = {"off": [], "on": []}
    for _ in range(rounds):
        for mode in ("off", "on"):
            meter = BufferStats("bench") if mode == "on" else None
            start = time.process_time()
            run(meter)
            times[mode].append(1e6 * (time.process_time() - start) / samples)
            if meter is not None and (meter.samples, meter.bytes) != (0, 0):
                raise RuntimeError(f"the meter still counts {meter!r} after the pass")
    return times


def _cell(values: list[float]) -> str:
    return (f"{min(values):.3f} / {statistics.median(values):.3f} "
            f"[{min(values):.3f}-{max(values):.3f}]")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks bench_buffers")
    parser.add_argument("--tiny", action="store_true", help="2,000 samples, 2 rounds")
    parser.add_argument("--samples", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    n, rounds = (2000, 2) if args.tiny else (args.samples, args.rounds)
    samples, raw = make_samples(n)
    print(f"{n:,} samples, {rounds} rounds; µs CPU per sample: min / median [range]")
    print("| stage | without meter | with meter | counting adds (min) | ratio (min) |")
    print("|---|---|---|---|---|")
    for name, run in stages(samples, raw).items():
        times = measure(run, n, rounds)
        off, on = min(times["off"]), min(times["on"])
        print(f"| {name} | {_cell(times['off'])} | {_cell(times['on'])} | "
              f"{on - off:.3f} | {on / off if off else float('nan'):.2f} |", flush=True)


if __name__ == "__main__":
    main()
