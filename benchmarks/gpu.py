"""Feeding a GPU: normalised 224x224 images on the device per second, the exposed wait per
step, the copy hidden behind the step and the CPU cores used, for GPU decode, CPU decode with the
device stage and CPU decode without it, all in one run (issue 27).

Method
------
A local Lance dataset of ``--images`` generated JPEGs (ImageNet-like: 400-600 x 300-500 pixels,
a gradient plus noise, quality 85; ``--distinct`` different images repeated) is read by a
``Loader`` (block shuffle) in three cases:

``gpu decode``
    ``decode_images(size=224, dtype="float32", mean, std, layout="CHW", device=DEV)``: JPEGs
    decoded, resized and normalised on the GPU in ``--gpu-workers`` (4) worker threads;
    ``Loader(device=DEV)`` hands the batches over on the training loop's stream.
``cpu decode + stage``
    ``decode_images(size=224, layout="CHW")`` (uint8) on ``--cpu-workers`` CPU threads (default
    every core); ``Loader(device=DEV)``: the device stage copies each ``B x 3 x 224 x 224`` uint8
    batch ahead; the step normalises it on the device.
``cpu decode, no stage``
    the same without ``device=``: the loop copies each batch (``.to(DEV)``), then normalises.

Each case runs twice, each with a fresh loader, ``--warmup`` batches, then ``--batches`` measured:
``max`` (the step only normalises: the loader's ceiling in images/s) and ``step`` (a matmul loop
calibrated to consume ``--step-rate`` images/s). Per step, the loop asks for a batch, makes it
usable on the device (the baseline's copy; a stream synchronisation for all cases, so a copy that
is not done yet shows), which is the **exposed wait**; then runs the step and synchronises, so the
GPU idles while the loop waits: the harshest case. Reported: images/s, the exposed wait per step
(p50/p95 ms) and its share of the step time, the cores the process used (CPU seconds / wall
seconds) and, from ``loader.stats()``, the share of the device copies' time hidden behind the step.

Targets (one H200, the default arguments):

* ``gpu decode``, ``max``: >= 8,000 images/s using <= 4 CPU cores.
* ``gpu decode``, ``step`` at 6,000 images/s: exposed wait < 1% of step time.
* ``cpu decode + stage``, ``step``: the copy of each 256 x 3 x 224 x 224 uint8 batch >= 95% hidden.

Usage::

    python benchmarks/gpu.py                              # CUDA, 100,000 images
    python benchmarks/gpu.py --device cpu --images 200    # smoke run on the CPU (< 30 s)
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from multiprocessing import Pool
from pathlib import Path
from typing import Any

import lance
import numpy as np
import pyarrow as pa
import torch

import lanceloader as ll

HERE = Path(__file__).resolve().parent
SIZE = 224
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
TARGET_GPU_IMAGES_S = 8000
TARGET_GPU_CORES = 4
TARGET_WAIT_SHARE = 0.01
TARGET_COPY_HIDDEN = 0.95


# --- dataset -----------------------------------------------------------------------------------


def make_jpeg(seed: int) -> bytes:
    """One ImageNet-like JPEG: 400-600 x 300-500 pixels, a colour gradient plus noise."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    w, h = int(rng.integers(400, 601)), int(rng.integers(300, 501))
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    phase = rng.uniform(0, 6.3, 3)
    base = np.stack(
        [128 + 100 * np.sin(x / (40 + 9 * c) + y / (55 + 7 * c) + phase[c]) for c in range(3)], -1
    )
    base += 10 * rng.standard_normal(base.shape, dtype=np.float32)
    pixels = np.clip(base, 0, 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=85)
    return out.getvalue()


def prepare_dataset(data_dir: Path, images: int, distinct: int) -> str:
    """``images`` rows (``distinct`` different JPEGs, repeated) under ``data_dir``, reused."""
    distinct = min(distinct, images)
    path = data_dir / f"gpu-{images}-{distinct}.lance"
    if (path / "_versions").exists() and lance.dataset(str(path)).count_rows() == images:
        print(f"reusing {path}")
        return str(path)
    print(f"writing {images:,} JPEGs ({distinct:,} distinct) to {path} ...", flush=True)
    start = time.perf_counter()
    with Pool(os.cpu_count()) as pool:
        pool_images = pool.map(make_jpeg, range(distinct), chunksize=16)
    per_file = max(1, images // 16)

    def tables() -> Any:
        for first in range(0, images, per_file):
            rows = np.arange(first, min(images, first + per_file))
            yield pa.record_batch(
                {
                    "image": pa.array([pool_images[i % distinct] for i in rows], pa.binary()),
                    "label": pa.array(rows % 1000),
                }
            )

    schema = pa.schema([("image", pa.binary()), ("label", pa.int64())])
    data_dir.mkdir(parents=True, exist_ok=True)
    lance.write_dataset(
        pa.RecordBatchReader.from_batches(schema, tables()),
        str(path),
        mode="overwrite",
        max_rows_per_file=per_file,
    )
    mean_kb = sum(map(len, pool_images)) / len(pool_images) / 1e3
    print(f"  written in {time.perf_counter() - start:.1f} s ({mean_kb:.0f} KB per image)")
    return str(path)


# --- the training step -------------------------------------------------------------------------


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


def make_step(
    device: torch.device, rate: float, batch_size: int
) -> tuple[Callable[[Any], Any], int]:
    """A step that consumes ``rate`` images/s at ``batch_size``: a calibrated matmul loop that
    reads the batch; returns it and its matmul count."""
    n = 2048 if device.type == "cuda" else 128
    a = torch.randn(n, n, device=device)
    for _ in range(3):
        a @ a
    sync(device)
    start, reps = time.perf_counter(), 20
    for _ in range(reps):
        a @ a
    sync(device)
    per_matmul = (time.perf_counter() - start) / reps
    count = max(1, round(batch_size / rate / per_matmul))

    def step(x: Any) -> Any:
        y = a * x.mean()
        for _ in range(count):
            y = y @ a
            y = y / y.norm()
        return y

    return step, count


def normalise(x: Any, device: torch.device) -> Any:
    if x.dtype != torch.uint8:
        return x
    mean = torch.tensor(MEAN, device=device).view(1, 3, 1, 1)
    std = torch.tensor(STD, device=device).view(1, 3, 1, 1)
    return (x.float() / 255 - mean) / std


# --- one run ------------------------------------------------------------------------------------


def run_case(
    uri: str,
    case: dict[str, Any],
    step: Callable[[Any], Any] | None,
    args: argparse.Namespace,
    device: torch.device,
) -> dict[str, Any]:
    """``args.warmup`` then ``args.batches`` steps of a fresh loader; the measurements."""
    loader = ll.Loader(
        uri,
        args.batch_size,
        columns=["image", "label"],
        shuffle=True,
        shuffle_block_size=64,
        seed=0,
        transform=case["transform"],
        output="torch",
        device=case["device"],
        num_workers=case["workers"],
        drop_last=True,
    )
    waits: list[float] = []
    totals: list[float] = []
    batches = iter(())
    wall = cpu = 0.0
    for i in range(args.warmup + args.batches):
        if i == args.warmup:
            wall, cpu = time.perf_counter(), time.process_time()
        t0 = time.perf_counter()
        batch = next(batches, None)
        if batch is None:  # the next epoch
            batches = iter(loader)
            batch = next(batches)
        x = batch["image"]
        if case["device"] is None:
            x = x.to(device)  # the baseline's copy, in the loop
        sync(device)
        t1 = time.perf_counter()
        x = normalise(x, device)
        if step is not None:
            step(x)
        sync(device)
        t2 = time.perf_counter()
        if i >= args.warmup:
            waits.append(t1 - t0)
            totals.append(t2 - t0)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    loader.close()
    stats = loader.stats()
    images = args.batches * args.batch_size
    return {
        "images_per_s": images / wall,
        "wait_p50_ms": 1000 * statistics.median(waits),
        "wait_p95_ms": 1000 * float(np.percentile(waits, 95)),
        "wait_share": sum(waits) / sum(totals),
        "step_ms": 1000 * statistics.median(totals),
        "cores": cpu / wall,
        "copy_hidden": stats.copy_hidden,
        "copy_ms": 1000 * stats.copy_s,
        "copies": stats.copy_batches,
        "copies_late": stats.copies_late,
        "device_ahead_max": stats.device_ahead_max,
    }


def cases(args: argparse.Namespace, device: torch.device) -> dict[str, dict[str, Any]]:
    cpu_decode = ll.decode_images("image", size=SIZE, layout="CHW")
    out: dict[str, dict[str, Any]] = {}
    try:
        gpu_decode = ll.decode_images(
            "image",
            size=SIZE,
            dtype="float32",
            mean=MEAN,
            std=STD,
            layout="CHW",
            device=str(device),
        )
        if device.type != "cuda":
            raise ValueError("needs --device cuda, torchvision and a GPU")
        out["gpu decode"] = {
            "transform": gpu_decode,
            "device": str(device),
            "workers": args.gpu_workers,
        }
    except (ImportError, ValueError) as exc:
        out["gpu decode"] = {"skipped": str(exc).split(";")[0]}
    out["cpu decode + stage"] = {
        "transform": cpu_decode,
        "device": str(device),
        "workers": args.cpu_workers,
    }
    out["cpu decode, no stage"] = {
        "transform": cpu_decode,
        "device": None,
        "workers": args.cpu_workers,
    }
    return out


def targets(results: dict[str, dict[str, Any]]) -> list[tuple[str, Any, bool | None]]:
    """Each target: what it says, the measured value, and whether it is met (None: not run)."""
    gpu, stage = results.get("gpu decode", {}), results.get("cpu decode + stage", {})
    gmax, gstep, sstep = gpu.get("max"), gpu.get("step"), stage.get("step")
    hidden = sstep["copy_hidden"] if sstep else None
    return [
        (
            f"gpu decode >= {TARGET_GPU_IMAGES_S:,} images/s",
            gmax and round(gmax["images_per_s"]),
            gmax and gmax["images_per_s"] >= TARGET_GPU_IMAGES_S,
        ),
        (
            f"  using <= {TARGET_GPU_CORES} cores",
            gmax and round(gmax["cores"], 2),
            gmax and gmax["cores"] <= TARGET_GPU_CORES,
        ),
        (
            f"exposed wait < {100 * TARGET_WAIT_SHARE:g}% of step time (gpu decode, step)",
            gstep and f"{100 * gstep['wait_share']:.2f}%",
            gstep and gstep["wait_share"] < TARGET_WAIT_SHARE,
        ),
        (
            f"copy hidden >= {100 * TARGET_COPY_HIDDEN:g}% (cpu decode + stage, step)",
            hidden is not None and f"{100 * hidden:.1f}%",
            None if hidden is None else hidden >= TARGET_COPY_HIDDEN,
        ),
    ]


def table(results: dict[str, dict[str, Any]]) -> str:
    head = (
        f"{'case':<22}{'run':<6}{'images/s':>10}{'wait p50':>10}{'wait p95':>10}"
        f"{'wait %':>8}{'ms/step':>9}{'cores':>7}{'copy hidden':>13}"
    )
    lines = [head, "-" * len(head)]
    for name, runs in results.items():
        if "skipped" in runs:
            lines.append(f"{name:<22}skipped: {runs['skipped']}")
            continue
        for run, r in runs.items():
            hidden = "-" if r["copy_hidden"] is None else f"{100 * r['copy_hidden']:.1f}%"
            lines.append(
                f"{name:<22}{run:<6}{r['images_per_s']:>10,.0f}{r['wait_p50_ms']:>8.2f}ms"
                f"{r['wait_p95_ms']:>8.2f}ms{100 * r['wait_share']:>7.2f}%{r['step_ms']:>9.2f}"
                f"{r['cores']:>7.2f}{hidden:>13}"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--images", type=int, default=100_000)
    parser.add_argument("--distinct", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--batches", type=int, help="measured per run: 60 on CUDA, 12 on CPU")
    parser.add_argument("--warmup", type=int, help="batches before: 10 on CUDA, 3 on CPU")
    parser.add_argument("--step-rate", type=float, default=6000.0)
    parser.add_argument("--gpu-workers", type=int, default=4)
    parser.add_argument("--cpu-workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--data-dir", type=Path, default=HERE / "data")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "gpu.json")
    args = parser.parse_args()
    args.batch_size = min(args.batch_size, max(1, args.images // 8))  # a few batches an epoch
    device = torch.device(args.device)
    args.batches = args.batches or (60 if device.type == "cuda" else 12)
    args.warmup = args.warmup if args.warmup is not None else 10 if device.type == "cuda" else 3
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if device.type == "cpu":
        torch.set_num_threads(1)  # the step's matmuls on one core; the workers get the rest
    uri = prepare_dataset(args.data_dir, args.images, args.distinct)
    step, matmuls = make_step(device, args.step_rate, args.batch_size)
    print(
        f"device {device}, batch {args.batch_size}, step of {matmuls} matmuls "
        f"(~{args.step_rate:,.0f} images/s), {args.batches} measured batches per run"
    )
    results: dict[str, dict[str, Any]] = {}
    for name, case in cases(args, device).items():
        if "skipped" in case:
            results[name] = case
            continue
        results[name] = {}
        for run, fn in (("max", None), ("step", step)):
            print(f"  {name}, {run} ...", flush=True)
            results[name][run] = run_case(uri, case, fn, args, device)
    print()
    print(table(results))
    print()
    checks = targets(results)
    for what, value, met in checks:
        verdict = "not run" if met is None else "met" if met else "MISSED"
        print(f"{what:<62}{'-' if value in (None, False) else value!s:>10}  {verdict}")
    out = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "results": results,
        "targets": [{"target": w, "value": v, "met": m} for w, v, m in checks],
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "lanceloader": ll.__version__,
            "device": torch.cuda.get_device_name(device)
            if device.type == "cuda"
            else platform.processor() or "cpu",
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2, default=str) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
