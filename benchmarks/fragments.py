"""Many fragments: a table grown by appends against the same rows in a few fragments.

Method
------
* Tables: the demo rows (``lanceloader.write.demo.demo_table``: ``id``, ``label``, ``x`` of 64
  float32, ``text``), ``--rows`` of them (default 1,000,000), written twice under ``--dir``:
  ``many.lance`` appended to ``rows / --append-rows`` times (default 2,000 appends of 500 rows,
  one fragment each), and ``four.lance`` in 4 fragments. Written once, reused.
* Every measurement runs in a fresh process (``--child``), so no Lance cache or loader state
  carries over; the two tables alternate (the order flips each repeat), so drift on a shared
  machine hits both alike. Columns ``id``, ``label``, ``x``, batch 256, ``output="numpy"``.
* In each process: ``lance.dataset(uri)`` is timed twice (the first pays Lance's start-up; the
  second is the reference, ``open``), then ``lance.dataset(uri)`` plus the cheapest Lance calls
  that give the plan a Loader needs (``open+plan``: every fragment's id and rows after
  deletions, from the manifest: ``ds._ds.get_fragments()``, ``id()``, ``physical_rows`` less
  ``num_deletions``; no per-fragment I/O), then ``Loader(...)`` (``construct``: default
  ``cache="auto"``), then two epochs (``epoch 0``, ``epoch 1``; from ``iter()`` to the last row
  counted).
* Cases: ``block`` (``shuffle=True, shuffle_block_size=1024``, the cache ``auto`` chooses:
  ``/dev/shm``; it lives while processes use it, so epoch 0 of a run fills it unless another
  process keeps it), ``block cold`` (the same into a new cache directory under ``/dev/shm`` per
  run, removed after: every piece filled in epoch 0), ``sequential`` (no shuffle: ``auto``
  chooses no cache) and ``full`` (``shuffle=True``).
* Reported: the median of ``--repeats`` runs per case and table, and their ratios (many / four;
  construct / open, construct / open+plan: the medians of the per-run ratios). Targets (issue
  44): construct <= 2x ``open`` plus the plan; a block-shuffle epoch over the appended table
  <= 1.5x the same rows in 4 fragments.
* ``--before SRC``: every run is made twice, with this checkout's code and with the ``src``
  folder of another (``git worktree add /tmp/old HEAD~1``; on ``PYTHONPATH``), in alternating
  order; reported as one more table, ``before``, and the medians of after / before per run.

Usage::

    python benchmarks/fragments.py                       # 1M rows, 5 repeats
    python benchmarks/fragments.py --rows 100000 --repeats 2   # smoke run
    python benchmarks/fragments.py --before /tmp/old/src --cases block,sequential
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

COLUMNS = ["id", "label", "x"]
CASES = {
    "block": {"shuffle": True, "shuffle_block_size": 1024},
    "block cold": {"shuffle": True, "shuffle_block_size": 1024},
    "sequential": {},
    "full": {"shuffle": True},
}
HERE = Path(__file__).resolve().parent


def write_tables(root: Path, rows: int, append_rows: int) -> dict[str, str]:
    """The two tables under ``root`` (written on first use): appended and in 4 fragments."""
    import lance

    from lanceloader.write.demo import demo_table

    paths = {"many": root / "many.lance", "four": root / "four.lance"}
    if all((p / "_versions").exists() for p in paths.values()):
        return {k: str(v) for k, v in paths.items()}
    table = demo_table(rows)
    lance.write_dataset(table, paths["four"], mode="overwrite", max_rows_per_file=-(-rows // 4))
    for i, start in enumerate(range(0, rows, append_rows)):
        lance.write_dataset(
            table.slice(start, append_rows), paths["many"], mode="append" if i else "overwrite"
        )
    return {k: str(v) for k, v in paths.items()}


def child(uri: str, case: str) -> dict[str, Any]:
    """One run in this (fresh) process: open, construct, two epochs; seconds."""
    import lance

    from lanceloader import Loader

    got: dict[str, Any] = {}
    for key in ("first open", "open"):
        t = time.perf_counter()
        lance.dataset(uri)
        got[key] = time.perf_counter() - t
    t = time.perf_counter()
    plan = plan_calls(lance.dataset(uri))
    got["open+plan"] = time.perf_counter() - t
    got["fragments"] = len(plan)
    cold = tempfile.mkdtemp(prefix="llfrag-", dir="/dev/shm") if case == "block cold" else None
    try:
        t = time.perf_counter()
        loader = Loader(
            uri,
            batch_size=256,
            columns=COLUMNS,
            output="numpy",
            cache=cold or "auto",
            **CASES[case],
        )
        got["construct"] = time.perf_counter() - t
        got["cache"] = loader.source.cache_choice
        for epoch in range(2):
            t = time.perf_counter()
            rows = sum(len(b["id"]) for b in loader)
            got[f"epoch {epoch}"] = time.perf_counter() - t
        got["rows"] = rows
        loader.close()
    finally:
        if cold:
            shutil.rmtree(cold, ignore_errors=True)
    return got


def plan_calls(ds: Any) -> list[tuple[int, int]]:
    """The cheapest Lance calls that give a Loader's plan: each fragment's id and rows after
    deletions, from the manifest (Lance's own fragment objects, without the Python wrapper
    ``get_fragments()`` builds around each)."""
    return [(f.id(), f.physical_rows - f.num_deletions) for f in ds._ds.get_fragments()]


def run_child(uri: str, case: str, src: str | None = None) -> dict[str, Any]:
    """:func:`child` in a fresh process (importing lanceloader from ``src`` when given)."""
    env = {**os.environ, "PYTHONPATH": src} if src else None
    out = subprocess.run(
        [sys.executable, __file__, "--child", uri, case],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--append-rows", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--before", default=None, help="another checkout's src folder")
    parser.add_argument("--child", nargs=2, metavar=("URI", "CASE"))
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(*args.child)))
        return
    root = args.dir or HERE / "data" / f"fragments-{args.rows}x{args.append_rows}"
    root.mkdir(parents=True, exist_ok=True)
    tables = write_tables(root, args.rows, args.append_rows)
    results: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for repeat in range(args.repeats):
        for case in args.cases.split(","):
            for name in ["many", "four"] if repeat % 2 else ["four", "many"]:
                codes = [None, args.before] if args.before else [None]
                for src in codes if repeat % 2 == 0 else codes[::-1]:
                    key = (case, name if src is None else f"{name} before")
                    results.setdefault(key, []).append(run_child(tables[name], case, src))
    report(results, args)


def report(results: dict[tuple[str, str], list[dict[str, Any]]], args: Any) -> None:
    """Medians per case and table, and the ratios the targets are about."""
    print(
        f"{args.rows:,} rows, appends of {args.append_rows}, {args.repeats} runs each; "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}"
    )
    keys = ("open", "open+plan", "construct", "epoch 0", "epoch 1")
    print(f"{'case':<12}{'table':<13}" + "".join(f"{k:>11}" for k in keys) + "  cache")
    med: dict[tuple[str, str, str], float] = {}
    for (case, name), runs in results.items():
        for k in keys:
            med[case, name, k] = statistics.median(r[k] for r in runs)
        for base in ("open", "open+plan"):
            med[case, name, f"/{base}"] = statistics.median(r["construct"] / r[base] for r in runs)
        print(
            f"{case:<12}{name:<13}"
            + "".join(f"{med[case, name, k]:>11.3f}" for k in keys)
            + f"  {runs[-1]['cache'][:50]}"
        )
    print("ratios many / four; construct / open and construct / open+plan in brackets:")
    for case in dict.fromkeys(c for c, _ in results):
        ratios = "  ".join(
            f"{k} {med[case, 'many', k] / med[case, 'four', k]:.2f}x" for k in keys[2:]
        )
        opens = "  ".join(
            f"{n} {med[case, n, '/open']:.1f}x / {med[case, n, '/open+plan']:.1f}x"
            for n in ("four", "many")
        )
        print(f"  {case:<12}{ratios}   [{opens}]")
    if args.before:
        after_before(results, keys)


def after_before(results: dict[tuple[str, str], list[dict[str, Any]]], keys: tuple) -> None:
    """Medians of after / before, per run (the runs alternated the two codes)."""
    print("after / before (medians of per-run ratios); construct / open+plan before -> after:")
    for (case, name), runs in results.items():
        if name.endswith("before"):
            continue
        old = results[case, f"{name} before"]
        ratios = "  ".join(
            f"{k} {statistics.median(a[k] / b[k] for a, b in zip(runs, old, strict=True)):.2f}x"
            for k in keys[2:]
        )
        plan = [
            statistics.median(r["construct"] / r["open+plan"] for r in rs) for rs in (old, runs)
        ]
        print(f"  {case:<12}{name:<6}{ratios}   [{plan[0]:.1f}x -> {plan[1]:.1f}x]")


if __name__ == "__main__":
    main()
