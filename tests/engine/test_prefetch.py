from __future__ import annotations

import gc
import threading
import time

import pytest

from conftest import lanceloader_threads
from lanceloader.engine.pool import Ordered
from lanceloader.engine.threads import ThreadPool


def prefetch(fn, tasks, num_workers: int, depth: int) -> Ordered:
    """The results of ``tasks`` from a thread pool of its own (closed at the end)."""
    return Ordered(ThreadPool(fn, num_workers), tasks, depth)


def slow_square(x: int) -> int:
    time.sleep(0.001 * ((x * 7) % 5))  # finish out of order
    return x * x


@pytest.mark.parametrize("workers, depth", [(1, 1), (2, 1), (2, 5), (4, 3)])
def test_results_come_in_task_order(workers: int, depth: int) -> None:
    with prefetch(slow_square, iter(range(40)), workers, depth) as it:
        assert list(it) == [x * x for x in range(40)]


def test_at_most_depth_tasks_in_flight() -> None:
    started: list[int] = []
    gate = threading.Event()

    def fn(x: int) -> int:
        started.append(x)
        gate.wait(5)
        return x

    it = prefetch(fn, iter(range(100)), num_workers=8, depth=3)
    time.sleep(0.05)
    assert len(started) == 3 and it.in_flight == 3
    gate.set()
    assert next(it) == 0
    it.close()
    assert len(started) <= 4


def test_worker_error_is_reraised_with_its_traceback_and_closes() -> None:
    def fn(x: int) -> int:
        if x == 3:
            raise KeyError("boom")
        return x

    it = prefetch(fn, iter(range(10)), 2, 4)
    assert [next(it) for _ in range(3)] == [0, 1, 2]
    with pytest.raises(KeyError, match="boom") as info:
        next(it)
    assert any(entry.name == "fn" for entry in info.traceback)
    assert lanceloader_threads() == []
    with pytest.raises(StopIteration):
        next(it)


def test_close_is_idempotent_and_joins_threads() -> None:
    it = prefetch(slow_square, iter(range(1000)), 2, 4)
    next(it)
    it.close()
    it.close()
    assert lanceloader_threads() == []


def test_garbage_collection_closes() -> None:
    for _ in range(50):
        it = prefetch(slow_square, iter(range(1000)), 2, 4)
        next(it)
        del it
    gc.collect()
    assert lanceloader_threads() == []


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="num_workers"):
        prefetch(slow_square, iter([]), 0, 1)
    with pytest.raises(ValueError, match="depth"):
        prefetch(slow_square, iter([]), 1, 0)
