"""The engine against raw Lance: throughput ratios measured side by side, and memory.

Two parts, printed as markdown tables (the guide's figures come from this output):

**Throughput** (one process per dataset, so every ratio is two cases of the same process):
each case is run once unmeasured first (the raw scan is warmed exactly as the loader is: the
first raw scan in a fresh process runs at ~0.7x the next ones), then all cases ``--repeats``
times, alternating their order (forward, then backward). Besides rows/s, each case's CPU
seconds per row (all threads of the process, ``time.process_time``) and their ratio to the
raw scan's are printed: on a loaded machine wall-clock ratios swing 0.6-1.6x, CPU per row
much less. The raw side is a
``ds.to_batches(columns)`` scan twice over: with ``batch_size=256`` (the loader's batch) and
with Lance's own batch size; which is faster depends on the rows (256 for 11 KB blobs, Lance's
own for small tabular rows), and ratios are to the faster of the two in the same round. The
ratio of a case is the median over rounds of (its rows/s) / (the faster raw rows/s of the
same round), with its spread (min-max); rows/s are medians with their spread.

- ``bytes``: ``--images`` rows of ``id, label, image`` where ``image`` is ~11 KB of
  incompressible bytes (what a JPEG is to Lance), read in order (batch 256, default workers)
  as ``output="arrow"``, ``"numpy"`` and ``Conversion(output="torch")`` (the image column a
  :class:`lanceloader.ByteRows`), and as ``Conversion(binary="list")`` (a list of bytes, the
  behaviour before ``ByteRows``).
  A case ``numpy@768`` (say) would read 768 rows per Lance call (``rows_per_read``).
- ``tabular``: the demo dataset (``--rows`` rows of ``id, label, x``), ``"numpy"`` and
  ``"torch"``.

**Memory and workers** (each side in a fresh process, so peak RSS is its own: the training
process's, not its process workers'; sides alternated, medians of ``--repeats``): the sequential Loader's epoch over the bytes dataset
against pylance's ``lance.torch.data.LanceDataset``; a full shuffle of the tabular dataset
with process workers against thread workers (``--shuffle-rows`` rows each).

Usage::

    python benchmarks/engine.py                      # defaults: 20k images, 2M rows, 5 repeats
    python benchmarks/engine.py --images 2000 --rows 100000 --repeats 3   # smoke run
    python benchmarks/engine.py --parts bytes --repeats 9                  # the bytes table
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

# One process per dataset: warm every case, then alternate them; prints one JSON line.
THROUGHPUT = textwrap.dedent("""
    import json, sys, time
    import lance
    import lanceloader as ll
    uri, columns, cases, repeats = (sys.argv[1], sys.argv[2].split(","), sys.argv[3].split(","),
                                    int(sys.argv[4]))
    OUTPUTS = {"arrow": "arrow", "numpy": "numpy", "torch": ll.Conversion(output="torch"),
               "numpy-list": ll.Conversion(output="numpy", binary="list")}

    def raw(batch_size):
        ds = lance.dataset(uri)
        start, rows = time.perf_counter(), 0
        for batch in ds.to_batches(columns=columns, batch_size=batch_size):
            rows += batch.num_rows
        return rows, time.perf_counter() - start

    def loader(case):
        output, _, rows_per_read = case.partition("@")  # "numpy@768": rows_per_read=768
        loader = ll.Loader(uri, batch_size=256, columns=columns, output=OUTPUTS[output],
                           rows_per_read=int(rows_per_read) if rows_per_read else None)
        start, rows = time.perf_counter(), 0
        for batch in loader:
            rows += batch.num_rows if output == "arrow" else len(batch[columns[0]])
        return rows, time.perf_counter() - start

    RAW = {"raw-256": 256, "raw-default": None}  # None: Lance's own batch size
    run = {c: (lambda c=c: raw(RAW[c])) if c in RAW else (lambda c=c: loader(c)) for c in cases}
    for case in cases:  # warm-up: each case once, unmeasured, the raw scan included
        run[case]()
    rounds = []
    for r in range(repeats):
        rates = {}
        for case in (cases if r % 2 == 0 else cases[::-1]):
            cpu = time.process_time()  # every thread of this process: Lance's and the workers'
            rows, seconds = run[case]()
            rates[case] = rows / seconds
            rates[case + ":cpu"] = (time.process_time() - cpu) / rows * 1e6
        rounds.append(rates)
    print(json.dumps(rounds))
""")

# One side of a memory or worker comparison, in a fresh process: rows, seconds, peak RSS.
SIDE = textwrap.dedent("""
    import json, sys, time
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
""")


def write_blobs(path: Path, images: int) -> str:
    """``images`` rows of ``id, label, image`` (9-13 KB of random bytes each) at ``path``."""
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
            yield pa.record_batch(
                {
                    "id": pa.array(np.arange(lo, lo + n)),
                    "label": pa.array(np.arange(lo, lo + n) % 10),
                    "image": pa.array(blobs, pa.binary()),
                }
            )

    schema = pa.schema({"id": pa.int64(), "label": pa.int64(), "image": pa.binary()})
    lance.write_dataset(
        pa.RecordBatchReader.from_batches(schema, batches()), str(path), max_rows_per_file=5_000
    )
    return str(path)


def _child(script: str, *args: str) -> str:
    out = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"benchmark child failed:\n{out.stderr[-3000:]}")
    return out.stdout.strip().splitlines()[-1]


def spread(values: list[float], fmt: str = ",.0f") -> str:
    """``median [min-max]`` of ``values``.

    >>> spread([3.0, 1.0, 2.0], ".1f")
    '2.0 [1.0-3.0]'
    """
    return f"{statistics.median(values):{fmt}} [{min(values):{fmt}}-{max(values):{fmt}}]"


def throughput(
    name: str, uri: str, columns: str, cases: list[str], repeats: int, report: dict
) -> list[str]:
    """Markdown rows for one dataset's cases, each against the faster raw scan of its round
    (``to_batches`` with batch_size=256, or with Lance's own: which is faster depends on the
    rows)."""
    raws = ["raw-256", "raw-default"]
    rounds = json.loads(_child(THROUGHPUT, uri, columns, ",".join([*raws, *cases]), str(repeats)))
    best = [max(r[c] for c in raws) for r in rounds]
    report[name] = {"raw": best}
    lines = []
    for case in [*raws, *cases]:
        rates = [r[case] for r in rounds]
        ratios = [rate / b for rate, b in zip(rates, best, strict=True)]
        cpu = [r[case + ":cpu"] for r in rounds]
        # CPU per row against the raw scan of the same round that used less: steadier than
        # wall time on a loaded machine (> 1: the loader spends more CPU per row)
        cpu_ratios = [r[case + ":cpu"] / min(r[c + ":cpu"] for c in raws) for r in rounds]
        report[name][case] = {"rows_per_s": rates, "ratio": ratios, "cpu_us_per_row": cpu}
        label = (
            f"raw `to_batches({'batch_size=256' if case == 'raw-256' else ''})`"
            if case in raws
            else f"loader `{case}`"
        )
        lines.append(
            f"| {name} | {label} | {spread(rates)} | {spread(ratios, '.2f')} | "
            f"{spread(cpu, '.1f')} | {spread(cpu_ratios, '.2f')} |"
        )
    return lines


def side_by_side(a: tuple, b: tuple, repeats: int) -> tuple[list[dict], list[dict]]:
    """Sides ``a`` and ``b`` (``(case, uri, columns[, limit])``), each run in a fresh process,
    alternately ``repeats`` times."""
    results: list[list[dict]] = [[], []]
    for r in range(repeats):
        for side in (0, 1) if r % 2 == 0 else (1, 0):
            case, uri, columns, *limit = (a, b)[side]
            results[side].append(
                json.loads(_child(SIDE, case, uri, columns, str(limit[0] if limit else 1 << 62)))
            )
    return results[0], results[1]


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--images", type=int, default=20_000)
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--shuffle-rows", type=int, default=200_000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--data-dir", type=Path, default=HERE / "data")
    p.add_argument(
        "--parts",
        default="bytes,tabular,memory",
        help="which tables to print (comma-separated: bytes, tabular, memory)",
    )
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    args = p.parse_args()
    if args.repeats < 3:
        p.error("--repeats must be at least 3 (medians of fewer runs mislead)")
    parts = set(args.parts.split(","))
    if not parts or parts - {"bytes", "tabular", "memory"}:
        p.error(f"--parts takes bytes, tabular and memory, got {args.parts!r}")
    args.data_dir.mkdir(parents=True, exist_ok=True)
    from lanceloader.demo import write_demo_dataset

    blobs = write_blobs(args.data_dir / f"blobs-{args.images}.lance", args.images)
    tabular = args.data_dir / f"demo-{args.rows}-8.lance"
    if not tabular.exists() and parts & {"tabular", "memory"}:
        write_demo_dataset(tabular, rows=args.rows, fragments=8)
    report: dict[str, dict] = {}

    print(
        f"Throughput, sequential, batch 256 ({args.repeats} rounds after a warm-up; "
        "median [min-max]; ratio: to the faster raw scan of the same round)\n"
    )
    print(
        "| data | case | rows/s | ratio to raw | CPU µs/row | CPU / raw's |\n"
        "|---|---|---|---|---|---|"
    )
    bytes_cases = ["arrow", "numpy", "torch", "numpy-list"]
    tables = [
        ("bytes", f"bytes ({args.images:,} x 11 KB)", blobs, "id,label,image", bytes_cases),
        ("tabular", f"tabular ({args.rows:,} rows)", str(tabular), "id,label,x",
         ["numpy", "torch"]),
    ]  # fmt: skip
    for part, name, uri, columns, cases in tables:
        if part in parts:
            for line in throughput(name, uri, columns, cases, args.repeats, report):
                print(line, flush=True)

    if "memory" in parts:
        print(
            f"\nMemory and workers (each side a fresh process, {args.repeats} alternated "
            "runs; median [min-max])\n"
        )
        print("| comparison | side | rows/s | peak RSS MB | ratio |\n|---|---|---|---|---|")
        pairs = [
            (
                "bytes epoch: memory",
                ("loader:sequential", blobs, "id,label,image"),
                ("lancedataset", blobs, "id,label,image"),
                "Loader",
                "LanceDataset",
            ),
            (
                "full shuffle: workers",
                ("loader:shuffle-process", str(tabular), "id,label,x", args.shuffle_rows),
                ("loader:shuffle-thread", str(tabular), "id,label,x", args.shuffle_rows),
                "processes",
                "threads",
            ),
        ]
        for name, a, b, a_name, b_name in pairs:
            x, y = side_by_side(a, b, args.repeats)
            rates = [[r["rows"] / r["seconds"] for r in side] for side in (x, y)]
            ratios = [u / v for u, v in zip(rates[0], rates[1], strict=True)]
            report[name] = {a_name: x, b_name: y}
            for side_name, side, rate in ((a_name, x, rates[0]), (b_name, y, rates[1])):
                rss = [r["rss"] / 1e6 for r in side]
                ratio = spread(ratios, ".2f") if side is x else "1.00"
                print(
                    f"| {name} | {side_name} | {spread(rate)} | {spread(rss)} | {ratio} |",
                    flush=True,
                )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
