"""The tuner's rule (engine/tuning.py), on a clock of the test's own: no timed assertion."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from lanceloader.engine.tuning import PERIOD_BATCHES, PERIOD_S, TUNE_S, WAIT_SHARE, Tuner, tunes


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


def test_it_starts_at_the_depth_a_fixed_setting_runs() -> None:
    tuner = Tuner(Clock())
    assert tuner.limit(depth=6) == 6
    assert tuner.report().startswith("tuner still measuring, at 6 of 6 reads in flight (no period")


def test_a_fed_loop_gives_up_reads_down_to_one() -> None:
    clock = Clock()
    tuner = Tuner(clock)
    tuner.limit(depth=4)
    for expected in (3, 2, 1):  # two fed periods, one read fewer
        periods(tuner, clock, 2, wait_share=0.0)
        assert (tuner.limit(4), tuner.settled) == (expected, False)
    periods(tuner, clock, 2, wait_share=0.0)
    assert (tuner.limit(4), tuner.settled) == (1, True)
    assert tuner.report().startswith("tuner settled on 1 of 4 reads in flight (the loop waited")


def test_the_read_whose_loss_made_the_loop_wait_is_taken_back() -> None:
    clock = Clock()
    tuner = Tuner(clock)
    tuner.limit(depth=8)
    periods(tuner, clock, 4, wait_share=0.005)  # fed at 8 and at 7: 6
    assert tuner.limit(8) == 6
    periods(tuner, clock, 1, wait_share=0.2)  # 6 leaves the loop waiting: back to 7
    assert (tuner.limit(8), tuner.settled) == (7, True)
    assert "over the 1% aim: back to 7" in tuner.report()
    periods(tuner, clock, 1, wait_share=0.5)  # one bad period after settling: stays
    assert tuner.limit(8) == 7
    periods(tuner, clock, 2, wait_share=0.5)  # two in a row: one more
    assert tuner.limit(8) == 8
    periods(tuner, clock, 4, wait_share=0.5)  # never past the depth
    assert tuner.limit(8) == 8


def test_a_waiting_loop_keeps_the_depth_and_settles_after_the_tuning_time() -> None:
    clock = Clock()
    tuner = Tuner(clock)
    tuner.limit(depth=5)
    periods(tuner, clock, int(TUNE_S / PERIOD_S) - 1, wait_share=0.3)
    assert (tuner.limit(5), tuner.settled) == (5, False)
    periods(tuner, clock, 2, wait_share=0.3)
    assert (tuner.limit(5), tuner.settled) == (5, True)
    assert f"its {TUNE_S:g} s of tuning over" in tuner.report()


def test_settled_it_adds_no_read_while_the_budget_holds_the_loader() -> None:
    clock = Clock()
    tuner = Tuner(clock)
    tuner.limit(depth=4)
    periods(tuner, clock, 2, wait_share=0.0)
    periods(tuner, clock, 1, wait_share=0.1)  # 3 was too few: back to 4, settled
    periods(tuner, clock, 2, wait_share=0.0)
    tuner.active = 2  # (as if settled lower)
    for refused in (3, 6, 9, 12):  # the budget put starts off each period: not the reads
        periods(tuner, clock, 1, wait_share=0.5, refused=refused)
    assert tuner.limit(4) == 2
    periods(tuner, clock, 2, wait_share=0.5, refused=12)  # no budget hold: one more
    assert tuner.limit(4) == 3


@given(depth=st.integers(1, 12), shares=st.lists(st.floats(0.0, 1.0), max_size=200))
def test_reads_stay_within_one_and_the_depth_and_a_waiting_loop_keeps_them_all(
    depth: int, shares: list[float]
) -> None:
    """Whatever the waits, 1 <= reads <= depth; a loop that always waits more than the aim
    (the loader is the limit) keeps every read of the depth: never slower than fixed."""
    clock = Clock()
    tuner = Tuner(clock)
    tuner.limit(depth)
    for share in shares:
        periods(tuner, clock, 1, wait_share=share)
        assert 1 <= tuner.limit(depth) <= depth
    if all(share > 1.001 * WAIT_SHARE for share in shares):  # (a margin for the float sums)
        assert tuner.limit(depth) == depth


def test_tunes_only_what_the_loader_chose() -> None:
    assert tunes(None, None, None)
    assert not tunes(None, 4, None) and not tunes(None, None, 8)
    assert tunes(True, 4, 8) and not tunes(False, None, None)
