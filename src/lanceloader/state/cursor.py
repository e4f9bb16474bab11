"""Cursor: where a stream stands, how it advances, and how its state is made and resumed.

One cursor per stateful object (``Loader``, ``Sampler``, ``BatchSampler``, ``IterableDataset``);
none of them builds a state dict itself. The position is ``(epoch, start, done)``: the epoch, the
global sample its current plan starts at (a resumed epoch starts mid-way), and the batches of
that plan this rank has delivered. Three moments matter:

* **mid-epoch**: ``done < len(plan)``; the state's ``sample`` is the next global sample.
* **end of epoch**: every batch of the plan delivered, ``StopIteration`` not yet seen. The state's
  ``sample`` is the epoch's row count; resuming there yields the empty remainder of the epoch,
  then the next epoch: the same stream an uninterrupted run delivers.
* **next epoch**: after ``StopIteration``, :meth:`Cursor.end_epoch` moves to ``(epoch + 1, 0)``.

The cursor is plain data plus pure arithmetic over :class:`~lanceloader.ordering.plan.Plan`; who may move
it (one live iterator for a ``Loader``, the newest iterator for torch's samplers) is decided by
its owner.

Example::

    >>> from lanceloader.ordering.order import Order
    >>> from lanceloader.state.format import StreamSpec, order_settings
    >>> spec = StreamSpec(num_rows=10, order=order_settings(None, Order(10)), batch_size=4)
    >>> cursor = Cursor(spec)
    >>> cursor.advance(3)                       # the epoch's 3 batches were delivered
    >>> cursor.state_dict()["sample"], cursor.remaining
    (10, 0)
    >>> cursor.end_epoch(); cursor.epoch, cursor.state_dict()["sample"]
    (1, 0)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lanceloader.ordering.plan import Plan
from lanceloader.state.format import StreamSpec, resume_point


@dataclass
class Cursor:
    """Position ``(epoch, start, done)`` in the stream that ``spec`` defines."""

    spec: StreamSpec
    epoch: int = 0
    start: int = 0
    done: int = 0

    @property
    def plan(self) -> Plan:
        """This rank's plan for the current epoch, from ``start`` on."""
        return self.spec.plan(self.start)

    @property
    def sample(self) -> int:
        """Global samples of the epoch consumed by all ranks (the epoch's rows at its end)."""
        return self.plan.samples_done(self.done)

    @property
    def remaining(self) -> int:
        """Batches of the epoch this rank has still to deliver."""
        return len(self.plan) - self.done

    @property
    def at_end(self) -> bool:
        return self.remaining <= 0

    def advance(self, batches: int = 1) -> None:
        """Count ``batches`` more delivered to the training loop."""
        self.done += batches

    def rebase(self) -> None:
        """Restart the plan at the next sample (same batches from here on, ``done`` = 0), so an
        iterator started now numbers its batches from 0."""
        self.start, self.done = self.sample, 0

    def end_epoch(self) -> None:
        """The epoch's end was reached (``StopIteration``): move to the next epoch's start."""
        self.epoch, self.start, self.done = self.epoch + 1, 0, 0

    def seek(self, epoch: int, sample: int = 0) -> None:
        """Move to global sample ``sample`` of ``epoch``."""
        self.epoch, self.start, self.done = epoch, sample, 0

    def state_dict(self, **extra: Any) -> dict[str, Any]:
        """The state here: small, JSON-safe, the same keys at every position (``state.py``)."""
        return self.spec.state(self.epoch, self.sample, **extra)

    def load_state_dict(self, state: Any, allow_changes: tuple[str, ...] | list[str] = ()) -> None:
        """Check ``state`` against the spec and move to its position (see ``state.py``)."""
        self.seek(*resume_point(state, self.spec, allow_changes))
