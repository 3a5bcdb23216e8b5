"""The streaming road: shards read whole and in sequence, shuffled at two levels.

A corpus too big for the page cache is stored as **shards** -- tar files of ~2000 utterances
in webdataset naming (:mod:`speechpipe.pipes.shards._reader`), or the ark files of a Kaldi data
directory. Disks and networks read a file front to back far faster than they seek, so each
epoch reads every shard sequentially and gets its randomness from two shuffles (webdataset's
recipe, used by CAT and WeNet for corpora of 10,000 hours):

1. the **shard list** is shuffled with ``(seed, epoch)`` -- the same order on every rank and
   DataLoader worker -- and split between them (:mod:`speechpipe.pipes.order._assignment`);
2. each process reads its shards one after the other and shuffles the **samples** in a buffer
   of ``buffer_size`` (:func:`~speechpipe.pipes.order._window.shuffle_buffer`), seeded with
   ``(seed, epoch, rank, worker)``.

Verbs and functions:

- ``sharded_shuffle`` (:class:`ShardedShufflerIterDataPipe`): shard names (paths or
  ``http(s)://`` URLs, e.g. from ``list_shards``) to samples, in the two-level random order.
  Tar shards give raw samples (fields still encoded bytes; follow with ``decode``), Kaldi arks
  give ``{"key", "feats", "source"}``. With a shard index (:mod:`speechpipe.index`) it has an
  exact ``len()`` and an :meth:`~ShardedShufflerIterDataPipe.epoch_plan` (an
  :class:`~speechpipe.pipes.order._plans.EpochPlan`; every process's: ``epoch_plans``).
- :func:`read_shard`, :func:`iter_ark`: reading one shard as a plain function; the other steps
  are :func:`~speechpipe.pipes.order._assignment.shuffle_shards`,
  :func:`~speechpipe.pipes.order._assignment.split_shards` and
  :func:`~speechpipe.pipes.order._window.shuffle_buffer` (all three importable from here too).
- :func:`shard_assignment`: every rank's and worker's shards in an epoch, and their balance.
- :func:`kaldi_arks`: the ark files of a ``feats.scp``, so that a Kaldi data directory is
  streamed as shards with no packing.

``EpochPlan``, ``PlannedShard`` and ``EpochProgress`` (:mod:`speechpipe.pipes.order._plans`) are
importable from here too.

A typical chain::

    shards = IterableWrapper(["data/{10_1000,1000_2000}/data-*.tar"]).list_shards()
    samples = shards.sharded_shuffle(buffer_size=2000, index=True).decode()
"""

from __future__ import annotations

import itertools
import os
import warnings
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Mapping, Sequence

from ...diagnostics import BufferStats, Diagnostics, check_on_error
from ...errors import DataError, MissingDataError, UnsafeInputError, check_int, redact
from ...index import ShardEntry, ShardIndex, is_folder_url, length_seconds
from ...sample import FEATS, KEY, SOURCE, Sample
from ...seeding import Position, derive_rng, process_position
from .._core import (
    IterDataPipe, SampleSource, Seeded, check_seed, functional_datapipe, held_sample,
    identity_list, rng_state,
)
from ..kaldi import iter_ark
from ..shards import ShardReadOptions, group_by_key, iter_tar_members
from ..sources import open_stream
from ._assignment import (
    ShardAssignment, ShardSplit, UnevenSplitWarning, assign_shards, check_position,
    shuffle_shards, uneven_split,
)
from ._entries import index_entries
from ._plans import EpochPlan, PlannedShard
from ._window import drain_pool, shuffle_buffer

__all__ = [
    "FORMATS",
    "ShardedShuffler",
    "ShardedShufflerIterDataPipe",
    "read_shard",
    "shard_assignment",
]

#: Shard formats ``sharded_shuffle`` reads: webdataset tar, Kaldi binary/text ark.
FORMATS = ("tar", "ark")

# Salt of the sample buffer's random stream (part of the public determinism contract: changing
# it changes every epoch's order; the shard order's is in speechpipe.pipes.order._assignment).
_SAMPLES_SALT = "samples"



# --------------------------------------------------------------------------------------------
# Reading one shard sequentially
# --------------------------------------------------------------------------------------------


def read_shard(
    name: str, *, format: str = "tar", allow_pipes: bool = False, timeout: float = 60.0,
    read_options: ShardReadOptions | None = None,
) -> Iterator[Sample]:
    """Open one shard, yield its samples in file order, and close it.

    A tar shard gives raw samples ``{"key", "source", "<field>": bytes, ...}``
    (:func:`~speechpipe.pipes.shards._reader.iter_tar_members` + :func:`~speechpipe.pipes.shards._reader.
    group_by_key`; array and audio fields of 64 KiB or more of a local shard are read-only
    ``memoryview`` s of the memory-mapped file unless ``read_options`` say otherwise); an ark gives ``{"key", "feats": float32 (frames, dim), "source"}``
    (:func:`iter_ark`). The stream comes from :func:`~speechpipe.pipes.sources._files.open_stream`
    (a path, an ``http(s)://`` URL, or with ``allow_pipes`` a ``pipe:`` command) and is closed
    when the shard is done or the consumer stops; closing checks the transfer (an HTTP body
    cut short, a command's exit status).

    Raises:
        MissingDataError: the shard does not exist (or an HTTP 404, an unreachable host).
        DataError: a truncated or corrupt shard, naming it and the member, key or offset.
        UnsafeInputError: ``pipe:`` without ``allow_pipes``; a pickled object in an ark.

    >>> import os, tempfile
    >>> from speechpipe.pipes.shards import write_shard
    >>> path = os.path.join(tempfile.mkdtemp(), "data-00000.tar")
    >>> write_shard(path, [{"key": "u1", "txt": "hi"}, {"key": "u2", "txt": "yo"}])
    2
    >>> [(s["key"], s["txt"]) for s in read_shard(path)]
    [('u1', b'hi'), ('u2', b'yo')]
    """
    if format not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {format!r}")
    remote = read_options.remote if read_options is not None else None
    stream = open_stream(name, allow_pipes=allow_pipes, timeout=timeout, remote=remote)
    try:
        if format == "tar":
            yield from group_by_key(
                iter_tar_members(stream, source=name, read_options=read_options), source=name)
        else:
            shown = redact(name)  # a signed URL's credentials hidden, as group_by_key does
            for key, feats in iter_ark(stream, source=name):
                yield {KEY: key, FEATS: feats, SOURCE: shown}
    finally:
        stream.close()


# How the errors of a server that fails (5xx, timeouts, retries spent) start: open_stream's
# HTTP status, remote's range and size requests, the HTTP deadlines.
_UNREACHABLE = ("HTTP 5", "gave up ", "no answer within", "the server sent ", "read failed")


def _skip_reason(error: Exception) -> str:
    if isinstance(error, MissingDataError):
        return "missing shard"
    if isinstance(error, UnsafeInputError):
        return "unsafe shard (rest of the shard skipped)"
    reason = getattr(error, "reason", str(error))
    if reason.startswith(_UNREACHABLE):  # the server, not the shard: not "corrupt"
        return "unreachable shard: server errors or timeouts (rest of the shard skipped)"
    if "truncated" in reason or "cut short" in reason:
        return "truncated shard (rest of the shard skipped)"
    return "corrupt shard (rest of the shard skipped)"


def _loss(name: str, error: Exception, live: dict) -> dict:
    """What skipping the rest of shard ``name`` loses, from the index (``live["entries"]``):
    the utterances after the ``live["offset"]`` read, their seconds, and the report's line."""
    entry = (live.get("entries") or {}).get(name)
    if entry is None:
        return {"example": f"skipped shard {name}: utterances lost unknown (no index); {error}"}
    rest = entry.lengths[live["offset"]:]
    stride = live.get("stride")
    if stride is not None:  # this process's share of them
        rest = rest[(stride[0] - live["seen"]) % stride[1]::stride[1]]
    seconds = sum(rest) * live["seconds_per_length"]
    return {"lost": len(rest), "seconds": seconds,
            "example": f"skipped shard {name}: {len(rest)} utterances, {seconds:.1f} s; {error}"}


@dataclass(frozen=True)
class _Reading:
    """How a ``sharded_shuffle`` pipe reads its shards: the format and opening options of
    :func:`read_shard`, and what a bad shard does (``on_error``, counted in ``diagnostics``)."""

    format: str
    allow_pipes: bool
    read_options: ShardReadOptions | None
    on_error: str
    diagnostics: Diagnostics

    def open(self, name: str) -> Iterator[Sample]:
        return read_shard(name, format=self.format, allow_pipes=self.allow_pipes,
                          read_options=self.read_options)


@dataclass(frozen=True)
class _SkipTo:
    """Where a resumed reader starts: at ``shard`` (its place in the plan), whose first
    ``offset`` samples are read but not yielded; those with a key in ``wanted`` go to
    ``picked`` (``{(shard name, key): sample}``)."""

    shard: int
    offset: int
    wanted: set[str] | None
    picked: dict


def _read_shards(names: Sequence[str], reading: _Reading, live: dict,
                 skip_to: _SkipTo | None = None) -> Iterator[Sample]:
    """Samples of each shard in turn; under ``"skip"`` a bad shard is counted and left.

    ``live`` records the position (``"shard"``, ``"offset"``: samples read from it) and
    ``"drain"`` at the end; ``skip_to`` starts later (resuming).
    """
    names = list(names)
    start, skip = (0, 0) if skip_to is None else (skip_to.shard, skip_to.offset)
    stride = live.get("stride")
    live.setdefault("seen", 0)
    for i in range(start, len(names)):
        name = names[i]
        live["shard"], live["offset"] = i, 0
        if name.startswith("pipe:") and not reading.allow_pipes:  # a setup error: never skipped
            raise UnsafeInputError(
                "refusing to run a shell command; pass allow_pipes=True to read 'pipe:' shards",
                source=name,
            )
        try:
            for sample in reading.open(name):
                live["offset"] += 1
                seen, live["seen"] = live["seen"], live["seen"] + 1
                if live["offset"] <= skip:
                    if skip_to.wanted and sample[KEY] in skip_to.wanted:
                        skip_to.picked[(redact(name), sample[KEY])] = sample
                    continue
                if stride is not None and seen % stride[1] != stride[0]:
                    continue  # another process's sample (a sample-level split)
                yield sample
        except (DataError, MissingDataError) as err:
            reading.diagnostics.handle(reading.on_error, err, _skip_reason(err),
                                       **_loss(name, err, live))
        else:
            if live["offset"] < skip:  # a resumed position past the shard's end
                raise DataError(f"resume: the state says {skip} samples of this shard were "
                                f"read, but it has {live['offset']}; the state was edited or "
                                "the shard changed since it was saved", source=name)
        skip = 0
    live["drain"] = True


def _pick_samples(wanted: Mapping[str, set[str]], reading: _Reading,
                  real: Mapping[str, str] | None = None) -> dict:
    """``{(shard, key): sample}`` for the wanted keys of each shard, each shard read from its
    start up to the last wanted key only (resuming). Shards are named as a state names them
    (credentials redacted); ``real`` maps such a name to the one to open (today's signed URL)."""
    found: dict = {}
    for name, keys in wanted.items():
        left = set(keys)
        if not left:
            continue
        shard = reading.open((real or {}).get(name, name))
        try:
            for sample in shard:
                if sample[KEY] in left:
                    found[(name, sample[KEY])] = sample
                    left.discard(sample[KEY])
                    if not left:
                        break
        finally:
            shard.close()
        if left:
            raise DataError(f"resume: {len(left)} held sample(s) are not in the shard any more",
                            source=name, key=sorted(left)[0])
    return found


# --------------------------------------------------------------------------------------------
# The pipe
# --------------------------------------------------------------------------------------------


@functional_datapipe("sharded_shuffle")
class ShardedShufflerIterDataPipe(Seeded, SampleSource, IterDataPipe[Sample]):
    """Read shards in shuffled order, then shuffle samples (functional name: ``sharded_shuffle``).

    Consumes shard names -- paths, ``http(s)://`` or object-storage (``s3://``...) URLs or
    (opt-in) ``pipe:`` commands, e.g. from ``list_shards`` or :func:`kaldi_arks`, or a folder
    ``pack`` wrote (its index's shards, every length group's) -- and yields samples:

    - ``format="tar"``: raw samples ``{"key", "source", "<field>": bytes, ...}`` (webdataset
      naming, as ``read_shards``; array and audio fields of 64 KiB or more of local shards are
      read-only ``memoryview`` s of the memory-mapped shard, see ``read_options``); the buffer holds
      compact encoded bytes, so follow with ``decode``;
    - ``format="ark"``: ``{"key", "feats": float32 (frames, dim), "source"}`` from Kaldi arks.

    Each pass (epoch):

    1. the shard names are read from the source and shuffled with ``(seed, epoch)`` -- the
       same order on every rank and worker (:func:`~speechpipe.pipes.order._assignment.shuffle_shards`);
    2. this process keeps its part (:func:`~speechpipe.pipes.order._assignment.split_shards`): the
       order is split between the ranks (rank and world size from ``torch.distributed`` when
       it is initialised), then between each rank's DataLoader workers -- with an index,
       balanced by total length, else round robin by count; ``split`` can also make shard
       counts per rank equal (:class:`~speechpipe.pipes.order._assignment.ShardSplit`). Do not add
       ``sharding_filter``: the split is done here, at the shard level. When whole shards
       share out so unevenly that ranks stepping together would drop or repeat more than 5 %
       of the epoch (few shards for many ranks and workers), rank 0's first worker warns
       with the figures and the fixes (:class:`~speechpipe.pipes.order._assignment.
       UnevenSplitWarning`); ``split=ShardSplit(level="sample")`` splits samples instead;
    3. its shards are opened and read sequentially, one at a time (:func:`read_shard`);
    4. samples are shuffled in a buffer of ``buffer_size``
       (:func:`~speechpipe.pipes.order._window.shuffle_buffer`) seeded with ``(seed, epoch, rank,
       worker)``.

    ``set_epoch(e)`` (or ``speechpipe.set_epoch``) changes both orders; the same seed and
    epoch give the same output. Every sample of every shard comes out once per epoch (over
    all ranks and workers; ``ShardSplit(equalize=...)`` repeats or drops whole shards,
    counted in :func:`shard_assignment`).

    **Length.** With ``index``, ``len()`` is exact: the sum of the index counts of the shards
    this process reads in the current epoch -- every shard in the main process; inside a
    DataLoader worker, that worker's shards. (``len(DataLoader)`` calls it in the main process,
    so it is the total over the workers.) Without ``index``, ``len()`` raises ``TypeError``.
    :meth:`epoch_plan` returns the shards, counts and bytes of an epoch, for
    :class:`~speechpipe.pipes.order._plans.EpochProgress`, resuming and balancing ranks
    (:meth:`epoch_plans`: every process's, for
    :class:`~speechpipe.pipes.distributed._steps.StepPlanner`).

    Args:
        source_datapipe: shard names (an ``IterDataPipe`` or a list); listed again each pass.
        buffer_size: samples in the shuffle buffer (``1``: each shard in file order). Larger
            mixes more, costs memory (encoded samples) and a longer first fill. Use at least
            a shard's worth of samples to mix shards with each other. ``buffers`` counts what
            it holds (:class:`~speechpipe.diagnostics.BufferStats`; a mapped view: its bytes).
        format: ``"tar"`` or ``"ark"``.
        seed: base seed of both shuffles.
        index: ``None``; ``True`` to read the ``index.jsonl`` beside the shards
            (:meth:`ShardIndex.for_shards <speechpipe.index.ShardIndex.for_shards>`; local
            folders, or object-storage ones such as ``s3://bucket/corpus/index.jsonl``, read
            with ``read_options.remote``), lazily at the first ``len()``/pass and then kept; or a
            :class:`~speechpipe.index.ShardIndex` (for URLs: an entry matches the URL sharing
            the longest tail of path components).
        allow_pipes: allow ``pipe:`` names (shell commands whose stdout is the shard).
        split: how shards are split between ranks and workers
            (:class:`~speechpipe.pipes.order._assignment.ShardSplit`; default: balanced by length
            with an index, by count without, shard counts per rank not equalised).
        on_error: ``"raise"`` (default): a missing, truncated or corrupt shard raises a
            :class:`~speechpipe.errors.DataError` (or ``MissingDataError``) naming it;
            ``"skip"``: the rest of that shard is skipped -- samples already read from it
            stay -- and counted in :attr:`diagnostics`, with a warning at the end of the pass.
        read_options: how tar shards are read: local ones mapped and read ahead or not,
            object-storage ones with ``read_options.remote``
            (:class:`~speechpipe.pipes.shards._reader.ShardReadOptions`; ``None``: its defaults;
            ``ShardReadOptions(mmap=False)`` on storage that reports read errors, see
            :mod:`speechpipe.pipes.shards._reader`).

    >>> import os, tempfile
    >>> from speechpipe import IterableWrapper
    >>> from speechpipe.pipes.shards import ShardWriter
    >>> out = tempfile.mkdtemp()
    >>> with ShardWriter(os.path.join(out, "data-%05d.tar"), maxcount=3) as writer:
    ...     for i in range(9):
    ...         writer.write({"key": f"utt{i}", "txt": f"text {i}"})
    >>> pipe = IterableWrapper(writer.paths).sharded_shuffle(buffer_size=1, seed=0)
    >>> [s["key"] for s in pipe]  # whole shards in a shuffled order, each in file order
    ['utt3', 'utt4', 'utt5', 'utt6', 'utt7', 'utt8', 'utt0', 'utt1', 'utt2']
    >>> [s["key"] for s in pipe.set_epoch(1)]
    ['utt6', 'utt7', 'utt8', 'utt0', 'utt1', 'utt2', 'utt3', 'utt4', 'utt5']
    >>> pipe = IterableWrapper(writer.paths).sharded_shuffle(buffer_size=4, seed=0)
    >>> keys = [s["key"] for s in pipe]
    >>> again = [s["key"] for s in pipe.set_epoch(0)]  # without set_epoch: the next epoch
    >>> sorted(keys) == [f"utt{i}" for i in range(9)], keys == again
    (True, True)
    """

    def __init__(
        self,
        source_datapipe: IterDataPipe[str] | Sequence[str],
        buffer_size: int = 1000,
        *,
        format: str = "tar",
        seed: int = 0,
        index: ShardIndex | bool | None = None,
        allow_pipes: bool = False,
        split: ShardSplit | None = None,
        on_error: str = "raise",
        read_options: ShardReadOptions | None = None,
    ) -> None:
        if isinstance(source_datapipe, (str, bytes, os.PathLike)):
            raise TypeError(
                "sharded_shuffle consumes shard names (a pipe or list of them), not one "
                f"{type(source_datapipe).__name__}; e.g. IterableWrapper([pattern]).list_shards()"
            )
        if not isinstance(source_datapipe, IterDataPipe):
            try:
                source_datapipe = list(source_datapipe)
            except TypeError as exc:
                raise TypeError(
                    f"source_datapipe must be a pipe or a list of shard names, got "
                    f"{type(source_datapipe).__name__}"
                ) from exc
        if not isinstance(buffer_size, int) or isinstance(buffer_size, bool) or buffer_size < 1:
            raise ValueError(f"buffer_size must be an int >= 1, got {buffer_size!r}")
        if format not in FORMATS:
            raise ValueError(f"format must be one of {FORMATS}, got {format!r}")
        if index is False:
            index = None
        if not (index is None or index is True or isinstance(index, ShardIndex)):
            raise TypeError(f"index must be None, True or a ShardIndex, got {index!r}")
        if split is None:
            split = ShardSplit()
        if not isinstance(split, ShardSplit):
            raise TypeError(f"split must be a ShardSplit (speechpipe.pipes.distributed._equal), "
                            f"got {split!r}")
        self.source_datapipe = source_datapipe
        self.buffer_size = buffer_size
        self.format = format
        self.seed = check_seed(seed)
        self.epoch = 0
        self.index = index
        self.allow_pipes = bool(allow_pipes)
        self.split = split
        self.on_error = check_on_error(on_error)
        if read_options is not None and not isinstance(read_options, ShardReadOptions):
            raise TypeError(
                f"read_options must be a ShardReadOptions or None, got {read_options!r}")
        self.read_options = read_options
        self.diagnostics = Diagnostics("sharded_shuffle")
        self.buffers = BufferStats("sharded_shuffle")
        self._loaded_index: ShardIndex | None = None  # index=True: read lazily, then kept

    # -- helpers

    def _names(self) -> list[str]:
        names = []
        for name in self.source_datapipe:
            if not isinstance(name, (str, os.PathLike)):
                raise TypeError(
                    f"sharded_shuffle expects shard names (paths or URLs), got {name!r}"
                )
            name = os.fspath(name)
            if os.path.isdir(name):  # pack's output folder: its shards, every group's
                names.extend(ShardIndex.read(name).paths())
            elif is_folder_url(name):  # the same in a bucket
                remote = self.read_options.remote if self.read_options is not None else None
                names.extend(ShardIndex.read(name, remote=remote).paths())
            else:
                names.append(name)
        return names

    def _entries(self, names: list[str]) -> dict[str, ShardEntry] | None:
        if self.index is None:
            return None
        if isinstance(self.index, ShardIndex):
            return index_entries(names, self.index)
        commands = [n for n in names if n.startswith("pipe:")]
        if commands:
            raise ValueError(
                f"index=True reads the index.jsonl beside the shards, but {commands[0]!r} is a "
                "command; pass index=ShardIndex.read(<the index of its shards>)"
            )
        if self._loaded_index is not None:
            try:
                return index_entries(names, self._loaded_index)
            except DataError:
                pass  # the shard list grew: read the folders' indexes again
        remote = self.read_options.remote if self.read_options is not None else None
        self._loaded_index = ShardIndex.for_shards(sorted(set(names)), remote=remote)
        return index_entries(names, self._loaded_index)

    # -- public API

    def epoch_plan(self, epoch: int | None = None, position: Position | None = None) -> EpochPlan:
        """The shards a process reads in an epoch, in order, with counts and bytes.

        Lists the source and, with an index, reads it (the first time). Counts and bytes are
        ``None`` without an index.

        Args:
            epoch: the epoch to plan (default: the current one).
            position: the process to plan for (default: this one,
                :func:`~speechpipe.seeding.process_position`).
        """
        epoch = self.epoch if epoch is None else epoch
        if not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"epoch must be an int >= 0, got {epoch!r}")
        position = process_position() if position is None else position
        if not isinstance(position, Position):
            raise TypeError(f"position must be a speechpipe.seeding.Position, got {position!r}")
        names = self._names()
        return self._plan(names, self._entries(names), epoch, position)

    def epoch_plans(
        self, epoch: int | None = None, *, world_size: int | None = None, num_workers: int = 1
    ) -> tuple[tuple[EpochPlan, ...], ...]:
        """Every process's :meth:`epoch_plan` in an epoch, ``plans[rank][worker]``, from one
        split of the shards (what a planner of all ranks needs: the work of one plan, not of
        ``world_size * num_workers``).

        Args:
            epoch: the epoch to plan (default: the current one).
            world_size: ranks (default: ``torch.distributed``'s world size, else 1).
            num_workers: DataLoader workers per rank (1 without workers).
        """
        epoch = self.epoch if epoch is None else check_int("epoch", epoch, 0)
        names = self._names()
        entries = self._entries(names)
        split = self._assignment(names, entries, epoch, world_size=world_size,
                                 num_workers=num_workers)
        return tuple(
            tuple(_planned(epoch, Position(rank, split.world_size, worker, split.num_workers),
                           split.shards(rank, worker), entries, _stride(split, rank, worker))
                  for worker in range(split.num_workers))
            for rank in range(split.world_size)
        )

    def sample_order(self, plan: EpochPlan, items: Iterable[Any]) -> Iterator[Any]:
        """``items`` -- one per sample of ``plan``, in reading order (e.g. the index's lengths
        of its shards) -- in the order this pipe yields those samples: the same buffer shuffle,
        seeded with ``(seed, plan.epoch, rank, worker)`` of the plan. Exact unless a shard is
        skipped (``on_error="skip"``).

        >>> from speechpipe.seeding import Position
        >>> pipe = ShardedShufflerIterDataPipe(["a.tar"], buffer_size=1)
        >>> list(pipe.sample_order(EpochPlan(0, Position(), ()), [3, 1, 2]))
        [3, 1, 2]
        """
        rng = self._sample_rng(plan.epoch, plan.position)
        return shuffle_buffer(items, self.buffer_size, rng)

    # -- the epoch's split: computed here only

    def _assignment(self, names: list[str], entries: dict[str, ShardEntry] | None, epoch: int,
                    *, world_size: int | None, num_workers: int) -> ShardAssignment:
        """The split of the epoch's shard order between every rank and worker -- the one place
        it is computed, for reading, :meth:`epoch_plan`, :meth:`epoch_plans` and
        :func:`shard_assignment`."""
        return assign_shards(shuffle_shards(names, self.seed, epoch), world_size=world_size,
                             num_workers=num_workers, weights=_weights(entries),
                             split=self.split, unit=self._length_unit())

    def _plan(self, names: list[str], entries: dict[str, ShardEntry] | None, epoch: int,
              position: Position) -> EpochPlan:
        """One process's part of :meth:`_assignment`."""
        check_position(position)
        split = self._assignment(names, entries, epoch, world_size=position.world_size,
                                 num_workers=position.num_workers)
        return _planned(epoch, position, split.shards(position.rank, position.worker), entries,
                        _stride(split, position.rank, position.worker))

    def _sample_rng(self, epoch: int, position: Position):
        return derive_rng(self.seed, epoch, position.rank, position.worker, _SAMPLES_SALT)

    def _length_unit(self) -> str:
        index = self.index if not isinstance(self.index, bool) else self._loaded_index
        return getattr(index, "length_unit", "frames")

    def _seconds_per_length(self) -> float:
        index = self.index if not isinstance(self.index, bool) else self._loaded_index
        return length_seconds(1.0, self._length_unit(),  # at the rate pack records
                              sample_rate=getattr(index, "sample_rate", None) or 16000)

    def __iter__(self) -> Iterator[Sample]:
        if self._replay_request is not None:  # re-read samples held above (request_replay)
            request, self._replay_request = self._replay_request, None
            yield from self._replay(request)
            return
        self._begin_pass()
        prepared, self._prepared = self._prepared, None
        if prepared is None:
            prepared = self._start(self._take_resume()[0], [])
        samples, draining, live = prepared
        self._live = live
        meter = self.buffers
        meter.reset()
        meter.add(list(live["buffer"]))  # a resumed buffer (undecoded: bytes or mapped views)
        try:
            if draining:  # the shards had ended: the buffer's rest, in the order drawn
                yield from drain_pool(live["buffer"], meter)
            else:
                yield from shuffle_buffer(samples, self.buffer_size, live["rng"],
                                          buffer=live["buffer"], meter=meter)
        finally:
            self._live = self._replay_cache = None
        self.diagnostics.warn_if_skipped()

    def _start(self, state: dict | None, needs: list) -> tuple[Iterator[Sample], bool, dict]:
        """Plan this process's epoch and open the reader: from the start, or where ``state``
        stood (then also reading the ``needs`` of the stages below, see :meth:`_resume`)."""
        position = process_position()
        names = self._names()
        entries = self._entries(names)  # read the index (once) before any shard is opened
        check_position(position)
        split = self._assignment(names, entries, self.epoch, world_size=position.world_size,
                                 num_workers=position.num_workers)
        plan = _planned(self.epoch, position, split.shards(position.rank, position.worker),
                        entries, _stride(split, position.rank, position.worker))
        if position.rank == 0 and position.worker == 0:  # once, not in every process
            message = uneven_split(split, *(None, None) if entries is None else (
                {n: e.count for n, e in entries.items()}, _weights(entries)))
            if message is not None:
                warnings.warn(f"sharded_shuffle: {message}", UnevenSplitWarning, stacklevel=3)
        mine = plan.names
        self.diagnostics.reset()
        if entries is not None:
            self.diagnostics.planned = plan.total_count
        rng = self._sample_rng(self.epoch, position)
        live = {"rng": rng, "buffer": [], "shard": 0, "offset": 0, "drain": False, "plan": mine,
                "entries": entries, "seconds_per_length": self._seconds_per_length(), "seen": 0,
                "stride": _stride(split, position.rank, position.worker),
                "real": {redact(n): n for n in names}}
        if state is None:
            return self._read(mine, live), False, live
        samples, draining = self._resume(state, mine, entries, live, needs)
        return samples, draining, live

    # -- exact resume (the SampleSource protocol, driven by speechpipe.pipes._core._restore)

    rereads_held = True
    _replay_request: list | None = None  # samples held above, to read again (request_replay)
    _replay_cache: dict | None = None  # those samples, read once by prepare_resume
    _prepared: tuple | None = None  # the reader positioned by prepare_resume

    def prepare_resume(self, needs: list) -> None:
        """Position the reader where the loaded state stood and read, once, both the samples
        of its own buffer and ``needs`` (held by the stages above; served to their replay
        passes from a cache)."""
        state, _ = self._take_resume()
        if state is not None:
            self._prepared = self._start(state, needs)

    def request_replay(self, needs: list | None) -> None:
        """The next pass yields exactly the samples ``needs`` names, read again (from the
        cache :meth:`prepare_resume` filled, else from their shards); ``None`` cancels."""
        self._replay_request = None if needs is None else list(needs)

    def end_pass(self) -> None:
        super().end_pass()
        prepared, self._prepared, self._replay_cache = self._prepared, None, None
        if prepared is not None:
            close = getattr(prepared[0], "close", None)
            if close is not None:
                close()

    def _reading(self) -> _Reading:
        return _Reading(self.format, self.allow_pipes, self.read_options, self.on_error,
                        self.diagnostics)

    def _read(self, mine: list[str], live: dict,
              skip_to: _SkipTo | None = None) -> Iterator[Sample]:
        return _read_shards(mine, self._reading(), live, skip_to)

    def _snapshot(self, live: dict) -> dict:
        plan, shard = live["plan"], live["shard"]
        return {
            "epoch": self.epoch,
            "shards": len(plan),
            "name": redact(plan[shard]) if shard < len(plan) else None,  # no credentials
            "shard": shard,
            "offset": live["offset"],
            "seen": live["seen"],
            "drain": live["drain"],
            "rng": live["rng"].getstate(),
            "buffer": identity_list(live["buffer"]),
        }

    def _resume(self, state: dict, mine: list[str], entries: dict | None, live: dict,
                needs: list):
        """Position the reader where ``state`` stood and rebuild the shuffle buffer.

        Shards before the current one are not opened, except to re-read the samples still held
        (in this buffer, or ``needs`` of the stages below): each such shard once, from its
        start up to its last held sample. The current shard's first ``offset`` samples are read
        once (held ones kept) and not yielded; with an index, a finished shard is not opened.
        """
        _check_position_state(state, entries)
        start, skip = state["shard"], state["offset"]
        name = mine[start] if start < len(mine) else None
        shown = None if name is None else redact(name)  # as a state names shards
        if len(mine) != state["shards"]:
            raise DataError(
                f"resume: this process reads {len(mine)} shards this epoch but the state was "
                f"saved reading {state['shards']} (at {state['name']!r}); the shard list, index, "
                "split, seed, epoch or number of workers changed",
                source=name,
            )
        if shown != state["name"]:
            raise DataError(
                f"resume: shard {start + 1} of this process's {len(mine)} this epoch is "
                f"{shown!r}, but the state was saved reading {state['name']!r} there; the shard "
                "order differs (the seed, the shard list or its names, the split or the number "
                "of workers changed)",
                source=name,
            )
        live["rng"].setstate(rng_state(state["rng"]))
        live["shard"], live["offset"] = start, skip
        live["seen"] = state.get("seen", 0) - skip  # samples read before the current shard
        wanted: dict[str, set[str]] = {}
        for src, key in list(state["buffer"]) + list(needs):
            wanted.setdefault(src, set()).add(key)
        picked: dict = {}
        samples: Iterator[Sample] = iter(())
        if state["drain"]:
            live["drain"] = True
        else:
            if name is not None and entries is not None and skip >= entries[name].count:
                start, skip = start + 1, 0  # finished: not opened again
                live["seen"] += entries[name].count
            reader = self._read(mine, live, _SkipTo(start, skip, wanted.get(shown), picked))
            first = next(reader, _END)  # reads the skipped part, picking held samples in it
            samples = reader if first is _END else itertools.chain([first], reader)
        rest = {src: {k for k in keys if (src, k) not in picked} for src, keys in wanted.items()}
        picked.update(_pick_samples(rest, self._reading(), live["real"]))
        live["buffer"][:] = [held_sample(picked, ident) for ident in state["buffer"]]
        self._replay_cache = picked
        return samples, bool(state["drain"])

    def _replay(self, request: list) -> Iterator[Sample]:
        found = self._replay_cache
        if found is None or any(tuple(ident) not in found for ident in request):
            wanted: dict[str, set[str]] = {}
            for src, key in request:
                wanted.setdefault(src, set()).add(key)
            found = _pick_samples(wanted, self._reading(),
                                  {redact(n): n for n in self._names()})
        for ident in request:
            yield held_sample(found, ident)

    def __len__(self) -> int:
        if self.index is None:
            raise TypeError(
                "sharded_shuffle has no len() without an index: a shard's sample count is "
                "known only after reading it; pass index=True (the index.jsonl that pack "
                "writes beside the shards) or index=ShardIndex(...)"
            )
        return self.epoch_plan().total_count


def _check_position_state(state: Mapping, entries: dict | None) -> None:
    """A ``DataError`` naming what is impossible in a saved position (a state edited by hand or
    damaged): numbers out of range, an offset past its shard's count (with an index)."""
    fields = {name: state.get(name) for name in ("shards", "shard", "offset", "seen")}
    for field, value in fields.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise DataError(f"resume: the state's {field} must be an int >= 0, got {value!r}",
                            source=state.get("name"))
    if fields["shard"] >= fields["shards"] > 0 or fields["shard"] > fields["shards"]:
        raise DataError(f"resume: the state is at shard {fields['shard']} of "
                        f"{fields['shards']}, past the last one", source=state.get("name"))
    if fields["offset"] > fields["seen"]:
        raise DataError(f"resume: the state has read {fields['offset']} samples of its shard "
                        f"but {fields['seen']} in all", source=state.get("name"))
    entry = None if entries is None else entries.get(state.get("name"))
    if entry is not None and fields["offset"] > entry.count:
        raise DataError(f"resume: the state says {fields['offset']} samples of this shard were "
                        f"read, but the index counts {entry.count}; the state was edited or "
                        "the shard changed since it was saved", source=state.get("name"))


def shard_assignment(
    sharded: Any,
    epoch: int | None = None,
    *,
    world_size: int | None = None,
    num_workers: int = 1,
) -> ShardAssignment:
    """The assignment a ``sharded_shuffle`` pipe makes in ``epoch`` (default: its current
    one), for every rank: lists the shards and reads the index (if the pipe has one), reads no
    shard. ``print(shard_assignment(pipe).report())`` shows the per-rank balance and the
    repeated or dropped shards.

    Args:
        sharded: a ``sharded_shuffle`` pipe (:class:`~speechpipe.pipes.order._streaming.ShardedShuffler`).
        epoch: the epoch (default: the pipe's current epoch).
        world_size: ranks (default: ``torch.distributed``'s, else 1).
        num_workers: DataLoader workers per rank (1 without workers).
    """
    if not isinstance(sharded, ShardedShufflerIterDataPipe):
        raise TypeError(f"sharded must be a sharded_shuffle pipe, got {sharded!r}")
    epoch = sharded.epoch if epoch is None else check_int("epoch", epoch, 0)
    names = sharded._names()
    return sharded._assignment(names, sharded._entries(names), epoch, world_size=world_size,
                               num_workers=num_workers)

def _planned(epoch: int, position: Position, names: list[str],
             entries: dict[str, ShardEntry] | None,
             stride: tuple[int, int] | None = None) -> EpochPlan:
    """The plan of a process reading ``names``, with counts, bytes and lengths from the index
    (``None`` without one); with a sample-level ``stride`` ``(slot, slots)``, the counts and
    lengths of the samples the process keeps (every ``slots``-th read, from ``slot`` on)."""
    if entries is None:
        return EpochPlan(epoch, position, tuple(PlannedShard(n) for n in names))
    shards, seen = [], 0
    for n in names:
        lengths = entries[n].lengths
        if stride is not None:
            lengths = lengths[(stride[0] - seen) % stride[1]::stride[1]]
            seen += entries[n].count
        if not hasattr(lengths, "array"):  # a mapped view stays one: nothing per utterance
            lengths = tuple(lengths)
        shards.append(PlannedShard(n, len(lengths), entries[n].bytes, lengths))
    return EpochPlan(epoch, position, tuple(shards))


def _stride(split: ShardAssignment, rank: int, worker: int) -> tuple[int, int] | None:
    """``(slot, slots)`` of a process under a sample-level split, else ``None``: sample ``i``
    (in reading order) goes to rank ``i % ranks``, and within it to worker ``(i // ranks) %
    workers`` -- so a rank's samples do not depend on its number of workers, and ``len()``
    in the main process is the sum of its workers'."""
    if split.level != "sample":
        return None
    return worker * split.world_size + rank, split.world_size * split.num_workers


def _weights(entries: dict[str, ShardEntry] | None) -> dict[str, float] | None:
    """Total length per shard name (what the split balances), or None without an index."""
    if entries is None:
        return None
    return {name: entry.total_length for name, entry in entries.items()}


_END = object()

ShardedShuffler = ShardedShufflerIterDataPipe

