"""What :func:`lanceloader.check_resume` found: :class:`ResumeReport`, and the first place a
resumed run differed from the uninterrupted one (:class:`ResumeDivergence`), each printable.

Example::

    >>> report = ResumeReport(runs=10, loads=30, elastic=12, epochs=2, world_sizes=(1, 2),
    ...                       samples_compared=5000, not_comparable=0, seconds=1.0,
    ...                       cpu_seconds=0.9)
    >>> report.ok, str(report).split(":")[1]
    (True, ' OK')
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np


class ResumeCheckError(AssertionError):
    """A resumed run delivered other rows than the uninterrupted one (``raise_if_failed``)."""


@dataclass(frozen=True)
class ResumeDivergence:
    """The first place an interrupted run differed from the reference (``report.divergence``).

    Attributes:
        run: the interrupted run (drawn from ``(seed, run)``: the same check finds it again).
        load: the run's n-th ``load_state_dict`` before it (1: its first).
        epoch, step: where: the epoch, and its global steps before this batch (as the run
            took them, across its resumes and world sizes).
        rank, world_size: the rank whose batch differed, of how many.
        what: what happened, in words (rows differ, an epoch ended early or late, ranks'
            states differ, an error raised).
        samples: the global samples of the epoch the batch should hold.
        expected, got: the rows, as ids (``ids=``) or short content hashes.
        got_samples: the reference's samples of the rows got (``None``: not in that epoch).
        schedule: the run's stretches, ``N -> M ranks at epoch e, sample s; k steps``.
    """

    run: int
    load: int
    epoch: int
    step: int
    rank: int
    world_size: int
    what: str
    samples: list[int] = field(default_factory=list)
    expected: list[Any] = field(default_factory=list)
    got: list[Any] = field(default_factory=list)
    got_samples: list[int | None] = field(default_factory=list)
    schedule: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [
            f"run {self.run}, load {self.load}: epoch {self.epoch}, step {self.step}, "
            f"rank {self.rank} of {self.world_size}: {self.what}"
        ]
        if self.samples or self.expected or self.got:
            lines += [
                f"  expected: {_short(self.expected)}, the reference's samples {_span(self.samples)}",
                f"  got:      {_short(self.got)}, the reference's samples {_span(self.got_samples)}",
            ]
        lines += ["  the run:", *(f"    {i + 1}. {s}" for i, s in enumerate(self.schedule))]
        return "\n".join(lines)


@dataclass(frozen=True)
class ResumeReport:
    """What :func:`~lanceloader.check_resume` ran and found; ``print(report)`` says it.

    Attributes:
        runs: interrupted runs done (the failing one included).
        loads: resumes (``load_state_dict`` on fresh loaders; all ranks' counted once).
        elastic: of those, onto another world size than the state was saved on.
        samples_compared: delivered samples compared with the reference.
        not_comparable: delivered samples no reference had (``drop_last`` tails past a resume).
        epochs, world_sizes: what the check ran.
        seconds, cpu_seconds: wall time, and this process's CPU time (thread workers
            included, process workers not).
        divergence: the first :class:`ResumeDivergence`, or ``None``.
    """

    runs: int
    loads: int
    elastic: int
    samples_compared: int
    not_comparable: int
    epochs: int
    world_sizes: tuple[int, ...]
    seconds: float
    cpu_seconds: float
    divergence: ResumeDivergence | None = None

    @property
    def ok(self) -> bool:
        """Every delivered row matched the uninterrupted run's."""
        return self.divergence is None

    def raise_if_failed(self) -> ResumeReport:
        """Raise :class:`ResumeCheckError` (an ``AssertionError``) with this report's text if a
        run diverged; else return the report."""
        if self.divergence is not None:
            raise ResumeCheckError(str(self))
        return self

    def __str__(self) -> str:
        sizes = ", ".join(map(str, self.world_sizes))
        ran = (
            f"interrupted runs {self.runs:,}, resumes {self.loads:,} ({self.elastic:,} onto "
            f"another world size), epochs {self.epochs}, world sizes {sizes}; samples compared "
            f"{self.samples_compared:,}"
        )
        if self.not_comparable:
            ran += (
                f", not comparable {self.not_comparable:,} (past the reference's drop_last tails)"
            )
        took = f"{self.seconds:.1f} s ({self.cpu_seconds:.1f} CPU s)"
        if self.divergence is None:
            return f"check_resume: OK: every row as in the uninterrupted run. {ran}. {took}"
        return f"check_resume: FAILED: {self.divergence}\nuntil then: {ran}. {took}"


def row_names(ids: np.ndarray | None, hashes: np.ndarray | None) -> list[Any]:
    """How the report shows rows: their ids, or their hashes' first 8 hex digits."""
    if ids is not None:
        return ids.tolist()
    return [] if hashes is None else [f"#{h:016x}"[:9] for h in hashes.tolist()]


def _span(samples: Sequence[int | None]) -> str:
    """``12..15`` for consecutive samples, else the list."""
    first = samples[0] if samples else None
    if first is not None and list(samples) == list(range(first, first + len(samples))):
        return f"{first}..{first + len(samples) - 1}"
    return _short(["none" if s is None else s for s in samples])  # none: not in the epoch


def _short(values: Sequence[Any], most: int = 8) -> str:
    shown = ", ".join(map(str, values[:most]))
    return f"[{shown}{', ...' if len(values) > most else ''}] ({len(values)} rows)"
