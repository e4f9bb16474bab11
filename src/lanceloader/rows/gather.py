"""Gather: rows of several tables put in their places in one new table, each row copied once.

A read through the cache (:mod:`lanceloader.rows.cache.pieces`) finds its rows in many pieces: a few
rows of each, in a shuffled order. Taking each piece's rows with Arrow, joining the parts and
taking once more to restore the request's order copies every row twice and runs Arrow's
generic ``take`` (slow on fixed-size lists: it takes their values one by one). Here a column of
fixed-width values without nulls (numbers, dates, fixed-size binary, fixed-size lists of them)
is copied with NumPy straight from each part into its places in one new buffer of Arrow's
pool; any other column (strings, binary, nested, nulls) is one Arrow ``take`` per part, then one
to put the rows in place. Pure: no I/O, nothing kept; the result owns its buffers (the parts
may be freed afterwards).

>>> a, b = pa.table({"x": [10, 11, 12], "s": ["a", "b", "c"]}), pa.table({"x": [20], "s": ["d"]})
>>> t = gather_rows([a, b], [np.array([2, 0]), None], [np.array([0, 2]), np.array([1])], 3)
>>> t["x"].to_pylist(), t["s"].to_pylist()
([12, 20, 10], ['c', 'd', 'a'])
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from lanceloader.rows.protocol import inverse_permutation, is_run

Strides = tuple[int, int, list[tuple[int, int]]]  # (period, q, [(first place, first row)])


def group_order(keys: np.ndarray) -> np.ndarray:
    """``np.argsort(keys, kind="stable")`` of non-negative integer keys (a row's piece, its
    chunk): the order that groups equal keys, each group in its rows' order. NumPy sorts 16-bit
    keys by radix, so keys below 65,536 sort as ``uint16``, faster (docs/performance.md,
    "Gathers").

    >>> group_order(np.array([3, 1, 3, 0])).tolist()
    [3, 1, 0, 2]
    """
    if len(keys) and int(keys.min()) >= 0 and int(keys.max()) < 1 << 16:
        keys = keys.astype(np.uint16)
    return np.argsort(keys, kind="stable")


def gather_rows(
    parts: list[pa.Table],
    wheres: list[np.ndarray | None],
    places: list[np.ndarray],
    n: int,
    strides: list[Strides | None] | None = None,
) -> pa.Table:
    """A table of ``n`` rows in which row ``places[k][i]`` is row ``wheres[k][i]`` of
    ``parts[k]`` (row ``i`` of it when ``wheres[k]`` is ``None``).

    ``strides[k]``, where given, is ``places[k]`` as a pattern, ``(period, q, [(first
    place, first row), ...])``: rows ``first row + i q`` of part ``k`` are at places ``first
    place + i period`` (a mix read sample by sample, :class:`~lanceloader.ordering.interleave.
    Slots`). A fixed-width column of a part in order (``wheres[k]`` is ``None``) is then copied
    by strided slices, not by an index, faster (docs/performance.md, "Gathers").

    Contract: the places of all parts together are each of ``0 … n-1`` exactly once (a
    partition of the rows, as a read grouped by piece makes), and the parts have the schema of
    ``parts[0]``; counts that do not add up, or another schema, are a ``ValueError`` naming
    them. Each row is copied once into the result (see the module's text). A part's NumPy views
    are made once per table object (:func:`column_views`), so parts that live long (the pieces
    a cache holds) cost no per-read setup.

    >>> gather_rows([pa.table({"x": [1, 2]})], [np.array([1, 1])], [np.array([1, 0])], 2
    ...             )["x"].to_pylist()
    [2, 2]
    """
    schema = _checked_parts(parts, wheres, places, n)
    views = [column_views(part) for part in parts]
    scatter, runs = _copy_plans(parts, wheres, places, strides)
    columns: list[pa.Array | pa.ChunkedArray] = []
    inverse: pa.Array | None = None
    for i, field in enumerate(schema):
        if all(v[i] is not None for v in views):
            parts_i = [v[i] for v in views]
            columns.append(
                gather_fixed(
                    field.type,
                    parts_i,  # type: ignore[arg-type]
                    wheres,
                    places,
                    n,
                    scatter,
                    runs,
                )
            )
            continue
        if inverse is None:  # the request's place of each row of the parts joined
            inverse = pa.array(inverse_permutation(np.concatenate(places)))
        taken = [
            part.column(i) if w is None else part.column(i).take(pa.array(w))
            for part, w in zip(parts, wheres, strict=True)
        ]
        joined = pa.chunked_array([c for column in taken for c in column.chunks], field.type)
        columns.append(joined.take(inverse))
    return pa.Table.from_arrays(columns, schema=schema)


def _copy_plans(
    parts: list[pa.Table],
    wheres: list[np.ndarray | None],
    places: list[np.ndarray],
    strides: list[Strides | None] | None,
) -> tuple[list[np.ndarray | Strides | None], list[Any]]:
    """How each part's fixed-width rows are copied: a part whose rows each have exactly one
    place is scattered in its own order (one pass over its rows: a mix's parts; by strides
    where given), others are gathered (a cache's pieces: a few rows each); and each part's
    run of consecutive rows to consecutive places, if it is one (a slice copy)."""
    scatter: list[np.ndarray | Strides | None] = [
        place if where is None else scatter_targets(where, place, len(part))
        for part, where, place in zip(parts, wheres, places, strict=True)
    ]
    for k, stride in enumerate(strides or ()):
        if stride is not None and wheres[k] is None:
            scatter[k] = stride
    runs = [
        run_of(len(part), where, place)
        for part, where, place in zip(parts, wheres, places, strict=True)
    ]
    return scatter, runs


def _checked_parts(
    parts: list[pa.Table], wheres: list[np.ndarray | None], places: list[np.ndarray], n: int
) -> pa.Schema:
    """The parts' schema, once :func:`gather_rows`'s contract is checked: every row of the
    result one place, every place one row, one schema."""
    if not parts:
        raise ValueError("gather_rows needs at least one part (a table) to gather rows from")
    counts = [len(p) if w is None else len(w) for p, w in zip(places, wheres, strict=True)]
    if sum(counts) != n or any(
        len(w) != len(p) for p, w in zip(places, wheres, strict=True) if w is not None
    ):
        raise ValueError(
            f"gather_rows: {sum(counts)} places for {n} rows ({counts} per part, "
            f"rows {[None if w is None else len(w) for w in wheres]}): give each "
            "row of the result exactly one place, and each place one row"
        )
    schema = parts[0].schema
    for part in parts[1:]:
        if part.schema is not schema and not part.schema.equals(schema):
            raise ValueError(
                f"gather_rows: a part has the schema {part.schema} where the "
                f"first has {schema}: gather parts of one projection"
            )
    return schema


_output = threading.local()  # .allocate: this thread's output_memory


@contextlib.contextmanager
def output_memory(allocate: Callable[[int], pa.Buffer | None]) -> Iterator[None]:
    """Gathers in this thread put their columns in memory from ``allocate(size)`` (a mutable
    buffer, or None for Arrow's pool): a process worker gathers straight into the shared
    memory its result travels in (:mod:`lanceloader.engine.segments`), not into a buffer it
    then copies."""
    before = getattr(_output, "allocate", None)
    _output.allocate = allocate
    try:
        yield
    finally:
        _output.allocate = before


def allocate(size: int) -> pa.Buffer:
    """A new mutable buffer of ``size`` bytes for a gather's column: from this thread's
    :func:`output_memory` where it has room, else from Arrow's pool."""
    given = getattr(_output, "allocate", None)
    buffer = given(size) if given is not None else None
    return pa.allocate_buffer(size) if buffer is None else buffer


_views: dict[int, tuple[weakref.ref[pa.Table], list[list[np.ndarray] | None]]] = {}
_views_lock = threading.Lock()


def column_views(table: pa.Table) -> list[list[np.ndarray] | None]:
    """Per column of ``table``: its chunks as ``width``-byte NumPy items (no copy) when it is
    a fixed-width column without nulls (:func:`row_width`), else None. Made once per table
    object and kept while it lives (a weak reference: the table's death forgets them).

    >>> [None if v is None else v[0].dtype.str for v in column_views(
    ...     pa.table({"x": [1, 2], "s": ["a", "b"]}))]
    ['|V8', None]
    """
    key = id(table)
    with _views_lock:
        known = _views.get(key)
        if known is not None and known[0]() is table:
            return known[1]
    made: list[list[np.ndarray] | None] = []
    for column in table.columns:
        width = row_width(column.type)
        made.append(
            None
            if not width or has_nulls(column)
            else [rows_view(c, column.type, width) for c in column.chunks if len(c)]
        )
    with _views_lock:
        _views[key] = (weakref.ref(table), made)
    weakref.finalize(table, _forget_views, key)
    return made


def _forget_views(key: int) -> None:
    with _views_lock:
        known = _views.get(key)
        if known is not None and known[0]() is None:
            del _views[key]


def row_width(kind: pa.DataType) -> int:
    """Bytes a row of a column of type ``kind`` takes in one values buffer (a fixed-size list
    counted with its values), or 0 when it is not gathered as bytes (bits, variable width,
    nested lists, dictionaries, extension types).

    >>> row_width(pa.int64()), row_width(pa.list_(pa.float32(), 64)), row_width(pa.string())
    (8, 256, 0)
    """
    if pa.types.is_fixed_size_list(kind):
        inner = row_width(kind.value_type)
        return (
            inner * kind.list_size
            if inner and not pa.types.is_fixed_size_list(kind.value_type)
            else 0
        )
    if (
        isinstance(kind, pa.ExtensionType)
        or pa.types.is_dictionary(kind)
        or pa.types.is_boolean(kind)
    ):
        return 0
    try:
        bits = kind.bit_width
    except ValueError:  # not fixed width
        return 0
    return bits // 8 if bits % 8 == 0 else 0


def has_nulls(column: pa.ChunkedArray) -> bool:
    """Whether a column has nulls, in a fixed-size list's values too."""
    if pa.types.is_fixed_size_list(column.type):
        return any(c.null_count or list_values(c).null_count for c in column.chunks)
    return column.null_count > 0


def list_values(chunk: pa.FixedSizeListArray) -> pa.Array:
    """The values of a fixed-size list array's rows (of its slice only). ``chunk.flatten()``
    gives the same through a compute kernel at ~10 us a call (0.5 ms of a mix's read of 3
    parts); this slices the child array (~1 us)."""
    size = chunk.type.list_size
    return chunk.values.slice(chunk.offset * size, len(chunk) * size)


def rows_view(chunk: pa.Array, kind: pa.DataType, width: int) -> np.ndarray:
    """The rows of one array of a fixed-width type as ``width``-byte NumPy items (no copy)."""
    values = list_values(chunk) if pa.types.is_fixed_size_list(kind) else chunk
    item = width // (kind.list_size if pa.types.is_fixed_size_list(kind) else 1)
    return np.frombuffer(
        values.buffers()[1], np.uint8, count=len(chunk) * width, offset=values.offset * item
    ).view(f"V{width}")


def run_of(rows: int, where: np.ndarray | None, place: np.ndarray) -> tuple[int, int, int] | None:
    """``(first place, first row, count)`` when a part of ``rows`` rows gives consecutive rows
    (all of them when ``where`` is None) to consecutive places, as a sequential read through a
    cache does: one slice copy per column instead of an index, faster (docs/performance.md,
    "Gathers"); else None.

    >>> run_of(10, np.arange(3, 8), np.arange(100, 105)), run_of(4, None, np.array([0, 2, 1, 3]))
    ((100, 3, 5), None)
    """
    if not is_run(place) or (
        where is not None and not (is_run(where) and int(where[0]) >= 0 and int(where[-1]) < rows)
    ):
        return None  # rows outside the part: the index path raises; a slice would not
    return int(place[0]), 0 if where is None else int(where[0]), len(place)


def copy_run(out: np.ndarray, chunks: list[np.ndarray], place: int, row: int, count: int) -> None:
    """Rows ``row`` to ``row + count - 1`` of a part (its ``chunks`` in order) into ``out`` from
    ``place`` on: a slice copy per chunk they lie in."""
    first = 0
    for chunk in chunks:
        end = first + len(chunk)
        lo, hi = max(row, first), min(row + count, end)
        if lo < hi:
            out[place + lo - row : place + hi - row] = chunk[lo - first : hi - first]
        first = end


def scatter_targets(where: np.ndarray, place: np.ndarray, rows: int) -> np.ndarray | None:
    """The place of each of a part's ``rows`` rows when ``where`` names each exactly once (a
    permutation: the part is scattered in its own order), else None (gathered).

    >>> scatter_targets(np.array([2, 0, 1]), np.array([5, 6, 7]), 3).tolist()
    [6, 7, 5]
    >>> scatter_targets(np.array([1, 1]), np.array([0, 1]), 2) is None
    True
    """
    if len(where) != rows:
        return None
    target = np.full(rows, -1, np.int64)
    target[where] = place
    return target if bool((target >= 0).all()) else None


def gather_fixed(
    kind: pa.DataType,
    columns: list[list[np.ndarray]],
    wheres: list[np.ndarray | None],
    places: list[np.ndarray],
    n: int,
    scatter: list[np.ndarray | Strides | None] | None = None,
    runs: list[tuple[int, int, int] | None] | None = None,
) -> pa.Array:
    """One array of ``n`` rows of a fixed-width column without nulls, given as each part's
    chunks of ``width``-byte items (:func:`column_views`): row ``wheres[k][i]`` of part ``k``
    at ``places[k][i]``, copied into a new buffer of Arrow's pool (memory it reuses: no page
    faults afresh on every read). ``scatter[k]``, where given (:func:`scatter_targets`), is
    the place of each row of part ``k`` in its own order: those rows are scattered, chunk by
    chunk, one pass (a gather then a scatter costs about twice as much on 264-byte rows); or
    its places as :data:`Strides` (see :func:`gather_rows`), copied by strided slices.
    ``runs[k]``, where given (:func:`run_of`), copies part ``k``'s consecutive rows to
    consecutive places by slices."""
    width = row_width(kind)
    buffer = allocate(n * width)
    out = np.frombuffer(buffer, np.uint8).view(f"V{width}")
    targets = scatter or [None] * len(columns)
    for chunks, where, place, target, run in zip(
        columns, wheres, places, targets, runs or [None] * len(columns), strict=True
    ):
        if run is not None:  # consecutive rows to consecutive places
            copy_run(out, chunks, *run)
        elif isinstance(target, tuple):  # every row of the part, in order, by strides
            _scatter_strided(out, chunks, *target)
        elif target is not None or where is None:  # every row of the part: chunk by chunk
            target = place if target is None else target
            first = 0
            for chunk in chunks:
                out[target[first : first + len(chunk)]] = chunk
                first += len(chunk)
        elif len(chunks) == 1:  # np.take, then the scatter: 0.6x the time of chunk[where]
            out[place] = np.take(chunks[0], where)
        elif len(where):  # several chunks (a piece's record batches): each gives its rows
            ends = np.cumsum([len(c) for c in chunks])
            chunk_of = np.searchsorted(ends, where, side="right")
            order = group_order(chunk_of)
            grouped = chunk_of[order]
            for group in np.split(order, np.flatnonzero(grouped[1:] != grouped[:-1]) + 1):
                j = int(chunk_of[group[0]])
                out[place[group]] = np.take(chunks[j], where[group] - (ends[j] - len(chunks[j])))
    if pa.types.is_fixed_size_list(kind):
        values = pa.Array.from_buffers(kind.value_type, n * kind.list_size, [None, buffer])
        return pa.FixedSizeListArray.from_arrays(values, type=kind)
    return pa.Array.from_buffers(kind, n, [None, buffer])


def _scatter_strided(
    out: np.ndarray, chunks: list[np.ndarray], period: int, q: int, starts: list[tuple[int, int]]
) -> None:
    """Copy a part's rows (``chunks``, in order) to their places in ``out``: rows ``row + i q``
    to places ``place + i period``, for each ``(place, row)`` of ``starts``; one strided copy
    per start and chunk."""
    first = 0  # the part's row at which this chunk begins
    for chunk in chunks:
        end = first + len(chunk)
        for place, row in starts:
            r = first + (row - first) % q  # this start's first row in the chunk
            if r >= end:
                continue
            rows = chunk[r - first :: q]
            at = place + (r - row) // q * period
            out[at : at + (len(rows) - 1) * period + 1 : period] = rows
        first = end
