"""The rows of a mix (:class:`MixedSource`): what a Loader reads of a
:class:`~lanceloader.rows.mix.Mix`, the builder users make (see its module for what a mix is).
A read of mixed samples locates them as runs of the interleave, reads each source's part with
one call of its :class:`~lanceloader.rows.ordered.OrderedSource`, and puts the rows in mixed
order (:mod:`lanceloader.rows.placement`)."""

from __future__ import annotations

import copy
import dataclasses
import sys
from typing import Any

import numpy as np
import pyarrow as pa

from lanceloader.ordering.interleave import Runs, locate
from lanceloader.ordering.mixrun import MixRun, MixShare, saved_run
from lanceloader.ordering.pieces import Piece, Pieces, StepMap
from lanceloader.ordering.schedule import check_feedback_step
from lanceloader.rows.placement import mixed_rows
from lanceloader.rows.protocol import (
    DatasetName,
    Read,
    ReadHints,
    RowsBase,
    RowsFacts,
    as_table,
    empty_table,
)
from lanceloader.state.format import StateMismatchError, fingerprint

# A mix's read is one read per source, each of its share of the rows, and a Lance call has a
# fixed cost (~2-3 ms CPU for a range read: 10,581 rows of 264 B cost 1.5x the CPU per row of
# 31,744), so the engine sizes a mix's reads as MixedSource.read_parts reads of one source. At
# most this many: a mix read holds at most 4 x the engine's read bytes (32 MiB), however many
# sources it has.
MAX_READ_PARTS = 4
# The parts of a mix's settings that are its run's weights (what may change during a run).
RUN_KEYS = ("quotas", "schedule", "feedback", "anchor", "digest", "offsets")
# Feedback entries a run holds before the next call anchors it (folding the earlier ones).
MAX_FEEDBACK = 64


def schema_text(schema: pa.Schema) -> str:
    return "{" + ", ".join(f"{f.name}: {f.type}" for f in schema) + "}"


class MixedSource(RowsBase):
    """The rows of a :class:`Mix` (the rows protocol, :mod:`lanceloader.rows.protocol`):
    position *p* of epoch *e* is sample *p* of the mix's epoch *e*, index
    ``e * samples_per_epoch + p`` of its endless stream, read in order (the sources' own
    orders live in the reads). Picklable: each source reopens its dataset in a worker process.

    A read of mixed samples locates them as :class:`Runs`, reads each source's part with one
    call of its :class:`~lanceloader.rows.ordered.OrderedSource` (its order and transform), and
    puts the rows in mixed order (:func:`mixed_rows`).

    ``hints.read_parts`` (1 for other rows): the engine sizes a mix's reads
    as that many reads of one source (``engine/sizing.py`` ``batches_per_read``), so each
    source's Lance call is as large as on its own Loader: ``1 / the largest share``, rounded
    down, at most :data:`MAX_READ_PARTS`. A read of the mix then holds up to ``read_parts``
    times the engine's read bytes (8 MiB), and twice that while a sample-by-sample mix places
    its rows.

    >>> import tempfile
    >>> from lanceloader.demo import write_demo_dataset
    >>> from lanceloader.loader import Loader
    >>> from lanceloader.rows.mix import Mix
    >>> a = write_demo_dataset(tempfile.mkdtemp() + "/a.lance", rows=8)
    >>> mix = Mix({"a": Loader(a), "b": Loader(a), "c": Loader(a)})
    >>> parts = lambda m: m.source().hints.read_parts
    >>> parts(mix), parts(Mix({"a": a, "b": a}, weights={"a": 3, "b": 1}))
    (3, 1)
    """

    def __init__(self, mix: Any, global_batch: int | None = None, drop_last: bool = False) -> None:
        self.mix = mix
        self.names = mix.names
        self.sources = mix.sources
        self.schema = mix.schema
        self.columns = list(mix.schema.names)
        fixed = {k: v for k, v in mix.settings().items() if k not in RUN_KEYS}
        self.dataset_name = DatasetName(
            "mix:" + "+".join(self.names), None, fingerprint("mix", None, fixed)
        )
        self.global_batch, self.drop_last = global_batch, drop_last
        self._place()
        # The newest rows of this run's feedback calls, shared by the rows each call derives:
        # thread workers reading for a stream started before a call read with the newest.
        self._newest: list[MixedSource] = [self]
        shares = list(mix.weights.values())
        self.bytes_per_row = sum(
            s.source.bytes_per_row * w for s, w in zip(self.sources, shares, strict=True)
        )
        # floor(1 / the largest share), at most MAX_READ_PARTS: no source reads more rows in a
        # mix read than in a read of its own (the engine's read bound holds per Lance call).
        quotas = mix.interleave.quotas
        self._hints = ReadHints(
            random_reads=any(
                s.order.random_reads or s.source.hints.random_reads for s in self.sources
            ),
            read_parts=max(1, min(MAX_READ_PARTS, sum(quotas) // max(quotas))),
            # every source is storage range reads in order with no transform: so is the mix
            waits_on_storage=all(
                s.source.hints.waits_on_storage and not s.order.random_reads and s.transform is None
                for s in self.sources
            ),
            window_rows=mix.window_samples,
        )

    @property
    def hints(self) -> ReadHints:
        return self._hints

    @property
    def facts(self) -> RowsFacts:
        """The sources' padding, weighed (no cache or plan of its own: its sources have them)."""
        return RowsFacts(padding_fraction=self._padding_fraction())

    @property
    def num_rows(self) -> int:
        return self.mix.samples_per_epoch

    def settings(self) -> dict[str, Any]:
        """No filter or split of its own (the sources have theirs); the mix's settings."""
        return {
            "filter": None,
            "splits": None,
            "split": None,
            "split_key": None,
            "mix": self.mix.settings(),
        }

    def _padding_fraction(self) -> float | None:
        """The share of padding tokens among the packed tokens an epoch delivers (each packed
        source's padding, weighted by its samples per epoch and row length), or ``None`` when
        no source is packed."""
        padded = tokens = 0.0
        for source, count in zip(self.sources, self.mix.per_epoch, strict=True):
            facts = source.source.facts
            if facts.padding_fraction is not None and facts.packing is not None:
                slots = count * facts.packing.seq_len
                padded, tokens = padded + facts.padding_fraction * slots, tokens + slots
        return padded / tokens if tokens else None if not padded else 0.0

    def _place(self) -> None:
        """The run's steps and pieces under this batching. A mix whose one piece starts at the
        stream's start (no schedule, no feedback) reads as an unchanged mix always has."""
        run = self.mix.run
        self.simple = run.piece.start == 0 and not run.schedule.changes_after(
            run.anchor_step, run.feedback
        )
        self.steps: StepMap | None = None
        self.pieces: Pieces | None = None
        if self.global_batch is not None:
            self.steps, self.pieces = run.pieces(
                self.mix.samples_per_epoch, self.global_batch, self.drop_last
            )
        elif not self.simple:
            raise ValueError(
                "a Mix whose weights change (a schedule, or feedback) is read by a Loader, "
                "whose batch size and ranks place its steps; pass it to ll.Loader"
            )

    @property
    def _batching(self) -> tuple[int | None, bool]:
        return self.global_batch, self.drop_last

    def _with_run(self, run: MixRun) -> MixedSource:
        rows = copy.copy(self)
        rows.mix = self.mix.with_run(run)
        rows._place()
        rows._newest = [rows]
        return rows

    def _placed_steps(self) -> tuple[StepMap, Pieces]:
        if self.steps is None or self.pieces is None:
            raise ValueError(
                "this mix was built without the Loader's batching: steps and weights "
                "belong to ll.Loader(ll.Mix(...))"
            )
        return self.steps, self.pieces

    def step_at(self, epoch: int, sample: int) -> int | None:
        """The global step of the batch that starts at ``sample`` of ``epoch``: steps taken
        since the run's start, across epochs and resumes."""
        steps, _ = self._placed_steps()
        return steps.step_of(epoch * self.mix.samples_per_epoch + sample)

    def with_weights(self, weights: Any, step: int | None, next_step: int) -> MixedSource:
        """These rows with ``weights`` from global ``step`` on (default ``next_step``, the next
        batch's). Every :data:`MAX_FEEDBACK` entries, the run is first anchored at
        ``next_step`` (the entries before it folded into the piece in force there), so a state
        holds at most that many."""
        steps, pieces = self._placed_steps()
        step = check_feedback_step(next_step if step is None else step, next_step)
        run = self.mix.run
        if len(run.feedback) >= MAX_FEEDBACK:
            run = run.continued_at(steps, steps.index_of(next_step), pieces)
        rows = self._with_run(run.with_feedback(step, weights))
        if rows.pieces is not None:  # what thread workers resolved before the call still holds
            rows.pieces.adopt(pieces, step)
        rows._newest = self._newest  # a running stream's reads after this call use these rows
        self._newest[0] = rows
        return rows

    def delivered(self, start: tuple[int, int], stop: tuple[int, int]) -> list[MixShare]:
        """What each source gave between positions ``start`` and ``stop`` (``(epoch,
        sample)``, all ranks together), per piece of the weights (:class:`MixShare`). With
        ``drop_last``, the samples an epoch drops count as given (their rows are used up)."""
        _, pieces = self._placed_steps()
        spe = self.mix.samples_per_epoch
        lo = max(start[0] * spe + start[1], pieces.starts[0])
        hi = stop[0] * spe + stop[1]
        per_row = self._tokens_per_row()
        shares = []
        for piece, given, promised in pieces.delivered(lo, hi) if hi > lo else []:
            period = sum(piece.quotas)
            shares.append(
                MixShare(
                    piece.step,
                    {n: q / period for n, q in zip(self.names, piece.quotas, strict=True)},
                    {n: int(g) for n, g in zip(self.names, given, strict=True)},
                    {n: float(p) for n, p in zip(self.names, promised, strict=True)},
                    {
                        n: None if t is None else float(g) * t
                        for n, g, t in zip(self.names, given, per_row, strict=True)
                    },
                )
            )
        return shares

    def _tokens_per_row(self) -> list[float | None]:
        """Each source's tokens per row, where known (packed: ``seq_len``; ``weights_by=
        "tokens"``: the measured mean)."""
        out: list[float | None] = []
        for k, source in enumerate(self.sources):
            packing = source.source.facts.packing
            if packing is not None:
                out.append(float(packing.seq_len))
            else:
                out.append(self.mix.tokens_per_row[k] if self.mix.tokens_per_row else None)
        return out

    def resumed(
        self, state: dict[str, Any], allow_changes: tuple[str, ...]
    ) -> tuple[MixedSource, int]:
        """The rows that continue ``state`` and the sample to resume at. The same schedule:
        the state's run (its feedback, and the piece in force where it stands), anchored at
        its position when the batching changed. Another schedule or first stage (with
        ``allow_changes=("weights",)``): a new piece there with the new weights, every source
        continuing exactly where the state left it. Pure: a refused state changes no loader.
        States of other sources or settings come back as they are, for the usual checks to
        name the difference."""
        saved, current = state["order"].get("mix"), self.mix.settings()
        if saved is None:
            return self, state["sample"]
        if {k: v for k, v in saved.items() if k not in RUN_KEYS} != {
            k: v for k, v in current.items() if k not in RUN_KEYS
        }:
            return self, state["sample"]  # other sources or settings: the usual checks
        batching = (state["batch_size"] * state["world_size"], state["drop_last"])
        if saved == current and (self.global_batch is None or batching == self._batching):
            return self, state["sample"]  # this run, at a place of its own batching
        run = saved_run(self.mix.run, saved)
        spe = state["order"]["rows"]
        steps, pieces = run.pieces(spe, *batching)
        at = state["epoch"] * spe + state["sample"]
        same = run.schedule.settings() == current["schedule"]
        if same and saved["quotas"] == current["quotas"]:
            if batching != self._batching:
                run = run.continued_at(steps, at, pieces)  # steps on: the new batching's
            return self._with_run(run), state["sample"]
        if "weights" not in allow_changes:
            raise StateMismatchError(
                f"cannot load this state into this loader: the state's mix has other weights "
                f"(first stage quotas {saved['quotas']}, schedule {run.schedule.settings()}) "
                f"than this one ({current['quotas']}, {current['schedule']}). Pass "
                "allow_changes=('weights',) to continue every source exactly where the state "
                "left it with the new weights"
            )
        consumed = tuple(int(c) for c in pieces.consumed(pieces.at(at), at))
        sample = min(state["sample"], self.mix.samples_per_epoch)
        new = dataclasses.replace(
            run.continued_at(steps, at, pieces),  # the feedback that still matters
            schedule=self.mix.run.schedule,
            anchor_index=state["epoch"] * self.mix.samples_per_epoch + sample,
        )
        piece = Piece(new.anchor_step, new.anchor_index, new.quotas(new.anchor_step), consumed)
        return self._with_run(dataclasses.replace(new, piece=piece)), sample

    def locate(self, stream: np.ndarray, strict: bool = False) -> Runs:
        """The :class:`Runs` of indices into the mixed endless stream (see :func:`locate`; a
        mix whose weights change: :meth:`Pieces.locate`, ``strict`` for the ledger)."""
        mix = self.mix
        if self.simple:
            base = list(mix.run.piece.base)
            return locate(mix.interleave, mix.samples_per_epoch, mix.per_epoch, base, stream)
        return self._placed_steps()[1].locate(stream, strict)

    def stream(self, positions: np.ndarray, epoch: int) -> np.ndarray:
        """The indices into the endless stream of samples ``positions`` of mix epoch ``epoch``."""
        positions = np.asarray(positions, dtype=np.int64)
        return positions + epoch * self.mix.samples_per_epoch

    def read_rows(self, positions: np.ndarray, epoch: int = 0) -> Read:
        """The mixed samples ``positions`` of epoch ``epoch``, as the run's newest weights
        place them (a feedback call after the stream began: ``with_weights``; its steps, and
        so its samples, are past what was read before it)."""
        runs = self._newest[0].locate(self.stream(positions, epoch))
        if not len(runs.source):
            return Read(self.schema_table())
        parts: list[pa.Table] = []
        wheres: list[np.ndarray | None] = []
        io_bytes = iops = cached = damaged = 0
        decode_s = 0.0
        fills = 0
        for k in range(len(self.names)):
            index = runs.indices(k)
            if not len(index):
                parts.append(self.schema_table())
                wheres.append(None)
                continue
            # Without a transform each row is read once, sorted and unique: mixed_rows puts
            # every row in its mixed place, moving it once.
            read, where = _read_ascending(self.sources[k], index)
            io_bytes, iops = io_bytes + read.io_bytes, iops + read.io_iops
            cached += read.rows_cached
            damaged += read.cache_damaged
            decode_s += read.decode_s
            fills += read.cache_fills
            table = self._conform(k, as_table(read.rows))
            if self.mix.source_column:
                label = self.mix.labels[k]
                table = table.append_column(
                    self.mix.source_column, pa.array(np.full(len(table), label, np.int16))
                )
            parts.append(table)
            wheres.append(where)
        return Read(
            mixed_rows(parts, wheres, runs), io_bytes, iops, cached, damaged, decode_s, fills
        )

    def _conform(self, k: int, table: pa.Table) -> pa.Table:
        """Source ``k``'s rows (transformed already), checked against the common schema."""
        name = self.names[k]
        base = self.mix.schema
        if self.mix.source_column:
            base = base.remove(base.get_field_index(self.mix.source_column))
        if not table.schema.equals(base):
            try:
                return table.select(base.names).cast(base)
            except (KeyError, pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise ValueError(
                    f"mix source {name!r} gives columns {schema_text(table.schema)}, the mix's "
                    f"are {schema_text(base)} (those of source {self.names[self.mix.labels.index(0)]!r}); make its "
                    f"transform return the same columns and types ({exc})"
                ) from None
        return table

    def lineage(self, positions: np.ndarray, epoch: int = 0) -> dict[str, Any]:
        """The ledger's columns: each sample's source (name), its place in that source's own
        stream of epochs, its source's share in the piece of weights that drew it, and the
        source's lineage of the row."""
        stream = self.stream(positions, epoch)
        runs = self.locate(stream, strict=True)
        which = np.repeat(runs.source, runs.length)
        n = len(which)
        index = np.repeat(
            runs.index - (np.cumsum(runs.length) - runs.length), runs.length
        ) + np.arange(n)
        out: dict[str, Any] = {
            "source": np.array(self.names, dtype=object)[which].tolist(),
            "source_epoch": np.zeros(n, np.int64),
            "source_sample": np.zeros(n, np.int64),
            "source_weight": (
                np.asarray(list(self.mix.weights.values()))[which]
                if self.simple
                else self._placed_steps()[1].shares_at(stream, which)
            ),
        }
        parts: list[tuple[np.ndarray, dict[str, Any]]] = []
        for k, ordered in enumerate(self.sources):
            at = np.flatnonzero(which == k)
            if len(at):
                epochs, sample, rows = ordered.positions(index[at])
                out["source_epoch"][at], out["source_sample"][at] = epochs, sample
                parts.append(
                    (
                        at,
                        ordered.source.lineage(rows, int(epochs[0]))
                        if epochs[0] == epochs[-1]
                        else _lineage_by_epoch(ordered.source, rows, epochs),
                    )
                )
        return {**out, **_placed(parts, n)}

    def schema_table(self) -> pa.Table:
        return empty_table(self.schema)

    def describe_rows(self, positions: np.ndarray) -> str:
        runs, parts = self.locate(self.stream(positions, 0)), []
        for k in range(len(self.names)):
            index = runs.indices(k)
            if not len(index):
                continue
            parts.append(
                f"{len(index)} from {self.names[k]!r} (its samples "
                f"{index[:4].tolist()}{'...' if len(index) > 4 else ''})"
            )
        return "mixed samples: " + ", ".join(parts)

    def __repr__(self) -> str:
        return repr(self.mix)


def check_ranks_agree(digest: str, step: int) -> None:
    """With ``torch.distributed`` initialised on several ranks, one small all-gather: every
    rank's digest of its feedback calls after a call for ``step`` must be the same, else the
    ranks would mix differently (``Loader.set_weights``). Without it, nothing to check here:
    the states' digests differ (compare them)."""
    torch = sys.modules.get("torch")
    dist = getattr(torch, "distributed", None)
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return
    if dist.get_world_size() < 2:
        return
    digests: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(digests, digest)
    differ = [r for r, d in enumerate(digests) if d != digests[0]]
    if differ:
        raise ValueError(
            f"set_weights(step={step}): ranks {differ} made other weight calls than rank 0 "
            f"(digests {digests[0]} and {digests[differ[0]]}): every rank must pass the same "
            "weights for the same step, e.g. computed from losses reduced across ranks"
        )


def _read_ascending(source: Any, index: np.ndarray) -> tuple[Read, np.ndarray | None]:
    """``source.read_stream`` of stream indices in any order (it takes them ascending): a read
    that is not in stream order (a short last batch padded from the epoch's start) is read
    sorted, and each index's row is found through the sort."""
    if len(index) < 2 or bool(np.all(index[1:] >= index[:-1])):
        return source.read_stream(index)
    order = np.argsort(index, kind="stable")
    read, where = source.read_stream(index[order])
    rows = np.arange(len(index)) if where is None else where
    placed = np.empty(len(index), np.int64)
    placed[order] = rows
    return read, placed


def _lineage_by_epoch(source: Any, positions: np.ndarray, epochs: np.ndarray) -> dict[str, Any]:
    """A source's lineage of rows read over several of its epochs (each part for its epoch)."""
    parts = [
        (np.flatnonzero(epochs == e), source.lineage(positions[epochs == e], e))
        for e in np.unique(epochs).tolist()
    ]
    return _placed(parts, len(positions))


def _placed(parts: list[tuple[np.ndarray, dict[str, Any]]], n: int) -> dict[str, pa.Array]:
    """Columns of ``n`` rows from parts that each give some columns for rows ``at``: a column a
    part lacks is null for its rows (sources of different kinds report different columns)."""
    if not parts:  # no rows: the columns every lineage has, empty
        return {
            "uri": pa.array([], pa.string()),
            "version": pa.array([], pa.int64()),
            "position": pa.array([], pa.int64()),
        }
    names = list(dict.fromkeys(name for _, columns in parts for name in columns))
    back = np.empty(n, np.int64)
    back[np.concatenate([at for at, _ in parts])] = np.arange(n)
    out = {}
    for name in names:
        given = [_array(c[name]) for _, c in parts if name in c]
        typ = given[0].type
        arrays = [
            _array(c[name]).cast(typ) if name in c else pa.nulls(len(at), typ) for at, c in parts
        ]
        out[name] = pa.concat_arrays(arrays).take(pa.array(back))
    return out


def _array(value: Any) -> pa.Array:
    if isinstance(value, pa.ChunkedArray):
        return value.combine_chunks()
    return value if isinstance(value, pa.Array) else pa.array(value)
