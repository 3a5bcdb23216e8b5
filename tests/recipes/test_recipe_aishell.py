"""The AISHELL-1 recipe on its fixture (tests/fixtures/aishell): download from a local server
(nested per-speaker tars), prepare (exact manifests, mismatch policies, layout errors, reuse),
pipelines (CJK spaces removed before tokenizing).

The fixture (``data_aishell/`` after extraction): train has S0002 (W0122, W0123 < 1 s) and
S0003 (W0121, W0122); dev has S0724W0121; test has S0764W0121, a WAV without transcript line
(S0764W0122) and a transcript line without WAV (S0764W0123).
"""

from __future__ import annotations

import hashlib
import io
import shutil
import tarfile
from pathlib import Path

import pytest
import soundfile
from test_recipes_common import manifest_rows, range_server

from speechpipe.diagnostics import SkippedInputWarning
from speechpipe.errors import DataError, MissingDataError
from speechpipe.pipes.text import CharTokenizer
from speechpipe.recipes import manifest_path, pipeline_report
from speechpipe.recipes.aishell import (
    ARCHIVES,
    TEXT_NORMALIZER,
    aishell_test,
    aishell_train,
    aishell_valid,
    download_aishell,
    prepare_aishell,
)
from speechpipe import SampleCount

FIXTURE = Path(__file__).parents[1] / "fixtures" / "aishell"
CORPUS = FIXTURE / "data_aishell"
TRANSCRIPT = "transcript/aishell_transcript_v0.8.txt"  # in data_aishell/


@pytest.fixture
def corpus(tmp_path):
    """A writable copy of the fixture's data_aishell folder."""
    return Path(shutil.copytree(CORPUS, tmp_path / "data_aishell"))


def _transcript(corpus: Path) -> dict[str, str]:
    lines = (corpus / TRANSCRIPT).read_text(encoding="utf-8").splitlines()
    return dict(line.split(" ", 1) for line in lines)


def _expected(corpus: Path, part: str) -> list[dict]:
    text = _transcript(corpus)
    rows = []
    for wav in sorted((corpus / "wav" / part).rglob("*.wav")):
        if wav.stem not in text:
            continue
        info = soundfile.info(str(wav))
        rows.append({"audio_path": str(wav.resolve()), "duration": info.frames / info.samplerate,
                     "key": wav.stem, "sample_rate": info.samplerate,
                     "speaker": wav.parent.name, "text": text[wav.stem]})
    return sorted(rows, key=lambda r: r["key"])


def test_fixture_is_16_khz_mono_16_bit_wav_under_300_kb():
    wavs = sorted(CORPUS.rglob("*.wav"))
    assert len(wavs) == 7
    for wav in wavs:
        info = soundfile.info(str(wav))
        assert (info.samplerate, info.channels, info.format, info.subtype) == (
            16000, 1, "WAV", "PCM_16")
    assert sum(p.stat().st_size for p in FIXTURE.rglob("*") if p.is_file()) < 300 * 1024


# --------------------------------------------------------------------------- prepare


def test_prepare_writes_exact_manifests_keeping_spaces_and_folder_speakers(corpus, tmp_path):
    out = prepare_aishell(corpus, tmp_path / "m", parts=["train", "dev"], progress=False)
    assert out == {p: manifest_path(tmp_path / "m", "aishell", p) for p in ("train", "dev")}
    rows = manifest_rows(out["train"])
    assert rows == _expected(corpus, "train")
    assert [(r["key"], r["speaker"]) for r in rows] == [
        ("BAC009S0002W0122", "S0002"), ("BAC009S0002W0123", "S0002"),
        ("BAC009S0003W0121", "S0003"), ("BAC009S0003W0122", "S0003")]
    assert rows[0]["text"] == "今天 天气 很 好"
    assert manifest_rows(out["dev"]) == _expected(corpus, "dev")


def test_prepare_reports_both_mismatches_as_an_error_by_default(corpus, tmp_path):
    with pytest.raises(DataError) as info:
        prepare_aishell(corpus, tmp_path / "m", parts="test", progress=False)
    msg = str(info.value)
    assert "prepare_aishell test: 1 audio file(s) without a transcript" in msg
    assert "S0764/BAC009S0764W0122.wav" in msg
    assert "1 transcript(s) without audio" in msg
    line = list(_transcript(corpus)).index("BAC009S0764W0123") + 1
    assert f"{corpus / TRANSCRIPT}:{line} (key 'BAC009S0764W0123')" in msg
    assert not manifest_path(tmp_path / "m", "aishell", "test").exists()


def test_prepare_skip_policy_leaves_them_out_counted_in_a_warning(corpus, tmp_path):
    with pytest.warns(SkippedInputWarning) as record:
        out = prepare_aishell(corpus, tmp_path / "m", parts="test", on_mismatch="skip",
                              progress=False)
    report = str(record[0].message)
    assert "audio without transcript: 1" in report and "BAC009S0764W0122.wav" in report
    assert "transcript without audio: 1" in report and "'BAC009S0764W0123'" in report
    assert manifest_rows(out["test"]) == _expected(corpus, "test")
    assert [r["key"] for r in manifest_rows(out["test"])] == ["BAC009S0764W0121"]


def test_transcript_lines_of_other_splits_are_not_mismatches(corpus):
    # the transcript covers train, dev and test: dev alone matches exactly
    assert [s["key"] for s in prepare_aishell(corpus, parts="dev", progress=False)["dev"]] == [
        "BAC009S0724W0121"]


def test_auto_parts_are_the_split_folders_present(corpus, tmp_path):
    shutil.rmtree(corpus / "wav" / "dev")
    with pytest.warns(SkippedInputWarning):
        out = prepare_aishell(corpus, tmp_path / "m", on_mismatch="skip", progress=False)
    assert list(out) == ["train", "test"]


def test_missing_transcript_is_named(corpus):
    (corpus / TRANSCRIPT).unlink()
    with pytest.raises(MissingDataError) as info:
        prepare_aishell(corpus, progress=False)
    assert str(info.value).startswith(
        f"{corpus / TRANSCRIPT}: the AISHELL-1 transcript file is missing")


def test_missing_split_folder_is_named(corpus):
    shutil.rmtree(corpus / "wav" / "dev")
    with pytest.raises(MissingDataError) as info:
        prepare_aishell(corpus, parts=["dev"], progress=False)
    assert str(info.value).startswith(f"{corpus / 'wav' / 'dev'}: aishell part 'dev' not found")


def test_a_folder_without_data_aishell_is_named(corpus):
    shutil.rmtree(corpus / "wav")
    with pytest.raises(MissingDataError) as info:
        prepare_aishell(corpus, progress=False)
    assert str(info.value).startswith(f"{corpus / 'data_aishell'}: data_aishell/ not found")


def test_unextracted_speaker_archives_are_named(corpus):
    for part in ("train", "dev", "test"):
        shutil.rmtree(corpus / "wav" / part)
    (corpus / "wav" / "S0002.tar.gz").write_bytes(b"")
    with pytest.raises(MissingDataError, match=r"/wav: the per-speaker archives in wav/ are "
                                               "not extracted"):
        prepare_aishell(corpus, progress=False)


def test_missing_corpus_folder_is_named(tmp_path):
    with pytest.raises(MissingDataError, match="AISHELL-1 folder not found"):
        prepare_aishell(tmp_path / "nope")


def test_malformed_transcript_line_is_named_with_file_and_line(corpus):
    path = corpus / TRANSCRIPT
    n = len(path.read_text(encoding="utf-8").splitlines())
    with open(path, "a", encoding="utf-8") as f:
        f.write("BAC009S0002W0999\n")
    with pytest.raises(DataError, match=rf"{path}:{n + 1}: expected '<key> <value>'"):
        prepare_aishell(corpus, parts="dev", progress=False)


def test_wav_outside_the_layout_is_named(corpus):
    stray = corpus / "wav" / "dev" / "stray.wav"
    shutil.copy(corpus / "wav/dev/S0724/BAC009S0724W0121.wav", stray)
    with pytest.raises(DataError, match=rf"{stray}: WAV file outside the AISHELL-1 layout"):
        prepare_aishell(corpus, parts="dev", progress=False)


def test_rerun_reuses_finished_parts_without_reading_the_corpus(corpus, tmp_path):
    out = prepare_aishell(corpus, tmp_path / "m", parts="dev", progress=False)
    before = out["dev"].read_bytes()
    (corpus / TRANSCRIPT).write_text("garbage line without value\nX\n", encoding="utf-8")
    again = prepare_aishell(corpus, tmp_path / "m", parts="dev", progress=False)
    assert again == out and out["dev"].read_bytes() == before
    with pytest.raises(DataError, match="expected '<key> <value>'"):
        prepare_aishell(corpus, tmp_path / "m", parts="dev", force=True, progress=False)


# --------------------------------------------------------------------------- download


def _tgz(path: Path, members: dict[str, Path | bytes]) -> str:
    with tarfile.open(path, "w:gz") as tar:
        for name, src in members.items():
            if isinstance(src, Path):
                tar.add(src, arcname=name)
            else:
                info = tarfile.TarInfo(name)
                info.size = len(src)
                tar.addfile(info, io.BytesIO(src))
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def _official_archives(srv: Path) -> dict[str, str]:
    """data_aishell.tgz as shipped (wav/<speaker>.tar.gz inside) + resource_aishell.tgz."""
    srv.mkdir()
    inner = srv / "inner"
    inner.mkdir()
    members: dict[str, Path | bytes] = {f"data_aishell/{TRANSCRIPT}": CORPUS / TRANSCRIPT}
    for spk_dir in sorted((CORPUS / "wav").glob("*/*")):
        part, spk = spk_dir.parent.name, spk_dir.name
        _tgz(inner / f"{spk}.tar.gz", {f"{part}/{spk}": spk_dir})
        members[f"data_aishell/wav/{spk}.tar.gz"] = inner / f"{spk}.tar.gz"
    sums = {"data": _tgz(srv / "data_aishell.tgz", members)}
    sums["resource"] = _tgz(srv / "resource_aishell.tgz",
                                    {"resource_aishell": FIXTURE / "resource_aishell"})
    return sums


def test_official_archive_table():
    assert ARCHIVES["data"].name == "data_aishell.tgz"
    assert ARCHIVES["resource"].name == "resource_aishell.tgz"
    assert ARCHIVES["data"].checksum is None and ARCHIVES["resource"].checksum is None


def test_download_extracts_speaker_tars_then_prepare(tmp_path):
    sums = _official_archives(tmp_path / "srv")
    with range_server(tmp_path / "srv") as (url, requests):
        target = download_aishell(tmp_path / "data", base_url=url, checksums=sums,
                                  progress=False)
    assert target == tmp_path / "data"
    corpus = target / "data_aishell"
    assert sorted(p for p, _ in requests) == ["/data_aishell.tgz", "/resource_aishell.tgz"]
    assert not list((corpus / "wav").glob("*.tar.gz"))  # extracted, then deleted
    got = sorted(p.relative_to(corpus).as_posix() for p in corpus.rglob("*.wav"))
    assert got == sorted(p.relative_to(CORPUS).as_posix() for p in CORPUS.rglob("*.wav"))
    assert (corpus / ".completed").is_file()
    assert (tmp_path / "data" / "resource_aishell" / "speaker.info").is_file()
    # idempotent: the server is gone, the sentinels make the call a no-op
    assert download_aishell(tmp_path / "data", base_url=url, progress=False) == target
    out = prepare_aishell(target, tmp_path / "m", parts="train", progress=False)
    assert manifest_rows(out["train"]) == _expected(corpus, "train")


def test_an_unsafe_speaker_tar_is_refused_naming_the_member(tmp_path):
    srv = tmp_path / "srv"
    srv.mkdir()
    _tgz(tmp_path / "S0002.tar.gz", {"../../evil.wav": b"x"})
    _tgz(srv / "data_aishell.tgz", {f"data_aishell/{TRANSCRIPT}": CORPUS / TRANSCRIPT,
                                    "data_aishell/wav/S0002.tar.gz": tmp_path / "S0002.tar.gz"})
    _tgz(srv / "resource_aishell.tgz", {"resource_aishell": FIXTURE / "resource_aishell"})
    with range_server(srv) as (url, _):
        with pytest.raises(DataError, match=r"S0002.tar.gz \[member ../../evil.wav\]: refusing"):
            download_aishell(tmp_path / "data", base_url=url, progress=False)
    assert not (tmp_path / "evil.wav").exists()
    assert not (tmp_path / "data" / "data_aishell" / ".completed").exists()


def test_download_rejects_unknown_parts(tmp_path):
    with pytest.raises(ValueError,
                       match=r"unknown part\(s\) \['train'\].*holds train, dev and test"):
        download_aishell(tmp_path, ["train"])


# --------------------------------------------------------------------------- pipelines


@pytest.fixture
def manifests(corpus, tmp_path):
    with pytest.warns(SkippedInputWarning):
        return prepare_aishell(corpus, tmp_path / "m", on_mismatch="skip", progress=False)


def test_train_keeps_1_to_12_s_padded_batches_within_budget_cjk_spaces_removed(manifests,
                                                                               tmp_path):
    rows = manifest_rows(manifests["train"])
    tok = CharTokenizer.build([TEXT_NORMALIZER(r["text"]) for r in rows])
    assert "▁" not in tok.vocab  # the normalized texts have no space left
    pipe = aishell_train(tmp_path / "m", budget=3.0, tokenizer=tok)
    with pytest.warns(SkippedInputWarning, match="shorter than 1.0 s: 1"):
        batches = list(pipe)
    keys = sorted(k for b in batches for k in b["key"])
    assert keys == sorted(r["key"] for r in rows if 1.0 <= r["duration"] <= 12.0)
    durations = {r["key"]: r["duration"] for r in rows}
    texts = {r["key"]: r["text"] for r in rows}
    for b in batches:
        assert len(b["key"]) * max(durations[k] for k in b["key"]) <= 3.0
        assert tuple(b["feats"].shape[::2]) == (len(b["key"]), 80)
        for i, k in enumerate(b["key"]):
            n = int(b["tokens_len"][i])
            ids = b["tokens"][i, :n].tolist()
            assert 1 not in ids  # no <unk>: the spaces were removed before encoding
            assert tok.decode(ids) == texts[k].replace(" ", "")
    assert "filter_by_duration skipped 1 item(s)" in pipeline_report(pipe)


def test_valid_and_test_keep_every_utterance_in_order(manifests, tmp_path):
    valid = list(aishell_valid(manifests, budget=SampleCount(2), features=None))
    assert [k for b in valid for k in b["key"]] == ["BAC009S0724W0121"]
    test = list(aishell_test(tmp_path / "m", budget=SampleCount(4)))
    assert [list(b["key"]) for b in test] == [["BAC009S0764W0121"]]
    assert test[0]["feats"].shape[2] == 80
