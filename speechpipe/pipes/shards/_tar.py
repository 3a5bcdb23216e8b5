"""The tar format, read: header by header, checked, into ``(member name, payload)`` pairs.

:func:`speechpipe.pipes.shards._reader.iter_tar_members` (whose docstring says which formats and
errors) walks a shard with :func:`iter_members` over a stream (:class:`StreamReader`) or a
mapped file (:class:`MappedReader`).
"""

from __future__ import annotations

from typing import Callable, Iterator

from ...errors import DataError
from ...memory import MappedFile

__all__ = ["BLOCK", "MappedReader", "StreamReader", "TRUNCATED", "iter_members"]

BLOCK = 512
_ZERO_BLOCK = bytes(BLOCK)
# Payloads up to this size are read with one read(); larger ones in chunks of this size, so
# that a corrupt size field never makes us allocate more than the stream actually holds.
_CHUNK = 1 << 26
# After the end-of-archive marker, at most this much is read to reach the end of the stream.
_TRAILER = 1 << 20
# Mapped shards: payloads of at least _VIEW_MIN bytes are zero-copy views of the mapping,
# smaller ones are copied into bytes.
_VIEW_MIN = 1 << 16
# Extended headers (GNU long names, pax records) are metadata: one larger than this is refused
# before it is read, whatever the member cap.
_MAX_EXTENDED = 1 << 20
_REGULAR = (b"0", b"\0", b"7")  # '7' (contiguous file) is a regular file for every reader
_DIRECTORY = b"5"
_GNU_LONGNAME = b"L"
_GNU_LONGLINK = b"K"
_PAX_HEADER = b"x"
_PAX_GLOBAL = b"g"
_EXTENDED = (_GNU_LONGNAME, _GNU_LONGLINK, _PAX_HEADER, _PAX_GLOBAL)
_TYPE_NAMES = {
    b"1": "hard link",
    b"2": "symbolic link",
    b"3": "character device",
    b"4": "block device",
    b"6": "FIFO",
    b"S": "GNU sparse file",
    b"M": "GNU multi-volume continuation",
    b"V": "GNU volume label",
    b"X": "Solaris extended header",
}
_POSIX_MAGIC = b"ustar\x00"
_COMPRESSED = (b"\x1f\x8b", b"BZh", b"\xfd7zXZ\x00", b"\x28\xb5\x2f\xfd")

TRUNCATED = "truncated shard"


def _read_exact(read: Callable[[int], bytes], n: int) -> bytes:
    """Read ``n`` bytes, fewer only at end of stream; one ``read`` call in the usual case."""
    if n <= _CHUNK:
        data = read(n)
        if data is None:
            data = b""
        if isinstance(data, str):
            raise TypeError("read_shards needs binary streams; open files with mode='b'")
        if len(data) == n or not data:
            return data
        parts, got = [data], len(data)
    else:
        parts, got = [], 0
    while got < n:
        chunk = read(min(n - got, _CHUNK))
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def _nts(field: bytes) -> bytes:
    """Bytes up to the first NUL."""
    end = field.find(b"\0")
    return field if end < 0 else field[:end]


def _decode_name(raw: bytes) -> str:
    # As tarfile does on Linux: UTF-8, undecodable bytes kept as surrogates.
    return raw.decode("utf-8", "surrogateescape")


def _parse_number(field: bytes) -> int | None:
    """An octal number field, or GNU base-256; ``None`` when it is not a number."""
    if field[0] & 0x80:
        if field[0] == 0xFF:  # negative base-256
            return None
        return int.from_bytes(bytes([field[0] & 0x7F]) + field[1:], "big")
    text = _nts(field).strip(b" ")
    if not text:
        return 0
    try:
        return int(text, 8)
    except ValueError:
        return None


def _checksum_ok(header: bytes) -> bool | None:
    """Whether the stored header checksum matches; ``None`` if it is not a number."""
    text = _nts(header[148:156]).strip(b" ")
    try:
        stored = int(text, 8)
    except ValueError:
        return None
    unsigned = sum(header[:148]) + 8 * 0x20 + sum(header[156:])
    if stored == unsigned:
        return True
    # Some old tars summed signed chars.
    signed = unsigned - 256 * (sum(1 for b in header[:148] if b > 127)
                               + sum(1 for b in header[156:] if b > 127))
    return stored == signed


def _parse_pax(payload: bytes, *, source: str | None, offset: int) -> dict[str, str]:
    """Records ``"<len> <keyword>=<value>\\n"`` of a pax extended header."""
    records: dict[str, str] = {}
    pos, end = 0, len(payload)
    while pos < end and payload[pos] != 0:
        space = payload.find(b" ", pos, pos + 20)
        length_text = payload[pos:space] if space > pos else b""
        length = int(length_text) if length_text.isdigit() else 0
        record = payload[pos:pos + length]
        if length <= space - pos + 1 or len(record) != length or not record.endswith(b"\n"):
            raise DataError(
                f"malformed pax extended header record at byte offset {offset + pos}",
                source=source,
            )
        keyword, eq, value = record[space - pos + 1:-1].partition(b"=")
        if not eq:
            raise DataError(
                f"malformed pax extended header record at byte offset {offset + pos}: "
                "no '='",
                source=source,
            )
        records[keyword.decode("utf-8", "surrogateescape")] = _decode_name(value)
        pos += length
    return records


def _check_not_compressed(header: bytes, offset: int, source: str | None) -> None:
    """Name the problem when a shard that is not a tar starts like a compressed file."""
    if offset == 0 and header.startswith(_COMPRESSED):
        raise DataError(
            "the shard is compressed (gzip, bzip2, xz or zstd) but not named so: name it "
            ".tar.gz or .tar.zst to have it decompressed as it is read, else repack it",
            source=source,
        )


def _after(last: str | None) -> str:
    """Where a walk is, for error messages: after its last complete member."""
    return f"after member {last!r}" if last is not None else "before any member"


class StreamReader:
    """The tar walk's reads from a stream; every payload is ``bytes``."""

    __slots__ = ("_read", "source", "last")

    def __init__(self, read: Callable[[int], bytes], source: str | None) -> None:
        self._read = read
        self.source = source
        self.last: str | None = None  # the last complete member, named in errors

    def read(self, n: int) -> bytes:
        """``n`` bytes, fewer only at the end of the stream; a failed read as a DataError."""
        try:
            return _read_exact(self._read, n)
        except DataError:
            raise
        except OSError as exc:
            raise DataError(f"cannot read shard ({_after(self.last)}): {exc}",
                            source=self.source) from exc

    def payload(self, n: int, name: str = "") -> bytes:
        return self.read(n)

    def check_unchanged(self) -> None:
        """A stream cannot shrink under its reader."""

    def read_trailer(self) -> None:
        self.read(_TRAILER)


class MappedReader:
    """The tar walk's reads from a mapped file: payloads of ``_VIEW_MIN`` bytes or more whose
    member name ends with one of ``view_extensions`` (lower case, without the dot) are views of
    the mapping, the rest ``bytes``."""

    __slots__ = ("mapped", "source", "view_extensions", "last")

    def __init__(self, mapped: MappedFile, source: str | None,
                 view_extensions: frozenset[str]) -> None:
        self.mapped = mapped
        self.source = source
        self.view_extensions = view_extensions
        self.last: str | None = None  # the last complete member, named in errors

    def read(self, n: int) -> bytes:
        return self.mapped.read(n)

    def payload(self, n: int, name: str = "") -> bytes | memoryview:
        if n >= _VIEW_MIN and name.rpartition(".")[2].lower() in self.view_extensions:
            return self.mapped.view(n)
        return self.mapped.read(n)

    def check_unchanged(self) -> None:
        """Raise if the file has become shorter than its mapping (touching the cut part of
        the mapping would be a SIGBUS)."""
        now = self.mapped.shrunk()
        if now is not None:
            raise DataError(
                f"the shard file shrank from {self.mapped.size} to {now} bytes while it was "
                f"being read ({_after(self.last)}): it was modified in place",
                source=self.source,
            )

    def read_trailer(self) -> None:
        self.mapped.skip(_TRAILER)


def iter_members(
    reader: StreamReader | MappedReader, max_member_bytes: int | None = None,
) -> Iterator[tuple[str, bytes | memoryview]]:
    """The tar walk of :func:`iter_tar_members`: header by header, extended headers
    (GNU long names, pax) gathered for the member that follows them. A regular member larger
    than ``max_member_bytes`` (``None``: no cap) raises before a byte of it is read."""
    source = reader.source
    offset = 0  # byte offset of the next header
    pad = 0  # padding of the previous payload, read together with the next header
    long_name: str | None = None
    pax: dict[str, str] = {}
    while True:
        reader.check_unchanged()
        header = _next_header(reader, pad, offset + pad)
        offset += pad
        if header is None:  # the end-of-archive marker
            if long_name is not None or pax:
                raise DataError(
                    f"extended header at the end of the archive is not followed by a member "
                    f"({_after(reader.last)})",
                    source=source,
                )
            # Read the rest (the record padding after the marker), so that an opener sees the
            # end of its stream and can check it (HTTP length, a command's exit status).
            reader.read_trailer()
            return
        typeflag = header[156:157]
        size = _parse_number(header[124:136])
        if size is None:
            raise DataError(
                f"invalid size field {header[124:136]!r} in the header at byte offset "
                f"{offset} ({_after(reader.last)})",
                source=source,
            )
        data_offset = offset + BLOCK
        if typeflag in _EXTENDED:
            if size > _MAX_EXTENDED:
                raise DataError(
                    f"extended header at byte offset {offset} claims {size} bytes, more than "
                    f"the {_MAX_EXTENDED} an extended header may hold ({_after(reader.last)})",
                    source=source,
                )
            payload = reader.read(size)
            if len(payload) < size:
                raise DataError(
                    f"{TRUNCATED}: extended header at byte offset {offset} has "
                    f"{len(payload)} of {size} bytes ({_after(reader.last)})",
                    source=source,
                )
            if typeflag == _GNU_LONGNAME:
                long_name = _decode_name(_nts(payload))
            elif typeflag == _PAX_HEADER:
                pax.update(_parse_pax(payload, source=source, offset=data_offset))
        else:
            name, size = _member_name(header, size, long_name, pax, source)
            long_name, pax = None, {}
            if max_member_bytes is not None and size > max_member_bytes:
                raise DataError(
                    f"member of {size} bytes is larger than max_member_bytes="
                    f"{max_member_bytes} (ShardReadOptions): a decompression bomb or a "
                    "corrupt size; raise the cap if the shard is yours and the member real",
                    source=source, member=name,
                )
            data = _member_payload(reader, typeflag, name, size)
            reader.last = name
            if data is not None:
                yield name, data
        offset = data_offset + size
        pad = -size % BLOCK


def _next_header(reader: StreamReader | MappedReader, pad: int, offset: int) -> bytes | None:
    """The header at byte ``offset`` (read after ``pad`` bytes of the previous payload's
    padding), its checksum verified; ``None`` for the end-of-archive marker (a zero block)."""
    source = reader.source
    block = reader.read(pad + BLOCK)
    header = block[pad:] if pad else block
    if len(header) < BLOCK:
        _check_not_compressed(header, offset, source)
        if not header:
            raise DataError(
                f"{TRUNCATED}: it ends {_after(reader.last)} without the end-of-archive "
                f"marker (at byte offset {offset})",
                source=source,
            )
        raise DataError(
            f"{TRUNCATED}: partial header ({len(header)} of {BLOCK} bytes) at byte "
            f"offset {offset}, {_after(reader.last)}",
            source=source,
        )
    if header == _ZERO_BLOCK:
        return None
    ok = _checksum_ok(header)
    if not ok:
        _check_not_compressed(header, offset, source)
        what = "bad header checksum" if ok is False else "bad header checksum (not a number)"
        raise DataError(
            f"{what} at byte offset {offset} ({_after(reader.last)}): not a tar header, or a "
            "corrupt shard",
            source=source,
        )
    return header


def _member_name(header: bytes, size: int, long_name: str | None, pax: dict[str, str],
                 source: str | None) -> tuple[str, int]:
    """A member's name and payload size: a pax ``path`` before a GNU long name before the
    ustar ``prefix/name``; a pax ``size`` before the header's."""
    if "path" in pax and pax["path"]:
        name = pax["path"]
    elif long_name is not None:
        name = long_name
    else:
        name = _decode_name(_nts(header[:100]))
        if header[257:263] == _POSIX_MAGIC:
            prefix = _nts(header[345:500])
            if prefix:
                name = _decode_name(prefix) + "/" + name
    if pax.get("size"):
        if not (pax["size"].isascii() and pax["size"].isdigit()):
            raise DataError(f"invalid pax size {pax['size']!r}", source=source, member=name)
        size = int(pax["size"])
    if any(k.startswith("GNU.sparse.") for k in pax):
        raise DataError("unsupported member type GNU sparse file (pax)", source=source,
                        member=name)
    return name, size


def _member_payload(reader: StreamReader | MappedReader, typeflag: bytes, name: str,
                    size: int) -> bytes | memoryview | None:
    """A regular file's payload; ``None`` for a directory (its payload, if any, skipped).
    Other member types raise."""
    source = reader.source
    if typeflag in _REGULAR and not (typeflag == b"\0" and name.endswith("/")):
        # one read into a new bytes object (one copy), or a view of the mapped file
        data = reader.payload(size, name)
        if len(data) < size:
            raise DataError(
                f"{TRUNCATED}: member payload has {len(data)} of {size} bytes",
                source=source,
                member=name,
            )
        return data
    if typeflag == _DIRECTORY or typeflag == b"\0":
        skipped = reader.payload(size) if size else b""
        if len(skipped) < size:
            raise DataError(f"{TRUNCATED}: directory entry payload is cut short",
                            source=source, member=name)
        return None
    kind = _TYPE_NAMES.get(typeflag, f"typeflag {typeflag!r}")
    raise DataError(
        f"unsupported member type: {kind}; shards may hold only regular files "
        "(and directories, which are skipped)",
        source=source,
        member=name,
    )
