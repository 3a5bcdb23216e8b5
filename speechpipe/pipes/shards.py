"""Tar shards in webdataset naming: reading them into samples and writing them.

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
  read by the private :mod:`speechpipe.pipes._tar`.
- :class:`ShardReadOptions`: whether local shards are mapped and read ahead.
- :func:`group_by_key`: members to raw samples ``{"key", "source", "<field>": bytes, ...}``.
- ``read_shards`` (:class:`ShardReaderIterDataPipe`): ``(path or URL, binary stream)`` pairs,
  as yielded by ``open`` or torch's ``open_files(mode="b")``, to raw samples; follow it with
  ``decode`` (:mod:`speechpipe.pipes.decode`).
- :func:`write_shard` and :class:`ShardWriter`: samples to shards with deterministic headers,
  values encoded by field extension with the allow-listed encoders of
  :func:`speechpipe.pipes.decode.encode_field`; written under ``<path>.tmp`` and renamed when
  complete, so an interrupted writer never leaves a partial shard under the final name.

Memory-mapped shards
--------------------

When the stream given to :func:`iter_tar_members` reads a local regular file as it is (a file
from ``open(path, "rb")``, speechpipe's ``open``/``open_stream``, or torch's ``open_files``),
the file is mapped read-only instead of read (:mod:`speechpipe.pipes._mmap`): each array or
audio payload (``.npy``, ``.flac``, ``.wav``, ``.mp3``, ``.ogg``, ``.opus``) of at least 64 KiB
is a read-only ``memoryview`` of the mapping -- no copy, no fresh heap allocation; the bytes
stay in the page cache until a consumer (``decode``'s ``.npy`` view, then collation) copies
them once into a batch -- and other payloads (text, JSON, labels, unknown members, small ones)
are copied into ``bytes``. A view is bytes-like (``np.frombuffer``, ``soundfile``,
``io.BytesIO`` take it); ``bytes(view)`` makes a copy for code that insists on ``bytes``. On
Linux, a shard of 16 MiB or more gets a read-ahead thread (:mod:`speechpipe.pipes._readahead`):
up to 256 MiB ahead of the reader, it reads the file sequentially (unless it is in the page
cache already) and enters the pages in the mapping, without holding the GIL, so the reader
(often the training loop's thread) neither waits for the disk nor takes page faults; a reader
that finishes a shard lets its thread finish too (the views it handed out are still to be
read), one stopped early stops it. Smaller shards, other systems and
``ShardReadOptions(readahead=False)`` ask the kernel for read-ahead
(``madvise(MADV_WILLNEED)``) as the reader walks the file.
Remote (``http(s)://``) and ``pipe:`` streams, compressed file objects, ``BytesIO`` and
anything else are read with ``read`` as before, payloads as ``bytes``. Every check is the
same on both paths: header checksums, the end-of-archive marker, each member's extent checked
against the mapped size before any of it is touched, so a truncated shard raises
:class:`~speechpipe.errors.DataError` naming the shard and the member.

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

Both settings are :class:`ShardReadOptions`; their defaults can be overridden for a whole
process (DataLoader workers included) by the environment variables ``SPEECHPIPE_SHARD_MMAP=0``
(mapping off) and ``SPEECHPIPE_SHARD_READAHEAD=0`` (read-ahead thread off). Measurements:
benchmarks/README.md, "Shard reading".
"""

from __future__ import annotations

import io
import os
import tarfile
from dataclasses import dataclass
from typing import Any, BinaryIO, Iterable, Iterator, Mapping

from ..diagnostics import Diagnostics, check_on_error
from ..errors import DataError
from ..sample import KEY, SAMPLE_RATE, SOURCE, Sample
from ._base import IterDataPipe, functional_datapipe
from ._mmap import NETWORK_FILE_SYSTEMS, MappedFile
from ._tar import BLOCK, TRUNCATED, MappedReader, StreamReader, iter_members
from .decode import AUDIO_EXTENSIONS, NPY_EXTENSIONS, encode_field

__all__ = [
    "NETWORK_FILE_SYSTEMS",
    "ShardReadOptions",
    "ShardReaderIterDataPipe",
    "ShardWriter",
    "group_by_key",
    "iter_tar_members",
    "split_member_name",
    "write_shard",
]

# Mapped shards: only arrays and audio are views (what ``decode`` turns into arrays;
# bytes-like consumers -- numpy, soundfile, io.BytesIO -- take them); text, JSON and unknown
# members stay ``bytes``, whatever their size, so that ``payload.decode()`` keeps working.
_VIEW_EXTENSIONS = frozenset(AUDIO_EXTENSIONS + NPY_EXTENSIONS)
_RESERVED_FIELDS = (KEY, SOURCE)


# --------------------------------------------------------------------------------------------
# Reading options
# --------------------------------------------------------------------------------------------

_MMAP_ENV = "SPEECHPIPE_SHARD_MMAP"
_READAHEAD_ENV = "SPEECHPIPE_SHARD_READAHEAD"


@dataclass(frozen=True)
class ShardReadOptions:
    """How local tar shards are read: by :func:`iter_tar_members`, ``read_shards`` and
    ``sharded_shuffle`` (their ``read_options``; the module docs, "Memory-mapped shards", say
    what mapping and reading ahead do).

    Args:
        mmap: ``None`` (default): map local files unless the environment variable
            ``SPEECHPIPE_SHARD_MMAP`` is ``0`` or the file is on a network or FUSE file system
            (:data:`NETWORK_FILE_SYSTEMS`, from ``/proc/self/mounts``); ``True``: map local
            files wherever they are; ``False``: always read, every payload ``bytes``.
        readahead: a thread reading a mapped shard of 16 MiB or more ahead of its reader
            (Linux). ``None`` (default): yes, unless the environment variable
            ``SPEECHPIPE_SHARD_READAHEAD`` is ``0``; ``True``: yes; ``False``: no, the kernel
            is asked for read-ahead (``madvise``) as the reader goes.

    The environment variables (``0``, ``false``, ``no`` or ``off``) only change the ``None``
    defaults; they are read when a shard is opened, so DataLoader workers see their parent's.

    >>> ShardReadOptions(mmap=False)
    ShardReadOptions(mmap=False, readahead=None)
    >>> ShardReadOptions(readahead="no")
    Traceback (most recent call last):
    ...
    TypeError: readahead must be True, False or None, got 'no'
    """

    mmap: bool | None = None
    readahead: bool | None = None

    def __post_init__(self) -> None:
        for name in ("mmap", "readahead"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, bool):
                raise TypeError(f"{name} must be True, False or None, got {value!r}")


_DEFAULT_OPTIONS = ShardReadOptions()


def _check_read_options(read_options: Any) -> ShardReadOptions:
    """``read_options``, or the defaults for ``None``; ``TypeError`` for anything else."""
    if read_options is None:
        return _DEFAULT_OPTIONS
    if not isinstance(read_options, ShardReadOptions):
        raise TypeError(f"read_options must be a ShardReadOptions or None, got {read_options!r}")
    return read_options


def _switched_on(variable: str) -> bool:
    """Whether the environment variable ``variable`` is unset or not one of 0/false/no/off."""
    return os.environ.get(variable, "1").strip().lower() not in ("0", "false", "no", "off")


def _open_mapped(stream: Any, options: ShardReadOptions) -> MappedFile | None:
    """The mapping of the local file behind ``stream`` when ``options`` (or, for their
    defaults, the environment) say to map it and it can be; else ``None``."""
    mmap = options.mmap
    if mmap is False or (mmap is None and not _switched_on(_MMAP_ENV)):
        return None
    readahead = options.readahead
    if readahead is None:
        readahead = _switched_on(_READAHEAD_ENV)
    return MappedFile.open(stream, check_fs=mmap is None, readahead=readahead)


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
            file or directory (symbolic and hard links, devices, sparse files), or a mapped
            file shrank while it was being read.

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
    mapped = _open_mapped(stream, _check_read_options(read_options))
    if mapped is None:
        yield from iter_members(StreamReader(stream.read, source))
        return
    finished = False
    try:
        yield from iter_members(MappedReader(mapped, source, _VIEW_EXTENSIONS))
        finished = True
        # Leave the stream where the reading path leaves it (after the trailer it reads).
        if not mapped.file.closed:
            mapped.file.seek(mapped.pos)
    finally:
        mapped.release(finished)


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
    ``{"key": key, "source": source, "<field>": payload, ...}`` with fields in member order.
    A sample is yielded once the next key (or the end) is seen; if reading fails inside a
    member of the next key, the sample before it is yielded before the error is raised.

    Raises:
        DataError: a member has no field extension or no key, a field is named ``key`` or
            ``source`` (reserved), or a field repeats within one key group (naming the shard,
            the key and the member).

    >>> list(group_by_key([("a.txt", b"x"), ("a.npy", b"y"), ("b.txt", b"z")], source="s.tar"))
    [{'key': 'a', 'source': 's.tar', 'txt': b'x', 'npy': b'y'}, \
{'key': 'b', 'source': 's.tar', 'txt': b'z'}]
    """
    current: dict[str, Any] | None = None
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
            current = {KEY: key, SOURCE: source}
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


# --------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------

# Sample keys that are not written as members: the key names them, the source is where a
# sample came from (set again when read), and sample_rate is used to encode audio arrays.
_NOT_MEMBERS = (KEY, SOURCE, SAMPLE_RATE)


def _encode_sample(sample: Mapping[str, Any]) -> tuple[str, list[tuple[str, bytes]]]:
    """Validate a sample for writing and encode its fields: ``(key, [(member, bytes)])``."""
    if not isinstance(sample, Mapping):
        raise TypeError(f"a sample to write must be a dict, got {type(sample).__name__}")
    key = sample.get(KEY)
    if not isinstance(key, str) or not key:
        raise ValueError(f"a sample to write needs a non-empty str 'key', got {key!r}")
    base = key[key.rfind("/") + 1:]
    if not base or "." in base or key.startswith("/"):
        raise ValueError(
            f"key {key!r} cannot be written: its basename must be non-empty and without dots "
            "(the first dot separates key and field when the shard is read), and it must be "
            "a relative path"
        )
    rate = sample.get(SAMPLE_RATE)
    members = []
    for field in sorted(sample):
        if field in _NOT_MEMBERS:
            continue
        if not isinstance(field, str) or not field or "/" in field or field.startswith("."):
            raise ValueError(f"sample {key!r}: invalid field name {field!r}")
        data = encode_field(field, sample[field], sample_rate=rate, key=key)
        members.append((f"{key}.{field}", data))
    if not members:
        raise ValueError(f"sample {key!r} has no field to write")
    return key, members


class ShardWriter:
    """Write samples to tar shards, rolling over to a new shard every ``maxcount`` samples.

    Each sample is a dict with ``key`` and fields named by extension (``flac``, ``txt``,
    ``feats.npy``, ``json``...); each field becomes the member ``<key>.<field>``, encoded by
    :func:`speechpipe.pipes.decode.encode_field` (bytes as they are; ``.npy`` arrays with
    ``np.save``; ``txt`` str as UTF-8; ``json`` objects as JSON; audio arrays under
    ``flac``/``wav`` at the sample's ``sample_rate``, which is not written itself; ``source``
    is not written either). Members are written in sorted field order with deterministic
    headers (mtime 0, uid/gid 0, empty user and group names, mode 0o444, pax format), so the
    same samples give the same bytes.

    Each shard is written to ``<name>.tmp`` and renamed to its name when it is complete. If
    the ``with`` block raises, the shard being written is deleted (shards already completed
    stay); a killed process leaves at most a ``.tmp`` file, never a partial shard under its
    final name. A shard is opened at the first sample it receives.

    Args:
        pattern: the shard's path, or with ``maxcount``/``maxsize`` a ``%``-pattern such as
            ``"out/data-%05d.tar"`` filled with the shard number.
        maxcount: start a new shard after this many samples.
        maxsize: start a new shard once this many bytes (headers and payloads) were written.
        start_shard: the number of the first shard.

    Attributes:
        paths: the completed shards, in order.
        total: samples written so far.

    >>> import os, tempfile
    >>> out = tempfile.mkdtemp()
    >>> with ShardWriter(os.path.join(out, "data-%05d.tar"), maxcount=2) as writer:
    ...     for i in range(3):
    ...         writer.write({"key": f"utt{i}", "txt": f"text {i}"})
    >>> [os.path.basename(p) for p in writer.paths], writer.total
    (['data-00000.tar', 'data-00001.tar'], 3)
    """

    def __init__(
        self,
        pattern: str | os.PathLike,
        *,
        maxcount: int | None = None,
        maxsize: int | None = None,
        start_shard: int = 0,
    ) -> None:
        pattern = os.fspath(pattern)
        if not isinstance(pattern, str) or not pattern:
            raise TypeError(f"pattern must be a non-empty path string, got {pattern!r}")
        if maxcount is not None and (not isinstance(maxcount, int) or maxcount <= 0):
            raise ValueError(f"maxcount must be a positive int or None, got {maxcount!r}")
        if maxsize is not None and (not isinstance(maxsize, int) or maxsize <= 0):
            raise ValueError(f"maxsize must be a positive int (bytes) or None, got {maxsize!r}")
        if not isinstance(start_shard, int) or start_shard < 0:
            raise ValueError(f"start_shard must be an int >= 0, got {start_shard!r}")
        try:
            numbered = pattern % 0 != pattern % 1
        except (TypeError, ValueError):
            numbered = False
        if (maxcount is not None or maxsize is not None) and not numbered:
            raise ValueError(
                f"pattern {pattern!r} needs a shard number such as '%05d' to roll over at "
                "maxcount/maxsize"
            )
        self.pattern = pattern
        self.maxcount = maxcount
        self.maxsize = maxsize
        self.numbered = numbered
        self.paths: list[str] = []
        self.total = 0
        self._shard = start_shard
        self._path: str | None = None
        self._file: BinaryIO | None = None
        self._tar: tarfile.TarFile | None = None
        self._count = 0
        self._size = 0
        self._last_key: str | None = None

    # -- shard lifecycle

    def _open_next(self) -> None:
        path = self.pattern % self._shard if self.numbered else self.pattern
        self._shard += 1
        self._file = open(path + ".tmp", "wb")
        try:
            self._tar = tarfile.open(fileobj=self._file, mode="w", format=tarfile.PAX_FORMAT)
        except BaseException:
            self._file.close()
            os.remove(path + ".tmp")
            raise
        self._path = path
        self._count = 0
        self._size = 0
        self._last_key = None

    def _finish(self) -> None:
        if self._tar is None:
            return
        tar, file, path = self._tar, self._file, self._path
        self._tar = self._file = self._path = None
        try:
            tar.close()
        finally:
            file.close()
        os.replace(path + ".tmp", path)
        self.paths.append(path)

    def abort(self) -> None:
        """Delete the shard being written (its ``.tmp`` file); completed shards stay."""
        if self._tar is None:
            return
        file, path = self._file, self._path
        self._tar = self._file = self._path = None
        file.close()
        if os.path.exists(path + ".tmp"):
            os.remove(path + ".tmp")

    # -- public API

    def write(self, sample: Mapping[str, Any]) -> None:
        """Encode and append one sample (see the class docstring for field encodings)."""
        key, members = _encode_sample(sample)
        if self._tar is not None and (
            (self.maxcount is not None and self._count >= self.maxcount)
            or (self.maxsize is not None and self._size >= self.maxsize)
        ):
            self._finish()
        if self._tar is None:
            self._open_next()
        if key == self._last_key:
            raise ValueError(
                f"sample key {key!r} repeats the previous sample's key: readers would merge "
                "the two samples"
            )
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 0
            info.mode = 0o444
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            self._tar.addfile(info, io.BytesIO(data))
            self._size += BLOCK + len(data) + (-len(data) % BLOCK)
        self._last_key = key
        self._count += 1
        self.total += 1

    def close(self) -> None:
        """Complete the current shard: end-of-archive marker, then rename from ``.tmp``."""
        self._finish()

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def write_shard(path: str | os.PathLike, samples: Iterable[Mapping[str, Any]]) -> int:
    """Write ``samples`` to one tar shard at ``path`` and return how many were written.

    The shard is written as ``<path>.tmp`` and renamed when complete; an error while writing
    leaves no file under ``path``. With no samples, an empty (valid) archive is written.
    Encodings and headers are those of :class:`ShardWriter`.

    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "one.tar")
    >>> write_shard(path, [{"key": "a", "txt": "x"}])
    1
    """
    writer = ShardWriter(path)
    if writer.numbered:
        raise ValueError(f"write_shard writes one shard; got a pattern {os.fspath(path)!r}")
    with writer:
        for sample in samples:
            writer.write(sample)
        if writer.total == 0:
            writer._open_next()
    return writer.total
