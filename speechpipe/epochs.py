"""One call to prepare a whole pipeline for an epoch.

Random speechpipe pipes (``bucket_by_length``, ``block_batch``, ``mix_by_weight``...) draw
their order from ``(seed, epoch, rank, worker)`` and expose ``set_epoch``; torch's own
``shuffle`` stage takes a seed per pass instead. :func:`set_epoch` walks the pipeline and does
both, so that a training loop needs one line per epoch.
"""

from __future__ import annotations

import torch

from .pipes._core import apply_random_seed
from .pipes._core import propagate_epoch
from .seeding import derive_seed

__all__ = ["set_epoch"]


def set_epoch(pipe, epoch: int, *, seed: int | None = None):
    """Set ``epoch`` on every speechpipe pipe in ``pipe``'s graph; with ``seed``, also reseed
    torch's ``shuffle`` stages from ``(seed, epoch)``. Returns ``pipe``.

    Without ``seed``, torch's shuffle stages draw a fresh random seed each pass (or the one
    a DataLoader shares with its workers), so only speechpipe's own order is reproducible.

    >>> import speechpipe
    >>> from speechpipe import IterableWrapper
    >>> pipe = IterableWrapper(range(8)).shuffle().block_batch(100, max_samples=4)
    >>> runs = [list(set_epoch(pipe, e, seed=1)) for e in (0, 0, 1)]
    >>> runs[0] == runs[1], runs[0] != runs[2]
    (True, True)
    """
    if not isinstance(epoch, int) or epoch < 0:
        raise ValueError(f"epoch must be an int >= 0, got {epoch!r}")
    propagate_epoch(pipe, epoch)
    if seed is not None:
        rng = torch.Generator()
        rng.manual_seed(derive_seed(seed, epoch, 0, 0, "torch-shuffle") % 2**63)
        apply_random_seed(pipe, rng)
    return pipe
