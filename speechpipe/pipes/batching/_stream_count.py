"""How many virtual streams ``plan_batches`` and ``BatchView`` plan over when none is given.

Each virtual stream buckets, sorts and packs only its own share of the items, and ends with a
partial bucket of its own that pads more than a full one: a corpus of 3,000 utterances cut
into 8 streams (375 each, under a bucket buffer of 2,000) loses 1.5 to 9 points of padding
efficiency against one stream, and even 8 streams of 2,125 rows lose up to 1.7 (a partial
bucket of 125 rows in each). The loss shrinks as each stream holds more buffers, so the
default ``V`` (``streams="auto"``) is the most streams, up to :data:`DEFAULT_STREAMS`, that
each hold at least :data:`STREAM_BUCKETS` bucket buffers' worth of items (over shards also at
most one stream per shard): at the default buffer of 2,000, one stream below 80,000 items and
8 from 320,000. Measured on three corpora's duration distributions from 600 to 400,000
utterances with buffers of 2,000 and 500, the derived ``V`` pads at most 0.12 points below one
stream (benchmarks/README.md, "Virtual streams against the corpus size"). It is keyed on the
data and the batching settings only, never on the ranks or workers, so the plan stays the
same for any topology; a state records the ``V`` used.

A view's streams are each sorted whole (no bucket buffer), and any ``V`` > 1 pads a little
more than the view's one global sort; ``BatchView(streams="auto")`` gives each stream at least
:data:`VIEW_STREAM_ITEMS` keys (at most 0.17 points below one stream, measured the same way).
"""

from __future__ import annotations

from typing import Any

from ...errors import check_int

__all__ = ["AUTO", "DEFAULT_STREAMS", "STREAM_BUCKETS", "VIEW_STREAM_ITEMS", "check_streams",
           "derived_streams", "view_streams"]

#: The most streams the derived default gives.
DEFAULT_STREAMS = 8
#: Bucket buffers' worth of items each derived stream holds at least (16 left up to 0.22
#: points at a buffer of 500; 20 at most 0.12 at 500 and 2,000).
STREAM_BUCKETS = 20
#: A view's streams are sorted whole (no bucket buffer): the items each holds at least.
VIEW_STREAM_ITEMS = 40_000
#: ``streams=`` for the derived default.
AUTO = "auto"


def derived_streams(items: int, bucket_buffer: int, shards: int | None = None) -> int:
    """The default ``V`` for ``items`` items batched in buckets of ``bucket_buffer``:
    ``floor(items / (STREAM_BUCKETS * bucket_buffer))``, at least 1, at most
    :data:`DEFAULT_STREAMS` and, over shards, at most ``shards``.

    >>> derived_streams(3000, 2000), derived_streams(79_999, 2000), derived_streams(80_000, 2000)
    (1, 1, 2)
    >>> derived_streams(320_000, 2000), derived_streams(10**6, 2000, shards=5)
    (8, 5)
    """
    check_int("items", items, 0)
    check_int("bucket_buffer", bucket_buffer, 1)
    fit = int(items // (STREAM_BUCKETS * bucket_buffer))
    return max(1, min(DEFAULT_STREAMS, fit, DEFAULT_STREAMS if shards is None else shards))


def check_streams(streams: Any) -> int | str:
    """``streams=``: an int >= 1, or ``"auto"`` (``None`` says the same) for
    :func:`derived_streams`.

    >>> check_streams(None), check_streams("auto"), check_streams(3)
    ('auto', 'auto', 3)
    """
    if streams is None or streams == AUTO:
        return AUTO
    if isinstance(streams, str):
        raise ValueError(f"streams must be an int >= 1 or {AUTO!r}, got {streams!r}")
    return check_int("streams", streams, 1)


def view_streams(streams: Any, keys: int) -> int:
    """``BatchView(streams=)`` for a view of ``keys`` keys: an int >= 1 as given; ``"auto"``:
    ``floor(keys / VIEW_STREAM_ITEMS)``, at least 1, at most :data:`DEFAULT_STREAMS` (a view's
    stream is sorted whole: one bucket).

    >>> view_streams(3, 10), view_streams("auto", 600), view_streams("auto", 10**6)
    (3, 1, 8)
    """
    if isinstance(streams, str) and streams == AUTO:
        return max(1, min(DEFAULT_STREAMS, check_int("keys", keys, 0) // VIEW_STREAM_ITEMS))
    if isinstance(streams, str):
        raise ValueError(f"streams must be an int >= 1, {AUTO!r} or None, got {streams!r}")
    return check_int("streams", streams, 1)
