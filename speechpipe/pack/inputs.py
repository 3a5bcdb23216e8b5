"""Reading what :func:`~speechpipe.pack.pack_data` packs: Kaldi tables (``feats.scp`` or
``wav.scp``, ``segments``, ``text`` label files) or JSON-lines manifests, with the kind of an scp
table told from its first value; each utterance becomes an ``Item`` (picklable, for workers).

Keys are checked here (unique across all input files, usable as tar member names), so that
nothing is written when the inputs are inconsistent.
"""

from __future__ import annotations

import json
import math
import os
import re
from typing import Any, NamedTuple, Sequence

from ..errors import DataError, MissingDataError, UnsafeInputError
from ..pipes.kaldi import ScpEntry, parse_ark_ref, read_scp_table
from ..pipes.sources import read_manifest
from .report import EXAMPLES
from ..sample import key_member_problem

__all__ = ["KINDS", "MANIFEST_AUDIO_FIELDS", "MANIFEST_FIELDS_NOT_KEPT", "MANIFEST_TEXT_FIELDS"]

#: Values of ``kind=``: what the scp files hold (``"auto"``: look at the first value).
KINDS = ("auto", "feats", "wav")
#: Manifest fields holding the audio path, in the order they are looked for.
MANIFEST_AUDIO_FIELDS = ("audio_path", "audio_filepath", "path", "wav")
#: Manifest fields holding the transcript, in the order they are looked for.
MANIFEST_TEXT_FIELDS = ("text", "sentence", "transcript")
#: Manifest fields not kept in the ``<key>.json`` member: where the audio is and what its
#: header says (the shard's audio member holds it), the transcript, the reader's ``source``.
MANIFEST_FIELDS_NOT_KEPT = (("key", "source", "offset", "duration", "num_samples", "num_frames",
                             "sample_rate", "channels", "num_channels")
                            + MANIFEST_AUDIO_FIELDS + MANIFEST_TEXT_FIELDS)

_AUDIO_MAGIC = (b"RIFF", b"fLaC", b"AUDI", b"OggS", b"FORM", b"ID3")

# Internal modes: what each utterance's reference points to.
FEATS, WAV, SEGMENT, MANIFEST = "feats", "wav", "segment", "manifest"


class Item(NamedTuple):
    """One utterance to pack: where its data is, and its label (picklable, for workers)."""

    key: str
    value: str  # feats/wav: the table value; segment: the segments value; manifest: a path
    source: str | None = None
    line: int | None = None
    text: str = ""
    recording: ScpEntry | None = None  # segment: the wav.scp entry of its recording
    offset: float | None = None  # manifest: segment start, seconds
    duration: float | None = None  # manifest: segment length, seconds
    meta: str | None = None  # manifest: its other fields, as JSON (the member <key>.json)


def _as_list(value: str | os.PathLike | Sequence[str | os.PathLike] | None, name: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, (str, os.PathLike)):
        value = [value]
    out = []
    for item in value:
        if not isinstance(item, (str, os.PathLike)) or not os.fspath(item):
            raise TypeError(f"{name} must be a path or a list of paths, got {item!r}")
        out.append(os.fspath(item))
    return out


def _check_key(key: str, source: str | None, line: int | None) -> None:
    problem = key_member_problem(key)
    if problem is not None:
        raise DataError(f"this key cannot name shard members: {problem}; rename the utterance",
                        source=source, line=line, key=key)


def _add_unique(table: dict[str, Any], key: str, item: Any, what: str) -> None:
    previous = table.get(key)
    if previous is not None:
        raise DataError(
            f"duplicate key: {what} {key!r} is also in {previous.source}:{previous.line}; keys "
            "must be unique across all input files",
            source=item.source, line=item.line, key=key,
        )
    table[key] = item


def _detect_kind(entry: ScpEntry, allow_commands: bool = False) -> str:
    """``"feats"`` or ``"wav"`` from the first value of an scp file."""
    value = entry.value
    where = dict(source=entry.source, line=entry.line, key=entry.key)
    if value.endswith("|"):
        if allow_commands and os.path.basename(entry.source or "") == "wav.scp":
            return "wav"  # Kaldi's wav.scp: commands writing audio
        if not allow_commands:
            raise UnsafeInputError(
                f"{value!r} is a shell command: pack runs the commands of a table only when "
                "allowed: pass allow_commands=True (CLI: --allow-commands)", **where)
        raise DataError(
            f"cannot tell what {value!r} produces (a shell command): pass kind='feats' or "
            "kind='wav' (CLI: --kind)", **where)
    ref = parse_ark_ref(value)
    if os.path.isfile(value):
        path, offset = value, 0
    elif ref is not None and ref.offset is not None and os.path.isfile(ref.path):
        path, offset = ref.path, ref.offset
    else:
        raise MissingDataError(
            f"{value!r} names no existing file, so the kind of this table cannot be told (and "
            "its data cannot be read); check the path (relative paths are relative to the "
            "current directory, as in Kaldi)", **where)
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            head = f.read(4)
    except OSError as exc:
        raise DataError(f"cannot read {path}: {exc.strerror or exc}", **where) from exc
    if head.startswith(_AUDIO_MAGIC) or (path == value and not head.startswith(b"\0B")):
        return "wav"
    return "feats"


class Inputs(NamedTuple):
    kind: str  # "feats" or "wav"
    mode: str  # FEATS, WAV, SEGMENT or MANIFEST
    data: dict[str, Item]
    labels: dict[str, ScpEntry]
    data_files: list[str]
    label_files: list[str]


def _table_kind(table: dict[str, ScpEntry], allow_commands: bool, on_error: str) -> str | None:
    """The kind of a table from its first value; under ``on_error="skip"`` from its first
    value naming a file that exists (the others are measured, and skipped, later), ``None``
    if there is none."""
    for entry in table.values():
        try:
            return _detect_kind(entry, allow_commands)
        except MissingDataError:
            if on_error != "skip":
                raise
    return None


def _read_scps(scps: list[str], kind: str, segments: list[str],
               allow_commands: bool = False, on_error: str = "raise") -> tuple[str, str, dict]:
    tables = [(path, read_scp_table(path)) for path in scps]
    kinds = {}
    for path, table in tables:
        if kind != "auto":
            kinds[path] = kind
        elif table:
            kinds[path] = _table_kind(table, allow_commands, on_error)
    if kind == "auto" and tables and all(k is None for k in kinds.values()) and kinds:
        first = next(table for _, table in tables if table)
        _detect_kind(next(iter(first.values())), allow_commands)  # names the first file
    kinds = {path: k for path, k in kinds.items() if k is not None}
    found = sorted(set(kinds.values()))
    if len(found) > 1:
        feats = next(p for p, k in kinds.items() if k == "feats")
        wav = next(p for p, k in kinds.items() if k == "wav")
        raise DataError(f"the scp files mix features ({feats}) and audio ({wav}); pack them "
                        "separately", source=wav)
    resolved = found[0] if found else ("feats" if kind == "auto" else kind)
    if segments and resolved != "wav":
        raise ValueError("segments need a wav.scp (audio), but the scp files hold features "
                         f"({', '.join(scps)}); pass kind='wav' if they hold audio")
    entries: dict[str, ScpEntry] = {}
    for _, table in tables:
        for key, entry in table.items():
            _add_unique(entries, key, entry, "recording" if segments else "key")
    data: dict[str, Item] = {}
    if not segments:
        for key, entry in entries.items():
            _check_key(key, entry.source, entry.line)
            data[key] = Item(key, entry.value, entry.source, entry.line)
        return resolved, (FEATS if resolved == "feats" else WAV), data
    for path in segments:
        for key, entry in read_scp_table(path).items():
            _check_key(key, entry.source, entry.line)
            item = Item(key, entry.value, entry.source, entry.line)
            _add_unique(data, key, item, "segment")
            reco = entry.value.split(maxsplit=1)[0]
            if reco not in entries:
                raise DataError(f"unknown recording {reco!r}: not in {', '.join(scps)}",
                                source=path, line=entry.line, key=key)
            data[key] = item._replace(recording=entries[reco])
    return resolved, SEGMENT, data


def _meta(row: dict, source: str, line: int | None, key: str) -> str | None:
    """The manifest line's other fields (speaker, chapter, gender, age, accent, language...)
    as JSON text with sorted keys (the same bytes every time), or ``None`` if there are none."""
    other = {k: v for k, v in row.items() if k not in MANIFEST_FIELDS_NOT_KEPT}
    if not other:
        return None
    try:
        return json.dumps(other, ensure_ascii=False, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise DataError(f"the other fields of this line cannot be kept as JSON: {exc}",
                        source=source, line=line, key=key) from None


def _manifest_field(row: dict, names: Sequence[str]) -> str | None:
    return next((n for n in names if n in row), None)


def _read_manifests(manifests: list[str]) -> tuple[dict[str, Item], dict[str, ScpEntry]]:
    data: dict[str, Item] = {}
    labels: dict[str, ScpEntry] = {}
    for path in manifests:
        for row in read_manifest(path):
            key = row["key"]
            where = str(row.get("source", ""))  # "path:line", set by the manifest reader
            tail = where[len(path) + 1:] if where.startswith(f"{path}:") else ""
            source, line = path, (int(tail) if tail.isdigit() else None)
            _check_key(key, source, line)
            audio_field = _manifest_field(row, MANIFEST_AUDIO_FIELDS)
            audio = row.get(audio_field) if audio_field else None
            if not isinstance(audio, str) or not audio:
                raise DataError(
                    f"no audio path: expected a non-empty string in one of the fields "
                    f"{list(MANIFEST_AUDIO_FIELDS)}", source=source, line=line, key=key)
            offset = row.get("offset")
            duration = row.get("duration") if offset is not None else None
            for name, value in (("offset", offset), ("duration", duration)):
                if value is not None and (isinstance(value, bool) or not isinstance(
                        value, (int, float)) or not value >= 0 or not math.isfinite(value)):
                    raise DataError(f"field {name!r} must be a number of seconds >= 0, got "
                                    f"{value!r}", source=source, line=line, key=key)
            item = Item(key, audio, source, line, offset=offset, duration=duration,
                         meta=_meta(row, source, line, key))
            _add_unique(data, key, item, "key")
            text_field = _manifest_field(row, MANIFEST_TEXT_FIELDS)
            if text_field is not None:
                text = row[text_field]
                if not isinstance(text, str):
                    raise DataError(f"field {text_field!r} must be a string, got "
                                    f"{type(text).__name__}", source=source, line=line, key=key)
                labels[key] = ScpEntry(key, text, source, line)
    return data, labels


class _InputFiles(NamedTuple):
    """The files :func:`~speechpipe.pack.pack_data` reads, as lists of paths."""

    scps: list[str]
    labels: list[str]
    segments: list[str]
    manifests: list[str]


def input_files(f_scps, f_labels, segments, manifests) -> _InputFiles:
    """Check the file arguments of ``pack_data``: scp and label files (with segments), or
    manifests."""
    files = _InputFiles(_as_list(f_scps, "f_scps"), _as_list(f_labels, "f_labels"),
                        _as_list(segments, "segments"), _as_list(manifests, "manifests"))
    if files.manifests and (files.scps or files.labels or files.segments):
        raise ValueError("pass either manifests, or scp and label files (with segments), "
                         "not both")
    if not files.manifests and not (files.scps and files.labels):
        raise ValueError("nothing to pack: pass scp files and label files, or manifests")
    return files


def read_inputs(scps, labels, segments, manifests, kind, allow_commands=False,
                on_error="raise") -> Inputs:
    if manifests:
        data, label_table = _read_manifests(manifests)
        return Inputs("wav", MANIFEST, data, label_table, manifests, manifests)
    resolved, mode, data = _read_scps(scps, kind, segments, allow_commands, on_error)
    label_table: dict[str, ScpEntry] = {}
    for path in labels:
        for key, entry in read_scp_table(path, allow_empty=True).items():
            _add_unique(label_table, key, entry, "label")
    return Inputs(resolved, mode, data, label_table, segments or scps, labels)



def no_commands(exc: UnsafeInputError) -> UnsafeInputError:
    """A refused table command, said as pack says it; any other unsafe input as it was (a
    pickled object is refused for what it is, issue 23)."""
    if "is a shell command" not in exc.reason:
        return exc
    return UnsafeInputError(
        f"{exc.reason.split(';')[0]}; pack runs commands from tables only when allowed: "
        "pass allow_commands=True (CLI: --allow-commands), or write their output to files or "
        "arks first (e.g. wav-copy, copy-feats)",
        source=exc.source, line=exc.line, key=exc.key)


def _mismatch_error(inputs: Inputs, no_label: list[str], no_data: list[str]) -> DataError:
    data_what = "manifests" if inputs.mode == MANIFEST else "data files"
    parts = []
    if no_label:
        parts.append(f"{len(no_label)} key(s) of the {data_what} have no label (e.g. "
                     f"{', '.join(map(repr, no_label[:EXAMPLES]))})")
    if no_data:
        parts.append(f"{len(no_data)} label(s) have no data (e.g. "
                     f"{', '.join(map(repr, no_data[:EXAMPLES]))})")
    files = ", ".join(inputs.data_files + [f for f in inputs.label_files
                                           if f not in inputs.data_files])
    return DataError(
        f"keys do not match: {'; '.join(parts)}{_normalisation_hint(no_label, no_data)}; fix "
        "the inputs, or pack only the keys present in both with on_mismatch='skip' (CLI: "
        "--on-mismatch skip)", source=files)


def _normalisation_hint(no_label: list[str], no_data: list[str]) -> str:
    """A sentence when unmatched keys are equal up to Unicode normalisation (``'é'`` as one
    code point in one file, ``e`` + a combining accent in the other): they look identical."""
    import unicodedata

    labels = {unicodedata.normalize("NFC", k): k for k in no_data}
    pairs = [(k, labels[unicodedata.normalize("NFC", k)]) for k in no_label
             if unicodedata.normalize("NFC", k) in labels]
    if not pairs:
        return ""
    data_key, label_key = pairs[0]

    def form(key: str) -> str:
        return "NFC" if unicodedata.normalize("NFC", key) == key else "NFD"

    return (f"; {len(pairs)} of them differ only in Unicode normalisation (e.g. {data_key!r}, "
            f"{form(data_key)} in the data, and {label_key!r}, {form(label_key)} in the labels, "
            "look the same): write both files in one normalisation (NFC)")


def match_keys(inputs: Inputs, on_mismatch: str) -> tuple[list[Item], list[str], list[str]]:
    """``(items, keys without label, labels without data)``: the items of the keys with both
    data and a label, in sorted key order, each carrying its label.

    Raises:
        DataError: keys without a label or labels without data under ``on_mismatch="error"``
            (counts and examples); no key with both.
    """
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
    return items, no_label, no_data
