"""Tar shards: the reader written from the tar format, grouping by key, read_shards, writers.

Invariant: a shard is either read completely (up to its end-of-archive marker) or raises a
DataError naming the shard and the member, key or byte offset; never a silent short read.
"""

from __future__ import annotations

import gc
import hashlib
import io
import json
import os
import sys
import tarfile
import warnings

import numpy as np
import pytest
import soundfile
import webdataset as wds
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import speechpipe  # noqa: F401  (registers open)
from speechpipe.diagnostics import SkippedInputWarning
from speechpipe.errors import DataError
from speechpipe.pipes.decode import _decode
from speechpipe.pipes._core import IterableWrapper
from speechpipe.pipes.shards import ShardReaderIterDataPipe, ShardReadOptions, group_by_key, iter_tar_members, split_member_name
from speechpipe.pipes.shards import ShardWriter, write_shard

# --------------------------------------------------------------------------------------------
# helpers: tars built with tarfile (reading side under test) and raw headers built by hand
# --------------------------------------------------------------------------------------------


def make_tar(members, *, fmt=tarfile.PAX_FORMAT, pax_headers=None) -> bytes:
    """A tar of (name, bytes) regular files, or (name, (typeflag,)) for other members."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt, pax_headers=pax_headers) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            if isinstance(data, bytes):
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                info.type = data[0]
                if data[0] in (tarfile.SYMTYPE, tarfile.LNKTYPE):
                    info.linkname = "target.txt"
                tar.addfile(info)
    return buf.getvalue()


def offsets(tar_bytes: bytes) -> dict[str, tuple[int, int]]:
    """member name -> (header offset, payload offset), read with tarfile."""
    with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as tar:
        return {m.name: (m.offset, m.offset_data) for m in tar.getmembers()}


def raw_header(name: bytes, size_field: bytes, typeflag: bytes = b"0") -> bytes:
    """A ustar header with a hand-made size field and a correct checksum."""
    h = bytearray(512)
    h[0:len(name)] = name
    h[100:108] = b"0000444\0"
    h[108:116] = b"0000000\0"
    h[116:124] = b"0000000\0"
    h[124:136] = size_field
    h[136:148] = b"00000000000\0"
    h[156:157] = typeflag
    h[257:265] = b"ustar\x0000"
    h[148:156] = b" " * 8
    h[148:156] = b"%06o\0 " % sum(h)
    return bytes(h)


def pad(data: bytes) -> bytes:
    return data + bytes(-len(data) % 512)


def members_of(data: bytes, source: str = "s.tar"):
    return list(iter_tar_members(io.BytesIO(data), source=source))


def tone(n: int = 1600) -> np.ndarray:
    # Values exactly representable in 16-bit PCM, so FLAC round trips are exact.
    return ((np.arange(n) % 200 - 100) * 256).astype(np.float32) / 32768


def encoded_flac(audio: np.ndarray, rate: int = 16000) -> bytes:
    buf = io.BytesIO()
    soundfile.write(buf, audio, rate, format="FLAC")
    return buf.getvalue()


# --------------------------------------------------------------------------------------------
# compatibility with webdataset, both directions
# --------------------------------------------------------------------------------------------


def test_shard_written_by_webdataset_tarwriter_reads_and_decodes_exactly(tmp_path):
    rng = np.random.default_rng(0)
    originals = []
    path = tmp_path / "wds-00000.tar"
    with wds.TarWriter(str(path)) as writer:
        for i in range(4):
            audio = tone(1600 + 160 * i)
            feats = rng.standard_normal((5 + i, 3)).astype(np.float32)
            text = f"utterance {i} ünïcode"
            meta = {"speaker": f"spk{i % 2}", "n": i}
            originals.append((f"dir/utt{i}", audio, feats, text, meta))
            writer.write({"__key__": f"dir/utt{i}", "flac": encoded_flac(audio),
                          "feats.npy": feats, "txt": text, "json": meta})
    got = list(IterableWrapper([str(path)]).open_files(mode="b").read_shards().decode())
    assert [s["key"] for s in got] == [o[0] for o in originals]
    for s, (key, audio, feats, text, meta) in zip(got, originals):
        assert s["source"] == str(path)
        assert s["sample_rate"] == 16000
        assert s["audio"].dtype == np.float32 and np.array_equal(s["audio"], audio)
        assert s["feats"].dtype == np.float32 and np.array_equal(s["feats"], feats)
        assert s["text"] == text
        assert s["meta"] == meta


def test_shards_written_by_shardwriter_read_by_webdataset_with_identical_keys_and_bytes(tmp_path):
    samples = [{"key": f"spk{i % 2}/utt{i}", "flac": tone(800 + i), "sample_rate": 8000,
                "feats.npy": np.full((i + 1, 2), i, dtype=np.float32), "txt": f"text {i}",
                "json": {"i": i}} for i in range(5)]
    with ShardWriter(str(tmp_path / "data-%05d.tar"), maxcount=2) as writer:
        for s in samples:
            writer.write(s)
    ours = list(IterableWrapper(writer.paths).open_files(mode="b").read_shards())
    theirs = []
    for p in writer.paths:  # webdataset's own tar iteration and grouping, on files we close
        with open(p, "rb") as f:
            theirs += wds.tariterators.group_by_keys(
                wds.tariterators.tar_file_expander([{"url": p, "stream": f}]))
    assert [s["key"] for s in ours] == [s["__key__"] for s in theirs] == [s["key"] for s in samples]
    for a, b in zip(ours, theirs):
        fields_a = {k: v for k, v in a.items() if k not in ("key", "source")}
        fields_b = {k: v for k, v in b.items() if not k.startswith("__")}
        assert fields_a == fields_b
        assert set(fields_a) == {"flac", "feats.npy", "txt", "json"}


def test_read_shards_then_decode_after_speechpipe_open(tmp_path):
    path = str(tmp_path / "a.tar")
    write_shard(path, [{"key": "u1", "txt": "one"}, {"key": "u2", "txt": "two"}])
    got = [(s["key"], s["text"]) for s in IterableWrapper([path]).open().read_shards().decode()]
    assert got == [("u1", "one"), ("u2", "two")]


# --------------------------------------------------------------------------------------------
# the tar reader: formats
# --------------------------------------------------------------------------------------------


def test_members_are_yielded_in_order_with_exact_payloads():
    data = make_tar([("a.txt", b"x" * 511), ("a.bin", b""), ("b.txt", b"y" * 513)])
    assert members_of(data) == [("a.txt", b"x" * 511), ("a.bin", b""), ("b.txt", b"y" * 513)]


def test_gnu_long_names_are_read():
    name = "d" * 80 + "/" + "u" * 90 + ".feats.npy"
    data = make_tar([(name, b"payload")], fmt=tarfile.GNU_FORMAT)
    assert b"././@LongLink" in data  # the name really went through a GNU 'L' header
    assert members_of(data) == [(name, b"payload")]


def test_pax_headers_give_non_ascii_and_long_names():
    names = ["日本語/ütterance1.txt", "x" * 150 + ".txt"]
    data = make_tar([(n, n.encode()) for n in names], fmt=tarfile.PAX_FORMAT)
    assert b"PaxHeader" in data
    assert members_of(data) == [(n, n.encode()) for n in names]


def test_pax_global_header_is_ignored():
    data = make_tar([("a.txt", b"1")], pax_headers={"comment": "made by a test"})
    assert data[156:157] == b"g"
    assert members_of(data) == [("a.txt", b"1")]


def test_ustar_prefix_is_joined_to_the_name():
    name = "p" * 120 + "/utt1.txt"
    data = make_tar([(name, b"1")], fmt=tarfile.USTAR_FORMAT)
    assert data[:100].rstrip(b"\0") == b"utt1.txt" and data[345:352] == b"ppppppp"
    assert members_of(data) == [(name, b"1")]


def test_pax_size_overrides_the_header_size():
    record = b"12 size=600\n"
    pax = raw_header(b"PaxHeader/u1.bin", b"%011o\0" % len(record), b"x") + pad(record)
    body = raw_header(b"u1.bin", b"00000000000\0") + pad(b"z" * 600)
    assert members_of(pax + body + bytes(1024)) == [("u1.bin", b"z" * 600)]


def test_gnu_base256_size_is_parsed():
    size_field = b"\x80" + (700).to_bytes(11, "big")
    data = raw_header(b"u1.bin", size_field) + pad(b"q" * 700) + bytes(1024)
    assert members_of(data) == [("u1.bin", b"q" * 700)]


def test_directories_are_skipped():
    data = make_tar([("dir", (tarfile.DIRTYPE,)), ("dir/u1.txt", b"a")])
    assert members_of(data) == [("dir/u1.txt", b"a")]


def test_the_stream_is_read_to_its_end_after_the_end_marker():
    stream = io.BytesIO(make_tar([("a.txt", b"1")]))
    list(iter_tar_members(stream))
    assert stream.tell() == len(stream.getvalue()) == 10240  # tarfile pads to a 10 KiB record


def test_empty_archive_has_no_members():
    assert members_of(make_tar([])) == []


# --------------------------------------------------------------------------------------------
# the tar reader: every malformed case names the shard and the member, key or offset
# --------------------------------------------------------------------------------------------

TWO = [("u1.txt", b"a" * 100), ("u2.bin", b"b" * 2000)]


def test_truncated_in_the_middle_of_a_payload():
    data = make_tar(TWO)
    cut = offsets(data)["u2.bin"][1] + 1000
    with pytest.raises(DataError) as exc:
        members_of(data[:cut], source="shards/s-00001.tar")
    msg = str(exc.value)
    assert msg.startswith("shards/s-00001.tar [member u2.bin]")
    assert "truncated shard" in msg and "1000 of 2000 bytes" in msg


def test_truncated_at_a_header_boundary_without_end_marker():
    data = make_tar(TWO)
    cut = offsets(data)["u2.bin"][0]
    with pytest.raises(DataError, match=r"^s.tar: truncated shard: it ends after member "
                                        r"'u1.txt' without the end-of-archive marker"):
        members_of(data[:cut])


def test_truncated_just_before_the_end_marker_names_the_last_member():
    data = make_tar(TWO)
    end = offsets(data)["u2.bin"][1] + 2048  # payload of 2000 padded to 2048
    assert data[end:end + 512] == bytes(512)
    members = []
    with pytest.raises(DataError, match="truncated shard: it ends after member 'u2.bin'"):
        for m in iter_tar_members(io.BytesIO(data[:end]), source="s.tar"):
            members.append(m)
    assert [n for n, _ in members] == ["u1.txt", "u2.bin"]  # complete members were yielded


def test_partial_header():
    data = make_tar(TWO)
    cut = offsets(data)["u2.bin"][0] + 100
    with pytest.raises(DataError, match=r"^s.tar: truncated shard: partial header \(100 of 512 "
                                        r"bytes\) at byte offset 1024, after member 'u1.txt'"):
        members_of(data[:cut])


def test_bad_checksum_names_offset_and_previous_member():
    data = bytearray(make_tar(TWO))
    header = offsets(bytes(data))["u2.bin"][0]
    data[header + 1] ^= 0x01  # 'u2.bin' -> 't2.bin', checksum no longer matches
    with pytest.raises(DataError, match=rf"^s.tar: bad header checksum at byte offset {header} "
                                        r"\(after member 'u1.txt'\)"):
        members_of(bytes(data))


def test_garbage_is_not_a_tar_header():
    with pytest.raises(DataError, match=r"^s.tar: bad header checksum.* at byte offset 0 "
                                        r"\(before any member\)"):
        members_of(b"this is not a tar file" * 50)


def test_compressed_shard_is_named_as_such():
    import gzip

    with pytest.raises(DataError, match="^s.tar: the shard is compressed"):
        members_of(gzip.compress(make_tar(TWO), mtime=0))


def test_symlink_member_is_refused():
    data = make_tar([("u1.txt", b"a"), ("u1.flac", (tarfile.SYMTYPE,))])
    with pytest.raises(DataError, match=r"^s.tar \[member u1.flac\]: unsupported member type: "
                                        "symbolic link"):
        members_of(data)


def test_hard_link_member_is_refused():
    data = make_tar([("u1.txt", b"a"), ("u2.txt", (tarfile.LNKTYPE,))])
    with pytest.raises(DataError, match=r"\[member u2.txt\]: unsupported member type: hard link"):
        members_of(data)


def test_invalid_size_field():
    data = raw_header(b"u1.bin", b"12x45\0      ") + bytes(1024)
    with pytest.raises(DataError, match="invalid size field .* at byte offset 0"):
        members_of(data)


def test_malformed_pax_record():
    record = b"99 path=x\n"
    data = raw_header(b"PaxHeader", b"%011o\0" % len(record), b"x") + pad(record) + bytes(1024)
    with pytest.raises(DataError, match="s.tar: malformed pax extended header record"):
        members_of(data)


# --------------------------------------------------------------------------------------------
# grouping by key
# --------------------------------------------------------------------------------------------


def test_split_member_name_at_first_dot_of_basename():
    assert split_member_name("a.b/dir/utt1.feats.npy") == ("a.b/dir/utt1", "feats.npy")
    assert split_member_name("utt1.flac") == ("utt1", "flac")


def test_consecutive_members_with_the_same_key_form_one_sample():
    members = [("d/u1.flac", b"1"), ("d/u1.txt", b"2"), ("d/u2.txt", b"3"), ("e/u1.txt", b"4")]
    got = list(group_by_key(members, source="s.tar"))
    assert got == [{"key": "d/u1", "source": "s.tar", "flac": b"1", "txt": b"2"},
                   {"key": "d/u2", "source": "s.tar", "txt": b"3"},
                   {"key": "e/u1", "source": "s.tar", "txt": b"4"}]


def test_a_key_whose_members_are_not_adjacent_is_named_never_two_halves(tmp_path):
    # issue 23: u0.txt, u1.txt, u0.json gave two partial samples with the same key
    path = tmp_path / "scattered.tar"
    path.write_bytes(make_tar([("u0.txt", b"a"), ("u1.txt", b"b"), ("u0.json", b"{}")]))
    pipe = IterableWrapper([str(path)]).open_files(mode="b").read_shards()
    with pytest.raises(DataError, match="not adjacent") as exc:
        list(pipe)
    assert (exc.value.source, exc.value.key, exc.value.member) == (str(path), "u0", "u0.json")
    got = []
    skipping = IterableWrapper([str(path)]).open_files(mode="b").read_shards(on_error="skip")
    with pytest.warns(SkippedInputWarning):
        got = [s["key"] for s in skipping]
    assert got == ["u0", "u1"] and skipping.diagnostics.total == 1  # counted, not halved


def test_duplicate_field_names_shard_key_and_member(tmp_path):
    path = tmp_path / "dup.tar"
    path.write_bytes(make_tar([("u1.txt", b"a"), ("u1.txt", b"b")]))
    with pytest.raises(DataError) as exc:
        list(IterableWrapper([str(path)]).open_files(mode="b").read_shards())
    # (torch's hook appends a line naming the pipe)
    assert str(exc.value).startswith(
        f"{path} [member u1.txt] (key 'u1'): duplicate field 'txt' in one sample")


def test_member_without_extension(tmp_path):
    path = tmp_path / "noext.tar"
    path.write_bytes(make_tar([("u1.txt", b"a"), ("dir/u2", b"b")]))
    with pytest.raises(DataError, match=rf"^{path} \[member dir/u2\]: member name has no field "
                                        "extension"):
        list(IterableWrapper([str(path)]).open_files(mode="b").read_shards())


def test_member_with_a_reserved_field_name():
    with pytest.raises(DataError, match=r"\[member u1.key\] \(key 'u1'\): field name 'key' is "
                                        "reserved"):
        list(group_by_key([("u1.key", b"x")], source="s.tar"))


def test_sample_before_a_cut_member_of_the_next_key_is_still_yielded():
    data = make_tar([("u1.txt", b"a"), ("u1.bin", b"b"), ("u2.bin", b"c" * 2000)])
    cut = offsets(data)["u2.bin"][1] + 10
    got = []
    with pytest.raises(DataError, match=r"\[member u2.bin\]: truncated shard"):
        for s in group_by_key(iter_tar_members(io.BytesIO(data[:cut]), source="s"), source="s"):
            got.append(s)
    assert got == [{"key": "u1", "source": "s", "txt": b"a", "bin": b"b"}]


# --------------------------------------------------------------------------------------------
# read_shards: error policy, closing, epochs
# --------------------------------------------------------------------------------------------


def _three_shards(tmp_path):
    good1 = tmp_path / "s-00000.tar"
    bad = tmp_path / "s-00001.tar"
    good2 = tmp_path / "s-00002.tar"
    write_shard(str(good1), [{"key": f"a{i}", "txt": f"a{i}"} for i in range(3)])
    write_shard(str(good2), [{"key": f"c{i}", "txt": f"c{i}"} for i in range(3)])
    data = make_tar([("b0.txt", b"b0"), ("b1.txt", b"b1"), ("b2.txt", b"x" * 3000)])
    bad.write_bytes(data[:offsets(data)["b2.txt"][1] + 1500])  # cut inside b2's payload
    return [str(good1), str(bad), str(good2)]


def test_skip_policy_reads_good_shards_around_a_truncated_one_and_warns(tmp_path):
    paths = _three_shards(tmp_path)
    pipe = IterableWrapper(paths).open_files(mode="b").read_shards(on_error="skip")
    with pytest.warns(SkippedInputWarning, match="read_shards skipped 1 item"):
        keys = [s["key"] for s in pipe]
    assert keys == ["a0", "a1", "a2", "b0", "b1", "c0", "c1", "c2"]
    assert dict(pipe.diagnostics.counts) == {"truncated shard (rest of the shard skipped)": 1}
    assert "s-00001.tar [member b2.txt]" in pipe.diagnostics.examples[
        "truncated shard (rest of the shard skipped)"][0]


def test_skip_policy_counts_a_corrupt_shard_separately(tmp_path):
    paths = _three_shards(tmp_path)
    with open(paths[1], "wb") as f:
        f.write(b"garbage" * 200)
    pipe = IterableWrapper(paths).open_files(mode="b").read_shards(on_error="skip")
    with pytest.warns(SkippedInputWarning):
        assert len(list(pipe)) == 6
    assert dict(pipe.diagnostics.counts) == {"corrupt shard (rest of the shard skipped)": 1}


def test_raise_policy_yields_samples_before_the_error_then_raises(tmp_path):
    paths = _three_shards(tmp_path)
    keys = []
    with pytest.raises(DataError, match="s-00001.tar .member b2.txt.: truncated shard"):
        for s in IterableWrapper(paths).open_files(mode="b").read_shards():
            keys.append(s["key"])
    assert keys == ["a0", "a1", "a2", "b0", "b1"]


def test_streams_are_closed_after_each_shard_and_on_error():
    good = io.BytesIO(make_tar([("u1.txt", b"a")]))
    bad = io.BytesIO(make_tar([("u1.txt", b"a")])[:600])
    list(IterableWrapper([("g.tar", good)], deepcopy=False).read_shards())
    assert good.closed
    with pytest.raises(DataError):
        list(IterableWrapper([("b.tar", bad)], deepcopy=False).read_shards())
    assert bad.closed


def test_two_epochs_give_the_same_samples_and_no_warning(tmp_path):
    path = str(tmp_path / "a.tar")
    write_shard(path, [{"key": f"u{i}", "txt": str(i)} for i in range(4)])
    pipe = IterableWrapper([path]).open_files(mode="b").read_shards(on_error="skip")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert list(pipe) == list(pipe)
    assert pipe.diagnostics.total == 0


def test_partial_epoch_then_restart_gives_the_full_pass_and_closes_files(tmp_path):
    paths = [str(tmp_path / f"s-{i}.tar") for i in range(2)]
    for i, p in enumerate(paths):
        write_shard(p, [{"key": f"s{i}u{j}", "txt": "x"} for j in range(3)])
    pipe = IterableWrapper(paths).open_files(mode="b").read_shards()
    it = iter(pipe)
    assert [next(it)["key"] for _ in range(4)] == ["s0u0", "s0u1", "s0u2", "s1u0"]
    it.close()  # the open shard is closed here, not by the garbage collector
    assert [s["key"] for s in pipe] == [f"s{i}u{j}" for i in range(2) for j in range(3)]


def test_read_shards_has_no_len_and_says_why():
    with pytest.raises(TypeError, match="known only after reading"):
        len(IterableWrapper([]).read_shards())


def test_read_shards_rejects_bare_paths_and_bad_on_error():
    with pytest.raises(TypeError, match=r"expects \(path, binary stream\) pairs"):
        list(IterableWrapper(["a.tar"]).read_shards())
    with pytest.raises(ValueError, match="on_error must be one of"):
        ShardReaderIterDataPipe(IterableWrapper([]), on_error="ignore")


def test_constructor_reads_nothing(tmp_path):
    # A missing file is only noticed when iterating.
    pipe = IterableWrapper([str(tmp_path / "missing.tar")]).open_files(mode="b").read_shards()
    with pytest.raises(FileNotFoundError):
        list(pipe)


# --------------------------------------------------------------------------------------------
# writing
# --------------------------------------------------------------------------------------------


def _samples(n):
    return [{"key": f"utt{i:03d}", "txt": f"text {i}", "flac": tone(400 + i), "sample_rate": 16000,
             "feats.npy": np.arange(6, dtype=np.float32).reshape(3, 2) + i, "json": {"i": i},
             "cls": i % 3} for i in range(n)]


def test_shardwriter_round_trip_through_read_shards_and_decode(tmp_path):
    samples = _samples(3)
    path = str(tmp_path / "rt.tar")
    assert write_shard(path, samples) == 3
    got = list(IterableWrapper([path]).open_files(mode="b").read_shards().decode())
    for s, o in zip(got, samples, strict=True):
        assert s["key"] == o["key"] and s["text"] == o["txt"] and s["meta"] == o["json"]
        assert s["cls"] == o["cls"] and s["sample_rate"] == 16000
        assert np.array_equal(s["audio"], o["flac"]) and np.array_equal(s["feats"], o["feats.npy"])


def test_shardwriter_rolls_over_at_maxcount(tmp_path):
    with ShardWriter(str(tmp_path / "data-%05d.tar"), maxcount=2) as writer:
        for s in _samples(5):
            writer.write(s)
    assert [os.path.basename(p) for p in writer.paths] == [
        "data-00000.tar", "data-00001.tar", "data-00002.tar"]
    counts = []
    for p in writer.paths:
        with open(p, "rb") as f:
            counts.append([s["key"] for s in group_by_key(iter_tar_members(f))])
    assert counts == [["utt000", "utt001"], ["utt002", "utt003"], ["utt004"]]
    assert writer.total == 5


def test_shardwriter_rolls_over_at_maxsize(tmp_path):
    with ShardWriter(str(tmp_path / "d-%03d.tar"), maxsize=3 * 1024) as writer:
        for i in range(4):
            writer.write({"key": f"u{i}", "bin": bytes(1000)})  # 1536 bytes a sample
    assert [os.path.basename(p) for p in writer.paths] == ["d-000.tar", "d-001.tar"]


def _sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def test_shardwriter_is_deterministic_and_headers_are_fixed(tmp_path):
    digests = []
    for run in ("one", "two"):
        (tmp_path / run).mkdir()
        with ShardWriter(str(tmp_path / run / "d-%05d.tar"), maxcount=2) as writer:
            for s in _samples(3):
                writer.write(s)
        digests.append([_sha256(p) for p in writer.paths])
    assert digests[0] == digests[1] and len(digests[0]) == 2
    with tarfile.open(tmp_path / "one" / "d-00000.tar") as tar:
        infos = tar.getmembers()
    assert [i.name for i in infos[:5]] == ["utt000.cls", "utt000.feats.npy", "utt000.flac",
                                           "utt000.json", "utt000.txt"]  # sorted fields
    assert {(i.mtime, i.uid, i.gid, i.uname, i.gname, i.mode) for i in infos} == {
        (0, 0, 0, "", "", 0o444)}


def test_shardwriter_leaves_no_tmp_file(tmp_path):
    with ShardWriter(str(tmp_path / "d-%05d.tar"), maxcount=1) as writer:
        for s in _samples(2):
            writer.write(s)
    assert sorted(os.listdir(tmp_path)) == ["d-00000.tar", "d-00001.tar"]


def test_interrupted_writer_leaves_no_partial_shard_under_its_name(tmp_path):
    with pytest.raises(RuntimeError, match="killed"):
        with ShardWriter(str(tmp_path / "d-%05d.tar"), maxcount=2) as writer:
            for s in _samples(3):
                writer.write(s)
            assert os.path.exists(tmp_path / "d-00001.tar.tmp")
            raise RuntimeError("killed")
    # the completed first shard stays; the second one, being written, is gone
    assert sorted(os.listdir(tmp_path)) == ["d-00000.tar"]


def test_writer_killed_mid_shard_leaves_only_a_tmp_file(tmp_path):
    # A process killed without running __exit__ (simulated: never closed) leaves only .tmp.
    writer = ShardWriter(str(tmp_path / "one.tar"))
    writer.write(_samples(1)[0])
    assert os.listdir(tmp_path) == ["one.tar.tmp"]
    writer.abort()
    assert os.listdir(tmp_path) == []


def test_write_shard_with_no_samples_writes_a_valid_empty_archive(tmp_path):
    path = tmp_path / "empty.tar"
    assert write_shard(str(path), []) == 0
    assert members_of(path.read_bytes()) == []


@pytest.mark.parametrize("sample, error, match", [
    ({"txt": "x"}, ValueError, "needs a non-empty str 'key'"),
    ({"key": "utt.1", "txt": "x"}, ValueError, "the part after the last '/' must be without dots"),
    # Issue 34, item 8: keys that would make members escape the folder tar unpacks into.
    ({"key": "../../evil", "txt": "x"}, ValueError, "key '../../evil' cannot be written: its "
                                                    "parts must not be '.', '..' or empty"),
    ({"key": "a/./b", "txt": "x"}, ValueError, "parts must not be '.', '..' or empty"),
    ({"key": "a//b", "txt": "x"}, ValueError, "parts must not be '.', '..' or empty"),
    ({"key": "/abs", "txt": "x"}, ValueError, "must be a relative path"),
    ({"key": "..\\evil", "txt": "x"}, ValueError, "must not hold a backslash or NUL"),
    ({"key": "u1"}, ValueError, "has no field to write"),
    ({"key": "u1", "pkl": b"\x80\x04N."}, ValueError, "neither writes nor reads pickles"),
    ({"key": "u1", "speaker": "spk1"}, TypeError, "no encoder for extension 'speaker'"),
    ({"key": "u1", "flac": np.zeros(10, np.float32)}, ValueError, "needs the sample's "
                                                                    "'sample_rate'"),
    ({"key": "u1", "feats.npy": np.array([None], dtype=object)}, ValueError, "Object arrays"),
])
def test_writer_rejects_samples_it_cannot_write_faithfully(tmp_path, sample, error, match):
    with pytest.raises(error, match=match):
        write_shard(str(tmp_path / "x.tar"), [sample])
    assert os.listdir(tmp_path) == []


def test_writer_rejects_a_repeated_consecutive_key(tmp_path):
    with pytest.raises(ValueError, match="repeats the previous sample's key"):
        write_shard(str(tmp_path / "x.tar"), [{"key": "u1", "txt": "a"}, {"key": "u1", "txt": "b"}])


@pytest.mark.parametrize("kwargs, match", [
    ({"maxcount": 0}, "maxcount must be a positive int"),
    ({"maxsize": -1}, "maxsize must be a positive int"),
    ({"start_shard": -1}, "start_shard must be an int >= 0"),
])
def test_shardwriter_validates_arguments(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        ShardWriter(str(tmp_path / "d-%05d.tar"), **kwargs)


def test_shardwriter_rollover_needs_a_numbered_pattern(tmp_path):
    with pytest.raises(ValueError, match="needs a shard number such as '%05d'"):
        ShardWriter(str(tmp_path / "plain.tar"), maxcount=10)


# --------------------------------------------------------------------------------------------
# property tests: arbitrary input raises only DataError
# --------------------------------------------------------------------------------------------

VALID = make_tar([("a/u1.txt", b"hello"), ("a/u1.feats.npy", b"\x93NUMPY" + bytes(200)),
                  ("日本/" + "x" * 120 + ".json", b"{}"), ("a/u2.txt", b"z" * 700)])
VALID_GNU = make_tar([("y" * 130 + ".txt", b"long"), ("u3.bin", b"q" * 513)],
                     fmt=tarfile.GNU_FORMAT)


def _consume(data: bytes) -> None:
    list(group_by_key(iter_tar_members(io.BytesIO(data), source="p.tar"), source="p.tar"))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=3000))
def test_random_bytes_raise_only_data_error(data):
    try:
        _consume(data)
    except DataError:
        pass


@settings(max_examples=150, deadline=None)
@given(st.sampled_from([VALID, VALID_GNU]), st.data())
def test_truncated_valid_tar_always_raises_data_error(tar, draw):
    # The end-of-archive marker starts where the last payload's padding ends.
    last_payload_offset = list(offsets(tar).values())[-1][1]
    end = last_payload_offset + len(pad(members_of(tar)[-1][1]))
    cut = draw.draw(st.integers(0, end + 511))
    with pytest.raises(DataError, match="p.tar"):
        _consume(tar[:cut])


@settings(max_examples=150, deadline=None)
@given(st.sampled_from([VALID, VALID_GNU]),
       st.lists(st.tuples(st.integers(0, len(VALID) - 1), st.integers(1, 255)), max_size=4))
def test_flipped_bytes_raise_only_data_error_or_read(tar, flips):
    data = bytearray(tar)
    for pos, mask in flips:
        data[pos % len(data)] ^= mask
    try:
        _consume(bytes(data))
    except DataError:
        pass


def _with_checksum(header: bytes) -> bytes:
    h = bytearray(header)
    h[148:156] = b" " * 8
    h[148:156] = b"%06o\0 " % sum(h)
    return bytes(h)


_header = st.builds(
    lambda raw, flag, size, name: _with_checksum(
        name.ljust(100, b"\0")[:100] + raw[100:124] + size + raw[136:156] + flag + raw[157:]),
    st.binary(min_size=512, max_size=512),
    st.sampled_from([b"0", b"\0", b"5", b"x", b"g", b"L", b"K", b"2", b"1", b"7", b"S", b"?"]),
    st.one_of(st.sampled_from([b"%011o\0" % n for n in (0, 1, 11, 100, 511, 512, 600)]),
              st.binary(min_size=12, max_size=12)),
    st.sampled_from([b"u1.txt", b"u1", b".x", b"a/b.c.d", b"u1.txt/", b"", "ü.txt".encode()]),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_header, st.binary(max_size=700)), max_size=4),
       st.sampled_from([b"", bytes(512), bytes(1024)]))
def test_headers_with_valid_checksums_and_random_fields_raise_only_data_error(parts, end):
    # Exercises size/typeflag/pax/long-name parsing, which random bytes rarely reach.
    data = b"".join(h + p for h, p in parts) + end
    try:
        _consume(data)
    except DataError:
        pass


def test_valid_property_fixtures_read_cleanly():
    assert len(members_of(VALID)) == 4 and len(members_of(VALID_GNU)) == 2
    assert json.loads(dict(members_of(VALID))["日本/" + "x" * 120 + ".json"]) == {}


# --------------------------------------------------------------------------------------------
# memory-mapped local files: the same members and errors as the reading path, payloads as views
# --------------------------------------------------------------------------------------------

BIG = 1 << 16  # payloads from this size on are views of the mapping (_tar._VIEW_MIN)
MAPPED = ShardReadOptions(mmap=True)
READ = ShardReadOptions(mmap=False)


def _mixed_tar() -> bytes:
    """Large and small payloads, pax and GNU long names, a directory, sizes around BIG."""
    rng = np.random.default_rng(1)
    members = [("dir", (tarfile.DIRTYPE,))]
    for i, n in enumerate([BIG - 1, BIG, BIG + 1, 3, 0, 700_000, 512, 1 << 20]):
        members.append((f"dir/utt{i}.npy", rng.bytes(n)))
        members.append((f"dir/utt{i}.txt", f"text {i}".encode()))
    members.append(("日本/" + "x" * 130 + ".npy", rng.bytes(BIG + 5)))
    return make_tar(members, fmt=tarfile.PAX_FORMAT)


def _both_paths(path, source="s.tar"):
    """(members or the error message, final stream position) mapped and read."""
    out = []
    for options in (MAPPED, READ):
        got = []
        with open(path, "rb") as f:
            try:
                for name, data in iter_tar_members(f, source=source, read_options=options):
                    got.append((name, bytes(data)))
                result = ("ok", got, f.tell())
            except DataError as err:
                result = ("error", got, str(err))
        out.append(result)
    return out


def test_mmap_gives_the_members_of_the_reading_path_with_large_payloads_as_views(tmp_path):
    path = tmp_path / "mixed.tar"
    path.write_bytes(_mixed_tar())
    mapped, read = _both_paths(path)
    assert mapped == read and mapped[0] == "ok" and len(mapped[1]) == 17
    with open(path, "rb") as f:
        members = list(iter_tar_members(f, source="s.tar"))  # the default maps local files
    expected = dict(members_of(path.read_bytes()))
    for name, data in members:
        assert bytes(data) == expected[name]
        if len(data) >= BIG:
            assert isinstance(data, memoryview) and data.readonly
        else:
            assert type(data) is bytes


def test_mmap_on_a_multi_shard_corpus_written_by_shardwriter(tmp_path):
    rng = np.random.default_rng(0)
    samples = [{"key": f"utt{i}", "feats.npy": rng.standard_normal((40 * i + 1, 80),
                                                                    dtype=np.float32),
                "txt": f"words {i}", "json": {"i": i}} for i in range(12)]
    with ShardWriter(str(tmp_path / "d-%05d.tar"), maxcount=5) as writer:
        for s in samples:
            writer.write(s)
    for p in writer.paths:
        mapped, read = _both_paths(p)
        assert mapped == read and mapped[0] == "ok"
    got = list(IterableWrapper(writer.paths).open().read_shards().decode())
    assert [s["key"] for s in got] == [s["key"] for s in samples]
    for s, o in zip(got, samples):
        assert np.array_equal(s["feats"], o["feats.npy"]) and not s["feats"].flags.writeable
        assert s["text"] == o["txt"] and s["meta"] == o["json"]


def _in_a_mapping(array: np.ndarray) -> bool:
    """Whether ``array`` is a view of a memory-mapped file (else of copied bytes)."""
    import mmap

    base = array
    while isinstance(base, np.ndarray):
        base = base.base
    return isinstance(base, memoryview) and isinstance(base.obj, mmap.mmap)


@pytest.mark.skipif(sys.version_info >= (3, 13), reason="3.13+ maps without a descriptor")
def test_held_samples_map_no_more_shards_than_the_descriptor_budget(tmp_path, monkeypatch):
    """Every sample is held (as a buffer would), each keeping its shard's mapping -- and on
    Python < 3.13 a file descriptor -- alive: with a budget of 3, the first shards are mapped
    and the rest read (copied), and the samples are the same as with mapping off."""
    from speechpipe.memory import _mmap as mmap_module

    rng = np.random.default_rng(0)
    samples = [{"key": f"utt{i:02d}", "feats.npy": rng.standard_normal((300, 80),
                                                                        dtype=np.float32)}
               for i in range(20)]
    with ShardWriter(str(tmp_path / "d-%05d.tar"), maxcount=2) as writer:
        for sample in samples:
            writer.write(sample)
    assert len(writer.paths) == 10
    monkeypatch.setattr(mmap_module, "_fd_budget", lambda: 3)
    import gc
    gc.collect()  # mappings other tests left to the collector must not be freed during ours
    base = mmap_module._live_mappings
    held, most = [], 0
    for sample in IterableWrapper(writer.paths).open().read_shards().decode():
        held.append(sample)
        most = max(most, mmap_module._live_mappings - base)
    assert most == 3  # mapped up to the budget, never past it
    assert [_in_a_mapping(s["feats"]) for s in held] == [True] * 6 + [False] * 14
    read = list(IterableWrapper(writer.paths).open().read_shards(read_options=READ).decode())
    assert [s["key"] for s in held] == [s["key"] for s in read] == [s["key"] for s in samples]
    for got, want in zip(held, samples):
        assert np.array_equal(got["feats"], want["feats.npy"])
    del held, sample
    gc.collect()
    assert mmap_module._live_mappings == base  # each mapping is uncounted when it goes


def test_the_stream_ends_where_the_reading_path_leaves_it(tmp_path):
    data = make_tar([("a.txt", b"1"), ("a.npy", b"z" * BIG)])
    for tail in (b"", bytes(3 << 20)):  # record padding; more than the 1 MiB read after it
        path = tmp_path / "t.tar"
        path.write_bytes(data + tail)
        mapped, read = _both_paths(path)
        assert mapped == read and mapped[0] == "ok"


def test_mmap_reads_from_the_stream_position(tmp_path):
    path = tmp_path / "prefixed.tar"
    tar = make_tar([("u1.npy", b"q" * (BIG + 3)), ("u1.txt", b"t")])
    path.write_bytes(b"junk" * 1000 + tar)
    with open(path, "rb") as f:
        f.read(4000)
        got = [(n, bytes(d), type(d)) for n, d in iter_tar_members(f, read_options=MAPPED)]
    assert got == [("u1.npy", b"q" * (BIG + 3), memoryview), ("u1.txt", b"t", bytes)]


def _cuts(tar: bytes) -> list[int]:
    """Cut points around every header and inside every payload (and the end marker)."""
    cuts = {0, 1, 100, len(tar) - 1}
    for header, payload in offsets(tar).values():
        cuts.update({header, header + 1, header + 300, header + 511, payload, payload + 1,
                     payload + 700, payload + BIG - 1, payload + BIG + 1})
    return sorted(c for c in cuts if 0 <= c < len(tar))


def test_truncated_shards_raise_the_same_data_error_on_the_mapped_path(tmp_path):
    tar = make_tar([("u1.txt", b"a" * 100), ("u2.npy", b"b" * (BIG + 100)),
                    ("u3.npy", b"c" * 3000), ("y" * 130 + ".npy", b"d" * (BIG * 2))],
                   fmt=tarfile.GNU_FORMAT)
    end = offsets(tar)["y" * 130 + ".npy"][1] + len(pad(b"d" * BIG * 2))
    path = tmp_path / "cut.tar"
    checked = 0
    for cut in _cuts(tar) + [end, end + 100, end + 511]:
        if cut >= end + 512:  # the first zero block is the end of the archive
            continue
        path.write_bytes(tar[:cut])
        mapped, read = _both_paths(path, source="shards/s-00007.tar")
        assert mapped == read, cut
        assert mapped[0] == "error" and mapped[2].startswith("shards/s-00007.tar"), cut
        checked += 1
    assert checked > 30
    path.write_bytes(tar[:offsets(tar)["u2.npy"][1] + 5000])
    with open(path, "rb") as f, pytest.raises(DataError) as exc:
        list(iter_tar_members(f, source="shards/s-00007.tar", read_options=MAPPED))
    assert str(exc.value).startswith("shards/s-00007.tar [member u2.npy]: truncated shard: "
                                     f"member payload has 5000 of {BIG + 100} bytes")


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([VALID, VALID_GNU]),
       st.lists(st.tuples(st.integers(0, len(VALID) - 1), st.integers(1, 255)), max_size=4),
       st.integers(0, len(VALID)))
def test_corrupt_or_cut_shards_behave_the_same_mapped_and_read(tmp_path_factory, tar, flips,
                                                               cut):
    data = bytearray(tar)
    for pos, mask in flips:
        data[pos % len(data)] ^= mask
    path = tmp_path_factory.mktemp("corrupt") / "p.tar"
    path.write_bytes(bytes(data[:cut]) if cut < len(data) else bytes(data))
    mapped, read = _both_paths(path, source="p.tar")
    assert mapped == read


def test_views_outlive_the_closed_stream_and_the_mapping_goes_with_them(tmp_path):
    fds = "/proc/self/fd"
    if not os.path.isdir(fds):
        pytest.skip("needs /proc/self/fd")
    path = tmp_path / "v.tar"
    path.write_bytes(make_tar([("u1.npy", b"x" * BIG * 2), ("u1.txt", b"t")]))
    before = len(os.listdir(fds))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no ResourceWarning on any path
        with open(path, "rb") as f:
            members = dict(iter_tar_members(f, source="v.tar", read_options=MAPPED))
        assert bytes(members["u1.npy"]) == b"x" * BIG * 2  # read after the file was closed
        own_fd = 1 if sys.version_info < (3, 13) else 0  # the mapping's descriptor (trackfd)
        assert len(os.listdir(fds)) == before + own_fd
        del members
        assert len(os.listdir(fds)) == before  # unmapped with its last view
        with open(path, "rb") as f:  # no view handed out: unmapped when the shard is done
            assert [n for n, _ in iter_tar_members(f, read_options=MAPPED)] == ["u1.npy", "u1.txt"]
        assert len(os.listdir(fds)) == before
        with open(path, "rb") as f:  # stopped early: unmapped when the generator is closed
            it = iter_tar_members(f, read_options=MAPPED)
            next(it)
            it.close()
        assert len(os.listdir(fds)) == before


def _mapped_rss(path) -> int:
    """Bytes of ``path``'s mappings in this process's page table (``/proc/self/smaps``)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            first = line.split(maxsplit=1)[0]
            if "-" in first and not first.endswith(":"):  # a mapping's header line
                inside = line.rstrip("\n").endswith(str(path))
            elif inside and first == "Rss:":
                total += int(line.split()[1]) * 1024
    return total


def test_pages_read_past_leave_the_page_table_while_held_views_still_read(tmp_path,
                                                                           monkeypatch):
    # Issue 23.8: samples held in buffers kept their whole shard's pages in the process's RSS
    # (every shard of an epoch, 3.3 GB file-backed). Pages the reader has passed are dropped
    # from the page table every _DROP_STEP bytes, and so are finished shards' whose views live
    # on; the views still read the same bytes (faulted back in from the page cache).
    from speechpipe.memory import _mmap

    if not os.path.exists("/proc/self/smaps"):
        pytest.skip("needs /proc/self/smaps")
    monkeypatch.setattr(_mmap, "_DROP_STEP", 1 << 20)
    size = 8 << 20
    payloads = {f"u{i}.npy": bytes([i]) * BIG for i in range(size // BIG)}
    paths = [tmp_path / "a.tar", tmp_path / "b.tar"]
    for path in paths:
        path.write_bytes(make_tar(list(payloads.items())))
    held = {}
    options = ShardReadOptions(mmap=True, readahead=False)
    for path in paths:
        with open(path, "rb") as f:
            for name, view in iter_tar_members(f, source=path.name, read_options=options):
                assert view[0] == payloads[name][0]  # touched, as decode does
                held[(path.name, name)] = view
        if path == paths[0]:
            assert _mapped_rss(path) < 2 << 20  # all but the last step dropped behind
    assert _mapped_rss(paths[0]) == 0  # finished, its views held: dropped as b was read
    assert all(bytes(v) == payloads[n] for (_, n), v in held.items())  # still the same bytes


def test_collating_held_samples_after_the_last_shard_keeps_their_pages_out_of_rss(
        tmp_path, monkeypatch):
    # Issue 23.8: at an epoch's end the buffers (thousands of samples) drain with no reader
    # left to drop pages, and collation read every held sample back into RSS (1.6 GB of the
    # 2.3 GB peak of the pipeline). Collation reports the bytes it copies out of
    # read-only views; every _DROP_STEP of them the finished shards' pages leave the table.
    from speechpipe.memory import _mmap
    from speechpipe.pipes.collate import pad_field

    if not os.path.exists("/proc/self/smaps"):
        pytest.skip("needs /proc/self/smaps")
    monkeypatch.setattr(_mmap, "_DROP_STEP", 1 << 20)
    path = tmp_path / "feats.tar"
    rng = np.random.default_rng(0)
    arrays = {f"u{i:02d}": rng.standard_normal((500 + 37 * i, 80)).astype(np.float32)
              for i in range(40)}  # 7.8 MB of features
    write_shard(str(path), [{"key": k, "feats.npy": a} for k, a in arrays.items()])
    pipe = IterableWrapper([str(path)]).open().read_shards(
        read_options=ShardReadOptions(mmap=True, readahead=False)).decode()
    held = list(pipe)  # the whole shard read and finished, every sample held (a buffer)
    assert not held[0]["feats"].flags.writeable  # views of the mapping
    for start in range(0, len(held), 8):  # drain: batches collated one after another
        batch = held[start:start + 8]
        out, lengths = pad_field([s["feats"] for s in batch], name="feats")
        for row, (sample, n) in enumerate(zip(batch, lengths.tolist())):
            assert np.array_equal(out[row, :n].numpy(), arrays[sample["key"]])
    assert _mapped_rss(path) < 2 << 20  # without the drops: the whole 7.8 MB


@pytest.mark.parametrize("road", ["decode", "DecodeCollate"])
def test_decoding_held_audio_after_the_last_shard_keeps_its_pages_out_of_rss(
        tmp_path, monkeypatch, road):
    # As collation for arrays: the audio decoders copy a mapped payload out (soundfile reads a
    # copy) and report it, so a drain of held audio samples does not fill RSS either.
    from speechpipe.memory import _mmap
    from speechpipe.pipes.collate import DecodeCollate
    from speechpipe.pipes.decode import decode_sample

    if not os.path.exists("/proc/self/smaps"):
        pytest.skip("needs /proc/self/smaps")
    monkeypatch.setattr(_mmap, "_DROP_STEP", 1 << 20)
    path = tmp_path / "audio.tar"
    rng = np.random.default_rng(1)
    samples = []
    for i in range(30):
        buffer = io.BytesIO()
        soundfile.write(buffer, rng.uniform(-0.5, 0.5, 48000).astype(np.float32), 16000,
                        format="FLAC")
        samples.append({"key": f"a{i:02d}", "flac": buffer.getvalue()})
    write_shard(str(path), samples)
    pipe = IterableWrapper([str(path)]).open().read_shards(
        read_options=ShardReadOptions(mmap=True, readahead=False))
    held = list(pipe)  # the shard read and finished, every sample held
    assert all(isinstance(s["flac"], memoryview) for s in held)
    if road == "decode":
        decoded = [decode_sample(s) for s in held]
        assert len(decoded) == 30
    else:
        for start in range(0, 30, 6):
            assert DecodeCollate()(held[start:start + 6])["audio"].shape[0] == 6
    assert _mapped_rss(path) < 2 << 20  # without the reports: every payload's pages


def test_a_shard_shrinking_while_mapped_raises_instead_of_crashing(tmp_path):
    path = tmp_path / "shrink.tar"
    tar = make_tar([("u1.npy", b"a" * BIG), ("u2.npy", b"b" * BIG), ("u3.npy", b"c" * BIG)])
    path.write_bytes(tar)
    with open(path, "rb") as f:
        it = iter_tar_members(f, source="shrink.tar", read_options=MAPPED)
        name, _ = next(it)  # u1's view is not touched after the cut below
        assert name == "u1.npy"
        os.truncate(path, offsets(tar)["u3.npy"][1] + 10)
        with pytest.raises(DataError, match=rf"^shrink.tar: the shard file shrank from "
                                            rf"{len(tar)} to .* bytes while it was being read "
                                            r"\(after member 'u1.npy'\)"):
            next(it)


def test_streams_that_are_not_plain_local_files_are_read(tmp_path):
    import gzip

    tar = make_tar([("u1.npy", b"g" * (BIG + 1)), ("u1.txt", b"t")])
    path = tmp_path / "s.tar.gz"
    path.write_bytes(gzip.compress(tar, mtime=0))
    expected = [("u1.npy", b"g" * (BIG + 1)), ("u1.txt", b"t")]
    with open(path, "rb") as raw_file, gzip.GzipFile(fileobj=raw_file) as f:
        # a decompressor has a fileno() of the compressed file: it must not be mapped
        assert list(iter_tar_members(f, read_options=MAPPED)) == expected
    buffered = io.BufferedReader(io.BytesIO(tar))
    assert list(iter_tar_members(buffered, read_options=MAPPED)) == expected
    for _, data in iter_tar_members(io.BytesIO(tar), read_options=MAPPED):
        assert type(data) is bytes


def test_torch_open_files_streams_are_mapped(tmp_path):
    path = str(tmp_path / "t.tar")
    write_shard(path, [{"key": "u1", "opus": b"w" * BIG, "txt": "hi"}])
    [sample] = IterableWrapper([path]).open_files(mode="b").read_shards()
    assert isinstance(sample["opus"], memoryview) and bytes(sample["opus"]) == b"w" * BIG
    assert sample["txt"] == b"hi" and type(sample["txt"]) is bytes


def test_mmap_is_turned_off_by_argument_and_by_nothing_else(tmp_path, monkeypatch):
    """``ShardReadOptions(mmap=False)`` reads; settings are arguments: the environment
    variable earlier versions read changes nothing."""
    path = str(tmp_path / "t.tar")
    write_shard(path, [{"key": "u1", "opus": b"w" * BIG}])
    [s] = IterableWrapper([path]).open().read_shards(read_options=READ)
    assert type(s["opus"]) is bytes
    monkeypatch.setenv("SPEECHPIPE_SHARD_MMAP", "0")
    [s] = IterableWrapper([path]).open().read_shards()
    assert type(s["opus"]) is memoryview
    with pytest.raises(TypeError, match="mmap must be True, False or None"):
        ShardReadOptions(mmap="yes")
    with pytest.raises(TypeError, match="read_options must be a ShardReadOptions or None"):
        IterableWrapper([path]).open().read_shards(read_options={"mmap": False})


def test_sharded_shuffle_reads_mapped_shards_like_read_ones(tmp_path):
    rng = np.random.default_rng(2)
    feats = {f"u{i}": rng.standard_normal((300 + i, 80), dtype=np.float32) for i in range(9)}
    with ShardWriter(str(tmp_path / "d-%05d.tar"), maxcount=4) as writer:
        for key, value in feats.items():
            writer.write({"key": key, "feats.npy": value, "txt": key})

    def run(options=None):
        pipe = IterableWrapper(writer.paths).sharded_shuffle(buffer_size=5, seed=3,
                                                             read_options=options).decode()
        return [(s["key"], s["feats"], s["text"]) for s in pipe]

    mapped = run()
    read = run(READ)
    assert [k for k, _, _ in mapped] == [k for k, _, _ in read] and len(mapped) == 9
    for (key, a, text), (_, b, _) in zip(mapped, read):
        assert np.array_equal(a, b) and np.array_equal(a, feats[key]) and text == key
        assert isinstance(a.base, memoryview) or isinstance(a.base.base, memoryview)


def test_sharded_shuffle_mmap_false_reads_payloads_as_bytes(tmp_path):
    big = np.zeros((300, 80), np.float32)  # 96 KB: a view when mapped
    with ShardWriter(str(tmp_path / "d-%05d.tar"), maxcount=4) as writer:
        writer.write({"key": "u1", "feats.npy": big, "txt": "u1"})
    mapped = list(IterableWrapper(writer.paths).sharded_shuffle(buffer_size=1))
    read = list(IterableWrapper(writer.paths).sharded_shuffle(buffer_size=1, read_options=READ))
    assert isinstance(mapped[0]["feats.npy"], memoryview)
    assert isinstance(read[0]["feats.npy"], bytes)
    assert bytes(mapped[0]["feats.npy"]) == read[0]["feats.npy"]
    with pytest.raises(TypeError, match="read_options must be a ShardReadOptions or None"):
        IterableWrapper(writer.paths).sharded_shuffle(read_options="no")


def test_mapped_text_and_unknown_members_stay_bytes_whatever_their_size(tmp_path):
    path = str(tmp_path / "d-00000.tar")
    big_text = "x" * (1 << 17)
    write_shard(path, [{"key": "u1", "txt": big_text, "meta.json": {"t": big_text},
                        "feats.npy": np.zeros((300, 80), np.float32)}])
    with open(path, "rb") as f:
        members = dict(iter_tar_members(f, source=path))
    assert isinstance(members["u1.feats.npy"], memoryview)  # an array: a view
    assert isinstance(members["u1.txt"], bytes) and members["u1.txt"].decode() == big_text
    assert isinstance(members["u1.meta.json"], bytes)


def test_shards_on_a_network_file_system_are_read_unless_mapping_is_asked_for(
        tmp_path, monkeypatch):
    from speechpipe.memory import _mmap as mmap_module

    path = str(tmp_path / "d-00000.tar")
    write_shard(path, [{"key": "u1", "feats.npy": np.zeros((300, 80), np.float32)}])
    real = os.path.realpath(str(tmp_path))
    for fstype, mapped in (("nfs4", False), ("fuse.sshfs", False), ("lustre", False),
                           ("ext4", True)):
        monkeypatch.setattr(mmap_module, "_mount_table", [(real, fstype), ("/", "ext4")])
        with open(path, "rb") as f:
            [(_, payload)] = iter_tar_members(f, source=path)
        assert isinstance(payload, memoryview) is mapped, fstype
        with open(path, "rb") as f:  # asked for: mapped wherever the file is
            [(_, payload)] = iter_tar_members(f, source=path, read_options=MAPPED)
        assert isinstance(payload, memoryview), fstype
    assert mmap_module._on_network_fs(os.path.join(real, "sub", "x.tar")) is False  # ext4 last
    monkeypatch.setattr(mmap_module, "_mount_table", [(real + "/sub", "nfs"), ("/", "ext4")])
    assert mmap_module._on_network_fs(os.path.join(real, "sub", "x.tar"))
    assert not mmap_module._on_network_fs(os.path.join(real, "subway", "x.tar"))


def test_the_mount_table_is_read_from_proc():
    from speechpipe.memory import _mmap as mmap_module

    table = mmap_module._mounts()
    if not os.path.exists("/proc/self/mounts"):
        assert table == []
        return
    assert ("/", table[-1][1]) == table[-1] or any(p == "/" for p, _ in table)
    assert [len(p) for p, _ in table] == sorted((len(p) for p, _ in table), reverse=True)
