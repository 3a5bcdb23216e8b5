"""Reading audio with soundfile: whole files, segments, and files opened for a later decode.

- :func:`read_audio`: a path, bytes or a binary file object to ``(float32 array, rate)``; the
  entry point every audio reader of speechpipe shares (``decode``, ``load_audio``, Kaldi
  tables, Hugging Face datasets), so that every road raises the same errors:
  :class:`~speechpipe.errors.MissingDataError` for a missing file,
  :class:`~speechpipe.errors.AudioFormatError` naming the format the first bytes show for
  bytes soundfile cannot decode, :class:`~speechpipe.errors.DataError` for a truncated WAV.
- :func:`short_wav`: a WAV whose data chunk is shorter than its header says (libsndfile reads
  what is there without an error).
- :class:`DeferredAudio`: a payload opened and checked, decoded later into memory given to it
  (:class:`~speechpipe.pipes.collate.DecodeCollate` decodes into the padded batch).
"""

from __future__ import annotations

import io
import re
from typing import Any, BinaryIO, Union

import numpy as np
import soundfile

from ...errors import AudioFormatError, DataError, MissingDataError
from ._codecs import choose_channels, sniff_format

__all__ = ["AudioInput", "DeferredAudio", "NON_FINITE", "check_finite", "read_audio", "short_wav"]

AudioInput = Union[str, bytes, BinaryIO]


def read_audio(
    data: AudioInput,
    *,
    source: str | None = None,
    key: str | None = None,
    start: int = 0,
    stop: int | None = None,
) -> tuple[np.ndarray, int]:
    """Read audio with soundfile: ``(float32 array, time first, sample_rate)``.

    Args:
        data: a path, the file's bytes, or a binary file object.
        source: where the data came from, for error messages (defaults to the path).
        key: utterance key, for error messages.
        start: first sample (frame) to read.
        stop: one past the last sample to read; ``None`` reads to the end.

    Mono audio is returned as ``(samples,)``, multi-channel as ``(samples, channels)``.
    Bytes soundfile cannot decode raise :class:`~speechpipe.errors.AudioFormatError` naming
    the format their first bytes show (:func:`~speechpipe.pipes.decode._codecs.sniff_format`).

    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "a.flac")
    >>> soundfile.write(path, np.zeros(1600, dtype=np.float32), 16000)
    >>> audio, rate = read_audio(path, start=100, stop=900)
    >>> audio.shape, audio.dtype, rate
    ((800,), dtype('float32'), 16000)
    """
    f, context = open_audio(data, source, key)
    try:
        with f:  # soundfile.read, plus the header's promise (checked when opened)
            if start != 0 and not f.seekable():
                raise ValueError("start is only allowed for seekable files")
            begin, end, _ = slice(start, stop).indices(f.frames)
            if f.seekable():
                f.seek(begin)
            audio = f.read(max(end, begin) - begin, dtype="float32", always_2d=False)
            rate = f.samplerate
    except (soundfile.LibsndfileError, RuntimeError, TypeError, ValueError) as exc:
        raise _audio_error(exc, *context) from exc
    if stop is not None and audio.shape[0] < stop - start:
        raise DataError(
            f"audio ends before the requested samples [{start}, {stop}): it has "
            f"{start + audio.shape[0]} samples",
            source=context[3],
            key=key,
        )
    check_finite(audio, source=context[3], key=key)
    return audio, int(rate)


def check_finite(audio: np.ndarray, *, source: str | None = None, key: str | None = None,
                 member: str | None = None) -> None:
    """Raise :class:`~speechpipe.errors.DataError` if ``audio`` holds NaN or infinite samples
    (a float WAV can; they poison every feature and loss computed from it), naming how many
    and the first.

    >>> check_finite(np.array([0.0, np.nan, np.inf], np.float32), source="a.wav")
    Traceback (most recent call last):
    ...
    speechpipe.errors.DataError: a.wav: non-finite audio: 1 NaN and 1 infinite of 3 samples ...
    """
    finite = np.isfinite(audio)
    if finite.all():
        return
    nan = int(np.isnan(audio).sum())
    first = int(np.argmin(finite.reshape(len(finite), -1).all(axis=1)))
    raise DataError(f"{NON_FINITE}: {nan} NaN and {int((~finite).sum()) - nan} infinite of "
                    f"{audio.size} samples (the first at sample {first})",
                    source=source, key=key, member=member)


#: The start of the reason of :func:`check_finite`'s error (what ``on_error`` counts it as).
NON_FINITE = "non-finite audio"


def open_audio(data: AudioInput, source: str | None, key: str | None
                ) -> tuple[soundfile.SoundFile, tuple]:
    """Open ``data`` with soundfile and check its header's promise (:func:`short_wav`): the
    open file, and the context :func:`_audio_error` names a later failure with."""
    where = source if source is not None else (data if isinstance(data, str) else None)
    fileobj = io.BytesIO(data) if isinstance(data, (bytes, bytearray, memoryview)) else data
    context = (data, fileobj, _tell(fileobj), where, key)
    try:
        f = soundfile.SoundFile(fileobj)
    except (FileNotFoundError, soundfile.LibsndfileError, RuntimeError, TypeError,
            ValueError) as exc:
        raise _audio_error(exc, *context) from exc
    short = short_wav(f)
    if short is not None:
        f.close()
        raise DataError(f"truncated WAV: its header promises {short[0]} bytes of audio but the "
                        f"file holds {short[1]}", source=where, key=key)
    return f, context


def _audio_error(exc: BaseException, data: AudioInput, fileobj: Any, position: int | None,
                 where: str | None, key: str | None) -> DataError:
    """The error to raise for ``exc`` met opening or decoding ``data``."""
    if isinstance(exc, FileNotFoundError) or (isinstance(data, str) and not _exists(data)):
        return MissingDataError("audio file not found", source=where, key=key)
    # libsndfile's own words, without soundfile's "Error opening <_io.BytesIO object at 0x...>"
    reason = getattr(exc, "error_string", None) or str(exc)
    return AudioFormatError(f"cannot decode audio (format: {_format_of(fileobj, position)}): "
                            f"{reason}", source=where, key=key)


class DeferredAudio:
    """An audio payload opened and checked (header read, :func:`short_wav`) whose samples are
    not decoded yet: what ``decode_sample(..., defer_audio=True)`` puts in place of the audio
    array, so that :class:`~speechpipe.pipes.collate.DecodeCollate` decodes it straight into
    its row of the padded batch. ``shape``, ``ndim``, ``dtype`` and ``nbytes`` describe the
    float32 array it decodes to (after ``channels``); :meth:`read_into` decodes, once.
    """

    __slots__ = ("shape", "sample_rate", "_file", "_context", "_channels", "_where")
    dtype = np.dtype(np.float32)

    def __init__(self, f: soundfile.SoundFile, context: tuple, channels: Any,
                 where: dict) -> None:
        self._file, self._context, self._channels, self._where = f, context, channels, where
        self.sample_rate = int(f.samplerate)
        keep_all = channels == "keep" and f.channels > 1
        self.shape = (f.frames, f.channels) if keep_all else (f.frames,)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * 4

    def read_into(self, out: np.ndarray) -> None:
        """Decode into ``out`` (of :attr:`shape`; float32 or float64 are written in place,
        other dtypes through a float32 copy), then close the file."""
        f = self._file
        try:
            with f:
                direct = self._channels == "keep" and out.dtype in (np.float32, np.float64)
                target = out if direct else np.empty((f.frames, f.channels), np.float32)
                got = f.read(f.frames, out=target)
        except (soundfile.LibsndfileError, RuntimeError, TypeError, ValueError) as exc:
            error = _audio_error(exc, *self._context)
            raise type(error)(error.reason, **self._where) from exc
        if len(got) < f.frames:
            raise DataError(f"audio ends early: its header promises {f.frames} samples, "
                            f"{len(got)} decoded", **self._where)
        check_finite(target, **self._where)
        if not direct:
            audio = target if f.channels > 1 else target[:, 0]
            if self._channels != "keep":
                audio = choose_channels(audio, self._channels, **self._where)
            out[...] = audio

    def close(self) -> None:
        self._file.close()

    def __repr__(self) -> str:
        return f"DeferredAudio(shape={self.shape}, sample_rate={self.sample_rate})"


_WAV_FORMATS = ("WAV", "WAVEX", "RF64", "W64")
_DATA_CHUNK = re.compile(r"^data\s*:\s*(\d+)\s*\(should be (\d+)\)", re.M)
_STREAMED_SIZE = 0x7FFF0000  # a writer that could not seek back (a pipe) puts ~2**31 or 2**32


def short_wav(f: soundfile.SoundFile) -> tuple[int, int] | None:
    """``(bytes promised, bytes present)`` of a WAV whose data chunk is shorter than its header
    says (libsndfile reads what is there without an error), else None. A header written by a
    streaming writer (size 0 or ~2**31/2**32: unknown length) promises nothing."""
    if f.format not in _WAV_FORMATS:
        return None
    found = _DATA_CHUNK.search(f.extra_info)
    if found is None:
        return None
    promised, present = int(found.group(1)), int(found.group(2))
    if 0 < present < promised < _STREAMED_SIZE:
        return promised, present
    return None


def _tell(fileobj: Any) -> int | None:
    try:
        return None if isinstance(fileobj, str) else fileobj.tell()
    except (AttributeError, OSError, ValueError):
        return None


def _format_of(fileobj: Any, position: int | None) -> str:
    """The format the first bytes of an undecodable input show (``unreadable`` if gone)."""
    try:
        if isinstance(fileobj, str):
            with open(fileobj, "rb") as f:
                return sniff_format(f.read(64))
        fileobj.seek(position)
        return sniff_format(fileobj.read(64))
    except (AttributeError, OSError, TypeError, ValueError):
        return "unreadable"


def _exists(path: str) -> bool:
    import os

    return os.path.exists(path)
