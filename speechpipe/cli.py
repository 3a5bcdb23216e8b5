"""The ``speechpipe`` command. Each subcommand forwards to a module function."""

from __future__ import annotations

import argparse
import sys

__all__ = ["main"]


def _demo(args: argparse.Namespace) -> int:
    from .demo import DEMO_CORPUS, run_demo

    corpus = args.corpus or DEMO_CORPUS
    print(f"speechpipe demo: {corpus} [{args.part}], batch size {args.batch_size}, "
          f"seed {args.seed}, workers {args.workers}")
    summary = run_demo(corpus, part=args.part, batch_size=args.batch_size, seed=args.seed,
                       workers=args.workers, progress=not args.no_progress)
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
        description="Run the main job (read -> decode -> shuffle -> batch -> collate) on a "
        "LibriSpeech-layout corpus (default: the small synthesized one shipped with "
        "speechpipe) and print a summary.",
    )
    demo.add_argument("--corpus", help="a LibriSpeech folder (default: the shipped demo corpus)")
    demo.add_argument("--part", default="dev-clean", help="part to read (default: dev-clean)")
    demo.add_argument("--batch-size", type=int, default=8, help="utterances per batch")
    demo.add_argument("--seed", type=int, default=0, help="shuffle seed")
    demo.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    demo.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    demo.set_defaults(func=_demo)
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
