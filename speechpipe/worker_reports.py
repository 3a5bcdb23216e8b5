"""What DataLoader workers report to the main process: their stages' ledgers (skip counts,
batching records, token counts, buffers: :class:`~speechpipe.diagnostics.Ledger`) at the end of
each pass, and their telemetry figures while a pass runs, as JSON files in the loader's report
folder; the main process adds the ledgers up once per pass."""

from __future__ import annotations

import json
import os
import time
import warnings
from typing import Any, Iterable, Iterator

from .diagnostics import Ledger
from .pipes._core import graph_nodes
from .telemetry import WRITE_EVERY, Probes, write_worker_figures

__all__ = ["clear_reports", "collect_reports", "find_ledgers", "write_report", "writing_figures"]


def find_ledgers(pipe: Any) -> list[tuple[str, Any]]:
    """``(path, ledger)`` of every :class:`~speechpipe.diagnostics.Ledger` a stage of the graph
    holds as an attribute (skip counts, batching records, token counts, buffer records...); the
    path is the same in every process that holds a copy of the pipeline."""
    out = []
    for i, node in enumerate(graph_nodes(pipe)):
        for attr, ledger in sorted(vars(node).items()):
            if isinstance(ledger, Ledger):
                out.append((f"{i}:{type(node).__name__}.{attr}", ledger))
    return out


def write_report(folder: str, worker: int, pipe: Any) -> None:
    """In a worker at the end of its pass: its ledgers, for the main process to add up."""
    data = {path: ledger.to_dict() for path, ledger in find_ledgers(pipe)}
    for path, ledger in find_ledgers(pipe):
        if ledger.per_worker:  # kept per worker, not added up
            data[path]["worker"] = worker
    final = os.path.join(folder, f"worker-{worker}.json")
    try:
        with open(final + ".tmp", "w", encoding="utf-8") as f:
            json.dump(data, f)
        os.replace(final + ".tmp", final)
    except OSError as exc:  # the loader is gone, or the disk is full: training goes on
        if not os.path.isdir(folder):
            return  # the loader was collected (a loop left early, the script ending): no reader
        warnings.warn(f"worker {worker} could not report its skip counts to the main "
                      f"process ({exc}); its pipes' diagnostics stay in the worker",
                      RuntimeWarning, stacklevel=2)


def writing_figures(items: Iterable, probes: Probes, folder: str, worker: int) -> Iterator:
    """``items``, writing this worker's stage figures at most every :data:`WRITE_EVERY`
    seconds and at the end of the pass."""
    last = time.perf_counter()
    for item in items:
        now = time.perf_counter()
        if now - last > WRITE_EVERY:
            write_worker_figures(folder, worker, probes.figures())
            last = now
        yield item
    write_worker_figures(folder, worker, probes.figures())


def clear_reports(folder: str) -> None:
    for name in os.listdir(folder):
        os.remove(os.path.join(folder, name))


def collect_reports(folder: str, pipe: Any) -> None:
    """In the main process after a pass: each ledger of ``pipe`` becomes the sum of the
    workers' (the main process's copies of the pipes never ran)."""
    ledgers = dict(find_ledgers(pipe))
    for ledger in ledgers.values():
        ledger.reset()
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".json"):
            continue
        with open(os.path.join(folder, name), encoding="utf-8") as f:
            data = json.load(f)
        for path, entry in data.items():
            if path in ledgers:
                ledgers[path].merge(entry)
    clear_reports(folder)
    for ledger in ledgers.values():  # e.g. the workers' skips, warned once per pass
        ledger.end_of_pass()
