"""What ``prepare`` checks and records besides the manifest: decoding every file once
(:func:`verify_audio`), the one policy for empty transcripts (:data:`EMPTY_TEXT`), the sample
rates met, and a record of what a manifest was made from (:func:`fingerprint`), so that a rerun
over an unchanged corpus does nothing and one over a changed corpus says why it rewrites.

The record sits beside the manifest, ``<corpus>_samples_<part>.prepared.json``
(:func:`record_path`)::

    {"version": 1, "inputs": {"files": 1842, "bytes": 337000000, "newest_mtime": ...,
                              "digest": "sha256 of (path, size, mtime) per file"},
     "options": {"empty_text": "error", "verify": true, "on_error": "skip"},
     "utterances": 1837, "speakers": 40, "hours": 5.39, "sample_rates": {"16000": 1836, ...},
     "target_sample_rate": 16000, "skipped": {"truncated audio": 1, ...}, "examples": {...},
     "empty_text_kept": 0}

:class:`PartReport` is what :func:`~speechpipe.recipes.prepare_parts` says about one part
(written, rewritten and why, or up to date), printed by ``speechpipe prepare``.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import soundfile

from ..diagnostics import Diagnostics
from ..errors import DataError
from ..executors import as_executor, run_tasks
from ..pipes.decode import short_wav
from ..sample import DURATION, KEY, SPEAKER, TEXT, Sample

__all__ = [
    "AudioCheck",
    "EMPTY_TEXT",
    "FILES_PER_TASK",
    "PROBLEMS",
    "PartReport",
    "apply_empty_text",
    "apply_verification",
    "changed_inputs",
    "check_audio_file",
    "check_audio_files",
    "check_empty_text",
    "fingerprint",
    "read_record",
    "record_path",
    "verify_audio",
]

#: Values of ``empty_text``: an utterance whose transcript is empty (or only spaces) stops the
#: run (``"error"``, the default everywhere: recipes, ``prepare``, ``pack``), is left out and
#: counted (``"skip"``), or is kept and counted (``"keep"``: e.g. silence or noise segments).
EMPTY_TEXT = ("error", "skip", "keep")
_RECORD_VERSION = 1
_EXAMPLES = 3
#: The problems :func:`verify_audio` finds, as skip reasons.
PROBLEMS = {"missing": "missing audio", "corrupt": "corrupt audio",
            "truncated": "truncated audio", "empty": "empty audio",
            "non-finite": "non-finite audio"}
_BLOCK = 4096  # frames decoded at a time (a FLAC frame): where decoding stops is known to it


def check_empty_text(value: str) -> str:
    if value not in EMPTY_TEXT:
        raise ValueError(f"empty_text must be one of {EMPTY_TEXT}, got {value!r}")
    return value


def apply_empty_text(samples: list[Sample], policy: str, *, stage: str,
                     diagnostics: Diagnostics, faults: list | None = None
                     ) -> tuple[list[Sample], int]:
    """``(samples kept, empty transcripts kept)`` under ``policy`` (:data:`EMPTY_TEXT`).

    Samples without a ``text`` field (unlabelled data) are not concerned. With ``faults``
    (``prepare --verify``: every fault reported at once), ``"error"`` adds ``(what, count,
    examples, flag)`` to it and leaves the samples out instead of raising.

    Raises:
        DataError: under ``"error"`` without ``faults``, with the count and a few keys.

    >>> d = Diagnostics("prepare_x")
    >>> rows = [{"key": "a", "text": "hi"}, {"key": "b", "text": " "}]
    >>> kept, n = apply_empty_text(rows, "skip", stage="prepare_x", diagnostics=d)
    >>> [s["key"] for s in kept], n, d.counts["empty transcript"]
    (['a'], 0, 1)
    """
    empty = [s for s in samples if isinstance(s.get(TEXT), str) and not s[TEXT].strip()]
    if not empty or policy == "keep":
        return samples, len(empty)
    examples = ", ".join(_where(s) for s in empty[:_EXAMPLES])
    dropped = {id(s) for s in empty}
    if policy == "error" and faults is not None:
        faults.append(("empty transcript", len(empty), [_where(s) for s in empty[:_EXAMPLES]],
                       "--empty-text skip (empty_text='skip'; or keep)"))
        return [s for s in samples if id(s) not in dropped], 0
    if policy == "error":
        raise DataError(
            f"{len(empty)} utterance(s) with an empty transcript (e.g. {examples}); "
            "fix the transcripts, or pass empty_text='skip' to leave them out or 'keep' to "
            "keep them, counted (CLI: --empty-text skip|keep)", source=stage)
    for s in empty:
        diagnostics.record("empty transcript", _where(s))
    return [s for s in samples if id(s) not in dropped], 0


def _where(sample: Mapping[str, Any]) -> str:
    path = sample.get("audio_path")
    return f"key {sample.get(KEY)!r}" + (f" ({path})" if path else "")


# --------------------------------------------------------------------------- verify


@dataclass(frozen=True)
class AudioCheck:
    """What decoding one file found: ``problem`` (a key of :data:`PROBLEMS`) or ``None``,
    a sentence saying it, and the file's rate."""

    path: str
    problem: str | None
    detail: str = ""
    sample_rate: int | None = None


def check_audio_file(path: str) -> AudioCheck:
    """Decode ``path`` once, block by block; compare what decodes with what its header says."""
    if not os.path.exists(path):
        return AudioCheck(path, "missing", "file not found")
    if os.path.getsize(path) == 0:
        return AudioCheck(path, "empty", "the file is empty (0 bytes)")
    try:
        f = soundfile.SoundFile(path)
    except (soundfile.LibsndfileError, RuntimeError, TypeError, ValueError) as exc:
        return AudioCheck(path, "corrupt", f"cannot read the header: {exc}")
    with f:
        rate, promised, decoded = int(f.samplerate), int(f.frames), 0
        nonfinite, first = 0, None  # NaN and infinite samples: a fault like a truncation
        try:
            while True:
                block = f.read(_BLOCK, dtype="float32", always_2d=True)
                if not len(block):
                    break
                finite = np.isfinite(block).all(axis=1)
                if not finite.all():
                    first = decoded + int(np.argmin(finite)) if first is None else first
                    nonfinite += int((~finite).sum())
                decoded += len(block)
        except (soundfile.LibsndfileError, RuntimeError) as exc:
            what = "truncated" if decoded else "corrupt"
            return AudioCheck(path, what, f"decoding stops at {decoded / rate:.2f} s of the "
                              f"{promised / rate:.2f} s its header promises ({exc})", rate)
        short = short_wav(f)  # a WAV's data chunk shorter than its header: libsndfile
    if short is not None:     # decodes what is there without an error (issue 23.5)
        return AudioCheck(path, "truncated", f"its header promises {short[0]} bytes of audio "
                          f"but the file holds {short[1]}", rate)
    if promised == 0 or decoded == 0:
        return AudioCheck(path, "empty", "no audio samples", rate)
    if nonfinite:
        return AudioCheck(path, "non-finite", f"{nonfinite} of its {decoded} samples are NaN "
                          f"or infinite (the first at {first / rate:.3f} s)", rate)
    if decoded < promised:
        return AudioCheck(path, "truncated", f"decodes {decoded / rate:.2f} s of the "
                          f"{promised / rate:.2f} s its header promises", rate)
    return AudioCheck(path, None, "", rate)


def check_audio_files(paths: Sequence[str]) -> list[AudioCheck]:
    """:func:`check_audio_file` of each path: one task of :func:`verify_audio` on an
    executor (a module-level function: a Dask worker imports it by name)."""
    return [check_audio_file(p) for p in paths]


#: The most files one task of :func:`verify_audio` on an executor decodes: a few seconds of
#: work for LibriSpeech-like files, so that a scheduler's cost per task (milliseconds on Dask)
#: stays well under 1 %, with enough tasks to keep every worker busy to the end.
FILES_PER_TASK = 64


def verify_audio(paths: Iterable[str], *, num_jobs: int = 1, progress: bool = True,
                 desc: str = "verify", executor: Any = None) -> dict[str, AudioCheck]:
    """Decode every file once, on ``num_jobs`` threads (libsndfile releases the GIL while it
    decodes) or on ``executor``, with a progress bar; ``{path: AudioCheck}`` of each distinct
    path.

    ``executor``: any :class:`concurrent.futures.Executor` (a process pool...) or a Dask
    ``distributed.Client`` (:func:`~speechpipe.executors.as_executor`); the files are sent to
    it in tasks of up to :data:`FILES_PER_TASK` (at least 8 tasks when there are 8 files),
    and what they find is the same as here.

    >>> import os, tempfile, numpy as np
    >>> d = tempfile.mkdtemp(); good = os.path.join(d, "a.flac")
    >>> soundfile.write(good, np.zeros(1600, np.float32), 16000)
    >>> with open(good, "rb") as f, open(os.path.join(d, "b.flac"), "wb") as g:
    ...     _ = g.write(f.read()[:60])
    >>> bad = os.path.join(d, "b.flac")
    >>> found = verify_audio([good, bad], progress=False)
    >>> found[good].problem, found[bad].problem
    (None, 'corrupt')
    """
    from ..progress import progress_bar

    unique = list(dict.fromkeys(paths))
    out: dict[str, AudioCheck] = {}
    # a tqdm bar on a terminal; lines in a log (tqdm's \r redraws pile up into one line there)
    with progress_bar(total=len(unique), desc=desc, unit="files", disable=not progress,
                      leave=False) as bar:
        if executor is not None:
            per_task = max(1, min(FILES_PER_TASK, -(-len(unique) // 8)))
            chunks = [unique[i:i + per_task] for i in range(0, len(unique), per_task)]
            for _, checks in run_tasks(as_executor(executor), check_audio_files, chunks):
                for check in checks:
                    out[check.path] = check
                bar.update(len(checks))
            return {p: out[p] for p in unique}
        with concurrent.futures.ThreadPoolExecutor(num_jobs) as pool:
            for check in pool.map(check_audio_file, unique):
                out[check.path] = check
                bar.update(1)
    return out


def apply_verification(samples: list[Sample], checks: Mapping[str, AudioCheck], on_error: str,
                       *, stage: str, diagnostics: Diagnostics,
                       faults: list | None = None) -> list[Sample]:
    """The samples whose audio decoded; the others raise (``on_error="raise"``: every
    problem counted, with examples; with ``faults``, added to it as ``(what, count,
    examples, flag)`` instead) or are left out and counted (``"skip"``)."""
    bad = [s for s in samples if checks[s["audio_path"]].problem is not None]
    if not bad:
        return samples
    by_problem: dict[str, list[Sample]] = {}
    for s in bad:
        by_problem.setdefault(checks[s["audio_path"]].problem, []).append(s)
    if on_error == "raise" and faults is not None:
        for problem, rows in sorted(by_problem.items()):
            faults.append((PROBLEMS[problem], len(rows),
                           [f"{s['audio_path']}: {checks[s['audio_path']].detail}"
                            for s in rows[:_EXAMPLES]], "--on-error skip (on_error='skip')"))
        return [s for s in samples if checks[s["audio_path"]].problem is None]
    if on_error == "raise":
        parts = []
        for problem, rows in sorted(by_problem.items()):
            shown = "; ".join(f"{s['audio_path']}: {checks[s['audio_path']].detail}"
                              for s in rows[:_EXAMPLES])
            parts.append(f"{PROBLEMS[problem]}: {len(rows)} utterance(s) (e.g. {shown})")
        raise DataError(f"verification failed: {' | '.join(parts)}. Fix or remove the "
                        "files, or pass on_error='skip' (CLI: --on-error skip) to leave them "
                        "out, counted", source=stage)
    for s in bad:
        check = checks[s["audio_path"]]
        diagnostics.record(PROBLEMS[check.problem],
                           f"{s['audio_path']} (key {s.get(KEY)!r}): {check.detail}")
    return [s for s in samples if checks[s["audio_path"]].problem is None]


# --------------------------------------------------------------------------- record


def record_path(manifest: str | os.PathLike) -> Path:
    """The record beside a manifest: ``x.jsonl.gz`` -> ``x.prepared.json``.

    >>> record_path("m/librispeech_samples_dev-clean.jsonl.gz").name
    'librispeech_samples_dev-clean.prepared.json'
    """
    path = Path(manifest)
    name = path.name
    for suffix in (".jsonl.gz", ".jsonl"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    return path.with_name(f"{name}.prepared.json")


def fingerprint(paths: Iterable[str]) -> dict[str, Any]:
    """File count, total size, newest mtime and a sha256 of ``(path, size, mtime)`` of each
    distinct file (an absent one counts as size and mtime -1): what a manifest was made from.

    >>> fingerprint([])["files"]
    0
    """
    digest = hashlib.sha256()
    files = size = 0
    newest = 0
    for path in sorted({os.fspath(p) for p in paths}):
        try:
            st = os.stat(path)
            entry = (path, st.st_size, st.st_mtime_ns)
            size += st.st_size
            newest = max(newest, st.st_mtime_ns)
        except OSError:
            entry = (path, -1, -1)
        files += 1
        digest.update(json.dumps(entry).encode() + b"\n")
    return {"files": files, "bytes": size, "newest_mtime_ns": newest,
            "digest": digest.hexdigest()}


def changed_inputs(old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    """Why two fingerprints differ, for a person."""
    what = []
    if old.get("files") != new["files"]:
        what.append(f"files {old.get('files')} -> {new['files']}")
    if old.get("bytes") != new["bytes"]:
        what.append(f"bytes {old.get('bytes')} -> {new['bytes']}")
    if old.get("newest_mtime_ns") != new["newest_mtime_ns"]:
        what.append("newer files")
    return ", ".join(what) or "a file was renamed or replaced by one of the same size and time"


def read_record(manifest: str | os.PathLike) -> dict | None:
    """The record of ``manifest``, or ``None`` (absent, unreadable, another version)."""
    try:
        with open(record_path(manifest), encoding="utf-8") as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("version") != _RECORD_VERSION:
        return None
    return record


@dataclass
class PartReport:
    """What ``prepare`` did with one part, and what its manifest holds.

    Attributes:
        part, manifest: the part and its manifest (``None`` without an output folder).
        status: ``"written"``, ``"rewritten"`` (``reason`` says why) or ``"up to date"``.
        utterances, speakers, hours: of the manifest.
        sample_rates: ``{Hz: utterances}``; ``target_sample_rate``: the rate the recipe
            pipelines resample to (``None``: none); ``rate_examples``: a few keys per rate.
        skipped: ``{reason: count}`` of what was left out; ``examples``: a few of each.
        empty_text_kept: utterances kept with an empty transcript (``empty_text="keep"``).
    """

    part: str
    manifest: str | None
    status: str = "written"
    reason: str = ""
    utterances: int = 0
    speakers: int = 0
    hours: float = 0.0
    sample_rates: dict[int, int] = field(default_factory=dict)
    target_sample_rate: int | None = None
    skipped: dict[str, int] = field(default_factory=dict)
    examples: dict[str, list[str]] = field(default_factory=dict)
    empty_text_kept: int = 0
    rate_examples: dict[int, list[str]] = field(default_factory=dict)

    @classmethod
    def of(cls, part: str, manifest: str | None, samples: Sequence[Sample],
           diagnostics: Diagnostics, target_sample_rate: int | None,
           empty_text_kept: int) -> "PartReport":
        rates = Counter(int(s["sample_rate"]) for s in samples if "sample_rate" in s)
        rate_examples: dict[int, list[str]] = {}
        for s in samples:
            if "sample_rate" in s and len(rate_examples.setdefault(
                    int(s["sample_rate"]), [])) < _EXAMPLES:
                rate_examples[int(s["sample_rate"])].append(_where(s))
        return cls(
            part, manifest, utterances=len(samples),
            speakers=len({s[SPEAKER] for s in samples if SPEAKER in s}),
            hours=sum(float(s.get(DURATION) or 0.0) for s in samples) / 3600,
            sample_rates=dict(sorted(rates.items())), target_sample_rate=target_sample_rate,
            skipped=dict(diagnostics.counts), examples={k: list(v) for k, v in
                                                        diagnostics.examples.items()},
            empty_text_kept=empty_text_kept, rate_examples=rate_examples)

    def to_record(self, inputs: Mapping[str, Any], options: Mapping[str, Any]) -> dict:
        return {"version": _RECORD_VERSION, "inputs": dict(inputs), "options": dict(options),
                "utterances": self.utterances, "speakers": self.speakers,
                "hours": self.hours,
                "sample_rates": {str(k): v for k, v in self.sample_rates.items()},
                "target_sample_rate": self.target_sample_rate, "skipped": self.skipped,
                "examples": self.examples, "empty_text_kept": self.empty_text_kept,
                "rate_examples": {str(k): v for k, v in self.rate_examples.items()}}

    @classmethod
    def from_record(cls, part: str, manifest: str, record: Mapping[str, Any]) -> "PartReport":
        return cls(part, manifest, status="up to date", utterances=record["utterances"],
                   speakers=record["speakers"], hours=record["hours"],
                   sample_rates=dict(sorted((int(k), v)
                                            for k, v in record["sample_rates"].items())),
                   rate_examples={int(k): v for k, v in record.get("rate_examples", {}).items()},
                   target_sample_rate=record.get("target_sample_rate"),
                   skipped=dict(record.get("skipped", {})),
                   examples=dict(record.get("examples", {})),
                   empty_text_kept=record.get("empty_text_kept", 0))

    def report(self) -> str:
        """A few lines for people.

        >>> print(PartReport("dev", "m.jsonl.gz", utterances=3, speakers=2, hours=0.01,
        ...                  sample_rates={8000: 1, 16000: 2}, target_sample_rate=16000,
        ...                  rate_examples={8000: ["key 'c' (c.flac)"]},
        ...                  skipped={"truncated audio": 1},
        ...                  examples={"truncated audio": ["a.flac (key 'a')"]}).report())
        dev: written m.jsonl.gz
          3 utterances, 2 speakers, 0.01 hours (36.0 s)
          sample rates: 8000 Hz: 1, 16000 Hz: 2 (resampled to 16000 Hz when read)
            at 8000 Hz: key 'c' (c.flac)
          skipped 1: truncated audio: 1 (e.g. a.flac (key 'a'))
        """
        head = f"{self.part}: {self.status}"
        if self.reason:
            head += f" ({self.reason})"
        lines = [f"{head} {self.manifest}" if self.manifest else head,
                 f"  {self.utterances} utterances, {self.speakers} speakers, "
                 f"{self.hours:.2f} hours" + (f" ({self.hours * 3600:.1f} s)" if self.hours < 1
                                              else "")]
        if self.sample_rates:
            rates = ", ".join(f"{r} Hz: {n}" for r, n in self.sample_rates.items())
            usual = self.target_sample_rate or max(self.sample_rates,
                                                   key=self.sample_rates.__getitem__)
            odd = [r for r in self.sample_rates if r != usual]
            if self.target_sample_rate is not None and odd:
                rates += f" (resampled to {self.target_sample_rate} Hz when read)"
            lines.append(f"  sample rates: {rates}")
            for r in odd:
                if self.rate_examples.get(r):
                    lines.append(f"    at {r} Hz: {', '.join(self.rate_examples[r])}")
        if self.skipped:
            lines.append(f"  skipped {sum(self.skipped.values())}: " + "; ".join(
                f"{reason}: {n} (e.g. {', '.join(self.examples.get(reason, [])[:2])})"
                for reason, n in sorted(self.skipped.items())))
        if self.empty_text_kept:
            lines.append(f"  kept with an empty transcript: {self.empty_text_kept}")
        return "\n".join(lines)
