"""PyTorch integration: ``import lanceloader.torch`` (this module imports torch; ``lanceloader``
does not). Everything lives in :mod:`lanceloader.integrations.torch`.

>>> from lanceloader.torch import BatchSampler
>>> list(BatchSampler(5, batch_size=2))
[[0, 1], [2, 3], [4]]
"""

from __future__ import annotations

from lanceloader.integrations.torch import (
    BatchSampler,
    IterableDataset,
    MapDataset,
    Rows,
    Sampler,
    collate,
)

__all__ = ["BatchSampler", "IterableDataset", "MapDataset", "Rows", "Sampler", "collate"]
