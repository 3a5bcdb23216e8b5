"""The ``speechpipe`` command: one module per subcommand, each with ``add_command(subparsers)``;
a command parses its arguments and forwards to the library function that does the work."""

from __future__ import annotations

import argparse
import sys

from . import cmvn, demo, download, pack, prepare, stats, tokenizer

__all__ = ["main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="speechpipe",
        description="Composable datapipes for speech training data.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in (demo, download, prepare, pack, stats, tokenizer, cmvn):
        command.add_command(sub)
    return parser


def _one_line_warning(message, category, filename, lineno, line=None) -> str:
    """A warning as the command prints it: its class and message, without Python's source
    line (``samples = list(self.source_datapipe)`` says nothing to a user of the command)."""
    return f"{category.__name__}: {message}\n"


def main(argv: list[str] | None = None) -> int:
    """Run one command; its errors, a closed output pipe and Ctrl-C end it in one line;
    warnings print as their class and message, without a source line."""
    import warnings

    args = build_parser().parse_args(argv)
    from ..errors import SpeechpipeError

    shown = warnings.formatwarning
    warnings.formatwarning = _one_line_warning  # the command's process: put back on return
    try:
        return args.func(args)
    except SpeechpipeError as exc:
        print(f"speechpipe {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"speechpipe {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader left (``speechpipe stats ... | head``): not an error
        _quiet_stdout()
        return 0
    finally:
        warnings.formatwarning = shown


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so that flushing it at exit raises nothing (the Python
    documentation's recipe for SIGPIPE)."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no real stdout (an embedding): nothing to quiet
        pass

