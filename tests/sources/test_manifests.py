"""Manifests: JSON lines and TSV (Common Voice) into samples, and JSON lines written back.

Invariant: every non-blank line of a well-formed manifest becomes one sample with a string
``key``, in file order; any malformed input raises DataError naming the file and the line.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from speechpipe.diagnostics import SkippedInputWarning
from speechpipe.errors import DataError, MissingDataError
from speechpipe.pipes._core import IterableWrapper
from speechpipe.pipes.sources import (
    iter_manifest, ManifestParserIterDataPipe, read_manifest, write_manifest,
)

CV_HEADER = (
    "client_id\tpath\tsentence_id\tsentence\tsentence_domain\tup_votes\tdown_votes\tage\t"
    "gender\taccents\tvariant\tlocale\tsegment"
)
CV_ROWS = [
    "c0ffee\tcommon_voice_en_100.mp3\ts1\tHe said \"stop\"; then left.\t\t2\t0\ttwenties\t"
    "male_masculine\t\t\ten\t",
    "beef01\tcommon_voice_en_101.mp3\ts2\tA 'quoted' \"half; open\t\t3\t1\t\t\t\t\ten\t",
]


def _write(path, text: str | bytes, gz: bool = False):
    data = text.encode("utf-8") if isinstance(text, str) else text
    if gz:
        data = gzip.compress(data)
    path.write_bytes(data)
    return str(path)


def _parse(path, **kwargs):
    """Parse through torch's open_files (binary), as a pipeline would."""
    return list(IterableWrapper([str(path)]).open_files(mode="b").parse_manifest(**kwargs))


def _error(path, **kwargs) -> DataError:
    with pytest.raises(DataError) as info:
        _parse(path, **kwargs)
    return info.value


JSONL = (
    '{"key": "u1", "audio_filepath": "a/u1.flac", "duration": 1.5, "text": "hello"}\n'
    '{"key": "u2", "audio_filepath": "a/u2.flac", "duration": 2.0, "text": "wörld"}\n'
)


# --- JSON lines -----------------------------------------------------------------------------

def test_jsonl_lines_become_samples_in_order(tmp_path):
    path = _write(tmp_path / "m.jsonl", JSONL)
    samples = _parse(path)
    assert [s["key"] for s in samples] == ["u1", "u2"]
    assert samples[1] == {
        "key": "u2",
        "audio_filepath": "a/u2.flac",
        "duration": 2.0,
        "text": "wörld",
        "source": f"{path}:2",
    }


def test_jsonl_gz_is_gunzipped(tmp_path):
    path = _write(tmp_path / "m.jsonl.gz", JSONL, gz=True)
    assert [s["text"] for s in _parse(path)] == ["hello", "wörld"]


def test_speechpipe_open_streams_are_accepted(tmp_path):
    path = _write(tmp_path / "m.jsonl.gz", JSONL, gz=True)
    samples = list(IterableWrapper([path]).open().parse_manifest())
    assert [s["key"] for s in samples] == ["u1", "u2"]


def test_text_mode_streams_are_accepted(tmp_path):
    path = _write(tmp_path / "m.jsonl", JSONL)
    samples = list(IterableWrapper([path]).open_files(mode="r").parse_manifest())
    assert [s["text"] for s in samples] == ["hello", "wörld"]


def test_json_extension_is_read_as_json_lines(tmp_path):
    path = _write(tmp_path / "m.json", '{"key": "a"}\n{"key": "b"}\n')
    assert [s["key"] for s in _parse(path)] == ["a", "b"]


@pytest.mark.parametrize("alias", ["id", "utt_id", "utt", "sid"])
def test_jsonl_key_aliases_are_copied_to_key(tmp_path, alias):
    path = _write(tmp_path / "m.jsonl", json.dumps({alias: "spk1-utt7", "text": "x"}) + "\n")
    (sample,) = _parse(path)
    assert sample["key"] == "spk1-utt7" and sample[alias] == "spk1-utt7"


def test_jsonl_key_column_names_the_key_field_and_paths_give_stems(tmp_path):
    nemo = '{"audio_filepath": "/data/wavs/LJ001-0001.wav", "duration": 1.0, "text": "a"}\n'
    path = _write(tmp_path / "nemo.jsonl", nemo)
    (sample,) = _parse(path, key_column="audio_filepath")
    assert sample["key"] == "LJ001-0001"
    assert sample["audio_filepath"] == "/data/wavs/LJ001-0001.wav"


def test_blank_lines_and_byte_order_mark_are_ignored(tmp_path):
    path = _write(tmp_path / "m.jsonl", '\ufeff{"key": "a"}\n\n   \n{"key": "b"}\n\n')
    samples = _parse(path)
    assert [s["key"] for s in samples] == ["a", "b"]
    assert samples[1]["source"].endswith("m.jsonl:4")


def test_explicit_format_overrides_the_extension(tmp_path):
    path = _write(tmp_path / "list.txt", "key\ttext\nu1\thi\n")
    assert _parse(path, format="tsv") == [{"key": "u1", "text": "hi", "source": f"{path}:2"}]


def test_streams_are_closed_after_parsing():
    stream = io.BytesIO(b'{"key": "a"}\n')
    pipe = IterableWrapper([("m.jsonl", stream)], deepcopy=False).parse_manifest()
    assert [s["key"] for s in pipe] == ["a"]
    assert stream.closed


def test_two_epochs_give_the_same_samples(tmp_path):
    path = _write(tmp_path / "m.jsonl", JSONL)
    pipe = IterableWrapper([path]).open_files(mode="b").parse_manifest()
    assert list(pipe) == list(pipe)


# --- TSV ----------------------------------------------------------------------------------

def test_common_voice_tsv_keys_are_clip_stems_and_quotes_stay_text(tmp_path):
    path = _write(tmp_path / "train.tsv", "\n".join([CV_HEADER, *CV_ROWS]) + "\n")
    samples = _parse(path)
    assert [s["key"] for s in samples] == ["common_voice_en_100", "common_voice_en_101"]
    assert samples[0]["sentence"] == 'He said "stop"; then left.'
    assert samples[1]["sentence"] == "A 'quoted' \"half; open"
    assert samples[0]["up_votes"] == "2"  # values stay strings
    assert samples[1]["age"] == ""
    assert samples[0]["path"] == "common_voice_en_100.mp3"


def test_tsv_gz_is_gunzipped(tmp_path):
    path = _write(tmp_path / "dev.tsv.gz", "\n".join([CV_HEADER, *CV_ROWS]) + "\n", gz=True)
    assert [s["locale"] for s in _parse(path)] == ["en", "en"]


def test_tsv_numbers_are_parsed(tmp_path):
    path = _write(tmp_path / "m.tsv", "id\tduration\toffset\tnum_frames\nu1\t1.25\t0.5\t125\n")
    (sample,) = _parse(path)
    assert sample["key"] == "u1"
    assert sample["duration"] == 1.25 and sample["offset"] == 0.5 and sample["num_frames"] == 125
    assert isinstance(sample["num_frames"], int)


def test_tsv_key_column_is_configurable(tmp_path):
    path = _write(tmp_path / "m.tsv", "speaker\tutt_name\nspk1\tx-1\n")
    assert _parse(path, key_column="utt_name")[0]["key"] == "x-1"


def test_tsv_crlf_line_endings(tmp_path):
    path = _write(tmp_path / "m.tsv", "key\ttext\r\nu1\thi there\r\n")
    assert _parse(path)[0]["text"] == "hi there"


# --- malformed input: one test each ---------------------------------------------------------

def test_invalid_json_names_file_line_and_column(tmp_path):
    path = _write(tmp_path / "m.jsonl", '{"key": "a"}\n{"key": "b", text: 1}\n')
    err = _error(path)
    assert f"{path}:2" in str(err) and "column 14" in str(err)
    assert err.line == 2


def test_json_line_that_is_not_an_object_names_file_and_line(tmp_path):
    path = _write(tmp_path / "m.jsonl", '{"key": "a"}\n\n["b", 1]\n')
    err = _error(path)
    assert f"{path}:3" in str(err) and "JSON object" in str(err)


def test_json_line_without_key_names_file_and_line(tmp_path):
    path = _write(tmp_path / "m.jsonl", '{"key": "a"}\n{"name": "b"}\n')
    err = _error(path)
    assert f"{path}:2" in str(err) and "no key" in str(err)


def test_non_string_key_names_file_and_line(tmp_path):
    path = _write(tmp_path / "m.jsonl", '{"id": 17}\n')
    err = _error(path)
    assert f"{path}:1" in str(err) and "must be a string" in str(err)


def test_empty_key_names_file_and_line(tmp_path):
    path = _write(tmp_path / "m.jsonl", '{"key": "a"}\n{"key": " "}\n')
    assert f"{path}:2" in str(_error(path))


def test_duplicate_key_names_both_lines(tmp_path):
    path = _write(tmp_path / "m.jsonl", '{"key": "a"}\n{"key": "b"}\n{"key": "a"}\n')
    err = _error(path)
    assert f"{path}:3" in str(err) and "first on line 1" in str(err) and "'a'" in str(err)


def test_duplicate_tsv_key_names_both_lines(tmp_path):
    path = _write(tmp_path / "m.tsv", "path\tsentence\nx/a.mp3\t1\ny/a.wav\t2\n")
    err = _error(path)
    assert f"{path}:3" in str(err) and "first on line 2" in str(err)


def test_invalid_utf8_names_file_and_line(tmp_path):
    path = _write(tmp_path / "m.jsonl", b'{"key": "a"}\n{"key": "b\xff"}\n')
    err = _error(path)
    assert f"{path}:2" in str(err) and "UTF-8" in str(err)


def test_invalid_utf8_in_a_text_mode_stream_names_the_line(tmp_path):
    path = _write(tmp_path / "m.tsv", b"key\ttext\nu1\tok\nu2\tbad \xc3\x28\n")
    with pytest.raises(DataError) as info:
        list(IterableWrapper([path]).open_files(mode="r").parse_manifest())
    assert f"{path}:3" in str(info.value)


def test_tsv_row_of_only_tabs_is_a_row_not_a_blank_line(tmp_path):
    path = _write(tmp_path / "m.tsv", "key\ttext\nu1\thi\n\t\n")
    err = _error(path)
    assert f"{path}:3" in str(err) and "empty key" in str(err)


def test_tsv_row_with_wrong_column_count_names_file_line_and_counts(tmp_path):
    path = _write(tmp_path / "m.tsv", "key\ttext\tspeaker\nu1\thi\ts1\nu2\thi\n")
    err = _error(path)
    assert f"{path}:3" in str(err) and "expected 3" in str(err) and "got 2" in str(err)


def test_tsv_bad_number_names_file_line_and_column(tmp_path):
    path = _write(tmp_path / "m.tsv", "key\tduration\nu1\t1.0\nu2\t1,5\n")
    err = _error(path)
    assert f"{path}:3" in str(err) and "'duration'" in str(err) and "'1,5'" in str(err)


def test_tsv_bad_int_names_the_column(tmp_path):
    path = _write(tmp_path / "m.tsv", "key\tnum_frames\nu1\t12.5\n")
    err = _error(path)
    assert f"{path}:2" in str(err) and "'num_frames'" in str(err)


def test_tsv_without_key_column_names_file_and_header_line(tmp_path):
    path = _write(tmp_path / "m.tsv", "client_id\tsentence\nc1\thi\n")
    err = _error(path)
    assert f"{path}:1" in str(err) and "no key column" in str(err)


def test_tsv_header_with_repeated_column_names_file_and_line(tmp_path):
    path = _write(tmp_path / "m.tsv", "key\ttext\ttext\nu1\ta\tb\n")
    err = _error(path)
    assert f"{path}:1" in str(err) and "repeats column 'text'" in str(err)


def test_truncated_gzip_names_the_file(tmp_path):
    data = gzip.compress(("\n".join(json.dumps({"key": f"u{i}"}) for i in range(500))).encode())
    path = tmp_path / "m.jsonl.gz"
    path.write_bytes(data[: len(data) // 2])
    err = _error(path)
    assert str(path) in str(err) and "truncated or corrupt gzip" in str(err)


def test_gz_name_on_plain_bytes_names_the_file(tmp_path):
    path = _write(tmp_path / "m.jsonl.gz", JSONL)
    err = _error(path)
    assert str(path) in str(err) and "gzip" in str(err)


def test_gzipped_manifest_in_a_text_only_stream_is_refused():
    pipe = IterableWrapper([("m.jsonl.gz", io.StringIO("{}"))], deepcopy=False).parse_manifest()
    with pytest.raises(DataError, match="m.jsonl.gz: a gzipped file must be opened in binary"):
        list(pipe)


def test_unknown_extension_names_the_file(tmp_path):
    path = _write(tmp_path / "m.csv", "key,text\n")
    err = _error(path)
    assert str(path) in str(err) and "format=" in str(err)


# --- skipping -------------------------------------------------------------------------------

def test_skip_drops_bad_lines_counts_and_warns(tmp_path):
    path = _write(
        tmp_path / "m.jsonl",
        '{"key": "a"}\n{oops\n[1]\n{"key": "a"}\n{"key": "b"}\n{"text": "x"}\n',
    )
    pipe = IterableWrapper([path]).open_files(mode="b").parse_manifest(on_error="skip")
    with pytest.warns(SkippedInputWarning, match="parse_manifest skipped 4"):
        samples = list(pipe)
    assert [s["key"] for s in samples] == ["a", "b"]
    assert dict(pipe.diagnostics.counts) == {
        "invalid JSON": 1, "not a JSON object": 1, "duplicate key": 1, "no key": 1,
    }
    assert f"{path}:2" in pipe.diagnostics.examples["invalid JSON"][0]


def test_skip_keeps_lines_before_a_truncated_gzip(tmp_path):
    lines = "".join(json.dumps({"key": f"u{i}", "pad": "x" * 50}) + "\n" for i in range(2000))
    data = gzip.compress(lines.encode())
    path = tmp_path / "m.jsonl.gz"
    path.write_bytes(data[: len(data) // 2])
    pipe = IterableWrapper([str(path)]).open_files(mode="b").parse_manifest(on_error="skip")
    with pytest.warns(SkippedInputWarning):
        samples = list(pipe)
    assert 0 < len(samples) < 2000
    assert [s["key"] for s in samples] == [f"u{i}" for i in range(len(samples))]
    assert pipe.diagnostics.counts["unreadable manifest"] == 1


# --- the pipe's contract ----------------------------------------------------------------------

@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"format": "csv"}, ValueError),
        ({"on_error": "ignore"}, ValueError),
        ({"key_column": 3}, TypeError),
        ({"key_column": ""}, TypeError),
    ],
)
def test_constructor_rejects_bad_arguments(kwargs, error):
    with pytest.raises(error):
        ManifestParserIterDataPipe(IterableWrapper([]), **kwargs)


def test_constructor_reads_nothing(tmp_path):
    # a missing file is only touched when iterating
    pipe = IterableWrapper([str(tmp_path / "absent.jsonl")]).open_files(mode="b").parse_manifest()
    with pytest.raises(FileNotFoundError):
        list(pipe)


def test_length_is_unknown():
    with pytest.raises(TypeError, match="unknown until the manifests are read"):
        len(IterableWrapper([]).parse_manifest())


def test_elements_must_be_path_stream_pairs():
    with pytest.raises(TypeError, match=r"\(path, stream\) pairs"):
        list(IterableWrapper(["m.jsonl"]).parse_manifest())


def test_read_manifest_reads_a_local_file(tmp_path):
    path = _write(tmp_path / "m.tsv.gz", "\n".join([CV_HEADER, *CV_ROWS]) + "\n", gz=True)
    assert [s["key"] for s in read_manifest(path)] == ["common_voice_en_100", "common_voice_en_101"]


def test_read_manifest_of_absent_file_raises_missing_data_error(tmp_path):
    with pytest.raises(MissingDataError, match="absent.jsonl"):
        list(read_manifest(tmp_path / "absent.jsonl"))


# --- writing ------------------------------------------------------------------------------

def test_write_manifest_sorts_fields_and_round_trips(tmp_path):
    samples = [
        {"text": "héllo", "key": "u1", "duration": 1.5, "num_frames": 150, "speaker": None},
        {"key": "u2", "text": "你好", "duration": 0.25, "num_frames": 25, "speaker": "s1"},
    ]
    path = tmp_path / "m.jsonl"
    assert write_manifest(path, samples) == 2
    first = path.read_text(encoding="utf-8").splitlines()[0]
    assert first == (
        '{"duration": 1.5, "key": "u1", "num_frames": 150, "speaker": null, "text": "héllo"}'
    )
    back = [{k: v for k, v in s.items() if k != "source"} for s in read_manifest(path)]
    assert back == samples


def test_write_manifest_gz_is_byte_identical_across_writes(tmp_path):
    samples = [{"key": f"u{i}", "text": "x" * i} for i in range(20)]
    a, b = tmp_path / "a.jsonl.gz", tmp_path / "b.jsonl.gz"
    write_manifest(a, samples)
    write_manifest(b, reversed(list(reversed(samples))))
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes()[:2] == b"\x1f\x8b"
    assert [s["key"] for s in read_manifest(a)] == [f"u{i}" for i in range(20)]


def test_write_manifest_writes_numpy_scalars_as_numbers(tmp_path):
    path = tmp_path / "m.jsonl"
    write_manifest(path, [{"key": "u1", "duration": np.float32(1.5), "n": np.int64(3)}])
    assert path.read_text() == '{"duration": 1.5, "key": "u1", "n": 3}\n'


def test_write_manifest_refuses_arrays_naming_key_and_field(tmp_path):
    path = tmp_path / "m.jsonl"
    with pytest.raises(TypeError, match=r"sample 'u2': field 'audio' \(ndarray\)"):
        write_manifest(path, [{"key": "u1"}, {"key": "u2", "audio": np.zeros(3)}])
    assert os.listdir(tmp_path) == []  # nothing half-written is left behind


def test_write_manifest_refuses_nan_naming_key_and_field(tmp_path):
    with pytest.raises(ValueError, match=r"sample 'u1': field 'duration'"):
        write_manifest(tmp_path / "m.jsonl", [{"key": "u1", "duration": float("nan")}])


def test_write_manifest_requires_a_string_key(tmp_path):
    with pytest.raises(ValueError, match="sample 1 has no non-empty string 'key'"):
        write_manifest(tmp_path / "m.jsonl", [{"key": "u1"}, {"id": "u2"}])


def test_write_manifest_refuses_duplicate_keys(tmp_path):
    with pytest.raises(ValueError, match=r"duplicate key 'u1' \(samples 0 and 2\)"):
        write_manifest(tmp_path / "m.jsonl", [{"key": "u1"}, {"key": "u2"}, {"key": "u1"}])


# --- property: any bytes give samples or a DataError ------------------------------------------

_line = st.one_of(
    st.binary(max_size=40),
    st.text(max_size=40).map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.sampled_from([
        b'{"key": "a"}', b'{"id": "b", "duration": 1}', b"[]", b"null", b'{"key": 1}',
        b"key\ttext", b"path\tduration", b"u1\t1.5", b"a.mp3\tx", b"\t", b'"', b"\xff",
        b"1" * 5000, b"[" * 3000,
    ]),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(["m.jsonl", "m.tsv", "m.jsonl.gz", "m.tsv.gz"]),
    lines=st.lists(_line, max_size=8),
    compress=st.booleans(),
    damage=st.sampled_from(["none", "cut", "flip"]),
    at=st.integers(0, 400),
)
def test_random_lines_give_samples_or_data_error(name, lines, compress, damage, at):
    data = b"\n".join(lines)
    if name.endswith(".gz") and compress:
        data = bytearray(gzip.compress(data))
        if damage == "cut":
            data = data[: len(data) - at % len(data)]
        elif damage == "flip":  # a corrupt byte past the 10-byte header
            data[10 + at % (len(data) - 10)] ^= 0x5A
        data = bytes(data)
    try:
        samples = list(iter_manifest(name, io.BytesIO(data)))
    except DataError:
        return
    for s in samples:
        assert isinstance(s["key"], str) and s["key"].strip()


@settings(max_examples=100, deadline=None)
@given(data=st.text(max_size=200), name=st.sampled_from(["m.jsonl", "m.tsv"]))
def test_random_text_streams_give_samples_or_data_error(data, name):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            list(iter_manifest(name, io.StringIO(data)))
        except DataError:
            pass


def test_invalid_utf8_line_is_skipped_alone_under_skip(tmp_path):
    path = _write(tmp_path / "m.jsonl",
                  b'{"key": "a"}\n{"key": "b\xff"}\n{"key": "c"}\n')
    pipe = IterableWrapper([path]).open_files(mode="b").parse_manifest(on_error="skip")
    with pytest.warns(SkippedInputWarning, match="invalid UTF-8: 1"):
        assert [s["key"] for s in pipe] == ["a", "c"]
    assert pipe.diagnostics.counts == {"invalid UTF-8": 1}
