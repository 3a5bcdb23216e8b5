"""Download a corpus's archives: HTTP fetch with resume, checksums, safe extraction.

:func:`download_and_extract` fetches one archive over HTTP(S), resumes an interrupted transfer
(``<name>.part`` + ``Range: bytes=N-``), verifies its checksum (sha256 or md5), extracts it
(tar, tar.gz, tar.bz2, zip) refusing members that would land outside the target folder, and writes
a ``.completed`` sentinel, so a second call does nothing (``force=True`` redoes it).
:class:`Archive` and :func:`download_parts` do this for the parts of a corpus.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import logging
import os
import re
import socket
import stat
import tarfile
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping, Sequence

from ..errors import DataError, MissingDataError
from ._prepare import as_names
from ..errors import UnsafeInputError
from ..errors import redact
from ..remote import ProgressDeadline
from ..remote import http_request
from ..remote import open_http

__all__ = [
    "Archive",
    "download_and_extract",
    "download_parts",
    "parse_checksum",
    "safe_extract",
]

log = logging.getLogger("speechpipe.recipes")

_CHUNK = 1 << 20
_SENTINEL = ".completed"
_USER_AGENT = "speechpipe (corpus download)"


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
    request = http_request(url, headers)
    try:
        return open_http(request, timeout)
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


def _refuse_symlink(path: Path) -> None:
    """A symbolic link where the download writes (a pre-placed ``.part``, archive or
    sentinel) would make it overwrite the link's target: refused, naming it."""
    if path.is_symlink():
        raise UnsafeInputError(
            f"is a symbolic link (to {os.readlink(path)!r}); the download writes here and "
            "never follows links: remove it and run again", source=str(path))


def _open_no_follow(path: Path, mode: str):
    """``open(path, mode)`` for writing (``"wb"``/``"ab"``) that refuses a symbolic link at
    ``path`` (``O_NOFOLLOW``: no window between a check and the open)."""
    flags = os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
    flags |= os.O_APPEND if mode == "ab" else os.O_TRUNC
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        if path.is_symlink():
            _refuse_symlink(path)
        raise DataError(f"cannot write: {exc.strerror}", source=str(path)) from exc
    return os.fdopen(fd, mode)


def fetch_url(url: str, part: Path, *, resume: bool, progress: bool, timeout: float) -> None:
    """Download ``url`` into ``part``, continuing a partial file with a Range request."""
    from ..progress import progress_bar

    _refuse_symlink(part)
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
            with _open_no_follow(part, mode) as out, progress_bar(
                total=total, initial=offset, unit="B", unit_scale=True, unit_divisor=1024,
                desc=part.name[: -len(".part")], disable=not progress, leave=False,
            ) as bar:
                deadline = ProgressDeadline(timeout, url)
                try:
                    while True:
                        chunk = response.read1(_CHUNK)  # one socket read: deadline between
                        if not chunk:
                            break
                        deadline.check(len(chunk))
                        out.write(chunk)
                        received += len(chunk)
                        bar.update(len(chunk))
                except DataError as exc:  # the deadline: too slow
                    raise DataError(f"{exc.reason}; the partial file {part} is kept: run "
                                    "again to resume", source=url) from None
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


def _extract_zip(archive: Path, root: str, progress: bool) -> int:
    """:func:`safe_extract` for a zip (``rirs_noises.zip``): every member is checked first, as
    a tar member would be (zip symbolic links are refused: zipfile would write them as files)."""
    from ..progress import progress_bar

    try:
        with zipfile.ZipFile(archive) as zf:
            members = zf.infolist()
            for info in members:
                kind = stat.S_IFMT(info.external_attr >> 16)
                member = tarfile.TarInfo(info.filename)
                member.type = (tarfile.SYMTYPE if kind == stat.S_IFLNK else
                               tarfile.DIRTYPE if info.is_dir() else tarfile.REGTYPE)
                if member.issym():
                    raise DataError("refusing to extract a symbolic link from a zip",
                                    source=str(archive), member=info.filename)
                _check_member(member, root, archive)
            for info in progress_bar(members, unit="files", desc=f"extract {archive.name}",
                                     disable=not progress, leave=False):
                zf.extract(info, root)
    except DataError:
        raise
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
        raise DataError(
            f"cannot extract ({type(exc).__name__}: {exc}); delete the archive (or pass "
            "force=True) to download it again", source=str(archive)
        ) from exc
    return len(members)


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
    """Extract a tar (plain, gz, bz2, xz) or zip archive into ``target_dir``; return the member
    count.

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
    from ..progress import progress_bar

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

    if zipfile.is_zipfile(archive):
        return _extract_zip(archive, root, progress)
    try:
        with tarfile.open(archive, "r|*") as tar, progress_bar(
            unit="files", desc=f"extract {archive.name}", disable=not progress, leave=False
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


# long: a 47-line docstring (the four steps, twelve options); the body is 38 lines
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
        progress: show progress (tqdm bars on a terminal, else lines every 30 s).
        timeout: seconds to wait for the server before giving up: for its answer, for any
            one socket read, and for each MiB of the transfer (a server sending a byte now
            and then is given up on too).
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
        raise ValueError(f"url must end with the archive's file name, got {redact(url)!r}")
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
    for path in (archive, part, marker):
        _refuse_symlink(path)
    if not archive.exists():
        fetch_url(url, part, resume=resume, progress=progress, timeout=timeout)
        os.replace(part, archive)
    if checksum is not None:
        _verify_checksum(archive, algo, digest)
    destination = target if extract_dir is None else Path(extract_dir)
    _extract(archive, destination, decrypt=decrypt, progress=progress)
    for rel in expected:
        if not (destination / rel).exists():
            raise DataError(f"the archive did not create {rel!r} in {destination}",
                            source=str(archive))
    _write_sentinel(marker, {"url": redact(url), "checksum": checksum})  # no credentials
    if not keep_archive:
        archive.unlink()
    return target


def _verify_checksum(archive: Path, algo: str, digest: str) -> None:
    """Raise (deleting ``archive``) unless its ``algo`` digest is ``digest``."""
    actual = _file_digest(archive, algo)
    if actual != digest:
        archive.unlink()
        raise DataError(
            f"checksum mismatch: expected {algo} {digest}, got {actual}; the file was "
            "deleted: run again to download it anew (or check the URL / checksum)",
            source=str(archive),
        )


def _extract(archive: Path, destination: Path, *,
             decrypt: Callable[[Path, Path], None] | None, progress: bool) -> None:
    """:func:`safe_extract` ``archive``, or its decryption (a temporary file next to it)."""
    if decrypt is None:
        safe_extract(archive, destination, progress=progress)
        return
    plain = archive.with_name(archive.name + ".decrypted")
    try:
        decrypt(archive, plain)
        safe_extract(plain, destination, progress=progress)
    finally:
        if plain.exists():
            plain.unlink()


def _write_sentinel(marker: Path, content: Mapping[str, str | None]) -> None:
    """Write ``marker`` (a JSON line of ``content``) atomically: a temporary file, renamed."""
    marker.parent.mkdir(parents=True, exist_ok=True)
    tmp = marker.with_name(marker.name + ".tmp")
    _refuse_symlink(tmp)
    with _open_no_follow(tmp, "wb") as f:
        f.write((json.dumps(content) + "\n").encode("utf-8"))
    os.replace(tmp, marker)


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
        progress: progress bars on a terminal, else lines every 30 s.
    """
    names = list(archives) if parts == "all" else as_names(parts, "parts")
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
