"""The sources ``convert`` reads, each opened as ``(schema, stream of batches, rows if
known)``: a folder of images in the ImageFolder layout, Parquet or CSV files, a media folder
(:mod:`lanceloader.write.media`), Arrow and pandas objects, and Hugging Face datasets. Folders
are walked by :mod:`lanceloader.write.folders` (links followed, loops and Lance datasets
skipped and listed).

>>> import pyarrow as pa
>>> schema, batches, rows = open_source(pa.table({"x": [1, 2]}), skipped=[], on_error="skip",
...     resize=None, batch_rows=None, check="structure", exclude=None, labels=None,
...     num_workers=1)
>>> schema.names, rows
(['x'], 2)
"""

from __future__ import annotations

import concurrent.futures
import functools
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset

from lanceloader.write.folders import class_folders, files_under, is_lance_dataset
from lanceloader.write.image_checks import checked_image
from lanceloader.write.media import from_media_folder, media_kind
from lanceloader.write.tables import from_files

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff")
TABLE_SUFFIXES = (".parquet", ".csv", ".tsv")
LABEL_COLUMNS = ("label", "labels")
CLASSES_KEY = b"lanceloader.classes"
TABLE_BATCH_ROWS = 65_536  # rows per batch streamed to Lance (bigger batches: fewer calls)
IMAGE_BATCH_ROWS = 1024  # image files read (in parallel) and written together
MEDIA_OPTIONS = ("skipped", "on_error", "resize", "batch_rows", "num_workers")  # for media folders


def open_source(
    source: Any, **options: Any
) -> tuple[pa.Schema, Iterator[pa.RecordBatch], int | None]:
    """The schema, a stream of batches and (when known) the row count of ``source``."""
    batch_rows = options["batch_rows"] = options["batch_rows"] or TABLE_BATCH_ROWS
    exclude = options.pop("exclude")
    labels = options.pop("labels")
    labelled = options.pop("labelled", None)  # media folders: files per label, for the summary
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
    if path.is_dir() and is_lance_dataset(path):
        raise ValueError(
            f"{os.fspath(path)!r} is already a Lance dataset (or an unfinished Lance write): "
            "pass a dataset to ll.Loader as it is (or ll.materialize a filtered or shuffled copy)"
        )
    if path.is_dir() and ((path / "dataset_info.json").exists() or (path / "state.json").exists()):
        import datasets  # a Hugging Face save_to_disk directory

        return _from_hugging_face(datasets.load_from_disk(os.fspath(path)), batch_rows)
    skip = functools.partial(is_lance_dataset, output=exclude)
    kind = media_kind(path, skip, IMAGE_SUFFIXES + TABLE_SUFFIXES) if path.is_dir() else None
    if kind is not None:  # videos or audio: write/media.py
        media = {k: options[k] for k in MEDIA_OPTIONS}
        return from_media_folder(
            path, kind, labels=labels, skip_dir=skip, labelled=labelled, **media
        )
    if labels is not None:
        raise ValueError(f"labels= is for a folder of videos or audio files: {path} holds none")
    if path.is_file():
        return from_files([_table_file(path)], batch_rows)
    return _from_folder(path, exclude, options)


def _from_folder(
    path: Path, exclude: str | None, options: dict[str, Any]
) -> tuple[pa.Schema, Iterator[pa.RecordBatch], int | None]:
    """A folder of class folders of images, or of Parquet or CSV files (links followed; loops
    and Lance datasets skipped and listed)."""
    skipped: list[tuple[str, str]] = options["skipped"]
    below: list[tuple[str, str]] = []  # what the look for images left out
    classes = class_folders(path, below, exclude)
    images = image_files(path, classes, below, exclude)
    if images:
        skipped.extend(below)
        if options["batch_rows"] == TABLE_BATCH_ROWS:
            options["batch_rows"] = IMAGE_BATCH_ROWS
        return _from_image_folder(path, [c.name for c in classes], images, **options)
    anywhere: list[tuple[str, str]] = []  # what the look for table files left out
    files = [Path(f) for f in files_under(path, TABLE_SUFFIXES, anywhere, exclude)]
    if files:
        skipped.extend(anywhere)
        return from_files(files, options["batch_rows"])
    if classes:
        raise ValueError(
            f"{os.fspath(path)!r} has class folders but no images ({', '.join(IMAGE_SUFFIXES)})"
        )
    left_out = "; ".join(f"{item!r}: {why}" for item, why in anywhere[:5])
    raise ValueError(
        f"{os.fspath(path)!r} holds no Parquet or CSV files and no class folders "
        "of images (root/<class>/<image>)" + (f" (left out: {left_out})" if left_out else "")
    )


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
    names: list[str],
    files: list[tuple[str, int]],
    *,
    skipped: list[tuple[str, str]],
    on_error: str,
    resize: int | None,
    check: str,
    batch_rows: int,
    num_workers: int,
) -> tuple[pa.Schema, Iterator[pa.RecordBatch], int | None]:
    """``root/<class>/<image>`` (the classes' ``names`` and the ``files`` of
    :func:`image_files`): image bytes, int64 label (sorted class order), relative path."""
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


def image_files(
    root: Path,
    classes: list[Path],
    skipped: list[tuple[str, str]] | None = None,
    output: str | None = None,
) -> list[tuple[str, int]]:
    """Every image under each class folder (links followed: :func:`files_under`), with the
    class's number: classes in the given order, files sorted by path within each (strings:
    ``Path`` sorting costs 10x more). Folders left out go to ``skipped``."""
    files: list[tuple[str, int]] = []
    left_out: list[tuple[str, str]] = [] if skipped is None else skipped
    for label, folder in enumerate(classes):
        found = files_under(root, IMAGE_SUFFIXES, left_out, output, top=folder)
        files.extend((path, label) for path in found)
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
