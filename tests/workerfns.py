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


def logged_sleep(task: tuple[int, str]) -> dict:
    """Sleep 0.2 s; append ``task start end`` to the file ``task[1]``."""
    x, path = task
    start = time.time()
    time.sleep(0.2)
    with open(path, "a") as file:
        file.write(f"{x} {start} {time.time()}\n")
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


# --- faults (tests/engine/test_faults.py) ---------------------------------------------------------

# Released by a test once it has measured what it measures, so that thread workers left to
# finish their task detached end it then (process workers are killed instead).
gate = __import__("threading").Event()


def slow_after_first(batch):
    """Instant for the batch holding id 0, then 20 s (or until ``gate`` opens): every worker is
    busy when the training loop stops after its first batch."""
    if 0 not in batch.column("id").to_pylist():
        gate.wait(20)
    return batch


def stuck(batch):
    """Never returns (a transform waiting on a lock that is never released)."""
    gate.wait(600)
    return batch


def first_row_only(batch):
    return batch.slice(0, 1)


def unequal_columns(batch):
    return {"id": batch.column("id").to_numpy(), "label": batch.column("label").to_numpy()[:1]}


def returns_none(batch):
    return None


def fail_on_odd_id(row):
    if row["id"] % 2:
        raise ValueError(f"odd id {row['id']}")
    return row


def draw(row, rng):
    """A per-sample random draw (tests/batch/test_augment.py): what the row's generator gives."""
    return {"id": row["id"], "r": float(rng.random())}


def crop_flip(row, rng, size=6):
    """Random crop and horizontal flip of a [C, H, W] image (the guide's vision recipe)."""
    image = row["image"]
    y = int(rng.integers(0, image.shape[1] - size + 1))
    x = int(rng.integers(0, image.shape[2] - size + 1))
    image = image[:, y : y + size, x : x + size]
    if rng.random() < 0.5:
        image = image[:, :, ::-1]
    return {**row, "image": np.ascontiguousarray(image)}
