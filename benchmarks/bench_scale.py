"""Scale: what starting a pass costs per process as the corpus grows (issue 28).

Synthetic corpora shaped like WenetSpeech L (durations drawn from its published percentiles,
``speechpipe.testing.sample_durations("wenetspeech-l")``; short rows with a key, a duration,
an audio path and a text) at 0.1M, 1M, 4M and 15M utterances, written once under ``--root``
and reused. Three measurements:

- **manifest** (every recipe's train builder): ``manifest_samples([m.jsonl.gz])
  .filter_by_duration(1, 15).shuffle_samples(seed) .bucket_by_length(2000)
  .block_batch(PaddedArea(200 s))`` in ``build_loader`` -- ``train_pipeline`` without the
  audio (rows only, so the figures are the planning's). Measured in a fresh process each:
  the time from building the pipeline to the first batch with 0 and 2 workers; with 0 workers
  the process's memory growth by then (``/proc/self/smaps_rollup``: ``Anonymous`` -- the
  process's own --, ``Private_*`` and ``Shared_*`` of the mapped files); and the resume
  latency: ``load_state_dict`` of a state saved at step 50 to the first resumed batch.
- **shard index** (``--roads index``): ``ShardIndex.read`` of a 2000-utterance-per-shard
  ``index.jsonl`` (time and memory; its mapped table is built first, as ``pack`` writes it),
  then planning an epoch for 64 ranks x 8 workers from it in the same fresh process:
  ``sharded_shuffle(index=True).epoch_plans(world_size=64, num_workers=8)`` and
  ``StepPlanner(pipe, PaddedArea(200 s, length="duration"), num_workers=8,
  world_size=64).plan()``, and the memory after planning.
- **shard road** (``--roads shards``): ``sharded_shuffle(buffer_size=2000, index=True)
  .durations_from_index().bucket_by_length(2000).block_batch(PaddedArea(200 s))`` in
  ``build_loader``, measured as the manifest road (first batch with 0 and 2 workers, memory,
  resume at step 50), over the same index with real tiny tar shards (the index's keys, a 1-byte
  field) for the first 6 shards each process reads in epoch 0 (:func:`make_real_shards`); the
  index's other shards need not exist.

- **planned road** (``--roads planned``, issue 29): ``plan_batches`` over the manifest's rows
  (``read_manifest_files().plan_batches(60 s, streams=8, boundaries=[2, 4, 8])``) and over
  the shard index (``PaddedArea(6000 frames)``, edges 200/400/800), as ``bench_plan_memory``
  plans them. Per process, in a fresh process each: reading the metadata (``road()``), the
  data's digest (``plan_key()``, cache only) and ``plan(0)``, for three contenders taking
  turns in each round: ``off`` (``plan_cache=False``: every process plans), ``first`` (an
  empty cache folder: this process plans and writes the plan) and ``later`` (a process after
  it: maps the plan, its CRC-32s checked); the plan file's size; the CRC-32 of the node-cached
  tables a process checks when it first maps one (the row table with its text, the duration
  selection, the index table); and over the rows, the time from building the pipeline to the
  first batch under ``build_loader(num_workers=2)``, cold (``off``, ``first``) and warm
  (``later``).

Contenders, side by side in one run: ``after`` (this checkout), ``before`` (``--base DIR``: an
older speechpipe, e.g. ``git archive bb089fd speechpipe | tar -x -C DIR``), and lhotse's lazy
manifests (``CutSet.from_jsonl_lazy`` + ``DynamicBucketingSampler(max_duration=200,
num_buckets=30, shuffle=True)``, the same rows as MonoCuts) on the manifest road, up to
``--lhotse-max`` rows (lhotse's Shar shards are not run: no contender on the shard road).
Code older than bb089fd held the whole manifest in every process (about 1.4 KB per row):
``--base-max`` keeps it off the sizes this machine cannot hold; bb089fd holds about 130 B per
utterance of a shard index in every process (``--index-base-max``).

    python -m benchmarks.bench_scale --base /tmp/sp_bb089fd [--sizes 0.1M,1M,4M,15M]
    python -m benchmarks bench_scale --tiny   # 2,000 rows, this checkout, one run
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PER_SHARD = 2000
RESUME_AT = 50
CHUNK = 250_000

_SMAPS = """
def smaps():
    with open("/proc/self/smaps_rollup") as f:
        fields = dict(line.split(":", 1) for line in f if ":" in line)
    keys = ("Rss", "Anonymous", "Private_Clean", "Private_Dirty", "Shared_Clean",
            "Shared_Dirty")
    return {k: int(fields[k].split()[0]) * 1024 for k in keys}

def grown(a, b):
    return {k: b[k] - a[k] for k in a}

def worker_memory(main_before):
    # each DataLoader worker's /proc/<pid>/smaps_rollup, read from the main process (the
    # workers are its children). A forked worker starts with every page shared with the main
    # process: its Private_* are what it touched or allocated since; "Anonymous_grown" is its
    # Anonymous less the main process's just before the workers started.
    import os
    pid = os.getpid()
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        children = [int(c) for c in f.read().split()]
    out = []
    for child in children:
        try:
            with open(f"/proc/{child}/smaps_rollup") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        got = {k: int(fields[k].split()[0]) * 1024 for k in main_before}
        got["Anonymous_grown"] = got["Anonymous"] - main_before["Anonymous"]
        out.append(got)
    return out
"""

_MANIFEST_CHILD = _SMAPS + """
import inspect, json, sys, time
spec = json.loads(sys.argv[1])
before = smaps()
import torch
import speechpipe as sp
from speechpipe.recipes._pipelines import manifest_samples
from speechpipe.sample import sample_duration
imported = smaps()
t0 = time.perf_counter()
c = sp.PaddedArea(budget=200.0, length=sample_duration)
# the budget's keyword: budget= since 0.2's one spelling, constraint= in older trees (--base)
kw = ("budget" if "budget" in inspect.signature(
    sp.pipes.batching.LengthBucketerIterDataPipe).parameters else "constraint")
pipe = (manifest_samples([spec["path"]]).filter_by_duration(1.0, 15.0, warn=False)
        .shuffle_samples(seed=0).bucket_by_length(2000, **{kw: c}, seed=0)
        .block_batch(**{kw: c}, seed=0))
loader = sp.build_loader(pipe, num_workers=spec["workers"], seed=0, snapshot_every=1)
out = {}
if spec.get("resume"):
    state = torch.load(spec["resume"], weights_only=True)
    t0 = time.perf_counter()
    loader.load_state_dict(state)
main_before = smaps()
it = iter(loader)
batch = next(it)
out["first_s"] = time.perf_counter() - t0
out["memory"] = grown(imported, smaps())
if spec["workers"] and not spec.get("save"):
    for _ in range(spec["workers"] - 1):  # every worker has made a batch (round robin)
        next(it)
    out["workers_memory"] = worker_memory(main_before)
if spec.get("save"):
    for _ in range(spec["resume_at"] - 1):
        next(it)
    torch.save(loader.state_dict(), spec["save"])
print(json.dumps(out))
"""

_LHOTSE_CHILD = _SMAPS + """
import json, pickle, sys, time
spec = json.loads(sys.argv[1])
from lhotse import CutSet
from lhotse.dataset import DynamicBucketingSampler
imported = smaps()
t0 = time.perf_counter()
def sampler():
    return DynamicBucketingSampler(CutSet.from_jsonl_lazy(spec["path"]), max_duration=200.0,
                                   num_buckets=30, shuffle=True, seed=0)
s = sampler()
out = {}
if spec.get("resume"):
    with open(spec["resume"], "rb") as f:
        state = pickle.load(f)  # the benchmark's own file
    t0 = time.perf_counter()
    s.load_state_dict(state)
it = iter(s)
next(it)
out["first_s"] = time.perf_counter() - t0
out["memory"] = grown(imported, smaps())
if spec.get("save"):
    for _ in range(spec["resume_at"] - 1):
        next(it)
    with open(spec["save"], "wb") as f:
        pickle.dump(s.state_dict(), f)
print(json.dumps(out))
"""

_INDEX_CHILD = _SMAPS + """
import json, sys, time
spec = json.loads(sys.argv[1])
import speechpipe as sp
from speechpipe.index import ShardIndex
imported = smaps()
t0 = time.perf_counter()
index = ShardIndex.read(spec["path"])
out = {"read_s": time.perf_counter() - t0, "memory": grown(imported, smaps())}
t0 = time.perf_counter()
pipe = sp.IterableWrapper([spec["path"]]).sharded_shuffle(buffer_size=2000, index=True)
plans = pipe.epoch_plans(world_size=64, num_workers=8)
out["plan_s"] = time.perf_counter() - t0
t0 = time.perf_counter()
c = sp.PaddedArea(budget=200.0, length="duration")
steps = sp.StepPlanner(pipe, c, num_workers=8, world_size=64).plan()
out["steps_s"] = time.perf_counter() - t0
out["steps"] = steps.steps
out["memory_planned"] = grown(imported, smaps())
print(json.dumps(out))
"""

# The shard road as a recipe streams it: raw samples, durations from the index, bucketed and
# batched on them (decoding would follow, in the batch).
_SHARD_CHILD = _MANIFEST_CHILD.replace(
    """pipe = (manifest_samples([spec["path"]]).filter_by_duration(1.0, 15.0, warn=False)
        .shuffle_samples(seed=0).bucket_by_length(2000, **{kw: c}, seed=0)""",
    """c = sp.PaddedArea(budget=200.0, length="duration")
pipe = (sp.IterableWrapper([spec["path"]]).sharded_shuffle(buffer_size=2000, index=True, seed=0)
        .durations_from_index().bucket_by_length(2000, **{kw: c}, seed=0)""")
assert _SHARD_CHILD != _MANIFEST_CHILD


_PLANNED_CHILD = """
import json, os, sys, time
spec = json.loads(sys.argv[1])
import speechpipe as sp
from speechpipe import node_cache
t0 = time.perf_counter()
cache = spec["cache"] if spec["cache"] else False
if spec["road"] == "rows":
    pipe = sp.IterableWrapper([spec["path"]]).read_manifest_files().plan_batches(
        budget=60.0, streams=8, seed=0, boundaries=[2.0, 4.0, 8.0], plan_cache=cache)
else:
    from speechpipe.index import ShardIndex
    index = ShardIndex.read(spec["path"])
    names = [os.path.join(spec["path"], e.name) for e in index.shards]
    pipe = sp.IterableWrapper(names).plan_batches(
        budget=sp.PaddedArea(6000), index=index, streams=8, seed=0,
        boundaries=[200, 400, 800], plan_cache=cache)
out = {}
if spec.get("workers") is not None:
    loader = sp.build_loader(pipe, num_workers=spec["workers"], seed=0)
    next(iter(loader))
    out["first_s"] = time.perf_counter() - t0
    print(json.dumps(out))
    raise SystemExit
road = pipe.road()
_ = pipe.num_streams
out["road_s"] = time.perf_counter() - t0
t1 = time.perf_counter()
if cache:
    road.plan_key()
out["key_s"] = time.perf_counter() - t1
t1 = time.perf_counter()
plan = pipe.plan(0)
out["plan_s"] = time.perf_counter() - t1
out["batches"] = len(plan)
if cache:
    names = [n for n in os.listdir(cache) if n.startswith("plan-") and n.endswith(".spmap")]
    out["file_bytes"] = sum(os.path.getsize(os.path.join(cache, n)) for n in names)
    header, arrays = node_cache.read_mapped(os.path.join(cache, names[0]))
    t1 = time.perf_counter()
    node_cache.array_sums(arrays)
    out["plan_sum_s"] = time.perf_counter() - t1
print(json.dumps(out))
"""

_SUMS_CHILD = """
import json, sys, time
from speechpipe import node_cache
out = {}
for name in json.loads(sys.argv[1])["files"]:
    header, arrays = node_cache.read_mapped(name)
    t0 = time.perf_counter()
    node_cache.array_sums(arrays)
    out[name] = [time.perf_counter() - t0, sum(a.nbytes for a in arrays.values())]
print(json.dumps(out))
"""


def run_planned(n: int, road: str, path: str, runs: int, tmp: str) -> dict:
    """The planned road's contenders (module documentation), taking turns in each round."""
    got: dict = {}
    for r in range(runs):
        cache = os.path.join(tmp, f"plans-{road}-{n}-{r}")
        for name, folder in (("off", None), ("first", cache), ("later", cache)):
            res = child(_PLANNED_CHILD, {"road": road, "path": path, "cache": folder}, REPO)
            if "error" in res:
                print(f"  planned {road} {_label(n)} {name}: {res['error']}", flush=True)
                continue
            for k, v in res.items():
                got.setdefault((name, k), []).append(v)
        loaded = os.path.join(tmp, f"loaded-{road}-{n}-{r}")
        for name, folder in (("off", None), ("first", loaded), ("later", loaded)) \
                if road == "rows" else ():  # the index's shards are not written
            res = child(_PLANNED_CHILD, {"road": road, "path": path, "cache": folder,
                                         "workers": 2}, REPO)
            if "error" in res:
                print(f"  planned {road} {_label(n)} loader {name}: {res['error']}", flush=True)
                continue
            got.setdefault((name, "first_s"), []).append(res["first_s"])
    for name in ("off", "first", "later"):
        print(f"  planned {road:6s} {_label(n):>6s} {name:5s}: metadata "
              f"{_median(got.get((name, 'road_s'), []))} s, digest "
              f"{_median(got.get((name, 'key_s'), []))} s, plan "
              f"{_median(got.get((name, 'plan_s'), []))} s, first batch (2 workers) "
              f"{_median(got.get((name, 'first_s'), []))} s", flush=True)
    return {"road": "planned", "kind": road, "n": n,
            "got": {f"{a}/{b}": v for (a, b), v in got.items()}}


def run_sums(n: int, files: list[str]) -> dict:
    res = child(_SUMS_CHILD, {"files": [f for f in files if os.path.exists(f)]}, REPO)
    for name, (seconds, size) in ({} if "error" in res else res).items():
        print(f"  CRC-32 {_label(n)} {os.path.basename(name)}: {size / 2**20:.0f} MiB in "
              f"{seconds:.2f} s", flush=True)
    return {"road": "sums", "n": n, "got": res}


def report_planned(rows: list[dict]) -> None:
    planned = [r for r in rows if r["road"] == "planned"]
    if not planned:
        return
    print("\nPlanned road: one epoch's plan per process (s, median (range) over rounds; fresh "
          "processes; 'first' plans and writes into an empty cache folder, 'later' maps it)")
    print("| road | rows | contender | metadata | digest | plan(0) | process total | "
          "first batch, 2 workers | plan file MiB | its CRC-32 s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in planned:
        g = r["got"]
        for name in ("off", "first", "later"):
            total = [a + b + c for a, b, c in zip(g.get(f"{name}/road_s", []),
                                                  g.get(f"{name}/key_s", []),
                                                  g.get(f"{name}/plan_s", []))]
            size = g.get(f"{name}/file_bytes", [])
            cells = [r["kind"], _label(r["n"]), name] + [
                _median(g.get(f"{name}/{k}", [])) for k in ("road_s", "key_s", "plan_s")] + [
                _median(total), _median(g.get(f"{name}/first_s", [])),
                f"{size[-1] / 2**20:.1f}" if size else "-",
                _median(g.get(f"{name}/plan_sum_s", []))]
            print("| " + " | ".join(cells) + " |")
    sums = [r for r in rows if r["road"] == "sums" and "error" not in r["got"]]
    if sums:
        print("\nCRC-32 of a node-cached file's arrays (what a process checks once when it "
              "first maps one; fresh process, pages cached)")
        print("| rows | file | MiB | s |")
        print("|---|---|---|---|")
        for r in sums:
            for name, (seconds, size) in r["got"].items():
                print(f"| {_label(r['n'])} | {os.path.basename(name)} | {size / 2**20:.0f} | "
                      f"{seconds:.2f} |")


def _size(text: str) -> int:
    text = text.strip().upper()
    scale = {"K": 1_000, "M": 1_000_000}.get(text[-1:], 1)
    return int(float(text[:-1] if text[-1:] in "KM" else text) * scale)


def _label(n: int) -> str:
    return f"{n / 1e6:g}M" if n >= 100_000 else f"{n:,}"


def _rows(start: int, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    from speechpipe.testing import sample_durations

    seconds = np.round(sample_durations("wenetspeech-l", n, seed=seed), 2)
    keys = np.char.add("Y", np.char.zfill(np.arange(start, start + n).astype(str), 10))
    return keys, seconds


def make_manifest(root: str, n: int) -> str:
    """``wenet_<n>.jsonl.gz`` (and its mapped table, as prepare writes it), once."""
    path = os.path.join(root, f"wenet_{n}.jsonl.gz")
    if os.path.exists(path):
        return path
    tmp = path + ".part"
    with gzip.open(tmp, "wb", compresslevel=1) as f:
        for start in range(0, n, CHUNK):
            keys, seconds = _rows(start, min(CHUNK, n - start), start)
            lines = np.char.add(np.char.add('{"audio_path": "/data/audio/', keys), '.opus", ')
            lines = np.char.add(np.char.add(lines, '"duration": '), seconds.astype(str))
            lines = np.char.add(np.char.add(lines, ', "key": "'), keys)
            lines = np.char.add(lines, '", "text": "\u4eca\u5929\u5929\u6c14\u5f88\u597d\u6211'
                                       '\u4eec\u53bb\u516c\u56ed"}\n')
            f.write("".join(lines.tolist()).encode("utf-8"))
    os.replace(tmp, path)
    return path


def make_table(path: str) -> float:
    """Build the manifest's mapped table with this checkout (what prepare now does)."""
    from speechpipe.pipes.sources import write_manifest_table

    if os.path.exists(path + ".spmap"):
        return float("nan")
    t0 = time.perf_counter()
    write_manifest_table(path)
    return time.perf_counter() - t0


def make_selection(path: str) -> float:
    """The first pass's one-time work with this checkout: ``filter_by_duration(1, 15)``'s
    selection of the rows, written beside the manifest (``.within-1.0-15.0.spmap``) and
    mapped by every later process and pass."""
    import speechpipe as sp

    if os.path.exists(f"{path}.within-1.0-15.0.spmap"):
        return float("nan")
    t0 = time.perf_counter()
    sp.IterableWrapper([path]).read_manifest_files().filter_by_duration(
        1.0, 15.0, warn=False).row_table()
    return time.perf_counter() - t0


def make_cuts(root: str, n: int) -> str:
    """The same rows as lhotse MonoCuts (``cuts_<n>.jsonl.gz``), once."""
    path = os.path.join(root, f"cuts_{n}.jsonl.gz")
    if os.path.exists(path):
        return path
    tmp = path + ".part"
    with gzip.open(tmp, "wt", compresslevel=1, encoding="utf-8") as f:
        for start in range(0, n, CHUNK):
            keys, seconds = _rows(start, min(CHUNK, n - start), start)
            for key, d in zip(keys.tolist(), seconds.tolist()):
                f.write(json.dumps({
                    "id": key, "start": 0.0, "duration": d, "channel": 0,
                    "supervisions": [], "type": "MonoCut",
                    "recording": {"id": key, "sampling_rate": 16000,
                                  "num_samples": int(round(d * 16000)), "duration": d,
                                  "sources": [{"type": "file", "channels": [0],
                                               "source": f"/data/audio/{key}.opus"}]}}) + "\n")
    os.replace(tmp, path)
    return path


def make_index(root: str, n: int) -> str:
    """``index_<n>/index.jsonl``: 2000 utterances per shard, lengths in frames, once."""
    folder = os.path.join(root, f"index_{n}")
    path = os.path.join(folder, "index.jsonl")
    if os.path.exists(path):
        return folder
    os.makedirs(folder, exist_ok=True)
    with open(path + ".part", "w", encoding="utf-8") as f:
        f.write(json.dumps({"format": "speechpipe-shard-index", "version": 1,
                            "length_unit": "frames"}) + "\n")
        for start in range(0, n, CHUNK):
            keys, seconds = _rows(start, min(CHUNK, n - start), start)
            frames = (seconds * 100).astype(np.int64)
            for s in range(0, keys.size, PER_SHARD):
                k, fr = keys[s:s + PER_SHARD].tolist(), frames[s:s + PER_SHARD].tolist()
                f.write(json.dumps({"name": f"data-{(start + s) // PER_SHARD:05d}.tar",
                                    "count": len(k), "bytes": 64000 * len(k), "keys": k,
                                    "lengths": fr}, separators=(",", ":")) + "\n")
    os.replace(path + ".part", path)
    return folder


def make_real_shards(folder: str, per_plan: int = 6) -> int:
    """Real tar shards (tiny fields, the index's keys) for the first ``per_plan`` shards each
    process reads in epoch 0 with 0 and 2 workers: what the first batches and a resume at
    step 50 open; the index's other shards need not exist. Returns how many were written."""
    import speechpipe as sp
    from speechpipe.index import ShardIndex
    from speechpipe.pipes.shards import write_shard

    pipe = sp.IterableWrapper([folder]).sharded_shuffle(buffer_size=2000, index=True, seed=0)
    wanted = []
    for workers in (1, 2):
        for worker_plan in pipe.epoch_plans(0, world_size=1, num_workers=workers)[0]:
            wanted += worker_plan.names[:per_plan]
    entries = {os.path.join(folder, e.name): e for e in ShardIndex.read(folder).shards}
    written = 0
    for path in dict.fromkeys(wanted):
        if not os.path.exists(path):
            write_shard(path + ".part", [{"key": k, "txt": "x"} for k in entries[path].keys])
            os.replace(path + ".part", path)
            written += 1
    return written


def child(script: str, spec: dict, code_root: str) -> dict:
    env = {**os.environ, "PYTHONPATH": code_root}
    # run in code_root: ``python -c`` puts the working directory first on sys.path
    out = subprocess.run([sys.executable, "-c", script, json.dumps(spec)], env=env,
                         cwd=code_root, capture_output=True, text=True, timeout=3600)
    if out.returncode != 0:
        return {"error": out.stderr.strip().splitlines()[-1][:200]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def _median(values: list[float]) -> str:
    if not values:
        return "-"
    med = statistics.median(values)
    if len(values) == 1:
        return f"{med:.2f}"
    return f"{med:.2f} ({min(values):.2f}-{max(values):.2f})"


def _mib(memory: dict | None, key: str) -> float:
    return float("nan") if memory is None else memory[key] / 2**20


def run_manifest(name: str, code_root: str, path: str, n: int, runs: int, workers_list,
                 lhotse: bool, tmp: str, road: str = "manifest") -> list[dict]:
    script = _LHOTSE_CHILD if lhotse else _SHARD_CHILD if road == "shards" else _MANIFEST_CHILD
    rows = []
    for workers in workers_list:
        if lhotse and workers:
            continue  # the sampler runs in the main process
        firsts, memory, per_worker = [], None, []
        for _ in range(runs):
            got = child(script, {"path": path, "workers": workers}, code_root)
            if "error" in got:
                print(f"  {name} {_label(n)} w={workers}: {got['error']}", flush=True)
                break
            firsts.append(got["first_s"])
            memory = got["memory"]
            per_worker += got.get("workers_memory", [])
        row = {"road": road, "name": name, "n": n, "workers": workers, "first": firsts,
               "memory": memory, "resume": [], "per_worker": per_worker}
        if workers == 0 and firsts:
            state = os.path.join(tmp, f"state-{road}-{name}-{n}")
            got = child(script, {"path": path, "workers": 0, "save": state,
                                 "resume_at": RESUME_AT if n > 20_000 else 5}, code_root)
            if "error" in got:
                print(f"  {name} saving a state: {got['error']}", flush=True)
            for _ in range(runs if "error" not in got else 0):
                again = child(script, {"path": path, "workers": 0, "resume": state},
                              code_root)
                if "error" in again:
                    print(f"  {name} resume: {again['error']}", flush=True)
                    break
                row["resume"].append(again["first_s"])
        rows.append(row)
        print(f"  {name:7s} {_label(n):>6s} workers={workers}: first {_median(firsts)} s, "
              f"anon +{_mib(memory, 'Anonymous'):.1f} MiB, resume {_median(row['resume'])} s"
              + (f", per worker {_worker_line(per_worker)}" if per_worker else ""), flush=True)
    return rows


_WORKER_FIELDS = (("Anonymous_grown", "Anonymous grown"), ("Private_Dirty", "Private_Dirty"),
                  ("Private_Clean", "Private_Clean"), ("Shared", "Shared"))


def _worker_mib(memory: dict, key: str) -> float:
    if key == "Shared":
        return (memory["Shared_Clean"] + memory["Shared_Dirty"]) / 2**20
    return memory[key] / 2**20


def _worker_line(per_worker: list[dict]) -> str:
    """Each field's median (range) over every worker of every run, MiB."""
    return " | ".join(_median([_worker_mib(m, k) for m in per_worker])
                      for k, _ in _WORKER_FIELDS)


def run_index(name: str, code_root: str, folder: str, n: int, runs: int) -> dict:
    reads, plans, steps, memory, planned = [], [], [], None, None
    for _ in range(runs):
        got = child(_INDEX_CHILD, {"path": folder}, code_root)
        if "error" in got:
            print(f"  {name} index {_label(n)}: {got['error']}", flush=True)
            break
        reads.append(got["read_s"])
        plans.append(got["plan_s"])
        steps.append(got["steps_s"])
        memory, planned = got["memory"], got["memory_planned"]
    print(f"  {name:7s} {_label(n):>6s} index: read {_median(reads)} s, plan 64x8 "
          f"{_median(plans)} s, steps 64x8 {_median(steps)} s, anon +"
          f"{_mib(memory, 'Anonymous'):.1f} MiB, after planning +"
          f"{_mib(planned, 'Anonymous'):.1f} MiB", flush=True)
    return {"road": "index", "name": name, "n": n, "read": reads, "plan": plans,
            "steps": steps, "memory": memory, "memory_planned": planned}


def merged(rows: list[dict]) -> list[dict]:
    """The rounds' rows of one contender, size and number of workers as one row."""
    out: dict = {}
    for r in rows:
        key = (r["road"], r["name"], r["n"], r.get("workers", id(r)))
        if key not in out:
            out[key] = {**r, **{k: list(r.get(k, [])) for k in ("first", "resume",
                                                              "per_worker")}}
            continue
        for k in ("first", "resume", "per_worker"):
            out[key][k] += r.get(k, [])
        out[key]["memory"] = r.get("memory") or out[key]["memory"]
    return list(out.values())


def report(rows: list[dict], tables: dict) -> None:
    rows = merged([r for r in rows if r["road"] in ("manifest", "shards", "index")])
    for road, title in (("manifest", "Manifest road"), ("shards", "Shard road (sharded_shuffle "
                                                         "-> durations_from_index)")):
        if not any(r["road"] == road for r in rows):
            continue
        print(f"\n{title} (times: median (range) over runs, s; memory: growth of the process "
              "with 0 workers, MiB; B/row from Anonymous)")
        print("| contender | rows | table (selection) build s | first batch, 0 workers | "
              "first batch, 2 workers | resume at step 50 | Anonymous MiB (B/row) | "
              "Private MiB | Shared MiB |")
        print("|---|---|---|---|---|---|---|---|---|")
        by = {}
        for r in rows:
            if r["road"] == road:
                by.setdefault((r["name"], r["n"]), {})[r["workers"]] = r
        for (name, n), per in sorted(by.items(), key=lambda t: (t[0][1], t[0][0])):
            zero, two = per.get(0, {}), per.get(2, {})
            mem = zero.get("memory")
            anon = _mib(mem, "Anonymous")
            private = _mib(mem, "Private_Clean") + _mib(mem, "Private_Dirty")
            shared = _mib(mem, "Shared_Clean") + _mib(mem, "Shared_Dirty")
            build = tables.get((road, n)) if name == "after" else None
            chosen = tables.get(("selection", n)) if name == "after" and road == "manifest" \
                else None
            build = "-" if build is None or build != build else f"{build:.1f}" + (
                "" if chosen is None else f" ({chosen:.1f})")
            print(f"| {name} | {_label(n)} | {build} | "
                  f"{_median(zero.get('first', []))} | {_median(two.get('first', []))} | "
                  f"{_median(zero.get('resume', []))} | {anon:.1f} ({anon * 2**20 / n:.1f}) | "
                  f"{private:.1f} | {shared:.1f} |")
    if any(r.get("per_worker") for r in rows):
        print("\nPer DataLoader worker with 2 workers, at the first batches (each worker's "
              "/proc/<pid>/smaps_rollup read from the main process; MiB, median (range) over "
              "the workers of every run; Anonymous grown: less the main process's before the "
              "workers started)")
        print("| road | contender | rows | " + " | ".join(t for _, t in _WORKER_FIELDS)
              + " | Private B/row |")
        print("|---|---|---|" + "---|" * (len(_WORKER_FIELDS) + 1))
        for r in sorted((r for r in rows if r.get("per_worker")),
                        key=lambda r: (r["road"], r["n"], r["name"])):
            own = statistics.median(m["Private_Dirty"] + m["Private_Clean"]
                                    for m in r["per_worker"])
            print(f"| {r['road']} | {r['name']} | {_label(r['n'])} | "
                  f"{_worker_line(r['per_worker'])} | {own / r['n']:.1f} |")
    print("\nShard index (ShardIndex.read; planning 64 ranks x 8 workers, epoch_plans and "
          "StepPlanner(PaddedArea(200 s)), from a fresh process, after that read)")
    print("| contender | utterances | read s | plan 64x8 s | steps 64x8 s | Anonymous MiB "
          "(B/utt) after read | after planning |")
    print("|---|---|---|---|---|---|---|")
    for r in sorted((r for r in rows if r["road"] == "index"), key=lambda r: (r["n"], r["name"])):
        anon, planned = _mib(r["memory"], "Anonymous"), _mib(r["memory_planned"], "Anonymous")
        print(f"| {r['name']} | {_label(r['n'])} | {_median(r['read'])} | "
              f"{_median(r['plan'])} | {_median(r['steps'])} | "
              f"{anon:.1f} ({anon * 2**20 / r['n']:.1f}) | "
              f"{planned:.1f} ({planned * 2**20 / r['n']:.1f}) |")


def make_index_table(folder: str) -> float:
    """Build the index's mapped table with this checkout (what pack's merge now writes)."""
    from speechpipe.index import ShardIndex

    if os.path.exists(os.path.join(folder, "index.jsonl.spmap")):
        return float("nan")
    t0 = time.perf_counter()
    ShardIndex.read(folder)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="bench_scale")
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--sizes", default="0.1M,1M,4M,15M")
    parser.add_argument("--root", default=None, help="where the corpora are written (kept)")
    parser.add_argument("--base", default=None, help="a folder holding an older speechpipe")
    parser.add_argument("--base-max", default="1M", help="largest size run with --base")
    parser.add_argument("--base-workers-max", default="1M",
                        help="largest size --base runs with 2 workers (each holds it all)")
    parser.add_argument("--lhotse-max", default="1M", help="largest size run with lhotse "
                        "(0: none)")
    parser.add_argument("--index-max", default="15M", help="largest shard index read")
    parser.add_argument("--index-base-max", default="15M",
                        help="largest shard index --base reads (about 130 B per utterance)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--roads", default="manifest,index,shards,planned")
    parser.add_argument("--contenders", default="after,before,lhotse")
    args = parser.parse_args(argv)
    sizes = [2000] if args.tiny else [_size(s) for s in args.sizes.split(",")]
    runs = 1 if args.tiny else args.runs
    root = args.root or tempfile.mkdtemp(prefix="bench_scale_")
    os.makedirs(root, exist_ok=True)
    roads = args.roads.split(",")
    who = args.contenders.split(",")
    rows, tables = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            print(f"== {_label(n)} rows", flush=True)
            if "manifest" in roads:
                path = make_manifest(root, n)
                tables[("manifest", n)] = make_table(path)
                if "after" in who:
                    tables[("selection", n)] = make_selection(path)
                contenders = [("after", REPO, (0, 2))] if "after" in who else []
                if "before" in who and args.base and n <= _size(args.base_max):
                    contenders.append(("before", args.base, (0, 2) if n <= _size(
                        args.base_workers_max) else (0,)))
                for _ in range(runs):  # rounds: the contenders alternate, under one load
                    for name, code_root, workers in contenders:
                        rows += run_manifest(name, code_root, path, n, 1, workers, False, tmp)
                if "lhotse" in who and (args.tiny or n <= _size(args.lhotse_max)):
                    rows += run_manifest("lhotse", REPO, make_cuts(root, n), n, runs, (0,),
                                         True, tmp)
            if "planned" in roads:
                path = make_manifest(root, n)
                make_table(path)
                make_selection(path)
                rows.append(run_planned(n, "rows", path, runs, tmp))
                rows.append(run_sums(n, [path + ".spmap", f"{path}.within-1.0-15.0.spmap"]))
            if "planned" in roads and (args.tiny or n <= _size(args.index_max)):
                folder = make_index(root, n)
                make_index_table(folder)
                rows.append(run_planned(n, "shards", folder, runs, tmp))
                rows.append(run_sums(n, [os.path.join(folder, "index.jsonl.spmap")]))
            if {"index", "shards"} & set(roads) and (args.tiny or n <= _size(args.index_max)):
                folder = make_index(root, n)
                tables[("shards", n)] = make_index_table(folder)
                base = "before" in who and args.base and n <= _size(args.index_base_max)
                if "index" in roads and "after" in who:
                    rows.append(run_index("after", REPO, folder, n, runs))
                if "index" in roads and base:
                    rows.append(run_index("before", args.base, folder, n, runs))
                if "shards" in roads:
                    make_real_shards(folder)
                    if "after" in who:
                        rows += run_manifest("after", REPO, folder, n, runs, (0, 2), False, tmp,
                                             road="shards")
                    if base:
                        rows += run_manifest("before", args.base, folder, n, runs, (0, 2),
                                             False, tmp, road="shards")
    report(rows, tables)
    report_planned(rows)
    with open(os.path.join(root, f"bench_scale-{'-'.join(who)}.json"), "w") as f:
        json.dump({"rows": rows, "tables": [[*k, v] for k, v in tables.items()]}, f)
    if args.root is None:
        import shutil

        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
