"""The settings of :func:`~speechpipe.pack.pack_data` and their checks."""

from __future__ import annotations

import os
import re
from typing import Any

__all__ = ["ON_MISMATCH", "UTTS_PER_SHARD"]

#: Utterances per shard unless told otherwise (CAT's ``UTTS_PER_FILE``).
UTTS_PER_SHARD = 2000
#: Values of ``on_mismatch=``: keys with data but no label, or a label but no data.
ON_MISMATCH = ("error", "skip")


def _check_fmt(fmt: str) -> re.Pattern:
    if not isinstance(fmt, str) or not fmt:
        raise TypeError(f"fmt must be a %-pattern string such as 'data-%05d.tar', got {fmt!r}")
    try:
        numbered = fmt % 0 != fmt % 1
    except (TypeError, ValueError):
        numbered = False
    if not numbered or "/" in fmt or os.sep in fmt:
        raise ValueError(f"fmt must be a file name with one shard number such as "
                         f"'data-%05d.tar', got {fmt!r}")
    parts = re.split(r"%[-#0 +]*\d*[diu]", fmt.replace("%%", "\0"))
    return re.compile(r"\d+".join(re.escape(p.replace("\0", "%")) for p in parts))


def _check_positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return value
