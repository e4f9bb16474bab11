"""Every stateful class passes the one checkpoint conformance check (``checkpointing.py``)."""

from __future__ import annotations

import pytest
from torchdata.stateful_dataloader import StatefulDataLoader

import lanceloader as ll
from checkpointing import assert_checkpoint_conformance
from lanceloader.torch import BatchSampler, IterableDataset, MapDataset, Sampler, collate

pytestmark = [
    pytest.mark.filterwarnings("ignore:The given NumPy array is not writable"),
    pytest.mark.filterwarnings("ignore:'set_vital' is deprecated"),
]
MODES = {
    "sequential": {},
    "block": {"shuffle": True, "shuffle_block_size": 16, "shuffle_window": 4},
    "full": {"shuffle": True},
}
TIMEOUT = 60


def ids(batch) -> list[int]:
    return batch["id"].tolist()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("use_filter", [False, True])
@pytest.mark.parametrize("rank,world,drop_last", [(0, 1, False), (1, 3, True)])
def test_loader_threads(
    small_uri: str, mode: str, use_filter: bool, rank: int, world: int, drop_last: bool
) -> None:
    assert_checkpoint_conformance(
        lambda: ll.Loader(
            small_uri,
            batch_size=70,
            columns=["id"],
            filter="label != 3" if use_filter else None,
            rank=rank,
            world_size=world,
            drop_last=drop_last,
            seed=3,
            num_workers=2,
            **MODES[mode],
        ),
        ids,
    )


@pytest.mark.parametrize("drop_last", [False, True])
def test_loader_processes(small_uri: str, drop_last: bool) -> None:
    assert_checkpoint_conformance(
        lambda: ll.Loader(
            small_uri,
            batch_size=230,
            columns=["id"],
            shuffle=True,
            seed=1,
            drop_last=drop_last,
            num_workers=2,
            worker_type="process",
        ),
        ids,
        breaks=(1, 2),
    )


@pytest.mark.parametrize("mode", MODES)
def test_sampler(mode: str) -> None:
    assert_checkpoint_conformance(lambda: Sampler(7, seed=2, **MODES[mode]))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("rank,world", [(0, 1), (1, 2)])
def test_batch_sampler(mode: str, rank: int, world: int) -> None:
    assert_checkpoint_conformance(
        lambda: BatchSampler(50, batch_size=9, rank=rank, world_size=world, seed=2, **MODES[mode]),
        list,
    )


@pytest.mark.parametrize("workers", [0, 1, 3])
def test_iterable_dataset_in_stateful_dataloader(small_uri: str, forkserver, workers: int) -> None:
    extra = {"multiprocessing_context": forkserver, "timeout": TIMEOUT} if workers else {}

    def make() -> StatefulDataLoader:
        ds = IterableDataset(
            small_uri, 230, columns=["id"], shuffle=True, seed=4, output="torch", num_workers=1
        )
        return StatefulDataLoader(
            ds, batch_size=None, num_workers=workers, persistent_workers=bool(workers), **extra
        )

    assert_checkpoint_conformance(make, ids, breaks=())


@pytest.mark.parametrize("workers", [0, 2])
def test_map_dataset_in_stateful_dataloader(small_uri: str, forkserver, workers: int) -> None:
    ds = MapDataset(small_uri, columns=["id"])
    extra = {"multiprocessing_context": forkserver, "timeout": TIMEOUT} if workers else {}

    def make() -> StatefulDataLoader:
        sampler = BatchSampler(ds, batch_size=230, shuffle=True, shuffle_block_size=4, seed=9)
        return StatefulDataLoader(
            ds,
            batch_sampler=sampler,
            collate_fn=collate,
            num_workers=workers,
            persistent_workers=bool(workers),
            **extra,
        )

    assert_checkpoint_conformance(make, ids, breaks=())
