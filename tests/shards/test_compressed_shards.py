"""Compressed shards: ``.tar.gz`` and ``.tar.zst`` written by pack / ShardWriter and read
sequentially (issue 22).

Invariants:
- a compressed shard gives the samples of the plain tar with the same content, and the
  index gives it the same exact len() and plan; its entry says it cannot be mapped;
- its payloads are never views of a mapping (always bytes);
- the same samples give the same compressed bytes (gzip mtime 0);
- a truncated or corrupt compressed shard raises a DataError naming the file; under
  on_error="skip" it is counted;
- a compressed file named .tar is named as such, with the fix.
"""

from __future__ import annotations

import argparse
import gzip
import os

import kaldiio
import numpy as np
import pytest

from speechpipe.cli.pack import add_command as add_pack_command
from speechpipe.errors import DataError
from speechpipe.index import ShardIndex
from speechpipe.pack import PackOptions, pack_data
from speechpipe.pipes._core import IterableWrapper
from speechpipe.pipes.shards import ShardWriter, write_shard
from speechpipe.pipes.order import read_shard
from speechpipe.pipes.shards import ShardReadOptions

zstandard = pytest.importorskip("zstandard")

SHAPES = {f"utt{i:02d}": (20 + 37 * i, 40) for i in range(12)}  # up to 427 x 40 floats


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """The same feature corpus packed plain, as .tar.gz and as .tar.zst."""
    root = tmp_path_factory.mktemp("packed")
    rng = np.random.default_rng(0)
    scp = str(root / "feats.scp")
    with kaldiio.WriteHelper(f"ark,scp:{root}/feats.ark,{scp}") as writer:
        for key, shape in SHAPES.items():
            writer(key, rng.standard_normal(shape).astype(np.float32))
    text = root / "text"
    text.write_text("".join(f"{k} words of {k}\n" for k in SHAPES))
    out = {}
    for compress in (None, "gz", "zst"):
        out[compress] = str(root / f"out-{compress}")
        pack_data(scp, str(text), out[compress], utts_per_shard=5, compress=compress,
                  progress=False)
    return out


def shard_samples(paths):
    return [{k: bytes(v) if isinstance(v, (bytes, memoryview)) else v
             for k, v in s.items() if k != "source"}
            for p in paths for s in read_shard(p)]


@pytest.mark.parametrize("compress, suffix", [("gz", ".tar.gz"), ("zst", ".tar.zst")])
def test_pack_compress_writes_shards_that_read_as_the_plain_ones(packed, compress, suffix):
    plain, index = ShardIndex.read(packed[None]), ShardIndex.read(packed[compress])
    assert [s.name for s in index.shards] == [s.name + suffix[4:] for s in plain.shards]
    assert all(s.name.endswith(suffix) and not s.mappable for s in index.shards)
    assert all(s.mappable for s in plain.shards)
    assert [(s.keys, s.lengths) for s in index.shards] == [(s.keys, s.lengths)
                                                          for s in plain.shards]
    assert sum(s.bytes for s in index.shards) < sum(s.bytes for s in plain.shards)
    assert shard_samples(index.paths()) == shard_samples(plain.paths())
    pipes = [IterableWrapper(i.paths()).sharded_shuffle(buffer_size=3, seed=1, index=True)
             for i in (plain, index)]
    assert len(pipes[0]) == len(pipes[1]) == len(SHAPES)  # exact len from the index
    assert [s["key"] for s in pipes[1]] == [s["key"] for s in pipes[0]]


def test_a_rerun_keeps_complete_compressed_shards(packed, tmp_path):
    folder = packed["zst"]
    before = {n: os.stat(os.path.join(folder, n)).st_mtime_ns for n in os.listdir(folder)}
    root = os.path.dirname(folder)
    report = pack_data(os.path.join(root, "feats.scp"), os.path.join(root, "text"), folder,
                       utts_per_shard=5, compress="zst", progress=False)
    assert report.shards_written == 0
    assert all(os.stat(os.path.join(folder, n)).st_mtime_ns == t for n, t in before.items()
               if n.endswith(".zst"))


def test_compressed_payloads_are_bytes_never_views_of_a_mapping(tmp_path):
    big = np.zeros((300, 80), np.float32)  # 96 KB: a view in a plain mapped shard
    for name in ("s.tar", "s.tar.gz", "s.tar.zst"):
        write_shard(tmp_path / name, [{"key": "u1", "feats.npy": big}])
    mapped = ShardReadOptions(mmap=True)
    [plain] = read_shard(str(tmp_path / "s.tar"), read_options=mapped)
    assert isinstance(plain["feats.npy"], memoryview)
    for name in ("s.tar.gz", "s.tar.zst"):
        [sample] = read_shard(str(tmp_path / name), read_options=mapped)
        assert type(sample["feats.npy"]) is bytes
        assert sample["feats.npy"] == bytes(plain["feats.npy"])


@pytest.mark.parametrize("name", ["a.tar.gz", "a.tar.zst"])
def test_the_same_samples_give_the_same_compressed_bytes(tmp_path, name):
    for folder in ("x", "y"):
        os.makedirs(tmp_path / folder)
        with ShardWriter(str(tmp_path / folder / name)) as writer:
            writer.write({"key": "u1", "txt": "hello"})
    assert (tmp_path / "x" / name).read_bytes() == (tmp_path / "y" / name).read_bytes()


@pytest.mark.parametrize("name", ["a.tar.gz", "a.tar.zst"])
@pytest.mark.parametrize("keep", [0.5, 0.97])
def test_a_truncated_compressed_shard_names_the_file(tmp_path, name, keep):
    path = tmp_path / name
    write_shard(path, [{"key": f"u{i}", "bin": os.urandom(5000)} for i in range(8)])
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(DataError, match=f"{path}: truncated or corrupt .* stream"):
        list(read_shard(str(path)))
    pipe = IterableWrapper([str(path)]).sharded_shuffle(on_error="skip")
    with pytest.warns(Warning):
        list(pipe)
    assert pipe.diagnostics.total == 1


def test_a_zstd_shard_of_several_frames_reads_whole(tmp_path):
    plain = tmp_path / "p.tar"
    write_shard(plain, [{"key": f"u{i}", "bin": os.urandom(3000)} for i in range(6)])
    data = plain.read_bytes()
    path = tmp_path / "a.tar.zst"  # as a parallel compressor (pzstd, zstd -T) writes them
    compressor = zstandard.ZstdCompressor()
    path.write_bytes(b"".join(compressor.compress(data[i:i + 4096])
                              for i in range(0, len(data), 4096)))
    assert shard_samples([str(path)]) == shard_samples([str(plain)])


def test_a_corrupt_gzip_shard_names_the_file(tmp_path):
    path = tmp_path / "a.tar.gz"
    path.write_bytes(b"this is not gzip at all, just text" * 20)
    with pytest.raises(DataError, match=f"{path}: truncated or corrupt gz stream"):
        list(read_shard(str(path)))


def test_a_compressed_shard_named_tar_says_how_to_name_it(tmp_path):
    plain = tmp_path / "p.tar"
    write_shard(plain, [{"key": "u1", "txt": "hi"}])
    path = tmp_path / "a.tar"
    path.write_bytes(gzip.compress(plain.read_bytes()))
    with pytest.raises(DataError, match="name it .tar.gz or .tar.zst"):
        list(read_shard(str(path)))


def test_pack_options_and_fmt_agree_on_compression():
    assert PackOptions(compress="gz").fmt == "data-%05d.tar.gz"
    assert PackOptions(fmt="x-%03d.tar.zst").compress == "zst"
    with pytest.raises(ValueError, match="compress must be one of"):
        PackOptions(compress="bz2")
    with pytest.raises(ValueError, match="names gz shards but compress is 'zst'"):
        PackOptions(fmt="data-%05d.tar.gz", compress="zst")
    with pytest.raises(ValueError, match="needs an fmt ending in .tar"):
        PackOptions(fmt="data-%05d.bin", compress="gz")


def test_the_pack_command_takes_compress(packed, tmp_path):
    root = os.path.dirname(packed[None])
    parser = argparse.ArgumentParser()
    add_pack_command(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["pack", "--scp", os.path.join(root, "feats.scp"), "--labels",
                              os.path.join(root, "text"), "--out", str(tmp_path / "o"),
                              "--compress", "zst", "--utts-per-shard", "5", "--no-progress"])
    assert args.func(args) == 0
    index = ShardIndex.read(tmp_path / "o")
    assert [s.name for s in index.shards] == [s.name for s in
                                              ShardIndex.read(packed["zst"]).shards]


# Issue 34, item 5: a member size cap (ShardReadOptions.max_member_bytes, default 128 MiB).
# Invariant: a member over the cap raises a DataError naming shard and member before any of
# it is decompressed or read, so a few kilobytes of shard cannot take hundreds of MiB of RSS.

def _bomb(path, size):
    """A compressed tar holding one member ``bomb.bin`` of ``size`` zero bytes: one
    compressed 1 MiB chunk of zeros repeated (gzip members and zstd frames concatenate)."""
    import tarfile
    info = tarfile.TarInfo("bomb.bin")
    info.size = size
    parts = [info.tobuf(format=tarfile.GNU_FORMAT), bytes(1 << 20),
             bytes(-size % 512) + bytes(1024)]
    if str(path).endswith(".gz"):
        head, chunk, tail = (gzip.compress(p, mtime=0) for p in parts)
    else:
        head, chunk, tail = (zstandard.ZstdCompressor().compress(p) for p in parts)
    path.write_bytes(head + chunk * (size >> 20) + tail)


@pytest.mark.parametrize("name", ["bomb.tar.gz", "bomb.tar.zst"])
def test_a_decompression_bomb_is_refused_without_taking_memory(tmp_path, name):
    import json
    import subprocess
    import sys
    path = tmp_path / name
    _bomb(path, 256 << 20)
    assert path.stat().st_size < 300 << 10  # a small shard, 256 MiB inside
    script = (
        "import json, resource, sys\n"
        "import speechpipe as sp\n"
        "from speechpipe.pipes.order._streaming import read_shard\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "try:\n"
        "    list(read_shard(sys.argv[1]))\n"
        "    error = None\n"
        "except sp.DataError as exc:\n"
        "    error = str(exc)\n"
        "after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "print(json.dumps({'error': error, 'kib': after - before}))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    done = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True,
                          text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["error"] == (f"{path} [member bomb.bin]: member of {256 << 20} bytes is "
                               f"larger than max_member_bytes={128 << 20} (ShardReadOptions): "
                               "a decompression bomb or a corrupt size; raise the cap if the "
                               "shard is yours and the member real")
    assert result["kib"] < 64 << 10, f"peak RSS grew by {result['kib']} KiB"


@pytest.mark.parametrize("name", ["small.tar", "small.tar.gz", "small.tar.zst"])
def test_the_member_cap_is_an_option(tmp_path, name):
    path = tmp_path / name
    write_shard(path, [{"key": "u1", "bin": os.urandom(300_000)},
                       {"key": "u2", "bin": b"x"}])
    capped = ShardReadOptions(max_member_bytes=100_000)
    with pytest.raises(DataError, match=r"\[member u1.bin\]: member of 300000 bytes is larger "
                                        r"than max_member_bytes=100000"):
        list(read_shard(str(path), read_options=capped))
    pipe = IterableWrapper([str(path)]).sharded_shuffle(read_options=capped, on_error="skip")
    with pytest.warns(Warning):
        assert list(pipe) == []
    assert pipe.diagnostics.total == 1
    uncapped = ShardReadOptions(max_member_bytes=None)
    assert [len(s["bin"]) for s in read_shard(str(path), read_options=uncapped)] == [300_000, 1]


def test_the_member_cap_is_checked():
    with pytest.raises(ValueError, match="max_member_bytes must be >= 1, got 0"):
        ShardReadOptions(max_member_bytes=0)
    with pytest.raises(TypeError, match="max_member_bytes must be an int or None, got '1'"):
        ShardReadOptions(max_member_bytes="1")


def test_a_zstd_frame_cut_inside_its_checksum_is_named(tmp_path):
    plain = tmp_path / "p.tar"
    write_shard(plain, [{"key": "u1", "bin": b"abc"}])
    path = tmp_path / "a.tar.zst"
    path.write_bytes(zstandard.ZstdCompressor(write_checksum=True).compress(
        plain.read_bytes())[:-2])
    with pytest.raises(DataError, match=f"{path}: truncated or corrupt zst stream"):
        list(read_shard(str(path)))
