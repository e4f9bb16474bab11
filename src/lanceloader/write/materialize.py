"""Materialise: write what a Loader delivers, once, as a new Lance dataset.

An expensive transform (JPEG decoding, resizing, tokenising), a selective filter or a full
shuffle costs the same every epoch. :func:`materialize` pays it once: it runs the loader's
pipeline over one epoch (its filter, split, columns, transform and order, all ranks together)
and writes the batches as a new dataset, which later epochs read sequentially (or with a cheap
block shuffle).

Contract:

* **Same rows as the loader.** Row ``i`` of the output is row ``i`` of the loader's epoch
  ``epoch`` with ``world_size=1``, transformed. Transforms may return a RecordBatch or a dict of
  NumPy arrays (an array of shape ``(n, a, b)`` becomes nested fixed-size lists).
* **Resumable, committed once.** The epoch is cut into pieces of ``rows_per_fragment`` rows; each
  piece is written as a Lance fragment (data files only, invisible) and recorded in a progress
  record in this machine's cache directory (``~/.cache/lanceloader/materialize/``, named by a
  hash of the output's location: :func:`progress_path`), never inside the dataset. A rerun on
  the same machine after a crash (even SIGKILL) with the same settings reuses the pieces
  recorded there and writes the rest; the dataset version appears only at the end, in one
  commit, so a half-finished run leaves no visible version (and an existing dataset at
  ``out_uri`` keeps its current version until then).
* **The same settings, or a refusal.** A rerun whose settings differ from the recorded run's
  (another transform, filter, order, ...) is refused with a ``ValueError`` naming both; it
  resumes with the recorded settings, or starts over with ``restart=True`` (which removes the
  recorded run's pieces). A transform counts by value (:func:`transform_identity`): its class
  and state, or its function's code and the plain values it reads, so ``decode_images(mean=A)``
  and ``decode_images(mean=B)`` are different transforms.
* **One run per output.** A run holds a lock on its output (``flock`` in the cache directory,
  released when the process ends, even by SIGKILL); a second run into the same output on the
  same machine fails at once with an error instead of interleaving its pieces with the first's.
* **Lineage.** The output's schema metadata ``lanceloader.lineage`` (JSON) records the source URI,
  version and identity, filter, splits, columns, the transform (described with its parameters,
  and ``transform_id``, the hash of its identity), order settings, seed and epoch;
  ``lanceloader inspect`` shows it.

>>> import tempfile
>>> from lanceloader import Loader
>>> from lanceloader.demo import write_demo_dataset
>>> uri = write_demo_dataset(tempfile.mkdtemp() + "/d.lance", rows=1000)
>>> loader = Loader(uri, batch_size=100, columns=["id", "x"], filter="label < 5",
...                 shuffle=True, seed=1)
>>> copy = materialize(loader, tempfile.mkdtemp() + "/copy.lance")
>>> copy.count_rows(), json.loads(copy.schema.metadata[b"lanceloader.lineage"])["filter"]
(500, 'label < 5')
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import os
import sys
from pathlib import Path
from typing import Any

import lance
import numpy as np
import pyarrow as pa
from lance.fragment import FragmentMetadata, write_fragments
from tqdm import tqdm

from lanceloader.arguments import check_int, check_storage_options
from lanceloader.batch.output import as_conversion
from lanceloader.engine.stats import Recorder
from lanceloader.engine.stream import Stream
from lanceloader.ordering.plan import Plan
from lanceloader.state.format import order_settings
from lanceloader.write.convert import dataset_version
from lanceloader.write.identity import transform_identity
from lanceloader.write.runs import OutputLock, local_path, record_path
from lanceloader.write.tables import with_blob_columns

LINEAGE_KEY = b"lanceloader.lineage"
MODES = ("create", "overwrite")


def lineage(loader: Any, epoch: int) -> dict[str, Any]:
    """Where a materialised copy comes from: JSON-safe, no credentials."""
    src = loader.source
    rows = src.settings()
    described, identity = (
        (None, None) if loader.transform is None else transform_identity(loader.transform)
    )
    return {
        "source": src.dataset_name.uri,
        "version": src.dataset_name.version,
        "identity": src.dataset_name.identity,
        "filter": rows["filter"],
        "splits": rows["splits"],
        "split": rows["split"],
        "split_key": rows["split_key"],
        "columns": src.columns,
        "transform": described,
        "transform_id": identity,
        "order": order_settings(src, loader.order),
        "epoch": epoch,
        "batch_size": loader.batch_size,
    }


def materialize(
    loader: Any,
    out_uri: str | os.PathLike[str],
    *,
    epoch: int = 0,
    mode: str = "create",
    rows_per_fragment: int = 256 * 1024,
    num_workers: int | None = None,
    progress: bool | None = None,
    storage_options: dict[str, str] | None = None,
    restart: bool = False,
) -> lance.LanceDataset:
    """Write epoch ``epoch`` of ``loader`` (all ranks' rows, in order) to ``out_uri``; returns
    the new dataset. See the module's text for the contract (``lanceloader.ray.materialize``
    does the same on a Ray cluster).

    Args:
        mode: ``"create"`` (an existing dataset is an error) or ``"overwrite"``.
        rows_per_fragment: rows per piece (a fragment, and the unit a rerun resumes from),
            rounded to whole batches.
        num_workers: the loader's workers by default.
        progress: a progress bar on stderr; default when stderr is a terminal.
        storage_options: for an object-store ``out_uri``, passed to Lance (as for ``Loader``).
        restart: discard the pieces of an unfinished earlier run into ``out_uri`` with other
            settings (by default such a run is refused, naming both) and start over.
    """
    with Job.start(
        loader, out_uri, epoch, mode, rows_per_fragment, storage_options, restart=restart
    ) as job:
        show = sys.stderr.isatty() if progress is None else progress
        with tqdm(
            total=len(job.pieces),
            initial=len(job.pieces) - len(job.todo()),
            unit="piece",
            desc="materialize",
            file=sys.stderr,
            disable=not show,
        ) as bar:
            for number in job.todo():
                job.record(
                    number,
                    *write_piece(
                        job.loader,
                        job.out,
                        job.epoch,
                        job.pieces[number],
                        job.metadata,
                        num_workers,
                        job.storage_options,
                    ),
                )
                bar.update(1)
        return job.commit()


@dataclasses.dataclass
class Job:
    """One materialisation: the epoch cut into pieces of whole batches, the pieces already
    written (the progress record, kept only for the same settings) and the one commit. Pieces
    can be written anywhere (:func:`write_piece`: this process, or Ray workers); the job
    records them and commits, in this process. Use it as a context manager: it holds the
    output's lock from :meth:`start` to the end of the ``with`` block."""

    loader: Any
    out: str
    epoch: int
    pieces: list[range]
    metadata: dict[bytes, bytes]
    done: dict[str, Any]
    progress: Path
    storage_options: dict[str, str] | None = None
    lock: OutputLock | None = None

    @classmethod
    def start(
        cls,
        loader: Any,
        out_uri: str | os.PathLike[str],
        epoch: int,
        mode: str,
        rows_per_fragment: int,
        storage_options: dict[str, str] | None = None,
        *,
        restart: bool = False,
    ) -> Job:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        check_int("rows_per_fragment", rows_per_fragment, minimum=1)
        check_int("epoch", epoch, minimum=0)
        check_storage_options(storage_options)
        out = os.fspath(out_uri)
        progress = progress_path(out)
        lock = OutputLock(
            "materialize",
            out,
            f"another materialize is writing {out!r}; wait "
            "for it to finish, or write to another output. Its pieces are reused "
            "by a rerun with the same settings once it has stopped",
        )
        lock.__enter__()
        try:
            if mode == "create" and dataset_version(out, storage_options) is not None:
                raise FileExistsError(
                    f"{out!r} already holds a Lance dataset; pass "
                    "mode='overwrite' to replace it with a new version"
                )
            plan = epoch_plan(loader)
            per_piece = max(1, rows_per_fragment // loader.batch_size)
            pieces = [
                range(start, min(start + per_piece, len(plan)))
                for start in range(0, len(plan), per_piece)
            ]
            facts = lineage(loader, epoch)
            fingerprint = hashlib.blake2b(
                json.dumps([facts, per_piece], sort_keys=True, default=str).encode(), digest_size=12
            ).hexdigest()
            done = _progress(progress, fingerprint, facts, per_piece, out, restart)
        except BaseException:
            lock.__exit__()
            raise
        return cls(
            loader,
            out,
            epoch,
            pieces,
            {LINEAGE_KEY: json.dumps(facts, default=str).encode()},
            done,
            progress,
            storage_options,
            lock,
        )

    def __enter__(self) -> Job:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.lock is not None:
            self.lock.__exit__()  # removes the lock file and releases the flock
            self.lock = None

    def todo(self) -> list[int]:
        """The numbers of the pieces still to write."""
        return [n for n in range(len(self.pieces)) if str(n) not in self.done["pieces"]]

    def record(self, number: int, fragments: list[dict[str, Any]], schema: str) -> None:
        """Piece ``number`` is written (its fragments' metadata and schema, as
        :func:`write_piece` returns them): saved at once, so a rerun skips it."""
        self.done["pieces"][str(number)] = {"fragments": fragments, "schema": schema}
        _save_progress(self.progress, self.done)

    def commit(self) -> lance.LanceDataset:
        """The one commit: every piece's fragments, in order, as a new version."""
        written = [self.done["pieces"][str(n)] for n in range(len(self.pieces))]
        if not any(piece["fragments"] for piece in written):
            raise ValueError(f"the loader's epoch {self.epoch} has no rows: nothing to materialise")
        dataset = commit_fragments(
            self.out,
            written,
            "the transform returned different "
            "columns or types in different batches; make it return one "
            "schema",
            self.storage_options,
        )
        self.progress.unlink(missing_ok=True)
        return dataset


def progress_path(out: str) -> Path:
    """Where a run into ``out`` records its pieces: in this machine's cache directory
    (``$XDG_CACHE_HOME`` or ``~/.cache``, then ``lanceloader/materialize/``), named by a hash of
    the output's location (a local path with symlinks resolved, or the URI); never inside the
    dataset."""
    return record_path("materialize", out)


def commit_fragments(
    out: str,
    written: list[dict[str, Any]],
    mismatch: str,
    storage_options: dict[str, str] | None = None,
) -> lance.LanceDataset:
    """Commit, as one new version of ``out`` (``Overwrite``), the fragments of ``written``
    (``{"fragments": [metadata as JSON], "schema": IPC hex}`` each, in order), which must all
    have one schema (else ``ValueError(mismatch)``)."""
    schemas = {piece["schema"] for piece in written if piece["fragments"]}
    if len(schemas) != 1:
        raise ValueError(mismatch)
    schema = pa.ipc.read_schema(pa.py_buffer(bytes.fromhex(schemas.pop())))
    fragments = [
        FragmentMetadata.from_json(json.dumps(f)) for piece in written for f in piece["fragments"]
    ]
    return lance.LanceDataset.commit(
        out,
        lance.LanceOperation.Overwrite(schema, fragments),
        read_version=dataset_version(out, storage_options),
        storage_options=storage_options,
    )


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
    converted = (_to_arrow(batch) for batch in stream)
    first = next(converted, None)
    if first is None:
        return [], ""
    schema = kept_blob_columns(first.schema, loader.source).with_metadata(metadata)

    def rows() -> Any:  # streamed: Lance writes while the workers transform the next batches
        for table in itertools.chain([first], converted):
            for batch in table.to_batches():
                yield pa.RecordBatch.from_arrays(batch.columns, schema=schema)

    try:
        # "create" where no dataset is yet: Lance warns "No existing dataset" otherwise
        mode = "create" if dataset_version(out, storage_options) is None else "overwrite"
        fragments = write_fragments(
            pa.RecordBatchReader.from_batches(schema, rows()),
            out,
            schema=schema,
            max_rows_per_file=1 << 30,  # one file per piece
            mode=mode,
            storage_options=storage_options,
        )
    finally:
        stream.close()
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


def _progress(
    path: Path, fingerprint: str, facts: dict[str, Any], per_piece: int, out: str, restart: bool
) -> dict[str, Any]:
    """The pieces an unfinished run with the same settings already wrote. A record of a run
    with other settings is refused (``ValueError`` naming both), or with ``restart`` discarded
    with its pieces' data files."""
    fresh = {"fingerprint": fingerprint, "lineage": facts, "per_piece": per_piece, "pieces": {}}
    try:
        state = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return fresh
    if state.get("fingerprint") == fingerprint:
        return state
    if not state.get("pieces"):
        return fresh
    if restart:
        _remove_pieces(out, state["pieces"])
        return fresh
    raise ValueError(_other_settings(out, path, state, facts, per_piece))


def _other_settings(
    out: str, path: Path, state: dict[str, Any], facts: dict[str, Any], per_piece: int
) -> str:
    """Why the run recorded in ``state`` cannot be resumed with ``facts``: what differs."""
    then = {**state.get("lineage", {}), "batches per piece": state.get("per_piece")}
    now = {**facts, "batches per piece": per_piece}
    if (
        then.get("transform_id") != now["transform_id"]
        and then.get("transform") == now["transform"]
    ):  # the same description, another value (code, closure, hidden state)
        then["transform"] = f"{then['transform']} (identity {then['transform_id']})"
        now["transform"] = f"{now['transform']} (identity {now['transform_id']})"
    differ = [
        f"{key}: {then.get(key)!r} then, {now[key]!r} now"
        for key in now
        if key != "transform_id"
        and json.dumps(then.get(key), default=str, sort_keys=True)
        != json.dumps(now[key], default=str, sort_keys=True)
    ]
    return (
        f"an unfinished materialize into {out!r} ({len(state['pieces'])} pieces written, "
        f"recorded in {os.fspath(path)!r}) had other settings: {'; '.join(differ)}. Rerun "
        "it with its settings to resume it, or pass restart=True to discard its pieces and "
        "start over with these"
    )


def _remove_pieces(out: str, pieces: dict[str, Any]) -> None:
    """Delete the data files of the recorded (uncommitted) ``pieces`` of a local output."""
    path = local_path(out)
    if path is None:  # an object store: left for Lance's cleanup_old_versions
        return
    for piece in pieces.values():
        for fragment in piece.get("fragments", []):
            for file in FragmentMetadata.from_json(json.dumps(fragment)).files:
                Path(path, "data", os.path.basename(file.path)).unlink(missing_ok=True)


def _save_progress(path: Path, state: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(state))
    os.replace(temporary, path)  # atomic: a kill leaves the old record or the new one


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
