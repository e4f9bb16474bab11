"""Steering a mix while it trains: a Loader's global step, its ``set_weights`` and the shares
each source delivered (``Loader(ll.Mix(...))``).

Why apart from ``loader.py``: these members read and change only the mix's weights, and they
are the one part of a Loader that a training loop calls between batches to change what later
batches hold. They run in the training process, on the caller's thread; a change is recorded in
the cursor's spec (so in ``state_dict()``), and a live iterator that may have read past the
change's step is told to read again (``EpochIterator.reread``), never to deliver stale rows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from lanceloader.rows.mixed import check_ranks_agree

if TYPE_CHECKING:
    from lanceloader.engine.live import LiveIterator
    from lanceloader.engine.reading import Reading
    from lanceloader.pipeline import Pipeline
    from lanceloader.state.cursor import Cursor


class MixSteering:
    """A Loader's mixture-weight members; the Loader holds the pipeline, cursor and live
    iterator they read and replace."""

    _pipeline: Pipeline
    _cursor: Cursor
    _live: LiveIterator
    _began: tuple[int, int]  # where this loader's delivery began (stats().mix counts from it)

    def reading(self, workers: int) -> Reading:  # the Loader's
        raise NotImplementedError

    @property
    def step(self) -> int:
        """The global step of the next batch: batches each rank was handed since the run's
        start, across epochs and resumes (a mix's loader; its schedule and ``set_weights``
        count in these steps)."""
        step = self._pipeline.source.step_at(self._cursor.epoch, self._cursor.sample)
        if step is None:
            raise ValueError(
                "loader.step counts the steps of a mix, whose weights change at steps; this "
                "loader reads no ll.Mix"
            )
        return step

    def set_weights(self, weights: Mapping[str, float], step: int | None = None) -> None:
        """Mix with ``weights`` (``{source: weight}``) from global ``step`` on (default: the
        next batch's, ``loader.step``; a step in the past is refused). Recorded in the state,
        so a resume on any world size replays it. Pass the same weights at the same step on
        every rank: with ``torch.distributed`` initialised, one small all-gather checks it
        (``ValueError`` naming the ranks that differ). A step a live iterator may have read
        ahead already (thread workers: within ``loader.prefetch + loader.batches_per_read``
        steps; process workers: within its epoch) makes it read again from its next batch,
        dropping what it read ahead. Example: the guide's "Weights that change during a run"
        (``docs/pretraining.md``)."""
        c, pipeline = self._cursor, self._pipeline
        next_step = pipeline.source.step_at(c.epoch, c.sample) or 0  # no mix: refused below
        source = pipeline.source.with_weights(weights, step, next_step)
        at = next_step if step is None else step
        if pipeline.batching.world_size > 1:  # torch.distributed: one all-gather of digests
            check_ranks_agree(source.settings()["mix"]["digest"], at)
        self._pipeline = dataclasses.replace(pipeline, source=source)
        self._cursor.spec = self._pipeline.spec()
        running = self._live.current()
        if running is not None and running.live and at < self._read_ahead_until(next_step):
            running.reread(self.reading(self._pipeline.num_workers))

    def mix_shares(self) -> tuple[Any, ...]:
        """What each source of a mix delivered since this loader began (or loaded a state),
        per piece of its weights: ``stats().mix`` without the rest of ``stats()`` (empty for
        a loader of no mix). Each is a ``MixShare``: ``step``, target ``weights``, ``rows``,
        ``promised``, ``tokens``."""
        c = self._cursor
        return tuple(self._pipeline.source.delivered(self._began, (c.epoch, c.sample)))

    def _read_ahead_until(self, next_step: int) -> int:
        """The step before which a live iterator may have read with the weights it began with:
        thread workers read each task with the newest weights (``set_weights``), so only the
        reads in flight and the one being handed out; process workers hold their copy for
        the epoch."""
        pipeline = self._pipeline
        if pipeline.workers.worker_type == "thread":
            reads = self.reading(pipeline.num_workers).reads_in_flight
            return next_step + (reads + 1) * pipeline.batches_per_read
        source = pipeline.source
        step = source.step_at(self._cursor.epoch, source.num_rows)  # the next epoch's
        return next_step if step is None else step
