"""What a Source settles at construction: the rows its filter and split keep (the plan, shared
through a cache directory), and the Arrow bytes per row its reads are sized by.

Both run once, in the process that builds the :class:`~lanceloader.rows.lance.source.Source`,
where Lance may be used: no process forked later needs to.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import lance
import numpy as np

from lanceloader.rows.cache.disk import DiskCache
from lanceloader.rows.dataset import (
    NOT_READ_FAILURES,
    check_columns,
    clean_message,
    redact_exception,
)
from lanceloader.rows.lance.blobs import payload_bytes_per_row
from lanceloader.rows.lance.splits import split_mask


def select_rows(source: Any, ds: lance.LanceDataset) -> np.ndarray | None:
    """Lance row offsets kept by the source's filter and split, or None when every row is kept;
    sets ``source.plan_origin`` (``"scan"``, or ``"cache"`` when another process's plan was
    found in the cache directory)."""
    if source.splits is None and source.split is not None:
        raise ValueError(f"split={source.split!r} needs splits=, e.g. {{'train': 0.9, 'val': 0.1}}")
    if source.splits is not None and source.split is None:
        raise ValueError(f"splits={source.splits} needs split=, one of {sorted(source.splits)}")
    if source.filter is None and source.splits is None:
        return None
    if source.split_key is not None:
        check_columns([source.split_key], ds.schema, what="split_key")
    if not isinstance(source.cache, DiskCache):
        source.plan_origin = "scan"
        return scan_rows(source, ds)
    rows, made = source.cache.load_or_make(source.cache_key("plan"), lambda: scan_rows(source, ds))
    source.plan_origin = "scan" if made else "cache"
    return rows


def scan_rows(source: Any, ds: lance.LanceDataset) -> np.ndarray:
    """The planning scan: the Lance row offsets of the rows the filter and split keep."""
    scan_columns = ["_rowoffset"] + ([source.split_key] if source.split_key is not None else [])
    try:
        table = ds.to_table(columns=scan_columns, filter=source.filter)
    except Exception as exc:  # Lance raises ValueError/OSError/RuntimeError for bad SQL
        redact_exception(exc, source.storage_options)
        raise ValueError(
            f"filter {source.filter!r} is not a valid Lance SQL predicate for columns "
            f"{ds.schema.names}: {clean_message(exc, source.uri, source.storage_options)}"
        ) from exc
    rows = table.column("_rowoffset").to_numpy().astype(np.int64)
    if source.splits is not None:
        assert source.split is not None
        keys = table.column(source.split_key) if source.split_key is not None else rows
        rows = rows[split_mask(keys, source.splits, source.split)]
    return rows


def bytes_per_row(
    source: Any, fragments: Sequence[Any], starts: np.ndarray, sample_rows: int = 256
) -> tuple[float, int | None]:
    """Arrow bytes per row of the source's columns, estimated from the first rows of the first
    non-empty fragment, taken (a take of 256 rows cost a third to a half of a scan limited to
    them) (0.0 for an empty dataset): what reads are sized by (``engine.py``); and
    that fragment's index (its file's metadata is in the dataset's cache now). A damaged first
    fragment raises :class:`~lanceloader.rows.dataset.ReadError` here."""
    for i, fragment in enumerate(fragments):
        start = int(starts[i])
        rows = min(sample_rows, int(starts[i + 1]) - start)
        if rows == 0:
            continue
        try:
            table = (
                fragment.to_table(columns=source.columns, limit=rows)
                if source.blobs  # a fragment's take fails on blob columns (Lance 14)
                else fragment.take(range(rows), columns=source.columns)
            )
        except NOT_READ_FAILURES:
            raise
        except BaseException as exc:
            raise source.read_error(exc, offsets=np.arange(start, start + rows)) from exc
        if table.num_rows:  # a blob column's payloads counted by their descriptors' size
            return table.nbytes / table.num_rows + payload_bytes_per_row(table, source.blobs), i
    return 0.0, None
