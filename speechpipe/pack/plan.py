"""Planning a pack: which utterances go to which length group, folder and shard, and which
shards of an earlier run are kept."""

from __future__ import annotations

import os

from ..errors import DataError, MissingDataError
from ..index import INDEX_NAME, ShardEntry, ShardIndex

__all__: list[str] = []


def _old_index(folder: str, unit: str,
               audio_format: str | None) -> dict[str, ShardEntry] | None:
    """Entries of an existing index in ``folder`` (empty if absent or unreadable: it is then
    simply not used to recognise complete shards); ``None`` if it was written with another
    length unit or audio format (then no shard of the folder is kept)."""
    if not os.path.isfile(os.path.join(folder, INDEX_NAME)):
        return {}
    try:
        index = ShardIndex.read(folder)
    except (DataError, MissingDataError):
        return {}
    if index.length_unit != unit or index.audio_format != audio_format:
        return None
    return {entry.name: entry for entry in index.shards}
