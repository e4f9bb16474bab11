"""Throughput of ``lanceloader.Loader`` against raw Lance, measured in the same run.

Method
------
Absolute rows/s depend on the machine, so every loader number is paired with a raw-Lance
baseline that does the *same* I/O, measured in the same process, and the result is quoted as a
ratio ``loader rows/s / raw rows/s``.

* Dataset: ``lanceloader.demo.write_demo_dataset`` (``--rows`` rows, ``--fragments`` fragments)
  under ``--data-dir``; reused when one with the same shape is already there. Only the columns
  ``id``, ``label`` and ``x`` (64 float32) are read; ``id`` equals the row offset, which is how
  the baselines learn which rows the loader delivered. The page cache is warmed once first.
* Each case runs ``--repeats`` times as a (loader, raw) pair; the order inside a pair alternates
  between repeats so slow drift of a shared machine hits both sides alike. Medians are quoted.
* The loader is constructed outside the timed region (that cost is the time-to-first-batch case);
  the clock runs from ``iter()`` to the last row counted. The loader also converts every batch to
  NumPy, while the raw baselines stop at Arrow batches: the comparison is slightly in raw's favour.

Cases
-----
``sequential``
    Loader (batch 256, ``output="numpy"``) over a full epoch vs ``ds.to_batches(columns, B)``
    for B = 256 and 8192, after an untimed round of both (each side's first run in a process
    is up to 3x slower than its later ones). The target applies to the faster raw baseline.
``full shuffle``
    Loader (batch 256, ``shuffle=True``) until ``--shuffle-rows`` rows are delivered, vs a
    single-threaded ``ds.take(ids, columns)`` of the same rows, in the same order, 256 at a time.
``block shuffle``
    Loader (batch 256, block 1024, window 8) over a full epoch (or ``--block-rows``), vs a
    single-threaded ``ds.take(np.arange(...))`` of each 1024-row block the loader touched, in the
    order the loader first delivered a row of it. Also: block-shuffle / full-shuffle loader rows/s.
``default full shuffle, epoch 2``
    ``Loader(uri, shuffle=True)`` with no ``cache`` argument (the automatic cache: a directory
    under ``/dev/shm``, a fresh one per run), its second epoch, vs ``to_batches(8192)``. The
    loader side runs in a fresh process per repeat, which also reports its first epoch (the
    fill), its peak RSS, the bytes the cache took in ``/dev/shm`` and epoch 2's CPU seconds
    per million rows (all its threads), next to the raw scan's own (the ratio of CPU costs
    survives a loaded machine better than wall-clock time). ``--auto-only`` also runs the same
    with ``cache="memory"`` for comparison (no target). Every other case passes
    ``cache=None``: they measure reads from the dataset.
``time to first batch``
    Construct a ``Loader`` and take one batch, per mode (median); raw Lance opening the dataset
    and reading one equivalent batch is shown for reference (no target).

Two speeds of the raw scan
--------------------------
Lance's scan has two speeds in one process (3 Dec 2026, 2M rows of 272 B): where glibc maps
each large buffer afresh from the kernel, the scan page-faults it in (60-150k minor faults per
1M rows, 3-5M rows/s here, what a fresh process gets); where glibc keeps and reuses what the
process freed (after large frees it raises its mmap threshold), the same scan makes under
:data:`FAST_SCAN_FAULTS` faults per 1M rows and runs 2-3x as fast (10-15M rows/s). The loader
runs at 6-10M rows/s in either. Each case's note says how many of its raw scans ran in the
fast mode. ``--fast-scan`` first keeps a whole loader epoch's batches and frees them at once,
which put later scans of the process in the fast mode in most runs (the notes tell).

Usage::

    python benchmarks/throughput.py                          # defaults: 2M rows, 3 repeats
    python benchmarks/throughput.py --fast-scan              # against the scan's fast mode
    python benchmarks/throughput.py --rows 100000 --repeats 1   # smoke run
    python benchmarks/throughput.py --auto-only --rows 1000000 --repeats 3  # ~4 min

The results print as a markdown table (medians, the range of the per-pair ratios, the target).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import lance
import numpy as np
import pyarrow as pa

import lanceloader
from lanceloader import Loader
from lanceloader.demo import write_demo_dataset

COLUMNS = ["id", "label", "x"]
BATCH_SIZE = 256
RAW_SEQUENTIAL_BATCHES = (256, 8192)
BLOCK_SIZE = 1024
WINDOW = 8
SEED = 0

TARGET_SEQUENTIAL = 0.9
TARGET_FULL_SHUFFLE = 1.6
TARGET_BLOCK_SHUFFLE = 0.9
TARGET_BLOCK_OVER_FULL = 20.0
TARGET_AUTO_SECOND_EPOCH = 0.4

HERE = Path(__file__).resolve().parent


# --- results ---------------------------------------------------------------------------------


@dataclass
class Case:
    """One row of the table: loader and raw rows/s per repeat, and the target ratio."""

    name: str
    loader_rows_per_s: list[float]
    raw_rows_per_s: list[float]
    target: float | None
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def loader_median(self) -> float:
        return statistics.median(self.loader_rows_per_s)

    @property
    def raw_median(self) -> float:
        return statistics.median(self.raw_rows_per_s)

    @property
    def ratio(self) -> float:
        """Ratio of the medians (what the target is checked against)."""
        return self.loader_median / self.raw_median

    @property
    def passed(self) -> bool | None:
        return None if self.target is None else self.ratio >= self.target

    def to_json(self) -> dict[str, Any]:
        """The case as plain JSON, with medians, the ratio and per-pair ratios."""
        pairs = [a / b for a, b in zip(self.loader_rows_per_s, self.raw_rows_per_s, strict=True)]
        return {
            **asdict(self),
            "loader_median_rows_per_s": self.loader_median,
            "raw_median_rows_per_s": self.raw_median,
            "ratio_of_medians": self.ratio,
            "median_pair_ratio": statistics.median(pairs),
            "passed": self.passed,
        }


@dataclass
class FirstBatch:
    """Time to first batch of one mode, loader and raw reference, in seconds per repeat."""

    mode: str
    loader_s: list[float]
    raw_s: list[float]

    def to_json(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "loader_median_s": statistics.median(self.loader_s),
            "raw_median_s": statistics.median(self.raw_s),
        }


# --- dataset -----------------------------------------------------------------------------------


def prepare_dataset(data_dir: Path, rows: int, fragments: int, regenerate: bool) -> str:
    """Path of the demo dataset with ``rows`` rows in ``fragments`` fragments, written if needed."""
    path = data_dir / f"demo-{rows}x{fragments}.lance"
    if not regenerate and _dataset_matches(path, rows, fragments):
        print(f"reusing {path}")
        return str(path)
    data_dir.mkdir(parents=True, exist_ok=True)
    print(f"writing {rows:,} rows in {fragments} fragments to {path} ...", flush=True)
    start = time.perf_counter()
    write_demo_dataset(path, rows=rows, fragments=fragments)
    print(f"  written in {time.perf_counter() - start:.1f} s")
    return str(path)


def _dataset_matches(path: Path, rows: int, fragments: int) -> bool:
    """Whether ``path`` holds a readable dataset of the expected shape."""
    if not (path / "_versions").exists():
        return False
    try:
        ds = lance.dataset(str(path))
    except Exception:
        return False
    return (
        ds.count_rows() == rows
        and len(ds.get_fragments()) == fragments
        and all(c in ds.schema.names for c in COLUMNS)
    )


def warm_page_cache(ds: lance.LanceDataset) -> None:
    """Read the benchmarked columns once so that no case pays for the first disk read."""
    for _ in ds.to_batches(columns=COLUMNS, batch_size=65_536):
        pass


# --- loader runs -----------------------------------------------------------------------------


def loader_kwargs(mode: str, num_workers: int | None) -> dict[str, Any]:
    """``Loader`` keyword arguments of one mode: sequential, full or block (shuffle)."""
    kwargs: dict[str, Any] = {
        "batch_size": BATCH_SIZE,
        "columns": COLUMNS,
        "seed": SEED,
        "output": "numpy",
        "num_workers": num_workers,
        "cache": None,  # reads from the dataset; the automatic cache has its own case
    }
    if mode == "full":
        kwargs.update(shuffle=True)
    elif mode == "block":
        kwargs.update(shuffle=True, shuffle_block_size=BLOCK_SIZE, shuffle_window=WINDOW)
    elif mode != "sequential":
        raise ValueError(f"unknown mode {mode!r}")
    return kwargs


def run_loader(uri: str, kwargs: dict[str, Any], limit: int) -> tuple[float, np.ndarray]:
    """Rows/s of a fresh loader's first epoch up to ``limit`` rows, and the ids it delivered."""
    loader = Loader(uri, **kwargs)
    ids: list[np.ndarray] = []
    rows = 0
    start = time.perf_counter()
    it = iter(loader)
    for batch in it:
        # A copy: a view would keep every read's buffers alive to the end (the whole epoch,
        # 544 MB), which no training loop does; it made the loader's epoch 0.6-0.8x as fast,
        # and freeing it all at once switched later raw scans of the process to their fast
        # mode (glibc raises its mmap threshold on such frees), 3 Dec 2026.
        ids.append(batch["id"].copy())
        rows += len(batch["id"])
        if rows >= limit:
            break
    elapsed = time.perf_counter() - start
    it.close()
    return rows / elapsed, np.concatenate(ids)


def first_batch_seconds(uri: str, kwargs: dict[str, Any]) -> float:
    """Seconds to construct a loader and receive its first batch."""
    start = time.perf_counter()
    loader = Loader(uri, **kwargs)
    it = iter(loader)
    next(it)
    elapsed = time.perf_counter() - start
    it.close()
    return elapsed


# --- raw Lance runs --------------------------------------------------------------------------


# Minor page faults of each raw scan, per batch size. The scan has two speeds in one process
# (3 Dec 2026: 2.6-4.4M rows/s with 150-260k faults per 2M rows, ~10M with ~23k): glibc hands
# it freshly mapped buffers that fault in, or reused ones. The tables print the faults beside
# the ratio so a reader sees which scan a run compared against.
SCAN_FAULTS: dict[int, list[int]] = {}
# A raw scan with at most this many minor page faults per million rows ran in the fast mode
# (measured: fast 0-12k per 1M rows of 272 B over 2M rows, 14-35k over 1M; slow 60-150k).
FAST_SCAN_FAULTS = 40_000


def raw_sequential(ds: lance.LanceDataset, batch_size: int) -> float:
    """Rows/s of one ``to_batches`` pass over the whole dataset (its minor page faults are
    appended to :data:`SCAN_FAULTS`)."""
    rows = 0
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    start = time.perf_counter()
    for batch in ds.to_batches(columns=COLUMNS, batch_size=batch_size):
        rows += batch.num_rows
    rate = rows / (time.perf_counter() - start)
    SCAN_FAULTS.setdefault(batch_size, []).append(
        resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    )
    return rate


def faults_note(faults: list[int], rows: int) -> str:
    """The raw scans' minor page faults, and how many ran in the fast mode, for a case's
    note."""
    fast = sum(f <= FAST_SCAN_FAULTS * rows / 1e6 for f in faults)
    return (
        f"raw scan page faults {statistics.median(faults) / 1000:,.0f}k "
        f"({min(faults) / 1000:,.0f}k-{max(faults) / 1000:,.0f}k), "
        f"{fast} of {len(faults)} scans in the fast mode"
    )


def raw_take(ds: lance.LanceDataset, ids: np.ndarray, chunk: int) -> float:
    """Rows/s of single-threaded ``take`` calls of ``chunk`` ids each, in the given order."""
    rows = 0
    start = time.perf_counter()
    for lo in range(0, len(ids), chunk):
        rows += ds.take(ids[lo : lo + chunk], columns=COLUMNS).num_rows
    return rows / (time.perf_counter() - start)


def raw_blocks(ds: lance.LanceDataset, blocks: np.ndarray, num_rows: int) -> float:
    """Rows/s of single-threaded ``take`` calls of whole ``BLOCK_SIZE``-row ranges, in order."""
    rows = 0
    start = time.perf_counter()
    for block in blocks.tolist():
        lo = block * BLOCK_SIZE
        rows += ds.take(np.arange(lo, min(lo + BLOCK_SIZE, num_rows)), columns=COLUMNS).num_rows
    return rows / (time.perf_counter() - start)


def block_order(ids: np.ndarray) -> np.ndarray:
    """The blocks of ``ids``, each once, in the order a row of it was first delivered."""
    blocks = ids // BLOCK_SIZE
    _, first = np.unique(blocks, return_index=True)
    return blocks[np.sort(first)]


def raw_first_batch_seconds(uri: str, mode: str, ids: np.ndarray) -> float:
    """Seconds for raw Lance to open the dataset and read a batch like the loader's first."""
    start = time.perf_counter()
    ds = lance.dataset(uri)
    if mode == "sequential":
        next(iter(ds.to_batches(columns=COLUMNS, batch_size=BATCH_SIZE)))
    elif mode == "full":
        ds.take(ids[:BATCH_SIZE], columns=COLUMNS)
    else:
        lo = int(ids[0]) // BLOCK_SIZE * BLOCK_SIZE
        ds.take(np.arange(lo, min(lo + BLOCK_SIZE, ds.count_rows())), columns=COLUMNS)
    return time.perf_counter() - start


# --- cases -----------------------------------------------------------------------------------


def paired(
    repeats: int, loader_run: Callable[[], float], raw_run: Callable[[], float]
) -> Iterator[tuple[float, float]]:
    """(loader, raw) results of ``repeats`` pairs; even repeats run the loader first."""
    for i in range(repeats):
        if i % 2 == 0:
            a = loader_run()
            b = raw_run()
        else:
            b = raw_run()
            a = loader_run()
        yield a, b


def case_sequential(uri: str, ds: lance.LanceDataset, args: argparse.Namespace) -> list[Case]:
    """Loader sequential epoch vs raw ``to_batches`` at each raw batch size; target on the faster."""
    kwargs = loader_kwargs("sequential", args.num_workers)
    loader: list[float] = []
    raw: dict[int, list[float]] = {b: [] for b in RAW_SEQUENTIAL_BATCHES}
    # A round of both sides first, not timed: the first scan of a process ran at 3.9-4.2M rows/s
    # where later ones ran at 10-13M (partly glibc's mmap threshold, which rises once large
    # buffers were freed), and the loader's first epoch at 5-6M where later ones ran at 8-10M.
    run_loader(uri, kwargs, sys.maxsize)
    for b in RAW_SEQUENTIAL_BATCHES:
        raw_sequential(ds, b)
    SCAN_FAULTS.clear()  # the timed scans' faults only
    for i in range(args.repeats):
        sizes = RAW_SEQUENTIAL_BATCHES if i % 2 == 0 else RAW_SEQUENTIAL_BATCHES[::-1]
        if i % 2 == 0:
            loader.append(run_loader(uri, kwargs, sys.maxsize)[0])
        for b in sizes:
            raw[b].append(raw_sequential(ds, b))
        if i % 2 == 1:
            loader.append(run_loader(uri, kwargs, sys.maxsize)[0])
    fastest = max(raw, key=lambda b: statistics.median(raw[b]))
    return [
        Case(
            name=f"sequential vs to_batches({b})",
            loader_rows_per_s=loader,
            raw_rows_per_s=raw[b],
            target=TARGET_SEQUENTIAL if b == fastest else None,
            note=("faster raw baseline; " if b == fastest else "")
            + faults_note(SCAN_FAULTS[b], ds.count_rows()),
            extra={"raw_page_faults": list(SCAN_FAULTS[b])},
        )
        for b in RAW_SEQUENTIAL_BATCHES
    ]


def case_full_shuffle(
    uri: str, ds: lance.LanceDataset, args: argparse.Namespace
) -> tuple[Case, np.ndarray]:
    """Loader full shuffle (first ``--shuffle-rows`` rows) vs ``take`` of the same rows."""
    kwargs = loader_kwargs("full", args.num_workers)
    limit = min(args.shuffle_rows, ds.count_rows())
    delivered: list[np.ndarray] = []

    def loader_run() -> float:
        rate, ids = run_loader(uri, kwargs, limit)
        delivered.append(ids)
        return rate

    def raw_run() -> float:
        return raw_take(ds, delivered[0], BATCH_SIZE)

    pairs = list(paired(args.repeats, loader_run, raw_run))
    case = Case(
        name="full shuffle vs take(256)",
        loader_rows_per_s=[p[0] for p in pairs],
        raw_rows_per_s=[p[1] for p in pairs],
        target=TARGET_FULL_SHUFFLE,
        note=f"{len(delivered[0]):,} rows",
        extra={"deterministic": _all_equal(delivered)},
    )
    return case, delivered[0]


def case_block_shuffle(
    uri: str, ds: lance.LanceDataset, args: argparse.Namespace
) -> tuple[Case, np.ndarray]:
    """Loader block shuffle vs ``take`` of the same 1024-row ranges in the loader's block order."""
    kwargs = loader_kwargs("block", args.num_workers)
    num_rows = ds.count_rows()
    limit = min(args.block_rows or num_rows, num_rows)
    delivered: list[np.ndarray] = []

    def loader_run() -> float:
        rate, ids = run_loader(uri, kwargs, limit)
        delivered.append(ids)
        return rate

    def raw_run() -> float:
        return raw_blocks(ds, block_order(delivered[0]), num_rows)

    pairs = list(paired(args.repeats, loader_run, raw_run))
    blocks = block_order(delivered[0])
    case = Case(
        name=f"block shuffle ({BLOCK_SIZE}x{WINDOW}) vs take",
        loader_rows_per_s=[p[0] for p in pairs],
        raw_rows_per_s=[p[1] for p in pairs],
        target=TARGET_BLOCK_SHUFFLE,
        note=f"{len(delivered[0]):,} rows, {len(blocks):,} blocks",
        extra={"deterministic": _all_equal(delivered)},
    )
    return case, delivered[0]


def case_block_over_full(block: Case, full: Case) -> Case:
    """Block-shuffle loader rows/s over full-shuffle loader rows/s (the 'raw' column is full)."""
    return Case(
        name="block / full shuffle (loader)",
        loader_rows_per_s=block.loader_rows_per_s,
        raw_rows_per_s=full.loader_rows_per_s,
        target=TARGET_BLOCK_OVER_FULL,
        note="raw column = loader full shuffle",
    )


def case_first_batch(
    uri: str, args: argparse.Namespace, shuffled: dict[str, np.ndarray]
) -> list[FirstBatch]:
    """Time to first batch per mode, loader (construct + first ``next``) and raw reference."""
    results = []
    for mode in ("sequential", "full", "block"):
        kwargs = loader_kwargs(mode, args.num_workers)
        ids = shuffled.get(mode, np.zeros(1, dtype=np.int64))
        pairs = list(
            paired(
                args.repeats,
                lambda kwargs=kwargs: first_batch_seconds(uri, kwargs),
                lambda mode=mode, ids=ids: raw_first_batch_seconds(uri, mode, ids),
            )
        )
        results.append(FirstBatch(mode, [p[0] for p in pairs], [p[1] for p in pairs]))
    return results


def auto_epochs(uri: str, num_workers: int | None, queue: Any, cache: str | None = None) -> None:
    """In a fresh process: ``Loader(uri, shuffle=True)`` with no cache argument (or
    ``cache=cache``), a private automatic-cache directory under /dev/shm; puts (epoch 1 rows/s,
    epoch 2 rows/s, bytes in /dev/shm, peak RSS in MiB, what the cache is, epoch 2's CPU
    seconds per million rows: every thread of the process, which load on the machine does not
    inflate as it does wall-clock time)."""
    import tempfile

    with tempfile.TemporaryDirectory(dir="/dev/shm", prefix="llbench-") as shm:
        os.environ["LANCELOADER_AUTO_CACHE_DIR"] = shm
        kwargs = {k: v for k, v in loader_kwargs("full", num_workers).items() if k != "cache"}
        loader = Loader(uri, **kwargs, **({} if cache is None else {"cache": cache}))
        rates, cpu = [], 0.0
        for _ in range(2):
            start, rows, cpu_start = time.perf_counter(), 0, time.process_time()
            for batch in loader:
                rows += len(batch["id"])
            rates.append(rows / (time.perf_counter() - start))
            cpu = (time.process_time() - cpu_start) * 1e6 / rows
        used = loader.source.cache
        on_shm = used.used_bytes() if cache is None and used is not None else 0
        queue.put((rates[0], rates[1], on_shm, peak_rss_mib(), loader.source.cache_choice, cpu))


def raw_sequential_cpu(ds: lance.LanceDataset, batch_size: int) -> tuple[float, float]:
    """Rows/s of one ``to_batches`` pass, and its CPU seconds per million rows."""
    cpu_start = time.process_time()
    rate = raw_sequential(ds, batch_size)
    return rate, (time.process_time() - cpu_start) * 1e6 / ds.count_rows()


def case_auto_cache(
    uri: str, ds: lance.LanceDataset, args: argparse.Namespace, cache: str | None = None
) -> Case:
    """The default loader's full shuffle (or with ``cache=cache``), second epoch, vs
    ``to_batches(8192)``; the CPU seconds per million rows of both sides are in ``extra``."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    runs: list[tuple[float, float, int, float, str, float]] = []
    raw_cpu: list[float] = []
    faults: list[int] = []

    def loader_run() -> float:
        queue = context.Queue()
        child = context.Process(target=auto_epochs, args=(uri, args.num_workers, queue, cache))
        child.start()
        runs.append(queue.get(timeout=1800))
        child.join()
        return runs[-1][1]

    def raw_run() -> float:
        rate, cpu = raw_sequential_cpu(ds, 8192)
        raw_cpu.append(cpu)
        faults.append(SCAN_FAULTS[8192][-1])
        return rate

    pairs = list(paired(args.repeats, loader_run, raw_run))
    first = statistics.median(r[0] for r in runs)
    shm = max(r[2] for r in runs)
    rss = max(r[3] for r in runs)
    loader_cpu = [r[5] for r in runs]
    cpu_ratio = statistics.median(raw_cpu) / statistics.median(loader_cpu)
    name = (
        "default full shuffle, epoch 2"
        if cache is None
        else f"cache={cache!r} full shuffle, epoch 2"
    )
    return Case(
        name=f"{name} vs to_batches(8192)",
        loader_rows_per_s=[p[0] for p in pairs],
        raw_rows_per_s=[p[1] for p in pairs],
        target=TARGET_AUTO_SECOND_EPOCH if cache is None else None,
        note=(
            f"epoch 1 {_rate(first)}/s; CPU s per 1M rows {statistics.median(loader_cpu):.2f} "
            f"vs raw {statistics.median(raw_cpu):.2f} ({cpu_ratio:.2f}x); "
            + (f"/dev/shm {shm / 2**20:,.0f} MiB; " if cache is None else "")
            + f"peak RSS {rss:,.0f} MiB; "
            + faults_note(faults, ds.count_rows())
        ),
        extra={
            "epoch_1_rows_per_s": [r[0] for r in runs],
            "shm_bytes": shm,
            "raw_page_faults": faults,
            "peak_rss_mib": rss,
            "cache": runs[-1][4],
            "loader_cpu_s_per_mrow": loader_cpu,
            "raw_cpu_s_per_mrow": raw_cpu,
            "cpu_ratio_of_medians": cpu_ratio,
        },
    )


def _all_equal(arrays: list[np.ndarray]) -> bool:
    return all(np.array_equal(arrays[0], a) for a in arrays[1:])


# --- report ----------------------------------------------------------------------------------


def machine_info() -> dict[str, Any]:
    """CPU count, load, platform and library versions, for the JSON record."""
    return {
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "load_average_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "lance": lance.__version__,
        "pyarrow": pa.__version__,
        "numpy": np.__version__,
        "lanceloader": lanceloader.__version__,
    }


def _rate(value: float) -> str:
    if value >= 1e6:
        return f"{value / 1e6:.2f}M"
    if value >= 1e3:
        return f"{value / 1e3:.1f}k"
    return f"{value:.0f}"


def print_table(cases: list[Case], first: list[FirstBatch]) -> None:
    """The cases as a markdown table (medians, the range of the per-pair ratios), then time to
    first batch."""
    print()
    print("| case | loader rows/s | raw rows/s | ratio (range) | target | result | note |")
    print("|---|---:|---:|---:|---:|---|---|")
    for c in cases:
        target = f">= {c.target:g}x" if c.target is not None else "-"
        result = {True: "PASS", False: "FAIL", None: "info"}[c.passed]
        pairs = [a / b for a, b in zip(c.loader_rows_per_s, c.raw_rows_per_s, strict=True)]
        print(
            f"| {c.name} | {c.loader_median:,.0f} | {c.raw_median:,.0f} | {c.ratio:.2f}x "
            f"({min(pairs):.2f}-{max(pairs):.2f}) | {target} | {result} | {c.note} |"
        )
    print()
    print(f"{'time to first batch (median)':<36} {'loader':>9} {'raw ref':>9}")
    for f in first:
        loader_ms = statistics.median(f.loader_s) * 1e3
        raw_ms = statistics.median(f.raw_s) * 1e3
        print(f"  {f.mode:<34} {loader_ms:>7.1f}ms {raw_ms:>7.1f}ms")


def peak_rss_mib() -> float:
    """Peak resident set size of this process (loader and baselines together), in MiB."""
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kib / (1024 * 1024) if sys.platform == "darwin" else kib / 1024


def write_json(path: Path, report: dict[str, Any]) -> None:
    """Write ``report`` to ``path``, creating its directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {path}")


# --- main ------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=2_000_000, help="dataset rows (default 2,000,000)")
    p.add_argument("--fragments", type=int, default=8, help="dataset fragments (default 8)")
    p.add_argument("--data-dir", type=Path, default=HERE / "data", help="where the dataset lives")
    p.add_argument("--regenerate", action="store_true", help="rewrite the dataset even if present")
    p.add_argument("--repeats", type=int, default=3, help="(loader, raw) pairs per case")
    p.add_argument(
        "--shuffle-rows", type=int, default=200_000, help="rows timed in the full-shuffle case"
    )
    p.add_argument(
        "--block-rows", type=int, default=0, help="rows timed in the block case (0: full epoch)"
    )
    p.add_argument("--num-workers", type=int, default=None, help="loader workers (default: cores)")
    p.add_argument(
        "--json", type=Path, default=HERE / "results" / "throughput.json", help="JSON output"
    )
    p.add_argument("--strict", action="store_true", help="exit 1 if any target is missed")
    p.add_argument(
        "--fast-scan",
        action="store_true",
        help="first free a loader epoch's batches at once: raw scans then run in "
        "their fast mode in most runs (see 'Two speeds of the raw scan')",
    )
    p.add_argument(
        "--auto-only",
        action="store_true",
        help="only the default loader's full shuffle (automatic cache) case",
    )
    args = p.parse_args(argv)
    for name in ("rows", "fragments", "repeats", "shuffle_rows"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run every case, print the table, write the JSON; 1 with ``--strict`` if a target fails."""
    args = parse_args(argv)
    started = time.perf_counter()
    info = machine_info()
    uri = prepare_dataset(args.data_dir, args.rows, args.fragments, args.regenerate)
    ds = lance.dataset(uri)
    warm_page_cache(ds)
    if args.fast_scan:
        kept = list(Loader(uri, **loader_kwargs("sequential", args.num_workers)))
        del kept  # 544 MB freed at once: glibc raises its mmap threshold
    print(f"{args.repeats} repeat(s) per case, medians quoted; {info['cpu_count']} cores")

    if args.auto_only:
        print("default full shuffle (automatic cache) ...", flush=True)
        auto = case_auto_cache(uri, ds, args)
        print("cache='memory' full shuffle (for comparison) ...", flush=True)
        memory = case_auto_cache(uri, ds, args, cache="memory")
        print_table([auto, memory], [])
        print(f"\ncache: {auto.extra['cache']}")
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
        print(
            f"load average {info['load_average_at_start'][0]:.1f} at the start, "
            f"{load:.1f} at the end"
        )
        write_json(args.json, {"machine": info, "cases": [auto.to_json(), memory.to_json()]})
        return 1 if args.strict and auto.passed is False else 0
    print("sequential ...", flush=True)
    cases = case_sequential(uri, ds, args)
    print("full shuffle ...", flush=True)
    full, full_ids = case_full_shuffle(uri, ds, args)
    print("block shuffle ...", flush=True)
    block, block_ids = case_block_shuffle(uri, ds, args)
    cases += [full, block, case_block_over_full(block, full)]
    print("default full shuffle (automatic cache) ...", flush=True)
    cases.append(case_auto_cache(uri, ds, args))
    print("time to first batch ...", flush=True)
    first = case_first_batch(uri, args, {"full": full_ids, "block": block_ids})

    print_table(cases, first)
    for c in (full, block):
        if not c.extra["deterministic"]:
            print(f"WARNING: {c.name}: the loader delivered different rows across repeats")
    elapsed = time.perf_counter() - started
    rss = peak_rss_mib()
    print(f"\npeak RSS {rss:.0f} MiB (whole process); total {elapsed:.0f} s")
    write_json(
        args.json,
        {
            "machine": info,
            "config": {
                "dataset": uri,
                "rows": args.rows,
                "fragments": args.fragments,
                "columns": COLUMNS,
                "batch_size": BATCH_SIZE,
                "block_size": BLOCK_SIZE,
                "window": WINDOW,
                "seed": SEED,
                "repeats": args.repeats,
                "shuffle_rows": args.shuffle_rows,
                "block_rows": args.block_rows,
                "num_workers": args.num_workers or os.cpu_count() or 1,
            },
            "cases": [c.to_json() for c in cases],
            "time_to_first_batch": [f.to_json() for f in first],
            "peak_rss_mib": rss,
            "elapsed_s": elapsed,
        },
    )
    missed = [c.name for c in cases if c.passed is False]
    return 1 if args.strict and missed else 0


if __name__ == "__main__":
    sys.exit(main())
