"""Loader: the object users hold.

``Loader`` ties the stages together: a pinned :class:`~lanceloader.source.Source`, an
:class:`~lanceloader.order.Order`, a :class:`~lanceloader.cursor.Cursor` that says where the
stream stands, and the :class:`~lanceloader.engine.Stream` that reads each epoch.

Iteration semantics (the guide's "Epochs and iterators"):

* Each ``iter()`` delivers the rest of the cursor's epoch; the epoch advances only when its end is
  reached (``StopIteration``). ``set_epoch`` moves the cursor to an epoch's start.
* A loader has at most one live iterator: ``iter()`` while another is live and not exhausted
  raises :class:`LoaderInUseError` (``peek()`` looks at a batch without consuming it).
* An iterator that is closed, broken out of or garbage-collected leaves the cursor where it
  stopped: the next ``iter()`` continues that epoch from there, exactly as a resume from
  ``state_dict()`` would.
* ``len(loader)`` is the number of batches of a full epoch on this rank; ``len(iterator)`` what
  that iterator has still to deliver.

Example::

    >>> import tempfile
    >>> from lanceloader.demo import write_demo_dataset
    >>> uri = write_demo_dataset(tempfile.mkdtemp() + "/demo.lance", rows=10)
    >>> loader = Loader(uri, batch_size=4, columns=["id"], shuffle=True, seed=0)
    >>> for epoch in range(2):
    ...     print(loader.epoch, [batch["id"].tolist() for batch in loader])
    0 [[0, 1, 9, 5], [4, 2, 3, 7], [8, 6]]
    1 [[2, 5, 1, 3], [8, 9, 4, 6], [0, 7]]
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import warnings
import weakref
from collections.abc import Iterator
from typing import Any

import lance

from lanceloader.arguments import check_bool, check_int, check_numbers, check_seconds
from lanceloader.cache import MemoryCache
from lanceloader.conversion import (
    Conversion,
    check_bytes_for_tensors,
    check_output,
    check_schema,
)
from lanceloader.cursor import Cursor
from lanceloader.distributed import resolve_rank_world
from lanceloader.engine import (
    DEFAULT_STALL_TIMEOUT,
    EpochIterator,
    Reading,
    batches_per_read,
    default_prefetch,
    reads_in_flight,
)
from lanceloader.mix import Mix, MixedSource
from lanceloader.mixing import MixingReport, mixing_report
from lanceloader.order import Order
from lanceloader.packing import PackedSource, Packing, PackPlan
from lanceloader.placement import check_placement
from lanceloader.plan import Plan, read_tasks
from lanceloader.processes import check_picklable, start_forkserver
from lanceloader.source import Source
from lanceloader.state import StateMismatchError, StreamSpec, check_keys, order_settings
from lanceloader.stats import Recorder, Stats
from lanceloader.transforms import (
    DEFAULT_MAX_SKIP_FRACTION,
    OnError,
    as_transform,
    check_on_error,
    transform_name,
)
from lanceloader.workers import BatchWork, Transform

TENSOR_OUTPUTS = ("torch", "jax", "tf")


class LoaderInUseError(RuntimeError):
    """``iter()`` (or ``set_epoch``/``load_state_dict``) while an iterator of the loader is live."""


def _no_iterator() -> None:
    return None


_dead_ref: Any = _no_iterator


_hinted: set[str] = set()


def _cores() -> int:
    """The cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _hint_process_workers(workers: int) -> None:
    """Say once per process when there are more process workers than cores: each is a whole
    interpreter, and they take turns on the cores (4 on 2 cores ran 2.3x slower than 2)."""
    cores = _cores()
    if workers > cores and "process-workers" not in _hinted:
        _hinted.add("process-workers")
        warnings.warn(
            f"num_workers={workers} process workers on {cores} cores: the processes take turns "
            f"on the cores (4 on 2 cores ran 2.3x slower than 2); pass num_workers={cores} or "
            "fewer (this hint is shown once)", UserWarning, stacklevel=3)


class Loader:
    """Batches of a Lance dataset, in a deterministic order, prefetched by a pool of workers.

    Args:
        dataset: URI (local path or object store), a ``lance.LanceDataset``, or an
            :class:`~lanceloader.mix.Mix` of several sources (which then set the columns,
            filters, splits and orders; the loader sets the rest).
        batch_size: rows per batch on each rank.
        columns: columns to read; default all.
        filter: SQL predicate, evaluated once against the pinned version.
        version: dataset version (number or tag) to pin; default the latest at construction.
        storage_options: object-store options passed to Lance.
        splits: ``{"train": 0.9, "val": 0.1}``: deterministic named splits; with ``split``.
        split: which split this loader reads.
        split_key: column whose value decides a row's split; default the row offset.
        cache: keep the projected columns' data for later epochs: a local directory (shared
            by every worker, loader and process that names it; also shares the filter/split
            plan between them) or ``"memory"`` (this process's RAM, thread workers only);
            default ``None``. See :mod:`lanceloader.cache` and the guide's "Object storage".
        cache_size: the cache's cap in bytes; default half the directory's free disk space,
            or half the available memory.
        pack: ``ll.pack(column, seq_len)``: read rows of ``seq_len`` tokens packed from the
            token lists of ``column`` (see :mod:`lanceloader.packing`) instead of the rows.
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
            with a transform two reads per worker.
            Work is done in whole reads of ``rows_per_read`` rows (at most 32 MiB each), at
            least one per worker, so ``max(prefetch, num_workers * rows_per_read // batch_size)``
            batches are in flight, plus the rest of the read being consumed: that bounds the
            memory (see :mod:`lanceloader.engine`).
        rank: this process's slice of each global batch; with ``world_size``, default detected
            from torch.distributed, Ray Train or the RANK/WORLD_SIZE environment variables.
        world_size: the number of ranks (see ``rank``).
        rows_per_read: rows fetched by one Lance call (several batches); default 65,536 rows,
            16,384 for a full shuffle, at most 32 MiB, and 2 batches with a transform.
        log_every: log a one-line summary (logger ``lanceloader``) every N batches.
        stall_timeout: seconds the training loop may wait for one batch before
            :class:`~lanceloader.StallError` names the stuck batch, stage and worker and shows
            its stack; default 300 (never reached by healthy reads); ``None`` waits forever.
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
        cache: str | os.PathLike[str] | None = None,
        cache_size: int | None = None,
        pack: Packing | None = None,
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
        stall_timeout: float | None = DEFAULT_STALL_TIMEOUT,
    ) -> None:
        for name, flag in (("shuffle", shuffle), ("drop_last", drop_last),
                           ("pin_memory", pin_memory)):
            check_bool(name, flag)
        check_seconds("stall_timeout", stall_timeout)
        check_numbers(batch_size=batch_size, shuffle_block_size=shuffle_block_size, seed=seed,
                      shuffle_window=shuffle_window, num_workers=num_workers, prefetch=prefetch,
                      rows_per_read=rows_per_read, log_every=log_every)
        if worker_type not in ("thread", "process"):
            raise ValueError(f"worker_type must be 'thread' or 'process', got {worker_type!r}")
        transform = as_transform(transform)
        check_on_error(on_error, max_skip_fraction)
        conversion = check_output(output)
        self.placement = check_placement(conversion.output, pin_memory, device)
        rank, world_size = resolve_rank_world(rank, world_size)

        if pack is not None and not isinstance(pack, Packing):
            raise TypeError(f"pack must come from ll.pack(column, seq_len), got {pack!r}")
        if isinstance(dataset, Mix):
            given = [name for name, value in (
                ("columns", columns), ("filter", filter), ("version", version),
                ("storage_options", storage_options), ("splits", splits), ("split", split),
                ("split_key", split_key), ("cache", cache), ("cache_size", cache_size),
                ("pack", pack), ("shuffle_window", shuffle_window)) if value is not None]
            given += [name for name, value, default in (
                ("shuffle", shuffle, False), ("shuffle_block_size", shuffle_block_size, 1))
                if value != default]
            if given:
                raise ValueError(
                    f"Loader(Mix(...)) got {', '.join(given)}: a mix takes what to read and in "
                    "which order from each source's own Loader (columns, filter, split, cache, "
                    "pack, shuffle), and interleaves those orders in exact proportions; set "
                    "them on the source Loaders")
            self.source: Source | PackedSource | MixedSource = dataset.source()
        else:
            self.source = Source(dataset, columns=columns, filter=filter, version=version,
                                 storage_options=storage_options, splits=splits, split=split,
                                 split_key=split_key, cache=cache, cache_size=cache_size)
            if pack is not None:
                self.source = PackedSource(self.source, pack)
        if worker_type == "process" and isinstance(self.source.cache, MemoryCache):
            raise ValueError("cache='memory' keeps pieces in one process's memory, and each "
                             "process worker would fill a copy of its own: with "
                             "worker_type='process' give a directory, e.g. "
                             "cache='/dev/shm/lance-cache' (in RAM, shared by the workers)")
        if transform is None:
            schema = self.source.schema_table().schema
            check_schema(schema, conversion)
            if isinstance(output, str):
                check_bytes_for_tensors(schema, output)
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.rank = rank
        self.world_size = world_size
        self.output = conversion.output
        self.conversion = conversion
        self.on_error = on_error
        self.max_skip_fraction = max_skip_fraction
        self.transform = transform
        if isinstance(self.source, MixedSource):
            self.order: Order = self.source.order(seed)
        else:
            self.order = Order.from_options(self.source.num_rows, shuffle, shuffle_block_size,
                                            shuffle_window, seed)
        self.num_workers = num_workers or os.cpu_count() or 1
        self.worker_type = worker_type
        self.batches_per_read = (
            max(1, rows_per_read // batch_size) if rows_per_read else
            batches_per_read(self._read_order(), batch_size, transform is not None,
                             self.source.bytes_per_row)
        )
        self._prefetch_given = prefetch
        self.prefetch = prefetch or default_prefetch(self.num_workers, self.batches_per_read,
                                                     transform is not None)
        self.log_every = log_every
        self.stall_timeout = stall_timeout
        self.recorder = Recorder()
        if worker_type == "process":
            check_picklable(self._work(), f"transform {transform_name(transform)}")
            start_forkserver()
            _hint_process_workers(self.num_workers)
        self._cursor = self._new_cursor()
        # The live iterator is held weakly, so a `break` out of a for loop lets it be collected
        # (which stops its workers); the cursor outlives it.
        self._active: weakref.ref[EpochIterator] = _dead_ref

    def _read_order(self) -> Order:
        """The order whose kind sizes a read (range reads or random takes): a mix reads each
        source with its own order, and takes random rows if any source does. A mixed read has
        as many rows as a single source's (its sources share them): three times larger reads
        were 0.49x single-source throughput against 0.67x (600k rows, sequential, 2 threads)."""
        if not isinstance(self.source, MixedSource):
            return self.order
        orders = self.source.orders
        return ([o for o in orders if o.random_reads] or orders)[0]

    def _new_cursor(self) -> Cursor:
        src = self.source
        return Cursor(StreamSpec(
            num_rows=src.num_rows, order=order_settings(src, self.order),
            batch_size=self.batch_size, world_size=self.world_size, rank=self.rank,
            drop_last=self.drop_last, uri=src.uri, version=src.version, dataset=src.identity,
            columns=tuple(src.columns)))

    @property
    def packing(self) -> PackPlan | None:
        """With ``pack=``: the packing (rows, tokens, ``padding_fraction``, documents dropped);
        else ``None``."""
        return self.source.plan if isinstance(self.source, PackedSource) else None

    # --- epochs -------------------------------------------------------------------------

    def plan(self, start: int = 0) -> Plan:
        """This rank's plan for an epoch that starts at global sample ``start``."""
        return self._cursor.spec.plan(start)

    def __len__(self) -> int:
        """Batches of a full epoch on this rank (what schedules and progress bars need); an
        iterator's ``len()`` is what it has still to deliver."""
        return len(self.plan())

    @property
    def epoch(self) -> int:
        """The cursor's epoch: the one being delivered, or the next one once an epoch ended."""
        return self._cursor.epoch

    def set_epoch(self, epoch: int) -> None:
        """Make the next ``iter()`` deliver ``epoch`` from its start."""
        check_int("epoch", epoch, minimum=0)
        self._check_idle("set_epoch()")
        self._cursor.seek(epoch)

    def __iter__(self) -> EpochIterator:
        self._check_idle("iter()")
        it = EpochIterator(self.reading(self.num_workers), self._cursor, self.recorder,
                           self.log_every)
        self._active = weakref.ref(it)
        return it

    def _check_idle(self, what: str) -> None:
        running = self._active()
        if running is None or not running.live:
            return
        c = self._cursor
        raise LoaderInUseError(
            f"{what} on {self!r} while an iterator of it is live: it is delivering epoch "
            f"{c.epoch}, {c.done} of {len(running.stream.plan)} batches so far. A loader has one "
            "live iterator at a time, so that no epoch ends silently. Ways out: loader.peek() "
            "looks at the next batch without consuming it; finish the first iterator, or call "
            "its close() (or loader.close()), and the next iter() continues that epoch where it "
            "stopped; or build a second Loader to read the data independently"
        )

    def peek(self) -> Any:
        """The next batch the loader will deliver, made as it will be (transform, output,
        device), read in this process without moving the cursor: for shapes and dtypes, e.g. to
        initialise a model or declare a ``tf.data`` signature, or to log a sample.

        >>> import tempfile
        >>> from lanceloader.demo import write_demo_dataset
        >>> uri = write_demo_dataset(tempfile.mkdtemp() + "/demo.lance", rows=10)
        >>> loader = Loader(uri, batch_size=4, columns=["x", "label"], output="numpy")
        >>> loader.peek()["x"].shape, loader.epoch, len(list(loader))
        ((4, 64), 0, 3)
        """
        c = self._cursor
        epoch, plan, batch = c.epoch, c.plan, c.done
        if c.at_end:  # the next batch comes after this epoch's empty remainder
            epoch, plan, batch = epoch + 1, self.plan(), 0
        if len(plan) == 0:
            raise ValueError(f"{self!r} has no batches to peek at (an epoch has none)")
        task = next(read_tasks(epoch, plan, per_read=1, batches=range(batch, batch + 1)))
        work = dataclasses.replace(self._work(), output=self.conversion)  # final output here
        out = work(task).batches[0]
        return out if self.placement is None else self.placement(out)

    def mixing_report(self, batches: int = 200, places: int = 100) -> MixingReport:
        """How well the current epoch's order mixes the dataset, and how many reads it costs,
        computed from the order alone (no I/O): see :mod:`lanceloader.mixing` and the guide.

        >>> print(loader.mixing_report())                   # doctest: +SKIP
        """
        if isinstance(self.source, MixedSource):
            raise ValueError("a mix has no order of its own to report on: its sources' orders "
                             "are interleaved; call mixing_report() on each source's Loader")
        c = self._cursor
        return mixing_report(self.order, self.plan(c.sample), c.epoch, self.batches_per_read,
                             batches, places)

    # --- checkpoints ----------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Where the loader is: a small JSON-safe dict to save with the model checkpoint.

        Counts only batches handed to the training loop; prefetched batches are read again after
        a resume. On several ranks, every rank returns the same dict when all have taken the same
        number of batches (as in lock-step data-parallel training), so saving rank 0's suffices.
        The state names the dataset by identity (``state.py``): it resumes on a copy of the
        dataset (with ``allow_changes=("uri",)``), never on other data at the same URI.

        >>> state = loader.state_dict()                     # doctest: +SKIP
        >>> loader.load_state_dict(state)                   # doctest: +SKIP
        """
        return self._cursor.state_dict()

    def load_state_dict(self, state: dict[str, Any], allow_changes: tuple[str, ...] = ()) -> None:
        """Continue at the state's epoch and sample: the next ``iter()`` starts there.

        The state may come from any number of ranks (elastic resume). ``allow_changes`` names
        settings that may differ from the saved ones without changing the order:
        ``"batch_size"``, ``"drop_last"``, ``"columns"``, and ``"uri"`` for a copied or moved
        dataset. Anything else that differs (dataset identity or version, filter, split, shuffle
        settings, seed), and a damaged state, raises :class:`StateMismatchError`.
        """
        self._check_idle("load_state_dict()")
        if isinstance(self.source, MixedSource):
            state = self._resume_mix(state, allow_changes)
            allow_changes = tuple(a for a in allow_changes if a != "weights")
        self._cursor.load_state_dict(state, allow_changes)

    def _resume_mix(self, state: dict[str, Any], allow_changes: tuple[str, ...]
                    ) -> dict[str, Any]:
        """A state of this mix with other weights, made a state of this mix (see
        :mod:`lanceloader.mix`): the mix is rebuilt with offsets that continue each source
        where the state left it. Other states pass unchanged (and are checked as usual)."""
        check_keys(state)
        saved, current = state["order"].get("mix"), self.source.settings["mix"]
        if saved is None or saved == current:
            return state
        same = {k: v for k, v in saved.items() if k not in ("quotas", "offsets")} == \
            {k: v for k, v in current.items() if k not in ("quotas", "offsets")}
        if not same:
            return state  # other sources or settings: the usual checks name the difference
        if saved["quotas"] == current["quotas"]:  # a state of a run that changed weights once
            mix, sample = self.source.mix.with_offsets(saved["offsets"]), state["sample"]
        elif "weights" not in allow_changes:
            raise StateMismatchError(
                f"cannot load this state into this loader: the state's mix has quotas "
                f"{saved['quotas']} (offsets {saved['offsets']}), this one {current['quotas']} "
                f"(offsets {current['offsets']}). Pass allow_changes=('weights',) to continue "
                "every source exactly where the state left it with the new weights")
        else:
            mix, sample = self.source.mix.resumed(state)
        self.source = mix.source()
        self.order = self.source.order(self.order.seed)
        self._cursor = self._new_cursor()
        spec = self._cursor.spec
        return {**state, "order": dict(spec.order), "fingerprint": spec.fingerprint,
                "dataset": spec.dataset, "uri": spec.uri, "sample": sample}

    def close(self) -> None:
        """Stop the live iterator's workers (if any); the cursor stays where it stopped."""
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

    def reading(self, workers: int) -> Reading:
        """How this loader's streams read with ``workers`` workers: ``prefetch`` batches (the
        given one, or the default for that many workers) in whole reads, at least one per
        worker."""
        prefetch = self._prefetch_given or default_prefetch(
            workers, self.batches_per_read, self.transform is not None)
        work = self._work()
        return Reading(
            work, workers, self.batches_per_read,
            reads_in_flight(prefetch, self.batches_per_read, workers), self.worker_type,
            finish=self.conversion if work.conversion.output != self.output else None,
            placement=self.placement, stall_timeout=self.stall_timeout,
        )

    def _work(self) -> BatchWork:
        # Process workers return NumPy (through shared memory); the consumer makes tensors.
        conversion = self.conversion
        if self.worker_type == "process" and self.output in TENSOR_OUTPUTS:
            conversion = dataclasses.replace(conversion, output="numpy")
        return BatchWork(self.source, self.order, self.transform, conversion, False,
                         self.on_error, self.max_skip_fraction)

    # --- stats and tracing --------------------------------------------------------------

    def stats(self, epoch: int | None = None) -> Stats:
        """What the loader did so far: throughput, I/O, time per stage and the bottleneck.

        ``epoch=None`` sums every iteration so far; ``epoch=-1`` is the last (or current) one,
        ``epoch=0`` the first. ``print(loader.stats())`` shows a table and the verdict.

        >>> print(loader.stats().bottleneck)                # doctest: +SKIP
        bottleneck: training loop (the loop waited for data 2% of the time). Try: ...
        """
        stats = self.recorder.snapshot(workers=self.num_workers,
                                       shuffle_random=self._read_order().random_reads,
                                       epoch=epoch)
        if self.packing is not None:
            stats = dataclasses.replace(stats, padding_fraction=self.packing.padding_fraction)
        return stats

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

