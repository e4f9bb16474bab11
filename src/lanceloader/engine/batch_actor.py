"""The Ray actor that builds batches (:class:`BatchActor`) and how the training process joins
Ray (:func:`connect`): the actor side of :mod:`lanceloader.engine.actors`. Imported only for
``worker_type="ray"``.

An actor gets the batch work once, then tasks: ``run`` in its default concurrency group (one
at a time, in the order sent), ``run_now`` (a lost actor's batches: at once, beside the task
running) and ``where``/``stack`` (answered while a task runs) in groups of their own.
"""

from __future__ import annotations

import logging
import os
import pickle
import sys
import threading
import traceback
from typing import Any

import numpy as np
import ray

from lanceloader.engine.work import ForTransport, TaskResult

_logger = logging.getLogger("lanceloader")
# Each group's threads: where/stack one; run_now two (a second actor lost meanwhile).
CONCURRENCY_GROUPS = {"look": 1, "now": 2}


def connect() -> None:
    """Use the Ray this process is connected to; else ``ray.init()`` (``RAY_ADDRESS`` or a
    local Ray), as Ray Data does, and say so."""
    if not ray.is_initialized():
        _logger.info("lanceloader: worker_type='ray' and Ray not initialized: calling ray.init()")
        ray.init()


class BatchActor:
    """A Ray actor that builds batches: the work once, then tasks (one object per task)."""

    def __init__(self, work: tuple[bytes, list[np.ndarray]]) -> None:
        data, buffers = work  # a Shipment's pickle and its out-of-band arrays (read-only)
        self._work = ForTransport(pickle.loads(data, buffers=buffers))  # (a BatchWork)
        self._running: int | None = None  # the thread running a task (for stack())

    @ray.method(concurrency_group="look")
    def where(self) -> tuple[int, str]:
        """This actor's pid and node address (answered once it is up)."""
        return os.getpid(), ray.util.get_node_ip_address()

    def run(self, task: Any) -> TaskResult:
        """The task's batches, as a process worker builds and sends them: where they are row
        ranges of a few arrays (``TaskResult.slices``), those alone, each row's bytes once
        (the pool cuts the batches: ``after_transport``)."""
        self._running = threading.get_ident()
        try:
            return self._work(task)
        finally:
            self._running = None

    @ray.method(concurrency_group="now")
    def run_now(self, task: Any) -> TaskResult:
        """A lost actor's batch, built at once beside the task running (not behind the queue)."""
        return self._work(task)

    @ray.method(concurrency_group="look")
    def stack(self) -> str:
        """The stack of the thread running a task (``'idle'`` between tasks)."""
        frame = sys._current_frames().get(self._running or -1)
        if frame is None:
            return "(idle: no task running)\n"
        return "".join(traceback.format_stack(frame))


def cause_of(exc: BaseException) -> str:
    """The last line of a Ray error's text: the error the actor met, without Ray's frames."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__
