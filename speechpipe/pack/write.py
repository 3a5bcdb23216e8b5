"""Writing the shards of :func:`~speechpipe.pack.pack_data`: one ``ShardTask`` per shard,
run in this process or in a worker (a process pool, Dask, a task of a job array); each shard is
written under a temporary name unique to the attempt (``.tmp-<pid>-<random>-<name>``) and
renamed when complete, and a complete shard from an earlier run is kept.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import uuid
from typing import Iterator, NamedTuple, Sequence

import numpy as np
import soundfile

from ..errors import DataError, MissingDataError, OutputError, SpeechpipeError, UnsafeInputError
from ..pipes.decode import read_audio_segment
from ..pipes.kaldi import ScpEntry, load_scp_entries, slice_segments
from ..pipes.shards import iter_tar_members, split_member_name
from ..pipes.shards import write_shard
from ..remote import RemoteOptions
from ..remote import is_remote
from ..remote import open_remote
from .inputs import FEATS, MANIFEST, SEGMENT, Item, no_commands
from .storage import Storage

__all__ = ["AUDIO_FORMATS"]

#: How ``pack`` encodes audio: lossless (FLAC for 16-bit sources, float WAV otherwise) or
#: every utterance as 16-bit FLAC.
AUDIO_FORMATS = ("lossless", "flac16")

_FEATS_FIELD = "feats.npy"
_TEXT_FIELD = "txt"
_META_FIELD = "json"
_AUDIO_FIELDS = ("flac", "wav")
_INT16_SCALE = np.float32(32768.0)


def _encode_audio(audio: np.ndarray, rate: int, item: Item,
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


def _read_items(mode: str, items: Sequence[Item],
                allow_commands: bool = False) -> Iterator[tuple[Item, dict]]:
    """Each item with its decoded sample (``feats`` or ``audio`` + ``sample_rate``)."""
    if mode == MANIFEST:
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
    if mode == SEGMENT:
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
                raise no_commands(exc) from exc
            yield item, sample
    finally:
        samples.close()


class ShardTask(NamedTuple):
    path: str  # the final shard path
    mode: str
    items: tuple[Item, ...]
    lengths: tuple[int, ...]  # planned lengths (frames or samples)
    check_existing: bool  # an existing shard may be kept if its member names are right
    audio_format: str = "lossless"
    allow_commands: bool = False
    remote: RemoteOptions | None = None  # how a URL path is written and read


_TMP_PREFIX = ".tmp-"


def _tmp_name(name: str) -> str:
    """A temporary name for writing shard ``name``, unique to this attempt (two runs or two
    attempts of one task never write the same file); it keeps the shard's suffix, which says
    how the shard is compressed."""
    return f"{_TMP_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}-{name}"


def is_tmp_of(name: str, shard_name_re: re.Pattern) -> bool:
    """Whether ``name`` is a temporary file of a shard named by ``shard_name_re`` (an attempt
    that did not finish, or is running)."""
    match = re.fullmatch(re.escape(_TMP_PREFIX) + r"\d+-[0-9a-f]{12}-(.+?)(\.tmp)?", name)
    return match is not None and bool(shard_name_re.fullmatch(match.group(1)))


def remove_tmp_files(folder: str, shard_names) -> list[str]:
    """Delete the temporary files of the shards ``shard_names`` in the local ``folder`` (left
    by killed attempts: call only while owning the shards, under their lock); return them.
    (Shards for object storage are written in local temporary folders: nothing to do.)"""
    if is_remote(folder):
        return []
    wanted = set(shard_names)
    removed = []
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    for name in sorted(names):
        match = re.fullmatch(re.escape(_TMP_PREFIX) + r"\d+-[0-9a-f]{12}-(.+?)(\.tmp)?", name)
        if match is not None and match.group(1) in wanted:
            try:
                os.remove(os.path.join(folder, name))
                removed.append(os.path.join(folder, name))
            except FileNotFoundError:
                pass
    return removed


def shard_is_complete(task: ShardTask) -> bool:
    """Whether the shard on disk is a complete tar holding exactly the planned members.

    Reads the shard once with :func:`~speechpipe.pipes.shards._reader.iter_tar_members` (sequential
    I/O, no decoding): it checks every header checksum and the end-of-archive marker, so a
    truncated or damaged file is rewritten.
    """
    allowed = (_FEATS_FIELD,) if task.mode == FEATS else (
        ("flac",) if task.audio_format == "flac16" else _AUDIO_FIELDS)
    expected = iter(task.items)
    current: tuple[Item, set] | None = None
    try:
        with (open_remote(task.path, task.remote) if is_remote(task.path)
              else open(task.path, "rb")) as f:
            for name, _ in iter_tar_members(f, source=task.path):
                key, fld = split_member_name(name, source=task.path)
                if current is None or key != current[0].key:
                    if current is not None and not _fields_ok(*current, allowed):
                        return False
                    item = next(expected, None)
                    if item is None or item.key != key:
                        return False
                    current = (item, set())
                current[1].add(fld)
    except (OSError, DataError):
        return False
    return (current is not None and _fields_ok(*current, allowed)
            and next(expected, None) is None)


def _fields_ok(item: Item, fields: set, allowed: Sequence[str]) -> bool:
    meta = item.meta is not None
    return (len(fields) == 2 + meta and _TEXT_FIELD in fields and bool(fields & set(allowed))
            and (_META_FIELD in fields) == meta)


def run_shard_task(task: ShardTask) -> tuple[bool, int, int]:
    """Write one shard (or keep a complete one): ``(written, size in bytes, utterances
    clipped)``.

    Runs in worker processes (module level, picklable arguments: spawn-safe). The shard is
    written under a temporary name unique to this attempt and renamed when complete.
    """
    store = Storage(task.path, task.remote)
    folder, name = store.split(task.path)
    if task.check_existing:
        try:
            size = store.size(task.path)
        except FileNotFoundError:
            size = None
        if size is not None and shard_is_complete(task):
            return False, size, 0
    clipped = 0

    def samples(reader: Iterator[tuple[Item, dict]]) -> Iterator[dict]:
        nonlocal clipped
        for (item, sample), planned in zip(reader, task.lengths):
            data = sample["feats"] if task.mode == FEATS else sample["audio"]
            if data.shape[0] != planned:
                raise DataError(
                    f"read {data.shape[0]} {'frames' if task.mode == FEATS else 'samples'} but "
                    f"measured {planned} when planning: did the data change during packing?",
                    source=item.source, line=item.line, key=item.key)
            out = {"key": item.key, _TEXT_FIELD: item.text}
            if item.meta is not None:
                out[_META_FIELD] = item.meta.encode("utf-8")
            if task.mode == FEATS:
                out[_FEATS_FIELD] = data
            else:
                ext, payload, cut = _encode_audio(data, sample["sample_rate"], item,
                                                  task.audio_format)
                out[ext] = payload
                clipped += cut
            yield out

    tmp = store.local_tmp(task.path, _tmp_name(name))
    reader = _read_items(task.mode, task.items, task.allow_commands)
    try:
        try:
            write_shard(tmp, samples(reader))  # itself via <tmp>.tmp: nothing left on error
        finally:
            reader.close()
        size = os.path.getsize(tmp)
        store.publish(tmp, task.path)  # under the final name only when complete
    except BaseException as exc:
        if os.path.exists(tmp):
            os.remove(tmp)
        if store.is_url:  # its own temporary folder
            shutil.rmtree(os.path.dirname(tmp), ignore_errors=True)
        if isinstance(exc, OSError) and not isinstance(exc, SpeechpipeError):
            raise OutputError.wrap(exc, task.path) from exc  # a full disk names the shard
        raise
    return True, size, clipped
