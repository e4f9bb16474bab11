"""Disk cache: :class:`DiskCache`, the cache's pieces, plans and byte ranges as files in one
directory, shared by every worker, loader and process of the machine that uses it. What it
does and guarantees (one download per piece, checked files, the cap at every instant, pieces
held in memory, degrading on a failed directory) is told in :mod:`lanceloader.rows.cache.pieces`.

Here: the get/fill path (read a file into this process and check the copy, drop a damaged
file, one fill per name under its lock, write and publish a file), the lock wait
(:data:`LOCK_WAIT_S`: a test that changes it patches it here) and the warning, once per
process, of a failed directory (:func:`warn_once`). Which checked pieces stay in the process's
memory, and its budget, is :mod:`lanceloader.rows.cache.held`; keeping the directory within its
cap (reserving room, evicting, counting bytes, dead writers' temporaries) is
:mod:`lanceloader.rows.cache.budget`; the files' names, format, checks and errors are
:mod:`lanceloader.rows.cache.files`.

Contract: a ``DiskCache`` runs in any thread or process that holds it (it pickles as its
directory, size and ``in_memory``); what it keeps in memory (checked versions, held pieces,
counters) is per object, in its process (counters change under its ``threading.Lock``). No file
is ever mapped: every byte a read uses was copied into the process and checked there, so a file
another process truncates or writes in place is a damaged file (dropped, counted, read again
from the dataset), never SIGBUS and never wrong rows. Across processes it locks with
``flock``s, released by the kernel when a holder dies: a name's while one process makes it, the
directory's around every reservation and rename (the budget's functions run under it). It
cleans up its own files: a damaged file dropped when found, its own reservation when a write
fails, least recently used files and dead writers' temporaries by the next eviction or
:meth:`DiskCache.remove_dead_temporaries`. The directory is its owner's: a ``DiskCache`` never
removes it (the automatic cache's sweeper does, :mod:`lanceloader.rows.cache.auto`).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

from lanceloader.rows.cache.budget import (
    fits_whole,
    remove_dead_temporaries,
    reserve,
    temporary_path,
    used_bytes,
)
from lanceloader.rows.cache.files import (
    SUFFIX,
    TRAILER,
    CacheLockTimeout,
    DamagedFile,
    OlderFile,
    PieceFile,
    batch_rows_of,
    cache_failure,
    check_sealed,
    mark_checked,
    read_sealed,
    read_trailer,
    seal,
    touch_access_time,
    version_of,
    was_checked,
)
from lanceloader.rows.cache.held import HeldPieces, Version
from lanceloader.rows.cache.locks import locked, warn_once
from lanceloader.rows.cache.plans import PlansAndRanges

_logger = logging.getLogger("lanceloader")


class DiskCache(PlansAndRanges):
    """Pieces as Arrow IPC files in ``root``, at most ``size`` bytes; see the module's text.

    Pickles as its directory and size: workers and helper processes open the same directory.
    Counters of this object (in this process): ``fills`` (pieces it downloaded and kept),
    ``damaged`` (files that failed their check, dropped and read again from the dataset),
    ``not_kept`` (pieces it could not keep: the cap, a full disk, a read-only directory) and
    ``reads_whole`` (piece files it copied whole). ``in_memory``: the directory is on tmpfs or
    ramfs, where every piece is read whole and held within a larger budget
    (:mod:`lanceloader.rows.cache.held`).
    """

    def __init__(self, root: str | os.PathLike[str], size: int, in_memory: bool = False) -> None:
        self.root = Path(root)
        self._root_text = os.fspath(self.root)
        self.size = int(size)
        self.in_memory = bool(in_memory)
        self.fills = 0
        self.damaged = 0
        self.not_kept = 0
        self.reads_whole = 0
        self.writable = True  # False after a write failed: reads go on, uncached
        self._count = threading.Lock()
        # name -> (inode, size, mtime, extra) of the file version this object checked
        self._checked: dict[str, tuple[int, int, int, int]] = {}
        self._too_big: set[str] = set()
        self.held = HeldPieces(self._root_text, self.in_memory)
        self._unremovable: set[tuple[str, Version | None]] = set()
        self._thread = threading.local()  # files this thread found damaged, pieces it filled

    def __getstate__(self) -> dict[str, Any]:
        return {"root": self.root, "size": self.size, "in_memory": self.in_memory}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["root"], state["size"], state.get("in_memory", False))  # type: ignore[misc]

    def __repr__(self) -> str:
        in_memory = ", in_memory=True" if self.in_memory else ""
        return f"DiskCache({os.fspath(self.root)!r}, size={self.size}{in_memory})"

    def _path(self, name: str) -> Path:
        return self.root / (name + SUFFIX)

    def _counted(self, counter: str) -> None:
        with self._count:
            setattr(self, counter, getattr(self, counter) + 1)
        if counter in ("damaged", "fills"):  # reported with this thread's next read
            setattr(self._thread, counter, getattr(self._thread, counter, 0) + 1)

    # --- reading -------------------------------------------------------------------------

    def _open(self, path: Path) -> pa.NativeFile | None:
        """``path`` open for reading; None when it is missing or unreadable (warned once)."""
        try:
            return pa.OSFile(os.fspath(path))
        except FileNotFoundError:
            return None
        except OSError as exc:  # unreadable: a permission, an I/O error
            warn_once(
                self.root,
                "unreadable",
                cache_failure(self.root, f"reading {path.name}", exc, reading=True),
            )
            return None

    def _read_whole(self, name: str, path: Path) -> tuple[pa.Buffer, int, Version] | None:
        """The payload of ``path`` copied into this process and checked there
        (:func:`~lanceloader.rows.cache.files.read_sealed`), its ``extra`` and version; None
        when it is missing or failed its check (then it is dropped and counted in
        ``damaged``)."""
        file = self._open(path)
        if file is None:
            return None
        with file:
            try:
                payload, extra, version = read_sealed(file.fileno(), name, self.size)
            except (DamagedFile, OSError) as exc:
                version = version_of(os.fstat(file.fileno()))
                self.drop(name, path, version, str(exc), damaged=not isinstance(exc, OlderFile))
                return None
            with contextlib.suppress(OSError):  # least recently used goes first
                touch_access_time(os.fspath(path), version[2])
        return payload, extra, version

    def _open_checked(
        self, path: Path, name: str
    ) -> tuple[pa.NativeFile, int, int, Version] | None:
        """``path`` open and checked (once per file version in this object: a file replaced or
        written since is checked again), with its payload length, ``extra`` and version; None
        when it is missing or failed its check (then it is dropped and counted). For a piece
        read by record batch (:class:`~lanceloader.rows.cache.files.PieceFile`), whose reads
        compare the version again."""
        file = self._open(path)
        if file is None:
            return None
        stat = os.fstat(file.fileno())
        version = version_of(stat)
        try:
            known = self._checked.get(name)
            if known is not None and known[:3] == version:
                length, extra = stat.st_size - TRAILER.size, known[3]
            elif was_checked(file.fileno(), name, stat):  # by another process: the trailer
                length, extra = read_trailer(file.fileno(), stat.st_size)
                self._checked[name] = (*version, extra)
            else:
                length, extra = check_sealed(file.fileno(), stat.st_size, name)
                mark_checked(file.fileno(), name, stat)
                self._checked[name] = (*version, extra)
        except (DamagedFile, OSError) as exc:
            file.close()
            self.drop(name, path, version, str(exc), damaged=not isinstance(exc, OlderFile))
            return None
        return file, length, extra, version

    def get(self, name: str) -> PieceFile | pa.Table | None:
        """The piece ``name``, checked, or None when the cache lacks it (or its file was
        damaged: then it is dropped, counted in ``damaged`` and logged). A piece held in this
        process (:mod:`lanceloader.rows.cache.held`) comes from there while its file is
        unchanged; otherwise a piece is copied whole and checked (then held when there is
        room), or, too large for that on a disk, opened for reads by record batch."""
        held = self.held.get(name)
        if held is not None:
            return held
        path = self._path(name)
        try:
            length = os.stat(path).st_size - TRAILER.size
        except OSError:
            return None
        if self.held.reads_whole(length):
            return self._piece_whole(name, path)[0]
        opened = self._open_checked(path, name)
        if opened is None:
            return None
        file, length, extra, version = opened
        try:
            return PieceFile(
                file,
                length,
                extra,
                version,
                read_whole=lambda: self._piece_whole(name, path, must=True),
            )
        except (pa.ArrowInvalid, OSError) as exc:
            file.close()
            self.drop(name, path, version, f"unreadable Arrow file ({exc})")
            return None

    def _piece_whole(
        self, name: str, path: Path, must: bool = False
    ) -> tuple[pa.Table | None, bool]:
        """The piece ``name`` copied whole and checked, and whether it is held now (one chunk);
        (None, False) when it is missing or damaged (dropped), or with ``must`` (a
        ``PieceFile``'s read) :class:`DamagedFile`."""
        read = self._read_whole(name, path)
        table = None
        if read is not None:
            payload, _, version = read
            try:
                table = pa.ipc.open_file(payload).read_all()
            except (pa.ArrowInvalid, OSError) as exc:  # checked, yet no Arrow file
                self.drop(name, path, version, f"unreadable Arrow file ({exc})")
        if table is None:
            if must:
                raise DamagedFile("missing or damaged when read whole")
            return None, False
        self._counted("reads_whole")
        held = self.held.hold(name, version, table)
        return (table, False) if held is None else (held, True)

    def take_damaged(self) -> int:
        """Files this thread found damaged (and dropped) since its last call: a read reports
        them with its rows (``Read.cache_damaged``, counted in ``stats()``)."""
        count, self._thread.damaged = getattr(self._thread, "damaged", 0), 0
        return count

    def take_fills(self) -> int:
        """Pieces this thread filled (downloaded and kept) since its last call: a read can
        report them with its rows, so the fills of process workers reach the main process."""
        count, self._thread.fills = getattr(self._thread, "fills", 0), 0
        return count

    @property
    def whole_reads(self) -> bool:
        """A piece not held in this process is copied whole to be read (a directory in
        memory; :meth:`held_piece` says whether it is held)."""
        return self.in_memory

    def held_piece(self, name: str) -> pa.Table | None:
        """The piece ``name`` if this process holds it (its file unchanged), else None: no
        file is read."""
        return self.held.get(name)

    @property
    def copies_out(self) -> bool:
        """Reads copy rows out of its pieces: in memory, the pieces it holds are shared by
        every read of the process (a slice would be a writable tensor over them)."""
        return self.in_memory

    def drop_damaged(self, name: str, why: str) -> None:
        """Drop piece ``name``, found damaged while a read used it (see :meth:`drop`)."""
        self.drop(name, self._path(name), None, why)

    def drop(
        self, name: str, path: Path, version: Version | None, why: str, damaged: bool = True
    ) -> None:
        """Remove the damaged file ``path`` (only if it is still the version found damaged, not
        a fresh copy another process published meanwhile), count and log it: once per damaged
        file, by the thread that removed it (others that found it damaged meanwhile see it gone
        or replaced); a file that cannot be removed (a read-only cache) once per version.
        ``damaged=False`` (a file an older lanceloader wrote): removed and logged at INFO
        level, not counted or warned about."""
        self._checked.pop(name, None)
        self.held.forget(name)
        found: Version | None = None
        try:
            found = version_of(os.stat(path))
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
            _logger.info(
                "cache file %s in the cache directory %r was %s: dropped; its rows are "
                "read from the dataset again",
                path.name,
                os.fspath(self.root),
                why,
            )
            return
        self._counted("damaged")
        _logger.warning(
            "cache file %s in the cache directory %r failed its check (%s): dropped; "
            "its rows are read from the dataset again",
            path.name,
            os.fspath(self.root),
            why,
        )

    # --- locks ---------------------------------------------------------------------------

    def _lock(self, name: str, block: bool) -> contextlib.AbstractContextManager[bool]:
        """The lock of ``name`` in this directory (:func:`~lanceloader.rows.cache.locks.locked`)."""
        return locked(self.root, name, block)

    # --- filling -------------------------------------------------------------------------

    def keeps(self, name: str, estimate: float) -> bool:
        """Whether a piece ``name`` of about ``estimate`` bytes could be kept: worth
        downloading whole (else its rows are read as without a cache)."""
        return self.writable and name not in self._too_big and fits_whole(estimate, self.size)

    def fill(
        self, name: str, load: Callable[[], pa.Table], block: bool
    ) -> pa.Table | PieceFile | None:
        """The piece ``name``, from the cache or made by ``load()`` and published; one process
        or thread loads a piece at a time. Returns None, at once, when another is loading it
        and ``block`` is False."""
        return self.fill_piece(name, load, block)[0]

    def fill_piece(
        self, name: str, load: Callable[[], pa.Table], block: bool
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
            version = self.put(name, table)
            if version is not None:
                self._counted("fills")
                table = self.held.hold(name, version, table) or table  # no read back
            return table, version is not None

    def put(self, name: str, table: pa.Table) -> Version | None:
        """Publish ``table`` as ``name`` (after evicting what the cap needs); returns the
        version of the file published, or None when it was not kept (a table bigger than the
        cap, or a failed write). A directory in memory is read whole: one record batch."""
        batch_rows = max(1, table.num_rows) if self.in_memory else batch_rows_of(table)
        # Serialized once, in memory (its exact size before reserving the file), then written
        # in one call: through a Python file object Arrow's writer made a bytes copy and a
        # Python call per buffer, and counting the size first serialized the table twice (a
        # piece of 16 MiB per ~50 ms; filling 272 MB cost 1.9 s of CPU, 7x an uncached read).
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table, max_chunksize=batch_rows)
        data = sink.getvalue()
        version = self._publish(self._path(name), name, data, batch_rows)
        if version is None:
            if data.size + TRAILER.size > self.size:
                self._too_big.add(name)  # the estimate was low: never downloaded whole again
            self._counted("not_kept")
        return version

    def _stop_writing(self, what: str, exc: OSError) -> None:
        """A write to the directory failed: no more writes from this object; reads go on, those
        of pieces not kept from the dataset, as without a cache. Warns once."""
        self.writable = False
        warn_once(self.root, "write", cache_failure(self.root, what, exc))

    def _publish(
        self, path: Path, name: str, data: bytes | pa.Buffer, extra: int = 0
    ) -> Version | None:
        """Make room for the file (the payload ``data`` and the trailer) and reserve it
        (a temporary file of exactly that size, so every other writer's eviction counts it:
        :func:`~lanceloader.rows.cache.budget.reserve`), under the directory's lock; then,
        without the lock (writers in parallel), write the payload, seal it (a trailer with the
        checksum of ``data`` as it is in memory: reading the file back to sum it cost a third
        of filling the automatic cache) and rename it into place (atomic: readers see the whole
        file or none; a reader checks the file's bytes against the trailer). Never
        more than the cap in the directory, temporary files included. Returns the version of the
        file published, or None when it was not; a failed write (full disk, read-only directory) stops this object's
        writes with one warning, never raises."""
        payload = memoryview(data)
        length = payload.nbytes
        size = length + TRAILER.size
        if size > self.size or not self.writable:
            return None
        temporary = temporary_path(path)
        try:
            with self._lock("directory", block=True):
                if not reserve(self.root, self.size, temporary, size):
                    return None
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
            self._checked[name] = (*version_of(stat), extra)
            return version_of(stat)
        except CacheLockTimeout:
            raise
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            self._stop_writing(f"writing {path.name}", exc)
            return None
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
