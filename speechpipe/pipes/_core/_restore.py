"""The restore driver: which stages of a pipeline hold state, and how a pass resumes exactly.

It speaks only the protocol of :mod:`speechpipe.pipes._core._state`. A pipeline resumes exactly when
its samples come from a :class:`~speechpipe.pipes._core._state.SampleSource` and every stage above
that holds items between two of its yields is :class:`~speechpipe.pipes._core._state.Resumable`;
:func:`unresumable_reason` names the first stage that breaks this (the loader refuses such a
pipeline when it is built). On restore (:func:`restore`):

1. every resumable stage loads its state;
2. the source positions its reader where its state stood and reads, once, the samples the
   stages above held (by identity);
3. for every stage that held samples, those samples pass again through the stages between the
   source and it (``decode`` ...), with the resumable stages between passing them through, and
   are handed back to it (``restore_held``).
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, Mapping

from ...errors import ResumeError
from ._graph import graph_nodes
from ._state import Identity, identity, Resumable, SampleSource, Seeded

__all__ = ["HOLDING_NOTHING", "ResumeWarning", "UNRESUMABLE", "end_pass", "holds_nothing", "restore",
           "resumable_stages", "take_states", "unresumable_reason"]

#: torch stages that hold items in their generator's locals (a state cannot include them):
#: class name -> what it holds and what to use instead.
UNRESUMABLE = {
    "ShufflerIterDataPipe": "shuffle keeps its buffer in its generator; use shuffle_samples "
                            "(a list of samples, e.g. manifest rows) or sharded_shuffle (shards)",
    "BatcherIterDataPipe": "batch keeps its open batch in its generator; use block_batch",
    "BucketBatcherIterDataPipe": "bucketbatch keeps its buffer; use bucket_by_length",
    "GrouperIterDataPipe": "groupby keeps its buffer in its generator",
    "ForkerIterDataPipe": "fork keeps a buffer shared by its children",
    "DemultiplexerIterDataPipe": "demux keeps a buffer shared by its children",
    "MultiplexerIterDataPipe": "mux keeps its position in its generator",
    "ConcaterIterDataPipe": "concat keeps its position in its generator",
    "ZipperIterDataPipe": "zip keeps its position in its generator",
}


class ResumeWarning(UserWarning):
    """A resumed pipeline will not repeat the uninterrupted run exactly (the message says why)."""


def _is_source(node: Any) -> bool:
    return isinstance(node, SampleSource)


def _walk(pipe: Any) -> list:
    """The pipes of one resumable pass: down to (and including) its sources."""
    return graph_nodes(pipe, stop=_is_source)


def resumable_stages(pipe: Any) -> list[tuple[str, Resumable]]:
    """``(path, stage)`` of every resumable stage, in graph order; the path (position in the
    walk and class) is the same in every process that builds the same pipeline."""
    return [(f"{i}:{type(n).__name__}", n) for i, n in enumerate(_walk(pipe))
            if isinstance(n, Resumable)]


#: torch stages that hold nothing between two of their yields (a plain map, filter, collate).
HOLDING_NOTHING = {"MapperIterDataPipe", "FilterIterDataPipe", "CollatorIterDataPipe"}


def holds_nothing(node: Any) -> bool:
    """Whether ``node`` declares that it holds nothing between two of its yields."""
    cls = type(node)
    if cls.__name__ in HOLDING_NOTHING and cls.__module__.startswith("torch."):
        return True
    return bool(getattr(cls, "holds_nothing", False))


def unresumable_reason(pipe: Any) -> str | None:
    """Why a state of ``pipe`` could not resume it exactly (naming the stage), or None.

    An allow-list: every stage above the source is resumable (it keeps a state:
    :class:`~speechpipe.pipes._core._buffering.Buffering`) or declares that it holds nothing
    (``holds_nothing = True``); anything else is named."""
    nodes = _walk(pipe)
    for node in nodes:
        cls = type(node)
        reason = UNRESUMABLE.get(cls.__name__)
        if reason is not None and cls.__module__.startswith("torch."):
            return f"this pipeline cannot be resumed exactly: torch's {reason}"
    sourced = any(_is_source(n) for n in nodes)
    for node in nodes if sourced else ():
        cls = type(node)
        if not isinstance(node, Resumable) and not holds_nothing(node):
            return (f"this pipeline cannot be resumed exactly: {cls.__name__} "
                    f"({cls.__module__}) neither keeps a resumable state (subclass "
                    "speechpipe.Buffering) nor declares that it holds nothing between two of "
                    "its yields (class attribute holds_nothing = True)")
    if not any(_is_source(n) for n in nodes):
        return ("this pipeline cannot be resumed exactly: its samples do not come from a source "
                "that knows its position; start it with shuffle_samples or split_samples (a "
                "list of samples), sharded_shuffle (shards) or batch_by_view (a BatchView)")
    return None


def take_states(stages: list[tuple[str, Resumable]]) -> dict[str, dict]:
    """Each stage's state at one consistent moment (thread stages hold their readers)."""
    with contextlib.ExitStack() as paused:
        for _, stage in stages:  # top first: a thread stage stops reading from the ones below
            paused.enter_context(stage.paused())
        return {path: stage.state_dict() for path, stage in stages}


def restore(stages: list[tuple[str, Resumable]], states: Mapping[str, Any], pipe: Any) -> None:
    """Load ``states`` into ``stages`` of ``pipe`` and re-read what they held (module doc)."""
    paths = {path for path, _ in stages}
    unknown = sorted(set(states) - paths)
    if unknown:
        raise ResumeError(
            f"the state was saved from another pipeline: it has {unknown[:3]} but this one's "
            f"resumable pipes are {sorted(paths)}",
            [("pipeline", "stages", sorted(states), sorted(paths))])
    drawing = [type(n).__name__ for n in _walk(pipe)
               if isinstance(n, Seeded) and not isinstance(n, Resumable) and n.draws_in_sequence]
    if drawing:
        warnings.warn(
            f"resuming a pipeline with random stages that draw in sequence ({', '.join(drawing)})"
            ": their draws restart, so batches after the resume differ from an uninterrupted "
            "run where those draws matter", ResumeWarning, stacklevel=3)
    for path, stage in stages:
        if path in states:
            stage.load_state_dict(states[path])
    needs = {path: stage.held_identities() for path, stage in stages}
    sources = [stage for _, stage in stages if isinstance(stage, SampleSource)]
    for source in sources:  # position the reader; read every held sample once
        source.prepare_resume([i for n in needs.values() for i in n] if len(sources) == 1
                              else [])
    for path, stage in stages:
        if needs[path]:
            stage.restore_held(_replay(stage, needs[path]))


def _replay(stage: Any, needs: list[Identity]) -> dict:
    """Re-read ``needs`` through the pipes between the source and ``stage``: the source is
    asked for exactly those samples and the resumable pipes between pass them through (their
    own states stay pending for the real pass)."""
    below = _walk(stage.source_datapipe)
    sources = [n for n in below if isinstance(n, SampleSource) and n.rereads_held]
    if len(sources) != 1:
        raise TypeError(
            f"{type(stage).__name__} holds samples that must be re-read on resume, but "
            f"{'no' if not sources else len(sources)} sharded_shuffle is below it (exactly one "
            "is needed)"
        )
    source = sources[0]
    between = [n for n in below if isinstance(n, Resumable) and n is not source]
    for node in between:
        node.passthrough = True
    source.request_replay(needs)
    try:
        return {identity(item): item for item in stage.source_datapipe}
    finally:
        source.request_replay(None)
        for node in between:
            node.passthrough = False


def end_pass(stages: list[tuple[str, Resumable]]) -> None:
    """After a pass (ended, broken or failed): drop what a restore loaded and it did not use."""
    for _, stage in stages:
        stage.end_pass()
