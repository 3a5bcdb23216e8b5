"""RIRS_NOISES (room impulse responses and noises, OpenSLR 28): download, prepare manifests.

Layout (the archive ``rirs_noises.zip`` creates ``RIRS_NOISES/``)::

    RIRS_NOISES/
      simulated_rirs/{smallroom,mediumroom,largeroom}/
        rir_list                        # --rir-id <id> --room-id <room> <path>
        Room001/Room001-00001.wav ...   # 60,000 simulated responses, 16 kHz
      real_rirs_isotropic_noises/
        rir_list                        # --rir-id <id> --room-id <room> <path>
        noise_list                      # --noise-id <id> --noise-type isotropic
                                        #   --room-linkage <room> <path>
        *.wav                           # measured responses (RWCP, AIR, REVERB) and noises
      pointsource_noises/
        noise_list                      # --noise-id <id> --noise-type point-source
                                        #   --bg-fg-type <background|foreground> <path>
        *.wav

The lists are Kaldi's ``reverberate_data_dir.py`` inputs; their paths start with
``RIRS_NOISES/`` (relative to the folder holding it).

- :func:`download_rirs_noises`: the official zip (1.3 GB, md5-verified as OpenSLR lists it,
  resumable, idempotent) -> ``<target_dir>/RIRS_NOISES``;
- :func:`prepare_rirs_noises`: one manifest per list (:data:`PARTS`: the three simulated room
  sizes, ``real_rirs``, ``isotropic_noises``, ``pointsource_noises``), in list order, with
  ``key`` (the list's id), ``audio_path``, ``duration``, ``sample_rate``, ``room`` (room id or
  linkage) and the list's other options (``noise_type``, ``bg_fg_type``).

The response manifests are the ``rir=`` source of :func:`~speechpipe.recipes.train_pipeline`
(``reverberate``; Kaldi's recipes use ``smallroom`` and ``mediumroom``); the noise manifests can
be ``noise=`` sources (``add_noise``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable

from ..errors import DataError, MissingDataError
from ..pipes.sources import iter_text_lines
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
    "CORPUS",
    "LISTS",
    "PARTS",
    "ROOM",
    "download_rirs_noises",
    "parse_list_line",
    "prepare_rirs_noises",
]

CORPUS = "rirs_noises"
#: ``{part: list file}`` relative to ``RIRS_NOISES/``.
LISTS = {
    "smallroom": "simulated_rirs/smallroom/rir_list",
    "mediumroom": "simulated_rirs/mediumroom/rir_list",
    "largeroom": "simulated_rirs/largeroom/rir_list",
    "real_rirs": "real_rirs_isotropic_noises/rir_list",
    "isotropic_noises": "real_rirs_isotropic_noises/noise_list",
    "pointsource_noises": "pointsource_noises/noise_list",
}
PARTS = tuple(LISTS)
#: OpenSLR's resource folder.
BASE_URL = "https://www.openslr.org/resources/28"
#: ``{part: Archive}``: one zip holds every part (its md5 as OpenSLR lists it).
ARCHIVES = {"all": Archive("rirs_noises.zip", "md5:e6f48e257286e05de56413b4779d8ffb",
                           "RIRS_NOISES")}
#: Manifest field: the room of a response (``--room-id``) or of a noise (``--room-linkage``).
ROOM = "room"


def download_rirs_noises(
    target_dir: str | os.PathLike,
    parts: str | Iterable[str] = "all",
    force: bool = False,
    *,
    base_url: str = BASE_URL,
    checksums: dict[str, str | None] | None = None,
    progress: bool = True,
) -> Path:
    """Download and extract RIRS_NOISES into ``target_dir``; return
    ``<target_dir>/RIRS_NOISES``.

    One zip for every part (``parts`` is ``"all"``). Resumable, md5-verified, extracted
    safely (zip members checked as tar members are), marked done by
    ``RIRS_NOISES/.completed`` (``force=True`` redoes it); ``base_url`` and ``checksums`` as
    in :func:`~speechpipe.recipes.librispeech.download_librispeech`.
    """
    return download_parts(ARCHIVES, parts, target_dir, base_url=base_url,
                          corpus_root="RIRS_NOISES", force=force, checksums=checksums,
                          progress=progress)


def parse_list_line(text: str, *, source: str, line: int) -> tuple[str, dict[str, str]]:
    """``(path, {option: value})`` of one ``rir_list`` / ``noise_list`` line.

    Options are ``--name value`` pairs (``--rir-id``, ``--room-id``, ``--noise-id``...), named
    with underscores; the last token is the WAV path.

    Raises:
        DataError: an option without a value, no path, or no ``--rir-id`` / ``--noise-id``;
            names ``file:line``.

    >>> parse_list_line("--rir-id r1 --room-id small-1 RIRS_NOISES/a.wav", source="rir_list",
    ...                 line=1)
    ('RIRS_NOISES/a.wav', {'rir_id': 'r1', 'room_id': 'small-1'})
    """
    tokens = text.split()
    if len(tokens) % 2 == 0:
        raise DataError("expected '--option value' pairs and a path", source=source, line=line)
    options = {}
    for name, value in zip(tokens[:-1:2], tokens[1:-1:2]):
        if not name.startswith("--") or value.startswith("--"):
            raise DataError(f"expected '--option value', got {name!r} {value!r}",
                            source=source, line=line)
        options[name[2:].replace("-", "_")] = value
    if "rir_id" not in options and "noise_id" not in options:
        raise DataError("the line has no --rir-id or --noise-id", source=source, line=line)
    return tokens[-1], options


def prepare_rirs_noises(
    corpus_dir: str | os.PathLike,
    output_dir: str | os.PathLike | None = None,
    parts: str | Iterable[str] = "auto",
    num_jobs: int = 1,
    *,
    on_mismatch: str = "error",
    force: bool = False,
    progress: bool = True,
) -> dict[str, Any]:
    """Read the lists of ``RIRS_NOISES/`` and write ``rirs_noises_samples_<part>.jsonl.gz``.

    One line per list line, in list order: ``key`` (``--rir-id`` / ``--noise-id``),
    ``audio_path`` (absolute), ``duration`` and ``sample_rate`` (from the WAV header),
    ``room`` (``--room-id`` / ``--room-linkage``, when given) and the other options
    (``noise_type``, ``bg_fg_type``). A manifest that exists is reused (``force`` rebuilds it).

    Args:
        corpus_dir: the ``RIRS_NOISES`` folder.
        output_dir: manifest folder; ``None`` returns the sample lists instead of paths.
        parts: ``"auto"`` (every part whose list is present), or some of :data:`PARTS`.
        num_jobs: threads reading WAV headers.
        on_mismatch: a list line whose WAV file is absent: ``"error"`` raises a
            :class:`~speechpipe.errors.MissingDataError` naming ``list:line``; ``"skip"``
            leaves it out.
        force: rebuild manifests that exist.
        progress: tqdm progress bars.

    Raises:
        MissingDataError: ``corpus_dir``, a list asked for, or (under ``"error"``) a WAV file
            a list names is absent.
        DataError: a malformed list line, the same id twice in a list, an unreadable header.
    """
    check_prepare_args(on_mismatch, num_jobs)
    root = Path(corpus_dir)
    if not root.is_dir():
        raise MissingDataError("RIRS_NOISES folder not found", source=str(root))
    names = resolve_parts(parts, PARTS, lambda p: (root / LISTS[p]).is_file(), corpus=CORPUS,
                          corpus_dir=root, where=lambda p: str(root / LISTS[p]))
    return prepare_parts(
        CORPUS, names, output_dir,
        lambda part: _samples(root, root / LISTS[part], on_mismatch=on_mismatch,
                              num_jobs=num_jobs, progress=progress), force=force)


def _resolve(root: Path, path: str) -> Path:
    """A list's path: relative to the folder holding ``RIRS_NOISES`` (as the lists write
    them), else to ``RIRS_NOISES`` itself."""
    first, _, rest = path.partition("/")
    return root / rest if first == root.name or first == "RIRS_NOISES" else root / path


def _samples(root: Path, listing: Path, *, on_mismatch: str, num_jobs: int,
             progress: bool) -> list[dict]:
    rows: list[dict] = []
    seen: dict[str, int] = {}
    with open(listing, "rb") as stream:
        lines = iter_text_lines(stream, source=str(listing))
        try:
            for number, text in lines:
                if isinstance(text, DataError):
                    raise text
                if not text.strip():
                    continue
                path, options = parse_list_line(text, source=str(listing), line=number)
                key = options.pop("rir_id", None) or options.pop("noise_id")
                if key in seen:
                    raise DataError(f"the same id twice (first on line {seen[key]})",
                                    source=str(listing), line=number, key=key)
                seen[key] = number
                wav = _resolve(root, path)
                if not wav.is_file():
                    if on_mismatch == "skip":
                        continue
                    raise MissingDataError(f"the WAV file {path} is absent (on_mismatch='skip' "
                                           "leaves such lines out)", source=str(listing),
                                           line=number, key=key)
                room = options.pop("room_id", None) or options.pop("room_linkage", None)
                row = {KEY: key, AUDIO_PATH: str(wav.resolve()), **options}
                if room is not None:
                    row[ROOM] = room
                rows.append(row)
        finally:
            lines.close()
    measured = measure_audio([r[AUDIO_PATH] for r in rows], num_jobs=num_jobs,
                             progress=progress, desc=f"rirs_noises {listing.parent.name}")
    for row, (frames, rate) in zip(rows, measured):
        row[DURATION], row["sample_rate"] = frames / rate, rate
    return rows
