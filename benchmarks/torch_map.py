"""Map-style PyTorch loading: ``lanceloader.torch.MapDataset`` against Lance's own torch dataset.

Method
------
* Data: the demo dataset (``lanceloader.demo.write_demo_dataset``, ``--rows`` rows in
  ``--fragments`` fragments) under ``--data-dir``, reused when present (``throughput.py`` writes
  the same one). Every case reads the same four columns (``id``, ``label``, ``x`` = 64 float32,
  ``text``), because ``lance.torch.data.SafeLanceDataset`` cannot select columns.
* Every case is a ``torch.utils.data.DataLoader`` with 2 worker processes started by ``spawn``
  (what Lance's ``get_safe_loader`` forces), ``persistent_workers=True`` and batches of 256 rows.
  The page cache is warmed once first.
* Lance: ``SafeLanceDataset(uri)`` through ``get_safe_loader(ds, batch_size=256, num_workers=2,
  shuffle=True)`` (full shuffle: torch's ``RandomSampler``), and the same dataset driven by our
  block-shuffle ``BatchSampler`` (the same order as ours, so only the dataset side differs).
* Ours: ``MapDataset(uri)`` with ``batch_sampler=BatchSampler(..., batch_size=256)`` in full
  shuffle and in block shuffle (blocks of 1024 rows, window 8), each with ``collate_fn=collate``
  (the batch as read, no per-row work) and with torch's default collate (rows cut out of the
  batch, then stacked again: the trade-off ``Rows`` documents); and with ``read_ahead=False``
  (one Lance call per batch, as any map-style dataset does). For reference,
  ``IterableDataset`` (the Loader's pipeline in each worker) in the same block order.
* One measurement: start an epoch, take the first batch (worker start-up and the first read are
  not timed), then count rows until ``--seconds`` have passed or the epoch ends; rows/s.
  ``--repeats`` rounds, each round running every case once in a rotated order so that a shared
  machine's drift hits all alike. Medians are quoted; ratios are ratios of medians.

Usage::

    python benchmarks/torch_map.py                           # 2M rows, 10 s per run, 3 repeats
    python benchmarks/torch_map.py --rows 200000 --seconds 3 --repeats 1   # smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lance
import torch
from lance.torch.data import SafeLanceDataset, get_safe_loader
from torch.utils.data import DataLoader

import lanceloader
from lanceloader.demo import write_demo_dataset
from lanceloader.torch import BatchSampler, IterableDataset, MapDataset, collate

BATCH_SIZE = 256
BLOCK_SIZE = 1024
WINDOW = 8
WORKERS = 2
SEED = 0
TARGET = 20.0
HERE = Path(__file__).resolve().parent


def prepare_dataset(data_dir: Path, rows: int, fragments: int) -> str:
    """The demo dataset of that shape under ``data_dir``, written if missing."""
    path = data_dir / f"demo-{rows}x{fragments}.lance"
    if (path / "_versions").exists() and lance.dataset(str(path)).count_rows() == rows:
        print(f"reusing {path}")
        return str(path)
    data_dir.mkdir(parents=True, exist_ok=True)
    print(f"writing {rows:,} rows to {path} ...", flush=True)
    write_demo_dataset(path, rows=rows, fragments=fragments)
    return str(path)


def warm_page_cache(uri: str) -> None:
    for _ in lance.dataset(uri).to_batches(batch_size=65_536):
        pass


def rows_of(batch: Any) -> int:
    """Rows in a batch: our dicts hold an ``id`` tensor; default collate of Lance's rows too."""
    return len(batch["id"])


def measure(loader: DataLoader, seconds: float) -> float:
    """Rows/s of one epoch of ``loader`` from its second batch, for at most ``seconds``."""
    it = iter(loader)
    next(it)
    rows, start = 0, time.perf_counter()
    elapsed = 0.0
    for batch in it:
        rows += rows_of(batch)
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            break
    return rows / max(elapsed, 1e-9)


def make_cases(uri: str) -> dict[str, Callable[[], DataLoader]]:
    """Each case's DataLoader, built on first use (spawn workers start then)."""
    spawn = torch.multiprocessing.get_context("spawn")

    def ours(
        shuffle_block_size: int, collate_fn: Any, read_ahead: bool = True
    ) -> Callable[[], DataLoader]:
        def build() -> DataLoader:
            ds = MapDataset(uri, read_ahead=read_ahead)
            sampler = BatchSampler(
                ds,
                batch_size=BATCH_SIZE,
                shuffle=True,
                seed=SEED,
                shuffle_block_size=shuffle_block_size,
                shuffle_window=WINDOW if shuffle_block_size > 1 else None,
            )
            return DataLoader(
                ds,
                batch_sampler=sampler,
                collate_fn=collate_fn,
                num_workers=WORKERS,
                persistent_workers=True,
                multiprocessing_context=spawn,
                timeout=120,
            )

        return build

    def lance_full() -> DataLoader:
        return get_safe_loader(
            SafeLanceDataset(uri),
            batch_size=BATCH_SIZE,
            num_workers=WORKERS,
            shuffle=True,
            timeout=120,
        )

    def lance_block() -> DataLoader:
        ds = SafeLanceDataset(uri)
        sampler = BatchSampler(
            len(ds),
            batch_size=BATCH_SIZE,
            shuffle=True,
            seed=SEED,
            shuffle_block_size=BLOCK_SIZE,
            shuffle_window=WINDOW,
        )
        return get_safe_loader(
            ds, batch_size=1, batch_sampler=sampler, num_workers=WORKERS, timeout=120
        )

    def iterable_block() -> DataLoader:
        ds = IterableDataset(
            uri,
            BATCH_SIZE,
            shuffle=True,
            seed=SEED,
            shuffle_block_size=BLOCK_SIZE,
            shuffle_window=WINDOW,
            output="torch",
            num_workers=1,
        )
        return DataLoader(
            ds,
            batch_size=None,
            num_workers=WORKERS,
            persistent_workers=True,
            multiprocessing_context=spawn,
            timeout=120,
        )

    return {
        "lance SafeLanceDataset, full shuffle": lance_full,
        "lance SafeLanceDataset, our block shuffle": lance_block,
        "ours, full shuffle, collate": ours(1, collate),
        "ours, block shuffle, collate": ours(BLOCK_SIZE, collate),
        "ours, full shuffle, default collate": ours(1, None),
        "ours, block shuffle, default collate": ours(BLOCK_SIZE, None),
        "ours, full shuffle, collate, no read-ahead": ours(1, collate, read_ahead=False),
        "ours, block shuffle, collate, no read-ahead": ours(BLOCK_SIZE, collate, read_ahead=False),
        "ours IterableDataset, block shuffle": iterable_block,
    }


def run(uri: str, seconds: float, repeats: int) -> dict[str, list[float]]:
    builders = make_cases(uri)
    loaders: dict[str, DataLoader] = {}
    results: dict[str, list[float]] = {name: [] for name in builders}
    names = list(builders)
    for round_ in range(repeats):
        rotated = names[round_ % len(names) :] + names[: round_ % len(names)]
        for name in rotated:
            if name not in loaders:
                loaders[name] = builders[name]()
            rate = measure(loaders[name], seconds)
            results[name].append(rate)
            print(f"  round {round_ + 1}: {name:45s} {rate:12,.0f} rows/s", flush=True)
    return results


def summarise(results: dict[str, list[float]]) -> dict[str, Any]:
    medians = {name: statistics.median(rates) for name, rates in results.items()}
    lance_full = medians["lance SafeLanceDataset, full shuffle"]
    lance_block = medians["lance SafeLanceDataset, our block shuffle"]
    ratios = {
        "ours full / lance full": medians["ours, full shuffle, collate"] / lance_full,
        "ours block / lance full": medians["ours, block shuffle, collate"] / lance_full,
        "ours block / lance same block order": medians["ours, block shuffle, collate"]
        / lance_block,
        "collate / default collate, full": medians["ours, full shuffle, collate"]
        / medians["ours, full shuffle, default collate"],
        "collate / default collate, block": medians["ours, block shuffle, collate"]
        / medians["ours, block shuffle, default collate"],
        "read-ahead / none, full": medians["ours, full shuffle, collate"]
        / medians["ours, full shuffle, collate, no read-ahead"],
        "read-ahead / none, block": medians["ours, block shuffle, collate"]
        / medians["ours, block shuffle, collate, no read-ahead"],
        "iterable block / lance full": medians["ours IterableDataset, block shuffle"] / lance_full,
    }
    return {"medians_rows_per_s": medians, "ratios": ratios}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--fragments", type=int, default=8)
    parser.add_argument("--data-dir", type=Path, default=HERE / "data")
    parser.add_argument("--seconds", type=float, default=10.0, help="loading time per run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "torch_map.json")
    args = parser.parse_args(argv)

    uri = prepare_dataset(args.data_dir, args.rows, args.fragments)
    warm_page_cache(uri)
    load = os.getloadavg()
    results = run(uri, args.seconds, args.repeats)
    summary = summarise(results)
    print("\nmedians (rows/s):")
    for name, rate in summary["medians_rows_per_s"].items():
        print(f"  {name:45s} {rate:12,.0f}")
    print("ratios:")
    for name, ratio in summary["ratios"].items():
        print(f"  {name:45s} {ratio:8.1f}x")
    block, full = (summary["ratios"][f"ours {m} / lance full"] for m in ("block", "full"))
    print(
        f"target: MapDataset / lance >= {TARGET:.0f}x: block shuffle {block:.1f}x "
        f"({'met' if block >= TARGET else 'not met'}), full shuffle {full:.1f}x"
    )
    report = {
        "machine": {
            "cpu_count": os.cpu_count(),
            "load_average_at_start": load,
            "platform": platform.platform(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "lance": lance.__version__,
            "lanceloader": lanceloader.__version__,
        },
        "config": {
            "dataset": uri,
            "rows": args.rows,
            "batch_size": BATCH_SIZE,
            "block_size": BLOCK_SIZE,
            "window": WINDOW,
            "workers": WORKERS,
            "seconds": args.seconds,
            "repeats": args.repeats,
        },
        "runs_rows_per_s": results,
        **summary,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
