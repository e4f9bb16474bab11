"""The shared-memory transport of process workers' results: NumPy arrays written into a
``/dev/shm`` file (each 64-byte aligned), the rest of the result pickled; the consumer maps the
file, unlinks its name at once, and hands out arrays that view the mapping (one copy, in the
worker). Which file (a recycled segment, or one of the task's own) is
:mod:`lanceloader.engine.segments`'s. Also used by the torch collation's shared batches."""

from __future__ import annotations

import dataclasses
import math
import mmap
import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np

from lanceloader.engine.pickling import Shipment, dumps

_ALIGN = 64
_PLAIN = frozenset({int, float, str, bytes, bool, type(None)})  # values holding no array


def _split(value: Any, arrays: list[np.ndarray]) -> Any:
    """Replace NumPy arrays (not of object dtype) in nested dicts, lists and dataclasses by
    placeholders, collecting the arrays."""
    if isinstance(value, np.ndarray) and value.dtype.kind not in "OT":  # not Python objects
        arrays.append(value)
        return _ArrayRef(len(arrays) - 1)
    if isinstance(value, dict):
        return {k: _split(v, arrays) for k, v in value.items()}
    if isinstance(value, list):
        if all(type(v) in _PLAIN for v in value):  # a result's rows and bytes per batch
            return value
        return [_split(v, arrays) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: _split(getattr(value, f.name), arrays) for f in dataclasses.fields(value)}
        return dataclasses.replace(value, **fields)
    return value


class _ArrayRef:
    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index

    def __reduce__(self) -> tuple[type[_ArrayRef], tuple[int]]:
        return _ArrayRef, (self.index,)  # (pickles 2x faster than the slots' default)


def _join(value: Any, arrays: list[np.ndarray]) -> Any:
    if isinstance(value, _ArrayRef):
        return arrays[value.index]
    if isinstance(value, dict):
        return {k: _join(v, arrays) for k, v in value.items()}
    if isinstance(value, list):
        if all(type(v) in _PLAIN for v in value):
            return value
        return [_join(v, arrays) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: _join(getattr(value, f.name), arrays) for f in dataclasses.fields(value)}
        return dataclasses.replace(value, **fields)
    return value


def offsets_of(arrays: list[np.ndarray]) -> tuple[list[int], int]:
    """Where each of ``arrays`` goes in a file (64-byte-aligned offsets), and the file's size."""
    offsets, size = [], 0
    for a in arrays:
        size = -(-size // _ALIGN) * _ALIGN
        offsets.append(size)
        size += a.nbytes
    return offsets, size


def write_into(fd: int, arrays: list[np.ndarray], offsets: list[int]) -> None:
    """Write ``arrays`` into the open file ``fd`` at ``offsets``.

    pwrite, not a mapping: the kernel fills a new file's pages as it copies, where a mapping
    takes a page fault (and zeroes a page) per 4 KiB first. Measured on a batch of 256 decoded
    128x128 images (12.6 MB): 8-10 ms of CPU against 15-21 ms.
    """
    for a, offset in zip(arrays, offsets, strict=True):
        data = np.ascontiguousarray(a).reshape(-1).view(np.uint8).data
        written = 0
        while written < len(data):
            written += os.pwrite(fd, data[written:], offset + written)


def write_arrays(path: Path, arrays: list[np.ndarray]) -> list[int]:
    """Write ``arrays`` into the new shared-memory file ``path``, each at a 64-byte-aligned
    offset; returns the offsets."""
    offsets, size = offsets_of(arrays)
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, max(size, 1))
        write_into(fd, arrays, offsets)
    except BaseException:
        path.unlink(missing_ok=True)  # half-written: nobody will take it
        raise
    finally:
        os.close(fd)
    return offsets


def take_mapping(path: Path) -> mmap.mmap:
    """Map the shared-memory file ``path`` and delete its name: the memory lives as long as the
    mapping (and the arrays that view it), and nothing is left behind."""
    fd = os.open(path, os.O_RDWR)
    try:
        return mmap.mmap(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)


def _regions(arrays: list[np.ndarray]) -> tuple[list[np.ndarray], list[tuple[int, int]]]:
    """The memory to write for ``arrays``, and per array ``(region, byte offset in it)``.

    The batches of a read are mostly row slices of a few arrays converted once per read: such
    an array is written once when the slices sent cover at least half of it (one ``pwrite``
    per column and chunk, not one per batch and column: a read of 480 batches of 3 columns
    made 1,440); any other array is a region of its own.
    """
    addresses: dict[int, int] = {}  # per root: its address, looked up once (~2.6 µs each)
    parts = [_part_of(a, addresses) for a in arrays]
    roots = {id(root): root for root, _ in parts if root is not None}
    covered = dict.fromkeys(roots, 0)
    for a, (root, _) in zip(arrays, parts, strict=True):
        if root is not None:
            covered[id(root)] += a.nbytes
    regions: list[np.ndarray] = []
    region_of: dict[int, int] = {}
    places: list[tuple[int, int]] = []
    for a, (root, offset) in zip(arrays, parts, strict=True):
        if root is None or 2 * covered[id(root)] < root.nbytes:
            places.append((len(regions), 0))
            regions.append(a)
            continue
        if id(root) not in region_of:
            region_of[id(root)] = len(regions)
            regions.append(root)
        places.append((region_of[id(root)], offset))
    return regions, places


def _part_of(a: np.ndarray, addresses: dict[int, int]) -> tuple[np.ndarray | None, int]:
    """The C-contiguous array whose memory the C-contiguous ``a`` is a part of, and where in it
    ``a`` starts; ``(None, 0)`` when ``a`` owns its memory or is not such a part.
    ``addresses``: roots' addresses known so far (filled here)."""
    root = a
    while isinstance(root.base, np.ndarray):
        root = root.base
    if root is a or not (a.flags.c_contiguous and root.flags.c_contiguous):
        return None, 0
    base = addresses.get(id(root))
    if base is None:
        base = addresses[id(root)] = root.__array_interface__["data"][0]
    start = a.__array_interface__["data"][0] - base
    return (root, start) if start >= 0 and start + a.nbytes <= root.nbytes else (None, 0)


Layout = list[tuple[int, str, tuple[int, ...]]]  # per array: (offset, dtype, shape)


@dataclasses.dataclass
class Packing:
    """A result taken apart for the transport: ``regions`` to write at ``offsets`` (a file of
    ``size`` bytes), the pickled rest (``skeleton``) and each array's place (``layout``);
    ``places``: per array, its region and byte offset in it (:meth:`layout_at` other
    offsets)."""

    skeleton: bytes
    regions: list[np.ndarray]
    offsets: list[int]
    size: int
    layout: Layout
    places: list[tuple[int, int, str, tuple[int, ...]]]

    def layout_at(self, offsets: list[int]) -> Layout:
        """The layout with the regions at ``offsets`` instead."""
        return [(offsets[r] + at, dtype, shape) for r, at, dtype, shape in self.places]


def take_apart(result: Any) -> Packing:
    """The arrays of ``result``, where each goes in its file, and the pickled rest (a read's
    result travels as its work made it for transport: :class:`~lanceloader.engine.work.
    ForTransport`)."""
    arrays: list[np.ndarray] = []
    skeleton = _split(result, arrays)
    regions, places = _regions(arrays)
    starts, size = offsets_of(regions)
    placed = [
        (region, offset, a.dtype.str, a.shape)
        for (region, offset), a in zip(places, arrays, strict=True)
    ]
    layout = [(starts[r] + at, dtype, shape) for r, at, dtype, shape in placed]
    try:
        pickled = pickle.dumps(skeleton, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, AttributeError, TypeError):
        # Values of a class defined in __main__ or a notebook cell: the worker has it by value,
        # and cloudpickle sends it back, where it unpickles as the consumer's own class.
        pickled = dumps(skeleton)
    return Packing(pickled, regions, starts, size, layout, placed)


def pack(result: Any, path: Path) -> tuple[bytes, Layout]:
    """Write the arrays of ``result`` into the new shared-memory file ``path``.

    Returns the pickled rest of the result and, per array, ``(offset, dtype, shape)``.
    """
    packing = take_apart(result)
    if packing.regions:
        write_arrays(path, packing.regions)
    return packing.skeleton, packing.layout


def unpack(skeleton: bytes, layout: Layout, path: Path) -> Any:
    """Map ``path`` (then unlink it) and rebuild the result with arrays viewing the mapping."""
    return rebuild(skeleton, layout, take_mapping(path) if layout else None)


def rebuild(skeleton: bytes, layout: Layout, buf: Any) -> Any:
    """The result whose arrays lie in ``buf`` (a mapping, or a NumPy array of bytes: each
    array then views it, and it lives while they do) at ``layout``."""
    arrays: list[np.ndarray] = []
    for offset, dtype, shape in layout:
        dt = np.dtype(dtype)
        count = math.prod(shape)  # np.prod of a small tuple costs ~4.6 us, 3 a batch
        arrays.append(np.frombuffer(buf, dt, count, offset).reshape(shape))
    return _join(pickle.loads(skeleton), arrays)


# A worker's pickle up to this size goes in its start message; a larger one (a table of many
# fragments' files) is read from the pool's shared-memory file, like the large arrays.
INLINE_BYTES = 4096


def ship(shipment: Shipment, path: Path) -> tuple[bytes, list[tuple[int, int]], str]:
    """What a worker's :func:`load_shipped` takes: ``shipment``'s pickle and its out-of-band
    buffers, written once into the shared-memory file ``path`` (``(offset, length)`` each; the
    pool that writes it removes it at its close), so what each worker is sent is a few hundred
    bytes whatever the dataset's size. A pickle of at most :data:`INLINE_BYTES` and no buffer
    is sent as it is (no file)."""
    if not shipment.buffers and len(shipment.data) <= INLINE_BYTES:
        return shipment.data, [], ""
    pickled = np.frombuffer(shipment.data, np.uint8)
    views = [pickled, *(np.frombuffer(b.raw(), np.uint8) for b in shipment.buffers)]
    offsets = write_arrays(path, views)
    return b"", [(o, v.nbytes) for o, v in zip(offsets, views, strict=True)], str(path)


def load_shipped(data: bytes, layout: list[tuple[int, int]], path: str) -> Any:
    """The object :func:`ship` sent: its pickle read from the pool's file (the first region),
    its buffers viewing a private (copy-on-write) mapping of that file, so every worker shares
    their pages until one writes to them."""
    if not layout:
        return pickle.loads(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        mapping = mmap.mmap(fd, os.fstat(fd).st_size, access=mmap.ACCESS_COPY)
    finally:
        os.close(fd)
    view = memoryview(mapping)
    (start, length), *buffers = layout
    return pickle.loads(view[start : start + length], buffers=[view[o : o + n] for o, n in buffers])
