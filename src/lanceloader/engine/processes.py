"""Process workers: for transforms that hold the GIL, without fork hazards or pickled arrays.

A :class:`ProcessPool` is a :class:`~lanceloader.engine.pool.Pool` of forkserver processes
(how they start and what they run: :mod:`lanceloader.engine.forkserver`). A loader keeps one
across its epochs (:class:`~lanceloader.engine.pool.KeptPool`), so its workers keep what they
opened and filled (the dataset, the cache's pieces) from one epoch to the next.

Contract:

* Each task goes to the worker with the fewest unfinished tasks (round-robin among equals), so
  a worker slowed down (by a slow task, or by other processes taking its core) gets less work
  instead of holding back the others: with tasks dealt ``i % num_workers``, a worker stuck on
  the oldest task kept its later tasks queued while the others idled. Results are read as they
  come from every worker and taken in task order. The caller bounds the tasks in flight
  (``in_flight``: submitted and not yet taken, finished ones waiting their turn included).
* NumPy arrays in a result travel through shared memory (:mod:`lanceloader.engine.transport`,
  :mod:`lanceloader.engine.segments`): the worker writes them into one of the few ``/dev/shm``
  segments it keeps (a file of the task's own when the consumer holds every one), the consumer
  maps each segment once and unlinks its name at once, and the arrays it hands out view that
  mapping (no pickling, one copy in the worker). A segment is written again only after the last
  array viewing it is gone. Everything else in a result is pickled.
* A worker that dies (SIGKILL, ``os._exit``, a crash) is reported in the consumer at once, with
  its index, PID and exit status; an exception in a worker is re-raised in the consumer with the
  worker's traceback as a note. Either closes the pool.
* The consumer's wait for a result wakes for signals and lasts at most ``stall_timeout``
  seconds; then :class:`~lanceloader.engine.threads.Stalled` is raised with the stuck worker's
  stack (written by ``faulthandler`` on SIGUSR1; a stopped process is reported as stopped).
* ``discard()`` (a stream that stops before its end: ``break``, ``close()``) returns at once:
  answers already there are dropped (their files unlinked), workers still busy with a task are
  SIGKILLed (all at once; a task and those queued behind it would hold the next epoch back) and
  started again when a task next needs them, and idle workers stay, with what they hold. No
  result of a discarded task is ever taken.
* ``close()`` returns within a fraction of a second whatever the workers are doing: idle workers
  are told to exit, busy ones are SIGKILLed (all at once), every worker is joined, and this
  pool's shared-memory files are removed. It is idempotent, and runs on garbage collection and
  at the interpreter's exit. Workers ignore SIGINT (the consumer handles Ctrl-C and closes them).
* Nothing outlives the consumer (:mod:`lanceloader.lifecycle.lifetime`): each worker watches
  the consumer and, when it dies (even by SIGKILL), removes its shared-memory files and exits; a
  pool that starts removes the files of consumers that died earlier.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing as mp
import os
import pickle
import queue
import signal
import threading
import time
import uuid
import weakref
from collections import deque
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any

from lanceloader.engine.forkserver import (
    FRAME,
    PRELOAD,
    WorkerProcess,
    forkserver_context,
    start_forkserver,
    task_thread,
    worker_main,
    worker_stack,
)
from lanceloader.engine.pickling import Shipment
from lanceloader.engine.segments import Leases
from lanceloader.engine.threads import Stalled, check_same_process
from lanceloader.engine.transport import ship
from lanceloader.lifecycle import lifetime
from lanceloader.lifecycle.lifetime import SHM_DIR

__all__ = ["PRELOAD", "ProcessPool", "WorkerDiedError", "forkserver_context", "start_forkserver"]

# close(): how long idle workers get to exit after being told to, before every worker left is
# SIGKILLed (busy ones hold nothing that needs a clean exit: their files are removed after).
EXIT_S = 0.1


class WorkerDiedError(RuntimeError):
    """A worker process exited without answering its task."""


class _Worker:
    """One worker process: its process, the pipe its feeder thread sends tasks on (a send
    blocks while the pipe is full, and the consumer must never wait there), the pipe its answers
    come on, and how many of its tasks are unanswered."""

    def __init__(self, index: int, work: tuple[Any, ...], prefix: str, owner: int) -> None:
        ctx = forkserver_context()
        task_recv, self.send = ctx.Pipe(duplex=False)
        self.recv, result_send = ctx.Pipe(duplex=False)
        self.proc = WorkerProcess(
            target=worker_main,
            name=f"lanceloader-process-{index}",
            args=(work, task_recv, result_send, prefix, owner),
            daemon=True,
        )
        self.unfinished = 0
        self.feed: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.feeder = threading.Thread(
            target=_feed,
            args=(self.feed, self.send),
            daemon=True,
            name=f"lanceloader-feeder-{index}",
        )
        try:
            self.proc.start()
        except BaseException:
            self.send.close()
            self.recv.close()
            raise
        finally:
            task_recv.close()
            result_send.close()
        self.feeder.start()

    def release(self) -> None:
        """After the process exited or was killed: join it, its feeder, close the pipes."""
        self.proc.join()
        self.feed.put(_STOP)
        self.feeder.join(1.0)  # a send to a dead worker fails at once
        self.proc.close()  # releases its sentinel file descriptor
        self.send.close()
        self.recv.close()


class ProcessPool:
    """Results of ``fn`` over the tasks submitted, in order, from ``num_workers`` forkserver
    processes (see the module text). ``start_bytes``: what each worker is sent at start."""

    def __init__(
        self,
        fn: Callable[[Any], Any] | Shipment,
        num_workers: int,
        stall_timeout: float | None = None,
    ) -> None:
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        self.stall_timeout = stall_timeout
        self.shipment = fn if isinstance(fn, Shipment) else Shipment.of(fn)
        self._pid = os.getpid()
        self._closed = False
        lifetime.remove_orphans()
        self._prefix = lifetime.shm_name("pool", os.getpid(), uuid.uuid4().hex[:8])
        self._submitted = 0
        self._held: list[tuple[int, Any]] | None = []  # None once they were sent
        self._answered = False  # the first task's answer came (the held tasks go next)
        self._pending: deque[tuple[int, int, Any]] = deque()  # (index, worker, task), in order
        self._done: dict[int, tuple[Any, BaseException | None]] = {}  # index -> (result, error)
        self._workers: list[_Worker | None] = [None] * num_workers
        self._work: tuple[Any, ...] = ()
        self._leases = Leases()  # the workers' segments, as the consumer maps them
        try:
            self._work = ship(self.shipment, Path(SHM_DIR / f"{self._prefix}-work"))
            self.start_bytes = len(pickle.dumps(self._work))
            for i in range(num_workers):
                self._start(i)
        except BaseException:
            self.close()
            raise
        _live.add(self)

    def _start(self, i: int) -> _Worker:
        worker = self._workers[i] = _Worker(i, self._work, self._prefix, self._pid)
        return worker

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def num_workers(self) -> int:
        return len(self._workers)

    @property
    def owner(self) -> int:
        """The process that started the pool (the only one that may use it)."""
        return self._pid

    @property
    def in_flight(self) -> int:
        """Tasks submitted and not yet taken."""
        return len(self._pending)

    @property
    def pids(self) -> list[int]:
        return [w.proc.pid for w in self._live_workers() if w.proc.pid is not None]

    def _live_workers(self) -> list[_Worker]:
        return [] if self._closed else [w for w in self._workers if w is not None]

    def _unfinished(self, i: int) -> int:
        worker = self._workers[i]
        return 0 if worker is None else worker.unfinished

    def _least_busy(self, index: int) -> int:
        """The worker with the fewest unfinished tasks; among equals, the next in turn."""
        n = len(self._workers)
        turn = index % n
        return min(range(n), key=lambda w: (self._unfinished(w), (w - turn) % n))

    def submit(self, task: Any) -> None:
        """Send ``task`` to the least busy worker (started again first if a discard stopped
        it). Pickled here, so that a task that cannot be sent fails in the caller; a dead worker
        is reported by :meth:`take`. A fresh pool sends its first task alone: the others wait
        here for its answer and go with the next task (see :meth:`_send_held`)."""
        check_same_process(self._pid)
        if self._closed:
            raise RuntimeError("this process pool is closed")
        index = self._submitted
        message = ForkingPickler.dumps((index, task))
        self._submitted += 1
        if self._held is not None:
            if self._answered:
                self._send_held()
            elif self._pending:  # the first is out, unanswered
                self._held.append((index, message))
                self._pending.append((index, -1, task))
                return
        self._pending.append((index, self._send(index, message), task))

    def _send(self, index: int, message: Any) -> int:
        """Hand task ``index`` (pickled) to the least busy worker; that worker's number."""
        i = self._least_busy(index)
        worker = self._workers[i] or self._start(i)
        worker.feed.put(message)
        worker.unfinished += 1
        return i

    def _send_held(self) -> None:
        """The first answer of a fresh pool was taken: send the tasks held back meanwhile, at
        the next :meth:`submit` (which the stream makes once it has taken the answer) or the
        next :meth:`take`, whichever comes first.

        Why they were held: new workers' first reads open every file their rows lie in (a
        shuffle's first read: a file per fragment, up to 96 on 100M rows), and 8 workers doing
        so at once on 2 cores made the first batch wait for all of them (2.2 s against 0.9 s
        on 1M rows). Alone, the first read takes its worker's core; the others start after.
        Sent when the answer arrived, their reads ran while the loop unpacked it: 70 ms from
        the answer to the first batch on 100M rows, 21 ms sent at the next submit
        (docs/performance.md, "Start-up does not grow with the table").
        """
        held, self._held = self._held or [], None
        sent = {index: self._send(index, message) for index, message in held}
        if sent:
            self._pending = deque(
                (index, sent.get(index, worker), task) for index, worker, task in self._pending
            )

    def take(self) -> Any:
        """The oldest task's result (its error raised, the pool closed); waits at most
        ``stall_timeout`` (:class:`~lanceloader.engine.threads.Stalled`)."""
        check_same_process(self._pid)
        if self._closed or not self._pending:
            raise RuntimeError("no task in flight to take a result of")
        if self._held is not None and self._answered:  # (no submit since: send them now)
            self._send_held()
        index, worker, task = self._pending[0]
        try:
            deadline = None if self.stall_timeout is None else time.monotonic() + self.stall_timeout
            while index not in self._done:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                if not self._collect(left):
                    raise self._stalled(worker, task)
            self._pending.popleft()
            result, error = self._done.pop(index)
            if error is not None:
                raise error
            self._collect(0.0)  # answers already there count before the next tasks are dealt
        except BaseException:
            self.close()
            raise
        return result

    def _collect(self, timeout: float | None) -> bool:
        """Take every answer that arrives within ``timeout`` seconds (each worker's answers come
        in its order); False when none came. A worker that died with tasks unfinished is a
        :class:`WorkerDiedError` at once."""
        handles: dict[Any, int] = {
            h: i
            for i, w in enumerate(self._workers)
            if w is not None and w.unfinished
            for h in (w.recv, w.proc.sentinel)
        }
        ready = wait(list(handles), timeout=timeout)
        for i in sorted({handles[h] for h in ready}):
            worker = self._workers[i]
            assert worker is not None
            while worker.unfinished and worker.recv.poll():  # answers sent before any exit
                try:
                    message = worker.recv.recv()
                except EOFError:  # gone, its pipe closed
                    worker.proc.join(1.0)
                    raise WorkerDiedError(_death_message(i, worker.proc)) from None
                worker.unfinished -= 1
                self._answer(i, message)
            if worker.unfinished and worker.proc.sentinel in ready:
                worker.proc.join(1.0)
                raise WorkerDiedError(_death_message(i, worker.proc))
        return bool(ready)

    def _answer(self, worker: int, message: tuple[Any, ...]) -> None:
        kind, index, a, b, where = message
        self._answered = True
        if kind == "error":
            exc: BaseException = pickle.loads(a)
            if hasattr(exc, "add_note"):
                pid = self._workers[worker].proc.pid  # type: ignore[union-attr]
                exc.add_note(f"in worker process {worker} (pid {pid}):\n{b}")
            self._done[index] = (None, exc)
        else:  # mapped (a file of its own unlinked) now, whatever its turn
            self._done[index] = (self._leases.unpack(a, b, where), None)

    def _stalled(self, i: int, task: Any) -> Stalled:
        assert self.stall_timeout is not None
        worker = self._workers[i]
        assert worker is not None and worker.proc.pid is not None
        pid = worker.proc.pid
        stack = task_thread(worker_stack(pid, SHM_DIR / f"{self._prefix}-{pid}-stack"))
        return Stalled(
            self.stall_timeout, task, f"worker process {i} (pid {pid})", stack, FRAME.findall(stack)
        )

    def discard(self) -> None:
        """Forget every task in flight (see the module text): busy workers are killed, idle
        ones stay. The pool takes new tasks after it."""
        if self._closed or self._pid != os.getpid():
            return
        with contextlib.suppress(WorkerDiedError):
            self._collect(0.0)  # a worker whose answers are all here is idle
        busy = [(i, w) for i, w in enumerate(self._workers) if w is not None and w.unfinished]
        for _, worker in busy:
            with contextlib.suppress(OSError):
                worker.proc.kill()
        for i, worker in busy:
            pid = worker.proc.pid
            worker.release()
            lifetime.remove_prefix(f"{self._prefix}-{pid}")  # its unread answers, its stack
            self._leases.forget(f"{SHM_DIR / self._prefix}-{pid}-")
            self._workers[i] = None
        self._pending.clear()
        self._done.clear()
        if self._held is not None:  # the held tasks are gone; with no answer yet, the next
            self._held = None if self._answered else []  # task goes alone again

    def close(self) -> None:
        """Stop every worker at once and join them; remove this pool's files. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._pid != os.getpid():
            return
        workers = [w for w in self._workers if w is not None]
        for worker in workers:
            if not worker.unfinished:
                worker.feed.put(None)  # an idle worker exits by itself; busy ones are killed
        running = [w.proc for w in workers if w.proc.exitcode is None]
        deadline = time.monotonic() + EXIT_S
        while running and time.monotonic() < deadline:
            wait([p.sentinel for p in running], timeout=max(0.0, deadline - time.monotonic()))
            running = [p for p in running if p.exitcode is None]
        for proc in running:  # busy: a read or a transform that would keep us waiting
            with contextlib.suppress(OSError):
                proc.kill()
        for worker in workers:
            worker.release()
        lifetime.remove_prefix(self._prefix)
        self._leases.forget()
        self._pending.clear()
        self._done.clear()

    def __enter__(self) -> ProcessPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if hasattr(self, "_workers"):
            self.close()


_STOP = object()
_live: weakref.WeakSet[ProcessPool] = weakref.WeakSet()


@atexit.register
def _close_at_exit() -> None:
    """Close every live pool of this process at the interpreter's exit (a loader kept one):
    workers told to exit, files removed, before multiprocessing's own exit handler."""
    for pool in list(_live):
        if pool._pid == os.getpid():
            pool.close()


def _feed(feed: queue.SimpleQueue[Any], conn: Connection) -> None:
    """Send a worker its pickled tasks (and a final None) in order, until told to stop or the
    worker is gone."""
    while True:
        item = feed.get()
        if item is _STOP:
            return
        try:
            if item is None:
                conn.send(None)
                return
            conn.send_bytes(item)
        except (OSError, ValueError):  # the worker is gone (or the pipe closed): stop
            return


def _death_message(worker: int, proc: mp.process.BaseProcess) -> str:
    code = proc.exitcode
    if code is not None and code < 0:
        try:
            status = f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            status = f"was killed by signal {-code}"
    else:
        status = f"exited with status {code}"
    if code == 1:
        cause = (
            "an error at start-up is the usual cause (e.g. a module the transform needs that "
            "the worker cannot import): see its traceback on stderr"
        )
    else:
        cause = (
            "out of memory (the kernel's OOM killer sends SIGKILL) and crashes in native "
            "code are the usual causes"
        )
    return (
        f"worker process {worker} (pid {proc.pid}) {status} before returning its batch; "
        f"the loader stopped all workers. {cause}"
    )
