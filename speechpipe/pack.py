"""Packing a corpus into tar shards with an index: ``pack_data`` and the ``pack`` command.

For corpora larger than the page cache, reading utterances at random from ``.ark`` files
becomes random disk access. Packing writes them, once, into tar shards of a few thousand
utterances (webdataset naming) that a training run reads sequentially, shuffling shard order
and within a buffer (CAT's large-dataset recipe: ``pack_data(f_scps, f_labels, d_out, fmt,
filter_group)``, 2000 utterances per shard, labels stored as text so that the tokenizer can
change without packing again).

- :func:`pack_data`: Kaldi tables (``feats.scp`` or ``wav.scp`` with an optional
  ``segments`` file, several of each, plus ``text`` label files) or JSON-lines manifests, to
  shards ``d_out[/lo_hi]/data-%05d.tar`` and one ``index.jsonl`` per folder
  (:class:`~speechpipe.index.ShardIndex`); returns a :class:`PackReport`.
- :func:`parse_length_groups`: ``["10:500", "500:800"]`` to :class:`LengthGroup` ranges.
- :func:`add_pack_command`: adds ``speechpipe pack`` to an argparse subparsers object.

Each utterance ``<key>`` becomes two members: ``<key>.feats.npy`` (float32 ``(frames, dim)``)
or ``<key>.flac`` / ``<key>.wav`` (audio), and ``<key>.txt`` (the label, UTF-8, unchanged:
tokenization happens when the shards are read). Read them back with
``IterableWrapper(paths).open().read_shards().decode()``, or with webdataset.

The work happens in four steps, so that nothing is written when the inputs are inconsistent:
read the tables and match keys; measure every utterance (feature matrix headers, audio file
headers; no sample is decoded where a header tells the length); assign sorted keys to length
groups and shards; write the shards in parallel, then each folder's index.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import io
import math
import multiprocessing
import os
import re
import struct
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Iterator, NamedTuple, Sequence

import numpy as np
import soundfile

from .errors import DataError, MissingDataError, SpeechpipeError, UnsafeInputError
from .index import INDEX_NAME, ShardEntry, ShardIndex
from .pipes.decode import read_audio_segment
from .pipes.kaldi import (
    ScpEntry,
    load_scp_entries,
    parse_segment,
    read_matrix,
    read_scp_table,
    read_wav_value,
    slice_segments,
)
from .pipes.manifests import read_manifest
from .pipes.shards import iter_tar_members, split_member_name, write_shard

__all__ = [
    "AUDIO_FORMATS",
    "KINDS",
    "LENGTH_UNITS",
    "LengthGroup",
    "MANIFEST_AUDIO_FIELDS",
    "MANIFEST_TEXT_FIELDS",
    "ON_MISMATCH",
    "PackReport",
    "UTTS_PER_SHARD",
    "add_pack_command",
    "pack_data",
    "parse_length_groups",
    "run_pack_command",
]

#: Utterances per shard unless told otherwise (CAT's ``UTTS_PER_FILE``).
UTTS_PER_SHARD = 2000
#: Values of ``kind=``: what the scp files hold (``"auto"``: look at the first value).
KINDS = ("auto", "feats", "wav")
#: Values of ``on_mismatch=``: keys with data but no label, or a label but no data.
ON_MISMATCH = ("error", "skip")
#: Values of ``length_unit=``: ``frames`` for features; ``samples`` or ``seconds`` for audio.
LENGTH_UNITS = ("frames", "samples", "seconds")
#: How ``pack`` encodes audio: lossless (FLAC for 16-bit sources, float WAV otherwise) or
#: every utterance as 16-bit FLAC.
AUDIO_FORMATS = ("lossless", "flac16")
#: Manifest fields holding the audio path, in the order they are looked for.
MANIFEST_AUDIO_FIELDS = ("audio_path", "audio_filepath", "path", "wav")
#: Manifest fields holding the transcript, in the order they are looked for.
MANIFEST_TEXT_FIELDS = ("text", "sentence", "transcript")

_EXAMPLES = 5  # keys shown per reported category
_FEATS_FIELD = "feats.npy"
_TEXT_FIELD = "txt"
_AUDIO_FIELDS = ("flac", "wav")
_ARK_REF = re.compile(r"(?P<path>.+?)(?::(?P<offset>[0-9]+))?(?:\[(?P<range>[^\[\]]*)\])?", re.S)
_AUDIO_MAGIC = (b"RIFF", b"fLaC", b"AUDI", b"OggS", b"FORM", b"ID3")
_INT16_SCALE = np.float32(32768.0)

# Internal modes: what each utterance's reference points to.
_FEATS, _WAV, _SEGMENT, _MANIFEST = "feats", "wav", "segment", "manifest"


# --------------------------------------------------------------------------------------------
# Length groups
# --------------------------------------------------------------------------------------------


class LengthGroup(NamedTuple):
    """A half-open length range ``lo <= length < hi`` and the folder its shards go to."""

    name: str
    lo: float
    hi: float

    def holds(self, length: float) -> bool:
        """Whether ``lo <= length < hi``."""
        return self.lo <= length < self.hi


def parse_length_groups(filter_group: str | Sequence[str] | None) -> list[LengthGroup]:
    """Parse CAT-style length groups ``"lo:hi"`` into :class:`LengthGroup`, sorted by ``lo``.

    The folder of ``"10:500"`` is ``10_500`` (the numbers as written). Ranges are half-open
    (``lo <= length < hi``), in the length unit of the pack (frames for features, samples or
    seconds for audio); gaps between ranges are allowed (what falls in them is counted as out
    of range), overlaps are not.

    Raises:
        ValueError: a range that is not two non-negative numbers ``lo < hi``, or two ranges
            that overlap (naming both).

    >>> parse_length_groups(["500:800", "10:500"])
    [LengthGroup(name='10_500', lo=10.0, hi=500.0), LengthGroup(name='500_800', lo=500.0, \
hi=800.0)]
    >>> parse_length_groups(["10:500", "400:800"])
    Traceback (most recent call last):
    ...
    ValueError: filter_group ranges '10:500' and '400:800' overlap: each length may belong to \
one group only
    """
    if filter_group is None:
        return []
    if isinstance(filter_group, str):
        filter_group = [filter_group]
    groups: list[tuple[LengthGroup, str]] = []
    for text in filter_group:
        if not isinstance(text, str):
            raise TypeError(f"filter_group entries must be 'lo:hi' strings, got {text!r}")
        parts = text.strip().split(":")
        numbers = []
        for part in parts:
            try:
                number = float(part)
            except ValueError:
                number = math.nan
            numbers.append(number)
        if len(parts) != 2 or not all(math.isfinite(n) and n >= 0 for n in numbers):
            raise ValueError(
                f"filter_group range {text!r} must be 'lo:hi' with two non-negative numbers, "
                "e.g. '10:500'"
            )
        lo, hi = numbers
        if not lo < hi:
            raise ValueError(f"filter_group range {text!r}: lo must be < hi")
        groups.append((LengthGroup(f"{parts[0].strip()}_{parts[1].strip()}", lo, hi), text))
    groups.sort(key=lambda g: (g[0].lo, g[0].hi))
    for (a, text_a), (b, text_b) in zip(groups, groups[1:]):
        if b.lo < a.hi:
            raise ValueError(
                f"filter_group ranges {text_a!r} and {text_b!r} overlap: each length may belong "
                "to one group only"
            )
    return [g for g, _ in groups]


# --------------------------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------------------------


@dataclass
class PackReport:
    """What :func:`pack_data` did.

    Attributes:
        out_dir: the output folder.
        kind: ``"feats"`` or ``"wav"`` (audio).
        length_unit: unit of the lengths in the index and of the group ranges.
        groups: utterances packed per folder (``"."`` without length groups, else ``lo_hi``).
        shards_written: shards written by this run.
        shards_skipped: shards already complete from an earlier run, kept as they were.
        bytes_total: size of all shards of the pack.
        bytes_written: size of the shards written by this run.
        out_of_range: utterances outside every length group (not packed).
        out_of_range_examples: a few of them, ``"key (length n)"``.
        keys_without_label: utterances with data but no label (not packed).
        keys_without_label_examples: a few of their keys.
        labels_without_data: labels whose key has no data (not packed).
        labels_without_data_examples: a few of their keys.
        stale_shards: files in an output folder named like a shard but not part of this pack
            (left over from an earlier pack of other inputs; not deleted, not indexed).
        index_paths: the ``index.jsonl`` files written.
        clipped: utterances (of the shards written by this run) with samples beyond
            ``[-1, 1)`` that ``audio_format="flac16"`` clipped to the 16-bit range.
        seconds: wall-clock time.
    """

    out_dir: str
    kind: str
    length_unit: str
    groups: dict[str, int] = field(default_factory=dict)
    shards_written: int = 0
    shards_skipped: int = 0
    bytes_total: int = 0
    bytes_written: int = 0
    out_of_range: int = 0
    out_of_range_examples: list[str] = field(default_factory=list)
    keys_without_label: int = 0
    keys_without_label_examples: list[str] = field(default_factory=list)
    labels_without_data: int = 0
    labels_without_data_examples: list[str] = field(default_factory=list)
    stale_shards: list[str] = field(default_factory=list)
    index_paths: list[str] = field(default_factory=list)
    clipped: int = 0
    seconds: float = 0.0

    @property
    def utterances(self) -> int:
        """Utterances packed, over all groups."""
        return sum(self.groups.values())

    @property
    def shards(self) -> int:
        return self.shards_written + self.shards_skipped

    def report(self) -> str:
        """A few lines for people: counts per group, what was left out and why, sizes, time."""
        lines = [
            f"pack: {self.utterances} utterances ({self.kind}, lengths in {self.length_unit}) "
            f"in {self.shards} shard(s) under {self.out_dir}"
        ]
        for name, count in self.groups.items():
            lines.append(f"  {name}/: {count} utterances")
        if self.clipped:
            lines.append(f"  clipped to 16 bits (flac16; samples beyond [-1, 1)): "
                         f"{self.clipped} utterance(s)")
        if self.out_of_range:
            lines.append(f"  outside every length group (not packed): {self.out_of_range} "
                         f"(e.g. {', '.join(self.out_of_range_examples)})")
        for what, count, examples in (
            ("keys without a label", self.keys_without_label, self.keys_without_label_examples),
            ("labels without data", self.labels_without_data,
             self.labels_without_data_examples),
        ):
            if count:
                lines.append(f"  {what} (not packed): {count} (e.g. "
                             f"{', '.join(repr(k) for k in examples)})")
        lines.append(
            f"  shards: {self.shards_written} written, {self.shards_skipped} already complete "
            f"(kept); {_size(self.bytes_total)} in all, {_size(self.bytes_written)} written"
        )
        if self.stale_shards:
            lines.append(f"  warning: {len(self.stale_shards)} file(s) named like shards are not "
                         f"part of this pack (delete them before reading the folder with a glob): "
                         f"{', '.join(self.stale_shards[:_EXAMPLES])}")
        lines.append(f"  time: {self.seconds:.1f} s")
        return "\n".join(lines)


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"  # pragma: no cover


# --------------------------------------------------------------------------------------------
# Reading the inputs
# --------------------------------------------------------------------------------------------


class _Item(NamedTuple):
    """One utterance to pack: where its data is, and its label (picklable, for workers)."""

    key: str
    value: str  # feats/wav: the table value; segment: the segments value; manifest: a path
    source: str | None = None
    line: int | None = None
    text: str = ""
    recording: ScpEntry | None = None  # segment: the wav.scp entry of its recording
    offset: float | None = None  # manifest: segment start, seconds
    duration: float | None = None  # manifest: segment length, seconds


def _as_list(value: str | os.PathLike | Sequence[str | os.PathLike] | None, name: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, (str, os.PathLike)):
        value = [value]
    out = []
    for item in value:
        if not isinstance(item, (str, os.PathLike)) or not os.fspath(item):
            raise TypeError(f"{name} must be a path or a list of paths, got {item!r}")
        out.append(os.fspath(item))
    return out


def _check_key(key: str, source: str | None, line: int | None) -> None:
    base = key[key.rfind("/") + 1:]
    if not base or "." in base or key.startswith("/"):
        raise DataError(
            "this key cannot name shard members: the part after the last '/' must be non-empty "
            "and without dots (a reader splits '<key>.<field>' at the first dot) and it must "
            "not start with '/'; rename the utterance",
            source=source, line=line, key=key,
        )


def _add_unique(table: dict[str, Any], key: str, item: Any, what: str) -> None:
    previous = table.get(key)
    if previous is not None:
        raise DataError(
            f"duplicate key: {what} {key!r} is also in {previous.source}:{previous.line}; keys "
            "must be unique across all input files",
            source=item.source, line=item.line, key=key,
        )
    table[key] = item


def _detect_kind(entry: ScpEntry) -> str:
    """``"feats"`` or ``"wav"`` from the first value of an scp file."""
    value = entry.value
    where = dict(source=entry.source, line=entry.line, key=entry.key)
    if value.endswith("|"):
        raise DataError(
            f"cannot tell what {value!r} produces (a shell command): pass kind='feats' or "
            "kind='wav' (CLI: --kind)", **where)
    match = _ARK_REF.fullmatch(value)
    if os.path.isfile(value):
        path, offset = value, 0
    elif match is not None and match["offset"] and os.path.isfile(match["path"]):
        path, offset = match["path"], int(match["offset"])
    else:
        raise MissingDataError(
            f"{value!r} names no existing file, so the kind of this table cannot be told (and "
            "its data cannot be read); check the path (relative paths are relative to the "
            "current directory, as in Kaldi)", **where)
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            head = f.read(4)
    except OSError as exc:
        raise DataError(f"cannot read {path}: {exc.strerror or exc}", **where) from exc
    if head.startswith(_AUDIO_MAGIC) or (path == value and not head.startswith(b"\0B")):
        return "wav"
    return "feats"


class _Inputs(NamedTuple):
    kind: str  # "feats" or "wav"
    mode: str  # _FEATS, _WAV, _SEGMENT or _MANIFEST
    data: dict[str, _Item]
    labels: dict[str, ScpEntry]
    data_files: list[str]
    label_files: list[str]


def _read_scps(scps: list[str], kind: str, segments: list[str]) -> tuple[str, str, dict]:
    tables = [(path, read_scp_table(path)) for path in scps]
    kinds = {}
    for path, table in tables:
        if kind != "auto":
            kinds[path] = kind
        elif table:
            kinds[path] = _detect_kind(next(iter(table.values())))
    found = sorted(set(kinds.values()))
    if len(found) > 1:
        feats = next(p for p, k in kinds.items() if k == "feats")
        wav = next(p for p, k in kinds.items() if k == "wav")
        raise DataError(f"the scp files mix features ({feats}) and audio ({wav}); pack them "
                        "separately", source=wav)
    resolved = found[0] if found else ("feats" if kind == "auto" else kind)
    if segments and resolved != "wav":
        raise ValueError("segments need a wav.scp (audio), but the scp files hold features "
                         f"({', '.join(scps)}); pass kind='wav' if they hold audio")
    entries: dict[str, ScpEntry] = {}
    for _, table in tables:
        for key, entry in table.items():
            _add_unique(entries, key, entry, "recording" if segments else "key")
    data: dict[str, _Item] = {}
    if not segments:
        for key, entry in entries.items():
            _check_key(key, entry.source, entry.line)
            data[key] = _Item(key, entry.value, entry.source, entry.line)
        return resolved, (_FEATS if resolved == "feats" else _WAV), data
    for path in segments:
        for key, entry in read_scp_table(path).items():
            _check_key(key, entry.source, entry.line)
            item = _Item(key, entry.value, entry.source, entry.line)
            _add_unique(data, key, item, "segment")
            reco = entry.value.split(maxsplit=1)[0]
            if reco not in entries:
                raise DataError(f"unknown recording {reco!r}: not in {', '.join(scps)}",
                                source=path, line=entry.line, key=key)
            data[key] = item._replace(recording=entries[reco])
    return resolved, _SEGMENT, data


def _manifest_field(row: dict, names: Sequence[str]) -> str | None:
    return next((n for n in names if n in row), None)


def _read_manifests(manifests: list[str]) -> tuple[dict[str, _Item], dict[str, ScpEntry]]:
    data: dict[str, _Item] = {}
    labels: dict[str, ScpEntry] = {}
    for path in manifests:
        for row in read_manifest(path):
            key = row["key"]
            where = str(row.get("source", ""))  # "path:line", set by the manifest reader
            tail = where[len(path) + 1:] if where.startswith(f"{path}:") else ""
            source, line = path, (int(tail) if tail.isdigit() else None)
            _check_key(key, source, line)
            audio_field = _manifest_field(row, MANIFEST_AUDIO_FIELDS)
            audio = row.get(audio_field) if audio_field else None
            if not isinstance(audio, str) or not audio:
                raise DataError(
                    f"no audio path: expected a non-empty string in one of the fields "
                    f"{list(MANIFEST_AUDIO_FIELDS)}", source=source, line=line, key=key)
            offset = row.get("offset")
            duration = row.get("duration") if offset is not None else None
            for name, value in (("offset", offset), ("duration", duration)):
                if value is not None and (isinstance(value, bool) or not isinstance(
                        value, (int, float)) or not value >= 0 or not math.isfinite(value)):
                    raise DataError(f"field {name!r} must be a number of seconds >= 0, got "
                                    f"{value!r}", source=source, line=line, key=key)
            item = _Item(key, audio, source, line, offset=offset, duration=duration)
            _add_unique(data, key, item, "key")
            text_field = _manifest_field(row, MANIFEST_TEXT_FIELDS)
            if text_field is not None:
                text = row[text_field]
                if not isinstance(text, str):
                    raise DataError(f"field {text_field!r} must be a string, got "
                                    f"{type(text).__name__}", source=source, line=line, key=key)
                labels[key] = ScpEntry(key, text, source, line)
    return data, labels


def _read_inputs(scps, labels, segments, manifests, kind) -> _Inputs:
    if manifests:
        data, label_table = _read_manifests(manifests)
        return _Inputs("wav", _MANIFEST, data, label_table, manifests, manifests)
    resolved, mode, data = _read_scps(scps, kind, segments)
    label_table: dict[str, ScpEntry] = {}
    for path in labels:
        for key, entry in read_scp_table(path, allow_empty=True).items():
            _add_unique(label_table, key, entry, "label")
    return _Inputs(resolved, mode, data, label_table, segments or scps, labels)


# --------------------------------------------------------------------------------------------
# Measuring (planning) and reading (writing) utterances
# --------------------------------------------------------------------------------------------


class _Files:
    """A few files kept open while measuring (scp entries usually walk an ark in order)."""

    def __init__(self, size: int = 8) -> None:
        self.size = size
        self.files: dict[str, Any] = {}

    def get(self, path: str):
        f = self.files.pop(path, None)
        if f is None:
            f = open(path, "rb")
            if len(self.files) >= self.size:
                self.files.pop(next(iter(self.files))).close()
        self.files[path] = f  # most recently used last
        return f

    def close(self) -> None:
        while self.files:
            self.files.popitem()[1].close()


def _binary_rows(files: _Files, path: str, offset: int) -> int | None:
    """Rows of a Kaldi binary matrix from its header, if it is one and fits the file."""
    try:
        f = files.get(path)
        size = os.fstat(f.fileno()).st_size
    except OSError:
        return None
    f.seek(offset)
    head = f.read(32)
    if not head.startswith(b"\0B"):
        return None
    end = head.find(b" ", 2, 8)
    token = head[2:end] if end > 0 else b""
    try:
        if token in (b"FM", b"DM"):
            p = end + 1
            if head[p] != 4 or head[p + 5] != 4:
                return None
            rows, cols = struct.unpack_from("<i", head, p + 1)[0], struct.unpack_from(
                "<i", head, p + 6)[0]
            body = p + 10 + rows * cols * (4 if token == b"FM" else 8)
        elif token in (b"CM", b"CM2", b"CM3"):
            p = end + 1 + 8
            rows, cols = struct.unpack_from("<ii", head, p)
            per = {b"CM": 1, b"CM2": 2, b"CM3": 1}[token]
            body = p + 8 + (8 * cols if token == b"CM" else 0) + per * rows * cols
        else:
            return None
    except (IndexError, struct.error):
        return None
    if rows < 0 or cols < 0 or offset + body > size:
        return None  # let the full reader name the problem
    return rows


def _no_commands(exc: UnsafeInputError) -> UnsafeInputError:
    return UnsafeInputError(
        f"{exc.reason.split(';')[0]}; pack does not run commands from tables: write their "
        "output to files or arks first (e.g. wav-copy, copy-feats)",
        source=exc.source, line=exc.line, key=exc.key)


def _audio_info(path: str, files_cache: dict) -> tuple[int, int, int] | None:
    """``(frames, rate, channels)`` from an audio file's header, or None if it is not a plain
    file that soundfile can open."""
    cached = files_cache.get(path)
    if cached is None:
        if not os.path.isfile(path):
            return None
        try:
            info = soundfile.info(path)
        except (soundfile.LibsndfileError, RuntimeError, TypeError, ValueError):
            return None
        cached = files_cache[path] = (int(info.frames), int(info.samplerate),
                                      int(info.channels))
    return cached


def _measure_chunk(mode: str, items: Sequence[_Item]) -> list[tuple[int, int | None]]:
    """``(length, sample_rate or None)`` of each item: frames of features, samples of audio.

    Headers only where they tell the length (Kaldi binary matrices, audio files); anything
    else (text or NPY matrices, ranges, wavs stored in arks) is read in full. Runs in worker
    processes, hence module level.
    """
    out: list[tuple[int, int | None]] = []
    files = _Files()
    infos: dict[str, Any] = {}
    try:
        for item in items:
            where = dict(source=item.source, line=item.line, key=item.key)
            try:
                if mode == _FEATS:
                    rows = None
                    match = _ARK_REF.fullmatch(item.value)
                    if match is not None and match["range"] is None \
                            and not item.value.endswith("|"):
                        rows = _binary_rows(files, match["path"], int(match["offset"] or 0))
                    if rows is None:
                        rows = read_matrix(item.value, **where).shape[0]
                    out.append((rows, None))
                elif mode == _WAV:
                    info = None if item.value.endswith("|") else _audio_info(item.value, infos)
                    if info is None:
                        audio, rate = read_wav_value(item.value, **where)
                        info = (audio.shape[0], rate, 1)
                    out.append(info[:2])
                elif mode == _SEGMENT:
                    out.append(_segment_length(item, infos))
                else:
                    out.append(_manifest_length(item, infos))
            except UnsafeInputError as exc:
                raise _no_commands(exc) from exc
    finally:
        files.close()
    return out


def _segment_length(item: _Item, infos: dict) -> tuple[int, int]:
    """Samples of a segment, by the rules of :func:`~speechpipe.pipes.kaldi.slice_segments`."""
    segment = parse_segment(ScpEntry(item.key, item.value, item.source, item.line))
    reco = item.recording
    info = None if reco.value.endswith("|") else _audio_info(reco.value, infos)
    if info is None:
        cached = infos.get(("reco", reco.key))
        if cached is None:
            audio, rate = read_wav_value(reco.value, source=reco.source, line=reco.line,
                                         key=reco.key)
            channels = 1 if audio.ndim == 1 else audio.shape[1]
            cached = infos[("reco", reco.key)] = (audio.shape[0], rate, channels)
        info = cached
    frames, rate, channels = info
    if segment.channel is not None and segment.channel >= channels:
        raise DataError(f"channel {segment.channel} does not exist: recording "
                        f"{segment.recording!r} has {channels} channel(s)",
                        source=item.source, line=item.line, key=item.key)
    start = round(segment.start * rate)
    stop = frames if segment.end == -1 else round(segment.end * rate)
    if frames < stop <= frames + round(0.5 * rate):
        stop = frames  # Kaldi's --max-overshoot 0.5, as slice_segments
    if stop > frames or start >= stop:
        raise DataError(
            f"segment [{segment.start}, {segment.end}] s does not fit recording "
            f"{segment.recording!r} ({frames} samples, {frames / rate:.3f} s)",
            source=item.source, line=item.line, key=item.key)
    return stop - start, rate


def _manifest_length(item: _Item, infos: dict) -> tuple[int, int]:
    """Samples :func:`~speechpipe.pipes.decode.read_audio_segment` will read for a line."""
    info = _audio_info(item.value, infos)
    if info is None:  # missing or undecodable: let the reader say which, naming the line
        try:
            audio, rate = read_audio_segment(item.value, offset=item.offset,
                                             duration=item.duration, key=item.key)
        except (DataError, MissingDataError) as exc:
            raise type(exc)(f"{item.value}: {exc.reason}", source=item.source, line=item.line,
                            key=item.key) from exc
        return audio.shape[0], rate
    frames, rate, _ = info
    start = round((item.offset or 0.0) * rate)
    length = frames - start if item.duration is None else round(item.duration * rate)
    if start > frames or start + length > frames:
        raise DataError(
            f"{item.value}: offset {item.offset} s + duration {item.duration} s is past the end "
            f"of the audio ({frames / rate:.3f} s)",
            source=item.source, line=item.line, key=item.key)
    return length, rate


def _encode_audio(audio: np.ndarray, rate: int, item: _Item,
                  audio_format: str = "lossless") -> tuple[str, bytes, bool]:
    """``(extension, payload, clipped)``: ``("flac", 16-bit FLAC)`` when every sample is a
    16-bit value, else ``("wav", float)``; with ``audio_format="flac16"`` always a 16-bit FLAC.

    A 16-bit (or 8-bit) source read as float32 holds exact multiples of 1/32768, so the
    test is exact and the FLAC is lossless; anything finer (24-bit, float, decoded Opus/MP3)
    is kept as a 32-bit float WAV, also lossless -- or, under ``"flac16"``, rounded to the
    nearest 16-bit value (clipped to [-32768, 32767]; ``clipped`` says whether any was).
    """
    buf = io.BytesIO()
    scaled = audio * _INT16_SCALE
    rounded = np.rint(scaled)
    clipped = False
    try:
        exact = bool(audio.size) and np.array_equal(rounded, scaled) \
            and scaled.min() >= -32768 and scaled.max() <= 32767
        if exact or audio_format == "flac16":
            if not exact:
                clipped = bool(audio.size) and (rounded.min() < -32768 or rounded.max() > 32767)
                rounded = np.clip(rounded, -32768, 32767)
            soundfile.write(buf, rounded.astype(np.int16), rate, format="FLAC",
                            subtype="PCM_16")
            return "flac", buf.getvalue(), clipped
        soundfile.write(buf, audio, rate, format="WAV", subtype="FLOAT")
    except (soundfile.LibsndfileError, RuntimeError, TypeError, ValueError) as exc:
        raise DataError(f"cannot encode audio ({audio.shape}, {rate} Hz): {exc}",
                        source=item.source, line=item.line, key=item.key) from exc
    return "wav", buf.getvalue(), False


def _read_items(mode: str, items: Sequence[_Item]) -> Iterator[tuple[_Item, dict]]:
    """Each item with its decoded sample (``feats`` or ``audio`` + ``sample_rate``)."""
    if mode == _MANIFEST:
        for item in items:
            try:
                audio, rate = read_audio_segment(item.value, offset=item.offset,
                                                 duration=item.duration, key=item.key)
            except (DataError, MissingDataError) as exc:
                raise type(exc)(f"{item.value}: {exc.reason}", source=item.source,
                                line=item.line, key=item.key) from exc
            yield item, {"audio": audio, "sample_rate": rate}
        return
    entries = [ScpEntry(i.key, i.value, i.source, i.line) for i in items]
    if mode == _SEGMENT:
        recordings = {i.recording.key: i.recording for i in items}
        samples = slice_segments(entries, recordings, table_name=items[0].recording.source)
    else:
        samples = load_scp_entries(entries, mode)
    try:
        for item in items:
            try:
                sample = next(samples)
            except UnsafeInputError as exc:
                raise _no_commands(exc) from exc
            yield item, sample
    finally:
        samples.close()


class _ShardTask(NamedTuple):
    path: str  # the final shard path
    mode: str
    items: tuple[_Item, ...]
    lengths: tuple[int, ...]  # planned lengths (frames or samples)
    check_existing: bool  # an existing shard may be kept if its member names are right
    audio_format: str = "lossless"


def _shard_is_complete(task: _ShardTask) -> bool:
    """Whether the shard on disk is a complete tar holding exactly the planned members.

    Reads the shard once with :func:`~speechpipe.pipes.shards.iter_tar_members` (sequential
    I/O, no decoding): it checks every header checksum and the end-of-archive marker, so a
    truncated or damaged file is rewritten.
    """
    allowed = (_FEATS_FIELD,) if task.mode == _FEATS else (
        ("flac",) if task.audio_format == "flac16" else _AUDIO_FIELDS)
    expected = iter(task.items)
    current: tuple[str, set] | None = None
    try:
        with open(task.path, "rb") as f:
            for name, _ in iter_tar_members(f, source=task.path):
                key, fld = split_member_name(name, source=task.path)
                if current is None or key != current[0]:
                    if current is not None and not _fields_ok(current[1], allowed):
                        return False
                    item = next(expected, None)
                    if item is None or item.key != key:
                        return False
                    current = (key, set())
                current[1].add(fld)
    except (OSError, DataError):
        return False
    return (current is not None and _fields_ok(current[1], allowed)
            and next(expected, None) is None)


def _fields_ok(fields: set, allowed: Sequence[str]) -> bool:
    return len(fields) == 2 and _TEXT_FIELD in fields and bool(fields & set(allowed))


def _run_shard_task(task: _ShardTask) -> tuple[bool, int, int]:
    """Write one shard (or keep a complete one): ``(written, size in bytes, utterances
    clipped)``.

    Runs in worker processes (module level, picklable arguments: spawn-safe). The shard is
    written as ``<path>.tmp`` and renamed when complete (:func:`write_shard`).
    """
    if task.check_existing and os.path.isfile(task.path) and _shard_is_complete(task):
        return False, os.path.getsize(task.path), 0
    clipped = 0

    def samples(reader: Iterator[tuple[_Item, dict]]) -> Iterator[dict]:
        nonlocal clipped
        for (item, sample), planned in zip(reader, task.lengths):
            data = sample["feats"] if task.mode == _FEATS else sample["audio"]
            if data.shape[0] != planned:
                raise DataError(
                    f"read {data.shape[0]} {'frames' if task.mode == _FEATS else 'samples'} but "
                    f"measured {planned} when planning: did the data change during packing?",
                    source=item.source, line=item.line, key=item.key)
            out = {"key": item.key, _TEXT_FIELD: item.text}
            if task.mode == _FEATS:
                out[_FEATS_FIELD] = data
            else:
                ext, payload, cut = _encode_audio(data, sample["sample_rate"], item,
                                                  task.audio_format)
                out[ext] = payload
                clipped += cut
            yield out

    reader = _read_items(task.mode, task.items)
    try:
        write_shard(task.path, samples(reader))
    finally:
        reader.close()
    return True, os.path.getsize(task.path), clipped


# --------------------------------------------------------------------------------------------
# pack_data
# --------------------------------------------------------------------------------------------


def _mismatch_error(inputs: _Inputs, no_label: list[str], no_data: list[str]) -> DataError:
    data_what = "manifests" if inputs.mode == _MANIFEST else "data files"
    parts = []
    if no_label:
        parts.append(f"{len(no_label)} key(s) of the {data_what} have no label (e.g. "
                     f"{', '.join(map(repr, no_label[:_EXAMPLES]))})")
    if no_data:
        parts.append(f"{len(no_data)} label(s) have no data (e.g. "
                     f"{', '.join(map(repr, no_data[:_EXAMPLES]))})")
    files = ", ".join(inputs.data_files + [f for f in inputs.label_files
                                           if f not in inputs.data_files])
    return DataError(
        f"keys do not match: {'; '.join(parts)}; fix the inputs, or pack only the keys present "
        "in both with on_mismatch='skip' (CLI: --on-mismatch skip)", source=files)


def _check_fmt(fmt: str) -> re.Pattern:
    if not isinstance(fmt, str) or not fmt:
        raise TypeError(f"fmt must be a %-pattern string such as 'data-%05d.tar', got {fmt!r}")
    try:
        numbered = fmt % 0 != fmt % 1
    except (TypeError, ValueError):
        numbered = False
    if not numbered or "/" in fmt or os.sep in fmt:
        raise ValueError(f"fmt must be a file name with one shard number such as "
                         f"'data-%05d.tar', got {fmt!r}")
    parts = re.split(r"%[-#0 +]*\d*[diu]", fmt.replace("%%", "\0"))
    return re.compile(r"\d+".join(re.escape(p.replace("\0", "%")) for p in parts))


def _check_positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return value


def _old_index(folder: str, unit: str,
               audio_format: str | None) -> dict[str, ShardEntry] | None:
    """Entries of an existing index in ``folder`` (empty if absent or unreadable: it is then
    simply not used to recognise complete shards); ``None`` if it was written with another
    length unit or audio format (then no shard of the folder is kept)."""
    if not os.path.isfile(os.path.join(folder, INDEX_NAME)):
        return {}
    try:
        index = ShardIndex.read(folder)
    except (DataError, MissingDataError):
        return {}
    if index.length_unit != unit or index.audio_format != audio_format:
        return None
    return {entry.name: entry for entry in index.shards}


def _executor(num_workers: int) -> concurrent.futures.Executor | None:
    if num_workers == 1:
        return None
    # spawn: workers start clean (no inherited threads or locks from torch or tqdm).
    return concurrent.futures.ProcessPoolExecutor(
        max_workers=num_workers, mp_context=multiprocessing.get_context("spawn"))


def _run_all(executor, fn, args: Sequence, bar) -> Iterator[tuple[int, Any]]:
    """``(index, fn(args[index]))`` as they complete; stops everything at the first error."""
    if executor is None:
        for i, arg in enumerate(args):
            result = fn(arg)
            bar.update(1)
            yield i, result
        return
    futures = {executor.submit(fn, arg): i for i, arg in enumerate(args)}
    try:
        for future in concurrent.futures.as_completed(futures):
            result = future.result()
            bar.update(1)
            yield futures[future], result
    finally:
        for future in futures:
            future.cancel()


def pack_data(
    f_scps: str | os.PathLike | Sequence[str | os.PathLike] | None,
    f_labels: str | os.PathLike | Sequence[str | os.PathLike] | None,
    d_out: str | os.PathLike,
    fmt: str = "data-%05d.tar",
    filter_group: str | Sequence[str] | None = None,
    *,
    utts_per_shard: int = UTTS_PER_SHARD,
    kind: str = "auto",
    segments: str | os.PathLike | Sequence[str | os.PathLike] | None = None,
    manifests: str | os.PathLike | Sequence[str | os.PathLike] | None = None,
    on_mismatch: str = "error",
    num_workers: int = 1,
    progress: bool = True,
    length_unit: str | None = None,
    audio_format: str = "lossless",
) -> PackReport:
    """Pack Kaldi tables (or manifests) and their labels into tar shards with an index.

    Every utterance present in both the data and the labels is written, in sorted key order
    (``LC_ALL=C``, as Kaldi sorts), ``utts_per_shard`` consecutive utterances per shard, to
    ``d_out/<fmt % n>`` -- or, with ``filter_group``, only the utterances whose length is in a
    group, to ``d_out/<lo>_<hi>/<fmt % n>``, shards numbered from 0 in each folder. Members:

    - ``<key>.feats.npy``: features, float32 ``(frames, dim)``, from a ``feats.scp``;
    - ``<key>.flac``: audio whose samples are all 16-bit values (16-bit sources), as 16-bit
      FLAC -- lossless, exact int16 values; other audio (24-bit, float) as ``<key>.wav``,
      32-bit float. The sample rate is in the audio header: no other member is written;
    - ``<key>.txt``: the label as in the label file (UTF-8, inner spaces kept: tokenize when
      reading, so that the tokenizer can change without packing again).

    Each folder gets ``index.jsonl`` (:class:`~speechpipe.index.ShardIndex`): per shard its
    name, count, byte size, keys and lengths (frames for features, samples for audio, or
    seconds with ``length_unit="seconds"``), written last and atomically: an index means a
    complete pack.

    **Determinism**: the same inputs give byte-identical shards and indexes, whatever
    ``num_workers`` (each shard depends only on its own utterances; tar headers are fixed).

    **Interrupted runs**: each shard is written as ``<name>.tmp`` and renamed when complete,
    so a killed run leaves no partial shard under a shard name. A rerun with the same inputs
    keeps the shards already complete: a shard listed in an existing ``index.jsonl`` is kept
    if its keys and lengths are those planned and its size is the indexed size (one ``stat``);
    without an index entry, a shard is kept if reading it through (headers checksummed, the
    end-of-archive marker present; no decoding) shows exactly the planned member names.
    Everything else is rewritten. Content is not compared: after changing the data of
    existing keys, pack into a fresh folder.

    Args:
        f_scps: ``feats.scp`` or ``wav.scp`` file(s) (``ark:offset`` values or audio paths;
            relative paths are relative to the current directory, as in Kaldi).
        f_labels: Kaldi ``text`` file(s): ``<key> <transcript>``.
        d_out: output folder (created).
        fmt: shard file name with one number, e.g. ``"data-%05d.tar"``.
        filter_group: length ranges ``"lo:hi"`` (``lo <= length < hi``, in the length unit),
            e.g. ``["10:500", "500:800"]``: only utterances in a range are packed, each range
            to its own folder; those outside every range are counted in the report. Ranges
            must not overlap (:func:`parse_length_groups`).
        utts_per_shard: utterances per shard (the last shard of a folder may hold fewer).
        kind: ``"feats"``, ``"wav"``, or ``"auto"``: told from the first value of each scp
            file (an ark offset holding a matrix -> features; an audio file or a wav stored
            in an ark -> audio). All scp files must hold the same kind.
        segments: Kaldi ``segments`` file(s) cutting the recordings of ``f_scps`` (then
            ``wav.scp`` files keyed by recording) into utterances; labels are keyed by segment.
        manifests: JSON-lines (or TSV) manifest(s) instead of ``f_scps`` and ``f_labels``:
            per line a key, an audio path (field ``audio_path``, ``audio_filepath``, ``path``
            or ``wav``) and a transcript (``text``, ``sentence`` or ``transcript``; a line
            without one is a key without a label). With a numeric ``offset`` (seconds), only
            ``duration`` seconds from there are packed (NeMo); without it the whole file.
        on_mismatch: keys with data but no label, or labels without data: ``"error"`` raises
            a :class:`~speechpipe.errors.DataError` with counts and examples before anything
            is written; ``"skip"`` packs the keys present in both and reports the others.
        num_workers: processes measuring utterances and writing shards (1: in this process).
            Workers are started with ``spawn`` (clean processes, no inherited threads), so a
            script calling ``pack_data`` with ``num_workers > 1`` needs the usual
            ``if __name__ == "__main__":`` guard.
        progress: show tqdm progress bars (measuring, then one step per shard).
        length_unit: ``"frames"`` (features), ``"samples"`` (audio, the default) or
            ``"seconds"`` (audio).
        audio_format: ``"lossless"`` (16-bit sources as FLAC, finer ones as float WAV) or
            ``"flac16"``: every utterance as 16-bit FLAC, rounding finer samples (decoded
            Opus or MP3 as in WenetSpeech, GigaSpeech, Common Voice) to 16 bits as Kaldi and
            WeNet do -- a quarter of the size of float WAV; samples beyond the range are
            clipped and counted (:attr:`PackReport.clipped`). Recorded in the index: a
            rerun with another format rewrites the shards.

    Returns:
        A :class:`PackReport` (``print(report.report())``).

    Raises:
        ValueError: a bad argument (overlapping groups, bad ``fmt``, both scps and manifests).
        MissingDataError: an input file, ark or audio file that does not exist.
        UnsafeInputError: a ``cmd |`` value (pack runs no commands from tables).
        DataError: a malformed table line, a duplicate key within or across input files
            (naming both places), mismatched keys under ``on_mismatch="error"``, a key that
            cannot name tar members (a dot in it), unreadable data; the message names the file,
            line and key.

    >>> import os, tempfile, numpy as np, kaldiio
    >>> tmp = tempfile.TemporaryDirectory(); d = tmp.name
    >>> with kaldiio.WriteHelper(f"ark,scp:{d}/feats.ark,{d}/feats.scp") as w:
    ...     for key, frames in (("utt1", 30), ("utt2", 700), ("utt3", 120), ("utt4", 5)):
    ...         w(key, np.zeros((frames, 4), np.float32))
    >>> with open(f"{d}/text", "w", encoding="utf-8") as f:
    ...     _ = f.write("utt1 a b\\nutt2 c\\nutt3 你好 世界\\nutt4 d\\n")
    >>> r = pack_data(f"{d}/feats.scp", f"{d}/text", f"{d}/out", filter_group=["10:500",
    ...               "500:800"], utts_per_shard=1, progress=False)
    >>> r.groups, r.shards_written, r.out_of_range_examples
    ({'10_500': 2, '500_800': 1}, 3, ['utt4 (length 5)'])
    >>> sorted(os.listdir(f"{d}/out/10_500"))
    ['data-00000.tar', 'data-00001.tar', 'index.jsonl']
    >>> tmp.cleanup()
    """
    started = time.monotonic()
    scps = _as_list(f_scps, "f_scps")
    labels = _as_list(f_labels, "f_labels")
    segs = _as_list(segments, "segments")
    mans = _as_list(manifests, "manifests")
    if mans and (scps or labels or segs):
        raise ValueError("pass either manifests, or scp and label files (with segments), "
                         "not both")
    if not mans and not (scps and labels):
        raise ValueError("nothing to pack: pass scp files and label files, or manifests")
    if not isinstance(d_out, (str, os.PathLike)) or not os.fspath(d_out):
        raise TypeError(f"d_out must be a folder path, got {d_out!r}")
    out_dir = os.fspath(d_out)
    shard_name_re = _check_fmt(fmt)
    groups = parse_length_groups(filter_group)
    _check_positive_int(utts_per_shard, "utts_per_shard")
    _check_positive_int(num_workers, "num_workers")
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if mans and kind == "feats":
        raise ValueError("manifests name audio files: kind must be 'auto' or 'wav'")
    if on_mismatch not in ON_MISMATCH:
        raise ValueError(f"on_mismatch must be one of {ON_MISMATCH}, got {on_mismatch!r}")
    if audio_format not in AUDIO_FORMATS:
        raise ValueError(f"audio_format must be one of {AUDIO_FORMATS}, got {audio_format!r}")
    if length_unit is not None and length_unit not in LENGTH_UNITS:
        raise ValueError(f"length_unit must be one of {LENGTH_UNITS} or None, "
                         f"got {length_unit!r}")
    if not isinstance(progress, bool):
        raise TypeError(f"progress must be a bool, got {progress!r}")

    # 1. Tables and keys.
    inputs = _read_inputs(scps, labels, segs, mans, kind)
    unit = length_unit or ("frames" if inputs.kind == "feats" else "samples")
    if (inputs.kind == "feats") != (unit == "frames"):
        raise ValueError(f"length_unit {unit!r} does not fit {inputs.kind}: use 'frames' for "
                         "features, 'samples' or 'seconds' for audio")
    no_label = sorted(k for k in inputs.data if k not in inputs.labels)
    no_data = sorted(k for k in inputs.labels if k not in inputs.data)
    if (no_label or no_data) and on_mismatch == "error":
        raise _mismatch_error(inputs, no_label, no_data)
    keys = sorted(k for k in inputs.data if k in inputs.labels)
    if not keys:
        raise DataError(
            "nothing to pack: no key has both data and a label" if inputs.data or inputs.labels
            else "nothing to pack: the input files hold no utterances",
            source=", ".join(inputs.data_files + inputs.label_files))
    items = [inputs.data[k]._replace(text=inputs.labels[k].value) for k in keys]
    report = PackReport(
        out_dir, inputs.kind, unit,
        keys_without_label=len(no_label), keys_without_label_examples=no_label[:_EXAMPLES],
        labels_without_data=len(no_data), labels_without_data_examples=no_data[:_EXAMPLES],
    )

    from tqdm import tqdm

    executor = _executor(num_workers)
    try:
        # 2. Lengths.
        chunks = [items[i:i + utts_per_shard] for i in range(0, len(items), utts_per_shard)]
        measured: list[list[tuple[int, int | None]]] = [[] for _ in chunks]
        with tqdm(total=len(chunks), desc="pack: measure", unit="chunk",
                  disable=not progress) as bar:
            for i, result in _run_all(executor, _measure_chunk_args, [
                    (inputs.mode, chunk) for chunk in chunks], bar):
                measured[i] = result
        native = [n for chunk in measured for n in chunk]

        def in_unit(n: int, rate: int | None) -> int | float:
            return n / rate if unit == "seconds" else n

        # 3. Groups and shards.
        plan: dict[str, list[int]] = {g.name: [] for g in groups} if groups else {".": []}
        out_of_range: list[str] = []
        for i, (n, rate) in enumerate(native):
            length = in_unit(n, rate)
            if not groups:
                plan["."].append(i)
                continue
            group = next((g for g in groups if g.holds(length)), None)
            if group is None:
                if len(out_of_range) < _EXAMPLES:
                    out_of_range.append(f"{items[i].key} (length {length:g})")
                report.out_of_range += 1
            else:
                plan[group.name].append(i)
        report.out_of_range_examples = out_of_range

        tasks: list[_ShardTask] = []
        task_folder: list[str] = []
        entries: dict[str, dict[str, ShardEntry]] = {}
        os.makedirs(out_dir, exist_ok=True)
        for name, indices in plan.items():
            folder = out_dir if name == "." else os.path.join(out_dir, name)
            os.makedirs(folder, exist_ok=True)
            report.groups[name] = len(indices)
            fmt_recorded = None if inputs.kind == "feats" else audio_format
            old = _old_index(folder, unit, fmt_recorded)
            keep_complete = old is not None
            old = old or {}
            entries[folder] = {}
            planned_names = set()
            for number, start in enumerate(range(0, len(indices), utts_per_shard)):
                chosen = indices[start:start + utts_per_shard]
                shard = fmt % number
                planned_names.add(shard)
                entry = ShardEntry(shard, len(chosen), 0, tuple(items[i].key for i in chosen),
                                   tuple(in_unit(*native[i]) for i in chosen))
                path = os.path.join(folder, shard)
                previous = old.get(shard)
                if previous is not None and os.path.isfile(path) \
                        and previous.keys == entry.keys \
                        and previous.lengths == tuple(float(n) for n in entry.lengths) \
                        and previous.bytes == os.path.getsize(path):
                    entries[folder][shard] = dataclasses.replace(entry, bytes=previous.bytes)
                    report.shards_skipped += 1
                    report.bytes_total += previous.bytes
                    continue
                entries[folder][shard] = entry
                tasks.append(_ShardTask(path, inputs.mode, tuple(items[i] for i in chosen),
                                        tuple(native[i][0] for i in chosen),
                                        keep_complete and previous is None, audio_format))
                task_folder.append(folder)
            report.stale_shards.extend(
                os.path.join(folder, f) for f in sorted(os.listdir(folder))
                if shard_name_re.fullmatch(f) and f not in planned_names)
        # An index means a complete pack: remove stale ones before any shard changes.
        for folder in set(task_folder):
            if os.path.isfile(os.path.join(folder, INDEX_NAME)):
                os.remove(os.path.join(folder, INDEX_NAME))

        # 4. Shards, then indexes.
        with tqdm(total=len(tasks) + report.shards_skipped, initial=report.shards_skipped,
                  desc="pack: write", unit="shard", disable=not progress) as bar:
            for i, (written, size, clipped) in _run_all(executor, _run_shard_task, tasks, bar):
                report.clipped += clipped
                name = os.path.basename(tasks[i].path)
                folder = task_folder[i]
                entries[folder][name] = dataclasses.replace(entries[folder][name], bytes=size)
                report.bytes_total += size
                if written:
                    report.shards_written += 1
                    report.bytes_written += size
                else:
                    report.shards_skipped += 1
    finally:
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)

    for folder, by_name in entries.items():
        # In shard-number order (the plan's), which is also sorted key order.
        index = ShardIndex(folder, list(by_name.values()), length_unit=unit,
                           audio_format=None if inputs.kind == "feats" else audio_format)
        report.index_paths.append(index.write())
    report.seconds = time.monotonic() - started
    return report


def _measure_chunk_args(args: tuple[str, Sequence[_Item]]) -> list[tuple[int, int | None]]:
    return _measure_chunk(*args)


# --------------------------------------------------------------------------------------------
# The command line
# --------------------------------------------------------------------------------------------

_CLI_EXAMPLES = """\
examples:
  speechpipe pack --scp data/train/feats.scp --labels data/train/text --out shards/train \\
      --group 10:500 --group 500:800 --workers 8
  speechpipe pack --scp data/train/wav.scp --segments data/train/segments \\
      --labels data/train/text --out shards/train --length-unit seconds --group 1:20
  speechpipe pack --manifest train.jsonl --out shards/train

read the result with:
  IterableWrapper(["shards/train/10_500/data-00000.tar"]).open().read_shards().decode()
"""


def add_pack_command(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``pack`` subcommand to an argparse ``subparsers`` object; return its parser.

    The subcommand's ``func`` default is :func:`run_pack_command`: call ``args.func(args)``
    after parsing; it prints the report and returns the exit status.

    >>> parser = argparse.ArgumentParser(prog="speechpipe")
    >>> _ = add_pack_command(parser.add_subparsers(dest="command"))
    >>> args = parser.parse_args(["pack", "--scp", "feats.scp", "--labels", "text",
    ...                           "--out", "shards", "--group", "10:500", "--group", "500:800"])
    >>> args.scp, args.group, args.utts_per_shard, args.func.__name__
    (['feats.scp'], ['10:500', '500:800'], 2000, 'run_pack_command')
    """
    parser = subparsers.add_parser(
        "pack",
        help="pack Kaldi feats/wav + text (or manifests) into tar shards with an index",
        description="Pack utterances and their labels into tar shards (webdataset naming:\n"
        "<key>.feats.npy or <key>.flac/.wav, and <key>.txt holding the label unchanged),\n"
        "--utts-per-shard per shard in sorted key order, optionally split into length\n"
        "groups (one folder per group), with an index.jsonl per folder. Keys in the data\n"
        "but not in the labels (or the reverse) stop the run unless --on-mismatch skip.\n"
        "An interrupted run can be run again: complete shards are kept.",
        epilog=_CLI_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    inputs = parser.add_argument_group("inputs (Kaldi tables, or manifests)")
    inputs.add_argument("--scp", action="append", default=[], metavar="FILE",
                        help="feats.scp or wav.scp (repeat for several)")
    inputs.add_argument("--labels", action="append", default=[], metavar="FILE",
                        help="Kaldi text file '<key> <transcript>' (repeat for several)")
    inputs.add_argument("--segments", action="append", default=[], metavar="FILE",
                        help="Kaldi segments file cutting the wav.scp recordings (repeatable)")
    inputs.add_argument("--manifest", action="append", default=[], metavar="FILE",
                        help="JSON-lines manifest with key, audio_path and text, instead of "
                        "--scp/--labels (repeatable)")
    inputs.add_argument("--kind", choices=KINDS, default="auto",
                        help="what the scp files hold (default: auto-detect)")
    output = parser.add_argument_group("output")
    output.add_argument("--out", required=True, metavar="DIR", help="output folder")
    output.add_argument("--fmt", default="data-%05d.tar",
                        help="shard file name with one number (default: data-%%05d.tar)")
    output.add_argument("--group", action="append", default=[], metavar="LO:HI",
                        help="keep lengths LO <= length < HI, written to DIR/LO_HI/ "
                        "(repeat for several non-overlapping groups)")
    output.add_argument("--length-unit", choices=LENGTH_UNITS, default=None,
                        help="unit of lengths and groups: frames (features), samples (audio, "
                        "default) or seconds (audio)")
    output.add_argument("--audio-format", choices=AUDIO_FORMATS, default="lossless",
                        help="lossless (default: 16-bit sources as FLAC, finer ones as float "
                        "WAV) or flac16 (every utterance as 16-bit FLAC: decoded Opus/MP3 "
                        "rounded to 16 bits, 1/4 the size)")
    output.add_argument("--utts-per-shard", type=int, default=UTTS_PER_SHARD, metavar="N",
                        help=f"utterances per shard (default: {UTTS_PER_SHARD})")
    run = parser.add_argument_group("run")
    run.add_argument("--on-mismatch", choices=ON_MISMATCH, default="error",
                     help="keys with data but no label or the reverse: error (default) or "
                     "skip them (reported)")
    run.add_argument("--workers", type=int, default=1, metavar="N",
                     help="worker processes (default: 1)")
    run.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    parser.set_defaults(func=run_pack_command)
    return parser


def run_pack_command(args: argparse.Namespace) -> int:
    """Run ``pack`` from parsed arguments: print the report, return the exit status."""
    try:
        report = pack_data(
            args.scp or None, args.labels or None, args.out, args.fmt, args.group or None,
            utts_per_shard=args.utts_per_shard, kind=args.kind,
            segments=args.segments or None, manifests=args.manifest or None,
            on_mismatch=args.on_mismatch, num_workers=args.workers,
            progress=not args.no_progress, length_unit=args.length_unit,
            audio_format=args.audio_format,
        )
    except MissingDataError as exc:
        print(f"speechpipe pack: error: {exc}\n  check the path, then run the same command "
              "again (complete shards are kept)", file=sys.stderr)
        return 2
    except (SpeechpipeError, ValueError, TypeError) as exc:
        hint = ("fix the file at the place named above and run the same command again: "
                "complete shards are kept" if isinstance(exc, SpeechpipeError)
                else "see 'speechpipe pack --help'")
        print(f"speechpipe pack: error: {exc}\n  {hint}", file=sys.stderr)
        return 2
    print(report.report())
    return 0
