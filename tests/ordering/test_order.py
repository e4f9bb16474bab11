from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lanceloader.ordering.order import Order, permute

orders = st.builds(
    Order,
    num_rows=st.integers(0, 3000),
    shuffle=st.booleans(),
    block_size=st.integers(1, 70),
    window=st.integers(1, 9),
    seed=st.integers(0, 2**40),
)


@given(orders, st.integers(0, 5))
def test_every_position_exactly_once_per_epoch(order: Order, epoch: int) -> None:
    positions = order.positions(epoch, np.arange(order.num_rows))
    assert sorted(positions.tolist()) == list(range(order.num_rows))


@given(orders, st.integers(0, 5), st.data())
def test_slices_concatenate_to_the_whole(order: Order, epoch: int, data: st.DataObject) -> None:
    n = order.num_rows
    cuts = sorted(data.draw(st.lists(st.integers(0, n), max_size=6)))
    bounds = [0, *cuts, n]
    parts = [order.positions(epoch, np.arange(a, b)) for a, b in itertools.pairwise(bounds)]
    whole = order.positions(epoch, np.arange(n))
    assert np.concatenate(parts).tolist() == whole.tolist()


@given(orders, st.integers(0, 5))
def test_same_seed_and_epoch_give_same_order(order: Order, epoch: int) -> None:
    twin = Order(order.num_rows, order.shuffle, order.block_size, order.window, order.seed)
    samples = np.arange(order.num_rows)
    assert order.positions(epoch, samples).tolist() == twin.positions(epoch, samples).tolist()


@given(st.integers(50, 5000), st.integers(1, 8), st.integers(0, 2**32))
def test_epochs_and_seeds_differ(n: int, block: int, seed: int) -> None:
    order = Order(n, shuffle=True, block_size=block, window=4, seed=seed)
    samples = np.arange(n)
    e0 = order.positions(0, samples)
    assert e0.tolist() != order.positions(1, samples).tolist()
    other = Order(n, shuffle=True, block_size=block, window=4, seed=seed + 1)
    assert e0.tolist() != other.positions(0, samples).tolist()


@given(st.integers(2, 4000), st.integers(2, 64), st.integers(1, 8), st.integers(0, 99))
def test_block_shuffle_keeps_blocks_within_windows(n: int, k: int, w: int, seed: int) -> None:
    order = Order(n, shuffle=True, block_size=k, window=w, seed=seed)
    positions = order.positions(0, np.arange(n))
    window_rows = k * w
    for start in range(0, n, window_rows):
        window = positions[start : start + window_rows]
        # A window holds whole blocks (the tail block is the only short one).
        blocks = np.unique(window // k)
        assert sum(min(k, n - b * k) for b in blocks.tolist()) == len(window)


def test_golden_orders_do_not_change_across_versions() -> None:
    # Pinned values: a change here silently changes every user's data order. Never edit lightly.
    assert Order(10, shuffle=True, seed=0).positions(0, np.arange(10)).tolist() == GOLDEN_FULL
    block = Order(20, shuffle=True, block_size=4, window=2, seed=1)
    assert block.positions(3, np.arange(20)).tolist() == GOLDEN_BLOCK


GOLDEN_FULL = [0, 1, 9, 5, 4, 2, 3, 7, 8, 6]
GOLDEN_BLOCK = [5, 18, 19, 4, 17, 16, 7, 6, 10, 14, 12, 8, 15, 11, 9, 13, 1, 0, 3, 2]


def test_full_shuffle_looks_uniform() -> None:
    # Where does position 0 land over many seeds? Each of 8 slots about equally often.
    counts = np.zeros(8, dtype=int)
    for seed in range(4000):
        counts[
            int(
                np.flatnonzero(Order(8, shuffle=True, seed=seed).positions(0, np.arange(8)) == 0)[0]
            )
        ] += 1
    assert counts.min() > 380 and counts.max() < 620, counts


def test_shuffling_a_billion_rows_costs_no_memory() -> None:
    order = Order(10**9, shuffle=True, seed=5)
    sample = order.positions(7, np.arange(10**9 - 1000, 10**9))
    assert len(np.unique(sample)) == 1000 and sample.max() < 10**9


def test_permute_rejects_nothing_and_is_a_bijection_for_tiny_domains() -> None:
    for n in range(1, 40):
        assert sorted(permute(np.arange(n), n, key=n).tolist()) == list(range(n))


@pytest.mark.parametrize("kwargs", [{"block_size": 0}, {"window": 0}, {"num_rows": -1}])
def test_bad_settings_are_rejected(kwargs: dict) -> None:
    with pytest.raises(
        ValueError,
        match=next(iter(kwargs))
        .replace("block_size", "shuffle_block_size")
        .replace("window", "shuffle_window"),
    ):
        Order(**{"num_rows": 10, **kwargs})


def test_out_of_range_samples_raise() -> None:
    with pytest.raises(IndexError, match=r"\[0, 5\)"):
        Order(5).positions(0, np.array([5]))
