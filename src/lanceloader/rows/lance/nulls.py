"""The construction-time null scan of Lance rows: nulls a conversion cannot hold, found before
any worker starts where a scan is cheap (a local dataset, a few fixed-width columns)."""

from __future__ import annotations

import logging
from typing import Any, Protocol

import lance
import numpy as np

from lanceloader.batch.checks import null_checked_columns, nulls_error
from lanceloader.batch.nulls import is_blob_file
from lanceloader.lifecycle import forksafe
from lanceloader.rows.store import is_object_store

# The scan reads at most this many bytes of a local dataset's columns (1M rows of three 4-8 byte
# columns, 20 MB: 10 ms); beyond, or on object storage, nulls are found in the batch that holds
# them, whose error names the batch and the row.
NULL_SCAN_BYTES = 128 << 20
# ... and of at most this many fragments: a scan opens every data file (0.15-0.25 ms each, 2 busy
# cores), so 2,000 appended fragments of 500 rows cost 330 ms where the same rows in 4 fragments
# cost 15 ms (benchmarks/fragments.py). 64 fragments: at most ~15 ms of opening.
NULL_SCAN_FRAGMENTS = 64
_logger = logging.getLogger("lanceloader")


class _Scanned(Protocol):
    """What the scan asks of Lance rows (``Source`` has it)."""

    filter: str | None
    splits: dict[str, float] | None

    @property
    def uri(self) -> str: ...

    @property
    def num_rows(self) -> int: ...

    @property
    def dataset(self) -> lance.LanceDataset: ...

    def fragment_positions(self) -> np.ndarray: ...

    def schema_table(self) -> Any: ...

    def row_offsets(self, positions: np.ndarray) -> np.ndarray: ...

    def describe_offsets(self, offsets: np.ndarray, limit: int = 4) -> str: ...


def check_nulls(source: _Scanned, conversion: Any) -> None:
    """Refuse nulls that ``conversion`` cannot hold in the rows of ``source``, in the
    fixed-width columns of :func:`~lanceloader.batch.checks.null_checked_columns`, at most
    :data:`NULL_SCAN_BYTES` of them in at most :data:`NULL_SCAN_FRAGMENTS` fragments; otherwise
    the batch that holds a null raises, naming the batch and the row. One Lance scan with the
    source's filter; a split keeps the nulls of its own rows."""
    if is_object_store(source.uri) or forksafe.tainted():
        return  # a tainted process reads through a clean reader only: no scans here
    if len(source.fragment_positions()) - 1 > NULL_SCAN_FRAGMENTS:
        return  # opening every file would cost more than the rest of the construction
    rows_schema = source.schema_table().schema  # the columns as read (a blob: not Lance's struct)
    columns = null_checked_columns(rows_schema, conversion)
    ds = source.dataset
    if not columns or ds.count_rows() * sum(columns.values()) > NULL_SCAN_BYTES:
        return
    nulls = " OR ".join(f"`{name}` IS NULL" for name in columns)
    try:
        table = ds.to_table(
            columns=["_rowoffset", *columns],
            filter=nulls if source.filter is None else f"({source.filter}) AND ({nulls})",
        )
    except Exception as exc:  # an unusual name or type: the batches still check
        _logger.debug("lanceloader: no construction-time null scan of %r: %s", source.uri, exc)
        return
    finally:
        ds.io_stats_incremental()  # this scan's I/O is not the first read's (stats())
    offsets = table.column("_rowoffset").to_numpy().astype(np.int64)
    if source.splits is not None and len(offsets):
        kept = np.isin(offsets, source.row_offsets(np.arange(source.num_rows)))
        table, offsets = table.filter(kept), offsets[kept]
    for name in columns:
        null = table.column(name).is_null().to_numpy(zero_copy_only=False)
        if null.any():
            first = offsets[null][:1]
            field = rows_schema.field(name)
            raise nulls_error(
                name,
                field.type,
                int(null.sum()),
                source.num_rows,
                f"Lance row {int(first[0])}, {source.describe_offsets(first)}",
                source.filter,
                is_blob_file(field),
            )
