"""Held pieces: checked copies of cache pieces kept in this process's memory, for
:class:`~lanceloader.rows.cache.disk.DiskCache` (whose guarantees
:mod:`lanceloader.rows.cache.pieces` tells).

A full shuffle wants a few rows of every piece in every read: reading the pieces again from
their files for every read would copy each piece once per read. So a piece read whole (its copy
checked against its trailer, :func:`~lanceloader.rows.cache.files.read_sealed`) stays in the
process, least recently used out first, within a budget (:meth:`HeldPieces.room`):
:data:`HELD_BYTES` for a directory on a disk (whose files the page cache serves again cheaply);
for a directory in memory (tmpfs: the automatic cache, ``cache="/dev/shm/..."``), also up to
:data:`HELD_MEMORY_SHARE` of the memory the machine could still give, so a shuffle over more
than 256 MiB of pieces does not read every piece whole per read. The copy is the process's own:
nothing maps a file, so a file another process truncates or writes in place never reaches a
held piece (no SIGBUS, no changed rows); a held piece is served while its file keeps the version
read (one ``stat`` per read), so such damage is still seen, dropped and counted by the cache.

Contract: one :class:`HeldPieces` per ``DiskCache`` object, in its process; its methods are
safe from any thread (one ``threading.Lock``), take no file lock and never remove a file. The
limits are read here: a test that changes one patches it here.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import OrderedDict

import pyarrow as pa

from lanceloader.rows.cache.files import SUFFIX, touch_access_time

# Pieces held per process, within this many bytes (a directory on a disk).
HELD_BYTES = 256 << 20
# A directory in memory: a process also holds pieces while they take at most this share of the
# memory available (MemAvailable, read at each hold, so processes holding copies leave each
# other less): its files are memory already, and a shuffle over more than HELD_BYTES would read
# every piece whole per read (2M rows of 272 B: epoch 2 at 0.62M rows/s held within 256 MiB).
HELD_MEMORY_SHARE = 0.25
# A piece of a directory on a disk is read whole (one pread) and held when at least this many
# of its size fit HELD_BYTES; a larger one (rows wider than the piece size assumes) is read by
# record batch (PieceFile). A directory in memory reads every piece whole.
HELD_PIECES_AT_LEAST = 8
# A held piece is evicted for another only once unused this long: a full shuffle wants every
# piece in every read, and least-recently-used eviction of pieces used in turn (more of them
# than the budget holds) would drop each just before its next use, reading every piece whole
# for every read. The pieces held stay; the others are read from their files.
HELD_IDLE_S = 5.0
# A held piece's file has its access time touched (the eviction's "recently used") at most this
# often.
TOUCH_EVERY_S = 30.0

Version = tuple[int, int, int]


def memory_available() -> int:
    """Bytes of memory the kernel could still give (``MemAvailable``: free memory and caches it
    can reclaim); the free pages where ``/proc/meminfo`` is missing."""
    with contextlib.suppress(OSError, ValueError, StopIteration):
        with open("/proc/meminfo") as file:
            line = next(line for line in file if line.startswith("MemAvailable:"))
        return int(line.split()[1]) * 1024
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


class HeldPieces:
    """Checked pieces of the directory ``root`` held in this process (see the module's text);
    ``in_memory``: the directory is on tmpfs or ramfs (a larger budget, every piece read
    whole)."""

    def __init__(self, root: str, in_memory: bool) -> None:
        self._root = root
        self.in_memory = in_memory
        self._lock = threading.Lock()
        # name -> (file version, table, last touch), least recently used first
        self._tables: OrderedDict[str, tuple[Version, pa.Table, float]] = OrderedDict()
        self._used_at: dict[str, float] = {}  # name -> last use (monotonic)
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._tables)

    def room(self) -> int:
        """The bytes this process may hold now (see :data:`HELD_MEMORY_SHARE`)."""
        if not self.in_memory:
            return HELD_BYTES
        return max(HELD_BYTES, self.bytes + int(HELD_MEMORY_SHARE * memory_available()))

    def reads_whole(self, length: int) -> bool:
        """Whether a piece file of ``length`` bytes is read whole (and held when it fits)."""
        return self.in_memory or length <= HELD_BYTES // HELD_PIECES_AT_LEAST

    def get(self, name: str) -> pa.Table | None:
        """The held piece ``name`` if its file is still the version read (a file changed,
        replaced or removed since is read again: damage is seen there)."""
        with self._lock:
            entry = self._tables.get(name)
        if entry is None:
            return None
        version, table, touched = entry
        path = f"{self._root}/{name}{SUFFIX}"  # no Path: one stat per piece per read
        try:
            stat = os.stat(path)
        except OSError:
            stat = None
        with self._lock:
            if stat is None or (stat.st_ino, stat.st_size, stat.st_mtime_ns) != version:
                self._pop(name)
                return None
            if name not in self._tables:  # dropped by another thread meanwhile
                return None
            self._tables.move_to_end(name)
            now = time.monotonic()
            self._used_at[name] = now
            if now - touched < TOUCH_EVERY_S:
                return table
            self._tables[name] = (version, table, now)
        with contextlib.suppress(OSError):  # least recently used goes first (read-only: skip)
            touch_access_time(path, stat.st_mtime_ns)
        return table

    def hold(self, name: str, version: Version, table: pa.Table) -> pa.Table | None:
        """Keep a checked piece, within :meth:`room`, as one chunk (a gather from one chunk
        needs no search of its record batches); returns the table held, or None when it is not
        held. Room is made by evicting pieces unused for :data:`HELD_IDLE_S` only, least
        recently used first; without room, it is not held (nor copied into one chunk)."""
        room = self.room()
        if table.nbytes > room:
            return None
        with self._lock:
            self._pop(name)
            now, idle = time.monotonic(), 0
            for other in self._tables:  # least recently used first
                if self.bytes - idle + table.nbytes <= room:
                    break
                if now - self._used_at.get(other, 0.0) < HELD_IDLE_S:
                    return None  # the held pieces are in use: keep them
                idle += self._tables[other][1].nbytes
            if table.num_columns and table.column(0).num_chunks != 1:
                table = table.combine_chunks()  # a copy of one piece, once per process
            while self._tables and self.bytes + table.nbytes > room:
                self._pop(next(iter(self._tables)))
            self._tables[name] = (version, table, now)
            self._used_at[name] = now
            self.bytes += table.nbytes
        return table

    def forget(self, name: str) -> None:
        """Stop holding ``name`` (its file was dropped)."""
        with self._lock:
            self._pop(name)

    def _pop(self, name: str) -> None:
        entry = self._tables.pop(name, None)
        self._used_at.pop(name, None)
        if entry is not None:
            self.bytes -= entry[1].nbytes
