"""Construction-time checks of what the rows can become: every column of a schema against an
output format (:func:`check_schema`), and encoded bytes kept from plain tensor outputs
(:func:`check_bytes_for_tensors`), and the output's framework imported (:func:`check_output`), so
a loader fails before any worker starts, naming the column and the fix. Nulls depend on the data:
:func:`null_checked_columns` names the columns a cheap scan at construction looks at (the scan
itself is the pipeline's, which has the rows), :func:`nulls_error` says what it found.
"""

from __future__ import annotations

import pyarrow as pa

from lanceloader.batch.nulls import is_list, null_fix
from lanceloader.batch.output import LENGTHS_SUFFIX, Conversion, as_conversion, column_kind
from lanceloader.batch.tensors import FRAMEWORKS, ConversionError, import_framework, uint64_message


def check_output(output: str | Conversion) -> Conversion:
    """Validate ``output`` and import its framework now, so a missing one fails before loading.

    >>> check_output("numpy").output
    'numpy'
    """
    conversion = as_conversion(output)
    if conversion.output in FRAMEWORKS:
        import_framework(conversion.output)
    return conversion


def check_schema(schema: pa.Schema, output: str | Conversion = "numpy") -> None:
    """Fail before any worker starts if a column cannot be converted to ``output``.

    >>> check_schema(pa.schema([("id", pa.uint64())]), "torch")
    Traceback (most recent call last):
    ...
    lanceloader.ConversionError: column 'id' is uint64, which torch tensors barely support (no +, no indexing); cast it: casts={'id': 'int64'} (values must be below 2**63)
    """
    conversion = as_conversion(output)
    if conversion.output in ("arrow", "python"):
        return
    names = set(schema.names)
    paths: set[str] = set()
    for f in schema:
        _check_field(f.name, f.type, conversion, names, paths)
    for option in ("fill_nulls", "casts"):
        unknown = sorted(set(getattr(conversion, option)) - paths)
        if unknown:
            raise ValueError(
                f"{option} names {unknown}, which the data does not have; its columns are "
                f"{sorted(paths)}"
            )


def check_bytes_for_tensors(schema: pa.Schema, output: str) -> None:
    """Refuse binary columns for a plain tensor ``output`` (``"torch"``, ``"jax"``, ``"tf"``)
    without a transform: they would arrive as bytes (an :class:`~lanceloader.ByteRows`, or a
    list for ``"tf"``), not a tensor, and fail later in the model (``'ByteRows' object has no
    attribute 'permute'``). An explicit ``Conversion(output=...)`` keeps the bytes, for code that
    decodes them itself (on a GPU, say).

    >>> check_bytes_for_tensors(pa.schema([("image", pa.binary())]), "torch")
    Traceback (most recent call last):
    ...
    lanceloader.ConversionError: column 'image' holds encoded bytes, which output='torch' cannot make a tensor of: they would arrive as bytes, not a tensor. Decode them in the workers with transform=ll.decode_images('image') (JPEG/PNG), leave the column out with columns=[...], or pass output=ll.Conversion(output='torch') to get the bytes on purpose (an ll.ByteRows)
    """
    if output not in FRAMEWORKS:
        return
    for f in schema:
        if pa.types.is_binary(f.type) or pa.types.is_large_binary(f.type):
            raise ConversionError(
                f"column {f.name!r} holds encoded bytes, which output={output!r} cannot make a "
                "tensor of: they would arrive as bytes, not a tensor. Decode them in the workers "
                f"with transform=ll.decode_images({f.name!r}) (JPEG/PNG), leave the column out "
                f"with columns=[...], or pass output=ll.Conversion(output={output!r}) to get "
                f"the bytes on purpose ({'a list' if output == 'tf' else 'an ll.ByteRows'})"
            )


def null_checked_columns(schema: pa.Schema, output: str | Conversion) -> dict[str, int]:
    """The top-level columns of ``schema`` whose nulls ``output`` refuses and a construction-time
    scan can afford to look at, with their bytes per row: fixed-width scalars (numbers, bools,
    times, bfloat16) not named in ``fill_nulls``. Lists, tensors and text can be large, so their
    nulls are found in the batch that holds them (the error names the batch and the row).

    >>> null_checked_columns(pa.schema([("score", pa.float32()), ("v", pa.list_(pa.int8())),
    ...                                 ("ok", pa.int64())]), Conversion(fill_nulls={"ok": 0}))
    {'score': 4}
    >>> null_checked_columns(pa.schema([("score", pa.float32())]), "arrow")
    {}
    """
    conversion = as_conversion(output)
    if conversion.output in ("arrow", "python"):
        return {}
    found = {}
    for f in schema:
        if f.name in conversion.fill_nulls or not f.nullable:
            continue
        kind = column_kind(f.name, f.type, conversion.output)
        if kind in ("number", "bool", "temporal", "bfloat16"):
            width = 2 if kind == "bfloat16" else max(1, f.type.bit_width // 8)
            found[f.name] = width
    return found


def nulls_error(
    column: str,
    typ: pa.DataType,
    count: int,
    rows: int,
    where: str,
    filter: str | None,
    blob_file: bool = False,
) -> ConversionError:
    """The construction-time error for ``count`` nulls of ``column`` among the ``rows`` a loader
    reads, the first at ``where``; the fix is a call that runs as written.

    >>> print(nulls_error("score", pa.float32(), 3, 1000, "fragment 0 row 7", None))
    column 'score' (float) has 3 null values in the 1000 rows this loader reads (the first: fragment 0 row 7), which output arrays cannot hold; fill them: Loader(..., fill_nulls={'score': 0.0}) (also a keyword of ll.torch's datasets and ll.Conversion), or filter them out: filter='score IS NOT NULL'
    """
    return ConversionError(
        f"column {column!r} ({typ}) has {count} null values in the {rows} rows this loader "
        f"reads (the first: {where}), which output arrays cannot hold; "
        f"{null_fix(column, typ, filter, blob_file)}"
    )


def _check_field(
    path: str, typ: pa.DataType, conv: Conversion, names: set[str], paths: set[str]
) -> None:
    paths.add(path)
    kind = column_kind(path, typ, conv.output)
    if kind == "struct":
        child_names = {f.name for f in typ}
        for f in typ:
            _check_field(f"{path}.{f.name}", f.type, conv, child_names, paths)
        return
    if (
        kind == "ragged"
        and conv.ragged == "pad"
        and path.rsplit(".", 1)[-1] + LENGTHS_SUFFIX in names
    ):
        raise ConversionError(
            f"column {path!r} is a variable-length list, and ragged='pad' adds "
            f"'{path}{LENGTHS_SUFFIX}', which already exists; rename that column or use "
            "ragged='list'"
        )
    if (
        conv.output == "torch"
        and kind != "nested"  # Python ints: no tensor to refuse
        and _leaf_type(typ) == pa.uint64()
        and conv.casts.get(path, "uint64") == "uint64"
    ):
        raise ConversionError(uint64_message(path))


def _leaf_type(typ: pa.DataType) -> pa.DataType:
    while True:
        if isinstance(typ, pa.BaseExtensionType):
            typ = typ.storage_type
        elif pa.types.is_dictionary(typ) or is_list(typ):
            typ = typ.value_type
        else:
            return typ
