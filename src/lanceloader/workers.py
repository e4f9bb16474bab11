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

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from lanceloader.convert import to_output
from lanceloader.order import Order
from lanceloader.source import Source, to_record_batch

Transform = Callable[[Any], Any]


@dataclass(frozen=True)
class ReadTask:
    """Batches ``first_batch ..`` of one epoch; ``samples[i]`` are batch i's global samples."""

    epoch: int
    first_batch: int
    samples: tuple[np.ndarray, ...]


@dataclass(frozen=True)
class BatchWork:
    """Everything a worker needs besides the task: picklable, so process workers can use it."""

    source: Source
    order: Order
    transform: Transform | None
    output: str

    def __call__(self, task: ReadTask) -> list[Any]:
        sizes = [len(s) for s in task.samples]
        positions = self.order.positions(task.epoch, np.concatenate(task.samples))
        table = self.source.read_table(positions)
        results = []
        offset = 0
        for i, size in enumerate(sizes):
            batch: Any = to_record_batch(table.slice(offset, size))
            try:
                if self.transform is not None:
                    batch = self.transform(batch)
                # A transform may return Arrow (converted as usual) or its own format (kept as is).
                is_arrow = isinstance(batch, pa.RecordBatch)
                results.append(to_output(batch, self.output) if is_arrow else batch)
            except Exception as exc:
                _add_note(
                    exc,
                    f"lanceloader: raised while preparing batch {task.first_batch + i} of epoch "
                    f"{task.epoch} (source positions {_preview(positions[offset:offset + size])})",
                )
                raise
            offset += size
        return results


def _add_note(exc: BaseException, note: str) -> None:
    if hasattr(exc, "add_note"):  # Python >= 3.11
        exc.add_note(note)


def _preview(positions: np.ndarray, limit: int = 8) -> str:
    head = ", ".join(str(p) for p in positions[:limit].tolist())
    return f"[{head}{', ...' if len(positions) > limit else ''}] ({len(positions)} rows)"
