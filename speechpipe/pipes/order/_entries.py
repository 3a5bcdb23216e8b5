"""Matching shard names to the index: a local path by its absolute path, a URL by the longest
tail of path components it shares with an entry."""

from __future__ import annotations

import os
import urllib.parse
from typing import Sequence

from ...errors import DataError
from ...index import ShardEntry, ShardIndex
from ..sources import is_url

__all__ = ["common_tail", "index_entries", "path_parts"]


def path_parts(name: str) -> list[str]:
    path = urllib.parse.urlsplit(name).path if is_url(name) else os.path.abspath(name)
    return [p for p in path.replace("\\", "/").split("/") if p]


def common_tail(a: list[str], b: list[str]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[-1 - n] == b[-1 - n]:
        n += 1
    return n


def index_entries(names: Sequence[str], index: ShardIndex) -> dict[str, ShardEntry]:
    """``{name: entry}`` for each distinct name. A local path matches the entry with the same
    absolute path; a URL matches the entry sharing the longest tail of path components (at
    least the file name), which must be unique."""
    by_path = index.by_path()
    by_base: dict[str, list[tuple[list[str], ShardEntry]]] = {}
    if any(is_url(name) and name not in by_path for name in names):  # matched by their tails
        for path, entry in by_path.items():
            parts = path_parts(path)
            by_base.setdefault(parts[-1] if parts else "", []).append((parts, entry))
    found: dict[str, ShardEntry] = {}
    for name in names:
        if name in found:
            continue
        if not is_url(name):
            entry = by_path.get(os.path.abspath(name))
        elif name in by_path:
            entry = by_path[name]
        else:
            parts = path_parts(name)
            scored = sorted(((common_tail(parts, p), e) for p, e in
                             by_base.get(parts[-1] if parts else "", [])),
                            key=lambda t: -t[0])
            entry = None
            if scored:
                if len(scored) > 1 and scored[0][0] == scored[1][0]:
                    raise DataError(
                        f"the index has {sum(1 for s, _ in scored if s == scored[0][0])} "
                        "shards this URL could be; index one folder per URL prefix",
                        source=name,
                    )
                entry = scored[0][1]
        if entry is None:
            raise DataError("shard is not in the index (re-run pack, or pass its index)",
                            source=name)
        found[name] = entry
    return found
