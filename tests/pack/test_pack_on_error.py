"""``pack --on-error`` (issue 32, item 7): an utterance whose data is missing, unreadable,
truncated or corrupt stops the pack by default, naming the file, line and key; with
``on_error="skip"`` (CLI ``--on-error skip``) it is left out before planning, counted once per
utterance and reported once with examples -- for ``wav.scp``, ``feats.scp``, ``segments``
recordings and manifests, in one process or several, in one run or as a job array.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import soundfile

import speechpipe as sp
from speechpipe.errors import DataError, MissingDataError
from speechpipe.pack import PackOptions, pack_data, plan_pack, pack_task, merge_pack
from test_pack import read_back, run_cli, tree_digest, write_feats, write_text, write_wavs

KEYS = ["u1", "u2", "u3", "u4", "u5", "u6"]


def _truncate(path, keep):
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[:keep] if keep >= 0 else data[:len(data) + keep])


@pytest.fixture
def broken(tmp_path):
    """A wav.scp of six utterances: u2's file is missing, u3 is a truncated FLAC (its header
    is fine), u4 a WAV whose data chunk is cut short, u5 not audio at all."""
    scp, arrays = write_wavs(str(tmp_path), {k: 8000 for k in KEYS})
    with open(scp) as f:
        lines = f.read().splitlines()
    os.remove(tmp_path / "u2.wav")
    soundfile.write(tmp_path / "u3.flac", arrays["u3"], 8000, subtype="PCM_16")
    _truncate(tmp_path / "u3.flac", os.path.getsize(tmp_path / "u3.flac") // 2)
    lines[2] = f"u3 {tmp_path}/u3.flac"
    _truncate(tmp_path / "u4.wav", -4000)
    (tmp_path / "u5.wav").write_bytes(b"this is not audio" * 100)
    (tmp_path / "wav.scp").write_text("\n".join(lines) + "\n")
    text = write_text(tmp_path / "text", {k: f"text {k}" for k in KEYS})
    return {"scp": scp, "text": text, "arrays": arrays, "tmp": tmp_path}


def test_the_default_still_stops_at_a_missing_file_naming_file_line_and_key(broken):
    with pytest.raises(MissingDataError, match=r"wav.scp:2 \(key 'u2'\): .*u2.wav"):
        pack_data(broken["scp"], broken["text"], broken["tmp"] / "out", progress=False)
    assert not os.path.exists(broken["tmp"] / "out")


def test_skip_leaves_out_missing_truncated_and_corrupt_files_counted_once(broken):
    report = pack_data(broken["scp"], broken["text"], broken["tmp"] / "out", progress=False,
                       on_error="skip", utts_per_shard=2)
    assert report.groups == {".": 2}
    assert report.unreadable == 4
    examples = report.unreadable_examples
    assert [e.split(" (key")[0] for e in examples] == [
        f"{broken['scp']}:{n}" for n in (2, 3, 4, 5)]
    assert "u2.wav: audio file not found" in examples[0]
    assert "u3.flac: corrupt audio: decoding stops at" in examples[1]
    assert "u4.wav: truncated audio: its header promises" in examples[2]
    assert "u5.wav" in examples[3]
    samples = read_back(str(broken["tmp"] / "out"))
    assert [s["key"] for s in samples] == ["u1", "u6"]
    for s in samples:
        assert np.array_equal(np.rint(s["audio"] * 32768).astype(np.int16),
                              broken["arrays"][s["key"]])
    text = report.report()
    assert "unreadable data (not packed, --on-error skip): 4 utterance(s)" in text
    assert text.count("u2.wav: audio file not found") == 1


def test_skip_tells_the_kind_of_a_table_whose_first_file_is_missing(tmp_path):
    scp, _ = write_wavs(str(tmp_path), {"a": 800, "b": 800})
    os.remove(tmp_path / "a.wav")
    text = write_text(tmp_path / "text", {"a": "x", "b": "y"})
    with pytest.raises(MissingDataError, match=r"wav.scp:1 \(key 'a'\)"):
        pack_data(scp, text, tmp_path / "out", progress=False)
    report = pack_data(scp, text, tmp_path / "out", progress=False, on_error="skip")
    assert (report.kind, report.groups, report.unreadable) == ("wav", {".": 1}, 1)


def test_skip_leaves_out_features_of_a_missing_or_truncated_ark(tmp_path):
    scp1, _ = write_feats(str(tmp_path), "f1", {"a": (5, 3), "b": (50, 3)})
    scp2, arrays = write_feats(str(tmp_path), "f2", {"c": (7, 3)})
    _truncate(tmp_path / "f1.ark", -100)
    text = write_text(tmp_path / "text", {"a": "x", "b": "y", "c": "z"})
    with pytest.raises(DataError, match=r"f1.scp:2 \(key 'b'\)"):
        pack_data([scp1, scp2], text, tmp_path / "out", progress=False)
    report = pack_data([scp1, scp2], text, tmp_path / "out", progress=False, on_error="skip")
    assert (report.groups, report.unreadable) == ({".": 2}, 1)
    assert report.unreadable_examples[0].startswith(f"{scp1}:2 (key 'b')")
    os.remove(tmp_path / "f1.ark")
    report = pack_data([scp1, scp2], text, tmp_path / "out2", progress=False, on_error="skip")
    assert (report.groups, report.unreadable) == ({".": 1}, 2)
    assert [s["key"] for s in read_back(str(tmp_path / "out2"))] == ["c"]


def test_segments_of_a_missing_recording_are_each_counted_once(tmp_path):
    scp, _ = write_wavs(str(tmp_path), {"rec1": 16000, "rec2": 16000})
    os.remove(tmp_path / "rec2.wav")
    (tmp_path / "segments").write_text("s1 rec1 0.0 0.5\ns2 rec2 0.0 0.5\ns3 rec2 0.5 1.0\n"
                                       "s4 rec1 0.5 1.0\n")
    text = write_text(tmp_path / "text", {f"s{i}": "x" for i in range(1, 5)})
    with pytest.raises(MissingDataError, match="rec2.wav"):
        pack_data(scp, text, tmp_path / "out", segments=str(tmp_path / "segments"),
                  progress=False)
    report = pack_data(scp, text, tmp_path / "out", segments=str(tmp_path / "segments"),
                       progress=False, on_error="skip")
    assert (report.groups, report.unreadable) == ({".": 2}, 2)
    assert [e.split(": its recording, ")[0] for e in report.unreadable_examples] == [
        f"{tmp_path}/segments:2 (key 's2')", f"{tmp_path}/segments:3 (key 's3')"]
    assert all(f"{scp}:2 (key 'rec2'): " in e for e in report.unreadable_examples)
    assert [s["key"] for s in read_back(str(tmp_path / "out"))] == ["s1", "s4"]


def test_segments_of_a_truncated_recording_are_skipped_before_planning(tmp_path):
    scp, _ = write_wavs(str(tmp_path), {"rec1": 16000, "rec2": 16000})
    _truncate(tmp_path / "rec2.wav", -8000)  # its header still says 16000 samples
    (tmp_path / "segments").write_text("s1 rec1 0.0 0.5\ns2 rec2 0.0 0.5\n")
    text = write_text(tmp_path / "text", {"s1": "x", "s2": "y"})
    report = pack_data(scp, text, tmp_path / "out", segments=str(tmp_path / "segments"),
                       progress=False, on_error="skip")
    assert (report.groups, report.unreadable) == ({".": 1}, 1)
    assert "rec2.wav: truncated audio" in report.unreadable_examples[0]


def test_manifest_lines_of_missing_audio_are_skipped(tmp_path):
    write_wavs(str(tmp_path), {"m1": 800, "m2": 800})
    os.remove(tmp_path / "m2.wav")
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps({"key": k, "audio_path": str(tmp_path / f"{k}.wav"),
                                            "text": "x"}) + "\n" for k in ("m1", "m2")))
    report = pack_data(None, None, tmp_path / "out", manifests=manifest, progress=False,
                       on_error="skip")
    assert (report.groups, report.unreadable) == ({".": 1}, 1)
    assert report.unreadable_examples[0].startswith(f"{manifest}:2 (key 'm2')")


def test_nothing_readable_is_an_error_even_when_skipping(tmp_path):
    scp, _ = write_wavs(str(tmp_path), {"a": 800, "b": 800})
    (tmp_path / "a.wav").write_bytes(b"junk" * 100)
    (tmp_path / "b.wav").write_bytes(b"junk" * 100)
    text = write_text(tmp_path / "text", {"a": "x", "b": "y"})
    with pytest.raises(DataError, match=r"nothing to pack: none of the 2 utterance\(s\) can "
                                        r"be read \(e.g. .*wav.scp:1 \(key 'a'\)"):
        pack_data(scp, text, tmp_path / "out", progress=False, on_error="skip", kind="wav")


def test_on_error_is_checked_when_options_are_built():
    with pytest.raises(ValueError, match=r"on_error must be one of \('raise', 'skip'\)"):
        PackOptions(on_error="ignore")


def test_the_job_array_reports_the_skipped_utterances_and_writes_the_same_bytes(broken):
    tmp = broken["tmp"]
    one = pack_data(broken["scp"], broken["text"], tmp / "one", progress=False,
                    on_error="skip", utts_per_shard=1)
    planned = plan_pack(broken["scp"], broken["text"], tmp / "jobs", on_error="skip",
                        utts_per_shard=1, progress=False)
    assert (planned.unreadable, planned.unreadable_examples) == (4, one.unreadable_examples)
    for task in (1, 2):
        pack_task(tmp / "jobs", task, 2, progress=False)
    merged = merge_pack(tmp / "jobs")
    assert (merged.unreadable, merged.unreadable_examples) == (4, one.unreadable_examples)
    assert tree_digest(tmp / "jobs") == tree_digest(tmp / "one")


def test_cli_on_error_skip_prints_the_skipped_utterances_once(broken, capsys):
    argv = ["pack", "--scp", broken["scp"], "--labels", broken["text"], "--out",
            str(broken["tmp"] / "out"), "--no-progress"]
    assert run_cli(argv) == 2
    err = capsys.readouterr().err
    assert "wav.scp:2 (key 'u2')" in err and "--on-error skip" in err
    assert run_cli(argv + ["--on-error", "skip"]) == 0
    out = capsys.readouterr().out
    assert "unreadable data (not packed, --on-error skip): 4 utterance(s)" in out
    assert out.count("(key 'u2')") == 1
    index = sp.ShardIndex.read(str(broken["tmp"] / "out"))
    assert [k for entry in index.shards for k in entry.keys] == ["u1", "u6"]


@pytest.mark.slow
def test_two_workers_skip_the_same_utterances_and_write_the_same_bytes(broken):
    tmp = broken["tmp"]
    one = pack_data(broken["scp"], broken["text"], tmp / "one", progress=False,
                    on_error="skip", utts_per_shard=2)
    two = pack_data(broken["scp"], broken["text"], tmp / "two", progress=False,
                    on_error="skip", utts_per_shard=2, num_workers=2)
    assert (two.unreadable, two.unreadable_examples) == (one.unreadable,
                                                         one.unreadable_examples)
    assert tree_digest(tmp / "one") == tree_digest(tmp / "two")


def test_cli_says_to_pass_the_option_when_the_error_is_a_choice_not_a_broken_file(tmp_path,
                                                                                   capsys):
    # the new-user trial (issue 32): a refused `sox ... |` line of a Kaldi wav.scp, or audio
    # at two rates with --length-unit samples, said "fix the file at the place named above"
    scp, _ = write_wavs(str(tmp_path), {"a": 800})
    with open(scp, "a") as f:
        f.write(f"b sox {tmp_path}/a.wav -r 16000 -t wav - |\n")
    text = write_text(tmp_path / "text", {"a": "x", "b": "y"})
    argv = ["pack", "--scp", scp, "--labels", text, "--out", str(tmp_path / "out"),
            "--no-progress"]
    assert run_cli(argv) == 2
    err = capsys.readouterr().err
    assert "(CLI: --allow-commands)" in err and "fix the file at the place" not in err
    assert "fix the input, or pass the option named above" in err
    assert run_cli(argv + ["--allow-commands", "--length-unit", "samples"]) == 2
    err = capsys.readouterr().err
    assert "2 sample rates" in err and "pass the option named above" in err
    assert run_cli(argv + ["--allow-commands"]) == 0  # several rates: seconds by default
    assert "lengths in seconds" in capsys.readouterr().out


def test_the_examples_show_each_distinct_fault_before_repeating_one(tmp_path):
    # the trial: 13 segments of a truncated recording filled the five examples and hid the
    # one segment whose recording was missing
    scp, _ = write_wavs(str(tmp_path), {"rec1": 16000, "rec2": 16000})
    with open(scp, "a") as f:
        f.write(f"ghost {tmp_path}/ghost.wav\n")
    _truncate(tmp_path / "rec1.wav", -8000)
    segments = [f"s{i} rec1 {i * 0.1:.1f} {i * 0.1 + 0.1:.1f}" for i in range(7)]
    segments += ["t0 rec2 0.0 0.5", "z0 ghost 0.0 0.5"]
    (tmp_path / "segments").write_text("\n".join(segments) + "\n")
    text = write_text(tmp_path / "text", {s.split()[0]: "x" for s in segments})
    report = pack_data(scp, text, tmp_path / "out", segments=str(tmp_path / "segments"),
                       progress=False, on_error="skip")
    assert (report.groups, report.unreadable) == ({".": 1}, 8)
    shown = report.unreadable_examples
    assert len(shown) == 5 and "(key 'z0')" in shown[-1] and "(key 's0')" in shown[0]
