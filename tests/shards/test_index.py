"""The shard index: round trip, planning helpers, and every malformed case named by line."""

from __future__ import annotations

import json
import os
import pickle

import pytest

from speechpipe.errors import DataError, MissingDataError
from speechpipe.index import INDEX_NAME, ShardEntry, ShardIndex


def entry(name, lengths):
    return ShardEntry(name, len(lengths), 100 * len(lengths),
                      tuple(f"{name}-{i}" for i in range(len(lengths))), tuple(lengths))


@pytest.fixture
def two_groups(tmp_path):
    for group, lengths in (("10_500", [10, 20, 30]), ("500_800", [600, 700])):
        (tmp_path / group).mkdir()
        ShardIndex(str(tmp_path / group),
                   [entry("data-00000.tar", lengths), entry("data-00001.tar", lengths[:1])]).write()
    return tmp_path


def test_round_trip_keeps_every_field(tmp_path):
    idx = ShardIndex(str(tmp_path), [entry("data-00000.tar", [5.0, 7.5])], length_unit="samples")
    path = idx.write()
    assert path == str(tmp_path / INDEX_NAME)
    again = ShardIndex.read(path)
    assert again.shards == idx.shards and again.length_unit == "samples"
    assert len(again) == 2 and again.total_bytes() == 200
    assert not (tmp_path / f"{INDEX_NAME}.tmp").exists()


def test_for_shards_spans_folders_in_the_given_order(two_groups):
    paths = [str(two_groups / "500_800/data-00001.tar"), str(two_groups / "10_500/data-00000.tar")]
    idx = ShardIndex.for_shards(paths)
    assert idx.paths() == paths
    assert [s.count for s in idx.shards] == [1, 3]
    assert idx.lengths() == [600.0, 10.0, 20.0, 30.0]


def test_boundaries_are_quantiles_and_the_callable_pickles(two_groups):
    idx = ShardIndex.read(two_groups / "10_500")
    assert idx.boundaries(2) == [20.0]
    fn = pickle.loads(pickle.dumps(idx.boundaries_fn(2)))
    assert fn() == [20.0]


def test_missing_index_says_how_to_make_one(tmp_path):
    with pytest.raises(MissingDataError, match="write one with 'speechpipe pack'"):
        ShardIndex.read(tmp_path)


def test_shard_missing_from_its_index_is_named(two_groups):
    with pytest.raises(DataError, match="data-00009.tar: shard is not in its folder's index"):
        ShardIndex.for_shards([str(two_groups / "10_500/data-00009.tar")])


def test_folders_with_different_units_cannot_be_mixed(tmp_path):
    for group, unit in (("a", "frames"), ("b", "samples")):
        (tmp_path / group).mkdir()
        ShardIndex(str(tmp_path / group), [entry("s.tar", [1])], length_unit=unit).write()
    with pytest.raises(DataError, match="different units"):
        ShardIndex.for_shards([str(tmp_path / "a/s.tar"), str(tmp_path / "b/s.tar")])


HEADER = json.dumps({"format": "speechpipe-shard-index", "version": 1, "length_unit": "frames"})


@pytest.mark.parametrize(("lines", "line", "message"), [
    ([], None, "empty shard index"),
    (['{"format": "other"}'], 1, "not a speechpipe shard index"),
    (['{"format": "speechpipe-shard-index", "version": 9}'], 1, "unsupported index version 9"),
    ([HEADER, "{not json"], 2, "invalid JSON"),
    ([HEADER, "[1, 2]"], 2, "expected a JSON object per shard"),
    ([HEADER, '{"name": "a.tar", "count": 1, "bytes": 1, "keys": ["k"]}'], 2,
     "shard entry lacks 'lengths'"),
    ([HEADER, '{"name": "a.tar", "count": "1", "bytes": 1, "keys": [], "lengths": []}'], 2,
     "fields of the wrong type"),
    ([HEADER, '{"name": "a.tar", "count": 2, "bytes": 1, "keys": ["k"], "lengths": [1]}'], 2,
     "count 2 but 1 keys and 1 lengths"),
])
def test_malformed_index_names_file_and_line(tmp_path, lines, line, message):
    path = tmp_path / INDEX_NAME
    path.write_text("".join(f"{x}\n" for x in lines))
    with pytest.raises(DataError, match=message) as info:
        ShardIndex.read(path)
    where = f"{path}:{line}" if line else str(path)
    assert str(info.value).startswith(where)


# Issue 34, item 4: index.jsonl entries stay inside their folder unless the caller opts in.
# Invariant: a shared or downloaded pack folder names only files below itself.

def _entry_line(name):
    return json.dumps({"name": name, "count": 1, "bytes": 10, "keys": ["k"], "lengths": [1]})


@pytest.mark.parametrize("name", [
    "/etc/private.tar", "../private.tar", "sub/../../private.tar", "http://127.0.0.1:9/a.tar",
    "s3://bucket/a.tar", "C:/x.tar", "..\\private.tar", "./a.tar", "a//b.tar",
])
def test_entry_outside_its_folder_is_refused_by_line(tmp_path, name):
    from speechpipe.errors import UnsafeInputError
    path = tmp_path / INDEX_NAME
    path.write_text(f"{HEADER}\n{_entry_line('data-00000.tar')}\n{_entry_line(name)}\n")
    with pytest.raises(UnsafeInputError, match="points outside the index's folder") as info:
        ShardIndex.read(tmp_path)
    assert str(info.value).startswith(f"{path}:3")
    assert ShardIndex.read(tmp_path, allow_outside=True).shards[1].name == name


def test_pack_folder_cannot_make_a_reader_fetch_a_url(tmp_path):
    import http.server

    import speechpipe as sp
    from speechpipe.testing import serve_handler

    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append(self.path)
            self.send_error(404)

        def log_message(self, *args):
            pass

    with serve_handler(Handler) as base:
        url = f"{base}/secret.tar"
        (tmp_path / INDEX_NAME).write_text(f"{HEADER}\n{_entry_line(url)}\n")
        with pytest.raises(sp.UnsafeInputError, match="points outside"):
            list(sp.IterableWrapper([str(tmp_path)]).sharded_shuffle().read_shards())
        with pytest.raises(sp.UnsafeInputError, match="points outside"):
            list(sp.IterableWrapper([str(tmp_path)]).list_shards())
    assert seen == []


def test_group_folders_are_checked_too(two_groups):
    from speechpipe.errors import UnsafeInputError
    (two_groups / "500_800" / INDEX_NAME).write_text(f"{HEADER}\n{_entry_line('/abs.tar')}\n")
    with pytest.raises(UnsafeInputError, match="'/abs.tar' points outside"):
        ShardIndex.read(two_groups)
    assert len(ShardIndex.read(two_groups, allow_outside=True).shards) == 3


def test_index_nested_deeply_is_a_data_error(tmp_path):
    # Issue 34, item 11: a bare RecursionError before.
    path = tmp_path / INDEX_NAME
    path.write_text(f"{HEADER}\n{'[' * 100_000}{']' * 100_000}\n")
    with pytest.raises(DataError, match="nested too deeply") as info:
        ShardIndex.read(path)
    assert str(info.value).startswith(f"{path}:2")


# ------------------------------------------------------- one read per process (issue 28)


def _count_parses(monkeypatch) -> list[str]:
    import speechpipe.index as index

    parsed: list[str] = []
    real = index.ShardIndex._parse.__func__
    monkeypatch.setattr(index, "_READ", {})
    monkeypatch.setattr(index.ShardIndex, "_parse", classmethod(
        lambda cls, path, remote, *rest: parsed.append(path) or real(cls, path, remote, *rest)))
    return parsed


def test_a_folder_is_read_once_per_process_across_listing_planning_and_passes(
        tmp_path, monkeypatch):
    # issue 28: sharded_shuffle listed a folder's shards by reading its whole index, then read
    # it again for the entries, and a fresh reader read it again on every pass
    import speechpipe as sp

    parsed = _count_parses(monkeypatch)
    ShardIndex(str(tmp_path), [entry("a.tar", [100, 200]), entry("b.tar", [300])]).write()
    pipe = sp.IterableWrapper([str(tmp_path)]).sharded_shuffle(index=True)
    assert len(pipe) == 3
    for epoch in range(2):
        pipe.epoch_plans(epoch, world_size=2, num_workers=2)
    again = sp.IterableWrapper([str(tmp_path)]).sharded_shuffle(index=True)
    assert len(again) == 3 and sp.shard_assignment(again, world_size=4).world_size == 4
    assert len(parsed) == 1


def test_a_rewritten_index_is_read_again_and_a_copy_is_handed_out(tmp_path, monkeypatch):
    parsed = _count_parses(monkeypatch)
    ShardIndex(str(tmp_path), [entry("a.tar", [100, 200])]).write()
    first = ShardIndex.read(tmp_path)
    first.shards.append(entry("x.tar", [1]))  # a caller's change stays its own
    assert len(ShardIndex.read(tmp_path)) == 2 and len(parsed) == 1
    ShardIndex(str(tmp_path), [entry("a.tar", [100, 200, 50])]).write()  # same size or not
    assert len(ShardIndex.read(tmp_path)) == 3 and len(parsed) == 2


# ------------------------------------------------------- the mapped table (issue 28)


def test_write_puts_the_mapped_table_beside_and_read_maps_it(tmp_path):
    from speechpipe.compact import MAPPED_SUFFIX, MappedKeys, MappedLengths

    idx = ShardIndex(str(tmp_path), [entry("a.tar", [100, 200]), entry("b.tar", [300])])
    idx.write()
    assert (tmp_path / (INDEX_NAME + MAPPED_SUFFIX)).is_file()
    again = ShardIndex.read(tmp_path)
    first = again.shards[0]
    assert isinstance(first.keys, MappedKeys) and isinstance(first.lengths, MappedLengths)
    assert again.shards == idx.shards  # views compare equal to the tuples they map
    assert first.keys == ("a.tar-0", "a.tar-1") and first.lengths[1:] == (200.0,)
    assert first.keys.position("a.tar-1") == 1 and first.keys.position("zz") is None
    assert first.total_length == 300.0 and again.lengths() == [100.0, 200.0, 300.0]
    assert again.length_array().tolist() == [100.0, 200.0, 300.0]
    assert json.loads(first.to_json())["keys"] == ["a.tar-0", "a.tar-1"]


def test_a_missing_or_stale_table_is_rebuilt_from_the_text(tmp_path, monkeypatch):
    import speechpipe.index as index
    from speechpipe.compact import MAPPED_SUFFIX

    ShardIndex(str(tmp_path), [entry("a.tar", [100, 200])]).write()
    table = tmp_path / (INDEX_NAME + MAPPED_SUFFIX)
    table.unlink()
    assert ShardIndex.read(tmp_path).lengths() == [100.0, 200.0] and table.is_file()
    # the text rewritten by hand (another tool, an edit): the table no longer matches it
    monkeypatch.setattr(index, "_READ", {})
    text = (tmp_path / INDEX_NAME).read_text().replace("[100,200]", "[7,8]")
    (tmp_path / INDEX_NAME).write_text(text + _entry_line("b.tar") + "\n")
    again = ShardIndex.read(tmp_path)
    assert again.lengths() == [7.0, 8.0, 1.0] and again.shards[1].keys == ("k",)


def _read_only(monkeypatch, folder):
    """``folder`` cannot be written (root writes anyway: os.access says no for it)."""
    import speechpipe.compact as compact

    real = compact.os.access
    monkeypatch.setattr(compact.os, "access", lambda path, mode: (
        False if os.path.abspath(path) == str(folder) else real(path, mode)))


def test_a_folder_that_cannot_be_written_gets_its_table_in_the_cache_folder(
        tmp_path, monkeypatch):
    import speechpipe.index as index
    from speechpipe.compact import MAPPED_SUFFIX
    from speechpipe.node_cache import CACHE_ENV

    folder, cache = tmp_path / "ro", tmp_path / "cache"
    folder.mkdir()
    (folder / INDEX_NAME).write_text(f"{HEADER}\n{_entry_line('a.tar')}\n")
    monkeypatch.setenv(CACHE_ENV, str(cache))
    _read_only(monkeypatch, folder)
    idx = ShardIndex.read(folder)
    assert idx.shards[0].keys == ("k",) and not (folder / (INDEX_NAME + MAPPED_SUFFIX)).exists()
    tables = [p for p in os.listdir(cache) if p.endswith(MAPPED_SUFFIX)]
    assert len(tables) == 1
    built = idx.shards[0].keys.table.header["built"]
    for _ in range(3):  # read again in later processes (the per-process read forgotten)
        monkeypatch.setattr(index, "_READ", {})
        again = ShardIndex.read(folder)
        assert again.shards[0].keys.table.header["built"] == built  # reused, not rebuilt
    assert [p for p in os.listdir(cache) if p.endswith(MAPPED_SUFFIX)] == tables
    # the index rewritten: a new table, and the old one removed (they do not pile up)
    (folder / INDEX_NAME).write_text(f"{HEADER}\n{_entry_line('a.tar')}\n{_entry_line('b.tar')}\n")
    assert len(ShardIndex.read(folder).shards) == 2
    now = [p for p in os.listdir(cache) if p.endswith(MAPPED_SUFFIX)]
    assert len(now) == 1 and now != tables


def test_a_cached_table_cut_short_or_broken_is_built_again(tmp_path, monkeypatch):
    import speechpipe.index as index
    from speechpipe.compact import MAPPED_SUFFIX
    from speechpipe.node_cache import CACHE_ENV

    folder, cache = tmp_path / "ro", tmp_path / "cache"
    folder.mkdir()
    (folder / INDEX_NAME).write_text(
        HEADER + "\n" + json.dumps({"name": "a.tar", "count": 3, "bytes": 10,
                                    "keys": ["x", "y", "z"], "lengths": [1, 2, 3]}) + "\n")
    monkeypatch.setenv(CACHE_ENV, str(cache))
    _read_only(monkeypatch, folder)
    ShardIndex.read(folder)
    (table,) = [cache / p for p in os.listdir(cache) if p.endswith(MAPPED_SUFFIX)]
    whole = table.read_bytes()
    broken = {
        "cut short": whole[:len(whole) - 40],
        "a broken header": whole[:20] + b"#" * 30 + whole[50:],
        "not a table": b"nothing",
    }
    for what, data in broken.items():
        table.write_bytes(data)
        monkeypatch.setattr(index, "_READ", {})
        again = ShardIndex.read(folder)
        assert list(again.shards[0].keys) == ["x", "y", "z"], what
        assert again.lengths() == [1.0, 2.0, 3.0], what
        assert table.read_bytes() == whole or table.stat().st_size == len(whole), what


def _cached_corpus(tmp_path, monkeypatch, shards=3):
    from speechpipe.node_cache import CACHE_ENV

    folder, cache = tmp_path / "ro", tmp_path / "cache"
    folder.mkdir()
    lines = [HEADER] + [json.dumps({"name": f"s{i}.tar", "count": 3, "bytes": 10,
                                    "keys": [f"x{i}", f"y{i}", f"z{i}"],
                                    "lengths": [1 + i, 2 + i, 3 + i]}) for i in range(shards)]
    (folder / INDEX_NAME).write_text("\n".join(lines) + "\n")
    monkeypatch.setenv(CACHE_ENV, str(cache))
    _read_only(monkeypatch, folder)
    return folder, cache


def test_a_cached_table_with_corrupted_array_bytes_is_built_again(tmp_path, monkeypatch):
    # issue 28's leftover: the header and size whole, an array's bytes not (a crash before the
    # data reached the disk; a damaged disk): the CRC-32s in the header find it, once per
    # process
    import speechpipe.index as index
    import speechpipe.node_cache as node_cache
    from speechpipe.compact import MAPPED_SUFFIX

    folder, cache = _cached_corpus(tmp_path, monkeypatch)
    want = ShardIndex.read(folder).lengths()
    (table,) = [cache / p for p in os.listdir(cache) if p.endswith(MAPPED_SUFFIX)]
    header, _ = node_cache.read_mapped(str(table))
    assert set(header["sums"]) == set(header["arrays"])
    for array in ("lengths", "keys", "starts"):
        data = bytearray(table.read_bytes())
        at = header["arrays"][array]["offset"]
        data[at:at + 4] = b"\xff\xff\xff\x7f"
        (cache / "new").write_bytes(bytes(data))
        os.replace(cache / "new", table)
        monkeypatch.setattr(index, "_READ", {})
        monkeypatch.setattr(node_cache, "_CHECKED", {})  # a new process
        again = ShardIndex.read(folder)
        assert again.lengths() == want, array
        assert [list(s.keys) for s in again.shards] == [[f"x{i}", f"y{i}", f"z{i}"]
                                                       for i in range(3)], array
        header, arrays = node_cache.read_mapped(str(table))
        assert node_cache.array_sums(arrays) == header["sums"], array  # built again


def _read_in_child(folder, barrier, out):
    import warnings

    warnings.simplefilter("ignore")
    barrier.wait()
    out.put(ShardIndex.read(folder).lengths())


def test_without_flock_each_process_builds_its_cached_table_and_none_waits(tmp_path,
                                                                           monkeypatch):
    # issue 28's leftover: a cache folder on a file system without flock (some network file
    # systems): no lock, no hang; processes that start at once each build and rename a whole
    # file; a warning says it once
    import errno
    import fcntl
    import multiprocessing

    import speechpipe.compact as compact
    import speechpipe.node_cache as node_cache
    from speechpipe.compact import MAPPED_SUFFIX

    def no_flock(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    monkeypatch.setattr(node_cache, "_NO_FLOCK_WARNED", [])
    builds = str(tmp_path / "builds")
    real = compact.build_index_table

    def counted(*args, **kwargs):
        with open(builds, "a") as f:
            f.write("1\n")
        return real(*args, **kwargs)

    import speechpipe.index as index
    monkeypatch.setattr(index, "build_index_table", counted)
    folder, cache = _cached_corpus(tmp_path, monkeypatch)
    want = [1.0, 2.0, 3.0, 2.0, 3.0, 4.0, 3.0, 4.0, 5.0]
    context = multiprocessing.get_context("fork")
    barrier, out = context.Barrier(3), context.Queue()
    children = [context.Process(target=_read_in_child, args=(str(folder), barrier, out))
                for _ in range(3)]
    for child in children:
        child.start()
    got = [out.get(timeout=60) for _ in children]
    for child in children:
        child.join(30)
        assert child.exitcode == 0
    assert got == [want] * 3
    with open(builds) as f:
        assert 1 <= len(f.read().split()) <= 3
    tables = [p for p in os.listdir(cache) if p.endswith(MAPPED_SUFFIX)]
    assert len(tables) == 1  # one whole file stays
    monkeypatch.setattr(index, "_READ", {})
    os.remove(cache / tables[0])
    with pytest.warns(RuntimeWarning, match="no flock"):
        assert ShardIndex.read(folder).lengths() == want


def test_a_mapped_index_pickles_by_reference_and_maps_again(tmp_path):
    import speechpipe.compact as compact

    ShardIndex(str(tmp_path), [entry("a.tar", [100, 200]), entry("b.tar", [])]).write()
    idx = ShardIndex.read(tmp_path)
    data = pickle.dumps(idx)
    assert b"a.tar-1" not in data  # the keys stay in the table
    compact._REMAPPED.clear()
    again = pickle.loads(data)
    assert again.shards == idx.shards and isinstance(again.shards[0].keys, compact.MappedKeys)
    assert again.shards[1].lengths == () and again.shards[0].total_length == 300.0


def test_durations_from_index_finds_keys_in_the_mapped_table(tmp_path):
    import os

    import speechpipe as sp

    ShardIndex(str(tmp_path), [entry("a.tar", [100, 250])]).write()
    shard = os.path.join(str(tmp_path), "a.tar")
    samples = [{"key": "a.tar-1", "source": shard}, {"key": "a.tar-0", "source": shard}]
    out = list(sp.IterableWrapper(samples).durations_from_index())
    assert [s["duration"] for s in out] == [2.5, 1.0]
    with pytest.raises(DataError, match="key is not in its shard's entry"):
        list(sp.IterableWrapper([{"key": "nope", "source": shard}]).durations_from_index())


_INDEX_MEMORY_PROBE = """
import json, os, sys, tempfile
import speechpipe as sp
from speechpipe.index import ShardEntry, ShardIndex
from speechpipe.seeding import Position

def anonymous():
    with open("/proc/self/smaps_rollup") as f:
        fields = dict(line.split(":", 1) for line in f if ":" in line)
    return int(fields["Anonymous"].split()[0]) * 1024

def plan(folder):
    pipe = sp.IterableWrapper([folder]).sharded_shuffle(buffer_size=2000, index=True)
    mine = pipe.epoch_plan(position=Position(3, 8, 5, 8))  # what a worker plans
    assignment = sp.shard_assignment(pipe, world_size=8, num_workers=8)
    index = ShardIndex.read(folder)
    bounds = index.boundaries(30)
    lengths = [s.lengths for s in mine.shards]
    shards = [s.name for s in mine.shards] or [os.path.join(folder, "a.tar")]
    found = {os.path.join(folder, s.name): s for s in index.shards}[shards[0]]
    sample = {"key": found.keys[-1], "source": shards[0]}
    looked = list(sp.IterableWrapper([sample]).durations_from_index())
    return len(pipe), mine, assignment, bounds, lengths, index, looked

tiny = tempfile.mkdtemp()
ShardIndex(tiny, [ShardEntry("a.tar", 2, 10, ("u0", "u1"), (100.0, 200.0))]).write()
plan(tiny)  # the imports and code paths, warm
before = anonymous()
held = plan(sys.argv[1])
after = anonymous()
print(json.dumps({"anonymous": after - before, "count": held[0]}))
"""


@pytest.mark.slow
def test_a_worker_holds_under_16_bytes_per_utterance_of_a_million_utterance_index(tmp_path):
    # issue 28: ShardIndex.read parsed the index into Python tuples (about 130 B per
    # utterance in every process that planned an epoch). Now a process maps the table and
    # holds objects per shard only (500 here); the table's pages are file-backed and shared.
    # The bound is on Anonymous memory (the process's own), with 4 MiB for what planning
    # allocates besides.
    import subprocess
    import sys

    import numpy as np

    from speechpipe.testing import sample_durations

    n, per = 1_000_000, 2000
    frames = (np.round(sample_durations("wenetspeech-l", n, seed=0), 2) * 100).astype(int)
    with open(tmp_path / INDEX_NAME, "w") as f:
        f.write(HEADER + "\n")
        for s in range(0, n, per):
            f.write(json.dumps({"name": f"data-{s // per:05d}.tar", "count": per,
                                "bytes": 64000 * per,
                                "keys": [f"Y{i:010d}" for i in range(s, s + per)],
                                "lengths": frames[s:s + per].tolist()}) + "\n")
    ShardIndex.read(tmp_path)  # builds the table beside it, as pack's merge writes it
    out = subprocess.run([sys.executable, "-c", _INDEX_MEMORY_PROBE, str(tmp_path)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["count"] == n
    assert got["anonymous"] < 16 * n + 4 * 2**20, got


def test_step_planner_counts_budget_batches_from_the_mapped_lengths(tmp_path):
    # issue 28: the lower bound measured an IndexLength per utterance; now each distinct
    # length once, the sums in arrays -- the same counts, and a worker with no shard counts 0
    import math

    import speechpipe as sp

    lengths = [[150, 300, 450], [1200, 80], [300, 300, 300, 300], [2500]]
    ShardIndex(str(tmp_path), [entry(f"s{i}.tar", ls) for i, ls in enumerate(lengths)]).write()
    pipe = sp.IterableWrapper([str(tmp_path)]).sharded_shuffle(index=True)
    budget = sp.PaddedArea(10.0, length="duration")
    plan = sp.StepPlanner(pipe, budget, num_workers=3, world_size=2).plan()
    expected = []
    for rank in pipe.epoch_plans(world_size=2, num_workers=3):
        total = 0
        for worker in rank:
            seconds = [n / 100 for s in worker.shards for n in s.lengths]
            normal = [x for x in seconds if x <= 10.0]
            total += ((max(1, math.ceil(sum(normal) / 10.0)) if normal else 0)
                      + len(seconds) - len(normal))
        expected.append(total)
    assert plan.rank_batches == tuple(expected) and not plan.exact
    assert 0 in [len(w.shards) for r in pipe.epoch_plans(world_size=2, num_workers=3) for w in r]


def test_step_planner_hands_a_callable_one_object_per_distinct_length(tmp_path):
    # issue 28: with a callable, StepPlanner made an IndexLength per utterance of each
    # worker (about 70 B each at the planning's peak); from the mapped table it makes one per
    # distinct length and hands the batching references to them, in the same order
    import gc
    import tracemalloc

    import numpy as np

    import speechpipe as sp
    from speechpipe.pipes.batching import IndexLength

    n, per = 60_000, 2000
    rng = np.random.default_rng(0)
    frames = rng.integers(100, 1500, n).tolist()  # ~1,400 distinct lengths
    ShardIndex(str(tmp_path), [entry(f"s{i:03d}.tar", frames[s:s + per])
                               for i, s in enumerate(range(0, n, per))]).write()
    pipe = sp.IterableWrapper([str(tmp_path)]).sharded_shuffle(buffer_size=500, index=True,
                                                               seed=3)
    seen = []

    def batching(lengths):
        seen.append((len(lengths), len({id(x) for x in lengths}), lengths[:50]))
        return sp.IterableWrapper(lengths, deepcopy=False).batch(64)

    planner = sp.StepPlanner(pipe, batching, num_workers=2, world_size=2)
    gc.collect()
    tracemalloc.start()
    plan = planner.plan(0)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    distinct = len(set(frames))
    assert sum(count for count, _, _ in seen) == n
    assert all(objects <= distinct for _, objects, _ in seen)  # not one per utterance
    assert all(type(x) is IndexLength and x.unit == "frames" for *_, xs in seen for x in xs)
    # the same order and counts as one object per length would give
    expected = []
    for rank in pipe.epoch_plans(0, world_size=2, num_workers=2):
        total = 0
        for worker in rank:
            own = [IndexLength(x, "frames") for s in worker.shards for x in s.lengths]
            ordered = list(pipe.sample_order(worker, own))
            total += -(-len(ordered) // 64)
            assert any(ordered[:50] == xs for *_, xs in seen)
        expected.append(total)
    assert plan.rank_batches == tuple(expected)
    # a worker's list of references (a quarter of n here): 8 B per utterance, not an
    # object of ~40 B + 8 B each (about 6 B per utterance of n at the peak, 20 before)
    assert peak < 12 * n, peak
