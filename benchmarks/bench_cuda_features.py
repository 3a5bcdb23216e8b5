"""Features on a CUDA device: the batched Kaldi fbank, SpecAugment and CMVN on padded batches.

Without a CUDA device it prints "no CUDA device" and exits 0 (the CPU device is what the
tests cover). With one: the demo corpus's utterances (16 kHz speech) in padded batches of
``--batch-size`` (random order), moved to the device once, then per batch
:func:`speechpipe.pipes.audio._fbank.fbank` (80 bins, with the rows' lengths),
:func:`~speechpipe.pipes.audio._augment.spec_augment_batch` and
:func:`~speechpipe.pipes.audio._cmvn.normalize_batch` (per-utterance statistics), each timed with CUDA
events (``torch.cuda.synchronize`` after each batch), against the same fbank on one CPU
thread. Printed: audio seconds per second (× real time) of each step, median over
``--runs`` passes after a warm-up, and the per-pass range. No speed is asserted.

    python -m benchmarks bench_cuda_features           # all demo utterances, 10 passes
    python -m benchmarks bench_cuda_features --tiny    # 6 utterances, 2 passes
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

import torch

import speechpipe  # noqa: F401  (registers the functional names)
from speechpipe.pipes.audio import spec_augment_batch
from speechpipe.pipes.audio import normalize_batch
from speechpipe.pipes.audio import fbank, FbankOptions

from .bench_fbank import demo_waves, items_of

RATE = 16000
OPTIONS = FbankOptions(num_mel_bins=80)


def steps(device: torch.device) -> dict[str, Callable[[tuple], object]]:
    """The work per batch ``(audio on the device, lengths)``; each step feeds the next."""
    generator = torch.Generator().manual_seed(0)  # mask draws on the CPU, as the stage makes

    def features(item):
        return fbank(item[0], item[1], sample_rate=RATE, options=OPTIONS)

    def augment(item):
        feats, lengths = features(item)
        return spec_augment_batch(feats, lengths.tolist(), time_width=40, generator=generator)

    def cmvn(item):
        feats, lengths = features(item)
        return normalize_batch(feats, lengths.tolist())

    return {"fbank": features, "fbank + spec_augment": augment, "fbank + cmvn": cmvn}


def cuda_seconds(fn: Callable[[tuple], object], items: list[tuple]) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    total = 0.0
    for item in items:
        start.record()
        fn(item)
        end.record()
        torch.cuda.synchronize()
        total += start.elapsed_time(end) / 1000
    return total


def cpu_seconds(fn: Callable[[tuple], object], items: list[tuple]) -> float:
    start = time.thread_time()
    for item in items:
        fn(item)
    return time.thread_time() - start


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device")
        return
    torch.set_num_threads(1)
    waves, seconds, runs = demo_waves(args.tiny, args.runs)
    device = torch.device("cuda")
    on_cpu = items_of(waves, args.batch_size)
    on_gpu = [(audio.to(device), lengths) for audio, lengths in on_cpu]
    print(f"{len(waves)} utterances, {seconds:.1f} s; batches of {args.batch_size}; "
          f"{torch.cuda.get_device_name(device)}; x real time, median [range] of {runs} passes")
    rows = [(f"{name} (cuda)", fn, on_gpu, cuda_seconds) for name, fn in steps(device).items()]
    rows.append(("fbank (cpu, one thread)", steps(torch.device("cpu"))["fbank"], on_cpu,
                 cpu_seconds))
    for name, fn, items, clock in rows:
        speeds = []
        for run in range(runs + 1):
            took = clock(fn, items)
            if run:  # the first pass warms up (kernels, caches of tables)
                speeds.append(seconds / took)
        print(f"  {name:<28} {statistics.median(speeds):>9.0f} "
              f"[{min(speeds):.0f}, {max(speeds):.0f}]")


if __name__ == "__main__":
    main()
