"""Ingest: get data into Lance once, so that every epoch reads Lance.

:func:`convert` streams a source into a new Lance dataset (never loading all of it), with a
progress bar and a :class:`ConvertSummary` at the end. Sources:

* a folder of images in the ImageFolder layout (``root/<class>/<image>``): columns ``image``
  (the encoded bytes as they are, unless ``resize=`` re-encodes them), ``label`` (int64, the
  class's index in sorted order) and ``path`` (relative to the root); the class names in the
  schema metadata (``lanceloader.classes``). Files are read and checked in a thread pool; an
  unreadable image is skipped and listed (``on_error="raise"``: a ``ValueError`` naming it);
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
``mode="append"``.

>>> import pandas as pd, tempfile
>>> out = tempfile.mkdtemp() + "/table.lance"
>>> summary = convert(pd.DataFrame({"x": [1.0, 2.0, 3.0], "label": [0, 1, 0]}), out,
...                   progress=False)
>>> summary.rows, lance.dataset(out).schema.field("label").type
(3, DataType(int64))
"""

from __future__ import annotations

import concurrent.futures
import io
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
import pyarrow.parquet as pq
from tqdm import tqdm

from lanceloader.arguments import check_int, check_storage_options

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff")
LABEL_COLUMNS = ("label", "labels")
CLASSES_KEY = b"lanceloader.classes"
MODES = ("create", "overwrite", "append")
TABLE_BATCH_ROWS = 65_536  # rows per batch streamed to Lance (bigger batches: fewer calls)
IMAGE_BATCH_ROWS = 1024  # image files read (in parallel) and written together


@dataclass(frozen=True)
class ConvertSummary:
    """What :func:`convert` wrote: ``print(summary)`` says it in one paragraph.

    ``skipped`` lists ``(item, reason)`` of each input left out (an unreadable image).
    """

    uri: str
    version: int
    rows: int
    nbytes: int
    seconds: float
    skipped: tuple[tuple[str, str], ...] = field(default=())

    def __str__(self) -> str:
        rate = self.rows / self.seconds if self.seconds > 0 else 0.0
        text = (f"wrote {self.rows:,} rows ({self.nbytes / 1e6:,.1f} MB of Arrow data) to "
                f"{self.uri!r}, version {self.version}, in {self.seconds:.1f} s "
                f"({rate:,.0f} rows/s)")
        if not self.skipped:
            return text + "; nothing skipped"
        shown = "; ".join(f"{item}: {why}" for item, why in self.skipped[:10])
        more = f"; and {len(self.skipped) - 10} more" if len(self.skipped) > 10 else ""
        return text + f"; skipped {len(self.skipped)}: {shown}{more}"


def convert(source: Any, out_uri: str | os.PathLike[str], *, mode: str = "create",
            on_error: str = "skip", resize: int | None = None, batch_rows: int | None = None,
            max_rows_per_file: int = 1024 * 1024, num_workers: int | None = None,
            storage_options: dict[str, str] | None = None,
            progress: bool | None = None) -> ConvertSummary:
    """Write ``source`` (see the module's text) to a new Lance dataset at ``out_uri``.

    Args:
        mode: ``"create"`` (the default: an existing dataset is an error), ``"overwrite"``
            (a new version replaces the data) or ``"append"``.
        on_error: ``"skip"`` an unreadable image and list it in the summary, or ``"raise"``.
        resize: images only: re-encode every image as JPEG with its longer side at most this
            many pixels; default: keep the bytes as they are.
        batch_rows: rows per batch streamed to Lance; default 65,536 (images: 1,024 files read
            together).
        max_rows_per_file: rows per Lance data file (a fragment).
        num_workers: threads reading and checking images; default 1 (reading small local
            files is bound by Python, not the disk: 2 threads ran 0.8x one on 2 cores), and the
            number of cores with ``resize`` (decoding releases the GIL) — raise it for a network
            filesystem.
        storage_options: for an object-store ``out_uri``, passed to Lance.
        progress: show a progress bar on stderr; default when stderr is a terminal.

    Returns:
        a :class:`ConvertSummary` (rows, bytes, seconds, what was skipped and why).
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if on_error not in ("skip", "raise"):
        raise ValueError(f"on_error must be 'skip' or 'raise', got {on_error!r}")
    if batch_rows is not None:
        check_int("batch_rows", batch_rows, minimum=1)
    check_int("max_rows_per_file", max_rows_per_file, minimum=1)
    if resize is not None:
        check_int("resize", resize, minimum=1)
    check_storage_options(storage_options)
    out = os.fspath(out_uri)
    if mode == "create" and dataset_version(out, storage_options) is not None:
        raise FileExistsError(f"{out!r} already holds a Lance dataset; pass mode='overwrite' to "
                              "replace its data (a new version) or mode='append' to add rows")
    skipped: list[tuple[str, str]] = []
    schema, batches, total = _open_source(source, skipped=skipped, on_error=on_error,
                                          resize=resize, batch_rows=batch_rows,
                                          num_workers=num_workers or (
                                              os.cpu_count() or 1 if resize else 1))
    started = time.perf_counter()
    counted = {"rows": 0, "bytes": 0}
    show = sys.stderr.isatty() if progress is None else progress
    bar = tqdm(total=total, unit="row", desc="convert", file=sys.stderr, disable=not show)

    failed: list[BaseException] = []  # an error of the source, raised as itself (not Lance's)
    target = int64_labels(schema)

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
        ds = lance.write_dataset(pa.RecordBatchReader.from_batches(target, stream()), out,
                                 schema=target, mode=mode, max_rows_per_file=max_rows_per_file,
                                 storage_options=storage_options)
    except Exception:
        if failed:
            raise failed[0] from None
        raise
    finally:
        bar.close()
    return ConvertSummary(out, ds.version, counted["rows"], counted["bytes"],
                          time.perf_counter() - started, tuple(skipped))


def dataset_version(uri: str, storage_options: dict[str, str] | None = None) -> int | None:
    """The latest version of the Lance dataset at ``uri``, or None when there is none."""
    try:
        return lance.dataset(uri, storage_options=storage_options).version
    except (ValueError, OSError, RuntimeError):
        return None


# --- sources --------------------------------------------------------------------------------

def _open_source(source: Any, **options: Any
                 ) -> tuple[pa.Schema, Iterator[pa.RecordBatch], int | None]:
    """The schema, a stream of batches and (when known) the row count of ``source``."""
    batch_rows = options["batch_rows"] = options["batch_rows"] or TABLE_BATCH_ROWS
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
        return (source.schema, source.to_batches(batch_size=batch_rows),
                source.count_rows())
    if not isinstance(source, str | os.PathLike):
        raise TypeError(f"cannot convert a {kind}: give a folder of images, Parquet or CSV "
                        "files, a pandas DataFrame, a pyarrow Table or Dataset, or a Hugging "
                        "Face datasets.Dataset")
    path = Path(source)
    if not path.exists():
        raise FileNotFoundError(f"{os.fspath(path)!r} does not exist")
    if path.is_dir() and (path / "_versions").is_dir():
        raise ValueError(f"{os.fspath(path)!r} is already a Lance dataset: pass it to "
                         "ll.Loader as it is (or ll.materialize a filtered or shuffled copy)")
    if path.is_dir() and ((path / "dataset_info.json").exists() or (path / "state.json").exists()):
        import datasets  # a Hugging Face save_to_disk directory

        return _from_hugging_face(datasets.load_from_disk(os.fspath(path)), batch_rows)
    if path.is_file():
        return _from_files([path], batch_rows)
    files = sorted(p for p in path.rglob("*") if p.suffix.lower() in (".parquet", ".csv", ".tsv"))
    classes = sorted(p for p in path.iterdir() if p.is_dir())
    if files and not classes:
        return _from_files(files, batch_rows)
    if classes:
        if options["batch_rows"] == TABLE_BATCH_ROWS:
            options["batch_rows"] = IMAGE_BATCH_ROWS
        return _from_image_folder(path, classes, **options)
    raise ValueError(f"{os.fspath(path)!r} holds no Parquet or CSV files and no class folders "
                     "of images (root/<class>/<image>)")


def _from_files(files: list[Path], batch_rows: int
                ) -> tuple[pa.Schema, Iterator[pa.RecordBatch], int | None]:
    """Parquet or CSV files, streamed in order; every file's schema must be the first's."""
    kinds = {"parquet" if f.suffix.lower() == ".parquet" else "csv" for f in files}
    if len(kinds) > 1:
        raise ValueError(f"mixes Parquet and CSV files ({files[0]}, ...): convert each kind "
                         "separately")
    if kinds == {"parquet"}:
        first = pq.read_schema(files[0])
        for other in files[1:]:
            schema = pq.read_schema(other)
            if not schema.equals(first, check_metadata=False):
                raise ValueError(_schema_mismatch(files[0], first, other, schema))
        data = pyarrow.dataset.dataset([os.fspath(f) for f in files], schema=first,
                                       format="parquet")
        return first, data.to_batches(batch_size=batch_rows), data.count_rows()

    def csv_reader(path: Path) -> pa.RecordBatchReader:
        parse = pyarrow.csv.ParseOptions(delimiter="\t" if path.suffix.lower() == ".tsv" else ",")
        return pyarrow.csv.open_csv(path, parse_options=parse,
                                    read_options=pyarrow.csv.ReadOptions(block_size=1 << 22))

    readers = [csv_reader(files[0])]
    first = readers[0].schema
    for other in files[1:]:
        reader = csv_reader(other)
        if not reader.schema.equals(first):
            raise ValueError(_schema_mismatch(files[0], first, other, reader.schema))
        readers.append(reader)

    def stream() -> Iterator[pa.RecordBatch]:
        for reader in readers:
            yield from reader
    return first, stream(), None


def _schema_mismatch(a: Path, schema_a: pa.Schema, b: Path, schema_b: pa.Schema) -> str:
    fields_a = {f.name: str(f.type) for f in schema_a}
    fields_b = {f.name: str(f.type) for f in schema_b}
    differ = sorted(n for n in fields_a.keys() | fields_b.keys()
                    if fields_a.get(n) != fields_b.get(n))
    shown = ", ".join(f"{n}: {fields_a.get(n, 'missing')} vs {fields_b.get(n, 'missing')}"
                      for n in differ[:6])
    return (f"the files disagree on their schema: {os.fspath(a)!r} and {os.fspath(b)!r} ({shown}); "
            "make them agree (or convert them separately)")


def _from_image_folder(root: Path, classes: list[Path], *, skipped: list[tuple[str, str]],
                       on_error: str, resize: int | None, batch_rows: int, num_workers: int
                       ) -> tuple[pa.Schema, Iterator[pa.RecordBatch], int | None]:
    """``root/<class>/<image>``: image bytes, int64 label (sorted class order), relative path."""
    files = image_files(root, classes)
    if not files:
        raise ValueError(f"{os.fspath(root)!r} has class folders but no images "
                         f"({', '.join(IMAGE_SUFFIXES)})")
    names = [c.name for c in classes]
    prefix = len(os.path.join(os.fspath(root), ""))
    schema = pa.schema([("image", pa.binary()), ("label", pa.int64()), ("path", pa.string())],
                       metadata={CLASSES_KEY: json.dumps(names).encode()})

    def read(items: list[tuple[str, int]]) -> list[tuple[bytes | None, str]]:
        return read_images(items, resize)

    def stream() -> Iterator[pa.RecordBatch]:
        with concurrent.futures.ThreadPoolExecutor(num_workers) as pool:
            for start in range(0, len(files), batch_rows):
                chunk = files[start:start + batch_rows]
                step = -(-len(chunk) // num_workers)  # one slice of the chunk per thread
                read_back = [r for part in pool.map(read, [chunk[i:i + step] for i in
                                                           range(0, len(chunk), step)])
                             for r in part]
                images, labels, paths = [], [], []
                for (image, label), (data, why) in zip(chunk, read_back, strict=True):
                    relative = image[prefix:]
                    if data is None:
                        if on_error == "raise":
                            raise ValueError(f"cannot read the image {image!r} "
                                             f"({why}); fix or remove it, or pass "
                                             "on_error='skip'")
                        skipped.append((relative, why))
                        continue
                    images.append(data)
                    labels.append(label)
                    paths.append(relative)
                yield pa.record_batch([pa.array(images, pa.binary()),
                                       pa.array(labels, pa.int64()),
                                       pa.array(paths, pa.string())], schema=schema)
    return schema, stream(), len(files)


def read_images(items: list[tuple[str, int]], resize: int | None
                ) -> list[tuple[bytes | None, str]]:
    """For each ``(path, label)``: the image's bytes (checked, or re-encoded with ``resize``:
    see :func:`_checked_image`) and ``""``, or ``None`` and why it cannot be read."""
    out: list[tuple[bytes | None, str]] = []
    for image, _ in items:
        try:
            with open(image, "rb") as file:
                out.append((_checked_image(file.read(), resize), ""))
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
            found.extend(os.path.join(directory, name) for name in names
                         if os.path.splitext(name)[1].lower() in IMAGE_SUFFIXES)
        files.extend((path, label) for path in sorted(found))
    return files


def _checked_image(data: bytes, resize: int | None) -> bytes:
    """``data`` if it is a whole image (or, with ``resize``, re-encoded as JPEG with its longer
    side at most ``resize``); raises ``ValueError`` for a damaged or truncated file.

    JPEG and PNG, most images, are checked by their markers (start, and end: what truncation
    loses), in a microsecond; Pillow's ``verify`` does no more for them (it does not decode the
    pixels either) at 60 µs an image. Other formats go through ``verify``.

    >>> _checked_image(b"\\xff\\xd8 ... \\xff\\xd9", None)[:2]
    b'\\xff\\xd8'
    >>> _checked_image(b"\\xff\\xd8 ... cut", None)
    Traceback (most recent call last):
    ...
    ValueError: a JPEG without its end marker (truncated)
    """
    if resize is None:
        if data[:2] == b"\xff\xd8":
            if data.rstrip(b"\x00")[-2:] != b"\xff\xd9":
                raise ValueError("a JPEG without its end marker (truncated)")
            return data
        if data[:8] == b"\x89PNG\r\n\x1a\n":
            if data[-12:-8] != b"\x00\x00\x00\x00" or data[-8:-4] != b"IEND":
                raise ValueError("a PNG without its IEND chunk (truncated)")
            return data
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        if resize is None:
            image.verify()  # headers and structure, without decoding the pixels
            return data
        image = image.convert("RGB")
        image.thumbnail((resize, resize))
        out = io.BytesIO()
        image.save(out, format="JPEG", quality=90)
        return out.getvalue()


def _from_hugging_face(dataset: Any, batch_rows: int
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
            column = pa.chunked_array([_bytes_of(chunk, name) for chunk in column.chunks],
                                      pa.binary())
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
