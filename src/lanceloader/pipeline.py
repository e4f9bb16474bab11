"""Pipeline: a Loader's settings as plain data per stage, assembled once into what it runs.

``Loader(...)`` groups its keywords into :class:`RowsSettings` (what to read),
:class:`OrderSettings`, :class:`Batching`, :class:`Steps` (the transform and its error policy),
:class:`Output` (the format, decided here and only here: what a worker makes, what the
consumer finishes, where batches are placed) and :class:`Workers`; :meth:`Pipeline.assemble`
checks them together, before any worker starts, and builds the chain: the rows (any kind of
the rows protocol), the order, the worker's job (:class:`~lanceloader.engine.work.BatchWork`)
and how streams read (:class:`~lanceloader.engine.stream.Reading`). ``MapDataset`` builds its
rows from the same :class:`RowsSettings`.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from lanceloader.arguments import check_bool, check_numbers, check_ray_workers, check_seconds
from lanceloader.batch.checks import check_bytes_for_tensors, check_output, check_schema
from lanceloader.batch.output import Conversion, with_fill_nulls
from lanceloader.batch.transforms import (
    DEFAULT_MAX_SKIP_FRACTION,
    OnError,
    as_transform,
    check_on_error,
    transform_name,
)
from lanceloader.engine.device import Placement, check_placement
from lanceloader.engine.pickling import check_picklable
from lanceloader.engine.processes import start_forkserver
from lanceloader.engine.reading import DEFAULT_STALL_TIMEOUT, Reading
from lanceloader.engine.sizing import (
    batches_per_read,
    default_prefetch,
    default_workers,
    reads_in_flight,
)
from lanceloader.engine.stats import Recorder
from lanceloader.engine.tasks import store_ranges
from lanceloader.engine.verdict import usable_cores
from lanceloader.engine.work import BatchWork
from lanceloader.ordering.order import Order
from lanceloader.ordering.plan import Plan, read_tasks
from lanceloader.rows.cache.pieces import AUTO
from lanceloader.rows.clips.source import AudioClips, VideoClips, clip_source
from lanceloader.rows.clips.windows import clips_of
from lanceloader.rows.lance.follow import refuse_unagreed
from lanceloader.rows.lance.source import Source
from lanceloader.rows.mix import Mix
from lanceloader.rows.packed import PackedSource
from lanceloader.rows.packing import Packing
from lanceloader.rows.protocol import RowsBase, RowSource
from lanceloader.state.format import StreamSpec, check_keys, order_settings

TENSOR_OUTPUTS = ("torch", "jax", "tf")
_hinted: set[str] = set()


@dataclass(frozen=True)
class RowsSettings:
    """What to read of a dataset: projection, filter, version, split, cache, packing, clips and
    how blob columns are read."""

    columns: list[str] | None = None
    filter: str | None = None
    version: int | str | None = None
    storage_options: dict[str, str] | None = None
    splits: dict[str, float] | None = None
    split: str | None = None
    split_key: str | None = None
    cache: str | os.PathLike[str] | None = AUTO  # chosen from the order and the size
    cache_size: int | None = None
    pack: Packing | None = None
    clips: VideoClips | AudioClips | None = None
    blobs: dict[str, str] | None = None  # blob columns: "bytes" (default), "file", "descriptor"
    follow: bool = False  # each epoch reads the table's newest version (rows/lance/follow.py)

    @classmethod
    def of_state(
        cls, state: Mapping[str, Any], storage_options: dict[str, str] | None = None
    ) -> RowsSettings:
        """What a state's rows were read with (its version, filter, split, packing or clips),
        to read them again without a cache (a ledger from a state)."""
        order = state["order"]
        pack, clips = order.get("pack"), order.get("clips")
        columns = [pack["column"]] if pack else list(state["columns"])
        if clips:  # the state's columns are the clips': the dataset's, and clip_start
            columns = [c for c in columns if c != "clip_start"]
        return cls(
            columns,
            order["filter"],
            state["version"],
            storage_options,
            order["splits"],
            order["split"],
            order["split_key"],
            cache=None,
            pack=Packing(**pack) if pack else None,
            clips=clips_of(clips) if clips else None,
            follow="follow" in order,  # the state's version, with its history (resumed)
        )

    def build(self, dataset: Any, seed: int = 0, random_order: bool = True) -> RowSource:
        """The rows of ``dataset`` (a URI or ``lance.LanceDataset``): Lance rows, packed or
        clips if asked (``seed`` draws ``per_video`` clips' starts). ``random_order``: whether
        they are read shuffled (``cache="auto"`` decides with it; map-style readers, which
        read by index, leave it True)."""
        if self.pack is not None and not isinstance(self.pack, Packing):
            raise TypeError(f"pack must come from ll.pack(column, seq_len), got {self.pack!r}")
        if self.pack is not None and self.clips is not None:
            raise ValueError(
                "pack= and clips= both give the samples (packed token rows, or "
                "media clips); a Loader takes one of them"
            )
        if self.follow and (self.pack is not None or self.clips is not None):
            raise ValueError(
                "follow=True reads each epoch from the table's newest version, which a "
                "packing or clip plan made once does not follow yet: pin the version "
                "(follow=False) with pack= or clips="
            )
        settings = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name not in ("pack", "clips", "follow")
        }
        settings["random_order"] = random_order
        if self.clips is not None:
            return clip_source(dataset, self.clips, seed, **settings)
        source = Source(dataset, **settings, follow=self.follow)
        return source if self.pack is None else PackedSource(source, self.pack)


@dataclass(frozen=True)
class OrderSettings:
    shuffle: bool = False
    shuffle_block_size: int = 1
    shuffle_window: int | None = None
    seed: int = 0

    def build(self, num_rows: int) -> Order:
        return Order.from_options(
            num_rows, self.shuffle, self.shuffle_block_size, self.shuffle_window, self.seed
        )


@dataclass(frozen=True)
class Batching:
    batch_size: int = 256
    drop_last: bool = False
    rank: int = 0
    world_size: int = 1


@dataclass(frozen=True)
class Steps:
    """The transform run on each batch in the workers, and what it does with a failed row."""

    transform: Any = None
    on_error: OnError = "raise"
    max_skip_fraction: float = DEFAULT_MAX_SKIP_FRACTION


@dataclass(frozen=True)
class Output:
    """The output format (a :class:`Conversion`) and where batches go (``pin_memory``,
    ``device`` and the device prefetch bounds: a :class:`~lanceloader.engine.device.Placement`):
    the one place that decides what a worker returns and what the consumer finishes."""

    conversion: Conversion
    placement: Placement | None = None
    explicit: bool = False  # given as a Conversion (which keeps bytes as lists for tensors)

    @classmethod
    def of(
        cls,
        output: str | Conversion,
        pin_memory: bool = False,
        device: Any = None,
        device_prefetch: int | None = None,
        device_prefetch_bytes: int | None = None,
        fill_nulls: Mapping[str, Any] | None = None,
    ) -> Output:
        check_bool("pin_memory", pin_memory)
        conversion = check_output(with_fill_nulls(output, fill_nulls))
        placement = check_placement(
            conversion.output, pin_memory, device, device_prefetch, device_prefetch_bytes
        )
        return cls(conversion, placement, isinstance(output, Conversion))

    def in_worker(self, worker_type: str) -> Conversion:
        """What a worker makes: process workers and Ray actors return NumPy (through shared
        memory, or Ray's object store) and the consumer makes tensors of it."""
        if worker_type in ("process", "ray") and self.conversion.output in TENSOR_OUTPUTS:
            return dataclasses.replace(self.conversion, output="numpy")
        return self.conversion


@dataclass(frozen=True)
class Workers:
    num_workers: int | None = None
    worker_type: str = "thread"
    prefetch: int | None = None
    rows_per_read: int | None = None
    log_every: int | None = None
    stall_timeout: float | None = DEFAULT_STALL_TIMEOUT
    ray_options: Mapping[str, Any] | None = None  # worker_type="ray": the actors' Ray options


@dataclass(frozen=True)
class Pipeline:
    """The chain a Loader runs, built once by :meth:`assemble`."""

    source: RowSource
    order: Order
    batching: Batching
    steps: Steps
    output: Output
    workers: Workers
    num_workers: int
    batches_per_read: int

    @classmethod
    def assemble(
        cls,
        dataset: Any,
        rows: RowsSettings,
        order: OrderSettings,
        batching: Batching,
        steps: Steps,
        output: Output,
        workers: Workers,
    ) -> Pipeline:
        check_settings(order, batching, workers, output)
        steps = dataclasses.replace(steps, transform=as_transform(steps.transform))
        check_on_error(steps.on_error, steps.max_skip_fraction)
        if isinstance(dataset, Mix):  # a builder, not rows: it sets the rows and their order
            refuse_mix_settings(rows, order)
            # its schedule's steps are placed with the global batch
            source: RowSource = dataset.source(
                batching.batch_size * batching.world_size, batching.drop_last
            )
        elif isinstance(dataset, RowsBase):  # rows already (a kind of the user's own)
            refuse_rows_settings(rows)
            refuse_unagreed(dataset, batching.world_size)  # a followed Source given as rows
            source = cast(RowSource, dataset)  # RowsBase gives the defaults, the kind the rest
        else:
            source = rows.build(dataset, order.seed, random_order=order.shuffle)
        the_order = order.build(source.num_rows)
        hints = source.hints
        if workers.worker_type != "thread" and source.facts.cache_per_process:
            raise ValueError(
                "cache='memory' keeps pieces in one process's memory, and each "
                "process worker would fill a copy of its own: with "
                f"worker_type={workers.worker_type!r} give a directory, e.g. "
                "cache='/dev/shm/lance-cache' (in RAM, shared by the workers)"
            )
        if steps.transform is None:
            schema = source.schema_table().schema
            check_schema(schema, output.conversion)
            if not output.explicit:
                check_bytes_for_tensors(schema, output.conversion.output)
            source.check_nulls(output.conversion)
        # Reads sized as random takes only where they are storage takes: through a cache a
        # shuffle's read gathers rows from pieces, whose per-piece cost a larger read spreads
        # (READ_BYTES_GATHER; docs/performance.md).
        shuffled = the_order.random_reads or hints.random_reads
        random = shuffled and not hints.cached
        reads_wait = hints.waits_on_storage and not random and steps.transform is None
        per_read = (
            max(1, workers.rows_per_read // batching.batch_size)
            if workers.rows_per_read
            else batches_per_read(
                random,
                batching.batch_size,
                steps.transform is not None,
                source.bytes_per_row,
                hints.read_parts,
                store_ranges(source, the_order),
                shuffled and hints.gathers,
                workers.worker_type,
                decodes=hints.decodes,
            )
        )
        pipeline = cls(
            source,
            the_order,
            batching,
            steps,
            output,
            workers,
            workers.num_workers or default_workers(usable_cores(), workers.worker_type, reads_wait),
            per_read,
        )
        if workers.worker_type != "thread":
            check_picklable(pipeline.work(), f"transform {transform_name(steps.transform)}")
        if workers.worker_type == "process":
            start_forkserver()
            hint_process_workers(pipeline.num_workers)
        return pipeline

    @property
    def random_reads(self) -> bool:
        """Whether reads are random takes underneath (a shuffle, or a mix of shuffled sources)."""
        return self.order.random_reads or self.source.hints.random_reads

    def spec(self) -> StreamSpec:
        """What a state of this pipeline's stream records besides the position."""
        src, b, name = self.source, self.batching, self.source.dataset_name
        return StreamSpec(
            num_rows=src.num_rows,
            order=order_settings(src, self.order),
            batch_size=b.batch_size,
            world_size=b.world_size,
            rank=b.rank,
            drop_last=b.drop_last,
            uri=name.uri,
            version=name.version,
            named=name,  # its identity read when a state is made or checked (Lance: made then)
            columns=tuple(src.columns),
        )

    def resumed(
        self, state: Any, allow_changes: tuple[str, ...]
    ) -> tuple[Pipeline, dict[str, Any], tuple[str, ...]]:
        """The pipeline that continues ``state``, the state in its terms and the changes left to
        check (``RowSource.resumed``: a mix whose weights changed continues with offsets, in an
        order of the new rows' length). Pure: nothing here changes."""
        check_keys(state)
        source, sample = self.source.resumed(state, allow_changes)
        allow = tuple(a for a in allow_changes if a != "weights")
        if source is self.source:
            return self, state, allow
        pipeline = self.reading_rows(source)
        spec = pipeline.spec()
        if spec.order == state["order"] and sample == state["sample"]:
            return pipeline, state, allow  # the state's own rows (a followed table's version)
        return (
            pipeline,
            {
                **state,
                "order": dict(spec.order),
                "fingerprint": spec.fingerprint,
                "dataset": spec.identity,
                "uri": spec.uri,
                "sample": sample,
            },
            allow,
        )

    def reading_rows(self, source: RowSource) -> Pipeline:
        """This pipeline reading ``source`` (another version of a followed table, a mix with
        other weights) in an order of its length."""
        return dataclasses.replace(
            self, source=source, order=dataclasses.replace(self.order, num_rows=source.num_rows)
        )

    def batch(self, epoch: int, plan: Plan, index: int) -> Any:
        """Batch ``index`` of ``plan`` in ``epoch``, made in this process as the training loop
        gets it (transform, final output, placement): what ``Loader.peek`` shows."""
        task = next(read_tasks(epoch, plan, per_read=1, batches=range(index, index + 1)))
        out = self.work(final=True)(task).batches[0]
        return out if self.output.placement is None else self.output.placement.place(out)

    def work(self, final: bool = False) -> BatchWork:
        """What a worker does with a task; ``final``: in this process, to the final output."""
        conversion = (
            self.output.conversion if final else self.output.in_worker(self.workers.worker_type)
        )
        s = self.steps
        return BatchWork(
            self.source, self.order, s.transform, conversion, False, s.on_error, s.max_skip_fraction
        )

    def reading(
        self, workers: int, recorder: Recorder | None = None, governor: Any = None
    ) -> Reading:
        """How streams read with ``workers`` workers: ``prefetch`` batches (the given one, or
        the default for that many workers) in whole reads, at least one per worker. With a
        device, each stream gets a device queue (its stats go to ``recorder``): thread workers
        stage and register their batches in it, the consumer takes them on arrival."""
        transform = self.steps.transform is not None
        prefetch = self.workers.prefetch or default_prefetch(
            workers, self.batches_per_read, transform, self.workers.worker_type
        )
        work: BatchWork = self.work()
        finish = self.output.conversion if work.conversion != self.output.conversion else None
        placement = self.output.placement
        arrive = None
        if placement is not None:
            queue = placement.queue(recorder)
            arrive = queue.arrive
            if self.workers.worker_type == "thread":
                work = placement.work(work, queue)
        return Reading(
            work,
            workers,
            self.batches_per_read,
            reads_in_flight(prefetch, self.batches_per_read, workers),
            self.workers.worker_type,
            finish=finish,
            placement=arrive,
            stall_timeout=self.workers.stall_timeout,
            ray_options=self.workers.ray_options,
            governor=governor,
        )


def check_settings(
    order: OrderSettings, batching: Batching, workers: Workers, output: Output
) -> None:
    """The settings' own checks (each names the argument and what it takes)."""
    check_bool("shuffle", order.shuffle)
    check_bool("drop_last", batching.drop_last)
    check_seconds("stall_timeout", workers.stall_timeout)
    check_numbers(
        batch_size=batching.batch_size,
        shuffle_block_size=order.shuffle_block_size,
        seed=order.seed,
        shuffle_window=order.shuffle_window,
        num_workers=workers.num_workers,
        prefetch=workers.prefetch,
        rows_per_read=workers.rows_per_read,
        log_every=workers.log_every,
    )
    if workers.worker_type not in ("thread", "process", "ray"):
        raise ValueError(
            f"worker_type must be 'thread', 'process' or 'ray', got {workers.worker_type!r}"
        )
    if workers.worker_type == "ray":
        check_ray_workers(workers.num_workers, workers.ray_options)
    elif workers.ray_options is not None:
        raise ValueError(
            f"ray_options= is for worker_type='ray' (Ray actors); got worker_type="
            f"{workers.worker_type!r}: drop ray_options or pass worker_type='ray'"
        )


def given_rows_settings(rows: RowsSettings) -> list[str]:
    """The names of the rows settings given other than their defaults."""
    return [
        f.name
        for f in dataclasses.fields(rows)
        if getattr(rows, f.name) is not None and getattr(rows, f.name) != f.default
    ]


def refuse_rows_settings(rows: RowsSettings) -> None:
    """Rows given as rows have their columns, filter and cache already: say so for any given."""
    given = given_rows_settings(rows)
    if given:
        raise ValueError(
            f"Loader(rows) got {', '.join(given)}: rows given as an object of the "
            "rows protocol read what they read; give those settings to the rows"
        )


def refuse_mix_settings(rows: RowsSettings, order: OrderSettings) -> None:
    """A mix takes what to read and its order from its sources: say so for any given here."""
    given = given_rows_settings(rows)
    given += [
        name
        for name, value, default in (
            ("shuffle", order.shuffle, False),
            ("shuffle_block_size", order.shuffle_block_size, 1),
            ("shuffle_window", order.shuffle_window, None),
        )
        if value != default
    ]
    if given:
        raise ValueError(
            f"Loader(Mix(...)) got {', '.join(given)}: a mix takes what to read and in which "
            "order from each source's own Loader (columns, filter, split, cache, pack, "
            "shuffle), and interleaves those orders in exact proportions; set them on the "
            "source Loaders"
        )


def hint_process_workers(workers: int) -> None:
    """Say once per process when there are more process workers than cores: each is a whole
    interpreter, and they take turns on the cores (4 on 2 cores ran 2.3x slower than 2)."""
    cores = usable_cores()
    if workers > cores and "process-workers" not in _hinted:
        _hinted.add("process-workers")
        warnings.warn(
            f"num_workers={workers} process workers on {cores} cores: the processes take turns "
            f"on the cores (4 on 2 cores ran 2.3x slower than 2); pass num_workers={cores} or "
            "fewer (this hint is shown once)",
            UserWarning,
            stacklevel=4,
        )
