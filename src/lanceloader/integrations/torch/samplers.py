"""``Sampler`` and ``BatchSampler``: dataset indices of one rank in our orders, the batches a
``Loader`` with the same settings delivers, with ``state_dict()`` in the Loader's format.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
import torch.utils.data

from lanceloader.distributed import resolve_rank_world
from lanceloader.integrations.torch.map import BatchIndices, MapDataset
from lanceloader.loader import DEFAULT_SHUFFLE_WINDOW, Loader, check_int
from lanceloader.order import Order
from lanceloader.plan import Plan
from lanceloader.source import Source
from lanceloader.state import FORMAT as STATE_FORMAT
from lanceloader.state import StateMismatchError, check_state, fingerprint, order_settings

# Samplers compute the order this many samples at a time (one vectorised Order call).
_SAMPLES_PER_STEP = 16_384


@dataclass
class _Cursor:
    """Where the next iteration starts: ``epoch``, the global ``start`` sample of its plan, and
    ``done`` units (batches, or this worker's batches) of that plan already delivered.

    ``fresh``: the next iteration continues exactly here (after construction, ``set_epoch`` or
    ``load_state_dict``). ``token`` identifies the iterator allowed to move the cursor; older
    iterators still run but no longer move it. ``consumed``: that iterator was advanced.
    """

    epoch: int = 0
    start: int = 0
    done: int = 0
    fresh: bool = True
    token: int = 0
    consumed: bool = False

    def next_epoch(self) -> None:
        self.epoch, self.start, self.done = self.epoch + 1, 0, 0


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
        check_int("batch_size", batch_size, minimum=1)
        check_int("shuffle_block_size", shuffle_block_size, minimum=1)
        check_int("seed", seed, minimum=None)
        if shuffle_window is not None:
            check_int("shuffle_window", shuffle_window, minimum=1)
        self.num_rows, self._source = _describe(data_source_or_len)
        self.rank, self.world_size = resolve_rank_world(rank, world_size)
        self.batch_size = batch_size
        self.drop_last = bool(drop_last)
        self.order = Order(
            num_rows=self.num_rows,
            shuffle=bool(shuffle),
            block_size=shuffle_block_size,
            window=shuffle_window or (DEFAULT_SHUFFLE_WINDOW if shuffle_block_size > 1 else 1),
            seed=seed,
        )
        self._order_settings = order_settings(self._source, self.order, self.num_rows)
        self._fingerprint = fingerprint(self._order_settings)
        self._cursor = _Cursor()

    def plan(self, start: int = 0) -> Plan:
        """This rank's plan for an epoch that starts at global sample ``start``."""
        return Plan(
            self.num_rows, self.batch_size, self.world_size, self.rank, self.drop_last, start
        )

    @property
    def epoch(self) -> int:
        """The epoch the next iteration delivers."""
        c = self._cursor
        return c.epoch + 1 if (not c.fresh and c.consumed) else c.epoch

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration deliver ``epoch`` from its start."""
        check_int("epoch", epoch, minimum=0)
        self._cursor = replace(self._cursor, epoch=epoch, start=0, done=0, fresh=True)

    def _next_position(self) -> tuple[int, int]:
        """``(start, done)`` of the iteration that the next ``iter()`` runs."""
        c = self._cursor
        return (0, 0) if (not c.fresh and c.consumed) else (c.start, c.done)

    def _units(self) -> int:
        """Batches the next iteration yields (fewer when resuming mid-epoch)."""
        start, done = self._next_position()
        return len(self.plan(start)) - done

    def _batches(self) -> Iterator[Any]:
        # Bind now, run lazily. torch makes iterators it never advances (DataLoader iterators call
        # iter(sampler) twice when they start): an iterator replaces the previous one at the same
        # place unless that one was advanced, in which case this is the next epoch.
        c = self._cursor
        if not c.fresh and c.consumed:
            c.next_epoch()
        c.fresh, c.consumed, c.token = False, False, c.token + 1
        return self._run(c, c.token, c.epoch, self.plan(c.start), c.done)

    def _run(self, c: _Cursor, token: int, epoch: int, plan: Plan, first: int) -> Iterator[Any]:
        if c.token == token:
            c.consumed = True
        step = max(1, _SAMPLES_PER_STEP // self.batch_size)
        for lo in range(first, len(plan), step):
            batches = range(lo, min(lo + step, len(plan)))
            samples, sizes = plan.samples(batches)
            positions = self.order.positions(epoch, samples)
            offset = 0
            for b, size in zip(batches, sizes, strict=True):
                if c.token == token:  # count it before handing it out: torchdata snapshots then
                    c.done = b + 1
                yield self._wrap(positions[offset : offset + size], plan, epoch, b)
                offset += size
        if c.token == token:  # finished: a state taken now points at the next epoch
            c.next_epoch()
            c.fresh = True

    def _wrap(self, positions: np.ndarray, plan: Plan, epoch: int, batch: int) -> Any:
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """Where the sampler is, in the Loader's state format (JSON-safe, ``format`` 1).

        ``sample`` counts global samples of ``epoch`` handed out by all ranks together, so the
        state resumes on any number of ranks. Inside a ``DataLoader`` with workers the sampler
        runs ahead of the training loop: save ``StatefulDataLoader.state_dict()`` instead, which
        snapshots this at the batch the loop has reached.
        """
        c = self._cursor
        source = self._source
        return {
            "format": STATE_FORMAT,
            "uri": source.uri if source else None,
            "version": source.version if source else None,
            "order": dict(self._order_settings),
            "fingerprint": self._fingerprint,
            "batch_size": self.batch_size,
            "world_size": self.world_size,
            "drop_last": self.drop_last,
            "columns": list(source.columns) if source else None,
            "epoch": c.epoch,
            "sample": self.plan(c.start).samples_done(c.done),
        }

    def load_state_dict(self, state: dict[str, Any], allow_changes: tuple[str, ...] = ()) -> None:
        """Continue at the state's epoch and sample: the next iteration starts there.

        Takes states of any sampler or ``Loader`` with the same order settings, from any number
        of ranks; ``allow_changes`` may name ``"batch_size"`` and ``"drop_last"`` (``columns``
        never matter to a sampler). A sampler built from a length does not check the dataset.
        """
        current = self.state_dict()
        if self._source is None and isinstance(state, dict):
            current["uri"], current["version"] = state.get("uri"), state.get("version")
        check_state(state, current, (*allow_changes, "columns"))
        check_int("state['epoch']", state["epoch"], minimum=0)
        check_int("state['sample']", state["sample"], minimum=0)
        if state["sample"] > self.num_rows:
            raise StateMismatchError(
                f"state sample {state['sample']} is beyond the {self.num_rows} rows of an epoch"
            )
        self._cursor = replace(
            self._cursor, epoch=state["epoch"], start=state["sample"], done=0, fresh=True
        )

    def _describe_settings(self) -> str:
        return (
            f"rows={self.num_rows}, order={self.order}, rank={self.rank}/{self.world_size}, "
            f"drop_last={self.drop_last}"
        )


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
    rank (:class:`~lanceloader.plan.Plan`), so every rank gets the same number of batches and a
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
