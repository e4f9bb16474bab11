"""The engine's three gaps, each measured side by side with raw Lance in the same run.

Cases (medians of ``--repeats``; each side in a fresh process, so peak RSS is its own):

``blob sequential``
    A dataset of ``--images`` rows ``id, label, image`` where ``image`` is ~11 KB of
    incompressible bytes (what a JPEG is to Lance). The Loader (batch 256, ``output="numpy"``,
    sequential, all cores) against a raw ``ds.to_batches(columns, batch_size=256)`` scan.
    Also on the tabular demo dataset (``--rows`` rows of ``id, label, x``), the same pair.
``blob memory``
    Peak RSS of the sequential Loader's epoch over the blob dataset, against pylance's
    ``lance.torch.data.LanceDataset`` (batch 256) and a raw scan of the same data.
``process workers``
    A full shuffle of the tabular dataset without a transform: process workers against thread
    workers (``--shuffle-rows`` rows each).

Usage::

    python benchmarks/engine.py                      # defaults: 20k images, 2M rows, 3 repeats
    python benchmarks/engine.py --images 2000 --rows 100000 --repeats 1   # smoke run
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

HERE = Path(__file__).resolve().parent

CHILD = textwrap.dedent('''
    import json, sys, time
    import numpy as np
    case, uri, columns, limit = sys.argv[1], sys.argv[2], sys.argv[3].split(","), int(sys.argv[4])
    rows = 0
    if case.startswith("loader"):
        import lanceloader as ll
        kind = case.split(":")[1]
        kw = {"shuffle": True} if kind != "sequential" else {}
        worker_type = "process" if kind == "shuffle-process" else "thread"
        loader = ll.Loader(uri, batch_size=256, columns=columns, worker_type=worker_type, **kw)
        it = iter(loader)
        start = time.perf_counter()
        for batch in it:
            rows += len(batch[columns[0]])
            if rows >= limit:
                break
        seconds = time.perf_counter() - start
        it.close()
    elif case == "raw":
        import lance
        ds = lance.dataset(uri)
        start = time.perf_counter()
        for batch in ds.to_batches(columns=columns, batch_size=256):
            rows += batch.num_rows
        seconds = time.perf_counter() - start
    elif case == "lancedataset":
        from lance.torch.data import LanceDataset
        ds = LanceDataset(uri, batch_size=256, columns=columns, to_tensor_fn=lambda b, **kw: b)
        start = time.perf_counter()
        for batch in ds:
            rows += batch.num_rows
        seconds = time.perf_counter() - start
    status = open("/proc/self/status").read()  # VmHWM: this program's peak (reset by exec)
    rss = int(status.split("VmHWM:")[1].split()[0]) * 1024
    print(json.dumps({"rows": rows, "seconds": seconds, "rss": rss}))
''')


def write_blobs(path: Path, images: int) -> str:
    import lance
    import numpy as np
    import pyarrow as pa

    if path.exists():
        return str(path)
    rng = np.random.default_rng(0)

    def batches():
        for lo in range(0, images, 1000):
            n = min(1000, images - lo)
            sizes = rng.integers(9_000, 13_000, n)
            blobs = [rng.integers(0, 256, s, dtype=np.uint8).tobytes() for s in sizes]
            yield pa.record_batch({"id": pa.array(np.arange(lo, lo + n)),
                                   "label": pa.array(np.arange(lo, lo + n) % 10),
                                   "image": pa.array(blobs, pa.binary())})

    schema = pa.schema({"id": pa.int64(), "label": pa.int64(), "image": pa.binary()})
    lance.write_dataset(pa.RecordBatchReader.from_batches(schema, batches()), str(path),
                        max_rows_per_file=5_000)
    return str(path)


def run(case: str, uri: str, columns: str, limit: int = 1 << 62) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", CHILD, case, uri, columns, str(limit)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def median_pair(a: tuple, b: tuple, repeats: int) -> tuple[dict, dict]:
    """Run cases ``a`` and ``b`` alternately ``repeats`` times; medians of rows/s and RSS."""
    results: dict[int, list[dict]] = {0: [], 1: []}
    for r in range(repeats):
        for side in ((0, 1) if r % 2 == 0 else (1, 0)):
            results[side].append(run(*(a, b)[side]))

    def summary(runs: list[dict]) -> dict:
        return {"rows_per_s": statistics.median(x["rows"] / x["seconds"] for x in runs),
                "rss_mb": statistics.median(x["rss"] for x in runs) / 1e6,
                "rows": runs[0]["rows"]}

    return summary(results[0]), summary(results[1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=int, default=20_000)
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--shuffle-rows", type=int, default=200_000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--data-dir", type=Path, default=HERE / "data")
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    args = p.parse_args()
    args.data_dir.mkdir(parents=True, exist_ok=True)
    from lanceloader.demo import write_demo_dataset

    blobs = write_blobs(args.data_dir / f"blobs-{args.images}.lance", args.images)
    tabular = args.data_dir / f"demo-{args.rows}-8.lance"
    if not tabular.exists():
        write_demo_dataset(tabular, rows=args.rows, fragments=8)
    tabular = str(tabular)
    report: dict[str, dict] = {}

    def pair(name: str, a: tuple, b: tuple, a_name: str, b_name: str) -> None:
        x, y = median_pair(a, b, args.repeats)
        ratio = x["rows_per_s"] / y["rows_per_s"]
        report[name] = {a_name: x, b_name: y, "ratio": ratio}
        print(f"{name:34s} {a_name} {x['rows_per_s']:>11,.0f} rows/s {x['rss_mb']:>7,.0f} MB | "
              f"{b_name} {y['rows_per_s']:>11,.0f} rows/s {y['rss_mb']:>7,.0f} MB | "
              f"ratio {ratio:.2f}x", flush=True)

    pair("blob sequential vs raw scan", ("loader:sequential", blobs, "id,label,image"),
         ("raw", blobs, "id,label,image"), "loader", "raw")
    pair("tabular sequential vs raw scan", ("loader:sequential", tabular, "id,label,x"),
         ("raw", tabular, "id,label,x"), "loader", "raw")
    pair("blob memory: loader vs LanceDataset", ("loader:sequential", blobs, "id,label,image"),
         ("lancedataset", blobs, "id,label,image"), "loader", "LanceDataset")
    pair("full shuffle: processes vs threads",
         ("loader:shuffle-process", tabular, "id,label,x", args.shuffle_rows),
         ("loader:shuffle-thread", tabular, "id,label,x", args.shuffle_rows),
         "processes", "threads")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
