"""The fork matrix: Lance used in the parent (scan, take, a scan still running on another
thread), then a torch DataLoader with 2 workers over our MapDataset, for each start method, on
local disk and on a real S3 server (the parent's object-store runtime started). Every run has
its own timeout; zero hangs and zero crashes allowed.

`fork` is the start method with the race (a child inherits Lance's runtime mid-use), so it gets
30 runs on disk and 10 on S3. `forkserver` and `spawn` start workers from a process that never
ran Lance (the server is forked before any use; spawn is a fresh interpreter): nothing is
inherited, so there is no race to sample and a few runs per activity show the path works
(`spawn` re-imports torch in every worker, ~5 s a run here).

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
from lanceloader.demo import demo_table
from lanceloader.engine.processes import PRELOAD
from lanceloader.torch import BatchSampler, MapDataset, collate

# runs per start method on local disk and on S3 (each S3 run costs several seconds more: moto
# answers every read)
RUNS = {"fork": 30, "forkserver": 9, "spawn": 6}
RUNS_S3 = {"fork": 10, "forkserver": 3, "spawn": 3}
ACTIVITIES = ("scan", "take", "scan running in another thread")


def use_lance_in_parent(uri: str, activity: str, storage_options: dict | None
                        ) -> threading.Event | None:
    source = ll.Source(uri, columns=["id", "x"], storage_options=storage_options)
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


@pytest.fixture(scope="module", params=["local", "s3"])
def dataset_at(request: pytest.FixtureRequest, small_uri: str) -> tuple[str, dict | None]:
    """The 1,000 rows of ``small_uri``, on local disk or on the test S3 server."""
    if request.param == "local":
        return small_uri, None
    s3 = request.getfixturevalue("s3")
    return s3.write(demo_table(1000), max_rows_per_file=334), s3.storage_options


@pytest.mark.slow
@pytest.mark.parametrize("method", ["fork", "forkserver", "spawn"])
def test_dataloader_workers_never_hang_after_lance_ran_in_the_parent(
        dataset_at: tuple[str, dict | None], method: str) -> None:
    uri, storage_options = dataset_at
    ctx = mp.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(PRELOAD)
    dataset = MapDataset(uri, columns=["id"], storage_options=storage_options)
    expected = sorted(range(1000))
    outcomes = []
    runs = (RUNS if storage_options is None else RUNS_S3)[method]
    for run in range(runs):
        stop = use_lance_in_parent(uri, ACTIVITIES[run % len(ACTIVITIES)], storage_options)
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
    assert outcomes == ["ok"] * runs, [o for o in outcomes if o != "ok"][:3]
