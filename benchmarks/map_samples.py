"""Row by row: ``MapDataset[i]`` against the same JPEGs read from files, in a DataLoader loop.

Method
------
* Data: ``--images`` JPEGs of 128x128 (``transforms.py``'s dataset, written once under
  ``--data-dir``), and the same bytes as one file per image beside it (``<n>.jpg``).
* Every case is a torch ``DataLoader`` with ``--workers`` worker processes (``forkserver``, as
  docs/fork-safety.md advises; persistent; not timed: the first batch), batches of ``--batch-size``, torch's ``RandomSampler``
  (``shuffle=True``), a loop that takes ``--batches`` batches (the training step's side: it only
  counts). Each sample is a 128x128x3 uint8 tensor and a label.
* ``files``: a ``Dataset`` whose ``__getitem__`` opens and reads ``<i>.jpg`` and decodes it with
  simplejpeg (the usual ImageFolder-style dataset).
* ``map per sample``: a ``Dataset`` whose ``__getitem__`` returns ``MapDataset[i]`` (``transform=
  ll.decode_images("image")``): one Lance read per sample, what any per-sample wrapper asks.
* ``map batched``: ``MapDataset`` itself in the same ``DataLoader(batch_size=, shuffle=True)``:
  torch calls ``__getitems__`` with each batch's indices (one Lance take a batch), no batch
  sampler; ``collate_fn=collate``.
* ``map BatchSampler``: ``lanceloader.torch.BatchSampler`` (full shuffle), read ahead.
* With ``--workers 0`` the loop runs in this process (torch on one thread, as in a DataLoader
  worker) and ``time.process_time`` gives the CPU seconds per sample of each case (Lance's
  threads included).
* ``--repeats`` rounds, the cases' order reversed every other round; quoted: the median of each
  round's ratio to ``files`` (spread min-max) and the median samples/s; the load average.

Usage::

    python benchmarks/map_samples.py                  # 10,000 images, 2 workers, 5 repeats
    python benchmarks/map_samples.py --workers 0      # in process: CPU per sample
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lance
import simplejpeg
import torch
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parent))

from transforms import prepare_dataset

import lanceloader as ll
from lanceloader.torch import BatchSampler, MapDataset, collate


def write_files(uri: str) -> Path:
    """The dataset's JPEGs as ``<row>.jpg`` files in a folder beside it (written once)."""
    folder = Path(uri + ".files")
    ds = lance.dataset(uri)
    if folder.exists() and len(os.listdir(folder)) == ds.count_rows():
        return folder
    folder.mkdir(exist_ok=True)
    for row, image in enumerate(ds.to_table(columns=["image"]).column("image").to_pylist()):
        (folder / f"{row}.jpg").write_bytes(image)
    return folder


class Files(Dataset):  # type: ignore[type-arg]
    """An ImageFolder-style dataset: one file read and decoded per sample."""

    def __init__(self, folder: Path, count: int) -> None:
        self.folder, self.count = folder, count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> dict[str, Any]:
        with open(self.folder / f"{i}.jpg", "rb") as file:
            image = simplejpeg.decode_jpeg(file.read())
        return {"image": torch.from_numpy(image), "label": torch.tensor(i % 10)}


class PerSample(Dataset):  # type: ignore[type-arg]
    """A user's per-sample wrapper: ``MapDataset[i]``, one Lance read a sample."""

    def __init__(self, rows: MapDataset) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.rows[i]  # type: ignore[no-any-return]


def loaders(uri: str, args: argparse.Namespace) -> dict[str, DataLoader]:  # type: ignore[type-arg]
    """Each case's DataLoader, built once (persistent workers)."""
    rows = MapDataset(uri, columns=["image", "label"], transform=ll.decode_images("image"))
    common: dict[str, Any] = {"num_workers": args.workers}
    if args.workers:
        common |= {"persistent_workers": True, "multiprocessing_context": "forkserver"}
    batched = {"batch_size": args.batch_size, "shuffle": True}
    sampler = BatchSampler(rows, batch_size=args.batch_size, shuffle=True)
    return {
        "files": DataLoader(Files(write_files(uri), len(rows)), **batched, **common),
        "map per sample": DataLoader(PerSample(rows), **batched, **common),
        "map batched": DataLoader(rows, **batched, collate_fn=collate, **common),
        "map BatchSampler": DataLoader(rows, batch_sampler=sampler, collate_fn=collate, **common),
    }


def measure(loader: DataLoader, batches: int) -> tuple[float, float]:  # type: ignore[type-arg]
    """Samples/s over ``batches`` batches after the first, and CPU seconds per sample of this
    process (meaningful with no workers)."""
    it = iter(loader)
    next(it)
    samples = 0
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(batches):
        samples += len(next(it)["label"])
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return samples / wall, cpu / samples


def alternated(cases: dict[str, Callable[[], tuple[float, float]]], repeats: int) -> dict:
    """Each case ``repeats`` times, the order reversed every other round."""
    out: dict[str, list[tuple[float, float]]] = {name: [] for name in cases}
    names = list(cases)
    for repeat in range(repeats):
        for name in names if repeat % 2 == 0 else names[::-1]:
            out[name].append(cases[name]())
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=10_000)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--batches", type=int, default=60)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--data-dir", type=Path, default=Path(__file__).parent / "data")
    args = parser.parse_args(argv)
    uri = prepare_dataset(args.data_dir, args.images)
    torch.set_num_threads(1)  # as in a DataLoader worker: collate's stack on OpenMP threads
    # spun 190 ms a batch on the loaded machine with --workers 0
    load = os.getloadavg()[0]
    runs = alternated(
        {name: lambda dl=dl: measure(dl, args.batches) for name, dl in loaders(uri, args).items()},
        args.repeats,
    )
    print(
        f"\n{args.images:,} JPEGs of 128x128, batch {args.batch_size}, {args.batches} batches a "
        f"run, {args.workers} workers, {args.repeats} rounds; load average {load:.1f} -> "
        f"{os.getloadavg()[0]:.1f}\n"
    )
    print("| case | samples/s | / files, median (min-max) | CPU us a sample (this process) |")
    print("|---|---:|---:|---:|")
    for name, values in runs.items():
        ratios = [v[0] / f[0] for v, f in zip(values, runs["files"], strict=True)]
        print(
            f"| {name} | {statistics.median(v[0] for v in values):,.0f} | "
            f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}) | "
            f"{statistics.median(v[1] for v in values) * 1e6:,.0f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
