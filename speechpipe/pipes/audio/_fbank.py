"""Kaldi-compatible fbank and MFCC, and log-mel, in vectorised torch, for one utterance or a
padded batch.

:func:`fbank` and :func:`mfcc` compute the numbers of :func:`torchaudio.compliance.kaldi.fbank`
and ``mfcc`` (Kaldi's ``compute-fbank-feats`` / ``compute-mfcc-feats``) with the same options
and exactly the same frame counts, to float32 rounding, for a 1-D waveform or a padded ``(B,
T)`` batch with per-row ``lengths``; :func:`log_mel` does the same for
:class:`torchaudio.transforms.MelSpectrogram` followed by ``clamp(min=floor).log()``:

- each row's frames are a strided view of the row (``as_strided``; with ``snip_edges=False``
  of the row reflected at its own ends, as Kaldi reflects), taken in chunks of about 1 MB of
  FFT input so that every step of a chunk works in the cache;
- DC removal writes the one frame-sized copy, pre-emphasis writes from it straight into a
  zero-padded FFT buffer reused by every chunk, the window multiplies that buffer in place;
- one ``torch.fft.rfft`` per chunk; the power spectrum is ``re² + im²`` (no ``abs``, no square
  root); the mel product runs in blocks of 16 filters over the FFT bins each block uses;
- the window, mel matrix, DCT and lifter are cached per (options, sample rate, device, dtype).

Measurements: ``benchmarks/README.md``, "Kaldi fbank".

In a batch, row ``b``'s frames are those the row alone gives: padding never enters a frame of
the row, and frames past the row's count are zero and not counted in the returned lengths.
Dither noise (``dither × N(0, 1)``, drawn per sample of each row's real samples from
``generator``, row after row) is what :func:`~speechpipe.pipes.audio._features.compute_features`
adds; VTLN warping is not supported (``vtln_warp`` must be 1.0).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Iterator

import torch
import torchaudio.functional as taF
from torchaudio.compliance import kaldi as ta_kaldi

__all__ = [
    "FbankOptions",
    "LogMelOptions",
    "MfccOptions",
    "WINDOW_TYPES",
    "fbank",
    "fbank_frames",
    "log_mel",
    "mfcc",
]

#: Kaldi's window types (``window_type``).
WINDOW_TYPES = ("hamming", "hanning", "povey", "rectangular", "blackman")
_EPS = torch.finfo(torch.float32).eps  # Kaldi's floor for log of power and energy
_MS = 0.001
#: FFT input computed at a time: one chunk of frames stays in the cache through all steps.
_CHUNK_BYTES = 1 << 20
#: Mel filters per matrix product: the blocks skip the FFT bins where all their filters are 0.
_MEL_BLOCK = 16


@dataclasses.dataclass(frozen=True)
class FbankOptions:
    """Kaldi fbank options; names and defaults of :func:`torchaudio.compliance.kaldi.fbank`.

    ``sample_frequency`` is the functions' ``sample_rate`` argument; ``dither`` theirs too
    (seeded); ``channel`` and ``min_duration`` do not apply. Bad values raise ``ValueError``
    here (torchaudio asserts); the ones that depend on the sample rate when computing.

    >>> FbankOptions(num_mel_bins=80).num_mel_bins
    80
    """

    blackman_coeff: float = 0.42
    energy_floor: float = 1.0
    frame_length: float = 25.0
    frame_shift: float = 10.0
    high_freq: float = 0.0
    htk_compat: bool = False
    low_freq: float = 20.0
    num_mel_bins: int = 23
    preemphasis_coefficient: float = 0.97
    raw_energy: bool = True
    remove_dc_offset: bool = True
    round_to_power_of_two: bool = True
    snip_edges: bool = True
    subtract_mean: bool = False
    use_energy: bool = False
    use_log_fbank: bool = True
    use_power: bool = True
    vtln_high: float = -500.0
    vtln_low: float = 100.0
    vtln_warp: float = 1.0
    window_type: str = "povey"

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.type == "bool" and not isinstance(value, bool):
                raise TypeError(f"{field.name} must be a bool, got {value!r}")
            if field.type == "float" and (isinstance(value, bool)
                                          or not isinstance(value, (int, float))):
                raise TypeError(f"{field.name} must be a number, got {value!r}")
        if isinstance(self.num_mel_bins, bool) or not isinstance(self.num_mel_bins, int):
            raise TypeError(f"num_mel_bins must be an int, got {self.num_mel_bins!r}")
        if self.num_mel_bins <= 3:
            raise ValueError(f"num_mel_bins must be > 3, got {self.num_mel_bins}")
        if self.window_type not in WINDOW_TYPES:
            raise ValueError(f"window_type must be one of {WINDOW_TYPES}, got "
                             f"{self.window_type!r}")
        if not 0.0 <= self.preemphasis_coefficient <= 1.0:
            raise ValueError(f"preemphasis_coefficient must be in [0, 1], got "
                             f"{self.preemphasis_coefficient}")
        if self.frame_length <= 0 or self.frame_shift <= 0:
            raise ValueError(f"frame_length and frame_shift must be > 0 ms, got "
                             f"{self.frame_length}, {self.frame_shift}")
        if self.energy_floor < 0:
            raise ValueError(f"energy_floor must be >= 0, got {self.energy_floor}")
        if self.vtln_warp != 1.0:
            raise ValueError(f"VTLN is not supported: vtln_warp must be 1.0, got "
                             f"{self.vtln_warp} (use torchaudio.compliance.kaldi)")


@dataclasses.dataclass(frozen=True)
class MfccOptions(FbankOptions):
    """Kaldi MFCC options: :class:`FbankOptions` plus ``num_ceps`` and ``cepstral_lifter``
    (names and defaults of :func:`torchaudio.compliance.kaldi.mfcc`; ``use_log_fbank`` and
    ``use_power`` stay True, as there).

    >>> MfccOptions().num_ceps
    13
    """

    num_ceps: int = 13
    cepstral_lifter: float = 22.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.num_ceps, bool) or not isinstance(self.num_ceps, int):
            raise TypeError(f"num_ceps must be an int, got {self.num_ceps!r}")
        if not 1 <= self.num_ceps <= self.num_mel_bins:
            raise ValueError(f"num_ceps must be in [1, num_mel_bins={self.num_mel_bins}], got "
                             f"{self.num_ceps}")
        if not (self.use_log_fbank and self.use_power):
            raise ValueError("MFCCs are computed from log power fbanks: use_log_fbank and "
                             "use_power must be True")


def _options(cls: type, options: FbankOptions | None, kwargs: dict[str, Any]) -> FbankOptions:
    if options is None:
        return cls(**kwargs)
    if not isinstance(options, cls):
        raise TypeError(f"options must be a {cls.__name__}, got {type(options).__name__}")
    return dataclasses.replace(options, **kwargs) if kwargs else options


@dataclasses.dataclass(frozen=True)
class _Geometry:
    size: int  # window in samples
    shift: int
    padded: int  # FFT length


@functools.lru_cache(maxsize=64)
def _geometry(options: FbankOptions, rate: float) -> _Geometry:
    shift = int(rate * options.frame_shift * _MS)
    size = int(rate * options.frame_length * _MS)
    padded = 1 << (size - 1).bit_length() if options.round_to_power_of_two else size
    if size < 2 or shift < 1:
        raise ValueError(f"frame_length={options.frame_length} ms, frame_shift="
                         f"{options.frame_shift} ms give a window of {size} and a shift of "
                         f"{shift} samples at {rate} Hz (need >= 2 and >= 1)")
    if padded % 2:
        raise ValueError(f"the FFT length {padded} must be even: use round_to_power_of_two "
                         f"or change frame_length")
    nyquist = 0.5 * rate
    high = options.high_freq + nyquist if options.high_freq <= 0 else options.high_freq
    if not (0.0 <= options.low_freq < nyquist and 0.0 < high <= nyquist
            and options.low_freq < high):
        raise ValueError(f"low_freq={options.low_freq}, high_freq={options.high_freq} give "
                         f"[{options.low_freq}, {high}] Hz, outside (0, {nyquist}] at {rate} Hz")
    return _Geometry(size, shift, padded)


def _window(options: FbankOptions, size: int, dtype: torch.dtype) -> torch.Tensor:
    """Kaldi's window, built in ``dtype`` as torchaudio builds it."""
    kind = options.window_type
    if kind == "rectangular":
        return torch.ones(size, dtype=dtype)
    if kind == "hamming":
        return torch.hamming_window(size, periodic=False, alpha=0.54, beta=0.46, dtype=dtype)
    if kind == "blackman":
        a = 2 * math.pi / (size - 1)
        n = torch.arange(size, dtype=dtype)
        c = options.blackman_coeff
        return c - 0.5 * torch.cos(a * n) + (0.5 - c) * torch.cos(2 * a * n)
    hann = torch.hann_window(size, periodic=False, dtype=dtype)
    return hann.pow(0.85) if kind == "povey" else hann


@dataclasses.dataclass(frozen=True)
class _Tables:
    window: torch.Tensor  # (size,)
    # The (padded // 2 + 1, bins) mel matrix in blocks of _MEL_BLOCK filters, each with the
    # FFT bins where it is not zero: (first, last, filter columns, block (last - first, n)).
    mel_blocks: tuple[tuple[int, int, slice, torch.Tensor], ...]
    dct: torch.Tensor | None  # (bins, ceps), Kaldi's DCT
    lifter: torch.Tensor | None  # (ceps,)


def _mel_blocks(mel_t: torch.Tensor, device: torch.device, dtype: torch.dtype) -> tuple:
    """``mel_t`` (FFT bins, filters) in blocks of ``_MEL_BLOCK`` filters, each with the FFT
    bins where one of its filters is not zero: ``(first, last, columns, block)``."""
    blocks = []
    for start in range(0, mel_t.shape[1], _MEL_BLOCK):
        columns = slice(start, min(start + _MEL_BLOCK, mel_t.shape[1]))
        used = mel_t[:, columns].ne(0).any(dim=1).nonzero().flatten().tolist() or [0]
        first, last = used[0], used[-1] + 1
        block = mel_t[first:last, columns].contiguous().to(device=device, dtype=dtype)
        blocks.append((first, last, columns, block))
    return tuple(blocks)


def _apply_mel(power: torch.Tensor, blocks: tuple, out: torch.Tensor) -> None:
    for first, last, columns, block in blocks:
        torch.mm(power[:, first:last], block, out=out[:, columns])


@functools.lru_cache(maxsize=64)
def _tables(options: FbankOptions, rate: float, device: torch.device,
            dtype: torch.dtype) -> _Tables:
    geo = _geometry(options, rate)
    banks, _ = ta_kaldi.get_mel_banks(options.num_mel_bins, geo.padded, rate, options.low_freq,
                                      options.high_freq, options.vtln_low, options.vtln_high,
                                      options.vtln_warp)
    mel_t = torch.nn.functional.pad(banks, (0, 1)).T  # the Nyquist row zero, as torchaudio's
    blocks = _mel_blocks(mel_t, device, dtype)
    dct = lifter = None
    if isinstance(options, MfccOptions):
        bins = options.num_mel_bins
        dct = taF.create_dct(bins, bins, "ortho")
        dct[:, 0] = math.sqrt(1 / float(bins))
        dct = dct[:, : options.num_ceps].contiguous()
        if options.cepstral_lifter != 0.0:
            i = torch.arange(options.num_ceps)
            lifter = 1.0 + 0.5 * options.cepstral_lifter * torch.sin(
                math.pi * i / options.cepstral_lifter)

    def put(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.to(device=device, dtype=dtype)

    return _Tables(put(_window(options, geo.size, dtype)), blocks, put(dct), put(lifter))


def _frame_count(n: int, geo: _Geometry, snip_edges: bool) -> int:
    if snip_edges:
        return 0 if n < geo.size else 1 + (n - geo.size) // geo.shift
    return (n + geo.shift // 2) // geo.shift


def fbank_frames(lengths: torch.Tensor, options: FbankOptions, sample_rate: float
                 ) -> torch.Tensor:
    """Kaldi's frame count for each number of samples in ``lengths`` (an int tensor):
    ``1 + (n - window) // shift`` (0 when ``n < window``) with ``snip_edges``, else
    ``(n + shift // 2) // shift``; window and shift in samples as torchaudio rounds them.

    >>> fbank_frames(torch.tensor([16000, 400, 399]), FbankOptions(), 16000).tolist()
    [98, 1, 0]
    """
    geo = _geometry(options, float(sample_rate))
    counts = [_frame_count(n, geo, options.snip_edges) for n in lengths.tolist()]
    return torch.tensor(counts, dtype=torch.int64, device=lengths.device).view(lengths.shape)


def _batch(waveform: torch.Tensor, lengths: Any) -> tuple[torch.Tensor, list[int]]:
    """``(B, T)`` float waveform and its rows' lengths, checked."""
    if not isinstance(waveform, torch.Tensor):
        raise TypeError(f"waveform must be a torch.Tensor, got {type(waveform).__name__}")
    if not waveform.is_floating_point() or waveform.ndim not in (1, 2):
        raise ValueError(f"waveform must be a float (samples,) or (batch, samples) tensor, got "
                         f"{tuple(waveform.shape)} {waveform.dtype}")
    wave = waveform.unsqueeze(0) if waveform.ndim == 1 else waveform
    rows, width = wave.shape
    if lengths is None:
        return wave.contiguous(), [width] * rows
    if waveform.ndim == 1:
        raise ValueError("lengths are for a (batch, samples) waveform; a 1-D waveform is one "
                         "whole utterance")
    values = torch.as_tensor(lengths).reshape(-1).tolist()
    if len(values) != rows or not all(isinstance(n, int) and 0 <= n <= width for n in values):
        raise ValueError(f"lengths must be {rows} ints in [0, {width}] (the padded samples), "
                         f"got {values}")
    return wave.contiguous(), values


def _dithered(wave: torch.Tensor, lengths: list[int], dither: float,
              generator: torch.Generator | None) -> torch.Tensor:
    """``wave`` plus ``dither × N(0, 1)`` on each row's real samples, drawn row after row."""
    out = wave.clone()
    draw_on = generator.device if generator is not None else wave.device
    for b, n in enumerate(lengths):
        noise = torch.randn(n, generator=generator, dtype=wave.dtype, device=draw_on)
        out[b, :n] += noise.to(wave.device) * dither
    return out


def _row_frames(row: torch.Tensor, count: int, n: int, geo: _Geometry, snip_edges: bool
                ) -> torch.Tensor:
    """The ``(count, size)`` frames of one row's ``n`` real samples: a strided view of the row,
    or with ``snip_edges=False`` of the row reflected at its own ends as Kaldi's
    ``ExtractWindow`` does. Padding past ``n`` never enters a frame."""
    if not snip_edges:
        # Kaldi reflects until the index is in [0, n): -i - 1 below, 2n - 1 - i above;
        # in closed form: i mod 2n, folded at n.
        first = geo.shift // 2 - geo.size // 2
        span = (count - 1) * geo.shift + geo.size
        index = torch.remainder(torch.arange(first, first + span, device=row.device), 2 * n)
        row = row[torch.where(index < n, index, 2 * n - 1 - index)]
    return row.as_strided((count, geo.size), (geo.shift, 1))


def _chunks(wave: torch.Tensor, counts: list[int], lengths: list[int], geo: _Geometry,
            options: FbankOptions) -> Iterator[torch.Tensor]:
    """Every row's frames, row after row, in views of at most ``_CHUNK_BYTES`` of FFT input."""
    chunk = max(1, _CHUNK_BYTES // (geo.padded * wave.element_size()))
    for row, count, n in zip(wave, counts, lengths):
        if count:
            frames = _row_frames(row, count, n, geo, options.snip_edges)
            yield from frames.split(chunk)


def _log_energy(energy: torch.Tensor, floor: float) -> torch.Tensor:
    out = energy.clamp_min_(_EPS).log_()
    return out.clamp_min_(math.log(floor)) if floor != 0.0 else out


@dataclasses.dataclass
class _Mel:
    """Mel energies of the real frames of a batch, row after row, and their rows' counts."""

    mel: torch.Tensor  # (frames, bins), log if use_log_fbank
    energy: torch.Tensor | None  # (frames,) log energy with use_energy
    counts: list[int]  # frames of each row

    def padded(self, flat: torch.Tensor, subtract_mean: bool, batched: bool
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """``flat`` (frames, dim) as ``(B, max count, dim)`` (``(frames, dim)`` unless
        ``batched``), zero past each row's count, and the counts; with ``subtract_mean``
        each row's column means over its real frames removed."""
        rows = flat.split(self.counts)
        if subtract_mean:
            rows = [row - row.mean(dim=0, keepdim=True) if len(row) else row for row in rows]
        counts = torch.tensor(self.counts, dtype=torch.int64, device=flat.device)
        if not batched:
            return rows[0], counts[0]
        width = max(self.counts, default=0)
        if all(n == width for n in self.counts):
            return torch.stack(rows) if rows else flat.new_zeros(0, 0, flat.shape[-1]), counts
        out = flat.new_empty(len(rows), width, flat.shape[-1])
        for dst, row in zip(out, rows):  # one write of each element
            dst[: len(row)] = row
            dst[len(row):] = 0
        return out, counts


def _kaldi_mel(
    waveform: torch.Tensor,
    lengths: Any,
    sample_rate: float,
    options: FbankOptions,
    dither: float,
    generator: torch.Generator | None,
) -> _Mel:
    wave, lengths = _batch(waveform, lengths)
    rate = float(sample_rate)
    geo = _geometry(options, rate)
    tables = _tables(options, rate, wave.device, wave.dtype)
    counts = [_frame_count(n, geo, options.snip_edges) for n in lengths]
    if dither != 0.0:
        wave = _dithered(wave, lengths, dither, generator)
    total = sum(counts)
    mel = torch.empty(total, options.num_mel_bins, device=wave.device, dtype=wave.dtype)
    energy = (torch.empty(total, device=wave.device, dtype=wave.dtype) if options.use_energy
              else None)
    # The FFT input, reused by every chunk: zero past the window, pre-emphasis x[j] - c x[j-1]
    # (x[-1] = x[0]) written into it and rounded as torchaudio does, the window applied in place.
    scratch = torch.empty(0, geo.padded, device=wave.device, dtype=wave.dtype)
    c = options.preemphasis_coefficient
    start = 0
    for frames in _chunks(wave, counts, lengths, geo, options):
        count = frames.shape[0]
        if scratch.shape[0] < count:
            scratch = torch.empty(count, geo.padded, device=wave.device, dtype=wave.dtype)
            scratch[:, geo.size:] = 0
        buf, done = scratch[:count], slice(start, start + count)
        if options.remove_dc_offset:  # the one copy of the frames, chunk by chunk
            frames = frames - frames.mean(dim=-1, keepdim=True)
        if options.use_energy and options.raw_energy:
            energy[done] = frames.pow(2).sum(-1)
        head = buf[:, : geo.size]
        if c != 0.0:
            rest = buf[:, 1: geo.size]
            torch.mul(frames[:, :-1], c, out=rest)
            torch.sub(frames[:, 1:], rest, out=rest)
            torch.sub(frames[:, 0], frames[:, 0] * c, out=buf[:, 0])
        else:
            head.copy_(frames)
        head.mul_(tables.window)
        if options.use_energy and not options.raw_energy:
            energy[done] = head.pow(2).sum(-1)
        squares = torch.view_as_real(torch.fft.rfft(buf)).square_()  # (count, bins, 2)
        power = torch.add(squares[..., 0], squares[..., 1])  # re² + im², no abs' square root
        if not options.use_power:
            power.sqrt_()
        _apply_mel(power, tables.mel_blocks, mel[done])
        start += count
    if options.use_log_fbank:
        mel.clamp_min_(_EPS).log_()
    if energy is not None:
        energy = _log_energy(energy, options.energy_floor)
    return _Mel(mel, energy, counts)


def fbank(
    waveform: torch.Tensor,
    lengths: torch.Tensor | None = None,
    *,
    sample_rate: float,
    options: FbankOptions | None = None,
    dither: float = 0.0,
    generator: torch.Generator | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Kaldi filterbank features: ``(feats, frame counts)``.

    ``waveform`` is ``(samples,)`` -> ``feats`` ``(frames, bins)`` and a 0-d count, or a padded
    ``(B, T)`` batch with ``lengths`` ``(B,)`` (default: every row full) -> ``feats`` ``(B, F,
    bins)`` (``F`` the largest count; rows zero past their count) and counts ``(B,)`` int64.
    ``bins`` is ``num_mel_bins`` (+1 with ``use_energy``: log energy first, last with
    ``htk_compat``). Options come as ``options`` (:class:`FbankOptions`) or keywords (which
    override ``options``), with :func:`torchaudio.compliance.kaldi.fbank`'s names and defaults
    (23 bins); the waveform is in Kaldi's units (scale by 32768 for Kaldi's 16-bit features).
    Computed on the waveform's device and in its dtype. ``dither`` adds ``dither × N(0, 1)``
    per sample of each row's real samples, drawn row after row from ``generator``.
    Fewer samples than one window give no frame (``snip_edges``) instead of torchaudio's error.

    >>> feats, count = fbank(torch.zeros(16000), sample_rate=16000, num_mel_bins=80)
    >>> tuple(feats.shape), int(count)
    ((98, 80), 98)
    >>> feats, counts = fbank(torch.zeros(2, 16000), torch.tensor([16000, 8000]),
    ...                       sample_rate=16000)
    >>> tuple(feats.shape), counts.tolist()
    ((2, 98, 23), [98, 48])
    """
    options = _options(FbankOptions, options, kwargs)
    out = _kaldi_mel(waveform, lengths, sample_rate, options, float(dither), generator)
    feats = out.mel
    if out.energy is not None:
        parts = (feats, out.energy.unsqueeze(-1))
        feats = torch.cat(parts if options.htk_compat else parts[::-1], dim=-1)
    return out.padded(feats, options.subtract_mean, waveform.ndim == 2)


def mfcc(
    waveform: torch.Tensor,
    lengths: torch.Tensor | None = None,
    *,
    sample_rate: float,
    options: MfccOptions | None = None,
    dither: float = 0.0,
    generator: torch.Generator | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Kaldi MFCCs: ``(feats (…, frames, num_ceps), frame counts)``, as :func:`fbank` does for
    filterbanks (options :class:`MfccOptions`, :func:`torchaudio.compliance.kaldi.mfcc`'s
    names and defaults: 13 cepstra of 23 bins, lifter 22). With ``use_energy`` the log
    energy replaces C0; with ``htk_compat`` C0 (or the energy) comes last.

    >>> feats, counts = mfcc(torch.zeros(2, 16000), torch.tensor([16000, 400]),
    ...                      sample_rate=16000)
    >>> tuple(feats.shape), counts.tolist()
    ((2, 98, 13), [98, 1])
    """
    options = _options(MfccOptions, options, kwargs)
    out = _kaldi_mel(waveform, lengths, sample_rate, options, float(dither), generator)
    tables = _tables(options, float(sample_rate), out.mel.device, out.mel.dtype)
    feats = torch.matmul(out.mel, tables.dct)  # (frames, num_ceps)
    if tables.lifter is not None:
        feats.mul_(tables.lifter)
    if out.energy is not None:
        feats[:, 0] = out.energy
    if options.htk_compat:
        c0 = feats[:, :1] if out.energy is not None else feats[:, :1] * math.sqrt(2)
        feats = torch.cat((feats[:, 1:], c0), dim=-1)
    return out.padded(feats, options.subtract_mean, waveform.ndim == 2)


@dataclasses.dataclass(frozen=True)
class LogMelOptions:
    """Log-mel options: :class:`torchaudio.transforms.MelSpectrogram`'s names and defaults
    (Hann window, periodic) plus ``log_floor``: the features are
    ``MelSpectrogram(...)(x).clamp(min=log_floor).log()``, as ESPnet's log-mel and
    ``compute_features("mel", log=True)``.

    >>> LogMelOptions(n_fft=512, hop_length=160).hop
    160
    """

    n_fft: int = 400
    win_length: int | None = None
    hop_length: int | None = None
    f_min: float = 0.0
    f_max: float | None = None
    n_mels: int = 128
    center: bool = True
    pad_mode: str = "reflect"
    power: float = 2.0
    norm: str | None = None
    mel_scale: str = "htk"
    log_floor: float = 1e-10

    def __post_init__(self) -> None:
        if not 2 <= self.n_fft or not 1 <= self.win <= self.n_fft or self.hop < 1:
            raise ValueError(f"need 2 <= n_fft, 1 <= win_length <= n_fft, hop_length >= 1; got "
                             f"{self.n_fft}, {self.win_length}, {self.hop_length}")
        if self.pad_mode not in ("reflect", "constant"):
            raise ValueError(f"pad_mode must be 'reflect' or 'constant', got {self.pad_mode!r}")
        if not self.power > 0 or not self.log_floor > 0:
            raise ValueError(f"power and log_floor must be > 0, got {self.power}, "
                             f"{self.log_floor}")

    @property
    def win(self) -> int:
        return self.n_fft if self.win_length is None else self.win_length

    @property
    def hop(self) -> int:
        return self.win // 2 if self.hop_length is None else self.hop_length


@functools.lru_cache(maxsize=64)
def _log_mel_tables(options: LogMelOptions, rate: float, device: torch.device,
                    dtype: torch.dtype) -> tuple[torch.Tensor, int, tuple]:
    """(Hann window of win_length, its offset in the FFT frame, mel blocks)."""
    fb = taF.melscale_fbanks(options.n_fft // 2 + 1, options.f_min,
                             options.f_max if options.f_max is not None else rate / 2,
                             options.n_mels, int(rate), options.norm, options.mel_scale)
    window = torch.hann_window(options.win, dtype=dtype).to(device)
    return window, (options.n_fft - options.win) // 2, _mel_blocks(fb, device, dtype)


def _stft_frames(row: torch.Tensor, n: int, options: LogMelOptions) -> torch.Tensor:
    """``torch.stft``'s frames of one row's ``n`` samples (centred: padded by ``n_fft // 2``
    on each side, reflecting at the row's own ends or with zeros)."""
    size, hop = options.n_fft, options.hop
    if options.center:
        half = size // 2
        index = torch.arange(-half, n + half, device=row.device)
        if options.pad_mode == "reflect":  # i mod 2(n - 1), folded at n - 1
            period = max(2 * (n - 1), 1)
            index = torch.remainder(index, period)
            row = row[torch.where(index < n, index, period - index)]
        else:
            row = torch.nn.functional.pad(row[:n], (half, half))
        n = n + 2 * half
    count = 0 if n < size else 1 + (n - size) // hop
    return row.as_strided((count, size), (hop, 1))


def log_mel(
    waveform: torch.Tensor,
    lengths: torch.Tensor | None = None,
    *,
    sample_rate: float,
    options: LogMelOptions | None = None,
    dither: float = 0.0,
    generator: torch.Generator | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-mel spectrogram, frames first: ``(feats (…, frames, n_mels), frame counts)``, the
    numbers of ``torchaudio.transforms.MelSpectrogram(sample_rate, ...)(x).clamp(min=
    log_floor).log().T`` to float32 rounding (options :class:`LogMelOptions`), for one
    utterance or a padded batch as :func:`fbank` (each row padded at its own ends).

    >>> feats, counts = log_mel(torch.zeros(2, 16000), torch.tensor([16000, 8000]),
    ...                         sample_rate=16000, n_fft=512, hop_length=160, n_mels=80)
    >>> tuple(feats.shape), counts.tolist()
    ((2, 101, 80), [101, 51])
    """
    options = _options(LogMelOptions, options, kwargs)
    wave, lengths = _batch(waveform, lengths)
    if options.center and options.pad_mode == "reflect" and any(
            0 < n <= options.n_fft // 2 for n in lengths):
        raise ValueError(f"reflect padding needs more than n_fft // 2 = {options.n_fft // 2} "
                         f"samples in each row, got lengths {lengths}")
    if dither != 0.0:
        wave = _dithered(wave, lengths, float(dither), generator)
    window, offset, blocks = _log_mel_tables(options, float(sample_rate), wave.device,
                                             wave.dtype)
    rows = [_stft_frames(row, n, options) if n else row[:0].view(0, options.n_fft)
            for row, n in zip(wave, lengths)]
    counts = [len(r) for r in rows]
    mel = torch.empty(sum(counts), options.n_mels, device=wave.device, dtype=wave.dtype)
    chunk = max(1, _CHUNK_BYTES // (options.n_fft * wave.element_size()))
    scratch = torch.empty(min(chunk, max(counts, default=0)), options.n_fft,
                          device=wave.device, dtype=wave.dtype)
    span = slice(offset, offset + options.win)
    scratch[:, :offset] = 0
    scratch[:, span.stop:] = 0
    start = 0
    for frames in (piece for r in rows for piece in r.split(chunk)):
        buf = scratch[: frames.shape[0]]  # zero outside the window's span
        torch.mul(frames[:, span], window, out=buf[:, span])
        squares = torch.view_as_real(torch.fft.rfft(buf)).square_()
        power = torch.add(squares[..., 0], squares[..., 1])
        if options.power != 2.0:
            power.pow_(options.power / 2)
        _apply_mel(power, blocks, mel[start: start + frames.shape[0]])
        start += frames.shape[0]
    mel.clamp_min_(options.log_floor).log_()
    return _Mel(mel, None, counts).padded(mel, False, waveform.ndim == 2)
