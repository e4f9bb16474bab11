"""The encoded images of a batch: the column's bytes as Arrow, and each row as a NumPy view of
its bytes (no copy), what both the CPU and the GPU decode read."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lanceloader.batch.byterows import byte_rows
from lanceloader.batch.transforms import check_column

CHANNELS = {"RGB": 3, "L": 1}  # channels of each decode mode
JPEG_MAGIC = b"\xff\xd8\xff"


def encoded_column(batch: pa.RecordBatch, name: str) -> pa.Array:
    """Column ``name`` of ``batch``, the encoded images: ``binary`` or ``large_binary`` as it
    is, ``binary_view`` copied into one buffer (``large_binary``, in Arrow); anything else
    raises naming the column and its type.

    >>> batch = pa.record_batch({"image": pa.array([b"x"], pa.binary_view())})
    >>> encoded_column(batch, "image").type
    DataType(large_binary)
    """
    if name in batch.schema.names and pa.types.is_binary_view(batch.schema.field(name).type):
        return batch.column(name).cast(pa.large_binary())
    return check_column(batch, name, ("binary", "large_binary"), "decode_images")


def row_views(col: pa.Array) -> list[np.ndarray | None]:
    """Each row of a binary column as a ``uint8`` array viewing the Arrow buffer (no copy;
    ``None`` for a null): what the decoders read, so no row becomes a ``bytes`` object.
    A ``binary_view`` column is first copied into one buffer (its rows may lie in many).

    >>> [bytes(v) if v is not None else v for v in row_views(pa.array([b"ab", None, b"c"]))]
    [b'ab', None, b'c']
    """
    if pa.types.is_binary_view(col.type):  # no one buffer to view: one copy, in Arrow
        col = col.cast(pa.large_binary())
    if not col.null_count:
        rows = byte_rows(col)
        return [
            rows.data[lo:hi]
            for lo, hi in zip(rows.offsets[:-1].tolist(), rows.offsets[1:].tolist(), strict=True)
        ]
    rows = byte_rows(pc.fill_null(col, pa.scalar(b"", col.type)))
    valid = col.is_valid().to_numpy(zero_copy_only=False).tolist()
    return [rows.view(i) if ok else None for i, ok in enumerate(valid)]


# Start-of-frame markers: the segment that says how many colour components a JPEG has.
