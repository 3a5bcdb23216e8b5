"""LibriSpeech (openslr 12): reading the corpus in its official on-disk layout.

``LibriSpeech/<part>/<speaker>/<chapter>/<speaker>-<chapter>.trans.txt`` holds one
``<utt-id> <UPPERCASE TRANSCRIPT>`` line per utterance; the audio is the FLAC file
``<utt-id>.flac`` beside it (16 kHz, mono).
"""

from __future__ import annotations

import os
from typing import Iterable

from ..errors import MissingDataError
from ..pipes._base import IterableWrapper, IterDataPipe
from ..sample import KEY, SPEAKER, TEXT

__all__ = ["PARTS", "librispeech_samples", "transcript_to_sample"]

PARTS = (
    "dev-clean",
    "dev-other",
    "test-clean",
    "test-other",
    "train-clean-100",
    "train-clean-360",
    "train-other-500",
)

AUDIO_PATH = "audio_path"


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
    corpus_dir: str | os.PathLike, parts: str | Iterable[str] = ("dev-clean",), *, shard=False
) -> IterDataPipe[dict]:
    """Samples of the given LibriSpeech parts: ``key``, ``text``, ``speaker``, ``audio``,
    ``sample_rate`` and ``audio_path``, in sorted transcript-file order.

    Args:
        corpus_dir: the ``LibriSpeech`` folder (holding ``dev-clean/`` ...).
        parts: part names (see :data:`PARTS`).
        shard: insert torch's ``sharding_filter`` before audio decoding, so that DataLoader
            workers (and ranks) each decode a disjoint share.

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
    return pipe.load_audio(field=AUDIO_PATH)


def _existing_dir(path: str) -> str:
    if not os.path.isdir(path):
        raise MissingDataError("LibriSpeech part folder not found", source=path)
    return path
