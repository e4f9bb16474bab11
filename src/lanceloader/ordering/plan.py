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

from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property

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
            raise ValueError(f"rank must lie in [0, world_size={self.world_size}), got {self.rank}")
        if not 0 <= self.start <= self.num_samples:
            raise ValueError(f"start sample must lie in [0, {self.num_samples}], got {self.start}")

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

    def samples(self, batches: range) -> tuple[np.ndarray, list[int]]:
        """The global samples of ``batches`` (a range, any step), concatenated, and each batch's
        size: one NumPy operation for the full global batches (each is the first shifted by a
        multiple of the global batch size), :meth:`batch_samples` for a short last one.

        >>> samples, sizes = Plan(10, 2, world_size=2, rank=1).samples(range(0, 3))
        >>> samples.tolist(), sizes
        ([2, 3, 6, 7, 9], [2, 2, 1])
        """
        full = (self.num_samples - self.start) // self.global_batch_size
        n_full = len(range(batches.start, min(batches.stop, full), batches.step))
        if n_full and self.world_size == 1 and batches.step == 1 and batches.stop <= len(self):
            lo = self.start + batches.start * self.batch_size  # consecutive: one arange
            hi = min(self.start + batches.stop * self.batch_size, self.num_samples)
            sizes = [self.batch_size] * n_full
            if hi - lo > n_full * self.batch_size:
                sizes.append(hi - lo - n_full * self.batch_size)
            return np.arange(lo, hi, dtype=np.int64), sizes
        parts: list[np.ndarray] = []
        sizes: list[int] = []
        if n_full:
            shifts = np.arange(n_full, dtype=np.int64) * (batches.step * self.global_batch_size)
            parts.append((self.batch_samples(batches.start)[None, :] + shifts[:, None]).ravel())
            sizes += [self.batch_size] * n_full
        for b in batches[n_full:]:
            parts.append(self.batch_samples(b))
            sizes.append(len(parts[-1]))
        return (np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)), sizes

    def samples_done(self, batches: int) -> int:
        """Global samples consumed by all ranks once each has taken ``batches`` batches."""
        if batches >= len(self):
            return self.num_samples
        return self.start + batches * self.global_batch_size


@dataclass(frozen=True)
class ReadTask:
    """Batches of one epoch that a worker reads with one Lance call: their numbers in the plan,
    and where their samples come from (``plan``: a :class:`Plan`, or :class:`Positions` given).

    The samples (concatenated) and each batch's size are worked out where the task is read, the
    first time a worker asks: the loop that sends a task pays for a few numbers, not for an
    array of its rows' samples, and a task pickled to a process or an actor is ~200 bytes
    whatever the read's size (a read of 262,144 rows carried 2 MB of samples).

    >>> task = ReadTask(0, range(1, 3), Plan(10, 4))
    >>> task.samples.tolist(), task.sizes
    ([4, 5, 6, 7, 8, 9], (4, 2))
    """

    epoch: int
    batches: range
    plan: Plan | Positions

    @cached_property
    def _samples_sizes(self) -> tuple[np.ndarray, tuple[int, ...]]:
        samples, sizes = self.plan.samples(self.batches)
        return samples, tuple(sizes)

    @property
    def samples(self) -> np.ndarray:
        """The batches' global samples, concatenated (int64)."""
        return self._samples_sizes[0]

    @property
    def sizes(self) -> tuple[int, ...]:
        """Each batch's number of samples."""
        return self._samples_sizes[1]

    def split(self) -> list[ReadTask]:
        """Its batches, one task each, in order (each works out its own samples); a task of
        one batch stays whole.

        >>> parts = ReadTask(3, range(1, 3), Plan(10, 4)).split()
        >>> [(p.epoch, p.batches, p.samples.tolist(), p.sizes) for p in parts]
        [(3, range(1, 2), [4, 5, 6, 7], (4,)), (3, range(2, 3), [8, 9], (2,))]
        """
        if len(self.batches) < 2:
            return [self]
        return [ReadTask(self.epoch, range(b, b + 1), self.plan) for b in self.batches]


@dataclass(frozen=True, eq=False)
class Positions:
    """Samples given, as one batch (a map-style read: PyTorch's or Grain's indices), in the
    place of a :class:`Plan` in a :class:`ReadTask`.

    >>> ReadTask(0, range(1), Positions(np.array([7, 3]))).samples.tolist()
    [7, 3]
    """

    positions: np.ndarray

    def samples(self, batches: range) -> tuple[np.ndarray, list[int]]:
        """The positions, as batch 0's samples (the only batch)."""
        if batches != range(1):
            raise ValueError(f"Positions hold one batch (range(1)), not {batches}")
        return self.positions, [len(self.positions)]


# How much larger each read of an epoch's ramp is than the one before (see read_ranges).
RAMP_GROWTH = 4


def read_tasks(
    epoch: int,
    plan: Plan,
    per_read: int,
    batches: range | None = None,
    window_rows: int | None = None,
    ramp: bool = True,
    first_read: int = 1,
) -> Iterator[ReadTask]:
    """Tasks over ``batches`` (default: all of the plan; any step) of 1, 4, 16, ... batches, up
    to ``per_read`` (a fast first batch, then big reads; with ``ramp=False`` all of
    ``per_read`` from the first; ``first_read``: the ramp begins at that many batches), cut on
    the boundaries of an order's windows of ``window_rows`` samples (``Order.window_rows``)
    where they fall on batches.

    >>> [t.batches for t in read_tasks(0, Plan(100, 10), per_read=4)]
    [range(0, 1), range(1, 5), range(5, 9), range(9, 10)]
    >>> [t.batches for t in read_tasks(0, Plan(100, 10), per_read=4, ramp=False)]
    [range(0, 4), range(4, 8), range(8, 10)]
    """
    align = window_alignment(plan, window_rows)
    for chosen in read_ranges(
        range(len(plan)) if batches is None else batches, per_read, align, ramp, first_read
    ):
        yield ReadTask(epoch, chosen, plan)


def read_ranges(
    batches: range,
    per_read: int,
    align: tuple[int, int] | None = None,
    ramp: bool = True,
    first_read: int = 1,
) -> Iterator[range]:
    """The batch numbers of each read over ``batches``: 1, 4, 16, ... of them, up to
    ``per_read`` (``ramp=False``: ``per_read`` from the first).

    The ramp grows :data:`RAMP_GROWTH` times a read: the first batch comes from a read of one,
    and the few reads before full size each pay a Lance call's fixed cost (~0.75 ms CPU, the
    cost of ~8,000 rows of 264 B) on few rows. Doubling made 8 reads before full size (65,536
    rows of 256-row batches); growing 4x makes 4, each as quick to arrive (a call of up to
    4,096 rows costs about its fixed cost), and fewer Lance calls an epoch
    (docs/performance.md, "The read ramp").

    ``first_read``: the ramp's first read, in batches (then 4x, 16x, ... that). A read that
    makes ``n`` Lance calls underneath (a mix of ``n`` sources, ``MixedSource.read_parts``)
    ramps from ``n``, so each call ramps as one source's would (1, 4, 16, ... batches): ramped
    from 1, a mix of 3 began with calls of a third of a batch, each at a Lance call's fixed
    cost.

    With ``align=(first, every)`` (see :func:`window_alignment`), a read that would end past a
    batch number ``first + k * every`` ends at the last such number instead: reads then start
    and end on a block shuffle's window boundaries and fetch whole blocks. Only windows that fit
    in a read (``every <= per_read``) are aligned to: reads of part of a larger window never
    fetch whole blocks, and cutting them on its boundary would only add a short read per
    window (docs/performance.md, "The mix's reads").
    Ranges with a step other than 1 are not aligned.

    >>> list(read_ranges(range(30), per_read=16))
    [range(0, 1), range(1, 5), range(5, 21), range(21, 30)]
    >>> list(read_ranges(range(10), per_read=4, align=(0, 4)))
    [range(0, 1), range(1, 4), range(4, 8), range(8, 10)]
    >>> list(read_ranges(range(10), per_read=3, align=(0, 4)))  # windows larger than a read
    [range(0, 1), range(1, 4), range(4, 7), range(7, 10)]
    >>> list(read_ranges(range(10), per_read=4, ramp=False))
    [range(0, 4), range(4, 8), range(8, 10)]
    >>> list(read_ranges(range(20), per_read=12, first_read=3))
    [range(0, 3), range(3, 15), range(15, 20)]
    """
    first, size = 0, max(1, min(first_read, per_read)) if ramp else per_read
    while first < len(batches):
        end = first + size
        if align is not None and batches.step == 1 and align[1] <= per_read:
            boundary, every = align[0] - batches.start, align[1]
            last = boundary + (end - boundary) // every * every  # the last boundary <= end
            if first < last < end:
                end = last
        chosen = batches[first:end]
        yield chosen
        first, size = first + len(chosen), min(RAMP_GROWTH * size, per_read)


def window_alignment(plan: Plan, window_rows: int | None) -> tuple[int, int] | None:
    """``(first, every)``: the batch numbers of ``plan`` at which an order's windows of
    ``window_rows`` samples begin are ``first + k * every``; ``None`` when there are no windows
    or they do not begin on batch boundaries.

    >>> window_alignment(Plan(100_000, 256), window_rows=8192), window_alignment(Plan(10, 3), 8)
    ((0, 32), None)
    """
    if window_rows is None or window_rows % plan.global_batch_size:
        return None
    first = -plan.start % window_rows
    if first % plan.global_batch_size:
        return None
    return first // plan.global_batch_size, window_rows // plan.global_batch_size
