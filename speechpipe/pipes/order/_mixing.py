"""Several sources: zip them by name, mix them by weight, sample with replacement.

Speech training often reads from more than one source at once. The verbs:

- ``zip_by_name`` (:class:`NamedZipperIterDataPipe`): each step takes one element from every
  named source and yields ``{name: element}`` -- e.g. a supervised and an unsupervised batch,
  each batched with its own budget, as ``{"sup": batch, "unsup": batch}`` (SpeeChain's several
  iterators feeding one ``train_batch``). ``until`` says which source ends the epoch
  (``"shortest"``, ``"longest"`` or a source's name); the others are restarted when they run
  out, and every restart is counted.
- ``mix_by_weight`` (:class:`WeightedMixerIterDataPipe`): one stream of samples from several
  corpora, each next sample from a source picked at random with probability proportional to
  its weight. Without replacement the pass ends when the first source runs out
  (``stop="first"``) or when all have (``stop="all"``, weights renormalised over the rest);
  with ``endless=True`` a source that runs out is read again, and ``samples_per_epoch``
  makes each pass exactly that many samples.
- ``sample_with_replacement`` (:class:`ReplacementSamplerIterDataPipe`): ``num_samples``
  items drawn with replacement, optionally weighted per item, from a random-access source --
  Parakeet's sampler, for which an epoch is a number of draws, not a pass over the data.
  Registered on both ``MapDataPipe`` and ``IterDataPipe``.

Torch's own verbs cover the simple cases and are not redefined: ``zip`` (tuples by position,
stops at the shortest), ``mux`` (round robin), ``concat`` (one source after the other).

**Epochs of the sources.** Re-reading a pipe with the same epoch replays the same random
order, so ``zip_by_name`` and ``mix_by_weight`` set the epoch of the random pipes inside their
sources: when pass ``k`` of a source starts (``k = 0`` at the start of the pipe's pass, then
one more per restart) every pipe with ``set_epoch`` below it gets :func:`pass_epoch` ``(e,
k)``, where ``e`` is the zipper's or mixer's own epoch -- ``e`` itself for the first pass, a
derived number for each restart. Call ``set_epoch`` on the zipper or mixer, not on the pipes
below it (:func:`propagate_epoch` would overwrite them).

All randomness comes from :func:`speechpipe.seeding.derive_rng` with ``(seed, epoch, rank,
worker)``: the same seed and epoch give the same order, another epoch another order.
"""

from __future__ import annotations

import bisect
import itertools
import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from ...errors import check_int, DataError
from ...sample import KEY
from ...seeding import derive_seed
from .._core import functional_datapipe, IterDataPipe, MapDataPipe
from .._core import propagate_epoch
from .._core import check_seed, Seeded

__all__ = [
    "NamedZipperIterDataPipe",
    "ReplacementSamplerIterDataPipe",
    "STOP",
    "SourceStats",
    "WeightedMixerIterDataPipe",
    "mix_by_weight",
    "pass_epoch",
    "sample_with_replacement",
    "zip_by_name",
]

#: How a ``mix_by_weight`` pass without replacement ends.
STOP = ("first", "all")

#: ``until`` values of ``zip_by_name`` besides a source's name.
_UNTIL = ("shortest", "longest")


OnPass = Callable[[str, int], None]


# --------------------------------------------------------------------------- epochs


def pass_epoch(epoch: int, pass_index: int) -> int:
    """The epoch a source gets for its ``pass_index``-th pass within epoch ``epoch``.

    The first pass (``pass_index == 0``) gets ``epoch`` itself, so a source that is never
    restarted sees exactly the epoch set on the zipper or mixer. Each restart gets a number
    derived from both with :func:`~speechpipe.seeding.derive_seed` (62 bits), so that a
    restart of epoch 3 does not replay epoch 4's order (as ``epoch + pass_index`` would).

    >>> pass_epoch(3, 0)
    3
    >>> len({pass_epoch(3, 1), pass_epoch(4, 0), pass_epoch(2, 2), pass_epoch(3, 2)})
    4
    """
    if pass_index == 0:
        return epoch
    return derive_seed(epoch, pass_index, 0, 0, "pass_epoch") >> 2


# --------------------------------------------------------------------------- statistics


@dataclass
class SourceStats:
    """What one pass of ``zip_by_name`` or ``mix_by_weight`` took from each source.

    ``steps`` counts the elements the pipe yielded (zip steps, or mixed samples). Per source:
    ``taken`` -- its elements that were yielded; ``ended`` -- how many times it ran out (its
    completed passes, the "source epochs"); ``restarts`` -- how many times it was read again
    after running out. :meth:`report` prints them.

    >>> s = SourceStats("zip_by_name", ("sup", "unsup"), mode="until='sup'", unit="steps")
    >>> s.steps, s.taken["sup"] = 2, 2
    >>> print(s.report())
    zip_by_name (until='sup'): 2 steps
      sup: 2 taken, ran out 0x, restarted 0x
      unsup: 0 taken, ran out 0x, restarted 0x
    """

    stage: str
    names: tuple[str, ...]
    mode: str = ""
    unit: str = "samples"
    weights: dict[str, float] | None = None
    steps: int = 0
    taken: dict[str, int] = field(default_factory=dict)
    ended: dict[str, int] = field(default_factory=dict)
    restarts: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Zero every count (called at the start of each pass)."""
        self.steps = 0
        self.taken = {name: 0 for name in self.names}
        self.ended = {name: 0 for name in self.names}
        self.restarts = {name: 0 for name in self.names}

    def report(self) -> str:
        """One line for the pass, one per source."""
        mode = f" ({self.mode})" if self.mode else ""
        lines = [f"{self.stage}{mode}: {self.steps} {self.unit}"]
        total_weight = sum(self.weights.values()) if self.weights else 0.0
        for name in self.names:
            share = ""
            if self.weights:
                got = 100.0 * self.taken[name] / self.steps if self.steps else 0.0
                want = 100.0 * self.weights[name] / total_weight
                share = f" ({got:.1f} %; weight {want:.1f} %)"
            lines.append(
                f"  {name}: {self.taken[name]} taken{share}, ran out {self.ended[name]}x, "
                f"restarted {self.restarts[name]}x"
            )
        return "\n".join(lines)


# --------------------------------------------------------------------------- validation


def _named_sources(sources: tuple, names: Sequence[str] | None, stage: str) -> dict[str, Any]:
    """``{name: pipe}`` from one mapping, or from positional pipes and ``names``."""
    if len(sources) == 1 and isinstance(sources[0], Mapping):
        if names is not None:
            raise ValueError(f"{stage}: give names only with positional pipes, not with a mapping")
        named = dict(sources[0])
    else:
        if names is None:
            raise ValueError(
                f"{stage} needs names=(...) for {len(sources)} positional source(s), "
                "or one mapping {name: pipe}"
            )
        if isinstance(names, str) or not isinstance(names, Sequence):
            raise TypeError(f"names must be a sequence of strings, got {names!r}")
        if len(names) != len(sources):
            raise ValueError(
                f"names has {len(names)} entries for {len(sources)} sources: {list(names)!r}"
            )
        if len(set(names)) != len(names):
            raise ValueError(f"names must be unique, got {list(names)!r}")
        named = dict(zip(names, sources))
    if not named:
        raise ValueError(f"{stage} needs at least one source")
    by_id: dict[int, str] = {}
    for name, pipe in named.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"source names must be non-empty strings, got {name!r}")
        if not isinstance(pipe, IterDataPipe):
            raise TypeError(
                f"source {name!r} must be an IterDataPipe, got {type(pipe).__name__}; "
                "wrap a list with IterableWrapper"
            )
        if id(pipe) in by_id:
            raise ValueError(
                f"sources {by_id[id(pipe)]!r} and {name!r} are the same pipe object; one pipe "
                "cannot be read by two live iterators -- build two pipes or use fork()"
            )
        by_id[id(pipe)] = name
    return named


def _check_until(until: Any, names: Sequence[str]) -> str:
    if not isinstance(until, str) or (until not in _UNTIL and until not in names):
        raise ValueError(
            f"until must be 'shortest', 'longest' or a source name {list(names)!r}, "
            f"got {until!r}"
        )
    clash = [n for n in names if n in _UNTIL]
    if clash:
        raise ValueError(
            f"zip_by_name source names must differ from 'shortest' and 'longest', got {clash[0]!r}"
        )
    return until


def _check_weight(label: str, value: Any, *, allow_zero: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{label} must be a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        kind = "a finite number >= 0" if allow_zero else "a positive finite number"
        raise ValueError(f"{label} must be {kind}, got {value!r}")
    return value


def _check_source_weights(weights: Any, names: Sequence[str]) -> dict[str, float]:
    """``{name: weight}`` from a mapping keyed by the source names, or a sequence in order."""
    if isinstance(weights, Mapping):
        missing = [n for n in names if n not in weights]
        unknown = [k for k in weights if k not in names]
        if missing or unknown:
            raise ValueError(
                f"weights must have one entry per source {list(names)!r}: "
                f"missing {missing!r}, unknown {unknown!r}"
            )
        items = [(n, weights[n]) for n in names]
    elif isinstance(weights, Sequence) and not isinstance(weights, str):
        if len(weights) != len(names):
            raise ValueError(
                f"weights has {len(weights)} entries for {len(names)} sources {list(names)!r}"
            )
        items = list(zip(names, weights))
    else:
        raise TypeError(
            f"weights must be a mapping {{name: weight}} or a sequence, got {weights!r}"
        )
    return {n: _check_weight(f"weights[{n!r}]", w, allow_zero=False) for n, w in items}


# --------------------------------------------------------------------------- algorithms


class _Passes:
    """Opens the passes of named sources, counting restarts; empty restarts are errors."""

    def __init__(self, sources: Mapping[str, Iterable], stats: SourceStats, stage: str,
                 on_pass: OnPass | None) -> None:
        self.sources, self.stats, self.stage, self.on_pass = sources, stats, stage, on_pass
        self.index = {name: 0 for name in sources}
        self.iters = {name: self._open(name) for name in sources}

    def _open(self, name: str) -> Iterator:
        if self.on_pass is not None:
            self.on_pass(name, self.index[name])
        return iter(self.sources[name])

    def restart(self, name: str) -> Any:
        """Read ``name`` again and return its first element."""
        self.index[name] += 1
        self.stats.restarts[name] += 1
        self.iters[name] = self._open(name)
        try:
            return next(self.iters[name])
        except StopIteration:
            raise DataError(
                f"empty when read again (pass {self.index[name] + 1}); a source that is "
                "restarted must yield at least one element",
                source=f"{self.stage} source {name!r}",
            ) from None


def zip_by_name(
    sources: Mapping[str, Iterable],
    *,
    until: str = "shortest",
    stats: SourceStats | None = None,
    on_pass: OnPass | None = None,
) -> Iterator[dict[str, Any]]:
    """Yield ``{name: element}`` steps taking one element from every source.

    At a step where some sources run out, the epoch ends if ``until`` says so --
    ``"shortest"``: any source ran out; ``"longest"``: every source has run out at least once
    in this pass; a name: that source ran out -- and nothing is yielded for that step (the
    elements already taken from the other sources at that step are dropped, as in ``zip``).
    Otherwise the sources that ran out are read again (counted in ``stats.restarts``) and the
    step is filled with their first elements.

    Args:
        sources: re-iterable sources by name; the steps' keys keep this order.
        until: which source ends the epoch, see above.
        stats: where the counts are added (a :class:`SourceStats`).
        on_pass: called as ``on_pass(name, k)`` before the ``k``-th pass of a source starts
            (``k = 0`` first); the pipe uses it to set the source's epoch.

    >>> list(zip_by_name({"a": [1, 2, 3], "b": "xy"}, until="longest"))
    [{'a': 1, 'b': 'x'}, {'a': 2, 'b': 'y'}, {'a': 3, 'b': 'x'}]
    """
    names = list(sources)
    _check_until(until, names)
    if stats is None:
        stats = SourceStats("zip_by_name", tuple(names), unit="steps")
    passes = _Passes(sources, stats, "zip_by_name", on_pass)
    ran_out: set[str] = set()
    while True:
        step: dict[str, Any] = {}
        ended_now = []
        for name in names:
            try:
                step[name] = next(passes.iters[name])
            except StopIteration:
                ended_now.append(name)
        if ended_now:
            for name in ended_now:
                stats.ended[name] += 1
                ran_out.add(name)
            if (until == "shortest" or until in ended_now
                    or (until == "longest" and len(ran_out) == len(names))):
                return
            for name in ended_now:
                step[name] = passes.restart(name)
            step = {name: step[name] for name in names}
        for name in names:
            stats.taken[name] += 1
        stats.steps += 1
        yield step


def _tag(sample: Any, tag_field: str, name: str) -> dict:
    if not isinstance(sample, Mapping):
        raise DataError(
            f"tag_field={tag_field!r} needs dict samples, got a {type(sample).__name__}",
            source=f"mix_by_weight source {name!r}",
        )
    present = sample.get(tag_field, None)
    if tag_field in sample and not (isinstance(present, str) and present == name):
        key = sample.get(KEY)
        raise DataError(
            f"sample already has a field {tag_field!r} = {present!r}; pass another tag_field",
            source=f"mix_by_weight source {name!r}",
            key=key if isinstance(key, str) else None,
        )
    return {**sample, tag_field: name}


def mix_by_weight(
    sources: Mapping[str, Iterable],
    weights: Mapping[str, float] | Sequence[float],
    rng,
    *,
    stop: str = "first",
    endless: bool = False,
    num_samples: int | None = None,
    tag_field: str | None = None,
    stats: SourceStats | None = None,
    on_pass: OnPass | None = None,
) -> Iterator[Any]:
    """Yield samples drawn one at a time from a source picked with probability ∝ weight.

    Each draw picks a source with ``rng`` (``random.Random``) among the active ones and takes
    its next sample, so every source keeps its own order. When the picked source has run out:

    - ``endless=False, stop="first"``: the pass ends;
    - ``endless=False, stop="all"``: the source leaves the draw, the weights of the rest are
      renormalised, and the pass ends when no source is left (every sample is yielded once);
    - ``endless=True``: the source is read again (counted in ``stats.restarts``) and the mix
      never ends by itself.

    Args:
        sources: re-iterable sources by name.
        weights: positive finite weight per source (mapping by name, or sequence in order).
        rng: a ``random.Random``.
        stop: ``"first"`` or ``"all"``, see above (ignored when ``endless``).
        endless: read sources again when they run out.
        num_samples: stop after this many samples (``None``: no limit).
        tag_field: if given, each sample is yielded as a new dict with this field set to its
            source's name.
        stats: where the counts are added (a :class:`SourceStats`).
        on_pass: called as ``on_pass(name, k)`` before the ``k``-th pass of a source.

    >>> import random
    >>> list(mix_by_weight({"a": "abc", "b": "XYZ"}, {"a": 1, "b": 1}, random.Random(0),
    ...                    stop="all"))
    ['X', 'Y', 'a', 'b', 'Z', 'c']
    """
    names = list(sources)
    if stop not in STOP:
        raise ValueError(f"stop must be one of {STOP}, got {stop!r}")
    weight = _check_source_weights(weights, names)
    if stats is None:
        stats = SourceStats("mix_by_weight", tuple(names), weights=weight)
    passes = _Passes(sources, stats, "mix_by_weight", on_pass)
    active = list(names)
    cum = list(itertools.accumulate(weight[n] for n in active))
    produced = 0
    while num_samples is None or produced < num_samples:
        j = bisect.bisect(cum, rng.random() * cum[-1], 0, len(cum) - 1)
        name = active[j]
        try:
            sample = next(passes.iters[name])
        except StopIteration:
            stats.ended[name] += 1
            if endless:
                sample = passes.restart(name)
            elif stop == "first":
                return
            else:
                del active[j]
                if not active:
                    return
                cum = list(itertools.accumulate(weight[n] for n in active))
                continue
        if tag_field is not None:
            sample = _tag(sample, tag_field, name)
        stats.taken[name] += 1
        stats.steps += 1
        produced += 1
        yield sample


def sample_with_replacement(
    items: Sequence[Any],
    num_samples: int | None,
    rng,
    *,
    weights: Sequence[float] | None = None,
) -> Iterator[Any]:
    """Yield ``num_samples`` items of ``items`` drawn with replacement (``None``: forever).

    Uniform by default; with ``weights`` (one per item, >= 0, positive sum) item ``i`` is
    drawn with probability ``weights[i] / sum(weights)`` and a zero weight is never drawn.
    ``items`` needs only ``len`` and indexing by ``0 .. len - 1`` (a list, a
    ``SequenceWrapper``).

    >>> import random
    >>> list(sample_with_replacement("abc", 6, random.Random(0)))
    ['b', 'b', 'a', 'b', 'c', 'b']
    >>> list(sample_with_replacement("abc", 4, random.Random(0), weights=[0, 0, 1]))
    ['c', 'c', 'c', 'c']
    """
    n = len(items)
    if n == 0:
        raise ValueError("sample_with_replacement cannot draw from an empty source")
    cum = None
    if weights is not None:
        if len(weights) != n:
            raise ValueError(f"weights has {len(weights)} entries for {n} items")
        cum = list(itertools.accumulate(
            _check_weight(f"weights[{i}]", w, allow_zero=True) for i, w in enumerate(weights)))
        if not cum[-1] > 0:
            raise ValueError("weights must not all be 0")
    count = 0
    while num_samples is None or count < num_samples:
        if cum is None:
            i = rng.randrange(n)
        else:
            i = bisect.bisect(cum, rng.random() * cum[-1], 0, n - 1)
        yield items[i]
        count += 1


# --------------------------------------------------------------------------- pipes


class _SourceEpochs(Seeded):
    """Epoch of a zipper or mixer, passed on to the random pipes inside its sources."""

    owns_source_epochs = True  # propagate_epoch stops here: each pass sets its sources'
    # epochs itself (_start_pass)
    sources: dict[str, IterDataPipe]

    def _start_pass(self, name: str, pass_index: int) -> None:
        propagate_epoch(self.sources[name], pass_epoch(self.epoch, pass_index))


@functional_datapipe("zip_by_name")
class NamedZipperIterDataPipe(_SourceEpochs, IterDataPipe[dict]):
    """Yield ``{name: element}`` steps from named sources (functional name: ``zip_by_name``).

    Consumes several pipes -- typically each already batched with its own budget and
    collated; yields one dict per training step with one element of each source under its
    name, e.g. ``{"sup": batch, "unsup": batch}`` for semi-supervised training (see
    :func:`zip_by_name`). Use torch's ``zip`` for tuples that stop at the shortest source.

    Give the sources as one mapping, ``NamedZipper({"sup": a, "unsup": b})``, or as pipes
    with ``names``: ``a.zip_by_name(b, names=("sup", "unsup"))``.

    The epoch ends, per ``until``, when the shortest source runs out (``"shortest"``, no
    restarts), when every source has run out at least once (``"longest"``), or when the named
    source runs out (e.g. ``until="sup"``: one pass over the supervised data, the
    unsupervised data restarted as often as needed). A restarted source is a new pass with a
    new epoch (see :func:`pass_epoch`), so it does not replay the same order. ``self.stats``
    (a :class:`SourceStats`) counts, for the last pass, the elements each source gave, how
    often it ran out and how often it was restarted: ``print(pipe.stats.report())``.

    Args:
        *sources: one mapping ``{name: pipe}``, or several pipes named by ``names``.
        names: the names of positional sources, in order.
        until: ``"shortest"`` (default), ``"longest"`` or a source name: which source ends
            the epoch.

    ``set_epoch(e)`` sets ``e`` (then :func:`pass_epoch` values for restarts) on every pipe
    with ``set_epoch`` inside the sources at the start of their passes. ``len()`` is exact when
    the sources have one: the shortest's, the longest's or the named source's length.

    >>> from speechpipe import IterableWrapper
    >>> sup = IterableWrapper(["s1", "s2", "s3"])
    >>> unsup = IterableWrapper(["u1", "u2"])
    >>> pipe = NamedZipper({"sup": sup, "unsup": unsup}, until="sup")
    >>> list(pipe)
    [{'sup': 's1', 'unsup': 'u1'}, {'sup': 's2', 'unsup': 'u2'}, {'sup': 's3', 'unsup': 'u1'}]
    >>> print(pipe.stats.report())
    zip_by_name (until='sup'): 3 steps
      sup: 3 taken, ran out 1x, restarted 0x
      unsup: 3 taken, ran out 1x, restarted 1x
    """

    def __init__(
        self,
        *sources: IterDataPipe | Mapping[str, IterDataPipe],
        names: Sequence[str] | None = None,
        until: str = "shortest",
    ) -> None:
        self.sources = _named_sources(sources, names, "zip_by_name")
        self.until = _check_until(until, list(self.sources))
        self.epoch = 0
        self.stats = SourceStats(
            "zip_by_name", tuple(self.sources), mode=f"until={until!r}", unit="steps"
        )

    def __iter__(self) -> Iterator[dict]:
        self._begin_pass()
        self.stats.reset()
        yield from zip_by_name(
            self.sources, until=self.until, stats=self.stats, on_pass=self._start_pass
        )

    def __len__(self) -> int:
        lengths = {}
        for name, pipe in self.sources.items():
            if self.until in _UNTIL or self.until == name:
                try:
                    lengths[name] = len(pipe)
                except TypeError as exc:
                    raise TypeError(
                        f"zip_by_name(until={self.until!r}) has no length: source {name!r} "
                        f"has none ({exc})"
                    ) from None
        if self.until == "shortest":
            return min(lengths.values())
        if self.until == "longest":
            return max(lengths.values())
        return lengths[self.until]


NamedZipper = NamedZipperIterDataPipe


@functional_datapipe("mix_by_weight")
class WeightedMixerIterDataPipe(_SourceEpochs, IterDataPipe):
    """Mix samples of several sources at random by weight (functional name: ``mix_by_weight``).

    Consumes several pipes of samples (corpora); yields their samples, each next one from a
    source picked at random with probability proportional to its weight, each source in its
    own order (see :func:`mix_by_weight`). Torch's ``mux`` alternates sources in turn; use
    this one to set proportions.

    Give the sources as one mapping, ``WeightedMixer({"libri": a, "cv": b}, weights={"libri":
    3, "cv": 1})``, or as pipes with ``names``: ``a.mix_by_weight(b, names=("libri", "cv"),
    weights=(3, 1))``.

    Args:
        *sources: one mapping ``{name: pipe}``, or several pipes named by ``names``.
        weights: a positive finite weight per source: a mapping with exactly the sources'
            names, or a sequence in the sources' order.
        names: the names of positional sources, in order.
        stop: without replacement (the default), ``"first"`` ends the pass the first time an
            exhausted source is drawn (default), ``"all"`` drops exhausted sources,
            renormalises the weights of the rest and ends when every sample has been yielded.
        endless: sample with replacement of sources: a source that runs out is read again (a
            new pass, with a new epoch -- see :func:`pass_epoch`), and the mix never ends by
            itself. Not combined with ``stop``.
        samples_per_epoch: with ``endless=True``, each pass yields exactly this many samples
            and then ends: an epoch of fixed size; ``len()`` is this number.
        tag_field: if given, each sample is yielded as a new dict with this field set to its
            source's name (e.g. ``"corpus"``); a sample already holding another value there
            raises :class:`~speechpipe.errors.DataError`. By default samples are unchanged.
        seed: base seed; the draws use ``(seed, epoch, rank, worker)``.

    Each pass starts every source afresh (epoch ``e`` set on the pipes inside it): an endless
    mix with ``samples_per_epoch`` does not resume the sources where the last pass left them;
    call ``set_epoch`` every epoch so each pass reads them in a new order. ``self.stats``
    (:class:`SourceStats`) counts per source the samples taken, passes ended ("source
    epochs") and restarts of the last pass; ``self.epochs_completed`` counts passes that
    reached their end. ``len()``: ``samples_per_epoch``, or with ``stop="all"`` the sum of the
    sources' lengths; otherwise ``TypeError``.

    >>> from speechpipe import IterableWrapper
    >>> books = IterableWrapper([{"key": f"b{i}"} for i in range(4)])
    >>> news = IterableWrapper([{"key": f"n{i}"} for i in range(2)])
    >>> pipe = WeightedMixer({"books": books, "news": news}, weights={"books": 2, "news": 1},
    ...                      stop="all", tag_field="corpus")
    >>> [(s["key"], s["corpus"]) for s in pipe]
    [('b0', 'books'), ('b1', 'books'), ('b2', 'books'), ('n0', 'news'), ('n1', 'news'),
     ('b3', 'books')]
    >>> endless = books.mix_by_weight(news, names=("books", "news"), weights=(1, 1),
    ...                               endless=True, samples_per_epoch=10)
    >>> [s["key"] for s in endless], len(endless)
    (['n0', 'b0', 'b1', 'n1', 'n0', 'b2', 'b3', 'b0', 'b1', 'n1'], 10)
    >>> endless.stats.restarts, endless.epochs_completed
    ({'books': 1, 'news': 1}, 1)
    """

    def __init__(
        self,
        *sources: IterDataPipe | Mapping[str, IterDataPipe],
        weights: Mapping[str, float] | Sequence[float],
        names: Sequence[str] | None = None,
        stop: str | None = None,
        endless: bool = False,
        samples_per_epoch: int | None = None,
        tag_field: str | None = None,
        seed: int = 0,
    ) -> None:
        self.sources = _named_sources(sources, names, "mix_by_weight")
        self.weights = _check_source_weights(weights, list(self.sources))
        if not isinstance(endless, bool):
            raise TypeError(f"endless must be a bool, got {endless!r}")
        if stop is not None and stop not in STOP:
            raise ValueError(f"stop must be one of {STOP}, got {stop!r}")
        if endless and stop is not None:
            raise ValueError(
                f"stop={stop!r} has no effect with endless=True (sources are read again and "
                "the mix never stops by itself); use samples_per_epoch to end each pass"
            )
        samples_per_epoch = check_int("samples_per_epoch", samples_per_epoch, 1, optional=True)
        if samples_per_epoch is not None and not endless:
            raise ValueError(
                f"samples_per_epoch={samples_per_epoch} needs endless=True: without "
                "replacement a pass ends when sources run out"
            )
        if tag_field is not None and (not isinstance(tag_field, str) or not tag_field):
            raise TypeError(f"tag_field must be a non-empty string or None, got {tag_field!r}")
        self.stop = stop or "first"
        self.endless = endless
        self.samples_per_epoch = samples_per_epoch
        self.tag_field = tag_field
        self.seed = check_seed(seed)
        self.epoch = 0
        self.epochs_completed = 0
        mode = ("endless" + (f", {samples_per_epoch} per epoch" if samples_per_epoch else "")
                if endless else f"stop={self.stop!r}")
        self.stats = SourceStats("mix_by_weight", tuple(self.sources), mode=mode,
                                 weights=dict(self.weights))

    def __iter__(self) -> Iterator[Any]:
        self._begin_pass()
        self.stats.reset()
        rng = self._rng("mix_by_weight")
        yield from mix_by_weight(
            self.sources,
            self.weights,
            rng,
            stop=self.stop,
            endless=self.endless,
            num_samples=self.samples_per_epoch,
            tag_field=self.tag_field,
            stats=self.stats,
            on_pass=self._start_pass,
        )
        self.epochs_completed += 1

    def __len__(self) -> int:
        if self.samples_per_epoch is not None:
            return self.samples_per_epoch
        if self.endless:
            raise TypeError("mix_by_weight(endless=True) without samples_per_epoch never ends: "
                            "it has no length")
        if self.stop == "first":
            raise TypeError("mix_by_weight(stop='first') has no length: where the first source "
                            "runs out depends on the draws; use stop='all' or samples_per_epoch")
        total = 0
        for name, pipe in self.sources.items():
            try:
                total += len(pipe)
            except TypeError as exc:
                raise TypeError(
                    f"mix_by_weight(stop='all') has no length: source {name!r} has none ({exc})"
                ) from None
        return total


WeightedMixer = WeightedMixerIterDataPipe


@functional_datapipe("sample_with_replacement")
class ReplacementSamplerIterDataPipe(Seeded, IterDataPipe):
    """Draw items at random with replacement (functional name: ``sample_with_replacement``).

    Consumes a random-access source -- a ``MapDataPipe`` (indexed ``0 .. len - 1``, like
    ``SequenceWrapper``) or a list/tuple -- or an ``IterDataPipe``, which is read into a list
    when each pass starts (so put it before decoding: sample the manifest, then load the
    audio). Yields ``num_samples`` items, each drawn independently (Parakeet's sampler: an
    epoch is a number of draws; ``num_samples=None`` draws forever). Registered on
    ``MapDataPipe`` too: ``SequenceWrapper(items).sample_with_replacement(1000)``. Use torch's
    ``shuffle`` for a permutation (sampling without replacement).

    Args:
        source: the items.
        num_samples: draws per pass (``len()``), or ``None`` for an endless stream (no length).
        weights: optional weight per item (finite, >= 0, not all 0): item ``i`` is drawn with
            probability ``weights[i] / sum(weights)``. Uniform by default.
        seed: base seed; the draws use ``(seed, epoch, rank, worker)``, so each DataLoader
            worker draws its own ``num_samples`` (add ``sharding_filter`` after this pipe to
            draw ``num_samples`` in all).

    >>> from speechpipe import SequenceWrapper
    >>> pipe = SequenceWrapper(["a", "b", "c"]).sample_with_replacement(5, seed=1)
    >>> list(pipe), len(pipe)
    (['b', 'b', 'a', 'a', 'c'], 5)
    >>> list(pipe.set_epoch(1)) != list(pipe.set_epoch(0))
    True
    """

    def __init__(
        self,
        source: MapDataPipe | IterDataPipe | Sequence[Any],
        num_samples: int | None,
        *,
        weights: Sequence[float] | None = None,
        seed: int = 0,
    ) -> None:
        random_access = isinstance(source, MapDataPipe) or (
            isinstance(source, Sequence) and not isinstance(source, (str, bytes)))
        if not random_access and not isinstance(source, IterDataPipe):
            raise TypeError(
                "source must be a MapDataPipe, a list/tuple or an IterDataPipe, "
                f"got {type(source).__name__}"
            )
        self.num_samples = check_int("num_samples", num_samples, 1, optional=True)
        if weights is not None:
            if isinstance(weights, (str, bytes)) or not isinstance(weights, Sequence):
                raise TypeError(f"weights must be a sequence of numbers or None, got {weights!r}")
            weights = [_check_weight(f"weights[{i}]", w, allow_zero=True)
                       for i, w in enumerate(weights)]
            if not any(weights):
                raise ValueError("weights must not all be 0")
            if random_access and len(weights) != len(source):
                raise ValueError(f"weights has {len(weights)} entries for {len(source)} items")
        elif random_access and len(source) == 0:
            raise ValueError("source is empty: sample_with_replacement has nothing to draw")
        self.source = source
        self.weights = weights
        self.seed = check_seed(seed)
        self.epoch = 0

    def __iter__(self) -> Iterator[Any]:
        self._begin_pass()
        rng = self._rng("sample_with_replacement")
        items = self.source
        if isinstance(items, IterDataPipe):
            items = list(items)
        yield from sample_with_replacement(items, self.num_samples, rng, weights=self.weights)

    def __len__(self) -> int:
        if self.num_samples is None:
            raise TypeError("sample_with_replacement(num_samples=None) draws forever: no length")
        return self.num_samples


ReplacementSampler = ReplacementSamplerIterDataPipe

# A MapDataPipe is the natural source (random access), so the name works there as well.
MapDataPipe.register_datapipe_as_function("sample_with_replacement", ReplacementSamplerIterDataPipe)
