from __future__ import annotations

import ctypes
import datetime as dt
import importlib.util
import io
import mmap
import pickle
import subprocess
import sys
from pathlib import Path

import lance
import ml_dtypes
import numpy as np
import pyarrow as pa
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from lance.arrow import BFloat16Array

import lanceloader as ll
from lanceloader.batch import tensors
from lanceloader.batch.checks import check_output, check_schema
from lanceloader.batch.output import (
    Conversion,
    ConversionError,
    Padded,
    as_conversion,
    column_to_numpy,
    to_output,
)
from lanceloader.batch.transforms import apply_transform

# Arrow memory is read-only; the loader silences torch's warning about wrapping it once per process,
# but pytest resets warning filters for every test.
pytestmark = pytest.mark.filterwarnings("ignore:The given NumPy array is not writable")


TESTS = Path(__file__).resolve().parents[1]  # tests/


def sample_batch() -> pa.RecordBatch:
    x = np.arange(12, dtype=np.float32)
    return pa.record_batch(
        {
            "i": pa.array([1, 2, 3], pa.int64()),
            "f": pa.array([0.5, 1.5, 2.5], pa.float16()),
            "b": pa.array([True, False, True]),
            "v": pa.FixedSizeListArray.from_arrays(pa.array(x), 4),
            "m": pa.FixedSizeListArray.from_arrays(
                pa.FixedSizeListArray.from_arrays(pa.array(x), 2), 2
            ),
            "t": pa.FixedShapeTensorArray.from_numpy_ndarray(x.reshape(3, 2, 2)),
            "s": pa.array(["a", "bb", "ccc"]),
            "y": pa.array([b"x", b"y", b"z"], pa.binary()),
        }
    )


def bf16(values: list[float]) -> pa.Array:
    return BFloat16Array.from_numpy(np.array(values, dtype=ml_dtypes.bfloat16))


def inside(array_address: int, buf: pa.Buffer) -> bool:
    return buf.address <= array_address < buf.address + buf.size


# --- NumPy: every type -------------------------------------------------------------------------


def test_numpy_shapes_and_types() -> None:
    out = to_output(sample_batch(), "numpy")
    assert out["i"].dtype == np.int64 and out["i"].tolist() == [1, 2, 3]
    assert out["f"].dtype == np.float16
    assert out["b"].dtype == np.bool_ and out["b"].tolist() == [True, False, True]
    assert out["v"].shape == (3, 4) and out["v"][2].tolist() == [8, 9, 10, 11]
    assert out["m"].shape == (3, 2, 2) and out["t"].shape == (3, 2, 2)
    np.testing.assert_array_equal(out["m"], out["t"])
    assert out["s"] == ["a", "bb", "ccc"] and out["y"] == [b"x", b"y", b"z"]


@pytest.mark.parametrize(
    "typ", [pa.int8(), pa.int16(), pa.int32(), pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64()]
)
def test_every_integer_width_keeps_its_dtype(typ: pa.DataType) -> None:
    out = column_to_numpy("n", pa.array([0, 1, 100], typ))
    assert out.dtype == np.dtype(typ.to_pandas_dtype()) and out.tolist() == [0, 1, 100]


def test_bfloat16_becomes_ml_dtypes_without_copy() -> None:
    col = bf16([1.0, 2.5, -3.0, 4.0]).slice(1, 2)
    out = column_to_numpy("w", col)
    assert out.dtype == ml_dtypes.bfloat16 and out.astype(np.float32).tolist() == [2.5, -3.0]
    assert out.ctypes.data == col.storage.buffers()[1].address + 2 * col.storage.offset


def test_temporal_columns_are_integers_in_their_unit() -> None:
    when = dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)
    batch = pa.record_batch(
        {
            "ts_ms": pa.array([when], pa.timestamp("ms", tz="UTC")),
            "ts_us": pa.array([when.replace(tzinfo=None)], pa.timestamp("us")),
            "d32": pa.array([dt.date(1970, 1, 11)], pa.date32()),
            "d64": pa.array([dt.date(1970, 1, 2)], pa.date64()),
            "t32": pa.array([dt.time(0, 1, 2)], pa.time32("s")),
            "dur": pa.array([dt.timedelta(seconds=3)], pa.duration("ms")),
        }
    )
    out = to_output(batch, "numpy")
    assert out["ts_ms"].dtype == np.int64 and out["ts_ms"][0] == int(when.timestamp() * 1000)
    assert out["ts_us"][0] == int(when.timestamp() * 1_000_000)
    assert out["d32"].dtype == np.int32 and out["d32"][0] == 10  # days since 1970-01-01
    assert out["d64"].dtype == np.int64 and out["d64"][0] == 86_400_000  # ms
    assert out["t32"].dtype == np.int32 and out["t32"][0] == 62
    assert out["dur"][0] == 3000


def test_dictionary_columns_are_decoded() -> None:
    batch = pa.record_batch(
        {
            "tag": pa.array(["a", "b", "a"]).dictionary_encode(),
            "code": pa.array([7, 9, 7], pa.int16()).dictionary_encode(),
        }
    )
    out = to_output(batch, "numpy")
    assert out["tag"] == ["a", "b", "a"]
    assert out["code"].dtype == np.int16 and out["code"].tolist() == [7, 9, 7]


def test_structs_become_nested_dicts() -> None:
    inner = pa.StructArray.from_arrays([pa.array([1.0, 2.0])], names=["c"])
    col = pa.StructArray.from_arrays(
        [pa.array([1, 2]), inner, pa.array([[1], [2, 3]])], names=["a", "b", "tok"]
    )
    out = to_output(pa.record_batch({"s": col}), "numpy")
    assert out["s"]["a"].tolist() == [1, 2] and out["s"]["b"]["c"].tolist() == [1.0, 2.0]
    assert out["s"]["tok"].tolist() == [[1, 0], [2, 3]] and out["s"]["tok_lengths"].tolist() == [
        1,
        2,
    ]
    assert to_output(pa.record_batch({"s": col}), "torch")["s"]["b"]["c"].dtype == torch.float64


def test_ragged_lists_pad_with_lengths() -> None:
    batch = pa.record_batch({"tok": pa.array([[1, 2, 3], [], [4]], pa.list_(pa.int32()))})
    out = to_output(batch, Conversion(pad_value=-1))
    assert out["tok"].dtype == np.int32
    assert out["tok"].tolist() == [[1, 2, 3], [-1, -1, -1], [4, -1, -1]]
    assert out["tok_lengths"].dtype == np.int64 and out["tok_lengths"].tolist() == [3, 0, 1]
    fixed = to_output(batch.slice(1), Conversion(pad_to=4))
    assert fixed["tok"].tolist() == [[0, 0, 0, 0], [4, 0, 0, 0]]
    with pytest.raises(
        ConversionError, match=r"column 'tok' has a row of 3 values, longer than pad_to=2"
    ):
        to_output(batch, Conversion(pad_to=2))


def test_ragged_lists_of_vectors_pad_to_3d() -> None:
    values = pa.FixedSizeListArray.from_arrays(pa.array(np.arange(6, dtype=np.float32)), 2)
    col = pa.LargeListArray.from_arrays(pa.array([0, 2, 3], pa.int64()), values)
    out = column_to_numpy("pts", col)
    assert isinstance(out, Padded) and out.values.shape == (2, 2, 2)
    assert out.values[1].tolist() == [[4, 5], [0, 0]] and out.lengths.tolist() == [2, 1]


def test_ragged_list_mode_gives_views_of_arrow_memory() -> None:
    col = pa.array([[1.0, 2.0], [3.0], [4.0, 5.0, 6.0]]).slice(1)
    out = column_to_numpy("x", col, Conversion(ragged="list"))
    assert [a.tolist() for a in out] == [[3.0], [4.0, 5.0, 6.0]]
    assert all(inside(a.ctypes.data, col.values.buffers()[1]) for a in out)
    tensors = to_output(pa.record_batch({"x": col}), Conversion(output="torch", ragged="list"))
    assert [t.tolist() for t in tensors["x"]] == [[3.0], [4.0, 5.0, 6.0]]


def test_strings_as_numpy_arrays() -> None:
    batch = pa.record_batch({"s": pa.array(["a", "bb"]), "y": pa.array([b"\x00z", b"y\x00"])})
    out = to_output(batch, Conversion(strings="numpy"))
    assert out["s"].dtype == np.dtypes.StringDType() and out["s"].tolist() == ["a", "bb"]
    assert out["y"].dtype == object and out["y"].tolist() == [b"\x00z", b"y\x00"]  # no NUL loss
    assert to_output(batch, Conversion(output="torch", strings="numpy"))["s"].tolist() == [
        "a",
        "bb",
    ]


def test_permuted_tensors_follow_arrow() -> None:
    typ = pa.fixed_shape_tensor(pa.float32(), [2, 3], permutation=[1, 0])
    storage = pa.FixedSizeListArray.from_arrays(pa.array(np.arange(12, dtype=np.float32)), 6)
    col = pa.ExtensionArray.from_storage(typ, storage)
    np.testing.assert_array_equal(column_to_numpy("t", col), col.to_numpy_ndarray())


# --- nulls -------------------------------------------------------------------------------------


def test_nulls_name_the_column_and_count() -> None:
    batch = pa.record_batch({"score": pa.array([1.0, None, None])})
    with pytest.raises(ConversionError, match=r"column 'score' \(double\) has 2 null values"):
        to_output(batch, "numpy")


def test_nulls_take_the_fill_value_per_column() -> None:
    vec = pa.FixedSizeListArray.from_arrays(pa.array([1.0, None, 3.0, 4.0, 5.0, 6.0]), 2)
    vec = pa.FixedSizeListArray.from_arrays(vec.values, 2, mask=pa.array([False, False, True]))
    batch = pa.record_batch(
        {
            "i": pa.array([1, None, 3], pa.int32()),
            "b": pa.array([True, None, False]),
            "v": vec,
            "s": pa.array(["a", None, "c"]),
            "w": bf16([1.0, 2.0, 3.0]),
            "tok": pa.array([[1], None, [2, 3]]),
            "st": pa.StructArray.from_arrays(
                [pa.array([1, 2, 3])], names=["a"], mask=pa.array([False, True, False])
            ),
        }
    )
    fills = {"i": -1, "b": True, "v": 0.0, "s": "", "tok": 9, "st.a": 0}
    out = to_output(batch, Conversion(fill_nulls=fills))
    assert out["i"].tolist() == [1, -1, 3] and out["i"].dtype == np.int32
    assert out["b"].tolist() == [True, True, False]
    assert out["v"].tolist() == [[1, 0], [3, 4], [0, 0]]  # element null and row null
    assert out["s"] == ["a", "", "c"]
    assert out["tok"].tolist() == [[1, 0], [0, 0], [2, 3]] and out["tok_lengths"].tolist() == [
        1,
        0,
        2,
    ]
    assert out["st"]["a"].tolist() == [1, 0, 3]  # a null struct makes its fields null
    assert batch.column("i").to_pylist() == [1, None, 3]  # the source is untouched


def test_fill_values_must_fit_the_dtype() -> None:
    batch = pa.record_batch({"u": pa.array([1, None], pa.uint8())})
    with pytest.raises(
        ConversionError, match=r"fill_nulls value -1 for column 'u' does not fit its dtype uint8"
    ):
        to_output(batch, Conversion(fill_nulls={"u": -1}))
    with pytest.raises(ConversionError, match=r"fill_nulls value 0.5 for column 'u'"):
        to_output(batch, Conversion(fill_nulls={"u": 0.5}))
    with pytest.raises(
        ConversionError,
        match=r"fill_nulls value 0 for column 's' does not fit its type string; use a str",
    ):
        to_output(pa.record_batch({"s": pa.array(["a", None])}), Conversion(fill_nulls={"s": 0}))


# --- casts and the integer policy --------------------------------------------------------------


def test_casts_check_that_values_fit() -> None:
    batch = pa.record_batch({"id": pa.array([1, 2**40], pa.uint64())})
    out = to_output(batch.slice(0, 1), Conversion(casts={"id": "int32"}))
    assert out["id"].dtype == np.int32 and out["id"].tolist() == [1]
    with pytest.raises(
        ConversionError, match=r"column 'id' has values up to 1099511627776, which do not fit int32"
    ):
        to_output(batch, Conversion(casts={"id": "int32"}))
    with pytest.raises(ConversionError, match=r"column 'x' is float64, which int64 would truncate"):
        to_output(pa.record_batch({"x": [0.5]}), Conversion(casts={"x": "int64"}))


def test_uint64_for_torch_needs_an_explicit_cast() -> None:
    batch = pa.record_batch({"id": pa.array([1, 2], pa.uint64())})
    with pytest.raises(ConversionError, match=r"column 'id' is uint64.*casts=\{'id': 'int64'\}"):
        check_schema(batch.schema, "torch")
    with pytest.raises(ConversionError, match=r"column 'id' is uint64"):
        to_output(batch, "torch")
    conversion = Conversion(output="torch", casts={"id": "int64"})
    check_schema(batch.schema, conversion)
    assert to_output(batch, conversion)["id"].dtype == torch.int64
    assert to_output(batch, "numpy")["id"].dtype == np.uint64  # NumPy keeps it
    check_schema(pa.schema([("n", pa.uint32())]), "torch")  # torch.uint32 exists


# --- options and schema checks -----------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"output": "pandas"}, ValueError, r"output must be one of \('arrow', 'numpy'"),
        ({"ragged": "zip"}, ValueError, r"ragged must be 'pad' .* got 'zip'"),
        ({"strings": "array"}, ValueError, r"strings must be 'list' or 'numpy', got 'array'"),
        ({"pad_value": "x"}, TypeError, r"pad_value must be an int or a float, got 'x'"),
        ({"pad_to": 0}, ValueError, r"pad_to must be None or an int >= 1, got 0"),
        ({"fill_nulls": [("a", 1)]}, TypeError, r"fill_nulls must be a dict .* got list"),
        ({"fill_nulls": {"a": None}}, TypeError, r"fill_nulls\['a'\] must be a number"),
        ({"casts": {"a": "object"}}, ValueError, r"casts\['a'\] must name a NumPy bool"),
        ({"casts": {"a": "nope"}}, ValueError, r"casts\['a'\] must name"),
        ({"output": "arrow", "ragged": "list"}, ValueError, r"ragged only apply to array outputs"),
    ],
)
def test_bad_options_name_the_argument(kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        Conversion(**kwargs)


def test_conversion_normalises_and_pickles() -> None:
    import pickle

    c = Conversion(output="torch", fill_nulls={"a": 1}, casts={"b": np.int32})
    assert c.casts == {"b": "int32"} and pickle.loads(pickle.dumps(c)) == c
    assert as_conversion("jax") == Conversion(output="jax") and as_conversion(c) is c
    with pytest.raises(
        TypeError, match=r"output must be a string such as 'numpy' or a lanceloader\.Conversion"
    ):
        as_conversion(3)


def test_nested_lists_become_one_python_list_per_row() -> None:
    batch = pa.record_batch(
        {
            "tags": pa.array([["a", "b"], [], ["c", None]]),
            "sents": pa.array([[[1, 2], [3]], [[4]], []]),
            "spans": pa.array([[{"s": 0, "e": 2}], [], [{"s": 1, "e": 1}]]),
        }
    )
    for output in ("numpy", "torch", "jax", "tf"):
        out = to_output(batch, output)
        assert out["tags"] == [["a", "b"], [], ["c", None]]
        assert out["sents"] == [[[1, 2], [3]], [[4]], []]
        assert out["spans"] == [[{"s": 0, "e": 2}], [], [{"s": 1, "e": 1}]]
    check_schema(batch.schema, "torch")
    holes = pa.record_batch({"tags": pa.array([["a"], None])})
    with pytest.raises(
        ConversionError,
        match=r"column 'tags' .* has 1 null values \(of 2\); "
        r"fill them: Loader\(\.\.\., fill_nulls=\{'tags': \[\]\}\)",
    ):
        to_output(holes, "numpy")
    with pytest.raises(ConversionError, match=r"got fill_nulls\['tags'\]='xy', not a list"):
        to_output(holes, Conversion(fill_nulls={"tags": "xy"}))
    check_schema(pa.schema([("ids", pa.list_(pa.list_(pa.uint64())))]), "torch")  # Python ints
    assert to_output(holes, Conversion(fill_nulls={"tags": []}))["tags"] == [["a"], []]


def test_unconvertible_column_is_reported_before_loading() -> None:
    schema = pa.schema([("ok", pa.int32()), ("m", pa.map_(pa.string(), pa.int64()))])
    with pytest.raises(ConversionError, match=r"column 'm' has Arrow type map<string, int64>"):
        check_schema(schema, "numpy")
    check_schema(schema, "arrow")
    with pytest.raises(ConversionError, match=r"column 'd' has Arrow type decimal128"):
        check_schema(pa.schema([("d", pa.decimal128(5, 2))]), "torch")


def test_schema_check_catches_name_clashes_and_unknown_options() -> None:
    schema = pa.schema([("tok", pa.list_(pa.int32())), ("tok_lengths", pa.int32())])
    with pytest.raises(
        ConversionError, match=r"ragged='pad' adds 'tok_lengths', which already exists"
    ):
        check_schema(schema, "numpy")
    check_schema(schema, Conversion(ragged="list"))
    with pytest.raises(
        ValueError, match=r"fill_nulls names \['tokens'\], which the data does not have"
    ):
        check_schema(schema, Conversion(ragged="list", fill_nulls={"tokens": 0}))


def test_outputs_are_checked_and_imported() -> None:
    with pytest.raises(ValueError, match="output must be one of"):
        check_output("pandas")
    for output in ("numpy", "torch"):  # jax and tf: in their own process, below
        assert check_output(output).output == output


def test_missing_framework_names_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "jax", None)  # what `import jax` sees when it is missing
    monkeypatch.setattr(tensors, "_modules", {})
    with pytest.raises(ImportError, match=r"output='jax' needs jax: pip install jax"):
        check_output("jax")


# --- zero copy ---------------------------------------------------------------------------------


def test_primitives_and_fixed_lists_are_zero_copy_even_in_a_slice() -> None:
    batch = sample_batch().slice(1, 2)
    out = to_output(batch, "numpy")
    values = batch.column("v").values
    # The array's memory lies inside the Arrow buffer: no copy was made.
    assert inside(out["v"].ctypes.data, values.buffers()[1])
    assert out["v"][0].tolist() == [4, 5, 6, 7]
    ibuf = batch.column("i").buffers()[1]
    assert out["i"].ctypes.data == ibuf.address + 8 * batch.column("i").offset
    tbuf = batch.column("t").storage.values.buffers()[1]
    assert out["t"].ctypes.data == tbuf.address + 4 * 4 * 1  # row 1 of [2, 2] float32 tensors


def test_torch_wraps_numpy_without_copy() -> None:
    batch = sample_batch()
    out = to_output(batch, "torch")
    assert out["v"].dtype == torch.float32 and tuple(out["v"].shape) == (3, 4)
    assert out["v"].data_ptr() == batch.column("v").values.buffers()[1].address
    assert out["t"].data_ptr() == batch.column("t").storage.values.buffers()[1].address
    assert out["f"].dtype == torch.float16 and out["b"].dtype == torch.bool
    assert out["s"] == ["a", "bb", "ccc"]


def test_bfloat16_through_lance_to_torch(tmp_path) -> None:
    # Through a real Lance dataset: pylance 14 stores and returns the lance.bfloat16 extension.
    batch = bfloat16_dataset(str(tmp_path)).to_table().to_batches()[0]
    assert batch.schema.field("w").type.extension_name == "lance.bfloat16"
    t = to_output(batch, "torch")
    assert t["w"].dtype == torch.bfloat16 and t["w"].tolist() == [1.0, 2.5]
    assert t["vec"].shape == (2, 2) and t["vec"].dtype == torch.bfloat16
    assert t["w"].data_ptr() == batch.column("w").storage.buffers()[1].address


def bfloat16_dataset(directory: str) -> lance.LanceDataset:
    vec = pa.FixedSizeListArray.from_arrays(bf16([0.5, 1.0, 1.5, 2.0]), 2)
    table = pa.table({"w": bf16([1.0, 2.5]), "vec": vec})
    return lance.write_dataset(table, f"{directory}/bf.lance", mode="overwrite")


# --- JAX and TensorFlow ------------------------------------------------------------------------
# Each framework runs in a fresh process: importing JAX or TensorFlow starts threads, and other
# test modules fork this process to test fork-safety, which threads would make unlike a user's.


def run_isolated(check: str, *args: str) -> None:
    """Run ``check(*args)``, a function of this module, in a fresh Python process."""
    here = str(Path(__file__).resolve().parent)
    code = (
        f"import sys; sys.path[:0] = [{here!r}, {str(TESTS)!r}]; import test_conversion; "
        f"test_conversion.{check}(*sys.argv[1:])"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-4000:]


def jax_checks(uri: str, directory: str) -> None:
    import jax
    import jax.numpy as jnp

    assert check_output("jax").output == "jax"
    out = to_output(sample_batch(), "jax")
    assert isinstance(out["v"], jax.Array) and out["v"].shape == (3, 4)
    assert out["i"].tolist() == [1, 2, 3] and out["b"].dtype == bool
    assert out["s"] == ["a", "bb", "ccc"]
    bf = to_output(bfloat16_dataset(directory).to_table().to_batches()[0], "jax")
    assert bf["vec"].dtype == jnp.bfloat16 and bf["w"].tolist() == [1.0, 2.5]
    # JAX shares read-only memory that is 64-byte aligned, as Arrow allocates it.
    aligned = pa.allocate_buffer(64 * 4)
    np.frombuffer(aligned, np.float32)[:] = np.arange(64, dtype=np.float32)
    col = pa.Array.from_buffers(pa.float32(), 64, [None, aligned])
    assert (
        to_output(pa.record_batch({"x": col}), "jax")["x"].unsafe_buffer_pointer()
        == aligned.address
    )
    # Without x64, JAX would silently wrap 64-bit values that do not fit 32 bits.
    assert not jax.config.jax_enable_x64
    wide = pa.record_batch({"id": pa.array([1, 2**40])})
    with pytest.raises(
        ConversionError,
        match=r"column 'id' has values up to 1099511627776.*JAX without x64 wraps them",
    ):
        to_output(wide, "jax")
    assert to_output(wide.slice(0, 1), "jax")["id"].tolist() == [1]
    batch = next(iter(ll.Loader(uri, batch_size=8, columns=["id", "x", "text"], output="jax")))
    assert isinstance(batch["x"], jax.Array) and batch["x"].shape == (8, 64)


def tf_checks(uri: str, directory: str) -> None:
    import tensorflow as tf

    assert check_output("tf").output == "tf"
    out = to_output(sample_batch(), "tf")
    assert isinstance(out["t"], tf.Tensor) and out["t"].shape == (3, 2, 2)
    assert out["f"].dtype == tf.float16 and out["i"].numpy().tolist() == [1, 2, 3]
    wide = pa.record_batch({"u": pa.array([2**63], pa.uint64())})
    assert to_output(wide, "tf")["u"].dtype == tf.uint64
    bf = to_output(bfloat16_dataset(directory).to_table().to_batches()[0], "tf")
    assert bf["w"].dtype == tf.bfloat16 and bf["vec"].shape == (2, 2)
    batch = next(iter(ll.Loader(uri, batch_size=8, columns=["id", "x", "text"], output="tf")))
    assert isinstance(batch["x"], tf.Tensor) and batch["x"].shape == (8, 64)
    assert len(batch["text"]) == 8


@pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="jax is not installed")
def test_jax_output(small_uri: str, tmp_path) -> None:
    run_isolated("jax_checks", small_uri, str(tmp_path))


@pytest.mark.skipif(
    importlib.util.find_spec("tensorflow") is None, reason="tensorflow is not installed"
)
def test_tf_output(small_uri: str, tmp_path) -> None:
    run_isolated("tf_checks", small_uri, str(tmp_path))


# --- other inputs ------------------------------------------------------------------------------


def test_arrow_and_python_outputs() -> None:
    batch = sample_batch()
    assert to_output(batch, "arrow") is batch
    assert to_output(batch.select(["i"]), "python") == {"i": [1, 2, 3]}


def test_tables_and_dicts_convert_like_batches() -> None:
    table = pa.Table.from_batches([sample_batch(), sample_batch()])
    assert to_output(table, "numpy")["v"].shape == (6, 4)
    out = to_output(
        {"img": np.zeros((2, 3), np.uint8), "tok": pa.array([[1], [2, 3]]), "n": "x"}, "torch"
    )
    assert (
        out["img"].dtype == torch.uint8
        and out["tok_lengths"].tolist() == [1, 2]
        and out["n"] == "x"
    )


def test_float64_is_not_mistaken_for_bfloat16_without_ml_dtypes() -> None:
    # NumPy compares float64 == None as True: a lazy "bfloat16 dtype or None" check once turned
    # float64 columns into garbage whenever ml_dtypes had not been imported yet.
    code = (
        "import sys, pyarrow as pa\n"
        "from lanceloader.batch.output import to_output\n"
        "out = to_output(pa.record_batch({'d': pa.array([1.5, 2.5])}), 'torch')\n"
        "assert 'ml_dtypes' not in sys.modules, 'test needs ml_dtypes unimported'\n"
        "print(out['d'].dtype, out['d'].tolist())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["torch.float64", "[1.5,", "2.5]"]


# --- nulls through the Loader and the torch datasets ---------------------------------------------

NULL_IDS = (37, 40)  # sequential batches of 16: batch 2, rows 5 and 8; fragment 1 rows 5 and 8


@pytest.fixture
def nulls_uri(tmp_path) -> str:
    """64 rows in fragments of 32: ``score`` (float) and ``name`` (string) null at NULL_IDS."""
    table = pa.table(
        {
            "id": np.arange(64),
            "score": pa.array(
                [None if i in NULL_IDS else float(i) for i in range(64)], pa.float32()
            ),
            "name": pa.array([None if i in NULL_IDS else str(i) for i in range(64)]),
        }
    )
    return str(lance.write_dataset(table, tmp_path / "nulls.lance", max_rows_per_file=32).uri)


def _fix_of(message: str) -> dict:
    """The keyword arguments a null error tells to pass, parsed from its message."""
    import ast
    import re

    fill = re.search(r"Loader\(\.\.\., fill_nulls=(\{.*?\})\)", message)
    filt = re.search(r"filter=('.*?')$", message.splitlines()[0])
    assert fill and filt, message
    return {
        "fill_nulls": ast.literal_eval(fill.group(1)),
        "filter": ast.literal_eval(filt.group(1)),
    }


def test_fill_nulls_is_a_keyword_of_the_loader_and_the_torch_datasets(nulls_uri: str) -> None:
    from lanceloader.torch import IterableDataset, MapDataset

    fills = {"score": -1.0}
    loader = ll.Loader(
        nulls_uri, batch_size=16, columns=["score"], output="torch", fill_nulls=fills
    )
    scores = torch.cat([b["score"] for b in loader])
    assert scores[list(NULL_IDS)].tolist() == [-1.0, -1.0] and scores[36].item() == 36.0
    dataset = IterableDataset(
        nulls_uri, batch_size=16, columns=["score"], output="torch", fill_nulls=fills
    )
    assert torch.cat([b["score"] for b in dataset]).tolist() == scores.tolist()
    rows = MapDataset(nulls_uri, columns=["score"], fill_nulls=fills)
    assert rows[37]["score"].item() == -1.0
    with pytest.raises(ValueError, match="fill_nulls is given twice"):
        ll.Loader(nulls_uri, output=ll.Conversion(fill_nulls={"score": 0.0}), fill_nulls=fills)


def test_nulls_are_refused_at_construction_with_fixes_that_run_as_written(nulls_uri: str) -> None:
    with pytest.raises(ConversionError) as info:
        ll.Loader(nulls_uri, batch_size=16, columns=["id", "score"], output="torch")
    message = str(info.value)
    assert "'score' (float) has 2 null values in the 64 rows this loader reads" in message
    assert "the first: Lance row 37, fragment 1 row 5" in message
    fix = _fix_of(message)
    filled = ll.Loader(
        nulls_uri,
        batch_size=16,
        columns=["id", "score"],
        output="torch",
        fill_nulls=fix["fill_nulls"],
    )
    assert sum(len(b["score"]) for b in filled) == 64
    kept = ll.Loader(
        nulls_uri, batch_size=16, columns=["id", "score"], output="torch", filter=fix["filter"]
    )
    assert sorted(i for b in kept for i in b["id"].tolist()) == [
        i for i in range(64) if i not in NULL_IDS
    ]
    from lanceloader.torch import MapDataset

    with pytest.raises(ConversionError):  # the torch dataset checks the same way
        MapDataset(nulls_uri, columns=["score"])


def test_construction_looks_only_at_the_rows_the_loader_reads(nulls_uri: str) -> None:
    ll.Loader(nulls_uri, columns=["score"], filter="id < 30")  # the nulls are filtered out
    with pytest.raises(ConversionError, match=r"in the 33 rows .* filter='\(id > 30\) AND score"):
        ll.Loader(nulls_uri, columns=["score"], filter="id > 30")
    splits = {"a": 0.5, "b": 0.5}
    holders = [
        s
        for s in splits
        if any(
            i in NULL_IDS
            for b in ll.Loader(nulls_uri, columns=["id"], splits=splits, split=s)
            for i in b["id"].tolist()
        )
    ]
    for split in splits:  # only a split holding a null row is refused
        if split in holders:
            with pytest.raises(ConversionError):
                ll.Loader(nulls_uri, columns=["score"], splits=splits, split=split)
        else:
            ll.Loader(nulls_uri, columns=["score"], splits=splits, split=split)


@pytest.mark.parametrize("worker_type", ["thread", "process"])
def test_nulls_found_in_a_batch_name_the_batch_and_the_row(
    nulls_uri: str, worker_type: str
) -> None:
    """Text columns are not scanned at construction: the batch holding the null says where."""
    loader = ll.Loader(
        nulls_uri, batch_size=16, columns=["name"], worker_type=worker_type, num_workers=2
    )
    with pytest.raises(ConversionError) as info:
        list(loader)
    error = info.value
    assert "first at row 5 of this batch" in str(error)
    note = "\n".join(error.__notes__)
    assert "batch 2 of epoch 0" in note and "its row 5 is position 37: fragment 1 row 5" in note
    fix = _fix_of(str(error))
    assert fix["fill_nulls"] == {"name": ""}
    filled = ll.Loader(nulls_uri, batch_size=16, columns=["name"], fill_nulls=fix["fill_nulls"])
    assert [n for b in filled for n in b["name"]][37] == ""


# --- ByteRows: binary columns as one buffer plus offsets ------------------------------------------

PAYLOADS = [b"\xff\xd8\xffjpeg", b"", b"x" * 300, bytes(range(256)), b"\x00"]
BINARY_TYPES = [pa.binary(), pa.large_binary()] + (
    [pa.binary_view()] if hasattr(pa, "binary_view") else []
)


def fixed_payloads(n: int, width: int = 4) -> list[bytes]:
    return [bytes([i % 256]) * width for i in range(n)]


def mapped(array: np.ndarray) -> bool:
    """Whether ``array`` views a memory mapping (a process worker's shared-memory file, or one
    of its recycled segments: a ctypes array over the mapping, ``engine/segments.py``)."""
    base = array
    while isinstance(base, np.ndarray):
        base = base.base
    return isinstance(base.obj if isinstance(base, memoryview) else base, (mmap.mmap, ctypes.Array))


@pytest.mark.parametrize("typ", BINARY_TYPES, ids=str)
@pytest.mark.parametrize("output", ["numpy", "torch", "jax"])
def test_binary_columns_become_byte_rows_equal_to_the_payloads(typ, output) -> None:
    batch = pa.record_batch({"b": pa.array(PAYLOADS, typ)})
    rows = column_to_numpy("b", batch.column(0), Conversion(output=output))
    assert isinstance(rows, ll.ByteRows) and len(rows) == len(PAYLOADS)
    assert rows.to_list() == PAYLOADS and list(rows) == PAYLOADS and rows == PAYLOADS
    assert [rows[i] for i in range(-len(PAYLOADS), 0)] == PAYLOADS
    assert rows.data.dtype == np.uint8 and rows.offsets.dtype == np.int64
    assert rows.lengths.tolist() == [len(p) for p in PAYLOADS]
    if typ != pa.binary_view():  # a view type has no one buffer: Arrow casts it (one copy)
        assert inside(rows.data.ctypes.data, batch.column(0).buffers()[2])


def test_fixed_size_binary_rows_view_the_buffer() -> None:
    payloads = fixed_payloads(7, width=3)
    col = pa.array(payloads, pa.binary(3))
    rows = column_to_numpy("f", col.slice(2), Conversion())
    assert rows == payloads[2:] and rows.offsets.tolist() == [0, 3, 6, 9, 12, 15]
    assert inside(rows.data.ctypes.data, col.buffers()[1])


@pytest.mark.parametrize("typ", [*BINARY_TYPES, pa.binary(4)], ids=str)
def test_sliced_arrays_give_only_their_rows(typ) -> None:
    payloads = fixed_payloads(9) if pa.types.is_fixed_size_binary(typ) else PAYLOADS * 2
    col = pa.array(payloads, typ)
    for lo, hi in [(1, 4), (3, len(payloads)), (2, 2)]:
        rows = column_to_numpy("b", col.slice(lo, hi - lo), Conversion(output="torch"))
        assert rows == payloads[lo:hi]
        assert rows.offsets[0] == 0 and rows.offsets[-1] == len(rows.data)  # no foreign bytes


@pytest.mark.parametrize("typ", [*BINARY_TYPES, pa.binary(4)], ids=str)
def test_binary_nulls_follow_the_null_rules(typ) -> None:
    fixed = pa.types.is_fixed_size_binary(typ)
    payloads = fixed_payloads(4) if fixed else PAYLOADS[:4]
    col = pa.array([payloads[0], None, payloads[2], payloads[3]], typ)
    with pytest.raises(
        ConversionError,
        match=r"column 'b' .* 1 null values \(of 4\), the first at "
        r"row 1 .*fill_nulls=\{'b': b''\}",
    ):
        column_to_numpy("b", col, Conversion())
    fill = b"????" if fixed else b"?"
    rows = column_to_numpy("b", col, Conversion(fill_nulls={"b": fill}))
    assert isinstance(rows, ll.ByteRows)
    assert rows == [payloads[0], fill, payloads[2], payloads[3]]


@pytest.mark.parametrize("typ", [*BINARY_TYPES, pa.binary(4)], ids=str)
def test_empty_binary_columns_are_empty_byte_rows(typ) -> None:
    for col in (pa.array([], typ), pa.array(fixed_payloads(3), pa.binary(4)).slice(3).cast(typ)):
        rows = column_to_numpy("b", col, Conversion())
        assert len(rows) == 0 and rows == [] and rows.offsets.tolist() == [0]
        assert list(rows) == [] and rows.data.size == 0


def test_binary_list_option_and_tf_keep_lists_of_bytes() -> None:
    col = pa.array(PAYLOADS, pa.large_binary())
    assert column_to_numpy("b", col, Conversion(binary="list")) == PAYLOADS
    assert type(column_to_numpy("b", col, Conversion(binary="list"))) is list
    assert type(column_to_numpy("b", col, Conversion(output="tf"))) is list  # tf.string
    objects = column_to_numpy("b", col, Conversion(strings="numpy"))
    assert objects.dtype == object and objects.tolist() == PAYLOADS
    assert (
        type(column_to_numpy("b", col, Conversion(strings="numpy", binary="rows"))) is ll.ByteRows
    )
    assert to_output(pa.record_batch({"b": col}), "python")["b"] == PAYLOADS
    with pytest.raises(ValueError, match=r"binary must be 'rows'.* or 'list'.*got 'bytes'"):
        Conversion(binary="bytes")
    with pytest.raises(ValueError, match="binary='rows' cannot become output='tf'"):
        Conversion(output="tf", binary="rows")
    with pytest.raises(ValueError, match="binary only apply to array outputs"):
        Conversion(output="arrow", binary="list")


def test_byte_rows_slices_view_and_pickle_only_their_bytes() -> None:
    rows = ll.ByteRows.from_list([b"a" * 1000, b"bc", b"d" * 5000])
    middle = rows[1:2]
    assert isinstance(middle, ll.ByteRows) and middle == [b"bc"]
    assert np.shares_memory(middle.data, rows.data)
    assert rows[::2] == [b"a" * 1000, b"d" * 5000] and rows[5:1] == []
    back = pickle.loads(pickle.dumps(middle))
    assert back == middle and len(pickle.dumps(middle)) < 1000  # not the 6 KB it views
    assert pickle.loads(pickle.dumps(rows)) == rows
    assert bytes(rows.view(1)) == b"bc" and np.shares_memory(rows.view(1), rows.data)
    with pytest.raises(IndexError, match="row 3 of a ByteRows of 3 rows"):
        rows[3]
    assert repr(rows) == "ByteRows(3 rows, 6,002 bytes)" and rows.nbytes == 6002 + 4 * 8


@pytest.mark.parametrize(
    "data, offsets, match",
    [
        (np.zeros(3, np.int32), np.array([0, 3]), "data must be a 1-D uint8 array"),
        (np.zeros(3, np.uint8), np.array([0, 3], np.int32), "offsets must be a 1-D int64"),
        (np.zeros(3, np.uint8), np.array([1, 3]), "offsets must start at 0, got 1"),
        (np.zeros(3, np.uint8), np.array([0, 2]), r"end at len\(data\) = 3, got 2"),
        (np.zeros(3, np.uint8), np.array([0, 2, 1, 3]), "must not decrease"),
    ],
)
def test_byte_rows_refuse_arrays_that_break_its_invariants(data, offsets, match) -> None:
    with pytest.raises(ValueError, match=match):
        ll.ByteRows(data, offsets)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.binary(max_size=20), max_size=12),
    st.integers(-14, 14),
    st.integers(-14, 14),
    st.sampled_from([None, 1, 2, -1]),
)
def test_byte_rows_index_and_slice_as_the_list_does(payloads, lo, hi, step) -> None:
    rows = column_to_numpy("b", pa.array(payloads, pa.binary()), Conversion())
    assert rows[lo:hi:step] == payloads[lo:hi:step]
    assert all(rows[i] == payloads[i] for i in range(-len(payloads), len(payloads)))


@pytest.fixture
def bytes_uri(tmp_path) -> str:
    payloads = [bytes([i % 251]) * (i % 97) for i in range(600)]
    table = pa.table(
        {
            "id": np.arange(600),
            "blob": pa.array(payloads, pa.large_binary()),
            "tag": pa.array(fixed_payloads(600, 2), pa.binary(2)),
        }
    )
    return str(lance.write_dataset(table, tmp_path / "bytes.lance", max_rows_per_file=250).uri)


@pytest.mark.parametrize("worker_type", ["thread", "process"])
def test_byte_rows_through_a_loader(bytes_uri: str, worker_type: str) -> None:
    expected = lance.dataset(bytes_uri).to_table()
    loader = ll.Loader(
        bytes_uri,
        batch_size=64,
        worker_type=worker_type,
        num_workers=2,
        output=ll.Conversion(output="torch"),
    )
    got: dict[str, list] = {"id": [], "blob": [], "tag": []}
    for batch in loader:
        assert isinstance(batch["blob"], ll.ByteRows) and isinstance(batch["tag"], ll.ByteRows)
        assert len(batch["blob"]) == len(batch["id"])
        if worker_type == "process":  # the bytes through shared memory, not pickled bytes
            assert mapped(batch["blob"].data)  # (its offsets rebased per batch by the consumer)
        for name in got:
            got[name].extend(batch[name].tolist() if name == "id" else batch[name])
    assert got == expected.to_pydict()


@pytest.mark.filterwarnings("ignore:lanceloader. forking a process")
def test_byte_rows_through_torch_dataloader_workers(bytes_uri: str) -> None:
    from lanceloader.torch import IterableDataset

    ds = IterableDataset(bytes_uri, batch_size=64, output=ll.Conversion(output="torch"))
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
    rows: dict[int, bytes] = {}
    for batch in loader:
        assert isinstance(batch["blob"], ll.ByteRows)  # torch's collate left it whole
        rows.update(zip(batch["id"].tolist(), batch["blob"], strict=True))
    expected = lance.dataset(bytes_uri).to_table(columns=["id", "blob"]).to_pydict()
    assert rows == dict(zip(expected["id"], expected["blob"], strict=True))


def test_decode_images_reads_sliced_large_binary_with_nulls() -> None:
    from PIL import Image

    def jpeg(value: int) -> bytes:
        buf = io.BytesIO()
        Image.new("RGB", (8, 6), (value, 0, 0)).save(buf, format="JPEG", quality=95)
        return buf.getvalue()

    images = pa.array([jpeg(10), jpeg(60), None, jpeg(200)], pa.large_binary())
    batch = pa.record_batch({"image": images}).slice(1)  # offset != 0
    out, skipped = apply_transform(ll.decode_images("image"), batch, "skip", max_skip_fraction=1.0)
    reds = out.column("image").to_numpy_ndarray()[:, :, :, 0].mean(axis=(1, 2))
    assert np.allclose(reds, [60, 200], atol=4) and skipped == 1
