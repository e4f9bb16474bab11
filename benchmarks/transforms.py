"""Transform and conversion throughput: image decode, the loader around it, tensor conversion.

Method
------
Every target is a ratio of two numbers measured in the same run, on the same cores, so a slower
or busier machine moves both sides. Each measurement runs ``--repeats`` times; medians are quoted,
and the two sides of a ratio alternate their order between repeats so that drift on a shared
machine hits both alike. The load average before and after is recorded: other processes on the
machine take cores from the multi-threaded cases first, so every measurement also records the
cores the process got (CPU seconds / wall seconds), and each ratio is also given per core used; a
``sha256`` case shows how far two threads could scale at all at that moment.

Cases
-----
``decode``
    ``decode_images()`` (simplejpeg when installed, else Pillow) over the dataset's JPEG bytes,
    already in memory as RecordBatches of ``--batch-size`` rows, one batch per task on a thread
    pool of 1 and of 2 threads. Target: 2 threads >= 1.8x one thread.
``backends``
    The same decode, one thread, simplejpeg vs Pillow, on the first ``--backend-images`` images:
    why ``backend="auto"`` prefers simplejpeg for JPEG (no target).
``in-batch threads``
    One batch decoded as two half-batches on 2 threads vs whole on 1 thread: whether a thread
    pool *inside* a batch would pay (no target; the loader's workers already use every core).
``loader``
    ``Loader(uri, transform=decode_images(), output="torch", num_workers=2)`` over a full epoch
    (it also reads the bytes from Lance and converts to torch) vs the raw decode rate of the same
    images with 2 threads (bytes already in memory). Target: loader >= 0.9x raw. The same with
    ``rows_per_read=1024``: reads that still sit in the CPU cache when decoded. Also, for
    the loader's own overhead: the same loader vs raw Lance ``to_batches`` feeding the decode on
    2 threads (no target).
``conversion``
    ``to_output(batch, "torch")`` of a 64-float32 fixed-size-list column at several batch sizes,
    in GB/s of column data; ``memcpy`` of the largest batch's bytes for scale. The conversion is
    zero-copy, so its cost is per call, not per byte. Target: >= 5 GB/s.

Dataset: ``--images`` JPEGs of 128x128 pixels (~11 KB: a gradient plus noise, quality 90),
written once to ``--data-dir`` and reused.

Usage::

    python benchmarks/transforms.py                      # 20,000 images, 5 repeats
    python benchmarks/transforms.py --images 2000 --repeats 1   # smoke run
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
TARGET_TWO_THREADS = 1.8
TARGET_LOADER_OVER_RAW = 0.9
TARGET_CONVERSION_GB_S = 5.0
CONVERSION_ROWS = (256, 4096, 65_536)
# Rows per Lance read small enough (~10 MB of 10 KB JPEGs) that a batch is still in cache when
# the worker decodes it; the loader's default reads up to 65,536 rows (~650 MB) at once.
SMALL_READ = 1024


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


def decode_rate(batches: Sequence[pa.RecordBatch], threads: int, transform: Any) -> Measure:
    """Images/s of ``transform`` over ``batches``, one batch per task on ``threads`` threads."""
    with ThreadPoolExecutor(threads) as pool, Clock() as clock:
        for _ in pool.map(transform, batches):
            pass
    return clock.measure(sum(b.num_rows for b in batches))


def hash_rate(threads: int, chunks: int = 16, size: int = 8 << 20) -> Measure:
    """MB/s of sha256 (releases the GIL) on ``threads`` threads: the machine's parallel ceiling."""
    data = np.ones(size, np.uint8).tobytes()
    with ThreadPoolExecutor(threads) as pool, Clock() as clock:
        for _ in pool.map(lambda _: hashlib.sha256(data).digest(), range(chunks)):
            pass
    return clock.measure(chunks * size / 1e6)


def split_decode_rate(batches: Sequence[pa.RecordBatch], transform: Any) -> Measure:
    """Images/s when each batch is decoded as two halves on 2 threads, batch after batch."""
    with ThreadPoolExecutor(2) as pool, Clock() as clock:
        for batch in batches:
            half = batch.num_rows // 2
            parts = list(pool.map(transform, [batch.slice(0, half), batch.slice(half)]))
            np.concatenate([p.column("image").to_numpy_ndarray() for p in parts])
    return clock.measure(sum(b.num_rows for b in batches))


def read_decode_rate(uri: str, batch_size: int, threads: int, transform: Any) -> Measure:
    """Images/s of raw Lance ``to_batches`` feeding ``transform`` on ``threads`` threads."""
    ds = lance.dataset(uri)
    rows = 0
    with ThreadPoolExecutor(threads) as pool, Clock() as clock:
        batches = ds.to_batches(columns=["image", "label"], batch_size=batch_size)
        for out in pool.map(transform, batches):
            rows += out.num_rows
    return clock.measure(rows)


def loader_rate(
    uri: str, batch_size: int, workers: int, transform: Any, rows_per_read: int | None = None
) -> Measure:
    """Images/s of one full epoch of a Loader that reads, decodes and converts to torch."""
    loader = Loader(
        uri,
        batch_size=batch_size,
        columns=["image", "label"],
        transform=transform,
        output="torch",
        num_workers=workers,
        rows_per_read=rows_per_read,
    )
    rows = 0
    with Clock() as clock:
        for batch in loader:
            rows += len(batch["label"])
    return clock.measure(rows)


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


def alternating(
    repeats: int, a: Callable[[], Measure], b: Callable[[], Measure]
) -> tuple[list[Measure], list[Measure]]:
    """``repeats`` results of ``a`` and ``b``; odd repeats run ``b`` first."""
    ra: list[Measure] = []
    rb: list[Measure] = []
    for i in range(repeats):
        if i % 2 == 0:
            ra.append(a())
            rb.append(b())
        else:
            rb.append(b())
            ra.append(a())
    return ra, rb


def ratio_case(name: str, num: list[Measure], den: list[Measure], target: float | None) -> dict:
    """Medians, their ratio (what the target is checked against) and the same per core used."""
    ratio = statistics.median(m.rate for m in num) / statistics.median(m.rate for m in den)
    per_core = statistics.median(m.rate / m.cores for m in num) / statistics.median(
        m.rate / m.cores for m in den
    )
    return {
        "name": name,
        "numerator": [m.rate for m in num],
        "denominator": [m.rate for m in den],
        "numerator_cores_used": [round(m.cores, 2) for m in num],
        "denominator_cores_used": [round(m.cores, 2) for m in den],
        "numerator_median": statistics.median(m.rate for m in num),
        "denominator_median": statistics.median(m.rate for m in den),
        "ratio_of_medians": ratio,
        "ratio_per_core_used": per_core,
        "target": target,
        "passed": None if target is None else ratio >= target,
    }


# --- main --------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> dict[str, Any]:
    load_before = os.getloadavg()
    uri = prepare_dataset(args.data_dir, args.images)
    batches = in_memory_batches(uri, args.batch_size)
    sizes = [len(b) for batch in batches for b in batch.column("image").to_pylist()]
    auto, pil = decode_images(), decode_images(backend="pil")
    decode_rate(batches[:4], 2, auto)  # warm up

    print("machine: sha256 on 2 threads vs 1 ...", flush=True)
    two, one = alternating(args.repeats, lambda: hash_rate(2), lambda: hash_rate(1))
    ceiling = ratio_case(
        "sha256 MB/s, 2 threads / 1 thread (the machine's ceiling)", two, one, None
    )

    print("decode: 2 threads vs 1 ...", flush=True)
    two, one = alternating(
        args.repeats, lambda: decode_rate(batches, 2, auto), lambda: decode_rate(batches, 1, auto)
    )
    decode = ratio_case("decode images/s, 2 threads / 1 thread", two, one, TARGET_TWO_THREADS)

    print("backends: simplejpeg vs Pillow ...", flush=True)
    few = batches[: max(1, args.backend_images // args.batch_size)]
    fast, slow = alternating(
        args.repeats,
        lambda: decode_rate(few, 1, auto),
        lambda: decode_rate(few, 1, pil),
    )
    backends = ratio_case("decode images/s, auto (simplejpeg) / pil, 1 thread", fast, slow, None)

    print("in-batch threads ...", flush=True)
    split, whole = alternating(
        args.repeats, lambda: split_decode_rate(few, auto), lambda: decode_rate(few, 1, auto)
    )
    in_batch = ratio_case(
        "decode images/s, batch split on 2 threads / 1 thread", split, whole, None
    )

    print("loader vs raw decode ...", flush=True)
    loader, raw = alternating(
        args.repeats,
        lambda: loader_rate(uri, args.batch_size, 2, auto),
        lambda: decode_rate(batches, 2, auto),
    )
    loader_case = ratio_case(
        "loader images/s (read+decode+torch, 2 workers) / raw decode (2 threads)",
        loader,
        raw,
        TARGET_LOADER_OVER_RAW,
    )

    print(f"loader (rows_per_read={SMALL_READ}) vs raw decode ...", flush=True)
    loader, raw = alternating(
        args.repeats,
        lambda: loader_rate(uri, args.batch_size, 2, auto, SMALL_READ),
        lambda: decode_rate(batches, 2, auto),
    )
    small_read_case = ratio_case(
        f"loader images/s with rows_per_read={SMALL_READ} / raw decode (2 threads)",
        loader,
        raw,
        None,
    )

    print("loader vs raw read + decode ...", flush=True)
    loader, raw = alternating(
        args.repeats,
        lambda: loader_rate(uri, args.batch_size, 2, auto),
        lambda: read_decode_rate(uri, args.batch_size, 2, auto),
    )
    loader_read_case = ratio_case(
        "loader images/s / raw Lance to_batches + decode (2 threads)", loader, raw, None
    )

    print("conversion ...", flush=True)
    conversion = []
    for rows in CONVERSION_ROWS:
        runs = [conversion_gb_s(rows) for _ in range(args.repeats)]
        target = TARGET_CONVERSION_GB_S
        gb_s = statistics.median(runs)
        conversion.append(
            {
                "rows": rows,
                "bytes": rows * 256,
                "gb_per_s": runs,
                "median_gb_per_s": gb_s,
                "target": target,
                "passed": None if target is None else gb_s >= target,
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
            "decode_backend": auto.backend,
        },
        "cases": [
            ceiling,
            decode,
            backends,
            in_batch,
            loader_case,
            small_read_case,
            loader_read_case,
        ],
        "conversion": conversion,
        "memcpy_gb_per_s": memcpy,
    }


def report(result: dict[str, Any]) -> None:
    print(
        f"\nload average before/after: {result['load_average_before']} / {result['load_average_after']}"
    )
    for case in result["cases"]:
        verdict = "" if case["passed"] is None else ("  PASS" if case["passed"] else "  FAIL")
        target = f" (target >= {case['target']})" if case["target"] else ""
        print(
            f"{case['name']}: {case['numerator_median']:,.0f} / {case['denominator_median']:,.0f}"
            f" = {case['ratio_of_medians']:.2f}{target}{verdict}\n"
            f"    per core used: {case['ratio_per_core_used']:.2f}; cores used "
            f"{case['numerator_cores_used']} / {case['denominator_cores_used']}"
        )
    for conv in result["conversion"]:
        verdict = "" if conv["passed"] is None else ("  PASS" if conv["passed"] else "  FAIL")
        print(
            f"to_output(torch), {conv['rows']:,} rows x 64 float32: "
            f"{conv['median_gb_per_s']:.1f} GB/s{verdict}"
        )
    print(f"memcpy of {CONVERSION_ROWS[-1] * 256:,} bytes: {result['memcpy_gb_per_s']:.1f} GB/s")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--images", type=int, default=20_000)
    parser.add_argument("--backend-images", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
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
