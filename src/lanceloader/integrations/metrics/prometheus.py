"""Loaders' stats for Prometheus: a ``prometheus_client`` collector, computed when scraped.

:func:`prometheus` registers one :class:`LoaderCollector` (of one loader or a dict of them) with
a registry, once: the collector's ``describe()`` names every series it exposes, so a second
registration of the same series is refused (two collectors would expose every sample twice,
which a Prometheus server rejects at scrape).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from lanceloader.engine.stats import Stats
from lanceloader.engine.waits import WAIT_EDGES
from lanceloader.integrations.metrics.scalars import mix_scalars

# The Prometheus histogram's bucket bounds: every half decade of the stats' own buckets, from
# 10 µs to 1,000 s (exact counts: each bound is one of the stats' bucket edges).
PROMETHEUS_BUCKETS = tuple(
    i for i in range(0, len(WAIT_EDGES), 5) if 1e-5 * 0.999 <= WAIT_EDGES[i] <= 1e3 * 1.001
)
# Counter name -> (Stats field, help text).
COUNTERS = {
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
LABELS = ("loader", "rank")


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
    ``lanceloader_bottleneck_info{stage}``; a mix's ``lanceloader_mix_weight{source}``,
    ``_mix_share{source}``, ``_mix_rows{source}`` and ``_mix_tokens{source}`` (where known).
    """

    def __init__(self, loaders: Mapping[str, Any]) -> None:
        self.loaders = dict(loaders)

    def describe(self) -> list[Any]:
        """Every family this collector exposes, without samples: a registry checks their names
        when the collector is registered (and refuses names it already has)."""
        return list(families().values())

    def collect(self) -> Iterator[Any]:
        """The families, with one sample set per loader (its ``stats()`` now)."""
        made = families()
        for name, loader in self.loaders.items():
            add_samples(made, [name, str(getattr(loader, "rank", 0))], loader.stats())
        yield from made.values()


# A mix's per-source gauges (integrations/metrics/scalars.py mix_scalars), labelled source.
MIX_GAUGES = {
    "mix_weight": "A mix source's target share of samples now (as the interleave uses it)",
    "mix_share": "A mix source's share of the samples delivered in the current piece of weights",
    "mix_rows": "Rows a mix source delivered since the loader began (or loaded a state)",
    "mix_tokens": "Tokens a mix source delivered since the loader began, where known",
}


def families() -> dict[str, Any]:
    """The empty metric families of :class:`LoaderCollector`, by short name."""
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
        InfoMetricFamily,
    )

    def family(kind: Any, name: str, doc: str, extra: tuple[str, ...] = ()) -> Any:
        return kind(f"lanceloader_{name}", doc, labels=[*LABELS, *extra])

    out = {k: family(CounterMetricFamily, k, doc) for k, (_, doc) in COUNTERS.items()}
    out["worker_seconds"] = family(
        CounterMetricFamily,
        "worker_seconds",
        "Seconds the workers spent per stage, summed over workers",
        ("stage",),
    )
    out["loop_seconds"] = family(
        CounterMetricFamily,
        "loop_seconds",
        "Seconds the training loop spent waiting for a batch or working",
        ("state",),
    )
    out["epochs"] = family(GaugeMetricFamily, "epochs", "Epochs (iterations) started")
    out["workers"] = family(GaugeMetricFamily, "workers", "Workers of the loader")
    out["reads_in_flight"] = family(
        GaugeMetricFamily, "reads_in_flight", "Reads in flight, on average"
    )
    out["cores_busy"] = family(
        GaugeMetricFamily, "cores_busy_ratio", "Share of the usable cores' time busy (any process)"
    )
    out["wait"] = family(
        HistogramMetricFamily, "batch_wait_seconds", "The training loop's wait per batch"
    )
    out["wait_quantile"] = family(
        GaugeMetricFamily,
        "batch_wait_quantile_seconds",
        "Quantiles of the training loop's wait per batch",
        ("quantile",),
    )
    out["bottleneck"] = InfoMetricFamily(
        "lanceloader_bottleneck", "The stats' verdict", labels=list(LABELS)
    )
    for key, doc in MIX_GAUGES.items():
        out[key] = family(GaugeMetricFamily, key, doc, ("source",))
    return out


def add_samples(made: dict[str, Any], at: list[str], s: Stats) -> None:
    """One loader's samples (labels ``at``) into the families of :func:`families`."""
    for k, (field, _) in COUNTERS.items():
        made[k].add_metric(at, float(getattr(s, field)))
    for k in ("read", "decode", "transform", "convert"):
        made["worker_seconds"].add_metric([*at, k], getattr(s, f"{k}_s"))
    made["loop_seconds"].add_metric([*at, "waiting"], s.wait_s)
    made["loop_seconds"].add_metric([*at, "working"], s.step_s)
    made["epochs"].add_metric(at, s.epochs)
    made["workers"].add_metric(at, s.workers)
    made["reads_in_flight"].add_metric(at, s.queue_depth_mean)
    if s.cores_busy is not None:
        made["cores_busy"].add_metric(at, s.cores_busy)
    made["wait"].add_metric(at, buckets=prometheus_buckets(s.wait_histogram), sum_value=s.wait_s)
    for q, value in ((0.5, s.wait_p50_s), (0.95, s.wait_p95_s), (0.99, s.wait_p99_s)):
        if value is not None:
            made["wait_quantile"].add_metric([*at, str(q)], value)
    made["bottleneck"].add_metric(at, {"stage": s.bottleneck.stage})
    for key, value in mix_scalars(s.mix, prefix="").items():  # mix/<source>/<what>
        _, source, what = key.split("/")
        made[f"mix_{what}"].add_metric([*at, source], value)


def prometheus_buckets(histogram: tuple[int, ...]) -> list[tuple[str, float]]:
    """Cumulative ``(le, count)`` pairs of a stats wait histogram at ``PROMETHEUS_BUCKETS``.

    >>> from lanceloader.engine.waits import WAIT_KEYS, wait_bucket
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
    ``{"train": train, "val": val}``): one collector per registry. A second call with the same
    registry raises ``ValueError`` (its series would be exposed twice, and Prometheus rejects
    duplicate samples at scrape): register every loader in one call, or remove the first
    collector with ``registry.unregister(collector)`` before registering another.
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
    target = registry if registry is not None else REGISTRY
    try:
        target.register(collector)
    except ValueError as exc:  # prometheus_client: "Duplicated timeseries in CollectorRegistry"
        raise ValueError(
            f"prometheus: this registry already exposes lanceloader's series (an earlier "
            f"metrics.prometheus call registered them), so loaders {sorted(as_dict)} would be "
            "exposed twice. Register every loader in one call, prometheus({'train': train, "
            "'val': val}, registry=...), or remove the earlier collector first with "
            "registry.unregister(collector)"
        ) from exc
    return collector
