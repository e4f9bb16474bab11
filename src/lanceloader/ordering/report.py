"""How well an order mixes the dataset, and what it costs in reads: measured, not guessed.

A shuffle is a trade. A full shuffle gives every batch rows from all over the dataset, and costs
one read per row; a block shuffle reads a few contiguous ranges per batch, and its batches mix as
many distant places as its window holds. :func:`mixing_report` puts numbers on both sides for an
order and a plan, from the order alone (pure functions, no I/O), so the choice of
``shuffle_block_size`` and ``shuffle_window`` can be explained:

* **places per batch**: the dataset is cut into ``places`` equal parts; how many of them the rows
  of a batch come from, next to the same figure for a uniformly random batch (the ideal);
* **reads per 1,000 rows**: runs of contiguous positions in what the loader's reads fetch (its
  read tasks of 1, 4, 16, ... up to ``per_read`` batches; 20 of the epoch's first 1,000), i.e. the
  ranges and single rows Lance is asked for;
* **order correlation**: Spearman's correlation between the order rows are delivered in and their
  position in storage, over the batches measured (1 in sequential order, near 0 when shuffled).

Example::

    >>> from lanceloader.ordering.order import Order
    >>> from lanceloader.ordering.plan import Plan
    >>> report = mixing_report(Order(100_000, shuffle=False), Plan(100_000, 256), per_read=64)
    >>> round(report.places_per_batch, 1), round(report.reads_per_1000_rows, 2), report.order_correlation
    (1.2, 0.09, 1.0)
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from lanceloader.ordering.order import Order
from lanceloader.ordering.plan import Plan, read_ranges, window_alignment

DEFAULT_BATCHES = 200
DEFAULT_PLACES = 100
READS_MEASURED = 20  # reads sampled for the read cost: enough for a stable figure, fast
READS_SPAN = 1000  # ... among the epoch's first reads (after the ramp they repeat in kind)


@dataclass(frozen=True)
class MixingReport:
    """What :func:`mixing_report` measured; ``print()`` it for a short table."""

    batches: int
    batch_size: int
    places: int
    places_per_batch: float
    random_places_per_batch: float
    batches_per_read: int
    reads_per_1000_rows: float
    order_correlation: float

    def to_dict(self) -> dict[str, Any]:
        """The report as a JSON-safe dict."""
        return asdict(self)

    def __str__(self) -> str:
        return "\n".join([
            f"mixing over {self.batches} batches of {self.batch_size} rows:",
            f"  places per batch     {self.places_per_batch:7.1f} of {self.places} "
            f"(a random batch: {self.random_places_per_batch:.1f})",
            f"  reads per 1000 rows  {self.reads_per_1000_rows:7.1f} "
            f"(reads of up to {self.batches_per_read} batches)",
            f"  order correlation    {self.order_correlation:7.3f} (1 = storage order, 0 = none)",
        ])  # fmt: skip


def mixing_report(
    order: Order,
    plan: Plan,
    epoch: int = 0,
    per_read: int = 1,
    batches: int = DEFAULT_BATCHES,
    places: int = DEFAULT_PLACES,
) -> MixingReport:
    """Mixing of ``batches`` batches spread evenly over ``plan``'s epoch, and the read cost of
    fetching ``per_read`` consecutive batches at once.

    >>> full = mixing_report(Order(100_000, shuffle=True, seed=0), Plan(100_000, 256), per_read=4)
    >>> full.reads_per_1000_rows > 980, abs(full.order_correlation) < 0.05
    (True, True)
    """
    if min(batches, places, per_read) < 1:
        raise ValueError(
            f"batches, places and per_read must be >= 1, got {batches}, {places} and {per_read}"
        )
    if len(plan) == 0:
        raise ValueError("the plan has no batches to measure")
    chosen = np.unique(np.linspace(0, len(plan) - 1, min(batches, len(plan))).round().astype(int))
    per_batch = [order.positions(epoch, plan.batch_samples(int(b))) for b in chosen]
    sizes = np.array([len(p) for p in per_batch])
    n = order.num_rows
    seen = [len(np.unique(p * places // n)) for p in per_batch]
    random = places * (1 - (1 - 1 / places) ** sizes)  # expected distinct places, uniform rows
    align = window_alignment(plan, order.window_rows)
    reads = list(itertools.islice(read_ranges(range(len(plan)), per_read, align), READS_SPAN))
    runs = rows = 0
    for i in np.unique(np.linspace(0, len(reads) - 1, min(READS_MEASURED, len(reads))).astype(int)):
        samples, _ = plan.samples(reads[i])
        fetched = np.unique(order.positions(epoch, samples))
        runs += 1 + int(np.count_nonzero(np.diff(fetched) != 1))
        rows += len(fetched)
    return MixingReport(
        batches=len(chosen),
        batch_size=plan.batch_size,
        places=places,
        places_per_batch=float(np.mean(seen)),
        random_places_per_batch=float(random.mean()),
        batches_per_read=per_read,
        reads_per_1000_rows=1000 * runs / max(rows, 1),
        order_correlation=_spearman(np.concatenate(per_batch)),
    )


def _spearman(positions: np.ndarray) -> float:
    """Spearman's correlation between delivery order (0, 1, 2, ...) and ``positions``."""
    if len(positions) < 2:
        return 1.0
    ranks = np.empty(len(positions))
    ranks[np.argsort(positions, kind="stable")] = np.arange(len(positions))
    delivered = np.arange(len(positions), dtype=float)
    return float(np.corrcoef(delivered, ranks)[0, 1])
