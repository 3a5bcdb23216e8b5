"""The one walk over a pipeline's graph, and the epoch it carries down.

A pipeline is a graph of pipes linked through their attributes. :func:`graph_nodes` lists it
(the loader's state, skip counts and thread stages use it); :func:`propagate_epoch` sets an
epoch on every pipe that takes one, stopping below the pipes that give their sources epochs of
their own (``zip_by_name``, ``mix_by_weight``). torch's ``traverse_dps`` finds a graph by
pickling every pipe, which copies the data a pipe holds and cannot stop at a node; this walk
reads attributes and is the same in every process that built the same pipeline.
"""

from __future__ import annotations

from typing import Any, Callable

from ._base import IterDataPipe, MapDataPipe

__all__ = ["GRAPH_CONTAINER_MAX", "graph_nodes", "propagate_epoch"]

#: Containers longer than this are data, not a pipe graph: the walk does not scan them.
GRAPH_CONTAINER_MAX = 64


def _children(node: Any) -> list:
    """The pipes ``node`` holds: directly, or in a list, tuple or dict of at most
    :data:`GRAPH_CONTAINER_MAX` items, in attribute order (through the probes that
    :mod:`speechpipe.telemetry` puts in front of a pipe for a pass)."""
    children: list = []
    for value in getattr(node, "__dict__", {}).values():
        if isinstance(value, (IterDataPipe, MapDataPipe)):
            while getattr(type(value), "graph_transparent", False):  # a telemetry probe
                value = value.__dict__["source"]
            children.append(value)
        elif isinstance(value, (list, tuple)) and len(value) <= GRAPH_CONTAINER_MAX:
            children.extend(v for v in value if isinstance(v, (IterDataPipe, MapDataPipe)))
        elif isinstance(value, dict) and len(value) <= GRAPH_CONTAINER_MAX:
            children.extend(v for v in value.values()
                            if isinstance(v, (IterDataPipe, MapDataPipe)))
    return children


def graph_nodes(pipe: Any, stop: Callable[[Any], bool] | None = None) -> list:
    """``pipe`` and every pipe below it, depth first, each once, in a deterministic order.

    The graph is followed through the pipes' attributes (see :func:`_children`). The order
    depends only on how the pipeline was built, so it is the same in every process. Below a
    node for which ``stop(node)`` is true the walk does not continue (the node itself is
    listed).

    >>> from speechpipe import IterableWrapper
    >>> [type(p).__name__ for p in graph_nodes(IterableWrapper([1]).map(str))]
    ['MapperIterDataPipe', 'IterableWrapperIterDataPipe']
    """
    out: list = []
    seen: set[int] = set()
    stack = [pipe]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        out.append(node)
        if stop is None or not stop(node):
            stack.extend(reversed(_children(node)))
    return out


def _owns_source_epochs(node: Any) -> bool:
    return bool(getattr(node, "owns_source_epochs", False))


def propagate_epoch(pipe: Any, epoch: int) -> int:
    """Call ``set_epoch(epoch)`` on ``pipe`` and every pipe below it that has one.

    Below a pipe whose ``owns_source_epochs`` is true (a zipper or mixer) the walk stops: it
    passes its epoch on itself when it starts a pass. Returns how many pipes were set.

    >>> import speechpipe
    >>> from speechpipe import IterableWrapper
    >>> batches = IterableWrapper([3, 1, 2]).block_batch(4).map(len)
    >>> propagate_epoch(batches, 7), batches.datapipe.epoch
    (1, 7)
    """
    count = 0
    for node in graph_nodes(pipe, stop=_owns_source_epochs):
        setter = getattr(type(node), "set_epoch", None)
        if callable(setter):
            setter(node, epoch)
            count += 1
    return count
