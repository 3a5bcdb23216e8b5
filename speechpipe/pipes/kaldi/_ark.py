"""Kaldi ark files: ark references, the objects stored in arks, and one header parser.

An scp value ``raw.ark:1234[0:9]`` names an ark file (:func:`parse_ark_ref`), the byte offset of
an object in it and an optional Kaldi range of rows and columns (:func:`parse_range`). The
objects are binary float/double matrices (``FM``, ``DM``), compressed matrices (``CM``,
``CM2``, ``CM3``), kaldiio's ``NPY`` arrays, text matrices ``[ ... ]``, or audio.

Arks are read two ways, and both check an object's header with the same parser before kaldiio
decodes it, so that nothing is unpickled (kaldiio's ``PKL`` objects are refused) and no corrupt
size makes us allocate more than the file holds:

- at an offset (:func:`decode_matrix`, :func:`audio_bytes_in_ark`), for ``load_scp``: a
  seekable file, errors naming the table line and ``ark:offset``;
- in sequence (:func:`iter_ark`), for streaming arks as shards: a pipe or HTTP body read front
  to back, errors naming the ark, the key and a byte offset; :func:`kaldi_arks` lists the arks
  of a ``feats.scp`` to stream them so.
"""

from __future__ import annotations

import io
import os
import re
import struct
from typing import Any, BinaryIO, Callable, Iterator, NamedTuple, Protocol

import numpy as np
from kaldiio.matio import read_kaldi

from ...errors import DataError, UnsafeInputError
from ...remote import RemoteOptions
from ._tables import table_error, Location, WHITESPACE, read_scp_table

__all__ = [
    "ArkRef",
    "iter_ark",
    "kaldi_arks",
    "parse_ark_ref",
]

# <path>[:<offset>][<range>]; the lazy path lets a trailing ":<digits>" be the offset.
_ARK_REF = re.compile(r"(?P<path>.+?)(?::(?P<offset>[0-9]+))?(?:\[(?P<range>[^\[\]]*)\])?", re.S)


class ArkRef(NamedTuple):
    """An scp value read as an ark reference: the ark's path, the byte offset of the object
    (None: none given, the object at the start) and the matrix range (``"0:9"``, or None)."""

    path: str
    offset: int | None
    range: str | None


def parse_ark_ref(value: str) -> ArkRef | None:
    """The one grammar of an ark reference, ``<path>[:<offset>][[<range>]]`` (None for "").

    >>> parse_ark_ref("raw.ark:1234[0:9]")
    ArkRef(path='raw.ark', offset=1234, range='0:9')
    >>> parse_ark_ref("feats.mat")
    ArkRef(path='feats.mat', offset=None, range=None)
    """
    match = _ARK_REF.fullmatch(value)
    if match is None:
        return None
    offset = match["offset"]
    return ArkRef(match["path"], None if offset is None else int(offset), match["range"])

# Binary object types (the token after "\0B"): float and double matrices and vectors, and
# Kaldi's three compressed matrix formats. _BINARY_TYPES is in the order errors list them.
_BINARY_TYPES = ("FM", "FV", "DM", "DV", "CM", "CM2", "CM3")
_MATRIX_TYPES = ("FM", "DM", "CM", "CM2", "CM3")
_VECTOR_TYPES = ("FV", "DV")
_COMPRESSED_TYPES = ("CM", "CM2", "CM3")
# What _binary_type gives for an integer vector ("\0B\x04": a size marker where the type is).
_INT_VECTOR = "int32 vector"
# Types have at most 3 characters: 4 bytes without the space that ends one are not a type.
_TYPE_MAX = 4

# Ark reading: payloads are read in chunks of this size, so that a corrupt size field never
# makes us allocate more than the stream actually holds; a key longer than _KEY_MAX bytes
# means the stream is not an ark.
_CHUNK = 1 << 24
_KEY_MAX = 4096
_WHITESPACE_BYTES = WHITESPACE.encode("ascii")


# --------------------------------------------------------------------------- ark references


def parse_range(text: str, shape: tuple[int, ...], name: str, where: Location) -> tuple:
    """Kaldi's ``[r1:r2]`` / ``[r1:r2,c1:c2]`` (inclusive bounds; empty means all)."""
    parts = text.split(",")
    if len(parts) > 2:
        raise table_error(DataError, f"{name}: bad range [{text}]: at most rows,cols", where)
    index = []
    for part, size, axis in zip(parts, shape, ("row", "column")):
        part = part.strip()
        if part in ("", ":"):
            index.append(slice(None))
            continue
        bounds = part.split(":")
        if len(bounds) != 2 or not all(b.strip().isdigit() for b in bounds):
            raise table_error(DataError, f"{name}: bad range [{text}]: expected first:last", where)
        first, last = (int(b) for b in bounds)
        if first > last:
            raise table_error(
                DataError, f"{name}: bad range [{text}]: first {axis} {first} > last {last}", where
            )
        if last >= size:
            raise table_error(
                DataError,
                f"{name}: {axis} range {first}:{last} is outside the matrix's {size} {axis}s",
                where,
            )
        index.append(slice(first, last + 1))
    return tuple(index)


# --------------------------------------------------------------------------- object headers


class _HeaderSource(Protocol):
    """Where the header parser reads from: :class:`_Header` (an object at an offset) or
    :class:`_ArkReader` (an ark in sequence). Each words its own errors."""

    #: Reason for a wrong size marker, formatted with ``kind``.
    bad_marker: str

    def take(self, n: int, what: str) -> bytes:
        """Exactly ``n`` bytes, or raise the source's "truncated" error naming ``what``."""

    def error(self, reason: str, cls: type = DataError) -> Exception:
        """The error to raise for ``reason``, located where the source is."""


def _object_format(magic: bytes) -> str:
    """What an object's first (up to 5) bytes say it is.

    ``"binary"`` (``\\0B``), ``"npy"``, ``"text"`` (``[``), ``"pickle"``, ``"audio"`` (RIFF,
    FLAC, kaldiio's AUDIO), or ``""`` for anything else.

    >>> [_object_format(m) for m in (b"\\0BFM ", b"NPY\\x01\\x00", b" [ 1", b"PKL", b"RIFF$")]
    ['binary', 'npy', 'text', 'pickle', 'audio']
    """
    if magic.startswith(b"\0B"):
        return "binary"
    if magic.startswith(b"PKL"):
        return "pickle"
    if magic[:4] in (b"RIFF", b"fLaC") or magic == b"AUDIO":
        return "audio"
    if magic.startswith(b"NPY"):
        return "npy"
    if magic.lstrip(b" \t").startswith(b"["):
        return "text"
    return ""


def _binary_type(source: _HeaderSource) -> str:
    """Read the type token after ``\\0B`` (``FM``, ``CM2``...) and the space that ends it.

    An integer vector has its size marker ``\\x04`` where the type would be: that gives
    :data:`_INT_VECTOR`. Reading stops after :data:`_TYPE_MAX` bytes without a space, so
    garbage gives a short token that no type matches.
    """
    first = source.take(1, "an object header")
    if first == b"\x04":
        return _INT_VECTOR
    token = bytearray(first)
    while len(token) < _TYPE_MAX:
        char = source.take(1, "an object header")
        if char == b" ":
            break
        token += char
    return token.decode("latin-1")


def _binary_sizes(source: _HeaderSource, kind: str) -> tuple[bytes, int, int, int]:
    """Read the sizes after a type token: ``(their bytes, rows, cols, bytes of the body)``.

    ``FM``/``DM``: ``\\x04 rows \\x04 cols`` (int32s after size markers), ``FV``/``DV``:
    ``\\x04 dim`` (one column), then 4 or 8 bytes a value. Compressed: min and range (two
    float32), rows, cols (int32); then ``CM`` has 8 bytes of quantiles a column and 1 byte a
    value, ``CM2`` 2 bytes a value, ``CM3`` 1. The sizes are not checked here.
    """
    if kind in _COMPRESSED_TYPES:
        dims = source.take(16, f"the {kind} header")
        rows, cols = struct.unpack("<ii", dims[8:16])
        per_value = 2 if kind == "CM2" else 1
        return dims, rows, cols, (8 * cols if kind == "CM" else 0) + per_value * rows * cols
    matrix = kind[1] == "M"
    dims = source.take(10 if matrix else 5, f"the {kind} header")
    if dims[0:1] != b"\x04" or (matrix and dims[5:6] != b"\x04"):
        raise source.error(source.bad_marker.format(kind=kind))
    rows = struct.unpack("<i", dims[1:5])[0]
    cols = struct.unpack("<i", dims[6:10])[0] if matrix else 1
    return dims, rows, cols, (4 if kind[0] == "F" else 8) * rows * cols


_NPY_HEADER_READERS = {(1, 0): np.lib.format.read_array_header_1_0,
                       (2, 0): np.lib.format.read_array_header_2_0}
_NPY_HEADER_MAX = 65536 + 12  # bytes of an .npy payload that hold its header (format 2.0)
_NPY_OBJECTS = ("holds a .npy array of Python objects (dtype object), which only unpickling "
                "could read; speechpipe never unpickles (store numeric arrays)")


def _npy_holds_objects(payload: bytes) -> bool:
    """Whether the header at the start of an ``.npy`` payload declares a dtype holding Python
    objects (kaldiio's ``np.load`` refuses it without unpickling, as a ``ValueError``); False
    when the header cannot be read (the decoder then reports corrupt bytes)."""
    stream = io.BytesIO(payload)
    try:
        reader = _NPY_HEADER_READERS.get(np.lib.format.read_magic(stream))
        return reader is not None and reader(stream)[2].hasobject
    except (ValueError, TypeError, SyntaxError):
        return False


def _npy_length(magic: bytes, source: _HeaderSource) -> int:
    """The length of the array after kaldiio's ``NPY`` header, whose first 5 bytes are
    ``magic`` (``NPY``, the width of the length, its first byte); reads the rest of it."""
    width = magic[3]
    if not 0 < width <= 8:
        raise source.error("bad NPY length header")
    return int.from_bytes(magic[4:5] + source.take(width - 1, "an NPY header"), "little")


def _decoded(source: _HeaderSource, decode: Callable[[], Any]) -> np.ndarray:
    """Run a decoder (kaldiio's or numpy's) and check that it gave a numeric matrix."""
    try:
        with np.errstate(all="ignore"):
            array = decode()
    # kaldiio reports corrupt data with assert, struct.error, ValueError, RuntimeError,
    # IndexError, UnicodeDecodeError...: any of them means the bytes are not a matrix.
    except Exception as exc:
        raise source.error(f"cannot read a matrix: {type(exc).__name__}: {exc}") from exc
    if not isinstance(array, np.ndarray) or array.ndim != 2:
        shape = getattr(array, "shape", type(array).__name__)
        raise source.error(f"expected a matrix (frames, dim), got {shape}")
    if array.dtype.kind not in "fiub":
        raise source.error(f"expected numbers, got dtype {array.dtype}")
    return array


# --------------------------------------------------------------------------- objects at an offset


def _size_of(stream: BinaryIO) -> int:
    position = stream.tell()
    size = stream.seek(0, io.SEEK_END)
    stream.seek(position)
    return size


class _Header:
    """Reads the header of the object at a stream's position (an scp ``ark:offset``).

    Errors name the object (``name``, e.g. ``raw.ark:1234``) at the table line that referred
    to it (``where``); a header cut short is a DataError.
    """

    bad_marker = "bad size marker in the header"

    def __init__(self, stream: BinaryIO, name: str, where: Location) -> None:
        self.stream, self.name, self.where = stream, name, where

    def take(self, n: int, what: str = "") -> bytes:
        data = self.stream.read(n)
        if len(data) < n:
            raise self.error("truncated object header")
        return data

    def error(self, reason: str, cls: type = DataError) -> Exception:
        return table_error(cls, f"{self.name}: {reason}", self.where)


def _check_matrix_object(stream: BinaryIO, name: str, where: Location) -> None:
    """Refuse what the matrix reader must not see, and check declared sizes fit the file.

    The stream is positioned at the object; kaldiio would unpickle ``PKL`` objects and would
    allocate whatever a corrupt header declares, so both are caught here first. Vectors pass
    (the decoded shape is refused later); text matrices are left to kaldiio.
    """
    start = stream.tell()
    available = _size_of(stream) - start
    head = _Header(stream, name, where)
    magic = stream.read(5)
    if len(magic) < 5:
        raise head.error(f"{len(magic)} bytes left in the file, too few for a matrix")
    form = _object_format(magic)
    if form == "pickle":
        raise table_error(
            UnsafeInputError, f"{name} holds a pickled object; speechpipe never unpickles", where
        )
    if form == "audio":
        raise table_error(
            DataError, f"{name} holds audio, not a feature matrix (use kind='wav')", where
        )
    need = 0
    if form == "npy":
        length = _npy_length(magic, head)
        need = 4 + magic[3] + length
        if _npy_holds_objects(stream.read(min(length, _NPY_HEADER_MAX))):
            raise table_error(UnsafeInputError, f"{name} {_NPY_OBJECTS}", where)
    elif form == "binary":
        stream.seek(start + 2)
        kind = _binary_type(head)
        if kind == _INT_VECTOR:
            raise table_error(DataError, f"{name} holds an integer vector, not a matrix", where)
        if kind not in _BINARY_TYPES:
            raise head.error(
                f"unsupported binary object type {kind!r} (expected one of "
                f"{', '.join(_BINARY_TYPES)})"
            )
        _, rows, cols, body = _binary_sizes(head, kind)
        if rows < 0 or cols < 0:
            raise head.error(f"negative size {rows} x {cols} in header")
        need = stream.tell() - start + body
    if need > available:
        raise head.error(
            f"truncated: the object needs {need} bytes, {available} are left in the file"
        )
    stream.seek(start)


def decode_matrix(stream: BinaryIO, name: str, where: Location) -> np.ndarray:
    """The matrix at the stream's position, checked (:func:`_check_matrix_object`) and read."""
    _check_matrix_object(stream, name, where)
    return _decoded(_Header(stream, name, where), lambda: read_kaldi(stream))


def audio_bytes_in_ark(stream: BinaryIO, name: str, where: Location) -> bytes:
    """The encoded audio stored at the stream's position (RIFF wav, kaldiio AUDIO, FLAC)."""
    start = stream.tell()
    available = _size_of(stream) - start
    head = _Header(stream, name, where)
    magic = stream.read(5)
    if not magic:
        raise table_error(DataError, f"{name}: the offset is at or past the end of the file", where)
    if magic[:4] == b"RIFF":
        stream.seek(start + 4)
        declared = struct.unpack("<I", head.take(4))[0] + 8
        stream.seek(start)
        # Streamed wavs may declare a size they do not have; soundfile copes with a short one.
        return stream.read(min(declared, available))
    if magic == b"AUDIO":
        width = head.take(1)[0]
        if not 0 < width <= 8:
            raise table_error(DataError, f"{name}: bad AUDIO length header", where)
        length = int.from_bytes(head.take(width), "little")
        if length > available - 6 - width:
            raise table_error(
                DataError,
                f"{name}: truncated: the audio needs {length} bytes, "
                f"{available - 6 - width} are left in the file",
                where,
            )
        return head.take(length)
    if magic[:4] == b"fLaC":
        stream.seek(start)
        return stream.read()
    raise table_error(
        DataError,
        f"{name} does not hold audio (expected RIFF, fLaC or AUDIO, found {magic!r})",
        where,
    )


# --------------------------------------------------------------------------- arks in sequence


class _ArkReader:
    """Sequential reads from an ark stream, counting the byte offset for error messages."""

    bad_marker = "bad size marker in the {kind} header"

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
            if char in _WHITESPACE_BYTES and not token:
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
        form = _object_format(magic)
        if form == "pickle":
            raise self.error("holds a pickled object; speechpipe never unpickles",
                             UnsafeInputError)
        if form == "audio":
            raise self.error("holds audio, not a feature matrix")
        if form == "npy":
            if len(magic) < 5:
                raise self.error(f"truncated ark: it ends inside an NPY header (at byte "
                                 f"offset {self.offset})")
            return self._npy_object(magic)
        if form == "text":
            return self._text_object(magic)
        raise self.error(
            f"not a Kaldi matrix at byte offset {start} (it starts with {magic!r})"
        )

    def _binary_object(self) -> bytes:
        kind = _binary_type(self)
        if kind == _INT_VECTOR:
            raise self.error("holds an integer vector, not a feature matrix")
        if kind in _VECTOR_TYPES:
            raise self.error(f"holds a vector ({kind}), not a feature matrix (frames, dim)")
        if kind not in _MATRIX_TYPES:
            raise self.error(
                f"unsupported binary object type {kind!r} (expected one of "
                f"{', '.join(_MATRIX_TYPES)})"
            )
        dims, rows, cols, body = _binary_sizes(self, kind)
        if rows < 0 or cols < 0:
            raise self.error(f"negative size {rows} x {cols} in the {kind} header")
        header = kind.encode("latin-1") + b" " + dims
        return header + self.take(body, f"a {rows} x {cols} {kind} matrix")

    def _npy_object(self, magic: bytes) -> bytes:
        length = _npy_length(magic, self)
        width = magic[3]
        payload = self.take(length, "an NPY array")
        if _npy_holds_objects(payload[:_NPY_HEADER_MAX]):
            raise self.error(_NPY_OBJECTS, UnsafeInputError)
        return magic[:4] + length.to_bytes(width, "little") + payload

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
    """The float32 matrix of an object's bytes from :meth:`_ArkReader.next_object`."""
    if data.startswith(b"NPY"):
        width = data[3]
        array = _decoded(
            reader, lambda: np.load(io.BytesIO(data[4 + width:]), allow_pickle=False)
        )
    else:
        array = _decoded(reader, lambda: read_kaldi(io.BytesIO(data)))
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


# --------------------------------------------------------------------------- data directories


def kaldi_arks(data_dir_or_feats_scp: str | os.PathLike, *,
               remote: RemoteOptions | None = None) -> list[str]:
    """The distinct ark files a ``feats.scp`` refers to, in order of first appearance.

    Streams a Kaldi data directory as shards with no packing::

        IterableWrapper(kaldi_arks("data/train")).sharded_shuffle(format="ark")

    Each ark is then read whole and in sequence, and the ark list is shuffled per epoch. Paths
    are returned as written; relative ones are relative to the current directory, as in Kaldi.

    **Read whole** means every utterance of each ark: if ``feats.scp`` lists only some of an
    ark's utterances (a ``subset_data_dir.sh`` subset, filtered utterances), the stream also
    holds the others -- keep the listed keys with ``filter`` or ``join_by_key``.

    In object storage, give the ``feats.scp`` URL (and ``remote``); its values are then ark
    URLs, read with ``sharded_shuffle(..., read_options=ShardReadOptions(remote=...))``. An
    ark in object storage is only streamed: ``load_scp``'s random access refuses it.

    Args:
        data_dir_or_feats_scp: a data directory (its ``feats.scp`` is read) or the file
            (local or a URL).
        remote: how a URL is read (:class:`~speechpipe.remote.RemoteOptions`).

    Raises:
        MissingDataError: no ``feats.scp``.
        DataError: a malformed line, or a value that cannot be streamed: a command
            (``... |``), a Kaldi range (``raw.ark:12[0:9]``) or a path without ``:offset``;
            the message names the file, line and key.

    >>> import os, pathlib, tempfile, numpy as np, kaldiio
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> for part in (2, 1):
    ...     spec = f"ark,scp:{d}/raw.{part}.ark,{d}/feats.{part}.scp"
    ...     with kaldiio.WriteHelper(spec) as writer:
    ...         for i in range(2):
    ...             writer(f"utt{part}{i}", np.zeros((3, 2), np.float32))
    >>> _ = (d / "feats.scp").write_text((d / "feats.2.scp").read_text()
    ...                                  + (d / "feats.1.scp").read_text())
    >>> [os.path.basename(p) for p in kaldi_arks(d)]
    ['raw.2.ark', 'raw.1.ark']
    """
    path = os.fspath(data_dir_or_feats_scp)
    if os.path.isdir(path):
        path = os.path.join(path, "feats.scp")
    arks: dict[str, None] = {}
    for entry in read_scp_table(path, remote=remote).values():
        value = entry.value
        where = {"source": entry.source, "line": entry.line, "key": entry.key}
        if value.endswith("|"):
            raise DataError(f"a command cannot be streamed as a shard: {value!r}", **where)
        ref = parse_ark_ref(value)
        if ref is None or ref.offset is None:
            raise DataError(f"expected an ark reference '<ark>:<offset>', got {value!r}",
                            **where)
        if ref.range is not None:
            raise DataError(
                f"a range ({value!r}) selects part of a matrix; streaming reads whole "
                "matrices (load this table with load_scp instead)",
                **where,
            )
        arks.setdefault(ref.path, None)
    return list(arks)
