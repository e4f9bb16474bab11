"""``lanceloader inspect``: versions, schema, rows, fragments, bytes per column, and what each
column becomes as a NumPy array. Given images, Parquet or CSV instead of a Lance dataset, it says
the ``lanceloader convert`` command that makes one.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from typing import Any

import numpy as np
import pyarrow as pa

from lanceloader.batch.checks import check_schema
from lanceloader.batch.output import LENGTHS_SUFFIX, to_output
from lanceloader.cli.errors import input_errors, one_line, refuse_convertible
from lanceloader.rows.lance.blobs import is_blob_field, payload_sizes
from lanceloader.rows.lance.source import Source
from lanceloader.units import format_bytes

INSPECT_SAMPLE_ROWS = 16
INSPECT_VERSIONS_SHOWN = 10


def aligned(rows: list[tuple[str, ...]], indent: str = "  ") -> list[str]:
    """Rows of cells as lines, each column left-aligned to its widest cell.

    >>> aligned([("a", "bb", "c"), ("ddd", "e", "f")])
    ['  a    bb  c', '  ddd  e   f']
    """
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    cells = [[*(c.ljust(w) for c, w in zip(r, widths, strict=False)), r[-1]] for r in rows]
    return [(indent + "  ".join(r)).rstrip() for r in cells]


def column_bytes(ds: Any, table_sample: pa.Table) -> tuple[dict[str, float], str]:
    """Bytes on disk per top-level column, and where the numbers come from.

    Lance's data statistics (``ds.stats.data_stats()``, per field id, summed over a column's
    nested fields) when this Lance has them; otherwise an estimate: the Arrow bytes of a sample
    of rows, scaled to all rows.
    """
    try:
        per_field = {f.id: f.bytes_on_disk for f in ds.stats.data_stats().fields}

        def total(field: Any) -> int:
            return per_field.get(field.id(), 0) + sum(total(c) for c in field.children())

        sizes = {f.name(): float(total(f)) for f in ds.lance_schema.fields()}
        return sizes, "on disk, from Lance's data statistics"
    except Exception:  # an older Lance: estimate from the sample
        scale = ds.count_rows() / max(1, table_sample.num_rows)
        sizes = {c: table_sample.column(c).nbytes * scale for c in table_sample.column_names}
        return sizes, f"estimated from the Arrow size of {table_sample.num_rows} rows"


def describe_numpy(value: Any, padded: bool = False) -> str:
    """What one converted column is: ``float32 [n, 64]``, ``list of str``, a struct's fields.
    ``padded``: the second dimension is the longest row of each batch.

    >>> describe_numpy(np.zeros((16, 64), np.float32)), describe_numpy(["a", "b"])
    ('float32 [n, 64]', 'list of str')
    >>> describe_numpy(np.zeros((16, 5)), padded=True)
    'float64 [n, longest]'
    """
    if isinstance(value, np.ndarray):
        dims = ["n", *map(str, value.shape[1:])]
        if padded and len(dims) > 1:
            dims[1] = "longest"
        return f"{value.dtype} [{', '.join(dims)}]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {describe_numpy(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        kinds = sorted({type(v).__name__ for v in value}) or ["nothing"]
        return f"list of {'/'.join(kinds)}"
    return type(value).__name__


def is_tensor(value: Any) -> bool:
    """Whether a converted column is numbers only (arrays, or a struct of arrays)."""
    if isinstance(value, dict):
        return all(is_tensor(v) for v in value.values())
    return isinstance(value, np.ndarray) and value.dtype.kind in "biuf"


def describe_conversion(name: str, sample: pa.Table) -> str:
    """How column ``name`` of ``sample`` converts with ``to_output(..., "numpy")``, or why not;
    notes a column that NumPy takes but torch does not (``uint64``).

    >>> describe_conversion("u", pa.table({"u": pa.array([1, 2], pa.uint64())}))
    "yes: uint64 [n]; torch: column 'u' is uint64, which torch tensors barely support (no +, no indexing); cast it: casts={'u': 'int64'} (values must be below 2**63)"
    """
    try:
        out = to_output(sample.select([name]), "numpy")
    except Exception as exc:
        return f"no: {one_line(exc)}"
    value, padded = out[name], name + LENGTHS_SUFFIX in out
    text = f"{'yes' if is_tensor(value) else 'no'}: {describe_numpy(value, padded)}"
    if padded:
        text += f" padded, lengths in {name}{LENGTHS_SUFFIX}"
    try:
        check_schema(sample.select([name]).schema, "torch")  # checks types; never imports torch
    except Exception as exc:
        text += f"; torch: {one_line(exc)}"
    return text


def deleted_note(ds: Any) -> str:
    """`` (N deleted)`` when rows of this version were deleted, else empty."""
    try:
        deleted = int(ds.stats.dataset_stats()["num_deleted_rows"])
    except Exception:  # an older Lance: say nothing
        return ""
    return f" ({deleted:,} deleted)" if deleted else ""


def version_lines(ds: Any, pinned: int, latest: int) -> list[str]:
    """The last versions, newest last: number, timestamp, tags; marks the inspected one."""
    versions = ds.versions()
    tags: dict[int, list[str]] = {}
    with contextlib.suppress(Exception):  # tags are optional metadata
        for tag, info in ds.tags.list().items():
            tags.setdefault(info["version"], []).append(tag)
    shown = versions[-INSPECT_VERSIONS_SHOWN:]
    lines = [f"  ... {len(versions) - len(shown)} earlier"] if len(versions) > len(shown) else []
    rows = []
    for v in shown:
        notes = [f"tag {t}" for t in sorted(tags.get(v["version"], []))]
        notes += ["inspected"] if v["version"] == pinned else []
        notes += ["latest"] if v["version"] == latest else []
        stamp = v["timestamp"].isoformat(sep=" ", timespec="seconds")
        rows.append((str(v["version"]), stamp, f"({', '.join(notes)})" if notes else ""))
    return lines + aligned(rows)


def inspect_lines(
    uri: str, version: int | str | None = None, sample_rows: int = INSPECT_SAMPLE_ROWS
) -> list[str]:
    """The report of ``lanceloader inspect``, line by line.

    >>> import tempfile, lance
    >>> uri = tempfile.mkdtemp() + "/tiny.lance"
    >>> _ = lance.write_dataset(pa.table({"id": [1, 2, 3]}), uri)
    >>> lines = inspect_lines(uri)
    >>> print("\\n".join(lines[1:3]))
    rows       3
    fragments  1, 3 to 3 rows each
    >>> lines[-1].split()[:2], lines[-1].endswith("yes: int64 [n]")
    (['id', 'int64'], True)
    """
    source = Source(uri, version=version)
    ds = source.dataset
    per_fragment = [f.count_rows() for f in ds.get_fragments()]
    sample = ds.to_table(limit=sample_rows)
    sizes, size_note = column_bytes(ds, sample)
    rows = [("column", "type", "bytes", f"as NumPy (first {sample.num_rows} rows)")]
    for f in source.schema:
        nullable = "" if f.nullable else " not null"
        if is_blob_field(f):
            sizes[f.name], row = blob_row(ds, f.name, nullable, sample.num_rows)
            rows.append(row)
            continue
        rows.append(
            (
                f.name,
                f"{f.type}{nullable}",
                format_bytes(sizes.get(f.name, 0.0)),
                describe_conversion(f.name, sample),
            )
        )
    fragments = f"{len(per_fragment)}"
    if per_fragment:
        fragments += f", {min(per_fragment):,} to {max(per_fragment):,} rows each"
    return [
        f"dataset    {source.uri}",
        f"rows       {source.num_rows:,}{deleted_note(ds)}",
        f"fragments  {fragments}",
        f"bytes      {format_bytes(sum(sizes.values()))} ({size_note})",
        "versions",
        *version_lines(ds, source.version, ds.latest_version),
        f"columns    {len(source.schema)}",
        *aligned(rows),
        *lineage_lines(source.schema),
    ]


def blob_row(
    ds: Any, name: str, nullable: str, sample_rows: int
) -> tuple[float, tuple[str, str, str, str]]:
    """A blob column's payload bytes (from a scan of its descriptors: no payload is read)
    and its line: kind blob, the payloads' mean and total, and what the loader delivers
    (the payloads as ``large_binary``, unless ``blobs=`` asks otherwise)."""
    sizes = payload_sizes(ds.to_table(columns=[name]).column(name))
    mean = format_bytes(float(sizes.mean())) if len(sizes) else "-"
    bytes_as = describe_conversion(
        name, pa.table({name: pa.array([b""] * max(1, sample_rows), pa.large_binary())})
    )
    return float(sizes.sum()), (
        name,
        f"blob{nullable}",
        f"{format_bytes(float(sizes.sum()))} (mean {mean})",
        f"{bytes_as} (payloads)",
    )


def lineage_lines(schema: pa.Schema) -> list[str]:
    """Where a copy written by ``ll.materialize`` or ``ll.convert`` came from, or nothing."""
    metadata = schema.metadata or {}
    lines = []
    if b"lanceloader.lineage" in metadata:
        facts = json.loads(metadata[b"lanceloader.lineage"])
        order = facts.get("order") or {}
        shuffle = (
            "sequential"
            if not order.get("shuffle")
            else f"shuffled (block {order.get('block_size')}, seed {order.get('seed')})"
        )
        lines.append(
            f"materialised from {facts['source']} (version {facts['version']}, "
            f"identity {facts['identity']}), epoch {facts['epoch']}, {shuffle}; "
            f"filter {facts.get('filter')!r}, split {facts.get('split')!r}, "
            f"transform {facts.get('transform')!r}"
        )
    if b"lanceloader.classes" in metadata:
        lines.append(f"classes    {', '.join(json.loads(metadata[b'lanceloader.classes']))}")
    return lines


def inspect(args: argparse.Namespace) -> int:
    """``lanceloader inspect``: print what the dataset holds and how its columns convert."""
    version = int(args.version) if args.version and args.version.isdigit() else args.version
    refuse_convertible(args.uri, "inspect")
    with input_errors():
        lines = inspect_lines(args.uri, version, args.sample_rows)
    print("\n".join(lines))
    return 0
