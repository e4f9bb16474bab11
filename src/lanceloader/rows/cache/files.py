"""Cache files: the cache directory's files (names, on-disk format, integrity checks), errors.

Every cache file (a piece, a plan, a byte range) is its payload followed by a trailer
(:data:`TRAILER`: the payload's length, an ``extra`` number, an XXH3-64 checksum of the file's
name, payload and ``extra``, and :data:`MAGIC`). :func:`seal` makes the trailer;
:func:`check_sealed` reads a file with ``pread`` and checks it, raising :class:`DamagedFile`;
:func:`read_trailer` reads the trailer alone of a version checked before; :func:`mark_checked`
and :func:`was_checked` record and look up a checked version on the file itself
(:data:`CHECKED_XATTR`). A piece file is Arrow IPC in record batches of about
:data:`BATCH_BYTES` (:func:`batch_rows_of`), read batch by batch through :class:`PieceFile`.
Also here: the names of the directory's files (:data:`SUFFIX`, :data:`BYTES_SUFFIX`,
:data:`LOCK`, :data:`TEMPORARY`); :func:`bytes_name` and :func:`made_bytes`, the name and
content of a byte range kept by ``fetch_bytes`` (both caches); whether a directory lies in
memory (:func:`in_memory_filesystem`: its pieces are then mapped); and what a failed directory
reports: :class:`CacheError`, :class:`CacheLockTimeout` and the message :func:`cache_failure`.

Contract: functions of a file descriptor, a name or a table; they run in whichever thread or
process calls them, take no lock, keep no state and never remove a file: a
:class:`DamagedFile` is the caller's to drop and count (``DiskCache.drop``). A
:class:`PieceFile` holds its open file until it is garbage-collected. Nothing here imports
the caches (:mod:`lanceloader.rows.cache.disk`, :mod:`lanceloader.rows.cache.pieces`), which build
on it.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import os
import struct
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import xxhash

from lanceloader.lifecycle.lifetime import picklable_error
from lanceloader.rows.dataset import ReadError
from lanceloader.rows.protocol import distinct

SUFFIX = ".arrow"
BYTES_SUFFIX = ".bin"  # byte ranges that are not rows (fetch_bytes)
LOCK = ".lock"  # empty files whose flock guards a piece (and the directory): never counted
TEMPORARY = ".tmp-"
# Every cache file ends with this trailer: payload length, extra (a piece's rows per record
# batch), XXH3-64 of the name, payload and extra, and the magic. XXH3 sums ~9 GB/s on one core
# where zlib's CRC-32 summed ~2-3 GB/s: sealing a 13.6 MB piece costs 1.2 ms, not 4.3.
TRAILER = struct.Struct("<QQQ8s")
MAGIC = b"LLCACHE2"
OLD_MAGICS = (b"LLCACHE1",)  # files of older versions (a CRC-32 trailer): dropped, not damaged
CHECK_CHUNK = 1 << 20  # bytes read per pread while checking a file
# The extended attribute that records a file version checked on this machine (name, inode, size,
# mtime): another process opening the same version reads the trailer only.
CHECKED_XATTR = "user.lanceloader.checked"
# Record batches of a piece file: a read of a few rows reads their batches only.
BATCH_BYTES = 256 << 10


class CacheError(ReadError):
    """The cache directory failed, not the dataset: the message names the directory, what
    failed and the fix. A :class:`~lanceloader.rows.dataset.ReadError`, so code that catches
    read failures catches it too; ``root`` is the directory."""

    def __init__(self, detail: str, root: str = "") -> None:
        super().__init__(detail)
        self.root = root

    def __reduce__(self) -> Any:
        cause = self.__cause__
        return (
            type(self),
            (self.detail, self.root),
            {**self.__dict__, "__cause__": None if cause is None else picklable_error(cause)},
        )


class CacheLockTimeout(CacheError, TimeoutError):
    """A lock of the cache directory was held longer than
    :data:`~lanceloader.rows.cache.disk.LOCK_WAIT_S` by a live holder."""


class DamagedFile(Exception):
    """A cache file failed its check (checksum, name, length, Arrow structure): drop it."""


class OlderFile(DamagedFile):
    """A cache file an older lanceloader wrote (another trailer): dropped and read again like a
    damaged one, but neither counted nor warned about (it is not damage: an upgrade)."""


def checksum(name: str, parts: Iterable[Any], extra: int = 0) -> int:
    """XXH3-64 of the file's ``name``, its payload (``parts``, buffers in order) and ``extra``:
    a file's checksum binds its content to its name, so a piece renamed or copied over another
    fails.

    >>> checksum("a", [b"xyz"]) == checksum("a", [b"x", b"yz"]) != checksum("b", [b"xyz"])
    True
    """
    summed = xxhash.xxh3_64(name.encode())
    for part in parts:
        summed.update(part)
    summed.update(extra.to_bytes(8, "little"))
    return summed.intdigest()


def seal(name: str, data: Any, extra: int = 0) -> bytes:
    """The trailer that ends every cache file: the payload ``data``'s length, an ``extra``
    number (a piece's rows per record batch) and the checksum of name, payload and ``extra``.

    >>> len(seal("a", b"xyz")) == TRAILER.size
    True
    """
    return TRAILER.pack(memoryview(data).nbytes, extra, checksum(name, [data], extra), MAGIC)


def _trailer(fd: int, size: int) -> tuple[int, int, int]:
    """The payload length, ``extra`` and checksum a file's trailer gives."""
    if size < TRAILER.size:
        raise DamagedFile(f"{size} bytes, shorter than its trailer")
    trailer = os.pread(fd, TRAILER.size, size - TRAILER.size)
    if len(trailer) != TRAILER.size:
        raise DamagedFile("truncated while read")
    length, extra, want, magic = TRAILER.unpack(trailer)
    if magic in OLD_MAGICS:
        raise OlderFile("written by an older lanceloader")
    if magic != MAGIC or length != size - TRAILER.size:
        raise DamagedFile("no lanceloader trailer (damaged, or not a lanceloader file)")
    return length, extra, want


def check_sealed(fd: int, size: int, name: str) -> tuple[int, int]:
    """Read the file ``fd`` (``size`` bytes) with ``pread`` (never mapped: a file truncated
    meanwhile is an error, not SIGBUS) and check its trailer against its name and content.
    Returns the payload's length and the trailer's ``extra``; raises :class:`DamagedFile`
    (:class:`OlderFile` for a file of an older version)."""
    length, extra, want = _trailer(fd, size)
    view = memoryview(bytearray(CHECK_CHUNK))

    def chunks() -> Iterator[memoryview]:
        done = 0
        while done < length:
            got = os.preadv(fd, [view[: min(CHECK_CHUNK, length - done)]], done)
            if got <= 0:
                raise DamagedFile("truncated while read")
            yield view[:got]
            done += got

    if checksum(name, chunks(), extra) != want:
        raise DamagedFile("checksum mismatch: its bytes changed, or it is another piece's file")
    return length, extra


def read_sealed(fd: int, name: str, most: int) -> tuple[pa.Buffer, int, tuple[int, int, int]]:
    """The whole file ``fd`` copied into this process's memory with ``pread`` and checked
    there: its payload (a slice of the copy), the trailer's ``extra`` and the version read
    (:func:`version_of`). The checksum is summed over the copy itself, so the bytes returned are
    the bytes checked: a file truncated or written in place before, during or after the copy
    raises :class:`DamagedFile` (:class:`OlderFile` for a file of an older version) or leaves
    the copy intact, never wrong rows and never SIGBUS (nothing is mapped). A file over ``most``
    bytes (the cache's cap, which no file it wrote exceeds) is damaged, never allocated."""
    stat = os.fstat(fd)
    size = stat.st_size
    if size < TRAILER.size:
        raise DamagedFile(f"{size} bytes, shorter than its trailer")
    if size > most:
        raise DamagedFile(f"{size} bytes, larger than the cache's cap of {most}")
    copy = pa.allocate_buffer(size)
    view, done = memoryview(copy).cast("B"), 0
    while done < size:
        got = os.preadv(fd, [view[done:]], done)
        if got <= 0:
            raise DamagedFile(f"truncated while read ({done} of its {size} bytes)")
        done += got
    length, extra, want, magic = TRAILER.unpack(view[size - TRAILER.size :])
    if magic in OLD_MAGICS:
        raise OlderFile("written by an older lanceloader")
    if magic != MAGIC or length != size - TRAILER.size:
        raise DamagedFile("no lanceloader trailer (damaged, truncated, or not a lanceloader file)")
    if checksum(name, [view[:length]], extra) != want:
        raise DamagedFile("checksum mismatch: its bytes changed, or it is another piece's file")
    return copy.slice(0, length), extra, version_of(stat)


def version_of(stat: os.stat_result) -> tuple[int, int, int]:
    """A file version: inode, size and mtime (a write in place changes the mtime; touching a
    file's access time, as readers do, keeps it)."""
    return stat.st_ino, stat.st_size, stat.st_mtime_ns


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


_UTIME_NOW, _UTIME_OMIT = (1 << 30) - 1, (1 << 30) - 2
_utimensat: Any
try:
    _utimensat = ctypes.CDLL(None, use_errno=True).utimensat
except (OSError, AttributeError):  # not Linux's libc: rewrite the mtime as read
    _utimensat = None


def touch_access_time(path: str, mtime_ns: int) -> None:
    """Set ``path``'s access time to now (least recently used files are evicted first),
    leaving its modification time alone (``UTIME_OMIT``): writing back the mtime a reader saw
    would hide a write made since from every other reader's version check. Where ``utimensat``
    is missing, the mtime ``mtime_ns`` is written back. Raises ``OSError`` (a read-only
    directory: the caller skips it)."""
    if _utimensat is None:
        os.utime(path, ns=(time.time_ns(), mtime_ns))
        return
    times = (_Timespec * 2)(_Timespec(0, _UTIME_NOW), _Timespec(0, _UTIME_OMIT))
    if _utimensat(-100, os.fsencode(path), times, 0) != 0:  # AT_FDCWD
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), path)


def checked_record(name: str, stat: os.stat_result) -> bytes:
    """What :data:`CHECKED_XATTR` holds for a checked file version: its name, inode, size and
    mtime. Any write changes the mtime, a rename over another name changes the name."""
    return f"{name}:{stat.st_ino}:{stat.st_size}:{stat.st_mtime_ns}".encode()


def read_trailer(fd: int, size: int) -> tuple[int, int]:
    """The payload length and ``extra`` of a file whose content was checked before."""
    return _trailer(fd, size)[:2]


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
    """A checked piece in the cache directory too large to read whole, open: rows are read on
    demand, with ``pread``, from the record batches that hold them, into this process's memory
    (never mapped). After each read the file's version (:func:`version_of`) is compared with
    the one checked: a file truncated or written in place since raises :class:`DamagedFile`,
    never SIGBUS and never changed rows (but for a write within the same timestamp tick as the
    check on a kernel without fine-grained timestamps). A read wanting most of the piece reads
    it whole through ``read_whole`` (a checked copy, :func:`read_sealed`), which returns it and
    whether it is held now (one chunk). Holds one file descriptor until garbage-collected."""

    def __init__(
        self,
        file: pa.NativeFile,
        length: int,
        batch_rows: int,
        version: tuple[int, int, int],
        read_whole: Callable[[], tuple[pa.Table, bool]],
    ) -> None:
        self._file, self._length, self._version = file, length, version
        self._reader = pa.ipc.open_file(file, footer_offset=length)
        self.batch_rows = max(1, batch_rows)
        self._read_whole = read_whole

    @property
    def num_rows(self) -> int:
        count = self._reader.num_record_batches
        return (
            0
            if not count
            else ((count - 1) * self.batch_rows + self._reader.get_batch(count - 1).num_rows)
        )

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
            needed = distinct(batch)
            if len(needed) * 2 > self._reader.num_record_batches:  # most of it: read whole
                whole, held = self._read_whole()
                if held:  # one chunk: the rows are its row numbers
                    if len(rows) and int(rows.max()) >= whole.num_rows:
                        raise DamagedFile(
                            f"has {whole.num_rows} rows where row {int(rows.max())} is read"
                        )
                    return whole, rows
                batches = whole.to_batches()
                table = pa.Table.from_batches([batches[int(b)] for b in needed], whole.schema)
            else:
                table = pa.Table.from_batches(
                    [self._reader.get_batch(int(b)) for b in needed], self._reader.schema
                )
                if version_of(os.fstat(self._file.fileno())) != self._version:
                    raise DamagedFile("truncated or written while read")
        except (pa.ArrowInvalid, OSError, ValueError, IndexError) as exc:
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
        raise TypeError(
            f"fetch_bytes needs a str key naming the bytes (e.g. "
            f"f'{{uri}}#{{row}}:{{start}}-{{end}}'), got the {type(key).__name__} "
            f"{key!r}"
        )
    return "bytes-" + hashlib.blake2b(key.encode(), digest_size=16).hexdigest()


def made_bytes(key: str, make: Callable[[], bytes]) -> bytes:
    """``make()``'s result as ``bytes``; anything else is a TypeError naming the key."""
    data = make()
    if isinstance(data, bytearray | memoryview):
        return bytes(data)
    if not isinstance(data, bytes):
        raise TypeError(
            f"fetch_bytes({key!r}, make): make() must return bytes (the range's "
            f"content), it returned a {type(data).__name__}"
        )
    return data


def cache_failure(root: Path, what: str, exc: OSError, reading: bool = False) -> str:
    """The message for a failed operation on the cache directory ``root``: the directory, what
    failed, why, and the fix; never the dataset."""
    why = exc.strerror or str(exc)
    code = exc.errno
    if code in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        fix = "free space there, or pass a smaller cache_size= (the cap must fit the free space)"
    elif code in (errno.EROFS, errno.EACCES, errno.EPERM):
        fix = (
            "it is read-only: pieces already there are read, others come from the dataset; "
            "give a writable directory to fill it"
        )
    else:
        fix = "check the disk, or give another cache directory"
    then = (
        "that file is read from the dataset"
        if reading
        else "reads go on without keeping new pieces (as without a cache)"
    )
    return f"cache directory {os.fspath(root)!r}: {what} failed ({why}); {then}. Fix: {fix}"


# Filesystems whose files are pages of memory: no disk under them, so no media error a mapped
# read could meet, and a copy of a piece per process would only double the memory it takes.
MEMORY_FILESYSTEMS = frozenset({"tmpfs", "ramfs"})


def in_memory_filesystem(path: str | os.PathLike[str], mounts: str = "/proc/self/mounts") -> bool:
    """Whether ``path`` lies on a filesystem in memory (tmpfs, as ``/dev/shm``, or ramfs): the
    mount point holding it is the longest one of ``mounts`` that is a prefix of its real path.
    False where ``mounts`` cannot be read (not Linux): a directory is then read as on a disk.

    >>> import tempfile; m = tempfile.NamedTemporaryFile("w", suffix=".mounts", delete=False)
    >>> _ = m.write("/dev/vda / ext4 rw 0 0\\ntmpfs /dev/shm tmpfs rw 0 0\\n"); m.close()
    >>> in_memory_filesystem("/dev/shm/lance-cache", m.name), in_memory_filesystem("/data", m.name)
    (True, False)
    """
    real = os.path.realpath(path)
    best, kind = "", ""
    try:
        with open(mounts) as file:
            for line in file:
                fields = line.split()
                if len(fields) < 3:
                    continue
                point = fields[1].replace("\\040", " ")
                inside = real == point or real.startswith(point.rstrip("/") + "/")
                if inside and len(point) >= len(best):
                    best, kind = point, fields[2]
    except OSError:
        return False
    return kind in MEMORY_FILESYSTEMS
