"""What decides a pipeline's batches, as a small comparable record: a loader state's fingerprint.

:func:`fingerprint` walks the pipeline (:func:`~speechpipe.pipes._core._graph.graph_nodes`) and
records, for each stage in graph order, its class name and the values of the attributes that
decide the batches; the loader adds its own (``seed``, ``world_size``, ``num_workers``).
:func:`differences` compares two fingerprints and :func:`describe_differences` says each
difference in a line (stage, field, saved -> current).

Which attributes a stage records: those named by its ``decides_batches`` (a tuple of attribute
names, declared by the stage: :mod:`speechpipe.pipes._core._state`); without one, its public
attributes that hold settings -- numbers, strings, flags, short tuples of them, settings
objects (dataclasses such as a ``PaddedArea`` budget or a ``ShardSplit``), functions (by their
qualified name) -- and not the pipes below it, the ledgers it counts in (``diagnostics``,
``stats``, ``buffers``), nor ``epoch``/``start_step`` (a pass's position, not a setting).
A list of data a source holds (the shard names or manifest paths of an ``IterableWrapper``,
the rows of a sample list, the keys of a ``SequenceWrapper``) is recorded as its count and a
digest of the names or keys, never of what the files contain; nothing is opened or read. A URL
is recorded without its user, password and query (a state holds no credentials), a dataclass
without its ``repr=False`` fields, and how files are read (``read_options``) is not recorded.

>>> from speechpipe import IterableWrapper
>>> import speechpipe
>>> saved = fingerprint(IterableWrapper(["a.tar", "b.tar"]).block_batch(60, seed=0))
>>> now = fingerprint(IterableWrapper(["a.tar"]).block_batch(30, seed=0))
>>> for line in describe_differences(differences(saved, now)):
...     print(line)
0:BlockBatcherIterDataPipe constraint.budget: 60 -> 30
1:IterableWrapperIterDataPipe iterable: ['a.tar', 'b.tar'] -> ['a.tar']
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import hashlib
import math
import os
import urllib.parse
from typing import Any, Iterable, Mapping

from ._base import IterDataPipe, MapDataPipe
from ._graph import graph_nodes

__all__ = [
    "Difference",
    "FINGERPRINT_VERSION",
    "allows_change",
    "check_allow_changes",
    "describe_differences",
    "differences",
    "fingerprint",
    "refusal",
    "stage_fields",
]

FINGERPRINT_VERSION = 1

#: ``(stage, field, saved, current)``: the stage is ``"<place>:<class>"`` (``"loader"`` for the
#: loader's own settings, ``"pipeline"`` for the list of stages).
Difference = tuple[str, str, Any, Any]

#: Attributes never recorded by the derived default: a pass's position and the ledgers.
_NOT_SETTINGS = frozenset({"epoch", "start_step", "diagnostics", "stats", "buffers",
                           "passthrough", "read_options"})
#: Containers up to this length are settings (recorded item by item); longer ones are data
#: (recorded as a count and a digest).
_SHORT = 8


def _digest(names: Iterable[str]) -> str:
    joined = "\0".join(names) + "\0"  # one encode and one update: a million names in ~0.1 s
    return hashlib.sha256(joined.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def _data_summary(value: Any) -> dict | None:
    """A data container as ``{"items": n, "digest": ...}``: the digest covers the names
    (strings), the sample keys (dicts with a string ``key``) or a mapping's keys."""
    if isinstance(value, Mapping):
        keys = list(value.keys())
        if all(isinstance(k, str) for k in keys):
            return {"items": len(keys), "digest": _digest(keys)}
        return {"items": len(keys)}
    if not isinstance(value, (list, tuple)):
        return None
    kinds = set(map(type, value))
    if kinds == {str}:
        return {"items": len(value), "digest": _digest(_paths(value))}
    if kinds == {dict}:  # sample rows: their keys
        keys = [v.get("key") for v in value]
        if set(map(type, keys)) == {str}:
            return {"items": len(value), "digest": _digest(keys)}  # type: ignore[arg-type]
    return {"items": len(value)}


def _name(text: str) -> str:
    """A URL without what is not its name: user and password, query (a presigned URL's
    signature) and fragment are left out, so that a state never holds credentials and a
    re-signed URL names the same file."""
    if "://" not in text:
        return text
    try:
        parts = urllib.parse.urlsplit(text)
        host = parts.hostname or ""
        if parts.port is not None:
            host = f"{host}:{parts.port}"
    except ValueError:  # not a URL after all
        return text
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, "", ""))


def _paths(names: Any) -> list[str]:
    """Strings as :func:`_name` gives them, and a list of local paths (each with a ``/``, none
    a URL) made absolute, so that ``out/a.tar`` and ``/home/me/out/a.tar`` from the same folder
    match."""
    names = [_name(n) for n in names]
    if all(os.sep in n or "/" in n for n in names) and not any("://" in n or n.startswith(
            "pipe:") for n in names):
        return [os.path.abspath(n) for n in names]
    return names


#: What :func:`_value` returns for a value that is not a setting.
_SKIP = object()


def _value(value: Any, depth: int = 0) -> Any:
    """``value`` as a small, comparable, JSON-friendly record, or ``_SKIP`` (not a setting)."""
    if isinstance(value, str):
        return _name(value)
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    if isinstance(value, (IterDataPipe, MapDataPipe)) or depth > 3:
        return _SKIP
    if callable(getattr(value, "to_dict", None)) and callable(getattr(value, "merge", None)):
        return _SKIP  # a ledger (counts), not a setting
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict = {"type": type(value).__name__}
        for field in dataclasses.fields(value):
            if field.repr and not field.name.startswith("_"):  # repr=False: e.g. credentials
                described = _value(getattr(value, field.name), depth + 1)
                if described is not _SKIP:
                    out[field.name] = described
        return out
    if isinstance(value, (list, tuple, dict)):
        if len(value) > _SHORT:
            return _data_summary(value)
        if isinstance(value, (list, tuple)) and value and all(isinstance(v, str) for v in value):
            return _paths(value)
        if isinstance(value, dict):
            items = {str(k): _value(v, depth + 1) for k, v in value.items()}
            return items if _SKIP not in items.values() else _data_summary(value)
        listed = [_value(v, depth + 1) for v in value]
        return listed if _SKIP not in listed else _data_summary(value)
    if callable(value) and hasattr(value, "__qualname__"):  # functions, classes
        return value.__qualname__  # not the module: a script's is __main__ in one run only
    if type(value).__repr__ is not object.__repr__:
        text = repr(value)
        if " at 0x" not in text:  # a repr with an address differs in every process
            return text if len(text) <= 200 else {"items": 1, "digest": _digest([text])}
    return _SKIP


def stage_fields(node: Any) -> dict[str, Any]:
    """The values of the attributes of ``node`` that decide the batches (module documentation):
    its ``decides_batches``, else the derived default."""
    declared = getattr(type(node), "decides_batches", None)
    if declared is not None:
        names = list(declared)
    else:
        names = [name for name in vars(node)
                 if not name.startswith("_") and name not in _NOT_SETTINGS]
    out = {}
    for name in names:
        described = _value(getattr(node, name, None))
        if described is not _SKIP:
            out[name] = described
        elif declared is not None:  # declared but not recordable: its type at least
            out[name] = type(getattr(node, name, None)).__name__
    return out


def fingerprint(pipe: Any, **loader: Any) -> dict:
    """What decides the batches of ``pipe``: each stage (``"<place>:<class>"`` in graph order)
    with :func:`stage_fields`, and the loader's own settings (``loader``, e.g. ``seed``,
    ``world_size``, ``num_workers``). Reads attributes only (nothing is opened)."""
    stages = [[f"{i}:{type(node).__name__}", stage_fields(node)]
              for i, node in enumerate(graph_nodes(pipe))]
    settings = {k: _value(v) for k, v in loader.items()}
    return {"version": FINGERPRINT_VERSION,
            "loader": {k: v for k, v in settings.items() if v is not _SKIP}, "stages": stages}


def _flatten(record: Any, prefix: str = "") -> dict[str, Any]:
    """``{"constraint": {"budget": 60}}`` as ``{"constraint.budget": 60}`` (a data summary and
    a list stay whole: they are compared as one value)."""
    if isinstance(record, dict) and "digest" not in record and "items" not in record:
        out: dict[str, Any] = {}
        for key, value in record.items():
            out.update(_flatten(value, f"{prefix}{key}."))
        if out or not prefix:
            return out
    return {prefix[:-1]: record}


def _fields_differ(stage: str, saved: Mapping, current: Mapping) -> list[Difference]:
    a, b = _flatten(dict(saved)), _flatten(dict(current))
    return [(stage, name, a.get(name), b.get(name)) for name in sorted(set(a) | set(b))
            if _canonical(a.get(name)) != _canonical(b.get(name))]


def _canonical(value: Any) -> Any:
    """Lists and tuples compare alike (a state may come back with lists for tuples)."""
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if isinstance(value, dict):
        return {k: _canonical(v) for k, v in value.items()}
    return value


def differences(saved: Mapping, current: Mapping) -> list[Difference]:
    """Each difference between two fingerprints: the loader's settings, then the stages --
    stages present in one only (``"pipeline"``, with the class), then the fields of the stages
    both have (matched by class, in graph order)."""
    out = _fields_differ("loader", saved.get("loader", {}), current.get("loader", {}))
    a = [(str(name), fields) for name, fields in saved.get("stages", [])]
    b = [(str(name), fields) for name, fields in current.get("stages", [])]
    classes_a = [name.split(":", 1)[-1] for name, _ in a]
    classes_b = [name.split(":", 1)[-1] for name, _ in b]
    matcher = difflib.SequenceMatcher(a=classes_a, b=classes_b, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            for (name, fa), (_, fb) in zip(a[i1:i2], b[j1:j2]):
                out.extend(_fields_differ(name, fa, fb))
            continue
        for name, _ in a[i1:i2]:
            out.append(("pipeline", "stages", name, None))
        for name, _ in b[j1:j2]:
            out.append(("pipeline", "stages", None, name))
    return out


def _show(value: Any) -> str:
    if isinstance(value, dict) and "items" in value:
        digest = f" (digest {value['digest'][:8]})" if "digest" in value else ""
        return f"{value['items']} items{digest}"
    if value is None:
        return "(none)"
    return repr(value) if not isinstance(value, (int, float)) else str(value)


def describe_differences(found: Iterable[Difference]) -> list[str]:
    """One line per difference: ``stage field: saved -> current`` (a stage present in one
    fingerprint only: ``pipeline: stage X only in the saved state`` or ``... only here``)."""
    lines = []
    for stage, field, saved, current in found:
        if stage == "pipeline":
            lines.append(f"pipeline: stage {saved} only in the saved state" if current is None
                         else f"pipeline: stage {current} only in this loader")
        elif _names(saved) and _names(current) and max(len(saved), len(current)) > 3:
            gone = [n for n in saved if n not in set(current)]
            new = [n for n in current if n not in set(saved)]
            what = "; ".join(part for part in (
                f"only saved: {_few(gone)}" if gone else "",
                f"only here: {_few(new)}" if new else "") if part) or "another order"
            lines.append(f"{stage} {field}: {len(saved)} items -> {len(current)} items ({what})")
        else:
            lines.append(f"{stage} {field}: {_show(saved)} -> {_show(current)}")
    return lines


def _names(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)


def _few(names: list) -> str:
    shown = ", ".join(repr(n) for n in names[:3])
    return shown + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def check_allow_changes(names: Any) -> frozenset:
    if isinstance(names, str) or not all(isinstance(n, str) for n in names):
        raise TypeError(f"allow_changes must be a tuple of field names, e.g. ('budget',), "
                        f"got {names!r}")
    return frozenset(names)


def allows_change(allowed: frozenset, difference: tuple) -> bool:
    """Whether a name in ``allowed`` accepts ``difference``: its field (``constraint.budget``),
    the field's first or last part (``constraint``, ``budget``)."""
    field = difference[1]
    parts = field.split(".")
    return field in allowed or parts[0] in allowed or parts[-1] in allowed


#: What a refusal of another topology adds: the road whose states move between topologies.
_TOPOLOGY_WAY_OUT = (
    "\nThis pipeline batches in each process (shuffle_samples / sharded_shuffle -> "
    "bucket_by_length -> block_batch), so its batches and states belong to one number of "
    "ranks and workers. To move a job between topologies, plan its batches over virtual "
    "streams: train_pipeline(..., streams=8) (or a recipe builder's streams=), or "
    "plan_batches(...) for a pipeline of your own; a state saved on that road resumes any "
    "world size and number of workers (docs/resume.md, 'Resuming on another topology').")


def refusal(refused: list) -> str:
    names = sorted({d[1].split(".")[-1] for d in refused})
    lines = "\n".join(f"  - {line}" for line in describe_differences(refused))
    topology = any(d[0] == "loader" and d[1] in ("num_workers", "world_size") for d in refused)
    return (f"this state belongs to another loader: {len(refused)} "
            f"difference{'s' if len(refused) != 1 else ''} in what decides the batches "
            f"(saved -> current):\n{lines}\nResume it with the pipeline and loader it was "
            "saved with, or accept the changes from the next epoch on: "
            f"loader.load_state_dict(state, allow_changes={tuple(names)!r})"
            + (_TOPOLOGY_WAY_OUT if topology else ""))
