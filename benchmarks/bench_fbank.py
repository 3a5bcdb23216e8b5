"""Kaldi fbank per audio second: speechpipe's :func:`~speechpipe.pipes.audio._fbank.fbank`
against :func:`torchaudio.compliance.kaldi.fbank` and lhotse's ``Wav2LogFilterBank``.

Same options for all three: 80 bins, 25/10 ms povey frames, pre-emphasis 0.97, DC removal,
FFT of 512, ``snip_edges=True``, ``high_freq=0`` (Nyquist), no dither, no energy (lhotse's
layer is built with those values; its other defaults differ). Input: the demo corpus's
utterances (16 kHz, held in memory as float32 tensors).

- **single utterance**: each implementation on each utterance (torchaudio with ``(1, n)``,
  lhotse's layer with ``(1, n)``, ours with ``(n,)``);
- **padded batch of 16**: the utterances in random order, 16 to a batch, padded: ours once
  per batch with the lengths (frames past each row's end are not computed), lhotse's layer
  once on the padded ``(16, T)`` tensor (its batched form: it computes the padding too),
  torchaudio row by row on each row's real samples (it has no batched form);
- on CUDA: ``bench_cuda_features`` (the batched fbank, SpecAugment and CMVN on the device).

Method: one thread (``torch.set_num_threads(1)``), the garbage collector off while timing,
CPU time of the thread (``time.thread_time_ns``) around each call. In each round every item
(utterance or batch) is computed by the three in turn, in an order that rotates from item to
item, so a slow spell of the machine falls on all of them; a warm-up round is dropped. A
round's figure is the real audio seconds over the CPU seconds summed over its items (× real
time); printed: the median over rounds, the range (slowest and fastest round), and the
ratios of medians. Speed is measured, never asserted.

    python -m benchmarks bench_fbank            # all demo utterances, 15 rounds
    python -m benchmarks bench_fbank --tiny     # 6 utterances, 2 rounds (a few seconds)
    python -m benchmarks.bench_fbank --profile  # also torch.profiler's top entries of ours
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time
import warnings
from typing import Callable

import torch
from torchaudio.compliance import kaldi

import speechpipe  # noqa: F401  (registers the functional names)
from speechpipe.demo import DEMO_CORPUS
from speechpipe.pipes.audio import KALDI_SCALE
from speechpipe.pipes.audio import fbank, FbankOptions
from speechpipe.recipes.librispeech import librispeech_samples

RATE = 16000
BINS = 80
OPTIONS = FbankOptions(num_mel_bins=BINS)


def _lhotse_layer() -> Callable[[torch.Tensor], torch.Tensor] | None:
    try:
        from lhotse.features.kaldi.layers import Wav2LogFilterBank
    except ImportError:  # lhotse is optional here
        return None
    with warnings.catch_warnings():  # snip_edges=True: lhotse warns about its manifests
        warnings.simplefilter("ignore", UserWarning)
        layer = Wav2LogFilterBank(sampling_rate=RATE, snip_edges=True, high_freq=0.0,
                                  num_filters=BINS, energy_floor=1.0)
    layer.eval()

    def run(x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return layer(x)
    return run


def implementations(batched: bool) -> dict[str, Callable[[tuple], object]]:
    """name -> call on one item: ``(waveform (n,), n)`` or ``(padded (B, T), lengths)``."""
    lhotse = _lhotse_layer()
    if batched:
        impls = {
            "speechpipe": lambda item: fbank(item[0], item[1], sample_rate=RATE,
                                             options=OPTIONS),
            "torchaudio": lambda item: [
                kaldi.fbank(row[:n].unsqueeze(0), num_mel_bins=BINS)
                for row, n in zip(item[0], item[1].tolist())],
        }
        if lhotse:
            impls["lhotse"] = lambda item: lhotse(item[0])
    else:
        impls = {
            "speechpipe": lambda item: fbank(item[0], sample_rate=RATE, options=OPTIONS),
            "torchaudio": lambda item: kaldi.fbank(item[0].unsqueeze(0), num_mel_bins=BINS),
        }
        if lhotse:
            impls["lhotse"] = lambda item: lhotse(item[0].unsqueeze(0))
    return impls


def demo_waves(tiny: bool, runs: int) -> tuple[list[torch.Tensor], float, int]:
    """The demo corpus's utterances on the 16-bit scale (every 6th with ``tiny``), their
    seconds, and the rounds to run (2 with ``tiny``)."""
    samples = sorted(librispeech_samples(DEMO_CORPUS), key=lambda s: s["key"])
    if tiny:
        samples, runs = samples[::6], 2
    waves = [torch.from_numpy(s["audio"]) * KALDI_SCALE for s in samples]
    return waves, sum(w.shape[0] for w in waves) / RATE, runs


def items_of(waves: list[torch.Tensor], batch_size: int | None, seed: int = 0) -> list[tuple]:
    if batch_size is None:
        return [(w, w.shape[0]) for w in waves]
    order = list(waves)
    random.Random(seed).shuffle(order)
    out = []
    for i in range(0, len(order), batch_size):
        rows = order[i: i + batch_size]
        lengths = torch.tensor([r.shape[0] for r in rows])
        padded = torch.zeros(len(rows), int(lengths.max()))
        for row, w in zip(padded, rows):
            row[: w.shape[0]] = w
        out.append((padded, lengths))
    return out


def rounds(impls: dict[str, Callable], items: list[tuple], runs: int) -> dict[str, list[float]]:
    """CPU seconds per round (sum over items) of each implementation; warm-up dropped."""
    names = list(impls)
    out: dict[str, list[float]] = {name: [] for name in names}
    for run in range(runs + 1):
        spent = dict.fromkeys(names, 0)
        for i, item in enumerate(items):
            turn = names[i % len(names):] + names[: i % len(names)]
            for name in turn:
                gc.disable()
                try:
                    start = time.thread_time_ns()
                    impls[name](item)
                    spent[name] += time.thread_time_ns() - start
                finally:
                    gc.enable()
        if run:
            for name in names:
                out[name].append(spent[name] * 1e-9)
    return out


def report(label: str, seconds: float, times: dict[str, list[float]]) -> None:
    medians = {name: statistics.median(t) for name, t in times.items()}
    print(f"{label}: {seconds:.1f} s of audio per round, {len(next(iter(times.values())))} "
          f"rounds")
    for name, t in times.items():
        print(f"  {name:<11} {seconds / medians[name]:>7.0f} x real time "
              f"[{seconds / max(t):.0f}, {seconds / min(t):.0f}]")
    ours = medians["speechpipe"]
    ratios = ", ".join(f"{medians[name] / ours:.2f}x {name}'s" for name in times
                       if name != "speechpipe")
    print(f"  speechpipe speed: {ratios}")


def profile(waves: list[torch.Tensor]) -> None:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    items = items_of(waves, 16)
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        for padded, lengths in items:
            fbank(padded, lengths, sample_rate=RATE, options=OPTIONS)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    waves, seconds, runs = demo_waves(args.tiny, args.runs)
    print(f"fbank, {BINS} bins, {len(waves)} utterances of 16 kHz audio; one thread; "
          "x real time = audio s per CPU s; median [slowest, fastest round]")
    for label, batch_size in (("single utterance", None),
                              (f"padded batch of {args.batch_size}", args.batch_size)):
        impls = implementations(batch_size is not None)
        report(label, seconds, rounds(impls, items_of(waves, batch_size), runs))
    if args.profile:
        profile(waves)


if __name__ == "__main__":
    main()
