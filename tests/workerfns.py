"""Functions that worker processes run in the tests (importable by name in the children)."""

from __future__ import annotations

import os
import signal
import time

import numpy as np


def echo(x: int) -> dict:
    return {"value": np.full((100, 4), x, dtype=np.float32), "x": x, "tag": [str(x)]}


def die_on(x: int) -> dict:
    if x == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    return echo(x)


def exit_on(x: int) -> dict:
    if x == 3:
        os._exit(123)
    return echo(x)


def raise_on(x: int) -> dict:
    if x == 3:
        raise ValueError(f"bad task {x}")
    return echo(x)


def slow(x: int) -> dict:
    time.sleep(0.2)
    return echo(x)


def busy_python(batch):
    """A pure-Python, GIL-holding transform: what process workers are for."""
    total = 0
    for i in range(40_000):
        total += i * i % 7
    return batch


def add_one(batch):
    """A transform returning NumPy: id + 1."""
    return {"id": batch.column("id").to_numpy() + 1}


def kill_self_on_third_batch(batch):
    if 200 in batch.column("id").to_pylist():
        os.kill(os.getpid(), signal.SIGKILL)
    return batch
