"""The settings of :func:`~speechpipe.pack.pack_data`: :class:`PackOptions`, checked when built."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, Sequence

from ..diagnostics import check_on_error
from ..index import COMPRESSIONS, shard_compression
from ..recipes import EMPTY_TEXT
from .inputs import KINDS
from .lengths import LENGTH_UNITS, LengthGroup, parse_length_groups
from .write import AUDIO_FORMATS

__all__ = ["COMPRESS", "ON_MISMATCH", "PackOptions", "UTTS_PER_SHARD"]

#: Utterances per shard unless told otherwise (CAT's ``UTTS_PER_FILE``).
UTTS_PER_SHARD = 2000
#: Values of ``on_mismatch=``: keys with data but no label, or a label but no data.
ON_MISMATCH = ("error", "skip")
#: Values of ``compress=``: gzip (``.tar.gz``) or zstd (``.tar.zst``) shards.
COMPRESS = ("gz", "zst")


@dataclass(frozen=True)
class PackOptions:
    """How :func:`~speechpipe.pack.pack_data` packs: every setting besides the files to read and
    the output folder, checked when built (with the errors ``pack_data`` raises for its keyword
    arguments). Each field is the keyword argument of the same name, described there;
    ``filter_group``, when a list, is kept as a tuple. With ``compress``, ``fmt`` gets the
    compressed suffix (``data-%05d.tar`` becomes ``data-%05d.tar.zst``); an ``fmt`` with one
    sets ``compress``.

    Pass one as ``pack_data(..., options=...)`` to reuse or vary a set of settings
    (:func:`dataclasses.replace`).

    >>> options = PackOptions(filter_group=["500:800", "10:500"], utts_per_shard=1000)
    >>> options.filter_group, [g.name for g in options.groups]
    (('500:800', '10:500'), ['10_500', '500_800'])
    >>> PackOptions(compress="zst").fmt
    'data-%05d.tar.zst'
    >>> PackOptions(utts_per_shard=0)
    Traceback (most recent call last):
    ...
    ValueError: utts_per_shard must be an int >= 1, got 0
    """

    fmt: str = "data-%05d.tar"
    filter_group: str | Sequence[str] | None = None
    utts_per_shard: int = UTTS_PER_SHARD
    kind: str = "auto"
    on_mismatch: str = "error"
    num_workers: int = 1
    progress: bool = True
    length_unit: str | None = None
    audio_format: str = "lossless"
    force: bool = False
    allow_commands: bool = False
    empty_text: str = "error"
    compress: str | None = None
    on_error: str = "raise"

    def __post_init__(self) -> None:
        _check_fmt(self.fmt)
        _check_compress(self)
        if self.filter_group is not None and not isinstance(self.filter_group, (str, tuple)):
            object.__setattr__(self, "filter_group", tuple(self.filter_group))
        parse_length_groups(self.filter_group)
        _check_positive_int(self.utts_per_shard, "utts_per_shard")
        _check_positive_int(self.num_workers, "num_workers")
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if self.on_mismatch not in ON_MISMATCH:
            raise ValueError(f"on_mismatch must be one of {ON_MISMATCH}, "
                             f"got {self.on_mismatch!r}")
        if self.audio_format not in AUDIO_FORMATS:
            raise ValueError(f"audio_format must be one of {AUDIO_FORMATS}, "
                             f"got {self.audio_format!r}")
        if self.length_unit is not None and self.length_unit not in LENGTH_UNITS:
            raise ValueError(f"length_unit must be one of {LENGTH_UNITS} or None, "
                             f"got {self.length_unit!r}")
        for name in ("progress", "force", "allow_commands"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if self.empty_text not in EMPTY_TEXT:
            raise ValueError(f"empty_text must be one of {EMPTY_TEXT}, got {self.empty_text!r}")
        check_on_error(self.on_error)

    @property
    def groups(self) -> list[LengthGroup]:
        """The length groups of ``filter_group``, sorted (:func:`parse_length_groups`)."""
        return parse_length_groups(self.filter_group)

    @property
    def shard_name_re(self) -> re.Pattern:
        """Matches the file names ``fmt`` gives shards (any number)."""
        return _check_fmt(self.fmt)


def _check_fmt(fmt: str) -> re.Pattern:
    """Check ``fmt`` (a shard file name with one number); return the pattern of its names."""
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


def _check_compress(options: PackOptions) -> None:
    """Make ``fmt`` and ``compress`` agree (see :class:`PackOptions`)."""
    if options.compress is not None and options.compress not in COMPRESS:
        raise ValueError(f"compress must be one of {COMPRESS} or None, "
                         f"got {options.compress!r}")
    named = shard_compression(options.fmt)
    if options.compress is None:
        object.__setattr__(options, "compress", named)
    elif named is None:
        if not options.fmt.endswith(".tar"):
            raise ValueError(f"compress={options.compress!r} needs an fmt ending in .tar, "
                             f"got {options.fmt!r}")
        suffix = next(s for s, kind in COMPRESSIONS.items()
                      if kind == options.compress and s.startswith(".tar"))
        object.__setattr__(options, "fmt", options.fmt[:-4] + suffix)
    elif named != options.compress:
        raise ValueError(f"fmt {options.fmt!r} names {named} shards but compress is "
                         f"{options.compress!r}")


def _check_positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return value
