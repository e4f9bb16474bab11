"""Data in and preprocess once: ``convert``, ``materialize`` and reading a materialised copy,
each against the hand-written way of doing the same, in the same run, on the same cores.

Cases (medians of ``--repeats``; the two sides of a ratio alternate between repeats):

``convert ImageFolder``
    ``ll.convert`` of ``--images`` JPEGs (128x128, ~11 KB, 10 classes) vs a hand-written loop:
    read each file, batch the bytes with labels and paths, ``lance.write_dataset`` of the
    batches. Target >= 0.8x.
``convert ImageFolder: checks``
    What checking every image costs: ``ll.convert`` with its default ``check_images="structure"``
    (JPEG/PNG walked to their end: segments, compressed data, CRCs) vs ``check_images="none"``
    (bytes stored unchecked), both the same ``--images``; and ``check_images="decode"`` (every
    image decoded) vs ``"none"``. Target for the default: costs <= 15% (ratio >= 0.87x).
``convert Parquet``
    ``ll.convert`` of a directory of Parquet files (``--rows`` demo rows: id, label, x) vs
    ``lance.write_dataset(pyarrow.dataset.dataset(dir))``. Target >= 0.8x.
``materialize decode+resize``
    ``ll.materialize`` of a Loader over the converted images with ``decode_images(size=64x64)``
    vs the raw decode of the same bytes (already in memory) with the same transform on a thread
    pool of as many threads as the loader has workers. Target >= 0.8x.
``shuffled copy``
    A sequential epoch of ``materialize(Loader(shuffle=True))`` vs a full-shuffle epoch of the
    original (both Loaders, columns id, label, x). Target >= 20x. The epochs to amortise the
    copy are printed: the copy's cost / (one shuffled epoch - one sequential epoch of the copy).
``ray``
    With ``--ray``: ``lanceloader.ray.materialize`` on a local Ray of 2 CPUs vs the single-machine
    ``materialize`` of the same shuffled loader (its overhead; no target).

Usage::

    python benchmarks/ingest.py                         # 20,000 images, 400,000 rows, 3 repeats
    python benchmarks/ingest.py --images 2000 --rows 50000 --repeats 1 --ray
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa
import pyarrow.dataset
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from transforms import make_jpegs  # noqa: E402

import lanceloader as ll  # noqa: E402
from lanceloader.demo import demo_table  # noqa: E402

COLUMNS = ["id", "label", "x"]


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def alternate(a, b, repeats: int) -> tuple[float, float]:
    """Median seconds of ``a`` and of ``b``, their order alternating between repeats."""
    times: dict[str, list[float]] = {"a": [], "b": []}
    for i in range(repeats):
        for name in "ab" if i % 2 == 0 else "ba":
            times[name].append(timed(a if name == "a" else b))
    return statistics.median(times["a"]), statistics.median(times["b"])


def image_folder(root: Path, count: int) -> Path:
    for i, data in enumerate(make_jpegs(count)):
        folder = root / f"class{i % 10}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i:06d}.jpg").write_bytes(data)
    return root


def hand_written_images(root: Path, out: str) -> None:
    classes = sorted(p for p in root.iterdir() if p.is_dir())

    def batches():
        for label, folder in enumerate(classes):
            files = sorted(folder.iterdir())
            for start in range(0, len(files), 1024):
                chunk = files[start : start + 1024]
                yield pa.record_batch(
                    {
                        "image": pa.array([f.read_bytes() for f in chunk], pa.binary()),
                        "label": pa.array([label] * len(chunk), pa.int64()),
                        "path": pa.array([os.fspath(f.relative_to(root)) for f in chunk]),
                    }
                )

    schema = pa.schema([("image", pa.binary()), ("label", pa.int64()), ("path", pa.string())])
    lance.write_dataset(
        pa.RecordBatchReader.from_batches(schema, batches()), out, schema=schema, mode="overwrite"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=20_000)
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ray", action="store_true", help="also Ray Data on 2 local CPUs")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="lanceloader-ingest-"))
    results: list[tuple[str, float, float, float | None, str]] = []
    try:
        root = image_folder(work / "images", args.images)
        ours, theirs = alternate(
            lambda: ll.convert(root, work / "conv.lance", mode="overwrite", progress=False),
            lambda: hand_written_images(root, os.fspath(work / "hand.lance")),
            args.repeats,
        )
        results.append(
            ("convert ImageFolder", args.images / ours, args.images / theirs, 0.8, "images/s")
        )

        def converted(check: str):
            return lambda: ll.convert(
                root,
                work / f"conv-{check}.lance",
                mode="overwrite",
                check_images=check,
                progress=False,
            )

        checked, unchecked = alternate(converted("structure"), converted("none"), args.repeats)
        results.append(
            (
                "convert: structure check vs none",
                args.images / checked,
                args.images / unchecked,
                1 / 1.15,
                "images/s",
            )
        )
        decoded, unchecked = alternate(converted("decode"), converted("none"), args.repeats)
        results.append(
            (
                "convert: decode check vs none",
                args.images / decoded,
                args.images / unchecked,
                None,
                "images/s",
            )
        )

        folder = work / "parquet"
        folder.mkdir()
        table = demo_table(args.rows).select(COLUMNS)
        for i in range(8):
            pq.write_table(
                table.slice(i * args.rows // 8, args.rows // 8), folder / f"part-{i}.parquet"
            )
        ours, theirs = alternate(
            lambda: ll.convert(folder, work / "pq.lance", mode="overwrite", progress=False),
            lambda: lance.write_dataset(
                pyarrow.dataset.dataset(folder), work / "pq-raw.lance", mode="overwrite"
            ),
            args.repeats,
        )
        results.append(("convert Parquet", args.rows / ours, args.rows / theirs, 0.8, "rows/s"))

        workers = os.cpu_count() or 1
        decode = ll.decode_images("image", size=(64, 64))
        images = ll.Loader(
            work / "conv.lance",
            batch_size=64,
            columns=["image", "label"],
            transform=decode,
            num_workers=workers,
        )
        in_memory = (
            lance.dataset(work / "conv.lance")
            .to_table(columns=["image", "label"])
            .combine_chunks()
            .to_batches(max_chunksize=64)
        )

        def raw_decode() -> None:
            with ThreadPoolExecutor(workers) as pool:
                for _ in pool.map(decode, in_memory):
                    pass

        ours, theirs = alternate(
            lambda: ll.materialize(images, work / "decoded.lance", mode="overwrite"),
            raw_decode,
            args.repeats,
        )
        results.append(
            ("materialize decode+resize", args.images / ours, args.images / theirs, 0.8, "images/s")
        )

        original = work / "pq.lance"
        shuffled = ll.Loader(original, batch_size=256, columns=COLUMNS, shuffle=True)
        copy_seconds = timed(
            lambda: ll.materialize(shuffled, work / "shuffled.lance", mode="overwrite")
        )
        copy = ll.Loader(work / "shuffled.lance", batch_size=256, columns=COLUMNS)

        def epoch(loader: ll.Loader):
            return lambda: sum(len(b["id"]) for b in loader)

        sequential, full = alternate(epoch(copy), epoch(shuffled), args.repeats)
        results.append(
            (
                "shuffled copy: sequential vs full shuffle",
                args.rows / sequential,
                args.rows / full,
                20.0,
                "rows/s",
            )
        )
        amortise = copy_seconds / max(full - sequential, 1e-9)

        if args.ray:
            import ray

            import lanceloader.ray

            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
            try:
                here = timed(
                    lambda: ll.materialize(shuffled, work / "here.lance", mode="overwrite")
                )
                there = timed(
                    lambda: lanceloader.ray.materialize(
                        shuffled, work / "there.lance", mode="overwrite", concurrency=2
                    )
                )
                same = (
                    lance.dataset(work / "there.lance")
                    .to_table()
                    .equals(lance.dataset(work / "here.lance").to_table())
                )
            finally:
                ray.shutdown()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(
        f"{args.images:,} images, {args.rows:,} rows, {os.cpu_count()} cores, medians of "
        f"{args.repeats}"
    )
    print(f"{'case':<44}{'lanceloader':>14}{'by hand':>14}{'ratio':>8}{'target':>8}")
    for name, ours_rate, theirs_rate, target, unit in results:
        ratio = ours_rate / theirs_rate
        mark = "" if target is None else f">={target:g}x " + ("PASS" if ratio >= target else "FAIL")
        print(f"{name:<44}{ours_rate:>14,.0f}{theirs_rate:>14,.0f}{ratio:>7.2f}x  {mark}  {unit}")
    print(
        f"the shuffled copy took {copy_seconds:.1f} s to write: it pays for itself after "
        f"{amortise:.1f} epochs"
    )
    if args.ray:
        print(
            f"Ray Data materialize on 2 local CPUs: {there:.1f} s vs {here:.1f} s on one "
            f"machine ({there / here:.2f}x), same rows: {same}"
        )


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
