"""lhotse interop (issue 22): manifests and Shar written by lhotse itself read into samples,
speechpipe manifests written as lhotse manifests, a lhotse corpus through a recipe builder.

Invariant: a row's audio is exactly the samples of its segment and channel in the file lhotse
described; a speechpipe manifest written as lhotse manifests reads back equal.
"""

from __future__ import annotations

import dataclasses
import gzip
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import soundfile

lhotse = pytest.importorskip("lhotse")

import speechpipe as sp  # noqa: E402
from speechpipe.errors import DataError, MissingDataError  # noqa: E402
from speechpipe.testing import cut_and_resume  # noqa: E402

RATE = 16000


def _wav(root, name: str, seconds: float, channels: int = 1,
         seed: int = 0) -> tuple[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    shape = (int(seconds * RATE),) if channels == 1 else (int(seconds * RATE), channels)
    audio = (rng.standard_normal(shape) * 0.1).astype(np.float32)
    path = os.path.join(str(root), f"{name}.wav")
    soundfile.write(path, audio, RATE)  # 16-bit: FLAC in a Shar holds it exactly
    return path, soundfile.read(path, dtype="float32")[0]


@pytest.fixture()
def corpus(tmp_path):
    """Two recordings (one stereo) with several supervisions each, as lhotse manifests."""
    mono, mono_audio = _wav(tmp_path, "mono", 2.0, seed=1)
    stereo, stereo_audio = _wav(tmp_path, "stereo", 1.5, channels=2, seed=2)
    recordings = lhotse.RecordingSet.from_recordings(
        [lhotse.Recording.from_file(mono), lhotse.Recording.from_file(stereo)])
    sups = [
        lhotse.SupervisionSegment("m1", "mono", 0.0, 0.5, text="one", speaker="A"),
        lhotse.SupervisionSegment("m2", "mono", 0.75, 1.0, text="two", speaker="B",
                                  language="en", custom={"emotion": "calm"}),
        lhotse.SupervisionSegment("s1", "stereo", 0.25, 0.5, channel=1, text="three",
                                  speaker="C"),
    ]
    supervisions = lhotse.SupervisionSet.from_segments(sups)
    recordings.to_file(tmp_path / "rec.jsonl.gz")
    supervisions.to_file(tmp_path / "sup.jsonl")
    cuts = lhotse.CutSet.from_manifests(recordings=recordings, supervisions=supervisions)
    cuts = cuts.trim_to_supervisions(keep_overlapping=False)
    cuts.to_file(tmp_path / "cuts.jsonl.gz")
    audio = {"mono": mono_audio, "stereo": stereo_audio}
    return tmp_path, audio


def _expected(audio: dict, rec: str, start: float, duration: float, channel=None) -> np.ndarray:
    a = audio[rec][round(start * RATE):round((start + duration) * RATE)]
    return a if channel is None else a[:, channel]


# ---------------------------------------------------------------- manifests


def test_cutset_rows_carry_segment_channel_and_supervision_fields(corpus):
    root, _ = corpus
    rows = list(sp.read_lhotse(root / "cuts.jsonl.gz"))
    by_key = {r["key"]: r for r in rows}
    assert sorted(by_key) == ["m1", "m2", "s1"]
    m2 = by_key["m2"]
    assert (m2["offset"], m2["duration"], m2["text"], m2["speaker"], m2["language"],
            m2["emotion"]) == (0.75, 1.0, "two", "B", "en", "calm")
    assert "channel" not in m2  # a mono recording
    assert m2["audio_path"] == str(root / "mono.wav")
    assert by_key["s1"]["channel"] == 1
    assert "offset" in by_key["m1"]  # a segment of a longer recording, even at 0
    assert m2["source"].startswith(str(root / "cuts.jsonl.gz") + ":")


def test_load_lhotse_reads_each_cut_segment_and_channel_exactly(corpus):
    root, audio = corpus
    loaded = {s["key"]: s for s in sp.read_lhotse(root / "cuts.jsonl.gz").load_lhotse()}
    np.testing.assert_array_equal(loaded["m2"]["audio"], _expected(audio, "mono", 0.75, 1.0))
    np.testing.assert_array_equal(loaded["s1"]["audio"],
                                  _expected(audio, "stereo", 0.25, 0.5, channel=1))
    assert loaded["s1"]["sample_rate"] == RATE
    assert "lhotse_cut" not in loaded["s1"] and "channel" not in loaded["s1"]


def test_a_transformed_cut_is_loaded_by_lhotse_and_has_no_audio_path(corpus):
    root, _ = corpus
    cuts = lhotse.CutSet.from_file(root / "cuts.jsonl.gz").perturb_speed(1.1)
    cuts.to_file(root / "fast.jsonl.gz")
    want = {c.id: c.load_audio()[0] for c in cuts}
    rows = list(sp.read_lhotse(root / "fast.jsonl.gz"))
    assert all("audio_path" not in r for r in rows)  # load_audio would miss the transform
    for row in sp.IterableWrapper(rows).load_lhotse():
        np.testing.assert_array_equal(row["audio"], want[row["key"]])


def test_importing_speechpipe_imports_none_of_the_optional_libraries():
    code = ("import sys, speechpipe; print([m for m in ('lhotse', 'datasets', "
            "'torchdata.nodes') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=os.path.dirname(os.path.dirname(sp.__file__)))
    assert out.stdout.strip() == "[]"


def test_recordings_joined_with_supervisions_give_one_row_per_supervision(corpus):
    root, audio = corpus
    pipe = sp.read_lhotse(root / "rec.jsonl.gz", supervisions=root / "sup.jsonl")
    rows = list(pipe.load_lhotse())
    assert [r["key"] for r in rows] == ["m1", "m2", "s1"]  # the supervisions' order
    np.testing.assert_array_equal(rows[2]["audio"],
                                  _expected(audio, "stereo", 0.25, 0.5, channel=1))
    assert rows[1]["text"] == "two" and rows[1]["offset"] == 0.75


def test_recordings_alone_give_whole_recordings_all_channels(corpus):
    root, audio = corpus
    assert [r.get("channel") for r in sp.read_lhotse(root / "rec.jsonl.gz")] == [None, [0, 1]]
    rows = {r["key"]: r for r in sp.read_lhotse(root / "rec.jsonl.gz").load_lhotse()}
    assert "offset" not in rows["mono"] and "channel" not in rows["mono"]
    np.testing.assert_array_equal(rows["mono"]["audio"], audio["mono"])
    np.testing.assert_array_equal(rows["stereo"]["audio"], audio["stereo"])  # (T, 2)


def test_features_stored_by_lhotse_are_loaded(tmp_path):
    # lilcom is not installed here: lhotse's numpy files writer stores the features
    paths = [_wav(tmp_path, f"r{i}", 1.0, seed=i)[0] for i in range(2)]
    recordings = lhotse.RecordingSet.from_recordings([lhotse.Recording.from_file(p)
                                                      for p in paths])
    cuts = lhotse.CutSet.from_manifests(recordings=recordings).compute_and_store_features(
        lhotse.Fbank(), storage_path=tmp_path / "feats", storage_type=lhotse.NumpyFilesWriter)
    cuts.to_file(tmp_path / "cuts.jsonl.gz")
    features = [dataclasses.replace(c.features, recording_id=c.recording_id) for c in cuts]
    lhotse.FeatureSet.from_features(features).to_file(tmp_path / "f.jsonl.gz")
    want = {c.id: c.load_features() for c in cuts}
    got = {s["key"]: s["feats"] for s in
           sp.read_lhotse(tmp_path / "cuts.jsonl.gz").load_lhotse("feats")}
    assert sorted(got) == sorted(want)
    for key in want:
        np.testing.assert_array_equal(got[key], want[key])
    # a FeatureSet joined with supervisions: the supervision's frames
    sup = lhotse.SupervisionSegment("x", "r1", start=0.2, duration=0.5)
    lhotse.SupervisionSet.from_segments([sup]).to_file(tmp_path / "s.jsonl.gz")
    [row] = sp.read_lhotse(tmp_path / "f.jsonl.gz",
                           supervisions=tmp_path / "s.jsonl.gz").load_lhotse("feats")
    np.testing.assert_array_equal(row["feats"], want["r1-1"][20:70])


def test_manifest_is_streamed_rows_come_before_a_bad_line_later(corpus):
    root, _ = corpus
    with gzip.open(root / "cuts.jsonl.gz", "rt") as f:
        lines = f.read().splitlines()
    bad = root / "bad.jsonl"
    bad.write_text("\n".join(lines[:2] + ["{not json"]) + "\n")
    it = iter(sp.read_lhotse(bad, keep_cut=False))
    assert [next(it)["key"], next(it)["key"]] == ["m1", "m2"]
    with pytest.raises(DataError, match="bad lhotse item") as err:
        next(it)
    assert err.value.source == str(bad) and err.value.line == 3


def test_missing_manifest_is_named(tmp_path):
    with pytest.raises(MissingDataError, match="no such lhotse manifest"):
        list(sp.read_lhotse(tmp_path / "nope.jsonl.gz"))


def test_a_supervision_of_an_unknown_recording_is_named(corpus):
    root, _ = corpus
    sup = lhotse.SupervisionSegment("z9", "nowhere", 0.0, 0.5)
    lhotse.SupervisionSet.from_segments([sup]).to_file(root / "orphan.jsonl")
    with pytest.raises(DataError, match="supervision 'z9' names recording 'nowhere'") as err:
        list(sp.read_lhotse(root / "rec.jsonl.gz", supervisions=root / "orphan.jsonl"))
    assert err.value.source == f"{root / 'orphan.jsonl'}:1"


def test_a_supervision_set_given_as_manifests_is_refused(corpus):
    root, _ = corpus
    with pytest.raises(DataError, match="expected a CutSet, RecordingSet or FeatureSet"):
        list(sp.read_lhotse(root / "sup.jsonl"))


def test_supervisions_with_a_cutset_are_refused(corpus):
    root, _ = corpus
    with pytest.raises(DataError, match="a CutSet cannot be joined with supervisions"):
        list(sp.read_lhotse(root / "cuts.jsonl.gz", supervisions=root / "sup.jsonl"))


def test_load_lhotse_without_the_cut_names_the_row(corpus):
    root, _ = corpus
    pipe = sp.read_lhotse(root / "cuts.jsonl.gz", keep_cut=False).load_lhotse()
    with pytest.raises(DataError, match="no lhotse cut in 'lhotse_cut'") as err:
        next(iter(pipe))
    assert err.value.key == "m1"


def test_load_lhotse_with_the_audio_gone_names_the_row(corpus):
    root, _ = corpus
    os.remove(root / "mono.wav")
    with pytest.raises(MissingDataError, match="no such audio file") as err:
        list(sp.read_lhotse(root / "cuts.jsonl.gz").load_lhotse())
    assert (err.value.key, err.value.source) == ("m1", str(root / "mono.wav"))


def test_load_lhotse_with_the_features_gone_names_the_row(tmp_path):
    path, _ = _wav(tmp_path, "r", 0.5)
    cuts = lhotse.CutSet.from_manifests(recordings=lhotse.RecordingSet.from_recordings(
        [lhotse.Recording.from_file(path)])).compute_and_store_features(
        lhotse.Fbank(), storage_path=tmp_path / "feats", storage_type=lhotse.NumpyFilesWriter)
    cuts.to_file(tmp_path / "cuts.jsonl")
    shutil.rmtree(tmp_path / "feats")
    with pytest.raises(MissingDataError, match="lhotse cannot find the feats") as err:
        list(sp.read_lhotse(tmp_path / "cuts.jsonl").load_lhotse("feats"))
    assert err.value.key == "r-0"


# ---------------------------------------------------------------- Shar


@pytest.fixture()
def shar(tmp_path):
    paths = [_wav(tmp_path, f"r{i}", 0.5 + 0.25 * i, seed=i) for i in range(3)]
    recordings = lhotse.RecordingSet.from_recordings([lhotse.Recording.from_file(p)
                                                      for p, _ in paths])
    sups = lhotse.SupervisionSet.from_segments(
        [lhotse.SupervisionSegment(f"r{i}", f"r{i}", 0.0, 0.5, text=f"t{i}") for i in range(3)])
    cuts = lhotse.CutSet.from_manifests(recordings=recordings, supervisions=sups)
    cuts = cuts.compute_and_store_features(lhotse.Fbank(), storage_path=tmp_path / "feats",
                                           storage_type=lhotse.NumpyFilesWriter)
    out = tmp_path / "shar"
    out.mkdir()
    cuts.to_shar(out, fields={"recording": "flac", "features": "numpy"}, shard_size=2)
    return out, {c.id: (c.load_audio()[0], c.load_features(), c) for c in cuts}


def test_shar_cuts_are_joined_with_their_audio_and_features(shar):
    out, want = shar
    assert sorted(os.listdir(out))[:2] == ["cuts.000000.jsonl.gz", "cuts.000001.jsonl.gz"]
    got = list(sp.read_lhotse_shar(out))
    assert [s["key"] for s in got] == [c.id for *_, c in want.values()]
    for s in got:
        audio, feats, cut = want[s["key"]]
        np.testing.assert_array_equal(s["audio"], audio)
        np.testing.assert_array_equal(s["feats"], feats)
        assert s["text"] == cut.supervisions[0].text and s["sample_rate"] == RATE
        assert "audio_path" not in s


def test_shar_field_shard_out_of_step_names_the_tar(shar):
    out, _ = shar
    shutil.copy(out / "recording.000001.tar", out / "recording.000000.tar")
    with pytest.raises(DataError, match="out of step") as err:
        list(sp.read_lhotse_shar(out))
    assert err.value.source == str(out / "recording.000000.tar")


def test_a_bad_line_in_a_shar_cut_shard_names_file_and_line(shar):
    out, _ = shar
    with gzip.open(out / "cuts.000001.jsonl.gz", "wt") as f:
        f.write("{broken\n")
    rows = sp.read_lhotse_shar(out)
    with pytest.raises(DataError, match="bad lhotse item") as err:
        list(rows)
    assert (err.value.source, err.value.line) == (str(out / "cuts.000001.jsonl.gz"), 1)


def test_a_folder_without_cut_shards_is_not_shar(tmp_path):
    (tmp_path / "recording.000000.tar").write_bytes(b"")
    with pytest.raises(DataError, match="not a Shar directory"):
        list(sp.read_lhotse_shar(tmp_path))
    with pytest.raises(MissingDataError, match="no such Shar directory"):
        list(sp.read_lhotse_shar(tmp_path / "nope"))


# ---------------------------------------------------------------- writing


@pytest.fixture()
def samples(tmp_path):
    long, _ = _wav(tmp_path, "long", 3.0, seed=5)
    short, _ = _wav(tmp_path, "short", 0.75, seed=6)
    stereo, _ = _wav(tmp_path, "stereo", 1.0, channels=2, seed=7)
    return [
        {"key": "right", "audio_path": stereo, "offset": 0.25, "duration": 0.5, "channel": 1,
         "text": "e"},
        {"key": "short", "audio_path": short, "duration": 0.75, "text": "a b",
         "speaker": "s1"},
        {"key": "seg1", "audio_path": long, "offset": 0.5, "duration": 1.0, "text": "c",
         "speaker": "s2", "gender": "f", "lang_id": 3},
        {"key": "seg2", "audio_path": long, "offset": 2.0, "duration": 0.5, "text": "d"},
    ]


@pytest.mark.parametrize("form", ["cuts", "recordings+supervisions"])
def test_speechpipe_to_lhotse_to_speechpipe_is_equal(tmp_path, samples, form):
    if form == "cuts":
        assert sp.write_lhotse(samples, cuts=tmp_path / "c.jsonl.gz") == 4
        back = sp.read_lhotse(tmp_path / "c.jsonl.gz", keep_cut=False)
        assert len(lhotse.CutSet.from_file(tmp_path / "c.jsonl.gz")) == 4  # lhotse reads it
    else:
        assert sp.write_lhotse(samples, recordings=tmp_path / "r.jsonl.gz",
                               supervisions=tmp_path / "s.jsonl.gz") == 4
        assert [r.id for r in lhotse.RecordingSet.from_file(tmp_path / "r.jsonl.gz")] == [
            "stereo", "short", "long"]  # one recording per file
        back = sp.read_lhotse(tmp_path / "r.jsonl.gz", supervisions=tmp_path / "s.jsonl.gz",
                              keep_cut=False)
    got = {r["key"]: {k: v for k, v in r.items() if k != "source"} for r in back}
    assert got == {s["key"]: s for s in samples}


def test_written_lhotse_cuts_load_the_same_audio_as_speechpipe(tmp_path, samples):
    sp.write_lhotse(samples, cuts=tmp_path / "c.jsonl")
    by_lhotse = {c.id: c.load_audio()[0] for c in lhotse.CutSet.from_file(tmp_path / "c.jsonl")}
    rows = sp.IterableWrapper(samples).load_audio(offset_field="offset",
                                                  duration_field="duration",
                                                  whole_without_offset=True)
    for row in rows:
        audio = row["audio"] if "channel" not in row else row["audio"][:, row["channel"]]
        np.testing.assert_array_equal(by_lhotse[row["key"]], audio)


def test_write_lhotse_needs_an_audio_path(tmp_path):
    with pytest.raises(DataError, match="needs an 'audio_path'") as err:
        sp.write_lhotse([{"key": "u1", "duration": 1.0}], cuts=tmp_path / "c.jsonl")
    assert err.value.key == "u1"


def test_write_lhotse_refuses_two_files_with_one_recording_id(tmp_path):
    (tmp_path / "b").mkdir()
    a, _ = _wav(tmp_path, "x", 0.5)
    b, _ = _wav(tmp_path / "b", "x", 0.5)
    rows = [{"key": "1", "audio_path": a}, {"key": "2", "audio_path": b}]
    with pytest.raises(DataError, match="two audio files give the recording id 'x'"):
        sp.write_lhotse(rows, cuts=tmp_path / "c.jsonl")


def test_write_lhotse_needs_one_output_form(tmp_path, samples):
    with pytest.raises(ValueError, match="give cuts=, or recordings= and supervisions="):
        sp.write_lhotse(samples)
    with pytest.raises(ValueError, match="give both"):
        sp.write_lhotse(samples, recordings=tmp_path / "r.jsonl")


# ---------------------------------------------------------------- through a recipe builder


def test_a_lhotse_corpus_trains_through_train_pipeline(corpus):
    root, _ = corpus
    pipe = sp.train_pipeline(sp.read_lhotse(root / "cuts.jsonl.gz"),
                             input=lambda p: p.load_lhotse(), budget=2.0,
                             features="fbank", seed=3)
    batches = list(pipe)
    keys = sorted(k for b in batches for k in b["key"])
    assert keys == ["m1", "m2", "s1"]
    for b in batches:
        assert b["feats"].shape[0] == len(b["key"]) and b["feats"].shape[2] == 80
        assert b["feats_len"].max() == b["feats"].shape[1]


def test_a_lhotse_corpus_resumes_exactly_under_build_loader(corpus):
    root, _ = corpus

    def make():
        pipe = sp.train_pipeline(sp.read_lhotse(root / "cuts.jsonl.gz"),
                                 input=lambda p: p.load_lhotse(), budget=1.0,
                                 features=None, seed=1)
        return sp.build_loader(pipe, num_workers=0)

    full, resumed = cut_and_resume(make, 1, lambda b: b["key"])
    assert resumed == full and len(full) > 1
