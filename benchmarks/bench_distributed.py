"""DDP: per-rank balance of shard splits, and what each uneven-input policy drops or repeats.

Shard sets are built like ``pack`` builds them: utterance durations drawn from real corpora's
published percentiles (``speechpipe.testing.sample_durations``), written in shards of 2000
utterances with a partial last shard -- one folder per length group when grouped (CAT's
``filter_group``: a group's shards hold utterances of similar length, so shards of different
groups differ up to 4x in total duration). Lengths are frames at 100 frames/s. Ranks (8 to 64)
are simulated from the index alone; no process is started.

Table 1, **split balance** (frames per rank, mean over epochs, and the worst epoch):

- count round robin over the epoch's shuffled order (speechpipe without an index, CAT);
- webdataset ``split_by_node`` (``urls[rank::world]`` on the listed order, before its shard
  shuffle: the same shards on a rank every epoch);
- speechpipe's duration-balanced split (:func:`speechpipe.pipes.order._assignment.assign_shards`
  with the index's lengths).

Table 2, **uneven-input policies** (one epoch per row, averaged over epochs): each rank's
batches come from the same batching as training would do -- its shards in order, the seeded
sample buffer of ``sharded_shuffle`` (2000), ``bucket_by_length`` (30 buckets, ~35 batches of
buffer) and ``block_batch`` (PaddedArea, 600 padded seconds) -- run on lengths. Columns: frames
dropped and repeated as a fraction of the epoch's frames, the spread of steps between ranks
(anything but 0 hangs a DDP job), and collectives per rank per epoch.

- speechpipe ``stop`` / ``pad`` / ``plan`` (exact plan to the fewest batches; to the mean,
  ranks above dropping and ranks below repeating their first batches; and the conservative
  lower bound); ``stop`` also over a count split, to separate the split from the policy;
- CAT: count split with the ``n mod ranks`` remainder shards dropped, then ``stop``;
- webdataset ``split_by_node`` + ``with_epoch(nbatches)`` on the loader (as its docs advise):
  every rank takes exactly ``nbatches`` from its endless repeated stream, so a rank with less
  data repeats the start of its next pass and one with more loses the rest of its pass (the
  next epoch starts a fresh pass). ``nbatches`` = the mean batches per rank, the best a user
  can set without a per-rank count (favourable to webdataset);
- torchdata ``fullsync`` (an all-reduce per element; stops when the first rank runs out): per
  batch it equals ``stop`` over a count split (and cannot run in DataLoader workers); placed
  per sample, before batching, every rank keeps the same number of *samples*, but budget
  batching then still gives different numbers of steps.

Table 3, **the cost of hearing a failure under** ``plan`` (real processes: 2 ranks in a gloo
group on 127.0.0.1, a loop that all-reduces one float per step as DDP does, batches from a
list): steps/s of ``EqualSteps`` with ``plan`` and its failure channel off
(``check_every=0``), on (one store check per step, the default) and every 10 steps, beside
``stop`` (its all-reduce per step) and the bare loop without ``EqualSteps``. The
configurations take turns round by round; medians, per-round ranges and the ratio to the bare
loop.

    python -m benchmarks bench_distributed           # 3 corpora, 8-64 ranks, 2 epochs
    python -m benchmarks bench_distributed --tiny    # one 200 h corpus, 8 ranks, 1 epoch
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import socket
import statistics
import time
from datetime import timedelta
from dataclasses import dataclass

import numpy as np

from speechpipe.pipes.order import assign_shards, ShardSplit, shuffle_shards, split_balance
from speechpipe.pipes.batching import bucket_groups, pack_batches
from speechpipe.sample import estimate_boundaries
from speechpipe.pipes.batching import PaddedArea
from speechpipe.pipes.order import shuffle_buffer
from speechpipe.pipes.order._streaming import _SAMPLES_SALT
from speechpipe.seeding import derive_rng
from speechpipe.testing import sample_durations

FRAMES_PER_SECOND = 100
PER_SHARD = 2000
BUDGET = 600 * FRAMES_PER_SECOND  # padded frames per batch
SAMPLE_BUFFER = 2000  # sharded_shuffle's buffer
BUCKET_BATCHES = 35  # bucket_by_length's buffer in typical batches (see bench_batching)
PAD_CACHE = 4  # EqualSteps' default

#: name: (distribution, hours, length-group cuts in frames or None)
CORPORA = {
    "librispeech-960h": ("librispeech-train-clean-100", 960, None),
    "librispeech-960h-grouped": ("librispeech-train-clean-100", 960, (500, 1000, 1500)),
    "wenetspeech-1000h-grouped": ("wenetspeech-m", 1000, (200, 400, 800)),
}
#: Too big to batch in a benchmark run: split balance only (CAT's 10,000 h, ~7,500 shards).
SPLIT_ONLY = {"wenetspeech-10000h-grouped": ("wenetspeech-l", 10_000, (200, 400, 800))}
TINY = {"librispeech-200h-grouped": ("librispeech-train-clean-100", 200, (500, 1000, 1500))}


@dataclass
class Shard:
    name: str
    lengths: np.ndarray  # frames per utterance, in file order

    @property
    def total(self) -> float:
        return float(self.lengths.sum())


def make_shards(corpus: str, hours: float, cuts, seed: int = 0) -> list[Shard]:
    """Shards of PER_SHARD utterances (the last of each group partial), named so that the
    listed (sorted) order is group by group, as a brace pattern over group folders lists them."""
    probe = sample_durations(corpus, 20_000, seed, usable_only=True)
    n = int(hours * 3600 / float(probe.mean()))
    frames = np.round(sample_durations(corpus, n, seed + 1, usable_only=True)
                      * FRAMES_PER_SECOND).astype(np.int64)
    edges = [0, *(cuts or ()), np.iinfo(np.int64).max]
    shards = []
    for g, (low, high) in enumerate(zip(edges, edges[1:])):
        group = frames[(frames >= low) & (frames < high)]
        for i, start in enumerate(range(0, len(group), PER_SHARD)):
            shards.append(Shard(f"g{g}/data-{i:05d}.tar", group[start:start + PER_SHARD]))
    return sorted(shards, key=lambda s: s.name)


# --------------------------------------------------------------------------------------------
# splits: rank -> shard names, per epoch
# --------------------------------------------------------------------------------------------


def split_count(names, world, epoch, seed):
    order = shuffle_shards(names, seed, epoch)
    return [order[r::world] for r in range(world)], []


def split_webdataset(names, world, epoch, seed):
    """split_by_node on the listed order (islice(urls, rank, None, world)), then the rank's
    own shard shuffle (detshuffle with seed + epoch)."""
    parts = []
    for r in range(world):
        mine = list(names[r::world])
        derive_rng(seed, epoch, r, 0, "wds-detshuffle").shuffle(mine)
        parts.append(mine)
    return parts, []


def split_length(weights, split=None):
    def run(names, world, epoch, seed):
        a = assign_shards(shuffle_shards(names, seed, epoch), world_size=world,
                          weights=weights, split=split)
        return [a.rank_shards(r) for r in range(world)], list(a.dropped)
    return run


def split_cat(names, world, epoch, seed):
    a = assign_shards(shuffle_shards(names, seed, epoch), world_size=world,
                      split=ShardSplit(balance="count", equalize="drop"))
    return [a.rank_shards(r) for r in range(world)], list(a.dropped)


# --------------------------------------------------------------------------------------------
# batching one rank's epoch on lengths
# --------------------------------------------------------------------------------------------


def rank_stream(shards: dict, names: list[str], epoch: int, rank: int, seed: int) -> list[int]:
    lengths = [int(n) for name in names for n in shards[name].lengths]
    rng = derive_rng(seed, epoch, rank, 0, _SAMPLES_SALT)
    return list(shuffle_buffer(lengths, SAMPLE_BUFFER, rng))


def batch_frames(stream: list[int], boundaries, bucket_buffer: int, rng) -> list[int]:
    """Real frames of each batch, in emission order (bucket_by_length + block_batch)."""
    constraint = PaddedArea(budget=BUDGET)
    out = []
    for group in bucket_groups(iter(stream), buffer_size=bucket_buffer, boundaries=boundaries,
                               measure=int, rng=rng):
        out.extend(sum(b) for b in pack_batches(group, constraint, lengths=int))
    return out


# --------------------------------------------------------------------------------------------
# the policies, from each rank's batches
# --------------------------------------------------------------------------------------------


def cycled(frames: list[int], k: int, period: int) -> int:
    """Frames of the first ``k`` items of ``frames[:period]`` repeated."""
    head = frames[:max(1, min(period, len(frames)))]
    if not head:
        return 0
    full, rest = divmod(k, len(head))
    return full * sum(head) + sum(head[:rest])


def stop(per_rank):
    steps = min(map(len, per_rank))
    return steps, sum(sum(b[steps:]) for b in per_rank), 0, 0


def pad(per_rank):
    steps = max(map(len, per_rank))
    return steps, 0, sum(cycled(b, steps - len(b), PAD_CACHE) for b in per_rank), 0


def plan_mean(per_rank):
    steps = sum(map(len, per_rank)) // len(per_rank)
    dropped = sum(sum(b[steps:]) for b in per_rank)
    return steps, dropped, sum(cycled(b, steps - len(b), PAD_CACHE) for b in per_rank
                               if len(b) < steps), 0


def plan_bound(per_rank):
    steps = min(max(1, math.ceil(sum(b) / BUDGET)) for b in per_rank)
    return steps, sum(sum(b[steps:]) for b in per_rank), 0, 0


def with_epoch(per_rank):
    nb = sum(map(len, per_rank)) // len(per_rank)
    dropped = sum(sum(b[nb:]) for b in per_rank)
    repeated = sum(cycled(b, nb - len(b), len(b)) for b in per_rank if len(b) < nb)
    return nb, dropped, repeated, 0


def fullsync_per_sample(streams, boundaries, bucket_buffer, epoch, seed):
    keep = min(map(len, streams))
    dropped = sum(sum(s[keep:]) for s in streams)
    steps = [len(batch_frames(s[:keep], boundaries, bucket_buffer,
                              derive_rng(seed, epoch, r, 0, "bucket")))
             for r, s in enumerate(streams)]
    return min(steps), dropped, 0, max(steps) - min(steps)


# --------------------------------------------------------------------------------------------
# runs
# --------------------------------------------------------------------------------------------


def balance_rows(name, shards, worlds, epochs, seed):
    by_name = {s.name: s for s in shards}
    names = [s.name for s in shards]
    weights = {s.name: s.total for s in shards}
    splits = [("count round robin", split_count), ("webdataset split_by_node", split_webdataset),
              ("speechpipe by duration", split_length(weights))]
    rows = []
    for world in worlds:
        for label, split in splits:
            ratios, means, counts = [], [], []
            for epoch in range(epochs):
                parts, _ = split(names, world, epoch, seed)
                b = split_balance([sum(by_name[n].total for n in p) for p in parts])
                ratios.append(b.max_over_min)
                means.append(b.max_over_mean)
                counts.append((min(map(len, parts)), max(map(len, parts))))
            rows.append({"corpus": name, "ranks": world, "split": label,
                         "max/min": float(np.mean(ratios)), "worst": max(ratios),
                         "max/mean": float(np.mean(means)),
                         "shards": f"{min(c[0] for c in counts)}-{max(c[1] for c in counts)}"})
    return rows


def policy_rows(name, shards, worlds, epochs, seed):
    by_name = {s.name: s for s in shards}
    names = [s.name for s in shards]
    weights = {s.name: s.total for s in shards}
    all_lengths = np.concatenate([s.lengths for s in shards])
    boundaries = estimate_boundaries(all_lengths.tolist(), 30)
    bucket_buffer = int(BUCKET_BATCHES * BUDGET / float(all_lengths.mean()))
    total = float(all_lengths.sum())
    rows = []
    for world in worlds:
        acc: dict[str, list] = {}

        def add(label, result, collectives):
            steps, dropped, repeated, spread = result
            acc.setdefault(label, []).append(
                (dropped / total, repeated / total, spread, collectives(steps)))

        for epoch in range(epochs):
            batches = {}
            for key, split in (("count", split_count), ("length", split_length(weights)),
                               ("wds", split_webdataset), ("cat", split_cat)):
                parts, dropped_shards = split(names, world, epoch, seed)
                streams = [rank_stream(by_name, p, epoch, r, seed) for r, p in enumerate(parts)]
                per_rank = [batch_frames(s, boundaries, bucket_buffer,
                                         derive_rng(seed, epoch, r, 0, "bucket"))
                            for r, s in enumerate(streams)]
                batches[key] = (per_rank, streams,
                                sum(by_name[n].total for n in dropped_shards))
            count, length = batches["count"][0], batches["length"][0]
            spread = max(map(len, length)) - min(map(len, length))
            add("no policy (duration split)", (0, 0, 0, spread), lambda s: 0)
            add("stop, count split", stop(count), lambda s: s + 1)
            add("stop, duration split", stop(length), lambda s: s + 1)
            add("pad, duration split", pad(length), lambda s: s + 1)
            add("plan exact, duration split", stop(length), lambda s: 1)
            add("plan to the mean, duration split", plan_mean(length), lambda s: 2)
            add("plan lower bound, duration split", plan_bound(length), lambda s: 1)
            cat_per_rank, _, cat_dropped = batches["cat"]
            s, d, r, sp = stop(cat_per_rank)
            add("CAT: drop remainder + stop", (s, d + cat_dropped, r, sp), lambda s: s + 1)
            add("webdataset split_by_node+with_epoch", with_epoch(batches["wds"][0]),
                lambda s: 0)
            add("torchdata fullsync per batch", stop(count), lambda s: s + 1)
            add("torchdata fullsync per sample",
                fullsync_per_sample(batches["count"][1], boundaries, bucket_buffer, epoch, seed),
                lambda s: None)
        for label, values in acc.items():
            dropped, repeated, spread, collectives = zip(*values)
            sync = ("per sample" if collectives[0] is None
                    else f"{np.mean(collectives):.0f}")
            rows.append({"corpus": name, "ranks": world, "contender": label,
                         "dropped": float(np.mean(dropped)), "repeated": float(np.mean(repeated)),
                         "spread": max(spread), "sync": sync})
    return rows


def balance_table(rows) -> str:
    head = (f"{'corpus':<27} {'ranks':>5} {'split':<26} {'max/min':>8} {'worst':>8} "
            f"{'max/mean':>8} {'shards/rank':>11}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['corpus']:<27} {r['ranks']:>5} {r['split']:<26} {r['max/min']:>8.4f} "
                     f"{r['worst']:>8.4f} {r['max/mean']:>8.4f} {r['shards']:>11}")
    return "\n".join(lines)


def policy_table(rows) -> str:
    head = (f"{'corpus':<27} {'ranks':>5} {'contender':<37} {'dropped':>8} {'repeated':>8} "
            f"{'step spread':>11} {'syncs/epoch':>11}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['corpus']:<27} {r['ranks']:>5} {r['contender']:<37} "
                     f"{100 * r['dropped']:>7.2f}% {100 * r['repeated']:>7.2f}% "
                     f"{r['spread']:>11} {r['sync']:>11}")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# the failure channel's cost, on a real gloo group
# --------------------------------------------------------------------------------------------

#: label: (policy, check_every) of EqualSteps, or None for the bare loop.
CHANNEL_CONFIGS = {
    "bare loop (no EqualSteps)": None,
    "plan, channel off (check_every=0)": ("plan", 0),
    "plan, channel on (check_every=1)": ("plan", 1),
    "plan, check_every=10": ("plan", 10),
    "stop (all-reduce per step)": ("stop", None),
}


def _channel_rank(rank: int, world: int, port: int, steps: int, rounds: int, queue) -> None:
    import torch
    import torch.distributed as dist

    from speechpipe.pipes.distributed import EqualSteps

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=120))
    batches = [[i] for i in range(steps)]
    grad = torch.zeros(1)
    times: dict[str, list[float]] = {label: [] for label in CHANNEL_CONFIGS}
    for r in range(rounds):
        labels = list(CHANNEL_CONFIGS)
        order = labels[r % len(labels):] + labels[:r % len(labels)]  # take turns
        for label in order:
            config = CHANNEL_CONFIGS[label]
            if config is None:
                source = batches
            else:
                policy, every = config
                source = EqualSteps(batches, policy, steps=steps if policy == "plan" else None,
                                    check_every=every if every is not None else 1, timeout=60)
            dist.barrier()
            start = time.perf_counter()
            for _ in source:
                dist.all_reduce(grad)  # the training loop's gradient all-reduce
            times[label].append(steps / (time.perf_counter() - start))
    if rank == 0:
        queue.put(times)
    dist.barrier()
    dist.destroy_process_group()


def channel_rows(steps: int, rounds: int) -> list[dict]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_channel_rank, args=(r, 2, port, steps, rounds, queue))
             for r in range(2)]
    for p in procs:
        p.start()
    times = queue.get(timeout=600)
    for p in procs:
        p.join(timeout=60)
    bare = statistics.median(times["bare loop (no EqualSteps)"])
    return [{"config": label, "median": statistics.median(v), "low": min(v), "high": max(v),
             "ratio": statistics.median(v) / bare} for label, v in times.items()]


def channel_table(rows) -> str:
    head = f"{'configuration':<36} {'steps/s':>9} {'range':>17} {'vs bare':>8} {'us/step':>8}"
    lines = [head, "-" * len(head)]
    bare = rows[0]["median"]
    for r in rows:
        extra = 1e6 / r["median"] - 1e6 / bare
        lines.append(f"{r['config']:<36} {r['median']:>9.0f} {r['low']:>8.0f}-{r['high']:<8.0f} "
                     f"{r['ratio']:>8.3f} {extra:>+8.1f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.tiny:
        corpora, split_only, worlds, epochs = TINY, {}, (8,), 1
    else:
        corpora, split_only, worlds, epochs = CORPORA, SPLIT_ONLY, (8, 16, 32, 64), args.epochs
    start = time.perf_counter()
    sets = {name: make_shards(*spec, seed=args.seed)
            for name, spec in {**corpora, **split_only}.items()}
    for name, shards in sets.items():
        totals = np.array([s.total for s in shards])
        print(f"{name}: {sum(len(s.lengths) for s in shards)} utterances in {len(shards)} "
              f"shards; shard duration min/median/max {totals.min() / 360000:.2f}/"
              f"{np.median(totals) / 360000:.2f}/{totals.max() / 360000:.2f} h")
    balance = [row for name, shards in sets.items()
               for row in balance_rows(name, shards, worlds, max(epochs, 3), args.seed)]
    print("\nsplit balance: frames per rank (mean over epochs; worst epoch)")
    print(balance_table(balance))
    policies = [row for name in corpora
                for row in policy_rows(name, sets[name], worlds, epochs, args.seed)]
    print(f"\nuneven inputs: share of the epoch's frames dropped / repeated ({epochs} epoch(s))")
    print(policy_table(policies))
    steps, rounds = (500, 3) if args.tiny else (5000, 7)
    print(f"\nplan's failure channel: 2 gloo ranks, one all-reduce per step in the loop, "
          f"{steps} steps x {rounds} rounds (medians; us/step beyond the bare loop)")
    print(channel_table(channel_rows(steps, rounds)))
    print(f"\n({time.perf_counter() - start:.1f} s)")


if __name__ == "__main__":
    main()
