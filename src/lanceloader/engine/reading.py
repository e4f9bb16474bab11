"""How a stream reads (:class:`Reading`), and where its reads start: :func:`start_pool` (the
workers a stream's tasks run on) and :func:`open_results` (a stream's read tasks on that pool,
in order, a bounded number in flight). A :class:`~lanceloader.engine.stream.Stream` opens its
reads here, and so does a read sent ahead across an epoch's end
(:mod:`lanceloader.engine.ahead`).

Example::

    >>> import tempfile
    >>> from lanceloader.demo import write_demo_dataset
    >>> from lanceloader.ordering.order import Order
    >>> from lanceloader.ordering.plan import Plan
    >>> from lanceloader.rows.lance.source import Source
    >>> from lanceloader.engine.work import BatchWork
    >>> source = Source(write_demo_dataset(tempfile.mkdtemp() + "/d.lance", rows=10), ["id"])
    >>> reading = Reading(BatchWork(source, Order(10), None, "numpy"), 2, 2, 2)
    >>> results = open_results(reading, 0, Plan(10, 4), range(3), False, None, depth=2)
    >>> [len(r.batches) for r in results]
    [1, 2]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from lanceloader.batch.output import Conversion
from lanceloader.engine.pool import KeptPool, Ordered, Pool
from lanceloader.engine.processes import ProcessPool
from lanceloader.engine.tasks import stream_tasks
from lanceloader.engine.threads import ThreadPool
from lanceloader.engine.work import BatchWork, ForTransport, TaskResult
from lanceloader.ordering.plan import Plan

# Seconds without a batch before StallError. Healthy reads take milliseconds to seconds, and
# Lance's object-store requests give up well before this (source.OBJECT_STORE_TIMEOUTS), so it
# only fires for a stuck worker: a transform waiting forever, a stopped process.
DEFAULT_STALL_TIMEOUT = 300.0


@dataclass(frozen=True)
class Reading:
    """How a stream reads: the work of one task, the pool, and how much is in flight.

    ``finish`` converts in the consumer what a process worker returned as NumPy; ``placement``
    copies batches to pinned memory or a device, in the consumer. ``stall_timeout``: see
    :class:`~lanceloader.engine.stalls.StallError`.
    """

    work: BatchWork
    num_workers: int
    batches_per_read: int
    reads_in_flight: int
    worker_type: str = "thread"
    finish: Conversion | None = None
    placement: Callable[[Any], Any] | None = None
    stall_timeout: float | None = DEFAULT_STALL_TIMEOUT
    ray_options: Mapping[str, Any] | None = None  # worker_type="ray": each actor's options
    governor: Any = None  # the loader's CPU budget and tuner (engine/budget.py), or None


def start_pool(reading: Reading, work: BatchWork, kept: KeptPool | None) -> Pool[TaskResult]:
    """The pool a stream's tasks run on: threads of its own, the loader's process pool
    (``kept``: lent to the stream, kept after it), or processes of its own; or Ray actors
    (:mod:`lanceloader.engine.actors`, which imports Ray: imported here, when asked for)."""
    if reading.worker_type == "ray":
        from lanceloader.engine.actors import actor_pool

        n, options = reading.num_workers, reading.ray_options
        return actor_pool(work, n, reading.stall_timeout, options, kept)
    if reading.worker_type != "process":
        return ThreadPool(work, reading.num_workers, reading.stall_timeout)
    if kept is None:
        return ProcessPool(ForTransport(work), reading.num_workers, reading.stall_timeout)
    pool = kept.pool_for(ForTransport(work), reading.num_workers)
    pool.stall_timeout = reading.stall_timeout  # the consumer's wait: no worker holds it
    return pool


def open_results(
    reading: Reading,
    epoch: int,
    plan: Plan,
    batches: range,
    tracing: bool,
    kept: KeptPool | None,
    depth: int,
) -> Ordered[TaskResult]:
    """The results of a stream's read tasks, in order, from a pool started for ``reading``
    (``kept``: the loader's process pool, lent), at most ``depth`` reads in flight; ``tracing``:
    the workers time their spans for the trace."""
    work = dataclasses.replace(reading.work, trace=True) if tracing else reading.work
    tasks = stream_tasks(work, epoch, plan, reading.batches_per_read, batches)
    pool: Pool[TaskResult] = start_pool(reading, work, kept)
    return Ordered(pool, tasks, depth, kept is not None, reading.governor)
