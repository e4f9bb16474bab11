"""Schedules and feedback, pure: random schedules, feedback calls and resumes at random steps
with random changes of batching (N -> M ranks) give the stream an independent sample-by-sample
simulation gives (every change at its exact step, every source's stream continued exactly),
and each piece keeps the interleave's ±1 promise in each epoch's stretch."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lanceloader.ordering.interleave import MAX_PERIOD, interleave, rational_weights
from lanceloader.ordering.mixrun import MixRun
from lanceloader.ordering.pieces import StepMap
from lanceloader.ordering.plan import Plan
from lanceloader.ordering.schedule import Schedule, check_feedback_step


def edf_reference(quotas: tuple[int, ...]) -> list[int]:
    """The interleave as first written: one pass over the sources per slot."""
    period = sum(quotas)
    given, slots = [0] * len(quotas), []
    for t in range(1, period + 1):
        best, due = -1, 0
        for k, q in enumerate(quotas):
            c = given[k]
            if c < q and c * period < t * q:
                deadline = -(-(c + 1) * period // q)
                if best < 0 or deadline < due:
                    best, due = k, deadline
        slots.append(best)
        given[best] += 1
    return slots


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 30), min_size=1, max_size=7).filter(any), st.integers(1, 200))
def test_heap_interleave_is_the_reference_and_its_prefixes(quotas, limit) -> None:
    quotas = tuple(quotas)
    reference = edf_reference(quotas)
    assert interleave.__wrapped__(quotas).tolist() == reference
    assert interleave.__wrapped__(quotas, limit).tolist() == reference[:limit]


def rational_reference(weights: list[float]) -> list[int]:
    """Quotas as first written: Fractions throughout."""
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


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(st.integers(0, 20), st.floats(0, 1e3, allow_nan=False)), min_size=1, max_size=120
    ).filter(lambda w: sum(w) > 0)
)
def test_quotas_are_the_reference_fractions(weights) -> None:
    assert rational_weights(weights) == rational_reference(weights)


@settings(max_examples=80, deadline=None)
@given(
    st.integers(1, 50), st.integers(1, 12), st.booleans(), st.integers(0, 30), st.integers(0, 60)
)
def test_step_map_places_steps_as_plans_cut_epochs(spe, batch, drop_last, anchor, steps) -> None:
    """The first sample of each step is where the epochs' plans put it, from any anchor."""
    per = len(Plan(spe, batch, drop_last=drop_last))
    if per == 0:
        return
    epochs = (anchor + steps) // per + 2
    first = [e * spe + b * batch for e in range(epochs) for b in range(per)]
    base = StepMap(spe, batch, drop_last)
    assert [base.index_of(s) for s in range(steps)] == first[:steps]
    moved = StepMap(spe, batch, drop_last, anchor, first[anchor])
    for s in range(anchor, anchor + steps):
        assert moved.index_of(s) == first[s]
        assert moved.step_of(first[s]) == s


NAMES = ("a", "b", "c")
weights = st.lists(st.integers(0, 5), min_size=3, max_size=3).filter(any)


@st.composite
def runs(draw):
    """A schedule, feedback calls (made at a step, for that step or later) and segments of
    batching (global batch per segment, starting at increasing steps)."""
    stage_steps = sorted(draw(st.sets(st.integers(1, 30), max_size=3)))
    stages = {0: dict(zip(NAMES, draw(weights), strict=True))}
    ramps = {}
    for i, step in enumerate(stage_steps):
        stages[step] = dict(zip(NAMES, draw(weights), strict=True))
        room = (stage_steps[i + 1] if i + 1 < len(stage_steps) else step + 8) - step
        if draw(st.booleans()):
            ramps[step] = draw(st.integers(1, room))
    feedback = [
        (call, call + draw(st.integers(0, 4)), dict(zip(NAMES, draw(weights), strict=True)))
        for call in sorted(draw(st.lists(st.integers(0, 35), max_size=3)))
    ]
    starts = sorted(draw(st.sets(st.integers(1, 35), max_size=3)))
    segments = [(s, draw(st.integers(1, 4)) * draw(st.integers(1, 3))) for s in [0, *starts]]
    return Schedule(stages, ramps), feedback, segments


def simulate(schedule, feedback, segments, spe, run, drop_last, steps):
    """Sample by sample, with the whole feedback known up front: ``[(step, source, index)]``
    of the delivered samples, and per (piece, epoch) the samples each source gave."""
    entries = sorted({s: w for _, s, w in feedback}.items())
    changes = {0} | {s for s, _ in entries}
    for begins, _ in schedule.stages:
        changes.update(range(begins, begins + max(schedule.ramps.get(begins, 0), 1)))
    given = [0] * len(NAMES)
    out, stretches = [], {}
    epoch = sample = 0
    piece = None

    def take(position):
        p_epoch, p_sample, quotas = piece
        place = position - p_sample if epoch == p_epoch else position
        k = int(interleave(quotas)[(place // run) % sum(quotas)])
        given[k] += 1
        stretch = stretches.setdefault((piece, epoch), [0] * len(NAMES))
        stretch[k] += 1
        return k, given[k] - 1

    def end_epoch_if_no_step_left(g):
        nonlocal epoch, sample
        if drop_last and spe - sample < g:  # no whole step left: the tail is used up, unread
            for position in range(sample, spe):
                take(position)
            epoch, sample = epoch + 1, 0

    for step in range(steps):
        g = [g for s, g in segments if s <= step][-1]
        end_epoch_if_no_step_left(g)  # under the batching that runs the step
        if step in changes:
            w = schedule.weights_at(step, entries)
            piece = (epoch, sample, tuple(rational_weights([w.get(n, 0.0) for n in NAMES])))
        for position in range(sample, min(sample + g, spe)):
            out.append((step, *take(position)))
        sample = min(sample + g, spe)
        end_epoch_if_no_step_left(g)  # under the batching that ran the epoch (its state's end)
        if sample == spe:
            epoch, sample = epoch + 1, 0
    return out, stretches


def implementation(schedule, feedback, segments, spe, run, drop_last, steps):
    """The same run through MixRun: feedback calls made as the loop reaches their step, and a
    resume (anchored at its position) where each segment of batching begins."""
    mix = MixRun.start(NAMES, schedule, run=run)
    out, calls = [], list(feedback)
    seg_at = dict(segments)
    g = seg_at[0]
    state_steps, pieces = mix.pieces(spe, g, drop_last)
    for step in range(steps):
        if step in seg_at and step:
            at = state_steps.index_of(step)
            mix = mix.continued_at(state_steps, at, pieces)
            g = seg_at[step]
            state_steps, pieces = mix.pieces(spe, g, drop_last)
        while calls and calls[0][0] <= step:
            _, at_step, w = calls.pop(0)
            check_feedback_step(at_step, step)
            mix = mix.with_feedback(at_step, w)
            state_steps, pieces = mix.pieces(spe, g, drop_last)
        lo = state_steps.index_of(step)
        hi = min(lo + g, (lo // spe + 1) * spe)
        located = pieces.locate(np.arange(lo, hi))
        sources = np.repeat(located.source, located.length)
        index = np.repeat(
            located.index - (np.cumsum(located.length) - located.length), located.length
        ) + np.arange(hi - lo)
        out += [(step, int(k), int(i)) for k, i in zip(sources, index, strict=True)]
    return out


@settings(max_examples=60, deadline=None)
@given(runs(), st.integers(5, 40), st.sampled_from([1, 1, 2, 3]), st.booleans())
def test_changes_and_resumes_deliver_the_simulated_stream(run, spe, run_length, drop_last) -> None:
    schedule, feedback, segments = run
    if any(len(Plan(spe, g, drop_last=drop_last)) == 0 for _, g in segments):
        return  # an epoch with no step of that batch: nothing runs
    steps = 40
    expected, stretches = simulate(schedule, feedback, segments, spe, run_length, drop_last, steps)
    got = implementation(schedule, feedback, segments, spe, run_length, drop_last, steps)
    assert got == expected
    # 0 repeats, 0 drops: each source's indices are 0, 1, 2, ... (with drop_last, the gaps
    # are the dropped tails, used up as an unchanged mix uses them)
    for k in range(len(NAMES)):
        index = [i for _, s, i in got if s == k]
        assert index == sorted(set(index))
        if not drop_last:
            assert index == list(range(len(index)))
    # ±1 (±1 run) of each piece's share in each epoch's stretch
    for ((_, _, quotas), _), counts in stretches.items():
        n = sum(counts)
        for q, c in zip(quotas, counts, strict=True):
            assert abs(c - n * q / sum(quotas)) <= run_length


def test_each_change_lands_on_the_first_sample_of_its_step() -> None:
    schedule = Schedule({0: {"a": 1, "b": 0, "c": 0}, 7: {"a": 0, "b": 1, "c": 0}})
    feedback = [(3, 11, {"a": 0, "b": 0, "c": 1})]
    got = implementation(schedule, feedback, [(0, 3), (5, 5)], 20, 1, False, 14)
    first_of = {step: [s for st_, s, _ in got if st_ == step] for step in (6, 7, 10, 11)}
    assert first_of == {6: [0] * 5, 7: [1] * 5, 10: [1] * 5, 11: [2] * 5}


@pytest.mark.parametrize(
    ("stages", "ramps", "message"),
    [
        ({3: {"a": 1}}, None, "first stage must start at step 0"),
        ([(0, {"a": 1}), (5, {"a": 2}), (5, {"a": 3})], None, "stage starts must increase"),
        ({0: {"a": 1}, -2: {"a": 1}}, None, "whole number >= 0"),
        ({0: {"a": 1}, 10: {"a": 2}}, {4: 2}, "where no stage starts"),
        ({0: {"a": 1}, 10: {"a": 2}, 12: {"a": 1}}, {10: 5}, "runs past the next stage"),
        ({0: {"a": 1}, 10: {"a": 2}}, {10: 0}, "must be >= 1 steps"),
        ({0: [1, 2]}, None, "must be a dict"),
    ],
)
def test_an_invalid_schedule_names_the_problem_and_the_fix(stages, ramps, message) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        Schedule(stages, ramps)


def test_feedback_refuses_a_past_step_and_bad_weights() -> None:
    with pytest.raises(ValueError, match=r"step in the past.*step=12 or later"):
        check_feedback_step(11, 12)
    run = MixRun.start(NAMES, Schedule({0: {"a": 1, "b": 1, "c": 1}}))
    for bad, message in [
        ({"a": -1, "b": 1, "c": 1}, "finite number >= 0"),
        ({"a": 1, "b": 1}, "one weight per source"),
        ({"a": 1, "b": 1, "c": 1, "z": 1}, "one weight per source"),
        ({"a": 1e-9, "b": 1, "c": 1}, "below 1/65536"),
    ]:
        with pytest.raises(ValueError, match=message):
            run.with_feedback(3, bad)


def test_the_digest_is_the_history_of_calls() -> None:
    start = MixRun.start(NAMES, Schedule({0: {"a": 1, "b": 1, "c": 1}}))
    one = start.with_feedback(3, {"a": 1, "b": 2, "c": 0})
    same = start.with_feedback(3, {"a": 1, "b": 2, "c": 0})
    other = start.with_feedback(4, {"a": 1, "b": 2, "c": 0})
    assert one.digest == same.digest != other.digest
    assert one.with_feedback(9, {"a": 1, "b": 1, "c": 1}).digest != one.digest
    assert len({r.digest for r in itertools.chain([start, one, other])}) == 3
