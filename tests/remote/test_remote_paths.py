"""Paths inside data that are object-storage URLs (issue 22): audio named by a manifest, and
Kaldi tables and arks kept in a bucket.

A real S3-compatible server (moto's server mode, speechpipe.testing.serve_s3) runs on
127.0.0.1 for this module; real FLAC files, a JSON-lines manifest and a Kaldi data directory
(tables and an ark written by kaldiio) are uploaded to it with boto3.

Invariants:
- a manifest in the bucket whose ``audio_path`` values are in the bucket trains through
  ``train_pipeline(remote=...)`` (and evaluates through ``eval_pipeline``) to the batches the
  local copy gives; noise sources named by URLs load as the local ones; a segment
  (offset/duration) of a remote file is the local segment;
- a missing audio object raises MissingDataError naming its URL and the key, or is skipped
  and counted under ``on_error="skip"``; a 503 on an audio object is retried, and one that
  lasts raises a DataError naming the URL and the key (through a FaultProxy);
- Kaldi tables (``text``, ``wav.scp``, ``feats.scp``) at URLs parse to the local entries, and
  the arks a remote ``feats.scp`` names stream (``kaldi_arks`` + ``read_shard(format="ark")``)
  to the local matrices; ``load_scp``'s random access refuses a remote ark or audio file with
  an error naming the URL and the table line, never trying it as a local path.
"""

from __future__ import annotations

import os

import kaldiio
import numpy as np
import pytest
import soundfile
import torch

import speechpipe as sp
from speechpipe.errors import DataError, MissingDataError
from speechpipe.pipes._core import IterableWrapper
from speechpipe.pipes.kaldi import load_scp_entries, read_scp_table
from speechpipe.pipes.kaldi import kaldi_arks
from speechpipe.pipes.sources import write_manifest
from speechpipe.pipes.order import read_shard
from speechpipe.pipes.shards import ShardReadOptions
from speechpipe.recipes import augment_source
from speechpipe.remote import RemoteOptions
from speechpipe.testing import (S3_TEST_CREDENTIALS, FaultProxy, s3_test_storage, serve_s3,
                                upload_folder)

pytest.importorskip("moto")
pytest.importorskip("s3fs")

RATE = 16000
SECONDS = [0.3, 0.5, 0.2, 0.4, 0.6, 0.25]
BUCKET = "speechpipe-paths"


def write_audio(folder: str) -> list[dict]:
    """FLAC files of noise and the manifest rows naming them (local absolute paths)."""
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(0)
    rows = []
    for i, seconds in enumerate(SECONDS):
        path = os.path.join(folder, f"u{i}.flac")
        soundfile.write(path, rng.uniform(-0.5, 0.5, int(seconds * RATE)).astype(np.float32),
                        RATE)
        rows.append({"key": f"u{i}", "audio_path": path, "duration": seconds,
                     "text": f"utterance {i}"})
    return rows


def write_kaldi_dir(folder: str, url: str) -> None:
    """A Kaldi data dir whose feats.scp and wav.scp values are URLs under ``url``."""
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(1)
    feats = {f"u{i}": rng.standard_normal((5 + i, 4)).astype(np.float32) for i in range(4)}
    ark = os.path.join(folder, "raw.ark")
    with kaldiio.WriteHelper(f"ark,scp:{ark},{folder}/local.scp") as writer:
        for key, matrix in feats.items():
            writer(key, matrix)
    with open(os.path.join(folder, "local.scp")) as f:
        lines = [line.replace(ark, f"{url}/raw.ark") for line in f]
    with open(os.path.join(folder, "feats.scp"), "w") as f:
        f.writelines(lines)
    with open(os.path.join(folder, "text"), "w", encoding="utf-8") as f:
        f.writelines(f"u{i} HELLO {i}\n" for i in range(4))
    with open(os.path.join(folder, "wav.scp"), "w") as f:
        f.writelines(f"u{i} {url}/u{i}.flac\n" for i in range(4))


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    audio = str(tmp_path_factory.mktemp("audio"))
    rows = write_audio(audio)
    local_manifest = os.path.join(audio, "samples.jsonl.gz")
    with serve_s3() as endpoint:
        folder = f"s3://{BUCKET}/audio"
        remote_rows = [dict(r, audio_path=f"{folder}/{os.path.basename(r['audio_path'])}")
                       for r in rows]
        write_manifest(local_manifest, rows)
        remote_dir = str(tmp_path_factory.mktemp("remote_manifest"))
        write_manifest(os.path.join(remote_dir, "samples.jsonl.gz"), remote_rows)
        upload_folder(endpoint, audio, BUCKET, "audio")
        upload_folder(endpoint, remote_dir, BUCKET, "manifests")
        kaldi = str(tmp_path_factory.mktemp("kaldi"))
        write_kaldi_dir(kaldi, f"s3://{BUCKET}/kaldi")
        upload_folder(endpoint, kaldi, BUCKET, "kaldi")
        options = RemoteOptions(storage_options={"endpoint_url": endpoint,
                                                 **S3_TEST_CREDENTIALS},
                                block_size=1 << 14, retries=2, backoff=0.01)
        with FaultProxy(endpoint) as proxy:  # botocore's own retries off: ours are counted
            proxied = RemoteOptions(
                storage_options=s3_test_storage(proxy.url),
                retries=3, backoff=0.01)
            yield {"local_manifest": local_manifest, "rows": rows, "remote_rows": remote_rows,
                   "remote_manifest": f"s3://{BUCKET}/manifests/samples.jsonl.gz",
                   "kaldi": kaldi, "kaldi_url": f"s3://{BUCKET}/kaldi", "options": options,
                   "proxy": proxy, "proxied": proxied}


def same_batches(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b) > 0
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for name, value in x.items():
            if name in ("audio_path", "source"):
                continue
            if isinstance(value, torch.Tensor):
                assert torch.equal(value, y[name]), name
            else:
                assert value == y[name], name


# --------------------------------------------------------------------------- audio


def test_a_remote_manifest_of_remote_audio_trains_to_the_local_batches(s3):
    options = dict(budget=1.2, sample_rate=None, features="fbank", bucket_buffer=4)
    remote_pipe = sp.train_pipeline(s3["remote_manifest"], remote=s3["options"], **options)
    # the default (streams="auto") takes the streaming road for object storage, and says so
    assert "cannot take object-storage manifests" in sp.pipeline_report(remote_pipe)
    local = list(sp.train_pipeline(s3["local_manifest"], streams=None, **options))  # that road
    remote = list(remote_pipe)
    same_batches(local, remote)
    assert sorted(k for b in remote for k in b["key"]) == [r["key"] for r in s3["rows"]]
    assert all(p.startswith("s3://") for b in remote for p in b["audio_path"])


def test_eval_pipeline_reads_remote_audio_in_manifest_order(s3):
    local = list(sp.eval_pipeline(s3["rows"], budget=sp.SampleCount(4), features=None,
                                  sample_rate=None))
    remote = list(sp.eval_pipeline([s3["remote_rows"]], budget=sp.SampleCount(4), features=None,
                                   sample_rate=None, remote=s3["options"]))
    same_batches(local, remote)


def test_noise_named_by_remote_paths_loads_as_the_local_noise(s3):
    local = {s["key"]: s["audio"] for s in augment_source([s3["rows"]])}
    remote = {s["key"]: s["audio"]
              for s in augment_source([s3["remote_rows"]], remote=s3["options"])}
    assert remote.keys() == local.keys() and len(remote) == len(SECONDS)
    for key, audio in remote.items():
        np.testing.assert_array_equal(audio, local[key])


def test_a_segment_of_a_remote_file_under_a_url_root_is_the_local_segment(s3):
    row = {"key": "u4", "audio_path": "u4.flac", "offset": 0.1, "duration": 0.3}
    kwargs = dict(offset_field="offset", duration_field="duration")
    [local] = IterableWrapper([row]).load_audio(
        root=os.path.dirname(s3["rows"][0]["audio_path"]), **kwargs)
    [remote] = IterableWrapper([row]).load_audio(
        root=f"s3://{BUCKET}/audio/", remote=s3["options"], **kwargs)
    assert remote["audio"].shape == (int(0.3 * RATE),)
    np.testing.assert_array_equal(remote["audio"], local["audio"])


def test_a_missing_audio_object_names_its_url_and_key(s3):
    url = f"s3://{BUCKET}/audio/absent.flac"
    rows = s3["remote_rows"][:2] + [{"key": "gone", "audio_path": url, "duration": 0.2}]
    pipe = IterableWrapper(rows).load_audio(remote=s3["options"])
    with pytest.raises(MissingDataError) as caught:
        list(pipe)
    assert caught.value.source == url and caught.value.key == "gone"
    assert url in str(caught.value)
    skipping = IterableWrapper(rows).load_audio(remote=s3["options"], on_error="skip")
    with pytest.warns(sp.SkippedInputWarning):
        assert [s["key"] for s in skipping] == ["u0", "u1"]
    assert skipping.diagnostics.counts == {"missing audio file": 1}


def test_a_failing_audio_object_is_retried_then_named_with_its_key(s3):
    proxy, row = s3["proxy"], s3["remote_rows"][2]
    [local] = IterableWrapper(s3["rows"][2:3]).load_audio()
    try:
        proxy.fail(503, match="u2.flac", times=2)  # transient: cured by the retries
        [sample] = IterableWrapper([row]).load_audio(remote=s3["proxied"])
        np.testing.assert_array_equal(sample["audio"], local["audio"])
        proxy.fail(503, match="u2.flac", times=-1)  # lasting: named after 3 attempts
        with pytest.raises(DataError, match="after 3 attempts") as caught:
            list(IterableWrapper([row]).load_audio(remote=s3["proxied"]))
        assert caught.value.source == row["audio_path"] and caught.value.key == "u2"
        assert S3_TEST_CREDENTIALS["secret"] not in str(caught.value)
    finally:
        proxy.clear()


def test_a_url_path_is_not_joined_to_a_local_root(s3, tmp_path):
    [sample] = IterableWrapper(s3["remote_rows"][:1]).load_audio(root=str(tmp_path),
                                                                 remote=s3["options"])
    assert sample["audio"].shape == (int(SECONDS[0] * RATE),)


# --------------------------------------------------------------------------- Kaldi


@pytest.mark.parametrize("table", ["text", "wav.scp", "feats.scp"])
def test_kaldi_tables_at_urls_parse_to_the_local_entries(s3, table):
    local = os.path.join(s3["kaldi"], table)
    url = f"{s3['kaldi_url']}/{table}"
    parsed = [tuple(e) for e in IterableWrapper([url]).open(remote=s3["options"]).parse_scp()]
    assert parsed == [tuple(e) for e in IterableWrapper([local]).open().parse_scp()]
    assert parsed and {k: tuple(e) for k, e in read_scp_table(url, remote=s3["options"]).items()
                       } == {k: tuple(e) for k, e in read_scp_table(local).items()}


def test_the_arks_of_a_remote_feats_scp_stream_to_the_local_matrices(s3):
    arks = kaldi_arks(f"{s3['kaldi_url']}/feats.scp", remote=s3["options"])
    assert arks == [f"{s3['kaldi_url']}/raw.ark"]
    read = ShardReadOptions(mmap=False, remote=s3["options"])
    remote = list(read_shard(arks[0], format="ark", read_options=read))
    local = list(read_shard(os.path.join(s3["kaldi"], "raw.ark"), format="ark"))
    assert [s["key"] for s in remote] == [s["key"] for s in local] == ["u0", "u1", "u2", "u3"]
    for r, l in zip(remote, local):
        np.testing.assert_array_equal(r["feats"], l["feats"])


@pytest.mark.parametrize("table,kind,what", [("feats.scp", "feats", "raw.ark"),
                                             ("wav.scp", "wav", "u0.flac")])
def test_load_scp_refuses_a_remote_value_naming_it_and_the_line(s3, table, kind, what):
    entries = read_scp_table(f"{s3['kaldi_url']}/{table}", remote=s3["options"])
    with pytest.raises(DataError) as caught:
        list(load_scp_entries(entries.values(), kind, root=s3["kaldi"]))
    message = str(caught.value)
    assert f"{s3['kaldi_url']}/{what}" in message and "object storage" in message
    assert caught.value.line == 1 and caught.value.key == "u0"


def test_a_missing_remote_table_is_named(s3):
    url = f"{s3['kaldi_url']}/segments"
    with pytest.raises(MissingDataError, match="table file not found") as caught:
        read_scp_table(url, remote=s3["options"])
    assert caught.value.source == url
