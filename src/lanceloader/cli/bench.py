"""``lanceloader bench``: run the Loader with the given settings and report its stats, with
optional JSON, PNG plot and Perfetto trace outputs. A named split (``--splits``, ``--split``) and
image decoding (``--decode-images``, with ``lanceloader.decode_images``) need no code of one's own.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from tqdm import tqdm

from lanceloader.batch.images import decode_images
from lanceloader.cli.bench_clips import clips_setting, media_hint, media_hints
from lanceloader.cli.errors import CommandError, input_errors, refuse_convertible
from lanceloader.engine.work import Transform
from lanceloader.loader import Loader

# The bench loop adds a point to the throughput series at most this often (and at each epoch end).
SAMPLE_EVERY_S = 0.1


def import_transform(
    spec: str, option: str = "--transform", example: str = "mypackage.transforms:decode"
) -> Transform:
    """The function named by ``module:function`` (``module:Class.method`` works too); errors
    name ``option`` and show ``example`` (``check-resume`` imports its loader factory so).

    The current directory goes on ``sys.path`` (as with ``python -m``; process workers inherit
    it), so ``mytransforms:decode`` finds ``./mytransforms.py``.

    >>> import_transform("json:dumps").__name__
    'dumps'
    >>> import_transform("json.dumps")
    Traceback (most recent call last):
    ...
    lanceloader.cli.errors.CommandError: --transform must be module:function, e.g. mypackage.transforms:decode; got 'json.dumps'
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise CommandError(f"{option} must be module:function, e.g. {example}; got {spec!r}")
    if os.getcwd() not in sys.path:  # as `python -m` does; process workers inherit it
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # ImportError, or whatever importing the module raised
        raise CommandError(
            f"{option} {spec}: cannot import module {module_name!r} "
            f"({type(exc).__name__}: {exc}); is it on PYTHONPATH or in the current directory?"
        ) from exc
    value: Any = module
    for part in attr.split("."):
        if not hasattr(value, part):
            raise CommandError(f"{option} {spec}: {module_name!r} has no attribute {attr!r}")
        value = getattr(value, part)
    if not callable(value):
        raise CommandError(f"{option} {spec}: {attr!r} is a {type(value).__name__}, not a function")
    return value


def parse_splits(text: str) -> dict[str, float]:
    """``--splits``: ``NAME=FRACTION,...`` as the Loader's ``splits``, in the order given (the
    order places each split's share of the hash range, so it is part of the split).

    >>> parse_splits("train=0.9, val=0.1")
    {'train': 0.9, 'val': 0.1}
    >>> parse_splits("train:0.9")
    Traceback (most recent call last):
    ...
    lanceloader.cli.errors.CommandError: --splits must be NAME=FRACTION,... e.g. train=0.9,val=0.1; got 'train:0.9'
    """
    splits: dict[str, float] = {}
    for item in text.split(","):
        name, sep, fraction = item.strip().partition("=")
        try:
            value = float(fraction)
        except ValueError:
            value = None
        if not sep or not name.strip() or value is None or name.strip() in splits:
            raise CommandError(
                f"--splits must be NAME=FRACTION,... e.g. train=0.9,val=0.1; got {text!r}"
            )
        splits[name.strip()] = value
    return splits


def split_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The Loader's ``splits``, ``split`` and ``split_key`` from ``--splits``, ``--split`` and
    ``--split-key``; one without the other is an error naming the missing flag."""
    if args.split is None and args.splits is None:
        if args.split_key is not None:
            raise CommandError("--split-key needs --splits and --split")
        return {}
    if args.splits is None:
        raise CommandError(
            f"--split {args.split} needs --splits, the fractions of every split, e.g. "
            f"--splits {args.split}=0.9,rest=0.1"
        )
    splits = parse_splits(args.splits)
    if args.split is None:
        raise CommandError(f"--splits needs --split, one of {', '.join(splits)}")
    return {"splits": splits, "split": args.split, "split_key": args.split_key}


def transforms(args: argparse.Namespace) -> list[Transform]:
    """The batch transforms of ``--decode-images`` (first) and ``--transform``, in that order."""
    if args.image_size is not None and not args.decode_images:
        raise CommandError("--image-size resizes decoded images: add --decode-images COLUMN")
    steps: list[Transform] = []
    if args.decode_images:
        with input_errors():  # no Pillow: an ImportError that names the install
            try:
                steps.append(decode_images(args.decode_images, args.image_size))
            except ImportError as exc:
                raise CommandError(f"--decode-images: {exc}") from exc
    if args.transform:
        steps.append(import_transform(args.transform))
    return steps


@contextlib.contextmanager
def image_size_errors(args: argparse.Namespace) -> Iterator[None]:
    """Images of different sizes met by ``--decode-images`` without ``--image-size`` (a
    ``ValueError`` from ``decode_images``, which says ``pass size=``): a one-line
    :class:`CommandError` that names the flag to add. Other errors pass as they are."""
    try:
        yield
    except ValueError as exc:
        if not args.decode_images or args.image_size is not None or "pass size=" not in str(exc):
            raise
        why = str(exc).split("; pass size=")[0]
        raise CommandError(
            f"--decode-images {args.decode_images}: {why}; add --image-size PX or HxW to "
            "resize every image"
        ) from exc


def loader_settings(args: argparse.Namespace) -> dict[str, Any]:
    """``Loader`` keyword arguments from the ``bench`` arguments.

    >>> ns = argparse.Namespace(batch_size=64, columns="id, x", filter=None, shuffle=True,
    ...                         block_size=1024, window=None, seed=0, workers=2,
    ...                         worker_type="thread", rows_per_read=None, prefetch=None,
    ...                         output="numpy", transform=None, splits="train=0.9,val=0.1",
    ...                         split="val", split_key=None, decode_images=None,
    ...                         image_size=None)
    >>> loader_settings(ns)["columns"], loader_settings(ns)["split"]
    (['id', 'x'], 'val')
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
        **split_settings(args),
    }
    steps = transforms(args)
    if steps:
        settings["transform"] = steps[0] if len(steps) == 1 else steps
    clips = clips_setting(args)  # --clips / --audio: clips through the Loader (bench_clips.py)
    if clips is not None:
        settings["clips"] = clips
    return settings


def describe_order(loader: Loader) -> str:
    """``sequential``, ``full shuffle (seed 0)`` or ``block shuffle (1024 rows x 8, seed 0)``."""
    order = loader.order
    if not order.shuffle:
        return "sequential"
    if order.block_size == 1:
        return f"full shuffle (seed {order.seed})"
    return f"block shuffle ({order.block_size} rows x {order.window} blocks, seed {order.seed})"


def series_point(
    loader: Loader, start: float, previous: dict[str, float], epoch: int, end: bool = False
) -> dict[str, float]:
    """One point of the throughput series: seconds since ``start``, rows so far, rows/s since
    ``previous``, and whether it closes an epoch (``epoch_end``: its interval is short and
    ends with the prefetched batches draining, so its rate is no steady-state figure). Rows
    come from the loader's recorder, so they reconcile with its stats."""
    t = time.perf_counter() - start
    rows = int(loader.recorder.total_counters()["rows"])
    dt = t - previous["t"]
    rate = (rows - previous["rows"]) / dt if dt > 0 else 0.0
    return {"t": round(t, 4), "epoch": epoch, "rows": rows, "rows_per_s": rate, "epoch_end": end}


def resampled_rates(
    points: list[dict[str, Any]], every_s: float = SAMPLE_EVERY_S
) -> tuple[list[float], list[float]]:
    """Rows/s over equal intervals of ``every_s``, from the rows delivered so far interpolated
    between the points: an epoch-end point, whose own interval is short and ends as the
    prefetched batches drain, then counts for what it is (rows at a time) instead of a spike.

    >>> points = [{"t": 0, "rows": 0}, {"t": 0.1, "rows": 100}, {"t": 0.101, "rows": 190},
    ...           {"t": 0.2, "rows": 200}]
    >>> [round(r) for r in resampled_rates(points)[1]]
    [1000, 1000]
    """
    t = [p["t"] for p in points]
    rows = [p["rows"] for p in points]
    if len(t) < 2 or t[-1] <= 0:
        return [], []
    steps = max(1, round(t[-1] / every_s))
    width = t[-1] / steps
    edges = [k * width for k in range(steps + 1)]
    at = np.interp(edges, t, rows)
    return edges[1:], (np.diff(at) / width).tolist()


def describe_batch(batch: Any) -> dict[str, str]:
    """Each column of a delivered batch: its type and shape (``uint8 [64, 8, 8, 3]``), or the
    length of a list.

    >>> describe_batch({"image": np.zeros((4, 8, 8, 3), np.uint8), "text": ["a", "b"]})
    {'image': 'uint8 [4, 8, 8, 3]', 'text': 'list [2]'}
    """
    if hasattr(batch, "schema") and hasattr(batch, "column_names"):  # an Arrow RecordBatch
        return {
            name: f"{batch.schema.field(name).type} [{batch.num_rows}]"
            for name in batch.column_names
        }
    if not isinstance(batch, dict):
        return {"batch": type(batch).__name__}
    out = {}
    for name, value in batch.items():
        shape = getattr(value, "shape", None)
        if shape is not None:
            dtype = str(getattr(value, "dtype", "")).removeprefix("torch.")
            out[name] = f"{dtype} [{', '.join(map(str, shape))}]"
        else:
            out[name] = (
                f"{type(value).__name__} [{len(value)}]"
                if hasattr(value, "__len__")
                else type(value).__name__
            )
    return out


@dataclass
class BenchRun:
    """What the bench loop saw: the throughput series, whether Ctrl-C cut it short, and what the
    first batch held (:func:`describe_batch`)."""

    series: list[dict[str, float]]
    interrupted: bool = False
    epochs: int = 0  # epochs started, the last one perhaps cut short
    first_batch: dict[str, str] | None = None


def run_bench(
    loader: Loader, epochs: int = 1, max_batches: int | None = None, every_s: float = SAMPLE_EVERY_S
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
            run.epochs += 1
            run_epoch_with_series(loader, max_batches, start, every_s, run)
    except KeyboardInterrupt:
        run.interrupted = True
        run.series.append(series_point(loader, start, run.series[-1], loader.epoch))
    return run


def run_epoch_with_series(
    loader: Loader, max_batches: int | None, start: float, every_s: float, run: BenchRun
) -> None:
    """One epoch of :func:`run_bench`, appending to ``run.series``; an epoch cut short at
    ``max_batches`` is ended there (the next one starts at its beginning)."""
    series = run.series
    epoch = loader.epoch
    total = len(loader) if max_batches is None else min(len(loader), max_batches)
    desc = f"epoch {epoch}"
    with tqdm(total=total, desc=desc, unit="batch", file=sys.stderr) as bar, iter(loader) as it:
        for done, batch in enumerate(it, 1):
            if run.first_batch is None:
                run.first_batch = describe_batch(batch)
            bar.update()
            if time.perf_counter() - start - series[-1]["t"] >= every_s:
                series.append(series_point(loader, start, series[-1], epoch))
                bar.set_postfix_str(f"{series[-1]['rows_per_s']:,.0f} rows/s", refresh=False)
            if done >= total:
                break
        series.append(series_point(loader, start, series[-1], epoch, end=True))  # before close()
    if loader.epoch == epoch:  # cut short: the cursor stays mid-epoch until told otherwise
        loader.set_epoch(epoch + 1)


def bench_report(
    loader: Loader, args: argparse.Namespace, series: list[dict[str, float]], epochs: int
) -> dict[str, Any]:
    """The JSON document of ``bench --json``: settings, total and per-epoch stats, the series."""
    return {
        "uri": loader.source.dataset_name.uri,
        "version": loader.source.dataset_name.version,
        "settings": {
            "batch_size": loader.batch_size,
            "columns": loader.source.columns,
            "filter": loader.source.settings()["filter"],
            "splits": loader.source.settings().get("splits"),
            "split": loader.source.settings().get("split"),
            "split_key": loader.source.settings().get("split_key"),
            "decode_images": args.decode_images,
            "image_size": args.image_size,
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
            "clips": loader.source.settings().get("clips"),
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
    """A PNG: throughput over time in equal intervals (epoch ends marked), the workers' time per
    stage (summed over workers) and the training loop's wall time, with the verdict."""
    from matplotlib.figure import Figure  # no pyplot: no global state, no GUI backend

    stats = report["stats"]
    fig = Figure(figsize=(14, 4), layout="constrained")
    over_time, workers, loop = fig.subplots(1, 3, width_ratios=(2, 1, 1))
    points = report["series"]
    times, rates = resampled_rates(points)
    over_time.plot(times, rates, drawstyle="steps-pre", label="rows/s per 0.1 s")
    for i, p in enumerate(p for p in points if p.get("epoch_end")):
        over_time.axvline(
            p["t"],
            color="grey",
            linewidth=0.6,
            linestyle=":",
            label="epoch end" if i == 0 else None,
        )
    over_time.set(
        title="throughput",
        xlabel="seconds",
        ylabel="rows/s",
        ylim=(0, 1.15 * max(rates) if rates else None),
    )
    over_time.legend(loc="lower right", fontsize="small")
    worker_stages = {
        "read": stats["read_s"],
        "transform": stats["transform_s"],
        "convert": stats["convert_s"],
    }
    workers.barh(list(worker_stages)[::-1], list(worker_stages.values())[::-1])
    workers.set(title=f"workers ({stats['workers']})", xlabel="seconds, summed over workers")
    loop_stages = {"waited for data": stats["wait_s"], "worked (training step)": stats["step_s"]}
    loop.barh(list(loop_stages)[::-1], list(loop_stages.values())[::-1], color="tab:orange")
    loop.set(title="training loop", xlabel="wall seconds")
    fig.suptitle(
        f"lanceloader bench {report['uri']} ({report['settings']['order']}); "
        f"bottleneck: {stats['bottleneck']['stage']}"
    )
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
    refuse_convertible(args.uri, "bench")
    with media_hints(args), input_errors():  # --clips / --audio named for a media dataset
        loader = Loader(args.uri, **loader_settings(args))
    split = f" of split {args.split!r}" if args.split else ""
    clips = loader.source.settings().get("clips")  # --clips / --audio: rows are clips
    unit = "rows" if clips is None else "clips" if clips["kind"] == "video" else "windows"
    print(
        f"lanceloader bench {loader.source.dataset_name.uri} "
        f"(version {loader.source.dataset_name.version}): "
        f"{loader.source.num_rows:,} {unit}{split}, batch {loader.batch_size}, "
        f"{describe_order(loader)}, "
        f"{loader.num_workers} {args.worker_type} worker{'s' if loader.num_workers > 1 else ''}"
    )
    if clips is None and (hint := media_hint(loader.source.schema_table().column_names)):
        print(hint)  # a dataset of videos or audio read as raw bytes: --clips / --audio
    mixing = loader.mixing_report()  # of the first epoch's order, before it runs
    tracing = loader.trace(args.trace) if args.trace else contextlib.nullcontext()
    with tracing, image_size_errors(args):
        run = run_bench(loader, args.epochs, args.max_batches)
    if run.interrupted:
        print("interrupted: the stats cover what ran until Ctrl-C")
    epochs = run.epochs
    if run.first_batch:
        print("first batch: " + ", ".join(f"{k} {v}" for k, v in run.first_batch.items()))
    print_stats(loader, epochs)
    if clips is not None:
        stats = loader.stats()
        print(f"{unit}: {stats.rows:,} in {stats.wall_s:.2f} s, {stats.rows_per_s:,.1f} {unit}/s")
    print(mixing)
    report = {
        **bench_report(loader, args, run.series, epochs),
        "mixing": mixing.to_dict(),
        "first_batch": run.first_batch,
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    if args.plot:
        write_plot(args.plot, report)
    for flag in ("json", "plot", "trace"):
        if getattr(args, flag):
            print(f"wrote --{flag} {getattr(args, flag)}")
    return 130 if run.interrupted else 0
