"""Convert: an Arrow RecordBatch to the output format the training loop wants.

One code path: every format goes through NumPy, which views Arrow's buffers without copying where
Arrow allows (primitive columns without nulls, fixed-size lists, fixed-shape tensors); torch then
wraps the NumPy arrays (``torch.from_numpy``: no copy either).

=================================  =====================================================
Arrow type                         NumPy result
=================================  =====================================================
integers, floats, booleans         1-D array (booleans are copied: Arrow packs bits)
fixed_size_list<T, k>              2-D array ``[rows, k]`` (nested lists: more dims)
fixed_shape_tensor                 N-D array ``[rows, *shape]``
string, binary (and large_*)       Python list of ``str`` / ``bytes``
=================================  =====================================================

Example::

    >>> import pyarrow as pa
    >>> batch = pa.record_batch({"label": pa.array([1, 2], pa.int32())})
    >>> to_output(batch, "numpy")["label"].tolist()
    [1, 2]
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pyarrow as pa

OUTPUTS = ("arrow", "numpy", "python", "torch", "jax", "tf")


class ConversionError(TypeError):
    """A column that cannot become the requested output type."""


def check_output(output: str) -> None:
    if output not in OUTPUTS:
        raise ValueError(f"output must be one of {OUTPUTS}, got {output!r}")
    if output in ("jax", "tf"):
        raise NotImplementedError(
            f"output={output!r} is not implemented yet (planned with the conversion work); "
            "use output='numpy' and convert in your loop"
        )
    if output == "torch":
        _import_torch()


def check_schema(schema: pa.Schema, output: str) -> None:
    """Fail before any worker starts if a column cannot be converted to ``output``."""
    if output in ("arrow", "python"):
        return
    for field in schema:
        _numpy_kind(field.name, field.type, output)


def to_output(batch: pa.RecordBatch, output: str) -> Any:
    """``batch`` in ``output`` format: a RecordBatch, or a dict of column name to array/list."""
    if output == "arrow":
        return batch
    if output == "python":
        return batch.to_pydict()
    arrays = {name: column_to_numpy(name, col) for name, col in zip(batch.schema.names, batch.columns)}
    if output == "numpy":
        return arrays
    torch = _import_torch()
    return {k: _torch_from_numpy(torch, v) if isinstance(v, np.ndarray) else v for k, v in arrays.items()}


def column_to_numpy(name: str, col: pa.Array) -> np.ndarray | list[Any]:
    """One Arrow column as a NumPy array (or a list for strings/binary); zero-copy where possible."""
    kind = _numpy_kind(name, col.type, "numpy")
    if col.null_count:
        raise ConversionError(
            f"column {name!r} ({col.type}) has {col.null_count} null values in a batch of "
            f"{len(col)} rows; filter them out (filter='{name} IS NOT NULL') or fill them first"
        )
    if kind == "list":
        return col.to_pylist()
    if kind == "tensor":
        return col.to_numpy_ndarray()
    if kind == "fixed_list":
        shape = [len(col)]
        values: pa.Array = col
        while pa.types.is_fixed_size_list(values.type):
            shape.append(values.type.list_size)
            values = values.flatten()
        return values.to_numpy(zero_copy_only=False).reshape(shape)
    return col.to_numpy(zero_copy_only=False)


def _numpy_kind(name: str, typ: pa.DataType, output: str) -> str:
    if pa.types.is_integer(typ) or pa.types.is_floating(typ) or pa.types.is_boolean(typ):
        return "primitive"
    if isinstance(typ, pa.FixedShapeTensorType):
        return "tensor"
    if pa.types.is_fixed_size_list(typ):
        inner = typ
        while pa.types.is_fixed_size_list(inner):
            inner = inner.value_type
        if pa.types.is_integer(inner) or pa.types.is_floating(inner) or pa.types.is_boolean(inner):
            return "fixed_list"
    if pa.types.is_string(typ) or pa.types.is_large_string(typ) or pa.types.is_binary(typ) or pa.types.is_large_binary(typ):
        return "list"
    raise ConversionError(
        f"column {name!r} has Arrow type {typ}, which cannot become output={output!r} yet; "
        f"use output='arrow' or 'python', or drop it from columns="
    )


def _torch_from_numpy(torch: Any, array: np.ndarray) -> Any:
    if array.dtype == np.uint64:
        raise ConversionError("uint64 columns have no torch dtype; cast them in a transform")
    return torch.from_numpy(array)


_torch: Any = None


def _import_torch() -> Any:
    global _torch
    if _torch is None:
        try:
            import torch
        except ImportError as exc:
            raise ImportError(
                "output='torch' needs PyTorch: pip install 'lanceloader[torch]'"
            ) from exc
        # Arrow buffers are read-only; the tensors are fresh per batch and never shared, so the
        # warning torch gives for wrapping them is noise. Silence exactly that message, once.
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        _torch = torch
    return _torch
