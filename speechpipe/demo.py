"""The main job on the demo corpus: read -> decode -> shuffle -> bucket -> batch -> collate.

``speechpipe demo`` (and ``make demo``) runs :func:`run_demo` on the small synthesized
corpus shipped in ``speechpipe/demo_data/LibriSpeech`` (LibriSpeech's layout) and prints a
summary: utterances, batches, hours of audio, throughput and padding efficiency. Batches are
length-aware by default (a budget of padded seconds per batch); ``budget=SampleCount(n)`` gives
fixed-size batches instead, for comparison.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import torch

from .pipes.batching import batch_budget, BatchConstraint, SampleCount
from .pipes.collate import PadCollate
from .recipes.librispeech import librispeech_samples
from .sample import AUDIO, len_key

__all__ = ["DEMO_CORPUS", "DemoSummary", "build_demo_pipe", "run_demo"]

DEMO_CORPUS = os.path.join(os.path.dirname(__file__), "demo_data", "LibriSpeech")


def build_demo_pipe(
    corpus_dir: str = DEMO_CORPUS,
    *,
    part: str = "dev-clean",
    budget: float | BatchConstraint = 30.0,
    seed: int = 0,
    shard: bool = False,
):
    """The demo pipeline; yields padded batch dicts.

    Stages and element shapes::

        librispeech_samples    -> {key, text, speaker, audio (T,), sample_rate, audio_path}
        shuffle(seeded)        -> the same samples, in a seeded random order
        bucket_by_length(64)   -> groups of samples sorted by duration
        block_batch(budget)    -> lists of samples, n × longest duration <= budget seconds
          (with budget=SampleCount(n), no buckets: lists of n samples)
        collate(PadCollate)    -> {audio (B, T_max) float32, audio_len (B,) int64, key [..],
                                   text [..], speaker [..], sample_rate (B,), audio_path [..]}

    >>> from speechpipe import SampleCount
    >>> batch = next(iter(build_demo_pipe(budget=SampleCount(4))))
    >>> batch["audio"].shape[0], batch["audio_len"].dtype, len(batch["text"])
    (4, torch.int64, 4)
    """
    pipe = librispeech_samples(corpus_dir, part, shard=shard)
    pipe = pipe.shuffle(buffer_size=10_000).set_seed(seed)
    budget = batch_budget(budget, required=True)
    if not isinstance(budget, SampleCount):
        pipe = pipe.bucket_by_length(64, budget=budget, seed=seed)
    pipe = pipe.block_batch(budget, seed=seed)
    return pipe.collate(collate_fn=PadCollate())


@dataclass
class DemoSummary:
    utterances: int
    batches: int
    audio_seconds: float
    padded_seconds: float
    wall_seconds: float

    @property
    def padding_efficiency(self) -> float:
        """Real audio / padded audio (1.0 means no padding)."""
        return self.audio_seconds / self.padded_seconds if self.padded_seconds else 0.0

    def report(self) -> str:
        rate = self.utterances / self.wall_seconds if self.wall_seconds else float("inf")
        rtf = self.audio_seconds / self.wall_seconds if self.wall_seconds else float("inf")
        return "\n".join(
            [
                f"utterances          {self.utterances}",
                f"batches             {self.batches}",
                f"audio               {self.audio_seconds / 3600:.4f} h "
                f"({self.audio_seconds:.1f} s)",
                f"wall time           {self.wall_seconds:.2f} s",
                f"throughput          {rate:.1f} utterances/s, {rtf:.0f} s of audio per s",
                f"padding efficiency  {self.padding_efficiency:.3f} (real / padded samples)",
            ]
        )


def run_demo(
    corpus_dir: str = DEMO_CORPUS,
    *,
    part: str = "dev-clean",
    budget: float | BatchConstraint = 30.0,
    seed: int = 0,
    workers: int = 0,
    progress: bool = True,
) -> DemoSummary:
    """Run the demo pipeline once over the corpus and return its summary.

    Args:
        corpus_dir: a ``LibriSpeech`` folder.
        part: which part to read.
        budget: padded seconds per batch (batch size × longest utterance), or
            ``SampleCount(n)``: ``n`` utterances per batch, without buckets.
        seed: shuffle seed (the same seed gives the same batches).
        workers: DataLoader worker processes (0 runs in this process).
        progress: show progress (a tqdm bar on a terminal, else a line every 30 s).
    """
    from .progress import progress_bar

    pipe = build_demo_pipe(corpus_dir, part=part, budget=budget, seed=seed, shard=workers > 0)
    if workers > 0:
        loader = torch.utils.data.DataLoader(pipe, batch_size=None, num_workers=workers)
    else:
        loader = pipe
    utterances = batches = 0
    samples = padded = 0.0
    start = time.perf_counter()
    for batch in progress_bar(loader, desc="demo", unit="batch", disable=not progress):
        lengths = batch[len_key(AUDIO)]
        rates = batch["sample_rate"].double()
        samples += float((lengths.double() / rates).sum())
        padded += float(batch[AUDIO].shape[1] * (1.0 / rates).sum())
        utterances += len(lengths)
        batches += 1
    wall = time.perf_counter() - start
    return DemoSummary(utterances, batches, samples, padded, wall)
