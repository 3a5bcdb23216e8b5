"""Counted, reported skipping: the only way speechpipe drops anything.

A stage that can meet bad input takes ``on_error=`` with one of :data:`ON_ERROR`:

- ``"raise"`` (the default): raise the :class:`~speechpipe.errors.DataError` naming the
  file and the line, member or key;
- ``"skip"``: drop the offending item, count it under a reason in a :class:`Diagnostics`
  object, keep a few examples, and warn once at the end of the pass with the totals.

The counts are per process: with DataLoader workers each worker counts its own share. Under
:func:`~speechpipe.loader.build_loader` the workers report their counts to the main process
at the end of a pass and stay quiet; the main process adds them up (an item recorded with its
``item`` identity counts once, however many workers met it: a filter before the split between
workers sees the whole list in each) and warns once per pass.

A skipped item may stand for more than itself: a truncated shard loses every utterance after
the break. A stage that knows what a skip loses (from the shard index) records it --
``record(..., lost=49, seconds=312.4)`` -- and the report says so; with ``planned`` set (the
count ``len()`` promised), it also says how short the pass came out.

>>> d = Diagnostics("parse_scp")
>>> d.record("malformed line", "wav.scp:3: expected '<key> <value>'")
>>> d.total
1
>>> print(d.report())
parse_scp skipped 1 item(s):
  malformed line: 1 (e.g. wav.scp:3: expected '<key> <value>')

A stage that buffers samples (``sharded_shuffle``'s shuffle buffer, ``bucket_by_length``'s
buckets, ``block_batch``'s shuffle window, ``prefetch_in_thread``'s queue, the list
``shuffle_samples`` holds) keeps a :class:`BufferStats` (its ``buffers`` attribute): the
samples and the bytes of their arrays it holds now and at its peak in the pass.
"""

from __future__ import annotations

import warnings
from collections import Counter
from typing import Any

import numpy as np

from .errors import DataError, redact

__all__ = [
    "BufferStats",
    "Diagnostics",
    "Ledger",
    "ON_ERROR",
    "SkippedInputWarning",
    "check_on_error",
    "held_bytes",
]

ON_ERROR = ("raise", "skip")


class SkippedInputWarning(UserWarning):
    """Warned at the end of a pass in which a ``on_error="skip"`` stage dropped input."""


#: True in a DataLoader worker whose counts the main process adds up and warns of
#: (:func:`~speechpipe.loader.build_loader`): the worker's own warnings would repeat them.
_REPORTED_BY_MAIN = False


def report_to_main_process() -> None:
    """In a DataLoader worker whose loader collects its counts: warn nothing here."""
    global _REPORTED_BY_MAIN
    _REPORTED_BY_MAIN = True


def check_on_error(on_error: str, name: str = "on_error") -> str:
    """Validate an ``on_error``-style argument called ``name`` (used by constructors)."""
    if on_error not in ON_ERROR:
        raise ValueError(f"{name} must be one of {ON_ERROR}, got {on_error!r}")
    return on_error


class Ledger:
    """The counters protocol: a record a stage keeps of its pass (skips, batches, tokens,
    buffers), which the loader gathers from its workers without knowing the stage.

    A stage exposes its ledgers as attributes; the loader finds every :class:`Ledger` in a
    pipeline's graph, writes each worker's ``to_dict()`` at the end of its pass, and in the main
    process resets its own copy and merges the workers' into it: added up, or,
    for a ledger with ``per_worker = True``, kept worker by worker.
    """

    #: Kept worker by worker (each entry tagged with its worker), not added up.
    per_worker: bool = False

    def reset(self) -> None:
        """Forget what the last pass recorded."""
        raise NotImplementedError

    def to_dict(self) -> dict:
        """What this process recorded, as JSON-friendly data."""
        raise NotImplementedError

    def merge(self, data: dict) -> None:
        """Add what another process recorded (a ``to_dict()`` of it)."""
        raise NotImplementedError

    def end_of_pass(self) -> None:
        """Said once per pass by the process that added the others up (warn what it counted)."""


class Diagnostics(Ledger):
    """Counts of skipped items by reason, with up to ``max_examples`` examples each.

    Args:
        stage: name shown in the report (usually the functional name of the pipe).
        max_examples: how many example locations to keep per reason.
    """

    def __init__(self, stage: str, max_examples: int = 3):
        self.stage = stage
        self.max_examples = max_examples
        self.counts: Counter[str] = Counter()
        self.examples: dict[str, list[str]] = {}
        self.quiet = False  # never warn (a stage's warn=False); the counts stay
        self.items: dict[str, set] = {}  # per reason, the identities recorded with item=
        self.lost = 0  # utterances lost with the skipped items (known from an index)
        self.lost_seconds = 0.0
        self.planned: int | None = None  # what len() promised for the pass, when known

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def record(self, reason: str, example: str, *, lost: int = 0,
               seconds: float = 0.0, item: Any = None) -> None:
        """Count one skipped item under ``reason``; ``lost``: the utterances it stood for
        (e.g. the rest of a truncated shard), ``seconds`` their duration; ``item``: its
        identity (a key), so that it counts once however often it is met (and when the
        counts of workers that each met it are added up)."""
        if item is not None:
            seen = self.items.setdefault(reason, set())
            if item in seen:
                return
            seen.add(item)
        self.counts[reason] += 1
        self.lost += lost
        self.lost_seconds += seconds
        kept = self.examples.setdefault(reason, [])
        if len(kept) < self.max_examples:
            kept.append(redact(example))

    def handle(self, on_error: str, error: DataError, reason: str | None = None, *,
               lost: int = 0, seconds: float = 0.0, example: str | None = None) -> None:
        """Raise ``error`` under ``"raise"``; count it under ``"skip"`` (with what it lost,
        see :meth:`record`; ``example`` replaces the error's text in the report)."""
        if on_error == "raise":
            raise error
        self.record(reason or type(error).__name__, example or str(error), lost=lost,
                    seconds=seconds)

    def reset(self) -> None:
        self.counts.clear()
        self.examples.clear()
        self.items.clear()
        self.lost, self.lost_seconds, self.planned = 0, 0.0, None

    def to_dict(self) -> dict:
        """Counts and examples as plain data (what a DataLoader worker reports)."""
        return {"counts": dict(self.counts), "examples": {k: list(v) for k, v in
                                                          self.examples.items()},
                "items": {k: sorted(v, key=str) for k, v in self.items.items()},
                "lost": self.lost, "lost_seconds": self.lost_seconds, "planned": self.planned}

    def merge(self, data: dict) -> None:
        """Add the counts and examples of :meth:`to_dict` output (another worker's pass).

        >>> a, b = Diagnostics("s"), Diagnostics("s")
        >>> a.record("bad line", "a.scp:2"); b.record("bad line", "b.scp:7")
        >>> a.merge(b.to_dict()); a.counts["bad line"], a.examples["bad line"]
        (2, ['a.scp:2', 'b.scp:7'])
        """
        items = data.get("items", {})
        for reason, n in data["counts"].items():
            known = items.get(reason, [])
            seen = self.items.setdefault(reason, set()) if known else None
            new = [i for i in known if i not in seen] if known else []
            self.counts[reason] += int(n) - len(known) + len(new)  # identities count once
            if seen is not None:
                seen.update(new)
            kept = self.examples.setdefault(reason, [])
            for example in data["examples"].get(reason, []):
                if len(kept) < self.max_examples and example not in kept:
                    kept.append(example)
        self.lost += int(data.get("lost", 0))
        self.lost_seconds += float(data.get("lost_seconds", 0.0))
        if data.get("planned") is not None:
            self.planned = (self.planned or 0) + int(data["planned"])

    def report(self) -> str:
        """The counts by reason with an example each; what the skips lost, and how short the
        pass came out of what ``len()`` planned.

        >>> d = Diagnostics("sharded_shuffle")
        >>> d.planned = 185
        >>> d.record("truncated shard", "skipped shard a.tar: 49 utterances, 312.4 s",
        ...          lost=49, seconds=312.4)
        >>> print(d.report())
        sharded_shuffle skipped 1 item(s), losing 49 utterance(s) (312.4 s):
          truncated shard: 1 (e.g. skipped shard a.tar: 49 utterances, 312.4 s)
          the pass came out short: 136 of the 185 utterances planned (len()) came out
        """
        if not self.counts:
            return f"{self.stage} skipped nothing"
        lost = (f", losing {self.lost} utterance(s) ({self.lost_seconds:.1f} s)"
                if self.lost else "")
        lines = [f"{self.stage} skipped {self.total} item(s){lost}:"]
        for reason, n in sorted(self.counts.items()):
            lines.append(f"  {reason}: {n} (e.g. {self.examples[reason][0]})")
        if self.lost and self.planned is not None:
            lines.append(f"  the pass came out short: {self.planned - self.lost} of the "
                         f"{self.planned} utterances planned (len()) came out")
        return "\n".join(lines)

    def warn_if_skipped(self) -> None:
        """Warn with :meth:`report` if anything was skipped (call at the end of a pass); not
        in a DataLoader worker whose counts the main process adds up and warns of, nor when
        :attr:`quiet`."""
        if self.counts and not self.quiet and not _REPORTED_BY_MAIN:
            warnings.warn(self.report(), SkippedInputWarning, stacklevel=3)

    def end_of_pass(self) -> None:
        self.warn_if_skipped()

    def __repr__(self) -> str:
        return f"Diagnostics({self.stage!r}, counts={dict(self.counts)})"


# --------------------------------------------------------------------------- buffers

def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 100_000 else f"{n / 1e3:.1f} kB"


def held_bytes(item: Any) -> tuple[int, int]:
    """``(samples, bytes)`` of an item a buffer holds: a sample dict is one sample whose bytes
    are those of its array-like values (numpy arrays, tensors, ``bytes``/``memoryview`` s --
    a view of a memory-mapped shard counts as its view's bytes, not the whole mapping's; nested
    containers are not walked); a list or tuple (a batch, a group) is its samples' sum; anything
    else is one sample of 0 bytes.

    >>> import numpy as np
    >>> held_bytes({"key": "u1", "feats": np.zeros((10, 4), np.float32), "text": "hi"})
    (1, 160)
    >>> held_bytes([{"audio": memoryview(bytes(100))}, {"audio": b"abc"}])
    (2, 103)
    """
    kind = type(item)
    if kind is dict:
        return 1, _sample_bytes(item)
    if kind is list or kind is tuple:
        total = 0
        for sample in item:
            total += _sample_bytes(sample) if type(sample) is dict else _nbytes(sample)
        return len(item), total
    return 1, _nbytes(item)


_NO_BYTES = frozenset({str, int, float, bool, type(None)})
_ARRAY = np.ndarray


def _sample_bytes(sample: dict) -> int:
    total = 0
    for value in sample.values():  # the usual types without a call, the rest by _nbytes
        kind = type(value)
        if kind in _NO_BYTES:  # key, source, text
            continue
        if kind is _ARRAY or kind is memoryview:  # decoded arrays, mapped shard payloads
            total += value.nbytes
        elif kind is bytes:  # payloads read into memory
            total += len(value)
        else:
            total += _nbytes(value)
    return total


def _nbytes(value: Any) -> int:
    if isinstance(value, (bytes, bytearray)):
        return len(value)
    nbytes = getattr(value, "nbytes", None)  # numpy arrays, tensors, memoryviews
    return nbytes if type(nbytes) is int else 0


class BufferStats(Ledger):
    """What a buffering stage holds: samples and their array bytes (:func:`held_bytes`), now
    and at the peak of the pass. Counted when an item enters (:meth:`add`) and leaves
    (:meth:`remove`), not by walking the buffer.

    In the main process after a loader pass with DataLoader workers, :attr:`workers` holds
    each worker's figures (:meth:`merge`), as ``{"worker", "peak_samples", "peak_bytes"}``.

    >>> import numpy as np
    >>> b = BufferStats("block_batch")
    >>> batch = [{"feats": np.zeros((250, 80), np.float32)}] * 4
    >>> b.add(batch), b.add(batch)  # each returns the bytes it counted
    (320000, 320000)
    >>> b.remove(batch, 320000)  # with what add returned, the batch is not walked again
    >>> b.samples, b.bytes, b.peak_samples, b.peak_bytes
    (4, 320000, 8, 640000)
    >>> print(b.report())
    block_batch buffers: 8 sample(s), 0.6 MB at peak (array bytes; 4 held now)
    """

    per_worker = True  # buffers are a worker's own: summing them would mean nothing

    def __init__(self, stage: str) -> None:
        self.stage = stage
        self.workers: list[dict] = []
        self.reset()

    def reset(self) -> None:
        self.samples = self.bytes = self.peak_samples = self.peak_bytes = 0
        self.workers = []

    def add(self, item: Any) -> int:
        """Count ``item`` (a sample, or a list or tuple of them) in; returns its bytes, for
        :meth:`remove` to take it out again without walking it a second time."""
        if type(item) is dict:  # a sample: the usual case, without held_bytes' tuple
            n, b = 1, _sample_bytes(item)
        else:
            n, b = held_bytes(item)
        self.samples += n
        self.bytes += b
        if self.samples > self.peak_samples:  # noqa: PLR1730 (per item: cheaper than max())
            self.peak_samples = self.samples
        if self.bytes > self.peak_bytes:  # noqa: PLR1730
            self.peak_bytes = self.bytes
        return b

    def remove(self, item: Any, nbytes: int | None = None) -> None:
        """Count ``item`` out; ``nbytes``: what :meth:`add` returned for it, so that it is not
        walked again."""
        if nbytes is None:
            n, nbytes = held_bytes(item)
        else:
            kind = type(item)
            n = len(item) if kind is list or kind is tuple else 1
        self.samples -= n
        self.bytes -= nbytes

    def to_dict(self) -> dict:
        """The figures as plain data (what a DataLoader worker reports)."""
        return {"samples": self.samples, "bytes": self.bytes,
                "peak_samples": self.peak_samples, "peak_bytes": self.peak_bytes}

    def merge(self, data: dict) -> None:
        """Keep another process's figures (a worker's, :meth:`to_dict` with ``"worker"``) in
        :attr:`workers`; the peaks here become the largest worker's."""
        self.workers.append({"worker": data.get("worker"),
                             "peak_samples": int(data["peak_samples"]),
                             "peak_bytes": int(data["peak_bytes"])})
        self.peak_samples = max(self.peak_samples, int(data["peak_samples"]))
        self.peak_bytes = max(self.peak_bytes, int(data["peak_bytes"]))

    def report(self) -> str:
        """One line: the peak samples and MB (10^6 bytes; kB below 0.1 MB) of arrays, per worker
        when merged."""
        if self.workers:
            parts = "; ".join(f"worker {w['worker']}: {w['peak_samples']} sample(s), "
                              f"{_size(w['peak_bytes'])}" for w in self.workers)
            return f"{self.stage} buffers at peak (array bytes), per worker: {parts}"
        return (f"{self.stage} buffers: {self.peak_samples} sample(s), "
                f"{_size(self.peak_bytes)} at peak (array bytes; {self.samples} held now)")

    def __repr__(self) -> str:
        return (f"BufferStats({self.stage!r}, peak_samples={self.peak_samples}, "
                f"peak_bytes={self.peak_bytes})")
