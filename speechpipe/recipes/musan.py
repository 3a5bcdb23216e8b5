"""MUSAN (music, speech and noise for augmentation, OpenSLR 17): download, prepare manifests.

Layout (the archive ``musan.tar.gz`` creates ``musan/``)::

    musan/
      README
      music/<source>/{ANNOTATIONS,LICENSE,music-<source>-NNNN.wav}    # fma, jamendo, rfm...
      noise/<source>/{ANNOTATIONS,LICENSE,noise-<source>-NNNN.wav}    # free-sound, sound-bible
      speech/<source>/{ANNOTATIONS,LICENSE,speech-<source>-NNNN.wav}  # librivox, us-gov

16 kHz mono WAV files, about 109 hours in all.

- :func:`download_musan`: the official archive (11 GB, md5-verified as OpenSLR lists it,
  resumable, idempotent) -> ``<target_dir>/musan``;
- :func:`prepare_musan`: ``musan_samples_{music,noise,speech}.jsonl.gz`` with ``key`` (the file
  stem), ``audio_path``, ``duration``, ``sample_rate`` and ``category`` (the ``<source>``
  folder), one line per WAV file in name order.

The manifests are noise sources for ``add_noise`` (the ``noise=`` of
:func:`~speechpipe.recipes.train_pipeline`): ``noise`` and ``music`` as additive noise (Kaldi's
recipes draw SNRs of 0-15 dB and 5-15 dB), ``speech`` with ``babble=3..7`` at 13-20 dB.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable

from ..errors import DataError, MissingDataError
from ..sample import DURATION, KEY
from ._download import Archive, download_parts
from ._prepare import (
    AUDIO_PATH,
    check_prepare_args,
    measure_audio,
    prepare_parts,
    resolve_parts,
)

__all__ = [
    "ARCHIVES",
    "BASE_URL",
    "CATEGORY",
    "CORPUS",
    "PARTS",
    "download_musan",
    "prepare_musan",
]

CORPUS = "musan"
#: The three kinds of sound, one manifest each.
PARTS = ("music", "noise", "speech")
#: OpenSLR's resource folder.
BASE_URL = "https://www.openslr.org/resources/17"
#: ``{part: Archive}``: one archive holds every part (its md5 as OpenSLR lists it).
ARCHIVES = {"all": Archive("musan.tar.gz", "md5:0c472d4fc0c5141eca47ad1ffeb2a7df", "musan")}
#: Manifest field: the ``<source>`` folder of the file (``fma``, ``free-sound``, ``librivox``...).
CATEGORY = "category"


def download_musan(
    target_dir: str | os.PathLike,
    parts: str | Iterable[str] = "all",
    force: bool = False,
    *,
    base_url: str = BASE_URL,
    checksums: dict[str, str | None] | None = None,
    progress: bool = True,
) -> Path:
    """Download and extract MUSAN into ``target_dir``; return ``<target_dir>/musan``.

    One archive for the three parts (``parts`` is ``"all"``). Resumable, md5-verified,
    extracted safely, marked done by ``musan/.completed`` (``force=True`` redoes it);
    ``base_url`` and ``checksums`` as in
    :func:`~speechpipe.recipes.librispeech.download_librispeech`.
    """
    return download_parts(ARCHIVES, parts, target_dir, base_url=base_url, corpus_root="musan",
                          force=force, checksums=checksums, progress=progress)


def prepare_musan(
    corpus_dir: str | os.PathLike,
    output_dir: str | os.PathLike | None = None,
    parts: str | Iterable[str] = "auto",
    num_jobs: int = 1,
    *,
    on_mismatch: str = "error",
    force: bool = False,
    progress: bool = True,
) -> dict[str, Any]:
    """Validate ``musan/`` and write ``musan_samples_<part>.jsonl.gz`` per part.

    One line per ``<part>/<source>/*.wav``, sources and files in name order: ``key`` (the
    file stem, e.g. ``noise-free-sound-0000``), ``audio_path`` (absolute), ``duration`` and
    ``sample_rate`` (from the WAV header), ``category`` (``<source>``). A manifest that
    exists is reused (``force`` rebuilds it).

    Args:
        corpus_dir: the ``musan`` folder.
        output_dir: manifest folder; ``None`` returns the sample lists instead of paths.
        parts: ``"auto"`` (every part present), or some of :data:`PARTS`.
        num_jobs: threads reading WAV headers.
        on_mismatch: accepted for the common signature (MUSAN has no transcripts to pair).
        force: rebuild manifests that exist.
        progress: tqdm progress bars.

    Raises:
        MissingDataError: ``corpus_dir`` or a part asked for is absent.
        DataError: a part without any WAV file, a ``<source>`` folder without its
            ``ANNOTATIONS`` file (not MUSAN's layout), the same key twice, an unreadable
            header.
    """
    check_prepare_args(on_mismatch, num_jobs)
    root = Path(corpus_dir)
    if not root.is_dir():
        raise MissingDataError("MUSAN folder not found", source=str(root))
    names = resolve_parts(parts, PARTS, lambda p: (root / p).is_dir(), corpus=CORPUS,
                          corpus_dir=root)
    return prepare_parts(
        CORPUS, names, output_dir,
        lambda part: _samples(root / part, num_jobs=num_jobs, progress=progress), force=force)


def _samples(folder: Path, *, num_jobs: int, progress: bool) -> list[dict]:
    files: list[tuple[str, Path]] = []
    for source in sorted(p for p in folder.iterdir() if p.is_dir()):
        if not (source / "ANNOTATIONS").is_file():
            raise DataError("a MUSAN source folder has no ANNOTATIONS file (is this the musan "
                            "folder?)", source=str(source))
        files.extend((source.name, wav) for wav in sorted(source.glob("*.wav")))
    if not files:
        raise DataError(f"no <source>/*.wav file in {folder.name}/", source=str(folder))
    seen: dict[str, Path] = {}
    for _, wav in files:
        if wav.stem in seen:
            raise DataError(f"the same key in two sources ({seen[wav.stem]})", source=str(wav),
                            key=wav.stem)
        seen[wav.stem] = wav
    paths = [str(wav.resolve()) for _, wav in files]
    measured = measure_audio(paths, num_jobs=num_jobs, progress=progress,
                             desc=f"musan {folder.name}")
    return [{KEY: wav.stem, AUDIO_PATH: path, DURATION: frames / rate, "sample_rate": rate,
             CATEGORY: source}
            for (source, wav), path, (frames, rate) in zip(files, paths, measured)]
