"""Running a pack: :func:`pack_data` and the steps it takes in order."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import multiprocessing
import os
import time
from typing import Any, Iterator, Sequence

from ..errors import DataError
from ..index import INDEX_NAME, ShardEntry, ShardIndex
from .inputs import KINDS, _as_list, _mismatch_error, _read_inputs
from .lengths import LENGTH_UNITS, _measure_chunk_args, parse_length_groups
from .options import ON_MISMATCH, UTTS_PER_SHARD, _check_fmt, _check_positive_int
from .plan import _old_index
from .report import _EXAMPLES, PackReport
from .write import AUDIO_FORMATS, _run_shard_task, _ShardTask

__all__ = ["pack_data"]


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
