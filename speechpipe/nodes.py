"""torchdata.nodes: a speechpipe pipeline as a ``BaseNode``, with its own state.

torch's DataPipes are no longer developed; ``torchdata.nodes`` is torchdata's successor API: an
iterator graph of ``BaseNode`` s whose state is explicit (``get_state()`` /
``reset(initial_state)``), driven by ``torchdata.nodes.Loader``. :class:`PipelineNode` puts a
speechpipe pipeline at the root (or the source) of such a graph. Its state is the pipeline's
own resumable state -- the epoch and each stage's position and held samples, as
:meth:`speechpipe.PipeDataset.state_dict` gives it -- so ``reset(state)`` restores the pipeline
where it stood (reading again only the samples its stages held), not by replaying the stream.

The node runs in the process that iterates it; parallel work goes to torchdata's own nodes
above it (``ParallelMapper`` with threads or processes, ``Prefetcher``), whose states include
the node's.
"""

from __future__ import annotations

from typing import Any

from torchdata.nodes import BaseNode

from .loader import PipeDataset
from .pipes._core import unresumable_reason

__all__ = ["PipelineNode"]


class PipelineNode(BaseNode):
    """A speechpipe pipeline as a ``torchdata.nodes`` node with native, exact state.

    Each ``reset()`` starts a pass of the pipeline: the first one at ``epoch``, each later one
    (the ``Loader`` resets at every new epoch) at the next epoch; ``reset(state)`` resumes the
    pass a state was taken from (a state taken at the end of a pass starts the next epoch).
    ``get_state()`` is the pipeline's state (epoch, each resumable stage's position and the
    identities of the samples it holds): small, JSON-friendly, and exact -- the batches after a
    restore are those of the uninterrupted run.

    Args:
        pipe: a resumable speechpipe pipeline (e.g. :func:`speechpipe.train_pipeline`); a
            pipeline that cannot be resumed exactly is refused with the reason.
        seed: base seed of torch ``shuffle`` stages in the pipeline (speechpipe's own stages
            have their own).
        epoch: the epoch of the first pass.

    >>> import speechpipe as sp
    >>> from torchdata.nodes import Loader
    >>> rows = [{"key": f"u{i}", "num_frames": 100} for i in range(6)]
    >>> pipe = sp.IterableWrapper(rows).shuffle_samples(seed=0).block_batch(
    ...     budget=sp.SampleCount(2))
    >>> loader = Loader(PipelineNode(pipe))
    >>> it = iter(loader); first = next(it); state = loader.state_dict()
    >>> rest = [[s["key"] for s in b] for b in it]
    >>> again = Loader(PipelineNode(pipe)); again.load_state_dict(state)
    >>> [[s["key"] for s in b] for b in again] == rest
    True
    """

    def __init__(self, pipe: Any, *, seed: int = 0, epoch: int = 0) -> None:
        super().__init__()
        self.dataset = PipeDataset(pipe, seed=seed, epoch=epoch)
        reason = unresumable_reason(pipe)
        if reason is not None:
            raise TypeError(f"PipelineNode needs a resumable pipeline: {reason}")
        self._it: Any = None
        self._passes = 0

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        self._close()
        if initial_state is not None:
            self.dataset.load_state_dict(initial_state)
        elif self._passes:
            self.dataset.set_epoch(self.dataset.epoch + 1)
        self._passes += 1
        self._it = iter(self.dataset)

    def next(self) -> Any:
        return next(self._it)

    def get_state(self) -> dict[str, Any]:
        return self.dataset.state_dict()

    def _close(self) -> None:
        if self._it is not None:
            self._it.close()  # its pass ends: the stages drop what a restore loaded
            self._it = None
