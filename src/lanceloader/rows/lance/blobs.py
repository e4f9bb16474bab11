"""Lance blob columns: read as bytes by default, as file-like objects or descriptors by request.

A blob column (``lance.blob.blob_field``; ``lance-encoding:blob``) stores each value out of line.
Lance's scans and takes return *descriptors* for it (a struct of position, size, …), never the
payloads. The rows of a :class:`~lanceloader.rows.lance.source.Source` turn each projected blob column
into what its *choice* says (``ll.Source(uri, blobs={"video": "file"})``; default
``"bytes"``):

* ``"bytes"``: a ``large_binary`` column of the payloads, in the read's order: inline payloads
  of a local dataset in runs of rows straight from the data files (one ``pread`` a run into the
  column's buffer, :mod:`~lanceloader.rows.lance.inline_blobs`), the rest with Lance's planned
  ``read_blobs`` for the Lance row offsets of the read (batched: few requests on object
  storage). Null blobs stay null. Every output works on it (``decode_images``
  on a blob column of JPEGs included).
* ``"file"``: an ``int64`` column of the rows' Lance row offsets (null where the blob is null),
  tagged with the dataset; a transform opens them with :func:`blob_files`, which returns
  ``lance.BlobFile`` objects that read only the ranges asked for (video, audio).
* ``"descriptor"``: Lance's descriptor struct, as Lance returns it (only when asked for).

What runs where: the payloads (and the files' handles) are read in the worker that reads the
rows, through the Source's dataset pinned in that process; nothing here keeps a file open.
Pure helpers, except :func:`attach_blobs` and :func:`blob_files`, which read through Lance.

Example:
    >>> import pyarrow as pa
    >>> import lance.blob
    >>> schema = pa.schema([pa.field("id", pa.int64()), lance.blob.blob_field("video")])
    >>> blob_columns(schema)
    ['video']
    >>> rows_schema(schema, ["id", "video"], {"video": "bytes"}).field("video").type
    DataType(large_binary)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import lance
import numpy as np
import pyarrow as pa

from lanceloader.batch.nulls import BLOB_FILE_KEY
from lanceloader.rows.lance.inline_blobs import fragment_files, inline_plan, read_inline
from lanceloader.rows.protocol import StorageIO, batch_rows

BLOB_EXTENSION_NAME = "lance.blob.v2"
BLOB_METADATA_KEY = b"lance-encoding:blob"
BLOB_CHOICES = ("bytes", "file", "descriptor")
#: field metadata of a ``"file"`` column: the dataset (URI, version) its row offsets belong to
FILE_URI_KEY = BLOB_FILE_KEY  # b"lanceloader:blob-uri" (batch/nulls.py: no fill for them)
FILE_VERSION_KEY = b"lanceloader:blob-version"
#: what Lance's scans and takes return for a blob v2 column (pylance 14)
DESCRIPTOR_TYPE = pa.struct(
    [
        pa.field("kind", pa.uint8(), nullable=False),
        pa.field("position", pa.uint64(), nullable=False),
        pa.field("size", pa.uint64(), nullable=False),
        pa.field("blob_id", pa.uint32(), nullable=False),
        pa.field("blob_uri", pa.string(), nullable=False),
    ]
)


def is_blob_field(field: pa.Field) -> bool:
    """Whether ``field`` is a Lance blob column (blob v2 extension type or v1 metadata).

    Works on a dataset's schema (``extension<lance.blob.v2>``) and on the descriptor structs a
    scan returns (they keep the ``lance-encoding:blob`` metadata).

    Example:
        >>> import pyarrow as pa
        >>> is_blob_field(pa.field("b", pa.large_binary(), metadata={"lance-encoding:blob": "true"}))
        True
        >>> is_blob_field(pa.field("b", pa.large_binary()))
        False
    """
    field_type = field.type
    if isinstance(field_type, pa.BaseExtensionType) and (
        field_type.extension_name == BLOB_EXTENSION_NAME
    ):
        return True
    metadata = field.metadata or {}
    return metadata.get(BLOB_METADATA_KEY, b"").lower() == b"true"


def blob_columns(schema: pa.Schema) -> list[str]:
    """The names of the top-level blob columns of ``schema``, in schema order.

    Example:
        >>> import pyarrow as pa
        >>> import lance.blob
        >>> blob_columns(pa.schema([lance.blob.blob_field("a"), pa.field("b", pa.int32())]))
        ['a']
    """
    return [field.name for field in schema if is_blob_field(field)]


def check_blob_choices(
    blobs: Mapping[str, str] | None, schema: pa.Schema, columns: list[str]
) -> dict[str, str]:
    """The choice for every projected blob column: ``blobs``'s, else ``"bytes"``.

    A column that is not a projected blob column, or a choice outside :data:`BLOB_CHOICES`,
    raises ``ValueError`` naming it, the blob columns and the choices.

    Example:
        >>> import pyarrow as pa
        >>> import lance.blob
        >>> schema = pa.schema([lance.blob.blob_field("video"), pa.field("label", pa.int64())])
        >>> check_blob_choices({"video": "file"}, schema, ["video", "label"])
        {'video': 'file'}
        >>> check_blob_choices({"video": "stream"}, schema, ["video", "label"])
        Traceback (most recent call last):
        ...
        ValueError: blobs={'video': 'stream'}: 'stream' is not a way to read blob column 'video'; choose one of 'bytes' (the payloads, the default), 'file' (lance.BlobFile objects through ll.blob_files(batch, 'video')) or 'descriptor' (Lance's position/size structs)
    """
    if blobs is not None and not isinstance(blobs, Mapping):
        raise TypeError(
            f"blobs must be a dict {{column: choice}}, e.g. {{'video': 'file'}}; got "
            f"the {type(blobs).__name__} {blobs!r}"
        )
    projected = [c for c in blob_columns(schema) if c in columns]
    choices = dict.fromkeys(projected, "bytes")
    for column, choice in (blobs or {}).items():
        if column not in projected:
            what = (
                "is not among the columns read"
                if column in blob_columns(schema)
                else "is not a blob column of the dataset"
            )
            raise ValueError(
                f"blobs={dict(blobs or {})}: column {column!r} {what}; the blob "
                f"columns read are {projected} (choices: {list(BLOB_CHOICES)})"
            )
        if choice not in BLOB_CHOICES:
            raise ValueError(
                f"blobs={dict(blobs or {})}: {choice!r} is not a way to read blob column "
                f"{column!r}; choose one of 'bytes' (the payloads, the default), 'file' "
                f"(lance.BlobFile objects through ll.blob_files(batch, {column!r})) or "
                "'descriptor' (Lance's position/size structs)"
            )
        choices[column] = choice
    return choices


def rows_schema(
    schema: pa.Schema,
    columns: list[str],
    choices: Mapping[str, str],
    uri: str = "",
    version: int = 0,
) -> pa.Schema:
    """The schema of the rows read of ``columns``: each blob column as its choice makes it
    (``large_binary``; ``int64`` row offsets tagged with ``uri`` and ``version``; the
    descriptor struct), every other column as in ``schema``.

    Example:
        >>> import pyarrow as pa
        >>> import lance.blob
        >>> schema = pa.schema([lance.blob.blob_field("video")])
        >>> rows_schema(schema, ["video"], {"video": "file"}, "/d.lance", 3).field("video")
        pyarrow.Field<video: int64>
    """
    fields = []
    for column in columns:
        field = schema.field(column)
        choice = choices.get(column)
        if choice == "bytes":
            field = pa.field(column, pa.large_binary(), nullable=field.nullable)
        elif choice == "file":
            field = pa.field(
                column,
                pa.int64(),
                nullable=field.nullable,
                metadata={FILE_URI_KEY: uri.encode(), FILE_VERSION_KEY: str(version).encode()},
            )
        elif choice == "descriptor":
            field = pa.field(
                column,
                DESCRIPTOR_TYPE,
                nullable=field.nullable,
                metadata={BLOB_METADATA_KEY: b"true"},
            )
        fields.append(field)
    return pa.schema(fields)


def payload_bytes_per_row(descriptors: pa.Table, choices: Mapping[str, str]) -> float:
    """The mean payload bytes per row that the ``"bytes"`` columns of ``choices`` will hold,
    from the ``size`` of the descriptors in ``descriptors`` (a table as Lance reads it), plus
    their 8-byte offsets; nulls count 0. What reads are sized by (a 200 KB row is 200 KB).

    Example:
        >>> import pyarrow as pa
        >>> sizes = pa.array([{"size": 1000}, None, {"size": 3000}])
        >>> payload_bytes_per_row(pa.table({"v": sizes}), {"v": "bytes"})
        1341.3333333333333
    """
    if not descriptors.num_rows:
        return 0.0
    total = sum(
        int(payload_sizes(descriptors.column(column)).sum()) + 8 * descriptors.num_rows
        for column, choice in choices.items()
        if choice == "bytes"
    )
    return total / descriptors.num_rows


def payload_sizes(descriptors: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """The payload size in bytes of each non-null value of a blob column as Lance scans it
    (its descriptors), without reading a payload.

    Example:
        >>> payload_sizes(pa.array([{"size": 5}, None, {"size": 7}])).tolist()
        [5, 7]
    """
    if isinstance(descriptors, pa.ChunkedArray):
        descriptors = (
            descriptors.combine_chunks()
            if descriptors.num_chunks
            else pa.array([], descriptors.type)
        )
    valid = np.asarray(descriptors.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    sizes = np.asarray(descriptors.field("size").to_numpy(zero_copy_only=False))
    return sizes[valid].astype(np.int64)


class _Pinned(Protocol):
    @property
    def uri(self) -> str: ...

    @property
    def version(self) -> int: ...

    @property
    def dataset(self) -> lance.LanceDataset: ...


def read_blob_payloads(
    dataset: lance.LanceDataset,
    column: str,
    offsets: np.ndarray,
    descriptors: pa.Array | pa.ChunkedArray | None = None,
    io: StorageIO | None = None,
) -> pa.LargeBinaryArray:
    """The payloads of blob ``column`` at Lance row ``offsets`` (any order, duplicates
    allowed), in that order, nulls as nulls. With the rows' ``descriptors`` (the column as
    Lance scanned it, aligned with ``offsets``) inline payloads of local files in runs are read
    straight into the column's buffer (:mod:`~lanceloader.rows.lance.inline_blobs`: one ``pread`` a
    run, one copy, counted in ``io`` when given: Lance does not count them); otherwise one
    planned ``read_blobs`` call and one copy into the buffer.
    Memory: the payloads once, plus ``read_blobs``'s ``bytes`` objects on that path.

    Example:
        >>> import tempfile, lance, lance.blob, numpy as np, pyarrow as pa
        >>> uri = tempfile.mkdtemp() + "/b.lance"
        >>> ds = lance.write_dataset(pa.table({"b": lance.blob.blob_array([b"ab", None])}), uri)
        >>> read_blob_payloads(ds, "b", np.array([1, 0, 0])).to_pylist()
        [None, b'ab', b'ab']
    """
    if not len(offsets):
        return pa.array([], pa.large_binary())
    if descriptors is not None:
        files = fragment_files(dataset, column)
        plan = inline_plan(files, offsets, descriptors)
        if plan is not None and files is not None:
            nulls = descriptors.null_count
            validity = None
            if nulls:
                valid = descriptors.is_valid()
                valid = valid.combine_chunks() if isinstance(valid, pa.ChunkedArray) else valid
                validity = pa.array(valid.to_numpy(zero_copy_only=False)).buffers()[1]
            return read_inline(files, plan, validity, nulls, io or StorageIO())
    pairs = dataset.read_blobs(
        column, indices=np.asarray(offsets, dtype=np.uint64).tolist(), preserve_order=True
    )
    if len(pairs) != len(offsets):  # never silently misaligned
        raise RuntimeError(
            f"Lance's read_blobs({column!r}) returned {len(pairs)} payloads for {len(offsets)} rows"
        )
    return binary_array([payload for _, payload in pairs])


def binary_array(values: list[bytes | None]) -> pa.LargeBinaryArray:
    """``values`` as one ``large_binary`` array, nulls as nulls: one copy (a ``bytes.join``)
    into its data buffer, which Arrow wraps without another (measured on 448 payloads of 64
    KiB: 2-3x the speed of ``pa.array(values)``).

    Example:
        >>> binary_array([b"ab", None, b"c"]).to_pylist()
        [b'ab', None, b'c']
    """
    lengths = np.fromiter((0 if v is None else len(v) for v in values), np.int64, len(values))
    offsets = np.zeros(len(values) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    present = [v for v in values if v is not None]
    nulls = len(values) - len(present)
    validity = None
    if nulls:
        valid = np.fromiter((v is not None for v in values), bool, len(values))
        validity = pa.array(valid).buffers()[1]
    return pa.LargeBinaryArray.from_buffers(
        pa.large_binary(),
        len(values),
        [validity, pa.py_buffer(offsets), pa.py_buffer(b"".join(present))],
        null_count=nulls,
    )


def attach_blobs(
    table: pa.Table, offsets: np.ndarray, choices: Mapping[str, str], source: _Pinned, io: StorageIO
) -> pa.Table:
    """``table`` (rows as Lance read them, at Lance row ``offsets``, in that order) with each
    blob column as its choice makes it (see :func:`rows_schema`). ``"bytes"`` columns are read
    here, through ``source.dataset``; a ``"file"`` column holds the row offsets, which
    :func:`blob_files` opens on the pinned dataset of the rows the batch was read from."""
    if not choices:
        return table
    schema = rows_schema(table.schema, table.column_names, choices, source.uri, source.version)
    for column, choice in choices.items():
        i = table.schema.get_field_index(column)
        if choice == "bytes":
            values: pa.Array = read_blob_payloads(
                source.dataset, column, offsets, table.column(column), io
            )
        elif choice == "file":
            valid = table.column(column).is_valid().to_numpy(zero_copy_only=False)
            values = pa.array(np.asarray(offsets, dtype=np.int64), mask=~np.asarray(valid))
        else:
            values = table.column(column)  # as Lance read it (DESCRIPTOR_TYPE)
        table = table.set_column(i, schema.field(column), values)
    return table


def blob_files(
    batch: pa.RecordBatch | pa.Table, column: str, buffer_size: int = 512 * 1024, rows: Any = None
) -> list[lance.BlobFile | None]:
    """File-like ``lance.BlobFile`` objects for the rows of ``batch``'s ``column`` (a column
    read with ``blobs={column: "file"}``), in row order, ``None`` for a null blob. Each reads
    only the ranges asked for (``seek`` + ``read``, ``read_range``), ``buffer_size`` bytes at a
    time. Opened on the pinned dataset of the rows the batch was read from, with their storage
    options: inside a Loader's transform those rows are known (the worker runs the transform
    for them, in its own thread or process); elsewhere pass them as ``rows=``. The caller owns
    the files: close them (or use them as context managers).

    Example:
        >>> import tempfile, lance, lance.blob, numpy as np, pyarrow as pa
        >>> import lanceloader as ll
        >>> uri = tempfile.mkdtemp() + "/clips.lance"
        >>> table = pa.table({"video": lance.blob.blob_array([b"0123456789", None])})
        >>> _ = lance.write_dataset(table, uri)
        >>> source = ll.Source(uri, blobs={"video": "file"})
        >>> first, missing = blob_files(source.read(np.array([0, 1])), "video", rows=source)
        >>> _ = first.seek(4)
        >>> first.read(3), missing
        (b'456', None)
    """
    if not isinstance(batch, pa.RecordBatch | pa.Table):
        raise TypeError(
            f"blob_files needs the Arrow batch a transform gets (output='arrow' "
            f"inside the loader); got the {type(batch).__name__}"
        )
    if column not in batch.schema.names:
        raise ValueError(
            f"blob_files: no column {column!r} in the batch; its columns are {batch.schema.names}"
        )
    metadata = batch.schema.field(column).metadata or {}
    if FILE_URI_KEY not in metadata:
        raise ValueError(
            f"blob_files: column {column!r} was not read as files (a blob column read as "
            f"files carries its dataset); read it with ll.Source(..., blobs={{{column!r}: "
            "'file'})"
        )
    rows = rows if rows is not None else batch_rows()
    if rows is None:
        raise ValueError(
            "blob_files: outside a Loader's transform, pass the rows the batch was read from: "
            f"blob_files(batch, {column!r}, rows=source) (inside a transform they are known)"
        )
    offsets = batch.column(column)
    offsets = offsets.combine_chunks() if isinstance(offsets, pa.ChunkedArray) else offsets
    return rows.blob_files(column, offsets, buffer_size)


def take_blob_files(
    dataset: lance.LanceDataset, column: str, offsets: pa.Array, buffer_size: int
) -> list[lance.BlobFile | None]:
    """``lance.BlobFile`` objects of ``column`` at the Lance row ``offsets`` of ``dataset``
    (``None`` where the offset is null: a null blob)."""
    valid = np.asarray(offsets.is_valid().to_numpy(zero_copy_only=False))
    files: list[lance.BlobFile | None] = [None] * len(valid)
    if not valid.any():
        return files
    wanted = np.asarray(offsets.fill_null(0).to_numpy(zero_copy_only=False))[valid]
    opened = dataset.take_blobs(
        column, indices=wanted.astype(np.uint64).tolist(), buffer_size=buffer_size
    )
    for i, blob in zip(np.flatnonzero(valid).tolist(), opened, strict=True):
        files[i] = blob
    return files
