"""The CPU budget (``Loader(cpu_budget=...)``): the loader's CPU kept within a number of cores.

A :class:`Governor` (one per loader, kept across its epochs; pickles fresh) gates the start of
each read task (:class:`~lanceloader.engine.pool.Ordered` asks :meth:`Governor.admit` before
each ``submit``). Its contract:

* The loader's CPU (:class:`LoaderClock`) is its worker threads', Lance's own threads'
  (``lance*``: its reads and decode), and its worker processes' (``pool.pids``), read from
  ``/proc`` (elsewhere this whole process's CPU, which counts the trainer's too: stricter),
  plus the consumer thread's inside ``next()`` (finishing, placing, the bookkeeping).
  Ray actors run elsewhere: only their part here (Lance's threads, none of the actors') counts.
* A task is started only when the CPU used in the trailing ``WINDOW_S`` seconds, plus what the
  tasks in flight and this one will use (the mean CPU per task so far), stays within
  ``AIM × budget × WINDOW_S``. The time before the first task counts as used at the aimed rate
  (``AIM × budget``), so the start is paced like the rest (no burst of every worker at once)
  and a budget the loader stays under holds nothing back (counted at the full budget, every
  start waited a tenth of the window, 0.5 s, whatever the budget).
* Progress is never blocked: with tasks in flight a refused task waits for the next ``admit``
  (the consumer takes a result, then asks again); with none in flight ``admit`` sleeps until
  the window has room, at most ``WINDOW_S`` seconds, then starts it anyway. That wait is the
  loop's (the budget is then what limits the loader: :meth:`report` says so in ``stats()``).
* The tuner (:class:`~lanceloader.engine.tuning.Tuner`, on by default where the loader chose
  ``num_workers`` and ``prefetch``) bounds the tasks in flight further; it changes how many tasks run at once, never which tasks or in what order,
  so the batches are the same bytes as without it.

Example::

    >>> from lanceloader.engine.pool import Ordered
    >>> from lanceloader.engine.threads import ThreadPool
    >>> governor = Governor(cpu_budget=1.0)
    >>> pool = ThreadPool(lambda x: sum(range(x)), num_workers=4)
    >>> list(Ordered(pool, iter([10, 20, 30]), depth=4, gate=governor))
    [45, 190, 435]
    >>> governor.tasks
    3
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
import threading
import time
from collections import deque
from typing import Any

from lanceloader.engine.threads import WORKER_NAME
from lanceloader.engine.tuning import Tuner, tunes
from lanceloader.engine.verdict import Verdict

WINDOW_S = 5.0  # the budget holds over any window of this many seconds
SAMPLE_S = 0.02  # the clocks are read at most this often
AIM = 0.9  # the share of the budget the gate aims at
NEAR_BUDGET = 0.8  # the loader used this share of the budget or more: the budget limits it
HELD_SHARE = 0.25  # ... or the budget's holds were this share of the loop's wait or more
_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_LANCE_THREADS = (b"lance", b"tokio")  # comm of Lance's runtime threads (reads, decode)


def _proc_cpu(path: str) -> float | None:
    """utime + stime of a /proc ``stat`` file, in seconds (None: gone)."""
    try:
        with open(path, "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / _TICKS_PER_S


class LoaderClock:
    """The loader's CPU seconds so far, summed over the threads and processes that are its,
    each counted from when it was first seen (a thread or process that ended keeps what it
    used). Called from the consumer only."""

    def __init__(self) -> None:
        self._linux = os.path.isdir("/proc/self/task")
        self._last: dict[object, float] = {}  # thread or process -> its CPU when last read
        # thread id -> (Lance's, sure), for the threads listed last: a name is read at a thread's
        # first two sightings (a new thread may not have named itself yet), then kept
        self._lance: dict[int, tuple[bool, bool]] = {}
        self._first = True  # the first read is the baseline: what existed before counts 0
        self.total = 0.0
        self._fallback_at = time.process_time()

    @property
    def by_thread(self) -> bool:
        """Whether the loader's threads are told apart (Linux); else :meth:`read` is this whole
        process's CPU."""
        return self._linux

    def read(self, pids: list[int]) -> float:
        """The CPU seconds used since the first read (``pids``: the worker processes)."""
        if not self._linux:
            now = time.process_time()
            self.total += now - self._fallback_at
            self._fallback_at = now
            return self.total
        for key, path in self._sources(pids):
            cpu = _proc_cpu(path)
            if cpu is None:
                continue
            self.total += max(0.0, cpu - self._last.get(key, cpu if self._first else 0.0))
            self._last[key] = cpu
        self._first = False
        return self.total

    def _sources(self, pids: list[int]) -> list[tuple[object, str]]:
        workers = {t.native_id for t in threading.enumerate() if t.name.startswith(WORKER_NAME)}
        out: list[tuple[object, str]] = [(("pid", p), f"/proc/{p}/stat") for p in pids]
        lance: dict[int, tuple[bool, bool]] = {}  # names not read at every read: dozens
        for name in os.listdir("/proc/self/task"):
            tid = int(name)
            known = self._lance.get(tid)
            if known is None or not known[1]:
                mine = self._lance_thread(tid)
                known = (mine, mine or known is not None)
            lance[tid] = known
            if tid in workers or known[0]:
                out.append((("tid", tid), f"/proc/self/task/{tid}/stat"))
        self._lance = lance  # (a thread gone is forgotten: its id may come back as another)
        return out

    @staticmethod
    def _lance_thread(tid: int) -> bool:
        try:
            with open(f"/proc/self/task/{tid}/comm", "rb") as f:
                return f.read().startswith(_LANCE_THREADS)
        except OSError:
            return False


class Governor:
    """A loader's CPU budget (``cpu_budget`` cores, or None) and tuner (``tune``): gates the
    start of each task (:meth:`admit`), hears of the loop's waits (:meth:`delivered`, once a read),
    and says what it did (:meth:`report`). One per loader; used by the consumer thread only."""

    def __init__(self, cpu_budget: float | None = None, tune: bool = False) -> None:
        self.cpu_budget, self.tune = cpu_budget, tune
        self.tuner = Tuner() if tune else None
        self._clock = LoaderClock()
        self._samples: deque[tuple[float, float]] = deque()  # (wall, cumulative CPU)
        self._began = time.perf_counter()
        self._read_at = 0.0
        self.tasks = 0  # tasks taken back
        self.refused = 0  # times a task start was put off for the budget
        self.held_s = 0.0  # the consumer's waits for the budget (nothing in flight)
        self.worst = 0.0  # the most cores used over a full window, as sampled

    @classmethod
    def of(
        cls, cpu_budget: object, tune: object, num_workers: object = None, prefetch: object = None
    ) -> Governor | None:
        """The governor a loader's ``cpu_budget=`` and ``tune=`` ask for (None: neither), after
        checking them (each error names the keyword and what it takes); ``tune=None`` tunes
        when ``num_workers`` and ``prefetch`` were left to the loader (:func:`tunes`)."""
        if tune is not None and not isinstance(tune, bool):
            raise TypeError(
                f"tune must be True, False or None (the default: tune what the loader chose), "
                f"got the {type(tune).__name__} {tune!r}"
            )
        if cpu_budget is not None:
            if isinstance(cpu_budget, bool) or not isinstance(cpu_budget, numbers.Real):
                raise TypeError(
                    "cpu_budget must be a number of cores (e.g. cpu_budget=1.5) or None (no "
                    f"budget), got the {type(cpu_budget).__name__} {cpu_budget!r}"
                )
            if not (float(cpu_budget) > 0 and math.isfinite(cpu_budget)):
                raise ValueError(
                    f"cpu_budget must be > 0 cores (e.g. 0.5 or 2), or None, got {cpu_budget}"
                )
        tuned = tunes(tune, num_workers, prefetch)
        if cpu_budget is None and not tuned:
            return None
        return cls(None if cpu_budget is None else float(cpu_budget), tuned)

    def __reduce__(self) -> tuple[type, tuple[float | None, bool]]:
        return (Governor, (self.cpu_budget, self.tune))  # a copy starts with fresh clocks

    # --- the gate (Ordered, the consumer) ----------------------------------------------

    def admit(self, in_flight: int, depth: int, pool: Any) -> bool:
        """Whether to start one more task now, ``in_flight`` running of at most ``depth``.
        With none in flight it waits for the budget (at most ``WINDOW_S``) and says yes."""
        if self.tuner is not None and in_flight >= self.tuner.limit(depth):
            return False
        if self.cpu_budget is None:
            return True
        if not self._samples:  # the clocks' baseline, before the first task: its CPU counts
            self._used(pool)
        if in_flight and not self._room(in_flight, pool):
            self.refused += 1
            return False
        if not in_flight:
            self._wait_for_room(pool)
        return True

    def taken(self) -> None:
        """A task's result was taken (its CPU is in the clocks now)."""
        self.tasks += 1

    def delivered(self, waited_s: float, batches: int) -> None:
        """The loop got ``batches`` more batches after waiting ``waited_s`` in all (the tuner's
        evidence; a stream's first batch, which waited for the pool's start, left out), told
        once a read by the stream."""
        if self.tuner is not None:
            self.tuner.delivered(waited_s, self.refused, batches)

    def consumer_cpu(self, cpu_in: float) -> None:
        """Under a budget, per batch: the consumer's thread clock read ``cpu_in`` when the loop
        asked, and what it did for the batch since is the loader's CPU too, which the task costs
        include (a thread clock read costs a system call, 1.6 us here: only under a budget)."""
        self._clock.total += max(0.0, time.thread_time() - cpu_in)

    def _used(self, pool: Any) -> tuple[float, float]:
        """(now, the CPU used in the trailing window), sampling the clocks at most every
        ``SAMPLE_S``; the time before the first task counts as used at the aimed rate."""
        now = time.perf_counter()
        budget = self.cpu_budget or 0.0
        if now - self._read_at >= SAMPLE_S or not self._samples:
            total = self._clock.read(list(getattr(pool, "pids", []) or []))
            self._samples.append((now, total))
            self._read_at = now
        while len(self._samples) > 2 and self._samples[1][0] <= now - WINDOW_S:
            self._samples.popleft()
        start_t, start_cpu = self._samples[0]
        end_cpu = self._samples[-1][1]
        if now - start_t >= 1.0:  # the rate over a second or more (up to the window)
            self.worst = max(self.worst, (end_cpu - start_cpu) / (now - start_t))
        if start_t > now - WINDOW_S:  # the window reaches before the first sample
            before = AIM * budget * (start_t - max(now - WINDOW_S, self._began - WINDOW_S))
            return now, end_cpu - start_cpu + max(0.0, before)
        return now, end_cpu - start_cpu

    def _room(self, in_flight: int, pool: Any) -> bool:
        if not self.tasks:  # no cost known yet: one task at a time
            return False
        _, used = self._used(pool)
        per_task = self._clock.total / self.tasks
        return used + (in_flight + 1) * per_task <= self._allowed()

    def _allowed(self) -> float:
        """The CPU seconds the window may hold (a margin under the budget for the clocks'
        ticks and the work between samples)."""
        return AIM * (self.cpu_budget or 0.0) * WINDOW_S

    def _wait_for_room(self, pool: Any) -> None:
        began = time.perf_counter()
        while time.perf_counter() - began < WINDOW_S and self.tasks:
            _, used = self._used(pool)
            per_task = self._clock.total / self.tasks
            if used + per_task <= self._allowed():
                break
            time.sleep(SAMPLE_S)
        self.held_s += time.perf_counter() - began

    # --- what it did (stats) -------------------------------------------------------------

    def report(self, wait_s: float, wall_s: float) -> str:
        """One line for ``stats()``: the budget, whether it held the loader back, the tuner's
        choice and why."""
        parts = []
        if self.cpu_budget is not None:
            used = self._clock.total / max(time.perf_counter() - self._began, 1e-9)
            parts.append(
                f"budget {self.cpu_budget:g} cores: the loader used {used:.2f} on average since it "
                f"was built, "
                f"{self.worst:.2f} at most over a window of 1-{WINDOW_S:g} s; "
                f"{self.refused:,} task starts put off, {self.held_s:.2f} s held"
            )
        if self.tuner is not None:
            parts.append(self.tuner.report())
        return "; ".join(parts)

    def into(self, stats: Any) -> Any:
        """``stats`` (a :class:`~lanceloader.engine.summary.Stats`) with this governor's line,
        and the verdict naming the budget when it held the loader back."""
        line = self.report(stats.wait_s, stats.wall_s)
        held = self.held_back(stats.wait_s, stats.wall_s)
        if held is None:
            return dataclasses.replace(stats, governor=line)
        advice = Verdict(
            "CPU budget",
            held,
            f"a larger cpu_budget= (now {self.cpu_budget:g}), or a lighter transform; the "
            "budget trades the loader's speed for the trainer's cores",
        )
        return dataclasses.replace(stats, governor=line, bottleneck=advice)

    def held_back(self, wait_s: float, wall_s: float) -> str | None:
        """The verdict's line when the budget is what limited the loader: the loop waited at
        least 1% of the time, and the loader came near the budget over a window with tasks put
        off, or the budget's holds were ``HELD_SHARE`` of the loop's wait or more (a hold of
        0.1 s in a 2 s wait for process workers' start is not the limit); else None."""
        if self.cpu_budget is None or wall_s <= 0 or wait_s / wall_s < 0.01:
            return None
        near = self.refused and self.worst >= NEAR_BUDGET * self.cpu_budget
        if not near and self.held_s < HELD_SHARE * wait_s:
            return None  # put off only at the start, or far under the budget: not the limit
        share = wait_s / wall_s
        return (
            f"the CPU budget ({self.cpu_budget:.1f} cores) held the loader back: the loop "
            f"waited {100 * share:.0f}%"
        )
