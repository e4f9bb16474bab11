"""Command line: ``lanceloader demo [URI]``.

``demo`` runs one epoch of each order mode (sequential, block shuffle, full shuffle) with a
progress bar, then prints a table of rows/s, MB/s and time to first batch. Without a URI it
writes a demo dataset into the cache directory first.

Example::

    $ lanceloader demo                 # writes ~/.cache/lanceloader/demo-300000.lance once
    $ lanceloader demo data/train.lance --batch-size 512
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from tqdm import tqdm

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


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lanceloader", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="load a dataset in each order mode and report the speed")
    d.add_argument("uri", nargs="?", help="a Lance dataset; default: a generated demo dataset")
    d.add_argument("--batch-size", type=int, default=256)
    d.add_argument("--rows", type=int, default=300_000, help="rows of the generated dataset")
    d.set_defaults(run=demo)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.run(args)
    except (ValueError, TypeError, FileNotFoundError, NotImplementedError) as exc:
        print(f"lanceloader {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
