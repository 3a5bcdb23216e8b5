"""The LJSpeech recipe on its fixture (tests/fixtures/ljspeech): metadata.csv parsing without
quoting, exact manifests, mismatch policies, layout errors, download, TTS pipelines."""

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
from speechpipe.recipes import ljspeech, manifest_path
from speechpipe.recipes.ljspeech import (
    ARCHIVES,
    MEL_OPTIONS,
    download_ljspeech,
    ljspeech_eval,
    ljspeech_train,
    parse_metadata_line,
    prepare_ljspeech,
)
from speechpipe.testing import serve_directory
from speechpipe import SampleCount

FIXTURE = Path(__file__).parents[1] / "fixtures" / "ljspeech" / "LJSpeech-1.1"


@pytest.fixture
def corpus(tmp_path):
    return Path(shutil.copytree(FIXTURE, tmp_path / "LJSpeech-1.1"))


def _expected(corpus: Path) -> list[dict]:
    rows = []
    for line in (corpus / "metadata.csv").read_text(encoding="utf-8").splitlines():
        key, text, normalized = line.split("|")
        wav = corpus / "wavs" / f"{key}.wav"
        info = soundfile.info(str(wav))
        rows.append({"audio_path": str(wav.resolve()), "duration": info.frames / info.samplerate,
                     "key": key, "normalized_text": normalized, "sample_rate": info.samplerate,
                     "speaker": "LJ", "text": text})
    return rows


def test_fixture_is_22050_hz_mono_16_bit_with_quotes_and_semicolons():
    for wav in sorted((FIXTURE / "wavs").glob("*.wav")):
        info = soundfile.info(str(wav))
        assert (info.samplerate, info.channels, info.subtype) == (22050, 1, "PCM_16")
    text = (FIXTURE / "metadata.csv").read_text(encoding="utf-8")
    assert '"' in text and ";" in text


def test_prepare_writes_exact_manifest_keeping_quotes_and_both_texts(corpus, tmp_path):
    out = prepare_ljspeech(corpus, tmp_path / "m", progress=False)
    assert out == {"all": manifest_path(tmp_path / "m", "ljspeech", "all")}
    rows = manifest_rows(out["all"])
    assert rows == _expected(corpus)
    assert rows[0]["text"] == '"Printing," he said; "is an art."'
    assert rows[1]["text"] == "Mr. Smith came in 1850."
    assert rows[1]["normalized_text"] == "Mister Smith came in eighteen fifty."


def test_parse_metadata_line_needs_three_fields():
    with pytest.raises(DataError, match=r"^metadata.csv:5: expected 3 '\|'-separated fields"):
        parse_metadata_line("LJ001-0005|only two", source="metadata.csv", line=5)
    with pytest.raises(DataError, match="metadata.csv:2: bad utterance id ''"):
        parse_metadata_line("|a|b", source="metadata.csv", line=2)


def test_malformed_metadata_line_is_named_with_file_and_line(corpus):
    meta = corpus / "metadata.csv"
    meta.write_text(meta.read_text() + "LJ001-0005|a|b|c\n")
    with pytest.raises(DataError, match=rf"{meta}:5: expected 3 '\|'-separated fields"):
        prepare_ljspeech(corpus, progress=False)


def test_duplicate_id_names_both_lines(corpus):
    meta = corpus / "metadata.csv"
    meta.write_text(meta.read_text() + "LJ001-0002|again|again\n")
    with pytest.raises(DataError, match=rf"{meta}:5 \(key 'LJ001-0002'\): duplicate id "
                                        r"\(first on line 2\)"):
        prepare_ljspeech(corpus, progress=False)


def test_invalid_utf8_line_is_named(corpus):
    meta = corpus / "metadata.csv"
    meta.write_bytes(meta.read_bytes() + b"LJ001-0005|caf\xe9|cafe\n")
    with pytest.raises(DataError, match=rf"{meta}:5: not valid UTF-8"):
        prepare_ljspeech(corpus, progress=False)


def test_missing_wav_and_wav_without_line_under_both_policies(corpus, tmp_path):
    (corpus / "wavs" / "LJ001-0003.wav").unlink()
    shutil.copy(corpus / "wavs" / "LJ001-0004.wav", corpus / "wavs" / "LJ009-0009.wav")
    with pytest.raises(DataError) as info:
        prepare_ljspeech(corpus, tmp_path / "m", progress=False)
    msg = str(info.value)
    assert "1 audio file(s) without a transcript (e.g. " in msg and "LJ009-0009.wav" in msg
    assert f"{corpus / 'metadata.csv'}:3 (key 'LJ001-0003')" in msg
    with pytest.warns(SkippedInputWarning, match="transcript without audio: 1"):
        out = prepare_ljspeech(corpus, tmp_path / "m", on_mismatch="skip", progress=False)
    assert [r["key"] for r in manifest_rows(out["all"])] == ["LJ001-0001", "LJ001-0002", "LJ001-0004"]


def test_missing_metadata_and_missing_wavs_folder_are_named(corpus):
    shutil.rmtree(corpus / "wavs")
    with pytest.raises(MissingDataError, match=rf"{corpus / 'wavs'}: the wavs/ folder is "
                                               "missing"):
        prepare_ljspeech(corpus, progress=False)
    (corpus / "metadata.csv").unlink()
    with pytest.raises(MissingDataError, match=rf"{corpus / 'metadata.csv'}"):
        prepare_ljspeech(corpus, progress=False)


def test_rerun_reuses_an_up_to_date_manifest_and_redoes_a_changed_one(corpus, tmp_path,
                                                                      monkeypatch):
    out = prepare_ljspeech(corpus, tmp_path / "m", progress=False)
    with monkeypatch.context() as m:  # a rerun that read the audio again would now fail
        m.setattr(ljspeech, "measure_audio", None)
        assert prepare_ljspeech(corpus, tmp_path / "m", progress=False) == out
    shutil.rmtree(corpus / "wavs")
    with pytest.raises(MissingDataError, match="wavs"):
        prepare_ljspeech(corpus, tmp_path / "m", progress=False)


def test_download_bz2_archive_from_a_local_mirror(tmp_path):
    srv = tmp_path / "srv"
    srv.mkdir()
    archive = srv / ARCHIVES["all"].name
    with tarfile.open(archive, "w:bz2") as tar:
        tar.add(FIXTURE, arcname="LJSpeech-1.1")
    sha = hashlib.sha256(archive.read_bytes()).hexdigest()
    with serve_directory(str(srv)) as url:
        corpus = download_ljspeech(tmp_path / "data", base_url=url, checksums={"all": sha},
                                   progress=False)
    assert corpus == tmp_path / "data" / "LJSpeech-1.1" and (corpus / ".completed").is_file()
    samples = prepare_ljspeech(corpus, progress=False)["all"]
    assert [s["key"] for s in samples] == ["LJ001-0001", "LJ001-0002", "LJ001-0003",
                                           "LJ001-0004"]


def test_train_pipeline_keeps_all_and_gives_mel_batches_with_normalized_tokens(corpus,
                                                                               tmp_path):
    out = prepare_ljspeech(corpus, tmp_path / "m", progress=False)
    rows = manifest_rows(out["all"])
    tok = CharTokenizer.build([r["normalized_text"] for r in rows])
    batches = list(ljspeech_train(out, budget=7.0, tokenizer=tok, seed=0))
    assert sorted(k for b in batches for k in b["key"]) == [r["key"] for r in rows]
    by_key = {r["key"]: r for r in rows}
    for b in batches:
        assert b["feats"].shape[2] == MEL_OPTIONS["n_mels"]
        for i, key in enumerate(b["key"]):
            frames = 1 + round(by_key[key]["duration"] * 22050) // MEL_OPTIONS["hop_length"]
            assert int(b["feats_len"][i]) == frames  # centered STFT, hop 256
            ids = b["tokens"][i, : b["tokens_len"][i]].tolist()
            assert tok.decode(ids).replace("▁", " ") == by_key[key]["normalized_text"]


def test_eval_pipeline_keeps_metadata_order(corpus, tmp_path):
    out = prepare_ljspeech(corpus, tmp_path / "m", progress=False)
    batches = list(ljspeech_eval(tmp_path / "m", budget=SampleCount(3), features=None))
    assert [k for b in batches for k in b["key"]] == [r["key"] for r in manifest_rows(out["all"])]
    assert int(batches[0]["sample_rate"][0]) == 22050
