"""Corpus statistics as a person reads them: a summary, percentiles, padding efficiency and a
length histogram.

``speechpipe stats`` (:mod:`speechpipe.cli.stats`) and :func:`corpus_stats` read utterance
durations from what a pipeline would read -- manifests (``.jsonl``/``.tsv``, optionally
``.gz``, with ``duration``), or tar shards written by ``speechpipe pack`` (their
``index.jsonl`` lengths; give the output folder, a shard path or a brace pattern) -- and report:

- a ``describe``-style summary: utterances, speakers, hours, sample rates and channels (with
  counts, from the manifest fields that record them), empty transcripts, utterances shorter
  than ``min_seconds`` or longer than ``max_seconds`` (by default the batch budget: such an
  utterance makes a batch of its own), mean and standard deviation;
- duration percentiles (min, 5, 25, 50, 75, 95, 99 %, max);
- the **padding efficiency** (real ÷ padded seconds) of budget batches at ``budget`` seconds
  padded seconds per batch, simulated on the durations alone with speechpipe's own batching
  functions, as the training pipelines batch: a seeded shuffle, length-sorted buffers of
  ``buffer_size`` utterances (:func:`~speechpipe.pipes.batching._buckets.bucket_groups`), greedy packing
  (:func:`~speechpipe.pipes.batching._buckets.pack_batches` with
  :class:`~speechpipe.pipes.batching._buckets.PaddedArea`);
- shards missing or shorter than their index says (:func:`shard_problems`);
- a length histogram: as text (:func:`text_histogram`), and as a PNG with matplotlib when it
  is installed (``pip install 'speechpipe[plot]'``; :func:`write_histogram_png`: axis titles,
  an optional log-scaled count axis, the median, p95 and p99 and the budget marked).
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from .errors import DataError, MissingDataError
from .pipes.batching import BatchStats, PaddedArea, bucket_groups, pack_batches
from .remote import RemoteOptions, is_remote
from .sample import DURATION, KEY, NUM_FRAMES, SAMPLE_RATE, SOURCE, SPEAKER, TEXT
from .seeding import derive_rng

__all__ = [
    "CorpusStats",
    "PERCENTILES",
    "corpus_stats",
    "length_histogram",
    "padding_efficiency",
    "read_durations",
    "read_sample_rates",
    "shard_problems",
    "text_histogram",
    "write_histogram_png",
]

#: Percentiles reported (0 is the minimum, 100 the maximum).
PERCENTILES = (0, 5, 25, 50, 75, 95, 99, 100)

_SHARD_SUFFIXES = (".tar", ".tar.gz", ".tgz")


# --------------------------------------------------------------------------- reading


_CHANNEL_FIELDS = ("channels", "num_channels")


@dataclass
class _Facts:
    """What the manifests record besides durations, gathered while reading them."""

    described: int = 0  # utterances read from manifests or samples (not from a shard index)
    speakers: set = field(default_factory=set)
    rates: Counter = field(default_factory=Counter)
    channels: Counter = field(default_factory=Counter)
    texts: int = 0
    empty_texts: int = 0

    def add(self, sample: Mapping) -> None:
        self.described += 1
        if sample.get(SPEAKER) is not None:
            self.speakers.add(str(sample[SPEAKER]))
        if sample.get(SAMPLE_RATE) is not None:
            self.rates[sample[SAMPLE_RATE]] += 1
        channels = next((sample[f] for f in _CHANNEL_FIELDS if sample.get(f) is not None), None)
        if channels is not None:
            self.channels[channels] += 1
        if TEXT in sample:
            self.texts += 1
            self.empty_texts += not str(sample[TEXT] or "").strip()


def _manifest_durations(path: str, frame_shift: float, facts: _Facts | None = None
                        ) -> list[float]:
    from .pipes.sources import read_manifest

    out = []
    for sample in read_manifest(path):
        if facts is not None:
            facts.add(sample)
        if DURATION in sample:
            value = sample[DURATION]
        elif NUM_FRAMES in sample:
            value = sample[NUM_FRAMES] * frame_shift
        else:
            raise DataError(f"manifest line has no {DURATION!r} (nor {NUM_FRAMES!r}); "
                            "write durations with 'speechpipe prepare'",
                            source=sample.get(SOURCE, path), key=sample.get(KEY))
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            raise DataError(f"{DURATION!r} must be seconds >= 0, got {value!r}",
                            source=sample.get(SOURCE, path), key=sample.get(KEY))
        out.append(float(value))
    return out


def _index_durations(source: str, frame_shift: float, sample_rate: int,
                     remote: RemoteOptions | None = None) -> list[float]:
    from .index import length_seconds

    index = _shard_index(source, remote)
    rate = index.sample_rate or sample_rate  # the rate pack recorded wins (issue 18)
    scale = length_seconds(1.0, index.length_unit, frame_shift=frame_shift, sample_rate=rate)
    return [n * scale for n in index.lengths()]


def _shard_index(source: str, remote: RemoteOptions | None = None):
    from .index import ShardIndex, is_folder_url
    from .pipes.sources import expand_patterns

    if os.path.isdir(source) or is_folder_url(source):
        return ShardIndex.read(source, remote=remote)
    return ShardIndex.for_shards(expand_patterns(source, remote=remote), remote=remote)


def _length_groups(manifests_or_shards: Any, frame_shift: float, sample_rate: int,
                   remote: RemoteOptions | None) -> dict[str, tuple[int, float, float, float]]:
    """Per length group of each pack folder among the sources (local or a URL): utterances,
    seconds, shortest and longest (seconds)."""
    from .index import ShardIndex, is_folder_url, length_seconds

    out: dict[str, tuple[int, float, float, float]] = {}
    for item in _sources(manifests_or_shards):
        if isinstance(item, list):
            continue
        source = os.fspath(item)
        if not (os.path.isdir(source) or is_folder_url(source)) or _manifests_in(source):
            continue  # not a pack folder (a folder of manifests has no length groups)
        index = ShardIndex.read(source, remote=remote)
        scale = length_seconds(1.0, index.length_unit, frame_shift=frame_shift,
                               sample_rate=index.sample_rate or sample_rate)
        lengths: dict[str, list[float]] = {}
        for entry in index.shards:
            if "/" in entry.name:  # "<group>/<shard>": a folder pack wrote with groups
                group = entry.name.rsplit("/", 1)[0]
                lengths.setdefault(f"{source.rstrip('/')}/{group}/", []).extend(
                    n * scale for n in entry.lengths)
        for name, values in lengths.items():
            out[name] = (len(values), float(sum(values)), min(values, default=0.0),
                         max(values, default=0.0))
    return out


def shard_problems(manifests_or_shards: Any, *, remote: RemoteOptions | None = None
                   ) -> list[str]:
    """One line per indexed local shard that is missing or shorter than its index says
    (truncated by a full disk or an interrupted copy: reading it would stop, or skip the
    utterances after the break), for the shard sources among ``manifests_or_shards``."""
    items = manifests_or_shards
    if isinstance(items, (str, os.PathLike)):
        items = [items]
    if isinstance(items, Mapping):
        items = list(items.values())
    return [problem for item in items if isinstance(item, (str, os.PathLike))
            and _is_shards(os.fspath(item))
            for problem in _shard_index(os.fspath(item), remote).missing_or_short()]


def _is_shards(source: str) -> bool:
    from .index import is_folder_url

    if os.path.isdir(source):
        return not _manifests_in(source)  # a folder of manifests is not shards
    if is_folder_url(source):
        return True
    name = source.lower()
    return name.endswith(_SHARD_SUFFIXES) or ("{" in name and ".tar" in name)


def read_durations(
    manifests_or_shards: Any, *, frame_shift: float = 0.01, sample_rate: int = 16000,
    remote: RemoteOptions | None = None,
) -> list[float]:
    """Utterance durations (seconds) of manifests or shards, in reading order.

    Args:
        manifests_or_shards: a path or several: manifest files (``duration`` field, or
            ``num_frames`` × ``frame_shift``), shard folders holding ``index.jsonl``, shard
            paths or brace patterns (``shards/data-{00000..00009}.tar``); also a list of sample
            dicts, or the ``{part: manifest}`` dict of a ``prepare_<corpus>``.
        frame_shift: seconds per frame, for lengths counted in frames.
        sample_rate: Hz, for shard lengths counted in samples by an index that does not
            record its rate (``pack`` records it, and the recorded rate is the one used).
        remote: how shards and indexes in object storage are read (a pack folder URL
            ``s3://bucket/corpus/shards`` stands for every length group, as a local folder).

    Raises:
        MissingDataError: a file, folder or pattern is absent.
        DataError: a manifest line without a duration, a malformed index (naming file and
            line).

    >>> read_durations([{"key": "a", "duration": 1.5}, {"key": "b", "num_frames": 250}])
    [1.5, 2.5]
    """
    return _read(manifests_or_shards, frame_shift, sample_rate, None, remote)


def _read(manifests_or_shards: Any, frame_shift: float, sample_rate: int,
          facts: _Facts | None, remote: RemoteOptions | None = None) -> list[float]:
    out: list[float] = []
    for item in _sources(manifests_or_shards):
        if isinstance(item, list):
            out.extend(_sample_durations(item, frame_shift, facts))
            continue
        source = os.fspath(item)
        if _manifests_in(source):  # a folder of manifests (prepare's output): each of them
            for path in _manifests_in(source):
                out.extend(_manifest_durations(path, frame_shift, facts))
        elif _is_shards(source):
            out.extend(_index_durations(source, frame_shift, sample_rate, remote))
        elif not os.path.exists(source):
            raise MissingDataError("no such manifest, shard folder or shard", source=source)
        else:
            out.extend(_manifest_durations(source, frame_shift, facts))
    return out


def _manifests_in(source: str) -> list[str]:
    """The manifests of a local folder that has no shard index (``prepare``'s output folder),
    sorted; ``[]`` for anything else."""
    if not os.path.isdir(source) or os.path.exists(os.path.join(source, "index.jsonl")):
        return []
    return sorted(os.path.join(source, n) for n in os.listdir(source)
                  if n.endswith((".jsonl.gz", ".jsonl")))


def _sources(manifests_or_shards: Any) -> list:
    """Paths (manifests, shard folders or patterns) and sample lists, from any accepted form."""
    items = manifests_or_shards
    if isinstance(items, Mapping):
        items = list(items.values())
    if isinstance(items, (str, os.PathLike)):
        items = [items]
    items = list(items)
    return [items] if items and all(isinstance(s, Mapping) for s in items) else items


def read_sample_rates(manifests_or_shards: Any, *, remote: RemoteOptions | None = None
                      ) -> dict[int, int]:
    """``{Hz: utterances}`` of manifests (their ``sample_rate`` field), sample lists, or shard
    folders (the counts ``pack`` records in each folder's ``index.jsonl``; a shard pattern
    counts the whole folders of its shards), sorted by rate. Utterances whose rate is not
    recorded (features, an older index) are not counted.

    >>> read_sample_rates([{"key": "a", "sample_rate": 16000}, {"key": "b",
    ...                    "sample_rate": 8000}, {"key": "c", "sample_rate": 16000}])
    {8000: 1, 16000: 2}
    """
    from collections import Counter

    from .index import ShardIndex
    from .pipes.sources import read_manifest
    from .index import is_folder_url
    from .pipes.sources import expand_patterns

    counts: Counter[int] = Counter()
    for item in _sources(manifests_or_shards):
        if isinstance(item, list):
            counts.update(int(s["sample_rate"]) for s in item if "sample_rate" in s)
            continue
        source = os.fspath(item)
        if not _is_shards(source):
            counts.update(int(s["sample_rate"]) for s in read_manifest(source)
                          if "sample_rate" in s)
            continue
        if os.path.isdir(source) or is_folder_url(source):
            counts.update(ShardIndex.read(source, remote=remote).sample_rates or {})
            continue
        folders = sorted({p.rsplit("/", 1)[0] if is_remote(p) else
                          os.path.dirname(os.path.abspath(p))
                          for p in expand_patterns(source, remote=remote)})
        for folder in folders:
            counts.update(ShardIndex.read(folder, remote=remote).sample_rates or {})
    return dict(sorted(counts.items()))


def _sample_durations(samples: Iterable[Mapping], frame_shift: float,
                      facts: _Facts | None = None) -> list[float]:
    out = []
    for s in samples:
        if facts is not None:
            facts.add(s)
        if DURATION in s:
            out.append(float(s[DURATION]))
        elif NUM_FRAMES in s:
            out.append(float(s[NUM_FRAMES]) * frame_shift)
        else:
            raise DataError(f"sample has no {DURATION!r}", key=s.get(KEY))
    return out


# --------------------------------------------------------------------------- numbers


def padding_efficiency(
    durations: Sequence[float], budget: float, *, buffer_size: int = 2000,
    seed: int = 0,
) -> BatchStats:
    """Simulate budget batching on durations; return the :class:`BatchStats` of the pass.

    As the training pipelines batch: the durations in a seeded random order, held in a
    buffer of ``buffer_size`` and emitted as length-sorted groups
    (:func:`~speechpipe.pipes.batching._buckets.bucket_groups`, one bucket), each group packed greedily
    while ``n × longest <= budget`` seconds
    (:func:`~speechpipe.pipes.batching._buckets.pack_batches`,
    an utterance longer than the budget makes a batch of its own). ``.efficiency`` is real ÷
    padded seconds.

    >>> stats = padding_efficiency([1.0, 2.0, 2.0, 4.0], budget=4.0)
    >>> stats.batches, round(stats.efficiency, 4)
    (3, 0.9)
    """
    if not budget > 0:
        raise ValueError(f"budget must be seconds > 0, got {budget!r}")
    if not isinstance(buffer_size, int) or buffer_size < 1:
        raise ValueError(f"buffer_size must be an int >= 1, got {buffer_size!r}")
    rng = derive_rng(seed, 0, 0, 0, "stats")
    order = list(durations)
    rng.shuffle(order)
    constraint = PaddedArea(budget=float(budget))
    stats = BatchStats("stats")
    for group in bucket_groups(iter(order), buffer_size=buffer_size, boundaries=None,
                               measure=float, rng=rng):
        for _ in pack_batches(group, constraint, stats=stats, lengths=float):
            pass
    return stats


def length_histogram(durations: Sequence[float], bins: int = 40) -> tuple[list[int], list[float]]:
    """``(counts, edges)`` of ``bins`` equal-width bins from the shortest to the longest.

    >>> length_histogram([1.0, 1.5, 3.0], bins=2)
    ([2, 1], [1.0, 2.0, 3.0])
    """
    if not isinstance(bins, int) or bins < 1:
        raise ValueError(f"bins must be an int >= 1, got {bins!r}")
    if len(durations) == 0:
        return [0] * bins, [0.0] * (bins + 1)
    low, high = float(min(durations)), float(max(durations))
    if high == low:
        high = low + 1.0
    counts, edges = np.histogram(np.asarray(durations, dtype=np.float64), bins=bins,
                                 range=(low, high))
    return [int(c) for c in counts], [float(e) for e in edges]


def _counts(counter: Mapping, unit: str = "") -> str:
    return ", ".join(f"{k}{unit}: {n}" for k, n in sorted(counter.items(), key=lambda kv:
                                                          (-kv[1], str(kv[0]))))


@dataclass
class CorpusStats:
    """What :func:`corpus_stats` measured; :meth:`report` prints it.

    ``speakers``, ``sample_rates``, ``channels`` and ``empty_texts`` come from the manifest
    fields that record them (``speaker``, ``sample_rate``, ``channels``, ``text``); they are
    ``None`` (or empty) when no input records them, e.g. a shard index.
    """

    utterances: int
    seconds: float
    percentiles: dict[int, float]
    counts: list[int]
    edges: list[float]
    budget_seconds: float | None = None
    padding_efficiency: float | None = None
    batches: int | None = None
    buffer_size: int | None = None
    png: str | None = None
    sources: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # shard_problems()
    speakers: int | None = None
    sample_rates: dict[int, int] = field(default_factory=dict)
    channels: dict[int, int] = field(default_factory=dict)
    empty_texts: int | None = None
    min_seconds: float = 0.0
    max_seconds: float | None = None
    undersize: int = 0
    oversize: int = 0
    mean: float = 0.0
    std: float = 0.0
    described: int = 0  # utterances whose manifest fields were read
    log_y: bool = False
    note: str | None = None
    #: ``{"<folder>/<group>": (utterances, seconds, shortest, longest)}`` of each length group
    #: of the pack folders read (``pack --group``), in folder and group order.
    groups: dict[str, tuple[int, float, float, float]] = field(default_factory=dict)

    @property
    def hours(self) -> float:
        return self.seconds / 3600

    # long: one line per fact, in the order a reader looks for them
    def report(self, histogram: bool = True) -> str:
        """The summary, then the text histogram (unless ``histogram=False``)."""
        p = self.percentiles
        partly = (f" (of the {self.described} utterances from manifests)"
                  if 0 < self.described < self.utterances else "")
        unknown = "not recorded"
        lines = [
            f"utterances          {self.utterances}",
            f"speakers            "
            f"{unknown if self.speakers is None else f'{self.speakers}{partly}'}",
            f"hours               {self.hours:.4f} ({self.seconds:.1f} s)",
            f"sample rates        "
            f"{_counts(self.sample_rates, ' Hz') + partly if self.sample_rates else unknown}",
            f"channels            "
            f"{_counts(self.channels) + partly if self.channels else unknown}",
            f"empty transcripts   "
            f"{unknown if self.empty_texts is None else f'{self.empty_texts}{partly}'}",
            f"undersize           {self.undersize} shorter than {self.min_seconds:g} s",
        ]
        if self.max_seconds is not None:
            lines.append(f"oversize            {self.oversize} longer than "
                         f"{self.max_seconds:g} s")
        for name, (count, seconds, low, high) in self.groups.items():
            lines.append(f"length group        {name}: {count} utterances, "
                         f"{seconds / 3600:.4f} h ({seconds:.1f} s), {low:.2f}-{high:.2f} s")
        if self.utterances:
            lines.append(f"duration (s)        mean {self.mean:.2f} / std {self.std:.2f}")
            lines.append("percentiles (s)     " + " / ".join(
                f"{'min' if q == 0 else 'max' if q == 100 else 'median' if q == 50 else f'p{q}'}"
                f" {p[q]:.2f}" for q in PERCENTILES))
        if self.padding_efficiency is not None:
            lines.append(f"padding efficiency  {self.padding_efficiency:.4f} at "
                         f"{self.budget_seconds:g} padded s per batch ({self.batches} batches, "
                         f"buffer {self.buffer_size})")
        if self.problems:
            lines.append(f"warning: {len(self.problems)} shard(s) missing or shorter than "
                         f"their index says (counted above, unreadable in training):")
            lines.extend(f"  {p}" for p in self.problems[:10])
        if self.png is not None:
            lines.append(f"histogram           {self.png} ({len(self.counts)} bins, "
                         f"{self.edges[0]:.2f}-{self.edges[-1]:.2f} s)")
        if self.note:
            lines.append(self.note)
        if histogram and self.utterances:
            lines.append("")
            lines.append(text_histogram(self.counts, self.edges, log_y=self.log_y))
        return "\n".join(lines)


# long: the docstring documents every argument; the body is ~30 lines
def corpus_stats(
    manifests_or_shards: Any,
    budget: float | None = None,
    *,
    png: str | os.PathLike | None = None,
    bins: int = 40,
    buffer_size: int = 2000,
    seed: int = 0,
    frame_shift: float = 0.01,
    sample_rate: int = 16000,
    min_seconds: float = 0.1,
    max_seconds: float | None = None,
    log_y: bool = False,
    remote: RemoteOptions | None = None,
) -> CorpusStats:
    """Statistics of the utterances of manifests or shards (see :func:`read_durations`).

    Args:
        manifests_or_shards: manifests (or a folder of them, as prepare writes), shard
            folders / paths / patterns, sample lists.
        budget: padded seconds per batch for the padding efficiency (``None``: skip).
        png: write the length histogram there (needs matplotlib; without it the report says
            so and shows the text histogram only).
        bins: histogram bins.
        buffer_size, seed: of the batching simulation (:func:`padding_efficiency`).
        frame_shift, sample_rate: to turn frame / sample counts into seconds.
        min_seconds: utterances shorter than this are counted as undersize.
        max_seconds: utterances longer than this are counted as oversize (default: the
            budget, if any: such an utterance makes a batch alone, or is dropped).
        log_y: a log-scaled count axis in the histograms (shows the long tail).
        remote: how shards and indexes in object storage are read
            (:class:`~speechpipe.remote.RemoteOptions`, e.g. ``storage_options``).

    >>> s = corpus_stats([{"key": str(i), "duration": d} for i, d in enumerate([1, 2, 2, 4])],
    ...                  budget=4.0)
    >>> s.utterances, s.seconds, s.percentiles[50], round(s.padding_efficiency, 4)
    (4, 9.0, 2.0, 0.9)
    """
    facts = _Facts()
    durations = _read(manifests_or_shards, frame_shift, sample_rate, facts, remote)
    values = np.asarray(durations, dtype=np.float64)
    percentiles = ({q: float(np.percentile(values, q)) for q in PERCENTILES}
                   if len(values) else {})
    counts, edges = length_histogram(durations, bins)
    stats = CorpusStats(len(durations), float(values.sum()), percentiles, counts, edges)
    if isinstance(manifests_or_shards, (str, os.PathLike)):
        stats.sources = [os.fspath(manifests_or_shards)]
    stats.problems = shard_problems(manifests_or_shards, remote=remote)
    stats.groups = _length_groups(manifests_or_shards, frame_shift, sample_rate, remote)
    _describe(stats, values, facts, min_seconds,
              budget if max_seconds is None else max_seconds)
    if not stats.sample_rates:  # shards: the counts pack recorded in their index
        stats.sample_rates = read_sample_rates(manifests_or_shards, remote=remote)
    stats.log_y = bool(log_y)
    if budget is not None:
        batched = padding_efficiency(durations, budget, buffer_size=buffer_size,
                                     seed=seed)
        stats.budget_seconds = float(budget)
        stats.padding_efficiency = batched.efficiency
        stats.batches = batched.batches
        stats.buffer_size = buffer_size
    if png is not None:
        try:
            stats.png = write_histogram_png(png, counts, edges, log_y=log_y,
                                            percentiles=percentiles, budget=budget)
        except ImportError as exc:
            stats.note = f"histogram           no PNG: {exc}"
    return stats


def _describe(stats: CorpusStats, values: np.ndarray, facts: _Facts, min_seconds: float,
              max_seconds: float | None) -> None:
    """Fill the summary fields of ``stats``."""
    stats.described = facts.described
    if facts.described:
        stats.speakers = len(facts.speakers) if facts.speakers else None
        stats.sample_rates = dict(facts.rates)
        stats.channels = dict(facts.channels)
        stats.empty_texts = facts.empty_texts if facts.texts else None
    stats.min_seconds = float(min_seconds)
    stats.undersize = int((values < min_seconds).sum())
    if max_seconds is not None:
        stats.max_seconds = float(max_seconds)
        stats.oversize = int((values > max_seconds).sum())
    if len(values):
        stats.mean, stats.std = float(values.mean()), float(values.std())


# --------------------------------------------------------------------------- histograms


def text_histogram(counts: Sequence[int], edges: Sequence[float], *, width: int = 50,
                   log_y: bool = False, max_rows: int = 20) -> str:
    """The histogram as text: one row per bin (adjacent bins merged down to ``max_rows``,
    which the header says), its seconds, a bar of ``#`` scaled to the largest (by log of the
    count with ``log_y``, so that a tail of a few utterances stays visible), and the count.

    >>> print(text_histogram([3, 1, 0, 6], [0, 1, 2, 3, 4], width=6))
    duration (s) utterances
    0.00-1.00 |###    3
    1.00-2.00 |#      1
    2.00-3.00 |       0
    3.00-4.00 |###### 6
    """
    counts, edges = list(counts), list(edges)
    if len(edges) != len(counts) + 1:
        raise ValueError(f"need len(counts) + 1 edges, got {len(counts)} counts and "
                         f"{len(edges)} edges")
    step = max(1, -(-len(counts) // max_rows))
    rows = [(edges[i], edges[min(i + step, len(counts))], sum(counts[i:i + step]))
            for i in range(0, len(counts), step)]
    peak = max((n for _, _, n in rows), default=0) or 1

    def scale(n: int) -> float:
        return np.log1p(n) / np.log1p(peak) if log_y else n / peak

    digits = len(f"{edges[-1]:.2f}") if edges else 4
    merged = (f" ({len(counts)} bins, {step} per row)" if step > 1 else "")
    lines = [f"{'duration (s)':<{2 * digits + 2}} utterances" + (" (log scale)" if log_y
                                                               else "") + merged]
    for low, high, n in rows:
        bar = "#" * round(scale(n) * width) if n else ""
        if n and not bar:
            bar = "."  # fewer than one character's worth: still visible
        lines.append(f"{low:{digits}.2f}-{high:{digits}.2f} |{bar:<{width}} {n}")
    return "\n".join(lines)


# long: one call per element of the figure (titles, bars, marks, labels)
def write_histogram_png(
    path: str | os.PathLike, counts: Sequence[int], edges: Sequence[float], *,
    log_y: bool = False, percentiles: Mapping[int, float] | None = None,
    budget: float | None = None, width: int = 800, height: int = 400,
) -> str:
    """Draw the length histogram as a PNG with matplotlib (the ``plot`` extra) and return the
    path: axis titles, the count axis log-scaled with ``log_y``, the median, p95 and p99 of
    ``percentiles`` as labelled vertical lines, an 11-point font. The duration axis spans the
    data (the bins' edges), whatever the budget. The ``budget`` (padded seconds per batch) is
    said where it means something: in the title, as the batch size it gives at the median
    duration; and as a line on the axis only where it falls within the data (utterances
    longer than the budget make a batch alone).

    Raises:
        ImportError: matplotlib is not installed (the message has the install line).

    >>> import os, tempfile
    >>> p = write_histogram_png(os.path.join(tempfile.mkdtemp(), "h.png"), [1, 3], [0, 1, 2],
    ...                         percentiles={50: 1.2, 95: 1.8, 99: 1.9})
    >>> with open(p, "rb") as f:
    ...     f.read(8) == b"\\x89PNG\\r\\n\\x1a\\n"
    True
    """
    if len(edges) != len(counts) + 1:
        raise ValueError(f"need len(counts) + 1 edges, got {len(counts)} counts and "
                         f"{len(edges)} edges")
    if width < 200 or height < 150:
        raise ValueError(f"the image must be at least 200 × 150, got {width} × {height}")
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ImportError("the histogram PNG needs matplotlib: pip install "
                          "'speechpipe[plot]' (or matplotlib)") from exc
    dpi = 100
    fig = Figure(figsize=(width / dpi, height / dpi), dpi=dpi)
    ax = fig.add_subplot()
    edges = [float(e) for e in edges]
    ax.stairs(list(counts), edges, fill=True, color="#4272c4", label="utterances")
    if log_y:
        ax.set_yscale("log")
    marks = [(q, f"{'median' if q == 50 else f'p{q}'} {percentiles[q]:.1f} s", "#444444")
             for q in (50, 95, 99) if percentiles and q in percentiles]
    for i, (q, label, color) in enumerate(marks):
        ax.axvline(percentiles[q], color=color, linestyle=("--", "-.", ":")[i], linewidth=1.2,
                   label=label)
    if budget is not None and edges[0] <= budget <= edges[-1]:
        ax.axvline(budget, color="#c0392b", linewidth=1.5,
                   label=f"budget {budget:g} s: longer ones batch alone")
    ax.set_xlim(edges[0], edges[-1] if edges[-1] > edges[0] else edges[0] + 1.0)
    ax.set_xlabel("utterance duration (s)", fontsize=11)
    ax.set_ylabel("utterances" + (" (log scale)" if log_y else ""), fontsize=11)
    title = f"{sum(counts)} utterances, {len(counts)} bins"
    median = (percentiles or {}).get(50)
    if budget is not None and median:
        title += f"; budget {budget:g} s ≈ {budget / median:.0f} median utterances per batch"
    ax.set_title(title, fontsize=12)
    ax.tick_params(labelsize=10)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=10, loc="upper right")
    fig.tight_layout()
    path = os.fspath(path)
    tmp = f"{path}.tmp{os.getpid()}.png"
    fig.savefig(tmp, dpi=dpi)
    os.replace(tmp, path)
    return path
