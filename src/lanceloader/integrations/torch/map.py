"""``MapDataset``: rows of a Lance dataset by position, for torch's ``DataLoader``, and the
read-ahead that serves a :class:`~lanceloader.integrations.torch.BatchSampler`'s next batches
(``BatchIndices`` carry the hint).
"""

from __future__ import annotations

import operator
import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import lance
import numpy as np
import torch
import torch.utils.data

from lanceloader.arguments import check_bool
from lanceloader.batch.checks import check_output, check_schema
from lanceloader.batch.output import Conversion, with_fill_nulls
from lanceloader.batch.transforms import (
    DEFAULT_MAX_SKIP_FRACTION,
    OnError,
    Transform,
    as_transform,
    check_on_error,
)
from lanceloader.engine.reading import Reading
from lanceloader.engine.sizing import TRANSFORM_BATCHES_PER_READ, batches_per_read
from lanceloader.engine.stats import Recorder, Stats
from lanceloader.engine.stream import Stream
from lanceloader.engine.work import BatchWork
from lanceloader.integrations.torch.collation import Rows, watch_training_process
from lanceloader.ordering.order import Order
from lanceloader.ordering.plan import Plan, Positions, ReadTask
from lanceloader.pipeline import RowsSettings
from lanceloader.rows.clips.source import AudioClips, VideoClips
from lanceloader.rows.clips.windows import refuse_random_starts


class MapDataset(torch.utils.data.Dataset):
    """Rows of a Lance dataset by position, pinned to one version, for torch's ``DataLoader``.

    ``ds[i]`` is row ``i`` (after filter and split) as a dict; ``ds.__getitems__(indices)`` reads
    all of them with one Lance call (contiguous runs become range reads), runs ``transform`` on
    the Arrow ``RecordBatch`` and converts the result to ``output``. It returns :class:`Rows`: a
    list of per-row samples for torch's default collate, which :func:`collate` turns back into
    the batch without touching a row. Use ``collate_fn=collate`` (the fast path) and a
    :class:`BatchSampler` (whose batches this dataset reads ahead, many per Lance call).

    The dataset pickles as plain parameters and reopens Lance lazily in each process, so it works
    in DataLoader workers started by ``forkserver``, ``spawn`` or ``fork`` (see the module's note).

    Args:
        dataset: URI (local path or object store) or a ``lance.LanceDataset``.
        columns: columns to read; default all.
        filter: SQL predicate, evaluated once at construction against the pinned version.
        version: version number or tag to pin; default the latest at construction.
        storage_options: object-store options passed to Lance.
        splits: deterministic named splits, as for ``Loader``.
        split: which split to read, as for ``Loader``.
        split_key: the column that decides a row's split, as for ``Loader``.
        cache: a local cache of the data, as for ``Loader``: a directory is shared by the
            DataLoader's workers; ``"memory"`` is per worker process.
        cache_size: the cache's cap in bytes, as for ``Loader``.
        clips: ``ll.video_clips(...)`` or ``ll.audio_clips(...)``: index ``i`` is clip ``i``,
            as for ``Loader`` (every clip: ``per_video``/``per_file`` draws depend on the
            epoch, which a MapDataset index does not carry, so they are refused here).
        blobs: how Lance blob columns arrive, as for ``Loader`` (default: their bytes).
        transform: ``fn(pyarrow.RecordBatch) -> batch`` run on each batch read, or a list of
            them (applied in order); a returned RecordBatch is converted to ``output``,
            anything else is passed through.
        on_error: what a row-aware transform (``ll.map_rows``, ``ll.decode_images``) does with
            a row that fails, as for ``Loader``: ``"raise"``, or ``"skip"`` the row (the batch
            comes back shorter).
        max_skip_fraction: the share of a batch's rows that may be skipped, as for ``Loader``.
        output: ``"torch"`` (default), ``"numpy"``, ``"python"``, ``"arrow"`` or a ``Conversion``.
        fill_nulls: column name to the value its nulls take, as for ``Loader`` (nulls found
            at construction where a scan is cheap).
        read_ahead: when the indices come from a :class:`BatchSampler`, read the batches this
            process will be asked for next ahead, many per Lance call, on one background thread
            (which then runs ``transform``), holding at most two reads of up to 16,384 rows
            (65,536 in sequential or block order; two batches with a ``transform``) per process. A batch is served from it only
            if its indices are still the sampler's; ``False`` reads each batch when asked.

    >>> import tempfile
    >>> from lanceloader.demo import write_demo_dataset
    >>> from lanceloader.torch import collate
    >>> uri = write_demo_dataset(tempfile.mkdtemp() + "/demo.lance", rows=10, fragments=2)
    >>> ds = MapDataset(uri, columns=["id", "label"], filter="id >= 4")
    >>> len(ds), ds[0]["id"].item()
    (6, 4)
    >>> collate(ds.__getitems__([5, 0, 1]))["id"].tolist()
    [9, 4, 5]
    >>> ds[6]
    Traceback (most recent call last):
    ...
    IndexError: index 6 is out of range for this MapDataset of 6 rows (valid: 0 to 5; negative indices are not supported)
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
        on_error: OnError = "raise",
        max_skip_fraction: float = DEFAULT_MAX_SKIP_FRACTION,
        output: str | Conversion = "torch",
        fill_nulls: Mapping[str, Any] | None = None,
        read_ahead: bool = True,
    ) -> None:
        self.transform = as_transform(transform)
        check_on_error(on_error, max_skip_fraction)
        self.on_error, self.max_skip_fraction = on_error, max_skip_fraction
        self.conversion = check_output(with_fill_nulls(output, fill_nulls))
        refuse_random_starts(clips, "MapDataset", "ll.Loader or lanceloader.torch.IterableDataset")
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
            self.source.check_nulls(self.conversion)
        check_bool("read_ahead", read_ahead)
        self.read_ahead = read_ahead
        self.recorder = Recorder()
        self._ahead: _ReadAhead | None = None

    def stats(self, epoch: int | None = None) -> Stats:
        """What this process's read-ahead did (``Loader.stats``); each DataLoader worker
        process records its own."""
        return self.recorder.snapshot(epoch=epoch)

    def __len__(self) -> int:
        return self.source.num_rows

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_ahead"] = None  # its thread and reads belong to this process
        return state

    def __getitem__(self, index: int) -> Any:
        """Row ``index`` as a dict of the output type (a 0-d tensor per scalar column)."""
        if isinstance(index, bool) or not hasattr(index, "__index__"):
            raise TypeError(
                f"MapDataset index must be an int, got {index!r} ({type(index).__name__}); "
                "read several rows with one call through ds.__getitems__([i, j, ...])"
            )
        rows = self.__getitems__([operator.index(index)])
        if len(rows) == 0:
            raise IndexError(
                f"row {index} was skipped: its transform failed and on_error={self.on_error!r}; "
                "use on_error='raise' to see the error"
            )
        return rows[0]

    def __getitems__(self, indices: Any) -> Rows:
        """The rows at ``indices`` (in that order, duplicates allowed), read with one Lance call."""
        positions = self._positions(indices)
        watch_training_process()
        hinted = isinstance(indices, BatchIndices) and indices.plan.num_samples == len(self)
        if self.read_ahead and hinted:
            ahead = self._ahead
            if ahead is None or ahead.pid != os.getpid():
                ahead = self._ahead = _ReadAhead(self)
            served = ahead.take(indices, positions)
            if served is not None:
                return Rows(served)
        # The one read -> transform -> convert path, over the rows themselves (positions are
        # samples of a sequential order; random_map draws per position).
        order = Order(len(self))
        task = ReadTask(0, range(1), Positions(positions))
        work = BatchWork(
            self.source,
            order,
            self.transform,
            self.conversion,
            on_error=self.on_error,
            max_skip_fraction=self.max_skip_fraction,
        )
        return Rows(work(task).batches[0])

    def _positions(self, indices: Any) -> np.ndarray:
        positions = np.asarray(indices)
        if positions.size == 0:
            return np.zeros(0, dtype=np.int64)
        if positions.ndim != 1 or positions.dtype.kind not in "iu":
            raise TypeError(
                f"MapDataset indices must be a flat sequence of ints, got {_preview_any(indices)} "
                f"(dtype {positions.dtype}, shape {positions.shape})"
            )
        positions = positions.astype(np.int64, copy=False)
        bad = np.flatnonzero((positions < 0) | (positions >= len(self)))
        if bad.size:
            raise IndexError(
                f"index {positions[bad[0]]} is out of range for this MapDataset of "
                f"{len(self)} rows (valid: 0 to {len(self) - 1}; "
                "negative indices are not supported)"
            )
        return positions

    def __repr__(self) -> str:
        return f"MapDataset({self.source!r}, output={self.conversion.output!r})"


class BatchIndices(list):  # type: ignore[type-arg]
    """A list of dataset indices that also says which batch of which plan it is.

    :class:`BatchSampler` yields these; to anything else they are plain lists. The hint lets a
    :class:`MapDataset` read the batches its process will be asked for next in advance.
    """

    __slots__ = ("batch", "epoch", "order", "plan", "positions")

    def __init__(
        self, positions: np.ndarray, order: Order, plan: Plan, epoch: int, batch: int
    ) -> None:
        super().__init__(positions.tolist())
        self.order, self.plan, self.epoch, self.batch = order, plan, epoch, batch
        self.positions = positions  # what the list held when made: a changed list is read directly


class _ReadAhead:
    """One process's stream of its next batches of a BatchSampler's plan, read ahead.

    torch hands batch ``i`` of an epoch to DataLoader worker ``i mod W``, so a worker asked for
    batch ``b`` is next asked for ``b + W``: the stream reads ``b, b + W, b + 2W, ...`` in reads
    of 1, 4, 16, ... batches (one Lance call each) on one thread, one read ahead. A request
    for another batch restarts it there. The stream computes batch ``b`` with the same pure
    functions as the sampler did, so it serves a request only if its indices are still the ones
    the sampler made; anything else, and a read that fails, is read directly instead (which then
    raises the error for the batch it belongs to).
    """

    def __init__(self, dataset: MapDataset) -> None:
        self.pid = os.getpid()
        self._dataset = dataset
        self._lock = threading.Lock()
        self._key: tuple[Any, ...] | None = None
        self._failed: tuple[Any, ...] | None = None
        self._next = -1
        self._stride = 1
        self._stream: Stream | None = None

    def take(self, hint: BatchIndices, positions: np.ndarray) -> Any | None:
        """The converted batch for ``hint``, or None to read it directly."""
        key = (hint.order, hint.plan, hint.epoch)
        if not np.array_equal(hint.positions, positions):
            return None
        with self._lock:
            if key == self._failed:
                return None
            if key != self._key or hint.batch != self._next or self._stream is None:
                self._restart(key, hint)
            assert self._stream is not None
            batch = self._stream.next_batch
            try:
                out = next(self._stream)
            except StopIteration:
                self._key = None
                return None
            except Exception:
                self._failed, self._key = key, None
                return None
            self._next = batch + self._stride
            if batch != hint.batch:
                self._key = None
                return None
            return out

    def _restart(self, key: tuple[Any, ...], hint: BatchIndices) -> None:
        if self._stream is not None:
            self._stream.close()
        ds, order, plan = self._dataset, hint.order, hint.plan
        self._key, self._next, self._stride = key, hint.batch, _worker_slot()[1]
        output: Any = ds.conversion  # BatchWork converts with to_output, which takes either
        work = BatchWork(
            ds.source,
            order,
            ds.transform,
            output,
            on_error=ds.on_error,
            max_skip_fraction=ds.max_skip_fraction,
        )
        per_read = batches_per_read(
            order.random_reads, plan.batch_size, ds.transform is not None, ds.source.bytes_per_row
        )
        if ds.transform is not None:  # one read in flight: a larger read only delays its first
            per_read = min(per_read, TRANSFORM_BATCHES_PER_READ)  # batch (no loop to spare)
        reading = Reading(work, num_workers=1, batches_per_read=per_read, reads_in_flight=1)
        batches = range(hint.batch, len(plan), self._stride)
        self._stream = Stream(reading, hint.epoch, plan, batches, ds.recorder)


def _worker_slot() -> tuple[int, int]:
    """``(worker id, number of workers)`` of the DataLoader worker running this, or ``(0, 1)``."""
    info = torch.utils.data.get_worker_info()
    return (0, 1) if info is None else (info.id, info.num_workers)


def _preview_any(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
