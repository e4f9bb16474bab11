"""Grain (JAX) integration: Lance rows as a Grain data source, and a Loader as a Grain dataset.

=======================  ==========================================================================
``DataSource``           Grain's ``RandomAccessDataSource`` over pinned Lance rows (filter, split,
                         cache, columns): ``grain.MapDataset.source(DataSource(uri))``, then
                         Grain's own ``shuffle``, ``batch``, ``mp_prefetch``; Grain's checkpoint
                         (indices) resumes it, as the rows are pinned to one version
``IterDataset``          a ``grain.IterDataset`` of a :class:`~lanceloader.Loader`'s batches (our
                         orders, reads of many batches per Lance call), across epochs; its
                         iterator's ``get_state()`` is the Loader's state, checked on
                         ``set_state()`` (another dataset, version or order is refused)
``DatasetIterator``      the ``grain.DatasetIterator`` an ``IterDataset`` makes
=======================  ==========================================================================

What runs where: both pickle as plain parameters (a URI, a version, a row list) and reopen Lance
lazily in each process, so Grain's ``mp_prefetch`` workers (started with ``spawn``) read by
themselves. ``mp_prefetch(num_workers=N)`` over an ``IterDataset`` gives worker ``w`` the batches
``w, w + N, w + 2N, ...`` of the stream (across epochs) and Grain takes one from each worker in
turn, so the pipeline yields exactly the Loader's batches in the Loader's order.

States (JSON-safe, what Grain's ``CheckpointHandler`` and Orbax save): without ``mp_prefetch`` an
iterator's state is a plain Loader state (format 2) at the next batch, which a ``Loader``, a
torch ``IterableDataset`` or another pipeline on any number of ranks resumes. Under
``mp_prefetch(num_workers=N)`` Grain keeps one state per worker: a Loader state at the point the
pipeline started (or was restored), plus ``"grain": {"worker", "workers", "delivered"}`` (the
batches that worker has handed on); it resumes in a pipeline with the same ``num_workers``.

Modules outside this one: ``lanceloader.grain`` (the public face). Example::

    >>> import tempfile, grain
    >>> from lanceloader.demo import write_demo_dataset
    >>> uri = write_demo_dataset(tempfile.mkdtemp() + "/demo.lance", rows=10, fragments=2)
    >>> ds = grain.MapDataset.source(DataSource(uri, columns=["id"], filter="id >= 2"))
    >>> [b["id"].tolist() for b in ds.batch(4)]
    [[2, 3, 4, 5], [6, 7, 8, 9]]
    >>> it = iter(IterDataset(uri, batch_size=4, columns=["id"], num_epochs=2))
    >>> next(it)["id"].tolist(), it.get_state()["sample"]
    ([0, 1, 2, 3], 4)
"""

from __future__ import annotations

import operator
import os
from collections.abc import Sequence
from typing import Any

import grain
import lance
import numpy as np

from lanceloader.arguments import check_int
from lanceloader.batch.checks import check_output, check_schema
from lanceloader.batch.output import Conversion
from lanceloader.batch.tensors import split_rows as batch_rows
from lanceloader.batch.transforms import Transform, as_transform
from lanceloader.engine.stream import Stream
from lanceloader.engine.work import BatchWork
from lanceloader.loader import Loader
from lanceloader.ordering.order import Order
from lanceloader.ordering.plan import ReadTask
from lanceloader.pipeline import TENSOR_OUTPUTS, RowsSettings
from lanceloader.rows.clips.source import AudioClips, VideoClips
from lanceloader.rows.clips.windows import refuse_random_starts
from lanceloader.state.cursor import Cursor
from lanceloader.state.format import StateMismatchError

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
        task = ReadTask(0, range(1), positions, (len(positions),))
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


class IterDataset(grain.IterDataset):  # type: ignore[misc]
    """A :class:`~lanceloader.Loader`'s batches as a ``grain.IterDataset``, across epochs.

    Iterating yields the Loader's batches, epoch after epoch (``num_epochs`` of them, counted
    from epoch 0, so a restored pipeline stops where an uninterrupted one would; ``None``: no
    end), read in our orders with many batches per Lance call on the Loader's reading threads.
    Grain's ``.map``, ``.filter``, ``.prefetch`` and ``.mp_prefetch`` apply on top. The
    iterator's state is the Loader's (see the module's text); the Loader's own cursor does not
    move: the iterator holds its place.

    Under ``mp_prefetch(num_workers=N)`` each worker process reads every N-th batch on
    ``threads`` threads (default 1: the processes are the parallelism), and Grain interleaves
    them back into the Loader's order. Keep ``output="numpy"`` there (tensors are made in the
    training process) and thread workers (Grain's workers are the processes).

    Args:
        dataset: a :class:`~lanceloader.Loader` (its settings, and its place: a new iterator
            starts where the Loader stands), or a URI or ``lance.LanceDataset`` to build one
            from.
        batch_size: rows per batch on each rank (with a URI; default 256).
        num_epochs: iterate until this epoch (exclusive); ``None`` never ends.
        threads: reading threads per process; default the Loader's ``num_workers`` in one
            process, 1 in each ``mp_prefetch`` worker.
        allow_changes: settings a restored state may differ in, as for
            ``Loader.load_state_dict`` (``"batch_size"``, ``"drop_last"``, ``"columns"``,
            ``"uri"``).
        **loader_kwargs: any other ``Loader`` argument (with a URI).

    >>> import tempfile
    >>> from lanceloader.demo import write_demo_dataset
    >>> uri = write_demo_dataset(tempfile.mkdtemp() + "/demo.lance", rows=10)
    >>> ds = IterDataset(uri, batch_size=4, columns=["id"], num_epochs=2, shuffle=True)
    >>> [b["id"].tolist() for b in ds]
    [[0, 1, 9, 5], [4, 2, 3, 7], [8, 6], [2, 5, 1, 3], [8, 9, 4, 6], [0, 7]]
    """

    def __init__(
        self,
        dataset: Loader | str | os.PathLike[str] | lance.LanceDataset,
        batch_size: int | None = None,
        *,
        num_epochs: int | None = 1,
        threads: int | None = None,
        allow_changes: tuple[str, ...] = (),
        **loader_kwargs: Any,
    ) -> None:
        super().__init__()
        if isinstance(dataset, Loader):
            given = sorted(loader_kwargs) + ["batch_size"] * (batch_size is not None)
            if given:
                raise TypeError(
                    f"IterDataset(loader, {', '.join(given)}=...): a Loader carries its own "
                    "settings; set them on the Loader, or pass a URI instead of the Loader"
                )
            self.loader = dataset
        else:
            self.loader = Loader(
                dataset, 256 if batch_size is None else batch_size, **loader_kwargs
            )
        if num_epochs is not None:
            check_int("num_epochs", num_epochs, minimum=0)
        if threads is not None:
            check_int("threads", threads, minimum=1)
        self.num_epochs, self.threads = num_epochs, threads
        self.allow_changes = tuple(allow_changes)
        self.slot = (0, 1)  # (worker, workers) under mp_prefetch, set by Grain in the worker

    def set_slice(self, sl: slice, sequential_slice: bool = False) -> None:
        """Grain's in-place slicing (``mp_prefetch`` calls it in each worker, on its copy):
        this copy delivers batches ``sl.start, sl.start + sl.step, ...`` of the stream."""
        worker, workers = sl.start or 0, sl.step or 1
        if sl.stop is not None or not 0 <= worker < workers:
            raise ValueError(f"IterDataset takes a worker's slice(worker, None, workers), got {sl}")
        if sequential_slice:
            raise ValueError(
                "mp_prefetch(sequential_slice=True) over a lanceloader IterDataset: its workers "
                "take every N-th batch of the Loader's order (each read is many consecutive "
                "rows already); drop sequential_slice"
            )
        if self.loader.output in TENSOR_OUTPUTS:
            raise ValueError(
                f"output={self.loader.output!r} would make tensors in each of Grain's worker "
                "processes; use output='numpy' (the default) and make JAX arrays in the training "
                "process (jax.device_put, or a Grain .map after mp_prefetch)"
            )
        if self.loader.worker_type != "thread":
            raise ValueError(
                "worker_type='process' inside Grain's mp_prefetch workers: they are the "
                "processes; drop worker_type (threads read in each worker)"
            )
        self.slot = (worker, workers)

    def __iter__(self) -> DatasetIterator:
        return DatasetIterator(self)

    def __str__(self) -> str:
        return f"lanceloader.grain.IterDataset({self.loader!r}, num_epochs={self.num_epochs})"


class DatasetIterator(grain.DatasetIterator):  # type: ignore[misc]
    """An iterator of an :class:`IterDataset`: the Loader's batches from a place, with Grain's
    ``get_state``/``set_state`` (the Loader's state; see the module's text) and an idempotent
    ``close()`` (also on garbage collection) that stops its reading threads.

    Creating one reads nothing; the first ``next()`` starts a stream of reads. Its place is
    ``(origin, delivered)``: the stream's start and the batches handed on since, so a state is
    O(1) to take and to resume whatever the epoch.

    >>> import tempfile
    >>> from lanceloader.demo import write_demo_dataset
    >>> uri = write_demo_dataset(tempfile.mkdtemp() + "/demo.lance", rows=10)
    >>> it = iter(IterDataset(uri, batch_size=4, columns=["id"], num_epochs=2))
    >>> [next(it)["id"].tolist() for _ in range(3)], it.get_state()["epoch"]
    ([[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]], 1)
    >>> again = iter(IterDataset(uri, batch_size=4, columns=["id"], num_epochs=2))
    >>> again.set_state(it.get_state())
    >>> [b["id"].tolist() for b in again]
    [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    >>> again.set_state(dict(it.get_state(), fingerprint="0"))
    Traceback (most recent call last):
    ...
    lanceloader.state.format.StateMismatchError: state key 'fingerprint' is '0' but the state's dataset and order hash to '...': the state was edited or damaged. Use the state as state_dict() returned it
    """

    def __init__(self, dataset: IterDataset) -> None:
        super().__init__()
        self._dataset = dataset
        self._worker, self._workers = dataset.slot
        self._stream: Stream | None = None
        self._stream_at: tuple[int, int, int] | None = None  # (epoch, start, next batch)
        self._start(dataset.loader.state_dict(), delivered=0)  # the Loader's place

    def _start(self, state: dict[str, Any], delivered: int) -> None:
        cursor = Cursor(self._dataset.loader.stream_spec)
        if isinstance(state, dict):
            state = {k: v for k, v in state.items() if k != "grain"}
        cursor.load_state_dict(state, self._dataset.allow_changes)  # checks it, names problems
        self._cursor, self._delivered = cursor, delivered
        self._close_stream()

    # --- where the stream stands (pure arithmetic over the plans) -----------------------

    def _place(self) -> tuple[int, int, int]:
        """``(epoch, start, batch)`` of this iterator's next batch: global batch
        ``worker + delivered × workers`` of the stream from the origin."""
        return stream_place(
            self._cursor.epoch,
            self._cursor.start,
            len(self._cursor.plan),
            len(self._dataset.loader),
            self._worker + self._delivered * self._workers,
        )

    def __next__(self) -> Any:
        self._assert_not_closed()
        epoch, start, batch = self._place()
        end = self._dataset.num_epochs
        spec = self._cursor.spec
        plan = spec.plan(start)
        if (end is not None and epoch >= end) or batch >= len(plan):
            raise StopIteration
        if self._stream is None or self._stream_at != (epoch, start, batch):
            self._close_stream()
            loader = self._dataset.loader
            threads = self._dataset.threads or (1 if self._workers > 1 else loader.num_workers)
            self._stream = Stream(
                loader.reading(threads),
                epoch,
                plan,
                range(batch, len(plan), self._workers),
                loader.recorder,
                loader.log_every,
            )
        out = next(self._stream)
        self._delivered += 1
        self._stream_at = (epoch, start, batch + self._workers)
        return out

    def _close_stream(self) -> None:
        if self._stream is not None:
            self._stream.close()
        self._stream, self._stream_at = None, None

    # --- Grain's checkpoint ---------------------------------------------------------------

    def get_state(self) -> dict[str, Any]:
        """The Loader's state at the next batch (one process), or at the origin plus this
        worker's count (an ``mp_prefetch`` worker). JSON-safe."""
        c = self._cursor
        if self._workers == 1:
            epoch, start, batch = self._place()
            return c.spec.state(epoch, c.spec.plan(start).samples_done(batch))
        place = {"worker": self._worker, "workers": self._workers, "delivered": self._delivered}
        return c.spec.state(c.epoch, c.sample, grain=place)

    def set_state(self, state: dict[str, Any]) -> None:
        """Continue at ``state`` (from :meth:`get_state`, or any Loader state): the next batch is
        the one after the state's. Raises :class:`~lanceloader.StateMismatchError` for a state of
        another dataset, version, order or worker layout, naming the fix."""
        if isinstance(state, dict) and "worker" in state:
            raise StateMismatchError(
                "this state was saved by a torch DataLoader worker (it has a 'worker' entry); "
                "it resumes only in a torch StatefulDataLoader. Resume a Grain pipeline from "
                "its iterator's get_state(), or from a Loader's state_dict()"
            )
        place = state.get("grain") if isinstance(state, dict) else None
        if place is None:
            self._start(state, delivered=0)
            return
        keys = ("worker", "workers", "delivered")
        if not isinstance(place, dict) or not all(
            type(place.get(k)) is int and place[k] >= 0 for k in keys
        ):
            raise StateMismatchError(
                f"state['grain'] must be a dict of non-negative ints {keys}, got {place!r}; use "
                "the state as get_state() returned it"
            )
        if (place["worker"], place["workers"]) != (self._worker, self._workers):
            raise StateMismatchError(
                f"this state was saved by Grain mp_prefetch worker {place['worker']} of "
                f"{place['workers']}; it resumes only there, but this is worker {self._worker} "
                f"of {self._workers}. Restore the pipeline's state into the same pipeline with "
                f"mp_prefetch(num_workers={place['workers']})"
            )
        self._start(state, delivered=place["delivered"])

    def close(self) -> None:
        """Stop the reading threads (idempotent; also on garbage collection)."""
        self._close_stream()
        super().close()

    def __str__(self) -> str:
        return f"lanceloader.grain.DatasetIterator(worker {self._worker} of {self._workers})"


def stream_place(
    epoch: int, start: int, first_len: int, epoch_len: int, index: int
) -> tuple[int, int, int]:
    """Where batch ``index`` of a stream lies: ``(epoch, start, batch)``, batch ``batch`` of the
    plan of ``epoch`` that starts at global sample ``start``.

    The stream starts at ``start`` of ``epoch``, whose plan has ``first_len`` batches, and goes
    on with whole epochs of ``epoch_len`` batches. When epochs are empty (``epoch_len`` 0),
    every later index is in epoch ``epoch + 1``, past the end of its empty plan.

    >>> [stream_place(0, 8, 2, 3, i) for i in range(6)]
    [(0, 8, 0), (0, 8, 1), (1, 0, 0), (1, 0, 1), (1, 0, 2), (2, 0, 0)]
    """
    if index < first_len:
        return epoch, start, index
    if epoch_len == 0:
        return epoch + 1, 0, index - first_len
    full, batch = divmod(index - first_len, epoch_len)
    return epoch + 1 + full, 0, batch
