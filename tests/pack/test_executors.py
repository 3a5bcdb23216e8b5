"""speechpipe.executors: any executor, a Dask cluster, and the allocator of Dask's workers.

Invariant: preparation's tasks in a Dask worker's thread take their large buffers from the heap,
as in a process's main thread (Dask starts its workers with ``MALLOC_TRIM_THRESHOLD_=65536``,
which made every buffer over 128 KiB a fresh mapping: twice the CPU time per pack task).
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import os

import pytest

from speechpipe.executors import as_executor, in_worker, run_tasks, tune_allocator


def mapped_blocks_while_holding_a_megabyte(_=None) -> int:
    """How many blocks glibc maps for one 1 MiB buffer (0: it came from the heap)."""

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
            "uordblks", "fordblks", "keepcost")]

    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2
    before = libc.mallinfo2().hblks
    buffer = ctypes.create_string_buffer(1 << 20)
    during = libc.mallinfo2().hblks
    del buffer
    return during - before


def test_run_tasks_on_any_executor_and_the_refusal_of_others():
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        assert sorted(run_tasks(pool, abs, [-1, -2, 3])) == [(0, 1), (1, 2), (2, 3)]
        assert in_worker((abs, -4)) == 4
    with pytest.raises(TypeError, match="executor must be a concurrent.futures.Executor"):
        as_executor("local")
    assert tune_allocator() is False  # the main thread of a process that is no Dask worker


@pytest.mark.slow
def test_a_dask_workers_task_takes_large_buffers_from_the_heap_once_tuned():
    distributed = pytest.importorskip("distributed")
    try:
        ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):
        pytest.skip("glibc >= 2.33 only")
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                                  host="127.0.0.1", dashboard_address="127.0.0.1:0") as cluster:
        with distributed.Client(cluster) as client:
            assert client.run(lambda: os.environ.get("MALLOC_TRIM_THRESHOLD_")) == {
                w: "65536" for w in client.scheduler_info()["workers"]}  # Dask's default
            plain = client.submit(mapped_blocks_while_holding_a_megabyte, pure=False)
            assert plain.result() == 1  # mapped: the cost
            executor = client.get_executor()
            assert [r for _, r in run_tasks(executor, mapped_blocks_while_holding_a_megabyte,
                                            [None, None])] == [0, 0]
            assert client.submit(tune_allocator, pure=False).result() is False  # once
