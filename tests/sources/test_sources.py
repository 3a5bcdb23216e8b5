"""Shard patterns and ``open``: local files, a real HTTP server on 127.0.0.1, opt-in commands."""

from __future__ import annotations

import gzip
import io
import pickle

import pytest

import speechpipe  # noqa: F401  (registers the functional names)
from speechpipe.errors import DataError, MissingDataError, UnsafeInputError
from speechpipe.pipes._core import IterableWrapper
from speechpipe.pipes.sources._files import ShardLister, StreamOpener
from speechpipe.pipes.sources import check_path_stream, expand_patterns, iter_text_lines
from speechpipe.testing import serve_directory


@pytest.fixture
def shard_tree(tmp_path):
    for group in ("10_1000", "1000_2000"):
        (tmp_path / group).mkdir()
        for i in range(12):
            (tmp_path / group / f"data-{i:05d}.tar").write_bytes(bytes([i]) * (i + 1))
    return tmp_path


# --- patterns ---------------------------------------------------------------------------

def test_brace_and_glob_expand_to_sorted_list(shard_tree):
    paths = expand_patterns(f"{shard_tree}/{{10_1000,1000_2000}}/data-*.tar")
    assert len(paths) == 24
    assert paths == sorted(paths)
    assert paths[0].endswith("1000_2000/data-00000.tar")


def test_numeric_range_expands(shard_tree):
    paths = expand_patterns(f"{shard_tree}/10_1000/data-0000{{0..9}}.tar")
    assert [p[-14:] for p in paths] == [f"data-{i:05d}.tar" for i in range(10)]


def test_several_patterns_are_merged_and_sorted(shard_tree):
    paths = expand_patterns(
        [f"{shard_tree}/10_1000/data-00011.tar", f"{shard_tree}/10_1000/data-0000[12].tar"]
    )
    assert [p[-14:] for p in paths] == ["data-00001.tar", "data-00002.tar", "data-00011.tar"]


def test_glob_without_match_names_the_pattern(shard_tree):
    pattern = f"{shard_tree}/{{10_1000,999_1000}}/data-*.tar"
    with pytest.raises(MissingDataError) as info:
        expand_patterns(pattern)
    assert pattern in str(info.value)
    assert "999_1000/data-*.tar" in str(info.value)


def test_missing_file_in_range_names_pattern_and_expansion(shard_tree):
    pattern = f"{shard_tree}/10_1000/data-000{{10..12}}.tar"
    with pytest.raises(MissingDataError) as info:
        expand_patterns(pattern)
    assert pattern in str(info.value) and "data-00012.tar" in str(info.value)


def test_urls_are_brace_expanded_but_not_checked():
    assert expand_patterns("http://h/s-{0..2}.tar") == [
        "http://h/s-0.tar",
        "http://h/s-1.tar",
        "http://h/s-2.tar",
    ]


def test_list_shards_reads_nothing_at_construction(tmp_path):
    pipe = ShardLister(f"{tmp_path}/later-*.tar")  # nothing exists yet: no error
    (tmp_path / "later-1.tar").write_bytes(b"")
    assert [p[-11:] for p in pipe] == ["later-1.tar"]


def test_list_shards_functional_form_and_two_epochs(shard_tree):
    pipe = IterableWrapper([f"{shard_tree}/10_1000/data-0000{{0..2}}.tar"]).list_shards()
    assert list(pipe) == list(pipe)
    assert len(list(pipe)) == 3


def test_list_shards_rejects_non_strings():
    with pytest.raises(TypeError, match="patterns must be strings"):
        ShardLister(["a.tar", 3])


# --- open: local --------------------------------------------------------------------------

def test_open_local_yields_name_and_bytes(shard_tree):
    paths = expand_patterns(f"{shard_tree}/10_1000/data-0000{{1..3}}.tar")
    got = [(name, stream.read()) for name, stream in IterableWrapper(paths).open()]
    assert got == [(p, bytes([i]) * (i + 1)) for i, p in zip((1, 2, 3), paths)]


def test_open_closes_each_stream_when_consumer_advances(shard_tree):
    paths = expand_patterns(f"{shard_tree}/10_1000/data-0000{{1..3}}.tar")
    it = iter(IterableWrapper(paths).open())
    _, first = next(it)
    assert not first.closed
    _, second = next(it)
    assert first.closed and not second.closed
    it.close()  # the consumer stops early
    assert second.closed


def test_open_missing_file_names_it(tmp_path):
    with pytest.raises(MissingDataError, match="nope.tar: no such file"):
        list(IterableWrapper([str(tmp_path / "nope.tar")]).open())


def test_open_directory_is_an_error(tmp_path):
    with pytest.raises(DataError, match="is a directory"):
        list(IterableWrapper([str(tmp_path)]).open())


def test_open_len_follows_source(shard_tree):
    assert len(IterableWrapper(["a", "b"]).open()) == 2


def test_open_pickles_and_validates():
    pipe = StreamOpener(IterableWrapper(["a"]), timeout=5)
    assert pickle.loads(pickle.dumps(pipe)).timeout == 5
    with pytest.raises(ValueError, match="timeout must be > 0"):
        StreamOpener(IterableWrapper(["a"]), timeout=0)


# --- open: HTTP on 127.0.0.1 -------------------------------------------------------------

def test_open_url_reads_the_served_bytes(shard_tree):
    with serve_directory(str(shard_tree)) as base:
        urls = expand_patterns(base + "/10_1000/data-0000{4..5}.tar")
        got = [stream.read() for _, stream in IterableWrapper(urls).open()]
    assert got == [bytes([4]) * 5, bytes([5]) * 6]


def test_open_url_404_is_missing_data(shard_tree):
    with serve_directory(str(shard_tree)) as base:
        with pytest.raises(MissingDataError) as info:
            list(IterableWrapper([base + "/nope.tar"]).open())
    assert "/nope.tar" in str(info.value) and "404" in str(info.value)


def test_open_url_server_error_is_data_error(shard_tree):
    with serve_directory(str(shard_tree)) as base:
        with pytest.raises(DataError, match="HTTP 503"):
            list(IterableWrapper([base + "/__status__/503"]).open())


def test_open_url_cut_short_raises_while_reading(tmp_path):
    (tmp_path / "big.tar").write_bytes(bytes(range(256)) * 400)
    with serve_directory(str(tmp_path)) as base:
        url = base + "/__truncate__/big.tar"
        with pytest.raises(DataError) as info:
            for _, stream in IterableWrapper([url]).open():
                stream.read()
    assert url in str(info.value) and "transfer cut short" in str(info.value)


def test_open_unreachable_host_names_url():
    # Port 9 on 127.0.0.1 (discard) has no listener here: connection refused.
    with pytest.raises(MissingDataError, match="cannot reach"):
        list(IterableWrapper(["http://127.0.0.1:9/x.tar"]).open(timeout=5))


# --- open: pipe: commands ------------------------------------------------------------------

def test_pipe_is_refused_without_opt_in():
    with pytest.raises(UnsafeInputError, match="allow_pipes=True"):
        list(IterableWrapper(["pipe:echo hi"]).open())


def test_pipe_reads_command_output_when_allowed():
    got = [s.read() for _, s in IterableWrapper(["pipe:printf abc"]).open(allow_pipes=True)]
    assert got == [b"abc"]


def test_pipe_failing_command_raises_with_status_and_stderr():
    name = "pipe:echo partial; echo boom >&2; exit 3"
    with pytest.raises(DataError) as info:
        for _, stream in IterableWrapper([name]).open(allow_pipes=True):
            assert stream.read() == b"partial\n"
    assert "status 3" in str(info.value) and "boom" in str(info.value)


def test_pipe_stopped_early_is_not_an_error():
    pipe = IterableWrapper(["pipe:yes"]).open(allow_pipes=True)
    it = iter(pipe)
    _, stream = next(it)
    assert stream.read(4) == b"y\ny\n"
    it.close()
    assert stream.closed


# --- reading lines: iter_text_lines, check_path_stream ------------------------------------

def lines_of(stream, **kwargs):
    """``(number, text)`` pairs, a bad line shown as ``(number, "error: <message>")``."""
    return [(n, t if isinstance(t, str) else f"error: {t}")
            for n, t in iter_text_lines(stream, **kwargs)]


BAD_LINE_2 = b"u1 a\nu2 \xc3\x28\nu3 \xc3\xa9\n"  # line 2 is not UTF-8, line 3 is "u3 é"
EXPECTED = [
    (1, "u1 a\n"),
    (2, "error: t.txt:2: not valid UTF-8 (invalid continuation byte at byte 4 of the line)"),
    (3, "u3 é\n"),
]


def test_binary_stream_lines_are_numbered_and_decoded_line_by_line():
    assert lines_of(io.BytesIO(BAD_LINE_2), source="t.txt") == EXPECTED


def test_a_bad_line_is_yielded_as_a_located_data_error_chained_to_the_decode_error():
    _, error = list(iter_text_lines([b"\xff\n"], source="t.txt"))[0]
    assert isinstance(error, DataError) and (error.source, error.line) == ("t.txt", 1)
    assert isinstance(error.__cause__, UnicodeDecodeError)


def test_text_stream_and_str_lines_are_passed_through():
    assert lines_of(io.StringIO("a\nb"), source="t") == [(1, "a\n"), (2, "b")]
    assert lines_of(["a\n", b"b\n"], source="t") == [(1, "a\n"), (2, "b\n")]


def test_utf8_text_stream_is_read_through_its_buffer_to_name_the_bad_line():
    stream = io.TextIOWrapper(io.BytesIO(BAD_LINE_2), encoding="UTF8")
    assert lines_of(stream, source="t.txt") == EXPECTED


@pytest.mark.parametrize("mode", ["b", "r"])
def test_torch_stream_wrapper_in_either_mode_names_the_bad_line(tmp_path, mode):
    path = tmp_path / "t.txt"
    path.write_bytes(BAD_LINE_2)
    (name, stream), = IterableWrapper([str(path)]).open_files(mode=mode)
    try:
        got = lines_of(stream, source="t.txt")
    finally:
        stream.close()
    assert type(stream).__name__ == "StreamWrapper" and got == EXPECTED


def test_lenient_utf8_text_stream_keeps_its_own_decoding():
    stream = io.TextIOWrapper(io.BytesIO(b"a\xff\n"), encoding="utf-8", errors="replace")
    assert lines_of(stream, source="t") == [(1, "a\ufffd\n")]


def test_text_stream_in_another_encoding_that_fails_raises_naming_file_and_line():
    stream = io.TextIOWrapper(io.BytesIO(b"a\n\xff\n"), encoding="ascii")
    with pytest.raises(DataError, match="not valid ascii text at or after this line") as info:
        lines_of(stream, source="t.txt")
    assert str(info.value).startswith("t.txt:1: ") and "open_files(mode='b')" in str(info.value)


def test_gzipped_stream_is_decompressed_and_left_open():
    stream = io.BytesIO(gzip.compress(BAD_LINE_2))
    assert lines_of(stream, source="t.txt", gzipped=True) == EXPECTED
    assert not stream.closed  # the caller owns it


def test_truncated_gzip_raises_naming_the_file_after_the_lines_it_had():
    data = gzip.compress(b"".join(b"line %d\n" % i for i in range(5000)))
    got = []
    with pytest.raises(DataError, match="truncated or corrupt gzip stream after line") as info:
        for number, text in iter_text_lines(io.BytesIO(data[:-20]), source="t.gz", gzipped=True):
            got.append(text)
    assert str(info.value).startswith("t.gz: ") and 0 < len(got) < 5000
    assert got == [f"line {i}\n" for i in range(len(got))]


def test_gzip_in_a_text_stream_is_refused():
    with pytest.raises(DataError, match="t.gz: a gzipped file must be opened in binary mode"):
        lines_of(io.StringIO("x"), source="t.gz", gzipped=True)


def test_read_failure_raises_naming_the_file_and_last_line():
    class Failing(io.RawIOBase):
        def readable(self):
            return True

        def readinto(self, buffer):
            raise OSError("disk on fire")

    with pytest.raises(DataError, match=r"^t.txt: read failed after line 0: disk on fire"):
        lines_of(io.BufferedReader(Failing()), source="t.txt")


def test_a_whole_string_or_non_line_items_are_type_errors():
    with pytest.raises(TypeError, match="splitlines"):
        lines_of(b"a\nb\n", source="t")
    with pytest.raises(TypeError, match="t:2: lines must be str or bytes, got 3"):
        lines_of(["a\n", 3], source="t")


def test_check_path_stream_returns_a_str_path_or_names_the_verb(tmp_path):
    stream = io.BytesIO()
    assert check_path_stream((tmp_path / "t", stream), "parse_x") == (str(tmp_path / "t"), stream)
    for item in ("t.txt", ("t.txt",), ("t.txt", "u1 a\n"), (3, stream)):
        with pytest.raises(TypeError, match=r"parse_x consumes \(path, stream\) pairs.*"
                           r"open_files\(mode='b'\)\.parse_x\(\)"):
            check_path_stream(item, "parse_x")


def test_a_wenet_data_list_is_a_shard_list(tmp_path):
    # Issue 32.11: WeNet's data.list (one shard per line) is how WeNet users name shards.
    import speechpipe as sp
    from speechpipe.errors import DataError

    shards = tmp_path / "shards"
    shards.mkdir()
    for i in range(2):
        with sp.ShardWriter(str(shards / f"s{i}.tar")) as writer:
            writer.write({"key": f"u{i}", "txt": f"t{i}"})
    listing = tmp_path / "data.list"
    listing.write_text(f"shards/s1.tar\n\n{shards / 's0.tar'}\n")
    paths = list(sp.IterableWrapper([str(listing)]).list_shards())
    assert paths == [str(shards / "s0.tar"), str(shards / "s1.tar")]
    keys = sorted(s["key"] for s in sp.IterableWrapper(paths).open_files(mode="b").read_shards())
    assert keys == ["u0", "u1"]
    raw = tmp_path / "raw.list"
    raw.write_text('{"key": "u0", "wav": "a.wav", "txt": "x"}\n')
    with pytest.raises(DataError, match=r"raw.list:1: this list holds JSON samples"):
        list(sp.IterableWrapper([str(raw)]).list_shards())
