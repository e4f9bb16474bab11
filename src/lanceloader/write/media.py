"""Ingest of a folder of videos or of audio files: what ``convert("videos/", "out.lance")`` reads.

A folder whose media files (by extension: :data:`VIDEO_SUFFIXES`, :data:`AUDIO_SUFFIXES`) are all
videos or all audio becomes one row per file:

* ``video`` or ``audio``: the file's bytes as they are (an MP4 without faststart too: the index
  records where its ``moov`` box is), a Lance blob column (blob v2: each value out of line,
  read by ranges);
* ``path``: the file's path relative to the folder;
* ``label`` (int64, class names in the schema metadata as for images) when every file sits in
  a class folder (``root/<class>/<file>``), or the columns of a ``labels=`` file: a CSV with a
  ``path``, ``file``, ``filename`` or ``name`` column, or a JSON object ``{name: label}`` or
  ``{name: {column: value}}`` (or a list of records with such a key). A name matches a file's
  relative path, else its file name; a string ``label`` column becomes int64 with its sorted
  class names in the metadata. With ``labels=``, class folders are not labels;
* for video, the keyframe index of :mod:`lanceloader.media.video` (``video_frames``,
  ``video_fps``, …, ``video_keyframes``, ``video_keyframe_offsets``, ``video_header_offset``);
  for audio ``audio_sample_rate``, ``audio_channels``, ``audio_frames``, ``audio_duration``,
  ``audio_codec`` and the byte index of :mod:`lanceloader.media.audio_ranges`
  (``audio_seek_samples``, ``audio_seek_offsets``, ``audio_header_offset``,
  ``audio_header_length``, ``audio_preroll``), so ``ll.audio_clips`` reads only each window's
  bytes.

Each file is read once and probed (demuxed, not decoded) in a pool of ``num_workers`` threads;
a file that cannot be probed, a file without a row in the labels and a labels row naming no
file are skipped and listed in the summary with their reason (``on_error="raise"``: a
``ValueError`` naming the file). Memory: the batch being written and the next one being read,
each at most :data:`MEDIA_BATCH_BYTES` of files (or one file, when it is larger).

Example:
    >>> import sys, tempfile, pathlib, lance
    >>> sys.path.insert(0, "tests")
    >>> from mediagen import write_video
    >>> from lanceloader.write.convert import convert
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> _ = write_video(root / "videos" / "a.mp4", 8, 4, (48, 64), gop=4)
    >>> summary = convert(root / "videos", root / "videos.lance", progress=False)
    >>> row = lance.dataset(root / "videos.lance").to_table(columns=["path", "video_frames",
    ...     "video_keyframes"]).to_pylist()
    >>> summary.rows, row
    (1, [{'path': 'a.mp4', 'video_frames': 8, 'video_keyframes': [0, 4]}])
"""

from __future__ import annotations

import concurrent.futures
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv

from lanceloader.media import audio_ranges
from lanceloader.media.video import index_fields, index_values, probe_video
from lanceloader.write.tables import with_blob_columns

VIDEO_SUFFIXES = (".mp4", ".m4v", ".mov", ".mkv", ".webm", ".avi")
AUDIO_SUFFIXES = (".wav", ".flac", ".mp3", ".opus", ".ogg", ".m4a", ".aac")
MEDIA_BATCH_ROWS = 256  # files per batch written to Lance
MEDIA_BATCH_BYTES = 64 << 20  # and at most this many bytes of files (or one larger file)
KEY_COLUMNS = ("path", "file", "filename", "name")  # a labels file's column naming the file
CLASSES_KEY = b"lanceloader.classes"  # class names: the key of an ImageFolder's (convert.py)
KINDS_LOOKED_AT = 1000  # files media_kind looks at to tell a media folder (the rest: skipped)


def media_kind(
    root: Path, skip_dir: Callable[[Path], bool], other_suffixes: tuple[str, ...] = ()
) -> str | None:
    """``"video"`` or ``"audio"`` when the first :data:`KINDS_LOOKED_AT` known files under
    ``root`` (folders where ``skip_dir`` is true left out) include media files, all of one kind
    and none with ``other_suffixes`` (images, tables: another converter's); ``None`` when there
    are no media files. Mixed kinds raise ``ValueError`` naming them and the fix.

    Example:
        >>> import tempfile, pathlib
        >>> root = pathlib.Path(tempfile.mkdtemp())
        >>> _ = (root / "a.flac").write_bytes(b"")
        >>> media_kind(root, lambda path: False)
        'audio'
    """
    seen: dict[str, str] = {}  # kind -> an example file
    looked = 0
    for name in _names_under(root, skip_dir):
        suffix = os.path.splitext(name)[1].lower()
        kind = _kind_of(name) or ("other" if suffix in other_suffixes else None)
        if kind is not None:
            seen.setdefault(kind, name)
            looked += 1
            if looked >= KINDS_LOOKED_AT:
                break
    media = sorted(seen.keys() - {"other"})
    if len(seen) > 1 and media:
        raise ValueError(
            f"{os.fspath(root)!r} mixes kinds of files ({', '.join(sorted(seen.values()))}): "
            "convert videos, audio files and images each from a folder of their own"
        )
    return media[0] if media else None


def _kind_of(name: str) -> str | None:
    suffix = os.path.splitext(name)[1].lower()
    return "video" if suffix in VIDEO_SUFFIXES else "audio" if suffix in AUDIO_SUFFIXES else None


def _names_under(root: Path, skip_dir: Callable[[Path], bool]) -> Iterator[str]:
    """Paths (POSIX) of the files under ``root``, relative to it, each folder's in sorted order,
    hidden files left out."""
    for directory, folders, names in os.walk(root):
        folders[:] = sorted(f for f in folders if not skip_dir(Path(directory, f)))
        relative = Path(os.path.relpath(directory, root))
        for name in sorted(names):
            if not name.startswith("."):
                yield (relative / name).as_posix()


def read_labels(path: str | os.PathLike) -> tuple[pa.Table, str]:
    """A labels file as a table and the name of its key column (the file names).

    CSV: a ``path``/``file``/``filename``/``name`` column plus any others. JSON: ``{name:
    label}``, ``{name: {column: value}}`` or ``[{"path": name, column: value}, …]``.

    Example:
        >>> import tempfile, pathlib
        >>> labels = pathlib.Path(tempfile.mkdtemp()) / "labels.json"
        >>> _ = labels.write_text('{"a.mp4": "cat", "b.mp4": "dog"}')
        >>> table, key = read_labels(labels)
        >>> key, table.to_pylist()[0]
        ('path', {'path': 'a.mp4', 'label': 'cat'})
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"labels={os.fspath(path)!r} does not exist: give a CSV or JSON file"
        )
    suffix = path.suffix.lower()
    try:
        if suffix in (".csv", ".tsv"):
            table = pyarrow.csv.read_csv(
                path,
                parse_options=pyarrow.csv.ParseOptions(delimiter="\t" if suffix == ".tsv" else ","),
            )
        elif suffix == ".json":
            table = pa.Table.from_pylist(_json_records(json.loads(path.read_text())))
        else:
            raise ValueError("it is neither .csv, .tsv nor .json: rename it if it is one")
    except (pa.ArrowException, ValueError, TypeError) as error:
        raise ValueError(f"labels={os.fspath(path)!r} cannot be read: {error}") from error
    keys = [name for name in KEY_COLUMNS if name in table.column_names]
    if not keys:
        raise ValueError(
            f"labels={os.fspath(path)!r} has the columns {table.column_names} but none naming "
            f"the files: add a column called one of {KEY_COLUMNS}"
        )
    key = keys[0]
    table = table.set_column(table.column_names.index(key), key, table[key].cast(pa.string()))
    return table, key


def _json_records(value: Any) -> list[dict[str, Any]]:
    if isinstance(value, list) and all(isinstance(v, dict) for v in value):
        return value
    if isinstance(value, dict):
        return [
            {"path": name, **(v if isinstance(v, dict) else {"label": v})}
            for name, v in value.items()
        ]
    raise ValueError(
        "its JSON is neither {name: label}, {name: {column: value}} nor a list of records"
    )


def _label_columns(
    table: pa.Table, key: str
) -> tuple[list[pa.Field], dict[str, dict[str, Any]], dict[bytes, bytes]]:
    """The labels' fields (without the key), rows by name, and schema metadata (class names of
    a string ``label`` column, which becomes int64)."""
    metadata: dict[bytes, bytes] = {}
    if "label" in table.column_names and pa.types.is_string(table["label"].type):
        names = sorted({v for v in table["label"].to_pylist() if v is not None})
        number = {name: i for i, name in enumerate(names)}
        codes = pa.array([number.get(v) for v in table["label"].to_pylist()], pa.int64())
        table = table.set_column(table.column_names.index("label"), "label", codes)
        metadata[CLASSES_KEY] = json.dumps(names).encode()
    fields = [f for f in table.schema if f.name != key]
    rows: dict[str, dict[str, Any]] = {}
    for row in table.to_pylist():
        name = row.pop(key)
        if name in rows:
            raise ValueError(f"the labels name {name!r} twice: keep one row per file")
        rows[name] = row
    return fields, rows, metadata


def from_media_folder(
    root: Path,
    kind: str,
    *,
    labels: str | os.PathLike | None,
    skip_dir: Callable[[Path], bool],
    skipped: list[tuple[str, str]],
    on_error: str,
    resize: int | None = None,
    batch_rows: int | None = None,
    num_workers: int = 1,
    labelled: dict[str, int] | None = None,
) -> tuple[pa.Schema, Iterator[pa.RecordBatch], int | None]:
    """The schema, a stream of batches and the number of files of a folder of ``kind``
    (``"video"`` or ``"audio"``) files: see the module's text. ``skip_dir`` says which folders
    to leave out (Lance datasets, the output). ``labelled``: filled, as the stream runs, with
    the files written per label (class folder, or the labels file's ``label``; without one,
    the files that matched a row of the labels file), for the summary."""
    if resize is not None:
        raise ValueError(
            f"resize={resize} re-encodes images; {kind} files are stored as they are: drop it "
            "(a clip reader resizes when it decodes)"
        )
    files = []
    for name in sorted(_names_under(root, skip_dir)):
        if _kind_of(name) == kind:
            files.append(name)
        else:
            skipped.append((name, f"not a {kind} file ({', '.join(_suffixes(kind))})"))
    fields: list[pa.Field] = [pa.field(kind, pa.binary()), pa.field("path", pa.string())]
    metadata: dict[bytes, bytes] = {}
    rows: dict[str, dict[str, Any]] = {}
    classes: dict[str, int] = {}
    if labels is not None:
        table, key = read_labels(labels)
        label_fields, rows, metadata = _label_columns(table, key)
        fields += label_fields
        files = _with_labels(files, rows, Path(labels).name, skipped)
    elif files and all("/" in name for name in files):  # root/<class>/<file>
        names = sorted({name.split("/", 1)[0] for name in files})
        classes = {name: i for i, name in enumerate(names)}
        fields.append(pa.field("label", pa.int64()))
        metadata[CLASSES_KEY] = json.dumps(names).encode()
    probed = index_fields(kind) if kind == "video" else audio_ranges.index_fields(kind)
    taken = {f.name for f in probed} | {kind, "path"}
    clashes = [f.name for f in fields[2:] if f.name in taken]
    if clashes:
        raise ValueError(
            f"labels={os.fspath(labels)!r} has the columns {clashes}, which convert writes itself: "
            "rename them in the labels file"
        )
    fields += probed
    schema = with_blob_columns(pa.schema(fields, metadata=metadata or None), [kind])
    batch_rows = min(batch_rows or MEDIA_BATCH_ROWS, MEDIA_BATCH_ROWS)

    def row_of(name: str) -> dict[str, Any] | None:
        try:
            data = (root / name).read_bytes()
            values = _probe(data, kind)
        except Exception as error:  # PyAV, libsndfile and the OS raise many types
            if on_error == "raise":
                raise ValueError(
                    f"cannot read the {kind} file {os.fspath(root / name)!r} ({error}); fix or "
                    "remove it, or pass on_error='skip'"
                ) from error
            skipped.append((name, f"{type(error).__name__}: {error}"))
            return None
        row = {kind: data, "path": name, **rows.get(name, rows.get(Path(name).name, {}))}
        if classes:
            row["label"] = classes[name.split("/", 1)[0]]
        return {**row, **values}

    def chunks() -> Iterator[list[str]]:
        chunk: list[str] = []
        size = 0
        for name in files:
            chunk.append(name)
            size += os.path.getsize(root / name)
            if len(chunk) >= batch_rows or size >= MEDIA_BATCH_BYTES:
                yield chunk
                chunk, size = [], 0
        if chunk:
            yield chunk

    count = _label_counter(labelled, schema, labels, classes)

    def stream() -> Iterator[pa.RecordBatch]:
        # The next chunk is read and probed while Lance writes this one.
        with concurrent.futures.ThreadPoolExecutor(max(num_workers, 1)) as pool:
            pending = None
            for chunk in chunks():
                ahead = pool.map(row_of, chunk)  # submitted now, results in order
                if pending is not None:
                    yield _batch(pending, schema, count)
                pending = ahead
            if pending is not None:
                yield _batch(pending, schema, count)

    return schema, stream(), len(files)


def _batch(rows: Any, schema: pa.Schema, count: Callable[[dict[str, Any]], None]) -> pa.RecordBatch:
    kept = [row for row in rows if row is not None]
    for row in kept:
        count(row)
    return pa.RecordBatch.from_pylist(kept, schema=schema)


def _label_counter(
    labelled: dict[str, int] | None,
    schema: pa.Schema,
    labels: str | os.PathLike | None,
    classes: dict[str, int],
) -> Callable[[dict[str, Any]], None]:
    """What counts a written row in ``labelled``: under its label's name (class names from
    the schema's metadata), ``"(no label)"`` for a missing one; without a ``label`` column,
    under ``"a row of <labels file>"``."""
    if labelled is None or (labels is None and not classes):
        return lambda row: None
    names = json.loads((schema.metadata or {}).get(CLASSES_KEY, b"[]"))
    matched = f"a row of {Path(labels).name}" if labels is not None else ""

    def count(row: dict[str, Any]) -> None:
        if "label" not in schema.names:
            key = matched
        else:
            label = row.get("label")
            key = "(no label)" if label is None else (
                names[label] if names and isinstance(label, int) and 0 <= label < len(names)
                else str(label)
            )  # fmt: skip
        labelled[key] = labelled.get(key, 0) + 1

    return count


def _suffixes(kind: str) -> tuple[str, ...]:
    return VIDEO_SUFFIXES if kind == "video" else AUDIO_SUFFIXES


def _with_labels(
    files: list[str], rows: dict[str, dict[str, Any]], source: str, skipped: list
) -> list[str]:
    """The files that have a labels row (by relative path, else file name); the others and
    the rows naming no file are listed in ``skipped``."""
    kept, used = [], set()
    for name in files:
        key = name if name in rows else Path(name).name
        if key in rows:
            kept.append(name)
            used.add(key)
        else:
            skipped.append((name, f"no row in the labels file {source}"))
    skipped.extend(
        (f"{source}: {key}", "names no file in the folder") for key in rows if key not in used
    )
    return kept


def _probe(data: bytes, kind: str) -> dict[str, Any]:
    """The index columns of one file's bytes (raises for a file that cannot be probed)."""
    if kind == "video":
        return index_values(probe_video(data), kind)
    return audio_ranges.index_values(*audio_ranges.probe_audio_index(data), kind)
