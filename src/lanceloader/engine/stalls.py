"""The errors of a pool that cannot make progress: :class:`StallError` for a stream that waits
too long, made from a pool's :class:`~lanceloader.engine.threads.Stalled` (the stuck task, the
worker and its stack), and the Ray actors' :class:`ActorsLostError` and :class:`ActorStartError`
(here, not in ``actors.py``, so that ``import lanceloader`` names them without importing Ray)."""

from __future__ import annotations

from lanceloader.engine.threads import Stalled
from lanceloader.engine.work import stage_of


class StallError(TimeoutError):
    """No batch came for ``stall_timeout`` seconds. The message names the batch, the stage
    (read, transform, convert, ...) and the worker, and shows the worker's stack; attributes
    ``batch``, ``epoch``, ``stage``, ``worker`` and ``stack`` hold the same."""

    def __init__(
        self,
        message: str,
        *,
        batch: int = -1,
        epoch: int = -1,
        stage: str = "",
        worker: str = "",
        stack: str = "",
    ) -> None:
        # StallError(message) alone works too: torch re-raises a DataLoader worker's error as
        # type(exc)(formatted message).
        super().__init__(message)
        self.batch, self.epoch, self.stage, self.worker, self.stack = (
            batch,
            epoch,
            stage,
            worker,
            stack,
        )


def stall_error(stalled: Stalled, workers: int, worker_type: str) -> StallError:
    """The user's error for a pool's :class:`~lanceloader.engine.threads.Stalled`."""
    task = stalled.task
    batch, epoch = task.batches[0], task.epoch
    stage = stage_of(stalled.functions)
    reads = (
        f"batches {task.batches.start}-{task.batches[-1]}"
        if len(task.batches) > 1
        else f"batch {batch}"
    )
    message = (
        f"no batch for {stalled.seconds:g} s (stall_timeout={stalled.seconds:g}): batch {batch} "
        f"of epoch {epoch} is stuck in stage '{stage}' of {stalled.worker} (one of {workers} "
        f"{worker_type} workers, reading {reads}). The loader stopped its workers. Its stack, "
        f"most recent call {'first' if worker_type == 'process' else 'last'}:\n{stalled.stack}"
        "Usual causes: a transform waiting on a lock, a queue or the network; an object store "
        "that stopped answering; a worker process stopped by a signal or a debugger. Raise "
        "stall_timeout= for steps that are slow but healthy, or pass stall_timeout=None to "
        "wait forever."
    )
    return StallError(
        message, batch=batch, epoch=epoch, stage=stage, worker=stalled.worker, stack=stalled.stack
    )


class ActorsLostError(RuntimeError):
    """Every actor of the pool died and none could be started in their place."""


class ActorStartError(RuntimeError):
    """An actor could not load the batch work (its ``__init__`` raised): a module of the
    transform that the cluster's nodes cannot import is the usual cause."""
