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
from typing import BinaryIO, Iterator

import numpy as np
from kaldiio.matio import read_kaldi

from ..errors import DataError, UnsafeInputError
from .kaldi_tables import _error, _Where

__all__ = [
    "iter_ark",
]

# <path>[:<offset>][<range>]; the lazy path lets a trailing ":<digits>" be the offset.
_ARK_REF = re.compile(r"(?P<path>.+?)(?::(?P<offset>[0-9]+))?(?:\[(?P<range>[^\[\]]*)\])?", re.S)
_BINARY_TYPES = ("FM", "FV", "DM", "DV", "CM", "CM2", "CM3")

# Ark reading: payloads are read in chunks of this size, so that a corrupt size field never
# makes us allocate more than the stream actually holds; a key longer than _KEY_MAX bytes
# means the stream is not an ark.
_CHUNK = 1 << 24
_KEY_MAX = 4096
_WHITESPACE = b" \t\n\r\v\f"
_FLOAT_TYPES = {"FM": 4, "DM": 8}
_VECTOR_TYPES = ("FV", "DV")
_COMPRESSED_TYPES = ("CM", "CM2", "CM3")


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


# --------------------------------------------------------------------------- reading an ark in sequence


class _ArkReader:
    """Sequential reads from an ark stream, counting the byte offset for error messages."""

    def __init__(self, stream: BinaryIO, source: str | None) -> None:
        self.stream = stream
        self.source = source
        self.offset = 0
        self.key: str | None = None  # the object being read
        self.last: str | None = None  # the last complete object

    def error(self, reason: str, cls: type = DataError) -> Exception:
        return cls(reason, source=self.source, key=self.key)

    def read(self, n: int) -> bytes:
        """Up to ``n`` bytes (fewer only at the end), in bounded chunks."""
        parts, got = [], 0
        while got < n:
            try:
                chunk = self.stream.read(min(n - got, _CHUNK))
            except DataError:
                raise
            except OSError as exc:
                raise self.error(f"cannot read ark at byte offset {self.offset}: {exc}") from exc
            if not chunk:
                break
            if not isinstance(chunk, bytes):
                raise TypeError("iter_ark needs a binary stream; open files with mode='b'")
            parts.append(chunk)
            got += len(chunk)
        self.offset += got
        return b"".join(parts)

    def take(self, n: int, what: str) -> bytes:
        data = self.read(n)
        if len(data) < n:
            raise self.error(
                f"truncated ark: it ends inside {what} ({len(data)} of {n} bytes, at byte "
                f"offset {self.offset})"
            )
        return data

    def readline(self) -> bytes:
        try:
            line = self.stream.readline()
        except DataError:
            raise
        except OSError as exc:
            raise self.error(f"cannot read ark at byte offset {self.offset}: {exc}") from exc
        self.offset += len(line)
        return line

    def next_key(self) -> str | None:
        """The next object's key (the token before a space), or None at the end of the ark."""
        token = bytearray()
        while True:
            char = self.read(1)
            if not char:
                if token:
                    raise self.error(
                        f"truncated ark: it ends inside a key ({bytes(token[:40])!r}) after "
                        f"{self._after()}"
                    )
                return None
            if char == b" " and token:
                break
            if char in _WHITESPACE and not token:
                continue  # between objects of a text ark
            token += char
            if len(token) > _KEY_MAX:
                raise self.error(
                    f"not a Kaldi ark: no space after a key within {_KEY_MAX} bytes at byte "
                    f"offset {self.offset - len(token)} ({self._after()})"
                )
        try:
            return token.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self.error(
                f"not a Kaldi ark: the key at byte offset {self.offset - len(token) - 1} is "
                f"not UTF-8 ({self._after()})"
            ) from exc

    def _after(self) -> str:
        return f"key {self.last!r}" if self.last is not None else "the start of the ark"

    def next_object(self) -> bytes:
        """The bytes of one matrix object, checked to be complete; refuses non-matrices."""
        start = self.offset
        head = self.take(2, "an object header")
        if head == b"\0B":
            return head + self._binary_object()
        magic = head + self.read(3)
        if magic.startswith(b"PKL"):
            raise self.error("holds a pickled object; speechpipe never unpickles",
                             UnsafeInputError)
        if magic[:4] in (b"RIFF", b"fLaC") or magic == b"AUDIO":
            raise self.error("holds audio, not a feature matrix")
        if magic.startswith(b"NPY"):
            if len(magic) < 5:
                raise self.error(f"truncated ark: it ends inside an NPY header (at byte "
                                 f"offset {self.offset})")
            return self._npy_object(magic)
        if magic.lstrip(b" \t").startswith(b"["):
            return self._text_object(magic)
        raise self.error(
            f"not a Kaldi matrix at byte offset {start} (it starts with {magic!r})"
        )

    def _binary_object(self) -> bytes:
        first = self.take(1, "an object header")
        if first == b"\x04":
            raise self.error("holds an integer vector, not a feature matrix")
        token = bytearray(first)
        while True:
            char = self.take(1, "an object header")
            if char == b" ":
                break
            token += char
            if len(token) > 3:
                break
        kind = token.decode("latin-1")
        if kind in _FLOAT_TYPES:
            dims = self.take(10, f"the {kind} header")
            if dims[0:1] != b"\x04" or dims[5:6] != b"\x04":
                raise self.error(f"bad size marker in the {kind} header")
            rows, cols = struct.unpack("<i", dims[1:5])[0], struct.unpack("<i", dims[6:10])[0]
            header = token + b" " + dims
            body = _FLOAT_TYPES[kind] * rows * cols
        elif kind in _COMPRESSED_TYPES:
            dims = self.take(16, f"the {kind} header")
            rows, cols = struct.unpack("<ii", dims[8:16])
            header = token + b" " + dims
            per_value = 2 if kind == "CM2" else 1
            body = (8 * cols if kind == "CM" else 0) + per_value * rows * cols
        elif kind in _VECTOR_TYPES:
            raise self.error(f"holds a vector ({kind}), not a feature matrix (frames, dim)")
        else:
            raise self.error(
                f"unsupported binary object type {kind!r} (expected one of FM, DM, CM, CM2, CM3)"
            )
        if rows < 0 or cols < 0:
            raise self.error(f"negative size {rows} x {cols} in the {kind} header")
        return bytes(header) + self.take(body, f"a {rows} x {cols} {kind} matrix")

    def _npy_object(self, magic: bytes) -> bytes:
        width = magic[3]
        if not 0 < width <= 8:
            raise self.error("bad NPY length header")
        length = int.from_bytes(magic[4:5] + self.take(width - 1, "an NPY header"), "little")
        return magic[:4] + length.to_bytes(width, "little") + self.take(length, "an NPY array")

    def _text_object(self, head: bytes) -> bytes:
        parts = [head]
        seen = head
        while b"]" not in seen:
            seen = self.readline()
            if not seen:
                raise self.error(
                    f"truncated ark: a text matrix has no closing ']' (at byte offset "
                    f"{self.offset})"
                )
            parts.append(seen)
        if not seen.endswith(b"\n"):  # ']' came with the header bytes or at the very end
            parts.append(self.readline())
        return b"".join(parts)


def _decode_object(data: bytes, reader: _ArkReader) -> np.ndarray:
    try:
        if data.startswith(b"NPY"):
            width = data[3]
            array = np.load(io.BytesIO(data[4 + width:]), allow_pickle=False)
        else:
            with np.errstate(all="ignore"):
                array = read_kaldi(io.BytesIO(data))
    # kaldiio reports corrupt data with assert, struct.error, ValueError, IndexError...: any
    # of them means the bytes are not a matrix.
    except Exception as exc:
        raise reader.error(f"cannot read a matrix: {type(exc).__name__}: {exc}") from exc
    if not isinstance(array, np.ndarray) or array.ndim != 2:
        shape = getattr(array, "shape", type(array).__name__)
        raise reader.error(f"expected a matrix (frames, dim), got {shape}")
    if array.dtype.kind not in "fiub":
        raise reader.error(f"expected numbers, got dtype {array.dtype}")
    return np.ascontiguousarray(array, dtype=np.float32)


def iter_ark(stream: BinaryIO, *, source: str | None = None) -> Iterator[tuple[str, np.ndarray]]:
    """Yield ``(key, float32 matrix (frames, dim))`` for each object of a Kaldi ark, in order.

    Reads strictly sequentially (no seeking), so the stream may be a pipe or an HTTP
    response. Each object's header is parsed first -- binary float/double (``FM``, ``DM``),
    compressed (``CM``, ``CM2``, ``CM3``), kaldiio's ``NPY``, or a text matrix ``[ ... ]`` --
    its exact bytes are read, and only then does kaldiio decode them, so a truncated ark is
    detected at the object it cuts and nothing stored in an ark is unpickled. Equivalent to
    ``kaldiio.load_ark`` on valid matrix arks, read to the end of the stream.

    Args:
        stream: a binary stream (with ``read`` and, for text arks, ``readline``) at the start
            of the ark; it is not closed.
        source: the ark's path or URL, named in error messages.

    Raises:
        DataError: the ark ends inside a key or an object (``"truncated ark"``), a header is
            malformed, or an object is not a numeric matrix (audio, vectors, int vectors);
            the message names the ark, the key and a byte offset.
        UnsafeInputError: a pickled object (kaldiio's ``PKL``).

    >>> import io, numpy as np, kaldiio
    >>> buf = io.BytesIO()
    >>> kaldiio.save_ark(buf, {"u1": np.ones((2, 3), np.float32), "u2": np.zeros((1, 3))})
    >>> [(k, m.shape, m.dtype.name) for k, m in iter_ark(io.BytesIO(buf.getvalue()))]
    [('u1', (2, 3), 'float32'), ('u2', (1, 3), 'float32')]
    >>> list(iter_ark(io.BytesIO(buf.getvalue()[:30]), source="raw.ark"))
    Traceback (most recent call last):
    ...
    speechpipe.errors.DataError: raw.ark (key 'u1'): truncated ark: it ends inside a 2 x 3 FM ...
    """
    reader = _ArkReader(stream, source)
    while True:
        reader.key = None
        key = reader.next_key()
        if key is None:
            return
        reader.key = key
        array = _decode_object(reader.next_object(), reader)
        reader.last = key
        yield key, array
