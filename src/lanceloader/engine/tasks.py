"""The read tasks of a stream: which batches each Lance read fetches.

:func:`stream_tasks` is what a :class:`~lanceloader.engine.stream.Stream` runs: the plan's
:func:`~lanceloader.ordering.plan.read_tasks` (1, 4, 16, ... batches up to a read's size, cut on
a block shuffle's windows), except on object storage, where reads start at full size and a
sequential read of a Lance source is cut at the batch that holds a fragment's first row. Pure
functions of the plan and the fragments' first positions: nothing is read here, and the tasks
never change which rows a batch holds, only how batches are grouped into reads.

Example::

    >>> import numpy as np
    >>> from lanceloader.ordering.plan import Plan
    >>> plan = Plan(num_samples=1000, batch_size=100)
    >>> cuts = fragment_batches(plan, np.array([0, 300, 450, 1000]))  # 450: after 150 rows
    >>> cuts.tolist(), list(fragment_read_ranges(range(len(plan)), 4, cuts))
    ([3], [range(0, 3), range(3, 7), range(7, 10)])
    >>> fragment_batches(plan, np.array([0, 850, 1000])).tolist()  # batch 8 holds row 850
    [8]
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np

from lanceloader.engine.work import BatchWork
from lanceloader.ordering.order import Order
from lanceloader.ordering.plan import Plan, ReadTask, read_tasks
from lanceloader.rows.lance.fragment_tails import SLIVER_FRACTION
from lanceloader.rows.protocol import RowSource
from lanceloader.rows.store import is_object_store


def stream_tasks(
    work: BatchWork, epoch: int, plan: Plan, per_read: int, batches: range
) -> Iterator[ReadTask]:
    """The read tasks of a stream over ``batches``: :func:`~lanceloader.ordering.plan.read_tasks`
    (1, 4, 16, ... batches up to ``per_read``, cut on a block shuffle's windows; a read of
    ``read_parts`` Lance calls, a mix's, ramps from ``read_parts`` batches), except on
    object storage, where every read costs the store's latency whatever its size: there reads
    start at full size, and a sequential read of a Lance source is cut at the batch that holds
    each fragment's first row (:func:`fragment_batches`, :func:`fragment_read_ranges`), so each
    read asks one data file for one range per column group (the few rows of a fragment's end
    that the batch at a cut holds come from the read before it:
    :mod:`lanceloader.rows.lance.fragment_tails`; through a cache, from the piece that read fills).
    An epoch then makes fewer requests than Lance's own scan (docs/performance.md, "Reads on an
    object store").
    """
    hints = work.source.hints
    if batches.step != 1 or not store_ranges(work.source, work.order):
        # Ramping up from one batch pays the store's latency per small read, so reads there are
        # at full size from the first (docs/performance.md, "Reads on an object store"). A read
        # of several Lance calls (a mix: one per source) ramps from that many batches, so each
        # call ramps as on its source's own Loader.
        yield from read_tasks(
            epoch,
            plan,
            per_read,
            batches,
            window_rows=work.order.window_rows or hints.window_rows,
            ramp=not is_object_store(work.source.dataset_name.uri),
            first_read=hints.read_parts,
        )
        return
    assert hints.fragment_starts is not None  # store_ranges
    first_batches = fragment_batches(plan, hints.fragment_starts)
    for chosen in fragment_read_ranges(batches, per_read, first_batches):
        yield ReadTask(epoch, chosen, plan)


def store_ranges(source: RowSource, order: Order) -> bool:
    """Whether a stream's reads are sequential ranges of data files on an object store (with or
    without a cache; the rows' ``hints.fragment_starts`` say where each file begins):
    :func:`stream_tasks` cuts them at fragments, and
    :func:`~lanceloader.engine.sizing.batches_per_read` sizes them up to ``READ_BYTES_MOST``.
    """
    return source.hints.fragment_starts is not None and not order.shuffle


def fragment_batches(plan: Plan, starts: np.ndarray) -> np.ndarray:
    """The batches of ``plan`` (a sequential order: sample = position) at which reads are cut so
    each reads one data file: the batch that holds a fragment's first row (``starts``,
    positions, then the number of rows). Where that batch begins a few rows before the
    fragment, those rows are a *sliver* of the fragment before, which the read before the cut
    fetches along and hands over (:mod:`lanceloader.rows.lance.fragment_tails`), so no read asks a
    file for them alone. Only a fragment of at least a batch per :data:`SLIVER_FRACTION
    <lanceloader.rows.lance.fragment_tails.SLIVER_FRACTION>` leaves slivers: after a smaller one the
    next start is cut only where it begins a batch exactly (else reads would shrink to the
    fragments' size, each a store round trip).

    >>> fragment_batches(Plan(1000, 100, start=50), np.array([0, 250, 450, 1000])).tolist()
    [2, 4]
    >>> fragment_batches(Plan(4000, 100), np.array([0, 850, 1950, 4000])).tolist()
    [8, 19]
    """
    starts = np.asarray(starts, dtype=np.int64)
    offsets = starts[1:-1] - plan.start
    before = np.diff(starts)[:-1]  # the rows of the fragment each start ends
    keep = (offsets > 0) & (
        (offsets % plan.global_batch_size == 0)
        | (before * SLIVER_FRACTION >= plan.global_batch_size)
    )
    return np.unique(np.minimum(offsets[keep] // plan.global_batch_size, len(plan)))


def fragment_read_ranges(batches: range, per_read: int, boundaries: np.ndarray) -> Iterator[range]:
    """The batch numbers of each read over ``batches`` (step 1) such that no read crosses a
    batch number in ``boundaries`` (sorted: where fragments begin); the batches between two
    boundaries are split into the fewest reads of at most ``per_read`` batches, of sizes that
    differ by at most one (two reads of 98 batches, not 120 and 76: alike in time and memory).

    >>> list(fragment_read_ranges(range(10), 4, np.array([0, 3, 10])))
    [range(0, 3), range(3, 7), range(7, 10)]
    >>> list(fragment_read_ranges(range(2, 9), 4, np.array([0, 3, 10])))
    [range(2, 3), range(3, 6), range(6, 9)]
    """
    if per_read < 1:
        raise ValueError(f"per_read must be >= 1 batch, got {per_read}")
    inner = [int(b) for b in boundaries if batches.start < b < batches.stop]
    edges = [batches.start, *sorted(set(inner)), batches.stop]
    for lo, hi in itertools.pairwise(edges):
        count = -(-(hi - lo) // per_read)
        if count == 0:
            continue
        base, extra = divmod(hi - lo, count)
        for i in range(count):
            size = base + (i < extra)
            yield range(lo, lo + size)
            lo += size
