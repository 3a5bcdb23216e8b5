"""Shards and their index in object storage, read through fsspec (issue 22).

A real S3-compatible server -- moto's server mode (speechpipe.testing.serve_s3) -- runs on
127.0.0.1 for this module; the corpus (real tar shards from ShardWriter and their
index.jsonl) is uploaded to it with boto3. Clients reach it through a FaultProxy, a small
HTTP proxy started here that injects the faults: a connection dropped mid-body, a short body,
503 answers, a slow answer. botocore's own retries are turned off in the storage options, so
every retry seen is speechpipe's.

Invariants:
- a remote shard gives exactly the bytes and samples of the local file, whatever fault the
  proxy injects that a retry can cure; nothing comes back short;
- a dropped or short transfer is continued at a byte offset inside the shard (never from
  its start);
- a fault that does not go away raises an error naming the URL, after ``retries`` attempts,
  and no message or repr shows a credential;
- the index read from the bucket plans remote shards exactly as local ones: len(), the
  balanced split, the epoch plans;
- with 2 gloo ranks x 2 DataLoader workers, a pipeline reading from the server (with faults)
  gives the batches it gives from local disk.
"""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import time
from datetime import timedelta

import pytest

from speechpipe.errors import DataError, MissingDataError
from speechpipe.index import ShardEntry, ShardIndex
from speechpipe.pipes._core import IterableWrapper
from speechpipe.pipes.sources import read_manifest, write_manifest
from speechpipe.pipes.shards import ShardWriter
from speechpipe.pipes.order import read_shard
from speechpipe.pipes.shards import ShardReadOptions
from speechpipe.pipes.batching import PaddedArea
from speechpipe.pipes.sources import expand_patterns, open_stream
from speechpipe.pipes.distributed import StepPlanner
from speechpipe.remote import RemoteOptions
from speechpipe.seeding import Position
from speechpipe.testing import (S3_TEST_CREDENTIALS, FaultProxy, s3_test_storage, serve_s3,
                                upload_folder)

pytest.importorskip("moto")
pytest.importorskip("s3fs")

SHARDS = [9, 7, 5, 9, 3, 6]  # samples per shard: uneven
BLOCK = 1 << 14  # small range requests, so that a shard takes several
SECRET = S3_TEST_CREDENTIALS["secret"]
PROCESS_TIMEOUT = 150


def write_corpus(folder: str) -> list[str]:
    """Shards of samples {key, txt=<frames> + random payload}, and their index."""
    os.makedirs(folder, exist_ok=True)
    entries = []
    for i, count in enumerate(SHARDS):
        rng = random.Random(i)
        lengths = [rng.randint(40, 400) for _ in range(count)]
        keys = [f"s{i}_{j}" for j in range(count)]
        path = os.path.join(folder, f"data-{i:05d}.tar")
        with ShardWriter(path) as writer:
            for key, n in zip(keys, lengths):
                writer.write({"key": key, "txt": str(n), "bin": rng.randbytes(n * 100)})
        entries.append(ShardEntry(os.path.basename(path), count, os.path.getsize(path),
                                  tuple(keys), tuple(float(n) for n in lengths)))
    ShardIndex(folder, entries).write()
    write_manifest(os.path.join(folder, "samples.jsonl.gz"),
                   [{"key": k, "num_frames": int(n)} for e in entries
                    for k, n in zip(e.keys, e.lengths)])
    return [os.path.join(folder, e.name) for e in entries]


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """The local corpus, the server with a copy in s3://speechpipe-remote/corpus, a proxy."""
    local = write_corpus(str(tmp_path_factory.mktemp("corpus")))
    with serve_s3() as endpoint, FaultProxy(endpoint) as proxy:
        folder = upload_folder(endpoint, os.path.dirname(local[0]), "speechpipe-remote",
                               "corpus")
        urls = [f"{folder}/{os.path.basename(p)}" for p in local]
        options = RemoteOptions(storage_options=s3_test_storage(proxy.url), block_size=BLOCK,
                                retries=3, backoff=0.01)
        yield {"local": local, "urls": urls, "folder": folder, "proxy": proxy,
               "options": options, "endpoint": endpoint}


@pytest.fixture(scope="module", autouse=True)
def node_cache_of_this_module(tmp_path_factory):
    """The index tables of this module's reads in a folder of its own (not the user's)."""
    before = os.environ.get("SPEECHPIPE_CACHE_DIR")
    os.environ["SPEECHPIPE_CACHE_DIR"] = str(tmp_path_factory.mktemp("node-cache"))
    yield
    if before is None:
        os.environ.pop("SPEECHPIPE_CACHE_DIR", None)
    else:
        os.environ["SPEECHPIPE_CACHE_DIR"] = before


@pytest.fixture
def proxy(s3):
    s3["proxy"].clear()
    yield s3["proxy"]
    s3["proxy"].clear()


def read_bytes(url: str, options: RemoteOptions) -> bytes:
    with open_stream(url, remote=options) as f:
        return f.read()


def local_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def gets(proxy: FaultProxy, name: str) -> list[tuple[str | None, str | None]]:
    """(Range, fault) of each GET of the object ``name``, in order."""
    return [(rng, fault) for method, path, rng, fault in proxy.requests
            if method == "GET" and path.endswith(name)]


def samples(shard: str, options: RemoteOptions | None = None) -> list[dict]:
    return list(read_shard(shard, read_options=ShardReadOptions(mmap=False, remote=options)))


# --------------------------------------------------------------------------- plain reading


def test_remote_shards_give_the_bytes_and_samples_of_the_local_files(s3, proxy):
    for path, url in zip(s3["local"], s3["urls"]):
        assert read_bytes(url, s3["options"]) == local_bytes(path)
        assert samples(url, s3["options"]) == [
            dict(s, source=url) for s in samples(path)]
    ranges = [r for r, _ in gets(proxy, "data-00000.tar")]
    size = os.path.getsize(s3["local"][0])
    assert len(ranges) > 2 and ranges[0] == f"bytes=0-{BLOCK - 1}"  # bounded range requests
    assert all(int(r.split("-")[1]) - int(r[6:].split("-")[0]) < BLOCK for r in ranges)
    assert int(ranges[-1].split("-")[1]) == size - 1


def test_list_shards_globs_the_bucket(s3, proxy):
    pattern = s3["folder"] + "/data-0000[0-4].tar"
    assert expand_patterns(pattern, remote=s3["options"]) == s3["urls"][:5]
    listed = list(IterableWrapper([s3["folder"] + "/data-*.tar"]).list_shards(
        remote=s3["options"]))
    assert listed == s3["urls"]
    with pytest.raises(MissingDataError, match="no object matches this pattern"):
        expand_patterns(s3["folder"] + "/nothing-*.tar", remote=s3["options"])


def test_a_manifest_in_the_bucket_reads_as_the_local_one(s3, proxy):
    local = os.path.join(os.path.dirname(s3["local"][0]), "samples.jsonl.gz")
    url = s3["folder"] + "/samples.jsonl.gz"
    expected = [dict(s, source=s["source"].replace(local, url)) for s in read_manifest(local)]
    assert len(expected) == sum(SHARDS)
    assert list(read_manifest(url, remote=s3["options"])) == expected
    parsed = IterableWrapper([url]).open(remote=s3["options"]).parse_manifest()
    assert list(parsed) == expected


# --------------------------------------------------------------------------- faults


def test_a_connection_dropped_mid_shard_is_resumed_at_that_block(s3, proxy):
    url, path = s3["urls"][3], s3["local"][3]
    proxy.drop(1000, match=f"data-00003.tar bytes={2 * BLOCK}-")
    assert read_bytes(url, s3["options"]) == local_bytes(path)
    ranges = gets(proxy, "data-00003.tar")
    dropped = ranges.index((f"bytes={2 * BLOCK}-{3 * BLOCK - 1}", "drop"))
    assert dropped == 2  # two blocks read before it
    # continued at the byte offset of the dropped block, never from the shard's start
    assert ranges[dropped + 1] == (f"bytes={2 * BLOCK}-{3 * BLOCK - 1}", None)
    assert all(not r.startswith("bytes=0-") for r, _ in ranges[dropped:])


def test_a_body_cut_short_is_continued_at_the_byte_where_it_stopped(s3, proxy):
    url, path = s3["urls"][3], s3["local"][3]
    proxy.short(1000, match=f"data-00003.tar bytes={BLOCK}-")
    assert samples(url, s3["options"]) == [dict(s, source=url) for s in samples(path)]
    ranges = [r for r, _ in gets(proxy, "data-00003.tar")]
    cut = ranges.index(f"bytes={BLOCK}-{2 * BLOCK - 1}")
    assert ranges[cut + 1] == f"bytes={BLOCK + 1000}-{2 * BLOCK - 1}"


def test_a_503_is_retried_then_read(s3, proxy):
    url, path = s3["urls"][1], s3["local"][1]
    proxy.fail(503, match=f"data-00001.tar bytes={BLOCK}-", times=2)
    assert read_bytes(url, s3["options"]) == local_bytes(path)
    faults = [f for r, f in gets(proxy, "data-00001.tar") if r.startswith(f"bytes={BLOCK}-")]
    assert faults == ["status", "status", None]


def test_a_persistent_503_raises_naming_the_url_after_the_retries(s3, proxy):
    url = s3["urls"][1]
    proxy.fail(503, match="data-00001.tar", times=-1)
    with pytest.raises(DataError) as exc_info:
        read_bytes(url, s3["options"])
    message = str(exc_info.value)
    assert url in message and "after 3 attempts" in message and "bytes 0-" in message
    assert len(gets(proxy, "data-00001.tar")) == 3
    assert SECRET not in message and SECRET not in repr(s3["options"])
    # through a pipeline, on_error="skip" counts the shard and goes on
    pipe = IterableWrapper(s3["urls"][:2]).sharded_shuffle(
        buffer_size=1, on_error="skip", read_options=ShardReadOptions(remote=s3["options"]))
    with pytest.warns(Warning):
        keys = [s["key"] for s in pipe]
    assert sorted(keys) == sorted(f"s0_{j}" for j in range(SHARDS[0]))
    assert pipe.diagnostics.total == 1


def test_a_missing_object_is_named(s3, proxy):
    url = s3["folder"] + "/data-00099.tar"
    with pytest.raises(MissingDataError, match=f"{url}: no such object"):
        read_bytes(url, s3["options"])
    pipe = IterableWrapper([url]).sharded_shuffle(
        read_options=ShardReadOptions(remote=s3["options"]))
    with pytest.raises(MissingDataError, match="data-00099.tar"):
        list(pipe)


def test_a_slow_answer_times_out_naming_the_url_or_arrives_within_the_timeout(s3, proxy):
    url, path = s3["urls"][4], s3["local"][4]
    slow = RemoteOptions(storage_options=s3_test_storage(proxy.url), retries=2, backoff=0.01,
                         timeout=0.5)
    proxy.delay(1.5, match="data-00004.tar", times=-1)
    started = time.monotonic()
    with pytest.raises(DataError, match="after 2 attempts \\(FSTimeoutError\\)") as exc_info:
        read_bytes(url, slow)
    assert url in str(exc_info.value) and time.monotonic() - started < 5
    proxy.clear()
    proxy.delay(0.3, match="data-00004.tar", times=1)
    patient = RemoteOptions(storage_options=s3_test_storage(proxy.url), timeout=10)
    assert read_bytes(url, patient) == local_bytes(path)


def test_error_messages_never_show_a_credential():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens there
    # an endpoint that carries the secret in its path, so that the library's own message
    # ("Could not connect to the endpoint URL: ...") would show it
    options = RemoteOptions(
        storage_options={**s3_test_storage(""), "endpoint_url": f"http://127.0.0.1:{port}/{SECRET}"},
        retries=1, backoff=0)
    with pytest.raises(DataError) as exc_info:
        read_bytes("s3://speechpipe-remote/corpus/data-00000.tar", options)
    assert "***" in str(exc_info.value) and SECRET not in str(exc_info.value)
    assert SECRET not in repr(options) and SECRET not in repr(ShardReadOptions(remote=options))


@pytest.mark.parametrize("kwargs, message", [
    ({"retries": 0}, "retries must be an int >= 1, got 0"),
    ({"block_size": 0}, "block_size must be an int >= 1, got 0"),
    ({"timeout": 0}, "timeout must be > 0 seconds, got 0"),
    ({"backoff": -1}, "backoff must be >= 0 seconds, got -1"),
])
def test_remote_options_reject_bad_values(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RemoteOptions(**kwargs)


def test_remote_options_are_checked_where_they_are_taken():
    with pytest.raises(TypeError, match="remote must be a RemoteOptions or None"):
        ShardReadOptions(remote={"endpoint_url": "x"})
    with pytest.raises(TypeError, match="remote must be a RemoteOptions or None"):
        IterableWrapper(["s3://b/a.tar"]).open(remote="x")


# --------------------------------------------------------------------------- the index


def test_the_index_in_the_bucket_plans_remote_shards_like_local_ones(s3, proxy):
    remote = ShardIndex.read(s3["folder"], remote=s3["options"])
    local = ShardIndex.read(os.path.dirname(s3["local"][0]))
    assert remote.shards == local.shards and remote.paths() == s3["urls"]
    read = ShardReadOptions(remote=s3["options"])
    pipes = {
        "local": IterableWrapper(s3["local"]).sharded_shuffle(buffer_size=4, index=True,
                                                              seed=5),
        "remote": IterableWrapper(s3["urls"]).sharded_shuffle(buffer_size=4, index=True,
                                                              seed=5, read_options=read),
    }
    assert len(pipes["remote"]) == len(pipes["local"]) == sum(SHARDS)

    def names(plan):
        return [os.path.basename(n) for n in plan.names]

    for epoch in range(2):
        plans = {k: p.epoch_plans(epoch, world_size=2, num_workers=2) for k, p in pipes.items()}
        for rank in range(2):
            for worker in range(2):
                a, b = plans["local"][rank][worker], plans["remote"][rank][worker]
                assert names(a) == names(b) and a.total_count == b.total_count
        position = Position(rank=1, world_size=2)
        assert (pipes["remote"].epoch_plan(epoch, position).total_count
                == pipes["local"].epoch_plan(epoch, position).total_count)
    keys = [s["key"] for s in pipes["remote"].set_epoch(0)]
    assert keys == [s["key"] for s in pipes["local"].set_epoch(0)]
    # step plans for 2 ranks x 2 workers: the same from the bucket's index as from disk
    planners = [StepPlanner(p, PaddedArea(budget=1000), num_workers=2, world_size=2)
                for p in pipes.values()]
    for epoch in range(2):
        local_plan, remote_plan = (planner.plan(epoch) for planner in planners)
        assert remote_plan.rank_batches == local_plan.rank_batches
        assert min(local_plan.rank_batches) > 0
        assert remote_plan.steps == local_plan.steps


def test_an_index_read_from_a_url_is_not_written_back_there(s3, proxy, tmp_path):
    remote = ShardIndex.read(s3["folder"] + "/index.jsonl", remote=s3["options"])
    with pytest.raises(ValueError, match="is a URL: write it to a local path"):
        remote.write()
    assert ShardIndex.read(remote.write(str(tmp_path / "index.jsonl"))).shards == remote.shards


def test_a_missing_remote_index_is_named(s3, proxy):
    with pytest.raises(MissingDataError, match="speechpipe-remote/nowhere/index.jsonl"):
        ShardIndex.read(s3["folder"].replace("corpus", "nowhere"), remote=s3["options"])


# --------------------------------------------------------------------------- 2 ranks x 2 workers


def parse(sample: dict) -> dict:
    return {"key": sample["key"], "num_frames": int(sample["txt"]), "size": len(sample["bin"])}


def pipeline(names: list[str], remote: RemoteOptions | None):
    read = ShardReadOptions(mmap=False, remote=remote)
    sharded = IterableWrapper(names).sharded_shuffle(buffer_size=4, seed=3, index=True,
                                                     read_options=read)
    return sharded.map(parse).bucket_by_length(8, boundaries=[200]).block_batch(
        budget=PaddedArea(1000), shuffle_window=2, seed=3)


def _rank_main(rank: int, world: int, port: int, ctx_path: str, out: str) -> None:
    import torch.distributed as dist

    from speechpipe.loader import build_loader

    with open(ctx_path) as f:
        ctx = json.load(f)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=60))
    remote = RemoteOptions(storage_options=ctx["storage"], block_size=BLOCK, retries=3,
                           backoff=0.01)
    seen = {}
    for kind, names, options in (("local", ctx["local"], None),
                                 ("remote", ctx["urls"], remote)):
        loader = build_loader(pipeline(names, options), num_workers=2, resumable=False)
        seen[kind] = [[[s["key"], s["size"]] for s in batch] for batch in loader]
        dist.barrier()
    with open(out, "w") as f:
        json.dump(seen, f)
    dist.destroy_process_group()


@pytest.mark.timeout(PROCESS_TIMEOUT + 30)
def test_two_ranks_two_workers_read_the_same_batches_from_s3_as_from_disk(s3, proxy,
                                                                         tmp_path):
    # faults each cured by a retry, met by whichever worker reads those bytes first
    proxy.drop(500, match=f"data-00000.tar bytes={BLOCK}-")
    proxy.fail(503, match="data-00002.tar bytes=0-", times=2)
    proxy.short(700, match=f"data-00005.tar bytes={BLOCK}-")
    ctx = {"local": s3["local"], "urls": s3["urls"], "storage": s3_test_storage(s3["proxy"].url)}
    ctx_path = tmp_path / "ctx.json"
    ctx_path.write_text(json.dumps(ctx))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, GLOO_SOCKET_IFNAME=os.environ.get("GLOO_SOCKET_IFNAME", "lo"),
               PYTHONWARNINGS="ignore")
    outs = [tmp_path / f"rank{r}.json" for r in range(2)]
    logs = [open(tmp_path / f"rank{r}.log", "w") for r in range(2)]
    procs = [subprocess.Popen([sys.executable, __file__, str(r), "2", str(port),
                               str(ctx_path), str(outs[r])], env=env, stdout=logs[r],
                              stderr=subprocess.STDOUT) for r in range(2)]
    try:
        for p in procs:
            p.wait(timeout=PROCESS_TIMEOUT)
    finally:
        for p in procs:
            p.kill()
            p.wait()
        for log in logs:
            log.close()
    for r, p in enumerate(procs):
        assert p.returncode == 0, (tmp_path / f"rank{r}.log").read_text()[-3000:]
    results = [json.loads(o.read_text()) for o in outs]
    for r in results:
        assert r["remote"] == r["local"] and r["local"]
    keys = sorted(k for r in results for batch in r["remote"] for k, _ in batch)
    assert keys == sorted(f"s{i}_{j}" for i, n in enumerate(SHARDS) for j in range(n))
    met = {f for _, _, _, f in s3["proxy"].requests if f}
    assert met == {"drop", "status", "short"}  # every fault was met and cured


if __name__ == "__main__":
    _rank_main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])


# Issue 34, item 2: every S3 call honours RemoteOptions.timeout, and botocore's own retries do
# not multiply ours. Against an endpoint that accepts and never answers, fs.info blocked for
# 150 s and more with RemoteOptions(timeout=2, retries=2) (about 77 s per attempt).

@pytest.fixture
def silent_endpoint():
    """A TCP server on 127.0.0.1 that accepts connections and never answers."""
    import socket
    import threading
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    held, stop = [], threading.Event()

    def accept():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        server.close()


def test_a_silent_endpoint_costs_the_timeout_per_attempt_not_minutes(silent_endpoint):
    from speechpipe.remote import open_remote, remote_glob
    options = RemoteOptions(storage_options={"endpoint_url": silent_endpoint,
                                             **S3_TEST_CREDENTIALS},
                            timeout=2, retries=2, backoff=0.1)
    started = time.monotonic()
    with pytest.raises(DataError, match=r"^s3://speechpipe-silent/a.tar: gave up asking for "
                                        r"its size after 2 attempts"):
        open_remote("s3://speechpipe-silent/a.tar", options)
    assert time.monotonic() - started < 12
    started = time.monotonic()
    with pytest.raises(DataError, match=r"^s3://speechpipe-silent/data-\*.tar: cannot list"):
        remote_glob("s3://speechpipe-silent/data-*.tar", options)
    assert time.monotonic() - started < 12


def test_an_object_overwritten_while_it_is_read_is_a_named_error(s3):
    # Issue 34, item 6: a shard overwritten mid-read gave u0000..u0003, v0004, v0005 -- a
    # silent mix of two versions. The ETag seen at open is asked for on every range.
    import boto3
    client = boto3.client("s3", endpoint_url=s3["endpoint"], region_name="us-east-1",
                          aws_access_key_id=S3_TEST_CREDENTIALS["key"],
                          aws_secret_access_key=S3_TEST_CREDENTIALS["secret"])
    first, second = os.urandom(3 * BLOCK), os.urandom(3 * BLOCK)
    client.put_object(Bucket="speechpipe-remote", Key="pinned/a.tar", Body=first)
    url = "s3://speechpipe-remote/pinned/a.tar"
    options = RemoteOptions(storage_options=s3_test_storage(s3["endpoint"]), block_size=BLOCK,
                            retries=2, backoff=0.01)
    with open_stream(url, remote=options) as f:
        assert f.read(BLOCK) == first[:BLOCK]
        client.put_object(Bucket="speechpipe-remote", Key="pinned/a.tar", Body=second)
        with pytest.raises(DataError) as info:
            f.read()
    assert str(info.value).startswith(f"{url}: the object changed while it was read (its "
                                      "ETag was ")
    assert read_bytes(url, options) == second  # opened again: the new object, whole


def test_an_index_in_the_bucket_is_fetched_once_per_process(s3, proxy, cache_dir):
    # issue 28: over object storage each index is fetched once per process, not per shard
    # listed, per plan or per pass (and once per node: test_..._once_per_node)
    read = ShardReadOptions(remote=s3["options"])
    pipe = IterableWrapper(s3["urls"]).sharded_shuffle(buffer_size=4, index=True, seed=5,
                                                       read_options=read)
    assert len(pipe) == sum(SHARDS)
    for epoch in range(2):
        pipe.epoch_plans(epoch, world_size=2, num_workers=2)
        assert len([s["key"] for s in pipe.set_epoch(epoch)]) == sum(SHARDS)
    again = IterableWrapper(s3["urls"]).sharded_shuffle(index=True, read_options=read)
    assert len(again) == sum(SHARDS)
    assert len(gets(proxy, "index.jsonl")) == 1


# ------------------------------------------- the index's table, once per node (issue 28)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """A fresh node cache for the index tables, and this process's reads forgotten."""
    import speechpipe.index as index

    monkeypatch.setattr(index, "_READ", {})
    folder = tmp_path / "node-cache"
    monkeypatch.setenv("SPEECHPIPE_CACHE_DIR", str(folder))
    return folder


def _tables(folder) -> list[str]:
    return sorted(p for p in os.listdir(folder) if p.endswith(".spmap"))


_NODE_PROCESS = """
import json, sys
from speechpipe.index import ShardIndex
from speechpipe.pipes._core import IterableWrapper
from speechpipe.pipes.shards import ShardReadOptions
from speechpipe.remote import RemoteOptions
ctx = json.loads(sys.argv[1])
remote = RemoteOptions(storage_options=ctx["storage"], retries=3, backoff=0.01,
                       cache_dir=ctx["cache"])
index = ShardIndex.read(ctx["folder"], remote=remote)
pipe = IterableWrapper(ctx["urls"]).sharded_shuffle(
    buffer_size=4, index=True, seed=5, read_options=ShardReadOptions(remote=remote))
plans = [pipe.epoch_plans(epoch, world_size=2, num_workers=2) for epoch in range(2)]
print(json.dumps({"n": len(pipe), "built": index.shards[0].keys.table.header["built"],
                  "keys": [list(s.keys) for s in index.shards]}))
"""


@pytest.mark.timeout(PROCESS_TIMEOUT + 30)
def test_a_remote_index_is_fetched_and_built_once_per_node(s3, proxy, cache_dir):
    # issue 28: every process (W ranks x K workers) fetched the index and built its table;
    # now the first process of the node does, under a lock, and the others map its file
    ctx = json.dumps({"storage": s3_test_storage(s3["proxy"].url), "cache": str(cache_dir),
                      "folder": s3["folder"], "urls": s3["urls"]})
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))]
        + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    started = [subprocess.Popen([sys.executable, "-c", _NODE_PROCESS, ctx], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for _ in range(4)]  # at once: they meet at the lock
    outs = [p.communicate(timeout=PROCESS_TIMEOUT) for p in started]
    assert all(p.returncode == 0 for p in started), [err[-2000:] for _, err in outs]
    got = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    later = subprocess.run([sys.executable, "-c", _NODE_PROCESS, ctx], env=env,
                           capture_output=True, text=True, timeout=PROCESS_TIMEOUT)
    assert later.returncode == 0, later.stderr[-2000:]
    got.append(json.loads(later.stdout.strip().splitlines()[-1]))
    local = ShardIndex.read(os.path.dirname(s3["local"][0]))
    assert all(g["n"] == sum(SHARDS) for g in got)
    assert all(g["keys"] == [list(s.keys) for s in local.shards] for g in got)
    assert len(gets(proxy, "index.jsonl")) == 1  # 5 processes, 2 passes each: one fetch
    assert len({g["built"] for g in got}) == 1  # and one build
    assert len(_tables(cache_dir)) == 1


def _s3_client(endpoint: str):
    import boto3

    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                        aws_access_key_id=S3_TEST_CREDENTIALS["key"],
                        aws_secret_access_key=S3_TEST_CREDENTIALS["secret"])


def test_a_changed_remote_index_is_fetched_and_built_again(s3, proxy, cache_dir):
    import speechpipe.index as index

    client = _s3_client(s3["endpoint"])
    with open(os.path.join(os.path.dirname(s3["local"][0]), "index.jsonl")) as f:
        text = f.read()
    lines = text.splitlines(keepends=True)
    client.put_object(Bucket="speechpipe-remote", Key="changing/index.jsonl",
                      Body=text.encode())
    url = "s3://speechpipe-remote/changing"
    first = ShardIndex.read(url, remote=s3["options"])
    assert len(first) == sum(SHARDS) and len(gets(proxy, "changing/index.jsonl")) == 1
    for _ in range(2):  # this process again, then another one (its reads forgotten)
        assert len(ShardIndex.read(url, remote=s3["options"])) == sum(SHARDS)
        index._READ.clear()
    assert len(gets(proxy, "changing/index.jsonl")) == 1
    tables = _tables(cache_dir)
    from speechpipe.remote import remote_glob

    assert remote_glob(url + "/*.jsonl", s3["options"])  # a listing s3fs keeps (its ETags)
    client.put_object(Bucket="speechpipe-remote", Key="changing/index.jsonl",
                      Body="".join(lines[:-1]).encode())  # the last shard gone
    again = ShardIndex.read(url, remote=s3["options"])  # the same process sees the change
    assert len(again) == sum(SHARDS[:-1]) and len(again.shards) == len(SHARDS) - 1
    assert len(gets(proxy, "changing/index.jsonl")) == 2
    assert len(_tables(cache_dir)) == 1 and _tables(cache_dir) != tables  # the old one gone
    assert len(first) == sum(SHARDS)  # what was read before keeps its pages


def test_a_cached_remote_table_cut_short_is_built_again_never_read_wrong(s3, proxy,
                                                                         cache_dir):
    import speechpipe.index as index

    want = ShardIndex.read(s3["folder"], remote=s3["options"])
    expected = [(s.name, list(s.keys), list(s.lengths)) for s in want.shards]
    (name,) = _tables(cache_dir)
    path = cache_dir / name
    whole = path.read_bytes()
    for cut in (len(whole) - 8, len(whole) // 2, 30):
        path.write_bytes(whole[:cut])
        index._READ.clear()
        got = ShardIndex.read(s3["folder"], remote=s3["options"])
        assert [(s.name, list(s.keys), list(s.lengths)) for s in got.shards] == expected
    assert len(gets(proxy, "corpus/index.jsonl")) == 4  # each broken table: fetched again


def test_a_remote_table_in_an_unusable_cache_folder_is_this_processs_own(s3, proxy,
                                                                        tmp_path):
    import speechpipe.index as index

    index._READ.clear()
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    options = RemoteOptions(storage_options=s3_test_storage(s3["proxy"].url), block_size=BLOCK,
                            retries=3, backoff=0.01, cache_dir=str(blocked / "cache"))
    with pytest.warns(RuntimeWarning, match="each process builds its own table"):
        got = ShardIndex.read(s3["folder"], remote=options)
    assert len(got) == sum(SHARDS) and got.shards[0].keys.table.sidecar is None
    index._READ.clear()
