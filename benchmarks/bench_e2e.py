"""End to end: speechpipe's training pipeline beside webdataset's and lhotse's, same work.

Two workloads on one corpus (utterance durations drawn from LibriSpeech train-clean-100's
published percentiles, ``speechpipe.testing.sample_durations``):

1. **features**: 80-dim float32 "fbank" (100 frames/s) written as Kaldi arks + feats.scp and
   packed into tar shards by ``speechpipe.pack.pack_data`` -> shuffle -> length bucketing ->
   budget batches (padded area <= ``--budget`` seconds) -> padded tensors (``PadCollate``);
2. **audio**: 16 kHz FLAC (noise shaped per utterance) as files and, with the same bytes, in tar
   shards (``ShardWriter``) -> decode (soundfile) -> Kaldi fbank (80 bins, torchaudio's
   ``compliance.kaldi.fbank`` on the 16-bit scale, no dither) -> the same batching.

Contenders, each with DataLoader workers 0 and 2, warm page cache:

- **speechpipe**: ``sharded_shuffle(1000) -> decode [-> compute_features("fbank")] ->
  bucket_by_length(--bucket-buffer, 30 buckets) -> block_batch(PaddedArea) -> collate(PadCollate)``
  through ``speechpipe.loader.build_loader`` (batching in the workers);
- **webdataset** 1.0.2: ``WebDataset(shards, shardshuffle).shuffle(1000).decode()`` [+ a map
  doing soundfile + the same fbank] ``.batched(n, PadCollate())``. webdataset has no length
  bucketing, so ``n`` is the FIXED batch size that can never exceed the budget
  (``budget // longest utterance``); its batches are therefore smaller and more padded;
- **lhotse** 1.33: ``DynamicBucketingSampler(max_duration=budget, 30 buckets, shuffle)`` over
  cuts carrying the keys and durations, with a map-style torch ``Dataset`` doing the same work
  per batch (``kaldiio.load_mat`` from the same ark via feats.scp offsets; or soundfile on the
  same FLAC files + the same fbank) and ``PadCollate`` -- the sampler runs in the main process,
  the dataset in the workers.

Reported per contender (medians of the runs; each run in a fresh forked process so that peak
memory is its own, ``--epochs`` passes over one loader in it, the median epoch counted):
audio-seconds/s, utterances/s, time to first batch (from building the
loader), padding efficiency ("pad eff", real / padded frames), peak RSS (``ru_maxrss`` of the
run's process + the largest of its DataLoader workers; the baseline includes the imported
libraries, about the same for all). torch uses one intra-op thread in every process, so "cores
used" is ``max(1, workers)`` (with 2 workers the main process also takes CPU for unpickling
batches, on the same 2 cores).

For workload 2 the CPU limit is measured in the same run: one core's decode + fbank rate
(``soundfile.read`` + ``kaldi.fbank`` in a plain loop, ``torch.set_num_threads(1)``) times the
cores used; each contender's ratio to it is printed. Then speechpipe's per-stage overhead in
microseconds per sample over in-memory samples (each stage timed as the difference between the
pipeline with and without it; torch's identity ``map`` as the baseline of one stage), and, with
workers 2, per-utterance transfer (workers stop after ``decode``; the main process buckets,
batches and collates) against batch-in-worker transfer (the ``build_loader`` road).

    python -m benchmarks bench_e2e           # 1500 feature + 800 audio utterances, 2 runs
    python -m benchmarks bench_e2e --tiny    # 40 + 10 utterances, 1 run (smoke test)

Epoch to epoch: each run's per-epoch wall seconds, user CPU seconds and minor page faults,
and the spread (slowest / fastest epoch of a run) -- an intermittent slow epoch shows here
(issue 23.7: some epochs 5-8x slower, in user CPU, with no workers).

Nothing here is asserted; issue 6's targets are printed beside the measured ratios.
"""

from __future__ import annotations

import argparse
import io
import multiprocessing
import os
import resource
import statistics
import tempfile
import time
import traceback
import warnings

import numpy as np
import torch

import speechpipe  # noqa: F401  (registers the pipes)
from speechpipe.pipes._core import IterableWrapper
from speechpipe.pipes.batching import PaddedArea
from speechpipe.pipes.collate import PadCollate
from speechpipe.testing import sample_durations

from .bench_shards import make_corpus

CORPUS = "librispeech-train-clean-100"
RATE = 16000
FPS = 100  # frames per second of the features (10 ms shift)
NUM_BUCKETS = 30
SHUFFLE = 1000


# --------------------------------------------------------------------------------- data


def make_audio(root: str, n: int, shard_size: int, seed: int = 1) -> tuple[list[str], dict]:
    """Write (once) FLAC files and tar shards holding the same bytes; returns (shards, files)
    where ``files`` maps key -> (path, duration)."""
    import soundfile as sf

    from speechpipe.pipes.shards import ShardWriter

    files_dir = os.path.join(root, "flac")
    shards_dir = os.path.join(root, "audio_shards")
    done = os.path.join(root, "audio.done")
    durations = sample_durations(CORPUS, n, seed)
    keys = [f"aud{i:06d}" for i in range(n)]
    files = {k: (os.path.join(files_dir, f"{k}.flac"), float(d)) for k, d in zip(keys, durations)}
    if not os.path.exists(done):
        os.makedirs(files_dir, exist_ok=True)
        os.makedirs(shards_dir, exist_ok=True)
        rng = np.random.default_rng(seed)
        with ShardWriter(os.path.join(shards_dir, "audio-%05d.tar"), maxcount=shard_size) as w:
            for key in keys:
                path, duration = files[key]
                t = int(round(duration * RATE))
                # white noise through a random one-pole filter with a slow random envelope
                noise = rng.standard_normal(t).astype(np.float32)
                shaped = _one_pole(noise, rng.uniform(0.0, 0.95))
                env = np.interp(np.arange(t), np.linspace(0, t, 8), rng.uniform(0.05, 1.0, 8))
                audio = (0.1 * shaped * env / (np.abs(shaped).max() + 1e-9)).astype(np.float32)
                sf.write(path, audio, RATE, format="FLAC", subtype="PCM_16")
                with open(path, "rb") as f:
                    w.write({"key": key, "flac": f.read(), "txt": f"WORDS OF {key}"})
        open(done, "w").close()
    shards = sorted(os.path.join(shards_dir, p) for p in os.listdir(shards_dir)
                    if p.endswith(".tar"))
    return shards, files


def _one_pole(x: np.ndarray, a: float) -> np.ndarray:
    import torchaudio.functional as F

    y = F.lfilter(torch.from_numpy(x)[None], torch.tensor([1.0, -a]), torch.tensor([1.0, 0.0]),
                  clamp=False)
    return y[0].numpy()


def fbank(audio: np.ndarray) -> np.ndarray:
    """The workload's feature extraction, as speechpipe's ``compute_features("fbank")``."""
    from torchaudio.compliance import kaldi

    wave = torch.from_numpy(audio * 32768.0).unsqueeze(0)
    return kaldi.fbank(wave, num_mel_bins=80, dither=0.0, sample_frequency=RATE).numpy()


def read_flac(data) -> np.ndarray:
    import soundfile as sf

    audio, rate = sf.read(io.BytesIO(data) if isinstance(data, bytes) else data,
                          dtype="float32")
    return audio


# --------------------------------------------------------------------------------- contenders


def _constraint(budget_s: float) -> PaddedArea:
    return PaddedArea(budget=budget_s * FPS)


def speechpipe_pipe(shards, workload, budget_s, bucket_buffer, batch_in_worker=True):
    pipe = IterableWrapper(shards).sharded_shuffle(buffer_size=SHUFFLE, seed=0).decode()
    if workload == "audio":
        pipe = pipe.compute_features("fbank", num_mel_bins=80, keep_audio=False)
    if not batch_in_worker:
        return pipe
    return batch_stream(pipe, budget_s, bucket_buffer)


def batch_stream(pipe, budget_s, bucket_buffer):
    c = _constraint(budget_s)
    return (pipe.bucket_by_length(bucket_buffer, num_buckets=NUM_BUCKETS, budget=c, seed=0)
            .block_batch(c, seed=0).collate(collate_fn=PadCollate()))


def _wds_features(s):
    return {"key": s["__key__"], "feats": s["feats.npy"], "text": s["txt"]}


def _wds_audio(s):
    return {"key": s["__key__"], "feats": fbank(read_flac(s["flac"])), "text": s["txt"]}


def webdataset_pipe(shards, workload, batch_size):
    import webdataset as wds

    ds = wds.WebDataset(shards, shardshuffle=len(shards), seed=0, empty_check=False,
                        nodesplitter=wds.split_by_node, workersplitter=wds.split_by_worker)
    ds = ds.shuffle(SHUFFLE)
    if workload == "features":
        ds = ds.decode().map(_wds_features)
    else:
        ds = ds.decode().map(_wds_audio)  # decode() leaves flac as bytes: soundfile reads them
    return ds.batched(batch_size, collation_fn=PadCollate(), partial=True)


class LhotseFeatures(torch.utils.data.Dataset):
    """Map-style: a CutSet batch -> features loaded from the ark offsets -> padded batch."""

    def __init__(self, scp: str):
        with open(scp) as f:
            self.where = dict(line.strip().split(None, 1) for line in f)
        self.collate = PadCollate()

    def __getitem__(self, cuts):
        import kaldiio

        return self.collate([{"key": c.id, "feats": kaldiio.load_mat(self.where[c.id]),
                              "text": c.supervisions[0].text if c.supervisions else ""}
                             for c in cuts])


class LhotseAudio(torch.utils.data.Dataset):
    """Map-style: a CutSet batch -> soundfile decode of the FLAC files + fbank -> padded batch."""

    def __init__(self, files: dict):
        self.files = files
        self.collate = PadCollate()

    def __getitem__(self, cuts):
        return self.collate([{"key": c.id, "feats": fbank(read_flac(self.files[c.id][0])),
                              "text": ""} for c in cuts])


def lhotse_loader(durations: dict, dataset, budget_s, workers):
    from lhotse import CutSet
    from lhotse.dataset import DynamicBucketingSampler
    from lhotse.testing.dummies import dummy_cut

    cuts = []
    for i, (key, d) in enumerate(durations.items()):
        cut = dummy_cut(i, duration=float(d))
        cut.id = key
        cuts.append(cut)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sampler = DynamicBucketingSampler(CutSet.from_cuts(cuts), max_duration=budget_s,
                                          shuffle=True, num_buckets=min(NUM_BUCKETS, len(cuts)),
                                          seed=0)
    return torch.utils.data.DataLoader(dataset, sampler=sampler, batch_size=None,
                                       num_workers=workers)


# --------------------------------------------------------------------------------- measuring


def _peak_mb() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return (own + kids) / 1024  # KiB on Linux


def _consume(build, epochs: int) -> dict:
    """``epochs`` passes over one loader in this process: per-epoch wall seconds, user and
    system CPU seconds and minor/major page faults (``getrusage``), to tell a slow epoch's
    cause (CPU in copies, faults, waiting) from the figures."""
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
    start = time.perf_counter()
    loader = build()
    first = None
    per_epoch = []
    for _ in range(epochs):
        utts = frames = padded = 0
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        for batch in loader:
            if first is None:
                first = time.perf_counter() - start
            utts += len(batch["feats_len"])
            frames += int(batch["feats_len"].sum())
            padded += batch["feats"].shape[0] * batch["feats"].shape[1]
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        per_epoch.append({"seconds": time.perf_counter() - t0, "user": r1.ru_utime - r0.ru_utime,
                          "sys": r1.ru_stime - r0.ru_stime,
                          "minflt": r1.ru_minflt - r0.ru_minflt,
                          "majflt": r1.ru_majflt - r0.ru_majflt})
    return {"seconds": statistics.median(e["seconds"] for e in per_epoch),
            "first": first or float("nan"), "utts": utts, "audio_s": frames / FPS,
            "rss_mb": _peak_mb(), "pad_eff": frames / max(1, padded), "epochs": per_epoch}


def _child(build, epochs, conn) -> None:
    try:
        conn.send(_consume(build, epochs))
    except BaseException:  # report, do not hang the parent
        conn.send({"error": traceback.format_exc()})
    finally:
        conn.close()


def in_fork(build, epochs: int = 1) -> dict:
    """Run ``epochs`` passes over ``build()``'s batches in a fresh forked process (own peak
    RSS, own workers)."""
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(build, epochs, child))
    proc.start()
    child.close()
    result = parent.recv()
    proc.join()
    if "error" in result:
        raise RuntimeError(result["error"])
    return result


def measure(workload, name, build, workers, runs, files, epochs) -> dict:
    results = []
    for _ in range(runs):
        for path in files:  # warm the cache
            with open(path, "rb", buffering=0) as f:
                while f.read(16 << 20):
                    pass
        results.append(in_fork(build, epochs))
    med = {k: statistics.median(r[k] for r in results)
           for k in ("seconds", "first", "rss_mb")}
    r0 = results[0]
    spread = max(max(e["seconds"] for e in r["epochs"]) / min(e["seconds"] for e in r["epochs"])
                 for r in results)
    return {"workload": workload, "name": name, "workers": workers, "utts": r0["utts"],
            "audio_s": r0["audio_s"], "pad_eff": r0["pad_eff"], "first": med["first"],
            "rss_mb": med["rss_mb"], "spread": spread, "runs": [r["epochs"] for r in results],
            "utt_s": r0["utts"] / med["seconds"], "aud_s": r0["audio_s"] / med["seconds"]}


def cpu_limit(files: dict, limit_s: float) -> float:
    """One core's decode + fbank rate (audio seconds per second), plain loop."""
    def work():
        torch.set_num_threads(1)
        done = 0.0
        start = time.perf_counter()
        for path, _ in files.values():
            audio = read_flac(path)
            fbank(audio)
            done += len(audio) / RATE
            if time.perf_counter() - start > limit_s:
                break
        return done / (time.perf_counter() - start)

    return _fork_value(work)


def _fork_value(fn):
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)

    def target():
        child.send(fn())
        child.close()

    proc = ctx.Process(target=target)
    proc.start()
    value = parent.recv()
    proc.join()
    return value


def stage_overhead(n: int, repeats: int = 3) -> list[tuple[str, float]]:
    """µs per sample of each stage, as (pipeline with it) - (pipeline without it)."""
    frames = np.round(sample_durations(CORPUS, n, 2) * FPS).astype(int)
    base1 = np.zeros((int(frames.max()), 1), np.float32)
    base80 = np.zeros((int(frames.max()), 80), np.float32)
    samples1 = [{"key": f"u{i}", "feats": base1[:t]} for i, t in enumerate(frames)]
    samples80 = [{"key": f"u{i}", "feats": base80[:t]} for i, t in enumerate(frames)]
    c = _constraint(300.0)

    def timed(make) -> float:
        best = float("inf")
        for _ in range(repeats):
            pipe = make()
            start = time.perf_counter()
            for _ in pipe:
                pass
            best = min(best, time.perf_counter() - start)
        return best * 1e6 / n

    def src(s):
        return IterableWrapper(s, deepcopy=False)

    def bucket(s):
        return src(s).bucket_by_length(1000, num_buckets=NUM_BUCKETS, budget=c, seed=0)

    def block(s):
        return bucket(s).block_batch(c, seed=0)

    t_src = timed(lambda: src(samples1))
    t_map = timed(lambda: src(samples1).map(_identity))
    t_bucket = timed(lambda: bucket(samples1))
    t_block = timed(lambda: block(samples1))
    t_coll1 = timed(lambda: block(samples1).collate(collate_fn=PadCollate()))
    t_block80 = timed(lambda: block(samples80))
    t_coll80 = timed(lambda: block(samples80).collate(collate_fn=PadCollate()))
    return [("torch map(identity) (baseline)", t_map - t_src),
            ("bucket_by_length", t_bucket - t_src),
            ("block_batch", t_block - t_bucket),
            ("collate(PadCollate), 1-dim feats", t_coll1 - t_block),
            ("collate(PadCollate), 80-dim (copy)", t_coll80 - t_block80)]


def _identity(x):
    return x


# --------------------------------------------------------------------------------- run


def run(n_feats, n_audio, shard_size, audio_shard_size, runs, root, budget_s, bucket_buffer,
        overhead_n, limit_s, epochs):
    # imported here, before the forks, so that no run pays for importing its library
    import kaldiio  # noqa: F401
    import lhotse.dataset  # noqa: F401
    import soundfile  # noqa: F401
    import torchaudio.compliance.kaldi  # noqa: F401
    import webdataset  # noqa: F401

    from speechpipe.loader import build_loader

    shards, scp = make_corpus(os.path.join(root, "feats"), n_feats, shard_size)
    ark = os.path.join(root, "feats", "feats.ark")
    frames = np.round(sample_durations(CORPUS, n_feats, 0) * 100).astype(int)  # as make_corpus
    feat_durations = {f"utt{i:07d}": t / FPS for i, t in enumerate(frames)}
    audio_shards, files = make_audio(os.path.join(root, "audio"), n_audio, audio_shard_size)
    audio_durations = {k: d for k, (_, d) in files.items()}
    print(f"features: {n_feats} utterances, {sum(frames) / FPS / 3600:.2f} h, {len(shards)} "
          f"shards; audio: {n_audio} utterances, {sum(audio_durations.values()) / 3600:.2f} h, "
          f"{len(audio_shards)} shards; budget {budget_s:g} padded s, bucket buffer "
          f"{bucket_buffer}")
    rows = []
    for workload, sh, durs, data_files in (
            ("features", shards, feat_durations, shards + [ark]),
            ("audio", audio_shards, audio_durations,
             audio_shards + [p for p, _ in files.values()])):
        wds_batch = max(1, int(budget_s // max(durs.values())))
        dataset = LhotseFeatures(scp) if workload == "features" else LhotseAudio(files)
        for workers in (0, 2):
            contenders = [
                ("speechpipe", lambda w=workers, sh=sh, wl=workload: build_loader(
                    speechpipe_pipe(sh, wl, budget_s, bucket_buffer), num_workers=w, seed=0)),
                (f"webdataset (fixed {wds_batch})", lambda w=workers, sh=sh, wl=workload: (
                    torch.utils.data.DataLoader(webdataset_pipe(sh, wl, wds_batch),
                                                batch_size=None, num_workers=w))),
                ("lhotse", lambda w=workers, d=durs, ds=dataset: lhotse_loader(
                    d, ds, budget_s, w)),
            ]
            if workers == 2 and workload == "features":
                contenders.append(("speechpipe per-utt transfer", lambda sh=sh: batch_stream(
                    IterableWrapper(build_loader(speechpipe_pipe(
                        sh, "features", budget_s, bucket_buffer, batch_in_worker=False),
                        num_workers=2, seed=0), deepcopy=False), budget_s, bucket_buffer)))
            for name, build in contenders:
                rows.append(measure(workload, name, build, workers, runs, data_files, epochs))
                r = rows[-1]
                print(f"  .. {workload} {name} wk {workers}: {r['aud_s']:.0f} audio-s/s",
                      flush=True)
    limit = cpu_limit(files, limit_s)
    overhead = stage_overhead(overhead_n)
    return rows, limit, overhead


def table(rows, limit, overhead) -> str:
    head = (f"{'workload':<9} {'contender':<28} {'wk':>2} {'audio-s/s':>9} {'utt/s':>7} "
            f"{'1st batch s':>11} {'peak RSS MB':>11} {'pad eff':>7} {'/limit':>7}")
    out = [head, "-" * len(head)]
    for r in rows:
        ratio = (f"{r['aud_s'] / (limit * max(1, r['workers'])):>7.2f}"
                 if r["workload"] == "audio" else f"{'':>7}")
        out.append(f"{r['workload']:<9} {r['name']:<28} {r['workers']:>2} {r['aud_s']:>9.0f} "
                   f"{r['utt_s']:>7.1f} {r['first']:>11.2f} {r['rss_mb']:>11.0f} "
                   f"{r['pad_eff']:>7.3f} {ratio}")
    out.append("")
    out.append(f"CPU limit (one core, soundfile.read + kaldi.fbank, 1 thread): {limit:.0f} "
               f"audio-s/s; /limit = audio-s/s / (limit x max(1, workers)); target >= 0.85")
    get = {(r["workload"], r["name"].split(" (")[0], r["workers"]): r for r in rows}
    for workload, targets in (("features", "targets >= 2 x webdataset, >= 1.5 x lhotse"),
                              ("audio", "target: ahead of both")):
        for workers in (0, 2):
            sp = get[(workload, "speechpipe", workers)]["aud_s"]
            wd = get[(workload, "webdataset", workers)]["aud_s"]
            lh = get[(workload, "lhotse", workers)]["aud_s"]
            out.append(f"{workload} workers {workers}: speechpipe / webdataset {sp / wd:.2f}, "
                       f"speechpipe / lhotse {sp / lh:.2f} (audio-s/s; {targets})")
    per_utt = get.get(("features", "speechpipe per-utt transfer", 2))
    if per_utt:
        sp = get[("features", "speechpipe", 2)]
        out.append(f"features workers 2: batch-in-worker / per-utterance transfer "
                   f"{sp['aud_s'] / per_utt['aud_s']:.2f} (audio-s/s)")
    out.append("")
    out.append("epoch to epoch in one process (each run: per-epoch wall s / user CPU s / "
               "minor faults in thousands; spread = slowest / fastest epoch, worst run):")
    for r in rows:
        runs = "; ".join(" ".join(f"{e['seconds']:.2f}/{e['user']:.2f}/{e['minflt'] / 1000:.0f}k"
                                  for e in epochs) for epochs in r["runs"])
        out.append(f"  {r['workload']:<9} {r['name']:<28} {r['workers']:>2}  spread "
                   f"{r['spread']:>5.2f}  {runs}")
    out.append("")
    out.append("speechpipe per-stage overhead (in-memory samples, best of 3; target <= 2 µs):")
    for name, us in overhead:
        out.append(f"  {name:<36} {us:>7.2f} µs/sample")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--utterances", type=int, default=1500, help="feature workload")
    parser.add_argument("--audio-utterances", type=int, default=800)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3, help="epochs per run, one process")
    parser.add_argument("--budget", type=float, default=300.0, help="padded seconds per batch")
    parser.add_argument("--bucket-buffer", type=int, default=300)
    parser.add_argument("--root", default=None, help="corpus folder (reused if present)")
    args = parser.parse_args(argv)
    if args.tiny:
        with tempfile.TemporaryDirectory() as root:
            rows, limit, overhead = run(40, 10, 10, 3, 1, root, 60.0, 30, 1000, 0.5, 2)
            print(table(rows, limit, overhead))
        return
    root = args.root or os.path.join(
        tempfile.gettempdir(), f"speechpipe-bench-e2e-{args.utterances}-{args.audio_utterances}")
    rows, limit, overhead = run(args.utterances, args.audio_utterances, 100, 20, args.runs, root,
                                args.budget, args.bucket_buffer, 20000, 10.0, args.epochs)
    print(table(rows, limit, overhead))


if __name__ == "__main__":
    main()
