"""Source: the rows that exist, pinned to one version of one Lance dataset.

A :class:`Source` is a Lance dataset at one version, a column projection, an optional SQL filter
and an optional named split. It knows ``num_rows`` after the filter and split, maps a *position*
in ``[0, num_rows)`` to a Lance row offset, and reads any list of positions as one Arrow
``RecordBatch`` in exactly that order.

Reads coalesce: the requested rows are sorted and deduplicated, contiguous runs become range reads
of one fragment (Lance's fastest path, measured in ``benchmarks/``), the scattered rest becomes
one ``take``, and the result is put back into the requested order with one Arrow ``take``.

Fork-safety: a ``Source`` pickles as plain parameters (URI, version, storage options, columns and
the computed row list) and opens Lance lazily, once per process (keyed by PID). It never carries a
live Lance handle into a child process.

Example::

    >>> src = Source(uri, columns=["id"], filter="id % 2 = 0")      # doctest: +SKIP
    >>> src.read(np.array([2, 0])).to_pydict()                       # doctest: +SKIP
    {'id': [4, 0]}
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

import lance
import numpy as np
import pyarrow as pa

from lanceloader import forksafe
from lanceloader.splits import split_mask

# Runs of at least this many contiguous rows are read as fragment ranges; shorter runs join one
# `take`, which beats many small range reads (measured: 1024-row blocks 3.0M vs 1.5M rows/s).
MIN_RANGE_ROWS = 4096


class Source:
    """One Lance dataset, pinned to one version, with columns, filter and split applied once.

    Args:
        dataset: a URI (local path or object store) or an open ``lance.LanceDataset``.
        columns: columns to read; ``None`` reads all.
        filter: SQL predicate, evaluated once at construction against the pinned version.
        version: version number or tag to pin; default: the latest.
        storage_options: passed to ``lance.dataset`` (credentials, endpoints).
        splits: ``{"name": fraction}``; with ``split``, keeps only that split's rows.
        split: the split to keep.
        split_key: column whose value decides a row's split; default: the row's offset in the
            pinned version (stable while the dataset is only appended to).
    """

    def __init__(
        self,
        dataset: str | os.PathLike[str] | lance.LanceDataset,
        columns: list[str] | None = None,
        filter: str | None = None,
        version: int | str | None = None,
        storage_options: dict[str, str] | None = None,
        splits: dict[str, float] | None = None,
        split: str | None = None,
        split_key: str | None = None,
    ) -> None:
        self.storage_options = dict(storage_options) if storage_options else None
        ds = _open(dataset, version, self.storage_options)
        self.uri: str = ds.uri
        self.version: int = ds.version
        self.schema: pa.Schema = ds.schema
        self.columns: list[str] = _check_columns(columns, ds.schema)
        self.filter = filter
        self.splits = dict(splits) if splits else None
        self.split = split
        self.split_key = split_key
        self._pid = os.getpid()
        self._ds = ds
        self._reader: forksafe.CleanReader | None = None
        self._reader_pid = 0
        self._fragments = ds.get_fragments()
        self.identity: str = dataset_identity(ds.schema, self._fragments)
        self._fragment_starts = np.cumsum(
            [0] + [f.count_rows() for f in self._fragments], dtype=np.int64
        )
        self._rows: np.ndarray | None = self._select_rows(ds)
        self.bytes_per_row: float = _bytes_per_row(self._fragments, self.columns)

    # --- construction -------------------------------------------------------------------

    def _select_rows(self, ds: lance.LanceDataset) -> np.ndarray | None:
        """Lance row offsets kept by filter and split, or None when every row is kept."""
        if self.splits is None and self.split is not None:
            raise ValueError(f"split={self.split!r} needs splits=, e.g. {{'train': 0.9, 'val': 0.1}}")
        if self.splits is not None and self.split is None:
            raise ValueError(f"splits={self.splits} needs split=, one of {sorted(self.splits)}")
        if self.filter is None and self.splits is None:
            return None
        scan_columns = ["_rowoffset"]
        if self.split_key is not None:
            _check_columns([self.split_key], ds.schema, what="split_key")
            scan_columns.append(self.split_key)
        try:
            table = ds.to_table(columns=scan_columns, filter=self.filter)
        except Exception as exc:  # Lance raises ValueError/OSError/RuntimeError for bad SQL
            raise ValueError(
                f"filter {self.filter!r} is not a valid Lance SQL predicate for columns "
                f"{ds.schema.names}: {exc}"
            ) from exc
        rows = table.column("_rowoffset").to_numpy().astype(np.int64)
        if self.splits is not None:
            assert self.split is not None
            keys = table.column(self.split_key) if self.split_key is not None else rows
            rows = rows[split_mask(keys, self.splits, self.split)]
        return rows

    # --- pickling and per-process reopening ---------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_ds"] = None
        state["_fragments"] = None
        state["_reader"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    @property
    def dataset(self) -> lance.LanceDataset:
        """The pinned dataset, opened in this process (reopened after fork, spawn or unpickling)."""
        if forksafe.tainted():
            raise RuntimeError(
                f"process {os.getpid()} was forked from a process that had already used Lance; "
                "Lance would hang or crash here. Read rows with Source.read()/read_table() (they "
                "go through a clean helper process), or start this process with 'forkserver' or "
                "'spawn'"
            )
        if self._ds is None or self._pid != os.getpid():
            self._ds = lance.dataset(
                self.uri, version=self.version, storage_options=self.storage_options
            )
            self._fragments = self._ds.get_fragments()
            self._pid = os.getpid()
        return self._ds

    # --- reading ------------------------------------------------------------------------

    @property
    def num_rows(self) -> int:
        """Rows after filter and split: positions are ``[0, num_rows)``."""
        if self._rows is None:
            return int(self._fragment_starts[-1])
        return len(self._rows)

    def row_offsets(self, positions: np.ndarray) -> np.ndarray:
        """Lance row offsets (in the pinned version) of the given positions."""
        positions = np.asarray(positions, dtype=np.int64)
        return positions if self._rows is None else self._rows[positions]

    def read(self, positions: np.ndarray) -> pa.RecordBatch:
        """Rows at ``positions``, in that order (duplicates allowed), as one RecordBatch."""
        return to_record_batch(self.read_table(positions))

    def read_table(self, positions: np.ndarray) -> pa.Table:
        """Like :meth:`read`, as a Table whose chunks are Lance's (no copy to merge them)."""
        return self.read_table_with_io(positions)[0]

    def read_table_with_io(self, positions: np.ndarray) -> tuple[pa.Table, int, int]:
        """:meth:`read_table`, plus the bytes and IOPS Lance spent on it (since its last read).

        In a process forked after Lance ran (see ``forksafe.py``), a clean helper process reads.
        """
        if forksafe.tainted():
            if self._reader is None or self._reader_pid != os.getpid():
                self._reader, self._reader_pid = forksafe.CleanReader(self), os.getpid()
            return self._reader.read_table(positions)
        table = self._read_local(positions)
        io = self.dataset.io_stats_incremental()
        return table, io.read_bytes, io.read_iops

    def _read_local(self, positions: np.ndarray) -> pa.Table:
        offsets = self.row_offsets(positions)
        unique, inverse = np.unique(offsets, return_inverse=True)
        table, order = self._read_sorted(unique)
        if not (_is_identity(order) and _is_identity(inverse)):
            where = np.empty_like(order)
            where[order] = np.arange(len(order))
            table = table.take(pa.array(where[inverse]))
        return table.select(self.columns)

    def _read_sorted(self, offsets: np.ndarray) -> tuple[pa.Table, np.ndarray]:
        """Read sorted unique offsets; returns the rows and, per row, its index in ``offsets``."""
        ds = self.dataset
        fragment_of = np.searchsorted(self._fragment_starts, offsets, side="right") - 1
        breaks = np.flatnonzero((np.diff(offsets) != 1) | (np.diff(fragment_of) != 0)) + 1
        starts = np.concatenate(([0], breaks))
        stops = np.concatenate((breaks, [len(offsets)]))
        pieces: list[pa.Table] = []
        order: list[np.ndarray] = []
        scattered: list[np.ndarray] = []
        for lo, hi in zip(starts.tolist(), stops.tolist(), strict=True):
            if hi - lo < MIN_RANGE_ROWS:
                scattered.append(np.arange(lo, hi))
                continue
            frag = int(fragment_of[lo])
            local = int(offsets[lo] - self._fragment_starts[frag])
            pieces.append(
                self._fragments[frag].to_table(columns=self.columns, offset=local, limit=hi - lo)
            )
            order.append(np.arange(lo, hi))
        if scattered:
            idx = np.concatenate(scattered)
            pieces.append(ds.take(offsets[idx], columns=self.columns))
            order.append(idx)
        if not pieces:
            return self.schema_table().slice(0, 0), np.zeros(0, dtype=np.int64)
        return pa.concat_tables(pieces), np.concatenate(order)

    def schema_table(self) -> pa.Table:
        """An empty table with the projected schema."""
        return pa.table({c: pa.array([], type=self.schema.field(c).type) for c in self.columns})

    def __repr__(self) -> str:
        return (
            f"Source({self.uri!r}, version={self.version}, rows={self.num_rows}, "
            f"columns={self.columns}, filter={self.filter!r}, split={self.split!r})"
        )


def _bytes_per_row(fragments: list[Any], columns: list[str], sample_rows: int = 256) -> float:
    """Arrow bytes per row of ``columns``, estimated from the first rows of the first non-empty
    fragment (0.0 for an empty dataset): what reads are sized by (``engine.py``). Taken at
    construction, where Lance may be used, so that no process forked later needs to."""
    for fragment in fragments:
        table = fragment.to_table(columns=columns, limit=sample_rows)
        if table.num_rows:
            return table.nbytes / table.num_rows
    return 0.0


def dataset_identity(schema: pa.Schema, fragments: list[Any]) -> str:
    """A short hash that names the data of one dataset version wherever it is stored.

    Made of each fragment's id, row count, data file names and deletion file, and the schema.
    Lance gives every file it writes a unique name and never rewrites one, so the identity
    survives copying or moving the dataset (another path, another bucket) and differs for a
    dataset re-created or overwritten at the same URI, even with the same version number and row
    count. It costs one pass over the manifest's fragment list, no I/O.
    """
    parts: list[Any] = [schema.to_string(show_schema_metadata=False)]
    for fragment in fragments:
        meta = fragment.metadata
        deletion = meta.deletion_file
        parts.append([meta.id, meta.physical_rows, [f.path for f in meta.files],
                      None if deletion is None else [deletion.id, deletion.num_deleted_rows]])
    blob = json.dumps(parts, separators=(",", ":"), default=str).encode()
    return hashlib.blake2b(blob, digest_size=8).hexdigest()


def _open(
    dataset: str | os.PathLike[str] | lance.LanceDataset,
    version: int | str | None,
    storage_options: dict[str, str] | None,
) -> lance.LanceDataset:
    if forksafe.tainted():
        raise RuntimeError(
            f"process {os.getpid()} was forked from a process that had already used Lance, "
            "where opening a dataset would hang or crash; build the Source/Loader before "
            "forking (it pickles as plain parameters), or start this process with "
            "'forkserver' or 'spawn'"
        )
    forksafe.note_lance_used()
    if isinstance(dataset, lance.LanceDataset):
        if version is None or version == dataset.version:
            return dataset
        dataset = dataset.uri
    if not isinstance(dataset, (str, os.PathLike)):
        raise TypeError(
            f"dataset must be a URI string, a path or a lance.LanceDataset, got {type(dataset).__name__}"
        )
    uri = os.fspath(dataset)
    try:
        ds = lance.dataset(uri, storage_options=storage_options)
    except Exception as exc:
        raise FileNotFoundError(
            f"no Lance dataset at {uri!r} ({exc}); check the path, or write one with "
            f"lance.write_dataset(table, {uri!r})"
        ) from exc
    if version is None:
        return ds
    try:
        return ds.checkout_version(version)
    except Exception as exc:
        known = [v["version"] for v in ds.versions()]
        raise ValueError(
            f"dataset {uri!r} has no version {version!r}; available versions: {known} "
            f"(and tags {sorted(ds.tags.list())})"
        ) from exc


def _check_columns(columns: list[str] | None, schema: pa.Schema, what: str = "columns") -> list[str]:
    if columns is None:
        return list(schema.names)
    if isinstance(columns, str):
        raise TypeError(f"{what} must be a list of names, got the string {columns!r}; use [{columns!r}]")
    columns = list(columns)
    missing = [c for c in columns if c not in schema.names]
    if missing:
        raise ValueError(
            f"unknown {what} {missing} in the dataset; available columns: {schema.names}"
        )
    if not columns:
        raise ValueError(f"{what} is empty; name at least one of {schema.names}, or pass None for all")
    return columns


def _is_identity(order: np.ndarray) -> bool:
    return bool(len(order) == 0 or (order[0] == 0 and np.all(np.diff(order) == 1)))


def to_record_batch(table: pa.Table) -> pa.RecordBatch:
    """A table as one RecordBatch; copies only when it has several chunks."""
    batches = table.to_batches()
    if len(batches) == 1:
        return batches[0]
    if not batches:
        return pa.RecordBatch.from_pylist([], schema=table.schema)
    return table.combine_chunks().to_batches()[0]
