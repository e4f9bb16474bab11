"""Cache units: what the cache of Lance rows cuts into pieces, a fragment or a run of small ones.

A piece of the cache (:mod:`lanceloader.rows.lance.cached`) is up to ``piece_rows`` consecutive
rows of one *unit*. A fragment of at least ``piece_rows`` rows is a unit of its own; consecutive
smaller fragments join one unit while their rows fit in a piece. A table grown by appends of 500
rows has 2,000 fragments per million rows: one piece per fragment made a cache of 2,000 files,
each filled, opened and counted against the cap on its own (a block-shuffle epoch filling them
took 22.8 s where 4 fragments took 0.24 s; ``benchmarks/fragments.py``). Runs keep the pieces
near their intended size whatever the fragments are.

Contract: the units cover the pinned version's fragments in order, each fragment in exactly one;
a prefix of the fragments is grouped the same whatever follows it, so appending fragments
changes the last unit only (its pieces are filled again, the others stay valid). Units are cut
from the fragments' row counts alone; a unit's :func:`unit_metadata` (made from its fragments'
metadata when its pieces are first named, not at construction: 2,000 fragments' metadata cost
20-30 ms) names its data as :func:`~lanceloader.rows.cache.pieces.fragment_key` reads it: for a
unit of one fragment exactly the fragment's own (the pieces cached before runs existed stay
valid); for a run, every fragment's id, files and deletions, so any change to one of them
changes the run's name.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import lance
import numpy as np
import pyarrow as pa

from lanceloader.rows.dataset import file_paths


@dataclass(frozen=True)
class UnitFile:
    """A data file's name (what the piece name reads of it)."""

    path: str


@dataclass(frozen=True)
class RunDeletions:
    """The deletion files of a run's fragments: ``[fragment id, deletion file id]`` and the rows
    each deletes (``None`` for a fragment without one)."""

    id: list[Any]
    num_deleted_rows: list[int | None]


@dataclass(frozen=True)
class UnitMetadata:
    """What names a unit's data: duck-typed like Lance's ``FragmentMetadata`` for
    ``fragment_key`` (id, physical rows, files, deletion file)."""

    id: Any
    physical_rows: int
    files: list[UnitFile]
    deletion_file: Any


@dataclass(frozen=True)
class Unit:
    """Fragments ``first .. stop - 1`` of the pinned version (indices in its fragment list)."""

    first: int
    stop: int


def cache_units(counts: np.ndarray, piece_rows: int) -> tuple[list[Unit], np.ndarray]:
    """The units of fragments of ``counts`` rows each (see the module's text), and each unit's
    first row offset, then the row count.

    >>> units, starts = cache_units(np.array([3, 3, 9, 2, 2]), 6)
    >>> [(u.first, u.stop) for u in units], starts.tolist()
    ([(0, 2), (2, 3), (3, 5)], [0, 6, 15, 19])
    """
    units: list[Unit] = []
    first, rows = 0, 0
    for i, n in enumerate(counts.tolist()):
        if i > first and rows + n > piece_rows:
            units.append(Unit(first, i))
            first, rows = i, 0
        rows += n
    if len(counts):
        units.append(Unit(first, len(counts)))
    ends = np.cumsum(counts, dtype=np.int64)
    return units, np.concatenate(([0], ends[[u.stop - 1 for u in units]])).astype(np.int64)


def unit_metadata(metas: list[Any]) -> UnitMetadata:
    """What names the data of the unit of fragments with metadata ``metas`` (in order).

    >>> unit_metadata([_meta(3)]).id, unit_metadata([_meta(3), _meta(4)]).id
    (3, 'run [3, 4]')
    """
    files = [UnitFile(p) for m in metas for p in file_paths(m)]
    if len(metas) == 1:
        m = metas[0]
        return UnitMetadata(m.id, m.physical_rows, files, m.deletion_file)
    deletions = [m.deletion_file for m in metas]
    gone = (
        None
        if all(d is None for d in deletions)
        else RunDeletions(
            [[m.id, None if d is None else d.id] for m, d in zip(metas, deletions, strict=True)],
            [None if d is None else d.num_deleted_rows for d in deletions],
        )
    )
    ids = [m.id for m in metas]
    return UnitMetadata(f"run {ids}", sum(m.physical_rows for m in metas), files, gone)


def read_unit(
    ds: lance.LanceDataset,
    fragments: Sequence[Any],
    unit: Unit,
    columns: list[str],
    start: int,
    rows: int,
) -> pa.Table:
    """Up to ``rows`` rows of ``unit`` from its row ``start``, in order, as one chunk (Lance's
    batch size set to the rows): one scan of its fragments."""
    if unit.stop - unit.first == 1:
        scanner = fragments[unit.first].scanner(
            columns=columns, offset=start, limit=rows, batch_size=max(rows, 1)
        )
    else:
        scanner = ds.scanner(
            columns=columns,
            fragments=fragments[unit.first : unit.stop],
            offset=start,
            limit=rows,
            batch_size=max(rows, 1),
            scan_in_order=True,
        )
        return scanner.to_table().combine_chunks()  # a chunk per fragment: one
    return scanner.to_table()


def _meta(i: int) -> Any:
    """A fragment's metadata for the examples."""
    return UnitMetadata(i, 1, [UnitFile(f"{i}.lance")], None)
