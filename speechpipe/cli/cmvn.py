"""``speechpipe cmvn``: global CMVN statistics of features read from a Kaldi ``feats.scp``
or computed from audio (a manifest, tar shards, a LibriSpeech folder)."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from typing import Any, Iterable

from ..errors import DataError, MissingDataError
from ..executors import dask_client
from ..pipes.audio import audio_of
from ..pipes.audio import CmvnStats, cmvn_stats_of_part, compute_cmvn_stats, merge_cmvn_stats
from ..pipes.audio import extract_features, FeatureExtractor, FEATURE_KINDS
from ..sample import FEATS, KEY, Sample
from .pack import task_argument

__all__ = ["Featurize", "UTTS_PER_PART", "add_command", "task_file"]


def add_command(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``speechpipe cmvn`` to a CLI's subparsers; returns its parser.

    ``speechpipe cmvn --out stats.json`` with one source: ``--scp feats.scp`` (Kaldi
    features), ``--manifest m.jsonl`` (audio files named in ``--audio-field``), ``--shards
    'data/shard-{0..9}.tar'`` (their ``feats``, or audio), or ``--librispeech DIR`` (default:
    the shipped demo corpus). Audio is turned into ``--kind`` features with
    ``--num-mel-bins``; the statistics are written as WeNet-style JSON. ``--dask SCHEDULER``
    computes them on a Dask cluster; ``--task I/N`` (partial sums of the I-th of N parts of
    the source) then ``--merge`` as a job array: the same statistics to float64 rounding.
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
    parser.add_argument("--dask", metavar="SCHEDULER",
                        help="compute the features and partial sums on the Dask cluster of this "
                        f"scheduler address (tcp://host:8786), {UTTS_PER_PART} utterances or one "
                        "shard per task")
    steps = parser.add_argument_group("job arrays (the same statistics, to float64 rounding)")
    step = steps.add_mutually_exclusive_group()
    step.add_argument("--task", metavar="I/N", type=task_argument,
                      help="the partial statistics of the I-th of N contiguous parts of the "
                      "source, written to <out>.task-I-of-N.json")
    step.add_argument("--merge", action="store_true",
                      help="merge every task's partial statistics into --out (names any "
                      "missing task)")
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


def _cmvn_parts(args: argparse.Namespace, count: int | None) -> list[Any]:
    """The source cut into parts that a worker loads and turns into features: ``count``
    contiguous parts (a job array's tasks), or (``None``) parts of :data:`UTTS_PER_PART`
    utterances, one per shard for shards. The list is read here (manifest, table or shard
    names; nothing is decoded); each part is a datapipe that pickles."""
    from ..pipes._core import IterableWrapper

    whole = _cmvn_samples(args)
    if args.shards:
        items = list(IterableWrapper([args.shards]).list_shards())

        def load(block: list) -> Any:
            return IterableWrapper(block).open().read_shards().decode()
    else:
        items = list(whole.source_datapipe)  # the rows, before load_scp / load_audio
        loader = whole

        def load(block: list) -> Any:
            pipe = IterableWrapper(block)
            if args.scp:
                return pipe.load_scp("feats")
            return pipe.load_audio(field=loader.field, root=loader.root)
    per = 1 if args.shards else UTTS_PER_PART
    blocks = ([items[i:i + per] for i in range(0, len(items), per)] if count is None else
              [items[len(items) * i // count:len(items) * (i + 1) // count]
               for i in range(count)])
    features = Featurize(_extractor(args))
    return [load(block).map(features) for block in blocks]


#: Utterances per task of ``speechpipe cmvn --dask`` (shards: one per task): seconds of
#: decoding and features each, so that a scheduler's cost per task stays far below 1 %.
UTTS_PER_PART = 64


def _extractor(args: argparse.Namespace) -> FeatureExtractor:
    options = {"n_mels" if args.kind == "mel" else "num_mel_bins": args.num_mel_bins}
    if args.kind == "mfcc":
        options["num_ceps"] = min(13, args.num_mel_bins)
    return FeatureExtractor(args.kind, None, options)


class Featurize:
    """A sample with ``feats`` as it is; one with audio as ``{key, feats}`` computed by
    ``extractor`` (picklable: it runs in the workers of ``--dask``)."""

    def __init__(self, extractor: FeatureExtractor) -> None:
        self.extractor = extractor

    def __call__(self, sample: Sample) -> Sample:
        if FEATS in sample:
            return sample
        audio, rate = audio_of(sample, "cmvn", mono=True)
        return {KEY: sample.get(KEY),
                FEATS: extract_features(audio, rate, self.extractor, 0.0, None, sample)}


def task_file(out: str, task: int, tasks: int) -> str:
    """Where task ``task`` of ``tasks`` writes its partial statistics: ``<out>.task-I-of-N.json``.

    >>> task_file("cmvn.json", 2, 3)
    'cmvn.json.task-2-of-3.json'
    """
    return f"{out}.task-{task}-of-{tasks}.json"


def _write_partial(path: str, stats: CmvnStats | None) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(stats.to_json() if stats is not None else {"frame_num": 0}, f)
        f.write("\n")
    os.replace(tmp, path)


def _merge_partials(out: str) -> CmvnStats:
    """Every task's partial statistics of ``out``, merged in task order (then removed).

    Raises:
        MissingDataError: no task file, or tasks missing (named).
        DataError: task files of job arrays of different sizes.
    """
    folder = os.path.dirname(os.path.abspath(out))
    name = os.path.basename(out)
    found = {}
    for entry in sorted(os.listdir(folder)):
        match = re.fullmatch(re.escape(name) + r"\.task-(\d+)-of-(\d+)\.json", entry)
        if match:
            found[int(match.group(1)), int(match.group(2))] = os.path.join(folder, entry)
    sizes = sorted({n for _, n in found})
    if not sizes:
        raise MissingDataError("no partial statistics to merge: run 'speechpipe cmvn ... "
                               "--task I/N' for I = 1..N first", source=task_file(out, 1, 1))
    if len(sizes) > 1:
        raise DataError(f"partial statistics of job arrays of {sizes} tasks: remove the old "
                        "ones, keep one array's", source=folder)
    tasks = sizes[0]
    missing = [i for i in range(1, tasks + 1) if (i, tasks) not in found]
    if missing:
        raise MissingDataError(f"task(s) {', '.join(f'{i}/{tasks}' for i in missing)} have "
                               "not written their partial statistics: run them, then merge "
                               "again", source=task_file(out, missing[0], tasks))
    parts = []
    for i in range(1, tasks + 1):
        path = found[i, tasks]
        with open(path, encoding="utf-8") as f:
            head = json.load(f)
        parts.append(CmvnStats.load(path) if head.get("frame_num") else None)
    stats = merge_cmvn_stats(parts)
    stats.save(out)
    for path in found.values():
        os.remove(path)
    return stats


def _cmvn_command(args: argparse.Namespace) -> int:
    client = None
    try:
        if (args.task or args.merge) and args.dask:
            raise ValueError(f"{'--task' if args.task else '--merge'} runs here: drop --dask")
        if args.merge:
            stats = _merge_partials(args.out)
            print(f"cmvn --merge: {stats.count} frames of dim {stats.dim} -> {args.out}")
            return 0
        if args.task:
            task, tasks = args.task
            part = _cmvn_parts(args, tasks)[task - 1]
            stats = cmvn_stats_of_part((part, False))
            _write_partial(task_file(args.out, task, tasks), stats)
            print(f"cmvn --task {task}/{tasks}: {stats.count if stats else 0} frames -> "
                  f"{task_file(args.out, task, tasks)}; when every task is done: --merge")
            return 0
        if args.dask:
            client = dask_client(args.dask)
            stats = compute_cmvn_stats(_cmvn_parts(args, None), executor=client,
                                       progress=not args.no_progress)
        else:
            features = Featurize(_extractor(args))
            stats = compute_cmvn_stats((features(s) for s in _cmvn_samples(args)),
                                       progress=not args.no_progress)
    except (ValueError, OSError, ImportError) as exc:  # DataError, MissingDataError included
        print(f"speechpipe cmvn: error: {exc}", file=sys.stderr)
        return 2
    finally:
        if client is not None:
            client.close()
    stats.save(args.out)
    print(f"cmvn: {stats.count} frames of dim {stats.dim} -> {args.out}")
    return 0
