"""Source: the rows that exist, pinned to one version of one Lance dataset.

A :class:`Source` is a Lance dataset at one version, a column projection, an optional SQL filter
and an optional named split. It knows ``num_rows`` after the filter and split, maps a *position*
in ``[0, num_rows)`` to a Lance row offset, and reads any list of positions as one Arrow
``RecordBatch`` in exactly that order.

Reads coalesce: the requested rows are sorted and deduplicated, contiguous runs become range reads
(Lance's fastest path on local disk: :mod:`lanceloader.rows.lance.sorted_read`), the scattered
rest becomes one ``take`` (on object storage, everything is one ``take``, and the first read of
each fragment in a process goes alone, so reads in flight together fetch a file's metadata once:
:mod:`lanceloader.rows.lance.first_reads`), and the result is put back into the requested order with
one Arrow ``take``. With ``cache=``, reads go through the cache first, in pieces of a fragment or
of a run of small ones (:mod:`lanceloader.rows.lance.cached`, :mod:`lanceloader.rows.lance.units`).
Construction (the filter/split plan, the bytes per row) is :mod:`lanceloader.rows.lance.plan`.

Errors: every failure of a read is raised as :class:`ReadError` (an ``OSError``), which names the
URI, the pinned version, the fragments and rows read and, from a worker, the batches; the
original error (a Lance ``OSError``, ``ValueError``, or a Rust panic, which Python sees as a
``BaseException``) is its ``__cause__``. Lance's messages are quoted without its Rust source
paths.

Fork-safety: a ``Source`` pickles as plain parameters (URI, version, storage options, columns and
the computed row list) and opens Lance lazily, once per process (keyed by PID). It never carries a
live Lance handle into a child process.

Example::

    >>> src = Source(uri, columns=["id"], filter="id % 2 = 0")      # doctest: +SKIP
    >>> src.read(np.array([2, 0])).to_pydict()                       # doctest: +SKIP
    {'id': [4, 0]}
"""

from __future__ import annotations

import hashlib
import json
import numbers
import os
from typing import Any

import lance
import numpy as np
import pyarrow as pa

from lanceloader.arguments import check_optional_str, check_storage_options
from lanceloader.lifecycle import forksafe
from lanceloader.rows.cache.auto import auto_cache
from lanceloader.rows.cache.disk import DiskCache
from lanceloader.rows.cache.pieces import AUTO, MemoryCache, make_cache, piece_rows
from lanceloader.rows.dataset import (
    NOT_READ_FAILURES,
    ReadError,
    check_columns,
    fragment_names,
    names_identity,
    open_dataset,
)
from lanceloader.rows.lance.blobs import (
    attach_blobs,
    check_blob_choices,
    rows_schema,
    take_blob_files,
)
from lanceloader.rows.lance.cached import CachedReads
from lanceloader.rows.lance.describe import (
    damaged_fragment,
    describe_offsets,
    read_error,
    warn_empty,
)
from lanceloader.rows.lance.first_reads import FirstReads
from lanceloader.rows.lance.follow import Agreement, FollowsTable, agreed_dataset, start_following
from lanceloader.rows.lance.fragment_tails import FragmentTails
from lanceloader.rows.lance.fragments import Fragments
from lanceloader.rows.lance.nulls import check_nulls
from lanceloader.rows.lance.pinned import LateName, PinnedDataset
from lanceloader.rows.lance.plan import bytes_per_row, select_rows
from lanceloader.rows.lance.sorted_read import read_sorted_local
from lanceloader.rows.lance.units import Unit, cache_units, read_unit
from lanceloader.rows.protocol import (
    Intervals,
    Read,
    ReadHints,
    RowsBase,
    RowsFacts,
    StorageIO,
    as_table,
    distinct,
    empty_table,
    inverse_permutation,
    is_identity,
    is_run,
    sorted_unique,
    to_record_batch,
)
from lanceloader.rows.store import is_object_store, reaching_store
from lanceloader.state.format import local_uri


class Source(PinnedDataset, FollowsTable, RowsBase):
    """One Lance dataset, pinned to one version, with columns, filter and split applied once.

    Args:
        dataset: a URI (local path or object store) or an open ``lance.LanceDataset``.
        columns: columns to read; ``None`` reads all.
        filter: SQL predicate, evaluated once at construction against the pinned version.
        version: version number or tag to pin; default: the latest.
        storage_options: passed to ``lance.dataset`` (credentials, endpoints).
        splits: ``{"name": fraction}``; with ``split``, keeps only that split's rows.
        split: the split to keep.
        split_key: column whose value decides a row's split; default: the row's offset in the
            pinned version (stable while the dataset is only appended to).
        cache: ``None``, ``"memory"`` or a local directory: keep pieces of the projected
            columns there, so later epochs read locally (see :mod:`lanceloader.rows.cache.pieces`); a
            directory also shares the filter/split plan between the ranks and processes that
            use it.
        cache_size: the cache's cap in bytes; default half the directory's free disk space,
            or half the available memory.
        random_order: whether the rows are read in a shuffled order: with ``cache="auto"``
            (the automatic cache, :func:`lanceloader.rows.cache.auto.auto_cache`) a shuffle or an
            object store gets a cache under ``/dev/shm`` when the projected columns fit its
            budget; ``cache_choice`` says what was chosen and why.
        blobs: how blob columns are read, ``{column: "bytes" | "file" | "descriptor"}``;
            default ``"bytes"`` (the payloads, ``large_binary``). See
            :mod:`lanceloader.rows.lance.blobs`.
        follow: each epoch reads the table's newest version at its start, or the one
            ``follow(newest)`` agrees on (:mod:`lanceloader.rows.lance.follow`).

    Attributes set at construction: ``plan_origin``, how the filter/split row list was got:
    ``"none"`` (no filter or split), ``"scan"`` (this process scanned the dataset) or
    ``"cache"`` (another rank or process had, and shared it through the cache directory).
    """

    def __init__(
        self,
        dataset: str | os.PathLike[str] | lance.LanceDataset,
        columns: list[str] | None = None,
        filter: str | None = None,
        version: int | str | None = None,
        storage_options: dict[str, str] | None = None,
        splits: dict[str, float] | None = None,
        split: str | None = None,
        split_key: str | None = None,
        cache: str | os.PathLike[str] | None = None,
        cache_size: int | None = None,
        blobs: dict[str, str] | None = None,
        random_order: bool = True,
        follow: bool | Agreement = False,
    ) -> None:
        check_storage_options(storage_options)
        auto = isinstance(cache, str) and cache == AUTO
        self.cache: DiskCache | MemoryCache | None = make_cache(
            None if auto else cache, None if auto else cache_size
        )
        # what the cache is, and why (stats()): given, or chosen by cache="auto"
        self.cache_choice: str = (
            "none (cache=None)" if cache is None else "auto" if auto else f"{self.cache!r} (given)"
        )
        check_optional_str("filter", filter, "'label = 3'")
        check_optional_str("split", split, "'train'")
        check_optional_str("split_key", split_key, "'id'")
        if isinstance(version, bool) or not isinstance(version, numbers.Integral | str | None):
            raise TypeError(
                f"version must be a version number, a tag or None (the latest); got "
                f"the {type(version).__name__} {version!r}"
            )
        self.storage_options = dict(storage_options) if storage_options else None
        version = int(version) if isinstance(version, numbers.Integral) else version
        ds = agreed_dataset(open_dataset(dataset, version, self.storage_options), follow, version)
        self._fragments = fragments = Fragments(ds)  # wrapped and described on demand
        # the fragments' names: what the identity hashes and a followed table keeps; when
        # pinned, both are made when first asked (dataset_name: pinned.py)
        names = fragment_names(fragments.all_metadata()) if follow else []
        known = names_identity(ds.schema, names) if follow else None
        self.dataset_name = LateName(local_uri(ds.uri), ds.version, self.made_identity, known)
        self._version: int = ds.version
        self.schema: pa.Schema = ds.schema
        self.columns: list[str] = check_columns(columns, ds.schema)
        self.blobs: dict[str, str] = check_blob_choices(blobs, ds.schema, self.columns)
        self.filter = filter
        self.splits = dict(splits) if splits else None
        self.split = split
        self.split_key = split_key
        self._given = {"cache": cache, "cache_size": cache_size, "random_order": random_order}
        self._pid = os.getpid()
        self._ds = ds
        self._reader: forksafe.CleanReader | None = None
        self._reader_pid = 0
        # which fragments this process's dataset has read (their file metadata cached): made
        # by _opening() at the first read on an object store, anew with each reopened dataset
        self._first_reads: FirstReads | None = None
        # slivers of fragments shared by this process's sequential reads on an object store
        self._tails: FragmentTails | None = None
        self._on_store = is_object_store(self.uri)
        self._store_fragment_positions: np.ndarray | None = None
        self._fragment_ids = fragments.ids()  # the manifest's: no call per fragment
        self._fragment_starts = np.cumsum([0, *fragments.live_rows()], dtype=np.int64)
        self._fragments_at = Intervals(self._fragment_starts)  # before any read (its errors)
        self.plan_origin = "none"
        self._rows: np.ndarray | None = select_rows(self, ds)
        self.bytes_per_row, sampled = bytes_per_row(self, fragments, self._fragment_starts)
        if sampled is not None:
            self._opening().opened([sampled])  # its file's metadata is in ds's cache now
        if auto:  # decided once the rows and their size are known
            self.cache, self.cache_choice = auto_cache(
                random_order,
                is_object_store(self.uri),
                self.bytes_per_row * self.num_rows,
                cache_size,
            )
        self._units: list[Unit] = []  # what the cache's pieces are cut from (_cached_reads)
        self.cached = None if self.cache is None else self._cached_reads()
        ds.io_stats_incremental()  # construction's I/O is not the first read's (stats())
        following = start_following(follow, ds.version, self.num_rows, names)
        self.follow, self._agree, self._names = following
        if self.num_rows == 0 and not follow:  # a followed table may fill later
            warn_empty(self, int(self._fragment_starts[-1]))

    # --- construction -------------------------------------------------------------------

    def _cached_reads(self) -> CachedReads:
        """The reads through the cache (``rows/lance/cached.py``), its pieces cut from cache
        units: a fragment, or a run of consecutive small ones (``rows/lance/units.py``)."""
        self._units, starts = cache_units(
            np.diff(self._fragment_starts), piece_rows(self.bytes_per_row)
        )
        return CachedReads(self, self._units, starts, self._rows, self._on_store)

    def cache_key(self, kind: str, *extra: Any) -> str:
        """The cache name of an array derived from this source's rows (the filter/split plan,
        a packing's lengths): ``kind`` plus a hash of the identity, filter, split and
        ``extra``, so every rank and process reading the same rows finds the same file."""
        key = json.dumps(
            [self.identity, self.filter, self.splits, self.split, self.split_key, *extra]
        )
        return f"{kind}-" + hashlib.blake2b(key.encode(), digest_size=12).hexdigest()

    # --- reading ------------------------------------------------------------------------

    @property
    def num_rows(self) -> int:
        """Rows after filter and split: positions are ``[0, num_rows)``."""
        if self._rows is None:
            return int(self._fragment_starts[-1])
        return len(self._rows)

    def fragment_positions(self) -> np.ndarray:
        """The positions at which each fragment's rows begin, then ``num_rows`` (ascending;
        a fragment that the filter or split empties repeats its neighbour's): reads of
        consecutive positions that stay between two of them read one data file
        (``engine/stream.py`` cuts sequential reads on object storage there).

        >>> Source(uri, ["id"]).fragment_positions().tolist()     # doctest: +SKIP
        [0, 500, 1000, 1500, 2000]
        """
        if self._rows is None:
            return self._fragment_starts.copy()
        return np.searchsorted(self._rows, self._fragment_starts).astype(np.int64)

    def row_offsets(self, positions: np.ndarray) -> np.ndarray:
        """Lance row offsets (in the pinned version) of the given positions."""
        positions = np.asarray(positions, dtype=np.int64)
        return positions if self._rows is None else self._rows[positions]

    def read(self, positions: np.ndarray) -> pa.RecordBatch:
        """Rows at ``positions``, in that order (duplicates allowed), as one RecordBatch."""
        return to_record_batch(self.read_table(positions))

    def read_table(self, positions: np.ndarray) -> pa.Table:
        """Like :meth:`read`, as a Table whose chunks are Lance's (no copy to merge them)."""
        return as_table(self.read_rows(positions).rows)

    def read_rows(self, positions: np.ndarray, epoch: int = 0) -> Read:
        """The rows at ``positions`` (the protocol's read; ``epoch`` plays no part: positions
        are rows), with the bytes and IOPS Lance spent on them (since its last read) and the
        rows that came from the cache.

        In a process forked after Lance ran (see ``forksafe.py``), a clean helper process reads.
        Any failure raises :class:`ReadError`.
        """
        try:
            if forksafe.tainted():
                if self._reader is None or self._reader_pid != os.getpid():
                    self._reader, self._reader_pid = forksafe.CleanReader(self), os.getpid()
                return self._reader.read_rows(positions)
            past = StorageIO()  # blob payloads read past Lance's counters
            table, cached = self._read_local(positions, past)
            damaged = 0 if self.cache is None else self.cache.take_damaged()
            fills = 0 if self.cache is None else self.cache.take_fills()
            if self._ds is None or self._pid != os.getpid():
                # all from the cache: Lance not opened here
                return Read(table, past.bytes, past.reads, cached, damaged, cache_fills=fills)
            io = self._ds.io_stats_incremental()
            return Read(
                table,
                io.read_bytes + past.bytes,
                io.read_iops + past.reads,
                cached,
                damaged,
                cache_fills=fills,
            )
        except (ReadError, *NOT_READ_FAILURES):
            raise
        except BaseException as exc:
            narrowed = self._damaged_fragment(positions) if isinstance(exc, Exception) else None
            if narrowed is not None:
                cause, offsets = narrowed
                raise self.read_error(cause, offsets=offsets) from cause
            raise self.read_error(exc, positions) from exc

    def _damaged_fragment(self, positions: np.ndarray) -> tuple[Exception, np.ndarray] | None:
        """The damaged fragment among those a failed read touched (its error and offsets), or
        None (:func:`~lanceloader.rows.lance.describe.damaged_fragment`)."""
        offsets = self.row_offsets(positions)
        return damaged_fragment(self, offsets, self._fragment_of(offsets))

    def settings(self) -> dict[str, Any]:
        """Which rows the positions are (``state["order"]``): the filter and the split, and a
        followed table's history of adoptions."""
        return {
            "filter": self.filter,
            "splits": self.splits,
            "split": self.split,
            "split_key": self.split_key,
            **self.follow_settings(),
        }

    def read_error(
        self,
        exc: BaseException,
        positions: np.ndarray | None = None,
        *,
        offsets: np.ndarray | None = None,
    ) -> ReadError:
        """The :class:`ReadError` for ``exc``, raised while reading ``positions`` (or the Lance
        row ``offsets``)."""
        if offsets is None:
            offsets = self.row_offsets(
                positions if positions is not None else np.zeros(0, np.int64)
            )
        return read_error(self, exc, offsets, self._fragment_of(offsets), self._fragment_ids)

    def _fragment_of(self, offsets: np.ndarray) -> np.ndarray:
        """The index (in the pinned version's fragment list) of the fragment of each offset."""
        return self._fragments_at.of(offsets)

    def describe_rows(self, positions: np.ndarray) -> str:
        """Where ``positions`` lie in the pinned version: fragments and their rows, e.g.
        ``'fragment 3 rows 0-511'``, for error messages."""
        return self.describe_offsets(self.row_offsets(positions))

    def describe_offsets(self, offsets: np.ndarray, limit: int = 4) -> str:
        """:meth:`describe_rows` of Lance row offsets."""
        offsets = np.sort(offsets)
        return describe_offsets(
            offsets, self._fragment_of(offsets), self._fragment_starts, self._fragment_ids, limit
        )

    def _read_local(self, positions: np.ndarray, io: StorageIO) -> tuple[pa.Table, int]:
        """The rows at ``positions`` and how many of them came from the cache."""
        if self.cached is not None:
            return self.cached.read(self.row_offsets(positions), io)
        if self._on_store and is_run(positions):  # a sequential read: slivers shared

            def read() -> pa.Table:
                return self._read_run(int(positions[0]), int(positions[-1]) + 1, io)
        else:
            offsets = self.row_offsets(positions)

            def read() -> pa.Table:
                return self.read_offsets(offsets, io)

        # a gone object store fails in seconds, not after Lance's retries
        return reaching_store(read, self.uri, self.storage_options), 0

    def _read_run(self, lo: int, hi: int, io: StorageIO) -> pa.Table:
        """Positions ``[lo, hi)`` on an object store, sharing fragment slivers with the reads
        next to it (:meth:`FragmentTails.read_run
        <lanceloader.rows.lance.fragment_tails.FragmentTails.read_run>`)."""
        starts = self._store_fragment_positions
        if starts is None:
            starts = self._store_fragment_positions = self.fragment_positions()
        return self._sharing().read_run(
            lo, hi, starts, lambda a, b: self.read_offsets(self.row_offsets(np.arange(a, b)), io)
        )

    def read_offsets(self, offsets: np.ndarray, io: StorageIO) -> pa.Table:
        """The rows at Lance ``offsets`` (any order, duplicates allowed), from Lance (not the
        cache); blob payloads read past Lance are counted in ``io``."""
        unique, inverse = sorted_unique(offsets)
        table, order = self._read_sorted(unique)
        if not (is_identity(order) and (inverse is None or is_identity(inverse))):
            # one take: from the order read to the unique offsets' order, then to the request's
            back = inverse_permutation(order)
            table = table.take(pa.array(back if inverse is None else back[inverse]))
        return attach_blobs(table.select(self.columns), offsets, self.blobs, self, io)

    def read_fragment(self, index: int, start: int, rows: int, io: StorageIO) -> pa.Table:
        """Up to ``rows`` rows of the ``index``-th cache unit (a fragment, or a run of small ones:
        :mod:`lanceloader.rows.lance.units`) from its row ``start`` (a cache piece), in one
        chunk, blob columns read as :attr:`blobs` says. One chunk (Lance's batch size set to
        the rows): ``to_table`` gave a chunk per 8,192 rows, which the cache then copied into one
        (3.6 ms of CPU per 13.6 MB piece on the emulated store, same requests)."""
        unit = self._units[index]
        table = read_unit(self.dataset, self._opened_fragments(), unit, self.columns, start, rows)
        first = int(self._fragment_starts[unit.first]) + start
        return attach_blobs(table, np.arange(first, first + table.num_rows), self.blobs, self, io)

    def _read_sorted(self, offsets: np.ndarray) -> tuple[pa.Table, np.ndarray]:
        """Read sorted unique offsets from Lance; returns the rows and, per row, its index in
        ``offsets``."""
        ds = self.dataset
        if is_object_store(self.uri):  # one take: Lance sends all its requests at once
            fragments = distinct(self._fragment_of(offsets)).tolist()
            with self._opening().reading(fragments):  # a file's metadata fetched once
                return ds.take(offsets, columns=self.columns), np.arange(len(offsets))
        return read_sorted_local(
            ds,
            self._opened_fragments(),
            self._fragment_starts,
            self._fragment_of(offsets),
            offsets,
            self.columns,
            self.schema_table().slice(0, 0),
        )

    @property
    def version(self) -> int:
        """The pinned version (Lance rows always have one)."""
        return self._version

    @property
    def hints(self) -> ReadHints:
        """Positions are storage order (consecutive ones are ranges); without a cache a read in
        order is Lance range reads alone; through a cache a shuffled read gathers from pieces;
        on an object store, where each data file's rows begin."""
        cached = self.cache is not None
        return ReadHints(
            waits_on_storage=not cached,
            cached=cached,
            gathers=cached,
            fragment_starts=self.fragment_positions() if self._on_store else None,
        )

    @property
    def facts(self) -> RowsFacts:
        return RowsFacts(
            cache_choice=self.cache_choice,
            cache_per_process=isinstance(self.cache, MemoryCache),
            plan_origin=self.plan_origin,
            blobs=self.blobs,
        )

    def lineage(self, positions: np.ndarray, epoch: int = 0) -> dict[str, Any]:
        """The ledger's columns: the dataset, the positions, and each row's offset in the
        pinned version and Lance ``_rowid`` there."""
        offsets = self.row_offsets(positions)
        return {
            **super().lineage(positions, epoch),
            "row_offset": offsets,
            "row_id": self.row_ids(offsets),
        }

    def row_ids(self, offsets: np.ndarray) -> pa.Array:
        """Lance's ``_rowid`` of the rows at ``offsets`` in the pinned version, in order: Lance
        takes it from its metadata (a deletion file, row id sequences), not the data."""
        if not len(offsets):
            return pa.array([], pa.uint64())
        taken = self.dataset.take(np.asarray(offsets, dtype=np.int64), columns=["_rowid"])
        return taken.column("_rowid").combine_chunks()

    def blob_files(self, column: str, offsets: pa.Array, buffer_size: int) -> list[Any]:
        """``lance.BlobFile`` objects of blob ``column`` at Lance row ``offsets`` (what a
        ``"file"`` column holds), on the pinned dataset opened in this process with its storage
        options (their reads count in its next read's I/O)."""
        if self.blobs.get(column) != "file":
            raise ValueError(
                f"blob_files: column {column!r} of {self.uri!r} is not read as "
                f"files; read it with blobs={{{column!r}: 'file'}}"
            )
        return take_blob_files(self.dataset, column, offsets, buffer_size)

    def check_nulls(self, conversion: Any) -> None:
        """Refuse, at construction, nulls that ``conversion`` cannot hold, when a scan is cheap
        (:func:`lanceloader.rows.lance.nulls.check_nulls`)."""
        check_nulls(self, conversion)

    def schema_table(self) -> pa.Table:
        """An empty table with the projected schema."""
        return empty_table(
            rows_schema(self.schema, self.columns, self.blobs, self.uri, self.version)
        )

    def __repr__(self) -> str:
        return (
            f"Source({self.uri!r}, version={self.version}, rows={self.num_rows}, "
            f"columns={self.columns}, filter={self.filter!r}, split={self.split!r})"
        )
