"""Sizing: how much one read holds and how many workers and reads are in flight by default,
as pure functions of the rows (their bytes, whether reads are random, a transform, a mix's
parts) and the machine's cores. The engine (:mod:`lanceloader.engine.stream`) runs what these
decide; the ``Loader``'s pipeline and ``MapDataset``'s read-ahead ask them.

A read holds up to 65,536 rows (16,384 for random takes) and :data:`READ_BYTES` of Arrow data
per Lance call, or :data:`READ_ROWS_LEAST` rows of big rows within :data:`READ_BYTES_MOST`
(and sequential reads on an object store up to :data:`READ_BYTES_MOST`, a shuffle's gathers
from a cache up to :data:`READ_BYTES_GATHER`); with a transform two batches (with Ray actors
at least :data:`REMOTE_ROWS_PER_READ` rows). In flight: at most ``reads_in_flight`` reads plus the one being consumed, so at most ``(reads_in_flight + 1) ×
READ_BYTES_GATHER`` of Arrow data (a mix's read: up to 4 × ``READ_BYTES``), whatever the
dataset's size.
"""

from __future__ import annotations

import math

# With a transform, a read of two batches is still in the CPU cache when the worker transforms
# it (docs/performance.md, "Read sizes"); batches of small rows are read more to a read, up to
# TRANSFORM_READ_BYTES of the rows' data and TRANSFORM_BATCHES_MOST batches: each read costs
# the training loop ~0.2 ms (taking its result, sending the next) and the worker a Lance
# call; batches of 32 JPEGs of 10 KB cost the loader 10.8 ms of CPU a step in reads of 2, 8.9
# in reads of 6 (docs/performance.md, "Read sizes").
TRANSFORM_BATCHES_PER_READ = 2
TRANSFORM_READ_BYTES = 2 << 20
TRANSFORM_BATCHES_MOST = 8
# Rows read by one Lance call. Range reads keep getting cheaper per row up to ~64k rows; random
# takes are slower per call, so fewer rows keep the time to the first batch low.
ROWS_PER_READ_SEQUENTIAL = 65_536
ROWS_PER_READ_RANDOM = 16_384
# Bytes read by one Lance call at most (rows of 264 B: ~31,800 rows, not 65,536; rows over 8 KB
# get READ_ROWS_LEAST, below): reads stay in the cache-friendly range and the memory in flight
# stays small. Larger reads page-fault their buffers in afresh every time (glibc maps blocks of
# 32 MiB and more from the kernel) and Lance reads big binary batches slower per row
# (docs/performance.md, "Read sizes").
READ_BYTES = 8 << 20
# But a read of few large rows pays a Lance call's fixed cost (~0.75 ms) and the engine's per
# read over few rows: reads of big rows hold at least READ_ROWS_LEAST rows within
# READ_BYTES_MOST (docs/performance.md, "Read sizes").
READ_ROWS_LEAST = 1024
READ_BYTES_MOST = 16 << 20
# A shuffle's read through a cache gathers its rows from every piece, at a cost per piece and
# read besides the cost per row, which reads of 32 MiB amortise (docs/performance.md, "Read
# sizes"). Its buffers come from Arrow's pool, which reuses them (the page faults READ_BYTES
# avoids are Lance's).
READ_BYTES_GATHER = 32 << 20
# Ray actors (worker_type="ray"): the training process pays Ray's cost per read (the call, the
# wait, the get: ~2.5 ms of its CPU), whatever the read holds, so with a transform a read holds
# at least this many rows (8 batches of 64): 0.17-0.19 cores per 10,000 rows/s of 224x224
# images against 0.40-0.55 with reads of 2 batches (docs/performance.md, "Remote workers").
# Rows, not batches: a read of 512 images is ~77 MB of the transform's output whatever the
# batch size, and sizing cannot see the output's bytes (the transform makes them).
REMOTE_ROWS_PER_READ = 512


def batches_per_read(
    random: bool,
    batch_size: int,
    transform: bool,
    bytes_per_row: float = 0.0,
    read_parts: int = 1,
    store_ranges: bool = False,
    cache_gathers: bool = False,
    worker_type: str = "thread",
    decodes: bool = False,
) -> int:
    """Batches per Lance read by default: 65,536 rows, 16,384 for a full shuffle (random takes
    cost more per call), at most :data:`READ_BYTES` of data (or :data:`READ_ROWS_LEAST` rows
    within :data:`READ_BYTES_MOST` where that is more), and with a transform two batches (still
    in the CPU cache when they are transformed; a read's first batch waits for the whole read),
    or as many as hold :data:`TRANSFORM_READ_BYTES` of small rows, up to
    :data:`TRANSFORM_BATCHES_MOST` (each read costs the loop and the worker a fixed cost).
    ``decodes``: rows decoded in the read (clips, ``ReadHints.decodes``), two batches whatever
    their size (a clip's decode takes milliseconds, beside which a read's cost is nothing).
    Never less than one batch.

    >>> batches_per_read(False, 32, transform=True, bytes_per_row=10_000)  # 32 JPEGs of 10 KB
    6
    >>> batches_per_read(False, 32, transform=True, bytes_per_row=100_000)  # of 100 KB
    2
    >>> batches_per_read(False, 4, transform=False, bytes_per_row=98_304, decodes=True)
    2

    ``random``: whether the reads are random takes (a full shuffle, or a mix of shuffled
    sources: :attr:`Pipeline.random_reads <lanceloader.pipeline.Pipeline.random_reads>`).

    >>> batches_per_read(False, 256, transform=False)
    256
    >>> batches_per_read(False, 256, transform=False, bytes_per_row=264)  # 8 MiB: 31,775 rows
    124
    >>> batches_per_read(False, 256, transform=False, bytes_per_row=11_000)  # 1,024 rows: 11 MB
    4
    >>> batches_per_read(False, 256, transform=False, bytes_per_row=100_000)  # 16 MiB: 167 rows
    1

    ``read_parts``: the reads one read makes underneath, each sized as a read of its own (a mix
    of 3 equal sources: 3, its :class:`~lanceloader.rows.protocol.ReadHints`), so each Lance
    call is as large as one source's would be, with a transform too (a Lance call's fixed cost,
    paid per part: docs/performance.md, "The mix's reads"):

    >>> batches_per_read(False, 256, transform=False, bytes_per_row=264, read_parts=3)
    372
    >>> batches_per_read(False, 256, transform=True, read_parts=3)
    6

    ``store_ranges``: the reads are a Lance source's sequential ranges on an object store (with
    or without a cache: :func:`~lanceloader.engine.tasks.store_ranges`), where each read costs a
    round trip whatever its size and a fragment read in two reads costs a request per column
    more: they hold up to :data:`READ_BYTES_MOST`, so an epoch makes about as many requests as
    Lance's own scan (docs/performance.md, "Reads on an object store"):

    >>> batches_per_read(False, 256, transform=False, bytes_per_row=264, store_ranges=True)
    248

    ``cache_gathers``: the reads are a shuffle's gathers from a cache's pieces, sized by
    :data:`READ_BYTES_GATHER` (4 times the rows of a sequential read at most), which amortise a
    gather's cost per piece (docs/performance.md, "Read sizes"):

    >>> batches_per_read(False, 256, transform=False, bytes_per_row=272, cache_gathers=True)
    481

    ``worker_type``: with Ray actors (``"ray"``) and a transform, a read holds at least
    :data:`REMOTE_ROWS_PER_READ` rows (the training process pays Ray's cost per read), still
    within the bytes above:

    >>> batches_per_read(False, 64, transform=True, worker_type="ray")
    8
    >>> batches_per_read(False, 256, transform=True, worker_type="ray")
    2
    >>> batches_per_read(False, 64, transform=True, bytes_per_row=100_000, worker_type="ray")
    2
    """
    rows = (ROWS_PER_READ_RANDOM if random else ROWS_PER_READ_SEQUENTIAL) * read_parts
    if cache_gathers:
        rows *= 4
    if bytes_per_row > 0:
        least = min(READ_ROWS_LEAST * read_parts, int(READ_BYTES_MOST // bytes_per_row))
        most = (
            READ_BYTES_GATHER
            if cache_gathers
            else READ_BYTES_MOST
            if store_ranges
            else READ_BYTES * read_parts
        )
        rows = min(rows, max(int(most // bytes_per_row), least))
    per_read = max(1, rows // batch_size)
    if not (transform or decodes):
        return per_read
    most = TRANSFORM_BATCHES_PER_READ
    if bytes_per_row > 0 and not decodes:
        fit = int(TRANSFORM_READ_BYTES // (bytes_per_row * batch_size))
        most = max(most, min(fit, TRANSFORM_BATCHES_MOST))
    if worker_type == "ray":
        most = max(most, math.ceil(REMOTE_ROWS_PER_READ / batch_size))
    return min(per_read, most * read_parts)


def default_workers(cores: int, worker_type: str, reads_wait: bool) -> int:
    """Workers by default: one per core, and two per core for thread workers whose reads wait
    on Lance (``reads_wait``: plain Lance rows read in order, with no transform and no cache,
    or a mix of only such sources: the rows protocol's ``waits_on_lance``).

    Such a worker holds no core: it waits in Lance's range read while Lance's own threads read
    and decode, and one per core kept fewer reads in flight than Lance's scan keeps read ahead.
    Random takes, cache gathers, placements and transforms are the workers' own CPU: a second
    thread per core only takes turns (docs/performance.md, "Worker counts").

    >>> default_workers(2, "thread", reads_wait=True), default_workers(2, "thread", False)
    (4, 2)
    >>> default_workers(2, "process", reads_wait=True)
    2
    """
    return 2 * cores if worker_type == "thread" and reads_wait else cores


def default_prefetch(
    workers: int, per_read: int, transform: bool, worker_type: str = "thread"
) -> int:
    """Batches in flight by default: two per worker, and with a transform two reads per worker
    (a worker that finishes early starts its next read instead of waiting). Ray actors with a
    transform: one read per actor (their reads are :data:`REMOTE_ROWS_PER_READ` rows: two would
    hold 4 times the rows of two local reads of 2 batches of 64 in the object store).

    >>> default_prefetch(4, 2, True), default_prefetch(4, 8, True, "ray")
    (16, 32)
    """
    if transform and worker_type == "ray":
        return workers * per_read
    return 2 * workers * (per_read if transform else 1)


def reads_in_flight(prefetch: int, per_read: int, workers: int) -> int:
    """Reads that ``workers`` workers keep in flight for ``prefetch`` batches: whole reads, at
    least one per worker."""
    return max(workers, math.ceil(prefetch / per_read))
