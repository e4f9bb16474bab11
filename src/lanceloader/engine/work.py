"""Read + Transform: what a worker does with one task.

A :class:`ReadTask` is a run of consecutive batches of one rank. The worker reads the rows of all
of them with one coalesced Lance read (per-row cost falls several-fold from 256 to 65,536 rows per
call, see ``benchmarks/``), slices the result back into batches, and runs the user ``transform``
and the output conversion on each. Reading big and slicing small is what makes small batches as
fast as large ones.

The function is pure with respect to the task: which worker runs it, and when, never changes what
it returns, so results are independent of ``num_workers`` and ``prefetch``.
"""

from __future__ import annotations

import bisect
import dataclasses
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from lanceloader.batch.output import Conversion, as_conversion, to_output
from lanceloader.batch.row_keys import row_keys
from lanceloader.batch.tensors import to_framework
from lanceloader.batch.transforms import DEFAULT_MAX_SKIP_FRACTION, OnError, apply_transform
from lanceloader.ordering.order import Order
from lanceloader.ordering.plan import ReadTask
from lanceloader.rows.dataset import ReadError
from lanceloader.rows.protocol import (
    Pieces,
    Read,
    RowSource,
    as_table,
    to_record_batch,
    transforming,
)

Transform = Callable[[Any], Any]

# The functions of a task that name its stage, for reports of a stalled worker (engine.py).
STAGES = {
    "read_rows": "read",
    "apply_transform": "transform",
    "to_output": "convert",
    "_convert_chunks": "convert",
    "pack": "transfer to the training process",
    "positions": "order",
}


def stage_of(functions: list[str]) -> str:
    """The stage of a worker whose stack has ``functions`` (innermost first): the innermost
    that names one, or ``'idle (between tasks)'`` when no task runs.

    >>> stage_of(["sleep_forever", "apply_transform", "__call__", "run"])
    'transform'
    """
    for name in functions:
        if name in STAGES:
            return STAGES[name]
    return "idle (between tasks)"


@dataclass
class TaskResult:
    """What a worker hands back for one task: the batches and what it cost to make them.

    Plain data (picklable), so the consumer records it, whichever worker or process made it.
    """

    batches: list[Any]
    rows: list[int]
    nbytes: list[int]
    seconds: dict[str, float]
    io_bytes: int = 0
    io_iops: int = 0
    rows_cached: int = 0
    rows_skipped: int = 0
    cache_damaged: int = 0
    cache_fills: int = 0
    spans: list[tuple[str, float, float, dict[str, Any]]] = field(default_factory=list)
    lane: str = ""
    slices: RowSlices | None = None  # the batches as row ranges of a few arrays, in transit
    # each batch's (converted chunk, first row, end row), where the batches are such slices
    row_ranges: list[tuple[Any, int, int]] | None = field(default=None, repr=False)

    def for_transport(self) -> TaskResult:
        """What a process worker or an actor sends (:class:`ForTransport`): where the batches
        are row slices of a few converted arrays (NumPy output), those and :attr:`slices`, no
        batches; the consumer cuts them (:meth:`after_transport`). Made here, so thread
        workers' results pay nothing for it."""
        if self.row_ranges is None:
            return self
        return dataclasses.replace(
            self, batches=[], row_ranges=None, slices=_row_slices(self.row_ranges)
        )

    def after_transport(self) -> TaskResult:
        """The result as the worker made it: its batches cut from :attr:`slices` (then dropped,
        so each chunk lives only as long as its batches)."""
        if self.slices is not None:
            if not self.batches:
                self.batches = self.slices.batches()
            self.slices = self.row_ranges = None
        return self


@dataclass(frozen=True)
class ForTransport:
    """A process worker's or an actor's work: ``work``'s result as it travels
    (:meth:`TaskResult.for_transport`); the stream that takes it makes the batches
    (:meth:`TaskResult.after_transport`). The pool carries whatever its work returns and asks
    it nothing."""

    work: BatchWork

    def __call__(self, task: Any) -> TaskResult:
        return self.work(task).for_transport()


@dataclass
class RowSlices:
    """A result's batches as row ranges of a few converted chunks, each cut to the rows its
    batches take. Process workers send this, not the batches: one array per chunk and column to
    find, place and rebuild, where a read of 481 batches of 3 columns was 1,443 (~6 µs each)."""

    chunks: list[Any]  # converted (nested dicts of NumPy arrays)
    bounds: np.ndarray  # per batch: (chunk, first row, end row)

    def batches(self) -> list[Any]:
        return [_slice_rows(self.chunks[c], lo, hi) for c, lo, hi in self.bounds.tolist()]


def _row_slices(where: list[tuple[Any, int, int]]) -> RowSlices:
    """The :class:`RowSlices` of batches ``where`` = ``(converted chunk, lo, hi)`` each."""
    index: dict[int, int] = {}  # per chunk's id: its index in ``converted``
    converted: list[Any] = []
    for c, _, _ in where:
        if id(c) not in index:
            index[id(c)] = len(converted)
            converted.append(c)
    keys = np.array([index[id(c)] for c, _, _ in where], dtype=np.int64)
    rows = np.array([(lo, hi) for _, lo, hi in where], dtype=np.int64).reshape(-1, 2)
    firsts = np.full(len(converted), np.iinfo(np.int64).max, dtype=np.int64)
    ends = np.zeros(len(converted), dtype=np.int64)
    np.minimum.at(firsts, keys, rows[:, 0])
    np.maximum.at(ends, keys, rows[:, 1])
    chunks = [
        _slice_rows(c, int(lo), int(hi)) for c, lo, hi in zip(converted, firsts, ends, strict=True)
    ]
    bounds = np.column_stack([keys, rows - firsts[keys, None]])
    return RowSlices(chunks, bounds)


@dataclass(frozen=True)
class BatchWork:
    """Everything a worker needs besides the task: picklable, so process workers can use it."""

    source: RowSource
    order: Order
    transform: Transform | None
    output: str | Conversion
    trace: bool = False
    on_error: OnError = "raise"
    max_skip_fraction: float = DEFAULT_MAX_SKIP_FRACTION

    @property
    def conversion(self) -> Conversion:
        return as_conversion(self.output)

    def _convert_chunks(self, rows: pa.Table | Pieces) -> list[tuple[int, int, Any, int]] | None:
        """Convert each of Lance's chunks (or each record batch of a :class:`Pieces`) once, so
        batches are NumPy slices of them: ``(start, stop, converted, base)`` says rows
        ``[start, stop)`` of the read are rows ``base...`` of ``converted``.

        Only without a transform, and only where slicing gives what per-batch conversion would
        (no per-batch padding or string widths); on any error, batches convert one by one (and
        report the error with their batch index).
        """
        conv = self.conversion
        if isinstance(rows, Pieces):
            pieces = rows
        else:  # a table: each of its chunks is one run
            batches = rows.to_batches()
            pieces = Pieces(batches, [(i, 0, len(b)) for i, b in enumerate(batches)])
        if (
            self.transform is not None
            or not pieces.batches
            or not _sliceable(pieces.batches[0].schema, conv)
        ):
            return None
        in_numpy = conv if conv.output == "numpy" else dataclasses.replace(conv, output="numpy")
        converted: dict[int, Any] = {}
        chunks, start = [], 0
        try:
            for b, first, n in pieces.runs:
                if b not in converted:
                    converted[b] = to_output(pieces.batches[b], in_numpy)
                chunks.append((start, start + n, converted[b], first))
                start += n
        except Exception:
            return None
        return chunks

    def __call__(self, task: ReadTask) -> TaskResult:
        """The task's batches: one read of its positions, then each batch converted (a slice of
        the read's conversion where that gives the same) or transformed and converted."""
        clock = time.perf_counter
        positions = self.order.positions(task.epoch, task.samples)
        read, result = self._read(task, positions)
        rows, seconds = read.rows, result.seconds
        # Arrow bytes per row, once per read (per batch it costs ~10 µs): exact for fixed-width
        # columns, the read's average for strings.
        bytes_per_row = (
            rows.bytes_per_row if isinstance(rows, Pieces) else rows.nbytes / max(1, rows.num_rows)
        )
        t0 = clock()
        chunks = self._convert_chunks(rows)
        seconds["convert"] += clock() - t0
        conv = self.conversion
        if conv.output in ("numpy", "torch") and chunks:
            # batches each within one converted chunk: slices, found in one pass (no search
            # per batch); torch tensors made once per chunk
            t0 = clock()
            if _slice_all(result, chunks, task.sizes, bytes_per_row, conv.output):
                seconds["convert"] += clock() - t0
                return result
        table: pa.Table | None = None  # the rows as one table, made once a batch needs Arrow
        offset = 0
        for i, size in enumerate(task.sizes):
            result.rows.append(size)  # a read gives a row per position
            result.nbytes.append(round(bytes_per_row * size))
            ready = _slice_of(chunks, offset, size)
            if ready is not None:  # already converted with its read: slice it (no copy)
                t0 = clock()
                view = _slice_rows(ready[0], ready[1], ready[1] + size)
                result.batches.append(view if conv.output == "numpy" else to_output(view, conv))
                seconds["convert"] += clock() - t0
            else:
                if table is None:
                    table = as_table(rows)
                result.batches.append(
                    self._prepare(
                        table.slice(offset, size),
                        task,
                        i,
                        positions[offset : offset + size],
                        task.samples[offset : offset + size],
                        result,
                    )
                )
            offset += size
        return result

    def _read(self, task: ReadTask, positions: np.ndarray) -> tuple[Read, TaskResult]:
        """The read of the task's positions, timed (a read that decodes, clips, says how long
        it decoded: booked as decode, not storage), and the task's result to fill."""
        clock = time.perf_counter
        t0 = clock()
        with _annotate("lanceloader.read"):
            try:
                read = self.source.read_rows(positions, task.epoch)
            except ReadError as exc:
                exc.batches, exc.epoch = task.batches, task.epoch
                raise
        if read.rows.num_rows != len(positions):  # batches are counted and sliced by position
            raise RuntimeError(
                f"lanceloader: a read of {len(positions)} positions from "
                f"{self.source.dataset_name.uri!r} returned "
                f"{read.rows.num_rows} rows; this is a bug, please report it"
            )
        t1 = clock()
        decoded = t1 - min(read.decode_s, t1 - t0)
        seconds = {"read": decoded - t0, "decode": t1 - decoded, "transform": 0.0, "convert": 0.0}
        spans: list[tuple[str, float, float, dict[str, Any]]] = []
        if self.trace:
            spans.append(
                ("read", t0, decoded, {"first_batch": task.batches[0], "rows": len(positions)})
            )
            if t1 > decoded:
                spans.append(("decode", decoded, t1, {"first_batch": task.batches[0]}))
        lane = f"{threading.current_thread().name} (pid {os.getpid()})"
        return read, TaskResult(
            [],
            [],
            [],
            seconds,
            read.io_bytes,
            read.io_iops,
            read.rows_cached,
            spans=spans,
            lane=lane,
            cache_damaged=read.cache_damaged,
            cache_fills=read.cache_fills,
        )

    def _prepare(
        self,
        rows: pa.Table,
        task: ReadTask,
        i: int,
        positions: np.ndarray,
        samples: np.ndarray,
        result: TaskResult,
    ) -> Any:
        """Batch ``i`` of the task (``rows``): the transform (under the batch's row keys and
        rows), then the conversion; an error gets a note naming the batch and its rows."""
        clock, seconds, spans = time.perf_counter, result.seconds, result.spans
        batch: Any = to_record_batch(rows)
        try:
            if self.transform is not None:
                t0 = clock()
                with (
                    _annotate("lanceloader.transform"),
                    transforming(self.source),
                    row_keys(self.order.seed, task.epoch, samples),
                ):
                    batch, skipped = apply_transform(
                        self.transform,
                        batch,
                        self.on_error,
                        max_skip_fraction=self.max_skip_fraction,
                    )
                result.rows_skipped += skipped
                result.rows[-1] -= skipped
                t1 = clock()
                seconds["transform"] += t1 - t0
                if self.trace:
                    spans.append(("transform", t0, t1, {"batch": task.batches[i]}))
            # A transform may return Arrow or a dict (converted as usual), or its own format.
            if isinstance(batch, pa.RecordBatch | dict):
                t0 = clock()
                batch = to_output(batch, self.conversion)
                t1 = clock()
                seconds["convert"] += t1 - t0
                if self.trace:
                    spans.append(("convert", t0, t1, {"batch": task.batches[i]}))
            return batch
        except Exception as exc:
            name = self.source.dataset_name
            _add_note(
                exc,
                f"lanceloader: raised while preparing batch {task.batches[i]} of epoch "
                f"{task.epoch}: preparing rows {_preview(positions)} of Lance dataset "
                f"{name.uri!r} (version {name.version}), "
                f"{self.source.describe_rows(positions)}{self._row_note(exc, positions)}",
            )
            raise

    def _row_note(self, exc: Exception, rows: np.ndarray) -> str:
        """Where the row an error names (``ConversionError.row``, a null) lies in the dataset:
        known without a transform, which may drop or reorder rows."""
        row = getattr(exc, "row", None)
        if not isinstance(row, int) or self.transform is not None or not 0 <= row < len(rows):
            return ""
        return (
            f"; its row {row} is position {int(rows[row])}: "
            f"{self.source.describe_rows(rows[row : row + 1])}"
        )


def _sliceable(schema: pa.Schema, conv: Conversion) -> bool:
    """Whether a converted chunk, sliced by rows, equals the conversion of the slice."""
    if conv.output not in ("numpy", "torch", "jax", "tf") or conv.strings == "numpy":
        return False
    padded_per_batch = conv.ragged == "pad" and conv.pad_to is None
    return not (padded_per_batch and any(_has_var_list(f.type) for f in schema))


def _has_var_list(typ: pa.DataType) -> bool:
    if pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_list_view(typ):
        return True
    if pa.types.is_struct(typ):
        return any(_has_var_list(typ.field(i).type) for i in range(typ.num_fields))
    if pa.types.is_fixed_size_list(typ):
        return _has_var_list(typ.value_type)
    return False


def _slice_of(
    chunks: list[tuple[int, int, Any, int]] | None, offset: int, size: int
) -> tuple[Any, int] | None:
    """The converted chunk holding rows ``[offset, offset + size)`` and the offset in it."""
    if not chunks:
        return None
    i = bisect.bisect_right(chunks, offset, key=lambda chunk: chunk[0]) - 1  # starts ascend
    start, stop, converted, base = chunks[max(i, 0)]
    if start <= offset and offset + size <= stop:
        return converted, base + offset - start
    return None  # the batch spans two chunks


def _slice_all(
    result: TaskResult,
    chunks: list[tuple[int, int, Any, int]],
    sizes: Sequence[int],
    bytes_per_row: float,
    output: str = "numpy",
) -> bool:
    """Append each batch of ``sizes`` to ``result`` as slices (:func:`_slice_rows`) of the
    converted chunk holding it (chunks in row order); False, with nothing appended,
    when a batch spans two chunks or a chunk does not convert (the caller then goes batch by
    batch, and its errors name the batch). ``output="torch"``: each chunk's arrays become
    tensors once (``torch.from_numpy``, no copy) and batches are slices of them, the same
    tensors as converting each batch's slices (~10 us a batch less)."""
    where: list[tuple[Any, int, int]] = []
    j, offset = 0, 0
    for size in sizes:
        while j < len(chunks) and chunks[j][1] <= offset:
            j += 1
        if j == len(chunks) or offset + size > chunks[j][1] or offset < chunks[j][0]:
            return False
        start, _, converted, base = chunks[j]
        lo = base + offset - start
        where.append((converted, lo, lo + size))
        offset += size
    framed: dict[int, Any] = {}  # per converted chunk (runs of Pieces may share one)
    try:
        for converted, _, _ in where:
            if id(converted) not in framed:
                framed[id(converted)] = (
                    converted if output == "numpy" else to_framework(converted, "", output)
                )
    except Exception:
        return False
    for converted, lo, hi in where:
        result.batches.append(_slice_rows(framed[id(converted)], lo, hi))
    if output == "numpy":
        result.row_ranges = where
    result.rows.extend(sizes)
    result.nbytes.extend(round(bytes_per_row * size) for size in sizes)
    return True


def _slice_rows(value: Any, lo: int, hi: int) -> Any:
    """Rows ``[lo, hi)`` of a converted batch (nested dicts of arrays): views, no copy. Once
    per batch, so a column is sliced in place, not through a call."""
    if isinstance(value, dict):
        return {
            k: _slice_rows(v, lo, hi) if isinstance(v, dict) else v[lo:hi] for k, v in value.items()
        }
    return value[lo:hi]


def _annotate(name: str) -> AbstractContextManager[Any]:
    """``torch.profiler.record_function(name)`` when torch is loaded, so stages show in its
    profiler; a no-op otherwise (never imports torch)."""
    profiler = sys.modules.get("torch.autograd.profiler")
    # The process-wide flag (the C++ check only sees the calling thread, never a worker's).
    # Annotating when no profiler runs would cost ~9 µs a span for nothing.
    if profiler is not None and getattr(profiler, "_is_profiler_enabled", False):
        return sys.modules["torch"].profiler.record_function(name)
    return nullcontext()


def _add_note(exc: BaseException, note: str) -> None:
    if hasattr(exc, "add_note"):  # Python >= 3.11
        exc.add_note(note)


def _preview(positions: np.ndarray, limit: int = 8) -> str:
    head = ", ".join(str(p) for p in positions[:limit].tolist())
    return f"[{head}{', ...' if len(positions) > limit else ''}] ({len(positions)} rows)"
