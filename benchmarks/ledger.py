"""Ledger lookups: the time to answer "which rows did step s read?" at step 10 and at step
10,000,000, for every order, a filter, a mix and an elastic (2 -> 3 ranks) history.

Method: a demo dataset of ``--rows`` rows (default 100,000; 391 steps of 256 an epoch, so global
step 10^7 lies in epoch ~25,600). For each case, ``Ledger.rows`` of global step 10 and of global
step 10^7 (``locate`` included) are timed ``--repeats`` times, interleaved (median of the mean
over the 20 steps from there: a full shuffle's cycle walking makes single batches vary). A last case
has no data at all: the pure part (``History`` + ``Order``) on a logical epoch of 10^10 rows,
where step 10^7 lies inside epoch 0. Target (issue 25): the same time at both steps (ratio ~1).

    python benchmarks/ledger.py [--rows 100000] [--repeats 30]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import lanceloader as ll
from lanceloader.demo import write_demo_dataset
from lanceloader.ordering.order import Order
from lanceloader.state.history import History, Segment

BATCH = 256
STEPS = (10, 10_000_000)
SPREAD = 20  # consecutive steps timed together from each of STEPS


def dataset(path: Path, rows: int) -> str:
    if not (path / "_versions").exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        write_demo_dataset(path, rows=rows, fragments=8)
    return str(path)


def median_ms(fns: dict[int, Callable[[], object]], repeats: int) -> dict[int, float]:
    times: dict[int, list[float]] = {step: [] for step in fns}
    for fn in fns.values():
        fn()  # warm: Lance's metadata, the interleave's table
    for _ in range(repeats):
        for step, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[step].append(time.perf_counter() - start)
    return {step: 1e3 * statistics.median(t) / SPREAD for step, t in times.items()}


def ledger_lookups(ledger: ll.Ledger) -> dict[int, Callable[[], object]]:
    def lookup(first: int) -> Callable[[], object]:
        return lambda: [
            ledger.rows(*ledger.locate(s), rank=0) for s in range(first, first + SPREAD)
        ]

    return {step: lookup(step) for step in STEPS}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--data-dir", type=Path, default=Path("benchmarks/data"))
    p.add_argument("--json", default="benchmarks/results/ledger.json")
    args = p.parse_args()
    uri = dataset(args.data_dir / f"ledger-{args.rows}.lance", args.rows)
    small = dataset(args.data_dir / f"ledger-{args.rows // 10}.lance", args.rows // 10)

    cases: dict[str, ll.Ledger | None] = {
        "sequential": ll.Ledger(ll.Loader(uri, BATCH)),
        "block shuffle 1024": ll.Ledger(
            ll.Loader(uri, BATCH, shuffle=True, shuffle_block_size=1024)
        ),
        "full shuffle": ll.Ledger(ll.Loader(uri, BATCH, shuffle=True)),
        "full shuffle, filter": ll.Ledger(ll.Loader(uri, BATCH, shuffle=True, filter="label < 5")),
        "mix 3:1 of two shuffled": ll.Ledger(
            ll.Loader(
                ll.Mix(
                    {"a": ll.Loader(uri, shuffle=True), "b": ll.Loader(small, shuffle=True)},
                    weights={"a": 3, "b": 1},
                ),
                BATCH,
            )
        ),
    }
    two = ll.Loader(uri, BATCH // 2, shuffle=True, world_size=2, rank=0)
    it = iter(two)
    for _ in range(7):
        next(it)
    it.close()
    first = two.state_dict()
    three = ll.Loader(uri, BATCH // 2, shuffle=True, world_size=3, rank=0)
    three.load_state_dict(first)
    cases["full shuffle, 2 -> 3 ranks"] = ll.Ledger(three, resumed_from=[first])

    results = {}
    for name, ledger in cases.items():
        assert ledger is not None
        ms = median_ms(ledger_lookups(ledger), args.repeats)
        results[name] = ms
        print(
            f"{name:30s} step 10: {ms[10]:6.3f} ms   step 10^7: {ms[10**7]:6.3f} ms   "
            f"ratio {ms[10**7] / ms[10]:.2f}"
        )

    rows = 10**10  # no data: the order and the plan alone
    order = Order(rows, shuffle=True)
    history = History(rows, (Segment(0, 0, BATCH, 2), Segment(0, 7 * 2 * BATCH, BATCH, 3)))
    pure = {
        step: (
            lambda first=step: [
                order.positions(0, history.batch_samples(0, s, 0))
                for s in range(first, first + SPREAD)
            ]
        )
        for step in STEPS
    }
    ms = median_ms(pure, args.repeats)
    results["order only, 10^10 rows, step in epoch 0"] = ms
    print(
        f"{'order only, 10^10-row epoch':30s} step 10: {ms[10]:6.3f} ms   step 10^7: "
        f"{ms[10**7]:6.3f} ms   ratio {ms[10**7] / ms[10]:.2f}"
    )
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(
        json.dumps(
            {"rows": args.rows, "batch_size": BATCH, "repeats": args.repeats, "ms": results},
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
