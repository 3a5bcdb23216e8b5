"""Features: Kaldi fbank / MFCC and mel spectrograms of audio, per sample or per batch.

:func:`compute_features` and :func:`batch_features` compute the numbers of the reference they
wrap (:mod:`torchaudio.compliance.kaldi`, :class:`torchaudio.transforms.MelSpectrogram`);
:func:`num_frames` and :func:`mel_num_frames` give the frame count from the number of samples
before computing; ``compute_features`` (:class:`FeatureComputerIterDataPipe`) is the stage.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any, Callable, Iterator, Mapping

import numpy as np
import torch
import torchaudio.transforms as taT
from torchaudio.compliance import kaldi

from ...diagnostics import Diagnostics, check_on_error
from ...errors import check_int, DataError, SampleRateError
from ...sample import AUDIO, FEATS, KEY, SAMPLE_RATE, Sample, len_key
from ._common import (
    audio_of, check_real, check_sample, sample_where, source_len, to_tensor, torch_generator,
)
from .._core import functional_datapipe, IterDataPipe
from .._core import check_seed, Seeded
from ._fbank import fbank, FbankOptions, log_mel, LogMelOptions, mfcc, MfccOptions

__all__ = [
    "BACKENDS",
    "FEATURE_KINDS",
    "FeatureComputer",
    "FeatureComputerIterDataPipe",
    "KALDI_SCALE",
    "SPEECH_DEFAULTS",
    "batch_features",
    "compute_features",
    "mel_num_frames",
    "num_frames",
]

#: ``compute_features`` kinds: Kaldi filterbanks and MFCCs, torchaudio mel spectrograms.
FEATURE_KINDS = ("fbank", "mel", "mfcc")
#: Who computes Kaldi ``fbank``/``mfcc``: speechpipe's vectorised
#: :mod:`~speechpipe.pipes.audio._fbank` (default) or :mod:`torchaudio.compliance.kaldi`.
#: ``mel`` with ``log=True`` and only :class:`~speechpipe.pipes.audio._fbank.LogMelOptions`'
#: options is speechpipe's :func:`~speechpipe.pipes.audio._fbank.log_mel` too; other ``mel``
#: settings (``log=False``, ``pad``, ``window_fn``, ``normalized``...) are torchaudio's
#: :class:`~torchaudio.transforms.MelSpectrogram` under either backend.
BACKENDS = ("speechpipe", "torchaudio")
_LOG_MEL_FIELDS = {f.name for f in dataclasses.fields(LogMelOptions)}
#: Kaldi reads 16-bit samples as integers; soundfile gives [-1, 1]. Scaling by this makes
#: ``fbank``/``mfcc`` (and ``dither``) match Kaldi's ``compute-*-feats`` on 16-bit audio.
KALDI_SCALE = 32768.0

_MS = 0.001  # torchaudio.compliance.kaldi's MILLISECONDS_TO_SECONDS


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


#: Speech defaults where the reference's are not (torchaudio: 23 fbank bins, 128 mels):
#: 80 bins, what ASR recipes (Kaldi's fbank configs, ESPnet, WeNet, icefall) train on. MFCC
#: keeps Kaldi's own (13 cepstra from 23 bins).
SPEECH_DEFAULTS = {"fbank": {"num_mel_bins": 80}, "mel": {"n_mels": 80}}


class FeatureExtractor:
    """One feature configuration: kind, scale, backend and the reference function's options."""

    def __init__(self, kind: str, scale: float | None, options: Mapping[str, Any],
                 backend: str = "speechpipe") -> None:
        if kind not in FEATURE_KINDS:
            raise ValueError(f"kind must be one of {FEATURE_KINDS}, got {kind!r}")
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        allowed = _allowed_options(kind)
        options = {**SPEECH_DEFAULTS.get(kind, {}), **options}
        for name in options:
            if name == "dither":
                raise TypeError("give dither= to compute_features itself (it is seeded), not "
                                "as a torchaudio option")
            if name in ("sample_frequency", "sample_rate"):
                raise TypeError(f"{name} is read from each sample's 'sample_rate'; do not pass "
                                "it (compute_features(sample_rate=...) refuses other rates)")
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
            if "log_floor" in options and not check_real("log_floor", options["log_floor"]) > 0:
                raise ValueError(f"log_floor must be > 0, got {options['log_floor']!r}")
        if scale is None:
            scale = 1.0 if kind == "mel" else KALDI_SCALE
        if check_real("scale", scale) <= 0:
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
        self.backend = backend
        self.ours = None  # speechpipe's options, when it computes
        if backend == "speechpipe" and (kind != "mel" or (
                self.log and set(self.options) - {"log"} <= _LOG_MEL_FIELDS)):
            cls = {"fbank": FbankOptions, "mfcc": MfccOptions, "mel": LogMelOptions}[kind]
            try:
                self.ours = cls(**{k: v for k, v in self.options.items() if k != "log"})
            except (TypeError, ValueError) as exc:
                raise ValueError(f"compute_features(kind={kind!r}) options {self.options} are "
                                 f"rejected: {exc}") from exc
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
        if self.ours is not None:
            return self.batch(waveform, None, rate)[0]
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

    def batch(self, waveform: torch.Tensor, lengths: torch.Tensor | None, rate: int,
              dither: float = 0.0, generator: torch.Generator | None = None
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """speechpipe's ``fbank``/``mfcc``/``log_mel`` of a scaled waveform, one utterance or
        a batch."""
        compute = {"fbank": fbank, "mfcc": mfcc, "mel": log_mel}[self.kind]
        return compute(waveform, lengths, sample_rate=rate, options=self.ours, dither=dither,
                       generator=generator)


@functools.lru_cache(maxsize=16)
def _cached_extractor(kind: str, scale: float | None, frozen: tuple, backend: str
                      ) -> FeatureExtractor:
    options = {k: dict(v) if k == "wkwargs" and v is not None else v for k, v in frozen}
    return FeatureExtractor(kind, scale, options, backend)


def _extractor(kind: str, scale: float | None, options: Mapping[str, Any],
               backend: str = "speechpipe") -> FeatureExtractor:
    try:
        return _cached_extractor(kind, scale, _freeze(options), backend)
    except TypeError as exc:
        if "unhashable" not in str(exc):
            raise
        return FeatureExtractor(kind, scale, options, backend)


def _prepare(
    audio: np.ndarray | torch.Tensor,
    extractor: FeatureExtractor,
    dither: float,
    generator: torch.Generator | None,
) -> torch.Tensor:
    waveform = audio if isinstance(audio, torch.Tensor) else to_tensor(audio)
    waveform = waveform * extractor.scale if extractor.scale != 1.0 else waveform
    if dither != 0.0:
        noise = torch.randn(waveform.shape[0], generator=generator, dtype=waveform.dtype)
        waveform = waveform + noise * dither
    return waveform


def extract_features(
    audio: np.ndarray,
    rate: int,
    extractor: FeatureExtractor,
    dither: float,
    generator: torch.Generator | None,
    sample: Mapping[str, Any],
) -> np.ndarray:
    """Features of one waveform: ``(frames, dim)``, or ``(frames, channels, dim)`` for
    ``(samples, channels)`` audio (each channel's own features, dither drawn channel after
    channel); errors name ``sample``'s key and source."""
    if audio.ndim == 2:
        return np.stack([extract_features(np.ascontiguousarray(audio[:, c]), rate, extractor, dither,
                                      generator, sample) for c in range(audio.shape[1])], axis=1)
    n = audio.shape[0]
    least = extractor.min_samples(rate)
    if n < least:
        raise DataError(f"compute_features: audio of {n} samples is shorter than one "
                        f"{extractor.kind} frame ({least} samples at {rate} Hz)",
                        **sample_where(sample))
    waveform = _prepare(audio, extractor, dither, generator)
    try:
        feats = extractor(waveform, rate)
    except Exception as exc:  # torchaudio validates with assert / Exception
        raise DataError(f"compute_features: {extractor.backend}'s {extractor.kind} failed at "
                        f"{rate} Hz: {type(exc).__name__}: {exc}", **sample_where(sample)) from exc
    return np.ascontiguousarray(feats.numpy(), dtype=np.float32)


def compute_features(
    audio: np.ndarray,
    sample_rate: int,
    kind: str = "fbank",
    *,
    dither: float = 0.0,
    generator: torch.Generator | None = None,
    scale: float | None = None,
    backend: str = "speechpipe",
    **options: Any,
) -> np.ndarray:
    """Features of one waveform: ``(frames, dim)`` float32; ``(frames, channels, dim)`` for
    ``(samples, channels)`` audio, each channel computed alone (time first, like the audio).

    ``kind="fbank"``/``"mfcc"`` compute Kaldi's features with
    :func:`speechpipe.pipes.audio._fbank.fbank`/``mfcc`` (``backend="speechpipe"``, the
    default: :func:`torchaudio.compliance.kaldi.fbank`'s numbers to float32 rounding, same
    frame counts, faster) or with torchaudio's own functions (``backend="torchaudio"``), with
    ``options`` (torchaudio's names and defaults: ``num_mel_bins``, ``frame_length``,
    ``frame_shift``, ``energy_floor``, ``snip_edges``, ``num_ceps``...); ``kind="mel"``
    runs :class:`torchaudio.transforms.MelSpectrogram` with ``options`` (``n_fft``,
    ``win_length``, ``hop_length``, ``n_mels``, ``f_min``, ``center``...) plus ``log``
    (``clamp(min=log_floor).log()``, as ESPnet's log-mel) and ``log_floor`` (1e-10), and
    transposes to ``(frames, n_mels)`` (with ``log=True`` and only
    :class:`~speechpipe.pipes.audio._fbank.LogMelOptions`' options, speechpipe's
    :func:`~speechpipe.pipes.audio._fbank.log_mel` computes those numbers unless
    ``backend="torchaudio"``). The sample rate is passed to them from ``sample_rate``.

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
    if audio.ndim not in (1, 2):
        raise ValueError(f"compute_features needs (samples,) or (samples, channels) audio, got "
                         f"shape {audio.shape}")
    extractor = _extractor(kind, scale, options, backend)
    return extract_features(audio, int(sample_rate), extractor, float(dither), generator, {})


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
    backend: str = "speechpipe",
    device: str | torch.device | None = None,
    **options: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Features of a collated batch: ``(feats (B, T', D) float32, feats_len (B,) int64)``.

    ``batch`` is what :class:`~speechpipe.pipes.collate.PadCollate` makes of samples with
    audio: ``audio`` ``(B, T)``, ``audio_len`` ``(B,)`` and ``sample_rate`` (one rate);
    ``audio`` ``(B, T, C)`` (several channels) gives ``feats`` ``(B, T', C, D)``.
    ``kind``, ``dither``, ``generator``, ``scale``, ``backend`` and ``options`` are those of
    :func:`compute_features`. Row ``i`` holds the features of its first ``audio_len[i]``
    samples (those :func:`compute_features` gives for them), then zeros up to ``T' =
    max(feats_len)``; ``feats_len`` is the exact frame count of each length. Dither noise is
    drawn row by row (channel after channel), as the samples would draw it one by one.

    ``fbank``/``mfcc`` with ``backend="speechpipe"`` are computed in one call for the whole
    batch (one per channel; :func:`speechpipe.pipes.audio._fbank.fbank`: no frame is computed
    from padding), on ``device`` (default: where ``audio`` is), and the results are there.
    Otherwise (and for several channels with dither) the features are computed once per row
    on the row's real samples, on the CPU, and the results are moved to ``device``: Kaldi's
    functions take one utterance, and one ``MelSpectrogram`` call on the whole ``(B, T)``
    tensor measured 1.0-1.8× slower per real second than the loop
    (``benchmarks/bench_audio.py``) and differs near each row's end (zero padding instead of
    reflection).

    >>> batch = {"audio": torch.zeros(2, 16000), "audio_len": torch.tensor([16000, 8000]),
    ...          "sample_rate": torch.tensor([16000, 16000])}
    >>> feats, lengths = batch_features(batch, num_mel_bins=80)
    >>> tuple(feats.shape), lengths.tolist()
    ((2, 98, 80), [98, 48])
    """
    extractor = _extractor(kind, scale, options, backend)
    return _batch_features(batch, extractor, float(dither), generator,
                           None if device is None else torch.device(device))


def _batch_features(
    batch: Mapping[str, Any],
    extractor: FeatureExtractor,
    dither: float,
    generator: torch.Generator | None,
    device: torch.device | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    audio, lengths = batch.get(AUDIO), batch.get(len_key(AUDIO))
    if audio is None or lengths is None:
        raise DataError(f"compute_features(batched=True): the batch needs {AUDIO!r} and "
                        f"{len_key(AUDIO)!r} (from PadCollate), got {sorted(batch)}",
                        **_batch_where(batch))
    audio = torch.as_tensor(audio)
    if audio.ndim not in (2, 3) or not audio.is_floating_point():
        raise DataError(f"compute_features(batched=True): {AUDIO!r} must be a float (batch, "
                        f"samples) or (batch, samples, channels) tensor, got "
                        f"{tuple(audio.shape)} {audio.dtype}", **_batch_where(batch))
    device = audio.device if device is None else device
    mono = audio.ndim == 2
    audio = (audio.unsqueeze(2) if mono else audio).to(device=device, dtype=torch.float32)
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
    if extractor.ours is not None and (mono or dither == 0.0):  # one call a channel, on device
        waveform = audio * extractor.scale if extractor.scale != 1.0 else audio
        out = [extractor.batch(waveform[:, :, c].contiguous(), lengths, rate, dither, generator)
               for c in range(audio.shape[2])]
        return out[0] if mono else (torch.stack([f for f, _ in out], dim=2), out[0][1])
    audio = audio.cpu()
    # row by row, channel after channel: the dither draws of the samples one by one
    rows = [[_prepare(audio[i, :n, c].contiguous(), extractor, dither, generator)
             for c in range(audio.shape[2])] for i, n in enumerate(lengths)]
    frames = [extractor.num_frames(n, rate) for n in lengths]
    feats = torch.zeros(len(rows), max(frames), audio.shape[2], extractor.dim)
    for i, row in enumerate(rows):
        for c, waveform in enumerate(row):
            try:
                one = extractor(waveform, rate)
            except Exception as exc:  # torchaudio validates with assert / Exception
                raise DataError(f"compute_features: {extractor.backend}'s {extractor.kind} "
                                f"failed at {rate} Hz: {type(exc).__name__}: {exc}",
                                **_batch_where(batch, i)) from exc
            feats[i, : one.shape[0], c] = one
    feats = feats.squeeze(2) if mono else feats
    return feats.to(device), torch.tensor(frames, dtype=torch.int64, device=device)


@functional_datapipe("compute_features")
class FeatureComputerIterDataPipe(Seeded, IterDataPipe[Sample]):
    """Kaldi fbank / MFCC or mel spectrogram features (functional name: ``compute_features``).

    Consumes samples with ``audio`` ``(samples,)`` and ``sample_rate``; yields them with
    ``feats`` ``(frames, dim)`` float32 computed by :func:`compute_features` (audio of several
    channels ``(samples, channels)`` gives ``(frames, channels, dim)``) -- the numbers of
    :func:`torchaudio.compliance.kaldi.fbank` / ``mfcc`` (by speechpipe's vectorised
    :mod:`~speechpipe.pipes.audio._fbank` to float32 rounding, or by torchaudio itself with
    ``backend="torchaudio"``) or :class:`torchaudio.transforms.MelSpectrogram` on ``audio ×
    scale`` (plus dither). With ``batched=True`` it consumes collated batches
    (``PadCollate``: ``audio`` ``(B, T)``, ``audio_len``, ``sample_rate``) and adds ``feats``
    ``(B, T', D)`` and ``feats_len`` (:func:`batch_features`; ``(B, T, C)`` audio gives
    ``(B, T', C, D)``) on ``device``: row ``i`` holds what the per-sample stage gives for
    sample ``i`` (same options, seed and dither draws), then zeros. With
    ``backend="speechpipe"`` Kaldi ``fbank``/``mfcc`` is one vectorised call per batch, run on
    ``device``, so workers can only decode and the features be computed where the model runs
    (after ``build_loader(..., device=...)``); torchaudio's functions run row by row on the
    CPU and the result is moved.

    One pipe for the three kinds, not three verbs: they share input, output, dither, seeding,
    frame counting, batching and error handling; only the reference function differs, and its
    options are passed through unchanged (an unknown option is a ``TypeError`` naming the
    allowed ones; bad values fail in the constructor, which runs the reference once on
    silence).

    Args:
        source_datapipe: samples (or batches with ``batched=True``).
        kind: ``"fbank"``, ``"mfcc"`` (Kaldi's, with :mod:`torchaudio.compliance.kaldi`'s
            options) or ``"mel"`` (:class:`torchaudio.transforms.MelSpectrogram`, plus
            ``log``/``log_floor``).
        dither: standard deviation of Gaussian noise added to the scaled waveform (0: none,
            exact reference output). Seeded by ``(seed, epoch, rank, worker)`` through a
            ``torch.Generator``, never torch's global generator; see :func:`compute_features`.
        seed: base seed of the dither.
        scale: waveform scale before the reference (default 32768 for ``fbank``/``mfcc``,
            Kaldi's 16-bit range; 1.0 for ``mel``).
        batched: consume collated batches instead of samples.
        device: with ``batched=True``, where features are computed and returned (``"cpu"``,
            ``"cuda:0"``...); default: where each batch's ``audio`` is.
        keep_audio: keep ``audio`` (and ``audio_len``) in the output; by default it is
            dropped (batches carry ``feats`` only, and later buffers hold less).
        sample_rate: the rate (Hz) the features are meant for: audio at any other rate raises
            :class:`~speechpipe.errors.SampleRateError` naming the key (put ``resample`` before
            this stage), whatever ``on_error`` says -- features at the wrong rate would have
            the wrong frame count and mel scale. ``None``: computed at each sample's own rate.
        on_error: ``"raise"`` a :class:`~speechpipe.errors.DataError` naming the key for audio
            shorter than one frame (or that torchaudio refuses), or ``"skip"`` the sample (the
            whole batch with ``batched=True``), count it in :attr:`diagnostics` and warn at
            the end of the pass.
        backend: who computes ``fbank``/``mfcc``: ``"speechpipe"``
            (:func:`speechpipe.pipes.audio._fbank.fbank`, vectorised, one call per batch) or
            ``"torchaudio"`` (:mod:`torchaudio.compliance.kaldi`, bit for bit); see
            :data:`BACKENDS`.
        **options: the reference function's options (default 80 bins for ``fbank`` and
            ``mel``: :data:`SPEECH_DEFAULTS`; ``num_mel_bins``, ``frame_length=25.0``, ``frame_shift=10.0``, ``energy_floor``, ``snip_edges``,
            ``num_ceps``, ``n_fft``, ``hop_length``, ``n_mels``...).

    :meth:`num_frames` gives the exact number of frames for a number of samples, so that a
    length-aware batcher can be told frame lengths before features exist.

    >>> from speechpipe import IterableWrapper
    >>> rows = [{"key": "u1", "audio": np.zeros(16000, np.float32), "sample_rate": 16000}]
    >>> pipe = IterableWrapper(rows).compute_features("fbank", num_mel_bins=80)
    >>> [s["feats"].shape for s in pipe], pipe.num_frames(16000, 16000)
    ([(98, 80)], 98)
    >>> from speechpipe import PadCollate
    >>> rows = [{"key": k, "audio": np.zeros(n, np.float32), "sample_rate": 16000}
    ...         for k, n in (("a", 16000), ("b", 8000))]
    >>> batches = IterableWrapper([rows]).collate(PadCollate(fields=("key", "audio",
    ...                                                               "sample_rate")))
    >>> [batch] = batches.compute_features("fbank", batched=True, device="cpu")
    >>> tuple(batch["feats"].shape), batch["feats_len"].tolist(), batch["feats"].device.type
    ((2, 98, 80), [98, 48], 'cpu')
    """

    holds_nothing = True  # item by item: nothing kept between two yields

    def __init__(
        self,
        source_datapipe: IterDataPipe,
        kind: str = "fbank",
        *,
        dither: float = 0.0,
        seed: int = 0,
        scale: float | None = None,
        batched: bool = False,
        device: str | torch.device | None = None,
        keep_audio: bool = False,
        sample_rate: int | None = None,
        on_error: str = "raise",
        backend: str = "speechpipe",
        **options: Any,
    ) -> None:
        dither = check_real("dither", dither)
        self.sample_rate = None if sample_rate is None else check_int("sample_rate",
                                                                      sample_rate, 1)
        if dither < 0:
            raise ValueError(f"dither must be >= 0, got {dither!r}")
        for name, value in (("batched", batched), ("keep_audio", keep_audio)):
            if not isinstance(value, bool):
                raise TypeError(f"{name} must be a bool, got {value!r}")
        if device is not None:
            if not batched:
                raise ValueError("device goes with batched=True (features of a batch where "
                                 "the model runs); per sample, features are computed where "
                                 "the sample is")
            try:
                device = torch.device(device)
            except (RuntimeError, TypeError) as exc:
                raise ValueError(f"device must name a torch device, got {device!r}") from exc
        self.extractor = FeatureExtractor(kind, scale, options, backend)
        self.kind = kind
        self.device: torch.device | None = device
        self.dither = dither
        self.seed = check_seed(seed)
        self.epoch = 0
        self.batched = batched
        self.keep_audio = keep_audio
        self.on_error = check_on_error(on_error)
        self.diagnostics = Diagnostics("compute_features")
        self.source_datapipe = source_datapipe

    @property
    def draws_in_sequence(self) -> bool:  # type: ignore[override]
        """Only dither draws (the features of a sample are otherwise a function of it)."""
        return bool(self.dither)

    @property
    def dim(self) -> int:
        """Feature dimension (columns of ``feats``)."""
        return self.extractor.dim

    def num_frames(self, num_samples: int, sample_rate: int) -> int:
        """Frames this configuration gives for ``num_samples`` samples at ``sample_rate``."""
        return self.extractor.num_frames(int(num_samples), int(sample_rate))

    def __iter__(self) -> Iterator[Sample]:
        self._begin_pass()
        self.diagnostics.reset()
        generator = (torch_generator(self.seed, self.epoch, "compute_features")
                     if self.dither else None)
        for item in self.source_datapipe:
            try:
                out = self._batch(item, generator) if self.batched else self._one(item, generator)
            except SampleRateError:
                raise  # a pipeline without the resample it needs: not a bad sample to skip
            except DataError as err:
                self.diagnostics.handle(self.on_error, err, _skip_reason(err))
                continue
            yield out
        self.diagnostics.warn_if_skipped()

    def _one(self, sample: Mapping[str, Any], generator) -> Sample:
        audio, rate = audio_of(sample, "compute_features")
        self._check_rate(rate, sample_where(sample))
        feats = extract_features(audio, rate, self.extractor, self.dither, generator, sample)
        out = dict(sample)
        out[FEATS] = feats
        if not self.keep_audio:
            del out[AUDIO]
        return out

    def _batch(self, batch: Mapping[str, Any], generator) -> dict:
        check_sample(batch, "compute_features")
        if self.sample_rate is not None and SAMPLE_RATE in batch:
            self._check_rate(_batch_rate(batch), _batch_where(batch))
        feats, lengths = _batch_features(batch, self.extractor, self.dither, generator,
                                         self.device)
        out = dict(batch)
        if not self.keep_audio:
            out.pop(AUDIO, None)
            out.pop(len_key(AUDIO), None)
        out[FEATS] = feats
        out[len_key(FEATS)] = lengths
        return out

    def _check_rate(self, rate: int, where: Mapping[str, Any]) -> None:
        if self.sample_rate is not None and rate != self.sample_rate:
            raise SampleRateError(
                f"compute_features({self.kind!r}, sample_rate={self.sample_rate}) got "
                f"{rate} Hz audio; resample it first (pipe.resample({self.sample_rate}))",
                **where)

    def __len__(self) -> int:
        if self.on_error != "raise":
            raise TypeError(f"compute_features(on_error={self.on_error!r}) has no len(): "
                            "skipped samples are known only after computing; use "
                            "on_error='raise' for a length")
        return source_len(self)


FeatureComputer = FeatureComputerIterDataPipe


def _skip_reason(error: DataError) -> str:
    if "shorter than one" in error.reason:
        return "audio shorter than a frame"
    if "torchaudio" in error.reason:
        return "audio refused by torchaudio"
    return "sample without usable audio"

