"""Per-sample random augmentation whose draws belong to the sample, not to the worker.

:func:`random_map` calls ``fn(row, rng)`` for each row, with a NumPy ``Generator`` seeded from
``(loader seed, random_map seed, epoch, the row's global sample index)``. Which worker runs the
row, how many workers there are, whether they are threads or processes, the batch size, the
world size and a resume never change a row's draws: a resumed run augments every sample exactly
as the uninterrupted run would (as Grain's ``random_map``). A new epoch draws anew.

Rows are handed to ``fn`` as dicts: tensor columns (e.g. the output of
:func:`~lanceloader.batch.images.decode_images`) as NumPy arrays, the others as Python values; ``fn``
returns a dict, and arrays of one shape become one tensor column again.

Example: the torchvision-style random crop and flip of decoded ``[C, H, W]`` images::

    >>> import numpy as np, pyarrow as pa
    >>> from lanceloader.batch.transforms import tensor_array
    >>> def crop_flip(row, rng, size=2):
    ...     image = row["image"]                       # [C, H, W]
    ...     y, x = rng.integers(0, image.shape[1] - size + 1), rng.integers(0, image.shape[2] - size + 1)
    ...     image = image[:, y:y + size, x:x + size]
    ...     return {**row, "image": image[:, :, ::-1] if rng.random() < 0.5 else image}
    >>> batch = pa.record_batch({"image": tensor_array(np.arange(2 * 3 * 4 * 4).reshape(2, 3, 4, 4))})
    >>> out = random_map(crop_flip)(batch)
    >>> out.column("image").to_numpy_ndarray().shape
    (2, 3, 2, 2)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from lanceloader.batch.row_keys import current_row_keys
from lanceloader.batch.transforms import BatchTransform, ErrorPolicy, map_each, rows_to_batch

RowFn = Callable[[dict[str, Any], np.random.Generator], Mapping[str, Any]]


@dataclass(frozen=True)
class RandomMap(BatchTransform):
    """``fn(row, rng)`` for each row, ``rng`` keyed by the row's sample; see :func:`random_map`."""

    fn: RowFn
    seed: int = 0

    def apply(self, batch: pa.RecordBatch, errors: ErrorPolicy) -> pa.RecordBatch:
        keys = current_row_keys(batch.num_rows)
        name = f"random_map({getattr(self.fn, '__name__', type(self.fn).__name__)})"
        columns = {n: _row_values(batch.column(n)) for n in batch.schema.names}
        rows = [{n: values[i] for n, values in columns.items()} for i in range(batch.num_rows)]
        samples, epochs = keys.samples.tolist(), keys.epochs().tolist()
        results = map_each(
            rows,
            lambda i, row: self.fn(row, sample_rng(keys.seed, self.seed, epochs[i], samples[i])),
            errors,
            name,
        )
        if not results:
            return batch.slice(0, 0)
        return rows_to_batch(results)


def sample_rng(loader_seed: int, seed: int, epoch: int, sample: int) -> np.random.Generator:
    """The generator of one sample: the same for the same four numbers, everywhere. Every bit of
    the seeds counts (NumPy's ``SeedSequence`` takes integers of any size), so seeds that differ
    only above 32 bits draw differently; a negative seed is its magnitude and a sign word.

    >>> int(sample_rng(0, 0, 1, 42).integers(1000)) == int(sample_rng(0, 0, 1, 42).integers(1000))
    True
    >>> int(sample_rng(7, 0, 0, 0).integers(10**9)) != int(sample_rng(7 + 2**32, 0, 0, 0).integers(10**9))
    True
    """
    numbers = (loader_seed, seed, epoch, sample)
    signs = sum(1 << i for i, n in enumerate(numbers) if n < 0)
    words = [abs(n) for n in numbers] + [0x5EED] + ([signs] if signs else [])
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(words)))


def _row_values(column: pa.Array | pa.ChunkedArray) -> Any:
    """Per-row values: NumPy views for tensor and fixed-size list columns, else Python."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if isinstance(column.type, pa.FixedShapeTensorType):
        return column.to_numpy_ndarray()
    if pa.types.is_fixed_size_list(column.type) and column.null_count == 0:
        width = column.type.list_size
        values = column.flatten().to_numpy(zero_copy_only=False)
        if not pa.types.is_fixed_size_list(column.type.value_type):
            return values.reshape(len(column), width)
    return column.to_pylist()


def random_map(fn: RowFn, seed: int = 0) -> RandomMap:
    """A transform that calls ``fn(row, rng)`` for each row; ``rng`` is a
    ``numpy.random.Generator`` seeded by the loader's seed, ``seed``, the epoch and the row's
    global sample index, so every run, worker count, worker type and resume draws the same for
    the same sample. ``fn`` returns the row's new dict; it must pickle (a module-level function)
    for process workers. With ``on_error="skip"`` a row whose ``fn`` raises is dropped.

    >>> flip = random_map(lambda row, rng: {"x": row["x"] * (1 if rng.random() < 0.5 else -1)})
    >>> flip(pa.record_batch({"x": [1, 2, 3, 4]})).column("x").to_pylist()
    [-1, -2, 3, -4]
    """
    if not callable(fn):
        raise TypeError(f"random_map needs a function fn(row, rng) -> dict, got {fn!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"random_map: seed must be an int, got {seed!r}")
    return RandomMap(fn, seed)
