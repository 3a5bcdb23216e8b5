"""Lengths for :func:`~speechpipe.pack.pack_data`: measuring every utterance (frames of
features, samples of audio; headers only where they tell the length) and the length groups
``"lo:hi"`` that sort utterances into folders.
"""

from __future__ import annotations

import math
import os
import struct
from typing import Any, NamedTuple, Sequence

import soundfile

from ..errors import DataError, MissingDataError, UnsafeInputError
from ..pipes.decode import read_audio_segment
from ..pipes.kaldi import ScpEntry, parse_ark_ref, parse_segment, read_matrix, read_wav_value
from ..recipes import verify_audio
from .inputs import FEATS, SEGMENT, WAV, Item, no_commands

__all__ = ["LENGTH_UNITS", "LengthGroup", "parse_length_groups"]

#: Values of ``length_unit=``: ``frames`` for features; ``samples`` or ``seconds`` for audio.
LENGTH_UNITS = ("frames", "samples", "seconds")


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
# Measuring utterances
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


def _measure_chunk(mode: str, items: Sequence[Item], allow_commands: bool = False,
                   on_error: str = "raise") -> list[tuple[int, int | None] | str]:
    """``(length, sample_rate or None)`` of each item: frames of features, samples of audio;
    under ``on_error="skip"``, the fault (a sentence naming the file, line and key) of an item
    that cannot be read instead.

    Headers only where they tell the length (Kaldi binary matrices, audio files); anything
    else (text or NPY matrices, ranges, wavs stored in arks) is read in full. Under
    ``"skip"`` every audio file is decoded through once (a truncated or corrupt file has a
    good header), so that what is planned can be written. Runs in worker processes, hence
    module level.
    """
    out: list[tuple[int, int | None] | str] = []
    files = _Files()
    infos: dict[str, Any] = {}
    if on_error == "skip" and mode != FEATS:  # decode every audio file through, once
        paths = [(i.recording.value if mode == SEGMENT else i.value) for i in items]
        found = verify_audio([p for p in paths if os.path.isfile(p)], progress=False)
        infos.update({("verified", path): check for path, check in found.items()})
    try:
        for item in items:
            try:
                out.append(_measure_item(mode, item, files, infos, allow_commands))
            except UnsafeInputError as exc:
                raise no_commands(exc) from exc
            except (DataError, MissingDataError, OSError) as exc:
                if on_error != "skip":
                    raise
                out.append(_fault(exc, item))
    finally:
        files.close()
    return out


def _fault(exc: BaseException, item: Item) -> str:
    """A skipped item's fault as one line naming its place (file, line, key); a segment's
    names the segment, then its recording's place if the fault is there."""
    where = f"{item.source}:{item.line}" if item.line is not None else str(item.source)
    where = f"{where} (key {item.key!r})"
    if not isinstance(exc, (DataError, MissingDataError)) or exc.source is None:
        return f"{where}: {exc}"
    if item.recording is not None and exc.key == item.recording.key:
        return f"{where}: its recording, {exc}"
    return str(exc)


def _verified(path: str, infos: dict, item: Item | ScpEntry) -> None:
    """The fault :func:`~speechpipe.recipes.verify_audio` found in ``path``, if any, raised
    naming the item (``on_error="skip"``)."""
    check = infos.get(("verified", path))
    if check is None:
        return
    if check.problem == "missing":
        raise MissingDataError(f"{path}: audio file not found", source=item.source,
                               line=item.line, key=item.key)
    if check.problem is not None:
        raise DataError(f"{path}: {check.problem} audio: {check.detail}", source=item.source,
                        line=item.line, key=item.key)


def _measure_item(mode: str, item: Item, files: _Files, infos: dict,
                  allow_commands: bool) -> tuple[int, int | None]:
    """The length and rate of one item (see :func:`_measure_chunk`); an audio file that
    soundfile opens is checked against what decoding it found, if it was decoded."""
    where = dict(source=item.source, line=item.line, key=item.key)
    if mode == FEATS:
        rows = None
        ref = parse_ark_ref(item.value)
        if ref is not None and ref.range is None and not item.value.endswith("|"):
            rows = _binary_rows(files, ref.path, ref.offset or 0)
        if rows is None:
            rows = read_matrix(item.value, **where).shape[0]
        return rows, None
    if mode == WAV:
        info = None if item.value.endswith("|") else _audio_info(item.value, infos)
        if info is not None:
            _verified(item.value, infos, item)
        if info is None:
            audio, rate = read_wav_value(item.value, allow_commands=allow_commands, **where)
            info = (audio.shape[0], rate, 1)
        return info[:2]
    if mode == SEGMENT:
        reco = item.recording
        if not reco.value.endswith("|") and _audio_info(reco.value, infos) is not None:
            _verified(reco.value, infos, item)
        return _segment_length(item, infos, allow_commands)
    if _audio_info(item.value, infos) is not None:
        _verified(item.value, infos, item)
    return _manifest_length(item, infos)


def _segment_length(item: Item, infos: dict, allow_commands: bool = False) -> tuple[int, int]:
    """Samples of a segment, by the rules of :func:`~speechpipe.pipes.kaldi._loaders.slice_segments`."""
    segment = parse_segment(ScpEntry(item.key, item.value, item.source, item.line))
    reco = item.recording
    info = None if reco.value.endswith("|") else _audio_info(reco.value, infos)
    if info is None:
        cached = infos.get(("reco", reco.key))
        if cached is None:
            audio, rate = read_wav_value(reco.value, source=reco.source, line=reco.line,
                                         key=reco.key, allow_commands=allow_commands)
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


def _manifest_length(item: Item, infos: dict) -> tuple[int, int]:
    """Samples :func:`~speechpipe.pipes.decode._decode.read_audio_segment` will read for a line."""
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



def measure_chunk_args(args: tuple[str, Sequence[Item], bool, str]
                       ) -> list[tuple[int, int | None] | str]:
    return _measure_chunk(*args)
