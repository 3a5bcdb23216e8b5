"""``speechpipe prepare``: write the manifests of a corpus (forwards to ``prepare_<corpus>``)."""

from __future__ import annotations

import argparse
import inspect
import os
import sys
from typing import Any, Callable

from ..executors import dask_client
from ..recipes import EMPTY_TEXT, ON_MISMATCH, RECIPES, get_recipe
from .pack import task_argument

__all__ = ["add_command"]


def recipe_function(corpus: str, verb: str) -> Callable[..., Any]:
    """The ``<verb>_<corpus>`` function of a recipe; a ValueError (with the recipe's
    ``NO_<VERB>`` reason) if it has none."""
    module = get_recipe(corpus)
    fn = getattr(module, f"{verb}_{corpus}", None)
    if fn is None:
        why = getattr(module, f"NO_{verb.upper()}", "")
        raise ValueError(f"the {corpus} recipe has no {verb}{': ' + why if why else ''}")
    return fn


#: Options forwarded only when set (``--allow-commands`` -> ``allow_commands=True``); from the
#: third on, the checks every recipe built on ``prepare_parts`` takes as ``**checks``.
_OPTIONAL = ("root", "allow_commands", "sample_rate", "verify", "on_error", "empty_text",
             "step", "executor")


def _accepts(fn: Callable[..., Any], name: str) -> bool:
    params = inspect.signature(fn).parameters
    return name in params or (name in _OPTIONAL[2:] and any(
        p.kind is p.VAR_KEYWORD for p in params.values()))


_FLAGS = {"step": "--plan-only, --task and --merge", "executor": "--dask"}


def _run_prepare(args: argparse.Namespace) -> int:
    prepare = recipe_function(args.corpus, "prepare")
    kwargs: dict[str, Any] = dict(parts=args.parts or "auto", num_jobs=args.jobs,
                                  on_mismatch=args.on_mismatch, force=args.force,
                                  progress=not args.no_progress)
    args.step = "plan" if args.plan_only else "merge" if args.merge else args.task
    args.executor = None
    client = None
    fresh = not os.path.lexists(args.out_dir)
    try:
        for name in _OPTIONAL:
            value = args.dask if name == "executor" else getattr(args, name)
            if value is None or value is False:
                continue
            if not _accepts(prepare, name):
                flag = _FLAGS.get(name, f"--{name.replace('_', '-')}")
                print(f"speechpipe prepare: error: {flag} is not an option of {args.corpus}",
                      file=sys.stderr)
                return 2
            if name == "executor":
                value = client = dask_client(args.dask)
            kwargs[name] = None if name == "sample_rate" and value == 0 else value
        result = prepare(args.corpus_dir, args.out_dir, **kwargs)
    except (ValueError, OSError, ImportError) as exc:  # DataError, MissingDataError included
        if fresh and os.path.isdir(args.out_dir) and not os.listdir(args.out_dir):
            os.rmdir(args.out_dir)  # a failed first run leaves no empty output folder
        print(f"speechpipe prepare: error: {exc}", file=sys.stderr)
        return 2
    finally:
        if client is not None:
            client.close()
    reports = getattr(result, "reports", {})
    steps = getattr(result, "steps", {})
    for part, path in result.items():
        if part in steps:
            print(f"{args.corpus} {part}: {steps[part]}")
        elif part in reports:
            print(f"{args.corpus} {reports[part].report()}")
        else:
            print(f"{args.corpus} {part}: {path}")
    return 0


def add_command(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``prepare`` to the ``speechpipe`` command's subparsers; return its parser.

    ``speechpipe prepare <corpus> <corpus_dir> <out_dir> [--parts P ...] [--jobs N]
    [--on-mismatch error|skip] [--force] [--root DIR] [--allow-commands] [--sample-rate HZ]
    [--verify] [--on-error raise|skip] [--empty-text error|skip|keep] [--dask SCHEDULER]
    [--plan-only | --task I/N | --merge]`` forwards to
    ``prepare_<corpus>`` and prints, per part, whether its manifest was written, rewritten
    (and why) or is up to date, with its utterances, speakers, hours, sample rates and what
    was skipped. ``args.func(args)`` returns the exit status.

    >>> parser = argparse.ArgumentParser(prog="speechpipe")
    >>> _ = add_command(parser.add_subparsers(dest="command"))
    >>> args = parser.parse_args(["prepare", "librispeech", "LibriSpeech", "manifests",
    ...                           "--parts", "dev-clean", "test-clean", "--jobs", "4"])
    >>> args.parts, args.jobs, args.on_mismatch, args.func.__name__
    (['dev-clean', 'test-clean'], 4, 'error', '_run_prepare')
    """
    parser = subparsers.add_parser(
        "prepare",
        help="write the manifests of a corpus (one .jsonl.gz per part)",
        description="Validate a corpus in its official layout and write one manifest per "
        "part, <out_dir>/{corpus}_samples_{part}.jsonl.gz: one JSON line per utterance with "
        "key, audio_path, duration, text, speaker. A record beside each manifest says what it "
        "was made from: a rerun over an unchanged corpus does nothing ('up to date'), one "
        "over a changed corpus (or with other options) rewrites it and says why (--force "
        "rewrites anyway). Audio without transcript, or the reverse, stops the run unless "
        "--on-mismatch skip; empty transcripts stop it unless --empty-text skip|keep; "
        "--verify decodes every file once and stops on truncated, corrupt or empty ones "
        "unless --on-error skip. Whatever is left out is counted and named.",
        epilog="example: speechpipe prepare librispeech data/LibriSpeech data/manifests "
        "--parts dev-clean test-clean --jobs 4",
    )
    parser.add_argument("corpus", choices=sorted(RECIPES), help="corpus recipe")
    parser.add_argument("corpus_dir", help="the corpus folder (e.g. data/LibriSpeech)")
    parser.add_argument("out_dir", help="folder to write the manifests to")
    parser.add_argument("--parts", nargs="+", metavar="PART",
                        help="parts to prepare (default: every part found)")
    parser.add_argument("--jobs", type=int, default=1, metavar="N",
                        help="threads reading audio headers (default 1)")
    parser.add_argument("--on-mismatch", choices=ON_MISMATCH, default="error",
                        help="audio without transcript or the reverse: error (default) or "
                        "skip them, counted")
    parser.add_argument("--force", action="store_true", help="rewrite parts even when up to date")
    parser.add_argument("--root", default=None, metavar="DIR",
                        help="kaldi_dir: folder that relative paths in the tables start from "
                        "(default: the current folder, as in Kaldi)")
    parser.add_argument("--allow-commands", action="store_true",
                        help="kaldi_dir: run the 'cmd |' values of wav.scp (as Kaldi recipes "
                        "write them) and write their audio beside the manifests")
    parser.add_argument("--sample-rate", type=int, default=None, metavar="HZ",
                        help="rate the recipe pipelines resample to, reported against "
                        "(default 16000 for ASR corpora, 22050 for ljspeech; 0: none)")
    parser.add_argument("--verify", action="store_true",
                        help="decode every audio file once (--jobs threads) and report "
                        "missing, corrupt, truncated and empty files")
    parser.add_argument("--on-error", choices=("raise", "skip"), default=None,
                        help="files --verify finds bad: raise (default) or skip them, counted")
    parser.add_argument("--empty-text", choices=EMPTY_TEXT, default=None,
                        help="utterances with an empty transcript: error (default), skip or "
                        "keep them, counted")
    parser.add_argument("--dask", metavar="SCHEDULER",
                        help="--verify decodes on the Dask cluster of this scheduler address "
                        "(tcp://host:8786) instead of --jobs threads")
    steps = parser.add_argument_group(
        "job arrays for --verify (plan, tasks, merge: the same manifests and report as one run)")
    step = steps.add_mutually_exclusive_group()
    step.add_argument("--plan-only", action="store_true",
                      help="find each part's samples and write the plan of what to decode, "
                      "<out_dir>/<corpus>_verify_<part>.plan.jsonl.gz")
    step.add_argument("--task", metavar="I/N", type=task_argument,
                      help="decode task I of N's share of every plan (1 <= I <= N); a task "
                      "that finished is not run again")
    step.add_argument("--merge", action="store_true",
                      help="gather the tasks' results and write the manifests, or report every "
                      "fault, as one run does")
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")
    parser.set_defaults(func=_run_prepare)
    return parser

