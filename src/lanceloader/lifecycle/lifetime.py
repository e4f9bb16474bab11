"""Lifetime: nothing the loader starts outlives the training process, even one that is SIGKILLed.

The OOM killer sends SIGKILL: no ``finally``, no ``atexit``, no finalizer runs in the training
process. What it started must notice and clean up by itself:

* **Shared-memory files** are named ``lanceloader-<kind>-<owner pid>-<pid namespace>-<...>``,
  where the owner is the training process (the one whose pool or DataLoader reads them).
  :func:`remove_files_of` removes an owner's files; :func:`remove_orphans` removes every file
  whose owner no longer exists, and runs whenever a process pool or a DataLoader transport
  starts, so a survivor or the next start removes what a crash left. Only files of this PID
  namespace are judged: containers that share ``/dev/shm`` but not PIDs never remove each
  other's files.
* **Helper processes** (process workers, DataLoader workers running our datasets, the clean
  reader) call :func:`watch_owner` once: a daemon thread waits for the owner to exit (a Linux
  ``pidfd``, which also wakes for an owner that is dead but not yet reaped; elsewhere a poll every
  :data:`POLL_S` seconds), then removes the owner's files and ends the helper with ``os._exit``.
  A forkserver exits by itself once the last process that holds its pipe (the owner and the
  forkserver's children) is gone, so the forkserver follows its workers.

What remains impossible: a helper that is stopped (SIGSTOP) cannot run its watcher until it is
continued; and files whose owner died while no helper was alive stay until the next pool or
DataLoader starts on the machine (or a reboot: ``/dev/shm`` is RAM).

>>> name = shm_name("pool", 123, "ab12", 0)
>>> name == f"lanceloader-pool-123-{NAMESPACE}-ab12-0", owner_of(name), namespace_of(name)
(True, 123, True)
"""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import threading
import time
from collections.abc import Callable
from pathlib import Path

SHM_DIR = Path("/dev/shm")
PREFIX = "lanceloader"
POLL_S = 0.25  # where pidfds are missing: how often a watcher checks its owner

_watching: set[tuple[int, int]] = set()  # (this pid, owner pid): one watcher per pair
_lock = threading.Lock()


def _pid_namespace() -> str:
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return "0"


NAMESPACE = _pid_namespace()  # PIDs name processes only within one PID namespace


def shm_name(kind: str, owner: int, *rest: object) -> str:
    """The name of a shared-memory file of ``kind`` owned by process ``owner`` (of this PID
    namespace)."""
    return "-".join([PREFIX, kind, str(owner), NAMESPACE, *map(str, rest)])


def owner_of(name: str) -> int | None:
    """The owner pid in a name made by :func:`shm_name`, or None for a name of another form."""
    parts = name.split("-")
    if len(parts) < 4 or parts[0] != PREFIX or not parts[2].isdigit():
        return None
    return int(parts[2])


def namespace_of(name: str) -> bool:
    """Whether a name made by :func:`shm_name` comes from this PID namespace."""
    parts = name.split("-")
    return len(parts) >= 4 and parts[3] == NAMESPACE


def process_state(pid: int) -> str:
    """The kernel's one-letter state of process ``pid`` (``R``, ``S``, ``T`` for stopped, ``Z``
    for exited but not yet reaped), ``-`` when there is no such process, or ``?`` where it cannot
    be read (no ``/proc``)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0].decode()
    except FileNotFoundError:
        return "-"
    except (OSError, IndexError):
        return "?"


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and has not exited (a zombie counts as exited)."""
    state = process_state(pid)
    if state != "?":
        return state not in ("-", "Z", "X")
    try:  # no /proc: ask the kernel
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_prefix(prefix: str) -> None:
    """Remove the shared-memory files whose names start with ``prefix + "-"`` (one pool's, one
    worker's, one reader's)."""
    for leftover in SHM_DIR.glob(f"{prefix}-*"):
        leftover.unlink(missing_ok=True)


def remove_files_of(owner: int) -> int:
    """Remove the shared-memory files of ``owner``; returns how many were removed."""
    removed = 0
    for path in SHM_DIR.glob(f"{PREFIX}-*-{owner}-{NAMESPACE}-*"):
        if owner_of(path.name) == owner and namespace_of(path.name):
            with contextlib.suppress(OSError):
                path.unlink()
                removed += 1
    return removed


def remove_orphans() -> int:
    """Remove every shared-memory file of ours whose owner process is gone (a SIGKILLed
    training process); returns how many were removed. Files of live owners are never touched."""
    removed = 0
    with contextlib.suppress(OSError):
        owners = {owner_of(p.name) for p in SHM_DIR.glob(f"{PREFIX}-*") if namespace_of(p.name)}
        for owner in owners - {None}:
            assert owner is not None
            if owner != os.getpid() and not alive(owner):
                removed += remove_files_of(owner)
    return removed


def watch_owner(owner: int) -> None:
    """End this process (``os._exit(1)``) soon after process ``owner`` exits, removing the
    owner's shared-memory files first. Idempotent per process; a no-op for ``owner == getpid()``.

    For processes that serve ``owner`` and have no other reason to live (workers): their own
    parent may be a forkserver that outlives the owner, so waiting for EOF or watching the parent
    is not enough. E.g. in a torch ``worker_init_fn``::

        watch_owner(multiprocessing.parent_process().pid)

    >>> watch_owner(os.getpid())  # a no-op in the owner itself
    """
    key = (os.getpid(), owner)
    if owner == os.getpid():
        return
    with _lock:
        if key in _watching:
            return
        _watching.add(key)
    threading.Thread(
        target=_exit_after, args=(owner,), name="lanceloader-owner-watch", daemon=True
    ).start()


def _exit_after(owner: int) -> None:
    wait_for_exit(owner)
    remove_files_of(owner)
    os._exit(1)


def wait_for_exit(pid: int) -> None:
    """Block until process ``pid`` has exited (at once if it already has)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    except (AttributeError, OSError):  # no pidfd on this system: poll
        while alive(pid):
            time.sleep(POLL_S)
        return
    try:
        poller = select.poll()  # not select(): it cannot take descriptors >= 1024
        poller.register(fd, select.POLLIN)
        while not poller.poll():
            pass
    finally:
        os.close(fd)


def picklable_error(
    exc: BaseException, dumps: Callable[[BaseException], bytes] = pickle.dumps
) -> BaseException:
    """``exc`` if it survives pickling with ``dumps`` (process workers pass cloudpickle's, which
    also carries exception classes defined in ``__main__``), else a ``RuntimeError`` naming its
    type and message: what may cross to another process."""
    try:
        pickle.loads(dumps(exc))
        return exc
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")
