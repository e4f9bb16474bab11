"""``Sampler`` and ``BatchSampler``: dataset indices of one rank in our orders, the batches a
``Loader`` with the same settings delivers, with ``state_dict()`` in the Loader's format.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
import torch.utils.data

from lanceloader.arguments import check_bool, check_int, check_numbers
from lanceloader.distributed import resolve_rank_world
from lanceloader.integrations.torch.map import BatchIndices, MapDataset
from lanceloader.loader import Loader
from lanceloader.ordering.order import Order
from lanceloader.ordering.plan import Plan
from lanceloader.rows.lance.source import Source
from lanceloader.state.cursor import Cursor
from lanceloader.state.format import StreamSpec, order_settings

# Samplers compute the order this many samples at a time (one vectorised Order call).
_SAMPLES_PER_STEP = 16_384


def _describe(data_source_or_len: Any) -> tuple[int, Source | None]:
    """Row count and (for a MapDataset) the source that the state names."""
    if isinstance(data_source_or_len, MapDataset):
        return len(data_source_or_len), data_source_or_len.source
    if isinstance(data_source_or_len, (torch.utils.data.IterableDataset, Loader)):
        raise TypeError(
            f"samplers index map-style datasets; {type(data_source_or_len).__name__} delivers "
            "whole batches itself: pass a MapDataset or its number of rows"
        )
    if isinstance(data_source_or_len, bool):
        raise TypeError("data_source_or_len must be a dataset or an int, got a bool")
    if isinstance(data_source_or_len, int):
        check_int("data_source_or_len", data_source_or_len, minimum=0)
        return data_source_or_len, None
    if hasattr(data_source_or_len, "__len__"):
        return len(data_source_or_len), None
    raise TypeError(
        "data_source_or_len must be a MapDataset, a sized dataset or a number of rows, got "
        f"{type(data_source_or_len).__name__}"
    )


class _PlanSampler(torch.utils.data.Sampler):  # type: ignore[type-arg]
    """Batches of dataset indices for one rank: ``Order.positions`` of ``Plan`` batches."""

    def __init__(
        self,
        data_source_or_len: Any,
        *,
        batch_size: int,
        shuffle: bool,
        shuffle_block_size: int,
        shuffle_window: int | None,
        seed: int,
        rank: int | None,
        world_size: int | None,
        drop_last: bool,
    ) -> None:
        check_numbers(
            batch_size=batch_size,
            shuffle_block_size=shuffle_block_size,
            seed=seed,
            shuffle_window=shuffle_window,
        )
        check_bool("shuffle", shuffle)
        check_bool("drop_last", drop_last)
        self.num_rows, source = _describe(data_source_or_len)
        rank, world_size = resolve_rank_world(rank, world_size)
        self.order = Order.from_options(
            self.num_rows, shuffle, shuffle_block_size, shuffle_window, seed
        )
        self._cursor = Cursor(
            StreamSpec(
                num_rows=self.num_rows,
                order=order_settings(source, self.order, self.num_rows),
                batch_size=batch_size,
                world_size=world_size,
                rank=rank,
                drop_last=bool(drop_last),
                uri=source.dataset_name.uri if source else None,
                version=source.dataset_name.version if source else None,
                dataset=source.dataset_name.identity if source else None,
            )
        )
        # torch makes iterators it never advances (a DataLoader calls iter(sampler) twice when
        # it starts), so the newest iterator moves the cursor (``_token``) and replaces the
        # previous one at the same place unless that one was advanced (``_consumed``), in which
        # case it starts the next epoch. ``_fresh``: the next iteration continues exactly at the
        # cursor (after construction, set_epoch, load_state_dict, or the end of an epoch).
        self._fresh, self._consumed, self._token = True, False, 0

    @property
    def rank(self) -> int:
        return self._cursor.spec.rank

    @property
    def world_size(self) -> int:
        return self._cursor.spec.world_size

    @property
    def batch_size(self) -> int:
        return self._cursor.spec.batch_size

    @property
    def drop_last(self) -> bool:
        return self._cursor.spec.drop_last

    def plan(self, start: int = 0) -> Plan:
        """This rank's plan for an epoch that starts at global sample ``start``."""
        return self._cursor.spec.plan(start)

    @property
    def _moves_on(self) -> bool:
        """Whether the next iteration starts the next epoch (the previous one was advanced)."""
        return not self._fresh and self._consumed

    @property
    def epoch(self) -> int:
        """The epoch the next iteration delivers."""
        return self._cursor.epoch + 1 if self._moves_on else self._cursor.epoch

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration deliver ``epoch`` from its start."""
        check_int("epoch", epoch, minimum=0)
        self._cursor.seek(epoch)
        self._fresh = True

    def _units(self) -> int:
        """Batches the next iteration yields (fewer when resuming mid-epoch)."""
        return len(self.plan()) if self._moves_on else self._cursor.remaining

    def _batches(self) -> Iterator[Any]:
        c = self._cursor
        if self._moves_on:
            c.end_epoch()
        c.rebase()
        self._fresh, self._consumed, self._token = False, False, self._token + 1
        return self._run(self._token, c.epoch, c.plan)

    def _run(self, token: int, epoch: int, plan: Plan) -> Iterator[Any]:
        c = self._cursor
        if self._token == token:
            self._consumed = True
        step = max(1, _SAMPLES_PER_STEP // self.batch_size)
        try:
            for lo in range(0, len(plan), step):
                batches = range(lo, min(lo + step, len(plan)))
                samples, sizes = plan.samples(batches)
                positions = self.order.positions(epoch, samples)
                offset = 0
                for b, size in zip(batches, sizes, strict=True):
                    if self._token == token:  # count it before handing it out: torchdata
                        c.advance()  # snapshots then
                    yield self._wrap(positions[offset : offset + size], plan, epoch, b)
                    offset += size
        finally:  # finished, or broken out of (torch's rule: the rest of that epoch is dropped):
            if self._token == token:  # a state taken now points at the next epoch
                c.end_epoch()
                self._fresh = True

    def state_dict(self) -> dict[str, Any]:
        """Where the sampler is, in the Loader's state format (JSON-safe, ``format`` 2).

        ``sample`` counts global samples of ``epoch`` handed out by all ranks together, so the
        state resumes on any number of ranks. Inside a ``DataLoader`` with workers the sampler
        runs ahead of the training loop: save ``StatefulDataLoader.state_dict()`` instead, which
        snapshots this at the batch the loop has reached.
        """
        return self._cursor.state_dict()

    def load_state_dict(self, state: dict[str, Any], allow_changes: tuple[str, ...] = ()) -> None:
        """Continue at the state's epoch and sample: the next iteration starts there.

        Takes states of any sampler or ``Loader`` with the same order settings, from any number
        of ranks; ``allow_changes`` may name ``"batch_size"``, ``"drop_last"`` and ``"uri"``
        (``columns`` never matter to a sampler). A sampler built from a length does not check
        the dataset.
        """
        self._cursor.load_state_dict(state, allow_changes)
        self._fresh = True

    def _describe_settings(self) -> str:
        return (
            f"rows={self.num_rows}, order={self.order}, rank={self.rank}/{self.world_size}, "
            f"drop_last={self.drop_last}"
        )

    def _wrap(self, positions: np.ndarray, plan: Plan, epoch: int, batch: int) -> Any:
        raise NotImplementedError


class Sampler(_PlanSampler):
    """Dataset indices of one rank, in our orders, one epoch per iteration.

    Orders: sequential (``shuffle=False``), full shuffle (``shuffle_block_size=1``) or block
    shuffle (``shuffle_block_size`` contiguous rows stay together, ``shuffle_window`` blocks are
    mixed), each epoch differently. Rank ``r`` of ``world_size`` takes every ``world_size``-th
    sample (as ``DistributedSampler``: every rank gets the same count; the tail wraps around
    unless ``drop_last``); default ranks are detected as for ``Loader``.

    The epoch advances by itself with each iteration that was started (``set_epoch`` overrides).
    ``state_dict()``/``load_state_dict()`` resume mid-epoch in O(1), on any number of ranks.

    Args:
        data_source_or_len: a :class:`MapDataset` (its state then names the dataset), any sized
            dataset, or a number of rows.

    >>> list(Sampler(6))
    [0, 1, 2, 3, 4, 5]
    >>> sampler = Sampler(6, shuffle=True, seed=1, rank=0, world_size=2)
    >>> other = Sampler(6, shuffle=True, seed=1, rank=1, world_size=2)
    >>> len(sampler), sorted(list(sampler) + list(other))
    (3, [0, 1, 2, 3, 4, 5])
    """

    def __init__(
        self,
        data_source_or_len: Any,
        *,
        shuffle: bool = False,
        shuffle_block_size: int = 1,
        shuffle_window: int | None = None,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = False,
    ) -> None:
        super().__init__(
            data_source_or_len,
            batch_size=1,
            shuffle=shuffle,
            shuffle_block_size=shuffle_block_size,
            shuffle_window=shuffle_window,
            seed=seed,
            rank=rank,
            world_size=world_size,
            drop_last=drop_last,
        )

    def __iter__(self) -> Iterator[int]:
        return self._batches()

    def _wrap(self, positions: np.ndarray, plan: Plan, epoch: int, batch: int) -> int:
        return int(positions[0])

    def __len__(self) -> int:
        """Indices the next iteration yields (fewer when resuming mid-epoch)."""
        return self._units()

    def __repr__(self) -> str:
        return f"Sampler({self._describe_settings()})"


class BatchSampler(_PlanSampler):
    """Lists of dataset indices: this rank's batches, exactly as ``Loader`` cuts them.

    Each global batch of ``batch_size * world_size`` samples of the epoch's order is split by
    rank (:class:`~lanceloader.ordering.plan.Plan`), so every rank gets the same number of batches and a
    ``Loader`` with the same settings delivers the same rows. Use it as the DataLoader's
    ``batch_sampler`` with a :class:`MapDataset`: one Lance read per batch. Same arguments as
    :class:`Sampler`, plus ``batch_size``; the same epoch and state behaviour.

    >>> [b for b in BatchSampler(10, batch_size=4)]
    [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    >>> [b for b in BatchSampler(10, batch_size=2, rank=1, world_size=2, drop_last=True)]
    [[2, 3], [6, 7]]
    >>> sampler = BatchSampler(10, batch_size=4, shuffle=True, seed=3)
    >>> it = iter(sampler); first = next(it)
    >>> state = sampler.state_dict(); state["epoch"], state["sample"]
    (0, 4)
    >>> resumed = BatchSampler(10, batch_size=4, shuffle=True, seed=3)
    >>> resumed.load_state_dict(state)
    >>> list(resumed) == list(it)
    True
    """

    def __init__(
        self,
        data_source_or_len: Any,
        *,
        batch_size: int,
        shuffle: bool = False,
        shuffle_block_size: int = 1,
        shuffle_window: int | None = None,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = False,
    ) -> None:
        super().__init__(
            data_source_or_len,
            batch_size=batch_size,
            shuffle=shuffle,
            shuffle_block_size=shuffle_block_size,
            shuffle_window=shuffle_window,
            seed=seed,
            rank=rank,
            world_size=world_size,
            drop_last=drop_last,
        )

    def __iter__(self) -> Iterator[BatchIndices]:
        return self._batches()

    def _wrap(self, positions: np.ndarray, plan: Plan, epoch: int, batch: int) -> BatchIndices:
        return BatchIndices(positions, self.order, plan, epoch, batch)

    def __len__(self) -> int:
        """Batches the next iteration yields (fewer when resuming mid-epoch)."""
        return self._units()

    def __repr__(self) -> str:
        return f"BatchSampler(batch_size={self.batch_size}, {self._describe_settings()})"
