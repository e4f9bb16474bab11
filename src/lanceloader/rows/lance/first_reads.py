"""First reads: one read at a time opens each fragment's data file in a process.

Lance reads a data file's footer and column metadata (three requests on S3: 64 KiB, ~26 KiB,
~200 B) the first time a dataset object reads from that file, then keeps them in the dataset's
metadata cache. Reads that start together on a file nobody has read yet all miss that cache and
all fetch the metadata: a sequential epoch's 8 reads in flight over 4 fragments on S3 made 18
such duplicate requests, on top of Lance's own scan's 20 in all.

:class:`FirstReads` lets the first read of a fragment go alone: a read that touches a fragment
another read is opening waits until that read ends (then the metadata is cached), and reads only
warm or unclaimed fragments go at once. Waiters claim nothing, so no two reads wait on each other.
Every wait has a bound (:data:`FIRST_READ_WAIT_S`): past it, the read goes ahead anyway and only
fetches the metadata again. A read that fails leaves its fragments cold, so the next read opens
them. Nothing is read here: it only orders the reads of one process (thread workers share one
dataset object; each process worker has its own, and its own :class:`FirstReads`).

Example::

    >>> first = FirstReads()
    >>> with first.reading([0, 1]):   # the first read of fragments 0 and 1: goes alone on them
    ...     pass
    >>> first.opened([5])             # read another way (its metadata is cached too)
    >>> sorted(first.warm)
    [0, 1, 5]
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

# A read waits at most this long for another read to open a fragment it needs, then goes ahead
# (and fetches the fragment's metadata again). Reads that open a file take one to three round
# trips to the store: milliseconds to a second.
FIRST_READ_WAIT_S = 10.0


class FirstReads:
    """Which fragments this process has read (their metadata cached) and which are being opened.

    ``wait_s``: the longest a read waits for others to open its fragments (then it goes ahead).
    """

    def __init__(self, wait_s: float = FIRST_READ_WAIT_S) -> None:
        if not wait_s >= 0:
            raise ValueError(f"wait_s must be >= 0 seconds, got {wait_s!r}")
        self.wait_s = wait_s
        self._lock = threading.Lock()
        self._warm: set[int] = set()
        self._opening: dict[int, threading.Event] = {}

    @property
    def warm(self) -> frozenset[int]:
        """The fragments a read has finished in this process."""
        with self._lock:
            return frozenset(self._warm)

    def opened(self, fragments: Iterable[int]) -> None:
        """Record ``fragments`` as read by this process's dataset outside :meth:`reading`."""
        with self._lock:
            self._warm |= set(fragments)

    @contextmanager
    def reading(self, fragments: Iterable[int]) -> Iterator[None]:
        """Around one read of ``fragments``: wait (at most ``wait_s``) while another read opens
        any of them, then claim those still cold; on success they are warm, on an error cold."""
        wanted = set(fragments)
        deadline = time.monotonic() + self.wait_s
        while True:
            with self._lock:
                cold = wanted - self._warm
                busy = [self._opening[f] for f in cold if f in self._opening]
                if not busy:
                    claimed, done = cold, threading.Event()
                    for f in claimed:
                        self._opening[f] = done
                    break
            left = deadline - time.monotonic()
            if left <= 0:  # waited long enough: read without claiming (only more requests)
                claimed, done = set(), threading.Event()
                break
            busy[0].wait(left)
        ok = False
        try:
            yield
            ok = True
        finally:
            with self._lock:
                for f in claimed:
                    del self._opening[f]
                if ok:
                    self._warm |= claimed
            done.set()
