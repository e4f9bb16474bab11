"""lanceloader against raw Lance and its peers, on the same data, in one run: ``make bench-peers``.

Method
------
One generated dataset (``--rows`` rows of 268 B: ``id`` int64, ``label`` int64, ``x`` 64 float32,
in 8 fragments), the same three columns, batch 256 and torch output for every case. Each case runs
in a fresh Python process (``--runs`` times, cases interleaved run by run so drift hits all alike)
and reads one epoch capped at ``--seconds``; it reports rows/s over what it read, MB/s (268 B a
row), the time from construction to the first batch (imports excluded), and the peak RSS of its
process tree (sampled every 20 ms, workers included). Medians are quoted, ratios are against raw
Lance in the same run. ``resume`` cases time the first batch after resuming at 90% of an epoch:
from ``load_state_dict`` (or lancedb's ``with_skip``) on a freshly made loader to its first batch.

Peers: ``lance.torch.data.LanceDataset`` (direct, and in a DataLoader with 0 workers),
``SafeLanceDataset`` with ``get_safe_loader`` (2 spawn workers, shuffled), Hugging Face
``datasets`` (``with_format("torch")``, shuffled, 0 and 2 workers; resumed through torchdata's
``StatefulDataLoader``), and from the ``bench`` extra (``pip install '.[bench]'``) lancedb's
``Permutation`` and ``StreamingDataset``, which open the same Lance files as a table. litdata and
MosaicML Streaming read their own formats: the same rows are converted once (``optimize()``, 64 MB
chunks; ``MDSWriter``, 64 MB shards; the time is stated on the page, not counted). Both are left
out of the ``bench`` extra (``LEFT_OUT`` says why) and measured only where they import. A peer that
does not import is skipped, with the reason on the page. The results go to
``benchmarks/results/peers.json`` and render ``docs/performance.md`` and
``docs/performance.png``.

Usage::

    python benchmarks/peers.py                       # 2M rows, 3 runs, 10 s epochs
    python benchmarks/peers.py --rows 200000 --runs 1 --seconds 3   # smoke run
    python benchmarks/peers.py --rows 20000 --runs 1 --seconds 1 --cases lancedb,resume \
        --data-dir /tmp/peers --out /tmp/peers/peers.json --page /tmp/peers/performance.md
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib.metadata
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

# name -> (mode, what, the module it needs beyond dev); the case code is in run_case().
CASES: dict[str, tuple[str, str, str | None]] = {
    "raw Lance scan": ("sequential", "lance to_batches(256), Arrow (the ceiling)", None),
    "lanceloader sequential, threads": ("sequential", "Loader(num_workers=2)", None),
    "lanceloader sequential, processes": ("sequential", "worker_type='process', 2 workers", None),
    "LanceDataset direct": ("sequential", "lance.torch.data.LanceDataset, iterated", None),
    "LanceDataset + DataLoader(0)": ("sequential", "in a DataLoader, batch_size=None", None),
    "lanceloader block shuffle, threads": ("block shuffle", "1,024-row blocks x 8", None),
    "lanceloader block shuffle, processes": ("block shuffle", "the same, 2 process workers", None),
    "lanceloader full shuffle, threads": ("full shuffle", "Loader(shuffle=True)", None),
    "lanceloader full shuffle, processes": ("full shuffle", "2 process workers", None),
    "HF datasets, 0 workers": ("full shuffle", "with_format('torch'), DataLoader(shuffle)", None),
    "HF datasets, 2 workers": ("full shuffle", "the same, 2 fork workers", None),
    "SafeLanceDataset, 2 spawn workers": ("full shuffle", "get_safe_loader(shuffle=True)", None),
    "lancedb Permutation + DataLoader(0)": (
        "full shuffle",
        "permutation_builder().shuffle(), map-style, batch_size=256",
        "lancedb",
    ),
    "lancedb Permutation + DataLoader(2)": ("full shuffle", "the same, 2 spawn workers", "lancedb"),
    "lancedb StreamingDataset, 0 workers": (
        "full shuffle",
        "StreamingDataLoader, rows collated to 256",
        "lancedb",
    ),
    "lancedb StreamingDataset, 2 workers": (
        "full shuffle",
        "the same, 2 splits, 2 spawn workers",
        "lancedb",
    ),
    "litdata, 0 workers": (
        "chunk shuffle",
        "optimize()d 64 MB chunks, StreamingDataLoader",
        "litdata",
    ),
    "litdata, 2 workers": ("chunk shuffle", "the same, 2 fork workers", "litdata"),
    "MosaicML Streaming, 0 workers": (
        "py1e shuffle",
        "MDS 64 MB shards, StreamingDataLoader",
        "streaming",
    ),
    "MosaicML Streaming, 2 workers": ("py1e shuffle", "the same, 2 fork workers", "streaming"),
    "lanceloader resume at 90%": ("resume", "load_state_dict, then the first batch", None),
    "HF datasets resume at 90%": (
        "resume",
        "torchdata StatefulDataLoader.load_state_dict, 0 workers",
        "torchdata",
    ),
    "lancedb Permutation resume at 90%": (
        "resume",
        "with_skip(offset kept by the caller), DataLoader(0)",
        "lancedb",
    ),
    "lancedb StreamingDataset resume at 90%": (
        "resume",
        "StreamingDataset.load_state_dict, 0 workers",
        "lancedb",
    ),
    "litdata resume at 90%": (
        "resume",
        "StreamingDataLoader.load_state_dict, 0 workers",
        "litdata",
    ),
    "MosaicML Streaming resume at 90%": (
        "resume",
        "StreamingDataLoader.load_state_dict, 0 workers",
        "streaming",
    ),
}
# module -> (the peer, what a case of it imports, the distribution)
PEERS = {
    "lancedb": (
        "lancedb Permutation / StreamingDataset",
        "import lancedb.permutation, lancedb.streaming",
        "lancedb",
    ),
    "torchdata": (
        "torchdata StatefulDataLoader",
        "import torchdata.stateful_dataloader",
        "torchdata",
    ),
    "litdata": ("litdata", "import litdata", "litdata"),
    "streaming": ("MosaicML Streaming", "import streaming", "mosaicml-streaming"),
}
# Peers the bench extra leaves out, and why (pyproject.toml, constraints.txt).
LEFT_OUT = {
    "litdata": "litdata 0.2.76 requires torchvision, and PyPI's torchvision 0.28.0 (the release "
    "for torch 2.13.0) is a CUDA build that fails to import beside the CPU torch "
    "(`operator torchvision::nms does not exist`); installed, it also breaks "
    "`import lightning.pytorch` and `import torchmetrics` in the dev environment",
    "streaming": "mosaicml-streaming 0.13.0 requires numpy<2.2 and transformers<5 (so "
    "huggingface-hub<1): installing it downgrades the dev environment (numpy "
    "2.4.6 to 2.1.3, datasets 5.2.0 to 5.0.1, huggingface-hub 2.4.0 to 0.36.2), "
    "and `import streaming` imports torchvision (the same CUDA build)",
}
# the data each peer reads in its own format (converted once from the Lance dataset)
FORMATS = {"litdata": ".litdata", "streaming": ".mds"}


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
                yield pa.record_batch(
                    {
                        "id": pa.array(np.arange(lo, lo + n)),
                        "label": pa.array(np.arange(lo, lo + n) % 10),
                        "x": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), 64),
                    }
                )

        schema = next(batches()).schema
        lance.write_dataset(
            pa.RecordBatchReader.from_batches(schema, batches()),
            uri,
            max_rows_per_file=-(-rows // 8),
        )
    if not hf.exists():
        import datasets

        table = lance.dataset(uri).to_table(columns=COLUMNS)
        datasets.Dataset(datasets.table.InMemoryTable(table)).save_to_disk(str(hf))
    return str(uri), str(hf)


def peer_data(uri: str, module: str) -> Path:
    """Where the rows lie in ``module``'s own format, beside the Lance dataset."""
    return Path(uri).with_suffix(FORMATS[module])


def _litdata_rows(task: tuple[str, int, int]):
    """litdata ``optimize()``'s function: the rows ``lo:hi`` of the Lance dataset, one by one."""
    import lance

    uri, lo, hi = task
    for b in lance.dataset(uri).to_batches(
        columns=COLUMNS, offset=lo, limit=hi - lo, batch_size=8192
    ):
        ids, labels = b.column("id").to_numpy(), b.column("label").to_numpy()
        x = b.column("x").flatten().to_numpy().reshape(-1, 64)
        for i in range(b.num_rows):
            yield {"id": int(ids[i]), "label": int(labels[i]), "x": x[i]}


def convert(module: str, uri: str, rows: int) -> float:
    """Write the rows in ``module``'s format once (in this fresh process); the seconds it took.

    The data goes to a temporary folder renamed at the end, so an interrupted conversion is
    redone, and the seconds to a ``.json`` beside it, so a later run can quote them.
    """
    import shutil

    out = peer_data(uri, module)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    t0 = time.perf_counter()
    if module == "litdata":
        from litdata import StreamingDataset, optimize

        step = -(-rows // 16)
        tasks = [(uri, lo, min(lo + step, rows)) for lo in range(0, rows, step)]
        optimize(
            fn=_litdata_rows,
            inputs=tasks,
            output_dir=str(tmp),
            chunk_bytes="64MB",
            num_workers=2,
            verbose=False,
        )
        written = len(StreamingDataset(str(tmp)))
    elif module == "streaming":
        import lance
        from streaming import MDSWriter

        written = 0
        columns = {"id": "int64", "label": "int64", "x": "ndarray:float32:64"}
        with MDSWriter(out=str(tmp), columns=columns, size_limit="64mb") as writer:
            for b in lance.dataset(uri).to_batches(columns=COLUMNS, batch_size=8192):
                ids, labels = b.column("id").to_numpy(), b.column("label").to_numpy()
                x = b.column("x").flatten().to_numpy().reshape(-1, 64)
                for i in range(b.num_rows):
                    writer.write({"id": ids[i], "label": labels[i], "x": x[i]})
                written += b.num_rows
    else:
        raise ValueError(module)
    seconds = time.perf_counter() - t0
    if written != rows:
        raise RuntimeError(f"{module}: wrote {written:,} rows of {rows:,}")
    tmp.rename(out)
    out.with_name(out.name + ".json").write_text(json.dumps({"seconds": seconds}))
    return seconds


def ensure_converted(module: str, uri: str, rows: int) -> dict[str, Any]:
    """``convert`` in a fresh process unless done before: ``{"seconds": ...}`` or ``{"error"}``."""
    done = peer_data(uri, module).with_name(peer_data(uri, module).name + ".json")
    if peer_data(uri, module).exists() and done.exists():
        return json.loads(done.read_text())
    cmd = [sys.executable, __file__, "--convert", module, "--uri", uri, "--rows", str(rows)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        return {"error": last_line(proc.stderr) or f"exit {proc.returncode}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def import_error(module: str) -> str | None:
    """Why ``module``'s cases cannot run here (a fresh process tries the import), or None."""
    proc = subprocess.run([sys.executable, "-c", PEERS[module][1]], capture_output=True, text=True)
    return None if proc.returncode == 0 else last_line(proc.stderr) or f"exit {proc.returncode}"


def last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1] if lines else ""


def resume_at(rows: int) -> int:
    """The sample a resume case resumes at: 90% of an epoch, rounded down to whole batches."""
    return int(0.9 * rows) // BATCH * BATCH


def _as_is(batch: Any) -> Any:
    """collate_fn for a dataset whose ``__getitems__`` already returns the batch."""
    return batch


def _arrow_to_torch(batch: Any) -> dict[str, Any]:
    """A pyarrow RecordBatch of COLUMNS as a dict of tensors (what the other cases yield)."""
    import torch

    def column(name: str) -> Any:
        return batch.column(name).to_numpy(zero_copy_only=False, writable=True)

    x = batch.column("x").flatten().to_numpy(zero_copy_only=False, writable=True)
    return {
        "id": torch.from_numpy(column("id")),
        "label": torch.from_numpy(column("label")),
        "x": torch.from_numpy(x.reshape(-1, 64)),
    }


def _arrow_to_torch_rows(batch: Any) -> list[dict[str, Any]]:
    """lancedb StreamingDataset's transform: one dict of tensors per row (DataLoader collates)."""
    columns = _arrow_to_torch(batch)
    return [{name: tensor[i] for name, tensor in columns.items()} for i in range(batch.num_rows)]


def _lancedb_table(uri: str) -> Any:
    """The generated Lance dataset opened as a lancedb table (no copy: a table is a dataset)."""
    import lancedb

    path = Path(uri)
    return lancedb.connect(str(path.parent)).open_table(path.stem)


# the modules a case imports before its clock starts (name prefix -> modules)
IMPORTS = {
    "raw": ["lance"],
    "LanceDataset": ["lance.torch.data"],
    "SafeLanceDataset": ["lance.torch.data"],
    "lanceloader": ["lanceloader"],
    "HF datasets": ["datasets", "torchdata.stateful_dataloader"],
    "lancedb": ["lancedb.permutation", "lancedb.streaming"],
    "litdata": ["litdata"],
    "MosaicML": ["streaming", "streaming.base.util"],
}


def run_case(name: str, uri: str, hf: str, seconds: float) -> dict[str, Any]:
    """One case in this (fresh) process: rows/s, seconds to the first batch."""
    import importlib

    import torch

    for prefix, modules in IMPORTS.items():
        if name.startswith(prefix):
            for module in modules:
                if module != "torchdata.stateful_dataloader" or "resume" in name:
                    importlib.import_module(module)
    workers = 2 if "2 workers" in name or "(2)" in name or "2 spawn" in name else 0
    count = lambda b: len(b["id"])  # noqa: E731
    t0 = time.perf_counter()
    if name == "raw Lance scan":
        import lance

        batches = (b for b in lance.dataset(uri).to_batches(batch_size=BATCH, columns=COLUMNS))
        count = lambda b: b.num_rows  # noqa: E731
    elif name.startswith("lanceloader") and "resume" not in name:
        import lanceloader as ll

        kw: dict[str, Any] = {"num_workers": 2, "output": "torch", "columns": COLUMNS}
        if "block" in name:
            kw.update(shuffle=True, shuffle_block_size=1024)
        if "full" in name:
            kw.update(shuffle=True)
        if "processes" in name:
            kw.update(worker_type="process")
        batches = iter(ll.Loader(uri, batch_size=BATCH, **kw))
    elif name == "lanceloader resume at 90%":
        import lanceloader as ll

        loader = ll.Loader(
            uri, batch_size=BATCH, shuffle=True, num_workers=2, output="torch", columns=COLUMNS
        )
        state = dict(loader.state_dict(), sample=int(0.9 * loader.plan().num_samples))
        t0 = time.perf_counter()
        loader.load_state_dict(state)
        batches = iter(loader)
    elif name.startswith("LanceDataset"):
        from lance.torch.data import LanceDataset

        ds = LanceDataset(uri, batch_size=BATCH, columns=COLUMNS)
        batches = (
            iter(ds)
            if "direct" in name
            else iter(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=0))
        )
    elif name == "HF datasets resume at 90%":
        # torchdata's StatefulDataLoader: its own state after one batch, with the counts of the
        # 90% position (the state it holds there), loaded into a fresh loader.
        import datasets
        from torchdata.stateful_dataloader import StatefulDataLoader

        ds = datasets.load_from_disk(hf).with_format("torch")

        def stateful() -> Any:
            return StatefulDataLoader(
                ds, batch_size=BATCH, shuffle=True, generator=torch.Generator().manual_seed(0)
            )

        loader = stateful()
        it = iter(loader)
        next(it)
        state = copy.deepcopy(loader.state_dict())
        del it
        sample = resume_at(len(ds))
        state["_sampler_iter_state"]["samples_yielded"] = sample
        state["_sampler_iter_state"]["sampler_iter_state"]["yielded"] = sample
        state["_sampler_iter_yielded"] = state["_num_yielded"] = sample // BATCH
        loader = stateful()
        t0 = time.perf_counter()
        loader.load_state_dict(state)
        batches = iter(loader)
    elif name.startswith("HF datasets"):
        import datasets

        ds = datasets.load_from_disk(hf).with_format("torch")
        batches = iter(
            torch.utils.data.DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=workers)
        )
    elif name.startswith("SafeLanceDataset"):
        from lance.torch.data import SafeLanceDataset, get_safe_loader

        ds = SafeLanceDataset(uri)
        loader = get_safe_loader(ds, batch_size=BATCH, num_workers=2, shuffle=True)
        batches = iter(loader)
    elif name.startswith("lancedb Permutation"):
        # The shuffle is the permutation's (one row at a time); the DataLoader reads it in order
        # through __getitems__. Forked workers segfault once lancedb ran here: spawn.
        from lancedb.permutation import Permutation, permutation_builder

        table = _lancedb_table(uri)
        order = permutation_builder(table).shuffle(seed=0).execute()
        perm = Permutation.from_tables(table, order).select_columns(COLUMNS)
        perm = perm.with_transform(_arrow_to_torch)
        if "resume" in name:
            # no state of its own: the caller keeps the offset and skips to it
            sample = resume_at(len(perm))
            t0 = time.perf_counter()
            perm = perm.with_skip(sample)
        batches = iter(
            torch.utils.data.DataLoader(
                perm,
                batch_size=BATCH,
                shuffle=False,
                collate_fn=_as_is,
                num_workers=workers,
                multiprocessing_context="spawn" if workers else None,
            )
        )
    elif name.startswith("lancedb StreamingDataset"):
        from lancedb.streaming import StreamingDataLoader, StreamingDataset

        table = _lancedb_table(uri)
        ds = StreamingDataset(
            table,
            columns=COLUMNS,
            transform=_arrow_to_torch_rows,
            shuffle_seed=0,
            num_splits=max(workers, 1),
        )
        if "resume" in name:
            state = ds.state_dict()
            sample = resume_at(table.count_rows())
            state.update(samples_consumed_per_split=[sample], positions_consumed_per_split=[sample])
            t0 = time.perf_counter()
            ds.load_state_dict(state)
        batches = iter(
            StreamingDataLoader(
                ds,
                batch_size=BATCH,
                num_workers=workers,
                multiprocessing_context="spawn" if workers else None,
            )
        )
    elif name.startswith("litdata"):
        from litdata import StreamingDataLoader, StreamingDataset

        data = str(peer_data(uri, "litdata"))
        loader = StreamingDataLoader(
            StreamingDataset(data, shuffle=True, seed=0), batch_size=BATCH, num_workers=workers
        )
        if "resume" in name:
            it = iter(loader)
            next(it)
            state = copy.deepcopy(loader.state_dict())
            del it
            sample = resume_at(len(loader.dataset))
            state["num_samples_yielded"] = sample
            state["dataset"].update(num_samples_yielded=sample, sample_in_epoch=sample)
            loader = StreamingDataLoader(
                StreamingDataset(data, shuffle=True, seed=0), batch_size=BATCH, num_workers=workers
            )
            t0 = time.perf_counter()
            loader.load_state_dict(state)
        batches = iter(loader)
    elif name.startswith("MosaicML"):
        from streaming import StreamingDataLoader, StreamingDataset
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()
        data = str(peer_data(uri, "streaming"))

        def mosaic() -> Any:
            ds = StreamingDataset(local=data, shuffle=True, shuffle_seed=0, batch_size=BATCH)
            return StreamingDataLoader(ds, batch_size=BATCH, num_workers=workers)

        loader = mosaic()
        if "resume" in name:
            first_loader, it = loader, iter(loader)
            next(it)
            state = dict(
                first_loader.state_dict(),
                sample_in_epoch=resume_at(first_loader.dataset.num_samples),
            )
            del it
            loader = mosaic()
            t0 = time.perf_counter()
            loader.load_state_dict(state)
        batches = iter(loader)
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
    return {
        "rows_per_s": rows / elapsed if elapsed > 0 else 0.0,
        "first_batch_s": first,
        "rows": rows,
    }


def measure(name: str, uri: str, hf: str, seconds: float) -> dict[str, Any]:
    """``run_case`` in a fresh process, with the peak RSS of its process tree."""
    import psutil

    cmd = [
        sys.executable,
        __file__,
        "--case",
        name,
        "--uri",
        uri,
        "--hf",
        hf,
        "--seconds",
        str(seconds),
    ]
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
        return {"error": last_line(err) or f"exit {proc.returncode}"}
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
        rows[name] = {
            key: statistics.median(r[key] for r in ok)
            for key in ("rows_per_s", "first_batch_s", "peak_rss_mb")
        }
        rows[name]["runs"] = [round(r["rows_per_s"]) for r in ok]
    raw = rows.get("raw Lance scan", {}).get("rows_per_s") or 1.0
    for row in rows.values():
        if "rows_per_s" in row:
            row["vs_raw"] = row["rows_per_s"] / raw
    return rows


def skip_reason(module: str, error: str) -> str:
    """The page's line for a peer whose cases did not run."""
    if module in LEFT_OUT:
        return f"not measured: left out of `.[bench]` (below); here: {error[:80]}"
    if error.startswith("ModuleNotFoundError"):
        return "not installed: pip install '.[bench]'"
    return f"not measured: {error[:100]}"


# The page's sections made by other benchmarks follow this line; render keeps them.
KEPT = "<!-- sections below come from other benchmarks; make bench-peers keeps them -->"


def render(result: dict[str, Any], page: Path, chart: Path) -> None:
    rows, machine = result["cases"], result["machine"]
    skipped: dict[str, str] = result.get("skipped", {})
    conversions: dict[str, dict[str, Any]] = result.get("conversions", {})
    versions = ", ".join(f"{dist} {version}" for dist, version in machine.get("peers", {}).items())
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
        f"{machine['lance']}, torch {machine['torch']}, datasets {machine['datasets']}"
        + (f", {versions}" if versions else "")
        + "; load average "
        f"{machine['load_before'][0]:.1f} before, {machine['load_after'][0]:.1f} after.",
        "",
        "| case | order | rows/s | MB/s | vs raw Lance | first batch (s) | peak RSS (MB) |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for name, (mode, what, module) in CASES.items():
        if module in skipped or name not in rows:
            continue
        row = rows[name]
        if "error" in row:
            lines.append(f"| {name} ({what}) | {mode} | failed: {row['error'][:80]} | | | | |")
            continue
        if mode == "resume":
            lines.append(
                f"| {name} ({what}) | {mode} | | | | {row['first_batch_s']:.3f} | "
                f"{row['peak_rss_mb']:,.0f} |"
            )
            continue
        lines.append(
            f"| {name} ({what}) | {mode} | {row['rows_per_s']:,.0f} | "
            f"{row['rows_per_s'] * ROW_BYTES / 1e6:,.0f} | {row['vs_raw']:.2f} | "
            f"{row['first_batch_s']:.3f} | {row['peak_rss_mb']:,.0f} |"
        )
    for module, error in skipped.items():
        lines.append(f"| {PEERS[module][0]} | | {skip_reason(module, error)} | | | | |")
    converted = [
        f"{'litdata' if module == 'litdata' else 'MosaicML (MDS)'} in {done['seconds']:.0f} s"
        for module, done in conversions.items()
        if "seconds" in done
    ]
    lines += [
        "",
        "![rows/s per case](performance.png)",
        "",
        'Process workers (`worker_type="process"`) are for pure-Python transforms; with no '
        "transform, as here, threads are faster: processes copy each batch through shared "
        "memory. The full-shuffle runs vary most on 2 shared cores (per-run rows/s are in "
        "`benchmarks/results/peers.json`).",
        "",
        "Peers' data: lancedb opens the same Lance files as a table (no copy); its "
        "`Permutation` shuffles single rows (`permutation_builder(table).shuffle()`) and is "
        "read in that order by a `DataLoader` through `__getitems__`, its `StreamingDataset` "
        "yields single rows, which the `DataLoader` collates to 256 (lancedb's own `torch` "
        "format cannot convert the fixed-size-list `x`: the cases convert each Arrow batch to "
        "tensors). Their 2-worker cases use spawn: a forked worker segfaults once lancedb ran in "
        "the parent. litdata and MosaicML Streaming read their own formats, converted once "
        "from the same rows (`optimize()` with 64 MB chunks; `MDSWriter` with 64 MB shards"
        + (f"; here {', '.join(converted)}" if converted else "")
        + "; not counted). Their "
        "shuffles are not row-level: litdata shuffles chunks and rows within a chunk, "
        "MosaicML's `py1e` shuffles shards and spreads their samples over blocks of 4M samples.",
        "",
        "Resume: each resume case times a freshly made loader from loading its state at 90% of "
        "an epoch to its first batch. lanceloader's `load_state_dict` reads nothing it skips, "
        "and its shuffles' first read fills no piece of the automatic cache (reads fill one a "
        "1,024 rows they read), so the first batch does not wait for the cache. "
        "Hugging Face `datasets` resumes through torchdata's `StatefulDataLoader` (0 workers), "
        "which fast-forwards its sampler; lancedb's `StreamingDataset` through "
        "`StreamingDataLoader` and `load_state_dict`; litdata and MosaicML through their "
        "`StreamingDataLoader.load_state_dict` (0 workers). Each state is the loader's own "
        "`state_dict()` after one batch with its counts set to the 90% position, the state it "
        "holds there. lancedb's `Permutation` has no state: the caller keeps the offset and "
        "skips to it (`with_skip`). `LanceDataset` and `SafeLanceDataset` have no resume of "
        "their own (see [PyTorch](pytorch.md)).",
        "",
    ]
    left_out = [m for m in LEFT_OUT if m in skipped]
    if left_out:
        lines += [
            "Left out of the `bench` extra (`pip install '.[bench]'`), so not measured "
            "here: "
            + "; ".join(f"{PEERS[m][0]}: {LEFT_OUT[m]}" for m in left_out)
            + ". `benchmarks/peers.py` measures them where they import.",
            "",
        ]
    lines += [
        "Reproduce: `make bench-peers` (about 15 minutes), which installs `.[dev,torch,bench]` "
        "and rewrites this page.",
        "",
    ]
    # Sections measured by other benchmarks (below KEPT in the page) survive the rewrite.
    kept = page.read_text().partition(KEPT)[2] if page.exists() else ""
    page.write_text("\n".join(lines) + (f"\n{KEPT}{kept}" if kept else ""))
    from matplotlib.figure import Figure

    names = [
        n
        for n, (mode, _, _) in CASES.items()
        if mode != "resume" and "rows_per_s" in rows.get(n, {})
    ]
    if not names:
        return
    fig = Figure(figsize=(9, 0.45 * len(names) + 1), layout="constrained")
    ax = fig.subplots()
    colors = [
        "tab:blue"
        if n.startswith("lanceloader")
        else "tab:grey"
        if n.startswith("raw")
        else "tab:orange"
        for n in names
    ]
    ax.barh(names[::-1], [rows[n]["rows_per_s"] for n in names][::-1], color=colors[::-1])
    ax.set_xscale("log")
    ax.set(
        xlabel="rows/s (log scale), batch 256, torch output",
        title="lanceloader (blue), raw Lance (grey), peers (orange)",
    )
    fig.savefig(chart, dpi=100)


def peer_versions() -> dict[str, str]:
    """The installed versions of the peers' distributions (those that are installed)."""
    versions = {}
    for _, _, dist in PEERS.values():
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[dist] = importlib.metadata.version(dist)
    return versions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument(
        "--cases",
        help="only the cases whose name holds one of these "
        "comma-separated words (case-insensitive), e.g. 'lancedb,resume'",
    )
    parser.add_argument("--data-dir", default=str(HERE / "data"))
    parser.add_argument("--out", default=str(HERE / "results" / "peers.json"))
    parser.add_argument("--page", default=str(ROOT / "docs" / "performance.md"))
    parser.add_argument("--render", metavar="JSON", help="only render the page from a results file")
    parser.add_argument("--case", help=argparse.SUPPRESS)
    parser.add_argument("--convert", help=argparse.SUPPRESS)
    parser.add_argument("--uri", help=argparse.SUPPRESS)
    parser.add_argument("--hf", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        print(json.dumps(run_case(args.case, args.uri, args.hf, args.seconds)))
        return
    if args.convert:
        print(json.dumps({"seconds": convert(args.convert, args.uri, args.rows)}))
        return
    if args.render:
        page = Path(args.page)
        render(json.loads(Path(args.render).read_text()), page, page.with_suffix(".png"))
        return
    words = [w.strip().lower() for w in (args.cases or "").split(",") if w.strip()]
    names = [n for n in CASES if not words or any(w in n.lower() for w in words)]
    if not names:
        parser.error(f"--cases {args.cases!r} matches none of: {', '.join(CASES)}")
    modules = sorted({CASES[n][2] for n in names} - {None})
    skipped = {m: e for m in modules if (e := import_error(m)) is not None}
    for module, error in skipped.items():
        print(f"skipping {PEERS[module][0]}: {error}", file=sys.stderr, flush=True)
    root = Path(args.data_dir)
    root.mkdir(parents=True, exist_ok=True)
    uri, hf = write_data(root, args.rows)
    conversions = {}
    for module in FORMATS:
        if module in modules and module not in skipped:
            conversions[module] = ensure_converted(module, uri, args.rows)
            print(f"{module} data: {conversions[module]}", file=sys.stderr, flush=True)
            if "error" in conversions[module]:
                skipped[module] = f"conversion failed: {conversions[module]['error']}"
    names = [n for n in names if CASES[n][2] not in skipped]
    import datasets
    import lance
    import torch

    machine = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "lance": lance.__version__,
        "torch": torch.__version__,
        "datasets": datasets.__version__,
        "peers": peer_versions(),
        "load_before": os.getloadavg(),
    }
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for run in range(args.runs):
        for name in names:
            result = measure(name, uri, hf, args.seconds)
            runs[name].append(result)
            print(f"run {run + 1}/{args.runs} {name}: {result}", file=sys.stderr, flush=True)
    machine["load_after"] = os.getloadavg()
    result = {
        "machine": machine,
        "args": vars(args),
        "cases": summarise(runs),
        "skipped": skipped,
        "conversions": conversions,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    page = Path(args.page)
    render(result, page, page.with_suffix(".png"))
    print(page.read_text())


if __name__ == "__main__":
    main()
