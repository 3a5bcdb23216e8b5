"""Prepare a corpus's manifests: parts, transcript/audio pairing, durations, manifest files.

One manifest kind, ``samples``: a gzipped JSON-lines file per part,
``{corpus}_samples_{part}.jsonl.gz`` (:func:`manifest_path`), one line per utterance::

    {"audio_path": "/data/LibriSpeech/dev-clean/1272/128104/1272-128104-0000.flac",
     "duration": 5.855, "key": "1272-128104-0000", "sample_rate": 16000,
     "speaker": "1272", "text": "MISTER QUILTER IS THE APOSTLE ..."}

with ``offset`` (seconds) when the utterance is a segment of a longer recording, and the
corpus's extra fields (``chapter``, ``normalized_text``, ``feats_path``...). Read it back with
:func:`~speechpipe.pipes.manifests.read_manifest` or feed it to the pipelines of
:mod:`speechpipe.recipes._pipelines`; ``speechpipe pack --manifest`` packs it into shards.
:func:`prepare_parts` skips parts whose manifest exists (manifests are written to a temporary
name and renamed when complete, so an existing one is a finished one), :func:`check_pairs`
reports audio without transcript and transcripts without audio under an explicit policy
(``on_mismatch="error"`` raises a :class:`~speechpipe.errors.DataError` with counts and
examples, ``"skip"`` leaves them out, counted and warned about -- never silently), and
:func:`measure_audio` reads durations with ``soundfile.info`` on ``num_jobs`` threads.
:func:`resolve_manifests` turns what a pipeline builder is given (paths, a folder, sample
lists, ``prepare_<corpus>``'s result) into the manifests to read.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import soundfile

from ..diagnostics import Diagnostics, SkippedInputWarning
from ..errors import DataError, MissingDataError
from ..pipes.manifests import write_manifest
from ..sample import Sample

__all__ = [
    "AUDIO_PATH",
    "FEATS_PATH",
    "MANIFEST_KIND",
    "OFFSET",
    "ON_MISMATCH",
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


def _as_names(value: str | Iterable[str], arg: str) -> list[str]:
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
    names = _as_names(parts, "parts")
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
        diagnostics = Diagnostics(stage)
    if not without_text and not without_audio:
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


def _info(path: str) -> tuple[int, int]:
    try:
        info = soundfile.info(path)
    except (soundfile.LibsndfileError, RuntimeError, TypeError, ValueError) as exc:
        if not os.path.exists(path):
            raise MissingDataError("audio file not found", source=path) from exc
        raise DataError(f"cannot read audio header: {exc}", source=path) from exc
    return int(info.frames), int(info.samplerate)


def measure_audio(
    paths: Sequence[str], *, num_jobs: int = 1, progress: bool = True, desc: str = "measure"
) -> list[tuple[int, int]]:
    """``(frames, sample_rate)`` of each audio file, from its header (``soundfile.info``).

    With ``num_jobs > 1`` the headers are read on that many threads (libsndfile releases the
    GIL; the work is I/O bound). The order of the result is the order of ``paths``.

    Raises:
        MissingDataError / DataError: a file is absent / unreadable (naming it).

    >>> import os, tempfile, numpy as np
    >>> p = os.path.join(tempfile.mkdtemp(), "a.flac")
    >>> soundfile.write(p, np.zeros(800, np.float32), 16000)
    >>> measure_audio([p], progress=False)
    [(800, 16000)]
    """
    from ..progress import progress_bar

    if not isinstance(num_jobs, int) or num_jobs < 1:
        raise ValueError(f"num_jobs must be an int >= 1, got {num_jobs!r}")
    with progress_bar(total=len(paths), desc=desc, unit="files", disable=not progress,
                      leave=False) as bar:
        if num_jobs == 1:
            out = []
            for p in paths:
                out.append(_info(p))
                bar.update(1)
            return out
        with concurrent.futures.ThreadPoolExecutor(num_jobs) as pool:
            out = []
            for item in pool.map(_info, paths):
                out.append(item)
                bar.update(1)
            return out


def prepare_parts(
    corpus: str,
    parts: Sequence[str],
    output_dir: str | os.PathLike | None,
    make_samples: Callable[[str], list[Sample]],
    *,
    force: bool = False,
) -> dict[str, Path | list[Sample]]:
    """Write (or reuse) one ``samples`` manifest per part; return ``{part: manifest}``.

    A part whose manifest exists is reused without reading its corpus folder again (unless
    ``force``); :func:`~speechpipe.pipes.manifests.write_manifest` writes to a temporary name
    and renames when complete, so an existing manifest is a finished one. With ``output_dir``
    ``None`` nothing is written and the values are the sample lists themselves. A part with
    no utterance left is a :class:`~speechpipe.errors.DataError` (no empty manifest).

    Args:
        corpus: corpus name in the file names.
        parts: the parts, in order.
        output_dir: manifest folder (created), or ``None``.
        make_samples: builds the samples of one part (validating its layout).
        force: rebuild parts whose manifest exists.

    >>> import tempfile
    >>> out = tempfile.mkdtemp()
    >>> calls = []
    >>> make = lambda part: calls.append(part) or [{"key": "u1", "duration": 1.0}]
    >>> first = prepare_parts("toy", ["a"], out, make)
    >>> again = prepare_parts("toy", ["a"], out, make)
    >>> first["a"].name, calls
    ('toy_samples_a.jsonl.gz', ['a'])
    """
    result: dict[str, Path | list[Sample]] = {}
    if output_dir is not None:
        Path(output_dir).mkdir(parents=True, exist_ok=True)
    for part in parts:
        path = None if output_dir is None else manifest_path(output_dir, corpus, part)
        if path is not None and path.exists() and not force:
            log.info("%s %s: reusing %s", corpus, part, path)
            result[part] = path
            continue
        samples = make_samples(part)
        if not samples:
            raise DataError(f"{corpus} part {part!r}: no utterance left to write (each one "
                            "lacked audio or a transcript)")
        if path is None:
            result[part] = samples
            continue
        count = write_manifest(path, samples)
        log.info("%s %s: wrote %d utterances to %s", corpus, part, count, path)
        result[part] = path
    return result


def _check_prepare_args(on_mismatch: str, num_jobs: int) -> None:
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
                    raise MissingDataError(
                        f"no {corpus} manifest for part {p!r}; run 'speechpipe prepare "
                        f"{corpus} <corpus_dir> {os.fspath(manifests)} --parts {p}'",
                        source=str(path),
                    )
                out.append(str(path))
            return out
        return [os.fspath(manifests)]
    items = list(manifests)
    if items and all(isinstance(s, Mapping) for s in items):
        return [items]
    return [_one_source(m) for m in items]


def _one_source(m: Any) -> Any:
    if isinstance(m, (str, os.PathLike)):
        return os.fspath(m)
    if isinstance(m, list) and all(isinstance(s, Mapping) for s in m):
        return m
    raise TypeError(f"a manifest must be a path or a list of sample dicts, got {m!r}")

