"""Loader: the object users hold.

``Loader`` ties the stages together: a pinned :class:`~lanceloader.source.Source`, an
:class:`~lanceloader.order.Order`, a :class:`~lanceloader.plan.Plan` per epoch, and a pool of
workers behind an :class:`~lanceloader.prefetch.OrderedPrefetcher`. It is re-iterable: each
``iter()`` is one epoch, and the epoch advances by itself (``set_epoch`` overrides it).

Example::

    >>> loader = Loader(uri, batch_size=256, shuffle=True, seed=0)      # doctest: +SKIP
    >>> for epoch in range(3):                                          # doctest: +SKIP
    ...     for batch in loader:
    ...         train_step(batch)
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import pickle
import time
import weakref
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import lance

from lanceloader.convert import Conversion, check_output, check_schema, to_output
from lanceloader.distributed import resolve_rank_world
from lanceloader.mixing import MixingReport, mixing_report
from lanceloader.order import Order
from lanceloader.placement import check_placement
from lanceloader.plan import Plan, ReadTask, read_tasks
from lanceloader.prefetch import OrderedPrefetcher
from lanceloader.processes import ProcessPool, check_picklable, start_forkserver
from lanceloader.source import Source
from lanceloader.state import FORMAT as STATE_FORMAT
from lanceloader.state import StateMismatchError, check_state, fingerprint, order_settings
from lanceloader.stats import Recorder, Stats, count_delivered
from lanceloader.transforms import (
    DEFAULT_MAX_SKIP_FRACTION,
    OnError,
    as_transform,
    check_on_error,
)
from lanceloader.workers import BatchWork, TaskResult, Transform

_logger = logging.getLogger("lanceloader")

DEFAULT_SHUFFLE_WINDOW = 8
TENSOR_OUTPUTS = ("torch", "jax", "tf")
# With a transform, a read of two batches is still in the CPU cache when the worker transforms
# it: decoding 10 KB JPEGs ran 0.84x raw decode at 8 batches, 0.94x at 2 (benchmarks/transforms.py).
TRANSFORM_BATCHES_PER_READ = 2
# Rows read by one Lance call. Range reads keep getting cheaper per row up to ~64k rows; random
# takes are slower per call, so fewer rows keep the time to the first batch low.
ROWS_PER_READ_SEQUENTIAL = 65_536
ROWS_PER_READ_RANDOM = 16_384


def _no_iterator() -> None:
    return None


_dead_ref: Any = _no_iterator


class Loader:
    """Batches of a Lance dataset, in a deterministic order, prefetched by a pool of workers.

    Args:
        dataset: URI (local path or object store) or a ``lance.LanceDataset``.
        batch_size: rows per batch on each rank.
        columns: columns to read; default all.
        filter: SQL predicate, evaluated once against the pinned version.
        version: dataset version (number or tag) to pin; default the latest at construction.
        storage_options: object-store options passed to Lance.
        splits: ``{"train": 0.9, "val": 0.1}``: deterministic named splits; with ``split``.
        split: which split this loader reads.
        split_key: column whose value decides a row's split; default the row offset.
        shuffle: ``False`` reads in dataset order; ``True`` shuffles, differently each epoch.
        shuffle_block_size: rows read together when shuffling; 1 is a full random shuffle.
        shuffle_window: blocks whose rows are mixed together; default 8 (block shuffle only).
        seed: the same seed gives the same order everywhere.
        drop_last: drop the last, short global batch.
        transform: ``fn(pyarrow.RecordBatch) -> batch`` (or a list of them, applied in order),
            run in the worker pool. A returned RecordBatch is converted to ``output``; a dict
            has its NumPy arrays made tensors; anything else is passed through.
        on_error: what a row-aware transform (``ll.map_rows``, ``ll.decode_images``,
            ``ll.tokenize``) does with a row that fails: ``"raise"`` (default), ``"skip"`` it
            (counted in ``stats().rows_skipped``; batch counts stay equal on every rank), or a
            function ``on_error(exc, row)`` called before skipping.
        max_skip_fraction: the share of a batch's rows that may be skipped before the loader
            stops with ``TooManyRowErrors``.
        output: ``"numpy"`` (dict of arrays), ``"torch"``, ``"jax"``, ``"tf"``, ``"arrow"`` or
            ``"python"``; or an ``ll.Conversion`` for nulls, ragged lists, strings and casts.
        pin_memory: torch output only: page-lock batches for fast copies to a GPU (skipped with
            a warning where there is no CUDA).
        device: torch output only: copy batches to this device (e.g. ``"cuda"``) in the
            consumer, without blocking.
        num_workers: worker threads; default the number of cores.
        worker_type: ``"thread"`` (default: Lance, Arrow and most decoders release the GIL) or
            ``"process"`` for pure-Python transforms: processes forked from a clean forkserver,
            batches returned through shared memory.
        prefetch: batches prepared ahead of the training loop; default ``2 * num_workers``, and
            with a transform or process workers two reads per worker.
            Work is done in whole reads of ``rows_per_read`` rows, at least one per worker, so
            ``max(prefetch, num_workers * rows_per_read // batch_size)`` batches are in flight,
            plus the rest of the read being consumed: that bounds the memory.
        rank, world_size: this process's slice of each global batch; default: detected from
            torch.distributed, Ray Train or the RANK/WORLD_SIZE environment variables.
        rows_per_read: rows fetched by one Lance call (several batches); default 65,536 rows,
            16,384 for a full shuffle, 2 batches with a transform or process workers.
        log_every: log a one-line summary (logger ``lanceloader``) every N batches.
    """

    def __init__(
        self,
        dataset: str | os.PathLike[str] | lance.LanceDataset,
        batch_size: int = 256,
        *,
        columns: list[str] | None = None,
        filter: str | None = None,
        version: int | str | None = None,
        storage_options: dict[str, str] | None = None,
        splits: dict[str, float] | None = None,
        split: str | None = None,
        split_key: str | None = None,
        shuffle: bool = False,
        shuffle_block_size: int = 1,
        shuffle_window: int | None = None,
        seed: int = 0,
        drop_last: bool = False,
        transform: Transform | list[Transform] | None = None,
        on_error: OnError = "raise",
        max_skip_fraction: float = DEFAULT_MAX_SKIP_FRACTION,
        output: str | Conversion = "numpy",
        pin_memory: bool = False,
        device: str | None = None,
        num_workers: int | None = None,
        worker_type: str = "thread",
        prefetch: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        rows_per_read: int | None = None,
        log_every: int | None = None,
    ) -> None:
        check_int("batch_size", batch_size, minimum=1)
        check_int("shuffle_block_size", shuffle_block_size, minimum=1)
        check_int("seed", seed, minimum=None)
        if shuffle_window is not None:
            check_int("shuffle_window", shuffle_window, minimum=1)
        if num_workers is not None:
            check_int("num_workers", num_workers, minimum=1)
        if prefetch is not None:
            check_int("prefetch", prefetch, minimum=1)
        if rows_per_read is not None:
            check_int("rows_per_read", rows_per_read, minimum=1)
        if log_every is not None:
            check_int("log_every", log_every, minimum=1)
        if worker_type not in ("thread", "process"):
            raise ValueError(f"worker_type must be 'thread' or 'process', got {worker_type!r}")
        transform = as_transform(transform)
        check_on_error(on_error, max_skip_fraction)
        conversion = check_output(output)
        self.placement = check_placement(conversion.output, pin_memory, device)
        rank, world_size = resolve_rank_world(rank, world_size)

        self.source = Source(
            dataset,
            columns=columns,
            filter=filter,
            version=version,
            storage_options=storage_options,
            splits=splits,
            split=split,
            split_key=split_key,
        )
        if transform is None:
            check_schema(self.source.schema_table().schema, conversion)
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.rank = rank
        self.world_size = world_size
        self.output = conversion.output
        self.conversion = conversion
        self.on_error = on_error
        self.max_skip_fraction = max_skip_fraction
        self.transform = transform
        self.order = Order(
            num_rows=self.source.num_rows,
            shuffle=bool(shuffle),
            block_size=shuffle_block_size,
            window=shuffle_window or (DEFAULT_SHUFFLE_WINDOW if shuffle_block_size > 1 else 1),
            seed=seed,
        )
        self.num_workers = num_workers or os.cpu_count() or 1
        self.worker_type = worker_type
        self.batches_per_read = (
            max(1, rows_per_read // batch_size)
            if rows_per_read
            else default_batches_per_read(self.order, batch_size, self._small_reads)
        )
        self._prefetch_given = prefetch
        self.prefetch = prefetch or self._default_prefetch(self.num_workers)
        self.log_every = log_every
        self.recorder = Recorder()
        if worker_type == "process":
            name = getattr(transform, "__qualname__", type(transform).__name__)
            check_picklable(self._work(), f"transform {name}")
            start_forkserver()
        self._epoch = 0
        self._start_sample = 0
        self._order_settings = order_settings(self.source, self.order)
        self._fingerprint = fingerprint(self._order_settings)
        # The running epoch is held weakly, so a `break` out of a for loop lets it be collected
        # (which stops its workers); its progress outlives it for state_dict().
        self._active: weakref.ref[EpochIterator] = _dead_ref
        self._progress: EpochProgress | None = None

    # --- epochs -------------------------------------------------------------------------

    def plan(self, start: int = 0) -> Plan:
        """This rank's plan for an epoch that starts at global sample ``start``."""
        return Plan(
            num_samples=self.source.num_rows,
            batch_size=self.batch_size,
            world_size=self.world_size,
            rank=self.rank,
            drop_last=self.drop_last,
            start=start,
        )

    def __len__(self) -> int:
        """Batches this rank gets in the next epoch (fewer when resuming mid-epoch)."""
        return len(self.plan(self._start_sample))

    @property
    def epoch(self) -> int:
        """The epoch the next ``iter()`` will deliver."""
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Make the next ``iter()`` deliver ``epoch`` from its start."""
        check_int("epoch", epoch, minimum=0)
        self._epoch = epoch
        self._start_sample = 0
        self._progress = None

    def __iter__(self) -> EpochIterator:
        self.close()
        self._progress = EpochProgress(self._epoch, self.plan(self._start_sample))
        it = EpochIterator(self, self._progress)
        self._active = weakref.ref(it)
        self._epoch += 1
        self._start_sample = 0
        return it

    def peek(self) -> Any:
        """The first batch the next ``iter()`` will deliver, made as it will be (transform,
        output, device), read in this process without starting an epoch: for shapes and dtypes,
        e.g. to initialise a model or declare a ``tf.data`` signature.

        >>> import tempfile
        >>> from lanceloader.demo import write_demo_dataset
        >>> uri = write_demo_dataset(tempfile.mkdtemp() + "/demo.lance", rows=10)
        >>> loader = Loader(uri, batch_size=4, columns=["x", "label"], output="numpy")
        >>> loader.peek()["x"].shape, loader.epoch
        ((4, 64), 0)
        """
        plan = self.plan(self._start_sample)
        if len(plan) == 0:
            raise ValueError(f"the next epoch of {self!r} has no batches to peek at")
        task = next(read_tasks(self._epoch, plan, per_read=1))
        work = dataclasses.replace(self._work(), output=self.conversion)  # final output here
        batch = work(task).batches[0]
        return batch if self.placement is None else self.placement(batch)

    def mixing_report(self, batches: int = 200, places: int = 100) -> MixingReport:
        """How well the next epoch's order mixes the dataset, and how many reads it costs,
        computed from the order alone (no I/O): see :mod:`lanceloader.mixing`.

        >>> import tempfile
        >>> from lanceloader.demo import write_demo_dataset
        >>> uri = write_demo_dataset(tempfile.mkdtemp() + "/demo.lance", rows=100_000)
        >>> block = Loader(uri, batch_size=256, shuffle=True, shuffle_block_size=1024, seed=0)
        >>> print(block.mixing_report())  # doctest: +NORMALIZE_WHITESPACE
        mixing over 200 batches of 256 rows:
          places per batch        15.2 of 100 (a random batch: 92.3)
          reads per 1000 rows     55.6 (reads of up to 256 batches)
          order correlation      0.097 (1 = storage order, 0 = none)
        """
        return mixing_report(self.order, self.plan(self._start_sample), self._epoch,
                             self.batches_per_read, batches, places)

    # --- checkpoints ----------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Where the loader is: a small JSON-safe dict to save with the model checkpoint.

        Counts only batches handed to the training loop; prefetched batches are read again after
        a resume. On several ranks, every rank returns the same dict when all have taken the same
        number of batches (as in lock-step data-parallel training), so saving rank 0's suffices.

        >>> state = loader.state_dict()                     # doctest: +SKIP
        >>> loader.load_state_dict(state)                   # doctest: +SKIP
        """
        epoch, sample = self._epoch, self._start_sample
        progress = self._progress
        if progress is not None and not progress.exhausted:  # the last epoch, where it stopped
            epoch, sample = progress.epoch, progress.samples_done
        return {
            "format": STATE_FORMAT,
            "uri": self.source.uri,
            "version": self.source.version,
            "order": dict(self._order_settings),
            "fingerprint": self._fingerprint,
            "batch_size": self.batch_size,
            "world_size": self.world_size,
            "drop_last": self.drop_last,
            "columns": list(self.source.columns),
            "epoch": epoch,
            "sample": sample,
        }

    def load_state_dict(self, state: dict[str, Any], allow_changes: tuple[str, ...] = ()) -> None:
        """Continue at the state's epoch and sample: the next ``iter()`` starts there.

        The state may come from any number of ranks (elastic resume). ``allow_changes`` names
        settings that may differ from the saved ones without changing the order:
        ``"batch_size"``, ``"drop_last"``, ``"columns"``. Anything else that differs (dataset
        version, filter, split, shuffle settings, seed) raises :class:`StateMismatchError`.
        """
        check_state(state, self.state_dict(), tuple(allow_changes))
        check_int("state['epoch']", state["epoch"], minimum=0)
        check_int("state['sample']", state["sample"], minimum=0)
        if state["sample"] > self.source.num_rows:
            raise StateMismatchError(
                f"state sample {state['sample']} is beyond the {self.source.num_rows} rows of an epoch"
            )
        self.close()
        self._progress = None
        self._epoch, self._start_sample = state["epoch"], state["sample"]
        if self._start_sample == self.source.num_rows:
            self._epoch, self._start_sample = self._epoch + 1, 0

    def close(self) -> None:
        """Stop the running epoch's workers (if any). The loader stays usable."""
        running = self._active()
        if running is not None:
            running.close()

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_active"] = _dead_ref  # a running epoch belongs to its process
        return state

    def __repr__(self) -> str:
        return (
            f"Loader({self.source!r}, batch_size={self.batch_size}, order={self.order}, "
            f"rank={self.rank}/{self.world_size}, output={self.output!r})"
        )

    @property
    def _small_reads(self) -> bool:
        """Whether workers transform what they read (so reads are kept small)."""
        return self.transform is not None or self.worker_type == "process"

    def _default_prefetch(self, workers: int) -> int:
        """Batches in flight by default with ``workers`` workers: two per worker, and with a
        transform or process workers two reads per worker (a worker that finishes early starts
        its next read instead of waiting)."""
        return 2 * workers * (self.batches_per_read if self._small_reads else 1)

    def reads_in_flight(self, workers: int) -> int:
        """Reads that ``workers`` workers keep in flight: ``prefetch`` batches (the given one,
        or the default for that many workers) in whole reads, at least one per worker."""
        prefetch = self._prefetch_given or self._default_prefetch(workers)
        return max(workers, math.ceil(prefetch / self.batches_per_read))

    def _work(self, trace: bool = False) -> BatchWork:
        # Process workers return NumPy (through shared memory); the consumer makes tensors.
        conversion = self.conversion
        if self.worker_type == "process" and self.output in TENSOR_OUTPUTS:
            conversion = dataclasses.replace(conversion, output="numpy")
        return BatchWork(self.source, self.order, self.transform, conversion, trace,
                         self.on_error, self.max_skip_fraction)

    # --- stats and tracing --------------------------------------------------------------

    def stats(self, epoch: int | None = None) -> Stats:
        """What the loader did so far: throughput, I/O, time per stage and the bottleneck.

        ``epoch=None`` sums every iteration so far; ``epoch=-1`` is the last (or current) one,
        ``epoch=0`` the first. ``print(loader.stats())`` shows a table and the verdict.

        >>> print(loader.stats().bottleneck)                # doctest: +SKIP
        bottleneck: training loop (the loop waited for data 2% of the time). Try: ...
        """
        random_reads = self.order.shuffle and self.order.block_size < 64
        return self.recorder.snapshot(workers=self.num_workers, shuffle_random=random_reads,
                                      epoch=epoch)

    @contextlib.contextmanager
    def trace(self, path: str | os.PathLike[str]) -> Iterator[None]:
        """Record a Chrome/Perfetto trace of the epochs started inside the block into ``path``.

        Open the file at https://ui.perfetto.dev or chrome://tracing: one lane per worker thread
        (read, transform, convert spans with batch indices) and one for the training loop
        (time waiting for a batch vs. time spent in the training step).

        >>> with loader.trace("run.json"):                 # doctest: +SKIP
        ...     for batch in loader: ...
        """
        self.recorder.start_trace()
        try:
            yield
        finally:
            self.close()
            self.recorder.write_trace(path)


@dataclass
class EpochProgress:
    """How far one rank has got through one epoch: what ``state_dict()`` needs."""

    epoch: int
    plan: Plan
    batches_done: int = 0

    @property
    def samples_done(self) -> int:
        """Global samples of this epoch consumed by all ranks so far."""
        return self.plan.samples_done(self.batches_done)

    @property
    def exhausted(self) -> bool:
        return self.batches_done >= len(self.plan)


class EpochIterator(Iterator[Any]):
    """One epoch of one rank: yields batches in plan order; ``close()`` stops its workers."""

    def __init__(self, loader: Loader, progress: EpochProgress) -> None:
        self.progress = progress
        self._buffer: deque[tuple[Any, int, int]] = deque()
        self._recorder = loader.recorder
        self._counters = self._recorder.new_epoch()
        self._tracing = self._recorder.tracing
        self._log_every = loader.log_every
        per_read = loader.batches_per_read
        depth = loader.reads_in_flight(loader.num_workers)
        tasks = read_tasks(progress.epoch, progress.plan, per_read,
                           window_rows=loader.order.window_rows)
        work = loader._work(trace=self._tracing)
        pool = ProcessPool if loader.worker_type == "process" else OrderedPrefetcher
        self._prefetcher: OrderedPrefetcher[ReadTask, TaskResult] | ProcessPool = pool(
            work, tasks, loader.num_workers, depth
        )
        self._finish = loader.conversion if work.conversion.output != loader.output else None
        self._placement = loader.placement
        self._started = self._handed_out = time.perf_counter()

    def __next__(self) -> Any:
        asked = time.perf_counter()
        if not self._buffer:
            result: TaskResult = next(self._prefetcher)
            if self._finish is not None:
                result.batches = [to_output(b, self._finish) for b in result.batches]
            if self._placement is not None:
                result.batches = [self._placement(b) for b in result.batches]
            self._record_task(result)
            self._buffer.extend(zip(result.batches, result.rows, result.nbytes, strict=True))
        batch, rows, nbytes = self._buffer.popleft()
        now = time.perf_counter()
        count_delivered(self._counters, rows, nbytes, now - asked, asked - self._handed_out,
                        now - self._started)
        if self._tracing:
            index = self.progress.batches_done
            self._recorder.event("training step", self._handed_out, asked, batch=index - 1)
            self._recorder.event("wait for batch", asked, now, batch=index)
        self._handed_out = now
        self.progress.batches_done += 1
        if self._log_every and self.progress.batches_done % self._log_every == 0:
            _log_progress(self)
        return batch

    def _record_task(self, result: TaskResult) -> None:
        rows_read = sum(result.rows) + result.rows_skipped
        self._recorder.task(result.seconds, rows_read, result.io_bytes, result.io_iops,
                            result.rows_skipped, self._prefetcher.in_flight + 1)
        for name, start, end, args in result.spans:
            self._recorder.event(name, start, end, lane=result.lane, **args)

    def __len__(self) -> int:
        return len(self.progress.plan) - self.progress.batches_done

    def close(self) -> None:
        """Stop the workers of this epoch. Idempotent."""
        self._prefetcher.close()
        self._buffer.clear()

    def __enter__(self) -> EpochIterator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __reduce__(self) -> Any:
        raise pickle.PicklingError("a running epoch cannot be pickled; pickle the Loader instead")


def _log_progress(it: EpochIterator) -> None:
    stats = it._recorder.snapshot(epoch=-1)
    _logger.info(
        "epoch %d: %d/%d batches, %.0f rows/s, %.1f MB/s, loop waited %.0f%%; %s",
        it.progress.epoch, it.progress.batches_done, len(it.progress.plan), stats.rows_per_s,
        stats.bytes_per_s / 1e6, 100 * stats.wait_s / max(stats.wall_s, 1e-9),
        stats.bottleneck.stage,
    )


def default_batches_per_read(order: Order, batch_size: int, small_reads: bool) -> int:
    """Batches per Lance read by default: 65,536 rows, 16,384 for a full shuffle (random takes
    cost more per call), and with a transform (``small_reads``) at most two batches, which are
    still in the CPU cache when they are transformed.

    >>> default_batches_per_read(Order(10**6), 256, small_reads=False)
    256
    """
    random_reads = order.shuffle and order.block_size < 64
    rows = ROWS_PER_READ_RANDOM if random_reads else ROWS_PER_READ_SEQUENTIAL
    per_read = max(1, rows // batch_size)
    return min(per_read, TRANSFORM_BATCHES_PER_READ) if small_reads else per_read


def check_int(name: str, value: object, minimum: int | None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
