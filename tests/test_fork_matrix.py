"""The fork matrix: Lance used in the parent (scan, take, a scan still running on another
thread), then a torch DataLoader with 2 workers over our MapDataset, for each start method,
30 runs each. Every run has its own timeout; zero hangs and zero crashes allowed.

Without lanceloader's fork guard, `fork` fails in about two runs out of three here
(docs/fork-safety.md); with it, forked workers read through a clean reader process.
"""

from __future__ import annotations

import multiprocessing as mp
import threading
import warnings

import numpy as np
import pytest
from torch.utils.data import DataLoader

import lanceloader as ll
from lanceloader.processes import PRELOAD
from lanceloader.torch import BatchSampler, MapDataset, collate

RUNS = 30
ACTIVITIES = ("scan", "take", "scan running in another thread")


def use_lance_in_parent(uri: str, activity: str) -> threading.Event | None:
    source = ll.Source(uri, columns=["id", "x"])
    if activity == "scan":
        for _ in source.dataset.to_batches(batch_size=128):
            pass
        return None
    if activity == "take":
        source.read(np.random.default_rng(0).permutation(source.num_rows)[:300])
        return None
    stop = threading.Event()

    def scan_until_stopped() -> None:
        while not stop.is_set():
            for _ in source.dataset.to_batches(batch_size=64):
                if stop.is_set():
                    break

    threading.Thread(target=scan_until_stopped, daemon=True).start()
    return stop


@pytest.mark.slow
@pytest.mark.parametrize("method", ["fork", "forkserver", "spawn"])
def test_dataloader_workers_never_hang_after_lance_ran_in_the_parent(small_uri: str, method: str) -> None:
    ctx = mp.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(PRELOAD)
    dataset = MapDataset(small_uri, columns=["id"])
    expected = sorted(range(1000))
    outcomes = []
    for run in range(RUNS):
        stop = use_lance_in_parent(small_uri, ACTIVITIES[run % len(ACTIVITIES)])
        sampler = BatchSampler(dataset, batch_size=100, shuffle=True, seed=run)
        loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=collate, num_workers=2,
                            multiprocessing_context=ctx, timeout=60)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # "reading through a clean ..."
                ids = sorted(int(i) for batch in loader for i in batch["id"])
            outcomes.append("ok" if ids == expected else "wrong rows")
        except RuntimeError as exc:  # DataLoader timeout (a hang) or a worker killed by a signal
            outcomes.append(f"failed: {exc}")
        finally:
            if stop is not None:
                stop.set()
    assert outcomes == ["ok"] * RUNS, [o for o in outcomes if o != "ok"][:3]
