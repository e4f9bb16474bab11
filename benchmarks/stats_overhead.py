"""Overhead of stats collection: loader throughput with stats on vs. off, measured in one run.

Method
------
Every loader records what its stages did through one :class:`lanceloader.engine.stats.Recorder`
(``loader.recorder``). "Stats off" replaces it with :class:`NullRecorder`, a subclass whose
``new_epoch``, ``task``, ``delivered`` and ``event`` do nothing (benchmark only; the library has
no switch to turn stats off). What "off" cannot remove is the work inside the workers
(``perf_counter`` around each stage, ``RecordBatch.nbytes`` per batch, Lance's
``io_stats_incremental()`` once per read) and the two ``perf_counter`` calls per batch in the
consumer; their cost per call is measured separately below.

* Dataset: ``benchmarks/data/demo-{rows}x{fragments}.lance`` (the one ``throughput.py`` uses,
  2,000,000 rows in 8 fragments) when present, else written with
  ``lanceloader.demo.write_demo_dataset``. ``--rows`` picks a smaller one for a smoke run.
  Columns ``id``, ``label``, ``x`` (64 float32), batch 256, ``output="numpy"``; the page cache
  is warmed first.
* Cases: ``sequential`` (a full epoch) and ``full shuffle`` (the first ``--shuffle-rows`` rows).
* Each case runs ``--repeats`` interleaved (stats on, stats off) pairs; the order inside a pair
  alternates, so drift on a shared machine hits both alike. A fresh loader per run, built outside
  the timed region; the clock runs from ``iter()`` to the last row counted.
* Overhead = ``1 - median(on) / median(off)`` of rows/s; the median of the per-pair overheads
  and their range are reported too. Target: at most 1%. ``CPU/row`` is the same comparison of
  the process's CPU time per row (all threads, ``time.process_time``), which other processes on
  a busy machine disturb much less than wall time.
* Micro-benchmarks, not drowned in run-to-run noise like the end-to-end numbers: the cost per
  batch of the recording calls (``delivered`` per batch, ``task`` per read; real recorder minus
  ``NullRecorder``) as a share of the wall time per batch at the stats-off speed; and the cost
  of what "off" keeps in the workers, as a share of the worker time per batch.

Metric export (``lanceloader.metrics``) is measured the same way, as a third case
``exporters``: a full sequential epoch with exporters on (a TensorBoard ``SummaryWriter`` fed by
``log_every(loader, writer, 50)``, and a Prometheus collector on 127.0.0.1 scraped once a second
by a thread, as a Prometheus server would) against the same loader with exporters off (stats
on in both). Target: at most 1%. Because that end-to-end difference is below the noise of a
shared machine, one export call is also timed alone (one ``log_every`` write: ``stats()``,
the scalars, 12 ``add_scalar``; one scrape: ``generate_latest``), and an epoch's export cost is
given as a fraction of the epoch: ``(batches / 50) × write + (epoch seconds / 1 s) × scrape``.

Usage::

    python benchmarks/stats_overhead.py                        # 2M rows, 7 pairs per case
    python benchmarks/stats_overhead.py --rows 100000 --repeats 3   # smoke run
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
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import lance
import numpy as np
import pyarrow as pa

import lanceloader
from lanceloader import Loader
from lanceloader.demo import write_demo_dataset
from lanceloader.engine.stats import Recorder, count_delivered, new_counters
from lanceloader.rows.protocol import to_record_batch

COLUMNS = ["id", "label", "x"]
BATCH_SIZE = 256
SEED = 0
TARGET_OVERHEAD = 0.01
HERE = Path(__file__).resolve().parent


class NullRecorder(Recorder):
    """A recorder that records nothing: the loader's cost without stats (benchmark only).

    >>> rec = NullRecorder()
    >>> count_delivered(rec.new_epoch(), 10, 80, 0.1, 0.0, 0.1)
    >>> rec.snapshot().rows
    0
    """

    def new_epoch(self) -> dict[str, float]:
        return new_counters()  # counted, then thrown away

    def task(self, *args: Any, **kwargs: Any) -> None:
        pass

    def event(self, *args: Any, **kwargs: Any) -> None:
        pass


# --- dataset -----------------------------------------------------------------------------------


def prepare_dataset(data_dir: Path, rows: int, fragments: int) -> str:
    """Path of the demo dataset with ``rows`` rows in ``fragments`` fragments, written if needed."""
    path = data_dir / f"demo-{rows}x{fragments}.lance"
    if _dataset_matches(path, rows, fragments):
        print(f"reusing {path}")
        return str(path)
    data_dir.mkdir(parents=True, exist_ok=True)
    print(f"writing {rows:,} rows in {fragments} fragments to {path} ...", flush=True)
    write_demo_dataset(path, rows=rows, fragments=fragments)
    return str(path)


def _dataset_matches(path: Path, rows: int, fragments: int) -> bool:
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


def warm_page_cache(uri: str) -> None:
    """Read the benchmarked columns once so that no run pays for the first disk read."""
    for _ in lance.dataset(uri).to_batches(columns=COLUMNS, batch_size=65_536):
        pass


# --- runs ------------------------------------------------------------------------------------


def loader_kwargs(shuffle: bool, num_workers: int | None) -> dict[str, Any]:
    """``Loader`` settings of a case: batch 256, numpy output, sequential or full shuffle."""
    return {
        "batch_size": BATCH_SIZE,
        "columns": COLUMNS,
        "seed": SEED,
        "shuffle": shuffle,
        "output": "numpy",
        "num_workers": num_workers,
    }


@dataclass(frozen=True)
class Run:
    """One timed run: wall-clock rows/s, and CPU µs per row (all threads of this process)."""

    rows_per_s: float
    cpu_us_per_row: float


def timed_run(uri: str, kwargs: dict[str, Any], limit: int, stats: bool) -> Run:
    """A fresh loader's first epoch up to ``limit`` rows, with stats on or off."""
    loader = Loader(uri, **kwargs)
    if not stats:
        loader.recorder = NullRecorder()
    rows = 0
    cpu = time.process_time()
    start = time.perf_counter()
    it = iter(loader)
    for batch in it:
        rows += len(batch["id"])
        if rows >= limit:
            break
    elapsed = time.perf_counter() - start
    it.close()
    cpu = time.process_time() - cpu
    if stats and loader.stats().rows != rows:  # the recorder was really in use
        raise RuntimeError(f"stats counted {loader.stats().rows} rows, the loop {rows}")
    return Run(rows / elapsed, cpu / rows * 1e6)


@dataclass
class Case:
    """Rows/s (and CPU µs per row) with stats on and off, one entry per interleaved pair."""

    name: str
    on: list[float]
    off: list[float]
    on_cpu_us_per_row: list[float]
    off_cpu_us_per_row: list[float]
    rows: int

    @property
    def overhead(self) -> float:
        """``1 - median(on) / median(off)``: the share of throughput that stats cost."""
        return 1 - statistics.median(self.on) / statistics.median(self.off)

    @property
    def pair_overheads(self) -> list[float]:
        return [1 - a / b for a, b in zip(self.on, self.off, strict=True)]

    @property
    def cpu_overhead(self) -> float:
        """``median(on) / median(off) - 1`` of CPU time per row: less sensitive to other
        processes on a shared machine than wall time (they take cores, not this process's CPU)."""
        on, off = self.on_cpu_us_per_row, self.off_cpu_us_per_row
        return statistics.median(on) / statistics.median(off) - 1

    @property
    def passed(self) -> bool:
        return self.overhead <= TARGET_OVERHEAD

    def to_json(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "median_on_rows_per_s": statistics.median(self.on),
            "median_off_rows_per_s": statistics.median(self.off),
            "overhead": self.overhead,
            "cpu_overhead": self.cpu_overhead,
            "median_pair_overhead": statistics.median(self.pair_overheads),
            "pair_overheads": self.pair_overheads,
            "target": TARGET_OVERHEAD,
            "passed": self.passed,
        }


def run_case(name: str, repeats: int, limit: int, run: Callable[[bool], Run]) -> Case:
    """``repeats`` (on, off) pairs; even pairs run stats-on first, odd pairs stats-off first."""
    runs: dict[bool, list[Run]] = {True: [], False: []}
    for i in range(repeats):
        for stats in (True, False) if i % 2 == 0 else (False, True):
            runs[stats].append(run(stats))
    return Case(
        name,
        on=[r.rows_per_s for r in runs[True]],
        off=[r.rows_per_s for r in runs[False]],
        on_cpu_us_per_row=[r.cpu_us_per_row for r in runs[True]],
        off_cpu_us_per_row=[r.cpu_us_per_row for r in runs[False]],
        rows=limit,
    )


# --- metric export ---------------------------------------------------------------------------

LOG_EVERY = 50
SCRAPE_S = 1.0


def exporter_run(
    uri: str, kwargs: dict[str, Any], limit: int, exporters: bool, logdir: Path
) -> Run:
    """A fresh loader's epoch up to ``limit`` rows, with or without the exporters (stats on)."""
    import threading
    import urllib.request

    from prometheus_client import CollectorRegistry, start_http_server
    from torch.utils.tensorboard import SummaryWriter

    from lanceloader import metrics

    loader = Loader(uri, **kwargs)
    stop, server, writer = threading.Event(), None, None
    batches: Any = loader
    if exporters:
        registry = CollectorRegistry()
        metrics.prometheus(loader, registry=registry)
        server, _ = start_http_server(0, addr="127.0.0.1", registry=registry)
        url = f"http://127.0.0.1:{server.server_port}/metrics"

        def scrape() -> None:
            while not stop.wait(SCRAPE_S):
                urllib.request.urlopen(url, timeout=30).read()

        threading.Thread(target=scrape, daemon=True).start()
        writer = SummaryWriter(log_dir=str(logdir))
        batches = metrics.log_every(loader, writer, LOG_EVERY)
    rows = 0
    cpu = time.process_time()
    start = time.perf_counter()
    for batch in batches:
        rows += len(batch["id"])
        if rows >= limit:
            break
    elapsed = time.perf_counter() - start
    cpu = time.process_time() - cpu
    stop.set()
    if server is not None:
        server.shutdown()
        server.server_close()
    if writer is not None:
        writer.close()
    return Run(rows / elapsed, cpu / rows * 1e6)


def export_call_costs(
    uri: str, kwargs: dict[str, Any], logdir: Path, calls: int = 200
) -> dict[str, float]:
    """Seconds of one ``log_every`` write and one Prometheus scrape, after a full epoch (the
    stats of a real run; the best of ``calls``)."""
    from prometheus_client import CollectorRegistry, generate_latest
    from torch.utils.tensorboard import SummaryWriter

    from lanceloader import metrics

    loader = Loader(uri, **kwargs)
    writer = SummaryWriter(log_dir=str(logdir))
    logged = metrics.log_every(loader, writer, LOG_EVERY)
    for _ in logged:
        pass
    registry = CollectorRegistry()
    metrics.prometheus(loader, registry=registry)
    costs = {}
    for name, call in (("write_s", logged.write), ("scrape_s", lambda: generate_latest(registry))):
        best = float("inf")
        for _ in range(calls):
            t0 = time.perf_counter()
            call()
            best = min(best, time.perf_counter() - t0)
        costs[name] = best
    writer.close()
    return costs


# --- recorder micro-benchmark ----------------------------------------------------------------


def recorder_seconds(recorder: Recorder, batches: int, batches_per_read: int) -> float:
    """Seconds for the recording calls of ``batches`` batches read ``batches_per_read`` at once."""
    counters = recorder.new_epoch()
    seconds = {"read": 0.01, "transform": 0.0, "convert": 0.001}
    start = time.perf_counter()
    for i in range(batches):
        if i % batches_per_read == 0:
            recorder.task(seconds, BATCH_SIZE * batches_per_read, 1 << 20, 4, 0, 2)
        count_delivered(counters, BATCH_SIZE, 68_000, 1e-5, 1e-5, 1.0)  # as the loader does
    return time.perf_counter() - start


def recorder_cost_us(batches_per_read: int, batches: int = 200_000, repeats: int = 5) -> float:
    """Microseconds per batch that recording costs: real recorder minus ``NullRecorder``."""
    real = min(recorder_seconds(Recorder(), batches, batches_per_read) for _ in range(repeats))
    null = min(recorder_seconds(NullRecorder(), batches, batches_per_read) for _ in range(repeats))
    return max(0.0, real - null) / batches * 1e6


def timing_cost_us(uri: str, calls: int = 20_000) -> dict[str, float]:
    """What stats-off keeps, in µs: a ``perf_counter`` call, Lance's ``io_stats_incremental()``
    (once per read), and ``RecordBatch.nbytes`` of a 256-row slice of a read (once per batch)."""
    ds = lance.dataset(uri)
    batch = to_record_batch(ds.to_table(columns=COLUMNS, limit=65_536).slice(1024, BATCH_SIZE))
    probes: dict[str, Callable[[], object]] = {
        "perf_counter_us": time.perf_counter,
        "io_stats_incremental_us": ds.io_stats_incremental,
        "record_batch_nbytes_us": lambda: batch.nbytes,
    }
    costs = {}
    for name, probe in probes.items():
        start = time.perf_counter()
        for _ in range(calls):
            probe()
        costs[name] = (time.perf_counter() - start) / calls * 1e6
    return costs


def shares(
    micro: dict[str, Any], case: Case, batches_per_read: int, workers: int
) -> dict[str, float]:
    """Stats costs per batch, and their share of the time per batch at the stats-off speed.

    Consumer side: the recorder calls (what "off" removes), against the wall time per batch.
    Worker side (kept when off): ~6 ``perf_counter`` calls and one ``RecordBatch.nbytes`` per
    batch, one ``io_stats_incremental()`` per read, against the worker time per batch
    (wall time per batch x workers).
    """
    batch_us = BATCH_SIZE / statistics.median(case.off) * 1e6
    recorder = recorder_cost_us(batches_per_read)
    worker_side = (
        6 * micro["perf_counter_us"]
        + micro["record_batch_nbytes_us"]
        + micro["io_stats_incremental_us"] / batches_per_read
    )
    return {
        "batch_us": batch_us,
        "recorder_us_per_batch": recorder,
        "recorder_share": recorder / batch_us,
        "worker_us_per_batch": batch_us * workers,
        "worker_side_us_per_batch": worker_side,
        "worker_side_share": worker_side / (batch_us * workers),
    }


# --- report ----------------------------------------------------------------------------------


def machine_info() -> dict[str, Any]:
    """CPU count, load, platform and library versions, for the JSON record."""
    return {
        "cpu_count": os.cpu_count(),
        "load_average_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "lance": lance.__version__,
        "pyarrow": pa.__version__,
        "numpy": np.__version__,
        "lanceloader": lanceloader.__version__,
    }


def _rate(value: float) -> str:
    return f"{value / 1e6:.2f}M" if value >= 1e6 else f"{value / 1e3:.1f}k"


def print_table(cases: list[Case]) -> None:
    header = f"{'case':<14} {'on rows/s':>10} {'off rows/s':>11} {'overhead':>9} {'pairs':>17}"
    header += f" {'CPU/row':>8}  target  result"
    print(f"\n{header}\n{'-' * len(header)}")
    for c in cases:
        pairs = c.pair_overheads
        spread = f"{100 * min(pairs):+.1f}..{100 * max(pairs):+.1f}%"
        print(
            f"{c.name:<14} {_rate(statistics.median(c.on)):>10} "
            f"{_rate(statistics.median(c.off)):>11} {100 * c.overhead:>+8.2f}% {spread:>17}"
            f" {100 * c.cpu_overhead:>+7.2f}%  <={100 * TARGET_OVERHEAD:.0f}%    "
            f"{'PASS' if c.passed else 'FAIL'}"
        )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=2_000_000, help="dataset rows (default 2,000,000)")
    p.add_argument("--fragments", type=int, default=8, help="dataset fragments (default 8)")
    p.add_argument("--data-dir", type=Path, default=HERE / "data", help="where the dataset lives")
    p.add_argument("--repeats", type=int, default=7, help="(on, off) pairs per case (default 7)")
    p.add_argument(
        "--shuffle-rows", type=int, default=200_000, help="rows timed in the full-shuffle case"
    )
    p.add_argument("--num-workers", type=int, default=None, help="loader workers (default: cores)")
    p.add_argument(
        "--json", type=Path, default=HERE / "results" / "stats_overhead.json", help="JSON output"
    )
    p.add_argument("--strict", action="store_true", help="exit 1 if a case misses the target")
    p.add_argument(
        "--no-exporters",
        action="store_true",
        help="skip the exporters case (it needs torch and prometheus-client)",
    )
    args = p.parse_args(argv)
    for name in ("rows", "fragments", "repeats", "shuffle_rows"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run both cases and the micro-benchmarks, print the table, write the JSON."""
    args = parse_args(argv)
    started = time.perf_counter()
    info = machine_info()
    uri = prepare_dataset(args.data_dir, args.rows, args.fragments)
    warm_page_cache(uri)
    shuffle_rows = min(args.shuffle_rows, args.rows)
    print(f"{args.repeats} interleaved (on, off) pairs per case; {info['cpu_count']} cores")

    cases = []
    for name, shuffle, limit in (
        ("sequential", False, args.rows),
        ("full shuffle", True, shuffle_rows),
    ):
        print(f"{name} ...", flush=True)
        kwargs = loader_kwargs(shuffle, args.num_workers)
        cases.append(
            run_case(
                name, args.repeats, limit, lambda s, k=kwargs, n=limit: timed_run(uri, k, n, s)
            )
        )
    if not args.no_exporters:
        import tempfile

        print("exporters ...", flush=True)
        kwargs = loader_kwargs(False, args.num_workers)
        with tempfile.TemporaryDirectory() as logdir:
            exporters = run_case(
                "exporters",
                args.repeats,
                args.rows,
                lambda on: exporter_run(uri, kwargs, args.rows, on, Path(logdir)),
            )
            calls = export_call_costs(uri, kwargs, Path(logdir))
        cases.append(exporters)
    print_table(cases)
    if not args.no_exporters:
        epoch_s = args.rows / statistics.median(exporters.off)
        batches = -(-args.rows // BATCH_SIZE)
        per_epoch = batches / LOG_EVERY * calls["write_s"] + epoch_s / SCRAPE_S * calls["scrape_s"]
        calls.update(epoch_s=epoch_s, per_epoch_s=per_epoch, share_of_epoch=per_epoch / epoch_s)
        print(
            f"\nexport calls: a log_every write {1e3 * calls['write_s']:.3f} ms, a scrape "
            f"{1e3 * calls['scrape_s']:.3f} ms; per epoch ({batches:,} batches, "
            f"{epoch_s:.2f} s): {1e3 * per_epoch:.1f} ms = {100 * calls['share_of_epoch']:.3f}%"
            " of the epoch"
        )

    probe = Loader(uri, **loader_kwargs(False, args.num_workers))
    per_read = {"sequential": probe.batches_per_read}
    per_read["full shuffle"] = Loader(uri, **loader_kwargs(True, args.num_workers)).batches_per_read
    micro: dict[str, Any] = timing_cost_us(uri)
    print(
        f"\nper call: perf_counter {micro['perf_counter_us']:.3f} µs, RecordBatch.nbytes "
        f"{micro['record_batch_nbytes_us']:.2f} µs, io_stats_incremental "
        f"{micro['io_stats_incremental_us']:.2f} µs"
    )
    print("cost per batch, as a share of the time per batch at the stats-off speed:")
    if not args.no_exporters:
        micro["export_calls"] = calls
    for c in cases:
        if c.name not in per_read:
            continue
        micro[c.name] = shares(micro, c, per_read[c.name], probe.num_workers)
        m = micro[c.name]
        print(
            f"  {c.name:<14} consumer: recorder {m['recorder_us_per_batch']:.2f} µs of "
            f"{m['batch_us']:.1f} µs = {100 * m['recorder_share']:.3f}%; workers (kept when "
            f"off): {m['worker_side_us_per_batch']:.2f} µs of {m['worker_us_per_batch']:.1f} µs "
            f"= {100 * m['worker_side_share']:.2f}%"
        )

    elapsed = time.perf_counter() - started
    report = {
        "machine": info,
        "config": {
            "dataset": uri,
            "rows": args.rows,
            "fragments": args.fragments,
            "columns": COLUMNS,
            "batch_size": BATCH_SIZE,
            "seed": SEED,
            "repeats": args.repeats,
            "shuffle_rows": shuffle_rows,
            "num_workers": probe.num_workers,
            "batches_per_read": per_read,
        },
        "cases": [c.to_json() for c in cases],
        "micro": micro,
        "elapsed_s": elapsed,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {args.json} ({elapsed:.0f} s)")
    return 1 if args.strict and not all(c.passed for c in cases) else 0


if __name__ == "__main__":
    sys.exit(main())
