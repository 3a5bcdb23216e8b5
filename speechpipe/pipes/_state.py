"""The state protocol every speechpipe stage speaks: seeding and exact resume.

Two mixins, declared here and nowhere else:

* :class:`_Seeded` -- a random stage: ``seed``, ``epoch``, ``set_epoch()`` and a generator
  derived from ``(seed, epoch, rank, worker)`` (:mod:`speechpipe.seeding`).
* :class:`_Resumable` -- a stage whose pass can be resumed exactly: ``state_dict()`` /
  ``load_state_dict()``, plus what the restore driver (:mod:`speechpipe.pipes._restore`)
  needs to hand back the samples the stage held, by identity ``(source, key)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Iterable, Iterator

from ..errors import DataError
from ..sample import KEY, SOURCE
from ..seeding import CarriesRank, derive_rng, process_position

__all__: list[str] = []  # the protocol's names are made public in the next step

class _Seeded(CarriesRank):
    """Seed, epoch and the per-process random generator of a random pipe (its pickle carries
    the rank into spawned DataLoader workers: :class:`~speechpipe.seeding.CarriesRank`)."""

    seed: int
    epoch: int

    def set_epoch(self, epoch: int) -> "_Seeded":
        """Use ``epoch`` for the next pass's random order (returns the pipe, for chaining)."""
        if not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"epoch must be an int >= 0, got {epoch!r}")
        self.epoch = epoch
        return self

    def _rng(self, salt: str):
        where = process_position()
        return derive_rng(self.seed, self.epoch, where.rank, where.worker, salt)


def _check_seed(seed: int) -> int:
    if not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {seed!r}")
    return seed


# --------------------------------------------------------------------------- resumable state
# Exact mid-epoch resume is driven by speechpipe.loader.PipeDataset (its docstring has the
# protocol). A pipe that holds samples between two of its yields names them in its state by
# identity, (source, key); on restore the driver re-reads exactly those samples through the
# stages above the pipe and hands them back in ``_resume_samples``.


def _identity(item: Any) -> tuple[str, str]:
    """``(source, key)`` of a sample held in a resumable state."""
    if type(item) is dict or isinstance(item, Mapping):  # dict first: states are taken often
        key = item.get(KEY)
        if isinstance(key, str):
            return (str(item.get(SOURCE) or ""), key)
    raise TypeError(
        f"exact resume names the samples a stage holds by their 'key' (and 'source'), but it "
        f"holds a {type(item).__name__}; resume a pipeline of sample dicts"
    )


def _ident_list(items: Iterable[Any]) -> list[list[str]]:
    return [list(_identity(item)) for item in items]


def _rng_state(state: Any) -> tuple:
    """A ``random.Random`` state back from its stored form (tuples may come back as lists)."""
    version, internal, gauss = state
    return (version, tuple(internal), gauss)


class _Resumable:
    """``state_dict()``/``load_state_dict()`` of a pipe whose pass can be resumed exactly.

    ``state_dict()`` describes the running pass (``{}`` outside a pass: start afresh);
    ``load_state_dict(state)`` keeps it for the next pass. Subclasses set ``self._live`` (what
    the running generator holds) and implement ``_snapshot(live)`` and ``_needs(state)`` (the
    identities of the samples the state holds, which the driver re-reads).
    """

    _live: Any = None
    _resume_state: dict | None = None
    _resume_samples: dict | None = None
    _passthrough: bool = False  # set by the driver during a replay pass for a stage below

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

    def _snapshot(self, live: Any) -> dict:
        raise NotImplementedError

    def _needs(self, state: dict) -> list[tuple[str, str]]:
        return []

    def _resume_needs(self) -> list[tuple[str, str]]:
        return [] if self._resume_state is None else self._needs(self._resume_state)

    def _take_resume(self) -> tuple[dict | None, dict]:
        state, samples = self._resume_state, self._resume_samples or {}
        self._resume_state = self._resume_samples = None
        return state, samples


def _held(samples: Mapping, ident: Any) -> Any:
    key = tuple(ident)
    if key not in samples:
        raise DataError("resume: a held sample was not found when re-reading",
                        source=key[0], key=key[1])
    return samples[key]


def _until_end(items: Iterable[Any], live: dict) -> Iterator[Any]:
    yield from items
    live["drain"] = True
