"""Plan: which global samples form batch *b* of rank *r*.

An epoch of ``num_samples`` samples, from global sample ``start`` on (a resumed epoch starts
mid-way), is cut into *global batches* of ``batch_size * world_size`` consecutive samples. Rank
``r`` takes the ``r``-th slice of each, so every rank gets the same number of batches (no DDP hang
at the end of an epoch) and the union of all ranks is the epoch, each sample once.

The last global batch may be short. With ``drop_last=True`` it is dropped. Otherwise it is split
as evenly as possible across ranks (sizes differ by at most one); if it holds fewer samples than
there are ranks, it is padded by wrapping around to the start of the epoch so that no rank gets an
empty batch (the same rule as ``torch.utils.data.DistributedSampler``).

Pure functions of their arguments: no I/O, tested exhaustively.

Example::

    >>> plan = Plan(num_samples=10, batch_size=4)
    >>> len(plan), plan.batch_samples(2).tolist()
    (3, [8, 9])
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Plan:
    """The batches of one rank for (the rest of) one epoch.

    >>> [Plan(10, 2, world_size=2, rank=1).batch_samples(b).tolist() for b in range(3)]
    [[2, 3], [6, 7], [9]]
    """

    num_samples: int
    batch_size: int
    world_size: int = 1
    rank: int = 0
    drop_last: bool = False
    start: int = 0

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {self.world_size}")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(
                f"rank must lie in [0, world_size={self.world_size}), got {self.rank}"
            )
        if not 0 <= self.start <= self.num_samples:
            raise ValueError(
                f"start sample must lie in [0, {self.num_samples}], got {self.start}"
            )

    @property
    def global_batch_size(self) -> int:
        return self.batch_size * self.world_size

    def __len__(self) -> int:
        remaining = self.num_samples - self.start
        if self.drop_last:
            return remaining // self.global_batch_size
        return -(-remaining // self.global_batch_size)

    def batch_samples(self, batch: int) -> np.ndarray:
        """Global sample indices (int64, within the epoch's order) of this rank's batch ``batch``."""
        if not 0 <= batch < len(self):
            raise IndexError(f"batch {batch} out of range [0, {len(self)})")
        lo = self.start + batch * self.global_batch_size
        size = min(self.global_batch_size, self.num_samples - lo)
        if size == self.global_batch_size:
            first = lo + self.rank * self.batch_size
            return np.arange(first, first + self.batch_size, dtype=np.int64)
        size = max(size, self.world_size)
        first = lo + self.rank * size // self.world_size
        last = lo + (self.rank + 1) * size // self.world_size
        return np.arange(first, last, dtype=np.int64) % self.num_samples

    def samples_done(self, batches: int) -> int:
        """Global samples consumed by all ranks once each has taken ``batches`` batches."""
        if batches >= len(self):
            return self.num_samples
        return self.start + batches * self.global_batch_size
