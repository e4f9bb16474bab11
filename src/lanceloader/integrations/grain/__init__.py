"""Grain (JAX) integration: Lance rows as a Grain data source, and a Loader as a Grain dataset.

=======================  ==========================================================================
``DataSource``           Grain's ``RandomAccessDataSource`` over pinned Lance rows (filter, split,
                         cache, columns): ``grain.MapDataset.source(DataSource(uri))``, then
                         Grain's own ``shuffle``, ``batch``, ``mp_prefetch``; Grain's checkpoint
                         (indices) resumes it, as the rows are pinned to one version
``IterDataset``          a ``grain.IterDataset`` of a :class:`~lanceloader.Loader`'s batches (our
                         orders, reads of many batches per Lance call), across epochs; its
                         iterator's ``get_state()`` is the Loader's state, checked on
                         ``set_state()`` (another dataset, version or order is refused)
``DatasetIterator``      the ``grain.DatasetIterator`` an ``IterDataset`` makes
=======================  ==========================================================================

What runs where: both pickle as plain parameters (a URI, a version, a row list) and reopen Lance
lazily in each process, so Grain's ``mp_prefetch`` workers (started with ``spawn``) read by
themselves. ``mp_prefetch(num_workers=N)`` over an ``IterDataset`` gives worker ``w`` the batches
``w, w + N, w + 2N, ...`` of the stream (across epochs) and Grain takes one element from each
worker in turn, so the pipeline yields exactly the Loader's batches in the Loader's order when
every operation between the ``IterDataset`` and ``mp_prefetch`` gives one element per batch
(``map``); a ``filter`` there changes the order (put it after ``mp_prefetch``).

States (JSON-safe, what Grain's ``CheckpointHandler`` and Orbax save): without ``mp_prefetch`` an
iterator's state is a plain Loader state (format 2) at the next batch, which a ``Loader``, a
torch ``IterableDataset`` or another pipeline on any number of ranks resumes. Under
``mp_prefetch(num_workers=N)`` Grain keeps one state per worker: a Loader state at the point the
pipeline started (or was restored), plus ``"grain": {"worker", "workers", "delivered"}`` (the
batches that worker has handed on); it resumes exactly in a pipeline with any ``num_workers``
(``elastic.py``: a state of another layout starts every worker at the pipeline's next batch),
and ``IterDataset.loader_state(state)`` turns it into the Loader state there.

Modules: ``source.py`` (``DataSource``), ``dataset.py`` (``IterDataset`` and its iterator),
``states.py`` (a pipeline's state read back), ``elastic.py`` (its restore into another number of
workers), ``processes.py`` (what ``mp_prefetch`` needs of
the main process: Grain's absl flags, shared memory unlinked at exit); ``lanceloader.grain`` is
the public face. Example::

    >>> import tempfile, grain
    >>> from lanceloader.demo import write_demo_dataset
    >>> uri = write_demo_dataset(tempfile.mkdtemp() + "/demo.lance", rows=10, fragments=2)
    >>> ds = grain.MapDataset.source(DataSource(uri, columns=["id"], filter="id >= 2"))
    >>> [b["id"].tolist() for b in ds.batch(4)]
    [[2, 3, 4, 5], [6, 7, 8, 9]]
    >>> it = iter(IterDataset(uri, batch_size=4, columns=["id"], num_epochs=2))
    >>> next(it)["id"].tolist(), it.get_state()["sample"]
    ([0, 1, 2, 3], 4)
"""

from __future__ import annotations

from lanceloader.integrations.grain.dataset import DatasetIterator, IterDataset, stream_place
from lanceloader.integrations.grain.source import DataSource, row_conversion, split_rows

__all__ = [
    "DataSource",
    "DatasetIterator",
    "IterDataset",
    "row_conversion",
    "split_rows",
    "stream_place",
]
