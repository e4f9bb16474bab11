from __future__ import annotations

import io
import pickle
import sys

import lance
import numpy as np
import pyarrow as pa
import pytest
import torch
from PIL import Image
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

import lanceloader as ll
from lanceloader.batch.images import decode_images, normalise
from lanceloader.batch.output import Conversion, to_output
from lanceloader.batch.text import tokenize
from lanceloader.batch.transforms import (
    Applied,
    BatchTransform,
    Compose,
    ErrorPolicy,
    TooManyRowErrors,
    apply_transform,
    as_transform,
    check_on_error,
    compose,
    map_rows,
    rows_to_batch,
)

# Arrow memory is read-only; the loader silences torch's warning about wrapping it once per process,
# but pytest resets warning filters for every test.
pytestmark = pytest.mark.filterwarnings("ignore:The given NumPy array is not writable")

# --- map_rows, compose, as_transform -----------------------------------------------------------


def parse(row: dict) -> dict:
    """A module-level row function: it pickles, so process workers can use it."""
    return {"x": 10 // row["x"], "vec": np.full(3, row["x"], np.float32), "name": f"n{row['x']}"}


def batch_of(*xs: int) -> pa.RecordBatch:
    return pa.record_batch({"x": pa.array(xs, pa.int64())})


def test_map_rows_assembles_arrow_columns() -> None:
    out = map_rows(parse)(batch_of(1, 2))
    assert isinstance(out, pa.RecordBatch) and out.schema.names == ["x", "vec", "name"]
    assert out.column("x").to_pylist() == [10, 5] and out.column("name").to_pylist() == ["n1", "n2"]
    assert pa.types.is_fixed_size_list(out.column("vec").type)
    assert to_output(out, "torch")["vec"].shape == (2, 3)


def test_rows_to_batch_stacks_tensors_and_keeps_ragged_arrays() -> None:
    images = rows_to_batch([{"img": np.zeros((2, 2, 3), np.uint8)}] * 4).column("img")
    assert images.to_numpy_ndarray().shape == (4, 2, 2, 3)
    ragged = rows_to_batch([{"t": np.arange(2)}, {"t": np.arange(3)}]).column("t")
    assert ragged.to_pylist() == [[0, 1], [0, 1, 2]]
    assert rows_to_batch([]).num_columns == 0
    with pytest.raises(ValueError, match=r"row 1 has keys \['b'\], row 0 has \['a'\]"):
        rows_to_batch([{"a": 1}, {"b": 2}])
    with pytest.raises(TypeError, match=r"column 'a': the values returned cannot become Arrow"):
        rows_to_batch([{"a": 1}, {"a": "x"}])


def test_map_rows_rejects_non_dict_results() -> None:
    with pytest.raises(
        TypeError, match=r"map_rows\(<lambda>\) must return a dict .* got int for row 0"
    ):
        map_rows(lambda row: 1)(batch_of(1))
    with pytest.raises(TypeError, match="map_rows needs a function"):
        map_rows(3)


@pytest.mark.skipif(sys.version_info < (3, 11), reason="exception notes need Python 3.11")
def test_raise_policy_names_the_row() -> None:
    with pytest.raises(ZeroDivisionError) as info:
        map_rows(parse)(batch_of(1, 0))
    assert "lanceloader: map_rows(parse) failed on row 1 of the batch" in info.value.__notes__


def test_compose_flattens_lists_and_skips_none() -> None:
    add = map_rows(lambda r: {"x": r["x"] + 1})
    chain = compose(add, None, [add, [add]])
    assert isinstance(chain, Compose) and len(chain.stages) == 3
    assert chain(batch_of(0)).column("x").to_pylist() == [3]
    assert compose(chain, add).stages == (add,) * 4
    with pytest.raises(TypeError, match=r"compose: stage 1 is a str, not callable"):
        compose(add, "nope")


def test_as_transform_normalises() -> None:
    assert as_transform(None) is None and as_transform([]) is None and as_transform([None]) is None
    assert as_transform(parse) is parse
    assert as_transform([parse, parse]) == Compose((parse, parse))
    with pytest.raises(
        TypeError,
        match=r"transform must be a function fn\(batch\) -> batch, a list of them, or None; got int",
    ):
        as_transform(3)


# --- error policy ------------------------------------------------------------------------------


def test_skip_drops_and_counts_failed_rows() -> None:
    applied = apply_transform(
        map_rows(parse), batch_of(1, 0, 2, 0, 5), "skip", max_skip_fraction=0.5
    )
    assert isinstance(applied, Applied) and applied.skipped == 2
    assert applied.batch.column("x").to_pylist() == [10, 5, 2]


def test_skip_reaches_every_stage_of_a_composition() -> None:
    chain = [map_rows(lambda r: {"x": r["x"] - 1}), map_rows(parse)]  # x=1 -> 0 fails in stage 2
    applied = apply_transform(as_transform(chain), batch_of(1, 2, 3, 6), "skip")
    assert applied.skipped == 1 and applied.batch.column("x").to_pylist() == [10, 5, 2]


def test_on_error_function_sees_each_failed_row() -> None:
    seen = []
    applied = apply_transform(
        map_rows(parse),
        batch_of(0, 1, 0),
        lambda exc, row: seen.append((type(exc), row)),
        max_skip_fraction=1.0,
    )
    assert applied.skipped == 2 and seen == [(ZeroDivisionError, {"x": 0})] * 2


def test_skip_budget_stops_a_broken_batch() -> None:
    with pytest.raises(
        TooManyRowErrors,
        match=r"3 of 4 rows of this batch failed .* max_skip_fraction=0.5 \(2 rows\)",
    ) as info:
        apply_transform(map_rows(parse), batch_of(0, 0, 0, 1), "skip")
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    everything = apply_transform(map_rows(parse), batch_of(0, 0), "skip", max_skip_fraction=1.0)
    assert everything.skipped == 2 and everything.batch.num_rows == 0


def test_raise_is_the_default_and_plain_functions_always_raise() -> None:
    with pytest.raises(ZeroDivisionError):
        apply_transform(map_rows(parse), batch_of(0))

    def whole_batch(batch: pa.RecordBatch) -> pa.RecordBatch:
        raise ValueError("no row to blame")

    with pytest.raises(ValueError, match="no row to blame"):
        apply_transform(whole_batch, batch_of(1), "skip")
    assert apply_transform(None, "anything") == Applied("anything", 0)


@pytest.mark.parametrize(
    "on_error, fraction, error, match",
    [
        (
            "ignore",
            0.5,
            ValueError,
            r"on_error must be 'raise', 'skip' or a function on_error\(exc, row\), got 'ignore'",
        ),
        ("skip", 1.5, ValueError, r"max_skip_fraction must lie in \[0, 1\] .* got 1.5"),
        ("skip", "half", TypeError, r"max_skip_fraction must be a number, got 'half'"),
    ],
)
def test_error_policy_is_validated(on_error, fraction, error, match) -> None:
    with pytest.raises(error, match=match):
        check_on_error(on_error, fraction)
    with pytest.raises(error, match=match):
        ErrorPolicy(on_error, rows=1, max_skip_fraction=fraction)


def test_custom_batch_transforms_join_the_policy() -> None:
    class DropOdd(BatchTransform):
        def apply(self, batch, errors):
            keep = []
            for i, x in enumerate(batch.column("x").to_pylist()):
                if x % 2:
                    errors.row_failed(ValueError(f"odd {x}"), i, lambda x=x: {"x": x}, "DropOdd")
                else:
                    keep.append(i)
            return batch.take(keep)

    assert apply_transform(DropOdd(), batch_of(1, 2, 4), "skip").skipped == 1
    with pytest.raises(ValueError, match="odd 1"):
        DropOdd()(batch_of(1, 2))


# --- images ------------------------------------------------------------------------------------


def encode(array: np.ndarray, fmt: str = "JPEG") -> bytes:
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format=fmt, **({"quality": 95} if fmt == "JPEG" else {}))
    return buf.getvalue()


def smooth_image(h: int, w: int, seed: int) -> np.ndarray:
    y, x = np.mgrid[0:h, 0:w]
    return np.stack([x * 255 // w, y * 255 // h, np.full_like(x, seed * 40 % 256)], -1).astype(
        np.uint8
    )


def image_batch(*images: bytes | None) -> pa.RecordBatch:
    return pa.record_batch(
        {"image": pa.array(images, pa.binary()), "label": pa.array(range(len(images)))}
    )


@pytest.mark.parametrize("backend", ["auto", "pil", "simplejpeg"])
def test_decode_jpeg_and_png_to_nhwc(backend: str) -> None:
    a, b = smooth_image(32, 48, 1), smooth_image(32, 48, 2)
    out = decode_images(backend=backend)(image_batch(encode(a), encode(b, "PNG")))
    images = out.column("image").to_numpy_ndarray()
    assert images.shape == (2, 32, 48, 3) and images.dtype == np.uint8
    assert np.abs(images[0].astype(int) - a).mean() < 3  # JPEG is lossy
    np.testing.assert_array_equal(images[1], b)  # PNG is not
    assert out.column("label").to_pylist() == [0, 1]


def test_decode_resizes_and_converts_to_grey() -> None:
    big = encode(smooth_image(64, 64, 3))
    out = decode_images(size=(16, 24), mode="L", output_column="pixels")(image_batch(big, big))
    assert out.column("pixels").to_numpy_ndarray().shape == (2, 16, 24, 1)
    assert "image" in out.schema.names  # kept: the tensor went to another column
    square = decode_images(size=20, backend="pil")(image_batch(big)).column("image")
    assert square.to_numpy_ndarray().shape == (1, 20, 20, 3)


def test_float_output_is_normalised_per_channel() -> None:
    png = encode(smooth_image(8, 8, 4), "PNG")
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    out = decode_images(dtype="float32", mean=mean, std=std)(image_batch(png))
    got = out.column("image").to_numpy_ndarray()
    want = (smooth_image(8, 8, 4) / 255.0 - np.array(mean)) / np.array(std)
    assert got.dtype == np.float32 and np.allclose(got[0], want, atol=1e-5)
    assert normalise(np.full((1, 1, 1, 2), 255, np.uint8)).ravel().tolist() == [1.0, 1.0]


def test_bad_images_are_row_errors() -> None:
    good = encode(smooth_image(16, 16, 5))
    other_size = encode(smooth_image(8, 8, 5))
    batch = image_batch(good, b"not an image", None, other_size, good, good, good)
    applied = apply_transform(decode_images(), batch, "skip")
    assert applied.skipped == 3 and applied.batch.column("label").to_pylist() == [0, 4, 5, 6]
    assert applied.batch.column("image").to_numpy_ndarray().shape == (4, 16, 16, 3)
    with pytest.raises(
        ValueError, match=r"image is 8x8, the batch's first is 16x16; pass size=\(H, W\)"
    ):
        decode_images()(image_batch(good, other_size))
    resized = apply_transform(decode_images(size=16), image_batch(good, other_size), "skip")
    assert resized.skipped == 0


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (
            {"backend": "cv2"},
            ValueError,
            r"backend must be 'auto', 'pil' or 'simplejpeg', got 'cv2'",
        ),
        ({"mode": "RGBA"}, ValueError, r"mode must be 'RGB' or 'L', got 'RGBA'"),
        ({"dtype": "float16"}, ValueError, r"dtype must be 'uint8' or 'float32'"),
        ({"mean": (0.5,) * 3}, ValueError, r"mean and std normalise floats: pass dtype='float32'"),
        ({"dtype": "float32", "std": (1, 0, 1)}, ValueError, r"std must not contain 0"),
        (
            {"dtype": "float32", "mean": (0.5,)},
            ValueError,
            r"mean needs 3 values \(one per channel\)",
        ),
        (
            {"size": (0, 4)},
            ValueError,
            r"size must be None, an int or \(height, width\) of ints > 0",
        ),
    ],
)
def test_decode_options_are_validated(kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        decode_images(**kwargs)


def test_decode_checks_the_column() -> None:
    with pytest.raises(KeyError, match=r"decode_images reads column 'img', which the batch lacks"):
        decode_images("img")(image_batch(b""))
    with pytest.raises(
        TypeError, match=r"needs column 'label' to be binary or large_binary, got int64"
    ):
        decode_images("label")(image_batch(b""))


def test_decoded_tensor_reaches_torch_without_a_copy() -> None:
    batch = decode_images()(
        image_batch(encode(smooth_image(8, 8, 1)), encode(smooth_image(8, 8, 2)))
    )
    tensor = to_output(batch, "torch")["image"]
    assert tensor.shape == (2, 8, 8, 3) and tensor.dtype == torch.uint8
    assert tensor.data_ptr() == batch.column("image").storage.values.buffers()[1].address


@pytest.fixture(scope="module")
def images_uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    rows = [encode(smooth_image(24, 24, i)) for i in range(40)]
    table = pa.table({"image": pa.array(rows, pa.binary()), "label": pa.array(np.arange(40) % 4)})
    return lance.write_dataset(table, tmp_path_factory.mktemp("img") / "images.lance").uri


def test_decode_in_the_loader(images_uri: str) -> None:
    transform = pickle.loads(pickle.dumps(decode_images(size=16, dtype="float32")))
    loader = ll.Loader(
        images_uri, batch_size=16, transform=transform, output="torch", num_workers=2
    )
    batches = list(loader)
    assert [b["image"].shape for b in batches] == [(16, 16, 16, 3), (16, 16, 16, 3), (8, 16, 16, 3)]
    assert torch.cat([b["label"] for b in batches]).tolist() == [i % 4 for i in range(40)]
    direct = decode_images(size=16, dtype="float32")(
        lance.dataset(images_uri).to_table().to_batches()[0]
    )
    np.testing.assert_array_equal(
        batches[0]["image"].numpy(), direct.column("image").to_numpy_ndarray()[:16]
    )


# --- text --------------------------------------------------------------------------------------

CORPUS = ["the quick brown fox", "jumps over the lazy dog", "lance loader is fast", "the end"]


@pytest.fixture(scope="module")
def word_tokenizer() -> Tokenizer:
    """A WordLevel tokenizer trained here, on four sentences: nothing is downloaded."""
    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(CORPUS, trainers.WordLevelTrainer(special_tokens=["[PAD]", "[UNK]"]))
    return tok


def text_batch(*texts: str | None) -> pa.RecordBatch:
    return pa.record_batch(
        {"text": pa.array(texts, pa.string()), "id": pa.array(range(len(texts)))}
    )


def test_tokenize_pads_to_the_longest_with_a_mask(word_tokenizer: Tokenizer) -> None:
    out = tokenize(word_tokenizer)(text_batch("the end", "the quick brown fox", "zebra"))
    assert out.schema.names == ["id", "input_ids", "attention_mask"]
    ids = out.column("input_ids").to_pylist()
    mask = out.column("attention_mask").to_pylist()
    vocab = word_tokenizer.get_vocab()
    assert ids[0] == [vocab["the"], vocab["end"], 0, 0] and ids[2] == [vocab["[UNK]"], 0, 0, 0]
    assert mask == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]
    torch_ids = to_output(out, "torch")["input_ids"]
    assert torch_ids.dtype == torch.int64 and torch_ids.shape == (3, 4)
    assert word_tokenizer.padding is None and word_tokenizer.truncation is None  # untouched


def test_tokenize_to_a_fixed_length(word_tokenizer: Tokenizer) -> None:
    t = tokenize(word_tokenizer, max_length=3, padding="max_length", dtype="int32", keep_text=True)
    out = t(text_batch("the end", "jumps over the lazy dog"))
    assert out.column("input_ids").type == pa.list_(pa.int32(), 3)
    assert out.column("attention_mask").to_pylist() == [[1, 1, 0], [1, 1, 1]]
    assert out.column("text").to_pylist() == ["the end", "jumps over the lazy dog"]


def test_tokenize_ragged_goes_through_the_conversion(word_tokenizer: Tokenizer) -> None:
    out = tokenize(word_tokenizer, padding="none", prefix="q_")(
        text_batch("the end", "lance loader is fast")
    )
    assert out.schema.names == ["id", "q_input_ids"]
    padded = to_output(out, Conversion(output="torch", pad_value=-1))
    assert padded["q_input_ids"].shape == (2, 4) and padded["q_input_ids_lengths"].tolist() == [
        2,
        4,
    ]
    assert padded["q_input_ids"][0, 2:].tolist() == [-1, -1]
    rows = to_output(out, Conversion(ragged="list"))["q_input_ids"]
    assert [len(r) for r in rows] == [2, 4]


def test_tokenize_with_a_trained_bpe() -> None:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(
        CORPUS * 5, trainers.BpeTrainer(vocab_size=60, special_tokens=["<pad>", "<unk>"])
    )
    out = tokenize(tok)(text_batch("the fox", "lazy"))
    ids = out.column("input_ids").to_pylist()
    assert tok.decode([i for i in ids[0] if i != 0]).replace(" ", "") == "thefox"
    assert tok.token_to_id("<pad>") == 0 and 0 in ids[1]


def test_null_texts_are_row_errors(word_tokenizer: Tokenizer) -> None:
    applied = apply_transform(tokenize(word_tokenizer), text_batch("the end", None, "the"), "skip")
    assert applied.skipped == 1 and applied.batch.column("id").to_pylist() == [0, 2]
    with pytest.raises(ValueError, match="column 'text' is null in this row"):
        tokenize(word_tokenizer)(text_batch(None))


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"padding": "right"}, ValueError, r"padding must be 'longest', 'max_length' or 'none'"),
        ({"padding": "max_length"}, ValueError, r"padding='max_length' needs max_length="),
        ({"max_length": 0}, ValueError, r"max_length must be None or an int >= 1"),
        ({"dtype": "float32"}, ValueError, r"dtype must be 'int32' or 'int64'"),
    ],
)
def test_tokenize_options_are_validated(word_tokenizer, kwargs, error, match) -> None:
    with pytest.raises(error, match=match):
        tokenize(word_tokenizer, **kwargs)
    with pytest.raises(TypeError, match=r"tokenize needs a tokenizers.Tokenizer"):
        tokenize("bert-base-uncased")


def test_tokenize_in_the_loader(tmp_path, word_tokenizer: Tokenizer) -> None:
    texts = [CORPUS[i % 4] + f" {i}" for i in range(50)]
    uri = lance.write_dataset(
        pa.table({"text": texts, "label": np.arange(50) % 2}), tmp_path / "t.lance"
    ).uri
    transform = pickle.loads(pickle.dumps(tokenize(word_tokenizer, max_length=8)))
    loader = ll.Loader(
        uri, batch_size=16, transform=transform, output="torch", num_workers=2, shuffle=True
    )
    batches = list(loader)
    assert sum(len(b["label"]) for b in batches) == 50
    assert all(
        b["input_ids"].shape[1] <= 8 and b["attention_mask"].shape == b["input_ids"].shape
        for b in batches
    )
    again = list(
        loader.__class__(uri, batch_size=16, transform=transform, output="torch", shuffle=True)
    )
    assert all(
        torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(batches, again, strict=True)
    )
