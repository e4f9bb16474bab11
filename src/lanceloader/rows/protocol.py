"""The rows protocol: what every kind of rows is, and what a read of them returns.

A *source of rows* (:class:`RowSource`) has ``num_rows`` positions per epoch, ``[0, num_rows)``,
and reads any array of them, in that order, as :class:`Read`: the rows plus what the read cost.
Every kind of rows implements it and may wrap another: ``Source`` (one pinned Lance dataset,
filter, split, cache), ``PackedSource`` (packed token rows of any source), ``OrderedSource`` (a
source read through its own order and row-preserving transform: what a mix draws from) and
``MixedSource`` (an exact interleave of ordered sources). The Loader, the engine and the state
never ask which kind they hold.

What each member is for:

* ``num_rows``, ``schema_table()`` (an empty table of what reads return), ``columns``;
* ``bytes_per_row``: Arrow bytes per row, which sizes reads (``engine/stream.py``);
* ``random_reads``: whether a read of consecutive positions is random takes underneath (a mix
  of shuffled sources), which sizes reads like a shuffle;
* ``read_parts`` (optional, default 1): how many Lance calls of a full read size one read
  makes (a mix: its sources), so the engine makes the read that many times larger;
* ``waits_on_lance`` (optional, default False): whether a read of consecutive positions in
  storage order is Lance range reads alone (no cache, no transform), during which a worker
  thread holds no core while Lance's own threads read and decode, so the engine runs two
  thread workers per core (``engine/sizing.py`` ``default_workers``);
* ``settings()``: JSON-safe settings that define which rows the positions are, for the state
  and its fingerprint (``state/format.py``): filter, split, packing, mix;
* ``uri``, ``version``, ``identity``: the dataset (or ``mix:...`` and ``None`` for a mix);
* ``cache``: the cache the rows are read through, or ``None``; ``plan_origin``;
* ``padding_fraction``: the share of padding tokens of packed rows, ``None`` when not packed;
* ``read_rows(positions, epoch)``: exactly ``len(positions)`` rows in that order (a
  :class:`Pieces` or a table), raising ``ReadError`` on a failed read;
* ``describe_rows(positions)``: where positions lie, for error messages;
* ``resumed(state, allow_changes)``: the rows that continue a (checked) state and its sample:
  itself, or for a mix whose weights changed, the mix with offsets (pure: refusing a state
  changes nothing).

Nestings: a packed source wraps Lance rows; a mix holds ordered sources of Lance or packed rows.
A mix inside a mix and a packing of a mix are refused (a mix has no storage order to pack
documents in, and a mix of mixes is one mix with multiplied weights).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import pyarrow as pa


@dataclass(frozen=True)
class Read:
    """What a read of rows returns: the rows (exactly one per position, in order) and what the
    read cost: Lance's bytes and IOPS, the rows served by the cache, and the cache files that
    failed their check during the read (dropped and read again, never delivered)."""

    rows: pa.Table | Pieces
    io_bytes: int = 0
    io_iops: int = 0
    rows_cached: int = 0
    cache_damaged: int = 0


class RowSource(Protocol):
    """The contract every kind of rows keeps (see the module's text)."""

    uri: str
    version: int | None
    identity: str | None
    columns: list[str]
    cache: Any
    plan_origin: str
    bytes_per_row: float
    random_reads: bool

    @property
    def num_rows(self) -> int: ...

    @property
    def padding_fraction(self) -> float | None: ...

    def schema_table(self) -> pa.Table: ...

    def settings(self) -> dict[str, Any]: ...

    def read_rows(self, positions: np.ndarray, epoch: int = 0) -> Read: ...

    def describe_rows(self, positions: np.ndarray) -> str: ...

    def resumed(self, state: dict[str, Any], allow_changes: tuple[str, ...]
                ) -> tuple[RowSource, int]: ...


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
    by hashing them, 10-30x slower than sorting (a read's 60,000 rows: 15 ms against 1.4 ms;
    1M: 0.84 s against 25 ms), and values already strictly increasing (a sequential read) need
    no sort: they are returned as they are (read them, never write to them).

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

    Why not ``searchsorted``: a read's 30,720 offsets took 0.56 ms of binary search (6.5% of a
    cached full shuffle's worker time, its branches unpredictable); a table of buckets no wider
    than the narrowest interval, then a step over any start inside the bucket, takes 0.18 ms.
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
        firsts = first + (np.arange(((span - 1) >> self._shift) + 1, dtype=np.int64)
                          << self._shift)
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
        where = self._table[(offsets - self._first) >> self._shift if self._first else
                            offsets >> self._shift]
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
    what a mix with long runs of one source reads (:func:`lanceloader.rows.mixed.mixed_rows`).

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
        return pa.Table.from_batches([self.batches[b].slice(s, n) for b, s, n in self.runs],
                                     schema=self.batches[0].schema)


def as_table(rows: pa.Table | Pieces) -> pa.Table:
    """The rows of a source's read as one table (a :class:`Pieces` joined, no copy)."""
    return rows.table() if isinstance(rows, Pieces) else rows
