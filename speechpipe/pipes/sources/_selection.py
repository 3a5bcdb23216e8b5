"""The rows of a manifest's mapped table within a duration range, computed once and mapped.

``filter_by_duration`` over ``read_manifest_files`` keeps the rows whose duration is within
``[low, high]``. Comparing every row's duration costs about 20 ns a row: 0.1-0.3 s at 15
million rows, in every DataLoader worker and at the start of every pass (issue 28). Here the
result -- the kept rows' positions and the drops counted per bound, with the first few dropped
rows for the filter's examples -- is written once beside the manifest's row table, keyed by the
range and checked against the manifest's size and modification time as the table is, and then
memory-mapped: every worker and every pass of the node shares one copy, and starting a pass
costs a file open whatever the corpus's size.

Where the manifest's folder cannot be written the selection goes to the node's cache folder
(:mod:`speechpipe.node_cache`, as the tables of such manifests and of shard indexes do; named
by the manifest's path and the range, versioned by its size and modification time, older
versions removed, checked by its CRC-32s); where that cannot be used either, the process
holds it in memory.
"""

from __future__ import annotations

import os
from typing import Callable, NamedTuple

import numpy as np

from ...compact import index_dtype, MAPPED_SUFFIX, ManifestTable
from ...node_cache import (
    drop_other_versions, index_cache_dir, read_mapped, sums_match, versioned_path, write_mapped,
)
from ...errors import DataError, MissingDataError

__all__ = ["DurationSelection", "compute_selection", "duration_selection", "selection_path",
           "within"]

_FORMAT = "speechpipe-duration-selection"
_VERSION = 1
#: Dropped rows kept per bound for the filter's examples (``Diagnostics`` shows 3 by default).
EXAMPLES = 16
#: Rows whose durations are compared at a time (the temporaries stay small).
CHUNK = 1 << 20


class DurationSelection(NamedTuple):
    """The rows of one table within a range: ``kept`` (sorted positions, mapped where it was
    written), ``dropped`` (``{"low": count, "high": count}``) and ``examples`` (the first
    positions dropped by each bound, up to :data:`EXAMPLES`)."""

    kept: np.ndarray
    dropped: dict
    examples: dict


def _bound(value: float | None) -> str:
    return "none" if value is None else repr(float(value))


def selection_path(table: ManifestTable, low: float | None, high: float | None) -> str:
    """Where the selection of ``table``'s rows within ``[low, high]`` is kept: beside the
    manifest (``m.jsonl.gz.within-1.0-15.0.spmap``).

    >>> class T: path = "/data/m.jsonl.gz"
    >>> selection_path(T, 1, None)
    '/data/m.jsonl.gz.within-1.0-none.spmap'
    """
    return f"{table.path}.within-{_bound(low)}-{_bound(high)}{MAPPED_SUFFIX}"


def _cache_path(table: ManifestTable, low: float | None, high: float | None
                ) -> tuple[str, str, str] | None:
    """``(folder, file, stem)`` of the selection in the node's cache folder, or ``None``."""
    folder = index_cache_dir()
    if folder is None:
        return None
    source = f"{os.path.abspath(table.path)}\0{_bound(low)}\0{_bound(high)}"
    version = {k: table.header[k] for k in ("source_size", "source_mtime_ns")}
    return (folder, *versioned_path(folder, source, version, kind="within"))


def _header(table: ManifestTable, low: float | None, high: float | None) -> dict:
    return {"format": _FORMAT, "version": _VERSION, "low": low, "high": high,
            "rows": len(table), "table_version": table.header.get("version"),
            "source_size": table.header["source_size"],
            "source_mtime_ns": table.header["source_mtime_ns"]}


def _mapped(path: str, header: dict, summed: bool = False) -> DurationSelection | None:
    try:
        found, arrays = read_mapped(path)
    except (MissingDataError, DataError, OSError):
        return None
    if any(found.get(k) != v for k, v in header.items()) \
            or not {"kept", "low_examples", "high_examples"} <= set(arrays) \
            or (summed and not sums_match(path, found, arrays)):
        return None
    dropped = found.get("dropped")
    if not isinstance(dropped, dict) or set(dropped) != {"low", "high"}:
        return None
    return DurationSelection(np.asarray(arrays["kept"]), dropped,
                             {"low": np.asarray(arrays["low_examples"]),
                              "high": np.asarray(arrays["high_examples"])})


def compute_selection(table: ManifestTable, low: float | None, high: float | None,
                      check: Callable[[int], None]) -> DurationSelection:
    """Compare every row's mapped duration with the range (``CHUNK`` rows at a time). A row
    whose duration is NaN (none, or not a number) is given to ``check``, which raises for a
    row without a duration (a JSON NaN is kept, as a pass over the samples keeps it)."""
    durations = table.durations
    dtype = index_dtype(len(table))
    parts = []
    dropped = {"low": 0, "high": 0}
    examples: dict[str, list] = {"low": [], "high": []}
    for start in range(0, durations.size, CHUNK):
        seconds = durations[start:start + CHUNK]
        keep = np.ones(seconds.size, bool)
        for i in np.flatnonzero(np.isnan(seconds)).tolist():
            check(start + i)
        for name, bound, out in (("low", low, np.less), ("high", high, np.greater)):
            if bound is None:
                continue
            lost = np.flatnonzero(out(seconds, bound) & keep)
            keep[lost] = False
            dropped[name] += int(lost.size)
            room = EXAMPLES - len(examples[name])
            examples[name] += (lost[:room] + start).tolist()
        parts.append(np.flatnonzero(keep).astype(dtype) + dtype.type(start))
    kept = np.concatenate(parts) if parts else np.zeros(0, dtype)
    return DurationSelection(kept, dropped, {k: np.array(v, np.int64)
                                             for k, v in examples.items()})


def duration_selection(table: ManifestTable, low: float | None, high: float | None,
                       check: Callable[[int], None]) -> DurationSelection:
    """The rows of ``table`` within ``[low, high]``: mapped from the file a process wrote
    before when it is current, else computed (:func:`compute_selection`) and written for the
    others (beside the manifest, else in the node's cache folder, else held in memory)."""
    header = _header(table, low, high)
    beside = selection_path(table, low, high)
    found = _mapped(beside, header)
    if found is not None:
        return found
    writable = os.access(os.path.dirname(os.path.abspath(beside)), os.W_OK)
    cached = None if writable else _cache_path(table, low, high)
    if cached is not None:
        found = _mapped(cached[1], header, summed=True)
        if found is not None:
            return found
    selection = compute_selection(table, low, high, check)
    arrays = {"kept": selection.kept, "low_examples": selection.examples["low"],
              "high_examples": selection.examples["high"]}
    place = beside if cached is None else cached[1]
    try:
        write_mapped(place, {**header, "dropped": selection.dropped}, arrays,
                     mode_of=table.path, sums=cached is not None)
    except OSError:
        return selection
    if cached is not None:
        drop_other_versions(cached[0], cached[2], place)
    return _mapped(place, header, summed=cached is not None) or selection


def within(rows, low: float | None, high: float | None, check: Callable) -> tuple:
    """``(kept, dropped, examples)`` over the files of ``rows`` (a
    :class:`~speechpipe.pipes.sources.ManifestRows`, its ``kept`` ignored): the positions
    whose duration is within ``[low, high]``, sorted (the mapped array itself for one file);
    the rows dropped by each bound (``{"low": n, "high": n}``); the first positions each
    dropped, with their durations (``{"low": [(position, seconds), ...], ...}``).
    ``check(sample)`` gets each row whose duration is NaN and raises for one without."""
    parts, dropped, examples = [], {"low": 0, "high": 0}, {"low": [], "high": []}
    dtype = index_dtype(rows.total)
    for base, table in rows.chunks():
        got = duration_selection(table, low, high, lambda i, b=base: check(rows.parse_row(b + i)))
        parts.append(got.kept if len(rows.tables) == 1
                     else got.kept.astype(dtype) + dtype.type(base))
        for name in dropped:
            dropped[name] += int(got.dropped[name])
            examples[name] += [(base + i, float(table.durations[i]))
                               for i in got.examples[name].tolist()]
    if len(parts) == 1:
        return parts[0], dropped, examples
    return (np.concatenate(parts) if parts else np.zeros(0, dtype)), dropped, examples
