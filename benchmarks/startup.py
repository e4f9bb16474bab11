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

Each round also times raw Lance on the same rows (``--raw``, on by default): a fresh interpreter
(``lance`` imported before the clock) opens the table and takes the first batch's rows
(its ``id`` column is the rows' offsets), as a worker's first read does; the loader's own part of
the first batch is the rest (first batch less that open and take). A full shuffle's first 256
rows lie in ~91 of the 100M table's 96 fragments, and Lance's take pays per fragment it reads
from, so the raw take is what grows with the table; the loader's own part should not.

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
first = next(it)
t2 = time.perf_counter()
first_ids = [int(i) for i in first["id"]]  # the rows' offsets (id = offset in these tables)
pool = getattr(loader, "_pool", None)
sent = getattr(getattr(pool, "pool", None), "start_bytes", None)
if sent is None:  # code before the pool reported it: the work it pickled for each worker
    sent = len(dumps(loader._pipeline.work()))
loader.close()
import shutil; shutil.rmtree(os.environ["LANCELOADER_AUTO_CACHE_DIR"], ignore_errors=True)
print(json.dumps({"construct_s": t1 - t0, "first_batch_s": t2 - t1, "bytes_per_worker": sent,
                  "first_ids": first_ids, **({"pieces_filled_before": fills} if filled else {})}))
"""

# Raw Lance, as a fresh worker's first read: open the table, take the first batch's rows (sorted).
RAW = r"""
import json, sys, time
import lance, numpy as np
uri, ids = sys.argv[1], np.sort(np.array(json.loads(sys.stdin.read()), dtype=np.int64))
t0 = time.perf_counter()
ds = lance.dataset(uri)
fragments = len(ds.get_fragments())
t1 = time.perf_counter()
ds.take(ids, columns=["id"])
t2 = time.perf_counter()
print(json.dumps({"raw_open_s": t1 - t0, "raw_take_s": t2 - t1, "fragments": fragments}))
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


def run_case(
    src: Path, uri: str, filter_: str, workers: int, filled: bool = False, raw: bool = False
) -> dict:
    """One fresh interpreter's start-up on the code in ``src``; with ``raw``, then raw Lance's
    open and take of the same first rows in another fresh interpreter (see the module's text)."""
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": f"{src}:{root}"}
    args = [uri, filter_, str(workers), "filled" if filled else ""]
    result = _python(CASE, args, env)
    ids = result.pop("first_ids")
    if raw and ids:
        result.update(_python(RAW, [uri], env, json.dumps(ids)))
        lance_s = result["raw_open_s"] + result["raw_take_s"]
        result["loader_own_s"] = result["first_batch_s"] - lance_s
    return result


def _python(code: str, args: list[str], env: dict[str, str], stdin: str = "") -> dict:
    """The JSON that ``code`` prints last, run in a fresh interpreter."""
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        input=stdin,
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
    parser.add_argument(
        "--raw",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also raw Lance's open and take of the first batch's rows (see above)",
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
    load_before = os.getloadavg()
    for _ in range(args.repeats):
        for rows, uri in tables.items():
            for filter_ in filters:
                for cache in caches:
                    for code, src in codes.items():
                        result = run_case(
                            src, uri, filter_, args.workers, cache == "filled", args.raw
                        )
                        results.setdefault((code, rows, filter_, cache), []).append(result)
                        print(code, rows, filter_ or "-", cache, json.dumps(result), flush=True)
    print(f"\n{args.workers} process workers, shuffle, default cache, medians of {args.repeats}")
    print(
        f"load average (1 min) at the start {load_before[0]:.1f}, at the end {os.getloadavg()[0]:.1f}\n"
    )
    print(
        "| code | rows | filter | cache | construct s | iter() to first batch s "
        "| raw Lance open + take s | loader's own s | bytes per worker |"
    )
    print("|---|---:|---|---|---:|---:|---:|---:|---:|")
    medians = {case: _medians(runs) for case, runs in results.items()}
    for (code, rows, filter_, cache), med in medians.items():
        print(
            f"| {code} | {rows:,} | {filter_ or '-'} | {cache} | {med['construct_s']:.2f} | "
            f"{med['first_batch_s']:.3f} | {med.get('raw_s', float('nan')):.3f} | "
            f"{med.get('loader_own_s', float('nan')):.3f} | {med['bytes_per_worker']:,.0f} |"
        )
    print("\nlarge / small, medians of the per-round ratios (round i's large over its small):\n")
    for (code, rows, filter_, cache), runs in results.items():
        small = results.get((code, args.small, filter_, cache))
        if rows != args.large or small is None:
            continue
        ratios = {
            k: statistics.median(b[k] / a[k] for a, b in zip(small, runs, strict=True))
            for k in ("first_batch_s", "raw_s", "loader_own_s")
            if k in runs[0] and k in small[0]
        }
        print(code, filter_ or "-", cache, {k: round(v, 2) for k, v in ratios.items()})


def _medians(runs: list[dict]) -> dict[str, float]:
    """Each figure's median over the rounds (raw Lance's open and take summed first)."""
    for r in runs:
        if "raw_open_s" in r:
            r["raw_s"] = r["raw_open_s"] + r["raw_take_s"]
    keys = [k for k in runs[0] if isinstance(runs[0][k], int | float)]
    return {k: statistics.median(r[k] for r in runs) for k in keys}


if __name__ == "__main__":
    main()
