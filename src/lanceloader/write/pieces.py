"""One piece of a materialised epoch (whole batches of the loader's plan) written as
uncommitted Lance fragments by :func:`write_piece`: in any process (the loader pickles as
plain parameters), so ``materialize`` runs it here and ``lanceloader.ray.materialize`` in Ray
tasks; the job that cut the epoch records the pieces and commits them once
(:mod:`lanceloader.write.materialize`).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import numpy as np
import pyarrow as pa
from lance.fragment import write_fragments

from lanceloader.batch.output import as_conversion
from lanceloader.engine.stats import Recorder
from lanceloader.engine.stream import Stream
from lanceloader.ordering.plan import Plan
from lanceloader.write.runs import dataset_version
from lanceloader.write.tables import with_blob_columns


def epoch_plan(loader: Any) -> Plan:
    """The plan of a whole epoch of ``loader`` on one rank (every row, no padding)."""
    return Plan(loader.source.num_rows, loader.batch_size)


def write_piece(
    loader: Any,
    out: str,
    epoch: int,
    batches: range,
    metadata: dict[bytes, bytes],
    num_workers: int | None = None,
    storage_options: dict[str, str] | None = None,
) -> tuple[list[dict[str, Any]], str]:
    """Run ``loader``'s pipeline over ``batches`` of its epoch ``epoch`` and write them to
    ``out`` as uncommitted fragments; returns their metadata and the schema (hex of its IPC
    bytes). Runs in any process: the loader pickles as plain parameters."""
    reading = loader.reading(num_workers or loader.num_workers)
    reading = dataclasses.replace(
        reading,
        finish=None,
        placement=None,
        work=dataclasses.replace(reading.work, output=as_conversion("arrow")),
    )
    stream = Stream(reading, epoch, epoch_plan(loader), batches, Recorder())
    try:
        return _write(stream, loader, out, metadata, storage_options)
    finally:
        stream.close()


def _write(
    stream: Stream,
    loader: Any,
    out: str,
    metadata: dict[bytes, bytes],
    storage_options: dict[str, str] | None,
) -> tuple[list[dict[str, Any]], str]:
    """Stream's batches into uncommitted fragments of ``out``. An error of the pipeline (the
    transform's, say) is raised as itself, not as the ``OSError`` Lance wraps it in."""
    converted = (_to_arrow(batch) for batch in stream)
    first = next(converted, None)
    if first is None:
        return [], ""
    schema = kept_blob_columns(first.schema, loader.source).with_metadata(metadata)
    failed: list[BaseException] = []

    def rows() -> Any:  # streamed: Lance writes while the workers transform the next batches
        try:
            for table in itertools.chain([first], converted):
                for batch in table.to_batches():
                    yield pa.RecordBatch.from_arrays(batch.columns, schema=schema)
        except BaseException as exc:
            failed.append(exc)
            raise

    # "create" where no dataset is yet: Lance warns "No existing dataset" otherwise
    mode = "create" if dataset_version(out, storage_options) is None else "overwrite"
    try:
        fragments = write_fragments(
            pa.RecordBatchReader.from_batches(schema, rows()),
            out,
            schema=schema,
            max_rows_per_file=1 << 30,  # one file per piece
            mode=mode,
            storage_options=storage_options,
        )
    except Exception:
        if failed:
            raise failed[0] from None
        raise
    return [f.to_json() for f in fragments], schema.serialize().to_pybytes().hex()


def kept_blob_columns(schema: pa.Schema, source: Any) -> pa.Schema:
    """``schema`` (of the batches written) with the blob columns ``source`` read as bytes
    marked as blob columns again, where they are still binary: a copy keeps blobs as blobs."""
    blobs = source.facts.blobs
    names = [
        name
        for name, choice in blobs.items()
        if choice == "bytes"
        and name in schema.names
        and pa.types.is_large_binary(schema.field(name).type)
    ]
    return with_blob_columns(schema, names)


def _to_arrow(batch: Any) -> pa.Table:
    """A delivered batch (RecordBatch, Table or dict of arrays) as an Arrow table."""
    if isinstance(batch, pa.RecordBatch):
        return pa.Table.from_batches([batch])
    if isinstance(batch, pa.Table):
        return batch
    if isinstance(batch, dict):
        return pa.table(
            {
                name: _column(np.asarray(value)) if not isinstance(value, pa.Array) else value
                for name, value in batch.items()
            }
        )
    raise TypeError(
        f"materialize needs batches as Arrow or a dict of arrays; the transform "
        f"returned a {type(batch).__name__}"
    )


def _column(array: np.ndarray) -> pa.Array:
    """A NumPy array as an Arrow column: extra dimensions become nested fixed-size lists."""
    if array.ndim <= 1:
        return pa.array(array)
    values: pa.Array = pa.array(np.ascontiguousarray(array).reshape(-1))
    for size in reversed(array.shape[1:]):
        values = pa.FixedSizeListArray.from_arrays(values, size)
    return values
