"""Decoding as the limit once features are cheap: does soundfile's decode release the GIL, and
how fast is it per core next to the fbank?

0. **GIL probe** (what a shared, loaded machine can answer): a probe thread runs a pure
   Python loop, stamping the time at each turn, while the main thread decodes every file once
   (from a path, from bytes); the switch interval is raised to 0.5 s, so that a thread holding
   the GIL keeps it through a whole call. Stamps that fall inside a decode call prove the
   decode released the GIL: none fall inside a pure Python call (which holds it), as many per
   second as inside ``time.sleep`` when it is released. CPU shares do not matter: the probe
   can run inside a call, on any core, only if the GIL is free.
1. **GIL**: the demo corpus's FLAC files (16 kHz speech) decoded with :func:`soundfile.read`
   by 1, 2 and 4 threads of one process, each thread taking the next file of a shared list:
   from a path (libsndfile reads the file itself) and from bytes in memory (``io.BytesIO``:
   libsndfile calls back into Python for every read). Per round: wall time and the process's
   CPU time (``time.process_time``, all threads). If the decode holds the GIL, CPU time never
   exceeds wall time (parallelism ``CPU / wall`` stays at 1) and N threads are no faster than
   one; if it releases it, parallelism approaches ``min(N, free cores)``. Printed: audio
   seconds per wall second and per CPU second (× real time), parallelism; medians over rounds
   and the per-round range.
2. **per core**: × real time per CPU second of one thread (``time.thread_time_ns``, items
   taking turns) of the decode from bytes, speechpipe's Kaldi fbank (80 bins) for one
   utterance, and :func:`torchaudio.compliance.kaldi.fbank`, side by side (decode + fbank is
   what a worker does per utterance when the features are computed there, the decode alone
   when they are computed on the device).
3. **in a worker**: the decode stage as a pipeline uses it -- ``map_in_threads`` (the thread
   map of :mod:`speechpipe.pipes.concurrency._threads`) applying :func:`speechpipe.pipes.decode._decode.decode_sample`
   to raw samples ``{"key", "flac": bytes}`` -- with 0 (in the consuming thread), 2 and 4
   threads: wall × real time and parallelism of one process.
4. **into the batch**: batches of 8 raw samples made into a padded audio batch, one thread's
   CPU time per round, batches taking turns: the decode alone (``soundfile.read`` per file,
   the reference), ``decode_sample`` then ``PadCollate`` (each utterance decoded into an array
   of its own, then copied into the batch) and ``DecodeCollate`` (decoded straight into the
   batch); × real time and the ratio of each to the decode alone.

The machine's other load changes all of these; medians over rounds and ranges are printed, no
speed is asserted.

    python -m benchmarks bench_decode           # 36 demo files, 9 rounds
    python -m benchmarks bench_decode --tiny    # 6 files, 2 rounds (a few seconds)
"""

from __future__ import annotations

import argparse
import gc
import io
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import soundfile
import torch
from torchaudio.compliance import kaldi

import speechpipe  # noqa: F401  (registers the functional names)
from speechpipe.demo import DEMO_CORPUS
from speechpipe.pipes._core import IterableWrapper
from speechpipe.pipes.collate import DecodeCollate, PadCollate
from speechpipe.pipes.decode import decode_sample
from speechpipe.pipes.audio import KALDI_SCALE
from speechpipe.pipes.audio import fbank, FbankOptions

from .bench_fbank import rounds

OPTIONS = FbankOptions(num_mel_bins=80)


def flac_files(tiny: bool) -> list[Path]:
    files = sorted(Path(DEMO_CORPUS).rglob("*.flac"))
    return files[::6] if tiny else files


def _decode_all(jobs: list, read: Callable, threads: int) -> None:
    """``read`` every job, ``threads`` threads taking the next job from a shared iterator."""
    feed = iter(jobs)
    lock = threading.Lock()

    def work() -> None:
        while True:
            with lock:
                job = next(feed, None)
            if job is None:
                return
            read(job)

    pool = [threading.Thread(target=work) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()


def timed(fn: Callable[[], object]) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) of ``fn()``, garbage collector off."""
    gc.collect()
    gc.disable()
    try:
        wall, cpu = time.perf_counter(), time.process_time()
        fn()
        return time.perf_counter() - wall, time.process_time() - cpu
    finally:
        gc.enable()


def probe_inside(read: Callable, jobs: list, switch_interval: float = 0.5) -> float:
    """Turns of a pure Python probe thread per second of ``read(job)`` calls, over the calls
    (module documentation, part 0)."""
    turns = [0]  # the probe's count: read before and after each call (no list of stamps,
    calls: list[tuple[float, float]] = []  # which filled 24 GB on a quiet machine)
    inside = 0
    done = threading.Event()

    def spin() -> None:
        while not done.is_set():
            turns[0] += 1

    previous = sys.getswitchinterval()
    sys.setswitchinterval(switch_interval)
    probe = threading.Thread(target=spin)
    try:
        probe.start()
        time.sleep(0.01)
        for job in jobs:
            before, start = turns[0], time.perf_counter()
            read(job)
            calls.append((start, time.perf_counter()))
            inside += turns[0] - before
    finally:
        done.set()
        probe.join()
        sys.setswitchinterval(previous)
    return inside / sum(end - start for start, end in calls)


def _python_work(_: object) -> int:
    return sum(range(200_000))


def probe_rows(files: list[Path], blobs: list[bytes]) -> list[str]:
    """Part 0's lines: the decodes beside a call that holds the GIL and one that frees it."""
    cases = {"soundfile.read(path)": (soundfile.read, [str(f) for f in files]),
             "soundfile.read(BytesIO)": (lambda b: soundfile.read(io.BytesIO(b)), blobs),
             "pure Python (holds the GIL)": (_python_work, files),
             "time.sleep (releases it)": (lambda _: time.sleep(0.003), files)}
    return [f"  {name:<28} {probe_inside(read, jobs) / 1e6:>6.2f} M probe turns per s of call"
            for name, (read, jobs) in cases.items()]


def gil_rows(files: list[Path], blobs: list[bytes], seconds: float, runs: int) -> list[str]:
    """Part 1: the table's lines, by source (path, bytes) and thread count; the thread counts
    take turns within each round."""
    sources = {"path": ([str(f) for f in files], soundfile.read),
               "bytes": (blobs, lambda b: soundfile.read(io.BytesIO(b)))}
    counts = (1, 2, 4)
    lines = []
    for name, (jobs, read) in sources.items():
        got: dict[int, list[tuple[float, float]]] = {n: [] for n in counts}
        for run in range(runs + 1):
            for n in counts[run % len(counts):] + counts[: run % len(counts)]:
                wall, cpu = timed(lambda: _decode_all(jobs, read, n))
                if run:
                    got[n].append((wall, cpu))
        for n in counts:
            walls = [w for w, _ in got[n]]
            per_wall = [seconds / w for w in walls]
            per_cpu = [seconds / c for _, c in got[n]]
            par = [c / w for w, c in got[n]]
            lines.append(f"  {name:<6} {n:>2} threads {statistics.median(per_wall):>8.0f} "
                         f"[{min(per_wall):.0f}, {max(per_wall):.0f}] "
                         f"{statistics.median(per_cpu):>8.0f} {statistics.median(par):>6.2f} "
                         f"[{min(par):.2f}, {max(par):.2f}]")
    return lines


def per_core(blobs: list[bytes], seconds: float, runs: int) -> dict[str, list[float]]:
    """Part 2: × real time per round of one thread's CPU time, item by item in turns."""
    waves = [torch.from_numpy(soundfile.read(io.BytesIO(b), dtype="float32")[0]) * KALDI_SCALE
             for b in blobs]
    impls = {
        "decode FLAC (soundfile, bytes)": lambda i: soundfile.read(io.BytesIO(blobs[i]),
                                                                   dtype="float32"),
        "fbank 80 (speechpipe)": lambda i: fbank(waves[i], sample_rate=16000, options=OPTIONS),
        "fbank 80 (torchaudio)": lambda i: kaldi.fbank(waves[i].unsqueeze(0), num_mel_bins=80),
    }
    spent = rounds(impls, list(range(len(blobs))), runs)  # items take turns, as bench_fbank
    return {name: [seconds / cpu for cpu in times] for name, times in spent.items()}


def in_worker(blobs: list[bytes], seconds: float, runs: int) -> list[str]:
    """Part 3: ``map_in_threads(decode_sample)`` over raw samples, 0, 2 and 4 threads."""
    raw = [{"key": f"u{i:03d}", "flac": b} for i, b in enumerate(blobs)]
    lines = []
    for n in (0, 2, 4):
        pipe = IterableWrapper(raw, deepcopy=False).map_in_threads(decode_sample, num_threads=n)
        got = []
        for run in range(runs + 1):
            wall, cpu = timed(lambda: list(pipe))
            if run:
                got.append((seconds / wall, cpu / wall))
        speed = [s for s, _ in got]
        lines.append(f"  map_in_threads(decode_sample, num_threads={n}) "
                     f"{statistics.median(speed):>7.0f} x real time "
                     f"[{min(speed):.0f}, {max(speed):.0f}], "
                     f"parallelism {statistics.median(p for _, p in got):.2f}")
    return lines


def into_batch(blobs: list[bytes], seconds: float, runs: int) -> list[str]:
    """Part 4: a padded audio batch from raw samples: decode alone, decode + copy, into it."""
    raw = [{"key": f"u{i:03d}", "flac": b} for i, b in enumerate(blobs)]
    batches = [raw[i:i + 8] for i in range(0, len(raw), 8)]
    pad, into = PadCollate(), DecodeCollate()
    impls = {
        "decode alone (soundfile.read)": lambda batch: [
            soundfile.read(io.BytesIO(s["flac"]), dtype="float32") for s in batch],
        "decode_sample + PadCollate": lambda batch: pad([decode_sample(s) for s in batch]),
        "DecodeCollate (into the batch)": lambda batch: into(batch),
    }
    spent = rounds(impls, batches, runs)
    alone = statistics.median(spent["decode alone (soundfile.read)"])
    lines = []
    for name, times in spent.items():
        speeds = [seconds / cpu for cpu in times]
        lines.append(f"  {name:<32} {statistics.median(speeds):>7.0f} x real time "
                     f"[{min(speeds):.0f}, {max(speeds):.0f}], "
                     f"{statistics.median(times) / alone:.2f} x the decode's CPU")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--runs", type=int, default=9)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    files = flac_files(args.tiny)
    runs = 2 if args.tiny else args.runs
    blobs = [f.read_bytes() for f in files]
    seconds = sum(soundfile.info(str(f)).duration for f in files)
    print(f"{len(files)} FLAC files, {seconds:.1f} s of 16 kHz speech; {runs} rounds; "
          "x real time = audio s per s; median [range over rounds]")
    print("0. GIL probe: turns of a pure Python thread inside the calls (switch interval "
          "0.5 s; 0 while a call holds the GIL)")
    # --tiny probes one file: each GIL re-entry waits the 0.5 s switch interval (6 files: 110 s)
    for line in probe_rows(files[:1], blobs[:1]) if args.tiny else probe_rows(files, blobs):
        print(line)
    print("1. soundfile.read by N threads of one process: x real time per wall s, per CPU s, "
          "parallelism = CPU s / wall s (1.0 while the GIL is held)")
    for line in gil_rows(files, blobs, seconds, runs):
        print(line)
    print("2. per core (one thread, CPU time): x real time")
    for name, speeds in per_core(blobs, seconds, runs).items():
        print(f"  {name:<32} {statistics.median(speeds):>7.0f} "
              f"[{min(speeds):.0f}, {max(speeds):.0f}]")
    print("3. the decode stage inside one worker")
    for line in in_worker(blobs, seconds, runs):
        print(line)
    print("4. a padded batch from raw samples (batches of 8, one thread's CPU time)")
    for line in into_batch(blobs, seconds, runs):
        print(line)


if __name__ == "__main__":
    main()
