"""Kaldi ark files: ark references, the binary objects stored in arks, and their headers.

An scp value ``raw.ark:1234[0:9]`` names an ark file, the byte offset of an object in it and
an optional Kaldi range of rows (and columns). This module knows what such objects look like:
it checks an object's header before kaldiio decodes it (so that nothing is unpickled and no
corrupt size makes us allocate more than the file holds), decodes matrices, and finds audio
stored in an ark.
"""

from __future__ import annotations

import io
import re
import struct
from typing import BinaryIO

import numpy as np
from kaldiio.matio import read_kaldi

from ..errors import DataError, UnsafeInputError
from .kaldi_tables import _error, _Where

__all__: list[str] = []

# <path>[:<offset>][<range>]; the lazy path lets a trailing ":<digits>" be the offset.
_ARK_REF = re.compile(r"(?P<path>.+?)(?::(?P<offset>[0-9]+))?(?:\[(?P<range>[^\[\]]*)\])?", re.S)
_BINARY_TYPES = ("FM", "FV", "DM", "DV", "CM", "CM2", "CM3")


def _size_of(stream: BinaryIO) -> int:
    position = stream.tell()
    size = stream.seek(0, io.SEEK_END)
    stream.seek(position)
    return size


class _Header:
    """Reads an object's header from a stream, raising DataError when it is cut short."""

    def __init__(self, stream: BinaryIO, name: str, where: _Where) -> None:
        self.stream, self.name, self.where = stream, name, where

    def take(self, n: int) -> bytes:
        data = self.stream.read(n)
        if len(data) < n:
            raise _error(DataError, f"{self.name}: truncated object header", self.where)
        return data

    def int32(self, marker: bool = True) -> int:
        if marker and self.take(1) != b"\x04":
            raise _error(DataError, f"{self.name}: bad size marker in the header", self.where)
        return struct.unpack("<i", self.take(4))[0]


def _check_matrix_object(stream: BinaryIO, name: str, where: _Where) -> None:
    """Refuse what the matrix reader must not see, and check declared sizes fit the file.

    The stream is positioned at the object; kaldiio would unpickle ``PKL`` objects and would
    allocate whatever a corrupt header declares, so both are caught here first.
    """
    start = stream.tell()
    available = _size_of(stream) - start
    head = _Header(stream, name, where)
    magic = stream.read(5)
    if len(magic) < 5:
        raise _error(
            DataError, f"{name}: {len(magic)} bytes left in the file, too few for a matrix", where
        )
    if magic.startswith(b"PKL"):
        raise _error(
            UnsafeInputError, f"{name} holds a pickled object; speechpipe never unpickles", where
        )
    if magic[:4] in (b"RIFF", b"fLaC") or magic == b"AUDIO":
        raise _error(
            DataError, f"{name} holds audio, not a feature matrix (use kind='wav')", where
        )
    need = 0
    if magic.startswith(b"NPY"):
        stream.seek(start + 3)
        width = head.take(1)[0]
        if not 0 < width <= 8:
            raise _error(DataError, f"{name}: bad NPY length header", where)
        need = 4 + width + int.from_bytes(head.take(width), "little")
    elif magic.startswith(b"\x00B"):
        stream.seek(start + 2)
        if magic[2:3] == b"\x04":
            raise _error(DataError, f"{name} holds an integer vector, not a matrix", where)
        token = bytearray()
        while len(token) <= 4:
            char = head.take(1)
            if char == b" ":
                break
            token += char
        kind = token.decode("latin-1")
        if kind not in _BINARY_TYPES:
            raise _error(
                DataError,
                f"{name}: unsupported binary object type {kind!r} (expected one of "
                f"{', '.join(_BINARY_TYPES)})",
                where,
            )
        if kind in ("CM", "CM2", "CM3"):
            head.take(8)  # min and range of the compressed values
            rows, cols = head.int32(marker=False), head.int32(marker=False)
            per_value = {"CM": 1, "CM2": 2, "CM3": 1}[kind]
            body = (8 * cols if kind == "CM" else 0) + per_value * rows * cols
        else:
            per_value = 4 if kind[0] == "F" else 8
            rows = head.int32()
            cols = head.int32() if kind[1] == "M" else 1
            body = per_value * rows * cols
        if rows < 0 or cols < 0:
            raise _error(DataError, f"{name}: negative size {rows} x {cols} in header", where)
        need = stream.tell() - start + body
    if need > available:
        raise _error(
            DataError,
            f"{name}: truncated: the object needs {need} bytes, {available} are left in the file",
            where,
        )
    stream.seek(start)


def _parse_range(text: str, shape: tuple[int, ...], name: str, where: _Where) -> tuple:
    """Kaldi's ``[r1:r2]`` / ``[r1:r2,c1:c2]`` (inclusive bounds; empty means all)."""
    parts = text.split(",")
    if len(parts) > 2:
        raise _error(DataError, f"{name}: bad range [{text}]: at most rows,cols", where)
    index = []
    for part, size, axis in zip(parts, shape, ("row", "column")):
        part = part.strip()
        if part in ("", ":"):
            index.append(slice(None))
            continue
        bounds = part.split(":")
        if len(bounds) != 2 or not all(b.strip().isdigit() for b in bounds):
            raise _error(DataError, f"{name}: bad range [{text}]: expected first:last", where)
        first, last = (int(b) for b in bounds)
        if first > last:
            raise _error(
                DataError, f"{name}: bad range [{text}]: first {axis} {first} > last {last}", where
            )
        if last >= size:
            raise _error(
                DataError,
                f"{name}: {axis} range {first}:{last} is outside the matrix's {size} {axis}s",
                where,
            )
        index.append(slice(first, last + 1))
    return tuple(index)


def _decode_matrix(stream: BinaryIO, name: str, where: _Where) -> np.ndarray:
    _check_matrix_object(stream, name, where)
    try:
        with np.errstate(all="ignore"):
            array = read_kaldi(stream)
    # kaldiio reports corrupt data with assert, struct.error, ValueError, RuntimeError,
    # IndexError, UnicodeDecodeError...: any of them means the bytes are not a matrix.
    except Exception as exc:
        raise _error(
            DataError, f"{name}: cannot read a matrix: {type(exc).__name__}: {exc}", where
        ) from exc
    if not isinstance(array, np.ndarray) or array.ndim != 2:
        shape = getattr(array, "shape", type(array).__name__)
        raise _error(DataError, f"{name}: expected a matrix (frames, dim), got {shape}", where)
    if array.dtype.kind not in "fiub":
        raise _error(DataError, f"{name}: expected numbers, got dtype {array.dtype}", where)
    return array


def _audio_bytes_in_ark(stream: BinaryIO, name: str, where: _Where) -> bytes:
    """The encoded audio stored at the stream's position (RIFF wav, kaldiio AUDIO, FLAC)."""
    start = stream.tell()
    available = _size_of(stream) - start
    head = _Header(stream, name, where)
    magic = stream.read(5)
    if not magic:
        raise _error(DataError, f"{name}: the offset is at or past the end of the file", where)
    if magic[:4] == b"RIFF":
        stream.seek(start + 4)
        declared = struct.unpack("<I", head.take(4))[0] + 8
        stream.seek(start)
        # Streamed wavs may declare a size they do not have; soundfile copes with a short one.
        return stream.read(min(declared, available))
    if magic == b"AUDIO":
        width = head.take(1)[0]
        if not 0 < width <= 8:
            raise _error(DataError, f"{name}: bad AUDIO length header", where)
        length = int.from_bytes(head.take(width), "little")
        if length > available - 6 - width:
            raise _error(
                DataError,
                f"{name}: truncated: the audio needs {length} bytes, "
                f"{available - 6 - width} are left in the file",
                where,
            )
        return head.take(length)
    if magic[:4] == b"fLaC":
        stream.seek(start)
        return stream.read()
    raise _error(
        DataError,
        f"{name} does not hold audio (expected RIFF, fLaC or AUDIO, found {magic!r})",
        where,
    )

