"""Opening a pinned Lance dataset, naming it, and the errors of reading it.

Every failure of a read is one :class:`ReadError` (an ``OSError``) naming the URI, the pinned
version, the fragments and rows read and, from a worker, the batches; Lance's messages are
quoted without its Rust source paths and with credentials masked. Object-store URIs get request
timeouts by default (:data:`OBJECT_STORE_TIMEOUTS`). A local dataset is named by its absolute
path (:func:`~lanceloader.state.format.local_uri`), so a relative and an absolute path to it are one dataset.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

import lance
import pyarrow as pa

from lanceloader.lifecycle import forksafe
from lanceloader.lifecycle.lifetime import picklable_error
from lanceloader.rows.store import is_object_store, object_store_hint, object_store_options

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

    def __init__(
        self,
        detail: str,
        uri: str = "",
        version: int = 0,
        fragments: tuple[int, ...] = (),
        rows: tuple[int, int, int] = (0, 0, 0),
        where: str = "",
        batches: range | None = None,
        epoch: int | None = None,
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
            batches = (
                f" for batch {b.start}" if len(b) == 1 else f" for batches {b.start}-{b[-1]}"
            ) + f" of epoch {self.epoch}"
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
        # Its own type (ClipError, CacheError), so `except ll.ClipError` catches it from a
        # process worker as from a thread.
        cause = self.__cause__
        return (
            type(self),
            (self.detail,),
            {**self.__dict__, "__cause__": None if cause is None else picklable_error(cause)},
        )


_RUST_SOURCE = re.compile(r",?\s*(?:[\w.~-]*/)+[\w.-]+\.rs:\d+(?::\d+)?")


def strip_rust_paths(text: str) -> str:
    """``text`` without the Rust source locations Lance appends to its errors.

    >>> strip_rust_paths("no field 'y', /home/ci/lance/rust/src/scanner.rs:839:33)")
    "no field 'y')"
    """
    return _RUST_SOURCE.sub("", text)


def clean_message(
    exc: BaseException, uri: str | None = None, storage_options: dict[str, str] | None = None
) -> str:
    """``exc``'s message without Lance's Rust source paths (``.../commit.rs:653:31``), with
    the leading ``/`` that Lance drops from local paths put back, and with the credentials of
    ``storage_options`` masked (:func:`redact`).

    >>> clean_message(OSError("Not found: tmp/x.lance/_versions, /home/runner/work/lance/"
    ...                       "rust/lance-io/src/local.rs:118:31"), "/tmp/x.lance")
    'Not found: /tmp/x.lance/_versions'
    """
    text = strip_rust_paths(str(exc)).strip()
    if uri and not is_object_store(uri) and not uri.startswith("file://"):
        # Lance shows a local path absolute and normalised, less its leading "/": the user's
        # path as given goes back in its place (the longer spelling first).
        lance_forms = {os.path.abspath(os.path.expanduser(uri)).lstrip("/"), uri.lstrip("/")}
        for form in sorted(lance_forms - {"", uri}, key=len, reverse=True):
            text = re.sub(r"(?<![\w/.~-])" + re.escape(form), lambda _: uri, text)
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


def redact_exception(exc: BaseException, storage_options: dict[str, str] | None) -> BaseException:
    """``exc`` with its message's credentials masked (:func:`redact`), in place: it stays the
    ``__cause__`` of the error raised for it, and tracebacks print it."""
    if storage_options:
        with contextlib.suppress(AttributeError, TypeError):  # a type with fixed arguments
            exc.args = tuple(
                redact(a, storage_options) if isinstance(a, str) else a for a in exc.args
            )
    return exc


def dataset_identity(schema: pa.Schema, fragments: list[Any]) -> str:
    """A short hash that names the data of one dataset version wherever it is stored.

    Made of each fragment's id, row count, data file names and deletion file, and the schema.
    Lance gives every file it writes a unique name and never rewrites one, so the identity
    survives copying or moving the dataset (another path, another bucket) and differs for a
    dataset re-created or overwritten at the same URI, even with the same version number and row
    count. It costs one pass over the manifest's fragment list, no I/O.
    """
    return names_identity(schema, fragment_names(fragments))


def names_identity(schema: pa.Schema, names: list[tuple[Any, ...]]) -> str:
    """:func:`dataset_identity` of the fragments' :func:`fragment_names` (made once, also kept
    by a followed table to compare the next version with)."""
    parts: list[Any] = [schema.to_string(show_schema_metadata=False), *names]
    blob = json.dumps(parts, separators=(",", ":"), default=str).encode()
    return hashlib.blake2b(blob, digest_size=8).hexdigest()


def fragment_names(fragments: list[Any]) -> list[tuple[Any, ...]]:
    """What names each fragment's rows, from the manifest alone: its id, physical rows, data
    file names and deletion file (id and rows deleted); of LanceFragments or their metadata
    (read once by the caller)."""
    names = []
    for fragment in fragments:
        meta = getattr(fragment, "metadata", fragment)
        deletion = meta.deletion_file
        deleted = None if deletion is None else (deletion.id, deletion.num_deleted_rows)
        names.append((meta.id, meta.physical_rows, tuple(file_paths(meta)), deleted))
    return names


def file_paths(metadata: Any) -> list[str]:
    """The data file names of one fragment's metadata. Lance's ``DataFile.path`` builds a class
    per call (its shim for the old ``path()`` method: 55 us, 110 ms over 2,000 fragments); the
    name it wraps is read directly where this Lance has it (the same string)."""
    return [getattr(f, "_path", None) or f.path for f in metadata.files]


def open_dataset(
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


_FORMATS = {
    ".parquet": "Parquet",
    ".pq": "Parquet",
    ".csv": "CSV",
    ".tsv": "CSV",
    ".json": "JSON",
    ".jsonl": "JSON",
    ".ndjson": "JSON",
    ".arrow": "Arrow IPC",
    ".feather": "Arrow IPC",
    ".ipc": "Arrow IPC",
}
_READERS = {
    "Parquet": "pyarrow.dataset.dataset({path!r})",
    "CSV": "pyarrow.dataset.dataset({path!r}, format='csv')",
    "JSON": "pyarrow.dataset.dataset({path!r}, format='json')",
    "Arrow IPC": "pyarrow.dataset.dataset({path!r}, format='ipc')",
}


def _convert_advice(fmt: str, path: str, target: str) -> str:
    """How to turn a ``fmt`` file or directory at ``path`` into a Lance dataset at ``target``."""
    if fmt in ("Parquet", "CSV"):
        return (
            f"lanceloader.convert({path!r}, {target!r}) (or on the command line: "
            f"lanceloader convert {path} {target})"
        )
    return f"lance.write_dataset({_READERS[fmt].format(path=path)}, {target!r})"


def not_a_dataset(
    dataset: object, exc: BaseException | None = None, storage_options: dict[str, str] | None = None
) -> str:
    """Why ``dataset`` (a value, or a URI Lance could not open with ``exc``) is not a Lance
    dataset, and how to make one from it.

    >>> print(not_a_dataset({"x": [1, 2]}))
    dataset must be a URI, a path or a lance.LanceDataset; got a dict. Write it to Lance once with lanceloader.convert(pyarrow.table(data), 'data.lance') and pass 'data.lance'
    """
    if not isinstance(dataset, str):
        kind = type(dataset)
        name = f"{kind.__module__.split('.')[0]}.{kind.__name__}"
        data = {
            "pandas.DataFrame": "df",
            "polars.DataFrame": "df.to_arrow()",
            "pyarrow.Table": "table",
            "pyarrow.RecordBatch": "batch",
            "builtins.dict": "pyarrow.table(data)",
        }.get(name, "data")
        what = "a dict" if name == "builtins.dict" else f"a {name}"
        return (
            f"dataset must be a URI, a path or a lance.LanceDataset; got {what}. Write it to "
            f"Lance once with lanceloader.convert({data}, 'data.lance') and pass "
            "'data.lance'"
        )
    path = Path(dataset)
    local = not is_object_store(dataset)
    fmt = _FORMATS.get(path.suffix.lower()) if local and path.is_file() else None
    if local and path.is_dir() and not (path / "_versions").is_dir():
        found = {_FORMATS[p.suffix.lower()] for p in path.iterdir() if p.suffix.lower() in _FORMATS}
        fmt = sorted(found)[0] if len(found) == 1 else None
        if fmt is not None:
            target = dataset.rstrip("/") + ".lance"
            return (
                f"{dataset!r} is a directory of {fmt} files, not a Lance dataset (which has "
                f"a _versions/ directory). Convert it once: {_convert_advice(fmt, dataset, target)}"
                f", then pass {target!r}"
            )
    if fmt is not None:
        target = str(path.with_suffix(".lance"))
        return (
            f"{dataset!r} is a {fmt} file, not a Lance dataset (a directory with "
            f"_versions/). Convert it once: {_convert_advice(fmt, dataset, target)}, then "
            f"pass {target!r}"
        )
    if local and path.is_file():
        return (
            f"{dataset!r} is a file; a Lance dataset is a directory (with _versions/). "
            "Pass the dataset's directory"
        )
    detail = clean_message(exc, dataset, storage_options) if exc is not None else ""
    hint = object_store_hint(detail, dataset, storage_options)
    if hint:
        return f"cannot open the Lance dataset at {dataset!r}: {hint} ({detail})"
    detail = f" ({detail})" if detail else ""
    return (
        f"no Lance dataset at {dataset!r}{detail}; check the path (and storage_options for "
        f"object stores), or write one with lance.write_dataset(table, {dataset!r})"
    )


def check_columns(columns: list[str] | None, schema: pa.Schema, what: str = "columns") -> list[str]:
    if columns is None:
        return list(schema.names)
    if isinstance(columns, str):
        raise TypeError(
            f"{what} must be a list of names, got the string {columns!r}; use [{columns!r}]"
        )
    columns = list(columns)
    twice = sorted({c for c in columns if columns.count(c) > 1})
    if twice:
        raise ValueError(
            f"{what} names {twice} more than once ({columns}); a batch has one "
            f"column of each name: list each once"
        )
    missing = [c for c in columns if c not in schema.names]
    if missing:
        raise ValueError(
            f"unknown {what} {missing} in the dataset; available columns: {schema.names}"
        )
    if not columns:
        raise ValueError(
            f"{what} is empty; name at least one of {schema.names}, or pass None for all"
        )
    return columns
