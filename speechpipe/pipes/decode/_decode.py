"""Allow-listed decoding of shard fields, and loading audio named in manifests.

Nothing is ever unpickled: fields are decoded by an explicit allow-list of extensions, and a
field that would need ``pickle`` (``pkl pickle pyd pth pt``, or a ``.npy`` object array)
raises :class:`~speechpipe.errors.UnsafeInputError`.

==========================  ======================================  ==========================
extension (last part)       decoded to                              default name
==========================  ======================================  ==========================
``wav flac ogg opus mp3``   ``float32`` array (time first) + rate   ``audio`` + ``sample_rate``
``npy``                     ``numpy`` array (``allow_pickle=False``)  ``feats``
``txt text transcript``     ``str`` (UTF-8)                         ``text``
``json``                    parsed JSON                             ``meta``
``cls id index``            ``int``                                 the extension
``pkl pickle pyd pth pt``   never: :class:`UnsafeInputError`
anything else               ``unknown=``: error, keep bytes, drop
==========================  ======================================  ==========================

Verbs and functions:

- :func:`read_audio` (from :mod:`speechpipe.pipes.decode._audio_io`): soundfile reading of a path,
  bytes or file object (shared entry point).
- :func:`decode_field` / :func:`decode_sample`: one field / one raw sample.
- ``decode`` (:class:`DecoderIterDataPipe`): raw samples from ``read_shards`` to decoded ones.
- :func:`read_audio_segment` and ``load_audio`` (:class:`AudioLoaderIterDataPipe`): audio
  files named in manifest samples (whole files or ``offset``/``duration`` segments).
- :func:`encode_field`: the inverse allow-list, used by the shard writers.

A plain ``.npy`` field is decoded without copying: the array is a view of the member's bytes
-- or, for a memory-mapped local shard (:mod:`speechpipe.pipes.shards._reader`), of the file's pages
in the page cache -- so it is read-only (``.copy()`` it to modify it in place). Collation
copies it into the batch, the one copy the data needs.

Raw fields may be ``bytes``, ``bytearray`` or ``memoryview`` (a mapped shard's large
payloads); every decoder takes all three, and ``unknown="keep"`` keeps a ``memoryview`` as
``bytes``, so a decoded sample holds no views of a mapping but its arrays (which pickle).
"""

from __future__ import annotations

import io
import json
import math
import os
import re
from typing import Any, Callable, Iterator, Mapping

import numpy as np
import soundfile

from ...diagnostics import Diagnostics, check_on_error
from ...errors import DataError, MissingDataError, UnsafeInputError
from ...remote import RemoteOptions, is_remote, join_url, read_remote_bytes
from ...sample import (
    AUDIO, AUDIO_EXTENSIONS, FEATS, INT_EXTENSIONS, JSON_EXTENSIONS, KEY, NPY_EXTENSIONS,
    SAMPLE_RATE, SOURCE, TEXT, TEXT_EXTENSIONS, UNSAFE_EXTENSIONS, Sample,
)
from .._core import functional_datapipe, IterDataPipe
from ...memory import copied_out
from ._audio_io import open_audio, DeferredAudio, read_audio
from ._codecs import check_channels, choose_channels
from ._audio_io import NON_FINITE
from ._audio_io import short_wav

__all__ = [
    "AudioLoaderIterDataPipe",
    "DecoderIterDataPipe",
    "check_decode_options",
    "decode_field",
    "decode_sample",
    "read_audio_segment",
]


_DEFAULT_NAMES = {
    **{ext: AUDIO for ext in AUDIO_EXTENSIONS},
    "npy": FEATS,
    "txt": TEXT,
    "text": TEXT,
    "transcript": TEXT,
    "json": "meta",
}
_UNKNOWN = ("error", "keep", "drop")
_NPY_MAGIC = b"\x93NUMPY"
_BYTES = (bytes, bytearray, memoryview)


# --------------------------------------------------------------------------------------------
# Decoding fields
# --------------------------------------------------------------------------------------------


def _utf8(data: bytes, where: dict) -> str:
    try:
        return bytes(data).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"invalid UTF-8 at byte {exc.start}: {exc.reason}", **where) from exc


# np.save's header for a plain array, e.g. "{'descr': '<f4', 'fortran_order': False,
# 'shape': (1270, 80), }": parsed here without ast, and the payload wrapped without a copy.
_NPY_HEADER = re.compile(
    r"\{'descr': '([<>|=]?[a-zA-Z]\d*)', 'fortran_order': (True|False), "
    r"'shape': \(((?:\d+, ?)*\d*)\), \}\s*\Z"
)


def _decode_npy(data: bytes | bytearray | memoryview, where: dict) -> np.ndarray:
    if bytes(data[:6]) != _NPY_MAGIC:
        raise DataError(f"not a .npy array (starts with {bytes(data[:8])!r})", **where)
    fast = _npy_view(data, where)
    if fast is not None:
        return fast
    try:  # anything unusual (structured dtypes, ...): numpy's own reader, which copies
        return np.load(io.BytesIO(bytes(data)), allow_pickle=False)
    except ValueError as exc:
        if "allow_pickle" in str(exc):
            raise UnsafeInputError(
                "a .npy object array would need unpickling; speechpipe never unpickles shard "
                "contents (store numeric arrays)",
                **where,
            ) from exc
        raise DataError(f"cannot load .npy array: {exc}", **where) from exc
    except (OSError, EOFError, TypeError) as exc:
        raise DataError(f"cannot load .npy array: {exc}", **where) from exc


def _npy_view(data: bytes | bytearray | memoryview, where: dict) -> np.ndarray | None:
    """The array of a plain ``.npy`` payload as a view of ``data`` -- no copy, so read-only
    when ``data`` is ``bytes`` or a read-only ``memoryview`` of a mapped shard (as
    ``read_shards`` gives) -- or None to use ``np.load``."""
    if len(data) < 10 or data[6] not in (1, 2, 3):
        return None
    size, start = ((int.from_bytes(data[8:10], "little"), 10) if data[6] == 1
                   else (int.from_bytes(data[8:12], "little"), 12))
    try:
        header = bytes(data[start:start + size]).decode("latin1" if data[6] < 3 else "utf-8")
    except UnicodeDecodeError:
        return None
    match = _NPY_HEADER.match(header)
    if match is None:
        return None
    dtype = np.dtype(match.group(1))
    if dtype.hasobject:
        raise UnsafeInputError(
            "a .npy object array would need unpickling; speechpipe never unpickles shard "
            "contents (store numeric arrays)",
            **where,
        )
    shape = tuple(int(n) for n in match.group(3).replace(" ", "").split(",") if n)
    count = math.prod(shape)
    offset = start + size
    if len(data) - offset < count * dtype.itemsize:
        raise DataError(
            f"cannot load .npy array: the data is cut short ({len(data) - offset} of "
            f"{count * dtype.itemsize} bytes)",
            **where,
        )
    array = np.frombuffer(data, dtype=dtype, count=count, offset=offset)
    return array.reshape(shape, order="F" if match.group(2) == "True" else "C")


def _decode_json(data: bytes, where: dict) -> Any:
    text = _utf8(data, where)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(f"invalid JSON: {exc}", **where) from exc
    except RecursionError as exc:
        raise DataError("invalid JSON: nested too deeply", **where) from exc


def _decode_int(data: bytes, where: dict) -> int:
    text = _utf8(data, where).strip()
    try:
        return int(text)
    except ValueError as exc:
        raise DataError(f"expected an integer, got {text[:40]!r}", **where) from exc


def _where(sample: Mapping[str, Any], field: str) -> dict:
    key = sample.get(KEY)
    return {
        "source": sample.get(SOURCE),
        "member": field if key is None else f"{key}.{field}",
        "key": key,
    }


def decode_field(
    field: str, data: bytes | bytearray | memoryview, *, source: str | None = None,
    key: str | None = None
) -> Any:
    """Decode one field's bytes (any bytes-like) by the last part of its name, from the
    allow-list.

    Audio gives ``(audio, sample_rate)``; ``npy`` an array; ``txt``/``text``/``transcript``
    a ``str``; ``json`` the parsed object; ``cls``/``id``/``index`` an ``int``.

    Raises:
        UnsafeInputError: the extension is one of ``pkl pickle pyd pth pt`` (never
            unpickled), or a ``.npy`` holds an object array.
        DataError: the bytes do not decode, or the extension is not in the allow-list; the
            message names ``source``, the member ``<key>.<field>`` and the key.

    >>> decode_field("cls", b"7"), decode_field("words.txt", b"hi there")
    (7, 'hi there')
    >>> decode_field("x.pkl", b"...", source="a.tar", key="u1")
    Traceback (most recent call last):
    ...
    speechpipe.errors.UnsafeInputError: a.tar [member u1.x.pkl] (key 'u1'): ...never unpickles...
    """
    where = _where({KEY: key, SOURCE: source}, field)
    ext = field.rpartition(".")[2].lower()
    if ext in UNSAFE_EXTENSIONS:
        raise UnsafeInputError(
            f"field {field!r} has extension {ext!r}, which only pickle could read; speechpipe "
            "never unpickles shard contents (store .npy, .json or text instead)",
            **where,
        )
    if ext in AUDIO_EXTENSIONS:
        try:
            if isinstance(data, memoryview):  # a mapped shard's pages, copied out here
                copied_out(len(data))
            return read_audio(bytes(data), source=source, key=key)
        except DataError as exc:
            raise type(exc)(exc.reason, **where) from exc
    if ext in NPY_EXTENSIONS:
        return _decode_npy(data, where)
    if ext in TEXT_EXTENSIONS:
        return _utf8(data, where)
    if ext in JSON_EXTENSIONS:
        return _decode_json(data, where)
    if ext in INT_EXTENSIONS:
        return _decode_int(data, where)
    raise DataError(
        f"no decoder for field {field!r} (extension {ext!r}); the allow-list is "
        f"{sorted(_DEFAULT_NAMES) + list(INT_EXTENSIONS)}; pass unknown='keep' or 'drop'",
        **where,
    )


def _is_known(field: str) -> bool:
    ext = field.rpartition(".")[2].lower()
    return ext in _DEFAULT_NAMES or ext in INT_EXTENSIONS or ext in UNSAFE_EXTENSIONS


def _one_to_one_len(pipe: Any, verb: str) -> int:
    if pipe.on_error != "raise":
        raise TypeError(
            f"{verb}(on_error={pipe.on_error!r}) has no len(): skipped samples are known only "
            "after reading; use on_error='raise' for a length"
        )
    return len(pipe.source_datapipe)


def _rate_name(name: str) -> str:
    return SAMPLE_RATE if name == AUDIO else f"{name}_{SAMPLE_RATE}"


def decode_sample(
    sample: Mapping[str, Any],
    *,
    unknown: str = "error",
    rename: Mapping[str, str] | None = None,
    on_drop: Callable[[str], None] | None = None,
    channels: str | int = "keep",
    defer_audio: bool = False,
) -> Sample:
    """Decode the bytes fields of one raw sample (see :class:`DecoderIterDataPipe`).

    Args:
        sample: ``{"key", "source", "<field>": bytes, ...}`` as :mod:`~speechpipe.pipes.shards._reader`
            yields (``bytes``, ``bytearray`` or ``memoryview``); values that are not bytes-like
            (``key``, ``source``, already decoded fields) are kept as they are.
        unknown: what to do with a field whose extension is not in the allow-list:
            ``"error"`` raises :class:`DataError`, ``"keep"`` keeps its bytes under its own
            name (a ``memoryview`` copied into ``bytes``), ``"drop"`` removes it and calls
            ``on_drop(field)``.
        rename: output names by raw field name, overriding the default naming.
        on_drop: called with each dropped field name.
        channels: ``"keep"`` every channel of decoded audio, ``"downmix"`` them to their mean
            or keep one by index (:func:`~speechpipe.pipes.decode._codecs.choose_channels`).
        defer_audio: open and check audio fields (and set their sample rates) but leave their
            samples undecoded: each becomes a :class:`DeferredAudio` (what
            :class:`~speechpipe.pipes.collate.DecodeCollate` decodes into the batch).

    >>> decode_sample({"key": "u1", "source": "a.tar", "txt": b"hi", "n.cls": b"3"})
    {'key': 'u1', 'source': 'a.tar', 'text': 'hi', 'n': 3}
    """
    rename = rename or {}
    out: dict[str, Any] = {}

    def put(name: str, value: Any, field: str) -> None:
        if name in out:
            raise DataError(
                f"field {field!r} decodes to {name!r}, which another field already set; "
                "pass rename={...} to name them apart",
                **_where(sample, field),
            )
        out[name] = value

    for field, value in sample.items():
        if field in (KEY, SOURCE) or not isinstance(value, _BYTES):
            put(field, value, field)
            continue
        if not _is_known(field):
            if unknown == "error":
                decode_field(field, value, source=sample.get(SOURCE), key=sample.get(KEY))
            if unknown == "keep":  # as bytes: no view of a mapped shard outlives decoding
                put(field, bytes(value) if isinstance(value, memoryview) else value, field)
            elif on_drop is not None:
                on_drop(field)
            continue
        prefix, _, ext = field.rpartition(".")
        ext = ext.lower()
        name = rename.get(field) or prefix or _DEFAULT_NAMES.get(ext, ext)
        if defer_audio and ext in AUDIO_EXTENSIONS:
            deferred = _defer(value, channels, _where(sample, field))
            put(name, deferred, field)
            put(_rate_name(name), deferred.sample_rate, field)
            continue
        decoded = decode_field(field, value, source=sample.get(SOURCE), key=sample.get(KEY))
        if ext in AUDIO_EXTENSIONS:
            audio, rate = decoded
            if channels != "keep":
                audio = choose_channels(audio, channels, **_where(sample, field))
            put(name, audio, field)
            put(_rate_name(name), rate, field)
        else:
            put(name, decoded, field)
    return out


def check_decode_options(unknown: Any, rename: Any, channels: Any
                         ) -> tuple[str, dict | None, Any]:
    """``decode``'s ``unknown``, ``rename`` (copied) and ``channels``, checked; ``ValueError``
    or ``TypeError`` naming the bad one."""
    if unknown not in _UNKNOWN:
        raise ValueError(f"unknown must be one of {_UNKNOWN}, got {unknown!r}")
    if rename is not None:
        if not isinstance(rename, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) and v for k, v in rename.items()
        ):
            raise TypeError(f"rename must map field names to non-empty str, got {rename!r}")
        rename = dict(rename)
    return unknown, rename, check_channels(channels)


def _defer(data: Any, channels: Any, where: dict) -> DeferredAudio:
    if isinstance(data, memoryview):  # a mapped shard's pages, copied out by the open
        copied_out(len(data))
    try:
        f, context = open_audio(data, where["source"], where["key"])
    except DataError as exc:
        raise type(exc)(exc.reason, **where) from exc
    deferred = DeferredAudio(f, context, channels, where)
    if channels not in ("keep", "downmix") and not 0 <= channels < f.channels:
        deferred.close()  # choose_channels names the channel the audio lacks
        choose_channels(np.zeros((1, f.channels), np.float32), channels, **where)
    return deferred


@functional_datapipe("decode")
class DecoderIterDataPipe(IterDataPipe[Sample]):
    """Decode raw shard samples with an allow-list; never unpickle (functional name: ``decode``).

    Consumes raw samples ``{"key", "source", "<field>": bytes, ...}`` (from ``read_shards``)
    and yields decoded samples. The decoder is chosen by the last part of the field name and
    the output is named as follows:

    - a dotted field ``a.b`` is decoded by ``b`` and named ``a`` (``feats.npy`` -> ``feats``,
      ``words.txt`` -> ``words``);
    - a single extension gets the sample-schema name: audio -> ``audio`` (+ ``sample_rate``),
      ``txt``/``text``/``transcript`` -> ``text``, ``npy`` -> ``feats``, ``json`` -> ``meta``,
      ``cls``/``id``/``index`` keep their name;
    - audio named ``audio`` sets ``sample_rate``; any other audio name ``n`` (e.g. a second
      microphone ``mic2.flac`` -> ``mic2``) sets ``n_sample_rate``;
    - ``rename={"<raw field>": "<name>"}`` overrides all of this (``{"mic1.flac": "audio"}``).

    Two fields decoding to the same name raise :class:`~speechpipe.errors.DataError`. Values
    that are not bytes (``key``, ``source``) pass through. Errors name the shard
    (``sample["source"]``), the key and the member ``<key>.<field>``.

    Args:
        source_datapipe: pipe of raw samples.
        unknown: a field whose extension is not in the allow-list: ``"error"`` (default)
            raises, ``"keep"`` keeps its bytes under its raw name, ``"drop"`` removes it and
            counts it in :attr:`diagnostics` (reason ``"unknown extension dropped"``).
        rename: output names by raw field name.
        channels: what audio keeps of its channels: ``"keep"`` (default: mono ``(samples,)``,
            several ``(samples, channels)``), ``"downmix"`` (their mean, ``(samples,)``) or a
            channel index (``(samples,)``; a DataError for audio without that channel).
        on_error: ``"raise"`` (default) or ``"skip"``: drop a sample that does not decode
            (including an unsafe ``.pkl``/object-array field, which is never unpickled),
            count it in :attr:`diagnostics` and warn at the end of the pass. Counts cover the
            current (or last) pass.

    ``len()`` is the source's length under ``on_error="raise"`` (one sample out per sample
    in); under ``"skip"`` it raises :class:`TypeError`.

    To decode in threads inside each DataLoader worker -- where features are computed on the
    training device, the workers only decode -- use ``.map_in_threads(decode_sample,
    num_threads=2)`` instead (the same samples in the same order, resumable; soundfile calls
    libsndfile through cffi, which releases the GIL for each call; ``benchmarks/bench_decode.py``
    measures what the threads give).

    >>> import io, numpy as np
    >>> from speechpipe import IterableWrapper
    >>> buf = io.BytesIO(); np.save(buf, np.ones((2, 3), dtype=np.float32))
    >>> raw = {"key": "u1", "source": "a.tar", "txt": b"hello", "feats.npy": buf.getvalue()}
    >>> [s] = IterableWrapper([raw]).decode()
    >>> s["key"], s["text"], s["feats"].shape, s["feats"].dtype
    ('u1', 'hello', (2, 3), dtype('float32'))
    """

    holds_nothing = True  # item by item: nothing kept between two yields

    def __init__(
        self,
        source_datapipe: IterDataPipe,
        *,
        unknown: str = "error",
        rename: Mapping[str, str] | None = None,
        channels: str | int = "keep",
        on_error: str = "raise",
    ) -> None:
        self.source_datapipe = source_datapipe
        self.unknown, self.rename, self.channels = check_decode_options(unknown, rename, channels)
        self.on_error = check_on_error(on_error)
        self.diagnostics = Diagnostics("decode")

    def __iter__(self) -> Iterator[Sample]:
        self.diagnostics.reset()
        for sample in self.source_datapipe:
            if not isinstance(sample, Mapping):
                raise TypeError(f"decode expects sample dicts, got {type(sample).__name__}")

            def dropped(field: str, sample: Mapping = sample) -> None:
                where = _where(sample, field)
                self.diagnostics.record(
                    "unknown extension dropped",
                    f"{where['source']} [member {where['member']}] (unknown='drop')",
                )

            try:
                out = decode_sample(sample, unknown=self.unknown, rename=self.rename,
                                    on_drop=dropped, channels=self.channels)
            except DataError as err:
                reason = (
                    "unsafe field (never unpickled)"
                    if isinstance(err, UnsafeInputError)
                    else NON_FINITE if str(err.reason).startswith(NON_FINITE)
                    else "undecodable sample"
                )
                self.diagnostics.handle(self.on_error, err, reason)
                continue
            yield out
        self.diagnostics.warn_if_skipped()

    def __len__(self) -> int:
        return _one_to_one_len(self, "decode")


Decoder = DecoderIterDataPipe


# --------------------------------------------------------------------------------------------
# Audio named in manifests
# --------------------------------------------------------------------------------------------


def read_audio_segment(
    path: str | os.PathLike,
    *,
    offset: float | None = None,
    duration: float | None = None,
    key: str | None = None,
    remote: RemoteOptions | None = None,
) -> tuple[np.ndarray, int]:
    """Read a whole audio file, or ``duration`` seconds from ``offset`` seconds.

    Reads frames ``[round(offset * rate), round(offset * rate) + round(duration * rate))``.
    An object-storage URL (``s3://...``) is read whole with ``remote``'s options, then decoded.

    Raises:
        MissingDataError: the file or object does not exist (naming it and ``key``).
        DataError: it cannot be opened or decoded, the offset or duration is negative or not
            a number, or the file ends before the requested segment.

    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "a.wav")
    >>> soundfile.write(path, np.zeros(16000, dtype=np.float32), 16000)
    >>> audio, rate = read_audio_segment(path, offset=0.25, duration=0.5)
    >>> audio.shape, rate
    ((8000,), 16000)
    """
    path = os.fspath(path)
    seconds = {}
    for name, value in (("offset", offset), ("duration", duration)):
        if value is None:
            continue
        try:
            value = float(value)
        except (TypeError, ValueError) as exc:
            raise DataError(f"{name} must be seconds, got {value!r}", source=path,
                            key=key) from exc
        if not value >= 0:  # also rejects NaN
            raise DataError(f"{name} must be >= 0 seconds, got {value!r}", source=path, key=key)
        seconds[name] = value
    try:
        # a remote object is read whole: soundfile seeks, a remote stream cannot
        file = io.BytesIO(read_remote_bytes(path, remote)) if is_remote(path) else open(path, "rb")
    except FileNotFoundError as exc:  # a MissingDataError for a remote object
        raise MissingDataError("audio file not found", source=path, key=key) from exc
    except DataError as exc:  # a remote read that failed after its retries
        raise DataError(exc.reason, source=path, key=key) from exc
    except OSError as exc:
        raise DataError(f"cannot open audio file: {exc}", source=path, key=key) from exc
    with file:
        start, stop = 0, None
        if seconds:
            try:
                info = soundfile.info(file)
            except (soundfile.LibsndfileError, RuntimeError, TypeError, ValueError) as exc:
                raise DataError(f"cannot decode audio: {exc}", source=path, key=key) from exc
            file.seek(0)
            rate = info.samplerate
            start = round(seconds.get("offset", 0.0) * rate)
            if start > info.frames:
                raise DataError(
                    f"offset {seconds['offset']} s is past the end of the audio "
                    f"({info.frames / rate:.3f} s)",
                    source=path,
                    key=key,
                )
            if "duration" in seconds:
                stop = start + round(seconds["duration"] * rate)
        return read_audio(file, source=path, key=key, start=start, stop=stop)


@functional_datapipe("load_audio")
class AudioLoaderIterDataPipe(IterDataPipe[Sample]):
    """Read the audio file a manifest sample names (functional name: ``load_audio``).

    Consumes samples holding a path (``{"key", "audio_path": "wavs/u1.flac", ...}``) and yields
    them with ``audio`` (``float32``, time first) and ``sample_rate`` added; other fields are
    kept. With ``offset_field``/``duration_field`` only that segment is read (seconds). For
    tar shards use ``read_shards`` + ``decode`` instead.

    Args:
        source_datapipe: pipe of sample dicts.
        field: the field holding the path.
        offset_field: field holding the segment start in seconds (``None``: from the start).
        duration_field: field holding the segment length in seconds (``None``: to the end).
        whole_without_offset: a sample that lacks ``offset_field`` is a whole file: it is read
            to its end, its ``duration_field`` value (a measurement from a header or a table,
            which may round) is no stop point and is replaced by the decoded duration. Without
            this option a missing field is an error. For manifests mixing segments of long
            recordings with whole-file utterances.
        root: directory (or ``s3://...`` folder) relative paths are joined to (absolute paths
            and URLs are kept); ``None`` resolves them against the working directory.
        remote: how object-storage URLs (``s3://``...) are read (:class:`RemoteOptions`);
            each such file is read whole into memory, then decoded.
        channels: ``"keep"`` (default), ``"downmix"`` or a channel index, as in ``decode``.
        on_error: ``"raise"`` (default): a missing file raises
            :class:`~speechpipe.errors.MissingDataError`, an unreadable one or a bad sample
            :class:`~speechpipe.errors.DataError`, naming the file and the key; ``"skip"``
            drops the sample, counts it in :attr:`diagnostics` and warns at the end of the
            pass.

    ``len()`` is the source's length under ``on_error="raise"``; under ``"skip"`` it raises
    :class:`TypeError`.

    >>> import os, tempfile
    >>> from speechpipe import IterableWrapper
    >>> root = tempfile.mkdtemp()
    >>> soundfile.write(os.path.join(root, "u1.wav"), np.zeros(1600, np.float32), 16000)
    >>> rows = [{"key": "u1", "audio_path": "u1.wav", "start": 0.05, "dur": 0.025}]
    >>> [s] = IterableWrapper(rows).load_audio(
    ...     offset_field="start", duration_field="dur", root=root)
    >>> s["audio"].shape, s["sample_rate"], s["audio_path"]
    ((400,), 16000, 'u1.wav')
    """

    holds_nothing = True  # item by item: nothing kept between two yields

    def __init__(
        self,
        source_datapipe: IterDataPipe,
        field: str = "audio_path",
        *,
        offset_field: str | None = None,
        duration_field: str | None = None,
        whole_without_offset: bool = False,
        root: str | os.PathLike | None = None,
        channels: str | int = "keep",
        on_error: str = "raise",
        remote: RemoteOptions | None = None,
    ) -> None:
        if whole_without_offset and offset_field is None:
            raise ValueError("whole_without_offset needs an offset_field")
        for name, value in (("field", field), ("offset_field", offset_field),
                            ("duration_field", duration_field)):
            if value is None and name != "field":
                continue
            if not isinstance(value, str) or not value:
                raise TypeError(f"{name} must be a non-empty str, got {value!r}")
        if root is not None and not isinstance(root, (str, os.PathLike)):
            raise TypeError(f"root must be a path or None, got {root!r}")
        if remote is not None and not isinstance(remote, RemoteOptions):
            raise TypeError(f"remote must be a RemoteOptions or None, got {remote!r}")
        self.source_datapipe = source_datapipe
        self.field = field
        self.offset_field = offset_field
        self.duration_field = duration_field
        self.whole_without_offset = bool(whole_without_offset)
        self.root = None if root is None else os.fspath(root)
        self.channels = check_channels(channels)
        self.on_error = check_on_error(on_error)
        self.remote = remote
        self.diagnostics = Diagnostics("load_audio")

    def _load(self, sample: Mapping[str, Any]) -> Sample:
        key = sample.get(KEY)
        values = {}
        whole = self.whole_without_offset and self.offset_field not in sample
        names = (self.field,) if whole else (self.field, self.offset_field, self.duration_field)
        for name in names:
            if name is not None and name not in sample:
                raise DataError(f"sample has no field {name!r}", source=sample.get(SOURCE),
                                key=key)
            values[name] = sample.get(name)
        path = values[self.field]
        if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
            raise DataError(f"field {self.field!r} must hold a path, got {path!r}",
                            source=sample.get(SOURCE), key=key)
        path = os.fspath(path)
        if self.root is not None and not is_remote(path) and not os.path.isabs(path):
            root = self.root
            path = join_url(root, path) if is_remote(root) else os.path.join(root, path)
        audio, rate = read_audio_segment(
            path,
            offset=values.get(self.offset_field) if self.offset_field else None,
            duration=values.get(self.duration_field) if self.duration_field else None,
            key=key,
            remote=self.remote,
        )
        out = dict(sample)
        out[AUDIO] = choose_channels(audio, self.channels, source=path, key=key)
        out[SAMPLE_RATE] = rate
        if whole and self.duration_field is not None and self.duration_field in out:
            out[self.duration_field] = audio.shape[0] / rate
        return out

    def __iter__(self) -> Iterator[Sample]:
        self.diagnostics.reset()
        for sample in self.source_datapipe:
            if not isinstance(sample, Mapping):
                raise TypeError(f"load_audio expects sample dicts, got {type(sample).__name__}")
            try:
                out = self._load(sample)
            except MissingDataError as err:
                self.diagnostics.handle(self.on_error, err, "missing audio file")
                continue
            except DataError as err:
                self.diagnostics.handle(self.on_error, err, "unreadable audio")
                continue
            yield out
        self.diagnostics.warn_if_skipped()

    def __len__(self) -> int:
        return _one_to_one_len(self, "load_audio")


AudioLoader = AudioLoaderIterDataPipe
