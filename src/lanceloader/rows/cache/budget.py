"""Cache budget: what keeps a cache directory within its byte cap at every instant, for
:class:`~lanceloader.rows.cache.disk.DiskCache` (whose guarantees :mod:`lanceloader.rows.cache.pieces`
tells). A writer reserves its file's exact size before writing it (:func:`reserve`: a
temporary file of that size, :func:`temporary_path`, which every other writer's scan counts),
after evicting the least recently used files and removing temporary files of dead writers
(:func:`make_room`; which files go is :func:`evictions`, pure). Also here: the bytes the
directory takes (:func:`used_bytes`), the removal of dead writers' temporaries alone
(:func:`remove_dead_temporaries`), and the limits read by these functions
(:data:`ESTIMATE_MARGIN`, :data:`STALE_TEMPORARY_S`: a test that changes one patches it here).

Contract: functions of a directory and a cap; they run in whichever thread or process calls
them and keep no state (the directory is the state, shared by every process using it). They
take no lock: :func:`make_room` and :func:`reserve` must run under the directory's lock
(``DiskCache`` holds its ``flock`` around them, and around the rename that publishes a
reservation, so a scan sees each file under one of its names), so two writers never count the
same room. :func:`used_bytes` and :func:`remove_dead_temporaries` need none: a count is a
snapshot, and a dead writer's file is written by nobody. Cleaning up: an eviction removes the
least recently used files (pieces, plans, byte ranges; never a ``.lock`` file) and the
temporary files of dead writers; a live writer removes its own reservation when its write
fails (``DiskCache``); nothing here removes the directory. Nothing here imports the caches
(:mod:`lanceloader.rows.cache.disk`, :mod:`lanceloader.rows.cache.pieces`), which build on it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
import time
from pathlib import Path

from lanceloader.lifecycle import lifetime
from lanceloader.rows.cache.files import LOCK, TEMPORARY

# Temporary files of a writer in another PID namespace are removed by an eviction once this old
# (those of a dead writer of this namespace at once).
STALE_TEMPORARY_S = 3600.0
# A piece's estimated bytes (rows x the source's bytes per row) times this must fit the cap
# for the piece to be downloaded whole: IPC framing, and rows wider than the estimate.
ESTIMATE_MARGIN = 1.25


def fits_whole(estimate: float, cap: int) -> bool:
    """Whether a piece of about ``estimate`` bytes, with :data:`ESTIMATE_MARGIN`, fits ``cap``.

    >>> fits_whole(800, 1000), fits_whole(801, 1000)
    (True, False)
    """
    return estimate * ESTIMATE_MARGIN <= cap


def temporary_path(path: Path) -> Path:
    """The temporary file that reserves ``path``'s room while this thread writes it: named by
    this PID namespace, process and thread (:func:`writer_alive` reads them back)."""
    return path.with_name(
        f"{TEMPORARY}{lifetime.NAMESPACE}-{os.getpid()}-{threading.get_ident()}-{path.name}"
    )


def writer_alive(entry: str) -> bool:
    """Whether the writer of the temporary file ``entry`` may still be writing it: its process
    (named in the file's name, in this PID namespace) is alive. Files of another namespace count
    as alive until :data:`STALE_TEMPORARY_S`.

    >>> writer_alive(temporary_path(Path("cache/piece.arrow")).name)  # this process's
    True
    """
    parts = entry[len(TEMPORARY) :].split("-")
    if len(parts) < 3 or parts[0] != lifetime.NAMESPACE or not parts[1].isdigit():
        return True
    try:
        os.kill(int(parts[1]), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def evictions(
    files: list[tuple[float, int, str]], used: int, size: int, cap: int
) -> tuple[list[str], int]:
    """The files to remove, least recently used first, for ``size`` more bytes to fit under
    ``cap`` when ``used`` bytes are taken, and the bytes taken once they are removed; ``files``
    are (access time, size, path). All of them, and still too many bytes, when live
    reservations hold the room.

    >>> files = [(3.0, 40, "c"), (1.0, 30, "a"), (2.0, 50, "b")]
    >>> evictions(files, used=120, size=30, cap=100)
    (['a', 'b'], 40)
    >>> evictions(files, used=120, size=30, cap=150)
    ([], 120)
    """
    removed = []
    for _, file_size, path in sorted(files):
        if used + size <= cap:
            break
        removed.append(path)
        used -= file_size
    return removed, used


def make_room(root: Path, size: int, cap: int) -> bool:
    """Remove least recently used files of ``root`` (and temporary files of dead writers) until
    ``size`` more bytes fit under ``cap``; False when they cannot (live writers' reservations
    hold the room). Under the directory's lock."""
    files, used, now = [], 0, time.time()
    for entry in os.scandir(root):
        if entry.name.endswith(LOCK):
            continue
        try:
            stat = entry.stat()
        except FileNotFoundError:
            continue
        if not entry.name.startswith(TEMPORARY):
            files.append((stat.st_atime, stat.st_size, entry.path))
        elif not writer_alive(entry.name) or now - stat.st_mtime > STALE_TEMPORARY_S:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)
            continue
        used += stat.st_size
    removed, used = evictions(files, used, size, cap)
    for path in removed:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    return used + size <= cap


def reserve(root: Path, cap: int, temporary: Path, size: int) -> bool:
    """Make room for ``size`` bytes under ``cap`` (:func:`make_room`) and reserve it: create
    ``temporary`` (:func:`temporary_path`) with exactly that size, so every other writer's scan
    counts it. False, creating nothing, when the room cannot be made; a failed creation raises
    ``OSError`` (the caller removes ``temporary``). Under the directory's lock."""
    if not make_room(root, size, cap):
        return False
    fd = os.open(temporary, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644)
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise
        os.ftruncate(fd, size)  # no fallocate here: its size still counts
    finally:
        os.close(fd)
    return True


def remove_dead_temporaries(root: Path) -> None:
    """Remove the temporary files of writers that died (a SIGKILLed worker's): they hold room
    under the cap until removed. Silent when the directory cannot be written."""
    with contextlib.suppress(OSError):
        for entry in os.scandir(root):
            if entry.name.startswith(TEMPORARY) and not writer_alive(entry.name):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)


def used_bytes(root: Path) -> int:
    """Bytes the files of ``root`` take now (temporary reservations included, ``.lock`` files
    not)."""
    used = 0
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(root):
            with contextlib.suppress(FileNotFoundError):  # evicted meanwhile
                used += 0 if entry.name.endswith(LOCK) else entry.stat().st_size
    return used
