"""The summary of what a loader did (:class:`Stats`, what ``loader.stats()`` returns): plain
numbers from the recorder's counters (``engine/stats.py``), the derived rates, the verdict, and
the table ``print(stats)`` shows."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from lanceloader.engine.verdict import Verdict

MIX_ROWS = 3  # the table shows a mix's latest pieces of weights, at most this many


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
    # cache files that failed their check (dropped, read again from the dataset, never delivered)
    cache_damaged: int = 0
    # pieces downloaded and kept in the cache, by every worker (threads and processes)
    cache_fills: int = 0
    padding_fraction: float | None = None  # with ``pack=``: padding tokens of the packed rows
    # a mix: what each source delivered per piece of its weights (ordering.mixrun.MixShare)
    mix: tuple[Any, ...] = ()
    # the loader's cache and why (``cache="auto"`` chose it, or none, for a reason; or given)
    cache: str | None = None
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
    # Where the workers ran: their type (None: not said), the usable cores, the share of those
    # cores' time busy (any process) and the cores this process used (None: unmeasured).
    worker_type: str | None = None
    cores: int = 1
    cores_busy: float | None = None
    process_cores: float | None = None
    # The loop's wait per batch: the first batch's (startup), percentiles, and the histogram
    # they come from (counts per bucket of ``WAIT_EDGES``, see :func:`wait_bucket`).
    first_wait_s: float = 0.0
    wait_p50_s: float | None = None
    wait_p95_s: float | None = None
    wait_p99_s: float | None = None
    wait_histogram: tuple[int, ...] = field(default=(), repr=False, compare=False)
    # seconds a read spent decoding (clips decode inside their read: not storage time)
    decode_s: float = 0.0
    # Ray actors (worker_type="ray"): the loop's time getting their results (pulling what was
    # not on this node yet, deserializing), and building it did itself while no actor was ready
    transfer_s: float = 0.0
    local_s: float = 0.0
    # cpu_budget= and tune= (engine/budget.py): the budget, what the loader used, the tuner's
    # choice and why (None: neither asked for)
    governor: str | None = None

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
        """The fields and derived rates as a JSON-safe dict (the wait histogram left out: it is
        ``wait_histogram``)."""
        d = asdict(self)
        del d["wait_histogram"]
        d["bottleneck"] = asdict(self.bottleneck)
        d.update(
            rows_per_s=self.rows_per_s,
            bytes_per_s=self.bytes_per_s,
            io_bandwidth=self.io_bandwidth,
            copy_hidden=self.copy_hidden,
            requests_per_1000_rows=self.requests_per_1000_rows,
        )
        return d

    def __str__(self) -> str:
        def pct(x: float) -> str:
            return f"{100 * x / self.wall_s:5.1f}%" if self.wall_s > 0 else "   - "

        cap = self.wall_s * max(1, self.workers)
        rows = [
            ("delivered", f"{self.rows:,} rows in {self.batches:,} batches, {self.wall_s:.2f} s"),
            ("throughput", f"{self.rows_per_s:,.0f} rows/s, {self.bytes_per_s / 1e6:,.1f} MB/s"),
            (
                "storage I/O",
                f"{self.io_bytes / 1e6:,.1f} MB, {self.io_iops:,} IOPS "
                f"({self.requests_per_1000_rows:,.1f} requests per 1,000 rows), "
                f"{self.io_bandwidth / 1e6:,.1f} MB/s while reading"
                + (
                    f"; {100 * self.rows_cached / self.rows_read:.0f}% of rows from the cache"
                    if self.rows_cached and self.rows_read
                    else ""
                )
                + (
                    f"; {self.cache_fills:,} pieces filled into the cache"
                    if self.cache_fills
                    else ""
                )
                + (
                    f"; {self.cache_damaged} damaged cache files dropped and read again"
                    if self.cache_damaged
                    else ""
                ),
            ),
            (
                "read",
                f"{self.read_s:.2f} s ({100 * self.read_s / cap:.0f}% of {self.workers} "
                f"worker{'s' if self.workers != 1 else ''})"
                if cap
                else "-",
            ),
            *(
                [
                    (
                        "decode",
                        f"{self.decode_s:.2f} s ({100 * self.decode_s / cap:.0f}% of workers"
                        "; clips, in their reads)"
                        if cap
                        else "-",
                    )
                ]
                if self.decode_s
                else []
            ),
            (
                "transform",
                f"{self.transform_s:.2f} s ({100 * self.transform_s / cap:.0f}% of workers)"
                if cap
                else "-",
            ),
            (
                "convert",
                f"{self.convert_s:.2f} s ({100 * self.convert_s / cap:.0f}% of workers)"
                if cap
                else "-",
            ),
            ("loop waited", f"{self.wait_s:.2f} s ({pct(self.wait_s).strip()} of wall time)"),
            ("loop worked", f"{self.step_s:.2f} s ({pct(self.step_s).strip()} of wall time)"),
            (
                "rows",
                f"read {self.rows_read:,} = delivered {self.rows:,} + skipped "
                f"{self.rows_skipped:,} + prefetched, not delivered {self.rows_undelivered:,}",
            ),
            ("queue", f"{self.queue_depth_mean:.1f} reads in flight on average"),
        ]
        if self.cache is not None:
            rows.append(("cache", self.cache))
        if self.wait_p50_s is not None:
            rows.insert(
                [k for k, _ in rows].index("loop worked") + 1,
                (
                    "wait per batch",
                    (
                        f"p50 {_ms(self.wait_p50_s)}, p95 {_ms(self.wait_p95_s)}, p99 "
                        f"{_ms(self.wait_p99_s)}; the first batch {_ms(self.first_wait_s)}"
                    ),
                ),
            )
        busy = "not measured" if self.cores_busy is None else f"{100 * self.cores_busy:.0f}% busy"
        mine = "" if self.process_cores is None else f", this process used {self.process_cores:.1f}"
        kind = f"{self.worker_type} " if self.worker_type else ""
        rows.append(
            (
                "cores",
                f"{self.cores} usable, {busy}{mine}; {self.workers} "
                f"{kind}worker{'s' if self.workers != 1 else ''}",
            )
        )
        if self.worker_type == "ray":
            rows.append(("remote", self._remote()))
        if self.copy_batches:
            hidden = (
                f"{100 * self.copy_hidden:.0f}% hidden behind the step"
                if self.copy_hidden is not None
                else "not timed"
            )
            rows.append(
                (
                    "device",
                    (
                        f"{self.copy_batches:,} batches, {self.copy_bytes / 1e6:,.1f} MB copied in "
                        f"{1000 * self.copy_s:,.1f} ms, {hidden}; up to {self.device_ahead_max} batches "
                        f"({self.device_ahead_bytes_max / 1e6:,.1f} MB) ahead, {self.copies_late:,} "
                        "copied on arrival"
                    ),
                )
            )
        if self.padding_fraction is not None:
            rows.append(
                (
                    "packing",
                    f"{100 * self.padding_fraction:.1f}% of the tokens of packed rows are padding",
                )
            )
        if self.governor:
            rows.append(("cpu budget, tuning", self.governor))
        for share in self.mix[-MIX_ROWS:]:  # the latest pieces of a mix's weights
            rows.append((f"mix from step {share.step}", str(share)))
        width = max(len(k) for k, _ in rows)
        lines = [f"{k:<{width}}  {v}" for k, v in rows]
        return "\n".join([*lines, str(self.bottleneck)])

    def _remote(self) -> str:
        """Ray actors: how busy they were building, what the results cost the loop."""
        built = self.read_s + self.decode_s + self.transform_s + self.convert_s
        cap = self.wall_s * self.workers
        busy = f" ({100 * built / cap:.0f}% of the actors' time)" if cap else ""
        local = f"; {self.local_s:.2f} s built here (no actor ready)" if self.local_s else ""
        return (
            f"actors built batches for {built:.2f} s{busy}; the loop got them in "
            f"{self.transfer_s:.2f} s (pull, deserialize) and waited {self.wait_s:.2f} s{local}"
        )


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{1e6 * seconds:,.0f} µs" if seconds < 1e-3 else f"{1000 * seconds:,.1f} ms"
