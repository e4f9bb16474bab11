"""The packing plan: which document pieces fill each packed row, a pure function of the
documents' lengths (no I/O), and the packing of tokens into rows by that plan. What
``ll.pack(column, seq_len)`` asks for (:class:`Packing`); the rows a Loader reads of it are
:class:`~lanceloader.rows.packed.PackedSource`.

>>> plan = pack_plan(np.array([3, 5, 2, 6]), seq_len=8)
>>> [plan.row(r) for r in range(plan.num_rows)]
[[(2, 0, 2), (3, 0, 6)], [(0, 0, 3), (1, 0, 5)]]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

DEFAULT_WINDOW = 1024  # documents packed together: padding falls as it grows, cost grows with it


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
