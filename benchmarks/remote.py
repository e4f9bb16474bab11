"""Remote workers (worker_type="ray", issue 46) on a Ray cluster of several nodes on this machine
(``ray.cluster_utils.Cluster``; the driver's node has no CPU for actors, so every batch comes
from another node's object store).

* ``scaling``: a transform of fixed latency that uses no CPU (``time.sleep``, standing in for
  the cores of other machines: this one has 2), 8 actors against 1, epoch 1 (the actors are
  kept from epoch 0), alternated; the median of the ratios. Target >= 7x.
* ``cpu``: the training process's CPU (``time.process_time``: the loop and Ray's threads in it)
  per 10,000 rows/s of 224x224x3 uint8 images made by the actors, the default reads against
  reads of 2 batches (the default before), alternated. Target <= 0.2 cores.
* ``first``: the time from ``Loader(...)`` to the first batch with 4 actors and with 4 local
  process workers (the forkserver started before, as in a long job), alternated; the median
  of the ratios. Target <= 2x.
* ``kill``: an actor of 4 building a read killed (``ray.kill``) at batch 20 of an epoch of
  fixed-latency batches: the loop's longest wait for a batch in flight at the kill (after
  them; over the epoch) and the epoch's time, less those of an epoch without a kill, in ms
  and in batches (of the transform's latency).
* ``trials``: ``--trials`` (20) loaders of 3 actors, each killed at a random batch (``ray.kill``
  or SIGKILL of the actor's process, alternately): every epoch is the thread workers' epoch,
  batch for batch (ids and bytes), or the script fails.

    python benchmarks/remote.py [--only scaling,cpu,first,kill,trials] [--rounds 3]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from typing import Any

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # 127.0.0.1 only

import numpy as np
import ray
from ray.cluster_utils import Cluster

import lanceloader as ll
from lanceloader.demo import write_demo_dataset
from lanceloader.engine.processes import start_forkserver

SLEEP_S = 0.05  # the fixed-latency transform's time per batch
MB = 1024 * 1024


def start_cluster(nodes: int, cpus: int, store_mb: int) -> Cluster:
    """A head for the driver (no CPU for actors) and ``nodes`` nodes of ``cpus`` logical CPUs."""
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 0,
            "object_store_memory": store_mb * MB,
            "node_ip_address": "127.0.0.1",
            "include_dashboard": False,
        },
    )
    for _ in range(nodes):
        cluster.add_node(
            num_cpus=cpus, object_store_memory=store_mb * MB, node_ip_address="127.0.0.1"
        )
    ray.init(address=cluster.address, log_to_driver=False)
    return cluster


def sleepy(batch: Any) -> Any:
    """Fixed latency, no CPU."""
    time.sleep(SLEEP_S)
    return batch


def images(batch: Any) -> dict[str, np.ndarray]:
    """224x224x3 uint8 images, one per row (what decoding on the actors would make)."""
    ids = batch.column("id").to_numpy()
    out = np.empty((len(ids), 224, 224, 3), np.uint8)
    out[:] = (ids % 251).astype(np.uint8)[:, None, None, None]
    return {"id": ids, "image": out}


def jitter(row: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    x = np.asarray(row["x"], np.float32)
    return {**row, "x": x + rng.normal(size=x.shape).astype(np.float32)}


def warm(loader: ll.Loader) -> None:
    """Start the loader's actors and wait until they are up (until then the loop builds
    batches itself: what is measured here is the actors)."""
    it = iter(loader)
    ray.get([ray.get_actor(n).where.remote() for n in actor_names()], timeout=300)
    it.close()


def epoch_seconds(loader: ll.Loader) -> tuple[float, int]:
    t0, rows = time.perf_counter(), 0
    for batch in loader:
        rows += len(batch["id"])
    return time.perf_counter() - t0, rows


def scaling(uri: str, rounds: int) -> dict[str, Any]:
    rates: dict[int, list[float]] = {1: [], 8: []}
    ratios = []
    for _ in range(rounds):
        for actors in (1, 8):
            loader = ll.Loader(
                uri,
                batch_size=32,
                columns=["id"],
                transform=sleepy,
                worker_type="ray",
                num_workers=actors,
                prefetch=8 * actors,
            )
            with loader:
                warm(loader)
                epoch_seconds(loader)
                wall, rows = epoch_seconds(loader)
            rates[actors].append(rows / wall)
        ratios.append(rates[8][-1] / rates[1][-1])
    return {
        "rows_per_s_1": statistics.median(rates[1]),
        "rows_per_s_8": statistics.median(rates[8]),
        "ratio_median": statistics.median(ratios),
        "ratios": ratios,
    }


def cpu(uri: str, rounds: int) -> dict[str, Any]:
    """The default reads against reads of 2 batches (the default before reads for Ray actors
    were sized by rows: ``rows_per_read=128, prefetch=16``), alternated."""
    runs: dict[str, list[dict[str, float]]] = {"default": [], "2 batches": []}
    ratios = []
    kinds: list[tuple[str, dict[str, Any]]] = [
        ("2 batches", {"rows_per_read": 128, "prefetch": 16}),
        ("default", {}),
    ]
    for _ in range(rounds):
        for kind, settings in kinds:
            loader = ll.Loader(
                uri,
                batch_size=64,
                columns=["id"],
                transform=images,
                worker_type="ray",
                num_workers=4,
                **settings,
            )
            with loader:
                warm(loader)
                epoch_seconds(loader)
                c0, t0, rows = time.process_time(), time.perf_counter(), 0
                for batch in loader:
                    rows += len(batch["image"])
                    int(batch["image"][-1, 0, 0, 0])  # the loop touches each batch
                cpu_s, wall = time.process_time() - c0, time.perf_counter() - t0
                per_read = loader.batches_per_read
            rate = rows / wall
            runs[kind].append(
                {
                    "rows_per_s": rate,
                    "cores_per_10k": (cpu_s / wall) / (rate / 1e4),
                    "batches_per_read": per_read,
                }
            )
        ratios.append(runs["default"][-1]["cores_per_10k"] / runs["2 batches"][-1]["cores_per_10k"])
    return {
        kind: {
            "rows_per_s": statistics.median(r["rows_per_s"] for r in results),
            "cores_per_10k_rows_per_s": statistics.median(r["cores_per_10k"] for r in results),
            "batches_per_read": results[0]["batches_per_read"],
            "runs": results,
        }
        for kind, results in runs.items()
    } | {"ratio_default_to_2_batches_median": statistics.median(ratios)}


def first_batch(uri: str, rounds: int) -> dict[str, Any]:
    start_forkserver()
    times: dict[str, list[float]] = {"ray": [], "process": []}
    ratios = []
    for _ in range(rounds):
        for kind in ("ray", "process"):
            t0 = time.perf_counter()
            loader = ll.Loader(
                uri,
                batch_size=64,
                columns=["id", "x"],
                shuffle=True,
                transform=jitter_map,
                worker_type=kind,
                num_workers=4,
            )
            with loader:
                next(iter(loader))
                times[kind].append(time.perf_counter() - t0)
        ratios.append(times["ray"][-1] / times["process"][-1])
    return {
        "ray_s": statistics.median(times["ray"]),
        "process_s": statistics.median(times["process"]),
        "ratio_median": statistics.median(ratios),
        "ratios": ratios,
    }


jitter_map = ll.random_map(jitter)


def actor_names() -> list[str]:
    return sorted(n for n in ray.util.list_named_actors() if n.startswith("lanceloader-"))


def kill(name: str, how: str) -> None:
    actor = ray.get_actor(name)
    if how == "ray.kill":
        ray.kill(actor)
    else:
        pid: int = ray.get(actor.where.remote())[0]
        os.kill(pid, signal.SIGKILL)


KILL_AT = 20  # the batch after which an actor is killed


def epoch_waits(loader: ll.Loader, kill_seed: int | None) -> tuple[list[float], float]:
    """The loop's wait for each batch of an epoch, and its time; an actor killed once batch
    ``KILL_AT`` is in (None: no kill): one building a read (drawn from ``kill_seed``)."""
    waits: list[float] = []
    t0 = last = time.perf_counter()
    for i, _ in enumerate(loader):
        waits.append(time.perf_counter() - last)
        if kill_seed is not None and i == KILL_AT:
            kill(random.Random(kill_seed).choice(busy_actors()), "ray.kill")
        last = time.perf_counter()
    return waits, time.perf_counter() - t0


def busy_actors() -> list[str]:
    """The actors running a task now (all of them if none is)."""
    names = actor_names()
    stacks: list[str] = ray.get([ray.get_actor(n).stack.remote() for n in names], timeout=30)
    busy = [n for n, stack in zip(names, stacks, strict=True) if not stack.startswith("(idle")]
    return busy or names


def kill_latency(uri: str, rounds: int) -> dict[str, Any]:
    """An actor of 4 killed at batch 20 against an epoch without a kill (the same loader, in
    turn): the loop's longest wait for one batch, less the longest over the same batches
    without, over the batches in flight at the kill (``prefetch``: the lost read's cost), over
    the rest of the epoch (three actors until the replacement is up) and over the whole epoch
    (the figure before 7 Dec 2026: the epoch's start, a whole read's wait, often hides the
    kill); and the epochs' extra time (the lost actor's share of the work until its
    replacement is up)."""
    extra_in_flight: list[float] = []
    extra_after, extra_wait, extra_epoch, longest_ms = [], [], [], []
    for r in range(rounds):
        loader = ll.Loader(
            uri,
            batch_size=32,
            columns=["id"],
            transform=sleepy,
            worker_type="ray",
            # the default reads (16 batches) and prefetch (one read an actor; a smaller
            # prefetch is rounded up to that: the loop never waits on one actor alone)
            num_workers=4,
        )
        with loader:
            warm(loader)
            per_read, in_flight = loader.batches_per_read, loader.prefetch
            plain, plain_wall = epoch_waits(loader, None)
            killed, killed_wall = epoch_waits(loader, r)
        flying = slice(KILL_AT + 1, KILL_AT + 1 + in_flight)
        extra_in_flight.append(max(killed[flying]) - max(plain[flying]))
        rest = slice(KILL_AT + 1 + in_flight, None)
        extra_after.append(max(killed[rest]) - max(plain[rest]))
        extra_wait.append(max(killed) - max(plain))
        extra_epoch.append(killed_wall - plain_wall)
        longest_ms.append(
            {
                name: round(1000 * max(waits[flying]), 1)
                for name, waits in (("plain", plain), ("killed", killed))
            }
        )
    return {
        "batch_ms": 1000 * SLEEP_S,
        "read_ms": 1000 * per_read * SLEEP_S,
        "batches_in_flight": in_flight,
        "extra_wait_in_flight_ms_median": 1000 * statistics.median(extra_in_flight),
        "extra_wait_in_flight_batches": statistics.median(extra_in_flight) / SLEEP_S,
        "extra_wait_rest_ms_median": 1000 * statistics.median(extra_after),
        "extra_longest_wait_ms_median": 1000 * statistics.median(extra_wait),
        "extra_epoch_ms_median": 1000 * statistics.median(extra_epoch),
        "extra_wait_in_flight_ms": [round(1000 * e, 1) for e in extra_in_flight],
        "extra_wait_rest_ms": [round(1000 * e, 1) for e in extra_after],
        "extra_longest_wait_ms": [round(1000 * e, 1) for e in extra_wait],
        "extra_epoch_ms": [round(1000 * e, 1) for e in extra_epoch],
        "longest_wait_in_flight_ms": longest_ms,
    }


def digest(batch: dict[str, Any]) -> str:
    h = hashlib.sha256()
    for name in sorted(batch):
        value = np.ascontiguousarray(batch[name])
        h.update(f"{name}:{value.dtype}:{value.shape}".encode())
        h.update(value.tobytes())
    return h.hexdigest()


def trials(uri: str, count: int) -> dict[str, Any]:
    settings: dict[str, Any] = {
        "batch_size": 50,
        "columns": ["id", "x"],
        "shuffle": True,
        "seed": 7,
        "transform": jitter_map,
    }
    with ll.Loader(uri, num_workers=2, **settings) as reference_loader:
        reference = [digest(b) for b in reference_loader]
    draw = random.Random(46)
    failures, seconds = [], []
    for trial in range(count):
        how = ("ray.kill", "SIGKILL")[trial % 2]
        t0 = time.perf_counter()
        loader = ll.Loader(uri, worker_type="ray", num_workers=3, prefetch=12, **settings)
        with loader:
            warm(loader)
            it = iter(loader)
            at = draw.randrange(1, len(it) - 1)
            got = [digest(next(it)) for _ in range(at)]
            kill(draw.choice(actor_names()), how)
            got += [digest(b) for b in it]
        seconds.append(time.perf_counter() - t0)
        if got != reference:
            failures.append({"trial": trial, "how": how, "at": at})
    return {
        "trials": count,
        "identical": count - len(failures),
        "failures": failures,
        "seconds_median": statistics.median(seconds),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="scaling,cpu,first,kill,trials")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--trials", type=int, default=20)
    args = parser.parse_args()
    parts = args.only.split(",")
    cluster = start_cluster(nodes=2, cpus=8, store_mb=400)
    out: dict[str, Any] = {"machine_cores": os.cpu_count()}
    try:
        with tempfile.TemporaryDirectory() as d:
            ids = write_demo_dataset(f"{d}/ids.lance", rows=32 * 160)
            small = write_demo_dataset(f"{d}/small.lance", rows=1500, fragments=3)
            if "scaling" in parts:
                out["scaling"] = scaling(ids, args.rounds)
            if "cpu" in parts:
                out["cpu"] = cpu(write_demo_dataset(f"{d}/img.lance", rows=64 * 80), args.rounds)
            if "first" in parts:
                out["first_batch"] = first_batch(small, args.rounds)
            if "kill" in parts:
                out["kill"] = kill_latency(ids, args.rounds)
            if "trials" in parts:
                out["trials"] = trials(small, args.trials)
            print(json.dumps(out, indent=1), flush=True)
    finally:
        ray.shutdown()
        cluster.shutdown()
    if out.get("trials", {}).get("failures"):
        sys.exit("some kill trials were not identical")


if __name__ == "__main__":
    main()
