"""Cached reads: Lance rows read through their cache, piece by piece.

A :class:`~lanceloader.rows.lance.source.Source` with a cache owns one :class:`CachedReads`: the
layout of its pieces (``piece_rows`` consecutive rows of one cache unit, a fragment or a run of
small ones, named by the unit's metadata, the projection and the piece's number, the unit's name
made when a read first names its pieces: :mod:`lanceloader.rows.cache.pieces`) and the
read of any Lance row offsets through the cache. Which pieces are kept is the cache's policy
(:data:`~lanceloader.rows.cache.pieces.FILL_FRACTION`, the fill credit of a local dataset);
where they are kept is the cache's business (``rows/cache/``: a directory or this process's
memory). What runs where: in the process and thread of the read that asks; a piece another
thread or process is filling is waited for (the cache's lock), after this read's other pieces.

Contract of :meth:`CachedReads.read`: the rows at the offsets (any order, duplicates allowed),
in that order, and how many came from a piece in the cache (found there, or filled and kept by
this read; a piece downloaded and not kept counts as the dataset's). No sort of the offsets:
the request is grouped by piece (one stable ``argsort`` of the piece numbers keeps its order
within each piece) and every row is copied once, from its piece straight into its place
(:func:`~lanceloader.rows.gather.gather_rows`); rows consecutive in one piece are a slice of it
(no copy), unless the directory is in memory (its held pieces are shared: copied out). A piece
file found damaged is dropped and filled once more, then its rows are read past the cache.
Storage I/O past Lance's counters (blob payloads) is added to the read's ``StorageIO``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Protocol

import lance
import numpy as np
import pyarrow as pa

from lanceloader.rows.cache import pieces as policy  # the keeping policy, read at each use
from lanceloader.rows.cache.files import DamagedFile, PieceFile, rows_at
from lanceloader.rows.gather import gather_rows, group_order
from lanceloader.rows.protocol import Intervals, StorageIO, distinct, is_identity
from lanceloader.rows.store import reaching_store


class _Lance(Protocol):
    """What cached reads ask of the Lance rows that own them (``Source`` has it)."""

    cache: Any
    columns: list[str]
    bytes_per_row: float
    storage_options: dict[str, str] | None

    @property
    def uri(self) -> str: ...

    @property
    def dataset(self) -> lance.LanceDataset: ...

    def schema_table(self) -> pa.Table: ...

    def read_fragment(self, index: int, start: int, rows: int, io: StorageIO) -> pa.Table: ...

    def unit_metadata(self, index: int) -> Any: ...

    def read_offsets(self, offsets: np.ndarray, io: StorageIO) -> pa.Table: ...


@dataclass
class _Placed:
    """A read's rows as they are found: per part (a piece, or rows read past the cache), the
    rows in it and their places in the read; groups left to read past the cache or to fill
    once another reader has filled their piece."""

    parts: list[pa.Table | Any] = field(default_factory=list)
    wheres: list[np.ndarray | None] = field(default_factory=list)
    placed: list[np.ndarray] = field(default_factory=list)
    direct: list[np.ndarray] = field(default_factory=list)
    waiting: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)
    cached: int = 0


class CachedReads:
    """The pieces of a source's fragments and its reads through ``source.cache`` (see the
    module's text). ``units``: what pieces are cut from (``rows/lance/units.py``; each one's
    metadata names its pieces, asked of the source when first needed: :meth:`unit_key`);
    ``starts``: each unit's first row offset, then the row count; ``selected``: the row offsets
    the filter and split keep (``None``: every row); ``on_store``: an object store (every piece
    a read wants is filled: a take costs a round trip there)."""

    def __init__(
        self,
        source: _Lance,
        units: list[Any],
        starts: np.ndarray,
        selected: np.ndarray | None,
        on_store: bool,
    ) -> None:
        self.source, self.on_store = source, on_store
        self.piece_rows = policy.piece_rows(source.bytes_per_row)
        self._schema = source.schema_table().schema
        self._keys: list[str | None] = [None] * len(units)  # unit_key(), made when first named
        per_fragment = [-(-int(n) // self.piece_rows) for n in np.diff(starts)]
        self.piece_base = np.cumsum([0, *per_fragment], dtype=np.int64)
        # where offsets lie among the pieces (numbered as piece_base counts them)
        self.pieces_at = Intervals(
            np.concatenate(
                [np.arange(a, b, self.piece_rows) for a, b in itertools.pairwise(starts)]
                + [starts[-1:]]
            )
        )
        self.piece_fragment = np.repeat(np.arange(len(units)), np.diff(self.piece_base))
        sizes = np.diff(self.pieces_at.starts)
        chosen = (
            sizes
            if selected is None
            else np.bincount(self.pieces_at.of(selected), minlength=len(sizes))
        )
        self.sizes = sizes
        self.share = chosen / np.maximum(sizes, 1)  # of each piece, the rows selected
        kept = sizes[self.share >= policy.FILL_FRACTION].sum() * source.bytes_per_row
        self.fits = bool(kept <= source.cache.size)  # every piece worth keeping, together
        self.fill_credit = 0.0  # pieces this process's reads may fill for slivers

    def name(self, piece: int) -> str:
        """The cache name of piece number ``piece``."""
        unit = int(self.piece_fragment[piece])
        number = piece - int(self.piece_base[unit])
        return policy.piece_name(self.unit_key(unit), self.piece_rows, number)

    def unit_key(self, unit: int) -> str:
        """The name of unit ``unit``'s data in the projection (:func:`~lanceloader.rows.cache.
        pieces.fragment_key` of its metadata), made in this process when first asked (a slot
        made twice by two threads holds the same name)."""
        key = self._keys[unit]
        if key is None:
            meta = self.source.unit_metadata(unit)
            key = self._keys[unit] = policy.fragment_key(meta, self.source.columns, self._schema)
        return key

    @property
    def fragment_keys(self) -> list[str]:
        """Every unit's :meth:`unit_key`, in order."""
        return [self.unit_key(i) for i in range(len(self._keys))]

    def read(self, offsets: np.ndarray, io: StorageIO) -> tuple[pa.Table, int]:
        """The rows at Lance ``offsets`` through the cache, and how many came from it."""
        if not len(offsets):
            return self.source.schema_table().slice(0, 0), 0
        piece = self.pieces_at.of(offsets)
        row = offsets - self.pieces_at.starts[piece]  # row in its piece
        order = (
            np.arange(len(piece)) if bool(np.all(piece[1:] >= piece[:-1])) else group_order(piece)
        )
        grouped = piece[order]
        breaks = np.flatnonzero(grouped[1:] != grouped[:-1]) + 1
        grouped_rows = row[order]  # each group's rows in its piece: slices, no NumPy call
        allowed = self._sliver_fills(len(offsets))
        fills, found = allowed, _Placed()
        spans = list(zip([0, *breaks.tolist()], [*breaks.tolist(), len(order)], strict=True))
        # the largest groups first: a read fills its own piece before it takes a sliver of a
        # piece another read is about to fill (else it filled both while that read waited)
        spans.sort(key=lambda span: span[0] - span[1])
        for a, b in spans:
            group, rows = order[a:b], grouped_rows[a:b]
            p = int(piece[group[0]])
            sliver = b - a < policy.FILL_FRACTION * self.sizes[p] or (
                len(distinct(offsets[group])) < policy.FILL_FRACTION * self.sizes[p]
            )
            kept, fills = self._kept(p, sliver, fills)
            if kept is None and sliver and not fills and self.source.cache.whole_reads:
                found.direct.append(group)  # not held here, and no credit to read it whole
                continue
            if kept is not None and self._take(kept, p, group, rows, True, found):
                continue
            if not self._worth_filling(p, sliver, fills):
                found.direct.append(group)
                continue
            fills -= sliver
            if not self._fill(p, group, rows, False, found, io):  # being filled: the rest first
                found.waiting.append((group, rows))
        for group, rows in found.waiting:
            self._fill(int(piece[group[0]]), group, rows, True, found, io)
        if not self.on_store:
            self.fill_credit = max(0.0, self.fill_credit - (allowed - fills))
        return self._assemble(found, offsets, io), found.cached

    def _kept(self, p: int, sliver: bool, fills: int) -> tuple[pa.Table | PieceFile | None, int]:
        """Piece ``p`` from the cache, and the fills left. A cache that reads a piece not held
        in this process whole (a directory in memory) does so for a sliver only on the fill
        credit (spending one): a fresh worker's first read of a filled cache took a few rows
        of 91 pieces and copied and checked all of them (100M rows, 8 workers: 2.1 s to the
        first batch); without credit the sliver is read from the dataset, as a fill's is."""
        cache = self.source.cache
        if not (sliver and cache.whole_reads):
            return cache.get(self.name(p)), fills
        held = cache.held_piece(self.name(p))
        if held is not None or not fills:
            return held, fills
        kept = cache.get(self.name(p))
        return kept, fills - (kept is not None)

    def _sliver_fills(self, rows: int) -> int:
        """The pieces this read may fill for a sliver: on a store every one; locally the
        process's credit, earned by the rows read (threads may lose an update to each other:
        a heuristic)."""
        if self.on_store:
            return rows
        per_fill = min(policy.ROWS_PER_FILL, self.piece_rows / 2)
        self.fill_credit = min(self.fill_credit + rows / per_fill, policy.FILL_CREDIT_MOST)
        return int(self.fill_credit)

    def _worth_filling(self, p: int, sliver: bool, fills: int) -> bool:
        """Piece ``p`` is filled when enough of it is selected, a sliver only when every piece
        fits and the read has fills left, and the cache would keep it."""
        if self.share[p] < policy.FILL_FRACTION or (sliver and not (self.fits and fills)):
            return False
        return bool(
            self.source.cache.keeps(self.name(p), self.sizes[p] * self.source.bytes_per_row)
        )

    def _take(
        self,
        kept: pa.Table | PieceFile,
        p: int,
        request: np.ndarray,
        rows: np.ndarray,
        counted: bool,
        found: _Placed,
    ) -> bool:
        """Place the request's rows (``rows`` in piece ``p``) of a kept piece; False when its
        file proved damaged (dropped)."""
        if isinstance(kept, PieceFile):  # the record batches holding the rows
            try:
                kept, rows = kept.locate(rows)
            except DamagedFile as exc:
                self.source.cache.drop_damaged(self.name(p), str(exc))
                return False
        found.parts.append(kept)
        found.wheres.append(rows)
        found.placed.append(request)
        found.cached += len(request) if counted else 0
        return True

    def _fill(
        self,
        p: int,
        group: np.ndarray,
        rows: np.ndarray,
        block: bool,
        found: _Placed,
        io: StorageIO,
    ) -> bool:
        """Fill piece ``p`` and place the group's rows (a damaged file: once more); False when
        another reader is filling it and ``block`` is False."""
        for _ in range(2):
            kept, counted = self.source.cache.fill_piece(self.name(p), self._load(p, io), block)
            if kept is None:
                return False
            if self._take(kept, p, group, rows, counted, found):
                return True
        found.direct.append(group)
        return True

    def _load(self, p: int, io: StorageIO) -> Any:
        """What fills piece ``p``: its rows from Lance in one chunk, blob columns as bytes."""
        fragment = int(self.piece_fragment[p])
        start = (p - int(self.piece_base[fragment])) * self.piece_rows
        source = self.source

        def piece_table() -> pa.Table:
            _ = source.dataset  # opened in this process (a worker opens it at its first miss)
            return reaching_store(
                lambda: source.read_fragment(fragment, start, self.piece_rows, io),
                source.uri,
                source.storage_options,
            )

        return piece_table

    def _assemble(self, found: _Placed, offsets: np.ndarray, io: StorageIO) -> pa.Table:
        """The read's rows in its order: the rows past the cache read from Lance in one call,
        then every part's rows put in their places (one piece in order: a slice)."""
        source = self.source
        if found.direct:
            request = np.concatenate(found.direct)
            found.parts.append(
                reaching_store(
                    lambda: source.read_offsets(offsets[request], io),
                    source.uri,
                    source.storage_options,
                )
            )
            found.wheres.append(None)
            found.placed.append(request)
        if len(found.parts) == 1 and is_identity(found.placed[0]) and not source.cache.copies_out:
            # one piece, in order: a slice when it can (never of a piece held for a directory
            # in memory: every read of the process shares it, and a tensor of it is writable)
            where = found.wheres[0]
            table = found.parts[0] if where is None else rows_at(found.parts[0], where)
            if where is not None and table.num_columns and table.column(0).num_chunks > 1:
                table = table.combine_chunks()  # a piece file's record batches: one chunk out
        else:
            table = gather_rows(found.parts, found.wheres, found.placed, len(offsets))
        return table.select(source.columns)
