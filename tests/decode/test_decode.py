"""Allow-list decoding (decode), loading manifest audio (load_audio) and field encoding.

Invariant: nothing is ever unpickled; every field is decoded by an allow-listed decoder or
raises a DataError naming the shard, the key and the member.
"""

from __future__ import annotations

import io
import os
import pathlib
import pickle
import warnings

import numpy as np
import pytest
import soundfile

import speechpipe  # noqa: F401
from speechpipe.diagnostics import SkippedInputWarning
from speechpipe.errors import DataError, MissingDataError, UnsafeInputError
from speechpipe.pipes.shards import _reader as _shards
from speechpipe.pipes._core import IterableWrapper
from speechpipe.pipes.decode import (
    AudioLoaderIterDataPipe,
    DecoderIterDataPipe,
    decode_field,
    decode_sample,
    read_audio,
    read_audio_segment,
)
from speechpipe.pipes.shards import encode_field, write_shard

SRC = "shards/a-00003.tar"


def raw(**fields):
    return {"key": "spk1/utt7", "source": SRC, **fields}


def npy_bytes(array, allow_pickle=False) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=allow_pickle)
    return buf.getvalue()


def audio_bytes(audio, rate=16000, fmt="FLAC") -> bytes:
    buf = io.BytesIO()
    soundfile.write(buf, audio, rate, format=fmt)
    return buf.getvalue()


def tone(n=1600):
    return ((np.arange(n) % 100 - 50) * 128).astype(np.float32) / 32768  # exact in 16-bit PCM


def decode_one(sample, **kwargs):
    [out] = list(IterableWrapper([sample]).decode(**kwargs))
    return out


class _TouchOnUnpickle:
    """Unpickling this creates ``path``: proof that something was unpickled."""

    def __init__(self, path):
        self.path = pathlib.Path(path)

    def __reduce__(self):
        return (pathlib.Path.touch, (self.path,))


@pytest.fixture
def no_unpickling(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("pickle was called")

    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "Unpickler", refuse)


# --------------------------------------------------------------------------------------------
# decoders and naming
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("ext, fmt", [("flac", "FLAC"), ("wav", "WAV")])
def test_audio_fields_decode_exactly_to_audio_and_sample_rate(ext, fmt):
    audio = tone()
    out = decode_one(raw(**{ext: audio_bytes(audio, 22050, fmt)}))
    assert out["sample_rate"] == 22050
    assert out["audio"].dtype == np.float32 and np.array_equal(out["audio"], audio)


def test_ogg_audio_decodes_with_its_rate():
    out = decode_one(raw(ogg=audio_bytes(tone(8000), 8000, "OGG")))
    assert out["sample_rate"] == 8000 and out["audio"].shape == (8000,)


def test_npy_decodes_exactly_and_is_named_feats():
    feats = np.arange(24, dtype=np.float32).reshape(6, 4) / 7
    tokens = np.array([3, 1, 4], dtype=np.int64)
    out = decode_one(raw(npy=npy_bytes(feats), **{"tokens.npy": npy_bytes(tokens)}))
    assert out["feats"].dtype == np.float32 and np.array_equal(out["feats"], feats)
    assert out["tokens"].dtype == np.int64 and np.array_equal(out["tokens"], tokens)


@pytest.mark.parametrize("ext", ["txt", "text", "transcript"])
def test_text_fields_decode_as_utf8_to_text(ext):
    assert decode_one(raw(**{ext: "héllo wörld\n".encode()}))["text"] == "héllo wörld\n"


def test_json_decodes_to_meta():
    assert decode_one(raw(json=b'{"spk": "s1", "d": [1, 2.5]}'))["meta"] == {"spk": "s1",
                                                                             "d": [1, 2.5]}


@pytest.mark.parametrize("ext", ["cls", "id", "index"])
def test_integer_fields(ext):
    assert decode_one(raw(**{ext: b" 42\n"}))[ext] == 42


def test_dotted_fields_are_named_by_their_prefix():
    out = decode_one(raw(**{"words.txt": b"a b", "info.json": b"[]", "spk.id": b"3"}))
    assert (out["words"], out["info"], out["spk"]) == ("a b", [], 3)


def test_two_audio_fields_keep_their_names_and_rates():
    out = decode_one(raw(flac=audio_bytes(tone(160), 16000),
                         **{"mic2.wav": audio_bytes(tone(80), 8000, "WAV")}))
    assert out["sample_rate"] == 16000 and out["audio"].shape == (160,)
    assert out["mic2_sample_rate"] == 8000 and out["mic2"].shape == (80,)


def test_rename_overrides_default_names():
    out = decode_one(raw(**{"mic1.flac": audio_bytes(tone(160))}, txt=b"x"),
                     rename={"mic1.flac": "audio", "txt": "transcript"})
    assert out["sample_rate"] == 16000 and out["audio"].shape == (160,)
    assert out["transcript"] == "x" and "mic1" not in out and "text" not in out


def test_key_source_and_non_bytes_values_pass_through():
    out = decode_sample(raw(txt=b"x", duration=1.5))
    assert out == {"key": "spk1/utt7", "source": SRC, "text": "x", "duration": 1.5}


def test_two_fields_decoding_to_one_name_raise():
    with pytest.raises(DataError, match=r"^shards/a-00003.tar \[member spk1/utt7.text\] \(key "
                                        r"'spk1/utt7'\): field 'text' decodes to 'text', which "
                                        "another field already set"):
        decode_sample(raw(txt=b"a", text=b"b"))


def test_read_shards_then_decode_on_a_written_shard(tmp_path):
    path = str(tmp_path / "s.tar")
    write_shard(path, [{"key": "u1", "wav": tone(320), "sample_rate": 8000, "txt": "hi",
                        "feats.npy": np.ones((2, 2), np.float32)}])
    [s] = IterableWrapper([path]).open_files(mode="b").read_shards().decode()
    assert sorted(s) == ["audio", "feats", "key", "sample_rate", "source", "text"]
    assert np.array_equal(s["audio"], tone(320)) and s["sample_rate"] == 8000


# --------------------------------------------------------------------------------------------
# never unpickle
# --------------------------------------------------------------------------------------------


def test_the_marker_payload_really_creates_its_file_when_unpickled(tmp_path):
    # Control: proves the tests below would notice an unpickling.
    control = tmp_path / "control"
    pickle.loads(pickle.dumps(_TouchOnUnpickle(control)))
    assert control.exists()


@pytest.mark.parametrize("ext", ["pkl", "pickle", "pyd", "pth", "pt", "state.PKL"])
def test_pickle_members_are_never_unpickled(tmp_path, no_unpickling, ext):
    marker = tmp_path / "unpickled"
    payload = pickle.dumps(_TouchOnUnpickle(marker))
    with pytest.raises(UnsafeInputError, match=rf"^{SRC} \[member spk1/utt7.{ext}\] \(key "
                                               r"'spk1/utt7'\): .*never unpickles shard "
                                               "contents"):
        decode_sample(raw(**{ext: payload}))
    assert not marker.exists()


def test_pickle_member_in_a_real_shard_is_refused_and_never_unpickled(tmp_path, no_unpickling):
    marker = tmp_path / "unpickled"
    shard = tmp_path / "evil.tar"
    import tarfile

    payload = pickle.dumps(_TouchOnUnpickle(marker))
    with tarfile.open(shard, "w") as tar:
        for name, data in (("u1.txt", b"fine"), ("u1.pkl", payload)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with pytest.raises(UnsafeInputError, match=rf"^{shard} \[member u1.pkl\] \(key 'u1'\)"):
        list(IterableWrapper([str(shard)]).open_files(mode="b").read_shards().decode())
    assert not marker.exists()


def test_npy_object_array_is_unsafe_and_never_unpickled(tmp_path, no_unpickling):
    marker = tmp_path / "unpickled"
    data = npy_bytes(np.array([_TouchOnUnpickle(marker)], dtype=object), allow_pickle=True)
    with pytest.raises(UnsafeInputError, match=rf"^{SRC} \[member spk1/utt7.feats.npy\] \(key "
                                               r"'spk1/utt7'\): a .npy object array"):
        decode_sample(raw(**{"feats.npy": data}))
    assert not marker.exists()


def test_unsafe_fields_are_skipped_and_counted_under_skip(tmp_path, no_unpickling):
    pipe = IterableWrapper([raw(pkl=b"\x80\x04N."), raw(txt=b"ok")]).decode(on_error="skip")
    with pytest.warns(SkippedInputWarning, match="unsafe field"):
        assert [s["text"] for s in pipe] == ["ok"]
    assert dict(pipe.diagnostics.counts) == {"unsafe field (never unpickled)": 1}


# --------------------------------------------------------------------------------------------
# malformed fields: each names shard, key and member
# --------------------------------------------------------------------------------------------

WHERE = rf"^{SRC} \[member spk1/utt7\.%s\] \(key 'spk1/utt7'\): "


def test_invalid_utf8_text():
    with pytest.raises(DataError, match=WHERE % "txt" + "invalid UTF-8 at byte 2"):
        decode_sample(raw(txt=b"ok\xff\xfe"))


def test_invalid_json():
    with pytest.raises(DataError, match=WHERE % "json" + "invalid JSON: Expecting"):
        decode_sample(raw(json=b'{"a": '))


def test_invalid_integer():
    with pytest.raises(DataError, match=WHERE % "cls" + "expected an integer, got 'seven'"):
        decode_sample(raw(cls=b"seven"))


def test_bytes_that_are_not_npy():
    with pytest.raises(DataError, match=WHERE % r"feats\.npy" + "not a .npy array"):
        decode_sample(raw(**{"feats.npy": b"PK\x03\x04 a zip"}))


def test_truncated_npy():
    with pytest.raises(DataError, match=WHERE % "npy" + "cannot load .npy array"):
        decode_sample(raw(npy=npy_bytes(np.zeros((10, 10)))[:-40]))


def test_undecodable_audio():
    with pytest.raises(DataError, match=WHERE % "flac" + "cannot decode audio"):
        decode_sample(raw(flac=b"fLaC but not really audio"))


def test_unknown_extension_raises_by_default():
    with pytest.raises(DataError, match=WHERE % "png" + "no decoder for field 'png'.*unknown="):
        decode_one(raw(png=b"\x89PNG"))


def test_unknown_extension_kept_as_bytes_under_keep():
    out = decode_one(raw(png=b"\x89PNG", txt=b"x"), unknown="keep")
    assert out["png"] == b"\x89PNG" and out["text"] == "x"


def test_unknown_extension_dropped_and_counted_under_drop():
    pipe = IterableWrapper([raw(png=b"\x89PNG", txt=b"x"), raw(txt=b"y")]).decode(unknown="drop")
    with pytest.warns(SkippedInputWarning, match="unknown extension dropped: 1"):
        out = list(pipe)
    assert out == [{"key": "spk1/utt7", "source": SRC, "text": t} for t in "xy"]
    assert "spk1/utt7.png" in pipe.diagnostics.examples["unknown extension dropped"][0]


def test_skip_policy_drops_undecodable_samples_and_warns():
    samples = [raw(txt=b"a"), raw(json=b"{"), raw(txt=b"c")]
    pipe = IterableWrapper(samples).decode(on_error="skip")
    with pytest.warns(SkippedInputWarning, match="decode skipped 1 item"):
        assert [s["text"] for s in pipe] == ["a", "c"]
    assert dict(pipe.diagnostics.counts) == {"undecodable sample": 1}
    with warnings.catch_warnings():  # a second clean pass: counts are per pass
        warnings.simplefilter("error")
        list(IterableWrapper([raw(txt=b"a")]).decode(on_error="skip"))


@pytest.mark.parametrize("kwargs, error, match", [
    ({"unknown": "ignore"}, ValueError, "unknown must be one of"),
    ({"on_error": "warn"}, ValueError, "on_error must be one of"),
    ({"rename": {"wav": 3}}, TypeError, "rename must map field names"),
])
def test_decoder_validates_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        DecoderIterDataPipe(IterableWrapper([]), **kwargs)


def test_decode_len_is_the_source_length_only_under_raise():
    assert len(IterableWrapper([raw(txt=b"a")] * 3).decode()) == 3
    with pytest.raises(TypeError, match="on_error='skip'.* has no len"):
        len(IterableWrapper([raw(txt=b"a")]).decode(on_error="skip"))


def test_decode_field_directly():
    assert decode_field("n.index", b"12") == 12
    audio, rate = decode_field("x.wav", audio_bytes(tone(100), 8000, "WAV"))
    assert rate == 8000 and np.array_equal(audio, tone(100))


# --------------------------------------------------------------------------------------------
# encoding (the writer's allow-list) round-trips through decoding
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("field, value", [
    ("txt", "ünï\ncode"),
    ("meta.json", {"a": [1, 2], "b": "ü"}),
    ("cls", 7),
    ("feats.npy", np.arange(12, dtype=np.float64).reshape(3, 4)),
    ("bin", b"\x00\x01raw"),
])
def test_encode_then_decode_round_trips(field, value):
    data = encode_field(field, value)
    if field == "bin":
        assert data == value
        return
    decoded = decode_field(field, data)
    if isinstance(value, np.ndarray):
        assert decoded.dtype == value.dtype and np.array_equal(decoded, value)
    else:
        assert decoded == value


def test_encode_audio_round_trips_at_the_sample_rate():
    for ext in ("flac", "wav"):
        audio, rate = decode_field(ext, encode_field(ext, tone(), sample_rate=24000))
        assert rate == 24000 and np.array_equal(audio, tone())


def test_read_audio_still_reads_bytes_and_ranges():
    audio, rate = read_audio(audio_bytes(tone(1000), 8000), start=10, stop=20)
    assert rate == 8000 and np.array_equal(audio, tone(1000)[10:20])


# --------------------------------------------------------------------------------------------
# load_audio
# --------------------------------------------------------------------------------------------


@pytest.fixture
def corpus(tmp_path):
    (tmp_path / "wavs").mkdir()
    soundfile.write(tmp_path / "wavs" / "u1.flac", tone(16000), 16000)
    (tmp_path / "wavs" / "bad.wav").write_bytes(b"RIFF not really a wav file")
    return tmp_path


def test_load_audio_reads_whole_files_relative_to_root(corpus):
    rows = [{"key": "u1", "audio_path": "wavs/u1.flac", "text": "hi"}]
    [s] = IterableWrapper(rows).load_audio(root=corpus)
    assert s["sample_rate"] == 16000 and np.array_equal(s["audio"], tone(16000))
    assert s["text"] == "hi" and s["audio_path"] == "wavs/u1.flac"


def test_load_audio_uses_absolute_paths_as_they_are(corpus, tmp_path_factory):
    other_root = tmp_path_factory.mktemp("elsewhere")
    rows = [{"key": "u1", "wav": str(corpus / "wavs" / "u1.flac")}]
    [s] = IterableWrapper(rows).load_audio("wav", root=other_root)
    assert s["audio"].shape == (16000,)


def test_load_audio_reads_a_segment(corpus):
    rows = [{"key": "u1", "audio_path": "wavs/u1.flac", "offset": 0.25, "duration": 0.5}]
    [s] = IterableWrapper(rows).load_audio(offset_field="offset", duration_field="duration",
                                           root=corpus)
    assert np.array_equal(s["audio"], tone(16000)[4000:12000])


def test_load_audio_whole_without_offset_reads_whole_files_and_segments(corpus):
    rows = [{"key": "w", "audio_path": "wavs/u1.flac", "duration": 1.2},  # a rounded-up value
            {"key": "s", "audio_path": "wavs/u1.flac", "offset": 0.25, "duration": 0.5}]
    whole, seg = IterableWrapper(rows).load_audio(
        offset_field="offset", duration_field="duration", whole_without_offset=True,
        root=corpus)
    assert np.array_equal(whole["audio"], tone(16000)) and whole["duration"] == 1.0
    assert np.array_equal(seg["audio"], tone(16000)[4000:12000]) and seg["duration"] == 0.5
    with pytest.raises(DataError, match=r"\(key 'w'\): sample has no field 'offset'"):
        list(IterableWrapper(rows[:1]).load_audio(
            offset_field="offset", duration_field="duration", root=corpus))


def test_load_audio_offset_without_duration_reads_to_the_end(corpus):
    assert read_audio_segment(corpus / "wavs" / "u1.flac", offset=0.75)[0].shape == (4000,)


def test_missing_audio_file_names_file_and_key(corpus):
    rows = [{"key": "u9", "audio_path": "wavs/u9.flac"}]
    with pytest.raises(MissingDataError, match=r"wavs/u9.flac \(key 'u9'\): audio file not "
                                               "found"):
        list(IterableWrapper(rows).load_audio(root=corpus))


def test_missing_audio_file_for_a_segment_names_file_and_key(corpus):
    with pytest.raises(MissingDataError, match=r"u9.flac \(key 'u9'\): audio file not found"):
        read_audio_segment(corpus / "u9.flac", offset=1.0, key="u9")


def test_unreadable_audio_file(corpus):
    rows = [{"key": "b1", "audio_path": "wavs/bad.wav"}]
    with pytest.raises(DataError, match=r"wavs/bad.wav \(key 'b1'\): cannot decode audio"):
        list(IterableWrapper(rows).load_audio(root=corpus))


def test_segment_past_the_end_of_the_file(corpus):
    with pytest.raises(DataError, match=r"u1.flac \(key 'u1'\): audio ends before the "
                                        "requested samples"):
        read_audio_segment(corpus / "wavs" / "u1.flac", offset=0.5, duration=1.0, key="u1")
    with pytest.raises(DataError, match=r"offset 2.0 s is past the end of the audio \(1.000 s\)"):
        read_audio_segment(corpus / "wavs" / "u1.flac", offset=2.0, key="u1")


@pytest.mark.parametrize("offset, match", [(-1, "offset must be >= 0"),
                                           ("soon", "offset must be seconds")])
def test_bad_offset_values(corpus, offset, match):
    with pytest.raises(DataError, match=rf"u1.flac \(key 'u1'\): {match}"):
        read_audio_segment(corpus / "wavs" / "u1.flac", offset=offset, key="u1")


def test_sample_without_the_path_field(corpus):
    with pytest.raises(DataError, match=r"\(key 'u1'\): sample has no field 'audio_path'"):
        list(IterableWrapper([{"key": "u1", "path": "x"}]).load_audio())


def test_load_audio_skip_policy_counts_missing_and_unreadable(corpus):
    rows = [{"key": k, "audio_path": f"wavs/{k}.{e}"}
            for k, e in (("u1", "flac"), ("u9", "flac"), ("bad", "wav"))]
    pipe = IterableWrapper(rows).load_audio(root=corpus, on_error="skip")
    with pytest.warns(SkippedInputWarning, match="load_audio skipped 2 item"):
        assert [s["key"] for s in pipe] == ["u1"]
    assert dict(pipe.diagnostics.counts) == {"missing audio file": 1, "unreadable audio": 1}


@pytest.mark.parametrize("kwargs, error, match", [
    ({"field": ""}, TypeError, "field must be a non-empty str"),
    ({"offset_field": 3}, TypeError, "offset_field must be a non-empty str"),
    ({"root": 5}, TypeError, "root must be a path or None"),
    ({"whole_without_offset": True}, ValueError, "whole_without_offset needs an offset_field"),
    ({"on_error": "drop"}, ValueError, "on_error must be one of"),
])
def test_load_audio_validates_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        AudioLoaderIterDataPipe(IterableWrapper([]), **kwargs)


def test_load_audio_len_is_the_source_length_only_under_raise():
    assert len(IterableWrapper([{"key": "a"}] * 2).load_audio()) == 2
    with pytest.raises(TypeError, match="has no len"):
        len(IterableWrapper([]).load_audio(on_error="skip"))


def test_load_audio_constructor_reads_nothing(tmp_path):
    pipe = IterableWrapper([{"key": "x", "audio_path": str(tmp_path / "none.wav")}]).load_audio()
    assert not os.path.exists(tmp_path / "none.wav")
    with pytest.raises(MissingDataError):
        list(pipe)


# --- .npy without copies (the fast path) and its fallback -----------------------------------

def _npy(array) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


@pytest.mark.parametrize("array", [
    np.arange(12, dtype=np.float32).reshape(3, 4),
    np.asfortranarray(np.arange(12, dtype=np.float64).reshape(3, 4)),
    np.array(3.5),
    np.arange(6, dtype=">i4"),
    np.array([True, False]),
    np.zeros((0, 80), np.float32),
    np.zeros(3, dtype=[("a", "<i4"), ("b", "<f8")]),  # structured: numpy's own reader
], ids=["f32", "fortran", "0-d", "big-endian", "bool", "empty", "structured"])
def test_npy_decodes_exactly_without_copying(array):
    for payload in (_npy(array), bytearray(_npy(array))):
        got = decode_field("feats.npy", payload)
        assert got.dtype == array.dtype and got.shape == array.shape
        assert np.array_equal(got, array)
        # A view of the payload (read-only over bytes); numpy's reader copies (structured).
        fast = array.dtype.names is None
        assert got.flags.writeable == (isinstance(payload, bytearray) or not fast)


def test_npy_from_a_bytearray_is_a_view_not_a_copy():
    payload = bytearray(_npy(np.arange(4, dtype=np.int64)))
    got = decode_field("feats.npy", payload)
    got[0] = 99
    assert np.frombuffer(payload, np.int64, count=1, offset=len(payload) - 32)[0] == 99


def test_npy_cut_short_is_a_data_error():
    with pytest.raises(DataError, match="the data is cut short"):
        decode_field("feats.npy", _npy(np.zeros((10, 8), np.float32))[:-4])


def test_npy_object_header_is_never_unpickled():
    header = b"{'descr': '|O', 'fortran_order': False, 'shape': (1,), }"
    payload = b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + b"\x80"
    with pytest.raises(UnsafeInputError, match="never unpickles"):
        decode_field("x.npy", payload)


# --- memoryview payloads (large members of memory-mapped shards) ----------------------------

def _readonly_view(payload: bytes) -> memoryview:
    """A read-only memoryview inside a larger buffer, like a member of a mapped shard."""
    return memoryview(b"header" + payload + b"trailer")[6:6 + len(payload)]


@pytest.mark.parametrize("array", [
    np.arange(12, dtype=np.float32).reshape(3, 4),
    np.asfortranarray(np.arange(12, dtype=np.float64).reshape(3, 4)),
    np.arange(6, dtype=">i4"),
    np.zeros((0, 80), np.float32),
    np.zeros(3, dtype=[("a", "<i4"), ("b", "<f8")]),  # structured: numpy's own reader
], ids=["f32", "fortran", "big-endian", "empty", "structured"])
def test_npy_from_a_memoryview_is_a_read_only_view_of_it(array):
    view = _readonly_view(_npy(array))
    got = decode_field("feats.npy", view)
    assert got.dtype == array.dtype and got.shape == array.shape and np.array_equal(got, array)
    if array.dtype.names is None:  # the fast path: a read-only view, no copy
        assert not got.flags.writeable
        if array.size:
            assert np.shares_memory(got, np.frombuffer(view, np.uint8))


def test_every_decoder_takes_a_memoryview():
    audio = tone()
    sample = raw(**{"flac": _readonly_view(audio_bytes(audio)),
                    "wav": _readonly_view(audio_bytes(audio, fmt="WAV")),
                    "feats.npy": _readonly_view(_npy(np.ones((2, 3), np.float32))),
                    "txt": _readonly_view("héllo".encode()),
                    "json": _readonly_view(b'{"a": [1]}'),
                    "cls": _readonly_view(b"7")})
    out = decode_sample(sample, rename={"wav": "audio2"})
    assert np.array_equal(out["audio"], audio) and out["sample_rate"] == 16000
    assert np.array_equal(out["audio2"], audio)
    assert np.array_equal(out["feats"], np.ones((2, 3), np.float32))
    assert out["text"] == "héllo" and out["meta"] == {"a": [1]} and out["cls"] == 7


def test_memoryview_errors_name_the_member_like_bytes():
    for payload, match in [(b"\xff\xfe", "invalid UTF-8"), (b"nope", "not a .npy array")]:
        field = "txt" if match.startswith("invalid") else "feats.npy"
        with pytest.raises(DataError, match=rf"\[member spk1/utt7.{field}\].*{match}"):
            decode_sample(raw(**{field: _readonly_view(payload)}))


def test_unknown_memoryview_field_is_kept_as_bytes_so_decoded_samples_pickle():
    out = decode_sample(raw(**{"feats.npy": _readonly_view(_npy(np.ones(3, np.float32))),
                               "blob": _readonly_view(b"\x00\x01")}), unknown="keep")
    assert type(out["blob"]) is bytes and out["blob"] == b"\x00\x01"
    again = pickle.loads(pickle.dumps(out))
    assert again["blob"] == b"\x00\x01" and np.array_equal(again["feats"], np.ones(3))


def test_decode_after_read_shards_of_a_mapped_shard(tmp_path):
    path = str(tmp_path / "m.tar")
    feats = np.random.default_rng(0).standard_normal((400, 80), dtype=np.float32)  # 128 KB
    write_shard(path, [{"key": "u1", "feats.npy": feats, "txt": "hi", "blob": b"b" * 70000}])
    [rawsample] = IterableWrapper([path]).open().read_shards()
    assert isinstance(rawsample["feats.npy"], memoryview)
    [s] = IterableWrapper([path]).open().read_shards().decode(unknown="keep")
    assert np.array_equal(s["feats"], feats) and not s["feats"].flags.writeable
    assert s["text"] == "hi" and type(s["blob"]) is bytes and s["blob"] == b"b" * 70000


def _wav_bytes(n: int = 16000) -> bytes:
    buf = io.BytesIO()
    soundfile.write(buf, np.full(n, 0.1, np.float32), 16000, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def test_a_wav_shorter_than_its_header_says_is_named(tmp_path):
    # issue 23: a header of 16,000 samples with 4,000 present was read as (4000,), silently
    cut = _wav_bytes()[:44 + 4000 * 2]
    with pytest.raises(DataError, match="truncated WAV: its header promises 32000 bytes of "
                                        "audio but the file holds 8000") as exc:
        read_audio(cut, source="cut.wav", key="u1")
    assert (exc.value.source, exc.value.key) == ("cut.wav", "u1")
    path = tmp_path / "cut.wav"
    path.write_bytes(cut)
    with pytest.raises(DataError, match="truncated WAV"):
        read_audio(str(path))
    with pytest.raises(DataError, match="truncated WAV"):  # as a tar member too
        decode_field("wav", cut)


def test_a_wav_from_a_streaming_writer_promises_no_length():
    """A writer that could not seek back (a pipe) leaves the size as 0xFFFFFFFF: not short."""
    import struct

    data = bytearray(_wav_bytes())
    i = data.find(b"data")
    data[i + 4:i + 8] = struct.pack("<I", 0xFFFFFFFF)
    data[4:8] = struct.pack("<I", 0xFFFFFFFF)
    assert read_audio(bytes(data))[0].shape == (16000,)


def test_read_audio_keeps_soundfiles_start_and_stop_rules():
    data = _wav_bytes(1000)
    assert read_audio(data, start=-100)[0].shape == (100,)
    assert read_audio(data, start=10, stop=5)[0].shape == (0,)
    with pytest.raises(DataError, match="ends before the requested samples"):
        read_audio(data, start=900, stop=1200)


# --------------------------------------------------------------------------------------------
# decoding in threads inside one process (issue 20: the decode as the new limit)
# --------------------------------------------------------------------------------------------


def _flac_samples(n=12):
    rng = np.random.default_rng(3)
    return [{"key": f"u{i:02d}", "source": SRC, "txt": b"x",
             "flac": audio_bytes(tone(int(rng.integers(800, 4000))))} for i in range(n)]


def test_map_in_threads_of_decode_sample_is_decode_in_order():
    # The documented way to decode in threads inside a worker: the same samples, in order.
    expected = list(IterableWrapper(_flac_samples()).decode())
    got = list(IterableWrapper(_flac_samples()).map_in_threads(decode_sample, num_threads=3))
    assert [s["key"] for s in got] == [s["key"] for s in expected]
    for ours, theirs in zip(got, expected):
        np.testing.assert_array_equal(ours["audio"], theirs["audio"])
        assert ours["sample_rate"] == theirs["sample_rate"] == 16000


def test_a_bad_flac_decoded_in_a_thread_names_its_shard_and_key():
    samples = _flac_samples(4)
    samples[2]["flac"] = b"fLaC but not really audio"
    with pytest.raises(DataError, match=r"shards/a-00003\.tar.*u02.*cannot decode audio"):
        list(IterableWrapper(samples).map_in_threads(decode_sample, num_threads=2))


# Issue 34, item 7: NaN and infinite audio is a fault like a truncated file: found when read,
# named, and under on_error="skip" counted. Invariant: no non-finite sample leaves a reader.

def _float_wav(samples) -> bytes:
    buf = io.BytesIO()
    soundfile.write(buf, np.asarray(samples, np.float32), 16000, format="WAV", subtype="FLOAT")
    return buf.getvalue()


def _one_nan_in_1600() -> np.ndarray:
    audio = np.linspace(-0.5, 0.5, 1600, dtype=np.float32)
    audio[800] = np.nan
    return audio


def test_non_finite_audio_is_a_named_fault_in_decode(tmp_path):
    path = str(tmp_path / "a.tar")
    write_shard(path, [{"key": "good", "wav": _float_wav(np.zeros(1600))},
                       {"key": "one-nan", "wav": _float_wav(_one_nan_in_1600())},
                       {"key": "all-nan", "wav": _float_wav(np.full(1600, np.nan))},
                       {"key": "inf", "wav": _float_wav(np.array([0.1, np.inf, -np.inf]))}])
    shards = IterableWrapper([path]).open().read_shards()
    with pytest.raises(DataError) as info:
        list(shards.decode())
    assert str(info.value) == (f"{path} [member one-nan.wav] (key 'one-nan'): non-finite audio: "
                               "1 NaN and 0 infinite of 1600 samples (the first at sample 800)")
    pipe = shards.decode(on_error="skip")
    with pytest.warns(SkippedInputWarning):
        assert [s["key"] for s in pipe] == ["good"]
    assert pipe.diagnostics.counts["non-finite audio"] == 3
    assert "2 infinite of 3 samples" in " ".join(pipe.diagnostics.examples["non-finite audio"])


def test_non_finite_audio_is_refused_by_the_deferred_decode_too(tmp_path):
    from speechpipe.pipes.decode import decode_sample
    sample = decode_sample({"key": "u1", "source": "a.tar", "wav": _float_wav(_one_nan_in_1600())},
                           defer_audio=True)
    with pytest.raises(DataError, match=r"a.tar \[member u1.wav\] \(key 'u1'\): non-finite "
                                        r"audio: 1 NaN"):
        sample["audio"].read_into(np.empty(sample["audio"].shape, np.float32))
