"""join_by_key: matching by key, and every kind of mismatch named or counted."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import speechpipe  # noqa: F401
from speechpipe.diagnostics import SkippedInputWarning
from speechpipe.errors import DataError
from speechpipe.pipes._core import IterableWrapper
from speechpipe.pipes.order._window import KeyJoiner


def stream(*keys):
    return IterableWrapper([{"key": k, "feats": np.full((2, 3), i, np.float32)}
                            for i, k in enumerate(keys)])


def table(field, **rows):
    return IterableWrapper([{"key": k, field: v} for k, v in rows.items()])


def test_fields_are_joined_by_key_not_position():
    joined = list(stream("a", "b", "c").join_by_key(
        table("text", c="C", a="A", b="B"), table("speaker", b="s2", a="s1", c="s1")))
    assert [(s["key"], s["text"], s["speaker"]) for s in joined] == [
        ("a", "A", "s1"), ("b", "B", "s2"), ("c", "C", "s1")]
    assert joined[2]["feats"][0, 0] == 2


def test_two_epochs_give_the_same_result_and_pickle():
    pipe = stream("a", "b").join_by_key(table("text", a="A", b="B"))
    first = [s["text"] for s in pipe]
    clone = pickle.loads(pickle.dumps(pipe))
    assert first == [s["text"] for s in pipe] == [s["text"] for s in clone] == ["A", "B"]


def test_len_is_the_stream_length_under_raise_and_unknown_under_skip():
    assert len(stream("a", "b").join_by_key(table("text", a="A", b="B"))) == 2
    with pytest.raises(TypeError, match="skips are unknown"):
        len(stream("a").join_by_key(table("text", a="A"), on_missing="skip"))


def test_stream_key_missing_from_table_names_the_key():
    with pytest.raises(DataError, match=r"\(key 'b'\): key is missing from join_by_key table #1"):
        list(stream("a", "b").join_by_key(table("text", a="A")))


def test_table_key_missing_from_stream_is_reported_at_end():
    with pytest.raises(DataError, match=r"1 key\(s\) of join_by_key table #1 never appeared.*'z'"):
        list(stream("a").join_by_key(table("text", a="A", z="Z")))


def test_skip_policy_counts_both_directions_and_warns():
    pipe = stream("a", "b", "c").join_by_key(table("text", a="A", c="C", z="Z"),
                                             on_missing="skip")
    with pytest.warns(SkippedInputWarning, match="join_by_key skipped 2"):
        keys = [s["key"] for s in pipe]
    assert keys == ["a", "c"]
    assert pipe.diagnostics.counts == {
        "stream key missing from table #1": 1, "table #1 key not in stream": 1}


def test_duplicate_key_in_table_is_an_error():
    dup = IterableWrapper([{"key": "a", "text": "A"}, {"key": "a", "text": "A2"}])
    with pytest.raises(DataError, match=r"\(key 'a'\): key appears twice"):
        list(stream("a").join_by_key(dup))


def test_conflicting_field_values_are_an_error():
    s = IterableWrapper([{"key": "a", "text": "A"}])
    with pytest.raises(DataError, match="field 'text' differs"):
        list(s.join_by_key(table("text", a="other")))


def test_equal_field_values_are_accepted():
    s = IterableWrapper([{"key": "a", "text": "A"}])
    assert list(s.join_by_key(table("text", a="A"))) == [{"key": "a", "text": "A"}]


def test_table_of_non_dicts_is_an_error():
    with pytest.raises(DataError, match="without a string 'key' field"):
        list(stream("a").join_by_key(IterableWrapper([("a", "A")])))


def test_constructor_validates_and_reads_nothing():
    with pytest.raises(ValueError, match="at least one table"):
        KeyJoiner(stream("a"))
    with pytest.raises(ValueError, match="on_missing must be one of"):
        KeyJoiner(stream("a"), table("text", a="A"), on_missing="ignore")

    class Exploding(IterableWrapper):
        def __iter__(self):
            raise AssertionError("read in __init__")

    KeyJoiner(Exploding([]), Exploding([]))  # constructing must not iterate


def test_a_missing_key_names_the_table_file_it_was_read_from(tmp_path):
    # Issue 23: the error named the key but not which file the table came from. A Kaldi
    # text table read through parse_scp, joined to a stream with one key it lacks.
    text = tmp_path / "text"
    text.write_text("a HELLO\nc WORLD\n")
    table = IterableWrapper([str(text)]).open().parse_scp().load_scp("text")
    with pytest.raises(DataError, match=r"\(key 'b'\): key is missing from join_by_key "
                                        r"table #1 \(.*/text\)") as info:
        list(stream("a", "b").join_by_key(table))
    assert str(text) in str(info.value)
    with pytest.raises(DataError, match=rf"table #1 \({text}\) never appeared.*'c'"):
        list(stream("a").join_by_key(table))


# Issue 23 ("join_by_key's missing-key error names the key but not the table file and
# line"): rows of a Kaldi table carry "file:line" in their 'source', so an error about a
# table row names the line, and a stream key missing from a table names where that stream
# sample came from and the table's file (the table has no line for a key it lacks).


def kaldi_table(path, text):
    path.write_text(text)
    return IterableWrapper([str(path)]).open().parse_scp(allow_empty=True)


def test_a_stream_key_missing_from_a_table_names_the_stream_line_and_the_table_file(tmp_path):
    stream_ = kaldi_table(tmp_path / "text", "a X\nb Y\n").load_scp("text")
    table_ = kaldi_table(tmp_path / "utt2spk", "a s1\n").map(
        lambda e: {"key": e.key, "speaker": e.value})
    with pytest.raises(DataError) as info:
        list(stream_.join_by_key(table_))
    assert str(info.value).startswith(
        f"{tmp_path / 'text'}:2 (key 'b'): key is missing from join_by_key table "
        f"#1 ({tmp_path / 'utt2spk'})")


def test_a_table_key_never_in_the_stream_names_its_file_and_line(tmp_path):
    table_ = kaldi_table(tmp_path / "text", "a HELLO\n\nz ZED\n").load_scp("text")
    with pytest.raises(DataError) as info:
        list(stream("a").join_by_key(table_))
    assert (info.value.source, info.value.key) == (f"{tmp_path / 'text'}:3", "z")
    assert str(info.value).startswith(f"{tmp_path / 'text'}:3 (key 'z'): 1 key(s) of "
                                      "join_by_key table #1")
    pipe = stream("a").join_by_key(table_, on_missing="skip")
    with pytest.warns(SkippedInputWarning):
        list(pipe)
    assert pipe.diagnostics.examples == {
        "table #1 key not in stream": [f"{tmp_path / 'text'}:3 (key 'z')"]}


def test_a_key_twice_across_table_files_names_both_lines(tmp_path):
    (tmp_path / "a").write_text("u1 ONE\nu2 TWO\n")
    (tmp_path / "b").write_text("u2 AGAIN\n")
    table_ = IterableWrapper([str(tmp_path / "a"), str(tmp_path / "b")]).open().parse_scp()
    with pytest.raises(DataError) as info:
        list(stream("u1", "u2").join_by_key(table_.load_scp("text")))
    assert str(info.value).startswith(
        f"{tmp_path / 'b'}:1 (key 'u2'): key appears twice in join_by_key table #1")
    assert f"first at {tmp_path / 'a'}:2" in str(info.value)


def test_a_field_that_differs_names_the_table_line(tmp_path):
    table_ = kaldi_table(tmp_path / "text", "a\nb OTHER\n").load_scp("text")
    s = IterableWrapper([{"key": "b", "text": "B"}])
    with pytest.raises(DataError, match=rf"field 'text' differs between the stream and "
                                        rf"{tmp_path / 'text'}:2 \(join_by_key table #1\)"):
        list(s.join_by_key(table_, on_missing="skip"))
