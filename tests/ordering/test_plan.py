from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lanceloader.ordering.order import Order
from lanceloader.ordering.plan import RAMP_GROWTH, Plan, read_ranges, read_tasks, window_alignment

settings_ = st.tuples(
    st.integers(0, 500),  # num_samples
    st.integers(1, 40),  # batch_size
    st.integers(1, 6),  # world_size
    st.booleans(),  # drop_last
)


def all_ranks(n: int, bs: int, world: int, drop: bool, start: int = 0) -> list[Plan]:
    return [Plan(n, bs, world, r, drop, start) for r in range(world)]


@given(settings_)
def test_every_rank_gets_the_same_number_of_batches(s: tuple) -> None:
    plans = all_ranks(*s)
    assert len({len(p) for p in plans}) == 1
    assert all(len(p.batch_samples(b)) > 0 for p in plans for b in range(len(p)))


@given(settings_)
def test_ranks_are_disjoint_and_complete(s: tuple) -> None:
    n, bs, world, drop = s
    plans = all_ranks(n, bs, world, drop)
    seen = np.concatenate(
        [p.batch_samples(b) for p in plans for b in range(len(p))] or [np.zeros(0, int)]
    )
    if drop:
        kept = (n // (bs * world)) * bs * world
        assert sorted(seen.tolist()) == list(range(kept))
    else:
        # Every sample at least once; repeats only as padding of a last batch smaller than world.
        assert set(seen.tolist()) == set(range(n))
        g = bs * world
        full = (-(-n // g) - 1) * g if n else 0
        assert len(seen) == (full + max(n - full, world) if n else 0)


@given(settings_)
def test_batches_never_exceed_batch_size_and_full_batches_are_exact(s: tuple) -> None:
    _, bs, _, drop = s
    for p in all_ranks(*s):
        sizes = [len(p.batch_samples(b)) for b in range(len(p))]
        assert all(size <= bs for size in sizes)
        assert all(size == bs for size in sizes[:-1])
        if drop and sizes:
            assert sizes[-1] == bs


@given(settings_, st.data())
def test_resumed_plan_is_the_tail_of_the_full_plan(s: tuple, data: st.DataObject) -> None:
    n, bs, world, drop = s
    full = all_ranks(n, bs, world, drop)
    done = data.draw(st.integers(0, len(full[0])))
    start = full[0].samples_done(done)
    resumed = all_ranks(n, bs, world, drop, start)
    for f, r in zip(full, resumed, strict=True):
        expect = [f.batch_samples(b).tolist() for b in range(done, len(f))]
        got = [r.batch_samples(b).tolist() for b in range(len(r))]
        if start < n:
            assert got == expect


def test_len_and_drop_last() -> None:
    assert len(Plan(10, 4)) == 3 and len(Plan(10, 4, drop_last=True)) == 2
    assert (
        len(Plan(10, 2, world_size=2)) == 3 and len(Plan(10, 2, world_size=2, drop_last=True)) == 2
    )
    assert len(Plan(0, 4)) == 0


def test_short_last_batch_is_split_evenly_and_padded() -> None:
    # 9 samples, 4 per rank, 2 ranks: last global batch holds 1 sample; rank 1 wraps to sample 0.
    last = [Plan(9, 4, 2, r).batch_samples(1).tolist() for r in range(2)]
    assert last == [[8], [0]]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"batch_size": 0}, "batch_size"),
        ({"world_size": 0}, "world_size"),
        ({"rank": 2, "world_size": 2}, "rank"),
        ({"start": 11}, "start"),
    ],
)
def test_bad_plans_are_rejected(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Plan(**{"num_samples": 10, "batch_size": 2, **kwargs})


@given(
    n=st.integers(0, 400),
    start=st.integers(0, 50),
    step=st.integers(1, 3),
    per_read=st.integers(1, 70),
    first=st.integers(0, 40),
    every=st.integers(1, 40),
)
def test_read_ranges_cover_every_batch_once_and_end_on_boundaries(
    n, start, step, per_read, first, every
) -> None:
    batches = range(start, start + n * step, step)
    reads = list(read_ranges(batches, per_read, align=(first, every)))
    assert [b for r in reads for b in r] == list(batches)  # in order, each once
    assert all(1 <= len(r) <= per_read for r in reads)
    if step == 1 and every <= per_read:  # windows that fit in a read
        boundaries = {b for b in range(start, start + n + 1) if (b - first) % every == 0}
        for r in reads[:-1]:
            inside = any(r.start < b < r.stop for b in boundaries)
            assert not inside or r.stop in boundaries  # a read across a boundary ends on one
    if every > per_read:  # larger windows: reads are not cut on them
        assert reads == list(read_ranges(batches, per_read))
    assert list(read_ranges(batches, per_read)) == list(read_ranges(batches, per_read, None))


@given(n=st.integers(0, 300), start=st.integers(0, 50), per_read=st.integers(1, 70))
def test_without_the_ramp_every_read_but_the_last_is_full(n, start, per_read) -> None:
    reads = list(read_ranges(range(start, start + n), per_read, ramp=False))
    assert [b for r in reads for b in r] == list(range(start, start + n))
    assert all(len(r) == per_read for r in reads[:-1]) and all(len(r) >= 1 for r in reads)


@given(
    n=st.integers(0, 300),
    start=st.integers(0, 50),
    per_read=st.integers(1, 70),
    first_read=st.integers(1, 8),
)
def test_the_ramp_grows_from_its_first_read(n, start, per_read, first_read) -> None:
    reads = list(read_ranges(range(start, start + n), per_read, first_read=first_read))
    assert [b for r in reads for b in r] == list(range(start, start + n))
    size = min(first_read, per_read)
    for r in reads[:-1]:
        assert len(r) == size
        size = min(RAMP_GROWTH * size, per_read)
    if first_read == 1:
        assert reads == list(read_ranges(range(start, start + n), per_read))


def test_block_shuffle_reads_fetch_whole_windows() -> None:
    order = Order(1 << 20, shuffle=True, block_size=1024, window=8, seed=0)
    plan = Plan(1 << 20, 256)
    align = window_alignment(plan, order.window_rows)
    assert align == (0, 32) and window_alignment(plan, Order(100).window_rows) is None
    assert window_alignment(Plan(1 << 20, 256, start=4096), 8192) == (16, 32)
    assert window_alignment(Plan(1 << 20, 256, start=100), 8192) is None
    tasks = list(read_tasks(0, plan, per_read=256, window_rows=order.window_rows))
    for task in tasks[6:]:  # after the ramp, each read is whole blocks: contiguous runs of 1024
        fetched = np.sort(order.positions(0, task.samples))
        runs = np.split(fetched, np.flatnonzero(np.diff(fetched) != 1) + 1)
        assert all(len(run) % 1024 == 0 for run in runs)


def test_samples_of_a_range_are_its_batches_samples() -> None:
    # Plan.samples (what every read task carries: one arange for consecutive batches of one
    # rank) is each batch's batch_samples, concatenated, with each batch's size; exhaustive
    # over small plans (every start, rank, range and step)
    for n, bs, world, drop in itertools.product(range(14), range(1, 5), range(1, 4), (0, 1)):
        for start, rank in itertools.product(range(n + 1), range(world)):
            plan = Plan(n, bs, world, rank, bool(drop), start)
            for lo, hi, step in itertools.product(range(len(plan) + 1), repeat=2 + 1):
                batches = range(lo, hi, step + 1)
                samples, sizes = plan.samples(batches)
                parts = [plan.batch_samples(b) for b in batches]
                assert samples.dtype == np.int64
                assert samples.tolist() == [int(x) for p in parts for x in p], (plan, batches)
                assert sizes == [len(p) for p in parts], (plan, batches)
