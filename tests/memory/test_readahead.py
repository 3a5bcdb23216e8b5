"""The read-ahead thread of mapped shards (speechpipe.memory._readahead).

What is checked, on real files with their pages evicted from the page cache
(``posix_fadvise(DONTNEED)``; skipped where the file system keeps them, as tmpfs does):

- a helper starts for a large file, not for a small one or when not wanted
  (``ShardReadOptions(readahead=False)``), nor for a file in the page cache (residency
  sampled over the whole file);
- it brings the pages ahead of the reader into the page cache (``mincore``) but not into this
  process's page table (``/proc/self/pagemap``'s present bit: they do not count in RSS), no
  further than its window past the reader, and follows the reader when told where it is;
- ``stop`` ends the thread and closes its descriptor, early or at the end;
- through ``iter_tar_members`` and ``sharded_shuffle``, a cold shard is read with a helper and
  the members are those of the reading path; a reader that finishes first leaves its helper to
  read the rest; a shard cut while it is read still raises the shrinking ``DataError`` (the
  helper's short read ends it quietly);
- forked DataLoader workers start their own helpers and give the batches of read-ahead off.
"""

from __future__ import annotations

import ctypes
import io
import mmap
import os
import struct
import sys
import threading
import time

import numpy as np
import pytest
import torch

import speechpipe  # noqa: F401  (registers the pipes)
from speechpipe.errors import DataError
from speechpipe.memory import _readahead
from speechpipe.pipes._core import IterableWrapper
from speechpipe.pipes.shards import ShardReadOptions, iter_tar_members
from speechpipe.pipes.shards import ShardWriter

MIB = 1 << 20
PAGE = mmap.PAGESIZE
THREAD = "speechpipe-shard-readahead"

MAPPED = ShardReadOptions(mmap=True)
NO_READAHEAD = ShardReadOptions(readahead=False)

pytestmark = pytest.mark.skipif(not _readahead.supported(),
                                reason="read-ahead helpers are Linux-only")


@pytest.fixture
def small_window(monkeypatch):
    """1 MiB chunks, a 4 MiB window and helpers from 2 MiB: the behaviour at test sizes."""
    monkeypatch.setattr(_readahead, "_CHUNK", 1 * MIB)
    monkeypatch.setattr(_readahead, "_BUFFER", 256 << 10)
    monkeypatch.setattr(_readahead, "_AHEAD", 4 * MIB)
    monkeypatch.setattr(_readahead, "_MIN_SIZE", 2 * MIB)


def evict(path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # dirty pages are not dropped
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def resident(mapping: mmap.mmap) -> np.ndarray:
    """Per page of ``mapping``: in the page cache (mincore)."""
    libc = _readahead._load_libc()
    pages = -(-len(mapping) // PAGE)
    vector = (ctypes.c_ubyte * pages)()
    assert libc.mincore(_readahead._address(mapping), len(mapping), vector) == 0
    return np.frombuffer(bytes(vector), np.uint8) & 1 == 1


def present(mapping: mmap.mmap) -> np.ndarray:
    """Per page of ``mapping``: in this process's page table (pagemap bit 63)."""
    first = _readahead._address(mapping) // PAGE
    pages = -(-len(mapping) // PAGE)
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(first * 8)
        entries = struct.unpack(f"{pages}Q", f.read(pages * 8))
    return np.array([(e >> 63) & 1 == 1 for e in entries])


def cold_file(path, size: int):
    """A file of random bytes, written, synced and evicted; skips if eviction does not work."""
    path.write_bytes(np.random.default_rng(0).bytes(size))
    evict(path)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        if resident(m).mean() > 0.1:
            pytest.skip("this file system keeps evicted pages (tmpfs?)")
    return path


def wait_until(condition, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.005)


def waiting(helper: _readahead.ReadAhead) -> bool:
    """The helper has stopped at its window and waits for the reader."""
    return helper.resume_at != float("inf") and not helper._wake.is_set()


def helper_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name == THREAD)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_helper_reads_a_window_ahead_of_the_reader_then_follows_it(tmp_path, small_window):
    path = cold_file(tmp_path / "big.bin", 16 * MIB)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        helper = _readahead.start_readahead(m, f.fileno(), 0)
        assert helper is not None
        wait_until(lambda: waiting(helper))
        window = 4 * MIB // PAGE
        assert helper.reached == helper.copied == 4 * MIB
        assert resident(m)[:window].all()
        # In the page cache, not in this process's page table: pages read ahead do not count
        # in RSS (issue 23.8) -- the reader's buffers put them far from their first touch.
        assert not present(m).any()
        helper.advance(6 * MIB)  # the reader has got to 6 MiB
        wait_until(lambda: helper.reached == 10 * MIB and waiting(helper))
        assert resident(m)[:10 * MIB // PAGE].all()
        helper.advance(16 * MIB)
        wait_until(lambda: not helper.alive)  # the end of the file ends it
        assert helper.copied == 16 * MIB
        assert resident(m).all() and not present(m).any()
        helper.stop()


def test_stop_ends_the_helper_and_closes_its_descriptor(tmp_path, small_window):
    path = cold_file(tmp_path / "big.bin", 16 * MIB)
    before = open_fds()
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        mapped_fds = open_fds()
        helper = _readahead.start_readahead(m, f.fileno(), 0)
        assert open_fds() == mapped_fds + 1  # the helper's own descriptor
        wait_until(lambda: waiting(helper))  # it waits for a reader that never comes
        helper.stop()
        assert not helper.alive and helper_threads() == 0
        assert open_fds() == mapped_fds
        assert helper.reached == 4 * MIB  # it did not go on after being stopped
    assert open_fds() == before


def test_no_helper_for_a_small_file_or_when_switched_off(tmp_path, small_window):
    path = cold_file(tmp_path / "big.bin", 8 * MIB)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        assert _readahead.start_readahead(m, f.fileno(), 7 * MIB) is None  # 1 MiB left: under 2 MiB
        assert _readahead.start_readahead(m, f.fileno(), 0, False) is None
    assert helper_threads() == 0


def test_a_file_in_the_page_cache_gets_no_helper(tmp_path, small_window):
    path = cold_file(tmp_path / "big.bin", 8 * MIB)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        while f.read(MIB):  # now every page is in the page cache
            pass
        assert resident(m).all()
        assert _readahead.start_readahead(m, f.fileno(), 0) is None  # nothing to read
    assert helper_threads() == 0


def test_residency_is_sampled_over_the_whole_file(tmp_path, small_window):
    """A file whose beginning only was read is read by a helper; one read through gets none."""
    path = cold_file(tmp_path / "big.bin", 32 * MIB)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        f.read(4 * MIB)  # with the kernel's read-ahead, some MiB more
        assert resident(m)[:4 * MIB // PAGE].all() and not resident(m)[-MIB // PAGE:].any()
        helper = _readahead.start_readahead(m, f.fileno(), 0)
        assert helper is not None
        helper.stop()
        while f.read(MIB):
            pass
        assert _readahead.start_readahead(m, f.fileno(), 0) is None


def feature_shards(tmp_path, *, count: int, per_shard: int, frames: tuple[int, int],
                   seed: int, prefix: str = "u"):
    """``count`` float32 feature matrices of ``frames[0] + frames[1] * i`` frames x 80, as
    ``{"key", "feats.npy", "txt"}`` samples in shards of ``per_shard``: (paths, features)."""
    rng = np.random.default_rng(seed)
    feats = {f"{prefix}{i:02d}": rng.standard_normal((frames[0] + frames[1] * i, 80),
                                                      dtype=np.float32)
             for i in range(count)}
    with ShardWriter(str(tmp_path / "d-%05d.tar"), maxcount=per_shard) as writer:
        for key, value in feats.items():
            writer.write({"key": key, "feats.npy": value, "txt": key})
    return writer.paths, feats


def big_shard(tmp_path):
    """One shard of 12 feature matrices of 1.28 MB (about 15 MB), written and evicted."""
    [path], feats = feature_shards(tmp_path, count=12, per_shard=12, frames=(4000, 0), seed=1,
                                   prefix="utt")
    evict(path)
    return path, feats


def capture_helpers(monkeypatch) -> list:
    """Record the helper (or ``None``) of every ``_readahead.start`` call."""
    started = []
    real_start = _readahead.start_readahead

    def recording_start(*args):
        helper = real_start(*args)
        started.append(helper)
        return helper

    monkeypatch.setattr(_readahead, "start_readahead", recording_start)
    return started


def test_a_cold_shard_is_read_with_a_helper_and_gives_the_members_of_the_reading_path(
        tmp_path, monkeypatch, small_window):
    path, _ = big_shard(tmp_path)
    size = os.path.getsize(path)
    before = open_fds()
    helpers = capture_helpers(monkeypatch)
    with open(path, "rb") as f:
        mapped = []
        for name, data in iter_tar_members(f, source=path, read_options=MAPPED):
            [helper] = helpers  # started with the first member
            # A reader that outruns its helper ends it before it is done: let it catch up, to
            # see that the reader tells it where it is.
            wait_until(lambda: waiting(helper) or not helper.alive)
            mapped.append((name, bytes(data)))
    wait_until(lambda: not helper.alive)
    # The whole shard was read, once, with a 4 MiB window over 15 MB: the reader told the
    # helper where it was.
    assert helper.copied == size
    with open(path, "rb") as f:
        read = [(name, bytes(data))
                for name, data in iter_tar_members(f, read_options=ShardReadOptions(mmap=False))]
    assert mapped == read and len(read) == 24
    assert open_fds() == before


def test_a_reader_that_finishes_first_leaves_its_helper_to_read_the_rest(tmp_path, monkeypatch,
                                                                        small_window):
    """The reader hands out views of a whole shard before its helper has read it (as while a
    shuffle buffer fills): the helper goes on to the end of the file -- those views will be
    read -- and the mapping stays mapped under it until it is done."""
    path, feats = big_shard(tmp_path)
    size = os.path.getsize(path)
    before = open_fds()
    helpers = capture_helpers(monkeypatch)
    gate = threading.Event()
    real_preadv = os.preadv

    def gated_preadv(*args):  # the helper's reads wait for the test to let them go
        gate.wait(10)  # (a reader that stopped its helper would wait here in join)
        return real_preadv(*args)

    monkeypatch.setattr(_readahead.os, "preadv", gated_preadv)
    with open(path, "rb") as f:
        views = dict(iter_tar_members(f, source=path, read_options=MAPPED))  # the reader is done
    [helper] = helpers
    assert helper.alive and helper.copied == 0  # still in its first read
    gate.set()
    wait_until(lambda: not helper.alive)
    assert helper.copied == size  # not stopped: it read the whole shard
    mapping_fd = 1 if sys.version_info < (3, 13) else 0  # the mapping's own (trackfd)
    assert open_fds() == before + mapping_fd  # the helper's descriptor is closed
    for key, value in feats.items():  # the views were valid all along
        assert np.array_equal(np.load(io.BytesIO(views[f"{key}.feats.npy"])), value)
    del views
    assert open_fds() == before  # unmapped with the last view


def test_stopping_early_ends_the_helper(tmp_path, small_window):
    path, _ = big_shard(tmp_path)
    before = open_fds()
    with open(path, "rb") as f:
        members = iter_tar_members(f, source=path, read_options=MAPPED)
        next(members)
        assert helper_threads() == 1
        members.close()
        assert helper_threads() == 0
    assert open_fds() == before


def test_readahead_false_turns_the_helper_off_and_the_default_starts_it(tmp_path, monkeypatch,
                                                                        small_window):
    """``readahead=False`` starts no helper; the default (``None``) and ``True`` do -- and the
    environment variable earlier versions read changes nothing (settings are arguments)."""
    path, _ = big_shard(tmp_path)
    helpers = capture_helpers(monkeypatch)
    monkeypatch.setenv("SPEECHPIPE_SHARD_READAHEAD", "0")
    for options in (ShardReadOptions(mmap=True, readahead=False), MAPPED,
                    ShardReadOptions(mmap=True, readahead=True)):
        evict(path)
        with open(path, "rb") as f:
            assert len(list(iter_tar_members(f, source=path, read_options=options))) == 24
    assert helpers[0] is None and helpers[1] is not None and helpers[2] is not None
    wait_until(lambda: not helpers[1].alive and not helpers[2].alive)
    assert helper_threads() == 0


def test_a_shard_cut_while_its_helper_reads_it_raises_the_shrinking_error(tmp_path,
                                                                         small_window):
    path, _ = big_shard(tmp_path)
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        members = iter_tar_members(f, source="d.tar", read_options=MAPPED)
        name, _ = next(members)
        assert name == "utt00.feats.npy"
        os.truncate(path, size // 2)  # the helper meets a short read
        with pytest.raises(DataError, match=r"^d.tar: the shard file shrank from "):
            for _ in members:
                pass
    assert helper_threads() == 0


def test_sharded_shuffle_over_cold_shards_gives_the_samples_of_the_switched_off_path(
        tmp_path, monkeypatch, small_window):
    paths, feats = feature_shards(tmp_path, count=30, per_shard=10, frames=(2000, 37), seed=3)
    helpers = capture_helpers(monkeypatch)

    def run(options=None):
        for path in paths:
            evict(path)
        pipe = IterableWrapper(paths).sharded_shuffle(buffer_size=7, seed=5,
                                                      read_options=options).decode()
        return [(s["key"], s["feats"].copy(), s["text"]) for s in pipe]

    with_helpers = run()
    assert [h is not None for h in helpers] == [True] * 3  # one helper per cold shard
    without = run(NO_READAHEAD)
    assert helpers[3:] == [None] * 3
    assert [k for k, _, _ in with_helpers] == [k for k, _, _ in without]
    assert sorted(k for k, _, _ in with_helpers) == sorted(feats)
    for (key, a, text), (_, b, _) in zip(with_helpers, without):
        assert np.array_equal(a, b) and np.array_equal(a, feats[key]) and text == key
    assert helper_threads() == 0


def test_dataloader_workers_read_cold_shards_with_helpers_and_give_the_same_batches(
        tmp_path, monkeypatch, small_window):
    """Two forked DataLoader workers (speechpipe's loader), each reading its cold shards with
    its own helpers: the batches are those of the same loader with read-ahead off."""
    from speechpipe.loader import build_loader
    from speechpipe.pipes.collate import PadCollate

    paths, feats = feature_shards(tmp_path, count=32, per_shard=8, frames=(1500, 53), seed=4)
    assert all(os.path.getsize(p) > 2 * MIB for p in paths)  # above _MIN_SIZE here
    log = tmp_path / "helpers.log"
    real_start = _readahead.start_readahead

    def logging_start(*args):  # forked workers inherit it: each appends its pid per helper
        helper = real_start(*args)
        if helper is not None:
            with open(log, "a") as f:
                f.write(f"{os.getpid()}\n")
        return helper

    monkeypatch.setattr(_readahead, "start_readahead", logging_start)

    def batches(options=None):
        for path in paths:
            evict(path)
        pipe = (IterableWrapper(paths).sharded_shuffle(buffer_size=6, seed=2,
                                                       read_options=options).decode()
                .batch(4).collate(collate_fn=PadCollate(fields=("key", "feats"))))
        loader = build_loader(pipe, num_workers=2, seed=0, multiprocessing_context="fork",
                              resumable=False)  # torch's batch
        return [(b["key"], b["feats"].clone(), b["feats_len"].clone()) for b in loader]

    with_helpers = batches()
    pids = log.read_text().split()
    assert len(pids) == 4 and len(set(pids)) == 2  # a helper per shard, in both workers
    assert str(os.getpid()) not in pids
    without = batches(NO_READAHEAD)
    assert log.read_text().split() == pids  # none with read-ahead off
    assert [k for k, _, _ in with_helpers] == [k for k, _, _ in without]
    assert sorted(k for keys, _, _ in with_helpers for k in keys) == sorted(feats)
    for (keys, a, la), (_, b, lb) in zip(with_helpers, without):
        assert torch.equal(a, b) and torch.equal(la, lb)
        for row, key in enumerate(keys):
            assert torch.equal(a[row, :la[row]], torch.from_numpy(feats[key]))
