"""A loader's process pool lives across its epochs: the same workers every epoch, a break that
leaves nothing of its epoch behind, closed by close(), garbage collection and the exit; and what
a worker is sent at start does not grow with the rows."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa
import pytest

import lanceloader as ll
import workerfns
from lanceloader.engine.pool import KeptPool, Ordered
from lanceloader.engine.processes import ProcessPool, WorkerDiedError


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def gone(pids: list[int], within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.05)
    return not any(alive(p) for p in pids)


def shm_files(pid: int | None = None) -> list[str]:
    return [p.name for p in Path("/dev/shm").glob(f"lanceloader-pool-{pid or os.getpid()}-*")]


def worker_pids(loader: ll.Loader) -> list[int]:
    pool = loader._pool.pool
    return [] if pool is None else pool.pids


def ids(batches) -> list[int]:
    return [int(i) for b in batches for i in b["id"]]


def slow_batch(batch):
    time.sleep(0.02)  # tasks are still in flight when the loop breaks
    return batch


def process_loader(uri: str, **kwargs) -> ll.Loader:
    settings = {"batch_size": 50, "columns": ["id"], "shuffle": True, "seed": 3}
    return ll.Loader(uri, worker_type="process", num_workers=2, **(settings | kwargs))


def test_a_loaders_epochs_share_one_pool_of_workers(small_uri: str) -> None:
    """Before: each epoch's iterator started new workers, which opened the dataset and
    rebuilt the cache pieces they held again (0.23x the rows/s of thread workers)."""
    loader = process_loader(small_uri)
    seen = []
    for _ in range(3):
        assert sorted(ids(loader)) == list(range(1000))
        seen.append(worker_pids(loader))
    assert len(seen[0]) == 2 and seen[0] == seen[1] == seen[2]
    loader.set_epoch(7)  # moves the cursor, not what the workers hold
    list(loader)
    assert worker_pids(loader) == seen[0]
    loader.load_state_dict(loader.state_dict())  # the same rows: the same workers
    list(loader)
    assert worker_pids(loader) == seen[0]
    loader.close()
    assert gone(seen[0]) and shm_files() == []
    assert sorted(ids(loader)) == list(range(1000))  # a closed loader starts workers again
    assert worker_pids(loader) not in ([], seen[0])
    loader.close()


@pytest.mark.parametrize("k", [0, 3])
def test_a_break_leaves_nothing_of_its_epoch_for_the_next(small_uri: str, k: int) -> None:
    reference = ll.Loader(small_uri, batch_size=50, columns=["id"], shuffle=True, seed=3)
    expected = [ids(reference), ids(reference)]
    loader = process_loader(small_uri, transform=slow_batch, prefetch=8)
    first = []
    for i, batch in enumerate(loader):
        first.extend(int(x) for x in batch["id"])
        if i == k:
            pids = worker_pids(loader)
            break
    del batch
    gc.collect()
    rest, following = ids(loader), ids(loader)  # epoch 0's rest, then epoch 1
    assert first + rest == expected[0] and following == expected[1]
    assert gone([p for p in pids if p not in worker_pids(loader)])  # busy ones were killed
    loader.close()
    assert shm_files() == []


def test_a_discard_drops_answers_keeps_idle_workers_and_kills_busy_ones() -> None:
    pool = ProcessPool(workerfns.echo, 2)
    first = Ordered(pool, iter(range(100)), depth=4, keep=True)
    assert next(first)["x"] == 0
    time.sleep(0.5)  # the other 3 answers arrive: both workers are idle
    pids = pool.pids
    first.close()
    assert pool.pids == pids and pool.in_flight == 0
    assert [r["x"] for r in Ordered(pool, iter(range(200, 210)), 4, keep=True)] == list(
        range(200, 210)
    )
    busy = Ordered(ProcessPool(workerfns.slow, 2), iter(range(100)), depth=4, keep=True)
    next(busy)
    slow_pids = busy.pool.pids
    busy.close()  # both workers are on a 0.2 s task: killed at once
    assert gone(slow_pids, within=1.0) and busy.pool.pids == []
    assert [r["x"] for r in Ordered(busy.pool, iter(range(300, 304)), 4)] == [300, 301, 302, 303]
    pool.close()
    assert shm_files() == []


def test_a_worker_killed_between_epochs_is_named(small_uri: str) -> None:
    loader = process_loader(small_uri)
    list(loader)
    pid = worker_pids(loader)[1]
    os.kill(pid, signal.SIGKILL)
    assert gone([pid])
    with pytest.raises(WorkerDiedError, match=rf"worker process 1 \(pid {pid}\) was killed"):
        list(loader)
    assert worker_pids(loader) == [] and shm_files() == []
    assert sorted(ids(loader)) == list(range(1000))  # the next iteration starts new workers
    loader.close()


def test_garbage_collection_of_the_loader_ends_its_workers(small_uri: str) -> None:
    loader = process_loader(small_uri)
    list(loader)
    pids = worker_pids(loader)
    del loader
    gc.collect()
    assert gone(pids) and shm_files() == []
    kept = KeptPool()
    assert kept.pool is None
    kept.close()  # idempotent, nothing to stop


def test_the_interpreter_exit_ends_a_kept_pool(small_uri: str, tmp_path: Path) -> None:
    script = tmp_path / "run.py"
    script.write_text(
        textwrap.dedent(f"""
        import lanceloader as ll
        loader = ll.Loader({small_uri!r}, batch_size=50, worker_type="process", num_workers=2)
        for _ in loader:
            pass
        print("pids", *loader._pool.pool.pids, flush=True)
        """)
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    pids = [int(p) for p in done.stdout.split("pids")[1].split()]
    assert len(pids) == 2 and gone(pids)
    assert not any(shm_files(p) for p in pids)


def write_ids(path: Path, rows: int, rows_per_file: int) -> str:
    table = pa.table({"id": np.arange(rows, dtype=np.int64)})
    lance.write_dataset(table, str(path), max_rows_per_file=rows_per_file)
    return str(path)


def test_what_a_worker_is_sent_at_start_does_not_grow_with_the_rows(tmp_path: Path) -> None:
    """A filter's row list (8 bytes a row) and the fragments' tables (about 300 bytes a
    fragment) were pickled into every worker's start: 400 MB a worker for 100M rows. They go
    through one shared-memory file of the pool now."""
    sent = {}
    for rows, per_file in ((20_000, 20_000), (400_000, 2_000)):  # 1 fragment, then 200
        uri = write_ids(tmp_path / f"ids{rows}.lance", rows, per_file)
        loader = ll.Loader(
            uri, batch_size=4, filter="id % 2 = 0", worker_type="process", num_workers=1
        )
        assert next(iter(loader))["id"].tolist() == [0, 2, 4, 6]
        sent[rows] = loader._pool.pool.start_bytes
        loader.close()
    assert sent[400_000] <= sent[20_000] + 64 and sent[400_000] < 1024, sent


def test_an_array_of_the_transform_changed_in_place_reaches_the_workers(small_uri: str) -> None:
    """Large arrays go to workers out of band: a kept pool is reused only for arrays of the
    same bytes, not merely the same memory."""
    table = np.zeros(100_000, dtype=np.int64)  # 800 KB: out of band
    loader = process_loader(
        small_uri, shuffle=False, transform=lambda b: {"id": b["id"].to_numpy() + table[0]}
    )
    assert ids(loader)[:3] == [0, 1, 2]
    pids = worker_pids(loader)
    table[0] = 10
    assert ids(loader)[:3] == [10, 11, 12]
    assert gone(pids)  # the workers that held the old table
    loader.close()
