"""Fragment tails: how sequential reads on an object store split their ranges, and how the
slivers pass between reads (``rows/lance/fragment_tails.py``). Sources on a real S3 server are in
``test_object_store.py``."""

from __future__ import annotations

import itertools
import threading
import time

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lanceloader.rows.lance.fragment_tails import SLIVER_FRACTION, FragmentTails, tail_split


@st.composite
def fragments_and_cuts(draw):
    sizes = draw(st.lists(st.integers(0, 400), min_size=1, max_size=6))
    starts = np.cumsum([0, *sizes])
    rows = int(starts[-1])
    if rows < 3:
        return starts, [0, rows]
    cuts = sorted(draw(st.sets(st.integers(1, rows - 1), max_size=6)) | {0, rows})
    return starts, cuts


@settings(max_examples=300, deadline=None)
@given(fragments_and_cuts())
def test_consecutive_reads_agree_on_every_sliver(case) -> None:
    """Reads that cut the positions into consecutive runs: each read's head, body and tail
    cover its run and the tail past it; a head lies in one fragment and is a sliver of it; a
    read's head is exactly the tail the read before it leaves, and a tail is taken by the next
    read whenever that read goes past it."""
    starts, cuts = case
    runs = list(itertools.pairwise(cuts))
    splits = [tail_split(lo, hi, starts) for lo, hi in runs]
    for (lo, hi), (head, (first, last), tail) in zip(runs, splits, strict=True):
        assert first == (head[1] if head else lo) and last == (tail[1] if tail else hi)
        assert lo <= first <= hi <= last
        for sliver in (head, tail):
            if sliver is None:
                continue
            k = int(np.searchsorted(starts, sliver[0], "right")) - 1
            begin, end = int(starts[k]), int(starts[k + 1])
            assert begin < sliver[0] < sliver[1] == end
            assert sliver[1] - sliver[0] <= (end - begin) * SLIVER_FRACTION
    for (_, _, tail), (head, _, _), hi in zip(splits, splits[1:], cuts[2:], strict=False):
        if head is not None:
            assert tail == head
        if tail is not None and hi > tail[1]:
            assert head == tail


def test_a_split_of_whole_fragments_shares_nothing() -> None:
    starts = np.array([0, 1000, 2000, 3000])
    assert tail_split(0, 2000, starts) == (None, (0, 2000), None)
    assert tail_split(1000, 3000, starts) == (None, (1000, 3000), None)
    assert tail_split(10, 500, starts) == (None, (10, 500), None)  # not a sliver: 500 rows


def test_a_left_sliver_is_taken_once() -> None:
    tails = FragmentTails()
    rows = pa.table({"id": [990, 991]})
    tails.promise((990, 992))
    tails.leave((990, 992), rows)
    assert tails.take((990, 992)) is rows
    assert tails.take((990, 992)) is None  # gone: the next reader reads it itself


def test_an_unpromised_sliver_is_not_waited_for() -> None:
    tails = FragmentTails(wait_s=30)
    started = time.monotonic()
    assert tails.take((0, 5)) is None
    assert time.monotonic() - started < 1


def test_a_taker_waits_for_the_read_that_promised_its_sliver() -> None:
    tails = FragmentTails(wait_s=30)
    rows = pa.table({"id": [7]})
    tails.promise((7, 8))
    threading.Timer(0.2, tails.leave, ((7, 8), rows)).start()
    started = time.monotonic()
    assert tails.take((7, 8)) is rows
    assert 0.1 < time.monotonic() - started < 10


def test_a_failed_promise_sends_the_taker_to_read_it_itself() -> None:
    tails = FragmentTails(wait_s=30)
    tails.promise((7, 8))
    threading.Timer(0.1, tails.leave, ((7, 8), None)).start()
    assert tails.take((7, 8)) is None


def test_a_promise_never_kept_is_waited_for_at_most_its_bound() -> None:
    tails = FragmentTails(wait_s=0.2)
    tails.promise((7, 8))
    started = time.monotonic()
    assert tails.take((7, 8)) is None
    assert 0.15 < time.monotonic() - started < 5


def test_slivers_nobody_takes_are_dropped_oldest_first_past_the_bound() -> None:
    one = pa.table({"x": np.zeros(1000, dtype=np.float64)})  # 8,000 bytes
    tails = FragmentTails(held_bytes=3 * one.nbytes)
    for i in range(5):
        tails.promise((i, i + 1))
        tails.leave((i, i + 1), one)
    assert [tails.take((i, i + 1)) is not None for i in range(5)] == [
        False,
        False,
        True,
        True,
        True,
    ]


def test_a_sliver_left_again_is_counted_once() -> None:
    one = pa.table({"x": np.zeros(1000, dtype=np.float64)})
    tails = FragmentTails(held_bytes=2 * one.nbytes)
    for _ in range(5):  # the same tail, left epoch after epoch with nobody taking it
        tails.promise((0, 1))
        tails.leave((0, 1), one)
    tails.promise((1, 2))
    tails.leave((1, 2), one)
    assert tails.take((0, 1)) is one and tails.take((1, 2)) is one


@pytest.mark.parametrize("readers", [2, 8])
def test_many_readers_each_get_their_own_sliver(readers: int) -> None:
    """Threads that promise, leave and take slivers of their neighbours in any order: every
    taker gets its neighbour's rows or None (when the neighbour had not promised yet), never
    another's."""
    tails = FragmentTails(wait_s=5)
    got: dict[int, object] = {}
    barrier = threading.Barrier(readers)

    def read(i: int) -> None:
        barrier.wait()
        tails.promise((i, i + 1))
        time.sleep(0.001 * (i % 3))
        tails.leave((i, i + 1), f"rows {i}")
        got[i] = tails.take((i - 1, i))

    threads = [threading.Thread(target=read, args=(i,)) for i in range(readers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert set(got) == set(range(readers))
    assert all(got[i] in (None, f"rows {i - 1}") for i in range(readers))


def test_read_run_hands_the_sliver_to_the_next_read_and_reads_it_when_nobody_did() -> None:
    """Two reads across a fragment boundary, one after the other: the first reads on to its
    fragment's end, the second never asks for those rows and still returns them; when the
    first failed, the second reads them itself. Rows are the positions themselves."""
    starts = np.array([0, 1000, 2000])
    asked: list[tuple[int, int]] = []

    def read(a: int, b: int) -> pa.Table:
        asked.append((a, b))
        return pa.table({"id": np.arange(a, b)})

    tails = FragmentTails()
    first = tails.read_run(0, 990, starts, read)
    second = tails.read_run(990, 1990, starts, read)
    assert first.column("id").to_pylist() == list(range(990))
    assert second.column("id").to_pylist() == list(range(990, 1990))
    assert asked == [(0, 1000), (1000, 2000)]

    def failing(a: int, b: int) -> pa.Table:
        raise OSError("the store went away")

    asked.clear()
    tails = FragmentTails()
    with pytest.raises(OSError):
        tails.read_run(0, 990, starts, failing)
    assert tails.read_run(990, 1990, starts, read).column("id").to_pylist() == list(
        range(990, 1990)
    )
    assert asked == [(1000, 2000), (990, 1000)]
