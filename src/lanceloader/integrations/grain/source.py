"""Lance rows by position as Grain's ``RandomAccessDataSource``: :class:`DataSource`, with the
per-row conversion it needs (:func:`row_conversion`, :func:`split_rows`)."""

from __future__ import annotations

import operator
import os
from collections.abc import Sequence
from typing import Any

import lance
import numpy as np

from lanceloader.batch.checks import check_output, check_schema
from lanceloader.batch.output import Conversion
from lanceloader.batch.tensors import split_rows as batch_rows
from lanceloader.batch.transforms import Transform, as_transform
from lanceloader.engine.work import BatchWork
from lanceloader.integrations.grain.processes import make_grain_flags_readable
from lanceloader.ordering.order import Order
from lanceloader.ordering.plan import Positions, ReadTask
from lanceloader.pipeline import RowsSettings
from lanceloader.rows.clips.source import AudioClips, VideoClips
from lanceloader.rows.clips.windows import refuse_random_starts

ROW_OUTPUTS = ("numpy", "python")


class DataSource:
    """Rows of a Lance dataset by position, pinned to one version: Grain's ``RandomAccessDataSource``.

    ``source[i]`` is row ``i`` (after filter and split) as a dict of NumPy values (a NumPy scalar
    per scalar, an array per fixed-size list or tensor, ``str``/``bytes`` for text and binary, an
    array of its own length per variable-length list). ``source._getitems(indices)`` (Grain's
    batched read) reads all of them with one Lance call. Grain calls ``__getitem__`` from its
    read threads (``ReadOptions.num_threads``, 16 by default) at the same time: each call is
    independent. Each call is one Lance read of one row (Grain 0.2 reads a batch's rows one
    by one): about a thousand rows a second per process on a local disk, where
    :class:`IterDataset` reads hundreds of thousands (many rows per Lance call), and one
    request per row on object storage. Use it where a Grain-native source is needed (mixing
    with other Grain sources), with ``mp_prefetch`` workers to read in parallel.

    The source is pinned to the version it opened, so Grain's own checkpoint (the next index of
    its iterator) resumes the same rows; pass that ``version=`` when you rebuild the pipeline in
    a later process, or new data appended in between changes what an index means. ``repr()``
    names the dataset's URI, version, identity and settings: ``grain.DataLoader`` compares it
    when it restores a state, and refuses a state of another dataset or version.

    It pickles as plain parameters and reopens Lance in each process, so it works in
    ``mp_prefetch`` workers and ``grain.DataLoader`` workers.

    Args:
        dataset: URI (local path or object store) or a ``lance.LanceDataset``.
        columns: columns to read; default all.
        filter: SQL predicate, evaluated once at construction against the pinned version.
        version: version number or tag to pin; default the latest at construction.
        storage_options: object-store options passed to Lance.
        splits, split, split_key: deterministic named splits, as for ``Loader``.
        cache, cache_size: a local cache of the data, as for ``Loader``: a directory is shared
            by every process naming it; ``"memory"`` is per process.
        clips: ``ll.video_clips(...)`` or ``ll.audio_clips(...)``: index ``i`` is clip ``i``
            (every clip; ``per_video``/``per_file`` draws depend on the epoch, which an index
            does not carry, so they are refused here, as for the torch ``MapDataset``).
        blobs: how Lance blob columns arrive, as for ``Loader`` (default: their bytes).
        transform: ``fn(pyarrow.RecordBatch) -> batch`` run on the rows of each read (one row
            for ``source[i]``), returning a RecordBatch or a dict of columns with every row
            (e.g. ``ll.decode_images``); row-wise, so a row is the same whichever rows it is
            read with. Grain's ``.map`` runs per row after it.
        output: ``"numpy"`` (default) or ``"python"``, or a ``Conversion`` of either. Make JAX
            arrays of Grain's batches in the training process (``jax.device_put``).

    >>> import tempfile
    >>> from lanceloader.demo import write_demo_dataset
    >>> uri = write_demo_dataset(tempfile.mkdtemp() + "/demo.lance", rows=10, fragments=2)
    >>> source = DataSource(uri, columns=["id", "x"], filter="id >= 4")
    >>> len(source), source[0]["id"].item(), source[0]["x"].shape
    (6, 4, (64,))
    >>> [row["id"].item() for row in source._getitems([5, 0, 5])]
    [9, 4, 9]
    >>> source[6]
    Traceback (most recent call last):
    ...
    IndexError: index 6 is out of range for this DataSource of 6 rows (valid: 0 to 5)
    """

    def __init__(
        self,
        dataset: str | os.PathLike[str] | lance.LanceDataset,
        *,
        columns: list[str] | None = None,
        filter: str | None = None,
        version: int | str | None = None,
        storage_options: dict[str, str] | None = None,
        splits: dict[str, float] | None = None,
        split: str | None = None,
        split_key: str | None = None,
        cache: str | os.PathLike[str] | None = None,
        cache_size: int | None = None,
        clips: VideoClips | AudioClips | None = None,
        blobs: dict[str, str] | None = None,
        transform: Transform | Sequence[Transform] | None = None,
        output: str | Conversion = "numpy",
    ) -> None:
        make_grain_flags_readable()
        self.transform = as_transform(transform)
        self.conversion = row_conversion(output)
        refuse_random_starts(clips, "DataSource", "lanceloader.grain.IterDataset")
        self.source = RowsSettings(
            columns,
            filter,
            version,
            storage_options,
            splits,
            split,
            split_key,
            cache,
            cache_size,
            clips=clips,
            blobs=blobs,
        ).build(dataset)
        if self.transform is None:
            check_schema(self.source.schema_table().schema, self.conversion)

    def __len__(self) -> int:
        return self.source.num_rows

    def __getitem__(self, index: int) -> dict[str, Any]:
        """Row ``index`` as a dict (see the class)."""
        if isinstance(index, bool) or not hasattr(index, "__index__"):
            raise TypeError(
                f"DataSource index must be an int, got {index!r} ({type(index).__name__}); "
                "read several rows with one call through source._getitems([i, j, ...])"
            )
        return self._getitems([operator.index(index)])[0]

    def _getitems(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        """The rows at ``indices`` (in that order, duplicates allowed), read with one Lance call
        (Grain's ``SupportsBatchedReadRandomAccessDataSource``)."""
        positions = self._positions(indices)
        if positions.size == 0:
            return []
        # The one read -> transform -> convert path; positions are samples of a sequential order.
        task = ReadTask(0, range(1), Positions(positions))
        work = BatchWork(self.source, Order(len(self)), self.transform, self.conversion)
        batch = work(task).batches[0]
        rows = split_rows(batch)
        if len(rows) != len(positions):
            raise ValueError(
                f"the transform returned {len(rows)} rows for a read of {len(positions)}; a "
                "DataSource's transform must keep every row, in order (filter rows with Grain's "
                ".filter after .to_iter_dataset())"
            )
        return rows

    def _positions(self, indices: Sequence[int]) -> np.ndarray:
        positions = np.asarray(indices)
        if positions.size == 0:
            return np.zeros(0, dtype=np.int64)
        if positions.ndim != 1 or positions.dtype.kind not in "iu":
            raise TypeError(
                f"DataSource indices must be a flat sequence of ints, got dtype "
                f"{positions.dtype}, shape {positions.shape}"
            )
        positions = positions.astype(np.int64, copy=False)
        bad = np.flatnonzero((positions < 0) | (positions >= len(self)))
        if bad.size:
            raise IndexError(
                f"index {positions[bad[0]]} is out of range for this DataSource of "
                f"{len(self)} rows (valid: 0 to {len(self) - 1})"
            )
        return positions

    def __repr__(self) -> str:
        # Deterministic (no memory address): grain.DataLoader compares it on restore.
        src = self.source
        return (
            f"lanceloader.grain.DataSource(uri={src.dataset_name.uri!r}, "
            f"version={src.dataset_name.version}, "
            f"dataset={src.dataset_name.identity!r}, rows={src.num_rows}, columns={list(src.columns)}, "
            f"settings={src.settings()}, output={self.conversion.output!r})"
        )


def row_conversion(output: str | Conversion) -> Conversion:
    """The conversion of a :class:`DataSource`'s rows: NumPy or Python, row by row.

    A variable-length list becomes one array per row (``ragged="list"``): padded to the longest
    row of a read, a row would change with the rows read beside it.

    >>> row_conversion("numpy").ragged
    'list'
    >>> row_conversion("jax")
    Traceback (most recent call last):
    ...
    ValueError: DataSource(output='jax'): a Grain source gives rows to Grain's workers, which batch them as NumPy; use output='numpy' and make JAX arrays of Grain's batches in the training process (jax.device_put)
    """
    name = output.output if isinstance(output, Conversion) else output
    if name not in ROW_OUTPUTS:
        raise ValueError(
            f"DataSource(output={name!r}): a Grain source gives rows to Grain's workers, which "
            "batch them as NumPy; use output='numpy' and make JAX arrays of Grain's batches in "
            "the training process (jax.device_put)"
        )
    if isinstance(output, Conversion):
        if output.ragged == "pad" and output.pad_to is None:
            raise ValueError(
                "DataSource(output=Conversion(ragged='pad')) without pad_to would pad each row "
                "to the longest row read with it, so a row would change with its neighbours; "
                "give pad_to=N (a fixed length) or ragged='list' (an array per row)"
            )
        return check_output(output)
    return check_output(Conversion(output=name, ragged="list"))


def split_rows(batch: Any) -> list[Any]:
    """Per-row values of a converted batch (:func:`lanceloader.batch.tensors.split_rows`)."""
    return batch_rows(
        batch,
        "Grain",
        "have the transform return a pyarrow.RecordBatch or a dict of columns (arrays or lists, "
        "one entry per row)",
    )
