"""The cache under a full shuffle: thread workers against process workers, the default cache.

Each case runs in a fresh interpreter (``Loader(uri, shuffle=True)``, 2 workers, the demo
dataset's ``id``, ``label`` and ``x``), ``--epochs`` epochs (3); the later epochs' rows/s is what
a cached shuffle runs at (process workers: the same workers every epoch, a loader keeps its
pool). The cases are interleaved over ``--repeats`` rounds (drift on a shared machine
hits every case alike), and the ratios are taken within each round (process / thread with the
same cache), then their median. Each case has its own automatic-cache directory under
``/dev/shm`` (``LANCELOADER_AUTO_CACHE_DIR``), so no case finds another's pieces. The JSON of
each run also gives the cache fills that the main process's ``stats()`` reports.

Cases: ``cache="auto"`` (the default) and ``cache=None``, each on thread and on process workers;
with ``--shm``, also ``cache="/dev/shm/<dir>"`` (a directory given on tmpfs); ``--caches auto``
runs only the default. ``--compare DIR`` runs every case on the code in ``DIR/src`` too (a
``git worktree`` of an older commit), alternated with this checkout's in each round.

``--source``: the cache's own cost, without the engine. In one process, ``Source.read_rows`` of
123,136 random rows at a time (the size the loader gathers) through the automatic cache, epochs
1-4 (the first fills it); then a fresh process reading one epoch of the filled cache (what a
process worker does each epoch). CPU seconds per million rows: load on a shared machine does
not inflate them as it does wall-clock time.

    python benchmarks/cache_workers.py --rows 1000000 --repeats 3
    python benchmarks/cache_workers.py --caches auto --compare /tmp/old --repeats 5
    python benchmarks/cache_workers.py --source --repeats 3
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
import json, os, sys, tempfile, time
import lanceloader as ll

def descendants_cpu():
    # CPU seconds of this process's descendants (the forkserver and its workers), from /proc
    parents, ticks = {}, {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(pid)], ticks[int(pid)] = int(fields[1]), int(fields[11]) + int(fields[12])
    mine, total = {os.getpid()}, 0
    for _ in range(3):  # grandchildren: the forkserver's workers
        mine |= {p for p, q in parents.items() if q in mine}
    return sum(ticks[p] for p in mine - {os.getpid()}) / os.sysconf("SC_CLK_TCK")

uri, worker_type, cache, epochs = sys.argv[1:5]
with tempfile.TemporaryDirectory(dir="/dev/shm", prefix="llbench-") as shm:
    os.environ["LANCELOADER_AUTO_CACHE_DIR"] = shm
    kwargs = {} if cache == "auto" else {"cache": None} if cache == "none" else \
        {"cache": os.path.join(shm, "given")}
    loader = ll.Loader(uri, batch_size=256, columns=["id", "label", "x"], shuffle=True, seed=0,
                       output="numpy", num_workers=2, worker_type=worker_type, **kwargs)
    rates, cpus = [], []
    for _ in range(int(epochs)):
        start, rows = time.perf_counter(), 0
        cpu = time.process_time() + descendants_cpu()
        for batch in loader:
            rows += len(batch["id"])
        rates.append(rows / (time.perf_counter() - start))
        cpus.append((time.process_time() + descendants_cpu() - cpu) * 1e6 / rows)
    stats = loader.stats()
    fills = getattr(stats, "cache_fills", None)
    loader.close()
print(json.dumps({**{f"epoch{i + 1}": r for i, r in enumerate(rates)},
                  **{f"cpu{i + 1}": c for i, c in enumerate(cpus)}, "fills": fills,
                  "cached": stats.rows_cached}))
"""


SOURCE = r"""
import json, os, pickle, subprocess, sys, tempfile, time
import numpy as np
from lanceloader.rows.lance.source import Source
FRESH = '''
import json, pickle, sys, time, numpy as np
source = pickle.loads(open(sys.argv[1], "rb").read())
order = np.random.default_rng(9).permutation(source.num_rows)
cpu = time.process_time()
for start in range(0, source.num_rows, 123136):
    source.read_rows(order[start:start + 123136])
print(json.dumps((time.process_time() - cpu) * 1e6 / source.num_rows))
'''
with tempfile.TemporaryDirectory(dir="/dev/shm", prefix="llbench-") as shm:
    os.environ["LANCELOADER_AUTO_CACHE_DIR"] = shm
    source = Source(sys.argv[1], columns=["id", "label", "x"], cache="auto", random_order=True)
    rng, cpu_per_m = np.random.default_rng(0), []
    for _ in range(4):
        order, cpu = rng.permutation(source.num_rows), time.process_time()
        for start in range(0, source.num_rows, 123136):
            source.read_rows(order[start:start + 123136])
        cpu_per_m.append((time.process_time() - cpu) * 1e6 / source.num_rows)
    with open(os.path.join(shm, "source.pkl"), "wb") as file:
        pickle.dump(source, file)
    fresh = subprocess.run([sys.executable, "-c", FRESH, os.path.join(shm, "source.pkl")],
                           capture_output=True, text=True, check=True)
print(json.dumps({"epochs": cpu_per_m, "fresh": json.loads(fresh.stdout)}))
"""


def run_source(uri: str, repeats: int) -> None:
    """``--source``: the cache's CPU seconds per 1M rows, in one process and in a fresh one."""
    runs = []
    for _ in range(repeats):
        done = subprocess.run(
            [sys.executable, "-c", SOURCE, uri], capture_output=True, text=True, timeout=1800
        )
        if done.returncode != 0:
            raise RuntimeError(done.stderr[-3000:])
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(json.dumps(runs[-1]), flush=True)
    later = [cpu for run in runs for cpu in run["epochs"][1:]]
    fresh = [run["fresh"] for run in runs]
    print(
        f"CPU s per 1M rows, epochs 2-4 in one process: median {statistics.median(later):.2f} "
        f"({min(later):.2f}-{max(later):.2f}); a fresh process's epoch: median "
        f"{statistics.median(fresh):.2f} ({min(fresh):.2f}-{max(fresh):.2f})"
    )


def run_case(uri: str, worker_type: str, cache: str, epochs: int, src: Path) -> dict:
    """One case in a fresh interpreter, on the code in ``src``: its JSON line."""
    done = subprocess.run(
        [sys.executable, "-c", CASE, uri, worker_type, cache, str(epochs)],
        capture_output=True,
        text=True,
        timeout=1800,
        cwd=str(Path(__file__).resolve().parent.parent),
        env={**os.environ, "PYTHONPATH": str(src)},
    )
    if done.returncode != 0:
        raise RuntimeError(f"case {worker_type}/{cache} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--shm", action="store_true", help="also cache='/dev/shm/<dir>'")
    parser.add_argument("--caches", default="auto,none", help="which caches (auto, none)")
    parser.add_argument("--compare", type=Path, help="a checkout of older code to alternate with")
    parser.add_argument("--dataset", help="an existing demo dataset (default: one is written)")
    parser.add_argument("--source", action="store_true", help="the cache alone (see above)")
    args = parser.parse_args()
    from lanceloader.demo import write_demo_dataset

    caches = [*args.caches.split(","), *(["shm"] if args.shm else [])]
    codes = {"this": Path(__file__).resolve().parents[1] / "src"}
    if args.compare:
        codes = {"before": args.compare / "src", **codes}
    with tempfile.TemporaryDirectory() as tmp:
        uri = args.dataset or str(
            write_demo_dataset(Path(tmp) / "d.lance", rows=args.rows, fragments=8)
        )
        if args.source:
            run_source(uri, args.repeats)
            return
        results: dict[tuple[str, str, str], list[dict]] = {}
        for _ in range(args.repeats):
            for cache in caches:
                for code, src in codes.items():
                    for worker_type in ("thread", "process"):
                        result = run_case(uri, worker_type, cache, args.epochs, src)
                        results.setdefault((code, worker_type, cache), []).append(result)
                        print(code, worker_type, cache, json.dumps(result), flush=True)
    report(results, args, caches, list(codes))


def report(results: dict, args: argparse.Namespace, caches: list[str], codes: list[str]) -> None:
    """Medians per case and epoch (rows/s, and CPU µs a row over the consumer and its worker
    processes), process / thread within each round per code, and this / before per case."""
    epochs = [f"epoch{i + 1}" for i in range(args.epochs)]
    cpus = [f"cpu{i + 1}" for i in range(args.epochs)]
    print(f"\n{args.rows:,} rows, full shuffle, 2 workers, {args.repeats} rounds (medians)\n")
    heads = (
        " | ".join(e + " rows/s" for e in epochs) + " | " + " | ".join(c + " µs/row" for c in cpus)
    )
    print(f"| code | cache | workers | {heads} | fills |")
    print(f"|---|---|---|{'---:|' * 2 * len(epochs)}---|")
    for code in codes:
        for cache in caches:
            for worker_type in ("thread", "process"):
                runs = results[(code, worker_type, cache)]
                rates = " | ".join(f"{statistics.median(r[e] for r in runs):,.0f}" for e in epochs)
                cpu = " | ".join(
                    f"{statistics.median(r.get(c, 0) for r in runs):.2f}" for c in cpus
                )
                fills = [r["fills"] for r in runs]
                print(f"| {code} | {cache} | {worker_type} | {rates} | {cpu} | {fills} |")
    print()
    for code in codes:
        for cache in caches:
            for epoch in epochs:
                _ratio_line(
                    f"{code}: process / thread, cache={cache}, {epoch}",
                    results[(code, "process", cache)],
                    results[(code, "thread", cache)],
                    epoch,
                )
    if len(codes) == 2:
        for cache in caches:
            for worker_type in ("thread", "process"):
                for key in (*epochs, *cpus):
                    _ratio_line(
                        f"this / before, {worker_type}, cache={cache}, {key}",
                        results[("this", worker_type, cache)],
                        results[("before", worker_type, cache)],
                        key,
                    )


def _ratio_line(what: str, tops: list[dict], bottoms: list[dict], key: str) -> None:
    """The median (min, max) of ``top[key] / bottom[key]`` over the rounds."""
    ratios = [t[key] / b[key] for t, b in zip(tops, bottoms, strict=True)]
    print(
        f"{what}: median {statistics.median(ratios):.2f}x (min {min(ratios):.2f}, "
        f"max {max(ratios):.2f})"
    )


if __name__ == "__main__":
    main()
