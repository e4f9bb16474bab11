"""Process workers: time to first batch, scaling from 1 to 2 workers, and against thread workers.

Method: each case runs in a fresh interpreter (so the forkserver start is counted where it
happens), ``--repeats`` times, the cases interleaved (drift on a shared machine hits every case
alike); medians are quoted with their spread (min-max), in a markdown table. Two transforms:

``python_heavy``
    a GIL-holding Python loop over the demo dataset's ``id`` column (what process workers are
    for); the same transform on threads is measured in the same run for contrast.
``decode_images``
    ``lanceloader.decode_images()`` over 128x128 JPEGs (``benchmarks/transforms.py``'s data):
    the decoders release the GIL, so threads should win or tie; the ratio of 2 process workers
    to 2 thread workers is what process workers cost on a decode (issue 26: 0.88x before).

Time to first batch is measured from just before ``Loader(...)`` to the first batch, after
imports. Targets (issue 4): first batch <= 0.5 s with 2 workers; 2 workers >= 1.7x 1 worker
(python_heavy).

    python benchmarks/process_workers.py [--rows 200000] [--images 8000] [--batches 300] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CASE = r"""
import json, sys, time
import torch  # imported before the clock: output="torch" would import it inside the timing
import lanceloader as ll
from benchmarks.process_workers import python_heavy
uri, transform, worker_type, workers, batches, warm = sys.argv[1:7]
if warm == "1":  # start the forkserver before timing: a long-running job pays this once
    from lanceloader.engine.processes import forkserver_context
    import multiprocessing.forkserver as fs
    ctx = forkserver_context(); fs.ensure_running()
    p = ctx.Process(target=int); p.start(); p.join()  # the server forks once its imports are done
columns, fn = (["id", "x"], python_heavy) if transform == "python_heavy" else \
    (["image", "label"], ll.decode_images())
start = time.perf_counter()
loader = ll.Loader(uri, batch_size=256, columns=columns, worker_type=worker_type,
                   num_workers=int(workers), transform=fn, output="torch")
it = iter(loader)
next(it)
first = time.perf_counter() - start
t0, n = time.perf_counter(), 0
for i, batch in enumerate(it):
    n += len(next(iter(batch.values())))
    if i + 2 >= int(batches):
        break
rate = n / (time.perf_counter() - t0)
loader.close()
print(json.dumps({"first_batch_s": first, "rows_per_s": rate}))
"""


def python_heavy(batch):
    """About 10 ms of pure Python per 256-row batch: holds the GIL the whole time."""
    total = 0
    for value in batch.column("id").to_pylist():
        for k in range(300):
            total += (value * k) % 7
    return batch


def run_case(
    uri: str, transform: str, worker_type: str, workers: int, batches: int, warm: bool
) -> dict:
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": f"{root}:{root / 'src'}"}
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            CASE,
            uri,
            transform,
            worker_type,
            str(workers),
            str(batches),
            str(int(warm)),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def spread(values: list[float], digits: int = 2) -> str:
    return f"{min(values):,.{digits}f}-{max(values):,.{digits}f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--images", type=int, default=8000)
    p.add_argument("--batches", type=int, default=300)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--data-dir", type=Path, default=Path(__file__).resolve().parent / "data")
    p.add_argument("--json", default="benchmarks/results/process_workers.json")
    args = p.parse_args()

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script, too
    from benchmarks.transforms import prepare_dataset

    from lanceloader.demo import write_demo_dataset

    uris = {
        "python_heavy": write_demo_dataset(
            Path(tempfile.mkdtemp()) / "bench.lance", rows=args.rows
        ),
        "decode_images": prepare_dataset(args.data_dir, args.images),
    }
    cases = [
        ("python_heavy", "process", 1, False),
        ("python_heavy", "process", 2, False),
        ("python_heavy", "process", 2, True),
        ("python_heavy", "thread", 1, False),
        ("python_heavy", "thread", 2, False),
        ("decode_images", "process", 2, True),
        ("decode_images", "thread", 2, False),
    ]
    names = [f"{f} {t} x{w}{' warm' if warm else ''}" for f, t, w, warm in cases]
    results: dict[str, list[dict]] = {name: [] for name in names}
    for i in range(args.repeats):  # interleaved, each repeat starting one case later
        for k in range(len(cases)):
            j = (i + k) % len(cases)
            f, t, w, warm = cases[j]
            results[names[j]].append(run_case(uris[f], f, t, w, args.batches, warm))
    metrics = ("first_batch_s", "rows_per_s")
    summary = {
        key: {m: statistics.median(r[m] for r in runs) for m in metrics}
        for key, runs in results.items()
    }
    print(
        f"{args.repeats} repeats, load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} cores\n"
    )
    print("| case | first batch s (median) | min-max | rows/s (median) | min-max |")
    print("|---|---:|---:|---:|---:|")
    for key, s in summary.items():
        runs = results[key]
        print(
            f"| {key} | {s['first_batch_s']:.3f} | "
            f"{spread([r['first_batch_s'] for r in runs], 3)} | {s['rows_per_s']:,.0f} | "
            f"{spread([r['rows_per_s'] for r in runs], 0)} |"
        )

    def paired(a: str, b: str) -> list[float]:
        return [
            x["rows_per_s"] / y["rows_per_s"] for x, y in zip(results[a], results[b], strict=True)
        ]

    ratios = {
        "python_heavy: process x2 / process x1 (target >= 1.7)": paired(
            "python_heavy process x2", "python_heavy process x1"
        ),
        "python_heavy: thread x2 / thread x1": paired(
            "python_heavy thread x2", "python_heavy thread x1"
        ),
        "decode_images: process x2 (forkserver running) / thread x2": paired(
            "decode_images process x2 warm", "decode_images thread x2"
        ),
    }
    print("\n| ratio | median of paired runs | min-max |\n|---|---:|---:|")
    for name, values in ratios.items():
        print(f"| {name} | {statistics.median(values):.2f} | {spread(values)} |")
    print(
        f"\nfirst batch, 2 process workers: cold "
        f"{summary['python_heavy process x2']['first_batch_s']:.2f} s, forkserver already "
        f"running {summary['python_heavy process x2 warm']['first_batch_s']:.2f} s "
        "(target <= 0.5 s)"
    )
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(
        json.dumps(
            {
                "runs": results,
                "medians": summary,
                "ratios": {
                    k: {"paired": v, "median": statistics.median(v)} for k, v in ratios.items()
                },
                "cpu_count": os.cpu_count(),
                "load_average": os.getloadavg(),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
