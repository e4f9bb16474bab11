"""Placing rows: a mixed read's rows, put in mixed order from its sources' reads.

:func:`mixed_rows` is what :class:`~lanceloader.rows.mixed.MixedSource` makes of the parts its
sources read: where runs of one source are long (``run_length``, e.g. one source per batch) the
parts' own record batches as :class:`~lanceloader.rows.protocol.Pieces` (nothing copied); else
:func:`~lanceloader.rows.gather.gather_rows`, the one copy in which every row moves once, from
the table its source read into its place in the mixed read (scattered in its source's order). Pure Arrow and NumPy, no Lance.

What it costs (``benchmarks/pretraining.py``, ``copy_floor``): it moves every byte of a read
again, at memory speed; a single source read in order moves none, which is why a
sample-by-sample mix in sequential order stays below a single source (the floor that the
benchmark states).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from lanceloader.ordering.interleave import Runs
from lanceloader.rows.gather import gather_rows
from lanceloader.rows.protocol import Pieces

# Mixed rows are runs of the sources' reads (no copy) when their runs average this many rows: a
# run costs ~2 us to hand out, copying its rows ~70 ns a row of 264 B.
MIN_SLICE_ROWS = 64


def mixed_rows(
    parts: list[pa.Table], wheres: list[np.ndarray | None], runs: Runs
) -> pa.Table | Pieces:
    """The rows of a mixed read: ``parts[k]`` holds the rows source ``k`` read for ``runs``, in
    sorted order (``wheres[k]``: the row of each of its samples in stream order; ``None``: the
    same order).

    Where every part is in stream order and runs average :data:`MIN_SLICE_ROWS` rows or more
    (a mix with a ``run_length``, read in order), the rows are :class:`Pieces` of the parts:
    nothing is copied, and the worker hands out each batch within a run as a slice of its
    part's conversion (as it does for one source). Otherwise every row is copied once into its
    mixed place (:func:`~lanceloader.rows.gather.gather_rows`).

    >>> a, b = pa.table({"x": [10, 11]}), pa.table({"x": [20, 21]})
    >>> runs = Runs(np.array([0, 1, 0, 1]), np.array([0, 0, 1, 1]), np.ones(4, np.int64))
    >>> mixed_rows([a, b], [np.array([1, 0]), None], runs)["x"].to_pylist()
    [11, 20, 10, 21]
    >>> t = pa.table({"x": np.arange(1000)})
    >>> long = Runs(np.array([0, 1]), np.array([0, 0]), np.array([500, 500]))
    >>> pieces = mixed_rows([t.slice(500), t.slice(0, 500)], [None, None], long)
    >>> pieces.runs, pieces.table()["x"][0].as_py()          # two runs of 500 rows: not copied
    ([(0, 0, 500), (1, 0, 500)], 500)
    """
    n = int(runs.length.sum())
    if all(w is None for w in wheres) and n >= MIN_SLICE_ROWS * len(runs.source):
        return _pieces(parts, runs)
    # Source k's samples, in stream order, are its part's rows wheres[k]; in a read of
    # consecutive samples one a run, its rows in order are copied by strides.
    slots = runs.slots
    strides = None if slots is None else [slots.strides(k) for k in range(len(parts))]
    return gather_rows(parts, wheres, runs.places(len(parts)), n, strides)


def _pieces(parts: list[pa.Table], runs: Runs) -> Pieces:
    """``runs`` as runs of the parts' record batches (each part in stream order): no copy."""
    sizes = np.array([p.num_rows for p in parts])
    part_start = np.cumsum(sizes) - sizes  # where each part begins in their concatenation
    if runs.spans is not None:  # each source's runs continue each other from its first
        offset = runs.index - np.array([first for first, _ in runs.spans])[runs.source]
    else:  # the row of its part at which each run begins
        offset = np.zeros(len(runs.source), np.int64)
        for k in range(len(parts)):
            at = np.flatnonzero(runs.source == k)
            offset[at] = np.cumsum(runs.length[at]) - runs.length[at]
    batches = pa.concat_tables(parts).to_batches()
    bounds = np.cumsum([0] + [len(b) for b in batches])  # where each batch begins
    first = part_start[runs.source] + offset
    batch = np.searchsorted(bounds, first, side="right") - 1
    out = list(
        zip(batch.tolist(), (first - bounds[batch]).tolist(), runs.length.tolist(), strict=True)
    )
    for i in np.flatnonzero(first + runs.length > bounds[batch + 1])[::-1].tolist():
        b, row, length = out[i]  # a run crossing a batch's end continues in the next ones
        split = []
        while length:
            piece = min(length, int(bounds[b + 1] - bounds[b]) - row)
            split.append((b, row, piece))
            b, row, length = b + 1, 0, length - piece
        out[i : i + 1] = split
    return Pieces(batches, out)
