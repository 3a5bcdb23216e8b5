"""Augmentation: speed and volume perturbation of audio, SpecAugment of features.

Each stage draws from a generator seeded by ``(seed, epoch, rank, worker)``; ``set_epoch``
changes the draws. Speed and volume perturbation act on ``audio`` and come before length
bucketing (speed perturbation changes the number of samples by ``1 / factor``);
``spec_augment`` acts on ``feats``.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Iterator, Sequence

import numpy as np
import torch
import torchaudio.transforms as taT

from ...errors import check_int
from ...sample import AUDIO, DURATION, FEATS, Sample
from ._common import (
    audio_of, batch_feats_of, channels_first, check_real, feats_of, resampler, source_len, time_first, to_tensor, torch_generator, valid_frames,
)
from .._core import functional_datapipe, IterDataPipe
from .._core import check_seed, Seeded

__all__ = [
    "GAIN",
    "PAPER_BINS",
    "PAPER_FREQ_WIDTH",
    "SPEED",
    "SpecAugmenter",
    "SpecAugmenterIterDataPipe",
    "SpeedPerturber",
    "SpeedPerturberIterDataPipe",
    "VolumePerturber",
    "VolumePerturberIterDataPipe",
    "change_speed",
    "played_at",
    "spec_augment",
    "spec_augment_batch",
    "time_warp",
]

#: Sample field set by ``perturb_speed``: the speed factor applied (product if applied twice).
SPEED = "speed"
#: Sample field set by ``perturb_volume``: the linear gain applied (product if applied twice).
GAIN = "gain"


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
    return audio if kernel is None else time_first(kernel(channels_first(audio)))


def played_at(sample: Sample, audio: np.ndarray, rate: int, factor: float) -> Sample:
    """A copy of ``sample`` holding ``audio``, its audio played ``factor`` times faster at
    ``rate`` Hz: ``speed`` multiplied by ``factor`` (set when absent), ``duration`` that of the
    new audio (when the sample has one). What ``perturb_speed`` yields per sample.

    >>> out = played_at({"speed": 0.9, "duration": 2.0}, np.zeros(8000, np.float32), 16000, 2.0)
    >>> out["speed"], out["duration"]
    (1.8, 0.5)
    """
    out = dict(sample)
    out[AUDIO] = audio
    previous = out.get(SPEED)
    out[SPEED] = factor if previous is None else float(previous) * factor
    if DURATION in out:
        out[DURATION] = audio.shape[0] / rate
    return out


def _speed_kernel(sample_rate: int, factor: float) -> taT.Resample | None:
    """The resampler of :func:`change_speed` (``None`` when the rate does not change)."""
    source = int(round(sample_rate * factor))
    if source <= 0:
        raise ValueError(f"factor {factor!r} gives a non-positive rate at {sample_rate} Hz")
    if source == sample_rate:
        return None
    gcd = math.gcd(source, sample_rate)
    return resampler(source // gcd, sample_rate // gcd)


def _check_factors(factors: Any) -> tuple[float, ...]:
    if isinstance(factors, (str, bytes)) or not isinstance(factors, Iterable):
        raise TypeError(f"factors must be a sequence of numbers, got {factors!r}")
    out = tuple(check_real("factors", f) for f in factors)
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

    >>> from speechpipe import IterableWrapper
    >>> rows = [{"key": "u1", "audio": np.zeros(16000, np.float32), "sample_rate": 16000}]
    >>> [s] = IterableWrapper(rows).perturb_speed(factors=(1.25,))
    >>> s["audio"].shape, s["speed"]
    ((12800,), 1.25)
    """

    holds_nothing = True  # item by item: nothing kept between two yields

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
        self._begin_pass()
        choice, factors = self._rng("perturb_speed").choice, self.factors
        kernels: dict[tuple[int, float], taT.Resample | None] = {}  # by (rate, factor)
        for sample in self.source_datapipe:
            audio, rate = audio_of(sample, "perturb_speed")
            factor = choice(factors)
            try:
                kernel = kernels[rate, factor]
            except KeyError:
                kernel = kernels[rate, factor] = _speed_kernel(rate, factor)
            yield played_at(sample, audio if kernel is None
                            else time_first(kernel(channels_first(audio))), rate, factor)

    def __len__(self) -> int:
        return source_len(self)


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

    >>> from speechpipe import IterableWrapper
    >>> rows = [{"key": "u1", "audio": np.ones(4, np.float32), "sample_rate": 16000}]
    >>> [s] = IterableWrapper(rows).perturb_volume(low=0.5, high=0.5)
    >>> s["audio"], s["gain"]
    (array([0.5, 0.5, 0.5, 0.5], dtype=float32), 0.5)
    """

    holds_nothing = True  # item by item: nothing kept between two yields

    def __init__(
        self,
        source_datapipe: IterDataPipe,
        low: float = 0.8,
        high: float = 1.2,
        *,
        seed: int = 0,
    ) -> None:
        low, high = check_real("low", low), check_real("high", high)
        if low <= 0:
            raise ValueError(f"low must be > 0, got {low!r}")
        if high < low:
            raise ValueError(f"high must be >= low ({low!r}), got {high!r}")
        self.low, self.high = low, high
        self.seed = check_seed(seed)
        self.epoch = 0
        self.source_datapipe = source_datapipe

    def __iter__(self) -> Iterator[Sample]:
        self._begin_pass()
        draw = self._rng("perturb_volume").random
        low, span, float32 = self.low, self.high - self.low, np.float32
        for sample in self.source_datapipe:
            audio, _ = audio_of(sample, "perturb_volume")
            gain = low + span * draw()  # random.Random.uniform(low, high), inlined
            out = dict(sample)
            out[AUDIO] = audio * float32(gain)
            previous = out.get(GAIN)
            out[GAIN] = gain if previous is None else float(previous) * gain
            yield out

    def __len__(self) -> int:
        return source_len(self)


VolumePerturber = VolumePerturberIterDataPipe


# --------------------------------------------------------------------------------------------
# SpecAugment
# --------------------------------------------------------------------------------------------


def time_warp(
    feats: torch.Tensor, window: int, generator: torch.Generator | None = None,
    mode: str = "bicubic",
) -> torch.Tensor:
    """SpecAugment's time warp on ``(frames, dim)`` features, as ESPnet's ``time_warp``; on
    ``(frames, channels, dim)`` features, the same warp on every channel.

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
    # (1, 1, frames, dim), or the channels as the batch of the interpolation: (C, 1, frames, dim)
    x = feats[None, None] if feats.ndim == 2 else feats.permute(1, 0, 2)[:, None]
    size = feats.shape[-1]
    left = torch.nn.functional.interpolate(x[:, :, :center], (warped, size), mode=mode,
                                           align_corners=False)
    right = torch.nn.functional.interpolate(x[:, :, center:], (frames - warped, size), mode=mode,
                                            align_corners=False)
    out = torch.cat([left, right], dim=2)[:, 0]
    return out[0] if feats.ndim == 2 else out.permute(1, 0, 2).contiguous()


def _mask_span(size: int, mask_param: int, generator) -> tuple[int, int]:
    # torchaudio.functional.mask_along_axis, draw for draw, with a given generator:
    # width = floor(U[0, W)), start = floor(U[0, size - W·u)). A mask wider than the axis
    # (W > size) may start before 0: torchaudio masks [0, end) then, by comparison.
    width = torch.rand(1, generator=generator) * mask_param
    low = torch.rand(1, generator=generator) * (size - width)
    start = int(low.long())
    return max(start, 0), start + int(width.long())


def _mask(x: torch.Tensor, axis: int, mask_param: int, value, generator) -> None:
    if mask_param < 1:
        return
    start, end = _mask_span(x.shape[0] if axis == 0 else x.shape[-1], mask_param,
                            generator)  # frames, or bins on every channel
    if axis == 0:
        x[start:end] = value
    else:  # the last axis: frequency, on every channel of (frames, channels, dim)
        x[..., start:end] = value


def spec_augment(
    feats: torch.Tensor,
    *,
    freq_masks: int = 2,
    freq_width: int | None = None,
    time_masks: int = 2,
    time_width: int | float = 0.05,
    time_warp_window: int = 0,
    mask_value: float | str = 0.0,
    generator: torch.Generator | None = None,
    per_channel: bool = False,
) -> torch.Tensor:
    """SpecAugment on ``(frames, dim)`` or ``(frames, channels, dim)`` features; returns a new
    tensor.

    In order: :func:`time_warp` (when ``time_warp_window > 0``), ``time_masks`` time masks,
    ``freq_masks`` frequency masks -- the order and the draws of
    :class:`torchaudio.transforms.SpecAugment` (``iid_masks=False``, ``p=1``), but from
    ``generator`` instead of torch's global generator: each mask's width is
    ``floor(u × W)`` (so ``0 ≤ width < W``, uniform over ``{0, …, W-1}``) and its start
    ``floor(u' × (size - u × W))``. ``time_width`` is ``W`` for time masks, in frames (int) or
    as a fraction of the utterance's frames (float: ``W = int(frames × time_width)``, as
    torchaudio's ``p``). ``freq_width`` is ``W`` for frequency masks, in bins: by default the
    paper's 27 for 80 bins, scaled to the features' size (``round(27 × dim / 80)``: 8 for 23
    bins); a ``W`` wider than the features is a ``ValueError``. Masked cells get
    ``mask_value``, or the mean of the features (after warping) with ``"mean"``.

    Several channels: by default the same warp and masks on every channel (drawn once, as for
    mono features), so that the channels of one recording stay aligned, as multichannel
    frontends (ESPnet's beamformers) expect; ``"mean"`` is then the mean over all channels.
    ``per_channel=True`` draws each channel's own, channel after channel from ``generator``
    (each as a mono ``(frames, dim)`` matrix). Mono features ignore ``per_channel``.

    >>> g = torch.Generator().manual_seed(0)
    >>> out = spec_augment(torch.ones(100, 80), generator=g)
    >>> out.shape, bool((out == 0).any())
    (torch.Size([100, 80]), True)
    """
    return _spec_augment(feats, freq_masks, freq_width, time_masks, time_width,
                         time_warp_window, mask_value, generator, per_channel)


def _spec_augment(x: torch.Tensor, freq_masks: int, freq_width: int, time_masks: int,
                  time_width: int | float, time_warp_window: int, mask_value: float | str,
                  generator: torch.Generator | None, per_channel: bool = False) -> torch.Tensor:
    """:func:`spec_augment`, its arguments by position (the stage calls it per sample)."""
    if per_channel and x.ndim == 3:
        return torch.stack([_spec_augment(x[:, c], freq_masks, freq_width, time_masks,
                                          time_width, time_warp_window, mask_value, generator)
                            for c in range(x.shape[1])], dim=1)
    freq_width = _freq_width(freq_width, x.shape[-1])
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


def _freq_width(freq_width: int | None, dim: int) -> int:
    """``W`` of frequency masks on ``dim`` bins: the paper's, scaled, when not given."""
    if freq_width is None:
        return round(PAPER_FREQ_WIDTH * dim / PAPER_BINS)
    if freq_width > dim:
        raise ValueError(
            f"spec_augment: freq_width {freq_width} is wider than the features ({dim} bins); "
            f"the paper's {PAPER_FREQ_WIDTH} is for {PAPER_BINS} bins: leave freq_width unset "
            f"to scale it ({round(PAPER_FREQ_WIDTH * dim / PAPER_BINS)} here) or give one <= "
            f"{dim}")
    return freq_width


def spec_augment_batch(
    feats: torch.Tensor,
    lengths: Sequence[int],
    *,
    freq_masks: int = 2,
    freq_width: int | None = None,
    time_masks: int = 2,
    time_width: int | float = 0.05,
    time_warp_window: int = 0,
    mask_value: float | str = 0.0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """SpecAugment on a padded ``(B, frames, dim)`` batch with ``lengths`` frames per row, on
    the batch's device; returns a new tensor.

    Row ``b`` gets exactly what :func:`spec_augment` gives its first ``lengths[b]`` frames with
    the same ``generator``, rows in order (so a batch equals its samples augmented one by one
    with the same seed): the draws are those of the per-utterance function, made row by row
    on the generator's device (the CPU). The masks are written into a copy slice by slice on
    the CPU, and applied with a fixed number of operations (one copy of the spans to the
    device, one ``torch.where``) on other devices, where each slice would be a kernel launch.
    A mask never reaches a row's padding, which keeps its values; ``"mean"`` is the mean of
    the row's real frames. The time warp (``time_warp_window > 0``) runs row by row.

    >>> g = torch.Generator().manual_seed(0)
    >>> out = spec_augment_batch(torch.ones(2, 100, 80), [100, 60], generator=g)
    >>> out.shape, bool((out[1, 60:] == 1).all())
    (torch.Size([2, 100, 80]), True)
    """
    return _spec_augment_batch(feats, [int(n) for n in lengths], freq_masks, freq_width,
                               time_masks, time_width, time_warp_window, mask_value, generator)


def _spec_augment_batch(x: torch.Tensor, lengths: list[int], freq_masks: int,
                        freq_width: int | None, time_masks: int, time_width: int | float,
                        time_warp_window: int, mask_value: float | str,
                        generator: torch.Generator | None) -> torch.Tensor:
    """:func:`spec_augment_batch`, its arguments by position (the stage calls it per batch)."""
    rows, dim = x.shape[0], x.shape[2]
    freq_width = _freq_width(freq_width, dim)
    if time_warp_window:
        x = x.clone()
    # spans lists the masks as (row, axis, start, end): per row, time masks then frequency
    # masks, drawn after the row's warp, as spec_augment draws them.
    spans: list[tuple[int, int, int, int]] = []
    for b, n in enumerate(lengths):
        if time_warp_window:
            x[b, :n] = time_warp(x[b, :n], time_warp_window, generator)
        t_param = int(n * time_width) if isinstance(time_width, float) else int(time_width)
        for axis, count, param, size in ((0, time_masks, t_param, n),
                                         (1, freq_masks, freq_width, dim)):
            if param < 1:
                continue
            for _ in range(count):
                start, end = _mask_span(size, param, generator)
                if end > start:
                    spans.append((b, axis, start, end))
    if mask_value == "mean":  # row by row: the very reduction spec_augment makes
        value = torch.stack([x[b, :n].mean() for b, n in enumerate(lengths)])
    else:
        value = torch.tensor(float(mask_value), dtype=x.dtype, device=x.device).expand(rows)
    if x.device.type == "cpu":
        return _masked_by_slices(x, lengths, spans, value)
    return _masked_at_once(x, lengths, spans, value)


def _masked_by_slices(x: torch.Tensor, lengths: list[int],
                      spans: list[tuple[int, int, int, int]], value: torch.Tensor
                      ) -> torch.Tensor:
    """The masks written into a copy of ``x`` slice by slice: on the CPU, cheaper than any
    whole-batch operation (the masks cover a small part of the batch)."""
    out = x.clone()
    for row, axis, start, end in spans:
        if axis == 0:  # a mask wider than the row may end beyond it: never in the padding
            out[row, start:min(end, lengths[row])] = value[row]
        else:
            out[row, :lengths[row], start:end] = value[row]
    return out


def _masked_at_once(x: torch.Tensor, lengths: list[int],
                    spans: list[tuple[int, int, int, int]], value: torch.Tensor
                    ) -> torch.Tensor:
    """The masks applied with a fixed number of operations whatever their count (one copy of
    the spans to the device, one ``torch.where``): on an accelerator, where each slice written
    would be a kernel launch."""
    rows, frames, dim = x.shape
    device = x.device
    if not spans:
        return x.clone()
    table = torch.tensor(spans, dtype=torch.int64, device=device)
    row, axis, start, end = table.unbind(1)
    # Each span covers positions [start, end) of its axis: frames 0.. then bins frames..
    offset = torch.where(axis == 0, 0, frames)
    positions = torch.arange(frames + dim, device=device)
    hit = ((positions[None, :] >= (start + offset)[:, None])
           & (positions[None, :] < (end + offset)[:, None]))
    masked = torch.zeros(rows, frames + dim, dtype=torch.int32, device=device)
    masked = masked.index_add_(0, row, hit.to(torch.int32)) > 0
    valid = valid_frames(lengths, frames, device)
    cells = (masked[:, :frames, None] | masked[:, None, frames:]) & valid[:, :, None]
    return torch.where(cells, value[:, None, None], x)


#: SpecAugment's LibriSpeech policy: frequency masks up to 27 bins wide on 80-bin features.
PAPER_FREQ_WIDTH, PAPER_BINS = 27, 80


@functional_datapipe("spec_augment")
class SpecAugmenterIterDataPipe(Seeded, IterDataPipe[Sample]):
    """SpecAugment: time warp, time and frequency masks (functional name: ``spec_augment``).

    Consumes samples with ``feats`` ``(frames, dim)`` or ``(frames, channels, dim)``; yields
    them with augmented ``feats`` (float32, same shape) computed by :func:`spec_augment` with a
    ``torch.Generator`` seeded by ``(seed, epoch, rank, worker)``: the same seed and epoch give
    the same masks, ``set_epoch`` changes them. Masks follow
    :class:`torchaudio.transforms.SpecAugment`'s semantics exactly (widths uniform in
    ``{0, …, W-1}``); the warp is ESPnet's. Channels of one recording get the same warp and
    masks (they stay aligned), or each its own with ``per_channel=True``.

    Args:
        source_datapipe: samples with features.
        freq_masks: number of frequency masks.
        freq_width: ``W`` of frequency masks, in bins (default: the paper's 27 on 80 bins,
            scaled to the features' size; one wider than the features is refused).
        time_masks: number of time masks.
        time_width: ``W`` of time masks: frames (int) or a fraction of each utterance's frames
            (float in ``[0, 1]``; 0.05 as the paper's ``p``).
        time_warp: warp window ``W`` in frames (0: no warp; 5 in the paper, 80 in ESPnet).
        mask_value: value of masked cells, or ``"mean"`` for the utterance's mean (use 0 after
            CMVN, where 0 is the mean).
        per_channel: independent masks (and warp) per channel of ``(frames, channels, dim)``
            features instead of the same on every channel.
        seed: base seed.
        batched: consume collated batches (``feats`` ``(B, frames, dim)`` tensors or arrays
            with ``feats_len``, e.g. after ``move_to_device`` and
            ``compute_features(batched=True)``) and augment each on its device with
            :func:`spec_augment_batch`: the masks stay within each row's ``feats_len``, and a
            batch gets the masks its samples would get one by one with the same seed and
            order. ``feats`` comes back as it came (a tensor on its device, or an array).

    >>> from speechpipe import IterableWrapper
    >>> rows = [{"key": "u1", "feats": np.ones((100, 80), np.float32)}]
    >>> [s] = IterableWrapper(rows).spec_augment(freq_masks=1, time_masks=0, freq_width=10)
    >>> s["feats"].shape, s["feats"].dtype, int((s["feats"] == 0).all(axis=0).sum()) < 10
    ((100, 80), dtype('float32'), True)
    """

    holds_nothing = True  # item by item: nothing kept between two yields

    def __init__(
        self,
        source_datapipe: IterDataPipe,
        freq_masks: int = 2,
        freq_width: int | None = None,
        time_masks: int = 2,
        time_width: int | float = 0.05,
        *,
        time_warp: int = 0,
        mask_value: float | str = 0.0,
        per_channel: bool = False,
        seed: int = 0,
        batched: bool = False,
    ) -> None:
        if not isinstance(per_channel, bool):
            raise TypeError(f"per_channel must be a bool, got {per_channel!r}")
        self.per_channel = per_channel
        if not isinstance(batched, bool):
            raise TypeError(f"batched must be a bool, got {batched!r}")
        self.batched = batched
        self.freq_masks = check_int("freq_masks", freq_masks, 0)
        self.freq_width = None if freq_width is None else check_int("freq_width", freq_width, 0)
        self.time_masks = check_int("time_masks", time_masks, 0)
        if isinstance(time_width, float):
            if not 0.0 <= time_width <= 1.0:
                raise ValueError(f"time_width as a fraction must be in [0, 1], got {time_width!r}")
        else:
            time_width = check_int("time_width", time_width, 0)
        self.time_width = time_width
        self.time_warp = check_int("time_warp", time_warp, 0)
        if mask_value != "mean":
            if isinstance(mask_value, str):
                raise ValueError(f"mask_value must be a number or 'mean', got {mask_value!r}")
            mask_value = check_real("mask_value", mask_value)
        self.mask_value = mask_value
        self.seed = check_seed(seed)
        self.epoch = 0
        self.source_datapipe = source_datapipe

    def __iter__(self) -> Iterator[Sample]:
        self._begin_pass()
        options = (self.freq_masks, self.freq_width, self.time_masks, self.time_width,
                   self.time_warp, self.mask_value,
                   torch_generator(self.seed, self.epoch, "spec_augment"), self.per_channel)
        if self.batched:
            for batch in self.source_datapipe:
                feats, lengths = batch_feats_of(batch, "spec_augment")
                out = dict(batch)
                augmented = _spec_augment_batch(feats, lengths, *options[:-1])
                out[FEATS] = (augmented.numpy() if isinstance(batch[FEATS], np.ndarray)
                              else augmented)
                yield out
            return
        for sample in self.source_datapipe:
            feats = feats_of(sample, "spec_augment", channels=True)
            out = dict(sample)
            out[FEATS] = _spec_augment(to_tensor(feats), *options).numpy()
            yield out

    def __len__(self) -> int:
        return source_len(self)


SpecAugmenter = SpecAugmenterIterDataPipe

