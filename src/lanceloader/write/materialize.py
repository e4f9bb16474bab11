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
  the same machine after a crash (even SIGKILL) or an error, with the same settings, reuses the
  recorded pieces and writes the rest; the dataset version appears only at the end, in one
  commit, so a half-finished run leaves no visible version (and an existing dataset at
  ``out_uri`` keeps its current version until then).
* **Checked before trusted.** The record lives outside the output, so the output may have been
  removed or changed since: a recorded piece is reused only when each of its data files is in
  the output and is what was recorded (a Lance file of the recorded rows and, locally, bytes);
  the others are written again (:mod:`lanceloader.write.progress`). Data files a run cut short
  left, that no piece or version uses, are removed.
* **The same settings, or a refusal.** A rerun whose settings differ from the recorded run's
  (another transform, filter, order, ...) is refused with a ``ValueError`` naming both; it
  resumes with the recorded settings, or starts over with ``restart=True`` (which removes the
  recorded run's pieces). A transform counts by value (:func:`~lanceloader.write.identity.identify`):
  its class and state, or its function's code, closure, defaults and the module globals it
  reads (lists, arrays, objects and the functions it calls included), so
  ``decode_images(mean=A)`` and ``decode_images(mean=B)`` are different transforms. Where that
  value cannot be read entirely (a lock, an open file, ...), the identity is not sure and an
  unfinished run is never resumed: the rerun is refused, offering ``restart=True``.
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
>>> summary = materialize(loader, tempfile.mkdtemp() + "/copy.lance")
>>> summary.rows, summary.version, summary.fragments
(500, 1, 1)
>>> json.loads(summary.dataset.schema.metadata[b"lanceloader.lineage"])["filter"]
'label < 5'

"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import lance
import pyarrow as pa
from lance.fragment import FragmentMetadata
from tqdm import tqdm

from lanceloader.arguments import check_int, check_storage_options
from lanceloader.state.format import order_settings
from lanceloader.write import progress as records
from lanceloader.write.identity import identify
from lanceloader.write.pieces import epoch_plan, write_piece
from lanceloader.write.progress import progress_path
from lanceloader.write.runs import OutputLock, dataset_version

__all__ = [
    "Job",
    "MaterializeSummary",
    "commit_fragments",
    "materialize",
    "progress_path",
    "write_piece",
]

LINEAGE_KEY = b"lanceloader.lineage"
MODES = ("create", "overwrite")


def lineage(loader: Any, epoch: int) -> dict[str, Any]:
    """Where a materialised copy comes from: JSON-safe, no credentials."""
    return _lineage(loader, epoch)[0]


def _lineage(loader: Any, epoch: int) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The lineage, and the doubts about the transform's identity (see :func:`identify`)."""
    src = loader.source
    rows = src.settings()
    found = None if loader.transform is None else identify(loader.transform)
    inner = {  # a mix's sources run their own transforms (their rows are in the copy too)
        part.name: identify(part.transform)
        for part in getattr(src, "sources", ())
        if getattr(part, "transform", None) is not None
    }
    facts = {
        "source": src.uri,
        "version": src.version,
        "identity": src.identity,
        "filter": rows["filter"],
        "splits": rows["splits"],
        "split": rows["split"],
        "split_key": rows["split_key"],
        "columns": src.columns,
        "transform": found and found.description,
        "transform_id": found and found.identity,
        "order": order_settings(src, loader.order),
        "epoch": epoch,
        "batch_size": loader.batch_size,
    }
    if inner:
        facts["source_transforms"] = {
            name: {"transform": i.description, "transform_id": i.identity}
            for name, i in inner.items()
        }
    doubts = [*(found.doubts if found else ()), *(d for i in inner.values() for d in i.doubts)]
    return facts, tuple(doubts)


@dataclasses.dataclass(frozen=True)
class MaterializeSummary:
    """What :func:`materialize` wrote: ``print(summary)`` says it in one paragraph; the
    dataset is ``summary.dataset`` (or ``lance.dataset(summary.uri)``).

    ``nbytes`` is the size of the copy's data files; ``pieces`` the pieces of the epoch (each
    ``rows_per_fragment`` rows, a fragment), of which ``resumed`` were written by an earlier,
    unfinished run and reused (checked first), and ``redone`` were recorded by it but had
    missing or changed files and were written again; ``removed`` is ``(files, bytes)`` of the
    data files earlier runs had left that nothing used (a piece cut short, or the pieces of a
    run discarded with ``restart=True``).
    """

    uri: str
    version: int
    rows: int
    fragments: int
    nbytes: int
    seconds: float
    dataset: lance.LanceDataset = dataclasses.field(repr=False, compare=False)
    pieces: int = 0
    resumed: int = 0
    redone: int = 0
    removed: tuple[int, int] = (0, 0)

    def __str__(self) -> str:
        rate = self.rows / self.seconds if self.seconds > 0 else 0.0
        text = (
            f"materialized {self.rows:,} rows in {_count(self.fragments, 'fragment')} "
            f"({self.nbytes / 1e6:,.1f} MB) to {self.uri!r}, version {self.version}, in "
            f"{self.seconds:.1f} s ({rate:,.0f} rows/s)"
        )
        if self.resumed:
            text += (
                f"; resumed {self.resumed} of {_count(self.pieces, 'piece')} an earlier run "
                "had written"
            )
        if self.redone:
            text += (
                f"; wrote again {_count(self.redone, 'piece')} whose files were missing or "
                "changed since an earlier run recorded them"
            )
        if self.removed[0]:
            text += (
                f"; removed {self.removed[0]:,} data files ({self.removed[1] / 1e6:,.1f} MB) "
                "that earlier runs had left"
            )
        return text


def _count(number: int, noun: str) -> str:
    return f"{number:,} {noun}{'' if number == 1 else 's'}"


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
) -> MaterializeSummary:
    """Write epoch ``epoch`` of ``loader`` (all ranks' rows, in order) to ``out_uri``; returns
    a :class:`MaterializeSummary` (rows, fragments, bytes, version, what was resumed; the
    dataset as ``.dataset``). See the module's text for the contract
    (``lanceloader.ray.materialize`` does the same on a Ray cluster).

    Args:
        mode: ``"create"`` (an existing dataset is an error) or ``"overwrite"``.
        rows_per_fragment: rows per piece (a fragment, and the unit a rerun resumes from),
            rounded to whole batches.
        num_workers: the loader's workers by default.
        progress: a progress bar on stderr; default when stderr is a terminal.
        storage_options: for an object-store ``out_uri``, passed to Lance (as for ``Loader``).
        restart: discard the pieces of an unfinished earlier run into ``out_uri`` with other
            settings, or whose transform cannot surely be told the same (by default such a
            run is refused, naming why), and start over.
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
            try:
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
            except BaseException:
                # A piece cut short; the recorded ones stay for a rerun, which also removes
                # what this could not (its record knows them).
                with contextlib.suppress(OSError):
                    job.remove_leftovers()
                raise
        return job.commit()


@dataclasses.dataclass
class Job:
    """One materialisation: the epoch cut into pieces of whole batches, the pieces already
    written (the progress record, kept only for the same settings, each piece checked against
    the output before it counts) and the one commit. Pieces can be written anywhere
    (:func:`write_piece`: this process, or Ray workers); the job records them and commits, in
    this process. Use it as a context manager: it holds the output's lock from :meth:`start`
    to the end of the ``with`` block."""

    loader: Any
    out: str
    epoch: int
    pieces: list[range]
    metadata: dict[bytes, bytes]
    done: dict[str, Any]
    progress: Path
    storage_options: dict[str, str] | None = None
    lock: OutputLock | None = None
    resumed: int = 0
    redone: int = 0
    removed: tuple[int, int] = (0, 0)
    started: float = dataclasses.field(default_factory=time.perf_counter)

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
            job = cls._open(loader, out, epoch, rows_per_fragment, storage_options, restart)
        except BaseException:
            lock.__exit__()
            raise
        job.lock = lock
        return job

    @classmethod
    def _open(
        cls,
        loader: Any,
        out: str,
        epoch: int,
        rows_per_fragment: int,
        storage_options: dict[str, str] | None,
        restart: bool,
    ) -> Job:
        """The job, its record loaded and checked: recorded pieces whose files are not in the
        output as recorded are dropped (written again), leftovers of earlier runs removed."""
        plan = epoch_plan(loader)
        per_piece = max(1, rows_per_fragment // loader.batch_size)
        pieces = [
            range(start, min(start + per_piece, len(plan)))
            for start in range(0, len(plan), per_piece)
        ]
        facts, doubts = _lineage(loader, epoch)
        fingerprint = hashlib.blake2b(
            json.dumps([facts, per_piece], sort_keys=True, default=str).encode(), digest_size=12
        ).hexdigest()
        settings = {
            "fingerprint": fingerprint,
            "lineage": facts,
            "per_piece": per_piece,
            "doubts": list(doubts),
        }
        progress = progress_path(out)
        done, discarded = records.load(progress, settings, out, restart)
        recorded = done["pieces"]
        whole = set(records.whole_pieces(out, recorded, storage_options))
        done["pieces"] = {n: piece for n, piece in recorded.items() if n in whole}
        left = records.remove_leftovers(out, done, storage_options)
        records.save(progress, done)  # before any piece: a failed run's leftovers are known
        return cls(
            loader,
            out,
            epoch,
            pieces,
            {LINEAGE_KEY: json.dumps(facts, default=str).encode()},
            done,
            progress,
            storage_options,
            resumed=len(whole),
            redone=len(recorded) - len(whole),
            removed=(discarded[0] + left[0], discarded[1] + left[1]),
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
        records.save(self.progress, self.done)

    def remove_leftovers(self) -> None:
        """Remove the data files of pieces cut short (by an error), kept by no record: the
        recorded pieces stay for a rerun."""
        records.remove_leftovers(self.out, self.done, self.storage_options)

    def commit(self) -> MaterializeSummary:
        """The one commit: every piece's fragments, in order, as a new version."""
        written = [self.done["pieces"][str(n)] for n in range(len(self.pieces))]
        if not any(piece["fragments"] for piece in written):
            self.progress.unlink(missing_ok=True)  # nothing written, nothing to resume
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
        fragments = [f for piece in written for f in piece["fragments"]]
        return MaterializeSummary(
            self.out,
            dataset.version,
            sum(f["physical_rows"] for f in fragments),
            len(fragments),
            sum(file["file_size_bytes"] or 0 for f in fragments for file in f["files"]),
            time.perf_counter() - self.started,
            dataset,
            len(self.pieces),
            self.resumed,
            self.redone,
            self.removed,
        )


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
