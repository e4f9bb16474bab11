"""The read of sorted unique Lance row offsets of a local dataset: long runs as fragment range
reads, the rest as one ``take``.

Runs of at least :data:`MIN_RANGE_ROWS` contiguous rows of one fragment are range reads (Lance's
fastest path on local disk), and so are a few short ones (a run cut by a fragment's end); many
short runs (a block shuffle's blocks) are one ``take`` (no per-run Python). A run is cut where a
fragment ends: in a table grown by 500-row appends every run is short, and one ``take`` of a
sequential read's rows beat one scan of the fragments they cross (1M rows of 3 columns in the
loader: 0.73-0.93 s vs 1.11-1.43 s; Lance's take reads the fragments in parallel).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import lance
import numpy as np
import pyarrow as pa

# Runs of at least this many contiguous rows are read as fragment ranges; shorter runs join one
# `take`, which beats many small range reads (measured: 1024-row blocks 3.0M vs 1.5M rows/s).
# On object storage every read is one `take`: Lance then sends all of a read's requests at once,
# where range reads one after another each wait for the store (S3 emulated with 20 ms per
# request: sequential 1.19x, block shuffle 1.05x the rows/s of range reads of >= 4,096 rows).
MIN_RANGE_ROWS = 4096
FEW_SHORT_RUNS = 2
# A read of fewer rows is one `take` even as a single run: Lance's fragment range read costs more
# per call than a take of the same few rows (128x128 JPEG rows, 1 row: 738 vs 415 us CPU; 64 rows:
# 1,357 vs 761; 64-float rows: 1,124 vs 818 and 960 vs 737), and a MapDataset row by row (what a
# torch DataLoader's per-sample __getitem__ asks) is one-row reads: 3,025 -> 2,321 us CPU a row.
FEW_ROWS = 64


def read_sorted_local(
    ds: lance.LanceDataset,
    fragments: Sequence[Any],
    starts: np.ndarray,
    fragment_of: np.ndarray,
    offsets: np.ndarray,
    columns: list[str],
    empty: pa.Table,
) -> tuple[pa.Table, np.ndarray]:
    """The rows at sorted unique ``offsets`` (each in fragment ``fragment_of``; ``starts``: each
    fragment's first offset) and, per row read, its index in ``offsets``; ``empty`` when none."""
    if not len(offsets):
        return empty, np.zeros(0, dtype=np.int64)
    breaks = np.flatnonzero((np.diff(offsets) != 1) | (np.diff(fragment_of) != 0)) + 1
    lows = np.concatenate(([0], breaks))
    highs = np.concatenate((breaks, [len(offsets)]))
    long = highs - lows >= MIN_RANGE_ROWS
    if np.count_nonzero(~long) <= FEW_SHORT_RUNS and len(offsets) >= FEW_ROWS:
        long[:] = True
    pieces: list[pa.Table] = []
    order: list[np.ndarray] = []
    for lo, hi in zip(lows[long].tolist(), highs[long].tolist(), strict=True):
        frag = int(fragment_of[lo])
        local = int(offsets[lo] - starts[frag])
        pieces.append(fragments[frag].to_table(columns=columns, offset=local, limit=hi - lo))
        order.append(np.arange(lo, hi))
    if not long.all():  # the rows of short runs: one take
        idx = np.flatnonzero(np.repeat(~long, highs - lows))
        pieces.append(ds.take(offsets[idx], columns=columns))
        order.append(idx)
    return pa.concat_tables(pieces), np.concatenate(order)
