"""Kaldi table values: a path, an ark reference ``raw.ark:1234[0:9]`` or a ``cmd |``.

:func:`read_matrix` reads a ``feats.scp`` value as a float32 matrix and :func:`read_wav_value`
a ``wav.scp`` value as audio. Shell commands run only with ``allow_commands=True``; relative
paths are joined with ``root`` (default: the current directory, as Kaldi).
"""

from __future__ import annotations

import io
import os
import subprocess
from collections import OrderedDict
from typing import Any, BinaryIO

import numpy as np

from ...errors import DataError, MissingDataError, UnsafeInputError
from ...remote import is_remote
from ..decode import read_audio
from ._ark import audio_bytes_in_ark, decode_matrix, parse_ark_ref, parse_range
from ._tables import table_error, Location, WHITESPACE

__all__ = [
    "read_matrix",
    "read_wav_value",
]

_MAX_STDERR = 800  # characters of a failing command's stderr shown in the error

# --------------------------------------------------------------------------- values


def is_command(value: str) -> bool:
    return value.endswith("|")


def resolve(path: str, root: str | None) -> str:
    if root is not None and not os.path.isabs(path) and not is_remote(path):
        return os.path.join(root, path)
    return path


def _refuse_remote(path: str, what: str, where: Location) -> None:
    """Table values are read from local files: a URL is named, not tried as a path."""
    if is_remote(path):
        raise table_error(DataError, f"{what} {path} is in object storage, which load_scp does not "
                     "read (no random access into a remote file): stream remote arks with "
                     "kaldi_arks(url, remote=...) + sharded_shuffle(format='ark'), load remote "
                     "audio from a manifest with load_audio(remote=...)", where)


def _check_value(value: str, where: Location) -> None:
    if not value:
        raise table_error(DataError, "empty value: expected a path or an ark reference", where)
    if value.startswith("|"):
        raise table_error(
            DataError,
            f"{value!r} is an output pipe ('| cmd'); an input command ends with '|'",
            where,
        )
    if "\x00" in value:
        raise table_error(DataError, "value contains a NUL byte", where)


def _run_command(value: str, *, allow_commands: bool, where: Location) -> bytes:
    """Run a Kaldi ``cmd |`` value and return its stdout."""
    command = value[:-1].strip(WHITESPACE)
    if not allow_commands:
        raise table_error(
            UnsafeInputError,
            f"{value!r} is a shell command; speechpipe runs commands from tables only when "
            "asked: pass allow_commands=True if you trust this file",
            where,
        )
    if not command:
        raise table_error(DataError, "empty command before '|'", where)
    try:
        done = subprocess.run(
            command, shell=True, stdin=subprocess.DEVNULL, capture_output=True, check=False
        )
    except OSError as exc:
        raise table_error(DataError, f"cannot run command {command!r}: {exc}", where) from exc
    if done.returncode != 0:
        tail = done.stderr.decode("utf-8", errors="replace").strip()[-_MAX_STDERR:]
        raise table_error(
            DataError,
            f"command {command!r} failed with exit status {done.returncode}"
            + (f"; stderr: {tail}" if tail else " (no stderr)"),
            where,
        )
    return done.stdout


class OpenFiles:
    """A few ark files kept open during one pass: scp entries usually walk an ark in order."""

    def __init__(self, size: int = 4) -> None:
        self.size = size
        self._files: OrderedDict[str, BinaryIO] = OrderedDict()

    def get(self, path: str, where: Location, what: str) -> BinaryIO:
        stream = self._files.get(path)
        if stream is not None:
            self._files.move_to_end(path)
            return stream
        try:
            stream = open(path, "rb")
        except FileNotFoundError as exc:
            raise table_error(MissingDataError, f"{what} not found: {path}", where) from exc
        except OSError as exc:
            raise table_error(DataError, f"cannot open {what} {path}: {exc.strerror or exc}",
                         where) from exc
        self._files[path] = stream
        if len(self._files) > self.size:
            self._files.popitem(last=False)[1].close()
        return stream

    def close(self) -> None:
        while self._files:
            self._files.popitem()[1].close()

def read_matrix_value(
    value: str, *, root: str | None, allow_commands: bool, files: OpenFiles, where: Location
) -> np.ndarray:
    _check_value(value, where)
    if is_command(value):
        stdout = _run_command(value, allow_commands=allow_commands, where=where)
        return decode_matrix(io.BytesIO(stdout), f"output of {value!r}", where).astype(
            np.float32
        )
    ref = parse_ark_ref(value)
    if ref is None:  # cannot happen: the grammar reads every non-empty string
        raise table_error(DataError, f"cannot parse ark reference {value!r}", where)
    path = resolve(ref.path, root)
    _refuse_remote(path, "ark", where)
    offset = ref.offset or 0
    name = f"{path}:{offset}"
    stream = files.get(path, where, "ark file")
    try:
        size = os.fstat(stream.fileno()).st_size
    except OSError as exc:
        raise table_error(DataError, f"cannot stat {path}: {exc}", where) from exc
    if offset >= size:
        raise table_error(
            DataError, f"{name}: offset {offset} is past the end of the file ({size} bytes)",
            where,
        )
    stream.seek(offset)
    array = decode_matrix(stream, name, where)
    if ref.range is not None:
        array = array[parse_range(ref.range, array.shape, name, where)]
    return np.ascontiguousarray(array, dtype=np.float32)


def _read_once(read: Any, value: str, root: Any, allow_commands: bool, where: Location) -> Any:
    """``read`` (``read_matrix_value`` or ``read_wav``) of one value, with a file cache of its own
    that is closed after."""
    files = OpenFiles()
    try:
        return read(value, root=None if root is None else os.fspath(root),
                    allow_commands=allow_commands, files=files, where=where)
    finally:
        files.close()


def read_matrix(
    value: str,
    *,
    root: str | None = None,
    allow_commands: bool = False,
    source: str | None = None,
    line: int | None = None,
    key: str | None = None,
) -> np.ndarray:
    """Read a ``feats.scp`` value (``raw.ark:1234``, ``raw.ark:1234[0:9]``) as float32.

    Float, double and compressed (``CM``, ``CM2``, ``CM3``) matrices, text-ark matrices and
    kaldiio's ``NPY`` objects are read with kaldiio; ranges follow Kaldi (inclusive
    ``[first-row:last-row]`` or ``[rows,cols]``, empty means all) and must fit the matrix. A
    path without ``:offset`` reads the object at the start of the file.

    Args:
        value: the table value.
        root: directory for relative ark paths (default: the current directory, as Kaldi).
        allow_commands: allow ``cmd |`` values, whose stdout is read as one matrix.
        source, line, key: where the value came from, for error messages.

    Returns:
        ``float32`` array ``(frames, dim)``.

    Raises:
        MissingDataError: the ark file does not exist.
        UnsafeInputError: a command without ``allow_commands``, or a pickled object.
        DataError: a bad offset or range, a truncated or corrupt ark, not a matrix.

    >>> import os, tempfile, numpy as np, kaldiio
    >>> tmp = tempfile.TemporaryDirectory()
    >>> ark = os.path.join(tmp.name, "raw.ark")
    >>> kaldiio.save_ark(ark, {"u1": np.arange(12, dtype=np.float32).reshape(4, 3)})
    >>> read_matrix(f"{ark}:3[1:2]")
    array([[3., 4., 5.],
           [6., 7., 8.]], dtype=float32)
    >>> tmp.cleanup()
    """
    return _read_once(read_matrix_value, value, root, allow_commands, Location(source, line, key))


def relocated(exc: DataError | MissingDataError, what: str, where: Location) -> Exception:
    """An error from read_audio, re-raised at the table line that named the audio."""
    return table_error(type(exc), f"{what}: {exc.reason}", where)

def read_wav(
    value: str, *, root: str | None, allow_commands: bool, files: OpenFiles, where: Location
) -> tuple[np.ndarray, int]:
    _check_value(value, where)
    if is_command(value):
        stdout = _run_command(value, allow_commands=allow_commands, where=where)
        what = f"output of {value!r}"
        data: Any = stdout
    else:
        path = resolve(value, root)
        _refuse_remote(path, "audio", where)
        ref = parse_ark_ref(value)
        ark = resolve(ref.path, root) if ref and ref.offset is not None else None
        if not os.path.exists(path) and ark is not None and ref.range is None \
                and os.path.isfile(ark):
            offset = ref.offset
            what = f"{ark}:{offset}"
            stream = files.get(ark, where, "ark file")
            stream.seek(offset)
            data = audio_bytes_in_ark(stream, what, where)
        else:
            what, data = path, path
    try:
        return read_audio(data, source=where.source, key=where.key)
    except (DataError, MissingDataError) as exc:
        raise relocated(exc, what, where) from exc


def read_wav_value(
    value: str,
    *,
    root: str | None = None,
    allow_commands: bool = False,
    source: str | None = None,
    line: int | None = None,
    key: str | None = None,
) -> tuple[np.ndarray, int]:
    """Read the audio a ``wav.scp`` value names: ``(float32 audio, sample_rate)``.

    The value is an audio file (any format soundfile reads), a wav stored in an ark
    (``wav.ark:123``, used when no file is literally named so), or a ``cmd |`` whose stdout
    is an audio file (only with ``allow_commands``; a non-zero exit status is a DataError
    showing the command and the end of its stderr).

    Args:
        value: the table value.
        root: directory for relative paths (default: the current directory, as Kaldi).
        allow_commands: run ``cmd |`` values with the shell.
        source, line, key: where the value came from, for error messages.

    Raises:
        MissingDataError: the audio file or the ark does not exist.
        UnsafeInputError: a command without ``allow_commands``.
        DataError: undecodable audio, a failing command, a bad ark offset.

    >>> import os, tempfile, numpy as np, soundfile
    >>> tmp = tempfile.TemporaryDirectory()
    >>> soundfile.write(os.path.join(tmp.name, "a.wav"), np.zeros(800, np.float32), 8000)
    >>> audio, rate = read_wav_value("a.wav", root=tmp.name)
    >>> audio.shape, rate
    ((800,), 8000)
    >>> tmp.cleanup()
    """
    return _read_once(read_wav, value, root, allow_commands, Location(source, line, key))

