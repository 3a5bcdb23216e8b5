"""Codecs (issue 21): FLAC, WAV (16/24-bit, 32-bit float), Ogg/Vorbis, Opus and MP3 through
soundfile, round trip on real speech (the demo corpus, resampled) at 8, 16, 22.05, 44.1 and
48 kHz, through every read path (``load_audio`` on files, ``read_shards`` + ``decode`` on tar
shards, ``load_scp("wav")`` on a Kaldi ``wav.scp``); named errors for what cannot be encoded
(Opus at 22.05/44.1 kHz) or decoded (AAC/M4A, random bytes).

Bounds (the figures: benchmarks/README.md, "Audio codecs"):
- integer PCM (WAV and FLAC, 16 and 24 bits) and float WAV: bit-exact;
- lossy codecs: waveform SNR >= 12 dB and correlation >= 0.98 against the input (measured
  16.6-34.8 dB and 0.989-0.9998 on this speech; these are perceptual codecs, so the waveform
  error is large beside what a listener hears);
- decoded length: libsndfile removes the encoder's delay and padding (Vorbis and Opus
  pre-skip and end trimming, MP3's LAME/Xing gapless header), so every codec gives back
  exactly the input's number of samples, which is asserted.
"""

from __future__ import annotations

import io
import os

import numpy as np
import pytest
import soundfile

import speechpipe as sp
from speechpipe.errors import AudioFormatError, DataError, UnsupportedCodecError
from speechpipe.pipes._core import IterableWrapper
from speechpipe.pipes.decode import CODECS, OPUS_RATES, sniff_format
from speechpipe.pipes.decode import read_audio
from speechpipe.pipes.shards import write_shard
from speechpipe.testing import demo_speech, on_pcm_grid, snr_db

RATES = (8000, 16000, 22050, 44100, 48000)
LOSSLESS = [("wav", "PCM_16"), ("wav", "PCM_24"), ("wav", "FLOAT"), ("flac", "PCM_16"),
            ("flac", "PCM_24")]
LOSSY = ["ogg", "opus", "mp3"]
MIN_SNR_DB, MIN_CORRELATION = 12.0, 0.98


def _bytes(data):
    return io.BytesIO(data)


def speech(rate):
    return demo_speech(rate, files=1)


# -------------------------------------------------------------------- lossless: bit-exact


@pytest.mark.parametrize("rate", RATES)
@pytest.mark.parametrize("codec, subtype", LOSSLESS)
def test_lossless_round_trip_is_bit_exact(codec, subtype, rate):
    source, expected = on_pcm_grid(speech(rate), subtype)
    data = sp.encode_audio(source, rate, codec, subtype=subtype)
    info = soundfile.info(_bytes(data))
    assert (info.format, info.subtype, info.samplerate) == (CODECS[codec][0], subtype, rate)
    audio, got_rate = read_audio(data)
    assert got_rate == rate and audio.dtype == np.float32
    assert np.array_equal(audio, expected)
    if subtype != "FLOAT":  # the integers themselves, read as integers
        assert np.array_equal(soundfile.read(_bytes(data), dtype=source.dtype.name)[0], source)


# -------------------------------------------------------------------- lossy: bounds


@pytest.mark.parametrize("codec, rate", [(c, r) for c in LOSSY for r in RATES
                                         if c != "opus" or r in OPUS_RATES])
def test_lossy_round_trip_is_within_its_bound(codec, rate):
    # Opus at 22.05 and 44.1 kHz: test_opus_refuses_rates_it_cannot_encode_with_a_named_error
    source = speech(rate)
    audio, got_rate = read_audio(sp.encode_audio(source, rate, codec))
    assert got_rate == rate
    assert audio.shape == source.shape  # the codec's delay and padding are removed
    assert snr_db(source, audio) >= MIN_SNR_DB
    assert np.corrcoef(source, audio)[0, 1] >= MIN_CORRELATION


@pytest.mark.parametrize("rate", [22050, 44100, 11025])
def test_opus_refuses_rates_it_cannot_encode_with_a_named_error(rate):
    with pytest.raises(UnsupportedCodecError, match=f"opus cannot encode {rate} Hz audio; it "
                                                    r"supports \[8000, 12000, 16000, 24000, "
                                                    r"48000\] Hz"):
        sp.encode_audio(speech(16000), rate, "opus")


@pytest.mark.parametrize("codec, subtype, message", [
    ("aac", None, "unknown codec 'aac'"),
    ("flac", "FLOAT", "flac \\(FLAC\\) has no subtype 'FLOAT'"),
    ("mp3", "VORBIS", "has no subtype 'VORBIS'"),
])
def test_encode_audio_refuses_unknown_codecs_and_subtypes(codec, subtype, message):
    with pytest.raises(UnsupportedCodecError, match=message):
        sp.encode_audio(speech(16000), 16000, codec, subtype=subtype)


def test_unsupported_codec_error_is_a_value_error():
    assert issubclass(UnsupportedCodecError, ValueError)
    assert issubclass(AudioFormatError, DataError)


# -------------------------------------------------------------------- every read path


CASES = [("wav", "PCM_24"), ("wav", "FLOAT"), ("flac", "PCM_16"), ("ogg", None), ("opus", None),
         ("mp3", None)]


def _via_files(tmp_path, name, data):
    (tmp_path / name).write_bytes(data)
    [out] = IterableWrapper([{"key": "u1", "audio_path": name}]).load_audio(root=tmp_path)
    return out


def _via_shards(tmp_path, name, data):
    write_shard(tmp_path / "s.tar", [{"key": "u1", name.rpartition(".")[2]: data}])
    [out] = IterableWrapper([str(tmp_path / "s.tar")]).open().read_shards().decode()
    return out


def _via_wav_scp(tmp_path, name, data):
    (tmp_path / name).write_bytes(data)
    (tmp_path / "wav.scp").write_text(f"u1 {name}\n")
    [out] = (IterableWrapper([str(tmp_path / "wav.scp")]).open_files(mode="b").parse_scp()
             .load_scp("wav", root=str(tmp_path)))
    return out


PATHS = {"files": _via_files, "shards": _via_shards, "wav.scp": _via_wav_scp}


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("codec, subtype", CASES)
def test_every_read_path_decodes_every_codec_as_read_audio_does(tmp_path, path, codec, subtype):
    source = speech(16000)
    data = sp.encode_audio(source, 16000, codec, subtype=subtype)
    out = PATHS[path](tmp_path, f"u1.{codec}", data)
    expected, rate = read_audio(data)
    assert out["sample_rate"] == rate == 16000
    assert np.array_equal(out["audio"], expected)  # one decoder behind every path


# -------------------------------------------------------------------- what soundfile cannot read

# The first bytes of an MP4/M4A (AAC) file: an ``ftyp`` box naming the M4A brand, then the
# start of a ``moov`` box (libsndfile has no MP4 reader, so the rest does not matter).
M4A = (b"\x00\x00\x00\x20ftypM4A \x00\x00\x02\x00M4A isomiso2\x00\x00\x00\x08free"
       + b"\x00\x00\x01\x00moov" + bytes(range(256)) * 4)
RANDOM = np.random.default_rng(21).integers(0, 256, 4096, dtype=np.uint8).tobytes()


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("payload, fmt", [(M4A, "MP4/M4A"), (RANDOM, "unknown")])
def test_undecodable_audio_is_a_named_error_with_file_key_and_format(tmp_path, path, payload,
                                                                     fmt):
    name = "u1.flac" if path == "shards" else ("u1.m4a" if payload is M4A else "u1.wav")
    with pytest.raises(AudioFormatError, match=f"cannot decode audio \\(format: {fmt}") as info:
        PATHS[path](tmp_path, name, payload)
    err = info.value
    assert err.key == "u1"
    where = {"files": name, "shards": "s.tar", "wav.scp": "wav.scp"}[path]
    assert err.source is not None and err.source.endswith(where)
    if path == "shards":
        assert err.member == "u1.flac"


def test_undecodable_bytes_from_a_stream_name_their_format(tmp_path):
    path = tmp_path / "x.m4a"
    path.write_bytes(M4A)
    with open(path, "rb") as f, pytest.raises(AudioFormatError, match="MP4/M4A") as info:
        read_audio(f, source=os.fspath(path), key="k")
    assert info.value.source == os.fspath(path)


@pytest.mark.parametrize("head, name", [
    (b"RIFF\x00\x00\x00\x00WAVEfmt ", "WAV"),
    (b"fLaC\x00\x00\x00\x22", "FLAC"),
    (b"OggS\x00\x02" + bytes(22) + b"OpusHead", "Ogg/Opus"),
    (b"OggS\x00\x02" + bytes(22) + b"\x01vorbis", "Ogg/Vorbis"),
    (b"ID3\x04\x00", "MP3"),
    (b"\xff\xfb\x90\x64", "MP3"),
    (b"\xff\xf1\x50\x80", "AAC (ADTS)"),
    (M4A[:32], "MP4/M4A (AAC or ALAC)"),
    (b"\x1aE\xdf\xa3\x01", "Matroska/WebM"),
    (b"", "empty"),
])
def test_sniff_format_names_common_containers(head, name):
    assert sniff_format(head) == name


def test_sniff_format_agrees_with_what_encode_audio_writes():
    audio = speech(16000)[:1600]
    names = {codec: sniff_format(sp.encode_audio(audio, 16000, codec)) for codec in CODECS}
    assert names == {"wav": "WAV", "flac": "FLAC", "ogg": "Ogg/Vorbis", "opus": "Ogg/Opus",
                     "mp3": "MP3"}
