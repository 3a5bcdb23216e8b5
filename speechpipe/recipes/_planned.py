"""The recipes' planned road: ``train_pipeline(streams=V)`` over virtual streams.

The streaming road (``shuffle_samples -> load -> transform -> bucket_by_length ->
block_batch``) batches inside each process, so its batches depend on the number of ranks and
DataLoader workers. With ``streams=V``, :func:`~speechpipe.recipes.train_pipeline` plans the
epoch's batches instead on the manifests' mapped rows (``plan_batches``' manifest road, over
``V`` virtual streams) and loads and transforms each planned batch as a whole:

- :class:`RowPlanner` is ``plan_batches`` whose plan sees the durations *after* speed
  perturbation: each row's factor is drawn at planning time from ``(seed, epoch, row)``, the
  row's planned length is ``duration / factor``, and the factor travels with the row to the
  stage that applies it (:func:`apply_planned_speed`);
- :class:`BatchFrontEnd` runs the front end (loading, resampling, speed, reverberation, noise,
  features, tokens) on the samples of one batch at a time; a sample that ``on_error="skip"``
  leaves out makes the batch smaller, never a batch fewer (every rank keeps its steps);
- :class:`KeyedAugment` reverberates or adds noise with draws from ``(seed, epoch, key)``,
  not from a generator running through a process's share; :class:`KeyedFeatures` computes
  the features with each utterance's dither drawn the same way.

So the batches are a function of ``(seed, epoch, V, manifests, settings)``, whatever the
topology, and the loader's state is one global position that resumes any topology
(:mod:`speechpipe.topology`).
"""

from __future__ import annotations

import collections.abc
from typing import Any, Callable, Iterator, Sequence

import numpy as np

import torch

from ..diagnostics import Ledger
from ..errors import DataError, SampleRateError
from ..pipes._core import IterableWrapper, IterDataPipe, Seeded, graph_nodes, plain_iterator
from ..pipes.audio import (
    AUGMENT, audio_of, change_speed, channels_first, extract_features, fast_fft_len,
    FeatureExtractor, mix_at_snr, noise_segment, played_at, resampler, sample_where, time_first,
)
from ..pipes.batching import BatchPlannerIterDataPipe
from ..sample import AUDIO, FEATS, KEY, SOURCE
from ..seeding import derive_rng, derive_seed, process_position

__all__ = [
    "BatchFrontEnd",
    "KeyedAugment",
    "KeyedFeatures",
    "PLANNED",
    "RowPlanner",
    "apply_planned_speed",
    "reverberated",
    "rows_loader",
]

#: The field a planned row carries to the front end: ``{"epoch": e, "speed": factor or None}``
#: (removed before collating).
PLANNED = "_planned"


class _SpeedRows:
    """A manifest road whose lengths are ``duration / factor``, each row's factor drawn from
    ``(seed, epoch, row)``; its batches' rows carry their epoch and factor (:data:`PLANNED`)."""

    def __init__(self, road: Any, owner: "RowPlanner") -> None:
        self.road, self.owner = road, owner
        self._factors: tuple[int, np.ndarray | None] | None = None

    def default_streams(self) -> int:
        return self.road.default_streams()

    def plan_key(self) -> dict | None:  # what the plan's data are (plan_batches' plan cache)
        key = getattr(self.road, "plan_key", None)
        return None if key is None else {**key(), "speed_factors": self.owner.speed_factors}

    def factors(self, epoch: int) -> np.ndarray | None:
        if self.owner.speed_factors is None:
            return None
        if self._factors is None or self._factors[0] != epoch:
            n = len(self.road.durations())
            rng = np.random.default_rng(derive_seed(self.owner.seed, epoch, 0, 0, "planned-speed"))
            choices = np.asarray(self.owner.speed_factors, np.float64)
            self._factors = (epoch, choices[rng.integers(0, len(choices), n)])
        return self._factors[1]

    @property
    def unit(self) -> str:
        return self.road.unit

    @property
    def rate(self) -> Any:
        return self.road.rate

    def streams(self, seed: int, epoch: int, streams: int) -> Any:
        """Per stream, its rows and their durations after the speed factor, as arrays."""
        planned = self.road.streams(seed, epoch, streams)
        factors = self.factors(epoch)
        if factors is None:
            return planned
        return _Slowed(planned, factors)

    def fetch(self, positions_items: list, read_options: Any) -> Iterator[list]:
        epoch = self.owner.epoch
        factors = self.factors(epoch)
        for items, batch in zip(positions_items, self.road.fetch(positions_items, read_options)):
            yield [{**sample, PLANNED: {"epoch": epoch, "speed": None if factors is None
                                        else float(factors[i])}}
                   for i, sample in zip(items, batch)]


class _Slowed(collections.abc.Sequence):
    """A road's streams ``(items, durations)`` with each duration divided by its row's speed
    factor (made when the stream is planned, as the road's own)."""

    def __init__(self, streams: Sequence, factors: np.ndarray) -> None:
        self.streams, self.factors = streams, factors

    def __len__(self) -> int:
        return len(self.streams)

    def __getitem__(self, v: int) -> tuple[np.ndarray, np.ndarray]:
        items, durations = self.streams[v]
        return items, durations / self.factors[items]


class RowPlanner(BatchPlannerIterDataPipe):
    """``plan_batches`` over manifest rows that plans on the durations after speed
    perturbation (see the module documentation).

    Args:
        source_datapipe: ``read_manifest_files`` (or ``filter_by_duration`` over it).
        budget: as ``plan_batches``'.
        speed_factors: the factors drawn per row (``None``: no perturbation).
        **options: ``plan_batches``' other options (``streams``, ``seed``, ...).

    >>> import os, tempfile
    >>> from speechpipe.pipes.sources import write_manifest
    >>> path = os.path.join(tempfile.mkdtemp(), "m.jsonl")
    >>> _ = write_manifest(path, [{"key": f"u{i}", "duration": 2.0} for i in range(4)])
    >>> rows = IterableWrapper([path]).read_manifest_files()
    >>> [len(b) for b in RowPlanner(rows, 4.0, streams=1)]  # 2 s each: two per 4 s
    [2, 2]
    >>> slow = RowPlanner(rows, 4.0, speed_factors=(0.5,), streams=1)  # 4 s each once slowed
    >>> [len(b) for b in slow], next(iter(slow))[0][PLANNED]
    ([1, 1, 1, 1], {'epoch': 1, 'speed': 0.5})
    """

    decides_batches = BatchPlannerIterDataPipe.decides_batches + ("speed_factors",)

    def __init__(self, source_datapipe: Any, budget: Any = None, *,
                 speed_factors: Sequence[float] | None = None, **options: Any) -> None:
        super().__init__(source_datapipe, budget, **options)
        self.speed_factors = None if speed_factors is None else tuple(
            float(f) for f in speed_factors)
        self._rows: _SpeedRows | None = None

    def __getstate__(self) -> dict:
        state = super().__getstate__()
        state["_rows"] = None
        return state

    @property
    def stats(self) -> Any:
        """The planned batches' padding and sizes (``pipeline_report``), once planned."""
        return None if self._plan is None else self._plan.stats

    def road(self) -> Any:
        if self._rows is None:
            self._rows = _SpeedRows(super().road(), self)
        return self._rows


def apply_planned_speed(sample: dict) -> dict:
    """``sample`` played at the speed factor its plan drew (``change_speed``: ``audio``,
    ``duration`` and ``speed`` as ``perturb_speed`` sets them); unchanged without one.

    >>> s = {"key": "u", "audio": np.zeros(16000, np.float32), "sample_rate": 16000,
    ...      "duration": 1.0, PLANNED: {"epoch": 0, "speed": 1.25}}
    >>> out = apply_planned_speed(s)
    >>> out["audio"].shape, out["duration"], out["speed"]
    ((12800,), 0.8, 1.25)
    """
    factor = (sample.get(PLANNED) or {}).get("speed")
    if factor is None:
        return sample
    audio, rate = audio_of(sample, "perturb_speed")
    return played_at(sample, change_speed(audio, rate, factor), rate, factor)


class KeyedAugment:
    """Reverberation or noise with every draw from ``(seed, epoch, key)`` (the planned road's
    ``reverberate`` / ``add_noise``): whether the utterance is changed (``p``), which items of
    ``source``, the SNR and the offsets -- the same in every process, whatever it served
    before. The source's items are read when drawn (``load``), the last ``cache`` kept.

    Args:
        kind: ``"noise"`` or ``"reverb"``.
        items: a function returning the source's items in a fixed order (rows or samples).
        load: a function ``item -> sample with audio`` (identity for samples with audio).
        snr_db, babble: as ``add_noise``'s (noise only).
        p: the share of utterances changed.
        seed: the pipeline's seed.
        cache: decoded items kept.
    """

    def __init__(self, kind: str, items: Callable[[], list], load: Callable[[Any], dict], *,
                 p: float = 1.0, snr_db: tuple[float, float] = (0.0, 15.0), babble: int = 1,
                 seed: int = 0, cache: int = 64) -> None:
        self.kind, self.items, self.load = kind, items, load
        self.p, self.snr_db, self.babble, self.seed, self.cache = p, snr_db, babble, seed, cache
        self._items: list | None = None
        self._held: collections.OrderedDict = collections.OrderedDict()

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_items": None, "_held": collections.OrderedDict()}

    def __repr__(self) -> str:  # what a loader state's fingerprint records of it
        return (f"KeyedAugment({self.kind!r}, p={self.p}, snr_db={tuple(self.snr_db)}, "
                f"babble={self.babble}, seed={self.seed})")

    def _item(self, i: int, rate: int) -> tuple[np.ndarray, str]:
        if i not in self._held:
            sample = self.load(self._items[i])
            self._held[i] = sample
            if len(self._held) > self.cache:
                self._held.popitem(last=False)
        sample = self._held[i]
        audio, item_rate = audio_of(sample, self.kind)
        if item_rate != rate:
            audio = time_first(resampler(item_rate, rate)(channels_first(audio)))
        return audio, str(sample.get(KEY))

    def __call__(self, sample: dict) -> dict:
        if self._items is None:
            self._items = list(self.items())
            if not self._items:
                raise DataError(f"{self.kind}: the source has no items")
        epoch = (sample.get(PLANNED) or {}).get("epoch", 0)
        rng = derive_rng(self.seed, epoch, 0, 0, "planned-" + self.kind, str(sample.get(KEY)))
        out = dict(sample)
        out[AUGMENT] = list(sample.get(AUGMENT) or ())
        if rng.random() >= self.p:
            return out
        audio, rate = audio_of(sample, self.kind)
        if self.kind == "reverb":
            rir, key = self._item(rng.randrange(len(self._items)), rate)
            out[AUDIO] = reverberated(audio, _mono_like(rir, audio, key, sample))
            out[AUGMENT].append({"kind": "reverb", "keys": [key]})
            return out
        low, high = self.snr_db
        snr = low + (high - low) * rng.random()
        chosen = rng.sample(range(len(self._items)), min(self.babble, len(self._items)))
        total = np.zeros(audio.shape[0], np.float64)
        keys = []
        for i in chosen:
            noise, key = self._item(i, rate)
            noise = _mono_like(noise, audio, key, sample)
            n, length = noise.shape[0], audio.shape[0]
            offset = rng.randint(0, n - length if n >= length else n - 1)
            total += noise_segment(noise, length, offset)
            keys.append(key)
        out[AUDIO] = mix_at_snr(audio, total, snr)
        out[AUGMENT].append({"kind": "noise", "keys": keys, "snr_db": snr})
        return out


class KeyedFeatures:
    """``compute_features`` of one utterance with its dither drawn from ``(seed, epoch, key)``
    (the planned road's feature stage when ``dither > 0``): the noise ``dither × N(0, 1)``
    added to each sample of the scaled waveform comes from a ``torch.Generator`` of the
    utterance's own, so its features are the same in every process, whatever that process
    computed before, and differ from epoch to epoch. ``audio`` is dropped, ``feats`` added.

    Args:
        kind: ``"fbank"``, ``"mfcc"`` or ``"mel"``.
        dither: the noise's standard deviation (in the scaled waveform's units, as
            ``compute_features``').
        seed: the pipeline's seed.
        sample_rate: the rate the features are for (other rates: a ``SampleRateError``), or
            ``None``.
        **options: ``compute_features``' options (``scale``, ``backend``, ``num_mel_bins``...).

    >>> f = KeyedFeatures("fbank", dither=1.0, seed=0, sample_rate=16000, num_mel_bins=23)
    >>> s = {"key": "u", "audio": np.zeros(16000, np.float32), "sample_rate": 16000,
    ...      PLANNED: {"epoch": 0, "speed": None}}
    >>> a, b = f(s)["feats"], f(dict(s))["feats"]
    >>> a.shape, bool((a == b).all()), bool((f({**s, PLANNED: {"epoch": 1}})["feats"] != a).any())
    ((98, 23), True, True)
    """

    def __init__(self, kind: str, *, dither: float, seed: int, sample_rate: int | None,
                 **options: Any) -> None:
        scale, backend = options.pop("scale", None), options.pop("backend", "speechpipe")
        self.extractor = FeatureExtractor(kind, scale, options, backend)
        self.kind, self.dither, self.seed, self.sample_rate = kind, float(dither), seed, sample_rate
        self.options = {"scale": self.extractor.scale, "backend": backend, **options}

    def __repr__(self) -> str:  # what a loader state's fingerprint records of it
        return (f"KeyedFeatures({self.kind!r}, dither={self.dither}, seed={self.seed}, "
                f"sample_rate={self.sample_rate}, options={sorted(self.options.items())})")

    def __call__(self, sample: dict) -> dict:
        audio, rate = audio_of(sample, "compute_features")
        if self.sample_rate is not None and rate != self.sample_rate:
            raise SampleRateError(
                f"compute_features({self.kind!r}, sample_rate={self.sample_rate}) got {rate} Hz "
                f"audio; resample it first (pipe.resample({self.sample_rate}))",
                **sample_where(sample))
        epoch = (sample.get(PLANNED) or {}).get("epoch", 0)
        generator = torch.Generator().manual_seed(
            derive_seed(self.seed, epoch, 0, 0, "planned-dither", str(sample.get(KEY))))
        out = dict(sample)
        out[FEATS] = extract_features(audio, rate, self.extractor, self.dither, generator,
                                      sample)
        del out[AUDIO]
        return out


def reverberated(audio: np.ndarray, rir: np.ndarray) -> np.ndarray:
    """``convolve_rir``'s reverberation (aligned on the response's peak, scaled back to the
    input's energy) with numpy's FFT, in float64: the same bytes whatever the number of torch
    threads (torch's FFT convolution differs in its last bits between 1 thread and more, so
    a DataLoader worker and the main process would not agree). ``rir`` is mono.

    >>> out = reverberated(np.ones(8, np.float32), np.array([0.0, 1.0, 0.5], np.float32))
    >>> out.shape, out.dtype, round(float(np.sum(out.astype(np.float64) ** 2)), 4)
    ((8,), dtype('float32'), 8.0)
    """
    x = np.asarray(audio, np.float64)
    x = x.T if x.ndim == 2 else x
    h = np.asarray(rir, np.float64)
    peak = int(np.argmax(np.abs(h)))
    length = x.shape[-1]
    n = fast_fft_len(length + h.shape[0] - 1)
    y = np.fft.irfft(np.fft.rfft(x, n) * np.fft.rfft(h, n), n)[..., peak:peak + length]
    energy_in, energy_out = float(np.sum(np.square(x))), float(np.sum(np.square(y)))
    if energy_out > 0.0:
        y = y * np.sqrt(energy_in / energy_out)
    return np.ascontiguousarray(y.T if y.ndim == 2 else y).astype(np.float32)


def _mono_like(x: np.ndarray, audio: np.ndarray, key: str, sample: dict) -> np.ndarray:
    if x.ndim == 1:
        return x
    if audio.ndim == 1:
        return x[:, 0]
    raise DataError(f"streams=: the item {key!r} has {x.shape[1]} channels; the planned road "
                    "mixes mono items only", key=sample.get(KEY), source=sample.get(SOURCE))


@plain_iterator
class _Feeder(IterDataPipe):
    """The samples of the batch :class:`BatchFrontEnd` runs through its stages."""

    holds_nothing = True  # the batch is the one BatchFrontEnd is transforming

    def __init__(self, slot: list) -> None:
        self._slot = slot  # [the batch]: set by BatchFrontEnd (a list: no probe stands for it)

    def __iter__(self) -> Iterator[dict]:
        yield from self._slot[0]


def _unplanned(sample: dict) -> dict:
    out = dict(sample)
    out.pop(PLANNED, None)
    return out


@plain_iterator
class BatchFrontEnd(IterDataPipe[list]):
    """Each batch of a plan through the per-sample stages ``build`` makes, one batch at a
    time: the batch's samples, transformed, in the plan's order. A sample the stages leave out
    (``load_audio(on_error="skip")``, counted there) makes the batch smaller; a batch that
    loses every sample is a :class:`~speechpipe.errors.DataError` naming its keys (every rank
    takes the same steps: no batch may vanish). Every process plans on all the rows, so what
    the stages up to the plan count (``filter_by_duration``'s drops) is reported by DataLoader
    worker 0 only: :func:`~speechpipe.recipes.pipeline_report` gives the corpus's counts,
    not one copy per worker.

    Args:
        source_datapipe: the planned batches (``plan_batches``, :class:`RowPlanner`).
        build: a function ``pipe -> pipe`` of per-sample stages that hold nothing between
            samples (and draw from nothing that runs through a pass: see
            :class:`KeyedAugment`).

    >>> pipe = BatchFrontEnd(IterableWrapper([[{"key": "a"}, {"key": "b"}], [{"key": "c"}]]),
    ...                      lambda p: p.filter(lambda s: s["key"] != "b"))
    >>> [[s["key"] for s in batch] for batch in pipe]
    [['a'], ['c']]
    """

    holds_nothing = True

    def __init__(self, source_datapipe: IterDataPipe, build: Callable[[IterDataPipe],
                                                                      IterDataPipe]) -> None:
        self.source_datapipe = source_datapipe
        self._slot: list = [[]]
        self.feeder = _Feeder(self._slot)
        self.stages = build(self.feeder).map(_unplanned)

    def __iter__(self) -> Iterator[list]:
        nodes = graph_nodes(self.stages, lambda n: n is self.feeder)
        seeded = [n for n in nodes if isinstance(n, Seeded)]
        # the stages' counts (skips, tokens) are of this pass over the plan, not of the last
        # batch: each batch's pass adds to what the batches before it counted
        ledgers = [v for n in nodes for v in vars(n).values()
                   if isinstance(v, Ledger) and not v.per_worker]
        for ledger in ledgers:
            ledger.reset()
        for batch in self.source_datapipe:
            for stage in seeded:  # one pass per batch: each stays in the pipeline's epoch
                stage.set_epoch(stage.epoch)
            out = self._transform(batch, ledgers)
            if batch and not out:
                keys = [s.get(KEY) for s in batch]
                raise DataError(f"every utterance of a planned batch was left out ({len(keys)}: "
                                f"{keys[:5]}); a batch may lose samples but not vanish (every "
                                "rank takes the same steps)", key=keys[0],
                                source=batch[0].get(SOURCE))
            yield out
        for ledger in ledgers:  # warned once per pass (by the main process, with workers)
            ledger.end_of_pass()
        if process_position().worker > 0:
            # every process plans on all the rows: what the stages up to the plan counted
            # (the duration filter's drops) is the corpus's, reported once, by worker 0
            for node in graph_nodes(self.source_datapipe):
                for value in vars(node).values():
                    if isinstance(value, Ledger):
                        value.reset()

    def _transform(self, batch: list, ledgers: list) -> list:
        """``batch`` through the stages, their ledgers adding this batch to the pass's counts
        and warning of nothing yet (:meth:`__iter__` warns once at the end of the pass)."""
        before = [ledger.to_dict() for ledger in ledgers]
        quiet = [getattr(ledger, "quiet", None) for ledger in ledgers]
        for ledger, was in zip(ledgers, quiet):
            if was is not None:
                ledger.quiet = True
        self._slot[0] = batch
        try:
            return list(self.stages)
        finally:
            self._slot[0] = []
            for ledger, was, counted in zip(ledgers, quiet, before):
                ledger.merge(counted)
                if was is not None:
                    ledger.quiet = was

    def __len__(self) -> int:
        return len(self.source_datapipe)


def rows_loader(load: Callable[[IterDataPipe], IterDataPipe]) -> Callable[[Any], dict]:
    """``row -> sample with audio`` by the pipe stages ``load`` (e.g. ``load_audio``)."""
    return _RowLoad(load)


class _RowLoad:
    def __init__(self, load: Callable[[IterDataPipe], IterDataPipe]) -> None:
        self.load = load

    def __call__(self, row: dict) -> dict:
        [sample] = list(self.load(IterableWrapper([row], deepcopy=False)))
        return sample
