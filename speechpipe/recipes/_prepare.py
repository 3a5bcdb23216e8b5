"""Prepare a corpus's manifests: parts, transcript/audio pairing, durations, manifest files.

One manifest kind, ``samples``: a gzipped JSON-lines file per part,
``{corpus}_samples_{part}.jsonl.gz`` (:func:`manifest_path`), one line per utterance::

    {"audio_path": "/data/LibriSpeech/dev-clean/1272/128104/1272-128104-0000.flac",
     "duration": 5.855, "key": "1272-128104-0000", "sample_rate": 16000,
     "speaker": "1272", "text": "MISTER QUILTER IS THE APOSTLE ..."}

with ``offset`` (seconds) when the utterance is a segment of a longer recording, and the
corpus's extra fields (``chapter``, ``normalized_text``, ``feats_path``...). Read it back with
:func:`~speechpipe.pipes.sources._manifests.read_manifest` or feed it to the pipelines of
:mod:`speechpipe.recipes._pipelines`; ``speechpipe pack --manifest`` packs it into shards.
:func:`prepare_parts` reuses a part whose manifest is up to date (a record beside it says
what it was made from; manifests are written to a temporary name and renamed when complete)
and runs the checks every recipe shares (empty transcripts, optional verification, sample
rates, counted in a :class:`~speechpipe.recipes._checks.PartReport`), :func:`check_pairs`
reports audio without transcript and transcripts without audio under an explicit policy
(``on_mismatch="error"`` raises a :class:`~speechpipe.errors.DataError` with counts and
examples, ``"skip"`` leaves them out, counted and warned about -- never silently), and
:func:`measure_audio` reads durations with ``soundfile.info`` on ``num_jobs`` threads.
:func:`resolve_manifests` turns what a pipeline builder is given (paths, a folder, sample
lists, ``prepare_<corpus>``'s result) into the manifests to read.
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import json
import logging
import os
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import soundfile

from ..diagnostics import Diagnostics, SkippedInputWarning, check_on_error
from ..errors import DataError, MissingDataError
from ..pipes.sources import write_manifest, write_manifest_table
from ..sample import Sample
from ._checks import (
    PartReport,
    apply_empty_text,
    apply_verification,
    changed_inputs,
    check_empty_text,
    fingerprint,
    read_record,
    record_path,
    verify_audio,
)
from ._jobs import (
    VerifyPlan,
    check_step,
    plan_path,
    read_task_checks,
    remove_job_files,
    step_name,
    task_path,
    write_task_result,
)

__all__ = [
    "AUDIO_PATH",
    "FEATS_PATH",
    "MANIFEST_KIND",
    "OFFSET",
    "ON_MISMATCH",
    "PreparedParts",
    "check_pairs",
    "manifest_path",
    "measure_audio",
    "prepare_parts",
    "resolve_manifests",
    "resolve_parts",
]

log = logging.getLogger("speechpipe.recipes")

#: The one manifest kind recipes write: one JSON line per utterance.
MANIFEST_KIND = "samples"
#: Manifest field: the audio file of the utterance (absolute path).
AUDIO_PATH = "audio_path"
#: Manifest field: start of the utterance in its recording, seconds (segments only).
OFFSET = "offset"
#: Manifest field: a Kaldi ``feats.scp`` value (``/abs/raw.ark:123``), for feature-only data.
FEATS_PATH = "feats_path"
#: Values of ``on_mismatch``: raise on audio without transcript (or the reverse), or skip them.
ON_MISMATCH = ("error", "skip")


def manifest_path(output_dir: str | os.PathLike, corpus: str, part: str,
                  kind: str = MANIFEST_KIND) -> Path:
    """``<output_dir>/{corpus}_{kind}_{part}.jsonl.gz``.

    >>> manifest_path("data/manifests", "librispeech", "dev-clean").as_posix()
    'data/manifests/librispeech_samples_dev-clean.jsonl.gz'
    """
    return Path(output_dir) / f"{corpus}_{kind}_{part}.jsonl.gz"


def as_names(value: str | Iterable[str], arg: str) -> list[str]:
    names = [value] if isinstance(value, str) else list(value)
    for n in names:
        if not isinstance(n, str) or not n:
            raise TypeError(f"{arg} must be names (non-empty str), got {n!r}")
    return names


def resolve_parts(
    parts: str | Iterable[str],
    known: Sequence[str],
    present: Callable[[str], bool],
    *,
    corpus: str,
    corpus_dir: str | os.PathLike,
    where: Callable[[str], str] | None = None,
) -> list[str]:
    """The parts to prepare: ``"auto"`` means every part of ``known`` that is ``present``.

    Args:
        parts: ``"auto"``, one name or several.
        known: the corpus's part names, in order (``None``-free).
        present: tells whether a part is on disk.
        corpus, corpus_dir: for messages.
        where: path of a part on disk, for the message naming a missing one.

    Raises:
        ValueError: an unknown part name.
        MissingDataError: a requested part is not on disk (naming its folder), or ``"auto"``
            found none.

    >>> resolve_parts("auto", ["a", "b"], lambda p: p == "b", corpus="x", corpus_dir="/c")
    ['b']
    """
    if parts == "auto":
        found = [p for p in known if present(p)]
        if not found:
            raise MissingDataError(
                f"no {corpus} part found; expected one or more of {', '.join(known)} "
                f"(is this the {corpus} folder?)",
                source=os.fspath(corpus_dir),
            )
        return found
    names = as_names(parts, "parts")
    unknown = [p for p in names if p not in known]
    if unknown:
        raise ValueError(f"unknown {corpus} part(s) {unknown}; known: {list(known)}")
    for p in names:
        if not present(p):
            raise MissingDataError(
                f"{corpus} part {p!r} not found; download it or leave it out of parts",
                source=where(p) if where else os.path.join(os.fspath(corpus_dir), p),
            )
    return names


def check_pairs(
    without_text: Sequence[str],
    without_audio: Sequence[str],
    *,
    on_mismatch: str,
    stage: str,
    source: str | os.PathLike,
    diagnostics: Diagnostics | None = None,
) -> Diagnostics:
    """Apply the mismatch policy to utterances with audio but no transcript and the reverse.

    Args:
        without_text: locations (audio paths) of utterances without a transcript.
        without_audio: locations (``file:line (key)``) of transcripts without audio.
        on_mismatch: ``"error"``: raise a :class:`~speechpipe.errors.DataError` with both
            counts and examples; ``"skip"``: count them in the returned
            :class:`~speechpipe.diagnostics.Diagnostics` and warn
            (:class:`~speechpipe.diagnostics.SkippedInputWarning`) with its report.
        stage: the name shown in the report (``prepare_librispeech dev-clean``).
        source: the folder or file the error names.
        diagnostics: counts are added here (a new one if not given).

    >>> d = check_pairs([], [], on_mismatch="error", stage="prepare_x", source="/c")
    >>> d.total
    0
    """
    if on_mismatch not in ON_MISMATCH:
        raise ValueError(f"on_mismatch must be one of {ON_MISMATCH}, got {on_mismatch!r}")
    if diagnostics is None:
        diagnostics = _DIAGNOSTICS.get() or Diagnostics(stage)
    if not without_text and not without_audio:
        return diagnostics
    faults = _FAULTS.get()
    if on_mismatch == "error" and faults is not None:  # prepare --verify: reported with all
        flag = "--on-mismatch skip (on_mismatch='skip')"
        if without_text:
            faults.append(("audio without transcript", len(without_text),
                           list(without_text[:3]), flag))
        if without_audio:
            faults.append(("transcript without audio", len(without_audio),
                           list(without_audio[:3]), flag))
        return diagnostics
    if on_mismatch == "error":
        problems = []
        if without_text:
            problems.append(f"{len(without_text)} audio file(s) without a transcript "
                            f"(e.g. {', '.join(without_text[:3])})")
        if without_audio:
            problems.append(f"{len(without_audio)} transcript(s) without audio "
                            f"(e.g. {', '.join(without_audio[:3])})")
        raise DataError(
            f"{stage}: {'; '.join(problems)}. Fix the corpus, or pass on_mismatch='skip' "
            "(speechpipe prepare --on-mismatch skip) to leave them out of the manifest, "
            "counted in a warning",
            source=os.fspath(source),
        )
    for loc in without_text:
        diagnostics.record("audio without transcript", loc)
    for loc in without_audio:
        diagnostics.record("transcript without audio", loc)
    warnings.warn(diagnostics.report(), SkippedInputWarning, stacklevel=3)
    return diagnostics


def _info(path: str, deferred: bool = False) -> tuple[int, int]:
    try:
        info = soundfile.info(path)
    except (soundfile.LibsndfileError, RuntimeError, TypeError, ValueError) as exc:
        if deferred:  # the verification names and counts it, with the other bad files
            return 0, 1
        if not os.path.exists(path):
            raise MissingDataError("audio file not found", source=path) from exc
        raise DataError(f"cannot read audio header: {exc} (prepare --verify reports every "
                        "unreadable file at once)", source=path) from exc
    return int(info.frames), int(info.samplerate)


def measure_audio(
    paths: Sequence[str], *, num_jobs: int = 1, progress: bool = True, desc: str = "measure"
) -> list[tuple[int, int]]:
    """``(frames, sample_rate)`` of each audio file, from its header (``soundfile.info``).

    With ``num_jobs > 1`` the headers are read on that many threads (libsndfile releases the
    GIL; the work is I/O bound). The order of the result is the order of ``paths``.

    Raises:
        MissingDataError / DataError: a file is absent / unreadable (naming it); while
            :func:`prepare_parts` verifies, such a file measures ``(0, 1)`` instead and the
            verification reports it with the others.

    >>> import os, tempfile, numpy as np
    >>> p = os.path.join(tempfile.mkdtemp(), "a.flac")
    >>> soundfile.write(p, np.zeros(800, np.float32), 16000)
    >>> measure_audio([p], progress=False)
    [(800, 16000)]
    """
    from ..progress import progress_bar

    if not isinstance(num_jobs, int) or num_jobs < 1:
        raise ValueError(f"num_jobs must be an int >= 1, got {num_jobs!r}")
    deferred = VERIFYING.get()  # read here: the pool's threads do not see this context
    with progress_bar(total=len(paths), desc=desc, unit="files", disable=not progress,
                      leave=False) as bar:
        if num_jobs == 1:
            out = []
            for p in paths:
                out.append(_info(p, deferred))
                bar.update(1)
            return out
        with concurrent.futures.ThreadPoolExecutor(num_jobs) as pool:
            out = []
            for item in pool.map(_info, paths, [deferred] * len(paths)):
                out.append(item)
                bar.update(1)
            return out


class PreparedParts(dict):
    """``{part: manifest}`` as ``prepare_<corpus>`` returns it, with :attr:`reports`:
    ``{part: PartReport}`` (written, rewritten and why, or up to date; utterances, speakers,
    hours, sample rates, skips), which ``speechpipe prepare`` prints. The plan and task steps
    of a job array (``step=``) map each part to the file they wrote instead, and say what
    they did in :attr:`steps` (``{part: line}``)."""

    reports: dict[str, PartReport]
    steps: dict[str, str]


# long: the one place that runs a part's checks in order; each step is one call
def prepare_parts(
    corpus: str,
    parts: Sequence[str],
    output_dir: str | os.PathLike | None,
    make_samples: Callable[[str], list[Sample]],
    *,
    force: bool = False,
    sample_rate: int | None = 16_000,
    verify: bool = False,
    on_error: str = "raise",
    empty_text: str = "error",
    num_jobs: int = 1,
    progress: bool = True,
    inputs: Callable[[str], Iterable[str]] | None = None,
    settings: Mapping[str, Any] | None = None,
    executor: Any = None,
    step: Any = None,
) -> PreparedParts:
    """Write (or reuse) one ``samples`` manifest per part; return ``{part: manifest}``.

    Per part: the samples (``make_samples``), the empty-transcript policy, the optional
    verification, then the manifest and, beside it, a record of what it was made from
    (:func:`~speechpipe.recipes._checks.record_path`: file count, bytes, newest mtime, a
    digest of ``(path, size, mtime)`` of the part's input files and of every audio file it
    names, and the options). A rerun whose inputs and options are unchanged reuses the
    manifest ("up to date", nothing read but file metadata); when they changed, or there is
    no record, the part is **rewritten** and its report says why (we rewrite rather than
    refuse: the manifest is derived data, and the old one is replaced atomically only once
    the new one is complete). ``force`` rewrites anyway. With ``output_dir`` ``None`` nothing
    is written and the values are the sample lists themselves. A part with no utterance left
    is a :class:`~speechpipe.errors.DataError` (no empty manifest).

    Args:
        corpus: corpus name in the file names.
        parts: the parts, in order.
        output_dir: manifest folder (created), or ``None``.
        make_samples: builds the samples of one part (validating its layout).
        force: rebuild parts whose manifest is up to date.
        sample_rate: the rate the recipe pipelines resample to (16 kHz for ASR); the report
            counts the utterances at each rate and says which are resampled when read.
        verify: decode every audio file once (``num_jobs`` threads, or ``executor``, a
            progress bar) and find missing, corrupt, truncated, empty and non-finite files.
        on_error: what verification does with them: ``"raise"`` a
            :class:`~speechpipe.errors.DataError` with counts and examples per problem, or
            ``"skip"``: leave them out of the manifest, counted in the report.
        empty_text: empty transcripts: ``"error"`` (default), ``"skip"`` or ``"keep"``
            (:data:`~speechpipe.recipes._checks.EMPTY_TEXT`), counted in the report.
        num_jobs, progress: threads (reading headers; decoding, without ``executor``) and
            progress bars.
        inputs: the files a part is read from besides its audio (transcripts, tables, or
            the whole part folder), for the record.
        settings: the recipe's own options that change the manifest (recorded too).
        executor: where the verification decodes: any
            :class:`concurrent.futures.Executor` or a Dask ``distributed.Client``
            (:func:`~speechpipe.recipes._checks.verify_audio`); the result is the same.
        step: the verification as a job array (:mod:`~speechpipe.recipes._jobs`): ``"plan"``
            writes each part's plan, ``(i, n)`` decodes task ``i``'s share of it, ``"merge"``
            gathers the tasks' results and does what one run does with them (the same
            manifest, report, or error). ``None``: all in this call.

    Returns:
        :class:`PreparedParts`: the ``{part: manifest}`` dict with ``.reports``.

    >>> import tempfile
    >>> out = tempfile.mkdtemp()
    >>> calls = []
    >>> make = lambda part: calls.append(part) or [{"key": "u1", "duration": 1.0}]
    >>> first = prepare_parts("toy", ["a"], out, make)
    >>> again = prepare_parts("toy", ["a"], out, make)
    >>> first["a"].name, calls, again.reports["a"].status
    ('toy_samples_a.jsonl.gz', ['a'], 'up to date')
    """
    check_empty_text(empty_text)
    check_on_error(on_error)
    step = check_step(step)
    if sample_rate is not None and (isinstance(sample_rate, bool) or not isinstance(
            sample_rate, int) or sample_rate < 1):
        raise ValueError(f"sample_rate must be an int >= 1 (Hz) or None, got {sample_rate!r}")
    if step is not None and (not verify or output_dir is None):
        raise ValueError(f"{step_name(step)} shares out the verification of a prepare writing "
                         "manifests: pass verify=True (--verify) and an output folder")
    if executor is not None and not verify:
        raise ValueError("executor= decodes the files of the verification: pass verify=True "
                         "(--verify) with it")
    options = {"empty_text": empty_text, "verify": bool(verify), "on_error": on_error,
               **dict(settings or {})}
    result = PreparedParts()
    result.reports, result.steps = {}, {}
    if output_dir is not None:
        Path(output_dir).mkdir(parents=True, exist_ok=True)
    for part in parts:
        path = None if output_dir is None else manifest_path(output_dir, corpus, part)
        stage = f"prepare_{corpus} {part}"
        if step not in (None, "plan") and plan_path(output_dir, corpus, part).exists():
            planned = _planned_part(output_dir, corpus, part, stage, step, settings,
                                    num_jobs=num_jobs, progress=progress, executor=executor)
            if isinstance(step, tuple):
                result[part], result.steps[part] = planned
                continue
            plan, checks = planned
            _write_part(result, part, path, plan.samples, plan.diagnostics(stage),
                        list(plan.faults), plan.inputs, plan.reason, stage=stage,
                        corpus=corpus, verify=True, checks=checks, options=options,
                        sample_rate=sample_rate)
            remove_job_files(output_dir, corpus, part)
            continue
        extra = list(inputs(part)) if inputs is not None and path is not None else []
        reason = ""
        if path is not None and path.exists():
            up_to_date, reason = _up_to_date(path, extra, options)
            if up_to_date and not force:
                log.info("%s %s: up to date, %s", corpus, part, path)
                if step == "plan":
                    remove_job_files(output_dir, corpus, part)
                if step not in (None, "merge"):  # (a merge reports it as one run does)
                    result.steps[part] = "up to date: nothing to verify"
                result[part] = path
                report = PartReport.from_record(part, str(path), read_record(path) or {})
                report.target_sample_rate = sample_rate
                result.reports[part] = report
                continue
            reason = "--force" if up_to_date else reason
        if step not in (None, "plan"):
            raise MissingDataError(_no_plan(corpus, part), source=str(
                plan_path(output_dir, corpus, part)))
        samples, diagnostics, faults = _collect(part, make_samples, stage, verify)
        if step == "plan":
            remove_job_files(output_dir, corpus, part)
            plan = VerifyPlan(corpus, part, samples, dict(settings or {}), reason,
                              dict(diagnostics.counts), {k: list(v) for k, v in
                                                         diagnostics.examples.items()},
                              list(faults or []), extra)
            result[part] = plan_path(output_dir, corpus, part)
            plan.write(result[part])
            result.steps[part] = (f"planned: {len(plan.paths)} audio file(s) to verify, "
                                  f"{result[part]}")
            continue
        _write_part(result, part, path, samples, diagnostics, faults, extra, reason,
                    stage=stage, corpus=corpus, verify=verify, options=options,
                    sample_rate=sample_rate, num_jobs=num_jobs, progress=progress,
                    executor=executor)
    return result


def _collect(part: str, make_samples: Callable[[str], list[Sample]], stage: str,
             verify: bool) -> tuple[list[Sample], Diagnostics, list | None]:
    """A part's samples, with what finding them left out (counted) and, when verifying, the
    faults found (reported with every other at the end)."""
    diagnostics = Diagnostics(stage)
    # --verify: every fault of every kind is collected, then reported at once
    faults: list | None = [] if verify else None
    token = _DIAGNOSTICS.set(diagnostics)  # check_pairs counts into it
    verifying = VERIFYING.set(bool(verify))  # measure_audio leaves bad files to verify
    collecting = _FAULTS.set(faults)
    try:
        samples = make_samples(part)
    finally:
        _DIAGNOSTICS.reset(token)
        VERIFYING.reset(verifying)
        _FAULTS.reset(collecting)
    return samples, diagnostics, faults


def _write_part(result: PreparedParts, part: str, path: Path | None, samples: list[Sample],
                diagnostics: Diagnostics, faults: list | None, extra: list[str], reason: str,
                *, stage: str, corpus: str, verify: bool, options: Mapping[str, Any],
                sample_rate: int | None, checks: Mapping | None = None, num_jobs: int = 1,
                progress: bool = False, executor: Any = None) -> None:
    """The empty-transcript policy, the verification (``checks``: its tasks' results, else
    decoded here), then every fault at once or the manifest and its record."""
    samples, kept_empty = apply_empty_text(samples, options["empty_text"], stage=stage,
                                           diagnostics=diagnostics, faults=faults)
    if verify:
        if checks is None:
            checks = verify_audio([s[AUDIO_PATH] for s in samples if AUDIO_PATH in s],
                                  num_jobs=num_jobs, progress=progress, desc=f"verify {part}",
                                  executor=executor)
        samples = apply_verification(samples, checks, options["on_error"], stage=stage,
                                     diagnostics=diagnostics, faults=faults)
    if faults:
        summary = PartReport.of(part, None, samples, diagnostics, sample_rate, kept_empty)
        summary.status = "not written"
        raise DataError(_faults_message(faults, summary), source=stage)
    if not samples:
        raise DataError(f"{corpus} part {part!r}: no utterance left to write "
                        f"({diagnostics.report()})")
    report = PartReport.of(part, None if path is None else str(path), samples,
                           diagnostics, sample_rate, kept_empty)
    result.reports[part] = report
    if path is None:
        result[part] = samples
        return
    count = write_manifest(path, samples)
    write_manifest_table(path)  # the mapped rows training plans from (compact.py)
    if reason:
        report.status, report.reason = "rewritten", reason
    record = report.to_record(fingerprint(extra + _audio_paths(samples)), options)
    _write_json(record_path(path), record)
    log.info("%s %s: wrote %d utterances to %s", corpus, part, count, path)
    result[part] = path


def _planned_part(output_dir, corpus: str, part: str, stage: str, step: Any,
                  settings: Mapping[str, Any] | None, **verifying: Any) -> tuple:
    """A task of a job array: ``(its result file, a line saying what it did)``; the merge:
    ``(the plan, every file's check)``."""
    plan = VerifyPlan.read(plan_path(output_dir, corpus, part))
    if step == "merge":
        now = dict(settings or {})
        if plan.settings != now:
            changed = ", ".join(f"{k}={plan.settings.get(k)!r} (this merge: {now.get(k)!r})"
                                for k in sorted(set(plan.settings) | set(now))
                                if plan.settings.get(k) != now.get(k))
            raise ValueError(f"{stage}: the verification plan was made with {changed}: merge "
                             "with the plan's options, or plan again")
        return plan, read_task_checks(output_dir, plan, stage)
    task, tasks = step
    out = task_path(output_dir, corpus, part, task, tasks)
    paths = plan.paths[task - 1::tasks]
    if out.exists():  # done already (a rerun of a finished task)
        return out, f"task {task}/{tasks}: {len(paths)} audio file(s) verified already, {out}"
    checks = verify_audio(paths, desc=f"verify {part} {task}/{tasks}", **verifying)
    write_task_result(out, plan, task, tasks, [checks[p] for p in paths])
    bad = sum(check.problem is not None for check in checks.values())
    return out, (f"task {task}/{tasks}: {len(paths)} audio file(s) verified, {bad} with a "
                 f"fault (reported by --merge), {out}")


def _no_plan(corpus: str, part: str) -> str:
    return (f"no verification plan for {corpus} part {part!r} and its manifest is not up to "
            f"date: run 'speechpipe prepare {corpus} ... --verify --plan-only' first, then "
            "the tasks (--task I/N), then --merge")


#: Where :func:`check_pairs` counts what it leaves out while :func:`prepare_parts` builds a
#: part (so that every recipe's skips reach the part's report without being passed along).
_DIAGNOSTICS: contextvars.ContextVar[Diagnostics | None] = contextvars.ContextVar(
    "speechpipe_prepare_diagnostics", default=None)


#: The faults :func:`prepare_parts` collects while it verifies a part (``None``: not
#: verifying): ``(what, count, examples, flag)``, reported together at the end.
_FAULTS: contextvars.ContextVar[list | None] = contextvars.ContextVar(
    "speechpipe_prepare_faults", default=None)


def _faults_message(faults: list, summary: PartReport) -> str:
    """Every fault of a verified part, with its count, examples and the flag that would skip
    it; then the summary of the utterances without a fault."""
    total = sum(count for _, count, _, _ in faults)
    lines = [f"verification found {total} fault(s) of {len(faults)} kind(s):"]
    for what, count, examples, flag in faults:
        lines.append(f"  {what}: {count} (e.g. {'; '.join(examples)}) -- "
                     + (f"to leave them out, counted: {flag}" if flag else
                        "no option leaves them out: fix them"))
    flags = list(dict.fromkeys(flag.split(" (")[0] for _, _, _, flag in faults if flag))
    fixed = sum(count for _, count, _, flag in faults if not flag)
    lines.append(f"Fix the corpus{', or rerun with ' + ' '.join(flags) if flags else ''}"
                 + (f" (the {fixed} fault(s) no option leaves out must be fixed)"
                    if fixed and flags else "") + ". Without them:")
    lines.extend("  " + line for line in summary.report().splitlines())
    return "\n".join(lines)


def collected_faults() -> list | None:
    """The list :func:`prepare_parts` collects the faults of a verified part in (``None``
    when not verifying): a recipe adds ``(what, count, examples, flag or None)`` to it
    instead of raising at the first one."""
    return _FAULTS.get()


#: Whether :func:`prepare_parts` verifies the part being built (then :func:`measure_audio`
#: leaves unreadable headers to the verification, which counts them all).
VERIFYING: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "speechpipe_prepare_verifying", default=False)


def files_under(folder: str | os.PathLike, *, recursive: bool = True) -> list[str]:
    """The files in ``folder`` (and below, if ``recursive``), absolute: a part's inputs."""
    base = Path(folder).resolve()
    found = base.rglob("*") if recursive else base.iterdir()
    ours = (".jsonl.gz", ".prepared.json", ".tmp")  # manifests written into the folder itself
    return [str(p) for p in found if p.is_file() and not p.name.endswith(ours)]


def _audio_paths(samples: Iterable[Mapping[str, Any]]) -> list[str]:
    return [s[AUDIO_PATH] for s in samples if isinstance(s.get(AUDIO_PATH), str)]


def _up_to_date(path: Path, extra: list[str], options: Mapping[str, Any]) -> tuple[bool, str]:
    """Whether the manifest at ``path`` was made from these inputs with these options, and
    if not, why."""
    record = read_record(path)
    if record is None:
        return False, "no record of what it was made from"
    old = record.get("options") or {}
    if old != dict(options):
        changed = ", ".join(f"{k} {old.get(k)!r} -> {options.get(k)!r}"
                            for k in sorted(set(old) | set(options))
                            if old.get(k) != options.get(k))
        return False, f"options changed: {changed}"
    from ..pipes.sources import read_manifest

    try:
        listed = _audio_paths(read_manifest(path))
    except (OSError, ValueError) as exc:
        return False, f"the manifest cannot be read ({exc})"
    now = fingerprint(extra + listed)
    if now["digest"] != record.get("inputs", {}).get("digest"):
        return False, f"the corpus changed: {changed_inputs(record.get('inputs', {}), now)}"
    return True, ""


def _write_json(path: Path, value: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(value, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def check_prepare_args(on_mismatch: str, num_jobs: int) -> None:
    if on_mismatch not in ON_MISMATCH:
        raise ValueError(f"on_mismatch must be one of {ON_MISMATCH}, got {on_mismatch!r}")
    if not isinstance(num_jobs, int) or num_jobs < 1:
        raise ValueError(f"num_jobs must be an int >= 1, got {num_jobs!r}")



ManifestsArg = Any  # a path, paths, sample dicts, or prepare_*'s {part: manifest}


def resolve_manifests(
    manifests: ManifestsArg, *, corpus: str | None = None, parts: Sequence[str] | None = None
) -> list:
    """Turn the ``manifests`` argument of a pipeline builder into a list of sources.

    Accepted forms: a manifest path; a list of paths; a list of sample dicts (in memory);
    the ``{part: manifest}`` dict that ``prepare_<corpus>`` returns (restricted to ``parts``
    if given); a folder of manifests, read as ``{corpus}_samples_{part}.jsonl.gz`` for each
    of ``parts``. The result is a list of paths (``str``) and sample lists.

    Raises:
        MissingDataError: a part's manifest is missing from the folder (the message says
            which ``speechpipe prepare`` to run).
        ValueError: a part not in the dict.

    >>> resolve_manifests({"a": "m_a.jsonl.gz", "b": "m_b.jsonl.gz"}, parts=["b"])
    ['m_b.jsonl.gz']
    """
    if isinstance(manifests, Mapping):
        names = list(manifests) if parts is None else list(parts)
        missing = [p for p in names if p not in manifests]
        if missing:
            raise ValueError(f"no manifest for part(s) {missing}; have {list(manifests)}")
        return [_one_source(manifests[p]) for p in names]
    if isinstance(manifests, (str, os.PathLike)):
        if os.path.isdir(manifests):
            if corpus is None or parts is None:
                raise ValueError("a manifest folder needs corpus and parts to pick the files")
            out = []
            for p in parts:
                path = manifest_path(manifests, corpus, p)
                if not path.exists():
                    raise MissingDataError(_missing_part(manifests, corpus, p),
                                           source=str(path))
                out.append(str(path))
            return out
        return [os.fspath(manifests)]
    items = list(manifests)
    if items and all(isinstance(s, Mapping) for s in items):
        return [items]
    return [_one_source(m) for m in items]


def _missing_part(folder: str | os.PathLike, corpus: str, part: str) -> str:
    """Why a folder has no manifest for ``part``: the parts it has (a typo is then plain),
    else the ``speechpipe prepare`` to run.

    >>> import tempfile
    >>> d = tempfile.mkdtemp()
    >>> _ = open(manifest_path(d, "librispeech", "train-clean-100"), "w").close()
    >>> print(_missing_part(d, "librispeech", "train-clean100"))
    no librispeech manifest for part 'train-clean100'; this folder has part(s) \
['train-clean-100'] (a typo?); to make it, run 'speechpipe prepare librispeech <corpus_dir> \
... --parts train-clean100'
    """
    prefix, suffix = f"{corpus}_samples_", ".jsonl.gz"
    have = sorted(name[len(prefix):-len(suffix)] for name in os.listdir(folder)
                  if name.startswith(prefix) and name.endswith(suffix))
    there = f"this folder has part(s) {have} (a typo?); to make it, " if have else ""
    return (f"no {corpus} manifest for part {part!r}; {there}run 'speechpipe prepare {corpus} "
            f"<corpus_dir> {os.fspath(folder)} --parts {part}'")


def _one_source(m: Any) -> Any:
    if isinstance(m, (str, os.PathLike)):
        return os.fspath(m)
    if isinstance(m, list) and all(isinstance(s, Mapping) for s in m):
        return m
    raise TypeError(f"a manifest must be a path or a list of sample dicts, got {m!r}")

