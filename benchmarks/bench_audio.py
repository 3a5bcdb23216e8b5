"""Cost of the audio stages, in × real time per core, against torchaudio called directly.

For each stage of ``speechpipe.pipes.audio`` (resample, perturb_speed, perturb_volume,
compute_features fbank / mfcc / mel, spec_augment, apply_cmvn), one pass of the pipe over the
demo corpus's utterances (16 kHz speech, held in memory) is timed against a plain loop calling
the torchaudio function (or NumPy expression) the stage wraps on the same audio, with the same
options. Figures are seconds of audio processed per CPU second on one thread
(``torch.set_num_threads(1)``, ``time.process_time``), the median of several runs after a
warm-up, the functions of a comparison taking turns within each run (the machine is shared);
"overhead" is the pipe's extra CPU time over the direct loop, in % and in microseconds per
utterance (negative: faster, e.g. from a cached resampling kernel).

Then features per sample against per collated batch (``compute_features(batched=True)``,
which loops over the rows; collation not counted), with batches of utterances of similar
length (as after ``bucket_by_length``) and in random order (more padding), and, for mel,
torchaudio's ``MelSpectrogram`` called once on the whole padded ``(B, T)`` tensor
("stacked": the alternative the loop was chosen over; it also differs from per-sample frames
near each row's end). Nothing here is asserted.

    python -m benchmarks bench_audio           # all 36 demo utterances (174 s), 7 runs
    python -m benchmarks bench_audio --tiny    # 6 utterances, 3 runs (a few seconds)
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Callable, Sequence

import numpy as np
import torch
import torchaudio.functional as taF
import torchaudio.transforms as taT
from torchaudio.compliance import kaldi

import speechpipe  # noqa: F401  (registers the functional names)
from speechpipe.demo import DEMO_CORPUS
from speechpipe.pipes._base import IterableWrapper
from speechpipe.pipes.audio import KALDI_SCALE, compute_cmvn_stats, compute_features
from speechpipe.pipes.collate import PadCollate
from speechpipe.recipes.librispeech import librispeech_samples

RATE = 16000
MEL = dict(n_fft=512, win_length=400, hop_length=160, n_mels=80)


def cpu_seconds(fns: Sequence[Callable[[], object] | None], runs: int) -> list[float | None]:
    """Median CPU seconds of each ``fn()`` over ``runs`` runs, after one warm-up run each.

    The functions run in turn within each run, so that a slow spell of the machine (other
    processes) falls on all of them rather than on one.
    """
    live = [fn for fn in fns if fn is not None]
    for fn in live:
        fn()
    times: dict[int, list[float]] = {id(fn): [] for fn in live}
    for _ in range(runs):
        for fn in live:
            start = time.process_time()
            fn()
            times[id(fn)].append(time.process_time() - start)
    return [None if fn is None else statistics.median(times[id(fn)]) for fn in fns]


def _drain(pipe) -> None:
    for _ in pipe:
        pass


def _pipe(samples):
    return IterableWrapper(samples, deepcopy=False)


def stage_pairs(samples: list[dict]) -> list[tuple[str, Callable, Callable | None]]:
    """(stage, speechpipe pass, direct torchaudio/NumPy pass) over the same samples."""
    waves = [torch.from_numpy(s["audio"]) for s in samples]
    speeds = [s["speed"] for s in _pipe(samples).perturb_speed(seed=0)]
    gains = [s["gain"] for s in _pipe(samples).perturb_volume(seed=0)]
    feats = [{"key": s["key"], "feats": compute_features(s["audio"], RATE, num_mel_bins=80)}
             for s in samples]
    stats = compute_cmvn_stats(feats, progress=False)
    mean32 = stats.mean.astype(np.float32)
    istd32 = (1.0 / np.sqrt(np.maximum(stats.variance, 1e-20))).astype(np.float32)
    mel = taT.MelSpectrogram(RATE, **MEL)
    spec_augment = taT.SpecAugment(n_time_masks=2, time_mask_param=40, n_freq_masks=2,
                                   freq_mask_param=27, iid_masks=False, zero_masking=True)

    def loop(fn):
        return lambda: [fn(*args) for args in zip(waves, speeds, gains, feats)]

    return [
        ("resample 16k->8k",
         lambda: _drain(_pipe(samples).resample(8000)),
         loop(lambda w, *_: taF.resample(w, RATE, 8000))),
        ("perturb_speed (0.9,1.0,1.1)",
         lambda: _drain(_pipe(samples).perturb_speed(seed=0)),
         loop(lambda w, f, *_: taF.speed(w, RATE, f))),
        ("perturb_volume",
         lambda: _drain(_pipe(samples).perturb_volume(seed=0)),
         loop(lambda w, f, g, _: w.numpy() * np.float32(g))),
        ("fbank 80",
         lambda: _drain(_pipe(samples).compute_features("fbank", num_mel_bins=80)),
         loop(lambda w, *_: kaldi.fbank(w[None] * KALDI_SCALE, num_mel_bins=80))),
        ("fbank 80, dither 1",
         lambda: _drain(_pipe(samples).compute_features("fbank", dither=1.0, num_mel_bins=80)),
         loop(lambda w, *_: kaldi.fbank(w[None] * KALDI_SCALE, num_mel_bins=80, dither=1.0))),
        ("mfcc 40 bins, 13 ceps",
         lambda: _drain(_pipe(samples).compute_features("mfcc", num_mel_bins=40)),
         loop(lambda w, *_: kaldi.mfcc(w[None] * KALDI_SCALE, num_mel_bins=40))),
        ("log-mel 80",
         lambda: _drain(_pipe(samples).compute_features("mel", log=True, **MEL)),
         loop(lambda w, *_: mel(w).clamp(min=1e-10).log().T)),
        ("spec_augment 2F27 2T40",
         lambda: _drain(_pipe(feats).spec_augment(time_width=40)),
         loop(lambda w, f, g, x: spec_augment(torch.from_numpy(x["feats"]).T).T)),
        ("spec_augment + time_warp 80",
         lambda: _drain(_pipe(feats).spec_augment(time_width=40, time_warp=80)),
         None),
        ("apply_cmvn (global)",
         lambda: _drain(_pipe(feats).apply_cmvn(stats)),
         loop(lambda w, f, g, x: (x["feats"] - mean32) * istd32)),
    ]


def batch_rows(samples: list[dict], batch_size: int, seed: int = 0):
    """(label, padded / real, per-sample pass, per-batch pass, torchaudio on the stack)."""
    collate = PadCollate(fields=("key", "audio", "sample_rate"))
    by_length = sorted(samples, key=lambda s: len(s["audio"]))
    shuffled = list(samples)
    random.Random(seed).shuffle(shuffled)
    mel = taT.MelSpectrogram(RATE, **MEL)
    rows = []
    for order_name, order in (("similar lengths", by_length), ("random order", shuffled)):
        batches = [collate(order[i:i + batch_size]) for i in range(0, len(order), batch_size)]
        padded = sum(b["audio"].numel() for b in batches) / RATE
        for kind, options in (("fbank", {"num_mel_bins": 80}), ("mel", {**MEL, "log": True})):
            stacked = None
            if kind == "mel":  # one MelSpectrogram call on the padded (B, T) tensor
                stacked = lambda batches=batches: [  # noqa: E731
                    mel(b["audio"]).clamp(min=1e-10).log() for b in batches]
            rows.append((
                f"{kind}, batches of {batch_size}, {order_name}", padded,
                lambda kind=kind, options=options: _drain(
                    _pipe(samples).compute_features(kind, **options)),
                lambda kind=kind, options=options, batches=batches: _drain(
                    _pipe(batches).compute_features(kind, batched=True, **options)),
                stacked,
            ))
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--batch-size", type=int, default=8)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    samples = list(librispeech_samples(DEMO_CORPUS))
    runs = args.runs
    if args.tiny:
        samples, runs = sorted(samples, key=lambda s: s["key"])[::6], 3
    seconds = sum(len(s["audio"]) for s in samples) / RATE
    print(f"{len(samples)} utterances, {seconds:.1f} s of 16 kHz audio; one thread; "
          f"median CPU time of {runs} runs; figures in x real time (audio s per CPU s)")

    head = (f"{'stage':<30} {'torchaudio':>11} {'speechpipe':>11} {'overhead':>9} "
            f"{'us/utt':>7}")
    print(head)
    print("-" * len(head))
    for name, ours, direct in stage_pairs(samples):
        t_ours, t_direct = cpu_seconds([ours, direct], runs)
        if t_direct is None:
            print(f"{name:<30} {'-':>11} {seconds / t_ours:>11.0f} {'-':>9} {'-':>7}")
            continue
        overhead = 100.0 * (t_ours - t_direct) / t_direct
        extra = 1e6 * (t_ours - t_direct) / len(samples)
        print(f"{name:<30} {seconds / t_direct:>11.0f} {seconds / t_ours:>11.0f} "
              f"{overhead:>8.1f}% {extra:>7.0f}")

    print()
    head = (f"{'features':<36} {'padded/real':>11} {'per sample':>11} {'per batch':>10} "
            f"{'stacked':>8}")
    print(head)
    print("-" * len(head))
    for label, padded, per_sample, per_batch, stacked in batch_rows(samples, args.batch_size):
        t_sample, t_batch, t_stack = cpu_seconds([per_sample, per_batch, stacked], runs)
        t_stacked = f"{seconds / t_stack:>8.0f}" if t_stack else f"{'-':>8}"
        print(f"{label:<36} {padded / seconds:>11.2f} {seconds / t_sample:>11.0f} "
              f"{seconds / t_batch:>10.0f} {t_stacked}")


if __name__ == "__main__":
    main()
