"""Nulls and casts in a conversion: what a column's nulls become (``fill_nulls``: a value of the
column's type, checked to fit) or the error that names them with the fixes that run as written;
the ``casts`` a conversion takes; and the kinds of Arrow types those checks ask about."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from lanceloader.batch.byterows import is_binary
from lanceloader.batch.tensors import ConversionError, is_bfloat16


def is_list(typ: pa.DataType) -> bool:
    return pa.types.is_fixed_size_list(typ) or pa.types.is_list(typ) or pa.types.is_large_list(typ)


def is_text(typ: pa.DataType) -> bool:
    names = (
        "string",
        "large_string",
        "binary",
        "large_binary",
        "fixed_size_binary",
        "string_view",
        "binary_view",
    )
    return any(getattr(pa.types, f"is_{n}", lambda _: False)(typ) for n in names)


def check_fill_nulls(fill_nulls: Any) -> dict[str, Any]:
    if not isinstance(fill_nulls, Mapping):
        raise TypeError(
            "fill_nulls must be a dict of column name to fill value, e.g. {'score': 0.0}, got "
            f"{type(fill_nulls).__name__}"
        )
    for name, value in fill_nulls.items():
        if not isinstance(value, int | float | str | bytes | list):  # bool is an int
            raise TypeError(
                f"fill_nulls[{name!r}] must be a number, bool, str, bytes or (for a column of "
                f"nested lists) a list, got {value!r}"
            )
    return dict(fill_nulls)


def null_error(path: str, arr: pa.Array, blob_file: bool = False) -> ConversionError:
    storage = arr.storage if isinstance(arr, pa.ExtensionArray) else arr
    first = int(np.flatnonzero(storage.is_null().to_numpy(zero_copy_only=False))[0])
    error = ConversionError(
        f"column {path!r} ({arr.type}) has {arr.null_count} null values (of {len(arr)}), the "
        f"first at row {first} of this batch; {null_fix(path, arr.type, blob_file=blob_file)}"
    )
    error.row = first
    return error


#: the field metadata of a blob column read as files (``blobs={column: "file"}``): its values
#: are row offsets, so no value may stand in for a null (it would name another row's blob)
BLOB_FILE_KEY = b"lanceloader:blob-uri"


def is_blob_file(field: pa.Field) -> bool:
    """Whether ``field`` is a blob column read as files (row offsets of the pinned version)."""
    return BLOB_FILE_KEY in (field.metadata or {})


def null_fix(
    path: str, typ: pa.DataType, filter: str | None = None, blob_file: bool = False
) -> str:
    """The fixes for nulls in column ``path``, as calls that run as written: the ``fill_nulls``
    keyword (of ``Loader``, the torch datasets and ``Conversion``) with a value of the column's
    type, or a filter (added to ``filter``, the one in use). A blob column read as files
    (``blob_file``) gets no fill: its values are row offsets, and any would name another row's
    blob; Arrow output keeps the nulls, which ``ll.blob_files`` gives as ``None``.

    >>> null_fix("score", pa.float32())
    "fill them: Loader(..., fill_nulls={'score': 0.0}) (also a keyword of ll.torch's datasets and ll.Conversion), or filter them out: filter='score IS NOT NULL'"
    """
    keep = f"{path} IS NOT NULL" if filter is None else f"({filter}) AND {path} IS NOT NULL"
    if blob_file:
        return (
            f"filter them out: filter={keep!r}, or read with output='arrow' (a null stays "
            "null, and ll.blob_files gives None for it); no fill_nulls value is right "
            "here: a row offset would open another row's blob"
        )
    return (
        f"fill them: Loader(..., fill_nulls={{{path!r}: {fill_example(typ)!r}}}) (also a "
        f"keyword of ll.torch's datasets and ll.Conversion), or filter them out: "
        f"filter={keep!r}"
    )


def fill_example(typ: pa.DataType) -> Any:
    """A ``fill_nulls`` value that fits a column of type ``typ``.

    >>> fill_example(pa.int32()), fill_example(pa.string()), fill_example(pa.list_(pa.int8()))
    (0, '', [])
    """
    if isinstance(typ, pa.BaseExtensionType):
        typ = typ.storage_type if not isinstance(typ, pa.FixedShapeTensorType) else typ.value_type
        return 0.0 if pa.types.is_fixed_size_binary(typ) else fill_example(typ)  # bfloat16
    if pa.types.is_dictionary(typ):
        return fill_example(typ.value_type)
    if pa.types.is_fixed_size_list(typ):
        return fill_example(typ.value_type)
    if is_list(typ):
        return []
    if pa.types.is_boolean(typ):
        return False
    if pa.types.is_floating(typ):
        return 0.0
    if is_binary(typ):
        return b""
    if is_text(typ):
        return ""
    return 0


def checked_scalar(path: str, option: str, value: Any, dtype: np.dtype) -> np.ndarray:
    """``value`` as ``dtype``; refuses values that would change (0.5 into int, -1 into uint8)."""
    kind = "f" if is_bfloat16(dtype) else dtype.kind
    if kind == "b":
        fits = isinstance(value, bool | int) and value in (0, 1)
    elif kind in "iu":
        info = np.iinfo(dtype)
        fits = isinstance(value, int) and info.min <= value <= info.max
    else:
        fits = kind == "f" and isinstance(value, int | float)
    if not fits:
        raise ConversionError(
            f"{option} value {value!r} for column {path!r} does not fit its dtype {dtype}; "
            "use a value of that type and range"
        )
    return np.array(value).astype(dtype)


def check_casts(casts: Any) -> dict[str, str]:
    if not isinstance(casts, Mapping):
        raise TypeError(
            f"casts must be a dict of column name to dtype, e.g. {{'id': 'int64'}}, got "
            f"{type(casts).__name__}"
        )
    for name, dtype in casts.items():
        try:
            ok = np.dtype(dtype).kind in "biuf"
        except TypeError:
            ok = False
        if not ok:
            raise ValueError(
                f"casts[{name!r}] must name a NumPy bool, integer or float dtype such as 'int64' "
                f"or 'float32', got {dtype!r}"
            )
    return {name: np.dtype(dtype).name for name, dtype in casts.items()}
