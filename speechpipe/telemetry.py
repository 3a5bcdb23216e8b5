"""Where a training loop's time goes: does it wait on data, and which stage is slow.

``build_loader(..., telemetry=True)`` (or a :class:`Telemetry` with a logging callback) gives
the loader a ``loader.telemetry`` that records:

* **in the main process**, per step: the time the training loop waited inside ``next()``
  (and the time it spent between two ``next()`` calls: the step itself), the batches ready in
  the DataLoader's queue when it asked (``StatefulDataLoader``'s received batches not yet
  handed out plus its result queue's ``qsize``; ``None`` without workers), so that the waits
  split into waiting on data (no batch ready) and receiving a ready batch; and, per pass, the
  time from ``iter(loader)`` to its first batch (the epoch boundary, apart from the steps);
* **in each worker** (or the main process without workers), per stage of the pipeline: items,
  the wall time around each ``next()`` of the stage and the CPU time of the thread that ran it
  (``time.thread_time`` is read around one call in :data:`SAMPLE_EVERY`, as that clock costs a
  system call: the CPU time is the wall time times the sampled calls' CPU / wall ratio), less
  what the stages below it took (a stage's own time).
  A probe (:class:`StageProbe`) is put in front of every pipe that another pipe holds as an
  attribute, for the pass only, and taken out when it ends; the graph walks see through it
  (:mod:`speechpipe.pipes._core._graph`), so states and counters keep their paths. Stages held in
  lists (``concat``, ``zip_by_name``'s sources) are counted in the stage that holds them, and
  work done in other threads (``map_in_threads``' pool, ``prefetch_in_thread``'s reader) is not
  CPU time of the stage that waits for it.

The workers' figures travel back as their skip counts do (a file per worker in the loader's
report folder, written at most once a second and at the end of the pass).
:meth:`Telemetry.report` starts with a verdict, e.g. ``data-bound in 23 % of steps; load_audio
takes 61 % of the workers' CPU; try 2 more workers, DecodeCollate or features on the device``;
:meth:`Telemetry.snapshot` is a flat dict for a logger, also handed to ``callback`` every
``every`` steps. The cost of the probes: ``benchmarks/bench_telemetry.py``.
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any, Callable, Mapping

from .pipes._core import IterDataPipe, graph_nodes, plain_iterator

__all__ = ["StageProbe", "Telemetry"]

#: A step is data-bound when the loop waited more than this share of the step's time (and no
#: batch was ready).
DATA_BOUND_SHARE = 0.05
#: A probe reads the thread's CPU clock around one ``next()`` in this many.
SAMPLE_EVERY = 8
#: Seconds between two writes of a worker's figures.
WRITE_EVERY = 1.0


@plain_iterator
class StageProbe(IterDataPipe):
    """Times each ``next()`` of the pipe it stands in front of (calls, wall nanoseconds, and
    the thread CPU and wall nanoseconds of one call in :data:`SAMPLE_EVERY`, into ``cell``). Walks over the graph see through it (``graph_transparent``);
    other attributes are the timed pipe's."""

    graph_transparent = True

    def __init__(self, source: IterDataPipe, cell: list) -> None:
        self.__dict__["source"] = source
        self.__dict__["cell"] = cell

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["source"], name)

    def __len__(self) -> int:
        return len(self.__dict__["source"])

    def __iter__(self):
        # cell: [next() calls, thread CPU ns of the sampled calls, wall ns of every call, wall
        # ns of the sampled calls]: the CPU is estimated as the wall time x the sampled CPU/wall.
        # The wall clock (perf_counter, read without a system call) times every call; the
        # thread's CPU clock (a system call, ~10 x dearer) every SAMPLE_EVERY-th, from the first.
        cell = self.__dict__["cell"]
        iterator = iter(self.__dict__["source"])
        cpu, wall = time.thread_time_ns, time.perf_counter_ns
        calls = 0
        while True:
            calls += 1
            if calls % SAMPLE_EVERY == 1:
                c0 = cpu()
                w0 = wall()
                try:
                    item = next(iterator)
                except StopIteration:
                    item = _END
                spent = wall() - w0
                cell[1] += cpu() - c0
                cell[2] += spent
                cell[3] += spent
            else:
                w0 = wall()
                try:
                    item = next(iterator)
                except StopIteration:
                    item = _END
                cell[2] += wall() - w0
            cell[0] += 1
            if item is _END:
                return
            yield item


_END = object()

def stage_name(node: Any) -> str:
    """The functional name of a pipe (``load_audio``; ``map(fn)`` with the function's name)."""
    names = _functional_names()
    name = names.get(type(node), type(node).__name__)
    fn = node.__dict__.get("fn")
    if callable(fn):
        name += f"({getattr(fn, '__name__', type(fn).__name__)})"
    return name


def _functional_names() -> dict[type, str]:
    out = {}
    for name, function in IterDataPipe.functions.items():
        args = getattr(function, "args", ())
        if args and isinstance(args[0], type):
            out[args[0]] = name
    return out


class Probes:
    """The probes of one pass over a pipeline: :meth:`install`, iterate, :meth:`remove`."""

    def __init__(self, pipe: Any) -> None:
        nodes = [n for n in graph_nodes(pipe) if isinstance(n, IterDataPipe)]
        self.paths = {id(n): f"{i}:{stage_name(n)}" for i, n in enumerate(nodes)}
        self.cells = {id(n): [0, 0, 0, 0] for n in nodes}
        self.children: dict[int, list[int]] = {id(n): [] for n in nodes}
        self.top = StageProbe(pipe, self.cells[id(pipe)])
        self._installed: list[tuple[Any, str, Any]] = []
        self._nodes = nodes

    def install(self) -> None:
        for node in self._nodes:
            for attr, value in list(node.__dict__.items()):
                if isinstance(value, IterDataPipe) and id(value) in self.cells \
                        and not isinstance(value, StageProbe):
                    node.__dict__[attr] = StageProbe(value, self.cells[id(value)])
                    self._installed.append((node, attr, value))
                    if id(value) not in self.children[id(node)]:
                        self.children[id(node)].append(id(value))

    def remove(self) -> None:
        for node, attr, value in reversed(self._installed):
            node.__dict__[attr] = value
        self._installed = []

    def figures(self) -> dict[str, dict]:
        """Per stage: items, own CPU and wall seconds (less the stages below it)."""
        def cpu(key: int) -> float:  # every call's wall time x the sampled calls' CPU share
            _, sampled_cpu, wall, sampled_wall = self.cells[key]
            return wall * min(1.0, sampled_cpu / sampled_wall) if sampled_wall else 0.0

        out = {}
        for key, path in self.paths.items():
            calls, _, wall, _ = self.cells[key]
            below = self.children[key]
            own_cpu = cpu(key) - sum(cpu(c) for c in below)
            wall -= sum(self.cells[c][2] for c in below)
            out[path] = {"items": max(calls - 1, 0), "cpu": max(own_cpu, 0) / 1e9,
                         "wall": max(wall, 0) / 1e9}
        return out


def write_worker_figures(folder: str, worker: int, figures: Mapping[str, dict]) -> None:
    final = os.path.join(folder, f"worker-{worker}.telemetry")
    try:
        with open(final + ".tmp", "w", encoding="utf-8") as f:
            json.dump({"worker": worker, "stages": figures}, f)
        os.replace(final + ".tmp", final)
    except OSError:  # the loader is gone: training goes on, the figures stay here
        pass


def read_worker_figures(folder: str) -> dict[int, dict]:
    out = {}
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return out
    for name in names:
        if name.endswith(".telemetry"):
            try:
                with open(os.path.join(folder, name), encoding="utf-8") as f:
                    data = json.load(f)
            except (OSError, ValueError):
                continue
            out[int(data["worker"])] = data["stages"]
    return out


class Telemetry:
    """What ``loader.telemetry`` records (see the module documentation).

    Args:
        every: call ``callback`` with :meth:`snapshot` every this many steps (0: never).
        callback: a function taking the snapshot dict (``lambda d: writer.add_scalars(...)``,
            ``wandb.log``...).
        data_bound_share: a step is data-bound when the loop waited more than this share of
            its time (wait + the step itself) and, with workers, no batch was ready when it
            asked (a wait for a ready batch is the cost of receiving it).

    >>> t = Telemetry()
    >>> for wait, step in [(0.0, 0.1), (0.05, 0.1), (0.0, 0.1), (0.0, 0.1)]:
    ...     t.record_step(wait, step, None)
    >>> t.snapshot()["data_bound_steps"]
    0.25
    """

    def __init__(self, *, every: int = 0, callback: Callable[[dict], Any] | None = None,
                 data_bound_share: float = DATA_BOUND_SHARE) -> None:
        if not isinstance(every, int) or isinstance(every, bool) or every < 0:
            raise ValueError(f"every must be an int >= 0, got {every!r}")
        if every and not callable(callback):
            raise TypeError(f"callback must be callable when every > 0, got {callback!r}")
        if not isinstance(data_bound_share, (int, float)) or not 0 < data_bound_share < 1:
            raise ValueError(f"data_bound_share must be in (0, 1), got {data_bound_share!r}")
        self.every = every
        self.callback = callback
        self.data_bound_share = float(data_bound_share)
        self.num_workers = 0
        self.persistent_workers = False  # set by the loader, for the verdict's advice
        self.reset()

    def reset(self) -> None:
        """Forget every figure (steps, waits, stages)."""
        self.steps = 0
        self.data_bound = 0
        self.wait_seconds = 0.0
        self.starved_seconds = 0.0  # waits with no batch ready (all of them without workers)
        self.step_seconds = 0.0
        self.waits: list[float] = []
        self.ready: list[int] = []
        self.first_batch_seconds: float | None = None
        self.pass_starts: list[float] = []  # every pass's time to its first batch
        self.workers: dict[int, dict] = {}  # the running pass's figures, per worker
        self._earlier: dict[int, dict] = {}  # the passes before, summed

    # -- recording (the loader calls these)

    def record_first_batch(self, seconds: float) -> None:
        """A pass's time from ``iter(loader)`` to its first batch (not a step's wait)."""
        self.pass_starts.append(seconds)
        if self.first_batch_seconds is None:
            self.first_batch_seconds = seconds

    def record_step(self, wait: float, step: float, ready: int | None) -> None:
        """One step: ``wait`` seconds in ``next()``, ``step`` seconds in the loop before it,
        ``ready`` batches received or queued when it asked (``None``: no workers)."""
        self.steps += 1
        self.wait_seconds += wait
        if not ready:
            self.starved_seconds += wait
        self.step_seconds += step
        self.waits.append(wait)
        if ready is not None:
            self.ready.append(ready)
        if wait > self.data_bound_share * (wait + step) and not ready:
            self.data_bound += 1  # it waited, and not only to receive a batch that was ready
        if self.every and self.steps % self.every == 0:
            self.callback(self.snapshot())

    def record_workers(self, figures: Mapping[int, dict]) -> None:
        """The running pass's figures per worker (each replaces that worker's last)."""
        self.workers.update(figures)

    def end_pass(self) -> None:
        """Add the pass's stage figures to the earlier passes' (a new pass counts from 0)."""
        for worker, figures in self.workers.items():
            into = self._earlier.setdefault(worker, {})
            for path, entry in figures.items():
                mine = into.setdefault(path, {"items": 0, "cpu": 0.0, "wall": 0.0})
                for key in ("items", "cpu", "wall"):
                    mine[key] += entry[key]
        self.workers = {}

    #: Set by the loader: a weak reference to its method reading the workers' files.
    _refresh: Callable[[], Callable[[], None] | None] | None = None

    # -- reading

    def per_worker(self) -> dict[int, dict]:
        """Per worker, per stage: items, CPU and wall seconds over every pass so far."""
        refresh = self._refresh() if self._refresh is not None else None
        if refresh is not None:  # the loader is alive: read its workers' latest figures
            refresh()
        out: dict[int, dict] = {}
        for source in (self._earlier, self.workers):
            for worker, figures in source.items():
                into = out.setdefault(worker, {})
                for path, entry in figures.items():
                    mine = into.setdefault(path, {"items": 0, "cpu": 0.0, "wall": 0.0})
                    for key in ("items", "cpu", "wall"):
                        mine[key] += entry[key]
        return out

    def stages(self) -> dict[str, dict]:
        """Per stage, summed over workers: items, CPU and wall seconds, share of the CPU."""
        total: dict[str, dict] = {}
        for figures in self.per_worker().values():
            for path, entry in figures.items():
                into = total.setdefault(path, {"items": 0, "cpu": 0.0, "wall": 0.0})
                for key in ("items", "cpu", "wall"):
                    into[key] += entry[key]
        cpu = sum(e["cpu"] for e in total.values())
        for entry in total.values():
            entry["cpu_share"] = entry["cpu"] / cpu if cpu else 0.0
        return total

    def snapshot(self) -> dict[str, float]:
        """A flat dict for a logger: steps, data-bound share, waits, ready batches, first
        batch, and per stage its share of the workers' CPU (``stage/<path>/cpu_share``).

        ``wait_share`` (the waits over the loop's time) is ``starved_share`` (waits with no
        batch ready: the loop waited on data) plus ``receive_share`` (waits for a batch that
        was ready: the cost of taking it from the workers' queue)."""
        steps = self.steps
        loop = self.wait_seconds + self.step_seconds
        out: dict[str, float] = {
            "steps": steps,
            "data_bound_steps": self.data_bound / steps if steps else 0.0,
            "wait_share": self.wait_seconds / loop if loop else 0.0,
            "starved_share": self.starved_seconds / loop if loop else 0.0,
            "receive_share": (self.wait_seconds - self.starved_seconds) / loop if loop else 0.0,
            "wait_seconds": self.wait_seconds,
            "wait_p50_ms": 1e3 * _quantile(self.waits, 0.5),
            "wait_p99_ms": 1e3 * _quantile(self.waits, 0.99),
            "first_batch_seconds": (math.nan if self.first_batch_seconds is None
                                    else self.first_batch_seconds),
            "passes": len(self.pass_starts),
            "pass_start_seconds": sum(self.pass_starts),
        }
        if self.ready:
            out["ready_batches_mean"] = sum(self.ready) / len(self.ready)
        for path, entry in self.stages().items():
            out[f"stage/{path}/cpu_share"] = entry["cpu_share"]
            out[f"stage/{path}/cpu_seconds"] = entry["cpu"]
        for worker, figures in sorted(self.per_worker().items()):
            out[f"worker/{worker}/cpu_seconds"] = sum(e["cpu"] for e in figures.values())
        return out

    def verdict(self) -> str:
        """One line: how often the loop waited, the costliest stage, and what to try."""
        stages = self.stages()
        share = self.data_bound / self.steps if self.steps else 0.0
        head = f"data-bound in {100 * share:.0f} % of steps"
        if not stages:
            return head + "; no stage figures (no pass has reported yet)"
        path, top = max(stages.items(), key=lambda kv: kv[1]["cpu"])
        name = path.split(":", 1)[1]
        head += f"; {name} takes {100 * top['cpu_share']:.0f} % of the workers' CPU"
        boundary = self._boundary()
        if share <= self.data_bound_share:
            return head + (f"; {boundary}" if boundary else
                           "; the loop rarely waits: nothing to do")
        tries = []
        wait, step = self.wait_seconds, self.step_seconds
        workers = max(self.num_workers, 1)
        if step > 0:  # workers needed to hide the wait: the data time per step over the step
            more = max(1, math.ceil(workers * (wait + step) / step) - self.num_workers)
            tries.append(f"{more} {'more ' if self.num_workers else ''}"
                         f"worker{'s' * (more > 1)}")
        tries.extend(_remedies(name))
        return head + "; try " + ", ".join(tries) + (f"; {boundary}" if boundary else "")

    def _boundary(self) -> str | None:
        """A clause on the passes' starts (the epoch boundaries) when, after the first pass's,
        they take more than ``data_bound_share`` of the loop's time; else ``None``."""
        later = sum(self.pass_starts[1:])
        loop = self.wait_seconds + self.step_seconds + later
        if not loop or later <= self.data_bound_share * loop:
            return None
        each = later / (len(self.pass_starts) - 1)
        tries = "" if self.persistent_workers else (
            f"{'' if self.num_workers else 'workers with '}persistent_workers=True or ")
        return (f"each pass after the first waited {each:.2f} s for its first batch "
                f"({100 * later / loop:.0f} % of the loop's time): try {tries}a smaller "
                "bucket buffer (filled before the first batch)")

    def report(self) -> str:
        """The verdict, then the figures: steps, waits, first batch, ready batches, stages."""
        snap = self.snapshot()
        lines = [self.verdict(),
                 f"steps {self.steps}: waited {self.wait_seconds:.2f} s in next() "
                 f"({100 * snap['wait_share']:.1f} % of the loop's time; per step p50 "
                 f"{snap['wait_p50_ms']:.1f} ms, p99 {snap['wait_p99_ms']:.1f} ms)",
                 *([f"  of which {100 * snap['starved_share']:.1f} % with no batch ready "
                    f"(waiting on data) and {100 * snap['receive_share']:.1f} % receiving "
                    "ready batches"] if self.ready else []),
                 f"first batch after {snap['first_batch_seconds']:.2f} s" + (
                     f"; {len(self.pass_starts)} passes started in "
                     f"{snap['pass_start_seconds']:.2f} s in all (not in the waits above)"
                     if len(self.pass_starts) > 1 else "")]
        if self.ready:
            lines.append(f"batches ready when asked: {snap['ready_batches_mean']:.1f} on average")
        else:
            lines.append("batches ready when asked: not measured (no DataLoader workers)")
        stages = self.stages()
        if stages:
            lines.append(f"{'stage':<40} {'items':>8} {'cpu s':>8} {'cpu %':>6} {'wall s':>8}")
            for path, e in sorted(stages.items(), key=lambda kv: -kv[1]["cpu"]):
                lines.append(f"{path:<40} {e['items']:>8} {e['cpu']:>8.2f} "
                             f"{100 * e['cpu_share']:>6.1f} {e['wall']:>8.2f}")
            for worker, figures in sorted(self.per_worker().items()):
                cpu = sum(e["cpu"] for e in figures.values())
                lines.append(f"worker {worker}: {cpu:.2f} s CPU in stages")
        return "\n".join(lines)


def _remedies(name: str) -> list[str]:
    if name.startswith(("decode", "load_audio", "resample")):
        return ["DecodeCollate or features on the device"]
    if name.startswith("compute_features"):
        return ["features on the device (FrontEnd(features_on='device'))"]
    if name.startswith(("map", "perturb_speed", "add_noise", "reverberate", "spec_augment")):
        return [f"a cheaper {name} or one on the device"]
    return []


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
