"""LibriSpeech (openslr 12): download, prepare manifests, and read the corpus in its layout.

``LibriSpeech/<part>/<speaker>/<chapter>/<speaker>-<chapter>.trans.txt`` holds one
``<utt-id> <UPPERCASE TRANSCRIPT>`` line per utterance; the audio is the FLAC file
``<utt-id>.flac`` beside it (16 kHz, mono). Each official archive (``dev-clean.tar.gz`` ...)
re-creates the ``LibriSpeech/`` root.

- :func:`download_librispeech`: the official archives (sha256-verified, resumable,
  idempotent) -> ``<target_dir>/LibriSpeech``;
- :func:`prepare_librispeech`: validates the layout of each part and writes
  ``librispeech_samples_<part>.jsonl.gz`` (``key``, ``audio_path``, ``duration``,
  ``sample_rate``, ``text``, ``speaker``, ``chapter``);
- :func:`librispeech_train` / :func:`librispeech_valid` / :func:`librispeech_test`: pipelines
  with icefall's defaults (train on 1-20 s utterances, 80-bin fbank, budget batches);
- :func:`librispeech_samples`: stream samples with audio straight from the corpus folder, no
  manifest (the demo's source).

From a downloaded corpus to a training loop::

    download_librispeech("data", parts=["train-clean-100", "dev-clean"])
    manifests = prepare_librispeech("data/LibriSpeech", "data/manifests", num_jobs=4)
    train = librispeech_train(manifests, parts=["train-clean-100"], tokenizer=tok)
    loader = speechpipe.build_loader(train, num_workers=4)
    for epoch in range(10):
        for batch in loader:  # each pass over the loader is the next epoch
            ...  # batch["feats"] (B, T, 80), batch["feats_len"], batch["tokens"] ...
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable

from ..errors import DataError, MissingDataError
from ..pipes._core import IterableWrapper, IterDataPipe
from ..pipes.kaldi import parse_scp_lines
from ..sample import DURATION, KEY, SPEAKER, TEXT
from ._download import Archive, download_parts
from ._pipelines import eval_pipeline, train_pipeline
from ._prepare import (
    AUDIO_PATH,
    check_prepare_args,
    files_under,
    check_pairs,
    measure_audio,
    prepare_parts,
    resolve_manifests,
    resolve_parts,
)

__all__ = [
    "ARCHIVES",
    "BASE_URL",
    "CORPUS",
    "DURATION_RANGE",
    "PARTS",
    "TEST_PARTS",
    "TRAIN_PARTS",
    "VALID_PARTS",
    "download_librispeech",
    "librispeech_samples",
    "librispeech_test",
    "librispeech_train",
    "librispeech_valid",
    "prepare_librispeech",
    "transcript_to_sample",
]

CORPUS = "librispeech"

PARTS = (
    "dev-clean",
    "dev-other",
    "test-clean",
    "test-other",
    "train-clean-100",
    "train-clean-360",
    "train-other-500",
)
TRAIN_PARTS = ("train-clean-100", "train-clean-360", "train-other-500")
VALID_PARTS = ("dev-clean", "dev-other")
TEST_PARTS = ("test-clean", "test-other")

#: Utterance durations icefall's LibriSpeech recipes train on (seconds).
DURATION_RANGE = (1.0, 20.0)

#: The official download site (openslr resource 12).
BASE_URL = "https://www.openslr.org/resources/12"

_SHA256 = {
    "dev-clean": "76f87d090650617fca0cac8f88b9416e0ebf80350acb97b343a85fa903728ab3",
    "dev-other": "12661c48e8c3fe1de2c1caa4c3e135193bfb1811584f11f569dd12645aa84365",
    "test-clean": "39fde525e59672dc6d1551919b1478f724438a95aa55f874b576be21967e6c23",
    "test-other": "d09c181bba5cf717b3dee7d4d592af11a3ee3a09e08ae025c5506f6ebe961c29",
    "train-clean-100": "d4ddd1d5a6ab303066f14971d768ee43278a5f2a0aa43dc716b0e64ecbbbf6e2",
    "train-clean-360": "146a56496217e96c14334a160df97fffedd6e0a04e66b9c5af0d40be3c792ecf",
    "train-other-500": "ddb22f27f96ec163645d53215559df6aa36515f26e01dd70798188350adcb6d2",
}

#: ``{part: Archive}``: official archive names and sha256 sums (as torchaudio lists them).
ARCHIVES = {
    part: Archive(f"{part}.tar.gz", f"sha256:{_SHA256[part]}", f"LibriSpeech/{part}")
    for part in PARTS
}


def transcript_to_sample(entry) -> dict:
    """One ``*.trans.txt`` entry (from ``parse_scp``) to a sample pointing at its FLAC file.

    >>> from speechpipe.pipes.kaldi import ScpEntry
    >>> s = transcript_to_sample(ScpEntry("19-198-0001", "HELLO", "/c/19/198/19-198.trans.txt", 2))
    >>> s["key"], s["speaker"], s["audio_path"]
    ('19-198-0001', '19', '/c/19/198/19-198-0001.flac')
    """
    key, text = entry
    return {
        KEY: key,
        TEXT: text,
        SPEAKER: key.split("-", 1)[0],
        AUDIO_PATH: os.path.join(os.path.dirname(entry.source), f"{key}.flac"),
    }


def librispeech_samples(
    corpus_dir: str | os.PathLike, parts: str | Iterable[str] = ("dev-clean",), *, shard=False,
    on_error: str = "raise",
) -> IterDataPipe[dict]:
    """Samples of the given LibriSpeech parts: ``key``, ``text``, ``speaker``, ``audio``,
    ``sample_rate`` and ``audio_path``, in sorted transcript-file order.

    Args:
        corpus_dir: the ``LibriSpeech`` folder (holding ``dev-clean/`` ...).
        parts: part names (see :data:`PARTS`).
        shard: insert torch's ``sharding_filter`` before audio decoding, so that DataLoader
            workers (and ranks) each decode a disjoint share.
        on_error: a FLAC file that is missing, truncated or corrupt: ``"raise"`` naming it,
            or ``"skip"`` the utterance, counted in ``load_audio``'s diagnostics.

    Raises:
        MissingDataError: when iterated, if a part folder is absent.

    >>> from speechpipe.demo import DEMO_CORPUS
    >>> s = next(iter(librispeech_samples(DEMO_CORPUS)))
    >>> sorted(s), s["sample_rate"], s["audio"].dtype
    (['audio', 'audio_path', 'key', 'sample_rate', 'speaker', 'text'], 16000, dtype('float32'))
    """
    if isinstance(parts, str):
        parts = [parts]
    dirs = [os.path.join(os.fspath(corpus_dir), part) for part in parts]
    pipe = IterableWrapper(dirs).map(_existing_dir)
    pipe = pipe.list_files(masks="*.trans.txt", recursive=True)
    pipe = pipe.open_files(mode="b").parse_scp()  # (utt-id, transcript) with file and line
    pipe = pipe.map(transcript_to_sample)
    if shard:
        pipe = pipe.sharding_filter()
    return pipe.load_audio(field=AUDIO_PATH, on_error=on_error)


def _existing_dir(path: str) -> str:
    if not os.path.isdir(path):
        raise MissingDataError("LibriSpeech part folder not found", source=path)
    return path


# --------------------------------------------------------------------------- download


def download_librispeech(
    target_dir: str | os.PathLike,
    parts: str | Iterable[str] = PARTS,
    force: bool = False,
    *,
    base_url: str = BASE_URL,
    checksums: dict[str, str | None] | None = None,
    progress: bool = True,
) -> Path:
    """Download and extract LibriSpeech parts into ``target_dir``; return
    ``<target_dir>/LibriSpeech``.

    Each part's archive (``<part>.tar.gz``, 0.3-30 GB) is downloaded with resume, its sha256
    verified, extracted safely, and marked done by ``LibriSpeech/<part>/.completed``: parts
    already done are skipped (``force=True`` redoes them). See
    :func:`~speechpipe.recipes.download_and_extract`.

    Args:
        target_dir: download folder.
        parts: part names, or ``"all"`` (default: every part, about 60 GB).
        force: download again parts already done.
        base_url: a mirror's URL holding the archives under their official names.
        checksums: ``{part: checksum or None}`` replacing the official sums (mirrors of other
            files, tests).
        progress: tqdm progress bars.
    """
    return download_parts(ARCHIVES, parts, target_dir, base_url=base_url,
                          corpus_root="LibriSpeech", force=force, checksums=checksums,
                          progress=progress)


# --------------------------------------------------------------------------- prepare


def prepare_librispeech(
    corpus_dir: str | os.PathLike,
    output_dir: str | os.PathLike | None = None,
    parts: str | Iterable[str] = "auto",
    num_jobs: int = 1,
    *,
    on_mismatch: str = "error",
    force: bool = False,
    progress: bool = True,
    **checks: Any,
) -> dict[str, Any]:
    """Validate LibriSpeech parts and write ``librispeech_samples_<part>.jsonl.gz`` for each.

    Per part, every ``<spk>/<chapter>/`` folder must hold ``<spk>-<chapter>.trans.txt`` and
    the FLAC file of each line; utterance ids must belong to their folder. One manifest line
    per utterance, sorted by key: ``key``, ``audio_path`` (absolute), ``duration`` (seconds,
    from the FLAC header), ``sample_rate``, ``text``, ``speaker``, ``chapter``. Parts whose
    manifest exists are reused (``force`` rebuilds them).

    Args:
        corpus_dir: the ``LibriSpeech`` folder.
        output_dir: manifest folder; ``None`` returns the sample lists instead of paths.
        parts: ``"auto"`` (every part present), a part name or several.
        num_jobs: threads reading FLAC headers.
        on_mismatch: FLAC files without a transcript line (or chapter transcript file), and
            transcript lines without FLAC file: ``"error"`` raises a
            :class:`~speechpipe.errors.DataError` with counts and examples; ``"skip"`` leaves
            them out, counted in a :class:`~speechpipe.diagnostics.SkippedInputWarning`.
        force: rebuild manifests that exist.
        progress: tqdm progress bars.
        **checks: ``sample_rate`` (16000), ``verify`` (False), ``on_error`` ("raise"),
            ``empty_text`` ("error"): see :func:`~speechpipe.recipes.prepare_parts`.

    Returns:
        ``{part: manifest path}`` (or ``{part: [samples]}`` without ``output_dir``).

    Raises:
        MissingDataError: ``corpus_dir`` or a requested part folder is absent, or (under
            ``"error"``) a chapter lacks its ``.trans.txt``.
        DataError: a malformed or duplicate transcript line, an id outside its folder, a FLAC
            file outside the ``<spk>/<chapter>/`` layout, an unreadable FLAC header, a
            mismatch under ``"error"``.

    >>> from speechpipe.demo import DEMO_CORPUS
    >>> samples = prepare_librispeech(DEMO_CORPUS, progress=False)["dev-clean"]
    >>> s = samples[0]
    >>> s["key"], s["speaker"], s["chapter"], s["sample_rate"], round(s["duration"], 2)
    ('1001-100101-0000', '1001', '100101', 16000, 5.89)
    """
    check_prepare_args(on_mismatch, num_jobs)
    root = Path(corpus_dir)
    if not root.is_dir():
        raise MissingDataError("LibriSpeech folder not found", source=str(root))
    names = resolve_parts(parts, PARTS, lambda p: (root / p).is_dir(), corpus=CORPUS,
                          corpus_dir=root)
    return prepare_parts(
        CORPUS, names, output_dir,
        lambda part: _part_samples(root, part, num_jobs=num_jobs, on_mismatch=on_mismatch,
                                   progress=progress),
        force=force, num_jobs=num_jobs, progress=progress,
        settings={"on_mismatch": on_mismatch},
        inputs=lambda part: files_under(root / part), **checks,
    )


def _part_samples(root: Path, part: str, *, num_jobs: int, on_mismatch: str,
                  progress: bool) -> list[dict]:
    part_dir = root / part
    audio: dict[str, Path] = {}
    chapters: dict[Path, list[Path]] = {}
    for flac in sorted(part_dir.rglob("*.flac")):
        rel = flac.relative_to(part_dir).parts
        if len(rel) != 3 or flac.stem.split("-")[:2] != list(rel[:2]):
            raise DataError(
                "FLAC file outside the LibriSpeech layout <part>/<speaker>/<chapter>/"
                "<speaker>-<chapter>-<utt>.flac", source=str(flac))
        audio[flac.stem] = flac
        chapters.setdefault(flac.parent, []).append(flac)
    transcripts: dict[str, tuple[str, str]] = {}
    for trans in sorted(part_dir.rglob("*.trans.txt")):
        rel = trans.relative_to(part_dir).parts
        prefix = f"{rel[0]}-{rel[1]}-" if len(rel) == 3 else None
        if prefix is None or trans.name != f"{rel[0]}-{rel[1]}.trans.txt":
            raise DataError("transcript file outside the LibriSpeech layout <part>/<speaker>/"
                            "<chapter>/<speaker>-<chapter>.trans.txt", source=str(trans))
        with open(trans, "rb") as stream:
            for entry in parse_scp_lines(stream, source=str(trans), allow_empty=True):
                if not entry.key.startswith(prefix):
                    raise DataError(f"utterance id does not belong to chapter folder "
                                    f"{rel[0]}/{rel[1]} (expected {prefix}NNNN)",
                                    source=str(trans), line=entry.line, key=entry.key)
                transcripts[entry.key] = (entry.value, f"{trans}:{entry.line} (key "
                                                       f"{entry.key!r})")
    for chapter, flacs in sorted(chapters.items()):
        expected = chapter / f"{chapter.parent.name}-{chapter.name}.trans.txt"
        if not expected.is_file():
            if on_mismatch == "error":
                raise MissingDataError(
                    f"transcript file missing: {len(flacs)} FLAC file(s) in this chapter have "
                    "no transcript (pass on_mismatch='skip' to leave them out, counted)",
                    source=str(expected))
    if not audio and not transcripts:
        raise DataError("no FLAC files and no *.trans.txt in this part", source=str(part_dir))
    without_text = [str(audio[k]) for k in sorted(audio) if k not in transcripts]
    without_audio = [transcripts[k][1] for k in sorted(transcripts) if k not in audio]
    check_pairs(without_text, without_audio, on_mismatch=on_mismatch,
                stage=f"prepare_librispeech {part}", source=part_dir)
    keys = sorted(set(audio) & set(transcripts))
    paths = [str(audio[k].resolve()) for k in keys]
    measured = measure_audio(paths, num_jobs=num_jobs, progress=progress,
                             desc=f"librispeech {part}")
    samples = []
    for key, path, (frames, rate) in zip(keys, paths, measured):
        speaker, chapter, _ = key.split("-", 2)
        samples.append({
            KEY: key, AUDIO_PATH: path, DURATION: frames / rate, "sample_rate": rate,
            TEXT: transcripts[key][0], SPEAKER: speaker, "chapter": chapter,
        })
    return samples


# --------------------------------------------------------------------------- pipelines


def librispeech_train(manifests: Any, parts: Iterable[str] = TRAIN_PARTS, *,
                      min_duration: float | None = DURATION_RANGE[0],
                      max_duration: float | None = DURATION_RANGE[1],
                      **options: Any) -> IterDataPipe[dict]:
    """Training batches of LibriSpeech parts, with icefall's defaults: utterances of 1-20 s
    (the others dropped and counted), 80-bin fbank, 200 padded seconds per batch.

    Args:
        manifests: the manifest folder, prepare's dict, or manifest paths (then ``parts`` is
            ignored); see :func:`~speechpipe.recipes.resolve_manifests`.
        parts: the parts to train on (default: the full 960 h).
        min_duration, max_duration: duration range kept, seconds.
        **options: :func:`~speechpipe.recipes.train_pipeline` options
            (``tokenizer``, ``speed_perturb=(0.9, 1.0, 1.1)``, ``budget``, ``seed``...).
    """
    return train_pipeline(resolve_manifests(manifests, corpus=CORPUS, parts=list(parts)),
                          min_duration=min_duration, max_duration=max_duration, **options)


def librispeech_valid(manifests: Any, parts: Iterable[str] = VALID_PARTS,
                      **options: Any) -> IterDataPipe[dict]:
    """Validation batches (dev-clean + dev-other by default), every utterance, fixed order.

    ``options`` are :func:`~speechpipe.recipes.eval_pipeline`'s.
    """
    return eval_pipeline(resolve_manifests(manifests, corpus=CORPUS, parts=list(parts)),
                         **options)


def librispeech_test(manifests: Any, part: str = "test-clean",
                     **options: Any) -> IterDataPipe[dict]:
    """Test batches of one part (``test-clean`` or ``test-other``), every utterance, fixed order.

    ``options`` are :func:`~speechpipe.recipes.eval_pipeline`'s.
    """
    return eval_pipeline(resolve_manifests(manifests, corpus=CORPUS, parts=[part]), **options)
