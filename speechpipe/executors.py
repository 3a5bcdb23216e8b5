"""Where preparation work runs: any :class:`concurrent.futures.Executor`, or a Dask cluster.

``pack_data``, ``prepare --verify`` and ``compute_cmvn_stats`` take ``executor=``: a process
pool, a thread pool, or Dask's ``distributed.Client`` (``pip install 'speechpipe[dask]'``; the
CLI's ``--dask SCHEDULER``), whose ``get_executor()`` is a ``concurrent.futures`` face on the
cluster. :func:`as_executor` turns the argument into an executor, :func:`run_tasks` runs a
function over task arguments on it, as they complete, and :func:`dask_client` connects to a
scheduler for the CLI. The functions and their arguments travel by pickle: they must be
importable module-level functions (a Dask worker imports them by name).
"""

from __future__ import annotations

import concurrent.futures
import os
import signal
import sys
import threading
from typing import Any, Callable, Iterator, Sequence

__all__ = ["TUNE_ALLOCATOR", "as_executor", "dask_client", "in_worker",
           "leave_interrupts_to_the_main_process", "run_tasks", "tune_allocator"]

#: The environment variable that, set to ``0`` in a worker's environment, keeps
#: :func:`tune_allocator` from changing anything.
TUNE_ALLOCATOR = "SPEECHPIPE_TUNE_ALLOCATOR"
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3  # glibc's mallopt parameters
_tuned: list[bool] = []


def as_executor(executor: Any) -> concurrent.futures.Executor:
    """``executor`` itself (a :class:`concurrent.futures.Executor`) or a Dask
    ``distributed.Client``'s ``get_executor()``.

    Raises:
        TypeError: anything else, naming it.

    >>> with concurrent.futures.ThreadPoolExecutor(1) as pool:
    ...     as_executor(pool) is pool
    True
    """
    if isinstance(executor, concurrent.futures.Executor):
        return executor
    get = getattr(executor, "get_executor", None)  # distributed.Client
    if callable(get):
        return get()
    raise TypeError(f"executor must be a concurrent.futures.Executor or a Dask "
                    f"distributed.Client, got {executor!r}")


def dask_client(address: str) -> Any:
    """A ``distributed.Client`` connected to the scheduler at ``address`` (the CLI's ``--dask``).

    Raises:
        ImportError: Dask's ``distributed`` is not installed, saying how to install it.
    """
    try:
        import distributed
    except ImportError as exc:
        raise ImportError("--dask needs Dask's distributed: pip install 'speechpipe[dask]'"
                          ) from exc
    return distributed.Client(address)


def leave_interrupts_to_the_main_process() -> None:
    """A worker ignores Ctrl-C (SIGINT): the main process handles it (an initializer of
    process pools)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def tune_allocator() -> bool:
    """In a Dask worker's task thread, give glibc's allocator the thresholds it reaches by
    itself in a process's main thread; return whether it did (once per process).

    Preparation handles large short-lived buffers (an utterance's audio, a feature matrix, a
    member's bytes). Dask runs tasks in threads of its workers, and starts the workers with
    ``MALLOC_TRIM_THRESHOLD_=65536``, which switches glibc's adaptive thresholds off: every such
    buffer was mapped, faulted in page by page and handed back at each use. A pack task's own
    CPU time was twice the local pool's (``benchmarks/README.md``); a task in a thread of a
    plain process pool worker showed the same, so it is the worker thread's allocation, not
    the scheduler. Here: buffers up to 32 MiB come from the heap, and up to 128 MiB of freed
    heap is kept for the next buffers (``mallopt``). Only in a Dask worker (a process Dask
    tunes itself), outside its main thread, with glibc, and not when :data:`TUNE_ALLOCATOR`
    is ``0`` in its environment.
    """
    if _tuned or os.environ.get(TUNE_ALLOCATOR) == "0" \
            or threading.current_thread() is threading.main_thread():
        return False
    distributed = sys.modules.get("distributed")
    try:
        distributed.get_worker()  # raises ValueError outside a Dask worker's task
    except (AttributeError, ValueError):
        return False
    _tuned.append(True)
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc (musl, macOS): nothing to tune
        return False
    for option, value in ((_M_MMAP_THRESHOLD, 32 << 20), (_M_TRIM_THRESHOLD, 128 << 20),
                          (_M_TOP_PAD, 16 << 20)):
        libc.mallopt(option, value)
    return True


def in_worker(fn_and_arg: tuple[Callable, Any]) -> Any:
    """``fn(arg)`` after :func:`tune_allocator`: what :func:`run_tasks` sends an executor."""
    fn, arg = fn_and_arg
    tune_allocator()
    return fn(arg)


def _submit_all(executor: concurrent.futures.Executor, fn: Callable, args: Sequence) -> dict:
    """Submit every task; the workers this starts inherit an ignored Ctrl-C (SIGINT), so
    that one arriving while they start up (before their initializer runs) prints no
    traceback either."""
    if threading.current_thread() is not threading.main_thread():
        return {executor.submit(in_worker, (fn, arg)): i for i, arg in enumerate(args)}
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        return {executor.submit(in_worker, (fn, arg)): i for i, arg in enumerate(args)}
    finally:
        signal.signal(signal.SIGINT, previous)


def run_tasks(executor: concurrent.futures.Executor | None, fn: Callable, args: Sequence,
              bar: Any = None) -> Iterator[tuple[int, Any]]:
    """``(index, fn(args[index]))`` as they complete (in order, here, without an executor);
    ``bar.update(1)`` after each; the first error stops everything (the other tasks are
    cancelled) and is raised. On an executor each task first calls :func:`tune_allocator`.

    >>> sorted(run_tasks(None, abs, [-2, 3]))
    [(0, 2), (1, 3)]
    """
    if executor is None:
        for i, arg in enumerate(args):
            result = fn(arg)
            if bar is not None:
                bar.update(1)
            yield i, result
        return
    futures = _submit_all(executor, fn, args)
    try:
        for future in concurrent.futures.as_completed(futures):
            result = future.result()
            if bar is not None:
                bar.update(1)
            yield futures[future], result
    finally:
        for future in futures:
            future.cancel()
