"""Scalars into a logger as the training loop iterates: TensorBoard, W&B, Lightning, a function.

:func:`log_every` wraps a loader; every N batches, between two batches of the loop, it writes
:func:`~lanceloader.integrations.metrics.scalars.scalars` of the batches since the last write
at the loader's global step (the write counts as the loop's work, not as waiting).
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import Any

from lanceloader.integrations.metrics.ranks import _world, across_ranks
from lanceloader.integrations.metrics.scalars import PREFIX, mix_scalars, scalars, totals_of

Sink = Callable[[dict[str, float], int], None]
# Each loader's totals at its last write, whichever wrapper wrote: a loop that wraps the loader
# anew each epoch gets the windows one wrapper would (contiguous, ``every`` batches each).
_last_writes: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def sink_of(logger: Any) -> Sink:
    """A function ``write(metrics, step)`` for ``logger``: a Lightning logger (anything with
    ``log_metrics``: ``CSVLogger``, ``TensorBoardLogger``, ``WandbLogger``, ...), a TensorBoard
    ``SummaryWriter`` (``add_scalar``), a W&B run or the ``wandb`` module (``log``; the step
    goes in as ``lanceloader/step``, since W&B's own step must only grow and your loop logs
    too), or a function of ``(metrics, step)``.

    >>> sink_of(print)({"lanceloader/rows_per_s": 1.0}, 3)
    {'lanceloader/rows_per_s': 1.0} 3
    >>> sink_of(logging.getLogger("x"))
    Traceback (most recent call last):
    ...
    TypeError: log_every: a logging.Logger takes lines, not scalars; use Loader(log_every=N) for a log line every N batches, or pass a TensorBoard SummaryWriter, a W&B run, a Lightning logger or a function fn(metrics: dict, step: int)
    """
    if isinstance(logger, logging.Logger):
        raise TypeError(
            "log_every: a logging.Logger takes lines, not scalars; use "
            "Loader(log_every=N) for a log line every N batches, or pass a "
            f"{_KINDS}"
        )
    if callable(getattr(logger, "log_metrics", None)):
        return lambda metrics, step: logger.log_metrics(metrics, step=step)
    if type(logger).__module__ == "torch.utils.tensorboard.writer":
        return _tensorboard_sink(logger)
    if callable(getattr(logger, "add_scalar", None)):

        def add_scalars(metrics: dict[str, float], step: int) -> None:
            for name, value in metrics.items():
                logger.add_scalar(name, value, global_step=step)

        return add_scalars
    module = (
        getattr(logger, "__name__", None)
        if isinstance(logger, type(logging))
        else type(logger).__module__
    )
    if str(module).split(".")[0] == "wandb" and callable(getattr(logger, "log", None)):
        return lambda metrics, step: logger.log({**metrics, PREFIX + "step": step})
    if callable(logger):
        return logger  # type: ignore[no-any-return]
    raise TypeError(
        f"log_every: cannot write scalars to {type(logger).__name__!r}; pass a {_KINDS}"
    )


def _tensorboard_sink(writer: Any) -> Sink:
    """All scalars of a write as one event (what ``add_scalar`` makes per value, ~25 µs each,
    written once): ``simple_value`` summaries, as ``add_scalar`` writes them."""
    from tensorboard.compat.proto.summary_pb2 import Summary

    def write(metrics: dict[str, float], step: int) -> None:
        values = [Summary.Value(tag=name, simple_value=value) for name, value in metrics.items()]
        writer._get_file_writer().add_summary(Summary(value=values), step)

    return write


_KINDS = (
    "TensorBoard SummaryWriter, a W&B run, a Lightning logger or a function "
    "fn(metrics: dict, step: int)"
)


class LoggedLoader(Iterable[Any]):
    """A loader whose iteration writes :func:`scalars` every ``every`` batches; see
    :func:`log_every`. Re-iterable: each ``iter()`` is the rest of the loader's epoch, and the
    epoch ends where it would without the wrapper (when the loop asks past its last batch), or,
    for a loop that stops at ``len()`` without asking for more (Lightning's), when that
    iteration is closed (the next ``iter()`` closes it). ``len()`` is the loader's; ``step`` is
    the step of the last batch delivered (see :func:`log_every`)."""

    def __init__(
        self,
        loader: Any,
        logger: Any,
        every: int,
        ranks: bool | None = None,
        step: int | None = None,
    ) -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(
                f"log_every: every must be a positive int (batches between two "
                f"writes), got {every!r}; e.g. every=50"
            )
        if not callable(getattr(loader, "stats", None)):
            raise TypeError(
                f"log_every: expected a lanceloader Loader (anything with "
                f"stats()), got {type(loader).__name__!r}"
            )
        if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
            raise ValueError(f"log_every: step must be an int >= 0 or None, got {step!r}")
        self.loader, self.every = loader, every
        self.step, self._counted = step or 0, step is not None
        self._write = sink_of(logger) if logger is not None else None
        self._ranks = ranks
        self._since = None
        self._current: weakref.ref[Generator[Any, None, None]] | None = None

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        current = self._current() if self._current is not None else None
        if current is not None:  # a loop that stopped at len(): its epoch ends now
            current.close()
        batches = self._batches()
        self._current = weakref.ref(batches)  # a loop that breaks and drops it closes it
        return batches

    def _batches(self) -> Generator[Any, None, None]:
        it = iter(self.loader)
        left = len(it) if hasattr(it, "__len__") else -1
        if not self._counted:  # the loader's own step, so steps go on across wrappers
            self.step = loader_step(self.loader, left, self.step)
        if self._since is None:  # a new wrapper's first window starts at the last write
            self._since = _last_writes.get(self.loader)
        try:
            for batch in it:  # the write, after a batch is delivered, is the loop's time
                self.step += 1
                if self.step % self.every == 0:
                    self.write()
                left -= 1
                yield batch
            left = -1  # the loop asked past the last batch: the loader ended its epoch
        finally:
            if left == 0:  # all delivered, the loop stopped at len(): end the epoch as the
                next(it, None)  # loop would have, so the next iter() is the next epoch
            close = getattr(it, "close", None)
            if close is not None:
                close()

    _since: Any

    def write(self) -> dict[str, float]:
        """Write the scalars of the batches since the last write now (a collective when ranks
        are gathered: every rank must call it, as iteration does at the same batches)."""
        stats = totals_of(self.loader)
        metrics = scalars(stats, self._since)
        shares = getattr(self.loader, "mix_shares", None)  # a mix: each source's numbers
        if shares is not None:
            metrics.update(mix_scalars(shares()))
        if self._ranks or (self._ranks is None and _world() > 1):
            slowest = across_ranks(stats, self._since).slowest
            metrics.update(
                {
                    PREFIX + "slowest_rank": float(slowest.rank),
                    PREFIX + "slowest_rank_wait_share": slowest.wait_share,
                    PREFIX + "slowest_rank_wait_p99_ms": 1000 * (slowest.wait_p99_s or 0),
                }
            )
        self._since = stats
        with contextlib.suppress(TypeError):  # a loader without weak references: no sharing
            _last_writes[self.loader] = stats
        if self._write is not None:
            self._write(metrics, self.step)
        return metrics


def log_every(
    loader: Any, logger: Any, every: int, ranks: bool | None = None, step: int | None = None
) -> LoggedLoader:
    """Iterate ``loader`` and write its :func:`scalars` to ``logger`` every ``every`` batches.

    ``logger``: a TensorBoard ``SummaryWriter``, a W&B run (or the ``wandb`` module), a
    Lightning logger (``CSVLogger``, ``TensorBoardLogger``, ``WandbLogger``, ...), a function
    ``fn(metrics, step)``, or ``None`` (compute, write nowhere: the other ranks' part when only
    rank 0 logs). Each write is at a step, the number of the batch just delivered: by default
    the loader's global step (``epoch × len(loader)`` plus the batches delivered in the epoch),
    so steps go on across epochs and across wrappers (``for epoch in ...: for batch in
    log_every(loader, ...)`` draws one curve) and a resumed run continues its curve; ``step=N``
    counts on from N instead (anything that is not a Loader counts from 0). With a ``torch.distributed``
    process group of more than one rank (or ``ranks=True``), each write also gathers every
    rank's wait (:func:`across_ranks`) and adds ``slowest_rank``: every rank must then iterate
    its wrapper with the same ``every``, as a training loop with equal batches per rank does.

    Use it where the loop is: ``for batch in log_every(loader, writer, 50): ...``; with
    Lightning, ``trainer.fit(model, log_every(loader, trainer_logger, 50))``.

    >>> log_every([1, 2], print, every=0)
    Traceback (most recent call last):
    ...
    ValueError: log_every: every must be a positive int (batches between two writes), got 0; e.g. every=50
    """
    return LoggedLoader(loader, logger, every, ranks, step)


def loader_step(loader: Any, left: int, step: int) -> int:
    """The global step before the next batch of ``loader``, whose iterator has ``left`` batches
    to deliver in its epoch: ``epoch × len(loader)`` plus the batches delivered in the epoch;
    ``step`` for anything without an ``epoch`` (or an iterator without a length).

    >>> class Stub:
    ...     epoch = 2
    ...     def __len__(self): return 10
    >>> loader_step(Stub(), 10, 0), loader_step(Stub(), 3, 0), loader_step([1, 2], 2, 7)
    (20, 27, 7)
    """
    epoch = getattr(loader, "epoch", None)
    if isinstance(epoch, bool) or not isinstance(epoch, int) or left < 0:
        return step
    per_epoch = len(loader)
    return epoch * per_epoch + per_epoch - left
