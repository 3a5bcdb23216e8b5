"""Tar shards in webdataset naming: reading them into samples (writing: :mod:`shard_writer`).

A shard is a tar file whose members are grouped into samples by **key**: the member path up
to the first dot of its basename is the key, the rest is the **field**
(``dir/utt1.feats.npy`` -> key ``dir/utt1``, field ``feats.npy``), and consecutive members
with the same key form one sample. This is webdataset's convention, so shards written by
``webdataset.TarWriter``/``ShardWriter`` are read here and the other way round.

Verbs and functions:

- :func:`iter_tar_members`: a tar reader written from the format itself (ustar, GNU long
  names, pax headers) that *detects* truncation and corruption -- ``tarfile``'s stream mode
  ends silently on a truncated header -- and yields ``(member name, payload)``. A local file
  is memory-mapped and its large payloads are zero-copy read-only ``memoryview`` s of the
  mapping (see "Memory-mapped shards" below); other streams are read. The format itself is
  read by the private :mod:`speechpipe.pipes.shards._tar`.
- :class:`ShardReadOptions`: whether local shards are mapped and read ahead.
- :func:`group_by_key`: members to raw samples ``{"key", "source", "<field>": bytes, ...}``.
- ``read_shards`` (:class:`ShardReaderIterDataPipe`): ``(path or URL, binary stream)`` pairs,
  as yielded by ``open`` or torch's ``open_files(mode="b")``, to raw samples; follow it with
  ``decode`` (:mod:`speechpipe.pipes.decode._decode`).
- :func:`~speechpipe.pipes.shards._writer.write_shard` and
  :class:`~speechpipe.pipes.shards._writer.ShardWriter` (in :mod:`speechpipe.pipes.shards._writer`,
  a floor above, since they encode with ``decode``'s encoders): samples to shards.

Memory-mapped shards
--------------------

When the stream given to :func:`iter_tar_members` reads a local regular file as it is (a file
from ``open(path, "rb")``, speechpipe's ``open``/``open_stream``, or torch's ``open_files``),
the file is mapped read-only instead of read (:mod:`speechpipe.memory._mmap`): each array or
audio payload (``.npy``, ``.flac``, ``.wav``, ``.mp3``, ``.ogg``, ``.opus``) of at least 64 KiB
is a read-only ``memoryview`` of the mapping -- no copy, no fresh heap allocation; the bytes
stay in the page cache until a consumer (``decode``'s ``.npy`` view, then collation) copies
them once into a batch -- and other payloads (text, JSON, labels, unknown members, small ones)
are copied into ``bytes``. A view is bytes-like (``np.frombuffer``, ``soundfile``,
``io.BytesIO`` take it); ``bytes(view)`` makes a copy for code that insists on ``bytes``. On
Linux, a shard of 16 MiB or more gets a read-ahead thread (:mod:`speechpipe.memory._readahead`):
up to 256 MiB ahead of the reader, it reads the file sequentially into the page cache (unless
it is there already), without holding the GIL, so the reader (often the training loop's
thread) does not wait for the disk; a reader
that finishes a shard lets its thread finish too (the views it handed out are still to be
read), one stopped early stops it. Smaller shards, other systems and
``ShardReadOptions(readahead=False)`` ask the kernel for read-ahead
(``madvise(MADV_WILLNEED)``) as the reader walks the file.
Remote (``http(s)://``, ``s3://``...) and ``pipe:`` streams, compressed file objects,
``BytesIO`` and anything else are read with ``read`` as before, payloads as ``bytes``. Every
check is the same on both paths: header checksums, the end-of-archive marker, each member's
extent checked against the mapped size before any of it is touched, so a truncated shard
raises :class:`~speechpipe.errors.DataError` naming the shard and the member.

A view keeps the mapping alive after the stream is closed (before Python 3.13 the mapping
also holds a duplicate file descriptor); a shard is unmapped with its last view -- after
``decode``, the ``.npy`` arrays viewing it, which collation copies into the batch and lets go.
``decode`` keeps unknown fields as ``bytes``. Views cannot be pickled: send decoded samples
between processes, not raw ones, or turn mapping off. A file is mapped at its size when it is
opened, so a shard still being written reads as truncated.

The remaining risk is the file changing *while it is mapped*. Before each member the reader
checks that the file has not shrunk (a ``DataError`` saying so), but a shard truncated in
place after a member was handed out makes touching that member's view a ``SIGBUS`` (a crash,
not an exception), and an I/O error of the storage under a mapped page is a ``SIGBUS`` too,
where ``read`` would raise. Replace shards by writing a new file and renaming it (as
:class:`ShardWriter` and :func:`speechpipe.pack.pack_data` do), never in place. Shards on a
network or FUSE file system (NFS, CIFS, Lustre, Ceph, sshfs...: :data:`NETWORK_FILE_SYSTEMS`,
read from ``/proc/self/mounts``) are read, not mapped, unless mapping is asked for; on other
storage that reports read errors turn mapping off with ``ShardReadOptions(mmap=False)``
(the ``read_options`` of ``iter_tar_members``, ``read_shards`` and ``sharded_shuffle``).

Both settings are :class:`ShardReadOptions` (the ``read_options`` of ``iter_tar_members``,
``read_shards`` and ``sharded_shuffle``). Measurements: benchmarks/README.md, "Shard
reading".

Compressed shards
-----------------

A shard whose name ends in ``.tar.gz``/``.tgz`` (gzip) or ``.tar.zst``/``.tzst`` (zstd,
``pip install 'speechpipe[zstd]'``) is decompressed as it is read, sequentially, never mapped;
a truncated or corrupt compressed stream raises :class:`~speechpipe.errors.DataError` naming
the shard. ``pack --compress gz|zst`` writes them.
"""

from __future__ import annotations

import gzip
import os
import zlib
from dataclasses import dataclass
from typing import Any, BinaryIO, Callable, Iterable, Iterator

from ...diagnostics import Diagnostics, check_on_error
from ...errors import DataError
from ...index import shard_compression
from ...remote import RemoteOptions
from ...sample import AUDIO_EXTENSIONS, KEY, NPY_EXTENSIONS, SOURCE, Sample
from .._core import functional_datapipe, IterDataPipe
from ...memory import MappedFile
from ._tar import iter_members, MappedReader, StreamReader, TRUNCATED
from ...errors import redact
from ...memory import NETWORK_FILE_SYSTEMS

__all__ = [
    "ShardReadOptions",
    "ShardReaderIterDataPipe",
    "group_by_key",
    "iter_tar_members",
    "split_member_name",
]

# Mapped shards: only arrays and audio are views (what ``decode`` turns into arrays;
# bytes-like consumers -- numpy, soundfile, io.BytesIO -- take them); text, JSON and unknown
# members stay ``bytes``, whatever their size, so that ``payload.decode()`` keeps working.
_VIEW_EXTENSIONS = frozenset(AUDIO_EXTENSIONS + NPY_EXTENSIONS)
_RESERVED_FIELDS = (KEY, SOURCE)


# --------------------------------------------------------------------------------------------
# Reading options
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ShardReadOptions:
    """How local tar shards are read: by :func:`iter_tar_members`, ``read_shards`` and
    ``sharded_shuffle`` (their ``read_options``; the module docs, "Memory-mapped shards", say
    what mapping and reading ahead do).

    Args:
        mmap: ``None`` (default): map local files unless the file is on a network or FUSE file
            system (:data:`NETWORK_FILE_SYSTEMS`, from ``/proc/self/mounts``); ``True``: map
            local files wherever they are; ``False``: always read, every payload ``bytes``.
        readahead: a thread reading a cold mapped shard of 16 MiB or more ahead of its reader
            (Linux). ``None`` (default) or ``True``: yes; ``False``: no, the kernel is asked for
            read-ahead (``madvise``) as the reader goes.
        remote: how object-storage shards (``s3://``...) are read
            (:class:`~speechpipe.remote.RemoteOptions`: ``storage_options``, retries, block
            size, timeout); ``None``: its defaults.
        max_member_bytes: the largest member a shard may hold, in bytes (default 128 MiB:
            an hour of 16 kHz 16-bit WAV is 115 MB, as is an hour of 80-dimensional float32
            features at 100 frames per second); a larger one raises
            :class:`~speechpipe.errors.DataError` naming the shard and the member before any
            of it is read or decompressed, so a small compressed shard cannot expand into
            memory (a decompression bomb). ``None``: no cap.
        node_copy_bytes: ``plan_batches``' shard road only (each of its processes reads
            every shard holding a member of one of its batches): a remote (``s3://``,
            ``http(s)://``...) or compressed shard is downloaded / decompressed once per node
            into a plain copy in the node's cache folder (``remote.cache_dir``, else
            :func:`speechpipe.node_cache.index_cache_dir`'s), which every process of the node
            maps (:mod:`speechpipe.pipes.shards._copies`); at most this many bytes of copies
            are kept, the least recently used removed beyond it, a larger shard read
            directly. Default 8 GiB: about two shards per virtual stream (8) of the 500 MB
            that ``pack``'s 2,000 utterances make. ``None``: no copies (each process reads
            the shard itself). Keep the cache folder on a local disk, not a RAM ``tmpfs``.

    The options travel with the pipe (``read_options`` of its reading stage), so DataLoader
    workers read as their parent's pipeline says.

    >>> ShardReadOptions(mmap=False)
    ShardReadOptions(mmap=False, readahead=None, remote=None, max_member_bytes=134217728, \
node_copy_bytes=8589934592)
    >>> ShardReadOptions(readahead="no")
    Traceback (most recent call last):
    ...
    TypeError: readahead must be True, False or None, got 'no'
    """

    mmap: bool | None = None
    readahead: bool | None = None
    remote: RemoteOptions | None = None
    max_member_bytes: int | None = 1 << 27
    node_copy_bytes: int | None = 8 << 30

    def __post_init__(self) -> None:
        for name in ("mmap", "readahead"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, bool):
                raise TypeError(f"{name} must be True, False or None, got {value!r}")
        if self.remote is not None and not isinstance(self.remote, RemoteOptions):
            raise TypeError(f"remote must be a RemoteOptions or None, got {self.remote!r}")
        cap = self.max_member_bytes
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int)):
            raise TypeError(f"max_member_bytes must be an int or None, got {cap!r}")
        if cap is not None and cap < 1:
            raise ValueError(f"max_member_bytes must be >= 1, got {cap}")
        copies = self.node_copy_bytes
        if copies is not None and (isinstance(copies, bool) or not isinstance(copies, int)
                                   or copies < 1):
            raise ValueError(f"node_copy_bytes must be an int >= 1 (bytes) or None, got "
                             f"{copies!r}")


_DEFAULT_OPTIONS = ShardReadOptions()


def _check_read_options(read_options: Any) -> ShardReadOptions:
    """``read_options``, or the defaults for ``None``; ``TypeError`` for anything else."""
    if read_options is None:
        return _DEFAULT_OPTIONS
    if not isinstance(read_options, ShardReadOptions):
        raise TypeError(f"read_options must be a ShardReadOptions or None, got {read_options!r}")
    return read_options


def _open_mapped(stream: Any, options: ShardReadOptions) -> MappedFile | None:
    """The mapping of the local file behind ``stream`` when ``options`` say to map it and it
    can be; else ``None``."""
    if options.mmap is False:
        return None
    return MappedFile.open(stream, check_fs=options.mmap is None,
                           readahead=options.readahead is not False)


# --------------------------------------------------------------------------------------------
# Reading tar members (the format itself: _tar)
# --------------------------------------------------------------------------------------------


def iter_tar_members(
    stream: BinaryIO, *, source: str | None = None, read_options: ShardReadOptions | None = None
) -> Iterator[tuple[str, bytes | memoryview]]:
    """Yield ``(member name, payload)`` for each regular file of a tar stream, in order.

    Written from the tar format rather than with :mod:`tarfile`, whose stream mode ends
    silently on a truncated header: here every way a shard can be cut or damaged raises.
    Each header's checksum is verified; sizes are octal or GNU base-256; names come from the
    ustar ``prefix`` + ``name``, a GNU long name (typeflag ``L``) or a pax ``path`` (typeflag
    ``x``, whose ``size`` also applies); pax global headers (``g``) and GNU long link names
    (``K``) are ignored; directories are skipped. Each payload is one ``read`` of its exact
    size; padding is read together with the next header. After the end-of-archive marker up
    to 1 MiB more is read (the record padding), so that the opener reaches the end of its
    stream and can check it.

    A stream reading a local regular file is memory-mapped instead (see the module's
    "Memory-mapped shards"): array and audio payloads of 64 KiB or more are then read-only
    ``memoryview`` s of the mapping, which stay valid after the stream is closed, and the
    others ``bytes``; the members, the errors and the stream's final position are those of the
    reading path.

    Args:
        stream: a binary stream positioned at the start of the archive (anything with
            ``read(n)``; it is not closed).
        source: the shard's path or URL, named in error messages.
        read_options: mapping and read-ahead (:class:`ShardReadOptions`; ``None``: its
            defaults).

    Raises:
        DataError: the stream ends before the end-of-archive marker (a zero block) --
            ``"truncated shard"``, naming the last complete member --, ends inside a header or
            a payload (naming the member), a header's checksum is wrong (naming the byte offset
            and the previous member), a field is not a number, a member is not a regular
            file or directory (symbolic and hard links, devices, sparse files), a member is
            larger than ``read_options.max_member_bytes`` (naming it), or a mapped file shrank
            while it was being read.

    >>> import io, tarfile
    >>> buf = io.BytesIO()
    >>> with tarfile.open(fileobj=buf, mode="w") as tar:
    ...     info = tarfile.TarInfo("utt1.txt"); info.size = 2
    ...     tar.addfile(info, io.BytesIO(b"hi"))
    >>> list(iter_tar_members(io.BytesIO(buf.getvalue()), source="mem.tar"))
    [('utt1.txt', b'hi')]
    >>> list(iter_tar_members(io.BytesIO(buf.getvalue()[:1000]), source="mem.tar"))
    Traceback (most recent call last):
    ...
    speechpipe.errors.DataError: mem.tar: truncated shard: it ends after member 'utt1.txt' ...
    """
    options = _check_read_options(read_options)
    compression = shard_compression(source or "")
    if compression is not None:
        yield from _iter_compressed(stream, compression, source, options.max_member_bytes)
        return
    yield from iter_plain_members(stream, source, options)


def iter_plain_members(stream: BinaryIO, source: str | None,
                       options: ShardReadOptions) -> Iterator[tuple[str, bytes | memoryview]]:
    """:func:`iter_tar_members` of an uncompressed tar, whatever ``source``'s name says (a
    node copy of a compressed shard, its errors naming the original)."""
    mapped = _open_mapped(stream, options)
    if mapped is None:
        yield from iter_members(StreamReader(stream.read, source), options.max_member_bytes)
        return
    finished = False
    try:
        yield from iter_members(MappedReader(mapped, source, _VIEW_EXTENSIONS),
                                options.max_member_bytes)
        finished = True
        # Leave the stream where the reading path leaves it (after the trailer it reads).
        if not mapped.file.closed:
            mapped.file.seek(mapped.pos)
    finally:
        mapped.release(finished)


class _ZstdReader:
    """``read(n)`` of a zstd stream (one or more frames, skippable frames skipped); input that
    ends inside a frame is an ``EOFError`` (zstandard's own stream reader ends quietly there).

    The decompressor is fed one block at a time (the frame format, RFC 8878, is walked here),
    so one call yields at most a block's 128 KiB: a few kilobytes of run-length blocks cannot
    expand into hundreds of megabytes before the tar walk has seen a header.
    """

    _CHUNK = 1 << 20  # input read from the stream at a time
    _BLOCK_MAX = 1 << 17  # RFC 8878: a block decompresses to at most 128 KiB
    _MAGIC = b"\x28\xb5\x2f\xfd"

    def __init__(self, stream: BinaryIO, zstandard: Any) -> None:
        self._stream, self._zstd = stream, zstandard
        self._dobj = None  # the current frame's decompressor; None between frames
        self._in, self._in_pos = b"", 0  # input read, not yet fed from _in_pos on
        self._checksum = False  # the current frame ends with a 4-byte checksum
        self._buf, self._pos = b"", 0  # decompressed, not yet read from _pos on

    def read(self, n: int) -> bytes:
        parts = []
        while n > 0:
            if self._pos >= len(self._buf) and not self._fill():
                break
            part = self._buf[self._pos:self._pos + n]
            self._pos += len(part)
            n -= len(part)
            parts.append(part)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _take(self, n: int, *, at_boundary: bool = False) -> bytes:
        """``n`` input bytes; ``b""`` at a clean end of input between frames."""
        while len(self._in) - self._in_pos < n:
            chunk = self._stream.read(self._CHUNK)
            if not chunk:
                if at_boundary and self._in_pos == len(self._in):
                    return b""
                raise EOFError("the zstd stream ends inside a frame")
            self._in = self._in[self._in_pos:] + chunk
            self._in_pos = 0
        out = self._in[self._in_pos:self._in_pos + n]
        self._in_pos += n
        return out

    def _frame_header(self) -> bytes | None:
        """The next frame's header (magic included), skippable frames skipped; ``None`` at
        the end of the input."""
        while True:
            magic = self._take(4, at_boundary=True)
            if not magic:
                return None
            if magic[1:] == b"\x2a\x4d\x18" and magic[0] & 0xF0 == 0x50:  # skippable
                self._take(int.from_bytes(self._take(4), "little"))
                continue
            if magic != self._MAGIC:
                raise self._zstd.ZstdError(f"not a zstd frame (magic {magic.hex()})")
            descriptor = self._take(1)
            flags = descriptor[0]
            fcs = (0, 2, 4, 8)[flags >> 6] or (1 if flags & 0x20 else 0)
            rest = (0 if flags & 0x20 else 1) + (0, 1, 2, 4)[flags & 3] + fcs
            self._checksum = bool(flags & 0x04)
            return magic + descriptor + self._take(rest)

    def _fill(self) -> bool:
        """Decompress the next block into ``_buf``; False at the end of the input."""
        while True:
            head = b""
            if self._dobj is None:
                head = self._frame_header()
                if head is None:
                    return False
                self._dobj = self._zstd.ZstdDecompressor().decompressobj()
            block = self._take(3)
            bits = int.from_bytes(block, "little")
            last, kind, size = bits & 1, (bits >> 1) & 3, bits >> 3
            if kind == 3 or size > self._BLOCK_MAX:
                raise self._zstd.ZstdError(f"corrupt zstd block header {block.hex()}")
            piece = head + block + self._take(1 if kind == 1 else size)
            if last and self._checksum:
                piece += self._take(4)
            self._buf, self._pos = self._dobj.decompress(piece), 0
            if last:
                if not self._dobj.eof:
                    raise self._zstd.ZstdError("a zstd frame did not end at its last block")
                self._dobj = None
            if self._buf:
                return True

    def close(self) -> None:
        self._buf, self._pos = b"", 0
        self._in, self._in_pos = b"", 0


def _decompressor(stream: BinaryIO, compression: str) -> tuple[Any, tuple]:
    """A reader of ``stream`` decompressed, and the errors its reads raise on bad input."""
    if compression == "gz":
        return gzip.GzipFile(fileobj=stream, mode="rb"), (EOFError, OSError, zlib.error)
    try:
        import zstandard
    except ImportError as exc:
        raise ImportError("reading .tar.zst shards needs zstandard: "
                          "pip install 'speechpipe[zstd]'") from exc
    return _ZstdReader(stream, zstandard), (EOFError, zstandard.ZstdError, OSError)


def decompressed_reader(stream: BinaryIO, compression: str,
                        source: str | None) -> tuple[Callable[[int], bytes], Callable[[], None]]:
    """``(read, close)``: ``read(n)`` of ``stream`` decompressed (``compression``: ``"gz"`` or
    ``"zst"``), a truncated or corrupt stream a :class:`~speechpipe.errors.DataError` naming
    ``source``; ``close`` lets the decompressor go (not the stream)."""
    reader, errors = _decompressor(stream, compression)

    def read(n: int) -> bytes:
        try:
            return reader.read(n)
        except DataError:
            raise
        except errors as exc:
            raise DataError(f"truncated or corrupt {compression} stream: {exc}",
                            source=source) from exc

    return read, reader.close


def _iter_compressed(stream: BinaryIO, compression: str, source: str | None,
                     max_member_bytes: int | None = None) -> Iterator[tuple[str, bytes]]:
    """The members of a compressed shard, read through its decompressor (never mapped)."""
    read, close = decompressed_reader(stream, compression, source)
    try:
        yield from iter_members(StreamReader(read, source), max_member_bytes)
    finally:
        close()


# --------------------------------------------------------------------------------------------
# Grouping members into samples
# --------------------------------------------------------------------------------------------


def split_member_name(name: str, *, source: str | None = None) -> tuple[str, str]:
    """Split a member path into ``(key, field)`` at the first dot of its basename.

    >>> split_member_name("dir/utt1.feats.npy")
    ('dir/utt1', 'feats.npy')
    >>> split_member_name("dir/utt1")
    Traceback (most recent call last):
    ...
    speechpipe.errors.DataError: [member dir/utt1]: member name has no field extension ...
    """
    slash = name.rfind("/") + 1
    dot = name.find(".", slash)
    if dot < 0:
        raise DataError(
            "member name has no field extension (expected '<key>.<field>', e.g. 'utt1.flac')",
            source=source,
            member=name,
        )
    if dot == slash:
        raise DataError(
            "member name has no key before its first dot (expected '<key>.<field>')",
            source=source,
            member=name,
        )
    if dot == len(name) - 1:
        raise DataError("member name has an empty field after its dot", source=source,
                        member=name)
    return name[:dot], name[dot + 1:]


def _key_or_none(name: str) -> str | None:
    try:
        return split_member_name(name)[0]
    except DataError:
        return None


def group_by_key(
    members: Iterable[tuple[str, bytes]], *, source: str | None = None
) -> Iterator[Sample]:
    """Group consecutive members with the same key into raw samples.

    Consumes ``(member name, payload)`` pairs (from :func:`iter_tar_members`) and yields
    ``{"key": key, "source": source, "<field>": payload, ...}`` with fields in member order
    (a URL's credentials redacted in ``source``: :func:`speechpipe.errors.redact`, so that
    nothing that shows or stores a sample's source -- a state, a report -- holds them).
    A sample is yielded once the next key (or the end) is seen; if reading fails inside a
    member of the next key, the sample before it is yielded before the error is raised.

    Raises:
        DataError: a member has no field extension or no key, a field is named ``key`` or
            ``source`` (reserved), a field repeats within one key group, or a key's members are
            not adjacent (naming the shard, the key and the member).

    >>> list(group_by_key([("a.txt", b"x"), ("a.npy", b"y"), ("b.txt", b"z")], source="s.tar"))
    [{'key': 'a', 'source': 's.tar', 'txt': b'x', 'npy': b'y'}, \
{'key': 'b', 'source': 's.tar', 'txt': b'z'}]
    """
    current: dict[str, Any] | None = None
    finished: set[str] = set()  # keys whose group has ended
    shown = None if source is None else redact(source)  # a signed URL's credentials hidden
    members = iter(members)
    while True:
        try:
            name, data = next(members)
        except StopIteration:
            break
        except DataError as err:
            # An error inside a member of the *next* key (a cut payload, a link) means the
            # sample being assembled was complete: hand it out before raising.
            if current is not None and err.member is not None:
                if _key_or_none(err.member) not in (None, current[KEY]):
                    yield current
            raise
        key, field = split_member_name(name, source=source)
        if current is None or key != current[KEY]:
            if current is not None:
                yield current
                finished.add(current[KEY])
            if key in finished:  # never two halves of one sample (issue 23)
                raise DataError(
                    "the members of this key are not adjacent in the shard (another key's "
                    "members came between them): the shard was not written by a grouping "
                    "writer; repack it (speechpipe pack, ShardWriter or webdataset's TarWriter "
                    "write each sample's members together)", source=source, member=name, key=key)
            current = {KEY: key, SOURCE: shown}
        if field in _RESERVED_FIELDS:
            raise DataError(f"field name {field!r} is reserved for the sample's {field}",
                            source=source, member=name, key=key)
        if field in current:
            raise DataError(f"duplicate field {field!r} in one sample", source=source,
                            member=name, key=key)
        current[field] = data
    if current is not None:
        yield current


# --------------------------------------------------------------------------------------------
# The reading pipe
# --------------------------------------------------------------------------------------------


def _skip_reason(error: DataError) -> str:
    kind = TRUNCATED if getattr(error, "reason", "").startswith(TRUNCATED) else "corrupt shard"
    return f"{kind} (rest of the shard skipped)"


def _close(stream: Any) -> None:
    close = getattr(stream, "close", None)
    if close is not None:
        close()


@functional_datapipe("read_shards")
class ShardReaderIterDataPipe(IterDataPipe[Sample]):
    """Read tar shards into raw samples (functional name: ``read_shards``).

    Consumes ``(path or URL, binary stream)`` pairs -- from ``open`` or torch's
    ``open_files(mode="b")`` -- and yields one raw sample per key group,
    ``{"key": str, "source": path, "<field>": bytes, ...}`` (webdataset naming: member
    ``utt1.feats.npy`` gives key ``utt1``, field ``feats.npy``). Fields are still bytes: follow
    with ``decode``. Each stream is read to its end-of-archive marker and closed when its shard
    is done (or the iteration stops). The number of samples is not known before reading, so
    there is no ``len()``. A local file's array and audio fields of 64 KiB or more are
    read-only ``memoryview`` s of the mapped file (module docs, "Memory-mapped shards"), valid
    after the stream is closed; other fields, and every field of other streams, are ``bytes``.

    Args:
        source_datapipe: pipe of ``(name, binary stream)`` pairs.
        on_error: ``"raise"`` (default) raises the :class:`~speechpipe.errors.DataError` of a
            truncated or corrupt shard (naming the shard and the member or byte offset);
            ``"skip"`` stops reading that shard -- samples already yielded stay, the sample
            being assembled and the rest of the shard are dropped -- counts the shard in
            :attr:`diagnostics` under ``"truncated shard"`` or ``"corrupt shard"``, continues
            with the next shard and warns at the end of the pass. Counts cover the current
            (or last) pass.
        read_options: mapping and read-ahead of local files (:class:`ShardReadOptions`;
            ``None``: its defaults); ``ShardReadOptions(mmap=False)`` reads them, every field
            ``bytes``.

    >>> import os, tempfile
    >>> from speechpipe import IterableWrapper
    >>> from speechpipe.pipes.shards import write_shard
    >>> path = os.path.join(tempfile.mkdtemp(), "shard-00000.tar")
    >>> write_shard(path, [{"key": "utt1", "txt": "hello"}, {"key": "utt2", "txt": "world"}])
    2
    >>> for s in IterableWrapper([path]).open_files(mode="b").read_shards():
    ...     print(s["key"], s["txt"], os.path.basename(s["source"]))
    utt1 b'hello' shard-00000.tar
    utt2 b'world' shard-00000.tar
    """

    def __init__(
        self,
        source_datapipe: IterDataPipe,
        *,
        on_error: str = "raise",
        read_options: ShardReadOptions | None = None,
    ) -> None:
        self.source_datapipe = source_datapipe
        self.on_error = check_on_error(on_error)
        self.read_options = _check_read_options(read_options)
        self.diagnostics = Diagnostics("read_shards")

    def __iter__(self) -> Iterator[Sample]:
        self.diagnostics.reset()
        for item in self.source_datapipe:
            if isinstance(item, (str, bytes, os.PathLike)) or not (
                isinstance(item, tuple) and len(item) == 2
            ):
                raise TypeError(
                    "read_shards expects (path, binary stream) pairs, e.g. from "
                    f".open() or .open_files(mode='b'); got {item!r}"
                )
            name, stream = item
            source = os.fspath(name) if isinstance(name, os.PathLike) else str(name)
            try:
                members = iter_tar_members(stream, source=source, read_options=self.read_options)
                yield from group_by_key(members, source=source)
            except DataError as err:
                self.diagnostics.handle(self.on_error, err, _skip_reason(err))
            finally:
                _close(stream)
        self.diagnostics.warn_if_skipped()

    def __len__(self) -> int:
        raise TypeError(
            "read_shards has no len(): the number of samples in a shard is known only after "
            "reading it"
        )


ShardReader = ShardReaderIterDataPipe
