"""Start-up with process workers: does the first batch wait longer on a larger table?

Two tables of one ``int64`` column ``id`` (written once into ``--data-dir`` with Lance's default
1,048,576 rows a file): ``--small`` rows (1M) and ``--large`` rows (100M). For each, a fresh
interpreter builds ``Loader(uri, shuffle=True, worker_type="process", num_workers=8)`` (the
default cache, in an empty directory of its own: what a job's first start finds) and times the construction and ``iter()`` to the first batch; with
``--filter`` the same with ``filter="id % 2 = 0"`` (a row list of half the rows). It prints
the bytes pickled for each worker at start-up (what the pool sends every worker before its
first task; on code before the pool reported it, the pickled work, which was all it sent).

``--filled``: also each case with the automatic cache already filled by an earlier loader of
the same interpreter (a block shuffle with thread workers, every piece; the automatic cache
lives as long as the processes using it, so this is a job's second loader, or a restarted
iteration): a fresh worker's first read finds every piece in the cache, held by none.

``--compare DIR`` runs the same cases on the code in ``DIR/src`` (a ``git worktree`` of an
older commit), alternated case by case with this checkout's, ``--repeats`` rounds; medians.

    python benchmarks/startup.py [--large 100000000] [--repeats 3] [--compare /tmp/old]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

CASE = r"""
import json, os, sys, tempfile, time
os.environ["LANCELOADER_AUTO_CACHE_DIR"] = tempfile.mkdtemp(dir="/dev/shm", prefix="llstart-")
import lanceloader as ll
from lanceloader.engine.pickling import dumps
uri, filter_, workers, filled = sys.argv[1], sys.argv[2] or None, int(sys.argv[3]), sys.argv[4]
if filled:  # the automatic cache filled by an earlier loader of this job (it lives with the job)
    fill = ll.Loader(uri, batch_size=65536, shuffle=True, shuffle_block_size=1 << 20,
                     worker_type="thread", num_workers=2, filter=filter_)
    for _ in fill:
        pass
    fills = fill.stats().cache_fills
    fill.close()
try:
    from lanceloader.engine.forkserver import WorkerProcess, start_forkserver
except ImportError:  # code before forkserver.py
    from lanceloader.engine.processes import WorkerProcess, start_forkserver
start_forkserver()  # a long-running job pays the server's start once: not counted here
ready = WorkerProcess(target=int)  # the server forks once its imports are done
ready.start(); ready.join()
t0 = time.perf_counter()
loader = ll.Loader(uri, batch_size=256, shuffle=True, worker_type="process",
                   num_workers=workers, filter=filter_)
t1 = time.perf_counter()
it = iter(loader)
next(it)
t2 = time.perf_counter()
pool = getattr(loader, "_pool", None)
sent = getattr(getattr(pool, "pool", None), "start_bytes", None)
if sent is None:  # code before the pool reported it: the work it pickled for each worker
    sent = len(dumps(loader._pipeline.work()))
loader.close()
import shutil; shutil.rmtree(os.environ["LANCELOADER_AUTO_CACHE_DIR"], ignore_errors=True)
print(json.dumps({"construct_s": t1 - t0, "first_batch_s": t2 - t1, "bytes_per_worker": sent,
                  **({"pieces_filled_before": fills} if filled else {})}))
"""


def write_table(path: Path, rows: int) -> str:
    """A table of ``rows`` int64 ids (written once; kept for later runs)."""
    if not path.exists():
        import lance
        import numpy as np
        import pyarrow as pa

        def batches():
            for start in range(0, rows, 1 << 22):
                ids = np.arange(start, min(rows, start + (1 << 22)), dtype=np.int64)
                yield pa.record_batch({"id": ids})

        schema = pa.schema({"id": pa.int64()})
        lance.write_dataset(pa.RecordBatchReader.from_batches(schema, batches()), str(path))
    return str(path)


def run_case(src: Path, uri: str, filter_: str, workers: int, filled: bool = False) -> dict:
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": f"{src}:{root}"}
    done = subprocess.run(
        [sys.executable, "-c", CASE, uri, filter_, str(workers), "filled" if filled else ""],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--small", type=int, default=1_000_000)
    parser.add_argument("--large", type=int, default=100_000_000)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--filter", action="store_true", help="also with a filter's row list")
    parser.add_argument(
        "--filled", action="store_true", help="also with the automatic cache filled (see above)"
    )
    parser.add_argument("--compare", type=Path, help="a checkout of older code to alternate with")
    parser.add_argument("--data-dir", type=Path, default=Path("/tmp/lanceloader-startup"))
    args = parser.parse_args()
    args.data_dir.mkdir(parents=True, exist_ok=True)
    tables = {n: write_table(args.data_dir / f"ids-{n}.lance", n) for n in (args.small, args.large)}
    codes = {"this": Path(__file__).resolve().parents[1] / "src"}
    if args.compare:
        codes = {"before": args.compare / "src", **codes}
    filters = ["", *(["id % 2 = 0"] if args.filter else [])]
    caches = ["empty", *(["filled"] if args.filled else [])]
    results: dict[tuple[str, int, str, str], list[dict]] = {}
    for _ in range(args.repeats):
        for rows, uri in tables.items():
            for filter_ in filters:
                for cache in caches:
                    for code, src in codes.items():
                        result = run_case(src, uri, filter_, args.workers, cache == "filled")
                        results.setdefault((code, rows, filter_, cache), []).append(result)
                        print(code, rows, filter_ or "-", cache, json.dumps(result), flush=True)
    print(f"\n{args.workers} process workers, shuffle, default cache, medians of {args.repeats}\n")
    print(
        "| code | rows | filter | cache | construct s | iter() to first batch s "
        "| bytes per worker |"
    )
    print("|---|---:|---|---|---:|---:|---:|")
    for (code, rows, filter_, cache), runs in results.items():
        med = {k: statistics.median(r[k] for r in runs) for k in ("construct_s", "first_batch_s")}
        med["bytes_per_worker"] = statistics.median(r["bytes_per_worker"] for r in runs)
        print(
            f"| {code} | {rows:,} | {filter_ or '-'} | {cache} | {med['construct_s']:.2f} | "
            f"{med['first_batch_s']:.2f} | {med['bytes_per_worker']:,.0f} |"
        )


if __name__ == "__main__":
    main()
