"""Process workers: time to first batch, and scaling of a pure-Python transform from 1 to 2 workers.

Method: each case runs in a fresh interpreter (so the forkserver start is counted where it
happens), ``--repeats`` times; medians are quoted. The transform is a GIL-holding Python loop
(what process workers are for); the same transform on threads is measured in the same run for
contrast. Time to first batch is measured from just before ``Loader(...)`` to the first batch,
after imports. Targets (issue 4): first batch <= 0.5 s with 2 workers; 2 workers >= 1.7x 1 worker.

    python benchmarks/process_workers.py [--rows 200000] [--batches 300] [--repeats 3]
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
import lanceloader as ll
from benchmarks.process_workers import python_heavy
uri, worker_type, workers, batches, warm = sys.argv[1:6]
if warm == "1":  # start the forkserver before timing: a long-running job pays this once
    from lanceloader.engine.processes import forkserver_context
    import multiprocessing.forkserver as fs
    forkserver_context(); fs.ensure_running()
start = time.perf_counter()
loader = ll.Loader(uri, batch_size=256, columns=["id", "x"], worker_type=worker_type,
                   num_workers=int(workers), transform=python_heavy)
it = iter(loader)
next(it)
first = time.perf_counter() - start
t0, n = time.perf_counter(), 0
for i, batch in enumerate(it):
    n += len(batch["id"])
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


def run_case(uri: str, worker_type: str, workers: int, batches: int, warm: bool) -> dict:
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": f"{root}:{root / 'src'}"}
    out = subprocess.run(
        [sys.executable, "-c", CASE, uri, worker_type, str(workers), str(batches), str(int(warm))],
        capture_output=True, text=True, env=env, timeout=600, check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--batches", type=int, default=300)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", default="benchmarks/results/process_workers.json")
    args = p.parse_args()

    from lanceloader.demo import write_demo_dataset

    uri = write_demo_dataset(Path(tempfile.mkdtemp()) / "bench.lance", rows=args.rows)
    cases = [("process", 1, False), ("process", 2, False), ("process", 2, True),
             ("thread", 1, False), ("thread", 2, False)]
    results: dict[str, list[dict]] = {f"{t} x{w}{' warm' if warm else ''}": [] for t, w, warm in cases}
    for _ in range(args.repeats):  # interleaved, so drift on a shared machine hits every case
        for (t, w, warm), key in zip(cases, results, strict=True):
            results[key].append(run_case(uri, t, w, args.batches, warm))
    summary = {
        key: {m: statistics.median(r[m] for r in runs) for m in ("first_batch_s", "rows_per_s")}
        for key, runs in results.items()
    }
    print(f"{'case':<22} {'first batch':>12} {'rows/s':>10}")
    for key, s in summary.items():
        print(f"{key:<22} {s['first_batch_s']:>11.3f}s {s['rows_per_s']:>10,.0f}")
    scaling = summary["process x2"]["rows_per_s"] / summary["process x1"]["rows_per_s"]
    thread_scaling = summary["thread x2"]["rows_per_s"] / summary["thread x1"]["rows_per_s"]
    print(f"\nprocess 2 vs 1 workers: {scaling:.2f}x (target >= 1.7x); threads: {thread_scaling:.2f}x")
    print(f"first batch, 2 process workers: cold {summary['process x2']['first_batch_s']:.2f} s, "
          f"forkserver already running {summary['process x2 warm']['first_batch_s']:.2f} s "
          "(target <= 0.5 s)")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"runs": results, "medians": summary,
                                           "process_scaling": scaling,
                                           "thread_scaling": thread_scaling,
                                           "cpu_count": os.cpu_count()}, indent=2))


if __name__ == "__main__":
    main()
