"""``prepare --verify`` beyond one process (issue 30): on any executor (a thread or process pool,
Dask's LocalCluster) and as a job array (``--plan-only``, ``--task I/N``, ``--merge``).

Invariant: whatever the executor, the number of tasks, their order, or a task killed and run
again, the outcome is one run's: the same error listing every fault of every kind, the same
exit status, and with the flags that skip them the same manifest bytes and report.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile

from speechpipe.cli.prepare import add_command as add_prepare_command
from speechpipe.errors import DataError, MissingDataError
from speechpipe.recipes.kaldi_dir import prepare_kaldi_dir

SKIP_FLAGS = ["--on-error", "skip", "--empty-text", "skip"]


def _tone(seconds: float, rate: int = 16000) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * 220.0 * t)).astype(np.float32)


@pytest.fixture
def faulty(tmp_path):
    """A Kaldi data folder of 12 utterances with one fault of each kind: a missing file, a
    truncated FLAC, a WAV with a NaN sample, an empty transcript."""
    audio = tmp_path / "audio"
    audio.mkdir()
    table, text = {}, {}
    for i in range(12):
        key = f"u{i:02d}"
        path = audio / f"{key}.flac"
        soundfile.write(path, _tone(2.0 + 0.1 * i), 16000)
        table[key], text[key] = str(path), f"WORDS {i}"
    table["u03"] = str(audio / "gone.flac")  # missing
    data = (audio / "u05.flac").read_bytes()
    (audio / "u05.flac").write_bytes(data[: len(data) // 2])  # truncated
    nan = _tone(0.7)
    nan[1000] = np.nan
    soundfile.write(audio / "u07.wav", nan, 16000, subtype="FLOAT")
    table["u07"] = str(audio / "u07.wav")  # non-finite
    text["u09"] = ""  # empty transcript
    folder = tmp_path / "data" / "train"
    folder.mkdir(parents=True)
    (folder / "wav.scp").write_text("".join(f"{k} {v}\n" for k, v in sorted(table.items())))
    (folder / "text").write_text("".join(f"{k} {v}\n".replace(" \n", "\n")
                                         for k, v in sorted(text.items())))
    return folder


def prepare_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser(prog="speechpipe")
    add_prepare_command(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["prepare", *argv, "--no-progress"])
    status = args.func(args)
    out, err = capsys.readouterr()
    return status, out, err


def fault_message(data, out, **kwargs) -> str:
    with pytest.raises(DataError) as caught:
        prepare_kaldi_dir(data, out, progress=False, verify=True, **kwargs)
    return str(caught.value)


def folder_bytes(folder) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(Path(folder).iterdir()) if p.is_file()}


def test_one_run_reports_every_planted_fault(faulty, tmp_path):
    message = fault_message(faulty, tmp_path / "m")
    assert "verification found 4 fault(s) of 4 kind(s):" in message
    for kind in ("empty transcript: 1", "missing audio: 1", "truncated audio: 1",
                 "non-finite audio: 1"):
        assert kind in message


@pytest.mark.slow
def test_any_executor_reports_what_one_run_reports(faulty, tmp_path):
    expected = fault_message(faulty, tmp_path / "one")
    one = prepare_kaldi_dir(faulty, tmp_path / "one", progress=False, verify=True,
                            on_error="skip", empty_text="skip")
    spawn = multiprocessing.get_context("spawn")
    with concurrent.futures.ThreadPoolExecutor(3) as threads, \
            concurrent.futures.ProcessPoolExecutor(2, mp_context=spawn) as processes:
        for name, executor in (("threads", threads), ("processes", processes)):
            assert fault_message(faulty, tmp_path / name, executor=executor) == expected
            out = prepare_kaldi_dir(faulty, tmp_path / name, progress=False, verify=True,
                                    on_error="skip", empty_text="skip", executor=executor)
            assert out.reports["train"].report().replace(str(tmp_path / name),
                                                         str(tmp_path / "one")) == \
                one.reports["train"].report()
            assert folder_bytes(out["train"].parent)[out["train"].name] == \
                folder_bytes(one["train"].parent)[one["train"].name]


@pytest.mark.slow
def test_a_dask_local_cluster_reports_what_one_run_reports(faulty, tmp_path, capsys):
    distributed = pytest.importorskip("distributed")
    status, _, expected = prepare_cli(["kaldi_dir", str(faulty), str(tmp_path / "one"),
                                       "--verify"], capsys)
    assert status == 2 and "verification found 4 fault(s) of 4 kind(s)" in expected
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  host="127.0.0.1", dashboard_address="127.0.0.1:0") as cluster:
        with distributed.Client(cluster) as client:
            got = fault_message(faulty, tmp_path / "api", executor=client)
            assert "speechpipe prepare: error: " + got + "\n" == expected
        status, _, err = prepare_cli(["kaldi_dir", str(faulty), str(tmp_path / "one"),
                                      "--verify", "--dask", cluster.scheduler_address], capsys)
        assert (status, err) == (2, expected)
        runs = [prepare_cli(["kaldi_dir", str(faulty), str(tmp_path / name), "--verify",
                             *SKIP_FLAGS, *extra], capsys)
                for name, extra in (("one", []), ("dask", ["--dask",
                                                          cluster.scheduler_address]))]
    assert runs[0][0] == runs[1][0] == 0
    assert runs[1][1].replace(str(tmp_path / "dask"), str(tmp_path / "one")) == runs[0][1]
    assert folder_bytes(tmp_path / "dask")["kaldi_dir_samples_train.jsonl.gz"] == \
        folder_bytes(tmp_path / "one")["kaldi_dir_samples_train.jsonl.gz"]


SLOW_TASK = """
import sys, time
import speechpipe.recipes._checks as checks
real = checks.check_audio_file
def slow(path):
    open({marker!r}, "a").close()
    time.sleep(0.3)
    return real(path)
checks.check_audio_file = slow
from speechpipe.cli import main
sys.exit(main({argv!r}))
"""


def start_slow_task(argv: list[str], marker: Path) -> subprocess.Popen:
    import speechpipe

    root = os.path.dirname(os.path.dirname(os.path.abspath(speechpipe.__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    code = textwrap.dedent(SLOW_TASK).format(marker=str(marker), argv=argv)
    return subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_a_job_array_of_3_with_a_task_killed_reports_what_one_run_reports(faulty, tmp_path,
                                                                        capsys):
    one = ["kaldi_dir", str(faulty), str(tmp_path / "one"), "--verify"]
    status, _, expected = prepare_cli(one, capsys)
    assert status == 2 and "verification found 4 fault(s) of 4 kind(s)" in expected
    out = tmp_path / "array"
    array = ["kaldi_dir", str(faulty), str(out), "--verify"]
    status, printed, _ = prepare_cli(array + ["--plan-only"], capsys)
    assert status == 0 and "train: planned: 12 audio file(s) to verify" in printed
    assert not (out / "kaldi_dir_samples_train.jsonl.gz").exists()
    assert prepare_cli(array + ["--task", "3/3"], capsys)[0] == 0
    marker = tmp_path / "decoding"
    killed = start_slow_task(["prepare", *array, "--task", "2/3", "--no-progress"], marker)
    deadline = time.monotonic() + 60
    while not marker.exists():
        assert time.monotonic() < deadline and killed.poll() is None, killed.communicate()
        time.sleep(0.02)
    os.kill(killed.pid, signal.SIGKILL)
    killed.communicate()
    assert not (out / "kaldi_dir_verify_train.task-2-of-3.jsonl.gz").exists()
    # the merge names what is missing (task 1 has not run, task 2 was killed)
    status, _, err = prepare_cli(array + ["--merge"], capsys)
    assert status == 2 and "are not verified yet: task(s) 1/3, 2/3 have not written" in err
    for task in ("2/3", "1/3", "1/3"):  # the rerun of the killed task; a finished one again
        status, printed, _ = prepare_cli(array + ["--task", task], capsys)
        assert status == 0 and f"task {task}: 4 audio file(s) verified" in printed
    status, _, err = prepare_cli(array + ["--merge"], capsys)
    assert (status, err) == (2, expected.replace(str(tmp_path / "one"), str(out)))
    # the faults named, the same merge with the flags that skip them: one run's manifest
    status, printed, _ = prepare_cli(array + ["--merge"] + SKIP_FLAGS, capsys)
    status_one, printed_one, _ = prepare_cli(one + SKIP_FLAGS, capsys)
    assert (status, printed) == (status_one, printed_one.replace(str(tmp_path / "one"),
                                                                 str(out)))
    assert "skipped 4: empty transcript: 1" in printed and "8 utterances" in printed
    got, want = folder_bytes(out), folder_bytes(tmp_path / "one")
    assert sorted(got) == sorted(want)  # the plan and the tasks' results are gone
    for name in ("kaldi_dir_samples_train.jsonl.gz", "kaldi_dir_samples_train.prepared.json"):
        assert got[name] == want[name]  # (the row table records its manifest's mtime)
    # merged again: up to date, as one run again
    assert prepare_cli(array + ["--merge"] + SKIP_FLAGS, capsys)[1] == \
        prepare_cli(one + SKIP_FLAGS, capsys)[1].replace(str(tmp_path / "one"), str(out))


def test_the_steps_need_verify_and_a_plan(faulty, tmp_path, capsys):
    with pytest.raises(ValueError, match=r"--task 1/2 shares out the verification"):
        prepare_kaldi_dir(faulty, tmp_path / "m", progress=False, step=(1, 2))
    with pytest.raises(ValueError, match="executor= decodes the files of the verification"):
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            prepare_kaldi_dir(faulty, tmp_path / "m", progress=False, executor=pool)
    with pytest.raises(ValueError, match="step must be None, 'plan', 'merge' or a task"):
        prepare_kaldi_dir(faulty, tmp_path / "m", progress=False, verify=True, step=(3, 2))
    with pytest.raises(MissingDataError, match=r"no verification plan for kaldi_dir part "
                                               r"'train'.*--verify --plan-only' first"):
        prepare_kaldi_dir(faulty, tmp_path / "m", progress=False, verify=True, step="merge")
    status, _, err = prepare_cli(["kaldi_dir", str(faulty), str(tmp_path / "m"), "--verify",
                                  "--task", "1/2"], capsys)
    assert status == 2 and "no verification plan" in err


def test_a_merge_with_other_recipe_options_than_the_plan_is_refused(faulty, tmp_path):
    prepare_kaldi_dir(faulty, tmp_path / "m", progress=False, verify=True, step="plan")
    prepare_kaldi_dir(faulty, tmp_path / "m", progress=False, verify=True, step=(1, 1))
    with pytest.raises(ValueError, match=r"the verification plan was made with "
                                         r"on_mismatch='error' \(this merge: 'skip'\): merge "
                                         r"with the plan's options, or plan again"):
        prepare_kaldi_dir(faulty, tmp_path / "m", progress=False, verify=True, step="merge",
                          on_mismatch="skip")
