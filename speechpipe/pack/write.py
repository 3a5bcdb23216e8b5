"""Writing the shards of :func:`~speechpipe.pack.pack_data`: one ``_ShardTask`` per shard,
run in this process or in a worker; each shard is written as ``<name>.tmp`` and renamed when
complete, and a complete shard from an earlier run is kept.
"""

from __future__ import annotations

import io
import os
from typing import Iterator, NamedTuple, Sequence

import numpy as np
import soundfile

from ..errors import DataError, MissingDataError, OutputError, SpeechpipeError, UnsafeInputError
from ..pipes.decode import read_audio_segment
from ..pipes.kaldi import ScpEntry, load_scp_entries, slice_segments
from ..pipes.shards import iter_tar_members, split_member_name
from ..pipes.shard_writer import write_shard
from .inputs import _FEATS, _MANIFEST, _SEGMENT, _Item, _no_commands

__all__ = ["AUDIO_FORMATS"]

#: How ``pack`` encodes audio: lossless (FLAC for 16-bit sources, float WAV otherwise) or
#: every utterance as 16-bit FLAC.
AUDIO_FORMATS = ("lossless", "flac16")

_FEATS_FIELD = "feats.npy"
_TEXT_FIELD = "txt"
_AUDIO_FIELDS = ("flac", "wav")
_INT16_SCALE = np.float32(32768.0)


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


def _read_items(mode: str, items: Sequence[_Item],
                allow_commands: bool = False) -> Iterator[tuple[_Item, dict]]:
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
        samples = slice_segments(entries, recordings, table_name=items[0].recording.source,
                                 allow_commands=allow_commands)
    else:
        samples = load_scp_entries(entries, mode, allow_commands=allow_commands)
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
    allow_commands: bool = False


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

    reader = _read_items(task.mode, task.items, task.allow_commands)
    try:
        write_shard(task.path, samples(reader))
    except OSError as exc:
        if isinstance(exc, SpeechpipeError):  # an input's error (a missing file): as it is
            raise
        raise OutputError.wrap(exc, task.path) from exc  # a full disk names the shard
    finally:
        reader.close()
    return True, os.path.getsize(task.path), clipped
