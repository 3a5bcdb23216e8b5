"""``speechpipe cmvn``: global CMVN statistics of features read from a Kaldi ``feats.scp``
or computed from audio (a manifest, tar shards, a LibriSpeech folder)."""

from __future__ import annotations

import argparse
import os
from typing import Any, Iterable, Iterator

from ..pipes.audio import audio_of
from ..pipes.audio import compute_cmvn_stats
from ..pipes.audio import extract_features, FeatureExtractor, FEATURE_KINDS
from ..sample import FEATS, KEY, Sample

__all__ = ["add_command"]


def add_command(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``speechpipe cmvn`` to a CLI's subparsers; returns its parser.

    ``speechpipe cmvn --out stats.json`` with one source: ``--scp feats.scp`` (Kaldi
    features), ``--manifest m.jsonl`` (audio files named in ``--audio-field``), ``--shards
    'data/shard-{0..9}.tar'`` (their ``feats``, or audio), or ``--librispeech DIR`` (default:
    the shipped demo corpus). Audio is turned into ``--kind`` features with
    ``--num-mel-bins``; the statistics are written as WeNet-style JSON.
    """
    parser = subparsers.add_parser(
        "cmvn",
        help="compute global CMVN statistics (count, sum, sum of squares) of features",
        description="Accumulate global CMVN statistics over features read from a Kaldi "
        "feats.scp, or computed from audio (a manifest, tar shards, a LibriSpeech folder), and "
        "write them as JSON (WeNet's global_cmvn format).",
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--scp", help="a Kaldi feats.scp (features used as they are)")
    source.add_argument("--manifest", help="a JSON-lines or TSV manifest naming audio files")
    source.add_argument("--shards", help="tar shard pattern(s) (braces and globs)")
    source.add_argument("--librispeech",
                        help="a LibriSpeech folder (default: the shipped demo corpus)")
    parser.add_argument("--part", default="dev-clean", help="LibriSpeech part (dev-clean)")
    parser.add_argument("--audio-field", default="audio_path",
                        help="manifest field holding the audio path (default audio_path)")
    parser.add_argument("--kind", choices=FEATURE_KINDS, default="fbank",
                        help="features computed from audio (default fbank)")
    parser.add_argument("--num-mel-bins", type=int, default=80,
                        help="mel bins of fbank / mfcc / mel features (default 80)")
    parser.add_argument("--out", required=True, help="output JSON file")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.set_defaults(func=_cmvn_command)
    return parser


def _cmvn_samples(args: argparse.Namespace) -> Iterable[Sample]:
    from ..pipes._core import IterableWrapper

    if args.scp:
        return IterableWrapper([args.scp]).open_files(mode="b").parse_scp().load_scp("feats")
    if args.manifest:
        root = os.path.dirname(os.path.abspath(args.manifest))
        return (IterableWrapper([args.manifest]).open_files(mode="b").parse_manifest()
                .load_audio(field=args.audio_field, root=root))
    if args.shards:
        return IterableWrapper([args.shards]).list_shards().open().read_shards().decode()
    from ..demo import DEMO_CORPUS
    from ..recipes.librispeech import librispeech_samples

    return librispeech_samples(args.librispeech or DEMO_CORPUS, args.part)


def _cmvn_command(args: argparse.Namespace) -> int:
    options = {"n_mels" if args.kind == "mel" else "num_mel_bins": args.num_mel_bins}
    if args.kind == "mfcc":
        options["num_ceps"] = min(13, args.num_mel_bins)
    extractor = FeatureExtractor(args.kind, None, options)

    def features() -> Iterator[Any]:
        for sample in _cmvn_samples(args):
            if FEATS in sample:
                yield sample
                continue
            audio, rate = audio_of(sample, "cmvn", mono=True)
            yield {KEY: sample.get(KEY),
                   FEATS: extract_features(audio, rate, extractor, 0.0, None, sample)}

    stats = compute_cmvn_stats(features(), progress=not args.no_progress)
    stats.save(args.out)
    print(f"cmvn: {stats.count} frames of dim {stats.dim} -> {args.out}")
    return 0

