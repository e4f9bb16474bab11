"""Decode at the ceiling: image transforms in the loader against the same decode on bare threads.

Method
------
Every target is a ratio of two numbers measured in the same process, on the same cores, over the
same JPEG bytes. Each repeat measures, in a rotating order (so drift on a shared machine hits
every case alike), for each transform: the *ceiling* -- the transform on a bare
``ThreadPoolExecutor`` of 1 and of 2 threads over RecordBatches already in memory, one batch per
task -- and the *loader* -- ``Loader(uri, transform=..., output="torch", num_workers=1 | 2)``
over one full epoch (it also reads the bytes from Lance and converts to torch). Both sides are
warmed once before the first repeat. Per repeat, the two sides of each ratio ran next to each
other, so each repeat gives its own ratio; the table quotes the median of those ratios with
their spread (min-max), and the medians of the rates. The process's CPU seconds per wall second
("cores") are recorded for every run: a 2-thread run near 1.0 was starved by other processes,
not held back by the code. The load average before and after is printed; a ``sha256`` case
shows how far two threads could scale at all at that moment.

Transforms
----------
``decode_images``: ``lanceloader.decode_images()`` (simplejpeg when installed, else Pillow),
Arrow out. ``pil``: a user-written Pillow decode (:func:`pil_decode`), NumPy out.
``simplejpeg``: a user-written simplejpeg decode (:func:`simplejpeg_decode`), NumPy out.

Targets (issue 26): loader with 2 workers >= 0.9x the 2-thread ceiling; the loader's scaling
from 1 to 2 workers >= 0.95x the ceiling's own scaling from 1 to 2 threads. Also measured, no
target: the loader against raw Lance ``to_batches`` feeding the decode on 2 threads, and
``to_output(batch, "torch")`` of a 64-float32 column in GB/s (zero-copy: cost per call).

Dataset: ``--images`` JPEGs of 128x128 pixels (~11 KB: a gradient plus noise, quality 90),
written once to ``--data-dir`` and reused.

Usage::

    python benchmarks/transforms.py                          # 20,000 images, 5 repeats
    python benchmarks/transforms.py --images 2000 --repeats 1   # smoke run

The guide's figures (docs/transforms.md, "Measured here") come from the markdown table this
prints.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

import lance
import numpy as np
import pyarrow as pa

import lanceloader
from lanceloader import Loader
from lanceloader.batch.images import decode_images
from lanceloader.batch.output import to_output

HERE = Path(__file__).resolve().parent
IMAGE_SIZE = 128
TARGET_OVER_CEILING = 0.9
TARGET_SCALING = 0.95
TARGET_CONVERSION_GB_S = 5.0
CONVERSION_ROWS = (256, 4096, 65_536)


# --- dataset -----------------------------------------------------------------------------------


def make_jpegs(count: int, seed: int = 0) -> list[bytes]:
    """``count`` 128x128 JPEGs of ~11 KB: a moving colour gradient plus Gaussian noise."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:IMAGE_SIZE, 0:IMAGE_SIZE]
    out = []
    for i in range(count):
        base = np.stack([(x * 2 + i) % 256, (y * 2 + 3 * i) % 256, (x + y + 7 * i) % 256], -1)
        pixels = np.clip(base + rng.normal(0, 26, base.shape), 0, 255).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(pixels).save(buf, format="JPEG", quality=90)
        out.append(buf.getvalue())
    return out


def prepare_dataset(data_dir: Path, count: int) -> str:
    """The JPEG dataset of ``count`` rows under ``data_dir``, written if missing."""
    path = data_dir / f"jpeg-{count}x{IMAGE_SIZE}.lance"
    if (path / "_versions").exists() and lance.dataset(str(path)).count_rows() == count:
        print(f"reusing {path}")
        return str(path)
    print(f"writing {count:,} JPEGs to {path} ...", flush=True)
    start = time.perf_counter()
    images = make_jpegs(count)
    table = pa.table(
        {"image": pa.array(images, pa.binary()), "label": pa.array(np.arange(count) % 10)}
    )
    data_dir.mkdir(parents=True, exist_ok=True)
    lance.write_dataset(table, str(path), mode="overwrite", max_rows_per_file=count // 4 + 1)
    print(f"  written in {time.perf_counter() - start:.1f} s")
    return str(path)


def in_memory_batches(uri: str, batch_size: int) -> list[pa.RecordBatch]:
    table = lance.dataset(uri).to_table(columns=["image", "label"]).combine_chunks()
    return table.to_batches(max_chunksize=batch_size)


# --- the transforms ----------------------------------------------------------------------------


def pil_decode(batch: pa.RecordBatch) -> dict[str, np.ndarray]:
    """A user-written Pillow decode: JPEG bytes to one ``[N, H, W, 3]`` uint8 array."""
    from PIL import Image

    images = [
        np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
        for data in batch.column("image").to_pylist()
    ]
    return {"image": np.stack(images), "label": batch.column("label").to_numpy()}


def simplejpeg_decode(batch: pa.RecordBatch) -> dict[str, np.ndarray]:
    """A user-written simplejpeg decode: JPEG bytes to one ``[N, H, W, 3]`` uint8 array."""
    import simplejpeg

    images = [simplejpeg.decode_jpeg(data) for data in batch.column("image").to_pylist()]
    return {"image": np.stack(images), "label": batch.column("label").to_numpy()}


def transforms(names: Sequence[str]) -> dict[str, Callable[[pa.RecordBatch], Any]]:
    """The transforms measured, by name (``decode_images``, ``pil``, ``simplejpeg``)."""
    known = {
        "decode_images": decode_images,
        "pil": lambda: pil_decode,
        "simplejpeg": lambda: simplejpeg_decode,
    }
    unknown = sorted(set(names) - set(known))
    if unknown:
        raise SystemExit(f"unknown transform(s) {unknown}; choose from {sorted(known)}")
    return {name: known[name]() for name in names}


# --- measurements ------------------------------------------------------------------------------


class Measure(NamedTuple):
    """A rate, and the cores the process used meanwhile (CPU seconds of all threads / wall
    seconds): a 2-thread run near 1.0 was starved by other processes, not held back by the code."""

    rate: float
    cores: float


class Clock:
    """Wall time and the process's CPU time (all threads) over a ``with`` block."""

    def __enter__(self) -> Clock:
        self._wall, self._cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self._wall
        self.cores = (time.process_time() - self._cpu) / self.seconds

    def measure(self, amount: float) -> Measure:
        return Measure(amount / self.seconds, self.cores)


def ceiling_rate(batches: Sequence[pa.RecordBatch], threads: int, transform: Any) -> Measure:
    """Images/s of ``transform`` over ``batches`` already in memory, one batch per task on a
    bare pool of ``threads`` threads: the ceiling a loader is measured against."""
    with Clock() as clock, ThreadPoolExecutor(threads) as pool:
        for _ in pool.map(transform, batches):
            pass
    return clock.measure(sum(b.num_rows for b in batches))


def loader_rate(uri: str, batch_size: int, workers: int, transform: Any) -> Measure:
    """Images/s of one full epoch of a Loader that reads, decodes and converts to torch (the
    Loader is built outside the clock, as a training job builds it once)."""
    loader = Loader(
        uri,
        batch_size=batch_size,
        columns=["image", "label"],
        transform=transform,
        output="torch",
        num_workers=workers,
    )
    rows = 0
    with Clock() as clock:
        for batch in loader:
            rows += len(batch["label"])
    return clock.measure(rows)


def read_decode_rate(uri: str, batch_size: int, threads: int, transform: Any) -> Measure:
    """Images/s of raw Lance ``to_batches`` feeding ``transform`` on ``threads`` threads."""
    ds = lance.dataset(uri)
    rows = 0
    with Clock() as clock, ThreadPoolExecutor(threads) as pool:
        batches = ds.to_batches(columns=["image", "label"], batch_size=batch_size)
        for out in pool.map(transform, batches):
            rows += len(out["label"]) if isinstance(out, dict) else out.num_rows
    return clock.measure(rows)


def hash_rate(threads: int, chunks: int = 16, size: int = 8 << 20) -> Measure:
    """MB/s of sha256 (releases the GIL) on ``threads`` threads: the machine's parallel ceiling."""
    data = np.ones(size, np.uint8).tobytes()
    with Clock() as clock, ThreadPoolExecutor(threads) as pool:
        for _ in pool.map(lambda _: hashlib.sha256(data).digest(), range(chunks)):
            pass
    return clock.measure(chunks * size / 1e6)


def conversion_gb_s(rows: int, min_seconds: float = 0.2) -> float:
    """GB/s of column data of ``to_output(batch, "torch")`` for a ``rows`` x 64 float32 column."""
    values = pa.array(np.random.default_rng(0).standard_normal(rows * 64, dtype=np.float32))
    batch = pa.record_batch({"x": pa.FixedSizeListArray.from_arrays(values, 64)})
    nbytes = rows * 64 * 4
    calls, elapsed = _timed_loop(lambda: to_output(batch, "torch"), min_seconds)
    return nbytes * calls / elapsed / 1e9


def memcpy_gb_s(nbytes: int, min_seconds: float = 0.2) -> float:
    src = np.ones(nbytes, np.uint8)
    dst = np.empty_like(src)
    calls, elapsed = _timed_loop(lambda: np.copyto(dst, src), min_seconds)
    return nbytes * calls / elapsed / 1e9


def _timed_loop(fn: Callable[[], Any], min_seconds: float) -> tuple[int, float]:
    fn()  # warm up (imports, caches)
    calls = 1
    while True:
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds:
            return calls, elapsed
        calls *= 2


def rotating(repeats: int, cases: dict[str, Callable[[], Measure]]) -> dict[str, list[Measure]]:
    """``repeats`` results of every case; repeat *i* starts at case *i* (mod the cases), so each
    case runs first, second, ... equally often and drift hits them alike."""
    names = list(cases)
    runs: dict[str, list[Measure]] = {name: [] for name in names}
    for i in range(repeats):
        for k in range(len(names)):
            name = names[(i + k) % len(names)]
            runs[name].append(cases[name]())
    return runs


def spread(values: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def ratio(name: str, num: list[Measure], den: list[Measure], target: float | None) -> dict:
    """The ratio of paired runs (repeat by repeat), their median and spread, and the ratio of
    the medians of the rates; the target is checked against the median of the paired ratios."""
    paired = [a.rate / b.rate for a, b in zip(num, den, strict=True)]
    median = statistics.median(paired)
    return {
        "name": name,
        "paired": paired,
        **{f"paired_{k}": v for k, v in spread(paired).items()},
        "ratio_of_medians": statistics.median(m.rate for m in num)
        / statistics.median(m.rate for m in den),
        "target": target,
        "passed": None if target is None else median >= target,
    }


def scaling(name: str, runs: dict[str, list[Measure]], target: float) -> dict:
    """The loader's 1 -> 2 worker scaling over the ceiling's 1 -> 2 thread scaling, per repeat."""
    paired = [
        (l2.rate / l1.rate) / (b2.rate / b1.rate)
        for l1, l2, b1, b2 in zip(
            runs["loader x1"],
            runs["loader x2"],
            runs["ceiling x1"],
            runs["ceiling x2"],
            strict=True,
        )
    ]
    med = {k: statistics.median(m.rate for m in v) for k, v in runs.items()}
    median = statistics.median(paired)
    return {
        "name": name,
        "paired": paired,
        **{f"paired_{k}": v for k, v in spread(paired).items()},
        "ratio_of_medians": (med["loader x2"] / med["loader x1"])
        / (med["ceiling x2"] / med["ceiling x1"]),
        "loader_scaling": med["loader x2"] / med["loader x1"],
        "ceiling_scaling": med["ceiling x2"] / med["ceiling x1"],
        "target": target,
        "passed": median >= target,
    }


# --- main --------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> dict[str, Any]:
    load_before = os.getloadavg()
    uri = prepare_dataset(args.data_dir, args.images)
    batches = in_memory_batches(uri, args.batch_size)
    sizes = [len(b) for batch in batches for b in batch.column("image").to_pylist()]
    chosen = transforms(args.transforms)

    print("machine: sha256 on 2 threads vs 1 ...", flush=True)
    machine = rotating(args.repeats, {"x2": lambda: hash_rate(2), "x1": lambda: hash_rate(1)})
    cases = [
        ratio(
            "sha256 MB/s, 2 threads / 1 thread (the machine's ceiling)",
            machine["x2"],
            machine["x1"],
            None,
        )
    ]
    rates: dict[str, dict[str, list[Measure]]] = {}
    for name, transform in chosen.items():
        print(f"{name}: ceiling (1, 2 threads) and loader (1, 2 workers) ...", flush=True)
        ceiling_rate(batches, 2, transform)  # warm both sides alike: imports, page cache
        loader_rate(uri, args.batch_size, 2, transform)
        runs = rotating(
            args.repeats,
            {
                "ceiling x1": lambda t=transform: ceiling_rate(batches, 1, t),
                "ceiling x2": lambda t=transform: ceiling_rate(batches, 2, t),
                "loader x1": lambda t=transform: loader_rate(uri, args.batch_size, 1, t),
                "loader x2": lambda t=transform: loader_rate(uri, args.batch_size, 2, t),
            },
        )
        rates[name] = runs
        cases.append(
            ratio(
                f"{name}: loader x2 / ceiling x2",
                runs["loader x2"],
                runs["ceiling x2"],
                TARGET_OVER_CEILING,
            )
        )
        cases.append(
            ratio(f"{name}: loader x1 / ceiling x1", runs["loader x1"], runs["ceiling x1"], None)
        )
        cases.append(
            scaling(f"{name}: loader 1->2 scaling / ceiling 1->2 scaling", runs, TARGET_SCALING)
        )

    if args.raw_read:
        first = next(iter(chosen.values()))
        print("loader vs raw Lance to_batches + decode ...", flush=True)
        raw = rotating(
            args.repeats,
            {
                "loader": lambda: loader_rate(uri, args.batch_size, 2, first),
                "raw": lambda: read_decode_rate(uri, args.batch_size, 2, first),
            },
        )
        cases.append(
            ratio(
                f"{args.transforms[0]}: loader x2 / raw to_batches + decode x2",
                raw["loader"],
                raw["raw"],
                None,
            )
        )

    print("conversion ...", flush=True)
    conversion = []
    for rows in CONVERSION_ROWS:
        runs_gb = [conversion_gb_s(rows) for _ in range(args.repeats)]
        gb_s = statistics.median(runs_gb)
        conversion.append(
            {
                "rows": rows,
                "bytes": rows * 256,
                "gb_per_s": runs_gb,
                "median_gb_per_s": gb_s,
                "target": TARGET_CONVERSION_GB_S,
                "passed": gb_s >= TARGET_CONVERSION_GB_S,
            }
        )
    memcpy = statistics.median(memcpy_gb_s(CONVERSION_ROWS[-1] * 256) for _ in range(args.repeats))

    return {
        "benchmark": "transforms",
        "lanceloader": lanceloader.__version__,
        "lance": lance.__version__,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "settings": {
            "images": args.images,
            "image_size": IMAGE_SIZE,
            "mean_jpeg_bytes": statistics.mean(sizes),
            "batch_size": args.batch_size,
            "repeats": args.repeats,
            "transforms": args.transforms,
        },
        "rates": {
            name: {case: [m._asdict() for m in ms] for case, ms in runs.items()}
            for name, runs in rates.items()
        },
        "cases": cases,
        "conversion": conversion,
        "memcpy_gb_per_s": memcpy,
    }


def markdown(result: dict[str, Any]) -> str:
    """The tables of ``result``: rates (median, min-max, cores used) and ratios."""
    lines = [
        "| transform | case | images/s median | min-max | cores used (median) |",
        "|---|---|---:|---:|---:|",
    ]
    for name, runs in result["rates"].items():
        for case, ms in runs.items():
            r = [m["rate"] for m in ms]
            lines.append(
                f"| {name} | {case} | {statistics.median(r):,.0f} | "
                f"{min(r):,.0f}-{max(r):,.0f} | "
                f"{statistics.median(m['cores'] for m in ms):.2f} |"
            )
    lines += [
        "",
        "| ratio | median of paired runs | min-max | ratio of medians | target |",
        "|---|---:|---:|---:|---|",
    ]
    for case in result["cases"]:
        verdict = (
            ""
            if case["passed"] is None
            else f">= {case['target']} {'met' if case['passed'] else 'NOT met'}"
        )
        lines.append(
            f"| {case['name']} | {case['paired_median']:.2f} | "
            f"{case['paired_min']:.2f}-{case['paired_max']:.2f} | "
            f"{case['ratio_of_medians']:.2f} | {verdict} |"
        )
    return "\n".join(lines)


def report(result: dict[str, Any]) -> None:
    s = result["settings"]
    print(
        f"\n{s['images']:,} JPEGs of {s['image_size']}x{s['image_size']} "
        f"({s['mean_jpeg_bytes'] / 1e3:.1f} KB), batch {s['batch_size']}, {s['repeats']} "
        f"repeats; {result['cpus']} cores; load average before "
        f"{result['load_average_before'][0]:.2f}, after {result['load_average_after'][0]:.2f}\n"
    )
    print(markdown(result))
    print()
    for conv in result["conversion"]:
        verdict = "  PASS" if conv["passed"] else "  FAIL"
        print(
            f"to_output(torch), {conv['rows']:,} rows x 64 float32: "
            f"{conv['median_gb_per_s']:.1f} GB/s{verdict}"
        )
    print(f"memcpy of {CONVERSION_ROWS[-1] * 256:,} bytes: {result['memcpy_gb_per_s']:.1f} GB/s")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--images", type=int, default=20_000)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--transforms",
        nargs="+",
        default=["decode_images", "pil", "simplejpeg"],
        help="which decodes to measure: decode_images, pil, simplejpeg",
    )
    parser.add_argument(
        "--raw-read",
        action="store_true",
        help="also the loader against raw Lance to_batches + decode",
    )
    parser.add_argument("--data-dir", type=Path, default=HERE / "data")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "transforms.json")
    args = parser.parse_args(argv)
    result = run(args)
    report(result)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
