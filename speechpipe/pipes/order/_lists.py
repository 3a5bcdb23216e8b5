"""Sources over sample lists held in memory, split between processes, resumable exactly.

A pipeline over manifests starts from one of these: each pass yields this process's share of
one order of all the rows (paths, transcripts, durations -- not audio), the same in every
process. Over local JSON-lines manifests (``read_manifest_files``, and ``filter_by_duration``
over it) the rows are ordered through their memory-mapped row table
(:mod:`speechpipe.compact`) and each is parsed when it is yielded; over any other source they
are read whole each pass:

- ``shuffle_samples`` (:class:`SampleShufflerIterDataPipe`): a permutation drawn from
  ``(seed, epoch)`` -- for training. It replaces torch's ``shuffle`` (whose buffer lives in
  its generator and cannot be saved) followed by ``sharding_filter``.
- ``split_samples`` (:class:`SampleSplitterIterDataPipe`): the source's order -- for
  evaluation. It replaces ``sharding_filter``.

Their state is a position, so a resumed pass starts at the next sample, and the stages above
that held samples (``bucket_by_length``, ``block_batch``) get them back by key
(:mod:`speechpipe.pipes._core._restore`).
"""

from __future__ import annotations

from typing import Iterable, Iterator, Sequence

import numpy as np

from ...diagnostics import BufferStats
from ...errors import DataError
from ...sample import KEY, SOURCE, Sample
from ...seeding import CarriesRank, derive_rng, process_position
from .._core import functional_datapipe, IterDataPipe
from .._core import check_seed, SampleSource, Seeded
from ...seeding import derive_seed

__all__ = ["FeistelOrder", "SampleShuffler", "SampleShufflerIterDataPipe", "SampleSplitter",
           "SampleSplitterIterDataPipe"]


def _keyed(samples: list, name: str) -> dict[str, int]:
    """Position of each sample by key; a sample without a string key or a repeated key is a
    ``DataError`` naming it (held samples are found again by key)."""
    where: dict[str, int] = {}
    for i, sample in enumerate(samples):
        key = sample.get(KEY) if isinstance(sample, dict) else None
        if not isinstance(key, str):
            raise DataError(f"{name} needs sample dicts with a string 'key'; item {i} "
                            f"is {type(sample).__name__}"
                            + (f" with key {key!r}" if isinstance(sample, dict) else ""),
                            source=sample.get(SOURCE) if isinstance(sample, dict) else None)
        if key in where:
            raise DataError(f"{name}: the same key twice in the source (keys must be "
                            "unique to resume exactly)", key=key, source=sample.get(SOURCE))
        where[key] = i
    return where


_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


class FeistelOrder:
    """Positions ``first, first + step, ...`` of ``range(n)`` permuted by a keyed bijection:
    a 4-round Feistel network over the smallest even number of bits covering ``n``, walked
    until it lands inside ``range(n)`` (cycle walking keeps it a permutation). Costs O(1)
    memory and no time up front, whatever ``n``: the order is computed in chunks of
    positions as it is read (numpy, tens of nanoseconds a position), so a pass over 15
    million rows starts, or resumes at any position, at once.

    >>> order = FeistelOrder(10, key=7)
    >>> sorted(order[i] for i in range(len(order))) == list(range(10))
    True
    >>> [order[i] for i in range(1, 10, 3)] == [FeistelOrder(10, 7, 1, 3)[i] for i in range(3)]
    True
    """

    CHUNK = 1 << 15

    def __init__(self, n: int, key: int, first: int = 0, step: int = 1) -> None:
        self.n, self.first, self.step = n, first, step
        bits = max(2, (max(n - 1, 1)).bit_length())
        self.half = (bits + 1) // 2
        self.mask = np.uint64((1 << self.half) - 1)
        rng = np.random.default_rng(key)
        self.keys = [np.uint64(k) for k in rng.integers(0, 2**63, size=4, dtype=np.int64)]
        self.count = len(range(first, n, step))
        self._chunk = -1
        self._values = np.zeros(0, np.int64)

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> int:
        if not 0 <= i < self.count:
            raise IndexError(i)
        chunk = i // self.CHUNK
        if chunk != self._chunk:
            lo = chunk * self.CHUNK
            hi = min(lo + self.CHUNK, self.count)
            positions = self.first + np.arange(lo, hi, dtype=np.int64) * self.step
            self._values, self._chunk = self._permute(positions.astype(np.uint64)), chunk
        return int(self._values[i - chunk * self.CHUNK])

    def take(self, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """``order[lo:hi]`` as an ``int64`` array, computed at once (no Python int per row).

        >>> order = FeistelOrder(10, key=7, first=1, step=3)
        >>> order.take().tolist() == [order[i] for i in range(len(order))]
        True
        """
        hi = self.count if hi is None else min(hi, self.count)
        lo = min(max(lo, 0), hi)
        positions = self.first + np.arange(lo, hi, dtype=np.int64) * self.step
        return self._permute(positions.astype(np.uint64))

    def _encrypt(self, x: np.ndarray) -> np.ndarray:
        half, mask = np.uint64(self.half), self.mask
        left, right = x >> half, x & mask
        for k in self.keys:
            f = (right ^ k) * np.uint64(0x9E3779B97F4A7C15)
            f ^= f >> np.uint64(29)
            f = (f * np.uint64(0xBF58476D1CE4E5B9)) ^ (f >> np.uint64(32))
            left, right = right, left ^ (f & mask)
        return (left << half) | right

    def _permute(self, x: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore"):
            x = self._encrypt(x)
            outside = np.flatnonzero(x >= np.uint64(self.n))
            while outside.size:
                x[outside] = self._encrypt(x[outside])
                outside = outside[x[outside] >= np.uint64(self.n)]
        return x.astype(np.int64)


class _ListRows:
    """A sample list read whole for the pass, by position, found again by key."""

    def __init__(self, samples: list, name: str) -> None:
        self.held = samples
        self.where = _keyed(samples, name)

    def __len__(self) -> int:
        return len(self.held)

    def sample(self, i: int) -> Sample:
        return self.held[i]

    def find(self, key: str) -> Sample | None:
        i = self.where.get(key)
        return None if i is None else self.held[i]


def source_rows(source: object):
    """The mapped rows a source offers (``row_table()``: ``read_manifest_files``, and
    ``filter_by_duration`` over it), or ``None``: the source is read as samples."""
    try:
        offer = getattr(source, "row_table")
    except AttributeError:
        return None
    return offer() if callable(offer) else None


#: Rows whose bytes mapped rows read at once (in the file's order), each parsed when taken.
READ_AHEAD = 512


def _taken(rows, mine: Sequence[int], start: int) -> Iterator[Sample]:
    """``rows.sample(mine[i])`` for ``i`` from ``start`` on; mapped rows (``samples``) read
    :data:`READ_AHEAD` rows' bytes at a time."""
    many = getattr(rows, "samples", None)
    if many is None:
        for i in range(start, len(mine)):
            yield rows.sample(int(mine[i]))
        return
    for first in range(start, len(mine), READ_AHEAD):
        yield from many([int(mine[i]) for i in range(first, min(first + READ_AHEAD, len(mine)))])


class _SampleList(CarriesRank, SampleSource):
    """A source yielding this process's share of an order over a sample list read whole each
    pass; resumable at any sample (the position), held samples found again by key. A mixin
    of the two pipes below (its ``__iter__`` is a plain generator, outside torch's hook)."""

    rereads_held = True

    def __init__(self, source_datapipe: Iterable[Sample], *, split: bool = True) -> None:
        if not isinstance(split, bool):
            raise TypeError(f"split must be a bool, got {split!r}")
        self.source_datapipe = source_datapipe
        self.split = split
        self._prepared = None  # the rows read for a resumed pass and its replays
        self._replay_request: list | None = None
        self.buffers = BufferStats(self._name)  # the whole list, for the pass

    def __getstate__(self) -> dict:
        state = super().__getstate__()  # CarriesRank's: the rank goes to spawned workers
        state["_prepared"] = None  # a pass's samples stay in the process that read them
        return state

    # -- the order

    def _share(self) -> tuple[int, int]:
        """``(first, step)``: this process's positions in the epoch's order."""
        if not self.split:
            return 0, 1
        where = process_position()
        return where.worker * where.world_size + where.rank, where.world_size * where.num_workers

    def _permutation_key(self) -> int | None:
        """The key of the epoch's permutation of the source's positions (``None``: the
        source's order)."""
        return None

    def _order(self, n: int) -> Sequence[int]:
        """This process's positions, in the epoch's order: a ``range``, or its share of one
        permutation of all positions (:class:`FeistelOrder`, O(1) memory)."""
        first, step = self._share()
        key = self._permutation_key()
        return range(first, n, step) if key is None else FeistelOrder(n, key, first, step)

    def _read(self):
        """The pass's rows: the source's mapped rows when it offers them (nothing held per
        row), else its samples read whole."""
        rows = source_rows(self.source_datapipe)
        if rows is None:
            return _ListRows(list(self.source_datapipe), self._name)
        if len(rows.tables) > 1:
            repeated = rows.repeated_key()
            if repeated is not None:
                raise DataError(f"{self._name}: the same key twice in the source (keys must "
                                "be unique to resume exactly)", key=repeated[KEY],
                                source=repeated.get(SOURCE))
        return rows

    # -- passes

    def __iter__(self) -> Iterator[Sample]:
        if self._replay_request is not None:  # samples held above, again (request_replay)
            request, self._replay_request = self._replay_request, None
            yield from self._replay(request)
            return
        if isinstance(self, Seeded):
            self._begin_pass()
        prepared, self._prepared = self._prepared, None
        state, _ = self._take_resume()
        rows = prepared if prepared is not None else self._read()
        total = len(rows)
        mine = self._order(total)
        start = 0 if state is None else self._resume_at(state, total, len(mine))
        live = self._live = {"next": start, "total": total, "count": len(mine)}
        held = getattr(rows, "held", None)  # mapped rows hold no sample
        self.buffers.reset()
        if held is not None:
            self.buffers.add(held)  # held whole until the pass ends
        try:
            for i, sample in enumerate(_taken(rows, mine, start), start):
                live["next"] = i + 1
                yield sample
        finally:
            self._live = None
            if held is not None:
                self.buffers.remove(held)

    def _resume_at(self, state: dict, total: int, count: int) -> int:
        if state.get("total") != total or state.get("count") != count:
            raise DataError(
                f"resume: {self._name} reads {total} samples ({count} for this process) but "
                f"the state was saved with {state.get('total')} ({state.get('count')}); the "
                "source, split or number of workers changed (a job that moves between "
                "topologies plans its batches: train_pipeline(..., streams=8) or plan_batches)")
        position = state.get("next")
        if not isinstance(position, int) or isinstance(position, bool) \
                or not 0 <= position <= count:
            raise DataError(f"resume: {self._name}'s state is at sample {position!r} of this "
                            f"process's {count}; the state was edited or damaged")
        return position

    def _snapshot(self, live: dict) -> dict:
        return dict(live)

    def __len__(self) -> int:
        try:
            total = len(self.source_datapipe)  # type: ignore[arg-type]
        except TypeError:
            raise TypeError(f"{self._name} has no len() when its source has none (e.g. "
                            "parse_manifest): the count is known after the first pass") from None
        first, step = self._share()
        return len(range(first, total, step))

    # -- resume (the SampleSource protocol)

    def prepare_resume(self, needs: list) -> None:
        """Read the source once for the resumed pass and the replays of the stages above."""
        if self._resume_state is not None and self._prepared is None:
            self._prepared = self._read()

    def request_replay(self, needs: list | None) -> None:
        """The next pass yields exactly the samples ``needs`` names (found by key)."""
        self._replay_request = None if needs is None else list(needs)

    def _replay(self, request: list) -> Iterator[Sample]:
        if self._prepared is None:
            self._prepared = self._read()
        rows = self._prepared
        many = getattr(rows, "find_many", None)  # mapped rows: one search for them all
        found = many([key for _, key in request]) if many is not None else None
        for n, (_, key) in enumerate(request):
            sample = rows.find(key) if found is None else found[n]
            if sample is None:
                raise DataError(f"resume: a held sample is no longer in the source of "
                                f"{self._name}", key=key)
            yield sample

    def end_pass(self) -> None:
        super().end_pass()
        self._prepared = self._replay_request = None


@functional_datapipe("shuffle_samples")
class SampleShufflerIterDataPipe(Seeded, _SampleList, IterDataPipe[Sample]):
    """Shuffle all samples of a finite source at once (functional name: ``shuffle_samples``).

    Consumes sample dicts with unique ``key`` s (manifest rows, not decoded audio); yields
    the same dicts. Each pass permutes the source's positions with ``(seed, epoch)`` (a keyed
    bijection, :class:`FeistelOrder`: no memory per row) -- one order, the same in every
    process -- and, with ``split``,
    yields only this process's share: every ``n``-th sample of the order for the ``n`` =
    ranks × DataLoader workers (do not add ``sharding_filter``). Over all processes, every
    sample comes out once per epoch.

    Exactly resumable: its state is the position in this process's share, and samples held by
    the stages above are found again by key, so a restored loader repeats the uninterrupted
    run. Use ``sharded_shuffle`` for corpora stored as shards (it never holds the corpus).
    Over ``read_manifest_files`` (what the recipes' builders use for local JSON-lines
    manifests, through ``filter_by_duration`` or not) it orders the rows of their mapped row
    tables and parses each row when it yields it, holding no row; over any other source it
    holds the whole source during a pass: ``self.buffers`` (a
    :class:`~speechpipe.diagnostics.BufferStats`) says how many samples and array bytes.

    Args:
        source_datapipe: sample dicts (e.g. ``parse_manifest`` output), read again each pass.
        seed: seed of the permutation (with the epoch).
        split: split the order between ranks and workers (``False``: every process yields
            all samples, e.g. for evaluation on each rank).
        per_process: with ``split=False``, each process (rank, DataLoader worker) permutes
            with ``(seed, epoch, rank, worker)``, an order of its own -- what a source every
            worker reads whole wants, such as the noise of ``add_noise`` (the same order in
            every worker would give the same noise to the same place of each worker's
            stream).

    >>> import speechpipe
    >>> from speechpipe import IterableWrapper
    >>> rows = [{"key": f"u{i}"} for i in range(6)]
    >>> pipe = IterableWrapper(rows).shuffle_samples(seed=0)
    >>> first = [s["key"] for s in pipe]
    >>> sorted(first) == [f"u{i}" for i in range(6)], first != [s["key"] for s in pipe]
    (True, True)
    >>> first == [s["key"] for s in pipe.set_epoch(0)]  # a new pass is the next epoch
    True
    """

    _name = "shuffle_samples"

    def __init__(self, source_datapipe: Iterable[Sample], *, seed: int = 0,
                 split: bool = True, per_process: bool = False) -> None:
        super().__init__(source_datapipe, split=split)
        self.seed = check_seed(seed)
        self.epoch = 0
        if not isinstance(per_process, bool):
            raise TypeError(f"per_process must be a bool, got {per_process!r}")
        if per_process and split:
            raise ValueError("per_process=True needs split=False: a split order is one order "
                             "shared by every process")
        self.per_process = per_process

    def _permutation_key(self) -> int:
        where = process_position() if self.per_process else None
        rank, worker = (where.rank, where.worker) if where is not None else (0, 0)
        return derive_seed(self.seed, self.epoch, rank, worker, "shuffle_samples")

    def _snapshot(self, live: dict) -> dict:
        return {"epoch": self.epoch, **live}


@functional_datapipe("split_samples")
class SampleSplitterIterDataPipe(_SampleList, IterDataPipe[Sample]):
    """Split a sample list between processes, in order (functional name: ``split_samples``).

    Consumes sample dicts with unique ``key`` s (manifest rows); each pass reads the whole
    source and, with ``split``, yields every ``n``-th sample for the ``n`` = ranks × DataLoader
    workers (as ``sharding_filter``, which it replaces), in the source's order. Exactly
    resumable, like ``shuffle_samples``: the evaluation road of the recipes.

    Args:
        source_datapipe: sample dicts (e.g. ``parse_manifest`` output), read again each pass.
        split: split between ranks and workers (``False``: every process yields all samples).

    >>> import speechpipe
    >>> from speechpipe import IterableWrapper
    >>> [s["key"] for s in IterableWrapper([{"key": "a"}, {"key": "b"}]).split_samples()]
    ['a', 'b']
    """

    _name = "split_samples"


SampleShuffler = SampleShufflerIterDataPipe
SampleSplitter = SampleSplitterIterDataPipe
