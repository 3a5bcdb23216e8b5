"""Does the training loop wait on data? The recipe's loader feeding a fixed-time step.

The loop of ``examples/asr/train.py`` with its model replaced by a fixed step time (a sleep
of ``--step-ms``, which leaves the CPU to the workers as a GPU step would): speechpipe's
``librispeech_train`` with its defaults (80-bin fbank in the workers, length buckets, a
padded budget; ``--budget-seconds`` per batch) on the demo corpus's manifests, through
``build_loader(..., telemetry=True)`` with 0, 1 and 2 workers, ``--passes`` epochs per
round, rounds in turns. Printed per worker count: the share of the loop's time spent waiting
in ``next()`` and the share of data-bound steps (:class:`speechpipe.Telemetry`), medians and
[range] over rounds, and the telemetry's verdict of the last round. The issue's target: at
most 2 % waiting with 2 workers, at the step time stated.

Then the contest: speechpipe, webdataset (WeNet's processors) and lhotse
(``DynamicBucketingSampler``) loaders of ``bench_pipeline``'s audio workload (``--utterances``
FLAC utterances with LibriSpeech's durations in tar shards / Lhotse Shar, decode + 80-bin fbank
per utterance, the same shuffle, bucketing and padded budget of 60 s) feeding the same
fixed-time step, with 0 and 2 workers: the share of the loop's time waiting in ``next()``
(every batch after the first of a pass; the time to the first batch apart), median and
[range] over rounds taken in turns.

Not measured here yet (issue 33 asks for it): padding efficiency and samples per step with
the analytic budget against a calibrated one (``bench_calibrate`` needs a CUDA device).

    python -m benchmarks bench_train            # 3 rounds, 4 passes, step 100 ms, 400 utts
    python -m benchmarks bench_train --tiny     # 1 round, 1 pass, workers 0 and 1; 40 utts
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import speechpipe as sp


def run(manifests, workers: int, step_seconds: float, passes: int, budget: float):
    recipe = sp.get_recipe("librispeech")
    pipe = recipe.librispeech_train(manifests, parts=["dev-clean"], budget=budget)
    loader = sp.build_loader(pipe, num_workers=workers, seed=0, telemetry=True)
    for _ in range(passes):
        for _batch in loader:
            time.sleep(step_seconds)  # the training step
    return loader.telemetry.snapshot(), loader.telemetry.verdict()


def timed_pass(loader, step_seconds: float) -> tuple[float, float, float]:
    """One pass: seconds waiting in ``next()`` after the first batch, seconds in the steps,
    and seconds to the first batch."""
    clock = time.perf_counter
    start = clock()
    iterator = iter(loader)
    next(iterator)
    first = clock() - start
    time.sleep(step_seconds)
    wait = steps = 0.0
    while True:
        asked = clock()
        try:
            next(iterator)
        except StopIteration:
            break
        wait += clock() - asked
        time.sleep(step_seconds)  # the training step
        steps += step_seconds
    return wait, steps, first


def contest(utterances: int, step_seconds: float, rounds: int, tiny: bool) -> list[str]:
    """speechpipe, webdataset and lhotse loaders of bench_pipeline's audio workload feeding
    the same step: waiting share per system and worker count."""
    from benchmarks import bench_pipeline as bp

    setup = bp.TINY if tiny else bp.Setup(budget=60.0, shuffle=200, bucket=400,
                                          buckets=8)
    data = bp.make_audio(tempfile.mkdtemp(prefix="bench-train-audio-"), utterances, setup)
    systems = ("speechpipe", "webdataset", "lhotse")
    counts = (0,) if tiny else (0, 2)
    shares: dict[tuple[str, int], list[float]] = {(s, w): [] for s in systems for w in counts}
    firsts: dict[tuple[str, int], list[float]] = {(s, w): [] for s in systems for w in counts}
    for _ in range(rounds):
        for workers in counts:
            for system in systems:
                loader = bp.LOADERS[system]("audio", data, workers, setup)
                wait, steps, first = timed_pass(loader, step_seconds)
                shares[system, workers].append(wait / (wait + steps) if wait + steps else 0.0)
                firsts[system, workers].append(first)
                del loader
    lines = [f"{utterances} FLAC utterances (LibriSpeech durations), decode + fbank per "
             f"utterance, padded budget {setup.budget_seconds:g} s, step "
             f"{1e3 * step_seconds:g} ms, {rounds} rounds; median [range]",
             f"{'system':>12} {'workers':>7}  {'waiting in next()':>24}  {'first batch s':>14}"]
    for workers in counts:
        for system in systems:
            first = statistics.median(firsts[system, workers])
            lines.append(f"{system:>12} {workers:>7}  {_cell(shares[system, workers]):>24}  "
                         f"{first:>14.2f}")
    return lines


def _cell(values: list[float]) -> str:
    return (f"{100 * statistics.median(values):5.1f} % "
            f"[{100 * min(values):.1f}-{100 * max(values):.1f}]")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks bench_train")
    parser.add_argument("--tiny", action="store_true", help="1 round, 1 pass")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--passes", type=int, default=4)
    parser.add_argument("--step-ms", type=float, default=100.0)
    parser.add_argument("--budget-seconds", type=float, default=30.0)
    parser.add_argument("--utterances", type=int, default=400, help="for the contest")
    args = parser.parse_args(argv)
    rounds, passes = (1, 1) if args.tiny else (args.rounds, args.passes)
    counts = (0, 1) if args.tiny else (0, 1, 2)
    recipe = sp.get_recipe("librispeech")
    folder = tempfile.mkdtemp(prefix="bench-train-")
    manifests = recipe.prepare_librispeech(sp.DEMO_CORPUS, folder, progress=False)
    waits: dict[int, list[float]] = {w: [] for w in counts}
    bound: dict[int, list[float]] = {w: [] for w in counts}
    verdicts: dict[int, str] = {}
    for _ in range(rounds):
        for workers in counts:
            snap, verdicts[workers] = run(manifests, workers, args.step_ms / 1e3, passes,
                                          args.budget_seconds)
            waits[workers].append(snap["wait_share"])
            bound[workers].append(snap["data_bound_steps"])
    print(f"demo corpus, librispeech_train defaults, budget {args.budget_seconds:g} s, step "
          f"{args.step_ms:g} ms (sleep), {passes} passes x {rounds} rounds; median [range]")
    print(f"{'workers':>7}  {'waiting in next()':>24}  {'data-bound steps':>24}")
    for workers in counts:
        print(f"{workers:>7}  {_cell(waits[workers]):>24}  {_cell(bound[workers]):>24}")
    for workers in counts:
        print(f"verdict, {workers} workers: {verdicts[workers]}")
    print()
    for line in contest(40 if args.tiny else args.utterances, args.step_ms / 1e3, rounds,
                        args.tiny):
        print(line)


if __name__ == "__main__":
    main()
