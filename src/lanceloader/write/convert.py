"""Ingest: get data into Lance once, so that every epoch reads Lance.

:func:`convert` streams a source into a new Lance dataset (never loading all of it), with a
progress bar and a :class:`ConvertSummary` at the end. Sources:

* a folder of images in the ImageFolder layout (``root/<class>/<image>``): columns ``image``
  (the encoded bytes as they are, unless ``resize=`` re-encodes them), ``label`` (int64, the
  class's index in sorted order) and ``path`` (relative to the root); the class names in the
  schema metadata (``lanceloader.classes``). Files are read and checked (``check_images``) in a
  thread pool; an unreadable or damaged image is skipped and listed (``on_error="raise"``: a
  ``ValueError`` naming it). A sub-folder that is a Lance dataset (``*.lance``, or with
  ``_versions/``: the output of an earlier conversion, say) is never read as a class: it is
  listed in the summary's ``skipped``;
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
and says so in its summary (``removed``). A run that fails with an exception removes its own.

>>> import pandas as pd, tempfile
>>> out = tempfile.mkdtemp() + "/table.lance"
>>> summary = convert(pd.DataFrame({"x": [1.0, 2.0, 3.0], "label": [0, 1, 0]}), out,
...                   progress=False)
>>> summary.rows, lance.dataset(out).schema.field("label").type
(3, DataType(int64))
"""

from __future__ import annotations

import concurrent.futures
import functools
import json
import os
import re
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lance
import pyarrow as pa
import pyarrow.csv
import pyarrow.dataset
from tqdm import tqdm

from lanceloader.arguments import check_int, check_storage_options
from lanceloader.rows.dataset import (
    clean_message,
    is_object_store,
    object_store_hint,
    object_store_options,
    redact_exception,
)
from lanceloader.write.image_checks import IMAGE_CHECKS, checked_image
from lanceloader.write.media import from_media_folder, media_kind
from lanceloader.write.runs import (
    OutputLock,
    data_files,
    leftover_files,
    local_path,
    record_path,
    remove_files,
)
from lanceloader.write.tables import from_files, with_blob_columns

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff")
TABLE_SUFFIXES = (".parquet", ".csv", ".tsv")
LABEL_COLUMNS = ("label", "labels")
CLASSES_KEY = b"lanceloader.classes"
MODES = ("create", "overwrite", "append")
TABLE_BATCH_ROWS = 65_536  # rows per batch streamed to Lance (bigger batches: fewer calls)
IMAGE_BATCH_ROWS = 1024  # image files read (in parallel) and written together
LANCE_INPUT = "a Lance dataset (the output of a conversion?): never read as input"
MEDIA_OPTIONS = ("skipped", "on_error", "resize", "batch_rows", "num_workers")  # for media folders


@dataclass(frozen=True)
class ConvertSummary:
    """What :func:`convert` wrote: ``print(summary)`` says it in one paragraph.

    ``skipped`` lists ``(item, reason)`` of each input left out (an unreadable image, a Lance
    dataset inside the source folder); ``removed`` is ``(files, bytes)`` of the data files a
    killed earlier run into the same output had left, removed by this run.
    """

    uri: str
    version: int
    rows: int
    nbytes: int
    seconds: float
    skipped: tuple[tuple[str, str], ...] = field(default=())
    removed: tuple[int, int] = (0, 0)

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
            to their end, every segment, chunk and checksum, without decoding the pixels;
            ~7 µs of CPU an image, a sixth of the conversion's CPU time for 11 KB JPEGs,
            which on 2 cores overlaps with Lance writing the previous batch), ``"decode"``
            (every image decoded, as training will: also catches damage inside the
            compressed pixels; the conversion takes 3-4x as long) or ``"none"`` (stored as
            they are). Measured by ``benchmarks/ingest.py``.
        batch_rows: rows per batch streamed to Lance; default 65,536 (images: 1,024 files read
            together).
        max_rows_per_file: rows per Lance data file (a fragment).
        num_workers: threads reading and checking images; default 1 (reading small local
            files is bound by Python, not the disk: 2 threads ran 0.8x one on 2 cores), and the
            number of cores with ``resize`` or ``check_images="decode"`` (decoding releases the
            GIL) — raise it for a network filesystem.
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
        decodes = resize is not None or check_images == "decode"
        schema, batches, total = _open_source(
            source,
            skipped=skipped,
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
        _save_json(journal, {"out": out, "pid": os.getpid(), "before": before})
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
            remove_files(out, leftover_files(out, before, options))  # this run's own
            journal.unlink(missing_ok=True)
            raise
        if dead_run and is_object_store(out):  # no listing there: Lance finds the leftovers
            stats = ds.cleanup_old_versions(retain_versions=1 << 62, delete_unverified=True)
            removed = (stats.data_files_removed, stats.bytes_removed)
        journal.unlink(missing_ok=True)
    return ConvertSummary(
        out, ds.version, rows, nbytes, time.perf_counter() - started, tuple(skipped), removed
    )


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
    if not entries:
        return
    if entries == ["data"]:
        raise FileExistsError(
            f"{out!r} holds only the data files of a write that never committed (a run killed "
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
    removed = remove_files(out, leftover_files(out, record.get("before") or {}, storage_options))
    journal.unlink(missing_ok=True)
    return removed, True


def _save_json(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(value))
    os.replace(temporary, path)  # atomic: a kill leaves the old record or the new one


def dataset_version(uri: str, storage_options: dict[str, str] | None = None) -> int | None:
    """The latest version of the Lance dataset at ``uri``, or None when there is none."""
    try:
        return lance.dataset(uri, storage_options=storage_options).version
    except (ValueError, OSError, RuntimeError):
        return None


# --- sources --------------------------------------------------------------------------------


def _open_source(
    source: Any, **options: Any
) -> tuple[pa.Schema, Iterator[pa.RecordBatch], int | None]:
    """The schema, a stream of batches and (when known) the row count of ``source``."""
    batch_rows = options["batch_rows"] = options["batch_rows"] or TABLE_BATCH_ROWS
    exclude = options.pop("exclude")
    labels = options.pop("labels")
    if labels is not None and not (isinstance(source, str | os.PathLike) and Path(source).is_dir()):
        raise ValueError("labels= is for a folder of videos or audio files; drop it")
    kind = f"{type(source).__module__.split('.')[0]}.{type(source).__name__}"
    if kind == "pandas.DataFrame":
        source = pa.Table.from_pandas(source, preserve_index=False)
    if kind.startswith("datasets.") and hasattr(source, "features"):
        return _from_hugging_face(source, batch_rows)
    if isinstance(source, pa.RecordBatch):
        source = pa.Table.from_batches([source])
    if isinstance(source, pa.Table):
        return source.schema, iter(source.to_batches(max_chunksize=batch_rows)), source.num_rows
    if isinstance(source, pa.RecordBatchReader):
        return source.schema, iter(source), None
    if isinstance(source, pyarrow.dataset.Dataset):
        return (source.schema, source.to_batches(batch_size=batch_rows), source.count_rows())
    if not isinstance(source, str | os.PathLike):
        raise TypeError(
            f"cannot convert a {kind}: give a folder of images, Parquet or CSV "
            "files, a pandas DataFrame, a pyarrow Table or Dataset, or a Hugging "
            "Face datasets.Dataset"
        )
    path = Path(source)
    if not path.exists():
        raise FileNotFoundError(f"{os.fspath(path)!r} does not exist")
    if path.is_dir() and exclude is not None and os.path.realpath(path) == exclude:
        raise ValueError(
            f"{os.fspath(path)!r} is the output itself: give convert another output path"
        )
    if path.is_dir() and (path / "_versions").is_dir():
        raise ValueError(
            f"{os.fspath(path)!r} is already a Lance dataset: pass it to "
            "ll.Loader as it is (or ll.materialize a filtered or shuffled copy)"
        )
    if path.is_dir() and ((path / "dataset_info.json").exists() or (path / "state.json").exists()):
        import datasets  # a Hugging Face save_to_disk directory

        return _from_hugging_face(datasets.load_from_disk(os.fspath(path)), batch_rows)
    skip = functools.partial(is_lance_dataset, output=exclude)
    kind = media_kind(path, skip, IMAGE_SUFFIXES + TABLE_SUFFIXES) if path.is_dir() else None
    if kind is not None:  # videos or audio: write/media.py
        media = {k: options[k] for k in MEDIA_OPTIONS}
        return from_media_folder(path, kind, labels=labels, skip_dir=skip, **media)
    if labels is not None:
        raise ValueError(f"labels= is for a folder of videos or audio files: {path} holds none")
    if path.is_file():
        return from_files([_table_file(path)], batch_rows)
    skipped = options["skipped"]
    inside = sorted(p for p in path.iterdir() if p.is_dir())
    lance_dirs = [p for p in inside if is_lance_dataset(p, exclude)]
    skipped.extend((p.name, LANCE_INPUT) for p in lance_dirs)
    classes = [p for p in inside if p not in lance_dirs]
    files = table_files(path, exclude)
    if files and not classes:
        return from_files(files, batch_rows)
    if classes:
        if options["batch_rows"] == TABLE_BATCH_ROWS:
            options["batch_rows"] = IMAGE_BATCH_ROWS
        return _from_image_folder(path, classes, **options)
    raise ValueError(
        f"{os.fspath(path)!r} holds no Parquet or CSV files and no class folders "
        "of images (root/<class>/<image>)"
    )


def is_lance_dataset(path: Path, output: str | None = None) -> bool:
    """Whether the directory ``path`` is a Lance dataset (named ``*.lance``, or with
    ``_versions/``) or the output ``output`` of this conversion: never read as input."""
    return (
        path.suffix.lower() == ".lance"
        or (path / "_versions").is_dir()
        or (output is not None and os.path.realpath(path) == output)
    )


def table_files(root: Path, output: str | None = None) -> list[Path]:
    """The Parquet, CSV and TSV files under ``root``, sorted, none inside a Lance dataset."""
    found = []
    for directory, folders, names in os.walk(root):
        folders[:] = [f for f in folders if not is_lance_dataset(Path(directory, f), output)]
        found.extend(
            Path(directory, n) for n in names if os.path.splitext(n)[1].lower() in TABLE_SUFFIXES
        )
    return sorted(found)


_IMAGE_MAGIC = (b"\xff\xd8\xff", b"\x89PNG", b"GIF8", b"BM", b"II*\x00", b"MM\x00*")


def _table_file(path: Path) -> Path:
    """``path``, a Parquet, CSV or TSV file; a single image or another kind of file is refused,
    naming it, before any of it is parsed."""
    if path.suffix.lower() in TABLE_SUFFIXES:
        return path
    with open(path, "rb") as file:
        head = file.read(12)
    if (
        path.suffix.lower() in IMAGE_SUFFIXES
        or head.startswith(_IMAGE_MAGIC)
        or (head[:4] == b"RIFF" and head[8:12] == b"WEBP")
    ):
        raise ValueError(
            f"{os.fspath(path)!r} is a single image; convert reads images from a folder of "
            "class folders (root/<class>/<image>, the label being the class folder): put your "
            "images in such a tree and convert its root"
        )
    raise ValueError(
        f"{os.fspath(path)!r} is not a Parquet (.parquet) or CSV (.csv, .tsv) "
        "file; rename it if it is one, or read it with pyarrow and give convert "
        "the table"
    )


def _from_image_folder(
    root: Path,
    classes: list[Path],
    *,
    skipped: list[tuple[str, str]],
    on_error: str,
    resize: int | None,
    check: str,
    batch_rows: int,
    num_workers: int,
) -> tuple[pa.Schema, Iterator[pa.RecordBatch], int | None]:
    """``root/<class>/<image>``: image bytes, int64 label (sorted class order), relative path."""
    files = image_files(root, classes)
    if not files:
        raise ValueError(
            f"{os.fspath(root)!r} has class folders but no images ({', '.join(IMAGE_SUFFIXES)})"
        )
    names = [c.name for c in classes]
    prefix = len(os.path.join(os.fspath(root), ""))
    schema = pa.schema(
        [("image", pa.binary()), ("label", pa.int64()), ("path", pa.string())],
        metadata={CLASSES_KEY: json.dumps(names).encode()},
    )

    def read(items: list[tuple[str, int]]) -> list[tuple[bytes | None, str]]:
        return read_images(items, resize, check)

    def stream() -> Iterator[pa.RecordBatch]:
        # The next chunk is read while Lance writes this one (its encoding runs without the GIL).
        with concurrent.futures.ThreadPoolExecutor(num_workers) as pool:

            def submit(start: int) -> tuple[list[tuple[str, int]], list[Any]]:
                chunk = files[start : start + batch_rows]
                step = -(-len(chunk) // num_workers)  # one slice of the chunk per thread
                return chunk, [
                    pool.submit(read, chunk[i : i + step]) for i in range(0, len(chunk), step)
                ]

            starts = range(0, len(files), batch_rows)
            ahead = submit(0)
            for k in range(len(starts)):
                chunk, parts = ahead
                read_back = [r for part in parts for r in part.result()]
                if k + 1 < len(starts):
                    ahead = submit(starts[k + 1])
                images, labels, paths = [], [], []
                for (image, label), (data, why) in zip(chunk, read_back, strict=True):
                    relative = image[prefix:]
                    if data is None:
                        if on_error == "raise":
                            raise ValueError(
                                f"cannot read the image {image!r} "
                                f"({why}); fix or remove it, or pass "
                                "on_error='skip'"
                            )
                        skipped.append((relative, why))
                        continue
                    images.append(data)
                    labels.append(label)
                    paths.append(relative)
                yield pa.record_batch(
                    [
                        pa.array(images, pa.binary()),
                        pa.array(labels, pa.int64()),
                        pa.array(paths, pa.string()),
                    ],
                    schema=schema,
                )

    return schema, stream(), len(files)


def read_images(
    items: list[tuple[str, int]], resize: int | None, check: str = "structure"
) -> list[tuple[bytes | None, str]]:
    """For each ``(path, label)``: the image's bytes (checked, or re-encoded with ``resize``:
    see :func:`checked_image`) and ``""``, or ``None`` and why it cannot be read."""
    out: list[tuple[bytes | None, str]] = []
    for image, _ in items:
        try:
            with open(image, "rb") as file:
                out.append((checked_image(file.read(), resize, check), ""))
        except Exception as exc:  # PIL raises several types for damaged files
            why = re.sub(r" <_io\.BytesIO object at 0x[0-9a-f]+>", "", str(exc))
            out.append((None, f"{type(exc).__name__}: {why}"))
    return out


def image_files(root: Path, classes: list[Path]) -> list[tuple[str, int]]:
    """Every image under each class folder, with the class's number: classes in the given
    order, files sorted by path within each (strings: ``Path`` sorting costs 10x more)."""
    files: list[tuple[str, int]] = []
    for label, folder in enumerate(classes):
        found = []
        for directory, _, names in os.walk(os.fspath(folder)):
            found.extend(
                os.path.join(directory, name)
                for name in names
                if os.path.splitext(name)[1].lower() in IMAGE_SUFFIXES
            )
        files.extend((path, label) for path in sorted(found))
    return files


def _from_hugging_face(
    dataset: Any, batch_rows: int
) -> tuple[pa.Schema, Iterator[pa.RecordBatch], int | None]:
    """A ``datasets.Dataset``: its Arrow table, with Image/Audio columns as their bytes and
    ClassLabel columns int64 (names in the schema metadata)."""
    table: pa.Table = dataset.data.table if hasattr(dataset.data, "table") else dataset.data
    metadata: dict[bytes, bytes] = {}
    columns, fields = [], []
    for name, feature in dataset.features.items():
        column = table.column(name)
        kind = type(feature).__name__
        if kind in ("Image", "Audio"):
            column = pa.chunked_array(
                [_bytes_of(chunk, name) for chunk in column.chunks], pa.binary()
            )
        elif kind == "ClassLabel":
            column = column.cast(pa.int64())
            metadata[f"lanceloader.classes.{name}".encode()] = json.dumps(feature.names).encode()
            if name in LABEL_COLUMNS:
                metadata[CLASSES_KEY] = json.dumps(feature.names).encode()
        columns.append(column)
        fields.append(pa.field(name, column.type))
    schema = pa.schema(fields, metadata=metadata or None)
    converted = pa.Table.from_arrays(columns, schema=schema)
    return schema, iter(converted.to_batches(max_chunksize=batch_rows)), converted.num_rows


def _bytes_of(chunk: pa.Array, name: str) -> pa.Array:
    """An Image/Audio struct array (``bytes``, ``path``) as its bytes, read from ``path`` where
    the bytes are missing."""
    data = chunk.field("bytes").to_pylist()
    paths = chunk.field("path").to_pylist()
    out = []
    for value, path in zip(data, paths, strict=True):
        if value is None and path:
            value = Path(path).read_bytes()
        if value is None:
            raise ValueError(f"column {name!r}: a row has neither bytes nor a readable path")
        out.append(value)
    return pa.array(out, pa.binary())


# --- labels ---------------------------------------------------------------------------------


def int64_labels(schema: pa.Schema) -> pa.Schema:
    """``schema`` with integer ``label``/``labels`` columns as int64 (what ``cross_entropy``
    wants); cast batches or tables to it."""
    for i, f in enumerate(schema):
        if f.name in LABEL_COLUMNS and pa.types.is_integer(f.type) and f.type != pa.int64():
            schema = schema.set(i, f.with_type(pa.int64()))
    return schema
