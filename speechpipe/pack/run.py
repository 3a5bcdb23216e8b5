"""Running a pack: :func:`pack_data` and the steps it takes in order: check the arguments,
read the inputs and match keys, measure, group by length, plan the shards, write them (in
worker processes or here), write each folder's index."""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import multiprocessing
import os
import tempfile
import time
from collections import Counter
from typing import Any, Mapping, NamedTuple, Sequence

from ..errors import DataError, FolderLockedError, OutputError
from ..executors import as_executor, leave_interrupts_to_the_main_process, run_tasks
from ..index import INDEX_NAME, ShardIndex
from ..remote import RemoteOptions
from ..progress import progress_bar
from .inputs import input_files, Inputs, Item, match_keys, read_inputs
from .lengths import measure_chunk_args
from .lock import LOCK_NAME, FolderLock, live_locks, refuse_if_locked, task_lock_name
from .options import PackOptions
from .plan import (
    PLAN_NAME, group_by_length, Measured, other_packs, plan_shards, refuse_or_clean,
    ShardPlan,
)
from .report import EXAMPLES, PackReport
from .storage import Storage
from .write import remove_tmp_files, run_shard_task, shard_is_complete

__all__ = ["merge_pack", "pack_data", "pack_task", "plan_pack"]


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
    on_error: str = _Default("on_error"),
    executor: Any = None,
    remote: RemoteOptions | None = None,
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
      reading, so that the tokenizer can change without packing again);
    - ``<key>.json``, from manifests only: the line's other fields (``speaker``, ``chapter``,
      Common Voice's ``age``, ``gender``, ``accent``, ``locale``...; all but those in
      :data:`~speechpipe.pack.MANIFEST_FIELDS_NOT_KEPT`) as a JSON object with sorted keys;
      ``decode`` reads it with :mod:`json` (never pickle) as ``meta``. No member when there
      are none.

    Each folder gets ``index.jsonl`` (:class:`~speechpipe.index.ShardIndex`): per shard its
    name, count, byte size, keys and lengths (frames for features, samples for audio, or
    seconds with ``length_unit="seconds"``), written last and atomically: an index means a
    complete pack.

    **Determinism**: the same inputs give byte-identical shards and indexes, whatever
    ``num_workers`` (each shard depends only on its own utterances; tar headers are fixed).

    **One run per folder**: a run holds ``d_out/.speechpipe-pack.lock`` (its pid and host)
    while it writes there; a second run fails with
    :class:`~speechpipe.errors.FolderLockedError` naming the holder. A lock left by a
    process of this host that no longer runs is taken over with a warning. Before the index
    is written, every shard written is checked against its plan (present, complete, the
    planned members, the size its task reported).

    **Beyond one machine**: ``executor=`` runs the measuring and writing on any
    :class:`concurrent.futures.Executor`, or on a Dask cluster (a ``distributed.Client``;
    ``pip install 'speechpipe[dask]'``); :func:`~speechpipe.pack.plan_pack`,
    :func:`~speechpipe.pack.pack_task` and :func:`~speechpipe.pack.merge_pack` run the same
    steps as a job array. The bytes are the same in every case.

    **Interrupted runs**: each shard is written under a temporary name unique to the attempt
    (``.tmp-<pid>-<random>-<name>``) and renamed when complete,
    so a killed run leaves no partial shard under a shard name. A rerun with the same inputs
    keeps the shards already complete: a shard listed in an existing ``index.jsonl`` is kept
    if its keys and lengths are those planned and its size is the indexed size (one ``stat``);
    without an index entry, a shard is kept if reading it through (headers checksummed, the
    end-of-archive marker present; no decoding) shows exactly the planned member names.
    Everything else is rewritten. Content is not compared: after changing the data of
    existing keys, pack into a fresh folder.

    The settings (``fmt`` to ``on_error``) are keyword arguments, checked together as a
    :class:`~speechpipe.pack.PackOptions` (what a job array's plan records).

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
        length_unit: ``"frames"`` (features), ``"samples"`` or ``"seconds"`` (audio). By
            default frames for features, and for audio samples when it has one sample rate,
            seconds when it has several (8 kHz telephone speech beside 16 kHz and 48 kHz
            recordings: samples would mean different durations) and no ``filter_group`` is
            given (groups are in the unit: name it); the report and the index say which.
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
        on_error: an utterance whose data is missing, unreadable, truncated or corrupt (a file
            a ``wav.scp``, ``feats.scp``, ``segments`` recording or manifest line names):
            ``"raise"`` (default) a :class:`~speechpipe.errors.MissingDataError` or
            :class:`~speechpipe.errors.DataError` naming the file, line and key, or
            ``"skip"``: left out before planning, counted once per utterance and reported
            with a few examples (:attr:`PackReport.unreadable`). Under ``"skip"`` every audio
            file is decoded through while measuring (a truncated file has a good header), so
            the audio is read twice. A table command that is not allowed still raises.
        remote: how ``d_out`` is written when it is a URL (``s3://bucket/corpus``, any fsspec
            URL; :class:`~speechpipe.remote.RemoteOptions`, e.g. its ``storage_options``):
            each shard is written locally, then uploaded under its final name (an object
            appears only when complete); the index last. No lock is taken in object storage.
        executor: where utterances are measured and shards written: a
            :class:`concurrent.futures.Executor` (left running), or a Dask
            ``distributed.Client`` (its ``get_executor()``); ``None``: ``num_workers``
            processes (or this one). Not together with ``num_workers > 1``.

    Returns:
        A :class:`PackReport` (``print(report.report())``).

    Raises:
        ValueError: a bad argument (overlapping groups, bad ``fmt``, both scps and manifests).
        TypeError: an argument of the wrong type, or ``options`` together with settings passed
            as keyword arguments (naming them).
        FolderLockedError: another run writes ``d_out`` (naming its pid and host).
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
    >>> sorted(os.listdir(f"{d}/out/10_500"))  # the index's mapped table beside it
    ['data-00000.tar', 'data-00001.tar', 'index.jsonl', 'index.jsonl.spmap']
    >>> tmp.cleanup()
    """
    started = time.monotonic()
    files, out_dir, options = _arguments(f_scps, f_labels, segments, manifests, d_out,
                                         fmt=fmt, filter_group=filter_group,
                                         utts_per_shard=utts_per_shard, kind=kind,
                                         on_mismatch=on_mismatch, num_workers=num_workers,
                                         progress=progress, length_unit=length_unit,
                                         audio_format=audio_format, force=force,
                                         allow_commands=allow_commands,
                                         empty_text=empty_text, compress=compress,
                                         on_error=on_error)
    pool, owned = _executor(options.num_workers, executor)
    try:
        # 1. Tables, keys and lengths (read only); 2. groups and shards (under the lock);
        # 3. the shards; 4. the merge: shards checked, then the indexes.
        store = _storage(out_dir, remote)
        measured = _measure_inputs(files, store, options, pool)
        with _owning(store, "pack"):
            _refuse_if_locked(store, ignore=LOCK_NAME)  # no task of a plan is running
            plan, report = _plan(measured, store, options)
            if store.isfile(store.join(out_dir, PLAN_NAME)):  # a job array's, superseded
                store.remove(store.join(out_dir, PLAN_NAME))
            sizes = _write_shards(pool, plan, report, options.progress)
            _merge(plan, report, store, sizes)
            for folder, by_name in plan.entries.items():  # of attempts that died (a worker
                remove_tmp_files(folder, by_name)  # killed mid-shard: its task ran again)
    finally:
        if owned:
            pool.shutdown(wait=True, cancel_futures=True)
    report.seconds = time.monotonic() - started
    return report


def plan_pack(
    f_scps: str | os.PathLike | Sequence[str | os.PathLike] | None,
    f_labels: str | os.PathLike | Sequence[str | os.PathLike] | None,
    d_out: str | os.PathLike,
    *,
    segments: str | os.PathLike | Sequence[str | os.PathLike] | None = None,
    manifests: str | os.PathLike | Sequence[str | os.PathLike] | None = None,
    executor: Any = None,
    remote: RemoteOptions | None = None,
    **settings: Any,
) -> PackReport:
    """The first step of a pack run as a job array (CLI: ``pack ... --plan-only``): read and
    measure the inputs as :func:`pack_data` does and write the plan, ``d_out/pack_plan.jsonl``
    -- which keys go to which shard, with what the tasks need to write them -- instead of the
    shards. Then :func:`pack_task` ``(d_out, i, n)`` for ``i`` in 1 to ``n`` (any machine
    seeing ``d_out`` and the inputs by the same paths, any order, reruns welcome) and
    :func:`merge_pack` write the very bytes :func:`pack_data` writes.

    The plan is deterministic (the same inputs and options give the same file); relative
    paths of the tables are kept as written, so tasks must run in the same directory as the
    planning (as Kaldi's ``queue.pl`` jobs do). Arguments as :func:`pack_data`, whose keyword
    settings (``fmt``, ``filter_group``, ``utts_per_shard`` ... ``compress``) ``settings``
    holds; ``executor`` measures the utterances.

    Returns:
        The report of the planning (``shards_skipped``: shards an earlier run left complete).
    """
    files, out_dir, options = _arguments(f_scps, f_labels, segments, manifests, d_out,
                                         **settings)
    store = _storage(out_dir, remote)
    pool, owned = _executor(options.num_workers, executor)
    try:
        measured = _measure_inputs(files, store, options, pool)
    finally:
        if owned:
            pool.shutdown(wait=True, cancel_futures=True)
    with _owning(store, "pack --plan-only"):
        _refuse_if_locked(store, ignore=LOCK_NAME)  # no task of an earlier plan is running
        plan, report = _plan(measured, store, options)
        plan.write(store, report)
    return report


def pack_task(d_out: str | os.PathLike, task: int, tasks: int, *, num_workers: int = 1,
              executor: Any = None, progress: bool = True,
              remote: RemoteOptions | None = None) -> PackReport:
    """Write the shards of task ``task`` (1 to ``tasks``) of the plan in ``d_out`` (CLI:
    ``pack --out DIR --task i/N``): every ``tasks``-th shard to write, in plan order, each
    under a temporary name and renamed when complete; shards already complete are kept (a
    killed task is simply run again). Two runs of one task at once are refused
    (:class:`~speechpipe.errors.FolderLockedError`), as is a task beside a whole run.

    Returns:
        What this task did: ``shards_written``, ``shards_skipped`` (complete already),
        bytes, clipped utterances; its ``groups`` are empty (the merge reports the pack).

    Raises:
        MissingDataError: no plan in ``d_out``.
        FolderLockedError: this task (or a whole pack of the folder) runs elsewhere.
    """
    out_dir = _out_dir(d_out)
    for name, value in (("task", task), ("tasks", tasks)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    if task > tasks:
        raise ValueError(f"task must be in 1..{tasks}, got {task}")
    store = _storage(out_dir, remote)
    pool, owned = _executor(num_workers, executor)
    try:
        with _owning(store, f"pack --task {task}/{tasks}", task_lock_name(task, tasks)):
            held = [h for h in (() if store.is_url else live_locks(out_dir))
                    if os.path.basename(h[0]) == LOCK_NAME]
            if held:
                raise FolderLockedError(f"this pack folder is in use by {held[0][1]}: tasks "
                                        "run after the planning ends", source=held[0][0])
            plan, report = ShardPlan.read(store)
            report.groups = {}
            mine = [j for j, n in enumerate(plan.task_numbers(tasks)) if n == task]
            for j in mine:
                remove_tmp_files(*store.split(plan.tasks[j].path))
            _write_shards(pool, plan, report, progress, mine)
    finally:
        if owned:
            pool.shutdown(wait=True, cancel_futures=True)
    return report


def merge_pack(d_out: str | os.PathLike, *, remote: RemoteOptions | None = None
               ) -> PackReport:
    """The last step of a job array (CLI: ``pack --out DIR --merge``): check every shard of
    the plan in ``d_out`` (present, complete, the planned utterances) and write each folder's
    ``index.jsonl``; the plan file is then deleted (the index replaces it).

    Raises:
        DataError: shards missing or not as planned, each named with the task that writes it;
            nothing is written then.
        FolderLockedError: a task (or a pack) is still writing the folder.
    """
    out_dir = _out_dir(d_out)
    store = _storage(out_dir, remote)
    with _owning(store, "pack --merge"):
        _refuse_if_locked(store, ignore=LOCK_NAME)
        plan, report = ShardPlan.read(store)
        _merge(plan, report, store)
        report.shards_skipped = sum(len(e) for e in plan.entries.values())
        report.bytes_total = sum(e.bytes for f in plan.entries.values() for e in f.values())
        for folder, by_name in plan.entries.items():
            remove_tmp_files(folder, by_name)
        store.remove(store.join(out_dir, PLAN_NAME))
    return report


class _MeasuredInputs(NamedTuple):
    inputs: Inputs
    unit: str
    measured: Measured
    report: PackReport
    sample_rate: int | None


def _arguments(f_scps, f_labels, segments, manifests, d_out, **keywords):
    """The checked inputs, output folder and settings of a pack (the errors of
    :func:`pack_data`'s arguments)."""
    files = input_files(f_scps, f_labels, segments, manifests)
    out_dir = _out_dir(d_out)
    options = _settings(**keywords)
    if files.manifests and options.kind == "feats":
        raise ValueError("manifests name audio files: kind must be 'auto' or 'wav'")
    return files, out_dir, options


def _storage(out_dir: str, remote: RemoteOptions | None) -> Storage:
    if remote is not None and not isinstance(remote, RemoteOptions):
        raise TypeError(f"remote must be a RemoteOptions or None, got {remote!r}")
    return Storage(out_dir, remote)


def _owning(store: Storage, what: str, name: str = LOCK_NAME):
    """The folder's lock (a local one; object storage has none here)."""
    return contextlib.nullcontext() if store.is_url else FolderLock(store.root, what, name)


def _refuse_if_locked(store: Storage, *, ignore: str | None = None) -> None:
    if not store.is_url and os.path.isdir(store.root):
        refuse_if_locked(store.root, ignore=ignore)


def _out_dir(d_out) -> str:
    if not isinstance(d_out, (str, os.PathLike)) or not os.fspath(d_out):
        raise TypeError(f"d_out must be a folder path, got {d_out!r}")
    return os.fspath(d_out)


def _measure_inputs(files, store: Storage, options: PackOptions,
                    pool: concurrent.futures.Executor | None) -> _MeasuredInputs:
    """Read the tables, match keys and measure every utterance: nothing is written (a run
    already writing the output folder, or another pack there, is refused first)."""
    _refuse_if_locked(store)
    others = other_packs(store, options)
    if not options.force:
        refuse_or_clean(others, store, options)  # refuses, before anything is read
    inputs = read_inputs(files.scps, files.labels, files.segments, files.manifests,
                         options.kind, options.allow_commands, options.on_error)
    unit = _length_unit(options.length_unit, inputs.kind)
    items, no_label, no_data = match_keys(inputs, options.on_mismatch)
    items, empty = _empty_labels(items, options.empty_text, inputs)
    report = PackReport(
        store.root, inputs.kind, unit,
        keys_without_label=len(no_label), keys_without_label_examples=no_label[:EXAMPLES],
        labels_without_data=len(no_data), labels_without_data_examples=no_data[:EXAMPLES],
        empty_text=len(empty), empty_text_examples=empty[:EXAMPLES],
        empty_text_policy=options.empty_text,
    )
    measured = _measure(pool, inputs, items, unit, options, report)
    if options.length_unit is None and unit == "samples" and not options.groups and len(
            {rate for _, rate in measured.native if rate is not None}) > 1:
        unit = report.length_unit = "seconds"  # audio at several rates: durations
        measured = measured._replace(lengths=[n / rate for n, rate in measured.native])
    sample_rate = _sample_rates(measured, unit, report, inputs.data_files)
    return _MeasuredInputs(inputs, unit, measured, report, sample_rate)


def _plan(m: _MeasuredInputs, store: Storage, options: PackOptions
          ) -> tuple[ShardPlan, PackReport]:
    """Groups and shards, under the folder's lock: what another pack left is refused (or
    removed with ``force``), stale indexes and wrong shards are removed, temporary files of
    dead runs deleted."""
    report = m.report
    others = other_packs(store, options)
    if not options.force:
        refuse_or_clean(others, store, options)
    by_group = group_by_length(m.measured, options.groups, report)
    report.removed.extend(refuse_or_clean(others, store, options))
    plan = plan_shards(by_group, m.measured, store, m.inputs, m.unit, options, report)
    plan.unit, plan.sample_rate = m.unit, m.sample_rate
    plan.audio_format = None if m.inputs.kind == "feats" else options.audio_format
    rates = {item.key: rate for item, (_, rate) in zip(m.measured.items, m.measured.native)
             if rate is not None}
    for folder, by_name in plan.entries.items():
        # audio: the rates of this folder's utterances, for readers of the index
        plan.rates[folder] = (dict(Counter(rates[k] for e in by_name.values() for k in e.keys))
                              if rates else None)
        remove_tmp_files(folder, by_name)
    return plan, report


def _settings(**keywords: Any) -> PackOptions:
    """The :class:`PackOptions` of the settings passed as keywords, checked (an unknown one is
    a ``TypeError`` naming it)."""
    passed = {name: value for name, value in keywords.items()
              if not isinstance(value, _Default)}
    unknown = sorted(set(passed) - set(PackOptions.__dataclass_fields__))
    if unknown:
        raise TypeError(f"unknown pack setting(s) {', '.join(unknown)}; the settings are "
                        f"{', '.join(PackOptions.__dataclass_fields__)}")
    return PackOptions(**passed)


def _empty_labels(items: list[Item], policy: str, inputs: Inputs
                  ) -> tuple[list[Item], list[str]]:
    """``(items packed, keys with an empty label)`` under ``policy`` (``"keep"`` packs them,
    ``"skip"`` leaves them out; both counted in the report).

    Raises:
        DataError: under ``"error"``, with the count and a few keys.
    """
    empty = [item.key for item in items if not item.text.strip()]
    if empty and policy == "error":
        raise DataError(
            f"{len(empty)} utterance(s) with an empty label (e.g. "
            f"{', '.join(map(repr, empty[:EXAMPLES]))}); fix the labels, or pass "
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


def _measure(executor: concurrent.futures.Executor | None, inputs: Inputs,
             items: list[Item], unit: str, options: PackOptions, report: PackReport
             ) -> Measured:
    """Measure every item, ``utts_per_shard`` per task (in the workers, if any); those that
    cannot be read (``on_error="skip"``) are left out and counted in ``report``."""
    per_task = options.utts_per_shard
    chunks = [items[i:i + per_task] for i in range(0, len(items), per_task)]
    measured: list[list[tuple[int, int | None] | str]] = [[] for _ in chunks]
    with progress_bar(total=len(chunks), desc="pack: measure", unit="chunk",
                      disable=not options.progress) as bar:
        for i, result in run_tasks(executor, measure_chunk_args, [
                (inputs.mode, chunk, options.allow_commands, options.on_error)
                for chunk in chunks], bar):
            measured[i] = result
    results = [n for chunk in measured for n in chunk]
    faults = [(item, n) for item, n in zip(items, results) if isinstance(n, str)]
    if faults:
        report.unreadable = len(faults)
        report.unreadable_examples = _distinct_examples([fault for _, fault in faults])
        if len(faults) == len(items):
            raise DataError(f"nothing to pack: none of the {len(items)} utterance(s) can be "
                            f"read (e.g. {faults[0][1]})",
                            source=", ".join(inputs.data_files))
        items = [item for item, n in zip(items, results) if not isinstance(n, str)]
    native = [n for n in results if not isinstance(n, str)]
    lengths = [n / rate if unit == "seconds" else n for n, rate in native]
    return Measured(items, native, lengths)


def _distinct_examples(faults: list[str]) -> list[str]:
    """Up to :data:`EXAMPLES` faults, one per distinct fault first (every segment of a broken
    recording says the same after its place), then the others in order."""
    seen: set[str] = set()
    first = []
    for fault in faults:
        what = fault.split("): ", 1)[-1]
        if what not in seen:
            seen.add(what)
            first.append(fault)
    rest = [fault for fault in faults if fault not in first]
    return sorted((first + rest)[:EXAMPLES], key=faults.index)


def _sample_rates(measured: Measured, unit: str, report: PackReport,
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
                if rate != common for key in keys[:EXAMPLES]]
        counts = ", ".join(f"{rate} Hz: {len(keys)}" for rate, keys in sorted(by_rate.items()))
        raise DataError(
            f"the audio has {len(by_rate)} sample rates ({counts}; e.g. {', '.join(rare)}): "
            "lengths counted in samples would mean different durations. Pack with "
            "length_unit='seconds' (CLI: --length-unit seconds), or resample the odd files",
            source=", ".join(sources))
    return next(iter(by_rate))


def _write_shards(executor: concurrent.futures.Executor | None, plan: ShardPlan,
                  report: PackReport, progress: bool,
                  numbers: Sequence[int] | None = None) -> dict[str, int]:
    """Run the plan's shard tasks (``numbers``: those of one task of a job array; all by
    default), in the executor if any; count them in ``report``; return each shard's size."""
    numbers = range(len(plan.tasks)) if numbers is None else numbers
    tasks = [plan.tasks[j] for j in numbers]
    sizes = {}
    with progress_bar(total=len(tasks) + report.shards_skipped,
                      initial=report.shards_skipped, desc="pack: write", unit="shard",
                      disable=not progress) as bar:
        for i, (written, size, clipped) in run_tasks(executor, run_shard_task, tasks, bar):
            report.clipped += clipped
            sizes[tasks[i].path] = size
            report.bytes_total += size
            if written:
                report.shards_written += 1
                report.bytes_written += size
            else:
                report.shards_skipped += 1
    return sizes


def _merge(plan: ShardPlan, report: PackReport, store: Storage,
           sizes: Mapping[str, int] | None = None) -> None:
    """Check every shard of the plan against its entry, then write each folder's
    ``index.jsonl`` (last: an index means a complete pack).

    A shard a task wrote must be there, complete (its tar read through: headers, end marker)
    and hold exactly its planned members, and -- when the task's report is at hand
    (``sizes``) -- have the size it reported; a kept shard must have its indexed size.

    Raises:
        DataError: shards missing or not as planned, naming each (and the task of a job array
            that writes it); no index is written then.
    """
    problems = []
    number_of = {t.path: j for j, t in enumerate(plan.tasks)}
    for folder, by_name in plan.entries.items():
        for name, entry in by_name.items():
            path = store.join(folder, name)
            try:
                size = store.size(path)
            except OSError:
                j = number_of.get(path)
                problems.append((path, "missing" if j is None else
                                 f"missing (written by task {j} % N + 1 of a job array of N)"))
                continue
            j = number_of.get(path)
            if j is None:
                if size != entry.bytes:
                    problems.append((path, f"{size} bytes, indexed {entry.bytes}"))
                continue
            if sizes is not None and path in sizes and sizes[path] != size:
                problems.append((path, f"{size} bytes, but its task wrote {sizes[path]}: "
                                       "rewritten by another run?"))
            elif not store.is_url and not shard_is_complete(plan.tasks[j]):
                # (an object in a bucket was uploaded whole, by one PUT, under its final name
                # only: present with the size its task wrote is complete; not read back)
                problems.append((path, "incomplete, or not the planned utterances"))
            else:
                by_name[name] = dataclasses.replace(entry, bytes=size)
    if problems:
        shown = "; ".join(f"{path}: {why}" for path, why in problems[:EXAMPLES])
        raise DataError(
            f"{len(problems)} shard(s) of the plan are not as planned, so no index is written "
            f"({shown}{'; ...' if len(problems) > EXAMPLES else ''}): run the task(s) that "
            "write them again (a rerun skips complete shards), then merge again",
            source=report.out_dir)
    for folder, by_name in plan.entries.items():
        # In shard-number order (the plan's), which is also sorted key order.
        index = ShardIndex(folder, list(by_name.values()), length_unit=plan.unit,
                           audio_format=plan.audio_format, sample_rate=plan.sample_rate,
                           sample_rates=plan.rates.get(folder))
        if store.is_url:  # the same bytes as a local index, in one PUT
            with tempfile.TemporaryDirectory() as tmp:
                with open(index.write(os.path.join(tmp, INDEX_NAME)), "rb") as f:
                    data = f.read()
            store.write_bytes(store.join(folder, INDEX_NAME), data)
            report.index_paths.append(store.join(folder, INDEX_NAME))
        else:
            try:
                report.index_paths.append(index.write())
            except OSError as exc:
                raise OutputError.wrap(exc, os.path.join(index.root, INDEX_NAME)) from exc


def _executor(num_workers: int, executor: Any = None
              ) -> tuple[concurrent.futures.Executor | None, bool]:
    """``(executor to use, whether it is ours to shut down)``: the caller's executor (a Dask
    ``distributed.Client`` through its ``get_executor()``), else a spawn pool of
    ``num_workers`` processes, else none (this process)."""
    if executor is not None:
        if num_workers != 1:
            raise ValueError(f"pass executor= or num_workers={num_workers}, not both")
        return as_executor(executor), False
    if num_workers == 1:
        return None, False
    # spawn: workers start clean (no inherited threads or locks from torch or tqdm). Ctrl-C
    # reaches every process of the terminal's group: the workers leave it to the main
    # process, which stops the run and says how to continue (no traceback per worker).
    return concurrent.futures.ProcessPoolExecutor(
        max_workers=num_workers, mp_context=multiprocessing.get_context("spawn"),
        initializer=leave_interrupts_to_the_main_process), True
