"""Audio codecs and channels: what soundfile writes, what a payload it cannot read is, and
which channels of decoded audio a sample keeps.

Every read path (``decode`` on tar shards, ``load_audio`` on manifests, ``load_scp`` /
``load_segments`` on Kaldi tables) reads audio with soundfile (libsndfile), which decodes WAV
(integer PCM, 32/64-bit float, A-law, mu-law), FLAC, Ogg/Vorbis, Ogg/Opus and MP3 (libsndfile
>= 1.1). Bytes it cannot decode -- an MP4/M4A (AAC) file, WebM, random bytes -- raise
:class:`~speechpipe.errors.AudioFormatError` naming the file or key and the format its first
bytes show (:func:`sniff_format`).

:func:`encode_audio` writes the same formats (round-trip figures: ``benchmarks/README.md``,
"Audio codecs"); Opus only at 8, 12, 16, 24 and 48 kHz (:data:`OPUS_RATES`), any other
rate, or a subtype the format does not have, is an
:class:`~speechpipe.errors.UnsupportedCodecError`.

Channels: audio is **time first**, ``(samples,)`` mono or ``(samples, channels)``
(soundfile's layout, :mod:`speechpipe.sample`). :func:`choose_channels` keeps them all
(``"keep"``), averages them (``"downmix"``) or keeps one (an index); the ``decode`` and
``load_audio`` option ``channels=`` and the ``select_channel`` / ``downmix`` stages
(:mod:`speechpipe.pipes.audio._channels`) call it.
"""

from __future__ import annotations

import io
import numbers
from typing import Any, Union

import numpy as np
import soundfile

from ...errors import DataError, UnsupportedCodecError

__all__ = ["CHANNEL_CHOICES", "CODECS", "OPUS_RATES", "check_channels", "choose_channels",
           "encode_audio", "sniff_format"]

#: Codec name (also the file extension it is written with) -> (soundfile format, default
#: subtype). ``wav`` and ``flac`` take other subtypes (``PCM_24``, ``FLOAT``...).
CODECS = {
    "wav": ("WAV", "PCM_16"),
    "flac": ("FLAC", "PCM_16"),
    "ogg": ("OGG", "VORBIS"),
    "opus": ("OGG", "OPUS"),
    "mp3": ("MP3", "MPEG_LAYER_III"),
}
#: The only sample rates the Opus codec encodes.
OPUS_RATES = (8000, 12000, 16000, 24000, 48000)
#: The named values of a ``channels=`` option (an ``int`` index is the third kind).
CHANNEL_CHOICES = ("keep", "downmix")

Channels = Union[str, int]


def encode_audio(
    audio: np.ndarray,
    sample_rate: int,
    codec: str = "flac",
    *,
    subtype: str | None = None,
) -> bytes:
    """Encode audio (float, time first: ``(samples,)`` or ``(samples, channels)``) to bytes.

    Args:
        audio: the waveform, values in [-1, 1].
        sample_rate: its rate in Hz.
        codec: a key of :data:`CODECS` (``wav flac ogg opus mp3``).
        subtype: a soundfile subtype of the codec's format (``PCM_24``, ``FLOAT``...);
            default the codec's in :data:`CODECS`.

    Ogg (Vorbis, Opus) streams carry a random serial number, so their bytes differ from one
    call to the next; the decoded audio does not.

    Raises:
        UnsupportedCodecError: an unknown codec, a subtype the format lacks, Opus at a rate
            not in :data:`OPUS_RATES`, or any other combination libsndfile refuses to write.

    >>> data = encode_audio(np.zeros(1600, np.float32), 16000, "wav", subtype="PCM_24")
    >>> soundfile.info(io.BytesIO(data)).subtype
    'PCM_24'
    >>> encode_audio(np.zeros(1600, np.float32), 44100, "opus")
    Traceback (most recent call last):
    ...
    speechpipe.errors.UnsupportedCodecError: opus cannot encode 44100 Hz audio; it supports ...
    """
    if codec not in CODECS:
        raise UnsupportedCodecError(f"unknown codec {codec!r}; choose one of {sorted(CODECS)}")
    fmt, default = CODECS[codec]
    subtype = default if subtype is None else subtype
    if not soundfile.check_format(fmt, subtype):
        raise UnsupportedCodecError(
            f"{codec} ({fmt}) has no subtype {subtype!r} in this libsndfile "
            f"({soundfile.__libsndfile_version__}); it has "
            f"{sorted(soundfile.available_subtypes(fmt))}")
    if subtype == "OPUS" and int(sample_rate) not in OPUS_RATES:
        raise UnsupportedCodecError(f"opus cannot encode {sample_rate} Hz audio; it supports "
                                    f"{list(OPUS_RATES)} Hz (resample first)")
    buf = io.BytesIO()
    try:
        soundfile.write(buf, audio, int(sample_rate), format=fmt, subtype=subtype)
    except (soundfile.LibsndfileError, RuntimeError, TypeError, ValueError) as exc:
        raise UnsupportedCodecError(f"cannot encode {sample_rate} Hz audio as {codec} "
                                    f"({fmt}/{subtype}): {exc}") from exc
    return buf.getvalue()


# Signatures of formats, checked in order against the first bytes of a payload.
_SIGNATURES = (
    (0, b"fLaC", "FLAC"),
    (0, b"ID3", "MP3"),
    (0, b"RF64", "RF64 WAV"),
    (0, b"FORM", "AIFF"),
    (0, b".snd", "AU"),
    (0, b"caff", "CAF"),
    (0, b"\x1aE\xdf\xa3", "Matroska/WebM"),
    (0, b"wvpk", "WavPack"),
    (0, b"MAC ", "Monkey's Audio"),
    (4, b"ftyp", "MP4/M4A (AAC or ALAC)"),
)


def sniff_format(head: bytes) -> str:
    """The audio format the first bytes of a payload show (64 bytes are plenty), for messages.

    >>> sniff_format(b"\\x00\\x00\\x00\\x20ftypM4A \\x00\\x00")
    'MP4/M4A (AAC or ALAC)'
    >>> sniff_format(b"\\xff\\xf1\\x50\\x80")
    'AAC (ADTS)'
    >>> sniff_format(b"hello")
    "unknown (first bytes b'hello')"
    """
    head = bytes(head[:64])
    if head[:4] == b"RIFF":
        return "WAV" if head[8:12] == b"WAVE" else "RIFF (not WAVE)"
    if head[:4] == b"OggS":
        return ("Ogg/Opus" if b"OpusHead" in head else "Ogg/Vorbis" if b"\x01vorbis" in head
                else "Ogg")
    for offset, magic, name in _SIGNATURES:
        if head[offset:offset + len(magic)] == magic:
            return name
    if len(head) >= 2 and head[0] == 0xFF:
        if head[1] & 0xF6 == 0xF0:  # 12-bit sync, layer 00: ADTS
            return "AAC (ADTS)"
        if head[1] & 0xE0 == 0xE0:  # 11-bit frame sync: an MPEG audio frame
            return "MP3"
    return f"unknown (first bytes {head[:12]!r})" if head else "empty"


def check_channels(channels: Any) -> Channels:
    """Validate a ``channels=`` option: ``"keep"``, ``"downmix"`` or a channel index >= 0."""
    if isinstance(channels, str) and channels in CHANNEL_CHOICES:
        return channels
    if isinstance(channels, numbers.Integral) and not isinstance(channels, bool):
        if channels < 0:
            raise ValueError(f"channels must be a channel index >= 0, got {channels!r}")
        return int(channels)
    raise ValueError(f"channels must be one of {CHANNEL_CHOICES} or a channel index, "
                     f"got {channels!r}")


def choose_channels(
    audio: np.ndarray,
    channels: Channels,
    *,
    source: str | None = None,
    member: str | None = None,
    key: str | None = None,
) -> np.ndarray:
    """Keep, average or pick the channels of time-first audio.

    ``"keep"`` returns ``audio`` as it is; ``"downmix"`` the mean over channels, ``(samples,)``
    float32 (mono audio unchanged); an index ``i`` channel ``i`` as contiguous ``(samples,)``
    (index 0 of mono audio is the audio itself).

    Raises:
        DataError: the index names a channel the audio does not have (naming ``source``,
            ``member`` and ``key``), or the audio is not ``(samples,)`` / ``(samples, channels)``.

    >>> stereo = np.stack([np.zeros(4, np.float32), np.ones(4, np.float32)], axis=1)
    >>> choose_channels(stereo, "downmix"), choose_channels(stereo, 1)
    (array([0.5, 0.5, 0.5, 0.5], dtype=float32), array([1., 1., 1., 1.], dtype=float32))
    """
    if channels == "keep":
        return audio
    if audio.ndim not in (1, 2):
        raise DataError(f"expected (samples,) or (samples, channels) audio, got shape "
                        f"{audio.shape}", source=source, member=member, key=key)
    count = 1 if audio.ndim == 1 else audio.shape[1]
    if channels == "downmix":
        if audio.ndim == 1:
            return audio
        return audio.mean(axis=1, dtype=np.float64).astype(audio.dtype, copy=False)
    if channels >= count:
        raise DataError(f"channel {channels} does not exist: the audio has {count} channel(s)",
                        source=source, member=member, key=key)
    return audio if audio.ndim == 1 else np.ascontiguousarray(audio[:, channels])
