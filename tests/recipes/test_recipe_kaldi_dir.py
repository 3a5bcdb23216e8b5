"""The generic Kaldi data directory recipe on its fixture (tests/fixtures/kaldi): manifests
from wav.scp + segments and from feats.scp alone, table consistency errors, mismatch
policies, kaldi_dir_samples and the pipelines.

The fixture is a Kaldi recipe folder: data/train (wav.scp with segments, text, utt2spk,
spk2utt, feats.scp) and data/dev (feats.scp only, utt2dur); paths relative to it.
"""

from __future__ import annotations

import argparse
import re
import shutil
from pathlib import Path

import kaldiio
import numpy as np
import pytest
import soundfile

from test_recipes_common import manifest_rows

from speechpipe.cli.prepare import add_command as add_prepare_command
from speechpipe.diagnostics import SkippedInputWarning
from speechpipe.errors import DataError, MissingDataError
from speechpipe.recipes import kaldi_dir, manifest_path
from speechpipe.recipes.kaldi_dir import (
    kaldi_dir_eval,
    kaldi_dir_samples,
    kaldi_dir_train,
    prepare_kaldi_dir,
)
from speechpipe import SampleCount

FIXTURE = Path(__file__).parents[1] / "fixtures" / "kaldi"


@pytest.fixture
def recipe(tmp_path):
    """A writable copy of the fixture recipe folder."""
    return Path(shutil.copytree(FIXTURE, tmp_path / "recipe"))


def _table(path: Path) -> dict[str, str]:
    return dict(line.split(maxsplit=1) for line in path.read_text().splitlines())


def test_prepare_segments_dir_gives_exact_samples(recipe, tmp_path, monkeypatch):
    out = prepare_kaldi_dir(recipe / "data", tmp_path / "m", root=recipe, progress=False)
    assert list(out) == ["dev", "train"]
    assert out["train"] == manifest_path(tmp_path / "m", "kaldi_dir", "train")
    rows = manifest_rows(out["train"])
    data = recipe / "data" / "train"
    segments, text = _table(data / "segments"), _table(data / "text")
    monkeypatch.chdir(recipe)  # feats.scp paths are relative to the recipe folder
    utt2spk, feats = _table(data / "utt2spk"), kaldiio.load_scp("data/train/feats.scp")
    assert [r["key"] for r in rows] == sorted(segments)
    for r in rows:
        reco, start, end = segments[r["key"]].split()
        wav = recipe / "wav" / f"{reco}.wav"
        assert r["audio_path"] == str(wav.resolve()) and r["recording"] == reco
        assert r["offset"] == float(start)
        assert r["duration"] == pytest.approx(float(end) - float(start), abs=1e-9)
        assert r["sample_rate"] == soundfile.info(str(wav)).samplerate == 16000
        assert r["text"] == text[r["key"]] and r["speaker"] == utt2spk[r["key"]]
        assert r["feats_path"].startswith(str((recipe / "mfcc").resolve()))
        assert np.array_equal(kaldiio.load_mat(r["feats_path"]), feats[r["key"]])
        assert r["num_frames"] == feats[r["key"]].shape[0]


def test_prepare_feats_only_dir_uses_utt2dur(recipe):
    rows = prepare_kaldi_dir(recipe / "data" / "dev", root=recipe, progress=False)["dev"]
    utt2dur = _table(recipe / "data" / "dev" / "utt2dur")
    assert [r["key"] for r in rows] == ["spkC-dev-000", "spkC-dev-001"]
    for r in rows:
        assert set(r) == {"key", "feats_path", "num_frames", "duration", "text", "speaker"}
        assert r["duration"] == float(utt2dur[r["key"]])
        assert r["num_frames"] == kaldiio.load_mat(r["feats_path"]).shape[0]
    (recipe / "data" / "dev" / "utt2dur").unlink()
    again = prepare_kaldi_dir(recipe / "data" / "dev", root=recipe, progress=False)["dev"]
    assert [r["duration"] for r in again] == [r["num_frames"] * 0.01 for r in rows]


def test_whole_recordings_without_segments_use_soundfile_durations(recipe):
    d = recipe / "data" / "reco"
    d.mkdir()
    (d / "wav.scp").write_text("rec1 wav/rec1.wav\nrec2 wav/rec2.wav\n")
    (d / "text").write_text("rec1 A\nrec2 B\n")
    rows = prepare_kaldi_dir(d, root=recipe, progress=False)["reco"]
    for r in rows:
        info = soundfile.info(str(recipe / "wav" / f"{r['key']}.wav"))
        assert r["duration"] == info.frames / info.samplerate and "offset" not in r


def test_relative_paths_default_to_the_current_folder(recipe, monkeypatch):
    monkeypatch.chdir(recipe)
    rows = prepare_kaldi_dir("data/train", progress=False)["train"]
    assert rows[0]["audio_path"] == str((recipe / "wav" / "rec1.wav").resolve())


def test_utterance_without_text_and_text_without_utterance(recipe, tmp_path):
    data = recipe / "data" / "train"
    lines = (data / "text").read_text().splitlines()
    (data / "text").write_text("\n".join(lines[1:] + ["zzz-ghost HELLO"]) + "\n")
    with pytest.raises(DataError) as info:
        prepare_kaldi_dir(data, root=recipe, progress=False)
    msg = str(info.value)
    assert f"{data / 'segments'}:1 (key 'spkA-rec1-000')" in msg
    assert f"{data / 'text'}:4 (key 'zzz-ghost')" in msg
    with pytest.warns(SkippedInputWarning, match="audio without transcript: 1"):
        rows = prepare_kaldi_dir(data, root=recipe, on_mismatch="skip", progress=False)["train"]
    assert "spkA-rec1-000" not in [r["key"] for r in rows] and len(rows) == 3


def test_directory_without_text_is_unlabelled(recipe):
    (recipe / "data" / "train" / "text").unlink()
    rows = prepare_kaldi_dir(recipe / "data" / "train", root=recipe, progress=False)["train"]
    assert len(rows) == 4 and all("text" not in r for r in rows)


def test_utterance_missing_from_utt2spk_is_named(recipe):
    data = recipe / "data" / "train"
    (data / "utt2spk").write_text("spkA-rec1-000 spkA\n")
    (data / "spk2utt").unlink()
    with pytest.raises(DataError, match=rf"{data / 'utt2spk'} \(key 'spkA-rec1-001'\): "
                                        "utterance missing from utt2spk"):
        prepare_kaldi_dir(data, root=recipe, progress=False)


def test_spk2utt_disagreeing_with_utt2spk_is_named(recipe):
    data = recipe / "data" / "train"
    (data / "spk2utt").write_text("spkA spkA-rec1-000 spkB-rec2-000\nspkB spkB-rec2-001\n")
    with pytest.raises(DataError, match=rf"{data / 'spk2utt'}:1 \(key 'spkA'\): spk2utt lists "
                                        "'spkB-rec2-000' under 'spkA'"):
        prepare_kaldi_dir(data, root=recipe, progress=False)


def test_segment_past_the_end_of_its_recording_is_named(recipe):
    data = recipe / "data" / "train"
    seg = (data / "segments").read_text().replace("rec2 1.62 2.92", "rec2 1.62 9.00")
    (data / "segments").write_text(seg)
    with pytest.raises(DataError, match=rf"{data / 'segments'}:4 \(key 'spkB-rec2-001'\): "
                                        "segment ends at 9.0 s, past the end"):
        prepare_kaldi_dir(data, root=recipe, progress=False)


def test_segment_of_an_unknown_recording_is_named(recipe):
    data = recipe / "data" / "train"
    (data / "segments").write_text((data / "segments").read_text().replace(" rec2 ", " rec9 "))
    with pytest.raises(DataError, match=r"segments:3 \(key 'spkB-rec2-000'\): unknown recording"):
        prepare_kaldi_dir(data, root=recipe, progress=False)


def test_command_in_wav_scp_points_to_kaldi_dir_samples(recipe):
    data = recipe / "data" / "train"
    (data / "wav.scp").write_text("rec1 sox wav/rec1.wav -t wav - |\nrec2 wav/rec2.wav\n")
    with pytest.raises(DataError, match=r"wav.scp:1 \(key 'rec1'\): this wav.scp value is a "
                                        r"command.*kaldi_dir_samples"):
        prepare_kaldi_dir(data, root=recipe, progress=False)


def test_missing_audio_file_is_named_with_its_table_line(recipe):
    (recipe / "wav" / "rec2.wav").unlink()
    with pytest.raises(MissingDataError, match=r"wav.scp:2 \(key 'rec2'\): audio file not "
                                               "found"):
        prepare_kaldi_dir(recipe / "data" / "train", root=recipe, progress=False)


def test_feats_scp_not_matching_the_utterances_is_named(recipe):
    data = recipe / "data" / "train"
    lines = (data / "feats.scp").read_text().splitlines()
    (data / "feats.scp").write_text("\n".join(lines[:3]) + "\n")
    with pytest.raises(DataError, match=r"feats.scp: feats.scp keys differ.*'spkB-rec2-001'"):
        prepare_kaldi_dir(data, root=recipe, progress=False)


def test_missing_data_dir_and_folder_without_data_dirs(recipe, tmp_path):
    with pytest.raises(MissingDataError, match=rf"{recipe / 'data' / 'test'}: Kaldi data "
                                               "directory not found"):
        prepare_kaldi_dir(recipe / "data", parts=["test"], root=recipe)
    with pytest.raises(MissingDataError, match="no Kaldi data directory here"):
        prepare_kaldi_dir(recipe / "wav")


def test_rerun_reuses_up_to_date_manifests_and_redoes_changed_ones(recipe, tmp_path,
                                                                   monkeypatch):
    out = prepare_kaldi_dir(recipe / "data", tmp_path / "m", root=recipe, progress=False)
    with monkeypatch.context() as m:  # a rerun that read the audio again would now fail
        m.setattr(kaldi_dir, "measure_audio", None)
        again = prepare_kaldi_dir(recipe / "data", tmp_path / "m", root=recipe, progress=False)
    assert again == out and {r.status for r in again.reports.values()} == {"up to date"}
    shutil.rmtree(recipe / "wav")
    with pytest.raises(MissingDataError, match="audio file not found"):
        prepare_kaldi_dir(recipe / "data", tmp_path / "m", root=recipe, progress=False)


def test_kaldi_dir_samples_cuts_segments_and_joins_text_and_speaker(recipe):
    data = recipe / "data" / "train"
    samples = list(kaldi_dir_samples(data, root=recipe))
    segments, text = _table(data / "segments"), _table(data / "text")
    assert [s["key"] for s in samples] == sorted(segments)
    for s in samples:
        reco, start, end = segments[s["key"]].split()
        whole, rate = soundfile.read(str(recipe / "wav" / f"{reco}.wav"), dtype="float32")
        expected = whole[round(float(start) * rate):round(float(end) * rate)]
        assert np.array_equal(s["audio"], expected)
        assert s["text"] == text[s["key"]] and s["speaker"] == s["key"].split("-")[0]


def test_kaldi_dir_samples_of_a_feats_only_dir(recipe, monkeypatch):
    monkeypatch.chdir(recipe)
    samples = list(kaldi_dir_samples("data/dev"))
    assert [(s["key"], s["feats"].shape[1], s["speaker"]) for s in samples] == [
        ("spkC-dev-000", 13, "spkC"), ("spkC-dev-001", 13, "spkC")]


def test_kaldi_dir_samples_needs_a_data_dir(tmp_path):
    with pytest.raises(MissingDataError, match="not a Kaldi data directory"):
        kaldi_dir_samples(tmp_path)


def test_pipelines_on_audio_and_on_feature_manifests(recipe, tmp_path):
    out = prepare_kaldi_dir(recipe / "data", tmp_path / "m", root=recipe, progress=False)
    rows = {r["key"]: r for r in manifest_rows(out["train"])}
    [batch] = list(kaldi_dir_eval(tmp_path / "m", parts=["train"], budget=SampleCount(4),
                                  features=None))
    assert batch["key"] == sorted(rows)
    assert [int(n) for n in batch["audio_len"]] == [round(rows[k]["duration"] * 16000)
                                                     for k in batch["key"]]
    batches = list(kaldi_dir_train(out, parts=["dev"], input="feats", features=None,
                                   budget=10.0))
    # every utterance once (how many batches they make is the plan's: its streams)
    assert sorted(k for b in batches for k in b["key"]) == ["spkC-dev-000", "spkC-dev-001"]
    assert all(b["feats"].shape[2] == 13 for b in batches)
    with pytest.raises(ValueError, match="features are computed from audio"):
        kaldi_dir_train(out, parts=["dev"], input="feats")


def test_prepare_command_forwards_root(recipe, tmp_path, capsys):
    parser = argparse.ArgumentParser(prog="speechpipe")
    add_prepare_command(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["prepare", "kaldi_dir", str(recipe / "data"), str(tmp_path / "m"),
                              "--root", str(recipe), "--no-progress"])
    assert args.func(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line for line in lines if not line.startswith(" ")] == [
        f"kaldi_dir dev: written {manifest_path(tmp_path / 'm', 'kaldi_dir', 'dev')}",
        f"kaldi_dir train: written {manifest_path(tmp_path / 'm', 'kaldi_dir', 'train')}"]


def test_a_data_dir_given_as_dot_is_named_after_its_folder(recipe, tmp_path, monkeypatch):
    # issue 18: prepare kaldi_dir . named the part "" (kaldi_dir_samples_.jsonl.gz)
    monkeypatch.chdir(recipe / "data" / "dev")
    out = prepare_kaldi_dir(".", tmp_path / "m", root=recipe, progress=False)
    assert list(out) == ["dev"]
    assert out["dev"] == manifest_path(tmp_path / "m", "kaldi_dir", "dev")


def test_a_failed_first_prepare_command_leaves_no_empty_output_folder(recipe, tmp_path,
                                                                       capsys):
    # the new-user trial (issue 32): `prepare kaldi_dir` without --allow-commands on a
    # wav.scp with a `sox ... |` line failed, and left the empty output folder behind
    data = recipe / "data" / "train"
    (data / "wav.scp").write_text("rec1 sox wav/rec1.wav -t wav - |\nrec2 wav/rec2.wav\n")
    parser = argparse.ArgumentParser(prog="speechpipe")
    add_prepare_command(parser.add_subparsers(dest="command"))
    out = tmp_path / "out" / "m"
    for folder in (out, tmp_path / "kept"):
        if folder.name == "kept":
            folder.mkdir()  # a folder that was there before is left as it was
        args = parser.parse_args(["prepare", "kaldi_dir", str(data), str(folder), "--root",
                                  str(recipe), "--no-progress"])
        assert args.func(args) == 2
        assert "this wav.scp value is a command" in capsys.readouterr().err
    assert not out.exists() and (tmp_path / "kept").is_dir()


def test_verify_reports_segments_outside_a_truncated_recording_with_every_other_fault(
        recipe, tmp_path):
    # the new-user trial (issue 32): a truncated recording (its WAV data cut short) and a
    # missing one; --verify stopped at the first segment past the end of the truncated one
    (recipe / "wav" / "rec1.wav").unlink()
    rec2 = recipe / "wav" / "rec2.wav"
    rec2.write_bytes(rec2.read_bytes()[:44 + 2 * 27200])  # 1.7 s of the 2.92 s promised
    data = recipe / "data" / "train"
    with pytest.raises(DataError) as info:
        prepare_kaldi_dir(data, tmp_path / "m", root=recipe, progress=False, verify=True)
    message = str(info.value)
    assert "verification found 4 fault(s) of 3 kind(s)" in message
    assert re.search(r"segment outside its recording \(or a truncated recording\): 1 \(e\.g\. "
                     r".*segments:4 \(key 'spkB-rec2-001'\): segment ends at 2\.92 s, past the "
                     r"end of recording 'rec2'.*\) -- no option leaves them out: fix them",
                     message)
    assert "missing audio: 2" in message and "truncated audio: 1" in message
    assert "transcript without audio" not in message
    assert ("Fix the corpus, or rerun with --on-error skip (the 1 fault(s) no option leaves "
            "out must be fixed)") in message
    with pytest.raises(MissingDataError, match=r"wav.scp:1 \(key 'rec1'\)"):
        prepare_kaldi_dir(data, tmp_path / "m", root=recipe, progress=False)  # the first
