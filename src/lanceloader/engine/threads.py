"""Prefetch: run tasks on a bounded pool of threads and yield their results strictly in task order.

Contract:

* At most ``depth`` tasks are in flight (submitted and not yet handed to the consumer); a slow
  consumer therefore bounds memory at ``depth`` task results.
* Results come out in task order, whatever order the workers finish in.
* A worker's exception is re-raised in the consumer, as the same exception object with its
  original traceback; the pipeline is closed first.
* The consumer's wait for a result wakes for signals (Ctrl-C arrives at once) and lasts at most
  ``stall_timeout`` seconds: then :class:`Stalled` is raised with the stuck worker's stack.
* ``close()`` returns at once, whatever the workers are doing: queued tasks are cancelled, idle
  threads exit, and a thread busy with a task (a Lance read, a slow transform) finishes it
  *detached*: its result is dropped, and the thread exits after it. Threads are daemons, so a
  task that never returns cannot block the interpreter's exit. ``close()`` runs on exhaustion, on
  error, on ``with`` exit, and when the iterator is garbage-collected (``break``, Ctrl-C).
* At interpreter exit every live pool is closed and its busy threads are waited for, at most
  :data:`EXIT_WAIT_S` in all: a daemon thread still inside Lance's native code when the
  interpreter finalizes is stopped by a forced unwind, which aborts the whole process ("FATAL:
  exception not rethrown", exit code 134) instead of exiting cleanly.

Example::

    >>> with OrderedPrefetcher(lambda x: x * x, iter(range(5)), num_workers=2, depth=3) as it:
    ...     list(it)
    [0, 1, 4, 9, 16]
"""

from __future__ import annotations

import atexit
import os
import queue
import sys
import threading
import time
import traceback
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")

# close() waits this long in all for idle threads to exit (so a finished loop leaves no thread
# behind), then leaves the busy ones to finish detached.
JOIN_S = 0.1


def check_same_process(pid: int) -> None:
    """An iterator belongs to the process that started it; in a fork child it is an error."""
    if pid != os.getpid():
        raise RuntimeError(
            f"this iterator was started in process {pid} and cannot be used in "
            f"process {os.getpid()} (a fork child); start a new one there with iter(loader)"
        )


class Stalled(Exception):
    """No result came for ``seconds``: the oldest task, the worker on it and its stack.

    ``functions`` are the names of the stack's functions, innermost first (what the engine names
    the stage by); ``stack`` is printable.
    """

    def __init__(
        self, seconds: float, task: Any, worker: str, stack: str, functions: list[str]
    ) -> None:
        super().__init__(f"no result for {seconds:g} s from {worker}")
        self.seconds, self.task, self.worker = seconds, task, worker
        self.stack, self.functions = stack, functions


class _Job:
    """One task: run by a worker thread, awaited by the consumer."""

    __slots__ = ("cancelled", "done", "error", "fn", "result", "task", "thread")

    def __init__(self, fn: Callable[[Any], Any], task: Any) -> None:
        self.fn, self.task = fn, task
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None
        self.thread: threading.Thread | None = None
        self.cancelled = False

    def run(self) -> None:
        if self.cancelled:
            return
        self.thread = threading.current_thread()
        try:
            self.result = self.fn(self.task)
        except BaseException as exc:  # re-raised in the consumer
            self.error = exc
        finally:
            self.done.set()

    def outcome(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.result


def _serve(jobs: queue.SimpleQueue[_Job | None]) -> None:
    while True:
        job = jobs.get()
        if job is None:
            return
        job.run()
        del job  # drop the result with the job: a detached thread keeps nothing alive


EXIT_WAIT_S = 10.0  # at exit, for busy workers to finish their task (reads take ms to seconds)
WORKER_NAME = "lanceloader-worker-"
_live: weakref.WeakSet[OrderedPrefetcher[Any, Any]] = weakref.WeakSet()


def _close_at_exit() -> None:
    """Close every live pool, then wait (bounded) for every worker thread, those of pools
    already closed and collected too (detached, finishing a task); see the module text."""
    for pool in [p for p in list(_live) if p._pid == os.getpid()]:
        pool.close()
    deadline = time.monotonic() + EXIT_WAIT_S
    for thread in threading.enumerate():
        if thread.name.startswith(WORKER_NAME) and thread is not threading.current_thread():
            thread.join(max(0.0, deadline - time.monotonic()))


atexit.register(_close_at_exit)


class OrderedPrefetcher(Generic[T, R]):
    """Apply ``fn`` to each task of ``tasks`` on ``num_workers`` threads, ``depth`` in flight."""

    def __init__(
        self,
        fn: Callable[[T], R],
        tasks: Iterator[T],
        num_workers: int,
        depth: int,
        stall_timeout: float | None = None,
    ) -> None:
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        if depth < 1:
            raise ValueError(f"prefetch depth must be >= 1, got {depth}")
        self._fn = fn
        self._tasks = tasks
        self._depth = depth
        self._stall_timeout = stall_timeout
        self._pending: deque[_Job] = deque()
        self._pid = os.getpid()
        self._closed = False
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._threads = [
            threading.Thread(
                target=_serve, args=(self._jobs,), daemon=True, name=f"{WORKER_NAME}{i}"
            )
            for i in range(num_workers)
        ]
        for thread in self._threads:
            thread.start()
        _live.add(self)
        self._fill()

    def _fill(self) -> None:
        while len(self._pending) < self._depth:
            task = next(self._tasks, None)
            if task is None:
                return
            job = _Job(self._fn, task)
            self._pending.append(job)
            self._jobs.put(job)

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
        job = self._pending[0]
        try:
            if not job.done.wait(self._stall_timeout):
                stalled = self._stalled(job)
                if not job.done.is_set():  # (not finished while the stack was taken)
                    raise stalled
            self._pending.popleft()
            result = job.outcome()
        except BaseException:
            self.close()
            raise
        self._fill()
        return result

    def _stalled(self, job: _Job) -> Stalled:
        assert self._stall_timeout is not None
        thread = job.thread
        frame = sys._current_frames().get(thread.ident) if thread and thread.ident else None
        if thread is None or frame is None:
            busy = [j for j in self._pending if j.thread is not None and not j.done.is_set()]
            return Stalled(
                self._stall_timeout,
                job.task,
                "no worker (not started yet)",
                f"(not started: all {len(self._threads)} worker threads are busy with "
                f"{len(busy)} earlier tasks)\n",
                [],
            )
        entries = [
            e
            for e in traceback.extract_stack(frame)  # the task's frames, not the pool's
            if not e.filename.endswith(("threading.py", __file__))
        ]
        return Stalled(
            self._stall_timeout,
            job.task,
            f"worker thread {thread.name}",
            "".join(traceback.format_list(entries)),
            [e.name for e in reversed(entries)],
        )

    def close(self) -> None:
        """Stop at once: cancel queued tasks, let busy threads finish detached. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for job in self._pending:
            job.cancelled = True
        self._pending.clear()
        if self._pid != os.getpid():
            return
        for _ in self._threads:
            self._jobs.put(None)
        deadline = time.monotonic() + JOIN_S
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def __enter__(self) -> OrderedPrefetcher[T, R]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if hasattr(self, "_threads"):  # fully constructed
            self.close()
