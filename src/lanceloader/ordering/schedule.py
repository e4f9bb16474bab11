"""Schedules: mixture weights that change at global steps, as plain data, and the rule that
says which weights hold at a step once a training loop's feedback is added.

A :class:`Schedule` is stages, each a set of weights from a global step on (the first at step
0), and optional linear ramps: a stage with ``ramp=r`` moves from the weights in force just
before it to its own over its first ``r`` steps, one constant step at a time (step ``b + i``
of a stage at ``b`` is ``(i + 1) / r`` of the way). Feedback (``Loader.set_weights``) adds
``(step, weights)`` entries: the latest change at or before a step holds, a schedule's stage
or a feedback entry, so feedback holds until the next stage begins (or the next call).

The *global step* counts the batches each rank was handed since the run's start, across
epochs and resumes (``Loader.step``): a pure function of the run, the same on every rank.
:mod:`lanceloader.ordering.pieces` turns the weights per step into the mix's pieces.

Example::

    >>> s = Schedule({0: {"web": 0.7, "code": 0.3}, 100: {"web": 0.5, "code": 0.5}}, ramps={100: 4})
    >>> [round(s.weights_at(step)["web"], 3) for step in (99, 100, 101, 103, 500)]
    [0.7, 0.65, 0.6, 0.5, 0.5]
"""

from __future__ import annotations

import bisect
import itertools
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Weights = dict[str, float]


def _check_step(step: Any, what: str) -> int:
    if isinstance(step, bool) or not isinstance(step, numbers.Integral) or step < 0:
        raise ValueError(f"{what} must be a whole number >= 0 (a global step), got {step!r}")
    return int(step)


def _shares(weights: Mapping[str, float]) -> Weights:
    """Weights scaled to sum to 1 (the scale of weights carries no meaning)."""
    total = sum(weights.values())
    return {n: w / total for n, w in weights.items()}


@dataclass(frozen=True)
class Schedule:
    """Mixture weights per stage, each from a global step on, with optional linear ramps.

    Args:
        stages: ``{step: {source: weight}}`` (or a list of ``(step, weights)`` pairs in
            increasing steps); the first stage starts at step 0. Weights are checked against
            the mix's sources by :class:`~lanceloader.Mix` (any positive scale; 0 leaves a
            source out for that stage).
        ramps: ``{stage step: r}``: that stage reaches its weights over its first ``r`` steps,
            linearly, one step at a time, from the weights in force before it; the ramp must
            end by the next stage.

    >>> Schedule({0: {"a": 1, "b": 1}, 10: {"a": 3, "b": 1}}).steps
    (0, 10)
    >>> Schedule({5: {"a": 1}})
    Traceback (most recent call last):
    ...
    ValueError: a schedule's first stage must start at step 0 (the run's start), got stages at steps [5]; add a stage {0: {...}} with the weights to start with
    """

    stages: tuple[tuple[int, Weights], ...]
    ramps: dict[int, int] = field(default_factory=dict)

    def __init__(
        self,
        stages: Mapping[int, Mapping[str, float]] | Sequence[tuple[int, Mapping[str, float]]],
        ramps: Mapping[int, int] | None = None,
    ) -> None:
        pairs = list(stages.items()) if isinstance(stages, Mapping) else list(stages)
        if not pairs:
            raise ValueError("a schedule needs at least one stage, e.g. {0: {'a': 1, 'b': 1}}")
        steps = [_check_step(step, "a stage's step") for step, _ in pairs]
        for before, after in itertools.pairwise(steps):
            if after <= before:
                raise ValueError(
                    f"stage starts must increase: step {after} comes after step {before}; "
                    "list the stages in increasing steps, each step once"
                )
        if steps[0] != 0:
            raise ValueError(
                f"a schedule's first stage must start at step 0 (the run's start), got "
                f"stages at steps {steps}; add a stage {{0: {{...}}}} with the weights to "
                "start with"
            )
        for step, weights in pairs:
            if not isinstance(weights, Mapping):
                raise TypeError(
                    f"the stage at step {step} must be a dict {{source: weight}}, got "
                    f"{type(weights).__name__} {weights!r}"
                )
        ramps = dict(ramps or {})
        for at, length in ramps.items():
            _check_ramp(at, length, steps)
        stages_ = tuple(
            (s, {str(n): w for n, w in ws.items()})
            for s, ws in zip(steps, (w for _, w in pairs), strict=True)
        )
        object.__setattr__(self, "stages", stages_)
        object.__setattr__(self, "ramps", {int(a): int(r) for a, r in ramps.items()})

    @property
    def steps(self) -> tuple[int, ...]:
        """The steps the stages start at."""
        return tuple(step for step, _ in self.stages)

    def settings(self) -> list[list[Any]]:
        """The schedule as plain JSON data (``state["order"]["mix"]["schedule"]``):
        ``[[step, weights, ramp], ...]``."""
        return [[s, dict(w), self.ramps.get(s, 0)] for s, w in self.stages]

    @classmethod
    def of_settings(cls, settings: Sequence[Sequence[Any]]) -> Schedule:
        """The schedule :meth:`settings` describes."""
        return cls([(s, w) for s, w, _ in settings], {s: r for s, _, r in settings if r})

    def weights_at(self, step: int, feedback: Sequence[tuple[int, Weights]] = ()) -> Weights:
        """The weights in force at ``step`` (as given; shares on a ramp), with ``feedback`` entries ``(step,
        weights)`` in increasing steps: the latest change at or before ``step`` holds."""
        steps = self.steps
        i = bisect.bisect_right(steps, step) - 1
        begins = steps[i]
        j = bisect.bisect_right([s for s, _ in feedback], step) - 1
        if j >= 0 and feedback[j][0] >= begins:
            return feedback[j][1]
        ramp = self.ramps.get(begins, 0)
        if step >= begins + ramp:
            return self.stages[i][1]  # as given: the quotas of an unchanged mix, exactly
        target = _shares(self.stages[i][1])
        before = _shares(self.weights_at(begins - 1, feedback))
        frac = (step - begins + 1) / ramp
        names = sorted(set(before) | set(target))
        return {
            n: before.get(n, 0.0) + (target.get(n, 0.0) - before.get(n, 0.0)) * frac for n in names
        }

    def changes_after(self, step: int, feedback: Sequence[tuple[int, Weights]] = ()) -> list[int]:
        """The steps at which a new piece begins once a run is anchored at ``step`` with the
        piece in force before it: every stage start, ramp step and feedback entry from
        ``step`` on (the first stage is the run's first piece, not a change); ascending."""
        points = {s for s, _ in feedback if s >= step}
        for begins in self.steps:
            ramp = range(begins, begins + max(self.ramps.get(begins, 0), 1))
            points.update(s for s in ramp if s >= max(step, 1))
        return sorted(points)


def _check_ramp(at: Any, length: Any, steps: list[int]) -> None:
    if at not in steps:
        raise ValueError(
            f"ramps name step {at!r}, where no stage starts (stages start at {steps}): a "
            "ramp belongs to the stage it leads into"
        )
    if at == 0:
        raise ValueError("the stage at step 0 has nothing to ramp from; give ramps to later stages")
    if isinstance(length, bool) or not isinstance(length, numbers.Integral) or length < 1:
        raise ValueError(f"the ramp of the stage at step {at} must be >= 1 steps, got {length!r}")
    later = [s for s in steps if s > at]
    if later and at + length > later[0]:
        raise ValueError(
            f"the ramp of the stage at step {at} ({length} steps) runs past the next stage at "
            f"step {later[0]}; end it by then (ramp <= {later[0] - at})"
        )


def check_feedback_step(step: Any, next_step: int) -> int:
    """A feedback step: a whole number, not in the past (the batches before ``next_step`` were
    handed out already)."""
    step = _check_step(step, "step")
    if step < next_step:
        raise ValueError(
            f"set_weights(step={step}) names a step in the past: the loader has handed out "
            f"steps up to {next_step - 1} already, so new weights can start at step "
            f"{next_step} at the earliest (loader.step); pass step={next_step} or later"
        )
    return step
