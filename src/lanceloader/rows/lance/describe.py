"""Where Lance rows lie, said for people: the fragments and rows of a failed read, the damaged
fragment among those a read touched, and why an epoch is empty."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from lanceloader.rows.dataset import NOT_READ_FAILURES, ReadError, clean_message, redact_exception
from lanceloader.rows.protocol import StorageIO
from lanceloader.rows.store import is_object_store, object_store_hint

_logger = logging.getLogger("lanceloader")


def describe_offsets(
    offsets: np.ndarray, index: np.ndarray, starts: np.ndarray, ids: list[int], limit: int = 4
) -> str:
    """Sorted Lance row ``offsets`` (``index``: each one's fragment in the version's list,
    ``starts``: each fragment's first offset, ``ids``: their ids) as
    ``'fragment 3 rows 0-511'``, at most ``limit`` fragments named.

    >>> describe_offsets(np.array([0, 1, 7]), np.array([0, 0, 1]), np.array([0, 5]), [4, 9])
    'fragment 4 rows 0-1, fragment 9 row 2'
    """
    if not len(offsets):
        return "no rows"
    parts = []
    for i in np.unique(index)[:limit].tolist():
        local = offsets[index == i] - starts[i]
        rows = (
            f"row {local[0]}"
            if len(local) == 1
            else f"rows {local[0]}-{local[-1]}"
            + (f" ({len(local)} of them)" if local[-1] - local[0] + 1 != len(local) else "")
        )
        parts.append(f"fragment {ids[i]} {rows}")
    more = len(np.unique(index)) - limit
    return ", ".join(parts) + (f" and {more} more fragments" if more > 0 else "")


def read_error(
    source: Any,
    exc: BaseException,
    offsets: np.ndarray,
    fragment_of: np.ndarray,
    fragment_ids: list[int],
) -> ReadError:
    """The :class:`~lanceloader.rows.dataset.ReadError` for ``exc``, raised while reading Lance
    row ``offsets`` (in fragments ``fragment_of`` of ``fragment_ids``) of ``source``: the URI, version, fragment ids,
    the rows' range and where they lie, the error's message without secrets."""
    redact_exception(exc, source.storage_options)
    first, last = (int(offsets.min()), int(offsets.max())) if len(offsets) else (0, 0)
    ids = tuple(fragment_ids[i] for i in np.unique(fragment_of).tolist())
    detail = clean_message(exc, source.uri, source.storage_options)
    hint = object_store_hint(detail, source.uri, source.storage_options)
    detail = f"{detail} ({type(exc).__name__})" + (f"; likely cause: {hint}" if hint else "")
    return ReadError(
        detail,
        source.uri,
        source.version,
        ids,
        (first, last, len(offsets)),
        source.describe_offsets(offsets),
        None,
        None,
    )


def damaged_fragment(
    source: Any, offsets: np.ndarray, fragment_of: np.ndarray
) -> tuple[Exception, np.ndarray] | None:
    """After a failed read of a local dataset across several fragments: the first fragment
    whose share of the read (Lance ``offsets`` in fragments ``fragment_of``) fails again on its
    own (its error and its offsets), so the error names the damaged file, not every fragment the
    read touched; None when each share reads (a passing fault) or on an object store (each retry
    could wait out the store's timeouts). Costs nothing unless a read failed."""
    if is_object_store(source.uri):
        return None
    fragments = np.unique(fragment_of)
    if len(fragments) < 2:
        return None
    for index in fragments.tolist():
        share = offsets[fragment_of == index]
        try:
            source.read_offsets(share, StorageIO())
        except NOT_READ_FAILURES:
            raise
        except Exception as exc:
            return exc, share
    return None


def warn_empty(source: Any, total: int) -> None:
    """An empty epoch is legal (a filter for a class not yet in the data), but rarely meant: say
    why (``total``: the version's rows)."""
    if total == 0:
        why = "the dataset has no rows"
    elif source.filter is not None and source.split is None:
        why = f"filter {source.filter!r} matches none of its {total} rows"
    else:
        why = f"filter {source.filter!r} and split {source.split!r} keep none of its {total} rows"
    _logger.warning(
        "Lance dataset %r (version %d): %s, so every epoch is empty (0 batches)",
        source.uri,
        source.version,
        why,
    )
