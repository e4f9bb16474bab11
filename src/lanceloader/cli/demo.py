"""``lanceloader demo``: what the loader delivers in each order, next to raw Lance, and what next.

Every mode reads whole epochs of the same dataset, ``--runs`` times (medians: one run on shared
cores can move by 2x). Raw Lance, the yardstick, is ``dataset.to_batches()`` over the same
columns: sequential, no shuffle, no workers, Arrow batches. Progress is a bar on a terminal and
one line per run otherwise (a log file stays readable).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Iterator
from typing import Any

import lance
from tqdm import tqdm

from lanceloader.cli.errors import input_errors
from lanceloader.demo import cached_demo_dataset
from lanceloader.loader import Loader

MODES = {
    "sequential": {"shuffle": False},
    "block shuffle": {"shuffle": True, "shuffle_block_size": 1024, "shuffle_window": 8},
    "full shuffle": {"shuffle": True, "shuffle_block_size": 1},
}
WHAT = {
    "raw Lance": "dataset.to_batches(): storage order, no batching rules, no workers",
    "sequential": "the loader in storage order, batches of the same size on every rank",
    "block shuffle": "1,024-row blocks shuffled, rows of 8 blocks mixed: few reads, good mixing",
    "full shuffle": "every row anywhere, the best mixed: a random read per row",
}


def batch_nbytes(batch: Any) -> int:
    """Bytes of the arrays (and strings) in a numpy-output batch, or of an Arrow batch."""
    if hasattr(batch, "nbytes") and not isinstance(batch, dict):
        return int(batch.nbytes)
    total = 0
    for value in batch.values():
        total += value.nbytes if hasattr(value, "nbytes") else sum(len(v) for v in value)
    return total


def _rows(batch: Any) -> int:
    return batch.num_rows if hasattr(batch, "num_rows") else len(next(iter(batch.values())))


def run_epoch(batches: Iterator[Any], total: int | None, label: str, run: str) -> dict[str, float]:
    """One epoch; returns rows/s, MB/s and the seconds to the first batch."""
    start = time.perf_counter()
    rows = nbytes = 0
    first = None
    tty = sys.stderr.isatty()
    with tqdm(
        total=total,
        desc=f"{label:>14} {run}",
        unit="batch",
        leave=False,
        disable=not tty,
        file=sys.stderr,
    ) as bar:
        for batch in batches:
            if first is None:
                first = time.perf_counter() - start
            rows += _rows(batch)
            nbytes += batch_nbytes(batch)
            bar.update()
    seconds = time.perf_counter() - start
    if not tty:
        print(f"  {label} {run}: {rows:,} rows in {seconds:.2f} s", file=sys.stderr, flush=True)
    return {"rows/s": rows / seconds, "MB/s": nbytes / seconds / 1e6, "first batch s": first or 0.0}


def demo(args: argparse.Namespace) -> int:
    """``lanceloader demo``: each order mode and raw Lance, medians of ``--runs`` epochs."""
    with input_errors():
        uri = args.uri or cached_demo_dataset(args.rows)
        loaders = {
            label: Loader(
                uri, batch_size=args.batch_size, seed=0, num_workers=args.workers, **settings
            )
            for label, settings in MODES.items()
        }
        first = next(iter(loaders.values()))
        source = first.source
        columns = ", ".join(f"{f.name} {f.type}" for f in source.schema_table().schema)
        print(f"lanceloader demo: {source.num_rows:,} rows of {uri}")
        print(f"  columns: {columns}")
        print(
            f"  batches of {args.batch_size} rows, {first.num_workers} thread workers "
            f"({os.cpu_count()} cores), NumPy output, {args.runs} epochs per mode (medians)"
        )
        print()
        ds = lance.dataset(uri)
        results: dict[str, list[dict[str, float]]] = {label: [] for label in WHAT}
        for run in range(args.runs):
            tag = f"{run + 1}/{args.runs}"
            raw = ds.to_batches(batch_size=args.batch_size, columns=source.columns)
            results["raw Lance"].append(run_epoch(raw, None, "raw Lance", tag))
            for label, loader in loaders.items():
                results[label].append(run_epoch(iter(loader), len(loader), label, tag))
    raw = statistics.median(r["rows/s"] for r in results["raw Lance"])
    print(f"{'mode':<14} {'rows/s':>12} {'MB/s':>9} {'vs raw':>7} {'first batch':>12}  what")
    for label, runs in results.items():
        rate = statistics.median(r["rows/s"] for r in runs)
        mbs = statistics.median(r["MB/s"] for r in runs)
        first_s = statistics.median(r["first batch s"] for r in runs)
        print(
            f"{label:<14} {rate:>12,.0f} {mbs:>9,.1f} {rate / raw:>6.2f}x {first_s:>11.3f}s  "
            f"{WHAT[label]}"
        )
    print()
    print(
        "rows/s and MB/s: what reached the training loop over a whole epoch; vs raw: against "
        "raw Lance in this run; first batch: seconds from iter() to the first batch."
    )
    cached = [label for label, loader in loaders.items() if loader.source.hints.cached]
    if cached:  # the automatic cache: why a full shuffle runs near a scan here
        print(
            f"{' and '.join(cached)}: read through the cache the loader chose by itself "
            f"(its first epoch fills it; cache=None turns it off): "
            f"{loaders[cached[0]].source.facts.cache_choice}"
        )
    print()
    print("Next:")
    steps = [
        (f"lanceloader inspect {uri}", "columns, sizes, what each becomes"),
        (f"lanceloader bench {uri} --shuffle", "your settings: stats and the bottleneck"),
        (
            "lanceloader convert SRC data.lance",
            "your images, videos, audio, Parquet or CSV into Lance",
        ),
        ("docs/guide.md", "the guide: orders, resume, workers, PyTorch"),
    ]
    width = max(len(command) for command, _ in steps)
    for command, why in steps:
        print(f"  {command:<{width}}  # {why}")
    return 0
