from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lanceloader.plan import Plan

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
    seen = np.concatenate([p.batch_samples(b) for p in plans for b in range(len(p))] or [np.zeros(0, int)])
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
    assert len(Plan(10, 2, world_size=2)) == 3 and len(Plan(10, 2, world_size=2, drop_last=True)) == 2
    assert len(Plan(0, 4)) == 0


def test_short_last_batch_is_split_evenly_and_padded() -> None:
    # 9 samples, 4 per rank, 2 ranks: last global batch holds 1 sample; rank 1 wraps to sample 0.
    last = [Plan(9, 4, 2, r).batch_samples(1).tolist() for r in range(2)]
    assert last == [[8], [0]]


@pytest.mark.parametrize(
    "kwargs, match",
    [({"batch_size": 0}, "batch_size"), ({"world_size": 0}, "world_size"),
     ({"rank": 2, "world_size": 2}, "rank"), ({"start": 11}, "start")],
)
def test_bad_plans_are_rejected(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Plan(**{"num_samples": 10, "batch_size": 2, **kwargs})
