"""``speechpipe stats``: hours, utterances, length percentiles, padding efficiency and a length
histogram of manifests or shards (:func:`~speechpipe.stats.corpus_stats`)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..stats import corpus_stats

__all__ = ["add_command", "run_command"]


def run_command(args: argparse.Namespace) -> int:
    """Run ``stats`` from parsed arguments: print the report, return the exit status."""
    try:
        stats = corpus_stats(args.inputs, None if args.budget <= 0 else args.budget,
                             png=args.png, bins=args.bins, buffer_size=args.buffer,
                             seed=args.seed, frame_shift=args.frame_shift,
                             sample_rate=args.sample_rate)
    except (ValueError, OSError) as exc:  # DataError, MissingDataError included
        print(f"speechpipe stats: error: {exc}", file=sys.stderr)
        return 2
    print(stats.report())
    return 0


def add_command(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``stats`` to the ``speechpipe`` command's subparsers; return its parser.

    ``speechpipe stats <manifest|shard folder|shard pattern> ... [--budget 600] [--png
    hist.png]`` prints hours, utterances, duration percentiles and the padding efficiency of
    budget batches, and draws the length histogram. ``args.func(args)`` returns the exit
    status.

    >>> parser = argparse.ArgumentParser(prog="speechpipe")
    >>> _ = add_command(parser.add_subparsers(dest="command"))
    >>> args = parser.parse_args(["stats", "m.jsonl.gz", "--budget", "300", "--png", "h.png"])
    >>> args.inputs, args.budget, args.png, args.func.__name__
    (['m.jsonl.gz'], 300.0, 'h.png', 'run_command')
    """
    parser = subparsers.add_parser(
        "stats",
        help="hours, utterances, length percentiles, padding efficiency, histogram PNG",
        description="Statistics of manifests (.jsonl/.tsv[.gz] with durations) or tar "
        "shards written by 'speechpipe pack' (a folder with index.jsonl, shard paths or a "
        "brace pattern): utterance count, hours, duration percentiles, the padding "
        "efficiency (real / padded seconds) of budget batches as the training pipelines "
        "make them, and a length histogram as a PNG.",
        epilog="example: speechpipe stats data/manifests/librispeech_samples_train-clean-100"
        ".jsonl.gz --budget 600 --png lengths.png",
    )
    parser.add_argument("inputs", nargs="+", metavar="MANIFEST|SHARDS",
                        help="manifest files, shard folders, shard paths or brace patterns")
    parser.add_argument("--budget", type=float, default=600.0, metavar="SECONDS",
                        help="padded seconds per batch for the padding efficiency (default "
                        "600; 0 skips it)")
    parser.add_argument("--png", default=None, metavar="FILE",
                        help="write the length histogram to this PNG file")
    parser.add_argument("--bins", type=int, default=40, help="histogram bins (default 40)")
    parser.add_argument("--buffer", type=int, default=2000, metavar="N",
                        help="utterances per sorted buffer in the batching simulation "
                        "(default 2000, as the training pipelines)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the simulated shuffle")
    parser.add_argument("--frame-shift", type=float, default=0.01, metavar="SECONDS",
                        help="seconds per frame, for lengths in frames (default 0.01)")
    parser.add_argument("--sample-rate", type=int, default=16000, metavar="HZ",
                        help="for shard lengths in samples (default 16000)")
    parser.set_defaults(func=run_command)
    return parser
