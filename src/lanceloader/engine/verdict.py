"""The verdict: which stage limits the pipeline, the numbers behind it, and what to try.

A pure function of an epoch's (or a run's) counters (:mod:`lanceloader.engine.stats` records
them) and of where the workers ran (:class:`Machine`: workers, worker type, usable cores and how
busy they were, all measured or configured, never guessed). Its rules, each a constant below:

- the training loop is the limit when it waited less than ``LOOP_WAIT_SHARE`` of the wall time;
- a worker stage (read, decode, transform, convert) is blamed only when it took at least
  ``STAGE_SHARE`` of the workers' time; otherwise the verdict is ``startup`` (the first batch)
  or ``hand-off`` (between the workers and the loop);
- more workers are advised only when cores were idle (``IDLE_SHARE``);
- a setting already in place (``worker_type``) is never advised.

>>> from lanceloader.engine.stats import new_counters
>>> c = new_counters()
>>> c.update(batches=10, wall_s=1.0, wait_s=0.05)
>>> verdict(c, workers=2, shuffle_random=False).stage
'training loop'
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Verdict:
    """The stage that limits throughput, the numbers behind it, and what to try."""

    stage: str
    evidence: str
    suggestion: str

    def __str__(self) -> str:
        return f"bottleneck: {self.stage} ({self.evidence}). Try: {self.suggestion}"


# Read time per storage request above which reading is latency-bound: local disks answer in
# well under a millisecond, object stores in tens of milliseconds.
LATENCY_BOUND_S = 0.005
# ... and only for requests of less than this on average: a big request is slow because of its
# size (bandwidth), not the latency.
SMALL_REQUEST_BYTES = 1 << 20
# The loop waited less than this share of the wall time: the loader keeps up.
LOOP_WAIT_SHARE = 0.1
# A stage is blamed only when it took at least this share of the workers' time (wall time × the
# workers that had a read): below it the workers sat idle while the loop waited, and the stage
# is not the limit.
STAGE_SHARE = 0.5
# The usable cores count as idle when at least this share of their time was idle (any process).
IDLE_SHARE = 0.25
# The first batch's wait counts as the limit when it is at least this share of the loop's wait.
STARTUP_SHARE = 0.5
# Ray actors: the loop spent at least this share of its wait getting their results (pulling
# them to this node, deserializing): the network, not the actors, is the limit.
TRANSFER_SHARE = 0.5
# Thread workers busy in a transform while this process used between these many cores: they
# took turns on the GIL (a transform that sleeps or waits on I/O uses far less than one core).
GIL_CORES = (0.75, 1.3)


@dataclass(frozen=True)
class Machine:
    """What the verdict knows of where the workers ran (all measured or configured, never
    guessed): ``worker_type`` is ``None`` when the caller did not say."""

    workers: int
    worker_type: str | None
    cores: int
    cores_busy: float | None  # share of the usable cores' time busy (any process); None: unmeasured
    process_cores: float | None  # cores this process used on average; None: unmeasured

    @property
    def cores_idle(self) -> bool:
        """Measured idle cores; unmeasured, fewer workers than cores."""
        if self.cores_busy is None:
            return self.workers < self.cores
        return 1.0 - self.cores_busy >= IDLE_SHARE

    def idle_note(self) -> str:
        if self.cores_busy is None:
            return f"{self.workers} workers on {self.cores} cores"
        return f"the {self.cores} cores were {100 * (1 - self.cores_busy):.0f}% idle"

    def more_workers(self, cpu_bound: bool) -> str | None:
        """``num_workers`` advice, only when cores are idle; a CPU-bound stage on process
        workers never gets more processes than cores (they would take turns on them)."""
        if not self.cores_idle:
            return None
        if cpu_bound and self.worker_type == "process":
            if self.workers >= self.cores:
                return None
            return (
                f"num_workers={self.cores} ({self.idle_note()} with {self.workers} process workers)"
            )
        return (
            f"more workers than {self.workers}, e.g. num_workers={2 * self.workers} "
            f"({self.idle_note()})"
        )

    @property
    def gil_bound(self) -> bool:
        """Several thread workers, one core's worth of CPU in this process, and idle cores
        (measured: on cores that other processes keep busy, one core is all there is): the
        threads take turns on the GIL."""
        return (
            self.worker_type != "process"
            and self.workers >= 2
            and self.cores >= 2
            and self.process_cores is not None
            and self.cores_busy is not None
            and self.cores_idle
            and GIL_CORES[0] <= self.process_cores <= GIL_CORES[1]
        )


def _seconds_per_request(s: dict[str, float]) -> float:
    return s["read_s"] / s["io_iops"] if s.get("io_iops") else 0.0


def _try(*parts: str | None) -> str:
    return "; ".join(p for p in parts if p)


def verdict(
    s: dict[str, float],
    workers: int,
    shuffle_random: bool,
    worker_type: str | None = None,
    cores: int | None = None,
    cache: str | None = None,
) -> Verdict:
    """Name the limiting stage from an epoch's (or a run's) counters, and what to try.

    Rules: the training loop is the limit when it waited less than ``LOOP_WAIT_SHARE`` of the
    wall time; a worker stage (read, decode, transform, convert) is blamed only when it took at least
    ``STAGE_SHARE`` of the workers' time (wall × the workers that had a read); otherwise the workers sat idle while
    the loop waited, and the verdict is ``startup`` (the first batch's wait) or ``hand-off``.
    More workers are advised only when cores were idle (measured; unmeasured: fewer workers
    than cores); a setting already in place (``worker_type``) is never advised.

    >>> from lanceloader.engine.stats import new_counters
    >>> c = new_counters()
    >>> c.update(batches=10, wall_s=1.0, wait_s=0.9, transform_s=0.03, read_s=0.01)
    >>> verdict(c, workers=2, shuffle_random=False, worker_type="process").stage
    'hand-off'
    """
    wall = s["wall_s"]
    if wall <= 0 or s["batches"] == 0:
        return Verdict("none yet", "no batches delivered", "iterate over the loader first")
    waited = s["wait_s"] / wall
    if waited < LOOP_WAIT_SHARE:
        return Verdict(
            "training loop",
            f"the loop waited for data {100 * waited:.0f}% of the time",
            "nothing to gain in the loader; speed up the model step or use more devices",
        )
    machine = Machine(
        max(1, workers), worker_type, cores or usable_cores(), cores_busy(s), process_cores(s)
    )
    # the workers' time: wall time × the workers that had a read (an epoch of one read keeps
    # one worker busy, however many there are)
    capacity = wall * max(1, min(machine.workers, int(s.get("depth_samples", 0))))
    shares = {
        k: s.get(f"{k}_s", 0.0) / capacity for k in ("read", "decode", "transform", "convert")
    }
    stage = max(shares, key=lambda k: shares[k])
    evidence = f"the loop waited {100 * waited:.0f}% of the time; workers spent " + ", ".join(
        f"{100 * v:.0f}% of their time in {k}" for k, v in shares.items() if k != "decode" or v
    )
    if machine.worker_type == "ray":  # other machines' cores: this one's say nothing
        return _remote_verdict(s, machine, sum(shares.values()), evidence)
    if shares[stage] < STAGE_SHARE:
        return _idle_workers(s, machine, evidence)
    if stage == "read":
        return _read_verdict(s, machine, evidence, shuffle_random, cache)
    if stage == "decode":
        return Verdict(
            "decode",
            evidence,
            _try(
                machine.more_workers(cpu_bound=True),
                f"worker_type='process' (num_workers={machine.cores})"
                if machine.gil_bound
                else None,
                "decode less per sample: a smaller video_clips(size=...), fewer frames= or a "
                "larger stride=; for audio a lower sample_rate= or shorter seconds=",
            ),
        )
    if stage == "transform":
        if machine.gil_bound:
            return Verdict(
                "decode/transform",
                f"{evidence}; this process used {machine.process_cores:.1f} cores while "
                f"{machine.workers} thread workers transformed: they took turns on the GIL",
                _try(
                    f"worker_type='process' (num_workers={min(machine.workers, machine.cores)})",
                    "or run the transform once and store its result in Lance",
                ),
            )
        return Verdict(
            "decode/transform",
            evidence,
            _try(
                machine.more_workers(cpu_bound=True),
                "make the transform cheaper, or run it once and store its result in Lance",
            ),
        )
    return Verdict(
        "conversion",
        evidence,
        _try(
            "read fewer columns, use output='arrow', or avoid string/ragged columns",
            machine.more_workers(cpu_bound=True),
        ),
    )


def _read_verdict(
    s: dict[str, float],
    machine: Machine,
    evidence: str,
    shuffle_random: bool,
    cache: str | None = None,
) -> Verdict:
    """The verdict when reads were the limit; ``cache`` is what the loader's cache is and why
    (``Source.cache_choice``): an automatic cache that did not fit is named with the fix."""
    if s.get("rows_cached", 0) >= 0.9 * max(1, s["rows_read"]):
        return Verdict(
            "cache reads",
            f"{evidence}, {100 * s['rows_cached'] / s['rows_read']:.0f}% of rows from the cache",
            _try(
                machine.more_workers(cpu_bound=True),
                None
                if cache and "/dev/shm" in cache
                else "if the cache is a directory on disk: cache='memory' (thread workers) or a "
                "directory on /dev/shm reads faster when the data fits in RAM",
            )
            or (
                "every row already comes from memory: a shuffle that reads rows together "
                "(shuffle_block_size > 1) or more cores read faster"
                if shuffle_random
                else "more cores read faster; the cache serves every row"
            ),
        )
    small_requests = s["io_bytes"] < SMALL_REQUEST_BYTES * max(1, s.get("io_iops", 0))
    more = machine.more_workers(cpu_bound=False)
    if small_requests and _seconds_per_request(s) > LATENCY_BOUND_S:
        return Verdict(
            "storage latency",
            f"{evidence}; each storage request took {1000 * _seconds_per_request(s):.0f} ms of "
            f"read time ({s['io_bytes'] / max(1, s['io_iops']) / 1e3:,.0f} KB on average)",
            _try(
                "make each request carry more rows: a block shuffle (shuffle_block_size=1024) "
                "instead of a full shuffle"
                if shuffle_random
                else None,
                "bigger reads (rows_per_read)",
                f"keep more requests in flight: {more}" if more else None,
                None if s.get("rows_cached", 0) else _cache_advice(cache),
            ),
        )
    if shuffle_random:
        return Verdict(
            "storage I/O",
            evidence,
            _try(
                "use a block shuffle (shuffle_block_size=1024) instead of a full shuffle, or "
                "materialise a shuffled copy",
                more,
            ),
        )
    return Verdict(
        "storage I/O",
        evidence,
        _try(
            "raise rows_per_read",
            more,
            "on object storage, more requests in flight hide latency" if more else None,
        ),
    )


def _remote_verdict(s: dict[str, float], machine: Machine, busy: float, evidence: str) -> Verdict:
    """The loop waited for Ray actors: were they busy (more actors help), was the network
    the limit (the loop's time getting their results), or were they starting?

    >>> from lanceloader.engine.stats import new_counters
    >>> c = new_counters()
    >>> c.update(batches=9, wall_s=1.0, wait_s=0.8, transform_s=1.8, depth_samples=9)
    >>> verdict(c, workers=2, shuffle_random=False, worker_type="ray").stage
    'remote workers'
    >>> c.update(transform_s=0.2, transfer_s=0.6)
    >>> verdict(c, workers=2, shuffle_random=False, worker_type="ray").stage
    'network'
    >>> c.update(transfer_s=0.0, local_s=0.7)  # every batch built here: no actor up yet
    >>> verdict(c, workers=2, shuffle_random=False, worker_type="ray").stage
    'startup'
    """
    n, wait = machine.workers, s["wait_s"]
    if busy >= STAGE_SHARE:
        return Verdict(
            "remote workers",
            f"{evidence}: the {n} Ray actors were building batches {100 * busy:.0f}% of the time",
            f"more actors, e.g. num_workers={2 * n} (the cluster needs their ray_options free: "
            "`ray status`), or a cheaper transform",
        )
    transfer = s.get("transfer_s", 0.0)
    if transfer >= TRANSFER_SHARE * wait:
        return Verdict(
            "network",
            f"{evidence}; the loop spent {transfer:.2f} s of its {wait:.2f} s wait getting the "
            "actors' results (pulling them to this node, deserializing)",
            "fewer bytes per batch: uint8 rather than float32 images, crop or resize in the "
            "transform, fewer columns; actors on nodes nearer the trainer; more actors would "
            "not help",
        )
    if s.get("first_wait_s", 0.0) >= STARTUP_SHARE * wait:
        return Verdict(
            "startup",
            f"{evidence}; the first batch took {s['first_wait_s']:.2f} s of the {wait:.2f} s "
            "the loop waited (Ray actors starting: imports, the dataset opened, the first read)",
            "paid once per loader (its actors are kept across epochs): longer runs amortise it",
        )
    if s.get("local_s", 0.0) >= STARTUP_SHARE * wait:  # the loop built batches: actors starting
        return Verdict(
            "startup",
            f"{evidence}; the loop built batches itself for {s['local_s']:.2f} s of its "
            f"{wait:.2f} s wait while no Ray actor was ready yet (actors starting: imports, the "
            "dataset opened)",
            "paid once per loader (its actors are kept across epochs): longer runs amortise it",
        )
    return Verdict(
        "hand-off",
        f"{evidence}: the actors were mostly idle and the loop still waited "
        f"({s.get('local_s', 0.0):.2f} s building batches itself while no actor was ready)",
        "raise prefetch so that every actor has reads queued; check the network between nodes",
    )


def _idle_workers(s: dict[str, float], machine: Machine, evidence: str) -> Verdict:
    """The loop waited, but no stage kept the workers busy: the wait is elsewhere."""
    first, wait = s.get("first_wait_s", 0.0), s["wait_s"]
    if first >= STARTUP_SHARE * wait:
        starting = "worker processes to start and " if machine.worker_type == "process" else ""
        return Verdict(
            "startup",
            f"{evidence}; the first batch took {first:.2f} s of the {wait:.2f} s the loop "
            f"waited (the {starting}first read)",
            _try(
                "paid once per iter(): longer epochs amortise it",
                "worker_type='thread' starts no processes (when the transform releases the "
                "GIL or is cheap)"
                if machine.worker_type == "process"
                else None,
            ),
        )
    depth = s["depth_sum"] / s["depth_samples"] if s.get("depth_samples") else 0.0
    if machine.worker_type == "process":
        return Verdict(
            "hand-off",
            f"{evidence}: batches wait on their way from the worker processes to the loop "
            "(shared memory, unpickling, tensors made in the loop)",
            "with a transform this cheap, worker_type='thread' skips the trip between processes",
        )
    if depth < machine.workers:
        return Verdict(
            "hand-off",
            f"{evidence}; {depth:.1f} reads in flight on average for {machine.workers} workers",
            "raise prefetch so that every worker has a read",
        )
    return Verdict(
        "hand-off",
        f"{evidence}: the time goes between the workers and the loop",
        "look at the timeline (loader.trace(path)) for the gaps between a worker's "
        "read and the loop's batch",
    )


def usable_cores() -> int:
    """The cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def cores_busy(c: dict[str, float]) -> float | None:
    """The share of the usable cores' time that was busy (any process) while the loader ran;
    ``None`` when unmeasured (not Linux, or under 0.1 core-seconds sampled)."""
    return c["cores_busy_s"] / c["cores_all_s"] if c.get("cores_all_s", 0) >= 0.1 else None


def process_cores(c: dict[str, float]) -> float | None:
    """Cores this process (consumer and thread workers) used on average while the loader ran;
    ``None`` under 50 ms sampled."""
    return c["cpu_s"] / c["cpu_wall_s"] if c.get("cpu_wall_s", 0) >= 0.05 else None


def _cache_advice(cache: str | None) -> str:
    """What to try about the cache when reads waited on storage and none came from a cache.

    >>> _cache_advice("auto: none (the projected columns (~9 GB) exceed the budget (4 GB))")
    "cache=, a local directory (or 'memory'), so that later epochs read locally (the automatic cache chose none: the projected columns (~9 GB) exceed the budget (4 GB))"
    """
    advice = "cache=, a local directory (or 'memory'), so that later epochs read locally"
    if cache and cache.startswith("auto: none (") and cache.endswith(")"):
        return f"{advice} (the automatic cache chose none: {cache[len('auto: none (') : -1]})"
    return advice
