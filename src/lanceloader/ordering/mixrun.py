"""MixRun: a mix's weights over a run (schedule, feedback, where the run stands), and the
pieces they make of its stream under a batching.

What a state records of a mix's weights (``state["order"]["mix"]``: ``schedule``,
``feedback``, ``anchor``, ``digest``), as plain data:

* ``schedule``: the :class:`~lanceloader.ordering.schedule.Schedule` (``[[step, weights,
  ramp], ...]``);
* ``feedback``: the ``[step, weights]`` entries of ``Loader.set_weights`` that still matter
  (those after the anchor, and the last one before it, which may still be in force);
* ``anchor``: the global ``step`` and stream ``index`` where the current batching began (the
  run's start or the last resume), and the ``piece`` of the last sample before it (its
  start, quotas and each source's consumed samples before it; the changes from that step on
  are placed by the batching that runs them, so a dropped tail of an epoch stays with the
  piece before), so the stream from the anchor on is a pure function of the state and the
  batching, whatever ran before;
* ``digest``: a hash chain over every feedback entry the run made: equal on ranks that made
  the same calls.

Pure: no I/O.

Example::

    >>> from lanceloader.ordering.schedule import Schedule
    >>> run = MixRun.start(("a", "b"), Schedule({0: {"a": 1, "b": 1}, 2: {"a": 3, "b": 1}}))
    >>> steps, pieces = run.pieces(samples_per_epoch=16, global_batch=4)
    >>> [pieces.piece(i).quotas for i in range(len(pieces))], pieces.starts
    ([(1, 1), (3, 1)], [0, 8])
    >>> later = run.continued_at(steps, 12)     # a state at stream index 12 (step 3)
    >>> later.anchor_step, later.piece.start, later.piece.base
    (3, 8, (4, 4))
"""

from __future__ import annotations

import bisect
import hashlib
import json
from dataclasses import dataclass, replace
from typing import Any

from lanceloader.ordering.interleave import MAX_PERIOD, check_weights, rational_weights
from lanceloader.ordering.pieces import Piece, Pieces, StepMap
from lanceloader.ordering.schedule import Schedule, Weights


@dataclass(frozen=True)
class MixRun:
    """The weights of a mix of sources ``names`` over a run (see the module docstring).
    ``tokens[k]``, with ``weights_by="tokens"``, is source ``k``'s mean tokens per row (its
    weight over it is its share of samples; empty: the weights are shares of samples);
    ``run`` is the mix's ``run_length``."""

    names: tuple[str, ...]
    schedule: Schedule
    piece: Piece
    tokens: tuple[float, ...] = ()
    feedback: tuple[tuple[int, Weights], ...] = ()
    anchor_step: int = 0
    anchor_index: int = 0
    digest: str = ""
    run: int = 1

    @classmethod
    def start(
        cls, names: tuple[str, ...], schedule: Schedule, scale: tuple[float, ...] = (), run: int = 1
    ) -> MixRun:
        """A run at its start: the first stage's weights from step 0."""
        first = cls(names, schedule, Piece(0, 0, (), ()), scale, run=run)
        return replace(first, piece=Piece(0, 0, first.quotas(0), (0,) * len(names)))

    def quotas(self, step: int) -> tuple[int, ...]:
        """The interleave's quotas at global step ``step``."""
        weights = self.schedule.weights_at(step, self.feedback)
        per_sample = [weights.get(n, 0.0) for n in self.names]
        if self.tokens:
            per_sample = [w / t if w else 0.0 for w, t in zip(per_sample, self.tokens, strict=True)]
        return tuple(rational_weights(per_sample))

    def pieces(
        self, samples_per_epoch: int, global_batch: int, drop_last: bool = False
    ) -> tuple[StepMap, Pieces]:
        """The steps and pieces of the stream from the anchor on, under this batching."""
        steps = StepMap(
            samples_per_epoch, global_batch, drop_last, self.anchor_step, self.anchor_index
        )
        later = [
            (step, steps.index_of(step))
            for step in self.schedule.changes_after(self.anchor_step, self.feedback)
        ]
        return steps, Pieces(self.piece, later, self.quotas, samples_per_epoch, self.run)

    def continued_at(self, steps: StepMap, index: int, pieces: Pieces | None = None) -> MixRun:
        """This run anchored at stream ``index`` (a state's position, under ``steps``' batching):
        the piece of the last sample before it (the changes from its step on are placed again,
        under the batching that runs them), and the feedback that can still matter."""
        if pieces is None:
            pieces = self.pieces(steps.samples_per_epoch, steps.global_batch, steps.drop_last)[1]
        step = steps.step_of(index)
        return replace(
            self,
            piece=pieces.piece(pieces.at(index - 1) if index > pieces.starts[0] else 0),
            feedback=_still_matters(self.feedback, step),
            anchor_step=step,
            anchor_index=index,
        )

    def with_schedule(self, schedule: Schedule, consumed: tuple[int, ...]) -> MixRun:
        """This run, anchored at a resume where each source had given ``consumed`` samples,
        with another schedule from the anchor on: a new piece starts there with the new
        weights (unless they are the piece's own)."""
        run = replace(self, schedule=schedule)
        quotas = run.quotas(self.anchor_step)
        if quotas == self.piece.quotas:
            return run
        return replace(run, piece=Piece(self.anchor_step, self.anchor_index, quotas, consumed))

    def with_feedback(self, step: int, weights: Any) -> MixRun:
        """This run with ``weights`` from global ``step`` on (checked: one per source, finite,
        >= 0, not all 0, none positive below the interleave's finest share)."""
        weights = check_weights(weights, list(self.names))
        check_finest(weights)
        entries = [e for e in self.feedback if e[0] != step]
        bisect.insort(entries, (step, weights), key=lambda e: e[0])
        blob = json.dumps([step, weights], sort_keys=True, separators=(",", ":"))
        digest = hashlib.blake2b((self.digest + blob).encode(), digest_size=8).hexdigest()
        return replace(self, feedback=tuple(entries), digest=digest)

    def settings(self) -> dict[str, Any]:
        """JSON data for the state (see the module docstring)."""
        return {
            "schedule": self.schedule.settings(),
            "feedback": [[s, w] for s, w in self.feedback],  # never changed in place
            "anchor": {
                "step": self.anchor_step,
                "index": self.anchor_index,
                "piece": self.piece.settings(list(self.names)),
            },
            "digest": self.digest,
        }

    def of_settings(self, saved: dict[str, Any]) -> MixRun:
        """This run (its names, scale and run length) with a state's weights and place."""
        anchor = saved["anchor"]
        return replace(
            self,
            schedule=Schedule.of_settings(saved["schedule"]),
            feedback=tuple(
                (int(s), {str(n): float(x) for n, x in w.items()}) for s, w in saved["feedback"]
            ),
            piece=Piece.of_settings(anchor["piece"], list(self.names)),
            anchor_step=int(anchor["step"]),
            anchor_index=int(anchor["index"]),
            digest=saved["digest"],
        )


def saved_run(run: MixRun, saved: dict[str, Any]) -> MixRun:
    """``run`` (its names, tokens and run length) with a state's weights and place. A state
    written before schedules (``quotas`` and ``offsets``) is one piece from the stream's
    start."""
    if "anchor" in saved:
        return run.of_settings(saved)
    names = list(run.names)
    quotas = tuple(int(saved["quotas"][n]) for n in names)
    schedule = (
        run.schedule
        if quotas == run.quotas(0)
        else Schedule({0: {n: float(q) for n, q in zip(names, quotas, strict=True)}})
    )
    offsets = tuple(int(saved["offsets"][n]) for n in names)
    return replace(
        run,
        schedule=schedule,
        feedback=(),
        piece=Piece(0, 0, quotas, offsets),
        anchor_step=0,
        anchor_index=0,
        digest="",
    )


def _still_matters(
    feedback: tuple[tuple[int, Weights], ...], step: int
) -> tuple[tuple[int, Weights], ...]:
    """The entries at or after ``step``, and the last one before it (it may still be in
    force, and a later ramp starts from the weights in force)."""
    before = [e for e in feedback if e[0] < step]
    return tuple(before[-1:] + [e for e in feedback if e[0] >= step])


def check_finest(weights: Weights, what: str = "weight") -> None:
    """Refuse a positive weight below ``1 / MAX_PERIOD`` of the total: the interleave could
    not give it one slot, so it would never be drawn."""
    total = sum(weights.values())
    for name, w in weights.items():
        if 0 < w < total / MAX_PERIOD:
            raise ValueError(
                f"the {what} of source {name!r} ({w:g}) is below 1/{MAX_PERIOD} of the total, "
                "the finest share the interleave can give, so it would never be drawn; raise "
                "it, or give it 0 to leave the source out"
            )


@dataclass(frozen=True)
class MixShare:
    """What each source of a mix delivered in one piece of its weights (``stats().mix``):
    from global ``step`` on, the target ``weights`` (shares of samples, as the interleave used
    them), the ``rows`` each source gave, the interleave's ``promised`` rows (the piece's
    samples x its share: each source's rows are within ±1 of it in each epoch's stretch, ±1
    run with ``run_length``), and ``tokens`` (rows x the source's tokens per row, where known:
    a packed source's ``seq_len``, or the mean measured by ``weights_by="tokens"``; else
    None)."""

    step: int
    weights: dict[str, float]
    rows: dict[str, int]
    promised: dict[str, float]
    tokens: dict[str, float | None]

    def __str__(self) -> str:
        total = sum(self.rows.values()) or 1
        parts = [
            f"{n} {100 * r / total:.1f}% ({r:,} rows, promised {self.promised[n]:,.1f})"
            for n, r in self.rows.items()
        ]
        return "; ".join(parts)
