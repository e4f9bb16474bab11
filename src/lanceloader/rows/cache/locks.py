"""Cache locks: the ``flock`` of one name in a cache directory (:func:`locked`), its bounded
wait (:data:`LOCK_WAIT_S`: a test that changes it patches it here), and the warning, once per
process, of a failed directory (:func:`warn_once`), for
:class:`~lanceloader.rows.cache.disk.DiskCache` and the automatic cache.

Contract: a lock is an empty ``.<name>.lock`` file in the directory, locked with ``flock``; the
kernel releases it when its holder dies, so it is never stale. A wait for a live holder polls
and ends after :data:`LOCK_WAIT_S` with a :class:`~lanceloader.rows.cache.files.CacheLockTimeout`
that names the lock file and how to find its holder. Nothing here removes a file.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from lanceloader.rows.cache.files import LOCK, CacheLockTimeout

_logger = logging.getLogger("lanceloader")

# The longest wait for a lock that another thread or process holds (a piece being filled, the
# directory, a plan being made): far longer than any fill, so only a stuck holder reaches it.
LOCK_WAIT_S = 600.0

_WARNED: set[tuple[str, str]] = set()
_WARNED_LOCK = threading.Lock()


def warn_once(root: Path, what: str, message: str) -> None:
    """Log ``message`` once per process for the cache ``root`` and kind of failure ``what``."""
    with _WARNED_LOCK:
        if (os.fspath(root), what) in _WARNED:
            return
        _WARNED.add((os.fspath(root), what))
    _logger.warning("%s", message)


@contextlib.contextmanager
def locked(root: Path, name: str, block: bool) -> Iterator[bool]:
    """Hold the lock of ``name`` in the directory ``root`` (``.lock`` file; a dead holder's
    lock is released by the kernel). Yields False, without waiting, when another holds it and
    ``block`` is False; with ``block``, waits at most :data:`LOCK_WAIT_S` (polling), then raises
    :class:`CacheLockTimeout`: a holder that is alive but stuck never hangs its waiters.
    A removed directory is made again; an unwritable one raises ``OSError``."""
    path = root / f".{name}{LOCK}"
    try:
        fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    except FileNotFoundError:
        root.mkdir(parents=True, exist_ok=True)  # removed while in use
        warn_once(
            root,
            "removed",
            f"the cache directory {os.fspath(root)!r} "
            "was removed while in use: made it again (its pieces are downloaded "
            "again); give the loader a directory nothing else cleans",
        )
        fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        deadline, pause = time.monotonic() + LOCK_WAIT_S, 0.001
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not block:
                    yield False
                    return
                if time.monotonic() >= deadline:
                    raise CacheLockTimeout(
                        f"waited {LOCK_WAIT_S:.0f} s for {os.fspath(path)!r}, held by another "
                        f"thread or process using the cache {os.fspath(root)!r} that "
                        "seems stuck (a dead one releases it at once). Find it with `fuser "
                        f"{os.fspath(path)}` and stop it, or give this loader another "
                        "cache directory",
                        os.fspath(root),
                    ) from None
                time.sleep(pause)
                pause = min(2 * pause, 0.05)
        yield True
    finally:
        os.close(fd)  # closing releases the lock
