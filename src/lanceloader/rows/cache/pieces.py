"""Cache: pieces of the pinned version's projected columns, kept on local disk or in memory.

Object stores charge a round trip per request, and a shuffle makes many small ones. The cache
turns every epoch after the first into local reads, in any order: a *piece* is up to
:data:`PIECE_BYTES` of Arrow data, ``piece_rows`` consecutive rows of one fragment, in the
projected columns. A read that misses a piece downloads the whole piece with one range read
(Lance's fastest path on an object store), keeps it, and takes its rows from it.

Which pieces are kept (:class:`~lanceloader.rows.lance.cached.CachedReads`, the reads of Lance
rows through their cache): a piece is filled when at least 1/8 of its rows
are selected (filter and split), and either the whole selection fits in the cache (so a full
shuffle's first epoch downloads each piece once, in big reads, instead of row by row) or this
read wants at least 1/8 of the piece (sequential and block reads). Otherwise the rows come from
Lance as without a cache, so a cache smaller than the data never thrashes. A read of a local
dataset fills one piece it wants only a sliver of per :data:`ROWS_PER_FILL` rows it reads, so
the first batch of a shuffle does not wait for pieces (later reads fill them, each piece once).

Keys: a piece's name hashes the fragment's metadata (id, row count, data and deletion files:
Lance never rewrites a file it wrote), the projected columns and their types, the piece size
and its number. So it never serves rows of another dataset, version or projection, and versions
that share fragments (an append) share their pieces.

Two kinds:

``DiskCache`` (``cache="/path"``)
    Arrow IPC files in one directory, shared by every worker, loader and process of the machine
    that uses it. Filling is safe under concurrency: a piece's lock (``flock``, released by the
    kernel when its holder dies, so never stale; a wait for a live but stuck holder ends with
    a :class:`CacheLockTimeout` after :data:`LOCK_WAIT_S`) makes one download per piece; the
    file is written under a temporary name and renamed (atomic publish: no reader sees half a
    file).

    *Checked, never mapped*: every file (pieces and plans) ends with a trailer holding its
    length and an XXH3-64 checksum of its name and bytes. A file is read with ``pread`` into the
    process's own memory and the checksum is summed over that copy, so the bytes a read uses
    are the bytes checked: a damaged byte, a truncation, a piece renamed over another, or a
    file another process truncates or writes in place mid-epoch is caught, dropped (counted in
    ``damaged``, logged) and downloaded again, never delivered and never a SIGBUS (until 7 Dec
    2026 a directory in memory was mapped: a truncation killed the reader, 2 runs in 22, and
    bytes written in place reached the batches). A checked copy stays in the process while its
    file is unchanged (one ``stat`` per read), :mod:`lanceloader.rows.cache.held`: within
    256 MiB per process for a directory on a disk; for a directory in memory (the automatic
    cache's under ``/dev/shm``, or ``cache=`` on tmpfs or ramfs,
    :func:`~lanceloader.rows.cache.files.in_memory_filesystem`) within a quarter of the memory
    available, so a full shuffle over more than 256 MiB does not read every piece whole per
    read. A piece too large to read whole (rows wider than the piece size assumes, on a disk)
    is read by record batch, and the file's version compared after each read. The checked
    version of such a file is recorded on it (an extended attribute, :data:`CHECKED_XATTR`),
    so another process reads its trailer only.
    XXH3-64 (the ``xxhash`` package: 1.2 ms to seal a 13.6 MB piece from memory and 3 ms to
    check it with ``pread``, where zlib's CRC-32 took 4.3 and 7.6 ms on this 2-core machine)
    catches damage but for a 2^-64 chance; it guards against damage, not against someone who
    can write the directory. A file an older lanceloader sealed (magic ``LLCACHE1``, a CRC-32)
    is dropped and filled again, logged at INFO level, neither warned about nor counted.

    *Capped at every instant*: a writer reserves its file's exact size (a temporary file of
    that size, which every other writer counts) under the directory's lock, after evicting the
    least recently used files (a read touches the file's atime) and removing temporary files
    of dead writers; when live reservations hold the room, the piece is not kept. A piece
    larger than the cap is never downloaded whole: its rows are read as without a cache.

    *Degrades, never stops training*: a full disk, a read-only or a removed directory gives one
    warning naming the directory, what failed and the fix; files already there are still read,
    the rest comes from the dataset (a removed directory is made again). A read-only cache is
    readable. Errors that remain (a lock held by a stuck process) are :class:`CacheError`, which
    names the directory, never the dataset.
``MemoryCache`` (``cache="memory"``)
    The same pieces as Arrow tables in this process's memory, least recently used out first,
    within ``cache_size`` bytes, shared by the loader's worker threads. A process worker would
    hold a copy each, so ``worker_type="process"`` asks for a directory instead (``/dev/shm/…``
    keeps it in RAM and shares it).

The directory also holds the plans of filters and splits (``plan-*.npy``, see
``rows/lance/plan.select_rows``): every rank and worker of a machine computes a plan once, and byte
ranges that are not rows (``fetch_bytes(key, make)``, e.g. the bytes of a video clip): one
``make()`` per key among all its users, sealed, checked and capped like pieces.

``cache="auto"`` (the Loader's default) chooses one of these caches, or none:
:mod:`lanceloader.rows.cache.auto`, a directory in memory (``DiskCache(in_memory=True)``).

Where the code is: this module holds :func:`make_cache`, the pieces' sizes and names and
``MemoryCache``; a Source's reads through its cache are
:mod:`lanceloader.rows.lance.cached`; ``DiskCache``
(its get/fill path) is :mod:`lanceloader.rows.cache.disk`, the pieces it holds in memory
:mod:`lanceloader.rows.cache.held`, its locks :mod:`lanceloader.rows.cache.locks`, its plans and
byte ranges :mod:`lanceloader.rows.cache.plans`; the
directory's cap (reservation, eviction, bytes used, dead writers' temporaries) is
:mod:`lanceloader.rows.cache.budget`; the files' names, format and checks, and the errors,
are :mod:`lanceloader.rows.cache.files`.

>>> import numpy as np, pyarrow as pa, tempfile
>>> cache = DiskCache(tempfile.mkdtemp(), size=1 << 20)
>>> cache.get("a") is None
True
>>> cache.fill("a", lambda: pa.table({"x": [1, 2, 3]}), block=True).num_rows
3
>>> cache.get("a").take(np.array([2, 0])).column("x").to_pylist()
[3, 1]
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

from lanceloader.rows.cache.disk import DiskCache

# Some re-exported for code that finds them here (see __all__): their homes are
# lanceloader.rows.cache.files and lanceloader.rows.cache.disk, where a limit is patched.
from lanceloader.rows.cache.files import (
    SUFFIX,
    CacheError,
    CacheLockTimeout,
    bytes_name,
    check_sealed,
    in_memory_filesystem,
    made_bytes,
)

__all__ = [
    "AUTO",
    "FILL_FRACTION",
    "MIN_PIECE_ROWS",
    "PIECE_BYTES",
    "SUFFIX",
    "CacheError",
    "CacheLockTimeout",
    "DiskCache",
    "MemoryCache",
    "check_sealed",
    "fragment_key",
    "make_cache",
    "piece_name",
    "piece_rows",
]

# Arrow bytes a piece aims at: big enough that a download is a few large requests (each column
# of a piece is one range read), small enough that a few workers filling pieces stay within the
# loader's memory bound (a piece is in memory while it is written).
PIECE_BYTES = 16 << 20
MIN_PIECE_ROWS = 1024
# A piece is worth downloading whole when a read wants at least this share of its rows.
FILL_FRACTION = 1 / 8
# Reads of a local dataset fill one piece they want only a sliver of (a full or block
# shuffle's reads) for every ROWS_PER_FILL rows they read (half a piece's rows when that is
# fewer, so an epoch earns at least twice the fills its pieces need) and take their other rows
# from Lance. A fill (16 MiB) costs about what taking 3,000 random rows from local Lance does
# (75 ms against 21 ms for 1,024 here), so reads spend on fills at most a few times their own
# reading. A shuffle's first read (one batch: the ramp) fills nothing, so its first batch comes
# at once; its 65,536-row reads fill up to 64 pieces each, so the first epoch still fills every
# piece once, early (1M rows, automatic cache, 5 alternated runs: first batch 448 -> 27 ms,
# epoch 1 1.30M -> 1.38M rows/s). Before, the first read filled every piece it touched: a
# resume's first batch came 40x later than without the cache. The credit is the process's
# (small reads add up to a fill), at most FILL_CREDIT_MOST. On an object store every such piece
# is filled, as a take costs a round trip there.
ROWS_PER_FILL = 1024
FILL_CREDIT_MOST = 64


def piece_rows(bytes_per_row: float) -> int:
    """Rows per piece for rows of ``bytes_per_row`` Arrow bytes: about :data:`PIECE_BYTES`.

    >>> piece_rows(268.0), piece_rows(0.0), piece_rows(1e9)
    (62601, 1048576, 1024)
    """
    if bytes_per_row <= 0:
        return 1 << 20
    return int(min(1 << 20, max(MIN_PIECE_ROWS, PIECE_BYTES // bytes_per_row)))


def fragment_key(metadata: Any, columns: list[str], schema: pa.Schema) -> str:
    """A name for one fragment's data in ``columns``: it changes with any file of the fragment,
    its deletions, the projection or a column's type, and with nothing else (not the URI)."""
    deletion = metadata.deletion_file
    parts = [
        metadata.id,
        metadata.physical_rows,
        [f.path for f in metadata.files],
        None if deletion is None else [deletion.id, deletion.num_deleted_rows],
        [(c, str(schema.field(c).type)) for c in columns],
    ]
    blob = json.dumps(parts, separators=(",", ":"), default=str).encode()
    return hashlib.blake2b(blob, digest_size=12).hexdigest()


def piece_name(fragment: str, rows: int, number: int) -> str:
    """The cache name of piece ``number`` (of ``rows`` rows each) of a fragment."""
    return f"{fragment}-{rows}-{number}"


#: the cache argument that lets the Loader choose (rows/cache/auto.py)
AUTO = "auto"


def make_cache(cache: object, cache_size: object) -> DiskCache | MemoryCache | None:
    """The cache a user asked for: ``None``, ``"memory"`` or a directory (str or path), with
    ``cache_size`` bytes (default: half the free disk space of the directory, or half the
    memory available, when the cache is made)."""
    if cache_size is not None and (
        isinstance(cache_size, bool) or not isinstance(cache_size, int) or cache_size < 1
    ):
        raise ValueError(
            f"cache_size must be a number of bytes >= 1 (e.g. 50 * 2**30), got {cache_size!r}"
        )
    if cache is None:
        if cache_size is not None:
            raise ValueError(
                "cache_size= needs cache=, a directory (e.g. '/nvme/lance-cache') or 'memory'"
            )
        return None
    if cache == AUTO:
        raise ValueError(
            "cache='auto' is chosen by the Loader from the order and the data's "
            "size (rows/cache/auto.py): here pass None, 'memory' or a directory"
        )
    if cache == "memory":
        if cache_size is None:
            cache_size = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2
        return MemoryCache(cache_size)
    if not isinstance(cache, str | os.PathLike):
        raise TypeError(
            f"cache must be 'auto', None, 'memory' or a directory, got the "
            f"{type(cache).__name__} {cache!r}"
        )
    root = Path(cache)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(
            f"cache={os.fspath(cache)!r}: cannot create the cache directory "
            f"({exc.strerror}); give a writable local directory"
        ) from exc
    if cache_size is None:
        cache_size = shutil.disk_usage(root).free // 2
    disk = DiskCache(root, cache_size, in_memory=in_memory_filesystem(root))
    disk.remove_dead_temporaries()
    return disk


class MemoryCache:
    """Pieces as Arrow tables in this process, at most ``size`` bytes; see the module's text.

    Pickles as its size alone: another process starts with an empty cache of its own.
    ``fills`` counts the pieces it loaded.
    """

    def __init__(self, size: int) -> None:
        self.size = int(size)
        self.fills = 0
        self._reported = 0  # fills reported by take_fills
        self._tables: OrderedDict[str, pa.Table | bytes] = OrderedDict()
        self._used = 0
        self._lock = threading.Lock()
        self._loading: dict[str, threading.Lock] = {}

    def __repr__(self) -> str:
        return f"MemoryCache(size={self.size})"

    #: reads slice its tables (a tensor of a slice shares the cached table: do not write to it)
    copies_out = False
    #: every piece it has is held (DiskCache.whole_reads)
    whole_reads = False

    def __getstate__(self) -> dict[str, Any]:
        return {"size": self.size}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["size"])  # type: ignore[misc]

    def get(self, name: str) -> pa.Table | None:
        with self._lock:
            table = self._tables.get(name)
            if table is not None:
                self._tables.move_to_end(name)
            return table

    def held_piece(self, name: str) -> pa.Table | None:
        """The piece ``name`` if kept (see ``DiskCache.held_piece``)."""
        return self.get(name)

    def keeps(self, name: str, estimate: float) -> bool:
        """Whether a piece of about ``estimate`` bytes fits the budget."""
        return estimate <= self.size

    def fill(self, name: str, load: Callable[[], pa.Table], block: bool) -> pa.Table | None:
        return self.fill_piece(name, load, block)[0]

    def fill_piece(
        self, name: str, load: Callable[[], pa.Table], block: bool
    ) -> tuple[pa.Table | None, bool]:
        """The piece, and whether it is kept (see ``DiskCache.fill_piece``)."""
        with self._lock:
            loading = self._loading.setdefault(name, threading.Lock())
        if not loading.acquire(blocking=block):
            return None, False
        try:
            table = self.get(name)
            if table is not None:
                return table, True
            table = load().combine_chunks()
            kept = self.put(name, table)
            if kept:
                with self._lock:
                    self.fills += 1
            return table, kept
        finally:
            loading.release()

    def fetch_bytes(self, key: str, make: Callable[[], bytes]) -> bytes:
        """The bytes kept under ``key`` (any string), made by ``make()`` when missing: one
        ``make()`` per key at a time among this process's threads, kept within the budget
        (least recently used out first, pieces and byte ranges together); bytes larger than the
        budget are returned unkept. See ``DiskCache.fetch_bytes``.

        >>> cache = MemoryCache(1 << 20)
        >>> cache.fetch_bytes("clip 7", lambda: b"abc"), cache.fetch_bytes("clip 7", lambda: b"?")
        (b'abc', b'abc')
        """
        name = bytes_name(key)
        with self._lock:
            loading = self._loading.setdefault(name, threading.Lock())
        with loading:
            found = self.get(name)
            if isinstance(found, bytes):
                return found
            data = made_bytes(key, make)
            if self.put(name, data):
                with self._lock:
                    self.fills += 1
            return data

    def put(self, name: str, table: pa.Table | bytes) -> bool:
        size = len(table) if isinstance(table, bytes) else table.nbytes
        if size > self.size:
            return False
        with self._lock:
            while self._tables and self._used + size > self.size:
                _, old = self._tables.popitem(last=False)
                self._used -= len(old) if isinstance(old, bytes) else old.nbytes
            self._tables[name] = table
            self._used += size
        return True

    def take_damaged(self) -> int:
        """Always 0: tables in memory are never damaged (the protocol of ``DiskCache``)."""
        return 0

    def take_fills(self) -> int:
        """Pieces and byte ranges kept since the last call (``DiskCache.take_fills``; here per
        process: a memory cache serves one process)."""
        with self._lock:
            count, self._reported = self.fills - self._reported, self.fills
        return count

    def used_bytes(self) -> int:
        return self._used
