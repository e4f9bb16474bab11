"""Loader: the object users hold, a thin face over a :class:`~lanceloader.pipeline.Pipeline`
(its settings per stage, assembled once) and a :class:`~lanceloader.state.cursor.Cursor` (where
the stream stands). Each ``iter()`` is a :class:`~lanceloader.engine.stream.EpochIterator`
delivering the rest of the cursor's epoch (the guide's "Epochs and iterators": one live
iterator at a time; a ``break`` keeps the place; the epoch advances at its end).

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
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import lance

from lanceloader.arguments import check_int
from lanceloader.batch.output import Conversion
from lanceloader.batch.transforms import DEFAULT_MAX_SKIP_FRACTION, OnError
from lanceloader.distributed import resolve_rank_world
from lanceloader.engine.ahead import AheadSlot, reads_ahead
from lanceloader.engine.budget import Governor
from lanceloader.engine.live import LiveIterator
from lanceloader.engine.pool import KeptPool
from lanceloader.engine.reading import DEFAULT_STALL_TIMEOUT, Reading
from lanceloader.engine.stats import Recorder, Stats
from lanceloader.engine.stream import EpochIterator
from lanceloader.engine.work import Transform
from lanceloader.ordering.plan import Plan
from lanceloader.ordering.report import MixingReport, mixing_report
from lanceloader.pipeline import (
    Batching,
    OrderSettings,
    Output,
    Pipeline,
    RowsSettings,
    Steps,
    Workers,
)
from lanceloader.rows.clips.source import AudioClips, VideoClips
from lanceloader.rows.lance.follow import agreement, refuse_pending_look
from lanceloader.rows.ordered import OrderedSource
from lanceloader.rows.packing import Packing, PackPlan
from lanceloader.state.cursor import Cursor
from lanceloader.steering import MixSteering


class Loader(MixSteering):
    """Batches of a Lance dataset, in a deterministic order, prefetched by a pool of workers.

    Args:
        dataset: URI (local path or object store), a ``lance.LanceDataset``, or a
            :class:`~lanceloader.Mix` (whose sources set what to read and in which order).
        batch_size: rows per batch on each rank.
        columns: columns to read; default all.
        filter: SQL predicate, evaluated once against the pinned version.
        version: dataset version (number or tag) to pin; default the latest at construction.
        follow: follow the table as it grows: each epoch reads the newest version at its start
            (rows delivered in an epoch never again in it; rows appended during an epoch come
            in the next), and the state records each adoption so a resume replays them; see
            docs/growing-tables.md and :mod:`lanceloader.rows.lance.follow`. On several ranks
            they must read the same version: rank 0's through ``torch.distributed``, or pass
            ``agree(newest) -> version``, which returns the same version on every rank.
        storage_options: object-store options passed to Lance.
        splits: ``{"train": 0.9, "val": 0.1}``: deterministic named splits; with ``split``.
        split: which split this loader reads.
        split_key: column whose value decides a row's split; default the row offset.
        cache: keep the projected columns for later epochs: a local directory (shared by every
            worker, loader and process naming it, with the filter/split plan) or ``"memory"``
            (thread workers only); see :mod:`lanceloader.rows.cache.pieces`. Default ``"auto"``: a
            shuffle (full or block), or any order on an object store, gets a directory under
            ``/dev/shm`` shared by the machine's processes, when the projected columns
            (bytes per row x rows) fit its budget, the lesser of half the free ``/dev/shm``
            and a quarter of the available memory; a sequential local read gets none. The
            directory is removed once the last process using it exited (even SIGKILLed).
            ``stats()`` says what was chosen and why; ``None`` turns caching off.
        cache_size: the cache's cap in bytes; default half the free disk space or memory
            (with ``"auto"``: replaces its budget).
        pack: ``ll.pack(column, seq_len)``: rows of ``seq_len`` tokens packed from the token
            lists of ``column`` (:mod:`lanceloader.rows.packed`).
        clips: ``ll.video_clips(column, frames)`` or ``ll.audio_clips(column, seconds)``: the
            samples are clips of the media in ``column``, decoded in the workers from only
            the bytes each needs (:mod:`lanceloader.rows.clips.source`).
        blobs: how Lance blob columns arrive, ``{column: "bytes" | "file" | "descriptor"}``:
            by default their payloads (bytes); ``"file"`` gives a transform lazy file-like
            objects that read only the ranges it asks for (``ll.blob_files(batch, column)``);
            ``"descriptor"`` Lance's positions and sizes (:mod:`lanceloader.rows.lance.blobs`).
        shuffle: ``False`` reads in dataset order; ``True`` shuffles, differently each epoch.
        shuffle_block_size: rows read together when shuffling; 1 is a full random shuffle.
        shuffle_window: blocks whose rows are mixed together; default 8 (block shuffle only).
        seed: the same seed gives the same order everywhere.
        drop_last: drop the last, short global batch.
        transform: ``fn(pyarrow.RecordBatch) -> batch`` (or a list, applied in order), run in
            the workers; a RecordBatch or dict it returns is converted to ``output``.
        on_error: what a row-aware transform (``ll.map_rows``, ``ll.decode_images``, ...) does
            with a failed row: ``"raise"``, ``"skip"`` (``stats().rows_skipped``), or a
            function ``on_error(exc, row)`` called before skipping.
        max_skip_fraction: the share of a batch's rows that may be skipped
            (``TooManyRowErrors`` beyond).
        output: ``"numpy"``, ``"torch"``, ``"jax"``, ``"tf"``, ``"arrow"``, ``"python"``, or
            an ``ll.Conversion`` (nulls, ragged lists, strings, casts).
        fill_nulls: column name to the value its nulls take, e.g. ``{"score": 0.0}``: the same
            as ``output=ll.Conversion(output=..., fill_nulls=...)``. Without it, nulls in an
            array column are an error: at construction where a scan is cheap (local fixed-width
            columns, :func:`~lanceloader.rows.lance.nulls.check_nulls`), else in the batch holding them,
            naming the batch and the row.
        pin_memory: torch output: page-lock batches (a warning where there is no CUDA).
        device: copy batches to this device ahead of use: torch output, e.g. ``"cuda"``; JAX
            output, a ``jax.Device`` or ``Sharding`` (:mod:`lanceloader.engine.device`).
        device_prefetch, device_prefetch_bytes: batches ahead on the device, at most that many
            and bytes; default 2 and 1 GiB (``prefetch`` counts batches made on the host).
        num_workers: worker threads; default the number of cores, twice that for plain
            Lance rows read in order with no transform and no cache (those threads wait
            on Lance's own; see ``engine/sizing.default_workers``).
        worker_type: ``"thread"`` (Lance, Arrow and most decoders release the GIL),
            ``"process"`` (pure-Python transforms; a clean forkserver, shared memory) or
            ``"ray"``: ``num_workers`` Ray actors, anywhere on the Ray cluster this process is
            connected to (``ray.init()`` is called if it is not), build the batches, the same
            bytes as local workers (guide: remote-workers.md).
        ray_options: with ``worker_type="ray"``, each actor's Ray options: ``num_cpus``
            (default 1), ``num_gpus``, ``memory``, ``resources``, ``scheduling_strategy``
            (e.g. ``"SPREAD"``), ``runtime_env``.
        prefetch: batches prepared ahead; default ``2 * num_workers`` (two reads per worker
            with a transform). Work is whole reads, at least one per worker, which bounds the
            memory (see :mod:`lanceloader.engine.stream`).
        rank, world_size: this process's slice of each global batch, and the number of ranks;
            default detected (torch.distributed, Ray Train, RANK/WORLD_SIZE).
        rows_per_read: rows per Lance call; default 65,536 (16,384 shuffled without a cache),
            at most 8 MiB (rows of over 8 KB: 1,024 rows within 16 MiB), 2 batches with a
            transform.
        log_every: log a one-line summary (logger ``lanceloader``) every N batches.
        stall_timeout: seconds the loop may wait for one batch before
            :class:`~lanceloader.StallError` names the stuck worker and its stack; ``None``
            waits forever.
        cpu_budget: cores the loader may use (its worker threads, Lance's threads, its worker
            processes), held over any 5 s window by pacing the start of reads; ``None`` (the
            default): no budget. ``stats()`` says when the budget held the loader back.
        tune: give up reads in flight while the loop waits for batches under 1% of the time,
            settling on the fewest that keep it fed (less memory, fewer bursts on the
            trainer's cores); the batches are the same bytes as without it. ``None`` (the
            default): on when ``num_workers`` and ``prefetch`` are left to the loader, off when
            either is given; ``True``/``False``: on/off (see docs/profiling.md).
    """

    def __init__(
        self,
        dataset: str | os.PathLike[str] | lance.LanceDataset | Any,
        batch_size: int = 256,
        *,
        columns: list[str] | None = None,
        filter: str | None = None,
        version: int | str | None = None,
        follow: bool | Callable[[int], int] = False,
        storage_options: dict[str, str] | None = None,
        splits: dict[str, float] | None = None,
        split: str | None = None,
        split_key: str | None = None,
        cache: str | os.PathLike[str] | None = "auto",
        cache_size: int | None = None,
        pack: Packing | None = None,
        clips: VideoClips | AudioClips | None = None,
        blobs: dict[str, str] | None = None,
        shuffle: bool = False,
        shuffle_block_size: int = 1,
        shuffle_window: int | None = None,
        seed: int = 0,
        drop_last: bool = False,
        transform: Transform | list[Transform] | None = None,
        on_error: OnError = "raise",
        max_skip_fraction: float = DEFAULT_MAX_SKIP_FRACTION,
        output: str | Conversion = "numpy",
        fill_nulls: Mapping[str, Any] | None = None,
        pin_memory: bool = False,
        device: Any = None,
        device_prefetch: int | None = None,
        device_prefetch_bytes: int | None = None,
        num_workers: int | None = None,
        worker_type: str = "thread",
        ray_options: Mapping[str, Any] | None = None,
        prefetch: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        rows_per_read: int | None = None,
        log_every: int | None = None,
        stall_timeout: float | None = DEFAULT_STALL_TIMEOUT,
        cpu_budget: float | None = None,
        tune: bool | None = None,
    ) -> None:
        # kept across epochs; None: neither a budget nor tuning
        self._governor = Governor.of(cpu_budget, tune, num_workers, prefetch)
        rank, world_size = resolve_rank_world(rank, world_size)
        self._pipeline = Pipeline.assemble(
            dataset,
            RowsSettings(
                columns,
                filter,
                version,
                storage_options,
                splits,
                split,
                split_key,
                cache,
                cache_size,
                pack,
                clips,
                blobs,
                agreement(follow, world_size),
            ),
            OrderSettings(shuffle, shuffle_block_size, shuffle_window, seed),
            Batching(batch_size, drop_last, rank, world_size),
            Steps(transform, on_error, max_skip_fraction),
            Output.of(
                output, pin_memory, device, device_prefetch, device_prefetch_bytes, fill_nulls
            ),
            Workers(
                num_workers,
                worker_type,
                prefetch,
                rows_per_read,
                log_every,
                stall_timeout,
                ray_options,
            ),
        )
        self.recorder = Recorder()
        self._cursor = Cursor(self._pipeline.spec())
        self._live = LiveIterator()  # held weakly; the cursor outlives it
        self._ahead = AheadSlot()  # the next epoch's first read (engine/ahead.py)
        self._began = (0, 0)  # where this loader's delivery began (stats().mix counts from it)
        self._pool = KeptPool()  # process workers, kept across epochs until close()

    # --- the stages, as assembled (read-only views of the pipeline) ---------------------

    source = property(lambda self: self._pipeline.source, doc="The rows (``RowSource``).")
    order = property(lambda self: self._pipeline.order, doc="The order of the rows.")
    transform = property(lambda self: self._pipeline.steps.transform)
    output = property(lambda self: self._pipeline.output.conversion.output)
    batch_size = property(lambda self: self._pipeline.batching.batch_size)
    rank = property(lambda self: self._pipeline.batching.rank)
    world_size = property(lambda self: self._pipeline.batching.world_size)
    num_workers = property(lambda self: self._pipeline.num_workers)
    batches_per_read = property(lambda self: self._pipeline.batches_per_read)
    log_every = property(lambda self: self._pipeline.workers.log_every)
    stall_timeout = property(lambda self: self._pipeline.workers.stall_timeout)
    prefetch = property(
        lambda self: self.reading(self.num_workers).reads_in_flight * self.batches_per_read
    )
    worker_type = property(lambda self: self._pipeline.workers.worker_type)
    stream_spec = property(
        lambda self: self._cursor.spec,
        doc="What this loader's stream is (rows, order, batching, dataset): what a state of it "
        "records, and what an adapter's own cursor (``state.Cursor``) is made from.",
    )
    sample = property(
        lambda self: self._cursor.sample,
        doc="The global sample of the current epoch the next batch starts at (0: at an epoch's "
        "start).",
    )

    def ordered_source(self, name: str) -> OrderedSource:
        """This loader's rows, order and transform as a source of a :class:`~lanceloader.Mix`
        (its batch size, workers and output are the mix's loader's business)."""
        if "follow" in self.source.settings():
            raise ValueError(
                f"source {name!r} of a Mix follows its table (follow=True): a mix of "
                "followed tables is not supported yet (its interleave is planned over fixed "
                "row counts); pin the version (follow=False) of each source"
            )
        return OrderedSource(
            name, self.source, self.order, self.transform, self._pipeline.steps.on_error
        )

    @property
    def packing(self) -> PackPlan | None:
        """With ``pack=``: the packing (rows, tokens, ``padding_fraction``, documents dropped);
        else ``None``."""
        return self.source.facts.packing

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
        self._live.check_idle("set_epoch()", self, self._cursor)
        self._live.forget()
        if epoch != self._cursor.epoch or self._cursor.start or self._cursor.done:
            self._ahead.drop()
        self._cursor.seek(epoch)

    def __iter__(self) -> EpochIterator:
        """The rest of the current epoch: the batches it hands out are consumed (``peek()``
        looks without consuming). One live iterator at a time (``LoaderInUseError``).

        An ``iter()`` that continues an epoch after an earlier iterator that delivered exactly
        one batch to a ``next()`` call (not to a ``for`` loop or comprehension) and was dropped
        before the epoch's end, the loader not moved since, logs one WARNING per loader (logger
        ``lanceloader``) naming the batches left and ``peek()``: ``next(iter(loader))`` to log
        a sample takes that batch from training. A loop that breaks and resumes, an iterator
        stepped more than once, ``set_epoch`` and ``load_state_dict`` stay quiet.
        """
        began = time.perf_counter()  # the loop waits from here (a followed table's check too)
        self._live.check_idle("iter()", self, self._cursor)
        self._adopt_at_epoch_start()
        c, slot = self._cursor, self._ahead
        ahead = slot.take(self._pipeline, c, self.recorder.tracing)
        slot.started(c)
        reading = ahead.reading if ahead is not None else self.reading(self.num_workers)
        on_all_sent = self._read_ahead if slot.wanted and reads_ahead(reading) else None
        iterator = EpochIterator(
            reading,
            c,
            self.recorder,
            self.log_every,
            self._pool,
            ahead,
            on_all_sent,
            slot.drop,
            began,
        )
        return self._live.start(iterator, c)

    def _read_ahead(self) -> None:
        """The live iterator sent its epoch's last read: send the next epoch's first reads
        (``engine/ahead.py``; dropped unseen unless the next ``iter()`` starts that epoch)."""
        reading = self.reading(self.num_workers)
        self._ahead.start(self._pipeline, reading, self._cursor, self.recorder.tracing)

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
        if self.world_size == 1:
            self._adopt_at_epoch_start()
            c = self._cursor
        elif not (c.start or c.done):  # ranks agree on a followed table's version in iter()
            refuse_pending_look(self.source, c.epoch)
        epoch, plan, batch, pipeline = c.epoch, c.plan, c.done, self._pipeline
        if c.at_end:  # the next batch comes after this epoch's empty remainder
            pipeline = self._next_epoch_pipeline()
            epoch, plan, batch = epoch + 1, pipeline.spec().plan(), 0
        if len(plan) == 0:
            raise ValueError(f"{self!r} has no batches to peek at (an epoch has none)")
        return pipeline.batch(epoch, plan, batch)

    def _next_epoch_pipeline(self) -> Pipeline:
        """What the next epoch reads, seen from the end of this one without adopting anything
        (``follow=True``: the table's newest version; on several ranks, refused there)."""
        if self.world_size > 1:
            refuse_pending_look(self.source, self._cursor.epoch + 1)
            return self._pipeline
        source = self.source.at_epoch_start(self._cursor.epoch + 1)
        return self._pipeline if source is self.source else self._pipeline.reading_rows(source)

    def _adopt_at_epoch_start(self) -> None:
        """At an epoch's sample 0, the rows that epoch reads (``follow=True``: the table's
        newest version, its adoption recorded in the state); mid-epoch, never."""
        c = self._cursor
        if c.start or c.done:
            return
        source = self.source.at_epoch_start(c.epoch)
        if source is not self.source:
            self._pipeline = self._pipeline.reading_rows(source)
            self._cursor = Cursor(self._pipeline.spec(), epoch=c.epoch)

    def mixing_report(self, batches: int = 200, places: int = 100) -> MixingReport:
        """How well the current epoch's order mixes the dataset, and how many reads it costs,
        from the order alone (no I/O): see :mod:`lanceloader.ordering.report`."""
        if "mix" in self.source.settings():
            raise ValueError(
                "a mix has no order of its own to report on: its sources' orders "
                "are interleaved; call mixing_report() on each source's Loader"
            )
        c = self._cursor
        return mixing_report(
            self.order, self.plan(c.sample), c.epoch, self.batches_per_read, batches, places
        )

    # --- checkpoints ----------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Where the loader is: a small JSON-safe dict to save with the model checkpoint. It
        counts batches handed to the training loop (prefetched ones are read again), is the
        same on every rank in lock-step, and names the dataset by identity (``state/format.py``).
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
        self._live.check_idle("load_state_dict()", self, self._cursor)
        pipeline, state, allow = self._pipeline.resumed(state, allow_changes)
        cursor = Cursor(pipeline.spec())
        cursor.load_state_dict(state, allow)  # raises before anything of this loader changed
        if pipeline is not self._pipeline:  # other rows: workers holding the old ones go
            self._pool.close()
        self._pipeline, self._cursor = pipeline, cursor
        self._began = (cursor.epoch, cursor.sample)
        self._live.forget()
        self._ahead.drop()

    def close(self) -> None:
        """Stop the workers (the live iterator's; process workers kept between epochs); the
        cursor stays where it stopped, and the next ``iter()`` starts workers again."""
        self._live.close()
        self._ahead.drop()
        self._pool.close()

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"Loader({self.source!r}, batch_size={self.batch_size}, order={self.order}, "
            f"rank={self.rank}/{self.world_size}, output={self.output!r})"
        )

    def reading(self, workers: int) -> Reading:
        """How this loader's streams read with ``workers`` workers (see ``pipeline.py``)."""
        return self._pipeline.reading(workers, self.recorder, self._governor)

    # --- stats and tracing --------------------------------------------------------------

    def stats(self, epoch: int | None = None) -> Stats:
        """What the loader did so far: throughput, I/O, time per stage and the bottleneck;
        ``epoch=None`` sums every iteration, ``-1`` is the last one, ``0`` the first.
        ``print(loader.stats())`` shows a table and the verdict."""
        facts = self.source.facts
        stats = self.recorder.snapshot(
            workers=self.num_workers,
            shuffle_random=self._pipeline.random_reads,
            epoch=epoch,
            worker_type=self._pipeline.workers.worker_type,
            cache=facts.cache_choice,
        )
        mix = self.mix_shares()
        if mix:
            stats = dataclasses.replace(stats, mix=mix)
        if self._governor is not None:
            stats = self._governor.into(stats)
        if facts.padding_fraction is None:
            return stats
        return dataclasses.replace(stats, padding_fraction=facts.padding_fraction)

    @contextlib.contextmanager
    def trace(self, path: str | os.PathLike[str]) -> Iterator[None]:
        """Record a Chrome/Perfetto trace of the epochs started inside the block into ``path``
        (https://ui.perfetto.dev): a lane per worker (read, transform, convert) and one for the
        training loop (waiting vs. working)."""
        self.recorder.start_trace()
        try:
            yield
        finally:
            self.close()
            self.recorder.write_trace(path)
