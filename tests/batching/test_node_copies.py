"""Node copies of compressed shards on ``plan_batches``' shard road (issue 29).

Each process of the planned road reads, whole, every shard holding a member of one of its
batches; a compressed shard was decompressed by each. Now the first process of the node
writes a plain copy into the node's cache folder and every process maps it
(:mod:`speechpipe.pipes.shards._copies`). In one process (the quick lane; two passes or two
pipes stand for two processes): decompressed once, the same bytes with and without copies,
a changed shard copied again, the budget's least recently used copies removed, a copy cut short
or a stale ``.tmp`` never read, a copy removed before it was opened made again and one removed
while it is read still read whole, a member over ``max_member_bytes`` refused while it is
copied, an unusable cache folder read as before. Real DataLoader workers and S3:
``tests/remote/test_remote_copies.py``.
"""

from __future__ import annotations

import gzip
import os
import random
import time

import numpy as np
import pytest
import torch

import speechpipe as sp
from speechpipe.errors import DataError
from speechpipe.index import ShardEntry, ShardIndex
from speechpipe.pipes.batching import PaddedArea
from speechpipe.pipes.shards import COPIES_FOLDER, ShardReadOptions, ShardWriter
from speechpipe.testing import batch_digest

SHARDS, PER_SHARD = 6, 8
FEATS = 20_000  # float32 values per sample: 80 kB, a mapped view in a copy


def write_corpus(folder: str, compression: str = "gz", *, big: int | None = None) -> list[str]:
    """Compressed shards of ``{key, dat: n bytes, feats.npy}`` and their index (n frames);
    ``big``: the first sample's ``dat`` of that many zero bytes (compresses to almost none)."""
    os.makedirs(folder, exist_ok=True)
    entries = []
    for i in range(SHARDS):
        rng = random.Random(i)
        keys = [f"s{i}_{j}" for j in range(PER_SHARD)]
        lengths = [rng.randint(20, 200) for _ in keys]
        plain = os.path.join(folder, f"data-{i:05d}.tar")
        with ShardWriter(plain) as writer:
            for j, (key, n) in enumerate(zip(keys, lengths)):
                dat = bytes(big) if big and i == 0 and j == 0 else rng.randbytes(n)
                writer.write({"key": key, "dat": dat,
                              "feats.npy": np.full(FEATS, i * 100 + j, np.float32)})
        path = plain + (".gz" if compression == "gz" else ".zst")
        with open(plain, "rb") as f:
            data = f.read()
        if compression == "gz":
            packed = gzip.compress(data)
        else:
            import zstandard

            packed = zstandard.ZstdCompressor().compress(data)
        with open(path, "wb") as f:
            f.write(packed)
        os.remove(plain)
        entries.append(ShardEntry(os.path.basename(path), PER_SHARD, os.path.getsize(path),
                                  tuple(keys), tuple(float(n) for n in lengths)))
    ShardIndex(folder, entries).write()
    return [os.path.join(folder, e.name) for e in entries]


def collate(batch: list) -> dict:
    n = max(len(s["dat"]) for s in batch)
    x = torch.zeros(len(batch), n, dtype=torch.uint8)
    for i, s in enumerate(batch):
        x[i, :len(s["dat"])] = torch.frombuffer(bytearray(s["dat"]), dtype=torch.uint8)
    feats = torch.stack([torch.frombuffer(bytearray(s["feats.npy"]), dtype=torch.uint8)
                         for s in batch])
    return {"key": [s["key"] for s in batch], "x": x, "feats": feats,
            "source": [os.path.basename(s["source"]) for s in batch]}


def pipe(paths, read_options=None, *, streams=3, seed=0):
    return sp.IterableWrapper(paths).plan_batches(
        budget=PaddedArea(600), index=True, streams=streams, seed=seed, buffer_size=4,
        bucket_buffer=6, shuffle_window=2, read_options=read_options).collate(
        collate_fn=collate)


def digests(p) -> list[str]:
    return [batch_digest({k: v for k, v in b.items() if k != "source"}) for b in p]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "node-cache"
    monkeypatch.setenv("SPEECHPIPE_CACHE_DIR", str(folder))
    return folder


@pytest.fixture
def decompressions(monkeypatch):
    """The names of the compressed files decompressed in this process, in order."""
    import speechpipe.pipes.shards._reader as reader

    seen: list[str] = []
    real = reader._decompressor

    def counted(stream, compression):
        seen.append(os.path.basename(getattr(stream, "name", "?")))
        return real(stream, compression)

    monkeypatch.setattr(reader, "_decompressor", counted)
    return seen


def copies(cache) -> dict[str, int]:
    folder = cache / COPIES_FOLDER
    if not folder.exists():
        return {}
    return {p.name: p.stat().st_size for p in folder.iterdir() if p.name.endswith(".tar")}


@pytest.mark.parametrize("compression", ["gz", "zst"])
def test_compressed_shards_are_decompressed_once_per_node(tmp_path, cache, decompressions,
                                                          compression):
    paths = write_corpus(str(tmp_path / "corpus"), compression)
    first = digests(pipe(paths))
    again = digests(pipe(paths))  # another process of the node: maps the copies
    assert first == again and len(first) > 3
    assert sorted(decompressions) == sorted(os.path.basename(p) for p in paths)  # once each
    assert len(copies(cache)) == SHARDS
    without = ShardReadOptions(node_copy_bytes=None)
    decompressions.clear()
    assert digests(pipe(paths, without)) == first  # byte-identical without copies
    assert digests(pipe(paths, without)) == first
    assert len(decompressions) >= 2 * SHARDS  # each pass decompresses each shard again


def test_samples_keep_the_original_shards_name_and_views_of_the_copy(tmp_path, cache):
    paths = write_corpus(str(tmp_path / "corpus"))
    batches = list(sp.IterableWrapper(paths).plan_batches(PaddedArea(600), index=True,
                                                          streams=2, seed=1))
    samples = [s for b in batches for s in b]
    assert sorted(s["key"] for s in samples) == sorted(
        f"s{i}_{j}" for i in range(SHARDS) for j in range(PER_SHARD))
    assert {s["source"] for s in samples} == set(paths)
    assert all(isinstance(s["feats.npy"], memoryview) for s in samples)  # mapped copies
    without = ShardReadOptions(node_copy_bytes=None)
    direct = list(sp.IterableWrapper(paths).plan_batches(PaddedArea(600), index=True,
                                                         streams=2, seed=1,
                                                         read_options=without))
    assert [[(s["key"], s["source"], bytes(s["dat"]), bytes(s["feats.npy"])) for s in b]
            for b in batches] == [[(s["key"], s["source"], bytes(s["dat"]),
                                    bytes(s["feats.npy"])) for s in b] for b in direct]


def test_a_changed_shard_gets_a_new_copy_and_the_old_one_goes(tmp_path, cache, decompressions):
    paths = write_corpus(str(tmp_path / "corpus"))
    first = digests(pipe(paths))
    before = copies(cache)
    with open(paths[2], "rb") as f:
        data = f.read()
    time.sleep(0.01)
    os.remove(paths[2])
    with open(paths[2], "wb") as f:  # the same bytes, a new file: another version
        f.write(data)
    decompressions.clear()
    assert digests(pipe(paths)) == first
    assert decompressions == [os.path.basename(paths[2])]
    after = copies(cache)
    assert len(after) == SHARDS and len(set(after) - set(before)) == 1


def test_the_budget_removes_the_least_recently_used_copies(tmp_path, cache, decompressions):
    from speechpipe.pipes.shards import node_copy_samples

    paths = write_corpus(str(tmp_path / "corpus"))
    size = max(copies_of_one(p, cache) for p in paths[:1])
    budget = ShardReadOptions(node_copy_bytes=int(size * 2.5))  # two copies fit
    for path in paths[:2]:
        list(node_copy_samples(path, budget))
    time.sleep(0.02)
    list(node_copy_samples(paths[0], budget))  # used again: the last to go
    time.sleep(0.02)
    list(node_copy_samples(paths[2], budget))  # a third: the least recently used goes
    kept = copies(cache)
    assert len(kept) == 2 and sum(kept.values()) <= budget.node_copy_bytes
    decompressions.clear()
    list(node_copy_samples(paths[0], budget))  # kept: mapped, not decompressed
    list(node_copy_samples(paths[1], budget))  # removed: made again
    assert decompressions == [os.path.basename(paths[1])]
    for path in paths:  # every shard, then the whole road: always within the budget
        list(node_copy_samples(path, budget))
        assert sum(copies(cache).values()) <= budget.node_copy_bytes
    assert digests(pipe(paths, budget)) == digests(pipe(paths, ShardReadOptions(
        node_copy_bytes=None)))


def copies_of_one(path: str, cache) -> int:
    """The size of ``path``'s copy (made now in a folder of its own)."""
    from speechpipe.pipes.shards import node_copy_samples

    os.environ["SPEECHPIPE_CACHE_DIR"] = str(cache) + "-probe"
    try:
        list(node_copy_samples(path, None))
        (found,) = copies(type(cache)(str(cache) + "-probe")).values()
    finally:
        os.environ["SPEECHPIPE_CACHE_DIR"] = str(cache)
    return found


def test_a_shard_larger_than_the_budget_is_read_directly(tmp_path, cache, decompressions):
    from speechpipe.pipes.shards import node_copy_samples

    paths = write_corpus(str(tmp_path / "corpus"))
    small = ShardReadOptions(node_copy_bytes=50_000)  # a shard decompresses to 700 kB
    assert node_copy_samples(paths[0], small) is None
    assert copies(cache) == {} and not [p for p in (cache / COPIES_FOLDER).iterdir()
                                        if p.name.endswith(".tmp")]
    decompressions.clear()
    assert node_copy_samples(paths[0], small) is None  # marked: not decompressed again
    assert decompressions == []
    assert list(node_copy_samples(paths[0], ShardReadOptions(node_copy_bytes=1 << 20)))
    assert len(copies(cache)) == 1  # a larger budget copies it
    assert digests(pipe(paths, small)) == digests(pipe(paths, ShardReadOptions(
        node_copy_bytes=None)))


def test_a_copy_cut_short_or_a_stale_tmp_is_never_read(tmp_path, cache, decompressions):
    paths = write_corpus(str(tmp_path / "corpus"))
    want = digests(pipe(paths))
    folder = cache / COPIES_FOLDER
    assert len(copies(cache)) == SHARDS
    for name in copies(cache):  # every copy cut short in place (a damaged disk)
        with open(folder / name, "r+b") as f:
            f.truncate(3000)
    stale = []
    for name in list(copies(cache))[:2]:  # and killed writers' leftovers beside them
        path = folder / (name.rsplit(".", 2)[0] + ".x1y2.tmp")
        path.write_bytes(b"\0" * 100)
        os.utime(path, (time.time() - 7200, time.time() - 7200))
        stale.append(path)
    decompressions.clear()
    assert digests(pipe(paths)) == want
    assert len(decompressions) == SHARDS  # each copied again, none read cut short
    assert all(size > 3000 for size in copies(cache).values())
    assert not any(p.exists() for p in stale)  # an hour old: removed


def test_a_copy_removed_before_it_was_opened_is_made_again(tmp_path, cache, monkeypatch):
    import speechpipe.pipes.shards._copies as node_copies

    paths = write_corpus(str(tmp_path / "corpus"))
    want = digests(pipe(paths))
    real, removed = node_copies._find, []

    def find_then_lose(prefix, budget):
        path = real(prefix, budget)
        if path is not None and len(removed) < 3:  # another process's budget, just then
            os.remove(path)
            removed.append(path)
        return path

    monkeypatch.setattr(node_copies, "_find", find_then_lose)
    assert digests(pipe(paths)) == want
    assert len(removed) == 3 and all(os.path.exists(p) for p in removed)  # made again


def test_a_copy_removed_while_it_is_read_is_read_whole(tmp_path, cache):
    from speechpipe.pipes.shards import node_copy_samples

    paths = write_corpus(str(tmp_path / "corpus"))
    list(node_copy_samples(paths[0], None))
    (name,) = copies(cache)
    samples = iter(node_copy_samples(paths[0], None))
    first = next(samples)
    os.remove(cache / COPIES_FOLDER / name)  # evicted by another process meanwhile
    rest = list(samples)
    got = [first] + rest
    assert [s["key"] for s in got] == [f"s0_{j}" for j in range(PER_SHARD)]
    assert [np.frombuffer(s["feats.npy"], np.uint8)[-4:].view(np.float32)[0] for s in got] \
        == [float(j) for j in range(PER_SHARD)]


def test_a_member_over_max_member_bytes_is_refused_while_it_is_copied(tmp_path, cache):
    # 4 MB of zeros compress to a few kB: the copy must not be the way round the cap
    paths = write_corpus(str(tmp_path / "corpus"), big=4 << 20)
    capped = ShardReadOptions(max_member_bytes=1 << 20)
    with pytest.raises(DataError, match=r"data-00000\.tar\.gz.*s0_0\.dat") as copied:
        list(pipe(paths, capped, streams=1))
    with pytest.raises(DataError) as direct:
        list(pipe(paths, ShardReadOptions(max_member_bytes=1 << 20, node_copy_bytes=None),
                  streams=1))
    assert str(copied.value) == str(direct.value)  # the error a direct read raises
    assert COPIES_FOLDER not in str(copied.value)
    leftovers = [p for p in (cache / COPIES_FOLDER).iterdir()
                 if p.name.endswith((".tmp", ".tar")) and "00000" in p.name]
    assert all(p.stat().st_size < 1 << 20 for p in (cache / COPIES_FOLDER).iterdir())
    assert not [p for p in leftovers if p.name.endswith(".tmp")]


def test_an_unusable_cache_folder_reads_as_before(tmp_path, monkeypatch, decompressions):
    paths = write_corpus(str(tmp_path / "corpus"))
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("SPEECHPIPE_CACHE_DIR", str(blocker))
    with pytest.warns(RuntimeWarning, match="a-file"):
        got = digests(pipe(paths))
    assert got == digests(pipe(paths, ShardReadOptions(node_copy_bytes=None)))
    assert len(decompressions) == 2 * SHARDS  # each pass decompressed each shard


def test_node_copy_bytes_is_checked():
    with pytest.raises(ValueError, match="node_copy_bytes"):
        ShardReadOptions(node_copy_bytes=0)
    with pytest.raises(ValueError, match="node_copy_bytes"):
        ShardReadOptions(node_copy_bytes="4GiB")
    assert ShardReadOptions().node_copy_bytes == 8 << 30


def test_a_copy_that_cannot_be_written_is_read_directly(tmp_path, cache, monkeypatch):
    import errno

    import speechpipe.pipes.shards._copies as node_copies

    paths = write_corpus(str(tmp_path / "corpus"))
    want = digests(pipe(paths, ShardReadOptions(node_copy_bytes=None)))

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(node_copies.os, "fsync", full)
    with pytest.warns(RuntimeWarning, match="No space left on device.*reads it directly"):
        assert digests(pipe(paths)) == want
    assert copies(cache) == {}
    assert not [p for p in (cache / COPIES_FOLDER).iterdir() if p.name.endswith(".tmp")]
