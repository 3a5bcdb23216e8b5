"""The LibriSpeech recipe on its fixture (tests/fixtures/librispeech): download from a local
server, prepare (exact manifests, layout errors, mismatch policies, reuse), pipelines.

The fixture: dev-clean holds 3 utterances (one shorter than 1 s); test-clean holds a FLAC
without transcript line (2002-200201-0002) and a transcript line without FLAC (-0003).
"""

from __future__ import annotations

import hashlib
import shutil
import tarfile
from pathlib import Path

import pytest
import soundfile

from test_recipes_common import manifest_rows

from speechpipe.diagnostics import SkippedInputWarning
from speechpipe.errors import DataError, MissingDataError
from speechpipe.pipes.text import CharTokenizer
from speechpipe.recipes import librispeech, manifest_path, pipeline_report
from speechpipe.recipes.librispeech import (
    ARCHIVES,
    PARTS,
    download_librispeech,
    librispeech_samples,
    librispeech_test,
    librispeech_train,
    librispeech_valid,
    prepare_librispeech,
)
from speechpipe.testing import serve_directory
from speechpipe import SampleCount

FIXTURE = Path(__file__).parents[1] / "fixtures" / "librispeech" / "LibriSpeech"


@pytest.fixture
def corpus(tmp_path):
    """A writable copy of the fixture corpus."""
    return Path(shutil.copytree(FIXTURE, tmp_path / "LibriSpeech"))


def _expected(corpus: Path, part: str) -> list[dict]:
    """Manifest lines computed directly from the files (transcripts with audio only)."""
    rows = []
    for trans in sorted((corpus / part).rglob("*.trans.txt")):
        for line in trans.read_text(encoding="utf-8").splitlines():
            key, text = line.split(" ", 1)
            flac = trans.parent / f"{key}.flac"
            if not flac.exists():
                continue
            info = soundfile.info(str(flac))
            spk, chapter, _ = key.split("-")
            rows.append({"audio_path": str(flac.resolve()), "chapter": chapter,
                         "duration": info.frames / info.samplerate, "key": key,
                         "sample_rate": info.samplerate, "speaker": spk, "text": text})
    return rows


# --------------------------------------------------------------------------- prepare


def test_prepare_writes_exact_manifests_with_soundfile_durations(corpus, tmp_path):
    out = prepare_librispeech(corpus, tmp_path / "m", parts=["dev-clean"], progress=False)
    assert out == {"dev-clean": manifest_path(tmp_path / "m", "librispeech", "dev-clean")}
    rows = manifest_rows(out["dev-clean"])
    assert rows == _expected(corpus, "dev-clean")
    assert [r["key"] for r in rows] == ["2001-200101-0000", "2001-200101-0001",
                                        "2001-200101-0002"]


def test_prepare_reports_both_mismatches_as_an_error_by_default(corpus, tmp_path):
    with pytest.raises(DataError) as info:
        prepare_librispeech(corpus, tmp_path / "m", parts="test-clean", progress=False)
    msg = str(info.value)
    assert "1 audio file(s) without a transcript" in msg
    assert "2002-200201-0002.flac" in msg
    assert "1 transcript(s) without audio" in msg
    assert "2002-200201.trans.txt:3 (key '2002-200201-0003')" in msg
    assert not manifest_path(tmp_path / "m", "librispeech", "test-clean").exists()


def test_prepare_skip_policy_leaves_them_out_counted_in_a_warning(corpus, tmp_path):
    with pytest.warns(SkippedInputWarning) as record:
        out = prepare_librispeech(corpus, tmp_path / "m", parts="test-clean",
                                  on_mismatch="skip", progress=False)
    report = str(record[0].message)
    assert "audio without transcript: 1" in report and "2002-200201-0002.flac" in report
    assert "transcript without audio: 1" in report and "(key '2002-200201-0003')" in report
    assert [r["key"] for r in manifest_rows(out["test-clean"])] == ["2002-200201-0000",
                                                           "2002-200201-0001"]
    assert manifest_rows(out["test-clean"]) == _expected(corpus, "test-clean")


def test_auto_parts_are_the_part_folders_present(corpus, tmp_path):
    with pytest.warns(SkippedInputWarning):
        out = prepare_librispeech(corpus, tmp_path / "m", on_mismatch="skip", progress=False)
    assert list(out) == ["dev-clean", "test-clean"]


def test_missing_part_folder_is_named(corpus, tmp_path):
    with pytest.raises(MissingDataError) as info:
        prepare_librispeech(corpus, tmp_path / "m", parts=["dev-other"], progress=False)
    assert str(info.value).startswith(f"{corpus / 'dev-other'}: librispeech part 'dev-other'")


def test_missing_corpus_folder_is_named(tmp_path):
    with pytest.raises(MissingDataError, match="LibriSpeech folder not found"):
        prepare_librispeech(tmp_path / "nope", tmp_path / "m")


def test_unknown_part_name_is_a_value_error(corpus):
    with pytest.raises(ValueError, match=r"unknown librispeech part\(s\) \['dev'\]"):
        prepare_librispeech(corpus, parts=["dev"])


def test_missing_trans_txt_is_named_and_skip_counts_its_flacs(corpus, tmp_path):
    trans = corpus / "dev-clean/2001/200101/2001-200101.trans.txt"
    trans.unlink()
    with pytest.raises(MissingDataError) as info:
        prepare_librispeech(corpus, tmp_path / "m", parts="dev-clean", progress=False)
    assert str(info.value).startswith(f"{trans}: transcript file missing: 3 FLAC file(s)")
    with pytest.warns(SkippedInputWarning, match="audio without transcript: 3"):
        with pytest.raises(DataError, match="part 'dev-clean': no utterance left"):
            prepare_librispeech(corpus, parts="dev-clean", on_mismatch="skip", progress=False)


def test_empty_transcript_follows_the_one_policy(corpus):
    # issue 18.6: a key-only line is an empty transcript, under empty_text like every recipe
    trans = corpus / "dev-clean/2001/200101/2001-200101.trans.txt"
    lines = trans.read_text().splitlines()
    trans.write_text("\n".join(["2001-200101-0000"] + lines[1:]) + "\n")
    with pytest.raises(DataError, match=r"1 utterance\(s\) with an empty transcript \(e\.g\. "
                                        r"key '2001-200101-0000'.*--empty-text"):
        prepare_librispeech(corpus, parts="dev-clean", progress=False)
    kept = prepare_librispeech(corpus, parts="dev-clean", progress=False, empty_text="keep")
    assert [s["text"] for s in kept["dev-clean"] if s["key"] == "2001-200101-0000"] == [""]
    assert kept.reports["dev-clean"].empty_text_kept == 1
    skipped = prepare_librispeech(corpus, parts="dev-clean", progress=False, empty_text="skip")
    assert "2001-200101-0000" not in [s["key"] for s in skipped["dev-clean"]]
    assert skipped.reports["dev-clean"].skipped == {"empty transcript": 1}


def test_utterance_id_from_another_chapter_is_named(corpus):
    trans = corpus / "dev-clean/2001/200101/2001-200101.trans.txt"
    trans.write_text(trans.read_text() + "2001-999999-0000 HELLO\n")
    with pytest.raises(DataError, match=rf"{trans}:4 \(key '2001-999999-0000'\): utterance id"):
        prepare_librispeech(corpus, parts="dev-clean", progress=False)


def test_flac_outside_the_layout_is_named(corpus):
    stray = corpus / "dev-clean/2001/stray.flac"
    shutil.copy(corpus / "dev-clean/2001/200101/2001-200101-0000.flac", stray)
    with pytest.raises(DataError, match=rf"{stray}: FLAC file outside the LibriSpeech layout"):
        prepare_librispeech(corpus, parts="dev-clean", progress=False)


def test_unreadable_flac_is_named(corpus):
    flac = corpus / "dev-clean/2001/200101/2001-200101-0001.flac"
    flac.write_bytes(b"not a flac")
    with pytest.raises(DataError, match=rf"{flac}: cannot read audio header"):
        prepare_librispeech(corpus, parts="dev-clean", progress=False)


def test_rerun_over_an_unchanged_part_is_up_to_date_and_a_changed_one_is_redone(
        corpus, tmp_path, monkeypatch):
    # issue 18.4: a rerun over a changed corpus used to keep the old manifest silently
    out = prepare_librispeech(corpus, tmp_path / "m", parts="dev-clean", progress=False)
    before = out["dev-clean"].read_bytes()
    with monkeypatch.context() as m:  # a rerun that read the audio again would now fail
        m.setattr(librispeech, "measure_audio", None)
        again = prepare_librispeech(corpus, tmp_path / "m", parts="dev-clean", progress=False)
    assert again == out and out["dev-clean"].read_bytes() == before
    assert again.reports["dev-clean"].status == "up to date"
    for flac in (corpus / "dev-clean").rglob("*.flac"):
        flac.unlink()
    with pytest.raises(DataError, match="3 transcript"):
        prepare_librispeech(corpus, tmp_path / "m", parts="dev-clean", progress=False)


def test_parallel_durations_give_the_same_manifest(corpus, tmp_path):
    one = prepare_librispeech(corpus, tmp_path / "a", parts="dev-clean", progress=False)
    three = prepare_librispeech(corpus, tmp_path / "b", parts="dev-clean", num_jobs=3,
                                progress=False)
    assert one["dev-clean"].read_bytes() == three["dev-clean"].read_bytes()


def test_without_output_dir_the_samples_are_returned(corpus):
    out = prepare_librispeech(corpus, parts="dev-clean", progress=False)
    assert out["dev-clean"] == _expected(corpus, "dev-clean")


def test_manifest_and_direct_reader_agree(corpus):
    samples = prepare_librispeech(corpus, parts="dev-clean", progress=False)["dev-clean"]
    direct = list(librispeech_samples(corpus, "dev-clean"))
    assert [(s["key"], s["text"]) for s in direct] == [(s["key"], s["text"]) for s in samples]
    assert [len(s["audio"]) / 16000 for s in direct] == [s["duration"] for s in samples]


# --------------------------------------------------------------------------- download


def test_official_archive_table():
    assert list(ARCHIVES) == list(PARTS)
    assert ARCHIVES["dev-clean"].name == "dev-clean.tar.gz"
    assert ARCHIVES["dev-clean"].checksum == (
        "sha256:76f87d090650617fca0cac8f88b9416e0ebf80350acb97b343a85fa903728ab3")
    assert ARCHIVES["train-other-500"].creates == "LibriSpeech/train-other-500"


def test_download_from_a_local_mirror_then_prepare(tmp_path):
    srv = tmp_path / "srv"
    srv.mkdir()
    sums = {}
    for part in ("dev-clean", "test-clean"):
        with tarfile.open(srv / f"{part}.tar.gz", "w:gz") as tar:
            tar.add(FIXTURE / part, arcname=f"LibriSpeech/{part}")
        sums[part] = "sha256:" + hashlib.sha256((srv / f"{part}.tar.gz").read_bytes()).hexdigest()
    with serve_directory(str(srv)) as url:
        corpus = download_librispeech(tmp_path / "data", ["dev-clean", "test-clean"],
                                      base_url=url, checksums=sums, progress=False)
    assert corpus == tmp_path / "data" / "LibriSpeech"
    assert (corpus / "dev-clean" / ".completed").is_file()
    assert (corpus / "test-clean" / ".completed").is_file()
    # idempotent: the server is gone, the sentinels make the call a no-op
    assert download_librispeech(tmp_path / "data", ["dev-clean", "test-clean"], base_url=url,
                                checksums=sums, progress=False) == corpus
    out = prepare_librispeech(corpus, tmp_path / "m", parts="dev-clean", progress=False)
    assert [r["key"] for r in manifest_rows(out["dev-clean"])] == [
        "2001-200101-0000", "2001-200101-0001", "2001-200101-0002"]


def test_download_rejects_unknown_parts(tmp_path):
    with pytest.raises(ValueError, match=r"unknown part\(s\) \['dev'\]"):
        download_librispeech(tmp_path, ["dev"])


# --------------------------------------------------------------------------- pipelines


@pytest.fixture
def manifests(corpus, tmp_path):
    with pytest.warns(SkippedInputWarning):
        return prepare_librispeech(corpus, tmp_path / "m", on_mismatch="skip", progress=False)


def test_train_defaults_keep_1_to_20_s_and_count_the_rest(manifests, tmp_path):
    rows = manifest_rows(manifests["dev-clean"]) + manifest_rows(manifests["test-clean"])
    tok = CharTokenizer.build([r["text"] for r in rows])
    pipe = librispeech_train(tmp_path / "m", parts=["dev-clean", "test-clean"],
                             budget=4.5, tokenizer=tok)
    with pytest.warns(SkippedInputWarning, match="shorter than 1.0 s: 1"):
        batches = list(pipe)
    keys = sorted(k for b in batches for k in b["key"])
    assert keys == sorted(r["key"] for r in rows if 1.0 <= r["duration"] <= 20.0)
    assert "2001-200101-0002" not in keys  # 0.87 s
    durations = {r["key"]: r["duration"] for r in rows}
    for b in batches:
        assert len(b["key"]) * max(durations[k] for k in b["key"]) <= 4.5
        assert tuple(b["feats"].shape[::2]) == (len(b["key"]), 80)
        assert b["tokens"].shape[0] == len(b["key"])
    assert "filter_by_duration skipped 1 item(s)" in pipeline_report(pipe)


def test_valid_and_test_keep_every_utterance_in_order(manifests, tmp_path):
    valid = list(librispeech_valid(manifests, parts=["dev-clean"], budget=SampleCount(2),
                                   features=None))
    assert [k for b in valid for k in b["key"]] == [r["key"] for r in
                                                     manifest_rows(manifests["dev-clean"])]
    test = list(librispeech_test(tmp_path / "m", part="test-clean", budget=SampleCount(5)))
    assert [len(b["key"]) for b in test] == [2] and test[0]["feats"].shape[2] == 80


def test_pipeline_for_a_part_not_prepared_says_what_to_run(manifests, tmp_path):
    with pytest.raises(MissingDataError, match="run 'speechpipe prepare librispeech"):
        librispeech_train(tmp_path / "m")  # the train parts were never prepared
