"""Parquet and CSV files read for :func:`lanceloader.convert`: streamed in order, every file's
schema checked against the first's, and every error naming the file (and where in it).

>>> import tempfile
>>> from pathlib import Path
>>> path = Path(tempfile.mkdtemp()) / "t.csv"
>>> _ = path.write_text("a,b\\n1,2\\n")
>>> schema, batches, rows = from_files([path], 1024)
>>> schema.names, next(batches).num_rows
(['a', 'b'], 1)
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.csv
import pyarrow.parquet as pq


def from_files(
    files: list[Path], batch_rows: int
) -> tuple[pa.Schema, Iterator[pa.RecordBatch], int | None]:
    """Parquet or CSV files, streamed in order; every file's schema must be the first's. An
    error names the file (and where in it)."""
    kinds = {"parquet" if f.suffix.lower() == ".parquet" else "csv" for f in files}
    if len(kinds) > 1:
        raise ValueError(
            f"mixes Parquet and CSV files ({files[0]}, ...): convert each kind separately"
        )
    if kinds == {"parquet"}:
        return _from_parquet(files, batch_rows)
    return _from_csv(files)


def _from_parquet(
    files: list[Path], batch_rows: int
) -> tuple[pa.Schema, Iterator[pa.RecordBatch], int | None]:
    first: pa.Schema | None = None
    total = 0
    for path in files:
        try:
            metadata = pq.read_metadata(path)
            schema = pq.read_schema(path)
        except Exception as exc:
            raise ValueError(
                f"{os.fspath(path)!r} is not a readable Parquet file "
                f"({_printable(exc)}); replace or remove it"
            ) from exc
        if first is None:
            first = schema
        elif not schema.equals(first, check_metadata=False):
            raise ValueError(_schema_mismatch(files[0], first, path, schema))
        total += metadata.num_rows

    def stream() -> Iterator[pa.RecordBatch]:
        for path in files:
            rows = 0
            try:
                for batch in pq.ParquetFile(path).iter_batches(batch_size=batch_rows):
                    rows += batch.num_rows
                    yield batch
            except (pa.ArrowException, OSError) as exc:
                raise ValueError(
                    f"cannot read {os.fspath(path)!r} after its first {rows:,} rows "
                    f"({_printable(exc)}); replace or remove the file"
                ) from exc

    assert first is not None  # files is never empty
    return first, stream(), total


def _from_csv(files: list[Path]) -> tuple[pa.Schema, Iterator[pa.RecordBatch], int | None]:
    def open_csv(path: Path) -> pa.RecordBatchReader:
        parse = pyarrow.csv.ParseOptions(delimiter="\t" if path.suffix.lower() == ".tsv" else ",")
        try:
            return pyarrow.csv.open_csv(
                path, parse_options=parse, read_options=pyarrow.csv.ReadOptions(block_size=1 << 22)
            )
        except (pa.ArrowException, OSError) as exc:
            raise ValueError(csv_problem(path, 0, exc, None)) from exc

    readers = [(files[0], open_csv(files[0]))]
    first = readers[0][1].schema
    for other in files[1:]:
        reader = open_csv(other)
        if not reader.schema.equals(first):
            raise ValueError(_schema_mismatch(files[0], first, other, reader.schema))
        readers.append((other, reader))

    def stream() -> Iterator[pa.RecordBatch]:
        for path, reader in readers:
            rows = 0
            try:
                for batch in reader:
                    rows += batch.num_rows
                    yield batch
            except (pa.ArrowException, OSError) as exc:
                raise ValueError(csv_problem(path, rows, exc, first)) from exc

    return first, stream(), None


BLOB_METADATA = {b"lance-encoding:blob": b"true"}


def with_blob_columns(schema: pa.Schema, names: list[str] | tuple[str, ...]) -> pa.Schema:
    """``schema`` with the binary columns ``names`` marked as Lance blob columns
    (``large_binary`` with ``lance-encoding:blob``; Lance writes them as blob v2 columns, each
    value out of line, read by ranges). A name that is not a column, or a column that is not
    binary, raises ``ValueError`` naming it and the fix.

    >>> with_blob_columns(pa.schema([("video", pa.binary()), ("label", pa.int64())]),
    ...                   ["video"]).field("video").metadata
    {b'lance-encoding:blob': b'true'}
    >>> with_blob_columns(pa.schema([("label", pa.int64())]), ["label"])
    Traceback (most recent call last):
    ...
    ValueError: blob_columns names 'label', which is int64: only binary columns (the encoded bytes of images, videos, audio) can be blob columns; drop it from blob_columns
    """
    if isinstance(names, str) or not all(isinstance(n, str) for n in names):
        raise TypeError(
            f"blob_columns must be a list of column names, e.g. ['video']; got {names!r}"
        )
    for name in names:
        if name not in schema.names:
            raise ValueError(
                f"blob_columns names {name!r}, which the source does not have; "
                f"its columns are {schema.names}"
            )
        typ = schema.field(name).type
        if not (pa.types.is_binary(typ) or pa.types.is_large_binary(typ)):
            raise ValueError(
                f"blob_columns names {name!r}, which is {typ}: only binary "
                "columns (the encoded bytes of images, videos, audio) can be blob "
                f"columns; drop it from blob_columns"
            )
    fields = [
        pa.field(f.name, pa.large_binary(), f.nullable, {**(f.metadata or {}), **BLOB_METADATA})
        if f.name in names
        else f
        for f in schema
    ]
    return pa.schema(fields, metadata=schema.metadata)


def csv_problem(path: Path, rows: int, exc: BaseException, schema: pa.Schema | None) -> str:
    """What went wrong reading the CSV file ``path`` after ``rows`` good rows, and the fix.

    >>> print(csv_problem(Path("c.csv"), 1000, ValueError(
    ...     "In CSV column #1: CSV conversion error to int64: invalid value 'x'"),
    ...     pa.schema([("a", pa.string()), ("b", pa.int64())])))
    cannot read 'c.csv' as CSV in the rows after its first 1,000 (In CSV column #1: CSV conversion error to int64: invalid value 'x'): column 'b' was read as int64 from the file's first 4 MiB; give convert a reader that sets its type, e.g. pyarrow.csv.open_csv('c.csv', convert_options=pyarrow.csv.ConvertOptions(column_types={'b': pyarrow.string()}))
    """
    detail = _printable(exc)
    where = f"in the rows after its first {rows:,}" if rows else "in its first rows"
    text = f"cannot read {os.fspath(path)!r} as CSV {where} ({detail})"
    column = re.search(r"CSV column #(\d+)", detail)
    if column and schema is not None and int(column.group(1)) < len(schema):
        field_ = schema.field(int(column.group(1)))
        return (
            f"{text}: column {field_.name!r} was read as {field_.type} from the file's "
            f"first 4 MiB; give convert a reader that sets its type, e.g. "
            f"pyarrow.csv.open_csv({os.fspath(path)!r}, convert_options=pyarrow.csv."
            f"ConvertOptions(column_types={{{field_.name!r}: pyarrow.string()}}))"
        )
    if "Expected" in detail and "columns" in detail:
        return f"{text}: fix or remove that row (every row needs the header's columns)"
    return f"{text}: check that it is a CSV file, and fix or remove it"


def _printable(exc: BaseException, limit: int = 300) -> str:
    """``exc``'s message without control characters or binary bytes, at most ``limit``
    characters (a reader's error may quote the bytes of a line)."""
    text = "".join(c if c.isprintable() else "?" for c in str(exc).strip())
    return text if len(text) <= limit else text[:limit] + "..."


def _schema_mismatch(a: Path, schema_a: pa.Schema, b: Path, schema_b: pa.Schema) -> str:
    """Which columns of ``a`` and ``b`` differ: type, presence, nullability, or order.

    >>> print(_schema_mismatch(Path("a.parquet"), pa.schema([("x", pa.int64()), ("y", pa.int8())]),
    ...                        Path("b.parquet"), pa.schema([pa.field("y", pa.int8(), False),
    ...                                                      ("x", pa.int64())])))
    the files disagree on their schema: 'a.parquet' and 'b.parquet' (y: nullable vs not null; column order: x, y vs y, x); make them agree (or convert them separately)
    """
    fields_a = {f.name: f for f in schema_a}
    fields_b = {f.name: f for f in schema_b}
    differ = []
    for name in sorted(fields_a.keys() | fields_b.keys()):
        fa, fb = fields_a.get(name), fields_b.get(name)
        if fa is None or fb is None or fa.type != fb.type:
            differ.append(
                f"{name}: {fa.type if fa else 'missing'} vs {fb.type if fb else 'missing'}"
            )
        elif fa.nullable != fb.nullable:
            null = {True: "nullable", False: "not null"}
            differ.append(f"{name}: {null[fa.nullable]} vs {null[fb.nullable]}")
    if schema_a.names != schema_b.names and set(schema_a.names) == set(schema_b.names):
        differ.append(f"column order: {', '.join(schema_a.names)} vs {', '.join(schema_b.names)}")
    if not differ:  # field metadata, or nested fields' names or nullability
        differ.append(
            f"{schema_a.to_string(show_schema_metadata=False)!r} vs "
            f"{schema_b.to_string(show_schema_metadata=False)!r}"
        )
    return (
        f"the files disagree on their schema: {os.fspath(a)!r} and {os.fspath(b)!r} "
        f"({'; '.join(differ[:6])}); make them agree (or convert them separately)"
    )
