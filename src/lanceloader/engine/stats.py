"""Stats: what every stage did, how long it took, and which stage limits the pipeline.

One small :class:`Recorder` per loader collects counters from the workers (read, transform,
convert) and from the consumer (time waiting for a batch, time between batches, that is the
training step). :meth:`Recorder.snapshot` turns them into a :class:`Stats`: rows/s and bytes/s
delivered, Lance's own I/O counters (bytes, IOPS, effective bandwidth), time per stage, and a
verdict naming the bottleneck with one concrete suggestion.

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
import os
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

COUNTERS = (
    "batches", "rows", "nbytes", "wall_s", "read_s", "transform_s", "convert_s", "wait_s",
    "step_s", "rows_read", "rows_skipped", "rows_cached", "io_bytes", "io_iops", "depth_sum",
    "depth_samples", "copy_batches", "copy_bytes", "copy_s", "copy_exposed_s", "copies_late",
    "device_ahead_max", "device_ahead_bytes_max",
)
MAXIMA = ("device_ahead_max", "device_ahead_bytes_max")  # the most at any time, not sums


@dataclass(frozen=True)
class Verdict:
    """The stage that limits throughput, the numbers behind it, and what to try."""

    stage: str
    evidence: str
    suggestion: str

    def __str__(self) -> str:
        return f"bottleneck: {self.stage} ({self.evidence}). Try: {self.suggestion}"


@dataclass(frozen=True)
class Stats:
    """A summary of one epoch or of the whole run. ``print(stats)`` gives a compact table."""

    epochs: int
    batches: int
    rows: int
    nbytes: int
    wall_s: float
    read_s: float
    transform_s: float
    convert_s: float
    wait_s: float
    step_s: float
    rows_read: int
    rows_skipped: int
    rows_undelivered: int
    io_bytes: int
    io_iops: int
    workers: int
    queue_depth_mean: float
    bottleneck: Verdict = field(compare=False)
    rows_cached: int = 0  # rows read from the loader's cache (``cache=``), not from storage
    padding_fraction: float | None = None  # with ``pack=``: padding tokens of the packed rows
    # The device stage (``device=``, engine/device.py): batches and bytes copied; the copies'
    # time (CUDA: device time) and the part of it the consumer's stream waited for; copies
    # issued only on arrival (nothing ahead); the most batches and bytes ahead on the device.
    copy_batches: int = 0
    copy_bytes: int = 0
    copy_s: float = 0.0
    copy_exposed_s: float = 0.0
    copies_late: int = 0
    device_ahead_max: int = 0
    device_ahead_bytes_max: int = 0

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def bytes_per_s(self) -> float:
        return self.nbytes / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def requests_per_1000_rows(self) -> float:
        """Storage requests (Lance's IOPS: on object storage, one request each) per 1,000 rows
        read: what an order costs on object storage, where every request pays the latency."""
        return 1000 * self.io_iops / self.rows_read if self.rows_read else 0.0

    @property
    def copy_hidden(self) -> float | None:
        """The share of the device copies' time that the training step hid (the consumer's
        stream did not wait for it); ``None`` before any timed copy."""
        return 1.0 - self.copy_exposed_s / self.copy_s if self.copy_s > 0 else None

    @property
    def io_bandwidth(self) -> float:
        """Bytes/s that Lance read from storage while workers were reading."""
        busy = self.read_s / max(1, self.workers)
        return self.io_bytes / busy if busy > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["bottleneck"] = asdict(self.bottleneck)
        d.update(rows_per_s=self.rows_per_s, bytes_per_s=self.bytes_per_s,
                 io_bandwidth=self.io_bandwidth, copy_hidden=self.copy_hidden,
                 requests_per_1000_rows=self.requests_per_1000_rows)
        return d

    def __str__(self) -> str:
        def pct(x: float) -> str:
            return f"{100 * x / self.wall_s:5.1f}%" if self.wall_s > 0 else "   - "

        cap = self.wall_s * max(1, self.workers)
        rows = [
            ("delivered", f"{self.rows:,} rows in {self.batches:,} batches, {self.wall_s:.2f} s"),
            ("throughput", f"{self.rows_per_s:,.0f} rows/s, {self.bytes_per_s / 1e6:,.1f} MB/s"),
            ("storage I/O", f"{self.io_bytes / 1e6:,.1f} MB, {self.io_iops:,} IOPS "
                            f"({self.requests_per_1000_rows:,.1f} requests per 1,000 rows), "
                            f"{self.io_bandwidth / 1e6:,.1f} MB/s while reading"
                            + (f"; {100 * self.rows_cached / self.rows_read:.0f}% of rows from "
                               "the cache" if self.rows_cached and self.rows_read else "")),
            ("read", f"{self.read_s:.2f} s ({100 * self.read_s / cap:.0f}% of {self.workers} "
                     f"worker{'s' if self.workers != 1 else ''})" if cap else "-"),
            ("transform", f"{self.transform_s:.2f} s ({100 * self.transform_s / cap:.0f}% of workers)" if cap else "-"),
            ("convert", f"{self.convert_s:.2f} s ({100 * self.convert_s / cap:.0f}% of workers)" if cap else "-"),
            ("loop waited", f"{self.wait_s:.2f} s ({pct(self.wait_s).strip()} of wall time)"),
            ("loop worked", f"{self.step_s:.2f} s ({pct(self.step_s).strip()} of wall time)"),
            ("rows", f"read {self.rows_read:,} = delivered {self.rows:,} + skipped "
                     f"{self.rows_skipped:,} + prefetched, not delivered {self.rows_undelivered:,}"),
            ("queue", f"{self.queue_depth_mean:.1f} reads in flight on average"),
        ]
        if self.copy_batches:
            hidden = (f"{100 * self.copy_hidden:.0f}% hidden behind the step"
                      if self.copy_hidden is not None else "not timed")
            rows.append(("device", (
                f"{self.copy_batches:,} batches, {self.copy_bytes / 1e6:,.1f} MB copied in "
                f"{1000 * self.copy_s:,.1f} ms, {hidden}; up to {self.device_ahead_max} batches "
                f"({self.device_ahead_bytes_max / 1e6:,.1f} MB) ahead, {self.copies_late:,} "
                "copied on arrival")))
        if self.padding_fraction is not None:
            rows.append(("packing", f"{100 * self.padding_fraction:.1f}% of the tokens of "
                                    "packed rows are padding"))
        width = max(len(k) for k, _ in rows)
        lines = [f"{k:<{width}}  {v}" for k, v in rows]
        return "\n".join([*lines, str(self.bottleneck)])


# Read time per storage request above which reading is latency-bound: local disks answer in
# well under a millisecond, object stores in tens of milliseconds.
LATENCY_BOUND_S = 0.005
# ... and only for requests of less than this on average: a big request is slow because of its
# size (bandwidth), not the latency.
SMALL_REQUEST_BYTES = 1 << 20


def _seconds_per_request(s: dict[str, float]) -> float:
    return s["read_s"] / s["io_iops"] if s.get("io_iops") else 0.0


def verdict(s: dict[str, float], workers: int, shuffle_random: bool) -> Verdict:
    """Name the limiting stage from stage times (seconds) over ``wall_s`` of wall time."""
    wall = s["wall_s"]
    if wall <= 0 or s["batches"] == 0:
        return Verdict("none yet", "no batches delivered", "iterate over the loader first")
    waited = s["wait_s"] / wall
    if waited < 0.1:
        return Verdict(
            "training loop",
            f"the loop waited for data {100 * waited:.0f}% of the time",
            "nothing to gain in the loader; speed up the model step or use more devices",
        )
    busy = {k: s[f"{k}_s"] for k in ("read", "transform", "convert")}
    stage = max(busy, key=lambda k: busy[k])
    share = busy[stage] / max(sum(busy.values()), 1e-12)
    evidence = (f"the loop waited {100 * waited:.0f}% of the time; workers spent "
                f"{100 * share:.0f}% of their busy time in {stage}")
    if stage == "read" and s.get("rows_cached", 0) >= 0.9 * max(1, s["rows_read"]):
        return Verdict(
            "cache reads", f"{evidence}, {100 * s['rows_cached'] / s['rows_read']:.0f}% of rows "
            "from the cache",
            "add workers (num_workers) up to the number of cores; with a cache directory, "
            "cache='memory' (or a directory on /dev/shm) reads faster when the data fits in RAM",
        )
    small_requests = s["io_bytes"] < SMALL_REQUEST_BYTES * max(1, s.get("io_iops", 0))
    if stage == "read" and small_requests and _seconds_per_request(s) > LATENCY_BOUND_S:
        return Verdict(
            "storage latency",
            f"{evidence}; each storage request took {1000 * _seconds_per_request(s):.0f} ms of "
            f"read time ({s['io_bytes'] / max(1, s['io_iops']) / 1e3:,.0f} KB on average)",
            "make each request carry more rows: a block shuffle (shuffle_block_size=1024) "
            "instead of a full shuffle, bigger reads (rows_per_read); keep more requests in "
            "flight (num_workers); or cache=, a local directory (or 'memory'), so that later "
            "epochs read locally",
        )
    if stage == "read":
        hint = ("use a block shuffle (shuffle_block_size=1024) instead of a full shuffle, or "
                "materialise a shuffled copy" if shuffle_random else
                "add workers (num_workers) or raise rows_per_read; on object storage, more "
                "workers hide latency")
        return Verdict("storage I/O", evidence, hint)
    if stage == "transform":
        return Verdict("decode/transform", evidence,
                       f"more workers than {workers} if cores are idle; worker_type='process' if "
                       "the transform is pure Python (GIL-bound); or preprocess once and store "
                       "the result in Lance")
    return Verdict("conversion", evidence,
                   "read fewer columns, use output='arrow', or avoid string/ragged columns")


def count_delivered(c: dict[str, float], rows: int, nbytes: int, wait_s: float, step_s: float,
                    wall_s: float) -> None:
    """A batch was handed to the training loop: update an epoch's counters (from
    :meth:`Recorder.new_epoch`) in place. Called once per batch, so a plain function."""
    c["batches"] += 1
    c["rows"] += rows
    c["nbytes"] += nbytes
    c["wait_s"] += wait_s
    c["step_s"] += step_s
    c["wall_s"] = wall_s


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
        self._current: dict[str, float] = dict.fromkeys(COUNTERS, 0.0)  # before any epoch

    def __reduce__(self) -> tuple[type, tuple[()]]:
        return (Recorder, ())  # a copy in another process starts with fresh counters

    # --- recording (hot path) ------------------------------------------------------------

    def new_epoch(self) -> dict[str, float]:
        """Start the counters of a new epoch; the consumer may update them in place."""
        with self._lock:
            self._current = dict.fromkeys(COUNTERS, 0.0)
            self._epochs.append(self._current)
        return self._current

    def task(self, seconds: dict[str, float], rows_read: int, io_bytes: int, io_iops: int,
             rows_skipped: int, in_flight: int, rows_cached: int = 0) -> None:
        """A worker's task arrived at the consumer."""
        c = self._current
        c["rows_cached"] += rows_cached
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

    def event(self, name: str, start: float, end: float, lane: str | None = None,
              **args: Any) -> None:
        """A trace span on ``lane`` (default: the calling thread's name)."""
        if self._trace is None:
            return
        lane = lane or threading.current_thread().name
        with self._lock:
            self._trace.append({
                "name": name, "ph": "X", "pid": os.getpid(), "tid": lane,
                "ts": (start - self._t0) * 1e6, "dur": (end - start) * 1e6, "args": args,
            })

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
        meta = [{"name": "thread_name", "ph": "M", "pid": os.getpid(), "tid": i,
                 "args": {"name": lane}} for i, lane in enumerate(lanes)]
        index = {lane: i for i, lane in enumerate(lanes)}
        out = [dict(e, tid=index[e["tid"]]) for e in events]
        with open(path, "w") as f:
            json.dump({"traceEvents": meta + out, "displayTimeUnit": "ms"}, f)

    # --- summaries -----------------------------------------------------------------------

    def epoch_counters(self, epoch: int = -1) -> dict[str, float]:
        with self._lock:
            if not self._epochs:
                return dict.fromkeys(COUNTERS, 0.0)
            return dict(self._epochs[epoch])

    def total_counters(self) -> dict[str, float]:
        total = dict.fromkeys(COUNTERS, 0.0)
        with self._lock:
            epochs = list(self._epochs)
        for c in epochs:
            for k in COUNTERS:
                total[k] = max(total[k], c[k]) if k in MAXIMA else total[k] + c[k]
        return total

    def snapshot(self, workers: int = 1,
                 shuffle_random: bool = False, epoch: int | None = None) -> Stats:
        c = self.total_counters() if epoch is None else self.epoch_counters(epoch)
        depth_n = c["depth_samples"]
        return Stats(
            epochs=len(self._epochs) if epoch is None else 1,
            batches=int(c["batches"]), rows=int(c["rows"]), nbytes=int(c["nbytes"]),
            wall_s=c["wall_s"], read_s=c["read_s"], transform_s=c["transform_s"],
            convert_s=c["convert_s"], wait_s=c["wait_s"], step_s=c["step_s"],
            rows_read=int(c["rows_read"]), rows_skipped=int(c["rows_skipped"]),
            rows_undelivered=int(c["rows_read"] - c["rows"] - c["rows_skipped"]),
            io_bytes=int(c["io_bytes"]), io_iops=int(c["io_iops"]), workers=workers,
            queue_depth_mean=c["depth_sum"] / depth_n if depth_n else 0.0,
            bottleneck=verdict(c, workers, shuffle_random), rows_cached=int(c["rows_cached"]),
            copy_batches=int(c["copy_batches"]), copy_bytes=int(c["copy_bytes"]),
            copy_s=c["copy_s"], copy_exposed_s=c["copy_exposed_s"],
            copies_late=int(c["copies_late"]), device_ahead_max=int(c["device_ahead_max"]),
            device_ahead_bytes_max=int(c["device_ahead_bytes_max"]),
        )
