"""Pipelines over manifests: training, evaluation and semi-supervised batches, and their report.

:func:`train_pipeline` (shuffle, duration filter, speed perturbation, features, tokenization,
length buckets, budget batches, padding), :func:`eval_pipeline` (fixed order) and
:func:`semi_supervised_pipeline` (``{"sup": batch, "unsup": batch}`` per step) build on
manifests (:func:`manifest_samples`); ``filter_by_duration``
(:class:`~speechpipe.pipes.batching._buckets.DurationFilterIterDataPipe`) counts what it drops, and
:func:`pipeline_report` prints every count of a built pipeline.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Callable, Iterable, Mapping, Sequence

from ..diagnostics import check_on_error
from ..errors import DataError, check_int
from ..pipes._core import graph_nodes, IterableWrapper, IterDataPipe
from ..pipes.audio import FEATURE_KINDS
from ..pipes.batching import (
    batch_budget, BatchConstraint, IndexLength, LengthUnitError, SampleCount,
)
from ..pipes.collate import PadCollate
from ..pipes.sources import ManifestFileReaderIterDataPipe
from ..remote import RemoteOptions, is_remote
from ..sample import DURATION, FEATS, KEY, SOURCE, TEXT, Sample
from ._planned import (
    BatchFrontEnd, KeyedAugment, KeyedFeatures, RowPlanner, apply_planned_speed, rows_loader,
)
from ._prepare import AUDIO_PATH, FEATS_PATH, OFFSET, ManifestsArg, resolve_manifests

__all__ = [
    "FrontEnd",
    "augment_source",
    "eval_pipeline",
    "manifest_samples",
    "pipeline_report",
    "semi_supervised_pipeline",
    "train_pipeline",
]

#: ``train_pipeline(streams=AUTO)`` (the default): the planned road where the inputs allow.
AUTO = "auto"

#: Values of ``features_on``: per utterance in the workers, or per batch on the device.
FEATURES_ON = ("workers", "device")


def manifest_samples(manifests: ManifestsArg, *, corpus: str | None = None,
                     parts: Sequence[str] | None = None,
                     remote: RemoteOptions | None = None) -> IterDataPipe[Sample]:
    """The samples of manifests, in file order, as a pipe (no audio read yet).

    Files are opened when iteration starts (local files with ``read_manifest_files``, which
    offers ``shuffle_samples`` their memory-mapped row tables; manifests at object-storage
    URLs with ``open(remote=remote)`` + ``parse_manifest``); in-memory
    sample lists are streamed as they are, and so is a pipe of samples (e.g.
    ``sp.read_lhotse(...)``, ``sp.read_hf_dataset(ds, with_audio=False)``). See
    :func:`resolve_manifests` for the forms of ``manifests``.

    >>> [s["key"] for s in manifest_samples([[{"key": "u1"}, {"key": "u2"}]])]
    ['u1', 'u2']
    """
    return _manifest_rows(manifests, corpus=corpus, parts=parts, remote=remote)[0]


def _manifest_rows(manifests: ManifestsArg, *, corpus: str | None = None,
                   parts: Sequence[str] | None = None, remote: RemoteOptions | None = None
                   ) -> tuple[IterDataPipe[Sample], set[str]]:
    """:func:`manifest_samples`' pipe and the kinds of its sources (``"files"``,
    ``"object storage"``, ``"sample lists"``, ``"a pipe"``)."""
    if isinstance(manifests, IterDataPipe):
        return manifests, {"a pipe"}
    pipes = []
    paths: list[str] = []
    kinds: set[str] = set()

    def parsed(paths: list[str]) -> IterDataPipe[Sample]:
        if any(is_remote(p) for p in paths):
            kinds.add("object storage")
            return IterableWrapper(paths).open(remote=remote).parse_manifest()
        # local files: the reader offers plan_batches and shuffle_samples their mapped rows
        kinds.add("files")
        return IterableWrapper(paths).read_manifest_files()

    for source in resolve_manifests(manifests, corpus=corpus, parts=parts):
        if isinstance(source, str):
            paths.append(source)
            continue
        if paths:
            pipes.append(parsed(paths))
            paths = []
        kinds.add("sample lists")
        pipes.append(IterableWrapper(source, deepcopy=False))
    if paths:
        pipes.append(parsed(paths))
    if not pipes:
        raise ValueError("no manifests given")
    return (pipes[0] if len(pipes) == 1 else pipes[0].concat(*pipes[1:])), kinds


@dataclass(frozen=True)
class FrontEnd:
    """What the pipelines do to each loaded utterance before batching: resampling, speed
    perturbation, features, tokenization (the ``front_end=`` of :func:`train_pipeline` and
    :func:`eval_pipeline`, which also take these fields as keyword arguments).

    Args:
        sample_rate: the rate (Hz) every utterance is resampled to on the fly (torchaudio,
            kernels cached per rate pair; 16 kHz, the ASR rate, by default). Features are then
            computed for this rate only: a sample at another rate is a
            :class:`~speechpipe.errors.SampleRateError`, never features at the wrong scale.
            ``None``: each utterance at its own rate (features per rate, and the collate
            refuses a batch that mixes rates). Ignored for ``input="feats"``.
        features: ``"fbank"`` (80 bins), ``"mfcc"``, ``"mel"`` (80 mels) or ``None`` (batches
            hold ``audio``).
        feature_options: options of ``compute_features`` (``num_mel_bins``, ``n_fft``...;
            ``backend="torchaudio"`` computes with torchaudio's functions instead of
            speechpipe's vectorised ones).
        speed_perturb: factors to draw from per utterance (e.g. ``(0.9, 1.0, 1.1)``);
            training only.
        features_on: where the features are computed: ``"workers"`` (default: per utterance,
            before batching) or ``"device"``: the workers only load (batches hold ``audio``
            ``(B, T)``, ``audio_len`` and ``sample_rate``) and :meth:`on_device` computes the
            features of each batch after ``build_loader(..., device=...)`` moved it, in one
            batched call on that device.
        tokenizer: a speechpipe tokenizer (``load_tokenizer``) or its file's path, or ``None``:
            no ``tokens``.
        text_field: the field tokenized (``normalized_text`` for LJSpeech).
        normalizer: a ``TextNormalizer`` applied before tokenizing.
        noise: a noise source for ``add_noise`` (:func:`augment_source`: manifest paths,
            e.g. MUSAN's, prepare's dict, or a pipe of samples with audio); training only.
        snr_db: the ``(low, high)`` SNR range of the noise, dB.
        noise_p: the share of utterances mixed with noise.
        babble: noise items summed per mixture (3-7 with MUSAN's speech: babble).
        rir: a room impulse response source for ``reverberate`` (as ``noise``, e.g.
            RIRS_NOISES's ``smallroom``); applied before the noise; training only.
        rir_p: the share of utterances reverberated.

    >>> FrontEnd(features="mel").feature_kwargs()
    {'n_mels': 80}
    >>> FrontEnd(features="fbank", feature_options={"num_mel_bins": 40}).feature_kwargs()
    {'num_mel_bins': 40}
    """

    sample_rate: int | None = 16_000
    features: str | None = "fbank"
    feature_options: Mapping[str, Any] | None = None
    features_on: str = "workers"
    speed_perturb: Sequence[float] | None = None
    tokenizer: Any = None
    text_field: str = TEXT
    normalizer: Callable[[str], str] | None = None
    noise: Any = None
    snr_db: tuple[float, float] = (0.0, 15.0)
    noise_p: float = 1.0
    babble: int = 1
    rir: Any = None
    rir_p: float = 1.0

    def __post_init__(self) -> None:
        if self.sample_rate is not None and (isinstance(self.sample_rate, bool) or not isinstance(
                self.sample_rate, int) or self.sample_rate < 1):
            raise ValueError(f"sample_rate must be an int >= 1 (Hz) or None, got "
                             f"{self.sample_rate!r}")
        if self.features is not None and self.features not in FEATURE_KINDS:
            raise ValueError(f"features must be one of {FEATURE_KINDS} or None, got "
                             f"{self.features!r}")
        if self.features_on not in FEATURES_ON:
            raise ValueError(f"features_on must be one of {FEATURES_ON}, got "
                             f"{self.features_on!r}")

    @property
    def perturbs(self) -> bool:
        """Whether it changes utterances at random (training only)."""
        return any(v is not None for v in (self.speed_perturb, self.noise, self.rir))

    def feature_kwargs(self) -> dict[str, Any]:
        """The options given to ``compute_features``: ``feature_options``, with 80 mel bins
        for ``fbank`` and ``mel`` unless they set a number of bins."""
        options = dict(self.feature_options or {})
        if self.features in ("fbank", "mel") and not any(k in options for k in ("num_mel_bins",
                                                                                   "n_mels")):
            options["num_mel_bins" if self.features == "fbank" else "n_mels"] = 80
        return options

    def on_device(self, batches: Iterable[dict], *, seed: int = 0) -> IterDataPipe[dict]:
        """The batches of a pipeline built with ``features_on="device"``, with their
        features: ``compute_features(batched=True)`` on each batch where it is (after
        ``build_loader(..., device=...)``: on the device), ``feats`` ``(B, T', D)`` and
        ``feats_len`` added, ``audio`` dropped -- the numbers the workers would have computed
        for each utterance. ``seed``: the pipeline's (dither draws). Other front ends: the
        batches as they are.

        >>> import numpy as np
        >>> batch = {"audio": np.zeros((1, 16000), np.float32), "audio_len": np.array([16000]),
        ...          "sample_rate": np.array([16000])}
        >>> [out] = FrontEnd(features_on="device").on_device([batch])
        >>> tuple(out["feats"].shape), out["feats_len"].tolist(), "audio" in out
        ((1, 98, 80), [98], False)
        """
        pipe = (batches if isinstance(batches, IterDataPipe)
                else IterableWrapper(batches, deepcopy=False))
        if self.features is None or self.features_on != "device":
            return pipe
        return pipe.compute_features(self.features, batched=True, seed=seed,
                                     **self.feature_kwargs())


#: The keyword arguments of :func:`train_pipeline` that build its :class:`FrontEnd`.
_FRONT_END_FIELDS = tuple(f.name for f in fields(FrontEnd))
#: Those of :func:`eval_pipeline` (which perturbs nothing).
_PERTURBING = ("speed_perturb", "noise", "snr_db", "noise_p", "babble", "rir", "rir_p")
_EVAL_FRONT_END_FIELDS = tuple(f for f in _FRONT_END_FIELDS if f not in _PERTURBING)


def _check_front_end(front_end: FrontEnd | None, options: Mapping[str, Any], caller: str,
                     allowed: Sequence[str]) -> None:
    """Check that a builder got ``front_end`` or some of its fields as keywords, not both."""
    for name in options:
        if name not in allowed:
            raise TypeError(f"{caller}() got an unexpected keyword argument {name!r}")
    if front_end is None:
        return
    if options:
        raise TypeError(f"{caller}: give front_end or {', '.join(options)}, not both "
                        "(they are fields of the FrontEnd)")
    if not isinstance(front_end, FrontEnd):
        raise TypeError(f"front_end must be a FrontEnd, got {front_end!r}")
    if "speed_perturb" not in allowed and front_end.perturbs:
        raise ValueError(f"{caller} perturbs nothing: give a front_end without speed_perturb, "
                         "noise or rir")


def _load_feats(sample: Mapping[str, Any]) -> Sample:
    """Read the Kaldi matrix named by ``feats_path`` into ``feats``."""
    from ..pipes.kaldi import read_matrix

    key = sample.get(KEY)
    value = sample.get(FEATS_PATH)
    if not isinstance(value, str):
        raise DataError(f"sample has no {FEATS_PATH!r} (a feats.scp value) to read",
                        source=sample.get(SOURCE), key=key)
    out = dict(sample)
    out[FEATS] = read_matrix(value, source=sample.get(SOURCE), key=key)
    return out


def _loaded(pipe: IterDataPipe, input: Any, on_error: str,
            remote: RemoteOptions | None) -> IterDataPipe:
    if callable(input):  # the caller's loading stage(s): + audio, sample_rate (or feats)
        return input(pipe)
    if input == "audio":
        # -> + audio (T,) float32, sample_rate: [offset, offset + duration) of a segment, the
        # whole file otherwise (duration then set to the decoded length); unreadable files
        # raise, or are skipped and counted (on_error="skip")
        return pipe.load_audio(field=AUDIO_PATH, offset_field=OFFSET, duration_field=DURATION,
                               whole_without_offset=True, on_error=on_error, remote=remote)
    # -> + feats (frames, dim) float32
    return pipe.map(_load_feats)


def augment_source(source: Any, *, seed: int = 0,
                   remote: RemoteOptions | None = None) -> IterDataPipe[Sample]:
    """The source ``add_noise`` or ``reverberate`` reads: a pipe of samples with ``audio``.

    ``source`` is a pipe (used as it is), or manifests in any form :func:`resolve_manifests`
    takes (``prepare_musan(...)["noise"]``, paths, a folder...): their rows are shuffled at
    each pass (``shuffle_samples(split=False, per_process=True)``: the stage gives each pass
    of its source an epoch of its own, so the noise does not come in file order, and each rank
    and worker an order of its own, so that workers do not put the same noise at the same
    places of their streams) and
    loaded as the training road loads utterances (``load_audio``; object-storage manifests
    and audio with ``remote``). Nothing is read here.

    >>> import numpy as np, os, soundfile, tempfile
    >>> wav = os.path.join(tempfile.mkdtemp(), "n1.wav")
    >>> soundfile.write(wav, np.ones(80, np.float32) * 0.1, 16000)
    >>> rows = [[{"key": "n1", "audio_path": wav}]]
    >>> [(s["key"], s["audio"].shape) for s in augment_source(rows)]
    [('n1', (80,))]
    """
    if isinstance(source, IterDataPipe):
        return source
    rows = manifest_samples(source, remote=remote).shuffle_samples(seed=seed, split=False,
                                                                   per_process=True)
    return rows.load_audio(field=AUDIO_PATH, offset_field=OFFSET, duration_field=DURATION,
                           whole_without_offset=True, remote=remote)


class _SourceItems:
    """The items of a noise or response source in a fixed order (the planned road's
    :class:`~speechpipe.recipes._planned.KeyedAugment`): a pipe's samples, or manifest rows."""

    def __init__(self, source: Any, remote: RemoteOptions | None) -> None:
        self.source, self.remote = source, remote

    def __call__(self) -> list:
        return list(self.source if isinstance(self.source, IterDataPipe)
                    else manifest_samples(self.source, remote=self.remote))


class _LoadItem:
    """A noise or response row loaded as the training road loads utterances."""

    def __init__(self, remote: RemoteOptions | None) -> None:
        self.remote = remote

    def __call__(self, pipe: IterDataPipe) -> IterDataPipe:
        return pipe.load_audio(field=AUDIO_PATH, offset_field=OFFSET, duration_field=DURATION,
                               whole_without_offset=True, remote=self.remote)


def _keyed(kind: str, source: Any, front_end: FrontEnd, seed: int,
           remote: RemoteOptions | None) -> KeyedAugment:
    load = (_same if isinstance(source, IterDataPipe) else rows_loader(_LoadItem(remote)))
    if kind == "reverb":
        return KeyedAugment(kind, _SourceItems(source, remote), load, p=front_end.rir_p,
                            seed=seed)
    return KeyedAugment(kind, _SourceItems(source, remote), load, p=front_end.noise_p,
                        snr_db=front_end.snr_db, babble=front_end.babble, seed=seed)


def _same(sample: Any) -> Any:
    return sample


def _transformed(pipe: IterDataPipe, front_end: FrontEnd, *, input: Any, seed: int,
                 history: int = 4096, remote: RemoteOptions | None = None,
                 planned: bool = False) -> IterDataPipe:
    """The front end's stages; ``planned``: the planned road's (the speed factor drawn by
    the plan, reverberation and noise drawn per key: :mod:`speechpipe.recipes._planned`)."""
    if front_end.perturbs and input == "feats":
        raise ValueError("speed_perturb, noise and rir need audio; these manifests give "
                         "features")
    rate = front_end.sample_rate if input != "feats" else None
    if rate is not None:
        pipe = pipe.resample(rate)  # audio at rate Hz, sample_rate set
    if front_end.speed_perturb is not None:
        # audio resampled, duration updated
        pipe = (pipe.map(apply_planned_speed) if planned else
                pipe.perturb_speed(factors=tuple(front_end.speed_perturb), seed=seed))
    if front_end.rir is not None:  # audio reverberated, + augment [{"kind": "reverb"...}]
        if planned:
            pipe = pipe.map(_keyed("reverb", front_end.rir, front_end, seed, remote))
        else:
            rir = augment_source(front_end.rir, seed=seed, remote=remote)
            pipe = pipe.reverberate(rir, p=front_end.rir_p, seed=seed, history=history)
    if front_end.noise is not None:  # audio mixed, + augment [{"kind": "noise"...}]
        if planned:
            pipe = pipe.map(_keyed("noise", front_end.noise, front_end, seed, remote))
        else:
            pipe = pipe.add_noise(augment_source(front_end.noise, seed=seed, remote=remote),
                                  snr_db=front_end.snr_db, p=front_end.noise_p,
                                  babble=front_end.babble, seed=seed, history=history)
    if front_end.features is not None:
        if input == "feats":
            raise ValueError("features are computed from audio; these manifests give "
                             "features already: pass features=None")
    if front_end.features is not None and front_end.features_on == "workers":
        # -> + feats (frames, dim) float32, audio dropped (features_on="device": the batches
        # keep audio, and FrontEnd.on_device computes them after the move to the device)
        options = front_end.feature_kwargs()
        if planned and options.get("dither"):  # each utterance's dither from (seed, epoch, key)
            pipe = pipe.map(KeyedFeatures(front_end.features, seed=seed, sample_rate=rate,
                                          **options))
        else:
            pipe = pipe.compute_features(front_end.features, keep_audio=False, seed=seed,
                                         sample_rate=rate, **options)
    if front_end.tokenizer is not None:
        pipe = pipe.tokenize(front_end.tokenizer, field=front_end.text_field,
                             normalizer=front_end.normalizer)  # + tokens
    return pipe


def _check_input(input: Any, on_error: str) -> Any:
    if not callable(input) and input not in ("audio", "feats"):
        raise ValueError(f"input must be 'audio' (audio_path), 'feats' (feats_path) or a "
                         f"function pipe -> pipe that loads the audio, got {input!r}")
    check_on_error(on_error)
    return input


# long: the docstring draws the whole pipeline and every argument; the body is 15 lines
def train_pipeline(
    manifests: ManifestsArg,
    *,
    budget: float | BatchConstraint = 200.0,
    front_end: FrontEnd | None = None,
    min_duration: float | None = None,
    max_duration: float | None = None,
    seed: int = 0,
    bucket_buffer: int = 2_000,
    input: Any = "audio",
    shard: bool = True,
    on_error: str = "raise",
    remote: RemoteOptions | None = None,
    streams: int | str | None = AUTO,
    **front_end_options: Any,
) -> IterDataPipe[dict]:
    """A training pipeline over manifests: yields padded batch dicts within a budget.

    Two roads. By default (``streams="auto"``) the **planned road**: the epoch's batches are
    planned on the manifests' mapped rows over virtual streams (:class:`RowPlanner`,
    ``plan_batches``), then each batch is loaded and transformed as a whole; its batches are
    the same for any number of ranks and DataLoader workers, and rank 0's
    ``loader.state_dict()`` resumes any topology (docs/resume.md). Inputs the planned road
    cannot take go the **streaming road** (``shuffle_samples`` and ``bucket_by_length`` in each
    process), exactly these: manifests that are sample lists, a pipe of rows (``read_lhotse``,
    ``read_hf_dataset``) or object-storage URLs; ``shard=False``; a budget not in seconds
    (``sp.PaddedArea(3000)`` frames, ``sp.SampleCount(n)``). :func:`pipeline_report` names the
    road taken and why; a state saved on the streaming road refuses another topology by name.
    ``streams=None`` asks for the streaming road, ``streams=V`` for the planned one (and
    refuses those inputs by name).

    The streaming road's stages and element shapes (the planned road runs the same
    per-utterance stages on each planned batch)::

        manifest_samples      -> {key, audio_path, duration, text, speaker, ...}
        filter_by_duration    -> the same, only [min_duration, max_duration] (drops counted)
        shuffle_samples       -> the same, in an order drawn from (seed, epoch), this
                                 worker's / rank's share (when shard); exactly resumable
        load_audio            -> + audio (T,) float32, sample_rate   [input="audio"]
          (or read feats_path -> + feats (frames, dim) float32)      [input="feats"]
          (or input(pipe), e.g. load_lhotse: the caller's loading) [input callable]
        resample              -> audio at front_end.sample_rate (16 kHz by default)
        perturb_speed         -> audio resampled by a factor drawn from speed_perturb,
                                 duration updated, + speed            [optional]
        reverberate           -> audio convolved with a response of rir, + augment [rir]
        add_noise             -> audio + noise at an SNR drawn from snr_db, + augment [noise]
        compute_features      -> + feats (frames, dim), audio dropped [features]
        tokenize              -> + tokens (L,) int64 from text_field  [tokenizer]
        bucket_by_length      -> groups of similar duration (buffer of bucket_buffer)
        block_batch           -> lists of samples, n × longest duration <= budget
        collate(PadCollate)   -> {feats (B, T, D), feats_len (B,), tokens (B, L) padded -1,
                                  tokens_len, key [..], text [..], duration (B,), ...}

    The order is seeded: under :func:`speechpipe.build_loader` each pass is the next epoch
    (and a checkpoint resumes exactly); iterated directly, call :func:`speechpipe.set_epoch`
    ``(pipe, epoch)`` at each epoch for a new, reproducible order. :func:`pipeline_report`
    prints the road, what the duration filter dropped and the batches' padding efficiency.

    Args:
        manifests: see :func:`resolve_manifests` (paths, sample lists, prepare's dict), or a
            pipe of manifest rows (``sp.read_lhotse(...)``, ``sp.read_hf_dataset(...)``).
        budget: padded seconds per batch (batch size × longest duration), or a constraint
            for another unit or cost model (``sp.PaddedArea(3000)``: frames of ``feats``;
            see :func:`~speechpipe.pipes.batching._constraints.batch_budget`).
        front_end: speed perturbation, features and tokenization (:class:`FrontEnd`; default
            ``FrontEnd()``: 80-bin fbank, no perturbation, no tokens).
        min_duration, max_duration: duration range kept, seconds (``None``: no bound).
        seed: seed of the shuffle, speed perturbation, buckets and batch order.
        bucket_buffer: samples held by ``bucket_by_length`` (more: less padding).
        input: ``"audio"`` (manifests with ``audio_path``), ``"feats"`` (``feats_path``), or
            a function ``pipe -> pipe`` adding ``audio`` and ``sample_rate`` (or ``feats``,
            then with ``features=None``) to the rows: ``lambda p: p.load_lhotse()`` for
            ``sp.read_lhotse`` rows, ``lambda p: p.load_hf_audio(dataset)`` for
            ``sp.read_hf_dataset(dataset, with_audio=False)`` rows.
        shard: DataLoader workers and ranks read disjoint shares (``False``: each reads all).
        on_error: an audio file that is missing, truncated or corrupt: ``"raise"`` (default) a
            :class:`~speechpipe.errors.DataError` naming it, or ``"skip"`` the utterance,
            counted by reason in ``load_audio``'s diagnostics (:func:`pipeline_report`) and
            warned about at the end of the pass.
        remote: how manifests and ``audio_path`` values (utterances, noise, rir) that are
            object-storage URLs (``s3://bucket/a.flac``) are read
            (:class:`~speechpipe.remote.RemoteOptions`: storage options, retries; ``None``:
            the defaults), as ``ShardReadOptions(remote=)`` is for shards. Each remote audio
            file is read whole, then decoded.
        **front_end_options: instead of ``front_end``, its fields as keywords:
            ``sample_rate``, ``features``, ``feature_options``, ``speed_perturb``,
            ``tokenizer``, ``text_field``, ``normalizer``, ``noise``, ``snr_db``, ``noise_p``,
            ``babble``, ``rir``, ``rir_p`` (giving both is a ``TypeError``).
        streams: ``"auto"`` (default): the planned road with the number of virtual
            streams the planner derives from the corpus, or the streaming road for the
            inputs listed above. ``V`` (e.g. 8): the planned road over ``V`` streams (local
            JSON-lines manifests with durations; other inputs are refused by name).
            ``None``: the streaming road, whose batches depend on the number of ranks and
            workers (a checkpoint resumes on its own topology only). On the planned road
            speed factors are drawn at planning time from ``(seed, epoch, row)`` and the plan
            packs ``duration / factor``; reverberation, noise and the features' dither draw
            from ``(seed, epoch, key)``; under ``on_error="skip"`` a batch that loses a sample
            stays a batch (smaller). The two roads give a seed different orders.
    """
    _check_front_end(front_end, front_end_options, "train_pipeline", _FRONT_END_FIELDS)
    constraint = batch_budget(budget, required=True)
    _check_input(input, on_error)
    if not (streams is None or streams == AUTO):
        if isinstance(streams, str):
            raise ValueError(f"streams must be {AUTO!r}, None or an int >= 1, got {streams!r}")
        check_int("streams", streams, 1)
    front_end = front_end or FrontEnd(**front_end_options)
    pipe, kinds = _manifest_rows(manifests, remote=remote)
    unplannable = None if streams is None else _unplannable(pipe, kinds, constraint, shard)
    if unplannable is not None and streams != AUTO:
        raise ValueError(f"streams= {unplannable[1]}")
    if streams is not None and unplannable is None:
        return _planned_train(pipe, constraint, front_end, streams=streams,
                              min_duration=min_duration, max_duration=max_duration, seed=seed,
                              bucket_buffer=bucket_buffer, input=input, on_error=on_error,
                              remote=remote)
    pipe = pipe.filter_by_duration(min_duration, max_duration)
    pipe = pipe.shuffle_samples(seed=seed, split=shard)
    pipe = _loaded(pipe, input, on_error, remote)
    # the draws of noise and reverberation are kept for what bucket_by_length and block_batch
    # may hold when a checkpoint is taken (a restore mixes those samples again)
    pipe = _transformed(pipe, front_end, input=input, seed=seed,
                        history=max(4096, 4 * bucket_buffer), remote=remote)
    pipe = pipe.bucket_by_length(bucket_buffer, budget=constraint, seed=seed)
    pipe = pipe.block_batch(constraint, seed=seed)
    pipe = pipe.collate(collate_fn=PadCollate())
    pipe._recipe_road = _Road(streams, False, None if unplannable is None else unplannable[0])
    return pipe


def _unplannable(rows: IterDataPipe, kinds: set[str], constraint: BatchConstraint,
                 shard: bool) -> tuple[str, str] | None:
    """Why the planned road cannot take these inputs: ``(what, the refusal's text)``, or
    ``None`` when it can."""
    if not isinstance(rows, ManifestFileReaderIterDataPipe):
        what = ("a pipe of rows" if "a pipe" in kinds else "object-storage manifests"
                if "object storage" in kinds else "sample lists")
        return what, ("plans on the mapped rows of local JSON-lines manifests (paths, a folder, "
                      f"prepare's dict); these manifests are {what}: give streams=None (the "
                      "streaming road)")
    try:
        constraint.measure(IndexLength(1.0, "seconds"))
    except LengthUnitError:
        return "a budget not in seconds", (
            f"plans on the manifests' durations, but the budget {constraint!r} measures "
            "another unit: give seconds (a number, or length='duration'), or streams=None")
    if not shard:
        return "shard=False", ("shares the planned batches between ranks and workers; "
                               "shard=False (every process reads everything) needs streams=None")
    return None


@dataclass(frozen=True)
class _Road:
    """Which road :func:`train_pipeline` took, for :func:`pipeline_report`: ``streams`` as
    given, whether it plans, and what the planned road could not take (or ``None``)."""

    streams: Any
    planned: bool
    unplannable: str | None = None

    def report(self, pipe: IterDataPipe) -> str:
        asked = f"streams={self.streams!r}"
        if self.planned:
            [plan] = [n for n in graph_nodes(pipe) if isinstance(n, RowPlanner)]
            how = "the planner's default for these rows" if self.streams == AUTO else "given"
            v = plan.num_streams
            return (f"train_pipeline road: planned over {v} virtual stream{'s' * (v != 1)} "
                    f"({asked}: {how}); the same batches for any ranks and workers")
        why = f": the planned road cannot take {self.unplannable}" if self.unplannable else ""
        return (f"train_pipeline road: streaming ({asked}{why}); batches depend on the number "
                "of ranks and workers, a checkpoint resumes on the same topology")


def _planned_train(rows: IterDataPipe, constraint: BatchConstraint, front_end: FrontEnd, *,
                   streams: int | str, min_duration: float | None, max_duration: float | None,
                   seed: int, bucket_buffer: int, input: Any, on_error: str,
                   remote: RemoteOptions | None) -> IterDataPipe[dict]:
    """:func:`train_pipeline`'s planned road (``streams=V`` or ``"auto"``)."""

    def stages(pipe: IterDataPipe) -> IterDataPipe:
        pipe = _loaded(pipe, input, on_error, remote)
        return _transformed(pipe, front_end, input=input, seed=seed, remote=remote,
                            planned=True)

    rows = rows.filter_by_duration(min_duration, max_duration)
    plan = RowPlanner(rows, constraint, streams=None if streams == AUTO else streams, seed=seed,
                      bucket_buffer=bucket_buffer, speed_factors=front_end.speed_perturb)
    pipe = BatchFrontEnd(plan, stages).collate(collate_fn=PadCollate())
    pipe._recipe_road = _Road(streams, planned=True)
    return pipe


def eval_pipeline(
    manifests: ManifestsArg,
    *,
    budget: float | BatchConstraint = SampleCount(16),
    front_end: FrontEnd | None = None,
    min_duration: float | None = None,
    max_duration: float | None = None,
    input: Any = "audio",
    shard: bool = True,
    on_error: str = "raise",
    remote: RemoteOptions | None = None,
    **front_end_options: Any,
) -> IterDataPipe[dict]:
    """A validation / test pipeline: every utterance once, in manifest order, padded batches.

    The same stages as :func:`train_pipeline` without shuffling, perturbation or bucketing:
    batches are consecutive utterances packed while ``n × longest duration <= budget``
    seconds, or ``n`` consecutive utterances with ``budget=sp.SampleCount(n)`` (the default:
    16). No
    utterance is dropped unless a duration range is given (then counted). With ``shard``,
    DataLoader workers and ranks each take every ``n``-th utterance (``split_samples``), so
    each utterance is evaluated once over all processes; run it in one process to keep the
    manifest order. Exactly resumable, like :func:`train_pipeline`.

    Args:
        manifests: see :func:`resolve_manifests`.
        budget: padded seconds per batch, or a constraint (``sp.SampleCount(n)``: ``n``
            utterances per batch, the default ``n = 16``).
        front_end, input: as in :func:`train_pipeline` (without ``speed_perturb``).
        min_duration, max_duration: duration range kept (``None``: keep all).
        shard: share the utterances between workers and ranks (``False``: each reads all).
        on_error: as in :func:`train_pipeline` (``"skip"``: unreadable audio left out, counted).
        remote: as in :func:`train_pipeline`.
        **front_end_options: instead of ``front_end``, its fields as keywords:
            ``sample_rate``, ``features``, ``feature_options``, ``tokenizer``, ``text_field``,
            ``normalizer``.
    """
    _check_front_end(front_end, front_end_options, "eval_pipeline", _EVAL_FRONT_END_FIELDS)
    constraint = batch_budget(budget, required=True)
    _check_input(input, on_error)
    pipe = manifest_samples(manifests, remote=remote)
    if min_duration is not None or max_duration is not None:
        pipe = pipe.filter_by_duration(min_duration, max_duration)
    pipe = pipe.split_samples(split=shard)
    pipe = _loaded(pipe, input, on_error, remote)
    pipe = _transformed(pipe, front_end or FrontEnd(**front_end_options), input=input, seed=0)
    pipe = pipe.block_batch(constraint, shuffle_window=1)
    return pipe.collate(collate_fn=PadCollate())


def semi_supervised_pipeline(
    sup_manifests: ManifestsArg,
    unsup_manifests: ManifestsArg,
    *,
    budget: float | BatchConstraint = 200.0,
    unsup_budget: float | BatchConstraint | None = None,
    tokenizer: Any = None,
    until: str = "sup",
    seed: int = 0,
    **options: Any,
) -> IterDataPipe[dict]:
    """Two training pipelines zipped by name: yields ``{"sup": batch, "unsup": batch}``.

    Each source is a :func:`train_pipeline` with its own budget (the unlabelled batches are
    often larger); only the supervised one is tokenized. ``zip_by_name`` takes one batch of
    each per step; with ``until="sup"`` an epoch is one pass over the supervised data and the
    unsupervised pipeline is restarted (counted, with a new order) whenever it runs out.

    Args:
        sup_manifests, unsup_manifests: see :func:`resolve_manifests`.
        budget: padded seconds (or a constraint) per supervised batch.
        unsup_budget: the same per unsupervised batch (default: ``budget``).
        tokenizer: tokenizer of the supervised text.
        until: ``"sup"``, ``"unsup"``, ``"shortest"`` or ``"longest"`` (see ``zip_by_name``).
        seed: seed of the supervised pipeline; the unsupervised one uses ``seed + 1``.
        **options: other :func:`train_pipeline` options, given to both (with ``front_end``,
            the unsupervised pipeline gets it without its tokenizer). Both take the
            streaming road (``streams`` ``None`` or ``"auto"``, the default); a number of
            streams is refused.
    """
    if options.get("streams") not in (None, AUTO):
        raise ValueError(
            "semi_supervised_pipeline takes no streams= yet: its unsupervised pipeline restarts "
            "inside the supervised epoch, so one global batch position cannot say where both "
            "stand; give streams=None")
    options["streams"] = None  # "auto": the streaming road (see above)
    sup_options, unsup_options = dict(options), dict(options)
    if options.get("front_end") is None:
        sup_options["tokenizer"], unsup_options["tokenizer"] = tokenizer, None
    elif tokenizer is not None:
        raise TypeError("semi_supervised_pipeline: give front_end or tokenizer, not both "
                        "(it is a field of the FrontEnd)")
    else:
        unsup_options["front_end"] = replace(options["front_end"], tokenizer=None)
    sup = train_pipeline(sup_manifests, budget=budget, seed=seed, **sup_options)
    unsup = train_pipeline(
        unsup_manifests,
        budget=budget if unsup_budget is None else unsup_budget,
        seed=seed + 1, **unsup_options,
    )
    return sup.zip_by_name(unsup, names=("sup", "unsup"), until=until)


def pipeline_report(pipe: Any) -> str:
    """The reports of every stage in ``pipe``'s graph that counts something: skipped or
    filtered items (``diagnostics``), batch statistics and token counts (``stats``), and what
    each buffering stage held at its peak, in samples and MB of arrays (``buffers``; after a
    loader pass with workers, per worker: :mod:`speechpipe.loader` brings them back).

    Call it after (or during) a pass. Stages are listed from the source to the output.

    >>> from speechpipe import IterableWrapper
    >>> pipe = IterableWrapper([{"key": "a", "duration": 0.2}, {"key": "b", "duration": 2.0}])
    >>> pipe = pipe.filter_by_duration(1.0, warn=False)
    >>> _ = list(pipe)
    >>> print(pipeline_report(pipe))
    filter_by_duration skipped 1 item(s):
      shorter than 1.0 s: 1 (e.g. key 'a' (0.20 s))
    """
    found: list[str] = []
    roads: list[str] = []
    seen: set[int] = set()

    def visit(node: Any, depth: int) -> None:
        if id(node) in seen or depth > 200:
            return
        seen.add(id(node))
        road = getattr(node, "__dict__", {}).get("_recipe_road")
        if isinstance(road, _Road):
            roads.append(road.report(node))
        children = []
        for value in vars(node).values():
            if isinstance(value, IterDataPipe):
                children.append(value)
            elif isinstance(value, (list, tuple)) and len(value) <= 64:
                children.extend(v for v in value if isinstance(v, IterDataPipe))
            elif isinstance(value, dict) and len(value) <= 64:
                children.extend(v for v in value.values() if isinstance(v, IterDataPipe))
        for child in children:
            visit(child, depth + 1)
        for name in ("diagnostics", "stats", "buffers"):
            obj = getattr(node, name, None)
            if obj is not None and hasattr(obj, "report") and not isinstance(obj, type):
                if name == "diagnostics" and not getattr(obj, "counts", None):
                    continue
                found.append(obj.report())

    visit(pipe, 0)
    return "\n".join(roads + (found or ["nothing counted (no pass run yet?)"]))
