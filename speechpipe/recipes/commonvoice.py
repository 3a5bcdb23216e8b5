"""Mozilla Common Voice (scripted speech): prepare manifests of one language, pipelines.

Layout of a release (``cv-corpus-{version}-{date}/{lang}/``, e.g. ``.../en/``)::

    clips/common_voice_en_651325.mp3 ...   # MP3, 48 kHz mono
    train.tsv dev.tsv test.tsv             # the official split (also validated.tsv, other.tsv...)
    clip_durations.tsv                     # since 16.1: clip<TAB>duration[ms]

Clip tables are tab-separated with a header row, read with ``csv.QUOTE_NONE`` (sentences
contain quotes). Current releases have 13 columns (``client_id path sentence_id sentence
sentence_domain up_votes down_votes age gender accents variant locale segment``); releases
before 17.0 have 10 (``client_id path sentence up_votes down_votes age gender accents locale
segment``, ``accent`` in older ones): columns are found by header name.

- :func:`prepare_commonvoice`: ``commonvoice_<lang>_samples_<part>.jsonl.gz`` (``<lang>``: the
  language folder's name, so that languages prepared into one folder stay apart) with ``key`` (the clip
  file's stem), ``audio_path``, ``duration`` (from ``clip_durations.tsv``, else the MP3
  header), ``text`` (``sentence``), ``speaker`` (``client_id``) and, when measured from the
  file, ``sample_rate``;
- :func:`commonvoice_train` / :func:`commonvoice_valid` / :func:`commonvoice_test`: pipelines
  (train on 1-15 s, 80-bin fbank, budget batches).

- :func:`download_commonvoice`: releases are handed out per language by Mozilla after
  accepting its terms, as a link to ``cv-corpus-<version>-<lang>.tar.gz`` (with its sha256
  shown beside it); given that link, the archive is downloaded (resumable, verified) and
  extracted, and the language folder returned.
"""

from __future__ import annotations

import csv
import os
import re
import urllib.parse
from pathlib import Path
from typing import Any, Iterable

from ..errors import DataError, MissingDataError
from ..pipes._core import IterDataPipe
from ..pipes.sources import iter_text_lines
from ..sample import DURATION, KEY, SPEAKER, TEXT
from ._download import download_and_extract
from ._pipelines import eval_pipeline, train_pipeline
from ._prepare import (
    AUDIO_PATH,
    check_prepare_args,
    check_pairs,
    measure_audio,
    prepare_parts,
    resolve_manifests,
    resolve_parts,
)

__all__ = [
    "CLIP_DURATIONS",
    "CORPUS",
    "DURATION_RANGE",
    "PARTS",
    "REQUIRED_COLUMNS",
    "commonvoice_test",
    "commonvoice_train",
    "commonvoice_valid",
    "download_commonvoice",
    "manifest_corpus",
    "prepare_commonvoice",
    "read_clip_durations",
    "read_clip_table",
]

CORPUS = "commonvoice"
PARTS = ("train", "dev", "test")
#: Utterance durations kept for training (seconds).
DURATION_RANGE = (1.0, 15.0)
#: Per-clip durations in milliseconds (releases 16.1 and later).
CLIP_DURATIONS = "clip_durations.tsv"
#: Columns every clip table must have.
REQUIRED_COLUMNS = ("client_id", "path", "sentence")


_ARCHIVE = re.compile(r"(?P<release>cv-corpus-[^/]+)-(?P<lang>[A-Za-z]{2,3}(?:-[A-Za-z0-9]+)*)"
                      r"\.tar(?:\.gz)?")


def download_commonvoice(
    target_dir: str | os.PathLike,
    parts: str | Iterable[str] | None = None,
    force: bool = False,
    *,
    url: str | None = None,
    checksum: str | None = None,
    progress: bool = True,
) -> Path:
    """Download and extract one Common Voice release of one language from the link Mozilla
    gives after its terms are accepted; return the language folder
    (``target_dir/cv-corpus-<version>/<lang>``), which :func:`prepare_commonvoice` reads.

    The archive name (the link's last path component) must be
    ``cv-corpus-<version>-<lang>.tar.gz``; it is downloaded with resume and verified against
    ``checksum`` (the sha256 Mozilla shows beside the link), extracted safely and deleted; a
    marker makes a second call a no-op.

    Args:
        target_dir: download folder.
        parts: not used (an archive holds every split of its language): ``None``.
        force: download again.
        url: the download link (required; signed links expire: ask for a new one if refused).
        checksum: ``"sha256:<hex>"`` (or a bare hex digest); ``None`` skips verification.
        progress: tqdm progress bars.

    Raises:
        ValueError: no ``url``, an archive name that is not a Common Voice release, or parts.
        MissingDataError / DataError: as :func:`~speechpipe.recipes.download_and_extract`,
            and an archive that did not create ``<release>/<lang>/clips``.
    """
    if url is None:
        raise ValueError("pass url=...: the link to cv-corpus-<version>-<lang>.tar.gz that "
                         "Mozilla's Common Voice site gives after accepting its terms")
    if parts is not None:
        raise ValueError("a Common Voice archive holds every split of one language: no parts")
    name = Path(urllib.parse.urlparse(url).path).name
    match = _ARCHIVE.fullmatch(name)
    if match is None:
        raise ValueError(f"{name!r} is not a Common Voice release archive "
                         "(cv-corpus-<version>-<lang>.tar.gz)")
    folder = Path(match["release"]) / match["lang"]
    download_and_extract(url, target_dir, checksum=checksum, force=force, progress=progress,
                         expected=(str(folder / "clips"),))
    return Path(target_dir) / folder


def manifest_corpus(language: str) -> str:
    """The corpus name in a language's manifest file names: ``commonvoice_<language>``.

    >>> manifest_corpus("zh-CN")
    'commonvoice_zh-CN'
    """
    if not isinstance(language, str) or not language or "/" in language:
        raise ValueError(f"a Common Voice language is a folder name such as 'en', got "
                         f"{language!r}")
    return f"{CORPUS}_{language}"


def _manifests(manifests: Any, parts: list[str], language: str | None) -> list:
    """:func:`resolve_manifests` for Common Voice: a manifest folder is read for ``language``,
    which may be left out when the folder holds one language's manifests of ``parts[0]``."""
    if not (isinstance(manifests, (str, os.PathLike)) and os.path.isdir(manifests)):
        return resolve_manifests(manifests, parts=parts)
    if language is None:
        prefix, suffix = f"{CORPUS}_", f"_samples_{parts[0]}.jsonl.gz"
        found = sorted(p.name[len(prefix):-len(suffix)]
                       for p in Path(manifests).glob(f"{prefix}*{suffix}"))
        if len(found) != 1:
            what = f"holds manifests of {found}" if found else "holds no Common Voice manifest"
            raise MissingDataError(
                f"{what} for part {parts[0]!r}: pass language=... (run 'speechpipe prepare "
                f"commonvoice <cv-corpus>/<lang> {os.fspath(manifests)}' first)",
                source=os.fspath(manifests))
        language = found[0]
    return resolve_manifests(manifests, corpus=manifest_corpus(language), parts=parts)


def _tsv_rows(path: Path) -> Iterable[tuple[int, list[str]]]:
    """``(line, fields)`` of a tab-separated file, no quoting; blank lines skipped."""
    with open(path, "rb") as stream:
        lines = iter_text_lines(stream, source=str(path))
        try:
            for number, text in lines:
                if isinstance(text, DataError):
                    raise text
                if number == 1:
                    text = text.lstrip("\ufeff")
                text = text.rstrip("\r\n")
                if not text.strip():
                    continue
                yield number, next(csv.reader([text], delimiter="\t",
                                              quoting=csv.QUOTE_NONE))
        finally:
            lines.close()


def read_clip_table(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The rows of a clip table (``train.tsv``...) as dicts keyed by its header, plus
    ``line`` (the line number).

    Raises:
        DataError: a header without ``client_id``, ``path`` and ``sentence``, a row whose
            field count differs from the header's, an empty ``path``, invalid UTF-8; the
            message names ``file:line``.

    >>> import tempfile
    >>> p = Path(tempfile.mkdtemp()) / "dev.tsv"
    >>> _ = p.write_text('client_id\\tpath\\tsentence\\tup_votes\\n'
    ...                  'c1\\tcommon_voice_en_1.mp3\\tSay "hi"; go.\\t2\\n', encoding="utf-8")
    >>> row = read_clip_table(p)[0]
    >>> row["path"], row["sentence"], row["line"]
    ('common_voice_en_1.mp3', 'Say "hi"; go.', 2)
    """
    path = Path(path)
    rows: list[dict[str, Any]] = []
    header: list[str] | None = None
    for number, fields in _tsv_rows(path):
        if header is None:
            header = fields
            missing = [c for c in REQUIRED_COLUMNS if c not in header]
            if missing:
                raise DataError(f"header lacks column(s) {missing} (a Common Voice clip table "
                                f"has {', '.join(REQUIRED_COLUMNS)}...)", source=str(path),
                                line=number)
            continue
        if len(fields) != len(header):
            raise DataError(f"expected {len(header)} tab-separated fields as in the header, "
                            f"got {len(fields)}", source=str(path), line=number)
        row: dict[str, Any] = dict(zip(header, fields))
        if not row["path"]:
            raise DataError("empty clip path", source=str(path), line=number)
        row["line"] = number
        rows.append(row)
    if header is None:
        raise DataError("empty clip table (no header row)", source=str(path))
    return rows


def read_clip_durations(path: str | os.PathLike) -> dict[str, float]:
    """``{clip file name: seconds}`` from ``clip_durations.tsv`` (``clip<TAB>duration[ms]``).

    Raises:
        DataError: not two fields, or a duration that is not a number of milliseconds;
            naming ``file:line``.

    >>> import tempfile
    >>> p = Path(tempfile.mkdtemp()) / CLIP_DURATIONS
    >>> _ = p.write_text("clip\\tduration[ms]\\ncommon_voice_en_1.mp3\\t2825\\n")
    >>> read_clip_durations(p)
    {'common_voice_en_1.mp3': 2.825}
    """
    path = Path(path)
    out: dict[str, float] = {}
    for number, fields in _tsv_rows(path):
        if len(fields) != 2:
            raise DataError(f"expected 2 tab-separated fields (clip, duration[ms]), got "
                            f"{len(fields)}", source=str(path), line=number)
        if number == 1 and fields[0] == "clip":
            continue
        try:
            ms = float(fields[1])
        except ValueError:
            ms = -1.0
        if not ms >= 0:
            raise DataError(f"bad duration {fields[1]!r} (milliseconds expected)",
                            source=str(path), line=number)
        out[fields[0]] = ms / 1000
    return out


def prepare_commonvoice(
    corpus_dir: str | os.PathLike,
    output_dir: str | os.PathLike | None = None,
    parts: str | Iterable[str] = "auto",
    num_jobs: int = 1,
    *,
    on_mismatch: str = "error",
    force: bool = False,
    progress: bool = True,
    **checks: Any,
) -> dict[str, Any]:
    """Validate the ``train``/``dev``/``test`` tables of one Common Voice language folder and
    write ``commonvoice_<lang>_samples_<part>.jsonl.gz`` for each (``<lang>``: the folder's
    name, e.g. ``en``; see :func:`manifest_corpus`).

    One manifest line per table row, in table order: ``key`` (clip stem), ``audio_path``
    (absolute), ``duration`` (seconds: ``clip_durations.tsv`` when present and listing the
    clip, else the MP3 header, which also gives ``sample_rate``), ``text`` (``sentence``, as
    written), ``speaker`` (``client_id``), and ``age``, ``gender``, ``accents`` (or
    ``accent``) and ``locale`` when the table has them. Parts whose manifest exists are reused.

    Clips not listed in a split's table are not a mismatch (they belong to ``validated``,
    ``other``... tables); a row whose clip is absent from ``clips/`` is.

    A clip is a whole file (no ``offset``): the pipelines read it to its end and replace
    ``duration`` by the decoded length, so a ``clip_durations.tsv`` value that another decoder
    rounded differently only serves the duration filter and the batch budget.

    Args:
        corpus_dir: the language folder (``cv-corpus-<version>/<lang>``).
        output_dir: manifest folder; ``None`` returns the sample lists instead of paths.
        parts: ``"auto"`` (every table present), a part name or several.
        num_jobs: threads reading MP3 headers.
        on_mismatch: rows whose clip file is absent: ``"error"`` raises a
            :class:`~speechpipe.errors.DataError` with the count and examples; ``"skip"``
            leaves them out, counted in a :class:`~speechpipe.diagnostics.SkippedInputWarning`.
        force: rebuild manifests that exist.
        progress: tqdm progress bars.
        **checks: ``sample_rate`` (16000), ``verify`` (False), ``on_error`` ("raise"),
            ``empty_text`` ("error"): see :func:`~speechpipe.recipes.prepare_parts`.

    Raises:
        MissingDataError: ``corpus_dir``, ``clips/`` or a requested table is absent (named).
        DataError: a malformed table line or header, a repeated clip in a table, a bad
            ``clip_durations.tsv`` line, an unreadable MP3 header, a mismatch under ``"error"``.
    """
    check_prepare_args(on_mismatch, num_jobs)
    root = Path(corpus_dir)
    if not root.is_dir():
        raise MissingDataError("Common Voice language folder not found", source=str(root))
    clips = root / "clips"
    if not clips.is_dir():
        raise MissingDataError("the clips/ folder is missing (is this a Common Voice "
                               "cv-corpus-<version>/<lang> folder?)", source=str(clips))
    names = resolve_parts(parts, PARTS, lambda p: (root / f"{p}.tsv").is_file(), corpus=CORPUS,
                          corpus_dir=root, where=lambda p: str(root / f"{p}.tsv"))
    cache: dict[str, dict[str, float]] = {}

    def durations() -> dict[str, float]:
        if "d" not in cache:
            table = root / CLIP_DURATIONS
            cache["d"] = read_clip_durations(table) if table.is_file() else {}
        return cache["d"]

    return prepare_parts(
        manifest_corpus(root.name), names, output_dir,
        lambda part: _part_samples(root, part, durations(), num_jobs=num_jobs,
                                   on_mismatch=on_mismatch, progress=progress),
        force=force, num_jobs=num_jobs, progress=progress,
        settings={"on_mismatch": on_mismatch}, **checks,
    )


_EXTRA = ("age", "gender", "accents", "accent", "locale")


def _part_samples(root: Path, part: str, durations: dict[str, float], *, num_jobs: int,
                  on_mismatch: str, progress: bool) -> list[dict]:
    table = root / f"{part}.tsv"
    rows = read_clip_table(table)
    seen: dict[str, int] = {}
    for row in rows:
        if row["path"] in seen:
            raise DataError(f"clip listed twice (first on line {seen[row['path']]})",
                            source=str(table), line=row["line"], key=row["path"])
        seen[row["path"]] = row["line"]
    without_audio = [f"{table}:{r['line']} (key {Path(r['path']).stem!r})" for r in rows
                     if not (root / "clips" / r["path"]).is_file()]
    check_pairs([], without_audio, on_mismatch=on_mismatch,
                stage=f"prepare_commonvoice {part}", source=table)
    kept = [r for r in rows if (root / "clips" / r["path"]).is_file()]
    unmeasured = [str((root / "clips" / r["path"]).resolve()) for r in kept
                  if r["path"] not in durations]
    measured = dict(zip(unmeasured, measure_audio(unmeasured, num_jobs=num_jobs,
                                                  progress=progress,
                                                  desc=f"commonvoice {part}")))
    samples = []
    for row in kept:
        path = str((root / "clips" / row["path"]).resolve())
        sample: dict[str, Any] = {KEY: Path(row["path"]).stem, AUDIO_PATH: path}
        if path in measured:
            frames, rate = measured[path]
            sample[DURATION] = frames / rate
            sample["sample_rate"] = rate
        else:
            sample[DURATION] = durations[row["path"]]
        sample[TEXT] = row["sentence"]
        sample[SPEAKER] = row["client_id"]
        for name in _EXTRA:
            if name in row:
                sample[name] = row[name]
        samples.append(sample)
    return samples


# --------------------------------------------------------------------------- pipelines


def commonvoice_train(manifests: Any, parts: Iterable[str] = ("train",), *,
                      language: str | None = None,
                      min_duration: float | None = DURATION_RANGE[0],
                      max_duration: float | None = DURATION_RANGE[1],
                      **options: Any) -> IterDataPipe[dict]:
    """Training batches of Common Voice: clips of 1-15 s (the others dropped and counted),
    80-bin fbank, 200 padded seconds per batch.

    Args:
        manifests: the manifest folder, prepare's dict, or manifest paths (then ``parts`` is
            ignored); see :func:`~speechpipe.recipes.resolve_manifests`.
        parts: the parts to train on.
        language: the language folder's name (``en``...), to pick its manifests from a folder
            holding several languages' (``None``: the folder's only language).
        min_duration, max_duration: duration range kept, seconds.
        **options: :func:`~speechpipe.recipes.train_pipeline` options.
    """
    return train_pipeline(_manifests(manifests, list(parts), language),
                          min_duration=min_duration, max_duration=max_duration, **options)


def commonvoice_valid(manifests: Any, parts: Iterable[str] = ("dev",), *,
                      language: str | None = None, **options: Any) -> IterDataPipe[dict]:
    """Validation batches (``dev``), every clip, fixed order; ``language`` as in
    :func:`commonvoice_train`, ``options`` are
    :func:`~speechpipe.recipes.eval_pipeline`'s."""
    return eval_pipeline(_manifests(manifests, list(parts), language), **options)


def commonvoice_test(manifests: Any, part: str = "test", *, language: str | None = None,
                     **options: Any) -> IterDataPipe[dict]:
    """Test batches (``test``), every clip, fixed order; ``language`` as in
    :func:`commonvoice_train`, ``options`` are
    :func:`~speechpipe.recipes.eval_pipeline`'s."""
    return eval_pipeline(_manifests(manifests, [part], language), **options)
