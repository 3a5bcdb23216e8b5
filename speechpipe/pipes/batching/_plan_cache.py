"""An epoch's plan computed once per node: ``plan_batches``' plans in the node's cache folder.

``plan_batches`` plans each epoch's whole global batch sequence (a :class:`~speechpipe.pipes.
batching.StreamPlan`) in every process that needs it: the main process (``len(loader)``,
``StepPlanner``) and every DataLoader worker of every rank -- the same arrays, 3.8 s at 15
million utterances each (issue 29). Here the first process of a node that needs an epoch's
plan writes it into the node's cache folder (:mod:`speechpipe.node_cache`: ``plan_cache=``,
else ``$SPEECHPIPE_CACHE_DIR``, ``$XDG_CACHE_HOME/speechpipe``, ``<tmp>/speechpipe-<uid>``),
under an ``flock`` so that the processes that start at once wait for it, and every other
process maps it read-only: its pages are shared by the node.

**The key.** A plan file is named by a digest of everything that decides the plan
(:func:`plan_key`): the planner's class, seed, ``V``, the budget (its class and fields), the
buffers, bucket boundaries, shuffle window and ``oversize``, and a digest of the data planned
(the road's ``plan_key()``: the kept rows' durations; the shard names, counts and every
length of the index), a digest of the code that plans (the source files of the batching and
ordering stages, the index and seeding modules, and the planner's own module: a plan made by
another speechpipe is never taken), then the epoch. The whole key is kept in the file's
header and compared on reading, with the arrays' shapes and their CRC-32s (checked once per
process): a file cut short, corrupt or of another key is planned again and replaced, never
read wrong. ``uneven`` decides which positions a rank takes, not the plan: it is not in the
key.

**What is kept.** When a process writes epoch ``e``'s plan of a key, the key's plans of
other epochs than ``e`` and ``e - 1`` are removed (a process still reading ``e - 1`` keeps
its pages anyway), and any plan file or lock of another key not written for
:data:`PLAN_DAYS` days: at most two epochs per key in use -- at 15 million utterances about
70 MB each. A budget whose lengths come from a function of yours (not ``"duration"`` /
``"num_frames"`` / ``sample_duration``) or a road that cannot say what its data are is
planned in each process, as is everything where the folder cannot be written (a warning
says why) or ``plan_cache=False``.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import inspect
import json
import os
import time
import warnings
from typing import Any, Callable, Mapping

import numpy as np

from ...errors import DataError, MissingDataError
from ...node_cache import (
    drop_other_versions, file_lock, index_cache_dir, read_mapped, sums_match, write_mapped,
)
from ...sample import sample_duration
from ._constraints import BatchConstraint, BatchStats

__all__ = ["PLAN_DAYS", "cached_plan", "constraint_key", "plan_key", "rows_key", "shards_key"]

#: Plans (and locks) of any key not written for this many days are removed.
PLAN_DAYS = 7.0
_FORMAT = "speechpipe-stream-plan"
_VERSION = 1
_STATS = ("batches", "samples", "real", "padded", "largest_cost", "over_budget",
          "oversize_emitted", "oversize_dropped")


def constraint_key(constraint: BatchConstraint) -> dict | None:
    """The budget as plain data (its class and fields), or ``None`` where a field is not
    plain (a length function of yours: its name would not say what it measures).

    >>> from speechpipe.pipes.batching import PaddedArea
    >>> constraint_key(PaddedArea(200.0, length="duration"))
    {'type': 'PaddedArea', 'budget': 200.0, 'max_samples': None, 'length': 'duration'}
    >>> constraint_key(PaddedArea(200.0, length=lambda s: 1.0)) is None
    True
    """
    if not dataclasses.is_dataclass(constraint):
        return None
    out: dict[str, Any] = {"type": type(constraint).__qualname__}
    for field in dataclasses.fields(constraint):
        value = getattr(constraint, field.name)
        if value is sample_duration:
            value = "sample_duration"
        elif isinstance(value, (tuple, list)) and all(
                v is None or isinstance(v, (bool, int, float, str)) for v in value):
            value = list(value)
        elif not (value is None or isinstance(value, (bool, int, float, str))):
            return None
        out[field.name] = value
    return out


def rows_key(durations: np.ndarray) -> dict:
    """The data of a manifest road's plans: the kept rows' durations, in order (a digest:
    ~0.1 s per 15 million rows, once per process)."""
    durations = np.ascontiguousarray(durations, np.float64)
    return {"road": "rows", "items": int(durations.size),
            "digest": hashlib.sha1(durations.view(np.uint8), usedforsecurity=False).hexdigest()}


def shards_key(names: list[str], entries: Mapping[str, Any], unit: str, rate: Any) -> dict:
    """The data of a shard road's plans: the shard names in order, each one's count, total
    and lengths (a digest), the index's unit and rate."""
    digest = hashlib.sha1(usedforsecurity=False)
    digest.update("\0".join(names).encode("utf-8", "surrogatepass"))
    chosen = [entries[n] for n in names]
    digest.update(np.array([e.count for e in chosen], np.int64).tobytes())
    digest.update(np.array([e.total_length for e in chosen], np.float64).tobytes())
    for entry in chosen:
        lengths = getattr(entry.lengths, "array", entry.lengths)
        digest.update(np.ascontiguousarray(lengths, np.float64).view(np.uint8))
    return {"road": "shards", "unit": unit, "rate": rate,
            "items": int(sum(e.count for e in chosen)), "digest": digest.hexdigest()}


def plan_key(planner: Any, road: Any, streams: int, constraint: BatchConstraint,
             settings: dict) -> dict | None:
    """What decides the epoch plans of ``planner`` over ``road`` (module documentation), or
    ``None`` where it cannot be said (then each process plans)."""
    data = getattr(road, "plan_key", None)
    budget = constraint_key(constraint)
    if data is None or budget is None:
        return None
    data = data()
    if data is None:
        return None
    return {"planner": f"{type(planner).__module__}.{type(planner).__qualname__}",
            "code": _code_digest(planner), "streams": streams, "budget": budget, **settings,
            "data": data}


#: The code digest of each planner module, once per process.
_CODE: dict[str, str] = {}


def _code_digest(planner: Any) -> str:
    """A digest of the source files that decide a plan (module documentation)."""
    own = inspect.getsourcefile(type(planner)) or ""
    if own not in _CODE:
        here = os.path.dirname(os.path.abspath(__file__))
        base = os.path.dirname(os.path.dirname(here))
        files = sorted({*glob.glob(os.path.join(here, "*.py")),
                        *glob.glob(os.path.join(base, "pipes", "order", "*.py")),
                        *(os.path.join(base, f) for f in ("index.py", "compact.py",
                                                          "seeding.py")), own} - {""})
        digest = hashlib.sha1(np.__version__.encode(), usedforsecurity=False)
        for name in files:
            try:
                with open(name, "rb") as f:
                    digest.update(f.read())
            except OSError:
                digest.update(name.encode())
        _CODE[own] = digest.hexdigest()
    return _CODE[own]


def _stem(key: dict) -> tuple[str, str]:
    text = json.dumps(key, sort_keys=True)
    return "plan-" + hashlib.sha256(text.encode()).hexdigest()[:24], text


def cached_plan(key: dict | None, epoch: int, make: Callable[[], Any], restore: Callable,
                *, cache_dir: str | os.PathLike | None = None) -> Any:
    """Epoch ``epoch``'s plan of ``key``: mapped from the node's cache folder when a whole
    file of that key and epoch is there, else ``make()`` -- once per node: under a lock, the
    result written for the others (a temporary file renamed into place) and mapped back.
    ``restore(epoch, streams, offsets, items, owners, stats)`` makes a plan of mapped arrays.
    ``key=None``, or no usable folder: ``make()`` in this process."""
    folder = None if key is None else index_cache_dir(cache_dir)
    if folder is None:
        return make()
    stem, text = _stem(key)
    place = os.path.join(folder, f"{stem}-e{epoch}.spmap")
    found = _mapped(place, text, epoch, restore)
    if found is not None:
        return found
    with file_lock(os.path.join(folder, stem + ".lock"), create=True):
        found = _mapped(place, text, epoch, restore)
        if found is not None:
            return found
        plan = make()
        stats = plan.stats
        header = {"format": _FORMAT, "version": _VERSION, "key": text, "epoch": epoch,
                  "streams": plan.streams, "stats": {k: getattr(stats, k) for k in _STATS},
                  "stage": stats.stage}
        arrays = {"offsets": plan.offsets, "items": plan.items, "owners": plan.owners,
                  "sizes": np.asarray(stats.sizes, np.int64)}
        try:
            write_mapped(place, header, arrays, sums=True)
        except OSError as exc:
            warnings.warn(f"cannot write {place} ({exc.strerror or exc}): this process keeps "
                          "its own plan", RuntimeWarning, stacklevel=3)
            return plan
        _drop_old(folder, stem, epoch)
    return _mapped(place, text, epoch, restore) or plan


def _mapped(place: str, key: str, epoch: int, restore: Callable) -> Any:
    """The plan in ``place`` if it is whole and of ``key`` and ``epoch``, else ``None``."""
    try:
        header, arrays = read_mapped(place)
    except (MissingDataError, DataError, OSError, ValueError):
        return None
    try:
        if (header.get("format"), header.get("version"), header.get("key"),
                header.get("epoch")) != (_FORMAT, _VERSION, key, epoch):
            return None
        offsets, items, owners, sizes = (np.asarray(arrays[k]) for k in (
            "offsets", "items", "owners", "sizes"))
        stats = BatchStats(str(header["stage"]))
        for name in _STATS:
            setattr(stats, name, header["stats"][name])
        batches, streams = stats.batches, int(header["streams"])
    except (KeyError, TypeError, ValueError):
        return None
    n = len(offsets) - 1
    if (offsets.dtype != np.int64 or owners.dtype != np.int32 or sizes.dtype != np.int64
            or items.dtype not in (np.int32, np.int64) or n < 0 or len(owners) != n
            or len(sizes) != batches or int(offsets[0]) != 0 or int(offsets[-1]) != len(items)
            or not sums_match(place, header, arrays)):
        return None
    stats.sizes = sizes.tolist()
    return restore(epoch, streams, offsets, items, owners, stats)


def _drop_old(folder: str, stem: str, epoch: int) -> None:
    """Remove ``stem``'s plans of epochs other than ``epoch`` and ``epoch - 1``, and every
    plan file or lock of another key not written for :data:`PLAN_DAYS` days."""
    keep = {f"{stem}-e{epoch}.spmap", f"{stem}-e{epoch - 1}.spmap"}
    drop_other_versions(folder, stem, os.path.join(folder, f"{stem}-e{epoch}.spmap"),
                        spare=keep.__contains__)
    old = time.time() - PLAN_DAYS * 86400
    try:
        names = [n for n in os.listdir(folder)
                 if n.startswith("plan-") and not n.startswith(stem)]
    except OSError:
        return
    for name in names:
        path = os.path.join(folder, name)
        try:
            if os.stat(path).st_mtime < old:
                os.remove(path)
        except OSError:
            pass
