"""PyTorch datasets and samplers: thin skins over Source, Order, Plan and the Loader.

=======================  ==========================================================================
``MapDataset``           map-style dataset over a pinned :class:`~lanceloader.rows.lance.source.Source`;
                         ``__getitems__`` reads a whole batch with one coalesced Lance call
``collate``              a ``collate_fn`` that hands back ``MapDataset``'s already-batched columns
``Sampler``              indices in our orders (sequential, block or full shuffle), one rank's share
``BatchSampler``         lists of indices: exactly the batches a ``Loader`` with the same settings
                         delivers on this rank
``IterableDataset``      whole batches from the Loader pipeline, split across DataLoader workers
=======================  ==========================================================================

Nothing here orders, shards or checkpoints by itself: orders come from :class:`Order`, rank
slices from :class:`Plan`, reads from :class:`BatchWork`, states use the Loader's format
(``state.py``), so a ``BatchSampler`` state and a ``Loader`` state with the same settings are
interchangeable. ``MapDataset`` reads the batches a ``BatchSampler`` will ask for next ahead, many
per Lance call, and serves one only if it is exactly what was asked for.

Samplers and ``IterableDataset`` implement ``state_dict()``/``load_state_dict()``, which torchdata's
``StatefulDataLoader`` calls; its ``state_dict()`` then resumes at the exact batch, prefetched
batches included (they are delivered again after the resume, never lost).

Processes: the datasets pickle as plain parameters and reopen Lance in each DataLoader worker,
whatever the start method. Building one opens Lance (to pin the version and count rows), and a
``fork`` of a process that has used Lance must not call Lance itself (``docs/fork-safety.md``):
workers started with ``fork`` (Linux's default) then read through a clean helper process each
(:mod:`lanceloader.lifecycle.forksafe`; about a second to start, with a warning). Prefer
``multiprocessing_context="forkserver"``, with ``persistent_workers=True``.

Modules: ``map.py`` (``MapDataset`` and its read-ahead), ``collation.py`` (``Rows``, ``collate``,
``pack_for_transfer``), ``samplers.py`` (``Sampler``, ``BatchSampler``) and ``iterable.py``
(``IterableDataset``); everything public is re-exported here.

Example::

    >>> import tempfile, torch
    >>> from lanceloader.demo import write_demo_dataset
    >>> uri = write_demo_dataset(tempfile.mkdtemp() + "/demo.lance", rows=100, fragments=2)
    >>> ds = MapDataset(uri, columns=["id", "x"])
    >>> batches = BatchSampler(ds, batch_size=32, shuffle=True, seed=0)
    >>> loader = torch.utils.data.DataLoader(ds, batch_sampler=batches, collate_fn=collate)
    >>> [tuple(b["x"].shape) for b in loader]
    [(32, 64), (32, 64), (32, 64), (4, 64)]
"""

from __future__ import annotations

from lanceloader.integrations.torch.collation import Rows, collate
from lanceloader.integrations.torch.collation import pack_for_transfer as pack_for_transfer
from lanceloader.integrations.torch.collation import split_rows as split_rows
from lanceloader.integrations.torch.iterable import IterableDataset
from lanceloader.integrations.torch.map import BatchIndices as BatchIndices
from lanceloader.integrations.torch.map import MapDataset
from lanceloader.integrations.torch.samplers import BatchSampler, Sampler

__all__ = ["BatchSampler", "IterableDataset", "MapDataset", "Rows", "Sampler", "collate"]
