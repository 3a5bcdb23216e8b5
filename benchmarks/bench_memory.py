"""Peak memory: speechpipe's feature pipeline beside lhotse's and webdataset's (issue 23.8).

One epoch of 80-dim float32 features (durations from LibriSpeech train-clean-100's published
percentiles, packed into tar shards by ``speechpipe.pack.pack_data``, as ``bench_e2e``'s
features workload), warm page cache, each run in a fresh forked process; peak RSS is the run's
``ru_maxrss`` plus the largest of its DataLoader workers' (``bench_e2e.in_fork``). Rows:

- speechpipe ``sharded_shuffle(1000) -> decode -> bucket_by_length(1000, 30 buckets) ->
  block_batch(PaddedArea, shuffle_window) -> PadCollate`` in ``build_loader``: shards mapped
  (the default) with ``shuffle_window`` 100 (the default) and 10, and mapping off; and with
  webdataset's buffers (``sharded_shuffle(1000) ->
  decode -> block_batch(SampleCount(n), shuffle_window=1) -> PadCollate``, the same fixed
  ``n``);
- webdataset: ``WebDataset(shards).shuffle(1000).decode()`` in fixed batches (no bucketing);
- lhotse: ``DynamicBucketingSampler`` (30 buckets; it buffers cut *metadata*, not data) with a
  map-style dataset loading each batch's features from the ark (``kaldiio.load_mat``).

Buffers, in utterances held with data: speechpipe 1000 (sample shuffle) + 1000 (buckets) + the
window's batches; webdataset 1000; lhotse none (the dataset loads one batch at a time). Below the
table, speechpipe's own account of its buffers in each run (``sp.pipeline_report``'s
``buffers`` lines: samples and MB of arrays at peak, per worker), to set beside the RSS.

    python -m benchmarks.bench_memory [--root DIR]  # 8000 utterances, 4 shards (about 3 GiB)
    python -m benchmarks bench_memory --tiny     # 200 utterances, 4 shards
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np

from speechpipe.pipes._core import IterableWrapper
from speechpipe.pipes.collate import PadCollate
from speechpipe.pipes.batching import PaddedArea, SampleCount
from speechpipe.pipes.shards import ShardReadOptions
from speechpipe.testing import sample_durations

from .bench_e2e import CORPUS, FPS, NUM_BUCKETS, SHUFFLE, LhotseFeatures, in_fork, lhotse_loader
from .bench_e2e import webdataset_pipe
from .bench_shards import make_corpus, warm

BUDGET_S = 300.0  # padded seconds per batch


class _Reporting:
    """A loader whose pass ends by writing its pipeline's ``buffers`` lines to ``path`` (the
    run is in a forked process: the parent reads the file)."""

    def __init__(self, loader, path: str) -> None:
        self.loader, self.path = loader, path

    def __iter__(self):
        from speechpipe.recipes import pipeline_report

        yield from self.loader
        lines = [line for line in pipeline_report(self.loader.dataset.pipe).splitlines()
                 if " buffers" in line]
        with open(self.path, "w", encoding="utf-8") as f:
            f.write("\n".join(lines))


def speechpipe_loader(shards, workers: int, window: int, mmap: bool, report: str,
                      fixed: int | None = None):
    """The issue's pipeline; with ``fixed``, webdataset's buffers instead (the sample shuffle
    only, then fixed batches of ``fixed``): equal buffers."""
    from speechpipe.loader import build_loader

    c = PaddedArea(budget=BUDGET_S * FPS)
    options = ShardReadOptions(mmap=mmap)
    pipe = IterableWrapper(shards).sharded_shuffle(buffer_size=SHUFFLE, seed=0,
                                                   read_options=options).decode()
    if fixed:
        pipe = pipe.block_batch(SampleCount(fixed), shuffle_window=1).collate(
            collate_fn=PadCollate())
    else:
        pipe = (pipe.bucket_by_length(1000, num_buckets=NUM_BUCKETS, budget=c, seed=0)
                .block_batch(c, seed=0, shuffle_window=window)
                .collate(collate_fn=PadCollate()))
    return _Reporting(build_loader(pipe, num_workers=workers, seed=0), report)


def run(root: str, n: int, shard_size: int) -> list[dict]:
    import torch

    shards, scp = make_corpus(root, n, shard_size)
    frames = np.round(sample_durations(CORPUS, n, 0) * 100).astype(int)  # as make_corpus
    durations = {f"utt{i:07d}": t / FPS for i, t in enumerate(frames)}
    wds_batch = max(1, int(BUDGET_S // max(durations.values())))
    rows = []
    report = os.path.join(root, "buffers.txt")
    for workers in (0, 2):
        contenders = [
            ("speechpipe, mapped, window 100", lambda w=workers: speechpipe_loader(
                shards, w, 100, True, report)),
            ("speechpipe, mapped, window 10", lambda w=workers: speechpipe_loader(
                shards, w, 10, True, report)),
            ("speechpipe, mapping off, window 100", lambda w=workers: speechpipe_loader(
                shards, w, 100, False, report)),
            (f"speechpipe, webdataset's buffers", lambda w=workers: speechpipe_loader(
                shards, w, 100, True, report, fixed=wds_batch)),
            (f"webdataset (fixed {wds_batch})", lambda w=workers: torch.utils.data.DataLoader(
                webdataset_pipe(shards, "features", wds_batch), batch_size=None,
                num_workers=w)),
            ("lhotse", lambda w=workers: lhotse_loader(durations, LhotseFeatures(scp),
                                                       BUDGET_S, w)),
        ]
        for name, build in contenders:
            warm(shards + [os.path.join(root, "feats.ark")])
            if os.path.exists(report):
                os.remove(report)
            result = in_fork(build)
            buffers = ""
            if os.path.exists(report):
                with open(report, encoding="utf-8") as f:
                    buffers = f.read()
            rows.append({"name": name, "workers": workers, "rss_mb": result["rss_mb"],
                         "utts": result["utts"], "buffers": buffers})
            print(f"  .. {name} wk {workers}: {result['rss_mb']:.0f} MiB", flush=True)
    return rows


def table(rows: list[dict], data_mb: float) -> str:
    head = f"{'contender':<38} {'wk':>2} {'peak RSS MiB':>12} {'vs lhotse':>9} {'utts':>6}"
    lines = [head, "-" * len(head)]
    lhotse = {r["workers"]: r["rss_mb"] for r in rows if r["name"] == "lhotse"}
    for r in rows:
        lines.append(f"{r['name']:<38} {r['workers']:>2} {r['rss_mb']:>12.0f} "
                     f"{r['rss_mb'] / lhotse[r['workers']]:>9.2f} {r['utts']:>6}")
    lines.append(f"(shards: {data_mb:.0f} MiB)")
    for r in rows:
        if r["buffers"]:
            lines.append(f"\n{r['name']}, wk {r['workers']}, buffers as reported:")
            lines.extend(f"  {line}" for line in r["buffers"].splitlines())
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--utterances", type=int, default=8000)
    parser.add_argument("--root", default=None, help="corpus folder (reused if present)")
    args = parser.parse_args(argv)
    n, shard_size = (200, 50) if args.tiny else (args.utterances, args.utterances // 4)
    with tempfile.TemporaryDirectory() as tmp:
        root = (os.path.join(tmp, "feats") if args.tiny else args.root or os.path.join(
            tempfile.gettempdir(), f"speechpipe-bench-memory-{n}"))
        rows = run(root, n, shard_size)
        from speechpipe.index import ShardIndex

        data_mb = sum(os.path.getsize(p) for p in ShardIndex.read(
            os.path.join(root, "shards")).paths()) / 2**20
    print(table(rows, data_mb))


if __name__ == "__main__":
    main()
