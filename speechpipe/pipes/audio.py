"""On-the-fly audio processing: resampling, features, perturbation, SpecAugment and CMVN.

Every stage computes the same numbers as the reference implementation it wraps (torchaudio's
functions and transforms, Kaldi's conventions), is seeded from ``(seed, epoch, rank, worker)``
when random, and never mutates its input samples (each yields a shallow copy with the changed
fields).

==========================  ==========================================================  =========
functional name             what it does to a sample                                    random
==========================  ==========================================================  =========
``resample``                ``audio`` to another ``sample_rate``                        no
                            (:func:`torchaudio.functional.resample`, kernel cached)
``perturb_speed``           resample as if recorded at ``rate × factor``: tempo and     yes
                            pitch change by ``factor``; records ``speed``
``perturb_volume``          ``audio × gain``, ``gain ~ U[low, high]``, records ``gain`` yes
``compute_features``        ``feats`` (frames, dim): Kaldi ``fbank``/``mfcc``           dither
                            (:mod:`torchaudio.compliance.kaldi`) or ``mel``
                            (:class:`torchaudio.transforms.MelSpectrogram`); per sample
                            or per collated batch (``batched=True``)
``spec_augment``            time warp, time masks, frequency masks on ``feats``         yes
``apply_cmvn``              global (:class:`CmvnStats`) or per-utterance mean and       no
                            variance normalisation of ``feats``
==========================  ==========================================================  =========

Plain functions hold the algorithms (:func:`resample_audio`, :func:`change_speed`,
:func:`compute_features`, :func:`batch_features`, :func:`num_frames`,
:func:`mel_num_frames`, :func:`spec_augment`, :func:`time_warp`, :func:`normalize_features`,
:func:`compute_cmvn_stats`); the pipes validate their arguments, seed, and delegate.

Order in a training pipeline: ``perturb_speed`` / ``perturb_volume`` / ``resample`` act on
audio and come **before** length bucketing, so that the lengths the batcher sees are the true
ones (speed perturbation changes the number of samples by ``1 / factor``); features next
(:meth:`FeatureComputerIterDataPipe.num_frames` gives the frame count from the number of
samples, before computing); ``spec_augment`` and ``apply_cmvn`` on features. ``speechpipe
cmvn`` (:func:`add_cmvn_command`) computes the global statistics file.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import json
import math
import numbers
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np
import torch
import torchaudio.transforms as taT
from torchaudio.compliance import kaldi

from ..diagnostics import Diagnostics, check_on_error
from ..errors import DataError, MissingDataError
from ..sample import AUDIO, DURATION, FEATS, KEY, SAMPLE_RATE, SOURCE, Sample, len_key
from ..seeding import derive_seed, process_position
from ._base import IterDataPipe, functional_datapipe
from ._state import Seeded, check_seed

__all__ = [
    "CmvnApplier",
    "CmvnApplierIterDataPipe",
    "CmvnStats",
    "FEATURE_KINDS",
    "FeatureComputer",
    "FeatureComputerIterDataPipe",
    "GAIN",
    "KALDI_SCALE",
    "RESAMPLING_METHODS",
    "Resampler",
    "ResamplerIterDataPipe",
    "SPEED",
    "SpecAugmenter",
    "SpecAugmenterIterDataPipe",
    "SpeedPerturber",
    "SpeedPerturberIterDataPipe",
    "VAR_FLOOR",
    "VolumePerturber",
    "VolumePerturberIterDataPipe",
    "add_cmvn_command",
    "batch_features",
    "change_speed",
    "compute_cmvn_stats",
    "compute_features",
    "mel_num_frames",
    "normalize_features",
    "num_frames",
    "resample_audio",
    "spec_augment",
    "time_warp",
]

#: Sample field set by ``perturb_speed``: the speed factor applied (product if applied twice).
SPEED = "speed"
#: Sample field set by ``perturb_volume``: the linear gain applied (product if applied twice).
GAIN = "gain"
#: ``compute_features`` kinds: Kaldi filterbanks and MFCCs, torchaudio mel spectrograms.
FEATURE_KINDS = ("fbank", "mel", "mfcc")
#: Kaldi reads 16-bit samples as integers; soundfile gives [-1, 1]. Scaling by this makes
#: ``fbank``/``mfcc`` (and ``dither``) match Kaldi's ``compute-*-feats`` on 16-bit audio.
KALDI_SCALE = 32768.0
#: Variance floor of CMVN, as Kaldi's ``apply-cmvn`` (and WeNet's global CMVN).
VAR_FLOOR = 1.0e-20
#: ``resampling_method`` values torchaudio accepts.
RESAMPLING_METHODS = ("sinc_interp_hann", "sinc_interp_kaiser")

_MS = 0.001  # torchaudio.compliance.kaldi's MILLISECONDS_TO_SECONDS


# --------------------------------------------------------------------------------------------
# Shared helpers
# --------------------------------------------------------------------------------------------


def _where(sample: Mapping[str, Any]) -> dict:
    source = sample.get(SOURCE, sample.get("audio_path"))
    return {"source": source if isinstance(source, str) else None, "key": sample.get(KEY)}


def _check_sample(sample: Any, stage: str) -> None:
    if not isinstance(sample, Mapping):
        raise TypeError(f"{stage} expects sample dicts, got {type(sample).__name__}")


_FLOAT32 = np.dtype(np.float32)


def _audio_of(sample: Any, stage: str, *, mono: bool = False) -> tuple[np.ndarray, int]:
    """The sample's audio (float32, time first) and its rate; a TypeError for a sample that is
    not a mapping, a DataError for missing or unusable audio.

    A dict with a float32 array and an int rate is recognised by a few type checks and its
    audio returned as it is; anything else goes through :func:`_checked_audio`.
    """
    if type(sample) is dict:
        audio, rate = sample.get(AUDIO), sample.get(SAMPLE_RATE)
        if (type(audio) is np.ndarray and audio.dtype is _FLOAT32 and type(rate) is int
                and rate > 0 and (audio.ndim == 1 or (audio.ndim == 2 and not mono))):
            return audio, rate
    return _checked_audio(sample, stage, mono)


def _checked_audio(sample: Any, stage: str, mono: bool) -> tuple[np.ndarray, int]:
    _check_sample(sample, stage)
    where = _where(sample)
    if AUDIO not in sample:
        raise DataError(f"{stage}: the sample has no {AUDIO!r} field", **where)
    if SAMPLE_RATE not in sample:
        raise DataError(f"{stage}: the sample has no {SAMPLE_RATE!r} field", **where)
    audio, rate = sample[AUDIO], sample[SAMPLE_RATE]
    if isinstance(audio, torch.Tensor):
        audio = audio.detach().cpu().numpy()
    if not isinstance(audio, np.ndarray) or audio.dtype.kind != "f":
        raise DataError(
            f"{stage}: {AUDIO!r} must be a floating-point numpy array, got "
            f"{type(audio).__name__} {getattr(audio, 'dtype', '')}".rstrip(),
            **where,
        )
    if audio.ndim not in (1, 2) or (mono and audio.ndim != 1):
        want = "(samples,) mono audio" if mono else "(samples,) or (samples, channels)"
        raise DataError(f"{stage}: expected {want}, got shape {audio.shape}", **where)
    if isinstance(rate, (bool, np.bool_)) or not isinstance(rate, numbers.Integral) or rate <= 0:
        raise DataError(f"{stage}: {SAMPLE_RATE!r} must be a positive int, got {rate!r}", **where)
    return audio.astype(np.float32, copy=False), int(rate)


def _tensor(array: np.ndarray) -> torch.Tensor:
    """``torch.from_numpy`` (no copy), copying only read-only arrays, on which it warns."""
    return torch.from_numpy(array if array.flags.writeable else array.copy())


def _channels_first(audio: np.ndarray) -> torch.Tensor:
    """``(T,)`` or ``(T, C)`` numpy to a ``(T,)`` or ``(C, T)`` contiguous tensor."""
    return _tensor(np.ascontiguousarray(audio if audio.ndim == 1 else audio.T))


def _time_first(waveform: torch.Tensor) -> np.ndarray:
    out = waveform.numpy()
    return out if out.ndim == 1 else np.ascontiguousarray(out.T)


def _torch_generator(seed: int, epoch: int, salt: str) -> torch.Generator:
    where = process_position()
    return torch.Generator().manual_seed(derive_seed(seed, epoch, where.rank, where.worker, salt))


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    return int(value)


def _check_real(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise TypeError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def _source_len(pipe: Any) -> int:
    return len(pipe.source_datapipe)


# --------------------------------------------------------------------------------------------
# Resampling
# --------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=32)
def _resampler(
    orig: int,
    new: int,
    *,
    lowpass_filter_width: int = 6,
    rolloff: float = 0.99,
    resampling_method: str = "sinc_interp_hann",
    beta: float | None = None,
) -> taT.Resample:
    # dtype=float32: the kernel is then built exactly as torchaudio.functional.resample builds
    # it for float32 audio (the transform's default builds it in float64 and rounds, which
    # differs in the last bits).
    return taT.Resample(orig, new, resampling_method, lowpass_filter_width, rolloff, beta,
                        dtype=torch.float32)


def resample_audio(
    audio: np.ndarray,
    orig_rate: int,
    new_rate: int,
    *,
    lowpass_filter_width: int = 6,
    rolloff: float = 0.99,
    resampling_method: str = "sinc_interp_hann",
    beta: float | None = None,
) -> np.ndarray:
    """Resample time-first float32 audio; the numbers of :func:`torchaudio.functional.resample`.

    The kernel for each ``(orig_rate, new_rate, options)`` is built once per process and
    cached (:class:`torchaudio.transforms.Resample`). Equal rates return ``audio`` itself.
    The output has ``ceil(len(audio) * new_rate / orig_rate)`` samples.

    >>> out = resample_audio(np.ones(1600, np.float32), 16000, 8000)
    >>> out.shape, out.dtype
    ((800,), dtype('float32'))
    """
    if orig_rate == new_rate:
        return audio
    transform = _resampler(int(orig_rate), int(new_rate),
                           lowpass_filter_width=lowpass_filter_width, rolloff=float(rolloff),
                           resampling_method=resampling_method, beta=beta)
    return _time_first(transform(_channels_first(audio)))


def _check_resample_options(lowpass_filter_width, rolloff, resampling_method, beta) -> None:
    _check_int("lowpass_filter_width", lowpass_filter_width, 1)
    rolloff = _check_real("rolloff", rolloff)
    if not 0.0 < rolloff <= 1.0:
        raise ValueError(f"rolloff must be in (0, 1], got {rolloff!r}")
    if resampling_method not in RESAMPLING_METHODS:
        raise ValueError(f"resampling_method must be one of {RESAMPLING_METHODS}, "
                         f"got {resampling_method!r}")
    if beta is not None:
        if _check_real("beta", beta) <= 0:
            raise ValueError(f"beta must be > 0 or None, got {beta!r}")


@functional_datapipe("resample")
class ResamplerIterDataPipe(IterDataPipe[Sample]):
    """Resample each sample's audio to one rate (functional name: ``resample``).

    Consumes samples with ``audio`` (``(samples,)`` or ``(samples, channels)`` float32) and
    ``sample_rate``; yields them with ``audio`` resampled by
    :func:`torchaudio.functional.resample` (same numbers; kernels cached per rate pair) and
    ``sample_rate`` set to ``rate``. A sample already at ``rate`` passes through unchanged.
    Other fields (``duration`` included) are kept.

    Args:
        source_datapipe: samples.
        rate: target sample rate in Hz.
        lowpass_filter_width: sharpness of the anti-aliasing filter (torchaudio's option).
        rolloff: cutoff as a fraction of the lower Nyquist frequency (torchaudio's option).
        resampling_method: ``"sinc_interp_hann"`` or ``"sinc_interp_kaiser"``.
        beta: Kaiser window shape (only with ``"sinc_interp_kaiser"``).

    Errors: a sample without ``audio`` or ``sample_rate``, or with a non-float array, raises
    :class:`~speechpipe.errors.DataError` naming its key.

    >>> from speechpipe.pipes._base import IterableWrapper
    >>> pipe = IterableWrapper([{"key": "u1", "audio": np.zeros(1600, np.float32),
    ...                          "sample_rate": 16000}]).resample(8000)
    >>> [(s["audio"].shape, s["sample_rate"]) for s in pipe]
    [((800,), 8000)]
    """

    def __init__(
        self,
        source_datapipe: IterDataPipe,
        rate: int,
        *,
        lowpass_filter_width: int = 6,
        rolloff: float = 0.99,
        resampling_method: str = "sinc_interp_hann",
        beta: float | None = None,
    ) -> None:
        self.rate = _check_int("rate", rate, 1)
        _check_resample_options(lowpass_filter_width, rolloff, resampling_method, beta)
        self.source_datapipe = source_datapipe
        self.options = {"lowpass_filter_width": int(lowpass_filter_width),
                        "rolloff": float(rolloff), "resampling_method": resampling_method,
                        "beta": None if beta is None else float(beta)}

    def __iter__(self) -> Iterator[Sample]:
        kernels: dict[int, taT.Resample] = {}  # by source rate
        for sample in self.source_datapipe:
            audio, rate = _audio_of(sample, "resample")
            if rate == self.rate:
                yield sample
                continue
            kernel = kernels.get(rate)
            if kernel is None:
                kernel = kernels[rate] = _resampler(rate, self.rate, **self.options)
            out = dict(sample)
            out[AUDIO] = _time_first(kernel(_channels_first(audio)))
            out[SAMPLE_RATE] = self.rate
            yield out

    def __len__(self) -> int:
        return _source_len(self)


Resampler = ResamplerIterDataPipe


# --------------------------------------------------------------------------------------------
# Speed and volume perturbation
# --------------------------------------------------------------------------------------------


def change_speed(audio: np.ndarray, sample_rate: int, factor: float) -> np.ndarray:
    """Play ``audio`` ``factor`` times faster: tempo and pitch change, duration ``/ factor``.

    As Kaldi's ``sox speed`` perturbation (used by ESPnet and WeNet): the audio is taken as
    recorded at ``round(sample_rate * factor)`` Hz and resampled to ``sample_rate``; the
    output has ``ceil(len(audio) * sample_rate / round(sample_rate * factor))`` samples. The
    numbers are those of :func:`torchaudio.functional.speed` whenever ``sample_rate * factor``
    is a whole number in floating point (0.9, 1.1 at 16 kHz...); torchaudio truncates it with
    ``int()``, so that a 1-ulp error (``0.7 * 22050 == 15434.999999999998``) gives 15434 Hz,
    which shares only a factor 2 with 22050: a 11025 × 7700 kernel instead of 10 × 7, and a
    slightly wrong factor. Rounding avoids both. A factor of 1 returns ``audio`` itself.

    >>> change_speed(np.ones(16000, np.float32), 16000, 1.25).shape
    (12800,)
    """
    kernel = _speed_kernel(int(sample_rate), factor)
    return audio if kernel is None else _time_first(kernel(_channels_first(audio)))


def _speed_kernel(sample_rate: int, factor: float) -> taT.Resample | None:
    """The resampler of :func:`change_speed` (``None`` when the rate does not change)."""
    source = int(round(sample_rate * factor))
    if source <= 0:
        raise ValueError(f"factor {factor!r} gives a non-positive rate at {sample_rate} Hz")
    if source == sample_rate:
        return None
    gcd = math.gcd(source, sample_rate)
    return _resampler(source // gcd, sample_rate // gcd)


def _check_factors(factors: Any) -> tuple[float, ...]:
    if isinstance(factors, (str, bytes)) or not isinstance(factors, Iterable):
        raise TypeError(f"factors must be a sequence of numbers, got {factors!r}")
    out = tuple(_check_real("factors", f) for f in factors)
    if not out:
        raise ValueError("factors must not be empty")
    bad = [f for f in out if f <= 0]
    if bad:
        raise ValueError(f"factors must be > 0, got {bad[0]!r}")
    return out


@functional_datapipe("perturb_speed")
class SpeedPerturberIterDataPipe(Seeded, IterDataPipe[Sample]):
    """Speed perturbation, a factor drawn per sample (functional name: ``perturb_speed``).

    Consumes samples with ``audio`` and ``sample_rate``; yields them with ``audio`` played
    ``factor`` times faster by :func:`change_speed` (resampling from ``rate × factor`` to
    ``rate``, as Kaldi, ESPnet and WeNet do: tempo **and** pitch change), ``speed`` set to the
    factor (multiplied with an earlier one) and, when present, ``duration`` set to the new
    length in seconds. The factor is drawn uniformly from ``factors`` with a
    ``random.Random`` seeded by ``(seed, epoch, rank, worker)``; ``set_epoch`` changes the
    draws. Put it **before** length bucketing, so that batches are built on the perturbed
    lengths (a ``num_frames`` field read from an index is not updated).

    Args:
        source_datapipe: samples.
        factors: speed factors to draw from (``1.0`` leaves the audio untouched).
        seed: base seed.

    >>> from speechpipe.pipes._base import IterableWrapper
    >>> rows = [{"key": "u1", "audio": np.zeros(16000, np.float32), "sample_rate": 16000}]
    >>> [s] = IterableWrapper(rows).perturb_speed(factors=(1.25,))
    >>> s["audio"].shape, s["speed"]
    ((12800,), 1.25)
    """

    def __init__(
        self,
        source_datapipe: IterDataPipe,
        factors: Sequence[float] = (0.9, 1.0, 1.1),
        *,
        seed: int = 0,
    ) -> None:
        self.factors = _check_factors(factors)
        self.seed = check_seed(seed)
        self.epoch = 0
        self.source_datapipe = source_datapipe

    def __iter__(self) -> Iterator[Sample]:
        choice, factors = self._rng("perturb_speed").choice, self.factors
        kernels: dict[tuple[int, float], taT.Resample | None] = {}  # by (rate, factor)
        for sample in self.source_datapipe:
            audio, rate = _audio_of(sample, "perturb_speed")
            factor = choice(factors)
            try:
                kernel = kernels[rate, factor]
            except KeyError:
                kernel = kernels[rate, factor] = _speed_kernel(rate, factor)
            out = dict(sample)
            out[AUDIO] = audio if kernel is None else _time_first(kernel(_channels_first(audio)))
            previous = out.get(SPEED)
            out[SPEED] = factor if previous is None else float(previous) * factor
            if DURATION in out:
                out[DURATION] = out[AUDIO].shape[0] / rate
            yield out

    def __len__(self) -> int:
        return _source_len(self)


SpeedPerturber = SpeedPerturberIterDataPipe


@functional_datapipe("perturb_volume")
class VolumePerturberIterDataPipe(Seeded, IterDataPipe[Sample]):
    """Volume perturbation, a linear gain drawn per sample (functional name: ``perturb_volume``).

    Consumes samples with ``audio``; yields them with ``audio × gain`` (float32; no clipping:
    a gain above 1 may take peaks beyond [-1, 1], which features do not mind) and ``gain`` set
    to the gain (multiplied with an earlier one). The gain is **linear**, drawn from
    ``U[low, high]`` (as lhotse's and ESPnet's volume perturbation) with a ``random.Random``
    seeded by ``(seed, epoch, rank, worker)``. For a gain in decibels, ``gain = 10 **
    (dB / 20)``: ``low=0.5, high=2.0`` is about ±6 dB. Lengths do not change.

    Args:
        source_datapipe: samples.
        low: smallest gain (> 0).
        high: largest gain (>= low).
        seed: base seed.

    >>> from speechpipe.pipes._base import IterableWrapper
    >>> rows = [{"key": "u1", "audio": np.ones(4, np.float32), "sample_rate": 16000}]
    >>> [s] = IterableWrapper(rows).perturb_volume(low=0.5, high=0.5)
    >>> s["audio"], s["gain"]
    (array([0.5, 0.5, 0.5, 0.5], dtype=float32), 0.5)
    """

    def __init__(
        self,
        source_datapipe: IterDataPipe,
        low: float = 0.8,
        high: float = 1.2,
        *,
        seed: int = 0,
    ) -> None:
        low, high = _check_real("low", low), _check_real("high", high)
        if low <= 0:
            raise ValueError(f"low must be > 0, got {low!r}")
        if high < low:
            raise ValueError(f"high must be >= low ({low!r}), got {high!r}")
        self.low, self.high = low, high
        self.seed = check_seed(seed)
        self.epoch = 0
        self.source_datapipe = source_datapipe

    def __iter__(self) -> Iterator[Sample]:
        draw = self._rng("perturb_volume").random
        low, span, float32 = self.low, self.high - self.low, np.float32
        for sample in self.source_datapipe:
            audio, _ = _audio_of(sample, "perturb_volume")
            gain = low + span * draw()  # random.Random.uniform(low, high), inlined
            out = dict(sample)
            out[AUDIO] = audio * float32(gain)
            previous = out.get(GAIN)
            out[GAIN] = gain if previous is None else float(previous) * gain
            yield out

    def __len__(self) -> int:
        return _source_len(self)


VolumePerturber = VolumePerturberIterDataPipe


# --------------------------------------------------------------------------------------------
# Features
# --------------------------------------------------------------------------------------------


def num_frames(
    num_samples: int,
    frame_length_ms: float = 25.0,
    frame_shift_ms: float = 10.0,
    sample_rate: int = 16000,
    snip_edges: bool = True,
) -> int:
    """Frames Kaldi's ``fbank``/``mfcc`` give for ``num_samples`` samples (exact).

    Window and shift in samples are ``int(sample_rate × ms × 0.001)`` as in
    :mod:`torchaudio.compliance.kaldi`. With ``snip_edges`` only whole windows count:
    ``1 + (n - window) // shift`` (0 when ``n < window``); without, ``(n + shift // 2) //
    shift``. (Kaldi's functions refuse audio shorter than one window either way.)

    >>> num_frames(16000), num_frames(16000, snip_edges=False), num_frames(399)
    (98, 100, 0)
    """
    shift = int(sample_rate * frame_shift_ms * _MS)
    size = int(sample_rate * frame_length_ms * _MS)
    if shift <= 0 or size <= 0:
        raise ValueError(f"frame_length_ms={frame_length_ms}, frame_shift_ms={frame_shift_ms} "
                         f"give an empty window or shift at {sample_rate} Hz")
    if snip_edges:
        return 0 if num_samples < size else 1 + (num_samples - size) // shift
    return (num_samples + shift // 2) // shift


def mel_num_frames(
    num_samples: int,
    n_fft: int = 400,
    hop_length: int | None = None,
    *,
    win_length: int | None = None,
    center: bool = True,
    pad: int = 0,
) -> int:
    """Frames :class:`torchaudio.transforms.MelSpectrogram` gives for ``num_samples`` (exact).

    ``hop_length`` defaults to ``win_length // 2`` and ``win_length`` to ``n_fft``, as in
    torchaudio. With ``center`` the signal is padded by ``n_fft // 2`` on both sides first.

    >>> mel_num_frames(16000, n_fft=512, hop_length=160)
    101
    >>> mel_num_frames(16000, 400, 160, center=False)
    98
    """
    if hop_length is None:
        hop_length = (win_length if win_length is not None else n_fft) // 2
    n = num_samples + 2 * pad + (2 * (n_fft // 2) if center else 0)
    return 0 if n < n_fft else 1 + (n - n_fft) // hop_length


def _parameters(fn: Callable) -> dict[str, inspect.Parameter]:
    return dict(inspect.signature(fn).parameters)


_KALDI_FIXED = ("waveform", "sample_frequency", "dither", "channel", "min_duration")
_MEL_FIXED = ("self", "sample_rate", "onesided")
_MEL_OURS = {"log": False, "log_floor": 1e-10}


def _allowed_options(kind: str) -> dict[str, Any]:
    """Option name -> default for a kind (torchaudio's defaults)."""
    if kind == "mel":
        params = _parameters(taT.MelSpectrogram.__init__)
        allowed = {n: p.default for n, p in params.items() if n not in _MEL_FIXED}
        return {**allowed, **_MEL_OURS}
    fn = kaldi.fbank if kind == "fbank" else kaldi.mfcc
    return {n: p.default for n, p in _parameters(fn).items() if n not in _KALDI_FIXED}


def _freeze(options: Mapping[str, Any]) -> tuple:
    return tuple(sorted((k, tuple(sorted(v.items())) if isinstance(v, dict) else v)
                        for k, v in options.items()))


@functools.lru_cache(maxsize=16)
def _mel_transform(rate: int, frozen: tuple) -> taT.MelSpectrogram:
    options = {k: dict(v) if k == "wkwargs" and v is not None else v for k, v in frozen}
    return taT.MelSpectrogram(sample_rate=rate, **options)


class _Extractor:
    """One feature configuration: kind, scale and the reference function's options."""

    def __init__(self, kind: str, scale: float | None, options: Mapping[str, Any]) -> None:
        if kind not in FEATURE_KINDS:
            raise ValueError(f"kind must be one of {FEATURE_KINDS}, got {kind!r}")
        allowed = _allowed_options(kind)
        for name in options:
            if name == "dither":
                raise TypeError("give dither= to compute_features itself (it is seeded), not "
                                "as a torchaudio option")
            if name in ("sample_frequency", "sample_rate"):
                raise TypeError(f"{name} is read from each sample's 'sample_rate'; do not pass it")
            if name == "min_duration" and kind != "mel":
                raise TypeError("min_duration would return empty features; drop short "
                                "utterances with torch's filter before compute_features")
            if name not in allowed:
                raise TypeError(f"unknown {kind} option {name!r}; {kind} takes "
                                f"{sorted(allowed)}")
        if kind == "mel":
            for name in ("log",):
                if name in options and not isinstance(options[name], bool):
                    raise TypeError(f"{name} must be a bool, got {options[name]!r}")
            if "log_floor" in options and not _check_real("log_floor", options["log_floor"]) > 0:
                raise ValueError(f"log_floor must be > 0, got {options['log_floor']!r}")
        if scale is None:
            scale = 1.0 if kind == "mel" else KALDI_SCALE
        if _check_real("scale", scale) <= 0:
            raise ValueError(f"scale must be > 0, got {scale!r}")
        self.kind = kind
        self.scale = float(scale)
        self.options = dict(options)
        if kind == "mel":
            merged = {**allowed, **self.options}
            self.log = bool(merged.pop("log"))
            self.log_floor = float(merged.pop("log_floor"))
            self.mel_options = {k: v for k, v in self.options.items() if k not in _MEL_OURS}
            self._frozen = _freeze(self.mel_options)
            self.n_fft = int(merged["n_fft"])
            self.win_length = merged["win_length"]
            self.hop_length = merged["hop_length"]
            if self.hop_length is None:
                self.hop_length = (self.win_length or self.n_fft) // 2
            self.center = bool(merged["center"])
            self.pad = int(merged["pad"])
            self.pad_mode = merged["pad_mode"]
        else:
            merged = {**allowed, **self.options}
            self.frame_length = float(merged["frame_length"])
            self.frame_shift = float(merged["frame_shift"])
            self.snip_edges = bool(merged["snip_edges"])
        self._kaldi = {"fbank": kaldi.fbank, "mfcc": kaldi.mfcc}.get(kind)
        self._mels: dict[int, taT.MelSpectrogram] = {}  # by sample rate
        self.dim = self._dry_run()

    def _dry_run(self) -> int:
        """Run the reference once on silence at 16 kHz: bad option values fail here, in the
        constructor, rather than at the first sample; also gives the feature dimension."""
        rate = 16000
        n = max(rate, 4 * self.min_samples(rate), 2 * self.n_fft if self.kind == "mel" else 0)
        try:
            out = self(torch.zeros(n), rate)
        except Exception as exc:  # torchaudio checks options with assert / Exception
            raise ValueError(f"compute_features(kind={self.kind!r}) options {self.options} "
                             f"are rejected by torchaudio: {type(exc).__name__}: {exc}") from exc
        return int(out.shape[1])

    def min_samples(self, rate: int) -> int:
        """Fewest samples the reference accepts (shorter audio raises in torchaudio)."""
        if self.kind == "mel":
            if not self.center:
                return max(1, self.n_fft - 2 * self.pad)
            if self.pad_mode == "reflect":
                return max(1, self.n_fft // 2 + 1 - 2 * self.pad)
            return 1
        return max(2, int(rate * self.frame_length * _MS))

    def num_frames(self, num_samples: int, rate: int) -> int:
        if self.kind == "mel":
            return mel_num_frames(num_samples, self.n_fft, self.hop_length, center=self.center,
                                  pad=self.pad)
        return num_frames(num_samples, self.frame_length, self.frame_shift, rate, self.snip_edges)

    def __call__(self, waveform: torch.Tensor, rate: int) -> torch.Tensor:
        """``(n,)`` float32 waveform (already scaled and dithered) -> ``(frames, dim)``."""
        if self.kind == "mel":
            transform = self._mels.get(rate)
            if transform is None:
                transform = self._mels[rate] = _mel_transform(rate, self._frozen)
            spec = transform(waveform)
            if self.log:
                spec = spec.clamp(min=self.log_floor).log()
            return spec.transpose(0, 1)
        return self._kaldi(waveform.unsqueeze(0), sample_frequency=float(rate), dither=0.0,
                           **self.options)


@functools.lru_cache(maxsize=16)
def _cached_extractor(kind: str, scale: float | None, frozen: tuple) -> _Extractor:
    options = {k: dict(v) if k == "wkwargs" and v is not None else v for k, v in frozen}
    return _Extractor(kind, scale, options)


def _extractor(kind: str, scale: float | None, options: Mapping[str, Any]) -> _Extractor:
    try:
        return _cached_extractor(kind, scale, _freeze(options))
    except TypeError as exc:
        if "unhashable" not in str(exc):
            raise
        return _Extractor(kind, scale, options)


def _prepare(
    audio: np.ndarray | torch.Tensor,
    extractor: _Extractor,
    dither: float,
    generator: torch.Generator | None,
) -> torch.Tensor:
    waveform = audio if isinstance(audio, torch.Tensor) else _tensor(audio)
    waveform = waveform * extractor.scale if extractor.scale != 1.0 else waveform
    if dither != 0.0:
        noise = torch.randn(waveform.shape[0], generator=generator, dtype=waveform.dtype)
        waveform = waveform + noise * dither
    return waveform


def _extract_one(
    audio: np.ndarray,
    rate: int,
    extractor: _Extractor,
    dither: float,
    generator: torch.Generator | None,
    sample: Mapping[str, Any],
) -> np.ndarray:
    """Features of one waveform; errors name ``sample``'s key and source."""
    n = audio.shape[0]
    least = extractor.min_samples(rate)
    if n < least:
        raise DataError(f"compute_features: audio of {n} samples is shorter than one "
                        f"{extractor.kind} frame ({least} samples at {rate} Hz)",
                        **_where(sample))
    waveform = _prepare(audio, extractor, dither, generator)
    try:
        feats = extractor(waveform, rate)
    except Exception as exc:  # torchaudio validates with assert / Exception
        raise DataError(f"compute_features: torchaudio's {extractor.kind} failed at {rate} Hz: "
                        f"{type(exc).__name__}: {exc}", **_where(sample)) from exc
    return np.ascontiguousarray(feats.numpy(), dtype=np.float32)


def compute_features(
    audio: np.ndarray,
    sample_rate: int,
    kind: str = "fbank",
    *,
    dither: float = 0.0,
    generator: torch.Generator | None = None,
    scale: float | None = None,
    **options: Any,
) -> np.ndarray:
    """Features of one mono waveform: ``(frames, dim)`` float32.

    ``kind="fbank"``/``"mfcc"`` call :func:`torchaudio.compliance.kaldi.fbank`/``mfcc`` with
    ``options`` (their names and defaults: ``num_mel_bins``, ``frame_length``,
    ``frame_shift``, ``energy_floor``, ``snip_edges``, ``num_ceps``...); ``kind="mel"``
    runs :class:`torchaudio.transforms.MelSpectrogram` with ``options`` (``n_fft``,
    ``win_length``, ``hop_length``, ``n_mels``, ``f_min``, ``center``...) plus ``log``
    (``clamp(min=log_floor).log()``, as ESPnet's log-mel) and ``log_floor`` (1e-10), and
    transposes to ``(frames, n_mels)``. The sample rate is passed to them from
    ``sample_rate``.

    The waveform given to the reference is ``audio × scale + dither × N(0, 1)``: ``scale``
    defaults to :data:`KALDI_SCALE` (32768) for ``fbank``/``mfcc`` -- Kaldi's 16-bit
    integer range, so that the features (and ``dither``, in 16-bit steps) are those of Kaldi's
    ``compute-fbank-feats`` and WeNet; ``scale=1.0`` gives icefall/lhotse-style features,
    which differ by ``2 ln 32768 ≈ 20.79`` in each log-mel bin -- and to 1.0 for ``mel``.
    Dither noise is drawn per sample of the waveform from ``generator`` (seeded, not torch's
    global generator), so overlapping frames share it; Kaldi draws it per frame. Each frame's
    noise has the same variance; with ``dither=0`` the output is the reference's, bit for bit.

    >>> feats = compute_features(np.zeros(16000, np.float32), 16000, num_mel_bins=80)
    >>> feats.shape, feats.dtype
    ((98, 80), dtype('float32'))
    """
    audio = np.ascontiguousarray(audio, dtype=np.float32)
    if audio.ndim != 1:
        raise ValueError(f"compute_features needs (samples,) mono audio, got shape {audio.shape}")
    extractor = _extractor(kind, scale, options)
    return _extract_one(audio, int(sample_rate), extractor, float(dither), generator, {})


def _batch_rate(batch: Mapping[str, Any]) -> int:
    if SAMPLE_RATE not in batch:
        raise DataError(f"compute_features(batched=True): the batch has no {SAMPLE_RATE!r} "
                        "field", **_batch_where(batch))
    rates = batch[SAMPLE_RATE]
    values = (rates.tolist() if isinstance(rates, (torch.Tensor, np.ndarray))
              else list(rates) if isinstance(rates, (list, tuple)) else [rates])
    values = values if isinstance(values, list) else [values]
    distinct = sorted(set(int(v) for v in values))
    if len(distinct) != 1:
        raise DataError(f"compute_features(batched=True): the batch mixes sample rates "
                        f"{distinct}; resample before batching", **_batch_where(batch))
    return distinct[0]


def _batch_where(batch: Mapping[str, Any], i: int | None = None) -> dict:
    keys = batch.get(KEY)
    if isinstance(keys, (list, tuple)) and keys:
        return {"key": keys[i] if i is not None else keys[0]}
    return {}


def batch_features(
    batch: Mapping[str, Any],
    kind: str = "fbank",
    *,
    dither: float = 0.0,
    generator: torch.Generator | None = None,
    scale: float | None = None,
    **options: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Features of a collated batch: ``(feats (B, T', D) float32, feats_len (B,) int64)``.

    ``batch`` is what :class:`~speechpipe.pipes.collate.PadCollate` makes of samples with
    audio: ``audio`` ``(B, T)``, ``audio_len`` ``(B,)`` and ``sample_rate`` (one rate).
    ``kind``, ``dither``, ``generator``, ``scale`` and ``options`` are those of
    :func:`compute_features`. Row ``i`` holds exactly the features of its first
    ``audio_len[i]`` samples, then zeros up to ``T' = max(feats_len)``; ``feats_len`` is the
    exact frame count of each length. The reference runs once per row, on the row's real
    samples: Kaldi's functions take one utterance, and one ``MelSpectrogram`` call on the
    whole ``(B, T)`` tensor, which torchaudio allows, measured 1.0-1.06× (rows of similar
    length) to 1.6-1.8× (random order) slower per real second than the loop on one CPU thread
    (``benchmarks/bench_audio.py``: it also computes the padding, and the batch's spectra
    outgrow the cache), and would differ from the per-sample frames near each row's end (zero
    padding instead of reflection). Dither noise is drawn row by row, as the samples would
    draw it one by one.

    >>> batch = {"audio": torch.zeros(2, 16000), "audio_len": torch.tensor([16000, 8000]),
    ...          "sample_rate": torch.tensor([16000, 16000])}
    >>> feats, lengths = batch_features(batch, num_mel_bins=80)
    >>> tuple(feats.shape), lengths.tolist()
    ((2, 98, 80), [98, 48])
    """
    extractor = _extractor(kind, scale, options)
    return _batch_features(batch, extractor, float(dither), generator)


def _batch_features(
    batch: Mapping[str, Any],
    extractor: _Extractor,
    dither: float,
    generator: torch.Generator | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    audio, lengths = batch.get(AUDIO), batch.get(len_key(AUDIO))
    if audio is None or lengths is None:
        raise DataError(f"compute_features(batched=True): the batch needs {AUDIO!r} and "
                        f"{len_key(AUDIO)!r} (from PadCollate), got {sorted(batch)}",
                        **_batch_where(batch))
    audio = torch.as_tensor(audio)
    if audio.ndim != 2 or not audio.is_floating_point():
        raise DataError(f"compute_features(batched=True): {AUDIO!r} must be a float (batch, "
                        f"samples) tensor, got {tuple(audio.shape)} {audio.dtype}",
                        **_batch_where(batch))
    audio = audio.to(torch.float32)
    lengths = [int(n) for n in torch.as_tensor(lengths).tolist()]
    rate = _batch_rate(batch)
    least = extractor.min_samples(rate)
    for i, n in enumerate(lengths):
        if n > audio.shape[1]:
            raise DataError(f"compute_features(batched=True): {len_key(AUDIO)!r} {n} exceeds "
                            f"the {audio.shape[1]} padded samples", **_batch_where(batch, i))
        if n < least:
            raise DataError(f"compute_features: audio of {n} samples is shorter than one "
                            f"{extractor.kind} frame ({least} samples at {rate} Hz)",
                            **_batch_where(batch, i))
    rows = [_prepare(audio[i, :n], extractor, dither, generator) for i, n in enumerate(lengths)]
    frames = [extractor.num_frames(n, rate) for n in lengths]
    feats = torch.zeros(len(rows), max(frames), extractor.dim)
    for i, row in enumerate(rows):
        try:
            one = extractor(row, rate)
        except Exception as exc:  # torchaudio validates with assert / Exception
            raise DataError(f"compute_features: torchaudio's {extractor.kind} failed at {rate} "
                            f"Hz: {type(exc).__name__}: {exc}", **_batch_where(batch, i)) from exc
        feats[i, : one.shape[0]] = one
    return feats, torch.tensor(frames, dtype=torch.int64)


@functional_datapipe("compute_features")
class FeatureComputerIterDataPipe(Seeded, IterDataPipe[Sample]):
    """Kaldi fbank / MFCC or mel spectrogram features (functional name: ``compute_features``).

    Consumes samples with mono ``audio`` ``(samples,)`` and ``sample_rate``; yields them with
    ``feats`` ``(frames, dim)`` float32 computed by :func:`compute_features` -- exactly the
    numbers of :func:`torchaudio.compliance.kaldi.fbank` / ``mfcc`` or
    :class:`torchaudio.transforms.MelSpectrogram` on ``audio × scale`` (plus dither). With
    ``batched=True`` it consumes collated batches (``PadCollate``: ``audio`` ``(B, T)``,
    ``audio_len``, ``sample_rate``) and adds ``feats`` ``(B, T', D)`` and ``feats_len``
    (:func:`batch_features`).

    One pipe for the three kinds, not three verbs: they share input, output, dither, seeding,
    frame counting, batching and error handling; only the reference function differs, and its
    options are passed through unchanged (an unknown option is a ``TypeError`` naming the
    allowed ones; bad values fail in the constructor, which runs the reference once on
    silence).

    Args:
        source_datapipe: samples (or batches with ``batched=True``).
        kind: ``"fbank"``, ``"mfcc"`` (Kaldi, :mod:`torchaudio.compliance.kaldi`) or ``"mel"``
            (:class:`torchaudio.transforms.MelSpectrogram`, plus ``log``/``log_floor``).
        dither: standard deviation of Gaussian noise added to the scaled waveform (0: none,
            exact reference output). Seeded by ``(seed, epoch, rank, worker)`` through a
            ``torch.Generator``, never torch's global generator; see :func:`compute_features`.
        seed: base seed of the dither.
        scale: waveform scale before the reference (default 32768 for ``fbank``/``mfcc``,
            Kaldi's 16-bit range; 1.0 for ``mel``).
        batched: consume collated batches instead of samples.
        keep_audio: keep ``audio`` (and ``audio_len``) in the output; ``False`` drops it to
            save memory in later buffers.
        on_error: ``"raise"`` a :class:`~speechpipe.errors.DataError` naming the key for audio
            shorter than one frame (or that torchaudio refuses), or ``"skip"`` the sample (the
            whole batch with ``batched=True``), count it in :attr:`diagnostics` and warn at
            the end of the pass.
        **options: the reference function's options (``num_mel_bins=80``,
            ``frame_length=25.0``, ``frame_shift=10.0``, ``energy_floor``, ``snip_edges``,
            ``num_ceps``, ``n_fft``, ``hop_length``, ``n_mels``...).

    :meth:`num_frames` gives the exact number of frames for a number of samples, so that a
    length-aware batcher can be told frame lengths before features exist.

    >>> from speechpipe.pipes._base import IterableWrapper
    >>> rows = [{"key": "u1", "audio": np.zeros(16000, np.float32), "sample_rate": 16000}]
    >>> pipe = IterableWrapper(rows).compute_features("fbank", num_mel_bins=80)
    >>> [s["feats"].shape for s in pipe], pipe.num_frames(16000, 16000)
    ([(98, 80)], 98)
    """

    def __init__(
        self,
        source_datapipe: IterDataPipe,
        kind: str = "fbank",
        *,
        dither: float = 0.0,
        seed: int = 0,
        scale: float | None = None,
        batched: bool = False,
        keep_audio: bool = True,
        on_error: str = "raise",
        **options: Any,
    ) -> None:
        dither = _check_real("dither", dither)
        if dither < 0:
            raise ValueError(f"dither must be >= 0, got {dither!r}")
        for name, value in (("batched", batched), ("keep_audio", keep_audio)):
            if not isinstance(value, bool):
                raise TypeError(f"{name} must be a bool, got {value!r}")
        self.extractor = _Extractor(kind, scale, options)
        self.kind = kind
        self.dither = dither
        self.seed = check_seed(seed)
        self.epoch = 0
        self.batched = batched
        self.keep_audio = keep_audio
        self.on_error = check_on_error(on_error)
        self.diagnostics = Diagnostics("compute_features")
        self.source_datapipe = source_datapipe

    @property
    def dim(self) -> int:
        """Feature dimension (columns of ``feats``)."""
        return self.extractor.dim

    def num_frames(self, num_samples: int, sample_rate: int) -> int:
        """Frames this configuration gives for ``num_samples`` samples at ``sample_rate``."""
        return self.extractor.num_frames(int(num_samples), int(sample_rate))

    def __iter__(self) -> Iterator[Sample]:
        self.diagnostics.reset()
        generator = (_torch_generator(self.seed, self.epoch, "compute_features")
                     if self.dither else None)
        for item in self.source_datapipe:
            try:
                out = self._batch(item, generator) if self.batched else self._one(item, generator)
            except DataError as err:
                self.diagnostics.handle(self.on_error, err, _skip_reason(err))
                continue
            yield out
        self.diagnostics.warn_if_skipped()

    def _one(self, sample: Mapping[str, Any], generator) -> Sample:
        audio, rate = _audio_of(sample, "compute_features", mono=True)
        feats = _extract_one(audio, rate, self.extractor, self.dither, generator, sample)
        out = dict(sample)
        out[FEATS] = feats
        if not self.keep_audio:
            del out[AUDIO]
        return out

    def _batch(self, batch: Mapping[str, Any], generator) -> dict:
        _check_sample(batch, "compute_features")
        feats, lengths = _batch_features(batch, self.extractor, self.dither, generator)
        out = dict(batch)
        if not self.keep_audio:
            out.pop(AUDIO, None)
            out.pop(len_key(AUDIO), None)
        out[FEATS] = feats
        out[len_key(FEATS)] = lengths
        return out

    def __len__(self) -> int:
        if self.on_error != "raise":
            raise TypeError(f"compute_features(on_error={self.on_error!r}) has no len(): "
                            "skipped samples are known only after computing; use "
                            "on_error='raise' for a length")
        return _source_len(self)


FeatureComputer = FeatureComputerIterDataPipe


def _skip_reason(error: DataError) -> str:
    if "shorter than one" in error.reason:
        return "audio shorter than a frame"
    if "torchaudio" in error.reason:
        return "audio refused by torchaudio"
    return "sample without usable audio"


# --------------------------------------------------------------------------------------------
# SpecAugment
# --------------------------------------------------------------------------------------------


def time_warp(
    feats: torch.Tensor, window: int, generator: torch.Generator | None = None,
    mode: str = "bicubic",
) -> torch.Tensor:
    """SpecAugment's time warp on ``(frames, dim)`` features, as ESPnet's ``time_warp``.

    A centre ``c ~ U{window, …, frames - window - 1}`` and a destination
    ``w ~ U{c - window + 1, …, c + window}`` are drawn from ``generator``; frames ``[0, c)``
    are resized to ``w`` frames and ``[c, frames)`` to ``frames - w`` with
    :func:`torch.nn.functional.interpolate` (``mode``, ``align_corners=False``). The shape is
    kept. Features with ``frames <= 2 × window`` are returned unchanged (no draw).

    >>> g = torch.Generator().manual_seed(0)
    >>> time_warp(torch.arange(40.0).reshape(20, 2), 5, g).shape
    torch.Size([20, 2])
    """
    frames = feats.shape[0]
    if window < 1 or frames - window <= window:
        return feats
    center = int(torch.randint(window, frames - window, (1,), generator=generator)[0])
    warped = int(torch.randint(center - window, center + window, (1,), generator=generator)[0]) + 1
    x = feats[None, None]
    size = feats.shape[1]
    left = torch.nn.functional.interpolate(x[:, :, :center], (warped, size), mode=mode,
                                           align_corners=False)
    right = torch.nn.functional.interpolate(x[:, :, center:], (frames - warped, size), mode=mode,
                                            align_corners=False)
    return torch.cat([left, right], dim=2)[0, 0]


def _mask(x: torch.Tensor, axis: int, mask_param: int, value, generator) -> None:
    # torchaudio.functional.mask_along_axis, draw for draw, with a given generator:
    # width = floor(U[0, W)), start = floor(U[0, size - W·u)).
    if mask_param < 1:
        return
    width = torch.rand(1, generator=generator) * mask_param
    low = torch.rand(1, generator=generator) * (x.shape[axis] - width)
    start = int(low.long())
    end = start + int(width.long())
    if axis == 0:
        x[start:end] = value
    else:
        x[:, start:end] = value


def spec_augment(
    feats: torch.Tensor,
    *,
    freq_masks: int = 2,
    freq_width: int = 27,
    time_masks: int = 2,
    time_width: int | float = 0.05,
    time_warp_window: int = 0,
    mask_value: float | str = 0.0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """SpecAugment on ``(frames, dim)`` features; returns a new tensor.

    In order: :func:`time_warp` (when ``time_warp_window > 0``), ``time_masks`` time masks,
    ``freq_masks`` frequency masks -- the order and the draws of
    :class:`torchaudio.transforms.SpecAugment` (``iid_masks=False``, ``p=1``), but from
    ``generator`` instead of torch's global generator: each mask's width is
    ``floor(u × W)`` (so ``0 ≤ width < W``, uniform over ``{0, …, W-1}``) and its start
    ``floor(u' × (size - u × W))``. ``time_width`` is ``W`` for time masks, in frames (int) or
    as a fraction of the utterance's frames (float: ``W = int(frames × time_width)``, as
    torchaudio's ``p``). Masked cells get ``mask_value``, or the mean of the features (after
    warping) with ``"mean"``.

    >>> g = torch.Generator().manual_seed(0)
    >>> out = spec_augment(torch.ones(100, 80), generator=g)
    >>> out.shape, bool((out == 0).any())
    (torch.Size([100, 80]), True)
    """
    return _spec_augment(feats, freq_masks, freq_width, time_masks, time_width,
                         time_warp_window, mask_value, generator)


def _spec_augment(x: torch.Tensor, freq_masks: int, freq_width: int, time_masks: int,
                  time_width: int | float, time_warp_window: int, mask_value: float | str,
                  generator: torch.Generator | None) -> torch.Tensor:
    """:func:`spec_augment`, its arguments by position (the stage calls it per sample)."""
    if time_warp_window:
        x = time_warp(x, time_warp_window, generator)
    value = x.mean() if mask_value == "mean" else float(mask_value)
    x = x.clone()
    frames = x.shape[0]
    t_param = int(frames * time_width) if isinstance(time_width, float) else int(time_width)
    for _ in range(time_masks):
        _mask(x, 0, t_param, value, generator)
    for _ in range(freq_masks):
        _mask(x, 1, freq_width, value, generator)
    return x


@functional_datapipe("spec_augment")
class SpecAugmenterIterDataPipe(Seeded, IterDataPipe[Sample]):
    """SpecAugment: time warp, time and frequency masks (functional name: ``spec_augment``).

    Consumes samples with ``feats`` ``(frames, dim)``; yields them with augmented ``feats``
    (float32, same shape) computed by :func:`spec_augment` with a ``torch.Generator`` seeded
    by ``(seed, epoch, rank, worker)``: the same seed and epoch give the same masks,
    ``set_epoch`` changes them. Masks follow :class:`torchaudio.transforms.SpecAugment`'s
    semantics exactly (widths uniform in ``{0, …, W-1}``); the warp is ESPnet's.

    Args:
        source_datapipe: samples with features.
        freq_masks: number of frequency masks.
        freq_width: ``W`` of frequency masks, in bins (27 in the paper's LibriSpeech policy).
        time_masks: number of time masks.
        time_width: ``W`` of time masks: frames (int) or a fraction of each utterance's frames
            (float in ``[0, 1]``; 0.05 as the paper's ``p``).
        time_warp: warp window ``W`` in frames (0: no warp; 5 in the paper, 80 in ESPnet).
        mask_value: value of masked cells, or ``"mean"`` for the utterance's mean (use 0 after
            CMVN, where 0 is the mean).
        seed: base seed.

    >>> from speechpipe.pipes._base import IterableWrapper
    >>> rows = [{"key": "u1", "feats": np.ones((100, 80), np.float32)}]
    >>> [s] = IterableWrapper(rows).spec_augment(freq_masks=1, time_masks=0, freq_width=10)
    >>> s["feats"].shape, s["feats"].dtype, int((s["feats"] == 0).all(axis=0).sum()) < 10
    ((100, 80), dtype('float32'), True)
    """

    def __init__(
        self,
        source_datapipe: IterDataPipe,
        freq_masks: int = 2,
        freq_width: int = 27,
        time_masks: int = 2,
        time_width: int | float = 0.05,
        *,
        time_warp: int = 0,
        mask_value: float | str = 0.0,
        seed: int = 0,
    ) -> None:
        self.freq_masks = _check_int("freq_masks", freq_masks, 0)
        self.freq_width = _check_int("freq_width", freq_width, 0)
        self.time_masks = _check_int("time_masks", time_masks, 0)
        if isinstance(time_width, float):
            if not 0.0 <= time_width <= 1.0:
                raise ValueError(f"time_width as a fraction must be in [0, 1], got {time_width!r}")
        else:
            time_width = _check_int("time_width", time_width, 0)
        self.time_width = time_width
        self.time_warp = _check_int("time_warp", time_warp, 0)
        if mask_value != "mean":
            if isinstance(mask_value, str):
                raise ValueError(f"mask_value must be a number or 'mean', got {mask_value!r}")
            mask_value = _check_real("mask_value", mask_value)
        self.mask_value = mask_value
        self.seed = check_seed(seed)
        self.epoch = 0
        self.source_datapipe = source_datapipe

    def __iter__(self) -> Iterator[Sample]:
        options = (self.freq_masks, self.freq_width, self.time_masks, self.time_width,
                   self.time_warp, self.mask_value,
                   _torch_generator(self.seed, self.epoch, "spec_augment"))
        for sample in self.source_datapipe:
            feats = _feats_of(sample, "spec_augment")
            out = dict(sample)
            out[FEATS] = _spec_augment(_tensor(feats), *options).numpy()
            yield out

    def __len__(self) -> int:
        return _source_len(self)


SpecAugmenter = SpecAugmenterIterDataPipe


def _feats_of(sample: Any, stage: str) -> np.ndarray:
    """The sample's features, a C-contiguous float32 ``(frames, dim)`` array; a TypeError for a
    sample that is not a mapping, a DataError for missing or unusable features."""
    if type(sample) is dict:
        feats = sample.get(FEATS)
        if (type(feats) is np.ndarray and feats.dtype is _FLOAT32 and feats.ndim == 2
                and feats.flags.c_contiguous):
            return feats
    _check_sample(sample, stage)
    where = _where(sample)
    if FEATS not in sample:
        raise DataError(f"{stage}: the sample has no {FEATS!r} field", **where)
    feats = sample[FEATS]
    if isinstance(feats, torch.Tensor):
        feats = feats.detach().cpu().numpy()
    if not isinstance(feats, np.ndarray) or feats.ndim != 2 or feats.dtype.kind != "f":
        raise DataError(f"{stage}: {FEATS!r} must be a (frames, dim) float array, got "
                        f"{type(feats).__name__} {getattr(feats, 'shape', '')}", **where)
    return np.ascontiguousarray(feats, dtype=np.float32)


# --------------------------------------------------------------------------------------------
# CMVN
# --------------------------------------------------------------------------------------------


@dataclass
class CmvnStats:
    """Streaming mean/variance statistics of features: frame count, sum and sum of squares
    per dimension, accumulated in float64 (Kaldi's ``compute-cmvn-stats``).

    Saved as WeNet's ``global_cmvn`` JSON (``{"mean_stat": sums, "var_stat": sums of squares,
    "frame_num": count}``), so WeNet reads speechpipe's files and the reverse; :meth:`load`
    also reads Kaldi's stats matrix (``compute-cmvn-stats`` output, binary or text, via
    kaldiio).

    >>> s = CmvnStats.empty(2)
    >>> s.update(np.array([[1.0, 2.0], [3.0, 6.0]], np.float32))
    >>> s.count, s.mean.tolist(), s.variance.tolist()
    (2, [2.0, 4.0], [1.0, 4.0])
    """

    count: int
    sum: np.ndarray
    sum_sq: np.ndarray

    @classmethod
    def empty(cls, dim: int) -> "CmvnStats":
        return cls(0, np.zeros(dim, np.float64), np.zeros(dim, np.float64))

    @property
    def dim(self) -> int:
        return int(self.sum.shape[0])

    @property
    def mean(self) -> np.ndarray:
        return self.sum / self.count

    @property
    def variance(self) -> np.ndarray:
        """Population variance ``E[x²] - E[x]²`` (not floored; see :data:`VAR_FLOOR`)."""
        mean = self.mean
        return self.sum_sq / self.count - mean * mean

    def update(self, feats: np.ndarray) -> None:
        """Add the frames of one ``(frames, dim)`` matrix."""
        f = np.asarray(feats, dtype=np.float64)
        self.count += int(f.shape[0])
        self.sum += f.sum(axis=0)
        self.sum_sq += np.einsum("ij,ij->j", f, f)

    def merge(self, other: "CmvnStats") -> "CmvnStats":
        """Statistics of both (e.g. from several workers or shards)."""
        if other.dim != self.dim:
            raise ValueError(f"cannot merge statistics of dim {self.dim} and {other.dim}")
        return CmvnStats(self.count + other.count, self.sum + other.sum,
                         self.sum_sq + other.sum_sq)

    def to_json(self) -> dict:
        return {"mean_stat": self.sum.tolist(), "var_stat": self.sum_sq.tolist(),
                "frame_num": int(self.count)}

    def save(self, path: str | os.PathLike) -> None:
        """Write WeNet's JSON format (floats written exactly: they read back equal)."""
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_json(), f)
            f.write("\n")

    @classmethod
    def load(cls, path: str | os.PathLike) -> "CmvnStats":
        """Read WeNet JSON or a Kaldi stats matrix; errors name the file."""
        path = os.fspath(path)
        try:
            with open(path, "rb") as f:
                head = f.read(2)
        except FileNotFoundError as exc:
            raise MissingDataError("CMVN statistics file not found", source=path) from exc
        if head.lstrip()[:1] == b"{":
            return cls._load_json(path)
        return cls._load_kaldi(path)

    @classmethod
    def _load_json(cls, path: str) -> "CmvnStats":
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except (ValueError, UnicodeDecodeError) as exc:
            raise DataError(f"not valid CMVN JSON: {exc}", source=path) from exc
        missing = [k for k in ("mean_stat", "var_stat", "frame_num") if k not in data]
        if missing:
            raise DataError(f"CMVN JSON lacks {missing} (expected WeNet's mean_stat, var_stat, "
                            "frame_num)", source=path)
        try:
            sums = np.asarray(data["mean_stat"], dtype=np.float64)
            squares = np.asarray(data["var_stat"], dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise DataError(f"CMVN JSON mean_stat/var_stat must be lists of numbers: {exc}",
                            source=path) from exc
        return cls._checked(data["frame_num"], sums, squares, path)

    @classmethod
    def _load_kaldi(cls, path: str) -> "CmvnStats":
        import kaldiio

        try:
            matrix = np.asarray(kaldiio.load_mat(path), dtype=np.float64)
        except Exception as exc:  # kaldiio raises ValueError, RuntimeError, struct.error...
            raise DataError(f"neither CMVN JSON nor a Kaldi stats matrix: {exc}",
                            source=path) from exc
        if matrix.ndim != 2 or matrix.shape[0] != 2 or matrix.shape[1] < 2:
            raise DataError(f"a Kaldi CMVN stats matrix is 2 x (dim + 1), got {matrix.shape}",
                            source=path)
        count = matrix[0, -1]
        if count != int(count):
            raise DataError(f"Kaldi CMVN frame count must be a whole number, got {count}",
                            source=path)
        return cls._checked(int(count), matrix[0, :-1].copy(), matrix[1, :-1].copy(), path)

    @classmethod
    def _checked(cls, count: Any, sums: np.ndarray, squares: np.ndarray, path: str):
        if isinstance(count, bool) or not isinstance(count, numbers.Integral) or count <= 0:
            raise DataError(f"CMVN frame count must be a positive int, got {count!r}", source=path)
        if sums.ndim != 1 or sums.shape != squares.shape or sums.shape[0] == 0:
            raise DataError(f"CMVN sums and sums of squares must be equal-length non-empty "
                            f"lists, got {sums.shape} and {squares.shape}", source=path)
        return cls(int(count), sums, squares)


def compute_cmvn_stats(
    samples: Iterable[Any], *, progress: bool = True, desc: str = "cmvn"
) -> CmvnStats:
    """Accumulate :class:`CmvnStats` over samples with ``feats`` (or bare ``(frames, dim)``
    arrays), streaming: one utterance in memory at a time, float64 sums, a tqdm bar.

    Raises :class:`~speechpipe.errors.DataError` naming the key for a sample without features
    or whose dimension differs from the first one's, and ``ValueError`` when there are no
    frames at all.

    >>> s = compute_cmvn_stats([np.ones((3, 2), np.float32)], progress=False)
    >>> s.count, s.mean.tolist()
    (3, [1.0, 1.0])
    """
    from tqdm import tqdm

    stats: CmvnStats | None = None
    for item in tqdm(samples, desc=desc, unit="utt", disable=not progress):
        if isinstance(item, Mapping):
            feats, where = _feats_of(item, "compute_cmvn_stats"), _where(item)
        else:
            feats, where = np.asarray(item), {}
            if feats.ndim != 2:
                raise ValueError(f"compute_cmvn_stats expects (frames, dim) arrays, got shape "
                                 f"{feats.shape}")
        if stats is None:
            stats = CmvnStats.empty(feats.shape[1])
        elif feats.shape[1] != stats.dim:
            raise DataError(f"compute_cmvn_stats: features of dim {feats.shape[1]}, but earlier "
                            f"ones have dim {stats.dim}", **where)
        stats.update(feats)
    if stats is None or stats.count == 0:
        raise ValueError("compute_cmvn_stats: no frames to accumulate")
    return stats


def normalize_features(
    feats: np.ndarray,
    stats: CmvnStats | None = None,
    *,
    norm_means: bool = True,
    norm_vars: bool = True,
) -> np.ndarray:
    """``(feats - mean) / sqrt(max(var, VAR_FLOOR))`` in float32, per dimension.

    The statistics are ``stats`` (global CMVN) or, when ``None``, the utterance's own
    (per-utterance CMVN, Kaldi's ``apply-cmvn`` on ``utt2spk`` = identity). Mean and scale are
    computed in float64 and applied in float32, as WeNet's ``GlobalCMVN``.

    >>> normalize_features(np.array([[1.0], [3.0]], np.float32)).tolist()
    [[-1.0], [1.0]]
    """
    if stats is None:
        stats = CmvnStats.empty(feats.shape[1])
        stats.update(feats)
    mean, scale = _cmvn_terms(stats, norm_means, norm_vars)
    return np.asarray(_normalize(feats, mean, scale), dtype=np.float32)


def _cmvn_terms(
    stats: CmvnStats, norm_means: bool, norm_vars: bool
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The float32 mean to subtract and scale to multiply by (``None``: not applied)."""
    mean = stats.mean.astype(np.float32) if norm_means else None
    scale = None
    if norm_vars:
        scale = (1.0 / np.sqrt(np.maximum(stats.variance, VAR_FLOOR))).astype(np.float32)
    return mean, scale


def _normalize(
    feats: np.ndarray, mean: np.ndarray | None, scale: np.ndarray | None
) -> np.ndarray:
    if mean is not None:
        feats = feats - mean
    if scale is not None:
        feats = feats * scale
    return feats


@functional_datapipe("apply_cmvn")
class CmvnApplierIterDataPipe(IterDataPipe[Sample]):
    """Cepstral mean and variance normalisation of ``feats`` (functional name: ``apply_cmvn``).

    Consumes samples with ``feats`` ``(frames, dim)``; yields them with normalised ``feats``
    (float32) by :func:`normalize_features`: with global statistics (``stats``: a
    :class:`CmvnStats` or the path of a file :meth:`CmvnStats.load` reads -- read when
    iteration starts, never in the constructor), or with each utterance's own
    (``utterance=True``). Compute global statistics with :func:`compute_cmvn_stats` or
    ``speechpipe cmvn``.

    Args:
        source_datapipe: samples with features.
        stats: global statistics or their file (``None`` with ``utterance=True``).
        norm_means: subtract the mean.
        norm_vars: divide by the standard deviation (variance floored at :data:`VAR_FLOOR`).
        utterance: per-utterance CMVN instead of global statistics.

    Errors: a sample without features, or whose dimension differs from the statistics', raises
    :class:`~speechpipe.errors.DataError` naming its key.

    >>> from speechpipe.pipes._base import IterableWrapper
    >>> rows = [{"key": "u1", "feats": np.array([[1.0], [3.0]], np.float32)}]
    >>> stats = CmvnStats(count=2, sum=np.array([2.0]), sum_sq=np.array([4.0]))
    >>> [s["feats"].tolist() for s in IterableWrapper(rows).apply_cmvn(stats)]
    [[[0.0], [2.0]]]
    """

    def __init__(
        self,
        source_datapipe: IterDataPipe,
        stats: CmvnStats | str | os.PathLike | None = None,
        *,
        norm_means: bool = True,
        norm_vars: bool = True,
        utterance: bool = False,
    ) -> None:
        for name, value in (("norm_means", norm_means), ("norm_vars", norm_vars),
                            ("utterance", utterance)):
            if not isinstance(value, bool):
                raise TypeError(f"{name} must be a bool, got {value!r}")
        if utterance and stats is not None:
            raise ValueError("give stats (global CMVN) or utterance=True, not both")
        if not utterance and stats is None:
            raise ValueError("apply_cmvn needs stats (a CmvnStats or its file) or utterance=True")
        if stats is not None and not isinstance(stats, (CmvnStats, str, os.PathLike)):
            raise TypeError(f"stats must be a CmvnStats or a path, got {type(stats).__name__}")
        self.stats = stats
        self.norm_means = norm_means
        self.norm_vars = norm_vars
        self.utterance = utterance
        self.source_datapipe = source_datapipe

    def __iter__(self) -> Iterator[Sample]:
        stats = self.stats
        if isinstance(stats, (str, os.PathLike)):
            stats = CmvnStats.load(stats)
        if stats is not None:
            dim = stats.dim
            mean, scale = _cmvn_terms(stats, self.norm_means, self.norm_vars)
        if stats is None:
            norm_means, norm_vars = self.norm_means, self.norm_vars
            for sample in self.source_datapipe:
                feats = _feats_of(sample, "apply_cmvn")
                out = dict(sample)
                out[FEATS] = normalize_features(feats, norm_means=norm_means,
                                                norm_vars=norm_vars)
                yield out
            return
        for sample in self.source_datapipe:
            feats = _feats_of(sample, "apply_cmvn")
            if feats.shape[1] != dim:
                raise DataError(f"apply_cmvn: features of dim {feats.shape[1]}, but the CMVN "
                                f"statistics have dim {dim}", **_where(sample))
            out = dict(sample)
            out[FEATS] = _normalize(feats, mean, scale)
            yield out

    def __len__(self) -> int:
        return _source_len(self)


CmvnApplier = CmvnApplierIterDataPipe


# --------------------------------------------------------------------------------------------
# The ``speechpipe cmvn`` command
# --------------------------------------------------------------------------------------------


def add_cmvn_command(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``speechpipe cmvn`` to a CLI's subparsers; returns its parser.

    ``speechpipe cmvn --out stats.json`` with one source: ``--scp feats.scp`` (Kaldi
    features), ``--manifest m.jsonl`` (audio files named in ``--audio-field``), ``--shards
    'data/shard-{0..9}.tar'`` (their ``feats``, or audio), or ``--librispeech DIR`` (default:
    the shipped demo corpus). Audio is turned into ``--kind`` features with
    ``--num-mel-bins``; the statistics are written as WeNet-style JSON.
    """
    parser = subparsers.add_parser(
        "cmvn",
        help="compute global CMVN statistics (count, sum, sum of squares) of features",
        description="Accumulate global CMVN statistics over features read from a Kaldi "
        "feats.scp, or computed from audio (a manifest, tar shards, a LibriSpeech folder), and "
        "write them as JSON (WeNet's global_cmvn format).",
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--scp", help="a Kaldi feats.scp (features used as they are)")
    source.add_argument("--manifest", help="a JSON-lines or TSV manifest naming audio files")
    source.add_argument("--shards", help="tar shard pattern(s) (braces and globs)")
    source.add_argument("--librispeech",
                        help="a LibriSpeech folder (default: the shipped demo corpus)")
    parser.add_argument("--part", default="dev-clean", help="LibriSpeech part (dev-clean)")
    parser.add_argument("--audio-field", default="audio_path",
                        help="manifest field holding the audio path (default audio_path)")
    parser.add_argument("--kind", choices=FEATURE_KINDS, default="fbank",
                        help="features computed from audio (default fbank)")
    parser.add_argument("--num-mel-bins", type=int, default=80,
                        help="mel bins of fbank / mfcc / mel features (default 80)")
    parser.add_argument("--out", required=True, help="output JSON file")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.set_defaults(func=_cmvn_command)
    return parser


def _cmvn_samples(args: argparse.Namespace) -> Iterable[Sample]:
    from ._base import IterableWrapper

    if args.scp:
        from . import kaldi as _kaldi  # noqa: F401  (registers parse_scp, load_scp)

        return IterableWrapper([args.scp]).open_files(mode="b").parse_scp().load_scp("feats")
    if args.manifest:
        from . import decode as _decode, manifests as _manifests  # noqa: F401

        root = os.path.dirname(os.path.abspath(args.manifest))
        return (IterableWrapper([args.manifest]).open_files(mode="b").parse_manifest()
                .load_audio(field=args.audio_field, root=root))
    if args.shards:
        from . import decode as _decode, shards as _shards, sources as _sources  # noqa: F401

        return IterableWrapper([args.shards]).list_shards().open().read_shards().decode()
    from ..demo import DEMO_CORPUS
    from ..recipes.librispeech import librispeech_samples

    return librispeech_samples(args.librispeech or DEMO_CORPUS, args.part)


def _cmvn_command(args: argparse.Namespace) -> int:
    options = {"n_mels" if args.kind == "mel" else "num_mel_bins": args.num_mel_bins}
    if args.kind == "mfcc":
        options["num_ceps"] = min(13, args.num_mel_bins)
    extractor = _Extractor(args.kind, None, options)

    def features() -> Iterator[Any]:
        for sample in _cmvn_samples(args):
            if FEATS in sample:
                yield sample
                continue
            audio, rate = _audio_of(sample, "cmvn", mono=True)
            yield {KEY: sample.get(KEY),
                   FEATS: _extract_one(audio, rate, extractor, 0.0, None, sample)}

    stats = compute_cmvn_stats(features(), progress=not args.no_progress)
    stats.save(args.out)
    print(f"cmvn: {stats.count} frames of dim {stats.dim} -> {args.out}")
    return 0

