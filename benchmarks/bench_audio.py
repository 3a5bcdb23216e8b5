"""Cost of the audio stages, in × real time per core, against torchaudio called directly.

For each stage of ``speechpipe.pipes.audio._channels`` (resample, perturb_speed, perturb_volume,
compute_features fbank / mfcc / mel, per sample and per collated batch, spec_augment,
apply_cmvn), the pipe over the demo corpus's utterances (16 kHz speech, held in memory) is
timed against a "direct" loop doing the same work without the stage: the torchaudio function
(or NumPy expression) the stage wraps, with the same options, on the same input, giving the
same output (same dtype and layout, same random draws from the same seeded generators, the
same resampling kernels built once, as anyone calling torchaudio at a fixed rate would;
checked number for number before timing). The
stage's own work -- checking the sample, copying it into a new dict with the changed fields,
deriving its generator from ``(seed, epoch, rank, worker)`` once per pass, torch's DataPipe
hooks -- is what "overhead" measures. Both loops read their samples from the same kind of
source pipe, so the source's own cost cancels.

Method: one thread (``torch.set_num_threads(1)``), glibc's allocator kept from handing freed
memory back to the kernel (:func:`steady_allocator`), the garbage collector off while timing,
and around each utterance the CPU time of the thread (``time.thread_time_ns``: time the
machine gives to other processes is not counted). Utterance by utterance the loops take
turns, in each of their orders in turn, each call preceded by a read of the utterance's array
(so that every loop finds it in the cache, not only the one that runs second), and a slow
spell of the machine (other processes sharing the caches) falls on all of them. A warm-up
pass is dropped; of the ``--runs`` passes each utterance's fastest time is kept (disturbances
only ever add time), and the figures are sums over utterances of these minima: seconds of
audio per second of one core, and the overhead in % and in microseconds per utterance. The
overhead is given per utterance after a pass's first (the cost an epoch of thousands of
utterances per worker pays), the first utterance's extra cost (the stage's once-per-pass
setup: deriving its generator, filling its caches) apart in microseconds, and the two
together over the whole pass of the demo's few utterances, where the setup weighs far more
than in an epoch. The
range beside it is the smallest and largest overhead over three disjoint thirds of the
passes (each estimated the same way), a check on how far the figure moves with the passes it
rests on.

The last column is torchaudio's own call where the stage deliberately differs from it (not
"the same work"): ``torchaudio.functional.resample`` / ``speed`` rebuild their kernel on every
call, Kaldi's ``dither`` draws noise per frame from torch's global generator, and
``torchaudio.transforms.SpecAugment`` builds masks with tensor operations.

Two reference rows put the same direct work in torch's own ``map`` stage (the thinnest
wrapper a pipeline can have: it copies no dict and checks nothing): their overhead is what any
DataPipe stage costs on that work, on this machine, in this run.

Then features per sample against per collated batch (``compute_features(batched=True)``,
which loops over the rows; collation not counted), with batches of utterances of similar
length (as after ``bucket_by_length``) and in random order (more padding), and, for mel,
torchaudio's ``MelSpectrogram`` called once on the whole padded ``(B, T)`` tensor
("stacked": the alternative the loop was chosen over; it also differs from per-sample frames
near each row's end): the fastest of the passes. Beside them, for fbank, the two batched
torch implementations on the padded ``(B, T)`` audio: speechpipe's vectorised Kaldi fbank
(:func:`speechpipe.pipes.audio._fbank.fbank` with the rows' lengths: padding not computed) and
lhotse's ``Wav2LogFilterBank`` (its batched form, padding computed). The rows
``spec_augment`` / ``apply_cmvn`` ``batched`` are the stages on collated ``(B, T, 80)``
feature batches (features on the device, the CPU device here) against
:func:`~speechpipe.pipes.audio._augment.spec_augment_batch` / ``normalize_batch`` called directly.
Last, the decode: soundfile decoding these utterances from FLAC bytes, × real time per core,
next to one utterance's vectorised fbank and torchaudio's (``bench_decode``'s part 2). No
timing is asserted.

    python -m benchmarks bench_audio           # all 36 demo utterances (174 s), 15 passes
    python -m benchmarks.bench_audio --durations librispeech-train-clean-100
                                               # 36 utterances of LibriSpeech's lengths
    python -m benchmarks bench_audio --tiny    # 6 utterances, 3 passes (a few seconds)
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import io
import itertools
import math
import random
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import soundfile
import torch
import torchaudio.functional as taF
import torchaudio.transforms as taT
from torchaudio.compliance import kaldi

import speechpipe  # noqa: F401  (registers the functional names)
from speechpipe.demo import DEMO_CORPUS
from speechpipe.pipes._core import IterableWrapper
from speechpipe.pipes.audio import spec_augment, spec_augment_batch
from speechpipe.pipes.audio import compute_cmvn_stats, normalize_batch
from speechpipe.pipes.collate import PadCollate
from speechpipe.pipes.audio import compute_features, KALDI_SCALE, mel_num_frames, num_frames
from speechpipe.pipes.audio import FbankOptions
from speechpipe.pipes.audio import fbank as kaldi_fbank
from speechpipe.recipes.librispeech import librispeech_samples
from speechpipe.seeding import derive_rng, derive_seed

RATE = 16000
MEL = dict(n_fft=512, win_length=400, hop_length=160, n_mels=80)
SPEEDS = (0.9, 1.0, 1.1)
#: The stages here measure their overhead over torchaudio's functions, so they compute with
#: them; speechpipe's own fbank is measured in bench_fbank.
TA = "torchaudio"
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters

#: A per-item function, made afresh for each pass (so that seeded generators restart).
Direct = Callable[[], Callable[[Any], object]]


@dataclass
class Case:
    """One stage against the same work done directly (and, optionally, torchaudio's call)."""

    name: str
    items: list
    stage: Callable[[Any], Any]
    direct: Direct
    torchaudio: Direct | None = None


class _Call:
    """A function as a callable object (torch's ``map`` warns about local functions)."""

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn

    def __call__(self, item: Any) -> Any:
        return self.fn(item)


def check_same_output(case: Case) -> None:
    """Raise unless the direct loop gives the stage's output (``feats``, else ``audio``) with
    the same numbers and dtype: both loops do the same work."""
    direct = case.direct()
    for item, out in zip(case.items, case.stage(_pipe(case.items))):
        if isinstance(out, dict):
            out = out["feats"] if "feats" in out else out["audio"]
        ours = np.asarray(out)
        theirs = direct(item)
        theirs = np.asarray(theirs[0] if isinstance(theirs, tuple) else theirs)
        if ours.dtype != theirs.dtype or not np.array_equal(ours, theirs):
            raise AssertionError(f"{case.name}: the direct loop does not give the stage's output")


def steady_allocator() -> None:
    """Keep freed blocks in glibc's heap (no per-block mmap, no trimming), so that each pass
    reuses the memory of the one before, as a long-running loader does, instead of taking fresh
    pages from the kernel depending on what ran earlier in the process. Other C libraries:
    nothing to do."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    libc.mallopt(_M_MMAP_THRESHOLD, 32 << 20)  # glibc's largest
    libc.mallopt(_M_TRIM_THRESHOLD, 1 << 30)


def _pipe(items):
    return IterableWrapper(items, deepcopy=False)


def paired_times(case: Case, runs: int) -> np.ndarray:
    """Nanoseconds ``(loops, runs, items)``: the stage, the direct loop (and torchaudio's).

    Item by item, the loops take turns, in each of their orders in turn (so that none always
    runs first, or always right after the same other one), each pulling its items from its own
    source pipe; the stage's end of pass (its ``StopIteration``) counts with the last item.
    One warm-up pass is dropped. Outputs are kept until the pass ends, so that freeing them is
    timed for neither loop.
    """
    clock = time.thread_time_ns
    n, last = len(case.items), len(case.items) - 1
    loops = 2 if case.torchaudio is None else 3
    times = np.zeros((loops, runs + 1, n), np.int64)
    orders = list(itertools.permutations(range(loops)))
    for run in range(runs + 1):
        stage = iter(case.stage(_pipe(case.items)))
        sources = [iter(_pipe(case.items)) for _ in range(loops - 1)]
        fns = [case.direct()] + ([case.torchaudio()] if case.torchaudio else [])
        kept = []
        gc.collect()
        gc.disable()
        try:
            for i in range(n):
                for loop in orders[(run + i) % len(orders)]:
                    _touch(case.items[i])
                    if loop == 0:
                        start = clock()
                        kept.append(next(stage))
                        if i == last:
                            next(stage, None)
                        times[0, run, i] = clock() - start
                    else:
                        source, fn = sources[loop - 1], fns[loop - 1]
                        start = clock()
                        kept.append(fn(next(source)))
                        if i == last:
                            next(source, None)
                        times[loop, run, i] = clock() - start
        finally:
            gc.enable()
        del kept
    return times[:, 1:]


def _touch(item) -> None:
    """Read the item's array, so that every loop finds it in the cache, not only the second."""
    for field in ("audio", "feats"):
        if field in item:
            float(item[field].sum())
            return


def _total(times: np.ndarray) -> float:
    """Seconds: the sum over items of each item's fastest pass (``times``: ``(runs, items)``)."""
    return float(times.min(axis=0).sum()) * 1e-9


def overhead(ours: np.ndarray, direct: np.ndarray) -> float:
    """The stage's extra time over the direct loop's, in % (min-of-passes estimates)."""
    return 100.0 * (_total(ours) - _total(direct)) / _total(direct)


def overhead_range(ours: np.ndarray, direct: np.ndarray) -> tuple[float, float]:
    """Smallest and largest :func:`overhead` over three disjoint thirds of the passes."""
    thirds = [part for part in np.array_split(np.arange(ours.shape[0]), 3) if len(part)]
    values = [overhead(ours[part], direct[part]) for part in thirds]
    return min(values), max(values)


def _rows_directly(batch, extract, scale: float, frames_of: Callable[[int], int], dim: int):
    """The work of ``compute_features(batched=True)`` on a collated batch, inline: the padded
    features allocated from the frame counts, then filled row by row."""
    audio, lengths = batch["audio"], batch["audio_len"].tolist()
    frames = [frames_of(n) for n in lengths]
    feats = torch.zeros(len(lengths), max(frames), dim)
    for i, n in enumerate(lengths):
        feats[i, : frames[i]] = extract(audio[i, :n] * scale if scale != 1.0 else audio[i, :n])
    return feats, torch.tensor(frames, dtype=torch.int64)


def cases(samples: list[dict], batch_size: int) -> list[Case]:
    """The stages and their direct loops, over the same samples."""
    feats = [{"key": s["key"], "feats": compute_features(s["audio"], RATE, num_mel_bins=80)}
             for s in samples]
    stats = compute_cmvn_stats(feats, progress=False)
    mean32 = stats.mean.astype(np.float32)
    istd32 = (1.0 / np.sqrt(np.maximum(stats.variance, 1e-20))).astype(np.float32)
    mel = taT.MelSpectrogram(RATE, **MEL)
    to_8k = taT.Resample(RATE, 8000, dtype=torch.float32)
    kernels = {}
    for factor in SPEEDS:
        source = int(round(RATE * factor))
        g = math.gcd(source, RATE)
        kernels[factor] = (None if source == RATE
                           else taT.Resample(source // g, RATE // g, dtype=torch.float32))
    torch_spec_augment = taT.SpecAugment(n_time_masks=2, time_mask_param=40, n_freq_masks=2,
                                         freq_mask_param=27, iid_masks=False, zero_masking=True)
    collate = PadCollate(fields=("key", "audio", "sample_rate"))
    by_length = sorted(samples, key=lambda s: len(s["audio"]))
    batches = [collate(by_length[i:i + batch_size]) for i in range(0, len(by_length), batch_size)]
    collate_feats = PadCollate(fields=("key", "feats"))
    feat_batches = [collate_feats(feats[i:i + batch_size])
                    for i in range(0, len(feats), batch_size)]

    def wave(s):
        return torch.from_numpy(s["audio"])

    def mel_frames(n):
        return mel_num_frames(n, MEL["n_fft"], MEL["hop_length"], win_length=MEL["win_length"])

    def fbank(w, **options):
        return kaldi.fbank(w.unsqueeze(0), num_mel_bins=80, **options)

    def log_mel(w):
        return mel(w).clamp(min=1e-10).log().T

    def seeded(salt: str) -> Callable[[], Any]:
        return lambda: derive_rng(0, 0, 0, 0, salt)

    def generator(salt: str) -> torch.Generator:
        return torch.Generator().manual_seed(derive_seed(0, 0, 0, 0, salt))

    def speed():
        rng = seeded("perturb_speed")()

        def run(s):
            kernel = kernels[rng.choice(SPEEDS)]
            return s["audio"] if kernel is None else kernel(wave(s)).numpy()
        return run

    def speed_torchaudio():
        rng = seeded("perturb_speed")()
        return lambda s: taF.speed(wave(s), RATE, rng.choice(SPEEDS))[0]

    def volume():
        rng = seeded("perturb_volume")()
        return lambda s: s["audio"] * np.float32(rng.uniform(0.8, 1.2))

    def dithered():
        g = generator("compute_features")

        def run(s):
            w = wave(s) * KALDI_SCALE
            return fbank(w + torch.randn(w.shape[0], generator=g) * 1.0).numpy()
        return run

    def masked(warp: int) -> Direct:
        def make():
            g = generator("spec_augment")
            return lambda s: spec_augment(torch.from_numpy(s["feats"]), time_width=40,
                                          time_warp_window=warp, generator=g).numpy()
        return make

    def masked_batch():
        g = generator("spec_augment")
        return lambda b: spec_augment_batch(b["feats"], b["feats_len"].tolist(), time_width=40,
                                            generator=g)

    return [
        Case("resample 16k->8k", samples, lambda p: p.resample(8000),
             lambda: lambda s: to_8k(wave(s)).numpy(),
             lambda: lambda s: taF.resample(wave(s), RATE, 8000)),
        Case("perturb_speed (0.9,1.0,1.1)", samples, lambda p: p.perturb_speed(seed=0),
             speed, speed_torchaudio),
        Case("perturb_volume", samples, lambda p: p.perturb_volume(seed=0), volume),
        Case("  torch map(volume) (reference)", samples, lambda p: p.map(_Call(volume())),
             volume),
        Case("fbank 80", samples, lambda p: p.compute_features("fbank", num_mel_bins=80,
                                                               backend=TA),
             lambda: lambda s: fbank(wave(s) * KALDI_SCALE).numpy()),
        Case("fbank 80, dither 1", samples,
             lambda p: p.compute_features("fbank", dither=1.0, num_mel_bins=80, backend=TA),
             dithered,
             lambda: lambda s: fbank(wave(s) * KALDI_SCALE, dither=1.0)),
        Case("mfcc 40 bins, 13 ceps", samples,
             lambda p: p.compute_features("mfcc", num_mel_bins=40, backend=TA),
             lambda: lambda s: kaldi.mfcc(wave(s).unsqueeze(0) * KALDI_SCALE,
                                          num_mel_bins=40).numpy()),
        Case("log-mel 80", samples,
             lambda p: p.compute_features("mel", log=True, backend=TA, **MEL),
             lambda: lambda s: np.ascontiguousarray(log_mel(wave(s)).numpy())),
        Case(f"fbank 80, batches of {batch_size}", batches,
             lambda p: p.compute_features("fbank", batched=True, num_mel_bins=80, backend=TA),
             lambda: lambda b: _rows_directly(b, fbank, KALDI_SCALE, num_frames, 80)),
        Case(f"log-mel 80, batches of {batch_size}", batches,
             lambda p: p.compute_features("mel", batched=True, log=True, backend=TA, **MEL),
             lambda: lambda b: _rows_directly(b, log_mel, 1.0, mel_frames, MEL["n_mels"])),
        Case("spec_augment 2F27 2T40", feats, lambda p: p.spec_augment(time_width=40),
             masked(0),
             lambda: lambda s: torch_spec_augment(torch.from_numpy(s["feats"]).T).T),
        Case("spec_augment + time_warp 80", feats,
             lambda p: p.spec_augment(time_width=40, time_warp=80), masked(80)),
        Case("apply_cmvn (global)", feats, lambda p: p.apply_cmvn(stats),
             lambda: lambda s: (s["feats"] - mean32) * istd32),
        Case("  torch map(cmvn) (reference)", feats,
             lambda p: p.map(_Call(lambda s: (s["feats"] - mean32) * istd32)),
             lambda: lambda s: (s["feats"] - mean32) * istd32),
        Case(f"spec_augment batched ({batch_size})", feat_batches,
             lambda p: p.spec_augment(time_width=40, batched=True), masked_batch),
        Case(f"apply_cmvn batched ({batch_size})", feat_batches,
             lambda p: p.apply_cmvn(stats, batched=True),
             lambda: lambda b: normalize_batch(b["feats"], b["feats_len"].tolist(), stats)),
    ]


def pass_seconds(fns: Sequence[Callable[[], object] | None], runs: int) -> list[float | None]:
    """Fastest wall time of each ``fn()`` over ``runs`` passes (taking turns), after a warm-up."""
    live = [fn for fn in fns if fn is not None]
    best = {id(fn): float("inf") for fn in live}
    for run in range(runs + 1):
        for fn in live:
            gc.collect()
            gc.disable()
            try:
                start = time.perf_counter_ns()
                fn()
                elapsed = (time.perf_counter_ns() - start) * 1e-9
            finally:
                gc.enable()
            if run:
                best[id(fn)] = min(best[id(fn)], elapsed)
    return [None if fn is None else best[id(fn)] for fn in fns]


def _drain(pipe) -> None:
    for _ in pipe:
        pass


def batched_orders(samples: list[dict], batch_size: int, seed: int = 0):
    """(label, collated audio batches): utterances of similar lengths, and in random order."""
    collate = PadCollate(fields=("key", "audio", "sample_rate"))
    shuffled = list(samples)
    random.Random(seed).shuffle(shuffled)
    for label, order in (("similar lengths", sorted(samples, key=lambda s: len(s["audio"]))),
                         ("random order", shuffled)):
        yield label, [collate(order[i:i + batch_size]) for i in range(0, len(order), batch_size)]


def _batched_fbanks(batches: list[dict]) -> tuple[Callable[[], object], Callable[[], object]]:
    """Passes over ``batches`` of speechpipe's vectorised fbank (with the rows' lengths) and of
    lhotse's ``Wav2LogFilterBank`` (on the whole padded audio; ``None`` without lhotse)."""
    options = FbankOptions(num_mel_bins=80)

    def ours():
        for b in batches:
            kaldi_fbank(b["audio"] * KALDI_SCALE, b["audio_len"], sample_rate=RATE,
                        options=options)

    try:
        from benchmarks.bench_pipeline import lhotse_fbank_layer

        layer = lhotse_fbank_layer()
    except ImportError:  # lhotse is optional here
        return ours, None

    def lhotse():
        with torch.no_grad():
            for b in batches:
                layer(b["audio"])
    return ours, lhotse


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
                    _pipe(samples).compute_features(kind, backend=TA, **options)),
                lambda kind=kind, options=options, batches=batches: _drain(
                    _pipe(batches).compute_features(kind, batched=True, backend=TA,
                                                    **options)),
                stacked,
            ))
    return rows


def realistic_samples(samples: list[dict], corpus: str, seed: int = 0) -> list[dict]:
    """As many utterances as ``samples``, with durations drawn from ``corpus``'s published
    distribution, cut in turn from the demo's speech laid end to end (wrapping around)."""
    from speechpipe.testing import sample_durations

    speech = np.concatenate([s["audio"] for s in samples])
    durations = sample_durations(corpus, len(samples), seed, usable_only=True)
    out, start = [], 0
    for i, seconds in enumerate(durations):
        size = int(seconds * RATE)
        audio = np.take(speech, np.arange(start, start + size), mode="wrap")
        start = (start + size) % len(speech)
        out.append({**samples[i], "key": f"r{i:03d}", "duration": size / RATE,  # same fields
                    "audio": np.ascontiguousarray(audio, np.float32), "sample_rate": RATE})
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--durations", default=None, metavar="CORPUS",
                        help="utterances as long as CORPUS's (durations.md, e.g. "
                             "librispeech-train-clean-100), cut from the demo's speech; "
                             "default: the demo's own utterances (4.8 s on average)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    steady_allocator()
    samples = list(librispeech_samples(DEMO_CORPUS))
    if args.durations:
        samples = realistic_samples(samples, args.durations)
    runs = args.runs
    if args.tiny:
        samples, runs = sorted(samples, key=lambda s: s["key"])[::6], 3
    seconds = sum(len(s["audio"]) for s in samples) / RATE
    print(f"{len(samples)} utterances, {seconds:.1f} s of 16 kHz audio; one thread; per "
          f"utterance the fastest of {runs} passes; x real time = audio s per s of one core")

    print("overhead: per item (utterance or batch) after the first of a pass (what an epoch "
          "of thousands pays), its range over thirds of the passes, in us per item; setup: "
          "the first item's extra beyond that, once per pass (seeding, caches); "
          f"pass: the whole pass of {len(samples)} utterances, setup included")
    head = (f"{'stage':<30} {'direct':>7} {'stage':>7} {'overhead':>9} {'range (thirds)':>15} "
            f"{'us/item':>7} {'setup us':>9} {'pass':>6} {'torchaudio':>11}")
    print(head)
    print("-" * len(head))
    for case in cases(samples, args.batch_size):
        check_same_output(case)
        times = paired_times(case, runs)
        ours, direct = times[0], times[1]
        first = 1 if ours.shape[1] > 1 else 0  # a pass of one batch (--tiny): no steady part
        steady_ours, steady_direct = ours[:, first:], direct[:, first:]
        low, high = overhead_range(steady_ours, steady_direct)
        extra = 1e6 * (_total(steady_ours) - _total(steady_direct)) / steady_ours.shape[1]
        setup = 1e6 * (_total(ours[:, :first]) - _total(direct[:, :first])) - extra * first
        as_is = f"{seconds / _total(times[2]):>11.0f}" if len(times) == 3 else f"{'-':>11}"
        print(f"{case.name:<30} {seconds / _total(direct):>7.0f} {seconds / _total(ours):>7.0f} "
              f"{overhead(steady_ours, steady_direct):>8.1f}% "
              f"{f'[{low:.1f}, {high:.1f}]%':>15} {extra:>7.1f} {setup:>9.0f} "
              f"{overhead(ours, direct):>5.1f}% {as_is}")

    print()
    head = (f"{'features':<36} {'padded/real':>11} {'per sample':>11} {'per batch':>10} "
            f"{'stacked':>8}")
    print(head)
    print("-" * len(head))
    for label, padded, per_sample, per_batch, stacked in batch_rows(samples, args.batch_size):
        t_sample, t_batch, t_stack = pass_seconds([per_sample, per_batch, stacked], runs)
        t_stacked = f"{seconds / t_stack:>8.0f}" if t_stack else f"{'-':>8}"
        print(f"{label:<36} {padded / seconds:>11.2f} {seconds / t_sample:>11.0f} "
              f"{seconds / t_batch:>10.0f} {t_stacked}")

    print()
    print(f"fbank 80 on padded batches of {args.batch_size}, x real time (fastest pass): "
          "speechpipe's vectorised Kaldi fbank with the rows' lengths, lhotse's "
          "Wav2LogFilterBank on the whole padded audio")
    for label, batches in batched_orders(samples, args.batch_size):
        ours, lhotse = _batched_fbanks(batches)
        t_ours, t_lhotse = pass_seconds([ours, lhotse], runs)
        t_theirs = f"{seconds / t_lhotse:.0f}" if t_lhotse else "-"
        print(f"  {label:<16} speechpipe {seconds / t_ours:>7.0f}   lhotse {t_theirs:>7}")

    print()
    print("decode next to the features, x real time per core (median [range] over passes):")
    from benchmarks.bench_decode import per_core

    blobs = [_flac(s["audio"]) for s in samples]
    for name, speeds in per_core(blobs, seconds, runs).items():
        print(f"  {name:<32} {statistics.median(speeds):>7.0f} "
              f"[{min(speeds):.0f}, {max(speeds):.0f}]")


def _flac(audio: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    soundfile.write(buffer, audio, RATE, format="FLAC")
    return buffer.getvalue()


if __name__ == "__main__":
    main()
