"""docs/preparation.md runs as written: its python blocks, top to bottom, in a fresh
interpreter whose working directory is an empty temporary folder (moto's S3 server and a Dask
LocalCluster on 127.0.0.1 stand in for a bucket and a cluster)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest

import speechpipe

PAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "docs",
                    "preparation.md")


def python_blocks(path):
    with open(path, encoding="utf-8") as f:
        return re.findall(r"^```python\n(.*?)^```", f.read(), flags=re.S | re.M)


def test_the_preparation_page_runs_and_both_roads_give_the_same_bytes(tmp_path):
    pytest.importorskip("moto")
    pytest.importorskip("distributed")
    code = "\n".join(python_blocks(PAGE))
    root = os.path.dirname(os.path.dirname(os.path.abspath(speechpipe.__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    # -c: no main file, so that the cluster's spawned workers do not run the page again (a
    # page run as a script file needs the usual if __name__ == "__main__": guard)
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code], text=True, capture_output=True,
                          cwd=tmp_path, env=env, timeout=300)
    print(f"docs/preparation.md ran in {time.monotonic() - started:.1f} s")
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "librispeech_samples_dev-clean.jsonl.gz" in out
    assert "objects, identical" in out
    assert "utterances in 2 length groups" in out
    assert "'meta'" in out and "'text'" in out
    assert "36 utterances, 4 speakers" in out and "the same manifest on Dask" in out
    assert "frames, the statistics of one run" in out
