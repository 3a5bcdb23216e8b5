"""What a loader state says about the topology it was saved on, and positions free of it.

A ``StatefulDataLoader`` state is shaped by its number of workers (:func:`saved_workers` reads
it back) and each worker's part holds that worker's position: it resumes on the same topology
only. A pipeline that starts from ``plan_batches`` (a stage that says ``topology_free = True``:
:mod:`speechpipe.pipes.batching._streams`; ``batch_by_view`` over a view with streams) has one
position for every
rank and worker instead -- the global batches consumed in the epoch -- kept by
:class:`GlobalPosition`: rank ``r`` of ``W`` has consumed ``start + steps * W`` of them after
``steps`` batches of a pass that started at ``start``, the same number on every rank (every
rank takes the same steps), so the state rank 0 saves resumes any world size and number of
workers. The loader hands the position to the pipeline's copies through shared memory, as it
hands them the epoch (:class:`speechpipe.loader.SharedEpoch`), and plans each epoch in the main
process before the workers start, so that workers started by ``fork`` inherit the plan instead
of each computing it again (``spawn`` ones plan it themselves).
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

from .errors import DataError, ResumeError
from .pipes._core import graph_nodes
from .seeding import process_position

__all__ = ["GlobalPosition", "check_position", "planned_stages", "saved_workers", "set_start"]


def planned_stages(pipe: Any) -> list:
    """The stages of ``pipe`` whose position does not depend on the topology."""
    return [n for n in graph_nodes(pipe) if getattr(n, "topology_free", False) is True]


def set_start(nodes: list, epoch: int, start: int) -> None:
    """Start the pass of each topology-free stage among ``nodes`` at global batch ``start``."""
    for node in nodes:
        if getattr(node, "topology_free", False) is True:
            node.set_epoch(epoch, start=start)


class GlobalPosition:
    """The global batch position of a loader over a ``plan_batches`` pipeline.

    Args:
        shared: where the workers read the start of the next pass (``get``/``set``: a
            :class:`~speechpipe.loader.SharedEpoch`).
        pipe: the pipeline in this process, whose ``len()`` counts from the start too.
    """

    def __init__(self, shared: Any, pipe: Any) -> None:
        self.shared = shared
        self.stages = planned_stages(pipe)
        self.start = 0  # global batches consumed before the running pass started
        self.steps = 0  # batches the running pass has yielded to this rank's loop
        self.loaded: int | None = None  # a start loaded for the next pass, of epoch loaded_epoch
        self.loaded_epoch = 0

    def begin_pass(self, epoch: int) -> None:
        """A pass of ``epoch`` starts: at the loaded position (if it is that epoch's), else at
        the epoch's start."""
        start = self.loaded if self.loaded is not None and self.loaded_epoch == epoch else 0
        self.start, self.loaded, self.steps = start, None, 0
        self.shared.set(self.start)
        set_start(self.stages, epoch, self.start)
        for stage in self.stages:  # planned once here: forked workers inherit the plan
            stage.plan(epoch)

    def set_epoch(self, epoch: int) -> None:
        """The next pass is of ``epoch``: ``len()`` counts its steps (from the loaded
        position, if it is that epoch's) before the pass begins."""
        start = self.loaded if self.loaded is not None and self.loaded_epoch == epoch else 0
        set_start(self.stages, epoch, start)

    def counted(self, batches: Iterator[Any]) -> Iterator[Any]:
        for batch in batches:
            self.steps += 1
            yield batch

    def consumed(self, between_epochs: bool, epoch: int) -> int:
        """Global batches consumed in ``epoch``, the epoch of the next batch."""
        if between_epochs:
            return 0
        if self.loaded is not None:  # loaded, no pass since
            return self.loaded if self.loaded_epoch == epoch else 0
        consumed = self.start + self.steps * process_position().world_size
        # the last step of a padded epoch repeats its first batches: the epoch is consumed
        return min([consumed] + [len(stage.plan(epoch)) for stage in self.stages])

    def load(self, state: Mapping, epoch: int) -> None:
        """Start the next pass (of ``epoch``) where ``state`` stood."""
        batches = state.get("batches")
        if not isinstance(batches, int) or isinstance(batches, bool) or batches < 0:
            raise ResumeError(f"the state's global batch position must be an int >= 0, got "
                              f"{batches!r}")
        check_position(self.stages, epoch, batches)
        self.loaded, self.loaded_epoch = batches, epoch
        set_start(self.stages, epoch, batches)  # len() counts the steps left


def check_position(stages: list, epoch: int, batches: int) -> None:
    """Refuse a global position past the end of ``epoch`` (plans it): an edited state, or
    one of another corpus that the fingerprint did not tell apart, would otherwise resume on
    an empty rest of the epoch without a word."""
    for stage in stages:
        total = len(stage.plan(epoch))
        if batches > total:
            raise DataError(
                f"the state's global batch position {batches} is past the end of epoch "
                f"{epoch}, which has {total} global batches: the state does not belong to this "
                "data (or was edited)", source=type(stage).__name__)


def saved_workers(state: Any) -> int | None:
    """The number of workers a ``StatefulDataLoader`` state was saved with (its shape says:
    0 has ``_num_yielded`` at the top, more have ``_snapshot``), or None (at an epoch's start,
    or a shape this speechpipe does not know)."""
    if not isinstance(state, Mapping):
        return None
    if "_snapshot" in state:
        main = state["_snapshot"].get("_main_snapshot") if isinstance(
            state["_snapshot"], Mapping) else None
        workers = main.get("_num_workers") if isinstance(main, Mapping) else None
        return workers if isinstance(workers, int) else None
    return 0 if "_num_yielded" in state else None
