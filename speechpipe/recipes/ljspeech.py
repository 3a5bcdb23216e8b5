"""LJSpeech 1.1 (TTS, one speaker): download, prepare manifests, pipelines.

Layout (the archive ``LJSpeech-1.1.tar.bz2`` creates ``LJSpeech-1.1/``)::

    LJSpeech-1.1/
      README  metadata.csv
      wavs/LJ001-0001.wav ... LJ050-0278.wav    # 13,100 files, 22050 Hz mono 16-bit PCM

``metadata.csv`` has no header; each line is ``ID|Transcription|Normalized Transcription``
(pipe-delimited, **no quoting**: text contains ``"`` and ``;``, so lines are split on ``|``
and never read with CSV quoting rules), e.g.
``LJ001-0001|Printing, in the only sense ...|Printing, in the only sense ...``.

- :func:`download_ljspeech`: the official archive (2.6 GB, sha256-verified, resumable,
  idempotent) -> ``<target_dir>/LJSpeech-1.1``;
- :func:`prepare_ljspeech`: ``ljspeech_samples_all.jsonl.gz`` with ``key``, ``audio_path``,
  ``duration``, ``sample_rate``, ``text`` (as written), ``normalized_text`` (numbers and
  abbreviations spelled out, what TTS models read) and ``speaker`` (``"LJ"``);
- :func:`ljspeech_train` / :func:`ljspeech_eval`: TTS pipelines: every utterance kept (the
  corpus spans 1-10 s), 80-band log-mel spectrograms (1024-point FFT, hop 256, 0-8 kHz, as
  Tacotron 2 and most LJSpeech vocoders), tokens from ``normalized_text``.

LJSpeech has no official split: ``PARTS`` is ``("all",)``; split the manifest as your recipe
does (ESPnet keeps the last 500 ids for dev and eval).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable

from ..errors import DataError, MissingDataError
from ..pipes._core import IterDataPipe
from ..pipes.sources import iter_text_lines
from ..sample import DURATION, KEY, SPEAKER, TEXT
from ._download import Archive, download_parts
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
    "MEL_OPTIONS",
    "NORMALIZED_TEXT",
    "PARTS",
    "SAMPLE_RATE",
    "SPEAKER_ID",
    "download_ljspeech",
    "ljspeech_eval",
    "ljspeech_train",
    "parse_metadata_line",
    "prepare_ljspeech",
]

CORPUS = "ljspeech"
#: One part: the corpus has no official split.
PARTS = ("all",)
#: The download site named in the corpus's README.
BASE_URL = "https://data.keithito.com/data/speech"
#: ``{part: Archive}``: the official archive and its sha256 (as torchaudio lists it).
ARCHIVES = {
    "all": Archive(
        "LJSpeech-1.1.tar.bz2",
        "sha256:be1a30453f28eb8dd26af4101ae40cbf2c50413b1bb21936cbcdc6fae3de8aa5",
        "LJSpeech-1.1",
    )
}
#: Manifest field holding the normalized transcription (third column).
NORMALIZED_TEXT = "normalized_text"
#: The speaker field of every utterance.
SPEAKER_ID = "LJ"
#: LJSpeech's sample rate (Hz).
SAMPLE_RATE = 22050
#: ``compute_features("mel", ...)`` options of the usual LJSpeech TTS front end.
MEL_OPTIONS = {"n_fft": 1024, "win_length": 1024, "hop_length": 256, "n_mels": 80,
               "f_min": 0.0, "f_max": 8000.0}


def download_ljspeech(
    target_dir: str | os.PathLike,
    parts: str | Iterable[str] = PARTS,
    force: bool = False,
    *,
    base_url: str = BASE_URL,
    checksums: dict[str, str | None] | None = None,
    progress: bool = True,
) -> Path:
    """Download and extract LJSpeech 1.1 into ``target_dir``; return
    ``<target_dir>/LJSpeech-1.1``.

    Resumable, sha256-verified, extracted safely, marked done by ``LJSpeech-1.1/.completed``
    (a second call does nothing; ``force=True`` redoes it). ``base_url`` and ``checksums``
    as in :func:`~speechpipe.recipes.librispeech.download_librispeech`.
    """
    return download_parts(ARCHIVES, parts, target_dir, base_url=base_url,
                          corpus_root="LJSpeech-1.1", force=force, checksums=checksums,
                          progress=progress)


def parse_metadata_line(text: str, *, source: str, line: int) -> tuple[str, str, str]:
    """``(id, text, normalized text)`` of one ``metadata.csv`` line (split on ``|``, no quoting).

    Raises:
        DataError: not exactly three fields, or an empty id; names ``file:line``.

    >>> parse_metadata_line('LJ001-0007|"Mr. Smith"; 1850|"Mister Smith"; eighteen fifty',
    ...                     source="metadata.csv", line=7)
    ('LJ001-0007', '"Mr. Smith"; 1850', '"Mister Smith"; eighteen fifty')
    """
    fields = text.rstrip("\r\n").split("|")
    if len(fields) != 3:
        raise DataError(
            f"expected 3 '|'-separated fields (id|transcription|normalized transcription), "
            f"got {len(fields)}", source=source, line=line)
    key, raw, normalized = fields
    if not key.strip() or key != key.strip():
        raise DataError(f"bad utterance id {key!r}", source=source, line=line)
    return key, raw, normalized


def prepare_ljspeech(
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
    """Validate ``LJSpeech-1.1/`` and write ``ljspeech_samples_all.jsonl.gz``.

    One manifest line per ``metadata.csv`` line whose ``wavs/<id>.wav`` exists, in file order:
    ``key``, ``audio_path`` (absolute), ``duration`` (seconds, from the WAV header),
    ``sample_rate``, ``text``, ``normalized_text``, ``speaker`` (``"LJ"``). A manifest that
    exists is reused (``force`` rebuilds it).

    Args:
        corpus_dir: the ``LJSpeech-1.1`` folder.
        output_dir: manifest folder; ``None`` returns the sample list instead of a path.
        parts: ``"auto"`` or ``"all"``.
        num_jobs: threads reading WAV headers.
        on_mismatch: WAV files without a metadata line and metadata lines without WAV file:
            ``"error"`` raises a :class:`~speechpipe.errors.DataError` with counts and
            examples; ``"skip"`` leaves them out, counted in a warning.
        force: rebuild a manifest that exists.
        progress: tqdm progress bars.
        **checks: ``sample_rate`` (22050, LJSpeech's own), ``verify`` (False),
            ``on_error`` ("raise"), ``empty_text`` ("error"): see
            :func:`~speechpipe.recipes.prepare_parts`.

    Raises:
        MissingDataError: ``corpus_dir``, ``metadata.csv`` or ``wavs/`` is absent.
        DataError: a line without three fields, an empty or repeated id, invalid UTF-8, an
            unreadable WAV header, a mismatch under ``"error"``.
    """
    check_prepare_args(on_mismatch, num_jobs)
    root = Path(corpus_dir)
    if not root.is_dir():
        raise MissingDataError("LJSpeech folder not found", source=str(root))
    if not (root / "metadata.csv").is_file():
        raise MissingDataError("metadata.csv not found (is this the LJSpeech-1.1 folder?)",
                               source=str(root / "metadata.csv"))
    names = resolve_parts(parts, PARTS, lambda p: True, corpus=CORPUS, corpus_dir=root)
    return prepare_parts(
        CORPUS, names, output_dir,
        lambda part: _samples(root, num_jobs=num_jobs, on_mismatch=on_mismatch,
                              progress=progress),
        force=force, num_jobs=num_jobs, progress=progress,
        settings={"on_mismatch": on_mismatch},
        **{"sample_rate": SAMPLE_RATE, **checks},
    )


def _samples(root: Path, *, num_jobs: int, on_mismatch: str, progress: bool) -> list[dict]:
    metadata = root / "metadata.csv"
    wav_dir = root / "wavs"
    if not wav_dir.is_dir():
        raise MissingDataError("the wavs/ folder is missing", source=str(wav_dir))
    rows: list[tuple[str, str, str, str]] = []
    seen: dict[str, int] = {}
    with open(metadata, "rb") as stream:
        lines = iter_text_lines(stream, source=str(metadata))
        try:
            for number, text in lines:
                if isinstance(text, DataError):
                    raise text
                if number == 1:
                    text = text.lstrip("\ufeff")
                if not text.strip():
                    continue
                key, raw, normalized = parse_metadata_line(text, source=str(metadata),
                                                           line=number)
                if key in seen:
                    raise DataError(f"duplicate id (first on line {seen[key]})",
                                    source=str(metadata), line=number, key=key)
                seen[key] = number
                rows.append((key, raw, normalized, f"{metadata}:{number} (key {key!r})"))
        finally:
            lines.close()
    wavs = {p.stem: p for p in sorted(wav_dir.glob("*.wav"))}
    without_text = [str(wavs[k]) for k in sorted(wavs) if k not in seen]
    without_audio = [loc for key, _, _, loc in rows if key not in wavs]
    check_pairs(without_text, without_audio, on_mismatch=on_mismatch,
                stage="prepare_ljspeech", source=root)
    kept = [row for row in rows if row[0] in wavs]
    paths = [str(wavs[key].resolve()) for key, *_ in kept]
    measured = measure_audio(paths, num_jobs=num_jobs, progress=progress, desc="ljspeech")
    return [
        {KEY: key, AUDIO_PATH: path, DURATION: frames / rate, "sample_rate": rate,
         TEXT: raw, NORMALIZED_TEXT: normalized, SPEAKER: SPEAKER_ID}
        for (key, raw, normalized, _), path, (frames, rate) in zip(kept, paths, measured)
    ]


def ljspeech_train(manifests: Any, *, features: str | None = "mel",
                   feature_options: dict | None = None, text_field: str = NORMALIZED_TEXT,
                   sample_rate: int | None = SAMPLE_RATE,
                   **options: Any) -> IterDataPipe[dict]:
    """TTS training batches: log-mel spectrograms (:data:`MEL_OPTIONS`), tokens of
    ``normalized_text`` (with a ``tokenizer``), every utterance kept (no duration filter:
    LJSpeech's 1-10 s all fit).

    Args:
        manifests: the manifest folder, prepare's dict, or manifest paths.
        features: ``"mel"`` (default), another kind, or ``None`` for raw audio batches.
        feature_options: replaces :data:`MEL_OPTIONS`.
        text_field: the text tokenized (``normalized_text``; ``text`` for the raw one).
        sample_rate: the rate audio is resampled to (LJSpeech's own 22050 Hz: a TTS recipe
            keeps it, unlike the ASR recipes' 16 kHz).
        **options: :func:`~speechpipe.recipes.train_pipeline` options.
    """
    if feature_options is None and features == "mel":
        feature_options = MEL_OPTIONS
    return train_pipeline(resolve_manifests(manifests, corpus=CORPUS, parts=list(PARTS)),
                          features=features, feature_options=feature_options,
                          text_field=text_field, sample_rate=sample_rate, **options)


def ljspeech_eval(manifests: Any, *, features: str | None = "mel",
                  feature_options: dict | None = None, text_field: str = NORMALIZED_TEXT,
                  sample_rate: int | None = SAMPLE_RATE,
                  **options: Any) -> IterDataPipe[dict]:
    """Validation / test batches in manifest order, the same front end as
    :func:`ljspeech_train`; ``options`` are
    :func:`~speechpipe.recipes.eval_pipeline`'s."""
    if feature_options is None and features == "mel":
        feature_options = MEL_OPTIONS
    return eval_pipeline(resolve_manifests(manifests, corpus=CORPUS, parts=list(PARTS)),
                         features=features, feature_options=feature_options,
                         text_field=text_field, sample_rate=sample_rate, **options)
