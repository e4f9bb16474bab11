"""Mix: one stream whose samples come from several sources in set proportions, exactly.

``Loader(ll.Mix({"web": web, "code": code}, weights={"web": 0.7, "code": 0.3}), ...)`` reads a
*mixed stream*: global sample *j* of mix epoch *e* comes from one source, chosen by a fixed
interleave, and is that source's next sample in its own order. Everything is a pure function of
``(e, j)``, so a slice of the stream is computed directly and a resume is O(1) on any world size.

**The interleave.** The weights are made rational, ``q_k / P`` (``P`` at most
:data:`MAX_PERIOD`; :attr:`Mix.weights` shows what is used). One period of ``P`` slots is
scheduled earliest-deadline-first: the *i*-th sample of source *k* must come after slot
``(i - 1) P / q_k`` and by slot ``i P / q_k``. Such a schedule exists (Tijdeman's chairman
assignment theorem) and EDF finds one, so after *any* ``n`` samples of an epoch each source has
contributed ``n q_k / P`` samples within ±1 (strictly). The period repeats, so the count of source
*k* before sample *j* is ``(j // P) q_k + prefix[j % P, k]``: one table lookup.

**Runs.** With ``run_length=r`` the interleave schedules runs of ``r`` consecutive samples
instead of single samples (exact within ±1 run, i.e. ±r samples). ``r`` equal to the Loader's
``batch_size`` gives every batch from one source (MosaicML's ``per_stream`` batching); runs of
at least :data:`MIN_SLICE_ROWS` rows are handed out as slices of that source's read instead of
copied into mixed order (no copy: a batch within a run is a slice of its source's rows).

**Each source's own stream.** A source is a ``Loader`` (its dataset, filter, split, columns,
order, seed and per-source transform; its batch size, workers and output are the mix's loader's
business and not used) or a URI. Its samples form an endless stream: its epoch 0 in its own
order, then its epoch 1 in a new order, and so on. Mix epoch *e* takes the next ``C_k`` samples of
source *k*'s stream, where ``C_k`` is that source's count in a whole mix epoch: a small source
repeats, each time in a fresh order (oversampling); a large one continues where the last mix
epoch stopped, so no row is seen twice before every row is seen once.

**Epoch length** (``samples_per_epoch``): a number; ``"first_exhausted"`` (default): the epoch
ends before any source would repeat a row, i.e. when the first source has given all its rows;
``"all_exhausted"``: when the last one has (the others oversampled).

**Changing weights at a resume.** ``loader.load_state_dict(state, allow_changes=("weights",))``
continues with new weights: every source continues its own stream exactly where the checkpoint
left it (no row lost or repeated); the new interleave applies from the checkpoint's sample on, so
within the rest of that epoch each source's count since the checkpoint is within ±2 of its new
share (±1 from the next epoch on); the epoch keeps its number and takes the new weights' length
(a checkpoint past that length ends the epoch). The state records the new weights and the
per-source offsets that make this exact (``state["order"]["mix"]``).

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
import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lanceloader.order import Order
from lanceloader.source import Pieces, as_table, sorted_unique, to_record_batch
from lanceloader.state import fingerprint, order_settings
from lanceloader.transforms import TransformOutputError, transform_name

MAX_PERIOD = 1 << 16  # slots of one interleave period at most: a 65,536 x sources table
TOKEN_SAMPLE_ROWS = 4096  # rows read to measure a source's mean tokens per row (weights_by)
EPOCH_LENGTHS = ("first_exhausted", "all_exhausted")
# Mixed rows are runs of the sources' reads (no copy) when their runs average this many rows: a
# run costs ~2 us to hand out, copying its rows ~70 ns a row of 264 B.
MIN_SLICE_ROWS = 64


def rational_weights(weights: list[float]) -> list[int]:
    """Integer quotas ``q_k`` proportional to ``weights``, summing to the period ``P``: exact for
    rational weights with a small common denominator (0.7/0.2/0.1 gives 7, 2, 1), else the
    largest-remainder rounding to ``P = MAX_PERIOD``.

    >>> rational_weights([0.7, 0.2, 0.1]), rational_weights([1, 1, 1]), rational_weights([2, 0])
    ([7, 2, 1], [1, 1, 1], [1, 0])
    """
    total = sum(Fraction(w) for w in weights)
    shares = [(Fraction(w) / total).limit_denominator(MAX_PERIOD) for w in weights]
    period = math.lcm(*(s.denominator for s in shares))
    if sum(shares) == 1 and period <= MAX_PERIOD:
        return [int(s * period) for s in shares]
    exact = [Fraction(w) / total * MAX_PERIOD for w in weights]
    quotas = [math.floor(x) for x in exact]
    by_remainder = sorted(range(len(weights)), key=lambda k: quotas[k] - exact[k])
    for k in by_remainder[: MAX_PERIOD - sum(quotas)]:
        quotas[k] += 1
    return quotas


@functools.lru_cache(maxsize=64)
def interleave(quotas: tuple[int, ...]) -> np.ndarray:
    """One period of the interleave: the source of each of the ``sum(quotas)`` slots.

    Earliest deadline first over the sources' next samples that are due: after slot *t* source
    *k* has given ``t q_k / P`` samples within ±1, at every *t* (see the module docstring).

    >>> interleave((2, 1)).tolist(), interleave((1, 1, 2)).tolist()
    ([0, 0, 1], [2, 0, 1, 2])
    """
    period = sum(quotas)
    given = [0] * len(quotas)
    slots = np.empty(period, np.int32)
    for t in range(1, period + 1):
        best, due = -1, 0
        for k, q in enumerate(quotas):
            c = given[k]
            if c < q and c * period < t * q:  # released: its sample may come at slot t
                deadline = -(-(c + 1) * period // q)
                if best < 0 or deadline < due:
                    best, due = k, deadline
        slots[t - 1] = best
        given[best] += 1
    return slots


@dataclass(frozen=True)
class Interleave:
    """The counts of a periodic interleave: which source each mixed sample comes from, and how
    many samples of each source precede it. Pure and O(1) per sample.

    ``run`` consecutive samples form one slot (``run=1``: each sample is a slot): the
    interleave schedules runs, so each source's count is exact within ±1 run.

    >>> il = Interleave((2, 1))
    >>> il.source_of(np.arange(6)).tolist(), il.count(1, np.array([0, 3, 6])).tolist()
    ([0, 0, 1, 0, 0, 1], [0, 1, 2])
    >>> runs = Interleave((2, 1), run=2)
    >>> runs.source_of(np.arange(6)).tolist(), runs.count(1, np.array([4, 5, 6])).tolist()
    ([0, 0, 0, 0, 1, 1], [0, 1, 2])
    """

    quotas: tuple[int, ...]
    run: int = 1

    @property
    def period(self) -> int:
        """Slots of one period (``sum(quotas)``; ``run`` samples each)."""
        return sum(self.quotas)

    @functools.cached_property
    def _prefix(self) -> np.ndarray:
        slots = interleave(self.quotas)
        onehot = np.zeros((self.period + 1, len(self.quotas)), np.int64)
        onehot[np.arange(1, self.period + 1), slots] = 1
        return np.cumsum(onehot, axis=0)

    def source_of(self, samples: np.ndarray) -> np.ndarray:
        return interleave(self.quotas)[(np.asarray(samples) // self.run) % self.period]

    def count(self, k: int, n: np.ndarray | int) -> np.ndarray:
        """Samples of source ``k`` among the first ``n`` mixed samples."""
        slots, rest = np.divmod(np.asarray(n, dtype=np.int64), self.run)
        whole = (slots // self.period) * self.quotas[k] + self._prefix[slots % self.period, k]
        if self.run == 1:
            return whole
        inside = interleave(self.quotas)[slots % self.period] == k  # the slot n lies in
        return whole * self.run + np.where(inside, rest, 0)

    def counts(self, n: int) -> list[int]:
        return [int(self.count(k, n)) for k in range(len(self.quotas))]

    def position_of(self, k: int, i: int) -> int:
        """The mixed sample that is source ``k``'s ``i``-th (0-based)."""
        slots = np.flatnonzero(interleave(self.quotas) == k)
        slot, rest = divmod(i, self.run)
        full, nth = divmod(slot, self.quotas[k])
        return (full * self.period + int(slots[nth])) * self.run + rest


class Mix:
    """Several sources read as one stream in fixed proportions: pass it to ``Loader``.

    Args:
        sources: ``{name: Loader or URI}``. A ``Loader`` contributes what to read and in which
            order (dataset, version, filter, split, columns, ``shuffle``, block size, seed) and
            its ``transform``, which runs on that source's rows in the worker and must keep
            every row (use it to rename or cast to the common schema). Every source must end up
            with the same columns and types.
        weights: ``{name: weight}`` (any positive scale; 0 leaves a source out); default equal.
        samples_per_epoch: mixed samples per epoch, or ``"first_exhausted"`` (default) or
            ``"all_exhausted"`` (see the module docstring).
        weights_by: ``"samples"`` (default) or ``"tokens"``: the weights are shares of tokens,
            made shares of samples with each source's mean tokens per row (measured on up to
            4,096 rows spread over it, from ``token_column``).
        token_column: the list (or string) column whose length counts a row's tokens.
        source_column: add a column of that name holding each sample's source number (its
            place in ``sources``), e.g. for a loss per source.
        run_length: consecutive samples that come from one source (default 1: the sources
            alternate sample by sample). Set it to the Loader's ``batch_size`` and every batch
            comes from one source, in the same exact proportions counted in batches (MosaicML's
            ``per_stream`` batching); runs of 64 rows or more are handed out as slices of
            the sources' reads instead of copied into mixed order.

    >>> mix = Mix({"a": "a.lance", "b": "b.lance"}, weights={"a": 3, "b": 1})  # doctest: +SKIP
    >>> loader = Loader(mix, batch_size=256)                                    # doctest: +SKIP
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
        from lanceloader.loader import Loader  # a Loader reads a Mix; a Mix holds Loaders

        if not isinstance(sources, Mapping) or not sources:
            raise ValueError("Mix needs a dict {name: Loader or URI} of at least one source")
        self.names = [str(n) for n in sources]
        weights = dict(weights) if weights is not None else dict.fromkeys(self.names, 1)
        if set(weights) != set(self.names):
            raise ValueError(f"weights name {sorted(weights)}, sources name {self.names}: give "
                             "one weight per source (0 leaves a source out)")
        bad = {n: w for n, w in weights.items()
               if isinstance(w, bool) or not isinstance(w, int | float) or w < 0 or w != w}
        if bad or not any(weights.values()):
            raise ValueError(f"weights must be numbers >= 0, not all 0; got {weights}")
        if weights_by not in ("samples", "tokens"):
            raise ValueError(f"weights_by must be 'samples' or 'tokens', got {weights_by!r}")
        if weights_by == "tokens" and not token_column:
            raise ValueError("weights_by='tokens' needs token_column=, the column whose length "
                             "counts a row's tokens (e.g. 'input_ids')")
        if isinstance(run_length, bool) or not isinstance(run_length, int) or run_length < 1:
            raise ValueError(f"run_length must be a whole number >= 1 (samples in a row from one "
                             f"source; the Loader's batch_size for one source per batch), got "
                             f"{run_length!r}")
        self.loaders = {n: s if isinstance(s, Loader) else Loader(s) for n, s in sources.items()}
        self.source_column = source_column
        self.rows = [self.loaders[n].source.num_rows for n in self.names]
        per_sample = [float(weights[n]) for n in self.names]
        if weights_by == "tokens":
            tokens = [mean_tokens(self.loaders[n].source, token_column) for n in self.names]
            per_sample = [w / t if w else 0.0 for w, t in zip(per_sample, tokens, strict=True)]
        self.interleave = Interleave(tuple(rational_weights(per_sample)), run_length)
        self.samples_per_epoch = self._epoch_length(samples_per_epoch)
        self.epoch_length = samples_per_epoch
        self.per_epoch = self.interleave.counts(self.samples_per_epoch)
        self.offsets = [0] * len(self.names)  # shifts of the sources' streams (with_offsets)
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
            raise ValueError(f"source {empty[0]!r} has no rows (after its filter and split); "
                             "give it weight 0 or remove it")
        if spec == "first_exhausted":
            return min(il.position_of(k, rows[k]) for k in used)
        if spec == "all_exhausted":
            return max(il.position_of(k, rows[k] - 1) + 1 for k in used)
        if isinstance(spec, bool) or not isinstance(spec, int) or spec < 1:
            raise ValueError(f"samples_per_epoch must be a number >= 1 or one of {EPOCH_LENGTHS}, "
                             f"got {spec!r}")
        return spec

    def _window_samples(self) -> int | None:
        """Mixed samples in which every block-shuffled source gives whole windows of its order
        (``Order.window_rows``), or ``None`` if no source has windows. Reads of whole units fetch
        whole blocks of each source; a read cutting a source's window fetches a part of each of
        its blocks, read again by the next read (3 sources of 8 blocks of 1,024 rows, unaligned:
        1.27x the bytes and 2x the requests of one source)."""
        il, units = self.interleave, []
        for k, n in enumerate(self.names):
            window = self.loaders[n].order.window_rows
            if window and il.quotas[k]:  # multiples of the window at whole periods of slots
                units.append(window // math.gcd(il.quotas[k] * il.run, window))
        return il.period * il.run * math.lcm(*units) if units else None

    def _common_schema(self) -> pa.Schema:
        """The first source's columns as it delivers them: its raw schema, or, when it has a
        transform, what that transform makes of its first row (one row read at construction),
        so a first source that renames or casts sets the schema the others conform to."""
        schemas = {n: self.loaders[n].source.schema_table().schema for n in self.names}
        first = self.names[0]
        if not any(self.loaders[n].transform for n in self.names):
            for n in self.names[1:]:
                if not schemas[n].equals(schemas[first]):
                    raise ValueError(
                        f"sources {first!r} and {n!r} have different columns: "
                        f"{_schema_text(schemas[first])} vs {_schema_text(schemas[n])}; choose "
                        "common columns with each source Loader's columns=, or give a source a "
                        "transform that renames or casts its columns to the common schema")
        schema = schemas[first]
        loader = self.loaders[first]
        if loader.transform is not None:
            rows = loader.source.read_table(np.arange(min(1, loader.source.num_rows)))
            schema = source_rows(loader.transform, first, rows).schema.remove_metadata()
        if self.source_column:
            schema = schema.append(pa.field(self.source_column, pa.int16()))
        return schema

    def settings(self) -> dict[str, Any]:
        """What defines the mixed stream (``state["order"]["mix"]``): each source's identity,
        version and order, the quotas, the epoch length and the offsets of a weight change."""
        sources = {}
        for n in self.names:
            src, order = self.loaders[n].source, self.loaders[n].order
            settings = order_settings(src, order)
            sources[n] = {"dataset": src.identity, "version": src.version,
                          "order": fingerprint(src.identity, src.version, settings)}
        return {
            "sources": sources,
            "quotas": dict(zip(self.names, self.interleave.quotas, strict=True)),
            "epoch": self.epoch_length if isinstance(self.epoch_length, str) else "fixed",
            "offsets": dict(zip(self.names, self.offsets, strict=True)),
            "source_column": self.source_column,
            "run_length": self.interleave.run,
        }

    def resumed(self, state: Mapping[str, Any]) -> tuple[Mix, int]:
        """This mix (new weights) continuing a checkpoint of a mix of the same sources (old
        weights): offsets that make each source continue its stream exactly where the state
        left it, and the sample to resume at (the epoch's end if the state lies past it)."""
        saved = state["order"]["mix"]
        if set(saved["sources"]) != set(self.names):
            raise ValueError(f"the state mixes sources {sorted(saved['sources'])}, this mix "
                             f"{sorted(self.names)}: only the weights may change")
        given = consumed(saved["quotas"], saved["offsets"], state["order"]["rows"],
                         state["epoch"], state["sample"], saved["run_length"])
        epoch, sample = state["epoch"], min(state["sample"], self.samples_per_epoch)
        offsets = {n: given[n] - epoch * self.per_epoch[k] - int(self.interleave.count(k, sample))
                   for k, n in enumerate(self.names)}
        return self.with_offsets(offsets), sample

    def with_offsets(self, offsets: Mapping[str, int]) -> Mix:
        """This mix with each source's stream shifted by ``offsets`` (what a weight change at a
        resume sets, and its later checkpoints carry)."""
        mix = copy.copy(self)  # the offsets alone differ: nothing is measured or read again
        mix.offsets = [int(offsets[n]) for n in self.names]
        return mix

    def source(self) -> MixedSource:
        return MixedSource(self)

    def __repr__(self) -> str:
        shares = ", ".join(f"{n}: {w:.3g}" for n, w in self.weights.items())
        run = f", run_length={self.interleave.run}" if self.interleave.run > 1 else ""
        return f"Mix({{{shares}}}, samples_per_epoch={self.samples_per_epoch}{run})"


def consumed(quotas: Mapping[str, int], offsets: Mapping[str, int], samples_per_epoch: int,
             epoch: int, sample: int, run_length: int = 1) -> dict[str, int]:
    """Samples of each source's stream taken before mixed sample ``sample`` of ``epoch``, by a
    mix of these quotas and offsets (``state["order"]["mix"]``): pure, so a state alone says
    where every source stands.

    >>> consumed({"a": 2, "b": 1}, {"a": 0, "b": 5}, samples_per_epoch=6, epoch=1, sample=3)
    {'a': 6, 'b': 8}
    """
    il = Interleave(tuple(quotas.values()), run_length)
    per_epoch = il.counts(samples_per_epoch)
    return {n: offsets[n] + epoch * per_epoch[k] + int(il.count(k, sample))
            for k, n in enumerate(quotas)}


def source_rows(transform: Any, name: str, table: pa.Table) -> pa.Table:
    """Mix source ``name``'s rows through its transform, which must return Arrow with every row
    it was given (else :class:`TransformOutputError`): used at construction (the first
    source's output sets the mix's schema) and on every read."""
    out = transform(to_record_batch(table))
    if not isinstance(out, pa.RecordBatch | pa.Table) or out.num_rows != table.num_rows:
        raise TransformOutputError(
            f"the transform {transform_name(transform)} of mix source {name!r} must return "
            f"Arrow with every row it was given ({table.num_rows}), got {type(out).__name__}: a "
            "source's transform conforms its rows to the common schema; put transforms that "
            "drop or add rows on the mix's Loader")
    return out if isinstance(out, pa.Table) else pa.Table.from_batches([out])


@dataclass(frozen=True)
class Runs:
    """A mixed read as runs, in stream order: run *i* is ``length[i]`` consecutive samples of
    source ``source[i]``'s endless stream from its sample ``index[i]`` on. ``spans``, for a
    read of consecutive mixed samples, is each source's ``(first index, count)``: its runs
    then continue each other.

    >>> runs = Runs(np.array([0, 0, 1]), np.array([5, 6, 0]), np.array([1, 2, 3])).merged()
    >>> runs.source.tolist(), runs.index.tolist(), runs.length.tolist(), runs.indices(0).tolist()
    ([0, 1], [5, 0], [3, 3], [5, 6, 7])
    """

    source: np.ndarray
    index: np.ndarray
    length: np.ndarray
    spans: tuple[tuple[int, int], ...] | None = None  # (first, count) per source, if contiguous

    def merged(self) -> Runs:
        """Adjacent runs of one source that continue each other made one."""
        if len(self.source) < 2:
            return self
        cont = (self.source[1:] == self.source[:-1]) & \
            (self.index[1:] == self.index[:-1] + self.length[:-1])
        if not cont.any():
            return self
        heads = np.flatnonzero(np.concatenate(([True], ~cont)))
        return Runs(self.source[heads], self.index[heads], np.add.reduceat(self.length, heads))

    def indices(self, k: int) -> np.ndarray:
        """Source ``k``'s stream indices in this read, in stream order."""
        if self.spans is not None:
            first, count = self.spans[k]
            return np.arange(first, first + count)
        at = self.source == k
        return _ranges(self.index[at], self.length[at])


def _ranges(first: np.ndarray, length: np.ndarray) -> np.ndarray:
    """The ranges ``[first[i], first[i] + length[i])`` one after the other.

    >>> _ranges(np.array([5, 0]), np.array([2, 3])).tolist()
    [5, 6, 0, 1, 2]
    """
    if len(first) == 1:
        return np.arange(first[0], first[0] + length[0])
    total = int(length.sum())
    if total == len(first):  # runs of one sample
        return first
    begins = np.cumsum(length) - length
    return np.repeat(first - begins, length) + np.arange(total)


def mixed_rows(parts: list[pa.Table], wheres: list[np.ndarray | None], runs: Runs
               ) -> pa.Table | Pieces:
    """The rows of a mixed read: ``parts[k]`` holds the rows source ``k`` read for ``runs``, in
    sorted order (``wheres[k]``: the row of each of its samples in stream order; ``None``: the
    same order).

    Where every part is in stream order and runs average :data:`MIN_SLICE_ROWS` rows or more
    (a mix with a ``run_length``, read in order), the rows are :class:`Pieces` of the parts:
    nothing is copied, and the worker hands out each batch within a run as a slice of its
    part's conversion (as it does for one source). Otherwise they are copied into mixed order
    with one Arrow take from one chunk (combined first: Arrow's take over several chunks costs
    more, 3 chunks of 42k rows of 264 B: 14.7 ms vs 3.3 + 5.1 ms; a NumPy scatter, which holds
    the GIL, made a 2-thread loader slower: 0.50x single-source throughput against 0.61x).

    >>> a, b = pa.table({"x": [10, 11]}), pa.table({"x": [20, 21]})
    >>> runs = Runs(np.array([0, 1, 0, 1]), np.array([0, 0, 1, 1]), np.ones(4, np.int64))
    >>> mixed_rows([a, b], [np.array([1, 0]), None], runs)["x"].to_pylist()
    [11, 20, 10, 21]
    >>> t = pa.table({"x": np.arange(1000)})
    >>> long = Runs(np.array([0, 1]), np.array([0, 0]), np.array([500, 500]))
    >>> pieces = mixed_rows([t.slice(500), t.slice(0, 500)], [None, None], long)
    >>> pieces.runs, pieces.table()["x"][0].as_py()          # two runs of 500 rows: not copied
    ([(0, 0, 500), (1, 0, 500)], 500)
    """
    sizes = np.array([p.num_rows for p in parts])
    part_start = np.cumsum(sizes) - sizes  # where each part begins in their concatenation
    table = pa.concat_tables(parts)
    n = int(runs.length.sum())
    # The row of its part (in stream order) at which each run begins.
    if runs.spans is not None:  # each source's runs continue each other from its first
        offset = runs.index - np.array([first for first, _ in runs.spans])[runs.source]
    else:
        offset = np.zeros(len(runs.source), np.int64)
        for k in range(len(parts)):
            at = np.flatnonzero(runs.source == k)
            offset[at] = np.cumsum(runs.length[at]) - runs.length[at]
    if all(w is None for w in wheres) and n >= MIN_SLICE_ROWS * len(runs.source):
        batches = table.to_batches()
        bounds = np.cumsum([0] + [len(b) for b in batches])  # where each batch begins
        first = part_start[runs.source] + offset
        batch = np.searchsorted(bounds, first, side="right") - 1
        out = list(zip(batch.tolist(), (first - bounds[batch]).tolist(), runs.length.tolist(),
                       strict=True))
        for i in np.flatnonzero(first + runs.length > bounds[batch + 1])[::-1].tolist():
            b, row, length = out[i]  # a run crossing a batch's end continues in the next ones
            split = []
            while length:
                piece = min(length, int(bounds[b + 1] - bounds[b]) - row)
                split.append((b, row, piece))
                b, row, length = b + 1, 0, length - piece
            out[i:i + 1] = split
        return Pieces(batches, out)
    if len(runs.source) == n:  # runs of one sample (a mix without run_length)
        rel, source = offset, runs.source
    else:  # each sample's row of its part, in stream order
        rel = np.repeat(offset - (np.cumsum(runs.length) - runs.length), runs.length) + \
            np.arange(n)
        source = np.repeat(runs.source, runs.length)
    for k, where in enumerate(wheres):
        if where is not None:
            at = source == k
            rel[at] = where[rel[at]]
    return table.combine_chunks().take(pa.array(part_start[source] + rel))


def _schema_text(schema: pa.Schema) -> str:
    return "{" + ", ".join(f"{f.name}: {f.type}" for f in schema) + "}"


def mean_tokens(source: Any, column: str | None) -> float:
    """Mean tokens per row of ``column`` (list or string lengths) over up to
    :data:`TOKEN_SAMPLE_ROWS` rows spread evenly over ``source``."""
    n = source.num_rows
    if n == 0:
        return 1.0
    positions = np.unique(np.linspace(0, n - 1, min(n, TOKEN_SAMPLE_ROWS)).astype(np.int64))
    table = source.read_table(positions)
    if column not in table.column_names:
        raise KeyError(f"token_column {column!r} is not among the columns read: "
                       f"{table.column_names}")
    col = table.column(column)
    lengths = (pc.utf8_length(col) if pa.types.is_string(col.type) or
               pa.types.is_large_string(col.type) else pc.list_value_length(col))
    return max(float(pc.mean(lengths).as_py() or 0.0), 1e-9)


@dataclass(frozen=True)
class MixOrder(Order):
    """The (sequential) order of a mixed stream. Its "positions" are indices into the mix's
    endless stream, ``epoch * samples_per_epoch + sample``, which :class:`MixedSource` maps to
    each source's own order: the mix's epoch travels with every read.

    Its "windows" are :attr:`Mix.window_samples`: reads are cut on them (as on a block
    shuffle's windows), so each source reads whole windows of its own order."""

    window_samples: int | None = None

    @property
    def window_rows(self) -> int | None:
        return self.window_samples

    def positions(self, epoch: int, samples: np.ndarray) -> np.ndarray:
        samples = np.asarray(samples, dtype=np.int64)
        if samples.size and (samples.min() < 0 or samples.max() >= self.num_rows):
            raise IndexError(f"sample indices must lie in [0, {self.num_rows})")
        return samples + epoch * self.num_rows


class MixedSource:
    """The rows of a :class:`Mix`, read the way a ``Source`` reads its own: picklable (each
    source reopens its dataset in a worker process), with the same attributes the loader uses.

    A read of mixed samples groups them by source (and by the source's own epoch), reads each
    group with one call of that source in its order, runs the source's transform, and
    interleaves the rows back into the mixed order.
    """

    filter = splits = split = split_key = None
    cache = None
    plan_origin = "none"
    version = None

    def __init__(self, mix: Mix) -> None:
        self.mix = mix
        self.names = mix.names
        self.sources = [mix.loaders[n].source for n in mix.names]
        self.orders = [mix.loaders[n].order for n in mix.names]
        self.transforms = [mix.loaders[n].transform for n in mix.names]
        self.schema = mix.schema
        self.columns = list(mix.schema.names)
        self.uri = "mix:" + "+".join(self.names)
        settings = mix.settings()
        self.settings = {"mix": settings}
        self.identity = fingerprint("mix", None, settings)
        shares = list(mix.weights.values())
        self.bytes_per_row = sum(s.bytes_per_row * w for s, w in zip(self.sources, shares,
                                                                      strict=True))

    @property
    def num_rows(self) -> int:
        return self.mix.samples_per_epoch

    def locate(self, stream: np.ndarray) -> Runs:
        """The :class:`Runs` of indices into the mixed endless stream.

        A read of consecutive samples of one epoch (what the loader asks for) is computed per
        slot of the interleave (``run_length`` samples), without per-sample arrays; any other
        read per sample."""
        mix, il = self.mix, self.mix.interleave
        stream = np.asarray(stream, dtype=np.int64)
        n, per_epoch = len(stream), mix.samples_per_epoch
        if n == 0:
            return Runs(*(np.zeros(0, np.int64),) * 3)
        epoch, first = divmod(int(stream[0]), per_epoch)
        if first + n <= per_epoch and int(stream[-1] - stream[0]) == n - 1 and \
                (n < 3 or bool(np.all(np.diff(stream) == 1))):
            slot = first // il.run
            table = interleave(il.quotas)  # one period, turned to begin at the first slot
            count = (first + n - 1) // il.run + 1 - slot
            which = np.tile(np.roll(table, -(slot % il.period)), -(-count // il.period))[:count]
            if il.run == 1:  # a run per sample (cheaper than merging samples into runs)
                source, length = which, np.ones(n, np.int64)
            else:
                new = np.concatenate(([0], np.flatnonzero(which[1:] != which[:-1]) + 1))
                source = which[new]
                start = (slot + new) * il.run
                start[0] = first
                length = np.diff(start, append=first + n)
            index = np.empty(len(source), np.int64)
            spans = []
            for k in range(len(self.names)):  # a source's runs continue each other
                at = np.flatnonzero(source == k)
                begin = mix.offsets[k] + epoch * mix.per_epoch[k] + int(il.count(k, first))
                given = np.cumsum(length[at])
                index[at] = begin + given - length[at]
                spans.append((begin, int(given[-1]) if len(at) else 0))
            return Runs(source, index, length, tuple(spans))  # adjacent runs: other sources
        epochs, samples = np.divmod(stream, per_epoch)
        source = il.source_of(samples).astype(np.int64)
        index = np.empty_like(samples)
        for k in range(len(self.names)):
            at = source == k
            index[at] = (mix.offsets[k] + epochs[at] * mix.per_epoch[k]
                         + il.count(k, samples[at]))
        return Runs(source, index, np.ones(n, np.int64)).merged()

    def read_table_with_io(self, stream: np.ndarray) -> tuple[pa.Table | Pieces, int, int, int]:
        runs = self.locate(stream)
        if not len(runs.source):
            return self.schema_table(), 0, 0, 0
        parts: list[pa.Table] = []
        wheres: list[np.ndarray | None] = []
        io_bytes = iops = cached = 0
        for k in range(len(self.names)):
            index = runs.indices(k)
            if not len(index):
                parts.append(self.schema_table())
                wheres.append(None)
                continue
            rows = self.sources[k].num_rows
            source_epoch, sample = np.divmod(index, rows)
            if source_epoch[0] == source_epoch[-1]:  # one epoch of the source (the usual case)
                positions = self.orders[k].positions(int(source_epoch[0]), sample)
            else:
                positions = np.empty_like(sample)
                for e in np.unique(source_epoch).tolist():
                    at = source_epoch == e
                    positions[at] = self.orders[k].positions(int(e), sample[at])
            # Sorted and unique, the source reads without reordering (or repeating) rows:
            # mixed_rows puts every row in its mixed place, moving it once.
            unique, where = sorted_unique(positions)
            table, b, i, c = self.sources[k].read_table_with_io(unique)
            io_bytes, iops, cached = io_bytes + b, iops + i, cached + c
            table = self._conform(k, table)
            if self.mix.source_column:
                table = table.append_column(self.mix.source_column,
                                            pa.array(np.full(len(table), k, np.int16)))
            parts.append(table)
            wheres.append(where)
        return mixed_rows(parts, wheres, runs), io_bytes, iops, cached

    def _conform(self, k: int, table: pa.Table) -> pa.Table:
        """Source ``k``'s rows through its transform, checked against the common schema."""
        transform, name = self.transforms[k], self.names[k]
        if transform is not None:
            table = source_rows(transform, name, table)
        base = self.mix.schema
        if self.mix.source_column:
            base = base.remove(base.get_field_index(self.mix.source_column))
        if not table.schema.equals(base):
            try:
                return table.select(base.names).cast(base)
            except (KeyError, pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise ValueError(
                    f"mix source {name!r} gives columns {_schema_text(table.schema)}, the mix's "
                    f"are {_schema_text(base)} (those of source {self.names[0]!r}); make its "
                    f"transform return the same columns and types ({exc})") from None
        return table

    def read_table(self, stream: np.ndarray) -> pa.Table:
        return as_table(self.read_table_with_io(stream)[0])

    def order(self, seed: int) -> MixOrder:
        """The order a Loader reads this mix in (the sources' own orders live in the reads)."""
        return MixOrder(self.num_rows, seed=seed, window_samples=self.mix.window_samples)

    def schema_table(self) -> pa.Table:
        return self.schema.empty_table()

    def describe_rows(self, stream: np.ndarray) -> str:
        runs, parts = self.locate(stream), []
        for k in range(len(self.names)):
            index = runs.indices(k)
            if not len(index):
                continue
            parts.append(f"{len(index)} from {self.names[k]!r} (its samples "
                         f"{index[:4].tolist()}{'...' if len(index) > 4 else ''})")
        return "mixed samples: " + ", ".join(parts)

    def __repr__(self) -> str:
        return repr(self.mix)
