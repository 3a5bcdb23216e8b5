"""``speechpipe pack``: Kaldi tables or manifests to tar shards with an index
(:func:`~speechpipe.pack.pack_data`)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..diagnostics import ON_ERROR
from ..errors import FolderLockedError, MissingDataError, OutputError, SpeechpipeError
from ..executors import dask_client
from ..pack import (
    AUDIO_FORMATS,
    COMPRESS,
    KINDS,
    LENGTH_UNITS,
    ON_MISMATCH,
    UTTS_PER_SHARD,
    merge_pack,
    pack_data,
    pack_task,
    plan_pack,
)
from ..recipes import EMPTY_TEXT
from ..remote import RemoteOptions
from .stats import storage_option

__all__ = ["add_command", "run_command", "task_argument"]

_CLI_EXAMPLES = """\
examples:
  speechpipe pack --scp data/train/feats.scp --labels data/train/text --out shards/train \\
      --group 10:500 --group 500:800 --workers 8
  speechpipe pack --scp data/train/wav.scp --segments data/train/segments \\
      --labels data/train/text --out shards/train --length-unit seconds --group 1:20
  speechpipe pack --manifest train.jsonl --out shards/train
  speechpipe pack --scp data/train/wav.scp --labels data/train/text --out shards/train \\
      --allow-commands --length-unit seconds

as a job array (any machines seeing the same paths; tasks in any order, reruns welcome):
  speechpipe pack --manifest train.jsonl --out shards/train --plan-only
  speechpipe pack --out shards/train --task $JOB/3      # JOB = 1, 2, 3
  speechpipe pack --out shards/train --merge
on a Dask cluster (pip install 'speechpipe[dask]'):
  speechpipe pack --manifest train.jsonl --out shards/train --dask tcp://scheduler:8786

read the result with:
  IterableWrapper(["shards/train"]).list_shards().open().read_shards().decode()
  (a folder stands for every shard its index or its groups' indexes list)
"""


# long: one argparse declaration per flag of pack, plan, tasks, merge and Dask; no logic
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
    output.add_argument("--out", required=True, metavar="DIR",
                        help="output folder, or a folder URL (s3://bucket/corpus, any fsspec "
                        "URL: shards uploaded whole, the index last)")
    output.add_argument("--storage-option", action="append", type=storage_option, default=[],
                        metavar="KEY=VALUE",
                        help="an option of the object store's file system for a URL --out "
                        "(s3fs: endpoint_url=http://..., profile=...; repeatable); credentials "
                        "also come from the usual AWS_* variables and files")
    output.add_argument("--fmt", default="data-%05d.tar",
                        help="shard file name with one number (default: data-%%05d.tar)")
    output.add_argument("--group", action="append", default=[], metavar="LO:HI",
                        help="keep lengths LO <= length < HI, written to DIR/LO_HI/ "
                        "(repeat for several non-overlapping groups)")
    output.add_argument("--length-unit", choices=LENGTH_UNITS, default=None,
                        help="unit of lengths and groups: frames (features), samples or "
                        "seconds (audio); default: frames, or samples for audio at one sample "
                        "rate and seconds at several (without --group)")
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
    run.add_argument("--on-error", choices=ON_ERROR, default="raise",
                     help="an utterance whose file (in wav.scp, feats.scp, a segments "
                     "recording or a manifest) is missing, unreadable, truncated or corrupt: "
                     "raise (default: stop, naming the file and line) or skip it (every audio "
                     "file is then decoded while measuring; skipped ones are counted and "
                     "listed in the report)")
    run.add_argument("--allow-commands", action="store_true",
                     help="run the 'cmd |' values of wav.scp (as Kaldi recipes write them: "
                     "flac -c -d -s x.flac |) and pack their audio")
    run.add_argument("--workers", type=int, default=1, metavar="N",
                     help="worker processes (default: 1)")
    run.add_argument("--dask", metavar="SCHEDULER",
                     help="run the measuring and writing on the Dask cluster of this "
                     "scheduler address (tcp://host:8786) instead of --workers")
    steps = parser.add_argument_group(
        "job arrays (plan, tasks, merge: the same bytes as one run)")
    step = steps.add_mutually_exclusive_group()
    step.add_argument("--plan-only", action="store_true",
                      help="read and measure the inputs, write DIR/pack_plan.jsonl, no shard")
    step.add_argument("--task", metavar="I/N", type=task_argument,
                      help="write the shards of task I of N (1 <= I <= N) of the plan in DIR; "
                      "complete shards are kept")
    step.add_argument("--merge", action="store_true",
                      help="check every planned shard and write the indexes (names any "
                      "missing shard)")
    run.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    run.add_argument("--force", action="store_true",
                     help="delete the shards of another pack found in --out (other length "
                     "groups, or shards beside this pack's) instead of refusing")
    parser.set_defaults(func=run_command)
    return parser


def task_argument(text: str) -> tuple[int, int]:
    """``"2/3"`` to ``(2, 3)`` (an argparse ``type`` of ``--task I/N``)."""
    try:
        task, tasks = (int(part) for part in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected I/N such as 2/3, got {text!r}") from None
    if not 1 <= task <= tasks:
        raise argparse.ArgumentTypeError(f"expected 1 <= I <= N, got {text!r}")
    return task, tasks


def _run(args: argparse.Namespace, executor: Any) -> Any:
    remote = (RemoteOptions(storage_options=dict(args.storage_option))
              if args.storage_option else None)
    inputs = [f"--{name}" for name in ("scp", "labels", "segments", "manifest")
              if getattr(args, name)]
    if (args.task or args.merge) and inputs:
        raise ValueError(f"{'--task' if args.task else '--merge'} reads the plan in --out: "
                         f"drop {', '.join(inputs)} (they were read by --plan-only)")
    if args.merge:
        return merge_pack(args.out, remote=remote)
    if args.task:
        return pack_task(args.out, *args.task, num_workers=1 if executor else args.workers,
                         executor=executor, progress=not args.no_progress, remote=remote)
    settings = dict(
        fmt=args.fmt, filter_group=args.group or None, utts_per_shard=args.utts_per_shard,
        kind=args.kind, on_mismatch=args.on_mismatch,
        num_workers=1 if executor else args.workers, progress=not args.no_progress,
        length_unit=args.length_unit, audio_format=args.audio_format, force=args.force,
        allow_commands=args.allow_commands, empty_text=args.empty_text, compress=args.compress,
        on_error=args.on_error)
    step = plan_pack if args.plan_only else pack_data
    return step(args.scp or None, args.labels or None, args.out,
                segments=args.segments or None, manifests=args.manifest or None,
                executor=executor, remote=remote, **settings)


def run_command(args: argparse.Namespace) -> int:
    """Run ``pack`` from parsed arguments: print the report, return the exit status."""
    client = None
    try:
        if args.dask:
            client = dask_client(args.dask)
        report = _run(args, client)
    except FolderLockedError as exc:
        print(f"speechpipe pack: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("speechpipe pack: interrupted; run the same command again to continue where it "
              "stopped (complete shards are kept)", file=sys.stderr)
        return 130
    except MissingDataError as exc:
        skip = ("; or leave out every utterance whose data cannot be read, counted: "
                "--on-error skip" if exc.key is not None and not args.task
                and args.on_error == "raise" else "")
        print(f"speechpipe pack: error: {exc}\n  check the path, then run the same command "
              f"again (complete shards are kept){skip}", file=sys.stderr)
        return 2
    except OutputError as exc:  # a full or read-only disk: the file being written is named
        print(f"speechpipe pack: error: {exc}\n  make room (or choose another --out), then "
              "run the same command again: complete shards are kept", file=sys.stderr)
        return 2
    except (SpeechpipeError, ValueError, TypeError, ImportError) as exc:
        hint = ("fix the file at the place named above and run the same command again: "
                "complete shards are kept" if isinstance(exc, SpeechpipeError)
                else "see 'speechpipe pack --help'")
        if isinstance(exc, SpeechpipeError) and "(CLI: --" in str(exc):  # a choice, not a fault
            hint = ("fix the input, or pass the option named above; then run the same command "
                    "again: complete shards are kept")
        print(f"speechpipe pack: error: {exc}\n  {hint}", file=sys.stderr)
        return 2
    finally:
        if client is not None:
            client.close()
    if args.task:
        print(f"pack --task {args.task[0]}/{args.task[1]}: {report.shards_written} shard(s) "
              f"written, {report.shards_skipped} already complete (kept) under {args.out}; "
              "when every task is done: --merge")
        return 0
    print(report.report())
    if args.plan_only:
        print(f"  plan: {args.out}/pack_plan.jsonl; now run --task I/N for I = 1..N, then "
              "--merge")
    return 0
