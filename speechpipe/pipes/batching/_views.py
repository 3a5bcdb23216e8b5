"""Batching views: batches planned from lengths alone, data loaded only for the batches drawn.

The **random-access road** (corpora whose index fits in memory), after SpeeChain's Iterator.
A :class:`BatchView` never touches the data: it holds the length of every utterance (read from
Kaldi/SpeeChain ``data_len`` files such as ``utt2num_frames`` or ``utt2dur`` with
:func:`~speechpipe.pipes.batching._lengths.read_data_len`, or measured once and cached by
:func:`~speechpipe.pipes.batching._lengths.compute_lengths`) and turns them into a **batching view**, a
list of key lists:

1. sort all keys by length (descending by default; ties by key, so the view is deterministic);
2. cut the sorted keys into batches: **block** batches within a budget (any cost model of
   :mod:`speechpipe.pipes.batching._constraints`, packed by
   :func:`~speechpipe.pipes.batching._buckets.pack_batches`), **piece** batches of a fixed count, or a
   custom ``batches_fn`` hook;
3. per epoch, shuffle the order of the batches (never their content) with
   :func:`speechpipe.seeding.derive_rng`, clip or extend to ``batches_per_epoch``, skip
   ``start_step`` batches when resuming, and split each batch between ``world_size`` ranks.

Data is loaded only for the batches drawn, in one of two ways:

- ``batch_by_view`` (:class:`ViewLoaderIterDataPipe`) on a ``MapDataPipe`` (or any mapping
  ``key -> sample``) yields lists of samples, ready for torch's ``collate``;
- :meth:`BatchView.sampler` gives a ``batch_sampler`` for a map-style ``torch.utils.data``
  ``DataLoader``.

Helpers: :func:`~speechpipe.pipes.batching._lengths.select_keys` (SpeeChain's ``data_selection``: keep a
part of the corpus); :func:`form_batches`, :func:`epoch_batches` and :func:`shard_batch`, the
plain functions the view is made of.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Iterable, Iterator, Union

from ...errors import check_int, DataError
from ...seeding import derive_rng, process_position
from .._core import IterDataPipe, MapDataPipe, plain_iterator
from .._core import SampleSource
from ._buckets import pack_batches
from ._constraints import (
    primary_measure, batch_budget, BatchConstraint, BatchStats, OVERSIZE, PaddedArea, SampleCount,
    TwoDimensional,
)
from ._lengths import check_group_info, check_lengths, read_group_labels
from ._sampler import ViewSampler
from ._stream_count import view_streams
from ._length_streams import LengthStreams
from ._streams import StreamPlan, UNEVEN

__all__ = [
    "BatchView",
    "ViewLoader",
    "ViewLoaderIterDataPipe",
    "epoch_batches",
    "form_batches",
    "shard_batch",
]

Key = Hashable
Length = Union[int, float, tuple]
BatchesFn = Callable[..., Sequence[Sequence[Key]]]

_SALT = "batch_view"


# --------------------------------------------------------------------------- algorithms


def _sorted_keys(lengths: Mapping[Key, Length], descending: bool) -> list[Key]:
    try:
        by_key = sorted(lengths)
    except TypeError as exc:
        raise TypeError(f"the keys of lengths must be comparable with each other: {exc}") from exc
    # sort() is stable, also with reverse=True: ties keep the key order in both directions.
    return sorted(by_key, key=lambda k: primary_measure(lengths[k]), reverse=descending)


@dataclass(frozen=True)
class _Units(BatchConstraint):
    """``inner`` applied to units of several samples (a unit's length is a tuple of lengths),
    so that :func:`pack_batches` packs whole rank groups without breaking the budget."""

    inner: BatchConstraint

    def empty(self):
        return self.inner.empty()

    def add(self, state, unit):
        for n in unit:
            state = self.inner.add(state, n)
        return state

    def within(self, state):
        return self.inner.within(state)

    def cost(self, units):
        return self.inner.cost([n for unit in units for n in unit])


@dataclass
class _ViewStats(BatchStats):
    """:class:`BatchStats` plus the samples repeated to give every rank a sample."""

    repeated: int = 0

    def report(self) -> str:
        text = super().report()
        if self.repeated:
            text += f"\n  samples repeated to fill the last rank group: {self.repeated}"
        return text


def _units(keys: list, world_size: int, stats: _ViewStats | None) -> list[tuple]:
    """Consecutive groups of ``world_size`` keys; the last one padded by repeating its own."""
    units = [tuple(keys[i:i + world_size]) for i in range(0, len(keys), world_size)]
    if units and len(units[-1]) < world_size:
        last = units[-1]
        pad = world_size - len(last)
        units[-1] = last + tuple(last[i % len(last)] for i in range(pad))
        if stats is not None:
            stats.repeated += pad
    return units


def _stats_constraint(lengths: Mapping[Key, Length], constraint: BatchConstraint | None):
    if constraint is not None:
        return constraint
    inf = float("inf")
    first = next(iter(lengths.values()), 0)
    return TwoDimensional(inf, inf) if isinstance(first, tuple) else PaddedArea(inf)


def form_batches(
    keys_sorted: Sequence[Key],
    lengths: Mapping[Key, Length],
    *,
    budget: float | BatchConstraint | None = None,
    world_size: int = 1,
    oversize: str = "emit",
    stats: BatchStats | None = None,
) -> list[list[Key]]:
    """Cut length-sorted keys into block batches within a ``budget`` or piece batches of a
    fixed count (``budget=SampleCount(n)``).

    Every batch holds a multiple of ``world_size`` keys. Keys are first grouped in sorted order
    into **rank groups** of ``world_size`` consecutive keys (the last group, if short, is
    completed by repeating its own keys: nothing is dropped, and the repeats are counted in
    ``stats.repeated`` when ``stats`` is a view's stats); block batches are then packed from
    whole groups with :func:`~speechpipe.pipes.batching._buckets.pack_batches`, so no batch of more than
    one group exceeds the budget. A group whose cost alone exceeds the budget (a single
    oversize sample when ``world_size=1``) is emitted alone or dropped as ``oversize`` says,
    and its samples are counted in ``stats.oversize_emitted`` / ``stats.oversize_dropped``.
    Piece batches hold ``n`` keys (the last one fewer), as SpeeChain's piece strategy; they
    need no lengths unless ``stats`` is given.

    Args:
        keys_sorted: keys, sorted by length.
        lengths: ``{key: length}``.
        budget: a padded-area budget in the lengths' own unit (a number), or a cost model
            of :mod:`speechpipe.pipes.batching._constraints` (``SampleCount(n)``: ``n`` a
            multiple of ``world_size``).
        world_size: number of ranks that will share each batch.
        oversize: ``"emit"`` or ``"drop"`` an over-budget rank group.
        stats: where batch statistics are added.

    >>> form_batches(["c", "a", "b"], {"a": 5, "b": 3, "c": 9}, budget=10)
    [['c'], ['a', 'b']]
    >>> form_batches(["c", "a", "b", "d"], {}, budget=SampleCount(2), world_size=2)
    [['c', 'a'], ['b', 'd']]
    """
    constraint = batch_budget(budget, length=None, required=True)
    units = _units(list(keys_sorted), world_size, stats if isinstance(stats, _ViewStats) else None)
    if isinstance(constraint, SampleCount):  # a count needs no packing: the next rank groups
        if constraint.size % world_size:
            raise ValueError(
                f"SampleCount must be a multiple of world_size={world_size}, "
                f"got {constraint.size!r}"
            )
        step = constraint.size // world_size
        grouped = [units[i:i + step] for i in range(0, len(units), step)]
    else:
        def unit_lengths(unit):
            return tuple(lengths[k] for k in unit)

        grouped = list(pack_batches(units, _Units(constraint), oversize=oversize,
                                    lengths=unit_lengths))
        if stats is not None:
            emitted = {id(unit) for batch in grouped for unit in batch}
            for unit in units:
                if id(unit) not in emitted:
                    stats.oversize_dropped += len(unit)
            for batch in grouped:
                if len(batch) == 1 and not constraint.fits(unit_lengths(batch[0])):
                    stats.oversize_emitted += len(batch[0])
    batches = [[key for unit in batch for key in unit] for batch in grouped]
    if stats is not None:
        for batch in batches:
            stats.add_batch([lengths[k] for k in batch], constraint)
    return batches


def _carry_to_multiple(batches: list[list], world_size: int, stats: _ViewStats | None) -> list:
    """SpeeChain's rule for custom batches: trim each batch to a multiple of ``world_size`` and
    carry the rest to the front of the next; the final rest is completed by repetition."""
    out: list[list] = []
    carry: list = []
    for batch in batches:
        batch = carry + list(batch)
        cut = len(batch) - len(batch) % world_size
        carry = batch[cut:]
        if cut:
            out.append(batch[:cut])
    if carry:
        out.append([key for unit in _units(carry, world_size, stats) for key in unit])
    return out


def epoch_batches(
    batches: Sequence[Sequence[Key]],
    epoch: int,
    *,
    shuffle: bool = True,
    seed: int = 0,
    batches_per_epoch: int | None = None,
) -> list[list[Key]]:
    """The batches of one epoch: a window of an endless stream of shuffled **rounds**.

    Round ``r`` is the whole batching view in the order drawn by
    ``derive_rng(seed, r, 0, 0, "batch_view")`` (the view's own order with ``shuffle=False``);
    the same on every rank, since the rank does not enter the seed. Epoch ``e`` takes the
    ``N`` batches at positions ``[e*N, (e+1)*N)`` of the rounds laid end to end, where ``N`` is
    ``batches_per_epoch`` (default: the number of batches, so epoch ``e`` is round ``e``).
    A smaller ``N`` clips: consecutive epochs walk through a round, so every batch is used
    once per round (SpeeChain's cursor). A larger ``N`` extends: the epoch is supplemented by
    batches from the start of the next round, repeating as needed (SpeeChain's supplement).
    With ``shuffle=False`` this is exactly SpeeChain's rule: a cyclic window of the view
    starting at ``e*N mod len``.

    >>> view = [["a"], ["b"], ["c"]]
    >>> epoch_batches(view, 0, shuffle=False, batches_per_epoch=2)
    [['a'], ['b']]
    >>> epoch_batches(view, 1, shuffle=False, batches_per_epoch=2)
    [['c'], ['a']]
    >>> epoch_batches(view, 0, shuffle=False, batches_per_epoch=5)
    [['a'], ['b'], ['c'], ['a'], ['b']]
    >>> sorted(epoch_batches(view, 7)) == view
    True
    """
    n = len(batches)
    if n == 0:
        return []
    size = n if batches_per_epoch is None else batches_per_epoch
    out: list[list[Key]] = []
    position = epoch * size
    while len(out) < size:
        round_, offset = divmod(position, n)
        order = list(range(n))
        if shuffle:
            derive_rng(seed, round_, 0, 0, _SALT).shuffle(order)
        take = min(size - len(out), n - offset)
        out.extend(list(batches[i]) for i in order[offset:offset + take])
        position += take
    return out


def shard_batch(
    batch: Sequence[Key], rank: int, world_size: int, *, descending: bool = True
) -> list[Key]:
    """The part of a global batch that ``rank`` of ``world_size`` loads (every ``world_size``-th
    key).

    SpeeChain's rule: in a batch sorted longest first (``descending=True``) rank ``r`` takes
    the keys at ``world_size - 1 - r``, ``2*world_size - 1 - r``, ..., so rank 0 gets the
    shortest of each rank group (GPU 0 often holds more than the others); in ascending
    order rank ``r`` starts at ``r``. Every rank gets ``len(batch) / world_size`` keys.

    Raises:
        ValueError: the batch size is not a multiple of ``world_size`` (the view never makes
            such batches), or ``rank`` is not in ``[0, world_size)``.

    >>> shard_batch(["l1", "l2", "l3", "l4"], 0, 2), shard_batch(["l1", "l2", "l3", "l4"], 1, 2)
    (['l2', 'l4'], ['l1', 'l3'])
    """
    world_size = check_int("world_size", world_size, 1)
    if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < world_size:
        raise ValueError(f"rank must be an int in [0, {world_size}), got {rank!r}")
    if len(batch) % world_size:
        raise ValueError(
            f"a batch of {len(batch)} keys cannot be split evenly between {world_size} ranks"
        )
    start = world_size - 1 - rank if descending else rank
    return list(batch[start::world_size])


# --------------------------------------------------------------------------- the view


def _check_bool(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {value!r}")
    return value


def _view_constraint(lengths: dict[Key, Length], budget: float | BatchConstraint | None,
                     world_size: int) -> BatchConstraint | None:
    """The constraint that sizes a view's batches (:func:`batch_budget`, in the lengths'
    own unit); with a ``batches_fn`` it measures the hook's batches for ``stats``."""
    constraint = batch_budget(budget, length=None)
    if isinstance(constraint, SampleCount) and constraint.size % world_size:
        raise ValueError(
            f"SampleCount must be a multiple of world_size={world_size}, "
            f"got {constraint.size!r}"
        )
    if constraint is not None and lengths and not isinstance(constraint, SampleCount):
        pairs = isinstance(constraint, TwoDimensional)  # a count takes either kind of length
        if pairs != isinstance(next(iter(lengths.values())), tuple):
            needed = "(input, output) pairs" if pairs else "numbers"
            raise ValueError(f"{type(constraint).__name__} needs {needed} as lengths")
    return constraint


class BatchView:
    """Batches planned from lengths alone; SpeeChain's Iterator without the data.

    The view sorts the keys of ``lengths`` by length (``descending``; ties by key), cuts them
    into batches as ``constraint`` says -- block batches within a budget, or piece batches of
    a fixed count (``budget=`` says which) -- or as your own
    ``batches_fn`` does, and
    keeps that **batching view** (:attr:`batching_view`, inspectable, computed once in the
    constructor from the in-memory lengths; nothing is read). Each epoch then draws an order
    of these batches (:meth:`batches`, see :func:`epoch_batches`): shuffled per epoch with
    ``derive_rng(seed, ...)``, or fixed with ``shuffle=False`` (validation and test), clipped
    or extended to ``batches_per_epoch``, skipping ``start_step`` batches when resuming.

    **Several ranks** (SpeeChain's ``ngpu``): with ``world_size=W`` every batch holds a
    multiple of ``W`` keys, so each rank loads the same number of samples at every step and
    every rank runs the same number of steps. Keys are grouped, in sorted order, into rank
    groups of ``W``; the budget applies to the **global** batch (all ranks together, as
    SpeeChain's ``batch_len``), and whole groups are packed, so the budget still holds; the
    last group, if short, is completed by repeating its own keys (counted in
    ``stats.repeated``; nothing is dropped). Piece batches need ``SampleCount(n)`` to be a
    multiple of ``W``. A ``batches_fn``'s batches are fixed with SpeeChain's rule: each is
    trimmed to a multiple of ``W`` and the rest carried to the front of the next. Rank ``r``
    loads :func:`shard_batch` of each batch (``batches(epoch, rank=r)``).

    Args:
        lengths: ``{key: length}`` of every utterance (frames, samples or seconds; a pair
            ``(input, output)`` for :class:`~speechpipe.pipes.batching._constraints.TwoDimensional`),
            e.g. from :func:`~speechpipe.pipes.batching._lengths.read_data_len` or
            :func:`~speechpipe.pipes.batching._lengths.compute_lengths`. Copied.
        budget: how batches are sized: a number is a padded-area budget (``n × max_len``,
            SpeeChain's BlockIterator ``batch_len``) in the lengths' own unit; or a cost model
            of :mod:`speechpipe.pipes.batching._constraints`: block batches within its budget
            (``PaddedArea``, ``SumOfLengths``, ``Quadratic``, ``TwoDimensional``), or piece
            batches of a fixed count (``SampleCount(n)``, SpeeChain's piece strategy); its
            ``length`` field is not used (lengths are given). Without a budget and a
            ``batches_fn``, piece batches of ``world_size`` keys: one utterance per rank per
            step, for evaluation.
        batches_fn: your own batching function, used instead of a constraint: a hook
            ``batches_fn(keys_sorted, lengths, **conf) -> list of key lists`` (SpeeChain's
            ``batches_generate_fn``); ``conf`` holds ``budget`` as given, if it was (the
            constraint made from it measures the hook's batches for ``stats``). Must be picklable (a
            module-level function or a ``functools.partial`` of one) to pickle the view.
        descending: sort longest first (True) or shortest first (False).
        shuffle: draw a new batch order each epoch (training); False keeps the view's order.
        seed: base seed of the batch order.
        batches_per_epoch: batches in each epoch, fewer (clip) or more (extend) than the
            view has; ``len(view)`` returns it.
        oversize: a rank group whose cost alone exceeds the budget (with ``world_size=1``: a
            sample) is ``"emit"``-ted as a batch of its own or ``"drop"``-ped; counted in
            :attr:`stats` either way.
        group_info: per-utterance labels for group-wise evaluation, ``{name: source}`` where
            a source is an ``idx2data`` file ``<key> <label>`` (or a list of non-overlapping
            ones) or a mapping ``{key: label}``; read when :attr:`group_info` is first used.
        world_size: number of ranks sharing each batch (SpeeChain's ``ngpu``).
        streams: ``V`` **virtual streams** (plan_batches' planning,
            :class:`~speechpipe.pipes.batching._length_streams.LengthStreams`): the keys dealt once
            to ``V`` streams, each sorted, packed and its batches shuffled per epoch, the
            streams interleaved into one global sequence -- the same for any world size and
            number of workers: rank ``r`` of ``W`` loads whole batches ``s * W + r``
            (:meth:`batches` with ``rank``/``world_size``; :meth:`sampler`), and a loader
            over ``batch_by_view`` (or a ``StatefulDataLoader`` over :meth:`sampler`) saves
            one global position that resumes on any topology. With streams:
            ``world_size=1``, no ``batches_fn`` nor ``batches_per_epoch``; lengths are
            numbers, or pairs under ``TwoDimensional`` (or a ``SampleCount``), as without;
            ``descending`` is not used (each stream sorts shortest first, ties at random).
            ``"auto"``: ``V`` derived from the number of keys
            (:func:`~speechpipe.pipes.batching._stream_count.view_streams`; small views get
            1); ``None`` (default): no streams.
        uneven: with streams, ``"pad"`` (the last step repeats the epoch's first batches)
            or ``"drop"`` (it is left out) when the batches do not fill every rank.

    Attributes:
        stats: a :class:`~speechpipe.pipes.batching._constraints.BatchStats` over the view (padding
            efficiency, batch sizes, oversize samples, plus ``repeated``);
            ``print(view.stats.report())``.

    >>> view = BatchView({"a": 5, "b": 3, "c": 9, "d": 2}, budget=10, shuffle=False)
    >>> view.batching_view
    [['c'], ['a', 'b'], ['d']]
    >>> len(view), view.batches(0, start_step=1)
    (3, [['a', 'b'], ['d']])
    >>> BatchView({"a": 5, "b": 3, "c": 9, "d": 2}, budget=SampleCount(2),
    ...           world_size=2).batching_view
    [['c', 'a'], ['b', 'd']]
    """

    def __init__(
        self,
        lengths: Mapping[Key, Length],
        *,
        budget: float | BatchConstraint | None = None,
        batches_fn: BatchesFn | None = None,
        descending: bool = True,
        shuffle: bool = True,
        seed: int = 0,
        batches_per_epoch: int | None = None,
        oversize: str = "emit",
        group_info: Mapping[str, Any] | None = None,
        world_size: int = 1,
        streams: int | str | None = None,
        uneven: str = "pad",
    ) -> None:
        self.lengths = check_lengths(lengths)
        self.streams = None if streams is None else view_streams(streams, len(self.lengths))
        if uneven not in UNEVEN:
            raise ValueError(f"uneven must be one of {UNEVEN}, got {uneven!r}")
        self.uneven = uneven
        if streams is not None and (world_size != 1 or batches_fn or batches_per_epoch):
            raise ValueError("a view over virtual streams (streams=) serves every world size "
                             "with whole batches: give no world_size, batches_fn nor "
                             "batches_per_epoch")
        self.world_size = check_int("world_size", world_size, 1)
        if batches_fn is not None and not callable(batches_fn):
            raise TypeError(f"batches_fn must be callable, got {batches_fn!r}")
        if batches_fn is None and budget is None:
            budget = SampleCount(self.world_size)  # one utterance per rank per step (evaluation)
        constraint = _view_constraint(self.lengths, budget, self.world_size)
        if oversize not in OVERSIZE:
            raise ValueError(f"oversize must be one of {OVERSIZE}, got {oversize!r}")
        if batches_per_epoch is not None:
            check_int("batches_per_epoch", batches_per_epoch, 1)
        check_group_info(group_info)
        self.constraint = constraint
        self.budget = budget
        self.batches_fn = batches_fn
        self.descending = _check_bool(descending, "descending")
        self.shuffle = _check_bool(shuffle, "shuffle")
        self.seed = check_int("seed", seed)
        self.batches_per_epoch = batches_per_epoch
        self.oversize = oversize
        self._group_sources = dict(group_info) if group_info is not None else None
        self._group_info: dict[str, dict[Key, Any]] | None = None
        self.stats = _ViewStats("batch_view")
        self._view = self._form()

    def _form(self) -> list[list[Key]]:
        if self.streams is not None:
            self._streams = LengthStreams(self.lengths, self.constraint, streams=self.streams,
                                          seed=self.seed, shuffle=self.shuffle,
                                          oversize=self.oversize)
            plan = self._streams.plan(0)
            self.stats = plan.stats
            return [self._streams.keys_of(batch) for batch in plan.batches]
        keys = _sorted_keys(self.lengths, self.descending)
        if self.batches_fn is None:
            return form_batches(keys, self.lengths, budget=self.constraint,
                                world_size=self.world_size, oversize=self.oversize,
                                stats=self.stats)
        conf = {} if self.budget is None else {"budget": self.budget}
        made = self.batches_fn(keys, dict(self.lengths), **conf)
        batches = self._check_hook_output(made)
        if self.world_size > 1:
            batches = _carry_to_multiple(batches, self.world_size, self.stats)
        measure = _stats_constraint(self.lengths, self.constraint)
        for batch in batches:
            self.stats.add_batch([self.lengths[k] for k in batch], measure)
        return batches

    def _check_hook_output(self, made: Any) -> list[list[Key]]:
        name = getattr(self.batches_fn, "__name__", repr(self.batches_fn))
        if isinstance(made, (str, bytes)) or not isinstance(made, Iterable):
            raise ValueError(f"batches_fn {name} must return a list of key lists, got {made!r}")
        batches = []
        for i, batch in enumerate(made):
            if isinstance(batch, (str, bytes)) or not isinstance(batch, Iterable):
                raise ValueError(f"batches_fn {name} returned batch {i} = {batch!r}, not a list")
            batch = list(batch)
            if not batch:
                raise ValueError(f"batches_fn {name} returned an empty batch at position {i}")
            for key in batch:
                if key not in self.lengths:
                    raise ValueError(
                        f"batches_fn {name} returned key {key!r} (batch {i}) that is not in "
                        "lengths"
                    )
            batches.append(batch)
        return batches

    # ---------------------------------------------------------------- inspection

    @property
    def batching_view(self) -> list[list[Key]]:
        """The batches before any epoch order: a fresh list of key lists (SpeeChain's
        ``get_batch_indices``)."""
        return [list(batch) for batch in self._view]

    @property
    def group_info(self) -> dict[str, dict[Key, Any]] | None:
        """``{name: {key: label}}`` for the view's keys (SpeeChain's ``get_group_info``), or
        None without ``group_info``. Files are read on first use; labels for keys outside
        the view are left out; a key of the view without a label is a :class:`DataError`
        naming the group's source and the key."""
        if self._group_sources is None:
            return None
        if self._group_info is None:
            self._group_info = read_group_labels(self._group_sources, self.lengths)
        return {name: dict(labels) for name, labels in self._group_info.items()}

    def __len__(self) -> int:
        """Batches per epoch: ``batches_per_epoch`` if given, else all of the view's (0 if the
        view is empty); the same on every rank and in every epoch."""
        if not self._view:
            return 0
        return self.batches_per_epoch if self.batches_per_epoch is not None else len(self._view)

    def __repr__(self) -> str:
        sizes = [len(b) for b in self._view] or [0]
        return (
            f"{type(self).__name__}(keys={len(self.lengths)}, batches={len(self._view)}, "
            f"batches_per_epoch={len(self)}, world_size={self.world_size}, "
            f"shuffle={self.shuffle}, descending={self.descending}, seed={self.seed}, "
            + (f"streams={self.streams}, uneven={self.uneven}, " if self.streams else "") +
            f"batch size min/mean/max={min(sizes)}/{sum(sizes) / len(sizes):.1f}/{max(sizes)})"
        )

    # ---------------------------------------------------------------- epochs

    def _check_rank(self, rank: int | None, world_size: int | None) -> None:
        if world_size is not None and world_size != self.world_size:
            raise ValueError(
                f"world_size={world_size!r} differs from the view's world_size="
                f"{self.world_size}: build the view with world_size={world_size!r} so that "
                "its batches split evenly"
            )
        if rank is not None and (not isinstance(rank, int) or isinstance(rank, bool)
                                 or not 0 <= rank < self.world_size):
            raise ValueError(f"rank must be an int in [0, {self.world_size}), got {rank!r}")

    def _check_start(self, start_step: Any) -> int:
        check_int("start_step", start_step, 0)
        if start_step > len(self):
            raise ValueError(
                f"start_step must be <= {len(self)} (batches per epoch), got {start_step!r}"
            )
        return start_step

    def batches(
        self,
        epoch: int = 0,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        start_step: int = 0,
    ) -> list[list[Key]]:
        """The key lists of one epoch, in drawing order (see :func:`epoch_batches`).

        Args:
            epoch: epoch number (>= 0); with ``shuffle`` each epoch has its own order.
            rank: give it to get this rank's part of every batch (:func:`shard_batch`); by
                default the global batches.
            world_size: if given, must equal the view's (a guard for DDP scripts).
            start_step: skip this many batches (resuming); the rest equals the tail of the
                uninterrupted epoch.
        """
        check_int("epoch", epoch, 0)
        if self.streams is not None:  # start_step: global batches; whole ones per rank
            plan, start = self.plan(epoch), self._check_start(start_step)
            world = check_int("world_size", world_size or 1, 1)
            if rank is not None and not (isinstance(rank, int) and 0 <= rank < world):
                raise ValueError(f"rank must be an int in [0, {world}), got {rank!r}")
            where = range(start, len(plan)) if rank is None else plan.positions(
                rank, world, start=start, uneven=self.uneven)
            return [self._streams.keys_of(plan.batch(p % len(plan))) for p in where]
        self._check_rank(rank, world_size)
        start_step = self._check_start(start_step)
        out = epoch_batches(self._view, epoch, shuffle=self.shuffle, seed=self.seed,
                            batches_per_epoch=self.batches_per_epoch)[start_step:]
        if rank is None:
            return out
        return [self.shard(batch, rank) for batch in out]

    def plan(self, epoch: int) -> StreamPlan:
        """With ``streams``: the epoch's global batch sequence (items: positions in the
        sorted keys)."""
        if self.streams is None:
            raise TypeError("this view has no virtual streams (BatchView(streams=V))")
        return self._streams.plan(check_int("epoch", epoch, 0))

    def shard(self, batch: Sequence[Key], rank: int, world_size: int | None = None) -> list[Key]:
        """``rank``'s part of a global ``batch`` (:func:`shard_batch` with the view's order)."""
        self._check_rank(rank, world_size)
        return shard_batch(batch, rank, self.world_size, descending=self.descending)

    def sampler(self, epoch: int = 0, *, rank: int | None = None, world_size: int | None = None,
                start_step: int = 0) -> ViewSampler:
        """A ``batch_sampler`` for a map-style ``torch.utils.data.DataLoader`` (see
        :class:`~speechpipe.pipes.batching._sampler.ViewSampler`; over streams rank ``r`` of
        ``world_size`` gets the global batches ``s * world_size + r``)."""
        return ViewSampler(self, epoch, rank=rank, world_size=world_size, start_step=start_step)


# --------------------------------------------------------------------------- the pipe


@plain_iterator
class ViewLoaderIterDataPipe(SampleSource, IterDataPipe[list]):
    """Load the batches of a :class:`BatchView` from a map (functional name: ``batch_by_view``).

    Registered on ``MapDataPipe``: ``map_dp.batch_by_view(view)``. Consumes a ``MapDataPipe``
    (or any mapping ``key -> sample``) and yields, for each batch of the epoch's view, the
    list of samples ``[source[key] for key in batch]`` -- only the batches drawn are loaded,
    nothing is loaded in the constructor, and skipped batches (``start_step``) are never
    loaded. Follow it with torch's ``collate`` (``.collate(collate_fn=PadCollate())``).

    In a DataLoader with workers (``batch_size=None``), worker ``w`` of ``n`` loads batches
    ``w, w + n, ...`` of the epoch, and the DataLoader's round-robin gives them back in the
    view's order. With a view of ``world_size > 1`` each rank loads only its part of every
    batch (:func:`shard_batch`), at every step. The pipe learns its worker and rank from the
    DataLoader (it is a sharding pipe, see :meth:`apply_sharding`; torch therefore refuses a
    ``sharding_filter`` after it) or, iterated directly, from ``torch.distributed``.

    Args:
        source_datapipe: a ``MapDataPipe`` or mapping indexed by the view's keys.
        view: the :class:`BatchView`.
        epoch: the epoch drawn by the next pass (change it with :meth:`set_epoch`).
        start_step: batches skipped by the next pass (resuming mid-epoch).
        rank: this process's rank for a view with ``world_size > 1``; by default the rank the
            DataLoader or ``torch.distributed`` reports at iteration time (whose world size
            must then be the view's: a mismatch is a ``ValueError``, never silent duplicates).

    ``len(pipe)`` is the number of batches of the next pass: ``len(view) - start_step``.

    >>> import numpy as np
    >>> from speechpipe import SequenceWrapper
    >>> data = {k: {"key": k, "audio": np.zeros(n, np.float32)}
    ...         for k, n in [("a", 5), ("b", 3), ("c", 9), ("d", 2)]}
    >>> view = BatchView({k: len(s["audio"]) for k, s in data.items()}, budget=10,
    ...                  shuffle=False)
    >>> pipe = SequenceWrapper(data).batch_by_view(view)
    >>> [[s["key"] for s in batch] for batch in pipe], len(pipe)
    ([['c'], ['a', 'b'], ['d']], 3)
    """

    def __init__(
        self,
        source_datapipe: Any,
        view: BatchView,
        *,
        epoch: int = 0,
        start_step: int = 0,
        rank: int | None = None,
    ) -> None:
        if not callable(getattr(source_datapipe, "__getitem__", None)):
            raise TypeError(
                f"source_datapipe must be a MapDataPipe or a mapping key -> sample, got "
                f"{source_datapipe!r}"
            )
        if not isinstance(view, BatchView):
            raise TypeError(f"view must be a BatchView, got {view!r}")
        view._check_rank(rank, None)
        self.source_datapipe = source_datapipe
        self.view = view
        self.rank = rank
        self._sharding: dict[int, tuple[int, int]] = {}
        self.set_epoch(epoch, start_step=start_step)

    @property
    def topology_free(self) -> bool:
        """Over a view with streams: one global position for every rank and worker (the
        loader saves it: :mod:`speechpipe.topology`)."""
        return self.view.streams is not None

    def set_epoch(self, epoch: int, *, start_step: int = 0, start: int | None = None
                  ) -> ViewLoaderIterDataPipe:
        """Draw ``epoch`` in the next pass, skipping ``start_step`` batches (returns the pipe);
        over streams both count global batches (``start``: the loader's word for it)."""
        self.epoch = check_int("epoch", epoch, 0)
        self.start_step = self.view._check_start(start_step if start is None else start)
        return self

    def plan(self, epoch: int) -> StreamPlan:
        """Over a view with streams: the epoch's global batch sequence (``start`` and
        ``uneven`` are what :class:`~speechpipe.StepPlanner` counts steps from)."""
        return self.view.plan(epoch)

    start = property(lambda self: self.start_step)
    uneven = property(lambda self: self.view.uneven)

    def apply_sharding(self, num_of_instances: int, instance_id: int, sharding_group: int = 1
                       ) -> None:
        """Where this copy runs, as torch's DataLoader tells it (do not call it yourself).

        The DataLoader calls it in each worker (and, for ``num_workers=0``, in the main
        process) with ``num_workers * world_size`` instances and the id ``worker *
        world_size + rank``; ``sharding_group`` is torch's ``SHARDING_PRIORITIES``
        (1 = both, 2 = ranks only, 3 = workers only). Being a sharding pipe also makes torch
        refuse a second one (a ``sharding_filter`` downstream would drop batches).
        """
        if not 0 <= instance_id < num_of_instances:
            raise ValueError(
                f"instance_id must be in [0, {num_of_instances}), got {instance_id!r}"
            )
        self._sharding[int(sharding_group)] = (num_of_instances, instance_id)

    def _position(self) -> tuple[int | None, int, int]:
        """(rank for the view or None, worker, number of workers) of this copy; over streams
        (rank, world size, worker, number of workers)."""
        where = process_position()
        rank, world, worker, workers = where.rank, where.world_size, where.worker, where.num_workers
        sharding = self._sharding
        if 1 in sharding:  # DEFAULT: DataLoader's worker * world_size + rank
            total, instance = sharding[1]
            world = max(1, total // workers)
            rank, worker = instance % world, instance // world
        if 2 in sharding:
            world, rank = sharding[2]
        if 3 in sharding:
            workers, worker = sharding[3]
        if self.view.streams is not None:
            return rank if self.rank is None else self.rank, world, worker, workers
        if self.rank is not None:
            rank = self.rank
        elif world != self.view.world_size:
            raise ValueError(
                f"batch_by_view: the view was formed for world_size={self.view.world_size} "
                f"but this process runs in world size {world}; build the view with "
                f"world_size={world} (or pass rank= explicitly)"
            )
        return (None if self.view.world_size == 1 else rank), worker, workers

    def __iter__(self) -> Iterator[list]:
        where = self._position()
        rank, worker, workers = where[0], where[-2], where[-1]
        state, _ = self._take_resume()
        epoch, start_step, first = self.epoch, self.start_step, worker
        if state is not None:  # resuming (speechpipe.loader): this copy's next step
            epoch, start_step, first = state["epoch"], state["start_step"], state["next"]
        if self.view.streams is not None:  # this process's whole global batches, in order
            first, workers = (0 if state is None else first), 1
            keys_per_step = self.view.batches(epoch, rank=rank, world_size=where[1],
                                              start_step=start_step)[worker::where[3]]
        else:
            keys_per_step = self.view.batches(epoch, rank=rank, start_step=start_step)
        source = self.source_datapipe
        live = self._live = {"epoch": epoch, "start_step": start_step, "next": first}
        try:
            for step in range(first, len(keys_per_step), workers):
                keys = keys_per_step[step]
                live["next"] = step + workers
                batch = []
                for key in keys:
                    try:
                        batch.append(source[key])
                    except KeyError as exc:
                        raise DataError(
                            f"batch_by_view: key of the view not found in the source: {exc!r}",
                            key=key,
                        ) from exc
                yield batch
        finally:
            self._live = None

    def __len__(self) -> int:
        if self.view.streams is not None:  # this rank's steps, over its workers
            where = self._position()
            return self.plan(self.epoch).steps(where[1], start=self.start_step,
                                               uneven=self.view.uneven)
        return len(self.view) - self.start_step

    def _snapshot(self, live: dict) -> dict:
        """Epoch, ``start_step`` and the next step this copy loads: nothing is held, so a
        resumed pass loads nothing it skips."""
        return dict(live)


ViewLoader = ViewLoaderIterDataPipe

# An iterable pipe made from a map pipe: registered on MapDataPipe's registry only.
MapDataPipe.register_datapipe_as_function("batch_by_view", ViewLoaderIterDataPipe)
