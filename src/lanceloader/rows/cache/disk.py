"""Disk cache: :class:`DiskCache`, the cache's pieces, plans and byte ranges as files in one
directory, shared by every worker, loader and process of the machine that uses it. What it
does and guarantees (one download per piece, checked files, the cap at every instant, mapped
pieces, degrading on a failed directory) is told in :mod:`lanceloader.rows.cache.pieces`.

Here: the get/fill/map path (open and check a file, hold or map a piece, drop a damaged file,
one fill per name under its lock, write and publish a file), the limits it reads
(:data:`HELD_BYTES`, :data:`LOCK_WAIT_S` and the rest: a test that changes one patches it
here) and the warning, once per process, of a failed directory (:func:`warn_once`). Keeping
the directory within its cap (reserving room, evicting, counting bytes, dead writers'
temporaries) is :mod:`lanceloader.rows.cache.budget`; the files' names, format, checks and
errors are :mod:`lanceloader.rows.cache.files`.

Contract: a ``DiskCache`` runs in any thread or process that holds it (it pickles as its
directory, size and ``mapped``); what it keeps in memory (checked versions, held and mapped
pieces, counters) is per object, in its process (pieces and counters change under its
``threading.Lock``). Across processes it locks with ``flock``s, released by the kernel when a
holder dies: a name's while one process makes it, the directory's around every reservation
and rename (the budget's functions run under it). It cleans up its own files: a damaged file
dropped when found, its own reservation when a write fails, least recently used files and
dead writers' temporaries by the next eviction or :meth:`DiskCache.remove_dead_temporaries`.
The directory is its owner's: a ``DiskCache`` never removes it (the automatic cache's sweeper
does, :mod:`lanceloader.rows.cache.auto`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import io
import logging
import mmap
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from lanceloader.rows.cache.budget import (
    fits_whole,
    remove_dead_temporaries,
    reserve,
    temporary_path,
    used_bytes,
)
from lanceloader.rows.cache.files import (
    BYTES_SUFFIX,
    LOCK,
    SUFFIX,
    TRAILER,
    CacheLockTimeout,
    DamagedFile,
    OlderFile,
    PieceFile,
    batch_rows_of,
    bytes_name,
    cache_failure,
    check_sealed,
    made_bytes,
    mark_checked,
    read_trailer,
    seal,
    was_checked,
)

_logger = logging.getLogger("lanceloader")

# Pieces a process read whole (a read wanted most of their record batches) stay in its memory,
# least recently used out first, within this many bytes per process: a full shuffle wants a few
# rows of every piece in every batch, and reading them again with pread would copy each piece
# once per batch. A held piece is served while its file is unchanged (one stat per read).
HELD_BYTES = 256 << 20
# A piece is read whole (one pread) and held when at least this many of its size fit HELD_BYTES;
# a larger one (rows wider than the piece size assumes) is read by record batch (PieceFile).
HELD_PIECES_AT_LEAST = 8
# A held piece is evicted for another only once unused this long: a full shuffle wants every
# piece in every read, and least-recently-used eviction of pieces used in turn (more of them
# than HELD_BYTES holds) would drop each just before its next use, reading every piece whole
# for every read. The pieces held stay; the others are read from their files.
HELD_IDLE_S = 5.0
# A held piece's file has its access time touched (the eviction's "recently used") at most this
# often.
TOUCH_EVERY_S = 30.0
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


class DiskCache:
    """Pieces as Arrow IPC files in ``root``, at most ``size`` bytes; see the module's text.

    Pickles as its directory and size: workers and helper processes open the same directory.
    Counters of this object (in this process): ``fills`` (pieces it downloaded and kept),
    ``damaged`` (files that failed their check, dropped and read again from the dataset) and
    ``not_kept`` (pieces it could not keep: the cap, a full disk, a read-only directory).
    ``mapped``: pieces are mapped rather than copied into the process (see the module's text).
    """

    def __init__(self, root: str | os.PathLike[str], size: int, mapped: bool = False) -> None:
        self.root = Path(root)
        self._root_text = os.fspath(self.root)
        self.size = int(size)
        self.mapped = bool(mapped)  # pieces are mapped, not copied (the automatic cache)
        self.fills = 0
        self.damaged = 0
        self.not_kept = 0
        self.writable = True  # False after a write failed: reads go on, uncached
        self._count = threading.Lock()
        # name -> (inode, size, mtime, extra) of the file version this object checked
        self._checked: dict[str, tuple[int, int, int, int]] = {}
        self._too_big: set[str] = set()
        # name -> (file version, table, last touch) of pieces read whole (HELD_BYTES)
        self._held: OrderedDict[str, tuple[tuple[int, int, int], pa.Table, float]] = OrderedDict()
        self._held_bytes = 0
        # name -> (file version, table over the mapped file, last touch): pieces of a mapped
        # cache, not counted in HELD_BYTES (the pages are the directory's own, shared)
        self._mapped: OrderedDict[str, tuple[tuple[int, int, int], pa.Table, float]] = \
            OrderedDict()
        self._used_at: dict[str, float] = {}  # name -> last use of a held piece (monotonic)
        self.reads_whole = 0  # piece files read whole by this object (held or not)
        self._unremovable: set[tuple[str, tuple[int, int, int] | None]] = set()
        self._thread = threading.local()  # files this thread found damaged since take_damaged

    def __getstate__(self) -> dict[str, Any]:
        return {"root": self.root, "size": self.size, "mapped": self.mapped}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["root"], state["size"], state.get("mapped", False))  # type: ignore[misc]

    def __repr__(self) -> str:
        mapped = ", mapped=True" if self.mapped else ""
        return f"DiskCache({os.fspath(self.root)!r}, size={self.size}{mapped})"

    def _path(self, name: str) -> Path:
        return self.root / (name + SUFFIX)

    def _counted(self, counter: str) -> None:
        with self._count:
            setattr(self, counter, getattr(self, counter) + 1)

    # --- reading -------------------------------------------------------------------------

    def _open_checked(self, path: Path, name: str) -> tuple[pa.NativeFile, int, int] | None:
        """``path`` open and checked (once per file version in this object: a file replaced or
        written since is checked again), with its payload length and ``extra``; None when it is
        missing or failed its check (then it is dropped and counted in ``damaged``)."""
        try:
            file = pa.OSFile(os.fspath(path))
        except FileNotFoundError:
            return None
        except OSError as exc:  # unreadable: a permission, an I/O error
            warn_once(self.root, "unreadable", cache_failure(self.root, f"reading {path.name}",
                                                              exc, reading=True))
            return None
        fd = file.fileno()
        stat = os.fstat(fd)
        version = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
        try:
            known = self._checked.get(name)
            if known is not None and known[:3] == version:
                length, extra = stat.st_size - TRAILER.size, known[3]
            elif was_checked(fd, name, stat):  # checked by another process: the trailer only
                length, extra = read_trailer(fd, stat.st_size)
                self._checked[name] = (*version, extra)
            else:
                length, extra = check_sealed(fd, stat.st_size, name)
                mark_checked(fd, name, stat)
                self._checked[name] = (*version, extra)
        except (DamagedFile, OSError) as exc:
            file.close()
            self.drop(name, path, version, str(exc), damaged=not isinstance(exc, OlderFile))
            return None
        with contextlib.suppress(OSError):  # least recently used goes first (read-only: skip)
            os.utime(fd, ns=(time.time_ns(), stat.st_mtime_ns))
        return file, length, extra

    def get(self, name: str) -> PieceFile | pa.Table | None:
        """The piece ``name``, open and checked, or None when the cache lacks it (or its file
        was damaged: then it is dropped, counted in ``damaged`` and logged). A piece this
        process read whole comes from its memory while its file is unchanged."""
        held = self._held_piece(name)
        if held is not None:
            return held
        opened = self._open_checked(self._path(name), name)
        if opened is None:
            return None
        file, length, extra = opened
        stat = os.fstat(file.fileno())
        version = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
        try:
            if self.mapped:  # the checked version, mapped through its open descriptor
                with file:
                    view = mmap.mmap(file.fileno(), stat.st_size, prot=mmap.PROT_READ)
                table = pa.ipc.open_file(pa.py_buffer(view), footer_offset=length).read_all()
                self._forget_stale_mappings()
                with self._count:
                    self._mapped[name] = (version, table, time.monotonic())
                return table
            if length <= HELD_BYTES // HELD_PIECES_AT_LEAST:  # read whole, once, and held
                with file:
                    data = file.read_at(length, 0)
                if len(data) != length:
                    raise OSError(f"{len(data)} of its {length} bytes could be read")
                table = pa.ipc.open_file(pa.py_buffer(data)).read_all()
                held = self._hold(name, version, table)
                return table if held is None else held  # not held: gathered by record batch
            return PieceFile(file, length, extra,
                             on_read_whole=lambda table: self._hold(name, version, table))
        except (pa.ArrowInvalid, OSError) as exc:
            file.close()
            self.drop(name, self._path(name), None, f"unreadable Arrow file ({exc})")
            return None

    def take_damaged(self) -> int:
        """Files this thread found damaged (and dropped) since its last call: a read reports
        them with its rows (``Read.cache_damaged``, counted in ``stats()``)."""
        count, self._thread.damaged = getattr(self._thread, "damaged", 0), 0
        return count

    def _held_piece(self, name: str) -> pa.Table | None:
        """The piece ``name`` from this process's memory (read whole and held, or mapped), if
        its file is still that version (a file changed, replaced or removed since is read, or
        mapped, again)."""
        with self._count:
            kept = self._mapped if name in self._mapped else self._held
            entry = kept.get(name)
        if entry is None:
            return None
        version, table, touched = entry
        path = f"{self._root_text}/{name}{SUFFIX}"  # no Path: one stat per piece per read
        try:
            stat = os.stat(path)
        except OSError:
            stat = None
        with self._count:
            if stat is None or (stat.st_ino, stat.st_size, stat.st_mtime_ns) != version:
                if kept.pop(name, None) is not None and kept is self._held:
                    self._held_bytes -= table.nbytes
                return None
            if name not in kept:  # dropped by another thread meanwhile
                return None
            kept.move_to_end(name)
            now = time.monotonic()
            self._used_at[name] = now
            if now - touched >= TOUCH_EVERY_S:
                kept[name] = (version, table, now)
            else:
                return table
        with contextlib.suppress(OSError):  # least recently used goes first (read-only: skip)
            os.utime(path, ns=(time.time_ns(), stat.st_mtime_ns))
        return table

    def _forget_stale_mappings(self) -> None:
        """Unmap the pieces whose files were evicted or replaced since they were mapped (their
        pages stay in memory while mapped): done whenever a piece is mapped, so a process holds
        at most the stale pieces of the last pieces it read."""
        with self._count:
            entries = list(self._mapped.items())
        for name, (version, _, _) in entries:
            try:
                stat = os.stat(f"{self._root_text}/{name}{SUFFIX}")
                current = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
            except OSError:
                current = None
            if current != version:
                with self._count:
                    if self._mapped.get(name, (None,))[0] == version:
                        del self._mapped[name]

    def _hold(self, name: str, version: tuple[int, int, int], table: pa.Table
              ) -> pa.Table | None:
        """Keep a piece read whole in this process's memory, within :data:`HELD_BYTES`, as one
        chunk (a gather from one chunk needs no search of its record batches); returns the
        table held (one chunk), or None when it is not held. Room is made by evicting pieces
        unused for :data:`HELD_IDLE_S` only, least recently used first; without room, it is not
        held (nor copied into one chunk: the read gathers from its record batches)."""
        self._counted("reads_whole")
        if table.nbytes > HELD_BYTES:
            return None
        with self._count:
            old = self._held.pop(name, None)
            if old is not None:
                self._held_bytes -= old[1].nbytes
            now = time.monotonic()
            idle = 0
            for other in self._held:  # least recently used first
                if self._held_bytes - idle + table.nbytes <= HELD_BYTES:
                    break
                if now - self._used_at.get(other, 0.0) < HELD_IDLE_S:
                    return None  # the held pieces are in use: keep them
                idle += self._held[other][1].nbytes
            table = table.combine_chunks()  # a copy of one piece, once per process
            while self._held_bytes + table.nbytes > HELD_BYTES:
                dropped_name, (_, dropped, _) = self._held.popitem(last=False)
                self._used_at.pop(dropped_name, None)
                self._held_bytes -= dropped.nbytes
            self._held[name] = (version, table, now)
            self._used_at[name] = now
            self._held_bytes += table.nbytes
        return table

    def drop(self, name: str, path: Path, version: tuple[int, int, int] | None, why: str,
             damaged: bool = True) -> None:
        """Remove the damaged file ``path`` (only if it is still the version found damaged, not
        a fresh copy another process published meanwhile), count and log it: once per damaged
        file, by the thread that removed it (others that found it damaged meanwhile see it gone
        or replaced); a file that cannot be removed (a read-only cache) once per version.
        ``damaged=False`` (a file an older lanceloader wrote): removed and logged at INFO
        level, not counted or warned about."""
        self._checked.pop(name, None)
        with self._count:
            held = self._held.pop(name, None)
            if held is not None:
                self._held_bytes -= held[1].nbytes
            self._mapped.pop(name, None)
        found: tuple[int, int, int] | None = None
        try:
            stat = os.stat(path)
            found = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
            if version is not None and found != version:
                return  # replaced by a fresh copy meanwhile
            os.unlink(path)
        except FileNotFoundError:
            return  # another thread or process dropped it first
        except OSError:  # not removable (read-only): report each damaged version once
            with self._count:
                if (name, found) in self._unremovable:
                    return
                self._unremovable.add((name, found))
        if not damaged:
            _logger.info("cache file %s in the cache directory %r was %s: dropped; its rows are "
                         "read from the dataset again", path.name, os.fspath(self.root), why)
            return
        self._thread.damaged = getattr(self._thread, "damaged", 0) + 1
        self._counted("damaged")
        _logger.warning("cache file %s in the cache directory %r failed its check (%s): dropped; "
                        "its rows are read from the dataset again", path.name,
                        os.fspath(self.root), why)

    # --- locks ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def _lock(self, name: str, block: bool) -> Iterator[bool]:
        """Hold the lock of ``name`` (``.lock`` file; a dead holder's lock is released by the
        kernel). Yields False, without waiting, when another holds it and ``block`` is False;
        with ``block``, waits at most :data:`LOCK_WAIT_S` (polling), then raises
        :class:`CacheLockTimeout`: a holder that is alive but stuck never hangs its waiters.
        A removed directory is made again; an unwritable one raises ``OSError``."""
        path = self.root / f".{name}{LOCK}"
        try:
            fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
        except FileNotFoundError:
            self.root.mkdir(parents=True, exist_ok=True)  # removed while in use
            warn_once(self.root, "removed", f"the cache directory {os.fspath(self.root)!r} "
                      "was removed while in use: made it again (its pieces are downloaded "
                      "again); give the loader a directory nothing else cleans")
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
                            f"thread or process using the cache {os.fspath(self.root)!r} that "
                            "seems stuck (a dead one releases it at once). Find it with `fuser "
                            f"{os.fspath(path)}` and stop it, or give this loader another "
                            "cache directory", os.fspath(self.root)) from None
                    time.sleep(pause)
                    pause = min(2 * pause, 0.05)
            yield True
        finally:
            os.close(fd)  # closing releases the lock

    # --- filling -------------------------------------------------------------------------

    def keeps(self, name: str, estimate: float) -> bool:
        """Whether a piece ``name`` of about ``estimate`` bytes could be kept: worth
        downloading whole (else its rows are read as without a cache)."""
        return self.writable and name not in self._too_big and fits_whole(estimate, self.size)

    def fill(self, name: str, load: Callable[[], pa.Table], block: bool
             ) -> pa.Table | PieceFile | None:
        """The piece ``name``, from the cache or made by ``load()`` and published; one process
        or thread loads a piece at a time. Returns None, at once, when another is loading it
        and ``block`` is False."""
        return self.fill_piece(name, load, block)[0]

    def fill_piece(self, name: str, load: Callable[[], pa.Table], block: bool
                   ) -> tuple[pa.Table | PieceFile | None, bool]:
        """:meth:`fill`, and whether the piece is in the cache now (False: ``load()`` ran and
        the piece could not be kept, so its rows came from the dataset)."""
        with contextlib.ExitStack() as stack:
            try:
                held = stack.enter_context(self._lock(name, block))
            except CacheLockTimeout:
                raise
            except OSError as exc:  # a read-only or unusable directory: read without keeping
                self._stop_writing("locking a piece", exc)
                return load().combine_chunks(), False
            if not held:
                return None, False
            piece = self.get(name)
            if piece is not None:
                return piece, True
            table = load().combine_chunks()
            kept = self.put(name, table)
            if kept:
                self._counted("fills")
            return table, kept

    def put(self, name: str, table: pa.Table) -> bool:
        """Publish ``table`` as ``name`` (after evicting what the cap needs); returns whether it
        was kept (a table bigger than the cap, or a failed write, is not)."""
        batch_rows = max(1, table.num_rows) if self.mapped else batch_rows_of(table)
        # Serialized once, in memory (its exact size before reserving the file), then written
        # in one call: through a Python file object Arrow's writer made a bytes copy and a
        # Python call per buffer, and counting the size first serialized the table twice (a
        # piece of 16 MiB per ~50 ms; filling 272 MB cost 1.9 s of CPU, 7x an uncached read).
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table, max_chunksize=batch_rows)
        data = sink.getvalue()
        kept = self._publish(self._path(name), name, data, batch_rows)
        if not kept:
            if data.size + TRAILER.size > self.size:
                self._too_big.add(name)  # the estimate was low: never downloaded whole again
            self._counted("not_kept")
        return kept

    def load_or_make(self, name: str, make: Callable[[], np.ndarray]) -> tuple[np.ndarray, bool]:
        """The array ``name`` (a checked ``.npy`` file), made by ``make()`` once for everyone
        that asks for it at the same time; returns it and whether this call made it. A damaged
        file is dropped and made again; a directory that cannot be written (read-only, full)
        gives the array made here, unshared, with one warning."""
        path = self.root / (name + ".npy")
        array = self._load_array(path, name)
        if array is not None:
            return array, False
        try:
            with self._lock(name, block=True):
                array = self._load_array(path, name)
                if array is not None:
                    return array, False
                array = make()
                buffer = io.BytesIO()
                np.save(buffer, array)
                data = buffer.getvalue()
                self._publish(path, name, data)
        except CacheLockTimeout:
            raise
        except OSError as exc:
            self._stop_writing("locking a plan", exc)
            return make(), True
        return array, True

    def fetch_bytes(self, key: str, make: Callable[[], bytes]) -> bytes:
        """The bytes kept under ``key`` (any string: a byte range that is not rows, such as a
        video clip's range of a blob), made by ``make()`` when the cache lacks them.

        One ``make()`` per key at a time across the threads and processes that share the
        directory (the key's ``flock``, as for pieces: a waiter then reads the file the maker
        published). The file is written under a temporary name within the cap (least recently
        used files out first), sealed with a checksum trailer and renamed into place; a damaged
        file is dropped, counted in ``damaged`` and made again. Bytes that cannot be kept (larger
        than the cap, a full or read-only directory) are returned unkept: ``make()`` runs again
        at the next call. Counters: ``fills`` (kept), ``not_kept``. ``make()``'s errors reach
        the caller and keep nothing.

        >>> import tempfile
        >>> cache = DiskCache(tempfile.mkdtemp(), size=1 << 20)
        >>> cache.fetch_bytes("clip 7", lambda: b"abc"), cache.fetch_bytes("clip 7", lambda: b"?")
        (b'abc', b'abc')
        """
        name = bytes_name(key)
        path = self.root / (name + BYTES_SUFFIX)
        data = self._load_bytes(path, name)
        if data is not None:
            return data
        try:
            with self._lock(name, block=True):
                data = self._load_bytes(path, name)
                if data is not None:
                    return data
                data = made_bytes(key, make)
                if self._publish(path, name, data):
                    self._counted("fills")
                else:
                    self._counted("not_kept")
                return data
        except CacheLockTimeout:
            raise
        except OSError as exc:  # a read-only or unusable directory: made here, unkept
            self._stop_writing("locking a byte range", exc)
            self._counted("not_kept")
            return made_bytes(key, make)

    def _load_bytes(self, path: Path, name: str) -> bytes | None:
        """The checked payload of ``path``, or None when it is missing or was damaged (then
        dropped and counted by :meth:`_open_checked`)."""
        opened = self._open_checked(path, name)
        if opened is None:
            return None
        file, length, _ = opened
        try:
            data = bytes(file.read_at(length, 0))
        except OSError as exc:
            self.drop(name, path, None, f"unreadable ({exc})")
            return None
        finally:
            file.close()
        if len(data) != length:  # truncated between the check and the read
            self.drop(name, path, None, f"{len(data)} of its {length} bytes could be read")
            return None
        return data

    def _load_array(self, path: Path, name: str) -> np.ndarray | None:
        opened = self._open_checked(path, name)
        if opened is None:
            return None
        file, length, _ = opened
        try:
            data = file.read_at(length, 0)
            return np.load(io.BytesIO(data), allow_pickle=False)
        except (ValueError, OSError, SyntaxError, EOFError) as exc:  # checked, yet unparsable
            self.drop(name, path, None, f"unreadable array ({type(exc).__name__})")
            return None
        finally:
            file.close()

    def _stop_writing(self, what: str, exc: OSError) -> None:
        """A write to the directory failed: no more writes from this object; reads go on, those
        of pieces not kept from the dataset, as without a cache. Warns once."""
        self.writable = False
        warn_once(self.root, "write", cache_failure(self.root, what, exc))

    def _publish(self, path: Path, name: str, data: bytes | pa.Buffer, extra: int = 0) -> bool:
        """Make room for the file (the payload ``data`` and the trailer) and reserve it
        (a temporary file of exactly that size, so every other writer's eviction counts it:
        :func:`~lanceloader.rows.cache.budget.reserve`), under the directory's lock; then,
        without the lock (writers in parallel), write the payload, seal it (a trailer with the
        checksum of ``data`` as it is in memory: reading the file back to sum it cost a third
        of filling the automatic cache) and rename it into place (atomic: readers see the whole
        file or none; a reader checks the file's bytes against the trailer). Never
        more than the cap in the directory, temporary files included. Returns whether the file
        was published; a failed write (full disk, read-only directory) stops this object's
        writes with one warning, never raises."""
        payload = memoryview(data)
        length = payload.nbytes
        size = length + TRAILER.size
        if size > self.size or not self.writable:
            return False
        temporary = temporary_path(path)
        try:
            with self._lock("directory", block=True):
                if not reserve(self.root, self.size, temporary, size):
                    return False
            with open(temporary, "r+b") as file:
                file.write(payload)
                if file.tell() != length:
                    raise OSError(errno.EIO, f"wrote {file.tell()} bytes of {length}")
                file.write(seal(name, payload, extra))
                file.flush()
                stat = os.fstat(file.fileno())
                mark_checked(file.fileno(), name, stat)
            # Renamed under the lock too: a scan of the directory (under the lock) sees the file
            # under one of its names, never under none between them.
            with self._lock("directory", block=True):
                os.replace(temporary, path)
            self._checked[name] = (stat.st_ino, stat.st_size, stat.st_mtime_ns, extra)
            return True
        except CacheLockTimeout:
            raise
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            self._stop_writing(f"writing {path.name}", exc)
            return False
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise

    def remove_dead_temporaries(self) -> None:
        """Remove the temporary files of writers that died: they hold room under the cap
        until removed (:func:`~lanceloader.rows.cache.budget.remove_dead_temporaries`)."""
        remove_dead_temporaries(self.root)

    def used_bytes(self) -> int:
        """Bytes the cache's files take now (temporary reservations included)."""
        return used_bytes(self.root)
