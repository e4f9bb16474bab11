"""The automatic cache (``cache="auto"``, the Loader's default): which cache a loader gets when
it was given none, and the shared directory's lifetime.

A shuffle, or any order on an object store, gets a :class:`~lanceloader.rows.cache.pieces.DiskCache` in
one directory per user and machine under ``/dev/shm`` (:func:`auto_cache_root`), when the
projected columns fit the budget (:func:`auto_budget`: the lesser of half the free ``/dev/shm``
and a quarter of the available memory); a sequential local read gets none (:func:`auto_choice`,
pure). Its directory is in memory (``DiskCache(in_memory=True)``: every piece read whole,
checked and held in each process that reads it, within a share of the memory available). Every process using the
directory holds a shared ``flock`` on it; the last one's sweeper process removes it once that
process has exited, even SIGKILLed (:func:`join_auto_cache`).

Example:
    >>> auto_choice(random_order=False, object_store=False, data_bytes=1e6, budget=1 << 30)
    'a sequential read of local data gains nothing from a cache'
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from lanceloader.lifecycle import lifetime
from lanceloader.rows.cache.budget import ESTIMATE_MARGIN, used_bytes
from lanceloader.rows.cache.disk import DiskCache
from lanceloader.rows.cache.files import CacheLockTimeout
from lanceloader.rows.cache.held import memory_available
from lanceloader.rows.cache.locks import LOCK_WAIT_S
from lanceloader.units import format_bytes

# The automatic cache's budget: at most these shares of the free space of /dev/shm and of the
# memory available (MemAvailable): /dev/shm's pages are memory that the kernel cannot reclaim,
# so the cache never takes more than a quarter of what the machine could still give.
AUTO_SHM_SHARE = 0.5
AUTO_MEMORY_SHARE = 0.25
AUTO_SHM_DIR = Path("/dev/shm")
AUTO_DIR_VARIABLE = "LANCELOADER_AUTO_CACHE_DIR"  # another parent directory than /dev/shm
# The directory's name (no "-": lifetime.py's owner rules never mistake it for a file of theirs)
AUTO_NAME = "lanceloader_autocache"
USERS_LOCK = ".users.lock"  # every process using the directory holds a shared flock on it
# Run in a process of its own (python -c): waits for its owner to exit, then removes the
# directory if no other process uses it (none holds a shared lock on USERS_LOCK).
_SWEEPER = f"""
import fcntl, os, select, shutil, sys, time
owner, root = int(sys.argv[1]), sys.argv[2]
try:
    fd = os.pidfd_open(owner)
    select.select([fd], [], [])
except (AttributeError, OSError):
    while True:
        try:
            os.kill(owner, 0)
        except ProcessLookupError:
            break
        except PermissionError:
            pass
        time.sleep(0.25)
try:
    lock = os.open(os.path.join(root, {USERS_LOCK!r}), os.O_RDWR)
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
except OSError:
    sys.exit(0)
shutil.rmtree(root, ignore_errors=True)
"""
_joined: dict[str, tuple[int, int]] = {}  # root -> (pid, fd of the shared lock) in this process
_joined_lock = threading.Lock()
_sweepers: list[subprocess.Popen[bytes]] = []  # kept: a collected Popen warns that it runs


def _forget_joined_in_child() -> None:
    """In a forked child: close the inherited shared locks (the parent's, which the parent's
    own descriptor keeps; held here, they would keep the directory after every user died) and
    forget the parent's sweepers; a child that makes a loader joins on its own."""
    global _joined_lock
    _joined_lock = threading.Lock()  # another thread may have held it at the fork
    for _, fd in _joined.values():
        with contextlib.suppress(OSError):
            os.close(fd)
    _joined.clear()
    _sweepers.clear()


os.register_at_fork(after_in_child=_forget_joined_in_child)


def auto_budget(shm_free: int, memory: int, used: int = 0) -> int:
    """The automatic cache's cap: :data:`AUTO_SHM_SHARE` of the free space of ``/dev/shm`` and
    :data:`AUTO_MEMORY_SHARE` of the available memory, whichever is less; ``used``, the bytes
    the cache directory holds already (reusable or evictable), counts as free in both.

    >>> auto_budget(shm_free=64 << 30, memory=100 << 30) == 25 << 30
    True
    >>> auto_budget(shm_free=8 << 30, memory=100 << 30) == 4 << 30
    True
    """
    return int(min(AUTO_SHM_SHARE * (shm_free + used), AUTO_MEMORY_SHARE * (memory + used)))


def auto_choice(
    random_order: bool, object_store: bool, data_bytes: float, budget: int
) -> str | None:
    """Why the automatic cache is not used, or None when it is: it is used when it pays (a
    shuffle, full or block, reads at random; an object store pays a round trip per request) and
    fits (the projected columns, ``data_bytes`` with :data:`ESTIMATE_MARGIN`, within
    ``budget``). Pure.

    >>> auto_choice(True, False, 1e9, 4 << 30) is None
    True
    >>> auto_choice(False, False, 1e9, 4 << 30)
    'a sequential read of local data gains nothing from a cache'
    >>> auto_choice(True, False, 8e9, 4 << 30)
    'the projected columns (~10.0 GB with margin) exceed the budget (4.3 GB)'
    """
    if not (random_order or object_store):
        return "a sequential read of local data gains nothing from a cache"
    if data_bytes * ESTIMATE_MARGIN > budget:
        return (
            f"the projected columns (~{data_bytes * ESTIMATE_MARGIN / 1e9:,.1f} GB with "
            f"margin) exceed the budget ({budget / 1e9:,.1f} GB)"
        )
    return None


def auto_parent() -> Path:
    """Where the automatic cache's directory is made: ``/dev/shm``, or the directory that the
    environment variable :data:`AUTO_DIR_VARIABLE` names (a test session's own, a local disk
    where ``/dev/shm`` is small); its free space enters the budget."""
    return Path(os.environ.get(AUTO_DIR_VARIABLE) or AUTO_SHM_DIR)


def auto_cache_root() -> Path:
    """The automatic cache's directory: one per user and machine (PID namespace), under
    :func:`auto_parent`, shared by the ranks, loaders and process workers of that machine."""
    return auto_parent() / f"{AUTO_NAME}_u{os.getuid()}_{lifetime.NAMESPACE}"


def join_auto_cache(root: Path) -> None:
    """Use the automatic cache directory ``root`` from this process until it exits: hold a
    shared ``flock`` on its :data:`USERS_LOCK` (the kernel drops it when the process dies, even
    SIGKILLed) and start a sweeper process that, once this process has exited, removes the
    directory unless another process still holds the lock (the last one's sweeper removes it).
    Files left by users that all died with their sweepers are removed here, before joining.
    Once per process and directory; every wait is bounded by :data:`LOCK_WAIT_S`."""
    key = os.fspath(root)
    with _joined_lock:
        if key in _joined and _joined[key][0] == os.getpid():
            return
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            root.mkdir(mode=0o700, exist_ok=True)
            fd = os.open(root / USERS_LOCK, os.O_CREAT | os.O_RDWR, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # nobody uses it: leftovers
                for entry in os.scandir(root):
                    if entry.name != USERS_LOCK:
                        with contextlib.suppress(OSError):
                            if entry.is_dir(follow_symlinks=False):
                                shutil.rmtree(entry.path)
                            else:
                                os.unlink(entry.path)
                fcntl.flock(fd, fcntl.LOCK_SH)  # a conversion: no sweeper can take it between
            except BlockingIOError:
                try:
                    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                except BlockingIOError:  # a sweeper removes it now: wait, then make it again
                    os.close(fd)
                    if time.monotonic() >= deadline:
                        raise CacheLockTimeout(
                            f"could not join the automatic cache {key!r} within "
                            f"{LOCK_WAIT_S:.0f} s: a process holds {USERS_LOCK} exclusively. "
                            "Pass cache=None (no cache) or cache= a directory of your own",
                            key,
                        ) from None
                    time.sleep(0.01)
                    continue
            try:  # removed by a sweeper between open and lock: that file is gone, join again
                same = os.stat(root / USERS_LOCK).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        old = _joined.get(key)
        if old is not None:  # inherited over fork: the parent's lock; this process takes its own
            with contextlib.suppress(OSError):
                os.close(old[1])
        _joined[key] = (os.getpid(), fd)
        _sweepers.append(
            subprocess.Popen(
                [sys.executable, "-c", _SWEEPER, str(os.getpid()), key],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                close_fds=True,
                start_new_session=True,
            )
        )


def auto_cache(
    random_order: bool, object_store: bool, data_bytes: float, cache_size: int | None = None
) -> tuple[DiskCache | None, str]:
    """The cache ``cache="auto"`` chooses (see :func:`auto_choice`; ``cache_size`` replaces
    the budget), and why, in words for ``stats()``: a :class:`DiskCache` in
    :func:`auto_cache_root` (``in_memory=True``: pieces read whole and held, within a share of
    the memory available, :mod:`lanceloader.rows.cache.held`), joined by this process
    (:func:`join_auto_cache`), or None."""
    root = auto_cache_root()
    used = 0
    with contextlib.suppress(OSError):
        used = used_bytes(root) if root.is_dir() else 0
    try:
        shm_free = shutil.disk_usage(auto_parent()).free
    except OSError:
        return None, f"auto: none ({os.fspath(auto_parent())} is missing)"
    budget = auto_budget(shm_free, memory_available(), used) if cache_size is None else cache_size
    why_not = auto_choice(random_order, object_store, data_bytes, budget)
    if why_not is not None:
        return None, f"auto: none ({why_not})"
    try:
        join_auto_cache(root)
    except OSError as exc:
        return None, f"auto: none ({os.fspath(root)}: {exc.strerror or exc})"
    disk = DiskCache(root, budget, in_memory=True)
    disk.remove_dead_temporaries()
    why = "a shuffle reads at random" if random_order else "an object store pays per request"
    return disk, (
        f"auto: {os.fspath(root)} ({why}; ~{format_bytes(data_bytes)} of projected "
        f"columns within a {budget / 1e9:,.1f} GB budget)"
    )
