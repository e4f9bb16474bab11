"""Convert: an Arrow RecordBatch to the output format the training loop wants.

One code path: every column becomes NumPy first, viewing Arrow's buffers without a copy where
Arrow allows; ``torch.from_numpy``, ``jax.device_put`` or ``tf.convert_to_tensor`` then wrap the
arrays. How the columns become arrays is set by a :class:`Conversion`; a plain string such as
``"torch"`` means ``Conversion(output="torch")`` with every other option at its default.

======================================  ==================================================  =====
Arrow type                              NumPy result                                        copy?
======================================  ==================================================  =====
int*, uint*, float16/32/64              1-D array of the same dtype                         no
lance.bfloat16 (extension)              1-D ``ml_dtypes.bfloat16`` array                    no
bool                                    1-D ``bool`` array (Arrow packs bits)               yes
timestamp, date, time, duration         integers counting the type's unit: ``timestamp[ms]``  no
                                        is int64 ms since 1970-01-01 UTC, ``date32`` int32
                                        days, ``date64`` int64 ms, ``time*``/``duration``
                                        their own unit
fixed_size_list<T, k> (nested)          ``[rows, k]`` (nested: ``[rows, k1, k2, ...]``)     no
fixed_shape_tensor                      ``[rows, *shape]``                                  no
list<T>, large_list<T>                  ``ragged="pad"``: ``col`` ``[rows, longest, ...]``  yes
                                        padded with ``pad_value``, plus ``col_lengths``
                                        (int64); ``ragged="list"``: a list of arrays        no
binary, large_binary, binary_view,      a :class:`ByteRows`: one ``uint8`` buffer plus      no
fixed_size_binary (Lance blobs)         ``int64`` offsets, ``rows[i]`` the bytes of row
                                        ``i`` (``output="tf"``, ``binary="list"``: a list
                                        of ``bytes``; ``strings="numpy"``: an object
                                        array)
string (large_*, views)                 list of ``str``; ``strings="numpy"``: a NumPy      yes
                                        ``StringDType`` array
list<string>, list<list<T>>,            a list with one Python list per row (values as      yes
list<struct> (other nested lists)       ``output="python"`` gives them; nulls inside are
                                        ``None``)
dictionary<V>                           decoded, then as ``V``                              yes
struct                                  a dict of its fields, converted as above            --
======================================  ==================================================  =====

Nulls raise :class:`ConversionError` naming the column and the count, unless ``fill_nulls``
gives that column a value (struct fields are named ``"struct.field"``); filling copies.
``casts`` converts a column's dtype after that, checking that every value fits.

Integer policy: NumPy keeps every dtype. torch has ``uint16``/``uint32``/``uint64`` dtypes, but
``uint64`` tensors support so few operations (no ``+``, no indexing) that a ``uint64`` column is an
error for ``output="torch"`` unless cast (``casts={"col": "int64"}``, checked to fit). JAX without
``jax_enable_x64`` turns 64-bit arrays into 32-bit ones and silently wraps values that do not fit:
such values raise instead (enable x64, or cast). float64 becomes float32 there, JAX's own rule.

torch wraps the NumPy arrays (no copy); ``jax.device_put`` shares memory on the CPU when the array
is suitably aligned and copies otherwise (and to accelerators); TensorFlow always copies. Text
columns stay Python lists or NumPy arrays in every output, and binary columns
:class:`ByteRows` of NumPy arrays (``torch.from_numpy(rows.data)`` wraps one).

Example::

    >>> import pyarrow as pa
    >>> batch = pa.record_batch({"label": pa.array([1, 2], pa.int32()),
    ...                          "tokens": pa.array([[5, 6, 7], [8]])})
    >>> out = to_output(batch, Conversion(output="numpy", pad_value=-1))
    >>> out["label"].tolist(), out["tokens"].tolist(), out["tokens_lengths"].tolist()
    ([1, 2], [[5, 6, 7], [8, -1, -1]], [3, 1])
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lanceloader.batch.byterows import ByteRows, byte_rows, is_binary, without_views
from lanceloader.batch.nulls import (
    check_casts,
    check_fill_nulls,
    checked_scalar,
    is_blob_file,
    is_list,
    is_text,
    null_error,
    null_fix,
)
from lanceloader.batch.tensors import ConversionError, bfloat16, cast_checked, to_framework

OUTPUTS = ("arrow", "numpy", "python", "torch", "jax", "tf")
RAGGED = ("pad", "list")
STRINGS = ("list", "numpy")
BINARY = ("rows", "list")
LENGTHS_SUFFIX = "_lengths"
# Kinds whose values form one rectangular NumPy array per column.
_ARRAY_KINDS = ("number", "bool", "bfloat16", "temporal", "fixed_list", "tensor")


@dataclass(frozen=True)
class Conversion:
    """How Arrow columns become arrays: the output format and what to do with the awkward cases.

    Args:
        output: ``"numpy"``, ``"torch"``, ``"jax"``, ``"tf"``, ``"arrow"`` or ``"python"``.
        fill_nulls: column name (``"struct.field"`` inside structs) to the value its nulls take;
            a null variable-length list becomes an empty one. Columns not named here must not
            contain nulls.
        ragged: variable-length lists become ``"pad"`` (``col`` padded with ``pad_value`` plus
            ``col_lengths``) or ``"list"`` (a list of arrays, one per row).
        pad_value: the value padding takes; it must fit the column's dtype.
        pad_to: pad every batch to this length (static shapes, e.g. for XLA); longer rows raise.
            Default: the longest row of each batch.
        strings: text columns become a ``"list"`` of str/bytes or ``"numpy"`` arrays.
        binary: binary columns become ``"rows"`` (a :class:`ByteRows`: one buffer plus offsets,
            no object per row) or a ``"list"`` of ``bytes`` (one copy per row). Default:
            ``"rows"`` for ``output="numpy"``, ``"torch"`` and ``"jax"``; a list for ``"tf"``
            (whose ``tf.string`` takes it), and the ``strings`` rule under ``strings="numpy"``.
        casts: column name to a NumPy dtype name (``{"id": "int64"}``), applied after the nulls
            are filled; integer casts check that every value fits.

    >>> Conversion(output="torch", fill_nulls={"score": 0.0}).fill_nulls
    {'score': 0.0}
    >>> Conversion(ragged="zip")
    Traceback (most recent call last):
    ...
    ValueError: ragged must be 'pad' (a padded array plus '<col>_lengths') or 'list' (a list of arrays, one per row), got 'zip'
    """

    output: str = "numpy"
    fill_nulls: Mapping[str, Any] = field(default_factory=dict)
    ragged: str = "pad"
    pad_value: int | float = 0
    pad_to: int | None = None
    strings: str = "list"
    casts: Mapping[str, str] = field(default_factory=dict)
    binary: str | None = None

    def __post_init__(self) -> None:
        if self.output not in OUTPUTS:
            raise ValueError(f"output must be one of {OUTPUTS}, got {self.output!r}")
        if self.ragged not in RAGGED:
            raise ValueError(
                "ragged must be 'pad' (a padded array plus '<col>_lengths') or 'list' (a list of "
                f"arrays, one per row), got {self.ragged!r}"
            )
        if self.strings not in STRINGS:
            raise ValueError(f"strings must be 'list' or 'numpy', got {self.strings!r}")
        if self.binary is not None and self.binary not in BINARY:
            raise ValueError(
                "binary must be 'rows' (a ll.ByteRows: one buffer plus offsets) or 'list' (a "
                f"list of bytes), got {self.binary!r}"
            )
        if self.binary == "rows" and self.output == "tf":
            raise ValueError(
                "binary='rows' cannot become output='tf': TensorFlow takes bytes as tf.string "
                "from a list; drop binary= (or pass binary='list')"
            )
        if isinstance(self.pad_value, bool) or not isinstance(self.pad_value, int | float):
            raise TypeError(f"pad_value must be an int or a float, got {self.pad_value!r}")
        if self.pad_to is not None and (
            isinstance(self.pad_to, bool) or not isinstance(self.pad_to, int) or self.pad_to < 1
        ):
            raise ValueError(f"pad_to must be None or an int >= 1, got {self.pad_to!r}")
        object.__setattr__(self, "fill_nulls", check_fill_nulls(self.fill_nulls))
        object.__setattr__(self, "casts", check_casts(self.casts))
        changed = [n for n in ("fill_nulls", "casts", "pad_to") if getattr(self, n)]
        changed += [
            n
            for n in ("ragged", "pad_value", "strings", "binary")
            if getattr(self, n) != _DEFAULTS[n]
        ]
        if self.output in ("arrow", "python") and changed:
            raise ValueError(
                f"{', '.join(changed)} only apply to array outputs, not output={self.output!r}; "
                "drop them or use output='numpy', 'torch', 'jax' or 'tf'"
            )


_DEFAULTS = {"ragged": "pad", "pad_value": 0, "strings": "list", "binary": None}
_PLAIN: dict[str, Conversion] = {}


class Padded(NamedTuple):
    """A variable-length list column padded to a rectangle, with each row's true length."""

    values: np.ndarray
    lengths: np.ndarray


def as_conversion(output: str | Conversion) -> Conversion:
    """``output`` as a :class:`Conversion`: a string sets only the output format.

    >>> as_conversion("torch")
    Conversion(output='torch', fill_nulls={}, ragged='pad', pad_value=0, pad_to=None, strings='list', casts={}, binary=None)
    """
    if isinstance(output, Conversion):
        return output
    if isinstance(output, str):
        if output not in _PLAIN:  # one per name: a string costs a lookup per batch, not a check
            _PLAIN[output] = Conversion(output=output)
        return _PLAIN[output]
    raise TypeError(
        f"output must be a string such as 'numpy' or a lanceloader.Conversion, got "
        f"{type(output).__name__}"
    )


def to_output(
    batch: pa.RecordBatch | pa.Table | Mapping[str, Any], output: str | Conversion = "numpy"
) -> Any:
    """``batch`` in ``output`` format: a RecordBatch, or a dict of column name to array/list.

    A dict (what a transform may return) has its Arrow arrays converted as columns and its NumPy
    arrays wrapped for the framework; other values pass through.

    >>> to_output({"x": np.arange(3)}, "numpy")["x"].tolist()
    [0, 1, 2]
    """
    conversion = as_conversion(output)
    if conversion.output == "arrow":
        return batch
    if conversion.output == "python":
        return batch.to_pydict() if not isinstance(batch, Mapping) else dict(batch)
    columns = (
        batch.items()
        if isinstance(batch, Mapping)
        else zip(batch.schema.names, batch.columns, strict=True)
    )
    arrays: dict[str, Any] = {}
    fields = {} if isinstance(batch, Mapping) else {f.name: f for f in batch.schema}
    for name, col in columns:
        if name in fields and col.null_count and is_blob_file(fields[name]):
            raise null_error(name, col, blob_file=True)
        if isinstance(col, pa.Array | pa.ChunkedArray):
            col = column_to_numpy(name, col, conversion)
        _put(arrays, name, col)
    if conversion.output == "numpy":
        return arrays
    return to_framework(arrays, "", conversion.output)


def column_to_numpy(
    name: str, col: pa.Array | pa.ChunkedArray, conversion: str | Conversion | None = None
) -> Any:
    """One Arrow column as NumPy: an array, a list (text, ``ragged="list"``), a :class:`Padded`
    (``ragged="pad"``) or a dict (structs). Zero-copy where the table above says so.

    >>> column_to_numpy("x", pa.array([1.5, None]), Conversion(fill_nulls={"x": 0.0})).tolist()
    [1.5, 0.0]
    """
    conversion = as_conversion(conversion or "numpy")
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    kind = column_kind(name, col.type, conversion.output)
    if kind in _ARRAY_KINDS:
        return _cast(name, _array(name, col, conversion), conversion)
    if kind == "ragged":
        return _ragged(name, col, conversion)
    if kind == "text":
        return _text(name, col, conversion)
    if kind == "nested":
        return _nested(name, col, conversion)
    if kind == "dictionary":
        return column_to_numpy(name, col.dictionary_decode(), conversion)
    return {
        f.name: column_to_numpy(f"{name}.{f.name}", child, conversion)
        for f, child in zip(col.type, col.flatten(), strict=True)
    }


# --- type rules --------------------------------------------------------------------------------


def column_kind(path: str, typ: pa.DataType, output: str) -> str:
    """What a column of type ``typ`` becomes; raises for the types no array can hold."""
    if isinstance(typ, pa.BaseExtensionType):
        if typ.extension_name == "lance.bfloat16":
            return "bfloat16"
        if isinstance(typ, pa.FixedShapeTensorType) and column_kind(
            path, typ.value_type, output
        ) in ("number", "bool", "bfloat16"):
            return "tensor"
    elif pa.types.is_boolean(typ):
        return "bool"
    elif pa.types.is_integer(typ) or pa.types.is_floating(typ):
        return "number"
    elif _is_temporal(typ):
        return "temporal"
    elif is_list(typ):
        if column_kind(path, typ.value_type, output) in _ARRAY_KINDS:
            return "fixed_list" if pa.types.is_fixed_size_list(typ) else "ragged"
        return "nested"  # lists of strings, of lists, of structs: no array holds them
    elif is_text(typ):
        return "text"
    elif pa.types.is_dictionary(typ):
        column_kind(path, typ.value_type, output)
        return "dictionary"
    elif pa.types.is_struct(typ):
        return "struct"
    raise ConversionError(
        f"column {path!r} has Arrow type {typ}, which cannot become output={output!r} yet; "
        "use output='arrow' or 'python', convert it in a transform, or drop it from columns="
    )


def _is_temporal(typ: pa.DataType) -> bool:
    t = pa.types
    return t.is_timestamp(typ) or t.is_date(typ) or t.is_time(typ) or t.is_duration(typ)


# --- Arrow to NumPy ----------------------------------------------------------------------------


def _array(path: str, arr: pa.Array, conv: Conversion) -> np.ndarray:
    """A column of an array kind as one NumPy array, nulls filled (or refused)."""
    typ = arr.type
    if isinstance(typ, pa.FixedShapeTensorType):
        return _tensor(path, arr, conv)
    if pa.types.is_fixed_size_list(typ):
        k = typ.list_size
        values = _array(path, arr.values.slice(arr.offset * k, len(arr) * k), conv)
        out = values.reshape(len(arr), k, *values.shape[1:])
    elif pa.types.is_boolean(arr.type):
        out = (pc.fill_null(arr, False) if arr.null_count else arr).to_numpy(zero_copy_only=False)
    elif isinstance(typ, pa.BaseExtensionType):  # lance.bfloat16: fixed_size_binary[2] storage
        out = _buffer_view(arr.storage, bfloat16())
    elif _is_temporal(typ):
        out = _buffer_view(arr, np.dtype(f"int{typ.bit_width}"))
    else:
        out = _buffer_view(arr, np.dtype(typ.to_pandas_dtype()))
    return _fill(path, out, arr, conv)


def _buffer_view(arr: pa.Array, dtype: np.dtype) -> np.ndarray:
    """The values of a fixed-width array, as a NumPy view of its data buffer (nulls unmasked)."""
    data = arr.buffers()[1]
    if data is None or len(arr) == 0:
        return np.empty(0, dtype)
    return np.frombuffer(data, dtype=dtype, count=len(arr), offset=arr.offset * dtype.itemsize)


def _tensor(path: str, arr: pa.Array, conv: Conversion) -> np.ndarray:
    typ = arr.type
    permutation = list(typ.permutation or range(len(typ.shape)))
    if permutation != sorted(permutation):  # a permuted layout: Arrow knows its strides
        if arr.null_count or arr.storage.values.null_count:
            raise ConversionError(
                f"column {path!r} is a permuted tensor with nulls; fill them in a transform"
            )
        return arr.to_numpy_ndarray()
    flat = _array(path, arr.storage, conv)
    return flat.reshape(len(arr), *typ.shape)


def _fill(path: str, out: np.ndarray, arr: pa.Array, conv: Conversion) -> np.ndarray:
    """``out`` with the rows that are null in ``arr`` set to the column's fill value."""
    if not arr.null_count:
        return out
    if path not in conv.fill_nulls:
        raise null_error(path, arr)
    storage = arr.storage if isinstance(arr, pa.ExtensionArray) else arr
    mask = storage.is_null().to_numpy(zero_copy_only=False)
    out = out.copy()
    out[mask] = checked_scalar(path, "fill_nulls", conv.fill_nulls[path], out.dtype)
    return out


def with_fill_nulls(
    output: str | Conversion, fill_nulls: Mapping[str, Any] | None
) -> str | Conversion:
    """``output`` with ``fill_nulls`` set: the ``fill_nulls=`` keyword of ``Loader`` and the
    torch datasets, the same as ``output=Conversion(output=..., fill_nulls=...)``.

    >>> with_fill_nulls("torch", {"score": 0.0})
    Conversion(output='torch', fill_nulls={'score': 0.0}, ragged='pad', pad_value=0, pad_to=None, strings='list', casts={}, binary=None)
    >>> with_fill_nulls(Conversion(fill_nulls={"a": 0}), {"b": 0})
    Traceback (most recent call last):
    ...
    ValueError: fill_nulls is given twice, as fill_nulls={'b': 0} and in output=Conversion(fill_nulls={'a': 0}); give it once
    """
    if fill_nulls is None:
        return output
    conversion = as_conversion(output)
    if conversion.fill_nulls:
        raise ValueError(
            f"fill_nulls is given twice, as fill_nulls={dict(fill_nulls)!r} and in "
            f"output=Conversion(fill_nulls={dict(conversion.fill_nulls)!r}); give it once"
        )
    return replace(conversion, fill_nulls=fill_nulls)


def _cast(path: str, out: np.ndarray, conv: Conversion) -> np.ndarray:
    target = conv.casts.get(path)
    if target is None or out.dtype == target:
        return out
    return cast_checked(
        path, out, np.dtype(target), f"choose a wider dtype in casts={{{path!r}: ...}}"
    )


def _ragged(path: str, arr: pa.Array, conv: Conversion) -> Padded | list[np.ndarray]:
    if arr.null_count and path not in conv.fill_nulls:
        raise null_error(path, arr)
    lengths = pc.fill_null(pc.list_value_length(arr), 0).to_numpy(zero_copy_only=False)
    lengths = lengths.astype(np.int64, copy=False)
    values = _cast(path, _array(path, arr.flatten(), conv), conv)
    if conv.ragged == "list":
        return [] if len(arr) == 0 else np.split(values, np.cumsum(lengths)[:-1])
    longest = int(lengths.max(initial=0))
    width = longest if conv.pad_to is None else conv.pad_to
    if longest > width:
        raise ConversionError(
            f"column {path!r} has a row of {longest} values, longer than pad_to={conv.pad_to}; "
            "raise pad_to, truncate the lists in a transform, or use ragged='list'"
        )
    pad = checked_scalar(path, "pad_value", conv.pad_value, values.dtype)
    out = np.full((len(arr), width, *values.shape[1:]), pad, dtype=values.dtype)
    out[np.arange(width) < lengths[:, None]] = values
    return Padded(out, lengths)


def _text(path: str, arr: pa.Array, conv: Conversion) -> list[Any] | np.ndarray | ByteRows:
    if arr.null_count:
        if path not in conv.fill_nulls:
            raise null_error(path, arr)
        arr = without_views(arr)  # Arrow cannot fill nulls of view types
        try:
            arr = pc.fill_null(arr, pa.scalar(conv.fill_nulls[path], arr.type))
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as exc:
            raise ConversionError(
                f"fill_nulls value {conv.fill_nulls[path]!r} for column {path!r} does not fit its "
                f"type {arr.type}; use a {'str' if 'string' in str(arr.type) else 'bytes'}"
            ) from exc
    if is_binary(arr.type) and binary_rule(conv) == "rows":
        return byte_rows(arr)
    if conv.strings == "list":
        return arr.to_pylist()
    objects = arr.to_numpy(zero_copy_only=False)
    is_str = (
        pa.types.is_string(arr.type)
        or pa.types.is_large_string(arr.type)
        or (hasattr(pa.types, "is_string_view") and pa.types.is_string_view(arr.type))
    )
    string_dtype = getattr(np.dtypes, "StringDType", None)
    return objects.astype(string_dtype()) if is_str and string_dtype else objects


def binary_rule(conv: Conversion) -> str:
    """What binary columns become under ``conv``: ``"rows"`` (:class:`ByteRows`), ``"list"`` or
    ``"strings"`` (the ``strings`` option's rule).

    >>> binary_rule(Conversion(output="torch")), binary_rule(Conversion(output="tf"))
    ('rows', 'list')
    """
    if conv.binary is not None:
        return conv.binary
    if conv.strings != "list":
        return "strings"
    return "list" if conv.output == "tf" else "rows"


def _nested(path: str, arr: pa.Array, conv: Conversion) -> list[Any]:
    """One Python list per row; a null row becomes the column's fill value (or raises)."""
    fill = conv.fill_nulls.get(path)
    if arr.null_count and not isinstance(fill, list):
        raise ConversionError(
            f"column {path!r} ({arr.type}) has {arr.null_count} null values (of {len(arr)}); "
            f"{null_fix(path, arr.type)}"
            + ("" if fill is None else f"; got fill_nulls[{path!r}]={fill!r}, not a list")
        )
    rows = arr.to_pylist()
    if arr.null_count:
        rows = [list(fill) if row is None else row for row in rows]  # type: ignore[arg-type]
    return rows


def _put(out: dict[str, Any], name: str, value: Any) -> None:
    """Store one converted column; a padded list adds ``name`` and ``name_lengths``."""
    if isinstance(value, Padded):
        out[name] = value.values
        out[name + LENGTHS_SUFFIX] = value.lengths
    elif isinstance(value, dict):
        out[name] = {}
        for k, v in value.items():
            _put(out[name], k, v)
    else:
        out[name] = value
