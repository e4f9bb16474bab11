"""Recycled shared memory for process workers' results: a worker writes a result into one of a
few ``/dev/shm`` files it keeps (its *segments*), and the consumer hands the segment back when
the last array viewing it is gone, so the next result goes into memory whose pages exist.

Why: a fresh file per result made the kernel allocate (and zero) every page twice, in the
worker's write and in the consumer's first touch of its mapping: on a cached shuffle, 0.33-0.42
µs of CPU a row of 272 B, more than the gather that made the rows (docs/performance.md,
"Process workers across epochs"). Written into a segment used before, a result costs its copy.

Contract:

* A worker (:class:`Segments`) has at most :data:`SLOTS` segments and one *flags* file, a byte a
  slot: 1 while the consumer may hold the slot's arrays, 0 once it gave them back. Only the
  worker sets a byte to 1 (before it sends the result), only the consumer sets it to 0 (after
  the last array viewing the slot died), so a slot is never written while a user holds a batch
  of it. A result goes into the smallest free segment it fits; with none, into a new segment
  (a slot never used, or a free one too small, replaced); with every slot held, into a file of
  its own, as before (a worker never waits for the consumer). A free segment unused for
  :data:`IDLE_PACKS` results is removed (its memory goes back once the consumer unmaps it).
* The consumer (:class:`Leases`) maps a segment the first time it sees it and unlinks its name
  at once (so does it the flags file): nothing is left in ``/dev/shm`` by a live pool, and the
  memory goes back when both processes let go. The arrays of a result view one NumPy array over
  the segment; a ``weakref.finalize`` on it gives the slot back when the last of them dies
  (arrays, tensors from ``torch.from_numpy``, Arrow buffers over them: anything that holds a
  view holds it). Arrays handed to the user stay valid, and unchanged, as long as they live.
* A process forked from the consumer while it holds batches keeps them unchanged: at a fork,
  every slot the consumer holds is never given back (the worker stops reusing it); a forked
  child never gives a slot back.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import threading
import weakref
from pathlib import Path
from typing import Any

from lanceloader.engine.transport import (
    Packing,
    rebuild,
    take_apart,
    take_mapping,
    write_arrays,
    write_into,
)

#: segments a worker keeps (its results in flight and held by the consumer take one each)
SLOTS = 8
#: a free segment unused for this many of its worker's results is removed
IDLE_PACKS = 32
#: a segment's size is rounded up to this (results of one loader differ by a few rows)
GRAIN = 1 << 20
HELD, FREE = 1, 0

# (flags path, slot, segment path, capacity), or a file of the result's own
Where = tuple[str, int, str, int] | str


class Segments:
    """A worker's segments (see the module text): ``base`` names its files."""

    def __init__(self, base: str | os.PathLike[str]) -> None:
        self._base = os.fspath(base)
        self._flags_path = f"{self._base}-flags"
        self._flags: mmap.mmap | None = None
        self._fds: list[int | None] = [None] * SLOTS
        self._sizes = [0] * SLOTS
        self._paths = [""] * SLOTS
        self._used = [0] * SLOTS  # the pack count when each slot was last written
        self._packs = 0

    def _flags_map(self) -> mmap.mmap:
        if self._flags is None:
            fd = os.open(self._flags_path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
            try:
                os.ftruncate(fd, SLOTS)
                self._flags = mmap.mmap(fd, SLOTS)
            finally:
                os.close(fd)
        return self._flags

    def pack(self, result: Any, path: Path) -> tuple[bytes, Any, Where]:
        """Write the arrays of ``result`` into a free segment (or the new file ``path`` when
        every slot is held); the pickled rest, the arrays' layout and where they are."""
        packing = take_apart(result)
        self._packs += 1
        if not packing.regions:
            return packing.skeleton, packing.layout, ""
        slot = self._slot_for(packing.size)
        if slot is None:
            write_arrays(path, packing.regions)
            return packing.skeleton, packing.layout, str(path)
        self._write(slot, packing)
        where = (self._flags_path, slot, self._paths[slot], self._sizes[slot])
        return packing.skeleton, packing.layout, where

    def _write(self, slot: int, packing: Packing) -> None:
        flags = self._flags_map()
        flags[slot] = HELD  # before the write: the consumer gives it back only after a result
        self._used[slot] = self._packs
        fd = self._fds[slot]
        assert fd is not None
        write_into(fd, packing.regions, packing.offsets)

    def _slot_for(self, size: int) -> int | None:
        """The free slot whose segment fits ``size`` (the smallest), or one made for it; None
        when every slot is held. Frees segments idle for :data:`IDLE_PACKS` results."""
        flags = self._flags_map()
        free = [i for i in range(SLOTS) if flags[i] == FREE]
        for i in free:
            if self._fds[i] is not None and self._packs - self._used[i] > IDLE_PACKS:
                self._drop(i)
        fits = [i for i in free if self._fds[i] is not None and self._sizes[i] >= size]
        if fits:
            return min(fits, key=lambda i: self._sizes[i])
        if not free:
            return None
        slot = min(free, key=lambda i: self._sizes[i])  # unused (0) first, else the smallest
        self._drop(slot)
        self._make(slot, -(-size // GRAIN) * GRAIN)
        return slot

    def _make(self, slot: int, capacity: int) -> None:
        path = f"{self._base}-seg{slot}-{self._packs}"
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, capacity)
        except BaseException:
            os.close(fd)
            Path(path).unlink(missing_ok=True)
            raise
        self._fds[slot], self._sizes[slot], self._paths[slot] = fd, capacity, path

    def _drop(self, slot: int) -> None:
        """Let go of the slot's segment (free: the consumer holds none of it; its name was
        unlinked when the consumer mapped it, or is unlinked here)."""
        fd = self._fds[slot]
        if fd is None:
            return
        os.close(fd)
        Path(self._paths[slot]).unlink(missing_ok=True)
        self._fds[slot], self._sizes[slot], self._paths[slot] = None, 0, ""


class _Ring:
    """The consumer's side of one worker's segments: the flags, and each slot's mapping."""

    def __init__(self, flags_path: str) -> None:
        fd = os.open(flags_path, os.O_RDWR)
        try:
            self.flags = mmap.mmap(fd, SLOTS)
        finally:
            os.close(fd)
            Path(flags_path).unlink(missing_ok=True)
        self.owner = os.getpid()
        self.maps: dict[int, tuple[str, mmap.mmap]] = {}
        self.held: set[int] = set()
        self.kept_by_fork: set[int] = set()
        self.lock = threading.Lock()

    def lease(self, slot: int, path: str, capacity: int) -> ctypes.Array[ctypes.c_char]:
        """Slot ``slot``'s segment as a new object over its mapping (mapped once per segment:
        a new path is a new segment; the slot's old mapping lives while viewed). Arrays made
        from it (``np.frombuffer``) hold it: its death is the last of theirs. (Not a NumPy
        view: ``np.frombuffer`` of one refers to the array it views, not to it.)"""
        known = self.maps.get(slot)
        if known is None or known[0] != path:
            mapping = take_mapping(Path(path))
            if len(mapping) != capacity:
                raise RuntimeError(f"segment {path} is {len(mapping)} bytes, not {capacity}")
            known = self.maps[slot] = (path, mapping)
        return (ctypes.c_char * capacity).from_buffer(known[1])

    def lend(self, slot: int) -> None:
        with self.lock:
            self.held.add(slot)

    def give_back(self, slot: int) -> None:
        """The last array of slot ``slot``'s result died: the worker may write it again (not
        in a forked child, nor a slot held when the process forked)."""
        if os.getpid() != self.owner:
            return
        with self.lock:
            self.held.discard(slot)
            if slot in self.kept_by_fork:
                return
            self.flags[slot] = FREE

    def forked(self) -> None:
        with self.lock:
            self.kept_by_fork |= self.held


class Leases:
    """The consumer's side of a pool's segments (see the module text)."""

    def __init__(self) -> None:
        self._rings: dict[str, _Ring] = {}
        _live.add(self)

    def unpack(self, skeleton: bytes, layout: Any, where: Where) -> Any:
        """The result a worker packed (:meth:`Segments.pack`), its arrays viewing shared
        memory: a segment (given back when they are gone) or a file of its own."""
        if not layout:
            return rebuild(skeleton, layout, None)
        if isinstance(where, str):
            return rebuild(skeleton, layout, take_mapping(Path(where)))
        flags_path, slot, path, capacity = where
        ring = self._rings.get(flags_path)
        if ring is None:
            ring = self._rings[flags_path] = _Ring(flags_path)
        lease = ring.lease(slot, path, capacity)
        ring.lend(slot)
        weakref.finalize(lease, ring.give_back, slot)
        return rebuild(skeleton, layout, lease)

    def forget(self, flags_prefix: str = "") -> None:
        """Drop the rings whose flags file starts with ``flags_prefix`` (a worker gone, or
        every one at a pool's close); arrays still held keep their mappings."""
        for key in [k for k in self._rings if k.startswith(flags_prefix)]:
            del self._rings[key]

    def forked(self) -> None:
        for ring in self._rings.values():
            ring.forked()


_live: weakref.WeakSet[Leases] = weakref.WeakSet()


def _after_fork_in_parent() -> None:
    for leases in list(_live):
        leases.forked()


os.register_at_fork(after_in_parent=_after_fork_in_parent)
