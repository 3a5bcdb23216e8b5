"""Per-utterance tables for planning batches: lengths (``data_len`` files) and key selection.

A :class:`~speechpipe.pipes.batching._views.BatchView` plans batches from lengths alone. This module
gets those lengths: :func:`read_data_len` reads Kaldi/SpeeChain ``data_len`` files such as
``utt2num_frames``, ``utt2num_samples`` or ``utt2dur``; :func:`compute_lengths` measures every
sample once, by loading it, and caches the lengths in such a file. :func:`select_keys`
(SpeeChain's ``data_selection``) keeps a part of a corpus, by position, at random or by a
per-utterance number (an ``idx2data`` file). The view's ``group_info`` labels (``idx2data``
files too) and its ``lengths`` are read and checked here as well.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Mapping
from typing import Any, Callable, Hashable, Iterable, Union

from ...errors import check_int, DataError, MissingDataError
from ...index import ShardIndex, length_seconds
from ...remote import RemoteOptions, is_remote
from ...sample import DURATION, KEY, SOURCE, Sample, sample_length
from ...seeding import derive_rng
from .._core import functional_datapipe, IterDataPipe
from ..kaldi import read_scp_table

__all__ = [
    "IndexDurationReaderIterDataPipe",
    "SELECTION_MODES",
    "compute_lengths",
    "read_data_len",
    "select_keys",
]

Key = Hashable
Length = Union[int, float, tuple]
PathLike = Union[str, "os.PathLike[str]"]

#: ``select_keys`` modes: by position in the corpus, at random, or by a metadata value.
SELECTION_MODES = ("order", "rev_order", "random", "min", "max", "middle")

# --------------------------------------------------------------------------- lengths


def _as_paths(paths: PathLike | Iterable[PathLike], name: str) -> list[str]:
    if isinstance(paths, (str, os.PathLike)):
        return [os.fspath(paths)]
    try:
        out = [os.fspath(p) for p in paths]
    except TypeError as exc:
        raise TypeError(f"{name} must be a path or a list of paths, got {paths!r}") from exc
    if not out:
        raise ValueError(f"{name} must name at least one file, got {paths!r}")
    return out


def _read_tables(paths: list[str]) -> dict[str, Any]:
    """``{key: ScpEntry}`` merged over non-overlapping Kaldi tables (file order kept)."""
    merged: dict[str, Any] = {}
    for path in paths:
        for key, entry in read_scp_table(path).items():
            first = merged.get(key)
            if first is not None:
                raise DataError(
                    f"key is also in {first.source}:{first.line}; these files must not overlap",
                    source=path,
                    line=entry.line,
                    key=key,
                )
            merged[key] = entry
    return merged


def _parse_length(entry: Any) -> int | float:
    text = entry.value
    value: int | float = math.nan
    if "_" not in text:  # Python's int() and float() accept "1_000"; a data_len file does not
        try:
            value = int(text)
        except ValueError:
            try:
                value = float(text)
            except ValueError:
                pass
    if not (math.isfinite(value) and value >= 0):
        raise DataError(
            f"expected '<key> <length>' with one finite number >= 0 as length, got {text!r}",
            source=entry.source,
            line=entry.line,
            key=entry.key,
        )
    return value


def read_data_len(paths: PathLike | Iterable[PathLike]) -> dict[str, int | float]:
    """Read SpeeChain/Kaldi ``data_len`` files (``<key> <length>`` lines) into one dict.

    Serves ``utt2num_frames`` (ints), ``utt2num_samples`` and ``utt2dur`` (seconds, floats).
    Several files are merged in the order given and must not overlap. Lines are parsed by
    :func:`speechpipe.pipes.kaldi._tables.read_scp_table`.

    Args:
        paths: one file or a list of files.

    Returns:
        ``{key: length}`` in file order; a length is an ``int`` if written as one, else a
        ``float``.

    Raises:
        MissingDataError: a file does not exist.
        DataError: a malformed line or a length that is not a finite number >= 0
            (``file:line (key 'k')``), a key twice in one file, or a key in two files (the
            message names both files and lines and the key).

    >>> import os, tempfile
    >>> tmp = tempfile.TemporaryDirectory()
    >>> a, b = os.path.join(tmp.name, "a"), os.path.join(tmp.name, "b")
    >>> for path, text in [(a, "u1 120\\nu2 98\\n"), (b, "u3 2.5\\n")]:
    ...     with open(path, "w") as f:
    ...         _ = f.write(text)
    >>> read_data_len([a, b])
    {'u1': 120, 'u2': 98, 'u3': 2.5}
    >>> tmp.cleanup()
    """
    entries = _read_tables(_as_paths(paths, "paths"))
    return {key: _parse_length(entry) for key, entry in entries.items()}


def _check_cache_key(key: Any) -> str:
    if not isinstance(key, str) or not key or any(c.isspace() for c in key):
        raise ValueError(
            f"keys written to a data_len cache must be non-empty strings without whitespace, "
            f"got {key!r}"
        )
    return key


def compute_lengths(
    source: Any,
    keys: Iterable[Key] | None = None,
    *,
    cache: PathLike | None = None,
    length: str | Callable[[Any], Length] | None = None,
) -> dict[Key, Length]:
    """Measure every sample once, by loading it, and optionally cache the lengths to a file.

    Use it when no ``data_len`` file exists: the first run loads ``source[key]`` for each key
    and writes ``cache`` (a ``data_len`` file, ``<key> <length>`` per line, written to a
    temporary name and renamed); later runs read the cache instead, loading nothing, if it
    covers all ``keys``. If it covers only some, only the missing keys are loaded and the
    cache is rewritten with all of them. Delete the cache when the data changes.

    Args:
        source: a ``MapDataPipe`` or any mapping ``key -> sample``.
        keys: keys to measure; by default ``source.keys()`` (a ``MapDataPipe`` has none: give
            them).
        cache: the ``data_len`` file to reuse or write (keys must then be strings without
            whitespace).
        length: field name to measure, or a callable ``sample -> length``; by default
            :func:`speechpipe.sample.sample_length` (frames of ``feats``, else samples of
            ``audio``).

    Returns:
        ``{key: length}`` for ``keys``, in their order.

    Raises:
        DataError: a sample cannot be measured or is missing from ``source`` (naming the
            key), or the cache is malformed (naming ``file:line``).

    >>> import numpy as np, os, tempfile
    >>> tmp = tempfile.TemporaryDirectory()
    >>> cache = os.path.join(tmp.name, "utt2num_samples")
    >>> data = {"u1": {"audio": np.zeros(160)}, "u2": {"audio": np.zeros(80)}}
    >>> compute_lengths(data, cache=cache)
    {'u1': 160, 'u2': 80}
    >>> with open(cache) as f:
    ...     print(f.read(), end="")
    u1 160
    u2 80
    >>> compute_lengths({}, ["u2"], cache=cache)  # from the cache: nothing loaded
    {'u2': 80}
    >>> tmp.cleanup()
    """
    if keys is None:
        if not callable(getattr(source, "keys", None)):
            raise TypeError(
                f"compute_lengths needs keys= for a source without .keys(), got {source!r}"
            )
        keys = source.keys()
    wanted = list(keys)
    if length is not None and not (isinstance(length, str) or callable(length)):
        raise TypeError(f"length must be a field name, a callable or None, got {length!r}")
    cached: dict[Key, Length] = {}
    if cache is not None:
        cache = os.fspath(cache)
        for key in wanted:
            _check_cache_key(key)
        if os.path.exists(cache):
            cached = dict(read_data_len(cache))
    missing = [key for key in wanted if key not in cached]
    for key in missing:
        cached[key] = _measure(source, key, length)
        if cache is not None and isinstance(cached[key], tuple):
            raise ValueError(
                f"a data_len cache holds one number per key; key {key!r} measured "
                f"{cached[key]!r} (use no cache for pair lengths)"
            )
    if cache is not None and missing:
        _write_data_len(cache, cached)
    return {key: cached[key] for key in wanted}


def _measure(source: Any, key: Key, length: str | Callable | None) -> Length:
    try:
        sample = source[key]
    except (KeyError, IndexError) as exc:
        raise DataError(f"key is missing from the source: {exc!r}", key=key) from exc
    try:
        value = length(sample) if callable(length) else sample_length(sample, length)
    except (KeyError, ValueError, TypeError) as exc:
        if isinstance(exc, DataError):
            raise
        raise DataError(f"cannot measure the sample: {exc}", key=key) from exc
    try:  # plain Python numbers (a numpy scalar would be written as 'np.int64(5)')
        if isinstance(value, tuple):
            return tuple(_plain_number(v) for v in value)
        return _plain_number(value)
    except (TypeError, ValueError) as exc:
        raise DataError(f"the measured length is not a number >= 0: {value!r}", key=key) from exc


def _plain_number(value: Any) -> int | float:
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        out: int | float = int(value)
    elif isinstance(value, numbers.Real) and not isinstance(value, bool):
        out = float(value)
    else:
        raise TypeError(f"not a number: {value!r}")
    if not (math.isfinite(out) and out >= 0):
        raise ValueError(f"not finite and >= 0: {value!r}")
    return out


def _write_data_len(path: str, lengths: Mapping[Key, Length]) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as out:
            for key, value in lengths.items():
                out.write(f"{key} {value!r}\n")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


# --------------------------------------------------------------------------- selection


def select_keys(
    lengths: Mapping[Key, Length],
    mode: str,
    amount: int | float,
    *,
    meta: PathLike | Mapping[Key, float] | None = None,
    seed: int = 0,
) -> dict[Key, Length]:
    """Keep a part of a corpus before building a view (SpeeChain's ``data_selection``).

    Modes without metadata: ``"order"`` keeps the first keys of ``lengths`` (file order),
    ``"rev_order"`` the last ones, ``"random"`` a random subset drawn without replacement with
    ``derive_rng(seed)``. Modes with a number per key in ``meta`` (an ``idx2data`` file
    ``<key> <number>`` or a mapping; e.g. a per-utterance SNR or WER): ``"min"`` keeps the keys
    with the smallest values, ``"max"`` the largest, ``"middle"`` drops the extremes on both
    sides. Compose modes by calling it again on the result.

    Args:
        lengths: ``{key: length}`` (what :func:`read_data_len` returns).
        mode: one of :data:`SELECTION_MODES`.
        amount: how many keys to keep: an ``int >= 1`` (a count) or a ``float`` in (0, 1]
            (a ratio of the keys, rounded down, at least one).
        meta: the numbers ranked by ``"min"``/``"max"``/``"middle"`` (keys of ``lengths``
            missing from it are an error).
        seed: seed of ``"random"``.

    Returns:
        The kept ``{key: length}``, in the order of ``lengths``.

    >>> lengths = {"a": 5, "b": 3, "c": 9, "d": 1}
    >>> select_keys(lengths, "order", 2), select_keys(lengths, "rev_order", 0.25)
    ({'a': 5, 'b': 3}, {'d': 1})
    >>> select_keys(lengths, "max", 2, meta={"a": 0.5, "b": 0.1, "c": 0.9, "d": 0.7})
    {'c': 9, 'd': 1}
    """
    if mode not in SELECTION_MODES:
        raise ValueError(f"mode must be one of {SELECTION_MODES}, got {mode!r}")
    keys = list(lengths)
    if isinstance(amount, bool) or not isinstance(amount, (int, float)):
        raise TypeError(f"amount must be an int or a float, got {amount!r}")
    if isinstance(amount, int):
        if amount < 1:
            raise ValueError(f"amount must be >= 1 as a count, got {amount!r}")
        count = min(amount, len(keys))
    else:
        if not 0 < amount <= 1:
            raise ValueError(f"amount must be in (0, 1] as a ratio, got {amount!r}")
        count = min(len(keys), max(1, int(len(keys) * amount)))
    needs_meta = mode in ("min", "max", "middle")
    if needs_meta != (meta is not None):
        raise ValueError(f"mode {mode!r} {'needs' if needs_meta else 'takes no'} meta=")
    if mode == "order":
        kept = keys[:count]
    elif mode == "rev_order":
        kept = keys[len(keys) - count:]
    elif mode == "random":
        kept = derive_rng(check_int("seed", seed), 0, 0, 0, "select_keys").sample(keys, count)
    else:
        values = _meta_values(meta, keys)
        ranked = sorted(keys, key=lambda k: values[k])
        if mode == "min":
            kept = ranked[:count]
        elif mode == "max":
            kept = ranked[len(ranked) - count:]
        else:
            start = (len(ranked) - count) // 2
            kept = ranked[start:start + count]
    chosen = set(kept)
    return {key: lengths[key] for key in keys if key in chosen}


def _meta_values(meta: PathLike | Mapping, keys: list) -> dict:
    if isinstance(meta, Mapping):
        values, where = dict(meta), "meta"
    else:
        paths = _as_paths(meta, "meta")
        values, where = {}, ", ".join(paths)
        for key, entry in _read_tables(paths).items():
            try:
                values[key] = float(entry.value)
            except ValueError as exc:
                raise DataError(
                    f"expected '<key> <number>', got {entry.value!r}",
                    source=entry.source, line=entry.line, key=key,
                ) from exc
    for key in keys:
        if key not in values:
            raise DataError("key has no value in the selection metadata", source=where, key=key)
    return values


# --------------------------------------------------------------------------- group labels


def check_group_info(group_info: Any) -> None:
    if group_info is None:
        return
    if not isinstance(group_info, Mapping):
        raise TypeError(f"group_info must be a mapping name -> source, got {group_info!r}")
    for name, source in group_info.items():
        if not isinstance(source, Mapping):
            _as_paths(source, f"group_info[{name!r}]")


def read_group_labels(sources: Mapping[str, Any], keys: Iterable[Key]
                       ) -> dict[str, dict[Key, Any]]:
    """``{name: {key: label}}`` for ``keys`` from a view's ``group_info`` sources (``idx2data``
    files ``<key> <label>`` or mappings); labels for other keys are left out; a key without a
    label is a :class:`DataError` naming the group's source and the key."""
    keys = list(keys)
    info = {}
    for name, source in sources.items():
        if isinstance(source, Mapping):
            labels, where = dict(source), f"group_info[{name!r}]"
        else:
            paths = _as_paths(source, f"group_info[{name!r}]")
            labels = {k: e.value for k, e in _read_tables(paths).items()}
            where = ", ".join(paths)
        missing = [key for key in keys if key not in labels]
        if missing:
            raise DataError(
                f"group {name!r} has no label for {len(missing)} key(s) of the view",
                source=where, key=missing[0],
            )
        info[name] = {key: labels[key] for key in keys}
    return info


# --------------------------------------------------------------------------- checks


def _check_length(key: Key, value: Any) -> Length:
    parts = value if isinstance(value, tuple) else (value,)
    ok = bool(parts) and all(
        isinstance(p, (int, float)) and not isinstance(p, bool) and math.isfinite(p) and p >= 0
        for p in parts
    )
    if not ok:
        raise ValueError(
            f"lengths[{key!r}] must be a finite number >= 0 (or a tuple of them), got {value!r}"
        )
    return value


def check_lengths(lengths: Any) -> dict[Key, Length]:
    """A copy of a view's ``lengths``, checked: a mapping of numbers, or of tuples, not both."""
    if isinstance(lengths, (str, os.PathLike)):
        raise TypeError(
            f"lengths must be a mapping key -> length, got the path {lengths!r}; "
            "read it with read_data_len()"
        )
    if not isinstance(lengths, Mapping):
        raise TypeError(f"lengths must be a mapping key -> length, got {lengths!r}")
    checked = {key: _check_length(key, value) for key, value in lengths.items()}
    if len({isinstance(v, tuple) for v in checked.values()}) > 1:
        raise ValueError("lengths must be all numbers or all tuples, got a mix")
    return checked


# --------------------------------------------------------------------------- index durations


@functional_datapipe("durations_from_index")
class IndexDurationReaderIterDataPipe(IterDataPipe[Sample]):
    """Durations of raw shard samples from the index (functional name: ``durations_from_index``).

    ``pack`` writes every shard's keys and lengths into its folder's ``index.jsonl``. This
    stage looks each sample up by its shard (``source``, as ``sharded_shuffle`` and
    ``read_shards`` set it) and key, and adds ``duration`` in seconds (the index's lengths are
    frames of 10 ms, samples at the index's rate, or seconds). Raw samples can then be bucketed
    and batched on their durations before anything is decoded -- the buffers hold undecoded
    payloads -- and decoded in their batch, straight into it, by
    :class:`~speechpipe.pipes.collate.DecodeCollate`. Measure them with
    a budget in seconds (``block_batch(seconds)``, i.e. ``PaddedArea(budget=seconds,
    length=sample_duration)``).

    Args:
        source_datapipe: raw samples with ``key`` and ``source``.
        index: a :class:`~speechpipe.index.ShardIndex` holding the shards, or ``None``: the
            ``index.jsonl`` beside each shard, read when its first sample comes.
        remote: options for reading the index of shards in object storage or at URLs.

    Raises:
        DataError: a sample whose shard has no entry in the index, or whose key is not in its
            shard's entry (the index is not this shard's), naming the shard and the key.

    >>> import os, tempfile
    >>> from speechpipe import IterableWrapper
    >>> from speechpipe.index import ShardEntry, ShardIndex
    >>> root = tempfile.mkdtemp()
    >>> index = ShardIndex(root, [ShardEntry("a.tar", 2, 0, ("u1", "u2"), (300.0, 150.0))])
    >>> samples = [{"key": "u2", "source": os.path.join(root, "a.tar"), "flac": b"..."}]
    >>> [s["duration"] for s in IterableWrapper(samples).durations_from_index(index)]
    [1.5]
    """

    holds_nothing = True  # item by item: nothing kept between two yields

    def __init__(self, source_datapipe: IterDataPipe, index: ShardIndex | None = None, *,
                 remote: RemoteOptions | None = None) -> None:
        if index is not None and not isinstance(index, ShardIndex):
            raise TypeError(f"index must be a ShardIndex or None, got {index!r}")
        self.source_datapipe = source_datapipe
        self.index = index
        self.remote = remote
        # per process, filled as shards come: the index entries read (by shard path), the
        # folders whose index was read, the key -> length tables of the shards seen
        self._entries: dict[str, tuple[Any, float]] = {}
        self._folders: set[str] = set()
        self._shards: dict[str, tuple[dict[str, float], float]] = {}

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state.update(_entries={}, _folders=set(), _shards={})  # read again where it is used
        return state

    def __iter__(self):
        for sample in self.source_datapipe:
            source, key = sample.get(SOURCE), sample.get(KEY)
            entry, seconds = self._shard(source, key)
            length = _length_of(entry, key)
            if length is None:
                raise DataError("key is not in its shard's entry of the shard index (the "
                                "index was written for other shards)", source=source, key=key)
            yield {**sample, DURATION: length * seconds}

    def _shard(self, source: Any, key: Any) -> tuple[Any, float]:
        """``(lookup, seconds per length)`` of the shard ``source``: its index entry when the
        index is mapped (a key is found by its hash in the table: nothing per utterance is
        held), else a ``{key: length}`` dict; each index is read once (a folder's
        ``index.jsonl`` when its first shard comes)."""
        if not isinstance(source, str):
            raise DataError("the sample has no shard 'source' to look up in the shard index "
                            "(durations_from_index follows sharded_shuffle or read_shards)",
                            key=key)
        name = source if is_remote(source) else os.path.abspath(source)
        found = self._shards.get(name)
        if found is not None:
            return found
        folder = name.rsplit("/", 1)[0] if is_remote(name) else os.path.dirname(name)
        if self.index is not None and not self._entries:
            self._add_index(self.index)
        elif self.index is None and folder not in self._folders:
            self._folders.add(folder)
            try:
                self._add_index(ShardIndex.read(folder, remote=self.remote))
            except (DataError, MissingDataError) as exc:
                raise type(exc)(f"no shard index for this shard: {exc.reason}", source=source,
                                key=key) from exc
        entry = self._entries.get(name)
        if entry is None:
            raise DataError("the shard is not in the shard index", source=source, key=key)
        lookup = (entry[0] if hasattr(entry[0].keys, "position")
                  else dict(zip(entry[0].keys, entry[0].lengths)))
        found = self._shards[name] = (lookup, entry[1])
        return found

    def _add_index(self, index: ShardIndex) -> None:
        seconds = length_seconds(1.0, index.length_unit, sample_rate=index.sample_rate or 16000)
        self._entries.update((path, (entry, seconds)) for path, entry in index.by_path().items())


def _length_of(lookup: Any, key: Any) -> float | None:
    """The length of ``key`` in a shard: from a ``{key: length}`` dict, or by the mapped
    entry's hash search."""
    if isinstance(lookup, dict):
        return lookup.get(key)
    at = lookup.keys.position(key) if isinstance(key, str) else None
    return None if at is None else lookup.lengths[at]


IndexDurationReader = IndexDurationReaderIterDataPipe
