"""Pools of workers as a stream sees them: tasks submitted, results taken back in task order.

:class:`Pool` is the whole of what a :class:`~lanceloader.engine.stream.Stream` asks of its
workers; :class:`~lanceloader.engine.threads.ThreadPool` (threads of this process) and
:class:`~lanceloader.engine.processes.ProcessPool` (forkserver processes) implement it, and a
pool of other workers (Ray actors, issue 46) would be one more class, touching no stream.

* :class:`Ordered` runs a stream's tasks through a pool, at most ``depth`` in flight. That bound
  is the bound on memory too: a task is one read of at most ``READ_BYTES_MOST`` of Arrow data
  (:mod:`lanceloader.engine.sizing`), and a pool holds a result only until it is taken.
* :class:`KeptPool` is the process pool a loader keeps across its epochs (started by its first
  stream, reused by the next as long as the workers would hold the same work; closed by the
  loader's ``close()``, its garbage collection, the interpreter's exit).

Example::

    >>> from lanceloader.engine.threads import ThreadPool
    >>> pool = ThreadPool(lambda x: x + 1, num_workers=2)
    >>> first = Ordered(pool, iter(range(10)), depth=3, keep=True)
    >>> next(first), next(first)
    (1, 2)
    >>> first.close()  # its tasks in flight are discarded: the next stream starts clean
    >>> list(Ordered(pool, iter(range(100, 103)), depth=3))  # (and closes the pool at its end)
    [101, 102, 103]
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any, Protocol, TypeVar

from lanceloader.engine.pickling import Shipment
from lanceloader.engine.processes import ProcessPool
from lanceloader.engine.threads import check_same_process

R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)


class Pool(Protocol[R_co]):
    """Workers that run submitted tasks and give their results back in submission order.

    * ``submit(task)`` hands a task to the workers and never waits for them (a task that cannot
      be sent fails here).
    * ``take()`` returns the result of the oldest task submitted and not yet taken, or raises
      its error; a pool may hand a task's result out in pieces, in order (each a result of the
      task's next batches: :class:`~lanceloader.engine.actors.ActorPool` gives a lost read's
      batches as they are rebuilt), the task in flight until its last piece is taken. It
      waits at most ``stall_timeout`` seconds
      (:class:`~lanceloader.engine.threads.Stalled`), wakes for signals, and names a worker
      that died (:class:`~lanceloader.engine.processes.WorkerDiedError`). A pool whose ``take``
      raised is closed.
    * ``in_flight``: tasks submitted and not yet taken. The pool has no bound of its own: its
      caller bounds the tasks (and so the bytes) in flight (:class:`Ordered`).
    * ``discard()`` forgets every task in flight, at once: none of their results is ever taken,
      and the pool takes new tasks after it.
    * ``close()`` stops the workers at once, whatever they are doing; idempotent.
    """

    stall_timeout: float | None

    @property
    def in_flight(self) -> int: ...

    @property
    def closed(self) -> bool: ...

    def submit(self, task: Any) -> None: ...

    def take(self) -> R_co: ...

    def discard(self) -> None: ...

    def close(self) -> None: ...


class Ordered(Iterator[R]):
    """The results of ``tasks`` from ``pool``, in task order, at most ``depth`` tasks in flight.

    It lets go of the pool at its end, on ``close()`` (idempotent) and on garbage collection: a
    pool it was lent (``keep=True``, a :class:`KeptPool`'s) has its tasks in flight discarded
    and stays open for the next stream; any other is closed. A pool that raised (a task's
    error, a dead worker, a stall, Ctrl-C in the wait) is closed either way.
    """

    def __init__(
        self, pool: Pool[R], tasks: Iterator[Any], depth: int, keep: bool = False, gate: Any = None
    ) -> None:
        self.pool, self._tasks, self._depth, self._keep = pool, tasks, depth, keep
        self._gate = gate  # a Governor (engine/budget.py): may put a task's start off
        self._next: Any = None  # the next task, drawn and not yet submitted
        self._drawn_all = False  # the tasks are exhausted
        self._pid = os.getpid()
        self._done = False
        try:
            if depth < 1:
                raise ValueError(f"prefetch depth must be >= 1, got {depth}")
            self._fill()
        except BaseException:
            self._let_go(failed=True)
            raise

    @property
    def in_flight(self) -> int:
        """Tasks submitted and not yet yielded."""
        return 0 if self._done else self.pool.in_flight

    @property
    def all_sent(self) -> bool:
        """Every task was submitted (the last ones in flight, or taken)."""
        return self._drawn_all and self._next is None

    def deepen(self, depth: int) -> None:
        """Keep up to ``depth`` tasks in flight from now on (reads sent ahead grow to their
        stream's depth), submitting them now."""
        self._depth = max(self._depth, depth)
        try:
            self._fill()
        except BaseException:
            self._let_go(failed=True)
            raise

    def _fill(self) -> None:
        """Submit tasks up to the depth; a gate may put them off while some are in flight
        (with none in flight it always lets one start: the stream makes progress)."""
        while self.pool.in_flight < self._depth:
            if self._next is None:
                self._next = next(self._tasks, None)
                if self._next is None:
                    self._drawn_all = True
                    return
            if self._gate is not None and not self._gate.admit(
                self.pool.in_flight, self._depth, self.pool
            ):
                return
            task, self._next = self._next, None
            self.pool.submit(task)

    def __next__(self) -> R:
        check_same_process(self._pid)
        if self._done or not self.pool.in_flight:
            self.close()
            raise StopIteration
        try:
            before = self.pool.in_flight
            result = self.pool.take()
            if self._gate is not None and self.pool.in_flight < before:  # its last piece
                self._gate.taken()
            self._fill()
        except BaseException:
            self._let_go(failed=True)
            raise
        return result

    def _let_go(self, failed: bool) -> None:
        if self._done:
            return
        self._done = True
        if self._pid != os.getpid():
            return
        if self._keep and not failed:
            self.pool.discard()
        else:
            self.pool.close()

    def close(self) -> None:
        """Stop: the tasks in flight are dropped (see the class text). Idempotent."""
        self._let_go(failed=False)

    def __enter__(self) -> Ordered[R]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if hasattr(self, "_done"):
            self.close()


class KeptPool:
    """The process pool a loader keeps across its epochs, so its workers keep the dataset
    they opened and the cache pieces they hold (one pool per loader; in this process only).

    :meth:`pool_for` gives the running pool when its workers hold the same work (the same
    pickle, arrays of the same bytes) and count, else closes it and starts one; ``set_epoch`` and
    resuming to a place change no work, so they keep it, while a ``load_state_dict`` that
    changes the rows starts a new one. :meth:`close` (the loader's ``close()``, its garbage
    collection; every pool is closed at the interpreter's exit too) stops it. Pickles empty: a
    pool belongs to the process that started it, and a fork child starts its own.
    """

    def __init__(self) -> None:
        self.pool: Any = None  # a ProcessPool, or another pool of the same members (actors.py)

    def pool_for(
        self,
        work: Callable[[Any], Any],
        num_workers: int,
        start: Callable[[Shipment, int], Any] = ProcessPool,
    ) -> Any:
        """A running pool of ``num_workers`` workers holding ``work`` (``start`` starts one:
        a :class:`ProcessPool`, or Ray actors)."""
        shipment = Shipment.of(work)
        pool = self.pool
        if pool is not None and (
            pool.closed
            or pool.owner != os.getpid()
            or pool.num_workers != num_workers
            or pool.shipment != shipment
        ):
            self.close()
        if self.pool is None:
            self.pool = start(shipment, num_workers)
        return self.pool

    def close(self) -> None:
        """Stop the pool's workers (idempotent); the next :meth:`pool_for` starts new ones."""
        pool, self.pool = self.pool, None
        if pool is not None and pool.owner == os.getpid():
            pool.close()

    def __del__(self) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.pool = None
