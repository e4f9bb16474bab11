"""How a process worker starts and what it runs: forked from a clean forkserver, never running
the user's main module, its work unpickled once, then one task after another.

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

A worker gets its work once, at start (:func:`worker_main`): the pickle, less its large arrays,
which lie in one shared-memory file of the pool that every worker maps copy-on-write
(:class:`~lanceloader.engine.pickling.Shipment`), so what is sent to each worker does not grow
with the dataset (a filter's row list, a table of fragments). It then runs tasks until told to
stop, until its pipe closes, or until the consumer dies (:mod:`lanceloader.lifecycle.lifetime`).
"""

from __future__ import annotations

import faulthandler
import io
import itertools
import multiprocessing as mp
import os
import re
import signal
import time
import traceback
from multiprocessing import forkserver, popen_forkserver, reduction, spawn, util
from multiprocessing.connection import Connection
from multiprocessing.context import set_spawning_popen
from pathlib import Path
from typing import Any

from lanceloader.engine.memory import reuse_freed_memory
from lanceloader.engine.pickling import dumps
from lanceloader.engine.segments import Segments
from lanceloader.engine.transport import load_shipped
from lanceloader.lifecycle import lifetime
from lanceloader.lifecycle.lifetime import SHM_DIR, picklable_error

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


def worker_main(
    work: tuple[bytes, list[tuple[int, int]], str],
    tasks: Connection,
    results: Connection,
    prefix: str,
    owner: int,
) -> None:
    """Load the work (:func:`~lanceloader.engine.transport.load_shipped`: its pickle, and its
    large arrays from the pool's file), then run tasks until told to stop, or until the consumer
    (``owner``) goes away."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    reuse_freed_memory()
    lifetime.watch_owner(owner)
    # Appending: the consumer truncates the file before it asks for a stack.
    stack_file = open(SHM_DIR / f"{prefix}-{os.getpid()}-stack", "a")  # noqa: SIM115
    faulthandler.register(STACK_SIGNAL, file=stack_file, all_threads=True)
    fn = load_shipped(*work)
    counter = itertools.count()
    segments = Segments(SHM_DIR / f"{prefix}-{os.getpid()}-ring")
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
            with segments.arena() as arena:  # a gather's columns straight into shared memory
                payload: tuple[Any, ...] = ("ok", index, *segments.pack(fn(task), path, arena))
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


FRAME = re.compile(r'File ".*", line \d+ in (\S+)')


def task_thread(stack: str) -> str:
    """The thread of a faulthandler dump that runs tasks (the whole dump if none does)."""
    for section in stack.split("\n\n"):
        if "in worker_main" in section:
            return section.rstrip("\n") + "\n"
    return stack
