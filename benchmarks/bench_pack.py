"""Packing: audio-seconds packed per second per core, the local process pool beside Dask.

One corpus of utterances whose durations follow LibriSpeech train-clean-100's published
percentiles (speech-band noise, 16 kHz), in three forms, each packed by
``speechpipe.pack.pack_data`` into tar shards of 20 utterances:

- **FLAC**: 16-bit WAV sources, packed losslessly as 16-bit FLAC (``audio_format="lossless"``);
- **Opus -> FLAC16**: Ogg/Opus sources (as Common Voice, WenetSpeech, GigaSpeech ship them),
  decoded and packed as 16-bit FLAC (``audio_format="flac16"``);
- **features**: 80-dim float32 matrices (100 frames/s) in a Kaldi ark + feats.scp, packed as
  ``.feats.npy`` members.

Each with five executors, side by side: the local process pool (``concurrent.futures``
``ProcessPoolExecutor``, spawn) with 1 and 2 processes, Dask's ``LocalCluster``
(``processes=True``, one thread per worker, on 127.0.0.1) with 1 and 2 workers, as Dask starts
them, and Dask x2 with the allocator of its workers left as Dask sets it (:data:`UNTUNED`:
the cost this benchmark found, which ``speechpipe.executors.tune_allocator`` removes), each
passed as ``executor=``. The time to start each executor and
one no-op task's round trip are printed first. Every executor is started, and warmed by one untimed pack, before the timed
runs: a cluster is up before its jobs come (the pool's start-up would otherwise be counted
against it alone). The contenders take turns run by run (the order rotated each round), each
run into a fresh folder; the shards and index of every run are checked byte-identical to the
first one's.

Reported per form and executor: audio-seconds packed per wall second, the same per core (per
process or worker), the CPU seconds its worker processes used per pack (every thread: robust
to other load, where wall time is not), the median over the rounds with the range, and the ratio Dask / local
pool at the same count with the range of the per-round ratios. The load average is printed
before and after: on a shared machine, compare only figures of one run.

    python -m benchmarks bench_pack            # 120 utterances (~25 min of audio), 3 rounds
    python -m benchmarks bench_pack --utterances 2000 --utts-per-shard 200 --forms FLAC features
                                               # shards of realistic size (~60-80 MB)
    python -m benchmarks bench_pack --tiny     # 6 short utterances, 1 round, no warm-up
                                               # (smoke test)
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import os
import shutil
import statistics
import tempfile
import time

import kaldiio
import numpy as np
import soundfile

from speechpipe.pack import pack_data
from speechpipe.testing import pack_digest as digest, sample_durations

RATE = 16000
PER_SHARD = 20
FORMS = ("FLAC", "Opus -> FLAC16", "features")


def speech_noise(seconds: float, rng: np.random.Generator) -> np.ndarray:
    """Noise in the speech band with a syllable-rate envelope, int16 (compresses like speech
    more than white noise does)."""
    n = int(seconds * RATE)
    x = np.convolve(rng.standard_normal(n), np.ones(8) / 8, mode="same")
    envelope = 0.3 + 0.7 * np.abs(np.sin(np.arange(n) * (np.pi * 4 / RATE)))
    return np.clip(x * envelope * 6000, -32768, 32767).astype(np.int16)


def make_corpus(root: str, n: int, tiny: bool, per_shard: int = PER_SHARD,
                forms: tuple[str, ...] = FORMS) -> dict:
    """The forms of one corpus; returns ``{form: (pack_data kwargs, audio seconds)}``."""
    rng = np.random.default_rng(0)
    durations = (np.full(n, 1.5) if tiny else
                 sample_durations("librispeech-train-clean-100", n, seed=0))
    rows_wav, rows_opus, labels = [], [], []
    os.makedirs(f"{root}/audio")
    with kaldiio.WriteHelper(f"ark,scp:{root}/feats.ark,{root}/feats.scp") as feats:
        for i, seconds in enumerate(durations):
            key = f"utt{i:05d}"
            samples = speech_noise(float(seconds), rng)
            soundfile.write(f"{root}/audio/{key}.wav", samples, RATE, subtype="PCM_16")
            if "Opus -> FLAC16" in forms:
                soundfile.write(f"{root}/audio/{key}.opus", samples, RATE, format="OGG",
                                subtype="OPUS")
            rows_wav.append({"key": key, "audio_path": f"{root}/audio/{key}.wav",
                             "text": f"utterance {i}", "speaker": str(i % 7)})
            rows_opus.append({**rows_wav[-1], "audio_path": f"{root}/audio/{key}.opus"})
            matrix = rng.standard_normal((int(seconds * 100), 80)).astype(np.float32)
            if "features" in forms:  # (drawn anyway: the audio is the same whatever forms)
                feats(key, matrix)
            labels.append(f"{key} utterance {i}\n")
    for name, rows in (("wav", rows_wav), ("opus", rows_opus)):
        with open(f"{root}/{name}.jsonl", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    with open(f"{root}/text", "w") as f:
        f.writelines(labels)
    total = float(durations.sum())
    common = {"utts_per_shard": per_shard, "progress": False}
    every = {
        "FLAC": ({"f_scps": None, "f_labels": None, "manifests": f"{root}/wav.jsonl",
                  **common}, total),
        "Opus -> FLAC16": ({"f_scps": None, "f_labels": None,
                            "manifests": f"{root}/opus.jsonl", "audio_format": "flac16",
                            **common}, total),
        "features": ({"f_scps": f"{root}/feats.scp", "f_labels": f"{root}/text", **common},
                     total),
    }
    return {form: every[form] for form in forms}


def _warm(_: object = None) -> int:
    import speechpipe.pack.write  # noqa: F401  (what the tasks import)

    return os.getpid()


#: Dask x2 as before speechpipe tuned its workers' allocator
#: (:func:`speechpipe.executors.tune_allocator`, switched off by this variable in the workers'
#: environment): Dask's nanny starts each worker with ``MALLOC_TRIM_THRESHOLD_=65536``, which
#: switches glibc's adaptive thresholds off, and tasks run in a worker thread: every buffer
#: over 128 KiB (an utterance's audio, a feature matrix, a member's bytes) was then mapped and
#: faulted in at each use, doubling a pack task's own CPU time.
UNTUNED = {"distributed.nanny.pre-spawn-environ.SPEECHPIPE_TUNE_ALLOCATOR": "0"}


def _noop(_: object = None) -> None:
    return None


def task_cost(executor, n: int = 100) -> float:
    """Median seconds of one no-op task, submitted and waited for, one at a time."""
    times = []
    for _ in range(n):
        start = time.perf_counter()
        executor.submit(_noop).result()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def executors(stack, untuned: bool = True) -> dict:
    """The executors, started and with speechpipe imported in every process: the local pool
    and Dask's LocalCluster with 1 and 2 processes, and with ``untuned`` Dask x2 whose workers
    keep Dask's allocator settings (:data:`UNTUNED`); ``{name: (executor, seconds to start it,
    no-op task seconds)}``."""
    import dask
    import distributed

    found = {}
    for n in (1, 2):
        started = time.perf_counter()
        pool = concurrent.futures.ProcessPoolExecutor(
            n, mp_context=multiprocessing.get_context("spawn"))
        stack.append(pool.shutdown)
        list(pool.map(_warm, range(4 * n)))
        found[("local pool", n)] = (pool, time.perf_counter() - started)
    dasks = [("Dask LocalCluster", n, {}) for n in (1, 2)]
    if untuned:
        dasks.append(("Dask, untuned allocator", 2, UNTUNED))
    for name, n, config in dasks:
        started = time.perf_counter()
        with dask.config.set(config):
            cluster = distributed.LocalCluster(n_workers=n, threads_per_worker=1,
                                               processes=True, host="127.0.0.1",
                                               dashboard_address="127.0.0.1:0")
        client = distributed.Client(cluster)
        stack.append(cluster.close)
        stack.append(client.close)
        client.run(_warm)
        found[(name, n)] = (client, time.perf_counter() - started)
    return {key: (ex, start, task_cost(ex.get_executor() if hasattr(ex, "get_executor")
                                       else ex)) for key, (ex, start) in found.items()}


def worker_pids(executor) -> list[int]:
    """The worker processes of a started executor."""
    if hasattr(executor, "run"):  # distributed.Client
        return sorted(executor.run(os.getpid).values())
    return sorted(executor._processes)  # (a started ProcessPoolExecutor's own table)


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds the processes ``pids`` have used so far (all threads)."""
    import psutil

    return sum(sum(psutil.Process(pid).cpu_times()[:2]) for pid in pids)


def run(kwargs: dict, out: str, executor, shape: dict | None = None,
        pids: list[int] | None = None) -> tuple[float, float]:
    """``(wall seconds, workers' CPU seconds)`` of one pack; ``shape`` gets its shard count
    and mean shard size."""
    kwargs = dict(kwargs)
    scps, labels = kwargs.pop("f_scps"), kwargs.pop("f_labels")
    cpu = cpu_seconds(pids) if pids else 0.0
    start = time.perf_counter()
    report = pack_data(scps, labels, out, executor=executor, **kwargs)
    seconds = time.perf_counter() - start
    cpu = (cpu_seconds(pids) - cpu) if pids else 0.0
    if shape is not None:
        shape["shards"] = report.shards_written
        shape["MB"] = report.bytes_written / max(1, report.shards_written) / 1e6
    return seconds, cpu


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="bench_pack")
    parser.add_argument("--tiny", action="store_true",
                        help="6 short utterances, 1 round, no warm-up, no untuned contender")
    parser.add_argument("--utterances", type=int, default=120)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--utts-per-shard", type=int, default=PER_SHARD,
                        help=f"utterances per shard (default {PER_SHARD}; pack's own: 2000)")
    parser.add_argument("--forms", nargs="+", choices=FORMS, default=list(FORMS),
                        metavar="FORM", help=f"forms to pack (default all: {', '.join(FORMS)})")
    args = parser.parse_args(argv)
    n, rounds = (6, 1) if args.tiny else (args.utterances, args.rounds)
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} "
          f"({os.cpu_count()} CPUs)")
    root = tempfile.mkdtemp(prefix="bench_pack_")
    stack: list = []
    try:
        forms = make_corpus(f"{root}/corpus", n, args.tiny, args.utts_per_shard,
                            tuple(args.forms))
        started = executors(stack, not args.tiny)
        pools = {name: ex for name, (ex, _, _) in started.items()}
        pids = {name: worker_pids(ex) for name, ex in pools.items()}
        print("executor start (s, not counted in the runs) and one no-op task's round trip "
              "(ms, median of 100):")
        for (engine, procs), (_, start, cost) in started.items():
            print(f"  {engine} x{procs}: start {start:.2f} s, no-op task {cost * 1e3:.2f} ms")
        rows = []
        for form, (kwargs, seconds) in forms.items():
            names = list(pools)
            reference = None
            for name in names if not args.tiny else []:  # warm-up: untimed
                out = f"{root}/warm"
                run(kwargs, out, pools[name])
                got = digest(out)
                reference = reference or got
                if got != reference:
                    raise RuntimeError(f"{form}: {name} wrote other bytes")
                shutil.rmtree(out)
            times: dict = {name: [] for name in names}
            cpus: dict = {name: [] for name in names}
            shape: dict = {}
            for r in range(rounds):
                for name in names[r % len(names):] + names[:r % len(names)]:
                    out = f"{root}/out"
                    wall, cpu = run(kwargs, out, pools[name], shape, pids[name])
                    times[name].append(wall)
                    cpus[name].append(cpu)
                    reference = reference or digest(out)
                    if digest(out) != reference:
                        raise RuntimeError(f"{form}: {name} wrote other bytes")
                    shutil.rmtree(out)
            for (engine, procs) in names:
                t = times[(engine, procs)]
                rate = [seconds / x for x in t]
                local = times[("local pool", procs)]
                ratio = [x / y for x, y in zip(t, local)]
                rows.append((f"{form}", f"{engine} x{procs}", seconds, statistics.median(rate),
                             min(rate), max(rate), statistics.median(rate) / procs,
                             statistics.median(ratio), min(ratio), max(ratio),
                             statistics.median(cpus[(engine, procs)])))
            print(f"{form}: {shape['shards']} shards of {shape['MB']:.1f} MB on average "
                  f"({args.utts_per_shard if not args.tiny else PER_SHARD} utterances each; "
                  f"tasks per pack: as many to measure, as many to write)")
        print(f"{n} utterances, {rounds} round(s); audio s/s = audio-seconds packed per "
              "wall second (median, range); per core = / processes; time ratio = this "
              "executor's time / the local pool's at the same count (median, range); worker "
              "CPU = CPU seconds its worker processes used per pack (all threads; median)")
        print(f"{'form':<16}{'executor':<26}{'audio s':>9}{'audio s/s':>11}{'range':>17}"
              f"{'per core':>10}{'time ratio':>12}{'range':>14}{'worker CPU':>12}")
        for form, ex, sec, med, lo, hi, core, ratio, rlo, rhi, cpu in rows:
            print(f"{form:<16}{ex:<26}{sec:>9.0f}{med:>11.1f}{f'{lo:.1f}-{hi:.1f}':>17}"
                  f"{core:>10.1f}{ratio:>12.2f}{f'{rlo:.2f}-{rhi:.2f}':>14}{cpu:>12.2f}")
        print("byte-identical shards and index for every executor and run: yes")
    finally:
        for close in reversed(stack):
            close()
        shutil.rmtree(root, ignore_errors=True)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
