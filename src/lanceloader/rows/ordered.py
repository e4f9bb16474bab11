"""OrderedSource: a source read through its own order and row-preserving transform.

What a mix draws from (:mod:`lanceloader.rows.mixed`): the source's samples form an endless
stream of its epochs, each in its own order (epoch 0, then epoch 1 in a new order, ...), and
*stream index* ``i`` is sample ``i % num_rows`` of epoch ``i // num_rows``. A read of stream
indices reads the rows once (sorted and unique: no row moved twice) and, with a transform, runs
it on the one transform path (:func:`~lanceloader.batch.transforms.apply_transform`: the
row-count check, error notes) under the *source's* row keys (its seed, each row's source epoch
and source sample), so ``ll.random_map`` in a mix source draws exactly what it draws on the same
source's own Loader: anew per sample and per epoch.

A source's transform must keep every row and return Arrow: its rows are placed in the mixed order
by count. So its ``on_error`` must be ``"raise"``; skipping belongs on the mix's Loader
(:meth:`OrderedSource.__init__` says so).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lanceloader.batch.row_keys import row_keys
from lanceloader.batch.transforms import TransformOutputError, apply_transform, transform_name
from lanceloader.ordering.order import Order
from lanceloader.rows.protocol import (
    Read,
    RowSource,
    as_table,
    empty_table,
    read_table,
    sorted_unique,
    to_record_batch,
    transforming,
)
from lanceloader.state.format import fingerprint, order_settings

TOKEN_SAMPLE_ROWS = 4096  # rows read to measure a source's mean tokens per row (weights_by)


class OrderedSource:
    """``source`` read as the endless stream of its epochs in ``order``, through ``transform``
    (see the module's text). ``Loader.ordered_source(name)`` makes one of a Loader."""

    def __init__(
        self,
        name: str,
        source: RowSource,
        order: Order,
        transform: Any = None,
        on_error: Any = "raise",
    ) -> None:
        if on_error != "raise":
            raise ValueError(
                f"mix source {name!r} has on_error={on_error!r}: a source's transform must keep "
                "every row (its rows are placed in the mixed order by count). Put on_error= "
                "(and transforms that may skip rows) on the mix's Loader"
            )
        if "mix" in source.settings():
            raise TypeError(
                f"mix source {name!r} is itself a mix: a mix of mixes is one mix "
                "with the weights multiplied out; list its sources in one Mix"
            )
        self.name, self.source, self.order, self.transform = name, source, order, transform

    @property
    def num_rows(self) -> int:
        """Samples of one of the source's epochs."""
        return self.source.num_rows

    def settings(self) -> dict[str, Any]:
        """What defines this source's stream: its dataset, version and order (hashed)."""
        name = self.source.dataset_name
        return {
            "dataset": name.identity,
            "version": name.version,
            "order": fingerprint(
                name.identity, name.version, order_settings(self.source, self.order)
            ),
        }

    def positions(self, index: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The source epoch, sample and position of each stream index."""
        epoch, sample = np.divmod(np.asarray(index, dtype=np.int64), self.num_rows)
        if epoch[0] == epoch[-1]:  # one epoch of the source (the usual case)
            return epoch, sample, self.order.positions(int(epoch[0]), sample)
        positions = np.empty_like(sample)
        for e in np.unique(epoch).tolist():
            at = epoch == e
            positions[at] = self.order.positions(int(e), sample[at])
        return epoch, sample, positions

    def read_stream(self, index: np.ndarray) -> tuple[Read, np.ndarray | None]:
        """The rows of stream indices ``index`` (ascending) and, per index, its row in them
        (``None``: the rows are in ``index`` order). Without a transform each row is read once
        (sorted, unique); with one, each sample is a row of its own (a row read in two epochs
        draws twice), transformed under its keys."""
        epoch, sample, positions = self.positions(index)
        if epoch[0] != epoch[-1]:  # the stream wraps into the source's next epoch
            return self._read_epochs(epoch, sample, positions), None
        if self.transform is None:
            unique, where = sorted_unique(positions)
            return self.source.read_rows(unique, int(epoch[0])), where
        read = self.source.read_rows(positions, int(epoch[0]))
        rows = self.conform(as_table(read.rows), epoch, sample)
        return replace(read, rows=rows), None

    def _read_epochs(self, epoch: np.ndarray, sample: np.ndarray, positions: np.ndarray) -> Read:
        """The rows of a stream read over two (or more) of the source's epochs, each epoch's
        part read for its own epoch (clips draw their starts per epoch), in stream order."""
        parts, reads = [], []
        for e in np.unique(epoch).tolist():
            at = epoch == e
            reads.append(self.source.read_rows(positions[at], e))
            parts.append(self.conform(as_table(reads[-1].rows), e, sample[at]))
        return Read(
            pa.concat_tables(parts),
            sum(r.io_bytes for r in reads),
            sum(r.io_iops for r in reads),
            sum(r.rows_cached for r in reads),
            sum(r.cache_damaged for r in reads),
            sum(r.decode_s for r in reads),
            sum(r.cache_fills for r in reads),
        )

    def conform(self, table: pa.Table, epoch: np.ndarray | int, sample: np.ndarray) -> pa.Table:
        """``table`` (the rows of ``sample`` of ``epoch``) through the transform, which must
        return Arrow with every row (else :class:`TransformOutputError`)."""
        if self.transform is None:
            return table
        with transforming(self.source), row_keys(self.order.seed, epoch, sample):
            try:
                out, _ = apply_transform(self.transform, to_record_batch(table), "raise")
            except TransformOutputError as exc:
                raise TransformOutputError(f"mix source {self.name!r}: {exc}") from None
        if not isinstance(out, pa.RecordBatch | pa.Table):
            raise TransformOutputError(
                f"the transform {transform_name(self.transform)} of mix source {self.name!r} "
                f"must return Arrow with every row it was given ({table.num_rows}), got "
                f"{type(out).__name__}: a source's transform conforms its rows to the common "
                "schema; put transforms that drop or add rows on the mix's Loader"
            )
        return out if isinstance(out, pa.Table) else pa.Table.from_batches([out])

    def schema_table(self) -> pa.Table:
        """An empty table of what a read gives: the source's columns, or what the transform
        makes of its first row (one row read)."""
        if self.transform is None or self.num_rows == 0:
            return self.source.schema_table()
        first = np.zeros(1, np.int64)
        table = as_table(self.source.read_rows(self.order.positions(0, first)).rows)
        return empty_table(self.conform(table, 0, first).schema.remove_metadata())

    def __repr__(self) -> str:
        return f"OrderedSource({self.name!r}, {self.source!r}, {self.order})"


def mean_tokens(source: Any, column: str | None) -> float:
    """Mean tokens per row of ``column`` (list or string lengths) over up to
    :data:`TOKEN_SAMPLE_ROWS` rows spread evenly over ``source``."""
    n = source.num_rows
    if n == 0:
        return 1.0
    positions = np.unique(np.linspace(0, n - 1, min(n, TOKEN_SAMPLE_ROWS)).astype(np.int64))
    table = read_table(source, positions)
    if column not in table.column_names:
        raise KeyError(
            f"token_column {column!r} is not among the columns read: {table.column_names}"
        )
    col = table.column(column)
    lengths = (
        pc.utf8_length(col)
        if pa.types.is_string(col.type) or pa.types.is_large_string(col.type)
        else pc.list_value_length(col)
    )
    return max(float(pc.mean(lengths).as_py() or 0.0), 1e-9)
