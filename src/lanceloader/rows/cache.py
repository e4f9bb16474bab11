"""Cache: pieces of the pinned version's projected columns, kept on local disk or in memory.

Object stores charge a round trip per request, and a shuffle makes many small ones. The cache
turns every epoch after the first into local reads, in any order: a *piece* is up to
:data:`PIECE_BYTES` of Arrow data, ``piece_rows`` consecutive rows of one fragment, in the
projected columns. A read that misses a piece downloads the whole piece with one range read
(Lance's fastest path on an object store), keeps it, and takes its rows from it.

Which pieces are kept (:func:`read_cached`): a piece is filled when at least 1/8 of its rows
are selected (filter and split), and either the whole selection fits in the cache (so a full
shuffle's first epoch downloads each piece once, in big reads, instead of row by row) or this
read wants at least 1/8 of the piece (sequential and block reads). Otherwise the rows come from
Lance as without a cache, so a cache smaller than the data never thrashes.

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

    *Checked*: every file (pieces and plans) ends with a trailer holding its length and a
    CRC-32 of its name and bytes, checked before the file is first used. A checked version is
    recorded on the file (an extended attribute, :data:`CHECKED_XATTR`, holding its name,
    inode, size and mtime; its writer records it too), so another process opening the same
    version reads the trailer only, and a process checks again whenever the file changed (any
    write changes the mtime, a rename the name). So a damaged byte, a truncation or a piece
    renamed over another is caught, dropped (counted in ``damaged``, logged) and downloaded
    again, never delivered. Not caught: media corruption that leaves the mtime alone after a
    version was checked (the disk's or filesystem's own checks are for that); where extended
    attributes are refused, every process checks every file it opens once. Rows are read with ``pread`` from the record batches
    that hold them, never mapped: a file truncated under a reader is caught, never a SIGBUS. A
    piece a read wanted most of is copied whole once and kept in the process's memory while
    its file is unchanged (checked by one ``stat`` per read), within :data:`HELD_BYTES` per
    process, so a full shuffle over pieces that fit runs at memory speed.

    *Mapped* (``mapped=True``, the automatic cache's directory under ``/dev/shm``): a checked
    piece (one record batch) is mapped instead, read-only, through the descriptor that was
    checked, and kept mapped while its file is unchanged (the same ``stat`` per read; an
    evicted or replaced file is unmapped when seen, and whenever a piece is mapped): no copy
    and no cap per process, since the pages are the directory's own, shared by every process
    of the machine (so a shuffle over more than :data:`HELD_BYTES` of pieces does not read
    pieces whole for every read). The price: a file *truncated in place* under a process that
    maps it kills that process with SIGBUS. Nothing in lanceloader truncates a published file
    (writers rename new files in, eviction and damage unlink, and a mapping outlives both),
    and the directory is the user's own (``0o700``); bytes *written in place* into a mapped
    file are caught by the next read (the mtime changes), but a read copying rows at that very
    moment delivers them. A directory given as ``cache=`` is never mapped.
    CRC-32 (zlib: 8 ms per 16 MiB piece on this 2-core machine, where SHA-256 takes 12 and
    BLAKE2b 31) catches every burst of up to 32 bits and other damage but for a 2^-32 chance;
    it guards against damage, not against someone who can write the directory.

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
``Source._select_rows``): every rank and worker of a machine computes a plan once, and byte
ranges that are not rows (``fetch_bytes(key, make)``, e.g. the bytes of a video clip): one
``make()`` per key among all its users, sealed, checked and capped like pieces.

``cache="auto"`` (the Loader's default) chooses one of these caches, or none:
:mod:`lanceloader.rows.autocache`. Its pieces are mapped, not copied (``DiskCache(mapped=True)``).

>>> import pyarrow as pa, tempfile
>>> cache = DiskCache(tempfile.mkdtemp(), size=1 << 20)
>>> cache.get("a") is None
True
>>> cache.fill("a", lambda: pa.table({"x": [1, 2, 3]}), block=True).num_rows
3
>>> cache.get("a").take(np.array([2, 0])).column("x").to_pylist()
[3, 1]
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import io
import json
import logging
import mmap
import os
import shutil
import struct
import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from lanceloader.lifecycle import lifetime
from lanceloader.lifecycle.lifetime import picklable_error
from lanceloader.rows.dataset import ReadError, reaching_store
from lanceloader.rows.gather import gather_rows
from lanceloader.rows.protocol import is_identity

_logger = logging.getLogger("lanceloader")

# Arrow bytes a piece aims at: big enough that a download is a few large requests (each column
# of a piece is one range read), small enough that a few workers filling pieces stay within the
# loader's memory bound (a piece is in memory while it is written).
PIECE_BYTES = 16 << 20
MIN_PIECE_ROWS = 1024
# A piece is worth downloading whole when a read wants at least this share of its rows.
FILL_FRACTION = 1 / 8
SUFFIX = ".arrow"
BYTES_SUFFIX = ".bin"  # byte ranges that are not rows (fetch_bytes)
LOCK = ".lock"  # empty files whose flock guards a piece (and the directory): never counted
TEMPORARY = ".tmp-"
# Temporary files of a writer in another PID namespace are removed by an eviction once this old
# (those of a dead writer of this namespace at once).
STALE_TEMPORARY_S = 3600.0
# Every cache file ends with this trailer: payload length, extra (a piece's rows per record
# batch), CRC-32 of the name, payload and extra, and the magic.
TRAILER = struct.Struct("<QQI8s")
MAGIC = b"LLCACHE1"
CHECK_CHUNK = 1 << 20  # bytes read per pread while checking a file
# The extended attribute that records a file version checked on this machine (name, inode, size,
# mtime): another process opening the same version reads the trailer only.
CHECKED_XATTR = "user.lanceloader.checked"
# Record batches of a piece file: a read of a few rows reads their batches only.
BATCH_BYTES = 256 << 10
# A piece's estimated bytes (rows x the source's bytes per row) times this must fit the cap
# for the piece to be downloaded whole: IPC framing, and rows wider than the estimate.
ESTIMATE_MARGIN = 1.25
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
    parts = [metadata.id, metadata.physical_rows, [f.path for f in metadata.files],
             None if deletion is None else [deletion.id, deletion.num_deleted_rows],
             [(c, str(schema.field(c).type)) for c in columns]]
    blob = json.dumps(parts, separators=(",", ":"), default=str).encode()
    return hashlib.blake2b(blob, digest_size=12).hexdigest()


def piece_name(fragment: str, rows: int, number: int) -> str:
    """The cache name of piece ``number`` (of ``rows`` rows each) of a fragment."""
    return f"{fragment}-{rows}-{number}"


#: the cache argument that lets the Loader choose (rows/autocache.py)
AUTO = "auto"


def make_cache(cache: object, cache_size: object) -> DiskCache | MemoryCache | None:
    """The cache a user asked for: ``None``, ``"memory"`` or a directory (str or path), with
    ``cache_size`` bytes (default: half the free disk space of the directory, or half the
    memory available, when the cache is made)."""
    if cache_size is not None and (isinstance(cache_size, bool) or not isinstance(cache_size, int)
                                   or cache_size < 1):
        raise ValueError(f"cache_size must be a number of bytes >= 1 (e.g. 50 * 2**30), got "
                         f"{cache_size!r}")
    if cache is None:
        if cache_size is not None:
            raise ValueError("cache_size= needs cache=, a directory (e.g. '/nvme/lance-cache') "
                             "or 'memory'")
        return None
    if cache == AUTO:
        raise ValueError("cache='auto' is chosen by the Loader from the order and the data's "
                         "size (rows/autocache.py): here pass None, 'memory' or a directory")
    if cache == "memory":
        if cache_size is None:
            cache_size = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2
        return MemoryCache(cache_size)
    if not isinstance(cache, str | os.PathLike):
        raise TypeError(f"cache must be 'auto', None, 'memory' or a directory, got the "
                        f"{type(cache).__name__} {cache!r}")
    root = Path(cache)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"cache={os.fspath(cache)!r}: cannot create the cache directory "
                         f"({exc.strerror}); give a writable local directory") from exc
    if cache_size is None:
        cache_size = shutil.disk_usage(root).free // 2
    disk = DiskCache(root, cache_size)
    disk.remove_dead_temporaries()
    return disk


class CacheError(ReadError):
    """The cache directory failed, not the dataset: the message names the directory, what
    failed and the fix. A :class:`~lanceloader.rows.dataset.ReadError`, so code that catches
    read failures catches it too; ``root`` is the directory."""

    def __init__(self, detail: str, root: str = "") -> None:
        super().__init__(detail)
        self.root = root

    def __reduce__(self) -> Any:
        cause = self.__cause__
        return (type(self), (self.detail, self.root),
                {**self.__dict__, "__cause__": None if cause is None else picklable_error(cause)})


class CacheLockTimeout(CacheError, TimeoutError):
    """A lock of the cache directory was held longer than :data:`LOCK_WAIT_S` by a live holder."""


class DamagedFile(Exception):
    """A cache file failed its check (checksum, name, length, Arrow structure): drop it."""


def checksum(name: str, data: Any, value: int | None = None) -> int:
    """CRC-32 of ``data`` continuing ``value``, which starts from the file's ``name``: a file's
    checksum binds its content to its name, so a piece renamed or copied over another fails.

    >>> checksum("a", b"xyz") == checksum("a", b"xyz") != checksum("b", b"xyz")
    True
    """
    start = zlib.crc32(name.encode()) if value is None else value
    return zlib.crc32(data, start)


def seal(name: str, length: int, crc: int, extra: int = 0) -> bytes:
    """The trailer that ends every cache file: the payload's ``length``, an ``extra`` number
    (a piece's rows per record batch) and the checksum of name, payload and ``extra``.

    >>> len(seal("a", 3, checksum("a", b"xyz"))) == TRAILER.size
    True
    """
    crc = checksum(name, extra.to_bytes(8, "little"), crc)
    return TRAILER.pack(length, extra, crc, MAGIC)


def check_sealed(fd: int, size: int, name: str) -> tuple[int, int]:
    """Read the file ``fd`` (``size`` bytes) with ``pread`` (never mapped: a file truncated
    meanwhile is an error, not SIGBUS) and check its trailer against its name and content.
    Returns the payload's length and the trailer's ``extra``; raises :class:`DamagedFile`."""
    if size < TRAILER.size:
        raise DamagedFile(f"{size} bytes, shorter than its trailer")
    trailer = os.pread(fd, TRAILER.size, size - TRAILER.size)
    if len(trailer) != TRAILER.size:
        raise DamagedFile("truncated while read")
    length, extra, want, magic = TRAILER.unpack(trailer)
    if magic != MAGIC or length != size - TRAILER.size:
        raise DamagedFile("no lanceloader trailer (damaged, or written by an older version)")
    crc, done, buffer = zlib.crc32(name.encode()), 0, bytearray(CHECK_CHUNK)
    view = memoryview(buffer)
    while done < length:
        got = os.preadv(fd, [view[:min(CHECK_CHUNK, length - done)]], done)
        if got <= 0:
            raise DamagedFile("truncated while read")
        crc = zlib.crc32(view[:got], crc)
        done += got
    if checksum(name, extra.to_bytes(8, "little"), crc) != want:
        raise DamagedFile("checksum mismatch: its bytes changed, or it is another piece's file")
    return length, extra


def checked_record(name: str, stat: os.stat_result) -> bytes:
    """What :data:`CHECKED_XATTR` holds for a checked file version: its name, inode, size and
    mtime. Any write changes the mtime, a rename over another name changes the name."""
    return f"{name}:{stat.st_ino}:{stat.st_size}:{stat.st_mtime_ns}".encode()


def read_trailer(fd: int, size: int) -> tuple[int, int]:
    """The payload length and ``extra`` of a file whose content was checked before."""
    trailer = os.pread(fd, TRAILER.size, size - TRAILER.size) if size >= TRAILER.size else b""
    if len(trailer) != TRAILER.size:
        raise DamagedFile("truncated while read")
    length, extra, _, magic = TRAILER.unpack(trailer)
    if magic != MAGIC or length != size - TRAILER.size:
        raise DamagedFile("no lanceloader trailer (damaged, or written by an older version)")
    return length, extra


def mark_checked(fd: int, name: str, stat: os.stat_result) -> None:
    """Record on the file (an extended attribute; skipped where the filesystem or a read-only
    directory refuses it) that this version of it was checked."""
    with contextlib.suppress(OSError):
        os.setxattr(fd, CHECKED_XATTR, checked_record(name, stat))


def was_checked(fd: int, name: str, stat: os.stat_result) -> bool:
    """Whether this very version of the file was checked on this machine before."""
    try:
        return os.getxattr(fd, CHECKED_XATTR) == checked_record(name, stat)
    except OSError:
        return False


class PieceFile:
    """A checked piece in the cache directory, open: rows are read on demand, with ``pread``,
    from the record batches that hold them (never mapped, so a file truncated or overwritten
    under a reader raises :class:`DamagedFile`, never SIGBUS). Holds one file descriptor until
    it is garbage-collected."""

    def __init__(self, file: pa.NativeFile, length: int, batch_rows: int,
                 on_read_whole: Callable[[pa.Table], pa.Table | None] | None = None) -> None:
        self._file, self._length = file, length
        self._reader = pa.ipc.open_file(file, footer_offset=length)
        self.batch_rows = max(1, batch_rows)
        # given the whole piece when a read copied it all; returns it held (one chunk) or None
        self._on_read_whole = on_read_whole

    @property
    def num_rows(self) -> int:
        count = self._reader.num_record_batches
        return 0 if not count else ((count - 1) * self.batch_rows
                                    + self._reader.get_batch(count - 1).num_rows)

    def take(self, rows: np.ndarray) -> pa.Table:
        """The piece's ``rows`` (row numbers in the piece, any order), reading only their
        record batches (all of them with one ``pread`` when most are needed)."""
        table, where = self.locate(rows)
        return rows_at(table, where).combine_chunks()

    def locate(self, rows: np.ndarray) -> tuple[pa.Table, np.ndarray]:
        """The record batches that hold the piece's ``rows`` (read as :meth:`take` reads them,
        no copy made of them), and each row's row number in them: a gather takes the rows
        straight from there (:func:`~lanceloader.rows.gather.gather_rows`)."""
        rows = np.asarray(rows, dtype=np.int64)
        try:
            batch = rows // self.batch_rows
            needed = np.unique(batch)
            source = self._reader
            if len(needed) * 2 > source.num_record_batches:  # most of it: one pread
                whole = pa.ipc.open_file(pa.py_buffer(self._file.read_at(self._length, 0)))
                if self._on_read_whole is not None:
                    held = self._on_read_whole(whole.read_all())
                    if held is not None:  # held now: one chunk, the rows are its row numbers
                        if len(rows) and int(rows.max()) >= held.num_rows:
                            raise DamagedFile(f"has {held.num_rows} rows where row "
                                              f"{int(rows.max())} is read")
                        return held, rows
                source = whole
            table = pa.Table.from_batches([source.get_batch(int(b)) for b in needed],
                                          self._reader.schema)
        except (pa.ArrowInvalid, OSError, ValueError) as exc:
            raise DamagedFile(f"unreadable ({exc})") from exc
        where = np.searchsorted(needed, batch) * self.batch_rows + rows % self.batch_rows
        if len(where) and int(where.max()) >= table.num_rows:
            raise DamagedFile(f"has {table.num_rows} rows where row {int(rows.max())} is read")
        return table, where

    def read_all(self) -> pa.Table:
        """Every row of the piece."""
        return self.take(np.arange(self.num_rows))


def rows_at(table: pa.Table, rows: np.ndarray) -> pa.Table:
    """``table``'s ``rows``: a slice (no copy) when they are consecutive, else one ``take``."""
    if not len(rows):
        return table.slice(0, 0)
    first = int(rows[0])
    if int(rows[-1]) - first + 1 == len(rows) and bool(np.all(np.diff(rows) == 1)):
        return table.slice(first, len(rows))
    return table.take(pa.array(rows))


def batch_rows_of(table: pa.Table) -> int:
    """Rows per record batch of a piece's file: about :data:`BATCH_BYTES` each, so a read of a
    few rows of a piece reads a few hundred KiB of it, not the whole file."""
    per_row = table.nbytes / max(1, table.num_rows)
    return int(max(64, BATCH_BYTES // max(1.0, per_row)))


def bytes_name(key: str) -> str:
    """The cache name of the byte range kept under ``key`` (any string): a hash, so a key
    holds any characters and never names another cache file.

    >>> bytes_name("s3://b/v.lance#3:0-4096")
    'bytes-695deffaf550302708a8e191841b37f6'
    """
    if not isinstance(key, str):
        raise TypeError(f"fetch_bytes needs a str key naming the bytes (e.g. "
                        f"f'{{uri}}#{{row}}:{{start}}-{{end}}'), got the {type(key).__name__} "
                        f"{key!r}")
    return "bytes-" + hashlib.blake2b(key.encode(), digest_size=16).hexdigest()


def made_bytes(key: str, make: Callable[[], bytes]) -> bytes:
    """``make()``'s result as ``bytes``; anything else is a TypeError naming the key."""
    data = make()
    if isinstance(data, bytearray | memoryview):
        return bytes(data)
    if not isinstance(data, bytes):
        raise TypeError(f"fetch_bytes({key!r}, make): make() must return bytes (the range's "
                        f"content), it returned a {type(data).__name__}")
    return data


def _writer_alive(entry: str) -> bool:
    """Whether the writer of the temporary file ``entry`` may still be writing it: its process
    (named in the file's name, in this PID namespace) is alive. Files of another namespace count
    as alive until :data:`STALE_TEMPORARY_S`."""
    parts = entry[len(TEMPORARY):].split("-")
    if len(parts) < 3 or parts[0] != lifetime.NAMESPACE or not parts[1].isdigit():
        return True
    try:
        os.kill(int(parts[1]), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
            self.drop(name, path, version, str(exc))
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

    def drop(self, name: str, path: Path, version: tuple[int, int, int] | None, why: str) -> None:
        """Remove the damaged file ``path`` (only if it is still the version found damaged, not
        a fresh copy another process published meanwhile), count and log it: once per damaged
        file, by the thread that removed it (others that found it damaged meanwhile see it gone
        or replaced); a file that cannot be removed (a read-only cache) once per version."""
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
        return (self.writable and name not in self._too_big
                and estimate * ESTIMATE_MARGIN <= self.size)

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
        sink = pa.MockOutputStream()  # the file's exact size, before reserving it
        with pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table, max_chunksize=batch_rows)
        length = sink.size()

        def write(file: Any) -> None:
            with pa.ipc.new_file(pa.PythonFile(file, mode="w"), table.schema) as writer:
                writer.write_table(table, max_chunksize=batch_rows)
        kept = self._publish(self._path(name), name, length, write, batch_rows)
        if not kept:
            if length + TRAILER.size > self.size:
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
                self._publish(path, name, len(data), lambda file: file.write(data))
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
                if self._publish(path, name, len(data), lambda file: file.write(data)):
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

    def _publish(self, path: Path, name: str, length: int, write: Callable[[Any], None],
                 extra: int = 0) -> bool:
        """Make room for the file (``length`` bytes of payload and the trailer) and reserve it
        (a temporary file of exactly that size, so every other writer's eviction counts it),
        under the directory's lock; then, without the lock (writers in parallel), ``write(file)``
        the payload, seal it (checksum trailer) and rename it into place (atomic: readers see
        the whole file or none). Never more than the cap in the directory, temporary files
        included. Returns whether the file was published; a failed write (full disk, read-only
        directory) stops this object's writes with one warning, never raises."""
        size = length + TRAILER.size
        if size > self.size or not self.writable:
            return False
        temporary = path.with_name(f"{TEMPORARY}{lifetime.NAMESPACE}-{os.getpid()}-"
                                   f"{threading.get_ident()}-{path.name}")
        try:
            with self._lock("directory", block=True):
                if not self._make_room(size):
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
            with open(temporary, "r+b") as file:
                write(file)
                if file.tell() != length:
                    raise OSError(errno.EIO, f"wrote {file.tell()} bytes of {length}")
                file.flush()
                crc, done = zlib.crc32(name.encode()), 0
                while done < length:
                    chunk = os.pread(file.fileno(), min(CHECK_CHUNK, length - done), done)
                    if not chunk:
                        raise DamagedFile("truncated by someone else while written")
                    crc, done = zlib.crc32(chunk, crc), done + len(chunk)
                file.write(seal(name, length, crc, extra))
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
        except DamagedFile as exc:  # not kept this time; the directory is fine
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            _logger.warning("cache file %s in the cache directory %r: %s; not kept", path.name,
                            os.fspath(self.root), exc)
            return False
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            self._stop_writing(f"writing {path.name}", exc)
            return False
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise

    def _make_room(self, size: int) -> bool:
        """Remove least recently used files (and temporary files of dead writers) until
        ``size`` more bytes fit under the cap; False when they cannot (live writers'
        reservations hold the room)."""
        files, used, now = [], 0, time.time()
        for entry in os.scandir(self.root):
            if entry.name.endswith(LOCK):
                continue
            try:
                stat = entry.stat()
            except FileNotFoundError:
                continue
            if not entry.name.startswith(TEMPORARY):
                files.append((stat.st_atime, stat.st_size, entry.path))
            elif not _writer_alive(entry.name) or now - stat.st_mtime > STALE_TEMPORARY_S:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
                continue
            used += stat.st_size
        for _, file_size, path in sorted(files):
            if used + size <= self.size:
                break
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            used -= file_size
        return used + size <= self.size

    def remove_dead_temporaries(self) -> None:
        """Remove the temporary files of writers that died (a SIGKILLed worker's): they hold
        room under the cap until removed. Silent when the directory cannot be written."""
        with contextlib.suppress(OSError):
            for entry in os.scandir(self.root):
                if entry.name.startswith(TEMPORARY) and not _writer_alive(entry.name):
                    with contextlib.suppress(OSError):
                        os.unlink(entry.path)

    def used_bytes(self) -> int:
        """Bytes the cache's files take now (temporary reservations included)."""
        used = 0
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(self.root):
                with contextlib.suppress(FileNotFoundError):  # evicted meanwhile
                    used += 0 if entry.name.endswith(LOCK) else entry.stat().st_size
        return used


def cache_failure(root: Path, what: str, exc: OSError, reading: bool = False) -> str:
    """The message for a failed operation on the cache directory ``root``: the directory, what
    failed, why, and the fix; never the dataset."""
    why = exc.strerror or str(exc)
    code = exc.errno
    if code in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        fix = ("free space there, or pass a smaller cache_size= (the cap must fit the free "
               "space)")
    elif code in (errno.EROFS, errno.EACCES, errno.EPERM):
        fix = ("it is read-only: pieces already there are read, others come from the dataset; "
               "give a writable directory to fill it")
    else:
        fix = "check the disk, or give another cache directory"
    then = ("that file is read from the dataset" if reading else
            "reads go on without keeping new pieces (as without a cache)")
    return (f"cache directory {os.fspath(root)!r}: {what} failed ({why}); {then}. Fix: {fix}")


class MemoryCache:
    """Pieces as Arrow tables in this process, at most ``size`` bytes; see the module's text.

    Pickles as its size alone: another process starts with an empty cache of its own.
    ``fills`` counts the pieces it loaded.
    """

    def __init__(self, size: int) -> None:
        self.size = int(size)
        self.fills = 0
        self._tables: OrderedDict[str, pa.Table | bytes] = OrderedDict()
        self._used = 0
        self._lock = threading.Lock()
        self._loading: dict[str, threading.Lock] = {}

    def __repr__(self) -> str:
        return f"MemoryCache(size={self.size})"

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

    def keeps(self, name: str, estimate: float) -> bool:
        """Whether a piece of about ``estimate`` bytes fits the budget."""
        return estimate <= self.size

    def fill(self, name: str, load: Callable[[], pa.Table], block: bool) -> pa.Table | None:
        return self.fill_piece(name, load, block)[0]

    def fill_piece(self, name: str, load: Callable[[], pa.Table], block: bool
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

    def used_bytes(self) -> int:
        return self._used


# --- a Source's reads through its cache ---------------------------------------------------


def fill_plan(source: Any) -> tuple[np.ndarray, np.ndarray, bool]:
    """Per piece, its rows and the share of them the filter and split select; and whether
    all the pieces worth keeping (that share >= FILL_FRACTION) fit in the cache together."""
    if source._piece_fill is None:
        assert source.cache is not None
        sizes = np.concatenate([
            np.diff(np.minimum(np.arange(0, int(n) + source._piece_rows, source._piece_rows), n))
            for n in np.diff(source._fragment_starts)] or [np.zeros(0, np.int64)])
        if source._rows is None:
            selected = sizes
        else:
            fragment = source._fragment_of(source._rows)
            local = source._rows - source._fragment_starts[fragment]
            selected = np.bincount(source._piece_base[fragment] + local // source._piece_rows,
                                   minlength=len(sizes))
        share = selected / np.maximum(sizes, 1)
        kept = sizes[share >= FILL_FRACTION].sum() * source.bytes_per_row
        source._piece_fill = sizes, share, bool(kept <= source.cache.size)
    return source._piece_fill


def read_cached(source: Any, offsets: np.ndarray) -> tuple[pa.Table, int]:
    """``source``'s rows at Lance ``offsets`` through the cache: rows of pieces in the cache come
    from it; a missing piece is filled whole when that is worth it and it can be kept (see
    :mod:`lanceloader.rows.cache`), the other rows are read from Lance. Returns the rows in the
    order of ``offsets`` and how many came from a piece in the cache (found there, or filled and
    kept by this read; a piece downloaded and not kept counts as the dataset's).

    No sort of the offsets: the request is grouped by piece (one stable ``argsort`` of the
    piece numbers keeps the request's order within each piece), and every row is copied once,
    from its piece straight into its place in the result
    (:func:`~lanceloader.rows.gather.gather_rows`); rows consecutive in one piece are a slice
    of it (no copy), unless the piece is mapped (read-only pages: always copied out). Lance
    calls on an object store end within seconds when the store is gone
    (:func:`~lanceloader.rows.dataset.reaching_store`).
    """
    assert source.cache is not None
    cache = source.cache
    if not len(offsets):
        return source.schema_table().slice(0, 0), 0
    sizes, share, fits = fill_plan(source)
    size = source._piece_rows
    fragment = source._fragment_of(offsets)
    local = offsets - source._fragment_starts[fragment]  # row in its fragment
    number = local // size
    piece = source._piece_base[fragment] + number
    order = (np.arange(len(piece)) if bool(np.all(piece[1:] >= piece[:-1]))
             else np.argsort(piece, kind="stable"))
    grouped = piece[order]
    breaks = np.flatnonzero(grouped[1:] != grouped[:-1]) + 1
    parts: list[pa.Table] = []  # per part: a piece (or rows of one), rows in it, their places
    wheres: list[np.ndarray | None] = []
    placed: list[np.ndarray] = []
    direct: list[np.ndarray] = []
    waiting: list[np.ndarray] = []
    cached = 0

    def name_of(i: int) -> str:
        return piece_name(source._fragment_keys[int(fragment[i])], size, int(number[i]))

    def load(i: int) -> Any:
        frag, start = int(fragment[i]), int(number[i]) * size

        def piece_table() -> pa.Table:
            _ = source.dataset  # opened in this process (a worker opens it at its first miss)
            return reaching_store(
                lambda: source.read_fragment(frag, start, size),  # blob columns as bytes
                source.uri, source.storage_options)
        return piece_table

    def take(found: pa.Table | PieceFile, request: np.ndarray, kept: bool) -> bool:
        """Place the request's rows of a piece; False when its file proved damaged."""
        nonlocal cached
        rows = local[request] - int(number[request[0]]) * size  # rows in the piece
        if isinstance(found, PieceFile):  # the record batches holding the rows
            try:
                found, rows = found.locate(rows)
            except DamagedFile as exc:
                cache.drop(name_of(int(request[0])), cache._path(name_of(int(request[0]))),
                           None, str(exc))
                return False
        parts.append(found)
        wheres.append(rows)
        placed.append(request)
        cached += len(request) if kept else 0
        return True

    def fill(group: np.ndarray, block: bool) -> bool:
        """Fill the group's piece and place its rows (a damaged file: once more); False when
        another is filling it and ``block`` is False."""
        for _ in range(2):
            found, kept = cache.fill_piece(name_of(int(group[0])), load(int(group[0])), block)
            if found is None:
                return False
            if take(found, group, kept):
                return True
        direct.append(group)
        return True

    for group in np.split(order, breaks):
        i = int(group[0])
        found = cache.get(name_of(i))
        if found is not None and take(found, group, True):
            continue
        p = int(piece[i])
        if share[p] < FILL_FRACTION or not cache.keeps(name_of(i), sizes[p] * source.bytes_per_row
                                                       ) or not (
                fits or len(np.unique(offsets[group])) >= FILL_FRACTION * sizes[p]):
            direct.append(group)
            continue
        if not fill(group, block=False):  # another worker is filling it: first do the rest
            waiting.append(group)
    for group in waiting:
        fill(group, block=True)
    if direct:
        request = np.concatenate(direct)
        parts.append(reaching_store(lambda: source._read_offsets(offsets[request]),
                                    source.uri, source.storage_options))
        wheres.append(None)
        placed.append(request)
    if len(parts) == 1 and is_identity(placed[0]) and not getattr(cache, "mapped", False):
        # one piece, in order: a slice when it can (never of a mapped piece: its pages are
        # read-only, and a tensor wrapping them would crash the first in-place write)
        where = wheres[0]
        table = parts[0] if where is None else rows_at(parts[0], where)
        if where is not None and table.num_columns and table.column(0).num_chunks > 1:
            table = table.combine_chunks()  # a piece file's record batches: one chunk out
    else:
        table = gather_rows(parts, wheres, placed, len(offsets))
    return table.select(source.columns), cached
