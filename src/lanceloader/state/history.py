"""History: a run's resumes, and which global samples each of its steps took.

A run is a chain of *segments*: it starts at ``(epoch 0, sample 0)`` and each resume from a
saved state starts a new segment at the state's ``(epoch, sample)``, possibly with another
number of ranks, batch size or ``drop_last`` (an elastic resume, :mod:`lanceloader.state.cursor`).
Within a segment the steps are those of :class:`~lanceloader.ordering.plan.Plan`; a *step* of
epoch *e* on a rank counts the batches that rank was handed in epoch *e*, across resumes (the
``i`` of ``for i, batch in enumerate(loader)`` in an uninterrupted epoch, continued by a resumed
iterator). So step *s* of epoch *e* lies in the segment that was running when the epoch had taken
*s* steps, and its samples are that segment's plan's batch ``s - steps before it``: O(segments)
arithmetic, nothing replayed, whatever *s* is.

What states can say: a state records its own position and the batching (ranks, batch size,
``drop_last``) of the run that *saved* it, not the history before. So the states a run resumed
from, in order, plus the batching of the last segment describe the run exactly
(:meth:`History.of_states`). One state alone describes a run that never changed its batching;
a state whose sample is not a whole number of its steps from the epoch's start shows that the
run changed it, and is refused with the way out (pass the states it resumed from).

Pure: no I/O, no dataset; tested against :class:`~lanceloader.state.cursor.Cursor` runs.

Example::

    >>> two = Segment(epoch=0, sample=0, batch_size=4, world_size=2)
    >>> three = Segment(epoch=0, sample=16, batch_size=4, world_size=3)   # resumed at step 2
    >>> history = History(num_samples=40, segments=(two, three))
    >>> history.batch_samples(epoch=0, step=1, rank=1).tolist()           # before the resume
    [12, 13, 14, 15]
    >>> history.batch_samples(epoch=0, step=2, rank=2).tolist()           # after it
    [24, 25, 26, 27]
    >>> history.steps_in_epoch(0), history.steps_in_epoch(1)
    (4, 4)
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lanceloader.ordering.plan import Plan
from lanceloader.state.format import CHANGEABLE, StreamSpec, check_keys, resume_point


@dataclass(frozen=True)
class Segment:
    """A stretch of a run with one batching, from global sample ``sample`` of ``epoch`` on (to
    the next segment's start): what one resume (or the run's start) began.

    >>> Segment(0, 0, batch_size=8, world_size=2).global_batch_size
    16
    """

    epoch: int
    sample: int
    batch_size: int
    world_size: int = 1
    drop_last: bool = False

    @property
    def global_batch_size(self) -> int:
        return self.batch_size * self.world_size

    def plan(self, num_samples: int, start: int, rank: int = 0) -> Plan:
        """This segment's plan of an epoch of ``num_samples`` from ``start`` on."""
        return Plan(num_samples, self.batch_size, self.world_size, rank, self.drop_last, start)


@dataclass(frozen=True)
class Span:
    """The part of one epoch a segment ran: samples ``[start, stop)``, its steps ``first`` to
    ``first + steps`` (numbered within the epoch)."""

    segment: Segment
    start: int
    stop: int
    first: int
    steps: int


@dataclass(frozen=True)
class History:
    """The segments of a run over epochs of ``num_samples`` global samples (see the module's
    text). ``segments`` are in run order; the first begins the run, the last runs on forever.

    >>> History(10, (Segment(0, 0, batch_size=4),)).locate(5)   # 3 steps an epoch
    (1, 2)
    """

    num_samples: int
    segments: tuple[Segment, ...]

    def __post_init__(self) -> None:
        if not self.segments:
            raise ValueError("a history needs at least one segment (the run's start)")
        n = self.num_samples
        for before, seg in itertools.pairwise(self.segments):
            if (seg.epoch, seg.sample) < (before.epoch, before.sample):
                raise ValueError(
                    f"resume points must come in run order: (epoch {seg.epoch}, sample "
                    f"{seg.sample}) comes after (epoch {before.epoch}, sample {before.sample}); "
                    "list the states the run resumed from, oldest first"
                )
        for i, seg in enumerate(self.segments):
            if not 0 <= seg.sample <= n:
                raise ValueError(
                    f"segment {i} starts at sample {seg.sample}, outside an epoch of {n} samples"
                )
            if i + 1 < len(self.segments):
                self._check_boundary(i, self.segments[i + 1])

    def _check_boundary(self, i: int, nxt: Segment, what: str = "the run resumed at") -> None:
        """The next segment must begin where this one stood after whole steps."""
        seg = self.segments[i]
        start = seg.sample if nxt.epoch == seg.epoch else 0
        if nxt.sample in (0, self.num_samples) or (nxt.sample - start) % seg.global_batch_size == 0:
            return
        raise ValueError(
            f"{what} (epoch {nxt.epoch}, sample {nxt.sample}), which is not a whole number of "
            f"steps of {seg.world_size} rank(s) x {seg.batch_size} rows from sample {start}: "
            "the batching changed before then. Pass every state the run resumed from "
            "(resumed_from=[...], oldest first)"
        )

    @classmethod
    def of_states(
        cls, latest: dict[str, Any], resumed_from: Sequence[dict[str, Any]] = ()
    ) -> History:
        """The history of a run whose last segment has ``latest``'s batching (a state it saved,
        or the loader's own ``state_dict()``) and that resumed from the states
        ``resumed_from``, oldest first (each recorded the batching of the segment before it).

        >>> from lanceloader.ordering.order import Order
        >>> from lanceloader.state.format import StreamSpec, order_settings
        >>> order = order_settings(None, Order(40))
        >>> saved = StreamSpec(40, order, batch_size=4, world_size=2).state(epoch=0, sample=16)
        >>> now = StreamSpec(40, order, batch_size=4, world_size=3).state(epoch=0, sample=28)
        >>> [s.world_size for s in History.of_states(now, [saved]).segments]
        [2, 3]
        """
        check_keys(latest)
        read = [a[1] for a in latest["order"].get("follow", {}).get("adoptions", [])]
        if len(read) > 1:  # a followed table's epochs (rows/lance/follow.py)
            raise ValueError(
                f"the run followed a growing table and its epochs read versions {read} "
                "(state['order']['follow']); a History maps steps over epochs of one version "
                "(one size, the rows of one version): it does not cover a followed run that "
                "adopted a version yet"
            )
        stream = stream_spec(latest)
        for state in resumed_from:  # the same stream: dataset, version, order
            resume_point(state, stream, allow_changes=CHANGEABLE)
        states = [*resumed_from, latest]
        segments = [batching(states[0], 0, 0)]
        for resume, after in itertools.pairwise(states):
            segments.append(batching(after, resume["epoch"], resume["sample"]))
        history = cls(stream.num_rows, tuple(segments))
        last = latest["epoch"], latest["sample"]
        if not resumed_from or last >= (segments[-1].epoch, segments[-1].sample):
            history._check_boundary_to(segments[-1], last)
        return history

    def _check_boundary_to(self, seg: Segment, point: tuple[int, int]) -> None:
        """``point``, a position the last segment saved, must lie on its steps too."""
        probe = Segment(point[0], point[1], seg.batch_size, seg.world_size, seg.drop_last)
        self._check_boundary(len(self.segments) - 1, probe, what="the state is at")

    # --- where a step lies --------------------------------------------------------------------

    def spans(self, epoch: int) -> Iterator[Span]:
        """The segments that ran in ``epoch``, each with the samples and steps it ran there."""
        n, first = self.num_samples, 0
        for i, seg in enumerate(self.segments):
            nxt = self.segments[i + 1] if i + 1 < len(self.segments) else None
            if (seg.epoch, seg.sample) > (epoch, n) or (
                nxt is not None and (nxt.epoch, nxt.sample) <= (epoch, 0)
            ):
                continue  # ran before or after this epoch
            start = seg.sample if seg.epoch == epoch else 0
            stop = nxt.sample if nxt is not None and nxt.epoch == epoch else n
            if stop < start:
                continue
            plan = seg.plan(n, start)
            steps = min(len(plan), -(-(stop - start) // seg.global_batch_size))
            yield Span(seg, start, stop, first, steps)
            first += steps

    def steps_in_epoch(self, epoch: int) -> int:
        """Steps each rank takes in ``epoch`` (under the batching of each segment in it)."""
        check_epoch_step(epoch, 0)
        return sum(span.steps for span in self.spans(epoch))

    def plan(self, epoch: int, step: int, rank: int = 0) -> tuple[Plan, int]:
        """The plan (rank ``rank``'s) that ran step ``step`` of ``epoch``, and the step's batch
        number in it."""
        check_epoch_step(epoch, step)
        steps = 0
        for span in self.spans(epoch):
            if step < span.first + span.steps:
                seg = span.segment
                if not 0 <= rank < seg.world_size:
                    raise ValueError(
                        f"step {step} of epoch {epoch} ran on {seg.world_size} rank(s) (ranks 0 "
                        f"to {seg.world_size - 1}), so it has no rank {rank}"
                    )
                return seg.plan(self.num_samples, span.start, rank), step - span.first
            steps = span.first + span.steps
        raise IndexError(
            f"epoch {epoch} has {steps} steps (0 to {steps - 1}); step {step} is past its end"
        )

    def batch_samples(self, epoch: int, step: int, rank: int = 0) -> np.ndarray:
        """Global samples of ``epoch`` (int64, in batch order) that rank ``rank`` took at step
        ``step``."""
        plan, batch = self.plan(epoch, step, rank)
        return plan.batch_samples(batch)

    def world_size(self, epoch: int, step: int) -> int:
        """Ranks that took step ``step`` of ``epoch``."""
        return self.plan(epoch, step)[0].world_size

    def locate(self, global_step: int) -> tuple[int, int]:
        """``(epoch, step)`` of the run's ``global_step``-th step (counted from 0 at the run's
        start across epochs and resumes, as a training loop's step counter is). O(segments):
        the epochs between those where a segment begins are whole epochs of one batching."""
        check_epoch_step(0, global_step)
        left, epoch, running = global_step, 0, None
        for begins in sorted({seg.epoch for seg in self.segments}):
            if running is not None and epoch < begins:  # whole epochs of `running`
                per = len(running.plan(self.num_samples, 0))
                if per and left < per * (begins - epoch):
                    return epoch + left // per, left % per
                left -= per * (begins - epoch)
            steps = self.steps_in_epoch(begins)
            if left < steps:
                return begins, left
            left -= steps
            epoch = begins + 1
            running = [seg for seg in self.segments if seg.epoch == begins][-1]
        assert running is not None
        per = len(running.plan(self.num_samples, 0))
        if per == 0:
            raise IndexError(
                f"the run has {global_step - left} steps: from epoch {epoch} on an "
                f"epoch has none (fewer than {running.global_batch_size} samples "
                "with drop_last)"
            )
        return epoch + left // per, left % per

    def global_step(self, epoch: int, step: int) -> int:
        """The run's step counter at step ``step`` of ``epoch`` (the inverse of
        :meth:`locate`); O(segments).

        >>> History(10, (Segment(0, 0, batch_size=4),)).global_step(epoch=1, step=2)
        5
        """
        self.plan(epoch, step)  # the step exists
        total, whole_from, running = step, 0, None
        for begins in sorted({seg.epoch for seg in self.segments}):
            upto = min(begins, epoch)
            if running is not None and whole_from < upto:
                total += len(running.plan(self.num_samples, 0)) * (upto - whole_from)
            if begins >= epoch:
                return total
            total += self.steps_in_epoch(begins)
            whole_from = begins + 1
            running = [seg for seg in self.segments if seg.epoch == begins][-1]
        assert running is not None
        return total + len(running.plan(self.num_samples, 0)) * max(0, epoch - whole_from)


def stream_spec(state: dict[str, Any]) -> StreamSpec:
    """The stream a (checked) state is a position of, with its batching."""
    return StreamSpec(
        num_rows=state["order"]["rows"],
        order=state["order"],
        batch_size=state["batch_size"],
        world_size=state["world_size"],
        drop_last=state["drop_last"],
        uri=state["uri"],
        version=state["version"],
        dataset=state.get("dataset"),
        columns=None if state["columns"] is None else tuple(state["columns"]),
    )


def batching(state: dict[str, Any], epoch: int, sample: int) -> Segment:
    """A segment from ``(epoch, sample)`` on with ``state``'s batching."""
    return Segment(epoch, sample, state["batch_size"], state["world_size"], state["drop_last"])


def check_epoch_step(epoch: int, step: int) -> None:
    for name, value in (("epoch", epoch), ("step", step)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
            raise ValueError(f"{name} must be a whole number >= 0, got {value!r}")
