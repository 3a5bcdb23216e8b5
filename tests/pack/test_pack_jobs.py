"""pack beyond one run: one run owns a folder (the lock), plan -> tasks -> merge as a job array,
any executor (a process pool, Dask's LocalCluster).

Invariants: whatever the executor, the number of tasks, their order, or a task killed and run
again, the shards and indexes are byte-identical to one plain ``pack_data``; two runs never
write one folder (or one task) at once; an index is written only over the shards it lists.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

import speechpipe as sp
from test_pack import pack_feats, read_back, run_cli, tree_digest, write_feats, write_text

GROUPS = ["10:30", "30:100"]


@pytest.fixture
def corpus(tmp_path):
    """9 utterances of features (two length groups), one label in Chinese."""
    shapes = {f"utt{i}": (10 + 7 * i, 3) for i in range(9)}
    scp, arrays = write_feats(str(tmp_path), "feats", shapes, seed=3)
    labels = {k: f"text of {k}" for k in shapes}
    labels["utt4"] = "你好 世界"
    text = write_text(tmp_path / "text", labels)
    return {"scps": [scp], "labels": [text], "arrays": arrays, "out": str(tmp_path / "out"),
            "tmp": tmp_path}


def reference(corpus, **kwargs):
    """The folder one plain pack_data writes, and its digest."""
    out = str(corpus["tmp"] / "reference")
    pack_feats(corpus, out=out, filter_group=GROUPS, utts_per_shard=2, **kwargs)
    return out, tree_digest(out)


def slow_pack_script(corpus, out, marker, *, task=None, delay=0.15):
    """Python code packing ``corpus`` (or running one task of the plan in ``out``) slowly:
    each member takes ``delay`` seconds, and ``marker`` is created when writing starts."""
    call = (f"sp.pack_task({out!r}, {task[0]}, {task[1]}, progress=False)" if task else
            f"sp.pack_data({corpus['scps']!r}, {corpus['labels']!r}, {out!r}, "
            f"filter_group={GROUPS!r}, utts_per_shard=2, progress=False)")
    return textwrap.dedent(f"""
        import time
        import speechpipe as sp
        import speechpipe.pipes.shards._writer as writer
        real = writer.encode_field
        def slow(*args, **kwargs):
            open({marker!r}, "a").close()
            time.sleep({delay})
            return real(*args, **kwargs)
        writer.encode_field = slow
        {call}
    """)


def start(code):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(os.path.dirname(os.path.abspath(sp.__file__)))]
        + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    return subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finish(process):
    """Wait for ``process``; it must have succeeded (its stderr shown if not)."""
    _, err = process.communicate(timeout=120)
    assert process.returncode == 0, err


def wait_for(predicate, seconds=60.0):
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def dead_pid():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def write_lock(path, pid, host=None):
    with open(path, "w") as f:
        f.write(json.dumps({"pid": pid, "host": host or socket.gethostname(), "what": "pack",
                            "started": 0}) + "\n")


def shard_files(folder):
    return sorted(os.path.relpath(os.path.join(root, n), folder)
                  for root, _, names in os.walk(folder) for n in names)


# --------------------------------------------------------------------------------------------
# one run owns a folder (issue 34 item 1)
# --------------------------------------------------------------------------------------------


def test_a_second_pack_into_a_folder_being_packed_fails_naming_the_holder(corpus, capsys):
    # Issue 34, 1: two packs into one folder wrote the same .tmp names; one died on a rename,
    # the other wrote an index listing keys that its shards did not hold.
    out, marker = corpus["out"], str(corpus["tmp"] / "started")
    first = start(slow_pack_script(corpus, out, marker))
    try:
        wait_for(lambda: os.path.exists(marker))
        with pytest.raises(sp.FolderLockedError) as info:
            pack_feats(corpus, filter_group=GROUPS, utts_per_shard=2)
        message = str(info.value)
        assert f"pid {first.pid} on host {socket.gethostname()!r}" in message
        assert message.startswith(os.path.join(out, ".speechpipe-pack.lock"))
        # the CLI: one line, exit 2
        argv = ["pack", "--scp", corpus["scps"][0], "--labels", corpus["labels"][0],
                "--out", out, "--no-progress"]
        assert run_cli(argv) == 2
        err = capsys.readouterr().err
        assert f"in use by pid {first.pid}" in err and "Traceback" not in err
    finally:
        finish(first)
    # the first run's pack is whole: every key once, its index true to its shards
    _, digest = reference(corpus)
    assert tree_digest(out) == digest
    assert sorted(s["key"] for s in read_back(out)) == sorted(corpus["arrays"])


def test_a_stale_lock_of_a_dead_process_is_taken_over_with_a_warning(corpus):
    _, digest = reference(corpus)
    out = corpus["out"]
    os.makedirs(os.path.join(out, "10_30"))
    pid = dead_pid()
    write_lock(os.path.join(out, ".speechpipe-pack.lock"), pid)
    leftover = os.path.join(out, "10_30", f".tmp-{pid}-0123456789ab-data-00000.tar.tmp")
    with open(leftover, "wb") as f:
        f.write(b"half a shard")
    with pytest.warns(UserWarning, match=rf"taking over a stale lock of pid {pid} on host"):
        pack_feats(corpus, filter_group=GROUPS, utts_per_shard=2)
    assert tree_digest(out) == digest  # no lock, no leftover temporary file


def test_a_lock_of_another_host_is_not_taken_over(corpus):
    os.makedirs(corpus["out"])
    lock = os.path.join(corpus["out"], ".speechpipe-pack.lock")
    write_lock(lock, 1, host="node-17.cluster")
    with pytest.raises(sp.FolderLockedError,
                       match=r"locked by pid 1 on host 'node-17.cluster'.*another host: if that "
                             r"run is gone, delete .*\.speechpipe-pack\.lock"):
        pack_feats(corpus)
    assert os.listdir(corpus["out"]) == [".speechpipe-pack.lock"]


def test_two_runs_of_one_task_at_once_the_second_is_refused(corpus):
    out, marker = corpus["out"], str(corpus["tmp"] / "started")
    sp.plan_pack(corpus["scps"], corpus["labels"], out,
                 filter_group=GROUPS, utts_per_shard=2, progress=False)
    first = start(slow_pack_script(corpus, out, marker, task=(1, 2)))
    try:
        wait_for(lambda: os.path.exists(marker))
        with pytest.raises(sp.FolderLockedError, match=rf"pid {first.pid} .*pack --task 1/2"):
            sp.pack_task(out, 1, 2, progress=False)
        with pytest.raises(sp.FolderLockedError, match=rf"in use by pid {first.pid}"):
            sp.merge_pack(out)  # a task still writes
        with pytest.raises(sp.FolderLockedError, match=rf"in use by pid {first.pid}"):
            pack_feats(corpus, filter_group=GROUPS, utts_per_shard=2)
        sp.pack_task(out, 2, 2, progress=False)  # another task of the plan runs beside it
    finally:
        finish(first)
    sp.merge_pack(out)
    assert tree_digest(out) == reference(corpus)[1]


# --------------------------------------------------------------------------------------------
# plan, tasks, merge
# --------------------------------------------------------------------------------------------


def plan(corpus, out=None):
    return sp.plan_pack(corpus["scps"], corpus["labels"], out or corpus["out"],
                        filter_group=GROUPS, utts_per_shard=2, progress=False)


def test_the_plan_is_deterministic_and_writes_no_shard(corpus):
    plan(corpus, str(corpus["tmp"] / "a"))
    report = plan(corpus, str(corpus["tmp"] / "b"))
    assert report.groups == {"10_30": 3, "30_100": 6}
    assert shard_files(corpus["tmp"] / "a") == ["pack_plan.jsonl"]
    with open(corpus["tmp"] / "a" / "pack_plan.jsonl", "rb") as f, \
            open(corpus["tmp"] / "b" / "pack_plan.jsonl", "rb") as g:
        assert f.read() == g.read()


@pytest.mark.parametrize("tasks,order", [(1, [1]), (3, [3, 1, 2]), (7, [7, 5, 3, 1, 2, 4, 6])])
def test_a_job_array_writes_the_bytes_of_one_pack(corpus, tasks, order):
    _, digest = reference(corpus)
    plan(corpus)
    for task in order:
        sp.pack_task(corpus["out"], task, tasks, progress=False)
    report = sp.merge_pack(corpus["out"])
    assert tree_digest(corpus["out"]) == digest  # shards, indexes; plan and locks gone
    assert report.groups == {"10_30": 3, "30_100": 6} and report.utterances == 9


def test_a_task_killed_mid_shard_is_run_again_and_the_bytes_are_those_of_one_pack(corpus):
    _, digest = reference(corpus)
    out, marker = corpus["out"], str(corpus["tmp"] / "started")
    plan(corpus)
    sp.pack_task(out, 3, 3, progress=False)
    killed = start(slow_pack_script(corpus, out, marker, task=(2, 3), delay=0.3))

    def writing():
        return any(n.startswith(".tmp-") for _, _, names in os.walk(out) for n in names)

    wait_for(writing)
    os.kill(killed.pid, signal.SIGKILL)
    killed.communicate()
    left = shard_files(out)
    assert any(os.path.basename(n).startswith(".tmp-") for n in left)  # killed mid-shard
    assert ".speechpipe-pack-task-2-of-3.lock" in left
    with pytest.raises(sp.DataError, match=r"not as planned, so no index is written .*missing "
                                           r"\(written by task \d+ % N \+ 1"):
        sp.merge_pack(out)
    sp.pack_task(out, 1, 3, progress=False)
    with pytest.warns(UserWarning, match=rf"stale lock of pid {killed.pid}"):
        report = sp.pack_task(out, 2, 3, progress=False)
    assert report.shards_written >= 1
    again = sp.pack_task(out, 2, 3, progress=False)  # finished shards are skipped
    assert (again.shards_written, again.shards_skipped) == (0, report.shards_written
                                                              + report.shards_skipped)
    sp.merge_pack(out)
    assert tree_digest(out) == digest


def test_the_merge_checks_the_shards_against_the_plan_and_names_the_wrong_ones(corpus):
    out = corpus["out"]
    plan(corpus)
    for task in (1, 2):
        sp.pack_task(out, task, 2, progress=False)
    group = os.path.join(out, "30_100")
    os.replace(os.path.join(group, "data-00001.tar"), os.path.join(group, "data-00000.tar"))
    with pytest.raises(sp.DataError) as info:
        sp.merge_pack(out)
    message = str(info.value)
    assert "2 shard(s) of the plan are not as planned" in message
    assert f"{group}/data-00000.tar: incomplete, or not the planned utterances" in message
    assert f"{group}/data-00001.tar: missing (written by task" in message
    assert not any(n.endswith("index.jsonl") for n in shard_files(out))
    os.remove(os.path.join(group, "data-00000.tar"))
    for task in (1, 2):
        sp.pack_task(out, task, 2, progress=False)
    sp.merge_pack(out)
    assert tree_digest(out) == reference(corpus)[1]


def test_an_index_is_not_written_over_a_shard_changed_after_its_task(corpus, monkeypatch):
    # Issue 34, 1: an index listing keys b* over a data-00000.tar holding keys a*. A shard
    # replaced between its task and the index (here by the test; there by a second run) is
    # named, and no index is written.
    import speechpipe.pack.run as run_module

    real = run_module._merge

    def merge_after_a_swap(plan, report, store, sizes=None):
        group = os.path.join(corpus["out"], "30_100")
        os.replace(os.path.join(group, "data-00000.tar"), os.path.join(group, "data-00002.tar"))
        with open(os.path.join(corpus["out"], "10_30", "data-00001.tar"), "r+b") as f:
            f.truncate(1500)
        return real(plan, report, store, sizes)

    monkeypatch.setattr(run_module, "_merge", merge_after_a_swap)
    with pytest.raises(sp.DataError) as info:
        pack_feats(corpus, filter_group=GROUPS, utts_per_shard=2)
    group = os.path.join(corpus["out"], "30_100")
    assert "3 shard(s) of the plan are not as planned" in str(info.value)
    assert f"{group}/data-00000.tar: missing" in str(info.value)
    assert (f"{corpus['out']}/10_30/data-00001.tar: 1500 bytes, but its task wrote 10240: "
            "rewritten by another run?" in str(info.value))
    # (tar shards of these sizes are padded to the same 10,240 bytes: the keys tell them apart)
    assert (f"{group}/data-00002.tar: incomplete, or not the planned utterances"
            in str(info.value))
    assert not any(n.endswith("index.jsonl") for n in shard_files(corpus["out"]))


def test_task_and_merge_without_a_plan_say_what_is_missing(corpus):
    with pytest.raises(sp.MissingDataError, match=r"pack_plan.jsonl: no pack plan here: write "
                                                  r"one with 'speechpipe pack \.\.\. --plan-only"):
        sp.pack_task(corpus["out"], 1, 2, progress=False)
    with pytest.raises(ValueError, match="task must be in 1..2, got 3"):
        sp.pack_task(corpus["out"], 3, 2)


def test_a_malformed_plan_is_named_with_its_line(corpus):
    plan(corpus)
    path = os.path.join(corpus["out"], "pack_plan.jsonl")
    with open(path, encoding="utf-8") as f:
        lines = f.readlines()
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(lines[:2] + ['{"folder": "10_30", "name": 7}\n'] + lines[3:])
    with pytest.raises(sp.DataError, match=rf"{path}:3: malformed pack plan \(KeyError: "
                                           r"'keys'\); plan again with --plan-only"):
        sp.pack_task(corpus["out"], 1, 2, progress=False)
    with open(path, "w", encoding="utf-8") as f:
        f.write('{"format": "something else"}\n')
    with pytest.raises(sp.DataError, match=rf"{path}:1: not a speechpipe pack plan"):
        sp.merge_pack(corpus["out"])


def test_a_lock_file_without_details_is_taken_over_with_a_warning(corpus):
    os.makedirs(corpus["out"])
    with open(os.path.join(corpus["out"], ".speechpipe-pack.lock"), "w") as f:
        f.write("\x00garbage")
    with pytest.warns(UserWarning, match="stale lock of a run that left no details"):
        pack_feats(corpus)
    assert not os.path.exists(os.path.join(corpus["out"], ".speechpipe-pack.lock"))


def test_cli_plan_tasks_and_merge(corpus, capsys):
    _, digest = reference(corpus)
    out = corpus["out"]
    base = ["pack", "--out", out, "--no-progress"]
    assert run_cli(base + ["--scp", corpus["scps"][0], "--labels", corpus["labels"][0],
                           "--group", "10:30", "--group", "30:100", "--utts-per-shard", "2",
                           "--plan-only"]) == 0
    assert "now run --task I/N" in capsys.readouterr().out
    for task in ("2/2", "1/2"):
        assert run_cli(base + ["--task", task]) == 0
    assert run_cli(base + ["--merge"]) == 0
    assert "pack: 9 utterances" in capsys.readouterr().out
    assert tree_digest(out) == digest
    assert run_cli(base + ["--merge", "--scp", corpus["scps"][0]]) == 2
    assert "--merge reads the plan in --out: drop --scp" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        run_cli(base + ["--task", "3/2"])
    assert "expected 1 <= I <= N, got '3/2'" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------
# executors
# --------------------------------------------------------------------------------------------


def test_any_executor_writes_the_bytes_of_one_pack(corpus):
    import concurrent.futures

    _, digest = reference(corpus)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        pack_feats(corpus, filter_group=GROUPS, utts_per_shard=2, executor=pool)
    assert tree_digest(corpus["out"]) == digest
    with pytest.raises(ValueError, match="pass executor= or num_workers=2, not both"):
        pack_feats(corpus, executor=pool, num_workers=2)
    with pytest.raises(TypeError, match="executor must be a concurrent.futures.Executor"):
        pack_feats(corpus, executor="local")


def test_a_process_pool_of_two_writes_the_bytes_of_one_pack(corpus):
    _, digest = reference(corpus)
    pack_feats(corpus, filter_group=GROUPS, utts_per_shard=2, num_workers=2)
    assert tree_digest(corpus["out"]) == digest


@pytest.fixture(scope="module")
def dask_cluster():
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  host="127.0.0.1",
                                  dashboard_address="127.0.0.1:0") as cluster:
        yield cluster


def test_dask_local_cluster_writes_the_bytes_of_one_pack(corpus, dask_cluster, capsys):
    import distributed

    _, digest = reference(corpus)
    with distributed.Client(dask_cluster) as client:
        pack_feats(corpus, filter_group=GROUPS, utts_per_shard=2, executor=client)
    assert tree_digest(corpus["out"]) == digest
    out = str(corpus["tmp"] / "cli")
    assert run_cli(["pack", "--scp", corpus["scps"][0], "--labels", corpus["labels"][0],
                    "--out", out, "--group", "10:30", "--group", "30:100",
                    "--utts-per-shard", "2", "--no-progress",
                    "--dask", dask_cluster.scheduler_address]) == 0
    assert tree_digest(out) == digest


# --------------------------------------------------------------------------------------------
# a pack folder in object storage (moto's S3 server on 127.0.0.1)
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def s3():
    pytest.importorskip("moto")
    pytest.importorskip("s3fs")
    from speechpipe.testing import S3_TEST_CREDENTIALS, s3_test_storage, serve_s3

    with serve_s3() as endpoint:
        options = sp.RemoteOptions(
            storage_options=s3_test_storage(endpoint),
            retries=2, backoff=0.01)
        yield {"endpoint": endpoint, "options": options, "credentials": S3_TEST_CREDENTIALS}


def upload_pack(s3, local, bucket):
    """Upload a grouped pack folder to s3://bucket/corpus/shards/<group>/; return its URL."""
    from speechpipe.testing import upload_folder

    for group in sorted(os.listdir(local)):
        upload_folder(s3["endpoint"], os.path.join(local, group), bucket,
                      f"corpus/shards/{group}")
    return f"s3://{bucket}/corpus/shards"


def test_a_pack_folder_url_stands_for_every_length_group(corpus, s3):
    # Issue 30: s3://bucket/corpus/shards was taken as one shard, then "no shard index here"
    # although every group's index was there.
    from speechpipe.pipes.sources import expand_patterns

    local, _ = reference(corpus)
    url = upload_pack(s3, local, "folder-url")
    index = sp.ShardIndex.read(url, remote=s3["options"])
    assert index.shards == sp.ShardIndex.read(local).shards
    expected = [p.replace(local, url) for p in sp.ShardIndex.read(local).paths()]
    assert index.paths() == expected
    assert expand_patterns(url, remote=s3["options"]) == sorted(expected)
    read = sp.ShardReadOptions(remote=s3["options"])
    keys = [s["key"] for s in sp.IterableWrapper([url]).sharded_shuffle(
        buffer_size=2, index=True, seed=0, read_options=read)]
    assert sorted(keys) == sorted(corpus["arrays"])


def test_no_index_in_a_bucket_folder_names_what_is_missing(s3):
    with pytest.raises(sp.MissingDataError) as info:
        sp.ShardIndex.read("s3://folder-url/nowhere", remote=s3["options"])
    assert str(info.value) == (
        "s3://folder-url/nowhere: no shard index here: neither "
        "s3://folder-url/nowhere/index.jsonl nor a length group's "
        "(s3://folder-url/nowhere/*/index.jsonl); write one with 'speechpipe pack' (--out may "
        "be this URL), or upload the whole pack folder")


def test_stats_reads_a_pack_folder_url_with_storage_options(corpus, s3, capsys):
    from speechpipe.cli import main

    local, _ = reference(corpus)
    url = upload_pack(s3, local, "stats-url")
    argv = ["stats", url, "--no-histogram", "--storage-option",
            f"endpoint_url={s3['endpoint']}", "--storage-option",
            f"key={s3['credentials']['key']}", "--storage-option",
            f"secret={s3['credentials']['secret']}"]
    assert main(argv) == 0
    remote = capsys.readouterr().out
    assert main(["stats", local, "--no-histogram"]) == 0
    assert remote.replace(url, local) == capsys.readouterr().out
    assert "utterances          9" in remote
    assert f"length group        {url}/30_100/: 6 utterances" in remote


# --------------------------------------------------------------------------------------------
# straight into object storage
# --------------------------------------------------------------------------------------------


def bucket_files(s3, url, options=None):
    """``{relative name: bytes}`` of every object under ``url``."""
    from speechpipe.remote import remote_filesystem

    fs, path = remote_filesystem(url, options or s3["options"])
    fs.invalidate_cache()
    return {p[len(path) + 1:]: fs.cat_file(p) for p in sorted(fs.find(path))}


def local_files(folder):
    """``{relative name: bytes}`` of a local pack, without the indexes' mapped tables (a cache
    that a reader builds beside a local index; none is written into a bucket)."""
    out = {}
    for name in shard_files(folder):
        if name.endswith(".spmap"):
            continue
        with open(os.path.join(folder, name), "rb") as f:
            out[name.replace(os.sep, "/")] = f.read()
    return out


def make_bucket(s3, name):
    import boto3

    boto3.client("s3", endpoint_url=s3["endpoint"], region_name="us-east-1",
                 aws_access_key_id=s3["credentials"]["key"],
                 aws_secret_access_key=s3["credentials"]["secret"]).create_bucket(Bucket=name)


def test_pack_straight_into_a_bucket_writes_the_bytes_of_a_local_pack(corpus, s3):
    local, _ = reference(corpus)
    make_bucket(s3, "pack-out")
    url = "s3://pack-out/corpus"
    report = pack_feats(corpus, out=url, filter_group=GROUPS, utts_per_shard=2,
                        remote=s3["options"])
    assert report.shards_written == 5
    assert bucket_files(s3, url) == local_files(local)  # shards and indexes, nothing else
    again = pack_feats(corpus, out=url, filter_group=GROUPS, utts_per_shard=2,
                       remote=s3["options"])
    assert (again.shards_written, again.shards_skipped) == (0, 5)
    # and it reads back as a folder
    read = sp.ShardReadOptions(remote=s3["options"])
    keys = [s["key"] for s in sp.IterableWrapper([url]).sharded_shuffle(
        buffer_size=2, index=True, seed=0, read_options=read)]
    assert sorted(keys) == sorted(corpus["arrays"])


def test_a_job_array_into_a_bucket_through_the_cli(corpus, s3, capsys):
    local, _ = reference(corpus)
    make_bucket(s3, "array-out")
    url = "s3://array-out/corpus"
    base = ["pack", "--out", url, "--no-progress", "--storage-option",
            f"endpoint_url={s3['endpoint']}", "--storage-option",
            f"key={s3['credentials']['key']}", "--storage-option",
            f"secret={s3['credentials']['secret']}"]
    assert run_cli(base + ["--scp", corpus["scps"][0], "--labels", corpus["labels"][0],
                           "--group", "10:30", "--group", "30:100", "--utts-per-shard", "2",
                           "--plan-only"]) == 0
    assert sorted(bucket_files(s3, url)) == ["pack_plan.jsonl"]
    for task in ("3/3", "1/3"):
        assert run_cli(base + ["--task", task]) == 0
    assert run_cli(base + ["--merge"]) == 2
    assert "missing (written by task" in capsys.readouterr().err
    assert run_cli(base + ["--task", "2/3"]) == 0
    assert run_cli(base + ["--merge"]) == 0
    assert bucket_files(s3, url) == local_files(local)


def test_the_object_store_gone_during_a_write_is_named_and_a_rerun_completes(
        corpus, s3, monkeypatch):
    from moto.server import ThreadedMotoServer

    from speechpipe.pack.storage import Storage

    local, _ = reference(corpus)
    make_bucket(s3, "gone")
    url = "s3://gone/corpus"
    # a second server of the same buckets (moto keeps them per process), stopped mid-pack
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    options = sp.RemoteOptions(
        storage_options={**s3["options"].storage_options, "endpoint_url": f"http://{host}:{port}"},
        retries=2, backoff=0.01)
    real = Storage.publish
    published = []

    def publish(self, tmp, final):
        if len(published) == 2:
            server.stop()  # the store goes away after two shards
        real(self, tmp, final)
        published.append(final)

    monkeypatch.setattr(Storage, "publish", publish)
    try:
        with pytest.raises(sp.DataError) as info:
            pack_feats(corpus, out=url, filter_group=GROUPS, utts_per_shard=2,
                       remote=options)
    finally:
        if len(published) < 2:
            server.stop()
    message = str(info.value)
    assert message.startswith(f"{url}/30_100/data-00000.tar: cannot upload the shard after 2 "
                              "attempts")
    monkeypatch.setattr(Storage, "publish", real)
    assert sorted(bucket_files(s3, url)) == ["10_30/data-00000.tar", "10_30/data-00001.tar"]
    report = pack_feats(corpus, out=url, filter_group=GROUPS, utts_per_shard=2,
                        remote=s3["options"])
    assert (report.shards_written, report.shards_skipped) == (3, 2)
    assert bucket_files(s3, url) == local_files(local)


def _slow_writes(seconds):
    import speechpipe.pipes.shards._writer as writer

    real = getattr(writer, "_real_encode_field", writer.encode_field)
    writer._real_encode_field = real

    def slow(*args, **kwargs):
        time.sleep(seconds)
        return real(*args, **kwargs)

    writer.encode_field = slow
    return os.getpid()


def test_a_dask_worker_killed_mid_task_the_task_reruns_and_the_bytes_are_the_same(corpus):
    import threading

    distributed = pytest.importorskip("distributed")
    _, digest = reference(corpus)
    out = corpus["out"]
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  host="127.0.0.1",
                                  dashboard_address="127.0.0.1:0") as cluster, \
            distributed.Client(cluster) as client:
        pids = client.run(_slow_writes, 0.2)  # every member takes 0.2 s in the workers
        errors = []

        def pack():
            try:
                pack_feats(corpus, filter_group=GROUPS, utts_per_shard=2, executor=client)
            except BaseException as exc:  # noqa: BLE001 - shown by the assertion below
                errors.append(exc)

        thread = threading.Thread(target=pack)
        thread.start()

        def writing():
            return [n for _, _, names in os.walk(out) for n in names if n.startswith(".tmp-")]

        wait_for(writing)
        victim = int(writing()[0].split("-")[1])  # .tmp-<pid>-...: the worker writing it
        assert victim in pids.values()
        os.kill(victim, signal.SIGKILL)
        thread.join(timeout=180)
        assert not thread.is_alive() and not errors, errors
    assert tree_digest(out) == digest  # the killed attempt's temporary file is gone too
