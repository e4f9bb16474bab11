"""TensorFlow: a :class:`~lanceloader.Loader` as a ``tf.data.Dataset``, for Keras ``fit``.

The loader stays the pipeline (its workers read, transform and convert, in its order, with its
checkpoints); ``tf.data`` only receives the batches. Each iteration of the dataset (each Keras
epoch) is the loader's next epoch, so ``loader.state_dict()`` and ``loader.stats()`` work as
without TensorFlow.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from lanceloader.batch.output import LENGTHS_SUFFIX
from lanceloader.loader import Loader


def as_tf_dataset(loader: Loader, element_spec: Any = None) -> Any:
    """``loader`` as a ``tf.data.Dataset`` of its batches (dicts of tensors).

    The element spec comes from ``loader.peek()``'s dtypes. The batch dimension is unknown (a
    last batch may be short), and so are the lengths of padded list columns; without a
    transform, the other dimensions are fixed by the schema and taken from the sample, while a
    transform's columns may change shape from batch to batch (``tokenize`` pads to each batch's
    longest text), so all their other dimensions are unknown too. Pass ``element_spec`` (a dict
    of ``tf.TensorSpec``) to declare them yourself. Use ``output="numpy"`` or ``"tf"``; text
    columns become ``tf.string`` tensors.
    The dataset's cardinality is ``len(loader)`` (Keras then knows the steps per epoch), except
    when the loader resumes mid-epoch: that epoch is shorter than the next ones.

    >>> import tempfile
    >>> from lanceloader.demo import write_demo_dataset
    >>> uri = write_demo_dataset(tempfile.mkdtemp() + "/demo.lance", rows=10)
    >>> loader = Loader(uri, batch_size=4, columns=["x", "label"], output="numpy")
    >>> ds = as_tf_dataset(loader)
    >>> ds.element_spec["x"]
    TensorSpec(shape=(None, 64), dtype=tf.float32, name=None)
    >>> [int(b["label"].shape[0]) for b in ds], int(ds.cardinality())
    ([4, 4, 2], 3)
    """
    import tensorflow as tf

    if loader.output not in ("numpy", "tf"):
        raise ValueError(
            f"as_tf_dataset needs a loader with output='numpy' or 'tf', got {loader.output!r}"
        )
    sample = loader.peek()
    if not isinstance(sample, Mapping):
        raise TypeError(
            f"as_tf_dataset needs batches that are dicts of columns; this loader's transform "
            f"returns {type(sample).__name__}"
        )
    fixed = loader.transform is None  # the schema fixes every shape but the batch's
    signature = element_spec or {
        name: _spec(tf, name, value, sample, fixed) for name, value in sample.items()
    }
    dataset = tf.data.Dataset.from_generator(lambda: iter(loader), output_signature=signature)
    # at an epoch's start every epoch is this long, unless the loader follows a growing table
    if loader.sample == 0 and "follow" not in loader.source.settings():
        dataset = dataset.apply(tf.data.experimental.assert_cardinality(len(loader)))
    return dataset


def _spec(tf: Any, name: str, value: Any, batch: Mapping[str, Any], fixed: bool) -> Any:
    if isinstance(value, Mapping):
        return {k: _spec(tf, f"{name}.{k}", v, value, fixed) for k, v in value.items()}
    if isinstance(value, list):
        if all(isinstance(v, str | bytes) for v in value):
            return tf.TensorSpec(shape=(None,), dtype=tf.string)
        raise TypeError(
            f"column {name!r} is a list of {type(value[0]).__name__ if value else 'nothing'}, "
            "which has no tf.data type; drop it from columns, or make it an array in a transform"
        )
    shape: list[int | None] = list(value.shape)
    if not shape:
        raise TypeError(f"column {name!r} is a scalar, not a column of the batch")
    shape[0] = None  # a last batch may be short
    if not fixed:
        shape = [None] * len(shape)
    elif len(shape) > 1 and name.rsplit(".", 1)[-1] + LENGTHS_SUFFIX in batch:
        shape[1] = None  # a padded list column: as long as the batch's longest row
    text = isinstance(value, np.ndarray) and value.dtype.kind in "OSTU"
    dtype = tf.string if text else tf.as_dtype(value.dtype)
    return tf.TensorSpec(shape=tuple(shape), dtype=dtype)
