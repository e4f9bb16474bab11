"""Grain pipelines for JAX: ``import lanceloader.grain`` (this module imports Grain;
``lanceloader`` does not). Everything lives in :mod:`lanceloader.integrations.grain`.

``DataSource`` is a Grain ``RandomAccessDataSource`` of Lance rows (Grain's shuffle, batch and
checkpoint); ``IterDataset`` is a ``grain.IterDataset`` of a Loader's batches whose iterator's
state is the Loader's.

>>> import tempfile, grain
>>> from lanceloader.demo import write_demo_dataset
>>> from lanceloader.grain import DataSource
>>> uri = write_demo_dataset(tempfile.mkdtemp() + "/demo.lance", rows=6)
>>> ds = grain.MapDataset.source(DataSource(uri, columns=["id"])).batch(4)
>>> [b["id"].tolist() for b in ds]
[[0, 1, 2, 3], [4, 5]]
"""

from __future__ import annotations

from lanceloader.integrations.grain import DatasetIterator, DataSource, IterDataset

__all__ = ["DataSource", "DatasetIterator", "IterDataset"]
