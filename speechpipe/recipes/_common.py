"""What every corpus recipe shares: downloading, preparing manifests, pipelines, the CLI.

A recipe module (``speechpipe/recipes/<corpus>.py``) is a fixed set of names (STYLE rule 13)::

    PARTS = ("dev-clean", ...)                  # the corpus's official parts
    download_<corpus>(target_dir, parts=..., force=False, *, base_url=..., checksums=None,
                      progress=True) -> Path    # the corpus folder that prepare reads
    prepare_<corpus>(corpus_dir, output_dir=None, parts="auto", num_jobs=1, *,
                     on_mismatch="error", force=False, progress=True) -> dict[part, manifest]
    <corpus>_train(manifests, ...) / <corpus>_valid(...) / <corpus>_test(...)   # pipelines

and is listed in :data:`RECIPES`, which the ``speechpipe download`` and ``speechpipe prepare``
commands (:func:`add_download_command`, :func:`add_prepare_command`) forward to. This module
gives a recipe its building blocks, so that a recipe holds only what is particular to its
corpus (the layout, the transcript format, the defaults of its usual practice):

**Download** -- :func:`download_and_extract` fetches one archive over HTTP(S), resumes an
interrupted transfer (``<name>.part`` + ``Range: bytes=N-``), verifies its checksum (sha256 or
md5), extracts it (tar, tar.gz, tar.bz2) refusing members that would land outside the target
folder, and writes a ``.completed`` sentinel, so a second call does nothing (``force=True``
redoes it). :class:`Archive` and :func:`download_parts` do this for the parts of a corpus.

**Prepare** -- one manifest kind, ``samples``: a gzipped JSON-lines file per part,
``{corpus}_samples_{part}.jsonl.gz`` (:func:`manifest_path`), one line per utterance::

    {"audio_path": "/data/LibriSpeech/dev-clean/1272/128104/1272-128104-0000.flac",
     "duration": 5.855, "key": "1272-128104-0000", "sample_rate": 16000,
     "speaker": "1272", "text": "MISTER QUILTER IS THE APOSTLE ..."}

with ``offset`` (seconds) when the utterance is a segment of a longer recording, and the
corpus's extra fields (``chapter``, ``normalized_text``, ``feats_path``...). Read it back with
:func:`~speechpipe.pipes.manifests.read_manifest` or feed it to the pipelines below; ``speechpipe
pack --manifest`` packs it into shards. :func:`prepare_parts` skips parts whose manifest
exists (manifests are written to a temporary name and renamed when complete, so an existing one
is a finished one), :func:`check_pairs` reports audio without transcript and transcripts
without audio under an explicit policy (``on_mismatch="error"`` raises a
:class:`~speechpipe.errors.DataError` with counts and examples, ``"skip"`` leaves them out,
counted and warned about -- never silently), and :func:`measure_audio` reads durations with
``soundfile.info`` on ``num_jobs`` threads.

**Pipelines** -- :func:`train_pipeline` (shuffle, duration filter, speed perturbation,
features, tokenization, length buckets, budget batches, padding), :func:`eval_pipeline`
(fixed order) and :func:`semi_supervised_pipeline` (``{"sup": batch, "unsup": batch}`` per
step) build on manifests; ``filter_by_duration`` (:class:`DurationFilterIterDataPipe`) counts
what it drops, and :func:`pipeline_report` prints every count of a built pipeline.

**Adding a corpus** -- write ``speechpipe/recipes/<corpus>.py`` with the names above (see
``librispeech.py``: :class:`Archive` entries per part, a ``_part_samples`` function that
validates the layout and returns samples, thin pipeline builders over this module), add it to
:data:`RECIPES`, and test it on a tiny fixture in the corpus's real layout under
``tests/fixtures/<corpus>/``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import http.client
import importlib
import inspect
import json
import logging
import os
import re
import socket
import sys
import tarfile
import urllib.error
import urllib.parse
import urllib.request
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import soundfile

from ..diagnostics import Diagnostics, SkippedInputWarning
from ..errors import DataError, MissingDataError
from ..pipes._base import IterableWrapper, IterDataPipe
from ..pipes.batching import DurationFilter, DurationFilterIterDataPipe, PaddedArea  # noqa: F401
from ..pipes.collate import PadCollate
from ..pipes.manifests import write_manifest
from ..sample import DURATION, FEATS, KEY, SOURCE, TEXT, Sample, sample_duration

__all__ = [
    "AUDIO_PATH",
    "Archive",
    "DurationFilter",
    "DurationFilterIterDataPipe",
    "FEATS_PATH",
    "FEATURE_KINDS",
    "MANIFEST_KIND",
    "OFFSET",
    "ON_MISMATCH",
    "RECIPES",
    "add_download_command",
    "add_prepare_command",
    "check_pairs",
    "download_and_extract",
    "download_parts",
    "eval_pipeline",
    "get_recipe",
    "manifest_path",
    "manifest_samples",
    "measure_audio",
    "parse_checksum",
    "pipeline_report",
    "prepare_parts",
    "resolve_manifests",
    "resolve_parts",
    "safe_extract",
    "semi_supervised_pipeline",
    "train_pipeline",
]

log = logging.getLogger("speechpipe.recipes")

#: Corpus name -> recipe module. The CLI's ``download``/``prepare`` choices; each module has
#: ``PARTS``, ``prepare_<name>`` and (unless the corpus is made locally) ``download_<name>``.
RECIPES: dict[str, str] = {
    "aishell": "speechpipe.recipes.aishell",
    "commonvoice": "speechpipe.recipes.commonvoice",
    "kaldi_dir": "speechpipe.recipes.kaldi_dir",
    "librispeech": "speechpipe.recipes.librispeech",
    "ljspeech": "speechpipe.recipes.ljspeech",
    "wenetspeech": "speechpipe.recipes.wenetspeech",
}

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
#: Values of ``features`` in the pipelines (``None``: no features, batches hold audio).
FEATURE_KINDS = ("fbank", "mfcc", "mel")

_CHUNK = 1 << 20
_SENTINEL = ".completed"
_USER_AGENT = "speechpipe (corpus download)"


# ============================================================================ registry


def get_recipe(corpus: str) -> ModuleType:
    """The recipe module of ``corpus`` (a key of :data:`RECIPES`).

    >>> get_recipe("librispeech").PARTS[:2]
    ('dev-clean', 'dev-other')
    """
    if corpus not in RECIPES:
        raise ValueError(f"unknown corpus {corpus!r}; known: {', '.join(sorted(RECIPES))}")
    return importlib.import_module(RECIPES[corpus])


# ============================================================================ download


def parse_checksum(checksum: str) -> tuple[str, str]:
    """``(algorithm, lowercase hex digest)`` of ``"sha256:<hex>"``, ``"md5:<hex>"`` or a bare
    digest (64 hex digits: sha256, 32: md5).

    >>> parse_checksum("42E2234BA48799C1F50F24A7926300A1")
    ('md5', '42e2234ba48799c1f50f24a7926300a1')
    """
    if not isinstance(checksum, str):
        raise TypeError(f"checksum must be a str, got {checksum!r}")
    algo, _, digest = checksum.rpartition(":")
    digest = digest.strip().lower()
    if not algo:
        algo = {64: "sha256", 32: "md5"}.get(len(digest), "")
    algo = algo.lower()
    size = {"sha256": 64, "md5": 32}.get(algo)
    if size is None or len(digest) != size or not re.fullmatch(r"[0-9a-f]+", digest):
        raise ValueError(
            f"checksum must be 'sha256:<64 hex digits>', 'md5:<32 hex digits>' or a bare "
            f"digest, got {checksum!r}"
        )
    return algo, digest


def _file_digest(path: Path, algo: str) -> str:
    h = hashlib.new(algo)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def _content_range_start(value: str | None) -> int | None:
    match = re.fullmatch(r"\s*bytes\s+(\d+)-\d+/(?:\d+|\*)\s*", value or "")
    return int(match.group(1)) if match else None


def _content_range_total(value: str | None) -> int | None:
    match = re.fullmatch(r"\s*bytes\s+[^/]*/(\d+)\s*", value or "")
    return int(match.group(1)) if match else None


def _open_url(url: str, offset: int, timeout: float):
    headers = {"User-Agent": _USER_AGENT}
    if offset:
        headers["Range"] = f"bytes={offset}-"
    request = urllib.request.Request(url, headers=headers)
    try:
        return urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as exc:
        if exc.code == 416:  # the partial file is already as long as the remote one (or longer)
            return exc
        exc.close()
        if exc.code == 404:
            raise MissingDataError(
                "not found on the server (HTTP 404); check the URL or --base-url", source=url
            ) from exc
        raise DataError(f"download failed: HTTP {exc.code} {exc.reason}", source=url) from exc
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise DataError(
            f"cannot reach the server ({reason}); check the URL and your connection",
            source=url,
        ) from exc


def _fetch(url: str, part: Path, *, resume: bool, progress: bool, timeout: float) -> None:
    """Download ``url`` into ``part``, continuing a partial file with a Range request."""
    from tqdm import tqdm

    if not resume and part.exists():
        part.unlink()
    for _attempt in range(2):
        offset = part.stat().st_size if part.exists() else 0
        response = _open_url(url, offset, timeout)
        if isinstance(response, urllib.error.HTTPError):  # 416
            total = _content_range_total(response.headers.get("Content-Range"))
            response.close()
            if total == offset:
                log.info("%s: already complete (%d bytes)", part, offset)
                return
            part.unlink()  # longer than the remote file: not a prefix of it
            continue
        with response:
            status = response.status
            if offset and status == 206:
                if _content_range_start(response.headers.get("Content-Range")) != offset:
                    part.unlink()  # the server sent another range: start again
                    continue
                mode = "ab"
                log.info("%s: resuming at byte %d", part, offset)
            else:  # 200: the whole file (the server ignored or did not get a Range)
                offset, mode = 0, "wb"
            length = response.headers.get("Content-Length")
            expected = int(length) if length and length.isdigit() else None
            total = offset + expected if expected is not None else None
            received = 0
            with open(part, mode) as out, tqdm(
                total=total, initial=offset, unit="B", unit_scale=True, unit_divisor=1024,
                desc=part.name[: -len(".part")], disable=not progress, leave=False,
            ) as bar:
                try:
                    while True:
                        chunk = response.read(_CHUNK)
                        if not chunk:
                            break
                        out.write(chunk)
                        received += len(chunk)
                        bar.update(len(chunk))
                except (http.client.IncompleteRead, ConnectionError, socket.timeout,
                        TimeoutError, OSError) as exc:
                    raise DataError(
                        f"download interrupted after {offset + received} of "
                        f"{total if total is not None else '?'} bytes ({type(exc).__name__}); "
                        f"the partial file {part} is kept: run again to resume",
                        source=url,
                    ) from exc
            if expected is not None and received < expected:
                raise DataError(
                    f"download interrupted after {offset + received} of {total} bytes; the "
                    f"partial file {part} is kept: run again to resume",
                    source=url,
                )
            return
    raise DataError("the server answers Range requests inconsistently; run again with "
                    "resume=False", source=url)


def _check_member(member: tarfile.TarInfo, root: str, archive: Path) -> None:
    """Raise if extracting ``member`` under ``root`` (a realpath) could write outside it."""
    name = member.name
    where = dict(source=str(archive), member=name)
    if not name or name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", name):
        raise DataError(f"refusing to extract an absolute path into {root}", **where)

    def inside(path: str) -> bool:
        real = os.path.realpath(path)
        return real == root or real.startswith(root + os.sep)

    dest = os.path.join(root, name)
    if not inside(dest):
        raise DataError(f"refusing to extract a member that would land outside {root}",
                        **where)
    if member.issym() or member.islnk():
        link = member.linkname
        if os.path.isabs(link):
            raise DataError(f"refusing to extract a link to the absolute path {link!r}", **where)
        base = os.path.dirname(dest) if member.issym() else root
        if not inside(os.path.join(base, link)):
            raise DataError(f"refusing to extract a link to {link!r}, outside {root}", **where)
    elif not (member.isfile() or member.isdir()):
        raise DataError("refusing to extract a device, fifo or other special file", **where)


def safe_extract(archive: str | os.PathLike, target_dir: str | os.PathLike, *,
                 progress: bool = True) -> int:
    """Extract a tar archive (plain, gz, bz2, xz) into ``target_dir``; return the member count.

    Every member is checked before it is written: absolute names, ``..`` escapes, links
    pointing outside ``target_dir`` and special files (devices, fifos) raise
    :class:`~speechpipe.errors.DataError` naming the archive and the member (members before it
    are already extracted; nothing is written outside). Python's ``"data"`` extraction filter
    is applied as well (no setuid bits, no absolute links).

    >>> import io, tarfile, tempfile
    >>> tmp = tempfile.mkdtemp()
    >>> with tarfile.open(f"{tmp}/a.tar.gz", "w:gz") as tar:
    ...     info = tarfile.TarInfo("../evil.txt"); info.size = 1
    ...     tar.addfile(info, io.BytesIO(b"x"))
    >>> safe_extract(f"{tmp}/a.tar.gz", f"{tmp}/out", progress=False)
    Traceback (most recent call last):
    speechpipe.errors.DataError: .../a.tar.gz [member ../evil.txt]: refusing to extract ... outside .../out
    """
    from tqdm import tqdm

    archive = Path(archive)
    target = Path(target_dir)
    target.mkdir(parents=True, exist_ok=True)
    root = os.path.realpath(target)
    count = 0

    def checked(tar: tarfile.TarFile, bar) -> Iterator[tarfile.TarInfo]:
        nonlocal count
        for member in tar:
            _check_member(member, root, archive)
            count += 1
            bar.update(1)
            yield member

    try:
        with tarfile.open(archive, "r|*") as tar, tqdm(
            unit=" files", desc=f"extract {archive.name}", disable=not progress, leave=False
        ) as bar:
            tar.extractall(root, members=checked(tar, bar), filter="data")
    except DataError:
        raise
    except tarfile.FilterError as exc:
        raise DataError(f"refusing to extract: {exc}", source=str(archive)) from exc
    except (tarfile.TarError, EOFError, OSError, ValueError) as exc:
        raise DataError(
            f"cannot extract ({type(exc).__name__}: {exc}); delete the archive (or pass "
            "force=True) to download it again", source=str(archive)
        ) from exc
    return count


def download_and_extract(
    url: str,
    target_dir: str | os.PathLike,
    *,
    checksum: str | None = None,
    resume: bool = True,
    force: bool = False,
    sentinel: str | os.PathLike | None = None,
    expected: Sequence[str] = (),
    keep_archive: bool = False,
    progress: bool = True,
    timeout: float = 60.0,
    decrypt: Callable[[Path, Path], None] | None = None,
    extract_dir: str | os.PathLike | None = None,
) -> Path:
    """Download an archive into ``target_dir``, verify it, extract it there; return the folder.

    Idempotent: when ``sentinel`` exists nothing is done; it is written only after a verified,
    complete extraction, so an interrupted run is simply run again. Steps:

    1. download ``url`` to ``<target_dir>/<name>.part``; if that file exists (an interrupted
       transfer) and ``resume``, ask only for the rest (``Range: bytes=N-``) and append --
       a server answering 200 instead sends the whole file again; the file is renamed to
       ``<name>`` when complete. An interrupted transfer raises
       :class:`~speechpipe.errors.DataError` and keeps the ``.part`` file;
    2. verify ``checksum``: on a mismatch the file is deleted and a ``DataError`` names it
       and both digests;
    3. (with ``decrypt``) decrypt it into a temporary file next to it; extract with
       :func:`safe_extract`; check that every path of ``expected`` exists;
    4. write ``sentinel`` and delete the archive (unless ``keep_archive``).

    Args:
        url: ``http(s)://`` (or ``file://``) URL; the archive name is its last path component.
        target_dir: folder to download and extract into (created).
        checksum: ``"sha256:<hex>"``, ``"md5:<hex>"`` or a bare digest; ``None`` skips it.
        resume: continue a partial download (otherwise start over).
        force: delete the sentinel, the archive and any partial file first and redo it all.
        sentinel: the completion marker (default ``<target_dir>/.<name>.completed``);
            recipes use ``<part folder>/.completed``.
        expected: paths (relative to ``target_dir``) the archive must create.
        keep_archive: keep the downloaded archive after extraction.
        progress: show tqdm progress bars.
        timeout: seconds to wait for the server before giving up.
        decrypt: ``decrypt(archive, output)`` writes the decrypted archive to ``output``
            (raising :class:`~speechpipe.errors.DataError` if it cannot), for corpora shipped
            encrypted; the checksum is the encrypted file's.
        extract_dir: where to extract (default ``target_dir``); ``expected`` is relative to it.

    Raises:
        MissingDataError: the server answers 404.
        DataError: the server cannot be reached or fails, the transfer is interrupted, the
            checksum differs, the archive is corrupt, unsafe, or lacks an ``expected`` path.
    """
    if checksum is not None:
        algo, digest = parse_checksum(checksum)
    target = Path(target_dir)
    name = Path(urllib.parse.urlparse(url).path).name
    if not name:
        raise ValueError(f"url must end with the archive's file name, got {url!r}")
    marker = Path(sentinel) if sentinel is not None else target / f".{name}{_SENTINEL}"
    archive = target / name
    part = target / f"{name}.part"
    if force:
        for path in (marker, archive, part):
            if path.exists():
                path.unlink()
    elif marker.exists():
        log.info("%s: already downloaded and extracted (%s exists)", name, marker)
        return target
    target.mkdir(parents=True, exist_ok=True)
    if not archive.exists():
        _fetch(url, part, resume=resume, progress=progress, timeout=timeout)
        os.replace(part, archive)
    if checksum is not None:
        actual = _file_digest(archive, algo)
        if actual != digest:
            archive.unlink()
            raise DataError(
                f"checksum mismatch: expected {algo} {digest}, got {actual}; the file was "
                "deleted: run again to download it anew (or check the URL / checksum)",
                source=str(archive),
            )
    destination = target if extract_dir is None else Path(extract_dir)
    if decrypt is None:
        safe_extract(archive, destination, progress=progress)
    else:
        plain = archive.with_name(archive.name + ".decrypted")
        try:
            decrypt(archive, plain)
            safe_extract(plain, destination, progress=progress)
        finally:
            if plain.exists():
                plain.unlink()
    for rel in expected:
        if not (destination / rel).exists():
            raise DataError(f"the archive did not create {rel!r} in {destination}",
                            source=str(archive))
    marker.parent.mkdir(parents=True, exist_ok=True)
    tmp = marker.with_name(marker.name + ".tmp")
    tmp.write_text(json.dumps({"url": url, "checksum": checksum}) + "\n", encoding="utf-8")
    os.replace(tmp, marker)
    if not keep_archive:
        archive.unlink()
    return target


@dataclass(frozen=True)
class Archive:
    """One official archive of a corpus part.

    Args:
        name: file name on the server (appended to the base URL).
        checksum: ``"sha256:<hex>"`` / ``"md5:<hex>"`` of the official file, or ``None``.
        creates: folder the archive creates, relative to the download folder; its
            ``.completed`` file marks the part done.
    """

    name: str
    checksum: str | None
    creates: str


def download_parts(
    archives: Mapping[str, Archive],
    parts: str | Iterable[str],
    target_dir: str | os.PathLike,
    *,
    base_url: str,
    corpus_root: str,
    force: bool = False,
    checksums: Mapping[str, str | None] | None = None,
    progress: bool = True,
) -> Path:
    """Download and extract the archives of ``parts``; return ``target_dir / corpus_root``.

    Each part is done by :func:`download_and_extract` with the sentinel
    ``<target_dir>/<archive.creates>/.completed``, so finished parts are skipped.

    Args:
        archives: ``{part: Archive}`` (the recipe's table).
        parts: part names (``"all"``: every part of ``archives``).
        target_dir: download folder.
        base_url: URL the archive names are appended to (tests pass a local server's).
        corpus_root: the folder the archives extract to (``LibriSpeech``), returned.
        force: redo parts already done.
        checksums: ``{part: checksum or None}`` overriding the official checksums (a local
            mirror of other files, tests); ``None`` skips verification of that part.
        progress: tqdm progress bars.
    """
    names = list(archives) if parts == "all" else _as_names(parts, "parts")
    unknown = [p for p in names if p not in archives]
    if unknown:
        raise ValueError(f"unknown part(s) {unknown}; known: {list(archives)}")
    target = Path(target_dir)
    for part in names:
        archive = archives[part]
        checksum = archive.checksum
        if checksums is not None and part in checksums:
            checksum = checksums[part]
        download_and_extract(
            f"{base_url.rstrip('/')}/{archive.name}",
            target,
            checksum=checksum,
            force=force,
            sentinel=target / archive.creates / _SENTINEL,
            expected=(archive.creates,),
            progress=progress,
        )
    return target / corpus_root


# ============================================================================ prepare


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
    from tqdm import tqdm

    if not isinstance(num_jobs, int) or num_jobs < 1:
        raise ValueError(f"num_jobs must be an int >= 1, got {num_jobs!r}")
    with tqdm(total=len(paths), desc=desc, unit=" files", disable=not progress,
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


# ============================================================================ pipelines


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


def manifest_samples(manifests: ManifestsArg, *, corpus: str | None = None,
                     parts: Sequence[str] | None = None) -> IterDataPipe[Sample]:
    """The samples of manifests, in file order, as a pipe (no audio read yet).

    Files are opened when iteration starts (``open_files`` + ``parse_manifest``); in-memory
    sample lists are streamed as they are. See :func:`resolve_manifests` for the forms of
    ``manifests``.

    >>> [s["key"] for s in manifest_samples([[{"key": "u1"}, {"key": "u2"}]])]
    ['u1', 'u2']
    """
    pipes = []
    paths: list[str] = []
    for source in resolve_manifests(manifests, corpus=corpus, parts=parts):
        if isinstance(source, str):
            paths.append(source)
            continue
        if paths:
            pipes.append(IterableWrapper(paths).open_files(mode="b").parse_manifest())
            paths = []
        pipes.append(IterableWrapper(source, deepcopy=False))
    if paths:
        pipes.append(IterableWrapper(paths).open_files(mode="b").parse_manifest())
    if not pipes:
        raise ValueError("no manifests given")
    return pipes[0] if len(pipes) == 1 else pipes[0].concat(*pipes[1:])




def _load_feats(sample: Mapping[str, Any]) -> Sample:
    """Read the Kaldi matrix named by ``feats_path`` into ``feats``."""
    from ..pipes.kaldi_values import read_matrix

    key = sample.get(KEY)
    value = sample.get(FEATS_PATH)
    if not isinstance(value, str):
        raise DataError(f"sample has no {FEATS_PATH!r} (a feats.scp value) to read",
                        source=sample.get(SOURCE), key=key)
    out = dict(sample)
    out[FEATS] = read_matrix(value, source=sample.get(SOURCE), key=key)
    return out


def _loaded(pipe: IterDataPipe, input: str) -> IterDataPipe:
    if input == "audio":
        # -> + audio (T,) float32, sample_rate: [offset, offset + duration) of a segment, the
        # whole file otherwise (duration then set to the decoded length)
        return pipe.load_audio(field=AUDIO_PATH, offset_field=OFFSET, duration_field=DURATION,
                               whole_without_offset=True)
    # -> + feats (frames, dim) float32
    return pipe.map(_load_feats)


def _transformed(pipe: IterDataPipe, *, input: str, speed_perturb, features, feature_options,
                 tokenizer, text_field, normalizer, seed: int) -> IterDataPipe:
    if speed_perturb is not None:
        if input != "audio":
            raise ValueError("speed_perturb needs audio; these manifests give features")
        pipe = pipe.perturb_speed(factors=tuple(speed_perturb), seed=seed)  # audio, duration
    if features is not None:
        if features not in FEATURE_KINDS:
            raise ValueError(f"features must be one of {FEATURE_KINDS} or None, got {features!r}")
        if input != "audio":
            raise ValueError("features are computed from audio; these manifests give "
                             "features already: pass features=None")
        options = dict(feature_options or {})
        if features in ("fbank", "mel") and not any(k in options for k in ("num_mel_bins",
                                                                              "n_mels")):
            options["num_mel_bins" if features == "fbank" else "n_mels"] = 80
        # -> + feats (frames, dim) float32, audio dropped
        pipe = pipe.compute_features(features, keep_audio=False, seed=seed, **options)
    if tokenizer is not None:
        pipe = pipe.tokenize(tokenizer, field=text_field, normalizer=normalizer)  # + tokens
    return pipe


def _check_input(input: str) -> str:
    if input not in ("audio", "feats"):
        raise ValueError(f"input must be 'audio' (audio_path) or 'feats' (feats_path), got "
                         f"{input!r}")
    return input


def _check_budget(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be seconds > 0, got {value!r}")
    return float(value)


def train_pipeline(
    manifests: ManifestsArg,
    *,
    budget_seconds: float = 200.0,
    tokenizer: Any = None,
    text_field: str = TEXT,
    normalizer: Callable[[str], str] | None = None,
    speed_perturb: Sequence[float] | None = None,
    features: str | None = "fbank",
    feature_options: Mapping[str, Any] | None = None,
    min_duration: float | None = None,
    max_duration: float | None = None,
    seed: int = 0,
    shuffle_buffer: int = 10_000,
    bucket_buffer: int = 2_000,
    input: str = "audio",
    shard: bool = True,
) -> IterDataPipe[dict]:
    """A training pipeline over manifests: yields padded batch dicts within a budget.

    Stages and element shapes::

        manifest_samples      -> {key, audio_path, duration, text, speaker, ...}
        filter_by_duration    -> the same, only [min_duration, max_duration] (drops counted)
        shuffle(seeded)       -> the same, in a random order (buffer of shuffle_buffer)
        sharding_filter       -> this worker's / rank's share (when shard)
        load_audio            -> + audio (T,) float32, sample_rate   [input="audio"]
          (or read feats_path -> + feats (frames, dim) float32)      [input="feats"]
        perturb_speed         -> audio resampled by a factor drawn from speed_perturb,
                                 duration updated, + speed            [optional]
        compute_features      -> + feats (frames, dim), audio dropped [features]
        tokenize              -> + tokens (L,) int64 from text_field  [tokenizer]
        bucket_by_length      -> groups of similar duration (buffer of bucket_buffer)
        block_batch           -> lists of samples, n × longest duration <= budget_seconds
        collate(PadCollate)   -> {feats (B, T, D), feats_len (B,), tokens (B, L) padded -1,
                                  tokens_len, key [..], text [..], duration (B,), ...}

    The order is seeded: call :func:`speechpipe.set_epoch` ``(pipe, epoch, seed=seed)`` at
    each epoch for a new, reproducible order. :func:`pipeline_report` prints what the
    duration filter dropped and the batches' padding efficiency.

    Args:
        manifests: see :func:`resolve_manifests` (paths, sample lists, prepare's dict).
        budget_seconds: padded seconds per batch (batch size × longest duration).
        tokenizer: a speechpipe tokenizer (``load_tokenizer``), or ``None``: no ``tokens``.
        text_field: the field tokenized (``normalized_text`` for LJSpeech).
        normalizer: a ``TextNormalizer`` applied before tokenizing.
        speed_perturb: factors to draw from per utterance (e.g. ``(0.9, 1.0, 1.1)``).
        features: ``"fbank"`` (80 bins), ``"mfcc"``, ``"mel"`` (80 mels) or ``None`` (batches
            hold ``audio``).
        feature_options: options of ``compute_features`` (``num_mel_bins``, ``n_fft``...).
        min_duration, max_duration: duration range kept, seconds (``None``: no bound).
        seed: seed of the shuffle, speed perturbation, buckets and batch order.
        shuffle_buffer: samples in torch's shuffle buffer.
        bucket_buffer: samples held by ``bucket_by_length`` (more: less padding).
        input: ``"audio"`` (manifests with ``audio_path``) or ``"feats"`` (``feats_path``).
        shard: insert ``sharding_filter`` so that DataLoader workers and ranks read disjoint
            shares.
    """
    budget = _check_budget(budget_seconds, "budget_seconds")
    _check_input(input)
    constraint = PaddedArea(budget=budget, length=sample_duration)
    pipe = manifest_samples(manifests)
    pipe = pipe.filter_by_duration(min_duration, max_duration)
    pipe = pipe.shuffle(buffer_size=shuffle_buffer).set_seed(seed)
    if shard:
        pipe = pipe.sharding_filter()
    pipe = _loaded(pipe, input)
    pipe = _transformed(pipe, input=input, speed_perturb=speed_perturb, features=features,
                        feature_options=feature_options, tokenizer=tokenizer,
                        text_field=text_field, normalizer=normalizer, seed=seed)
    pipe = pipe.bucket_by_length(bucket_buffer, constraint=constraint, seed=seed)
    pipe = pipe.block_batch(constraint=constraint, seed=seed)
    return pipe.collate(collate_fn=PadCollate())


def eval_pipeline(
    manifests: ManifestsArg,
    *,
    batch_size: int | None = None,
    budget_seconds: float | None = None,
    tokenizer: Any = None,
    text_field: str = TEXT,
    normalizer: Callable[[str], str] | None = None,
    features: str | None = "fbank",
    feature_options: Mapping[str, Any] | None = None,
    min_duration: float | None = None,
    max_duration: float | None = None,
    input: str = "audio",
) -> IterDataPipe[dict]:
    """A validation / test pipeline: every utterance once, in manifest order, padded batches.

    The same stages as :func:`train_pipeline` without shuffling, perturbation or bucketing:
    batches are ``batch_size`` consecutive utterances, or consecutive utterances packed while
    ``n × longest duration <= budget_seconds`` (one of the two; default 16 utterances). No
    utterance is dropped unless a duration range is given (then counted). Run it in one
    process (or with one DataLoader worker) to keep the order.

    Args:
        manifests: see :func:`resolve_manifests`.
        batch_size: utterances per batch.
        budget_seconds: padded seconds per batch, instead of ``batch_size``.
        tokenizer, text_field, normalizer, features, feature_options, input: as in
            :func:`train_pipeline`.
        min_duration, max_duration: duration range kept (``None``: keep all).
    """
    if batch_size is not None and budget_seconds is not None:
        raise ValueError("give batch_size or budget_seconds, not both")
    if batch_size is None and budget_seconds is None:
        batch_size = 16
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(
            batch_size, int) or batch_size < 1):
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    _check_input(input)
    pipe = manifest_samples(manifests)
    if min_duration is not None or max_duration is not None:
        pipe = pipe.filter_by_duration(min_duration, max_duration)
    pipe = _loaded(pipe, input)
    pipe = _transformed(pipe, input=input, speed_perturb=None, features=features,
                        feature_options=feature_options, tokenizer=tokenizer,
                        text_field=text_field, normalizer=normalizer, seed=0)
    if batch_size is not None:
        pipe = pipe.batch(batch_size)
    else:
        budget = _check_budget(budget_seconds, "budget_seconds")
        pipe = pipe.block_batch(constraint=PaddedArea(budget=budget, length=sample_duration),
                                shuffle_window=1)
    return pipe.collate(collate_fn=PadCollate())


def semi_supervised_pipeline(
    sup_manifests: ManifestsArg,
    unsup_manifests: ManifestsArg,
    *,
    budget_seconds: float = 200.0,
    unsup_budget_seconds: float | None = None,
    tokenizer: Any = None,
    until: str = "sup",
    seed: int = 0,
    **options: Any,
) -> IterDataPipe[dict]:
    """Two training pipelines zipped by name: yields ``{"sup": batch, "unsup": batch}``.

    Each source is a :func:`train_pipeline` with its own budget (the unlabelled batches are
    often larger); only the supervised one is tokenized. ``zip_by_name`` takes one batch of
    each per step; with ``until="sup"`` an epoch is one pass over the supervised data and the
    unsupervised pipeline is restarted (counted, with a new order) whenever it runs out.

    Args:
        sup_manifests, unsup_manifests: see :func:`resolve_manifests`.
        budget_seconds: padded seconds per supervised batch.
        unsup_budget_seconds: padded seconds per unsupervised batch (default: the same).
        tokenizer: tokenizer of the supervised text.
        until: ``"sup"``, ``"unsup"``, ``"shortest"`` or ``"longest"`` (see ``zip_by_name``).
        seed: seed of the supervised pipeline; the unsupervised one uses ``seed + 1``.
        **options: other :func:`train_pipeline` options, given to both.
    """
    sup = train_pipeline(sup_manifests, budget_seconds=budget_seconds, tokenizer=tokenizer,
                         seed=seed, **options)
    unsup = train_pipeline(
        unsup_manifests,
        budget_seconds=budget_seconds if unsup_budget_seconds is None else unsup_budget_seconds,
        tokenizer=None, seed=seed + 1, **options,
    )
    return sup.zip_by_name(unsup, names=("sup", "unsup"), until=until)


def pipeline_report(pipe: Any) -> str:
    """The reports of every stage in ``pipe``'s graph that counts something: skipped or
    filtered items (``diagnostics``), batch statistics and token counts (``stats``).

    Call it after (or during) a pass. Stages are listed from the source to the output.

    >>> from speechpipe.pipes._base import IterableWrapper
    >>> pipe = IterableWrapper([{"key": "a", "duration": 0.2}, {"key": "b", "duration": 2.0}])
    >>> pipe = pipe.filter_by_duration(1.0, warn=False)
    >>> _ = list(pipe)
    >>> print(pipeline_report(pipe))
    filter_by_duration skipped 1 item(s):
      shorter than 1.0 s: 1 (e.g. key 'a' (0.20 s))
    """
    found: list[str] = []
    seen: set[int] = set()

    def visit(node: Any, depth: int) -> None:
        if id(node) in seen or depth > 200:
            return
        seen.add(id(node))
        children = []
        for value in vars(node).values():
            if isinstance(value, IterDataPipe):
                children.append(value)
            elif isinstance(value, (list, tuple)) and len(value) <= 64:
                children.extend(v for v in value if isinstance(v, IterDataPipe))
            elif isinstance(value, dict) and len(value) <= 64:
                children.extend(v for v in value.values() if isinstance(v, IterDataPipe))
        for child in children:
            visit(child, depth + 1)
        for name in ("diagnostics", "stats"):
            obj = getattr(node, name, None)
            if obj is not None and hasattr(obj, "report") and not isinstance(obj, type):
                if name == "diagnostics" and not getattr(obj, "counts", None):
                    continue
                found.append(obj.report())

    visit(pipe, 0)
    return "\n".join(found) if found else "nothing counted (no pass run yet?)"


# ============================================================================ CLI


def _recipe_function(corpus: str, verb: str) -> Callable[..., Any]:
    module = get_recipe(corpus)
    fn = getattr(module, f"{verb}_{corpus}", None)
    if fn is None:
        why = getattr(module, f"NO_{verb.upper()}", "")
        raise ValueError(f"the {corpus} recipe has no {verb}{': ' + why if why else ''}")
    return fn


def _run_prepare(args: argparse.Namespace) -> int:
    prepare = _recipe_function(args.corpus, "prepare")
    kwargs: dict[str, Any] = dict(parts=args.parts or "auto", num_jobs=args.jobs,
                                  on_mismatch=args.on_mismatch, force=args.force,
                                  progress=not args.no_progress)
    if args.root is not None:
        if "root" not in inspect.signature(prepare).parameters:
            print(f"speechpipe prepare: error: --root is not an option of {args.corpus}",
                  file=sys.stderr)
            return 2
        kwargs["root"] = args.root
    try:
        result = prepare(args.corpus_dir, args.out_dir, **kwargs)
    except (ValueError, OSError) as exc:  # DataError, MissingDataError included
        print(f"speechpipe prepare: error: {exc}", file=sys.stderr)
        return 2
    for part, path in result.items():
        print(f"{args.corpus} {part}: {path}")
    return 0


def _run_download(args: argparse.Namespace) -> int:
    try:
        download = _recipe_function(args.corpus, "download")
    except ValueError as exc:
        print(f"speechpipe download: error: {exc}", file=sys.stderr)
        return 2
    kwargs: dict[str, Any] = dict(force=args.force, progress=not args.no_progress)
    if args.parts:
        kwargs["parts"] = args.parts
    if args.base_url:
        kwargs["base_url"] = args.base_url
    accepted = inspect.signature(download).parameters
    for flag, name, value in (("--password-file", "password", args.password_file),
                              ("--list", "list_file", args.list), ("--url", "url", args.url),
                              ("--checksum", "checksum", args.checksum)):
        if value is None:
            continue
        if name not in accepted:
            print(f"speechpipe download: error: {flag} is not an option of {args.corpus}",
                  file=sys.stderr)
            return 2
        if name == "password":
            try:
                value = Path(value).read_text(encoding="utf-8").strip()
            except OSError as exc:
                print(f"speechpipe download: error: cannot read the password file: {exc}",
                      file=sys.stderr)
                return 2
        kwargs[name] = value
    try:
        corpus_dir = download(args.target_dir, **kwargs)
    except (ValueError, OSError) as exc:  # DataError, MissingDataError included
        print(f"speechpipe download: error: {exc}", file=sys.stderr)
        return 2
    print(f"{args.corpus}: {corpus_dir}")
    print(f"next: speechpipe prepare {args.corpus} {corpus_dir} <manifest_dir>")
    return 0


def add_prepare_command(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``prepare`` to the ``speechpipe`` command's subparsers; return its parser.

    ``speechpipe prepare <corpus> <corpus_dir> <out_dir> [--parts P ...] [--jobs N]
    [--on-mismatch error|skip] [--force] [--root DIR]`` forwards to ``prepare_<corpus>`` and
    prints one line per part with its manifest. ``args.func(args)`` returns the exit status.

    >>> parser = argparse.ArgumentParser(prog="speechpipe")
    >>> _ = add_prepare_command(parser.add_subparsers(dest="command"))
    >>> args = parser.parse_args(["prepare", "librispeech", "LibriSpeech", "manifests",
    ...                           "--parts", "dev-clean", "test-clean", "--jobs", "4"])
    >>> args.parts, args.jobs, args.on_mismatch, args.func.__name__
    (['dev-clean', 'test-clean'], 4, 'error', '_run_prepare')
    """
    parser = subparsers.add_parser(
        "prepare",
        help="write the manifests of a corpus (one .jsonl.gz per part)",
        description="Validate a corpus in its official layout and write one manifest per "
        "part, <out_dir>/{corpus}_samples_{part}.jsonl.gz: one JSON line per utterance with "
        "key, audio_path, duration, text, speaker. Parts whose manifest exists are skipped "
        "(--force redoes them). Audio without transcript, or the reverse, stops the run "
        "unless --on-mismatch skip (then they are counted and reported).",
        epilog="example: speechpipe prepare librispeech data/LibriSpeech data/manifests "
        "--parts dev-clean test-clean --jobs 4",
    )
    parser.add_argument("corpus", choices=sorted(RECIPES), help="corpus recipe")
    parser.add_argument("corpus_dir", help="the corpus folder (e.g. data/LibriSpeech)")
    parser.add_argument("out_dir", help="folder to write the manifests to")
    parser.add_argument("--parts", nargs="+", metavar="PART",
                        help="parts to prepare (default: every part found)")
    parser.add_argument("--jobs", type=int, default=1, metavar="N",
                        help="threads reading audio headers (default 1)")
    parser.add_argument("--on-mismatch", choices=ON_MISMATCH, default="error",
                        help="audio without transcript or the reverse: error (default) or "
                        "skip them, counted")
    parser.add_argument("--force", action="store_true", help="redo parts already prepared")
    parser.add_argument("--root", default=None, metavar="DIR",
                        help="kaldi_dir: folder that relative paths in the tables start from "
                        "(default: the current folder, as in Kaldi)")
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")
    parser.set_defaults(func=_run_prepare)
    return parser


def add_download_command(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``download`` to the ``speechpipe`` command's subparsers; return its parser.

    ``speechpipe download <corpus> <target_dir> [--parts P ...] [--base-url URL] [--force]
    [--url URL] [--checksum SHA256] [--password-file FILE] [--list FILE]`` forwards to
    ``download_<corpus>``: resumable, checksum-verified, idempotent (``--url``/``--checksum``:
    releases handed out as a link, Common Voice; the last two: WenetSpeech's encrypted one).

    >>> parser = argparse.ArgumentParser(prog="speechpipe")
    >>> _ = add_download_command(parser.add_subparsers(dest="command"))
    >>> args = parser.parse_args(["download", "librispeech", "data", "--parts", "dev-clean"])
    >>> args.corpus, args.parts, args.base_url, args.func.__name__
    ('librispeech', ['dev-clean'], None, '_run_download')
    """
    parser = subparsers.add_parser(
        "download",
        help="download and extract a corpus's official archives",
        description="Download the official archives of a corpus into <target_dir> and "
        "extract them there. Interrupted downloads resume where they stopped (run the same "
        "command again); checksums are verified; finished parts are skipped (a .completed "
        "file marks them; --force redoes them).",
        epilog="example: speechpipe download librispeech data --parts dev-clean test-clean",
    )
    parser.add_argument("corpus", choices=sorted(RECIPES), help="corpus recipe")
    parser.add_argument("target_dir", help="folder to download and extract into")
    parser.add_argument("--parts", nargs="+", metavar="PART",
                        help="parts to download (default: the recipe's default)")
    parser.add_argument("--base-url", default=None, metavar="URL",
                        help="download from this mirror instead of the official site")
    parser.add_argument("--force", action="store_true", help="download again parts already done")
    parser.add_argument("--url", default=None, metavar="URL",
                        help="commonvoice: the cv-corpus-<version>-<lang>.tar.gz link Mozilla "
                        "gives after accepting its terms")
    parser.add_argument("--checksum", default=None, metavar="SHA256",
                        help="commonvoice: the archive's sha256 (shown beside the link)")
    parser.add_argument("--password-file", default=None, metavar="FILE",
                        help="wenetspeech: file holding the release password (the official "
                        "SAFEBOX/password)")
    parser.add_argument("--list", default=None, metavar="FILE",
                        help="wenetspeech: the object list with md5 sums (metadata/v1.list "
                        "of github.com/wenet-e2e/WenetSpeech), a path or URL")
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")
    parser.set_defaults(func=_run_download)
    return parser

