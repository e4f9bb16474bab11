"""Ingest: get data into Lance once, so that every epoch reads Lance.

:func:`convert` streams a source into a new Lance dataset (never loading all of it), with a
progress bar and a :class:`ConvertSummary` at the end. Sources:

* a folder of images in the ImageFolder layout (``root/<class>/<image>``): columns ``image``
  (the encoded bytes as they are, unless ``resize=`` re-encodes them), ``label`` (int64, the
  class's index in sorted order) and ``path`` (relative to the root); the class names in the
  schema metadata (``lanceloader.classes``). Files are read and checked (``check_images``) in a
  thread pool; an unreadable or damaged image is skipped and listed (``on_error="raise"``: a
  ``ValueError`` naming it). Links to folders are followed, as torchvision's ``ImageFolder``
  does; a link back to a folder on its own path (a loop) is not, and a folder that is a Lance
  dataset, finished or not (the output of an earlier or killed conversion, say), is never read
  as a class or as files: both are listed in the summary's ``skipped``
  (:mod:`lanceloader.write.folders`);
* a Parquet file or a directory of them (every file's schema must match the first's: else a
  ``ValueError`` names the two files and the columns), a CSV file (or ``.tsv``), or a directory
  of CSV files;
* a pandas ``DataFrame``, a pyarrow ``Table``, ``RecordBatch``, ``RecordBatchReader`` or
  ``pyarrow.dataset.Dataset``;
* a Hugging Face ``datasets.Dataset`` (or a directory written by its ``save_to_disk``): image and
  audio columns become their encoded bytes, ``ClassLabel`` columns int64, the class names in the
  schema metadata.

A column named ``label`` or ``labels`` of another integer type comes out int64, what
``torch.nn.functional.cross_entropy`` wants. An existing output needs ``mode="overwrite"`` or
``mode="append"``; an existing file, or a non-empty directory that is not a Lance dataset, is
refused. Every error about the input names the file (and the row, where the reader knows it).

A run holds a lock on its output (:mod:`lanceloader.write.runs`: one convert per output at a
time) and records where it began; a run that dies before its commit (even by SIGKILL) leaves
data files no version refers to, and the next ``convert`` into the same output removes them
and says so in its summary (``removed``). A run that fails with an exception removes what it
wrote (into an output that was empty or absent: all of it, an empty ``data/`` included), so the
same call can simply be run again; should that removal fail, its record stays and the next run
does it.

>>> import pandas as pd, tempfile
>>> out = tempfile.mkdtemp() + "/table.lance"
>>> summary = convert(pd.DataFrame({"x": [1.0, 2.0, 3.0], "label": [0, 1, 0]}), out,
...                   progress=False)
>>> summary.rows, lance.dataset(out).schema.field("label").type
(3, DataType(int64))
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import lance
import pyarrow as pa
from tqdm import tqdm

from lanceloader.arguments import check_int, check_storage_options
from lanceloader.rows.dataset import clean_message, redact_exception
from lanceloader.rows.store import is_object_store, object_store_hint, object_store_options
from lanceloader.write.folders import LANCE_ENTRIES, LANCE_INPUT, is_lance_dataset
from lanceloader.write.image_checks import IMAGE_CHECKS
from lanceloader.write.runs import (
    OutputLock,
    data_files,
    dataset_version,
    is_empty_output,
    leftover_files,
    local_path,
    record_path,
    remove_files,
    remove_unfinished_write,
    save_json,
)
from lanceloader.write.sources import (
    CLASSES_KEY,
    IMAGE_SUFFIXES,
    LABEL_COLUMNS,
    TABLE_SUFFIXES,
    image_files,
    open_source,
    read_images,
)
from lanceloader.write.tables import with_blob_columns

__all__ = [  # the names other modules import from here
    "CLASSES_KEY",
    "IMAGE_SUFFIXES",
    "LANCE_INPUT",
    "TABLE_SUFFIXES",
    "ConvertSummary",
    "convert",
    "dataset_version",
    "image_files",
    "int64_labels",
    "is_lance_dataset",
    "read_images",
    "write_error",
]
MODES = ("create", "overwrite", "append")


@dataclass(frozen=True)
class ConvertSummary:
    """What :func:`convert` wrote: ``print(summary)`` says it in one paragraph.

    ``skipped`` lists ``(item, reason)`` of each input left out (an unreadable image, a Lance
    dataset inside the source folder); ``removed`` is ``(files, bytes)`` of the data files a
    killed earlier run into the same output had left, removed by this run; ``labelled``, for a
    folder of videos or audio files, ``(label, files)`` written per label (class folder or
    ``labels=``' ``label``; without one, the files that matched a row of the labels file).
    """

    uri: str
    version: int
    rows: int
    nbytes: int
    seconds: float
    skipped: tuple[tuple[str, str], ...] = field(default=())
    removed: tuple[int, int] = (0, 0)
    labelled: tuple[tuple[str, int], ...] = field(default=())

    def __str__(self) -> str:
        rate = self.rows / self.seconds if self.seconds > 0 else 0.0
        text = (
            f"wrote {self.rows:,} rows ({self.nbytes / 1e6:,.1f} MB of Arrow data) to "
            f"{self.uri!r}, version {self.version}, in {self.seconds:.1f} s "
            f"({rate:,.0f} rows/s)"
        )
        if self.removed[0]:
            text += (
                f"; removed {self.removed[0]:,} data files ({self.removed[1] / 1e6:,.1f} MB)"
                " that a killed earlier run into this output had left"
            )
        if self.labelled:
            text += "; files per label: " + ", ".join(f"{k} {n:,}" for k, n in self.labelled)
        if not self.skipped:
            return text + "; nothing skipped"
        shown = "; ".join(f"{item}: {why}" for item, why in self.skipped[:10])
        more = f"; and {len(self.skipped) - 10} more" if len(self.skipped) > 10 else ""
        return text + f"; skipped {len(self.skipped)}: {shown}{more}"


def convert(
    source: Any,
    out_uri: str | os.PathLike[str],
    *,
    mode: str = "create",
    on_error: str = "skip",
    resize: int | None = None,
    check_images: str = "structure",
    batch_rows: int | None = None,
    max_rows_per_file: int = 1024 * 1024,
    num_workers: int | None = None,
    storage_options: dict[str, str] | None = None,
    progress: bool | None = None,
    blob_columns: list[str] | None = None,
    labels: str | os.PathLike[str] | None = None,
) -> ConvertSummary:
    """Write ``source`` (see the module's text) to a new Lance dataset at ``out_uri``.

    Args:
        mode: ``"create"`` (the default: an existing dataset is an error), ``"overwrite"``
            (a new version replaces the data) or ``"append"``.
        on_error: ``"skip"`` an unreadable image and list it in the summary, or ``"raise"``.
        resize: images only: re-encode every image as JPEG with its longer side at most this
            many pixels; default: keep the bytes as they are.
        check_images: images only: how a file is checked before it is stored (see
            :func:`checked_image`): ``"structure"`` (the default: JPEG and PNG walked through
            to their end, every segment, chunk and checksum, without decoding the pixels: a
            small share of the conversion's CPU time), ``"decode"`` (every image decoded, as
            training will: also catches damage inside the compressed pixels, at several times
            the conversion's time) or ``"none"`` (stored as they are). The costs:
            docs/performance.md, "Converting images".
        batch_rows: rows per batch streamed to Lance; default 65,536 (images: 1,024 files read
            together).
        max_rows_per_file: rows per Lance data file (a fragment).
        num_workers: threads reading and checking images; default 1 (reading small local
            files is bound by Python, not the disk: docs/performance.md, "Converting images"),
            and the number of cores with ``resize`` or ``check_images="decode"`` (decoding
            releases the GIL) — raise it for a network filesystem.
        storage_options: for an object-store ``out_uri``, passed to Lance.
        progress: show a progress bar on stderr; default when stderr is a terminal.
        blob_columns: binary columns to write as Lance blob columns (each value out of line,
            read by ranges: videos, audio, large images), e.g. ``["video"]``; the loader
            reads them as bytes (see :mod:`lanceloader.rows.lance.blobs`). Default: none.
        labels: a folder of videos or audio files only: a CSV or JSON file of labels or
            metadata columns by file name (see :mod:`lanceloader.write.media`).

    Returns:
        a :class:`ConvertSummary` (rows, bytes, seconds, what was skipped and why, what a
        killed earlier run had left and this one removed).
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if on_error not in ("skip", "raise"):
        raise ValueError(f"on_error must be 'skip' or 'raise', got {on_error!r}")
    if check_images not in IMAGE_CHECKS:
        raise ValueError(f"check_images must be one of {IMAGE_CHECKS}, got {check_images!r}")
    if batch_rows is not None:
        check_int("batch_rows", batch_rows, minimum=1)
    check_int("max_rows_per_file", max_rows_per_file, minimum=1)
    if resize is not None:
        check_int("resize", resize, minimum=1)
    check_storage_options(storage_options)
    out = os.fspath(out_uri)
    options = object_store_options(out, storage_options)
    with OutputLock(
        "convert",
        out,
        f"another convert is writing {out!r}; wait for it to finish, or write to another output",
    ):
        removed, dead_run = _remove_dead_run(out, options)
        check_output(out)
        existing = dataset_version(out, options)
        if mode == "create" and existing is not None:
            raise FileExistsError(
                f"{out!r} already holds a Lance dataset; pass mode='overwrite' "
                "to replace its data (a new version) or mode='append' to add "
                "rows"
            )
        skipped: list[tuple[str, str]] = []
        labelled: dict[str, int] = {}  # a media folder's files per label
        decodes = resize is not None or check_images == "decode"
        schema, batches, total = open_source(
            source,
            skipped=skipped,
            labelled=labelled,
            on_error=on_error,
            resize=resize,
            batch_rows=batch_rows,
            check=check_images,
            exclude=local_path(out),
            labels=labels,
            num_workers=num_workers or (os.cpu_count() or 1 if decodes else 1),
        )
        journal = record_path("convert", out)
        before = data_files(out)
        fresh = is_empty_output(out)  # all a failed write leaves can then go
        save_json(journal, {"out": out, "pid": os.getpid(), "before": before, "fresh": fresh})
        started = time.perf_counter()
        try:
            ds, rows, nbytes = _write(
                schema,
                batches,
                total,
                out,
                options,
                progress,
                # "create" when nothing is there: Lance warns otherwise
                "create" if existing is None else mode,
                max_rows_per_file,
                blob_columns or [],
            )
        except BaseException:
            _remove_own_files(out, before, fresh, options)
            journal.unlink(missing_ok=True)  # kept if the removal failed: the next run does it
            raise
        if dead_run and is_object_store(out):  # no listing there: Lance finds the leftovers
            stats = ds.cleanup_old_versions(retain_versions=1 << 62, delete_unverified=True)
            removed = (stats.data_files_removed, stats.bytes_removed)
        journal.unlink(missing_ok=True)
    return ConvertSummary(
        out, ds.version, rows, nbytes, time.perf_counter() - started, tuple(skipped), removed,
        tuple(sorted(labelled.items())),
    )  # fmt: skip


def _write(
    schema: pa.Schema,
    batches: Iterator[pa.RecordBatch],
    total: int | None,
    out: str,
    options: dict[str, str] | None,
    progress: bool | None,
    mode: str,
    max_rows_per_file: int,
    blob_columns: list[str] | tuple[str, ...] = (),
) -> tuple[lance.LanceDataset, int, int]:
    """Stream ``batches`` into ``out``; returns the dataset and the rows and bytes written. An
    error of the source is raised as itself, one of Lance naming ``out`` and its likely cause."""
    counted = {"rows": 0, "bytes": 0}
    show = sys.stderr.isatty() if progress is None else progress
    bar = tqdm(total=total, unit="row", desc="convert", file=sys.stderr, disable=not show)
    failed: list[BaseException] = []  # an error of the source, raised as itself (not Lance's)
    target = with_blob_columns(int64_labels(schema), blob_columns)

    def stream() -> Iterator[pa.RecordBatch]:
        try:
            for batch in batches:
                batch = batch.cast(target)  # labels int64; the same arrays otherwise
                counted["rows"] += batch.num_rows
                counted["bytes"] += batch.nbytes
                bar.update(batch.num_rows)
                yield batch
        except BaseException as exc:
            failed.append(exc)
            raise

    try:
        ds = lance.write_dataset(
            pa.RecordBatchReader.from_batches(target, stream()),
            out,
            schema=target,
            mode=mode,
            max_rows_per_file=max_rows_per_file,
            storage_options=options,
        )
    except Exception as exc:
        if failed:
            raise failed[0] from None
        raise write_error(exc, out, options) from exc
    finally:
        bar.close()
    return ds, counted["rows"], counted["bytes"]


def write_error(exc: BaseException, out: str, storage_options: dict[str, str] | None) -> OSError:
    """Lance's error ``exc`` writing ``out`` as an ``OSError`` naming ``out`` and, for an object
    store, the likely cause (a missing bucket, no ``storage_options``, refused credentials).

    >>> print(write_error(OSError("Generic S3 error: Failed to resolve region for bucket 'b'"),
    ...                   "s3://b/d.lance", None))
    cannot write the Lance dataset 's3://b/d.lance': no storage_options were given: pass storage_options= with the store's endpoint, region and credentials, or set the AWS_* environment variables (Generic S3 error: Failed to resolve region for bucket 'b')
    """
    redact_exception(exc, storage_options)
    detail = clean_message(exc, out, storage_options)
    hint = object_store_hint(detail, out, storage_options)
    if (
        not hint
        and is_object_store(out)
        and not (storage_options or {}).keys()
        - {"connect_timeout", "timeout", "client_retry_timeout"}
    ):
        hint = (
            "no storage_options were given: pass storage_options= with the store's "
            "endpoint, region and credentials, or set the AWS_* environment variables"
        )
    if hint:
        return OSError(f"cannot write the Lance dataset {out!r}: {hint} ({detail})")
    return OSError(f"cannot write the Lance dataset {out!r}: {detail}")


def check_output(out: str) -> None:
    """Refuse a local ``out`` that is a file, or a non-empty directory that is not a Lance
    dataset (``FileExistsError`` naming it); an object store is left to Lance."""
    path = local_path(out)
    if path is None or not os.path.lexists(path):
        return
    if not os.path.isdir(path):
        raise FileExistsError(
            f"{out!r} is a file; a Lance dataset is a directory: give convert a new path"
        )
    if os.path.isdir(os.path.join(path, "_versions")):
        return
    entries = sorted(os.listdir(path))
    if not entries or (entries == ["data"] and not os.listdir(os.path.join(path, "data"))):
        return  # empty, or the empty data/ of a write that wrote nothing
    if set(entries) <= LANCE_ENTRIES:
        raise FileExistsError(
            f"{out!r} holds only the files of a Lance write that never committed (a run killed "
            "on another machine, or by another user?), and no dataset; remove the directory, "
            "or give convert a new path"
        )
    raise FileExistsError(
        f"{out!r} is a directory that is not a Lance dataset and not empty (it holds "
        f"{', '.join(map(repr, entries[:3]))}{', ...' if len(entries) > 3 else ''}); give "
        "convert a new or empty path, so that nothing of yours is mixed into the dataset"
    )


def _remove_dead_run(
    out: str, storage_options: dict[str, str] | None
) -> tuple[tuple[int, int], bool]:
    """If a run into ``out`` died before its end (its record is still there, and we hold the
    lock, so it is not running): remove the local data files it wrote that no version refers
    to. Returns (files, bytes) removed and whether there was such a run."""
    journal = record_path("convert", out)
    try:
        record = json.loads(journal.read_text())
    except (FileNotFoundError, ValueError):
        return (0, 0), False
    removed = _remove_own_files(
        out, record.get("before") or {}, bool(record.get("fresh")), storage_options
    )
    journal.unlink(missing_ok=True)
    return removed, True


def _remove_own_files(
    out: str, before: dict[str, int], fresh: bool, storage_options: dict[str, str] | None
) -> tuple[int, int]:
    """Remove what a run into ``out`` that did not commit wrote: all of Lance's entries when
    the output was empty or absent at its start (``fresh``; an empty ``data/`` included),
    else the data files no version refers to that were not there at its start."""
    if fresh:
        return remove_unfinished_write(out)
    return remove_files(out, leftover_files(out, before, storage_options))


# --- labels ---------------------------------------------------------------------------------


def int64_labels(schema: pa.Schema) -> pa.Schema:
    """``schema`` with integer ``label``/``labels`` columns as int64 (what ``cross_entropy``
    wants); cast batches or tables to it."""
    for i, f in enumerate(schema):
        if f.name in LABEL_COLUMNS and pa.types.is_integer(f.type) and f.type != pa.int64():
            schema = schema.set(i, f.with_type(pa.int64()))
    return schema
