"""Process workers: for transforms that hold the GIL, without fork hazards or pickled arrays.

Workers are started by a **forkserver** whose server process imported Lance, Arrow and NumPy but
never used them. A process that has done Lance I/O must not be forked (Lance's runtime threads do
not survive ``fork``; see ``docs/fork-safety.md``), and spawning a fresh interpreter per worker
costs seconds. Forking from that clean server costs milliseconds and is safe.

Workers never run the user's main module: multiprocessing's "main module preparation" (the
``init_main_from_path`` / ``init_main_from_name`` entries of the data a forkserver child gets
before its process object, which make a ``spawn``/``forkserver`` child re-run the script as
``__mp_main__``) is left out for these workers (:class:`WorkerProcess`). A script without an
``if __name__ == "__main__":`` guard therefore runs its top-level code once, and a notebook (which
has no main file) works alike. What a worker runs reaches it **by value** through ``cloudpickle``:
functions and classes defined in ``__main__`` or a notebook cell, lambdas and closures travel
with their code; what lives in an importable module travels by name, as with ``pickle``.

Contract:

* Each task goes to the worker with the fewest unfinished tasks (round-robin among equals), so
  a worker slowed down (by a slow task, or by other processes taking its core) gets less work
  instead of holding back the others: with tasks dealt ``i % num_workers``, a worker stuck on
  the oldest task kept its later tasks queued while the others idled. Results are read as they
  come from every worker and handed out in task order. At most ``depth`` tasks are in flight
  (sent and not yet handed out, finished ones waiting their turn included).
* NumPy arrays in a result travel through shared memory (:mod:`lanceloader.engine.transport`):
  the worker writes them into one ``/dev/shm`` file per task, the consumer maps it and unlinks it at once, and the arrays it
  hands out view that mapping (no pickling, one copy in the worker). Everything else in a result
  is pickled.
* A worker that dies (SIGKILL, ``os._exit``, a crash) is reported in the consumer at once, with
  its index, PID and exit status; an exception in a worker is re-raised in the consumer with the
  worker's traceback as a note.
* The consumer's wait for a result wakes for signals and lasts at most ``stall_timeout``
  seconds; then :class:`~lanceloader.engine.threads.Stalled` is raised with the stuck worker's stack
  (written by ``faulthandler`` on SIGUSR1; a stopped process is reported as stopped).
* ``close()`` returns within a fraction of a second whatever the workers are doing: idle workers
  are told to exit, busy ones are SIGKILLed (all at once), every worker is joined, and this pool's
  shared-memory files are removed. It is idempotent. Workers ignore SIGINT (the consumer handles
  Ctrl-C and closes them).
* Nothing outlives the consumer (:mod:`lanceloader.lifecycle.lifetime`): each worker watches the consumer
  and, when it dies (even by SIGKILL), removes its shared-memory files and exits; a pool that
  starts removes the files of consumers that died earlier.
"""

from __future__ import annotations

import contextlib
import faulthandler
import io
import itertools
import multiprocessing as mp
import os
import pickle
import queue
import re
import signal
import threading
import time
import traceback
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from multiprocessing import forkserver, popen_forkserver, reduction, spawn, util
from multiprocessing.connection import Connection, wait
from multiprocessing.context import set_spawning_popen
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any

from lanceloader.engine.memory import reuse_freed_memory
from lanceloader.engine.pickling import dumps
from lanceloader.engine.threads import Stalled, check_same_process
from lanceloader.engine.transport import pack, unpack
from lanceloader.lifecycle import lifetime
from lanceloader.lifecycle.lifetime import SHM_DIR, picklable_error

# close(): how long idle workers get to exit after being told to, before every worker left is
# SIGKILLed (busy ones hold nothing that needs a clean exit: their files are removed after).
EXIT_S = 0.1
STACK_SIGNAL = signal.SIGUSR1  # a worker's faulthandler writes its stack on this signal
# The forkserver imports these once; its children start with them loaded. The first one silences
# Lance's "not fork-safe" warning in the server only: forking it is safe, it never used Lance.
PRELOAD = [
    "lanceloader.lifecycle._forkserver",
    "numpy",
    "pyarrow",
    "lance",
    "cloudpickle",
    "lanceloader.engine.work",
]
# What multiprocessing's preparation data uses to re-run the parent's main module in a child.
MAIN_MODULE_KEYS = ("init_main_from_path", "init_main_from_name")


class WorkerDiedError(RuntimeError):
    """A worker process exited without answering its task."""


def forkserver_context() -> mp.context.BaseContext:
    """The forkserver context, preloading Lance (imported, never used) when it first starts."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def start_forkserver() -> None:
    """Start the forkserver now, without waiting: its imports (~1 s) overlap with the caller's
    work, and the first ``iter()`` only waits for what is left."""
    forkserver_context()
    forkserver.ensure_running()


def preparation_data(name: str) -> dict[str, Any]:
    """What a worker gets before its process object: multiprocessing's preparation data (name,
    authkey, ``sys.path``, ``sys.argv``, working directory) less the main module entries, so the
    worker never imports the user's script.

    >>> sorted(set(preparation_data("w")) & set(MAIN_MODULE_KEYS))
    []
    """
    data = spawn.get_preparation_data(name)
    for key in MAIN_MODULE_KEYS:
        data.pop(key, None)
    return data


class WorkerPopen(popen_forkserver.Popen):
    """The forkserver's ``Popen`` with :func:`preparation_data` in place of the stdlib's: the
    same launch (``popen_forkserver.Popen._launch``, the same from CPython 3.10 to its main branch)
    without the main module preparation."""

    def _launch(self, process_obj: Any) -> None:
        prep_data = preparation_data(process_obj._name)
        buf = io.BytesIO()
        set_spawning_popen(self)
        try:
            reduction.dump(prep_data, buf)
            reduction.dump(process_obj, buf)
        finally:
            set_spawning_popen(None)
        # multiprocessing's own Popen internals (popen_forkserver.Popen._launch does the same)
        self.sentinel, w = forkserver.connect_to_new_process(self._fds)  # type: ignore[attr-defined]
        # A duplicate of the data pipe's write end: the child's sentinel of this process.
        parent_w = os.dup(w)
        self.finalizer = util.Finalize(
            self,
            util.close_fds,  # type: ignore[attr-defined]
            (parent_w, self.sentinel),
        )
        with open(w, "wb", closefd=True) as f:
            f.write(buf.getbuffer())
        self.pid = forkserver.read_signed(self.sentinel)


class WorkerProcess(mp.context.ForkServerProcess):
    """A forkserver process that does not re-run the user's main module (:class:`WorkerPopen`)."""

    @staticmethod
    def _Popen(process_obj: Any) -> WorkerPopen:  # multiprocessing's name
        return WorkerPopen(process_obj)


# --- the worker process --------------------------------------------------------------------


def _worker_main(
    fn_bytes: bytes, tasks: Connection, results: Connection, prefix: str, owner: int
) -> None:
    """Run tasks until told to stop, or until the consumer (``owner``) goes away."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    reuse_freed_memory()
    lifetime.watch_owner(owner)
    # Appending: the consumer truncates the file before it asks for a stack.
    stack_file = open(SHM_DIR / f"{prefix}-{os.getpid()}-stack", "a")  # noqa: SIM115
    faulthandler.register(STACK_SIGNAL, file=stack_file, all_threads=True)
    fn = pickle.loads(fn_bytes)
    counter = itertools.count()
    while True:
        try:
            message = tasks.recv()
        except (EOFError, OSError):  # the consumer is gone: nobody will map what was sent
            lifetime.remove_prefix(prefix)
            return
        if message is None:
            return
        index, task = message
        path = SHM_DIR / f"{prefix}-{os.getpid()}-{next(counter)}"
        try:
            payload: tuple[Any, ...] = ("ok", index, *pack(fn(task), path), str(path))
        except BaseException as exc:
            path.unlink(missing_ok=True)
            payload = (
                "error",
                index,
                dumps(picklable_error(exc, dumps)),
                traceback.format_exc(),
                "",
            )
        try:
            results.send(payload)
        except (BrokenPipeError, OSError):
            lifetime.remove_prefix(prefix)
            return


# --- the pool -----------------------------------------------------------------------------


class ProcessPool:
    """Ordered results of ``fn`` over ``tasks`` from ``num_workers`` forkserver processes."""

    def __init__(
        self,
        fn: Callable[[Any], Any],
        tasks: Iterator[Any],
        num_workers: int,
        depth: int,
        stall_timeout: float | None = None,
    ) -> None:
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        self._tasks = tasks
        self._depth = max(depth, num_workers)
        self._stall_timeout = stall_timeout
        self._pid = os.getpid()
        self._closed = False
        lifetime.remove_orphans()
        self._prefix = lifetime.shm_name("pool", os.getpid(), uuid.uuid4().hex[:8])
        self._submitted = 0
        self._pending: deque[tuple[int, int, Any]] = deque()  # (index, worker, task), in order
        self._unfinished = [0] * num_workers  # tasks sent to each worker, not yet answered
        self._done: dict[int, tuple[Any, BaseException | None]] = {}  # index -> (result, error)
        ctx = forkserver_context()
        fn_bytes = dumps(fn)
        self._workers: list[tuple[mp.process.BaseProcess, Connection, Connection]] = []
        # A task is sent by a feeder thread per worker: a send blocks while the pipe is full
        # (a task of a big read is hundreds of KB), and the consumer must never wait there, or
        # a worker stuck on its current task would block it beyond stall_timeout.
        self._feeds: list[tuple[queue.SimpleQueue[Any], threading.Thread]] = []
        try:
            for i in range(num_workers):
                task_recv, task_send = ctx.Pipe(duplex=False)
                result_recv, result_send = ctx.Pipe(duplex=False)
                proc = WorkerProcess(
                    target=_worker_main,
                    name=f"lanceloader-process-{i}",
                    args=(fn_bytes, task_recv, result_send, self._prefix, self._pid),
                    daemon=True,
                )
                proc.start()
                task_recv.close()
                result_send.close()
                self._workers.append((proc, task_send, result_recv))
                feed: queue.SimpleQueue[Any] = queue.SimpleQueue()
                feeder = threading.Thread(
                    target=_feed,
                    args=(feed, task_send),
                    daemon=True,
                    name=f"lanceloader-feeder-{i}",
                )
                feeder.start()
                self._feeds.append((feed, feeder))
            self._fill()
        except BaseException:
            self.close()
            raise

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p, _, _ in self._workers if not self._closed and p.pid is not None]

    def _least_busy(self) -> int:
        """The worker with the fewest unfinished tasks; among equals, the next in turn."""
        n = len(self._workers)
        turn = self._submitted % n
        return min(range(n), key=lambda w: (self._unfinished[w], (w - turn) % n))

    def _fill(self) -> None:
        while len(self._pending) < self._depth:
            task = next(self._tasks, None)
            if task is None:
                return
            worker = self._least_busy()
            # Pickled here, so that a task that cannot be sent fails in the consumer; a dead
            # worker is reported by _collect.
            self._feeds[worker][0].put(ForkingPickler.dumps((self._submitted, task)))
            self._pending.append((self._submitted, worker, task))
            self._unfinished[worker] += 1
            self._submitted += 1

    def __iter__(self) -> ProcessPool:
        return self

    def __next__(self) -> Any:
        check_same_process(self._pid)
        if self._closed or not self._pending:
            self.close()
            raise StopIteration
        index, worker, task = self._pending[0]
        try:
            deadline = (
                None if self._stall_timeout is None else time.monotonic() + self._stall_timeout
            )
            while index not in self._done:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                if not self._collect(left):
                    raise self._stalled(worker, task)
            self._pending.popleft()
            result, error = self._done.pop(index)
            if error is not None:
                raise error
            self._collect(0.0)  # answers already there count before the next tasks are dealt
            self._fill()
        except BaseException:
            self.close()
            raise
        return result

    def _collect(self, timeout: float | None) -> bool:
        """Take every answer that arrives within ``timeout`` seconds (each worker's answers come
        in its order); False when none came. A worker that died with tasks unfinished is a
        :class:`WorkerDiedError` at once."""
        busy = [w for w, n in enumerate(self._unfinished) if n]
        handles: dict[Any, int] = {
            h: w for w in busy for h in (self._workers[w][2], self._workers[w][0].sentinel)
        }
        ready = wait(list(handles), timeout=timeout)
        for worker in sorted({handles[h] for h in ready}):
            proc, _, conn = self._workers[worker]
            while self._unfinished[worker] and conn.poll():  # answers sent before any exit
                try:
                    message = conn.recv()
                except EOFError:  # gone, its pipe closed
                    proc.join(1.0)
                    raise WorkerDiedError(_death_message(worker, proc)) from None
                self._answer(worker, message)
            if self._unfinished[worker] and proc.sentinel in ready:
                proc.join(1.0)
                raise WorkerDiedError(_death_message(worker, proc))
        return bool(ready)

    def _answer(self, worker: int, message: tuple[Any, ...]) -> None:
        kind, index, a, b, path = message
        self._unfinished[worker] -= 1
        if kind == "error":
            exc: BaseException = pickle.loads(a)
            if hasattr(exc, "add_note"):
                exc.add_note(
                    f"in worker process {worker} (pid {self._workers[worker][0].pid}):\n{b}"
                )
            self._done[index] = (None, exc)
        else:  # mapped (and its file unlinked) now, whatever its turn
            self._done[index] = (unpack(a, b, Path(path)), None)

    def _stalled(self, worker: int, task: Any) -> Stalled:
        assert self._stall_timeout is not None
        proc = self._workers[worker][0]
        assert proc.pid is not None
        stack = _task_thread(worker_stack(proc.pid, SHM_DIR / f"{self._prefix}-{proc.pid}-stack"))
        return Stalled(
            self._stall_timeout,
            task,
            f"worker process {worker} (pid {proc.pid})",
            stack,
            _FRAME.findall(stack),
        )

    def close(self) -> None:
        """Stop every worker at once and join them; remove this pool's files. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._pid != os.getpid():
            return
        busy = {worker for worker, n in enumerate(self._unfinished) if n}
        for worker, (feed, _) in enumerate(self._feeds):
            if worker not in busy:
                feed.put(None)  # an idle worker exits by itself; busy ones are killed below
        running = [p for p, _, _ in self._workers if p.exitcode is None]
        deadline = time.monotonic() + EXIT_S
        while running and time.monotonic() < deadline:
            wait([p.sentinel for p in running], timeout=max(0.0, deadline - time.monotonic()))
            running = [p for p in running if p.exitcode is None]
        for proc in running:  # busy: a read or a transform that would keep us waiting
            with contextlib.suppress(OSError):
                proc.kill()
        for proc, _, _ in self._workers:
            proc.join()  # at once: exited or SIGKILLed
        for feed, _ in self._feeds:
            feed.put(_STOP)
        for _, feeder in self._feeds:  # a send to a killed worker fails at once
            feeder.join(1.0)
        for proc, send, recv in self._workers:
            proc.close()  # releases its sentinel file descriptor
            send.close()
            recv.close()
        lifetime.remove_prefix(self._prefix)
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


def worker_stack(pid: int, stack_file: Path, wait_s: float = 1.0) -> str:
    """The Python stack of every thread of worker ``pid``, as its ``faulthandler`` writes it to
    ``stack_file`` on :data:`STACK_SIGNAL`; or why it cannot be had (a stopped process runs no
    handler)."""
    state = lifetime.process_state(pid)
    if state in ("T", "t"):
        return (
            f"(no stack: process {pid} is stopped (state {state}), e.g. by SIGSTOP, Ctrl-Z or "
            "a debugger; SIGCONT continues it)\n"
        )
    try:
        os.truncate(stack_file, 0)
        os.kill(pid, STACK_SIGNAL)
    except OSError as exc:
        return f"(no stack: {exc})\n"
    deadline, text = time.monotonic() + wait_s, ""
    while time.monotonic() < deadline:
        time.sleep(0.05)
        fresh = stack_file.read_text(errors="replace")
        if fresh and fresh == text:  # written completely
            break
        text = fresh
    return text or f"(no stack: process {pid} (state {state}) did not answer within {wait_s} s)\n"


_FRAME = re.compile(r'File ".*", line \d+ in (\S+)')


def _task_thread(stack: str) -> str:
    """The thread of a faulthandler dump that runs tasks (the whole dump if none does)."""
    for section in stack.split("\n\n"):
        if "in _worker_main" in section:
            return section.rstrip("\n") + "\n"
    return stack
