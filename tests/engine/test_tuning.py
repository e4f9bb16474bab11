"""The tuner's rule (engine/tuning.py), on a clock of the test's own: no timed assertion."""

from __future__ import annotations

from lanceloader.engine.tuning import PERIOD_BATCHES, PERIOD_S, Tuner


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def periods(tuner: Tuner, clock: Clock, n: int, wait_share: float, refused: int = 0) -> None:
    """``n`` periods of ``PERIOD_BATCHES`` batches over ``PERIOD_S``, the loop waiting
    ``wait_share`` of the time."""
    per_batch = PERIOD_S / PERIOD_BATCHES
    for _ in range(n):
        for _ in range(PERIOD_BATCHES):
            clock.now += per_batch
            tuner.delivered(wait_share * per_batch, refused)


def test_a_waiting_loop_grows_the_reads_to_the_depth_and_settles() -> None:
    clock = Clock()
    tuner = Tuner(clock)
    assert tuner.limit(depth=4) == 1
    for share in (0.4, 0.2, 0.1):  # each read more halves the wait
        periods(tuner, clock, 1, wait_share=share)
    assert (tuner.limit(4), tuner.settled) == (4, False)
    periods(tuner, clock, 1, wait_share=0.05)
    assert tuner.settled and "all the prefetch depth (4) in use" in tuner.report()


def test_a_read_more_that_does_not_cut_the_wait_is_given_back() -> None:
    """A wait the reads cannot cut (the hand-off, a busy machine) does not grow them to the
    depth: the tuner keeps the read count before the one that did not help."""
    clock = Clock()
    tuner = Tuner(clock)
    tuner.limit(depth=8)
    for share in (0.3, 0.05, 0.045):  # 1 -> 2 helped, 2 -> 3 did not
        periods(tuner, clock, 1, wait_share=share)
    assert (tuner.limit(8), tuner.settled) == (2, True)
    assert "a read more did not cut the wait" in tuner.report()
    periods(tuner, clock, 3, wait_share=0.06)  # no worse than it settled at: stays
    assert tuner.limit(8) == 2


def test_a_large_wait_keeps_the_reads_growing_through_a_noisy_period() -> None:
    clock = Clock()
    tuner = Tuner(clock)
    tuner.limit(depth=8)
    for share in (0.3, 0.2, 0.25):  # 2 -> 3 looked no better, but the loop still waits 25%
        periods(tuner, clock, 1, wait_share=share)
    assert (tuner.limit(8), tuner.settled) == (4, False)


def test_a_fed_loop_settles_at_the_fewest_reads() -> None:
    clock = Clock()
    tuner = Tuner(clock)
    tuner.limit(depth=8)
    periods(tuner, clock, 1, wait_share=0.3)  # 1 -> 2
    periods(tuner, clock, 2, wait_share=0.0)
    assert (tuner.limit(8), tuner.settled) == (2, True)
    assert tuner.report().startswith("tuner chose 2 read(s) in flight")
    periods(tuner, clock, 1, wait_share=0.5)  # one bad period after settling: stays
    assert tuner.limit(8) == 2
    periods(tuner, clock, 1, wait_share=0.5)  # two in a row: one more
    assert tuner.limit(8) == 3


def test_the_budget_stops_the_growth() -> None:
    clock = Clock()
    tuner = Tuner(clock)
    tuner.limit(depth=8)
    periods(tuner, clock, 1, wait_share=0.3, refused=5)
    assert (tuner.limit(8), tuner.settled) == (1, True)
    assert "the CPU budget is the limit" in tuner.report()
    for refused in (9, 13, 17, 21):  # still held by the budget (more starts put off): no more
        periods(tuner, clock, 1, wait_share=0.3, refused=refused)
    assert tuner.limit(8) == 1
    periods(tuner, clock, 2, wait_share=0.7, refused=21)  # no budget hold, twice the wait
    assert tuner.limit(8) == 2
