"""Decoding: allow-listed decoding of shard fields, audio files and codecs.

This is the package's face: other packages and
users import from here, never from its ``_modules``.
"""

from ._audio_io import AudioInput, check_finite, DeferredAudio, NON_FINITE, read_audio, short_wav
from ._codecs import (
    CHANNEL_CHOICES, check_channels, choose_channels, CODECS, encode_audio, OPUS_RATES,
    sniff_format,
)
from ._decode import (
    AudioLoaderIterDataPipe, check_decode_options, decode_field, decode_sample,
    DecoderIterDataPipe, read_audio_segment,
)

__all__ = [
    "AudioInput",
    "AudioLoaderIterDataPipe",
    "CHANNEL_CHOICES",
    "CODECS",
    "DecoderIterDataPipe",
    "DeferredAudio",
    "NON_FINITE",
    "OPUS_RATES",
    "check_channels",
    "check_decode_options",
    "check_finite",
    "choose_channels",
    "decode_field",
    "decode_sample",
    "encode_audio",
    "read_audio",
    "read_audio_segment",
    "short_wav",
    "sniff_format",
]
