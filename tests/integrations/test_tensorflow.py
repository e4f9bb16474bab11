"""as_tf_dataset: a Loader as a tf.data.Dataset, trained on with Keras; Loader.peek()."""

from __future__ import annotations

import lance
import numpy as np
import pyarrow as pa
import pytest

import lanceloader as ll

tf = pytest.importorskip("tensorflow")


def test_keras_fit_trains_on_the_loader_epoch_after_epoch(small_uri: str) -> None:
    def make() -> ll.Loader:
        return ll.Loader(
            small_uri, batch_size=100, columns=["x", "label"], shuffle=True, seed=4, output="numpy"
        )

    expected = [b["label"].tolist() for b in make()]
    loader = make()
    ds = ll.as_tf_dataset(loader)
    seen = [b["label"].numpy().tolist() for b in ds]  # one epoch, as tf.data hands it out
    assert seen == expected and loader.epoch == 1

    inputs = tf.keras.Input(shape=(64,), name="x")
    model = tf.keras.Model(inputs, tf.keras.layers.Dense(10)(inputs))
    model.compile(
        optimizer="sgd", loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    history = model.fit(
        ds.map(lambda b: (b["x"], b["label"])), epochs=2, verbose=0, shuffle=False
    )  # the loader shuffles
    assert len(history.history["loss"]) == 2 and loader.epoch == 3  # each Keras epoch is ours
    assert loader.stats(epoch=2).rows == 1000

    loader.load_state_dict({**loader.state_dict(), "sample": 300})  # mid-epoch: shorter
    assert int(ll.as_tf_dataset(loader).cardinality()) == tf.data.UNKNOWN_CARDINALITY


def test_signature_follows_the_batches(tmp_path) -> None:
    uri = str(tmp_path / "mixed.lance")
    lance.write_dataset(
        pa.table(
            {
                "tokens": pa.array([[1, 2, 3], [4], [5, 6]]),
                "text": pa.array(["a", "b", "c"]),
                "pos": pa.array([{"x": 1.0, "y": 2.0}] * 3),
                "words": pa.array([["a"], [], ["b", "c"]]),
            }
        ),
        uri,
    )
    loader = ll.Loader(uri, batch_size=2, columns=["tokens", "text", "pos"], output="numpy")
    ds = ll.as_tf_dataset(loader)
    spec = ds.element_spec
    assert spec["tokens"].shape.as_list() == [None, None]  # padded: as long as the longest row
    assert spec["tokens_lengths"].shape.as_list() == [None]
    assert spec["text"].dtype == tf.string and spec["pos"]["x"].dtype == tf.float64
    batches = list(ds)
    assert batches[0]["tokens"].numpy().tolist() == [[1, 2, 3], [4, 0, 0]]
    assert batches[1]["text"].numpy().tolist() == [b"c"]

    with pytest.raises(TypeError, match=r"column 'words' is a list of list, which has no tf\.data"):
        ll.as_tf_dataset(ll.Loader(uri, batch_size=2, columns=["words"], output="numpy"))
    with pytest.raises(ValueError, match=r"needs a loader with output='numpy' or 'tf'"):
        ll.as_tf_dataset(ll.Loader(uri, batch_size=2, columns=["text"], output="python"))


def test_transformed_columns_may_change_shape_between_batches(small_uri: str) -> None:
    def square(batch):  # a column as wide as the batch is long: the last batch is narrower
        return {"v": np.zeros((batch.num_rows, batch.num_rows), np.float32)}

    loader = ll.Loader(small_uri, batch_size=400, columns=["id"], transform=square, output="numpy")
    ds = ll.as_tf_dataset(loader)
    assert ds.element_spec["v"].shape.as_list() == [None, None]
    assert [tuple(b["v"].shape) for b in ds] == [(400, 400), (400, 400), (200, 200)]
    spec = {"v": tf.TensorSpec((None, None), tf.float32, name="v")}
    assert ll.as_tf_dataset(loader, element_spec=spec).element_spec["v"].name == "v"


def test_peek_is_the_next_first_batch_and_starts_nothing(small_uri: str) -> None:
    loader = ll.Loader(
        small_uri, batch_size=64, columns=["id", "x"], shuffle=True, seed=1, output="tf"
    )
    first = loader.peek()
    assert isinstance(first["x"], tf.Tensor) and loader.epoch == 0
    assert np.array_equal(first["id"].numpy(), next(iter(loader))["id"].numpy())
    state = loader.state_dict()
    resumed = ll.Loader(
        small_uri, batch_size=64, columns=["id", "x"], shuffle=True, seed=1, output="numpy"
    )
    resumed.load_state_dict(state)
    assert np.array_equal(resumed.peek()["id"], next(iter(resumed))["id"])  # mid-epoch too
    empty = ll.Loader(small_uri, batch_size=64, filter="id < 0")
    with pytest.raises(ValueError, match="has no batches to peek at"):
        empty.peek()
