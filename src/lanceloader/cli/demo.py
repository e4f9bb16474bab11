"""``lanceloader demo``: one epoch of each order mode on a generated or given dataset."""

from __future__ import annotations

import argparse
import time

from tqdm import tqdm

from lanceloader.cli.errors import input_errors
from lanceloader.demo import cached_demo_dataset
from lanceloader.loader import Loader

MODES = {
    "sequential": {"shuffle": False},
    "block shuffle": {"shuffle": True, "shuffle_block_size": 1024, "shuffle_window": 8},
    "full shuffle": {"shuffle": True, "shuffle_block_size": 1},
}


def batch_nbytes(batch: dict) -> int:
    """Bytes of the arrays (and strings) in a numpy-output batch."""
    total = 0
    for value in batch.values():
        total += value.nbytes if hasattr(value, "nbytes") else sum(len(v) for v in value)
    return total


def run_epoch(loader: Loader, label: str) -> dict[str, float]:
    """One epoch with a progress bar; returns rows/s, MB/s and time to first batch."""
    start = time.perf_counter()
    rows = nbytes = 0
    first = None
    with tqdm(total=len(loader), desc=f"{label:>14}", unit="batch", leave=True) as bar:
        for batch in loader:
            if first is None:
                first = time.perf_counter() - start
            rows += len(next(iter(batch.values())))
            nbytes += batch_nbytes(batch)
            bar.update()
    seconds = time.perf_counter() - start
    return {"rows/s": rows / seconds, "MB/s": nbytes / seconds / 1e6, "first batch s": first or 0.0}


def demo(args: argparse.Namespace) -> int:
    """``lanceloader demo``: one epoch per order mode, then a table of speeds."""
    with input_errors():
        uri = args.uri or cached_demo_dataset(args.rows)
        print(f"lanceloader demo on {uri}")
        results = {}
        for label, settings in MODES.items():
            loader = Loader(uri, batch_size=args.batch_size, seed=0, **settings)
            results[label] = run_epoch(loader, label)
    print(f"\n{'mode':<14} {'rows/s':>12} {'MB/s':>10} {'first batch':>12}")
    for label, r in results.items():
        print(f"{label:<14} {r['rows/s']:>12,.0f} {r['MB/s']:>10,.1f} {r['first batch s']:>11.3f}s")
    return 0
