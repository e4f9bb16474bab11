"""Reading across an epoch's end: the next epoch's first reads, started while this epoch's
last reads run, so the training loop does not wait at every epoch's start for a fresh pool and a
first read (8-15 ms an epoch of JPEG batches on 2 cores: 0.5% of the wall time of a 125-step
epoch, docs/performance.md, "The loop's own time").

Contract:

* Every stream's reads start in :func:`~lanceloader.engine.reading.open_results`: a
  :class:`~lanceloader.engine.stream.Stream` calls it with its depth; :meth:`ReadAhead.start`
  with :data:`READS_AHEAD`: the first of that epoch's ramp.
* A :class:`ReadAhead` is started by a ``Loader`` when its live iterator has sent its epoch's
  last task (``Stream.all_sent``), for the epoch after, once the loop runs epoch after epoch
  (from the second on: a loader iterated once reads nothing ahead, :meth:`AheadSlot.started`), and holds that read on a thread pool of
  its own (so the memory in flight grows by the ramp's first reads, 1 and 4 batches, while
  an epoch's last reads run). The next ``iter()`` hands it to its stream when it starts that epoch at its first
  batch with the same pipeline, plan and tracing (:meth:`ReadAhead.fits`); the
  stream takes its pool and its results and deepens them to its own depth. Otherwise (another
  epoch, ``set_epoch``, ``load_state_dict``, new mixture weights, a followed table's new
  version, ``close()``, garbage collection) it is closed, its read dropped unseen.
* The read is the task a fresh stream sends first, made by the same work: the batches, their
  rows and their random draws are those of a stream started afresh, and the cursor never
  moves for it.
* Only thread workers without a device placement read ahead: a process pool is the loader's
  one kept pool, busy with this epoch's tasks, and a placement's device queue belongs to one
  stream.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from lanceloader.engine.pool import Ordered
from lanceloader.engine.reading import Reading, open_results
from lanceloader.engine.work import TaskResult
from lanceloader.ordering.plan import Plan

# The reads sent ahead: the ramp's first two (1 and 4 batches), so the loop, fed its first
# batch at once, is not left waiting for the second read, which a fresh stream would send only
# at its start (a read of 4 batches of JPEGs takes ~25 ms, the first batch's step 15).
READS_AHEAD = 2


def reads_ahead(reading: Reading) -> bool:
    """Whether a stream of ``reading`` may have the next epoch's first reads started ahead:
    thread workers with no device placement (see the module text)."""
    return reading.worker_type == "thread" and reading.placement is None


@dataclasses.dataclass
class ReadAhead:
    """The first reads of epoch ``epoch`` (``plan`` from its first batch), in flight for the
    loader's ``pipeline`` (compared by identity: a new one is new rows, weights or settings);
    see the module text. ``close()`` is idempotent."""

    pipeline: Any
    epoch: int
    plan: Plan
    reading: Reading
    results: Ordered[TaskResult]
    tracing: bool  # its workers time their spans (a trace() block began before it)

    @classmethod
    def start(
        cls, pipeline: Any, reading: Reading, epoch: int, plan: Plan, tracing: bool
    ) -> ReadAhead:
        """Send epoch ``epoch``'s first reads now, on threads of its own."""
        depth = min(READS_AHEAD, reading.reads_in_flight)
        results = open_results(reading, epoch, plan, range(len(plan)), tracing, None, depth)
        return cls(pipeline, epoch, plan, reading, results, tracing)

    def fits(self, pipeline: Any, epoch: int, plan: Plan, tracing: bool) -> bool:
        """Whether a stream of ``pipeline`` for ``epoch`` and ``plan`` (``tracing``: in a
        ``trace()`` block) would send these reads first."""
        here = (epoch, plan, tracing)
        return pipeline is self.pipeline and here == (self.epoch, self.plan, self.tracing)

    def close(self) -> None:
        """Drop the reads and stop their threads."""
        self.results.close()


class AheadSlot:
    """A loader's one :class:`ReadAhead`, or none: started by :meth:`start`, handed to the
    next stream by :meth:`take` when it fits, else closed there; :meth:`drop` closes it.
    Pickles empty (a read in flight belongs to its process)."""

    def __init__(self) -> None:
        self.ahead: ReadAhead | None = None
        self.last_epoch_started = -2  # the epoch an iterator last started at its first batch
        self.wanted = False  # that epoch came right after the one started before it

    def started(self, cursor: Any) -> None:
        """An iterator starts at ``cursor``: reads ahead are wanted once the loop runs one epoch
        after another (not for a loader iterated once: its read ahead would be wasted)."""
        if not (cursor.start or cursor.done):
            self.wanted = cursor.epoch == self.last_epoch_started + 1
            self.last_epoch_started = cursor.epoch

    def start(self, pipeline: Any, reading: Reading, cursor: Any, tracing: bool) -> None:
        """The live iterator at ``cursor`` sent its epoch's last read: send the next epoch's
        first reads (its plan from the first batch)."""
        self.drop()
        plan = cursor.spec.plan()
        if len(plan):
            self.ahead = ReadAhead.start(pipeline, reading, cursor.epoch + 1, plan, tracing)

    def take(self, pipeline: Any, cursor: Any, tracing: bool) -> ReadAhead | None:
        """The read ahead, when a stream of ``pipeline`` starting at ``cursor`` (``tracing``:
        in a ``trace()`` block) would send it first (the cursor at an epoch's first batch);
        else None, the read dropped."""
        ahead, self.ahead = self.ahead, None
        if ahead is None:
            return None
        at_first_batch = not (cursor.start or cursor.done)
        if at_first_batch and ahead.fits(pipeline, cursor.epoch, cursor.plan, tracing):
            return ahead
        ahead.close()
        return None

    def drop(self) -> None:
        """Close the read ahead, if any (idempotent)."""
        ahead, self.ahead = self.ahead, None
        if ahead is not None:
            ahead.close()

    def __getstate__(self) -> dict[str, Any]:
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()  # type: ignore[misc]
