"""A lost read, built again as one task per batch: what :class:`~lanceloader.engine.actors.
ActorPool` sends to its live actors at once when an actor dies, so the next batch due waits
for one batch's work, not for a whole read queued behind another actor's reads.

A batch is a pure function of its samples (the rows, the epoch, ``random_map``'s keys), so a
read's batches built one by one are the read's batches, byte for byte (reads of 1, 4, 16, ...
batches already ramp up each epoch): :meth:`~lanceloader.ordering.plan.ReadTask.split` makes
the parts, and :func:`merge` puts their results back into the one result the read would have
given, in order.
"""

from __future__ import annotations

from lanceloader.engine.work import TaskResult


def merge(results: list[TaskResult]) -> TaskResult:
    """The results of a read's parts (from :meth:`ReadTask.split <lanceloader.ordering.plan.ReadTask.split>`, in order) as the read's result: the
    batches in order, the costs summed."""
    if len(results) == 1:
        return results[0]
    first = results[0]
    seconds: dict[str, float] = {}
    for result in results:
        for stage, value in result.seconds.items():
            seconds[stage] = seconds.get(stage, 0.0) + value
    return TaskResult(
        batches=[b for r in results for b in r.batches],
        rows=[n for r in results for n in r.rows],
        nbytes=[n for r in results for n in r.nbytes],
        seconds=seconds,
        io_bytes=sum(r.io_bytes for r in results),
        io_iops=sum(r.io_iops for r in results),
        rows_cached=sum(r.rows_cached for r in results),
        rows_skipped=sum(r.rows_skipped for r in results),
        cache_damaged=sum(r.cache_damaged for r in results),
        cache_fills=sum(r.cache_fills for r in results),
        spans=[s for r in results for s in r.spans],
        lane=first.lane,
    )
