"""``speechpipe demo``: the main job on the shipped demo corpus."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["add_command"]


def _demo(args: argparse.Namespace) -> int:
    from ..demo import DEMO_CORPUS, run_demo

    corpus = args.corpus or DEMO_CORPUS
    batching = (f"batch size {args.batch_size}" if args.batch_size else
                f"budget {args.budget:g} padded s per batch")
    print(f"speechpipe demo: {corpus} [{args.part}], {batching}, seed {args.seed}, "
          f"workers {args.workers}")
    from ..pipes.batching import SampleCount

    budget = SampleCount(args.batch_size) if args.batch_size else args.budget
    summary = run_demo(corpus, part=args.part, budget=budget, seed=args.seed,
                       workers=args.workers, progress=not args.no_progress)
    print(summary.report())
    return 0


def add_command(subparsers: Any) -> argparse.ArgumentParser:
    demo = subparsers.add_parser(
        "demo",
        help="read, decode, shuffle, batch and collate the shipped demo corpus",
        description="Run the main job (read -> decode -> shuffle -> length-bucketed budget "
        "batches -> collate) on a "
        "LibriSpeech-layout corpus (default: the small synthesized one shipped with "
        "speechpipe) and print a summary.",
    )
    demo.add_argument("--corpus", help="a LibriSpeech folder (default: the shipped demo corpus)")
    demo.add_argument("--part", default="dev-clean", help="part to read (default: dev-clean)")
    demo.add_argument("--budget", type=float, default=30.0,
                      help="padded seconds per batch: size × longest utterance (default 30)")
    demo.add_argument("--batch-size", type=int, default=None,
                      help="fixed utterances per batch instead of a budget (to compare)")
    demo.add_argument("--seed", type=int, default=0, help="shuffle seed")
    demo.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    demo.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    demo.set_defaults(func=_demo)
    return demo
