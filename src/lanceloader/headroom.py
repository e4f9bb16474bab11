"""Headroom: how much faster training would be with an infinitely fast loader.

Before buying CPUs (or tuning workers), a user needs one number: the share of the step that the
loader costs. :func:`headroom` measures it with the user's own step, in two phases on the same
batches:

1. **Fed**: ``steps`` steps of ``step_fn`` fed by the loader, as training runs them (after
   ``warmup`` steps, so the prefetch is full). Per step: the exposed wait (time blocked in
   ``next()``) and the step's own time (``step_fn``), which grows when the loader's threads and
   processes take CPU from the step.
2. **Floor**: the same batches replayed from memory into ``step_fn`` with the loader idle: the
   step's compute floor, what an infinitely fast loader that costs no CPU would give.

The report: ``speedup`` (fed wall / floor wall: how much faster training would be with a perfect
loader), the exposed wait's share of the fed wall, ``slowdown`` (how much the loader's CPU
slowed the step itself), the loader's CPU seconds per step, and a verdict in one line (the
loader is named only when the step waited and the floor is faster by as much: a floor slower
than the fed steps means the step's own time varied more than the loader cost).

Contract: runs in the calling thread; ``step_fn(batch)`` must return when the step is done
(call ``torch.cuda.synchronize()`` in it on a GPU) and must not keep the batch. The loader is
left where it was: its ``state_dict()`` is taken first and loaded back at the end, so the
measured batches are delivered again by the next ``iter(loader)`` (its ``stats()`` include the
measured steps). The batches are held in memory between the phases (``steps`` batches). CPU:
the loader's threads (its workers', Lance's: :class:`~lanceloader.engine.budget.LoaderClock`)
plus the calling thread's inside ``next()``, not the step's own threads (a torch step's intra-op
threads), plus the worker processes' where ``psutil`` is installed
(:attr:`Headroom.workers_counted`); without ``/proc`` (not Linux) this process's CPU less the
step's thread.

Example::

    >>> import tempfile, time
    >>> import lanceloader as ll
    >>> from lanceloader.demo import write_demo_dataset
    >>> uri = write_demo_dataset(tempfile.mkdtemp() + "/demo.lance", rows=2_000)
    >>> loader = ll.Loader(uri, batch_size=64, columns=["id"])
    >>> report = ll.headroom(loader, lambda batch: time.sleep(0.002), steps=10, warmup=2)
    >>> report.steps, report.speedup >= 0.5, loader.state_dict()["sample"]
    (10, True, 0)
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from lanceloader.arguments import check_int
from lanceloader.engine.budget import LoaderClock

WAIT_BOUND = 0.05  # an exposed wait above 5% of the fed wall makes the loader the limit
SLOWDOWN_BOUND = 0.05  # a step slowed by more than 5% by the loader's CPU: contention


@dataclass(frozen=True)
class Headroom:
    """What :func:`headroom` measured; times are seconds per step (medians over the steps;
    walls are totals divided by the steps, so a few long waits count in full)."""

    steps: int
    fed_step_s: float  # wall per step fed by the loader: wait + step
    floor_step_s: float  # wall per step replayed from memory: the compute floor
    wait_s: float  # exposed wait per step (time blocked in next())
    compute_fed_s: float  # median step_fn time while the loader ran
    compute_floor_s: float  # median step_fn time alone
    loader_cpu_s: float  # the loader's CPU seconds per step
    workers_counted: bool  # whether worker processes' CPU is in loader_cpu_s (needs psutil)

    @property
    def speedup(self) -> float:
        """How much faster training would run with an infinitely fast, free loader."""
        return self.fed_step_s / self.floor_step_s if self.floor_step_s > 0 else 1.0

    @property
    def wait_share(self) -> float:
        """The exposed wait's share of the fed wall (the accelerator's idle share)."""
        return self.wait_s / self.fed_step_s if self.fed_step_s > 0 else 0.0

    @property
    def slowdown(self) -> float:
        """How much the loader's CPU slowed the step itself (0.1: the step took 10% longer)."""
        if self.compute_floor_s <= 0:
            return 0.0
        return self.compute_fed_s / self.compute_floor_s - 1.0

    @property
    def verdict(self) -> str:
        """One line: what limits training, and what to do."""
        if self.wait_share > WAIT_BOUND and self.speedup > 1 + WAIT_BOUND:
            return (
                f"the loader: the step waits {self.wait_share:.0%} of the time; more workers, "
                "a cache or larger reads would help (print(loader.stats()) says which stage)"
            )
        if self.slowdown > SLOWDOWN_BOUND:
            return (
                f"CPU contention: the loader's CPU slows the step by {self.slowdown:.0%}; "
                "fewer workers (or process workers on other cores) would help"
            )
        return "the step: a faster loader would not speed training up"

    def _gain(self) -> str:
        if self.speedup >= 1:
            return f"{self.speedup:.2f}x faster"
        return (
            f"no faster (the replayed steps took {1 / self.speedup:.2f}x the fed ones: the "
            "step's own time varied more than the loader cost; measure more steps)"
        )

    def __str__(self) -> str:
        cpu = "" if self.workers_counted else " (this process only: install psutil for workers)"
        return "\n".join(
            [
                f"headroom over {self.steps} steps:",
                f"  step fed by the loader  {self.fed_step_s * 1e3:9.2f} ms",
                f"  step alone (floor)      {self.floor_step_s * 1e3:9.2f} ms",
                f"  exposed wait            {self.wait_s * 1e3:9.2f} ms ({self.wait_share:.1%})",
                f"  step slowed by loader   {self.slowdown:9.1%}",
                f"  loader CPU per step     {self.loader_cpu_s * 1e3:9.2f} ms{cpu}",
                f"  with an infinitely fast loader: {self._gain()}",
                f"  limit: {self.verdict}",
            ]
        )


def headroom(
    loader: Any, step_fn: Callable[[Any], Any], steps: int = 50, warmup: int = 5
) -> Headroom:
    """Measure ``step_fn`` fed by ``loader`` against the same batches replayed from memory
    (see the module docstring); the loader's position is restored afterwards.

    ``loader`` is a :class:`~lanceloader.Loader` (anything iterable with ``state_dict`` and
    ``load_state_dict``). Raises ``ValueError`` when the rest of the epoch has fewer than
    ``warmup + steps`` batches (name fewer steps, or call at the epoch's start)."""
    check_int("steps", steps, minimum=1)
    check_int("warmup", warmup, minimum=0)
    if not callable(step_fn):
        raise TypeError(f"step_fn must be callable (a function of one batch), got {step_fn!r}")
    if not (callable(getattr(loader, "state_dict", None)) and hasattr(loader, "load_state_dict")):
        raise TypeError(
            "headroom needs a loader it can put back where it was, with state_dict() and "
            f"load_state_dict(); got the {type(loader).__name__} {loader!r:.80}: pass the "
            "ll.Loader itself (for a torch DataLoader, an ll.Loader with the same settings, or "
            "its lanceloader.torch.IterableDataset)"
        )
    state = loader.state_dict()
    iterator = iter(loader)  # a live iterator is refused here, before anything moved
    try:
        batches, waits, computes, cpu = _fed(iterator, step_fn, steps, warmup)
    finally:
        loader.load_state_dict(state)
    floor = _floor(batches, step_fn)
    return Headroom(
        steps=steps,
        fed_step_s=(sum(waits) + sum(computes)) / steps,
        floor_step_s=sum(floor) / steps,
        wait_s=sum(waits) / steps,
        compute_fed_s=statistics.median(computes),
        compute_floor_s=statistics.median(floor),
        loader_cpu_s=max(cpu[0], 0.0) / steps,
        workers_counted=cpu[1],
    )


def _fed(
    iterator: Iterator[Any], step_fn: Callable[[Any], Any], steps: int, warmup: int
) -> tuple[list[Any], list[float], list[float], tuple[float, bool]]:
    """Phase 1: the batches, waits and step times of ``steps`` steps fed by ``iterator`` (closed
    here), and the loader's CPU seconds over them (whether worker processes are counted)."""
    needed = steps + warmup
    try:
        for got in range(warmup):
            step_fn(_next(iterator, needed, got))
        batches, waits, computes = [], [], []
        clock, in_next, step_cpu = LoaderClock(), 0.0, 0.0
        cpu_start = _cpu_seconds(clock)
        for got in range(warmup, needed):
            t0, c0 = time.perf_counter(), time.thread_time()
            batch = _next(iterator, needed, got)
            t1, c1 = time.perf_counter(), time.thread_time()
            step_fn(batch)
            computes.append(time.perf_counter() - t1)
            in_next += c1 - c0
            step_cpu += time.thread_time() - c1
            waits.append(t1 - t0)
            batches.append(batch)
        cpu_end = _cpu_seconds(clock)
    finally:
        close = getattr(iterator, "close", None)
        if close is not None:
            close()
    # by thread: the loader's threads plus the caller's inside next(); else the whole process
    # (next() included) less the step's thread
    mine = in_next if clock.by_thread else -step_cpu
    return batches, waits, computes, (cpu_end[0] - cpu_start[0] + mine, cpu_end[1])


def _next(iterator: Iterator[Any], needed: int, got: int) -> Any:
    try:
        return next(iterator)
    except StopIteration:
        raise ValueError(
            f"headroom needs {needed} batches (warmup + steps) but the rest of the loader's "
            f"epoch had {got}: pass fewer steps, or call it at the start of an epoch"
        ) from None


def _floor(batches: list[Any], step_fn: Callable[[Any], Any]) -> list[float]:
    """Phase 2: the step times of the same batches replayed from memory, the loader idle."""
    times = []
    for batch in batches:
        t0 = time.perf_counter()
        step_fn(batch)
        times.append(time.perf_counter() - t0)
    return times


def _cpu_seconds(clock: LoaderClock) -> tuple[float, bool]:
    """The loader's CPU seconds so far in this process (``clock``: its threads, or the whole
    process without ``/proc``) plus its live child processes' (with psutil), and whether
    children were counted."""
    own = clock.read([])
    try:
        import psutil
    except ImportError:
        return own, False
    children = 0.0
    for child in psutil.Process(os.getpid()).children(recursive=True):
        try:
            times = child.cpu_times()
        except psutil.Error:  # a child that ended between the listing and the read
            continue
        children += times.user + times.system
    return own + children, True
