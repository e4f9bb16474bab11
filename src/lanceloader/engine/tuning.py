"""Self-tuning (``Loader(tune=True)``): the fewest reads in flight that keep the loop fed.

A :class:`Tuner` (held by the loader's :class:`~lanceloader.engine.budget.Governor`, kept
across epochs) bounds how many read tasks run at once, from 1 up to the stream's depth
(``prefetch`` in reads). It starts at 1 (the least CPU and memory: one worker busy) and, every
period of at least ``PERIOD_S`` seconds and ``PERIOD_BATCHES`` batches, looks at the share of
the period the loop waited for batches (each stream's first batch, the pool's start, is left
out):

* above ``WAIT_SHARE`` (1%), one more read in flight, unless all are already (the depth is
  the limit) or the CPU budget put task starts off in the period (the budget is the limit);
  when the last read added cut a small wait (at most ``SMALL_WAIT``) by less than ``MIN_GAIN``
  of it, it goes back to one read fewer and settles (the wait is the hand-off to the loop, or the machine, not too few
  reads);
* at or below it for ``SETTLE_PERIODS`` periods in a row, it settles there;
* it settles anyway after ``TUNE_S`` seconds;
* settled, it keeps watching: above the aim and twice the wait it settled at, for
  ``SETTLE_PERIODS`` periods in a row (the machine got busier, the data slower), one more
  read in flight (never fewer: a read less
  would only be tried at the loop's expense).

It changes only how many tasks run at once, never which tasks or their order: the batches,
their rows and their random draws (``random_map``) are those of any fixed setting, and a
state resumes the same. Thread and process pools keep their workers; the ones not needed sit
idle (no CPU).

>>> tuner = Tuner()
>>> tuner.limit(depth=8)
1
"""

from __future__ import annotations

import time
from collections.abc import Callable

WAIT_SHARE = 0.01  # the exposed wait it aims under
PERIOD_S = 0.5  # a period lasts at least this long ...
PERIOD_BATCHES = 4  # ... and this many batches
SETTLE_PERIODS = 2  # periods in a row under the aim before it settles
TUNE_S = 60.0  # it settles after this long whatever it saw
MIN_GAIN = 0.25  # a read more must cut the loop's wait by this share of it to be kept ...
SMALL_WAIT = 0.05  # ... when the wait was this share or less (a larger one: reads are short)


class Tuner:
    """How many reads to keep in flight, grown from 1 while the loop waits (see the module
    text). Used by the consumer thread only."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock  # (a test's own clock)
        self.active = 1
        self.settled = False
        self.why = "tuning: no batch delivered yet"
        self._began = clock()
        self._period_at = self._began
        self._waited = 0.0
        self._batches = 0
        self._calm = 0
        self._refused_at = 0
        self._depth = 1
        self._before: float | None = None  # the wait share with one read fewer
        self._settled_share = 0.0

    def limit(self, depth: int) -> int:
        """The most tasks in flight now (at most ``depth``)."""
        self._depth = depth
        return min(self.active, depth)

    def delivered(self, waited_s: float, refused: int) -> None:
        """A batch reached the loop after ``waited_s``; ``refused``: the budget's count of task
        starts put off so far."""
        self._waited += waited_s
        self._batches += 1
        now = self._clock()
        span = now - self._period_at
        if span < PERIOD_S or self._batches < PERIOD_BATCHES:
            return
        share = self._waited / span
        budget_held = refused > self._refused_at
        self._period_at, self._waited, self._batches = now, 0.0, 0
        self._refused_at = refused
        self._step(share, budget_held, now)

    def _step(self, share: float, budget_held: bool, now: float) -> None:
        at = f"the loop waited {100 * share:.1f}% with {self.active} read(s) in flight"
        if self.settled:
            self._watch(share, budget_held, at)
            return
        if share <= WAIT_SHARE:
            self._calm += 1
            if self._calm >= SETTLE_PERIODS:
                self._settle(f"{at}: under the {100 * WAIT_SHARE:g}% aim", share)
            return
        self._calm = 0
        before = self._before
        if before is not None and before <= SMALL_WAIT and share > (1 - MIN_GAIN) * before:
            self.active -= 1
            self._settle(
                f"{at}, {100 * before:.1f}% with {self.active}: a read more did not cut the "
                "wait (the hand-off to the loop, or the machine, is the limit)",
                before,
            )
        elif budget_held:
            self._settle(f"{at}: the CPU budget is the limit", share)
        elif self.active >= self._depth:
            self._settle(f"{at}: all the prefetch depth ({self._depth}) in use", share)
        elif now - self._began >= TUNE_S:
            self._settle(f"{at}: tuning time ({TUNE_S:g} s) over", share)
        else:
            self._before = share
            self.active += 1
            self.why = f"tuning: {at}, trying {self.active}"

    def _watch(self, share: float, budget_held: bool, at: str) -> None:
        """Settled: one more read when the loop waits above the aim period after period."""
        worse = share > max(WAIT_SHARE, 2 * self._settled_share)
        self._calm = self._calm - 1 if worse else 0
        if self._calm > -SETTLE_PERIODS or budget_held or self.active >= self._depth:
            return
        self._calm = 0
        self.active += 1
        self.why = f"{at}, so one more later on"

    def _settle(self, why: str, share: float) -> None:
        self.settled, self._calm, self._settled_share = True, 0, share
        self.why = why

    def report(self) -> str:
        """What the tuner chose and why (a line of ``stats()``)."""
        state = "chose" if self.settled else "tuning, at"
        return f"tuner {state} {self.active} read(s) in flight ({self.why})"
