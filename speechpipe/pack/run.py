"""Running a pack: :func:`pack_data` and the steps it takes in order: check the arguments,
read the inputs and match keys, measure, group by length, plan the shards, write them (in
worker processes or here), write each folder's index."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import multiprocessing
import os
import time
from collections import Counter
from typing import Any, Iterator, Mapping, Sequence

from ..errors import DataError
from ..index import ShardIndex
from ..progress import progress_bar
from .inputs import _input_files, _Inputs, _Item, _match_keys, _read_inputs
from .lengths import _measure_chunk_args
from .options import PackOptions
from .plan import (
    _group_by_length, _Measured, _other_packs, _plan_shards, _refuse_or_clean, _ShardPlan,
)
from .report import _EXAMPLES, PackReport
from .write import _run_shard_task

__all__ = ["pack_data"]


class _Default:
    """A setting's default in :func:`pack_data`'s signature: shown as the value (``help()``
    reads ``utts_per_shard: int = 2000``), and telling that the keyword was not passed."""

    __slots__ = ("value",)

    def __init__(self, name: str) -> None:
        self.value = PackOptions.__dataclass_fields__[name].default

    def __repr__(self) -> str:
        return repr(self.value)


# long: the docstring documents every argument; the body is the steps in order (~30 lines)
def pack_data(
    f_scps: str | os.PathLike | Sequence[str | os.PathLike] | None,
    f_labels: str | os.PathLike | Sequence[str | os.PathLike] | None,
    d_out: str | os.PathLike,
    fmt: str = _Default("fmt"),
    filter_group: str | Sequence[str] | None = _Default("filter_group"),
    *,
    utts_per_shard: int = _Default("utts_per_shard"),
    kind: str = _Default("kind"),
    segments: str | os.PathLike | Sequence[str | os.PathLike] | None = None,
    manifests: str | os.PathLike | Sequence[str | os.PathLike] | None = None,
    on_mismatch: str = _Default("on_mismatch"),
    num_workers: int = _Default("num_workers"),
    progress: bool = _Default("progress"),
    length_unit: str | None = _Default("length_unit"),
    audio_format: str = _Default("audio_format"),
    force: bool = _Default("force"),
    allow_commands: bool = _Default("allow_commands"),
    empty_text: str = _Default("empty_text"),
    compress: str | None = _Default("compress"),
    options: PackOptions | None = None,
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

    The settings (``fmt`` to ``compress``) are passed as keyword arguments or together as
    ``options=PackOptions(...)`` (:class:`~speechpipe.pack.PackOptions`), not both.

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
        progress: show progress (measuring, then one step per shard): tqdm bars on a
            terminal, else a line every 30 s (:func:`~speechpipe.progress.progress_bar`).
        length_unit: ``"frames"`` (features), ``"samples"`` (audio, the default) or
            ``"seconds"`` (audio).
        audio_format: ``"lossless"`` (16-bit sources as FLAC, finer ones as float WAV) or
            ``"flac16"``: every utterance as 16-bit FLAC, rounding finer samples (decoded
            Opus or MP3 as in WenetSpeech, GigaSpeech, Common Voice) to 16 bits as Kaldi and
            WeNet do -- a quarter of the size of float WAV; samples beyond the range are
            clipped and counted (:attr:`PackReport.clipped`). Recorded in the index: a
            rerun with another format rewrites the shards.
        force: delete what another pack left in ``out_dir`` (other length groups, flat
            shards beside groups or the reverse, shard-named files this pack does not plan)
            instead of refusing; listed in :attr:`PackReport.removed`.
        allow_commands: run the ``cmd |`` values of ``wav.scp`` tables (Kaldi's
            ``flac -c -d -s x.flac |``, ``sox ... |``) with the shell and pack their audio;
            opt-in, as the commands run with your rights. A table named ``wav.scp`` whose
            first value is a command is then taken as audio (else pass ``kind``).
        empty_text: labels that are empty (or only spaces): ``"error"`` (default, as in
            ``prepare``), ``"skip"`` (not packed) or ``"keep"``; counted in the report.
        compress: ``None`` (plain tar), ``"gz"`` or ``"zst"``: shards compressed as they are
            written, named ``*.tar.gz``/``*.tar.zst``; read sequentially, never mapped
            (smaller to store and send, slower to read: benchmarks/README.md).
        options: all the settings above (``fmt`` to ``compress``) in one
            :class:`~speechpipe.pack.PackOptions`, instead of the keyword arguments.

    Returns:
        A :class:`PackReport` (``print(report.report())``).

    Raises:
        ValueError: a bad argument (overlapping groups, bad ``fmt``, both scps and manifests).
        TypeError: an argument of the wrong type, or ``options`` together with settings passed
            as keyword arguments (naming them).
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
    files = _input_files(f_scps, f_labels, segments, manifests)
    if not isinstance(d_out, (str, os.PathLike)) or not os.fspath(d_out):
        raise TypeError(f"d_out must be a folder path, got {d_out!r}")
    out_dir = os.fspath(d_out)
    options = _settings(options, fmt=fmt, filter_group=filter_group,
                        utts_per_shard=utts_per_shard, kind=kind, on_mismatch=on_mismatch,
                        num_workers=num_workers, progress=progress, length_unit=length_unit,
                        audio_format=audio_format, force=force,
                        allow_commands=allow_commands, empty_text=empty_text,
                        compress=compress)
    others = _other_packs(out_dir, options)
    if not options.force:
        _refuse_or_clean(others, out_dir, options)  # refuses, before anything is read
    if files.manifests and options.kind == "feats":
        raise ValueError("manifests name audio files: kind must be 'auto' or 'wav'")

    # 1. Tables and keys.
    inputs = _read_inputs(files.scps, files.labels, files.segments, files.manifests,
                          options.kind, options.allow_commands)
    unit = _length_unit(options.length_unit, inputs.kind)
    items, no_label, no_data = _match_keys(inputs, options.on_mismatch)
    items, empty = _empty_labels(items, options.empty_text, inputs)
    report = PackReport(
        out_dir, inputs.kind, unit,
        keys_without_label=len(no_label), keys_without_label_examples=no_label[:_EXAMPLES],
        labels_without_data=len(no_data), labels_without_data_examples=no_data[:_EXAMPLES],
        empty_text=len(empty), empty_text_examples=empty[:_EXAMPLES],
        empty_text_policy=options.empty_text,
    )
    executor = _executor(options.num_workers)
    try:
        # 2. Lengths; 3. groups and shards; 4. shards, then indexes.
        measured = _measure(executor, inputs, items, unit, options)
        sample_rate = _sample_rates(measured, unit, report, inputs.data_files)
        by_group = _group_by_length(measured, options.groups, report)
        report.removed.extend(_refuse_or_clean(others, out_dir, options))
        plan = _plan_shards(by_group, measured, out_dir, inputs, unit, options, report)
        _write_shards(executor, plan, report, options.progress)
    finally:
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)
    rates = {item.key: rate for item, (_, rate) in zip(measured.items, measured.native)
             if rate is not None}
    _write_indexes(plan, unit, None if inputs.kind == "feats" else options.audio_format, report,
                   sample_rate, rates)
    report.seconds = time.monotonic() - started
    return report


def _settings(options: PackOptions | None, **keywords: Any) -> PackOptions:
    """``options``, or the :class:`PackOptions` of the settings passed as keywords."""
    passed = {name: value for name, value in keywords.items()
              if not isinstance(value, _Default)}
    if options is None:
        return PackOptions(**passed)
    if not isinstance(options, PackOptions):
        raise TypeError(f"options must be a PackOptions, got {options!r}")
    if passed:
        raise TypeError(f"pack_data() got options and the keyword argument(s) "
                        f"{', '.join(passed)}: pass the settings one way, not both")
    return options


def _empty_labels(items: list[_Item], policy: str, inputs: _Inputs
                  ) -> tuple[list[_Item], list[str]]:
    """``(items packed, keys with an empty label)`` under ``policy`` (``"keep"`` packs them,
    ``"skip"`` leaves them out; both counted in the report).

    Raises:
        DataError: under ``"error"``, with the count and a few keys.
    """
    empty = [item.key for item in items if not item.text.strip()]
    if empty and policy == "error":
        raise DataError(
            f"{len(empty)} utterance(s) with an empty label (e.g. "
            f"{', '.join(map(repr, empty[:_EXAMPLES]))}); fix the labels, or pass "
            "empty_text='skip' to leave them out or 'keep' to pack them, counted "
            "(CLI: --empty-text skip|keep)", source=", ".join(inputs.label_files))
    if policy == "skip" and empty:
        dropped = set(empty)
        items = [item for item in items if item.key not in dropped]
    return items, empty


def _length_unit(length_unit: str | None, kind: str) -> str:
    """The unit of lengths: ``length_unit``, by default frames for features and samples for
    audio."""
    unit = length_unit or ("frames" if kind == "feats" else "samples")
    if (kind == "feats") != (unit == "frames"):
        raise ValueError(f"length_unit {unit!r} does not fit {kind}: use 'frames' for "
                         "features, 'samples' or 'seconds' for audio")
    return unit


def _measure(executor: concurrent.futures.Executor | None, inputs: _Inputs,
             items: list[_Item], unit: str, options: PackOptions) -> _Measured:
    """Measure every item, ``utts_per_shard`` per task (in the workers, if any)."""
    per_task = options.utts_per_shard
    chunks = [items[i:i + per_task] for i in range(0, len(items), per_task)]
    measured: list[list[tuple[int, int | None]]] = [[] for _ in chunks]
    with progress_bar(total=len(chunks), desc="pack: measure", unit="chunk",
                      disable=not options.progress) as bar:
        for i, result in _run_all(executor, _measure_chunk_args, [
                (inputs.mode, chunk, options.allow_commands) for chunk in chunks], bar):
            measured[i] = result
    native = [n for chunk in measured for n in chunk]
    lengths = [n / rate if unit == "seconds" else n for n, rate in native]
    return _Measured(items, native, lengths)


def _sample_rates(measured: _Measured, unit: str, report: PackReport,
                  sources: Sequence[str]) -> int | None:
    """Count the audio's sample rates in ``report``; return the one rate that lengths in
    samples are counted at (recorded in the index, so that nothing reads them at another).

    Raises:
        DataError: lengths in samples of audio at several rates (they would mean different
            durations): the counts, a few keys at the rarer rates, and the fix.
    """
    by_rate: dict[int, list[str]] = {}
    for item, (_, rate) in zip(measured.items, measured.native):
        if rate is not None:
            by_rate.setdefault(int(rate), []).append(item.key)
    report.sample_rates = {rate: len(keys) for rate, keys in sorted(by_rate.items())}
    if unit != "samples" or not by_rate:
        return None
    if len(by_rate) > 1:
        common = max(by_rate, key=lambda r: len(by_rate[r]))
        rare = [f"{key!r} ({rate} Hz)" for rate, keys in sorted(by_rate.items())
                if rate != common for key in keys[:_EXAMPLES]]
        counts = ", ".join(f"{rate} Hz: {len(keys)}" for rate, keys in sorted(by_rate.items()))
        raise DataError(
            f"the audio has {len(by_rate)} sample rates ({counts}; e.g. {', '.join(rare)}): "
            "lengths counted in samples would mean different durations. Pack with "
            "length_unit='seconds' (CLI: --length-unit seconds), or resample the odd files",
            source=", ".join(sources))
    return next(iter(by_rate))


def _write_shards(executor: concurrent.futures.Executor | None, plan: _ShardPlan,
                  report: PackReport, progress: bool) -> None:
    """Run the plan's shard tasks (in the workers, if any); record each shard's size in its
    index entry and count it in ``report``."""
    with progress_bar(total=len(plan.tasks) + report.shards_skipped,
                      initial=report.shards_skipped, desc="pack: write", unit="shard",
                      disable=not progress) as bar:
        for i, (written, size, clipped) in _run_all(executor, _run_shard_task, plan.tasks, bar):
            report.clipped += clipped
            name = os.path.basename(plan.tasks[i].path)
            folder = plan.folders[i]
            plan.entries[folder][name] = dataclasses.replace(plan.entries[folder][name],
                                                             bytes=size)
            report.bytes_total += size
            if written:
                report.shards_written += 1
                report.bytes_written += size
            else:
                report.shards_skipped += 1


def _write_indexes(plan: _ShardPlan, unit: str, audio_format: str | None,
                   report: PackReport, sample_rate: int | None = None,
                   rates: Mapping[str, int] | None = None) -> None:
    """Write each folder's ``index.jsonl``, last: an index means a complete pack."""
    for folder, by_name in plan.entries.items():
        # In shard-number order (the plan's), which is also sorted key order.
        counts = None
        if rates:  # audio: the rates of this folder's utterances, for readers of the index
            counts = dict(Counter(rates[k] for entry in by_name.values() for k in entry.keys))
        index = ShardIndex(folder, list(by_name.values()), length_unit=unit,
                           audio_format=audio_format, sample_rate=sample_rate,
                           sample_rates=counts)
        report.index_paths.append(index.write())


def _executor(num_workers: int) -> concurrent.futures.Executor | None:
    if num_workers == 1:
        return None
    # spawn: workers start clean (no inherited threads or locks from torch or tqdm). Ctrl-C
    # reaches every process of the terminal's group: the workers leave it to the main
    # process, which stops the run and says how to continue (no traceback per worker).
    return concurrent.futures.ProcessPoolExecutor(
        max_workers=num_workers, mp_context=multiprocessing.get_context("spawn"),
        initializer=_leave_interrupts_to_the_main_process)


def _submit_all(executor, fn, args: Sequence) -> dict:
    """Submit every task; the workers this starts inherit an ignored Ctrl-C (SIGINT), so
    that one arriving while they start up (before their initializer runs) prints no
    traceback either."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return {executor.submit(fn, arg): i for i, arg in enumerate(args)}
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        return {executor.submit(fn, arg): i for i, arg in enumerate(args)}
    finally:
        signal.signal(signal.SIGINT, previous)


def _leave_interrupts_to_the_main_process() -> None:
    """A pack worker ignores Ctrl-C (SIGINT): the main process handles it."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _run_all(executor, fn, args: Sequence, bar) -> Iterator[tuple[int, Any]]:
    """``(index, fn(args[index]))`` as they complete; stops everything at the first error."""
    if executor is None:
        for i, arg in enumerate(args):
            result = fn(arg)
            bar.update(1)
            yield i, result
        return
    futures = _submit_all(executor, fn, args)
    try:
        for future in concurrent.futures.as_completed(futures):
            result = future.result()
            bar.update(1)
            yield futures[future], result
    finally:
        for future in futures:
            future.cancel()
