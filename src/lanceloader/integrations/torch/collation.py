"""What ``MapDataset`` hands the DataLoader and how it crosses back: :class:`Rows` (a batch
that passes as a list of rows), :func:`collate`, :func:`split_rows` and
:func:`pack_for_transfer` (one shared-memory block per batch out of a DataLoader worker).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import torch
import torch.utils.data


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
