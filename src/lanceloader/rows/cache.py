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
    an error after :data:`LOCK_WAIT_S`) makes one download per piece; the file is
    written under a temporary name and renamed (atomic publish: no reader sees half a file).
    Readers map files (``mmap``) without copying. Eviction: least recently used first (a read
    touches the file's mtime), under the directory's lock, before a piece is published, so the
    directory never holds more than ``cache_size`` bytes (a piece bigger than the cap is used
    once and not kept). A file evicted while a reader maps it stays readable until unmapped.
``MemoryCache`` (``cache="memory"``)
    The same pieces as Arrow tables in this process's memory, least recently used out first,
    within ``cache_size`` bytes, shared by the loader's worker threads. A process worker would
    hold a copy each, so ``worker_type="process"`` asks for a directory instead (``/dev/shm/…``
    keeps it in RAM and shares it).

The directory also holds the plans of filters and splits (``plan-*.npy``, see
``Source._select_rows``): every rank and worker of a machine computes a plan once.

>>> import pyarrow as pa, tempfile
>>> cache = DiskCache(tempfile.mkdtemp(), size=1 << 20)
>>> cache.get("a") is None
True
>>> cache.fill("a", lambda: pa.table({"x": [1, 2, 3]}), block=True).num_rows
3
>>> cache.get("a").column("x").to_pylist()
[1, 2, 3]
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import os
import shutil
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from lanceloader.lifecycle import lifetime
from lanceloader.rows.protocol import inverse_permutation, is_identity

# Arrow bytes a piece aims at: big enough that a download is a few large requests (each column
# of a piece is one range read), small enough that a few workers filling pieces stay within the
# loader's memory bound (a piece is in memory while it is written).
PIECE_BYTES = 16 << 20
MIN_PIECE_ROWS = 1024
# A piece is worth downloading whole when a read wants at least this share of its rows.
FILL_FRACTION = 1 / 8
SUFFIX = ".arrow"
LOCK = ".lock"  # empty files whose flock guards a piece (and the directory): never counted
TEMPORARY = ".tmp-"
# Temporary files of a writer that died are removed by the next eviction once this old.
STALE_TEMPORARY_S = 3600.0
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
    if cache == "memory":
        if cache_size is None:
            cache_size = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2
        return MemoryCache(cache_size)
    if not isinstance(cache, str | os.PathLike):
        raise TypeError(f"cache must be None, 'memory' or a directory, got the "
                        f"{type(cache).__name__} {cache!r}")
    root = Path(cache)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"cache={os.fspath(cache)!r}: cannot create the cache directory "
                         f"({exc.strerror}); give a writable local directory") from exc
    if cache_size is None:
        cache_size = shutil.disk_usage(root).free // 2
    return DiskCache(root, cache_size)


class DiskCache:
    """Pieces as Arrow IPC files in ``root``, at most ``size`` bytes; see the module's text.

    Pickles as its directory and size: workers and helper processes open the same directory.
    ``fills`` counts the pieces this object (in this process) downloaded.
    """

    def __init__(self, root: str | os.PathLike[str], size: int) -> None:
        self.root = Path(root)
        self.size = int(size)
        self.fills = 0
        self._count = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {"root": self.root, "size": self.size}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["root"], state["size"])  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"DiskCache({os.fspath(self.root)!r}, size={self.size})"

    def _path(self, name: str) -> Path:
        return self.root / (name + SUFFIX)

    def get(self, name: str) -> pa.Table | None:
        """The piece ``name``, mapped from its file, or None when the cache lacks it."""
        path = self._path(name)
        try:
            source = pa.memory_map(os.fspath(path))
        except FileNotFoundError:
            return None
        try:
            table = pa.ipc.open_file(source).read_all()
        except (pa.ArrowInvalid, OSError):  # damaged on disk: drop it, it is filled again
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            return None
        with contextlib.suppress(FileNotFoundError):
            os.utime(path)  # least recently used goes first
        return table

    @contextlib.contextmanager
    def _lock(self, name: str, block: bool) -> Iterator[bool]:
        """Hold the lock of ``name`` (``.lock`` file; a dead holder's lock is released by the
        kernel). Yields False, without waiting, when another holds it and ``block`` is False;
        with ``block``, waits at most :data:`LOCK_WAIT_S` (polling), then raises TimeoutError:
        a holder that is alive but stuck never hangs its waiters."""
        path = self.root / f".{name}{LOCK}"
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
                        raise TimeoutError(
                            f"waited {LOCK_WAIT_S:.0f} s for {os.fspath(path)!r}, held by another "
                            f"thread or process using the cache {os.fspath(self.root)!r} that "
                            "seems stuck (a dead one releases it at once). Find it with `fuser "
                            f"{os.fspath(path)}` and stop it, or give this loader another "
                            "cache directory") from None
                    time.sleep(pause)
                    pause = min(2 * pause, 0.05)
            yield True
        finally:
            os.close(fd)  # closing releases the lock

    def fill(self, name: str, load: Callable[[], pa.Table], block: bool) -> pa.Table | None:
        """The piece ``name``, from the cache or made by ``load()`` and published; one process
        or thread loads a piece at a time. Returns None, at once, when another is loading it
        and ``block`` is False."""
        with self._lock(name, block) as held:
            if not held:
                return None
            table = self.get(name)
            if table is None:
                table = load().combine_chunks()
                self.put(name, table)
                with self._count:
                    self.fills += 1
        return table

    def load_or_make(self, name: str, make: Callable[[], np.ndarray]) -> tuple[np.ndarray, bool]:
        """The array ``name`` (a ``.npy`` file), made by ``make()`` once for everyone that asks
        for it at the same time; returns it and whether this call made it."""
        path = self.root / (name + ".npy")
        with self._lock(name, block=True):
            try:
                array = np.load(path)
                os.utime(path)
                return array, False
            except (FileNotFoundError, ValueError, OSError):
                array = make()
            buffer = io.BytesIO()
            np.save(buffer, array)
            data = buffer.getvalue()
            self._publish(path, len(data), lambda file: file.write(data))
        return array, True

    def put(self, name: str, table: pa.Table) -> None:
        """Publish ``table`` as ``name`` (after evicting what the cap needs); a table bigger than
        the whole cache is not kept."""
        # The IPC file's size: the data, each buffer padded to 64 bytes, and the messages.
        buffers = sum(len(chunk.buffers()) for column in table.columns for chunk in column.chunks)
        estimate = table.nbytes + 64 * (buffers + 8) + 4096 * (table.num_columns + 2)

        def write(file: Any) -> None:
            with pa.ipc.new_file(pa.PythonFile(file, mode="w"), table.schema) as writer:
                writer.write_table(table)
        self._publish(self._path(name), estimate, write)

    def _publish(self, path: Path, size: int, write: Callable[[Any], None]) -> None:
        """Make room for ``size`` bytes and reserve them (a temporary file of that size, so
        that every other writer's eviction counts it), under the directory's lock; then, without
        the lock (writers in parallel), ``write(file)`` into it, trim it and rename it into
        place (atomic: readers see the whole file or none)."""
        if size > self.size:
            return
        temporary = path.with_name(f"{TEMPORARY}{lifetime.NAMESPACE}-{os.getpid()}-"
                                   f"{threading.get_ident()}-{path.name}")
        with self._lock("directory", block=True):
            self._evict(self.size - size)
            with open(temporary, "wb") as file:
                os.posix_fallocate(file.fileno(), 0, size)
        try:
            with open(temporary, "r+b") as file:
                write(file)
                file.truncate(file.tell())
            os.replace(temporary, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)
            raise

    def _evict(self, room: int) -> None:
        """Remove least recently used files until at most ``room`` bytes are in use."""
        files, used, now = [], 0, time.time()
        for entry in os.scandir(self.root):
            if entry.name.endswith(LOCK):
                continue
            try:
                stat = entry.stat()
            except FileNotFoundError:
                continue
            used += stat.st_size
            if not entry.name.startswith(TEMPORARY):
                files.append((stat.st_mtime, stat.st_size, entry.path))
            elif now - stat.st_mtime > STALE_TEMPORARY_S:  # its writer died before renaming
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
                used -= stat.st_size
        for _, size, path in sorted(files):
            if used <= room:
                break
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            used -= size

    def used_bytes(self) -> int:
        """Bytes the cache's files take now."""
        used = 0
        for entry in os.scandir(self.root):
            with contextlib.suppress(FileNotFoundError):  # evicted meanwhile
                used += 0 if entry.name.endswith(LOCK) else entry.stat().st_size
        return used


class MemoryCache:
    """Pieces as Arrow tables in this process, at most ``size`` bytes; see the module's text.

    Pickles as its size alone: another process starts with an empty cache of its own.
    ``fills`` counts the pieces it loaded.
    """

    def __init__(self, size: int) -> None:
        self.size = int(size)
        self.fills = 0
        self._tables: OrderedDict[str, pa.Table] = OrderedDict()
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

    def fill(self, name: str, load: Callable[[], pa.Table], block: bool) -> pa.Table | None:
        with self._lock:
            loading = self._loading.setdefault(name, threading.Lock())
        if not loading.acquire(blocking=block):
            return None
        try:
            table = self.get(name)
            if table is None:
                table = load().combine_chunks()
                self.put(name, table)
                with self._lock:
                    self.fills += 1
            return table
        finally:
            loading.release()

    def put(self, name: str, table: pa.Table) -> None:
        if table.nbytes > self.size:
            return
        with self._lock:
            while self._tables and self._used + table.nbytes > self.size:
                _, old = self._tables.popitem(last=False)
                self._used -= old.nbytes
            self._tables[name] = table
            self._used += table.nbytes

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
    """``source``'s rows at Lance ``offsets`` through the cache: rows of pieces in the cache come from it;
    a missing piece is filled whole when that is worth it (see :mod:`lanceloader.rows.cache`),
    the other rows are read from Lance. Returns the rows in the order of ``offsets`` and
    how many came from the cache (or from a piece this read filled).

    No sort of the offsets: the request is grouped by piece (a stable sort of the piece
    numbers keeps the request's order within each piece), each piece gives its rows with
    one ``take`` (a slice when they are consecutive), and one ``take`` restores the
    request's order, when it is not already that.
    """
    assert source.cache is not None
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
    parts: list[pa.Table] = []
    placed: list[np.ndarray] = []  # per part, the request index of each of its rows
    direct: list[np.ndarray] = []
    waiting: list[np.ndarray] = []

    def name_of(i: int) -> str:
        return piece_name(source._fragment_keys[int(fragment[i])], size, int(number[i]))

    def load(i: int) -> Any:
        frag, start = int(fragment[i]), int(number[i]) * size

        def piece_table() -> pa.Table:
            _ = source.dataset  # opened in this process (a worker opens it at its first miss)
            return source._fragments[frag].to_table(columns=source.columns, offset=start,
                                                  limit=size)
        return piece_table

    def take(table: pa.Table, request: np.ndarray) -> None:
        rows = local[request] - int(number[request[0]]) * size  # rows in the piece
        first = int(rows[0])
        consecutive = int(rows[-1]) - first + 1 == len(rows) and bool(
            np.all(np.diff(rows) == 1))
        parts.append(table.slice(first, len(rows)) if consecutive
                     else table.take(pa.array(rows)))
        placed.append(request)

    for group in np.split(order, breaks):
        i = int(group[0])
        table = source.cache.get(name_of(i))
        if table is None:
            p = int(piece[i])
            if share[p] < FILL_FRACTION or not (
                    fits or len(np.unique(offsets[group])) >= FILL_FRACTION * sizes[p]):
                direct.append(group)
                continue
            table = source.cache.fill(name_of(i), load(i), block=False)
            if table is None:  # another worker is filling it: first do the rest
                waiting.append(group)
                continue
        take(table, group)
    for group in waiting:
        table = source.cache.fill(name_of(int(group[0])), load(int(group[0])), block=True)
        assert table is not None
        take(table, group)
    cached = sum(len(p) for p in placed)
    if direct:
        request = np.concatenate(direct)
        parts.append(source._read_offsets(offsets[request]))
        placed.append(request)
    table = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
    where = np.concatenate(placed) if len(placed) > 1 else placed[0]
    if not is_identity(where):
        table = table.take(pa.array(inverse_permutation(where)))
    return table.select(source.columns), cached
