"""The shard index: what ``pack`` wrote, read by the stages that plan an epoch.

Beside its shards, every folder written by ``pack`` holds ``index.jsonl``: a header line, then
one line per shard with its file name, utterance count, byte size, keys and lengths::

    {"format": "speechpipe-shard-index", "version": 1, "length_unit": "frames"}
    {"name": "data-00000.tar", "count": 2000, "bytes": 61440000, "keys": [...], "lengths": [...]}

``pack`` with length groups writes one such folder per group (``out/10_500/``, ``out/500_800/``);
:meth:`ShardIndex.read` of ``out`` reads them all (:func:`index_folders`).

With it, a streaming epoch can be planned on metadata before any byte is read: its exact
length, bucket boundaries (:meth:`ShardIndex.boundaries`), a duration-balanced split across
ranks, an exact resume position.

The text is for people; planning reads its mapped table, ``index.jsonl.spmap``
(:class:`~speechpipe.compact.IndexTable`: per-shard counts, sizes and sums, per-utterance
lengths and keys), which :meth:`ShardIndex.write` writes beside it and :meth:`ShardIndex.read`
builds when it is missing or stale. Every process on a node maps the same pages; a process
holds Python objects per shard, none per utterance.

The index and its shards may live in object storage (``s3://bucket/corpus/index.jsonl``, any
fsspec URL, read through :mod:`speechpipe.remote`): shard names are then URLs in the same
folder, and remote shards are planned exactly like local ones. No table is written to the
bucket: a remote index's table is kept in the node's cache folder
(:mod:`speechpipe.node_cache`; ``RemoteOptions(cache_dir=)``, ``$SPEECHPIPE_CACHE_DIR``),
named by the URL and the object's version (ETag, version id, size): the first process of a
node to read it fetches the index and builds the table, under a lock; every other process
of the node (ranks, DataLoader workers, later passes and runs) asks the object's version
(one size request) and maps that file. A changed index is a new version: fetched and built
again, the older table removed. The table of an index in a local folder that cannot be
written is kept there too.

Compressed shards (``.tar.gz``, ``.tgz``, ``.tar.zst``: :func:`shard_compression`) are read
sequentially only: :attr:`ShardEntry.mappable` is false for them (no memory-mapped,
random-access path); their counts, keys and lengths -- and so an exact ``len()`` -- come from
the index as for plain tar.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from .compact import MAPPED_SUFFIX, IndexRow, IndexTable, MappedKeys, build_index_table
from .errors import DataError, MissingDataError, UnsafeInputError
from .node_cache import (
    drop_other_versions, file_lock, index_cache_dir, sums_match, versioned_path,
)
from .remote import (RemoteOptions, is_remote, join_url, object_version, read_remote_bytes,
                     remote_glob, remote_info)
from .sample import estimate_boundaries

__all__ = ["COMPRESSIONS", "INDEX_NAME", "ShardEntry", "ShardIndex", "cached_table",
           "check_entry_name", "index_folders", "is_folder_url", "length_seconds",
           "shard_compression"]

INDEX_NAME = "index.jsonl"
_FORMAT = "speechpipe-shard-index"
_VERSION = 1
#: Compressed shard suffixes and their compression (read sequentially, never mapped).
COMPRESSIONS = {".tar.gz": "gz", ".tgz": "gz", ".tar.zst": "zst", ".tzst": "zst"}


def shard_compression(name: str) -> str | None:
    """``"gz"``, ``"zst"`` or ``None`` (plain tar), from a shard's file name.

    >>> shard_compression("s3://b/data-00000.tar.zst"), shard_compression("data-00000.tar")
    ('zst', None)
    """
    lower = name.lower()
    for suffix, kind in COMPRESSIONS.items():
        if lower.endswith(suffix):
            return kind
    return None


def is_folder_url(name: str) -> bool:
    """Whether ``name`` is an object-storage URL naming a folder (as ``pack`` writes one):
    it ends with ``/``, or its last part has no dot (``s3://bucket/corpus/shards``); a shard
    (``.../data-00000.tar``) or an index is not one, nor is an ``http(s)://`` URL.

    >>> is_folder_url("s3://bucket/corpus/shards"), is_folder_url("s3://b/c/data-00000.tar")
    (True, False)
    """
    if not is_remote(name) or name.startswith(("http://", "https://")):
        return False
    return name.endswith("/") or "." not in name.rstrip("/").rsplit("/", 1)[-1]


@dataclass(frozen=True)
class ShardEntry:
    """One shard: its file name (relative to the index's folder) and what it holds.

    An entry read from an index holds its ``keys`` and ``lengths`` as read-only views of the
    index's memory-mapped table (:class:`~speechpipe.compact.MappedKeys`,
    :class:`~speechpipe.compact.MappedLengths`: sequences that compare equal to tuples);
    one built by hand holds tuples.
    """

    name: str
    count: int
    bytes: int
    keys: tuple[str, ...]
    lengths: tuple[float, ...]

    @property
    def total_length(self) -> float:
        total = getattr(self.lengths, "total", None)  # a mapped view keeps its sum
        return total() if total is not None else float(sum(self.lengths))

    @property
    def mappable(self) -> bool:
        """Whether the shard can be memory-mapped (plain tar); a compressed one cannot."""
        return shard_compression(self.name) is None

    def to_json(self) -> str:
        return json.dumps(
            {"name": self.name, "count": self.count, "bytes": self.bytes,
             "keys": list(self.keys), "lengths": list(self.lengths)},
            ensure_ascii=False, separators=(",", ":"),
        )


@dataclass
class ShardIndex:
    """The index of one or more shard folders.

    Args:
        root: folder the shard names are relative to.
        shards: the entries, in shard-name order.
        length_unit: what lengths count (``"frames"``, ``"samples"`` or ``"seconds"``).
        audio_format: how ``pack`` encoded audio (``"lossless"``, ``"flac16"``), ``None`` for
            features or an index written by something else.
        sample_rate: the rate (Hz) of the audio when lengths count samples (``pack`` refuses
            to count samples of mixed rates), so that a reader turns them into seconds at the
            right rate; ``None`` otherwise (or an index from before it was recorded).
        sample_rates: ``{Hz: utterances}`` of the audio in this folder (``None``: features,
            or not recorded), whatever the length unit.

    >>> import tempfile
    >>> d = tempfile.mkdtemp()
    >>> idx = ShardIndex(d, [ShardEntry("data-00000.tar", 2, 1024, ("a", "b"), (100, 250))])
    >>> _ = idx.write()
    >>> again = ShardIndex.read(d)
    >>> len(again), again.shards[0].keys, again.paths()[0][len(d):]
    (2, ('a', 'b'), '/data-00000.tar')
    """

    root: str
    shards: list[ShardEntry]
    length_unit: str = "frames"
    audio_format: str | None = None
    sample_rate: int | None = None
    sample_rates: dict[int, int] | None = None

    def __len__(self) -> int:
        """Utterances in all shards."""
        return sum(s.count for s in self.shards)

    def paths(self) -> list[str]:
        """Each shard's path, or URL when the root or the entry is a URL."""
        return [s.name if is_remote(s.name)
                else join_url(self.root, s.name) if is_remote(self.root)
                else os.path.join(self.root, s.name) for s in self.shards]

    def by_path(self) -> dict[str, ShardEntry]:
        """``{absolute shard path or URL: entry}``."""
        return {p if is_remote(p) else os.path.abspath(p): s
                for p, s in zip(self.paths(), self.shards)}

    def lengths(self) -> list[float]:
        return [n for s in self.shards for n in s.lengths]

    def length_array(self) -> np.ndarray:
        """Every length in the index, in shard order, as a float64 array: for an index read
        from one table whose shards are in the table's order, a view of the mapped lengths
        (no copy, nothing per utterance in this process); else a new array."""
        spans = [getattr(s.lengths, "span", None) for s in self.shards]
        if spans and all(sp is not None for sp in spans):
            table = spans[0][0]
            if all(sp[0] is table and sp[1] == (spans[i - 1][2] if i else sp[1])
                   for i, sp in enumerate(spans)):
                return table.lengths[spans[0][1]:spans[-1][2]]
            return np.concatenate([s.lengths.array for s in self.shards])
        return np.fromiter((n for s in self.shards for n in s.lengths), np.float64)

    def total_bytes(self) -> int:
        return sum(s.bytes for s in self.shards)

    def boundaries(self, num_buckets: int) -> list[float]:
        """Equal-count bucket boundaries over every length in the index (the quantiles
        :func:`~speechpipe.sample.estimate_boundaries` takes, from the mapped lengths)."""
        if num_buckets < 1:
            raise ValueError(f"num_buckets must be >= 1, got {num_buckets}")
        lengths = self.length_array()
        if lengths.size == 0 or num_buckets == 1:
            return estimate_boundaries([], num_buckets)
        n = lengths.size
        at = [min(n - 1, (i * n) // num_buckets) for i in range(1, num_buckets)]
        cuts = np.partition(lengths, sorted(set(at)))[at].tolist()
        return sorted(set(cuts))

    def boundaries_fn(self, num_buckets: int):
        """A picklable callable returning :meth:`boundaries` (for ``bucket_by_length``, which
        calls it once when iteration starts)."""
        import functools

        return functools.partial(ShardIndex.boundaries, self, num_buckets)

    def write(self, path: str | None = None) -> str:
        """Write ``index.jsonl`` (atomically: a temporary file renamed) and return its path.
        A local file only: upload it beside remote shards with the storage's own tools."""
        if path is None and is_remote(self.root):
            raise ValueError(f"the index's folder {self.root} is a URL: write it to a local "
                             "path (write(path)) and upload it beside the shards")
        path = path or os.path.join(self.root, INDEX_NAME)
        tmp = f"{path}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            header = {"format": _FORMAT, "version": _VERSION, "length_unit": self.length_unit}
            if self.audio_format is not None:
                header["audio_format"] = self.audio_format
            if self.sample_rate is not None:
                header["sample_rate"] = self.sample_rate
            if self.sample_rates is not None:
                header["sample_rates"] = {str(r): n for r, n in sorted(self.sample_rates.items())}
            f.write(json.dumps(header) + "\n")
            for entry in self.shards:
                f.write(entry.to_json() + "\n")
        os.replace(tmp, path)
        table = path + MAPPED_SUFFIX
        if all(len(e.keys) == len(e.lengths) == e.count for e in self.shards):
            build_index_table(table, header, (
                (e.name, e.count, e.bytes, e.keys, e.lengths, n)
                for n, e in enumerate(self.shards, start=2)), source=path, mode_of=path)
        elif os.path.exists(table):  # a reader builds it from the text (and says what is wrong)
            os.remove(table)
        return path

    def missing_or_short(self) -> list[str]:
        """One line per local shard that is absent or smaller than the index says (truncated,
        or being rewritten), with what it holds: ``"data-00003.tar: 1024 of 61440 bytes (49
        utterances)"``. Reads no shard (one ``stat`` each)."""
        problems = []
        for path, entry in zip(self.paths(), self.shards):
            if is_remote(path):
                continue  # an object in a bucket: a stat is a request; read errors name it
            try:
                size = os.path.getsize(path)
            except OSError:
                problems.append(f"{path}: missing ({entry.count} utterances)")
                continue
            if size < entry.bytes:
                problems.append(f"{path}: {size} of {entry.bytes} bytes, truncated "
                                f"({entry.count} utterances)")
        return problems

    @classmethod
    def read(cls, path: str | os.PathLike, *, remote: RemoteOptions | None = None,
             allow_outside: bool = False, cache_dir: str | os.PathLike | None = None
             ) -> "ShardIndex":
        """Read ``index.jsonl`` (give the file or its folder; a folder URL such as
        ``s3://bucket/corpus`` reads ``s3://bucket/corpus/index.jsonl``), or every index of a
        folder ``pack`` wrote with length groups, local or a URL (one per group folder,
        :func:`index_folders`; in a bucket, ``<url>/*/index.jsonl`` when the folder has no
        index of its own; the entries are then named ``<group>/<shard>``).

        Each index is parsed once per process: a later read of the same file (same inode,
        size and modification time) or of the same version of a URL (one size request asks
        it) returns a copy of what the first one read. A URL's table is fetched and built once
        per node (see the module docs).

        Args:
            path: the file or folder, local or a URL.
            remote: how a URL is read (:class:`~speechpipe.remote.RemoteOptions`).
            allow_outside: ``False`` (the default): every shard name must be a plain
                relative name inside the index's folder (no absolute path, no ``..``, no URL),
                so that a downloaded or shared pack folder cannot make a reader open a file
                elsewhere or fetch a URL; an entry that is not raises
                :class:`~speechpipe.errors.UnsafeInputError` naming the file and line.
                ``True`` trusts the index's author: its names are joined and read wherever
                they point (an index you wrote yourself over shards kept elsewhere).
            cache_dir: the node's cache folder for the tables of remote indexes and of
                indexes in folders that cannot be written; ``None``: ``remote.cache_dir``,
                else :func:`speechpipe.node_cache.index_cache_dir`'s default.

        Raises:
            MissingDataError: no index there.
            DataError: a malformed line, naming the file and line; group folders whose
                indexes count lengths in different units; a URL that could not be read.
        """
        path = os.fspath(path)
        if not isinstance(allow_outside, bool):
            raise TypeError(f"allow_outside must be True or False, got {allow_outside!r}")
        if cache_dir is None and remote is not None:
            cache_dir = remote.cache_dir
        cache_dir = None if cache_dir is None else os.fspath(cache_dir)
        if not is_remote(path) and os.path.isdir(path):
            folders = index_folders(path)
            if len(folders) > 1 or (folders and folders[0] != path):
                return cls._read_groups(path, folders, allow_outside=allow_outside,
                                        cache_dir=cache_dir)
        if is_remote(path) and not path.endswith(".jsonl"):
            folder = path.rstrip("/")
            try:
                return cls._cached(join_url(folder, INDEX_NAME), remote, allow_outside,
                                   cache_dir)
            except MissingDataError:
                groups = remote_glob(join_url(folder, f"*/{INDEX_NAME}"), remote)
                if not groups:
                    raise MissingDataError(
                        f"no shard index here: neither {join_url(folder, INDEX_NAME)} nor a "
                        f"length group's ({join_url(folder, '*/' + INDEX_NAME)}); write one "
                        "with 'speechpipe pack' (--out may be this URL), or upload the whole "
                        "pack folder", source=folder) from None
                return cls._read_groups(folder, [g.rsplit("/", 1)[0] for g in groups], remote,
                                        allow_outside=allow_outside, cache_dir=cache_dir)
        return cls._cached(path, remote, allow_outside, cache_dir)

    @classmethod
    def _cached(cls, path: str, remote: RemoteOptions | None, allow_outside: bool,
                cache_dir: str | None = None) -> "ShardIndex":
        """The index at ``path``, parsed once per process while the file (a URL: the
        object's version) is the same (a copy is handed out: callers may change their
        lists)."""
        info = None
        if is_remote(path):
            path = path if path.endswith(".jsonl") else join_url(path, INDEX_NAME)
            info = _remote_index_info(path, remote)
            where = ("url", path, tuple(sorted(object_version(info)[0].items())))
        else:
            where = _cache_key(path)
        key = None if where is None else (where, allow_outside)
        cached = _READ.get(key) if key is not None else None
        if cached is None:
            cached = cls._parse(path, remote, allow_outside, cache_dir, info)
            if key is not None:
                _READ[key] = cached
                while len(_READ) > _READ_KEPT:
                    _READ.pop(next(iter(_READ)))
        return replace(cached, shards=list(cached.shards),
                       sample_rates=None if cached.sample_rates is None
                       else dict(cached.sample_rates))

    @classmethod
    def _parse(cls, path: str, remote: RemoteOptions | None, allow_outside: bool,
               cache_dir: str | None = None, info: Mapping[str, Any] | None = None
               ) -> "ShardIndex":
        """The index at ``path`` from its mapped table (:class:`~speechpipe.compact.
        IndexTable`, ``index.jsonl.spmap``): mapped when current, else built from the text
        (checked line by line) and written beside it; a URL's (``info``: its object's) and
        that of a folder that cannot be written in the node's cache folder
        (:func:`cached_table`). The entries' keys and lengths are views of the table."""
        if is_remote(path):
            table = _remote_table(path, remote, cache_dir, info)
        else:
            if os.path.isdir(path):
                path = os.path.join(path, INDEX_NAME)
            try:
                st = os.stat(path)
                table = IndexTable.open(path, lambda: _checked_rows(_file_lines(path), path))
                if table is None:  # a folder that cannot be written
                    version = {"size": st.st_size, "mtime_ns": st.st_mtime_ns,
                               "inode": st.st_ino}
                    table = cached_table(os.path.abspath(path), version,
                                         lambda: _checked_rows(_file_lines(path), path),
                                         cache_dir=cache_dir, path=path)
            except FileNotFoundError as exc:
                raise MissingDataError(
                    "no shard index here; write one with 'speechpipe pack'", source=path
                ) from exc
        header = table.index_header
        shards = [ShardEntry(table.name(i), int(count), int(size), MappedKeys(table, i),
                             table.lengths_of(i))
                  for i, (count, size) in enumerate(zip(table.counts.tolist(),
                                                        table.bytes.tolist()))]
        if not allow_outside:
            for entry, line in zip(shards, table.lines.tolist()):
                check_entry_name(entry.name, path, line)
        audio_format = header.get("audio_format")
        rate = header.get("sample_rate")
        if rate is not None and (isinstance(rate, bool) or not isinstance(rate, int) or rate < 1):
            raise DataError(f"sample_rate must be an int >= 1, got {rate!r}", source=path, line=1)
        root = (path.rsplit("/", 1)[0] if is_remote(path)
                else os.path.dirname(os.path.abspath(path)))
        return cls(root, shards,
                   str(header.get("length_unit", "frames")),
                   None if audio_format is None else str(audio_format), rate,
                   _rate_counts(header.get("sample_rates"), path))

    @classmethod
    def _read_groups(cls, root: str, folders: list[str], remote: RemoteOptions | None = None,
                     *, allow_outside: bool = False, cache_dir: str | None = None
                     ) -> "ShardIndex":
        if is_remote(root):
            parts = [cls.read(join_url(folder, INDEX_NAME), remote=remote,
                              allow_outside=allow_outside, cache_dir=cache_dir)
                     for folder in folders]
            names = [p.root[len(root) + 1:] + "/" + s.name for p in parts for s in p.shards]
        else:
            parts = [cls.read(os.path.join(folder, INDEX_NAME), allow_outside=allow_outside,
                              cache_dir=cache_dir)
                     for folder in folders]
            names = [os.path.join(os.path.relpath(p.root, root), s.name)
                     for p in parts for s in p.shards]
        units = {p.length_unit for p in parts}
        if len(units) > 1:
            raise DataError(f"these group folders count lengths in different units: "
                            f"{sorted(units)}", source=root)
        formats = {p.audio_format for p in parts}
        entries = [ShardEntry(name, s.count, s.bytes, s.keys, s.lengths)
                   for name, s in zip(names, (s for p in parts for s in p.shards))]
        rates = {p.sample_rate for p in parts}
        counts: dict[int, int] = {}
        for part in parts:
            for hz, n in (part.sample_rates or {}).items():
                counts[hz] = counts.get(hz, 0) + n
        return cls(root if is_remote(root) else os.path.abspath(root), entries, units.pop(),
                   formats.pop() if len(formats) == 1 else None,
                   rates.pop() if len(rates) == 1 else None, dict(sorted(counts.items())) or None)

    @classmethod
    def for_shards(cls, paths: Sequence[str], *, remote: RemoteOptions | None = None
                   ) -> "ShardIndex":
        """An index of exactly ``paths`` (e.g. a brace pattern's expansion across length
        groups), in their order, read from the ``index.jsonl`` of each folder. Entry names
        become absolute paths (URLs stay as they are; their folder's index is read with
        ``remote``).

        Raises:
            DataError: a shard missing from its folder's index.
        """
        cache: dict[str, dict[str, ShardEntry]] = {}
        units: set[str] = set()
        rates: set[int | None] = set()
        entries = []
        for p in paths:
            if is_remote(p):
                (folder, base), full = p.rsplit("/", 1), p
            else:
                full = os.path.abspath(p)
                folder, base = os.path.dirname(full), os.path.basename(full)
            if folder not in cache:
                idx = cls.read(folder, remote=remote)
                units.add(idx.length_unit)
                rates.add(idx.sample_rate)
                cache[folder] = {s.name: s for s in idx.shards}
            entry = cache[folder].get(base)
            if entry is None:
                raise DataError("shard is not in its folder's index (re-run pack?)", source=p)
            entries.append(ShardEntry(full, entry.count, entry.bytes, entry.keys,
                                      entry.lengths))
        if len(units) > 1:
            raise DataError(f"these shard folders count lengths in different units: {units}")
        if len(rates) > 1:
            raise DataError(f"these shard folders hold audio at different sample rates: "
                            f"{sorted(rates, key=lambda r: (r is None, r or 0))}",
                            source=", ".join(sorted(cache)))
        return cls("/", entries, units.pop() if units else "frames",
                   sample_rate=rates.pop() if rates else None)


#: Indexes this process has read, by file identity (see :func:`_cache_key`): a pass, a
#: second pass, ``sharded_shuffle`` listing a folder and then planning it, ``lengths`` and
#: the step planner all read an index once per process (a URL: fetched once per process).
_READ: dict[tuple, ShardIndex] = {}
_READ_KEPT = 64


def _cache_key(path: str) -> tuple | None:
    """What identifies the local index at ``path`` now: its inode, size and modification
    time (a rewritten index -- ``write`` replaces the file -- is read again); ``None`` where
    there is no file (the read raises). (A URL: its object's version, in ``_cached``.)"""
    if os.path.isdir(path):
        path = os.path.join(path, INDEX_NAME)
    try:
        st = os.stat(path)
    except OSError:
        return None
    return ("file", os.path.abspath(path), st.st_ino, st.st_size, st.st_mtime_ns)


def _rate_counts(value, path: str) -> dict[int, int] | None:
    """The header's ``{"16000": n, ...}`` as ``{16000: n}``; a DataError if malformed."""
    if value is None:
        return None
    try:
        counts = {int(r): n for r, n in value.items()}
    except (AttributeError, TypeError, ValueError):
        counts = None
    if counts is None or not all(isinstance(n, int) and n >= 0 for n in counts.values()):
        raise DataError(f"sample_rates must map rates to counts, got {value!r}", source=path,
                        line=1)
    return counts


def length_seconds(total: float, unit: str, *, frame_shift: float = 0.01,
                   sample_rate: int = 16000) -> float:
    """Lengths counted in an index's ``unit`` as seconds: frames of ``frame_shift`` seconds,
    samples at ``sample_rate`` Hz.

    >>> length_seconds(500, "frames"), length_seconds(32000, "samples")
    (5.0, 2.0)
    """
    scale = {"frames": frame_shift, "samples": 1.0 / sample_rate, "seconds": 1.0}.get(unit)
    if scale is None:
        raise DataError(f"unknown length unit {unit!r} in the shard index")
    return float(total) * scale


def index_folders(folder: str | os.PathLike) -> list[str]:
    """The folders under ``folder`` whose shards make one corpus: ``[folder]`` when it holds
    ``index.jsonl``, else its subfolders holding one (``pack``'s length groups), sorted.

    Raises:
        MissingDataError: no index in the folder nor in any subfolder.
        DataError: both an index in the folder and indexed subfolders (two packs mixed in one
            folder: re-pack with ``--force``).

    >>> import tempfile
    >>> d = tempfile.mkdtemp()
    >>> for group in ("500_800", "10_500"):
    ...     os.makedirs(os.path.join(d, group))
    ...     _ = ShardIndex(os.path.join(d, group), []).write()
    >>> [f[len(d) + 1:] for f in index_folders(d)]
    ['10_500', '500_800']
    """
    folder = os.fspath(folder)
    try:
        subfolders = sorted(os.path.join(folder, name) for name in os.listdir(folder)
                            if os.path.isfile(os.path.join(folder, name, INDEX_NAME)))
    except FileNotFoundError as exc:
        raise MissingDataError("no such shard folder", source=folder) from exc
    here = os.path.isfile(os.path.join(folder, INDEX_NAME))
    if here and subfolders:
        raise DataError(
            f"this folder holds shards with an index and {len(subfolders)} group folder(s) "
            f"with their own ({', '.join(os.path.basename(s) for s in subfolders[:5])}): two "
            "packs are mixed here; pack again with --force (pack_data(..., force=True))",
            source=folder)
    if here:
        return [folder]
    if not subfolders:
        raise MissingDataError(
            "no shard index here (nor in a group folder); write one with 'speechpipe pack'",
            source=os.path.join(folder, INDEX_NAME))
    return subfolders


def cached_table(source: str, version: Mapping[str, Any],
                 rows: Callable[[], tuple[dict, Iterable[IndexRow]]], *,
                 cache_dir: str | None = None, path: str | None = None) -> IndexTable:
    """The :class:`~speechpipe.compact.IndexTable` of the index ``source`` (a URL, or a local
    index whose folder cannot be written) at ``version`` (what names it: an object's ETag and
    size, a file's size, time and inode), kept in the node's cache folder
    (:mod:`speechpipe.node_cache`): mapped when that version's file is there and whole, else
    built from ``rows()`` once -- under a lock, so that the processes of a node that start at
    once fetch and build it once -- and the source's older versions removed. A cached file
    cut short, with a broken header, arrays that do not fit together or bytes that do not
    have the CRC-32s its header records (checked once per process) is built again.
    ``path``: the local index (for ``is_current``). Without a usable cache folder (a
    warning says why), a table of this process only.

    Raises:
        DataError: the file just written cannot be read back.
    """
    folder = index_cache_dir(cache_dir)
    if folder is None:
        return IndexTable.build(*rows(), source=source)
    place, stem = versioned_path(folder, source, version, suffix=MAPPED_SUFFIX)
    mark = {"cache_source": source, "cache_version": dict(version)}
    table = _in_cache(place, mark, path or source)
    if table is not None:
        return table
    with file_lock(os.path.join(folder, stem + ".lock"), create=True):
        table = _in_cache(place, mark, path or source)
        if table is not None:
            return table
        header, entries = rows()
        try:
            build_index_table(place, header, entries, source=path or source, sums=True,
                              extra={**mark, "built": f"{os.getpid()}-{time.time_ns()}"})
        except OSError as exc:  # a full disk: this process's own table
            warnings.warn(f"cannot write {place} ({exc.strerror or exc}): this process "
                          f"builds its own table of {source}", RuntimeWarning, stacklevel=2)
            return IndexTable.build(*rows(), source=source)
        drop_other_versions(folder, stem, place)
        table = _in_cache(place, mark, path or source)
    if table is None:
        raise DataError("the index's table just written here cannot be read back",
                        source=place)
    return table


def _in_cache(place: str, mark: dict, path: str) -> IndexTable | None:
    """The cached table at ``place`` if it is whole (its arrays fit together and have the
    CRC-32s its header records: checked once per process) and of ``mark``'s source and
    version."""
    try:
        table = IndexTable.mapped(place, path)
    except (MissingDataError, DataError):
        return None
    if any(table.header.get(k) != v for k, v in mark.items()) or not table.fits():
        return None
    arrays = {name: getattr(table, name, None) for name in table.header["arrays"]}
    return table if sums_match(place, table.header, arrays) else None


def _remote_index_info(url: str, remote: RemoteOptions | None) -> dict:
    """The index object's info (one size request); named when it is missing."""
    try:
        return remote_info(url, remote)
    except MissingDataError as exc:
        raise MissingDataError("no shard index here; write one with 'speechpipe pack' "
                               "and upload it beside the shards", source=url) from exc


def _remote_table(url: str, remote: RemoteOptions | None, cache_dir: str | None,
                  info: Mapping[str, Any] | None) -> IndexTable:
    """The table of the index at ``url``: from the node's cache when the object's version
    names its content (an ETag, a version id) or at least its time; else (a store that
    gives a size only) this process's own, fetched and built here."""
    if info is None:
        info = _remote_index_info(url, remote)
    version, strong = object_version(info)
    endpoint = dict(remote.storage_options or {}).get("endpoint_url") if remote else None
    if not strong and set(version) <= {"size"}:
        version = {}  # a size alone does not name a version: this process's own table
    elif endpoint:  # the same bucket and key behind another endpoint is another object
        version["endpoint"] = str(endpoint)

    def rows():
        lines = _remote_lines(url, remote, info)
        again = object_version(_remote_index_info(url, remote))[0]
        if again != object_version(info)[0]:  # rewritten while it was read (a store without pinning)
            raise DataError("the index changed while it was read (its version was "
                            f"{object_version(info)[0]}, is {again}): read it again",
                            source=url)
        return _checked_rows(lines, url)

    if not version:
        return IndexTable.build(*rows(), source=url)
    return cached_table(url, version, rows, cache_dir=cache_dir)


def _remote_lines(path: str, remote: RemoteOptions | None,
                  info: Mapping[str, Any] | None = None) -> list[str]:
    """The lines of the index at the URL ``path`` (``info``: the version to read)."""
    try:
        data = read_remote_bytes(path, remote, info=info)
    except MissingDataError as exc:
        raise MissingDataError("no shard index here; write one with 'speechpipe pack' "
                               "and upload it beside the shards", source=path) from exc
    try:
        return data.decode("utf-8").splitlines(keepends=True)
    except UnicodeDecodeError as exc:
        raise DataError(f"not UTF-8 text: {exc.reason}", source=path) from None


def _file_lines(path: str):
    """The lines of a local index, read as they are used."""
    with open(path, encoding="utf-8") as f:
        try:
            yield from f
        except UnicodeDecodeError as exc:
            raise DataError(f"not UTF-8 text: {exc.reason}", source=path) from None


def _checked_rows(lines, path: str):
    """``(header, rows)`` of an index's lines: the header checked now, each entry checked
    (:func:`_entry`, naming the file and line) as the rows are read."""
    lines = iter(lines)
    try:
        header = _checked_header(next(lines, None), path)
    except BaseException:
        close = getattr(lines, "close", None)
        if close is not None:
            close()
        raise

    def rows():
        try:
            for n, line in enumerate(lines, start=2):
                if line.strip():
                    e = _entry(_json_line(line, path, n), path, n)
                    yield e.name, e.count, e.bytes, e.keys, e.lengths, n
        finally:
            close = getattr(lines, "close", None)
            if close is not None:
                close()
    return header, rows()


def _checked_header(first: str | None, path: str) -> dict:
    if first is None:
        raise DataError("empty shard index", source=path)
    header = _json_line(first, path, 1)
    if not isinstance(header, dict) or header.get("format") != _FORMAT:
        raise DataError(f"not a speechpipe shard index (header {first.strip()[:80]!r})",
                        source=path, line=1)
    if header.get("version") != _VERSION:
        raise DataError(f"unsupported index version {header.get('version')!r}",
                        source=path, line=1)
    return header


def _json_line(line: str, path: str, number: int):
    try:
        return json.loads(line)
    except json.JSONDecodeError as exc:
        raise DataError(f"invalid JSON: {exc.msg} (column {exc.colno})",
                        source=path, line=number) from exc
    except RecursionError:  # e.g. [[[[...]]]] nested 10^5 deep
        raise DataError("invalid JSON: nested too deeply", source=path, line=number) from None


def check_entry_name(name: str, source: str, line: int | None = None) -> None:
    """Refuse an index entry that does not name a file inside the index's folder.

    A shard name must be relative, without ``..`` components, drive letters, backslashes,
    NUL or a URL scheme; otherwise :class:`~speechpipe.errors.UnsafeInputError` names the
    index file and line (:meth:`ShardIndex.read`'s ``allow_outside=True`` skips this check).

    >>> check_entry_name("10_500/data-00000.tar", "index.jsonl", 2)
    >>> check_entry_name("../private.tar", "index.jsonl", 2)
    Traceback (most recent call last):
    ...
    speechpipe.errors.UnsafeInputError: index.jsonl:2: shard name '../private.tar' points ...
    """
    parts = name.replace("\\", "/").split("/")
    if (not name or is_remote(name) or "\\" in name or "\0" in name or name.startswith("/")
            or os.path.isabs(name) or ":" in parts[0] or ".." in parts
            or any(p in ("", ".") for p in parts)):
        raise UnsafeInputError(
            f"shard name {name!r} points outside the index's folder (absolute, '..', or a "
            "URL); pass allow_outside=True to ShardIndex.read if you trust this index",
            source=source, line=line)


def _entry(row, path: str, number: int) -> ShardEntry:
    if not isinstance(row, dict):
        raise DataError("expected a JSON object per shard", source=path, line=number)
    try:
        name, count, size = row["name"], row["count"], row["bytes"]
        keys, lengths = row["keys"], row["lengths"]
    except KeyError as exc:
        raise DataError(f"shard entry lacks {exc.args[0]!r}", source=path, line=number) from exc
    if not (isinstance(name, str) and isinstance(count, int) and isinstance(size, int)
            and isinstance(keys, list) and isinstance(lengths, list)):
        raise DataError("shard entry has fields of the wrong type", source=path, line=number)
    if not (len(keys) == len(lengths) == count):
        raise DataError(f"shard {name!r}: count {count} but {len(keys)} keys and "
                        f"{len(lengths)} lengths", source=path, line=number)
    return ShardEntry(name, count, size, tuple(keys), tuple(float(n) for n in lengths))

