"""PyTorch datasets and samplers: thin skins over Source, Order, Plan and the Loader.

=======================  ==========================================================================
``MapDataset``           map-style dataset over a pinned :class:`~lanceloader.source.Source`;
                         ``__getitems__`` reads a whole batch with one coalesced Lance call
``collate``              a ``collate_fn`` that hands back ``MapDataset``'s already-batched columns
``Sampler``              indices in our orders (sequential, block or full shuffle), one rank's share
``BatchSampler``         lists of indices: exactly the batches a ``Loader`` with the same settings
                         delivers on this rank
``IterableDataset``      whole batches from the Loader pipeline, split across DataLoader workers
=======================  ==========================================================================

Nothing here orders, shards or checkpoints by itself: orders come from :class:`Order`, rank
slices from :class:`Plan`, reads from :class:`BatchWork`, states use the Loader's format
(``state.py``), so a ``BatchSampler`` state and a ``Loader`` state with the same settings are
interchangeable. ``MapDataset`` reads the batches a ``BatchSampler`` will ask for next ahead, many
per Lance call, and serves one only if it is exactly what was asked for.

Samplers and ``IterableDataset`` implement ``state_dict()``/``load_state_dict()``, which torchdata's
``StatefulDataLoader`` calls; its ``state_dict()`` then resumes at the exact batch, prefetched
batches included (they are delivered again after the resume, never lost).

Processes: the datasets pickle as plain parameters and reopen Lance in each DataLoader worker,
whatever the start method. Building one opens Lance (to pin the version and count rows), and a
``fork`` of a process that has used Lance must not call Lance itself (``docs/fork-safety.md``):
workers started with ``fork`` (Linux's default) then read through a clean helper process each
(:mod:`lanceloader.forksafe`; about a second to start, with a warning). Prefer
``multiprocessing_context="forkserver"``, with ``persistent_workers=True``.

Example::

    >>> import tempfile, torch
    >>> from lanceloader.demo import write_demo_dataset
    >>> uri = write_demo_dataset(tempfile.mkdtemp() + "/demo.lance", rows=100, fragments=2)
    >>> ds = MapDataset(uri, columns=["id", "x"])
    >>> batches = BatchSampler(ds, batch_size=32, shuffle=True, seed=0)
    >>> loader = torch.utils.data.DataLoader(ds, batch_sampler=batches, collate_fn=collate)
    >>> [tuple(b["x"].shape) for b in loader]
    [(32, 64), (32, 64), (32, 64), (4, 64)]
"""

from __future__ import annotations

import functools
import math
import operator
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

import lance
import numpy as np
import pyarrow as pa
import torch
import torch.utils.data

from lanceloader.convert import Conversion, check_output, check_schema, to_output
from lanceloader.distributed import detect_rank_world
from lanceloader.loader import (
    DEFAULT_SHUFFLE_WINDOW,
    ROWS_PER_READ_RANDOM,
    ROWS_PER_READ_SEQUENTIAL,
    Loader,
    check_int,
)
from lanceloader.order import Order
from lanceloader.plan import Plan, ReadTask, read_tasks
from lanceloader.prefetch import OrderedPrefetcher
from lanceloader.source import Source
from lanceloader.state import FORMAT as STATE_FORMAT
from lanceloader.state import StateMismatchError, check_state, fingerprint, order_settings
from lanceloader.workers import BatchWork, _add_note, _preview

__all__ = ["BatchSampler", "IterableDataset", "MapDataset", "Rows", "Sampler", "collate"]

# Samplers compute the order this many samples at a time (one vectorised Order call).
_SAMPLES_PER_STEP = 16_384


# --- map-style dataset ---------------------------------------------------------------------------


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
        splits, split, split_key: deterministic named splits, as for ``Loader``.
        transform: ``fn(pyarrow.RecordBatch) -> batch`` run on each batch read; a returned
            RecordBatch is converted to ``output``, anything else is passed through.
        output: ``"torch"`` (default), ``"numpy"``, ``"python"``, ``"arrow"`` or a ``Conversion``.
        read_ahead: when the indices come from a :class:`BatchSampler`, read the batches this
            process will be asked for next ahead, many per Lance call, on one background thread
            (which then runs ``transform``), holding at most two reads of up to 16,384 rows
            (65,536 in sequential or block order) per process. A batch is served from it only
            if its indices are still the sampler's; ``False`` reads each batch when asked.

    >>> import tempfile
    >>> from lanceloader.demo import write_demo_dataset
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
        transform: Callable[[pa.RecordBatch], Any] | None = None,
        output: str | Conversion = "torch",
        read_ahead: bool = True,
    ) -> None:
        if transform is not None and not callable(transform):
            raise TypeError(f"transform must be callable, got {type(transform).__name__}")
        self.conversion = check_output(output)
        self.source = Source(
            dataset,
            columns=columns,
            filter=filter,
            version=version,
            storage_options=storage_options,
            splits=splits,
            split=split,
            split_key=split_key,
        )
        if transform is None:
            check_schema(self.source.schema_table().schema, self.conversion)
        self.transform = transform
        self.read_ahead = bool(read_ahead)
        self._ahead: _ReadAhead | None = None

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
        return self.__getitems__([operator.index(index)])[0]

    def __getitems__(self, indices: Any) -> Rows:
        """The rows at ``indices`` (in that order, duplicates allowed), read with one Lance call."""
        positions = self._positions(indices)
        hinted = isinstance(indices, BatchIndices) and indices.plan.num_samples == len(self)
        if self.read_ahead and hinted:
            ahead = self._ahead
            if ahead is None or ahead.pid != os.getpid():
                ahead = self._ahead = _ReadAhead(self)
            served = ahead.take(indices, positions)
            if served is not None:
                return Rows(served)
        batch: Any = self.source.read(positions)
        try:
            if self.transform is not None:
                batch = self.transform(batch)
            if isinstance(batch, pa.RecordBatch):
                batch = to_output(batch, self.conversion)
        except Exception as exc:
            _add_note(exc, f"lanceloader: raised while preparing rows {_preview(positions)}")
            raise
        return Rows(batch)

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
    of 1, 2, 4, ... batches (one Lance call each) on one thread, one read ahead. A request
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
        self._stream: Iterator[tuple[int, Any]] | None = None

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
            try:
                batch, out = next(self._stream)
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
            self._stream.close()  # type: ignore[attr-defined]
        ds, order, plan = self._dataset, hint.order, hint.plan
        self._key, self._next, self._stride = key, hint.batch, _worker_slot()[1]
        random_reads = order.shuffle and order.block_size < 64
        rows = ROWS_PER_READ_RANDOM if random_reads else ROWS_PER_READ_SEQUENTIAL
        output: Any = ds.conversion  # BatchWork converts with to_output, which takes either
        work = BatchWork(ds.source, order, ds.transform, output)
        batches = range(hint.batch, len(plan), self._stride)
        tasks = read_tasks(hint.epoch, plan, max(1, rows // plan.batch_size), batches)
        self._stream = _read_ahead(work, tasks)


def _read_ahead(work: BatchWork, tasks: Iterator[ReadTask]) -> Iterator[tuple[int, Any]]:
    """``(batch number, converted batch)`` of each task's batches, one read ahead."""
    prefetcher = OrderedPrefetcher(_WithTask(work), tasks, num_workers=1, depth=1)
    try:
        for task, result in prefetcher:
            yield from zip(task.batches, result.batches, strict=True)
    finally:
        prefetcher.close()


def _preview_any(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


class Rows(list):  # type: ignore[type-arg]
    """The rows of one batch, as :meth:`MapDataset.__getitems__` returns them.

    A ``list`` of per-row samples, so torch's ``default_collate`` stacks it as for any dataset,
    that also keeps the batch it came from in ``.batch``, which :func:`collate` returns as is.
    The per-row samples are views cut from the batch on first access, so the fast path never
    makes them. Trade-off: ``default_collate`` pays one view per row and column, then one stack
    copy and one shared-memory transfer per column; :func:`collate` pays one copy per batch, in
    a worker only, and one transfer (measured 1.4-2x faster: ``benchmarks/torch_map.py``).

    >>> rows = Rows({"id": torch.tensor([7, 8]), "text": ["a", "b"]})
    >>> len(rows), rows[1]["id"].item(), rows[1]["text"]
    (2, 8, 'b')
    >>> torch.utils.data.default_collate(rows)["id"].tolist()
    [7, 8]
    """

    __slots__ = ("_cut", "_num_rows", "batch")

    def __init__(self, batch: Any) -> None:
        super().__init__()
        self.batch = batch
        self._num_rows = _num_rows(batch)
        self._cut = False

    def _cut_rows(self) -> None:
        if not self._cut:
            self._cut = True
            list.extend(self, split_rows(self.batch))

    def __len__(self) -> int:
        if self._cut or self._num_rows is None:
            self._cut_rows()
            return list.__len__(self)
        return self._num_rows

    def __reduce__(self) -> tuple[type, tuple[list[Any]]]:
        return list, (list(iter(self)),)


def _cut_first(name: str) -> Callable[..., Any]:
    method = getattr(list, name)

    @functools.wraps(method)
    def cut_then_call(self: Rows, *args: Any, **kwargs: Any) -> Any:
        self._cut_rows()
        return method(self, *args, **kwargs)

    return cut_then_call


for _name in (
    "__getitem__", "__iter__", "__reversed__", "__contains__", "__repr__", "__eq__", "__ne__",
    "__lt__", "__le__", "__gt__", "__ge__", "__add__", "__mul__", "__rmul__", "__iadd__",
    "__imul__", "__setitem__", "__delitem__", "append", "extend", "insert", "pop", "remove",
    "index", "count", "sort", "reverse", "copy", "clear",
):  # fmt: skip
    setattr(Rows, _name, _cut_first(_name))


def _num_rows(batch: Any) -> int | None:
    if isinstance(batch, Mapping):
        return _num_rows(next(iter(batch.values()))) if batch else 0
    if isinstance(batch, (torch.Tensor, np.ndarray)):
        return int(batch.shape[0]) if batch.ndim else None
    if isinstance(batch, (list, tuple)):
        return len(batch)
    if isinstance(batch, pa.RecordBatch):
        return batch.num_rows
    return None


def split_rows(batch: Any) -> list[Any]:
    """Per-row samples of a batch: views of its tensors and arrays, one dict per row.

    >>> split_rows({"a": torch.tensor([1, 2]), "b": {"c": ["x", "y"]}})
    [{'a': tensor(1), 'b': {'c': 'x'}}, {'a': tensor(2), 'b': {'c': 'y'}}]
    """
    if isinstance(batch, Mapping):
        names = list(batch)
        columns = [split_rows(batch[name]) for name in names]
        sizes = {name: len(col) for name, col in zip(names, columns, strict=True)}
        if len(set(sizes.values())) > 1:
            raise ValueError(f"the batch's columns have different numbers of rows: {sizes}")
        return [dict(zip(names, values, strict=True)) for values in zip(*columns, strict=True)]
    if isinstance(batch, torch.Tensor) and batch.ndim:
        return list(batch.unbind(0))
    if isinstance(batch, np.ndarray) and batch.ndim:
        return list(batch)
    if isinstance(batch, (list, tuple)):
        return list(batch)
    if isinstance(batch, pa.RecordBatch):
        return [batch.slice(i, 1) for i in range(batch.num_rows)]
    raise TypeError(
        f"cannot split a {type(batch).__name__} into rows for torch's default collate; have the "
        "transform return a RecordBatch or a dict of columns, or pass "
        "collate_fn=lanceloader.torch.collate to the DataLoader (it keeps the batch as is)"
    )


def collate(samples: Any) -> Any:
    """A ``collate_fn``: the batch :meth:`MapDataset.__getitems__` read, with no per-row work.

    In the training process the batch is returned as read (its tensors view Arrow's memory). In
    a DataLoader worker its tensors are copied into one shared-memory block first: the same one
    copy that torch would otherwise make per tensor to send it, but the batch then crosses to
    the training process as one piece, which costs a fraction of one piece per column.
    Anything else (a list of samples from another dataset) goes to torch's ``default_collate``.

    >>> collate(Rows({"id": torch.tensor([1, 2])}))["id"].tolist()
    [1, 2]
    >>> collate([{"id": 1}, {"id": 2}])["id"].tolist()
    [1, 2]
    """
    if isinstance(samples, Rows):
        return pack_for_transfer(samples.batch)
    return torch.utils.data.default_collate(samples)


def pack_for_transfer(batch: Any) -> Any:
    """In a DataLoader worker, ``batch`` with all its tensors moved into one shared-memory block
    (each aligned to 64 bytes); elsewhere, or with fewer than two tensors, ``batch`` itself.

    >>> pack_for_transfer({"a": torch.arange(3)})["a"].tolist()
    [0, 1, 2]
    """
    if torch.utils.data.get_worker_info() is None or not isinstance(batch, Mapping):
        return batch
    tensors = [t for t in _tensors(batch) if t.device.type == "cpu"]
    if len(tensors) < 2:
        return batch
    offsets, total = [], 0
    for t in tensors:
        offsets.append(total)
        total += -(-t.numel() * t.element_size() // 64) * 64
    if total == 0:
        return batch
    block = torch.empty(0, dtype=torch.uint8).set_(torch.UntypedStorage._new_shared(total))
    moved = {}
    for t, offset in zip(tensors, offsets, strict=True):
        view = block[offset : offset + t.numel() * t.element_size()].view(t.dtype).view(t.shape)
        moved[id(t)] = view.copy_(t)
    return _replace_tensors(batch, moved)


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, Mapping):
        for v in value.values():
            yield from _tensors(v)


def _replace_tensors(value: Any, moved: dict[int, torch.Tensor]) -> Any:
    if isinstance(value, torch.Tensor):
        return moved.get(id(value), value)
    if isinstance(value, Mapping):
        return {k: _replace_tensors(v, moved) for k, v in value.items()}
    return value


# --- samplers ------------------------------------------------------------------------------------


@dataclass
class _Cursor:
    """Where the next iteration starts: ``epoch``, the global ``start`` sample of its plan, and
    ``done`` units (batches, or this worker's batches) of that plan already delivered.

    ``fresh``: the next iteration continues exactly here (after construction, ``set_epoch`` or
    ``load_state_dict``). ``token`` identifies the iterator allowed to move the cursor; older
    iterators still run but no longer move it. ``consumed``: that iterator was advanced.
    """

    epoch: int = 0
    start: int = 0
    done: int = 0
    fresh: bool = True
    token: int = 0
    consumed: bool = False

    def next_epoch(self) -> None:
        self.epoch, self.start, self.done = self.epoch + 1, 0, 0


def _describe(data_source_or_len: Any) -> tuple[int, Source | None]:
    """Row count and (for a MapDataset) the source that the state names."""
    if isinstance(data_source_or_len, MapDataset):
        return len(data_source_or_len), data_source_or_len.source
    if isinstance(data_source_or_len, (torch.utils.data.IterableDataset, Loader)):
        raise TypeError(
            f"samplers index map-style datasets; {type(data_source_or_len).__name__} delivers "
            "whole batches itself: pass a MapDataset or its number of rows"
        )
    if isinstance(data_source_or_len, bool):
        raise TypeError("data_source_or_len must be a dataset or an int, got a bool")
    if isinstance(data_source_or_len, int):
        check_int("data_source_or_len", data_source_or_len, minimum=0)
        return data_source_or_len, None
    if hasattr(data_source_or_len, "__len__"):
        return len(data_source_or_len), None
    raise TypeError(
        "data_source_or_len must be a MapDataset, a sized dataset or a number of rows, got "
        f"{type(data_source_or_len).__name__}"
    )


def _rank_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    if (rank is None) != (world_size is None):
        raise ValueError(
            f"pass both rank= and world_size= (got rank={rank}, world_size={world_size}), "
            "or neither to detect them from torch.distributed, Ray Train or RANK/WORLD_SIZE"
        )
    if rank is None or world_size is None:
        rank, world_size = detect_rank_world()
    check_int("world_size", world_size, minimum=1)
    check_int("rank", rank, minimum=0)
    if rank >= world_size:
        raise ValueError(f"rank must lie in [0, world_size={world_size}), got {rank}")
    return rank, world_size


class _PlanSampler(torch.utils.data.Sampler):  # type: ignore[type-arg]
    """Batches of dataset indices for one rank: ``Order.positions`` of ``Plan`` batches."""

    def __init__(
        self,
        data_source_or_len: Any,
        *,
        batch_size: int,
        shuffle: bool,
        shuffle_block_size: int,
        shuffle_window: int | None,
        seed: int,
        rank: int | None,
        world_size: int | None,
        drop_last: bool,
    ) -> None:
        check_int("batch_size", batch_size, minimum=1)
        check_int("shuffle_block_size", shuffle_block_size, minimum=1)
        check_int("seed", seed, minimum=None)
        if shuffle_window is not None:
            check_int("shuffle_window", shuffle_window, minimum=1)
        self.num_rows, self._source = _describe(data_source_or_len)
        self.rank, self.world_size = _rank_world(rank, world_size)
        self.batch_size = batch_size
        self.drop_last = bool(drop_last)
        self.order = Order(
            num_rows=self.num_rows,
            shuffle=bool(shuffle),
            block_size=shuffle_block_size,
            window=shuffle_window or (DEFAULT_SHUFFLE_WINDOW if shuffle_block_size > 1 else 1),
            seed=seed,
        )
        self._order_settings = order_settings(self._source, self.order, self.num_rows)
        self._fingerprint = fingerprint(self._order_settings)
        self._cursor = _Cursor()

    def plan(self, start: int = 0) -> Plan:
        """This rank's plan for an epoch that starts at global sample ``start``."""
        return Plan(
            self.num_rows, self.batch_size, self.world_size, self.rank, self.drop_last, start
        )

    @property
    def epoch(self) -> int:
        """The epoch the next iteration delivers."""
        c = self._cursor
        return c.epoch + 1 if (not c.fresh and c.consumed) else c.epoch

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration deliver ``epoch`` from its start."""
        check_int("epoch", epoch, minimum=0)
        self._cursor = replace(self._cursor, epoch=epoch, start=0, done=0, fresh=True)

    def _next_position(self) -> tuple[int, int]:
        """``(start, done)`` of the iteration that the next ``iter()`` runs."""
        c = self._cursor
        return (0, 0) if (not c.fresh and c.consumed) else (c.start, c.done)

    def _units(self) -> int:
        """Batches the next iteration yields (fewer when resuming mid-epoch)."""
        start, done = self._next_position()
        return len(self.plan(start)) - done

    def _batches(self) -> Iterator[Any]:
        # Bind now, run lazily. torch makes iterators it never advances (DataLoader iterators call
        # iter(sampler) twice when they start): an iterator replaces the previous one at the same
        # place unless that one was advanced, in which case this is the next epoch.
        c = self._cursor
        if not c.fresh and c.consumed:
            c.next_epoch()
        c.fresh, c.consumed, c.token = False, False, c.token + 1
        return self._run(c, c.token, c.epoch, self.plan(c.start), c.done)

    def _run(self, c: _Cursor, token: int, epoch: int, plan: Plan, first: int) -> Iterator[Any]:
        if c.token == token:
            c.consumed = True
        step = max(1, _SAMPLES_PER_STEP // self.batch_size)
        for lo in range(first, len(plan), step):
            batches = range(lo, min(lo + step, len(plan)))
            samples, sizes = plan.samples(batches)
            positions = self.order.positions(epoch, samples)
            offset = 0
            for b, size in zip(batches, sizes, strict=True):
                if c.token == token:  # count it before handing it out: torchdata snapshots then
                    c.done = b + 1
                yield self._wrap(positions[offset : offset + size], plan, epoch, b)
                offset += size
        if c.token == token:  # finished: a state taken now points at the next epoch
            c.next_epoch()
            c.fresh = True

    def _wrap(self, positions: np.ndarray, plan: Plan, epoch: int, batch: int) -> Any:
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """Where the sampler is, in the Loader's state format (JSON-safe, ``format`` 1).

        ``sample`` counts global samples of ``epoch`` handed out by all ranks together, so the
        state resumes on any number of ranks. Inside a ``DataLoader`` with workers the sampler
        runs ahead of the training loop: save ``StatefulDataLoader.state_dict()`` instead, which
        snapshots this at the batch the loop has reached.
        """
        c = self._cursor
        source = self._source
        return {
            "format": STATE_FORMAT,
            "uri": source.uri if source else None,
            "version": source.version if source else None,
            "order": dict(self._order_settings),
            "fingerprint": self._fingerprint,
            "batch_size": self.batch_size,
            "world_size": self.world_size,
            "drop_last": self.drop_last,
            "columns": list(source.columns) if source else None,
            "epoch": c.epoch,
            "sample": self.plan(c.start).samples_done(c.done),
        }

    def load_state_dict(self, state: dict[str, Any], allow_changes: tuple[str, ...] = ()) -> None:
        """Continue at the state's epoch and sample: the next iteration starts there.

        Takes states of any sampler or ``Loader`` with the same order settings, from any number
        of ranks; ``allow_changes`` may name ``"batch_size"`` and ``"drop_last"`` (``columns``
        never matter to a sampler). A sampler built from a length does not check the dataset.
        """
        current = self.state_dict()
        if self._source is None and isinstance(state, dict):
            current["uri"], current["version"] = state.get("uri"), state.get("version")
        check_state(state, current, (*allow_changes, "columns"))
        check_int("state['epoch']", state["epoch"], minimum=0)
        check_int("state['sample']", state["sample"], minimum=0)
        if state["sample"] > self.num_rows:
            raise StateMismatchError(
                f"state sample {state['sample']} is beyond the {self.num_rows} rows of an epoch"
            )
        self._cursor = replace(
            self._cursor, epoch=state["epoch"], start=state["sample"], done=0, fresh=True
        )

    def _describe_settings(self) -> str:
        return (
            f"rows={self.num_rows}, order={self.order}, rank={self.rank}/{self.world_size}, "
            f"drop_last={self.drop_last}"
        )


class Sampler(_PlanSampler):
    """Dataset indices of one rank, in our orders, one epoch per iteration.

    Orders: sequential (``shuffle=False``), full shuffle (``shuffle_block_size=1``) or block
    shuffle (``shuffle_block_size`` contiguous rows stay together, ``shuffle_window`` blocks are
    mixed), each epoch differently. Rank ``r`` of ``world_size`` takes every ``world_size``-th
    sample (as ``DistributedSampler``: every rank gets the same count; the tail wraps around
    unless ``drop_last``); default ranks are detected as for ``Loader``.

    The epoch advances by itself with each iteration that was started (``set_epoch`` overrides).
    ``state_dict()``/``load_state_dict()`` resume mid-epoch in O(1), on any number of ranks.

    Args:
        data_source_or_len: a :class:`MapDataset` (its state then names the dataset), any sized
            dataset, or a number of rows.

    >>> list(Sampler(6))
    [0, 1, 2, 3, 4, 5]
    >>> sampler = Sampler(6, shuffle=True, seed=1, rank=0, world_size=2)
    >>> other = Sampler(6, shuffle=True, seed=1, rank=1, world_size=2)
    >>> len(sampler), sorted(list(sampler) + list(other))
    (3, [0, 1, 2, 3, 4, 5])
    """

    def __init__(
        self,
        data_source_or_len: Any,
        *,
        shuffle: bool = False,
        shuffle_block_size: int = 1,
        shuffle_window: int | None = None,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = False,
    ) -> None:
        super().__init__(
            data_source_or_len,
            batch_size=1,
            shuffle=shuffle,
            shuffle_block_size=shuffle_block_size,
            shuffle_window=shuffle_window,
            seed=seed,
            rank=rank,
            world_size=world_size,
            drop_last=drop_last,
        )

    def __iter__(self) -> Iterator[int]:
        return self._batches()

    def _wrap(self, positions: np.ndarray, plan: Plan, epoch: int, batch: int) -> int:
        return int(positions[0])

    def __len__(self) -> int:
        """Indices the next iteration yields (fewer when resuming mid-epoch)."""
        return self._units()

    def __repr__(self) -> str:
        return f"Sampler({self._describe_settings()})"


class BatchSampler(_PlanSampler):
    """Lists of dataset indices: this rank's batches, exactly as ``Loader`` cuts them.

    Each global batch of ``batch_size * world_size`` samples of the epoch's order is split by
    rank (:class:`~lanceloader.plan.Plan`), so every rank gets the same number of batches and a
    ``Loader`` with the same settings delivers the same rows. Use it as the DataLoader's
    ``batch_sampler`` with a :class:`MapDataset`: one Lance read per batch. Same arguments as
    :class:`Sampler`, plus ``batch_size``; the same epoch and state behaviour.

    >>> [b for b in BatchSampler(10, batch_size=4)]
    [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    >>> [b for b in BatchSampler(10, batch_size=2, rank=1, world_size=2, drop_last=True)]
    [[2, 3], [6, 7]]
    >>> sampler = BatchSampler(10, batch_size=4, shuffle=True, seed=3)
    >>> it = iter(sampler); first = next(it)
    >>> state = sampler.state_dict(); state["epoch"], state["sample"]
    (0, 4)
    >>> resumed = BatchSampler(10, batch_size=4, shuffle=True, seed=3)
    >>> resumed.load_state_dict(state)
    >>> list(resumed) == list(it)
    True
    """

    def __init__(
        self,
        data_source_or_len: Any,
        *,
        batch_size: int,
        shuffle: bool = False,
        shuffle_block_size: int = 1,
        shuffle_window: int | None = None,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = False,
    ) -> None:
        super().__init__(
            data_source_or_len,
            batch_size=batch_size,
            shuffle=shuffle,
            shuffle_block_size=shuffle_block_size,
            shuffle_window=shuffle_window,
            seed=seed,
            rank=rank,
            world_size=world_size,
            drop_last=drop_last,
        )

    def __iter__(self) -> Iterator[BatchIndices]:
        return self._batches()

    def _wrap(self, positions: np.ndarray, plan: Plan, epoch: int, batch: int) -> BatchIndices:
        return BatchIndices(positions, self.order, plan, epoch, batch)

    def __len__(self) -> int:
        """Batches the next iteration yields (fewer when resuming mid-epoch)."""
        return self._units()

    def __repr__(self) -> str:
        return f"BatchSampler(batch_size={self.batch_size}, {self._describe_settings()})"


# --- iterable dataset ----------------------------------------------------------------------------


def _worker_slot() -> tuple[int, int]:
    """``(worker id, number of workers)`` of the DataLoader worker running this, or ``(0, 1)``."""
    info = torch.utils.data.get_worker_info()
    return (0, 1) if info is None else (info.id, info.num_workers)


class IterableDataset(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
    """Whole batches from a :class:`~lanceloader.Loader`, split across DataLoader workers.

    Use with ``DataLoader(ds, batch_size=None, num_workers=N)``: worker ``w`` of ``N`` delivers
    the loader's batches ``w, w + N, w + 2N, ...`` (reading several of them per Lance call on a
    thread of its own, and moving each batch's tensors into one shared-memory block), and the
    DataLoader takes one batch from each worker in turn, so what it yields is exactly what the
    ``Loader`` would deliver, batch for batch. With ``num_workers=0`` it runs the same code in
    the training process, on the Loader's ``num_workers`` threads.

    Each iteration is one epoch; the epoch advances by itself in the process that iterates (the
    training process, or persistent workers). Without ``persistent_workers`` a DataLoader gives
    each epoch fresh copies of this object: call ``set_epoch(epoch)`` before each epoch then.

    ``state_dict()``/``load_state_dict()`` follow torchdata's ``StatefulDataLoader`` protocol: in
    each worker they hold that worker's place, so the DataLoader's state resumes at the exact batch
    (with the same number of workers). A state taken without workers is a ``Loader`` state and
    resumes on any number of ranks or workers.

    Args:
        dataset: URI or ``lance.LanceDataset``.
        batch_size: rows per batch on each rank.
        **loader_kwargs: any other :class:`~lanceloader.Loader` argument (order, filter, columns,
            transform, output, rank and world size). ``num_workers`` sets the reading threads
            of each process: default all cores in the training process, 1 in a DataLoader
            worker. Threads only: DataLoader workers are the processes.

    >>> import tempfile
    >>> from lanceloader.demo import write_demo_dataset
    >>> uri = write_demo_dataset(tempfile.mkdtemp() + "/demo.lance", rows=10, fragments=2)
    >>> ds = IterableDataset(uri, batch_size=4, columns=["id"], output="torch")
    >>> loader = torch.utils.data.DataLoader(ds, batch_size=None)
    >>> len(loader), [b["id"].tolist() for b in loader]
    (3, [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]])
    """

    def __init__(
        self,
        dataset: str | os.PathLike[str] | lance.LanceDataset,
        batch_size: int = 256,
        **loader_kwargs: Any,
    ) -> None:
        if loader_kwargs.get("worker_type", "thread") != "thread":
            raise ValueError(
                f"worker_type={loader_kwargs['worker_type']!r}: IterableDataset reads on threads "
                "inside DataLoader workers, which are the processes; drop worker_type and set "
                "the DataLoader's num_workers"
            )
        self.loader = Loader(dataset, batch_size, **loader_kwargs)
        self._threads: int | None = loader_kwargs.get("num_workers")
        self._cursor = _Cursor()

    def __len__(self) -> int:
        """Batches of this rank in the next epoch (fewer when resuming mid-epoch)."""
        c = self._cursor
        start, done = (c.start, c.done) if c.fresh else (0, 0)
        return len(self.loader.plan(start)) - done

    @property
    def epoch(self) -> int:
        """The epoch the next iteration delivers."""
        return self._cursor.epoch if self._cursor.fresh else self._cursor.epoch + 1

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration deliver ``epoch`` from its start."""
        check_int("epoch", epoch, minimum=0)
        self._cursor = replace(self._cursor, epoch=epoch, start=0, done=0, fresh=True)

    def __iter__(self) -> Iterator[Any]:
        # Every iter() is an iteration (DataLoaders call it once per epoch and worker); the first
        # after construction, set_epoch or load_state_dict continues where that put the cursor,
        # even when nothing is left (a worker restored after it had finished delivers nothing).
        c = self._cursor
        if not c.fresh:
            c.next_epoch()
        c.fresh, c.token = False, c.token + 1
        worker, workers = _worker_slot()
        plan = self.loader.plan(c.start)
        batches = range(worker + c.done * workers, len(plan), workers)
        return self._run(c, c.token, c.epoch, plan, batches)

    def _run(self, c: _Cursor, token: int, epoch: int, plan: Plan, batches: range) -> Iterator[Any]:
        if not batches:
            return
        loader = self.loader
        work = BatchWork(loader.source, loader.order, loader.transform, loader.output)
        in_worker = torch.utils.data.get_worker_info() is not None
        threads = self._threads or (1 if in_worker else loader.num_workers)
        per_read = loader.batches_per_read
        depth = max(threads, math.ceil(loader.prefetch / per_read))
        tasks = read_tasks(epoch, plan, per_read, batches)
        prefetcher = OrderedPrefetcher(work, tasks, threads, depth)
        try:
            for result in prefetcher:
                for batch in result.batches:
                    if c.token == token:
                        c.done += 1
                    yield pack_for_transfer(batch)
        finally:
            prefetcher.close()

    def state_dict(self) -> dict[str, Any]:
        """Where this copy is: a ``Loader`` state, plus this worker's place inside a DataLoader
        worker (``"worker": {"id", "count", "start", "batches"}``). JSON-safe, ``format`` 1."""
        c = self._cursor
        worker, workers = _worker_slot()
        state = self.loader.state_dict()
        state["epoch"] = c.epoch
        if workers == 1:
            state["sample"] = self.loader.plan(c.start).samples_done(c.done)
        else:
            state["sample"] = c.start
            state["worker"] = {"id": worker, "count": workers, "start": c.start, "batches": c.done}
        return state

    def load_state_dict(self, state: dict[str, Any], allow_changes: tuple[str, ...] = ()) -> None:
        """Continue at the state: the next iteration starts there (see :meth:`state_dict`)."""
        check_state(state, self.loader.state_dict(), tuple(allow_changes))
        check_int("state['epoch']", state["epoch"], minimum=0)
        start, done = self._start_of(state)
        self._cursor = replace(
            self._cursor, epoch=state["epoch"], start=start, done=done, fresh=True
        )

    def _start_of(self, state: dict[str, Any]) -> tuple[int, int]:
        saved = state.get("worker")
        slot = _worker_slot()
        if saved is None:
            check_int("state['sample']", state["sample"], minimum=0)
            if state["sample"] > self.loader.source.num_rows:
                raise StateMismatchError(
                    f"state sample {state['sample']} is beyond the "
                    f"{self.loader.source.num_rows} rows of an epoch"
                )
            return state["sample"], 0
        same = (saved["id"], saved["count"]) == slot and (
            state["batch_size"], state["world_size"], state["drop_last"]
        ) == (self.loader.batch_size, self.loader.world_size, self.loader.drop_last)
        if not same:
            raise StateMismatchError(
                f"this state was saved by DataLoader worker {saved['id']} of {saved['count']} "
                f"(batch_size={state['batch_size']}, world_size={state['world_size']}); it resumes "
                f"only there, but this is worker {slot[0]} of {slot[1]} (batch_size="
                f"{self.loader.batch_size}, world_size={self.loader.world_size}). Load the "
                "StatefulDataLoader's state into a StatefulDataLoader with the same num_workers"
            )
        return saved["start"], saved["batches"]

    def __repr__(self) -> str:
        return f"IterableDataset({self.loader!r})"


@dataclass(frozen=True)
class _WithTask:
    """Run ``work`` and hand back the task with its result."""

    work: BatchWork

    def __call__(self, task: ReadTask) -> tuple[ReadTask, Any]:
        return task, self.work(task)
