"""``prepare --verify`` as a job array: a plan, tasks that decode their share of the files, a
merge that reports exactly what one run reports.

Decoding every file once is the slow part of preparing a corpus (an Opus or MP3 source
decodes at a few hundred times real time per core: days for 10,000 hours on one core), so it
is shared out as Kaldi's ``queue.pl JOB=1:N`` or SLURM's ``--array`` share out work:

- ``step="plan"`` (CLI ``--plan-only``): per part, the samples the recipe finds (transcripts
  paired with audio, headers read) and the faults found while finding them, written to
  ``<out>/<corpus>_verify_<part>.plan.jsonl.gz`` (:class:`VerifyPlan`; the same corpus and
  options give the same file);
- ``step=(i, n)`` (CLI ``--task i/N``): decode every ``n``-th distinct audio file of the plan,
  starting at the ``i``-th, and write what each decoding found to
  ``<out>/<corpus>_verify_<part>.task-<i>-of-<n>.jsonl.gz`` (renamed into place when complete:
  a task killed midway leaves no result, and is simply run again; a task whose result is there
  does nothing);
- ``step="merge"`` (CLI ``--merge``): every task's result, checked against the plan (a task
  that has not run is named), then the empty-transcript policy, the verification and the
  manifest exactly as one run (the same report, the same error listing every fault of every
  kind, the same exit status); the plan and the task results are then removed.

``empty_text`` and ``on_error`` are applied by the merge (a merge that reports faults can be
run again with ``--on-error skip`` without decoding anything again); the recipe's own options
(``on_mismatch``...) are the plan's, and a merge given others is refused.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..diagnostics import Diagnostics
from ..errors import DataError, MissingDataError
from ..sample import Sample
from ._checks import AudioCheck

__all__ = ["VerifyPlan", "check_step", "plan_path", "read_task_checks", "remove_job_files",
           "step_name", "task_path", "write_task_result"]

_PLAN_KIND = "speechpipe prepare --verify plan"
_RESULT_KIND = "speechpipe prepare --verify task"
_VERSION = 1


def check_step(step: Any) -> Any:
    """``step`` if it is ``None``, ``"plan"``, ``"merge"`` or a task ``(i, n)`` with
    ``1 <= i <= n``.

    >>> check_step((2, 3)), check_step("merge")
    ((2, 3), 'merge')
    """
    if step is None or step in ("plan", "merge"):
        return step
    if (isinstance(step, tuple) and len(step) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) for v in step)
            and 1 <= step[0] <= step[1]):
        return step
    raise ValueError(f"step must be None, 'plan', 'merge' or a task (i, n) with 1 <= i <= n, "
                     f"got {step!r}")


def step_name(step: Any) -> str:
    """The CLI flag of a step, for messages: ``--plan-only``, ``--task 2/3``, ``--merge``."""
    if step == "plan":
        return "--plan-only"
    if step == "merge":
        return "--merge"
    return f"--task {step[0]}/{step[1]}"


def plan_path(output_dir: str | os.PathLike, corpus: str, part: str) -> Path:
    """``<output_dir>/<corpus>_verify_<part>.plan.jsonl.gz``."""
    return Path(output_dir) / f"{corpus}_verify_{part}.plan.jsonl.gz"


def task_path(output_dir: str | os.PathLike, corpus: str, part: str, task: int,
              tasks: int) -> Path:
    """``<output_dir>/<corpus>_verify_<part>.task-<task>-of-<tasks>.jsonl.gz``.

    >>> task_path("m", "librispeech", "dev-clean", 2, 3).name
    'librispeech_verify_dev-clean.task-2-of-3.jsonl.gz'
    """
    return Path(output_dir) / f"{corpus}_verify_{part}.task-{task}-of-{tasks}.jsonl.gz"


def _task_files(output_dir: str | os.PathLike, corpus: str, part: str) -> list[Path]:
    prefix = f"{corpus}_verify_{part}.task-"
    return sorted(p for p in Path(output_dir).glob(f"{prefix}*-of-*.jsonl.gz")
                  if p.name[len(prefix):-len(".jsonl.gz")].replace("-of-", "").isdigit())


def remove_job_files(output_dir: str | os.PathLike, corpus: str, part: str) -> None:
    """Remove a part's plan and task results (after its merge, or before a new plan)."""
    for path in [plan_path(output_dir, corpus, part), *_task_files(output_dir, corpus, part)]:
        path.unlink(missing_ok=True)


def _json_value(value: Any) -> Any:
    if hasattr(value, "item"):  # numpy scalars: written as numbers, as write_manifest does
        return value.item()
    raise TypeError(f"not JSON: {value!r}")


def _write_lines(path: Path, head: Mapping[str, Any], rows: Sequence[Any]) -> None:
    """A gzipped JSON-lines file, ``head`` first, written to a temporary name and renamed."""
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw,
                                                     mtime=0) as out:
            for row in (head, *rows):
                out.write(json.dumps(row, sort_keys=True, default=_json_value).encode(
                    "ascii") + b"\n")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _read_lines(path: Path, kind: str) -> tuple[dict, list]:
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        raise
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise DataError(f"not a readable {kind} file: {exc}", source=str(path)) from exc
    rows = []
    for n, line in enumerate(lines, 1):
        try:
            rows.append(json.loads(line))
        except ValueError as exc:
            raise DataError(f"line {n} is not JSON: {exc}", source=str(path)) from exc
    if not rows or not isinstance(rows[0], dict) or rows[0].get("kind") != kind \
            or rows[0].get("version") != _VERSION:
        raise DataError(f"not a {kind} file of version {_VERSION}", source=str(path))
    return rows[0], rows[1:]


def _digest(paths: Sequence[str]) -> str:
    return hashlib.sha256("\n".join(paths).encode("utf-8", "surrogatepass")).hexdigest()


@dataclass
class VerifyPlan:
    """What the tasks of a part's verification decode, and what the merge needs besides.

    Attributes:
        corpus, part: the part.
        samples: every sample the recipe found (before the empty-transcript policy).
        paths: the distinct audio files to decode, in sample order.
        settings: the recipe's options that changed the samples (``on_mismatch``...).
        reason: why the manifest is rewritten (``""``: it is new).
        skipped, examples: what finding the samples left out (``on_mismatch="skip"``).
        faults: what finding them found, reported by the merge with the rest.
        inputs: the part's input files besides its audio (for the manifest's record).
    """

    corpus: str
    part: str
    samples: list[Sample]
    settings: dict[str, Any] = field(default_factory=dict)
    reason: str = ""
    skipped: dict[str, int] = field(default_factory=dict)
    examples: dict[str, list[str]] = field(default_factory=dict)
    faults: list = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)

    @property
    def paths(self) -> list[str]:
        return list(dict.fromkeys(s["audio_path"] for s in self.samples if "audio_path" in s))

    @property
    def digest(self) -> str:
        """The sha256 of :attr:`paths`: a task's result belongs to the plan with its digest."""
        return _digest(self.paths)

    def diagnostics(self, stage: str) -> Diagnostics:
        """A :class:`~speechpipe.diagnostics.Diagnostics` holding :attr:`skipped`."""
        found = Diagnostics(stage)
        found.counts = Counter(self.skipped)
        found.examples = {k: list(v) for k, v in self.examples.items()}
        return found

    def write(self, path: Path) -> None:
        head = {"kind": _PLAN_KIND, "version": _VERSION, "corpus": self.corpus,
                "part": self.part, "settings": self.settings, "reason": self.reason,
                "skipped": self.skipped, "examples": self.examples,
                "faults": [list(f) for f in self.faults], "inputs": self.inputs,
                "files": len(self.paths), "digest": self.digest}
        _write_lines(path, head, self.samples)

    @classmethod
    def read(cls, path: Path) -> "VerifyPlan":
        """Raises: :class:`~speechpipe.errors.DataError` for a file that is not a plan."""
        head, samples = _read_lines(path, _PLAN_KIND)
        plan = cls(head["corpus"], head["part"], samples, head["settings"], head["reason"],
                   head["skipped"], head["examples"], [tuple(f) for f in head["faults"]],
                   head["inputs"])
        if plan.digest != head["digest"]:
            raise DataError("the plan's samples do not match its header (edited?): plan "
                            "again", source=str(path))
        return plan


def write_task_result(path: Path, plan: VerifyPlan, task: int, tasks: int,
                      checks: Sequence[AudioCheck]) -> None:
    """Write what task ``task`` of ``tasks`` found decoding its share of ``plan``."""
    head = {"kind": _RESULT_KIND, "version": _VERSION, "plan": plan.digest, "task": task,
            "tasks": tasks, "files": len(checks)}
    _write_lines(path, head, [[c.path, c.problem, c.detail, c.sample_rate] for c in checks])


def read_task_checks(output_dir: str | os.PathLike, plan: VerifyPlan, stage: str
                     ) -> dict[str, AudioCheck]:
    """``{path: AudioCheck}`` of every file of ``plan``, from its tasks' results.

    Raises:
        MissingDataError: a file of the plan that no task has decoded, naming the task(s) to
            run (``--task i/N``) and where their results go.
    """
    paths = plan.paths
    digest = plan.digest
    found: dict[str, AudioCheck] = {}
    sizes: Counter[int] = Counter()
    for file in _task_files(output_dir, plan.corpus, plan.part):
        head, rows = _read_lines(file, _RESULT_KIND)
        if head.get("plan") != digest:
            continue  # a task of another plan (the corpus changed since): not used
        sizes[head["tasks"]] += 1
        for path, problem, detail, rate in rows:
            found[path] = AudioCheck(path, problem, detail, rate)
    missing = [p for p in paths if p not in found]
    if missing:
        tasks = sizes.most_common(1)[0][0] if sizes else None
        if tasks is None:
            which = "no task has written its result yet"
        else:
            position = {p: j for j, p in enumerate(paths)}
            todo = sorted({position[p] % tasks + 1 for p in missing})
            which = (f"task(s) {', '.join(f'{i}/{tasks}' for i in todo[:10])}"
                     f"{' ...' if len(todo) > 10 else ''} have not written their result "
                     f"({task_path(output_dir, plan.corpus, plan.part, todo[0], tasks)})")
        raise MissingDataError(
            f"{stage}: {len(missing)} of the plan's {len(paths)} audio files are not verified "
            f"yet: {which}. Run the missing task(s) with --task I/N, then merge again",
            source=str(plan_path(output_dir, plan.corpus, plan.part)))
    return found
