"""Plans and byte ranges: the files of a cache directory that are not pieces, for
:class:`~lanceloader.rows.cache.disk.DiskCache` (a mixin: its methods use the cache's reading,
locking and publishing). A plan (``plan-*.npy``: the row offsets a filter or split keeps) is
made once for every rank and worker of the machine (:meth:`PlansAndRanges.load_or_make`); a
byte range that is not rows (a video clip's range of a blob) is made once per key
(:meth:`PlansAndRanges.fetch_bytes`). Both are sealed, checked, capped and dropped when damaged
like pieces: every byte returned was copied into the process and checked there.

Contract: the methods run in any thread or process that holds the cache; one ``make()`` per
name at a time across them (the name's ``flock``); ``make()``'s errors reach the caller and
keep nothing; a directory that cannot be written gives what ``make()`` made, unkept, with one
warning.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from lanceloader.rows.cache.files import BYTES_SUFFIX, CacheLockTimeout, bytes_name, made_bytes


class PlansAndRanges:
    """``load_or_make`` and ``fetch_bytes`` of :class:`~lanceloader.rows.cache.disk.DiskCache`."""

    root: Path
    _lock: Any
    _publish: Any
    _read_whole: Any
    _counted: Any
    _stop_writing: Any
    drop: Any

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
        >>> from lanceloader.rows.cache.disk import DiskCache
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
                if self._publish(path, name, data) is not None:
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
        """The checked payload of ``path`` (a copy checked where it lies), or None when it is
        missing or was damaged (then dropped and counted by :meth:`_read_whole`)."""
        read = self._read_whole(name, path)
        return None if read is None else read[0].to_pybytes()

    def _load_array(self, path: Path, name: str) -> np.ndarray | None:
        read = self._read_whole(name, path)
        if read is None:
            return None
        try:
            return np.load(io.BytesIO(read[0]), allow_pickle=False)
        except (ValueError, OSError, SyntaxError, EOFError) as exc:  # checked, yet unparsable
            self.drop(name, path, read[2], f"unreadable array ({type(exc).__name__})")
            return None
