"""The one place where speechpipe imports torch's DataPipe machinery.

torch core still ships DataPipes, torchdata removed its own after 0.9 and a deprecation
has been proposed upstream. Every other module imports these names from here, so a change
upstream touches this file only.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, TypeVar

import torch
from torch.utils.data.datapipes._decorator import functional_datapipe as _torch_functional_datapipe
from torch.utils.data.graph_settings import apply_random_seed
from torch.utils.data.datapipes.datapipe import IterDataPipe, MapDataPipe
from torch.utils.data.datapipes.iter import IterableWrapper
from torch.utils.data.datapipes.map import SequenceWrapper

_Pipe = TypeVar("_Pipe", bound=type)


def plain_iterator(cls: _Pipe) -> _Pipe:
    """Class decorator: ``cls.__iter__`` runs as written, outside torch's per-item hook.

    torch's DataPipe metaclass wraps every ``__iter__`` generator in a second generator that,
    for each item, counts it, checks that the iterator is still the pipe's newest one and
    resends it (a cost per item per stage; measurements: benchmarks/README.md, "Per-item cost
    of torch's iterator hook"). For speechpipe's own stages that bookkeeping serves nothing:
    their resume is their own ``state_dict`` (torch's sample counts feed a fast-forward
    speechpipe never uses) and errors already name the file and key. What the hook gave and
    the plain generator does not: an old iterator of the *same* stage is not invalidated when
    a new one is made (torch's own pipes in the chain, sources included, still enforce it);
    torch's exception suffix "This exception is thrown by __iter__ of ..." is not added. When
    torch's profiler is on, a pass runs through the hook as before, so that each stage keeps
    its ``record_function`` entry in profiles.

    ``cls`` also gets ``_is_child_datapipe = False`` unless it has the attribute already:
    torch's hook (which still runs under the profiler, and for a stage whose ``__iter__`` is
    not a generator) asks ``hasattr(datapipe, "_is_child_datapipe")`` on every item, and on
    a pipe without it that goes through ``IterDataPipe.__getattr__``, which raises and catches
    an ``AttributeError``. The hook acts only when the value is True (``fork``/``demux``
    children), so False changes nothing but the cost. Only speechpipe's classes get it:
    torch's ``IterDataPipe`` and other libraries' pipes are left as they are.
    """
    if not hasattr(cls, "_is_child_datapipe"):
        type.__setattr__(cls, "_is_child_datapipe", False)
    hooked = cls.__dict__.get("__iter__")
    if hooked is None:
        return cls
    original = inspect.unwrap(hooked)
    if original is hooked or not inspect.isgeneratorfunction(original):
        return cls

    def __iter__(self):  # noqa: N807
        if torch.autograd._profiler_enabled():
            return hooked(self)
        return original(self)

    __iter__.__doc__ = original.__doc__
    __iter__.__wrapped__ = original  # type: ignore[attr-defined]
    __iter__.__qualname__ = original.__qualname__
    type.__setattr__(cls, "__iter__", __iter__)
    return cls


def functional_datapipe(name: str, **kwargs: Any) -> Callable[[_Pipe], _Pipe]:
    """torch's ``functional_datapipe`` (register ``cls`` under ``name``), applied to a class
    made :func:`plain_iterator` first."""
    register = _torch_functional_datapipe(name, **kwargs)

    def decorate(cls: _Pipe) -> _Pipe:
        return register(plain_iterator(cls) if issubclass(cls, IterDataPipe) else cls)

    return decorate

__all__ = [
    "IterDataPipe",
    "IterableWrapper",
    "MapDataPipe",
    "SequenceWrapper",
    "apply_random_seed",
    "functional_datapipe",
    "plain_iterator",
    "registered_iter_names",
    "registered_map_names",
]


def registered_iter_names() -> set[str]:
    """Functional names currently registered on ``IterDataPipe`` (torch's and ours)."""
    return set(IterDataPipe.functions)


def registered_map_names() -> set[str]:
    """Functional names currently registered on ``MapDataPipe``."""
    return set(MapDataPipe.functions)
