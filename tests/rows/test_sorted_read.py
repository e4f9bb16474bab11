"""``read_sorted_local``: which Lance call reads a read's rows, and that any choice returns them
exactly."""

from __future__ import annotations

from typing import Any

import lance
import numpy as np
import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lanceloader.rows.lance.sorted_read import FEW_ROWS, read_sorted_local


def layout(ds: lance.LanceDataset) -> tuple[list[lance.LanceFragment], np.ndarray]:
    """The dataset's fragments and each one's first row offset."""
    fragments = ds.get_fragments()
    return fragments, np.cumsum([0] + [f.count_rows() for f in fragments])[:-1]


def read(ds: lance.LanceDataset, fragments: Any, offsets: np.ndarray) -> pa.Table:
    """``offsets``' rows (column ``id``) in the order of ``offsets``."""
    _, starts = layout(ds)
    fragment_of = np.searchsorted(starts, offsets, side="right") - 1
    empty = ds.schema.empty_table().select(["id"])
    table, order = read_sorted_local(ds, fragments, starts, fragment_of, offsets, ["id"], empty)
    return table.take(pa.array(np.argsort(order)))


def test_a_read_of_a_few_rows_is_one_take_not_a_range_read(small_uri: str) -> None:
    """A row-by-row reader (a MapDataset's per-sample ``__getitem__``) pays Lance's range read's
    per-call cost, about 1.5-1.8x a take's, on every row: a read under FEW_ROWS rows never opens
    a fragment (none is given here: a range read would fail)."""
    ds = lance.dataset(small_uri)
    for offsets in ([437], list(range(500, 500 + FEW_ROWS - 1))):
        table = read(ds, (), np.array(offsets, dtype=np.int64))
        assert table.column("id").to_pylist() == offsets


@settings(
    max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None
)
@given(st.sets(st.integers(0, 999), max_size=200), st.integers(0, 999), st.integers(0, 300))
def test_any_read_returns_exactly_its_rows(
    small_uri: str, scattered: set[int], run_start: int, run_length: int
) -> None:
    """Scattered rows, a run (possibly crossing a fragment's end), or both: the rows asked for,
    whichever Lance calls read them."""
    ds = lance.dataset(small_uri)
    fragments, _ = layout(ds)
    rows = scattered | set(range(run_start, min(1000, run_start + run_length)))
    offsets = np.array(sorted(rows), dtype=np.int64)
    if len(offsets):
        assert read(ds, fragments, offsets).column("id").to_pylist() == offsets.tolist()
