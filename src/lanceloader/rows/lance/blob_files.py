"""Byte ranges of blobs read straight from a local dataset's files: one ``os.pread`` per range,
no Lance call.

A clip or audio read asks for a few small ranges of many blobs (a 1 s crop of a 6 s FLAC file:
its 42-byte header and about 9 KB of frames). Lance's ``read_blob_ranges`` plans each call
afresh: about 5.6 ms for the 64 ranges of 32 audio crops on this machine (0.17 ms a crop, a
fifth of the crop's decode), where the ``pread`` calls take a few microseconds each from the
page cache, as a hand loop's ``open``/``seek``/``read`` does. Where the bytes lie is in each
blob's descriptor (Lance's v2 blob layout, which the tests check against ``read_blob_ranges``
for every kind this module reads):

* ``kind=0`` (inline, under 64 KiB): ``position`` in the fragment's data file that holds the
  column (:func:`~lanceloader.rows.lance.inline_blobs.fragment_files`);
* ``kind=1`` (packed) and ``kind=2`` (dedicated): ``position`` in the sidecar file
  ``data/<data file stem>/<blob_id>.blob``, the id written as its 32 bits, least significant
  first (pylance 14's naming);
* ``kind=3`` (external, a ``blob_uri``) and blob v1 columns: Lance's business, never read here.

When this path runs, else ``read_blob_ranges`` does (the whole call, so one read never mixes
the two): the dataset is on a local file system and pylance's major version is one the tests
checked (:data:`~lanceloader.rows.lance.inline_blobs.CHECKED_VERSIONS`); every blob of the call was
located at construction (its file existed then) and every range lies within its blob.

Memory: the ranges' bytes; the files a call opens are closed before it returns. A file shorter
than its descriptors say (replaced or truncated under the reader) raises ``OSError`` naming it,
never short bytes. The reads are counted in the read's
:class:`~lanceloader.rows.protocol.StorageIO`.

Example:
    >>> import tempfile, lance, lance.blob, pyarrow as pa
    >>> uri = tempfile.mkdtemp() + "/b.lance"
    >>> table = pa.table({"b": lance.blob.blob_array([b"x" * 100_000, b"hello"])})
    >>> ds = lance.write_dataset(table, uri)
    >>> from lanceloader.rows.protocol import StorageIO
    >>> found = blob_locations(ds, "b", np.arange(2), ds.to_table().column("b"))
    >>> io = StorageIO()
    >>> found.read_ranges([(1, 1, 3), (0, 99_998, 2)], io)
    [b'ell', b'xx']
    >>> io.bytes, io.reads  # counted for the read's stats
    (5, 2)
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lanceloader.rows.lance.inline_blobs import (
    DESCRIPTOR_FIELDS,
    descriptor_field,
    fragment_files,
    read_fully,
    v2_descriptors,
)
from lanceloader.rows.protocol import StorageIO

#: descriptor kinds whose bytes this module finds: inline, packed, dedicated
INLINE, PACKED, DEDICATED = 0, 1, 2


def sidecar_name(blob_id: int) -> str:
    """The file name of a packed or dedicated blob's sidecar (pylance 14): the id's 32 bits,
    least significant first, then ``.blob``.

    >>> sidecar_name(1), sidecar_name(6)[:4]
    ('10000000000000000000000000000000.blob', '0110')
    """
    return f"{blob_id:032b}"[::-1] + ".blob"


@dataclass(frozen=True)
class BlobLocations:
    """Where each located blob's payload lies: the blobs at Lance row offsets ``offsets``
    (ascending) are in file ``paths[file[i]]`` from byte ``position[i]``, ``size[i]`` long
    (``file[i] = -1``: not located). Plain arrays: pickled with a source to a process worker."""

    offsets: np.ndarray
    file: np.ndarray
    position: np.ndarray
    size: np.ndarray
    paths: tuple[str, ...]

    def read_ranges(
        self, requests: list[tuple[int, int, int]], io: StorageIO
    ) -> list[bytes] | None:
        """The bytes of each ``(row offset, offset in the blob, length)``, in order, or
        ``None`` when one of them is not located here (the caller asks Lance for all)."""
        if not requests:
            return []
        asked = np.array(requests, np.int64).reshape(-1, 3)
        at = np.searchsorted(self.offsets, asked[:, 0])
        at = np.minimum(at, len(self.offsets) - 1)
        if not len(self.offsets) or (self.offsets[at] != asked[:, 0]).any():
            return None
        files = self.file[at]
        inside = (
            (asked[:, 1] >= 0) & (asked[:, 2] >= 0) & (asked[:, 1] + asked[:, 2] <= self.size[at])
        )
        if (files < 0).any() or not inside.all():
            return None
        starts = (self.position[at] + asked[:, 1]).tolist()
        lengths = asked[:, 2].tolist()
        handles: dict[int, int] = {}
        out = []
        try:
            for f, start, length in zip(files.tolist(), starts, lengths, strict=True):
                fd = handles.get(f)
                if fd is None:
                    fd = handles[f] = os.open(self.paths[f], os.O_RDONLY)
                data = os.pread(fd, length, start)
                if len(data) < length:  # a short read: the rest, or an error naming the file
                    rest = bytearray(length - len(data))
                    read_fully(fd, [memoryview(rest)], start + len(data), self.paths[f])
                    data += rest
                out.append(data)
        finally:
            for fd in handles.values():
                os.close(fd)
        io.add(sum(lengths), len(lengths))
        return out


def blob_locations(
    dataset: lance.LanceDataset, column: str, offsets: np.ndarray, descriptors: pa.Array
) -> BlobLocations | None:
    """Where the blobs at Lance row ``offsets`` (their ``descriptors``, as Lance scans the blob
    column) lie in the local files, or ``None`` when none can be read here (an object store, an
    unchecked pylance version, blob v1). A blob of another kind, or whose file is missing, is
    left unlocated (a read that asks for it goes to Lance)."""
    files = fragment_files(dataset, column)
    if files is None or not len(offsets):
        return None
    if isinstance(descriptors, pa.ExtensionArray):
        descriptors = descriptors.storage
    descriptors = v2_descriptors(descriptors, len(offsets), DESCRIPTOR_FIELDS | {"blob_id"})
    if descriptors is None:
        return None  # blob v1 (position and size only): Lance knows its layout

    def field(name: str) -> np.ndarray:
        return descriptor_field(descriptors, name).astype(np.int64)

    valid = descriptors.is_valid().to_numpy(zero_copy_only=False)
    uris = pc.fill_null(descriptors.field("blob_uri"), "")
    external = pc.not_equal(uris, "").to_numpy(zero_copy_only=False)
    kind, blob_id = field("kind"), field("blob_id")
    offsets = np.asarray(offsets, np.int64)
    fragments = files.fragment_of(offsets)
    paths: dict[str, int] = {}
    file = np.full(len(offsets), -1, np.int64)
    for i in np.flatnonzero(valid & ~external & (kind <= DEDICATED)).tolist():
        data_file = files.paths[fragments[i]]
        if data_file is None:
            continue
        if kind[i] == INLINE:
            path = data_file
        else:
            stem = os.path.splitext(data_file)[0]
            path = os.path.join(stem, sidecar_name(int(blob_id[i])))
        k = paths.get(path)
        if k is None:
            k = paths[path] = len(paths) if os.path.isfile(path) else -1
        file[i] = k
    kept = {path: k for path, k in paths.items() if k >= 0}
    renumber = np.full(len(paths) + 1, -1, np.int64)  # index -1 stays -1
    for new, old in enumerate(kept.values()):
        renumber[old] = new
    file = renumber[file]
    order = np.argsort(offsets, kind="stable")
    return BlobLocations(
        offsets[order],
        file[order],
        field("position")[order],
        np.where(valid, field("size"), 0)[order],
        tuple(kept),
    )
