"""The state protocol every speechpipe stage speaks: seeding and exact resume.

Declared here and nowhere else:

* :class:`Seeded` -- a random stage: ``seed``, ``epoch``, ``set_epoch()`` and generators
  derived from ``(seed, epoch, rank, worker)`` (:mod:`speechpipe.seeding`).
* :class:`Resumable` -- a stage whose pass can be resumed exactly. What the restore driver
  (:mod:`speechpipe.pipes._core._restore`, used by the loader) calls is public:
  ``state_dict()`` / ``load_state_dict()``, ``held_identities()`` (the samples a loaded state
  holds, named by identity ``(source, key)``), ``restore_held()`` (those samples, read again),
  ``passthrough`` (a replay pass for a stage below is running: pass items on as a plain map
  would), ``paused()`` (a consistent moment to take a state) and ``end_pass()``.
  What an implementation supplies is protected: ``_snapshot(live)`` (the state of the running
  pass, from what the generator holds in ``self._live``) and ``_needs(state)`` (the identities
  a state holds); in ``__iter__`` it takes its loaded state once with ``_take_resume()``.
* :class:`SampleSource` -- a resumable stage a pass starts from: it knows its position, so the
  stages above can be resumed. ``sharded_shuffle`` re-reads held samples by identity
  (``rereads_held``); ``batch_by_view`` holds none.

Every stage may also say which of its attributes decide the batches (``decides_batches``, a
tuple of attribute names; None, the default, derives them: the public attributes that hold
settings, see :mod:`speechpipe.pipes._core._fingerprint`). A loader state carries their values, and
a state is refused by a pipeline whose values differ.

A stage that keeps items in its generator's locals and is none of these (torch's ``shuffle``,
``batch``...) cannot be resumed: :func:`speechpipe.pipes._core._restore.unresumable_reason` names it.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Mapping
from typing import Any, Iterable, Iterator

from ...errors import DataError
from ...sample import KEY, SOURCE
from ...seeding import CarriesRank, derive_rng, process_position

__all__ = ["EpochWarning", "Identity", "Resumable", "SampleSource", "Seeded", "check_seed",
           "held_sample", "identity", "identity_list", "rng_state", "until_end"]

#: How a resumable state names a sample: ``(source, key)`` (``source`` may be ``""``).
Identity = tuple[str, str]


class Seeded(CarriesRank):
    """Seed, epoch and the per-process random generator of a random pipe (its pickle carries
    the rank into spawned DataLoader workers: :class:`~speechpipe.seeding.CarriesRank`)."""

    seed: int
    epoch: int
    #: Its draws follow one another within a pass, so a resumed pass cannot repeat them (the
    #: restore warns); a stage whose configuration draws nothing says False.
    draws_in_sequence: bool = True
    #: The attributes that decide the batches (None: derived, see the module documentation).
    decides_batches: tuple[str, ...] | None = None

    def set_epoch(self, epoch: int) -> "Seeded":
        """Use ``epoch`` for the next pass's random order (returns the pipe, for chaining).

        Without it, each pass after the first is the next epoch (so the same order never
        comes twice in a row silently)."""
        if not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"epoch must be an int >= 0, got {epoch!r}")
        self.epoch = epoch
        self._epoch_given = True
        return self

    def set_seed(self, seed: int) -> "Seeded":
        """What torch's DataLoader calls on the main process's pipe at every ``iter()``,
        before the workers start from a copy of it: each such call after the first is the
        next epoch (unless :meth:`set_epoch` gave one since), so that workers that are not
        persistent -- fresh copies each epoch -- start from the epoch's order instead of
        repeating the first. torch's ``seed`` is not used: the order comes from ``(seed,
        epoch)``, the same on every rank.

        Which calls count is told from the calls themselves, without looking at torch's
        code: an iterator with workers (torch 2.14's dataloader.py) seeds the pipe in its
        ``__init__`` before starting them (that call counts), in its ``_reset`` right after
        (the second of the pair: it does not), and each worker seeds its own copy, in
        another process (not counted either: the copy keeps the epoch it was given). A pass
        of the pipe in this process (no workers) starts the count of pairs again. A worker
        whose copy was not taken right after a counted call -- another torch seeding in
        another order, or a ``set_seed`` of the user's -- warns (:class:`EpochWarning`) that
        its epoch may repeat one."""
        import os

        pid = os.getpid()
        if self.__dict__.get("_seed_pid", pid) != pid:  # a copy in a DataLoader worker
            if not self.__dict__.get("_seed_counted", True) and not _warned_in_worker:
                _warn_copied_after_an_uncounted_call(type(self).__name__, self.epoch)
            self._seed_pid, self._seed_calls = pid, 1  # its next call is the second of a pair
            return self
        calls = self.__dict__.get("_seed_calls", 0)  # since this object's last pass here
        self._seed_pid, self._seed_calls = pid, calls + 1
        self._seed_counted = calls % 2 == 0
        if not self._seed_counted:  # the iterator's _reset, after the workers copied it
            return self
        epochs = self.__dict__.get("_loader_epochs", 0)
        if epochs and not self.__dict__.get("_epoch_given", False):
            self.epoch += 1
        self._loader_epochs = epochs + 1
        self._epoch_given = False
        self._epoch_from_loader = True  # the workers' copies: this pass's epoch is given
        return self

    def _begin_pass(self) -> None:
        """Called by each random stage when a pass starts: a pass not preceded by
        ``set_epoch`` is the next epoch. A copy of the stage in a DataLoader worker that was
        never given an epoch (a fresh copy each epoch: torch's DataLoader without
        ``speechpipe.build_loader``) cannot know its epoch: it warns, once per process."""
        passes = self.__dict__.get("_passes", 0)
        given = self.__dict__.get("_epoch_given", False) or self.__dict__.pop(
            "_epoch_from_loader", False)
        if passes and not given:
            self.epoch += 1
        elif not passes and not given and not _warned_in_worker:
            _warn_if_worker_without_epoch(type(self).__name__)
        self._passes = passes + 1
        self._epoch_given = False
        self._seed_calls = 0  # the next set_seed (a DataLoader's iter()) is a new epoch's

    def _rng(self, salt: str):
        """A ``random.Random`` from ``(seed, epoch, rank, worker, salt)`` of this process."""
        where = process_position()
        return derive_rng(self.seed, self.epoch, where.rank, where.worker, salt)


class EpochWarning(UserWarning):
    """A random stage cannot know its epoch: its order will repeat every epoch."""


_warned_in_worker = False


def _warn_if_worker_without_epoch(stage: str) -> None:
    global _warned_in_worker
    import torch.utils.data

    if torch.utils.data.get_worker_info() is None:
        return
    _warned_in_worker = True
    warnings.warn(
        f"{stage} runs in a DataLoader worker but no epoch was set on it: a worker that is not "
        "persistent starts from a fresh copy every epoch, so every epoch repeats this order. "
        "Build the loader with speechpipe.build_loader (epochs reach its workers), or call "
        "speechpipe.set_epoch(pipe, epoch) before each epoch", EpochWarning, stacklevel=4)


def _warn_copied_after_an_uncounted_call(stage: str, epoch: int) -> None:
    global _warned_in_worker
    import torch

    _warned_in_worker = True
    warnings.warn(
        f"{stage} was copied into a DataLoader worker after a set_seed call that did not "
        f"count as a new epoch (torch {torch.__version__} seeds pipes in an order speechpipe "
        "does not know, or set_seed was called by hand): this worker keeps epoch "
        f"{epoch}, which may repeat an earlier epoch's order. Build the loader with "
        "speechpipe.build_loader (epochs reach its workers), or call "
        "speechpipe.set_epoch(pipe, epoch) before each epoch", EpochWarning, stacklevel=4)


def check_seed(seed: int) -> int:
    """``seed`` if it is an int, else a ``TypeError`` naming it."""
    if not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {seed!r}")
    return seed


# --------------------------------------------------------------------------- identities


def identity(item: Any) -> Identity:
    """``(source, key)`` of a sample held in a resumable state.

    >>> identity({"key": "u1", "source": "a.tar"}), identity({"key": "u2"})
    (('a.tar', 'u1'), ('', 'u2'))
    """
    if type(item) is dict or isinstance(item, Mapping):  # dict first: states are taken often
        key = item.get(KEY)
        if isinstance(key, str):
            return (str(item.get(SOURCE) or ""), key)
    raise TypeError(
        f"exact resume names the samples a stage holds by their 'key' (and 'source'), but it "
        f"holds a {type(item).__name__}; resume a pipeline of sample dicts"
    )


def identity_list(items: Iterable[Any]) -> list[list[str]]:
    """The identities of ``items`` in the form a state stores them (lists, JSON-friendly)."""
    return [list(identity(item)) for item in items]


def held_sample(samples: Mapping, ident: Any) -> Any:
    """The sample named ``ident`` among ``samples`` read again, or a ``DataError`` naming it."""
    key = tuple(ident)
    if key not in samples:
        raise DataError("resume: a held sample was not found when re-reading",
                        source=key[0], key=key[1])
    return samples[key]


def rng_state(state: Any) -> tuple:
    """A ``random.Random`` state back from its stored form (tuples may come back as lists)."""
    version, internal, gauss = state
    return (version, tuple(internal), gauss)


def until_end(items: Iterable[Any], live: dict) -> Iterator[Any]:
    """``items``, then ``live["drain"] = True``: a state taken after the source ended says so."""
    yield from items
    live["drain"] = True


# --------------------------------------------------------------------------- the protocol


class Resumable:
    """A pipe whose pass can be resumed exactly (the protocol: see the module documentation).

    ``state_dict()`` describes the running pass (``{}`` outside a pass: start afresh);
    ``load_state_dict(state)`` keeps it for the next pass. Subclasses set ``self._live`` (what
    the running generator holds) and implement ``_snapshot(live)`` and ``_needs(state)``.
    """

    _live: Any = None
    _resume_state: dict | None = None
    _resume_samples: dict | None = None
    #: True while the driver replays held samples for a stage below: pass items through.
    passthrough: bool = False
    #: The attributes that decide the batches (None: derived, see the module documentation).
    decides_batches: tuple[str, ...] | None = None

    def state_dict(self) -> dict:
        """The state of the running pass (a small dict of ints, identities, rng states)."""
        if self._resume_state is not None:
            return dict(self._resume_state)
        live = self._live
        return {} if live is None else self._snapshot(live)

    def load_state_dict(self, state: Mapping) -> None:
        """Resume the next pass from ``state`` (``{}``: start afresh)."""
        if not isinstance(state, Mapping):
            raise TypeError(f"state must be a dict from state_dict(), got {state!r}")
        self._resume_state = dict(state) if state else None
        self._resume_samples = None

    def held_identities(self) -> list[Identity]:
        """The samples the loaded state holds (the driver reads them again)."""
        return [] if self._resume_state is None else self._needs(self._resume_state)

    def restore_held(self, samples: Mapping[Identity, Any]) -> None:
        """The samples of :meth:`held_identities`, read again, for the next pass to hold."""
        self._resume_samples = dict(samples)

    def paused(self) -> contextlib.AbstractContextManager:
        """A moment at which a state of this stage and the ones above is consistent (a thread
        stage stops reading from the stages below); for most stages, any moment."""
        return contextlib.nullcontext()

    def end_pass(self) -> None:
        """Drop a loaded state and samples the pass did not use (the pass ended or failed)."""
        self._resume_state = self._resume_samples = None

    # -- what implementations supply

    def _snapshot(self, live: Any) -> dict:
        raise NotImplementedError

    def _needs(self, state: dict) -> list[Identity]:
        return []

    def _take_resume(self) -> tuple[dict | None, dict]:
        """The loaded state and held samples, once (the pass that uses them takes them)."""
        state, samples = self._resume_state, self._resume_samples or {}
        self._resume_state = self._resume_samples = None
        return state, samples


class SampleSource(Resumable):
    """A resumable stage a pass starts from: it knows its position in the epoch.

    ``rereads_held``: whether it can read samples again by identity, for the stages above that
    held them (:meth:`prepare_resume`, :meth:`request_replay`); a source that cannot (it holds
    none, and the stages above it hold no samples) leaves it False.
    """

    rereads_held: bool = False

    def prepare_resume(self, needs: list[Identity]) -> None:
        """Position the reader where the loaded state stood; ``needs`` are the samples held by
        the stages above, which it may read at the same time (once)."""

    def request_replay(self, needs: list[Identity] | None) -> None:
        """Make the next pass yield exactly ``needs`` (then a normal pass); ``None`` cancels."""
        raise TypeError(f"{type(self).__name__} cannot read samples again by identity")
