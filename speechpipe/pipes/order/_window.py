"""Combining and ordering samples: joins by key, and the one sliding-window shuffle.

- :func:`shuffle_window` (also as :func:`shuffle_buffer`): emit a stream in a random order
  within a sliding window -- ``sharded_shuffle``'s sample buffer and ``block_batch``'s batch
  window, resumable from the window's contents.
- ``join_by_key`` (:class:`KeyJoinerIterDataPipe`): add the fields of one or more keyed
  tables (transcripts, speakers, durations) to a stream of samples, matching by ``key`` --
  the way Kaldi's ``feats.scp`` and ``text`` or a manifest and its audio are put together.
  Torch's ``zip`` pairs by position; this pairs by key and says which keys do not match.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Mapping

from ...diagnostics import Diagnostics, check_on_error, held_bytes
from ...errors import DataError, locate
from ...sample import KEY, SOURCE
from .._core import functional_datapipe, IterDataPipe
from .._core import graph_nodes

__all__ = ["KeyJoinerIterDataPipe", "join_by_key", "shuffle_buffer", "shuffle_window"]

_EXAMPLES = 5


def _table_name(table: Any, index: int) -> str:
    """``#index``, and the files the table is read from when its pipe starts from a list of
    paths (``IterableWrapper(["data/text"]).open().parse_scp().load_scp("text")``)."""
    for node in reversed(graph_nodes(table) if isinstance(table, IterDataPipe) else []):
        paths = getattr(node, "iterable", None)
        if (isinstance(paths, (list, tuple)) and paths
                and all(isinstance(p, str) for p in paths)):
            more = ", ..." if len(paths) > 3 else ""
            return f"#{index} ({', '.join(paths[:3])}{more})"
    return f"#{index}"


def _load_table(table: Iterable[Mapping], name: str) -> dict[str, Mapping]:
    rows: dict[str, Mapping] = {}
    for row in table:
        key = row.get(KEY) if isinstance(row, Mapping) else None
        if not isinstance(key, str):
            raise DataError(
                f"join_by_key table {name} yields {type(row).__name__} elements without a "
                "string 'key' field; give it sample dicts"
            )
        if key in rows:
            first = rows[key].get(SOURCE)
            raise DataError(
                f"key appears twice in join_by_key table {name}"
                + (f", first at {first}" if first is not None else ""),
                source=row.get(SOURCE),
                key=key,
            )
        rows[key] = row
    return rows


def join_by_key(
    samples: Iterable[Mapping],
    tables: list[Iterable[Mapping]],
    *,
    on_missing: str = "raise",
    diagnostics: Diagnostics | None = None,
) -> Iterator[dict]:
    """Merge the fields of keyed ``tables`` into each sample of ``samples``.

    The tables are read into memory when iteration starts (they are transcripts and other
    small per-utterance tables; stream the big one). A field present in both with different
    values is an error. An error names a table by its number and the files its pipe reads, and
    the row at fault by its ``source`` (``load_scp`` gives ``file:line``); a stream key that a
    table lacks is named with the stream sample's ``source``.

    Args:
        samples: the stream (dicts with ``key``).
        tables: dict-yielding iterables, each with unique keys.
        on_missing: ``"raise"`` -- a stream key absent from a table, or a table key never
            seen in the stream, raises :class:`DataError` naming keys; ``"skip"`` -- stream
            samples without a match are dropped and both kinds are counted in ``diagnostics``.
        diagnostics: where skipped keys are counted under ``"skip"``.

    >>> feats = [{"key": "u1", "feats": 1}, {"key": "u2", "feats": 2}]
    >>> text = [{"key": "u2", "text": "B"}, {"key": "u1", "text": "A"}]
    >>> list(join_by_key(feats, [text]))
    [{'key': 'u1', 'feats': 1, 'text': 'A'}, {'key': 'u2', 'feats': 2, 'text': 'B'}]
    """
    check_on_error(on_missing, "on_missing")
    if diagnostics is None:
        diagnostics = Diagnostics("join_by_key")
    names = [_table_name(t, i) for i, t in enumerate(tables, start=1)]
    loaded = [_load_table(t, name) for t, name in zip(tables, names)]
    seen: list[set[str]] = [set() for _ in loaded]
    for sample in samples:
        key = sample.get(KEY)
        merged = dict(sample)
        complete = True
        for i, rows in enumerate(loaded):
            row = rows.get(key)
            if row is None:
                diagnostics.handle(
                    on_missing,
                    DataError(
                        f"key is missing from join_by_key table {names[i]}",
                        source=sample.get(SOURCE),
                        key=key,
                    ),
                    reason=f"stream key missing from table #{i + 1}",
                )
                complete = False
                break
            seen[i].add(key)
            _merge_row(merged, row, i + 1, names[i])
        if complete:
            yield merged
    for i, rows in enumerate(loaded):
        unseen = [k for k in rows if k not in seen[i]]  # in the table's order
        if not unseen:
            continue
        if on_missing == "raise":
            raise DataError(
                f"{len(unseen)} key(s) of join_by_key table {names[i]} never appeared in the "
                f"stream, e.g. {unseen[:_EXAMPLES]}; pass on_missing='skip' to count "
                "and drop them",
                source=rows[unseen[0]].get(SOURCE),
                key=unseen[0],
            )
        for k in unseen:
            diagnostics.record(f"table #{i + 1} key not in stream",
                               locate(rows[k].get(SOURCE), key=k))


def _merge_row(merged: dict, row: Mapping, number: int, name: str) -> None:
    """Add ``row``'s fields to the stream sample ``merged``; a field both hold with different
    values is an error naming the sample and the row of table ``number`` (the row's
    ``source``, else the table's ``name``)."""
    for field, value in row.items():
        if field in (KEY, SOURCE):
            continue
        if field in merged and not _same(merged[field], value):
            at = row.get(SOURCE)
            table = (f"{at} (join_by_key table #{number})" if at is not None
                     else f"join_by_key table {name}")
            raise DataError(
                f"field {field!r} differs between the stream and {table}: "
                f"{merged[field]!r} vs {value!r}",
                source=merged.get(SOURCE),
                key=merged.get(KEY),
            )
        merged[field] = value


def _same(a, b) -> bool:
    try:
        return bool(a == b)
    except (ValueError, TypeError):  # arrays: ambiguous truth value
        return a is b


# --------------------------------------------------------------------------- shuffling


def shuffle_window(
    items: Iterable[Any], window: int, rng, pool: list | None = None, meter: Any = None
) -> Iterator[Any]:
    """Emit ``items`` in a random order within a sliding window of ``window`` items.

    Each item read goes into the window (``pool``); once it holds ``window`` items, a uniformly
    chosen one is emitted before the next is read; at the end the rest comes out in random
    order. So at most ``window`` items are held, and the items read are never more than
    ``window`` ahead of those emitted; an item can move forward any distance but back by less
    than ``window`` places. ``window=1`` keeps the order (and draws nothing from ``rng``).
    This is the one sliding-window shuffle: ``sharded_shuffle``'s sample buffer
    (:func:`shuffle_buffer`) and ``block_batch``'s batch window.

    ``pool`` (for resuming) is the window to start from; it is updated in place, and after the
    end of ``items`` it holds the rest, last first (``pool.pop()`` gives the next).
    ``meter`` (a :class:`~speechpipe.diagnostics.BufferStats`) is told of each item entering
    and leaving the window (the caller counts a ``pool`` it starts from). No local keeps an
    item once handed over.

    >>> import random
    >>> sorted(shuffle_window(range(10), 4, random.Random(0))) == list(range(10))
    True
    >>> list(shuffle_window(range(5), 1, random.Random(0)))
    [0, 1, 2, 3, 4]
    """
    if window <= 1:
        yield from items
        return
    if pool is None:
        pool = []
    # ``del item``: the item just read may be the one handed over next (see the docstring)
    if meter is None:
        for item in items:
            pool.append(item)
            del item
            if len(pool) >= window:
                i = rng.randrange(len(pool))
                pool[i], pool[-1] = pool[-1], pool[i]
                yield pool.pop()
    else:  # each item's bytes, counted once as it enters, kept beside it in ``sizes``
        add, remove = meter.add, meter.remove
        sizes = [held_bytes(item)[1] for item in pool]
        for item in items:
            pool.append(item)
            sizes.append(add(item))
            del item
            if len(pool) >= window:
                i = rng.randrange(len(pool))
                pool[i], pool[-1] = pool[-1], pool[i]
                sizes[i], sizes[-1] = sizes[-1], sizes[i]
                remove(pool[-1], sizes.pop())
                yield pool.pop()
    rng.shuffle(pool)
    pool.reverse()
    yield from drain_pool(pool, meter)


def drain_pool(pool: list, meter: Any = None) -> Iterator[Any]:
    """Pop and yield ``pool``'s items, last first, telling ``meter`` of each that leaves.

    >>> list(drain_pool([1, 2, 3]))
    [3, 2, 1]
    """
    # no local names the item handed over: a group split downstream is freed as it goes
    while pool:
        if meter is not None:
            meter.remove(pool[-1])
        yield pool.pop()


def shuffle_buffer(
    samples: Iterable[Any], buffer_size: int, rng, buffer: list | None = None,
    meter: Any = None,
) -> Iterator[Any]:
    """Shuffle a stream in a buffer of ``buffer_size`` items: :func:`shuffle_window` (the
    sample level of ``sharded_shuffle``), with ``buffer_size`` checked to be an int >= 1.

    Args:
        samples: the stream.
        buffer_size: items held, ``>= 1``; ``1`` keeps the order.
        rng: a ``random.Random``.
        buffer: the buffer to start from (resuming); updated in place.

    >>> import random
    >>> list(shuffle_buffer(range(5), 1, random.Random(0)))
    [0, 1, 2, 3, 4]
    >>> sorted(shuffle_buffer(range(5), 3, random.Random(0)))
    [0, 1, 2, 3, 4]
    """
    if not isinstance(buffer_size, int) or buffer_size < 1:
        raise ValueError(f"buffer_size must be an int >= 1, got {buffer_size!r}")
    yield from shuffle_window(samples, buffer_size, rng, pool=buffer, meter=meter)


# --------------------------------------------------------------------------- pipes


@functional_datapipe("join_by_key")
class KeyJoinerIterDataPipe(IterDataPipe[dict]):
    """Add the fields of keyed tables to each sample (functional name: ``join_by_key``).

    Consumes sample dicts with ``key``; yields the same samples with the fields of the
    matching row of every table added (see :func:`join_by_key`). Use it to put transcripts
    next to features or audio: the tables are read when iteration starts, never in the
    constructor. Use torch's ``zip`` instead when the inputs are aligned by position.

    Args:
        source_datapipe: the stream of samples.
        *tables: pipes (or lists) of dicts with ``key``; each read fully per pass.
        on_missing: ``"raise"`` (default) or ``"skip"``, see :func:`join_by_key`; skipped
            keys are counted in ``self.diagnostics`` and warned about at the end of a pass.

    >>> from speechpipe import IterableWrapper
    >>> audio = IterableWrapper([{"key": "u1", "audio": [0.1]}, {"key": "u2", "audio": [0.2]}])
    >>> text = IterableWrapper([{"key": "u1", "text": "HELLO"}])
    >>> list(audio.join_by_key(text, on_missing="skip"))
    [{'key': 'u1', 'audio': [0.1], 'text': 'HELLO'}]
    """

    holds_nothing = True  # item by item: nothing kept between two yields

    def __init__(self, source_datapipe: IterDataPipe, *tables, on_missing: str = "raise"):
        if not tables:
            raise ValueError("join_by_key needs at least one table to join")
        self.source_datapipe = source_datapipe
        self.tables = tables
        self.on_missing = check_on_error(on_missing, "on_missing")
        self.diagnostics = Diagnostics("join_by_key")

    def __iter__(self) -> Iterator[dict]:
        self.diagnostics.reset()
        yield from join_by_key(
            self.source_datapipe,
            list(self.tables),
            on_missing=self.on_missing,
            diagnostics=self.diagnostics,
        )
        self.diagnostics.warn_if_skipped()

    def __len__(self) -> int:
        if self.on_missing != "raise":
            raise TypeError("join_by_key(on_missing='skip') has no length: skips are unknown")
        return len(self.source_datapipe)


KeyJoiner = KeyJoinerIterDataPipe
