"""Thread workers: a :class:`~lanceloader.engine.pool.Pool` of threads in this process (Lance,
Arrow and most decoders release the GIL), and :class:`Stalled`, what any pool raises for a task
that takes too long.

Contract of a :class:`ThreadPool`:

* ``submit`` queues a task for the next free thread; ``take`` returns the oldest task's result,
  whatever order the threads finish in. The caller bounds the tasks in flight (``in_flight``),
  which bounds memory at that many task results.
* A worker's exception is re-raised by ``take``, as the same exception object with its original
  traceback; the pool is closed first.
* The wait in ``take`` wakes for signals (Ctrl-C arrives at once) and lasts at most
  ``stall_timeout`` seconds: then :class:`Stalled` is raised with the stuck worker's stack.
* ``discard()`` cancels the queued tasks; a thread busy with one finishes it detached (its result
  dropped) and serves new tasks after it.
* ``close()`` returns at once, whatever the workers are doing: queued tasks are cancelled, idle
  threads exit, and a thread busy with a task (a Lance read, a slow transform) finishes it
  *detached*: its result is dropped, and the thread exits after it. Threads are daemons, so a
  task that never returns cannot block the interpreter's exit. It runs on error, on ``with``
  exit, and on garbage collection (a stream closes its pool at its end, ``break`` or Ctrl-C).
* At interpreter exit every live pool is closed and its busy threads are waited for, at most
  :data:`EXIT_WAIT_S` in all: a daemon thread still inside Lance's native code when the
  interpreter finalizes is stopped by a forced unwind, which aborts the whole process ("FATAL:
  exception not rethrown", exit code 134) instead of exiting cleanly.

Example::

    >>> from lanceloader.engine.pool import Ordered
    >>> with Ordered(ThreadPool(lambda x: x * x, num_workers=2), iter(range(5)), depth=3) as it:
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
from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")

# close() waits this long in all for idle threads to exit (so a finished loop leaves no thread
# behind), then leaves the busy ones to finish detached.
JOIN_S = 0.1


_pid = os.getpid()  # this process's, set again in a fork child: no system call per check


def _forked() -> None:
    global _pid
    _pid = os.getpid()


os.register_at_fork(after_in_child=_forked)


def check_same_process(pid: int) -> None:
    """An iterator belongs to the process that started it; in a fork child it is an error.
    Run per read in the loop's thread, so it compares with the pid kept at import and after
    each ``fork`` (``os.register_at_fork``), not with a ``getpid`` system call."""
    if pid != _pid:
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
    """One task: run by a worker thread, awaited by the consumer.

    ``done`` is a bare lock, held from creation until the task has run (a worker releases it;
    the consumer's ``acquire`` with a timeout is its wait, interrupted by signals): a third of
    an ``Event``'s cost on the consumer's side, which pays it once per read."""

    __slots__ = ("cancelled", "done", "error", "fn", "result", "task", "thread")

    def __init__(self, fn: Callable[[Any], Any], task: Any) -> None:
        self.fn, self.task = fn, task
        self.done = threading.Lock()
        self.done.acquire()
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
            self.done.release()

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
_live: weakref.WeakSet[ThreadPool[Any, Any]] = weakref.WeakSet()


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


class ThreadPool(Generic[T, R]):
    """A :class:`~lanceloader.engine.pool.Pool` of ``num_workers`` threads applying ``fn``."""

    def __init__(
        self, fn: Callable[[T], R], num_workers: int, stall_timeout: float | None = None
    ) -> None:
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        self._fn = fn
        self.stall_timeout = stall_timeout
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

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def in_flight(self) -> int:
        """Tasks submitted and not yet taken."""
        return len(self._pending)

    def submit(self, task: T) -> None:
        """Queue ``task`` for the next free thread."""
        check_same_process(self._pid)
        if self._closed:
            raise RuntimeError("this thread pool is closed")
        job = _Job(self._fn, task)
        self._pending.append(job)
        self._jobs.put(job)

    def take(self) -> R:
        """The oldest task's result (its error re-raised with its traceback, the pool closed);
        waits at most ``stall_timeout`` (:class:`Stalled`)."""
        check_same_process(self._pid)
        if self._closed or not self._pending:
            raise RuntimeError("no task in flight to take a result of")
        job = self._pending[0]
        try:
            timeout = -1 if self.stall_timeout is None else self.stall_timeout
            if not job.done.acquire(timeout=timeout):
                stalled = self._stalled(job)
                if job.done.locked():  # (not finished while the stack was taken)
                    raise stalled
            self._pending.popleft()
            return job.outcome()
        except BaseException:
            self.close()
            raise

    def discard(self) -> None:
        """Forget every task in flight: queued ones are cancelled, busy threads finish theirs
        detached from the pool (its result dropped) and then serve new tasks."""
        for job in self._pending:
            job.cancelled = True
        self._pending.clear()

    def _stalled(self, job: _Job) -> Stalled:
        assert self.stall_timeout is not None
        thread = job.thread
        frame = sys._current_frames().get(thread.ident) if thread and thread.ident else None
        if thread is None or frame is None:
            busy = [j for j in self._pending if j.thread is not None and j.done.locked()]
            return Stalled(
                self.stall_timeout,
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
            self.stall_timeout,
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
        self.discard()
        if self._pid != os.getpid():
            return
        for _ in self._threads:
            self._jobs.put(None)
        deadline = time.monotonic() + JOIN_S
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def __enter__(self) -> ThreadPool[T, R]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if hasattr(self, "_threads"):  # fully constructed
            self.close()
