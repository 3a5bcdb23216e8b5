"""The Common Voice recipe on its fixture (tests/fixtures/commonvoice): clip tables read without
quoting (current 13-column and pre-17 10-column headers), durations from clip_durations.tsv or
the MP3 header, mismatch policies, layout errors, reuse, pipelines.

The fixture (``cv-corpus-17.0-2024-03-15/en/``): 4 MP3 clips (48 kHz mono), train.tsv (2 rows),
dev.tsv and test.tsv (1 row each), clip_durations.tsv; sentences hold quotes and semicolons.
"""

from __future__ import annotations

import hashlib
import shutil
import tarfile
from pathlib import Path

import pytest
import soundfile
from test_recipes_common import manifest_rows, range_server

from speechpipe.diagnostics import SkippedInputWarning
from speechpipe.errors import DataError, MissingDataError
from speechpipe.recipes import commonvoice, get_recipe, manifest_path, pipeline_report
from speechpipe.recipes.commonvoice import (
    CLIP_DURATIONS,
    commonvoice_test,
    commonvoice_train,
    commonvoice_valid,
    download_commonvoice,
    prepare_commonvoice,
    read_clip_durations,
    read_clip_table,
)
from speechpipe import SampleCount

FIXTURE = Path(__file__).parents[1] / "fixtures" / "commonvoice" / "cv-corpus-17.0-2024-03-15" / "en"

OLD_HEADER = ("client_id\tpath\tsentence\tup_votes\tdown_votes\tage\tgender\taccent\tlocale\t"
              "segment\n")


@pytest.fixture
def corpus(tmp_path):
    """A writable copy of the fixture's language folder."""
    return Path(shutil.copytree(FIXTURE, tmp_path / "cv-corpus-17.0-2024-03-15" / "en"))


def _rows(corpus: Path, part: str) -> list[list[str]]:
    lines = (corpus / f"{part}.tsv").read_text(encoding="utf-8").splitlines()
    header = lines[0].split("\t")
    return [dict(zip(header, line.split("\t"))) for line in lines[1:]]


def _expected(corpus: Path, part: str, *, from_header: bool) -> list[dict]:
    out = []
    for row in _rows(corpus, part):
        clip = corpus / "clips" / row["path"]
        info = soundfile.info(str(clip))
        sample = {"key": clip.stem, "audio_path": str(clip.resolve()), "text": row["sentence"],
                  "speaker": row["client_id"], "age": row["age"], "gender": row["gender"],
                  "locale": row["locale"]}
        sample["accents" if "accents" in row else "accent"] = row.get("accents", row.get("accent"))
        if from_header:
            sample["duration"] = info.frames / info.samplerate
            sample["sample_rate"] = info.samplerate
        else:
            sample["duration"] = (info.frames * 1000 // info.samplerate) / 1000
        out.append(sample)
    return out


def test_fixture_is_48_khz_mono_mp3_with_quotes_and_semicolons_under_300_kb():
    clips = sorted((FIXTURE / "clips").glob("*.mp3"))
    assert len(clips) == 4
    for clip in clips:
        info = soundfile.info(str(clip))
        assert (info.samplerate, info.channels, info.format) == (48000, 1, "MP3")
    text = (FIXTURE / "train.tsv").read_text(encoding="utf-8")
    assert '"' in text and ";" in text
    assert sum(p.stat().st_size for p in FIXTURE.rglob("*") if p.is_file()) < 300 * 1024


# --------------------------------------------------------------------------- prepare


def test_prepare_uses_clip_durations_and_keeps_sentences_as_written(corpus, tmp_path):
    out = prepare_commonvoice(corpus, tmp_path / "m", progress=False)
    assert out == {p: manifest_path(tmp_path / "m", "commonvoice_en", p)
                   for p in ("train", "dev", "test")}
    rows = manifest_rows(out["train"])
    assert rows == _expected(corpus, "train", from_header=False)
    assert [(r["key"], r["speaker"], r["text"]) for r in rows] == [
        ("common_voice_en_1001", "c1a2", '"Hello," she said; then left.'),
        ("common_voice_en_1002", "c3b4", 'It\'s a "test"; nothing more.')]
    for r in rows:  # whole milliseconds, at most 1 ms below soundfile's duration
        info = soundfile.info(r["audio_path"])
        assert 0 <= info.frames / info.samplerate - r["duration"] < 0.001


def test_without_clip_durations_the_mp3_header_gives_exact_durations(corpus):
    (corpus / CLIP_DURATIONS).unlink()
    samples = prepare_commonvoice(corpus, parts="train", progress=False)["train"]
    assert samples == _expected(corpus, "train", from_header=True)


def test_pre_17_ten_column_header_is_read_by_name(corpus):
    rows = _rows(corpus, "dev")
    lines = [f"{r['client_id']}\t{r['path']}\t{r['sentence']}\t2\t0\tthirties\tfemale\t\ten\t\n"
             for r in rows]
    (corpus / "dev.tsv").write_text(OLD_HEADER + "".join(lines), encoding="utf-8")
    samples = prepare_commonvoice(corpus, parts="dev", progress=False)["dev"]
    assert [(s["key"], s["text"], s["speaker"], s["age"], s["accent"]) for s in samples] == [
        ("common_voice_en_1003", "Rain; wind; snow.", "c1a2", "thirties", "")]


def test_row_without_clip_is_an_error_naming_table_line_and_key(corpus, tmp_path):
    (corpus / "clips" / "common_voice_en_1002.mp3").unlink()
    with pytest.raises(DataError) as info:
        prepare_commonvoice(corpus, tmp_path / "m", parts="train", progress=False)
    msg = str(info.value)
    assert "prepare_commonvoice train: 1 transcript(s) without audio" in msg
    assert f"{corpus / 'train.tsv'}:3 (key 'common_voice_en_1002')" in msg
    assert not manifest_path(tmp_path / "m", "commonvoice", "train").exists()


def test_skip_policy_leaves_rows_without_clip_out_counted_in_a_warning(corpus):
    (corpus / "clips" / "common_voice_en_1002.mp3").unlink()
    with pytest.warns(SkippedInputWarning, match=r"transcript without audio: 1"):
        out = prepare_commonvoice(corpus, parts="train", on_mismatch="skip", progress=False)
    assert [s["key"] for s in out["train"]] == ["common_voice_en_1001"]


def test_clips_of_other_tables_are_not_mismatches(corpus):
    # clips/ holds the clips of every table; dev lists one of the four
    assert [s["key"] for s in prepare_commonvoice(corpus, parts="dev",
                                                  progress=False)["dev"]] == [
        "common_voice_en_1003"]


def test_missing_clips_folder_is_named(corpus):
    shutil.rmtree(corpus / "clips")
    with pytest.raises(MissingDataError) as info:
        prepare_commonvoice(corpus, progress=False)
    assert str(info.value).startswith(f"{corpus / 'clips'}: the clips/ folder is missing")


def test_missing_table_is_named(corpus):
    (corpus / "test.tsv").unlink()
    with pytest.raises(MissingDataError) as info:
        prepare_commonvoice(corpus, parts=["test"], progress=False)
    assert str(info.value).startswith(f"{corpus / 'test.tsv'}: commonvoice part 'test' not found")


def test_missing_language_folder_is_named(tmp_path):
    with pytest.raises(MissingDataError, match="Common Voice language folder not found"):
        prepare_commonvoice(tmp_path / "nope")


def test_row_with_a_wrong_field_count_is_named_with_file_and_line(corpus):
    with open(corpus / "dev.tsv", "a", encoding="utf-8") as f:
        f.write("c9\tcommon_voice_en_9.mp3\tonly three\n")
    with pytest.raises(DataError, match=rf"{corpus / 'dev.tsv'}:3: expected 13 tab-separated"):
        read_clip_table(corpus / "dev.tsv")


def test_header_without_required_columns_is_named(corpus):
    (corpus / "dev.tsv").write_text("id\tfile\ttext\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"dev.tsv:1: header lacks column\(s\) \['client_id', "
                                        r"'path', 'sentence'\]"):
        prepare_commonvoice(corpus, parts="dev", progress=False)


def test_bad_clip_duration_line_is_named(corpus):
    path = corpus / CLIP_DURATIONS
    path.write_text(path.read_text() + "common_voice_en_9.mp3\tlong\n")
    with pytest.raises(DataError, match=rf"{path}:6: bad duration 'long'"):
        read_clip_durations(path)


def test_rerun_over_an_unchanged_part_is_up_to_date_and_a_changed_one_is_redone(
        corpus, tmp_path, monkeypatch):
    out = prepare_commonvoice(corpus, tmp_path / "m", parts="dev", progress=False)
    before = out["dev"].read_bytes()
    with monkeypatch.context() as m:  # a rerun that read the audio again would now fail
        m.setattr(commonvoice, "measure_audio", None)
        again = prepare_commonvoice(corpus, tmp_path / "m", parts="dev", progress=False)
    assert again == out and out["dev"].read_bytes() == before
    shutil.rmtree(corpus / "clips")
    (corpus / "clips").mkdir()
    with pytest.raises(DataError, match="1 transcript"):
        prepare_commonvoice(corpus, tmp_path / "m", parts="dev", progress=False)


def test_a_rounded_up_clip_duration_reads_the_whole_clip(corpus, tmp_path):
    table = corpus / CLIP_DURATIONS
    table.write_text(table.read_text().replace("\t2285", "\t2400"))  # dev clip, 2.285 s
    manifests = prepare_commonvoice(corpus, tmp_path / "m", parts="dev", progress=False)
    assert manifest_rows(manifests["dev"])[0]["duration"] == 2.4
    [batch] = commonvoice_valid(manifests, features=None, sample_rate=None)
    info = soundfile.info(str(corpus / "clips" / "common_voice_en_1003.mp3"))
    assert int(batch["audio_len"][0]) == info.frames
    assert float(batch["duration"][0]) == pytest.approx(info.frames / info.samplerate)


def test_languages_prepared_into_one_folder_stay_apart(corpus, tmp_path):
    french = Path(shutil.copytree(corpus, corpus.parent / "fr"))
    prepare_commonvoice(corpus, tmp_path / "m", parts="test", progress=False)
    prepare_commonvoice(french, tmp_path / "m", parts="test", progress=False)
    names = sorted(p.name for p in (tmp_path / "m").iterdir())
    assert names == ["commonvoice_en_samples_test.jsonl.gz",
                     "commonvoice_en_samples_test.jsonl.gz.spmap",
                     "commonvoice_en_samples_test.prepared.json",
                     "commonvoice_fr_samples_test.jsonl.gz",
                     "commonvoice_fr_samples_test.jsonl.gz.spmap",
                     "commonvoice_fr_samples_test.prepared.json"]
    with pytest.raises(MissingDataError, match=r"manifests of \['en', 'fr'\].*language="):
        commonvoice_test(tmp_path / "m")
    [batch] = commonvoice_test(tmp_path / "m", language="fr", features=None)
    assert batch["audio_path"][0].startswith(str(french.resolve()))
    with pytest.raises(MissingDataError, match="holds no Common Voice manifest"):
        commonvoice_test(tmp_path / "m", part="train")


def _release_archive(folder: Path) -> tuple[Path, str]:
    """The fixture as Mozilla ships a language: cv-corpus-<version>-<lang>.tar.gz holding
    cv-corpus-<version>/<lang>/...; returns its path and sha256."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "cv-corpus-17.0-2024-03-15-en.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        tar.add(FIXTURE, arcname="cv-corpus-17.0-2024-03-15/en")
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


def test_download_from_the_release_link_then_prepare(tmp_path):
    archive, digest = _release_archive(tmp_path / "srv")
    with range_server(tmp_path / "srv") as (url, requests):
        folder = download_commonvoice(tmp_path / "data", url=f"{url}/{archive.name}?sig=x",
                                      checksum=f"sha256:{digest}", progress=False)
        assert folder == tmp_path / "data" / "cv-corpus-17.0-2024-03-15" / "en"
        again = download_commonvoice(tmp_path / "data", url=f"{url}/{archive.name}",
                                     checksum=digest, progress=False)
    assert again == folder and len(requests) == 1  # the second call is a no-op
    assert sorted(p.name for p in (folder / "clips").iterdir()) == sorted(
        p.name for p in (FIXTURE / "clips").iterdir())
    assert not (tmp_path / "data" / archive.name).exists()
    out = prepare_commonvoice(folder, parts="dev", progress=False)
    assert [s["key"] for s in out["dev"]] == ["common_voice_en_1003"]


def test_download_checks_the_sha256_and_the_archive_name(tmp_path):
    archive, _ = _release_archive(tmp_path / "srv")
    with range_server(tmp_path / "srv") as (url, _):
        with pytest.raises(DataError, match="checksum mismatch: expected sha256 0{64}"):
            download_commonvoice(tmp_path / "data", url=f"{url}/{archive.name}",
                                 checksum="0" * 64, progress=False)
    with pytest.raises(ValueError, match="pass url="):
        download_commonvoice(tmp_path)
    with pytest.raises(ValueError, match="'en.zip' is not a Common Voice release archive"):
        download_commonvoice(tmp_path, url="http://127.0.0.1:9/en.zip")
    with pytest.raises(ValueError, match="no parts"):
        download_commonvoice(tmp_path, "train", url="http://127.0.0.1:9/x.tar.gz")


def test_cli_download_with_url_and_checksum(tmp_path, capsys):
    from speechpipe.cli import main as cli_main

    assert get_recipe("commonvoice").download_commonvoice is download_commonvoice
    archive, digest = _release_archive(tmp_path / "srv")
    with range_server(tmp_path / "srv") as (url, _):
        assert cli_main(["download", "commonvoice", str(tmp_path / "data"), "--url",
                         f"{url}/{archive.name}", "--checksum", digest, "--no-progress"]) == 0
    assert "cv-corpus-17.0-2024-03-15/en" in capsys.readouterr().out
    assert cli_main(["download", "librispeech", str(tmp_path / "d"), "--url", "http://x/y"]) == 2
    assert "--url is not an option of librispeech" in capsys.readouterr().err


# --------------------------------------------------------------------------- pipelines


def test_train_gives_padded_batches_within_budget_and_valid_test_keep_order(corpus, tmp_path):
    manifests = prepare_commonvoice(corpus, tmp_path / "m", progress=False)
    rows = manifest_rows(manifests["train"])
    pipe = commonvoice_train(tmp_path / "m", budget=6.0, max_duration=2.5)
    with pytest.warns(SkippedInputWarning, match="longer than 2.5 s: 1"):
        batches = list(pipe)
    durations = {r["key"]: r["duration"] for r in rows}
    assert sorted(k for b in batches for k in b["key"]) == ["common_voice_en_1002"]
    for b in batches:
        assert len(b["key"]) * max(durations[k] for k in b["key"]) <= 6.0
        assert tuple(b["feats"].shape[::2]) == (len(b["key"]), 80)
    assert "filter_by_duration skipped 1 item(s)" in pipeline_report(pipe)
    full = list(commonvoice_train(manifests, budget=6.0, features=None))
    assert sorted(k for b in full for k in b["key"]) == [r["key"] for r in rows]  # 1-15 s
    valid = list(commonvoice_valid(manifests, budget=SampleCount(2), features=None))
    assert [list(b["key"]) for b in valid] == [["common_voice_en_1003"]]
    test = list(commonvoice_test(tmp_path / "m", budget=SampleCount(2)))
    assert [list(b["key"]) for b in test] == [["common_voice_en_1004"]]
