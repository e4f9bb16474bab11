"""The interleave of a mix: pure maths of which source each mixed sample comes from.

The weights are made rational, ``q_k / P`` (``P`` at most :data:`MAX_PERIOD`). One period of
``P`` slots is scheduled earliest-deadline-first: the *i*-th sample of source *k* must come after
slot ``(i - 1) P / q_k`` and by slot ``i P / q_k``. Such a schedule exists (Tijdeman's chairman
assignment theorem) and EDF finds one, so after *any* ``n`` samples each source has contributed
``n q_k / P`` samples within ±1 (strictly). The period repeats, so the count of source *k* before
sample *j* is ``(j // P) q_k + prefix[j % P, k]``: one table lookup. ``run`` consecutive samples
may form one slot (exact within ±1 run). No I/O here: :mod:`lanceloader.rows.mixed` reads.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

MAX_PERIOD = 1 << 16  # slots of one interleave period at most: a 65,536 x sources table


def rational_weights(weights: list[float]) -> list[int]:
    """Integer quotas ``q_k`` proportional to ``weights``, summing to the period ``P``: exact for
    rational weights with a small common denominator (0.7/0.2/0.1 gives 7, 2, 1), else the
    largest-remainder rounding to ``P = MAX_PERIOD``.

    >>> rational_weights([0.7, 0.2, 0.1]), rational_weights([1, 1, 1]), rational_weights([2, 0])
    ([7, 2, 1], [1, 1, 1], [1, 0])
    """
    ratios = [Fraction(w).as_integer_ratio() for w in weights]  # exact, as integers over
    scale = math.lcm(*(d for _, d in ratios))  # one common denominator
    numerators = [n * (scale // d) for n, d in ratios]
    total = sum(numerators)
    shares, period = [], 1
    for n in numerators:  # stops at the first share whose denominator makes the period too long
        shares.append(Fraction(n, total).limit_denominator(MAX_PERIOD))
        period = math.lcm(period, shares[-1].denominator)
        if period > MAX_PERIOD:
            break
    if len(shares) == len(weights) and sum(shares) == 1 and period <= MAX_PERIOD:
        return [int(s * period) for s in shares]
    # n * P / total, floored; the remaining slots to the largest remainders (ties: first listed)
    split = [divmod(n * MAX_PERIOD, total) for n in numerators]
    quotas = [q for q, _ in split]
    remainders = [r for _, r in split]
    by_remainder = sorted(range(len(weights)), key=lambda k: -remainders[k])
    for k in by_remainder[: MAX_PERIOD - sum(quotas)]:
        quotas[k] += 1
    return quotas


@functools.lru_cache(maxsize=64)
def interleave(quotas: tuple[int, ...], slots: int | None = None) -> np.ndarray:
    """One period of the interleave: the source of each of the ``sum(quotas)`` slots (of the
    first ``slots`` of them only, when given: a piece of a schedule shorter than a period).

    Earliest deadline first over the sources' next samples that are due: after slot *t* source
    *k* has given ``t q_k / P`` samples within ±1, at every *t* (see the module docstring). Two
    heaps (released samples by deadline, the others by release), ties to the lower source:
    O(slots log sources), ~1.5 µs a slot.

    >>> interleave((2, 1)).tolist(), interleave((1, 1, 2)).tolist(), interleave((7, 2, 1), 4)
    ([0, 0, 1], [2, 0, 1, 2], array([0, 0, 0, 1], dtype=int32))
    """
    period = sum(quotas)
    slots = period if slots is None else min(slots, period)
    table = np.empty(slots, np.int32)
    given = [0] * len(quotas)
    ready = [(-(-period // q), k) for k, q in enumerate(quotas) if q]  # (deadline, source)
    heapq.heapify(ready)
    waiting: list[tuple[int, int]] = []  # (release slot, source)
    for t in range(1, slots + 1):
        while waiting and waiting[0][0] <= t:
            k = heapq.heappop(waiting)[1]
            heapq.heappush(ready, (-(-(given[k] + 1) * period // quotas[k]), k))
        k = heapq.heappop(ready)[1]
        table[t - 1] = k
        c = given[k] = given[k] + 1
        q = quotas[k]
        release = c * period // q + 1  # its next sample may come from this slot on
        if release <= t:
            heapq.heappush(ready, (-(-(c + 1) * period // q), k))
        else:
            heapq.heappush(waiting, (release, k))
    return table


@dataclass(frozen=True)
class Interleave:
    """The counts of a periodic interleave: which source each mixed sample comes from, and how
    many samples of each source precede it. Pure and O(1) per sample.

    ``run`` consecutive samples form one slot (``run=1``: each sample is a slot): the
    interleave schedules runs, so each source's count is exact within ±1 run. ``slots``: only
    the first that many slots are ever asked for (a short piece of a schedule), so only those
    are scheduled.

    >>> il = Interleave((2, 1))
    >>> il.source_of(np.arange(6)).tolist(), il.count(1, np.array([0, 3, 6])).tolist()
    ([0, 0, 1, 0, 0, 1], [0, 1, 2])
    >>> runs = Interleave((2, 1), run=2)
    >>> runs.source_of(np.arange(6)).tolist(), runs.count(1, np.array([4, 5, 6])).tolist()
    ([0, 0, 0, 0, 1, 1], [0, 1, 2])
    """

    quotas: tuple[int, ...]
    run: int = 1
    slots: int | None = None

    @property
    def period(self) -> int:
        """Slots of one period (``sum(quotas)``; ``run`` samples each)."""
        return sum(self.quotas)

    @property
    def table(self) -> np.ndarray:
        """The period's slots (its first ``slots``, if limited)."""
        return interleave(self.quotas, self.slots)

    @functools.cached_property
    def _slots_of(self) -> list[np.ndarray]:
        """Each source's slots in the period, ascending (counts by binary search: O(P) memory,
        where a table of prefix counts would take O(P x sources))."""
        table = self.table
        order = np.argsort(table, kind="stable")
        bounds = np.searchsorted(table[order], np.arange(len(self.quotas) + 1))
        return [order[a:b] for a, b in itertools.pairwise(bounds)]

    def source_of(self, samples: np.ndarray) -> np.ndarray:
        return self.table[(np.asarray(samples) // self.run) % self.period]

    def count(self, k: int, n: np.ndarray | int) -> np.ndarray:
        """Samples of source ``k`` among the first ``n`` mixed samples."""
        slots, rest = np.divmod(np.asarray(n, dtype=np.int64), self.run)
        whole = (slots // self.period) * self.quotas[k] + np.searchsorted(
            self._slots_of[k], slots % self.period
        )
        if self.run == 1:
            return whole
        at = slots % self.period
        inside = self.table[np.minimum(at, len(self.table) - 1)] == k  # the slot n lies in
        return whole * self.run + np.where(inside & (at < len(self.table)), rest, 0)

    def counts(self, n: int) -> list[int]:
        return self.counts_at(n).tolist()

    def counts_at(self, n: int) -> np.ndarray:
        """Samples of every source among the first ``n`` mixed samples (one pass over the
        period's slots before ``n``, not one count per source).

        >>> Interleave((2, 1), run=2).counts_at(7).tolist()
        [5, 2]
        """
        slots, rest = divmod(int(n), self.run)
        whole, at = divmod(slots, self.period)
        table = self.table
        out = whole * np.asarray(self.quotas, np.int64) + np.bincount(
            table[:at], minlength=len(self.quotas)
        )
        if self.run > 1:
            out *= self.run
            if rest and at < len(table):  # the slot n lies in
                out[table[at]] += rest
        return out

    def position_of(self, k: int, i: int) -> int:
        """The mixed sample that is source ``k``'s ``i``-th (0-based)."""
        slots = self._slots_of[k]
        slot, rest = divmod(i, self.run)
        full, nth = divmod(slot, self.quotas[k])
        return (full * self.period + int(slots[nth])) * self.run + rest


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
    slots: Slots | None = None  # runs of one sample, in a period's pattern (see Slots)

    def merged(self) -> Runs:
        """Adjacent runs of one source that continue each other made one."""
        if len(self.source) < 2:
            return self
        cont = (self.source[1:] == self.source[:-1]) & (
            self.index[1:] == self.index[:-1] + self.length[:-1]
        )
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

    def places(self, sources: int) -> list[np.ndarray]:
        """Per source (of ``sources``), the places in the read (0 … samples - 1) of its
        samples, in stream order: where a mixed read puts each source's rows.

        >>> Runs(np.array([1, 0, 1]), np.array([0, 0, 2]), np.array([2, 1, 1])).places(2)
        [array([2]), array([0, 1, 3])]
        """
        if self.slots is not None:
            return [self.slots.places(k) for k in range(sources)]
        n = int(self.length.sum())
        source = self.source if len(self.source) == n else np.repeat(self.source, self.length)
        return [np.flatnonzero(source == k) for k in range(sources)]


# Sources with at most this many slots a period are placed by strides (one strided copy per
# slot, sample j of the read at j % period); with more, by an index of places.
MAX_STRIDED_SLOTS = 16


@dataclass(frozen=True)
class Slots:
    """Where the sources' samples lie in a read of ``samples`` consecutive mixed samples, one
    sample a run: the read's pattern repeats every ``period`` samples, and source ``k``'s
    samples are at ``offsets[k]`` (ascending) within each repeat. Its ``i``-th sample of the
    read is at ``(i // q) * period + offsets[k][i % q]`` (``q = len(offsets[k])``), so its rows
    can be copied into place by ``q`` strided copies instead of an index of places.

    >>> s = Slots(3, ((1,), (0, 2)), 7)
    >>> s.places(0).tolist(), s.places(1).tolist(), s.counts()
    ([1, 4], [0, 2, 3, 5, 6], [2, 5])
    """

    period: int
    offsets: tuple[tuple[int, ...], ...]
    samples: int

    def counts(self) -> list[int]:
        """Samples of each source in the read."""
        whole, rest = divmod(self.samples, self.period)
        return [whole * len(o) + sum(x < rest for x in o) for o in self.offsets]

    def places(self, k: int) -> np.ndarray:
        """Source ``k``'s places in the read, ascending (its samples in stream order)."""
        offsets = np.array(self.offsets[k], np.int64)
        starts = np.arange(0, self.samples, self.period)
        places = (starts[:, None] + offsets[None, :]).ravel()
        return places[: self.counts()[k]]

    def strides(self, k: int) -> tuple[int, int, list[tuple[int, int]]] | None:
        """Source ``k``'s samples as strides, ``(period, q, [(first place, first row), ...])``:
        rows ``first row, first row + q, …`` of its part go to places ``first place, first
        place + period, …`` (:func:`~lanceloader.rows.gather.gather_rows`' ``strides``); None
        when it has more than :data:`MAX_STRIDED_SLOTS` slots (placed by index).

        >>> Slots(3, ((1,), (0, 2)), 7).strides(1)
        (3, 2, [(0, 0), (2, 1)])
        """
        offsets = self.offsets[k]
        if len(offsets) > MAX_STRIDED_SLOTS:
            return None
        return (
            self.period,
            len(offsets),
            [(offset, j) for j, offset in enumerate(offsets) if offset < self.samples],
        )


def _periodic(pattern: np.ndarray, n: int) -> np.ndarray:
    """``pattern`` repeated to ``n`` items (``np.tile`` costs ~4x this on a short pattern)."""
    period = len(pattern)
    if period > MAX_STRIDED_SLOTS:
        return np.tile(pattern, -(-n // period))[:n]
    out = np.empty(n, pattern.dtype)
    for j in range(min(period, n)):
        out[j::period] = pattern[j]
    return out


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


def locate(
    il: Interleave,
    samples_per_epoch: int,
    per_epoch: list[int],
    offsets: list[int],
    stream: np.ndarray,
) -> Runs:
    """The :class:`Runs` of indices ``stream`` into a mix's endless stream: ``il``'s interleave,
    ``samples_per_epoch`` mixed samples an epoch, of which ``per_epoch[k]`` from source ``k``,
    whose stream is shifted by ``offsets[k]``.

    A read of consecutive samples of one epoch (what the loader asks for) is computed per
    slot of the interleave (``run_length`` samples), without per-sample arrays; any other
    read per sample."""
    stream = np.asarray(stream, dtype=np.int64)
    n, sources = len(stream), len(per_epoch)
    if n == 0:
        return Runs(*(np.zeros(0, np.int64),) * 3)
    epoch, first = divmod(int(stream[0]), samples_per_epoch)
    if (
        first + n <= samples_per_epoch
        and int(stream[-1] - stream[0]) == n - 1
        and (n < 3 or bool(np.all(np.diff(stream) == 1)))
    ):
        begins = [
            offsets[k] + epoch * per_epoch[k] + int(il.count(k, first)) for k in range(sources)
        ]
        return locate_span(il, first, n, begins)
    epochs, samples = np.divmod(stream, samples_per_epoch)
    source = il.source_of(samples).astype(np.int64)
    index = np.empty_like(samples)
    for k in range(sources):
        at = source == k
        index[at] = offsets[k] + epochs[at] * per_epoch[k] + il.count(k, samples[at])
    return Runs(source, index, np.ones(n, np.int64)).merged()


def locate_span(il: Interleave, first: int, n: int, begins: list[int]) -> Runs:
    """The :class:`Runs` of ``n`` consecutive mixed samples from place ``first`` of ``il``'s
    interleave on (within one epoch's stretch of one interleave), whose first samples of each
    source are its stream's ``begins[k]``: computed per slot of the interleave (``run``
    samples), without per-sample arrays."""
    slot = first // il.run
    table = il.table  # one period, turned to begin at the first slot
    if il.run == 1:  # a run per sample, in the period's pattern (see Slots)
        return _located_samples(np.roll(table, -(first % il.period)), n, begins)
    count = (first + n - 1) // il.run + 1 - slot
    which = np.tile(np.roll(table, -(slot % il.period)), -(-count // il.period))[:count]
    new = np.concatenate(([0], np.flatnonzero(which[1:] != which[:-1]) + 1))
    source = which[new]
    start = (slot + new) * il.run
    start[0] = first
    length = np.diff(start, append=first + n)
    index = np.empty(len(source), np.int64)
    spans = []
    for k, begin in enumerate(begins):  # a source's runs continue each other
        at = np.flatnonzero(source == k)
        given = np.cumsum(length[at])
        index[at] = begin + given - length[at]
        spans.append((begin, int(given[-1]) if len(at) else 0))
    return Runs(source, index, length, tuple(spans))  # adjacent runs: other sources


def _located_samples(pattern: np.ndarray, n: int, begins: list[int]) -> Runs:
    """The runs of ``n`` consecutive mixed samples of one epoch, one sample each, whose sources
    follow ``pattern`` (the interleave's period turned to begin at the first sample) and whose
    first samples of each source are its stream's ``begins[k]``: each source's places come
    from the pattern (:class:`Slots`), not from passes over the samples."""
    period = len(pattern)
    slots = Slots(
        period, tuple(tuple(np.flatnonzero(pattern == k).tolist()) for k in range(len(begins))), n
    )
    index = np.empty(n, np.int64)
    for k, (begin, count) in enumerate(zip(begins, slots.counts(), strict=True)):
        strides = slots.strides(k)
        if strides is None:
            index[slots.places(k)] = np.arange(begin, begin + count)
            continue
        _, q, starts = strides
        for place, row in starts:  # samples place, place + period, ...: its rows row, row + q, ...
            index[place::period] = np.arange(begin + row, begin + count, q)
    return Runs(
        _periodic(pattern, n),
        index,
        np.ones(n, np.int64),
        tuple(zip(begins, slots.counts(), strict=True)),
        slots,
    )


def check_weights(weights: Any, names: list[str]) -> dict[str, float]:
    """``weights`` (``None``: equal) as ``{name: float}``, or an error that names the problem.

    >>> check_weights({"a": np.int64(3), "b": 1.5}, ["a", "b"])
    {'a': 3.0, 'b': 1.5}
    >>> check_weights([1, 2], ["a", "b"])
    Traceback (most recent call last):
    ...
    TypeError: weights must be a dict {source name: weight}, e.g. {'a': 1, 'b': 1}; got the list [1, 2]
    """
    if weights is None:
        return dict.fromkeys(names, 1.0)
    if not isinstance(weights, Mapping):
        raise TypeError(
            f"weights must be a dict {{source name: weight}}, e.g. "
            f"{dict.fromkeys(names, 1)}; got the {type(weights).__name__} {weights!r}"
        )
    if set(map(str, weights)) != set(names):
        raise ValueError(
            f"weights name {sorted(map(str, weights))}, sources name {names}: give "
            "one weight per source (0 leaves a source out)"
        )
    out = {}
    for name, w in weights.items():
        plain = type(w) is float or type(w) is int  # the common case, without ABC checks
        if (not plain and (isinstance(w, bool) or not isinstance(w, numbers.Real))) or not (
            math.isfinite(w) and w >= 0
        ):
            raise ValueError(
                f"the weight of source {name!r} must be a finite number >= 0, got {w!r}"
            )
        out[str(name)] = float(w)
    if not any(out.values()):
        raise ValueError(
            f"weights are all 0 ({weights}): they must not all be 0; give at "
            "least one source a weight > 0"
        )
    return out
