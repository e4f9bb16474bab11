"""The fork matrix: Lance used in the parent (scan, take, a scan still running on another
thread), then a torch DataLoader with 2 workers over our MapDataset, for each start method, on
local disk and on a real S3 server (the parent's object-store runtime started). Every run has
its own timeout; zero hangs and zero crashes allowed.

`fork` is the start method with the race (a child inherits Lance's runtime mid-use). Every worker
also reports what it is (``collate_with_worker_facts`` runs in the worker): a forked one must be
tainted and have no Lance runtime thread of its own after reading, i.e. it never called Lance.
That check fails on the first run if the fork guard misses a child, where the race alone failed
a run more than four times in five (docs/fork-safety.md: 6-8 of 20 unguarded children survive,
and a run has two), so 3 runs per parent activity on disk and 1 on S3 are enough; each forked run
starts two clean reader interpreters (about a second each). `forkserver` and `spawn` start
workers from a fresh interpreter that never ran Lance (the forkserver, started by fork + exec
and preloading torch as the ``forkserver`` fixture does; spawn's own): nothing is inherited, so
there is no race to sample and the parent's activity does not reach them; one run per activity
for the forkserver on disk, one run otherwise, shows the path works (`spawn` re-imports torch in
every worker, ~5 s a run here). Their workers must not be tainted: they read Lance themselves.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import warnings

import numpy as np
import pytest
from torch.utils.data import DataLoader

import lanceloader as ll
from lanceloader.demo import demo_table
from lanceloader.lifecycle import forksafe
from lanceloader.torch import BatchSampler, MapDataset, collate

# runs per start method on local disk and on S3 (each S3 run costs several seconds more: moto
# answers every read); the module docstring says why these suffice
RUNS = {"fork": 9, "forkserver": 3, "spawn": 1}
RUNS_S3 = {"fork": 3, "forkserver": 1, "spawn": 1}
ACTIVITIES = ("scan", "take", "scan running in another thread")


def use_lance_in_parent(
    uri: str, activity: str, storage_options: dict | None
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


def collate_with_worker_facts(rows):
    """``collate``, plus what the worker that ran it is: (pid, tainted, Lance runtime threads).
    Runs in the DataLoader worker, after the worker read the batch's rows."""
    return collate(rows), (os.getpid(), forksafe.tainted(), forksafe.lance_runtime_threads())


def worker_is_right(method: str, tainted: bool, lance_threads: int) -> bool:
    """A forked worker is tainted and never ran Lance (it read through a clean reader); a
    forkserver or spawn worker is clean and read Lance itself."""
    if method == "fork":
        return tainted and lance_threads == 0
    return not tainted and lance_threads > 0


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
    dataset_at: tuple[str, dict | None], method: str, request: pytest.FixtureRequest
) -> None:
    uri, storage_options = dataset_at
    ctx = (
        request.getfixturevalue("forkserver") if method == "forkserver" else mp.get_context(method)
    )
    dataset = MapDataset(uri, columns=["id"], storage_options=storage_options)
    expected = sorted(range(1000))
    outcomes = []
    runs = (RUNS if storage_options is None else RUNS_S3)[method]
    for run in range(runs):
        stop = use_lance_in_parent(uri, ACTIVITIES[run % len(ACTIVITIES)], storage_options)
        sampler = BatchSampler(dataset, batch_size=100, shuffle=True, seed=run)
        loader = DataLoader(
            dataset,
            batch_sampler=sampler,
            collate_fn=collate_with_worker_facts,
            num_workers=2,
            multiprocessing_context=ctx,
            timeout=60,
        )
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # "reading through a clean ..."
                delivered = list(loader)
            ids = sorted(int(i) for batch, _ in delivered for i in batch["id"])
            workers = {pid: (tainted, threads) for _, (pid, tainted, threads) in delivered}
            wrong = {
                pid: facts for pid, facts in workers.items() if not worker_is_right(method, *facts)
            }
            outcomes.append(
                "wrong rows"
                if ids != expected
                else f"workers (tainted, Lance threads): {wrong}"
                if wrong
                else "ok"
            )
        except RuntimeError as exc:  # DataLoader timeout (a hang) or a worker killed by a signal
            outcomes.append(f"failed: {exc}")
        finally:
            if stop is not None:
                stop.set()
    assert outcomes == ["ok"] * runs, [o for o in outcomes if o != "ok"][:3]
