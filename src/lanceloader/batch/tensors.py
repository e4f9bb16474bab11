"""NumPy arrays to torch, JAX or TensorFlow tensors, imported only when asked for; and what every
step of the conversion shares: :class:`ConversionError`, checked casts, and :func:`split_rows`
(per-row samples, :class:`~lanceloader.batch.byterows.ByteRows` included).

``output.py`` turns Arrow columns into NumPy arrays (zero-copy where Arrow allows); this module
wraps those arrays for the framework: ``torch.from_numpy`` (no copy), ``jax.device_put`` (no copy
on the CPU when aligned), ``tf.convert_to_tensor`` (a copy).

>>> to_framework({"x": np.arange(3)}, "", "torch")["x"].tolist()
[0, 1, 2]
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np

from lanceloader.batch.byterows import ByteRows

FRAMEWORKS = ("torch", "jax", "tf")


class ConversionError(TypeError):
    """A column that cannot become the requested output type. ``row``: for nulls found in a
    batch, the first null row's index in that batch (the loader's note maps it to the dataset's
    fragment and row); ``None`` otherwise."""

    __module__ = "lanceloader"  # where users meet it: ``lanceloader.ConversionError``
    row: int | None = None


def uint64_message(path: str) -> str:
    """Why a uint64 column cannot become a torch tensor, and the cast that fixes it."""
    return (
        f"column {path!r} is uint64, which torch tensors barely support (no +, no indexing); "
        f"cast it: casts={{{path!r}: 'int64'}} (values must be below 2**63)"
    )


def cast_checked(path: str, array: np.ndarray, dtype: np.dtype, fix: str) -> np.ndarray:
    """``array`` as ``dtype``; integers are checked to fit, floats never silently become ints.

    >>> cast_checked("id", np.array([1, 2**40]), np.dtype("int32"), "use int64")
    Traceback (most recent call last):
    ...
    lanceloader.ConversionError: column 'id' has values up to 1099511627776, which do not fit int32; use int64
    """
    if array.dtype.kind in "iu" and dtype.kind in "iu" and array.size:
        info = np.iinfo(dtype)
        low, high = int(array.min()), int(array.max())
        if high > info.max or low < info.min:
            bound = f"up to {high}" if high > info.max else f"down to {low}"
            raise ConversionError(
                f"column {path!r} has values {bound}, which do not fit {dtype}; {fix}"
            )
    elif array.dtype.kind == "f" and dtype.kind in "iub":
        raise ConversionError(
            f"column {path!r} is {array.dtype}, which {dtype} would truncate; round it in a "
            "transform instead"
        )
    return array.astype(dtype)


# --- NumPy to the framework --------------------------------------------------------------------


def split_rows(
    batch: Any,
    consumer: str = "per-row samples",
    fix: str = "have the transform return a RecordBatch or a dict of columns",
) -> list[Any]:
    """Per-row samples of a converted batch: one dict per row, views of its arrays and tensors
    (a torch tensor is unbound along its first axis), one ``bytes`` per row of a
    :class:`ByteRows`, a one-row slice per row of a ``RecordBatch``. What torch's default
    collate and Grain's ``DataSource`` hand out; ``consumer`` and ``fix`` complete the error
    for anything else.

    >>> split_rows({"a": np.array([1, 2]), "b": {"c": ["x", "y"]}})
    [{'a': np.int64(1), 'b': {'c': 'x'}}, {'a': np.int64(2), 'b': {'c': 'y'}}]
    >>> split_rows({"raw": ByteRows.from_list([b"ab", b"c"])})
    [{'raw': b'ab'}, {'raw': b'c'}]
    """
    if isinstance(batch, Mapping):
        names = list(batch)
        columns = [split_rows(batch[name], consumer, fix) for name in names]
        sizes = {name: len(col) for name, col in zip(names, columns, strict=True)}
        if len(set(sizes.values())) > 1:
            raise ValueError(f"the batch's columns have different numbers of rows: {sizes}")
        return [dict(zip(names, values, strict=True)) for values in zip(*columns, strict=True)]
    if isinstance(batch, ByteRows):
        return batch.to_list()
    if isinstance(batch, np.ndarray) and batch.ndim:
        return list(batch)
    if isinstance(batch, (list, tuple)):
        return list(batch)
    if type(batch).__module__.startswith("torch") and getattr(batch, "ndim", 0):
        return list(batch.unbind(0))
    if type(batch).__name__ == "RecordBatch" and hasattr(batch, "num_rows"):
        return [batch.slice(i, 1) for i in range(batch.num_rows)]
    raise TypeError(f"cannot split a {type(batch).__name__} into rows for {consumer}; {fix}")


def to_framework(value: Any, path: str, output: str) -> Any:
    """Numeric arrays in ``value`` (nested dicts, lists of arrays) as ``output`` tensors; text and
    everything else as they are. ``path`` names the column in errors."""
    if isinstance(value, dict):
        return {k: to_framework(v, f"{path}.{k}" if path else k, output) for k, v in value.items()}
    if isinstance(value, np.ndarray):
        return _TENSORS[output](path, value) if _is_numeric(value.dtype) else value
    if isinstance(value, list) and value and isinstance(value[0], np.ndarray):
        return [_TENSORS[output](path, v) for v in value]
    return value


def _is_numeric(dtype: np.dtype) -> bool:
    return dtype.kind in "biuf" or is_bfloat16(dtype)


def _torch_tensor(path: str, array: np.ndarray) -> Any:
    torch = _import_torch()
    if array.dtype == np.uint64:
        raise ConversionError(uint64_message(path))
    if is_bfloat16(array.dtype):
        return torch.from_numpy(array.view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def _jax_array(path: str, array: np.ndarray) -> Any:
    jax = _import_jax()
    if array.dtype.kind in "iu" and array.dtype.itemsize == 8 and not jax.config.jax_enable_x64:
        cast_checked(  # JAX would wrap these values silently: check them, keep the array
            path,
            array,
            np.dtype("int32" if array.dtype.kind == "i" else "uint32"),
            "JAX without x64 wraps them; enable x64 (jax.config.update('jax_enable_x64', True)) "
            "or cast the column to a float dtype",
        )
    return jax.device_put(array)


def _tf_tensor(path: str, array: np.ndarray) -> Any:
    return _import_tf().convert_to_tensor(array)


_TENSORS = {"torch": _torch_tensor, "jax": _jax_array, "tf": _tf_tensor}


# --- lazy imports ------------------------------------------------------------------------------

_modules: dict[str, Any] = {}


def _import(module: str, output: str, install: str) -> Any:
    if module not in _modules:
        try:
            _modules[module] = __import__(module)
        except ImportError as exc:
            raise ImportError(f"output={output!r} needs {module}: pip install {install}") from exc
    return _modules[module]


def _import_torch() -> Any:
    if "torch" not in _modules:
        _import(
            "torch",
            "torch",
            "torch --index-url https://download.pytorch.org/whl/cpu "
            "(the CPU build; for CUDA pick the command for your driver at "
            "https://pytorch.org/get-started/locally/: a plain 'pip install torch' on Linux "
            "downloads a multi-GB CUDA build)",
        )
        # Arrow buffers are read-only; the tensors are fresh per batch and never shared, so the
        # warning torch gives for wrapping them is noise. Silence exactly that message, once.
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
    return _modules["torch"]


def _import_jax() -> Any:
    return _import("jax", "jax", "jax (CPU) or 'jax[cuda12]' (GPU)")


def _import_tf() -> Any:
    return _import("tensorflow", "tf", "tensorflow (or tensorflow-cpu)")


_IMPORTERS = {"torch": _import_torch, "jax": _import_jax, "tf": _import_tf}


def bfloat16() -> np.dtype:
    """ml_dtypes' bfloat16, the NumPy dtype of Lance's bfloat16 columns."""
    try:
        import ml_dtypes
    except ImportError as exc:
        raise ImportError(
            "a lance.bfloat16 column needs ml_dtypes to become NumPy: pip install ml_dtypes"
        ) from exc
    return np.dtype(ml_dtypes.bfloat16)


def is_bfloat16(dtype: np.dtype) -> bool:
    """Whether ``dtype`` is ml_dtypes' bfloat16 (without importing ml_dtypes)."""
    return dtype.kind == "V" and dtype.name == "bfloat16"


def import_framework(output: str) -> Any:
    """The module for ``output`` (``"torch"``, ``"jax"`` or ``"tf"``), imported once, with an
    install hint when it is missing."""
    return _IMPORTERS[output]()
