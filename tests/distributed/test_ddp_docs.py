"""docs/ddp.md runs: the page top to bottom in one process, then its training script under
``torchrun --nproc-per-node=2`` on the audio shards the page packed (issue 32.2).

Invariants: the page's blocks run in a fresh interpreter from an empty folder; under torchrun
both ranks take the same steps every epoch, each prints its own figures and the world's totals,
the totals are the same on both ranks and cover the 36 utterances of the demo corpus once
(yielded or dropped; the plan's target "min" repeats nothing).
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys

import pytest

PAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "docs",
                    "ddp.md")
UTTERANCES = 36  # the demo corpus's dev-clean


def python_blocks(path: str) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return re.findall(r"```python\n(.*?)```", f.read(), re.S)


def run_python(code: str, cwd: str, timeout: float) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(PAGE)))
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, text=True,
                          capture_output=True, timeout=timeout)


@pytest.fixture(scope="module")
def page_run(tmp_path_factory):
    """The whole page, top to bottom, in a fresh interpreter in an empty folder."""
    folder = tmp_path_factory.mktemp("ddp_page")
    done = run_python("\n".join(python_blocks(PAGE)), str(folder), timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return folder, done.stdout


@pytest.mark.timeout(300)
def test_the_page_runs_top_to_bottom_and_prints_what_it_says(page_run):
    _, out = page_run
    lines = out.splitlines()
    assert lines[0] == f"seconds {UTTERANCES}"
    assert "the shard index counts seconds but the constraint measures" in out
    planned = ast.literal_eval(lines[1])
    steps, seen, world = (int(x) for x in lines[3].split())
    assert steps == planned[0] and seen == world == UTTERANCES  # one rank: nothing dropped
    # the script, run as one process by the page, prints its totals for 2 epochs
    assert sum(line.startswith("rank 0 epoch ") for line in lines) == 2


@pytest.mark.timeout(420)
def test_the_training_script_runs_under_torchrun_on_two_ranks_with_every_ranks_totals(page_run):
    folder, _ = page_run
    script = next(b for b in python_blocks(PAGE) if b.startswith("# train_ddp.py"))
    (folder / "train_ddp.py").write_text(script)
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(PAGE)),
               GLOO_SOCKET_IFNAME=os.environ.get("GLOO_SOCKET_IFNAME", "lo"),
               OMP_NUM_THREADS="1")
    # --standalone: the rendezvous binds localhost on a free port (torchrun's localhost:0)
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node=2", "train_ddp.py"], cwd=str(folder), env=env,
                          text=True, capture_output=True, timeout=360)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    # two ranks' lines may meet on one line of the captured output: no greedy match
    found = re.findall(r"rank (\d) epoch (\d): (\d+) steps, (\d+) samples, dropped (\d+), "
                       r"repeated (\d+); world: (\{[^{}]*\})", done.stdout)
    assert sorted((r, e) for r, e, *_ in found) == [("0", "0"), ("0", "1"), ("1", "0"),
                                                     ("1", "1")], done.stdout
    for epoch in "01":
        ranks = [f for f in found if f[1] == epoch]
        assert len({f[2] for f in ranks}) == 1  # the same steps on both ranks
        worlds = [ast.literal_eval(f[6]) for f in ranks]
        assert worlds[0] == worlds[1]  # every rank holds the world's totals
        world = worlds[0]
        assert world["samples"] == sum(int(f[3]) for f in ranks)
        assert world["dropped_samples"] == sum(int(f[4]) for f in ranks)
        assert world["samples"] + world["dropped_samples"] == UTTERANCES  # each once
        assert world["repeated_samples"] == 0  # target "min": nothing repeated
