"""Source: the rows that exist, pinned to one version of one Lance dataset.

A :class:`Source` is a Lance dataset at one version, a column projection, an optional SQL filter
and an optional named split. It knows ``num_rows`` after the filter and split, maps a *position*
in ``[0, num_rows)`` to a Lance row offset, and reads any list of positions as one Arrow
``RecordBatch`` in exactly that order.

Reads coalesce: the requested rows are sorted and deduplicated, contiguous runs become range reads
of one fragment (Lance's fastest path on local disk, measured in ``benchmarks/``), the scattered
rest becomes one ``take`` (on object storage, everything is one ``take``), and the result is put
back into the requested order with one Arrow ``take``. With ``cache=``, reads go through the
cache first (:mod:`lanceloader.cache`).

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

import contextlib
import hashlib
import json
import logging
import numbers
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lance
import numpy as np
import pyarrow as pa

from lanceloader import forksafe
from lanceloader.arguments import check_optional_str, check_storage_options
from lanceloader.cache import (
    FILL_FRACTION,
    DiskCache,
    MemoryCache,
    fragment_key,
    make_cache,
    piece_name,
    piece_rows,
)
from lanceloader.processes import picklable_error
from lanceloader.splits import split_mask

_logger = logging.getLogger("lanceloader")

# Runs of at least this many contiguous rows are read as fragment ranges; shorter runs join one
# `take`, which beats many small range reads (measured: 1024-row blocks 3.0M vs 1.5M rows/s).
# On object storage every read is one `take`: Lance then sends all of a read's requests at once,
# where range reads one after another each wait for the store (S3 emulated with 20 ms per
# request: sequential 1.19x, block shuffle 1.05x the rows/s of range reads of >= 4,096 rows).
MIN_RANGE_ROWS = 4096
FEW_SHORT_RUNS = 2
# Object-store requests Lance makes give up after these (given as storage_options where the user
# set none of them): a request may take 30 s, its retries 30 s more. Without them, opening a
# dataset on a server that accepts connections but never answers had not ended after 400 s
# (pylance 14); Lance repeats a failed request several times itself, so with them it ends in an
# error after a few minutes, as the loop's stall_timeout would.
OBJECT_STORE_TIMEOUTS = {"connect_timeout": "5s", "timeout": "30s", "client_retry_timeout": "30"}
# What a read may raise that is not the read's failure: these pass through as they are. Anything
# else, a Rust panic (pyo3's PanicException, a BaseException) included, becomes a ReadError.
NOT_READ_FAILURES = (KeyboardInterrupt, SystemExit, GeneratorExit, MemoryError)


class ReadError(OSError):
    """Reading rows of the pinned dataset failed (a damaged or missing data file, a storage
    error, a Lance panic). The message names the URI, version, fragments and rows, and, when a
    worker read them, the batches; the original error is ``__cause__``. The same type with thread
    and process workers.

    Attributes: ``uri``, ``version``, ``fragments`` (ids), ``rows`` (``(first, last, count)`` of
    the Lance row offsets read), ``batches`` and ``epoch`` (None outside a worker).
    """

    def __init__(self, detail: str, uri: str = "", version: int = 0,
                 fragments: tuple[int, ...] = (), rows: tuple[int, int, int] = (0, 0, 0),
                 where: str = "", batches: range | None = None, epoch: int | None = None
                 ) -> None:
        # ReadError(message) alone works too: torch re-raises a DataLoader worker's error as
        # type(exc)(formatted message).
        super().__init__(detail)
        self.detail, self.uri, self.version, self.fragments = detail, uri, version, fragments
        self.rows, self.where, self.batches, self.epoch = rows, where, batches, epoch

    def __str__(self) -> str:
        if not self.uri:
            return self.detail
        first, last, count = self.rows
        batches = ""
        if self.batches is not None:
            b = self.batches
            batches = (f" for batch {b.start}" if len(b) == 1 else
                       f" for batches {b.start}-{b[-1]}") + f" of epoch {self.epoch}"
        return (
            f"reading {count} rows of Lance dataset {self.uri!r} (version {self.version}) "
            f"failed{batches}: {self.where}: {self.detail}. A data file of the dataset may be "
            "truncated, overwritten or missing, or the storage unreachable; check it with "
            f"lance.dataset({self.uri!r}, version={self.version}).take([{first}, {last}]), "
            "and restore the file or the dataset from a copy"
        )

    def __reduce__(self) -> Any:
        # The attributes (and notes) travel in __dict__; the cause, which pickling drops, with
        # them: itself, or a RuntimeError naming it. Its message was redacted when it was caught.
        cause = self.__cause__
        return (ReadError, (self.detail,),
                {**self.__dict__, "__cause__": None if cause is None else picklable_error(cause)})


_RUST_SOURCE = re.compile(r",?\s*(?:[\w.~-]*/)+[\w.-]+\.rs:\d+(?::\d+)?")


def strip_rust_paths(text: str) -> str:
    """``text`` without the Rust source locations Lance appends to its errors.

    >>> strip_rust_paths("no field 'y', /home/ci/lance/rust/src/scanner.rs:839:33)")
    "no field 'y')"
    """
    return _RUST_SOURCE.sub("", text)


def clean_message(exc: BaseException, uri: str | None = None,
                  storage_options: dict[str, str] | None = None) -> str:
    """``exc``'s message without Lance's Rust source paths (``.../commit.rs:653:31``), with
    the leading ``/`` that Lance drops from local paths put back, and with the credentials of
    ``storage_options`` masked (:func:`redact`).

    >>> clean_message(OSError("Not found: tmp/x.lance/_versions, /home/runner/work/lance/"
    ...                       "rust/lance-io/src/local.rs:118:31"), "/tmp/x.lance")
    'Not found: /tmp/x.lance/_versions'
    """
    text = strip_rust_paths(str(exc)).strip()
    if uri and uri.startswith("/"):
        text = re.sub(r"(?<![\w/.])" + re.escape(uri.lstrip("/")), uri, text)
    return redact(text, storage_options) or type(exc).__name__


# storage_options whose names contain one of these hold credentials (access_key_id,
# secret_access_key, session_token, account_key, sas_token, google_service_account_key, ...).
_SECRET_NAMES = ("key", "secret", "token", "password", "credential", "sas", "signature")


def redact(text: str, storage_options: dict[str, str] | None) -> str:
    """``text`` with the values of credential ``storage_options`` replaced by ``***``: errors,
    logs and reprs never show them.

    >>> redact("InvalidAccessKeyId: AKID123 is unknown", {"access_key_id": "AKID123"})
    'InvalidAccessKeyId: *** is unknown'
    """
    for name, value in (storage_options or {}).items():
        if any(word in name.lower() for word in _SECRET_NAMES) and len(value) >= 4:
            text = text.replace(value, "***")
    return text


def redact_exception(exc: BaseException, storage_options: dict[str, str] | None
                     ) -> BaseException:
    """``exc`` with its message's credentials masked (:func:`redact`), in place: it stays the
    ``__cause__`` of the error raised for it, and tracebacks print it."""
    if storage_options:
        with contextlib.suppress(AttributeError, TypeError):  # a type with fixed arguments
            exc.args = tuple(redact(a, storage_options) if isinstance(a, str) else a
                             for a in exc.args)
    return exc


def is_object_store(uri: str) -> bool:
    """Whether ``uri`` names an object store (``s3://``, ``gs://``, ``az://``, ...), not a path.

    >>> is_object_store("s3://bucket/d.lance"), is_object_store("file:///d.lance")
    (True, False)
    """
    return "://" in uri and not uri.startswith("file://")


def object_store_hint(message: str, uri: str, storage_options: dict[str, str] | None) -> str:
    """The likely cause of an object-store error ``message`` (Lance's), or ``''``.

    >>> object_store_hint("... 404 Not Found: <Code>NoSuchBucket</Code> ...", "s3://b/d.lance",
    ...                   {"endpoint": "http://127.0.0.1:9000"})
    "the bucket 'b' does not exist at http://127.0.0.1:9000: check the bucket's name (and the account or region it belongs to)"
    """
    if not is_object_store(uri):
        return ""
    options = {k.lower(): v for k, v in (storage_options or {}).items()}
    endpoint = (options.get("endpoint") or options.get("aws_endpoint")
                or "the store's default endpoint")
    bucket = uri.split("://", 1)[1].split("/", 1)[0]
    if "NoSuchBucket" in message:
        return (f"the bucket {bucket!r} does not exist at {endpoint}: check the bucket's name "
                "(and the account or region it belongs to)")
    if any(s in message for s in ("PermanentRedirect", "AuthorizationHeaderMalformed",
                                  "IllegalLocationConstraint", "301 Moved")):
        return (f"the bucket {bucket!r} is in another region than "
                f"{options.get('region') or options.get('aws_region') or 'the default one'}: "
                "set storage_options region= to the bucket's region")
    if any(s in message for s in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied",
                                  "403 Forbidden", "ExpiredToken", "InvalidToken")):
        return ("the store refused the credentials: check access_key_id / secret_access_key "
                "(or session_token) in storage_options, or the environment's AWS_* variables "
                "and the machine's role")
    if any(s in message for s in ("error sending request", "Connection refused", "dns error",
                                  "connect error", "timed out", "operation timed out")):
        return (f"could not reach {endpoint}: check endpoint= (with allow_http='true' for an "
                "http:// endpoint), the network or proxy, and that the server is running")
    return ""


def object_store_options(uri: str, storage_options: dict[str, str] | None
                         ) -> dict[str, str] | None:
    """``storage_options`` with :data:`OBJECT_STORE_TIMEOUTS` added for an object-store URI when
    the user gave no timeout of their own.

    >>> object_store_options("s3://bucket/data.lance", None)
    {'connect_timeout': '5s', 'timeout': '30s', 'client_retry_timeout': '30'}
    >>> object_store_options("/data/local.lance", None) is None
    True
    """
    given = storage_options or {}
    if not is_object_store(uri) or any(k.lower() in OBJECT_STORE_TIMEOUTS for k in given):
        return storage_options
    return {**OBJECT_STORE_TIMEOUTS, **given}


class Source:
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
            columns there, so later epochs read locally (see :mod:`lanceloader.cache`); a
            directory also shares the filter/split plan between the ranks and processes that
            use it.
        cache_size: the cache's cap in bytes; default half the directory's free disk space,
            or half the available memory.

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
    ) -> None:
        check_storage_options(storage_options)
        self.cache: DiskCache | MemoryCache | None = make_cache(cache, cache_size)
        check_optional_str("filter", filter, "'label = 3'")
        check_optional_str("split", split, "'train'")
        check_optional_str("split_key", split_key, "'id'")
        if isinstance(version, bool) or not isinstance(version, numbers.Integral | str | None):
            raise TypeError(f"version must be a version number, a tag or None (the latest); got "
                            f"the {type(version).__name__} {version!r}")
        self.storage_options = dict(storage_options) if storage_options else None
        version = int(version) if isinstance(version, numbers.Integral) else version
        ds = _open(dataset, version, self.storage_options)
        self.uri: str = ds.uri
        self.version: int = ds.version
        self.schema: pa.Schema = ds.schema
        self.columns: list[str] = _check_columns(columns, ds.schema)
        self.filter = filter
        self.splits = dict(splits) if splits else None
        self.split = split
        self.split_key = split_key
        self._pid = os.getpid()
        self._ds = ds
        self._reader: forksafe.CleanReader | None = None
        self._reader_pid = 0
        self._fragments = ds.get_fragments()
        self._fragment_ids = [f.fragment_id for f in self._fragments]
        self.identity: str = dataset_identity(ds.schema, self._fragments)
        self._fragment_starts = np.cumsum(
            [0] + [f.count_rows() for f in self._fragments], dtype=np.int64
        )
        self.plan_origin = "none"
        self._rows: np.ndarray | None = self._select_rows(ds)
        self.bytes_per_row: float = self._bytes_per_row()
        self._piece_rows = piece_rows(self.bytes_per_row)
        self._fragment_keys = [fragment_key(f.metadata, self.columns, ds.schema)
                               for f in self._fragments]
        self._piece_base = np.cumsum(
            [0] + [-(-int(n) // self._piece_rows) for n in np.diff(self._fragment_starts)],
            dtype=np.int64)
        self._piece_fill: tuple[np.ndarray, np.ndarray, bool] | None = None  # when first read
        ds.io_stats_incremental()  # construction's I/O is not the first read's (stats())
        if self.num_rows == 0:
            self._warn_empty()

    def _warn_empty(self) -> None:
        """An empty epoch is legal (a filter for a class not yet in the data), but rarely meant."""
        total = int(self._fragment_starts[-1])
        if total == 0:
            why = "the dataset has no rows"
        elif self.filter is not None and self.split is None:
            why = f"filter {self.filter!r} matches none of its {total} rows"
        else:
            why = (f"filter {self.filter!r} and split {self.split!r} keep none of its {total} "
                   "rows")
        _logger.warning("Lance dataset %r (version %d): %s, so every epoch is empty (0 batches)",
                        self.uri, self.version, why)

    # --- construction -------------------------------------------------------------------

    def _select_rows(self, ds: lance.LanceDataset) -> np.ndarray | None:
        """Lance row offsets kept by filter and split, or None when every row is kept."""
        if self.splits is None and self.split is not None:
            raise ValueError(f"split={self.split!r} needs splits=, e.g. {{'train': 0.9, 'val': 0.1}}")
        if self.splits is not None and self.split is None:
            raise ValueError(f"splits={self.splits} needs split=, one of {sorted(self.splits)}")
        if self.filter is None and self.splits is None:
            return None
        if self.split_key is not None:
            _check_columns([self.split_key], ds.schema, what="split_key")
        if not isinstance(self.cache, DiskCache):
            self.plan_origin = "scan"
            return self._scan_rows(ds)
        rows, made = self.cache.load_or_make(self.cache_key("plan"),
                                             lambda: self._scan_rows(ds))
        self.plan_origin = "scan" if made else "cache"
        return rows

    def cache_key(self, kind: str, *extra: Any) -> str:
        """The cache name of an array derived from this source's rows (the filter/split plan,
        a packing's lengths): ``kind`` plus a hash of the identity, filter, split and
        ``extra``, so every rank and process reading the same rows finds the same file."""
        key = json.dumps([self.identity, self.filter, self.splits, self.split, self.split_key,
                          *extra])
        return f"{kind}-" + hashlib.blake2b(key.encode(), digest_size=12).hexdigest()

    def _scan_rows(self, ds: lance.LanceDataset) -> np.ndarray:
        """The planning scan: the Lance row offsets of the rows the filter and split keep."""
        scan_columns = ["_rowoffset"] + ([self.split_key] if self.split_key is not None else [])
        try:
            table = ds.to_table(columns=scan_columns, filter=self.filter)
        except Exception as exc:  # Lance raises ValueError/OSError/RuntimeError for bad SQL
            redact_exception(exc, self.storage_options)
            raise ValueError(
                f"filter {self.filter!r} is not a valid Lance SQL predicate for columns "
                f"{ds.schema.names}: {clean_message(exc, self.uri, self.storage_options)}"
            ) from exc
        rows = table.column("_rowoffset").to_numpy().astype(np.int64)
        if self.splits is not None:
            assert self.split is not None
            keys = table.column(self.split_key) if self.split_key is not None else rows
            rows = rows[split_mask(keys, self.splits, self.split)]
        return rows

    def _bytes_per_row(self, sample_rows: int = 256) -> float:
        """Arrow bytes per row of the columns, estimated from the first rows of the first
        non-empty fragment (0.0 for an empty dataset): what reads are sized by (``engine.py``).
        Taken at construction, where Lance may be used, so that no process forked later needs
        to. A damaged first fragment raises :class:`ReadError` here."""
        for i, fragment in enumerate(self._fragments):
            start = int(self._fragment_starts[i])
            rows = min(sample_rows, int(self._fragment_starts[i + 1]) - start)
            if rows == 0:
                continue
            try:
                table = fragment.to_table(columns=self.columns, limit=sample_rows)
            except NOT_READ_FAILURES:
                raise
            except BaseException as exc:
                raise self.read_error(exc, offsets=np.arange(start, start + rows)) from exc
            if table.num_rows:
                return table.nbytes / table.num_rows
        return 0.0

    # --- pickling and per-process reopening ---------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_ds"] = None
        state["_fragments"] = None
        state["_reader"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    @property
    def dataset(self) -> lance.LanceDataset:
        """The pinned dataset, opened in this process (reopened after fork, spawn or unpickling)."""
        if forksafe.tainted():
            raise RuntimeError(
                f"process {os.getpid()} was forked from a process that had already used Lance; "
                "Lance would hang or crash here. Read rows with Source.read()/read_table() (they "
                "go through a clean helper process), or start this process with 'forkserver' or "
                "'spawn'"
            )
        if self._ds is None or self._pid != os.getpid():
            self._ds = lance.dataset(
                self.uri, version=self.version,
                storage_options=object_store_options(self.uri, self.storage_options),
            )
            self._fragments = self._ds.get_fragments()
            self._pid = os.getpid()
        return self._ds

    # --- reading ------------------------------------------------------------------------

    @property
    def num_rows(self) -> int:
        """Rows after filter and split: positions are ``[0, num_rows)``."""
        if self._rows is None:
            return int(self._fragment_starts[-1])
        return len(self._rows)

    def row_offsets(self, positions: np.ndarray) -> np.ndarray:
        """Lance row offsets (in the pinned version) of the given positions."""
        positions = np.asarray(positions, dtype=np.int64)
        return positions if self._rows is None else self._rows[positions]

    def read(self, positions: np.ndarray) -> pa.RecordBatch:
        """Rows at ``positions``, in that order (duplicates allowed), as one RecordBatch."""
        return to_record_batch(self.read_table(positions))

    def read_table(self, positions: np.ndarray) -> pa.Table:
        """Like :meth:`read`, as a Table whose chunks are Lance's (no copy to merge them)."""
        return self.read_table_with_io(positions)[0]

    def read_table_with_io(self, positions: np.ndarray) -> tuple[pa.Table, int, int, int]:
        """:meth:`read_table`, plus the bytes and IOPS Lance spent on it (since its last read)
        and the rows that came from the cache.

        In a process forked after Lance ran (see ``forksafe.py``), a clean helper process reads.
        Any failure raises :class:`ReadError`.
        """
        try:
            if forksafe.tainted():
                if self._reader is None or self._reader_pid != os.getpid():
                    self._reader, self._reader_pid = forksafe.CleanReader(self), os.getpid()
                return self._reader.read_table(positions)
            table, cached = self._read_local(positions)
            if self._ds is None or self._pid != os.getpid():
                return table, 0, 0, cached  # all from the cache: Lance not even opened here
            io = self._ds.io_stats_incremental()
            return table, io.read_bytes, io.read_iops, cached
        except (ReadError, *NOT_READ_FAILURES):
            raise
        except BaseException as exc:
            raise self.read_error(exc, positions) from exc

    def read_error(self, exc: BaseException, positions: np.ndarray | None = None, *,
                   offsets: np.ndarray | None = None) -> ReadError:
        """The :class:`ReadError` for ``exc``, raised while reading ``positions`` (or the Lance
        row ``offsets``)."""
        redact_exception(exc, self.storage_options)
        if offsets is None:
            offsets = self.row_offsets(positions if positions is not None else [])
        first, last = (int(offsets.min()), int(offsets.max())) if len(offsets) else (0, 0)
        ids = tuple(self._fragment_ids[i] for i in np.unique(self._fragment_of(offsets)).tolist())
        detail = clean_message(exc, self.uri, self.storage_options)
        hint = object_store_hint(detail, self.uri, self.storage_options)
        detail = f"{detail} ({type(exc).__name__})" + (f"; likely cause: {hint}" if hint else "")
        return ReadError(detail, self.uri,
                         self.version, ids, (first, last, len(offsets)),
                         self.describe_offsets(offsets), None, None)

    def _fragment_of(self, offsets: np.ndarray) -> np.ndarray:
        """The index (in the pinned version's fragment list) of the fragment of each offset."""
        return np.searchsorted(self._fragment_starts, offsets, side="right") - 1

    def describe_rows(self, positions: np.ndarray) -> str:
        """Where ``positions`` lie in the pinned version: fragments and their rows, e.g.
        ``'fragment 3 rows 0-511'``, for error messages."""
        return self.describe_offsets(self.row_offsets(positions))

    def describe_offsets(self, offsets: np.ndarray, limit: int = 4) -> str:
        """:meth:`describe_rows` of Lance row offsets."""
        offsets = np.sort(offsets)
        if not len(offsets):
            return "no rows"
        index = self._fragment_of(offsets)
        parts = []
        for i in np.unique(index)[:limit].tolist():
            local = offsets[index == i] - self._fragment_starts[i]
            rows = (f"row {local[0]}" if len(local) == 1 else
                    f"rows {local[0]}-{local[-1]}" + (f" ({len(local)} of them)"
                                                       if local[-1] - local[0] + 1 != len(local)
                                                       else ""))
            parts.append(f"fragment {self._fragment_ids[i]} {rows}")
        more = len(np.unique(index)) - limit
        return ", ".join(parts) + (f" and {more} more fragments" if more > 0 else "")

    def _read_local(self, positions: np.ndarray) -> tuple[pa.Table, int]:
        """The rows at ``positions`` and how many of them came from the cache."""
        offsets = self.row_offsets(positions)
        if self.cache is None:
            return self._read_offsets(offsets), 0
        return self._read_cached(offsets)

    def _read_offsets(self, offsets: np.ndarray) -> pa.Table:
        """The rows at Lance ``offsets`` (any order, duplicates allowed), from Lance."""
        unique, inverse = sorted_unique(offsets)
        table, order = self._read_sorted(unique)
        if not (_is_identity(order) and (inverse is None or _is_identity(inverse))):
            # one take: from the order read to the unique offsets' order, then to the request's
            back = inverse_permutation(order)
            table = table.take(pa.array(back if inverse is None else back[inverse]))
        return table.select(self.columns)

    def _fill_plan(self) -> tuple[np.ndarray, np.ndarray, bool]:
        """Per piece, its rows and the share of them the filter and split select; and whether
        all the pieces worth keeping (that share >= FILL_FRACTION) fit in the cache together."""
        if self._piece_fill is None:
            assert self.cache is not None
            sizes = np.concatenate([
                np.diff(np.minimum(np.arange(0, int(n) + self._piece_rows, self._piece_rows), n))
                for n in np.diff(self._fragment_starts)] or [np.zeros(0, np.int64)])
            if self._rows is None:
                selected = sizes
            else:
                fragment = self._fragment_of(self._rows)
                local = self._rows - self._fragment_starts[fragment]
                selected = np.bincount(self._piece_base[fragment] + local // self._piece_rows,
                                       minlength=len(sizes))
            share = selected / np.maximum(sizes, 1)
            kept = sizes[share >= FILL_FRACTION].sum() * self.bytes_per_row
            self._piece_fill = sizes, share, bool(kept <= self.cache.size)
        return self._piece_fill

    def _read_cached(self, offsets: np.ndarray) -> tuple[pa.Table, int]:
        """:meth:`_read_offsets` through the cache: rows of pieces in the cache come from it;
        a missing piece is filled whole when that is worth it (see :mod:`lanceloader.cache`),
        the other rows are read from Lance. Returns the rows in the order of ``offsets`` and
        how many came from the cache (or from a piece this read filled).

        No sort of the offsets: the request is grouped by piece (a stable sort of the piece
        numbers keeps the request's order within each piece), each piece gives its rows with
        one ``take`` (a slice when they are consecutive), and one ``take`` restores the
        request's order, when it is not already that.
        """
        assert self.cache is not None
        if not len(offsets):
            return self.schema_table().slice(0, 0), 0
        sizes, share, fits = self._fill_plan()
        size = self._piece_rows
        fragment = self._fragment_of(offsets)
        local = offsets - self._fragment_starts[fragment]  # row in its fragment
        number = local // size
        piece = self._piece_base[fragment] + number
        order = (np.arange(len(piece)) if bool(np.all(piece[1:] >= piece[:-1]))
                 else np.argsort(piece, kind="stable"))
        grouped = piece[order]
        breaks = np.flatnonzero(grouped[1:] != grouped[:-1]) + 1
        parts: list[pa.Table] = []
        placed: list[np.ndarray] = []  # per part, the request index of each of its rows
        direct: list[np.ndarray] = []
        waiting: list[np.ndarray] = []

        def name_of(i: int) -> str:
            return piece_name(self._fragment_keys[int(fragment[i])], size, int(number[i]))

        def load(i: int) -> Any:
            frag, start = int(fragment[i]), int(number[i]) * size

            def piece_table() -> pa.Table:
                _ = self.dataset  # opened in this process (a worker opens it at its first miss)
                return self._fragments[frag].to_table(columns=self.columns, offset=start,
                                                      limit=size)
            return piece_table

        def take(table: pa.Table, request: np.ndarray) -> None:
            rows = local[request] - int(number[request[0]]) * size  # rows in the piece
            first = int(rows[0])
            consecutive = int(rows[-1]) - first + 1 == len(rows) and bool(
                np.all(np.diff(rows) == 1))
            parts.append(table.slice(first, len(rows)) if consecutive
                         else table.take(pa.array(rows)))
            placed.append(request)

        for group in np.split(order, breaks):
            i = int(group[0])
            table = self.cache.get(name_of(i))
            if table is None:
                p = int(piece[i])
                if share[p] < FILL_FRACTION or not (
                        fits or len(np.unique(offsets[group])) >= FILL_FRACTION * sizes[p]):
                    direct.append(group)
                    continue
                table = self.cache.fill(name_of(i), load(i), block=False)
                if table is None:  # another worker is filling it: first do the rest
                    waiting.append(group)
                    continue
            take(table, group)
        for group in waiting:
            table = self.cache.fill(name_of(int(group[0])), load(int(group[0])), block=True)
            assert table is not None
            take(table, group)
        cached = sum(len(p) for p in placed)
        if direct:
            request = np.concatenate(direct)
            parts.append(self._read_offsets(offsets[request]))
            placed.append(request)
        table = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
        where = np.concatenate(placed) if len(placed) > 1 else placed[0]
        if not _is_identity(where):
            table = table.take(pa.array(inverse_permutation(where)))
        return table.select(self.columns), cached

    def _read_sorted(self, offsets: np.ndarray) -> tuple[pa.Table, np.ndarray]:
        """Read sorted unique offsets from Lance; returns the rows and, per row, its index in
        ``offsets``."""
        ds = self.dataset
        if is_object_store(self.uri):  # one take: Lance sends all its requests at once
            return ds.take(offsets, columns=self.columns), np.arange(len(offsets))
        if not len(offsets):
            return self.schema_table().slice(0, 0), np.zeros(0, dtype=np.int64)
        fragment_of = self._fragment_of(offsets)
        breaks = np.flatnonzero((np.diff(offsets) != 1) | (np.diff(fragment_of) != 0)) + 1
        starts = np.concatenate(([0], breaks))
        stops = np.concatenate((breaks, [len(offsets)]))
        # Runs of >= MIN_RANGE_ROWS are range reads, and so are a few short ones (a run cut by a
        # fragment's end); many short runs (a block shuffle's blocks) are one take.
        long = stops - starts >= MIN_RANGE_ROWS
        if np.count_nonzero(~long) <= FEW_SHORT_RUNS:
            long[:] = True
        pieces: list[pa.Table] = []
        order: list[np.ndarray] = []
        for lo, hi in zip(starts[long].tolist(), stops[long].tolist(), strict=True):
            frag = int(fragment_of[lo])
            local = int(offsets[lo] - self._fragment_starts[frag])
            pieces.append(
                self._fragments[frag].to_table(columns=self.columns, offset=local, limit=hi - lo)
            )
            order.append(np.arange(lo, hi))
        if not long.all():  # the rows of short runs: one take (no per-run Python)
            idx = np.flatnonzero(np.repeat(~long, stops - starts))
            pieces.append(ds.take(offsets[idx], columns=self.columns))
            order.append(idx)
        if not pieces:
            return self.schema_table().slice(0, 0), np.zeros(0, dtype=np.int64)
        return pa.concat_tables(pieces), np.concatenate(order)

    def schema_table(self) -> pa.Table:
        """An empty table with the projected schema."""
        return pa.table({c: pa.array([], type=self.schema.field(c).type) for c in self.columns})

    def __repr__(self) -> str:
        return (
            f"Source({self.uri!r}, version={self.version}, rows={self.num_rows}, "
            f"columns={self.columns}, filter={self.filter!r}, split={self.split!r})"
        )


def dataset_identity(schema: pa.Schema, fragments: list[Any]) -> str:
    """A short hash that names the data of one dataset version wherever it is stored.

    Made of each fragment's id, row count, data file names and deletion file, and the schema.
    Lance gives every file it writes a unique name and never rewrites one, so the identity
    survives copying or moving the dataset (another path, another bucket) and differs for a
    dataset re-created or overwritten at the same URI, even with the same version number and row
    count. It costs one pass over the manifest's fragment list, no I/O.
    """
    parts: list[Any] = [schema.to_string(show_schema_metadata=False)]
    for fragment in fragments:
        meta = fragment.metadata
        deletion = meta.deletion_file
        parts.append([meta.id, meta.physical_rows, [f.path for f in meta.files],
                      None if deletion is None else [deletion.id, deletion.num_deleted_rows]])
    blob = json.dumps(parts, separators=(",", ":"), default=str).encode()
    return hashlib.blake2b(blob, digest_size=8).hexdigest()


def _open(
    dataset: str | os.PathLike[str] | lance.LanceDataset,
    version: int | str | None,
    storage_options: dict[str, str] | None,
) -> lance.LanceDataset:
    if forksafe.tainted():
        raise RuntimeError(
            f"process {os.getpid()} was forked from a process that had already used Lance, "
            "where opening a dataset would hang or crash; build the Source/Loader before "
            "forking (it pickles as plain parameters), or start this process with "
            "'forkserver' or 'spawn'"
        )
    forksafe.note_lance_used()
    if isinstance(dataset, lance.LanceDataset):
        if version is None or version == dataset.version:
            return dataset
        dataset = dataset.uri
    if not isinstance(dataset, str | os.PathLike):
        raise TypeError(not_a_dataset(dataset))
    uri = os.fspath(dataset)
    try:
        ds = lance.dataset(uri, storage_options=object_store_options(uri, storage_options))
    except Exception as exc:
        redact_exception(exc, storage_options)
        raise FileNotFoundError(not_a_dataset(uri, exc, storage_options)) from exc
    if version is None:
        return ds
    try:
        return ds.checkout_version(version)
    except Exception as exc:
        known = [v["version"] for v in ds.versions()]
        raise ValueError(
            f"dataset {uri!r} has no version {version!r}; available versions: {known} "
            f"(and tags {sorted(ds.tags.list())})"
        ) from exc


_FORMATS = {".parquet": "Parquet", ".pq": "Parquet", ".csv": "CSV", ".tsv": "CSV",
            ".json": "JSON", ".jsonl": "JSON", ".ndjson": "JSON", ".arrow": "Arrow IPC",
            ".feather": "Arrow IPC", ".ipc": "Arrow IPC"}
_READERS = {"Parquet": "pyarrow.dataset.dataset({path!r})",
            "CSV": "pyarrow.dataset.dataset({path!r}, format='csv')",
            "JSON": "pyarrow.dataset.dataset({path!r}, format='json')",
            "Arrow IPC": "pyarrow.dataset.dataset({path!r}, format='ipc')"}


def _convert_advice(fmt: str, path: str, target: str) -> str:
    """How to turn a ``fmt`` file or directory at ``path`` into a Lance dataset at ``target``."""
    if fmt in ("Parquet", "CSV"):
        return (f"lanceloader.convert({path!r}, {target!r}) (or on the command line: "
                f"lanceloader convert {path} {target})")
    return f"lance.write_dataset({_READERS[fmt].format(path=path)}, {target!r})"


def not_a_dataset(dataset: object, exc: BaseException | None = None,
                  storage_options: dict[str, str] | None = None) -> str:
    """Why ``dataset`` (a value, or a URI Lance could not open with ``exc``) is not a Lance
    dataset, and how to make one from it.

    >>> print(not_a_dataset({"x": [1, 2]}))
    dataset must be a URI, a path or a lance.LanceDataset; got a dict. Write it to Lance once with lanceloader.convert(pyarrow.table(data), 'data.lance') and pass 'data.lance'
    """
    if not isinstance(dataset, str):
        kind = type(dataset)
        name = f"{kind.__module__.split('.')[0]}.{kind.__name__}"
        data = {"pandas.DataFrame": "df", "polars.DataFrame": "df.to_arrow()",
                "pyarrow.Table": "table", "pyarrow.RecordBatch": "batch",
                "builtins.dict": "pyarrow.table(data)"}.get(name, "data")
        what = "a dict" if name == "builtins.dict" else f"a {name}"
        return (f"dataset must be a URI, a path or a lance.LanceDataset; got {what}. Write it to "
                f"Lance once with lanceloader.convert({data}, 'data.lance') and pass "
                "'data.lance'")
    path = Path(dataset)
    local = not is_object_store(dataset)
    fmt = _FORMATS.get(path.suffix.lower()) if local and path.is_file() else None
    if local and path.is_dir() and not (path / "_versions").is_dir():
        found = {_FORMATS[p.suffix.lower()] for p in path.iterdir()
                 if p.suffix.lower() in _FORMATS}
        fmt = sorted(found)[0] if len(found) == 1 else None
        if fmt is not None:
            target = dataset.rstrip("/") + ".lance"
            return (f"{dataset!r} is a directory of {fmt} files, not a Lance dataset (which has "
                    f"a _versions/ directory). Convert it once: {_convert_advice(fmt, dataset, target)}"
                    f", then pass {target!r}")
    if fmt is not None:
        target = str(path.with_suffix(".lance"))
        return (f"{dataset!r} is a {fmt} file, not a Lance dataset (a directory with "
                f"_versions/). Convert it once: {_convert_advice(fmt, dataset, target)}, then "
                f"pass {target!r}")
    if local and path.is_file():
        return (f"{dataset!r} is a file; a Lance dataset is a directory (with _versions/). "
                "Pass the dataset's directory")
    detail = clean_message(exc, dataset, storage_options) if exc is not None else ""
    hint = object_store_hint(detail, dataset, storage_options)
    if hint:
        return f"cannot open the Lance dataset at {dataset!r}: {hint} ({detail})"
    detail = f" ({detail})" if detail else ""
    return (f"no Lance dataset at {dataset!r}{detail}; check the path (and storage_options for "
            f"object stores), or write one with lance.write_dataset(table, {dataset!r})")


def _check_columns(columns: list[str] | None, schema: pa.Schema, what: str = "columns") -> list[str]:
    if columns is None:
        return list(schema.names)
    if isinstance(columns, str):
        raise TypeError(f"{what} must be a list of names, got the string {columns!r}; use [{columns!r}]")
    columns = list(columns)
    missing = [c for c in columns if c not in schema.names]
    if missing:
        raise ValueError(
            f"unknown {what} {missing} in the dataset; available columns: {schema.names}"
        )
    if not columns:
        raise ValueError(f"{what} is empty; name at least one of {schema.names}, or pass None for all")
    return columns


def sorted_unique(positions: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """``positions`` sorted and deduplicated, and where each request lies in them (``None``
    when they already were: strictly increasing, the common case, costs no sort).

    >>> sorted_unique(np.array([1, 2, 5]))[1] is None, sorted_unique(np.array([5, 1, 5]))[1]
    (True, array([1, 0, 1]))
    """
    if len(positions) < 2 or bool(np.all(positions[1:] > positions[:-1])):
        return positions, None
    return np.unique(positions, return_inverse=True)


def inverse_permutation(placed: np.ndarray) -> np.ndarray:
    """The inverse of the permutation ``placed`` (row ``i`` goes to place ``placed[i]``): taking
    it from the rows puts each in its place."""
    where = np.empty_like(placed)
    where[placed] = np.arange(len(placed))
    return where


def _is_identity(order: np.ndarray) -> bool:
    return bool(len(order) == 0 or (order[0] == 0 and np.all(np.diff(order) == 1)))


def to_record_batch(table: pa.Table) -> pa.RecordBatch:
    """A table as one RecordBatch; copies only when it has several chunks."""
    batches = table.to_batches()
    if len(batches) == 1:
        return batches[0]
    if not batches:
        return pa.RecordBatch.from_pylist([], schema=table.schema)
    return table.combine_chunks().to_batches()[0]


@dataclass(frozen=True)
class Pieces:
    """A read's rows as runs of a few record batches, in order, not yet copied into one table:
    what a mix with long runs of one source reads (:func:`lanceloader.mix.mixed_rows`).

    ``runs`` are ``(batch, start, length)``: rows ``[start, start + length)`` of
    ``batches[batch]``. The worker converts each of ``batches`` once and hands out every batch
    of the task that lies within one run as a slice of that conversion (no copy), as it does
    with a single source's chunks; :meth:`table` is the same rows as one table (slices, no copy)
    for the rest.

    >>> t = pa.record_batch({"x": [0, 1, 2, 3]})
    >>> Pieces([t], [(0, 2, 2), (0, 0, 2)]).table()["x"].to_pylist()
    [2, 3, 0, 1]
    """

    batches: list[pa.RecordBatch]
    runs: list[tuple[int, int, int]]

    @property
    def num_rows(self) -> int:
        return sum(n for _, _, n in self.runs)

    @property
    def bytes_per_row(self) -> float:
        """Arrow bytes per row of the record batches (what a run's rows average)."""
        return sum(b.nbytes for b in self.batches) / max(1, sum(len(b) for b in self.batches))

    def table(self) -> pa.Table:
        return pa.Table.from_batches([self.batches[b].slice(s, n) for b, s, n in self.runs],
                                     schema=self.batches[0].schema)


def as_table(rows: pa.Table | Pieces) -> pa.Table:
    """The rows of a source's read as one table (a :class:`Pieces` joined, no copy)."""
    return rows.table() if isinstance(rows, Pieces) else rows
