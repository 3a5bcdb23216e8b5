"""``speechpipe tokenizer build``: a tokenizer from Kaldi ``text`` files or manifests, with
its coverage of the training text."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..pipes.text import TokenStats, read_transcripts
from ..pipes.text import CASES, REMOVE_SPACES, TextNormalizer, UNICODE_FORMS
from ..pipes.text import SP_MODEL_TYPES, CharTokenizer, SentencePieceTokenizer, WordTokenizer
from ..sample import TEXT

__all__ = ["add_command"]


def add_command(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``tokenizer build`` to the ``speechpipe`` command's subparsers; returns the
    ``tokenizer`` parser. The handler returns the exit code (0, or 2 on bad input)."""
    tokenizer = subparsers.add_parser(
        "tokenizer",
        help="build a tokenizer (char, word, sentencepiece) from transcripts",
        description="Tokenizers for speechpipe's tokenize stage.",
    )
    actions = tokenizer.add_subparsers(dest="tokenizer_command", required=True,
                                       metavar="ACTION")
    build = actions.add_parser(
        "build",
        help="build a tokenizer from Kaldi text files or manifests",
        description="Build a tokenizer from transcripts -- Kaldi 'text' files ('<key> "
        "<transcript>' lines) or manifests (.jsonl/.tsv, optionally .gz) -- normalized as "
        "given, save it to --out (JSON for char/word, a .model for sentencepiece) and print "
        "its vocabulary size, its coverage of the characters and its <unk> rate on the "
        "training text. Use the same normalization when tokenizing. For Chinese, pass "
        "--remove-spaces cjk: a space in a label otherwise becomes <unk>.",
    )
    build.add_argument("--type", dest="kind", required=True,
                       choices=("char", "word", "sentencepiece"), help="tokenizer type")
    build.add_argument("--text", action="append", required=True, metavar="FILE",
                       help="Kaldi text file or manifest; repeat for several")
    build.add_argument("--field", default=TEXT,
                       help="manifest field holding the transcript (default: text)")
    build.add_argument("--out", required=True, metavar="PATH", help="file to write")
    build.add_argument("--vocab-size", type=int, default=None, metavar="N",
                       help="sentencepiece: number of pieces (required unless --model-type "
                       "char); char/word: keep at most the N-3 most frequent symbols")
    build.add_argument("--model-type", default="unigram", choices=SP_MODEL_TYPES,
                       help="sentencepiece model type (default: unigram)")
    build.add_argument("--character-coverage", type=float, default=0.9995, metavar="F",
                       help="sentencepiece: share of characters covered (default 0.9995)")
    build.add_argument("--no-dummy-prefix", action="store_true",
                       help="sentencepiece: no '▁' before each text (CJK character models)")
    build.add_argument("--min-count", type=int, default=1, metavar="N",
                       help="char/word: symbols seen fewer times become <unk> (default 1)")
    build.add_argument("--space-symbol", default="▁",
                       help="char: symbol for a space; 'none' drops spaces (default: ▁)")
    build.add_argument("--case", default="keep", choices=CASES, help="case mapping")
    build.add_argument("--remove-spaces", default="none", choices=REMOVE_SPACES,
                       help="remove spaces: none, all, or next to CJK characters")
    build.add_argument("--remove-punctuation", action="store_true",
                       help="replace punctuation by spaces (apostrophes in words kept)")
    build.add_argument("--unicode-form", default="NFKC", choices=(*UNICODE_FORMS, "none"),
                       help="Unicode normalization (default NFKC)")
    build.set_defaults(func=_tokenizer_build)
    return tokenizer


def _tokenizer_build(args: argparse.Namespace) -> int:
    try:
        normalizer = TextNormalizer(
            case=args.case,
            unicode_form=None if args.unicode_form == "none" else args.unicode_form,
            remove_punctuation=args.remove_punctuation,
            remove_spaces=args.remove_spaces,
        )
        pairs = [(key, normalizer(text)) for key, text in read_transcripts(args.text,
                                                                           field=args.field)]
        texts = [text for _, text in pairs]
        size = args.vocab_size
        if args.kind == "sentencepiece":
            options: dict[str, Any] = {"model_type": args.model_type,
                                       "character_coverage": args.character_coverage}
            if args.no_dummy_prefix:
                options["add_dummy_prefix"] = False
            tokenizer = SentencePieceTokenizer.build(texts, size, **options)
        else:
            if size is not None and size < 4:
                raise ValueError(f"--vocab-size must be >= 4, got {size}")
            options = {"min_count": args.min_count,
                       "max_size": None if size is None else size - 3}
            if args.kind == "char":
                options["space_symbol"] = (None if args.space_symbol.lower() == "none"
                                           else args.space_symbol)
                tokenizer = CharTokenizer.build(texts, **options)
            else:
                tokenizer = WordTokenizer.build(texts, **options)
        tokenizer.save(args.out)
    except (ValueError, OSError) as exc:  # DataError and MissingDataError included
        print(f"speechpipe tokenizer build: error: {exc}", file=sys.stderr)
        return 2
    stats = TokenStats("training text")
    for key, text in pairs:
        stats.add(key, text, tokenizer.encode(text), tokenizer)
    print(f"built a {args.kind} tokenizer from {len(texts)} transcript(s) in "
          f"{len(args.text)} file(s): {args.out}")
    print(f"vocab size: {tokenizer.vocab_size} (<blank>={tokenizer.blank_id}, "
          f"<unk>={tokenizer.unk_id}, <sos/eos>={tokenizer.sos_eos_id})")
    print(f"coverage: {100 * stats.coverage:.2f}% of characters known; <unk> rate: "
          f"{100 * stats.unk_rate:.2f}% of {stats.tokens} token(s) on the training text")
    if stats.unk_tokens:
        print(stats.report())
    print(f"normalizer: {normalizer!r} -- tokenize with the same "
          f"(tokenize(tokenizer, normalizer=...))")
    return 0
