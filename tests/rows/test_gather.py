"""gather_rows: every row in its place, copied once, for every column type (fixed-width ones by
NumPy, the rest by Arrow), from parts of one chunk or many, sliced or not, with or without
row numbers; counts that do not add up are refused."""

from __future__ import annotations

import itertools

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lanceloader.rows.gather import column_views, gather_rows, group_order
from lanceloader.rows.protocol import Intervals, distinct

SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("x", pa.list_(pa.float32(), 3)),
        ("h", pa.float16()),
        ("fixed", pa.binary(2)),
        ("maybe", pa.int32()),  # nulls in some parts: gathered by Arrow
        ("s", pa.string()),
        ("flag", pa.bool_()),
    ]
)


def part_table(start: int, rows: int, chunks: int, offset: int, nulls: bool) -> pa.Table:
    """``rows`` rows numbered from ``start`` in ``chunks`` chunks, each a slice at ``offset``
    of a longer array (so buffers do not start at the rows)."""
    ids = np.arange(start - offset, start + rows + 4)
    full = pa.table(
        {
            "id": ids,
            "x": pa.FixedSizeListArray.from_arrays(
                pa.array(np.repeat(ids, 3).astype(np.float32)), 3
            ),
            "h": pa.array(ids.astype(np.float16)),
            "fixed": pa.array([int(i % 60000).to_bytes(2, "little") for i in ids], pa.binary(2)),
            "maybe": pa.array([None if nulls and i % 3 == 0 else int(i) for i in ids], pa.int32()),
            "s": pa.array([f"r{i}" for i in ids]),
            "flag": pa.array([bool(i % 2) for i in ids]),
        },
        schema=SCHEMA,
    ).slice(offset, rows)
    cuts = sorted({0, rows, *np.linspace(0, rows, chunks + 1).astype(int).tolist()})
    return pa.Table.from_batches(
        [b for lo, hi in itertools.pairwise(cuts) for b in full.slice(lo, hi - lo).to_batches()],
        SCHEMA,
    )


@st.composite
def gathers(draw):
    """Parts, and a random partition of the result's places among rows drawn from them."""
    count = draw(st.integers(1, 4))
    in_order = draw(st.booleans())  # a sequential read: runs of rows to runs of places
    parts, start = [], 0
    for _ in range(count):
        rows = draw(st.integers(1, 40))
        parts.append(
            part_table(
                start, rows, draw(st.integers(1, 3)), draw(st.integers(0, 3)), draw(st.booleans())
            )
        )
        start += 1000
    wheres, sizes = [], []
    for part in parts:
        if draw(st.booleans()):
            wheres.append(None)
            sizes.append(part.num_rows)
        elif in_order:
            lo = draw(st.integers(0, part.num_rows - 1))
            hi = draw(st.integers(lo, part.num_rows))
            wheres.append(np.arange(lo, hi, dtype=np.int64))
            sizes.append(hi - lo)
        else:
            rows = draw(st.lists(st.integers(0, part.num_rows - 1), max_size=30))
            wheres.append(np.array(rows, dtype=np.int64))
            sizes.append(len(rows))
    n = sum(sizes)
    perm = (
        np.arange(n)
        if in_order
        else np.random.default_rng(draw(st.integers(0, 2**32 - 1))).permutation(n)
    )
    places = np.split(perm, np.cumsum(sizes)[:-1])
    return parts, wheres, places, n


@settings(max_examples=80, deadline=None)
@given(gathers())
def test_every_row_lands_in_its_place(case):
    parts, wheres, places, n = case
    got = gather_rows(parts, wheres, places, n)
    want: list[dict | None] = [None] * n
    for part, where, place in zip(parts, wheres, places, strict=True):
        rows = part.to_pylist()
        for i, p in enumerate(place):
            want[int(p)] = rows[i if where is None else int(where[i])]
    assert got.schema == SCHEMA
    assert got.to_pylist() == want


def test_consecutive_rows_past_the_parts_end_raise_not_copy_short():
    """A run of rows that leaves its part is an error, as an index is, never a short slice
    copy that leaves the rest of the result unwritten."""
    part = pa.table({"x": np.arange(5)})
    with pytest.raises(IndexError):
        gather_rows([part], [np.arange(3, 7)], [np.arange(4)], 4)


def test_the_result_owns_its_buffers():
    """Rows of a piece that is then freed stay right (fixed-width columns are copied out)."""
    piece = pa.table({"x": pa.FixedSizeListArray.from_arrays(pa.array(np.arange(8.0)), 2)})
    got = gather_rows([piece], [np.array([3, 0])], [np.array([0, 1])], 2)
    del piece
    assert got["x"].to_pylist() == [[6.0, 7.0], [0.0, 1.0]]


def test_views_are_made_once_per_table_and_forgotten_with_it():
    table = pa.table({"a": [1, 2, 3]})
    assert column_views(table) is column_views(table)
    other = pa.table({"a": [4, 5]})
    assert column_views(other)[0][0].tolist() != column_views(table)[0][0].tolist()


@pytest.mark.parametrize(
    ("places", "n", "says"),
    [([np.array([0])], 2, "1 places for 2 rows"), ([np.array([0, 1])], 2, "each place one row")],
)
def test_counts_that_do_not_add_up_are_refused(places, n, says):
    with pytest.raises(ValueError, match=says):
        gather_rows([pa.table({"a": [1, 2]})], [np.array([0])], places, n)


def test_parts_of_another_projection_are_refused():
    with pytest.raises(ValueError, match="gather parts of one projection"):
        gather_rows(
            [pa.table({"a": [1]}), pa.table({"b": [1]})],
            [None, None],
            [np.array([0]), np.array([1])],
            2,
        )


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 70_000), max_size=300), st.sampled_from([np.int64, np.int32]))
def test_group_order_is_the_stable_argsort(keys, dtype):
    """The radix sort of small keys (uint16) orders like NumPy's stable argsort, and keys at
    or above 65,536 (which must not wrap) too."""
    keys = np.array(keys, dtype=dtype)
    assert group_order(keys).tolist() == np.argsort(keys, kind="stable").tolist()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(-(2**40), 2**40), max_size=200), st.booleans())
def test_distinct_is_numpys_unique(values, ascending):
    """The sort-based unique (NumPy's own hashes integers, 10x slower) agrees with
    ``np.unique``: shuffled, duplicated and strictly increasing values (returned as they are)."""
    values = np.array(sorted(set(values)) if ascending else values, dtype=np.int64)
    assert distinct(values).tolist() == np.unique(values).tolist()


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(0, 3000), min_size=1, max_size=12),  # interval widths (0: empty)
    st.integers(0, 2**40),
    st.data(),
)
def test_intervals_agree_with_searchsorted(widths, first, data):
    """The bucket table finds each offset's interval as a binary search does, for empty,
    uneven and offset intervals (the piece table of a fragment with a 1-row tail)."""
    starts = first + np.concatenate(([0], np.cumsum(widths)))
    if starts[-1] == starts[0]:
        return  # no offsets to place
    offsets = np.array(
        data.draw(
            st.lists(st.integers(int(starts[0]), int(starts[-1]) - 1), min_size=1, max_size=200)
        ),
        dtype=np.int64,
    )
    want = np.searchsorted(starts, offsets, side="right") - 1
    assert Intervals(starts).of(offsets).tolist() == want.tolist()


def test_intervals_of_many_fragments_take_the_bucket_table():
    """60,000 fragments of 2-7 rows still get a table (not the binary-search fallback)."""
    starts = np.concatenate(([0], np.cumsum(np.random.default_rng(0).integers(2, 8, 60_000))))
    index = Intervals(starts)
    offsets = np.random.default_rng(1).integers(0, int(starts[-1]), 10_000)
    assert index._steps is not None
    assert index.of(offsets).tolist() == (np.searchsorted(starts, offsets, "right") - 1).tolist()
