"""mixing_report: what each order mixes and what it costs in reads, from the order alone."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lanceloader as ll
from lanceloader.ordering.order import Order
from lanceloader.ordering.plan import Plan
from lanceloader.ordering.report import mixing_report

N = 1_000_000


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 50_000),
    batch=st.integers(1, 300),
    per_read=st.integers(1, 64),
    mode=st.sampled_from(["sequential", "block", "full"]),
    seed=st.integers(0, 5),
)
def test_figures_stay_in_their_ranges(n, batch, per_read, mode, seed) -> None:
    order = Order(
        n, mode != "sequential", 16 if mode == "block" else 1, 4 if mode == "block" else 1, seed
    )
    report = mixing_report(order, Plan(n, batch), per_read=per_read, batches=50, places=100)
    assert 1 <= report.places_per_batch <= min(batch, 100)
    assert report.random_places_per_batch <= min(batch, 100) + 1e-9
    assert 0 < report.reads_per_1000_rows <= 1000
    assert -1 <= report.order_correlation <= 1 + 1e-9
    if mode == "sequential":
        assert report.order_correlation == pytest.approx(1.0)
        assert report.places_per_batch <= 2 + batch * 100 / n  # a batch spans adjacent places


def test_the_three_modes_trade_mixing_for_reads() -> None:
    plan = Plan(N, 256)
    sequential = mixing_report(Order(N), plan, per_read=256)
    block = mixing_report(Order(N, True, 1024, 8, seed=0), plan, per_read=256)
    full = mixing_report(Order(N, True, seed=0), plan, per_read=64)
    # Mixing: a full shuffle is as good as random; a block shuffle mixes its window of 8 blocks.
    assert full.places_per_batch == pytest.approx(full.random_places_per_batch, rel=0.02)
    assert 7 <= block.places_per_batch <= 9 and sequential.places_per_batch <= 2
    assert abs(full.order_correlation) < 0.02 and abs(block.order_correlation) < 0.2
    # Reads: one per row for a full shuffle, tens of times fewer for blocks, ~none in sequence.
    assert full.reads_per_1000_rows > 950  # a few rows of a read happen to be neighbours
    assert block.reads_per_1000_rows < full.reads_per_1000_rows / 20
    assert sequential.reads_per_1000_rows < 0.1
    # Read batch by batch, a block shuffle's rows are scattered within the window.
    assert mixing_report(Order(N, True, 1024, 8, seed=0), plan).reads_per_1000_rows > 900


def test_loader_reports_its_own_next_epoch(small_uri: str) -> None:
    loader = ll.Loader(small_uri, batch_size=10, shuffle=True, shuffle_block_size=8, seed=3)
    loader.set_epoch(2)
    expected = mixing_report(loader.order, loader.plan(), 2, loader.batches_per_read)
    assert loader.mixing_report() == expected
    assert "places per batch" in str(expected) and expected.to_dict()["batches"] == 100


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="batches, places and per_read must be >= 1"):
        mixing_report(Order(10), Plan(10, 2), batches=0)
    with pytest.raises(ValueError, match="the plan has no batches to measure"):
        mixing_report(Order(0), Plan(0, 2))
