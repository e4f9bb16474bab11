"""The engine at the decode ceiling: how workers share a stream's work, and what a process
worker's reads cost it (counted, not timed)."""

from __future__ import annotations

import os
import resource
import time
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa

from lanceloader.engine.pool import Ordered
from lanceloader.engine.processes import ProcessPool

WAIT_S = 20.0  # a blocked task gives up after this long and says so


def _wait_for(paths: list[Path], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if all(p.exists() for p in paths):
            return True
        time.sleep(0.01)
    return False


def blocked_behind(task: tuple[str, int]) -> dict:
    """Task 0 is a fresh pool's first, sent alone: it returns at once. Then task 3 waits for
    task 5 to have run; task 1 waits until tasks 2 and 4 ran, then a moment more (so their
    answers are in before task 5 is dealt). Each leaves a marker file."""
    folder, x = Path(task[0]), task[1]
    waited = True
    if x == 1:
        waited = _wait_for([folder / "2", folder / "4"], WAIT_S)
        time.sleep(1.5)
    if x == 3:
        waited = _wait_for([folder / "5"], WAIT_S)
    (folder / str(x)).touch()
    return {"x": x, "pid": os.getpid(), "waited": waited}


def test_a_busy_process_worker_is_not_dealt_the_next_task(tmp_path) -> None:
    """Task 3 blocks its worker until task 5 has run. Dealt alternately, task 5 queued behind
    task 3 on the same worker while the other worker idled (here: until the wait gave up); the
    worker with fewer unfinished tasks must get it."""
    tasks = iter([(str(tmp_path), x) for x in range(9)])
    with Ordered(ProcessPool(blocked_behind, num_workers=2), tasks, depth=4) as pool:
        results = list(pool)
    assert [r["x"] for r in results] == list(range(9))  # still in task order
    assert all(r["waited"] for r in results), "task 5 waited behind the blocked task 3"
    assert results[5]["pid"] != results[3]["pid"]


READ_ROWS = 512
VALUE_BYTES = 11_000  # a JPEG of 128x128 pixels


def faults_per_read(uri: str) -> dict:
    """Read the same 512 rows of ``uri`` 12 times in this worker, as a worker's tasks do; the
    minor page faults of each of the last 8 reads. Now and then one read is served from pages
    glibc had handed back after all (a whole read's faults, ~1 run in 10), so the test takes
    the median read: with the defect every read faults all of its pages."""
    from lanceloader.rows.lance.source import Source

    source = Source(uri, ["image"])
    positions = np.arange(READ_ROWS)
    for _ in range(4):  # the first reads grow the heaps
        source.read_rows(positions, 0)
    faults = []
    for _ in range(8):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        rows = source.read_rows(positions, 0).rows
        assert rows.num_rows == READ_ROWS
        del rows
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return {"faults": float(np.median(faults)), "each": faults}


def test_a_process_workers_reads_reuse_freed_memory(tmp_path) -> None:
    """Each read's 5.6 MB were page-faulted in afresh (glibc returned them to the kernel at
    free): ~1,400 faults per read, one per 4 KiB page. A worker keeps freed memory for its
    next read."""
    uri = str(tmp_path / "images.lance")
    rng = np.random.default_rng(0)
    values = [rng.bytes(VALUE_BYTES) for _ in range(READ_ROWS)]
    lance.write_dataset(pa.table({"image": pa.array(values, pa.binary())}), uri)
    with Ordered(ProcessPool(faults_per_read, num_workers=1), iter([uri]), depth=1) as pool:
        (result,) = list(pool)
    pages = READ_ROWS * VALUE_BYTES / 4096
    assert result["faults"] < pages / 4, (
        f"a median {result['faults']:.0f} faults per read of {pages:.0f} pages: {result['each']}"
    )
