"""Planning a pack: which utterances go to which length group, folder and shard, and which
shards of an earlier run are kept."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import NamedTuple

from ..errors import DataError, MissingDataError
from ..index import INDEX_NAME, ShardEntry, ShardIndex
from .inputs import _Inputs, _Item
from .lengths import LengthGroup
from .options import PackOptions
from .report import _EXAMPLES, PackReport
from .write import _ShardTask

__all__: list[str] = []


class _Measured(NamedTuple):
    """The utterances to pack, in sorted key order, with their lengths."""

    items: list[_Item]
    native: list[tuple[int, int | None]]  # (frames or samples, sample rate or None)
    lengths: list[int | float]  # in the pack's length unit: what the index records


@dataclass
class _ShardPlan:
    """Every shard of a pack: its index entry, and a task for each shard to (re)write."""

    entries: dict[str, dict[str, ShardEntry]] = field(default_factory=dict)  # folder: name:
    tasks: list[_ShardTask] = field(default_factory=list)
    folders: list[str] = field(default_factory=list)  # the folder of each task


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
    if name in (INDEX_NAME, f"{INDEX_NAME}.tmp"):
        return True
    return bool(options.shard_name_re.fullmatch(name.removesuffix(".tmp")))


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
        plan.tasks.append(_ShardTask(path, inputs.mode, tuple(measured.items[i] for i in chosen),
                                     tuple(measured.native[i][0] for i in chosen),
                                     keep_complete and previous is None, options.audio_format,
                                     options.allow_commands))
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
