"""Helpers shared by the audio modules (:mod:`~speechpipe.pipes.audio._channels`,
:mod:`~speechpipe.pipes.audio._augment`, :mod:`~speechpipe.pipes.audio._features`,
:mod:`~speechpipe.pipes.audio._cmvn`): reading a sample's audio or features, numpy/torch conversions,
argument checks, the seeded ``torch.Generator`` and the cached resampling kernel.
"""

from __future__ import annotations

import functools
import math
import numbers
from typing import Any, Mapping

import numpy as np
import torch
import torchaudio.transforms as taT

from ...errors import DataError
from ...sample import AUDIO, FEATS, KEY, SAMPLE_RATE, SOURCE, len_key
from ...seeding import derive_seed, process_position

__all__ = ["FLOAT32", "audio_of", "batch_feats_of", "batch_where", "channels_first",
           "check_real", "check_sample", "checked_audio", "feats_of", "resampler", "sample_where",
           "source_len", "time_first", "to_tensor", "torch_generator", "valid_frames"]


def sample_where(sample: Mapping[str, Any]) -> dict:
    source = sample.get(SOURCE, sample.get("audio_path"))
    return {"source": source if isinstance(source, str) else None, "key": sample.get(KEY)}


def check_sample(sample: Any, stage: str) -> None:
    if not isinstance(sample, Mapping):
        raise TypeError(f"{stage} expects sample dicts, got {type(sample).__name__}")


FLOAT32 = np.dtype(np.float32)


def audio_of(sample: Any, stage: str, *, mono: bool = False) -> tuple[np.ndarray, int]:
    """The sample's audio (float32, time first) and its rate; a TypeError for a sample that is
    not a mapping, a DataError for missing or unusable audio.

    A dict with a float32 array and an int rate is recognised by a few type checks and its
    audio returned as it is; anything else goes through :func:`checked_audio`.
    """
    if type(sample) is dict:
        audio, rate = sample.get(AUDIO), sample.get(SAMPLE_RATE)
        if (type(audio) is np.ndarray and audio.dtype is FLOAT32 and type(rate) is int
                and rate > 0 and (audio.ndim == 1 or (audio.ndim == 2 and not mono))):
            return audio, rate
    return checked_audio(sample, stage, mono)


def checked_audio(sample: Any, stage: str, mono: bool) -> tuple[np.ndarray, int]:
    check_sample(sample, stage)
    where = sample_where(sample)
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


def to_tensor(array: np.ndarray) -> torch.Tensor:
    """``torch.from_numpy`` (no copy), copying only read-only arrays, on which it warns."""
    return torch.from_numpy(array if array.flags.writeable else array.copy())


def channels_first(audio: np.ndarray) -> torch.Tensor:
    """``(T,)`` or ``(T, C)`` numpy to a ``(T,)`` or ``(C, T)`` contiguous tensor."""
    return to_tensor(np.ascontiguousarray(audio if audio.ndim == 1 else audio.T))


def time_first(waveform: torch.Tensor) -> np.ndarray:
    out = waveform.numpy()
    return out if out.ndim == 1 else np.ascontiguousarray(out.T)


def torch_generator(seed: int, epoch: int, salt: str) -> torch.Generator:
    where = process_position()
    return torch.Generator().manual_seed(derive_seed(seed, epoch, where.rank, where.worker, salt))


def check_real(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise TypeError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def source_len(pipe: Any) -> int:
    return len(pipe.source_datapipe)


# The resampling kernels, cached per process: shared by resample and perturb_speed.
@functools.lru_cache(maxsize=32)
def resampler(
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


def feats_of(sample: Any, stage: str, *, channels: bool = False) -> np.ndarray:
    """The sample's features, a C-contiguous float32 ``(frames, dim)`` array (or, with
    ``channels``, also ``(frames, channels, dim)``); a TypeError for a sample that is not a
    mapping, a DataError for missing or unusable features."""
    ndims = (2, 3) if channels else (2,)
    if type(sample) is dict:
        feats = sample.get(FEATS)
        if (type(feats) is np.ndarray and feats.dtype is FLOAT32 and feats.ndim in ndims
                and feats.flags.c_contiguous):
            return feats
    check_sample(sample, stage)
    where = sample_where(sample)
    if FEATS not in sample:
        raise DataError(f"{stage}: the sample has no {FEATS!r} field", **where)
    feats = sample[FEATS]
    if isinstance(feats, torch.Tensor):
        feats = feats.detach().cpu().numpy()
    if not isinstance(feats, np.ndarray) or feats.ndim not in ndims or feats.dtype.kind != "f":
        want = "(frames, dim) or (frames, channels, dim)" if channels else "(frames, dim)"
        raise DataError(f"{stage}: {FEATS!r} must be a {want} float array, got "
                        f"{type(feats).__name__} {getattr(feats, 'shape', '')}", **where)
    return np.ascontiguousarray(feats, dtype=np.float32)


def batch_where(batch: Mapping[str, Any], row: int = 0) -> dict:
    """Where a collated batch's row ``row`` came from: its ``key`` (and ``source``)."""
    where = {}
    for field in (KEY, SOURCE):
        values = batch.get(field)
        if isinstance(values, (list, tuple)) and len(values) > row:
            where[field] = values[row] if isinstance(values[row], str) else None
    return where


def batch_feats_of(batch: Any, stage: str) -> tuple[torch.Tensor, list[int]]:
    """A collated batch's ``feats`` as a float ``(B, frames, dim)`` tensor (on its device; a
    numpy array is shared, not copied) and ``feats_len`` as ints; a TypeError for a batch that
    is not a mapping, a DataError naming the row's key for missing or inconsistent fields."""
    if not isinstance(batch, Mapping):
        raise TypeError(f"{stage}(batched=True) expects collated batch dicts, got "
                        f"{type(batch).__name__}")
    feats, lengths = batch.get(FEATS), batch.get(len_key(FEATS))
    if feats is None or lengths is None:
        raise DataError(f"{stage}(batched=True): the batch needs {FEATS!r} and "
                        f"{len_key(FEATS)!r} (from PadCollate), got {sorted(batch)}",
                        **batch_where(batch))
    if isinstance(feats, np.ndarray):
        feats = torch.from_numpy(feats)
    if not isinstance(feats, torch.Tensor) or feats.ndim != 3 or not feats.is_floating_point():
        raise DataError(f"{stage}(batched=True): {FEATS!r} must be a float (batch, frames, dim) "
                        f"tensor, got {type(feats).__name__} {tuple(getattr(feats, 'shape', ()))}",
                        **batch_where(batch))
    counts = [int(n) for n in torch.as_tensor(lengths).reshape(-1).tolist()]
    if len(counts) != feats.shape[0]:
        raise DataError(f"{stage}(batched=True): {len(counts)} {len_key(FEATS)!r} for "
                        f"{feats.shape[0]} rows of {FEATS!r}", **batch_where(batch))
    for row, n in enumerate(counts):
        if not 0 <= n <= feats.shape[1]:
            raise DataError(f"{stage}(batched=True): {len_key(FEATS)!r} {n} outside the "
                            f"{feats.shape[1]} padded frames", **batch_where(batch, row))
    return feats, counts


def valid_frames(counts: list[int], frames: int, device: torch.device) -> torch.Tensor:
    """``(B, frames)`` bool: True on each row's first ``counts[b]`` frames."""
    lengths = torch.tensor(counts, dtype=torch.int64, device=device)
    return torch.arange(frames, device=device)[None, :] < lengths[:, None]
