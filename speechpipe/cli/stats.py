"""``speechpipe stats``: a summary (utterances, speakers, hours, sample rates, channels, empty,
short and long utterances), length percentiles, padding efficiency and a length histogram of
manifests or shards (:func:`~speechpipe.stats.corpus_stats`)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..remote import RemoteOptions
from ..stats import corpus_stats

__all__ = ["add_command", "run_command"]


def run_command(args: argparse.Namespace) -> int:
    """Run ``stats`` from parsed arguments: print the report, return the exit status."""
    try:
        remote = (RemoteOptions(storage_options=dict(args.storage_option))
                  if args.storage_option else None)
        stats = corpus_stats(args.inputs, None if args.budget <= 0 else args.budget,
                             png=args.png, bins=args.bins, buffer_size=args.buffer,
                             seed=args.seed, frame_shift=args.frame_shift,
                             sample_rate=args.sample_rate, min_seconds=args.min_seconds,
                             max_seconds=args.max_seconds, log_y=args.log_y, remote=remote)
    except (ValueError, OSError, ImportError) as exc:  # DataError, MissingDataError included
        print(f"speechpipe stats: error: {exc}", file=sys.stderr)
        return 2
    print(stats.report(histogram=not args.no_histogram))
    return 0


def storage_option(text: str) -> tuple[str, Any]:
    """``"key=value"`` to ``(key, value)``; ``true``/``false``/numbers/JSON as such.

    >>> storage_option("anon=true"), storage_option("endpoint_url=http://h:9000")
    (('anon', True), ('endpoint_url', 'http://h:9000'))
    """
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except ValueError:
        return key, value


def add_command(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``stats`` to the ``speechpipe`` command's subparsers; return its parser.

    ``speechpipe stats <manifest|shard folder|shard pattern> ... [--budget 600] [--png
    hist.png] [--log-y]`` prints a summary (utterances, speakers, hours, sample rates, channels,
    empty transcripts, undersize and oversize counts), duration percentiles, the padding
    efficiency of budget batches and a text histogram, and draws the histogram as a PNG (with
    matplotlib). ``args.func(args)`` returns the exit status.

    >>> parser = argparse.ArgumentParser(prog="speechpipe")
    >>> _ = add_command(parser.add_subparsers(dest="command"))
    >>> args = parser.parse_args(["stats", "m.jsonl.gz", "--budget", "300", "--png", "h.png"])
    >>> args.inputs, args.budget, args.png, args.func.__name__
    (['m.jsonl.gz'], 300.0, 'h.png', 'run_command')
    """
    parser = subparsers.add_parser(
        "stats",
        help="summary, length percentiles, padding efficiency, length histogram",
        description="Statistics of manifests (.jsonl/.tsv[.gz] with durations) or tar "
        "shards written by 'speechpipe pack' (its output folder, shard paths or a brace "
        "pattern): utterances, speakers, hours, sample rates, channels, empty transcripts, "
        "utterances shorter or longer than given, duration percentiles, the padding "
        "efficiency (real / padded seconds) of budget batches as the training pipelines "
        "make them, and a length histogram as text and (with matplotlib: pip install "
        "'speechpipe[plot]') as a PNG.",
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
    parser.add_argument("--log-y", action="store_true",
                        help="log-scaled utterance counts in the histograms (shows the tail)")
    parser.add_argument("--no-histogram", action="store_true",
                        help="leave the text histogram out of the report")
    parser.add_argument("--min-duration", dest="min_seconds", type=float, default=0.1,
                        metavar="SECONDS", help="count utterances shorter than this as "
                        "undersize (default 0.1)")
    parser.add_argument("--max-duration", dest="max_seconds", type=float, default=None,
                        metavar="SECONDS", help="count utterances longer than this as "
                        "oversize (default: the budget)")
    parser.add_argument("--buffer", type=int, default=2000, metavar="N",
                        help="utterances per sorted buffer in the batching simulation "
                        "(default 2000, as the training pipelines)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the simulated shuffle")
    parser.add_argument("--frame-shift", type=float, default=0.01, metavar="SECONDS",
                        help="seconds per frame, for lengths in frames (default 0.01)")
    parser.add_argument("--sample-rate", type=int, default=16000, metavar="HZ",
                        help="for shard lengths in samples (default 16000)")
    parser.add_argument("--storage-option", action="append", type=storage_option, default=[],
                        metavar="KEY=VALUE",
                        help="an option of the object store's file system for URLs (s3fs: "
                        "endpoint_url=http://..., anon=true, profile=...; repeatable); "
                        "credentials also come from the usual AWS_* variables and files")
    parser.set_defaults(func=run_command)
    return parser
