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

Modules: ``scalars.py`` (the numbers: :func:`scalars`, windows of the recorder's sums),
``logged.py`` (:func:`log_every` and the loggers it writes to), ``prometheus.py`` (the
collector), ``ranks.py`` (:func:`across_ranks`).

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
    >>> for batch in metrics.log_every(loader, lambda m, step: seen.append(step), every=4):
    ...     pass                                             # the next epoch: steps go on
    >>> seen, loader.epoch
    ([4, 8, 12, 16, 20], 2)
    >>> scalars(loader.stats())["lanceloader/batches"]
    20.0
"""

from __future__ import annotations

from lanceloader.integrations.metrics.logged import LoggedLoader, log_every, sink_of
from lanceloader.integrations.metrics.prometheus import (
    PROMETHEUS_BUCKETS,
    LoaderCollector,
    prometheus,
    prometheus_buckets,
)
from lanceloader.integrations.metrics.ranks import RankWait, RankWaits, across_ranks
from lanceloader.integrations.metrics.scalars import PREFIX, Totals, scalars, totals_of, window

__all__ = [
    "PREFIX",
    "PROMETHEUS_BUCKETS",
    "LoaderCollector",
    "LoggedLoader",
    "RankWait",
    "RankWaits",
    "Totals",
    "across_ranks",
    "log_every",
    "prometheus",
    "prometheus_buckets",
    "scalars",
    "sink_of",
    "totals_of",
    "window",
]
