"""Writing tar shards in webdataset naming: the other half of :mod:`speechpipe.pipes.shards._reader`.

:func:`write_shard` and :class:`ShardWriter` write samples to shards with deterministic headers,
values encoded by field extension with the allow-listed encoders of
:func:`encode_field`; a shard is written under ``<path>.tmp`` and
renamed when complete, so an interrupted writer never leaves a partial shard under the final
name. Shards written here are read by ``read_shards``/``sharded_shuffle`` and by webdataset.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import tarfile
from typing import Any, BinaryIO, Iterable, Mapping

import numpy as np
import soundfile

from ...index import shard_compression
from ...sample import (
    INT_EXTENSIONS, JSON_EXTENSIONS, KEY, NPY_EXTENSIONS, SAMPLE_RATE, SOURCE, TEXT_EXTENSIONS,
    UNSAFE_EXTENSIONS, key_member_problem,
)
from ._tar import BLOCK

__all__ = ["ShardWriter", "encode_field", "write_shard"]

_WRITABLE_AUDIO = {"flac": "FLAC", "wav": "WAV"}
_BYTES = (bytes, bytearray, memoryview)

# Sample keys that are not written as members: the key names them, the source is where a
# sample came from (set again when read), and sample_rate is used to encode audio arrays.
_NOT_MEMBERS = (KEY, SOURCE, SAMPLE_RATE)


def encode_field(
    field: str, value: Any, *, sample_rate: int | None = None, key: str | None = None
) -> bytes:
    """Encode one field's value for writing, by the last part of its name (the allow-list).

    - bytes-like values are written as they are (for any extension but the unsafe ones);
    - ``npy``: a numeric ``numpy`` array, with ``np.save(allow_pickle=False)``;
    - ``txt``/``text``/``transcript``: a ``str``, as UTF-8;
    - ``json``: a JSON-serialisable object (``ensure_ascii=False``, keys sorted);
    - ``cls``/``id``/``index``: an ``int``;
    - ``flac``/``wav``: an audio array (time first), with soundfile at ``sample_rate`` and its
      default subtype (16-bit PCM: values are quantised); ``ogg``/``opus``/``mp3`` need bytes.

    Raises:
        ValueError: the extension is one of ``pkl pickle pyd pth pt``, an array holds
            objects, or audio has no ``sample_rate``.
        TypeError: no encoder for this extension and value type.

    >>> encode_field("txt", "héllo")
    b'h\\xc3\\xa9llo'
    >>> encode_field("meta.json", {"b": 1, "a": [2]})
    b'{"a": [2], "b": 1}'
    """
    where = f"sample {key!r} field {field!r}" if key is not None else f"field {field!r}"
    ext = field.rpartition(".")[2].lower()
    if ext in UNSAFE_EXTENSIONS:
        raise ValueError(
            f"{where}: extension {ext!r} would need pickle to read; speechpipe neither writes "
            "nor reads pickles (use npy, json or txt)"
        )
    if isinstance(value, _BYTES):
        return bytes(value)
    if ext in NPY_EXTENSIONS and isinstance(value, (np.ndarray, np.generic)):
        buf = io.BytesIO()
        try:
            np.save(buf, value, allow_pickle=False)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from exc
        return buf.getvalue()
    if ext in TEXT_EXTENSIONS and isinstance(value, str):
        return value.encode("utf-8")
    if ext in JSON_EXTENSIONS:
        try:
            return json.dumps(value, ensure_ascii=False, sort_keys=True).encode("utf-8")
        except (TypeError, ValueError) as exc:
            raise TypeError(f"{where}: cannot encode as JSON: {exc}") from exc
    if ext in INT_EXTENSIONS and isinstance(value, (int, np.integer)) and not isinstance(
        value, bool
    ):
        return str(int(value)).encode("ascii")
    if ext in _WRITABLE_AUDIO and isinstance(value, np.ndarray):
        if sample_rate is None:
            raise ValueError(f"{where}: an audio array needs the sample's 'sample_rate'")
        buf = io.BytesIO()
        try:
            soundfile.write(buf, value, int(sample_rate), format=_WRITABLE_AUDIO[ext])
        except (soundfile.LibsndfileError, RuntimeError, TypeError, ValueError) as exc:
            raise ValueError(f"{where}: cannot encode audio: {exc}") from exc
        return buf.getvalue()
    raise TypeError(
        f"{where}: no encoder for extension {ext!r} and a {type(value).__name__}; pass bytes, "
        "or name the field by its format (e.g. 'flac', 'txt', 'feats.npy', 'json')"
    )


def _encode_sample(sample: Mapping[str, Any]) -> tuple[str, list[tuple[str, bytes]]]:
    """Validate a sample for writing and encode its fields: ``(key, [(member, bytes)])``."""
    if not isinstance(sample, Mapping):
        raise TypeError(f"a sample to write must be a dict, got {type(sample).__name__}")
    key = sample.get(KEY)
    if not isinstance(key, str) or not key:
        raise ValueError(f"a sample to write needs a non-empty str 'key', got {key!r}")
    problem = key_member_problem(key)
    if problem is not None:
        raise ValueError(f"key {key!r} cannot be written: {problem}")
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


def _compressor(file: BinaryIO, compression: str | None) -> Any:
    """A writer compressing into ``file`` (left open when it is closed), or ``None``."""
    if compression is None:
        return None
    if compression == "gz":
        return gzip.GzipFile(fileobj=file, mode="wb", mtime=0)
    try:
        import zstandard
    except ImportError as exc:
        raise ImportError("writing .tar.zst shards needs zstandard: "
                          "pip install 'speechpipe[zstd]'") from exc
    return zstandard.ZstdCompressor(level=3).stream_writer(file, closefd=False)


class ShardWriter:
    """Write samples to tar shards, rolling over to a new shard every ``maxcount`` samples.

    Each sample is a dict with ``key`` and fields named by extension (``flac``, ``txt``,
    ``feats.npy``, ``json``...); each field becomes the member ``<key>.<field>``, encoded by
    :func:`encode_field` (bytes as they are; ``.npy`` arrays with
    ``np.save``; ``txt`` str as UTF-8; ``json`` objects as JSON; audio arrays under
    ``flac``/``wav`` at the sample's ``sample_rate``, which is not written itself; ``source``
    is not written either). Members are written in sorted field order with deterministic
    headers (mtime 0, uid/gid 0, empty user and group names, mode 0o444, pax format), so the
    same samples give the same bytes.

    Each shard is written to ``<name>.tmp`` and renamed to its name when it is complete. If
    the ``with`` block raises, the shard being written is deleted (shards already completed
    stay); a killed process leaves at most a ``.tmp`` file, never a partial shard under its
    final name. A shard is opened at the first sample it receives.

    A shard named ``*.tar.gz``/``*.tgz`` is gzip-compressed (mtime 0: the same bytes each
    time), ``*.tar.zst``/``*.tzst`` zstd-compressed (``pip install 'speechpipe[zstd]'``), as
    it is written; ``maxsize`` counts the uncompressed bytes.

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
        self._compressor: Any = None  # gzip or zstd writer between the tar and the file
        self._count = 0
        self._size = 0
        self._last_key: str | None = None

    # -- shard lifecycle

    def _open_next(self) -> None:
        path = self.pattern % self._shard if self.numbered else self.pattern
        self._shard += 1
        self._file = open(path + ".tmp", "wb")
        try:
            self._compressor = _compressor(self._file, shard_compression(path))
            self._tar = tarfile.open(fileobj=self._compressor or self._file, mode="w",
                                     format=tarfile.PAX_FORMAT)
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
        tar, file, path, compressor = self._tar, self._file, self._path, self._compressor
        self._tar = self._file = self._path = self._compressor = None
        try:
            tar.close()
            if compressor is not None:
                compressor.close()  # writes the compressed stream's end
        finally:
            file.close()
        os.replace(path + ".tmp", path)
        self.paths.append(path)

    def abort(self) -> None:
        """Delete the shard being written (its ``.tmp`` file); completed shards stay."""
        if self._tar is None:
            return
        file, path = self._file, self._path
        self._tar = self._file = self._path = self._compressor = None
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
