"""speechpipe.recipes (_download, _prepare, _pipelines): download (resume, checksum, sentinel,
safe extraction), prepare helpers, the shared pipelines; speechpipe.cli: the prepare / download
commands.

Downloads run against real HTTP servers on 127.0.0.1: speechpipe.testing.serve_directory
(whose ``/__truncate__/`` path sends half a file and hangs up, and which ignores Range like
http.server does) and a small Range-capable server defined here that records every request.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import http.server
import io
import os
import re
import shutil
import tarfile
import threading
from pathlib import Path

import numpy as np
import pytest
import soundfile

import speechpipe
from speechpipe.cli.download import add_command as add_download_command
from speechpipe.cli.prepare import add_command as add_prepare_command
from speechpipe.diagnostics import SkippedInputWarning
from speechpipe.errors import DataError, MissingDataError
from speechpipe.pipes.sources import read_manifest, write_manifest
from speechpipe.pipes.text import CharTokenizer
from speechpipe.recipes import _download, _pipelines, _prepare
from speechpipe.recipes import (
    RECIPES,
    FrontEnd,
    check_pairs,
    download_and_extract,
    eval_pipeline,
    get_recipe,
    manifest_path,
    manifest_samples,
    parse_checksum,
    pipeline_report,
    prepare_parts,
    resolve_manifests,
    resolve_parts,
    safe_extract,
    semi_supervised_pipeline,
    train_pipeline,
)
from speechpipe.testing import serve_directory
from speechpipe import SampleCount

FIXTURES = Path(__file__).parents[1] / "fixtures"
LIBRISPEECH = FIXTURES / "librispeech" / "LibriSpeech"


# --------------------------------------------------------------------------- helpers


class _RangeHandler(http.server.SimpleHTTPRequestHandler):
    """Serves files and answers ``Range: bytes=N-`` with 206; records (path, Range)."""

    def log_message(self, format, *args):
        pass

    def do_GET(self):
        self.server.requests.append((self.path, self.headers.get("Range")))
        path = self.translate_path(self.path)
        if not os.path.isfile(path):
            self.send_error(404)
            return
        data = Path(path).read_bytes()
        match = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range") or "")
        if match is None:
            self.send_response(200)
            body = data
        else:
            start = int(match.group(1))
            if start >= len(data):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(data)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            body = data[start:]
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def manifest_rows(path) -> list[dict]:
    """A manifest's rows without ``source`` (each row's file:line, which tests do not pin)."""
    rows = list(read_manifest(path))
    for row in rows:
        row.pop("source")
    return rows


@contextlib.contextmanager
def range_server(directory):
    handler = functools.partial(_RangeHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.requests = []
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", server.requests
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _archive(folder: Path, name: str = "dev-clean.tar.gz") -> tuple[Path, str]:
    """A tar.gz of the fixture's LibriSpeech/dev-clean (as the official archive: rooted at
    LibriSpeech/); returns its path and sha256."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    with tarfile.open(path, "w:gz") as tar:
        tar.add(LIBRISPEECH / "dev-clean", arcname="LibriSpeech/dev-clean")
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


def _evil_tar(path: Path, member: tarfile.TarInfo, data: bytes = b"x") -> Path:
    with tarfile.open(path, "w:gz") as tar:
        ok = tarfile.TarInfo("fine.txt")
        ok.size = 2
        tar.addfile(ok, io.BytesIO(b"ok"))
        if member.isfile():
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
        else:
            tar.addfile(member)
    return path


def _fixture_samples(part: str = "dev-clean") -> list[dict]:
    """Manifest samples of a fixture part, built directly from its files."""
    out = []
    for trans in sorted((LIBRISPEECH / part).rglob("*.trans.txt")):
        for line in trans.read_text().splitlines():
            key, text = line.split(" ", 1)
            flac = trans.parent / f"{key}.flac"
            if flac.exists():
                info = soundfile.info(str(flac))
                out.append({"key": key, "audio_path": str(flac), "text": text,
                            "duration": info.frames / info.samplerate, "speaker": key[:4]})
    return out


# --------------------------------------------------------------------------- download


def test_download_verifies_extracts_writes_the_sentinel_and_removes_the_archive(tmp_path):
    archive, sha = _archive(tmp_path / "srv")
    with serve_directory(str(tmp_path / "srv")) as url:
        out = download_and_extract(f"{url}/dev-clean.tar.gz", tmp_path / "data",
                                   checksum=f"sha256:{sha}", progress=False)
    assert out == tmp_path / "data"
    flac = out / "LibriSpeech/dev-clean/2001/200101/2001-200101-0000.flac"
    src = LIBRISPEECH / "dev-clean/2001/200101/2001-200101-0000.flac"
    assert flac.read_bytes() == src.read_bytes()
    assert (out / ".dev-clean.tar.gz.completed").is_file()
    assert not (out / "dev-clean.tar.gz").exists() and not (out / "dev-clean.tar.gz.part").exists()


def test_download_is_idempotent_thanks_to_the_sentinel_and_force_redoes_it(tmp_path):
    _, sha = _archive(tmp_path / "srv")
    with range_server(tmp_path / "srv") as (url, requests):
        for _ in range(2):
            download_and_extract(f"{url}/dev-clean.tar.gz", tmp_path / "data", checksum=sha,
                                 progress=False)
        assert len(requests) == 1  # the second call saw the sentinel and fetched nothing
        (tmp_path / "data/LibriSpeech/dev-clean/2001/200101/2001-200101.trans.txt").unlink()
        download_and_extract(f"{url}/dev-clean.tar.gz", tmp_path / "data", checksum=sha,
                             force=True, progress=False)
        assert len(requests) == 2
    assert (tmp_path / "data/LibriSpeech/dev-clean/2001/200101/2001-200101.trans.txt").is_file()


def test_interrupted_download_keeps_the_part_file_and_resumes_with_a_range_request(tmp_path):
    archive, sha = _archive(tmp_path / "srv")
    size = archive.stat().st_size
    target = tmp_path / "data"
    with serve_directory(str(tmp_path / "srv")) as url:
        with pytest.raises(DataError, match=r"interrupted after \d+ of \d+ bytes.*run again"):
            download_and_extract(f"{url}/__truncate__/dev-clean.tar.gz", target,
                                 checksum=sha, progress=False)
    part = target / "dev-clean.tar.gz.part"
    assert part.stat().st_size == size // 2
    assert not (target / ".dev-clean.tar.gz.completed").exists()
    with range_server(tmp_path / "srv") as (url, requests):
        download_and_extract(f"{url}/dev-clean.tar.gz", target, checksum=sha, progress=False)
    assert requests == [("/dev-clean.tar.gz", f"bytes={size // 2}-")]
    assert (target / "LibriSpeech/dev-clean/2001/200101/2001-200101.trans.txt").is_file()
    assert (target / ".dev-clean.tar.gz.completed").is_file()


def test_a_server_ignoring_range_makes_the_download_start_over(tmp_path):
    _, sha = _archive(tmp_path / "srv")
    target = tmp_path / "data"
    target.mkdir()
    (target / "dev-clean.tar.gz.part").write_bytes(b"garbage that is not a prefix")
    with serve_directory(str(tmp_path / "srv")) as url:  # SimpleHTTPRequestHandler: no Range
        download_and_extract(f"{url}/dev-clean.tar.gz", target, checksum=sha, progress=False)
    assert (target / "LibriSpeech/dev-clean/2001/200101/2001-200101-0001.flac").is_file()


def test_a_complete_part_file_is_finished_on_416(tmp_path):
    archive, sha = _archive(tmp_path / "srv")
    target = tmp_path / "data"
    target.mkdir()
    shutil.copy(archive, target / "dev-clean.tar.gz.part")
    with range_server(tmp_path / "srv") as (url, requests):
        download_and_extract(f"{url}/dev-clean.tar.gz", target, checksum=sha, progress=False)
    assert requests == [("/dev-clean.tar.gz", f"bytes={archive.stat().st_size}-")]
    assert (target / ".dev-clean.tar.gz.completed").is_file()


def test_checksum_mismatch_deletes_the_file_and_names_it_and_both_sums(tmp_path):
    archive, sha = _archive(tmp_path / "srv")
    wrong = "0" * 64
    with serve_directory(str(tmp_path / "srv")) as url:
        with pytest.raises(DataError) as info:
            download_and_extract(f"{url}/dev-clean.tar.gz", tmp_path / "data",
                                 checksum=f"sha256:{wrong}", progress=False)
    message = str(info.value)
    assert str(tmp_path / "data" / "dev-clean.tar.gz") in message
    assert wrong in message and sha in message
    assert list((tmp_path / "data").iterdir()) == []  # archive deleted, nothing extracted


def test_md5_checksums_are_verified_too(tmp_path):
    archive, _ = _archive(tmp_path / "srv")
    md5 = hashlib.md5(archive.read_bytes()).hexdigest()
    with serve_directory(str(tmp_path / "srv")) as url:
        download_and_extract(f"{url}/dev-clean.tar.gz", tmp_path / "a", checksum=f"md5:{md5}",
                             progress=False)
        with pytest.raises(DataError, match="expected md5 f{32}"):
            download_and_extract(f"{url}/dev-clean.tar.gz", tmp_path / "b",
                                 checksum="f" * 32, progress=False)


def test_missing_file_on_the_server_is_a_missing_data_error_naming_the_url(tmp_path):
    with serve_directory(str(tmp_path)) as url:
        with pytest.raises(MissingDataError, match=r"/nope\.tar\.gz: not found.*base-url"):
            download_and_extract(f"{url}/nope.tar.gz", tmp_path / "data", progress=False)


def test_unreachable_server_is_a_data_error_naming_the_url(tmp_path):
    with serve_directory(str(tmp_path)) as url:
        pass  # the port is closed now
    with pytest.raises(DataError, match="cannot reach the server"):
        download_and_extract(f"{url}/a.tar.gz", tmp_path / "data", progress=False)


@pytest.mark.parametrize("checksum", ["sha256:abc", "sha1:" + "0" * 40, "xyz", "0" * 50])
def test_bad_checksum_strings_are_rejected(checksum):
    with pytest.raises(ValueError, match="checksum must be"):
        parse_checksum(checksum)


def test_path_traversal_member_is_rejected_and_nothing_escapes(tmp_path):
    archive = _evil_tar(tmp_path / "evil.tar.gz", tarfile.TarInfo("a/../../escaped.txt"))
    with pytest.raises(DataError) as info:
        safe_extract(archive, tmp_path / "out", progress=False)
    assert "[member a/../../escaped.txt]" in str(info.value) and str(archive) in str(info.value)
    assert not (tmp_path / "escaped.txt").exists()


def test_absolute_member_is_rejected(tmp_path):
    archive = _evil_tar(tmp_path / "evil.tar.gz", tarfile.TarInfo(str(tmp_path / "abs.txt")))
    with pytest.raises(DataError, match="absolute path"):
        safe_extract(archive, tmp_path / "out", progress=False)
    assert not (tmp_path / "abs.txt").exists()


def test_symlink_pointing_outside_is_rejected(tmp_path):
    link = tarfile.TarInfo("data/link")
    link.type = tarfile.SYMTYPE
    link.linkname = "../../outside"
    archive = _evil_tar(tmp_path / "evil.tar.gz", link)
    with pytest.raises(DataError, match=r"\[member data/link\].*link to '../../outside'"):
        safe_extract(archive, tmp_path / "out", progress=False)


def test_device_member_is_rejected(tmp_path):
    dev = tarfile.TarInfo("dev/null")
    dev.type = tarfile.CHRTYPE
    archive = _evil_tar(tmp_path / "evil.tar.gz", dev)
    with pytest.raises(DataError, match="device, fifo"):
        safe_extract(archive, tmp_path / "out", progress=False)


def test_download_of_an_unsafe_archive_writes_no_sentinel(tmp_path):
    (tmp_path / "srv").mkdir()
    _evil_tar(tmp_path / "srv" / "x.tar.gz", tarfile.TarInfo("../x.txt"))
    with serve_directory(str(tmp_path / "srv")) as url:
        with pytest.raises(DataError, match="outside"):
            download_and_extract(f"{url}/x.tar.gz", tmp_path / "data", progress=False)
    assert not (tmp_path / "data" / ".x.tar.gz.completed").exists()
    assert not (tmp_path / "x.txt").exists()


def test_corrupt_archive_is_a_data_error_naming_it(tmp_path):
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(b"\x1f\x8b not really gzip")
    with pytest.raises(DataError, match=r"bad\.tar\.gz: cannot extract"):
        safe_extract(bad, tmp_path / "out", progress=False)


def test_expected_path_missing_from_the_archive_is_named(tmp_path):
    _, sha = _archive(tmp_path / "srv")
    with serve_directory(str(tmp_path / "srv")) as url:
        with pytest.raises(DataError, match="did not create 'LibriSpeech/test-clean'"):
            download_and_extract(f"{url}/dev-clean.tar.gz", tmp_path / "data", checksum=sha,
                                 expected=["LibriSpeech/test-clean"], progress=False)


# --------------------------------------------------------------------------- prepare helpers


def test_manifest_path_follows_the_naming_rule():
    assert manifest_path("/m", "ljspeech", "all") == Path("/m/ljspeech_samples_all.jsonl.gz")


def test_resolve_parts_auto_explicit_unknown_and_missing(tmp_path):
    present = {"b"}.__contains__
    assert resolve_parts("auto", ["a", "b"], present, corpus="c", corpus_dir=tmp_path) == ["b"]
    assert resolve_parts(["b"], ["a", "b"], present, corpus="c", corpus_dir=tmp_path) == ["b"]
    with pytest.raises(ValueError, match=r"unknown c part\(s\) \['z'\]"):
        resolve_parts(["z"], ["a", "b"], present, corpus="c", corpus_dir=tmp_path)
    with pytest.raises(MissingDataError, match=rf"{tmp_path}/a: c part 'a' not found"):
        resolve_parts("a", ["a", "b"], present, corpus="c", corpus_dir=tmp_path)
    with pytest.raises(MissingDataError, match="no c part found"):
        resolve_parts("auto", ["a"], present, corpus="c", corpus_dir=tmp_path)


def test_check_pairs_error_names_counts_and_examples():
    with pytest.raises(DataError) as info:
        check_pairs(["/c/u1.flac"], ["t.txt:3 (key 'u9')", "t.txt:4 (key 'u8')"],
                    on_mismatch="error", stage="prepare_x p", source="/c")
    msg = str(info.value)
    assert msg.startswith("/c: prepare_x p: 1 audio file(s) without a transcript")
    assert "/c/u1.flac" in msg and "2 transcript(s) without audio" in msg
    assert "t.txt:3 (key 'u9')" in msg and "on_mismatch='skip'" in msg


def test_check_pairs_skip_counts_and_warns():
    with pytest.warns(SkippedInputWarning, match=r"audio without transcript: 1"):
        d = check_pairs(["/c/u1.flac"], ["t:3"], on_mismatch="skip", stage="s", source="/c")
    assert d.counts == {"audio without transcript": 1, "transcript without audio": 1}


def test_prepare_parts_reuses_finished_manifests_and_force_rebuilds(tmp_path):
    calls = []

    def make(part):
        calls.append(part)
        return [{"key": f"{part}-u1", "duration": 1.0}]

    first = prepare_parts("toy", ["a", "b"], tmp_path, make)
    before = first["a"].read_bytes()
    again = prepare_parts("toy", ["a", "b"], tmp_path, make)
    assert calls == ["a", "b"] and again == first
    prepare_parts("toy", ["a"], tmp_path, make, force=True)
    assert calls == ["a", "b", "a"] and first["a"].read_bytes() == before
    assert [s["key"] for s in read_manifest(first["b"])] == ["b-u1"]


def test_prepare_parts_without_output_dir_returns_samples():
    assert prepare_parts("toy", ["a"], None, lambda p: [{"key": "u"}]) == {"a": [{"key": "u"}]}


def test_resolve_manifests_accepts_every_documented_form(tmp_path):
    path = manifest_path(tmp_path, "toy", "a")
    write_manifest(path, [{"key": "u1"}])
    assert resolve_manifests(tmp_path, corpus="toy", parts=["a"]) == [str(path)]
    assert resolve_manifests(str(path)) == [str(path)]
    assert resolve_manifests({"a": path, "b": "x"}, parts=["a"]) == [str(path)]
    rows = [{"key": "u"}]
    assert resolve_manifests(rows) == [rows]
    with pytest.raises(MissingDataError, match="run 'speechpipe prepare toy"):
        resolve_manifests(tmp_path, corpus="toy", parts=["b"])
    with pytest.raises(ValueError, match=r"no manifest for part\(s\) \['c'\]"):
        resolve_manifests({"a": path}, parts=["c"])


def test_manifest_samples_reads_files_and_memory_in_order(tmp_path):
    path = tmp_path / "m.jsonl.gz"
    write_manifest(path, [{"key": "f1"}, {"key": "f2"}])
    pipe = manifest_samples([str(path), [{"key": "m1"}]])
    assert [s["key"] for s in pipe] == ["f1", "f2", "m1"]


def test_measure_audio_in_parallel_equals_serial(tmp_path):
    flacs = sorted(str(p) for p in LIBRISPEECH.rglob("*.flac"))
    serial = _prepare.measure_audio(flacs, progress=False)
    assert _prepare.measure_audio(flacs, num_jobs=3, progress=False) == serial
    assert serial[0] == (soundfile.info(flacs[0]).frames, 16000)
    with pytest.raises(MissingDataError, match="nope.flac: audio file not found"):
        _prepare.measure_audio([str(tmp_path / "nope.flac")], progress=False)


# --------------------------------------------------------------------------- pipelines


def test_filter_by_duration_counts_and_warns():
    rows = [{"key": "a", "duration": 0.5}, {"key": "b", "duration": 2.0},
            {"key": "c", "duration": 30.0}]
    pipe = speechpipe.pipes._core._base.IterableWrapper(rows).filter_by_duration(1.0, 20.0)
    with pytest.warns(SkippedInputWarning, match="filter_by_duration skipped 2"):
        kept = [s["key"] for s in pipe]
    assert kept == ["b"]
    assert pipe.diagnostics.examples["longer than 20.0 s"] == ["key 'c' (30.00 s)"]


def test_filter_by_duration_rejects_bad_arguments_and_samples_without_duration():
    wrap = speechpipe.pipes._core._base.IterableWrapper
    with pytest.raises(ValueError, match="min_duration must be seconds >= 0 or None, got -1"):
        wrap([]).filter_by_duration(-1)
    with pytest.raises(ValueError, match="above max_duration"):
        wrap([]).filter_by_duration(5, 1)
    with pytest.raises(DataError, match=r"\(key 'u'\): filter_by_duration: no duration"):
        list(wrap([{"key": "u"}]).filter_by_duration(1))
    with pytest.raises(TypeError, match="no length"):
        len(wrap([]).filter_by_duration(1))


def test_train_pipeline_gives_padded_batches_within_budget_and_counts_the_filter():
    samples = _fixture_samples("dev-clean") + _fixture_samples("test-clean")
    tok = CharTokenizer.build([s["text"] for s in samples])
    pipe = train_pipeline([samples], budget=4.0, tokenizer=tok, min_duration=1.0,
                          max_duration=20.0, seed=3)
    with pytest.warns(SkippedInputWarning, match="shorter than 1.0 s: 1"):
        batches = list(pipe)
    durations = {s["key"]: s["duration"] for s in samples}
    keys = [k for b in batches for k in b["key"]]
    assert sorted(keys) == sorted(k for k, d in durations.items() if d >= 1.0)
    for b in batches:
        n = len(b["key"])
        assert n == 1 or n * max(durations[k] for k in b["key"]) <= 4.0
        assert b["feats"].shape[0] == n and b["feats"].shape[2] == 80
        assert b["feats"].shape[1] == int(b["feats_len"].max())
        assert b["tokens"].shape == (n, int(b["tokens_len"].max()))
        for i, k in enumerate(b["key"]):
            text = tok.decode(b["tokens"][i, : b["tokens_len"][i]].tolist())
            assert text.replace("▁", " ") == b["text"][i]
    assert "shorter than 1.0 s: 1 (e.g. key '2001-200101-0002'" in pipeline_report(pipe)
    assert "padding efficiency" in pipeline_report(pipe)


def test_train_pipeline_is_reproducible_per_seed_and_epoch():
    samples = _fixture_samples("dev-clean") + _fixture_samples("test-clean")
    pipe = train_pipeline([samples], budget=5.0, features=None, seed=1)
    runs = [[b["key"] for b in speechpipe.set_epoch(pipe, e, seed=1)] for e in (0, 0)]
    assert runs[0] == runs[1]


def test_train_pipeline_with_speed_perturbation_updates_durations_and_audio():
    samples = _fixture_samples("dev-clean")
    pipe = train_pipeline([samples], budget=100.0, features=None,
                          speed_perturb=(1.25,), shard=False)
    [batch] = list(pipe)
    by_key = {s["key"]: s for s in samples}
    for i, key in enumerate(batch["key"]):
        frames = round(by_key[key]["duration"] * 16000)
        assert int(batch["audio_len"][i]) == -(-frames * 16000 // 20000)
        assert batch["speed"][i] == 1.25


def test_eval_pipeline_keeps_order_and_every_utterance():
    samples = _fixture_samples("dev-clean") + _fixture_samples("test-clean")
    batches = list(eval_pipeline([samples], budget=SampleCount(2), features=None))
    assert [k for b in batches for k in b["key"]] == [s["key"] for s in samples]
    first, _ = soundfile.read(samples[0]["audio_path"], dtype="float32")
    assert np.array_equal(batches[0]["audio"][0, : len(first)].numpy(), first)
    budgeted = list(eval_pipeline([samples], budget=4.0, features=None))
    assert [k for b in budgeted for k in b["key"]] == [s["key"] for s in samples]


def test_eval_pipeline_takes_one_budget_and_names_a_bad_one():
    with pytest.raises(TypeError, match="budget must be seconds"):
        eval_pipeline([[{"key": "u"}]], budget="16")
    with pytest.raises(TypeError, match="batch_size"):
        eval_pipeline([[{"key": "u"}]], batch_size=2)  # the old spelling is gone


def test_semi_supervised_pipeline_yields_sup_and_unsup_batches():
    sup, unsup = _fixture_samples("dev-clean"), _fixture_samples("test-clean")
    pipe = semi_supervised_pipeline([sup], [unsup], budget=2.5,
                                    unsup_budget=100.0, features=None, seed=0)
    steps = list(pipe)
    assert steps and all(set(step) == {"sup", "unsup"} for step in steps)
    assert sorted(k for s in steps for k in s["sup"]["key"]) == sorted(s["key"] for s in sup)
    assert all(set(s["unsup"]["key"]) == {u["key"] for u in unsup} for s in steps)
    assert pipe.stats.restarts["unsup"] == len(steps) - 1


def test_a_front_end_object_builds_the_same_pipeline_as_its_keywords():
    samples = _fixture_samples("dev-clean")
    tok = CharTokenizer.build([s["text"] for s in samples])
    front = FrontEnd(features="mfcc", feature_options={"num_ceps": 13}, tokenizer=tok)
    by_object = list(train_pipeline([samples], budget=4.0, front_end=front, seed=2))
    by_keywords = list(train_pipeline([samples], budget=4.0, features="mfcc",
                                      feature_options={"num_ceps": 13}, tokenizer=tok, seed=2))
    assert [b["key"] for b in by_object] == [b["key"] for b in by_keywords]
    for a, b in zip(by_object, by_keywords):
        assert a["feats"].shape[2] == 13 and bool((a["feats"] == b["feats"]).all())
        assert bool((a["tokens"] == b["tokens"]).all())
    evaluated = list(eval_pipeline([samples], budget=SampleCount(3),
                                   front_end=FrontEnd(features=None)))
    assert [k for b in evaluated for k in b["key"]] == [s["key"] for s in samples]
    assert FrontEnd(features="mel").feature_kwargs() == {"n_mels": 80}


def test_front_end_and_its_keywords_together_are_a_type_error():
    with pytest.raises(TypeError, match="give front_end or features, tokenizer, not both"):
        train_pipeline([[{"key": "u"}]], front_end=FrontEnd(), features=None, tokenizer=None)
    with pytest.raises(TypeError, match="unexpected keyword argument 'speed_perturb'"):
        eval_pipeline([[{"key": "u"}]], speed_perturb=(0.9, 1.1))
    with pytest.raises(ValueError, match="eval_pipeline perturbs nothing"):
        eval_pipeline([[{"key": "u"}]], front_end=FrontEnd(speed_perturb=(0.9, 1.1)))
    with pytest.raises(TypeError, match="unexpected keyword argument 'featurs'"):
        train_pipeline([[{"key": "u"}]], featurs="fbank")
    with pytest.raises(TypeError, match="front_end must be a FrontEnd"):
        train_pipeline([[{"key": "u"}]], front_end={"features": "fbank"})
    with pytest.raises(ValueError, match="features must be one of"):
        FrontEnd(features="spectrogram")
    with pytest.raises(TypeError, match="give front_end or tokenizer, not both"):
        semi_supervised_pipeline([[{"key": "u"}]], [[{"key": "v"}]], front_end=FrontEnd(),
                                 tokenizer=object())


def test_semi_supervised_pipeline_tokenizes_only_sup_with_a_front_end():
    sup, unsup = _fixture_samples("dev-clean"), _fixture_samples("test-clean")
    tok = CharTokenizer.build([s["text"] for s in sup + unsup])
    pipe = semi_supervised_pipeline([sup], [unsup], budget=2.5,
                                    front_end=FrontEnd(features=None, tokenizer=tok))
    step = next(iter(pipe))
    assert "tokens" in step["sup"] and "tokens" not in step["unsup"]


# --------------------------------------------------------------------------- registry, CLI


def test_registry_lists_recipe_modules_with_the_two_functions():
    for name in RECIPES:
        module = get_recipe(name)
        assert hasattr(module, f"prepare_{name}") and isinstance(module.PARTS, tuple)
    with pytest.raises(ValueError, match="unknown corpus 'nope'"):
        get_recipe("nope")


def _parser():
    parser = argparse.ArgumentParser(prog="speechpipe")
    sub = parser.add_subparsers(dest="command")
    add_prepare_command(sub)
    add_download_command(sub)
    return parser


@pytest.mark.parametrize("command", ["prepare", "download"])
def test_commands_have_help(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        _parser().parse_args([command, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "librispeech" in out and "--parts" in out


def test_prepare_command_forwards_and_prints_each_manifest_with_its_counts(tmp_path, capsys):
    # issue 18.4: prepare printed no counts, and the same line for a fresh write and a rerun
    args = _parser().parse_args(["prepare", "librispeech", str(LIBRISPEECH), str(tmp_path),
                                 "--parts", "dev-clean", "--jobs", "2", "--no-progress"])
    assert args.func(args) == 0
    path = manifest_path(tmp_path, "librispeech", "dev-clean")
    assert capsys.readouterr().out == (f"librispeech dev-clean: written {path}\n"
                                       "  3 utterances, 1 speakers, 0.00 hours (4.6 s)\n"
                                       "  sample rates: 16000 Hz: 3\n")
    assert len(list(read_manifest(path))) == 3
    assert args.func(args) == 0
    assert capsys.readouterr().out.startswith(f"librispeech dev-clean: up to date {path}\n")


def test_prepare_command_reports_errors_with_what_to_do(tmp_path, capsys):
    args = _parser().parse_args(["prepare", "librispeech", str(LIBRISPEECH), str(tmp_path),
                                 "--parts", "test-clean", "--no-progress"])
    assert args.func(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("speechpipe prepare: error: ") and "--on-mismatch skip" in err


def test_download_command_forwards_base_url_and_reports_a_checksum_mismatch(tmp_path, capsys):
    _archive(tmp_path / "srv")
    with serve_directory(str(tmp_path / "srv")) as url:
        args = _parser().parse_args(["download", "librispeech", str(tmp_path / "data"),
                                     "--parts", "dev-clean", "--base-url", url,
                                     "--no-progress"])
        assert args.func(args) == 2
    err = capsys.readouterr().err
    assert "checksum mismatch: expected sha256 76f87d09" in err  # the official sum


def test_download_command_for_a_corpus_without_download(tmp_path, capsys):
    args = _parser().parse_args(["download", "kaldi_dir", str(tmp_path)])
    assert args.func(args) == 2
    assert "the kaldi_dir recipe has no download: a Kaldi data directory is made" in \
        capsys.readouterr().err


def test_recipe_modules_keep_sorted_complete_all_and_the_pipe_naming_rule():
    from speechpipe import stats
    from speechpipe.pipes._core import IterDataPipe

    for module in [speechpipe.recipes, _download, _prepare, _pipelines, stats] + [get_recipe(name) for name in RECIPES]:
        assert list(module.__all__) == sorted(module.__all__), module.__name__
        assert all(hasattr(module, name) for name in module.__all__), module.__name__
    fn = IterDataPipe.functions["filter_by_duration"]
    assert fn.args[0] is speechpipe.pipes.batching.DurationFilterIterDataPipe
    assert re.fullmatch(r"[A-Z]\w*erIterDataPipe", fn.args[0].__name__)


# ------------------------------------------------------------------------------ issue 17


def _every_builder():
    import importlib

    from speechpipe.recipes import RECIPES

    for corpus, module_name in sorted(RECIPES.items()):
        module = importlib.import_module(module_name)
        for name in sorted(module.__all__):
            if name.startswith(corpus) and name.rsplit("_", 1)[-1] in ("train", "valid",
                                                                        "eval", "test"):
                yield corpus, name, getattr(module, name)


@pytest.mark.parametrize("corpus, name, builder", list(_every_builder()),
                         ids=[name for _, name, _ in _every_builder()])
def test_every_recipe_builder_gives_a_pipeline_the_loader_can_resume(corpus, name, builder):
    """build_loader refuses a pipeline it could not resume when it is built: every train,
    valid, eval and test builder of every recipe passes (new-process resume of the shared
    builders: tests/core/test_resume.py::test_a_recipes_loader_resumes_exactly_in_a_new_process)."""
    from speechpipe.loader import build_loader
    from speechpipe.pipes._core import unresumable_reason

    rows = [[{"key": "u1", "audio_path": "u1.flac", "duration": 1.0, "text": "a",
              "normalized_text": "a"}]]
    pipe = builder(rows)  # an in-memory manifest: nothing is read until iteration
    assert unresumable_reason(pipe) is None  # torch's shuffle and batch were here
    assert build_loader(pipe, num_workers=2) is not None


def test_a_part_typo_lists_the_manifests_the_folder_has(tmp_path):
    # Issue 32.12: librispeech_train(out, ["train-clean100"]) repeated the typo in its advice.
    import speechpipe as sp
    from speechpipe.errors import MissingDataError

    sp.recipes.librispeech.prepare_librispeech(sp.DEMO_CORPUS, str(tmp_path / "m"),
                                               progress=False)
    with pytest.raises(MissingDataError, match=r"no librispeech manifest for part "
                                               r"'dev-clean2'; this folder has part\(s\) "
                                               r"\['dev-clean'\]"):
        sp.recipes.librispeech.librispeech_train(str(tmp_path / "m"), ["dev-clean2"])
