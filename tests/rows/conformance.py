"""The rows conformance helper: what every kind of rows promises (``rows/protocol.py``), checked
the same way for each, so a new kind is one class plus one line in ``test_conformance.py``.

:func:`assert_rows_conformance` checks, on any rows:

* a read gives exactly one row per position, in order, for unsorted and repeated positions
  (against reads of one position each), and its schema is ``schema_table()``'s;
* what a read did is sane: rows from the cache at most the rows read, no negative I/O or decode;
* ``settings()`` is JSON-safe; ``resumed()`` of a state of these rows is pure (these rows, the
  state's sample, nothing changed); ``describe_rows()`` and ``lineage()`` are total (any
  positions, the empty read too) and ``lineage()`` gives one row per position;
* the hints are plain data that fits the rows: ``read_parts >= 1``, windows positive, fragment
  starts ascending from 0 to ``num_rows``.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pyarrow as pa

import lanceloader as ll
from lanceloader.rows.protocol import as_table


def one_by_one(rows: Any, positions: np.ndarray, epoch: int) -> pa.Table:
    """The rows at ``positions`` read a position at a time: the oracle of a read."""
    parts = [as_table(rows.read_rows(np.array([p], np.int64), epoch).rows) for p in positions]
    return pa.concat_tables(parts) if parts else rows.schema_table()


def assert_same_rows(got: pa.Table, want: pa.Table) -> None:
    assert got.num_rows == want.num_rows
    assert got.schema.equals(want.schema, check_metadata=False)
    for name in want.column_names:
        assert got.column(name).to_pylist() == want.column(name).to_pylist(), name


def assert_rows_conformance(rows: Any, epochs: tuple[int, ...] = (0, 1), seed: int = 0) -> None:
    """Check every promise of the rows protocol on ``rows`` (see the module's text)."""
    n = rows.num_rows
    assert n > 0, "conformance needs rows to read"
    schema = rows.schema_table().schema
    rng = np.random.default_rng(seed)
    reads = [
        np.arange(min(n, 7), dtype=np.int64),  # in order
        rng.permutation(n)[: min(n, 9)].astype(np.int64),  # unsorted
        rng.integers(0, n, min(2 * n, 12)).astype(np.int64),  # repeated
        np.array([n - 1, 0, n - 1], np.int64),  # the ends, twice
        np.zeros(0, np.int64),  # nothing
    ]
    for epoch in epochs:
        for positions in reads:
            read = rows.read_rows(positions, epoch)
            table = as_table(read.rows)
            assert table.num_rows == len(positions)
            assert table.schema.equals(schema, check_metadata=False), (table.schema, schema)
            assert 0 <= read.rows_cached <= len(positions)
            assert read.io_bytes >= 0 and read.io_iops >= 0 and read.decode_s >= 0
            assert read.cache_damaged >= 0
            assert_same_rows(table, one_by_one(rows, positions, epoch))
            assert isinstance(rows.describe_rows(positions), str)
            lineage = rows.lineage(positions, epoch)
            assert {"uri", "version", "position"} <= set(lineage)
            for name, column in lineage.items():
                assert len(column) == len(positions), name
    settings = rows.settings()
    assert json.loads(json.dumps(settings)) == settings
    json.dumps(rows.dataset_name.__dict__)
    hints, facts = rows.hints, rows.facts
    assert hints.read_parts >= 1
    assert hints.window_rows is None or hints.window_rows > 0
    if hints.fragment_starts is not None:
        starts = np.asarray(hints.fragment_starts)
        assert starts[0] == 0 and starts[-1] == n and bool(np.all(np.diff(starts) >= 0))
    assert facts.padding_fraction is None or 0 <= facts.padding_fraction < 1
    assert_resumed_is_pure(rows)


def assert_resumed_is_pure(rows: Any) -> None:
    """A state of these rows (from a Loader over them) resumes as these rows at its sample,
    twice alike, leaving the rows' settings as they were."""
    loader = ll.Loader(rows, batch_size=2, output="arrow")
    next(iter(loader))
    state = loader.state_dict()
    before = json.dumps(rows.settings(), sort_keys=True)
    first = rows.resumed(state, ())
    assert first == rows.resumed(state, ()) and first == (rows, state["sample"])
    assert json.dumps(rows.settings(), sort_keys=True) == before
