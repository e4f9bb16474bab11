"""Feeding a step: a simulated accelerator fed by the Loader, and what each setting costs.

Method
------
* The accelerator takes a fixed time per batch (``--step-ms`` per workload): ``sleep`` waits
  it out (a GPU step: the host is idle), ``burn`` spins ``--burn-cores`` processes for it (a
  trainer's own threads busy on the host: its input pipeline competes for the cores).
* Workloads (written once under ``--data-dir``): ``images`` (JPEGs of 128x128, decoded and
  resized to 64x64 by ``decode_images`` in the workers, batches of 32, block shuffle),
  ``tokens`` (a mix of two token datasets, each packed into rows of 2,048, batches of 8) and
  ``clips`` (H.264 videos, clips of 8 frames at 64x64, batches of 4).
* Each setting of the grid (``num_workers`` x ``worker_type`` x reads x ``cache``; reads: the
  defaults, or ``rows_per_read`` of one batch with ``prefetch=2``) runs ``--warmup`` steps (not
  counted: the pool's start), then ``--steps`` steps: wait for the next batch, then the step.
  The settings alternate within each of ``--repeats`` rounds.
* Reported per setting: accelerator utilisation (busy / wall, MLPerf Storage's AU: busy is the
  steps' time), exposed wait per step (wall - busy), step slowdown (wall per step / the step's
  time), and the loader's CPU seconds per step (this process and its worker processes, from
  ``psutil``, the accelerator's own processes left out; a ``sleep`` step costs nothing; without
  ``psutil``, ``resource``: this process and its ended children). The cheapest setting that
  reaches ``--target`` utilisation (0.9) is the one with the least loader CPU per step: the
  reference for a future self-tuner. Medians of ``--repeats`` runs; printed as a markdown
  table of every setting, then a summary per workload and step.
* ``--quick``: tiny data, a few steps, one setting (a check that it runs, not a measurement).

Usage::

    python benchmarks/step.py                       # the grid, every workload, both steps
    python benchmarks/step.py --quick --json out.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import os
import resource
import shutil
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lance
import numpy as np
import pyarrow as pa

import lanceloader as ll

try:
    import psutil
except ImportError:  # then this process and its ended children only (resource)
    psutil = None

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

STEP_MS = {"images": 15.0, "tokens": 4.0, "clips": 60.0}
GRID = {
    "num_workers": [1, 2, 4],
    "worker_type": ["thread", "process"],
    "reads": [
        {"prefetch": None, "rows_per_read": None},  # the defaults: reads of many batches
        {"prefetch": 2, "rows_per_read": "batch"},  # one batch per read, 2 read ahead
    ],
    "cache": [None, "auto"],
}
QUICK_GRID = {k: v[:1] for k, v in GRID.items()}
FIELDS = ("utilisation", "wait_ms_per_step", "slowdown", "loader_cpu_s_per_step")


# --- data ---------------------------------------------------------------------------------


def image_dataset(root: Path, count: int) -> str:
    """``count`` JPEGs of 128x128 with a label (written once)."""
    from transforms import make_jpegs

    uri = root / f"images-{count}.lance"
    if not (uri / "_versions").exists():
        table = pa.table(
            {"image": pa.array(make_jpegs(count), pa.binary()), "label": np.arange(count) % 10}
        )
        lance.write_dataset(table, uri, mode="overwrite", max_rows_per_file=max(count // 4, 1))
    return str(uri)


def token_datasets(root: Path, docs: int) -> list[str]:
    """Two token datasets of ``docs`` documents (1-2,000 tokens each)."""
    from pretraining import token_dataset

    return [token_dataset(root, docs, seed=20 + k)[0] for k in range(2)]


def video_dataset(root: Path, videos: int, frames: int) -> str:
    """``videos`` copies of one H.264 video of ``frames`` frames at 96x128, a keyframe every 24,
    with the keyframe index (what ``convert`` writes)."""
    from multimodal import video_dataset_table

    from mediagen import write_video

    uri = root / f"clips-{videos}x{frames}.lance"
    if not (uri / "_versions").exists():
        folder = root / f"videos-{videos}x{frames}"
        folder.mkdir(parents=True, exist_ok=True)
        first = write_video(folder / "v0.mp4", frames, 24, (96, 128), gop=24)
        paths = [first] + [Path(shutil.copy(first, folder / f"v{i}.mp4")) for i in range(1, videos)]
        lance.write_dataset(video_dataset_table(paths), uri, mode="overwrite")
    return str(uri)


def workloads(root: Path, quick: bool) -> dict[str, Any]:
    """Each workload's ``make(setting) -> Loader``."""
    root.mkdir(parents=True, exist_ok=True)
    images = image_dataset(root, 96 if quick else 4000)
    tokens = token_datasets(root, 60 if quick else 4000)
    clips = video_dataset(root, 2 if quick else 6, 48 if quick else 480)

    def engine(s: dict[str, Any], batch_size: int) -> dict[str, Any]:
        """The engine's settings (``rows_per_read="batch"``: one batch per read)."""
        per_read = batch_size if s["rows_per_read"] == "batch" else s["rows_per_read"]
        return {
            "num_workers": s["num_workers"],
            "worker_type": s["worker_type"],
            "prefetch": s["prefetch"],
            "rows_per_read": per_read,
        }

    def image_loader(s: dict[str, Any]) -> ll.Loader:
        return ll.Loader(
            images,
            batch_size=32,
            shuffle=True,
            shuffle_block_size=64,
            transform=ll.decode_images("image", size=64),
            cache=s["cache"],
            **engine(s, 32),
        )

    def token_loader(s: dict[str, Any]) -> ll.Loader:
        packed = {
            f"s{k}": ll.Loader(
                uri,
                columns=["input_ids"],
                pack=ll.pack("input_ids", 2048),
                shuffle=True,
                shuffle_block_size=64,
                cache=s["cache"],
            )
            for k, uri in enumerate(tokens)
        }
        return ll.Loader(ll.Mix(packed, samples_per_epoch="all_exhausted"), 8, **engine(s, 8))

    def clip_loader(s: dict[str, Any]) -> ll.Loader:
        return ll.Loader(
            clips,
            batch_size=4,
            clips=ll.video_clips("video", frames=8, size=(64, 64)),
            shuffle=True,
            cache=s["cache"],
            **engine(s, 4),
        )

    return {"images": image_loader, "tokens": token_loader, "clips": clip_loader}


# --- the accelerator ----------------------------------------------------------------------


def _burner(conn: Any) -> None:
    """A core of the trainer: spin for each duration received, then answer."""
    while (seconds := conn.recv()) is not None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass
        conn.send(True)


class Accelerator:
    """Takes ``step_s`` per batch: sleeping, or spinning ``cores`` processes (spawned: no
    Lance state in them) for the step's time. ``close()`` stops the processes."""

    def __init__(self, kind: str, cores: int) -> None:
        self.kind, self.pipes, self.procs = kind, [], []
        if kind == "burn":
            ctx = multiprocessing.get_context("spawn")
            for _ in range(cores):
                ours, theirs = ctx.Pipe()
                proc = ctx.Process(target=_burner, args=(theirs,), daemon=True)
                proc.start()
                self.pipes.append(ours)
                self.procs.append(proc)

    @property
    def pids(self) -> set[int]:
        return {p.pid for p in self.procs if p.pid is not None}

    def step(self, seconds: float) -> None:
        if self.kind == "sleep":
            time.sleep(seconds)
            return
        for pipe in self.pipes:
            pipe.send(seconds)
        for pipe in self.pipes:
            pipe.recv()

    def close(self) -> None:
        for pipe, proc in zip(self.pipes, self.procs, strict=True):
            pipe.send(None)
            proc.join(10)


# --- one run ------------------------------------------------------------------------------


class CpuMeter:
    """CPU seconds of this process and its descendants since it was made, leaving out
    ``exclude`` (the accelerator's processes); read before the loader closes (its worker
    processes are alive then)."""

    def __init__(self, exclude: set[int]) -> None:
        self.exclude = exclude
        self.start = self._times()

    def _times(self) -> dict[int, float]:
        if psutil is None:
            own = resource.getrusage(resource.RUSAGE_SELF)
            ended = resource.getrusage(resource.RUSAGE_CHILDREN)
            return {0: own.ru_utime + own.ru_stime + ended.ru_utime + ended.ru_stime}
        me = psutil.Process()
        out = {}
        for proc in [me, *me.children(recursive=True)]:
            if proc.pid in self.exclude:
                continue
            try:
                t = proc.cpu_times()
            except psutil.Error:  # ended meanwhile
                continue
            out[proc.pid] = t.user + t.system
        return out

    def seconds(self) -> float:
        end = self._times()
        return sum(t - self.start.get(pid, 0.0) for pid, t in end.items())


def forever(loader: ll.Loader) -> Iterator[Any]:
    """The loader's batches, epoch after epoch."""
    while True:
        yield from loader


def run_once(
    make: Any, setting: dict[str, Any], acc: Accelerator, step_s: float, args: Any
) -> dict[str, float]:
    """One setting fed to the accelerator: ``--warmup`` steps, then ``--steps`` measured."""
    loader = make(setting)
    try:
        batches = forever(loader)
        for _ in range(args.warmup):
            next(batches)
            acc.step(step_s)
        meter = CpuMeter(acc.pids)
        busy, t0 = 0.0, time.perf_counter()
        for _ in range(args.steps):
            next(batches)
            s0 = time.perf_counter()
            acc.step(step_s)
            busy += time.perf_counter() - s0
        wall = time.perf_counter() - t0
        cpu = meter.seconds()
    finally:
        loader.close()
    return {
        "utilisation": busy / wall,
        "wait_ms_per_step": (wall - busy) / args.steps * 1e3,
        "slowdown": wall / args.steps / step_s,
        "loader_cpu_s_per_step": max(cpu, 0.0) / args.steps,
    }


def settings(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Every setting of the grid, its read settings spread into it."""
    out = []
    for values in itertools.product(*grid.values()):
        setting = dict(zip(grid, values, strict=True))
        reads = setting.pop("reads")
        out.append({**setting, **reads})
    return out


def run_grid(args: Any) -> dict[str, Any]:
    """Every workload x accelerator x setting, and the cheapest setting reaching the target."""
    makers = workloads(args.data_dir, args.quick)
    grid = QUICK_GRID if args.quick else GRID
    report: dict[str, Any] = {"target": args.target, "steps": args.steps, "cases": []}
    for kind in args.accelerators.split(","):
        acc = Accelerator(kind, args.burn_cores)
        try:
            for name in args.workloads.split(","):
                step_s = (1.0 if args.quick else STEP_MS[name]) * args.step_scale / 1e3
                grid_settings = settings(grid)
                runs: list[list[dict[str, float]]] = [[] for _ in grid_settings]
                for _ in range(args.repeats):  # the settings alternate within each repeat
                    for i, setting in enumerate(grid_settings):
                        runs[i].append(run_once(makers[name], setting, acc, step_s, args))
                        got = runs[i][-1]["utilisation"]
                        print(f"  {kind} {name} {setting} {got:.2f}", file=sys.stderr)
                rows = [
                    {"setting": s, **{f: statistics.median(r[f] for r in rs) for f in FIELDS}}
                    for s, rs in zip(grid_settings, runs, strict=True)
                ]
                reached = [r for r in rows if r["utilisation"] >= args.target]
                cheapest = min(reached, key=lambda r: r["loader_cpu_s_per_step"], default=None)
                report["cases"].append(
                    {
                        "workload": name,
                        "accelerator": kind,
                        "step_ms": step_s * 1e3,
                        "rows": rows,
                        "cheapest": cheapest,
                    }
                )
        finally:
            acc.close()
    return report


def markdown(report: dict[str, Any]) -> str:
    """The report as a markdown table: every setting, the cheapest one reaching the target
    marked."""
    head = (
        "| workload | step | setting | utilisation | wait ms/step | slowdown | loader CPU s/step |"
    )
    lines = [head, "|" + "---|" * 7]
    for case in report["cases"]:
        for row in case["rows"]:
            s = row["setting"]
            setting = f"{s['num_workers']} {s['worker_type']}" + "".join(
                f", {k}={s[k]}" for k in ("prefetch", "rows_per_read", "cache") if s[k] is not None
            )
            mark = " **(cheapest)**" if row is case["cheapest"] else ""
            lines.append(
                f"| {case['workload']} | {case['accelerator']} {case['step_ms']:.0f} ms | {setting}{mark} "
                f"| {row['utilisation']:.2f} | {row['wait_ms_per_step']:.1f} | {row['slowdown']:.2f} "
                f"| {row['loader_cpu_s_per_step']:.4f} |"
            )
    return "\n".join(lines)


def describe(setting: dict[str, Any]) -> str:
    """A setting in a few words: ``2 process, one batch per read, cache auto``."""
    reads = ", one batch per read" if setting["rows_per_read"] == "batch" else ""
    cache = ", cache auto" if setting["cache"] == "auto" else ""
    return f"{setting['num_workers']} {setting['worker_type']}{reads}{cache}"


def summary(report: dict[str, Any]) -> str:
    """Per workload and step: the cheapest setting reaching the target, and the spread."""
    lines = [
        "| workload | step | settings reaching target | cheapest reaching it | its utilisation "
        "| its loader CPU s/step | utilisation, all settings |",
        "|" + "---|" * 7,
    ]
    for case in report["cases"]:
        rows, best = case["rows"], case["cheapest"]
        reached = sum(r["utilisation"] >= report["target"] for r in rows)
        util = [r["utilisation"] for r in rows]
        lines.append(
            f"| {case['workload']} | {case['accelerator']} {case['step_ms']:.0f} ms "
            f"| {reached} of {len(rows)} | {describe(best['setting']) if best else 'none'} "
            + (
                f"| {best['utilisation']:.2f} | {best['loader_cpu_s_per_step']:.4f} "
                if best
                else "| - | - "
            )
            + f"| {min(util):.2f}-{max(util):.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--data-dir", type=Path, default=HERE / "data" / "step")
    parser.add_argument("--workloads", default="images,tokens,clips")
    parser.add_argument("--accelerators", default="sleep,burn")
    parser.add_argument("--burn-cores", type=int, default=1)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--warmup", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument(
        "--step-scale", type=float, default=1.0, help="multiplies every step's time"
    )
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    args.steps = args.steps or (4 if args.quick else 60)
    args.repeats = args.repeats or (1 if args.quick else 3)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.quick else 5)
    report = run_grid(args)
    report["machine"] = f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}"
    print(report["machine"])
    print(markdown(report))
    print()
    print(summary(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
