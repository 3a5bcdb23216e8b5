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
