"""Node copies of shards in object storage on ``plan_batches``' shard road (issue 29).

Each process of the planned road (rank x DataLoader worker) reads, whole, every shard holding a
member of one of its batches: a shard in a bucket was downloaded by each process that needed
it. With node copies the first process of the node downloads it into the node's cache folder
and the others map that copy. A real S3-compatible server (moto, on 127.0.0.1) behind a
:class:`~speechpipe.testing.FaultProxy` that records every request: a shard's downloads are
counted as its GETs from byte 0 (one download is several range requests).

- a DataLoader with 2 workers fetches each shard once with copies (more than once without), and
  the batches are byte-identical with and without copies, and with 0 and 2 workers;
- processes started at once (real ones) meet at the lock: each shard fetched once;
- an object rewritten (a new ETag) is fetched again into a new copy, the old one removed;
- an unusable cache folder reads as before (a warning), each process fetching for itself.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import numpy as np
import pytest
import torch

import speechpipe as sp
from speechpipe.index import ShardEntry, ShardIndex
from speechpipe.pipes.batching import PaddedArea
from speechpipe.pipes.shards import COPIES_FOLDER, ShardReadOptions, ShardWriter, node_copy_samples
from speechpipe.remote import RemoteOptions
from speechpipe.testing import (S3_TEST_CREDENTIALS, FaultProxy, batch_digest, s3_test_storage,
                                serve_s3, upload_folder)

pytest.importorskip("moto")
pytest.importorskip("s3fs")

SHARDS, PER_SHARD = 5, 8
BLOCK = 1 << 15
PROCESS_TIMEOUT = 150


def write_corpus(folder: str) -> list[str]:
    os.makedirs(folder, exist_ok=True)
    entries = []
    for i in range(SHARDS):
        rng = random.Random(i)
        keys = [f"s{i}_{j}" for j in range(PER_SHARD)]
        lengths = [rng.randint(20, 200) for _ in keys]
        path = os.path.join(folder, f"data-{i:05d}.tar")
        with ShardWriter(path) as writer:
            for j, (key, n) in enumerate(zip(keys, lengths)):
                writer.write({"key": key, "dat": rng.randbytes(n),
                              "feats.npy": np.full(5000, i * 100 + j, np.float32)})
        entries.append(ShardEntry(os.path.basename(path), PER_SHARD, os.path.getsize(path),
                                  tuple(keys), tuple(float(n) for n in lengths)))
    ShardIndex(folder, entries).write()
    return [os.path.join(folder, e.name) for e in entries]


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    local = write_corpus(str(tmp_path_factory.mktemp("corpus")))
    with serve_s3() as endpoint, FaultProxy(endpoint) as proxy:
        folder = upload_folder(endpoint, os.path.dirname(local[0]), "speechpipe-copies",
                               "corpus")
        yield {"local": local, "urls": [f"{folder}/{os.path.basename(p)}" for p in local],
               "proxy": proxy, "endpoint": endpoint, "folder": folder}


@pytest.fixture
def cache(s3, tmp_path, monkeypatch):
    """A fresh node cache (index tables and copies), the proxy's records cleared."""
    import speechpipe.index as index

    monkeypatch.setattr(index, "_READ", {})
    folder = tmp_path / "node-cache"
    monkeypatch.setenv("SPEECHPIPE_CACHE_DIR", str(folder))
    s3["proxy"].clear()
    return folder


def options(s3, **kwargs) -> ShardReadOptions:
    remote = RemoteOptions(storage_options=s3_test_storage(s3["proxy"].url), block_size=BLOCK,
                           retries=3, backoff=0.01)
    return ShardReadOptions(remote=remote, **kwargs)


def downloads(proxy: FaultProxy) -> dict[str, int]:
    """Per shard, the GETs from its byte 0: the times it was downloaded."""
    out: dict[str, int] = {}
    for method, path, rng, _ in proxy.requests:
        name = path.rsplit("/", 1)[-1]
        if method == "GET" and name.startswith("data-") and (rng or "").startswith("bytes=0-"):
            out[name] = out.get(name, 0) + 1
    return out


def collate(batch: list) -> dict:
    n = max(len(s["dat"]) for s in batch)
    x = torch.zeros(len(batch), n, dtype=torch.uint8)
    for i, s in enumerate(batch):
        x[i, :len(s["dat"])] = torch.frombuffer(bytearray(s["dat"]), dtype=torch.uint8)
    feats = torch.stack([torch.frombuffer(bytearray(s["feats.npy"]), dtype=torch.uint8)
                         for s in batch])
    return {"key": [s["key"] for s in batch], "x": x, "feats": feats}


def road(urls, read_options):
    # index=True: the index beside the shards, read with the bucket's options
    return sp.IterableWrapper(urls).plan_batches(
        budget=PaddedArea(500), index=True, streams=1, seed=3, buffer_size=4,
        bucket_buffer=6, shuffle_window=2, read_options=read_options).collate(
        collate_fn=collate)


def epoch(urls, read_options, workers: int) -> list[str]:
    loader = sp.build_loader(road(urls, read_options), num_workers=workers, seed=0)
    return [batch_digest(b) for b in loader]


@pytest.mark.timeout(PROCESS_TIMEOUT)
def test_two_workers_fetch_each_shard_once_with_copies_and_more_without(s3, cache):
    proxy = s3["proxy"]
    with_copies = epoch(s3["urls"], options(s3), 2)
    fetched = downloads(proxy)
    assert fetched == {f"data-{i:05d}.tar": 1 for i in range(SHARDS)}  # once per node
    assert len(with_copies) > 4
    proxy.clear()
    without = epoch(s3["urls"], options(s3, node_copy_bytes=None), 2)
    assert without == with_copies  # byte-identical
    again = downloads(proxy)
    assert set(again) == set(fetched) and sum(again.values()) > SHARDS  # both workers fetch
    proxy.clear()
    assert epoch(s3["urls"], options(s3), 0) == with_copies  # 0 workers: the same batches
    assert downloads(proxy) == {}  # the node's copies, not a byte fetched again
    assert len([n for n in os.listdir(cache / COPIES_FOLDER) if n.endswith(".tar")]) == SHARDS


_PROCESS = """
import json, sys
import speechpipe as sp
from speechpipe.index import ShardIndex
from speechpipe.pipes.batching import PaddedArea
from speechpipe.pipes.shards import ShardReadOptions
from speechpipe.remote import RemoteOptions
ctx = json.loads(sys.argv[1])
remote = RemoteOptions(storage_options=ctx["storage"], block_size=ctx["block"], retries=3,
                       backoff=0.01, cache_dir=ctx["cache"])
index = ShardIndex.read(ctx["urls"][0].rsplit("/", 1)[0], remote=remote)
pipe = sp.IterableWrapper(ctx["urls"]).plan_batches(
    budget=PaddedArea(500), index=index, streams=2, seed=3,
    read_options=ShardReadOptions(remote=remote))
batches = [[[s["key"], bytes(s["dat"]).hex(), bytes(s["feats.npy"]).hex()[-16:]] for s in b]
           for b in pipe]
print(json.dumps(batches))
"""


@pytest.mark.timeout(PROCESS_TIMEOUT + 30)
def test_processes_started_at_once_fetch_each_shard_once(s3, cache, tmp_path):
    ctx = json.dumps({"storage": s3_test_storage(s3["proxy"].url), "cache": str(tmp_path / "shared"),
                      "urls": s3["urls"], "block": BLOCK})
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [root] + [p for p in [os.environ.get("PYTHONPATH")] if p]), PYTHONWARNINGS="ignore")
    started = [subprocess.Popen([sys.executable, "-c", _PROCESS, ctx], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for _ in range(3)]  # at once: they meet at each shard's lock
    outs = [p.communicate(timeout=PROCESS_TIMEOUT) for p in started]
    assert all(p.returncode == 0 for p in started), [err[-2000:] for _, err in outs]
    got = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    assert got[0] == got[1] == got[2]
    assert sorted(k for b in got[0] for k, _, _ in b) == sorted(
        f"s{i}_{j}" for i in range(SHARDS) for j in range(PER_SHARD))
    assert downloads(s3["proxy"]) == {f"data-{i:05d}.tar": 1 for i in range(SHARDS)}


def _put(s3, key: str, path: str) -> str:
    import boto3

    client = boto3.client("s3", endpoint_url=s3["endpoint"], region_name="us-east-1",
                          aws_access_key_id=S3_TEST_CREDENTIALS["key"],
                          aws_secret_access_key=S3_TEST_CREDENTIALS["secret"])
    with open(path, "rb") as f:
        client.put_object(Bucket="speechpipe-copies", Key=key, Body=f.read())
    return f"s3://speechpipe-copies/{key}"


def _keys(samples) -> list[str]:
    return [s["key"] for s in samples]


def test_a_rewritten_object_gets_a_new_copy_and_the_old_one_goes(s3, cache):
    url = _put(s3, "changing/data-x.tar", s3["local"][0])
    read = options(s3)
    first = list(node_copy_samples(url, read))
    assert _keys(first) == [f"s0_{j}" for j in range(PER_SHARD)]
    assert {s["source"] for s in first} == {url}
    assert _keys(node_copy_samples(url, read)) == _keys(first)  # the copy: no GET
    assert downloads(s3["proxy"]) == {"data-x.tar": 1}
    copies = sorted(n for n in os.listdir(cache / COPIES_FOLDER) if n.endswith(".tar"))
    _put(s3, "changing/data-x.tar", s3["local"][1])  # a new ETag
    assert _keys(node_copy_samples(url, read)) == [f"s1_{j}" for j in range(PER_SHARD)]
    assert downloads(s3["proxy"]) == {"data-x.tar": 2}
    now = sorted(n for n in os.listdir(cache / COPIES_FOLDER) if n.endswith(".tar"))
    assert len(now) == 1 and now != copies


def test_an_unusable_cache_folder_reads_as_before(s3, cache, tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("SPEECHPIPE_CACHE_DIR", str(blocker))
    read = options(s3)
    with pytest.warns(RuntimeWarning, match="a-file"):
        assert node_copy_samples(s3["urls"][0], read) is None
    with pytest.warns(RuntimeWarning, match="a-file"):
        first = [batch_digest(b) for b in road(s3["urls"], read)]
    assert first == [batch_digest(b) for b in road(s3["urls"], read)]
    assert downloads(s3["proxy"]) == {f"data-{i:05d}.tar": 2 for i in range(SHARDS)}


@pytest.fixture
def http_folder(s3):
    """The corpus served over plain HTTP on 127.0.0.1 (Last-Modified, no ETag); the requests
    it answered, ``(method, path)``."""
    import functools
    import http.server
    import threading

    seen: list[tuple[str, str]] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:
            seen.append((self.command, self.path))

    handler = functools.partial(Handler, directory=os.path.dirname(s3["local"][0]))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def test_an_http_shard_is_fetched_once_into_its_copy(s3, cache, http_folder):
    base, seen = http_folder
    url = f"{base}/data-00002.tar"
    first = list(node_copy_samples(url, None))
    again = list(node_copy_samples(url, None))
    assert [s["key"] for s in first] == [s["key"] for s in again] == [
        f"s2_{j}" for j in range(PER_SHARD)]
    assert {s["source"] for s in again} == {url}
    assert [bytes(s["dat"]) for s in first] == [bytes(s["dat"]) for s in again]
    assert [m for m, p in seen if p.endswith("data-00002.tar")].count("GET") == 1
    assert len([n for n in os.listdir(cache / COPIES_FOLDER) if n.endswith(".tar")]) == 1
