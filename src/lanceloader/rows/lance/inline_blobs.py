"""Inline blob payloads read straight from the data files: one scatter ``preadv`` per run of
rows whose payloads lie next to each other, into one Arrow buffer.

Lance's ``read_blobs`` returns one Python ``bytes`` per row, which an Arrow column must then copy
again; a sequential read of small blobs spends most of its time per row in that planning and
those copies (measured: ``benchmarks/blobs.py``). Blob v2 stores a payload smaller than its
inline threshold (64 KiB in pylance 14: images, audio snippets) *inline*: its descriptor says
``kind=0`` and ``position`` is the payload's byte offset in the fragment's data file that
holds the column, so the payloads of consecutive rows follow each other in that file, each
padded to 64 bytes. A read of such rows is then a few ``preadv`` calls that scatter the
payloads straight into the column's data buffer (the padding into a scratch buffer): one copy
(the kernel's), no object per row.

When this path runs (:func:`inline_plan` says yes), else ``read_blobs`` does:

* the dataset is on a local file system (an object store gets Lance's planned reads);
* pylance's major version is one whose inline layout the tests checked against
  ``read_blobs`` (:data:`CHECKED_VERSIONS`), and the fragment keeps the column in exactly one
  data file of file format 2.x under the dataset's own ``data/`` directory (no overlay, no
  other base);
* every non-null value of the read is inline (``kind=0``, no ``blob_uri``): packed, dedicated
  and external blobs live in files whose naming is Lance's business;
* the rows form runs worth a call: at most :data:`FEW_RUNS` runs, or at least
  :data:`MIN_RUN_ROWS` rows or :data:`MIN_RUN_BYTES` bytes per run on average (a shuffled
  read of scattered rows keeps Lance's concurrent reads).
  A run is rows in the read's order, in one file, each starting at most :data:`MAX_GAP` bytes
  after the previous one ends (padding, a deleted row's payload).

Memory: the read's payload bytes once (the column's buffer, from Arrow's pool), its offsets,
and a :data:`MAX_GAP`-byte scratch buffer; no file stays open after a read. A file shorter
than its descriptors say (replaced or truncated under the reader) raises ``OSError`` naming
it: never zeros.

Pure functions, except :func:`read_inline`, which reads the files.

Example:
    >>> import numpy as np
    >>> plan = inline_runs(np.array([0, 0, 0]), np.array([100, 128, 90_000]), np.array([10, 5, 7]))
    >>> plan.offsets.tolist(), plan.runs.tolist()  # rows 0-1: one run (a gap of 18 bytes)
    ([0, 10, 15, 22], [0, 2, 3])
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from urllib.parse import urlparse

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lanceloader.rows.protocol import StorageIO

#: pylance major versions whose inline layout (``position`` = byte offset in the data file) the
#: tests compare with ``read_blobs``; another version reads through ``read_blobs``.
CHECKED_VERSIONS = ("14",)
#: a read goes straight to the files when it has at most this many runs, ...
FEW_RUNS = 8
#: ... or its runs average at least this many rows ...
MIN_RUN_ROWS = 16
#: ... or at least this many bytes
MIN_RUN_BYTES = 1 << 20
#: the most bytes between two payloads of one run (read and dropped: padding, deleted rows)
MAX_GAP = 64 * 1024
INLINE_KIND = 0
#: the blob v2 descriptor fields this module reads (blob v1 has only position and size)
DESCRIPTOR_FIELDS = {"kind", "position", "size", "blob_uri"}
#: iovecs per preadv call (Linux's IOV_MAX)
IOV_MAX = 1024


@dataclass(frozen=True)
class InlineRuns:
    """Where a read's payloads come from. ``offsets`` (``int64``, rows + 1) index the column's
    data buffer; ``rows`` are the rows with bytes (non-null, non-empty), with their
    ``fragments``, file ``positions`` and ``sizes``; run ``k`` is ``rows[runs[k]:runs[k + 1]]``
    (one file, in order, gaps of at most :data:`MAX_GAP`): one ``preadv``."""

    offsets: np.ndarray
    rows: np.ndarray
    fragments: np.ndarray
    positions: np.ndarray
    sizes: np.ndarray
    runs: np.ndarray

    @property
    def run_count(self) -> int:
        """How many runs (``preadv`` calls, before splitting at :data:`IOV_MAX` pieces)."""
        return len(self.runs) - 1


def inline_runs(fragments: np.ndarray, positions: np.ndarray, sizes: np.ndarray) -> InlineRuns:
    """The runs of a read: rows (in the read's order) whose payloads follow each other in one
    fragment's file, each at most :data:`MAX_GAP` bytes after the previous one's end, are one
    run. ``fragments``, ``positions`` and ``sizes`` give each row's fragment index, file offset
    and payload size; a row of size 0 (empty or null) reads nothing and never breaks a run.

    Example:
        >>> r = inline_runs(np.array([0, 0, 1]), np.array([0, 64, 4]), np.array([4, 4, 4]))
        >>> r.runs.tolist()  # rows 0-1 are one run, row 2 is in another file
        [0, 2, 3]
    """
    sizes = np.asarray(sizes, np.int64)
    offsets = np.zeros(len(sizes) + 1, np.int64)
    np.cumsum(sizes, out=offsets[1:])
    rows = np.flatnonzero(sizes > 0)
    frag = np.asarray(fragments, np.int64)[rows]
    pos = np.asarray(positions, np.int64)[rows]
    size = sizes[rows]
    gap = pos[1:] - (pos[:-1] + size[:-1])
    breaks = np.flatnonzero((frag[1:] != frag[:-1]) | (gap < 0) | (gap > MAX_GAP)) + 1
    runs = np.concatenate(([0], breaks, [len(rows)])) if len(rows) else np.zeros(1, np.int64)
    return InlineRuns(offsets, rows, frag, pos, size, runs.astype(np.int64))


@dataclass(frozen=True)
class FragmentFiles:
    """Per fragment of one dataset version, in Lance's order: its first row offset (``starts``,
    plus the total at the end) and the local path of the data file holding the blob column
    (``None`` where payloads must come from ``read_blobs``)."""

    starts: np.ndarray
    paths: tuple[str | None, ...]

    def fragment_of(self, offsets: np.ndarray) -> np.ndarray:
        """The fragment index of each Lance row offset."""
        return np.searchsorted(self.starts, offsets, side="right") - 1


_files: dict[tuple[str, int, str], FragmentFiles | None] = {}
_files_lock = threading.Lock()


def fragment_files(dataset: lance.LanceDataset, column: str) -> FragmentFiles | None:
    """Where ``column``'s inline payloads live in each fragment of ``dataset`` (a pinned
    version), or ``None`` where this module cannot read them (object store, unchecked pylance
    version). Computed once per dataset version and column in a process (plain data).

    Example:
        >>> import tempfile, lance, lance.blob, pyarrow as pa
        >>> uri = tempfile.mkdtemp() + "/b.lance"
        >>> ds = lance.write_dataset(pa.table({"b": lance.blob.blob_array([b"ab"])}), uri)
        >>> files = fragment_files(ds, "b")
        >>> files.starts.tolist(), files.paths[0].endswith(".lance")
        ([0, 1], True)
    """
    key = (dataset.uri, dataset.version, column)
    with _files_lock:
        if key in _files:
            return _files[key]
    files = _find_files(dataset, column)
    with _files_lock:
        _files[key] = files
    return files


def _find_files(dataset: lance.LanceDataset, column: str) -> FragmentFiles | None:
    if lance.__version__.split(".")[0] not in CHECKED_VERSIONS:
        return None
    parsed = urlparse(dataset.uri)
    if parsed.scheme not in ("", "file"):
        return None
    root = os.path.abspath(parsed.path if parsed.scheme == "file" else dataset.uri)
    field = dataset.lance_schema.field(column)
    if field is None:
        return None
    field_id = field.id()
    counts, paths = [], []
    for fragment in dataset.get_fragments():
        counts.append(fragment.count_rows())
        metadata = fragment.metadata
        holding = [f for f in metadata.files if field_id in f.fields]
        usable = (
            len(holding) == 1
            and holding[0].base_id is None
            and holding[0].file_major_version == 2
            and not getattr(metadata, "overlays", None)
        )
        paths.append(os.path.join(root, "data", holding[0].path) if usable else None)
    starts = np.zeros(len(counts) + 1, np.int64)
    np.cumsum(counts, out=starts[1:])
    return FragmentFiles(starts, tuple(paths))


def v2_descriptors(
    descriptors: pa.Array | pa.ChunkedArray, rows: int, fields: set[str] = DESCRIPTOR_FIELDS
) -> pa.StructArray | None:
    """``descriptors`` (as Lance scans a blob column, maybe chunked) as one struct array, or
    ``None`` when they are not ``rows`` structs with ``fields`` (blob v1's descriptors hold only
    position and size)."""
    if isinstance(descriptors, pa.ChunkedArray):
        descriptors = pa.concat_arrays(descriptors.chunks) if descriptors.num_chunks else None
    if descriptors is None or len(descriptors) != rows or not pa.types.is_struct(descriptors.type):
        return None
    if not {f.name for f in descriptors.type}.issuperset(fields):
        return None
    return descriptors


def descriptor_field(descriptors: pa.StructArray, name: str) -> np.ndarray:
    """One field of v2 descriptors as a NumPy array, nulls (null blobs) as 0."""
    child = descriptors.field(name)
    return (pc.fill_null(child, 0) if child.null_count else child).to_numpy(zero_copy_only=False)


def inline_plan(
    files: FragmentFiles | None, offsets: np.ndarray, descriptors: pa.Array
) -> InlineRuns | None:
    """The runs that read the payloads of the rows at Lance row ``offsets`` (their
    ``descriptors``, as Lance scans the blob column) straight from the files, or ``None`` when
    ``read_blobs`` must (see the module text).

    Example:
        >>> files = FragmentFiles(np.array([0, 40]), ("/d/f.lance",))
        >>> desc = pa.array([{"kind": 0, "position": 64 * i, "size": 64, "blob_id": 0,
        ...                   "blob_uri": ""} for i in range(40)])
        >>> inline_plan(files, np.arange(40), desc).runs.tolist()
        [0, 40]
        >>> backwards = np.arange(40)[::-1]  # 40 runs of one row each: read_blobs's
        >>> inline_plan(files, backwards, desc.take(backwards)) is None
        True
    """
    if files is None or not len(offsets):
        return None
    descriptors = v2_descriptors(descriptors, len(offsets))
    if descriptors is None:
        return None  # blob v1 (position and size only): read_blobs knows its layout
    valid = descriptors.is_valid().to_numpy(zero_copy_only=False)

    def field(name: str) -> np.ndarray:
        return descriptor_field(descriptors, name)

    if (field("kind")[valid] != INLINE_KIND).any():
        return None
    uris = descriptors.field("blob_uri")
    if (
        pc.sum(pc.binary_length(uris)).as_py()
        and pc.any(pc.not_equal(uris.filter(descriptors.is_valid()), "")).as_py()
    ):
        return None
    sizes = np.where(valid, field("size"), 0).astype(np.int64)
    positions = field("position").astype(np.int64)
    fragments = files.fragment_of(np.asarray(offsets, np.int64))
    used = np.unique(fragments[sizes > 0])
    if any(files.paths[i] is None for i in used.tolist()):
        return None
    plan = inline_runs(fragments, positions, sizes)
    runs, rows = plan.run_count, len(plan.rows)
    worth = runs <= FEW_RUNS or runs * MIN_RUN_ROWS <= rows
    if not (worth or int(plan.offsets[-1]) >= runs * MIN_RUN_BYTES):
        return None  # scattered rows: Lance's concurrent reads
    return plan


def read_inline(
    files: FragmentFiles, plan: InlineRuns, validity: pa.Buffer | None, nulls: int, io: StorageIO
) -> pa.LargeBinaryArray:
    """The payloads ``plan`` locates as one ``large_binary`` array: one buffer from Arrow's
    pool, filled by one scatter ``preadv`` per run (per :data:`IOV_MAX` pieces), the gaps
    between payloads read into a scratch buffer; the bytes and calls counted in ``io``. A file
    that ends before a run does raises ``OSError`` naming it and the range."""
    data = pa.allocate_buffer(int(plan.offsets[-1]))
    view = memoryview(data)
    scratch = memoryview(bytearray(MAX_GAP))
    starts = plan.offsets[plan.rows].tolist()
    positions, sizes = plan.positions.tolist(), plan.sizes.tolist()
    fragments = plan.fragments.tolist()
    handles: dict[int, int] = {}
    read = calls = 0
    try:
        for lo, hi in zip(plan.runs[:-1].tolist(), plan.runs[1:].tolist(), strict=True):
            fragment = fragments[lo]
            fd = handles.get(fragment)
            if fd is None:
                fd = handles[fragment] = os.open(files.paths[fragment], os.O_RDONLY)
            pieces: list[memoryview] = []
            for i in range(lo, hi):
                end = positions[i - 1] + sizes[i - 1]
                if i > lo and positions[i] > end:
                    pieces.append(scratch[: positions[i] - end])
                pieces.append(view[starts[i] : starts[i] + sizes[i]])
            at = positions[lo]
            for k in range(0, len(pieces), IOV_MAX):
                at = read_fully(fd, pieces[k : k + IOV_MAX], at, files.paths[fragment])
                calls += 1
            read += at - positions[lo]
    finally:
        for fd in handles.values():
            os.close(fd)
    io.add(read, calls)
    return pa.LargeBinaryArray.from_buffers(
        pa.large_binary(),
        len(plan.offsets) - 1,
        [validity, pa.py_buffer(plan.offsets), data],
        null_count=nulls,
    )


def read_fully(fd: int, pieces: list[memoryview], at: int, path: str | None) -> int:
    """Fill ``pieces`` from file offset ``at`` on (looping over short reads); returns the
    offset after them. A file that ends first raises ``OSError`` naming it."""
    want = sum(map(len, pieces))
    got = os.preadv(fd, pieces, at)
    while got < want:  # a short read: the rest
        skip, rest = got, []
        for piece in pieces:
            if skip >= len(piece):
                skip -= len(piece)
            else:
                rest.append(piece[skip:])
                skip = 0
        n = os.preadv(fd, rest, at + got)
        if n == 0:
            raise OSError(
                f"blob payloads: {path} ends at byte {at + got}, but Lance's descriptors place "
                f"{want - got} more bytes there (bytes {at}-{at + want}); the file was replaced "
                "or truncated: reopen the dataset, or check its storage"
            )
        got += n
    return at + want
