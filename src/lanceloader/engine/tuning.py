"""Self-tuning (on by default, see :func:`tunes`): the fewest reads in flight that keep the loop fed.

A :class:`Tuner` (held by the loader's :class:`~lanceloader.engine.budget.Governor`, kept
across epochs) bounds how many read tasks run at once, at most the stream's depth (``prefetch``
in reads). It starts at the depth, where a fixed setting runs (so it is never slower at the
start, and a loop that the loader cannot keep fed runs exactly as without it), and, every period
of at least ``PERIOD_S`` seconds and ``PERIOD_BATCHES`` batches, looks at the share of the
period the loop waited for batches (each stream's first batch, the pool's start, is left out):

* at or below ``WAIT_SHARE`` (1%) for ``SETTLE_PERIODS`` periods in a row, one read fewer in
  flight (down to 1, where it settles);
* above it just after a read was given up, that read back, and it settles there (the fewest
  reads that kept the loop fed);
* above it with no read given up yet (the loader is the limit at the full depth), nothing
  changes: it keeps looking (a cache filling, a slow start) until ``TUNE_S`` seconds, then
  settles;
* settled, it keeps watching: above the aim and twice the wait it settled at, for
  ``SETTLE_PERIODS`` periods in a row (the machine got busier, the data slower), one more read
  in flight, up to the depth and unless the CPU budget put task starts off (the budget is the
  limit then, not the reads).

It changes only how many tasks run at once, never which tasks or their order: the batches,
their rows and their random draws (``random_map``) are those of any fixed setting, and a state
resumes the same. Thread and process pools keep their workers; the ones not needed sit idle.

>>> tuner = Tuner()
>>> tuner.limit(depth=8)
8
>>> tunes(True, num_workers=4, prefetch=8), tunes(None, None, None), tunes(None, 4, None)
(True, True, False)
"""

from __future__ import annotations

import time
from collections.abc import Callable

WAIT_SHARE = 0.01  # the exposed wait it aims under
PERIOD_S = 0.5  # a period lasts at least this long ...
PERIOD_BATCHES = 4  # ... and this many batches
SETTLE_PERIODS = 2  # periods in a row under the aim before a read is given up
TUNE_S = 60.0  # it settles after this long whatever it saw


def tunes(tune: bool | None, num_workers: object, prefetch: object) -> bool:
    """Whether a loader tunes: ``tune=True`` or ``False`` as given; ``None`` (the default):
    only when the user left both ``num_workers`` and ``prefetch`` to the loader (an explicit
    number is run as given, as a DataLoader's ``num_workers`` and ``prefetch_factor`` are)."""
    if tune is not None:
        return tune
    return num_workers is None and prefetch is None


class Tuner:
    """How many reads to keep in flight, given up one at a time from the depth while the loop
    stays fed (see the module text). Used by the consumer thread only."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock  # (a test's own clock)
        self.active: int | None = None  # the depth until the first stream asks
        self.settled = False
        self.why = f"no period measured yet: one takes {PERIOD_S:g} s and {PERIOD_BATCHES} batches"
        self._began = clock()
        self._period_at = self._began
        self._waited = 0.0
        self._batches = 0
        self._calm = 0
        self._refused_at = 0
        self._depth = 1
        self._shed = False  # the last change gave up a read
        self._settled_share = 0.0

    def limit(self, depth: int) -> int:
        """The most tasks in flight now (at most ``depth``)."""
        self._depth = depth
        if self.active is None:
            self.active = depth
        return min(self.active, depth)

    def delivered(self, waited_s: float, refused: int, batches: int = 1) -> None:
        """``batches`` batches reached the loop after ``waited_s`` in all; ``refused``: the
        budget's count of task starts put off so far."""
        self._waited += waited_s
        self._batches += batches
        now = self._clock()
        span = now - self._period_at
        if span < PERIOD_S or self._batches < PERIOD_BATCHES or self.active is None:
            return
        share = self._waited / span
        budget_held = refused > self._refused_at
        self._period_at, self._waited, self._batches = now, 0.0, 0
        self._refused_at = refused
        self._step(share, budget_held, now, self.active)

    def _step(self, share: float, budget_held: bool, now: float, active: int) -> None:
        at = f"the loop waited {100 * share:.1f}% of the time with {active} in flight"
        aim = f"the {100 * WAIT_SHARE:g}% aim"
        if self.settled:
            self._watch(share, budget_held, at, active)
        elif share > WAIT_SHARE and self._shed:
            self.active = active + 1
            self._settle(f"{at}, over {aim}: back to {active + 1}", share)
        elif share > WAIT_SHARE:
            self._calm = 0
            if now - self._began >= TUNE_S:
                self._settle(f"{at}, over {aim}; its {TUNE_S:g} s of tuning over", share)
            else:
                self.why = f"{at}, over {aim}: none given up"
        else:
            self._calm += 1
            if self._calm < SETTLE_PERIODS:
                return
            if active <= 1:
                self._settle(f"{at}: under {aim}", share)
                return
            self._calm, self._shed, self.active = 0, True, active - 1
            self.why = f"{at}, under {aim}: trying {active - 1}"

    def _watch(self, share: float, budget_held: bool, at: str, active: int) -> None:
        """Settled: one more read when the loop waits above the aim period after period."""
        worse = share > max(WAIT_SHARE, 2 * self._settled_share)
        self._calm = self._calm - 1 if worse else 0
        if self._calm > -SETTLE_PERIODS or budget_held or active >= self._depth:
            return
        self._calm = 0
        self.active = active + 1
        self.why = f"{at}, over {100 * WAIT_SHARE:g}% again: one more"

    def _settle(self, why: str, share: float) -> None:
        self.settled, self._calm, self._settled_share = True, 0, share
        self.why = why

    def report(self) -> str:
        """What the tuner chose and why (a line of ``stats()``)."""
        reads = "all its" if self.active is None else f"{self.active} of {self._depth}"
        state = "settled on" if self.settled else "still measuring, at"
        return f"tuner {state} {reads} reads in flight ({self.why})"
