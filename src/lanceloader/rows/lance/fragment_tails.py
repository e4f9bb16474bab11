"""Fragment tails: a sequential read on an object store fetches the last rows of its fragment
for the read after it, so no read asks a data file for a sliver.

A batch that straddles a fragment boundary needs the last few rows of one fragment and the
first rows of the next. The engine cuts sequential store reads at the batch that holds each
fragment's start (``engine/tasks.py``), so the read before the cut ends a few rows short of its
fragment's end and the read after it begins with those rows: a *sliver*. Fetched by the later
read, a sliver costs one request per column group on a file another read is fetching anyway
(on S3 a round trip and the server's per-request cost each: 1M rows in 20 fragments made 139
requests an epoch, Lance's own scan 102), and the later read would also wait for that file's
first read (:mod:`lanceloader.rows.lance.first_reads`) before its own.

So the earlier read extends its range to its fragment's end (the same request, a few rows
longer) and leaves the sliver here; the later read reads its own fragment first, then takes the
sliver (waiting, at most :data:`TAIL_WAIT_S`, for a read that promised it and is still running:
its rows are delivered after that read's anyway), and reads the sliver itself only when nobody
promised it. :func:`tail_split` decides, from positions alone, which reads take part, so the
read that leaves a sliver and the read that takes it agree on its range.

Contract: rows are positions of one pinned version, the same in every epoch, so a sliver left
by any read is the right rows for any later one. Left slivers nobody takes (another process's
read took its own, an epoch that ended) are dropped oldest first past :data:`TAILS_HELD_BYTES`.
Nothing here reads Lance: :class:`FragmentTails` holds and hands over tables, and
:meth:`FragmentTails.read_run` runs one read's part of the hand-over around a ``read``
callable, per process (thread workers share it; each process worker has its own, and there a
sliver is read by whichever read needs it when no read of the same process promised it).

Example::

    >>> import numpy as np
    >>> starts = np.array([0, 1000, 2000])           # two fragments of 1,000 rows
    >>> tail_split(0, 990, starts)                    # ends 10 rows short: fetch them too
    (None, (0, 1000), (990, 1000))
    >>> tail_split(990, 1990, starts)                 # begins with that sliver
    ((990, 1000), (1000, 2000), (1990, 2000))
    >>> tails = FragmentTails()
    >>> tails.promise((990, 1000)); tails.leave((990, 1000), "rows 990-999")
    >>> tails.take((990, 1000))
    'rows 990-999'
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

# A sliver is at most this fraction of its fragment's rows: the rows a straddling batch takes
# from a fragment (fewer than a batch), never a real share of one.
SLIVER_FRACTION = 1 / 8
# How long a read waits for the read that promised its sliver (then reads it itself). That read
# was running when the promise was made and is a store round trip from done.
TAIL_WAIT_S = 10.0
# Slivers left and not (yet) taken, held at most: one read's worth, dropped oldest first.
TAILS_HELD_BYTES = 16 << 20

Span = tuple[int, int]


def tail_split(lo: int, hi: int, starts: np.ndarray) -> tuple[Span | None, Span, Span | None]:
    """``(head, body, tail)`` of a read of positions ``[lo, hi)`` over fragments beginning at
    ``starts`` (ascending positions, then the number of rows): ``head``, the sliver of a
    previous fragment it begins with (to take from the read before it), or None; ``body``, the
    positions to read from Lance (with the tail); ``tail``, the sliver past ``hi`` to the end of
    its last fragment, read along and left for the read after it, or None. A sliver is at most
    :data:`SLIVER_FRACTION` of its fragment; a head only where the read goes on past it.

    >>> tail_split(0, 2000, np.array([0, 1000, 2000]))   # whole fragments: nothing to share
    (None, (0, 2000), None)
    >>> tail_split(500, 990, np.array([0, 1000, 2000]))
    (None, (500, 1000), (990, 1000))
    """
    head, body_lo, body_hi, tail = None, lo, hi, None
    if hi <= lo:
        return head, (lo, hi), tail
    k = int(np.searchsorted(starts, lo, "right")) - 1  # the fragment of the first position
    begin, end = int(starts[k]), int(starts[k + 1])
    if begin < lo and end < hi and end - lo <= (end - begin) * SLIVER_FRACTION:
        head, body_lo = (lo, end), end
    j = int(np.searchsorted(starts, hi - 1, "right")) - 1  # the fragment of the last position
    begin, end = int(starts[j]), int(starts[j + 1])
    if hi < end and end - hi <= (end - begin) * SLIVER_FRACTION:
        tail, body_hi = (hi, end), end
    return head, (body_lo, body_hi), tail


class FragmentTails:
    """Slivers promised, left and taken between the reads of one process (thread-safe).

    ``wait_s``: the longest :meth:`take` waits for a promised sliver.
    """

    def __init__(self, wait_s: float = TAIL_WAIT_S, held_bytes: int = TAILS_HELD_BYTES) -> None:
        self.wait_s = wait_s
        self.held_bytes = held_bytes
        self._lock = threading.Lock()
        # span -> [event set when left, the rows (None: the promising read failed), bytes]
        self._slivers: OrderedDict[Span, list[Any]] = OrderedDict()
        self._bytes = 0

    def promise(self, span: Span) -> None:
        """A read that will :meth:`leave` ``span`` has started (it must leave it, rows or None,
        on every path)."""
        with self._lock:
            if span not in self._slivers:
                self._slivers[span] = [threading.Event(), None, 0]

    def leave(self, span: Span, rows: Any) -> None:
        """The promised ``span``'s rows (None: the read failed; the taker reads them itself)."""
        size = int(getattr(rows, "nbytes", 0)) if rows is not None else 0
        with self._lock:
            entry = self._slivers.get(span)
            if entry is None:
                return
            self._bytes += size - entry[2]
            entry[1], entry[2] = rows, size
            while self._bytes > self.held_bytes:  # drop the oldest slivers left and not taken
                old = next((s for s, e in self._slivers.items() if e[0].is_set()), None)
                if old is None or old == span:
                    break
                self._bytes -= self._slivers.pop(old)[2]
            entry[0].set()

    def read_run(
        self, lo: int, hi: int, starts: np.ndarray, read: Callable[[int, int], pa.Table]
    ) -> pa.Table:
        """The rows of positions ``[lo, hi)`` (``read(a, b)`` reads positions ``[a, b)``), with
        the sliver it begins with taken from the read before (or read here when nobody
        promised it) and the few rows past ``hi`` to its fragment's end read along and left
        for the read after (:func:`tail_split`); a failed read leaves its promise empty, so
        the read after it reads those rows itself."""
        head, (first, last), tail = tail_split(lo, hi, starts)
        if tail is not None:
            self.promise(tail)
        try:
            rows = read(first, last)
        except BaseException:
            if tail is not None:
                self.leave(tail, None)
            raise
        if tail is not None:  # a copy of its few rows, not a view holding the whole read
            self.leave(tail, rows.take(np.arange(hi - first, last - first)))
            rows = rows.slice(0, hi - first)
        if head is not None:
            before = self.take(head)
            if before is None:  # nobody in this process read it along
                before = read(*head)
            rows = pa.concat_tables([before, rows])
        return rows

    def take(self, span: Span) -> Any:
        """The rows of ``span`` if a read left or promised them (waiting for it at most
        ``wait_s``), else None (read them yourself). A taken sliver is gone."""
        with self._lock:
            entry = self._slivers.get(span)
        if entry is None:
            return None
        entry[0].wait(self.wait_s)
        with self._lock:
            if not entry[0].is_set() or self._slivers.get(span) is not entry:
                return None
            del self._slivers[span]
            self._bytes -= entry[2]
            return entry[1]
