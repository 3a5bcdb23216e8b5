"""Corpus statistics: hours, utterances, length percentiles, padding efficiency, a histogram.

``speechpipe stats`` (:mod:`speechpipe.cli.stats`) and :func:`corpus_stats` read utterance
durations from what a pipeline would read -- manifests (``.jsonl``/``.tsv``, optionally
``.gz``, with ``duration``), or tar shards written by ``speechpipe pack`` (their
``index.jsonl`` lengths; give the folder, a shard path or a brace pattern) -- and report:

- the utterance count and hours, and the sample rates with their counts (manifests'
  ``sample_rate``, the ``sample_rates`` a shard index records; :func:`read_sample_rates`);
- duration percentiles (min, 5, 25, 50, 75, 95, 99 %, max);
- the **padding efficiency** (real ÷ padded seconds) of budget batches at ``budget_seconds``
  padded seconds per batch, simulated on the durations alone with speechpipe's own batching
  functions, as the training pipelines batch: a seeded shuffle, length-sorted buffers of
  ``buffer_size`` utterances (:func:`~speechpipe.pipes.batching.bucket_groups`), greedy packing
  (:func:`~speechpipe.pipes.batching.pack_batches` with
  :class:`~speechpipe.pipes.batching.PaddedArea`);
- a length histogram, drawn as a PNG by a small dependency-free writer
  (:func:`write_histogram_png`: zlib + struct, bars, axes and numeric labels).
"""

from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from .errors import DataError, MissingDataError
from .pipes.batching import BatchStats, PaddedArea, bucket_groups, pack_batches
from .sample import DURATION, KEY, NUM_FRAMES, SOURCE
from .seeding import derive_rng

__all__ = [
    "CorpusStats",
    "PERCENTILES",
    "corpus_stats",
    "length_histogram",
    "padding_efficiency",
    "read_durations",
    "read_sample_rates",
    "write_histogram_png",
]

#: Percentiles reported (0 is the minimum, 100 the maximum).
PERCENTILES = (0, 5, 25, 50, 75, 95, 99, 100)

_SHARD_SUFFIXES = (".tar", ".tar.gz", ".tgz")


# --------------------------------------------------------------------------- reading


def _manifest_durations(path: str, frame_shift: float) -> list[float]:
    from .pipes.manifests import read_manifest

    out = []
    for sample in read_manifest(path):
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


def _index_durations(source: str, frame_shift: float, sample_rate: int) -> list[float]:
    from .index import ShardIndex
    from .pipes.sources import expand_patterns

    if os.path.isdir(source):
        index = ShardIndex.read(source)
    else:
        index = ShardIndex.for_shards(expand_patterns(source))
    rate = index.sample_rate or sample_rate  # the rate pack recorded wins (issue 18)
    scale = {"frames": frame_shift, "samples": 1.0 / rate, "seconds": 1.0}.get(
        index.length_unit)
    if scale is None:
        raise DataError(f"unknown length unit {index.length_unit!r} in the shard index",
                        source=source)
    return [n * scale for n in index.lengths()]


def _is_shards(source: str) -> bool:
    if os.path.isdir(source):
        return True
    name = source.lower()
    return name.endswith(_SHARD_SUFFIXES) or ("{" in name and ".tar" in name)


def read_durations(
    manifests_or_shards: Any, *, frame_shift: float = 0.01, sample_rate: int = 16000
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

    Raises:
        MissingDataError: a file, folder or pattern is absent.
        DataError: a manifest line without a duration, a malformed index (naming file and
            line).

    >>> read_durations([{"key": "a", "duration": 1.5}, {"key": "b", "num_frames": 250}])
    [1.5, 2.5]
    """
    out: list[float] = []
    for item in _sources(manifests_or_shards):
        if isinstance(item, list):
            out.extend(_sample_durations(item, frame_shift))
            continue
        source = os.fspath(item)
        if _is_shards(source):
            out.extend(_index_durations(source, frame_shift, sample_rate))
        elif not os.path.exists(source):
            raise MissingDataError("no such manifest, shard folder or shard", source=source)
        else:
            out.extend(_manifest_durations(source, frame_shift))
    return out


def _sources(manifests_or_shards: Any) -> list:
    """Paths (manifests, shard folders or patterns) and sample lists, from any accepted form."""
    items = manifests_or_shards
    if isinstance(items, Mapping):
        items = list(items.values())
    if isinstance(items, (str, os.PathLike)):
        items = [items]
    items = list(items)
    return [items] if items and all(isinstance(s, Mapping) for s in items) else items


def read_sample_rates(manifests_or_shards: Any) -> dict[int, int]:
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
    from .pipes.manifests import read_manifest
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
        folders = ([source] if os.path.isdir(source) else
                   sorted({os.path.dirname(os.path.abspath(p))
                           for p in expand_patterns(source)}))
        for folder in folders:
            counts.update(ShardIndex.read(folder).sample_rates or {})
    return dict(sorted(counts.items()))


def _sample_durations(samples: Iterable[Mapping], frame_shift: float) -> list[float]:
    out = []
    for s in samples:
        if DURATION in s:
            out.append(float(s[DURATION]))
        elif NUM_FRAMES in s:
            out.append(float(s[NUM_FRAMES]) * frame_shift)
        else:
            raise DataError(f"sample has no {DURATION!r}", key=s.get(KEY))
    return out


# --------------------------------------------------------------------------- numbers


def padding_efficiency(
    durations: Sequence[float], budget_seconds: float, *, buffer_size: int = 2000,
    seed: int = 0,
) -> BatchStats:
    """Simulate budget batching on durations; return the :class:`BatchStats` of the pass.

    As the training pipelines batch: the durations in a seeded random order, held in a
    buffer of ``buffer_size`` and emitted as length-sorted groups
    (:func:`~speechpipe.pipes.batching.bucket_groups`, one bucket), each group packed greedily
    while ``n × longest <= budget_seconds`` (:func:`~speechpipe.pipes.batching.pack_batches`,
    an utterance longer than the budget makes a batch of its own). ``.efficiency`` is real ÷
    padded seconds.

    >>> stats = padding_efficiency([1.0, 2.0, 2.0, 4.0], budget_seconds=4.0)
    >>> stats.batches, round(stats.efficiency, 4)
    (3, 0.9)
    """
    if not budget_seconds > 0:
        raise ValueError(f"budget_seconds must be > 0, got {budget_seconds!r}")
    if not isinstance(buffer_size, int) or buffer_size < 1:
        raise ValueError(f"buffer_size must be an int >= 1, got {buffer_size!r}")
    rng = derive_rng(seed, 0, 0, 0, "stats")
    order = list(durations)
    rng.shuffle(order)
    constraint = PaddedArea(budget=float(budget_seconds))
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


@dataclass
class CorpusStats:
    """What :func:`corpus_stats` measured; :meth:`report` prints it."""

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
    sample_rates: dict[int, int] = field(default_factory=dict)

    @property
    def hours(self) -> float:
        return self.seconds / 3600

    def report(self) -> str:
        p = self.percentiles
        lines = [
            f"utterances          {self.utterances}",
            f"hours               {self.hours:.4f} ({self.seconds:.1f} s)",
        ]
        if self.sample_rates:
            lines.append("sample rates        " + ", ".join(
                f"{rate} Hz: {n}" for rate, n in self.sample_rates.items()))
        if self.utterances:
            lines.append("duration (s)        " + " / ".join(
                f"{'min' if q == 0 else 'max' if q == 100 else 'median' if q == 50 else f'p{q}'}"
                f" {p[q]:.2f}" for q in PERCENTILES))
        if self.padding_efficiency is not None:
            lines.append(f"padding efficiency  {self.padding_efficiency:.4f} at "
                         f"{self.budget_seconds:g} padded s per batch ({self.batches} batches, "
                         f"buffer {self.buffer_size})")
        if self.png is not None:
            lines.append(f"histogram           {self.png} ({len(self.counts)} bins, "
                         f"{self.edges[0]:.2f}-{self.edges[-1]:.2f} s)")
        return "\n".join(lines)


def corpus_stats(
    manifests_or_shards: Any,
    budget_seconds: float | None = None,
    *,
    png: str | os.PathLike | None = None,
    bins: int = 40,
    buffer_size: int = 2000,
    seed: int = 0,
    frame_shift: float = 0.01,
    sample_rate: int = 16000,
) -> CorpusStats:
    """Statistics of the utterances of manifests or shards (see :func:`read_durations`).

    Args:
        manifests_or_shards: manifests, shard folders / paths / patterns, sample lists.
        budget_seconds: padded seconds per batch for the padding efficiency (``None``: skip).
        png: write the length histogram there.
        bins: histogram bins.
        buffer_size, seed: of the batching simulation (:func:`padding_efficiency`).
        frame_shift, sample_rate: to turn frame / sample counts into seconds.

    >>> s = corpus_stats([{"key": str(i), "duration": d} for i, d in enumerate([1, 2, 2, 4])],
    ...                  budget_seconds=4.0)
    >>> s.utterances, s.seconds, s.percentiles[50], round(s.padding_efficiency, 4)
    (4, 9.0, 2.0, 0.9)
    """
    durations = read_durations(manifests_or_shards, frame_shift=frame_shift,
                               sample_rate=sample_rate)
    values = np.asarray(durations, dtype=np.float64)
    percentiles = ({q: float(np.percentile(values, q)) for q in PERCENTILES}
                   if len(values) else {})
    counts, edges = length_histogram(durations, bins)
    stats = CorpusStats(len(durations), float(values.sum()), percentiles, counts, edges)
    if isinstance(manifests_or_shards, (str, os.PathLike)):
        stats.sources = [os.fspath(manifests_or_shards)]
    stats.sample_rates = read_sample_rates(manifests_or_shards)
    if budget_seconds is not None:
        batched = padding_efficiency(durations, budget_seconds, buffer_size=buffer_size,
                                     seed=seed)
        stats.budget_seconds = float(budget_seconds)
        stats.padding_efficiency = batched.efficiency
        stats.batches = batched.batches
        stats.buffer_size = buffer_size
    if png is not None:
        stats.png = os.fspath(write_histogram_png(png, counts, edges))
    return stats


# --------------------------------------------------------------------------- PNG

# 3×5 glyphs, rows top to bottom, 3 bits each (4 = left column).
_GLYPHS = {
    "0": (7, 5, 5, 5, 7), "1": (2, 6, 2, 2, 7), "2": (7, 1, 7, 4, 7), "3": (7, 1, 7, 1, 7),
    "4": (5, 5, 7, 1, 1), "5": (7, 4, 7, 1, 7), "6": (7, 4, 7, 5, 7), "7": (7, 1, 2, 2, 2),
    "8": (7, 5, 7, 5, 7), "9": (7, 5, 7, 1, 7), ".": (0, 0, 0, 0, 2), "s": (3, 4, 2, 1, 6),
    "n": (0, 6, 5, 5, 5), "=": (0, 7, 0, 7, 0), " ": (0, 0, 0, 0, 0), "-": (0, 0, 7, 0, 0),
}
_WHITE, _BLACK, _BAR, _GRID = (255, 255, 255), (40, 40, 40), (66, 114, 196), (225, 225, 225)


class _Canvas:
    def __init__(self, width: int, height: int) -> None:
        self.width, self.height = width, height
        self.pixels = bytearray(bytes(_WHITE) * (width * height))

    def rect(self, x0: int, y0: int, x1: int, y1: int, color: tuple[int, int, int]) -> None:
        """Fill ``[x0, x1) × [y0, y1)`` (clipped)."""
        x0, x1 = max(0, x0), min(self.width, x1)
        y0, y1 = max(0, y0), min(self.height, y1)
        if x0 >= x1:
            return
        row = bytes(color) * (x1 - x0)
        for y in range(y0, y1):
            start = (y * self.width + x0) * 3
            self.pixels[start:start + len(row)] = row

    def text(self, x: int, y: int, text: str, scale: int = 2,
             color: tuple[int, int, int] = _BLACK) -> None:
        for i, char in enumerate(text):
            rows = _GLYPHS.get(char, _GLYPHS[" "])
            for r, bits in enumerate(rows):
                for c in range(3):
                    if bits & (4 >> c):
                        px, py = x + (i * 4 + c) * scale, y + r * scale
                        self.rect(px, py, px + scale, py + scale, color)

    def png(self) -> bytes:
        stride = self.width * 3
        raw = b"".join(b"\x00" + bytes(self.pixels[y * stride:(y + 1) * stride])
                       for y in range(self.height))

        def chunk(tag: bytes, data: bytes) -> bytes:
            return (struct.pack(">I", len(data)) + tag + data
                    + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF))

        header = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)  # 8-bit RGB
        return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
                + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def _label(value: float) -> str:
    return f"{value:.1f}" if value < 100 else f"{value:.0f}"


def write_histogram_png(
    path: str | os.PathLike, counts: Sequence[int], edges: Sequence[float], *,
    width: int = 640, height: int = 320,
) -> str:
    """Draw a histogram as an RGB PNG (bars, axes, the seconds at both ends of the x axis,
    the largest count and the total on top); return the path.

    Pure Python (zlib + struct): no plotting library needed.

    >>> import os, tempfile
    >>> p = write_histogram_png(os.path.join(tempfile.mkdtemp(), "h.png"), [1, 3], [0, 1, 2])
    >>> with open(p, "rb") as f:
    ...     data = f.read()
    >>> data[:8] == b"\\x89PNG\\r\\n\\x1a\\n", struct.unpack(">II", data[16:24])
    (True, (640, 320))
    """
    if len(edges) != len(counts) + 1:
        raise ValueError(f"need len(counts) + 1 edges, got {len(counts)} counts and "
                         f"{len(edges)} edges")
    if width < 120 or height < 80:
        raise ValueError(f"the image must be at least 120 × 80, got {width} × {height}")
    canvas = _Canvas(width, height)
    left, right, top, bottom = 40, width - 16, 24, height - 30
    peak = max(counts) if counts and max(counts) > 0 else 1
    for frac in (0.25, 0.5, 0.75, 1.0):
        y = bottom - round(frac * (bottom - top))
        canvas.rect(left, y, right, y + 1, _GRID)
    n = max(1, len(counts))
    span = right - left
    for i, count in enumerate(counts):
        x0 = left + (i * span) // n
        x1 = left + ((i + 1) * span) // n - (1 if span // n > 2 else 0)
        bar = round(count / peak * (bottom - top))
        canvas.rect(x0, bottom - bar, max(x1, x0 + 1), bottom, _BAR)
    canvas.rect(left - 1, top, left, bottom + 1, _BLACK)  # y axis
    canvas.rect(left - 1, bottom, right, bottom + 1, _BLACK)  # x axis
    canvas.text(4, top, str(peak))
    canvas.text(4, bottom - 10, "0")
    canvas.text(left, bottom + 8, _label(edges[0]) + "s" if edges else "")
    end = _label(edges[-1]) + "s" if edges else ""
    canvas.text(right - len(end) * 8, bottom + 8, end)
    if edges:
        middle = _label((edges[0] + edges[-1]) / 2) + "s"
        canvas.text((left + right) // 2 - len(middle) * 4, bottom + 8, middle)
    canvas.text(right - 120, 4, f"n={sum(counts)}")
    path = os.fspath(path)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(canvas.png())
    os.replace(tmp, path)
    return path
