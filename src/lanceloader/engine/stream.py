"""Engine: the one place that turns (order, plan, epoch, batches) into batches in order.

``Loader``, the torch ``IterableDataset`` and ``MapDataset``'s read-ahead are faces over
:class:`Stream`; none of them assembles ``read_tasks → BatchWork → pool`` itself.

Contract of a :class:`Stream`:

* It yields the batches of ``batches`` (numbers in the plan; any step) in that order, each made
  by :class:`~lanceloader.engine.work.BatchWork` in a worker (a thread, or a forkserver process),
  finished in the consumer (tensors from a process worker's NumPy, device placement).
* Reads group consecutive batches (sized by :mod:`lanceloader.engine.sizing`:
  :func:`~lanceloader.engine.sizing.batches_per_read`); at most ``reads_in_flight`` reads are
  submitted and not yet consumed, plus the one being consumed. The memory bound is therefore
  ``(reads_in_flight + 1) × READ_BYTES_MOST`` of Arrow data (a mix's read: up to 4 ×
  ``READ_BYTES``, one Lance call per source; and what the transform makes of it), whatever
  the dataset's size. On object storage reads start at full
  size, and a sequential read of a Lance source ends at the batch that holds a fragment's
  first row (:func:`~lanceloader.engine.tasks.stream_tasks`).
* A stream of thread workers first keeps freed reads' memory in the process
  (:func:`~lanceloader.engine.memory.reuse_freed_memory`: glibc's thresholds at the ceiling
  of their own dynamic rule), so a read does not fault its pages in afresh.
* Every task's cost and every delivered batch are recorded in the ``Recorder`` (``stats()``).
* The workers are a :class:`~lanceloader.engine.pool.Pool`
  (:func:`~lanceloader.engine.reading.start_pool`): threads of the stream's own, or processes:
  a loader's epochs share one process pool (``kept``, a
  :class:`~lanceloader.engine.pool.KeptPool`), so its workers keep the dataset they opened and
  the cache pieces they hold; other streams start their own.
* ``close()`` (idempotent; also on exhaustion, on error and on garbage collection) lets go of
  the pool at once, whatever the workers are doing: queued reads are cancelled, busy process
  workers are killed, busy threads finish their task detached and drop it; a pool of the
  stream's own is closed, a kept one keeps its idle workers, and no result of this stream's
  tasks ever reaches the next stream. An error (Ctrl-C in the wait included) closes the pool
  either way. ``break``, an exception and Ctrl-C in the training loop therefore return control
  within a fraction of a second.
* No batch for ``stall_timeout`` seconds raises :class:`StallError`, naming the batch, the stage,
  the worker and showing the worker's stack; ``None`` waits forever.

Example::

    >>> import tempfile
    >>> from lanceloader.demo import write_demo_dataset
    >>> from lanceloader.ordering.order import Order
    >>> from lanceloader.ordering.plan import Plan
    >>> from lanceloader.rows.lance.source import Source
    >>> from lanceloader.engine.stats import Recorder
    >>> from lanceloader.engine.work import BatchWork
    >>> source = Source(write_demo_dataset(tempfile.mkdtemp() + "/d.lance", rows=10), ["id"])
    >>> work = BatchWork(source, Order(10), None, "numpy")
    >>> reading = Reading(work, num_workers=2, batches_per_read=2, reads_in_flight=2)
    >>> stream = Stream(reading, epoch=0, plan=Plan(10, 4), batches=range(3), recorder=Recorder())
    >>> [b["id"].tolist() for b in stream]
    [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
"""

from __future__ import annotations

import dis
import logging
import pickle
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from lanceloader.batch.output import to_output
from lanceloader.engine.ahead import ReadAhead
from lanceloader.engine.memory import TRAINING_TRIM_THRESHOLD, reuse_freed_memory
from lanceloader.engine.pool import KeptPool
from lanceloader.engine.reading import Reading, open_results
from lanceloader.engine.stalls import StallError as StallError  # (public here)
from lanceloader.engine.stalls import stall_error
from lanceloader.engine.stats import Recorder, count_delivered, count_end, end_cpu
from lanceloader.engine.threads import Stalled
from lanceloader.engine.work import TaskResult
from lanceloader.ordering.plan import Plan
from lanceloader.state.cursor import Cursor

_logger = logging.getLogger("lanceloader")


class Stream(Iterator[Any]):
    """The batches ``batches`` of ``plan`` in epoch ``epoch``, in order, from a pool of workers.

    ``next_batch`` is the plan number of the batch the next ``next()`` returns;
    ``on_all_sent`` is called once, in the loop's ``next()``, when the stream has sent its last
    read (the loader's read across the epoch's end, :mod:`lanceloader.engine.ahead`);
    ``began``: when the loop began to wait for it (default: now).
    """

    def __init__(
        self,
        reading: Reading,
        epoch: int,
        plan: Plan,
        batches: range,
        recorder: Recorder,
        log_every: int | None = None,
        kept: KeptPool | None = None,
        ahead: ReadAhead | None = None,
        on_all_sent: Callable[[], None] | None = None,
        began: float | None = None,
    ) -> None:
        # The loop waits from ``began`` (its iter(), where a loader's iterator starts it: a
        # followed table's version check is its wait too), else from here: the stream's start
        # is its wait.
        began = time.perf_counter() if began is None else began
        self.epoch, self.plan, self.batches = epoch, plan, batches
        self._delivered = 0
        self._buffer: deque[tuple[Any, int, int]] = deque()
        self._recorder = recorder
        self._counters = recorder.new_epoch()
        self._tracing = recorder.tracing
        self._log_every = log_every
        if reading.worker_type == "thread":  # this process reads
            reuse_freed_memory(TRAINING_TRIM_THRESHOLD)
        if ahead is not None:  # this epoch's first reads, sent while the last one ended
            reading, self._results = ahead.reading, ahead.results
            self._results.deepen(reading.reads_in_flight)
        else:
            self._results = open_results(
                reading, epoch, plan, batches, self._tracing, kept, reading.reads_in_flight
            )
        self._pool = self._results.pool  # (its workers: the fault tests and benchmark look)
        self._governor = governor = reading.governor
        self._budget = governor if governor and governor.cpu_budget is not None else None
        self._waits_s, self._waits = 0.0, 0  # the loop's waits not yet told to the governor
        self._on_all_sent = on_all_sent
        self._workers = (reading.num_workers, reading.worker_type)
        self._finish = reading.finish
        self._placement = reading.placement
        # Starting the pool (process workers: ~0.2 s each) is part of the first batch's wait and
        # of the epoch's wall time: the loop waits for it inside iter().
        self._handed_out = time.perf_counter()
        self._started, self._startup_s = began, self._handed_out - began

    @property
    def all_sent(self) -> bool:
        """Every read task of the stream was sent to the workers (its last reads run)."""
        return self._results.all_sent

    @property
    def next_batch(self) -> int:
        """The plan number of the next batch (past the end when the stream is done)."""
        return self.batches.start + self._delivered * self.batches.step

    def __len__(self) -> int:
        """Batches still to come."""
        return len(self.batches) - self._delivered

    def __next__(self) -> Any:
        asked = time.perf_counter()
        budget = self._budget  # the budget's CPU clock only (a system call: ~1.6 us)
        cpu_in = time.thread_time() if budget is not None else 0.0
        if not self._buffer:
            self._hand_waits()
            if self._delivered >= len(self.batches):  # the end, before the workers' stop
                now = time.perf_counter()
                count_end(self._counters, now - asked, now - self._started)
                self.close()
                raise StopIteration
            try:
                # (a process's result as it travelled: its batches are cut here)
                result = next(self._results).after_transport()  # StopIteration: the end
            except StopIteration:  # the loop waited for the end too (closing the workers)
                now = time.perf_counter()
                count_end(self._counters, now - asked, now - self._started)
                raise
            except Stalled as stalled:
                raise stall_error(stalled, *self._workers) from None
            if self._finish is not None:
                result.batches = [to_output(b, self._finish) for b in result.batches]
            self._record_task(result)
            self._buffer.extend(zip(result.batches, result.rows, result.nbytes, strict=True))
            if self._on_all_sent is not None and self._results.all_sent:  # (once)
                on_all_sent, self._on_all_sent = self._on_all_sent, None
                on_all_sent()
        batch, rows, nbytes = self._buffer.popleft()
        if self._placement is not None:  # each batch's device wait just before its own step
            batch = self._placement(batch)
        now = time.perf_counter()
        if self._delivered:
            waited = now - asked
            self._waits_s += waited  # the tuner's evidence, handed over once a read
            self._waits += 1
        else:  # the first batch waited for the pool's start too; not the tuner's evidence
            waited = now - asked + self._startup_s
        if budget is not None:  # this batch's CPU here
            budget.consumer_cpu(cpu_in)
        count_delivered(
            self._counters, rows, nbytes, waited, asked - self._handed_out, now - self._started
        )
        if self._tracing:
            index = self.next_batch
            self._recorder.event("training step", self._handed_out, asked, batch=index - 1)
            self._recorder.event("wait for batch", asked, now, batch=index)
        self._handed_out = now
        self._delivered += 1
        if self._log_every and self._delivered % self._log_every == 0:
            self._log_progress()
        return batch

    def _hand_waits(self) -> None:
        """Tell the governor of the loop's waits since the last read (per read, not per batch:
        the loop's ``next()`` runs as few calls as it can)."""
        if self._waits and self._governor is not None:
            self._governor.delivered(self._waits_s, self._waits)
        self._waits_s, self._waits = 0.0, 0

    def _record_task(self, result: TaskResult) -> None:
        rows_read = sum(result.rows) + result.rows_skipped
        self._recorder.task(
            result.seconds,
            rows_read,
            result.io_bytes,
            result.io_iops,
            result.rows_skipped,
            self._results.in_flight + 1,
            rows_cached=result.rows_cached,
            cache_damaged=result.cache_damaged,
            cache_fills=result.cache_fills,
        )
        for name, start, end, args in result.spans:
            self._recorder.event(name, start, end, lane=result.lane, **args)

    def _log_progress(self) -> None:
        stats = self._recorder.snapshot(
            workers=self._workers[0], worker_type=self._workers[1], epoch=-1
        )
        _logger.info(
            "epoch %d: %d/%d batches, %.0f rows/s, %.1f MB/s, loop waited %.0f%%; %s",
            self.epoch,
            self.next_batch,
            len(self.plan),
            stats.rows_per_s,
            stats.bytes_per_s / 1e6,
            100 * stats.wait_s / max(stats.wall_s, 1e-9),
            stats.bottleneck.stage,
        )

    def close(self) -> None:
        """Stop (idempotent): the pool is closed, or a kept one has this stream's tasks in
        flight discarded; the batches not yet delivered are dropped."""
        self._results.close()
        self._buffer.clear()
        if not sys.is_finalizing():  # (the interpreter's exit collects it: nothing to read)
            self._hand_waits()
            end_cpu(self._counters)

    def __del__(self) -> None:
        if hasattr(self, "_results"):
            self.close()

    def __reduce__(self) -> Any:
        raise pickle.PicklingError("a running stream cannot be pickled; pickle its Loader")


_FOR_ITER = dis.opmap["FOR_ITER"]


def taken_by_for_loop(frame: Any) -> bool:
    """Whether ``frame`` (the caller of an iterator's ``__next__``) is running a ``for`` loop or
    comprehension over it (its current instruction is ``FOR_ITER``) rather than calling
    ``next()``: how a one-batch peek (``next(iter(loader))``) differs from a loop that broke.

    >>> import sys
    >>> class Probe:
    ...     def __iter__(self):
    ...         return self
    ...     def __next__(self):
    ...         return taken_by_for_loop(sys._getframe(1))
    >>> next(Probe()), [x for x, _ in zip(Probe(), range(1))]
    (False, [True])
    """
    lasti = frame.f_lasti
    code = frame.f_code.co_code
    return 0 <= lasti < len(code) and code[lasti] == _FOR_ITER


@dataclass
class Handoff:
    """What an iterator of a loader did, kept by the loader after the iterator is gone: the
    cursor's place (epoch, global sample) after its first batch, the batches it delivered,
    whether the first was taken by a direct ``next()`` call, and whether it ended by itself (the
    epoch's end, or an error) rather than by being dropped."""

    epoch: int = 0
    sample: int = 0
    delivered: int = 0
    by_call: bool = False
    finished: bool = False

    def dropped_one_peek(self, cursor: Cursor) -> bool:
        """True when the iterator gave exactly one batch, to a ``next()`` call (not a ``for``
        loop), was dropped before the epoch's end, and the cursor still stands where it left
        it: the pattern ``next(iter(loader))`` to look at a sample, which consumes that batch."""
        return (
            self.delivered == 1
            and self.by_call
            and not self.finished
            and (cursor.epoch, cursor.sample) == (self.epoch, self.sample)
        )


class EpochIterator(Iterator[Any]):
    """The rest of the cursor's epoch (a ``Loader``'s iterator): a :class:`Stream` from the
    cursor's place to the epoch's end that moves the cursor with each batch it hands out, and to
    the next epoch at ``StopIteration``. ``close()`` stops its workers (idempotent) and leaves
    the cursor where it stopped. ``handoff`` records what it did (:class:`Handoff`), for the
    loader's next iterator. ``ahead``: the epoch's first reads, sent already
    (:class:`~lanceloader.engine.ahead.ReadAhead`, fitting this cursor: the loader checks);
    ``on_all_sent`` is called once by the stream, in the consumer, when it has sent its last
    read (the loader starts the next epoch's first reads there), ``on_stopped``
    when it stops before the epoch's end (the loader drops those reads); ``began``: when the
    loop's ``iter()`` began (the epoch's wall time and first wait run from there).

    Live from creation until exhausted or closed; a closed iterator yields nothing more.
    """

    def __init__(
        self,
        reading: Reading,
        cursor: Cursor,
        recorder: Recorder,
        log_every: int | None = None,
        kept: KeptPool | None = None,
        ahead: ReadAhead | None = None,
        on_all_sent: Callable[[], None] | None = None,
        on_stopped: Callable[[], None] | None = None,
        began: float | None = None,
    ) -> None:
        self.handoff = Handoff()
        self.live = False  # (until the stream started)
        self._on_stopped = on_stopped
        cursor.rebase()
        if cursor.at_end and len(cursor.spec.plan()):
            _logger.info(
                "epoch %d has no batches left (its last batch was delivered already): "
                "this iteration ends it, the next one starts epoch %d",
                cursor.epoch,
                cursor.epoch + 1,
            )
        self._cursor = cursor
        self._stream_args = (recorder, log_every, kept)
        plan = cursor.plan
        self.stream = Stream(
            reading,
            cursor.epoch,
            plan,
            range(len(plan)),
            recorder,
            log_every,
            kept,
            ahead,
            on_all_sent,
            began,
        )
        self.live = True

    def reread(self, reading: Reading) -> None:
        """Drop the batches read ahead and read the rest of the epoch with ``reading``, from
        the cursor's place on (a mix whose weights changed at a step read ahead already:
        ``Loader.set_weights``). The loop's next batch is the cursor's next one."""
        if not self.live:
            return
        self.stream.close()  # (with it its on_all_sent: the read ahead was for the old reading)
        self._cursor.rebase()
        plan = self._cursor.plan
        self.stream = Stream(
            reading, self._cursor.epoch, plan, range(len(plan)), *self._stream_args
        )

    @property
    def epoch(self) -> int:
        """The epoch this iterator delivers."""
        return self.stream.epoch

    def __next__(self) -> Any:
        if not self.live:
            raise StopIteration
        try:
            batch = next(self.stream)
        except StopIteration:
            self.live = False
            self.handoff.finished = True
            self._cursor.end_epoch()
            raise
        except BaseException:
            self.handoff.finished = True  # an error the loop saw, not a silent drop
            self.close()
            raise
        self._cursor.advance()
        record = self.handoff
        if record.delivered == 0:  # the first batch: by next() or by a loop? (~1 µs, once)
            record.by_call = not taken_by_for_loop(sys._getframe(1))
            record.epoch, record.sample = self._cursor.epoch, self._cursor.sample
        record.delivered += 1
        return batch

    def __len__(self) -> int:
        """Batches this iterator has still to deliver."""
        return len(self.stream) if self.live else 0

    def finish_if_delivered(self) -> bool:
        """End the epoch, as ``StopIteration`` would, when every batch was handed out and the
        iterator is still held: a loop that stops at ``len()`` and keeps its iterator
        (Lightning's) never asks for the ``StopIteration``, and its next ``iter()`` is the next
        epoch. (An iterator closed or collected there leaves the cursor at the epoch's end, as a
        state taken there does.) True when it did."""
        if not self.live or len(self.stream):
            return False
        self.live = False
        self.handoff.finished = True
        self._cursor.end_epoch()
        self.stream.close()
        return True

    def close(self) -> None:
        """Stop the workers of this epoch; the loader's cursor stays where it stopped. Stopped
        before its end (``break``, an error, ``close()``), it calls ``on_stopped``."""
        stopped, self.live = self.live, False
        self.stream.close()
        if stopped and self._on_stopped is not None:
            self._on_stopped()

    def __del__(self) -> None:
        if getattr(self, "live", False) and not sys.is_finalizing():
            self.close()

    def __enter__(self) -> EpochIterator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __reduce__(self) -> Any:
        raise pickle.PicklingError("a running epoch cannot be pickled; pickle the Loader instead")
