"""Prefetch: run tasks on a bounded thread pool and yield their results strictly in task order.

Contract:

* At most ``depth`` tasks are in flight (submitted and not yet handed to the consumer); a slow
  consumer therefore bounds memory at ``depth`` task results.
* Results come out in task order, whatever order the workers finish in.
* A worker's exception is re-raised in the consumer, as the same exception object with its
  original traceback; the pipeline is closed first.
* ``close()`` is idempotent: it cancels tasks not yet started, waits for running ones (at most
  one task each) and joins every thread. It runs on exhaustion, on error, on ``with`` exit, and
  when the iterator is garbage-collected (``break`` out of a ``for`` loop, ``KeyboardInterrupt``).

Example::

    >>> with OrderedPrefetcher(lambda x: x * x, iter(range(5)), num_workers=2, depth=3) as it:
    ...     list(it)
    [0, 1, 4, 9, 16]
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


def check_same_process(pid: int) -> None:
    """An iterator belongs to the process that started it; in a fork child it is an error."""
    if pid != os.getpid():
        raise RuntimeError(
            f"this iterator was started in process {pid} and cannot be used in "
            f"process {os.getpid()} (a fork child); start a new one there with iter(loader)"
        )


class OrderedPrefetcher(Generic[T, R]):
    """Apply ``fn`` to each task of ``tasks`` on ``num_workers`` threads, ``depth`` in flight."""

    def __init__(
        self, fn: Callable[[T], R], tasks: Iterator[T], num_workers: int, depth: int
    ) -> None:
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        if depth < 1:
            raise ValueError(f"prefetch depth must be >= 1, got {depth}")
        self._fn = fn
        self._tasks = tasks
        self._depth = depth
        self._pending: deque[Future[R]] = deque()
        self._pid = os.getpid()
        self._closed = False
        self._pool = ThreadPoolExecutor(num_workers, thread_name_prefix="lanceloader-worker")
        self._fill()

    def _fill(self) -> None:
        while len(self._pending) < self._depth:
            task = next(self._tasks, None)
            if task is None:
                return
            self._pending.append(self._pool.submit(self._fn, task))

    @property
    def in_flight(self) -> int:
        """Tasks submitted and not yet yielded."""
        return len(self._pending)

    def __iter__(self) -> OrderedPrefetcher[T, R]:
        return self

    def __next__(self) -> R:
        check_same_process(self._pid)
        if self._closed or not self._pending:
            self.close()
            raise StopIteration
        head = self._pending.popleft()
        try:
            result = head.result()
        except BaseException:
            self.close()
            raise
        self._fill()
        return result

    def close(self) -> None:
        """Stop: cancel queued tasks, wait for running ones, join all threads. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for fut in self._pending:
            fut.cancel()
        self._pending.clear()
        if self._pid == os.getpid():
            self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> OrderedPrefetcher[T, R]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if hasattr(self, "_pool"):  # fully constructed
            self.close()
