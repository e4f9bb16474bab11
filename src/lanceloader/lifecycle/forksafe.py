"""Fork safety: never let a child that was forked after Lance ran touch Lance.

Why: Lance's Rust runtime parks idle threads in a process-wide hashtable (``parking_lot``). A
forked child inherits that table with entries for threads that do not exist in the child; the next
time the table grows, the child follows stale pointers and segfaults, or spins forever holding the
table's locks. Opening a dataset is enough to start those threads, and reopening the dataset in
the child does not help (the table is global). Measured with pylance 14: 6–8 of 20 such children
survive; children of a parent that only *imported* Lance, and children that never call Lance,
always do. (``docs/fork-safety.md`` has the evidence.)

What this module does:

* ``os.register_at_fork`` hooks count Lance's runtime threads (``/proc/self/task/*/comm``) right
  before any fork; a child of a process that had them is *tainted* (and so are its own children).
* In a tainted child, :class:`~lanceloader.rows.lance.source.Source` reads through a :class:`CleanReader`: a
  fresh interpreter started with ``fork`` + ``exec`` (nothing of the tainted state survives
  ``exec``), which opens the pinned dataset, reads, and hands the rows back as Arrow IPC in a
  ``/dev/shm`` file that the child maps without copying. It costs one interpreter start per
  process (about a second), and never hangs.
* Warnings: Lance warns "lance is not fork-safe" at *every* fork of a process that imported it,
  even where nothing is at risk (a forkserver that never ran Lance, a parent before its first
  read). That warning is silenced here; instead the first fork of a process that *has* run Lance
  warns once, naming the user's line (the first frame outside multiprocessing, torch, Lance and
  lanceloader) and the faster fix. Tainted children read silently.

Example::

    >>> tainted()      # this process was not forked from a Lance-using parent
    False
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pickle
import subprocess
import sys
import threading
import uuid
import warnings
from pathlib import Path
from typing import Any

import pyarrow as pa

from lanceloader.lifecycle import lifetime
from lanceloader.lifecycle.lifetime import SHM_DIR, picklable_error

LANCE_THREAD_PREFIXES = ("lance_backgroun", "lance-cpu")  # thread names, cut to 15 characters

_threads_at_fork = 0
_warned = False  # the one fork warning of this process was given
_tainted = False
_lance_used_here = False  # fallback where /proc is missing


def lance_runtime_threads() -> int:
    """Lance runtime threads alive in this process, or -1 if that cannot be known (no /proc)."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return -1
    count = 0
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/comm", "rb") as f:
                count += f.read().decode(errors="replace").startswith(LANCE_THREAD_PREFIXES)
        except OSError:
            pass  # the thread exited meanwhile
    return count


def note_lance_used() -> None:
    """Record that this process called Lance (used only where /proc cannot be read)."""
    global _lance_used_here
    _lance_used_here = True


def tainted() -> bool:
    """True in a process forked (directly or not) from one that had run Lance."""
    return _tainted


def _before_fork() -> None:
    global _threads_at_fork, _warned
    _threads_at_fork = lance_runtime_threads()
    if _threads_at_fork > 0 and not _warned:
        _warned = True
        _warn_at_user_line(
            "lanceloader: forking a process that has already run Lance (e.g. DataLoader workers "
            "with the default 'fork'). lanceloader's datasets in the children read through a "
            "clean helper process each (about a second to start) instead of hanging; Lance "
            "called directly in a child would hang. Faster: start workers with 'forkserver', "
            "e.g. DataLoader(..., multiprocessing_context='forkserver', persistent_workers=True) "
            "(docs/fork-safety.md). Said once per process."
        )


# Frames of these packages are not the user's line.
_NOT_USER = ("multiprocessing", "torch", "lance", "lanceloader", "concurrent", "threading")


def _warn_at_user_line(message: str) -> None:
    """A ``RuntimeWarning`` attributed to the innermost frame that is the user's code."""
    frame = sys._getframe(1)
    while frame is not None:
        parts = Path(frame.f_code.co_filename).parts
        if not any(p in _NOT_USER for p in parts) and "importlib" not in frame.f_code.co_filename:
            break
        frame = frame.f_back
    if frame is None:
        warnings.warn(message, RuntimeWarning, stacklevel=2)
        return
    warnings.warn_explicit(
        message,
        RuntimeWarning,
        frame.f_code.co_filename,
        frame.f_lineno,
        module=frame.f_globals.get("__name__", "__main__"),
        registry=frame.f_globals.setdefault("__warningregistry__", {}),
    )


def _after_fork_in_child() -> None:
    global _tainted
    unknown_but_used = _threads_at_fork < 0 and _lance_used_here
    _tainted = _tainted or _threads_at_fork > 0 or unknown_but_used


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)
# Lance's own warning fires at every fork, safe or not; the one above fires when it matters.
warnings.filterwarnings("ignore", message="lance is not fork-safe", category=UserWarning)


class CleanReader:
    """Reads of one :class:`Source`, served by a fresh interpreter (for tainted processes).

    Requests go over a pipe (pickled positions); rows come back as an Arrow IPC stream in a
    ``/dev/shm`` file that is mapped here and unlinked at once. The reader exits when this
    process closes the pipe or dies.
    """

    def __init__(self, source: Any) -> None:
        # No warning here: the parent said so once, at the fork (``_before_fork``).
        self._lock = threading.Lock()  # one request at a time on the pipe
        self._prefix = lifetime.shm_name("reader", os.getpid(), uuid.uuid4().hex[:8])
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "lanceloader.lifecycle._reader", self._prefix],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            close_fds=True,
        )
        self._send(source)

    def _send(self, obj: Any) -> None:
        assert self._proc.stdin is not None
        pickle.dump(obj, self._proc.stdin, protocol=pickle.HIGHEST_PROTOCOL)
        self._proc.stdin.flush()

    def read_rows(self, positions: Any) -> Any:
        """The source's ``Read`` of ``positions``, made in the clean reader process: the rows,
        the Lance I/O (bytes, IOPS) it took and the rows that came from the cache."""
        with self._lock:
            self._send(positions)
            try:
                kind, value = pickle.load(self._proc.stdout)  # type: ignore[arg-type]
            except EOFError:
                code = self._proc.wait()
                raise RuntimeError(f"the clean reader process exited with status {code}") from None
        if kind == "error":
            raise value
        path = Path(value.rows)  # the Read, its rows sent as a file
        with pa.memory_map(str(path)) as source:
            table = pa.ipc.open_stream(source).read_all()
        path.unlink(missing_ok=True)
        return dataclasses.replace(value, rows=table)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            if self._proc.stdin:
                self._proc.stdin.close()
        try:
            self._proc.wait(2)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        lifetime.remove_prefix(self._prefix)

    def __del__(self) -> None:
        if hasattr(self, "_proc"):
            self.close()


def serve(prefix: str) -> None:
    """The clean reader's loop: a Source, then positions until stdin closes, or until the
    process it serves dies (then it removes that process's files and exits)."""
    lifetime.watch_owner(lifetime.owner_of(prefix) or os.getppid())  # not a reparented ppid
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    source = pickle.load(stdin)
    for n in range(1 << 62):
        try:
            positions = pickle.load(stdin)
        except EOFError:
            return
        try:
            read = source.read_rows(positions)
            path = SHM_DIR / f"{prefix}-{n}"
            table = read.rows  # Lance rows read as one table (a mix's Pieces never come here)
            with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
                w.write_table(table)
            answer: tuple[Any, ...] = ("ok", dataclasses.replace(read, rows=str(path)))
        except Exception as exc:
            answer = ("error", picklable_error(exc))
        try:
            pickle.dump(answer, stdout, protocol=pickle.HIGHEST_PROTOCOL)
            stdout.flush()
        except OSError:  # BrokenPipeError: the process it serves is gone
            if answer[0] == "ok":
                Path(answer[1].rows).unlink(missing_ok=True)
            return
