"""The ``speechpipe`` command. Each subcommand forwards to a module function."""

from __future__ import annotations

import argparse
import sys

__all__ = ["main"]


def _demo(args: argparse.Namespace) -> int:
    from .demo import DEMO_CORPUS, run_demo

    corpus = args.corpus or DEMO_CORPUS
    batching = (f"batch size {args.batch_size}" if args.batch_size else
                f"budget {args.budget:g} padded s per batch")
    print(f"speechpipe demo: {corpus} [{args.part}], {batching}, seed {args.seed}, "
          f"workers {args.workers}")
    summary = run_demo(corpus, part=args.part, budget_seconds=args.budget,
                       batch_size=args.batch_size, seed=args.seed, workers=args.workers,
                       progress=not args.no_progress)
    print(summary.report())
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="speechpipe",
        description="Composable datapipes for speech training data.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = sub.add_parser(
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

    from .pack import add_pack_command
    from .pipes.audio import add_cmvn_command
    from .pipes.text import add_tokenizer_command
    from .recipes._common import add_download_command, add_prepare_command
    from .stats import add_stats_command

    add_download_command(sub)
    add_prepare_command(sub)
    add_pack_command(sub)
    add_stats_command(sub)
    add_tokenizer_command(sub)
    add_cmvn_command(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from .errors import SpeechpipeError

    try:
        return args.func(args)
    except SpeechpipeError as exc:
        print(f"speechpipe {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
