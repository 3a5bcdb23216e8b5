"""The resume contract for a stage that holds samples between its input and its output.

A buffering stage subclasses :class:`Buffering` and writes two methods:

* ``hold()`` -- what a fresh pass holds: a dict of lists (or dicts, tuples) of samples,
  numbers, strings and ``random.Random`` generators;
* ``run(held, source)`` -- the algorithm: it reads ``source`` and keeps everything it holds in
  ``held``, changed in place (``append``, ``pop``, ``clear``; ``held["n"] += 1``). At each
  ``yield``, ``held`` is what the stage still holds: take out what you yield before yielding.

The base class does the rest, for every stage alike: a state names each held sample by its
identity ``(source, key)`` (never its value) and keeps generators by their state; a resumed
pass gets ``held`` back with the samples read again by the restore driver; a pass whose input
had ended when the state was taken does not read its input again; a replay pass for a stage
below passes items through. Example (the docs' group-by-n, tested)::

    class GrouperByN(sp.Buffering):
        def __init__(self, source_datapipe, n):
            self.source_datapipe, self.n = source_datapipe, n

        def hold(self):
            return {"group": []}

        def run(self, held, source):
            group = held["group"]
            for sample in source:
                group.append(sample)
                if len(group) == self.n:
                    out = group[:]
                    group.clear()
                    yield out
            if group:
                out = group[:]
                group.clear()
                yield out

A stage that holds nothing between two of its yields (a map, a filter) says so with the class
attribute ``holds_nothing = True``; the loader refuses, by name, any stage of the resumable
part of a pipeline that does neither (:func:`~speechpipe.pipes._core._restore.unresumable_reason`).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any, Iterable, Iterator

from ...errors import DataError
from ._base import IterDataPipe, plain_iterator
from ._state import Identity, Resumable, Seeded, identity, rng_state, until_end

__all__ = ["Buffering", "decode_held", "encode_held", "held_identities"]

_SAMPLE, _RNG, _DICT, _TUPLE = "@sample", "@rng", "@dict", "@tuple"


def encode_held(value: Any) -> Any:
    """``value`` with each sample replaced by its identity and each generator by its state.

    >>> import random
    >>> encode_held({"group": [{"key": "u1", "source": "a.tar"}], "n": 2})
    {'@dict': {'group': [{'@sample': ['a.tar', 'u1']}], 'n': 2}}
    """
    if isinstance(value, Mapping):
        if isinstance(value.get("key"), str):
            return {_SAMPLE: list(identity(value))}
        return {_DICT: {str(k): encode_held(v) for k, v in value.items()}}
    if isinstance(value, list):
        return [encode_held(v) for v in value]
    if isinstance(value, tuple):
        return {_TUPLE: [encode_held(v) for v in value]}
    if isinstance(value, random.Random):
        return {_RNG: value.getstate()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(
        f"a buffering stage's held state may hold samples, lists, dicts, tuples, numbers, "
        f"strings and random.Random generators; it holds a {type(value).__name__}")


def held_identities(encoded: Any) -> Iterator[Identity]:
    """The identities of the samples an encoded held state names, in order."""
    if isinstance(encoded, list):
        for v in encoded:
            yield from held_identities(v)
    elif isinstance(encoded, Mapping):
        if _SAMPLE in encoded:
            yield tuple(encoded[_SAMPLE])
        elif _DICT in encoded:
            for v in encoded[_DICT].values():
                yield from held_identities(v)
        elif _TUPLE in encoded:
            yield from held_identities(encoded[_TUPLE])


def decode_held(encoded: Any, samples: Mapping[Identity, Any], stage: str = "") -> Any:
    """An encoded held state back, with each identity replaced by the sample read again."""
    if isinstance(encoded, list):
        return [decode_held(v, samples, stage) for v in encoded]
    if isinstance(encoded, Mapping):
        if _SAMPLE in encoded:
            ident = tuple(encoded[_SAMPLE])
            if ident not in samples:
                raise DataError(f"resume: {stage or 'a stage'} held a sample that was not found "
                                "when re-reading", source=ident[0], key=ident[1])
            return samples[ident]
        if _RNG in encoded:
            rng = random.Random()
            rng.setstate(rng_state(encoded[_RNG]))
            return rng
        if _DICT in encoded:
            return {k: decode_held(v, samples, stage) for k, v in encoded[_DICT].items()}
        if _TUPLE in encoded:
            return tuple(decode_held(v, samples, stage) for v in encoded[_TUPLE])
        raise DataError(f"resume: {stage or 'a stage'}'s state is not one this version wrote "
                        f"(an object with keys {sorted(encoded)[:3]})")
    return encoded


@plain_iterator
class Buffering(Resumable, IterDataPipe):
    """Base class of a stage that holds samples between input and output: a subclass writes
    ``hold()`` and ``run(held, source)`` (see the module documentation), and sets
    ``source_datapipe`` in its ``__init__``."""

    def hold(self) -> dict:
        """What a fresh pass holds (a dict; its values are changed in place by ``run``)."""
        raise NotImplementedError

    def run(self, held: dict, source: Iterable[Any]) -> Iterator[Any]:
        """The algorithm: read ``source``, keep what is held in ``held``, yield the output."""
        raise NotImplementedError

    def __iter__(self) -> Iterator[Any]:
        if self.passthrough:  # a replay pass for a stage below: items pass on unchanged
            yield from self.source_datapipe
            return
        if isinstance(self, Seeded):
            self._begin_pass()
        state, samples = self._take_resume()
        if state is None:
            held, ended = self.hold(), False
        else:
            held = decode_held(state["held"], samples, type(self).__name__)
            ended = bool(state.get("ended"))
            if isinstance(self, Seeded) and "epoch" in state:
                self.epoch = int(state["epoch"])
        del samples  # the re-read samples are in ``held``: kept no longer than there
        live = self._live = {"held": held, "drain": ended}
        source = iter(()) if ended else until_end(self.source_datapipe, live)
        try:
            yield from self.run(held, source)
        finally:
            self._live = None

    def _snapshot(self, live: dict) -> dict:
        state = {"held": encode_held(live["held"]), "ended": bool(live["drain"])}
        if isinstance(self, Seeded):
            state["epoch"] = self.epoch
        return state

    def _needs(self, state: dict) -> list[Identity]:
        return list(held_identities(state["held"]))
