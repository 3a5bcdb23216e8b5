"""AISHELL-1 (openslr 33, Mandarin read speech): download, prepare manifests, pipelines.

Layout (``data_aishell.tgz`` and ``resource_aishell.tgz`` extract side by side)::

    data_aishell/
      transcript/aishell_transcript_v0.8.txt    # all three splits, one line per utterance
      wav/S0002.tar.gz ... S0916.tar.gz         # as shipped: one archive per speaker
      wav/train/S0002/BAC009S0002W0122.wav      # after extracting those in place (16 kHz)
      wav/dev/S0724/...  wav/test/S0764/...
    resource_aishell/lexicon.txt  speaker.info

A transcript line is ``<utt-id> <space-separated words>``
(``BAC009S0002W0122 而 对 楼市 成交 抑制 作用 最 大 的 限 购``); the utterance id is
``BAC009`` + ``S<speaker>`` + ``W<n>``, and the speaker is the WAV file's folder. Some WAV files
have no transcript line (lhotse warns and skips them; here they go under ``on_mismatch``).

- :func:`download_aishell`: the two archives (resumable, idempotent; checksums unverified),
  then the per-speaker archives of ``data_aishell/wav/`` extracted in place -> the folder
  holding ``data_aishell/``;
- :func:`prepare_aishell`: ``aishell_samples_{train,dev,test}.jsonl.gz`` with ``key``,
  ``audio_path``, ``duration``, ``sample_rate``, ``text`` (the words as written, spaces kept),
  ``speaker``;
- :func:`aishell_train` / :func:`aishell_valid` / :func:`aishell_test`: pipelines with icefall's
  defaults (train on 1-12 s, 80-bin fbank) that remove the spaces between Chinese characters
  before tokenizing (:data:`TEXT_NORMALIZER`): a character tokenizer knows no space, and a
  space left in a label would become ``<unk>``. Build the tokenizer from normalized text::

    download_aishell("data")
    manifests = prepare_aishell("data", "data/manifests", num_jobs=4, on_mismatch="skip")
    texts = [TEXT_NORMALIZER(s["text"]) for s in read_manifest(manifests["train"])]
    tok = CharTokenizer.build(texts, space_symbol=None)
    train = aishell_train(manifests, tokenizer=tok, speed_perturb=(0.9, 1.0, 1.1))
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Callable, Iterable

from ..errors import DataError, MissingDataError
from ..pipes._core import IterDataPipe
from ..pipes.kaldi import parse_scp_lines
from ..pipes.text import TextNormalizer
from ..sample import DURATION, KEY, SPEAKER, TEXT
from ._download import Archive, download_and_extract, safe_extract
from ._pipelines import eval_pipeline, train_pipeline
from ._prepare import (
    AUDIO_PATH,
    check_prepare_args,
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
    "TEXT_NORMALIZER",
    "TRANSCRIPT",
    "aishell_test",
    "aishell_train",
    "aishell_valid",
    "download_aishell",
    "prepare_aishell",
]

CORPUS = "aishell"
PARTS = ("train", "dev", "test")

#: Utterance durations icefall's AISHELL-1 recipes train on (seconds).
DURATION_RANGE = (1.0, 12.0)

#: The official download site (openslr resource 33).
BASE_URL = "https://www.openslr.org/resources/33"

#: ``{download part: Archive}``. ``data_aishell.tgz`` holds all three splits. No checksum:
#: unverified (public scripts list md5 sums, e.g. PaddleSpeech's ``2f494334...`` and
#: ``957d480a...``, but they were not checked against the official files here); pass
#: ``checksums={"data": "md5:<hex>", ...}`` to verify.
ARCHIVES = {
    "data": Archive("data_aishell.tgz", None, "data_aishell"),  # unverified
    "resource": Archive("resource_aishell.tgz", None, "resource_aishell"),  # unverified
}

#: The transcript of every split, relative to the corpus folder.
TRANSCRIPT = "data_aishell/transcript/aishell_transcript_v0.8.txt"

#: Applied to ``text`` before tokenizing in the pipelines: removes the spaces next to Chinese
#: characters (``"而 对 楼市"`` -> ``"而对楼市"``), keeps those between Latin words.
TEXT_NORMALIZER = TextNormalizer(remove_spaces="cjk")

_SENTINEL = ".completed"
#: ``BAC009`` + speaker + ``W`` + number; the speaker folder name is the middle group.
_UTT_ID = re.compile(r"BAC009(S\d{4})W\d{4}")


# --------------------------------------------------------------------------- download


def download_aishell(
    target_dir: str | os.PathLike,
    parts: str | Iterable[str] = ("data", "resource"),
    force: bool = False,
    *,
    base_url: str = BASE_URL,
    checksums: dict[str, str | None] | None = None,
    progress: bool = True,
) -> Path:
    """Download and extract AISHELL-1 into ``target_dir``; return ``target_dir`` (the folder
    holding ``data_aishell/`` and ``resource_aishell/``, which :func:`prepare_aishell` reads).

    ``data_aishell.tgz`` (15 GB, all three splits) ships one archive per speaker in
    ``data_aishell/wav/``; each is extracted in place (creating ``wav/<split>/<speaker>/``)
    and deleted, as Kaldi's ``download_and_untar.sh`` does. Resumable at every step: the
    download continues a partial file, the outer archive is marked extracted by
    ``data_aishell/.extracted``, each speaker archive is deleted only once extracted, and
    ``data_aishell/.completed`` marks the end -- run again after an interruption. Parts already
    complete are skipped (``force=True`` redoes them).

    Args:
        target_dir: download folder.
        parts: ``"data"`` (the speech, ``data_aishell.tgz``), ``"resource"`` (lexicon and
            speaker info, ``resource_aishell.tgz``), both (default), or ``"all"``.
        force: download again parts already done.
        base_url: a mirror holding the archives under their official names.
        checksums: ``{part: checksum or None}`` replacing the sums of :data:`ARCHIVES`.
        progress: tqdm progress bars.

    Raises:
        ValueError: an unknown part (the splits ``train``/``dev``/``test`` are all in
            ``"data"``).
        DataError / MissingDataError: as
            :func:`~speechpipe.recipes.download_and_extract`, and a speaker archive
            that cannot be extracted safely (naming it).
    """
    names = list(ARCHIVES) if parts == "all" else (
        [parts] if isinstance(parts, str) else list(parts))
    unknown = [p for p in names if p not in ARCHIVES]
    if unknown:
        raise ValueError(f"unknown part(s) {unknown}; known: {list(ARCHIVES)} "
                         "(data_aishell.tgz, part 'data', holds train, dev and test)")
    target = Path(target_dir)
    for part in names:
        archive = ARCHIVES[part]
        checksum = archive.checksum
        if checksums is not None and part in checksums:
            checksum = checksums[part]
        folder = target / archive.creates
        done = folder / _SENTINEL
        if done.exists() and not force:
            continue
        if force and done.exists():
            done.unlink()
        download_and_extract(
            f"{base_url.rstrip('/')}/{archive.name}", target, checksum=checksum, force=force,
            sentinel=folder / ".extracted", expected=(archive.creates,), progress=progress,
        )
        if part == "data":
            _extract_speaker_archives(folder / "wav", progress=progress)
        done.write_text(f"{archive.name}\n", encoding="utf-8")
    return target


def _extract_speaker_archives(wav_dir: Path, *, progress: bool) -> None:
    """Extract each ``wav/<speaker>.tar.gz`` into ``wav/`` (safely), then delete it."""
    from ..progress import progress_bar

    if not wav_dir.is_dir():
        raise DataError("data_aishell.tgz did not create the wav/ folder", source=str(wav_dir))
    archives = sorted(wav_dir.glob("*.tar.gz"))
    for archive in progress_bar(archives, desc="extract speakers", unit="archives",
                                disable=not progress, leave=False):
        safe_extract(archive, wav_dir, progress=False)
        archive.unlink()


# --------------------------------------------------------------------------- prepare


def _data_dir(corpus_dir: str | os.PathLike) -> Path:
    """``data_aishell/`` of a corpus folder (also accepted: ``data_aishell/`` itself)."""
    root = Path(corpus_dir)
    if not root.is_dir():
        raise MissingDataError("AISHELL-1 folder not found", source=str(root))
    if (root / "data_aishell").is_dir():
        return root / "data_aishell"
    if (root / "transcript").is_dir() and (root / "wav").is_dir():
        return root
    raise MissingDataError(
        "data_aishell/ not found: pass the folder holding data_aishell/ (where "
        "data_aishell.tgz was extracted)", source=str(root / "data_aishell"))


def prepare_aishell(
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
    """Validate AISHELL-1 splits and write ``aishell_samples_<split>.jsonl.gz`` for each.

    The transcript file (:data:`TRANSCRIPT`) is read once for all splits. Per split, every
    ``wav/<split>/<speaker>/<utt-id>.wav`` with ``<speaker>`` in its id is an utterance. One
    manifest line per WAV file with a transcript line, sorted by key: ``key``, ``audio_path``
    (absolute), ``duration`` (seconds, from the WAV header), ``sample_rate``, ``text`` (the
    transcript's words, spaces kept: the pipelines remove them before tokenizing), ``speaker``
    (the folder). Splits whose manifest exists are reused (``force`` rebuilds them).

    Mismatches, under ``on_mismatch``: a WAV file without transcript line; a transcript line
    of a speaker of this split (``BAC009<speaker>W...``, its folder present) without WAV file.
    Transcript lines of speakers that are in no split folder are other splits' (the file covers
    all of them) and are not counted.

    Args:
        corpus_dir: the folder holding ``data_aishell/`` (or ``data_aishell/`` itself).
        output_dir: manifest folder; ``None`` returns the sample lists instead of paths.
        parts: ``"auto"`` (every split present), a split name or several.
        num_jobs: threads reading WAV headers.
        on_mismatch: ``"error"`` raises a :class:`~speechpipe.errors.DataError` with counts
            and examples; ``"skip"`` leaves them out, counted in a
            :class:`~speechpipe.diagnostics.SkippedInputWarning`. The real corpus has WAV files
            without transcript: pass ``"skip"`` for it.
        force: rebuild manifests that exist.
        progress: tqdm progress bars.
        **checks: ``sample_rate`` (16000), ``verify`` (False), ``on_error`` ("raise"),
            ``empty_text`` ("error"): see :func:`~speechpipe.recipes.prepare_parts`.

    Returns:
        ``{split: manifest path}`` (or ``{split: [samples]}`` without ``output_dir``).

    Raises:
        MissingDataError: ``corpus_dir``, ``data_aishell/``, the transcript file or a requested
            split folder is absent, or the speaker archives in ``wav/`` are not extracted.
        DataError: a malformed, duplicate or non-UTF-8 transcript line, a WAV file outside the
            ``<split>/<speaker>/`` layout, an unreadable WAV header, a mismatch under
            ``"error"``.

    >>> import numpy as np, soundfile, tempfile
    >>> root = Path(tempfile.mkdtemp())
    >>> (root / "data_aishell/wav/dev/S0724").mkdir(parents=True)
    >>> (root / "data_aishell/transcript").mkdir()
    >>> soundfile.write(root / "data_aishell/wav/dev/S0724/BAC009S0724W0121.wav",
    ...                 np.zeros(8000), 16000)
    >>> _ = (root / TRANSCRIPT).write_text("BAC009S0724W0121 明天 见\\n", encoding="utf-8")
    >>> s = prepare_aishell(root, progress=False)["dev"][0]
    >>> s["key"], s["speaker"], s["text"], s["duration"]
    ('BAC009S0724W0121', 'S0724', '明天 见', 0.5)
    """
    check_prepare_args(on_mismatch, num_jobs)
    data = _data_dir(corpus_dir)
    wav = _extracted_wav_dir(data)
    names = resolve_parts(parts, PARTS, lambda p: (wav / p).is_dir(), corpus=CORPUS,
                          corpus_dir=data, where=lambda p: str(wav / p))
    transcript = data / "transcript" / "aishell_transcript_v0.8.txt"
    transcripts = _transcripts_on_demand(transcript)
    if not transcript.is_file():
        raise MissingDataError("the AISHELL-1 transcript file is missing",
                               source=str(transcript))
    return prepare_parts(
        CORPUS, names, output_dir,
        lambda part: _part_samples(wav / part, part, transcripts, num_jobs=num_jobs,
                                   on_mismatch=on_mismatch, progress=progress),
        force=force, num_jobs=num_jobs, progress=progress,
        settings={"on_mismatch": on_mismatch}, **checks,
    )


def _extracted_wav_dir(data: Path) -> Path:
    """``data/wav``, unless it holds the per-speaker archives still packed (no split folder)."""
    wav = data / "wav"
    if not any((wav / p).is_dir() for p in PARTS) and any(wav.glob("*.tar.gz")):
        raise MissingDataError(
            "the per-speaker archives in wav/ are not extracted: run download_aishell (or "
            "'cd data_aishell/wav && for f in *.tar.gz; do tar xzf $f; done')", source=str(wav))
    return wav


def _transcripts_on_demand(path: Path) -> Callable[[], dict[str, tuple[str, str]]]:
    """A function returning :func:`_read_transcript` of ``path``, read at the first call (so
    that reusing every split's manifest reads nothing)."""
    cache: dict[str, tuple[str, str]] = {}

    def transcripts() -> dict[str, tuple[str, str]]:
        if not cache:
            cache.update(_read_transcript(path))
        return cache

    return transcripts


def _read_transcript(path: Path) -> dict[str, tuple[str, str]]:
    """``{utt-id: (text, "file:line (key 'id')")}`` of the transcript file."""
    out: dict[str, tuple[str, str]] = {}
    with open(path, "rb") as stream:
        for entry in parse_scp_lines(stream, source=str(path)):
            out[entry.key] = (entry.value, f"{path}:{entry.line} (key {entry.key!r})")
    return out


def _part_samples(part_dir: Path, part: str,
                  transcripts: Callable[[], dict[str, tuple[str, str]]], *, num_jobs: int,
                  on_mismatch: str, progress: bool) -> list[dict]:
    audio: dict[str, Path] = {}
    for wav in sorted(part_dir.rglob("*.wav")):
        rel = wav.relative_to(part_dir).parts
        if len(rel) != 2 or rel[0] not in wav.stem:
            raise DataError("WAV file outside the AISHELL-1 layout wav/<split>/<speaker>/"
                            "<utt-id>.wav (the utterance id holds the speaker)", source=str(wav))
        audio[wav.stem] = wav
    texts = transcripts()
    speakers = {p.name for p in part_dir.iterdir() if p.is_dir()}
    without_text = [str(audio[k]) for k in sorted(audio) if k not in texts]
    without_audio = []
    for key in sorted(texts):
        match = _UTT_ID.fullmatch(key)
        if match and match.group(1) in speakers and key not in audio:
            without_audio.append(texts[key][1])
    check_pairs(without_text, without_audio, on_mismatch=on_mismatch,
                stage=f"prepare_aishell {part}", source=part_dir)
    keys = sorted(k for k in audio if k in texts)
    paths = [str(audio[k].resolve()) for k in keys]
    measured = measure_audio(paths, num_jobs=num_jobs, progress=progress,
                             desc=f"aishell {part}")
    return [
        {KEY: key, AUDIO_PATH: path, DURATION: frames / rate, "sample_rate": rate,
         TEXT: texts[key][0], SPEAKER: audio[key].parent.name}
        for key, path, (frames, rate) in zip(keys, paths, measured)
    ]


# --------------------------------------------------------------------------- pipelines


def aishell_train(manifests: Any, parts: Iterable[str] = ("train",), *,
                  min_duration: float | None = DURATION_RANGE[0],
                  max_duration: float | None = DURATION_RANGE[1],
                  normalizer: Callable[[str], str] | None = TEXT_NORMALIZER,
                  **options: Any) -> IterDataPipe[dict]:
    """Training batches of AISHELL-1 with icefall's defaults: utterances of 1-12 s (the others
    dropped and counted), 80-bin fbank, 200 padded seconds per batch; the text is normalized by
    :data:`TEXT_NORMALIZER` (spaces between Chinese characters removed) before tokenizing.

    Args:
        manifests: the manifest folder, prepare's dict, or manifest paths (then ``parts`` is
            ignored); see :func:`~speechpipe.recipes.resolve_manifests`.
        parts: the splits to train on.
        min_duration, max_duration: duration range kept, seconds.
        normalizer: applied to ``text`` before tokenizing (``None``: as stored, with spaces).
        **options: :func:`~speechpipe.recipes.train_pipeline` options
            (``tokenizer``, ``speed_perturb=(0.9, 1.0, 1.1)``, ``budget``, ``seed``...).
    """
    return train_pipeline(resolve_manifests(manifests, corpus=CORPUS, parts=list(parts)),
                          min_duration=min_duration, max_duration=max_duration,
                          normalizer=normalizer, **options)


def aishell_valid(manifests: Any, parts: Iterable[str] = ("dev",), *,
                  normalizer: Callable[[str], str] | None = TEXT_NORMALIZER,
                  **options: Any) -> IterDataPipe[dict]:
    """Validation batches (``dev``), every utterance, fixed order, text normalized as in
    :func:`aishell_train`; ``options`` are :func:`~speechpipe.recipes.eval_pipeline`'s.
    """
    return eval_pipeline(resolve_manifests(manifests, corpus=CORPUS, parts=list(parts)),
                         normalizer=normalizer, **options)


def aishell_test(manifests: Any, part: str = "test", *,
                 normalizer: Callable[[str], str] | None = TEXT_NORMALIZER,
                 **options: Any) -> IterDataPipe[dict]:
    """Test batches (``test``), every utterance, fixed order, text normalized as in
    :func:`aishell_train`; ``options`` are :func:`~speechpipe.recipes.eval_pipeline`'s.
    """
    return eval_pipeline(resolve_manifests(manifests, corpus=CORPUS, parts=[part]),
                         normalizer=normalizer, **options)
