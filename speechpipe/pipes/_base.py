"""The one place where speechpipe imports torch's DataPipe machinery.

torch core still ships DataPipes, torchdata removed its own after 0.9 and a deprecation
has been proposed upstream. Every other module imports these names from here, so a change
upstream touches this file only.
"""

from __future__ import annotations

from torch.utils.data.datapipes._decorator import functional_datapipe
from torch.utils.data.graph_settings import apply_random_seed
from torch.utils.data.datapipes.datapipe import IterDataPipe, MapDataPipe
from torch.utils.data.datapipes.iter import IterableWrapper
from torch.utils.data.datapipes.map import SequenceWrapper

# torch's iterator hook asks ``hasattr(datapipe, "_is_child_datapipe")`` on every item; on
# a pipe without the attribute that goes through ``IterDataPipe.__getattr__``, which raises
# and catches an AttributeError: about 1 us per item per stage, most of a stage's cost. The
# hook only acts when the value is True (``fork``/``demux`` children set it so on their own
# class), so False on the base class changes nothing but the cost (1.2 -> 0.24 us per item
# per stage here).
IterDataPipe._is_child_datapipe = False

__all__ = [
    "IterDataPipe",
    "IterableWrapper",
    "MapDataPipe",
    "SequenceWrapper",
    "apply_random_seed",
    "functional_datapipe",
    "registered_iter_names",
    "registered_map_names",
]


def registered_iter_names() -> set[str]:
    """Functional names currently registered on ``IterDataPipe`` (torch's and ours)."""
    return set(IterDataPipe.functions)


def registered_map_names() -> set[str]:
    """Functional names currently registered on ``MapDataPipe``."""
    return set(MapDataPipe.functions)
