"""Command line: ``lanceloader demo``, ``lanceloader bench`` and ``lanceloader inspect``.

``demo`` runs one epoch of each order mode (sequential, block shuffle, full shuffle) on a
generated or given dataset and prints rows/s, MB/s and time to first batch. ``bench`` runs the
Loader with the given settings and a progress bar, then prints ``loader.stats()`` (a table and
the bottleneck verdict); it can also write the stats and a throughput time series as JSON, a PNG
plot and a Perfetto trace. ``inspect`` describes a dataset: versions, schema, rows, fragments,
bytes per column, and what each column becomes as a NumPy array.

Bad arguments and bad input (a missing dataset, an unknown column, a bad filter, a transform that
cannot be imported) print one line on stderr and exit with code 2.

Example::

    $ lanceloader demo                 # writes ~/.cache/lanceloader/demo-300000.lance once
    $ lanceloader bench data/train.lance --shuffle --block-size 1024 --json stats.json
    $ lanceloader inspect data/train.lance
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import re
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import numpy as np
import pyarrow as pa
from tqdm import tqdm

from lanceloader.convert import LENGTHS_SUFFIX, check_schema, to_output
from lanceloader.demo import cached_demo_dataset
from lanceloader.loader import Loader
from lanceloader.source import Source
from lanceloader.workers import Transform

MODES = {
    "sequential": {"shuffle": False},
    "block shuffle": {"shuffle": True, "shuffle_block_size": 1024, "shuffle_window": 8},
    "full shuffle": {"shuffle": True, "shuffle_block_size": 1},
}
# The bench loop adds a point to the throughput series at most this often (and at each epoch end).
SAMPLE_EVERY_S = 0.1
INSPECT_SAMPLE_ROWS = 16
INSPECT_VERSIONS_SHOWN = 10
# Errors of the library that mean "bad input": reported as one line, exit code 2.
INPUT_ERRORS = (ValueError, TypeError, FileNotFoundError, NotImplementedError)
_RUST_LOCATION = re.compile(r",?\s*/\S+\.rs:\d+:\d+")


class CommandError(Exception):
    """A bad argument or bad input: ``main`` prints it as one line and returns 2."""


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line on stderr (exit code 2), no usage dump."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {one_line(message)} (see {self.prog} --help)\n")


def one_line(message: object) -> str:
    """``message`` on one line: whitespace runs become one space, and the Rust source locations
    that Lance appends to its errors are dropped.

    >>> one_line("no field 'y'.\\n  Valid: x, /home/ci/lance/rust/src/scanner.rs:839:33)")
    "no field 'y'. Valid: x)"
    """
    return " ".join(_RUST_LOCATION.sub("", str(message)).split())


@contextlib.contextmanager
def input_errors() -> Iterator[None]:
    """Turn the library's bad-input errors raised inside the block into :class:`CommandError`."""
    try:
        yield
    except INPUT_ERRORS as exc:
        raise CommandError(str(exc)) from exc


# --- demo ------------------------------------------------------------------------------------


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


# --- bench -----------------------------------------------------------------------------------


def import_transform(spec: str) -> Transform:
    """The function named by ``module:function`` (``module:Class.method`` works too).

    The current directory goes on ``sys.path`` (as with ``python -m``; process workers inherit
    it), so ``mytransforms:decode`` finds ``./mytransforms.py``.

    >>> import_transform("json:dumps").__name__
    'dumps'
    >>> import_transform("json.dumps")
    Traceback (most recent call last):
    ...
    lanceloader.cli.CommandError: --transform must be module:function, e.g. mypackage.transforms:decode; got 'json.dumps'
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise CommandError(
            f"--transform must be module:function, e.g. mypackage.transforms:decode; got {spec!r}"
        )
    if os.getcwd() not in sys.path:  # as `python -m` does; process workers inherit it
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # ImportError, or whatever importing the module raised
        raise CommandError(
            f"--transform {spec}: cannot import module {module_name!r} "
            f"({type(exc).__name__}: {exc}); is it on PYTHONPATH or in the current directory?"
        ) from exc
    value: Any = module
    for part in attr.split("."):
        if not hasattr(value, part):
            raise CommandError(f"--transform {spec}: {module_name!r} has no attribute {attr!r}")
        value = getattr(value, part)
    if not callable(value):
        raise CommandError(
            f"--transform {spec}: {attr!r} is a {type(value).__name__}, not a function"
        )
    return value


def loader_settings(args: argparse.Namespace) -> dict[str, Any]:
    """``Loader`` keyword arguments from the ``bench`` arguments.

    >>> ns = argparse.Namespace(batch_size=64, columns="id, x", filter=None, shuffle=True,
    ...                         block_size=1024, window=None, seed=0, workers=2,
    ...                         worker_type="thread", rows_per_read=None, prefetch=None,
    ...                         output="numpy", transform=None)
    >>> loader_settings(ns)["columns"], loader_settings(ns)["shuffle_block_size"]
    (['id', 'x'], 1024)
    """
    if not args.shuffle and (args.block_size is not None or args.window is not None):
        raise CommandError("--block-size and --window set a shuffle; add --shuffle")
    settings: dict[str, Any] = {
        "batch_size": args.batch_size,
        "columns": [c.strip() for c in args.columns.split(",")] if args.columns else None,
        "filter": args.filter,
        "shuffle": args.shuffle,
        "shuffle_block_size": args.block_size or 1,
        "shuffle_window": args.window,
        "seed": args.seed,
        "num_workers": args.workers,
        "rows_per_read": args.rows_per_read,
        "prefetch": args.prefetch,
        "worker_type": args.worker_type,
        "output": args.output,
    }
    if args.transform:
        settings["transform"] = import_transform(args.transform)
    return settings


def describe_order(loader: Loader) -> str:
    """``sequential``, ``full shuffle (seed 0)`` or ``block shuffle (1024 rows x 8, seed 0)``."""
    order = loader.order
    if not order.shuffle:
        return "sequential"
    if order.block_size == 1:
        return f"full shuffle (seed {order.seed})"
    return f"block shuffle ({order.block_size} rows x {order.window} blocks, seed {order.seed})"


def series_point(loader: Loader, start: float, previous: dict[str, float]) -> dict[str, float]:
    """One point of the throughput series: seconds since ``start``, rows so far, rows/s since
    ``previous``. Rows come from the loader's recorder, so they reconcile with its stats."""
    t = time.perf_counter() - start
    rows = int(loader.recorder.total_counters()["rows"])
    dt = t - previous["t"]
    rate = (rows - previous["rows"]) / dt if dt > 0 else 0.0
    return {"t": round(t, 4), "epoch": loader.epoch - 1, "rows": rows, "rows_per_s": rate}


@dataclass
class BenchRun:
    """What the bench loop saw: the throughput series, and whether Ctrl-C cut it short."""

    series: list[dict[str, float]]
    interrupted: bool = False


def run_bench(
    loader: Loader,
    epochs: int = 1,
    max_batches: int | None = None,
    every_s: float = SAMPLE_EVERY_S,
) -> BenchRun:
    """Iterate ``epochs`` epochs of at most ``max_batches`` batches each, with a progress bar on
    stderr. The throughput series gets a point every ``every_s`` seconds and at each epoch end.
    Ctrl-C stops the loop (the workers too) and returns what was measured so far.

    >>> import tempfile
    >>> from lanceloader.demo import write_demo_dataset
    >>> uri = write_demo_dataset(tempfile.mkdtemp() + "/demo.lance", rows=1000)
    >>> loader = Loader(uri, batch_size=100)
    >>> run = run_bench(loader, epochs=2, max_batches=4)
    >>> run.series[-1]["rows"], loader.stats().rows, run.interrupted
    (800, 800, False)
    """
    start = time.perf_counter()
    run = BenchRun([{"t": 0.0, "epoch": loader.epoch, "rows": 0, "rows_per_s": 0.0}])
    try:
        for _ in range(epochs):
            run_epoch_with_series(loader, max_batches, start, every_s, run.series)
    except KeyboardInterrupt:
        run.interrupted = True
        run.series.append(series_point(loader, start, run.series[-1]))
    return run


def run_epoch_with_series(
    loader: Loader,
    max_batches: int | None,
    start: float,
    every_s: float,
    series: list[dict[str, float]],
) -> None:
    """One epoch of :func:`run_bench`, appending to ``series``."""
    total = len(loader) if max_batches is None else min(len(loader), max_batches)
    desc = f"epoch {loader.epoch}"
    with tqdm(total=total, desc=desc, unit="batch", file=sys.stderr) as bar, iter(loader) as it:
        for done, _batch in enumerate(it, 1):
            bar.update()
            if time.perf_counter() - start - series[-1]["t"] >= every_s:
                series.append(series_point(loader, start, series[-1]))
                bar.set_postfix_str(f"{series[-1]['rows_per_s']:,.0f} rows/s", refresh=False)
            if done >= total:
                break
        series.append(series_point(loader, start, series[-1]))  # before close() joins workers


def bench_report(
    loader: Loader, args: argparse.Namespace, series: list[dict[str, float]], epochs: int
) -> dict[str, Any]:
    """The JSON document of ``bench --json``: settings, total and per-epoch stats, the series."""
    return {
        "uri": loader.source.uri,
        "version": loader.source.version,
        "settings": {
            "batch_size": loader.batch_size,
            "columns": loader.source.columns,
            "filter": loader.source.filter,
            "order": describe_order(loader),
            "shuffle": loader.order.shuffle,
            "block_size": loader.order.block_size,
            "window": loader.order.window,
            "seed": loader.order.seed,
            "workers": loader.num_workers,
            "rows_per_read": loader.batches_per_read * loader.batch_size,
            "prefetch": loader.prefetch,
            "worker_type": args.worker_type,
            "output": loader.output,
            "transform": args.transform,
            "epochs": epochs,
            "max_batches": args.max_batches,
        },
        "stats": loader.stats().to_dict(),
        "epochs": [loader.stats(epoch=e).to_dict() for e in range(epochs)],
        "series": series,
    }


def require_matplotlib() -> None:
    """Fail at once, before the bench runs, when ``--plot`` cannot work."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise CommandError(
            "--plot needs matplotlib, which is not installed: pip install matplotlib"
        ) from exc


def write_plot(path: str, report: dict[str, Any]) -> None:
    """A PNG: throughput over time (left) and time per stage (right), titled with the verdict."""
    from matplotlib.figure import Figure  # no pyplot: no global state, no GUI backend

    stats = report["stats"]
    fig = Figure(figsize=(11, 4), layout="constrained")
    over_time, per_stage = fig.subplots(1, 2)
    points = report["series"]  # each rate holds from the previous point to its own
    over_time.plot(
        [p["t"] for p in points], [p["rows_per_s"] for p in points], drawstyle="steps-pre"
    )
    over_time.set(title="throughput", xlabel="seconds", ylabel="rows/s", ylim=(0, None))
    stages = {
        "read (workers)": stats["read_s"],
        "transform (workers)": stats["transform_s"],
        "convert (workers)": stats["convert_s"],
        "loop waited": stats["wait_s"],
        "loop worked": stats["step_s"],
    }
    per_stage.barh(list(stages)[::-1], list(stages.values())[::-1])
    per_stage.set(
        title=f"time per stage; bottleneck: {stats['bottleneck']['stage']}",
        xlabel="seconds (worker stages: summed over workers)",
    )
    fig.suptitle(f"lanceloader bench {report['uri']} ({report['settings']['order']})")
    fig.savefig(path, dpi=100)


def check_output_paths(args: argparse.Namespace) -> None:
    """Fail before the bench runs if an output file cannot be written (no such directory), or
    if ``--plot`` is asked for without matplotlib."""
    for flag in ("json", "plot", "trace"):
        path = getattr(args, flag)
        parent = os.path.dirname(os.path.abspath(path)) if path else ""
        if path and not os.path.isdir(parent):
            raise CommandError(f"--{flag} {path}: directory {parent!r} does not exist")
    if args.plot:
        require_matplotlib()


def print_stats(loader: Loader, epochs: int) -> None:
    """One line per epoch when there are several, then the table and verdict of all of them."""
    if epochs > 1:
        for e in range(epochs):
            s = loader.stats(epoch=e)
            print(
                f"epoch {e}: {s.rows:,} rows, {s.rows_per_s:,.0f} rows/s, {s.wall_s:.2f} s, "
                f"bottleneck: {s.bottleneck.stage}"
            )
    print(loader.stats())


def bench(args: argparse.Namespace) -> int:
    """``lanceloader bench``: run the loader, print its stats, write JSON / plot / trace.

    Returns 0, or 130 when interrupted by Ctrl-C (after reporting what was measured).
    """
    check_output_paths(args)
    with input_errors():
        loader = Loader(args.uri, **loader_settings(args))
    print(
        f"lanceloader bench {loader.source.uri} (version {loader.source.version}): "
        f"{loader.source.num_rows:,} rows, batch {loader.batch_size}, {describe_order(loader)}, "
        f"{loader.num_workers} {args.worker_type} worker{'s' if loader.num_workers > 1 else ''}"
    )
    tracing = loader.trace(args.trace) if args.trace else contextlib.nullcontext()
    with tracing:
        run = run_bench(loader, args.epochs, args.max_batches)
    if run.interrupted:
        print("interrupted: the stats cover what ran until Ctrl-C")
    epochs = loader.epoch  # epochs started, the last one perhaps cut short
    print_stats(loader, epochs)
    report = bench_report(loader, args, run.series, epochs)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    if args.plot:
        write_plot(args.plot, report)
    for flag in ("json", "plot", "trace"):
        if getattr(args, flag):
            print(f"wrote --{flag} {getattr(args, flag)}")
    return 130 if run.interrupted else 0


# --- inspect ---------------------------------------------------------------------------------


def format_bytes(n: float) -> str:
    """Decimal units: ``format_bytes(256_000) == '256.0 kB'``.

    >>> format_bytes(999), format_bytes(256_000), format_bytes(3.2e9)
    ('999 B', '256.0 kB', '3.2 GB')
    """
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def aligned(rows: list[tuple[str, ...]], indent: str = "  ") -> list[str]:
    """Rows of cells as lines, each column left-aligned to its widest cell.

    >>> aligned([("a", "bb", "c"), ("ddd", "e", "f")])
    ['  a    bb  c', '  ddd  e   f']
    """
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    cells = [[*(c.ljust(w) for c, w in zip(r, widths, strict=False)), r[-1]] for r in rows]
    return [(indent + "  ".join(r)).rstrip() for r in cells]


def column_bytes(ds: Any, table_sample: pa.Table) -> tuple[dict[str, float], str]:
    """Bytes on disk per top-level column, and where the numbers come from.

    Lance's data statistics (``ds.stats.data_stats()``, per field id, summed over a column's
    nested fields) when this Lance has them; otherwise an estimate: the Arrow bytes of a sample
    of rows, scaled to all rows.
    """
    try:
        per_field = {f.id: f.bytes_on_disk for f in ds.stats.data_stats().fields}

        def total(field: Any) -> int:
            return per_field.get(field.id(), 0) + sum(total(c) for c in field.children())

        sizes = {f.name(): float(total(f)) for f in ds.lance_schema.fields()}
        return sizes, "on disk, from Lance's data statistics"
    except Exception:  # an older Lance: estimate from the sample
        scale = ds.count_rows() / max(1, table_sample.num_rows)
        sizes = {c: table_sample.column(c).nbytes * scale for c in table_sample.column_names}
        return sizes, f"estimated from the Arrow size of {table_sample.num_rows} rows"


def describe_numpy(value: Any, padded: bool = False) -> str:
    """What one converted column is: ``float32 [n, 64]``, ``list of str``, a struct's fields.
    ``padded``: the second dimension is the longest row of each batch.

    >>> describe_numpy(np.zeros((16, 64), np.float32)), describe_numpy(["a", "b"])
    ('float32 [n, 64]', 'list of str')
    >>> describe_numpy(np.zeros((16, 5)), padded=True)
    'float64 [n, longest]'
    """
    if isinstance(value, np.ndarray):
        dims = ["n", *map(str, value.shape[1:])]
        if padded and len(dims) > 1:
            dims[1] = "longest"
        return f"{value.dtype} [{', '.join(dims)}]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {describe_numpy(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        kinds = sorted({type(v).__name__ for v in value}) or ["nothing"]
        return f"list of {'/'.join(kinds)}"
    return type(value).__name__


def is_tensor(value: Any) -> bool:
    """Whether a converted column is numbers only (arrays, or a struct of arrays)."""
    if isinstance(value, dict):
        return all(is_tensor(v) for v in value.values())
    return isinstance(value, np.ndarray) and value.dtype.kind in "biuf"


def describe_conversion(name: str, sample: pa.Table) -> str:
    """How column ``name`` of ``sample`` converts with ``to_output(..., "numpy")``, or why not;
    notes a column that NumPy takes but torch does not (``uint64``).

    >>> describe_conversion("u", pa.table({"u": pa.array([1, 2], pa.uint64())}))
    "yes: uint64 [n]; torch: column 'u' is uint64, which torch tensors barely support (no +, no indexing); cast it: casts={'u': 'int64'} (values must be below 2**63)"
    """
    try:
        out = to_output(sample.select([name]), "numpy")
    except Exception as exc:
        return f"no: {one_line(exc)}"
    value, padded = out[name], name + LENGTHS_SUFFIX in out
    text = f"{'yes' if is_tensor(value) else 'no'}: {describe_numpy(value, padded)}"
    if padded:
        text += f" padded, lengths in {name}{LENGTHS_SUFFIX}"
    try:
        check_schema(sample.select([name]).schema, "torch")  # checks types; never imports torch
    except Exception as exc:
        text += f"; torch: {one_line(exc)}"
    return text


def deleted_note(ds: Any) -> str:
    """`` (N deleted)`` when rows of this version were deleted, else empty."""
    try:
        deleted = int(ds.stats.dataset_stats()["num_deleted_rows"])
    except Exception:  # an older Lance: say nothing
        return ""
    return f" ({deleted:,} deleted)" if deleted else ""


def version_lines(ds: Any, pinned: int, latest: int) -> list[str]:
    """The last versions, newest last: number, timestamp, tags; marks the inspected one."""
    versions = ds.versions()
    tags: dict[int, list[str]] = {}
    with contextlib.suppress(Exception):  # tags are optional metadata
        for tag, info in ds.tags.list().items():
            tags.setdefault(info["version"], []).append(tag)
    shown = versions[-INSPECT_VERSIONS_SHOWN:]
    lines = [f"  ... {len(versions) - len(shown)} earlier"] if len(versions) > len(shown) else []
    rows = []
    for v in shown:
        notes = [f"tag {t}" for t in sorted(tags.get(v["version"], []))]
        notes += ["inspected"] if v["version"] == pinned else []
        notes += ["latest"] if v["version"] == latest else []
        stamp = v["timestamp"].isoformat(sep=" ", timespec="seconds")
        rows.append((str(v["version"]), stamp, f"({', '.join(notes)})" if notes else ""))
    return lines + aligned(rows)


def inspect_lines(
    uri: str, version: int | str | None = None, sample_rows: int = INSPECT_SAMPLE_ROWS
) -> list[str]:
    """The report of ``lanceloader inspect``, line by line.

    >>> import tempfile, lance
    >>> uri = tempfile.mkdtemp() + "/tiny.lance"
    >>> _ = lance.write_dataset(pa.table({"id": [1, 2, 3]}), uri)
    >>> lines = inspect_lines(uri)
    >>> print("\\n".join(lines[1:3]))
    rows       3
    fragments  1, 3 to 3 rows each
    >>> lines[-1].split()[:2], lines[-1].endswith("yes: int64 [n]")
    (['id', 'int64'], True)
    """
    source = Source(uri, version=version)
    ds = source.dataset
    per_fragment = [f.count_rows() for f in ds.get_fragments()]
    sample = ds.to_table(limit=sample_rows)
    sizes, size_note = column_bytes(ds, sample)
    rows = [("column", "type", "bytes", f"as NumPy (first {sample.num_rows} rows)")]
    for f in source.schema:
        nullable = "" if f.nullable else " not null"
        rows.append(
            (
                f.name,
                f"{f.type}{nullable}",
                format_bytes(sizes.get(f.name, 0.0)),
                describe_conversion(f.name, sample),
            )
        )
    fragments = f"{len(per_fragment)}"
    if per_fragment:
        fragments += f", {min(per_fragment):,} to {max(per_fragment):,} rows each"
    return [
        f"dataset    {source.uri}",
        f"rows       {source.num_rows:,}{deleted_note(ds)}",
        f"fragments  {fragments}",
        f"bytes      {format_bytes(sum(sizes.values()))} ({size_note})",
        "versions",
        *version_lines(ds, source.version, ds.latest_version),
        f"columns    {len(source.schema)}",
        *aligned(rows),
    ]


def inspect(args: argparse.Namespace) -> int:
    """``lanceloader inspect``: print what the dataset holds and how its columns convert."""
    version = int(args.version) if args.version and args.version.isdigit() else args.version
    with input_errors():
        lines = inspect_lines(args.uri, version, args.sample_rows)
    print("\n".join(lines))
    return 0


# --- arguments -------------------------------------------------------------------------------


def positive_int(text: str) -> int:
    """argparse type: an int >= 1.

    >>> positive_int("3")
    3
    """
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


MAIN_EPILOG = """\
examples:
  lanceloader demo
  lanceloader bench data/train.lance --shuffle --block-size 1024 --json stats.json
  lanceloader inspect data/train.lance

Run `lanceloader COMMAND --help` for the options of each command.
"""

BENCH_EPILOG = """\
examples:
  lanceloader bench data/train.lance
  lanceloader bench data/train.lance --columns image,label --shuffle --workers 8
  lanceloader bench data/train.lance --shuffle --block-size 1024 --window 8 --epochs 2
  lanceloader bench data/train.lance --transform mytransforms:decode --max-batches 200 \\
      --json stats.json --plot stats.png --trace trace.json

--json writes loader.stats().to_dict(), the stats of each epoch and a throughput series;
--plot (needs matplotlib) draws throughput over time and time per stage; --trace writes a
Perfetto / chrome://tracing file (open it at https://ui.perfetto.dev).
"""

INSPECT_EPILOG = """\
examples:
  lanceloader inspect data/train.lance
  lanceloader inspect data/train.lance --version 3 --sample-rows 100
"""


def add_bench(sub: Any) -> None:
    b = sub.add_parser(
        "bench",
        help="run the loader with the given settings and report its stats",
        description="Run the Loader with a progress bar, then print loader.stats(): throughput,\n"
        "storage I/O, time per stage and the bottleneck verdict.",
        epilog=BENCH_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    b.add_argument("uri", help="a Lance dataset (local path or object store URI)")
    b.add_argument("--columns", metavar="A,B", help="comma-separated columns to read; default all")
    b.add_argument("--filter", metavar="SQL", help='SQL predicate, e.g. "label < 3"')
    b.add_argument("--batch-size", type=positive_int, default=256, metavar="N", help="default 256")
    b.add_argument("--shuffle", action="store_true", help="shuffle (default: dataset order)")
    b.add_argument(
        "--block-size",
        type=positive_int,
        metavar="K",
        help="rows read together when shuffling; default 1 (a full shuffle)",
    )
    b.add_argument(
        "--window", type=positive_int, metavar="W", help="blocks mixed together; default 8"
    )
    b.add_argument("--seed", type=int, default=0, metavar="S", help="shuffle seed; default 0")
    b.add_argument(
        "--workers", type=positive_int, metavar="N", help="worker count; default one per core"
    )
    b.add_argument("--worker-type", choices=("thread", "process"), default="thread")
    b.add_argument(
        "--rows-per-read",
        type=positive_int,
        metavar="N",
        help="rows fetched by one Lance call (one worker task); default by order",
    )
    b.add_argument(
        "--prefetch",
        type=positive_int,
        metavar="N",
        help="batches prepared ahead; default 2 x workers",
    )
    b.add_argument("--output", choices=("numpy", "torch", "arrow", "python"), default="numpy")
    b.add_argument(
        "--transform",
        metavar="MODULE:FUNCTION",
        help="a batch transform to import, e.g. mytransforms:decode",
    )
    b.add_argument("--epochs", type=positive_int, default=1, metavar="N", help="default 1")
    b.add_argument(
        "--max-batches", type=positive_int, metavar="N", help="stop each epoch after N batches"
    )
    b.add_argument("--json", metavar="PATH", help="write the stats and a throughput series")
    b.add_argument("--plot", metavar="PATH", help="write a PNG plot (needs matplotlib)")
    b.add_argument("--trace", metavar="PATH", help="write a Perfetto / Chrome trace")
    b.set_defaults(run=bench)


def add_inspect(sub: Any) -> None:
    i = sub.add_parser(
        "inspect",
        help="describe a dataset: versions, schema, rows, fragments, bytes, tensors",
        description="Describe a Lance dataset: versions, rows, fragments, bytes per column, and\n"
        "what each column becomes as a NumPy array (tried on the first rows).",
        epilog=INSPECT_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    i.add_argument("uri", help="a Lance dataset (local path or object store URI)")
    i.add_argument("--version", metavar="V", help="version number or tag; default the latest")
    i.add_argument(
        "--sample-rows",
        type=positive_int,
        default=INSPECT_SAMPLE_ROWS,
        metavar="N",
        help=f"rows converted to check each column; default {INSPECT_SAMPLE_ROWS}",
    )
    i.set_defaults(run=inspect)


def parser() -> argparse.ArgumentParser:
    """The ``lanceloader`` argument parser with its subcommands."""
    p = OneLineParser(
        prog="lanceloader",
        epilog=MAIN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Feed training loops from Lance datasets: try the loader (demo), measure it\n"
        "with your settings (bench), or look at a dataset (inspect).",
    )
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="load a dataset in each order mode and report the speed")
    d.add_argument("uri", nargs="?", help="a Lance dataset; default: a generated demo dataset")
    d.add_argument("--batch-size", type=positive_int, default=256)
    d.add_argument(
        "--rows", type=positive_int, default=300_000, help="rows of the generated dataset"
    )
    d.set_defaults(run=demo)
    add_bench(sub)
    add_inspect(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand; bad arguments or input print one line on stderr and return 2."""
    args = parser().parse_args(argv)
    try:
        return args.run(args)
    except CommandError as exc:
        print(f"lanceloader {args.command}: error: {one_line(exc)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
