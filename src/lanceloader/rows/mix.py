"""Mix: one stream whose samples come from several sources in set proportions, exactly.

``Loader(ll.Mix({"web": web, "code": code}, weights={"web": 0.7, "code": 0.3}), ...)`` reads a
*mixed stream*: global sample *j* of mix epoch *e* comes from one source, chosen by a fixed
interleave, and is that source's next sample in its own order. Everything is a pure function of
``(e, j)``, so a slice of the stream is computed directly and a resume is O(1) on any world size.

**The interleave** (:mod:`lanceloader.ordering.interleave`): the weights are made rational,
``q_k / P`` (``P`` at most 65,536; :attr:`Mix.weights` shows what is used; a positive weight too
small to get one slot is refused), and one period is scheduled earliest-deadline-first, so after
*any* ``n`` samples of an epoch each source has contributed ``n q_k / P`` samples within ±1. A mix
is identified by its sources' *names*: they are scheduled in sorted order, so listing the same
sources in another order is the same mix (and resumes the same stream).

**Runs.** With ``run_length=r`` the interleave schedules runs of ``r`` consecutive samples
instead of single samples (exact within ±1 run, i.e. ±r samples). ``r`` equal to the Loader's
``batch_size`` gives every batch from one source (MosaicML's ``per_stream`` batching); runs of
at least :data:`~lanceloader.rows.placement.MIN_SLICE_ROWS` rows are handed out as slices of that source's read instead of
copied into mixed order (no copy: a batch within a run is a slice of its source's rows).

**Each source's own stream.** A source is a ``Loader`` (its rows: dataset, filter, split,
columns, cache or packing; its order and seed; its row-preserving transform; its batch size,
workers and output are the mix's loader's business and not used) or a URI, read as an
:class:`~lanceloader.rows.ordered.OrderedSource`. Its samples form an endless stream: its epoch 0 in its own
order, then its epoch 1 in a new order, and so on. Mix epoch *e* takes the next ``C_k`` samples of
source *k*'s stream, where ``C_k`` is that source's count in a whole mix epoch: a small source
repeats, each time in a fresh order (oversampling); a large one continues where the last mix
epoch stopped, so no row is seen twice before every row is seen once.

**Epoch length** (``samples_per_epoch``): a number; ``"first_exhausted"`` (default): the epoch
ends before any source would repeat a row, i.e. when the first source has given all its rows;
``"all_exhausted"``: when the last one has (the others oversampled).

**Weights that change during a run.** ``weights=ll.Schedule({0: {...}, 1000: {...}},
ramps={1000: 200})`` gives weights per stage from a global step on, with linear ramps (one
constant piece a step), and ``Loader.set_weights(weights, step=s)`` sets them from the
training loop (recorded in the state). The stream is then a chain of constant-weight pieces,
each continuing every source's stream exactly (:mod:`lanceloader.ordering.pieces`); the epoch
length is the first stage's. See the guide's "Weights that change during a run".

**Changing weights at a resume.** ``loader.load_state_dict(state, allow_changes=("weights",))``
continues with new weights (or another schedule): every source continues its own stream
exactly where the checkpoint left it (no row lost or repeated); a new piece starts at the
checkpoint's sample, so each source's count from there is within ±1 of its new share; the
epoch keeps its number and takes the new weights' length (a checkpoint past that length ends
the epoch). The state records the weights and where each source stood
(``state["order"]["mix"]``: :mod:`lanceloader.ordering.mixrun`).

Example::

    >>> import tempfile
    >>> from lanceloader.demo import write_demo_dataset
    >>> from lanceloader.loader import Loader
    >>> a = write_demo_dataset(tempfile.mkdtemp() + "/a.lance", rows=8)
    >>> b = write_demo_dataset(tempfile.mkdtemp() + "/b.lance", rows=100)
    >>> mix = Mix({"a": Loader(a, columns=["id"]), "b": Loader(b, columns=["id"])},
    ...           weights={"a": 1, "b": 3}, samples_per_epoch=12, source_column="source")
    >>> [batch["source"].tolist() for batch in Loader(mix, batch_size=4)]
    [[1, 1, 0, 1], [1, 1, 0, 1], [1, 1, 0, 1]]
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from lanceloader.ordering.interleave import Interleave, check_weights
from lanceloader.ordering.mixrun import MixRun, check_finest
from lanceloader.ordering.order import Order
from lanceloader.ordering.schedule import Schedule
from lanceloader.rows.lance.source import Source
from lanceloader.rows.mixed import MixedSource, schema_text
from lanceloader.rows.ordered import OrderedSource, mean_tokens

EPOCH_LENGTHS = ("first_exhausted", "all_exhausted")


def ordered_source(name: str, source: Any) -> OrderedSource:
    """A mix source as an :class:`OrderedSource`: a Loader's rows, order and transform
    (``Loader.ordered_source``), or a URI read in storage order."""
    if hasattr(source, "ordered_source"):
        return source.ordered_source(name)
    if isinstance(source, str | bytes) or hasattr(source, "__fspath__"):
        rows = Source(source)
        return OrderedSource(name, rows, Order(rows.num_rows))
    raise TypeError(f"mix source {name!r} must be a Loader or a URI, got {type(source).__name__}")


class Mix:
    """Several sources read as one stream in fixed proportions: pass it to ``Loader``.

    Args:
        sources: ``{name: Loader or URI}``. A ``Loader`` contributes what to read and in which
            order (dataset, version, filter, split, columns, ``shuffle``, block size, seed) and
            its ``transform``, which runs on that source's rows in the worker and must keep
            every row (use it to rename or cast to the common schema). Every source must end up
            with the same columns and types.
        weights: ``{name: weight}`` (any positive scale; 0 leaves a source out); default
            equal. Or an :class:`~lanceloader.ordering.schedule.Schedule` of such weights by
            global step (stages and linear ramps); the first stage sets the epoch's length.
        samples_per_epoch: mixed samples per epoch, or ``"first_exhausted"`` (default) or
            ``"all_exhausted"`` (see the module docstring).
        weights_by: ``"samples"`` (default) or ``"tokens"``: the weights are shares of tokens,
            made shares of samples with each source's mean tokens per row (measured on up to
            4,096 rows spread over it, from ``token_column``).
        token_column: the list (or string) column whose length counts a row's tokens.
        source_column: add a column of that name holding each sample's source number (its
            place in ``sources`` as given), e.g. for a loss per source.
        run_length: consecutive samples that come from one source (default 1: the sources
            alternate sample by sample). Set it to the Loader's ``batch_size`` and every batch
            comes from one source, in the same exact proportions counted in batches (MosaicML's
            ``per_stream`` batching); runs of 64 rows or more are handed out as slices of
            the sources' reads instead of copied into mixed order.

    >>> mix = Mix({"a": "a.lance", "b": "b.lance"}, weights={"a": 3, "b": 1})  # doctest: +SKIP
    >>> loader = Loader(mix, batch_size=256)                                    # doctest: +SKIP
    >>> staged = Schedule({0: {"a": 3, "b": 1}, 1000: {"a": 1, "b": 1}}, ramps={1000: 100})
    >>> mix = Mix({"a": "a.lance", "b": "b.lance"}, weights=staged)            # doctest: +SKIP
    """

    def __init__(
        self,
        sources: Mapping[str, Any],
        weights: Mapping[str, float] | None = None,
        *,
        samples_per_epoch: int | str = "first_exhausted",
        weights_by: str = "samples",
        token_column: str | None = None,
        source_column: str | None = None,
        run_length: int = 1,
    ) -> None:
        if not isinstance(sources, Mapping) or not sources:
            raise ValueError("Mix needs a dict {name: Loader or URI} of at least one source")
        given = [str(n) for n in sources]
        self.names = sorted(given)  # the mix is its names, not their order
        self.labels = [given.index(n) for n in self.names]  # source_column's numbers
        schedule = checked_schedule(weights, given)
        if weights_by not in ("samples", "tokens"):
            raise ValueError(f"weights_by must be 'samples' or 'tokens', got {weights_by!r}")
        if weights_by == "tokens" and not token_column:
            raise ValueError(
                "weights_by='tokens' needs token_column=, the column whose length "
                "counts a row's tokens (e.g. 'input_ids')"
            )
        if isinstance(run_length, bool) or not isinstance(run_length, int) or run_length < 1:
            raise ValueError(
                f"run_length must be a whole number >= 1 (samples in a row from one "
                f"source; the Loader's batch_size for one source per batch), got "
                f"{run_length!r}"
            )
        by_name = {str(n): s for n, s in sources.items()}
        self.sources = [ordered_source(n, by_name[n]) for n in self.names]
        self.source_column = source_column
        self.rows = [s.num_rows for s in self.sources]
        tokens = (
            tuple(float(mean_tokens(s.source, token_column)) for s in self.sources)
            if weights_by == "tokens"
            else ()
        )
        self.tokens_per_row = tokens
        for _, stage in schedule.stages:  # as shares of samples: each must get a slot
            check_finest(
                {
                    n: stage[n] / tokens[k] if tokens and stage[n] else stage[n]
                    for k, n in enumerate(self.names)
                }
            )
        self.run = MixRun.start(tuple(self.names), schedule, tokens, run_length)
        quotas = self.run.piece.quotas
        self.interleave = Interleave(tuple(quotas), run_length)
        self.samples_per_epoch = self._epoch_length(samples_per_epoch)
        self.epoch_length = samples_per_epoch
        self.per_epoch = self.interleave.counts(self.samples_per_epoch)
        self._sources_settings = {s.name: s.settings() for s in self.sources}
        self.schema = self._common_schema()
        self.window_samples = self._window_samples()

    @property
    def weights(self) -> dict[str, float]:
        """The share of samples each source has, as used (rational, see the module docstring)."""
        period = self.interleave.period
        return {n: q / period for n, q in zip(self.names, self.interleave.quotas, strict=True)}

    def _epoch_length(self, spec: int | str) -> int:
        il, rows = self.interleave, self.rows
        used = [k for k, q in enumerate(il.quotas) if q]
        empty = [self.names[k] for k in used if rows[k] == 0]
        if empty:
            raise ValueError(
                f"source {empty[0]!r} has no rows (after its filter and split); "
                "give it weight 0 or remove it"
            )
        if spec == "first_exhausted":
            return min(il.position_of(k, rows[k]) for k in used)
        if spec == "all_exhausted":
            return max(il.position_of(k, rows[k] - 1) + 1 for k in used)
        if isinstance(spec, bool) or not isinstance(spec, int) or spec < 1:
            raise ValueError(
                f"samples_per_epoch must be a number >= 1 or one of {EPOCH_LENGTHS}, got {spec!r}"
            )
        return spec

    def _window_samples(self) -> int | None:
        """Mixed samples in which every block-shuffled source gives whole windows of its order
        (``Order.window_rows``), or ``None`` if no source has windows. Reads of whole units fetch
        whole blocks of each source; a read cutting a source's window fetches a part of each of
        its blocks, read again by the next read (docs/performance.md, "The mix's reads")."""
        il, units = self.interleave, []
        for k, source in enumerate(self.sources):
            window = source.order.window_rows
            if window and il.quotas[k]:  # multiples of the window at whole periods of slots
                units.append(window // math.gcd(il.quotas[k] * il.run, window))
        return il.period * il.run * math.lcm(*units) if units else None

    def _common_schema(self) -> pa.Schema:
        """The first source's (as given) columns as it delivers them (its transform's output,
        if any), so a first source that renames or casts sets the schema the others conform
        to."""
        first = self.sources[self.labels.index(0)]
        schema = first.schema_table().schema
        if not any(s.transform for s in self.sources):
            for s in self.sources:
                other = s.schema_table().schema
                if not other.equals(schema):
                    raise ValueError(
                        f"sources {first.name!r} and {s.name!r} have different columns: "
                        f"{schema_text(schema)} vs {schema_text(other)}; choose common "
                        "columns with each source Loader's columns=, or give a source a "
                        "transform that renames or casts its columns to the common schema"
                    )
        if self.source_column:
            schema = schema.append(pa.field(self.source_column, pa.int16()))
        return schema

    def settings(self) -> dict[str, Any]:
        """What defines the mixed stream (``state["order"]["mix"]``): each source's identity,
        version and order, the first stage's quotas, the epoch length, and the run's weights
        (schedule, feedback, anchor, digest: :mod:`lanceloader.ordering.mixrun`)."""
        return {
            "sources": self._sources_settings,
            "quotas": dict(zip(self.names, self.interleave.quotas, strict=True)),
            "epoch": self.epoch_length if isinstance(self.epoch_length, str) else "fixed",
            "source_column": self.source_column,
            "run_length": self.interleave.run,
            **self.run.settings(),
        }

    def with_run(self, run: MixRun) -> Mix:
        """This mix with another run of weights (a resume, a feedback call): nothing is
        measured or read again."""
        mix = copy.copy(self)
        mix.run = run
        return mix

    def source(self, global_batch: int | None = None, drop_last: bool = False) -> MixedSource:
        """The mix's rows (the rows protocol), as a Loader reads them with ``global_batch``
        samples a step (ranks x batch size): a schedule's steps are placed with it."""
        return MixedSource(self, global_batch, drop_last)

    def __repr__(self) -> str:
        shares = ", ".join(f"{n}: {w:.3g}" for n, w in self.weights.items())
        run = f", run_length={self.interleave.run}" if self.interleave.run > 1 else ""
        stages = len(self.run.schedule.stages)
        later = f", {stages - 1} later stage(s)" if stages > 1 else ""
        return f"Mix({{{shares}}}{later}, samples_per_epoch={self.samples_per_epoch}{run})"


def checked_schedule(weights: Any, names: list[str]) -> Schedule:
    """``weights`` (a dict, a :class:`Schedule` or None: equal) as a schedule whose every
    stage gives a weight per source, or an error naming the stage and the fix."""
    if not isinstance(weights, Schedule):
        return Schedule({0: check_weights(weights, names)})
    stages = []
    for step, stage in weights.stages:
        try:
            checked = check_weights(stage, names)
            check_finest(checked)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"the schedule's stage at step {step}: {exc}") from None
        stages.append((step, checked))
    return Schedule(stages, weights.ramps)
