"""Row keys: the stream position of each row of the batch being transformed (the loader's seed,
the epoch, each row's global sample), set by the worker around a batch's transform in its
thread, read by transforms that draw random numbers per row (``ll.random_map``), so their draws
depend on the sample, never on the worker."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np


@dataclass
class RowKeys:
    """The stream position of each row of the batch being transformed: the loader's seed, the
    epoch and each row's global sample index. Set by the worker around a batch's transform
    (:func:`row_keys`), read by transforms that draw random numbers per row
    (``ll.random_map``), so their draws depend on the sample, never on the worker."""

    seed: int
    epoch: int | np.ndarray  # one epoch for the batch, or each row's (a mix source's rows)
    samples: np.ndarray

    def epochs(self) -> np.ndarray:
        """Each row's epoch."""
        return np.broadcast_to(np.asarray(self.epoch, dtype=np.int64), self.samples.shape)

    def drop(self, rows: list[int]) -> None:
        """Forget the keys of ``rows`` (skipped: they left the batch)."""
        if isinstance(self.epoch, np.ndarray):
            self.epoch = np.delete(self.epoch, rows)
        self.samples = np.delete(self.samples, rows)


_row_keys = threading.local()


@contextlib.contextmanager
def row_keys(seed: int, epoch: int | np.ndarray, samples: np.ndarray) -> Iterator[RowKeys]:
    """Make ``RowKeys(seed, epoch, samples)`` the current batch's keys in this thread."""
    keys = RowKeys(seed, epoch, np.asarray(samples, dtype=np.int64))
    previous = getattr(_row_keys, "current", None)
    _row_keys.current = keys
    try:
        yield keys
    finally:
        _row_keys.current = previous


def current_row_keys(rows: int) -> RowKeys:
    """The keys of the batch being transformed in this thread; outside a loader (a transform
    called by hand), rows ``0 .. rows - 1`` of epoch 0 with seed 0."""
    keys = getattr(_row_keys, "current", None)
    if keys is None:
        return RowKeys(0, 0, np.arange(rows, dtype=np.int64))
    if len(keys.samples) != rows:
        raise ValueError(
            f"this batch has {rows} rows but the loader gave {len(keys.samples)} samples: a "
            "transform before this one changed the number of rows (changes_rows=True), so rows "
            "can no longer be matched to their samples; put random transforms before it"
        )
    return keys


def keys_if_set() -> RowKeys | None:
    """The keys of the batch being transformed in this thread, or ``None`` outside a loader."""
    return getattr(_row_keys, "current", None)
