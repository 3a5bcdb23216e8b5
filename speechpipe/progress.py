"""Progress that reads well in a terminal and in a log: :func:`progress_bar`.

On a terminal, a tqdm bar. Elsewhere -- stderr sent to a file, a pipe, a job scheduler's log --
tqdm's carriage returns pile up into one unreadable line of redraws; there a
:class:`LineProgress` writes one plain line every ``interval`` seconds and one when it ends::

    pack: write: 12/40 shards (30%), 61.2 s, 5.1 s/shard
"""

from __future__ import annotations

import sys
import time
from typing import IO, Any, Iterable, Iterator

__all__ = ["LINE_INTERVAL", "LineProgress", "progress_bar"]

#: Seconds between two lines of a :class:`LineProgress` unless told otherwise.
LINE_INTERVAL = 30.0


class LineProgress:
    """A progress counter that writes whole lines: at most one every ``interval`` seconds
    while counting, and a last one on :meth:`close` (if it counted anything or has a total).
    The subset of tqdm's interface that speechpipe uses: ``update``, ``close``, iteration,
    ``with``.

    Args:
        iterable: items to count while iterating (or ``None`` and call :meth:`update`).
        total: the count at the end, when known (then lines show a percentage).
        desc: what is counted, at the start of each line.
        unit: the unit's name (``"shard"``, ``"B"``...).
        initial: the count to start from (a resumed job).
        interval: seconds between lines (0: a line at every update).
        file: where lines go (default: ``sys.stderr`` at each write).

    >>> import io
    >>> out = io.StringIO()
    >>> with LineProgress(total=4, desc="pack: write", unit="shard", interval=3600,
    ...                   file=out) as bar:
    ...     bar.update(3)
    ...     bar.update(1)
    >>> out.getvalue().split(", ")[0]
    'pack: write: 4/4 shard (100%)'
    """

    def __init__(self, iterable: Iterable | None = None, *, total: float | None = None,
                 desc: str = "", unit: str = "it", initial: float = 0,
                 interval: float = LINE_INTERVAL, file: IO[str] | None = None) -> None:
        if not interval >= 0:
            raise ValueError(f"interval must be seconds >= 0, got {interval!r}")
        if total is None and iterable is not None:
            try:
                total = len(iterable)  # type: ignore[arg-type]
            except TypeError:  # no len(), or one that says why not
                total = None
        self.iterable = iterable
        self.total = total
        self.desc = desc
        self.unit = unit.strip() or "it"
        self.n = initial
        self._initial = initial
        self.interval = interval
        self.file = file
        self._start = self._last = time.monotonic()
        self._closed = False

    def __iter__(self) -> Iterator[Any]:
        if self.iterable is None:
            raise TypeError("LineProgress was built without an iterable; call update()")
        try:
            for item in self.iterable:
                yield item
                self.update(1)
        finally:
            self.close()

    def __enter__(self) -> LineProgress:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def update(self, n: float = 1) -> None:
        """Count ``n`` more; write a line if ``interval`` seconds passed since the last."""
        self.n += n
        now = time.monotonic()
        if now - self._last >= self.interval:
            self._last = now
            self._write(now)

    def close(self) -> None:
        """Write the last line (once)."""
        if self._closed:
            return
        self._closed = True
        if self.n != self._initial or self.total:
            self._write(time.monotonic())

    def line(self, now: float | None = None) -> str:
        """The line as it would be written now."""
        elapsed = (time.monotonic() if now is None else now) - self._start
        count = _number(self.n)
        if self.total:
            count += f"/{_number(self.total)} {self.unit} ({100 * self.n / self.total:.0f}%)"
        else:
            count += f" {self.unit}"
        done = self.n - self._initial
        rate = f", {elapsed / done:.2g} s/{self.unit}" if done > 0 else ""
        return f"{self.desc}: {count}, {elapsed:.1f} s{rate}" if self.desc else \
            f"{count}, {elapsed:.1f} s{rate}"

    def _write(self, now: float) -> None:
        out = self.file if self.file is not None else sys.stderr
        out.write(self.line(now) + "\n")
        out.flush()


def _number(n: float) -> str:
    return f"{n:g}" if isinstance(n, float) else str(n)


def _on_a_terminal(file: IO[str] | None) -> bool:
    stream = file if file is not None else sys.stderr
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False


def progress_bar(iterable: Iterable | None = None, *, total: float | None = None,
                 desc: str = "", unit: str = "it", disable: bool = False, initial: float = 0,
                 interval: float = LINE_INTERVAL, file: IO[str] | None = None,
                 **tqdm_options: Any) -> Any:
    """A tqdm bar when stderr (or ``file``) is a terminal, else a :class:`LineProgress`
    writing a line every ``interval`` seconds; ``disable`` shows nothing.

    Both count with ``update(n)``, iterate ``iterable`` and close with ``with``.
    ``tqdm_options`` (``unit_scale``, ``leave``...) reach tqdm only.

    >>> import io
    >>> out = io.StringIO()  # not a terminal
    >>> for _ in progress_bar(range(3), desc="measure", unit="chunk", file=out):
    ...     pass
    >>> out.getvalue().split(", ")[0]
    'measure: 3/3 chunk (100%)'
    """
    if disable:
        return LineProgress(iterable, total=total, desc=desc, unit=unit, initial=initial,
                            interval=float("inf"), file=_Discard())
    if _on_a_terminal(file):
        from tqdm import tqdm

        return tqdm(iterable, total=total, desc=desc, unit=unit, initial=initial, file=file,
                    **tqdm_options)
    return LineProgress(iterable, total=total, desc=desc, unit=unit, initial=initial,
                        interval=interval, file=file)


class _Discard:
    """A text stream that drops what it is given (a disabled bar)."""

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass
