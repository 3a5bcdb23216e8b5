"""Planning a pack: which utterances go to which length group, folder and shard, and which
shards of an earlier run are kept; the plan as a file (``pack_plan.jsonl`` in the output
folder) that tasks on other machines read, and the split of its shards into tasks."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ..compact import MAPPED_SUFFIX
from ..errors import DataError, MissingDataError
from ..index import INDEX_NAME, ShardEntry, ShardIndex
from ..pipes.kaldi import ScpEntry
from ..remote import RemoteOptions
from .inputs import Inputs, Item
from .lengths import LengthGroup
from .options import PackOptions
from .report import EXAMPLES, PackReport
from .storage import Storage
from .write import is_tmp_of, ShardTask

__all__: list[str] = []

PLAN_NAME = "pack_plan.jsonl"
_PLAN_FORMAT = "speechpipe-pack-plan"
_PLAN_VERSION = 1


class Measured(NamedTuple):
    """The utterances to pack, in sorted key order, with their lengths."""

    items: list[Item]
    native: list[tuple[int, int | None]]  # (frames or samples, sample rate or None)
    lengths: list[int | float]  # in the pack's length unit: what the index records


@dataclass
class ShardPlan:
    """Every shard of a pack: its index entry, and a task for each shard to (re)write; with
    what the merge needs to write each folder's index (unit, audio format, sample rates)."""

    entries: dict[str, dict[str, ShardEntry]] = field(default_factory=dict)  # folder: name:
    tasks: list[ShardTask] = field(default_factory=list)
    folders: list[str] = field(default_factory=list)  # the folder of each task
    unit: str = "frames"
    audio_format: str | None = None
    sample_rate: int | None = None
    rates: dict[str, dict[int, int] | None] = field(default_factory=dict)  # folder: {Hz: n}

    def task_numbers(self, tasks: int) -> list[int]:
        """The task (1 to ``tasks``) writing each shard task of the plan: round robin in plan
        order, so that every task gets shards of every length group."""
        return [j % tasks + 1 for j in range(len(self.tasks))]

    # -- the plan as a file: deterministic bytes (the same inputs give the same file)

    def write(self, store: Storage, report: PackReport) -> str:
        """Write ``pack_plan.jsonl`` into the output folder (atomically) and return its path:
        a header, then one line per shard in plan order (folders and paths relative to the
        output folder, so that tasks may see it at another mount point)."""
        rel = store.relative
        header = {"format": _PLAN_FORMAT, "version": _PLAN_VERSION, "length_unit": self.unit,
                  "audio_format": self.audio_format, "sample_rate": self.sample_rate,
                  "folders": [[rel(f), None if self.rates.get(f) is None else
                               {str(hz): n for hz, n in sorted(self.rates[f].items())}]
                              for f in self.entries],
                  "report": _report_fields(report)}
        task_of = {(self.folders[j], store.split(t.path)[1]): t
                   for j, t in enumerate(self.tasks)}
        path = store.join(store.root, PLAN_NAME)
        lines = [json.dumps(header, sort_keys=True, ensure_ascii=False)]
        for folder, by_name in self.entries.items():
            for name, entry in by_name.items():
                task = task_of.get((folder, name))
                row: dict[str, Any] = {
                    "folder": rel(folder), "name": name, "keys": list(entry.keys),
                    "lengths": list(entry.lengths),
                    "bytes": entry.bytes if task is None else None}
                if task is not None:
                    row["task"] = _task_fields(task)
                lines.append(json.dumps(row, sort_keys=True, ensure_ascii=False))
        store.write_bytes(path, ("\n".join(lines) + "\n").encode("utf-8"))
        return path

    @classmethod
    def read(cls, store: Storage) -> tuple["ShardPlan", PackReport]:
        """The plan ``--plan-only`` wrote into the output folder and the report of the
        planning.

        Raises:
            MissingDataError: no plan in the folder.
            DataError: a malformed plan file (naming the line).
        """
        out_dir = store.root
        path = store.join(out_dir, PLAN_NAME)
        try:
            lines = store.read_bytes(path).decode("utf-8").splitlines()
        except FileNotFoundError:
            raise MissingDataError(
                "no pack plan here: write one with 'speechpipe pack ... --plan-only' (or "
                "plan_pack()) first; after a merge the plan is gone, the index is there",
                source=path) from None
        try:
            header = json.loads(lines[0]) if lines else None
            if not isinstance(header, dict) or header.get("format") != _PLAN_FORMAT \
                    or header.get("version") != _PLAN_VERSION:
                raise DataError("not a speechpipe pack plan (or of another version)",
                                source=path, line=1)
            plan = cls(unit=header["length_unit"], audio_format=header["audio_format"],
                       sample_rate=header["sample_rate"])
            for folder, rates in header["folders"]:
                full = _full(store, folder)
                plan.entries[full] = {}
                plan.rates[full] = (None if rates is None
                                    else {int(hz): n for hz, n in rates.items()})
            report = _plan_report(header["report"], out_dir)
            for number, line in enumerate(lines[1:], start=2):
                row = json.loads(line)
                folder = _full(store, row["folder"])
                entry = ShardEntry(row["name"], len(row["keys"]), row["bytes"] or 0,
                                   tuple(row["keys"]), tuple(row["lengths"]))
                plan.entries[folder][row["name"]] = entry
                if "task" in row:
                    plan.tasks.append(_task_from(row["task"], store.join(folder, row["name"]),
                                                 store.remote))
                    plan.folders.append(folder)
        except DataError:
            raise
        except (UnicodeDecodeError, ValueError, KeyError, TypeError, IndexError) as exc:
            raise DataError(f"malformed pack plan ({type(exc).__name__}: {exc}); plan again "
                            "with --plan-only", source=path,
                            line=locals().get("number", 1)) from None
        return plan, report


def _full(store: Storage, folder: str) -> str:
    """The folder of the plan's relative name ``folder``."""
    if folder == ".":
        return store.root
    return store.join(store.root, folder) if store.is_url else os.path.normpath(
        os.path.join(store.root, folder))


_REPORT_FIELDS = ("kind", "length_unit", "groups", "out_of_range", "out_of_range_examples",
                  "keys_without_label", "keys_without_label_examples", "labels_without_data",
                  "labels_without_data_examples", "sample_rates", "empty_text",
                  "empty_text_examples", "empty_text_policy", "unreadable",
                  "unreadable_examples")


def _report_fields(report: PackReport) -> dict[str, Any]:
    fields = {name: getattr(report, name) for name in _REPORT_FIELDS}
    fields["sample_rates"] = {str(hz): n for hz, n in fields["sample_rates"].items()}
    return fields


def _plan_report(fields: dict[str, Any], out_dir: str) -> PackReport:
    fields = dict(fields)
    fields["sample_rates"] = {int(hz): n for hz, n in fields["sample_rates"].items()}
    return PackReport(out_dir=out_dir, **fields)


def _item_fields(item: Item) -> list:
    reco = item.recording
    return [item.key, item.value, item.source, item.line, item.text,
            None if reco is None else [reco.key, reco.value, reco.source, reco.line],
            item.offset, item.duration, item.meta]


def _task_fields(task: ShardTask) -> dict[str, Any]:
    return {"mode": task.mode, "items": [_item_fields(i) for i in task.items],
            "native": list(task.lengths), "audio_format": task.audio_format,
            "allow_commands": task.allow_commands}


def _task_from(row: dict[str, Any], path: str, remote: RemoteOptions | None) -> ShardTask:
    items = tuple(Item(key, value, source, line, text,
                        None if reco is None else ScpEntry(*reco), offset, duration, meta)
                  for key, value, source, line, text, reco, offset, duration, meta
                  in row["items"])
    return ShardTask(path, row["mode"], items, tuple(row["native"]), True,
                      row["audio_format"], row["allow_commands"], remote)


def other_packs(store: Storage, options: PackOptions) -> list[str]:
    """The folders of the output folder holding shards or an index that this pack will not
    write: group folders of an earlier pack with other groups, the top folder's shards when
    packing into groups (or group folders when not). Read with this pack (a glob, the
    folder), they would give utterances twice."""
    out_dir = store.root
    names = store.listdir(out_dir)
    if not names:
        return []
    planned = ({store.join(out_dir, g.name) for g in options.groups} if options.groups
               else {out_dir})
    found = []
    if out_dir not in planned and any(_packed_file(n, options) for n in names):
        found.append(out_dir)
    for name in sorted(names):
        folder = store.join(out_dir, name)
        if folder in planned or _packed_file(name, options):
            continue
        inside = store.listdir(folder) if store.is_url or os.path.isdir(folder) else []
        if any(_packed_file(n, options) for n in inside):
            found.append(folder)
    return found


def _packed_file(name: str, options: PackOptions) -> bool:
    """Whether ``name`` is a file a pack writes: a shard, a shard being written, an index."""
    if name in (INDEX_NAME, f"{INDEX_NAME}.tmp", INDEX_NAME + MAPPED_SUFFIX):
        return True
    return bool(options.shard_name_re.fullmatch(name.removesuffix(".tmp"))
                or is_tmp_of(name, options.shard_name_re))


def refuse_or_clean(folders: list[str], store: Storage, options: PackOptions) -> list[str]:
    """Without ``force``, refuse to pack beside other packs' shards (``folders``, from
    :func:`other_packs`), naming them; with it, delete their shards and indexes (and the
    folders, when nothing else is left in them). Returns the files deleted."""
    if not folders:
        return []
    out_dir = store.root
    if not options.force:
        named = ", ".join(f"{store.relative(f)}/" for f in folders[:EXAMPLES])
        raise ValueError(
            f"{out_dir} holds shards of another pack that this one would not replace "
            f"({named}): read together (a glob, or the folder) they would mix old and new "
            "groups; pack into an empty folder, or pass --force (force=True) to delete them")
    removed = []
    for folder in folders:
        for name in sorted(store.listdir(folder)):
            path = store.join(folder, name)
            if _packed_file(name, options) and store.isfile(path):
                store.remove(path)
                removed.append(path)
        if folder != out_dir:
            store.rmdir_if_empty(folder)
    return removed


def group_by_length(measured: Measured, groups: list[LengthGroup],
                     report: PackReport) -> dict[str, list[int]]:
    """Indices of the utterances per group name (``"."`` without groups), in key order; those
    outside every group are counted in ``report``."""
    plan: dict[str, list[int]] = {g.name: [] for g in groups} if groups else {".": []}
    out_of_range: list[str] = []
    for i, length in enumerate(measured.lengths):
        if not groups:
            plan["."].append(i)
            continue
        group = next((g for g in groups if g.holds(length)), None)
        if group is None:
            if len(out_of_range) < EXAMPLES:
                out_of_range.append(f"{measured.items[i].key} (length {length:g})")
            report.out_of_range += 1
        else:
            plan[group.name].append(i)
    report.out_of_range_examples = out_of_range
    return plan


def plan_shards(by_group: dict[str, list[int]], measured: Measured, store: Storage,
                 inputs: Inputs, unit: str, options: PackOptions,
                 report: PackReport) -> ShardPlan:
    """Plan the shards of every group's folder (created) and remove the index of each folder
    where a shard will change."""
    plan = ShardPlan()
    store.makedirs(store.root)
    for name, indices in by_group.items():
        folder = store.root if name == "." else store.join(store.root, name)
        store.makedirs(folder)
        report.groups[name] = len(indices)
        _plan_folder(plan, folder, indices, measured, inputs, unit, options, report, store)
    # An index means a complete pack: remove stale ones before any shard changes.
    for folder in sorted(set(plan.folders)):
        for name in (INDEX_NAME, INDEX_NAME + MAPPED_SUFFIX):  # the index and its table
            if store.isfile(store.join(folder, name)):
                store.remove(store.join(folder, name))
    return plan


def _plan_folder(plan: ShardPlan, folder: str, indices: list[int], measured: Measured,
                 inputs: Inputs, unit: str, options: PackOptions, report: PackReport,
                 store: Storage) -> None:
    """Add the shards of one folder to ``plan``: ``utts_per_shard`` consecutive utterances
    each, kept when its old index entry shows it complete, else a task; files named like
    shards that are not in the plan are reported as stale."""
    old = _old_index(store, folder, unit,
                     None if inputs.kind == "feats" else options.audio_format)
    keep_complete = old is not None
    old = old or {}
    plan.entries[folder] = {}
    planned_names = set()
    present = set(store.listdir(folder))
    per_shard = options.utts_per_shard
    for number, start in enumerate(range(0, len(indices), per_shard)):
        chosen = indices[start:start + per_shard]
        shard = options.fmt % number
        planned_names.add(shard)
        entry = ShardEntry(shard, len(chosen), 0, tuple(measured.items[i].key for i in chosen),
                           tuple(measured.lengths[i] for i in chosen))
        path = store.join(folder, shard)
        previous = old.get(shard)
        if shard in present and _indexed_and_complete(previous, entry, path, store):
            plan.entries[folder][shard] = dataclasses.replace(entry, bytes=previous.bytes)
            report.shards_skipped += 1
            report.bytes_total += previous.bytes
            continue
        plan.entries[folder][shard] = entry
        if not (keep_complete and previous is None) and shard in present:
            # Known to be another pack's or incomplete: gone before any task runs, so that a
            # shard found under this name later was written for this plan (and kept).
            store.remove(path)
        plan.tasks.append(ShardTask(path, inputs.mode, tuple(measured.items[i] for i in chosen),
                                     tuple(measured.native[i][0] for i in chosen),
                                     True, options.audio_format, options.allow_commands,
                                     store.remote))
        plan.folders.append(folder)
    stale = [store.join(folder, f) for f in sorted(present)
             if options.shard_name_re.fullmatch(f) and f not in planned_names]
    if options.force:  # not part of this pack: deleted, so that a glob cannot mix them in
        for path in stale:
            store.remove(path)
        report.removed.extend(stale)
    else:
        report.stale_shards.extend(stale)


def _indexed_and_complete(previous: ShardEntry | None, entry: ShardEntry, path: str,
                          store: Storage) -> bool:
    """Whether the shard at ``path``, indexed as ``previous`` by an earlier run, is the planned
    ``entry``: the same keys and lengths, and the indexed size (one ``stat``)."""
    if previous is None or previous.keys != entry.keys \
            or previous.lengths != tuple(float(n) for n in entry.lengths):
        return False
    try:
        return previous.bytes == store.size(path)
    except FileNotFoundError:
        return False


def _old_index(store: Storage, folder: str, unit: str,
               audio_format: str | None) -> dict[str, ShardEntry] | None:
    """Entries of an existing index in ``folder`` (empty if absent or unreadable: it is then
    simply not used to recognise complete shards); ``None`` if it was written with another
    length unit or audio format (then no shard of the folder is kept)."""
    path = store.join(folder, INDEX_NAME)
    if not store.isfile(path):
        return {}
    try:
        index = ShardIndex.read(path, remote=store.remote)
    except (DataError, MissingDataError):
        return {}
    if index.length_unit != unit or index.audio_format != audio_format:
        return None
    return {entry.name: entry for entry in index.shards}
