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
  Memory: a new segment is made only when none free fits, so a worker's segments take what
  its results alive at once took at their peak (before, one file each, gone with the result),
  kept while the pool lives (a kept pool: the loader's life) unless idle as said.
* Around each task the worker lends its largest free segment (if at least as large as its last
  result) to the task's gathers (:meth:`Segments.arena`, :func:`~lanceloader.rows.gather.output_memory`):
  a cached shuffle's columns are gathered straight into the memory they travel in, and the
  result is sent with no copy (what is not in it is written after it, or, if that does not
  fit, everything goes into another segment). The worker keeps weak references to what it
  lent: a segment is free again only when the consumer gave it back *and* nothing of the
  worker still views it (a buffer kept past its task is never written over).
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

import contextlib
import ctypes
import mmap
import os
import threading
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from lanceloader.engine.transport import (
    Packing,
    rebuild,
    take_apart,
    take_mapping,
    write_arrays,
    write_into,
)
from lanceloader.rows.gather import output_memory

#: segments a worker keeps (its results in flight and held by the consumer take one each)
SLOTS = 8
#: a free segment unused for this many of its worker's results is removed
IDLE_PACKS = 32
#: a segment's size is rounded up to this (results of one loader differ by a few rows)
GRAIN = 1 << 20
HELD, FREE = 1, 0

# (flags path, slot, segment path, capacity, the worker's segments now), or a file of its own
Where = tuple[str, int, str, int, tuple[str, ...]] | str


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
        self._maps: list[mmap.mmap | None] = [None] * SLOTS  # this worker's, for arenas
        self._lent: list[list[weakref.ref[Any]]] = [[] for _ in range(SLOTS)]  # arena buffers
        self._packs = 0
        self._last = 0  # the size of the last result

    def _flags_map(self) -> mmap.mmap:
        if self._flags is None:
            fd = os.open(self._flags_path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
            try:
                os.ftruncate(fd, SLOTS)
                self._flags = mmap.mmap(fd, SLOTS)
            finally:
                os.close(fd)
        return self._flags

    def _free(self, i: int) -> bool:
        """Slot ``i`` may be written: the consumer gave it back, and nothing of this worker
        (a gather's buffer kept past its task) still views it."""
        if self._flags_map()[i] != FREE:
            return False
        self._lent[i] = [ref for ref in self._lent[i] if ref() is not None]
        return not self._lent[i]

    @contextlib.contextmanager
    def arena(self) -> Iterator[Arena | None]:
        """Around a task: gathers in this thread put their columns into the largest free segment,
        if at least as large as the last result (:func:`~lanceloader.rows.gather.output_memory`),
        which :meth:`pack` then sends without a copy; None when no segment is free."""
        fits = [i for i in range(SLOTS) if self._fds[i] is not None and self._free(i)]
        fits = [i for i in fits if self._sizes[i] >= self._last]
        if not fits or not self._last:
            yield None
            return
        # the largest: a read larger than the last (an epoch's first reads grow 4x each) still
        # fits, where the smallest that fitted the last was written over again whole (3 of the
        # 5 reads of every epoch's ramp)
        slot = max(fits, key=lambda i: self._sizes[i])
        mapping = self._maps[slot]
        if mapping is None:
            mapping = self._maps[slot] = mmap.mmap(self._fds[slot], self._sizes[slot])  # type: ignore[arg-type]
        arena = Arena(slot, mapping, self._lent[slot])
        with output_memory(arena.allocate):
            yield arena

    def pack(self, result: Any, path: Path, arena: Arena | None = None) -> tuple[bytes, Any, Where]:
        """Write the arrays of ``result`` into a free segment (or the new file ``path`` when
        every slot is held); the pickled rest, the arrays' layout and where they are. Arrays
        already in ``arena`` stay where they are."""
        packing = take_apart(result)
        self._packs += 1
        self._last = packing.size
        if not packing.regions:
            return packing.skeleton, packing.layout, ""
        busy = None  # the arena's slot holds arrays of the result: never written over here
        if arena is not None and arena.used:
            placed = self._in_arena(arena, packing)
            if placed is not None:
                return packing.skeleton, placed, self._where(arena.slot)
            busy = arena.slot
        slot = self._slot_for(packing.size, busy)
        if slot is None:
            write_arrays(path, packing.regions)
            return packing.skeleton, packing.layout, str(path)
        self._hold(slot)
        self._write(slot, packing.regions, packing.offsets)
        return packing.skeleton, packing.layout, self._where(slot)

    def _in_arena(self, arena: Arena, packing: Packing) -> Any:
        """The layout with the regions already in ``arena`` where they are and the others
        written after them; None when those do not fit (then all are written elsewhere)."""
        offsets, rest, end = [], [], arena.used
        for region in packing.regions:
            at = arena.offset_of(region)
            if at is None:
                at = end = -(-end // 64) * 64
                end += region.nbytes
                rest.append((region, at))
            offsets.append(at)
        if end > self._sizes[arena.slot]:
            return None
        self._hold(arena.slot)
        if rest:
            regions, starts = zip(*rest, strict=True)
            self._write(arena.slot, list(regions), list(starts))
        return packing.layout_at(offsets)

    def _write(self, slot: int, regions: list[np.ndarray], offsets: list[int]) -> None:
        """Write into a slot just held; a write that fails gives the slot back (the consumer
        never sees it)."""
        try:
            write_into(self._fds[slot], regions, offsets)  # type: ignore[arg-type]
        except BaseException:
            self._flags_map()[slot] = FREE
            raise

    def _hold(self, slot: int) -> None:
        self._flags_map()[slot] = HELD  # before the write: given back only after a result
        self._used[slot] = self._packs

    def _where(self, slot: int) -> Where:
        live = tuple(path for path in self._paths if path)  # the consumer unmaps the others
        return (self._flags_path, slot, self._paths[slot], self._sizes[slot], live)

    def _slot_for(self, size: int, busy: int | None = None) -> int | None:
        """The free slot (not ``busy``) whose segment fits ``size`` (the smallest), or one made
        for it; None when every slot is held. Frees segments idle for :data:`IDLE_PACKS`
        results."""
        free = [i for i in range(SLOTS) if i != busy and self._free(i)]
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
            # Its pages allocated now: a full /dev/shm is an OSError here, never a SIGBUS in
            # a gather writing into the segment's mapping later.
            if hasattr(os, "posix_fallocate"):
                os.posix_fallocate(fd, 0, capacity)
            else:  # macOS
                os.ftruncate(fd, capacity)
        except BaseException:
            os.close(fd)
            Path(path).unlink(missing_ok=True)
            raise
        self._fds[slot], self._sizes[slot], self._paths[slot] = fd, capacity, path

    def _drop(self, slot: int) -> None:
        """Let go of the free slot's segment (its name was unlinked when the consumer mapped
        it, or is unlinked here; nothing views this worker's mapping of it)."""
        fd = self._fds[slot]
        if fd is None:
            return
        os.close(fd)
        Path(self._paths[slot]).unlink(missing_ok=True)
        self._fds[slot], self._sizes[slot], self._paths[slot] = None, 0, ""
        self._maps[slot] = None


class Arena:
    """A free segment lent to one task's gathers: buffers handed out in order, 64-byte
    aligned, each a ctypes object over the worker's mapping (``lent`` keeps weak references,
    so the segment is not written again while the worker still views one)."""

    def __init__(self, slot: int, mapping: mmap.mmap, lent: list[weakref.ref[Any]]) -> None:
        self.slot, self.used = slot, 0
        self._mapping, self._lent = mapping, lent
        self._base = ctypes.addressof(ctypes.c_char.from_buffer(mapping))

    def allocate(self, size: int) -> pa.Buffer | None:
        """A mutable buffer of ``size`` bytes in the segment; None when it is full."""
        start = -(-self.used // 64) * 64
        if not size or start + size > len(self._mapping):
            return None
        memory = (ctypes.c_char * size).from_buffer(self._mapping, start)
        self._lent.append(weakref.ref(memory))
        self.used = start + size
        return pa.py_buffer(memory)

    def offset_of(self, region: np.ndarray) -> int | None:
        """Where ``region`` lies in the segment, if it lies in what was handed out."""
        at = region.__array_interface__["data"][0] - self._base
        return at if at >= 0 and at + region.nbytes <= self.used else None


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

    def keep_only(self, paths: tuple[str, ...]) -> None:
        """Forget the mappings of segments the worker removed (arrays still viewing one keep
        it mapped): their memory goes back once those are gone."""
        for slot in [s for s, (path, _) in self.maps.items() if path not in paths]:
            del self.maps[slot]

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
        flags_path, slot, path, capacity, live = where
        ring = self._rings.get(flags_path)
        if ring is None:
            ring = self._rings[flags_path] = _Ring(flags_path)
        ring.keep_only(live)
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
