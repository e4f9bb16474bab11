"""Stats: what every stage did, how long it took, and which stage limits the pipeline.

One small :class:`Recorder` per loader collects counters from the workers (read, transform,
convert) and from the consumer (time waiting for a batch, time between batches, that is the
training step). :meth:`Recorder.snapshot` turns them into a :class:`Stats`: rows/s and bytes/s
delivered, Lance's own I/O counters (bytes, IOPS, effective bandwidth), time per stage, the
loop's wait per batch (a histogram of 10 buckets per decade: p50/p95/p99, and the first
batch's wait), where the workers ran (usable cores, the share of their time busy, the cores this
process used: CPU clocks read at each epoch's start and end, and when a snapshot is taken, never
on the per-batch path), and a verdict naming the bottleneck with what to try.

The verdict (:func:`~lanceloader.engine.verdict.verdict`, its own module) blames a worker stage only when it took at least
``STAGE_SHARE`` of the workers' time, advises more workers only when cores were idle, and
never advises a setting already in place (``worker_type``, when the caller says it).

Workers time their stages and hand the numbers back with each task (plain data, so process
workers can too); the consumer records them with one lock per task and one per batch. The
device stage (``device=``, ``engine/device.py``) records its copies: batches, bytes, the copies'
time and the part of it the training step did not hide, and the most batches ahead on the device. When a
trace is requested, every span also becomes a Chrome / Perfetto event, one lane per worker thread
and one for the training loop.

Example::

    >>> rec = Recorder()
    >>> counters = rec.new_epoch()
    >>> rec.task({"read": 0.5}, rows_read=1000, io_bytes=268_000, io_iops=300, rows_skipped=0,
    ...          in_flight=1)
    >>> count_delivered(counters, 1000, 268_000, 0.4, 0.1, 0.5)
    >>> s = rec.snapshot(workers=1)
    >>> s.bottleneck.stage
    'storage I/O'

With 3 requests for the same 0.5 s of reading (167 ms each), the verdict is latency:

    >>> latency = Recorder()
    >>> c = latency.new_epoch()
    >>> latency.task({"read": 0.5}, rows_read=1000, io_bytes=268_000, io_iops=3, rows_skipped=0,
    ...              in_flight=1)
    >>> count_delivered(c, 1000, 268_000, 0.4, 0.1, 0.5)
    >>> latency.snapshot(workers=1).bottleneck.stage
    'storage latency'
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from typing import Any

from lanceloader.engine.summary import Stats
from lanceloader.engine.verdict import cores_busy, process_cores, usable_cores, verdict
from lanceloader.engine.waits import WAIT_KEYS, wait_percentiles

COUNTERS = (
    "batches",
    "rows",
    "nbytes",
    "wall_s",
    "read_s",
    "decode_s",
    "transform_s",
    "convert_s",
    "transfer_s",  # Ray actors' results: the loop's time getting them (pull, deserialize)
    "local_s",  # Ray actors: building the loop did itself while no actor was ready
    "wait_s",
    "step_s",
    "rows_read",
    "rows_skipped",
    "rows_cached",
    "cache_damaged",
    "cache_fills",
    "io_bytes",
    "io_iops",
    "depth_sum",
    "depth_samples",
    "copy_batches",
    "copy_bytes",
    "copy_s",
    "copy_exposed_s",
    "copies_late",
    "device_ahead_max",
    "device_ahead_bytes_max",
    # the first batch's wait; CPU: this process's seconds, the usable cores' busy and total
    # core-seconds, over the epoch's first cpu_wall_s seconds (see end_cpu, with_cpu_now)
    "first_wait_s",
    "cpu_s",
    "cores_busy_s",
    "cores_all_s",
    "cpu_wall_s",
    *WAIT_KEYS,
)
# Per epoch, not summed: the CPU clocks and perf_counter at the epoch's start, and whether its
# CPU counters are final (end_cpu).
SAMPLING = ("cpu_at", "busy_at", "all_at", "cpu_t0", "cpu_ended")
MAXIMA = ("device_ahead_max", "device_ahead_bytes_max")  # the most at any time, not sums
SUMMED = tuple(k for k in COUNTERS if k not in MAXIMA)


def cpu_sample() -> tuple[float, float, float]:
    """``(this process's CPU seconds, busy and total core-seconds of the usable cores)``.

    The cores' times come from ``/proc/stat`` (Linux; any process counts, as cores another job
    keeps busy are not free for more workers); elsewhere both are 0 (unmeasured).
    """
    own = time.process_time()
    try:
        with open("/proc/stat", "rb") as f:
            lines = f.read().splitlines()
        cpus = os.sched_getaffinity(0)
    except (OSError, AttributeError):
        return own, 0.0, 0.0
    busy = total = 0
    for line in lines[1:]:
        if not line.startswith(b"cpu"):
            break
        name, *ticks = line.split()
        if int(name[3:]) not in cpus:
            continue
        t = [int(x) for x in ticks[:8]]  # user nice system idle iowait irq softirq steal
        idle = t[3] + t[4]
        busy += sum(t) - idle
        total += sum(t)
    return own, busy / _TICKS_PER_S, total / _TICKS_PER_S


_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _cpu_to_now(c: dict[str, float]) -> None:
    """Set ``c``'s CPU counters to the deltas from its epoch's start to now."""
    own, busy, total = cpu_sample()
    c["cpu_s"] = own - c["cpu_at"]
    c["cores_busy_s"] = busy - c["busy_at"]
    c["cores_all_s"] = total - c["all_at"]
    c["cpu_wall_s"] = time.perf_counter() - c["cpu_t0"]


def end_cpu(c: dict[str, float]) -> None:
    """The epoch's delivery ended (its end, a ``break``, an error): its CPU counters are read
    now, once, by the consumer, and final. Idempotent. The clocks are never read per batch:
    reading ``/proc`` lets go of the GIL, and a worker thread that takes it can hold it for
    milliseconds of the loop's wait."""
    if not c["cpu_ended"]:
        _cpu_to_now(c)
        c["cpu_ended"] = 1.0


def with_cpu_now(c: dict[str, float]) -> dict[str, float]:
    """``c`` (a copy), with the CPU counters of an epoch still delivering read up to now (any
    thread: ``c`` is the caller's own copy)."""
    if not c.get("cpu_ended", 1.0):
        _cpu_to_now(c)
    return c


def new_counters() -> dict[str, float]:
    """An epoch's counters, all zero, with the CPU clocks read at its start."""
    c = dict.fromkeys(COUNTERS + SAMPLING, 0.0)
    c["cpu_at"], c["busy_at"], c["all_at"] = cpu_sample()
    c["cpu_t0"] = time.perf_counter()
    return c


_log10 = math.log10


def count_delivered(
    c: dict[str, float], rows: int, nbytes: int, wait_s: float, step_s: float, wall_s: float
) -> None:
    """A batch was handed to the training loop: update an epoch's counters (from
    :meth:`Recorder.new_epoch`) in place: sums and the wait's histogram bucket (no system call:
    see :func:`end_cpu`). Called once per batch, so a plain function."""
    if not c["batches"]:
        c["first_wait_s"] = wait_s
    c["batches"] += 1
    c["rows"] += rows
    c["nbytes"] += nbytes
    c["wait_s"] += wait_s
    c["step_s"] += step_s
    c["wall_s"] = wall_s
    if wait_s < 1e-6:  # wait_bucket, inlined: this runs once per batch
        bucket = 0
    else:
        bucket = int(_log10(wait_s) * 10.0 + 61.0)
        if bucket > 101:
            bucket = 101
    c[WAIT_KEYS[bucket]] += 1


def count_end(c: dict[str, float], wait_s: float, wall_s: float) -> None:
    """The loop asked past the last batch: that wait is the loop's too, and the epoch's wall
    time runs to it (the stream counts it before its workers stop: their stop is not the
    epoch's); its CPU counters are final."""
    c["wait_s"] += wait_s
    c["wall_s"] = wall_s
    end_cpu(c)


class Recorder:
    """Counters for one loader, per epoch; optional trace events.

    Only the consumer thread records (workers hand their numbers back with each task), so the
    hot path takes no lock; the counter dicts have fixed keys, so reading them from another
    thread is safe.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._epochs: list[dict[str, float]] = []
        self._trace: list[dict[str, Any]] | None = None
        self._t0 = time.perf_counter()
        self._current: dict[str, float] = dict.fromkeys(COUNTERS + SAMPLING, 0.0)  # no epoch yet

    def __reduce__(self) -> tuple[type, tuple[()]]:
        return (Recorder, ())  # a copy in another process starts with fresh counters

    # --- recording (hot path) ------------------------------------------------------------

    def new_epoch(self) -> dict[str, float]:
        """Start the counters of a new epoch; the consumer may update them in place."""
        with self._lock:
            self._current = new_counters()
            self._epochs.append(self._current)
        return self._current

    def task(
        self,
        seconds: dict[str, float],
        rows_read: int,
        io_bytes: int,
        io_iops: int,
        rows_skipped: int,
        in_flight: int,
        rows_cached: int = 0,
        cache_damaged: int = 0,
        cache_fills: int = 0,
    ) -> None:
        """A worker's task arrived at the consumer."""
        c = self._current
        c["rows_cached"] += rows_cached
        c["cache_damaged"] += cache_damaged
        c["cache_fills"] += cache_fills
        for stage, value in seconds.items():
            c[f"{stage}_s"] += value
        c["rows_read"] += rows_read
        c["io_bytes"] += io_bytes
        c["io_iops"] += io_iops
        c["rows_skipped"] += rows_skipped
        c["depth_sum"] += in_flight
        c["depth_samples"] += 1

    def copied(self, nbytes: int, late: bool) -> None:
        """The device stage handed over a batch of ``nbytes`` (``late``: copied on arrival).
        The stage calls these under its queue's lock."""
        c = self._current
        c["copy_batches"] += 1
        c["copy_bytes"] += nbytes
        c["copies_late"] += late

    def copy_timed(self, copy_s: float, exposed_s: float) -> None:
        """A device copy took ``copy_s``, of which the consumer waited ``exposed_s``."""
        c = self._current
        c["copy_s"] += copy_s
        c["copy_exposed_s"] += exposed_s

    def device_ahead(self, batches: int, nbytes: int) -> None:
        """The device stage holds ``batches`` batches (``nbytes``) ahead of the consumer."""
        c = self._current
        c["device_ahead_max"] = max(c["device_ahead_max"], batches)
        c["device_ahead_bytes_max"] = max(c["device_ahead_bytes_max"], nbytes)

    def event(
        self, name: str, start: float, end: float, lane: str | None = None, **args: Any
    ) -> None:
        """A trace span on ``lane`` (default: the calling thread's name)."""
        if self._trace is None:
            return
        lane = lane or threading.current_thread().name
        with self._lock:
            self._trace.append(
                {
                    "name": name,
                    "ph": "X",
                    "pid": os.getpid(),
                    "tid": lane,
                    "ts": (start - self._t0) * 1e6,
                    "dur": (end - start) * 1e6,
                    "args": args,
                }
            )

    # --- tracing -------------------------------------------------------------------------

    @property
    def tracing(self) -> bool:
        return self._trace is not None

    def start_trace(self) -> None:
        with self._lock:
            self._trace = []

    def write_trace(self, path: str | os.PathLike[str]) -> None:
        """Write the events since ``start_trace`` as Chrome/Perfetto JSON and stop tracing."""
        with self._lock:
            events, self._trace = self._trace or [], None
        lanes = sorted({e["tid"] for e in events})
        meta = [
            {"name": "thread_name", "ph": "M", "pid": os.getpid(), "tid": i, "args": {"name": lane}}
            for i, lane in enumerate(lanes)
        ]
        index = {lane: i for i, lane in enumerate(lanes)}
        out = [dict(e, tid=index[e["tid"]]) for e in events]
        with open(path, "w") as f:
            json.dump({"traceEvents": meta + out, "displayTimeUnit": "ms"}, f)

    # --- summaries -----------------------------------------------------------------------

    def epoch_counters(self, epoch: int = -1) -> dict[str, float]:
        with self._lock:
            if not self._epochs:
                return dict.fromkeys(COUNTERS, 0.0)
            return with_cpu_now(dict(self._epochs[epoch]))

    def total_counters(self) -> dict[str, float]:
        total = dict.fromkeys(COUNTERS, 0.0)
        with self._lock:
            epochs = [dict(c) for c in self._epochs]
        for c in map(with_cpu_now, epochs):
            for k in SUMMED:
                total[k] += c[k]
            for k in MAXIMA:
                total[k] = max(total[k], c[k])
        return total

    def snapshot(
        self,
        workers: int = 1,
        shuffle_random: bool = False,
        epoch: int | None = None,
        worker_type: str | None = None,
        cache: str | None = None,
    ) -> Stats:
        """The :class:`Stats` of one epoch (``epoch``: an index, ``-1`` the last) or of all
        (``None``); ``workers`` and ``worker_type`` say how the loader ran (the verdict never
        advises what is set)."""
        c = self.total_counters() if epoch is None else self.epoch_counters(epoch)
        depth_n = c["depth_samples"]
        histogram = tuple(int(c[k]) for k in WAIT_KEYS)
        p50, p95, p99 = wait_percentiles(histogram, (0.5, 0.95, 0.99))
        cores = usable_cores()
        return Stats(
            epochs=len(self._epochs) if epoch is None else 1,
            batches=int(c["batches"]),
            rows=int(c["rows"]),
            nbytes=int(c["nbytes"]),
            wall_s=c["wall_s"],
            read_s=c["read_s"],
            decode_s=c["decode_s"],
            transform_s=c["transform_s"],
            convert_s=c["convert_s"],
            wait_s=c["wait_s"],
            step_s=c["step_s"],
            rows_read=int(c["rows_read"]),
            rows_skipped=int(c["rows_skipped"]),
            rows_undelivered=int(c["rows_read"] - c["rows"] - c["rows_skipped"]),
            io_bytes=int(c["io_bytes"]),
            io_iops=int(c["io_iops"]),
            workers=workers,
            queue_depth_mean=c["depth_sum"] / depth_n if depth_n else 0.0,
            bottleneck=verdict(c, workers, shuffle_random, worker_type, cores, cache),
            cache=cache,
            rows_cached=int(c["rows_cached"]),
            cache_damaged=int(c["cache_damaged"]),
            cache_fills=int(c["cache_fills"]),
            copy_batches=int(c["copy_batches"]),
            copy_bytes=int(c["copy_bytes"]),
            copy_s=c["copy_s"],
            copy_exposed_s=c["copy_exposed_s"],
            copies_late=int(c["copies_late"]),
            device_ahead_max=int(c["device_ahead_max"]),
            device_ahead_bytes_max=int(c["device_ahead_bytes_max"]),
            worker_type=worker_type,
            cores=cores,
            cores_busy=cores_busy(c),
            process_cores=process_cores(c),
            first_wait_s=c["first_wait_s"],
            wait_p50_s=p50,
            wait_p95_s=p95,
            wait_p99_s=p99,
            wait_histogram=histogram,
            transfer_s=c["transfer_s"],
            local_s=c["local_s"],
        )
