"""``speechpipe pack``: Kaldi tables or manifests to tar shards with an index
(:func:`~speechpipe.pack.pack_data`)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..errors import MissingDataError, SpeechpipeError
from ..pack import (
    AUDIO_FORMATS,
    COMPRESS,
    KINDS,
    LENGTH_UNITS,
    ON_MISMATCH,
    UTTS_PER_SHARD,
    pack_data,
)
from ..recipes import EMPTY_TEXT

__all__ = ["add_command", "run_command"]

_CLI_EXAMPLES = """\
examples:
  speechpipe pack --scp data/train/feats.scp --labels data/train/text --out shards/train \\
      --group 10:500 --group 500:800 --workers 8
  speechpipe pack --scp data/train/wav.scp --segments data/train/segments \\
      --labels data/train/text --out shards/train --length-unit seconds --group 1:20
  speechpipe pack --manifest train.jsonl --out shards/train
  speechpipe pack --scp data/train/wav.scp --labels data/train/text --out shards/train \\
      --allow-commands --length-unit seconds

read the result with:
  IterableWrapper(["shards/train"]).list_shards().open().read_shards().decode()
  (a folder stands for every shard its index or its groups' indexes list)
"""


def add_command(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``pack`` subcommand to an argparse ``subparsers`` object; return its parser.

    The subcommand's ``func`` default is :func:`run_command`: call ``args.func(args)``
    after parsing; it prints the report and returns the exit status.

    >>> parser = argparse.ArgumentParser(prog="speechpipe")
    >>> _ = add_command(parser.add_subparsers(dest="command"))
    >>> args = parser.parse_args(["pack", "--scp", "feats.scp", "--labels", "text",
    ...                           "--out", "shards", "--group", "10:500", "--group", "500:800"])
    >>> args.scp, args.group, args.utts_per_shard, args.func.__name__
    (['feats.scp'], ['10:500', '500:800'], 2000, 'run_command')
    """
    parser = subparsers.add_parser(
        "pack",
        help="pack Kaldi feats/wav + text (or manifests) into tar shards with an index",
        description="Pack utterances and their labels into tar shards (webdataset naming:\n"
        "<key>.feats.npy or <key>.flac/.wav, and <key>.txt holding the label unchanged),\n"
        "--utts-per-shard per shard in sorted key order, optionally split into length\n"
        "groups (one folder per group), with an index.jsonl per folder. Keys in the data\n"
        "but not in the labels (or the reverse) stop the run unless --on-mismatch skip.\n"
        "An interrupted run can be run again: complete shards are kept.",
        epilog=_CLI_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    inputs = parser.add_argument_group("inputs (Kaldi tables, or manifests)")
    inputs.add_argument("--scp", action="append", default=[], metavar="FILE",
                        help="feats.scp or wav.scp (repeat for several)")
    inputs.add_argument("--labels", action="append", default=[], metavar="FILE",
                        help="Kaldi text file '<key> <transcript>' (repeat for several)")
    inputs.add_argument("--segments", action="append", default=[], metavar="FILE",
                        help="Kaldi segments file cutting the wav.scp recordings (repeatable)")
    inputs.add_argument("--manifest", action="append", default=[], metavar="FILE",
                        help="JSON-lines manifest with key, audio_path and text, instead of "
                        "--scp/--labels (repeatable)")
    inputs.add_argument("--kind", choices=KINDS, default="auto",
                        help="what the scp files hold (default: auto-detect)")
    output = parser.add_argument_group("output")
    output.add_argument("--out", required=True, metavar="DIR", help="output folder")
    output.add_argument("--fmt", default="data-%05d.tar",
                        help="shard file name with one number (default: data-%%05d.tar)")
    output.add_argument("--group", action="append", default=[], metavar="LO:HI",
                        help="keep lengths LO <= length < HI, written to DIR/LO_HI/ "
                        "(repeat for several non-overlapping groups)")
    output.add_argument("--length-unit", choices=LENGTH_UNITS, default=None,
                        help="unit of lengths and groups: frames (features), samples (audio, "
                        "default) or seconds (audio)")
    output.add_argument("--audio-format", choices=AUDIO_FORMATS, default="lossless",
                        help="lossless (default: 16-bit sources as FLAC, finer ones as float "
                        "WAV) or flac16 (every utterance as 16-bit FLAC: decoded Opus/MP3 "
                        "rounded to 16 bits, 1/4 the size)")
    output.add_argument("--compress", choices=COMPRESS, default=None,
                        help="compress each shard (data-%%05d.tar.gz or .tar.zst): smaller, "
                        "read sequentially only (default: plain tar)")
    output.add_argument("--utts-per-shard", type=int, default=UTTS_PER_SHARD, metavar="N",
                        help=f"utterances per shard (default: {UTTS_PER_SHARD})")
    run = parser.add_argument_group("run")
    run.add_argument("--on-mismatch", choices=ON_MISMATCH, default="error",
                     help="keys with data but no label or the reverse: error (default) or "
                     "skip them (reported)")
    run.add_argument("--empty-text", choices=EMPTY_TEXT, default="error",
                     help="utterances whose label is empty: error (default), skip or keep "
                     "them, counted in the report")
    run.add_argument("--allow-commands", action="store_true",
                     help="run the 'cmd |' values of wav.scp (as Kaldi recipes write them: "
                     "flac -c -d -s x.flac |) and pack their audio")
    run.add_argument("--workers", type=int, default=1, metavar="N",
                     help="worker processes (default: 1)")
    run.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    run.add_argument("--force", action="store_true",
                     help="delete the shards of another pack found in --out (other length "
                     "groups, or shards beside this pack's) instead of refusing")
    parser.set_defaults(func=run_command)
    return parser


def run_command(args: argparse.Namespace) -> int:
    """Run ``pack`` from parsed arguments: print the report, return the exit status."""
    try:
        report = pack_data(
            args.scp or None, args.labels or None, args.out, args.fmt, args.group or None,
            utts_per_shard=args.utts_per_shard, kind=args.kind,
            segments=args.segments or None, manifests=args.manifest or None,
            on_mismatch=args.on_mismatch, num_workers=args.workers,
            progress=not args.no_progress, length_unit=args.length_unit,
            audio_format=args.audio_format, force=args.force, allow_commands=args.allow_commands,
            empty_text=args.empty_text, compress=args.compress,
        )
    except KeyboardInterrupt:
        print("speechpipe pack: interrupted; run the same command again to continue where it "
              "stopped (complete shards are kept)", file=sys.stderr)
        return 130
    except MissingDataError as exc:
        print(f"speechpipe pack: error: {exc}\n  check the path, then run the same command "
              "again (complete shards are kept)", file=sys.stderr)
        return 2
    except (SpeechpipeError, ValueError, TypeError) as exc:
        hint = ("fix the file at the place named above and run the same command again: "
                "complete shards are kept" if isinstance(exc, SpeechpipeError)
                else "see 'speechpipe pack --help'")
        print(f"speechpipe pack: error: {exc}\n  {hint}", file=sys.stderr)
        return 2
    print(report.report())
    return 0
