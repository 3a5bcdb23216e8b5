"""Shard patterns and ``open``: local files, a real HTTP server on 127.0.0.1, opt-in commands."""

from __future__ import annotations

import pickle

import pytest

import speechpipe  # noqa: F401  (registers the functional names)
from speechpipe.errors import DataError, MissingDataError, UnsafeInputError
from speechpipe.pipes._base import IterableWrapper
from speechpipe.pipes.sources import ShardLister, StreamOpener, expand_patterns
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
