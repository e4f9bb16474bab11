"""The rows protocol: what every kind of rows is, and what a read of them returns.

A *source of rows* (:class:`RowSource`) has ``num_rows`` positions per epoch, ``[0, num_rows)``,
and reads any array of them, in that order, for an epoch, as :class:`Read`: the rows plus
everything the read did. The protocol is closed: every member a reader may use is declared
here, with its default in :class:`RowsBase`, so a new kind of rows is one class that states
only what differs, and the Loader, the engine, the state, the ledger, the stats and the
adapters never ask which kind they hold.

The kinds: ``Source`` (``rows/lance/``: one pinned Lance dataset, filter, split, cache, blobs);
two *views of Lance rows* that hold a ``Source`` and say so in their types, ``PackedSource``
(packed token rows) and ``ClipSource`` (``rows/clips/``: video clips and audio windows); and
``MixedSource``, an exact interleave of other loaders' rows (any kind but a mix), each read
through an ``OrderedSource`` (a stream reader, not a kind of rows).

What a kind declares:

* ``dataset_name`` (:class:`DatasetName`: uri, version, identity; a mix's is ``mix:...``),
  ``columns``, ``bytes_per_row`` (Arrow bytes per row, which sizes reads) and ``num_rows``;
* ``schema_table()``: an empty table of what reads return;
* ``read_rows(positions, epoch)``: exactly ``len(positions)`` rows in that order (a
  :class:`Pieces` or a table), raising ``ReadError`` on a failed read;
* ``settings()``: JSON-safe settings that define which rows the positions are (state and
  fingerprint): filter, split, packing, clips, mix;
* ``describe_rows(positions)`` (for errors) and ``lineage(positions, epoch)`` (for the ledger:
  the rows of the dataset(s) that the positions are);
* ``resumed(state, allow_changes)``: the rows that continue a state (pure);
* ``at_epoch_start(epoch)``: the rows an epoch reads, asked as it starts at sample 0 (the rows
  themselves, or a followed Lance table's newest version: ``rows/lance/follow.py``);
* ``hints`` (:class:`ReadHints`: how the engine sizes and cuts reads, plain data) and
  ``facts`` (:class:`RowsFacts`: what ``stats()`` and the Loader report);
* ``step_at(epoch, sample)``, ``with_weights(weights, step, next_step)`` and
  ``delivered(start, stop)``: a mix's global step count, its weights set from a step on
  (``Loader.set_weights``) and what each source gave per piece of its weights (``stats()``);
  None, refused and empty for rows that mix nothing;
* ``check_nulls(conversion)``: refuse nulls a conversion cannot hold, at construction, where a
  scan is cheap (Lance rows); a no-op elsewhere;
* ``blob_files(column, offsets, buffer_size)``: file-like objects of a blob column read as
  files (Lance rows; refused elsewhere), what a transform's ``ll.blob_files(batch, column)``
  asks of the rows its batch came from (:func:`transforming`).

Nestings: packing and clips are views of one ``Source``; a mix holds ordered sources of any
kind but a mix (a mix of mixes is one mix with multiplied weights).
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pyarrow as pa

if TYPE_CHECKING:
    from typing_extensions import Self


@dataclass(frozen=True)
class Read:
    """What a read of rows returns: the rows (exactly one per position, in order) and
    everything the read did: the storage bytes and requests it made (Lance's, and any ranges
    read past Lance), the rows served by the cache (in the read's own rows: at most
    ``len(rows)``), the cache files that failed their check during the read (dropped and read
    again, never delivered), the pieces it filled into the cache, and the seconds it spent
    decoding (clips decode inside the read,
    so fetch and decode overlap on object stores; ``stats()`` books them as decode)."""

    rows: pa.Table | Pieces
    io_bytes: int = 0
    io_iops: int = 0
    rows_cached: int = 0
    cache_damaged: int = 0
    decode_s: float = 0.0
    cache_fills: int = 0  # pieces this read downloaded and kept in the cache


class StorageIO:
    """Storage I/O a read makes past Lance's own counters (blob payloads and byte ranges read
    with ``pread``): the read makes one, hands it to what it calls, and puts the totals in its
    :class:`Read`. Thread-safe: a clip read's fetch threads add to it at once.

    >>> io = StorageIO(); io.add(100, 2); io.add(50, 1); (io.bytes, io.reads)
    (150, 3)
    """

    __slots__ = ("_lock", "bytes", "reads")

    def __init__(self) -> None:
        self.bytes = self.reads = 0
        self._lock = threading.Lock()

    def add(self, nbytes: int, reads: int) -> None:
        with self._lock:
            self.bytes += nbytes
            self.reads += reads


@dataclass(frozen=True)
class DatasetName:
    """Which dataset rows come from: its URI, pinned version and identity (what a state
    records and checks); a mix's is ``mix:<names>``, no version, and its settings' hash."""

    uri: str
    version: int | None = None
    identity: str | None = None


@dataclass(frozen=True)
class ReadHints:
    """How to size and cut reads of these rows: plain data that ``engine/sizing.py`` and
    ``engine/tasks.py`` read, never a question about the kind.

    ``random_reads``: consecutive positions are random takes underneath (a mix of shuffled
    sources). ``read_parts``: the reads of a full read's size one read makes underneath (a
    mix: its sources), so the engine makes the read that many times larger. ``waits_on_storage``:
    a read of consecutive positions in storage order is storage range reads alone (no cache,
    no transform), during which a worker thread holds no core, so the engine runs two thread
    workers per core. ``cached``: reads go through a cache (a shuffle costs no random takes).
    ``gathers``: a shuffled read gathers rows from cache pieces (sized larger). ``fragment_starts``:
    on an object store, the positions at which each data file's rows begin, then ``num_rows``
    (sequential reads are cut there). ``window_rows``: reads are cut on windows of that many
    samples (a mix's). ``decodes``: each row is made by CPU work inside the read (clips decode
    their frames), so reads hold a few batches, as with a transform: a read's first batch waits
    for the whole read's work."""

    random_reads: bool = False
    read_parts: int = 1
    waits_on_storage: bool = False
    cached: bool = False
    gathers: bool = False
    fragment_starts: np.ndarray | None = None
    window_rows: int | None = None
    decodes: bool = False


@dataclass(frozen=True)
class RowsFacts:
    """What the rows report about themselves, for ``stats()``, the Loader and the checks:
    the cache and why (``cache_choice``), whether that cache lives in one process's memory
    (process workers would each fill a copy), how a filter/split plan was got
    (``plan_origin``: none, scan or cache), the padding of packed rows, the packing plan, and
    media too short for one clip, and how blob columns are read (``{column: "bytes" | "file" |
    "descriptor"}``: a copy keeps blobs read as bytes as blobs)."""

    cache_choice: str | None = None
    cache_per_process: bool = False
    plan_origin: str = "none"
    padding_fraction: float | None = None
    packing: Any = None
    short_media: int = 0
    blobs: dict[str, str] = field(default_factory=dict)


class RowSource(Protocol):
    """The contract every kind of rows keeps (see the module's text)."""

    dataset_name: DatasetName
    columns: list[str]
    bytes_per_row: float

    @property
    def num_rows(self) -> int: ...

    @property
    def hints(self) -> ReadHints: ...

    @property
    def facts(self) -> RowsFacts: ...

    def schema_table(self) -> pa.Table: ...

    def settings(self) -> dict[str, Any]: ...

    def read_rows(self, positions: np.ndarray, epoch: int = 0) -> Read: ...

    def describe_rows(self, positions: np.ndarray) -> str: ...

    def lineage(self, positions: np.ndarray, epoch: int = 0) -> dict[str, Any]: ...

    def resumed(
        self, state: dict[str, Any], allow_changes: tuple[str, ...]
    ) -> tuple[RowSource, int]: ...

    def at_epoch_start(self, epoch: int) -> RowSource: ...

    def step_at(self, epoch: int, sample: int) -> int | None: ...

    def with_weights(self, weights: Any, step: int | None, next_step: int) -> RowSource: ...

    def delivered(self, start: tuple[int, int], stop: tuple[int, int]) -> list[Any]: ...

    def check_nulls(self, conversion: Any) -> None: ...

    def blob_files(self, column: str, offsets: pa.Array, buffer_size: int) -> list[Any]: ...


class RowsBase:
    """The protocol's defaults, so a kind states only what differs: no read hints, no facts,
    resumes any state of itself, positions described and traced by number, no null scan.

    >>> class Squares(RowsBase):
    ...     dataset_name, columns, bytes_per_row, num_rows = DatasetName("squares"), ["x"], 8.0, 4
    ...     def schema_table(self): return pa.table({"x": pa.array([], pa.int64())})
    ...     def settings(self): return {}
    ...     def read_rows(self, positions, epoch=0): return Read(pa.table({"x": positions ** 2}))
    >>> Squares().read_rows(np.array([3, 1])).rows["x"].to_pylist(), Squares().hints.read_parts
    ([9, 1], 1)
    """

    dataset_name: DatasetName
    columns: list[str]
    bytes_per_row: float

    @property
    def uri(self) -> str:
        return self.dataset_name.uri

    @property
    def version(self) -> int | None:
        return self.dataset_name.version

    @property
    def identity(self) -> str | None:
        return self.dataset_name.identity

    @property
    def hints(self) -> ReadHints:
        return ReadHints()

    @property
    def facts(self) -> RowsFacts:
        return RowsFacts()

    def describe_rows(self, positions: np.ndarray) -> str:
        positions = np.asarray(positions)
        return f"positions {positions[:4].tolist()}{'...' if len(positions) > 4 else ''}"

    def lineage(self, positions: np.ndarray, epoch: int = 0) -> dict[str, Any]:
        """The ledger's columns for ``positions``: the dataset and the positions themselves
        (kinds over Lance rows add the rows' offsets and ids)."""
        n = len(positions)
        return {
            "uri": [self.uri] * n,
            "version": [self.version] * n,
            "position": np.asarray(positions, np.int64),
        }

    def resumed(self, state: dict[str, Any], allow_changes: tuple[str, ...]) -> tuple[Self, int]:
        """These rows continue any state of them (a mix whose weights changed may not)."""
        return self, state["sample"]

    def at_epoch_start(self, epoch: int) -> Self:
        """Every epoch reads these rows (a followed Lance table may read a newer version)."""
        return self

    def step_at(self, epoch: int, sample: int) -> int | None:
        """The run's global step at ``sample`` of ``epoch``: only a mix counts steps (its
        weights change at steps); None elsewhere."""
        return None

    def with_weights(self, weights: Any, step: int | None, next_step: int) -> Self:
        """These rows with new mixture weights from ``step`` on: only a mix has weights."""
        raise ValueError(
            f"set_weights: {self.dataset_name.uri!r} is not a mix, so it has no weights to "
            "set; build the loader from ll.Mix({name: Loader or URI, ...}, weights=...)"
        )

    def delivered(self, start: tuple[int, int], stop: tuple[int, int]) -> list[Any]:
        """What each source of a mix gave between two positions, per piece of its weights
        (``MixedSource.delivered``): nothing for rows that mix nothing."""
        return []

    def check_nulls(self, conversion: Any) -> None:
        """Nothing to scan at construction: the batch that holds a null raises."""

    def blob_files(self, column: str, offsets: pa.Array, buffer_size: int) -> list[Any]:
        """``lance.BlobFile`` objects of a blob column read as files: only Lance rows have
        them."""
        raise ValueError(
            f"blob_files: {self.dataset_name.uri!r} reads no blob column as files "
            f"(column {column!r}); read it with blobs={{{column!r}: 'file'}} on "
            "the Loader of the Lance dataset that holds it"
        )


_batch_rows: contextvars.ContextVar[Any] = contextvars.ContextVar(
    "lanceloader_batch_rows", default=None
)


@contextlib.contextmanager
def transforming(rows: Any) -> Iterator[None]:
    """The rows a transform's batch was read from, for what the transform asks of them
    (:func:`~lanceloader.rows.lance.blobs.blob_files` opens their blob files): set by the
    worker around each transform call (``engine/work.py``), in its own thread or process."""
    token = _batch_rows.set(rows)
    try:
        yield
    finally:
        _batch_rows.reset(token)


def batch_rows() -> Any:
    """The rows the running transform's batch was read from (``None`` outside a transform)."""
    return _batch_rows.get()


def empty_table(schema: pa.Schema) -> pa.Table:
    """A table of no rows with ``schema``, extension types included (Arrow cannot make an
    empty ``fixed_shape_tensor`` with a permutation, what ``decode_images(layout="CHW")``
    writes, from a sequence: it is made from its storage).

    >>> t = pa.fixed_shape_tensor(pa.uint8(), (2, 3), permutation=[1, 0])
    >>> empty_table(pa.schema([("x", t)])).num_rows
    0
    """

    def empty(typ: pa.DataType) -> pa.Array:
        if isinstance(typ, pa.BaseExtensionType):
            return pa.ExtensionArray.from_storage(typ, empty(typ.storage_type))
        return pa.array([], type=typ)

    return pa.table([empty(f.type) for f in schema], schema=schema)


def read_table(source: RowSource, positions: np.ndarray) -> pa.Table:
    """The rows of ``source`` at ``positions`` as one table (no copy of Lance's chunks)."""
    return as_table(source.read_rows(np.asarray(positions, dtype=np.int64)).rows)


def strictly_ascending(values: np.ndarray) -> bool:
    """Whether ``values`` ascend with no repeat (fewer than two do): already sorted and unique,
    the common case of a read, which then needs no sort.

    >>> strictly_ascending(np.array([1, 2, 5])), strictly_ascending(np.array([1, 1]))
    (True, False)
    """
    return len(values) < 2 or bool(np.all(values[1:] > values[:-1]))


def sorted_unique(positions: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """``positions`` sorted and deduplicated, and where each request lies in them (``None``
    when they already were: strictly increasing, the common case, costs no sort).

    >>> sorted_unique(np.array([1, 2, 5]))[1] is None, sorted_unique(np.array([5, 1, 5]))[1]
    (True, array([1, 0, 1]))
    """
    if strictly_ascending(positions):
        return positions, None
    return np.unique(positions, return_inverse=True)


def distinct(values: np.ndarray) -> np.ndarray:
    """``np.unique(values)`` for integers, by a sort. NumPy 2.3 and later find unique integers
    by hashing them, 10-30x slower than sorting (docs/performance.md, "Gathers"), and values
    already strictly increasing (a sequential read) need no sort: they are returned as they are
    (read them, never write to them).

    >>> distinct(np.array([3, 1, 3, 0])).tolist(), distinct(np.array([2, 5])).tolist()
    ([0, 1, 3], [2, 5])
    """
    if strictly_ascending(values):
        return values
    ordered = np.sort(values)
    return ordered[np.concatenate(([True], ordered[1:] != ordered[:-1]))]


def inverse_permutation(placed: np.ndarray) -> np.ndarray:
    """The inverse of the permutation ``placed`` (row ``i`` goes to place ``placed[i]``): taking
    it from the rows puts each in its place."""
    where = np.empty_like(placed)
    where[placed] = np.arange(len(placed))
    return where


class Intervals:
    """Which of consecutive intervals each offset lies in: the fragment of a Lance row offset,
    or the cache piece. ``starts`` are the intervals' first offsets, non-decreasing, the last
    one the end (a fragment's cumulative row counts; empty intervals allowed); ``of(offsets)``
    equals ``np.searchsorted(starts, offsets, side="right") - 1`` for offsets in ``[starts[0],
    end)``.

    Why not ``searchsorted``: its branches are unpredictable, and a read's binary search was a
    noticeable share of a cached full shuffle's worker time; a table of buckets no wider than
    the narrowest interval, then a step over any start inside the bucket, takes a third of that
    (docs/performance.md, "Gathers").
    Where the intervals are too uneven for that (a bucket would hold over :data:`MAX_STEPS`
    starts within a table of 65,536 buckets), it binary-searches as before.

    >>> fragments = Intervals(np.array([0, 5, 5, 12]))   # 5 rows, none, 7 rows: 12 in all
    >>> fragments.of(np.array([11, 0, 4, 5])).tolist()
    [2, 0, 0, 2]
    """

    MAX_STEPS = 4

    def __init__(self, starts: np.ndarray) -> None:
        self.starts = np.asarray(starts, dtype=np.int64)
        first, end = int(self.starts[0]), int(self.starts[-1])
        widths = np.diff(self.starts)
        narrowest = int(widths[widths > 0].min()) if bool((widths > 0).any()) else 1
        span = max(1, end - first)
        self._first = first
        self._shift = max(narrowest.bit_length() - 1, (span - 1).bit_length() - 16, 0)
        firsts = first + (np.arange(((span - 1) >> self._shift) + 1, dtype=np.int64) << self._shift)
        table = np.searchsorted(self.starts, firsts, side="right") - 1
        lasts = np.minimum(firsts + (1 << self._shift) - 1, end - 1)
        steps = max(0, int((np.searchsorted(self.starts, lasts, side="right") - 1 - table).max()))
        self._table = table.astype(np.intp)
        self._steps = steps if steps <= self.MAX_STEPS else None
        self._next = np.append(self.starts[1:], np.iinfo(np.int64).max)

    def of(self, offsets: np.ndarray) -> np.ndarray:
        """The interval of each offset (intp), as ``searchsorted`` gives it."""
        if self._steps is None or not len(offsets):
            return np.searchsorted(self.starts, offsets, side="right") - 1
        where = self._table[
            (offsets - self._first) >> self._shift if self._first else offsets >> self._shift
        ]
        for _ in range(self._steps):
            where += offsets >= self._next[where]
        return where


def is_identity(order: np.ndarray) -> bool:
    return bool(len(order) == 0 or (order[0] == 0 and is_run(order)))


def is_run(positions: np.ndarray) -> bool:
    """Whether ``positions`` are consecutive and ascending (a sequential read), at least one.

    >>> is_run(np.arange(5, 9)), is_run(np.array([5, 7, 6, 8])), is_run(np.array([], int))
    (True, False, False)
    """
    n = len(positions)
    return bool(n and positions[-1] - positions[0] == n - 1 and np.all(np.diff(positions) == 1))


def to_record_batch(table: pa.Table) -> pa.RecordBatch:
    """A table as one RecordBatch; copies only when it has several chunks."""
    batches = table.to_batches()
    if len(batches) == 1:
        return batches[0]
    if not batches:
        return pa.RecordBatch.from_pylist([], schema=table.schema)
    return table.combine_chunks().to_batches()[0]


@dataclass(frozen=True)
class Pieces:
    """A read's rows as runs of a few record batches, in order, not yet copied into one table:
    what a mix with long runs of one source reads (:func:`lanceloader.rows.placement.mixed_rows`).

    ``runs`` are ``(batch, start, length)``: rows ``[start, start + length)`` of
    ``batches[batch]``. The worker converts each of ``batches`` once and hands out every batch
    of the task that lies within one run as a slice of that conversion (no copy), as it does
    with a single source's chunks; :meth:`table` is the same rows as one table (slices, no copy)
    for the rest.

    >>> t = pa.record_batch({"x": [0, 1, 2, 3]})
    >>> Pieces([t], [(0, 2, 2), (0, 0, 2)]).table()["x"].to_pylist()
    [2, 3, 0, 1]
    """

    batches: list[pa.RecordBatch]
    runs: list[tuple[int, int, int]]

    @property
    def num_rows(self) -> int:
        return sum(n for _, _, n in self.runs)

    @property
    def bytes_per_row(self) -> float:
        """Arrow bytes per row of the record batches (what a run's rows average)."""
        return sum(b.nbytes for b in self.batches) / max(1, sum(len(b) for b in self.batches))

    def table(self) -> pa.Table:
        return pa.Table.from_batches(
            [self.batches[b].slice(s, n) for b, s, n in self.runs], schema=self.batches[0].schema
        )


def as_table(rows: pa.Table | Pieces) -> pa.Table:
    """The rows of a source's read as one table (a :class:`Pieces` joined, no copy)."""
    return rows.table() if isinstance(rows, Pieces) else rows
