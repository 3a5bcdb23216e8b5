"""pack_data and the pack command: Kaldi tables / manifests -> tar shards + index.jsonl.

Invariants: every utterance in both data and labels is packed exactly once (or counted as out
of range / mismatched), in sorted key order; arrays and labels read back unchanged; the same
inputs give the same bytes; a shard name on disk always holds a complete shard.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import tarfile

import kaldiio
import numpy as np
import pytest
import soundfile
import webdataset as wds

import speechpipe  # noqa: F401  (registers open, read_shards, decode)
import speechpipe.pack.lengths as pack_module
from speechpipe.cli.pack import add_command as add_pack_command
from speechpipe.errors import DataError, MissingDataError, UnsafeInputError
from speechpipe.testing import pack_digest
from speechpipe.index import INDEX_NAME, ShardIndex
from speechpipe.pack import PackOptions, PackReport, pack_data, parse_length_groups, plan_pack
from speechpipe.pipes.shards import _writer as shards_module
from speechpipe.pipes._core import IterableWrapper
from speechpipe.pipes.shards import iter_tar_members

# --------------------------------------------------------------------------------------------
# helpers: real inputs written with kaldiio and soundfile
# --------------------------------------------------------------------------------------------


def write_feats(folder, name, shapes, *, dtype=np.float32, seed=0, **kwargs):
    """An ark + scp of random matrices ``{key: (frames, dim)}``; returns (scp path, arrays)."""
    rng = np.random.default_rng(seed)
    arrays = {k: rng.standard_normal(shape).astype(dtype) for k, shape in shapes.items()}
    scp = os.path.join(folder, f"{name}.scp")
    with kaldiio.WriteHelper(f"ark,scp:{folder}/{name}.ark,{scp}", **kwargs) as writer:
        for key, array in arrays.items():
            writer(key, array)
    return scp, arrays


def write_text(path, labels):
    with open(path, "w", encoding="utf-8") as f:
        for key, text in labels.items():
            f.write(f"{key} {text}\n")
    return str(path)


def write_wavs(folder, lengths, *, rate=8000, subtype="PCM_16", seed=0, name="wav.scp"):
    """One wav file per key with random int16 samples; returns (wav.scp, {key: int16 array})."""
    rng = np.random.default_rng(seed)
    arrays, lines = {}, []
    for key, n in lengths.items():
        samples = rng.integers(-32768, 32768, n, dtype=np.int16)
        path = os.path.join(folder, f"{key}.wav")
        if subtype == "PCM_16":
            soundfile.write(path, samples, rate, subtype="PCM_16")
        else:
            samples = rng.uniform(-0.9, 0.9, n).astype(np.float32)
            soundfile.write(path, samples, rate, subtype=subtype)
        arrays[key] = samples
        lines.append(f"{key} {path}\n")
    scp = os.path.join(folder, name)
    with open(scp, "w") as f:
        f.writelines(lines)
    return scp, arrays


def read_back(folder):
    """Decoded samples of every shard in a folder's index, in index order."""
    paths = ShardIndex.read(folder).paths()
    return list(IterableWrapper(paths).open().read_shards().decode())


def tree_digest(folder):
    """The pack's bytes (:func:`speechpipe.testing.pack_digest`: the indexes' mapped tables,
    a cache recording the index's time, left out); what the tables hold is compared in
    ``test_two_runs_give_byte_identical_shards_and_index``."""
    return pack_digest(folder)


def mtimes(folder):
    return {n: os.stat(os.path.join(folder, n)).st_mtime_ns
            for n in os.listdir(folder) if n.endswith(".tar")}


@pytest.fixture
def feats_corpus(tmp_path):
    """7 utterances in two scp files and two label files (one label Chinese with spaces)."""
    shapes = {f"utt{i}": (10 + 7 * i, 5) for i in range(7)}
    keys = sorted(shapes)
    scp1, a1 = write_feats(str(tmp_path), "feats1", {k: shapes[k] for k in keys[::2]}, seed=1)
    scp2, a2 = write_feats(str(tmp_path), "feats2", {k: shapes[k] for k in keys[1::2]}, seed=2)
    labels = {k: f"text of {k}" for k in keys}
    labels["utt3"] = "你好 世界  和 你"
    text1 = write_text(tmp_path / "text1", {k: labels[k] for k in keys[:4]})
    text2 = write_text(tmp_path / "text2", {k: labels[k] for k in keys[4:]})
    return {"scps": [scp1, scp2], "labels": [text1, text2], "arrays": {**a1, **a2},
            "texts": labels, "out": str(tmp_path / "out")}


def pack_feats(corpus, out=None, **kwargs):
    kwargs.setdefault("utts_per_shard", 3)
    kwargs.setdefault("progress", False)
    return pack_data(corpus["scps"], corpus["labels"], out or corpus["out"], **kwargs)


# --------------------------------------------------------------------------------------------
# round trips
# --------------------------------------------------------------------------------------------


def test_feats_round_trip_keys_arrays_and_labels_unchanged(feats_corpus):
    report = pack_feats(feats_corpus)
    got = read_back(feats_corpus["out"])
    assert [s["key"] for s in got] == sorted(feats_corpus["arrays"])
    for s in got:
        expected = feats_corpus["arrays"][s["key"]]
        assert s["feats"].dtype == np.float32 and np.array_equal(s["feats"], expected)
        assert s["text"] == feats_corpus["texts"][s["key"]]
    assert next(s for s in got if s["key"] == "utt3")["text"] == "你好 世界  和 你"
    assert report.groups == {".": 7} and report.shards_written == 3 and report.kind == "feats"


def test_index_lists_counts_keys_frames_and_file_sizes(feats_corpus):
    report = pack_feats(feats_corpus)
    index = ShardIndex.read(feats_corpus["out"])
    assert index.length_unit == "frames"
    assert [s.name for s in index.shards] == ["data-00000.tar", "data-00001.tar", "data-00002.tar"]
    assert [s.count for s in index.shards] == [3, 3, 1]
    keys = sorted(feats_corpus["arrays"])
    assert [k for s in index.shards for k in s.keys] == keys
    assert index.lengths() == [feats_corpus["arrays"][k].shape[0] for k in keys]
    for entry, path in zip(index.shards, index.paths()):
        assert entry.bytes == os.path.getsize(path)
    assert report.bytes_total == report.bytes_written == index.total_bytes()
    assert report.index_paths == [os.path.join(feats_corpus["out"], INDEX_NAME)]


def test_shard_members_are_feats_npy_and_txt_only(feats_corpus):
    pack_feats(feats_corpus)
    path = ShardIndex.read(feats_corpus["out"]).paths()[0]
    with open(path, "rb") as f:
        names = [name for name, _ in iter_tar_members(f, source=path)]
    assert names == ["utt0.feats.npy", "utt0.txt", "utt1.feats.npy", "utt1.txt",
                     "utt2.feats.npy", "utt2.txt"]


def test_webdataset_reads_the_same_keys_and_payloads(feats_corpus):
    pack_feats(feats_corpus)
    theirs = []
    for path in ShardIndex.read(feats_corpus["out"]).paths():
        with open(path, "rb") as f:  # webdataset's own tar iteration and grouping
            theirs += wds.tariterators.group_by_keys(
                wds.tariterators.tar_file_expander([{"url": path, "stream": f}]))
    assert [s["__key__"] for s in theirs] == sorted(feats_corpus["arrays"])
    for s in theirs:
        array = np.load(io.BytesIO(s["feats.npy"]), allow_pickle=False)
        assert np.array_equal(array, feats_corpus["arrays"][s["__key__"]])
        assert s["txt"].decode("utf-8") == feats_corpus["texts"][s["__key__"]]


def test_compressed_and_double_matrices_measured_from_headers_and_read_exactly(tmp_path):
    scp_cm, _ = write_feats(str(tmp_path), "cm", {"a1": (40, 3), "a2": (9, 3)},
                            compression_method=2)
    scp_dm, doubles = write_feats(str(tmp_path), "dm", {"b1": (12, 4)}, dtype=np.float64)
    text = write_text(tmp_path / "text", {"a1": "x", "a2": "y", "b1": "z"})
    report = pack_data([scp_cm, scp_dm], text, tmp_path / "out", progress=False)
    expected = {k: np.asarray(v, dtype=np.float32) for k, v in kaldiio.load_scp(scp_cm).items()}
    expected["b1"] = doubles["b1"].astype(np.float32)
    got = read_back(str(tmp_path / "out"))
    assert [s["key"] for s in got] == ["a1", "a2", "b1"]
    for s in got:
        assert np.array_equal(s["feats"], expected[s["key"]])
    assert ShardIndex.read(tmp_path / "out").lengths() == [40, 9, 12]
    assert report.utterances == 3


def test_measuring_reads_headers_only_for_binary_matrices(feats_corpus, monkeypatch):
    calls = []
    real = pack_module.read_matrix
    monkeypatch.setattr(pack_module, "read_matrix",
                        lambda *a, **k: calls.append(a) or real(*a, **k))
    pack_feats(feats_corpus)
    assert calls == []  # the frame counts came from the matrix headers


def test_kaldi_row_ranges_are_measured_and_packed(tmp_path):
    scp, arrays = write_feats(str(tmp_path), "feats", {"a": (10, 3)})
    value = (tmp_path / "feats.scp").read_text().split()[1]
    (tmp_path / "sub.scp").write_text(f"a-part {value}[2:5]\n")
    text = write_text(tmp_path / "text", {"a-part": "x"})
    pack_data(str(tmp_path / "sub.scp"), text, tmp_path / "out", progress=False)
    [s] = read_back(str(tmp_path / "out"))
    assert np.array_equal(s["feats"], arrays["a"][2:6])
    assert ShardIndex.read(tmp_path / "out").lengths() == [4]


def test_index_keeps_shard_number_order_with_unpadded_names(tmp_path):
    scp, _ = write_feats(str(tmp_path), "feats", {f"u{i:02d}": (2, 2) for i in range(12)})
    text = write_text(tmp_path / "text", {f"u{i:02d}": "x" for i in range(12)})
    pack_data(scp, text, tmp_path / "out", fmt="shard-%d.tar", utts_per_shard=1,
              progress=False)
    index = ShardIndex.read(tmp_path / "out")
    assert [s.name for s in index.shards] == [f"shard-{i}.tar" for i in range(12)]
    assert [k for s in index.shards for k in s.keys] == [f"u{i:02d}" for i in range(12)]


def test_16bit_audio_is_packed_as_flac_with_exact_int16_values(tmp_path):
    scp, arrays = write_wavs(str(tmp_path), {"u1": 1200, "u2": 333, "u3": 4000})
    text = write_text(tmp_path / "text", {"u1": "one", "u2": "two", "u3": "three"})
    report = pack_data(scp, text, tmp_path / "out", progress=False, utts_per_shard=2)
    assert report.kind == "wav" and report.length_unit == "samples"
    got = read_back(str(tmp_path / "out"))
    assert [s["key"] for s in got] == ["u1", "u2", "u3"]
    for s in got:
        assert s["sample_rate"] == 8000
        assert np.array_equal(s["audio"], arrays[s["key"]].astype(np.float32) / 32768)
    path = ShardIndex.read(tmp_path / "out").paths()[0]
    with open(path, "rb") as f:
        members = dict(iter_tar_members(f, source=path))
    assert sorted(members) == ["u1.flac", "u1.txt", "u2.flac", "u2.txt"]
    ints, rate = soundfile.read(io.BytesIO(members["u1.flac"]), dtype="int16")
    assert rate == 8000 and np.array_equal(ints, arrays["u1"])
    assert ShardIndex.read(tmp_path / "out").lengths() == [1200, 333, 4000]


def test_float_audio_is_packed_as_float_wav_losslessly(tmp_path):
    scp, arrays = write_wavs(str(tmp_path), {"f1": 500}, subtype="FLOAT")
    text = write_text(tmp_path / "text", {"f1": "float"})
    pack_data(scp, text, tmp_path / "out", progress=False)
    path = ShardIndex.read(tmp_path / "out").paths()[0]
    with open(path, "rb") as f:
        assert [n for n, _ in iter_tar_members(f)] == ["f1.txt", "f1.wav"]
    [s] = read_back(str(tmp_path / "out"))
    assert np.array_equal(s["audio"], arrays["f1"])


def test_flac16_rounds_finer_audio_to_16_bits_clips_counted_and_reruns_rewrite(tmp_path):
    scp, arrays = write_wavs(str(tmp_path), {"f1": 500, "f2": 300}, subtype="FLOAT")
    loud = arrays["f2"].copy()
    loud[:3] = [1.5, -1.2, 0.9999999]  # beyond the 16-bit range, and just below 1.0
    soundfile.write(tmp_path / "f2.wav", loud, 8000, subtype="FLOAT")
    text = write_text(tmp_path / "text", {"f1": "a", "f2": "b"})
    report = pack_data(scp, text, tmp_path / "out", audio_format="flac16", progress=False)
    assert report.clipped == 1 and "clipped to 16 bits" in report.report()
    index = ShardIndex.read(tmp_path / "out")
    assert index.audio_format == "flac16"
    with open(index.paths()[0], "rb") as f:
        assert [n for n, _ in iter_tar_members(f)] == ["f1.flac", "f1.txt", "f2.flac", "f2.txt"]
    got = {s["key"]: s["audio"] for s in read_back(str(tmp_path / "out"))}
    for key, source in (("f1", arrays["f1"]), ("f2", loud)):
        want = np.clip(np.rint(source * 32768), -32768, 32767).astype(np.float32) / 32768
        assert np.array_equal(got[key], want)
    assert got["f2"][:3].tolist() == [32767 / 32768, -1.0, 32767 / 32768]
    # the same inputs packed losslessly: the flac16 shards are not kept
    again = pack_data(scp, text, tmp_path / "out", progress=False)
    assert again.shards_written == 1 and again.clipped == 0
    assert ShardIndex.read(tmp_path / "out").audio_format == "lossless"
    got = {s["key"]: s["audio"] for s in read_back(str(tmp_path / "out"))}
    assert np.array_equal(got["f2"], loud)
    with pytest.raises(ValueError, match="audio_format must be one of"):
        pack_data(scp, text, tmp_path / "o2", audio_format="mp3", progress=False)


def test_segments_are_packed_as_slices_of_their_recordings(tmp_path):
    scp, recordings = write_wavs(str(tmp_path), {"rec1": 16000, "rec2": 8000})
    with open(tmp_path / "segments", "w") as f:
        f.write("rec1-a rec1 0.0 0.5\nrec1-b rec1 1.0 2.0\nrec2-a rec2 0.25 -1\n")
    text = write_text(tmp_path / "text", {"rec1-a": "a", "rec1-b": "b", "rec2-a": "c"})
    pack_data(scp, text, tmp_path / "out", segments=tmp_path / "segments", progress=False)
    got = {s["key"]: s for s in read_back(str(tmp_path / "out"))}
    expected = {"rec1-a": recordings["rec1"][0:4000], "rec1-b": recordings["rec1"][8000:16000],
                "rec2-a": recordings["rec2"][2000:8000]}
    assert sorted(got) == sorted(expected)
    for key, ints in expected.items():
        assert np.array_equal(got[key]["audio"], ints.astype(np.float32) / 32768)
    assert ShardIndex.read(tmp_path / "out").lengths() == [4000, 8000, 6000]


def test_seconds_groups_for_audio(tmp_path):
    scp, _ = write_wavs(str(tmp_path), {"s1": 4000, "s2": 8000, "s3": 20000})
    text = write_text(tmp_path / "text", {"s1": "a", "s2": "b", "s3": "c"})
    report = pack_data(scp, text, tmp_path / "out", filter_group=["0:1", "1:2"],
                       length_unit="seconds", progress=False)
    assert report.groups == {"0_1": 1, "1_2": 1} and report.out_of_range == 1
    index = ShardIndex.read(tmp_path / "out" / "1_2")
    assert index.length_unit == "seconds" and index.lengths() == [1.0]


def test_manifests_instead_of_scp_and_labels(tmp_path):
    _, arrays = write_wavs(str(tmp_path), {"m1": 800, "m2": 8000})
    rows = [{"key": "m2", "audio_path": str(tmp_path / "m2.wav"), "text": "第二 句",
             "offset": 0.25, "duration": 0.5},
            {"id": "m1", "audio_filepath": str(tmp_path / "m1.wav"), "text": "first"}]
    manifest = tmp_path / "train.jsonl"
    manifest.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows),
                        encoding="utf-8")
    report = pack_data(None, None, tmp_path / "out", manifests=manifest, progress=False)
    got = read_back(str(tmp_path / "out"))
    assert [(s["key"], s["text"]) for s in got] == [("m1", "first"), ("m2", "第二 句")]
    assert np.array_equal(got[1]["audio"], arrays["m2"][2000:6000].astype(np.float32) / 32768)
    assert ShardIndex.read(tmp_path / "out").lengths() == [800, 4000]
    assert report.kind == "wav"


def test_the_other_fields_of_a_manifest_are_kept_as_a_json_member(tmp_path):
    # Issue 32, 9: pack kept audio and text only; speaker, chapter, Common Voice's age,
    # gender, accent were dropped.
    write_wavs(str(tmp_path), {"m1": 800, "m2": 800, "m3": 400})
    rows = [{"key": "m1", "audio_path": str(tmp_path / "m1.wav"), "text": "a", "speaker": "103",
             "chapter": "1240", "duration": 0.1, "sample_rate": 8000},
            {"key": "m2", "path": str(tmp_path / "m2.wav"), "sentence": "b", "age": "twenties",
             "gender": "female", "accent": "Écosse", "locale": "fr", "up_votes": 2},
            {"key": "m3", "audio_path": str(tmp_path / "m3.wav"), "text": "c"}]
    manifest = tmp_path / "train.jsonl"
    manifest.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows),
                        encoding="utf-8")
    pack_data(None, None, tmp_path / "out", manifests=manifest, progress=False)
    with tarfile.open(tmp_path / "out" / "data-00000.tar") as tar:
        members = tar.getnames()
        m2 = tar.extractfile("m2.json").read()
    assert members == ["m1.flac", "m1.json", "m1.txt", "m2.flac", "m2.json", "m2.txt",
                       "m3.flac", "m3.txt"]
    assert m2 == ('{"accent": "Écosse", "age": "twenties", "gender": "female", "locale": "fr", '
                  '"up_votes": 2}').encode("utf-8")
    got = {s["key"]: s.get("meta") for s in read_back(str(tmp_path / "out"))}
    assert got == {"m1": {"chapter": "1240", "speaker": "103"},
                   "m2": {"accent": "Écosse", "age": "twenties", "gender": "female",
                          "locale": "fr", "up_votes": 2},
                   "m3": None}
    # a rerun recognises the three-member samples as complete
    report = pack_data(None, None, tmp_path / "out", manifests=manifest, progress=False)
    assert (report.shards_written, report.shards_skipped) == (0, 1)
    os.remove(tmp_path / "out" / INDEX_NAME)
    report = pack_data(None, None, tmp_path / "out", manifests=manifest, progress=False)
    assert (report.shards_written, report.shards_skipped) == (0, 1)


def test_manifest_line_without_text_is_a_key_without_label(tmp_path):
    write_wavs(str(tmp_path), {"m1": 800, "m2": 800})
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"key": "m1", "audio_path": str(tmp_path / "m1.wav")})
                        + "\n" + json.dumps({"key": "m2", "audio_path": str(tmp_path / "m2.wav"),
                                             "text": "x"}) + "\n")
    with pytest.raises(DataError, match=r"1 key\(s\) of the manifests have no label \(e.g. 'm1'\)"):
        pack_data(None, None, tmp_path / "out", manifests=manifest, progress=False)
    report = pack_data(None, None, tmp_path / "out", manifests=manifest, progress=False,
                       on_mismatch="skip")
    assert report.groups == {".": 1} and report.keys_without_label_examples == ["m1"]


# --------------------------------------------------------------------------------------------
# length groups
# --------------------------------------------------------------------------------------------


def test_length_groups_go_to_their_folders_and_the_rest_is_counted(tmp_path):
    frames = {"a": 5, "b": 10, "c": 499, "d": 500, "e": 799, "f": 800, "g": 900}
    scp, arrays = write_feats(str(tmp_path), "feats", {k: (n, 2) for k, n in frames.items()})
    text = write_text(tmp_path / "text", {k: k.upper() for k in frames})
    report = pack_data(scp, text, tmp_path / "out", filter_group=["500:800", "10:500"],
                       progress=False)
    assert report.groups == {"10_500": 2, "500_800": 2}
    assert report.out_of_range == 3
    assert report.out_of_range_examples == ["a (length 5)", "f (length 800)", "g (length 900)"]
    for folder, (lo, hi), keys in (("10_500", (10, 500), ["b", "c"]),
                                   ("500_800", (500, 800), ["d", "e"])):
        index = ShardIndex.read(tmp_path / "out" / folder)
        assert [k for s in index.shards for k in s.keys] == keys
        got = read_back(str(tmp_path / "out" / folder))
        assert all(lo <= s["feats"].shape[0] < hi for s in got)
        assert [s["key"] for s in got] == keys
    assert not os.path.exists(tmp_path / "out" / INDEX_NAME)
    text_report = report.report()
    assert "10_500/: 2 utterances" in text_report
    assert "outside every length group (not packed): 3" in text_report


def test_overlapping_groups_raise_before_anything_is_written(feats_corpus):
    with pytest.raises(ValueError, match="'10:500' and '400:800' overlap"):
        pack_feats(feats_corpus, filter_group=["10:500", "400:800"])
    assert not os.path.exists(feats_corpus["out"])


@pytest.mark.parametrize("bad", ["10-500", "10:", "a:b", "500:10", "-1:5", "1:2:3"])
def test_malformed_group_raises_naming_it(bad):
    with pytest.raises(ValueError, match=f"filter_group range '{bad}'"):
        parse_length_groups([bad])


def test_groups_are_sorted_and_named_as_written():
    groups = parse_length_groups(["1000:1200", "10:500"])
    assert [(g.name, g.lo, g.hi) for g in groups] == [("10_500", 10, 500),
                                                       ("1000_1200", 1000, 1200)]
    assert groups[0].holds(10) and not groups[0].holds(500)


# --------------------------------------------------------------------------------------------
# mismatched and duplicate keys
# --------------------------------------------------------------------------------------------


@pytest.fixture
def mismatched(tmp_path):
    scp, _ = write_feats(str(tmp_path), "feats", {f"k{i}": (4, 2) for i in range(8)})
    labels = {f"k{i}": "x" for i in range(2, 8)}
    labels.update({"z1": "y", "z2": "y"})
    return scp, write_text(tmp_path / "text", labels), str(tmp_path / "out")


def test_mismatch_error_lists_counts_and_examples_and_writes_nothing(mismatched):
    scp, text, out = mismatched
    with pytest.raises(DataError) as info:
        pack_data(scp, text, out, progress=False)
    message = str(info.value)
    assert "2 key(s) of the data files have no label (e.g. 'k0', 'k1')" in message
    assert "2 label(s) have no data (e.g. 'z1', 'z2')" in message
    assert scp in message and text in message and "on_mismatch='skip'" in message
    assert not os.path.exists(out)


def test_mismatch_skip_packs_the_intersection_and_reports_the_rest(mismatched):
    scp, text, out = mismatched
    report = pack_data(scp, text, out, progress=False, on_mismatch="skip")
    assert [s["key"] for s in read_back(out)] == [f"k{i}" for i in range(2, 8)]
    assert (report.keys_without_label, report.keys_without_label_examples) == (2, ["k0", "k1"])
    assert (report.labels_without_data, report.labels_without_data_examples) == (2, ["z1", "z2"])
    assert "keys without a label (not packed): 2 (e.g. 'k0', 'k1')" in report.report()


def test_mismatch_examples_are_capped_at_five(tmp_path):
    scp, _ = write_feats(str(tmp_path), "feats", {f"k{i:02d}": (2, 2) for i in range(12)})
    text = write_text(tmp_path / "text", {"k00": "x"})
    report = pack_data(scp, text, tmp_path / "out", progress=False, on_mismatch="skip")
    assert report.keys_without_label == 11 and len(report.keys_without_label_examples) == 5


def test_no_common_key_is_an_error_even_when_skipping(tmp_path):
    scp, _ = write_feats(str(tmp_path), "feats", {"a": (2, 2)})
    text = write_text(tmp_path / "text", {"b": "x"})
    with pytest.raises(DataError, match="no key has both data and a label"):
        pack_data(scp, text, tmp_path / "out", progress=False, on_mismatch="skip")


def test_duplicate_key_across_scp_files_names_both_files(tmp_path):
    scp1, _ = write_feats(str(tmp_path), "f1", {"a": (2, 2), "dup": (2, 2)})
    scp2, _ = write_feats(str(tmp_path), "f2", {"dup": (3, 2)})
    text = write_text(tmp_path / "text", {"a": "x", "dup": "y"})
    with pytest.raises(DataError) as info:
        pack_data([scp1, scp2], text, tmp_path / "out", progress=False)
    message = str(info.value)
    assert f"{scp2}:1" in message and f"{scp1}:2" in message and "'dup'" in message
    assert not os.path.exists(tmp_path / "out")


def test_duplicate_key_across_label_files_names_both_files(tmp_path):
    scp, _ = write_feats(str(tmp_path), "feats", {"a": (2, 2)})
    t1 = write_text(tmp_path / "t1", {"a": "x"})
    t2 = write_text(tmp_path / "t2", {"a": "y"})
    with pytest.raises(DataError, match=rf"{t2}:1 \(key 'a'\): duplicate key: label 'a' is also "
                                        rf"in {t1}:1"):
        pack_data(scp, [t1, t2], tmp_path / "out", progress=False)


# --------------------------------------------------------------------------------------------
# determinism, interruption and resumption
# --------------------------------------------------------------------------------------------


def test_two_runs_give_byte_identical_shards_and_index(feats_corpus, tmp_path):
    pack_feats(feats_corpus, out=str(tmp_path / "one"), filter_group=["10:30", "30:100"])
    pack_feats(feats_corpus, out=str(tmp_path / "two"), filter_group=["10:30", "30:100"])
    assert tree_digest(tmp_path / "one") == tree_digest(tmp_path / "two")
    from speechpipe.compact import IndexTable, read_mapped

    for group in ("10_30", "30_100"):  # the tables hold the same, but the index's time
        (h1, a1), (h2, a2) = (read_mapped(str(tmp_path / run / group / "index.jsonl.spmap"))
                              for run in ("one", "two"))
        assert {k: v for k, v in h1.items() if k != "source_mtime_ns"} == {
            k: v for k, v in h2.items() if k != "source_mtime_ns"}
        assert all(a1[k].tobytes() == a2[k].tobytes() for k in a1) and a1
        assert IndexTable(str(tmp_path / "one" / group / "index.jsonl"), None, h1, a1).is_current()


def test_two_workers_write_the_same_bytes_as_one(tmp_path):
    scp, _ = write_wavs(str(tmp_path), {f"u{i}": 300 + 50 * i for i in range(6)})
    text = write_text(tmp_path / "text", {f"u{i}": f"t {i}" for i in range(6)})
    one = pack_data(scp, text, tmp_path / "one", utts_per_shard=2, progress=False)
    two = pack_data(scp, text, tmp_path / "two", utts_per_shard=2, progress=False,
                    num_workers=2)
    assert one.shards_written == two.shards_written == 3
    assert tree_digest(tmp_path / "one") == tree_digest(tmp_path / "two")


def test_rerun_of_a_complete_pack_keeps_every_shard(feats_corpus):
    pack_feats(feats_corpus)
    before, digest = mtimes(feats_corpus["out"]), tree_digest(feats_corpus["out"])
    report = pack_feats(feats_corpus)
    assert (report.shards_written, report.shards_skipped) == (0, 3)
    assert mtimes(feats_corpus["out"]) == before
    assert tree_digest(feats_corpus["out"]) == digest


def test_rerun_rewrites_a_deleted_and_a_truncated_shard(feats_corpus):
    pack_feats(feats_corpus)
    out = feats_corpus["out"]
    digest, before = tree_digest(out), mtimes(out)
    os.remove(os.path.join(out, "data-00000.tar"))
    with open(os.path.join(out, "data-00001.tar"), "r+b") as f:
        f.truncate(1500)
    report = pack_feats(feats_corpus)
    assert (report.shards_written, report.shards_skipped) == (2, 1)
    assert mtimes(out)["data-00002.tar"] == before["data-00002.tar"]
    assert tree_digest(out) == digest


def test_rerun_without_index_checks_member_names_and_rewrites_truncated_shards(feats_corpus):
    pack_feats(feats_corpus)
    out = feats_corpus["out"]
    digest, before = tree_digest(out), mtimes(out)
    os.remove(os.path.join(out, INDEX_NAME))
    path = os.path.join(out, "data-00002.tar")
    with tarfile.open(path) as tar:
        last = tar.getmembers()[-1]
    with open(path, "r+b") as f:  # a clean cut after the last member: only the end marker is lost
        f.truncate(last.offset_data + last.size + (-last.size % 512))
    report = pack_feats(feats_corpus)
    assert (report.shards_written, report.shards_skipped) == (1, 2)
    after = mtimes(out)
    assert [after[n] == before[n] for n in sorted(before)] == [True, True, False]
    assert tree_digest(out) == digest


def test_a_shard_of_other_keys_is_rewritten(feats_corpus):
    pack_feats(feats_corpus)
    out = feats_corpus["out"]
    os.remove(os.path.join(out, INDEX_NAME))
    os.replace(os.path.join(out, "data-00001.tar"), os.path.join(out, "data-00000.tar"))
    report = pack_feats(feats_corpus)
    assert report.shards_written == 2  # 00000 holds the wrong keys, 00001 is missing
    assert [s["key"] for s in read_back(out)] == sorted(feats_corpus["arrays"])


def test_interrupted_run_leaves_no_partial_shard_and_a_rerun_completes(feats_corpus, monkeypatch,
                                                                      tmp_path):
    pack_feats(feats_corpus, out=str(tmp_path / "clean"))
    real = shards_module.encode_field
    calls = []

    def failing(field, value, **kwargs):
        calls.append(field)
        if len(calls) == 14:  # shards 0 and 1 hold 12 members; fail inside shard 2
            raise KeyboardInterrupt("killed")
        return real(field, value, **kwargs)

    monkeypatch.setattr(shards_module, "encode_field", failing)
    out = feats_corpus["out"]
    with pytest.raises(KeyboardInterrupt):
        pack_feats(feats_corpus)
    assert sorted(os.listdir(out)) == ["data-00000.tar", "data-00001.tar"]  # no .tmp, no index
    for name in ("data-00000.tar", "data-00001.tar"):
        with open(os.path.join(out, name), "rb") as f:
            assert len(list(iter_tar_members(f, source=name))) == 6
    before = mtimes(out)

    monkeypatch.setattr(shards_module, "encode_field", real)
    report = pack_feats(feats_corpus)
    assert (report.shards_written, report.shards_skipped) == (1, 2)
    after = mtimes(out)
    assert all(after[n] == before[n] for n in before)
    assert tree_digest(out) == tree_digest(tmp_path / "clean")


def test_a_stale_index_is_removed_before_shards_change(feats_corpus, monkeypatch):
    pack_feats(feats_corpus, utts_per_shard=7)
    out = feats_corpus["out"]

    def killed(*args, **kwargs):
        raise KeyboardInterrupt("killed")

    monkeypatch.setattr(shards_module, "encode_field", killed)
    with pytest.raises(KeyboardInterrupt):
        pack_feats(feats_corpus, utts_per_shard=2)
    assert not os.path.exists(os.path.join(out, INDEX_NAME))


def test_files_named_like_shards_but_not_planned_are_reported(feats_corpus):
    pack_feats(feats_corpus, utts_per_shard=2)  # 4 shards
    report = pack_feats(feats_corpus, utts_per_shard=4)  # 2 shards
    names = [os.path.basename(p) for p in report.stale_shards]
    assert names == ["data-00002.tar", "data-00003.tar"]
    assert "2 file(s) named like shards are not part of this pack" in report.report()
    assert len(ShardIndex.read(feats_corpus["out"]).shards) == 2


# --------------------------------------------------------------------------------------------
# bad inputs and arguments
# --------------------------------------------------------------------------------------------


def test_key_with_a_dot_is_refused_naming_file_line_and_key(tmp_path):
    scp, _ = write_feats(str(tmp_path), "feats", {"a": (2, 2), "b.1": (2, 2)})
    text = write_text(tmp_path / "text", {"a": "x", "b.1": "y"})
    with pytest.raises(DataError, match=rf"{scp}:2 \(key 'b.1'\): this key cannot name shard"):
        pack_data(scp, text, tmp_path / "out", progress=False)


@pytest.mark.parametrize("key, problem", [
    ("../../evil", "its parts must not be '.', '..' or empty"),
    ("spk/../../evil", "its parts must not be '.', '..' or empty"),
    ("a//b", "its parts must not be '.', '..' or empty"),
    ("/abs", "it must be a relative path (not start with '/')"),
])
def test_key_that_escapes_the_shard_folder_is_refused(tmp_path, key, problem):
    # Issue 34, item 8: pack wrote '../../evil' as member '../../evil.npy', a shard that
    # writes outside the folder of whoever unpacks it with tar.
    scp, _ = write_feats(str(tmp_path), "feats", {"a": (2, 2), key: (2, 2)})
    text = write_text(tmp_path / "text", {"a": "x", key: "y"})
    with pytest.raises(DataError) as info:
        pack_data(scp, text, tmp_path / "out", progress=False)
    assert str(info.value) == (f"{scp}:2 (key {key!r}): this key cannot name shard members: "
                               f"{problem}; rename the utterance")
    assert not (tmp_path / "out").exists() or not any(
        n.endswith(".tar") for n in os.listdir(tmp_path / "out"))


def test_missing_audio_file_is_named(tmp_path):
    (tmp_path / "wav.scp").write_text(f"u1 {tmp_path}/nope.wav\n")
    text = write_text(tmp_path / "text", {"u1": "x"})
    with pytest.raises(MissingDataError, match=r"wav.scp:1 \(key 'u1'\): .*nope.wav"):
        pack_data(str(tmp_path / "wav.scp"), text, tmp_path / "out", progress=False)


def test_missing_audio_file_after_the_first_is_named(tmp_path):
    scp, _ = write_wavs(str(tmp_path), {"u1": 100, "u2": 100})
    os.remove(tmp_path / "u2.wav")
    text = write_text(tmp_path / "text", {"u1": "x", "u2": "y"})
    with pytest.raises(MissingDataError, match=r"wav.scp:2 \(key 'u2'\)"):
        pack_data(scp, text, tmp_path / "out", progress=False)
    assert not os.path.exists(tmp_path / "out")


def test_truncated_ark_is_reported_before_writing(tmp_path):
    scp, _ = write_feats(str(tmp_path), "feats", {"a": (5, 3), "b": (50, 3)})
    size = os.path.getsize(tmp_path / "feats.ark")
    with open(tmp_path / "feats.ark", "r+b") as f:
        f.truncate(size - 100)
    text = write_text(tmp_path / "text", {"a": "x", "b": "y"})
    with pytest.raises(DataError, match=r"feats.scp:2 \(key 'b'\): .*truncated"):
        pack_data(scp, text, tmp_path / "out", progress=False)
    assert not os.path.exists(tmp_path / "out")


@pytest.mark.parametrize("segment, message", [
    ("rec1 0.5 3.0", r"segments:2 \(key 'seg2'\): segment \[0.5, 3.0\] s does not fit "
                     r"recording 'rec1'"),
    ("rec9 0.0 0.5", r"segments:2 \(key 'seg2'\): unknown recording 'rec9'"),
    ("rec1 0.0 0.5 1", r"segments:2 \(key 'seg2'\): channel 1 does not exist"),
    ("rec1 0.5", r"segments:2 \(key 'seg2'\): expected '<utterance-id> <recording-id>"),
])
def test_bad_segment_is_named_before_writing(tmp_path, segment, message):
    scp, _ = write_wavs(str(tmp_path), {"rec1": 16000})
    (tmp_path / "segments").write_text(f"seg1 rec1 0.0 0.5\nseg2 {segment}\n")
    text = write_text(tmp_path / "text", {"seg1": "a", "seg2": "b"})
    with pytest.raises(DataError, match=message):
        pack_data(scp, text, tmp_path / "out", segments=str(tmp_path / "segments"),
                  progress=False)
    assert not os.path.exists(tmp_path / "out")


def test_manifest_segment_past_the_end_is_named(tmp_path):
    write_wavs(str(tmp_path), {"m1": 8000})
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"key": "m1", "audio_path": str(tmp_path / "m1.wav"),
                                    "text": "x", "offset": 0.5, "duration": 0.75}) + "\n")
    with pytest.raises(DataError, match=r"m.jsonl:1 \(key 'm1'\): .*past the end"):
        pack_data(None, None, tmp_path / "out", manifests=manifest, progress=False)


def test_commands_in_tables_are_refused_unless_allowed(tmp_path):
    (tmp_path / "wav.scp").write_text("u1 sox in.wav -t wav - |\n")
    text = write_text(tmp_path / "text", {"u1": "x"})
    with pytest.raises(UnsafeInputError, match="only when allowed: pass allow_commands=True"):
        pack_data(str(tmp_path / "wav.scp"), text, tmp_path / "out", kind="wav",
                  progress=False)


def test_a_pickled_object_in_an_ark_is_refused_for_what_it_is(tmp_path):
    # issue 23: pack said "pack does not run commands from tables" for a PKL object
    import pickle

    ark = tmp_path / "feats.ark"
    ark.write_bytes(b"u1 PKL" + pickle.dumps({"not": "a matrix"}))
    (tmp_path / "feats.scp").write_text(f"u1 {ark}:3\n")
    text = write_text(tmp_path / "text", {"u1": "x"})
    with pytest.raises(UnsafeInputError, match="pickled object; speechpipe never unpickles") \
            as info:
        pack_data(str(tmp_path / "feats.scp"), text, tmp_path / "out", progress=False)
    assert "commands" not in str(info.value)


def test_errors_raised_in_worker_processes_keep_file_line_and_key(tmp_path):
    scp, _ = write_wavs(str(tmp_path), {f"u{i}": 100 for i in range(4)})
    os.remove(tmp_path / "u3.wav")
    text = write_text(tmp_path / "text", {f"u{i}": "x" for i in range(4)})
    with pytest.raises(MissingDataError) as info:
        pack_data(scp, text, tmp_path / "out", progress=False, num_workers=2, utts_per_shard=1)
    assert (info.value.source, info.value.line, info.value.key) == (scp, 4, "u3")
    assert not os.path.exists(tmp_path / "out")


def test_features_and_audio_cannot_be_mixed(tmp_path):
    feats, _ = write_feats(str(tmp_path), "feats", {"a": (2, 2)})
    wav, _ = write_wavs(str(tmp_path), {"b": 100})
    text = write_text(tmp_path / "text", {"a": "x", "b": "y"})
    with pytest.raises(DataError, match="mix features"):
        pack_data([feats, wav], text, tmp_path / "out", progress=False)


@pytest.mark.parametrize("kwargs, message", [
    ({"fmt": "data.tar"}, "fmt must be a file name with one shard number"),
    ({"fmt": "sub/data-%05d.tar"}, "fmt must be a file name"),
    ({"utts_per_shard": 0}, "utts_per_shard must be an int >= 1"),
    ({"num_workers": 0}, "num_workers must be an int >= 1"),
    ({"on_mismatch": "ignore"}, "on_mismatch must be one of"),
    ({"kind": "text"}, "kind must be one of"),
    ({"length_unit": "seconds"}, "length_unit 'seconds' does not fit feats"),
    ({"manifests": "m.jsonl"}, "pass either manifests, or scp and label files"),
])
def test_bad_arguments_raise_value_error_naming_them(feats_corpus, kwargs, message):
    with pytest.raises(ValueError, match=message):
        pack_feats(feats_corpus, **kwargs)
    assert not os.path.exists(feats_corpus["out"])


# Invariant: the settings are keyword arguments of pack_data and plan_pack (one spelling; the
# plan records them as a PackOptions, checked with the same messages).
def test_settings_are_keywords_and_an_unknown_one_is_named(feats_corpus):
    with pytest.raises(TypeError, match="options"):
        pack_data(feats_corpus["scps"], feats_corpus["labels"], feats_corpus["out"],
                  options=PackOptions(progress=False))  # the old second spelling is gone
    with pytest.raises(TypeError, match=r"unknown pack setting\(s\) shard_size; the settings "
                                        r"are fmt, filter_group, utts_per_shard"):
        plan_pack(feats_corpus["scps"], feats_corpus["labels"], feats_corpus["out"],
                  shard_size=3)
    assert not os.path.exists(feats_corpus["out"])


@pytest.mark.parametrize("kwargs, error, message", [
    ({"fmt": "data.tar"}, ValueError, "fmt must be a file name with one shard number"),
    ({"filter_group": ["10:500", "400:800"]}, ValueError, "overlap"),
    ({"utts_per_shard": 0}, ValueError, "utts_per_shard must be an int >= 1"),
    ({"kind": "text"}, ValueError, "kind must be one of"),
    ({"audio_format": "mp3"}, ValueError, "audio_format must be one of"),
    ({"length_unit": "ms"}, ValueError, "length_unit must be one of"),
    ({"progress": 1}, TypeError, "progress must be a bool, got 1"),
])
def test_options_are_checked_when_built(kwargs, error, message):
    with pytest.raises(error, match=message):
        PackOptions(**kwargs)


def test_pack_data_signature_shows_the_defaults_of_pack_options():
    import inspect

    parameters = inspect.signature(pack_data).parameters
    for name, default in (("fmt", "data-%05d.tar"), ("utts_per_shard", 2000),
                          ("progress", True), ("length_unit", None)):
        assert repr(parameters[name].default) == repr(default)
        assert getattr(PackOptions(), name) == default


# --------------------------------------------------------------------------------------------
# report and command line
# --------------------------------------------------------------------------------------------


def test_report_text_summarises_the_run():
    report = PackReport("out", "feats", "frames", groups={"10_500": 4000}, shards_written=2,
                        bytes_total=2_500_000, bytes_written=2_500_000, seconds=1.25)
    text = report.report()
    assert text.splitlines()[0] == ("pack: 4000 utterances (feats, lengths in frames) in 2 "
                                    "shard(s) under out")
    assert "2 written, 0 already complete (kept); 2.5 MB in all, 2.5 MB written" in text
    assert text.endswith("time: 1.2 s")


def run_cli(argv):
    parser = argparse.ArgumentParser(prog="speechpipe")
    add_pack_command(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_cli_packs_and_prints_the_report(feats_corpus, capsys):
    argv = ["pack", "--out", feats_corpus["out"], "--group", "10:30", "--group", "30:100",
            "--utts-per-shard", "2", "--no-progress"]
    for scp in feats_corpus["scps"]:
        argv += ["--scp", scp]
    for text in feats_corpus["labels"]:
        argv += ["--labels", text]
    assert run_cli(argv) == 0
    out = capsys.readouterr().out
    assert "pack: 7 utterances (feats, lengths in frames)" in out and "30_100/: 4" in out
    assert len(read_back(os.path.join(feats_corpus["out"], "10_30"))) == 3


def test_cli_error_says_what_to_do(mismatched, capsys):
    scp, text, out = mismatched
    code = run_cli(["pack", "--scp", scp, "--labels", text, "--out", out, "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("speechpipe pack: error: ") and "--on-mismatch skip" in err
    assert run_cli(["pack", "--scp", scp, "--labels", text, "--out", out, "--no-progress",
                    "--on-mismatch", "skip"]) == 0


def test_cli_bad_group_is_an_error_not_a_traceback(feats_corpus, capsys):
    code = run_cli(["pack", "--scp", feats_corpus["scps"][0], "--labels",
                    feats_corpus["labels"][0], "--out", feats_corpus["out"], "--group", "5"])
    assert code == 2 and "filter_group range '5'" in capsys.readouterr().err


def test_progress_bars_count_shards(feats_corpus, capsys):
    pack_feats(feats_corpus, progress=True)
    err = capsys.readouterr().err
    assert "pack: measure" in err and "pack: write" in err and "3/3" in err


def test_cli_help_describes_the_options(capsys):
    with pytest.raises(SystemExit):
        run_cli(["pack", "--help"])
    help_text = capsys.readouterr().out
    for option in ("--scp", "--labels", "--segments", "--manifest", "--out", "--fmt", "--group",
                   "--utts-per-shard", "--workers", "--on-mismatch", "data-%05d.tar"):
        assert option in help_text


# --------------------------------------------------------------------------------------------
# shard folders (issue 18, case 7): the output folder stands for all its groups; packs never mix
# --------------------------------------------------------------------------------------------


def test_the_output_folder_of_a_grouped_pack_reads_as_every_group(feats_corpus):
    # Invariant: the folder's index, the shard list and stats cover each utterance once.
    from speechpipe.stats import corpus_stats

    pack_feats(feats_corpus, filter_group=["10:30", "30:60"], utts_per_shard=2)
    out = feats_corpus["out"]
    index = ShardIndex.read(out)
    assert sorted(k for s in index.shards for k in s.keys) == sorted(feats_corpus["arrays"])
    assert [s.name for s in index.shards][0] == os.path.join("10_30", "data-00000.tar")
    listed = list(IterableWrapper([out]).list_shards())
    assert listed == index.paths() and all(os.path.isfile(p) for p in listed)
    keys = [s["key"] for s in IterableWrapper([out]).list_shards().open().read_shards()]
    assert sorted(keys) == sorted(feats_corpus["arrays"])
    assert corpus_stats(out, frame_shift=0.01).utterances == 7
    pipe = IterableWrapper([out]).sharded_shuffle(buffer_size=2, index=True)
    assert len(pipe) == 7 and sorted(s["key"] for s in pipe) == sorted(feats_corpus["arrays"])


def test_packing_other_groups_into_a_used_folder_is_refused_naming_them(feats_corpus):
    pack_feats(feats_corpus, filter_group=["10:30", "30:60"])
    out = feats_corpus["out"]
    before = tree_digest(out)
    with pytest.raises(ValueError, match=r"holds shards of another pack .*\(10_30/, 30_60/\)"
                                         r".*--force"):
        pack_feats(feats_corpus, filter_group=["10:40", "40:60"])
    with pytest.raises(ValueError, match=r"another pack .*\(10_30/, 30_60/\)"):
        pack_feats(feats_corpus)  # no groups: into the top folder, beside the groups
    assert tree_digest(out) == before  # nothing written, nothing deleted


def test_force_deletes_the_other_groups_and_the_glob_reads_each_utterance_once(feats_corpus):
    from speechpipe.pipes.sources import expand_patterns

    pack_feats(feats_corpus, filter_group=["10:30", "30:60"])
    out = feats_corpus["out"]
    report = pack_feats(feats_corpus, filter_group=["10:40", "40:60"], force=True)
    assert sorted(os.listdir(out)) == ["10_40", "40_60"]
    # 3 shards, 2 indexes and their 2 mapped tables
    assert len(report.removed) == 7 and "removed (--force): 7 file(s)" in report.report()
    keys = [s["key"] for s in IterableWrapper(expand_patterns(f"{out}/*/data-*.tar"))
            .open().read_shards()]
    assert sorted(keys) == sorted(feats_corpus["arrays"])
    report = pack_data(feats_corpus["scps"], feats_corpus["labels"], out,
                       utts_per_shard=3, progress=False, force=True)
    assert sorted(os.listdir(out)) == ["data-00000.tar", "data-00001.tar", "data-00002.tar",
                                       INDEX_NAME, INDEX_NAME + ".spmap"]


def test_a_folder_mixing_a_top_index_and_group_indexes_is_refused_by_readers(feats_corpus):
    out = feats_corpus["out"]
    pack_feats(feats_corpus, filter_group=["10:30", "30:60"])
    ShardIndex(out, []).write()  # as an older pack without groups would have left
    with pytest.raises(DataError, match="two packs are mixed here; pack again with --force"):
        ShardIndex.read(out)


def test_cli_pack_force_flag(feats_corpus, capsys):
    parser = argparse.ArgumentParser(prog="speechpipe")
    add_pack_command(parser.add_subparsers(dest="command"))
    base = ["pack", "--out", feats_corpus["out"], "--no-progress"]
    for f in feats_corpus["scps"]:
        base += ["--scp", f]
    for f in feats_corpus["labels"]:
        base += ["--labels", f]
    args = parser.parse_args(base + ["--group", "10:30", "--group", "30:60"])
    assert args.func(args) == 0
    args = parser.parse_args(base + ["--group", "10:60"])
    assert args.func(args) == 2
    assert "holds shards of another pack" in capsys.readouterr().err
    args = parser.parse_args(base + ["--group", "10:60", "--force"])
    assert args.func(args) == 0
    assert sorted(os.listdir(feats_corpus["out"])) == ["10_60"]


def test_packing_groups_beside_a_flat_pack_is_refused(feats_corpus):
    pack_feats(feats_corpus)
    with pytest.raises(ValueError, match=r"holds shards of another pack .*\(\./\)"):
        pack_feats(feats_corpus, filter_group=["10:60"])
    report = pack_feats(feats_corpus, filter_group=["10:60"], force=True)
    assert sorted(os.listdir(feats_corpus["out"])) == ["10_60"]
    assert len(read_back(feats_corpus["out"])) == 7 and report.utterances == 7


def test_pack_refuses_non_finite_audio_naming_the_line(tmp_path):
    # Issue 34, item 7: an all-NaN WAV and one NaN sample in 1,600 were packed silently.
    import soundfile
    audio = np.zeros(1600, np.float32)
    audio[5] = np.nan
    soundfile.write(tmp_path / "nan.wav", audio, 16000, subtype="FLOAT")
    manifest = tmp_path / "train.jsonl"
    manifest.write_text(json.dumps({"key": "u1", "audio_path": str(tmp_path / "nan.wav"),
                                    "text": "x"}) + "\n")
    with pytest.raises(DataError) as info:
        pack_data(None, None, tmp_path / "out", manifests=manifest, progress=False)
    assert str(info.value) == (f"{manifest}:1 (key 'u1'): {tmp_path / 'nan.wav'}: non-finite "
                               "audio: 1 NaN and 0 infinite of 1600 samples (the first at "
                               "sample 5)")


def _disk_full_after(monkeypatch, members: int) -> None:
    """Writing tar members fails with ENOSPC after ``members`` of them (a full disk)."""
    import errno
    import tarfile
    original, written = tarfile.TarFile.addfile, [0]

    def addfile(self, *args, **kwargs):
        if written[0] >= members:
            raise OSError(errno.ENOSPC, "No space left on device")
        written[0] += 1
        return original(self, *args, **kwargs)

    monkeypatch.setattr(tarfile.TarFile, "addfile", addfile)


def test_pack_on_a_full_disk_names_the_shard_being_written(tmp_path, monkeypatch):
    # Issue 34, item 11: a bare OSError [Errno 28] naming no file, and a 30-line traceback.
    from speechpipe.errors import OutputError
    scp, _ = write_feats(str(tmp_path), "feats", {f"u{i}": (3, 2) for i in range(6)})
    text = write_text(tmp_path / "text", {f"u{i}": "x" for i in range(6)})
    _disk_full_after(monkeypatch, 8)  # two members a sample: the third shard's first
    out = tmp_path / "out"
    with pytest.raises(OutputError) as info:
        pack_data(scp, text, out, utts_per_shard=2, progress=False, num_workers=1)
    assert str(info.value) == (f"{out / 'data-00002.tar'}: cannot write: No space left on "
                               "device (errno 28)")
    assert isinstance(info.value, OSError)


def test_the_pack_command_on_a_full_disk_exits_2_with_one_line(tmp_path, monkeypatch, capsys):
    from speechpipe.cli import main
    scp, _ = write_feats(str(tmp_path), "feats", {f"u{i}": (3, 2) for i in range(2)})
    text = write_text(tmp_path / "text", {f"u{i}": "x" for i in range(2)})
    _disk_full_after(monkeypatch, 0)
    out = tmp_path / "out"
    assert main(["pack", "--scp", scp, "--labels", str(text), "--out", str(out),
                 "--no-progress", "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert err == (f"speechpipe pack: error: {out / 'data-00000.tar'}: cannot write: No space "
                   "left on device (errno 28)\n  make room (or choose another --out), then run "
                   "the same command again: complete shards are kept\n")


def test_keys_equal_up_to_unicode_normalisation_are_named_as_such(tmp_path):
    # Issue 34, item 12: 'café' in NFC in the scp and in NFD in text were refused as unmatched
    # keys that look identical, without saying why.
    import unicodedata
    nfc, nfd = unicodedata.normalize("NFC", "café"), unicodedata.normalize("NFD", "café")
    scp, _ = write_feats(str(tmp_path), "feats", {"a": (2, 2), nfc: (2, 2)})
    text = write_text(tmp_path / "text", {"a": "x", nfd: "y"})
    import re
    expected = (f"1 of them differ only in Unicode normalisation (e.g. {nfc!r}, NFC in the "
                f"data, and {nfd!r}, NFD in the labels, look the same): write both files in "
                "one normalisation (NFC)")
    with pytest.raises(DataError, match=re.escape(expected)):
        pack_data(scp, text, tmp_path / "out", progress=False)


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc)."""
    import glob

    found = []
    for status in glob.glob("/proc/[0-9]*/status"):
        try:
            with open(status) as f:
                if f"PPid:\t{pid}\n" in f.read():
                    found.append(int(status.split("/")[2]))
        except OSError:  # the process ended meanwhile
            pass
    return found


def test_ctrl_c_in_pack_says_a_rerun_continues_without_a_worker_traceback(tmp_path):
    # Issue 32.12: Ctrl-C in pack printed a worker's traceback. Ctrl-C signals the terminal's
    # whole process group: the test does the same to a pack with 2 workers.
    import os
    import signal
    import subprocess
    import sys
    import time

    import speechpipe as sp

    rows = sp.recipes.librispeech.prepare_librispeech(sp.DEMO_CORPUS, str(tmp_path / "m"),
                                                      progress=False)["dev-clean"]
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(sp.__file__)))
    proc = subprocess.Popen([sys.executable, "-m", "speechpipe.cli", "pack", "--manifest",
                             str(rows), "--out", str(tmp_path / "out"), "--workers", "2",
                             "--utts-per-shard", "1", "--no-progress"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while len(_children(proc.pid)) < 2 and proc.poll() is None:  # the spawned workers
            assert time.monotonic() < deadline, "pack started no workers"
            time.sleep(0.05)
        time.sleep(0.3)  # starting up or packing: either way Ctrl-C must print no traceback
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    if proc.returncode == 0:
        pytest.skip("the pack finished before the interrupt")  # a fast machine
    assert proc.returncode == 130, err
    assert "interrupted; run the same command again to continue" in err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
