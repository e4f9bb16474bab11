"""Process workers: for transforms that hold the GIL, without fork hazards or pickled arrays.

Workers are started by a **forkserver** whose server process imported Lance, Arrow and NumPy but
never used them. A process that has done Lance I/O must not be forked (Lance's runtime threads do
not survive ``fork``; see ``docs/fork-safety.md``), and spawning a fresh interpreter per worker
costs seconds. Forking from that clean server costs milliseconds and is safe.

Contract:

* Task ``i`` goes to worker ``i % num_workers``; each worker answers its tasks in order, so the
  consumer reads results in task order with no reordering buffer. At most ``depth`` tasks are in
  flight.
* NumPy arrays in a result travel through shared memory: the worker writes them into one
  ``/dev/shm`` file per task, the consumer maps it and unlinks it at once, and the arrays it
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
import dataclasses
import faulthandler
import itertools
import mmap
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
from multiprocessing.connection import Connection, wait
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any

import numpy as np

from lanceloader.engine.threads import Stalled, check_same_process
from lanceloader.lifecycle import lifetime
from lanceloader.lifecycle.lifetime import SHM_DIR, picklable_error

# close(): how long idle workers get to exit after being told to, before every worker left is
# SIGKILLed (busy ones hold nothing that needs a clean exit: their files are removed after).
EXIT_S = 0.1
STACK_SIGNAL = signal.SIGUSR1  # a worker's faulthandler writes its stack on this signal
# The forkserver imports these once; its children start with them loaded. The first one silences
# Lance's "not fork-safe" warning in the server only: forking it is safe, it never used Lance.
PRELOAD = ["lanceloader.lifecycle._forkserver", "numpy", "pyarrow", "lance", "lanceloader.engine.work"]


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
    from multiprocessing import forkserver

    forkserver.ensure_running()


def check_picklable(obj: object, what: str) -> None:
    """Fail before any worker starts if ``obj`` cannot be sent to a worker process."""
    try:
        pickle.dumps(obj)
    except Exception as exc:
        raise TypeError(
            f"{what} cannot be sent to worker processes: {exc}. Define it at module level "
            "(lambdas and nested functions cannot be pickled), or use worker_type='thread'"
        ) from exc


# --- shared memory transport ---------------------------------------------------------------

_ALIGN = 64


def _split(value: Any, arrays: list[np.ndarray]) -> Any:
    """Replace NumPy arrays (not of object dtype) in nested dicts, lists and dataclasses by
    placeholders, collecting the arrays."""
    if isinstance(value, np.ndarray) and value.dtype.kind not in "OT":  # not Python objects
        arrays.append(value)
        return _ArrayRef(len(arrays) - 1)
    if isinstance(value, dict):
        return {k: _split(v, arrays) for k, v in value.items()}
    if isinstance(value, list):
        return [_split(v, arrays) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: _split(getattr(value, f.name), arrays) for f in dataclasses.fields(value)}
        return dataclasses.replace(value, **fields)
    return value


class _ArrayRef:
    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


def _join(value: Any, arrays: list[np.ndarray]) -> Any:
    if isinstance(value, _ArrayRef):
        return arrays[value.index]
    if isinstance(value, dict):
        return {k: _join(v, arrays) for k, v in value.items()}
    if isinstance(value, list):
        return [_join(v, arrays) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: _join(getattr(value, f.name), arrays) for f in dataclasses.fields(value)}
        return dataclasses.replace(value, **fields)
    return value


def write_arrays(path: Path, arrays: list[np.ndarray]) -> list[int]:
    """Write ``arrays`` into the new shared-memory file ``path``, each at a 64-byte-aligned
    offset; returns the offsets."""
    offsets, size = [], 0
    for a in arrays:
        size = -(-size // _ALIGN) * _ALIGN
        offsets.append(size)
        size += a.nbytes
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, max(size, 1))
        with mmap.mmap(fd, max(size, 1)) as buf:
            for a, offset in zip(arrays, offsets, strict=True):
                buf[offset : offset + a.nbytes] = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    except BaseException:
        path.unlink(missing_ok=True)  # half-written: nobody will take it
        raise
    finally:
        os.close(fd)
    return offsets


def take_mapping(path: Path) -> mmap.mmap:
    """Map the shared-memory file ``path`` and delete its name: the memory lives as long as the
    mapping (and the arrays that view it), and nothing is left behind."""
    fd = os.open(path, os.O_RDWR)
    try:
        return mmap.mmap(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)


def pack(result: Any, path: Path) -> tuple[bytes, list[tuple[int, str, tuple[int, ...]]]]:
    """Write the arrays of ``result`` into the shared-memory file ``path``.

    Returns the pickled rest of the result and, per array, ``(offset, dtype, shape)``.
    """
    arrays: list[np.ndarray] = []
    skeleton = _split(result, arrays)
    offsets = write_arrays(path, arrays) if arrays else []
    layout = [(o, a.dtype.str, a.shape) for o, a in zip(offsets, arrays, strict=True)]
    return pickle.dumps(skeleton, protocol=pickle.HIGHEST_PROTOCOL), layout


def unpack(skeleton: bytes, layout: list[tuple[int, str, tuple[int, ...]]], path: Path) -> Any:
    """Map ``path`` (then unlink it) and rebuild the result with arrays viewing the mapping."""
    arrays: list[np.ndarray] = []
    if layout:
        buf = take_mapping(path)
        for offset, dtype, shape in layout:
            dt = np.dtype(dtype)
            count = int(np.prod(shape, dtype=np.int64))
            arrays.append(np.frombuffer(buf, dt, count, offset).reshape(shape))
    return _join(pickle.loads(skeleton), arrays)


# --- the worker process --------------------------------------------------------------------


def _worker_main(fn_bytes: bytes, tasks: Connection, results: Connection, prefix: str,
                 owner: int) -> None:
    """Run tasks until told to stop, or until the consumer (``owner``) goes away."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
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
            payload = ("ok", index, *pack(fn(task), path), str(path))
        except BaseException as exc:
            path.unlink(missing_ok=True)
            payload = ("error", index, picklable_error(exc), traceback.format_exc(), "")
        try:
            results.send(payload)
        except (BrokenPipeError, OSError):
            lifetime.remove_prefix(prefix)
            return


# --- the pool -----------------------------------------------------------------------------


class ProcessPool:
    """Ordered results of ``fn`` over ``tasks`` from ``num_workers`` forkserver processes."""

    def __init__(self, fn: Callable[[Any], Any], tasks: Iterator[Any], num_workers: int,
                 depth: int, stall_timeout: float | None = None) -> None:
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
        self._pending: deque[tuple[int, Any]] = deque()  # (worker, task)
        ctx = forkserver_context()
        fn_bytes = pickle.dumps(fn)
        self._workers: list[tuple[mp.process.BaseProcess, Connection, Connection]] = []
        # A task is sent by a feeder thread per worker: a send blocks while the pipe is full
        # (a task of a big read is hundreds of KB), and the consumer must never wait there, or
        # a worker stuck on its current task would block it beyond stall_timeout.
        self._feeds: list[tuple[queue.SimpleQueue[Any], threading.Thread]] = []
        try:
            for i in range(num_workers):
                task_recv, task_send = ctx.Pipe(duplex=False)
                result_recv, result_send = ctx.Pipe(duplex=False)
                proc = ctx.Process(target=_worker_main, name=f"lanceloader-process-{i}",
                                   args=(fn_bytes, task_recv, result_send, self._prefix,
                                         self._pid),
                                   daemon=True)
                proc.start()
                task_recv.close()
                result_send.close()
                self._workers.append((proc, task_send, result_recv))
                feed: queue.SimpleQueue[Any] = queue.SimpleQueue()
                feeder = threading.Thread(target=_feed, args=(feed, task_send), daemon=True,
                                          name=f"lanceloader-feeder-{i}")
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

    def _fill(self) -> None:
        while len(self._pending) < self._depth:
            task = next(self._tasks, None)
            if task is None:
                return
            worker = self._submitted % len(self._workers)
            # Pickled here, so that a task that cannot be sent fails in the consumer; a dead
            # worker is reported by _receive.
            self._feeds[worker][0].put(ForkingPickler.dumps((self._submitted, task)))
            self._pending.append((worker, task))
            self._submitted += 1

    def __iter__(self) -> ProcessPool:
        return self

    def __next__(self) -> Any:
        check_same_process(self._pid)
        if self._closed or not self._pending:
            self.close()
            raise StopIteration
        worker, task = self._pending.popleft()
        try:
            result = self._receive(worker, task)
            self._fill()
        except BaseException:
            self.close()
            raise
        return result

    def _receive(self, worker: int, task: Any) -> Any:
        proc, _, conn = self._workers[worker]
        ready = wait([conn, proc.sentinel], timeout=self._stall_timeout)
        if not ready:
            raise self._stalled(worker, task)
        if conn not in ready and not conn.poll():  # not an answer just before the exit
            raise WorkerDiedError(_death_message(worker, proc))
        try:
            kind, _, a, b, path = conn.recv()
        except EOFError:
            proc.join(1.0)
            raise WorkerDiedError(_death_message(worker, proc)) from None
        if kind == "error":
            exc: BaseException = a
            if hasattr(exc, "add_note"):
                exc.add_note(f"in worker process {worker} (pid {proc.pid}):\n{b}")
            raise exc
        return unpack(a, b, Path(path))

    def _stalled(self, worker: int, task: Any) -> Stalled:
        assert self._stall_timeout is not None
        proc = self._workers[worker][0]
        assert proc.pid is not None
        stack = _task_thread(worker_stack(proc.pid, SHM_DIR / f"{self._prefix}-{proc.pid}-stack"))
        return Stalled(self._stall_timeout, task, f"worker process {worker} (pid {proc.pid})",
                       stack, _FRAME.findall(stack))

    def close(self) -> None:
        """Stop every worker at once and join them; remove this pool's files. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._pid != os.getpid():
            return
        busy = {worker for worker, _ in self._pending}
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
            "an error at start-up is the usual cause: see its traceback on stderr. Workers "
            "import your main script (as with 'spawn'); guard its top-level code with "
            "`if __name__ == '__main__':`"
        )
    else:
        cause = ("out of memory (the kernel's OOM killer sends SIGKILL) and crashes in native "
                 "code are the usual causes")
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
        return (f"(no stack: process {pid} is stopped (state {state}), e.g. by SIGSTOP, Ctrl-Z or "
                "a debugger; SIGCONT continues it)\n")
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
