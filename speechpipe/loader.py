"""The loader a training script needs, in one call; epochs that reach the workers; exact resume.

:func:`build_loader` wraps a pipeline (``sharded_shuffle -> decode -> bucket_by_length ->
block_batch -> collate``, or ``batch_by_view -> collate``) in what a training loop uses::

    loader = build_loader(pipe, num_workers=4, prefetch_factor=2, pin_memory=True,
                          persistent_workers=True, device="cuda", seed=0)
    for epoch in range(start_epoch, epochs):
        loader.set_epoch(epoch)
        for batch in loader:              # padded tensors, on the device
            ...
            if step % 1000 == 0:
                torch.save({"loader": loader.state_dict(), ...}, "ckpt.pt")

and after a preemption, in a new process, ``loader.load_state_dict(ckpt["loader"])`` makes the
next batches exactly those the uninterrupted run would have seen (``loader.epoch`` says which
epoch to continue).

**What runs where.** The pipeline runs in each DataLoader worker (:class:`PipeDataset`, an
``IterableDataset``); batching and collation happen there too, so that one transfer between
processes carries a whole padded batch (``benchmarks/bench_e2e.py`` measures the difference
with per-utterance transfers). Pinning happens in the DataLoader's pin thread, the move to
``device`` (``non_blocking`` when pinned) and the uneven-input stage
(:class:`~speechpipe.pipes.distributed._equal.EqualSteps`) in the main process.

**Workers, sharding, seeds.** In worker ``w`` of ``n`` (rank ``r`` of ``W``), speechpipe's
pipes find their position themselves (``sharded_shuffle`` splits shards, ``batch_by_view``
takes every ``n``-th batch), and pipes with ``apply_sharding`` (torch's ``sharding_filter``)
are told ``(W * n, w * W + r)`` as torch's DataLoader does. Random pipes derive their seeds
from ``(seed, epoch, rank, worker)``; torch's ``shuffle`` stages get a seed from ``(seed,
epoch)``, the same in every worker (so that a ``sharding_filter`` after one splits one order).
The workers' global ``random``/``numpy``/``torch`` seeds come from a generator seeded with
``seed``. So every sample comes out once per epoch, whatever the number of workers.

**Epochs reach persistent workers.** With ``persistent_workers=True`` each worker keeps its
own copy of the pipeline across epochs, so ``set_epoch`` on the main process's pipeline would
not reach it. The epoch therefore lives in shared memory (:class:`SharedEpoch`, a
``multiprocessing`` value created with the dataset and inherited by the workers):
``loader.set_epoch(e)`` writes it, and every worker reads it when its next pass starts and
sets it on its copy (``speechpipe.set_epoch``). Call ``set_epoch`` before iterating.

**Skip counts come back from the workers.** Each worker runs its own copy of the pipeline,
so what its pipes count -- ``diagnostics`` (samples skipped under ``on_error="skip"``, filtered
by ``filter_by_duration``, ...), ``block_batch``'s ``stats`` (batches, padding, oversize
samples emitted or dropped), ``tokenize``'s (tokens, ``<unk>`` tokens) and the buffering
stages' ``buffers`` (samples and array bytes held at peak, kept per worker) -- would stay in the
worker. At the end of its pass each worker
writes its counts to a private folder of the loader, and when a pass over the loader has run to
its end, the main process's pipes hold the sum over the workers: ``pipe.diagnostics`` and
``pipe.stats`` read after the epoch describe the whole epoch, as they do without workers. A
pass left early (a ``break``, or the uneven-input stage stopping it) is not added up; a pass
resumed from a state counts from the resume on. Workers still warn
(:class:`~speechpipe.diagnostics.SkippedInputWarning`) at the end of a pass that skipped.

**Exact resume** (torchdata's ``StatefulDataLoader``). The DataLoader asks the dataset for
``state_dict()`` in each worker (around every ``snapshot_every``-th batch) and gives it
back with ``load_state_dict()`` in the new process. :class:`PipeDataset`'s state is the epoch
and, for each resumable pipe of the graph (``sharded_shuffle``, ``bucket_by_length``,
``block_batch``, ``batch_by_view``, ``prefetch_in_thread``, ``map_in_threads``), a small dict:
positions, random generator states, and the samples each holds **by identity**
``(shard, key)``, never their data. On restore:

1. ``sharded_shuffle`` recomputes this worker's plan (the same epoch, seed and shard list) and
   starts at the shard it was reading: earlier shards are not opened, the current one's first
   ``offset`` samples are read (raw bytes, not decoded) and dropped -- with an index, a shard
   that was finished is not opened at all;
2. the samples that were in its shuffle buffer are re-read from their shards (each such shard
   from its start up to its last held sample);
3. for every pipe below that held samples (bucket buffers, packed batches waiting in the
   shuffle window, items in flight in a thread stage), those samples are re-read the same way
   and passed again through the stages between (``decode`` ...), once, then put back where
   they were; random generators continue from their saved states.

So what is read again is at most the buffers' contents plus the current shard's prefix --
never the epoch so far. ``batch_by_view`` holds nothing: it restarts at its next step and
loads nothing it skips (under the loader, its position comes from the state: the
``start_step`` of its constructor is reset by each pass's ``set_epoch``).

A state is small (positions, generator states and identities: tens of kB for buffers of a few
thousand samples) but not free, and the DataLoader takes one on every step that may end near a
snapshot boundary -- ``workers × (prefetch_factor + 1)`` steps out of each ``snapshot_every``
-- so with ``snapshot_every=1`` (or any value below that window) it is taken after every batch,
at a cost in throughput (measurements: ``benchmarks/README.md``, "Loader state snapshots"). A
state asked for between two snapshots (``loader.state_dict()`` at any step) is restored by
fetching again the (at most ``snapshot_every - 1``) batches since the last snapshot -- still
exact, at the cost of re-reading those batches once, in the new process. Set it to your
checkpoint interval to make that zero. Stages between resumable ones must map one sample to one
sample deterministically (decode, feature extraction without dither, tokenization); random stages
that draw in sequence (``perturb_speed``, ``spec_augment``) resume with a fresh draw sequence
(a warning says so); torch's ``shuffle``, ``batch`` and other buffering stages cannot be saved:
:func:`build_loader` refuses them when it is built, naming them (``resumable=False`` builds a
loader without a position to save).

**A state knows what it belongs to.** ``loader.state_dict()`` carries a fingerprint of what
decides the batches (:meth:`Loader.fingerprint`): the pipeline's stages in graph order with
their deciding settings (seeds, budgets, buffer sizes, boundaries, a digest of the shard list
or manifest: :mod:`speechpipe.pipes._core._fingerprint`) and the loader's ``seed``, world size and
``num_workers``. :meth:`Loader.load_state_dict` compares it with its own before anything is
restored or fetched again (whatever ``snapshot_every``), and raises
:class:`~speechpipe.errors.ResumeError` listing each difference, saved -> current; a change
made on purpose is accepted with ``allow_changes=(...)`` and takes effect from the next epoch.
A position that cannot have been saved (an offset past its shard's count) is refused too,
naming the shard, when the workers restore it.
"""

from __future__ import annotations

import gc
import multiprocessing
import shutil
import tempfile
import time
import warnings
import weakref
from typing import Any, Callable, Iterable, Iterator, Mapping

import torch
import torch.utils.data

from .memory import (
    forget_segments, install, keep_table_while, new_table, release_now,
)
from .diagnostics import report_to_main_process
from .errors import ResumeError, SpeechpipeError, mark_location
from .pipes._core import IterDataPipe, MapDataPipe
from .pipes._core import graph_nodes, propagate_epoch
from .pipes._core import (
    ResumeWarning, end_pass, restore, resumable_stages, take_states, unresumable_reason,
)
from .pipes._core import (
    FINGERPRINT_VERSION, allows_change, check_allow_changes, describe_differences, differences,
    fingerprint, refusal,
)
from .pipes.concurrency import LEAVES, to_device
from .seeding import CarriesRank, derive_seed, process_position
from .telemetry import Probes, Telemetry, read_worker_figures
from .topology import GlobalPosition, planned_stages, saved_workers, set_start
from .worker_reports import clear_reports, collect_reports, write_report, writing_figures

__all__ = [
    "Loader",
    "PipeDataset",
    "SharedEpoch",
    "as_tensors",
    "build_loader",
]

_VERSION = 1
# A pass of a loader in this process ended by an exception or was left: collect garbage before
# the next workers fork (Loader.__iter__).
_collect_before_fork = False


class SharedEpoch:
    """An epoch number in shared memory, written by the main process, read by its workers.

    Created before the DataLoader starts its workers (which inherit it, also with ``spawn``):
    a persistent worker reads the value the main process set last. Do not pickle it otherwise.

    >>> epoch = SharedEpoch()
    >>> epoch.set(3); epoch.get()
    3
    """

    def __init__(self, epoch: int = 0) -> None:
        self._value = multiprocessing.RawValue("q", _check_epoch(epoch))

    def set(self, epoch: int) -> None:
        self._value.value = _check_epoch(epoch)

    def get(self) -> int:
        return int(self._value.value)


def _check_epoch(epoch: Any) -> int:
    if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
        raise ValueError(f"epoch must be an int >= 0, got {epoch!r}")
    return epoch


class PipeDataset(CarriesRank, torch.utils.data.IterableDataset):
    """A pipeline as the dataset of a DataLoader: epochs, sharding, seeds and exact resume.

    Each pass (``iter``) reads the epoch from :attr:`shared_epoch` (or from a loaded state),
    sets it on every pipe of the graph, seeds torch's ``shuffle`` stages from ``(seed,
    epoch)``, tells pipes with ``apply_sharding`` where this process stands, and yields the
    pipeline's items. :meth:`state_dict` / :meth:`load_state_dict` follow the protocol of
    torchdata's ``StatefulDataLoader`` (which calls them in every worker); see the module
    documentation for what a state holds and what a restore reads again.

    Args:
        pipe: the pipeline (an ``IterDataPipe``), e.g. ending in ``collate``.
        seed: base seed for torch's ``shuffle`` stages (speechpipe's pipes have their own).
        epoch: the first epoch.

    >>> import speechpipe
    >>> from speechpipe import IterableWrapper
    >>> ds = PipeDataset(IterableWrapper([3, 1, 2]).block_batch(4, seed=0))
    >>> list(ds)
    [[3], [1, 2]]
    >>> ds.state_dict()["finished"]
    True
    """

    def __init__(self, pipe: Any, *, seed: int = 0, epoch: int = 0) -> None:
        if isinstance(pipe, MapDataPipe):
            raise TypeError("pipe must be an IterDataPipe: turn a MapDataPipe into batches "
                            "with batch_by_view(view) first")
        if not isinstance(pipe, IterDataPipe):
            raise TypeError(f"pipe must be an IterDataPipe, got {type(pipe).__name__}")
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise TypeError(f"seed must be an int, got {seed!r}")
        self.pipe = pipe
        self.seed = seed
        self.shared_epoch = SharedEpoch(epoch)
        self.shared_start = SharedEpoch(0)  # plan_batches: the global batch a pass starts at
        self._pending: dict | None = None
        self._starting: dict | None = None
        self._live: dict | None = None
        self._transfer: tuple[str, torch.Tensor, torch.Tensor] | None = None  # build_loader
        self._reports: str | None = None  # folder for the workers' skip counts (build_loader)
        self._telemetry = False  # probe the stages of each pass (build_loader(telemetry=))
        self._probes: Probes | None = None  # the running pass's, in this process

    # -- epochs

    @property
    def epoch(self) -> int:
        return self.shared_epoch.get()

    def set_epoch(self, epoch: int) -> PipeDataset:
        """The epoch of the next pass, here and in every worker (also persistent ones)."""
        self.shared_epoch.set(epoch)
        return self

    def _prepare(self, epoch: int) -> None:
        nodes = graph_nodes(self.pipe)
        propagate_epoch(self.pipe, epoch)
        set_start(nodes, epoch, self.shared_start.get())
        for i, node in enumerate(n for n in nodes
                                 if type(n).__name__ == "ShufflerIterDataPipe"):
            node.set_seed(derive_seed(self.seed, epoch, 0, 0, "torch-shuffle", i) % 2**63)
        where = process_position()
        total = where.world_size * where.num_workers
        instance = where.worker * where.world_size + where.rank
        for node in nodes:
            apply = getattr(node, "apply_sharding", None)
            if callable(apply):
                apply(total, instance)

    # -- iteration

    def __iter__(self) -> Iterator[Any]:
        # Not a generator function: the pass is registered now, so that a state taken between
        # iter() and the first item (the DataLoader takes one when a worker starts a pass)
        # describes this pass, not the previous one.
        resume, self._pending = self._pending, None
        self._live = None
        self._starting = resume if resume is not None else {
            "version": _VERSION, "epoch": self.epoch, "started": False}
        return self._pass(resume)

    def _pass(self, resume: dict | None) -> Iterator[Any]:
        epoch = self.epoch if resume is None else _check_epoch(resume["epoch"])
        if resume is not None and resume.get("finished"):
            self._live = {"epoch": epoch, "finished": True, "stages": []}
            return
        self._prepare(epoch)
        stages = resumable_stages(self.pipe)
        try:
            if resume is not None and resume.get("started"):
                restore(stages, resume.get("stages", {}), self.pipe)
                propagate_epoch(self.pipe, epoch)  # the replays were passes of their own
            live = self._live = {"epoch": epoch, "finished": False, "stages": stages,
                                 "unsaveable": unresumable_reason(self.pipe)}
            info = torch.utils.data.get_worker_info()
            items: Iterable = self.pipe
            if self._telemetry:  # after the restore: its replays are not the pass's work
                probes = self._probes = Probes(self.pipe)
                probes.install()
                items = probes.top
                if info is not None and self._reports is not None:
                    items = writing_figures(items, probes, self._reports, info.id)
            if info is not None and self._reports is not None:
                report_to_main_process()  # its skips are warned of there, added up, once
            if self._transfer is not None and info is not None:
                pool = install(info.id, *self._transfer)
                for item in items:
                    yield pool.wrap(item)  # batches collated in reused shared memory
            else:
                for item in items:
                    yield item
            live["finished"] = True
            if info is not None and self._reports is not None:
                write_report(self._reports, info.id, self.pipe)
        except SpeechpipeError as error:
            if torch.utils.data.get_worker_info() is not None:
                mark_location(error)  # so that the main process gets .source/.line/.key too
            raise
        finally:
            if self._probes is not None:
                self._probes.remove()
            end_pass(stages)

    def __len__(self) -> int:
        return len(self.pipe)

    # -- state

    def state_dict(self) -> dict:
        """The state of the running pass: the epoch and each resumable pipe's state."""
        if self._pending is not None:
            return dict(self._pending)
        live = self._live
        if live is None:
            if self._starting is not None:  # iter() was called, no item was asked yet
                return dict(self._starting)
            return {"version": _VERSION, "epoch": self.epoch, "started": False}
        if live["finished"]:
            return {"version": _VERSION, "epoch": live["epoch"], "started": True,
                    "finished": True}
        stages = live["stages"]
        if live["unsaveable"]:  # the DataLoader asks every step: say why, raise on load
            return {"version": _VERSION, "epoch": live["epoch"], "started": True,
                    "finished": False, "unresumable": live["unsaveable"]}
        states = take_states(stages)
        return {"version": _VERSION, "epoch": live["epoch"], "started": True,
                "finished": False, "stages": states}

    def load_state_dict(self, state: Mapping) -> None:
        """Resume from ``state`` at the next pass (``{}``: start afresh)."""
        if not isinstance(state, Mapping):
            raise TypeError(f"state must be a dict from state_dict(), got {state!r}")
        if not state:
            self._pending = None
            return
        if state.get("version") != _VERSION:
            raise ValueError(f"unknown loader state version {state.get('version')!r} "
                             f"(this speechpipe writes {_VERSION})")
        if state.get("unresumable"):
            raise TypeError(state["unresumable"])
        self._pending = dict(state)
        self.shared_epoch.set(_check_epoch(state["epoch"]))


def _shut_down(iterator: Any, dataloader: Any) -> None:
    """After an error, stop the workers of a DataLoader iterator now (torch leaves them to its
    ``__del__``, which runs whenever the traceback holding it is collected -- possibly in a
    process forked later); persistent workers are left to their loader."""
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is not None and not dataloader.persistent_workers:
        shutdown()


def _find_unresumable(state: Any) -> str | None:
    """The reason a worker's state says it cannot be resumed, anywhere in the saved state."""
    if isinstance(state, Mapping):
        if state.get("unresumable"):
            return state["unresumable"]
        for value in state.values():
            found = _find_unresumable(value)
            if found:
                return found
    return None


# --------------------------------------------------------------------------------------------
# The loader
# --------------------------------------------------------------------------------------------


class Loader:
    """What :func:`build_loader` returns: iterate it once per epoch.

    Attributes:
        dataset: the :class:`PipeDataset` (the pipeline as the workers run it).
        dataloader: the ``StatefulDataLoader`` (or ``DataLoader``) reading it.
        epoch: the epoch of the next (or current) pass.
    """

    def __init__(self, dataset: PipeDataset, dataloader: Any, *, device: torch.device | None,
                 non_blocking: bool, uneven: Any = None,
                 telemetry: Telemetry | None = None) -> None:
        self.dataset = dataset
        self.dataloader = dataloader
        self.device = device
        self.non_blocking = non_blocking
        self.uneven = uneven
        self.telemetry = telemetry
        if telemetry is not None:
            telemetry.num_workers = dataloader.num_workers
            telemetry.persistent_workers = bool(dataloader.persistent_workers)
            telemetry._refresh = weakref.WeakMethod(self._read_stage_figures)  # not a cycle
        self._epoch_given = True  # the first pass uses the epoch the loader starts at
        self._between_epochs = False  # the last pass ran to its end; none has started since
        self._stages_fingerprint: dict | None = None  # taken once, before the first pass
        self.position = GlobalPosition(dataset.shared_start, dataset.pipe) if planned_stages(
            dataset.pipe) else None  # plan_batches: one position for any topology

    @property
    def epoch(self) -> int:
        return self.dataset.epoch

    def set_epoch(self, epoch: int) -> Loader:
        """Use ``epoch`` for the next pass, in every worker (persistent ones included).

        Without it, each pass is the next epoch: a pass that ran to its end moves the loader
        to the next epoch (so ``loader.epoch`` and a checkpoint taken after the loop name the
        epoch to continue with), and a pass left early is followed by the next epoch too.
        """
        self.dataset.set_epoch(epoch)
        for counter in (self.uneven, self.position):  # len() counts the epoch set
            if callable(getattr(counter, "set_epoch", None)):
                counter.set_epoch(epoch)
        self._epoch_given = True
        return self

    def __iter__(self) -> Iterator[Any]:
        if not self._epoch_given:  # the last pass was left early and no epoch was set since
            self.set_epoch(self.epoch + 1)
        if self._stages_fingerprint is None and hasattr(self.dataloader, "state_dict"):
            self.fingerprint()  # the pipeline as built, before a pass changes any attribute
        self._epoch_given = self._between_epochs = False
        batches = self.uneven if self.uneven is not None else self.dataloader
        release_now()  # slots of batches dropped since the last arrival
        if self.dataset._transfer is not None and not self.dataloader.persistent_workers:
            forget_segments(self.dataset._transfer[0])  # the last pass's workers
        reports = self.dataset._reports
        if self.telemetry is not None:  # a pass left early: its figures so far
            self._read_stage_figures()
            self.telemetry.end_pass()
        if reports is not None:
            clear_reports(reports)  # left by a pass that was not run to its end
        global _collect_before_fork
        if _collect_before_fork and self.dataloader.num_workers:
            # An earlier pass's DataLoader iterator still alive (held by an exception's
            # traceback) would be inherited by the workers about to fork and collected there:
            # its __del__ then asks whether its workers are alive, from a process that is not
            # their parent ("AssertionError: can only test a child process"). Collected here,
            # only after a pass (of any loader) that did not end: a full collection costs 80 ms
            # in a process with torch and a few libraries imported, more beside a model.
            gc.collect()
            _collect_before_fork = False
        started = time.perf_counter()
        if self.position is not None:
            self.position.begin_pass(self.epoch)
        iterator = iter(batches) if self.position is None else self.position.counted(
            iter(batches))
        ended = False
        try:
            if self.telemetry is not None:
                yield from self._timed(iterator, started)
            elif self.device is None:
                yield from iterator
            else:
                for batch in iterator:
                    yield to_device(batch, self.device, non_blocking=self.non_blocking)
            ended = True
        except Exception:
            _shut_down(iterator, self.dataloader)
            raise
        finally:
            if not ended:
                _collect_before_fork = True
        if self.telemetry is not None:
            self._read_stage_figures()
            self.telemetry.end_pass()
        if reports is not None:  # every worker has finished its pass: add up their counts
            collect_reports(reports, self.dataset.pipe)
        if self.dataset._transfer is not None and not self.dataloader.persistent_workers:
            forget_segments(self.dataset._transfer[0])  # its workers have exited
        self.set_epoch(self.epoch + 1)  # the pass ran to its end: the next one is a new epoch
        self._between_epochs = True

    def __len__(self) -> int:
        return len(self.uneven if self.uneven is not None else self.dataloader)

    def _timed(self, iterator: Iterator, started: float) -> Iterator[Any]:
        """The batches, with the time the loop waits in ``next()`` recorded per step."""
        telemetry = self.telemetry
        clock = time.perf_counter
        handed = None  # when the last batch was handed to the loop
        while True:
            stepped = clock()  # the step ends; counting the ready batches is no wait
            ready = _ready_batches(getattr(self.dataloader, "_iterator", None))
            asked = clock()
            try:
                batch = next(iterator)
            except StopIteration:
                return
            if self.device is not None:
                batch = to_device(batch, self.device, non_blocking=self.non_blocking)
            now = clock()
            if handed is None:
                telemetry.record_first_batch(now - started)
            else:
                telemetry.record_step(now - asked, stepped - handed, ready)
            handed = clock()
            yield batch

    def _read_stage_figures(self) -> None:
        """The stage figures so far: the workers' files, or this process's probes."""
        if self.dataloader.num_workers:
            if self.dataset._reports is not None:
                self.telemetry.record_workers(read_worker_figures(self.dataset._reports))
        elif self.dataset._probes is not None:
            self.telemetry.record_workers({0: self.dataset._probes.figures()})
            if self.dataset._probes._installed == []:  # its pass ended: read once
                self.dataset._probes = None

    def state_dict(self) -> dict:
        """The position after the last batch yielded (``StatefulDataLoader.state_dict``); after
        a pass that ran to its end, the start of the next epoch. It carries the loader's
        ``fingerprint``: what decides the batches (:meth:`load_state_dict` compares it)."""
        state = getattr(self.dataloader, "state_dict", None)
        if state is None:
            raise TypeError("this loader cannot save its position: it was built with "
                            "resumable=False (or without torchdata>=0.10's StatefulDataLoader)")
        if self.position is not None:  # any rank's state resumes any topology
            return {"epoch": self.epoch, "dataloader": None, "fingerprint": self.fingerprint(),
                    "batches": self.position.consumed(self._between_epochs, self.epoch)}
        if self._between_epochs:
            return {"epoch": self.epoch, "dataloader": None, "fingerprint": self.fingerprint()}
        saved = state()
        reason = _find_unresumable(saved)
        if reason:
            raise TypeError(reason)
        return {"epoch": self.epoch, "dataloader": saved, "fingerprint": self.fingerprint()}

    def fingerprint(self) -> dict:
        """What decides this loader's batches: each stage of the pipeline in graph order with
        the settings that decide its output (seed, budget, buffer sizes, boundaries, a digest of
        the shard list or manifest...: :mod:`speechpipe.pipes._core._fingerprint`) and the loader's
        ``seed``, ``world_size`` and ``num_workers``. Reads no data."""
        if self._stages_fingerprint is None:
            self._stages_fingerprint = fingerprint(self.dataset.pipe)
        where = process_position()
        topology = {"positions": "global"} if self.position is not None else {
            "world_size": where.world_size, "num_workers": self.dataloader.num_workers}
        return {**self._stages_fingerprint, "loader": {"seed": self.dataset.seed, **topology}}

    def load_state_dict(self, state: Mapping, *, allow_changes: Iterable[str] = ()) -> None:
        """Continue where ``state`` was saved: the next batches are the ones that followed.

        The state must belong to this loader: its fingerprint (:meth:`fingerprint`) is
        compared with this loader's before anything is restored or fetched again, and a
        :class:`~speechpipe.errors.ResumeError` lists each difference (stage, field, saved ->
        current) -- another pipeline, budget, seed, shard list or manifest, number of workers or
        world size.

        Args:
            state: a dict from :meth:`state_dict`.
            allow_changes: differences to accept, each named as the error names its field
                (``"budget"`` or ``"constraint.budget"``, ``"seed"``, ``"num_workers"``,
                ``"world_size"``, ``"iterable"`` for a source's list, ``"stages"`` for stages
                added or removed). An accepted change takes effect from the next epoch: a
                state saved inside epoch ``e`` resumes at the start of epoch ``e + 1`` (the
                rest of epoch ``e`` is skipped: under the new settings it would not be the
                saved run's), a state saved between epochs at the start of the next one; a
                :class:`ResumeWarning` says so, listing the changes.
        """
        if not isinstance(state, Mapping) or "dataloader" not in state:
            raise TypeError(f"state must be a dict from Loader.state_dict(), got {state!r}")
        allowed = check_allow_changes(allow_changes)
        epoch = _check_epoch(state["epoch"])
        found = self._differences(state)
        refused = [d for d in found if not allows_change(allowed, d)]
        if refused:
            raise ResumeError(refusal(refused), refused)
        if found:
            mid_epoch = state["dataloader"] is not None or bool(state.get("batches"))
            start = epoch + 1 if mid_epoch else epoch
            skipped = (f"; the rest of epoch {epoch} after the saved step is skipped"
                       if mid_epoch else "")
            warnings.warn(
                f"resuming with changes (allow_changes): {'; '.join(describe_differences(found))}"
                f". They take effect from epoch {start}, which starts now{skipped}",
                ResumeWarning, stacklevel=2)
            self._forget_loaded_state()
            self.set_epoch(start)
            return
        self.set_epoch(epoch)
        if self.position is not None:
            self._forget_loaded_state()
            self.position.load(state, epoch)
        elif state["dataloader"] is not None:  # None: at the start of that epoch
            self.dataloader.load_state_dict(state["dataloader"])
        else:
            self._forget_loaded_state()

    def _forget_loaded_state(self) -> None:
        """Drop a position an earlier ``load_state_dict`` left for the next pass (the next
        pass starts its epoch afresh)."""
        if getattr(self.dataloader, "next_iter_state", None) is not None:
            self.dataloader.next_iter_state = None
        self.dataset._pending = None

    def _differences(self, state: Mapping) -> list:
        """What differs between the loader ``state`` was saved from and this one: the
        fingerprints, and the number of workers the DataLoader's own state was shaped for."""
        current = self.fingerprint()
        saved = state.get("fingerprint")
        if saved is None:  # saved by a speechpipe before fingerprints: only the shape is known
            found = []
            warnings.warn("the state has no fingerprint (saved by an older speechpipe): only "
                          "its number of workers can be checked against this loader",
                          ResumeWarning, stacklevel=3)
        elif not isinstance(saved, Mapping) or saved.get("version") != FINGERPRINT_VERSION:
            raise ResumeError(
                f"the state's fingerprint has version "
                f"{saved.get('version') if isinstance(saved, Mapping) else saved!r}; this "
                f"speechpipe writes version {FINGERPRINT_VERSION} and cannot compare it")
        else:
            found = differences(saved, current)
        workers = saved_workers(state["dataloader"])
        here = current["loader"].get("num_workers")
        if workers is not None and workers != here and not any(
                d[:2] == ("loader", "num_workers") for d in found):
            found.insert(0, ("loader", "num_workers", workers, here))
        return found


def _ready_batches(iterator: Any) -> int | None:
    """Batches a DataLoader iterator holds ready: received out of order, and waiting in its
    result queue (``qsize``, approximate); None without workers."""
    if iterator is None or not getattr(iterator, "_num_workers", 0):
        return None
    ready = 0
    info = getattr(iterator, "_task_info", None)
    received = getattr(iterator, "_rcvd_idx", 0)
    if isinstance(info, dict):
        ready += sum(1 for index, task in list(info.items())
                     if index >= received and len(task) == 2)
    queue = getattr(iterator, "_data_queue", None)
    try:
        ready += queue.qsize()
    except (AttributeError, NotImplementedError, OSError):
        pass
    return ready


def as_tensors(item: Any) -> Any:
    """Numpy arrays in a batch to tensors (sharing memory), the rest as it is
    (:func:`~speechpipe.pipes.concurrency.to_device` without a device), handing a list of keys
    back as it is rather than walking it: ``build_loader``'s ``collate_fn``.

    >>> import numpy as np
    >>> out = as_tensors({"feats": np.zeros((2, 3), np.float32), "key": ["u1", "u2"]})
    >>> type(out["feats"]).__name__, out["key"]
    ('Tensor', ['u1', 'u2'])
    """
    kind = type(item)
    if kind is dict:
        return {k: as_tensors(v) for k, v in item.items()}
    if kind is list and all(type(v) in LEAVES for v in item):
        return item
    return to_device(item)


# long: a 70-line docstring (every setting); the body is 30 lines
def build_loader(
    pipe: Any,
    *,
    num_workers: int = 0,
    prefetch_factor: int | None = None,
    pin_memory: bool = False,
    persistent_workers: bool = False,
    device: str | torch.device | None = None,
    seed: int = 0,
    uneven: str | Callable[[Iterable], Iterable] | None = None,
    snapshot_every: int = 100,
    multiprocessing_context: str | None = None,
    reuse_shared_memory: bool = True,
    resumable: bool = True,
    telemetry: bool | Telemetry = False,
) -> Loader:
    """Build the loader a training script iterates: workers, prefetch, pinning, device,
    uneven inputs and exact resume, in one call.

    Args:
        pipe: the pipeline, ending in batches (``... .block_batch(...).collate(...)`` or
            ``batch_by_view(view).collate(...)``): batching and collation run in the workers,
            so each transfer between processes carries a whole batch.
        num_workers: DataLoader worker processes (0: in the main process).
        prefetch_factor: batches each worker prepares ahead (default 2 with workers).
        pin_memory: pin batches (page-locked memory) in the DataLoader's pin thread, for
            asynchronous copies to the GPU.
        persistent_workers: keep the workers (and their pipeline copies) across epochs;
            :meth:`Loader.set_epoch` still reaches them (see the module documentation).
        device: move each batch there in the main process (``non_blocking`` when pinned).
        seed: seeds torch's ``shuffle`` stages and the workers' global random generators.
        uneven: the uneven-input stage for ``torch.distributed`` (in the main process, after
            the DataLoader): a policy of :class:`~speechpipe.pipes.distributed._equal.EqualSteps`
            (``"stop"``, ``"pad"``), or a callable taking the DataLoader and returning the
            iterable to use (e.g. ``lambda dl: EqualSteps(dl, "plan", steps=planner)``).
        snapshot_every: how often workers send their state to the main process, in batches
            (``StatefulDataLoader``'s ``snapshot_every_n_steps``). A checkpoint between two
            snapshots is exact too: the new process fetches the batches since the last snapshot
            again (at most ``snapshot_every - 1``). Small values cost throughput (see the module
            documentation and ``benchmarks/README.md``, "Loader state snapshots").
        multiprocessing_context: how workers start, ``"fork"``, ``"spawn"`` or
            ``"forkserver"`` (default: the platform's); spawned workers get their rank from
            :class:`PipeDataset` (see :func:`speechpipe.seeding.pin_rank`).
        reuse_shared_memory: with workers, each worker collates into a few shared-memory
            segments it reuses once the main process has let go of their batches, instead of
            a fresh segment per batch; each segment reaches the main process once and stays
            mapped there, and small tensors travel inline, so a batch costs no connection to
            the worker (:mod:`speechpipe.memory._transfer`; measurements: ``benchmarks/README.md``,
            "Worker transfer"). Turn off where ``/dev/shm``
            is small (up to :data:`speechpipe.memory.MAX_BYTES` stays allocated per worker,
            and mapped in the main process too).
        resumable: the loader can save its position (``state_dict()``) and resume exactly.
            A pipeline with a stage that cannot be resumed (torch's ``shuffle``, ``batch``...,
            or no source that knows its position) is then refused here, naming the stage and
            what to use instead. ``False``: a plain ``DataLoader``, no ``state_dict()``.
        telemetry: record where the time goes (``loader.telemetry``, a
            :class:`~speechpipe.telemetry.Telemetry`; ``True`` for one without a callback):
            the loop's wait in ``next()`` per step, time to the first batch, ready batches,
            and per stage and worker the CPU time spent; ``loader.telemetry.report()`` starts
            with a verdict. Costs a few clock reads per item per stage
            (``benchmarks/bench_telemetry.py``).

    >>> import numpy as np, speechpipe
    >>> from speechpipe import SequenceWrapper
    >>> from speechpipe.pipes.collate import PadCollate
    >>> from speechpipe.pipes.batching import BatchView
    >>> data = {f"u{i}": {"key": f"u{i}", "feats": np.ones((i + 1, 2), np.float32)}
    ...         for i in range(5)}
    >>> view = BatchView({k: len(s["feats"]) for k, s in data.items()}, budget=6, seed=0)
    >>> pipe = SequenceWrapper(data).batch_by_view(view).collate(collate_fn=PadCollate())
    >>> loader = build_loader(pipe, seed=0)
    >>> [tuple(b["feats"].shape) for b in loader]
    [(1, 1, 2), (1, 4, 2), (1, 5, 2), (2, 3, 2)]
    """
    device = _check_options(num_workers, prefetch_factor, pin_memory, persistent_workers,
                            device, uneven, snapshot_every, multiprocessing_context,
                            reuse_shared_memory, resumable)
    if telemetry is True:
        telemetry = Telemetry()
    elif telemetry is not False and not isinstance(telemetry, Telemetry):
        raise TypeError(f"telemetry must be a bool or a Telemetry, got {telemetry!r}")
    dataset = PipeDataset(pipe, seed=seed)
    reason = unresumable_reason(pipe) if resumable else None
    if reason is not None:
        raise TypeError(f"{reason} (or build_loader(..., resumable=False) to train without "
                        "saving the loader's position)")
    if num_workers and reuse_shared_memory:
        dataset._transfer = new_table(num_workers)
    if num_workers:
        dataset._reports = tempfile.mkdtemp(prefix="speechpipe-reports-")
    dataset._telemetry = bool(telemetry)
    generator = torch.Generator().manual_seed(derive_seed(seed, 0, 0, 0, "loader") % 2**63)
    options = dict(batch_size=None, num_workers=num_workers, pin_memory=pin_memory,
                   persistent_workers=persistent_workers, generator=generator,
                   collate_fn=as_tensors)
    if num_workers:
        options["prefetch_factor"] = prefetch_factor or 2
    if multiprocessing_context is not None:
        options["multiprocessing_context"] = multiprocessing_context
    dataloader = _dataloader(dataset, options, snapshot_every if resumable else None)
    wrapped = None
    if isinstance(uneven, str):
        from .pipes.distributed import EqualSteps

        wrapped = EqualSteps(dataloader, policy=uneven)
    elif uneven is not None:
        wrapped = uneven(dataloader)
    loader = Loader(dataset, dataloader, device=device, non_blocking=pin_memory and device is
                    not None and device.type != "cpu", uneven=wrapped,
                    telemetry=telemetry or None)
    if dataset._transfer is not None:
        keep_table_while(loader, dataset._transfer[0])
    if dataset._reports is not None:
        weakref.finalize(loader, shutil.rmtree, dataset._reports, True)
    return loader


def _check_options(num_workers, prefetch_factor, pin_memory, persistent_workers, device, uneven,
                   snapshot_every, multiprocessing_context, reuse_shared_memory, resumable):
    """Validate :func:`build_loader`'s settings (errors name the argument); the device."""
    for name, value in (("num_workers", num_workers), ("snapshot_every", snapshot_every)):
        if not isinstance(value, int) or isinstance(value, bool) or value < (name != "num_workers"):
            raise ValueError(f"{name} must be an int >= {int(name != 'num_workers')}, "
                             f"got {value!r}")
    if prefetch_factor is not None:
        if not isinstance(prefetch_factor, int) or isinstance(prefetch_factor, bool) \
                or prefetch_factor < 1:
            raise ValueError(f"prefetch_factor must be an int >= 1, got {prefetch_factor!r}")
        if num_workers == 0:
            raise ValueError("prefetch_factor needs num_workers > 0 (the main process does not "
                             "prefetch)")
    if persistent_workers and num_workers == 0:
        raise ValueError("persistent_workers=True needs num_workers > 0")
    if multiprocessing_context is not None and num_workers == 0:
        raise ValueError("multiprocessing_context needs num_workers > 0")
    for name, value in (("pin_memory", pin_memory), ("persistent_workers", persistent_workers),
                        ("reuse_shared_memory", reuse_shared_memory), ("resumable", resumable)):
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be a bool, got {value!r}")
    if uneven is not None and not (isinstance(uneven, str) or callable(uneven)):
        raise TypeError(f"uneven must be a policy name or a callable, got {uneven!r}")
    if device is None:
        return None
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device must name a torch device, got {device!r}") from exc


def _dataloader(dataset: PipeDataset, options: dict, snapshot_every: int | None) -> Any:
    """torchdata's ``StatefulDataLoader`` (``snapshot_every`` given), else torch's."""
    try:
        from torchdata.stateful_dataloader import StatefulDataLoader
    except ImportError:  # pragma: no cover - torchdata is a dependency
        StatefulDataLoader = None
    if StatefulDataLoader is None or snapshot_every is None:
        return torch.utils.data.DataLoader(dataset, **options)
    with warnings.catch_warnings():  # torchdata 0.11 calls a deprecated torch function
        warnings.filterwarnings("ignore", message=".*set_vital.*")
        return StatefulDataLoader(dataset, snapshot_every_n_steps=snapshot_every, **options)
