"""Kaldi tables to samples: parse_scp, load_scp (feats, wav, text), load_segments.

Every file is made here: arks with kaldiio (float32, float64, compressed), audio with
soundfile, tables as text. Invariant for bad input: the error is a DataError (or
MissingDataError) whose message names the table file, the line and the key.
"""

from __future__ import annotations

import copy
import io
import os
import pickle
import struct

import kaldiio
import numpy as np
import pytest
import soundfile
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from speechpipe.diagnostics import SkippedInputWarning
from speechpipe.errors import DataError, MissingDataError, UnsafeInputError
from speechpipe.pipes._core import IterableWrapper
from speechpipe.pipes.kaldi import (
    ScpLoader,
    SegmentLoader,
    load_scp_entries,
    slice_segments,
)
from speechpipe.pipes.kaldi import parse_scp_lines, read_scp_table, ScpEntry, ScpParser

RNG = np.random.default_rng(1234)


def write(path, text: str | bytes):
    mode = "wb" if isinstance(text, bytes) else "w"
    with open(path, mode, **({} if mode == "wb" else {"encoding": "utf-8"})) as f:
        f.write(text)
    return str(path)


def parse(data: bytes, source="wav.scp", **kwargs):
    return list(parse_scp_lines(io.BytesIO(data), source=source, **kwargs))


def scp_pipe(path, mode="b", **kwargs):
    return IterableWrapper([str(path)]).open_files(mode=mode).parse_scp(**kwargs)


def feats_ark(tmp_path, matrices, **save_kwargs):
    """Write an ark and its scp with kaldiio.save_ark; return the scp path."""
    ark, scp = tmp_path / "raw.ark", tmp_path / "feats.scp"
    kaldiio.save_ark(str(ark), matrices, scp=str(scp), **save_kwargs)
    return scp


def load_feats(scp, **kwargs):
    return {s["key"]: s["feats"] for s in scp_pipe(scp).load_scp("feats", **kwargs)}


def assert_located(exc_info, source, line, key=None):
    message = str(exc_info.value)
    assert f"{source}:{line}" in message, message
    if key is not None:
        assert repr(key) in message, message


# --------------------------------------------------------------------------- ScpEntry


def test_scp_entry_unpacks_and_compares_like_a_plain_tuple():
    entry = ScpEntry("u1", "a.wav", source="wav.scp", line=4)
    key, value = entry
    assert (key, value) == ("u1", "a.wav")
    assert entry == ("u1", "a.wav") and hash(entry) == hash(("u1", "a.wav"))
    assert (entry.source, entry.line, entry.key, entry.value) == ("wav.scp", 4, "u1", "a.wav")


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_scp_entry_pickle_round_trip_keeps_its_location(protocol):
    entry = ScpEntry("u1", "a.ark:12", source="/d/feats.scp", line=7)
    back = pickle.loads(pickle.dumps(entry, protocol=protocol))
    assert type(back) is ScpEntry and back == entry
    assert (back.source, back.line) == ("/d/feats.scp", 7)


def test_scp_entry_deepcopy_keeps_its_location():
    back = copy.deepcopy(ScpEntry("u1", "v", source="s", line=2))
    assert (tuple(back), back.source, back.line) == (("u1", "v"), "s", 2)


# --------------------------------------------------------------------------- parse_scp_lines


def test_parse_binary_lines_gives_key_rest_of_line_and_position():
    entries = parse(b"u1 /a/1.wav\nu2   sox  b.wav -t wav - |  \n")
    assert entries == [("u1", "/a/1.wav"), ("u2", "sox  b.wav -t wav - |")]
    assert [(e.source, e.line) for e in entries] == [("wav.scp", 1), ("wav.scp", 2)]


def test_parse_text_and_binary_lines_agree():
    data = "u1 HÉLLO wörld\r\nu2 x\tY\n"
    from_text = list(parse_scp_lines(io.StringIO(data, newline=""), source="text"))
    from_bytes = parse(data.encode(), source="text")
    assert from_text == from_bytes == [("u1", "HÉLLO wörld"), ("u2", "x\tY")]


def test_blank_lines_are_skipped_and_still_counted_in_line_numbers():
    entries = parse(b"u1 a\n\n   \nu2 b\n\n\n")
    assert [(tuple(e), e.line) for e in entries] == [(("u1", "a"), 1), (("u2", "b"), 4)]


def test_only_ascii_whitespace_separates_key_and_value():
    # U+00A0 and U+3000 may occur in keys or transcripts; Kaldi splits on ASCII space only.
    entries = parse("k\u00a0x v\nk2 a\u3000b\u3000\n".encode())
    assert entries == [("k\u00a0x", "v"), ("k2", "a\u3000b\u3000")]


def test_key_without_value_is_malformed_in_an_scp(tmp_path):
    with pytest.raises(DataError, match="expected '<key> <value>'") as info:
        parse(b"u1 a.wav\nu2\n", source="data/wav.scp")
    assert_located(info, "data/wav.scp", 2)


def test_allow_empty_accepts_an_empty_transcript():
    assert parse(b"u1 HELLO\nu2\n", source="text", allow_empty=True) == [
        ("u1", "HELLO"), ("u2", "")]


def test_duplicate_key_names_file_line_key_and_first_line():
    with pytest.raises(DataError, match=r"duplicate key \(first on line 1\)") as info:
        parse(b"u1 a\nu2 b\nu1 c\n", source="feats.scp")
    assert_located(info, "feats.scp", 3, "u1")


def test_unsorted_key_is_an_error_only_with_check_sorted():
    data = b"a x\nc y\nb z\n"
    assert [k for k, _ in parse(data)] == ["a", "c", "b"]
    with pytest.raises(DataError, match="out of order after 'c'") as info:
        parse(data, source="text", check_sorted=True)
    assert_located(info, "text", 3, "b")


def test_check_sorted_uses_c_locale_byte_order():
    # LC_ALL=C: upper case before lower case, ASCII before any non-ASCII character.
    assert len(parse("A x\nB x\na x\nb x\né x\n".encode(), check_sorted=True)) == 5
    with pytest.raises(DataError, match="out of order"):
        parse(b"a x\nB x\n", check_sorted=True)


def test_nul_byte_is_malformed():
    with pytest.raises(DataError, match="NUL byte") as info:
        parse(b"u1 a\nu\x002 b\n", source="wav.scp")
    assert_located(info, "wav.scp", 2)


def test_control_character_in_key_is_malformed():
    with pytest.raises(DataError, match="control character U\\+001B") as info:
        parse(b"u1 a\nu1\x1b[0m b\n", source="utt2spk")
    assert_located(info, "utt2spk", 2)


def test_byte_order_mark_is_malformed():
    with pytest.raises(DataError, match="byte-order mark") as info:
        parse("\ufeffu1 a\n".encode(), source="text")
    assert_located(info, "text", 1)


def test_invalid_utf8_in_binary_stream_names_file_and_line():
    with pytest.raises(DataError, match="not valid UTF-8") as info:
        parse(b"u1 a\nu2 \xff\xfe\n", source="text")
    assert_located(info, "text", 2)


def test_undecodable_text_stream_names_file_and_line():
    # A UTF-8 text stream is read through its buffer (bad line named exactly, see
    # test_sources); a stream in another encoding decodes itself.
    stream = io.TextIOWrapper(io.BytesIO(b"u1 a\n" + b"u2 \xff\n"), encoding="ascii")
    with pytest.raises(DataError, match="not valid ascii text at or after this line") as info:
        list(parse_scp_lines(stream, source="text"))
    # A text stream decodes whole blocks: the line is where decoding failed, not the bad one.
    assert_located(info, "text", 1)
    assert "open_files(mode='b')" in str(info.value)


def test_a_whole_string_is_refused_as_lines():
    with pytest.raises(TypeError, match="splitlines"):
        list(parse_scp_lines("u1 a\n", source="x"))


def test_skip_policy_counts_each_bad_line_by_reason():
    from speechpipe.diagnostics import Diagnostics

    diagnostics = Diagnostics("parse_scp")
    data = b"a 1\nb\nc \xff\nd 2\na 3\nc 4\nb 5\n"
    entries = list(parse_scp_lines(io.BytesIO(data), source="s", check_sorted=True,
                                   on_error="skip", diagnostics=diagnostics))
    assert entries == [("a", "1"), ("d", "2")]
    assert diagnostics.counts == {"malformed line": 1, "undecodable line": 1,
                                  "duplicate key": 1, "unsorted key": 2}


# --------------------------------------------------------------------------- parse_scp pipe


@pytest.mark.parametrize("mode", ["b", "r"])
def test_parse_scp_reads_open_files_streams_in_binary_and_text_mode(tmp_path, mode):
    path = write(tmp_path / "text", "u1 HELLO WORLD\nu2 GOOD BYE\n")
    entries = list(scp_pipe(path, mode=mode))
    assert entries == [("u1", "HELLO WORLD"), ("u2", "GOOD BYE")]
    assert [(e.source, e.line) for e in entries] == [(path, 1), (path, 2)]


def test_parse_scp_reads_several_files_and_keys_repeat_across_files(tmp_path):
    a = write(tmp_path / "a.scp", "u1 x\n")
    b = write(tmp_path / "b.scp", "u1 y\n")
    entries = list(IterableWrapper([a, b]).open_files(mode="b").parse_scp())
    assert [(tuple(e), e.source) for e in entries] == [(("u1", "x"), a), (("u1", "y"), b)]


def test_parse_scp_closes_each_stream():
    streams = [io.BytesIO(b"u1 a\n"), io.BytesIO(b"u2 b\n")]
    assert list(ScpParser([("a", streams[0]), ("b", streams[1])])) == [
        ("u1", "a"), ("u2", "b")]
    assert all(s.closed for s in streams)


def test_parse_scp_gives_the_same_entries_on_a_second_pass(tmp_path):
    pipe = scp_pipe(write(tmp_path / "s", "u1 a\nu2 b\n"))
    assert list(pipe) == list(pipe) == [("u1", "a"), ("u2", "b")]


def test_parse_scp_skip_policy_counts_and_warns(tmp_path):
    path = write(tmp_path / "wav.scp", "u1 a\nu2\nu1 b\nu3 c\n")
    pipe = scp_pipe(path, on_error="skip")
    with pytest.warns(SkippedInputWarning, match="parse_scp skipped 2"):
        entries = list(pipe)
    assert entries == [("u1", "a"), ("u3", "c")]
    assert pipe.diagnostics.total == 2
    assert pipe.diagnostics.counts == {"malformed line": 1, "duplicate key": 1}


def test_parse_scp_raise_policy_names_the_file_and_line(tmp_path):
    path = write(tmp_path / "wav.scp", "u1 a\nu2\n")
    with pytest.raises(DataError) as info:
        list(scp_pipe(path))
    assert_located(info, path, 2)


def test_parse_scp_refuses_elements_that_are_not_path_stream_pairs():
    with pytest.raises(TypeError, match="open_files"):
        list(ScpParser(IterableWrapper(["wav.scp"])))


def test_parse_scp_validates_arguments_and_has_no_length():
    with pytest.raises(ValueError, match="on_error"):
        ScpParser(IterableWrapper([]), on_error="ignore")
    with pytest.raises(TypeError, match="check_sorted"):
        ScpParser(IterableWrapper([]), check_sorted="yes")
    with pytest.raises(TypeError, match="no length"):
        len(ScpParser(IterableWrapper([])))


def test_read_scp_table_maps_keys_to_located_entries(tmp_path):
    path = write(tmp_path / "wav.scp", "r1 a.wav\nr2 b.wav\n")
    table = read_scp_table(path)
    assert table == {"r1": ("r1", "a.wav"), "r2": ("r2", "b.wav")}
    assert table["r2"].line == 2
    with pytest.raises(MissingDataError, match="table file not found"):
        read_scp_table(tmp_path / "nope.scp")


# --------------------------------------------------------------------------- load_scp feats


def test_feats_float32_written_with_write_helper_come_back_exactly(tmp_path):
    mats = {f"u{i}": RNG.standard_normal((10 + i, 4)).astype(np.float32) for i in range(3)}
    spec = f"ark,scp:{tmp_path}/raw.ark,{tmp_path}/feats.scp"
    with kaldiio.WriteHelper(spec) as writer:
        for key, mat in mats.items():
            writer(key, mat)
    got = load_feats(tmp_path / "feats.scp")
    assert list(got) == list(mats)
    for key in mats:
        assert got[key].dtype == np.float32 and np.array_equal(got[key], mats[key])


def test_feats_float64_are_converted_to_float32(tmp_path):
    mat = RNG.standard_normal((6, 3))
    got = load_feats(feats_ark(tmp_path, {"u1": mat}))["u1"]
    assert got.dtype == np.float32 and np.array_equal(got, mat.astype(np.float32))


@pytest.mark.parametrize("method", [1, 2, 3, 5])
def test_compressed_feats_match_the_original_within_quantization(tmp_path, method):
    mat = RNG.standard_normal((30, 8)).astype(np.float32)
    got = load_feats(feats_ark(tmp_path, {"u1": mat}, compression_method=method))["u1"]
    # 1 byte per value (method 5) resolves range/255; 2 bytes and CM (method 1,2: per-column
    # quantiles) a finer step.
    step = float(mat.max() - mat.min()) / (255 if method == 5 else 64)
    assert got.dtype == np.float32 and got.shape == mat.shape
    assert np.abs(got - mat).max() <= step
    assert not np.array_equal(got, mat)  # really went through compression


def test_feats_from_a_text_ark(tmp_path):
    mat = np.arange(12, dtype=np.float32).reshape(3, 4) / 4
    assert np.array_equal(load_feats(feats_ark(tmp_path, {"u1": mat}, text=True))["u1"], mat)


def test_feats_row_and_column_ranges_are_kaldi_inclusive(tmp_path):
    mat = np.arange(40, dtype=np.float32).reshape(10, 4)
    ark = tmp_path / "raw.ark"
    kaldiio.save_ark(str(ark), {"u1": mat})
    write(tmp_path / "feats.scp",
          f"a {ark}:3[2:4]\nb {ark}:3[0:9,1:2]\nc {ark}:3[,3:3]\n")
    got = load_feats(tmp_path / "feats.scp")
    assert np.array_equal(got["a"], mat[2:5])
    assert np.array_equal(got["b"], mat[:, 1:3])
    assert np.array_equal(got["c"], mat[:, 3:4])


def test_feats_range_outside_the_matrix_is_an_error(tmp_path):
    ark = tmp_path / "raw.ark"
    kaldiio.save_ark(str(ark), {"u1": np.zeros((5, 2), np.float32)})
    scp = write(tmp_path / "feats.scp", f"u1 {ark}:3[3:5]\n")
    with pytest.raises(DataError, match="row range 3:5 is outside the matrix's 5 rows") as info:
        load_feats(scp)
    assert_located(info, scp, 1, "u1")


def test_feats_bad_range_syntax_is_an_error(tmp_path):
    ark = tmp_path / "raw.ark"
    kaldiio.save_ark(str(ark), {"u1": np.zeros((5, 2), np.float32)})
    scp = write(tmp_path / "feats.scp", f"u1 {ark}:3[a:b]\n")
    with pytest.raises(DataError, match="bad range") as info:
        load_feats(scp)
    assert_located(info, scp, 1, "u1")


def test_relative_ark_paths_join_root(tmp_path):
    kaldiio.save_ark(str(tmp_path / "raw.ark"), {"u1": np.ones((2, 2), np.float32)})
    scp = write(tmp_path / "feats.scp", "u1 raw.ark:3\n")
    assert load_feats(scp, root=tmp_path)["u1"].shape == (2, 2)


def test_relative_ark_paths_default_to_the_working_directory(tmp_path, monkeypatch):
    kaldiio.save_ark(str(tmp_path / "raw.ark"), {"u1": np.ones((2, 2), np.float32)})
    scp = write(tmp_path / "feats.scp", "u1 raw.ark:3\n")
    monkeypatch.chdir(tmp_path)
    assert load_feats(scp)["u1"].shape == (2, 2)


def test_missing_ark_is_missing_data_naming_scp_line_key_and_ark(tmp_path):
    scp = write(tmp_path / "feats.scp", f"u1 {tmp_path}/gone.ark:3\n")
    with pytest.raises(MissingDataError, match="ark file not found: .*gone.ark") as info:
        load_feats(scp)
    assert_located(info, scp, 1, "u1")


def test_truncated_ark_is_a_data_error_naming_scp_line_key_and_ark(tmp_path):
    scp = feats_ark(tmp_path, {"u1": np.ones((2, 2), np.float32),
                               "u2": RNG.standard_normal((50, 20)).astype(np.float32)})
    ark = tmp_path / "raw.ark"
    data = ark.read_bytes()
    ark.write_bytes(data[: len(data) - 100])  # cut into u2's matrix
    pipe = scp_pipe(scp).load_scp("feats")
    it = iter(pipe)
    assert next(it)["key"] == "u1"
    with pytest.raises(DataError, match="truncated") as info:
        next(it)
    assert_located(info, scp, 2, "u2")
    assert str(ark) in str(info.value)


def test_ark_cut_inside_the_header_is_a_data_error(tmp_path):
    scp = feats_ark(tmp_path, {"u1": np.ones((2, 2), np.float32)})
    ark = tmp_path / "raw.ark"
    ark.write_bytes(ark.read_bytes()[:9])
    with pytest.raises(DataError, match="truncated object header") as info:
        load_feats(scp)
    assert_located(info, scp, 1, "u1")


def test_offset_past_the_end_of_the_ark_is_a_data_error(tmp_path):
    ark = tmp_path / "raw.ark"
    kaldiio.save_ark(str(ark), {"u1": np.ones((2, 2), np.float32)})
    scp = write(tmp_path / "feats.scp", f"u1 {ark}:99999\n")
    with pytest.raises(DataError, match="offset 99999 is past the end") as info:
        load_feats(scp)
    assert_located(info, scp, 1, "u1")


def test_offset_not_at_a_matrix_is_a_data_error(tmp_path):
    ark = tmp_path / "raw.ark"
    kaldiio.save_ark(str(ark), {"u1": np.ones((2, 2), np.float32)})
    scp = write(tmp_path / "feats.scp", f"u1 {ark}:0\n")  # points at the key, not the matrix
    with pytest.raises(DataError, match="cannot read a matrix") as info:
        load_feats(scp)
    assert_located(info, scp, 1, "u1")
    assert f"{ark}:0" in str(info.value)


def test_pickled_object_in_an_ark_is_refused_unread(tmp_path, monkeypatch):
    scp = feats_ark(tmp_path, {"u1": np.ones((2, 2))}, write_function="pickle")
    monkeypatch.setattr(pickle, "load", lambda *a, **k: pytest.fail("unpickled"))
    with pytest.raises(UnsafeInputError, match="never unpickles") as info:
        load_feats(scp)
    assert_located(info, scp, 1, "u1")


def test_object_npy_in_an_ark_is_unsafe_input_read_by_offset_or_whole(tmp_path, monkeypatch):
    # Issue 23: kaldiio stores an object array with np.save's pickle; np.load refuses it, which
    # said DataError where the README promises UnsafeInputError. Both ark readers say the same.
    from speechpipe.pipes.kaldi import iter_ark

    values = np.empty(2, dtype=object)
    values[:] = [{"a": 1}, [2]]
    scp = feats_ark(tmp_path, {"u0": np.ones((2, 2), np.float32), "u1": values},
                    write_function="numpy")
    monkeypatch.setattr(pickle, "load", lambda *a, **k: pytest.fail("unpickled"))
    with pytest.raises(UnsafeInputError, match=r"\.npy array of Python objects") as info:
        load_feats(scp)
    assert_located(info, scp, 2, "u1")
    ark = str(tmp_path / "raw.ark")
    with pytest.raises(UnsafeInputError, match="never unpickles") as info:
        with open(ark, "rb") as f:
            list(iter_ark(f, source=ark))
    assert ark in str(info.value) and "(key 'u1')" in str(info.value)


def test_audio_in_an_ark_is_not_a_feature_matrix(tmp_path):
    scp = feats_ark(tmp_path, {"u1": (8000, np.zeros(100, np.int16))})
    with pytest.raises(DataError, match="holds audio.*kind='wav'") as info:
        load_feats(scp)
    assert_located(info, scp, 1, "u1")


def test_vector_in_an_ark_is_not_a_feature_matrix(tmp_path):
    scp = feats_ark(tmp_path, {"u1": np.ones(5, np.float32)})
    with pytest.raises(DataError, match=r"expected a matrix \(frames, dim\), got \(5,\)"):
        load_feats(scp)


def test_numpy_objects_from_kaldiio_are_read(tmp_path):
    mat = RNG.standard_normal((4, 3)).astype(np.float32)
    scp = feats_ark(tmp_path, {"u1": mat}, write_function="numpy")
    assert np.array_equal(load_feats(scp)["u1"], mat)


def test_feats_command_is_refused_without_opt_in_and_read_with_it(tmp_path):
    mat = RNG.standard_normal((4, 3)).astype(np.float32)
    kaldiio.save_mat(str(tmp_path / "m.mat"), mat)
    scp = write(tmp_path / "feats.scp", f"u1 cat {tmp_path}/m.mat |\n")
    with pytest.raises(UnsafeInputError, match="allow_commands=True") as info:
        load_feats(scp)
    assert_located(info, scp, 1, "u1")
    assert np.array_equal(load_feats(scp, allow_commands=True)["u1"], mat)


def test_load_scp_skip_policy_counts_and_warns(tmp_path):
    ark = tmp_path / "raw.ark"
    kaldiio.save_ark(str(ark), {"u1": np.ones((2, 2), np.float32)}, scp=str(tmp_path / "a"))
    good = (tmp_path / "a").read_text().split()[1]
    scp = write(tmp_path / "feats.scp",
                f"u1 {good}\nu2 {tmp_path}/gone.ark:3\nu3 {ark}:0\nu4 cat x |\n")
    pipe = scp_pipe(scp).load_scp("feats", on_error="skip")
    with pytest.warns(SkippedInputWarning, match="load_scp skipped 3"):
        assert [s["key"] for s in pipe] == ["u1"]
    assert pipe.diagnostics.total == 3
    assert pipe.diagnostics.counts == {"missing feats data": 1, "bad feats data": 1,
                                       "unsafe value (command not allowed)": 1}


def test_load_scp_accepts_plain_pairs_and_names_the_key(tmp_path):
    with pytest.raises(MissingDataError, match=r"\(key 'u9'\)"):
        list(load_scp_entries([("u9", f"{tmp_path}/x.ark:1")], "feats"))


def test_load_scp_length_is_the_source_length_only_when_raising():
    entries = IterableWrapper([("u1", "a"), ("u2", "b")])
    assert len(ScpLoader(entries, "text")) == 2
    with pytest.raises(TypeError, match="no length"):
        len(ScpLoader(entries, "text", on_error="skip"))


def test_load_scp_validates_its_arguments():
    with pytest.raises(ValueError, match="kind must be one of"):
        ScpLoader(IterableWrapper([]), "mfcc")
    with pytest.raises(TypeError, match="allow_commands"):
        ScpLoader(IterableWrapper([]), "wav", allow_commands=1)
    with pytest.raises(TypeError, match="root"):
        ScpLoader(IterableWrapper([]), "wav", root=3)


def test_load_scp_refuses_elements_that_are_not_pairs():
    with pytest.raises(TypeError, match="key, value"):
        list(ScpLoader(IterableWrapper([{"key": "u1"}]), "text"))


# --------------------------------------------------------------------------- load_scp wav


def make_wav(path, samples, rate=16000, subtype="FLOAT"):
    soundfile.write(str(path), samples, rate, subtype=subtype)
    return str(path)


def load_wavs(scp, **kwargs):
    return {s["key"]: (s["audio"], s["sample_rate"]) for s in scp_pipe(scp).load_scp("wav",
                                                                                   **kwargs)}


def test_wav_scp_reads_wav_and_flac_files(tmp_path):
    wav_audio = RNG.uniform(-0.5, 0.5, 1600).astype(np.float32)
    flac_audio = (np.arange(800, dtype=np.float32) - 400) / 1024  # exact in 16 bits
    make_wav(tmp_path / "a.wav", wav_audio)
    make_wav(tmp_path / "b.flac", flac_audio, rate=8000, subtype="PCM_16")
    scp = write(tmp_path / "wav.scp", "a a.wav\nb b.flac\n")
    got = load_wavs(scp, root=tmp_path)
    assert got["a"][1] == 16000 and np.array_equal(got["a"][0], wav_audio)
    assert got["b"][1] == 8000 and np.array_equal(got["b"][0], flac_audio)
    assert got["b"][0].dtype == np.float32


def test_wav_command_is_refused_without_opt_in(tmp_path):
    make_wav(tmp_path / "x.wav", np.zeros(10, np.float32))
    scp = write(tmp_path / "wav.scp", f"u0 {tmp_path}/x.wav\nu1 cat {tmp_path}/x.wav |\n")
    with pytest.raises(UnsafeInputError, match="pass allow_commands=True") as info:
        load_wavs(scp)
    assert_located(info, scp, 2, "u1")


def test_wav_command_is_run_with_opt_in(tmp_path):
    audio = RNG.uniform(-0.5, 0.5, 1000).astype(np.float32)
    make_wav(tmp_path / "x.wav", audio)
    scp = write(tmp_path / "wav.scp", f"u1 cat {tmp_path}/x.wav |\n")
    got, rate = load_wavs(scp, allow_commands=True)["u1"]
    assert rate == 16000 and np.array_equal(got, audio)


def test_failing_wav_command_shows_status_and_stderr(tmp_path):
    scp = write(tmp_path / "wav.scp", "u1 echo 'sox FAIL: no such file' >&2; exit 3 |\n")
    with pytest.raises(DataError, match="exit status 3; stderr: sox FAIL: no such file") as info:
        load_wavs(scp, allow_commands=True)
    assert_located(info, scp, 1, "u1")


def test_wav_command_with_garbage_output_is_a_data_error(tmp_path):
    scp = write(tmp_path / "wav.scp", "u1 echo not audio |\n")
    with pytest.raises(DataError, match="output of 'echo not audio \\|'.*cannot decode") as info:
        load_wavs(scp, allow_commands=True)
    assert_located(info, scp, 1, "u1")


def test_wav_stored_in_an_ark_is_read_riff_and_soundfile_written(tmp_path):
    pcm = (RNG.standard_normal(500) * 3000).astype(np.int16)
    kaldiio.save_ark(str(tmp_path / "w.ark"), {"r1": (8000, pcm), "r2": (8000, pcm[:50])},
                     scp=str(tmp_path / "wav.scp"))
    flt = RNG.uniform(-0.5, 0.5, 300).astype(np.float32)
    kaldiio.save_ark(str(tmp_path / "s.ark"), {"r3": (flt, 16000)}, scp=str(tmp_path / "s.scp"),
                     write_function="soundfile", write_kwargs={"subtype": "FLOAT"})
    got = load_wavs(tmp_path / "wav.scp")
    assert np.array_equal(got["r1"][0], pcm / np.float32(32768)) and got["r1"][1] == 8000
    assert np.array_equal(got["r2"][0], pcm[:50] / np.float32(32768))
    got3, rate3 = load_wavs(tmp_path / "s.scp")["r3"]
    assert rate3 == 16000 and np.array_equal(got3, flt)


def test_wav_ark_offset_at_no_audio_is_a_data_error(tmp_path):
    kaldiio.save_ark(str(tmp_path / "f.ark"), {"u1": np.ones((2, 2), np.float32)})
    scp = write(tmp_path / "wav.scp", f"u1 {tmp_path}/f.ark:3\n")
    with pytest.raises(DataError, match="does not hold audio") as info:
        load_wavs(scp)
    assert_located(info, scp, 1, "u1")


def test_missing_wav_is_missing_data_naming_scp_line_key_and_path(tmp_path):
    scp = write(tmp_path / "wav.scp", f"u1 {tmp_path}/gone.wav\n")
    with pytest.raises(MissingDataError, match="gone.wav: audio file not found") as info:
        load_wavs(scp)
    assert_located(info, scp, 1, "u1")


def test_corrupt_wav_is_a_data_error_naming_scp_line_and_key(tmp_path):
    write(tmp_path / "bad.wav", b"RIFF\x00\x00not a wav at all")
    scp = write(tmp_path / "wav.scp", f"u1 {tmp_path}/bad.wav\n")
    with pytest.raises(DataError, match="bad.wav: cannot decode audio") as info:
        load_wavs(scp)
    assert_located(info, scp, 1, "u1")


def test_output_pipe_value_is_malformed(tmp_path):
    scp = write(tmp_path / "wav.scp", "u1 | gzip > x.gz\n")
    with pytest.raises(DataError, match="output pipe") as info:
        load_wavs(scp, allow_commands=True)
    assert_located(info, scp, 1, "u1")


# --------------------------------------------------------------------------- load_scp text


def test_text_kind_keeps_the_transcript_including_empty_ones(tmp_path):
    path = write(tmp_path / "text", "u1 HELLO  WORLD\nu2\n")
    samples = list(scp_pipe(path, allow_empty=True).load_scp("text"))
    # each sample's source is its table line (issue 23: join_by_key's errors name it)
    assert samples == [{"key": "u1", "text": "HELLO  WORLD", "source": f"{path}:1"},
                       {"key": "u2", "text": "", "source": f"{path}:2"}]


def test_segments_and_feats_samples_carry_their_table_line(tmp_path):
    matrices = {"u1": np.ones((2, 3), np.float32), "u2": np.zeros((4, 3), np.float32)}
    scp = feats_ark(tmp_path, matrices)
    feats = scp_pipe(scp).load_scp("feats")
    assert [s["source"] for s in feats] == [f"{scp}:1", f"{scp}:2"]
    wav = tmp_path / "r.wav"
    soundfile.write(wav, np.zeros(100, np.float32), 10)
    write(tmp_path / "wav.scp", f"r {wav}\n")
    segments = write(tmp_path / "segments", "s1 r 0 1\n\ns2 r 1 2\n")
    samples = scp_pipe(segments).load_segments(str(tmp_path / "wav.scp"))
    assert [s["source"] for s in samples] == [f"{segments}:1", f"{segments}:3"]


# --------------------------------------------------------------------------- segments


@pytest.fixture
def recording(tmp_path):
    """rec1: 100 samples at 10 Hz, sample i holds i / 128 (exact in float32)."""
    audio = np.arange(100, dtype=np.float32) / 128
    make_wav(tmp_path / "rec1.wav", audio, rate=10)
    write(tmp_path / "wav.scp", f"rec1 {tmp_path}/rec1.wav\n")
    return audio


def load_segs(tmp_path, segments: str, **kwargs):
    path = write(tmp_path / "segments", segments)
    pipe = scp_pipe(path).load_segments(str(tmp_path / "wav.scp"), **kwargs)
    return path, list(pipe)


def test_segments_slice_exact_samples(tmp_path, recording):
    _, samples = load_segs(tmp_path, "a rec1 0 1.5\nb rec1 2.04 2.96\nc rec1 9.5 10\n")
    assert [(s["key"], s["recording"], s["sample_rate"]) for s in samples] == [
        ("a", "rec1", 10), ("b", "rec1", 10), ("c", "rec1", 10)]
    assert np.array_equal(samples[0]["audio"], recording[0:15])
    assert np.array_equal(samples[1]["audio"], recording[20:30])  # round(20.4), round(29.6)
    assert np.array_equal(samples[2]["audio"], recording[95:100])


def test_segment_end_minus_one_runs_to_the_end(tmp_path, recording):
    _, samples = load_segs(tmp_path, "a rec1 7.3 -1\n")
    assert np.array_equal(samples[0]["audio"], recording[73:])


def test_segments_read_only_the_slice_and_measure_each_recording_once(tmp_path, recording,
                                                                    monkeypatch):
    calls = []
    info = soundfile.info
    monkeypatch.setattr(soundfile, "info", lambda path: calls.append(path) or info(path))
    _, samples = load_segs(tmp_path, "a rec1 0 1\nb rec1 1 2\nc rec1 2 3\n")
    assert len(samples) == 3 and calls == [f"{tmp_path}/rec1.wav"]


def test_segment_channel_field_picks_one_channel(tmp_path):
    stereo = np.stack([np.arange(40), -np.arange(40)], axis=1).astype(np.float32) / 64
    make_wav(tmp_path / "st.wav", stereo, rate=10)
    write(tmp_path / "wav.scp", f"st {tmp_path}/st.wav\n")
    _, samples = load_segs(tmp_path, "a st 1 2 1\nb st 1 2\n")
    assert np.array_equal(samples[0]["audio"], stereo[10:20, 1])
    assert samples[1]["audio"].shape == (10, 2)


def test_segments_from_a_command_run_it_once_per_recording(tmp_path, recording):
    count = tmp_path / "count"
    write(tmp_path / "wav.scp", f"rec1 echo x >> {count}; cat {tmp_path}/rec1.wav |\n")
    _, samples = load_segs(tmp_path, "a rec1 0 1\nb rec1 1 2\n", allow_commands=True)
    assert np.array_equal(samples[1]["audio"], recording[10:20])
    assert count.read_text() == "x\n"


def test_segments_refuse_a_command_recording_without_opt_in(tmp_path, recording):
    write(tmp_path / "wav.scp", f"rec1 cat {tmp_path}/rec1.wav |\n")
    with pytest.raises(UnsafeInputError, match="allow_commands=True") as info:
        load_segs(tmp_path, "a rec1 0 1\n")
    assert_located(info, tmp_path / "segments", 1, "a")


def test_segments_from_a_wav_stored_in_an_ark(tmp_path):
    pcm = np.arange(-50, 50, dtype=np.int16) * 300
    kaldiio.save_ark(str(tmp_path / "w.ark"), {"rec1": (10, pcm)}, scp=str(tmp_path / "wav.scp"))
    _, samples = load_segs(tmp_path, "a rec1 2 3\n")
    assert np.array_equal(samples[0]["audio"], pcm[20:30] / np.float32(32768))


def test_wav_scp_is_read_when_iterating_not_when_building(tmp_path):
    segments = write(tmp_path / "segments", "a rec1 0 1\n")
    pipe = scp_pipe(segments).load_segments(str(tmp_path / "wav.scp"))
    make_wav(tmp_path / "rec1.wav", np.zeros(20, np.float32), rate=10)
    write(tmp_path / "wav.scp", f"rec1 {tmp_path}/rec1.wav\n")
    assert [s["audio"].shape for s in pipe] == [(10,)]


def test_missing_wav_scp_is_missing_data(tmp_path):
    segments = write(tmp_path / "segments", "a rec1 0 1\n")
    with pytest.raises(MissingDataError, match="table file not found"):
        list(scp_pipe(segments).load_segments(str(tmp_path / "nope.scp")))


def test_missing_recording_audio_names_the_segment_and_the_wav_scp_line(tmp_path):
    write(tmp_path / "wav.scp", f"rec1 {tmp_path}/gone.wav\n")
    with pytest.raises(MissingDataError, match="gone.wav") as info:
        load_segs(tmp_path, "a rec1 0 1\n")
    assert_located(info, tmp_path / "segments", 1, "a")
    assert f"{tmp_path}/wav.scp:1" in str(info.value)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("u rec1 0", "expected '<utterance-id> <recording-id> <start-sec> <end-sec>"),
        ("u rec1 0 1 0 extra", "got 6 fields"),
        ("u rec1 zero 1", "start time 'zero' is not a number"),
        ("u rec1 0 1s", "end time '1s' is not a number"),
        ("u rec1 nan 1", "start time 'nan' is not a number"),
        ("u rec1 -0.5 1", "start time -0.5 is negative"),
        ("u rec1 2 1", "end time 1.0 is not after start time 2.0"),
        ("u rec1 2 2", "end time 2.0 is not after start time 2.0"),
        ("u rec1 0 -2", "end time -2.0 is not after start time 0.0"),
        ("u rec1 0 1 x", "channel 'x' is not a channel number"),
        ("u rec1 0 1 1", "channel 1 does not exist: recording 'rec1' has 1 channel"),
        ("u rec9 0 1", "unknown recording 'rec9': not in"),
        ("u rec1 9 10.6", "past the end of recording 'rec1' \\(100 samples, 10.000 s\\)"),
        ("u rec1 10 -1", "has no samples in recording 'rec1'"),
        ("u rec1 0.01 0.02", "has no samples"),
    ],
)
def test_malformed_segment_names_file_line_and_key(tmp_path, recording, line, message):
    with pytest.raises(DataError, match=message) as info:
        load_segs(tmp_path, f"ok rec1 0 1\n{line}\n")
    assert_located(info, tmp_path / "segments", 2, "u")


def test_segment_overshoot_within_tolerance_is_truncated_like_kaldi(tmp_path, recording):
    # Kaldi's extract-segments truncates segments ending up to 0.5 s past the recording.
    _, samples = load_segs(tmp_path, "u rec1 9 10.4\n")
    assert np.array_equal(samples[0]["audio"], recording[90:100])


def test_segment_overshoot_tolerance_can_be_turned_off(tmp_path, recording):
    path = write(tmp_path / "segments", "u rec1 9 10.2\n")
    pipe = scp_pipe(path).load_segments(str(tmp_path / "wav.scp"), max_overshoot=0)
    with pytest.raises(DataError, match="past the end of recording 'rec1'"):
        list(pipe)
    with pytest.raises(ValueError, match="max_overshoot must be >= 0"):
        scp_pipe(path).load_segments(str(tmp_path / "wav.scp"), max_overshoot=-1)


def test_segments_skip_policy_counts_and_warns(tmp_path, recording):
    path = write(tmp_path / "segments", "a rec1 0 1\nb rec9 0 1\nc rec1 2 1\nd rec1 1 2\n")
    pipe = scp_pipe(path).load_segments(str(tmp_path / "wav.scp"), on_error="skip")
    with pytest.warns(SkippedInputWarning, match="load_segments skipped 2"):
        assert [s["key"] for s in pipe] == ["a", "d"]
    assert pipe.diagnostics.total == 2 and pipe.diagnostics.counts == {"bad segment": 2}


def test_slice_segments_works_on_plain_pairs(tmp_path, recording):
    table = {"rec1": ("rec1", f"{tmp_path}/rec1.wav")}
    (sample,) = slice_segments([("a", "rec1 1 2")], table)
    assert np.array_equal(sample["audio"], recording[10:20])


def test_load_segments_validates_arguments_and_length():
    entries = IterableWrapper([("a", "r 0 1")])
    with pytest.raises(TypeError, match="wav_scp"):
        SegmentLoader(entries, None)
    with pytest.raises(ValueError, match="on_error"):
        SegmentLoader(entries, "wav.scp", on_error="drop")
    assert len(SegmentLoader(entries, "wav.scp")) == 1
    with pytest.raises(TypeError, match="no length"):
        len(SegmentLoader(entries, "wav.scp", on_error="skip"))


# --------------------------------------------------------------------------- composition


def test_kaldi_directory_through_torch_open_files(tmp_path):
    mats = {"u1": np.ones((3, 2), np.float32), "u2": np.zeros((4, 2), np.float32)}
    scp = feats_ark(tmp_path, mats)
    text = write(tmp_path / "text", "u1 HELLO\nu2 BYE\n")
    feats = IterableWrapper([str(scp)]).open_files(mode="b").parse_scp().load_scp("feats")
    texts = IterableWrapper([text]).open_files(mode="r").parse_scp().load_scp("text")
    joined = [{**f, **t} for f, t in zip(feats, texts)]
    assert [(s["key"], s["feats"].shape, s["text"]) for s in joined] == [
        ("u1", (3, 2), "HELLO"), ("u2", (4, 2), "BYE")]


def test_pipes_pickle_and_give_the_same_output(tmp_path, recording):
    segments = write(tmp_path / "segments", "a rec1 0 1\n")
    pipe = scp_pipe(segments).load_segments(str(tmp_path / "wav.scp"))
    clone = pickle.loads(pickle.dumps(pipe))
    assert np.array_equal(list(clone)[0]["audio"], list(pipe)[0]["audio"])


def open_fds():
    """Paths this process has open (Linux)."""
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            found.add(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:  # the fd listdir itself used, closed meanwhile
            pass
    return found


def test_stopping_early_closes_the_ark_and_scp_files(tmp_path):
    scp = feats_ark(tmp_path, {"u1": np.ones((2, 2), np.float32),
                               "u2": np.ones((2, 2), np.float32)})
    it = iter(scp_pipe(scp).load_scp("feats"))
    next(it)
    assert {str(scp), str(tmp_path / "raw.ark")} <= open_fds()
    it.close()  # what a consumer breaking out of a for loop does
    assert not {str(scp), str(tmp_path / "raw.ark")} & open_fds()


def test_only_a_few_arks_stay_open_while_walking_many(tmp_path):
    lines = []
    for i in range(7):
        ark = tmp_path / f"raw.{i}.ark"
        kaldiio.save_ark(str(ark), {f"u{i}": np.full((1, 1), i, np.float32)})
        lines.append(f"u{i} {ark}:3\n")
    scp = write(tmp_path / "feats.scp", "".join(lines))
    most = 0
    for sample in scp_pipe(scp).load_scp("feats"):
        most = max(most, sum(p.endswith(".ark") for p in open_fds()))
    assert sample["feats"][0, 0] == 6 and 1 <= most <= 4
    assert not any(p.endswith(".ark") for p in open_fds())


# --------------------------------------------------------------------------- properties

PRINTABLE_LINES = st.lists(
    st.text(alphabet=st.characters(codec="utf-8"), max_size=30), max_size=8
)


@settings(max_examples=150, deadline=None)
@given(lines=PRINTABLE_LINES, allow_empty=st.booleans(), check_sorted=st.booleans())
def test_random_text_lines_parse_or_raise_data_error(lines, allow_empty, check_sorted):
    try:
        entries = list(parse_scp_lines([line + "\n" for line in lines], source="r.scp",
                                       allow_empty=allow_empty, check_sorted=check_sorted))
    except DataError as exc:
        assert str(exc).startswith("r.scp:")
        return
    for entry in entries:
        key, value = entry
        assert key and not any(c in key for c in " \t\n\r\v\f")
        assert allow_empty or value


@settings(max_examples=150, deadline=None)
@given(data=st.binary(max_size=200), check_sorted=st.booleans())
def test_random_bytes_parse_or_raise_data_error(data, check_sorted):
    try:
        parse(data, source="r.scp", check_sorted=check_sorted)
    except DataError as exc:
        assert str(exc).startswith("r.scp:")


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    return tmp_path_factory.mktemp("random_arks")


RAW_HEADERS = st.sampled_from([b"", b"\x00BFM ", b"\x00BDM ", b"\x00BFV ", b"\x00BCM ",
                               b"\x00BCM2 ", b"\x00BCM3 ", b"\x00B\x04", b"NPY", b"AUDIO",
                               b" [ ", b"PKL", b"RIFF"])


@st.composite
def plausible_headers(draw):
    """Binary matrix headers with small, possibly inconsistent sizes: reach kaldiio's decoders."""
    kind = draw(st.sampled_from([b"FM", b"DM", b"FV", b"CM", b"CM2", b"CM3"]))
    rows, cols = draw(st.integers(-1, 6)), draw(st.integers(-1, 6))
    if kind.startswith(b"C"):
        floats = draw(st.sampled_from([(0.0, 1.0), (-3.0, 6.0), (0.0, 0.0), (1e38, 1e38)]))
        return b"\x00B" + kind + b" " + struct.pack("<ffii", *floats, rows, cols)
    size = struct.pack("<i", rows) + (b"\x04" + struct.pack("<i", cols) if b"M" in kind else b"")
    return b"\x00B" + kind + b" \x04" + size


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(head=st.one_of(RAW_HEADERS, plausible_headers()), body=st.binary(max_size=120),
       offset=st.one_of(st.just(0), st.integers(0, 140)),
       range_=st.sampled_from(["", "[0:1]", "[1:0]", "[,0:0]", "[x]"]))
def test_random_ark_bytes_raise_only_documented_errors(scratch, head, body, offset, range_):
    ark = scratch / "random.ark"
    ark.write_bytes(head + body)
    entry = ScpEntry("u", f"{ark}:{offset}{range_}", source="feats.scp", line=1)
    try:
        (sample,) = load_scp_entries([entry], "feats")
    except (DataError, MissingDataError) as exc:
        assert str(exc).startswith("feats.scp:1 (key 'u')")
        return
    assert sample["feats"].dtype == np.float32 and sample["feats"].ndim == 2


@settings(max_examples=60, deadline=None)
@given(data=st.one_of(st.binary(max_size=200),
                      st.binary(max_size=200).map(lambda b: b"RIFF\x24\x00\x00\x00WAVEfmt " + b),
                      st.binary(max_size=200).map(lambda b: b"fLaC" + b)))
def test_random_bytes_as_a_wav_raise_only_documented_errors(scratch, data):
    wav = scratch / "random.wav"
    wav.write_bytes(data)
    try:
        list(load_scp_entries([ScpEntry("u", str(wav), source="wav.scp", line=3)], "wav"))
    except DataError as exc:
        assert str(exc).startswith("wav.scp:3 (key 'u')")


def test_module_all_is_sorted_and_the_verbs_are_registered():
    import speechpipe.pipes.kaldi._loaders as kaldi

    assert kaldi.__all__ == sorted(kaldi.__all__)
    assert {"parse_scp", "load_scp", "load_segments"} <= set(type(IterableWrapper([])).functions)
