"""Hugging Face ``datasets``: an audio dataset's rows as speechpipe samples.

``datasets`` (imported where used: ``pip install datasets``) keeps audio in an ``Audio``
column. datasets 5 decodes it with torchcodec, which speechpipe does not need: the column is
read with ``Audio(decode=False)`` -- each value ``{"bytes", "path"}`` -- and decoded here with
soundfile (:func:`~speechpipe.pipes.decode._decode.read_audio`), the same decoder as the rest of
speechpipe, whether or not torchcodec is installed.

- :func:`read_hf_dataset`: rows of a ``Dataset`` (map-style) or ``IterableDataset``
  (streaming) as samples with ``audio``; or, for a ``Dataset``, as manifest rows that name
  their row (``hf_index``) and their ``duration`` (from the audio header), for
  ``shuffle_samples`` and the recipe builders;
- ``load_hf_audio`` (:class:`HfAudioLoaderIterDataPipe`): the audio of those rows.
"""

from __future__ import annotations

import io
import os
from typing import Any, Iterator, Mapping

import soundfile

from ...errors import DataError, MissingDataError
from ...sample import AUDIO, DURATION, KEY, SAMPLE_RATE, SOURCE, Sample
from .._core import functional_datapipe, IterableWrapper, IterDataPipe
from ..decode import read_audio
from ...sample import TEXT

__all__ = ["HF_INDEX", "HfAudioLoader", "HfAudioLoaderIterDataPipe", "HfDatasetParser",
           "HfDatasetParserIterDataPipe", "iter_hf_rows", "read_hf_dataset"]

#: The field naming a row of the dataset (manifest rows of :func:`read_hf_dataset`).
HF_INDEX = "hf_index"
_SCALARS = (str, int, float, bool)


def _undecoded(dataset: Any, column: str) -> Any:
    """``dataset`` with ``column`` read as ``{"bytes", "path"}`` (no torchcodec needed)."""
    from datasets import Audio

    features = getattr(dataset, "features", None)
    feature = None if features is None else features.get(column)
    if features is not None and not isinstance(feature, Audio):
        raise ValueError(f"column {column!r} must be an Audio feature, got "
                         f"{type(feature).__name__ if feature is not None else 'no column'}; "
                         f"the columns are {list(features)}")
    if feature is not None and not feature.decode:
        return dataset
    return dataset.cast_column(column, Audio(decode=False))


def _map_style(dataset: Any) -> bool:
    """Whether ``dataset`` is a map-style ``datasets.Dataset`` (rows read by index)."""
    import datasets

    return isinstance(dataset, datasets.Dataset)


def _audio_input(value: Any, source: str, key: str) -> Any:
    """What soundfile reads for one ``Audio(decode=False)`` value: its bytes, or its path."""
    if not isinstance(value, Mapping):
        raise DataError(f"audio value must be {{'bytes', 'path'}}, got {type(value).__name__}",
                        source=source, key=key)
    data, path = value.get("bytes"), value.get("path")
    if data:
        return data
    if isinstance(path, str) and path:
        if not os.path.exists(path):
            raise MissingDataError(f"the audio file {path!r} does not exist", source=source,
                                   key=key)
        return path
    raise DataError("audio value has neither bytes nor a path", source=source, key=key)


def _row(row: Mapping[str, Any], index: int, audio_column: str, key_column: str | None,
         source: str, text_column: str | None = None) -> Sample:
    if key_column is None:
        key = str(index)
    else:
        key = row.get(key_column)
        if not isinstance(key, str) or not key:
            raise DataError(f"key column {key_column!r} must hold a non-empty string, got "
                            f"{key!r}", source=source)
    out: Sample = {KEY: key, SOURCE: source}
    for name, value in row.items():
        if name != audio_column and (value is None or isinstance(value, _SCALARS)):
            out.setdefault(name, value)
    if text_column is not None:
        if text_column not in row:
            raise DataError(f"no text column {text_column!r} (columns: {sorted(row)})",
                            source=source, key=key)
        text = row[text_column]
        if not isinstance(text, str):
            raise DataError(f"text column {text_column!r} must hold a str, got {text!r}",
                            source=source, key=key)
        out[TEXT] = text
    return out


def iter_hf_rows(dataset: Any, *, audio_column: str = "audio", key_column: str | None = None,
                 with_audio: bool = True, text_column: str | None = None) -> Iterator[Sample]:
    """The samples of :func:`read_hf_dataset`, one per row."""
    dataset = _undecoded(dataset, audio_column)
    for index, row in enumerate(dataset):
        source = f"row {index}"
        sample = _row(row, index, audio_column, key_column, source, text_column)
        data = _audio_input(row.get(audio_column), source, sample[KEY])
        if with_audio:
            audio, rate = read_audio(data, source=source, key=sample[KEY])
            sample[AUDIO], sample[SAMPLE_RATE] = audio, rate
            sample[DURATION] = audio.shape[0] / rate
            yield sample
            continue
        try:
            info = soundfile.info(io.BytesIO(data) if isinstance(data, bytes) else data)
        except (soundfile.LibsndfileError, RuntimeError) as exc:
            raise DataError(f"unreadable audio: {exc}", source=source, key=sample[KEY]) from exc
        sample[HF_INDEX] = index
        sample[DURATION] = info.frames / info.samplerate
        yield sample


@functional_datapipe("parse_hf_dataset")
class HfDatasetParserIterDataPipe(IterDataPipe[Sample]):
    """Read ``datasets`` audio datasets as samples (functional name: ``parse_hf_dataset``).

    Consumes ``datasets.Dataset`` / ``IterableDataset`` objects and yields the samples of
    their rows, read again each pass; :func:`read_hf_dataset` documents the samples and
    is the usual way in. ``len()`` is the number of rows when the source and datasets have one.

    Args:
        source_datapipe: datasets with an ``Audio`` column.
        audio_column, key_column, with_audio, text_column: as in :func:`read_hf_dataset`.

    >>> import os, tempfile, numpy as np, soundfile, datasets
    >>> from speechpipe import IterableWrapper
    >>> d = tempfile.mkdtemp(); wav = os.path.join(d, "a.wav")
    >>> soundfile.write(wav, np.zeros(400, np.float32), 8000)
    >>> ds = datasets.Dataset.from_dict({"audio": [wav]}).cast_column("audio", datasets.Audio())
    >>> [s["duration"] for s in IterableWrapper([ds, ds], deepcopy=False).parse_hf_dataset()]
    [0.05, 0.05]
    """

    def __init__(self, source_datapipe: IterDataPipe, *, audio_column: str = "audio",
                 key_column: str | None = None, with_audio: bool = True,
                 text_column: str | None = None) -> None:
        if not isinstance(audio_column, str) or not audio_column:
            raise TypeError(f"audio_column must be a non-empty str, got {audio_column!r}")
        for name, value in (("key_column", key_column), ("text_column", text_column)):
            if value is not None and (not isinstance(value, str) or not value):
                raise TypeError(f"{name} must be a non-empty str or None, got {value!r}")
        self.source_datapipe = source_datapipe
        self.audio_column = audio_column
        self.key_column = key_column
        self.with_audio = bool(with_audio)
        self.text_column = text_column

    def __iter__(self) -> Iterator[Sample]:
        for dataset in self.source_datapipe:
            yield from iter_hf_rows(dataset, audio_column=self.audio_column,
                                    key_column=self.key_column, with_audio=self.with_audio,
                                    text_column=self.text_column)

    def __len__(self) -> int:
        try:
            return sum(len(d) for d in self.source_datapipe)
        except TypeError:
            raise TypeError("a streaming dataset has no len()") from None


HfDatasetParser = HfDatasetParserIterDataPipe


def read_hf_dataset(dataset: Any, *, audio_column: str = "audio", key_column: str | None = None,
                    with_audio: bool = True,
                    text_column: str | None = None) -> HfDatasetParserIterDataPipe:
    """Read a Hugging Face ``datasets`` audio dataset as samples (a pipe; nothing read yet).

    Each pass iterates the dataset (a ``Dataset``, e.g. from ``load_from_disk``, or an
    ``IterableDataset`` from ``streaming=True`` or ``to_iterable_dataset()``) in its order,
    one sample per row::

        {key (key_column's value, or the row number), source ("row N"), <the row's scalar
         columns>, duration, audio (float32, time first), sample_rate}

    The ``Audio`` column is read undecoded and decoded with soundfile (torchcodec is not
    used). With ``with_audio=False`` (a ``Dataset`` only) rows carry ``hf_index`` and the
    ``duration`` read from the audio's header instead of the audio: small manifest rows for
    ``shuffle_samples`` and :func:`speechpipe.train_pipeline`, whose audio ``load_hf_audio``
    reads later (``input=lambda p: p.load_hf_audio(dataset)``).

    Args:
        dataset: a ``datasets.Dataset`` or ``datasets.IterableDataset`` with an ``Audio``
            column.
        audio_column: the ``Audio`` column.
        key_column: a string column holding unique utterance ids (``None``: the row number).
        with_audio: decode the audio now (``False``: manifest rows, see above).
        text_column: a string column copied to ``text``, the field the text stages read
            (Common Voice on the Hub calls it ``sentence``); ``None``: rows keep their own
            columns only.

    Raises:
        ValueError: ``audio_column`` is not an ``Audio`` column; ``with_audio=False`` on a
            streaming dataset.
        DataError: (when iterated) a row whose audio or key is unusable, naming the row.

    >>> import os, tempfile, numpy as np, soundfile, datasets
    >>> d = tempfile.mkdtemp(); wav = os.path.join(d, "a.wav")
    >>> soundfile.write(wav, np.zeros(4000, np.float32), 16000)
    >>> ds = datasets.Dataset.from_dict({"audio": [wav], "text": ["hi"]})
    >>> ds = ds.cast_column("audio", datasets.Audio())
    >>> [(s["key"], s["text"], s["audio"].shape, s["duration"]) for s in read_hf_dataset(ds)]
    [('0', 'hi', (4000,), 0.25)]
    """
    if not with_audio and not _map_style(dataset):
        raise ValueError("with_audio=False needs a map-style Dataset (rows read again by "
                         "index); a streaming dataset is read with its audio")
    _undecoded(dataset, audio_column)  # checks the column (reads no data)
    return IterableWrapper([dataset], deepcopy=False).parse_hf_dataset(
        audio_column=audio_column, key_column=key_column, with_audio=with_audio,
        text_column=text_column)


@functional_datapipe("load_hf_audio")
class HfAudioLoaderIterDataPipe(IterDataPipe[Sample]):
    """Read the audio of rows of a ``datasets`` dataset (functional name: ``load_hf_audio``).

    Consumes the manifest rows of ``read_hf_dataset(dataset, with_audio=False)`` (with
    ``hf_index``) and yields them with ``audio`` (``float32``, time first) and ``sample_rate``,
    decoded with soundfile from the row's ``Audio`` value. ``len()`` is the source's.

    Args:
        source_datapipe: rows with ``hf_index``.
        dataset: the ``datasets.Dataset`` the rows come from.
        audio_column: its ``Audio`` column.

    >>> import os, tempfile, numpy as np, soundfile, datasets
    >>> d = tempfile.mkdtemp(); wav = os.path.join(d, "a.wav")
    >>> soundfile.write(wav, np.zeros(800, np.float32), 8000)
    >>> ds = datasets.Dataset.from_dict({"audio": [wav]}).cast_column("audio", datasets.Audio())
    >>> rows = read_hf_dataset(ds, with_audio=False)
    >>> [(s["hf_index"], s["duration"], s["audio"].shape) for s in rows.load_hf_audio(ds)]
    [(0, 0.1, (800,))]
    """

    holds_nothing = True  # item by item: nothing kept between two yields

    def __init__(self, source_datapipe: IterDataPipe, dataset: Any, *,
                 audio_column: str = "audio") -> None:
        if not _map_style(dataset):
            raise TypeError(f"dataset must be a map-style datasets.Dataset, got "
                            f"{type(dataset).__name__}")
        self.source_datapipe = source_datapipe
        self.dataset = dataset
        self.audio_column = audio_column

    def __iter__(self) -> Iterator[Sample]:
        dataset = _undecoded(self.dataset, self.audio_column)
        for sample in self.source_datapipe:
            key, source = sample.get(KEY), sample.get(SOURCE)
            index = sample.get(HF_INDEX)
            if isinstance(index, bool) or not isinstance(index, int) or not (
                    0 <= index < len(dataset)):
                raise DataError(f"{HF_INDEX!r} must be a row of the dataset (0..."
                                f"{len(dataset) - 1}), got {index!r}", source=source, key=key)
            data = _audio_input(dataset[index][self.audio_column], source, key)
            out = dict(sample)
            out[AUDIO], out[SAMPLE_RATE] = read_audio(data, source=source, key=key)
            yield out

    def __len__(self) -> int:
        return len(self.source_datapipe)


HfAudioLoader = HfAudioLoaderIterDataPipe
