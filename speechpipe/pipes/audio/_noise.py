"""Noise and reverberation: additive noise at a drawn SNR, convolution with room responses.

==================  ===========================================================================
functional name     what it does to a sample
==================  ===========================================================================
``add_noise``       ``audio + g × noise``, the noise drawn from a noise source (MUSAN's noise or
                    music, or ``babble`` speech utterances summed), ``g`` set so that the
                    mixture's SNR is ``snr_db ~ U[low, high]``; with probability ``p``
``reverberate``     ``audio`` convolved with a room impulse response drawn from a source
                    (RIRS_NOISES), aligned on the response's peak, energy kept; probability ``p``
==================  ===========================================================================

Both record what they applied in the sample's :data:`AUGMENT` list (``{"kind": "noise",
"keys": [noise keys], "snr_db": x}``, ``{"kind": "reverb", "keys": [rir key]}``), never mutate
their input, and keep lengths (so they may stand before or after length bucketing; before
features).

**The source is streamed**, never loaded whole: a pool of ``pool_size`` decoded items is filled
from it and each item drawn from the pool is replaced by the source's next one (the source is
read again, pass after pass, when it ends). The source is any re-iterable of sample dicts with
``key``, ``audio`` and ``sample_rate`` (``parse_manifest`` + ``load_audio``, a Kaldi data dir
read by ``sp.recipes.kaldi_dir.kaldi_dir_samples``, shards by ``read_shards`` + ``decode``;
the train builders take manifests: ``sp.recipes.augment_source``); keep it unsplit (each
DataLoader worker reads it whole, drawing its own order). A noise or response at another
sample rate than the utterance is **resampled** to it (:func:`torchaudio.functional.resample`, kernels cached), not refused.

**Several channels.** An utterance ``(T, C)`` takes a mono noise or response on every
channel, or one of ``C`` channels channel by channel (a multichannel noise recording, a
multichannel RIR set measured on an array like the recording's); any other channel count is a
:class:`~speechpipe.errors.DataError` naming both keys. A mono utterance takes the first
channel of a multichannel noise or response. The SNR is the mixture's over all channels; a
multichannel response is aligned on its strongest peak over all channels (one shift for every
channel: the delays between microphones are kept) and the output scaled to the input's energy
over all channels (the level differences between channels are kept).

**Randomness and resume.** Draws come from a ``random.Random`` seeded by ``(seed, epoch, rank,
worker)``; the source's pass ``k`` of epoch ``e`` gets the epoch ``derive_seed(e, k)`` on the
random pipes inside it. Both stages are exactly resumable (:mod:`speechpipe.pipes._core._state`):
the state holds the generator, where the source stood, the pool as positions in the source's
stream, and the draws of the last ``history`` samples, with which the samples held by the stages
above (``bucket_by_length``...) are mixed again identically when a restore replays them. A
restore reads the source again from the oldest pass it needs up to where it stood.

Plain functions hold the signal processing: :func:`noise_segment`, :func:`mix_at_snr`,
:func:`snr_db`, :func:`convolve_rir` (:func:`fast_fft_len`).
"""

from __future__ import annotations

import collections
import math
from typing import Any, Iterable, Iterator, Sequence

import numpy as np
import torch
import torchaudio.functional as taF

from ...errors import check_int, DataError
from ...sample import AUDIO, KEY, SOURCE, Sample
from ...seeding import derive_seed
from ._common import (
    audio_of, channels_first, check_real, resampler, sample_where, source_len, time_first,
)
from .._core import functional_datapipe, IterDataPipe
from .._core import propagate_epoch
from .._core import check_seed, identity, Resumable, rng_state, Seeded

__all__ = [
    "AUGMENT",
    "NoiseAdder",
    "NoiseAdderIterDataPipe",
    "RirConvolver",
    "RirConvolverIterDataPipe",
    "convolve_rir",
    "fast_fft_len",
    "mix_at_snr",
    "noise_segment",
    "snr_db",
]

#: Sample field: the list of augmentations applied, in order (dicts with ``kind`` and ``keys``;
#: ``snr_db`` for noise).
AUGMENT = "augment"

#: A position in the stream of a source read pass after pass: ``(pass, index in the pass)``.
Ref = tuple[int, int]


# --------------------------------------------------------------------------- signal processing


def _power(x: np.ndarray) -> float:
    """Mean square, in float64."""
    return float(np.mean(np.square(x, dtype=np.float64))) if x.size else 0.0


def noise_segment(noise: np.ndarray, length: int, offset: int) -> np.ndarray:
    """``length`` samples of ``noise`` (``(T,)`` or ``(T, C)``) from ``offset``, looped when it
    is shorter.

    ``noise[(offset + i) % len(noise)]`` for ``i < length``: a crop at ``offset`` when the
    noise is long enough (``offset <= len(noise) - length``), else the noise repeated end to
    end from ``offset``.

    >>> noise_segment(np.arange(5, dtype=np.float32), 3, 1)
    array([1., 2., 3.], dtype=float32)
    >>> noise_segment(np.arange(3, dtype=np.float32), 7, 2)
    array([2., 0., 1., 2., 0., 1., 2.], dtype=float32)
    """
    n = noise.shape[0]
    if offset + length <= n:
        return noise[offset:offset + length]
    return np.take(noise, np.arange(offset, offset + length) % n, axis=0)


def max_offset(noise_len: int, length: int) -> int:
    """Largest offset drawn: a crop inside the noise, or any start when it must loop."""
    return noise_len - length if noise_len >= length else noise_len - 1


def mix_at_snr(clean: np.ndarray, noise: np.ndarray, snr: float) -> np.ndarray:
    """``clean + g × noise`` (float32) with ``g`` such that ``10 log10(P(clean) / P(g ×
    noise)) = snr`` dB, ``P`` the mean square over the whole utterance (all channels; a mono
    ``noise`` of the same length is added to every channel of a ``(T, C)`` ``clean``, a ``(T,
    C)`` one channel by channel).

    Both powers must be > 0 (the stage checks and names the utterance or noise).

    >>> clean = np.sin(np.arange(1600, dtype=np.float32))
    >>> noise = np.cos(np.arange(1600, dtype=np.float32) * 3)
    >>> round(snr_db(clean, mix_at_snr(clean, noise, 10.0)), 4)
    10.0
    """
    gain = math.sqrt(_power(clean) / (_power(noise) * 10.0 ** (snr / 10.0)))
    if clean.ndim == 2 and noise.ndim == 1:
        noise = noise[:, None]
    return (clean.astype(np.float64) + gain * noise.astype(np.float64)).astype(np.float32)


def snr_db(clean: np.ndarray, mixed: np.ndarray) -> float:
    """The SNR of ``mixed`` over ``clean`` in dB: ``10 log10(P(clean) / P(mixed - clean))``.

    >>> snr_db(np.ones(4, np.float32), np.full(4, 1.1, np.float32)) > 19.9
    True
    """
    return 10.0 * math.log10(_power(clean) / _power(mixed.astype(np.float64) - clean))


def fast_fft_len(n: int) -> int:
    """The smallest length >= ``n`` of the form ``m × 2^k``, ``m`` in a few small products of
    3 and 5: an FFT of that length is fast (one of a length with a large prime factor can be
    ten times slower: ``benchmarks/bench_augment.py``).

    >>> fast_fft_len(93776), fast_fft_len(1024), fast_fft_len(1)
    (98304, 1024, 1)
    """
    best = None
    for m in (1, 3, 5, 9, 15, 25, 27, 45, 75, 81, 125):
        length = m << max(0, (-(-n // m) - 1).bit_length())
        best = length if best is None or length < best else best
    return best


def convolve_rir(audio: np.ndarray, rir: np.ndarray) -> np.ndarray:
    """Reverberate ``audio`` with the response ``rir``, as Kaldi's ``wav-reverberate``.

    ``rir`` is mono ``(L,)`` (applied to every channel of a ``(T, C)`` ``audio``) or ``(L, C)``
    with the audio's channel count (channel ``c`` of the audio convolved with channel ``c`` of
    the response); another shape is a ``ValueError``.

    :func:`torchaudio.functional.fftconvolve` gives the full convolution (the input padded
    with zeros to a :func:`fast_fft_len`, which changes no output sample); the output is its
    ``len(audio)`` samples from the response's peak (``argmax |rir|``, the direct path: the
    speech is not delayed; for a multichannel response, the strongest peak over all channels,
    one shift for every channel) and is scaled to the input's energy (Kaldi's
    ``normalize_output``, ESPnet's power restore; energies summed in float64 over all
    channels). A silent input gives a silent output. Float32, same shape.

    >>> out = convolve_rir(np.ones(8, np.float32), np.array([0.0, 1.0, 0.5], np.float32))
    >>> out.shape, round(float(np.sum(out ** 2)), 4)
    ((8,), 8.0)
    """
    x = channels_first(audio)
    h = channels_first(np.asarray(rir, dtype=np.float32))
    if h.ndim == 2 and (x.ndim != 2 or h.shape[0] != x.shape[0]):
        raise ValueError(f"convolve_rir: a response of shape {tuple(np.shape(rir))} for audio of "
                         f"shape {audio.shape}: give a mono response or one per channel")
    if h.ndim > 2:
        raise ValueError(f"convolve_rir: the response must be (L,) or (L, C), got shape "
                         f"{tuple(np.shape(rir))}")
    peak = int(torch.argmax(h.abs() if h.ndim == 1 else h.abs().amax(dim=0)))
    length, full = x.shape[-1], x.shape[-1] + h.shape[-1] - 1
    h = h.expand(x.shape[0], -1) if x.ndim == 2 and h.ndim == 1 else h
    padded = torch.nn.functional.pad(x, (0, fast_fft_len(full) - full))
    y = taF.fftconvolve(padded, h)[..., peak:peak + length]
    energy_in = float(np.sum(np.square(audio, dtype=np.float64)))
    energy_out = float(torch.sum(torch.square(y.to(torch.float64))))
    if energy_out > 0.0:
        y = y * math.sqrt(energy_in / energy_out)
    return time_first(y.contiguous())


# --------------------------------------------------------------------------- the streamed pool


def source_epoch(epoch: int, pass_index: int) -> int:
    """The epoch set on the augmentation source for its ``pass_index``-th pass in ``epoch``."""
    return derive_seed(epoch, pass_index, 0, 0, "augment-source") >> 2


class _Hidden:
    """Holds the augmentation source out of sight of the graph walk (the loader's states and
    epochs): the stage reads it, sets its epochs and saves where it stands itself."""

    def __init__(self, pipe: Iterable) -> None:
        self.pipe = pipe


class _Stream:
    """A source read endlessly, pass after pass; each item comes with its :data:`Ref`."""

    def __init__(self, pipe: Iterable, epoch: int, stage: str) -> None:
        self.pipe, self.epoch, self.stage = pipe, epoch, stage
        self.pass_index, self.read, self.it = 0, 0, None

    def _open(self, pass_index: int) -> None:
        propagate_epoch(self.pipe, source_epoch(self.epoch, pass_index))
        self.pass_index, self.read, self.it = pass_index, 0, iter(self.pipe)

    def next(self) -> tuple[Ref, Any]:
        if self.it is None:
            self._open(self.pass_index)
        while True:
            try:
                item = next(self.it)
                break
            except StopIteration:
                if self.read == 0:  # a pass that yields nothing would loop forever
                    raise DataError(f"{self.stage}: the source yielded nothing (pass "
                                    f"{self.pass_index + 1}); give it at least one item",
                                    source=f"{self.stage} source") from None
                self._open(self.pass_index + 1)
        ref = (self.pass_index, self.read)
        self.read += 1
        return ref, item

    def seek(self, position: Sequence[int], wanted: set) -> dict:
        """Read again from the oldest pass of ``wanted`` up to ``position``; the items of
        ``wanted`` by ref. The stream then continues from ``position``."""
        position = (int(position[0]), int(position[1]))
        self._open(min([p for p, _ in wanted] + [position[0]]))
        found = {}
        while (self.pass_index, self.read) < position:
            ref, item = self.next()
            if ref in wanted:
                found[ref] = item
        return found

    def position(self) -> list[int]:
        return [self.pass_index, self.read]


def _item_audio(item: Any, stage: str) -> tuple[np.ndarray, int, str]:
    """A source item's audio (``(T,)`` or ``(T, C)``), its rate and its key (errors name it)."""
    audio, rate = audio_of(item, f"{stage} source")
    key = item.get(KEY)
    if audio.shape[0] == 0 or _power(audio) == 0.0:
        raise DataError(f"{stage}: the source item is silent (no energy); remove it from the "
                        "source", source=item.get(SOURCE), key=key)
    return audio, rate, key if isinstance(key, str) else str(key)


class _Pooled(Seeded, Resumable):
    """What both stages share: the pool over a streamed source, the draws, the history and
    the resume protocol. A stage implements ``_draw`` (the draws for one sample, returning a
    record) and ``_apply`` (the sample with a record applied)."""

    stage = ""

    def _setup(self, source_datapipe, source: Any, p: float, pool_size: int, history: int,
               seed: int) -> None:
        if isinstance(source, (str, bytes)) or not isinstance(source, Iterable):
            raise TypeError(f"{self.stage}: the source must be a re-iterable of sample dicts "
                            f"(a pipe), got {source!r}")
        if isinstance(source, Iterator):
            raise TypeError(f"{self.stage}: the source is an iterator; it is read again pass "
                            "after pass: give a pipe or a list")
        p = check_real("p", p)
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"p must be in [0, 1], got {p!r}")
        self.source_datapipe = source_datapipe
        self.source = _Hidden(source)
        self.p = p
        self.pool_size = check_int("pool_size", pool_size, 1)
        self.history = check_int("history", history, 0)
        self.seed = check_seed(seed)
        self.epoch = 0

    # -- passes

    def __iter__(self) -> Iterator[Sample]:
        if self.passthrough:  # a restore replays samples held above: mix them again
            yield from self._replay()
            return
        self._begin_pass()
        state, _ = self._take_resume()
        if state is not None and state.get("ended"):
            state = None  # the pass had ended: whatever comes is a new pass
        rng = self._rng(self.stage)
        epoch = self.epoch if state is None else int(state["epoch"])
        stream = _Stream(self.source.pipe, epoch, self.stage)
        pool: list = []
        history: collections.OrderedDict = collections.OrderedDict()
        if state is not None:
            rng.setstate(rng_state(state["rng"]))
            pool_refs = [tuple(r) for r in state["pool"]]
            found = stream.seek(state["stream"], set(pool_refs))
            pool = [(ref, found[ref]) for ref in pool_refs]
            history.update((tuple(i), r) for *i, r in state["history"])
        live = self._live = {"epoch": epoch, "rng": rng, "stream": stream, "pool": pool,
                             "history": history, "ended": False}
        try:
            for sample in self.source_datapipe:
                yield self._next(sample, live)
        except BaseException:
            self._live = None
            raise
        # The pass ended: its state stays readable (the stages above may still hold samples
        # that a restore replays with the history), without the decoded items.
        live["ended"] = True
        pool[:] = [(ref, None) for ref, _ in pool]

    def _next(self, sample: Any, live: dict) -> Sample:
        """One sample through the stage (draws, pool refill, history), in a pass."""
        rng, pool, stream = live["rng"], live["pool"], live["stream"]
        audio, rate = audio_of(sample, self.stage)
        if rng.random() >= self.p:
            self._remember(live["history"], sample, None)
            return _unchanged(sample)
        if not pool:
            pool.extend(stream.next() for _ in range(self.pool_size))
        record, slots, prepared = self._draw(rng, pool, audio.shape[0], rate)
        for slot in slots:  # each item drawn is replaced by the source's next one
            pool[slot] = stream.next()
        self._remember(live["history"], sample, record)
        return self._apply(sample, audio, record, prepared)

    def _remember(self, history: collections.OrderedDict, sample: Any, record: Any) -> None:
        if not self.history or not isinstance(sample.get(KEY), str):
            return
        ident = identity(sample)
        history.pop(ident, None)
        history[ident] = record
        if len(history) > self.history:
            history.popitem(last=False)

    def _replay(self) -> Iterator[Sample]:
        state = self._resume_state
        samples = list(self.source_datapipe)
        if state is None:
            yield from samples
            return
        history = {tuple(i): r for *i, r in state["history"]}
        records = []
        for sample in samples:
            ident = identity(sample)
            if ident not in history:
                raise DataError(
                    f"resume: {self.stage} kept the draws of its last {self.history} samples, "
                    "and a sample held by a stage above is older; raise history= (at least "
                    "the samples the stages above hold)", source=ident[0] or None, key=ident[1])
            records.append(history[ident])
        wanted = {tuple(r[:2]) for rec in records if rec for r in rec["refs"]}
        stream = _Stream(self.source.pipe, int(state["epoch"]), self.stage)
        found = stream.seek(state["stream"], wanted)
        for sample, record in zip(samples, records):
            if record is None:
                yield _unchanged(sample)
                continue
            audio, rate = audio_of(sample, self.stage)
            prepared = [self._at_rate(found[tuple(r[:2])], rate) for r in record["refs"]]
            yield self._apply(sample, audio, record, prepared)

    def _snapshot(self, live: dict) -> dict:
        return {
            "epoch": live["epoch"],
            "rng": live["rng"].getstate(),
            "stream": live["stream"].position(),
            "pool": [list(ref) for ref, _ in live["pool"]],
            "history": [[*ident, record] for ident, record in live["history"].items()],
            "ended": live["ended"],
        }

    def _draw(self, rng, pool: list, length: int, rate: int) -> tuple[dict, list, list]:
        """The draws for one sample of ``length`` samples at ``rate``: its record (``refs``:
        ``[pass, index, ...]`` of the items used, and what else ``_apply`` needs), the pool
        slots used and their items prepared (:meth:`_at_rate`)."""
        raise NotImplementedError

    def _apply(self, sample: Any, audio: np.ndarray, record: dict, prepared: list) -> Sample:
        """``sample`` with the draws of ``record`` applied (the items ``prepared``)."""
        raise NotImplementedError

    def _at_rate(self, item: Any, rate: int) -> tuple[np.ndarray, str]:
        audio, item_rate, key = _item_audio(item, self.stage)
        if item_rate != rate:
            audio = time_first(resampler(item_rate, rate)(channels_first(audio)))
        return audio, key

    def __len__(self) -> int:
        return source_len(self)


def _fit_channels(x: np.ndarray, audio: np.ndarray, what: str, key: str, sample: Any,
                  stage: str) -> np.ndarray:
    """A noise segment or response ``x`` for ``audio``: ``(T,)`` (every channel), or ``(T,
    C)`` with the audio's ``C``; the first channel of ``x`` for mono audio."""
    if x.ndim == 1:
        return x
    if audio.ndim == 1 or x.shape[1] == 1:
        return x[:, 0]
    if x.shape[1] == audio.shape[1]:
        return x
    raise DataError(f"{stage}: the {what} {key!r} has {x.shape[1]} channels and the utterance "
                    f"{audio.shape[1]}: give mono {what}s or {what}s of the utterances' channel "
                    f"count (select_channel/downmix the source)", key=sample.get(KEY),
                    source=key)


def _unchanged(sample: Any) -> Any:
    """A sample not augmented: itself, with an empty :data:`AUGMENT` list if it has none (every
    sample of a batch has the same fields)."""
    if AUGMENT in sample:
        return sample
    out = dict(sample)
    out[AUGMENT] = []
    return out


def _appended(sample: Any, entry: dict) -> list:
    previous = sample.get(AUGMENT)
    return [*(previous or ()), entry]


def _check_range(name: str, value: Any) -> tuple[float, float]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or len(value) != 2:
        raise TypeError(f"{name} must be a (low, high) pair of numbers, got {value!r}")
    low, high = (check_real(name, v) for v in value)
    if high < low:
        raise ValueError(f"{name} must be (low, high) with low <= high, got {value!r}")
    return low, high


@functional_datapipe("add_noise")
class NoiseAdderIterDataPipe(_Pooled, IterDataPipe[Sample]):
    """Mix utterances with noise at an SNR drawn from a range (functional name: ``add_noise``).

    Consumes samples with ``audio`` (``(T,)`` or ``(T, C)``: a mono noise on every channel, a
    ``C``-channel one channel by channel) and ``sample_rate``; with probability ``p``, yields
    them with ``audio`` mixed by :func:`mix_at_snr` at ``snr_db ~ U[low, high]`` dB with the
    sum of ``babble`` items of ``noise`` (each cropped at a random
    offset when longer than the utterance, looped from a random offset when shorter:
    :func:`noise_segment`; resampled to the utterance's rate), and ``{"kind": "noise", "keys":
    [...], "snr_db": snr}`` appended to :data:`AUGMENT`; otherwise unchanged (with an empty
    :data:`AUGMENT` list if it had none, so that every sample has the field).
    ``babble=k`` with a speech source (MUSAN's ``speech``) sums ``k`` utterances: babble noise.
    The SNR is the mixture's over the whole utterance: :func:`snr_db` of the output against
    the input gives ``snr_db`` (to float32 rounding, well under 0.01 dB). Lengths, ``duration``
    and other fields are kept. See the module documentation for the pool, seeding and resume.

    Args:
        source_datapipe: samples with audio.
        noise: the noise source: a re-iterable of sample dicts with ``key``, ``audio``,
            ``sample_rate`` (e.g. ``parse_manifest`` + ``load_audio`` over a MUSAN manifest).
        snr_db: ``(low, high)``, dB (MUSAN practice: noise 0-15, music 5-15, babble 13-20).
        p: probability that an utterance is mixed.
        babble: noise items summed per mixture (>= 1).
        pool_size: decoded noise items held (>= ``babble``); memory grows with it.
        history: draws kept for a restore to mix the samples held above again (at least what
            ``bucket_by_length`` and ``block_batch`` above hold).
        seed: base seed.

    Errors (:class:`~speechpipe.errors.DataError`, naming the key): an empty noise source, a
    silent noise item or segment, a silent utterance (no SNR can be set), noise without audio
    (a file that does not decode raises where it is loaded, naming it), a multichannel noise
    whose channel count is not the utterance's.

    >>> from speechpipe import IterableWrapper
    >>> noise = [{"key": "n1", "audio": np.ones(800, np.float32), "sample_rate": 16000}]
    >>> clean = np.sin(np.arange(1600, dtype=np.float32))
    >>> rows = [{"key": "u1", "audio": clean, "sample_rate": 16000}]
    >>> [s] = IterableWrapper(rows).add_noise(noise, snr_db=(5.0, 5.0))
    >>> s["augment"], round(snr_db(clean, s["audio"]), 3)
    ([{'kind': 'noise', 'keys': ['n1'], 'snr_db': 5.0}], 5.0)
    """

    stage = "add_noise"

    def __init__(
        self,
        source_datapipe: IterDataPipe,
        noise: Iterable[Sample],
        snr_db: tuple[float, float] = (0.0, 15.0),
        p: float = 1.0,
        *,
        babble: int = 1,
        pool_size: int = 16,
        history: int = 4096,
        seed: int = 0,
    ) -> None:
        self._setup(source_datapipe, noise, p, pool_size, history, seed)
        self.low, self.high = _check_range("snr_db", snr_db)
        self.babble = check_int("babble", babble, 1)
        if self.babble > self.pool_size:
            raise ValueError(f"pool_size ({pool_size}) must be >= babble ({babble})")

    def _draw(self, rng, pool: list, length: int, rate: int) -> tuple[dict, list, list]:
        snr = self.low + (self.high - self.low) * rng.random()
        slots = rng.sample(range(len(pool)), self.babble)
        refs, prepared = [], []
        for slot in slots:
            ref, item = pool[slot]
            audio, key = self._at_rate(item, rate)
            refs.append([ref[0], ref[1], rng.randint(0, max_offset(audio.shape[0], length))])
            prepared.append((audio, key))
        return {"refs": refs, "snr_db": snr}, slots, prepared

    def _apply(self, sample: Any, audio: np.ndarray, record: dict, prepared: list) -> Sample:
        if _power(audio) == 0.0:
            raise DataError("add_noise: the utterance is silent: no SNR can be set",
                            **sample_where(sample))
        length = audio.shape[0]
        segments = [_fit_channels(noise_segment(noise, length, ref[2]), audio, "noise", key,
                                  sample, self.stage)
                    for (noise, key), ref in zip(prepared, record["refs"])]
        # (T,) while every segment is mono (added to every channel by mix_at_snr), else (T, C)
        total = np.zeros(max((s.shape for s in segments), key=len), np.float64)
        for segment in segments:
            total += segment if segment.ndim == total.ndim else segment[:, None]
        keys = [key for _, key in prepared]
        if _power(total) == 0.0:
            raise DataError(f"add_noise: the noise {keys} is silent over the {length} samples "
                            f"drawn (offsets {[r[2] for r in record['refs']]})",
                            key=sample.get(KEY), source=", ".join(keys))
        out = dict(sample)
        out[AUDIO] = mix_at_snr(audio, total, record["snr_db"])
        out[AUGMENT] = _appended(sample, {"kind": "noise", "keys": keys,
                                          "snr_db": record["snr_db"]})
        return out


NoiseAdder = NoiseAdderIterDataPipe


@functional_datapipe("reverberate")
class RirConvolverIterDataPipe(_Pooled, IterDataPipe[Sample]):
    """Convolve utterances with room impulse responses (functional name: ``reverberate``).

    Consumes samples with ``audio`` (``(T,)`` or ``(T, C)``: a mono response on every channel,
    a ``C``-channel one channel by channel) and ``sample_rate``; with probability ``p``,
    yields them with ``audio`` reverberated by :func:`convolve_rir` (Kaldi's ``wav-reverberate``: aligned on the
    response's peak, so the speech is not delayed, and scaled back to the input's energy) with
    a response drawn from ``rirs`` (resampled to the utterance's rate), and ``{"kind":
    "reverb", "keys": [rir key]}`` appended to :data:`AUGMENT`; otherwise unchanged (the field
    added, empty). Lengths are kept. Put it before ``add_noise`` for reverberant speech in
    additive noise (as Kaldi's and ESPnet's recipes do). See the module documentation for the
    pool, seeding and resume.

    Args:
        source_datapipe: samples with audio.
        rirs: the responses: a re-iterable of sample dicts with ``key``, ``audio``,
            ``sample_rate`` (e.g. ``parse_manifest`` + ``load_audio`` over a RIRS_NOISES
            manifest).
        p: probability that an utterance is reverberated.
        pool_size: decoded responses held.
        history: draws kept for a restore (as ``add_noise``'s).
        seed: base seed.

    Errors (:class:`~speechpipe.errors.DataError`, naming the key): an empty source, a silent
    response, a response without audio, a multichannel response whose channel count is not the
    utterance's.

    >>> from speechpipe import IterableWrapper
    >>> rir = [{"key": "r1", "audio": np.array([0.0, 1.0, 0.3], np.float32),
    ...         "sample_rate": 16000}]
    >>> rows = [{"key": "u1", "audio": np.ones(100, np.float32), "sample_rate": 16000}]
    >>> [s] = IterableWrapper(rows).reverberate(rir)
    >>> s["augment"], s["audio"].shape
    ([{'kind': 'reverb', 'keys': ['r1']}], (100,))
    """

    stage = "reverberate"

    def __init__(
        self,
        source_datapipe: IterDataPipe,
        rirs: Iterable[Sample],
        p: float = 1.0,
        *,
        pool_size: int = 64,
        history: int = 4096,
        seed: int = 0,
    ) -> None:
        self._setup(source_datapipe, rirs, p, pool_size, history, seed)

    def _draw(self, rng, pool: list, length: int, rate: int) -> tuple[dict, list, list]:
        slot = rng.randrange(len(pool))
        ref, item = pool[slot]
        return {"refs": [list(ref)]}, [slot], [self._at_rate(item, rate)]

    def _apply(self, sample: Any, audio: np.ndarray, record: dict, prepared: list) -> Sample:
        [(rir, key)] = prepared
        out = dict(sample)
        out[AUDIO] = convolve_rir(audio, _fit_channels(rir, audio, "response", key, sample,
                                                       self.stage))
        out[AUGMENT] = _appended(sample, {"kind": "reverb", "keys": [key]})
        return out


RirConvolver = RirConvolverIterDataPipe
