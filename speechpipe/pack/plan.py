"""Planning a pack: which utterances go to which length group, folder and shard, and which
shards of an earlier run are kept; the plan as a file (``pack_plan.jsonl`` in the output
folder) that tasks on other machines read, and the split of its shards into tasks."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ..errors import DataError, MissingDataError
from ..index import INDEX_NAME, ShardEntry, ShardIndex
from ..pipes.kaldi import ScpEntry
from .inputs import _Inputs, _Item
from .lengths import LengthGroup
from .options import PackOptions
from .report import _EXAMPLES, PackReport
from .write import _is_tmp_of, _ShardTask

__all__: list[str] = []

PLAN_NAME = "pack_plan.jsonl"
_PLAN_FORMAT = "speechpipe-pack-plan"
_PLAN_VERSION = 1


class _Measured(NamedTuple):
    """The utterances to pack, in sorted key order, with their lengths."""

    items: list[_Item]
    native: list[tuple[int, int | None]]  # (frames or samples, sample rate or None)
    lengths: list[int | float]  # in the pack's length unit: what the index records


@dataclass
class _ShardPlan:
    """Every shard of a pack: its index entry, and a task for each shard to (re)write; with
    what the merge needs to write each folder's index (unit, audio format, sample rates)."""

    entries: dict[str, dict[str, ShardEntry]] = field(default_factory=dict)  # folder: name:
    tasks: list[_ShardTask] = field(default_factory=list)
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

    def write(self, out_dir: str, report: PackReport) -> str:
        """Write ``pack_plan.jsonl`` into ``out_dir`` (atomically) and return its path: a
        header, then one line per shard in plan order (folders and paths relative to
        ``out_dir``, so that tasks may see the folder at another mount point)."""
        rel = _relative(out_dir)
        header = {"format": _PLAN_FORMAT, "version": _PLAN_VERSION, "length_unit": self.unit,
                  "audio_format": self.audio_format, "sample_rate": self.sample_rate,
                  "folders": [[rel(f), None if self.rates.get(f) is None else
                               {str(hz): n for hz, n in sorted(self.rates[f].items())}]
                              for f in self.entries],
                  "report": _report_fields(report)}
        task_of = {(self.folders[j], os.path.basename(t.path)): t
                   for j, t in enumerate(self.tasks)}
        path = os.path.join(out_dir, PLAN_NAME)
        with open(f"{path}.tmp", "w", encoding="utf-8") as f:
            f.write(json.dumps(header, sort_keys=True, ensure_ascii=False) + "\n")
            for folder, by_name in self.entries.items():
                for name, entry in by_name.items():
                    task = task_of.get((folder, name))
                    row: dict[str, Any] = {
                        "folder": rel(folder), "name": name, "keys": list(entry.keys),
                        "lengths": list(entry.lengths),
                        "bytes": entry.bytes if task is None else None}
                    if task is not None:
                        row["task"] = _task_fields(task)
                    f.write(json.dumps(row, sort_keys=True, ensure_ascii=False) + "\n")
        os.replace(f"{path}.tmp", path)
        return path

    @classmethod
    def read(cls, out_dir: str) -> tuple["_ShardPlan", PackReport]:
        """The plan ``--plan-only`` wrote into ``out_dir`` and the report of the planning.

        Raises:
            MissingDataError: no plan in ``out_dir``.
            DataError: a malformed plan file (naming the line).
        """
        path = os.path.join(out_dir, PLAN_NAME)
        try:
            with open(path, encoding="utf-8") as f:
                lines = f.readlines()
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
                full = os.path.normpath(os.path.join(out_dir, folder))
                plan.entries[full] = {}
                plan.rates[full] = (None if rates is None
                                    else {int(hz): n for hz, n in rates.items()})
            report = _plan_report(header["report"], out_dir)
            for number, line in enumerate(lines[1:], start=2):
                row = json.loads(line)
                folder = os.path.normpath(os.path.join(out_dir, row["folder"]))
                entry = ShardEntry(row["name"], len(row["keys"]), row["bytes"] or 0,
                                   tuple(row["keys"]), tuple(row["lengths"]))
                plan.entries[folder][row["name"]] = entry
                if "task" in row:
                    plan.tasks.append(_task_from(row["task"], os.path.join(folder, row["name"])))
                    plan.folders.append(folder)
        except DataError:
            raise
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            raise DataError(f"malformed pack plan ({type(exc).__name__}: {exc}); plan again "
                            "with --plan-only", source=path,
                            line=locals().get("number", 1)) from None
        return plan, report


def _relative(out_dir: str):
    def rel(folder: str) -> str:
        return os.path.relpath(folder, out_dir).replace(os.sep, "/")
    return rel


_REPORT_FIELDS = ("kind", "length_unit", "groups", "out_of_range", "out_of_range_examples",
                  "keys_without_label", "keys_without_label_examples", "labels_without_data",
                  "labels_without_data_examples", "sample_rates", "empty_text",
                  "empty_text_examples", "empty_text_policy")


def _report_fields(report: PackReport) -> dict[str, Any]:
    fields = {name: getattr(report, name) for name in _REPORT_FIELDS}
    fields["sample_rates"] = {str(hz): n for hz, n in fields["sample_rates"].items()}
    return fields


def _plan_report(fields: dict[str, Any], out_dir: str) -> PackReport:
    fields = dict(fields)
    fields["sample_rates"] = {int(hz): n for hz, n in fields["sample_rates"].items()}
    return PackReport(out_dir=out_dir, **fields)


def _item_fields(item: _Item) -> list:
    reco = item.recording
    return [item.key, item.value, item.source, item.line, item.text,
            None if reco is None else [reco.key, reco.value, reco.source, reco.line],
            item.offset, item.duration, item.meta]


def _task_fields(task: _ShardTask) -> dict[str, Any]:
    return {"mode": task.mode, "items": [_item_fields(i) for i in task.items],
            "native": list(task.lengths), "audio_format": task.audio_format,
            "allow_commands": task.allow_commands}


def _task_from(row: dict[str, Any], path: str) -> _ShardTask:
    items = tuple(_Item(key, value, source, line, text,
                        None if reco is None else ScpEntry(*reco), offset, duration, meta)
                  for key, value, source, line, text, reco, offset, duration, meta
                  in row["items"])
    return _ShardTask(path, row["mode"], items, tuple(row["native"]), True,
                      row["audio_format"], row["allow_commands"])


def _other_packs(out_dir: str, options: PackOptions) -> list[str]:
    """The folders of ``out_dir`` holding shards or an index that this pack will not write:
    group folders of an earlier pack with other groups, the top folder's shards when packing
    into groups (or group folders when not). Read with this pack (a glob, the folder), they
    would give utterances twice."""
    if not os.path.isdir(out_dir):
        return []
    planned = ({os.path.join(out_dir, g.name) for g in options.groups} if options.groups
               else {out_dir})
    found = []
    for folder in [out_dir] + sorted(os.path.join(out_dir, f) for f in os.listdir(out_dir)):
        if folder in planned or not os.path.isdir(folder):
            continue
        if any(_packed_file(name, options) for name in os.listdir(folder)):
            found.append(folder)
    return found


def _packed_file(name: str, options: PackOptions) -> bool:
    """Whether ``name`` is a file a pack writes: a shard, a shard being written, an index."""
    if name in (INDEX_NAME, f"{INDEX_NAME}.tmp", PLAN_NAME, f"{PLAN_NAME}.tmp"):
        return True
    return bool(options.shard_name_re.fullmatch(name.removesuffix(".tmp"))
                or _is_tmp_of(name, options.shard_name_re))


def _refuse_or_clean(folders: list[str], out_dir: str, options: PackOptions) -> list[str]:
    """Without ``force``, refuse to pack beside other packs' shards (``folders``, from
    :func:`_other_packs`), naming them; with it, delete their shards and indexes (and the
    folders, when nothing else is left in them). Returns the files deleted."""
    if not folders:
        return []
    if not options.force:
        named = ", ".join(f"{os.path.relpath(f, out_dir)}/" for f in folders[:_EXAMPLES])
        raise ValueError(
            f"{out_dir} holds shards of another pack that this one would not replace "
            f"({named}): read together (a glob, or the folder) they would mix old and new "
            "groups; pack into an empty folder, or pass --force (force=True) to delete them")
    removed = []
    for folder in folders:
        for name in sorted(os.listdir(folder)):
            if _packed_file(name, options) and os.path.isfile(os.path.join(folder, name)):
                os.remove(os.path.join(folder, name))
                removed.append(os.path.join(folder, name))
        if folder != out_dir and not os.listdir(folder):
            os.rmdir(folder)
    return removed


def _group_by_length(measured: _Measured, groups: list[LengthGroup],
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
            if len(out_of_range) < _EXAMPLES:
                out_of_range.append(f"{measured.items[i].key} (length {length:g})")
            report.out_of_range += 1
        else:
            plan[group.name].append(i)
    report.out_of_range_examples = out_of_range
    return plan


def _plan_shards(by_group: dict[str, list[int]], measured: _Measured, out_dir: str,
                 inputs: _Inputs, unit: str, options: PackOptions,
                 report: PackReport) -> _ShardPlan:
    """Plan the shards of every group's folder (created) and remove the index of each folder
    where a shard will change."""
    plan = _ShardPlan()
    os.makedirs(out_dir, exist_ok=True)
    for name, indices in by_group.items():
        folder = out_dir if name == "." else os.path.join(out_dir, name)
        os.makedirs(folder, exist_ok=True)
        report.groups[name] = len(indices)
        _plan_folder(plan, folder, indices, measured, inputs, unit, options, report)
    # An index means a complete pack: remove stale ones before any shard changes.
    for folder in set(plan.folders):
        if os.path.isfile(os.path.join(folder, INDEX_NAME)):
            os.remove(os.path.join(folder, INDEX_NAME))
    return plan


def _plan_folder(plan: _ShardPlan, folder: str, indices: list[int], measured: _Measured,
                 inputs: _Inputs, unit: str, options: PackOptions, report: PackReport) -> None:
    """Add the shards of one folder to ``plan``: ``utts_per_shard`` consecutive utterances
    each, kept when its old index entry shows it complete, else a task; files named like
    shards that are not in the plan are reported as stale."""
    old = _old_index(folder, unit, None if inputs.kind == "feats" else options.audio_format)
    keep_complete = old is not None
    old = old or {}
    plan.entries[folder] = {}
    planned_names = set()
    per_shard = options.utts_per_shard
    for number, start in enumerate(range(0, len(indices), per_shard)):
        chosen = indices[start:start + per_shard]
        shard = options.fmt % number
        planned_names.add(shard)
        entry = ShardEntry(shard, len(chosen), 0, tuple(measured.items[i].key for i in chosen),
                           tuple(measured.lengths[i] for i in chosen))
        path = os.path.join(folder, shard)
        previous = old.get(shard)
        if _indexed_and_complete(previous, entry, path):
            plan.entries[folder][shard] = dataclasses.replace(entry, bytes=previous.bytes)
            report.shards_skipped += 1
            report.bytes_total += previous.bytes
            continue
        plan.entries[folder][shard] = entry
        if not (keep_complete and previous is None) and os.path.isfile(path):
            # Known to be another pack's or incomplete: gone before any task runs, so that a
            # shard found under this name later was written for this plan (and kept).
            os.remove(path)
        plan.tasks.append(_ShardTask(path, inputs.mode, tuple(measured.items[i] for i in chosen),
                                     tuple(measured.native[i][0] for i in chosen),
                                     True, options.audio_format, options.allow_commands))
        plan.folders.append(folder)
    stale = [os.path.join(folder, f) for f in sorted(os.listdir(folder))
             if options.shard_name_re.fullmatch(f) and f not in planned_names]
    if options.force:  # not part of this pack: deleted, so that a glob cannot mix them in
        for path in stale:
            os.remove(path)
        report.removed.extend(stale)
    else:
        report.stale_shards.extend(stale)


def _indexed_and_complete(previous: ShardEntry | None, entry: ShardEntry, path: str) -> bool:
    """Whether the shard at ``path``, indexed as ``previous`` by an earlier run, is the planned
    ``entry``: the same keys and lengths, and the indexed size (one ``stat``)."""
    return (previous is not None and os.path.isfile(path)
            and previous.keys == entry.keys
            and previous.lengths == tuple(float(n) for n in entry.lengths)
            and previous.bytes == os.path.getsize(path))


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
