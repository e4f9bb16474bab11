"""A loader's ``stats()`` on a dashboard: Prometheus, TensorBoard, Weights & Biases, Lightning.

Three ways out, each reading ``loader.stats()`` (the recorder's counters; nothing is added to
the loader's hot path):

* :func:`prometheus` registers a collector with ``prometheus_client``: counters (rows, batches,
  bytes, storage I/O, seconds per worker stage, the loop's seconds waiting and working), gauges
  (workers, reads in flight, busy cores), the loop's wait per batch as a histogram and as
  p50/p95/p99, and the verdict as an info metric, labelled by loader name and rank. They are
  computed when scraped (``start_http_server``) or pushed (``push_to_gateway``), in the
  thread that scrapes or pushes.
* :func:`log_every` wraps a loader: iterating it iterates the loader, and every ``every``
  batches writes a dict of scalars (:func:`scalars`, over the batches since the last write) to a
  TensorBoard ``SummaryWriter``, a W&B run, a Lightning logger or a function ``fn(metrics,
  step)``. The write runs in the training loop between two batches, so the loader's stats count
  it as the loop's work, not as waiting.
* :func:`across_ranks` gathers every rank's wait per batch over a gloo process group (a
  collective: every rank calls it) and names the slowest rank; :func:`log_every` adds it to
  its scalars when a ``torch.distributed`` process group of more than one rank exists.

Example::

    >>> import lanceloader as ll, lanceloader.metrics as metrics
    >>> from lanceloader.demo import write_demo_dataset
    >>> uri = write_demo_dataset(getfixture("tmp_path") / "m.lance", rows=1000)
    >>> loader = ll.Loader(uri, batch_size=100, columns=["id"])
    >>> seen = []
    >>> for batch in metrics.log_every(loader, lambda m, step: seen.append(step), every=4):
    ...     pass
    >>> seen
    [4, 8]
    >>> scalars(loader.stats())["lanceloader/batches"]
    10.0
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from lanceloader.engine.stats import WAIT_EDGES, WAIT_KEYS, Recorder, Stats, wait_percentiles
from lanceloader.engine.verdict import cores_busy

PREFIX = "lanceloader/"
# The Prometheus histogram's bucket bounds: every half decade of the stats' own buckets, from
# 10 µs to 1,000 s (exact counts: each bound is one of the stats' bucket edges).
PROMETHEUS_BUCKETS = tuple(
    i for i in range(0, len(WAIT_EDGES), 5) if 1e-5 * 0.999 <= WAIT_EDGES[i] <= 1e3 * 1.001
)

Sink = Callable[[dict[str, float], int], None]


# --- scalars for loggers --------------------------------------------------------------------


def scalars(
    stats: Stats | Totals, since: Stats | Totals | None = None, prefix: str = PREFIX
) -> dict[str, float]:
    """The numbers a dashboard plots, over the batches between ``since`` (an earlier
    ``stats()`` of the same loader) and ``stats`` (default: since the start): delivered rows/s
    and MB/s, the share of the loop's time spent waiting, the wait per batch (p50/p95/p99 in
    ms), each worker stage's share of the workers' time, storage MB/s; and the run's busy
    cores (when measured) and batches so far. Plain floats, keys ``prefix + name``.

    >>> from lanceloader.engine.stats import Recorder, count_delivered
    >>> rec = Recorder()
    >>> count_delivered(rec.new_epoch(), 100, 800, 0.02, 0.08, 0.1)
    >>> m = scalars(rec.snapshot())
    >>> m["lanceloader/rows_per_s"], round(m["lanceloader/wait_share"], 3), m["lanceloader/batches"]
    (1000.0, 0.2, 1.0)
    """
    w = window(stats, since)
    wall, cap = w["wall_s"], w["wall_s"] * max(1, stats.workers)
    out = {
        "rows_per_s": w["rows"] / wall if wall > 0 else 0.0,
        "MB_per_s": w["nbytes"] / wall / 1e6 if wall > 0 else 0.0,
        "wait_share": w["wait_s"] / wall if wall > 0 else 0.0,
        **{
            f"wait_{p}_ms": 1000 * w[f"wait_{p}_s"]
            for p in ("p50", "p95", "p99")
            if w[f"wait_{p}_s"] is not None
        },
        **{
            f"{k}_share": w[f"{k}_s"] / cap if cap > 0 else 0.0
            for k in ("read", "transform", "convert")
        },
        "storage_MB_per_s": w["io_bytes"] / wall / 1e6 if wall > 0 else 0.0,
        "batches": float(stats.batches),
    }
    if stats.cores_busy is not None:
        out["cores_busy"] = stats.cores_busy
    return {prefix + k: float(v) for k, v in out.items()}


@dataclass(frozen=True)
class Totals:
    """The sums a window needs, as :class:`Stats` holds them (which serves as well): read
    straight from a loader's recorder by :func:`totals_of`, without the verdict and the rest
    of ``stats()`` (half the cost of a write)."""

    batches: int
    rows: int
    nbytes: int
    wall_s: float
    wait_s: float
    step_s: float
    read_s: float
    transform_s: float
    convert_s: float
    io_bytes: int
    workers: int
    cores_busy: float | None
    wait_histogram: tuple[int, ...]


def totals_of(loader: Any) -> Totals | Stats:
    """A loader's sums so far: from its :class:`Recorder` when it has one (a ``Loader``), else
    its ``stats()``."""
    recorder = getattr(loader, "recorder", None)
    if not isinstance(recorder, Recorder):
        return loader.stats()  # type: ignore[no-any-return]
    c = recorder.total_counters()
    return Totals(
        int(c["batches"]),
        int(c["rows"]),
        int(c["nbytes"]),
        c["wall_s"],
        c["wait_s"],
        c["step_s"],
        c["read_s"],
        c["transform_s"],
        c["convert_s"],
        int(c["io_bytes"]),
        getattr(loader, "num_workers", 1),
        cores_busy(c),
        _histogram_of(c),
    )


_histogram_of = operator.itemgetter(*WAIT_KEYS)  # the counters' wait histogram, as a tuple


def window(stats: Stats | Totals, since: Stats | Totals | None = None) -> dict[str, Any]:
    """The sums of ``stats`` less those of ``since`` (seconds, rows, bytes), and the wait
    percentiles of the batches in between (from the difference of the wait histograms)."""
    keys = (
        "batches",
        "rows",
        "nbytes",
        "wall_s",
        "wait_s",
        "step_s",
        "read_s",
        "transform_s",
        "convert_s",
        "io_bytes",
    )
    w: dict[str, Any] = {k: getattr(stats, k) - (getattr(since, k) if since else 0) for k in keys}
    hist: Any = stats.wait_histogram
    if since is not None and since.wait_histogram:
        hist = list(map(operator.sub, hist, since.wait_histogram))
    w["wait_p50_s"], w["wait_p95_s"], w["wait_p99_s"] = (
        wait_percentiles(hist, (0.5, 0.95, 0.99)) if hist else (None, None, None)
    )
    return w


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
    :func:`log_every`. Re-iterable: each ``iter()`` is the loader's next epoch, ended as its
    last batch is handed out (so a loop that stops at ``len()`` without asking for more, as
    Lightning's does, gets the next epoch from the next ``iter()``); ``len()`` is the loader's;
    ``step`` counts the batches delivered through it."""

    def __init__(
        self, loader: Any, logger: Any, every: int, ranks: bool | None = None, step: int = 0
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
        self.loader, self.every, self.step = loader, every, step
        self._write = sink_of(logger) if logger is not None else None
        self._ranks = ranks
        self._since = None

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        it = iter(self.loader)
        left = len(it) if hasattr(it, "__len__") else -1
        try:
            for batch in it:  # the write, after a batch is delivered, is the loop's time
                self.step += 1
                if self.step % self.every == 0:
                    self.write()
                left -= 1
                if left == 0:  # end the epoch with its last batch: a consumer that stops at
                    next(it, None)  # len() (Lightning) then gets the next epoch from iter()
                yield batch
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                close()

    _since: Any

    def write(self) -> dict[str, float]:
        """Write the scalars of the batches since the last write now (a collective when ranks
        are gathered: every rank must call it, as iteration does at the same batches)."""
        stats = totals_of(self.loader)
        metrics = scalars(stats, self._since)
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
        if self._write is not None:
            self._write(metrics, self.step)
        return metrics


def log_every(
    loader: Any, logger: Any, every: int, ranks: bool | None = None, step: int = 0
) -> LoggedLoader:
    """Iterate ``loader`` and write its :func:`scalars` to ``logger`` every ``every`` batches.

    ``logger``: a TensorBoard ``SummaryWriter``, a W&B run (or the ``wandb`` module), a
    Lightning logger (``CSVLogger``, ``TensorBoardLogger``, ``WandbLogger``, ...), a function
    ``fn(metrics, step)``, or ``None`` (compute, write nowhere: the other ranks' part when only
    rank 0 logs). ``step`` is the first step number (batches delivered before, e.g. after a
    resume); each write is at the number of batches delivered. With a ``torch.distributed``
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


# --- Prometheus -----------------------------------------------------------------------------


class LoaderCollector:
    """A ``prometheus_client`` collector of loaders' stats (``collect()`` runs when scraped).

    Metrics, labelled ``loader`` (the name given) and ``rank``: ``lanceloader_batches_total``,
    ``_rows_total``, ``_bytes_total`` (delivered, Arrow bytes), ``_rows_read_total``,
    ``_rows_skipped_total``, ``_rows_cached_total``, ``_cache_damaged_total``, ``_storage_bytes_total``,
    ``_storage_requests_total``, ``_worker_seconds_total{stage}``,
    ``_loop_seconds_total{state="waiting"|"working"}``, gauges ``_epochs``, ``_workers``,
    ``_reads_in_flight``, ``_cores_busy_ratio`` (when measured),
    ``_batch_wait_seconds`` (a histogram of the loop's wait per batch) and
    ``_batch_wait_quantile_seconds{quantile}`` (p50/p95/p99), and
    ``lanceloader_bottleneck_info{stage}``.
    """

    def __init__(self, loaders: Mapping[str, Any]) -> None:
        self.loaders = dict(loaders)

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
            InfoMetricFamily,
        )

        labels = ["loader", "rank"]

        def family(kind: Any, name: str, doc: str, extra: tuple[str, ...] = ()) -> Any:
            return kind(f"lanceloader_{name}", doc, labels=[*labels, *extra])

        counters = {
            "batches": ("batches", "Batches handed to the training loop"),
            "rows": ("rows", "Rows handed to the training loop"),
            "bytes": ("nbytes", "Arrow bytes of the rows handed to the training loop"),
            "rows_read": ("rows_read", "Rows read from the dataset"),
            "rows_skipped": ("rows_skipped", "Rows a transform skipped (on_error='skip')"),
            "rows_cached": ("rows_cached", "Rows read from the loader's cache"),
            "cache_damaged": ("cache_damaged", "Cache files that failed their check (read again)"),
            "storage_bytes": ("io_bytes", "Bytes Lance read from storage"),
            "storage_requests": ("io_iops", "Lance's storage I/O operations"),
        }
        made = {k: family(CounterMetricFamily, k, doc) for k, (_, doc) in counters.items()}
        stage = family(
            CounterMetricFamily,
            "worker_seconds",
            "Seconds the workers spent per stage, summed over workers",
            ("stage",),
        )
        loop = family(
            CounterMetricFamily,
            "loop_seconds",
            "Seconds the training loop spent waiting for a batch or working",
            ("state",),
        )
        gauges = {
            "epochs": family(GaugeMetricFamily, "epochs", "Epochs (iterations) started"),
            "workers": family(GaugeMetricFamily, "workers", "Workers of the loader"),
            "reads_in_flight": family(
                GaugeMetricFamily, "reads_in_flight", "Reads in flight, on average"
            ),
            "cores_busy": family(
                GaugeMetricFamily,
                "cores_busy_ratio",
                "Share of the usable cores' time busy (any process)",
            ),
        }
        hist = family(
            HistogramMetricFamily, "batch_wait_seconds", "The training loop's wait per batch"
        )
        quant = family(
            GaugeMetricFamily,
            "batch_wait_quantile_seconds",
            "Quantiles of the training loop's wait per batch",
            ("quantile",),
        )
        info = InfoMetricFamily("lanceloader_bottleneck", "The stats' verdict", labels=labels)
        for name, loader in self.loaders.items():
            s: Stats = loader.stats()
            at = [name, str(getattr(loader, "rank", 0))]
            for k, (field, _) in counters.items():
                made[k].add_metric(at, float(getattr(s, field)))
            for k in ("read", "transform", "convert"):
                stage.add_metric([*at, k], getattr(s, f"{k}_s"))
            loop.add_metric([*at, "waiting"], s.wait_s)
            loop.add_metric([*at, "working"], s.step_s)
            gauges["epochs"].add_metric(at, s.epochs)
            gauges["workers"].add_metric(at, s.workers)
            gauges["reads_in_flight"].add_metric(at, s.queue_depth_mean)
            if s.cores_busy is not None:
                gauges["cores_busy"].add_metric(at, s.cores_busy)
            hist.add_metric(at, buckets=prometheus_buckets(s.wait_histogram), sum_value=s.wait_s)
            for q, value in ((0.5, s.wait_p50_s), (0.95, s.wait_p95_s), (0.99, s.wait_p99_s)):
                if value is not None:
                    quant.add_metric([*at, str(q)], value)
            info.add_metric(at, {"stage": s.bottleneck.stage})
        yield from (*made.values(), stage, loop, *gauges.values(), hist, quant, info)


def prometheus_buckets(histogram: tuple[int, ...]) -> list[tuple[str, float]]:
    """Cumulative ``(le, count)`` pairs of a stats wait histogram at ``PROMETHEUS_BUCKETS``.

    >>> from lanceloader.engine.stats import WAIT_KEYS, wait_bucket
    >>> h = [0] * len(WAIT_KEYS); h[wait_bucket(0.002)] += 1; h[wait_bucket(5.0)] += 1
    >>> [b for b in prometheus_buckets(tuple(h)) if b[0] in ("0.001", "0.00316228", "10", "+Inf")]
    [('0.001', 0.0), ('0.00316228', 1.0), ('10', 2.0), ('+Inf', 2.0)]
    """
    counts = list(histogram) or [0] * (len(WAIT_EDGES) + 1)
    out, seen, done = [], 0, 0
    for i in PROMETHEUS_BUCKETS:
        seen += sum(counts[done : i + 1])
        done = i + 1
        out.append((f"{WAIT_EDGES[i]:.6g}", float(seen)))
    out.append(("+Inf", float(sum(counts))))
    return out


def prometheus(loaders: Any, registry: Any = None, name: str = "train") -> LoaderCollector:
    """Register a collector of ``loaders``' stats with ``registry`` (default:
    ``prometheus_client``'s global ``REGISTRY``) and return it; serve it with
    ``prometheus_client.start_http_server(port)`` or push it with ``push_to_gateway``.

    ``loaders``: one loader (labelled ``loader=name``) or a dict ``{name: loader}`` (e.g.
    ``{"train": train, "val": val}``: one collector, since a registry refuses the same metric
    names twice). Remove it with ``registry.unregister(collector)``.
    """
    from prometheus_client import REGISTRY

    as_dict = dict(loaders) if isinstance(loaders, Mapping) else {name: loaders}
    for key, loader in as_dict.items():
        if not callable(getattr(loader, "stats", None)):
            raise TypeError(
                f"prometheus: {key!r} is a {type(loader).__name__}, not a "
                "lanceloader Loader (anything with stats())"
            )
    collector = LoaderCollector(as_dict)
    (registry if registry is not None else REGISTRY).register(collector)
    return collector


# --- across ranks ---------------------------------------------------------------------------


@dataclass(frozen=True)
class RankWait:
    """One rank's wait for data, over a window (see :func:`across_ranks`)."""

    rank: int
    batches: int
    wall_s: float
    wait_s: float
    wait_p50_s: float | None
    wait_p95_s: float | None
    wait_p99_s: float | None

    @property
    def wait_share(self) -> float:
        return self.wait_s / self.wall_s if self.wall_s > 0 else 0.0


@dataclass(frozen=True)
class RankWaits:
    """Every rank's :class:`RankWait`, in rank order; ``slowest`` waited longest for data (in a
    synchronous step, the rank the others wait for)."""

    ranks: tuple[RankWait, ...]

    @property
    def slowest(self) -> RankWait:
        return max(self.ranks, key=lambda r: (r.wait_s, r.wait_p99_s or 0.0, -r.rank))


_gloo_groups: dict[int, Any] = {}


def across_ranks(stats: Any, since: Stats | None = None, group: Any = None) -> RankWaits:
    """Gather every rank's wait per batch (``stats``: a loader or its ``stats()``; ``since``:
    an earlier ``stats()``, for a window) and return them all, with the slowest.

    A collective: every rank of the group must call it. Without an initialized
    ``torch.distributed`` process group it returns this process alone. The gather runs on a
    gloo group (CPU, whatever the training's backend): ``group`` if given, else the default
    group when it is gloo, else one gloo group made once over all ranks (``new_group``, also
    a collective).
    """
    if callable(getattr(stats, "stats", None)):
        stats = stats.stats()
    w = window(stats, since)
    rank = 0
    dist = _distributed()
    if dist is not None:
        rank = dist.get_rank()
    mine = RankWait(
        rank,
        int(w["batches"]),
        w["wall_s"],
        w["wait_s"],
        w["wait_p50_s"],
        w["wait_p95_s"],
        w["wait_p99_s"],
    )
    if dist is None:
        return RankWaits((mine,))
    group = group if group is not None else _gloo_group(dist)
    gathered: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, asdict(mine), group=group)
    return RankWaits(tuple(sorted((RankWait(**g) for g in gathered), key=lambda r: r.rank)))


def _distributed() -> Any:
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    return dist if dist.is_available() and dist.is_initialized() else None


def _world() -> int:
    dist = _distributed()
    return dist.get_world_size() if dist is not None else 1


def _gloo_group(dist: Any) -> Any:
    if dist.get_backend() == "gloo":
        return None  # the default group
    key = id(dist.group.WORLD)  # one gloo group per default group
    if key not in _gloo_groups:
        _gloo_groups[key] = dist.new_group(backend="gloo")
    return _gloo_groups[key]
