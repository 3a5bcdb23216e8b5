"""Cost of ``add_noise`` and ``reverberate`` per second of audio, beside the fbank's; the SNRs
they reach against the range asked for.

**Cost.** The demo corpus's utterances (16 kHz speech, held in memory) go through, one stage
at a time: ``add_noise`` (MUSAN-like noise from :func:`speechpipe.testing.write_musan`, held in
memory: decoding noise files is ``load_audio``'s cost, not counted here), ``add_noise`` with
``babble=3``, ``reverberate`` (responses of 0.1-0.3 s from
:func:`speechpipe.testing.write_rirs_noises`, and of 1 s: RIRS_NOISES's simulated responses
are about 1 s), and Kaldi fbank (``compute_features("fbank")``, 80 bins), the reference. One
thread (``torch.set_num_threads(1)``); each round times every stage once over all utterances
with the thread's CPU time (``time.thread_time``), the stages in a shuffled order per round so
that a slow spell of the machine falls on all of them; a warm-up round is dropped. Reported:
the median over rounds of microseconds of CPU per second of audio, the range over rounds, and
the ratio to fbank's median.

**SNR histogram.** ``add_noise`` with ``snr_db=(0, 15)`` over the utterances for several
epochs; the SNR achieved (``snr_db(clean, mixed)``) is binned per dB against the uniform count
the range asks for, with the largest gap between the SNR achieved and the SNR drawn.

    python -m benchmarks bench_augment           # 36 utterances, 9 rounds, 20 epochs of SNRs
    python -m benchmarks bench_augment --tiny    # 6 utterances, 2 rounds, 2 epochs
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from typing import Callable

import numpy as np
import torch

import speechpipe  # noqa: F401  (registers the functional names)
from speechpipe.demo import DEMO_CORPUS
from speechpipe.pipes._core import IterableWrapper
from speechpipe.pipes.audio import AUGMENT, snr_db
from speechpipe.recipes import augment_source
from speechpipe.recipes.librispeech import librispeech_samples
from speechpipe.recipes.musan import prepare_musan
from speechpipe.recipes.rirs_noises import prepare_rirs_noises
from speechpipe.testing import write_musan, write_rirs_noises


def _in_memory(source) -> list[dict]:
    return list(augment_source(source))


def _one_second_responses(rirs: list[dict]) -> list[dict]:
    """The fixture's responses, their tails extended to 1 s (RIRS_NOISES's simulated length)."""
    out = []
    for rir in rirs:
        audio = np.zeros(16000, np.float32)
        audio[: rir["audio"].shape[0]] = rir["audio"]
        tail = np.arange(16000 - rir["audio"].shape[0])
        audio[rir["audio"].shape[0]:] = (np.random.default_rng(0).standard_normal(tail.size)
                                         * 0.01 * np.exp(-tail / 4000)).astype(np.float32)
        out.append({**rir, "audio": audio})
    return out


def stages(noise: list[dict], speech: list[dict], rirs: list[dict]) -> dict[str, Callable]:
    """``{row name: pipe over a list of samples}``."""
    long_rirs = _one_second_responses(rirs)
    return {
        "fbank (reference)": lambda p: p.compute_features("fbank", num_mel_bins=80),
        "add_noise": lambda p: p.add_noise(noise, snr_db=(0.0, 15.0), pool_size=8),
        "add_noise babble=3": lambda p: p.add_noise(speech, snr_db=(13.0, 20.0), babble=3,
                                                    pool_size=8),
        "reverberate (0.1-0.3 s responses)": lambda p: p.reverberate(rirs, pool_size=8),
        "reverberate (1 s responses)": lambda p: p.reverberate(long_rirs, pool_size=8),
    }


def time_stages(samples: list[dict], build: dict[str, Callable], rounds: int) -> dict:
    """``{name: [CPU seconds per round]}`` (a warm-up round dropped)."""
    times: dict[str, list[float]] = {name: [] for name in build}
    order = list(build)
    rng = random.Random(0)
    for round_index in range(rounds + 1):
        rng.shuffle(order)
        for name in order:
            pipe = build[name](IterableWrapper(samples, deepcopy=False))
            start = time.thread_time()
            for _ in pipe:
                pass
            if round_index:
                times[name].append(time.thread_time() - start)
    return times


def cost_table(times: dict, audio_seconds: float) -> str:
    reference = float(np.median(times["fbank (reference)"])) / audio_seconds * 1e6
    lines = ["| stage | µs CPU per audio second (median) | range over rounds | × fbank |",
             "|---|---|---|---|"]
    for name, values in times.items():
        per = np.asarray(values) / audio_seconds * 1e6
        median = float(np.median(per))
        lines.append(f"| {name} | {median:,.0f} | {per.min():,.0f}-{per.max():,.0f} | "
                     f"{median / reference:.2f} |")
    return "\n".join(lines)


def snr_histogram(samples: list[dict], noise: list[dict], epochs: int,
                  low: float = 0.0, high: float = 15.0) -> str:
    """SNRs achieved per 1-dB bin against the uniform count asked for."""
    achieved, gaps = [], []
    pipe = IterableWrapper(samples, deepcopy=False).add_noise(noise, snr_db=(low, high), seed=1)
    for epoch in range(epochs):
        for before, after in zip(samples, pipe.set_epoch(epoch)):
            got = snr_db(before["audio"], after["audio"])
            achieved.append(got)
            gaps.append(abs(got - after[AUGMENT][-1]["snr_db"]))
    counts, edges = np.histogram(achieved, bins=int(high - low), range=(low, high))
    expected = len(achieved) / len(counts)
    lines = [f"SNR achieved, {len(achieved)} mixtures asked for U[{low:g}, {high:g}] dB "
             f"(largest |achieved - drawn|: {max(gaps):.2e} dB):",
             "| dB | achieved | asked (uniform) |", "|---|---|---|"]
    for count, left in zip(counts, edges):
        bar = "#" * int(40 * count / max(counts))
        lines.append(f"| {left:4.0f}-{left + 1:.0f} | {count} {bar} | {expected:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="bench_augment")
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--epochs", type=int, default=20)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    samples = list(librispeech_samples(DEMO_CORPUS))
    rounds, epochs = args.rounds, args.epochs
    if args.tiny:
        samples, rounds, epochs = samples[:6], 2, 2
    with tempfile.TemporaryDirectory() as tmp:
        musan = prepare_musan(write_musan(tmp), parts=["noise", "speech"], progress=False)
        rirs = prepare_rirs_noises(write_rirs_noises(tmp), parts="smallroom", progress=False)
        noise, speech = _in_memory(musan["noise"]), _in_memory(musan["speech"])
        responses = _in_memory(rirs["smallroom"])
    audio_seconds = sum(s["audio"].shape[0] / s["sample_rate"] for s in samples)
    print(f"{len(samples)} utterances, {audio_seconds:.1f} s of audio, {rounds} rounds, "
          "one thread")
    print(cost_table(time_stages(samples, stages(noise, speech, responses), rounds),
                     audio_seconds))
    print()
    print(snr_histogram(samples, noise, epochs))


if __name__ == "__main__":
    main()
