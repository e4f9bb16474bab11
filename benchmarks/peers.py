"""lanceloader against raw Lance and its peers, on the same data, in one run: ``make bench-peers``.

Method
------
One generated dataset (``--rows`` rows of 268 B: ``id`` int64, ``label`` int64, ``x`` 64 float32,
in 8 fragments), the same three columns, batch 256 and torch output for every case. Each case runs
in a fresh Python process (``--runs`` times, cases interleaved run by run so drift hits all alike)
and reads one epoch capped at ``--seconds``; it reports rows/s over what it read, MB/s (268 B a
row), the time from construction to the first batch (imports excluded), and the peak RSS of its
process tree (sampled every 20 ms, workers included). Medians are quoted, ratios are against raw
Lance in the same run. ``resume`` cases time the first batch after resuming at 90% of an epoch.

Peers: ``lance.torch.data.LanceDataset`` (direct, and in a DataLoader with 0 workers),
``SafeLanceDataset`` with ``get_safe_loader`` (2 spawn workers, shuffled), Hugging Face
``datasets`` (``with_format("torch")``, shuffled, 0 and 2 workers) and, when installed, lancedb
and litdata (not installed here: reported as such). The results go to
``benchmarks/results/peers.json`` and render ``docs/performance.md`` and
``docs/performance.png``.

Usage::

    python benchmarks/peers.py                       # 2M rows, 3 runs, 10 s epochs
    python benchmarks/peers.py --rows 200000 --runs 1 --seconds 3   # smoke run
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
ROW_BYTES = 268
BATCH = 256
COLUMNS = ["id", "label", "x"]

# name -> (mode, what); the case code is in run_case().
CASES = {
    "raw Lance scan": ("sequential", "lance to_batches(256), Arrow (the ceiling)"),
    "lanceloader sequential, threads": ("sequential", "Loader(num_workers=2)"),
    "lanceloader sequential, processes": ("sequential", "worker_type='process', 2 workers"),
    "LanceDataset direct": ("sequential", "lance.torch.data.LanceDataset, iterated"),
    "LanceDataset + DataLoader(0)": ("sequential", "in a DataLoader, batch_size=None"),
    "lanceloader block shuffle, threads": ("block shuffle", "1,024-row blocks x 8"),
    "lanceloader block shuffle, processes": ("block shuffle", "the same, 2 process workers"),
    "lanceloader full shuffle, threads": ("full shuffle", "Loader(shuffle=True)"),
    "lanceloader full shuffle, processes": ("full shuffle", "2 process workers"),
    "HF datasets, 0 workers": ("full shuffle", "with_format('torch'), DataLoader(shuffle)"),
    "HF datasets, 2 workers": ("full shuffle", "the same, 2 fork workers"),
    "SafeLanceDataset, 2 spawn workers": ("full shuffle", "get_safe_loader(shuffle=True)"),
    "lanceloader resume at 90%": ("resume", "load_state_dict, then the first batch"),
}
ABSENT = {"lancedb": "lancedb Permutation / StreamingDataset", "litdata": "litdata",
          "streaming": "MosaicML Streaming"}


def write_data(root: Path, rows: int) -> tuple[str, str]:
    import lance
    import numpy as np
    import pyarrow as pa

    uri = root / f"peers-{rows}.lance"
    hf = root / f"peers-{rows}.hf"
    if not uri.exists():
        def batches():
            for lo in range(0, rows, 250_000):
                n = min(250_000, rows - lo)
                x = np.random.default_rng(lo).standard_normal((n, 64), dtype=np.float32)
                yield pa.record_batch({
                    "id": pa.array(np.arange(lo, lo + n)),
                    "label": pa.array(np.arange(lo, lo + n) % 10),
                    "x": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), 64)})
        schema = next(batches()).schema
        lance.write_dataset(pa.RecordBatchReader.from_batches(schema, batches()), uri,
                            max_rows_per_file=-(-rows // 8))
    if not hf.exists():
        import datasets

        table = lance.dataset(uri).to_table(columns=COLUMNS)
        datasets.Dataset(datasets.table.InMemoryTable(table)).save_to_disk(str(hf))
    return str(uri), str(hf)


def run_case(name: str, uri: str, hf: str, seconds: float) -> dict[str, Any]:
    """One case in this (fresh) process: rows/s, seconds to the first batch."""
    import torch

    import lanceloader as ll

    t0 = time.perf_counter()
    if name == "raw Lance scan":
        import lance
        batches = (b for b in lance.dataset(uri).to_batches(batch_size=BATCH, columns=COLUMNS))
        count = lambda b: b.num_rows  # noqa: E731
    elif name.startswith("lanceloader") and "resume" not in name:
        kw: dict[str, Any] = {"num_workers": 2, "output": "torch", "columns": COLUMNS}
        if "block" in name:
            kw.update(shuffle=True, shuffle_block_size=1024)
        if "full" in name:
            kw.update(shuffle=True)
        if "processes" in name:
            kw.update(worker_type="process")
        batches = iter(ll.Loader(uri, batch_size=BATCH, **kw))
        count = lambda b: len(b["id"])  # noqa: E731
    elif name == "lanceloader resume at 90%":
        loader = ll.Loader(uri, batch_size=BATCH, shuffle=True, num_workers=2, output="torch",
                           columns=COLUMNS)
        state = dict(loader.state_dict(), sample=int(0.9 * loader.plan().num_samples))
        t0 = time.perf_counter()
        loader.load_state_dict(state)
        batches = iter(loader)
        count = lambda b: len(b["id"])  # noqa: E731
    elif name.startswith("LanceDataset"):
        from lance.torch.data import LanceDataset
        ds = LanceDataset(uri, batch_size=BATCH, columns=COLUMNS)
        batches = iter(ds) if "direct" in name else iter(
            torch.utils.data.DataLoader(ds, batch_size=None, num_workers=0))
        count = lambda b: len(b["id"])  # noqa: E731
    elif name.startswith("HF datasets"):
        import datasets
        ds = datasets.load_from_disk(hf).with_format("torch")
        workers = 2 if "2 workers" in name else 0
        batches = iter(torch.utils.data.DataLoader(ds, batch_size=BATCH, shuffle=True,
                                                   num_workers=workers))
        count = lambda b: len(b["id"])  # noqa: E731
    elif name.startswith("SafeLanceDataset"):
        from lance.torch.data import SafeLanceDataset, get_safe_loader
        ds = SafeLanceDataset(uri)
        loader = get_safe_loader(ds, batch_size=BATCH, num_workers=2, shuffle=True)
        batches = iter(loader)
        count = lambda b: len(b["id"])  # noqa: E731
    else:
        raise ValueError(name)
    rows, first, start = 0, None, time.perf_counter()
    for batch in batches:
        if first is None:
            first = time.perf_counter() - t0
            start = time.perf_counter()
        rows += count(batch)
        if time.perf_counter() - start > seconds:
            break
    elapsed = time.perf_counter() - start
    return {"rows_per_s": rows / elapsed if elapsed > 0 else 0.0, "first_batch_s": first,
            "rows": rows}


def measure(name: str, uri: str, hf: str, seconds: float) -> dict[str, Any]:
    """``run_case`` in a fresh process, with the peak RSS of its process tree."""
    import psutil

    cmd = [sys.executable, __file__, "--case", name, "--uri", uri, "--hf", hf,
           "--seconds", str(seconds)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = 0
    parent = psutil.Process(proc.pid)
    while proc.poll() is None:
        try:
            tree = [parent, *parent.children(recursive=True)]
            peak = max(peak, sum(p.memory_info().rss for p in tree if p.is_running()))
        except psutil.Error:
            pass
        time.sleep(0.02)
    out, err = proc.communicate()
    if proc.returncode != 0:
        return {"error": err.strip().splitlines()[-1] if err.strip() else f"exit {proc.returncode}"}
    result = json.loads(out.strip().splitlines()[-1])
    result["peak_rss_mb"] = peak / 2**20
    return result


def summarise(runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    for name, results in runs.items():
        ok = [r for r in results if "error" not in r]
        if not ok:
            rows[name] = {"error": results[0]["error"]}
            continue
        rows[name] = {key: statistics.median(r[key] for r in ok)
                      for key in ("rows_per_s", "first_batch_s", "peak_rss_mb")}
        rows[name]["runs"] = [round(r["rows_per_s"]) for r in ok]
    raw = rows["raw Lance scan"].get("rows_per_s") or 1.0
    for row in rows.values():
        if "rows_per_s" in row:
            row["vs_raw"] = row["rows_per_s"] / raw
    return rows


def render(result: dict[str, Any], page: Path, chart: Path) -> None:
    rows, machine = result["cases"], result["machine"]
    lines = [
        "# Performance: lanceloader and its peers",
        "",
        "Made by `make bench-peers` (`python benchmarks/peers.py`): one generated dataset of "
        f"{result['args']['rows']:,} rows of 268 B (`id`, `label`, 64 float32 `x`), the same "
        "columns, batch 256 and torch output for every case, each in a fresh process, epochs "
        f"capped at {result['args']['seconds']:g} s, medians of {result['args']['runs']} runs, "
        "ratios against raw Lance in the same run.",
        "",
        f"Machine: {machine['cpus']} cores, Python {machine['python']}, pylance "
        f"{machine['lance']}, torch {machine['torch']}, datasets {machine['datasets']}; load "
        f"average {machine['load_before'][0]:.1f} before, {machine['load_after'][0]:.1f} after.",
        "",
        "| case | order | rows/s | MB/s | vs raw Lance | first batch (s) | peak RSS (MB) |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for name, (mode, what) in CASES.items():
        row = rows.get(name, {})
        if "error" in row:
            lines.append(f"| {name} ({what}) | {mode} | failed: {row['error'][:80]} | | | | |")
            continue
        if name == "lanceloader resume at 90%":
            lines.append(f"| {name} ({what}) | {mode} | | | | {row['first_batch_s']:.3f} | "
                         f"{row['peak_rss_mb']:,.0f} |")
            continue
        lines.append(
            f"| {name} ({what}) | {mode} | {row['rows_per_s']:,.0f} | "
            f"{row['rows_per_s'] * ROW_BYTES / 1e6:,.0f} | {row['vs_raw']:.2f} | "
            f"{row['first_batch_s']:.3f} | {row['peak_rss_mb']:,.0f} |")
    for module, what in ABSENT.items():
        if module in result["absent"]:
            lines.append(f"| {what} | | not installed here | | | | |")
    lines += [
        "",
        "![rows/s per case](performance.png)",
        "",
        "Process workers (`worker_type=\"process\"`) are for pure-Python transforms; with no "
        "transform, as here, threads are faster: processes copy each batch through shared "
        "memory. The full-shuffle runs vary most on 2 shared cores (per-run rows/s are in "
        "`benchmarks/results/peers.json`).",
        "",
        "Resume: lanceloader's first batch after resuming at 90% of an epoch is the time above "
        "(it reads nothing it skips). `LanceDataset`, `SafeLanceDataset` and a plain "
        "`DataLoader` over Hugging Face `datasets` have no resume of their own (torchdata's "
        "`StatefulDataLoader` replays a sampler's state; see [PyTorch](pytorch.md)).",
        "",
        "Reproduce: `make bench-peers` (about 10 minutes), which rewrites this page.",
        "",
    ]
    page.write_text("\n".join(lines))
    from matplotlib.figure import Figure

    names = [n for n in CASES if "rows_per_s" in rows.get(n, {})]
    fig = Figure(figsize=(9, 0.45 * len(names) + 1), layout="constrained")
    ax = fig.subplots()
    colors = ["tab:blue" if n.startswith("lanceloader") else
              "tab:grey" if n.startswith("raw") else "tab:orange" for n in names]
    ax.barh(names[::-1], [rows[n]["rows_per_s"] for n in names][::-1], color=colors[::-1])
    ax.set_xscale("log")
    ax.set(xlabel="rows/s (log scale), batch 256, torch output",
           title="lanceloader (blue), raw Lance (grey), peers (orange)")
    fig.savefig(chart, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--data-dir", default=str(HERE / "data"))
    parser.add_argument("--out", default=str(HERE / "results" / "peers.json"))
    parser.add_argument("--page", default=str(ROOT / "docs" / "performance.md"))
    parser.add_argument("--render", metavar="JSON", help="only render the page from a results file")
    parser.add_argument("--case", help=argparse.SUPPRESS)
    parser.add_argument("--uri", help=argparse.SUPPRESS)
    parser.add_argument("--hf", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        print(json.dumps(run_case(args.case, args.uri, args.hf, args.seconds)))
        return
    if args.render:
        page = Path(args.page)
        render(json.loads(Path(args.render).read_text()), page, page.with_suffix(".png"))
        return
    root = Path(args.data_dir)
    root.mkdir(parents=True, exist_ok=True)
    uri, hf = write_data(root, args.rows)
    import datasets
    import lance
    import torch
    machine = {"cpus": os.cpu_count(), "python": platform.python_version(),
               "lance": lance.__version__, "torch": torch.__version__,
               "datasets": datasets.__version__, "load_before": os.getloadavg()}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in CASES}
    for run in range(args.runs):
        for name in CASES:
            result = measure(name, uri, hf, args.seconds)
            runs[name].append(result)
            print(f"run {run + 1}/{args.runs} {name}: {result}", file=sys.stderr, flush=True)
    machine["load_after"] = os.getloadavg()
    result = {"machine": machine, "args": vars(args), "cases": summarise(runs),
              "absent": [m for m in ABSENT if importlib.util.find_spec(m) is None]}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    page = Path(args.page)
    render(result, page, page.with_suffix(".png"))
    print(page.read_text())


if __name__ == "__main__":
    main()
