"""Thread stages: background threads for I/O and decoding.

Two verbs, after MDNC's ``MTSequence`` (a thread pool fed by queues):

- ``prefetch_in_thread`` (:class:`ThreadPrefetcherIterDataPipe`): one background thread
  iterates the source into a **bounded** queue of ``buffer_size`` items, so that reading
  (a shard from a disk or a network) overlaps with the work downstream;
- ``map_in_threads`` (:class:`ThreadMapperIterDataPipe`): MTSequence's workers -- items go
  into an input queue, ``num_threads`` threads apply a function, results come back through an
  output queue, **in input order** by default. For work that releases the GIL: soundfile
  decoding, numpy, torch ops (fbank). At most ``buffer_size`` items are in flight.

The conversion to torch tensors and the move to a device (``move_to_device``) are in
:mod:`speechpipe.pipes.concurrency._device`.

**Start and finish.** A pass starts threads when iteration starts and joins them when it
ends: at the end of the data, when the loop breaks (the iterator is closed or dropped), or
when anything raises -- the queues are drained so that no thread stays blocked, every thread
is joined, and the source's iterator is closed (so its files close). For an explicit scope,
as MTSequence's ``start()``/``finish()``: ``with start(pipe) as items: for x in items: ...``
(or ``pipe.start()`` on the pipes of this module); ``finish()`` does what leaving the block
does.

**Test mode.** ``start(pipe, test=True)`` (``pipe.start_test()``) runs every thread stage of
the pipeline in the consuming thread, one item at a time: the same items in the same order
(``map_in_threads`` is ordered by default), no threads -- for debugging and for tests.
``num_threads=0`` does the same permanently.

**Errors.** An exception raised in a thread reaches the consumer at the position of the item
that caused it: a :class:`~speechpipe.errors.DataError` (which names its file and key) is
re-raised as is; any other exception from ``map_in_threads``' function is wrapped in a
``DataError`` naming the sample's source and key (the original is its ``__cause__``), or
skipped and counted under ``on_error="skip"``. Errors of the source read by
``prefetch_in_thread`` are re-raised unchanged.

**Exact resume** (:class:`speechpipe.loader.PipeDataset`): both thread stages record the
samples they hold (pulled from the source, not yet yielded) by identity, and are given them
back, in order, before the rest of the source; ``prefetch_in_thread`` pauses its thread while
a state is taken. Items without a ``key`` cannot be resumed (``state_dict`` raises).
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import queue
import threading
import time
from typing import Any, Callable, Iterable, Iterator, Mapping

from ...diagnostics import BufferStats, Diagnostics, check_on_error
from ...errors import check_int, DataError
from ...sample import KEY, SOURCE
from .._core import functional_datapipe, IterDataPipe
from .._core import graph_nodes
from .._core import held_sample, identity, Resumable

__all__ = [
    "Running",
    "ThreadMapper",
    "ThreadMapperIterDataPipe",
    "ThreadPrefetcher",
    "ThreadPrefetcherIterDataPipe",
    "map_items_in_threads",
    "prefetch_items",
    "start",
]

_END = object()
_RUN_WAIT = 50e-6  # seconds a run may grow while the consumer waits (prefetch_items)


class _Failure:
    """An exception travelling from a thread to the consumer."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


def _drain(q: queue.SimpleQueue, _empty: type = queue.Empty) -> None:
    """Drop what ``q`` holds. (``queue.Empty`` is bound here: a pass left unfinished is
    closed at interpreter exit, when module globals may already be gone.)"""
    while True:
        try:
            q.get_nowait()
        except _empty:
            return


def _close(it: Any) -> None:
    """Close ``it`` if it can be closed (a generator, a file): its ``finally`` blocks run."""
    close = getattr(it, "close", None)
    if callable(close):
        close()


def _popping(items: list) -> Iterator:
    """``items`` from the last to the first, each removed from the list as it is yielded."""
    while items:
        yield items.pop()


# --------------------------------------------------------------------------------------------
# Algorithms
# --------------------------------------------------------------------------------------------


def prefetch_items(
    source: Iterable[Any],
    buffer_size: int,
    *,
    threaded: bool = True,
    held: collections.deque | None = None,
    lock: threading.Lock | None = None,
    meter: BufferStats | None = None,
) -> Iterator[Any]:
    """Iterate ``source`` in a background thread, ``buffer_size`` items ahead at most.

    The thread hands items over in runs (up to ``buffer_size // 4``, sooner when the consumer
    waits) and the consumer takes all that is ready at once, so that locking and waking a
    thread are paid per run rather than per item; never more than ``buffer_size`` items are
    read and not yet yielded. When the consumer stops (end, ``break``, an exception,
    ``close()``), the thread is told to stop and joined, and ``source``'s iterator is closed.
    An exception raised by ``source`` is re-raised in the consumer after the items before it.
    (A thread blocked inside the source -- a slow network read -- is joined when that read
    returns.)

    Args:
        source: the items.
        buffer_size: items read ahead at most, ``>= 1``.
        threaded: False iterates ``source`` in the calling thread (test mode).
        held: if given, a deque that holds the items read and not yet yielded (for resuming).
        lock: held by the thread while it reads one item (a state can be taken under it).
        meter: told of each item read (entering) and yielded (leaving), under a lock of its own.

    >>> list(prefetch_items(range(5), 2))
    [0, 1, 2, 3, 4]
    """
    check_int("buffer_size", buffer_size, 1)
    lock = lock or threading.Lock()
    it = iter(source)
    if threaded:
        yield from _prefetch_threaded(it, buffer_size, held, lock, meter)
        return
    # test mode, in this generator (one delegation less per item): one item at a time, each
    # read under ``lock`` and held in ``held`` until it is yielded
    try:
        while True:
            with lock:
                item = next(it, _END)
                if item is _END:
                    return
                if held is not None:
                    held.append(item)
            if held is not None:
                held.popleft()
            if meter is not None:  # read and yielded at once: held for no time
                meter.add(item)
                meter.remove(item)
            yield item
    finally:
        _close(it)


class _Handoff:
    """The producer -> consumer channel of :func:`prefetch_items`: items move in runs, not
    one by one, so that the locks and thread wake-ups are paid once per run.

    ``ready`` holds items the producer handed over; ``taken`` counts the items the consumer
    took at its last visit (read and perhaps not yet yielded). The producer waits while
    ``len(ready) + taken + its own run`` would exceed ``size`` (the ``buffer_size``), so that
    no more than ``size`` items are ever read ahead of the consumer.
    """

    __slots__ = ("cond", "ready", "taken", "waiting", "stop", "size")

    def __init__(self, size: int) -> None:
        self.cond = threading.Condition(threading.Lock())
        self.ready: collections.deque = collections.deque()
        self.taken = 0
        self.waiting = False  # the consumer waits for items (read without the lock)
        self.stop = False
        self.size = size

    def hand_over(self, run: list) -> bool:
        """Producer: add ``run`` to ``ready`` and wake the consumer; False if it has left."""
        with self.cond:
            if self.stop:
                return False
            self.ready.extend(run)
            self.cond.notify_all()
        return True

    def wait_for_room(self, run: list) -> bool:
        """Producer: wait until one more item than ``run`` fits ahead of the consumer; False
        if the consumer has left."""
        with self.cond:
            while not self.stop and len(self.ready) + self.taken + len(run) >= self.size:
                self.cond.wait()
            return not self.stop

    def take(self) -> collections.deque:
        """Consumer: wait for items handed over, then take them all (they count as ``taken``
        until the next visit)."""
        with self.cond:
            self.taken = 0
            while not self.ready:
                self.waiting = True
                self.cond.notify_all()
                self.cond.wait()
            self.waiting = False
            batch = self.ready
            self.taken = len(batch)  # before emptying ready: the count never falls short
            self.ready = collections.deque()
            self.cond.notify_all()
        return batch

    def close(self) -> None:
        """Consumer: it has left; the producer stops at its next hand-over or wait."""
        with self.cond:
            self.stop = True
            self.cond.notify_all()


def _produce(it: Iterator, chan: _Handoff, held: collections.deque | None,
             lock: threading.Lock, meter: tuple | None) -> None:
    """The thread of :func:`prefetch_items`: reads ``it`` (each item under ``lock``, held in
    ``held``) into runs handed over through ``chan``; the last run ends with ``_END`` or the
    source's exception as a :class:`_Failure`; ``meter``: ``(BufferStats, its lock)``."""
    buffer_size = chan.size
    run_max = max(1, buffer_size // 4)
    run: list = []
    started = 0.0  # when the reading of the run's first item began
    try:
        while True:
            room = buffer_size - len(chan.ready) - chan.taken - len(run)  # see _Handoff
            # a waiting consumer gets the run once _RUN_WAIT has passed since its first
            # item was asked for: at once after a slow item (I/O), after a few fast ones
            # (then a run of several is worth the wait); the clock is read only while the
            # consumer waits
            if run and (room <= 0 or len(run) >= run_max or (
                    chan.waiting and time.perf_counter() - started >= _RUN_WAIT)):
                if not chan.hand_over(run):
                    return
                run = []
                room = buffer_size - len(chan.ready) - chan.taken
            if room <= 0 and not chan.wait_for_room(run):
                return
            if not run:
                started = time.perf_counter()
            with lock:
                item = next(it, _END)
                if item is not _END and held is not None:
                    held.append(item)
            if item is _END:
                break
            if meter is not None:
                with meter[1]:
                    meter[0].add(item)
            run.append(item)
    except Exception as exc:  # handed to the consumer, raised there
        run.append(_Failure(exc))
    else:
        run.append(_END)
    chan.hand_over(run)


def _prefetch_threaded(it: Iterator, buffer_size: int, held: collections.deque | None,
                       lock: threading.Lock, meter: BufferStats | None) -> Iterator[Any]:
    """:func:`prefetch_items` with its thread (:func:`_produce`): yields the runs it takes,
    re-raises the source's exception; stops and joins the thread and closes ``it`` at the
    end, a ``break`` or an exception."""
    chan = _Handoff(buffer_size)
    metered = None if meter is None else (meter, threading.Lock())
    thread = threading.Thread(target=_produce, args=(it, chan, held, lock, metered),
                              name="speechpipe-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            run = chan.take()
            while run:  # each item leaves the run as it is yielded: none is kept after
                item = run.popleft()
                if item is _END:
                    return
                if isinstance(item, _Failure):
                    raise item.error
                if held is not None:
                    held.popleft()
                if metered is not None:
                    with metered[1]:
                        meter.remove(item)
                yield item
                del item
    finally:
        chan.close()
        thread.join()
        _close(it)


def _where(item: Any, seq: int) -> dict:
    if isinstance(item, Mapping) and isinstance(item.get(KEY), str):
        return {"source": item.get(SOURCE), "key": item[KEY]}
    return {"source": f"item #{seq}"}


def _failed(fn: Callable, item: Any, seq: int, exc: Exception) -> DataError:
    if isinstance(exc, DataError):
        return exc
    name = getattr(fn, "__name__", type(fn).__name__)
    error = DataError(f"map_in_threads: {name} raised {type(exc).__name__}: {exc}",
                      **_where(item, seq))
    error.__cause__ = exc
    return error


def map_items_in_threads(
    source: Iterable[Any],
    fn: Callable[[Any], Any],
    *,
    num_threads: int = 4,
    buffer_size: int | None = None,
    ordered: bool = True,
    on_error: str = "raise",
    diagnostics: Diagnostics | None = None,
    in_flight: collections.deque | None = None,
) -> Iterator[Any]:
    """``fn(item)`` for each item of ``source``, computed by ``num_threads`` threads.

    MTSequence's scheme: the consumer reads the source (in its own thread) and puts
    ``(position, item)`` into an input queue; worker threads apply ``fn`` and put the result
    into an output queue; the consumer yields results in input order (``ordered``) or as they
    come. At most ``buffer_size`` items are in flight (read and not yet yielded), which bounds
    both queues. Items travel in tasks of ``buffer_size // (2 * num_threads)`` (1 to 64), so
    that a large ``buffer_size`` also pays the queues and thread wake-ups once per task rather
    than per item (the default ``2 * num_threads`` sends items one by one, for slow ``fn``).
    With ``num_threads=0`` everything runs in the calling thread, in order.

    An exception from ``fn`` is raised when its item's turn comes (after the items before
    it): a ``DataError`` as is, anything else wrapped in a ``DataError`` naming the item's
    ``source`` and ``key``; under ``on_error="skip"`` the item is dropped and counted in
    ``diagnostics``. Threads are joined and the source's iterator closed when the consumer
    stops.

    Args:
        source: the items.
        fn: the function, called from worker threads (it must be thread-safe).
        num_threads: worker threads (``0``: no threads, test mode).
        buffer_size: items in flight at most (default ``2 * num_threads``, at least 1).
        ordered: yield in input order (True) or in completion order.
        on_error: ``"raise"`` or ``"skip"``.
        diagnostics: where skipped items are counted.
        in_flight: if given, a deque of the items read and not yet yielded (for resuming).

    >>> list(map_items_in_threads(range(6), lambda x: x * x, num_threads=3))
    [0, 1, 4, 9, 16, 25]
    """
    check_int("num_threads", num_threads, 0)
    if buffer_size is None:
        buffer_size = max(1, 2 * num_threads)
    check_int("buffer_size", buffer_size, 1)
    check_on_error(on_error)
    diagnostics = diagnostics or Diagnostics("map_in_threads")
    flight = in_flight if in_flight is not None else collections.deque()
    it = iter(source)
    if num_threads == 0:
        yield from _map_inline(it, fn, flight, on_error, diagnostics)
        return
    inputs: queue.SimpleQueue = queue.SimpleQueue()  # unbounded: flight bounds both
    outputs: queue.SimpleQueue = queue.SimpleQueue()
    workers = _start_workers(num_threads, fn, inputs, outputs)
    try:
        for first, results, offset in _finished_tasks(
                it, flight, inputs, outputs, buffer_size,
                chunk=max(1, min(buffer_size // (2 * num_threads), 64)), ordered=ordered):
            if offset == 0:  # the oldest task (always, in order): its items lead the flight
                for position, (ok, value) in enumerate(results, start=first):
                    item = flight.popleft()
                    if ok:
                        yield value
                    else:
                        _settle_failure(fn, item, position, value, on_error, diagnostics)
                continue
            for position, (ok, value) in enumerate(results, start=first):
                item = flight[offset]
                del flight[offset]
                if ok:
                    yield value
                else:
                    _settle_failure(fn, item, position, value, on_error, diagnostics)
    finally:
        _stop_workers(inputs, workers)
        _close(it)


def _settle_failure(fn: Callable, item: Any, seq: int, exc: Exception, on_error: str,
                    diagnostics: Diagnostics) -> None:
    """``fn`` raised ``exc`` on ``item``, the ``seq``-th: raise it as a ``DataError`` naming
    the item (``on_error="raise"``) or count the item as skipped."""
    diagnostics.handle(on_error, _failed(fn, item, seq, exc), "function raised")


def _map_inline(it: Iterator, fn: Callable[[Any], Any], flight: collections.deque,
                on_error: str, diagnostics: Diagnostics) -> Iterator[Any]:
    """:func:`map_items_in_threads` without threads (``num_threads=0``, test mode): ``fn`` in
    the calling thread, in order, each item in ``flight`` while ``fn`` runs."""
    try:
        for seq, item in enumerate(it):
            flight.append(item)
            try:
                ok, value = True, fn(item)
            except Exception as exc:
                ok, value = False, exc
            flight.popleft()
            if ok:
                yield value
            else:
                _settle_failure(fn, item, seq, value, on_error, diagnostics)
    finally:
        _close(it)


def _finished_tasks(it: Iterator, flight: collections.deque, inputs: queue.SimpleQueue,
                    outputs: queue.SimpleQueue, buffer_size: int, *, chunk: int,
                    ordered: bool) -> Iterator[tuple[int, list, int]]:
    """The scheduling of :func:`map_items_in_threads`, run by the consumer between two tasks.

    Reads ``it`` into tasks of up to ``chunk`` items, ``(first position, items)`` on
    ``inputs``, while fewer than ``buffer_size`` items are in ``flight`` (read, not yet
    yielded: the consumer removes them); then yields the next finished task, taken from the
    workers' ``outputs``, as ``(first position, results, offset)``: the oldest task if
    ``ordered``, else the first one finished, ``offset`` counting the items of older tasks
    still in flight before its own. Ends when the source has ended and every task is yielded.
    """
    tasks: collections.deque = collections.deque()  # (first position, size), oldest first
    done: dict[int, list] = {}  # first position -> results, of tasks the workers finished
    next_seq = 0
    exhausted = False
    while True:
        while not exhausted and len(flight) < buffer_size:
            items = []
            while len(items) < chunk and len(flight) < buffer_size:
                item = next(it, _END)
                if item is _END:
                    exhausted = True
                    break
                flight.append(item)
                items.append(item)
            if items:
                inputs.put((next_seq, items))
                tasks.append((next_seq, len(items)))
                next_seq += len(items)
        if not tasks:
            return
        if ordered:
            index = 0
            while tasks[0][0] not in done:
                first, results = outputs.get()
                done[first] = results
        else:
            while not done:
                first, results = outputs.get()
                done[first] = results
            ready = next(iter(done))
            index = next(i for i, (f, _) in enumerate(tasks) if f == ready)
        first = tasks[index][0]
        del tasks[index]
        yield first, done.pop(first), sum(n for _, n in itertools.islice(tasks, index))


def _work(fn: Callable[[Any], Any], inputs: queue.SimpleQueue,
          outputs: queue.SimpleQueue) -> None:
    """A worker thread of :func:`map_items_in_threads`: for each task ``(first, items)`` of
    ``inputs``, puts ``(first, [(ok, fn(item) or its exception), ...])`` on ``outputs``; stops
    at a ``None`` task."""
    while True:
        task = inputs.get()
        if task is None:
            return
        first, items = task
        results = []
        for item in items:
            try:
                results.append((True, fn(item)))
            except Exception as exc:
                results.append((False, exc))
        outputs.put((first, results))


def _start_workers(num_threads: int, fn: Callable[[Any], Any], inputs: queue.SimpleQueue,
                   outputs: queue.SimpleQueue) -> list[threading.Thread]:
    """Start ``num_threads`` workers (:func:`_work`) on the two queues."""
    threads = [threading.Thread(target=_work, args=(fn, inputs, outputs),
                                name=f"speechpipe-map-{i}", daemon=True)
               for i in range(num_threads)]
    for thread in threads:
        thread.start()
    return threads


def _stop_workers(inputs: queue.SimpleQueue, threads: list[threading.Thread]) -> None:
    """Drop the tasks not yet taken, tell every worker to stop, join them."""
    _drain(inputs)
    for _ in threads:
        inputs.put(None)
    for thread in threads:
        thread.join()


# --------------------------------------------------------------------------------------------
# Starting and finishing a pass
# --------------------------------------------------------------------------------------------


class Running:
    """One started pass of a pipeline: an iterator that ``finish()`` ends (MTSequence's
    ``start()``/``finish()``); a context manager that finishes on leaving.

    Made by :func:`start` (or ``pipe.start()`` / ``pipe.start_test()``). ``finish()`` closes
    the pass: threads of every thread stage are joined and the sources' files closed, also
    after a ``break`` or an exception; it can be called more than once.
    """

    def __init__(self, pipe: Any, *, test: bool = False) -> None:
        self._stages = [n for n in graph_nodes(pipe) if isinstance(n, _Threaded)]
        for stage in self._stages:
            stage._test_mode = bool(test)
        self.test = bool(test)
        try:
            self._it = iter(pipe)
        except BaseException:
            self._reset()
            raise

    def _reset(self) -> None:
        for stage in self._stages:
            stage._test_mode = False

    def __iter__(self) -> Running:
        return self

    def __next__(self) -> Any:
        if self._it is None:
            raise StopIteration
        return next(self._it)

    def finish(self) -> None:
        """End the pass: join its threads, close its sources (idempotent)."""
        it, self._it = self._it, None
        try:
            if it is not None:
                _close(it)
        finally:
            self._reset()

    def __enter__(self) -> Running:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.finish()


def start(pipe: Any, *, test: bool = False) -> Running:
    """Start a pass of ``pipe``: ``with start(pipe) as items: for x in items: ...``.

    With ``test=True`` every thread stage of the pipeline (``prefetch_in_thread``,
    ``map_in_threads``) runs in the calling thread for this pass: the same items, in the
    same order, without threads (MTSequence's ``start_test``).

    >>> from speechpipe import IterableWrapper
    >>> pipe = IterableWrapper(range(4)).map_in_threads(lambda x: x + 1, num_threads=2)
    >>> with start(pipe) as items:
    ...     next(items), next(items)
    (1, 2)
    >>> with start(pipe, test=True) as items:
    ...     list(items)
    [1, 2, 3, 4]
    """
    return Running(pipe, test=test)


class _Threaded(Resumable):
    """Start/finish, test mode and resumable state shared by the thread stages."""

    _test_mode: bool = False

    def start(self) -> Running:
        """Start a pass with threads (see :func:`start`)."""
        return Running(self)

    def start_test(self) -> Running:
        """Start a pass in the calling thread, same order (see :func:`start`)."""
        return Running(self, test=True)

    def _needs(self, state: dict) -> list:
        return [tuple(ident) for ident in state.get("held", [])]

    def _restored(self, state: dict | None, samples: dict) -> list:
        """The held samples of a resumed pass, in the order they were read."""
        return [] if state is None else [held_sample(samples, i) for i in self._needs(state)]

    def _resumed_source(self) -> Iterator:
        """The source of a pass: a resumed pass's held samples first, each let go once handed
        over (neither the list nor the resume dict stays alive for the pass), then the
        source's own items."""
        state, samples = self._take_resume()
        head = self._restored(state, samples)
        del samples
        head.reverse()
        return itertools.chain(_popping(head), iter(self.source_datapipe))


# --------------------------------------------------------------------------------------------
# The pipes
# --------------------------------------------------------------------------------------------


@functional_datapipe("prefetch_in_thread")
class ThreadPrefetcherIterDataPipe(_Threaded, IterDataPipe):
    """Read the source ahead in a background thread (functional name: ``prefetch_in_thread``).

    Consumes any items and yields the same items in the same order; one thread iterates the
    source and keeps up to ``buffer_size`` items in a bounded queue, so that the source's I/O
    (reading shards, waiting for a network) overlaps with the stages after it. The thread
    starts with the pass and is joined when it ends, breaks or raises (see :func:`start`);
    errors of the source are re-raised, unchanged, after the items before them.

    Use it where a stage waits on I/O: after ``sharded_shuffle``/``read_shards`` on a network
    file system, or in the main process after a DataLoader (batches). Inside DataLoader
    workers, processes already overlap; ``map_in_threads`` is the stage for CPU work.

    Args:
        source_datapipe: any items.
        buffer_size: items read ahead at most (memory: that many items; ``self.buffers``, a
            :class:`~speechpipe.diagnostics.BufferStats`, counts them and their array bytes).
        threads: ``False`` reads in the consuming thread (test mode, as :meth:`start_test`).

    >>> from speechpipe import IterableWrapper
    >>> list(IterableWrapper(range(5)).prefetch_in_thread(buffer_size=2))
    [0, 1, 2, 3, 4]
    """

    #: The batches do not depend on how far ahead it reads (a loader state's fingerprint).
    decides_batches = ()

    def __init__(self, source_datapipe: Iterable, buffer_size: int = 16, *,
                 threads: bool = True) -> None:
        self.source_datapipe = source_datapipe
        self.buffer_size = check_int("buffer_size", buffer_size, 1)
        if not isinstance(threads, bool):
            raise TypeError(f"threads must be a bool, got {threads!r}")
        self.threads = threads
        self.buffers = BufferStats("prefetch_in_thread")

    def __iter__(self) -> Iterator:
        if self.passthrough:  # a replay pass for a stage below (speechpipe.loader)
            yield from self.source_datapipe
            return
        source = self._resumed_source()
        held: collections.deque = collections.deque()
        lock = threading.Lock()
        self._live = (held, lock)
        self.buffers.reset()
        try:
            yield from prefetch_items(
                source, self.buffer_size,
                threaded=self.threads and not self._test_mode, held=held, lock=lock,
                meter=self.buffers)
        finally:
            self._live = None

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Hold the reading thread between two items (a state of the stages above is then
        consistent with the items held here)."""
        live = self._live
        if live is None:
            yield
            return
        with live[1]:
            yield

    def _snapshot(self, live: tuple) -> dict:
        return {"held": [list(identity(item)) for item in list(live[0])]}

    def __len__(self) -> int:
        return len(self.source_datapipe)


ThreadPrefetcher = ThreadPrefetcherIterDataPipe


@functional_datapipe("map_in_threads")
class ThreadMapperIterDataPipe(_Threaded, IterDataPipe):
    """Apply a function in a pool of threads (functional name: ``map_in_threads``).

    Consumes items and yields ``fn(item)`` for each, computed by ``num_threads`` threads fed
    through queues (MTSequence's workers, see :func:`map_items_in_threads`); in input order
    unless ``ordered=False``. Threads help where ``fn`` releases the GIL -- soundfile and
    numpy decoding, torch ops such as ``compute_features``' fbank -- and do not for pure
    Python work. The threads start with the pass and are joined when it ends, breaks or
    raises (see :func:`start`). Use torch's ``map`` when one thread is enough.

    Args:
        source_datapipe: items (sample dicts name themselves in errors).
        fn: the function (thread-safe; a module-level function to pickle the pipe for
            DataLoader workers).
        num_threads: worker threads; ``0`` runs ``fn`` in the consuming thread (test mode).
        buffer_size: items in flight at most (default ``2 * num_threads``).
        ordered: keep input order (default) or yield in completion order.
        on_error: ``"raise"``: an exception from ``fn`` reaches the consumer at its item's
            turn, a ``DataError`` as is, others wrapped in a ``DataError`` naming the sample's
            source and key; ``"skip"``: the item is dropped and counted in
            :attr:`diagnostics`, with a warning at the end of the pass.

    >>> from speechpipe import IterableWrapper
    >>> list(IterableWrapper(range(6)).map_in_threads(lambda x: 10 * x, num_threads=3))
    [0, 10, 20, 30, 40, 50]
    """

    #: The function and the order decide the batches, not the number of threads.
    decides_batches = ("fn", "ordered", "on_error")

    def __init__(
        self,
        source_datapipe: Iterable,
        fn: Callable[[Any], Any],
        *,
        num_threads: int = 4,
        buffer_size: int | None = None,
        ordered: bool = True,
        on_error: str = "raise",
    ) -> None:
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {fn!r}")
        self.source_datapipe = source_datapipe
        self.fn = fn
        self.num_threads = check_int("num_threads", num_threads, 0)
        if buffer_size is not None:
            check_int("buffer_size", buffer_size, 1)
        self.buffer_size = buffer_size
        if not isinstance(ordered, bool):
            raise TypeError(f"ordered must be a bool, got {ordered!r}")
        self.ordered = ordered
        self.on_error = check_on_error(on_error)
        self.diagnostics = Diagnostics("map_in_threads")

    def __iter__(self) -> Iterator:
        if self.passthrough:  # a replay pass for a stage below: a plain map
            for item in self.source_datapipe:
                yield self.fn(item)
            return
        source = self._resumed_source()
        self.diagnostics.reset()
        flight: collections.deque = collections.deque()
        self._live = flight
        try:
            yield from map_items_in_threads(
                source, self.fn,
                num_threads=0 if self._test_mode else self.num_threads,
                buffer_size=self.buffer_size or max(1, 2 * self.num_threads),
                ordered=self.ordered, on_error=self.on_error, diagnostics=self.diagnostics,
                in_flight=flight,
            )
        finally:
            self._live = None
        self.diagnostics.warn_if_skipped()

    def _snapshot(self, flight: collections.deque) -> dict:
        return {"held": [list(identity(item)) for item in list(flight)]}

    def __len__(self) -> int:
        if self.on_error == "skip":
            raise TypeError("map_in_threads has no len() under on_error='skip': skipped items "
                            "are known only after the pass")
        return len(self.source_datapipe)


ThreadMapper = ThreadMapperIterDataPipe
