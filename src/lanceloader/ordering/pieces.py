"""Pieces: a mix's stream as a chain of constant-weight pieces, each continuing every source
exactly where the piece before left it.

A mix's stream is indexed by *stream index* ``epoch * samples_per_epoch + sample``. A *piece*
starts at a stream index with its own interleave (``quotas``) and the number of samples each
source's own stream had given before it (``base``): sample *x* of the piece comes from the
source its interleave names at *x*'s place, and is that source's sample ``base[k] +`` (its
count in the piece before *x*). The interleave's places count from the piece's start in its
first epoch and from each epoch's start after that (as an unchanged mix restarts its
interleave at every epoch), so within each epoch's stretch of a piece every source is within
±1 of its share (±1 run with ``run_length``), and no source's stream skips or repeats a sample
across pieces. The next piece's base is the count at its start: closed form, O(pieces), no
sample replayed.

A :class:`StepMap` turns global steps into stream indices under one batching (ranks x batch
size, ``drop_last``), from an *anchor*: the step and stream index where the batching began
(the run's start, or the last resume). Steps past the anchor are therefore placed with the
batching they run under, on any world size, and a schedule's change lands on the first
sample of its step.

Pure: no I/O. The mix's rows read through :meth:`Pieces.locate`.

Example::

    >>> steps = StepMap(samples_per_epoch=12, global_batch=4)      # 3 steps an epoch
    >>> steps.index_of(4), steps.step_of(16)
    (16, 4)
    >>> first = Piece(step=0, start=0, quotas=(1, 1), base=(0, 0))
    >>> quotas = lambda step: (3, 1)                               # the weights at a step
    >>> pieces = Pieces(first, [(1, 4)], quotas, samples_per_epoch=12)  # 3:1 from step 1
    >>> runs = pieces.locate(np.arange(12))
    >>> np.repeat(runs.source, runs.length).tolist()
    [0, 1, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1]
    >>> pieces.consumed(1, 12).tolist()                           # samples given by each source
    [8, 4]
"""

from __future__ import annotations

import bisect
import dataclasses
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from lanceloader.ordering.interleave import Interleave, Runs, locate_span


@dataclass(frozen=True)
class StepMap:
    """Global steps and stream indices under one batching: step ``step`` (the anchor) takes
    the samples from stream index ``index`` on, ``global_batch`` samples a step, each epoch's
    steps as :class:`~lanceloader.ordering.plan.Plan` cuts them (a short last step, or none
    with ``drop_last``)."""

    samples_per_epoch: int
    global_batch: int
    drop_last: bool = False
    step: int = 0
    index: int = 0

    def steps_from(self, sample: int) -> int:
        """Steps of an epoch from its ``sample`` on."""
        left = self.samples_per_epoch - sample
        return left // self.global_batch if self.drop_last else -(-left // self.global_batch)

    def index_of(self, step: int) -> int:
        """The stream index of the first sample of global step ``step`` (at or after the
        anchor)."""
        if step < self.step:
            raise ValueError(f"step {step} comes before this batching began (step {self.step})")
        spe, g = self.samples_per_epoch, self.global_batch
        epoch, sample = divmod(self.index, spe)
        i, first = step - self.step, self.steps_from(sample)
        if i < first:
            return self.index + i * g
        per = self.steps_from(0)
        if per == 0:
            raise ValueError(
                f"an epoch of {spe} samples has no step of {g} samples with drop_last, so "
                f"step {step} never comes"
            )
        i -= first
        return (epoch + 1 + i // per) * spe + (i % per) * g

    def step_of(self, index: int) -> int:
        """Steps taken before stream index ``index`` (a step's first sample, or an epoch's
        end): the inverse of :meth:`index_of`."""
        spe, g = self.samples_per_epoch, self.global_batch
        e0, j0 = divmod(self.index, spe)
        epoch, sample = divmod(index, spe)
        if epoch == e0:
            return self.step + min(self.steps_from(j0), -(-(sample - j0) // g))
        per = self.steps_from(0)
        return self.step + self.steps_from(j0) + (epoch - e0 - 1) * per + min(per, -(-sample // g))


@dataclass(frozen=True)
class Piece:
    """A stretch of the stream with one interleave: from global step ``step``, stream index
    ``start`` on; ``base[k]`` samples of source ``k``'s stream came before it."""

    step: int
    start: int
    quotas: tuple[int, ...]
    base: tuple[int, ...]

    def settings(self, names: list[str]) -> dict[str, Any]:
        """JSON data (a state's anchor piece)."""
        return {
            "step": self.step,
            "start": self.start,
            "quotas": dict(zip(names, self.quotas, strict=True)),
            "base": dict(zip(names, self.base, strict=True)),
        }

    @classmethod
    def of_settings(cls, settings: dict[str, Any], names: list[str]) -> Piece:
        return cls(
            int(settings["step"]),
            int(settings["start"]),
            tuple(int(settings["quotas"][n]) for n in names),
            tuple(int(settings["base"][n]) for n in names),
        )


class Pieces:
    """The pieces of a stream from ``first`` on: ``later`` lists ``(step, start)`` of the
    pieces after it, in order, and ``quotas(step)`` gives a piece's quotas. Each piece's quotas
    and base are found (from the piece before) when first asked for, so a long ramp costs
    nothing until it is read; picklable (``quotas`` too), with what it found."""

    def __init__(
        self,
        first: Piece,
        later: list[tuple[int, int]],
        quotas: Callable[[int], tuple[int, ...]],
        samples_per_epoch: int,
        run: int = 1,
    ) -> None:
        self.spe, self.run = samples_per_epoch, run
        self.starts = [first.start] + [start for _, start in later]
        self._later, self._quotas = later, quotas
        self._resolved = [first]
        self._interleaves: dict[int, Interleave] = {}
        self._lock = threading.Lock()  # thread workers resolve pieces of one Pieces

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_lock"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _lock=threading.Lock())

    def adopt(self, other: Pieces, before_step: int) -> None:
        """Take the pieces ``other`` resolved already that are this one's too: those that
        begin before ``before_step``, where the two runs' weights agree (a feedback call or a
        fold of the calls changes nothing before its step). Saves the main process resolving
        again what thread workers resolved while reading."""
        with self._lock:
            for piece in list(other._resolved):
                j = len(self._resolved) - 1
                if piece.step >= before_step or j >= len(self._later):
                    break
                if (piece.step, piece.start) == self._later[j] and piece.start > self.starts[0]:
                    self._resolved.append(piece)

    def __len__(self) -> int:
        return len(self.starts)

    def piece(self, i: int) -> Piece:
        """Piece ``i``, with its base."""
        if i < len(self._resolved):
            return self._resolved[i]
        with self._lock:
            return self._resolve(i)

    def _resolve(self, i: int) -> Piece:
        while len(self._resolved) <= i:
            j = len(self._resolved)
            step, start = self._later[j - 1]
            base = tuple(int(c) for c in self.consumed(j - 1, start))
            self._resolved.append(Piece(step, start, self._quotas(step), base))
        return self._resolved[i]

    def at(self, index: int) -> int:
        """The piece holding stream index ``index``."""
        if index < self.starts[0]:
            raise ValueError(
                f"mixed sample {index} (epoch {index // self.spe}, sample {index % self.spe}) "
                f"comes before this loader's first piece of weights (sample "
                f"{self.starts[0] % self.spe} of epoch {self.starts[0] // self.spe}): a mix "
                "whose weights change keeps no pieces from before its last resume; ask the "
                "loader (or ledger) of the run before that resume"
            )
        return bisect.bisect_right(self.starts, index) - 1

    def interleave(self, i: int) -> Interleave:
        """Piece ``i``'s interleave, scheduling only the slots its stretches can reach."""
        if i in self._interleaves:
            return self._interleaves[i]
        piece = self.piece(i)
        epoch_end = (piece.start // self.spe + 1) * self.spe
        end = self.starts[i + 1] if i + 1 < len(self.starts) else None
        length = end - piece.start if end is not None and end <= epoch_end else self.spe
        slots = -(-length // self.run) + 1
        il = Interleave(piece.quotas, self.run, slots if slots < sum(piece.quotas) else None)
        self._interleaves[i] = il
        return il

    def _counts(self, i: int, n: int) -> np.ndarray:
        return self.interleave(i).counts_at(n)

    def place(self, i: int, index: int) -> int:
        """The place of stream index ``index`` in piece ``i``'s interleave."""
        e0, j0 = divmod(self.starts[i], self.spe)
        epoch, sample = divmod(index, self.spe)
        return sample - j0 if epoch == e0 else sample

    def consumed(self, i: int, index: int) -> np.ndarray:
        """Samples each source's stream gave before stream index ``index``, in piece ``i``."""
        piece = self.piece(i)
        e0, j0 = divmod(piece.start, self.spe)
        epoch, sample = divmod(index, self.spe)
        if epoch == e0:
            given = self._counts(i, sample - j0)
        else:
            given = (
                self._counts(i, self.spe - j0)
                + (epoch - e0 - 1) * self._counts(i, self.spe)
                + self._counts(i, sample)
            )
        return np.asarray(piece.base, np.int64) + given

    def locate(self, stream: np.ndarray, strict: bool = False) -> Runs:
        """The :class:`Runs` of stream indices ``stream``: cut where a piece or an epoch
        begins, and where the indices stop being consecutive; each part is located by its
        piece's interleave.

        Indices before the first piece (a run anchored after a resume no longer holds the
        pieces before it) are read as the samples from the first piece's start on: only a
        short last global batch asks for them, padded (``ordering/plan.py``) with duplicates
        of the epoch's first samples; after such a resume its duplicates are those samples.
        ``strict`` (the ledger's lineage): refused instead."""
        stream = np.asarray(stream, dtype=np.int64)
        if not len(stream):
            return Runs(*(np.zeros(0, np.int64),) * 3)
        first = self.starts[0]
        if stream.min() < first:  # a short last batch padded from the epoch's start: see below
            if strict:
                self.at(int(stream.min()))  # raises, naming the index
            stream = np.where(stream < first, first + stream % self.spe, stream)
        cuts = np.flatnonzero(np.diff(stream) != 1) + 1
        parts: list[Runs] = []
        for run in np.split(stream, cuts):
            lo, hi = int(run[0]), int(run[-1]) + 1
            while lo < hi:
                i = self.at(lo)
                stop = min(hi, (lo // self.spe + 1) * self.spe)
                if i + 1 < len(self.starts):
                    stop = min(stop, self.starts[i + 1])
                begins = [int(b) for b in self.consumed(i, lo)]
                parts.append(locate_span(self.interleave(i), self.place(i, lo), stop - lo, begins))
                lo = stop
        if len(parts) == 1:
            return parts[0]
        runs = Runs(
            np.concatenate([p.source for p in parts]),
            np.concatenate([p.index for p in parts]),
            np.concatenate([p.length for p in parts]),
        ).merged()
        if len(cuts):
            return runs
        # One consecutive read: each source's parts continue each other.
        spans = [p.spans or () for p in parts]
        return dataclasses.replace(
            runs,
            spans=tuple(
                (spans[0][k][0], sum(s[k][1] for s in spans)) for k in range(len(spans[0]))
            ),
        )

    def shares_at(self, stream: np.ndarray, source: np.ndarray) -> np.ndarray:
        """The share of samples that source ``source[i]`` has in the piece holding stream
        index ``stream[i]``."""
        which = np.searchsorted(self.starts, stream, side="right") - 1
        out = np.empty(len(stream))
        for i in np.unique(which).tolist():
            quotas = np.asarray(self.piece(i).quotas, np.float64)
            at = which == i
            out[at] = quotas[source[at]] / quotas.sum()
        return out

    def delivered(self, lo: int, hi: int) -> list[tuple[Piece, np.ndarray, np.ndarray]]:
        """For each piece overlapping stream indices ``[lo, hi)``: the piece, the samples each
        source gave there, and the interleave's promise (``length x quotas / period``)."""
        out = []
        i = self.at(lo)
        while lo < hi:
            stop = min(hi, self.starts[i + 1]) if i + 1 < len(self.starts) else hi
            piece = self.piece(i)
            given = self.consumed(i, stop) - self.consumed(i, lo)
            share = np.asarray(piece.quotas, np.float64) / sum(piece.quotas)
            out.append((piece, given, (stop - lo) * share))
            lo, i = stop, i + 1
        return out
