"""The loader with worker_type='process': same batches as threads, clear failures."""

from __future__ import annotations

import os

import pytest
import torch

import lanceloader as ll
import workerfns
from conftest import ids_of
from lanceloader.engine.processes import WorkerDiedError


@pytest.mark.parametrize(
    "settings", [{}, {"shuffle": True}, {"shuffle": True, "shuffle_block_size": 16}]
)
def test_process_workers_deliver_what_threads_deliver(small_uri: str, settings: dict) -> None:
    threads = ids_of(ll.Loader(small_uri, batch_size=64, **settings))
    processes = ids_of(
        ll.Loader(small_uri, batch_size=64, worker_type="process", num_workers=2, **settings)
    )
    assert processes == threads


def test_torch_output_and_numpy_transform_results(small_uri: str) -> None:
    loader = ll.Loader(
        small_uri,
        batch_size=100,
        columns=["id", "x"],
        worker_type="process",
        num_workers=2,
        output="torch",
    )
    batch = next(iter(loader))
    assert isinstance(batch["x"], torch.Tensor) and batch["x"].shape == (100, 64)
    loader = ll.Loader(
        small_uri, batch_size=100, worker_type="process", transform=workerfns.add_one
    )
    assert ids_of(loader) == list(range(1, 1001))


def test_numpy_string_columns_come_back_from_process_workers(small_uri: str) -> None:
    conversion = ll.Conversion(output="numpy", strings="numpy")  # a NumPy StringDType column
    loader = ll.Loader(
        small_uri,
        batch_size=100,
        columns=["text"],
        output=conversion,
        worker_type="process",
        num_workers=2,
    )
    threads = ll.Loader(small_uri, batch_size=100, columns=["text"], output=conversion)
    assert [b["text"].tolist() for b in loader] == [b["text"].tolist() for b in threads]


def test_unpicklable_transform_is_reported_at_construction(small_uri: str) -> None:
    log = open(os.devnull, "w")  # noqa: SIM115 (what a transform must not hold)
    with pytest.raises(
        TypeError,
        match=r"transform .*<lambda>.* cannot be sent to worker "
        r"processes: its field 'transform' .*closure variable 'log' \(a TextIOWrapper\)"
        r".*inside the transform",
    ):
        ll.Loader(small_uri, worker_type="process", transform=lambda b: log.write("") and b)
    log.close()


def test_lambda_and_closure_transforms_run_on_process_workers(small_uri: str) -> None:
    offset = 5
    loader = ll.Loader(
        small_uri,
        batch_size=100,
        columns=["id"],
        worker_type="process",
        num_workers=2,
        transform=lambda b: {"id": b["id"].to_numpy() + offset},
    )
    assert ids_of(loader) == [i + 5 for i in range(1000)]


def test_killed_worker_fails_the_epoch_clearly(small_uri: str) -> None:
    loader = ll.Loader(
        small_uri,
        batch_size=50,
        worker_type="process",
        num_workers=2,
        transform=workerfns.kill_self_on_third_batch,
    )
    with pytest.raises(WorkerDiedError, match="was killed by SIGKILL"):
        list(loader)


def test_checkpoint_resume_with_process_workers(small_uri: str) -> None:
    loader = ll.Loader(small_uri, batch_size=64, shuffle=True, worker_type="process")
    it = iter(loader)
    for _ in range(5):
        next(it)
    state = loader.state_dict()
    loader.close()
    resumed = ll.Loader(small_uri, batch_size=64, shuffle=True)
    resumed.load_state_dict(state)
    reference = ll.Loader(small_uri, batch_size=64, shuffle=True)
    assert ids_of(resumed) == ids_of(reference)[5 * 64 :]
