"""Padding, budgets and shuffle quality of length-aware batching, side by side.

On utterance lengths drawn from real corpora's published duration percentiles
(``speechpipe.testing.sample_durations``: LibriSpeech train-clean-100, AISHELL-1 train,
WenetSpeech M with icefall's 1-15 s filter), at the same padded budget, one run compares:

(a) fixed-size random batches (the largest size that can never exceed the budget);
(b) speechpipe streaming: per-epoch shuffled stream -> ``bucket_by_length`` -> ``block_batch``,
    at two buffer sizes, 35 and 140 typical batches' worth of samples (the buffer trades
    padding against batch variety);
(c) speechpipe's global-sort batching view (random-access road);
(d) lhotse's ``DynamicBucketingSampler`` (``max_duration`` = the budget, 30 buckets as icefall);
(e) ``plan_batches``' virtual streams (issue 29): the same shuffled stream dealt out to 8
    streams, each with its own buckets and budget batches (``plan_stream_batches``), the
    streams' batches interleaved -- the batches any number of ranks and workers train on --
    with (b)'s small buffer in each stream, and with that buffer shared out (1/8 each);
then (b) again at the largest buffer whose repeat rate is at most (d)'s (found by bisection):
the padding of the two at equal batch variety.

With ``--streams-curve``, only ``plan_batches`` itself (issue 29: the default number of virtual
streams): its padding efficiency over a manifest's mapped rows and over a shard index (an
in-memory :class:`~speechpipe.index.ShardIndex` of ``--per-shard`` utterances a shard, lengths
in seconds), and a ``BatchView(streams=V)``, for each ``V`` in ``--streams`` and ``"auto"`` (the
derived default), each corpus size in ``--sizes`` and each bucket buffer in ``--buffers``; the
median over ``--rounds`` seeds (lengths and plan) with the range, and each ``V``'s difference to
``V = 1`` in points (the median of the seeds' differences). Padding does not depend on the
load (nothing is timed)::

    python -m benchmarks.bench_batching --streams-curve --budget 200

With ``--recipe``, only the two roads of ``train_pipeline`` at its defaults (a bucket buffer of
2,000 samples, one bucket sorted within it): (b) with that buffer -- what each process of
``streams=None`` holds -- against (e) with 8 streams of that buffer each (``streams=8``) and
with ``plan_batches``' derived number of streams (``streams="auto"``).

For each: padding efficiency (real / padded frames), batches per epoch, largest padded area
(as a fraction of the budget), batches over budget, and the co-batch repeat rate: of the pairs
of samples that share a batch in epoch e, the fraction that share one again in epoch e + 1
(averaged over epochs). Lengths are frames at 100 frames/s. Nothing here is asserted.

    python -m benchmarks bench_batching           # 100,000 utterances per corpus, 3 epochs
    python -m benchmarks bench_batching --tiny    # 3,000 utterances, 2 epochs (smoke test)
    python -m benchmarks bench_batching --recipe --budget 200   # the recipes' two roads

Two trees side by side (issues 28 and 29: "no regression beyond 2 %"): ``--base DIR[,DIR...]`` runs
speechpipe's own contenders, (b), (c) and (e), with the speechpipe of another checkout (an
``git archive`` of an older commit) beside this one's (``--head DIR``: another checkout for
this side too), each in a child process, on the same lengths; ``--rounds R`` draws the
lengths with seeds 0..R-1 (the trees take turns within each round) and reports each
contender's median efficiency with the range over the rounds. Efficiency and batch counts
are deterministic for a seed; the times per epoch are not (the load average is printed)::

    python -m benchmarks.bench_batching --base /tmp/sp_bb089fd --rounds 3
    python -m benchmarks.bench_batching --base /tmp/sp_71ef56c,/tmp/sp_bb089fd  # three
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from speechpipe.pipes._core import IterableWrapper
from speechpipe.pipes.batching import LengthBucketerIterDataPipe, PaddedArea
from speechpipe.seeding import derive_rng
from speechpipe.testing import sample_durations

CORPORA = ("librispeech-train-clean-100", "aishell-1-train", "wenetspeech-m")
#: Buffer sizes in batches' worth of samples: 35 batches repeats about 15 % more pairs than
#: lhotse's 30 buckets (about 30 batches' worth matches it: the last row of each corpus);
#: 4 times that trades variety for less padding.
BUFFER_BATCHES = 35
FRAMES_PER_SECOND = 100
#: speechpipe's own contenders (run in each tree with --base)
OWN = ("(b)", "(c)", "(e)")


def _budget_keyword(cls) -> str:
    """``budget=`` since 0.2's one spelling, ``constraint=`` in older trees (``--base``)."""
    return "budget" if "budget" in inspect.signature(cls).parameters else "constraint"


def repeat_rate(epoch_a: list[list[int]], epoch_b: list[list[int]], n: int) -> float:
    """Fraction of pairs co-batched in ``epoch_a`` that are co-batched again in ``epoch_b``."""
    a = np.full(n, -1, np.int64)
    b = np.full(n, -1, np.int64)
    for i, batch in enumerate(epoch_a):
        a[batch] = i
    for i, batch in enumerate(epoch_b):
        b[batch] = i
    seen = (a >= 0) & (b >= 0)
    sizes = np.bincount(a[a >= 0])
    pairs = float((sizes * (sizes - 1) // 2).sum())
    _, both = np.unique(a[seen] * (len(epoch_b) + 1) + b[seen], return_counts=True)
    return float((both * (both - 1) // 2).sum()) / pairs if pairs else 0.0


def describe(name: str, epochs: list[list[list[int]]], lengths: np.ndarray, budget: float,
             seconds: float) -> dict:
    batches = epochs[0]
    real = sum(float(lengths[b].sum()) for b in batches)
    areas = np.array([len(b) * float(lengths[b].max()) for b in batches])
    rates = [repeat_rate(epochs[e], epochs[e + 1], len(lengths)) for e in range(len(epochs) - 1)]
    return {
        "contender": name,
        "efficiency": real / float(areas.sum()),
        "batches": len(batches),
        "largest": float(areas.max()) / budget,
        "over": int(sum(1 for b, area in zip(batches, areas) if len(b) > 1 and area > budget)),
        "repeat": float(np.mean(rates)),
        "ms_per_epoch": 1000 * seconds / len(epochs),
    }


def fixed_random(lengths, budget, epochs, seed):
    size = max(1, int(budget // lengths.max()))
    out = []
    for e in range(epochs):
        order = np.arange(len(lengths))
        derive_rng(seed, e, 0, 0, "fixed").shuffle(order)
        out.append([list(order[i:i + size]) for i in range(0, len(order), size)])
    return out


def streaming(lengths, budget, epochs, seed, buffer_size, num_buckets=None):
    out = []
    for e in range(epochs):
        order = list(range(len(lengths)))
        derive_rng(seed, e, 0, 0, "upstream").shuffle(order)  # stands for sharded_shuffle
        constraint = PaddedArea(budget=budget, length=lambda i: lengths[i])
        kw = _budget_keyword(LengthBucketerIterDataPipe)
        pipe = (IterableWrapper(order)
                .bucket_by_length(buffer_size, num_buckets=num_buckets, seed=seed,
                                  **{kw: constraint})
                .block_batch(**{kw: constraint}, seed=seed))
        pipe.set_epoch(e)
        pipe.source_datapipe.set_epoch(e)
        out.append([list(b) for b in pipe])
    return out


def virtual_streams(lengths, budget, epochs, seed, buffer_size, streams=8):
    from speechpipe.pipes.batching import plan_stream_batches

    constraint = PaddedArea(budget=budget)
    out = []
    for e in range(epochs):
        order = list(range(len(lengths)))
        derive_rng(seed, e, 0, 0, "upstream").shuffle(order)  # the same stream as (b)
        dealt = [[(i, float(lengths[i])) for i in order[v::streams]] for v in range(streams)]
        plan = plan_stream_batches(dealt, constraint, seed=seed, epoch=e,
                                   bucket_buffer=buffer_size)
        out.append([list(b) for b in plan.batches])
    return out


def global_sort(lengths, budget, epochs, seed):
    from speechpipe.pipes.batching import BatchView

    keys = {str(i): float(n) for i, n in enumerate(lengths)}
    view = BatchView(keys, **{_budget_keyword(BatchView): PaddedArea(budget=budget)}, seed=seed)
    return [[[int(k) for k in batch] for batch in view.batches(e)] for e in range(epochs)]


def lhotse_dynamic(durations, budget_seconds, epochs, seed, num_buckets=30):
    import warnings

    from lhotse import CutSet
    from lhotse.dataset import DynamicBucketingSampler
    from lhotse.testing.dummies import dummy_cut

    cuts = [dummy_cut(i, duration=float(d)) for i, d in enumerate(durations)]
    out = []
    for e in range(epochs):
        # lhotse buckets the stream it is given; give it the same upstream shuffle as (b).
        order = list(range(len(cuts)))
        derive_rng(seed, e, 0, 0, "upstream").shuffle(order)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "eagerly read CutSet": the cuts are in memory
            sampler = DynamicBucketingSampler(
                CutSet.from_cuts(cuts[i] for i in order), max_duration=budget_seconds,
                shuffle=True, num_buckets=num_buckets, seed=seed)
            sampler.set_epoch(e)
            out.append([[int(c.id.rsplit("-", 1)[-1]) for c in batch] for batch in sampler])
    return out


#: ``--streams-curve``'s defaults: corpus sizes, streams, bucket buffers, utterances a shard.
CURVE_SIZES = (600, 3000, 5000, 10_000, 17_000, 30_000, 100_000, 300_000)
CURVE_STREAMS = (1, 2, 4, 8)
CURVE_BUFFERS = (2000, 500)
CURVE_PER_SHARD = 500


def curve_inputs(corpus: str, n: int, seed: int, folder: str, per_shard: int):
    """A manifest of ``n`` utterances of ``corpus`` (durations, seed ``seed``) and the same
    utterances as a shard index of ``per_shard`` a shard (nothing is packed: planning reads
    the index only). Returns (manifest path, shard names, index, ``{key: duration}``)."""
    from speechpipe.index import ShardEntry, ShardIndex
    from speechpipe.pipes.sources import write_manifest

    durations = np.round(sample_durations(corpus, n, seed, usable_only=True), 2)
    keys = [f"u{i:07d}" for i in range(n)]
    path = os.path.join(folder, f"{corpus}-{n}-{seed}.jsonl")
    write_manifest(path, ({"key": k, "duration": float(d)} for k, d in zip(keys, durations)))
    entries = [ShardEntry(f"{corpus}-{n}-{seed}-{j // per_shard:05d}.tar",
                          len(keys[j:j + per_shard]), 0, tuple(keys[j:j + per_shard]),
                          tuple(float(d) for d in durations[j:j + per_shard]))
               for j in range(0, n, per_shard)]
    index = ShardIndex(folder, entries, length_unit="seconds")
    names = [os.path.join(folder, e.name) for e in entries]
    return path, names, index, dict(zip(keys, durations.tolist()))


def curve_efficiencies(path, names, index, lengths, budget: float, streams, buffers,
                       seed: int) -> dict:
    """``{(road, buffer, V): (efficiency, V used)}`` for one corpus sample (the view has no
    bucket buffer: its streams are sorted whole; it is listed under each buffer)."""
    from speechpipe.pipes.batching import BatchView

    out = {}
    for v in streams:
        given = None if v == "auto" else v
        try:
            view = BatchView(lengths, budget=budget, seed=seed, streams=v)
            view_row = (view.stats.efficiency, view.streams)
        except (TypeError, ValueError):  # a tree whose view takes no "auto"
            view_row = None
        for buffer in buffers:
            rows = IterableWrapper([path]).read_manifest_files().plan_batches(
                budget, streams=given, seed=seed, bucket_buffer=buffer)
            shards = IterableWrapper(names).plan_batches(
                budget, index=index, streams=given, seed=seed, bucket_buffer=buffer)
            for road, pipe in (("rows", rows), ("shards", shards)):
                out[road, buffer, v] = (pipe.plan(0).stats.efficiency, pipe.num_streams)
            if view_row is not None:
                out["view", buffer, v] = view_row
    return out


def streams_curve(sizes, streams, buffers, budget: float, rounds: int,
                  per_shard: int) -> str:
    """``plan_batches``' padding efficiency against ``V`` and the corpus size (the module
    documentation): one table per corpus, road and buffer."""
    got: dict[tuple, list] = {}
    columns = list(streams) + ["auto"]
    with tempfile.TemporaryDirectory() as folder:
        for corpus in CORPORA:
            for n in sizes:
                for seed in range(rounds):
                    inputs = curve_inputs(corpus, n, seed, folder, per_shard)
                    for (road, buffer, v), row in curve_efficiencies(
                            *inputs, budget, columns, buffers, seed).items():
                        got.setdefault((corpus, road, buffer, n, v), []).append(row)
                    for name in os.listdir(folder):
                        os.remove(os.path.join(folder, name))
                print(f"  {corpus} {n} done (load {os.getloadavg()[0]:.1f})", flush=True)
    lines = [f"padding efficiency, median over {rounds} seed(s) [range]; (+-x.xx): the median "
             f"of the seeds' differences to V=1, in points; auto: the derived default (the V "
             f"used in braces); budget {budget:g} s, shards of {per_shard}"]
    for corpus in CORPORA:
        for road in ("rows", "shards", "view"):
            for buffer in (buffers if road != "view" else buffers[:1]):
                if not any((corpus, road, buffer, n, 1) in got for n in sizes):
                    continue
                label = f"bucket buffer {buffer}" if road != "view" else "streams sorted whole"
                lines.append(f"\n{corpus}, {road}, {label}")
                lines.append(f"{'n':>8} " + " ".join(f"{'V=' + str(v):>24}" for v in columns))
                for n in sizes:
                    base = got.get((corpus, road, buffer, n, 1))
                    cells = []
                    for v in columns:
                        found = got.get((corpus, road, buffer, n, v))
                        if not found:
                            cells.append(f"{'-':>24}")
                            continue
                        eff = [e for e, _ in found]
                        med = statistics.median(eff)
                        paired = [e - b for e, (b, _) in zip(eff, base or [])]  # per seed
                        loss = f"({100 * statistics.median(paired):+.2f})" if paired else ""
                        used = sorted({u for _, u in found})
                        tag = ("{" + ",".join(map(str, used)) + "}") if v == "auto" else ""
                        cells.append(f"{tag}{med:.4f}{loss}[{min(eff):.3f}-{max(eff):.3f}]"
                                     .rjust(24))
                    lines.append(f"{n:>8} " + " ".join(cells))
    return "\n".join(lines)


#: ``train_pipeline``'s bucket buffer (its default ``bucket_buffer``).
RECIPE_BUFFER = 2000


def run_recipe(n: int, epochs: int, budget_seconds: float, seed: int = 0) -> list[dict]:
    """The recipes' two roads at their defaults (see the module documentation), and the
    planned road at ``plan_batches``' derived number of streams (``streams="auto"``)."""
    from speechpipe.pipes.batching._stream_count import derived_streams

    rows = []
    for corpus in CORPORA:
        durations = sample_durations(corpus, n, seed, usable_only=True)
        lengths = np.round(durations * FRAMES_PER_SECOND).astype(np.int64)
        budget = budget_seconds * FRAMES_PER_SECOND
        buffer = min(n, RECIPE_BUFFER)
        auto = derived_streams(n, RECIPE_BUFFER)  # plan_batches' default V
        for name, fn in ((f"streams=None, buffer {buffer}",
                          lambda: streaming(lengths, budget, epochs, seed, buffer_size=buffer)),
                         (f"streams=8, buffer {buffer} each",
                          lambda: virtual_streams(lengths, budget, epochs, seed, buffer)),
                         (f"streams=auto ({auto}), buffer {buffer} each",
                          lambda: virtual_streams(lengths, budget, epochs, seed, buffer, auto))):
            start = time.perf_counter()
            result = fn()
            rows.append({"corpus": corpus, **describe(
                name, result, lengths, budget, time.perf_counter() - start)})
    return rows


def run(n: int, epochs: int, budget_seconds: float, seed: int = 0,
        own_only: bool = False) -> list[dict]:
    """Every contender on each corpus (``own_only``: speechpipe's, :data:`OWN`)."""
    rows = []
    for corpus in CORPORA:
        durations = sample_durations(corpus, n, seed, usable_only=True)
        lengths = np.round(durations * FRAMES_PER_SECOND).astype(np.int64)
        budget = budget_seconds * FRAMES_PER_SECOND
        per_batch = budget / float(lengths.mean())  # samples in a typical batch
        small, large = (min(n, int(k * per_batch)) for k in (BUFFER_BATCHES, 4 * BUFFER_BATCHES))
        contenders = [
            ("(a) fixed-size random", lambda: fixed_random(lengths, budget, epochs, seed)),
            (f"(b) streaming, buffer {small}",
             lambda: streaming(lengths, budget, epochs, seed, buffer_size=small)),
            (f"(b) streaming, buffer {large}",
             lambda: streaming(lengths, budget, epochs, seed, buffer_size=large)),
            ("(c) global-sort view", lambda: global_sort(lengths, budget, epochs, seed)),
            ("(d) lhotse DynamicBucketing",
             lambda: lhotse_dynamic(durations, budget_seconds, epochs, seed)),
            (f"(e) 8 streams, buffer {small} each",
             lambda: virtual_streams(lengths, budget, epochs, seed, small)),
            (f"(e) 8 streams, buffer {max(1, small // 8)} each",
             lambda: virtual_streams(lengths, budget, epochs, seed, max(1, small // 8))),
        ]
        slots = {name: i for i, (name, _) in enumerate(contenders)}
        if own_only:
            contenders = [c for c in contenders if c[0].startswith(OWN)]
        for name, fn in contenders:
            start = time.perf_counter()
            try:
                result = fn()
            except ImportError as exc:  # e.g. the view not yet importable
                print(f"  {corpus} {name}: skipped ({exc})")
                continue
            rows.append({"corpus": corpus, "slot": slots[name], **describe(
                name, result, lengths, budget, time.perf_counter() - start)})
        lhotse_row = next((r for r in rows if r["corpus"] == corpus
                           and r["contender"].startswith("(d)")), None)
        if lhotse_row is not None and not own_only:
            rows.append({"corpus": corpus, **matched_variety(
                lengths, budget, epochs, seed, lhotse_row["repeat"], per_batch)})
    return rows


def matched_variety(lengths, budget, epochs, seed, target: float, per_batch: float) -> dict:
    """(b) at the largest buffer whose co-batch repeat rate is at most ``target`` (lhotse's):
    padding compared at equal batch variety. Bisection over the buffer in batches' worth
    (the repeat rate grows with the buffer; 8 steps, each a full run of ``epochs``)."""
    low, high, best = 1.0, 4.0 * BUFFER_BATCHES, None
    for _ in range(8):
        mid = (low + high) / 2
        size = max(1, min(len(lengths), int(mid * per_batch)))
        row = describe(f"(b) buffer {size} = (d)'s rep.", streaming(
            lengths, budget, epochs, seed, buffer_size=size), lengths, budget, 0.0)
        if row["repeat"] <= target:
            best, low = row, mid
        else:
            high = mid
    if best is None:  # even one batch's worth repeats more than lhotse: report the smallest
        size = max(1, int(per_batch))
        best = describe(f"(b) buffer {size} (smallest)", streaming(
            lengths, budget, epochs, seed, buffer_size=size), lengths, budget, 0.0)
    best["ms_per_epoch"] = float("nan")  # a search, not one run: no time per epoch
    return best


def table(rows: list[dict]) -> str:
    head = (f"{'corpus':<28} {'contender':<32} {'effic.':>7} {'batches':>7} "
            f"{'max/budget':>10} {'over':>5} {'repeat':>7} {'ms/epoch':>9}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['corpus']:<28} {r['contender']:<32} {r['efficiency']:>7.4f} {r['batches']:>7} "
            f"{r['largest']:>10.3f} {r['over']:>5} {r['repeat']:>7.4f} {r['ms_per_epoch']:>9.0f}")
    return "\n".join(lines)


def tree_env(tree: str, scratch: str) -> dict:
    """The environment of a child that imports ``speechpipe`` from ``tree`` and the
    benchmarks from this checkout (links in ``scratch``: the two trees both hold a
    ``benchmarks`` package)."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    os.makedirs(scratch, exist_ok=True)
    for name, target in (("speechpipe", os.path.join(tree, "speechpipe")),
                         ("benchmarks", os.path.join(here, "benchmarks"))):
        link = os.path.join(scratch, name)
        if not os.path.lexists(link):
            os.symlink(os.path.abspath(target), link)
    return {**os.environ, "PYTHONPATH": scratch}


def in_tree(tree: str, scratch: str, n: int, epochs: int, budget: float, seed: int) -> list:
    spec = json.dumps({"n": n, "epochs": epochs, "budget": budget, "seed": seed})
    out = subprocess.run([sys.executable, "-m", "benchmarks.bench_batching", "--child", spec],
                         capture_output=True, text=True, timeout=7200,
                         env=tree_env(tree, scratch), cwd=scratch)
    if out.returncode:
        raise RuntimeError(f"{tree} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def side_by_side(trees: dict[str, str], n: int, epochs: int, budget: float,
                 rounds: int) -> str:
    """speechpipe's contenders in each tree, ``rounds`` seeds, the trees taking turns."""
    got: dict[tuple, list[dict]] = {}
    names: dict[tuple, str] = {}  # each contender's name in the first round
    loads = []
    with tempfile.TemporaryDirectory() as scratch:
        for seed in range(rounds):
            for label, tree in (trees.items() if seed % 2 == 0 else reversed(trees.items())):
                loads.append(os.getloadavg()[0])
                for row in in_tree(tree, os.path.join(scratch, label), n, epochs, budget,
                                   seed):
                    key = (row["corpus"], row["slot"], label)
                    got.setdefault(key, []).append(row)
                    names.setdefault(key[:2], row["contender"])
                loads.append(os.getloadavg()[0])
                print(f"  round {seed} {label} done (load {loads[-1]:.1f})", flush=True)
    labels = list(trees)
    head = (f"{'corpus':<28} {'contender':<32} " + " ".join(
        f"{'effic. ' + lb:>30}" for lb in labels) + f" {'diff.':>8} "
        + " ".join(f"{'ms/epoch ' + lb:>22}" for lb in labels))
    lines = [head, "-" * len(head)]
    for (corpus, slot), contender in names.items():
        cells, medians, times = [], [], []
        for label in labels:
            rows = got.get((corpus, slot, label), [])
            if not rows:
                cells.append(f"{'(not in this tree)':>30}")
                medians.append(None)
                times.append(f"{'':>22}")
                continue
            eff = [r["efficiency"] for r in rows]
            ms = [r["ms_per_epoch"] for r in rows]
            medians.append(statistics.median(eff))
            cells.append(f"{statistics.median(eff):>12.4f} ({min(eff):.4f}-{max(eff):.4f})")
            times.append(f"{statistics.median(ms):>8.0f} ({min(ms):.0f}-{max(ms):.0f})")
        diff = (f"{100 * (medians[0] / medians[-1] - 1):>+7.2f}%"
                if None not in medians and len(medians) > 1 else f"{'':>8}")
        lines.append(f"{corpus:<28} {contender:<32} " + " ".join(cells) + f" {diff} "
                     + " ".join(times))
    lines.append(f"diff.: the first tree's median efficiency over the last's; medians over "
                 f"{rounds} rounds (seeds 0-{rounds - 1}: the lengths and the seed), the range "
                 "over them in brackets")
    lines.append(f"load average (1 min) over the run: {min(loads):.1f}-{max(loads):.1f} on "
                 f"{os.cpu_count()} cores")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--utterances", type=int, default=100_000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--budget", type=float, default=600.0, help="padded seconds per batch")
    parser.add_argument("--recipe", action="store_true",
                        help="only train_pipeline's two roads at its defaults")
    parser.add_argument("--streams-curve", action="store_true",
                        help="only plan_batches' padding against V and the corpus size")
    parser.add_argument("--sizes", default=",".join(map(str, CURVE_SIZES)),
                        help="with --streams-curve: corpus sizes")
    parser.add_argument("--streams", default=",".join(map(str, CURVE_STREAMS)),
                        help="with --streams-curve: the V to compare (and auto)")
    parser.add_argument("--buffers", default=",".join(map(str, CURVE_BUFFERS)),
                        help="with --streams-curve: bucket buffers")
    parser.add_argument("--per-shard", type=int, default=CURVE_PER_SHARD,
                        help="with --streams-curve: utterances a shard")
    parser.add_argument("--base", default=None,
                        help="folders holding older speechpipes (comma-separated), run "
                             "beside this one")
    parser.add_argument("--head", default=None,
                        help="with --base: the folder of the newer speechpipe (default: this "
                             "checkout)")
    parser.add_argument("--rounds", type=int, default=3, help="with --base: seeds")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        spec = json.loads(args.child)
        print(json.dumps(run(spec["n"], spec["epochs"], spec["budget"], spec["seed"],
                             own_only=True)))
        return
    n, epochs = (3000, 2) if args.tiny else (args.utterances, args.epochs)
    if args.streams_curve or args.tiny:
        ints = lambda text: [int(x) for x in text.split(",")]  # noqa: E731
        sizes, streams = ((600, 3000), (1, 8)) if args.tiny else (ints(args.sizes),
                                                                  ints(args.streams))
        print(f"plan_batches against V and the corpus size (load {os.getloadavg()[0]:.1f})")
        print(streams_curve(sizes, streams, ints(args.buffers)[:1 if args.tiny else None],
                            args.budget if args.streams_curve else 200.0,
                            1 if args.tiny else args.rounds, args.per_shard))
        if args.streams_curve:
            return
    if args.base:
        print(f"{n} utterances per corpus, {epochs} epochs, budget {args.budget:g} padded "
              "seconds")
        here = args.head or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        folders = [here] + args.base.split(",")
        trees = {os.path.basename(os.path.normpath(f)): f for f in folders}
        if len(trees) < len(folders):
            trees = {f"tree{i}": f for i, f in enumerate(folders)}
        print(side_by_side(trees, n, epochs, args.budget, 1 if args.tiny else args.rounds))
        return
    if not args.recipe:
        print(f"{n} utterances per corpus, {epochs} epochs, budget {args.budget:g} padded "
              "seconds")
        print(table(run(n, epochs, args.budget)))
    if args.tiny or args.recipe:
        print(f"train_pipeline's roads, {n} utterances per corpus, {epochs} epochs, budget "
              f"{args.budget:g} padded seconds")
        print(table(run_recipe(n, epochs, args.budget)))


if __name__ == "__main__":
    main()
