"""A loader's ``stats()`` on a dashboard (public face of :mod:`lanceloader.integrations.metrics`).

* :func:`prometheus`: a ``prometheus_client`` collector, scraped or pushed.
* :func:`log_every`: iterate a loader and write :func:`scalars` every N batches to TensorBoard,
  Weights & Biases, a Lightning logger or a function.
* :func:`across_ranks`: every rank's wait per batch, and the slowest rank (gloo).

Importing it imports neither ``prometheus_client`` nor torch; they are imported when used.

>>> import lanceloader.metrics as metrics
>>> from lanceloader.engine.stats import Recorder
>>> sorted(metrics.scalars(Recorder().snapshot()))[:2]
['lanceloader/MB_per_s', 'lanceloader/batches']
"""

from lanceloader.integrations.metrics import (
    LoaderCollector,
    LoggedLoader,
    RankWait,
    RankWaits,
    across_ranks,
    log_every,
    prometheus,
    scalars,
)

__all__ = [
    "LoaderCollector",
    "LoggedLoader",
    "RankWait",
    "RankWaits",
    "across_ranks",
    "log_every",
    "prometheus",
    "scalars",
]
