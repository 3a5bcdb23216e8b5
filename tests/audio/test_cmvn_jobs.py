"""CMVN statistics beyond one process (issue 30): ``compute_cmvn_stats(parts, executor=)`` and
``speechpipe cmvn --dask`` / ``--task I/N`` + ``--merge``.

Invariant: whatever the executor or the number of parts or tasks, the statistics are the
one-process ones: the frame count exactly, the float64 sums and sums of squares to float64
rounding (the partial sums are added in another order: ``rtol=1e-12`` here, the observed
difference being around ``1e-16``).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing

import kaldiio
import numpy as np
import pytest

from speechpipe.cli.cmvn import add_command as add_cmvn_command
from speechpipe.errors import DataError
from speechpipe.pipes.audio import CmvnStats, compute_cmvn_stats, merge_cmvn_stats

RTOL = 1e-12  # float64 rounding of sums added in another order


def features(n=40, dim=13, channels=None, seed=0):
    rng = np.random.default_rng(seed)
    shape = (dim,) if channels is None else (channels, dim)
    return [(rng.normal(3.0, 2.0, size=(int(rng.integers(5, 60)), *shape)) * 10
             ).astype(np.float32) for _ in range(n)]


def split(items, parts):
    return [items[len(items) * i // parts:len(items) * (i + 1) // parts] for i in range(parts)]


def same(got: CmvnStats, want: CmvnStats) -> None:
    assert got.count == want.count
    np.testing.assert_allclose(got.sum, want.sum, rtol=RTOL)
    np.testing.assert_allclose(got.sum_sq, want.sum_sq, rtol=RTOL)


@pytest.mark.parametrize("channels", [None, 2])
def test_parts_on_a_thread_pool_equal_one_process_whatever_their_number(channels):
    feats = features(channels=channels)
    per_channel = channels is not None
    want = compute_cmvn_stats(feats, progress=False, per_channel=per_channel)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        for parts in (1, 2, 3, 7, 50):  # 50 > 40 utterances: some parts are empty
            got = compute_cmvn_stats(split(feats, parts), executor=pool, progress=False,
                                     per_channel=per_channel)
            same(got, want)


@pytest.mark.slow
def test_parts_on_a_process_pool_and_a_dask_local_cluster_equal_one_process():
    distributed = pytest.importorskip("distributed")
    feats = features()
    want = compute_cmvn_stats(feats, progress=False)
    spawn = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(2, mp_context=spawn) as pool:
        same(compute_cmvn_stats(split(feats, 3), executor=pool, progress=False), want)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  host="127.0.0.1", dashboard_address="127.0.0.1:0") as cluster:
        with distributed.Client(cluster) as client:
            same(compute_cmvn_stats(split(feats, 3), executor=client, progress=False), want)


def test_parts_of_different_dimensions_are_named():
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        with pytest.raises(DataError, match=r"part 2 has features of shape \(4,\).*part 1 of "
                                            r"\(13,\)"):
            compute_cmvn_stats([features(3), features(3, dim=4)], executor=pool,
                               progress=False)
        with pytest.raises(ValueError, match="no frames to accumulate"):
            compute_cmvn_stats([[], []], executor=pool, progress=False)
    assert merge_cmvn_stats([None, CmvnStats(1, np.ones(2), np.ones(2))]).count == 1


def cmvn_cli(argv, capsys):
    parser = argparse.ArgumentParser(prog="speechpipe")
    add_cmvn_command(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["cmvn", *argv, "--no-progress"])
    status = args.func(args)
    out, err = capsys.readouterr()
    return status, out, err


@pytest.fixture
def scp(tmp_path):
    mats = {f"utt{i:02d}": m for i, m in enumerate(features(n=20, dim=5, seed=1))}
    ark, table = str(tmp_path / "feats.ark"), str(tmp_path / "feats.scp")
    kaldiio.save_ark(ark, mats, scp=table)
    return table


@pytest.mark.parametrize("tasks,order", [(1, [1]), (3, [3, 1, 2]), (25, list(range(25, 0, -1)))])
def test_a_cli_job_array_gives_the_statistics_of_one_run(scp, tmp_path, capsys, tasks, order):
    one, array = str(tmp_path / "one.json"), str(tmp_path / "array.json")
    assert cmvn_cli(["--scp", scp, "--out", one], capsys)[0] == 0
    for task in order:
        status, out, _ = cmvn_cli(["--scp", scp, "--out", array, "--task", f"{task}/{tasks}"],
                                  capsys)
        assert status == 0 and f"--task {task}/{tasks}" in out
    status, out, _ = cmvn_cli(["--scp", scp, "--out", array, "--merge"], capsys)
    assert status == 0 and "frames of dim 5" in out
    same(CmvnStats.load(array), CmvnStats.load(one))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["array.json", "feats.ark",
                                                          "feats.scp", "one.json"]


def test_a_cli_merge_names_the_missing_tasks(scp, tmp_path, capsys):
    out = str(tmp_path / "s.json")
    status, _, err = cmvn_cli(["--scp", scp, "--out", out, "--merge"], capsys)
    assert status == 2 and "no partial statistics to merge" in err
    assert cmvn_cli(["--scp", scp, "--out", out, "--task", "2/4"], capsys)[0] == 0
    status, _, err = cmvn_cli(["--scp", scp, "--out", out, "--merge"], capsys)
    assert status == 2 and "task(s) 1/4, 3/4, 4/4 have not written their partial" in err
    with open(f"{out}.task-2-of-4.json") as f:
        assert json.load(f)["frame_num"] > 0


@pytest.mark.slow
def test_the_cli_on_dask_and_as_a_job_array_on_the_demo_corpus(tmp_path, capsys):
    distributed = pytest.importorskip("distributed")
    one = str(tmp_path / "one.json")
    assert cmvn_cli(["--out", one], capsys)[0] == 0  # fbank of the shipped LibriSpeech demo
    for task in (2, 1):
        assert cmvn_cli(["--out", str(tmp_path / "array.json"), "--task", f"{task}/2"],
                        capsys)[0] == 0
    assert cmvn_cli(["--out", str(tmp_path / "array.json"), "--merge"], capsys)[0] == 0
    same(CmvnStats.load(tmp_path / "array.json"), CmvnStats.load(one))
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  host="127.0.0.1", dashboard_address="127.0.0.1:0") as cluster:
        status, out, _ = cmvn_cli(["--out", str(tmp_path / "dask.json"), "--dask",
                                   cluster.scheduler_address], capsys)
    assert status == 0
    same(CmvnStats.load(tmp_path / "dask.json"), CmvnStats.load(one))


def test_manifest_and_shard_sources_as_a_job_array(scp, tmp_path, capsys):
    import speechpipe as sp

    labels = tmp_path / "text"
    labels.write_text("".join(f"utt{i:02d} words\n" for i in range(20)))
    sp.pack_data(scp, str(labels), str(tmp_path / "shards"), utts_per_shard=6, progress=False)
    manifests = sp.get_recipe("librispeech").prepare_librispeech(
        sp.DEMO_CORPUS, tmp_path / "m", parts="dev-clean", progress=False)
    sources = {"shards": ["--shards", str(tmp_path / "shards" / "data-*.tar")],
               "manifest": ["--manifest", str(manifests["dev-clean"])]}
    for name, source in sources.items():
        one, array = str(tmp_path / f"{name}.json"), str(tmp_path / f"{name}-array.json")
        assert cmvn_cli([*source, "--out", one], capsys)[0] == 0
        for task in (3, 1, 2):
            assert cmvn_cli([*source, "--out", array, "--task", f"{task}/3"], capsys)[0] == 0
        assert cmvn_cli([*source, "--out", array, "--merge"], capsys)[0] == 0
        same(CmvnStats.load(array), CmvnStats.load(one))
