"""``speechpipe download``: download and extract a corpus (forwards to ``download_<corpus>``)."""

from __future__ import annotations

import argparse
import inspect
import sys
from pathlib import Path
from typing import Any

from ..recipes import RECIPES
from .prepare import recipe_function

__all__ = ["add_command"]


def _run_download(args: argparse.Namespace) -> int:
    try:
        download = recipe_function(args.corpus, "download")
    except ValueError as exc:
        print(f"speechpipe download: error: {exc}", file=sys.stderr)
        return 2
    kwargs: dict[str, Any] = dict(force=args.force, progress=not args.no_progress)
    if args.parts:
        kwargs["parts"] = args.parts
    if args.base_url:
        kwargs["base_url"] = args.base_url
    accepted = inspect.signature(download).parameters
    for flag, name, value in (("--password-file", "password", args.password_file),
                              ("--list", "list_file", args.list), ("--url", "url", args.url),
                              ("--checksum", "checksum", args.checksum)):
        if value is None:
            continue
        if name not in accepted:
            print(f"speechpipe download: error: {flag} is not an option of {args.corpus}",
                  file=sys.stderr)
            return 2
        if name == "password":
            try:
                value = Path(value).read_text(encoding="utf-8").strip()
            except OSError as exc:
                print(f"speechpipe download: error: cannot read the password file: {exc}",
                      file=sys.stderr)
                return 2
        kwargs[name] = value
    try:
        corpus_dir = download(args.target_dir, **kwargs)
    except (ValueError, OSError) as exc:  # DataError, MissingDataError included
        print(f"speechpipe download: error: {exc}", file=sys.stderr)
        return 2
    print(f"{args.corpus}: {corpus_dir}")
    print(f"next: speechpipe prepare {args.corpus} {corpus_dir} <manifest_dir>")
    return 0


def add_command(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``download`` to the ``speechpipe`` command's subparsers; return its parser.

    ``speechpipe download <corpus> <target_dir> [--parts P ...] [--base-url URL] [--force]
    [--url URL] [--checksum SHA256] [--password-file FILE] [--list FILE]`` forwards to
    ``download_<corpus>``: resumable, checksum-verified, idempotent (``--url``/``--checksum``:
    releases handed out as a link, Common Voice; the last two: WenetSpeech's encrypted one).

    >>> parser = argparse.ArgumentParser(prog="speechpipe")
    >>> _ = add_command(parser.add_subparsers(dest="command"))
    >>> args = parser.parse_args(["download", "librispeech", "data", "--parts", "dev-clean"])
    >>> args.corpus, args.parts, args.base_url, args.func.__name__
    ('librispeech', ['dev-clean'], None, '_run_download')
    """
    parser = subparsers.add_parser(
        "download",
        help="download and extract a corpus's official archives",
        description="Download the official archives of a corpus into <target_dir> and "
        "extract them there. Interrupted downloads resume where they stopped (run the same "
        "command again); checksums are verified; finished parts are skipped (a .completed "
        "file marks them; --force redoes them).",
        epilog="example: speechpipe download librispeech data --parts dev-clean test-clean",
    )
    parser.add_argument("corpus", choices=sorted(RECIPES), help="corpus recipe")
    parser.add_argument("target_dir", help="folder to download and extract into")
    parser.add_argument("--parts", nargs="+", metavar="PART",
                        help="parts to download (default: the recipe's default)")
    parser.add_argument("--base-url", default=None, metavar="URL",
                        help="download from this mirror instead of the official site")
    parser.add_argument("--force", action="store_true", help="download again parts already done")
    parser.add_argument("--url", default=None, metavar="URL",
                        help="commonvoice: the cv-corpus-<version>-<lang>.tar.gz link Mozilla "
                        "gives after accepting its terms")
    parser.add_argument("--checksum", default=None, metavar="SHA256",
                        help="commonvoice: the archive's sha256 (shown beside the link)")
    parser.add_argument("--password-file", default=None, metavar="FILE",
                        help="wenetspeech: file holding the release password (the official "
                        "SAFEBOX/password)")
    parser.add_argument("--list", default=None, metavar="FILE",
                        help="wenetspeech: the object list with md5 sums (metadata/v1.list "
                        "of github.com/wenet-e2e/WenetSpeech), a path or URL")
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")
    parser.set_defaults(func=_run_download)
    return parser

