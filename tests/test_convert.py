from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch

from lanceloader.convert import ConversionError, check_output, check_schema, to_output


def sample_batch() -> pa.RecordBatch:
    x = np.arange(12, dtype=np.float32)
    return pa.record_batch(
        {
            "i": pa.array([1, 2, 3], pa.int64()),
            "f": pa.array([0.5, 1.5, 2.5], pa.float16()),
            "b": pa.array([True, False, True]),
            "v": pa.FixedSizeListArray.from_arrays(pa.array(x), 4),
            "m": pa.FixedSizeListArray.from_arrays(pa.FixedSizeListArray.from_arrays(pa.array(x), 2), 2),
            "t": pa.FixedShapeTensorArray.from_numpy_ndarray(x.reshape(3, 2, 2)),
            "s": pa.array(["a", "bb", "ccc"]),
            "y": pa.array([b"x", b"y", b"z"], pa.binary()),
        }
    )


def test_numpy_shapes_and_types() -> None:
    out = to_output(sample_batch(), "numpy")
    assert out["i"].dtype == np.int64 and out["i"].tolist() == [1, 2, 3]
    assert out["f"].dtype == np.float16
    assert out["b"].dtype == np.bool_ and out["b"].tolist() == [True, False, True]
    assert out["v"].shape == (3, 4) and out["v"][2].tolist() == [8, 9, 10, 11]
    assert out["m"].shape == (3, 2, 2) and out["t"].shape == (3, 2, 2)
    np.testing.assert_array_equal(out["m"], out["t"])
    assert out["s"] == ["a", "bb", "ccc"] and out["y"] == [b"x", b"y", b"z"]


def test_primitives_and_fixed_lists_are_zero_copy_even_in_a_slice() -> None:
    batch = sample_batch().slice(1, 2)
    out = to_output(batch, "numpy")
    values = batch.column("v").values
    # The array's memory lies inside the Arrow buffer: no copy was made.
    buf = values.buffers()[1]
    assert buf.address <= out["v"].ctypes.data < buf.address + buf.size
    assert out["v"][0].tolist() == [4, 5, 6, 7]
    ibuf = batch.column("i").buffers()[1]
    assert out["i"].ctypes.data == ibuf.address + 8 * batch.column("i").offset


def test_torch_wraps_numpy_without_copy() -> None:
    batch = sample_batch()
    out = to_output(batch, "torch")
    assert out["v"].dtype == torch.float32 and tuple(out["v"].shape) == (3, 4)
    assert out["v"].data_ptr() == batch.column("v").values.buffers()[1].address
    assert out["s"] == ["a", "bb", "ccc"]


def test_arrow_and_python_outputs() -> None:
    batch = sample_batch()
    assert to_output(batch, "arrow") is batch
    assert to_output(batch.select(["i"]), "python") == {"i": [1, 2, 3]}


def test_nulls_name_the_column_and_count() -> None:
    batch = pa.record_batch({"score": pa.array([1.0, None, None])})
    with pytest.raises(ConversionError, match=r"column 'score' \(double\) has 2 null values"):
        to_output(batch, "numpy")


def test_unconvertible_column_is_reported_before_loading() -> None:
    schema = pa.schema([("ok", pa.int32()), ("tags", pa.list_(pa.string()))])
    with pytest.raises(ConversionError, match=r"column 'tags' has Arrow type list<item: string>"):
        check_schema(schema, "numpy")
    check_schema(schema, "arrow")


def test_unknown_and_unimplemented_outputs() -> None:
    with pytest.raises(ValueError, match="output must be one of"):
        check_output("pandas")
    with pytest.raises(NotImplementedError, match="output='jax'"):
        check_output("jax")
