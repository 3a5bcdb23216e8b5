"""On-the-fly audio processing: resampling, features, perturbation, SpecAugment and CMVN.

Every stage computes the same numbers as the reference implementation it wraps (torchaudio's
functions and transforms, Kaldi's conventions), is seeded from ``(seed, epoch, rank, worker)``
when random, and never mutates its input samples (each yields a shallow copy with the changed
fields).

==========================  ==========================================================  =========
functional name             what it does to a sample                                    random
==========================  ==========================================================  =========
``select_channel``          ``audio`` ``(samples, channels)`` to one channel            no
                            ``(samples,)``
``downmix``                 ``audio`` ``(samples, channels)`` to their mean             no
                            ``(samples,)``
``resample``                ``audio`` to another ``sample_rate``                        no
                            (:func:`torchaudio.functional.resample`, kernel cached)
``perturb_speed``           resample as if recorded at ``rate × factor``: tempo and     yes
                            pitch change by ``factor``; records ``speed``
``perturb_volume``          ``audio × gain``, ``gain ~ U[low, high]``, records ``gain`` yes
``compute_features``        ``feats`` (frames, dim): Kaldi ``fbank``/``mfcc``           dither
                            (:mod:`~speechpipe.pipes.audio._fbank`, or
                            :mod:`torchaudio.compliance.kaldi` by name) or ``mel``
                            (:class:`torchaudio.transforms.MelSpectrogram`); per sample
                            or per collated batch (``batched=True``, on a ``device``)
``spec_augment``            time warp, time masks, frequency masks on ``feats``         yes
``apply_cmvn``              global (:class:`CmvnStats`) or per-utterance mean and       no
                            variance normalisation of ``feats``
==========================  ==========================================================  =========

Plain functions hold the algorithms (:func:`resample_audio`, :func:`change_speed`,
:func:`compute_features`, :func:`batch_features`, :func:`num_frames`,
:func:`mel_num_frames`, :func:`spec_augment`, :func:`time_warp`, :func:`normalize_features`,
:func:`compute_cmvn_stats`); the pipes validate their arguments, seed, and delegate.

This module holds resampling; the other stages live by job and are re-exported here:
features in :mod:`speechpipe.pipes.audio._features`, speed and volume perturbation and SpecAugment in
:mod:`speechpipe.pipes.audio._augment`, CMVN in :mod:`speechpipe.pipes.audio._cmvn` (the helpers they share
in ``speechpipe.pipes.audio._common``).

Channels: audio keeps the channel axis it was read with (time first, ``(samples, channels)``;
mono stays ``(samples,)``), resampling and perturbation act on every channel, and
``compute_features`` gives ``(frames, channels, dim)`` features of several channels. A batch
mixing mono and several channels raises :class:`~speechpipe.errors.ChannelMismatchError` in
collation: ``select_channel`` or ``downmix`` first (or the ``channels=`` option of ``decode``
and ``load_audio``, which does the same while decoding).

Order in a training pipeline: ``perturb_speed`` / ``perturb_volume`` / ``resample`` act on
audio and come **before** length bucketing, so that the lengths the batcher sees are the true
ones (speed perturbation changes the number of samples by ``1 / factor``); features next
(:meth:`FeatureComputerIterDataPipe.num_frames` gives the frame count from the number of
samples, before computing); ``spec_augment`` and ``apply_cmvn`` on features. ``speechpipe
cmvn`` (:mod:`speechpipe.cli.cmvn`) computes the global statistics file.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np
import torchaudio.transforms as taT

from ...errors import check_int
from ...sample import AUDIO, KEY, SAMPLE_RATE, Sample
from ._common import (
    audio_of, channels_first, check_real, resampler, sample_where, source_len, time_first,
)
from .._core import functional_datapipe, IterDataPipe
from ..decode import check_channels, choose_channels

__all__ = [
    "ChannelPicker",
    "ChannelPickerIterDataPipe",
    "Downmixer",
    "DownmixerIterDataPipe",
    "RESAMPLING_METHODS",
    "Resampler",
    "ResamplerIterDataPipe",
    "resample_audio",
]

#: ``resampling_method`` values torchaudio accepts.
RESAMPLING_METHODS = ("sinc_interp_hann", "sinc_interp_kaiser")


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
    transform = resampler(int(orig_rate), int(new_rate),
                           lowpass_filter_width=lowpass_filter_width, rolloff=float(rolloff),
                           resampling_method=resampling_method, beta=beta)
    return time_first(transform(channels_first(audio)))


def _check_resample_options(lowpass_filter_width, rolloff, resampling_method, beta) -> None:
    check_int("lowpass_filter_width", lowpass_filter_width, 1)
    rolloff = check_real("rolloff", rolloff)
    if not 0.0 < rolloff <= 1.0:
        raise ValueError(f"rolloff must be in (0, 1], got {rolloff!r}")
    if resampling_method not in RESAMPLING_METHODS:
        raise ValueError(f"resampling_method must be one of {RESAMPLING_METHODS}, "
                         f"got {resampling_method!r}")
    if beta is not None:
        if check_real("beta", beta) <= 0:
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

    >>> from speechpipe import IterableWrapper
    >>> pipe = IterableWrapper([{"key": "u1", "audio": np.zeros(1600, np.float32),
    ...                          "sample_rate": 16000}]).resample(8000)
    >>> [(s["audio"].shape, s["sample_rate"]) for s in pipe]
    [((800,), 8000)]
    """

    holds_nothing = True  # item by item: nothing kept between two yields

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
        self.rate = check_int("rate", rate, 1)
        _check_resample_options(lowpass_filter_width, rolloff, resampling_method, beta)
        self.source_datapipe = source_datapipe
        self.options = {"lowpass_filter_width": int(lowpass_filter_width),
                        "rolloff": float(rolloff), "resampling_method": resampling_method,
                        "beta": None if beta is None else float(beta)}

    def __iter__(self) -> Iterator[Sample]:
        kernels: dict[int, taT.Resample] = {}  # by source rate
        for sample in self.source_datapipe:
            audio, rate = audio_of(sample, "resample")
            if rate == self.rate:
                yield sample
                continue
            kernel = kernels.get(rate)
            if kernel is None:
                kernel = kernels[rate] = resampler(rate, self.rate, **self.options)
            out = dict(sample)
            out[AUDIO] = time_first(kernel(channels_first(audio)))
            out[SAMPLE_RATE] = self.rate
            yield out

    def __len__(self) -> int:
        return source_len(self)


Resampler = ResamplerIterDataPipe



def _choose(pipe: IterDataPipe, stage: str, channels: str | int) -> Iterator[Sample]:
    for sample in pipe:
        audio, _ = audio_of(sample, stage)
        out = dict(sample)
        out[AUDIO] = choose_channels(audio, channels, source=sample_where(sample)["source"],
                                     key=sample.get(KEY))
        yield out


@functional_datapipe("select_channel")
class ChannelPickerIterDataPipe(IterDataPipe[Sample]):
    """Keep one channel of each sample's audio (functional name: ``select_channel``).

    Consumes samples with ``audio`` ``(samples, channels)`` (or mono ``(samples,)``, which
    channel 0 leaves as it is) and yields them with ``audio`` ``(samples,)``: that channel,
    contiguous. Lengths and durations are unchanged. Use ``downmix`` to average the channels
    instead, or ``decode(channels=i)`` / ``load_audio(channels=i)`` to do it while decoding.

    Args:
        source_datapipe: samples.
        channel: index of the channel to keep (0 is the first).

    Errors: audio without that channel raises :class:`~speechpipe.errors.DataError` naming
    the key and the channel count.

    >>> from speechpipe import IterableWrapper
    >>> stereo = np.stack([np.zeros(3, np.float32), np.ones(3, np.float32)], axis=1)
    >>> [s["audio"] for s in IterableWrapper([{"key": "u1", "audio": stereo,
    ...                                        "sample_rate": 8000}]).select_channel(1)]
    [array([1., 1., 1.], dtype=float32)]
    """

    holds_nothing = True  # item by item: nothing kept between two yields

    def __init__(self, source_datapipe: IterDataPipe, channel: int = 0) -> None:
        if isinstance(channel, str):
            raise TypeError(f"channel must be an int index, got {channel!r}")
        self.channel = check_channels(channel)
        self.source_datapipe = source_datapipe

    def __iter__(self) -> Iterator[Sample]:
        yield from _choose(self.source_datapipe, "select_channel", self.channel)

    def __len__(self) -> int:
        return source_len(self)


ChannelPicker = ChannelPickerIterDataPipe


@functional_datapipe("downmix")
class DownmixerIterDataPipe(IterDataPipe[Sample]):
    """Average the channels of each sample's audio (functional name: ``downmix``).

    Consumes samples with ``audio`` ``(samples, channels)`` and yields them with ``audio``
    ``(samples,)`` float32, the mean of the channels (computed in float64); mono audio passes
    unchanged. Lengths and durations are unchanged. ``select_channel`` keeps one channel
    instead; ``decode(channels="downmix")`` / ``load_audio(channels="downmix")`` downmix while
    decoding.

    Args:
        source_datapipe: samples.

    >>> from speechpipe import IterableWrapper
    >>> stereo = np.stack([np.zeros(3, np.float32), np.ones(3, np.float32)], axis=1)
    >>> [s["audio"] for s in IterableWrapper([{"key": "u1", "audio": stereo,
    ...                                        "sample_rate": 8000}]).downmix()]
    [array([0.5, 0.5, 0.5], dtype=float32)]
    """

    holds_nothing = True  # item by item: nothing kept between two yields

    def __init__(self, source_datapipe: IterDataPipe) -> None:
        self.source_datapipe = source_datapipe

    def __iter__(self) -> Iterator[Sample]:
        yield from _choose(self.source_datapipe, "downmix", "downmix")

    def __len__(self) -> int:
        return source_len(self)


Downmixer = DownmixerIterDataPipe
