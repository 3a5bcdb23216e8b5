"""What ``build_loader(..., telemetry=True)`` costs per sample and per stage in the workers.

The telemetry puts a probe (:class:`speechpipe.telemetry.StageProbe`) in front of every stage
for a pass: two clock reads of each kind (``thread_time_ns``, ``perf_counter_ns``) and one more
generator per item per stage. This times a pass of a pipeline of ``--stages`` cheap stages
(``IterableWrapper -> shuffle_samples -> map(identity) x (stages - 2)``, in-memory samples,
no worker: the probes are the same in a worker) through :class:`speechpipe.loader.PipeDataset`
with the probes off and on, in turns, and prints the CPU time (``time.process_time``) per sample
per stage in µs: min, median and [range] over rounds, and what the probes add (on - off, of the
medians, divided by the stages probed). Nothing is asserted; on a loaded machine read the
figures as rough. The issue's target: about 1 µs per sample per stage.

    python -m benchmarks bench_telemetry            # 200,000 samples, 8 stages, 5 rounds
    python -m benchmarks bench_telemetry --tiny     # 2,000 samples, 2 rounds (smoke test)
"""

from __future__ import annotations

import argparse
import statistics
import time

import speechpipe as sp
from speechpipe.loader import PipeDataset


def identity(sample: dict) -> dict:
    return sample


def pipeline(samples: list[dict], stages: int):
    pipe = sp.IterableWrapper(samples, deepcopy=False).shuffle_samples(seed=0)
    for _ in range(stages - 2):
        pipe = pipe.map(identity)
    return pipe


def measure(samples: list[dict], stages: int, rounds: int) -> dict[str, list[float]]:
    """µs of CPU per sample per stage, per round, probes off and on, in turns."""
    times: dict[str, list[float]] = {"off": [], "on": []}
    for _ in range(rounds):
        for mode in ("off", "on"):
            dataset = PipeDataset(pipeline(samples, stages), seed=0)
            dataset._telemetry = mode == "on"  # what build_loader(telemetry=True) sets
            start = time.process_time()
            count = sum(1 for _ in dataset)
            elapsed = time.process_time() - start
            if count != len(samples):
                raise RuntimeError(f"the pass gave {count} samples, not {len(samples)}")
            times[mode].append(1e6 * elapsed / len(samples) / stages)
    return times


def _cell(values: list[float]) -> str:
    return (f"{min(values):.3f} / {statistics.median(values):.3f} "
            f"[{min(values):.3f}-{max(values):.3f}]")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks bench_telemetry")
    parser.add_argument("--tiny", action="store_true", help="2,000 samples, 2 rounds")
    parser.add_argument("--samples", type=int, default=200_000)
    parser.add_argument("--stages", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    n, rounds = (2000, 2) if args.tiny else (args.samples, args.rounds)
    if args.stages < 3:
        parser.error(f"--stages must be >= 3, got {args.stages}")
    samples = [{"key": f"u{i:07d}", "text": "a short transcript"} for i in range(n)]
    times = measure(samples, args.stages, rounds)
    print(f"{n} samples, {args.stages} stages, {rounds} rounds; CPU µs per sample per stage, "
          "min / median [range]")
    print(f"  telemetry off  {_cell(times['off'])}")
    print(f"  telemetry on   {_cell(times['on'])}")
    added = statistics.median(times["on"]) - statistics.median(times["off"])
    print(f"  the probes add {added:.3f} µs per sample per stage (medians; target: about 1)")


if __name__ == "__main__":
    main()
