"""Mapped row tables of manifests (speechpipe/compact.py) and the road that uses them
(issue 28): ``read_manifest_files`` -> ``filter_by_duration`` -> ``shuffle_samples`` orders
the rows from a memory-mapped sidecar without holding them, and parses a row when it yields it.

Invariant: the mapped road yields exactly what the same pipe over the rows held in a list
yields (same samples, same order for a seed and epoch, same drop counts), resumes exactly,
and refuses the same malformed input with the same messages.
"""

from __future__ import annotations

import gzip
import json
import os
import stat
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import speechpipe as sp
from speechpipe.compact import MAPPED_SUFFIX, ManifestTable
from speechpipe.node_cache import read_mapped
from speechpipe.errors import DataError
from speechpipe.pipes.sources import read_manifest
from speechpipe.pipes.sources import write_manifest_table
from speechpipe.pipes.sources._selection import EXAMPLES
from speechpipe.sample import sample_duration


def _rows(n: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"key": f"utt{i:05d}", "duration": round(float(rng.uniform(0.2, 12.0)), 3),
             "text": f"words of {i} é", "audio_path": f"/a/{i}.flac"} for i in range(n)]


def _write(path, rows: list[dict], *, blank_every: int = 0) -> str:
    lines = []
    for i, row in enumerate(rows):
        lines.append(json.dumps(row, ensure_ascii=False) + "\n")
        if blank_every and i % blank_every == 0:
            lines.append("  \n")
    data = "".join(lines).encode("utf-8")
    path = str(path)
    if path.endswith(".gz"):
        data = gzip.compress(data, mtime=0)
    with open(path, "wb") as f:
        f.write(data)
    return path


def _keys(pipe) -> list[str]:
    return [s["key"] for s in pipe]


def mapped(paths, low=None, high=None, seed=3):
    return (sp.IterableWrapper(list(paths)).read_manifest_files()
            .filter_by_duration(low, high, warn=False).shuffle_samples(seed=seed))


def listed(paths, low=None, high=None, seed=3):
    rows = [s for p in paths for s in read_manifest(p)]
    return (sp.IterableWrapper(rows).filter_by_duration(low, high, warn=False)
            .shuffle_samples(seed=seed))


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_mapped_road_yields_what_the_list_road_yields(tmp_path, suffix):
    a = _write(tmp_path / f"a{suffix}", _rows(300), blank_every=7)
    b = _write(tmp_path / f"b{suffix}", _rows(200, seed=1)[:0] + [
        {**r, "key": "b" + r["key"]} for r in _rows(200, seed=1)])
    pipe, ref = mapped([a, b], 1.0, 10.0), listed([a, b], 1.0, 10.0)
    for epoch in range(2):
        got = list(pipe.set_epoch(epoch))
        want = list(ref.set_epoch(epoch))
        assert got == want  # whole samples, ``source`` ("path:line") included
    assert dict(pipe.source_datapipe.diagnostics.counts) == dict(
        ref.source_datapipe.diagnostics.counts)
    assert pipe.source_datapipe.diagnostics.examples == ref.source_datapipe.diagnostics.examples
    assert os.path.exists(a + MAPPED_SUFFIX) and os.path.exists(b + MAPPED_SUFFIX)


def test_the_shuffle_holds_no_row_and_parses_only_what_it_yields(tmp_path, monkeypatch):
    path = _write(tmp_path / "m.jsonl", _rows(500))
    write_manifest_table(path)
    import speechpipe.pipes.sources._manifests as manifests

    parsed = []
    real = manifests._parse_json_line
    monkeypatch.setattr(manifests, "_parse_json_line",
                        lambda *a: parsed.append(a[1]) or real(*a))
    pipe = mapped([path])
    it = iter(pipe)
    first = [next(it) for _ in range(5)]
    assert len(parsed) == 5  # the table was current: no line parsed but those yielded
    assert pipe.buffers.peak_samples == 0  # the list road holds all 500 for the pass
    assert [s["key"] for s in first] == _keys(listed([path]))[:5]


def test_a_table_is_reused_while_current_and_rebuilt_when_stale(tmp_path):
    path = _write(tmp_path / "m.jsonl.gz", _rows(50))
    sidecar = write_manifest_table(path)
    built = os.stat(sidecar).st_mtime_ns
    assert _keys(mapped([path])) == _keys(listed([path]))
    assert os.stat(sidecar).st_mtime_ns == built  # mapped, not rebuilt
    _write(path, _rows(80, seed=5))  # the manifest changes: size and mtime
    os.utime(path, ns=(built + 10**9, built + 10**9))
    assert sorted(_keys(mapped([path]))) == sorted(r["key"] for r in _rows(80))
    header, _ = read_mapped(sidecar)
    assert header["rows"] == 80


def test_a_pipe_keeps_its_tables_across_passes_and_refreshes_a_stale_one(tmp_path):
    path = _write(tmp_path / "m.jsonl", _rows(40))
    reader = sp.IterableWrapper([path]).read_manifest_files()
    first = reader.row_table().tables[0]
    assert reader.row_table().tables[0] is first
    _write(path, _rows(41))
    os.utime(path, ns=(1, 1))
    again = reader.row_table().tables[0]
    assert again is not first and len(again) == 41


def test_the_table_can_be_read_by_whoever_reads_the_manifest(tmp_path):
    path = _write(tmp_path / "m.jsonl.gz", _rows(5))
    os.chmod(path, 0o640)
    assert stat.S_IMODE(os.stat(write_manifest_table(path)).st_mode) == 0o640


def test_a_corrupt_sidecar_is_rebuilt(tmp_path):
    path = _write(tmp_path / "m.jsonl", _rows(30))
    with open(path + MAPPED_SUFFIX, "wb") as f:
        f.write(b"not a table")
    assert _keys(mapped([path])) == _keys(listed([path]))
    assert read_mapped(path + MAPPED_SUFFIX)[0]["rows"] == 30


def _read_only(monkeypatch, folder):
    """``folder`` cannot be written (root writes anyway: os.access says no for it)."""
    real = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: (
        False if os.path.abspath(path) == str(folder) else real(path, mode)))


def test_a_read_only_folder_without_a_usable_cache_holds_the_table_in_memory(
        tmp_path, monkeypatch):
    from speechpipe.node_cache import CACHE_ENV

    folder = tmp_path / "ro"
    folder.mkdir()
    path = _write(folder / "m.jsonl.gz", _rows(30))
    (tmp_path / "a-file").write_text("x")
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "a-file" / "cache"))  # cannot be made
    _read_only(monkeypatch, folder)
    monkeypatch.setattr(sp.compact, "write_mapped", _refused)  # as the folder would
    with pytest.warns(RuntimeWarning, match="cache folder"), \
            pytest.warns(UserWarning, match=r"m\.jsonl\.gz: could not write its row table"):
        got = _keys(mapped([path]))
    assert got == _keys(listed([path]))


def _refused(*args, **kwargs):
    raise PermissionError(13, "Permission denied")


def test_a_state_resumes_at_the_next_sample_and_held_samples_are_found_by_key(tmp_path):
    path = _write(tmp_path / "m.jsonl.gz", _rows(120))
    pipe = mapped([path], 1.0)
    full = _keys(pipe.set_epoch(2))
    it = iter(pipe.set_epoch(2))
    head = [next(it)["key"] for _ in range(17)]
    state = pipe.state_dict()
    assert set(state) == {"epoch", "next", "total", "count"}  # a few ints, whatever the size
    it.close()
    again = mapped([path], 1.0).set_epoch(2)  # the loader sets the epoch of a resumed run
    again.load_state_dict(state)
    assert head + _keys(again) == full
    # a stage above asks for samples it held again, by key
    again.request_replay([(None, full[3]), (None, full[0])])
    assert _keys(again) == [full[3], full[0]]


def test_a_manifest_road_loader_resumes_exactly_with_workers(tmp_path):
    path = _write(tmp_path / "m.jsonl", _rows(90))
    constraint = sp.PaddedArea(budget=20.0, length=sample_duration)
    make = lambda: mapped([path], 1.0).block_batch(constraint, seed=1)  # noqa: E731
    loader = sp.build_loader(make(), num_workers=2, persistent_workers=True, seed=0,
                             snapshot_every=1)
    loader.set_epoch(1)
    full, state = [], None
    for step, batch in enumerate(loader):
        full.append([s["key"] for s in batch])
        if step == 2:
            state = loader.state_dict()
    again = sp.build_loader(make(), num_workers=2, persistent_workers=True, seed=0,
                            snapshot_every=1)
    again.load_state_dict(state)
    assert [[s["key"] for s in b] for b in again] == full[3:]


# ------------------------------------------------------------------------------ bad input


def test_a_duplicate_key_in_a_file_names_both_lines(tmp_path):
    rows = _rows(10)
    rows[7]["key"] = rows[2]["key"]
    path = _write(tmp_path / "m.jsonl", rows)
    with pytest.raises(DataError, match=r"m\.jsonl:8: duplicate key 'utt00002', first on "
                                        r"line 3"):
        list(mapped([path]))
    assert not os.path.exists(path + MAPPED_SUFFIX)


def test_a_key_in_two_files_is_named(tmp_path):
    a = _write(tmp_path / "a.jsonl", _rows(5))
    b = _write(tmp_path / "b.jsonl", [{"key": "zz", "duration": 2.0}, _rows(5)[3]])
    with pytest.raises(DataError, match=r"b\.jsonl:2 \(key 'utt00003'\): shuffle_samples: "
                                        r"the same key twice"):
        list(mapped([a, b]))


def test_a_malformed_line_names_the_file_and_line(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"key": "a", "duration": 1}\n{"key": "b", "duration": \n')
    with pytest.raises(DataError, match=r"m\.jsonl:2: invalid JSON at column"):
        list(mapped([str(path)]))


def test_invalid_utf8_names_the_line(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_bytes(b'{"key": "a", "duration": 1}\n{"key": "\xff", "duration": 1}\n')
    with pytest.raises(DataError, match=r"m\.jsonl:2: not valid UTF-8"):
        list(mapped([str(path)]))


def test_a_truncated_gzip_manifest_is_named(tmp_path):
    path = _write(tmp_path / "m.jsonl.gz", _rows(400))
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2])
    with pytest.raises(DataError, match=r"m\.jsonl\.gz: truncated or corrupt gzip stream "
                                        r"after line \d+"):
        list(mapped([path]))
    assert not os.path.exists(path + MAPPED_SUFFIX)
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp") or n.endswith(".txt")]


def test_a_row_without_duration_under_the_filter_is_named_as_in_a_pass(tmp_path):
    rows = _rows(6)
    del rows[4]["duration"]
    path = _write(tmp_path / "m.jsonl", rows)
    with pytest.raises(DataError) as listed_error:
        list(listed([path], 1.0))
    with pytest.raises(DataError) as mapped_error:
        list(mapped([path], 1.0))
    assert str(mapped_error.value) == str(listed_error.value)
    assert "m.jsonl:5 (key 'utt00004'): filter_by_duration: no duration" in str(
        mapped_error.value)


def test_a_bom_blank_lines_and_a_last_line_without_newline_are_read_as_the_parser_does(
        tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_bytes('\ufeff{"key": "a", "duration": 1}\n\n \t\n{"key": "b", "duration": 2}'
                     .encode("utf-8"))
    table = ManifestTable.open(str(path), lambda n, t: json.loads(t))
    assert table.lines.tolist() == [1, 4]
    assert sorted(mapped([str(path)]), key=lambda s: s["key"]) == list(read_manifest(str(path)))


def test_tsv_and_skipping_readers_take_the_list_road(tmp_path):
    tsv = tmp_path / "m.tsv"
    tsv.write_text("key\tduration\na\t1.0\nb\t2.0\n")
    assert sp.IterableWrapper([str(tsv)]).read_manifest_files().row_table() is None
    js = _write(tmp_path / "m.jsonl", _rows(3))
    skipping = sp.IterableWrapper([js]).read_manifest_files(on_error="skip")
    assert skipping.row_table() is None
    assert sorted(_keys(skipping.shuffle_samples(seed=0))) == [r["key"] for r in _rows(3)]


# ------------------------------------------------------------------ memory at a million rows

_MEMORY_PROBE = textwrap.dedent("""
    import json, os, sys, tempfile
    import speechpipe as sp
    from speechpipe.pipes.sources import write_manifest

    def private():
        with open("/proc/self/smaps_rollup") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        return {k: int(fields[k].split()[0]) * 1024 for k in ("Anonymous", "Private_Dirty")}

    def pipe(path):
        return (sp.IterableWrapper([path]).read_manifest_files()
                .filter_by_duration(1.0, 15.0, warn=False).shuffle_samples(seed=0))

    tiny = os.path.join(tempfile.mkdtemp(), "tiny.jsonl")
    write_manifest(tiny, [{"key": f"u{i}", "duration": 2.0} for i in range(50)])
    list(pipe(tiny))  # the imports and code paths, warm: what the big pass costs comes after
    before = private()
    big = pipe(sys.argv[1])
    it = iter(big)
    first = [next(it)["key"] for _ in range(1000)]
    after = private()
    print(json.dumps({"anonymous": after["Anonymous"] - before["Anonymous"],
                      "private": after["Private_Dirty"] - before["Private_Dirty"],
                      "count": big.state_dict()["count"]}))
""")


@pytest.fixture(scope="session")
def million_row_manifest(tmp_path_factory):
    """A 1M-row manifest with WenetSpeech L's durations, written with numpy, and its table."""
    from speechpipe.testing import sample_durations

    n = 1_000_000
    seconds = np.round(sample_durations("wenetspeech-l", n, seed=0), 3)
    keys = np.char.add("Y", np.char.zfill(np.arange(n).astype(str), 10))
    lines = np.char.add(np.char.add(np.char.add('{"key": "', keys), '", "duration": '),
                        seconds.astype(str))
    lines = np.char.add(lines, ', "text": "\u4eca\u5929\u5929\u6c14\u5f88\u597d"}\n')
    path = tmp_path_factory.mktemp("million") / "wenet_l.jsonl"
    path.write_bytes("".join(lines.tolist()).encode("utf-8"))
    write_manifest_table(str(path))
    return str(path), int(((seconds >= 1.0) & (seconds <= 15.0)).sum())


def test_a_worker_holds_under_16_bytes_per_row_of_a_million_row_manifest(
        million_row_manifest):
    # issue 28: shuffle_samples read the whole manifest in every worker (1,391 B/row). Now a
    # pass holds two int32 arrays (the rows kept by the filter, the permutation): 8 B/row of
    # anonymous memory, the process's own. The table's and the manifest's pages are
    # file-backed: the page cache holds them once for every process that maps them (while
    # one process alone maps them they count as its Private_*, dirty even, for a file just
    # written and not yet flushed, as here: so the bound is on Anonymous). Allowance: 4 MiB
    # for what a pass allocates besides (1,000 parsed rows, numpy temporaries the allocator
    # keeps).
    path, kept = million_row_manifest
    out = subprocess.run([sys.executable, "-c", _MEMORY_PROBE, path], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["count"] == kept
    assert got["anonymous"] < 16 * 1_000_000 + 4 * 2**20, got


def test_the_duration_filter_reads_the_mapped_durations_in_chunks_to_the_same_result(
        tmp_path, monkeypatch):
    # issue 28: the filter compared all of a table's durations at once (temporaries of the
    # corpus's size: 0.96 s of the 2.2 s to the first batch at 15M rows); now 2**20 at a time
    import speechpipe.pipes.sources._selection as selection

    rows = [{"key": f"u{i:03d}", "duration": [0.5, 3.0, 20.0][i % 3]} for i in range(40)]
    path = _write(tmp_path / "m.jsonl", rows)

    def run():
        pipe = sp.IterableWrapper([path]).read_manifest_files().filter_by_duration(
            1.0, 15.0, warn=False)
        kept = sorted(_keys(pipe.shuffle_samples(seed=0)))
        return kept, dict(pipe.diagnostics.counts), dict(pipe.diagnostics.examples)

    whole = run()
    for name in os.listdir(tmp_path):  # the selection written by the first run
        if ".within-" in name:
            os.remove(tmp_path / name)
    monkeypatch.setattr(selection, "CHUNK", 7)
    assert run() == whole
    assert whole[1] == {"shorter than 1.0 s": 14, "longer than 15.0 s": 13}
    assert len(whole[0]) == 13 and whole[2]["shorter than 1.0 s"][0].startswith("key 'u000'")


# ------------------------------------------------- the duration filter's selection, mapped


class _CountingDurations(np.ndarray):
    """A table's durations that count the values read through them (slices and items)."""

    read = 0

    def __getitem__(self, item):
        out = np.ndarray.__getitem__(self, item)
        _CountingDurations.read += int(np.size(out))
        return out.view(np.ndarray) if isinstance(out, np.ndarray) else out


@pytest.fixture
def counted_durations(monkeypatch):
    real = ManifestTable.__init__

    def init(self, *args, **kwargs):
        real(self, *args, **kwargs)
        self.durations = self.durations.view(_CountingDurations)

    monkeypatch.setattr(ManifestTable, "__init__", init)
    _CountingDurations.read = 0
    return _CountingDurations


def test_the_selection_is_computed_once_and_mapped_by_later_passes_and_pipes(
        tmp_path, counted_durations):
    # issue 28: filter_by_duration compared every row's duration at the start of every pass
    # in every process (15M rows: 0.1-0.3 s before the first batch, growing with the
    # corpus). Now the first pass writes the selection beside the manifest and every later
    # pass and process maps it: a pass reads only the examples' durations.
    path = _write(tmp_path / "m.jsonl.gz", _rows(3000))
    write_manifest_table(path)
    ref = listed([path], 1.0, 10.0)
    pipe = mapped([path], 1.0, 10.0)
    assert list(pipe) == list(ref)
    assert counted_durations.read >= 3000  # the first pass computes it
    for epoch, make in ((1, lambda: pipe), (2, lambda: mapped([path], 1.0, 10.0))):
        counted_durations.read = 0
        again = make()  # the next pass; a pipe of another process (its own tables)
        assert list(again.set_epoch(epoch)) == list(ref.set_epoch(epoch))
        # the examples' (at most 16 per bound), not the rows'
        assert counted_durations.read <= 2 * EXAMPLES, counted_durations.read
        assert dict(again.source_datapipe.diagnostics.counts) == dict(
            ref.source_datapipe.diagnostics.counts)
        assert again.source_datapipe.diagnostics.examples == \
            ref.source_datapipe.diagnostics.examples
    names = sorted(os.listdir(tmp_path))
    assert names == ["m.jsonl.gz", "m.jsonl.gz.spmap", "m.jsonl.gz.within-1.0-10.0.spmap"]


def test_workers_map_the_selection_that_the_first_process_wrote(tmp_path):
    path = _write(tmp_path / "m.jsonl", _rows(400))
    constraint = sp.PaddedArea(budget=30.0, length=sample_duration)
    make = lambda: mapped([path], 1.0, 10.0).block_batch(constraint, seed=1)  # noqa: E731
    alone = [[s["key"] for s in b] for b in sp.build_loader(make(), num_workers=0, seed=0)]
    selection = path + ".within-1.0-10.0" + MAPPED_SUFFIX
    written = os.stat(selection)
    loader = sp.build_loader(make(), num_workers=2, seed=0)
    got = [[s["key"] for s in b] for b in loader]
    assert sorted(k for b in got for k in b) == sorted(k for b in alone for k in b)
    now = os.stat(selection)
    assert (now.st_ino, now.st_mtime_ns) == (written.st_ino, written.st_mtime_ns)


def test_a_stale_or_corrupt_selection_is_computed_again(tmp_path, counted_durations):
    path = _write(tmp_path / "m.jsonl", _rows(200))
    selection = path + ".within-1.0-none" + MAPPED_SUFFIX
    assert _keys(mapped([path], 1.0)) == _keys(listed([path], 1.0))
    built = os.stat(path).st_mtime_ns
    _write(path, _rows(260, seed=4))  # new durations: the table and the selection are stale
    os.utime(path, ns=(built + 10**9, built + 10**9))
    pipe = mapped([path], 1.0)
    assert list(pipe) == list(listed([path], 1.0))
    assert read_mapped(selection)[0]["rows"] == 260
    with open(selection, "wb") as f:
        f.write(b"SPMAP\x00v1 cut short")
    counted_durations.read = 0
    ref = listed([path], 1.0)
    assert list(pipe.set_epoch(0)) == list(ref)
    assert counted_durations.read >= 260
    assert dict(pipe.source_datapipe.diagnostics.counts) == dict(
        ref.source_datapipe.diagnostics.counts)


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_a_read_only_manifest_folder_keeps_its_table_and_selection_in_the_node_cache(
        tmp_path, monkeypatch, counted_durations, suffix):
    # issue 28's leftover: they went to the temporary folder (the selection) or were held in
    # each process's memory (the table); now in the node's cache folder, as index tables
    from speechpipe.node_cache import CACHE_ENV

    folder, cache = tmp_path / "ro", tmp_path / "cache"
    folder.mkdir()
    path = _write(folder / f"m{suffix}", _rows(100))
    monkeypatch.setenv(CACHE_ENV, str(cache))
    _read_only(monkeypatch, folder)
    assert _keys(mapped([path], 2.0, 9.0)) == _keys(listed([path], 2.0, 9.0))
    assert os.listdir(folder) == [os.path.basename(path)]
    files = sorted(n for n in os.listdir(cache) if n.endswith(MAPPED_SUFFIX))
    assert [n.split("-")[0] for n in files] == ["rows", "within"]
    stamps = {n: os.stat(cache / n).st_mtime_ns for n in files}
    counted_durations.read = 0
    for _ in range(2):  # later pipes and processes map both
        assert _keys(mapped([path], 2.0, 9.0)) == _keys(listed([path], 2.0, 9.0))
    assert counted_durations.read <= 4 * EXAMPLES
    assert {n: os.stat(cache / n).st_mtime_ns for n in files} == stamps  # not rebuilt
    _write(path, _rows(120))  # the manifest rewritten: new versions, the old ones removed
    assert _keys(mapped([path], 2.0, 9.0)) == _keys(listed([path], 2.0, 9.0))
    now = sorted(n for n in os.listdir(cache) if n.endswith(MAPPED_SUFFIX))
    assert len(now) == 2 and not set(now) & set(files)


@pytest.mark.parametrize("which", ["rows", "within"])
def test_a_node_cached_table_or_selection_with_corrupted_bytes_is_built_again(
        tmp_path, monkeypatch, which):
    # issue 28's leftover: a header and size intact, an array's bytes not (a crash before the
    # data reached the disk): the CRC-32s in the header find it
    import speechpipe.node_cache as node_cache
    from speechpipe.node_cache import CACHE_ENV

    folder, cache = tmp_path / "ro", tmp_path / "cache"
    folder.mkdir()
    path = _write(folder / "m.jsonl.gz", _rows(200))
    monkeypatch.setenv(CACHE_ENV, str(cache))
    _read_only(monkeypatch, folder)
    want = _keys(listed([path], 2.0, 9.0))
    assert _keys(mapped([path], 2.0, 9.0)) == want
    (name,) = [n for n in os.listdir(cache) if n.startswith(which + "-")
               and n.endswith(MAPPED_SUFFIX)]
    place = str(cache / name)
    header, _ = read_mapped(place)
    array = "durations" if which == "rows" else "kept"
    at = header["arrays"][array]["offset"] + 8
    with open(place, "rb") as f:
        data = bytearray(f.read())
    data[at:at + 8] = bytes(8)  # zeros, as a block that never reached the disk
    with open(place + ".new", "wb") as f:
        f.write(data)
    os.replace(place + ".new", place)  # a new file: maps taken before keep their pages
    monkeypatch.setattr(node_cache, "_CHECKED", {})  # a new process
    assert _keys(mapped([path], 2.0, 9.0)) == want
    header, arrays = read_mapped(place)
    assert node_cache.array_sums(arrays) == header["sums"]  # built again, whole


def test_mapped_rows_are_read_in_blocks_each_parsed_when_taken(tmp_path, monkeypatch):
    # issue 28: a row read at random in a 2 GB text cost a page fault each (and three Python
    # calls into the arrays): now a block of rows' offsets and line numbers is gathered at
    # once and their bytes read with pread, each row parsed when its turn comes
    import speechpipe.pipes.order._lists as lists

    path = _write(tmp_path / "m.jsonl.gz", _rows(1500))
    write_manifest_table(path)
    blocks = []
    real = ManifestTable.rows_at
    monkeypatch.setattr(ManifestTable, "rows_at",
                        lambda self, rows: blocks.append(len(rows)) or real(self, rows))
    monkeypatch.setattr(lists, "READ_AHEAD", 100)
    pipe = mapped([path], 1.0)
    got = list(pipe)
    assert got == list(listed([path], 1.0))
    reads = [n for n in blocks if n > 1]  # a block per 100 rows (single rows: the examples)
    assert len(reads) == -(-len(got) // 100) and sum(reads) == len(got)


def test_rows_read_at_once_are_the_rows_and_survive_a_replaced_sidecar(tmp_path):
    for name in ("m.jsonl", "m.jsonl.gz"):
        path = _write(tmp_path / name, _rows(60), blank_every=5)
        table = ManifestTable.open(path, lambda n, t: json.loads(t))
        assert table.text_file is not None  # read with pread from the mapped file
        order = np.random.default_rng(0).permutation(60)
        assert table.rows_at(order) == [table.row(i) for i in order.tolist()]
        before = table.rows_at(np.arange(60))
        os.remove(path + MAPPED_SUFFIX)
        os.remove(path)
        _write(path, _rows(60, seed=9))  # a new file (inode): the old mapping stays valid
        ManifestTable.open(path, lambda n, t: json.loads(t))
        assert table.rows_at(np.arange(60)) == before
