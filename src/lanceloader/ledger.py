"""Ledger: which rows every step of a run read, computed from the order, never replayed.

"Which rows did step *s* on rank *r* see?" is the question after a loss spike. A batch's rows are
a pure function of (dataset version, filter, split, packing or mix, order settings, seed, epoch,
batching, rank), so :class:`Ledger` answers it from a loader or a saved state alone: no data is
read (a dataset with a filter, split or packing scans for its row list once, as the loader does
when it is built) and nothing is logged during training. A lookup costs the same at step 10 and
at step 10,000,000 (``benchmarks/ledger.py``).

What a step's rows are, one line per row of the batch (:data:`LEDGER_SCHEMA`):

* ``epoch``, ``step`` (the batch's number in its epoch on its rank), ``global_step`` (the run's
  step counter: steps since the run's start, across epochs), ``rank``, ``index`` (the row's
  place in the batch) and ``sample`` (its global sample in the epoch's order);
* ``uri`` and ``version``: the dataset and its pinned version (a mix: the row's source's);
* ``position``: the row's place in the rows read (after filter and split; a packed row's
  number; in a mix, in its source's rows);
* ``row_offset``: the row's offset in the pinned version (``lance.dataset(uri,
  version=version).take(row_offsets)`` reads exactly those rows; a version never changes, so
  ``(uri, version, row_offset)`` names the row for as long as the version is kept), and
  ``row_id``: Lance's ``_rowid`` there (the row address, or with stable row ids an id that
  survives compaction and updates: the one to join on across versions). Lance finds the ids
  in its metadata (deletion files, row id sequences), never in the data;
* a mix: ``source`` (its name), ``source_epoch`` and ``source_sample`` (the row's place in
  that source's own stream of epochs), and ``source_weight``: its source's share of samples
  in the piece of the mix's weights that drew it (a schedule's stage or ramp step, or a
  ``set_weights`` call: the weights at the row's step, as the interleave used them);
* packed rows (no single row): ``document_offsets`` and ``document_ids`` (the documents, as
  ``row_offset`` and ``row_id``), ``token_starts`` and ``token_counts`` (each piece's tokens
  in its document), in the order the row holds them;
* clips (``clips=ll.video_clips(...)`` or ``ll.audio_clips(...)``): ``position`` is the clip's
  number, ``row_offset`` and ``row_id`` its media row's, and ``clip_start`` the first frame
  (audio: sample, at the file's own rate) of the clip, drawn for that epoch where the clips
  are ``per_video``/``per_file``.

The run as it happened: steps after an elastic resume (another number of ranks, batch size or
``drop_last``) are cut differently from those before. A state records the batching of the run
that saved it, not its history, so a ledger takes the states the run *resumed from*
(``resumed_from``, oldest first) and the batching of the last stretch from the loader (or the
latest state); see :mod:`lanceloader.state.history`. A ledger follows one interleave: after a
resume that changed a mix's weights, the new loader's ledger answers the steps from there on and
the old loader's those before (:func:`refuse_weight_changes`). Rows a transform skipped
(``on_error="skip"``) are in the ledger (they were read for the batch) but not in the batch.

Example::

    >>> import tempfile
    >>> from lanceloader.demo import write_demo_dataset
    >>> from lanceloader.loader import Loader
    >>> uri = write_demo_dataset(tempfile.mkdtemp() + "/demo.lance", rows=10)
    >>> loader = Loader(uri, batch_size=4, columns=["id"], shuffle=True, seed=0)
    >>> [batch["id"].tolist() for batch in loader][1]
    [4, 2, 3, 7]
    >>> Ledger(loader).rows(epoch=0, step=1)["row_offset"].to_pylist()
    [4, 2, 3, 7]
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from lanceloader.ordering.order import Order
from lanceloader.pipeline import RowsSettings
from lanceloader.rows.protocol import RowSource
from lanceloader.state.format import StateMismatchError, check_keys, fingerprint, order_settings
from lanceloader.state.history import History

_ids = pa.list_(pa.uint64())
_ints = pa.list_(pa.int64())
LEDGER_SCHEMA = pa.schema(
    [
        ("epoch", pa.int64()),
        ("step", pa.int64()),
        ("global_step", pa.int64()),
        ("rank", pa.int32()),
        ("index", pa.int32()),
        ("sample", pa.int64()),
        ("source", pa.string()),
        ("source_epoch", pa.int64()),
        ("source_sample", pa.int64()),
        ("source_weight", pa.float64()),
        ("uri", pa.string()),
        ("version", pa.int64()),
        ("position", pa.int64()),
        ("row_offset", pa.int64()),
        ("row_id", pa.uint64()),
        ("document_offsets", _ints),
        ("document_ids", _ids),
        ("token_starts", _ints),
        ("token_counts", _ints),
        ("clip_start", pa.int64()),
    ]
)


class Ledger:
    """The rows of every step of a run, from its loader (or a state: :meth:`from_state`).

    Args:
        loader: the run's ``Loader`` (as built for training; its position does not matter,
            its batching is that of the run's last stretch), or anything with its ``source``,
            ``order`` and ``state_dict()``.
        resumed_from: the states the run resumed from, oldest first (the ``state_dict()``s
            loaded at each restart). Needed only when a resume changed the number of ranks,
            the batch size or ``drop_last``; each is checked to be a state of this loader's
            stream (dataset, version, order), else :class:`~lanceloader.StateMismatchError`.

    Nothing here reads data: a lookup computes the order (O(1) per row, whatever the step)
    and asks Lance for the rows' ids from its metadata.

    >>> import tempfile
    >>> from lanceloader.demo import write_demo_dataset
    >>> from lanceloader.loader import Loader
    >>> uri = write_demo_dataset(tempfile.mkdtemp() + "/demo.lance", rows=100)
    >>> ledger = Ledger(Loader(uri, batch_size=8, world_size=2, rank=0, filter="id >= 50"))
    >>> ledger.rows(epoch=0, step=0)["row_offset"].to_pylist()    # both ranks
    [50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65]
    >>> ledger.locate(global_step=5), ledger.steps_in_epoch(0)
    ((1, 1), 4)
    """

    def __init__(self, loader: Any, resumed_from: Sequence[dict[str, Any]] = ()) -> None:
        if not (hasattr(loader, "source") and hasattr(loader, "order")) or not callable(
            getattr(loader, "state_dict", None)
        ):
            raise TypeError(
                f"Ledger takes the run's lanceloader Loader (anything with source, order and "
                f"state_dict()), got {type(loader).__name__!r}; for a saved state use "
                "ll.Ledger.from_state(state)"
            )
        if isinstance(resumed_from, dict):
            raise TypeError(
                "resumed_from must be a list of states, oldest first; got one state: pass [state]"
            )
        self.source: RowSource = loader.source
        self.order: Order = loader.order
        latest = loader.state_dict()
        refuse_weight_changes(latest, resumed_from)
        self.history = History.of_states(latest, list(resumed_from))

    @classmethod
    def from_state(
        cls,
        state: dict[str, Any],
        resumed_from: Sequence[dict[str, Any]] = (),
        *,
        uri: str | os.PathLike[str] | None = None,
        storage_options: dict[str, str] | None = None,
    ) -> Ledger:
        """The ledger of the run that saved ``state`` (a ``state_dict()``, e.g. from
        ``ll.load_state``), without its loader: the dataset at the state's URI (or ``uri``,
        for a copy; the dataset's identity is checked), at the state's version, with its
        filter, split, packing and order.

        A mix's state names its sources by identity and order, not by location: build the
        ``Loader(Mix(...))`` as in training and use ``Ledger(loader, resumed_from)``.

        >>> import tempfile
        >>> from lanceloader.demo import write_demo_dataset
        >>> from lanceloader.loader import Loader
        >>> uri = write_demo_dataset(tempfile.mkdtemp() + "/demo.lance", rows=10)
        >>> state = Loader(uri, batch_size=4, shuffle=True).state_dict()
        >>> Ledger.from_state(state).rows(epoch=1, step=0)["row_offset"].to_pylist()
        [2, 5, 1, 3]
        """
        check_keys(state)
        order = state["order"]
        if "mix" in order:
            raise ValueError(
                "this state is a mix's, which names its sources by identity, not location: "
                "build the Loader(Mix(...)) as in training and use ll.Ledger(loader, "
                "resumed_from=[...])"
            )
        location = state["uri"] if uri is None else os.fspath(uri)
        if location is None:
            raise ValueError(
                "this state names no dataset (a sampler's): use "
                "ll.Ledger(loader) with the loader it belongs to"
            )
        rows = RowsSettings.of_state(state, storage_options).build(location, order["seed"])
        rows = rows.resumed(state, ())[0]  # a followed table's rows carry the state's history
        the_order = Order(
            rows.num_rows, order["shuffle"], order["block_size"], order["window"], order["seed"]
        )
        name = rows.dataset_name
        found = fingerprint(name.identity, name.version, order_settings(rows, the_order))
        if found != state["fingerprint"]:
            raise StateMismatchError(
                f"the dataset at {location!r} (version {name.version}, identity "
                f"{name.identity}) with the state's settings is not the stream the state was "
                f"saved from (dataset {state['dataset']}): point uri= at the dataset the run "
                "read"
            )
        return cls(_Rebuilt(rows, the_order, state), resumed_from)

    # --- where steps lie -------------------------------------------------------------------

    def steps_in_epoch(self, epoch: int) -> int:
        """Steps each rank took (or takes) in ``epoch``."""
        return self.history.steps_in_epoch(epoch)

    def locate(self, global_step: int) -> tuple[int, int]:
        """``(epoch, step)`` of the run's step counter ``global_step`` (from 0 at the run's
        start, across epochs and resumes)."""
        return self.history.locate(global_step)

    def world_size(self, epoch: int, step: int) -> int:
        """Ranks that took step ``step`` of ``epoch``."""
        return self.history.world_size(epoch, step)

    # --- rows ----------------------------------------------------------------------------

    def rows(self, epoch: int, step: int, rank: int | None = None) -> pa.Table:
        """The rows rank ``rank`` read at step ``step`` of ``epoch``, in batch order
        (:data:`LEDGER_SCHEMA`); ``rank=None``: every rank's, in rank order (the global
        batch). Raises ``IndexError`` past the epoch's last step and ``ValueError`` for a
        rank the step did not have."""
        ranks = range(self.history.world_size(epoch, step)) if rank is None else [rank]
        parts = [self._rank_rows(epoch, step, r) for r in ranks]
        return pa.concat_tables(parts) if len(parts) > 1 else parts[0]

    def manifest(
        self, steps: Iterable[int], epoch: int | None = None, rank: int | None = None
    ) -> pa.Table:
        """The rows of many steps, one table: ``steps`` of ``epoch``, or with ``epoch=None``
        the run's global steps (:meth:`locate`). What ``lanceloader ledger`` writes.

        >>> import tempfile
        >>> from lanceloader.demo import write_demo_dataset
        >>> from lanceloader.loader import Loader
        >>> uri = write_demo_dataset(tempfile.mkdtemp() + "/demo.lance", rows=10)
        >>> table = Ledger(Loader(uri, batch_size=4)).manifest(range(2, 5))
        >>> table["epoch"].to_pylist(), table["step"].to_pylist()
        ([0, 0, 1, 1, 1, 1, 1, 1, 1, 1], [2, 2, 0, 0, 0, 0, 1, 1, 1, 1])
        >>> table["row_offset"].to_pylist()
        [8, 9, 0, 1, 2, 3, 4, 5, 6, 7]
        """
        parts = []
        for step in steps:
            e, s = (epoch, step) if epoch is not None else self.locate(step)
            parts.append(self.rows(e, s, rank))
        return pa.concat_tables(parts) if parts else LEDGER_SCHEMA.empty_table()

    def _rank_rows(self, epoch: int, step: int, rank: int) -> pa.Table:
        samples = self.history.batch_samples(epoch, step, rank)
        n = len(samples)
        columns: dict[str, Any] = {
            "epoch": np.full(n, epoch),
            "step": np.full(n, step),
            "global_step": np.full(n, self.history.global_step(epoch, step)),
            "rank": np.full(n, rank, np.int32),
            "index": np.arange(n, dtype=np.int32),
            "sample": samples,
        }
        columns.update(self.source.lineage(self.order.positions(epoch, samples), epoch))
        return table_of(columns, n)


def refuse_weight_changes(latest: dict[str, Any], resumed_from: Sequence[dict[str, Any]]) -> None:
    """Raise :class:`~lanceloader.StateMismatchError` when a mix's weights (its first stage and
    schedule) differ between ``latest`` and a state the run resumed from: the steps before such
    a resume were mixed by another interleave, which this loader does not hold. (A mix whose
    weights change during the run answers the steps from its last resume on: its state keeps
    no pieces before that.)"""
    mix = latest.get("order", {}).get("mix")
    for state in resumed_from:
        saved = state.get("order", {}).get("mix") if isinstance(state, dict) else None
        if mix is None or saved is None:
            continue
        if (saved.get("quotas"), saved.get("schedule")) != (mix["quotas"], mix.get("schedule")):
            raise StateMismatchError(
                f"the run resumed from a state whose mix has quotas {saved.get('quotas')} "
                f"(schedule {saved.get('schedule')}), this loader's has {mix['quotas']} "
                f"(schedule {mix.get('schedule')}): the weights changed at that resume. A ledger "
                "follows one interleave: this loader's answers the steps from that resume on; "
                "for the steps before it, make a ledger of the loader with the old weights"
            )


def table_of(columns: dict[str, Any], n: int) -> pa.Table:
    """A table of :data:`LEDGER_SCHEMA` from ``columns`` (nulls for those not given)."""
    arrays = []
    for field in LEDGER_SCHEMA:
        value = columns.get(field.name)
        if value is None:
            arrays.append(pa.nulls(n, field.type))
        elif isinstance(value, pa.ChunkedArray):
            arrays.append(value.combine_chunks().cast(field.type))
        else:
            arrays.append(
                pa.array(value, field.type)
                if not isinstance(value, pa.Array)
                else value.cast(field.type)
            )
    return pa.Table.from_arrays(arrays, schema=LEDGER_SCHEMA)


class _Rebuilt:
    """What :class:`Ledger` takes from a loader, rebuilt from a state."""

    def __init__(self, source: RowSource, order: Order, state: dict[str, Any]) -> None:
        self.source, self.order, self._state = source, order, state

    def state_dict(self) -> dict[str, Any]:
        return self._state
