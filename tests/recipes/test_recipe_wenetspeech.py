"""The WenetSpeech recipe on a fixture in the official layout (tests/fixtures/wenetspeech/):
WenetSpeech.json (indent=4, as fix_json.py writes it) and long 16 kHz Opus recordings of
synthesized Mandarin; segments of the nested S ⊂ M ⊂ L subsets, DEV, TEST_NET, TEST_MEETING;
one unlisted recording and one listed recording without its file (mismatch reports).

The reference for every manifest is the JSON read with ``json.load``; segments are compared
with slices of the whole decoded recording (seeking into Opus is exact); the download test
encrypts the fixture the way the release is (``tar zcf | openssl enc -aes-256-cbc -salt
-pbkdf2``) and serves it from 127.0.0.1.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import tarfile
from pathlib import Path

import numpy as np
import pytest
import soundfile
from hypothesis import given, settings
from hypothesis import strategies as st
from test_recipes_common import manifest_rows, range_server

from speechpipe.cli import main as cli_main
from speechpipe.diagnostics import SkippedInputWarning
from speechpipe.errors import DataError, MissingDataError
from speechpipe.pipes.sources import read_manifest
from speechpipe.pipes.text import CharTokenizer
from speechpipe.recipes import wenetspeech as ws
from speechpipe.recipes import get_recipe, manifest_path, pipeline_report
from speechpipe.recipes.wenetspeech import (
    PARTS,
    TEXT_NORMALIZER,
    download_wenetspeech,
    iter_audios,
    prepare_wenetspeech,
    read_object_list,
    wenetspeech_test,
    wenetspeech_train,
    wenetspeech_valid,
)
from speechpipe import SampleCount

FIXTURE = Path(__file__).parents[1] / "fixtures" / "wenetspeech" / "WenetSpeech"
MISSING = "X0000000005_fixture0006"  # listed in the JSON, no file
UNLISTED = "audio/test_net/youtube/B00000/Y0000000009_unlisted.opus"


@pytest.fixture
def corpus(tmp_path):
    """A writable copy of the fixture."""
    return Path(shutil.copytree(FIXTURE, tmp_path / "WenetSpeech"))


@pytest.fixture
def manifests(corpus, tmp_path):
    with pytest.warns(SkippedInputWarning):
        return prepare_wenetspeech(corpus, tmp_path / "m", on_mismatch="skip", progress=False)


def _doc(corpus: Path) -> dict:
    return json.loads((corpus / "WenetSpeech.json").read_text(encoding="utf-8"))


def _expected(corpus: Path, part: str) -> list[dict]:
    out = []
    for audio in _doc(corpus)["audios"]:
        if audio["aid"] == MISSING:
            continue
        for seg in audio["segments"]:
            if part in seg["subsets"]:
                out.append({"key": seg["sid"],
                            "audio_path": str((corpus / audio["path"]).resolve()),
                            "offset": seg["begin_time"],
                            "duration": pytest.approx(seg["end_time"] - seg["begin_time"]),
                            "text": seg["text"], "recording": audio["aid"],
                            "origin": audio["source"], "confidence": seg["confidence"]})
    return out


def _write_doc(corpus: Path, doc: dict) -> None:
    (corpus / "WenetSpeech.json").write_text(json.dumps(doc, indent=4, ensure_ascii=False),
                                             encoding="utf-8")


# --------------------------------------------------------------------------- fixture


def test_fixture_is_16_khz_opus_with_segments_inside_their_recordings():
    size = sum(p.stat().st_size for p in FIXTURE.rglob("*") if p.is_file())
    assert size < 200_000
    for audio in _doc(FIXTURE)["audios"]:
        path = FIXTURE / audio["path"]
        if audio["aid"] == MISSING:
            assert not path.exists()
            continue
        info = soundfile.info(str(path))
        assert (info.format, info.subtype, info.samplerate, info.channels) == (
            "OGG", "OPUS", 16000, 1)
        assert info.frames / 16000 == pytest.approx(audio["duration"], abs=0.01)
        assert all(s["end_time"] <= audio["duration"] for s in audio["segments"])


# --------------------------------------------------------------------------- prepare


def test_prepare_writes_every_part_in_one_pass_matching_the_json(manifests, corpus, tmp_path):
    assert manifests == {p: manifest_path(tmp_path / "m", "wenetspeech", p) for p in PARTS}
    for part in PARTS:
        assert manifest_rows(manifests[part]) == _expected(corpus, part), part
    keys = {p: {s["key"] for s in read_manifest(manifests[p])} for p in ("S", "M", "L")}
    assert keys["S"] < keys["M"] < keys["L"]  # nested subsets


def test_segments_read_by_the_pipeline_are_slices_of_the_recording(manifests):
    [batch] = wenetspeech_valid(manifests, budget=SampleCount(8), features=None)
    assert list(batch["key"]) == [s["key"] for s in read_manifest(manifests["DEV"])]
    for row, sample in enumerate(read_manifest(manifests["DEV"])):
        whole, rate = soundfile.read(sample["audio_path"], dtype="float32")
        start = round(sample["offset"] * rate)
        stop = start + round(sample["duration"] * rate)
        n = int(batch["audio_len"][row])
        assert n == stop - start
        assert np.array_equal(batch["audio"][row, :n].numpy(), whole[start:stop])


def test_mismatches_are_an_error_by_default_and_nothing_is_written(corpus, tmp_path):
    with pytest.raises(DataError, match=r"1 audio file\(s\) without a transcript \(e\.g\. "
                       r".*Y0000000009_unlisted\.opus\); 1 transcript\(s\) without audio "
                       rf"\(e\.g\. .*WenetSpeech\.json:\d+ \(key '{MISSING}_S00000'\): no file"):
        prepare_wenetspeech(corpus, tmp_path / "m", progress=False)
    assert not list((tmp_path / "m").iterdir())


def test_skip_policy_counts_both_mismatches(corpus):
    with pytest.warns(SkippedInputWarning) as record:
        out = prepare_wenetspeech(corpus, parts=["TEST_NET", "TEST_MEETING"],
                                  on_mismatch="skip", progress=False)
    report = str(record[0].message)
    assert "audio without transcript: 1" in report and "transcript without audio: 1" in report
    assert [s["key"] for s in out["TEST_MEETING"]] == ["X0000000004_fixture0005_S00000"]


def test_parts_without_mismatches_prepare_cleanly(corpus):
    out = prepare_wenetspeech(corpus, parts=["S", "DEV"], progress=False)
    assert [s["key"] for s in out["S"]] == [s["key"] for s in _expected(corpus, "S")]


def test_a_segment_past_the_end_of_its_recording_is_a_mismatch(corpus):
    doc = _doc(corpus)
    seg = doc["audios"][2]["segments"][1]  # DEV
    seg["end_time"] = doc["audios"][2]["duration"] + 0.5
    _write_doc(corpus, doc)
    with pytest.raises(DataError, match=rf"key '{seg['sid']}'\): ends at .* after the "
                                        "recording's"):
        prepare_wenetspeech(corpus, parts="DEV", progress=False)


def test_auto_parts_are_those_whose_audio_folder_exists(corpus, tmp_path):
    shutil.rmtree(corpus / "audio" / "train")
    shutil.rmtree(corpus / "audio" / "test_meeting")
    shutil.rmtree(corpus / "audio" / "test_net")
    out = prepare_wenetspeech(corpus, tmp_path / "m", progress=False)
    assert list(out) == ["DEV"]
    with pytest.raises(MissingDataError, match="audio/train"):
        prepare_wenetspeech(corpus, tmp_path / "m", parts="S", progress=False)


def test_rerun_reuses_finished_parts_and_force_rebuilds(corpus, tmp_path):
    out = prepare_wenetspeech(corpus, tmp_path / "m", parts="DEV", progress=False)
    before = out["DEV"].read_bytes()
    (corpus / "WenetSpeech.json").write_text("{broken", encoding="utf-8")
    assert prepare_wenetspeech(corpus, tmp_path / "m", parts="DEV", progress=False) == out
    assert out["DEV"].read_bytes() == before
    with pytest.raises(DataError, match="WenetSpeech.json:1"):
        prepare_wenetspeech(corpus, tmp_path / "m", parts="DEV", force=True, progress=False)
    assert out["DEV"].read_bytes() == before  # the failed rebuild left the old manifest


def test_missing_metadata_and_folder_are_named(corpus, tmp_path):
    with pytest.raises(MissingDataError, match="WenetSpeech folder not found"):
        prepare_wenetspeech(tmp_path / "nowhere")
    (corpus / "WenetSpeech.json").unlink()
    with pytest.raises(MissingDataError, match="WenetSpeech.json not found: pass the folder"):
        prepare_wenetspeech(corpus)


def test_a_part_without_segments_is_an_error(corpus):
    doc = _doc(corpus)
    for audio in doc["audios"]:
        for seg in audio["segments"]:
            seg["subsets"] = [s for s in seg["subsets"] if s != "S"]
    _write_doc(corpus, doc)
    with pytest.raises(DataError, match=r"part\(s\) \['S'\]: no segment"):
        prepare_wenetspeech(corpus, parts="S", progress=False)


# --------------------------------------------------------------------------- the JSON stream


def _entry_line(text: str, aid: str) -> int:
    """The line of the '{' opening the entry of ``aid``."""
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if f'"aid": "{aid}"' in line)
    while lines[at].strip() != "{":
        at -= 1
    return at + 1


def test_iter_audios_matches_json_load_with_lines(monkeypatch):
    monkeypatch.setattr(ws, "_CHUNK", 97)  # entries and numbers split across chunks
    text = (FIXTURE / "WenetSpeech.json").read_text(encoding="utf-8")
    got = list(iter_audios(FIXTURE / "WenetSpeech.json"))
    assert [a for _, a in got] == json.loads(text)["audios"]
    assert [line for line, _ in got] == [_entry_line(text, a["aid"]) for _, a in got]


@settings(max_examples=60, deadline=None)
@given(audios=st.lists(st.fixed_dictionaries({
           "aid": st.text(min_size=1, max_size=8),
           "duration": st.floats(0.01, 1e4, allow_nan=False) | st.integers(1, 10**12),
           "segments": st.lists(st.dictionaries(st.text(max_size=5),
                                                st.text(max_size=9) | st.integers()),
                                max_size=3)}), max_size=6),
       indent=st.sampled_from([None, 0, 2, 4]), chunk=st.integers(1, 64),
       before=st.booleans())
def test_iter_audios_property(tmp_path_factory, audios, indent, chunk, before):
    doc = {"version": "x", "audios": audios} if before else {"audios": audios, "z": [1, {}]}
    path = tmp_path_factory.mktemp("j") / "WenetSpeech.json"
    path.write_text(json.dumps(doc, indent=indent, ensure_ascii=False), encoding="utf-8")
    old, ws._CHUNK = ws._CHUNK, chunk
    try:
        assert [a for _, a in iter_audios(path)] == audios
    finally:
        ws._CHUNK = old


@settings(max_examples=80, deadline=None)
@given(data=st.binary(max_size=200))
def test_iter_audios_raises_only_data_errors_on_random_bytes(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("j") / "WenetSpeech.json"
    path.write_bytes(b'{"audios": [' + data)
    try:
        list(iter_audios(path))
    except DataError:
        pass


@pytest.mark.parametrize("text, match", [
    ('{"audios": [{"aid": "a"},\n{"aid": ', r"WenetSpeech.json:2: invalid JSON"),
    ('["audios"]', r"WenetSpeech.json:1: expected a JSON object"),
    ('{"version": 1}', "no 'audios' list"),
    ('{"audios": [{"aid": "a"},\n 3]}', r"WenetSpeech.json:2: an 'audios' element must be an "
                                        "object, got int"),
    ('{"audios": {"aid": "a"}}', r"expected the 'audios' list"),
    ('{"audios": []} {"more": 1}', "unexpected data after the JSON document"),
    ('{"audios": [] "x": 1}', r"expected ',' or '\}'"),
    ('{"audios": [{"aid": "a"} {"aid": "b"}]}', r"expected ',' or '\]'"),
])
def test_malformed_documents_are_named_with_file_and_line(tmp_path, text, match):
    path = tmp_path / "WenetSpeech.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(DataError, match=match):
        list(iter_audios(path))


def test_invalid_utf8_is_named(tmp_path):
    path = tmp_path / "WenetSpeech.json"
    path.write_bytes(b'{"audios": [{"aid": "\xff"}]}')
    with pytest.raises(DataError, match=r"WenetSpeech.json:1: invalid UTF-8"):
        list(iter_audios(path))


def test_a_missing_document_is_named(tmp_path):
    with pytest.raises(MissingDataError, match="WenetSpeech.json not found"):
        list(iter_audios(tmp_path / "WenetSpeech.json"))


def _break(doc: dict, what: str) -> str:
    """Break the DEV recording (doc['audios'][2]) or its first segment; return the key named."""
    audio = doc["audios"][2]
    seg = audio["segments"][0]
    if what == "aid":
        del audio["aid"]
        return ""
    if what in ("path", "duration", "segments"):
        audio[what] = {"path": "/abs/x.opus", "duration": -1, "segments": "none"}[what]
        return audio["aid"]
    if what == "dotdot":
        audio["path"] = "audio/../../x.opus"
        return audio["aid"]
    if what == "repeat":
        audio["segments"][1]["sid"] = seg["sid"]
        return seg["sid"]
    if what == "sid":
        del seg["sid"]
        return audio["aid"]
    seg.update({"times": {"begin_time": 2.0, "end_time": 1.0}, "text": {"text": None},
                "subsets": {"subsets": ["XL"]}}[what])
    return seg["sid"]


@pytest.mark.parametrize("what, match", [
    ("aid", "recording entry without a string 'aid'"),
    ("path", "recording path '/abs/x.opus' is not audio/<folder>/"),
    ("dotdot", "is not audio/<folder>/... inside the corpus"),
    ("duration", "recording 'duration' must be seconds > 0, got -1"),
    ("segments", "recording without a 'segments' list"),
    ("sid", "segment without a string 'sid'"),
    ("repeat", "segment id repeated in its recording"),
    ("times", r"0 <= begin_time < end_time, got 2.0, 1.0"),
    ("text", "segment without a string 'text'"),
    ("subsets", r"segment 'subsets' must be a list of .*got \['XL'\]"),
])
def test_malformed_entries_are_named_with_line_and_key(corpus, what, match):
    doc = _doc(corpus)
    key = _break(doc, what)
    _write_doc(corpus, doc)
    text = (corpus / "WenetSpeech.json").read_text(encoding="utf-8")
    line = _entry_line(text, doc["audios"][2].get("aid", "")) if what != "aid" else None
    where = str(line) if line else r"\d+"
    named = rf"WenetSpeech.json:{where}" + (rf" \(key '{key}'\)" if key else "")
    with pytest.raises(DataError, match=rf"{named}: (.* )?{match}"):
        prepare_wenetspeech(corpus, parts="DEV", progress=False)


# --------------------------------------------------------------------------- pipelines


def test_train_keeps_1_to_15_s_in_budget_batches_with_normalized_text(manifests):
    rows = list(read_manifest(manifests["L"]))
    texts = [TEXT_NORMALIZER(r["text"]) for r in rows]
    tok = CharTokenizer.build(texts, space_symbol=None)
    pipe = wenetspeech_train(manifests, parts=["L"], tokenizer=tok, budget=4.0)
    with pytest.warns(SkippedInputWarning, match="shorter than 1.0 s: 2"):
        batches = list(pipe)
    kept = sorted(r["key"] for r in rows if r["duration"] >= 1.0)
    assert sorted(k for b in batches for k in b["key"]) == kept
    by_key = {r["key"]: r for r in rows}
    for b in batches:
        assert len(b["key"]) * max(by_key[k]["duration"] for k in b["key"]) <= 4.0
        assert b["feats"].shape[0::2] == (len(b["key"]), 80)
        for i, key in enumerate(b["key"]):
            want = tok.encode(TEXT_NORMALIZER(by_key[key]["text"]))
            assert b["tokens"][i, : int(b["tokens_len"][i])].tolist() == want
    assert "filter_by_duration skipped 2 item(s)" in pipeline_report(pipe)
    assert TEXT_NORMALIZER("我们 去 北京") == "我们去北京"
    assert TEXT_NORMALIZER("谢谢\u3000你") == "谢谢你"  # full-width space, as fix_json.py


def test_valid_and_test_keep_every_segment_in_order(manifests, tmp_path):
    valid = list(wenetspeech_valid(tmp_path / "m", budget=SampleCount(1)))
    assert [b["key"][0] for b in valid] == [s["key"] for s in read_manifest(manifests["DEV"])]
    net = list(wenetspeech_test(manifests, features=None))
    meeting = list(wenetspeech_test(manifests, part="TEST_MEETING", features=None))
    assert [list(b["key"]) for b in net] == [["Y0000000003_fixture0004_S00000"]]
    assert [list(b["key"]) for b in meeting] == [["X0000000004_fixture0005_S00000"]]


def test_pack_cuts_the_segments_into_16_bit_flac_shards(manifests, tmp_path):
    from speechpipe.index import ShardIndex
    from speechpipe.pack import pack_data
    from speechpipe.pipes._core import IterableWrapper

    report = pack_data(None, None, tmp_path / "shards", manifests=manifests["L"],
                       audio_format="flac16", progress=False)
    rows = {s["key"]: s for s in read_manifest(manifests["L"])}
    assert report.utterances == len(rows) and report.clipped == 0
    paths = ShardIndex.read(tmp_path / "shards").paths()
    for sample in IterableWrapper(paths).open().read_shards().decode():
        row = rows.pop(sample["key"])
        whole, rate = soundfile.read(row["audio_path"], dtype="float32")
        start = round(row["offset"] * rate)
        cut = whole[start:start + round(row["duration"] * rate)]
        assert np.array_equal(sample["audio"], np.rint(cut * 32768).astype(np.float32) / 32768)
        assert sample["text"] == row["text"]
    assert not rows


# --------------------------------------------------------------------------- download


def _openssl() -> str:
    path = shutil.which("openssl")
    if path is None:
        pytest.skip("openssl is needed to encrypt the release fixture")
    return path


def _release(corpus: Path, server: Path, password: str) -> Path:
    """The fixture as the release is made (``tar zcvf - <item> | openssl enc -e -aes-256-cbc
    -salt -pass pass:P -pbkdf2``, per item: WenetSpeech.json and each audio/<split>/<source>/
    <batch> folder); returns the object list (``<md5> <object>``)."""
    items = ["WenetSpeech.json"] + sorted(
        p.relative_to(corpus).as_posix() for p in (corpus / "audio").glob("*/*/*"))
    lines = ["# md5 object"]
    server.mkdir(parents=True, exist_ok=True)
    for item in items:
        plain = server / "plain.tgz"
        with tarfile.open(plain, "w:gz") as tar:
            tar.add(corpus / item, arcname=item)
        obj = f"{item}.aes.tgz"
        out = server / obj
        out.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([_openssl(), "enc", "-e", "-aes-256-cbc", "-salt", "-pbkdf2",
                        "-pass", f"pass:{password}", "-in", str(plain), "-out", str(out)],
                       check=True, capture_output=True)
        plain.unlink()
        lines.append(f"{hashlib.md5(out.read_bytes()).hexdigest()} {obj}")
    shutil.copy(corpus / "TERMS_OF_ACCESS", server / "TERMS_OF_ACCESS")
    listing = server.parent / "v1.list"
    listing.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return listing


def test_a_wrong_password_that_passes_openssls_padding_check_is_still_named(tmp_path):
    # AES-CBC's padding check passes for about 1 wrong key in 256: openssl then exits 0 with
    # garbage, and the download failed later with "cannot extract" (a CI run met it).
    plain = tmp_path / "plain.tgz"
    with tarfile.open(plain, "w:gz") as tar:
        tar.add(FIXTURE / "TERMS_OF_ACCESS", arcname="TERMS_OF_ACCESS")
    archive = tmp_path / "WenetSpeech.json.aes.tgz"
    subprocess.run([_openssl(), "enc", "-e", "-aes-256-cbc", "-salt", "-pbkdf2", "-pass",
                    "pass:right", "-in", str(plain), "-out", str(archive)],
                   check=True, capture_output=True)
    out = tmp_path / "decrypted"
    for i in range(4000):  # a wrong password openssl accepts (expected after ~256 tries)
        done = subprocess.run([_openssl(), "aes-256-cbc", "-d", "-salt", "-pbkdf2", "-pass",
                               f"pass:wrong{i}", "-in", str(archive), "-out", str(out)],
                              capture_output=True)
        if done.returncode == 0:
            break
    else:
        pytest.skip("no wrong password passed the padding check in 4000 tries")
    with pytest.raises(DataError, match=r"cannot decrypt \(the output is not the gzip archive "
                                        r"it should be\): a wrong password\?"):
        ws._openssl_decrypt(f"wrong{i}")(archive, out)
    ws._openssl_decrypt("right")(archive, out)  # the right one still passes
    assert out.read_bytes() == plain.read_bytes()


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in root.rglob("*") if p.is_file()}


def test_download_decrypts_the_release_then_prepare(tmp_path):
    listing = _release(FIXTURE, tmp_path / "srv", "s3cret")
    with range_server(tmp_path / "srv") as (url, requests):
        corpus = download_wenetspeech(tmp_path / "data", password="s3cret", list_file=listing,
                                      base_url=url, progress=False)
    assert corpus == tmp_path / "data" / "WenetSpeech"
    assert len(requests) == 7  # the terms, the JSON and five batch folders
    assert _tree(corpus) == _tree(FIXTURE)
    leftovers = [p.name for p in (tmp_path / "data" / "download").rglob("*")
                 if p.is_file() and not p.name.endswith(".completed")]
    assert leftovers == []  # archives and their decrypted copies are deleted
    # idempotent: the server is gone, the markers make the call a no-op
    assert download_wenetspeech(tmp_path / "data", password="s3cret", list_file=listing,
                                base_url=url, progress=False) == corpus
    out = prepare_wenetspeech(corpus, parts="DEV", progress=False)
    assert [s["key"] for s in out["DEV"]] == [s["key"] for s in _expected(corpus, "DEV")]


def test_download_of_some_parts_and_a_wrong_password(tmp_path):
    listing = _release(FIXTURE, tmp_path / "srv", "right")
    with range_server(tmp_path / "srv") as (url, requests):
        with pytest.raises(DataError, match=r"WenetSpeech.json.aes.tgz: cannot decrypt .*wrong "
                                            "password"):
            download_wenetspeech(tmp_path / "bad", password="wrong", list_file=listing,
                                 base_url=url, parts="metadata", progress=False)
        assert not (tmp_path / "bad" / "WenetSpeech" / "WenetSpeech.json").exists()
        corpus = download_wenetspeech(tmp_path / "data", password="right", list_file=listing,
                                      base_url=url, parts=["metadata", "dev"], progress=False)
    assert sorted(_tree(corpus)) == ["TERMS_OF_ACCESS", "WenetSpeech.json",
                                     "audio/dev/third_party/B00000/X0000000002_fixture0003.opus"]


def test_download_checks_md5_of_each_object(tmp_path):
    listing = _release(FIXTURE, tmp_path / "srv", "pw")
    text = listing.read_text().replace(listing.read_text().splitlines()[1][:32], "0" * 32)
    listing.write_text(text)
    with range_server(tmp_path / "srv") as (url, _):
        with pytest.raises(DataError, match="checksum mismatch: expected md5 0{32}"):
            download_wenetspeech(tmp_path / "data", password="pw", list_file=listing,
                                 base_url=url, parts="metadata", progress=False)


def test_download_needs_password_list_and_known_parts(tmp_path, monkeypatch):
    monkeypatch.delenv("WENETSPEECH_PASSWORD", raising=False)
    with pytest.raises(ValueError, match="encrypted: pass password="):
        download_wenetspeech(tmp_path, list_file="v1.list")
    with pytest.raises(ValueError, match="pass list_file="):
        download_wenetspeech(tmp_path, password="x")
    with pytest.raises(ValueError, match=r"unknown part\(s\) \['L'\].*all in 'train'"):
        download_wenetspeech(tmp_path, parts="L", password="x", list_file="v1.list")


@pytest.mark.parametrize("line", ["abc WenetSpeech.json.aes.tgz",
                                  "0" * 32 + " ../x.aes.tgz",
                                  "0" * 32 + " WenetSpeech.json",
                                  "z" * 32 + " a.aes.tgz"])
def test_malformed_object_list_lines_are_named(tmp_path, line):
    path = tmp_path / "v1.list"
    path.write_text("# md5 object\n" + line + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"v1.list:2: expected '<md5> <object>.tgz'"):
        read_object_list(path)


# --------------------------------------------------------------------------- CLI


def test_cli_prepare_and_download(corpus, tmp_path, capsys):
    assert get_recipe("wenetspeech") is ws
    assert cli_main(["prepare", "wenetspeech", str(corpus), str(tmp_path / "m"), "--parts",
                     "DEV", "--no-progress"]) == 0
    assert "wenetspeech DEV:" in capsys.readouterr().out
    listing = _release(FIXTURE, tmp_path / "srv", "pw")
    (tmp_path / "password").write_text("pw\n")
    with range_server(tmp_path / "srv") as (url, _):
        assert cli_main(["download", "wenetspeech", str(tmp_path / "data"), "--parts",
                         "metadata", "--base-url", url, "--list", str(listing),
                         "--password-file", str(tmp_path / "password"), "--no-progress"]) == 0
    assert (tmp_path / "data" / "WenetSpeech" / "WenetSpeech.json").is_file()
    assert cli_main(["download", "librispeech", str(tmp_path / "d"), "--password-file",
                     str(tmp_path / "password")]) == 2
    assert "--password-file is not an option of librispeech" in capsys.readouterr().err


def test_iter_audios_memory_does_not_grow_with_the_document(tmp_path, monkeypatch):
    import tracemalloc

    monkeypatch.setattr(ws, "_CHUNK", 1 << 16)
    entry = {"aid": "Y", "duration": 600.0, "path": "audio/train/youtube/B00000/Y.opus",
             "segments": [{"sid": f"Y_S{i:05d}", "begin_time": i * 2.0, "end_time": i * 2.0 + 1,
                           "text": "今天天气很好" * 3, "subsets": ["L"]} for i in range(100)]}
    one = json.dumps(entry, indent=4, ensure_ascii=False)
    peaks = {}
    for count in (150, 600):
        path = tmp_path / f"{count}.json"
        path.write_text('{"audios": [\n' + ",\n".join([one] * count) + "\n]}",
                        encoding="utf-8")
        tracemalloc.start()
        try:
            assert sum(1 for _ in iter_audios(path)) == count
            peaks[count] = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    size = (tmp_path / "600.json").stat().st_size
    assert size > 10_000_000
    assert peaks[600] < 1.25 * peaks[150]  # 4x the document, the same memory
    assert peaks[600] < size / 10  # a few chunks and one entry, not the document
