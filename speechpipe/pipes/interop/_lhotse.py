"""lhotse interop: lhotse manifests and Shar directories to samples, samples to lhotse manifests.

lhotse (a test dependency, imported where used: ``pip install lhotse``) describes a corpus as
``RecordingSet`` / ``SupervisionSet`` / ``FeatureSet`` / ``CutSet`` JSON-lines manifests
(``.jsonl`` or ``.jsonl.gz``), or as a Shar directory (``cuts.NNNNNN.jsonl.gz`` beside
``recording.NNNNNN.tar``, ``features.NNNNNN.tar``...). This module reads both with lhotse's own
lazy readers, one item at a time, and writes speechpipe manifests back as lhotse manifests:

- :func:`read_lhotse`: manifest rows (no audio read), one per cut -- or, for a
  ``RecordingSet`` joined with a ``SupervisionSet``, one per supervision -- with the fields of
  a speechpipe manifest (``key``, ``audio_path``, ``offset``, ``duration``, ``channel``,
  ``text``, ``speaker``...) and the cut itself (``lhotse_cut``, a dict) for ``load_lhotse``;
- ``load_lhotse`` (:class:`LhotseLoaderIterDataPipe`): the cut's audio or features, read by
  lhotse (any audio source, channel selection, offsets, lilcom / numpy feature storage);
- :func:`read_lhotse_shar`: a Shar directory to decoded samples (``audio`` and/or ``feats``);
- :func:`write_lhotse`: samples (``audio_path``, ``offset``, ``duration``, ``text``...) to a
  ``CutSet`` or a ``RecordingSet`` + ``SupervisionSet``, streamed.
"""

from __future__ import annotations

import os
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np

from ...errors import DataError, MissingDataError
from ...sample import AUDIO, DURATION, FEATS, KEY, SAMPLE_RATE, SOURCE, TEXT, Sample
from .._core import functional_datapipe, IterableWrapper, IterDataPipe

__all__ = ["LHOTSE_CUT", "LhotseLoader", "LhotseLoaderIterDataPipe", "LhotseParser",
           "LhotseParserIterDataPipe", "LhotseSharParser", "LhotseSharParserIterDataPipe",
           "cut_row", "iter_lhotse", "iter_shar", "load_cut", "read_lhotse", "read_lhotse_shar",
           "write_lhotse"]

#: The field holding a row's lhotse cut (``cut.to_dict()``), read by ``load_lhotse``.
LHOTSE_CUT = "lhotse_cut"
#: Supervision attributes copied to a sample's fields of the same name.
_SUPERVISION_FIELDS = (TEXT, "speaker", "language", "gender")
#: Sample fields :func:`write_lhotse` maps to lhotse attributes (the others go to ``custom``).
_MAPPED = {KEY, "audio_path", "offset", DURATION, "channel", SOURCE, SAMPLE_RATE, LHOTSE_CUT,
           *_SUPERVISION_FIELDS}
_INSTALL = 'this needs lhotse: pip install "lhotse>=1.30"'


def _lhotse() -> Any:
    try:
        import lhotse
    except ImportError as exc:  # pragma: no cover - lhotse is installed where tests run
        raise ImportError(_INSTALL) from exc
    return lhotse


# --------------------------------------------------------------------------- cuts -> rows


def cut_row(cut: Any, source: str, *, keep_cut: bool = True) -> Sample:
    """A lhotse cut as a speechpipe manifest row (no audio or features read).

    ``offset`` is the cut's start in its recording (left out for a whole recording, as in
    speechpipe's own manifests) and ``channel`` its channel(s) (left out for a mono one).
    ``audio_path`` is set when the audio is one local file. Supervision ``text`` s are joined
    in time order; ``speaker``, ``language``, ``gender`` are set when the supervisions agree;
    their ``custom`` fields are copied too.
    """
    row: Sample = {KEY: cut.id, SOURCE: source, DURATION: float(cut.duration)}
    recording = getattr(cut, "recording", None)
    if recording is not None:
        sources = recording.sources
        if len(sources) == 1 and sources[0].type == "file" and not recording.transforms:
            row["audio_path"] = sources[0].source  # what load_audio can read as it is
        whole = cut.start == 0 and abs(cut.duration - recording.duration) < 1e-6
        if not whole:
            row["offset"] = float(cut.start)
        if len(recording.channel_ids) > 1:
            channel = cut.channel
            row["channel"] = list(channel) if isinstance(channel, (list, tuple)) else channel
    elif cut.start:
        row["offset"] = float(cut.start)
    supervisions = sorted(cut.supervisions, key=lambda s: s.start)
    texts = [s.text for s in supervisions if s.text]
    if texts:
        row[TEXT] = " ".join(texts)
    for name in _SUPERVISION_FIELDS[1:]:
        values = {getattr(s, name) for s in supervisions}
        if len(values) == 1 and None not in values:
            row[name] = values.pop()
    for s in supervisions:
        for name, value in (s.custom or {}).items():
            row.setdefault(name, value)
    if keep_cut:
        row[LHOTSE_CUT] = cut.to_dict()
    return row


def _typed(path: str) -> Any:
    """The lazy lhotse manifest at ``path`` (its type read from its first item)."""
    lhotse = _lhotse()
    if not os.path.exists(path):
        raise MissingDataError("no such lhotse manifest", source=path)
    try:
        manifest = lhotse.load_manifest_lazy(path)
    except Exception as exc:  # lhotse raises ValueError/JSONDecodeError/KeyError
        raise DataError(f"not a lhotse manifest: {exc}", source=path) from exc
    if manifest is None:
        raise DataError("not a lhotse manifest (empty, or of no known type)", source=path)
    return manifest


def _items(manifest: Any, path: str) -> Iterator[tuple[str, Any]]:
    """``(source, item)`` of a lazy manifest, lhotse's errors named by file and item."""
    it = iter(manifest)
    n = 0
    while True:
        n += 1
        try:
            item = next(it)
        except StopIteration:
            return
        except Exception as exc:  # a bad line: JSON, a missing field...
            raise DataError(f"bad lhotse item: {type(exc).__name__}: {exc}", source=path,
                            line=n) from exc
        yield f"{path}:{n}", item


def iter_lhotse(paths: Sequence[str], supervisions: Sequence[str] = (), *,
                keep_cut: bool = True) -> Iterator[Sample]:
    """The rows of lhotse manifests (see :func:`read_lhotse`), streamed."""
    if supervisions:
        yield from _joined(paths, supervisions, keep_cut)
        return
    for path in paths:
        manifest = _typed(path)
        kind = type(manifest).__name__
        if kind not in ("CutSet", "RecordingSet", "FeatureSet"):
            raise DataError(f"expected a CutSet, RecordingSet or FeatureSet manifest, got a "
                            f"{kind}", source=path)
        for source, item in _items(manifest, path):
            yield cut_row(_whole(item, kind), source, keep_cut=keep_cut)


def _whole(item: Any, kind: str) -> Any:
    """A cut over all of a manifest item: the cut, a recording, a feature matrix."""
    if kind == "CutSet":
        return item
    if kind == "RecordingSet":
        return item.to_cut()
    name = item.recording_id or os.path.splitext(os.path.basename(item.storage_key))[0]
    return _lhotse().MonoCut(id=f"{name}-{item.channels}", start=item.start,
                             duration=item.duration, channel=item.channels, features=item)


def _joined(paths: Sequence[str], supervisions: Sequence[str], keep_cut: bool
            ) -> Iterator[Sample]:
    """One row per supervision, in the supervision manifests' order, over the recordings or
    feature matrices of ``paths`` (held by id: a corpus has far fewer recordings than
    supervisions; the supervisions stream)."""
    held: dict[str, list[tuple[str, Any]]] = {}
    for path in paths:
        manifest = _typed(path)
        kind = type(manifest).__name__
        if kind not in ("RecordingSet", "FeatureSet"):
            raise DataError(f"a {kind} cannot be joined with supervisions (expected a "
                            "RecordingSet or FeatureSet; a CutSet holds its own)", source=path)
        for source, item in _items(manifest, path):
            rec_id = item.id if kind == "RecordingSet" else item.recording_id
            if rec_id is None:
                raise DataError("a features item without a recording_id cannot be joined "
                                "with supervisions", source=source)
            held.setdefault(rec_id, []).append((kind, item))
    for path in supervisions:
        manifest = _typed(path)
        if type(manifest).__name__ != "SupervisionSet":
            raise DataError(f"expected a SupervisionSet manifest, got a "
                            f"{type(manifest).__name__}", source=path)
        for source, sup in _items(manifest, path):
            found = [(kind, item) for kind, item in held.get(sup.recording_id, ())
                     if kind == "RecordingSet" or item.channels == sup.channel]
            if not found:
                raise DataError(f"supervision {sup.id!r} names recording "
                                f"{sup.recording_id!r} (channel {sup.channel}), which is not "
                                f"in {', '.join(paths)}", source=source)
            yield cut_row(_segment(*found[0], sup), source, keep_cut=keep_cut)


def _segment(kind: str, item: Any, sup: Any) -> Any:
    """The cut of one supervision over its recording (its channel(s)) or feature matrix."""
    lhotse = _lhotse()
    channel = sup.channel
    if isinstance(channel, (list, tuple)) and len(channel) == 1:
        channel = channel[0]
    cls = lhotse.MultiCut if isinstance(channel, (list, tuple)) else lhotse.MonoCut
    source = {"recording": item} if kind == "RecordingSet" else {"features": item}
    return cls(id=sup.id, start=sup.start, duration=sup.duration, channel=channel,
               supervisions=[sup.with_offset(-sup.start)], **source)


@functional_datapipe("parse_lhotse")
class LhotseParserIterDataPipe(IterDataPipe[Sample]):
    """Read lhotse manifests into manifest rows (functional name: ``parse_lhotse``).

    Consumes paths of lhotse ``CutSet``, ``RecordingSet`` or ``FeatureSet`` manifests and
    yields their rows, re-read each pass; :func:`read_lhotse` documents the rows and is the
    usual way in.

    Args:
        source_datapipe: manifest paths.
        supervisions: ``SupervisionSet`` manifests joined with the recordings or features.
        keep_cut: add ``lhotse_cut`` (needed by ``load_lhotse``).

    >>> import os, tempfile, numpy as np, soundfile, lhotse
    >>> from speechpipe import IterableWrapper
    >>> d = tempfile.mkdtemp(); wav = os.path.join(d, "r1.wav")
    >>> soundfile.write(wav, np.zeros(8000, np.float32), 16000)
    >>> lhotse.RecordingSet.from_recordings([lhotse.Recording.from_file(wav)]).to_file(
    ...     f"{d}/rec.jsonl")
    >>> [(r["key"], r["duration"]) for r in IterableWrapper([f"{d}/rec.jsonl"]).parse_lhotse()]
    [('r1', 0.5)]
    """

    def __init__(self, source_datapipe: IterDataPipe[str], *, supervisions: Any = None,
                 keep_cut: bool = True) -> None:
        if not isinstance(keep_cut, bool):
            raise TypeError(f"keep_cut must be a bool, got {keep_cut!r}")
        self.source_datapipe = source_datapipe
        self.supervisions = _paths(supervisions, "supervisions")
        self.keep_cut = keep_cut

    def __iter__(self) -> Iterator[Sample]:
        paths = [os.fspath(p) for p in self.source_datapipe]
        yield from iter_lhotse(paths, self.supervisions, keep_cut=self.keep_cut)

    def __len__(self) -> int:
        raise TypeError("parse_lhotse streams its manifests: the count is known after a pass")


LhotseParser = LhotseParserIterDataPipe


def _paths(value: Any, name: str) -> list[str]:
    if value is None:
        return []
    items = [value] if isinstance(value, (str, os.PathLike)) else list(value)
    if not all(isinstance(p, (str, os.PathLike)) for p in items):
        raise TypeError(f"{name} must be a path or a list of paths, got {value!r}")
    return [os.fspath(p) for p in items]


def read_lhotse(manifests: Any, *, supervisions: Any = None,
                keep_cut: bool = True) -> LhotseParserIterDataPipe:
    """Read lhotse manifests as speechpipe manifest rows (a pipe; nothing is read yet).

    Each pass streams the manifests with lhotse's lazy reader: a ``CutSet`` gives one row per
    cut; a ``RecordingSet`` or ``FeatureSet`` one per recording / feature matrix or, joined
    with ``supervisions``, one per supervision, in their order (its segment: ``offset``,
    ``duration``, ``channel``). For the join the recordings are held by id (a corpus has far
    fewer of them than supervisions) while the supervisions stream; cuts are never held.
    Rows::

        {key, source ("manifest:item"), duration, audio_path (one local file), offset (a
         segment), channel (a segment, or a multi-channel recording), text, speaker,
         language, gender, <supervision custom fields>, lhotse_cut (the cut as a dict)}

    Load the audio with ``load_lhotse()`` (any lhotse source, the right channel) or, for
    mono local files, speechpipe's own ``load_audio(offset_field="offset", ...)``; features
    stored by lhotse with ``load_lhotse("feats")``. The rows fit
    :func:`speechpipe.train_pipeline` (``input=lambda p: p.load_lhotse()``).

    Args:
        manifests: path(s) of ``CutSet``, ``RecordingSet`` or ``FeatureSet`` manifests
            (``.jsonl``, ``.jsonl.gz``).
        supervisions: path(s) of ``SupervisionSet`` manifests to join (not with cuts).
        keep_cut: keep the cut in ``lhotse_cut`` (``False``: only the plain fields).

    Raises (when iterated):
        MissingDataError: a manifest that does not exist.
        DataError: a file that is no lhotse manifest, or a bad item (naming file and item).

    >>> import os, tempfile, numpy as np, soundfile, lhotse
    >>> d = tempfile.mkdtemp(); wav = os.path.join(d, "r1.wav")
    >>> soundfile.write(wav, np.zeros(8000, np.float32), 16000)
    >>> rec = lhotse.Recording.from_file(wav)
    >>> sup = lhotse.SupervisionSegment("s1", "r1", start=0.1, duration=0.2, text="hi")
    >>> lhotse.RecordingSet.from_recordings([rec]).to_file(f"{d}/rec.jsonl.gz")
    >>> lhotse.SupervisionSet.from_segments([sup]).to_file(f"{d}/sup.jsonl.gz")
    >>> [row] = read_lhotse(f"{d}/rec.jsonl.gz", supervisions=f"{d}/sup.jsonl.gz")
    >>> row["key"], row["offset"], row["duration"], row["text"]
    ('s1', 0.1, 0.2, 'hi')
    """
    paths = _paths(manifests, "manifests")
    if not paths:
        raise ValueError("no lhotse manifests given")
    return IterableWrapper(paths).parse_lhotse(supervisions=supervisions, keep_cut=keep_cut)


# --------------------------------------------------------------------------- loading


def _time_first(audio: np.ndarray) -> np.ndarray:
    """lhotse's ``(channels, samples)`` as speechpipe's ``(samples,)`` or ``(samples, ch)``."""
    audio = np.asarray(audio, dtype=np.float32)
    return audio[0] if audio.shape[0] == 1 else np.ascontiguousarray(audio.T)


def load_cut(sample: Mapping[str, Any], what: str, field: str = LHOTSE_CUT) -> Sample:
    """``sample`` with the audio (and ``sample_rate``) or the features of its lhotse cut."""
    key, source = sample.get(KEY), sample.get(SOURCE)
    value = sample.get(field)
    if not isinstance(value, Mapping):
        raise DataError(f"sample has no lhotse cut in {field!r} (rows of read_lhotse with "
                        "keep_cut=True)", source=source, key=key)
    from lhotse.serialization import deserialize_item

    try:
        cut = deserialize_item(dict(value))
    except Exception as exc:
        raise DataError(f"not a lhotse cut: {type(exc).__name__}: {exc}", source=source,
                        key=key) from exc
    recording = getattr(cut, "recording", None) if what == "audio" else None
    for audio_source in getattr(recording, "sources", ()):
        if audio_source.type == "file" and not os.path.exists(audio_source.source):
            raise MissingDataError("no such audio file (named by the lhotse cut)",
                                   source=audio_source.source, key=key)
    try:
        if what == "audio":
            array = _time_first(cut.load_audio())
        else:
            array = np.asarray(cut.load_features(), dtype=np.float32)
    except FileNotFoundError as exc:  # e.g. a features file
        raise MissingDataError(f"lhotse cannot find the {what}: {exc}", source=source,
                               key=key) from exc
    except Exception as exc:  # lhotse's own errors: a bad source, no features...
        raise DataError(f"lhotse cannot load the {what}: {type(exc).__name__}: {exc}",
                        source=source, key=key) from exc
    out = {k: v for k, v in sample.items() if k not in (field, "channel")}
    if what == "audio":
        out[AUDIO] = array
        out[SAMPLE_RATE] = int(cut.sampling_rate)
    else:
        out[FEATS] = array
    return out


@functional_datapipe("load_lhotse")
class LhotseLoaderIterDataPipe(IterDataPipe[Sample]):
    """Read the audio or features of each row's lhotse cut (functional name: ``load_lhotse``).

    Consumes rows of :func:`read_lhotse` (with ``lhotse_cut``) and yields them with ``audio``
    (``float32``, ``(samples,)`` for one channel, ``(samples, channels)`` for several) and
    ``sample_rate`` -- or ``feats`` (``(frames, dim)`` ``float32``) -- read by lhotse: the
    cut's segment and channel of any audio source lhotse knows, features in any lhotse storage
    (numpy files, lilcom chunky files...). ``lhotse_cut`` and ``channel`` (where the data
    came from, present in some rows only: a corpus may mix mono and multi-channel recordings)
    are dropped from the output, so that the rows of one corpus collate together.

    Args:
        source_datapipe: rows with ``lhotse_cut``.
        what: ``"audio"`` or ``"feats"``.

    ``len()`` is the source's.

    >>> import os, tempfile, numpy as np, soundfile, lhotse
    >>> d = tempfile.mkdtemp(); wav = os.path.join(d, "r1.wav")
    >>> soundfile.write(wav, np.zeros((16000, 2), np.float32), 16000)
    >>> rec = lhotse.Recording.from_file(wav)
    >>> sup = lhotse.SupervisionSegment("s1", "r1", start=0.5, duration=0.25, channel=1)
    >>> lhotse.RecordingSet.from_recordings([rec]).to_file(f"{d}/rec.jsonl")
    >>> lhotse.SupervisionSet.from_segments([sup]).to_file(f"{d}/sup.jsonl")
    >>> [s] = read_lhotse(f"{d}/rec.jsonl", supervisions=f"{d}/sup.jsonl").load_lhotse()
    >>> s["audio"].shape, s["sample_rate"], s["offset"]
    ((4000,), 16000, 0.5)
    """

    holds_nothing = True  # item by item: nothing kept between two yields

    def __init__(self, source_datapipe: IterDataPipe, what: str = "audio") -> None:
        if what not in ("audio", "feats"):
            raise ValueError(f"what must be 'audio' or 'feats', got {what!r}")
        self.source_datapipe = source_datapipe
        self.what = what

    def __iter__(self) -> Iterator[Sample]:
        for sample in self.source_datapipe:
            if not isinstance(sample, Mapping):
                raise TypeError(f"load_lhotse expects sample dicts, got "
                                f"{type(sample).__name__}")
            yield load_cut(sample, self.what)

    def __len__(self) -> int:
        return len(self.source_datapipe)


LhotseLoader = LhotseLoaderIterDataPipe


# --------------------------------------------------------------------------- Shar


def _shar_shards(in_dir: str) -> list[dict[str, str]]:
    """``{"cuts": path, field: path...}`` per shard of a Shar directory, in shard order."""
    names = sorted(os.listdir(in_dir))
    shards: dict[str, dict[str, str]] = {}
    for name in names:
        parts = name.split(".")
        if len(parts) >= 3 and parts[1].isdigit():
            shards.setdefault(parts[1], {})[parts[0]] = os.path.join(in_dir, name)
    if not shards or any("cuts" not in fields for fields in shards.values()):
        raise DataError("not a Shar directory: expected cuts.NNNNNN.jsonl.gz beside each "
                        "field's shard", source=in_dir)
    return [shards[index] for index in sorted(shards)]


def _shar_field(path: str) -> Iterator[tuple[Any, str]]:
    """``(manifest with its data, or None, member name)`` per cut of one field shard."""
    import tarfile

    from lhotse.serialization import decode_json_line, deserialize_item
    from lhotse.shar.readers.tar import iterate_tarfile_pairwise
    from lhotse.shar.utils import fill_shar_placeholder

    if not path.endswith(".tar"):
        raise DataError("only tar field shards are read (not jsonl fields)", source=path)
    # lhotse's own TarIterator leaves the file open: the tar is opened and closed here
    with open(path, "rb") as f, tarfile.open(fileobj=f, mode="r|*") as tar:
        for (data, data_path), (meta, _) in iterate_tarfile_pairwise(tar):
            if meta is not None:
                meta = deserialize_item(decode_json_line(meta.decode("utf-8")))
                fill_shar_placeholder(manifest=meta, data=data, tarpath=data_path)
            yield meta, str(data_path)


def _shar_cuts(shard: dict[str, str]) -> Iterator[tuple[str, Any]]:
    """``(source, cut)`` of one shard, each cut joined with its fields."""
    from lhotse.serialization import deserialize_item

    cuts_path = shard["cuts"]
    fields = {name: _shar_field(path) for name, path in shard.items() if name != "cuts"}
    try:
        for source, item in _items(_gzip_json_lines(cuts_path), cuts_path):
            cut = deserialize_item(item)
            for name, values in fields.items():
                try:
                    manifest, member = next(values)
                except StopIteration:
                    raise DataError(f"field shard {name!r} ends before cut {cut.id!r}",
                                    source=shard[name]) from None
                if manifest is None:
                    continue
                if os.path.splitext(member)[0] != cut.id:
                    raise DataError(f"field {name!r} holds {member!r} where cut {cut.id!r} "
                                    "was expected (shards out of step)", source=shard[name])
                setattr(cut, name, manifest)
            yield source, cut
    finally:
        for values in fields.values():
            values.close()


def _gzip_json_lines(path: str) -> Iterator[dict]:
    import gzip
    import json

    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def iter_shar(in_dir: str) -> Iterator[Sample]:
    """The decoded samples of a Shar directory (see :func:`read_lhotse_shar`)."""
    _lhotse()
    if not os.path.isdir(in_dir):
        raise MissingDataError("no such Shar directory", source=in_dir)
    for shard in _shar_shards(in_dir):
        for source, cut in _shar_cuts(shard):
            row = cut_row(cut, source, keep_cut=False)
            row.pop("audio_path", None)  # the audio is in the shard, not at a path
            try:
                if cut.has_recording:
                    row[AUDIO] = _time_first(cut.load_audio())
                    row[SAMPLE_RATE] = int(cut.sampling_rate)
                if cut.has_features:
                    row[FEATS] = np.asarray(cut.load_features(), dtype=np.float32)
            except Exception as exc:
                raise DataError(f"lhotse cannot decode the cut: {type(exc).__name__}: {exc}",
                                source=source, key=cut.id) from exc
            yield row


@functional_datapipe("parse_lhotse_shar")
class LhotseSharParserIterDataPipe(IterDataPipe[Sample]):
    """Read Lhotse Shar directories as decoded samples (functional name: ``parse_lhotse_shar``).

    Consumes Shar directory paths (``CutSet.to_shar``'s output) and yields, shard after shard,
    each cut of ``cuts.NNNNNN.jsonl.gz`` joined with its fields from the tar shards beside it
    (``recording.NNNNNN.tar``, ``features.NNNNNN.tar``...): the row of :func:`read_lhotse`
    (without ``audio_path``) with ``audio`` (``float32``, time first) and ``sample_rate`` when
    the Shar has recordings, ``feats`` (``(frames, dim)``) when it has features. The order is
    the Shar's; it is not a resumable source (``shuffle_samples`` would hold decoded audio:
    for training with exact resume, read the manifests with :func:`read_lhotse`).

    Args:
        source_datapipe: Shar directories.

    Raises (when iterated):
        MissingDataError: no such directory.
        DataError: no ``cuts.NNNNNN.jsonl.gz`` shards, a field shard out of step with the
            cuts (naming the tar), a cut that cannot be decoded (naming it).

    >>> import os, tempfile, numpy as np, soundfile, lhotse
    >>> d = tempfile.mkdtemp(); wav = os.path.join(d, "r1.wav")
    >>> soundfile.write(wav, np.zeros(8000, np.float32), 16000)
    >>> recordings = lhotse.RecordingSet.from_recordings([lhotse.Recording.from_file(wav)])
    >>> cuts = lhotse.CutSet.from_manifests(recordings=recordings)
    >>> os.makedirs(f"{d}/shar"); _ = cuts.to_shar(f"{d}/shar", fields={"recording": "flac"})
    >>> [(s["key"], s["audio"].shape) for s in read_lhotse_shar(f"{d}/shar")]
    [('r1-0', (8000,))]
    """

    def __init__(self, source_datapipe: IterDataPipe[str]) -> None:
        self.source_datapipe = source_datapipe

    def __iter__(self) -> Iterator[Sample]:
        for in_dir in self.source_datapipe:
            yield from iter_shar(os.fspath(in_dir))

    def __len__(self) -> int:
        raise TypeError("parse_lhotse_shar streams its shards: the count is known after a pass")


LhotseSharParser = LhotseSharParserIterDataPipe


def read_lhotse_shar(in_dir: str | os.PathLike) -> LhotseSharParserIterDataPipe:
    """Read one Lhotse Shar directory as decoded samples (a pipe; nothing is read yet): see
    :class:`LhotseSharParserIterDataPipe`."""
    if not isinstance(in_dir, (str, os.PathLike)):
        raise TypeError(f"in_dir must be a path, got {in_dir!r}")
    return IterableWrapper([os.fspath(in_dir)]).parse_lhotse_shar()


# --------------------------------------------------------------------------- writing


class _LhotseWriter:
    """Samples to lhotse items: one ``Recording`` per audio file (read by lhotse's
    ``Recording.from_file``, id the file's stem), one supervision per sample."""

    def __init__(self) -> None:
        self.lhotse = _lhotse()
        self.recordings: dict[str, Any] = {}  # audio_path -> Recording
        self.ids: dict[str, str] = {}  # recording id -> audio_path

    def recording(self, sample: Mapping[str, Any]) -> tuple[Any, bool]:
        path = sample.get("audio_path")
        if not isinstance(path, str) or not path:
            raise DataError("write_lhotse needs an 'audio_path' in every sample",
                            source=sample.get(SOURCE), key=sample.get(KEY))
        if path in self.recordings:
            return self.recordings[path], False
        rec_id = os.path.splitext(os.path.basename(path))[0]
        if rec_id in self.ids:
            raise DataError(f"two audio files give the recording id {rec_id!r}: "
                            f"{self.ids[rec_id]} and {path}", key=sample.get(KEY))
        try:
            rec = self.lhotse.Recording.from_file(path, recording_id=rec_id)
        except FileNotFoundError as exc:
            raise MissingDataError("no such audio file", source=path,
                                   key=sample.get(KEY)) from exc
        self.recordings[path], self.ids[rec_id] = rec, path
        return rec, True

    def supervision(self, sample: Mapping[str, Any], rec: Any) -> Any:
        offset = float(sample.get("offset", 0.0))
        duration = float(sample.get(DURATION, rec.duration - offset))
        custom = {k: v for k, v in sample.items() if k not in _MAPPED}
        return self.lhotse.SupervisionSegment(
            id=sample[KEY], recording_id=rec.id, start=offset, duration=duration,
            channel=sample.get("channel", 0), custom=custom or None,
            **{name: sample.get(name) for name in _SUPERVISION_FIELDS})

    def cut(self, sample: Mapping[str, Any], rec: Any, sup: Any) -> Any:
        channel = sample.get("channel", 0 if len(rec.channel_ids) == 1 else rec.channel_ids)
        cls = self.lhotse.MultiCut if isinstance(channel, list) else self.lhotse.MonoCut
        return cls(id=sample[KEY], start=sup.start, duration=sup.duration, channel=channel,
                   recording=rec, supervisions=[sup.with_offset(-sup.start)])


def write_lhotse(samples: Iterable[Mapping[str, Any]], *, cuts: Any = None,
                 recordings: Any = None, supervisions: Any = None) -> int:
    """Write speechpipe manifest rows as lhotse manifests; return the number of samples.

    Give ``cuts`` (a ``CutSet``: one cut per sample, its supervision inside) or
    ``recordings`` and ``supervisions`` (one ``Recording`` per audio file, read by lhotse's
    ``Recording.from_file``; one ``SupervisionSegment`` per sample). Paths ending in ``.gz``
    are gzipped. Samples need ``key`` and ``audio_path``; ``offset`` and ``duration`` (seconds)
    make a segment (default: the whole file), ``channel`` picks channels; ``text``,
    ``speaker``, ``language``, ``gender`` go to the supervision and every other JSON field
    to its ``custom``, so :func:`read_lhotse` gives the rows back. Streamed: only one
    ``Recording`` per distinct file is held.

    >>> import os, tempfile, numpy as np, soundfile
    >>> d = tempfile.mkdtemp(); wav = os.path.join(d, "a.wav")
    >>> soundfile.write(wav, np.zeros(16000, np.float32), 16000)
    >>> rows = [{"key": "a", "audio_path": wav, "duration": 1.0, "text": "hi", "lang": "en"}]
    >>> write_lhotse(rows, cuts=f"{d}/cuts.jsonl.gz")
    1
    >>> [{k: v for k, v in r.items() if k != "source"}
    ...  for r in read_lhotse(f"{d}/cuts.jsonl.gz", keep_cut=False)] == rows
    True
    """
    if (cuts is None) == (recordings is None and supervisions is None):
        raise ValueError("give cuts=, or recordings= and supervisions=")
    if cuts is None and (recordings is None or supervisions is None):
        raise ValueError("give both recordings= and supervisions=")
    from lhotse.serialization import SequentialJsonlWriter

    writer = _LhotseWriter()
    count = 0
    if cuts is not None:
        with SequentialJsonlWriter(os.fspath(cuts)) as out:
            for count, sample in enumerate(samples, 1):
                rec, _ = writer.recording(sample)
                out.write(writer.cut(sample, rec, writer.supervision(sample, rec)))
        return count
    with SequentialJsonlWriter(os.fspath(recordings)) as rec_out, \
            SequentialJsonlWriter(os.fspath(supervisions)) as sup_out:
        for count, sample in enumerate(samples, 1):
            rec, new = writer.recording(sample)
            if new:
                rec_out.write(rec)
            sup_out.write(writer.supervision(sample, rec))
    return count
