"""Kaldi data directories: ``scp``/``text`` tables, ark matrices, ``wav.scp`` and ``segments``.

A Kaldi data directory is a set of tables, one ``<key> <value>`` line each, sorted by key with
``LC_ALL=C sort``. This module turns them into samples in three verbs:

- ``parse_scp`` (:class:`ScpParserIterDataPipe`, plain function :func:`parse_scp_lines`):
  ``(path, stream)`` pairs from torch's ``open_files`` or speechpipe's ``open`` to one
  :class:`ScpEntry` ``(key, value)`` per line, which remembers its file and line so that every
  later error can name them. Serves ``feats.scp``, ``wav.scp``, ``segments``, ``utt2spk``
  and ``text`` (``allow_empty=True``: an utterance may have an empty transcript).
- ``load_scp`` (:class:`ScpLoaderIterDataPipe`, plain function :func:`load_scp_entries`):
  resolves each entry's value to a sample: ``kind="feats"`` reads a matrix from an ark
  (``raw.ark:1234``, ranges ``raw.ark:1234[0:9]``, float, double and compressed matrices, with
  kaldiio), ``kind="wav"`` reads audio (a path, a wav stored in an ark, or an opt-in
  ``cmd |`` pipe), ``kind="text"`` keeps the value as the transcript.
- ``load_segments`` (:class:`SegmentLoaderIterDataPipe`, plain function
  :func:`slice_segments`): entries of a ``segments`` file plus the ``wav.scp`` they refer to,
  to one sample per segment holding only that slice of the recording.

Joining tables by key (``text`` with ``feats.scp``) is ``join_by_key``'s job. A typical chain::

    IterableWrapper(["data/train/feats.scp"]).open_files(mode="b").parse_scp().load_scp("feats")

Shell commands in tables (``sox x.wav -t wav - |``) run only with ``allow_commands=True``, and
nothing stored in an ark is ever unpickled (kaldiio's ``PKL`` objects are refused).

The Kaldi family of modules, each lower one imported by the next (this module re-exports
their public names):

- :mod:`speechpipe.pipes.kaldi._tables`: ``parse_scp``, :class:`ScpEntry`,
  :func:`read_scp_table`;
- :mod:`speechpipe.pipes.kaldi._ark`: what is stored in an ark file, one header parser, and
  :func:`~speechpipe.pipes.kaldi._ark.iter_ark` to read an ark in sequence (streaming);
- :mod:`speechpipe.pipes.kaldi._values`: one table value to a matrix (:func:`read_matrix`) or
  audio (:func:`read_wav_value`): paths, ark references and ``cmd |`` commands;
- this module: the samples, ``load_scp`` and ``load_segments``.
"""

from __future__ import annotations

import os
from typing import Any, Iterable, Iterator, Mapping, NamedTuple

import numpy as np
import soundfile

from ...diagnostics import Diagnostics, check_on_error
from ...errors import DataError, MissingDataError, UnsafeInputError, locate
from ...sample import AUDIO, FEATS, KEY, SAMPLE_RATE, SOURCE, TEXT, Sample
from .._core import functional_datapipe, IterDataPipe
from ..decode import read_audio
from ._ark import parse_ark_ref
from ._tables import (
    check_pair, table_error, SPLIT, Location, location, WHITESPACE, read_scp_table, ScpEntry,
)
from ._values import is_command, OpenFiles, read_matrix_value, read_wav, relocated, resolve

__all__ = [
    "KINDS",
    "RECORDING",
    "ScpLoader",
    "ScpLoaderIterDataPipe",
    "Segment",
    "SegmentLoader",
    "SegmentLoaderIterDataPipe",
    "load_scp_entries",
    "parse_segment",
    "slice_segments",
]

#: What ``load_scp`` can make of a value: a feature matrix, audio, or a transcript.
KINDS = ("feats", "wav", "text")

#: Sample field set by ``load_segments``: the recording id a segment was cut from.
RECORDING = "recording"

# --------------------------------------------------------------------------- load_scp


def load_scp_entries(
    entries: Iterable[tuple[str, str]],
    kind: str,
    *,
    root: str | None = None,
    allow_commands: bool = False,
    on_error: str = "raise",
    diagnostics: Diagnostics | None = None,
) -> Iterator[Sample]:
    """Resolve ``(key, value)`` entries to samples of one ``kind``.

    - ``"feats"``: ``{"key", "feats"}``, float32 ``(frames, dim)`` (:func:`read_matrix`);
    - ``"wav"``: ``{"key", "audio", "sample_rate"}`` (:func:`read_wav_value`);
    - ``"text"``: ``{"key", "text"}``, the value as is;

    plus ``"source"``, the entry's ``file:line``, for an :class:`ScpEntry`.

    Args:
        entries: :class:`ScpEntry` (errors then name file and line) or plain pairs.
        kind: one of :data:`KINDS`.
        root: directory for relative paths.
        allow_commands: allow ``cmd |`` values.
        on_error: ``"raise"``, or ``"skip"`` entries whose data is missing or bad (an
            :class:`UnsafeInputError` is skipped too, and counted under its own reason).
        diagnostics: where skips are counted (a new one if not given).

    >>> list(load_scp_entries([("u1", "HELLO WORLD")], "text"))
    [{'key': 'u1', 'text': 'HELLO WORLD'}]
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    check_on_error(on_error)
    if diagnostics is None:
        diagnostics = Diagnostics("load_scp")
    root = None if root is None else os.fspath(root)
    files = OpenFiles()
    try:
        for entry in entries:
            check_pair(entry, "load_scp")
            key, value = entry
            where = location(entry)
            try:
                if kind == "text":
                    sample: Sample = {KEY: key, TEXT: value}
                elif kind == "feats":
                    feats = read_matrix_value(
                        value, root=root, allow_commands=allow_commands, files=files,
                        where=where,
                    )
                    sample = {KEY: key, FEATS: feats}
                else:
                    audio, rate = read_wav(
                        value, root=root, allow_commands=allow_commands, files=files,
                        where=where,
                    )
                    sample = {KEY: key, AUDIO: audio, SAMPLE_RATE: rate}
            except (DataError, MissingDataError) as exc:
                diagnostics.handle(on_error, exc, _reason(exc, kind))
                continue
            yield _located(sample, where)
    finally:
        files.close()


def _located(sample: Sample, where: Location) -> Sample:
    """``sample`` with ``source`` set to its table line, ``file:line`` (as manifests do), when
    the entry it came from knows its file: later errors (``join_by_key``'s) name the line."""
    if where.source is not None:
        sample[SOURCE] = locate(where.source, line=where.line)
    return sample


def _reason(exc: Exception, kind: str) -> str:
    if isinstance(exc, UnsafeInputError):
        return "unsafe value (command not allowed)"
    if isinstance(exc, MissingDataError):
        return f"missing {kind} data"
    return f"bad {kind} data"


@functional_datapipe("load_scp")
class ScpLoaderIterDataPipe(IterDataPipe[Sample]):
    """Resolve Kaldi table entries to samples (functional name: ``load_scp``).

    Consumes :class:`ScpEntry` from ``parse_scp`` (or plain ``(key, value)`` pairs) and yields
    one sample dict per entry, in order (:func:`load_scp_entries`):

    - ``kind="feats"``: ``{"key", "feats"}``, ``feats`` float32 ``(frames, dim)`` read from
      ``ark:offset`` values (float, double or compressed; Kaldi ranges ``[0:9]``);
    - ``kind="wav"``: ``{"key", "audio", "sample_rate"}`` from an audio path, a wav stored in
      an ark, or an opt-in ``cmd |``;
    - ``kind="text"``: ``{"key", "text"}``;

    and each with ``"source"``, the table's ``file:line`` (as ``parse_manifest`` gives it),
    when the entry knows it. Errors name the table file, line and key, and the ark or audio
    path. For a ``segments`` file use ``load_segments``; to combine tables by key use
    ``join_by_key``.

    Args:
        source_datapipe: pipe of entries.
        kind: ``"feats"``, ``"wav"`` or ``"text"``.
        root: directory that relative paths are joined with; by default they are relative
            to the current directory, as in Kaldi (run from the recipe directory).
        allow_commands: run ``cmd |`` values with the shell; without it they raise
            :class:`~speechpipe.errors.UnsafeInputError`.
        on_error: ``"raise"``, or ``"skip"`` entries whose data is missing or bad, counted
            in ``self.diagnostics`` (reset each pass) and warned about at the end of a pass.

    >>> import os, tempfile, numpy as np, kaldiio
    >>> from speechpipe import IterableWrapper
    >>> tmp = tempfile.TemporaryDirectory()
    >>> feats = {"u1": np.ones((5, 3), np.float32), "u2": np.zeros((2, 3), np.float32)}
    >>> with kaldiio.WriteHelper(f"ark,scp:{tmp.name}/raw.ark,{tmp.name}/feats.scp") as w:
    ...     for k, m in feats.items():
    ...         w(k, m)
    >>> pipe = IterableWrapper([f"{tmp.name}/feats.scp"]).open_files(mode="b").parse_scp()
    >>> [(s["key"], s["feats"].shape) for s in pipe.load_scp("feats")]
    [('u1', (5, 3)), ('u2', (2, 3))]
    >>> tmp.cleanup()
    """

    holds_nothing = True  # item by item: nothing kept between two yields

    def __init__(
        self,
        source_datapipe: IterDataPipe,
        kind: str,
        *,
        root: str | os.PathLike | None = None,
        allow_commands: bool = False,
        on_error: str = "raise",
    ) -> None:
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        if root is not None and not isinstance(root, (str, os.PathLike)):
            raise TypeError(f"root must be a directory path or None, got {root!r}")
        if not isinstance(allow_commands, bool):
            raise TypeError(f"allow_commands must be a bool, got {allow_commands!r}")
        self.source_datapipe = source_datapipe
        self.kind = kind
        self.root = None if root is None else os.fspath(root)
        self.allow_commands = allow_commands
        self.on_error = check_on_error(on_error)
        self.diagnostics = Diagnostics("load_scp")

    def __iter__(self) -> Iterator[Sample]:
        self.diagnostics.reset()
        yield from load_scp_entries(
            self.source_datapipe,
            self.kind,
            root=self.root,
            allow_commands=self.allow_commands,
            on_error=self.on_error,
            diagnostics=self.diagnostics,
        )
        self.diagnostics.warn_if_skipped()

    def __len__(self) -> int:
        if self.on_error != "raise":
            raise TypeError("load_scp(on_error='skip') has no length: skips are unknown ahead")
        return len(self.source_datapipe)


ScpLoader = ScpLoaderIterDataPipe


# --------------------------------------------------------------------------- segments


class Segment(NamedTuple):
    """One line of a Kaldi ``segments`` file, parsed."""

    recording: str
    start: float
    end: float  # -1: to the end of the recording
    channel: int | None


def parse_segment(entry: tuple[str, str]) -> Segment:
    """Parse a ``segments`` entry (``ScpEntry`` from ``parse_scp``); errors name file and line.

    >>> parse_segment(ScpEntry("utt1", "rec1 0.5 2.25", "segments", 1))
    Segment(recording='rec1', start=0.5, end=2.25, channel=None)
    """
    return _parse_segment(entry[1], location(entry))


def _parse_segment(value: str, where: Location) -> Segment:
    fields = SPLIT.split(value.strip(WHITESPACE)) if value.strip(WHITESPACE) else []
    if len(fields) not in (3, 4):
        raise table_error(
            DataError,
            "expected '<utterance-id> <recording-id> <start-sec> <end-sec> [<channel>]', "
            f"got {len(fields) + 1} fields",
            where,
        )
    times = []
    for name, text in (("start", fields[1]), ("end", fields[2])):
        try:
            number = float(text)
        except ValueError:
            number = float("nan")
        if not np.isfinite(number):
            raise table_error(DataError, f"{name} time {text!r} is not a number of seconds", where)
        times.append(number)
    start, end = times
    if start < 0:
        raise table_error(DataError, f"start time {start} is negative", where)
    if end != -1 and end <= start:
        raise table_error(
            DataError, f"end time {end} is not after start time {start} (use -1 for 'to the "
            "end of the recording')", where,
        )
    channel = None
    if len(fields) == 4:
        if not fields[3].isdigit():
            raise table_error(DataError, f"channel {fields[3]!r} is not a channel number", where)
        channel = int(fields[3])
    return Segment(fields[0], start, end, channel)


class _Recordings:
    """Per-pass lookups of the recordings segments are cut from.

    Plain files are measured once with ``soundfile.info`` and then only the slice is read;
    recordings from commands or arks are decoded whole, and the last one is kept (segments
    files are sorted, so the segments of a recording come together).
    """

    def __init__(
        self, table: Mapping[str, ScpEntry], root: str | None, allow_commands: bool,
        table_name: str,
    ) -> None:
        self.table, self.root, self.allow_commands = table, root, allow_commands
        self.table_name = table_name
        self.info: dict[str, tuple[int, int] | Exception] = {}
        self.decoded: tuple[str, np.ndarray, int] | Exception | None = None
        self.decoded_id: str | None = None
        self.files = OpenFiles()

    def _file(self, entry: ScpEntry) -> str | None:
        """The audio file a wav.scp value names, or None if it must be decoded whole."""
        value = entry[1]
        if not value or is_command(value) or value.startswith("|"):
            return None
        path = resolve(value, self.root)
        ref = parse_ark_ref(value)
        if not os.path.exists(path) and ref and ref.offset is not None and ref.range is None \
                and os.path.isfile(resolve(ref.path, self.root)):
            return None
        return path

    def get(self, reco: str, where: Location) -> tuple[str | None, Any, int, int]:
        """``(path or None, audio or None, rate, frames)`` of a recording."""
        entry = self.table.get(reco)
        if entry is None:
            raise table_error(
                DataError, f"unknown recording {reco!r}: not in {self.table_name}", where
            )
        at = location(entry)
        here = f"recording {reco!r} ({at.source}:{at.line})" if at.line else f"recording {reco!r}"
        path = self._file(entry)
        if path is not None:
            cached = self.info.get(reco)
            if cached is None:
                try:
                    info = soundfile.info(path)
                    cached = (int(info.samplerate), int(info.frames))
                except (soundfile.LibsndfileError, RuntimeError, TypeError, ValueError) as exc:
                    if os.path.exists(path):
                        cached = DataError(f"{here}: cannot decode audio {path}: {exc}")
                    else:
                        cached = MissingDataError(f"{here}: audio file not found: {path}")
                self.info[reco] = cached
            if isinstance(cached, Exception):
                raise table_error(type(cached), cached.reason, where) from cached
            return path, None, cached[0], cached[1]
        if self.decoded_id != reco:
            try:
                audio, rate = read_wav(
                    entry[1], root=self.root, allow_commands=self.allow_commands,
                    files=self.files, where=at,
                )
                self.decoded = (reco, audio, rate)
            except (DataError, MissingDataError) as exc:
                self.decoded = exc
            self.decoded_id = reco
        if isinstance(self.decoded, Exception):
            exc = self.decoded
            raise table_error(type(exc), f"{here}: {exc.reason}", where) from exc
        _, audio, rate = self.decoded
        return None, audio, rate, audio.shape[0]

    def close(self) -> None:
        self.files.close()


def slice_segments(
    entries: Iterable[tuple[str, str]],
    recordings: Mapping[str, ScpEntry],
    *,
    root: str | None = None,
    allow_commands: bool = False,
    on_error: str = "raise",
    diagnostics: Diagnostics | None = None,
    table_name: str = "wav.scp",
    max_overshoot: float = 0.5,
) -> Iterator[Sample]:
    """Cut the segments of a Kaldi ``segments`` file out of their recordings.

    Each entry is ``(utterance-id, "<recording-id> <start-sec> <end-sec> [<channel>]")``; an
    end of ``-1`` means the end of the recording. Sample indices are ``round(seconds *
    sample_rate)``; only the slice of an audio file is read. The optional channel (Kaldi's
    fifth field) picks one channel of a multi-channel recording.

    Args:
        entries: entries of the segments file (:class:`ScpEntry` or plain pairs).
        recordings: ``{recording-id: wav.scp entry}``, e.g. from :func:`read_scp_table`.
        root, allow_commands: as in :func:`read_wav_value`.
        on_error: ``"raise"``, or ``"skip"`` bad segments, counted in ``diagnostics``.
        diagnostics: where skips are counted (a new one if not given).
        table_name: name of the recordings table, for error messages.
        max_overshoot: seconds a segment may end past its recording and be truncated to the
            recording's end (Kaldi's ``extract-segments --max-overshoot``, also 0.5 s);
            further is an error.

    Yields:
        ``{"key": utterance-id, "audio", "sample_rate", "recording": recording-id}``, and
        ``"source"``, the segments file's ``file:line``, for an :class:`ScpEntry`.

    Raises:
        DataError: a malformed segment (field count, non-numeric or negative time, end not
            after start, bad channel), an unknown recording, a segment past the end of its
            recording; the message names the segments file, line and utterance.

    >>> import os, tempfile, numpy as np, soundfile
    >>> tmp = tempfile.TemporaryDirectory()
    >>> path = os.path.join(tmp.name, "rec.wav")
    >>> soundfile.write(path, np.linspace(-1, 1, 100, dtype=np.float32), 10, subtype="FLOAT")
    >>> [s["audio"].shape for s in slice_segments([("utt", "rec 1.5 2.5")], {"rec": ("rec", path)})]
    [(10,)]
    >>> tmp.cleanup()
    """
    check_on_error(on_error)
    if diagnostics is None:
        diagnostics = Diagnostics("load_segments")
    lookup = _Recordings(
        recordings, None if root is None else os.fspath(root), allow_commands, table_name
    )
    try:
        for entry in entries:
            check_pair(entry, "load_segments")
            where = location(entry)
            try:
                sample = _cut(
                    entry[0], _parse_segment(entry[1], where), lookup, where, max_overshoot
                )
            except (DataError, MissingDataError) as exc:
                reason = "bad segment" if isinstance(exc, DataError) else "missing recording"
                diagnostics.handle(on_error, exc, reason)
                continue
            yield _located(sample, where)
    finally:
        lookup.close()


def _cut(
    key: str, segment: Segment, lookup: _Recordings, where: Location, max_overshoot: float
) -> Sample:
    path, whole, rate, frames = lookup.get(segment.recording, where)
    start = round(segment.start * rate)
    stop = frames if segment.end == -1 else round(segment.end * rate)
    if frames < stop <= frames + round(max_overshoot * rate):
        stop = frames  # Kaldi's tolerance: segment times are rounded, recordings are not
    if stop > frames:
        raise table_error(
            DataError,
            f"segment ends at {segment.end} s (sample {stop}), past the end of recording "
            f"{segment.recording!r} ({frames} samples, {frames / rate:.3f} s)",
            where,
        )
    if start >= stop:
        raise table_error(
            DataError,
            f"segment [{segment.start}, {segment.end}] s has no samples in recording "
            f"{segment.recording!r} ({frames} samples at {rate} Hz)",
            where,
        )
    if path is not None:
        try:
            audio, rate = read_audio(path, start=start, stop=stop, key=key)
        except (DataError, MissingDataError) as exc:
            raise relocated(exc, path, where) from exc
    else:
        audio = whole[start:stop].copy()
    if segment.channel is not None:
        channels = 1 if audio.ndim == 1 else audio.shape[1]
        if segment.channel >= channels:
            raise table_error(
                DataError,
                f"channel {segment.channel} does not exist: recording {segment.recording!r} "
                f"has {channels} channel(s)",
                where,
            )
        if audio.ndim == 2:
            audio = np.ascontiguousarray(audio[:, segment.channel])
    return {KEY: key, AUDIO: audio, SAMPLE_RATE: rate, RECORDING: segment.recording}


@functional_datapipe("load_segments")
class SegmentLoaderIterDataPipe(IterDataPipe[Sample]):
    """Cut Kaldi ``segments`` out of their recordings (functional name: ``load_segments``).

    Consumes :class:`ScpEntry` from ``parse_scp`` over a ``segments`` file (``<utt>
    <recording-id> <start-sec> <end-sec>``, end ``-1`` = to the end) and yields one sample
    per segment, in order: ``{"key": utt, "audio", "sample_rate", "recording": recording-id}``
    holding only that slice, and ``"source"``, the segments file's ``file:line``
    (:func:`slice_segments`). The ``wav_scp`` table is read at the start of each pass, not
    when the pipe is built. For whole recordings use ``load_scp("wav")``.

    Args:
        source_datapipe: pipe of segments entries.
        wav_scp: path of the ``wav.scp`` mapping recording ids to audio (paths, wavs in
            arks, or ``cmd |`` with ``allow_commands``).
        root: directory that relative paths in ``wav_scp`` are joined with (default: the
            current directory, as Kaldi).
        allow_commands: run ``cmd |`` recordings with the shell (each command runs once for
            consecutive segments of its recording).
        max_overshoot: seconds a segment may end past its recording and be truncated (Kaldi's
            default, 0.5); a segment ending further out is an error.
        on_error: ``"raise"``, or ``"skip"`` bad segments (and bad ``wav_scp`` lines),
            counted in ``self.diagnostics`` (reset each pass) and warned about at its end.

    >>> import os, tempfile, numpy as np, soundfile
    >>> from speechpipe import IterableWrapper
    >>> tmp = tempfile.TemporaryDirectory()
    >>> soundfile.write(f"{tmp.name}/rec1.flac", np.zeros(16000, np.float32), 8000)
    >>> with open(f"{tmp.name}/wav.scp", "w") as f:
    ...     _ = f.write(f"rec1 {tmp.name}/rec1.flac\\n")
    >>> with open(f"{tmp.name}/segments", "w") as f:
    ...     _ = f.write("rec1-a rec1 0.0 0.5\\nrec1-b rec1 1.5 -1\\n")
    >>> pipe = IterableWrapper([f"{tmp.name}/segments"]).open_files(mode="b").parse_scp()
    >>> [(s["key"], s["audio"].shape, s["recording"])
    ...  for s in pipe.load_segments(f"{tmp.name}/wav.scp")]
    [('rec1-a', (4000,), 'rec1'), ('rec1-b', (4000,), 'rec1')]
    >>> tmp.cleanup()
    """

    def __init__(
        self,
        source_datapipe: IterDataPipe,
        wav_scp: str | os.PathLike,
        *,
        root: str | os.PathLike | None = None,
        allow_commands: bool = False,
        max_overshoot: float = 0.5,
        on_error: str = "raise",
    ) -> None:
        if not isinstance(wav_scp, (str, os.PathLike)):
            raise TypeError(f"wav_scp must be the path of a wav.scp file, got {wav_scp!r}")
        if root is not None and not isinstance(root, (str, os.PathLike)):
            raise TypeError(f"root must be a directory path or None, got {root!r}")
        if not isinstance(allow_commands, bool):
            raise TypeError(f"allow_commands must be a bool, got {allow_commands!r}")
        self.source_datapipe = source_datapipe
        self.wav_scp = os.fspath(wav_scp)
        self.root = None if root is None else os.fspath(root)
        if not max_overshoot >= 0:
            raise ValueError(f"max_overshoot must be >= 0 seconds, got {max_overshoot}")
        self.allow_commands = allow_commands
        self.max_overshoot = float(max_overshoot)
        self.on_error = check_on_error(on_error)
        self.diagnostics = Diagnostics("load_segments")

    def __iter__(self) -> Iterator[Sample]:
        self.diagnostics.reset()
        recordings = read_scp_table(
            self.wav_scp, on_error=self.on_error, diagnostics=self.diagnostics
        )
        yield from slice_segments(
            self.source_datapipe,
            recordings,
            root=self.root,
            allow_commands=self.allow_commands,
            on_error=self.on_error,
            diagnostics=self.diagnostics,
            table_name=self.wav_scp,
            max_overshoot=self.max_overshoot,
        )
        self.diagnostics.warn_if_skipped()

    def __len__(self) -> int:
        if self.on_error != "raise":
            raise TypeError(
                "load_segments(on_error='skip') has no length: skips are unknown ahead"
            )
        return len(self.source_datapipe)


SegmentLoader = SegmentLoaderIterDataPipe
