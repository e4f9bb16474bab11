"""Blob columns: payload bytes a ``Loader`` delivers vs Lance's own ``read_blobs``, in one run.

Method
------
* Dataset: ``--rows`` rows of a blob column (``lance.blob.blob_field``) of ``--payload-kib``
  KiB random payloads each, written once under ``--data-dir`` (reused when one of the same
  shape is there). The page cache is warmed by one untimed pass of each case first.
* Cases, read sequentially over the whole dataset: a Loader (``columns=["blob"]``,
  ``--batch-size``, default workers) with ``output="arrow"``, ``"numpy"`` (a ``ByteRows``) and
  ``ll.Conversion(output="torch")`` (bytes as uint8 tensors' buffer), each paired with Lance's
  ``ds.read_blobs("blob", indices=...)`` over the same rows in the Loader's read size (rows per
  Lance call), single-threaded as a training loop would call it, and with each call's payloads
  made one Arrow column (``read_blobs → Arrow``: the one copy any loader of Arrow batches makes,
  since ``read_blobs`` returns a Python ``bytes`` per row).
* ``--repeats`` (≥ 3) rounds per case; the order inside a round alternates between rounds so a
  shared machine's drift hits both sides alike. Quoted: the median ratio (loader MB/s / Lance
  MB/s) and its spread (min-max over the rounds), and the CPU seconds per GB of each (all
  threads of the process: steadier than wall time on a busy machine). Target: ≥ 0.9×.
* Payload reads alone, old path against new, in one process (``--repeats`` alternated
  rounds): per read of the Loader's size, the descriptors as the Loader reads them (a
  fragment range read), then the payloads through Lance's ``read_blobs`` and one copy into an
  Arrow column (the path before ``rows/lance/inline_blobs.py``) or straight from the data files
  (inline payloads, one scatter ``preadv`` per run); CPU seconds per GB and the ratio. Run it
  on JPEG-sized payloads too: ``--payload-kib 11 --vary`` (sizes 0.8-1.2x, so payloads sit
  64-byte aligned with gaps between them).
* Inline vs blob (whether ``convert`` should choose blobs by itself): a Loader epoch over the
  same payloads (``--inline-total-mb`` MB of each of ``--inline-sizes-kib``), in storage order
  and fully shuffled, stored in a plain ``large_binary`` column and in a blob column.

Usage::

    python benchmarks/blobs.py                         # 2,000 rows of 64 KiB, 5 repeats
    python benchmarks/blobs.py --rows 500 --repeats 3  # smoke run
    python benchmarks/blobs.py --rows 8000 --payload-kib 11 --vary --inline-sizes-kib ''  # JPEGs
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import lance
import lance.blob
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import lanceloader as ll
from lanceloader.rows.lance.blobs import binary_array, read_blob_payloads


def write_dataset(
    root: Path, rows: int, payload: int, inline: bool = False, vary: bool = False
) -> str:
    """``rows`` random payloads of ``payload`` bytes (``vary``: 0.8-1.2x that) in a blob
    column (``inline``: the same payloads in a plain ``large_binary`` column), written once."""
    kind = "inline" if inline else "blobs"
    uri = root / f"{kind}-{rows}x{payload}{'-vary' if vary else ''}.lance"
    if uri.exists() and lance.dataset(str(uri)).count_rows() == rows:
        return str(uri)
    rng = np.random.default_rng(0)
    sizes = rng.integers(payload * 4 // 5, payload * 6 // 5 + 1, rows) if vary else [payload] * rows
    values = [rng.integers(0, 256, int(n), dtype=np.uint8).tobytes() for n in sizes]
    column = pa.array(values, pa.large_binary()) if inline else lance.blob.blob_array(values)
    table = pa.table({"id": pa.array(range(rows), pa.int64()), "blob": column})
    lance.write_dataset(
        table,
        str(uri),
        mode="overwrite" if uri.exists() else "create",
        max_rows_per_file=rows // 2 or 1,
    )
    return str(uri)


def inline_vs_blob(
    root: Path, sizes_kib: list[int], total_mb: int, batch_size: int, repeats: int
) -> None:
    """Whether ``convert`` should make large binary columns blobs by itself: a Loader epoch
    (output arrow, in storage order and fully shuffled) over the same payloads stored inline
    and as a blob column, per size."""
    print("\n| payload | order | inline MB/s | blob MB/s | blob / inline, median (spread) |")
    print("|---:|---|---:|---:|---:|")
    for kib in sizes_kib:
        rows = max(64, total_mb * 1024 // kib)
        inline = write_dataset(root, rows, kib * 1024, inline=True)
        blob = write_dataset(root, rows, kib * 1024)
        for shuffle in (False, True):
            cases = {
                "inline": loader_pass(inline, "arrow", batch_size, shuffle),
                "blob": loader_pass(blob, "arrow", batch_size, shuffle),
            }
            speed, _ = alternated(cases, repeats)
            print(
                f"| {kib} KiB | {'shuffled' if shuffle else 'sequential'} | "
                f"{statistics.median(speed['inline']):.0f} | "
                f"{statistics.median(speed['blob']):.0f} | "
                f"{ratio_cells(speed, 'blob', 'inline')} |"
            )


def loader_pass(
    uri: str, output: object, batch_size: int, shuffle: bool = False
) -> Callable[[], int]:
    """One epoch of a Loader over the blob column (in storage order, or fully shuffled);
    returns the payload bytes delivered."""
    loader = ll.Loader(uri, columns=["blob"], batch_size=batch_size, output=output, shuffle=shuffle)

    def run() -> int:
        total = 0
        for batch in loader:
            column = batch.column("blob") if isinstance(batch, pa.RecordBatch) else batch["blob"]
            if isinstance(column, pa.Array):
                total += pc.sum(pc.binary_length(column)).as_py() or 0
            elif hasattr(column, "offsets"):  # ll.ByteRows
                total += int(column.offsets[-1] - column.offsets[0])
            else:
                total += sum(len(v) for v in column)
        return total

    return run


def lance_pass(uri: str, rows_per_call: int, arrow: bool = False) -> Callable[[], int]:
    """Lance's own ``read_blobs`` over every row, ``rows_per_call`` rows a call; with
    ``arrow``, each call's payloads also become one Arrow column (what a loader must deliver:
    one copy, the way the loader makes it)."""
    ds = lance.dataset(uri)
    rows = ds.count_rows()

    def run() -> int:
        total = 0
        for start in range(0, rows, rows_per_call):
            indices = list(range(start, min(rows, start + rows_per_call)))
            payloads = [b for _, b in ds.read_blobs("blob", indices=indices)]
            if arrow:
                column = binary_array(payloads)
                total += len(column.buffers()[2])
            else:
                total += sum(len(b) for b in payloads)
        return total

    return run


def payload_pass(uri: str, rows_per_call: int, inline: bool) -> Callable[[], int]:
    """Every row's payloads, ``rows_per_call`` rows a read, as the Loader reads them: the
    descriptors by a fragment range read, then the payloads straight from the files
    (``inline``) or through ``read_blobs`` and one copy into an Arrow column; returns the
    payload bytes."""
    ds = lance.dataset(uri)
    fragments = ds.get_fragments()
    starts = np.cumsum([0] + [f.count_rows() for f in fragments])

    def run() -> int:
        total = 0
        for f, fragment in enumerate(fragments):
            for lo in range(int(starts[f]), int(starts[f + 1]), rows_per_call):
                hi = min(int(starts[f + 1]), lo + rows_per_call)
                table = fragment.to_table(
                    columns=["blob"], offset=lo - int(starts[f]), limit=hi - lo
                )
                column = read_blob_payloads(
                    ds, "blob", np.arange(lo, hi), table.column("blob") if inline else None
                )
                total += len(column.buffers()[2])
        return total

    return run


def timed(run: Callable[[], int]) -> tuple[float, float, int]:
    """Wall seconds, CPU seconds (all threads of this process) and the bytes of ``run()``."""
    started, cpu = time.perf_counter(), time.process_time()
    nbytes = run()
    return time.perf_counter() - started, time.process_time() - cpu, nbytes


def alternated(
    cases: dict[str, Callable[[], int]], repeats: int
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """MB/s and CPU seconds per GB of each case, ``repeats`` rounds, the order reversed every
    other round; every case runs once untimed first (warm alike)."""
    for run in cases.values():
        run()
    speed: dict[str, list[float]] = {name: [] for name in cases}
    cpu: dict[str, list[float]] = {name: [] for name in cases}
    names = list(cases)
    for repeat in range(repeats):
        for name in names if repeat % 2 == 0 else names[::-1]:
            seconds, cpu_seconds, nbytes = timed(cases[name])
            speed[name].append(nbytes / seconds / 1e6)
            cpu[name].append(cpu_seconds / nbytes * 1e9)
    return speed, cpu


def ratio_cells(speed: dict[str, list[float]], a: str, b: str) -> str:
    """``median (min-max)`` of the per-round ratios a/b."""
    ratios = [x / y for x, y in zip(speed[a], speed[b], strict=True)]
    return f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", default="benchmarks/data")
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--payload-kib", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--inline-sizes-kib",
        default="4,64,1024",
        help="payload sizes of the inline-vs-blob comparison ('' to skip)",
    )
    parser.add_argument("--inline-total-mb", type=int, default=64)
    parser.add_argument(
        "--vary", action="store_true", help="payload sizes 0.8-1.2x --payload-kib, not all equal"
    )
    args = parser.parse_args(argv)
    if args.repeats < 3:
        parser.error("--repeats must be at least 3 (a median of alternated pairs)")
    root = Path(args.data_dir)
    root.mkdir(parents=True, exist_ok=True)
    uri = write_dataset(root, args.rows, args.payload_kib * 1024, vary=args.vary)
    outputs = {"arrow": "arrow", "numpy": "numpy", "torch": ll.Conversion(output="torch")}
    probe = ll.Loader(uri, columns=["blob"], batch_size=args.batch_size, output="arrow")
    rows_per_call = probe._pipeline.batches_per_read * args.batch_size
    print(
        f"{args.rows} rows x {args.payload_kib} KiB blobs; Loader reads {rows_per_call} rows "
        f"a Lance call; {args.repeats} alternated rounds per case\n"
    )
    print(
        "| output | Loader MB/s | read_blobs MB/s | Loader / read_blobs | Loader / read_blobs "
        "→ Arrow | CPU s/GB: Loader, read_blobs, → Arrow |"
    )
    print("|---|---:|---:|---:|---:|---|")
    for name, output in outputs.items():
        cases = {
            "loader": loader_pass(uri, output, args.batch_size),
            "lance": lance_pass(uri, rows_per_call),
            "arrow": lance_pass(uri, rows_per_call, arrow=True),
        }
        speed, cpu = alternated(cases, args.repeats)
        cpu_cells = ", ".join(f"{statistics.median(cpu[c]):.2f}" for c in cases)
        print(
            f"| {name} | {statistics.median(speed['loader']):.0f} | "
            f"{statistics.median(speed['lance']):.0f} | "
            f"{ratio_cells(speed, 'loader', 'lance')} | "
            f"{ratio_cells(speed, 'loader', 'arrow')} | {cpu_cells} |"
        )
    cases = {
        "read_blobs": payload_pass(uri, rows_per_call, inline=False),
        "inline": payload_pass(uri, rows_per_call, inline=True),
    }
    _, cpu = alternated(cases, args.repeats)
    ratios = [a / b for a, b in zip(cpu["inline"], cpu["read_blobs"], strict=True)]
    print(
        f"\nPayload reads alone ({rows_per_call} rows a read, descriptors read as the Loader "
        "does): CPU s/GB, median (min-max)\n"
    )
    print("| read_blobs → Arrow | inline preadv | inline / read_blobs |\n|---:|---:|---:|")
    print(
        f"| {statistics.median(cpu['read_blobs']):.2f} | {statistics.median(cpu['inline']):.2f} "
        f"| {statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}) |"
    )
    if args.inline_sizes_kib:
        inline_vs_blob(
            root,
            [int(k) for k in args.inline_sizes_kib.split(",")],
            args.inline_total_mb,
            args.batch_size,
            args.repeats,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
