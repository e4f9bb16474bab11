"""Packing: variable-length token sequences packed into rows of ``seq_len`` tokens, once.

``Loader(uri, pack=ll.pack("input_ids", seq_len=2048))`` reads *packed rows* instead of the
dataset's rows. The packing is computed once, when the loader is built, from the documents'
lengths in storage order (after filter and split), so it is the same in every epoch, on every
rank and in every process: the loader's order then shuffles packed rows like any other rows,
batch counts are equal on every rank (the plan cuts a fixed number of rows), and a checkpoint is
the usual ``(epoch, sample)``: O(1) to resume, whatever the position.

How documents are packed (:func:`pack_plan`, pure NumPy): documents are taken in windows of
``window`` neighbours in storage; within a window, best-fit decreasing (each document, longest
first, goes into the fullest row it fits in). A document longer than ``seq_len`` is cut into
``seq_len`` pieces plus a remainder that is packed like a document (``long_documents="split"``),
or left out and counted (``"drop"``). No token is lost or repeated otherwise.

A packed row has three columns, each ``[seq_len]``:

* ``<column>``: the tokens, padded with ``pad_id``;
* ``segment_ids``: 1, 2, ... for the documents (pieces) of the row, 0 for padding; an attention
  mask that keeps documents apart is ``(seg[:, None] == seg[None, :]) & (seg[:, None] > 0)``
  (and causal);
* ``position_ids``: the position within each document piece, from 0 (padding 0), as
  Hugging Face models take for packed sequences.

``loader.stats().padding_fraction`` is the share of padding tokens of the packed rows (every
epoch delivers each packed row once, so it is also each epoch's).

Example::

    >>> plan = pack_plan(np.array([3, 5, 2, 6]), seq_len=8)
    >>> [plan.row(r) for r in range(plan.num_rows)]
    [[(2, 0, 2), (3, 0, 6)], [(0, 0, 3), (1, 0, 5)]]
    >>> plan.padding_fraction
    0.0
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lanceloader.batch.transforms import tensor_array
from lanceloader.rows.cache.disk import DiskCache
from lanceloader.rows.lance.source import Source
from lanceloader.rows.packing import Packing, pack_plan, pack_tokens
from lanceloader.rows.protocol import (
    Read,
    ReadHints,
    RowsBase,
    RowsFacts,
    RowSource,
    as_table,
    empty_table,
    read_table,
)

LENGTH_READ_ROWS = 65_536  # rows per read while measuring the documents' lengths


def document_lengths(source: RowSource, column: str) -> np.ndarray:
    """Tokens of each row of ``source`` (its positions, in order), read in chunks; a null
    token is refused here, before any training step (:func:`check_tokens`)."""
    n = source.num_rows
    out = np.zeros(n, np.int64)
    for lo in range(0, n, LENGTH_READ_ROWS):
        hi = min(n, lo + LENGTH_READ_ROWS)
        col = read_table(source, np.arange(lo, hi)).column(column)
        check_tokens(col, column, source, np.arange(lo, hi))
        out[lo:hi] = pc.fill_null(pc.list_value_length(col), 0).to_numpy()
    return out


def check_tokens(
    tokens: pa.Array | pa.ChunkedArray, column: str, source: RowSource, positions: np.ndarray
) -> None:
    """Raise unless every token of the lists ``tokens`` (read at ``positions``) is a value: a
    null token has no id, and NumPy would make it -9223372036854775808. (A null list is an
    empty document.)"""
    values = pc.list_flatten(tokens)
    if values.null_count:
        lengths = pc.fill_null(pc.list_value_length(tokens), 0).to_numpy()
        seen = np.concatenate([[0], np.cumsum(values.is_null().to_numpy(zero_copy_only=False))])
        ends = np.cumsum(lengths)
        nulls = seen[ends] - seen[ends - lengths]  # null tokens per document
        bad = np.asarray(positions)[np.flatnonzero(nulls)]
        raise ValueError(
            f"pack: column {column!r} has {values.null_count} null tokens, in the documents at "
            f"positions {bad[:8].tolist()} ({source.describe_rows(bad[:8])}); a token must be "
            "an id: fill or drop them once (e.g. ll.materialize with a transform that removes "
            "them), or filter those rows out"
        )


def _lengths(inner: Source, column: str) -> np.ndarray:
    """The documents' lengths, computed once per cache directory when the source has one (every
    rank and process that names it shares them, as they share the filter's plan)."""
    if not isinstance(inner.cache, DiskCache):
        return document_lengths(inner, column)
    lengths, _ = inner.cache.load_or_make(
        inner.cache_key("lengths", column), lambda: document_lengths(inner, column)
    )
    return lengths


class PackedSource(RowsBase):
    """The packed rows of Lance rows (the rows protocol, :mod:`lanceloader.rows.protocol`): a
    view of one :class:`~lanceloader.rows.lance.source.Source`, whose dataset, version and
    cache it reports; position *r* is packed row *r*.

    Reading packed rows reads each document they hold once (one call of the inner source) and
    copies the tokens into place with NumPy. Picklable (the plan travels to process workers).
    """

    def __init__(self, inner: Source, packing: Packing) -> None:
        column = packing.column
        if not isinstance(inner, Source):
            raise TypeError(
                f"pack: packs the rows of one Lance dataset (with its filter and "
                f"split), not {type(inner).__name__}; pack each source of a mix on "
                "its own Loader"
            )
        if column not in inner.columns:
            raise KeyError(
                f"pack: column {column!r} is not among the columns read "
                f"({inner.columns}); choose it with columns="
            )
        typ = inner.schema.field(column).type
        if not (pa.types.is_list(typ) or pa.types.is_large_list(typ)) or not pa.types.is_integer(
            typ.value_type
        ):
            raise TypeError(
                f"pack: column {column!r} must be a list of token ids (list<int>), "
                f"got {typ}; tokenise it once into the dataset (ll.materialize with "
                "ll.tokenize(padding='none'))"
            )
        if inner.columns != [column]:
            raise ValueError(
                f"pack: a packed row holds tokens of several documents, so only "
                f"the token column can be read; pass columns=[{column!r}] (got "
                f"{inner.columns})"
            )
        self.dtype = typ.value_type.to_pandas_dtype()
        limits = np.iinfo(self.dtype)
        if not limits.min <= packing.pad_id <= limits.max:
            raise ValueError(
                f"pack: pad_id={packing.pad_id} does not fit the tokens' type "
                f"{typ.value_type} of column {column!r} ({limits.min} to "
                f"{limits.max}); choose a pad_id in that range"
            )
        self.inner, self.packing = inner, packing
        self.plan = pack_plan(
            _lengths(inner, column),
            packing.seq_len,
            packing.window,
            packing.long_documents,
            packing.algorithm,
        )
        self.dataset_name = inner.dataset_name
        self.columns = [column, "segment_ids", "position_ids"]
        value = pa.from_numpy_dtype(self.dtype)
        self.schema = pa.schema(
            [
                pa.field(column, pa.list_(value, packing.seq_len)),
                pa.field("segment_ids", pa.list_(pa.int32(), packing.seq_len)),
                pa.field("position_ids", pa.list_(pa.int32(), packing.seq_len)),
            ]
        )
        self.bytes_per_row = packing.seq_len * (np.dtype(self.dtype).itemsize + 8)

    @property
    def num_rows(self) -> int:
        return self.plan.num_rows

    @property
    def hints(self) -> ReadHints:
        """Packed rows are documents in storage order, read through the inner cache if any."""
        return ReadHints(cached=self.inner.hints.cached)

    @property
    def facts(self) -> RowsFacts:
        inner = self.inner.facts
        return RowsFacts(
            cache_choice=inner.cache_choice,
            cache_per_process=inner.cache_per_process,
            plan_origin=inner.plan_origin,
            padding_fraction=self.plan.padding_fraction,
            packing=self.plan,
        )

    def lineage(self, positions: np.ndarray, epoch: int = 0) -> dict[str, Any]:
        """The ledger's columns: each packed row's documents (their row offsets and ids) and
        each piece's tokens in its document, in the order the row holds them."""
        plan = self.plan
        pieces, counts = plan.pieces(positions)
        offsets = self.inner.row_offsets(plan.doc[pieces])
        bounds = pa.array(np.concatenate([[0], np.cumsum(counts)]).astype(np.int32))
        return {
            **super().lineage(positions, epoch),
            "document_offsets": pa.ListArray.from_arrays(bounds, pa.array(offsets)),
            "document_ids": pa.ListArray.from_arrays(bounds, self.inner.row_ids(offsets)),
            "token_starts": pa.ListArray.from_arrays(bounds, pa.array(plan.offset[pieces])),
            "token_counts": pa.ListArray.from_arrays(bounds, pa.array(plan.length[pieces])),
        }

    def settings(self) -> dict[str, Any]:
        """The inner source's settings and the packing's."""
        return {**self.inner.settings(), "pack": self.packing.settings()}

    def read_rows(self, positions: np.ndarray, epoch: int = 0) -> Read:
        plan, seq_len = self.plan, self.packing.seq_len
        pieces, counts = plan.pieces(positions)
        docs, where = np.unique(plan.doc[pieces], return_inverse=True)
        read = self.inner.read_rows(docs, epoch)
        tokens = as_table(read.rows).column(self.packing.column).combine_chunks()
        check_tokens(tokens, self.packing.column, self.inner, docs)
        values = tokens.values.to_numpy(zero_copy_only=False)
        starts = tokens.offsets.to_numpy()[:-1] - tokens.offsets[0].as_py()
        ids, segments, positions_in = pack_tokens(
            values,
            starts[where] + plan.offset[pieces],
            plan.length[pieces],
            counts,
            seq_len,
            self.packing.pad_id,
            self.dtype,
        )
        out = pa.table(
            {
                self.packing.column: tensor_array(ids),
                "segment_ids": tensor_array(segments),
                "position_ids": tensor_array(positions_in),
            }
        )
        # rows from the cache in packed rows (the read's unit): each its share of documents
        cached = round(len(positions) * read.rows_cached / len(docs)) if len(docs) else 0
        return Read(
            out,
            read.io_bytes,
            read.io_iops,
            cached,
            read.cache_damaged,
            read.decode_s,
            read.cache_fills,
        )

    def schema_table(self) -> pa.Table:
        return empty_table(self.schema)

    def describe_rows(self, rows: np.ndarray) -> str:
        pieces, _ = self.plan.pieces(rows)
        return (
            f"packed rows {np.asarray(rows)[:4].tolist()} (documents at positions "
            f"{self.inner.describe_rows(np.unique(self.plan.doc[pieces]))})"
        )

    def __repr__(self) -> str:
        return (
            f"PackedSource({self.inner!r}, seq_len={self.packing.seq_len}, "
            f"rows={self.num_rows}, padding={self.plan.padding_fraction:.1%})"
        )
