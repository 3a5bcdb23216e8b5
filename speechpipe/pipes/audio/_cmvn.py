"""CMVN: cepstral mean and variance normalisation of features.

:class:`CmvnStats` accumulates global statistics (:func:`compute_cmvn_stats`; WeNet's JSON or
Kaldi's stats matrix on disk), :func:`normalize_features` applies them (or an utterance's own),
and ``apply_cmvn`` (:class:`CmvnApplierIterDataPipe`) is the stage. ``speechpipe cmvn``
(:mod:`speechpipe.cli.cmvn`) computes the statistics file.

**Several channels.** Features ``(frames, channels, dim)`` are normalised, by default, with
statistics per dimension **shared over the channels** (every channel's frames counted in the
same sums): ESPnet's ASR frontends pick or beamform one channel before their global MVN, whose
statistics are per feature dimension, and Kaldi's multi-microphone recipes (AMI ``mdm``,
CHiME) treat each channel as an utterance of the same speaker, pooled in one CMVN. So a
statistics file computed on mono features normalises multichannel ones and the reverse, and
the files keep their format (WeNet JSON, Kaldi matrix). ``per_channel=True``
(:func:`compute_cmvn_stats`, :func:`normalize_features`, ``apply_cmvn(utterance=True)``)
keeps statistics per ``(channel, dim)`` instead, for arrays whose channels differ (close-talk
beside far-field): their JSON holds ``channels × dim`` nested lists (speechpipe reads them back;
WeNet and Kaldi do not), and they apply only to features with that many channels.
"""

from __future__ import annotations

import json
import numbers
import os
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np
import torch

from ...errors import DataError, MissingDataError
from ...sample import FEATS, Sample
from ._common import batch_feats_of, batch_where, feats_of, sample_where, source_len, valid_frames
from .._core import functional_datapipe, IterDataPipe

__all__ = [
    "CmvnApplier",
    "CmvnApplierIterDataPipe",
    "CmvnStats",
    "VAR_FLOOR",
    "cmvn_stats_of_part",
    "compute_cmvn_stats",
    "merge_cmvn_stats",
    "normalize_batch",
    "normalize_features",
]

#: Variance floor of CMVN, as Kaldi's ``apply-cmvn`` (and WeNet's global CMVN).
VAR_FLOOR = 1.0e-20


@dataclass
class CmvnStats:
    """Streaming mean/variance statistics of features: frame count, sum and sum of squares
    per dimension, accumulated in float64 (Kaldi's ``compute-cmvn-stats``). The sums are
    ``(dim,)`` (frames of every channel pooled) or, per channel, ``(channels, dim)`` (``count``
    then counts frames, each holding one vector per channel).

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
    def empty(cls, dim: int | tuple[int, int]) -> "CmvnStats":
        """No frames yet; ``dim`` is the feature size or ``(channels, dim)`` (per channel)."""
        return cls(0, np.zeros(dim, np.float64), np.zeros(dim, np.float64))

    @property
    def dim(self) -> int:
        return int(self.sum.shape[-1])

    @property
    def channels(self) -> int | None:
        """The channel count of per-channel statistics; ``None`` when shared (or mono)."""
        return int(self.sum.shape[0]) if self.sum.ndim == 2 else None

    @property
    def mean(self) -> np.ndarray:
        return self.sum / self.count

    @property
    def variance(self) -> np.ndarray:
        """Population variance ``E[x²] - E[x]²`` (not floored; see :data:`VAR_FLOOR`)."""
        mean = self.mean
        return self.sum_sq / self.count - mean * mean

    def update(self, feats: np.ndarray) -> None:
        """Add the frames of one ``(frames, dim)`` or ``(frames, channels, dim)`` array (per
        channel statistics take only the latter, with their channel count)."""
        f = np.asarray(feats, dtype=np.float64)
        if self.sum.ndim == 1:
            f = f.reshape(-1, f.shape[-1])  # every channel's frames pooled
        elif f.shape[1:] != self.sum.shape:
            raise ValueError(f"per-channel statistics of shape {self.sum.shape} cannot take "
                             f"features of shape {f.shape}")
        self.count += int(f.shape[0])
        self.sum += f.sum(axis=0)
        self.sum_sq += np.einsum("i...,i...->...", f, f)

    def merge(self, other: "CmvnStats") -> "CmvnStats":
        """Statistics of both (e.g. from several workers or shards)."""
        if other.sum.shape != self.sum.shape:
            raise ValueError(f"cannot merge statistics of shape {self.sum.shape} and "
                             f"{other.sum.shape}")
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
        return cls._checked(data["frame_num"], sums, squares, path, ndims=(1, 2))

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
    def _checked(cls, count: Any, sums: np.ndarray, squares: np.ndarray, path: str,
                 ndims: tuple[int, ...] = (1,)):
        if isinstance(count, bool) or not isinstance(count, numbers.Integral) or count <= 0:
            raise DataError(f"CMVN frame count must be a positive int, got {count!r}", source=path)
        if sums.ndim not in ndims or sums.shape != squares.shape or 0 in sums.shape:
            want = " (or per channel, equal-length lists of them)" if 2 in ndims else ""
            raise DataError(f"CMVN sums and sums of squares must be equal-length non-empty "
                            f"lists{want}, got {sums.shape} and {squares.shape}", source=path)
        return cls(int(count), sums, squares)


def compute_cmvn_stats(
    samples: Iterable[Any], *, progress: bool = True, desc: str = "cmvn",
    per_channel: bool = False, executor: Any = None,
) -> CmvnStats:
    """Accumulate :class:`CmvnStats` over samples with ``feats`` (or bare ``(frames, dim)`` /
    ``(frames, channels, dim)`` arrays), streaming: one utterance in memory at a time, float64
    sums, progress (a tqdm bar on a terminal, lines in a log).

    Channels are pooled (statistics per dimension, shared over channels: the module's
    documentation says why); ``per_channel=True`` keeps them per ``(channel, dim)``, and then
    every sample must have the first one's channel count.

    **On an executor** (any :class:`concurrent.futures.Executor`, or a Dask
    ``distributed.Client``): ``samples`` is then a sequence of *parts*, each an iterable of
    samples that is sent to a worker and iterated there (a list, a datapipe over some shards
    or manifest rows that loads and computes the features: whatever pickles); each part's
    partial sums come back and are merged in part order. The result is the one-process result
    over the parts one after the other, up to float64 rounding (sums added in another order:
    a relative difference around ``1e-15``); the frame count is exact. A part without frames
    adds nothing. The job-array form is ``speechpipe cmvn --task I/N`` then ``--merge``.

    Raises :class:`~speechpipe.errors.DataError` naming the key for a sample without features
    or whose dimension (per channel: shape) differs from the first one's (across parts: naming
    the part), and ``ValueError`` when there are no frames at all.

    >>> s = compute_cmvn_stats([np.ones((3, 2), np.float32)], progress=False)
    >>> s.count, s.mean.tolist()
    (3, [1.0, 1.0])
    >>> import concurrent.futures
    >>> with concurrent.futures.ThreadPoolExecutor(2) as pool:
    ...     parts = [[np.ones((3, 2), np.float32)], [np.zeros((1, 2), np.float32)]]
    ...     compute_cmvn_stats(parts, executor=pool, progress=False).count
    4
    """
    from ...progress import progress_bar

    if executor is not None:
        from ...executors import as_executor, run_tasks

        parts = list(samples)
        found: list[CmvnStats | None] = [None] * len(parts)
        with progress_bar(total=len(parts), desc=desc, unit="part",
                          disable=not progress) as bar:
            for i, partial in run_tasks(as_executor(executor), cmvn_stats_of_part,
                                        [(part, per_channel) for part in parts], bar):
                found[i] = partial
        return merge_cmvn_stats(found)
    with progress_bar(samples, desc=desc, unit="utt", disable=not progress) as items:
        stats = _accumulate(items, per_channel)
    if stats is None or stats.count == 0:
        raise ValueError("compute_cmvn_stats: no frames to accumulate")
    return stats


def cmvn_stats_of_part(args: tuple[Iterable[Any], bool]) -> CmvnStats | None:
    """The statistics of one part (``(samples, per_channel)``), ``None`` without frames: a
    task of :func:`compute_cmvn_stats` on an executor (a module-level function: a Dask worker
    imports it by name)."""
    samples, per_channel = args
    stats = _accumulate(samples, per_channel)
    return None if stats is None or stats.count == 0 else stats


def merge_cmvn_stats(parts: Sequence[CmvnStats | None]) -> CmvnStats:
    """The statistics of every part (``None``: a part without frames), merged in order.

    Raises:
        DataError: parts of different dimensions (per channel: shapes), naming them.
        ValueError: no frames in any part.

    >>> one = CmvnStats(1, np.array([2.0]), np.array([4.0]))
    >>> merge_cmvn_stats([one, None, one]).count
    2
    """
    total: CmvnStats | None = None
    first = 0
    for i, partial in enumerate(parts):
        if partial is None:
            continue
        if total is None:
            total, first = CmvnStats(partial.count, partial.sum.copy(),
                                     partial.sum_sq.copy()), i
            continue
        if partial.sum.shape != total.sum.shape:
            raise DataError(f"compute_cmvn_stats: part {i + 1} has features of shape "
                            f"{partial.sum.shape} (dim, or channels x dim), part {first + 1} "
                            f"of {total.sum.shape}")
        total = total.merge(partial)
    if total is None or total.count == 0:
        raise ValueError("compute_cmvn_stats: no frames to accumulate")
    return total


def _accumulate(samples: Iterable[Any], per_channel: bool) -> CmvnStats | None:
    stats: CmvnStats | None = None
    for item in samples:
        if isinstance(item, Mapping):
            feats = feats_of(item, "compute_cmvn_stats", channels=True)
            where = sample_where(item)
        else:
            feats, where = np.asarray(item), {}
            if feats.ndim not in (2, 3):
                raise ValueError(f"compute_cmvn_stats expects (frames, dim) or (frames, "
                                 f"channels, dim) arrays, got shape {feats.shape}")
        if stats is None:
            stats = CmvnStats.empty(_stats_shape(feats, per_channel, where))
        if feats.shape[-1] != stats.dim:
            raise DataError(f"compute_cmvn_stats: features of dim {feats.shape[-1]}, but earlier "
                            f"ones have dim {stats.dim}", **where)
        if per_channel and feats.shape[1:] != stats.sum.shape:
            raise DataError(f"compute_cmvn_stats: per-channel statistics of {stats.channels} "
                            f"channels, but these features have shape {feats.shape}", **where)
        stats.update(feats)
    return stats


def _stats_shape(feats: np.ndarray, per_channel: bool, where: dict) -> int | tuple:
    """The sums' shape of statistics of ``feats``: ``dim``, or ``(channels, dim)``."""
    if not per_channel:
        return int(feats.shape[-1])
    if feats.ndim != 3:
        raise DataError(f"per-channel CMVN needs (frames, channels, dim) features, got shape "
                        f"{feats.shape}: select_channel/downmix the audio, or per_channel=False",
                        **where)
    return tuple(feats.shape[1:])


def normalize_features(
    feats: np.ndarray,
    stats: CmvnStats | None = None,
    *,
    norm_means: bool = True,
    norm_vars: bool = True,
    per_channel: bool = False,
) -> np.ndarray:
    """``(feats - mean) / sqrt(max(var, VAR_FLOOR))`` in float32, per dimension.

    The statistics are ``stats`` (global CMVN) or, when ``None``, the utterance's own
    (per-utterance CMVN, Kaldi's ``apply-cmvn`` on ``utt2spk`` = identity). Mean and scale are
    computed in float64 and applied in float32, as WeNet's ``GlobalCMVN``. On ``(frames,
    channels, dim)`` features, the utterance's statistics pool its channels, or with
    ``per_channel=True`` are each channel's own; ``stats`` of dim ``dim`` apply to every
    channel, per-channel ``stats`` channel by channel.

    >>> normalize_features(np.array([[1.0], [3.0]], np.float32)).tolist()
    [[-1.0], [1.0]]
    """
    if stats is None:
        stats = CmvnStats.empty(_stats_shape(feats, per_channel and feats.ndim == 3, {}))
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


def normalize_batch(
    feats: torch.Tensor,
    lengths: Sequence[int],
    stats: CmvnStats | None = None,
    *,
    norm_means: bool = True,
    norm_vars: bool = True,
) -> torch.Tensor:
    """:func:`normalize_features` of each row of a padded ``(B, frames, dim)`` batch, on the
    batch's device; row ``b`` has ``lengths[b]`` real frames and its padding is kept as it is.

    With ``stats`` (global CMVN) every row gets exactly the numbers of
    :func:`normalize_features`. Without (per-utterance CMVN) each row's statistics are summed
    over its real frames only, in float64 on the device (then the same float32 mean and scale
    as :func:`normalize_features`): equal to it to float64 summation order (torch's and
    numpy's sums add in different orders), i.e. to about ``1e-6`` after normalisation.

    >>> out = normalize_batch(torch.tensor([[[1.0], [3.0]], [[5.0], [9.0]]]), [2, 1])
    >>> out[:, :, 0].tolist()
    [[-1.0, 1.0], [0.0, 9.0]]
    """
    counts = [int(n) for n in lengths]
    terms = None if stats is None else _device_terms(stats, norm_means, norm_vars, feats.device)
    return _normalize_batch(feats, counts, terms, norm_means, norm_vars)


def _device_terms(stats: CmvnStats, norm_means: bool, norm_vars: bool,
                  device: torch.device) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    return tuple(None if t is None else torch.from_numpy(t).to(device)
                 for t in _cmvn_terms(stats, norm_means, norm_vars))


def _normalize_batch(x: torch.Tensor, counts: list[int],
                     terms: tuple[torch.Tensor | None, torch.Tensor | None] | None,
                     norm_means: bool, norm_vars: bool) -> torch.Tensor:
    valid = valid_frames(counts, x.shape[1], x.device)[:, :, None]
    if terms is None:  # each row's own statistics, over its real frames, in float64
        wide = torch.where(valid, x.to(torch.float64), 0.0)  # padding may hold anything
        n = torch.tensor(counts, dtype=torch.float64, device=x.device).clamp(min=1)[:, None]
        mean = wide.sum(dim=1) / n
        mean_f = scale = None
        if norm_means:
            mean_f = mean.to(torch.float32)[:, None, :]
        if norm_vars:
            variance = (wide * wide).sum(dim=1) / n - mean * mean
            scale = (1.0 / variance.clamp(min=VAR_FLOOR).sqrt()).to(torch.float32)[:, None, :]
    else:
        mean_f, scale = terms
    out = x
    if mean_f is not None:
        out = out - mean_f
    if scale is not None:
        out = out * scale
    return torch.where(valid, out, x)


@functional_datapipe("apply_cmvn")
class CmvnApplierIterDataPipe(IterDataPipe[Sample]):
    """Cepstral mean and variance normalisation of ``feats`` (functional name: ``apply_cmvn``).

    Consumes samples with ``feats`` ``(frames, dim)`` or ``(frames, channels, dim)``; yields
    them with normalised ``feats``
    (float32) by :func:`normalize_features`: with global statistics (``stats``: a
    :class:`CmvnStats` or the path of a file :meth:`CmvnStats.load` reads -- read when
    iteration starts, never in the constructor), or with each utterance's own
    (``utterance=True``). Compute global statistics with :func:`compute_cmvn_stats` or
    ``speechpipe cmvn``. Several channels: statistics of dim ``dim`` (the default of
    :func:`compute_cmvn_stats`, and every mono statistics file) apply to every channel;
    per-channel ones (``compute_cmvn_stats(per_channel=True)``) channel by channel; an
    utterance's own pool its channels unless ``per_channel=True``.

    Args:
        source_datapipe: samples with features.
        stats: global statistics or their file (``None`` with ``utterance=True``).
        norm_means: subtract the mean.
        norm_vars: divide by the standard deviation (variance floored at :data:`VAR_FLOOR`).
        utterance: per-utterance CMVN instead of global statistics.
        per_channel: with ``utterance=True``, each channel's own statistics (global ones carry
            their layout: a ``ValueError`` here).
        batched: consume collated batches (``feats`` ``(B, frames, dim)`` tensors or arrays
            with ``feats_len``, e.g. after ``move_to_device`` and
            ``compute_features(batched=True)``) and normalise them on their device with
            :func:`normalize_batch`: statistics over each row's real frames only, padding
            kept. ``feats`` comes back as it came (a tensor on its device, or an array).

    Errors: a sample without features, or whose dimension differs from the statistics', or
    whose channel count differs from per-channel statistics', raises
    :class:`~speechpipe.errors.DataError` naming its key.

    >>> from speechpipe import IterableWrapper
    >>> rows = [{"key": "u1", "feats": np.array([[1.0], [3.0]], np.float32)}]
    >>> stats = CmvnStats(count=2, sum=np.array([2.0]), sum_sq=np.array([4.0]))
    >>> [s["feats"].tolist() for s in IterableWrapper(rows).apply_cmvn(stats)]
    [[[0.0], [2.0]]]
    """

    holds_nothing = True  # item by item: nothing kept between two yields

    def __init__(
        self,
        source_datapipe: IterDataPipe,
        stats: CmvnStats | str | os.PathLike | None = None,
        *,
        norm_means: bool = True,
        norm_vars: bool = True,
        utterance: bool = False,
        per_channel: bool = False,
        batched: bool = False,
    ) -> None:
        for name, value in (("norm_means", norm_means), ("norm_vars", norm_vars),
                            ("utterance", utterance), ("per_channel", per_channel),
                            ("batched", batched)):
            if not isinstance(value, bool):
                raise TypeError(f"{name} must be a bool, got {value!r}")
        if utterance and stats is not None:
            raise ValueError("give stats (global CMVN) or utterance=True, not both")
        if not utterance and stats is None:
            raise ValueError("apply_cmvn needs stats (a CmvnStats or its file) or utterance=True")
        if per_channel and not utterance:
            raise ValueError("per_channel=True is for utterance CMVN; global statistics are per "
                             "channel when computed so (compute_cmvn_stats(per_channel=True))")
        if stats is not None and not isinstance(stats, (CmvnStats, str, os.PathLike)):
            raise TypeError(f"stats must be a CmvnStats or a path, got {type(stats).__name__}")
        self.stats = stats
        self.norm_means = norm_means
        self.norm_vars = norm_vars
        self.utterance = utterance
        self.per_channel = per_channel
        self.batched = batched
        self.source_datapipe = source_datapipe

    def __iter__(self) -> Iterator[Sample]:
        stats = self.stats
        if isinstance(stats, (str, os.PathLike)):
            stats = CmvnStats.load(stats)
        if self.batched:
            yield from self._batches(stats)
            return
        if stats is not None:
            dim = stats.dim
            mean, scale = _cmvn_terms(stats, self.norm_means, self.norm_vars)
        if stats is None:
            norm_means, norm_vars = self.norm_means, self.norm_vars
            for sample in self.source_datapipe:
                feats = feats_of(sample, "apply_cmvn", channels=True)
                out = dict(sample)
                out[FEATS] = normalize_features(feats, norm_means=norm_means,
                                                norm_vars=norm_vars, per_channel=self.per_channel)
                yield out
            return
        channels = stats.channels
        for sample in self.source_datapipe:
            feats = feats_of(sample, "apply_cmvn", channels=True)
            if feats.shape[-1] != dim:
                raise DataError(f"apply_cmvn: features of dim {feats.shape[-1]}, but the CMVN "
                                f"statistics have dim {dim}", **sample_where(sample))
            if channels is not None and (feats.ndim != 3 or feats.shape[1] != channels):
                raise DataError(f"apply_cmvn: the CMVN statistics are per channel, for "
                                f"{channels} channels; the features have shape {feats.shape}",
                                **sample_where(sample))
            out = dict(sample)
            out[FEATS] = _normalize(feats, mean, scale)
            yield out

    def _batches(self, stats: CmvnStats | None) -> Iterator[Mapping]:
        terms: dict[torch.device, tuple] = {}  # the float32 mean and scale, per device
        if stats is not None and stats.channels is not None:
            raise ValueError(f"apply_cmvn(batched=True): the statistics are per channel "
                             f"({stats.channels}), and batches are (B, frames, dim): use the "
                             f"per-sample stage for features of several channels")
        for batch in self.source_datapipe:
            feats, counts = batch_feats_of(batch, "apply_cmvn")
            if stats is not None and feats.shape[2] != stats.dim:
                raise DataError(f"apply_cmvn: features of dim {feats.shape[2]}, but the CMVN "
                                f"statistics have dim {stats.dim}", **batch_where(batch))
            if stats is not None and feats.device not in terms:
                terms[feats.device] = _device_terms(stats, self.norm_means, self.norm_vars,
                                                    feats.device)
            out = dict(batch)
            normalized = _normalize_batch(feats, counts, terms.get(feats.device),
                                          self.norm_means, self.norm_vars)
            out[FEATS] = (normalized.numpy() if isinstance(batch[FEATS], np.ndarray)
                          else normalized)
            yield out

    def __len__(self) -> int:
        return source_len(self)


CmvnApplier = CmvnApplierIterDataPipe

