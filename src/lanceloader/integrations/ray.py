"""Ray Data: :func:`materialize` and :func:`convert` executed on a Ray cluster, for
preprocessing that one machine cannot do in time. ``import lanceloader.ray`` imports Ray;
``lanceloader`` does not.

Both plan on the driver and run the work as Ray Data tasks (``map_batches``), then commit the
output once, on the driver:

* :func:`materialize` cuts the loader's epoch into the same pieces as
  :func:`lanceloader.write.materialize`; each Ray task runs the loader's pipeline over one piece (the
  loader pickles as plain parameters) and writes it as uncommitted Lance fragments. The driver
  records each finished piece (so a rerun resumes) and commits them in order: the output rows
  are the single-machine version's, row for row.
* :func:`convert` reads an ImageFolder tree or Parquet files with Ray tasks (images: one task per
  chunk of files, each checked, unreadable ones skipped and listed) and writes the fragments;
  the same rows as :func:`lanceloader.convert`.

For Ray Data users who want a ``ray.data.Dataset`` of a Lance dataset rather than a Loader:
``ray.data.read_lance(uri, columns=..., filter=...)`` is Ray's own reader; it has no order of
ours (no seed, no resume). Train from a materialised copy with a Loader per Ray Train worker
instead, as the guide's "Preprocess once" page shows.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import ray
import ray.data
from lance.fragment import write_fragments

from lanceloader.arguments import check_storage_options
from lanceloader.write.convert import (
    CLASSES_KEY,
    ConvertSummary,
    dataset_version,
    image_files,
    int64_labels,
    read_images,
)
from lanceloader.write.folders import class_folders
from lanceloader.write.materialize import Job, MaterializeSummary, commit_fragments, write_piece
from lanceloader.write.runs import local_path

__all__ = ["convert", "materialize"]


def materialize(
    loader: Any,
    out_uri: str | os.PathLike[str],
    *,
    epoch: int = 0,
    mode: str = "create",
    rows_per_fragment: int = 256 * 1024,
    concurrency: int | None = None,
    num_workers: int = 1,
    storage_options: dict[str, str] | None = None,
    restart: bool = False,
) -> MaterializeSummary:
    """:func:`lanceloader.write.materialize` with each piece written by a Ray Data task;
    returns the same summary (the dataset as ``.dataset``).

    Args:
        concurrency: Ray tasks at once; default Ray's choice.
        num_workers: the loader's worker threads inside each task.
        storage_options: for an object-store ``out_uri``, passed to Lance in every task.
        restart: as for :func:`lanceloader.write.materialize`: discard an unfinished earlier
            run that cannot be resumed (other settings, or a transform not surely the same).
    """
    with Job.start(
        loader, out_uri, epoch, mode, rows_per_fragment, storage_options, restart=restart
    ) as job:
        todo = job.todo()
        if todo:
            out, metadata = job.out, job.metadata
            pieces = {n: (job.pieces[n].start, job.pieces[n].stop) for n in todo}

            def write(batch: dict[str, np.ndarray]) -> dict[str, list[Any]]:
                numbers, fragments, schemas = [], [], []
                for number in batch["piece"].tolist():
                    start, stop = pieces[number]
                    written, schema = write_piece(
                        loader,
                        out,
                        epoch,
                        range(start, stop),
                        metadata,
                        num_workers,
                        storage_options,
                    )
                    numbers.append(number)
                    fragments.append(json.dumps(written))
                    schemas.append(schema)
                return {"piece": numbers, "fragments": fragments, "schema": schemas}

            tasks = ray.data.from_items([{"piece": n} for n in todo], override_num_blocks=len(todo))
            for row in tasks.map_batches(write, batch_size=1, concurrency=concurrency).iter_rows():
                job.record(int(row["piece"]), json.loads(row["fragments"]), row["schema"])
        return job.commit()


def convert(
    source: str | os.PathLike[str],
    out_uri: str | os.PathLike[str],
    *,
    mode: str = "create",
    files_per_task: int = 256,
    concurrency: int | None = None,
    storage_options: dict[str, str] | None = None,
) -> ConvertSummary:
    """:func:`lanceloader.convert` of an ImageFolder tree or of Parquet files, read and written
    by Ray Data tasks and committed once. Rows come in the same order as the single-machine
    version (class by class, files sorted; Parquet files in name order). ``storage_options``:
    for an object-store ``out_uri``, passed to Lance in every task."""
    import time

    started = time.perf_counter()
    root = Path(source)
    out = os.fspath(out_uri)
    if mode not in ("create", "overwrite"):
        raise ValueError(f"mode must be 'create' or 'overwrite', got {mode!r}")
    check_storage_options(storage_options)
    if mode == "create" and dataset_version(out, storage_options) is not None:
        raise FileExistsError(
            f"{out!r} already holds a Lance dataset; pass mode='overwrite' to replace it"
        )
    left_out: list[tuple[str, str]] = []  # loops and Lance datasets: write/folders.py
    if root.is_file() or any(root.rglob("*.parquet")):
        files = [root] if root.is_file() else sorted(root.rglob("*.parquet"))
        chunks = [[os.fspath(f)] for f in files]
        metadata: dict[bytes, bytes] = {}

        def read(paths: list[str]) -> tuple[pa.Table, list[tuple[str, str]]]:
            import pyarrow.parquet as pq

            return pq.read_table(paths[0]), []
    else:
        classes = class_folders(root, left_out, local_path(out))
        items = image_files(root, classes, left_out, local_path(out))
        if not items:
            raise ValueError(
                f"{os.fspath(root)!r} holds no Parquet files and no class folders of images"
            )
        chunks = [items[i : i + files_per_task] for i in range(0, len(items), files_per_task)]
        metadata = {CLASSES_KEY: json.dumps([c.name for c in classes]).encode()}
        prefix = len(os.path.join(os.fspath(root), ""))

        def read(paths: list[Any]) -> tuple[pa.Table, list[tuple[str, str]]]:
            images, labels, names, skipped = [], [], [], []
            for (path, label), (data, why) in zip(paths, read_images(paths, None), strict=True):
                if data is None:  # damaged images are skipped and listed
                    skipped.append((path[prefix:], why))
                    continue
                images.append(data)
                labels.append(int(label))
                names.append(path[prefix:])
            return pa.table(
                {
                    "image": pa.array(images, pa.binary()),
                    "label": pa.array(labels, pa.int64()),
                    "path": pa.array(names, pa.string()),
                }
            ), skipped

    def task(batch: dict[str, np.ndarray]) -> dict[str, list[Any]]:
        numbers, fragments, schemas, skipped, rows, nbytes = [], [], [], [], [], []
        for number in batch["chunk"].tolist():
            table, left_out = read(chunks[number])
            table = table.cast(int64_labels(table.schema)).replace_schema_metadata(metadata or None)
            written = (
                write_fragments(
                    table,
                    out,
                    schema=table.schema,
                    max_rows_per_file=max(1, table.num_rows),
                    storage_options=storage_options,
                )
                if table.num_rows
                else []
            )
            numbers.append(number)
            fragments.append(json.dumps([f.to_json() for f in written]))
            schemas.append(table.schema.serialize().to_pybytes().hex())
            skipped.append(json.dumps(left_out))
            rows.append(table.num_rows)
            nbytes.append(table.nbytes)
        return {
            "chunk": numbers,
            "fragments": fragments,
            "schema": schemas,
            "skipped": skipped,
            "rows": rows,
            "nbytes": nbytes,
        }

    tasks = ray.data.from_items(
        [{"chunk": n} for n in range(len(chunks))], override_num_blocks=len(chunks)
    )
    results = sorted(
        tasks.map_batches(task, batch_size=1, concurrency=concurrency).iter_rows(),
        key=lambda r: int(r["chunk"]),
    )
    written = [
        {"fragments": json.loads(r["fragments"]) if r["rows"] else [], "schema": r["schema"]}
        for r in results
    ]
    dataset = commit_fragments(
        out,
        written,
        "the files disagree on their schema (or hold no "
        "rows): convert them with lanceloader.convert to see which two "
        "disagree",
        storage_options,
    )
    skipped = tuple(tuple(s) for r in results for s in json.loads(r["skipped"]))
    skipped = tuple(left_out) + skipped
    return ConvertSummary(
        out,
        dataset.version,
        sum(int(r["rows"]) for r in results),
        sum(int(r["nbytes"]) for r in results),
        time.perf_counter() - started,
        skipped,
    )  # type: ignore[arg-type]
