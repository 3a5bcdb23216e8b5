"""What ``prepare`` and ``pack`` check on a messy corpus (issue 18): verification of every
file (case 2), skipping at load time, idempotent and honest reruns (case 4), Kaldi ``wav.scp``
command lines (case 5) and the one policy for empty transcripts (case 6)."""

from __future__ import annotations

import argparse
import shutil
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import soundfile

from speechpipe.cli.pack import add_command as add_pack_command
from speechpipe.cli.prepare import add_command as add_prepare_command
from speechpipe.diagnostics import SkippedInputWarning
from speechpipe.errors import DataError, UnsafeInputError
from speechpipe.pack import pack_data
from speechpipe.pipes.sources import read_manifest
from speechpipe.recipes import eval_pipeline, pipeline_report, verify_audio
from speechpipe.recipes.kaldi_dir import prepare_kaldi_dir
from speechpipe.recipes.librispeech import prepare_librispeech
from speechpipe import SampleCount


def _tone(seconds: float, rate: int, freq: float = 220.0) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # the header still promises the whole length


@pytest.fixture
def libri(tmp_path):
    """LibriSpeech/dev-clean/19/198 with 6 utterances: 0000-0001 fine at 16 kHz, 0002 at
    8 kHz, 0003 truncated, 0004 corrupt (noise after the first bytes), 0005 with no sample."""
    chapter = tmp_path / "LibriSpeech" / "dev-clean" / "19" / "198"
    chapter.mkdir(parents=True)
    lines = []
    for i in range(6):
        key = f"19-198-{i:04d}"
        rate = 8000 if i == 2 else 16000
        soundfile.write(chapter / f"{key}.flac", _tone(0 if i == 5 else 2.0, rate), rate)
        lines.append(f"{key} HELLO {i}")
    _truncate(chapter / "19-198-0003.flac")
    good = (chapter / "19-198-0004.flac").read_bytes()
    noise = np.random.default_rng(0).integers(0, 256, len(good) - 200, dtype=np.uint8)
    (chapter / "19-198-0004.flac").write_bytes(good[:200] + noise.tobytes())
    (chapter / "19-198.trans.txt").write_text("\n".join(lines) + "\n")
    return tmp_path / "LibriSpeech"


def _prepare_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="speechpipe")
    subparsers = parser.add_subparsers(dest="command")
    add_prepare_command(subparsers)
    add_pack_command(subparsers)
    return parser


# --------------------------------------------------------------------------- verification


def test_verify_audio_finds_truncated_corrupt_and_empty_files(libri):
    chapter = libri / "dev-clean" / "19" / "198"
    found = verify_audio(sorted(str(p) for p in chapter.glob("*.flac")), num_jobs=2,
                         progress=False)
    problems = {Path(p).stem[-4:]: c.problem for p, c in found.items()}
    assert problems == {"0000": None, "0001": None, "0002": None, "0003": "truncated",
                        "0004": "corrupt", "0005": "empty"}
    assert found[str(chapter / "19-198-0002.flac")].sample_rate == 8000


def test_verify_audio_finds_a_wav_whose_data_is_shorter_than_its_header(tmp_path):
    # found on real recordings: libsndfile decodes what a cut WAV holds without an error, and
    # its frame count is what is there, so only the header's data size shows the loss
    whole = tmp_path / "whole.wav"
    soundfile.write(whole, np.full(16000, 0.1, np.float32), 16000, subtype="PCM_16")
    cut = tmp_path / "cut.wav"
    cut.write_bytes(whole.read_bytes()[:44 + 8000])
    found = verify_audio([str(whole), str(cut)], progress=False)
    assert found[str(whole)].problem is None
    assert found[str(cut)].problem == "truncated"
    assert "promises 32000 bytes of audio but the file holds 8000" in found[str(cut)].detail


def test_a_truncated_flac_passes_prepare_but_not_prepare_with_verify(libri, tmp_path):
    with pytest.raises(DataError) as info:
        prepare_librispeech(libri, tmp_path / "a", progress=False, verify=True)
    message = str(info.value)  # every bad file counted, in one error
    for expected in ("corrupt audio: 1", "empty audio: 1", "truncated audio: 1",
                     "19-198-0003.flac: decod", "--on-error skip"):
        assert expected in message
    # issue 18.2: the header's duration is written, so prepare alone cannot see it
    for name in ("19-198-0004.flac", "19-198-0005.flac"):
        (libri / "dev-clean" / "19" / "198" / name).unlink()
    with pytest.warns(SkippedInputWarning, match="transcript without audio: 2"):
        plain = prepare_librispeech(libri, progress=False, on_mismatch="skip")["dev-clean"]
    assert [s["key"] for s in plain][-1] == "19-198-0003"
    assert plain[-1]["duration"] == 2.0
    with pytest.raises(DataError, match=r"truncated audio: 1 .*19-198-0003.flac: decod"), \
            pytest.warns(SkippedInputWarning):
        prepare_librispeech(libri, progress=False, on_mismatch="skip", verify=True)


def test_verify_with_skip_leaves_bad_files_out_counted_and_reports_rates(libri, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing is warned silently: it is all in the report
        out = prepare_librispeech(libri, tmp_path / "m", progress=False, verify=True,
                                  on_error="skip", num_jobs=2)
    keys = [s["key"] for s in read_manifest(out["dev-clean"])]
    assert keys == ["19-198-0000", "19-198-0001", "19-198-0002"]
    report = out.reports["dev-clean"]
    assert report.skipped == {"corrupt audio": 1, "empty audio": 1, "truncated audio": 1}
    assert report.sample_rates == {8000: 1, 16000: 2} and report.utterances == 3
    text = report.report()
    assert "sample rates: 8000 Hz: 1, 16000 Hz: 2 (resampled to 16000 Hz when read)" in text
    assert "19-198-0003.flac" in text and "skipped 3" in text


def test_recipe_pipelines_skip_unreadable_audio_at_load_time_and_count_it(libri, tmp_path):
    # issue 18.2: a truncated file used to stop training with a DataError, with no skip policy
    samples = [{"key": p.stem, "audio_path": str(p), "duration": 2.0, "text": "HI"}
               for p in sorted((libri / "dev-clean" / "19" / "198").glob("*.flac"))]
    with pytest.raises(DataError, match="19-198-0003"):
        list(eval_pipeline(samples, budget=SampleCount(8), shard=False, features=None))
    pipe = eval_pipeline(samples, budget=SampleCount(8), shard=False, features=None,
                         on_error="skip")
    with pytest.warns(SkippedInputWarning, match="unreadable audio: 3"):
        [batch] = list(pipe)
    assert batch["key"] == ["19-198-0000", "19-198-0001", "19-198-0002"]
    assert "load_audio skipped 3 item(s)" in pipeline_report(pipe)


def test_cli_verify_names_and_counts_every_bad_file(libri, tmp_path, capsys):
    args = _prepare_parser().parse_args([
        "prepare", "librispeech", str(libri), str(tmp_path / "m"), "--verify", "--on-error",
        "skip", "--empty-text", "keep", "--jobs", "2", "--no-progress"])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "3 utterances" in out and "skipped 3" in out
    for name in ("19-198-0003.flac", "19-198-0004.flac", "19-198-0005.flac"):
        assert name in out


# --------------------------------------------------------------------------- reruns


def test_rerun_says_up_to_date_and_rewrites_a_changed_corpus_saying_why(libri, tmp_path):
    # issue 18.4: a rerun over a changed corpus kept the old manifest with the same message
    for name in ("19-198-0003.flac", "19-198-0004.flac", "19-198-0005.flac"):
        (libri / "dev-clean" / "19" / "198" / name).unlink()
    trans = libri / "dev-clean" / "19" / "198" / "19-198.trans.txt"
    trans.write_text("".join(trans.read_text().splitlines(keepends=True)[:3]))
    first = prepare_librispeech(libri, tmp_path / "m", progress=False)
    assert first.reports["dev-clean"].status == "written"
    assert prepare_librispeech(libri, tmp_path / "m", progress=False).reports[
        "dev-clean"].status == "up to date"
    soundfile.write(trans.parent / "19-198-0003.flac", _tone(1.0, 16000), 16000)
    trans.write_text(trans.read_text() + "19-198-0003 A NEW ONE\n")
    again = prepare_librispeech(libri, tmp_path / "m", progress=False)
    report = again.reports["dev-clean"]
    assert (report.status, report.utterances) == ("rewritten", 4)
    assert report.reason.startswith("the corpus changed: files ")
    other = prepare_librispeech(libri, tmp_path / "m", progress=False, empty_text="skip")
    assert other.reports["dev-clean"].reason.startswith("options changed")
    assert prepare_librispeech(libri, tmp_path / "m", progress=False, empty_text="skip",
                               force=True).reports["dev-clean"].reason == "--force"


# --------------------------------------------------------------------------- Kaldi commands


def _kaldi_dir(tmp_path: Path, commands: dict[str, str], text: dict[str, str]) -> Path:
    data = tmp_path / "data" / "train"
    data.mkdir(parents=True)
    (data / "wav.scp").write_text("".join(f"{k} {v}\n" for k, v in sorted(commands.items())))
    (data / "text").write_text("".join(f"{k} {v}\n" for k, v in sorted(text.items())))
    return data


def _python_command(path: Path) -> str:
    """A command writing ``path``'s bytes to stdout: the portable stand-in for flac/sox."""
    return f"{sys.executable} -c \"import sys; sys.stdout.buffer.write(open('{path}', " \
           f"'rb').read())\" |"


@pytest.fixture
def commands(tmp_path):
    """wav.scp with command lines: sox (when installed) and a Python command; the audio."""
    audio = {"u1": _tone(1.0, 16000), "u2": _tone(1.5, 8000, 440)}
    soundfile.write(tmp_path / "u1.wav", audio["u1"], 16000, subtype="PCM_16")
    soundfile.write(tmp_path / "u2.flac", audio["u2"], 8000)
    table = {"u2": _python_command(tmp_path / "u2.flac")}
    if shutil.which("sox"):
        table["u1"] = f"sox {tmp_path / 'u1.wav'} -t wav - |"
    else:
        table["u1"] = _python_command(tmp_path / "u1.wav")
    if shutil.which("flac"):
        table["u2"] = f"flac -c -d -s {tmp_path / 'u2.flac'} |"
    data = _kaldi_dir(tmp_path, table, {"u1": "HELLO", "u2": "WORLD"})
    return data, audio


def test_prepare_kaldi_dir_runs_wav_scp_commands_only_when_allowed(commands, tmp_path):
    # issue 18.5: Kaldi's own wav.scp ('flac -c -d -s ... |') had no way through prepare
    data, audio = commands
    with pytest.raises(DataError, match="is a command: pass allow_commands=True"):
        prepare_kaldi_dir(data, tmp_path / "m", progress=False)
    out = prepare_kaldi_dir(data, tmp_path / "m", progress=False, allow_commands=True)
    rows = {r["key"]: r for r in read_manifest(out["train"])}
    assert sorted(rows) == ["u1", "u2"]
    for key, expected in audio.items():
        assert Path(rows[key]["audio_path"]).parent.name == "kaldi_dir_audio_train"
        got, rate = soundfile.read(rows[key]["audio_path"], dtype="float32")
        assert rate == rows[key]["sample_rate"] and np.allclose(got, expected, atol=1 / 32768)
    assert out.reports["train"].sample_rates == {8000: 1, 16000: 1}


def test_a_failing_command_is_named(tmp_path):
    data = _kaldi_dir(tmp_path, {"u1": "false |"}, {"u1": "X"})
    with pytest.raises(DataError, match=r"wav.scp:1 \(key 'u1'\)"):
        prepare_kaldi_dir(data, tmp_path / "m", progress=False, allow_commands=True)


def test_cli_prepare_and_pack_take_allow_commands(commands, tmp_path, capsys):
    data, audio = commands
    parser = _prepare_parser()
    args = parser.parse_args(["prepare", "kaldi_dir", str(data), str(tmp_path / "m"),
                              "--allow-commands", "--no-progress"])
    assert args.func(args) == 0
    assert "2 utterances" in capsys.readouterr().out
    pack = ["pack", "--scp", str(data / "wav.scp"), "--labels", str(data / "text"),
            "--out", str(tmp_path / "shards"), "--length-unit", "seconds", "--no-progress"]
    args = parser.parse_args(pack)
    assert args.func(args) == 2
    assert "--allow-commands" in capsys.readouterr().err
    args = parser.parse_args(pack + ["--allow-commands"])
    assert args.func(args) == 0
    assert "pack: 2 utterances" in capsys.readouterr().out


def test_pack_data_allow_commands_packs_the_commands_audio(commands, tmp_path):
    data, _ = commands
    with pytest.raises(UnsafeInputError):
        pack_data(str(data / "wav.scp"), str(data / "text"), tmp_path / "a", kind="wav",
                  progress=False)
    report = pack_data(str(data / "wav.scp"), str(data / "text"), tmp_path / "b",
                       progress=False, allow_commands=True, length_unit="seconds")
    assert report.utterances == 2 and report.sample_rates == {8000: 1, 16000: 1}


# --------------------------------------------------------------------------- empty text


@pytest.fixture
def with_empty(tmp_path):
    for key in ("u1", "u2", "u3"):
        soundfile.write(tmp_path / f"{key}.wav", _tone(0.5, 16000), 16000)
    return _kaldi_dir(tmp_path, {k: str(tmp_path / f"{k}.wav") for k in ("u1", "u2", "u3")},
                      {"u1": "HELLO", "u2": "", "u3": "WORLD"})


def test_prepare_kaldi_dir_applies_the_empty_text_policy(with_empty, tmp_path):
    # issue 18.6: prepare kaldi_dir kept empty transcripts silently
    with pytest.raises(DataError, match=r"1 utterance\(s\) with an empty transcript.*'u2'"):
        prepare_kaldi_dir(with_empty, tmp_path / "m", progress=False)
    skipped = prepare_kaldi_dir(with_empty, progress=False, empty_text="skip")
    assert [s["key"] for s in skipped["train"]] == ["u1", "u3"]
    assert skipped.reports["train"].skipped == {"empty transcript": 1}
    kept = prepare_kaldi_dir(with_empty, progress=False, empty_text="keep")
    assert len(kept["train"]) == 3 and kept.reports["train"].empty_text_kept == 1


def test_pack_applies_the_same_empty_text_policy(with_empty, tmp_path, capsys):
    # issue 18.6: pack kept empty transcripts silently
    scp, text = str(with_empty / "wav.scp"), str(with_empty / "text")
    with pytest.raises(DataError, match=r"1 utterance\(s\) with an empty label \(e\.g\. 'u2'\)"):
        pack_data(scp, text, tmp_path / "a", progress=False)
    skipped = pack_data(scp, text, tmp_path / "b", progress=False, empty_text="skip")
    assert skipped.utterances == 2 and "empty labels (not packed): 1" in skipped.report()
    kept = pack_data(scp, text, tmp_path / "c", progress=False, empty_text="keep")
    assert kept.utterances == 3 and "empty labels (packed): 1" in kept.report()
    args = _prepare_parser().parse_args(["pack", "--scp", scp, "--labels", text, "--out",
                                         str(tmp_path / "d"), "--empty-text", "skip",
                                         "--no-progress"])
    assert args.func(args) == 0 and "empty labels (not packed): 1" in capsys.readouterr().out


def test_streamed_corpora_skip_unreadable_audio_counted(libri, tmp_path):
    from speechpipe.recipes.kaldi_dir import kaldi_dir_samples
    from speechpipe.recipes.librispeech import librispeech_samples

    pipe = librispeech_samples(libri, on_error="skip")
    with pytest.warns(SkippedInputWarning, match="unreadable audio: 3"):
        assert [s["key"][-4:] for s in pipe] == ["0000", "0001", "0002"]
    chapter = libri / "dev-clean" / "19" / "198"
    data = _kaldi_dir(tmp_path, {p.stem: str(p) for p in chapter.glob("*.flac")},
                      {p.stem: "X" for p in chapter.glob("*.flac")})
    pipe = kaldi_dir_samples(data, on_error="skip", on_missing="skip")  # their text, too
    with pytest.warns(SkippedInputWarning, match="skipped 3"):
        assert [s["key"][-4:] for s in pipe] == ["0000", "0001", "0002"]


def test_verify_audio_finds_non_finite_samples(tmp_path):
    # Issue 34, item 7: prepare --verify passed a WAV with one NaN sample in 1,600.
    from speechpipe.recipes._checks import check_audio_file
    audio = np.zeros(1600, np.float32)
    audio[1200] = np.inf
    soundfile.write(tmp_path / "inf.wav", audio, 16000, subtype="FLOAT")
    check = check_audio_file(str(tmp_path / "inf.wav"))
    assert (check.problem, check.detail) == (
        "non-finite", "1 of its 1600 samples are NaN or infinite (the first at 0.075 s)")


# --------------------------------------------------------------------------- every fault at once


def _faulty_libri(tmp_path: Path) -> Path:
    """The demo corpus with one fault of each kind: a transcript without audio (a deleted
    FLAC), an empty transcript, a truncated FLAC."""
    from speechpipe.demo import DEMO_CORPUS

    root = tmp_path / "LibriSpeech"
    shutil.copytree(Path(DEMO_CORPUS), root)
    flacs = sorted(root.rglob("*.flac"))
    flacs[0].unlink()
    _truncate(flacs[5])
    trans = sorted(root.rglob("*.trans.txt"))[-1]
    lines = trans.read_text().splitlines()
    empty_key = lines[0].split()[0]
    trans.write_text("\n".join([empty_key] + lines[1:]) + "\n")
    return root


def test_verify_reports_every_fault_of_every_kind_then_fails_once_with_the_summary(tmp_path):
    # Issue 32.6: --verify stopped at the first kind of fault: three failing runs to learn
    # three problems, and no summary.
    root = _faulty_libri(tmp_path)
    with pytest.raises(DataError) as caught:
        prepare_librispeech(root, tmp_path / "m", verify=True, progress=False)
    message = str(caught.value)
    assert "verification found 3 fault(s) of 3 kind(s):" in message
    assert "transcript without audio: 1 (e.g." in message and "--on-mismatch skip" in message
    assert "empty transcript: 1 (e.g." in message and "--empty-text skip" in message
    assert "truncated audio: 1 (e.g." in message and "--on-error skip" in message
    assert ("rerun with --on-mismatch skip --empty-text skip --on-error skip. Without them:"
            in message)
    assert "dev-clean: not written" in message and "33 utterances" in message
    assert "sample rates: 16000 Hz: 33" in message
    assert not list((tmp_path / "m").glob("*.jsonl.gz"))  # nothing written
    # with the flags it names, the run writes the 33 utterances without a fault
    args = _prepare_parser().parse_args(["prepare", "librispeech", str(root), str(tmp_path / "m"),
                              "--verify", "--no-progress", "--on-mismatch", "skip",
                              "--empty-text", "skip", "--on-error", "skip"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SkippedInputWarning)
        assert args.func(args) == 0
    rows = list(read_manifest(tmp_path / "m" / "librispeech_samples_dev-clean.jsonl.gz"))
    assert len(rows) == 33


def test_cli_verify_prints_every_fault_and_the_summary_when_it_fails(tmp_path, capsys):
    root = _faulty_libri(tmp_path)
    args = _prepare_parser().parse_args(["prepare", "librispeech", str(root),
                                         str(tmp_path / "m"), "--verify", "--no-progress"])
    assert args.func(args) == 2
    err = capsys.readouterr().err
    for kind in ("transcript without audio: 1", "empty transcript: 1", "truncated audio: 1",
                 "33 utterances"):
        assert kind in err


def test_a_missing_file_in_wav_scp_is_verified_and_can_be_skipped(tmp_path):
    # Issue 32.7: no flag could skip a wav.scp line whose file is absent; --verify stopped
    # at 'audio file not found'.
    soundfile.write(tmp_path / "u1.wav", _tone(1.0, 16000), 16000)
    data = _kaldi_dir(tmp_path, {"u1": str(tmp_path / "u1.wav"),
                                 "u2": str(tmp_path / "gone.wav")}, {"u1": "A", "u2": "B"})
    with pytest.raises(Exception, match=r"audio file not found: .*gone.wav \(prepare --verify "
                                        r"reports every missing file at once"):
        prepare_kaldi_dir(data, tmp_path / "m", progress=False)
    with pytest.raises(DataError, match=r"missing audio: 1 \(e.g. .*gone.wav: file not found\)"
                                        r" -- to leave them out, counted: --on-error skip"):
        prepare_kaldi_dir(data, tmp_path / "m", progress=False, verify=True)
    out = prepare_kaldi_dir(data, tmp_path / "m", progress=False, verify=True, on_error="skip")
    assert [r["key"] for r in read_manifest(out["train"])] == ["u1"]
    assert out.reports["train"].skipped == {"missing audio": 1}


def test_a_missing_recording_of_segments_is_verified_and_can_be_skipped(tmp_path):
    soundfile.write(tmp_path / "r1.wav", _tone(2.0, 16000), 16000)
    data = _kaldi_dir(tmp_path, {"r1": str(tmp_path / "r1.wav"), "r2": str(tmp_path / "x.wav")},
                      {"s1": "A", "s2": "B"})
    (data / "segments").write_text("s1 r1 0.0 1.0\ns2 r2 0.5 1.5\n")
    out = prepare_kaldi_dir(data, tmp_path / "m", progress=False, verify=True, on_error="skip")
    assert [r["key"] for r in read_manifest(out["train"])] == ["s1"]


def test_a_failed_prepare_kaldi_dir_leaves_no_audio_folder_behind(commands, tmp_path):
    data, _ = commands
    with open(data / "wav.scp", "a") as f:
        f.write("u3 false |\n")
    (data / "text").write_text("u1 HELLO\nu2 WORLD\nu3 AGAIN\n")
    with pytest.raises(DataError, match=r"wav.scp:3 \(key 'u3'\)"):
        prepare_kaldi_dir(data, tmp_path / "m", progress=False, allow_commands=True)
    assert not (tmp_path / "m" / "kaldi_dir_audio_train").exists()
