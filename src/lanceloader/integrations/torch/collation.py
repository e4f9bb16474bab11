"""What ``MapDataset`` hands the DataLoader and how it crosses back: :class:`Rows` (a batch
that passes as a list of rows), :func:`collate`, :func:`split_rows` and
:func:`pack_for_transfer` (one ``/dev/shm`` file per batch out of a DataLoader worker).
"""

from __future__ import annotations

import functools
import itertools
import math
import mmap
import multiprocessing.util
import os
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch
import torch.utils.data

from lanceloader.batch.tensors import split_rows as batch_rows
from lanceloader.engine.transport import take_mapping, write_arrays
from lanceloader.lifecycle import lifetime
from lanceloader.lifecycle.lifetime import SHM_DIR


class Rows(list):  # type: ignore[type-arg]
    """The rows of one batch, as :meth:`MapDataset.__getitems__` returns them.

    A ``list`` of per-row samples, so torch's ``default_collate`` stacks it as for any dataset,
    that also keeps the batch it came from in ``.batch``, which :func:`collate` returns as is.
    The per-row samples are views cut from the batch on first access, so the fast path never
    makes them. Trade-off: ``default_collate`` pays one view per row and column, then one stack
    copy and one shared-memory transfer per column; :func:`collate` pays one copy per batch, in
    a worker only, and one transfer, faster (docs/performance.md, "Torch map-style batches").

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
    """Per-row samples of a batch (:func:`lanceloader.batch.tensors.split_rows`): views of its
    tensors and arrays, one dict per row.

    >>> split_rows({"a": torch.tensor([1, 2]), "b": {"c": ["x", "y"]}})
    [{'a': tensor(1), 'b': {'c': 'x'}}, {'a': tensor(2), 'b': {'c': 'y'}}]
    """
    return batch_rows(
        batch,
        "torch's default collate",
        "have the transform return a RecordBatch or a dict of columns, or pass "
        "collate_fn=lanceloader.torch.collate to the DataLoader (it keeps the batch as is)",
    )


def collate(samples: Any) -> Any:
    """A ``collate_fn``: the batch :meth:`MapDataset.__getitems__` read, with no per-row work.

    In the training process the batch is returned as read (its tensors view Arrow's memory). In
    a DataLoader worker it becomes a :class:`SharedBatch`, which crosses to the training process
    as one ``/dev/shm`` file: the same one copy that torch would make per tensor, without torch's
    per-tensor file-descriptor handshake.
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
    """In a DataLoader worker, a dict ``batch`` as a :class:`SharedBatch`, which crosses to the
    training process as one ``/dev/shm`` file; anything else, or elsewhere, ``batch`` itself.

    >>> pack_for_transfer({"a": torch.arange(3)})["a"].tolist()
    [0, 1, 2]
    """
    if torch.utils.data.get_worker_info() is None or type(batch) is not dict:
        return batch
    if not SHM_DIR.is_dir() or not any(_packable(v) for v in _leaves(batch)):
        return batch
    return SharedBatch(batch)


class SharedBatch(dict):  # type: ignore[type-arg]
    """A batch leaving a DataLoader worker: a plain dict there, a ``/dev/shm`` file in transit.

    torch sends each tensor's memory as a file descriptor, and the training process fetches each
    descriptor over a new authenticated socket connection to the worker: per batch, that cost
    more than reading it (``benchmarks/torch_map.py``). Pickled, this dict instead writes the
    plain CPU tensors and NumPy arrays of its (nested) dicts, as they are then (so torch's
    ``default_convert`` may change them first), into one file and sends the file's name; the
    training process maps the file, deletes its name at once, and gets plain dicts whose tensors
    view the mapping. Anything else (lists, tensor subclasses, dtypes NumPy lacks) travels the
    way torch sends it, and so does the whole batch if the file cannot be written: a batch is
    never lost. Files the training process never took are deleted when their worker exits (a
    ``break``, a shut-down DataLoader), and those of a killed worker when the training process
    exits.
    """

    __slots__ = ()

    def __copy__(self) -> SharedBatch:
        return SharedBatch(self)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        path = _new_path()
        try:
            arrays: list[np.ndarray] = []
            skeleton = _split(dict(self), arrays)
            return _unpack, (str(path), skeleton, write_arrays(path, arrays))
        except Exception:  # e.g. /dev/shm full: torch's own transport instead
            path.unlink(missing_ok=True)
            return dict, (dict(self),)


@dataclass(frozen=True)
class _ArrayRef:
    """Where array ``index`` of a :class:`SharedBatch` went, and what it was."""

    index: int
    dtype: str
    shape: tuple[int, ...]
    kind: str  # "torch", "torch-bfloat16" or "numpy"


def _leaves(value: Any) -> Iterator[Any]:
    if type(value) is dict:
        for v in value.values():
            yield from _leaves(v)
    else:
        yield value


def _packable(value: Any) -> bool:
    if type(value) is torch.Tensor:
        return (
            value.device.type == "cpu"
            and value.layout == torch.strided
            and not (value.requires_grad)
        )
    return type(value) is np.ndarray and value.dtype.kind in "biufcmM"


def _split(value: Any, arrays: list[np.ndarray]) -> Any:
    """``value`` with the packable tensors and arrays of its dicts replaced by references into
    ``arrays``."""
    if type(value) is dict:
        return {k: _split(v, arrays) for k, v in value.items()}
    if not _packable(value):
        return value
    if isinstance(value, np.ndarray):
        kind, array = "numpy", np.ascontiguousarray(value)
    else:
        tensor = value.resolve_conj().resolve_neg().contiguous()
        try:
            if tensor.dtype == torch.bfloat16:  # NumPy has no bfloat16: travel as its bits
                kind, array = "torch-bfloat16", tensor.view(torch.int16).numpy()
            else:
                kind, array = "torch", tensor.numpy()
        except (TypeError, RuntimeError):  # a dtype NumPy lacks (float8, ...): torch sends it
            return value
    arrays.append(array)
    return _ArrayRef(len(arrays) - 1, array.dtype.str, tuple(array.shape), kind)


batches_received = 0  # batches this process took from files (the tests check the path taken)


def _unpack(path: str, skeleton: Any, layout: list[int]) -> Any:
    """In the training process: map the batch's file, delete its name, rebuild the dict."""
    global batches_received
    batch = _join(skeleton, take_mapping(Path(path)), layout)
    batches_received += 1
    return batch


def _join(value: Any, buf: mmap.mmap, layout: list[int]) -> Any:
    if isinstance(value, dict):
        return {k: _join(v, buf, layout) for k, v in value.items()}
    if not isinstance(value, _ArrayRef):
        return value
    dtype = np.dtype(value.dtype)
    count = math.prod(value.shape)
    array = np.frombuffer(buf, dtype, count, layout[value.index]).reshape(value.shape)
    if value.kind == "numpy":
        return array
    tensor = torch.from_numpy(array)
    return tensor.view(torch.bfloat16) if value.kind == "torch-bfloat16" else tensor


# --- the files: named by training process and worker, deleted if never taken ----------------

_counter = itertools.count()
_prefix: tuple[int, str] | None = None  # (pid, prefix) of this worker


def _new_path() -> Path:
    """A fresh name ``lanceloader-batch-<training pid>-<worker pid>-<random>-<n>``. The first
    in a worker arranges for its leftovers to be deleted when it exits, and removes what killed
    training processes left (``lifetime.py``)."""
    global _prefix
    if _prefix is None or _prefix[0] != os.getpid():
        parent = multiprocessing.parent_process()  # the training process, whatever started us
        training = parent.pid if parent is not None and parent.pid else os.getpid()
        _prefix = (
            os.getpid(),
            lifetime.shm_name("batch", training, os.getpid(), uuid.uuid4().hex[:8]),
        )
        lifetime.remove_orphans()
        watch_training_process()
        # multiprocessing runs these finalizers when a worker exits (it skips atexit).
        multiprocessing.util.Finalize(
            None, _remove_worker_files, args=(_prefix[1],), exitpriority=10
        )
    return SHM_DIR / f"{_prefix[1]}-{next(_counter)}"


def watch_training_process() -> None:
    """In a DataLoader worker: end this worker, removing its files, when the training process
    dies, even by SIGKILL (``lifetime.watch_owner``). torch's own check watches the worker's
    parent, which under ``forkserver`` is the forkserver: it outlives a killed training process,
    and so would the workers. A no-op in the training process; called per batch, it costs a
    comparison after the first call in a process."""
    global _watching_in
    if _watching_in == os.getpid():
        return
    if torch.utils.data.get_worker_info() is None:
        return
    parent = multiprocessing.parent_process()
    if parent is not None and parent.pid:
        lifetime.watch_owner(parent.pid)
    _watching_in = os.getpid()


_watching_in = 0  # the pid of the DataLoader worker whose watcher runs


def _remove_worker_files(prefix: str) -> None:
    """At a worker's exit: let its queues' feeder threads (which pickle, so write the files)
    finish, briefly, then delete the files the training process did not take."""
    for thread in threading.enumerate():
        if thread.name == "QueueFeederThread" and thread is not threading.current_thread():
            thread.join(0.5)
    lifetime.remove_prefix(prefix)


def _remove_files_of_my_workers(pid: int) -> None:
    """At the training process's exit, after multiprocessing has stopped its workers: what a
    killed worker left behind."""
    if os.getpid() == pid:
        lifetime.remove_prefix(lifetime.shm_name("batch", pid))


# Priority below 0: runs after multiprocessing has terminated and joined the daemon workers.
multiprocessing.util.Finalize(
    None, _remove_files_of_my_workers, args=(os.getpid(),), exitpriority=-10
)
