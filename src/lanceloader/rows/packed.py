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

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lanceloader.batch.transforms import tensor_array
from lanceloader.rows.cache.disk import DiskCache
from lanceloader.rows.lance.source import Source
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

DEFAULT_WINDOW = 1024  # documents packed together: padding falls as it grows, cost grows with it
LENGTH_READ_ROWS = 65_536  # rows per read while measuring the documents' lengths
LONG_DOCUMENTS = ("split", "drop")


@dataclass(frozen=True)
class Packing:
    """How to pack (what :func:`pack` returns; give it to ``Loader(pack=...)``)."""

    column: str
    seq_len: int
    window: int = DEFAULT_WINDOW
    long_documents: str = "split"
    pad_id: int = 0
    algorithm: str = "best_fit"

    def settings(self) -> dict[str, Any]:
        return {
            "column": self.column,
            "seq_len": self.seq_len,
            "window": self.window,
            "long_documents": self.long_documents,
            "pad_id": self.pad_id,
            "algorithm": self.algorithm,
        }


def pack(
    column: str,
    seq_len: int,
    *,
    window: int = DEFAULT_WINDOW,
    long_documents: str = "split",
    pad_id: int = 0,
    algorithm: str = "best_fit",
) -> Packing:
    """Pack the token lists of ``column`` into rows of ``seq_len`` tokens; pass the result as
    ``Loader(..., pack=...)``.

    Args:
        column: a list column of token ids (``list<int>``; tokenise once into the dataset, e.g.
            with ``ll.materialize`` and ``ll.tokenize(padding="none")``).
        seq_len: tokens per packed row.
        window: documents (neighbours in storage) packed together.
        long_documents: ``"split"`` a document over ``seq_len`` tokens into pieces, or
            ``"drop"`` it (counted in ``loader.packing.dropped_documents``).
        pad_id: the token that fills the rest of a row.
        algorithm: ``"best_fit"`` (default) or ``"first_fit"`` (decreasing, within a window).

    >>> pack("input_ids", 2048)
    Packing(column='input_ids', seq_len=2048, window=1024, long_documents='split', pad_id=0, algorithm='best_fit')
    """
    if not isinstance(column, str) or not column:
        raise TypeError(f"pack: column must be a column name, got {column!r}")
    for name, value in (("seq_len", seq_len), ("window", window)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"pack: {name} must be an int >= 1, got {value!r}")
    if long_documents not in LONG_DOCUMENTS:
        raise ValueError(f"pack: long_documents must be 'split' or 'drop', got {long_documents!r}")
    if algorithm not in ("best_fit", "first_fit"):
        raise ValueError(f"pack: algorithm must be 'best_fit' or 'first_fit', got {algorithm!r}")
    if isinstance(pad_id, bool) or not isinstance(pad_id, int):
        raise TypeError(f"pack: pad_id must be an int, got {pad_id!r}")
    return Packing(column, seq_len, window, long_documents, pad_id, algorithm)


@dataclass(frozen=True)
class PackPlan:
    """Which document pieces fill each packed row: row ``r`` holds the pieces
    ``starts[r]:starts[r+1]`` of ``doc`` (document position), ``offset`` (first token) and
    ``length``."""

    seq_len: int
    doc: np.ndarray
    offset: np.ndarray
    length: np.ndarray
    starts: np.ndarray
    dropped_documents: int = 0
    dropped_tokens: int = 0

    @property
    def num_rows(self) -> int:
        return len(self.starts) - 1

    @property
    def tokens(self) -> int:
        return int(self.length.sum())

    @property
    def padding_fraction(self) -> float:
        slots = self.num_rows * self.seq_len
        return 1.0 - self.tokens / slots if slots else 0.0

    def row(self, r: int) -> list[tuple[int, int, int]]:
        lo, hi = self.starts[r], self.starts[r + 1]
        return list(
            zip(
                self.doc[lo:hi].tolist(),
                self.offset[lo:hi].tolist(),
                self.length[lo:hi].tolist(),
                strict=True,
            )
        )

    def pieces(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The pieces of ``rows`` (in that order) and the number each row has."""
        rows = np.asarray(rows, dtype=np.int64)
        counts = self.starts[rows + 1] - self.starts[rows]
        first = np.repeat(self.starts[rows] - np.cumsum(counts) + counts, counts)
        return first + np.arange(int(counts.sum())), counts


def pack_plan(
    lengths: np.ndarray,
    seq_len: int,
    window: int = DEFAULT_WINDOW,
    long_documents: str = "split",
    algorithm: str = "best_fit",
) -> PackPlan:
    """The packing of documents of ``lengths`` (in storage order) into rows of ``seq_len``.

    Whole ``seq_len`` pieces of long documents are rows of their own, first in their window;
    then each window's other pieces are packed, longest first, into the fullest row they fit
    (``"best_fit"``) or the first (``"first_fit"``). All windows are packed at once, one
    NumPy step per piece rank, so the cost is about ``documents x rows per window`` element
    operations.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    docs = np.arange(len(lengths), dtype=np.int64)
    dropped = np.zeros(0, np.int64)
    if long_documents == "drop":
        dropped = lengths[lengths > seq_len]
        docs = docs[lengths <= seq_len]
    docs = docs[lengths[docs] > 0]
    full = lengths[docs] // seq_len
    rest = lengths[docs] - full * seq_len
    # Rows of one whole piece: the k-th seq_len tokens of a long document.
    whole_doc = np.repeat(docs, full)
    whole_offset = (np.arange(len(whole_doc)) - np.repeat(np.cumsum(full) - full, full)) * seq_len
    # Pieces to pack: the remainders (a whole document when it is short).
    keep = rest > 0
    p_doc, p_len, p_off = docs[keep], rest[keep], (full * seq_len)[keep]
    p_win = p_doc // window
    order = np.lexsort((p_doc, -p_len, p_win))  # by window, then longest first
    p_doc, p_len, p_off, p_win = p_doc[order], p_len[order], p_off[order], p_win[order]
    windows, first, per_window = np.unique(p_win, return_index=True, return_counts=True)
    bin_of = _bin_pack(p_len, first, per_window, seq_len, algorithm)
    # Rows, window by window: its whole pieces, then its bins in the order they were opened.
    w_whole = whole_doc // window
    bins_per_window = np.zeros(len(windows), np.int64)
    if len(windows):
        np.maximum.at(bins_per_window, np.repeat(np.arange(len(windows)), per_window), bin_of + 1)
    all_windows = np.union1d(windows, np.unique(w_whole))
    whole_count = np.zeros(len(all_windows), np.int64)
    np.add.at(whole_count, np.searchsorted(all_windows, w_whole), 1)
    packed_count = np.zeros(len(all_windows), np.int64)
    packed_count[np.searchsorted(all_windows, windows)] = bins_per_window
    row_base = np.cumsum(whole_count + packed_count) - whole_count - packed_count
    whole_rank = np.arange(len(whole_doc)) - np.repeat(
        np.cumsum(whole_count) - whole_count, whole_count
    )
    whole_row = row_base[np.searchsorted(all_windows, w_whole)] + whole_rank
    at = np.searchsorted(all_windows, p_win)
    piece_row = row_base[at] + whole_count[at] + bin_of
    num_rows = int((whole_count + packed_count).sum())
    row = np.concatenate([whole_row, piece_row])
    doc = np.concatenate([whole_doc, p_doc])
    offset = np.concatenate([whole_offset, p_off])
    length = np.concatenate([np.full(len(whole_doc), seq_len, np.int64), p_len])
    by_row = np.lexsort((offset, doc, row))
    counts = np.bincount(row, minlength=num_rows)
    starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return PackPlan(
        seq_len,
        doc[by_row],
        offset[by_row].astype(np.int64),
        length[by_row].astype(np.int64),
        starts,
        len(dropped),
        int(dropped.sum()),
    )


def _bin_pack(
    lengths: np.ndarray, first: np.ndarray, per_window: np.ndarray, seq_len: int, algorithm: str
) -> np.ndarray:
    """The bin (row within its window) of each piece; pieces are grouped by window
    (``first``, ``per_window``) and sorted longest first within each."""
    bins = np.zeros(len(lengths), np.int64)
    if not len(lengths):
        return bins
    width = int(per_window.max())
    free = np.full((len(first), 1), seq_len, np.int64)  # bins opened so far (+ one empty)
    for rank in range(width):
        active = np.flatnonzero(per_window > rank)
        piece = first[active] + rank
        need = lengths[piece]
        room = free[active]
        fits = room >= need[:, None]
        if algorithm == "best_fit":
            choice = np.where(fits, room, seq_len + 1).argmin(axis=1)
        else:
            choice = fits.argmax(axis=1)
        bins[piece] = choice
        free[active, choice] -= need
        if (free[:, -1] < seq_len).any():  # an empty bin was used: keep one empty at the end
            free = np.concatenate([free, np.full((len(first), 1), seq_len, np.int64)], axis=1)
    return bins


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


def pack_tokens(
    values: np.ndarray,
    first: np.ndarray,
    length: np.ndarray,
    counts: np.ndarray,
    seq_len: int,
    pad_id: int,
    dtype: Any = np.int64,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows of ``seq_len`` made of pieces ``values[first[i]:first[i] + length[i]]``, ``counts[r]``
    pieces for row ``r``: token ids, segment ids (1, 2, ...; 0 padding) and positions.

    >>> ids, seg, pos = pack_tokens(np.arange(10), np.array([0, 7]), np.array([3, 2]),
    ...                             np.array([2]), seq_len=6, pad_id=-1)
    >>> ids.tolist(), seg.tolist(), pos.tolist()
    ([[0, 1, 2, 7, 8, -1]], [[1, 1, 1, 2, 2, 0]], [[0, 1, 2, 0, 1, 0]])
    """
    rows = len(counts)
    ids = np.full((rows, seq_len), pad_id, dtype=dtype)
    segments = np.zeros((rows, seq_len), np.int32)
    positions = np.zeros((rows, seq_len), np.int32)
    if not len(length):
        return ids, segments, positions
    row = np.repeat(np.arange(rows), counts)
    piece_first = np.cumsum(counts) - counts  # each row's first piece
    rank = np.arange(len(length)) - np.repeat(piece_first, counts)  # a piece's number in its row
    ends = np.cumsum(length)
    row_start_tokens = np.repeat(np.concatenate([[0], ends])[piece_first], counts)
    at = ends - length - row_start_tokens  # where each piece starts in its row
    total = int(ends[-1])
    token_piece = np.repeat(np.arange(len(length)), length)
    within = np.arange(total) - np.repeat(ends - length, length)
    dest = (row * seq_len + at)[token_piece] + within
    ids.reshape(-1)[dest] = values[first[token_piece] + within]
    segments.reshape(-1)[dest] = (rank + 1)[token_piece]
    positions.reshape(-1)[dest] = within
    return ids, segments, positions
