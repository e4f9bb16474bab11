"""Ray actor workers on a real Ray cluster of three nodes on this machine
(``ray.cluster_utils.Cluster``; issue 46): the stream is the thread workers' stream, byte for
byte, with any number of actors; killed actors, a removed node and a rebuilt loader lose and
repeat nothing.

One cluster for the module (~7 s to start), each node with its own CPUs and a small object
store; every loader here closes its actors before the next test."""

from __future__ import annotations

import hashlib
import os
import pickle
import random
import re
import signal
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import numpy as np
import pytest

import lanceloader as ll
from lanceloader.demo import write_demo_dataset

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

from lanceloader.engine.actors import ActorPool, ActorsLostError, ActorStartError  # noqa: E402
from lanceloader.engine.batch_actor import BatchActor  # noqa: E402
from lanceloader.engine.pickling import Shipment  # noqa: E402
from lanceloader.engine.threads import Stalled  # noqa: E402
from lanceloader.engine.work import BatchWork, stage_of  # noqa: E402
from lanceloader.ordering.order import Order  # noqa: E402
from lanceloader.ordering.plan import Plan, read_tasks  # noqa: E402
from lanceloader.rows.lance.source import Source  # noqa: E402

pytestmark = [
    pytest.mark.integration,
    pytest.mark.ray_cluster,
    # Ray starts its servers with fork+exec (subprocess), which lanceloader's fork hook notes
    pytest.mark.filterwarnings("ignore:lanceloader. forking:RuntimeWarning"),
]
# The actors cannot import this module (pytest put its folder on this process's path only):
# its functions travel by value, as a script's do.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

STORE_BYTES = 100 * 1024 * 1024  # each node's object store: this machine is small


@pytest.fixture(scope="module")
def cluster() -> Any:
    """A head (the driver's node, 1 CPU) and two worker nodes of 2 CPUs, on 127.0.0.1; nodes
    are declared dead within ~2 s of losing their raylet."""
    node = {"object_store_memory": STORE_BYTES, "node_ip_address": "127.0.0.1"}
    started = Cluster(
        initialize_head=True,
        head_node_args={
            **node,
            "num_cpus": 1,
            "include_dashboard": False,
            "_system_config": {"health_check_period_ms": 500, "health_check_failure_threshold": 3},
        },
    )
    try:
        for _ in range(2):
            started.add_node(**node, num_cpus=2)
        ray.init(address=started.address, log_to_driver=False)
        yield started
    finally:
        ray.shutdown()
        started.shutdown()


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_demo_dataset(tmp_path_factory.mktemp("ray") / "d.lance", rows=1500, fragments=3)


def jitter(row: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """A transform with per-sample random draws (``random_map``)."""
    x = np.asarray(row["x"], np.float32)
    return {**row, "x": x + rng.normal(size=x.shape).astype(np.float32)}


def loader(data: str, **kw: Any) -> ll.Loader:
    settings: dict[str, Any] = {
        "batch_size": 50,
        "columns": ["id", "x"],
        "shuffle": True,
        "seed": 7,
        "transform": ll.random_map(jitter),
        "num_workers": 2,
        **kw,
    }
    return ll.Loader(data, **settings)


def digest(batch: dict[str, Any]) -> str:
    """The ids and bytes of every column of a batch."""
    h = hashlib.sha256()
    for name in sorted(batch):
        value = np.ascontiguousarray(batch[name])
        h.update(f"{name}:{value.dtype}:{value.shape}".encode())
        h.update(value.tobytes())
    return h.hexdigest()


def epochs(source: ll.Loader, count: int) -> list[list[str]]:
    with source:
        return [[digest(b) for b in source] for _ in range(count)]


def warm(source: ll.Loader) -> Iterator[Any]:
    """The loader's iterator once its actors are up (until then the loop builds batches
    itself, and a test of the actors would test this process)."""
    it = iter(source)
    names = actor_names()
    assert names, "no actor was started"
    ray.get([ray.get_actor(n).where.remote() for n in names], timeout=120)
    return it


@pytest.fixture(scope="module")
def reference(data: str) -> list[list[str]]:
    """Three epochs from local thread workers."""
    return epochs(loader(data, worker_type="thread"), 3)


def actor_names() -> list[str]:
    return sorted(n for n in ray.util.list_named_actors() if n.startswith("lanceloader-"))


@pytest.mark.parametrize(
    ("settings", "error"),
    [
        ({"worker_type": "ray"}, "worker_type='ray' needs num_workers="),
        ({"ray_options": {"num_cpus": 1}}, "ray_options= is for worker_type='ray'"),
        ({"worker_type": "ray", "num_workers": 2, "ray_options": {"cpus": 1}}, "got 'cpus'"),
        ({"worker_type": "rays", "num_workers": 2}, "'thread', 'process' or 'ray'"),
    ],
)
def test_ray_settings_are_checked_at_construction(
    data: str, settings: dict[str, Any], error: str
) -> None:
    """(No cluster: nothing starts before the settings are right.)"""
    with pytest.raises(ValueError, match=re.escape(error)):
        ll.Loader(data, batch_size=10, **settings)


def test_reads_for_actors_hold_512_rows_and_one_read_per_actor_is_in_flight(data: str) -> None:
    """(No cluster.) The training process pays Ray's cost per read (~2.5 ms of its CPU): with a
    transform, a read for actors holds at least 512 rows (8 batches of 64; local reads of big
    rows hold 2, engine/sizing.py), and one read per actor is in flight by default, where local
    workers keep two each (benchmarks/remote.py, cpu)."""
    settings: dict[str, Any] = {"batch_size": 64, "transform": ll.random_map(jitter)}
    remote = ll.Loader(data, **settings, worker_type="ray", num_workers=4)
    local = ll.Loader(data, **settings, worker_type="thread", num_workers=4)
    assert (remote.batches_per_read, remote.prefetch) == (8, 32)
    assert local.prefetch == 2 * 4 * local.batches_per_read


@pytest.mark.parametrize("actors", [1, 2, 4])
def test_actors_deliver_the_thread_workers_batches_byte_for_byte(
    cluster: Any, data: str, reference: list[list[str]], actors: int
) -> None:
    source = loader(data, worker_type="ray", num_workers=actors)
    with source:
        got = [[digest(b) for b in warm(source)]]
        got += [[digest(b) for b in source] for _ in range(2)]
    assert got == reference
    assert len({d for epoch in got for d in epoch}) == 3 * len(reference[0])  # epochs differ
    assert actor_names() == []  # closed with the loader
    stats = source.stats(epoch=None)
    assert stats.local_s == 0 and stats.transfer_s > 0  # every batch came from an actor
    assert stats.transform_s > 0 and "actors built batches" in str(stats)


def kill(name: str, how: str) -> None:
    actor = ray.get_actor(name)
    if how == "ray.kill":
        ray.kill(actor)
    else:  # the actor's process, as the OOM killer would
        pid, _ = ray.get(actor.where.remote())
        os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("trial", range(2))
def test_a_killed_actor_loses_and_repeats_nothing(
    cluster: Any, data: str, reference: list[list[str]], trial: int
) -> None:
    """A random actor of 3 killed at a random batch (``ray.kill`` or SIGKILL of its process):
    the epoch is the reference, in order. (benchmarks/remote.py runs 20 such trials.)"""
    draw = random.Random(trial)
    how = ("ray.kill", "SIGKILL")[trial % 2]
    source = loader(data, worker_type="ray", num_workers=3, prefetch=12)
    with source:
        it = warm(source)
        at = draw.randrange(1, len(it) - 4)
        got = [digest(next(it)) for _ in range(at)]
        kill(draw.choice(actor_names()), how)
        got += [digest(b) for b in it]
    assert got == reference[0]


def test_a_removed_node_loses_and_repeats_nothing(
    cluster: Any, data: str, reference: list[list[str]]
) -> None:
    """A node with actors on it leaves the cluster mid-epoch (its raylet and workers stop)."""
    extra = cluster.add_node(num_cpus=2, resources={"doomed": 2}, object_store_memory=STORE_BYTES)
    cluster.wait_for_nodes()
    source = loader(
        data, worker_type="ray", num_workers=2, prefetch=8, ray_options={"resources": {"doomed": 1}}
    )
    with source:
        it = warm(source)
        got = [digest(next(it)) for _ in range(5)]
        cluster.remove_node(extra)  # both actors gone; their tasks are built here meanwhile
        got += [digest(b) for b in it]
    assert got == reference[0]


def test_resume_after_the_loader_is_rebuilt_is_exact(
    cluster: Any, data: str, reference: list[list[str]]
) -> None:
    first = loader(data, worker_type="ray", num_workers=2)
    with first:
        it = iter(first)
        got = [digest(next(it)) for _ in range(7)]
        state = first.state_dict()
    again = loader(data, worker_type="ray", num_workers=3)  # N -> M actors
    again.load_state_dict(state)
    with again:
        got += [digest(b) for b in again]
        got += [digest(b) for b in again]
    assert got == reference[0] + reference[1]


def test_every_actor_lost_is_a_clear_error(cluster: Any, data: str) -> None:
    """One actor, killed, and its replacement killed too: no more are started."""
    source = loader(data, worker_type="ray", num_workers=1, prefetch=2)
    with source, pytest.raises(ActorsLostError, match="Ray actors of this loader died"):
        it = warm(source)
        killed = actor_names()
        kill(killed[0], "ray.kill")
        for _ in range(100):  # epochs (built here meanwhile), until the loader sees both
            for _ in it:
                for name in set(actor_names()) - set(killed):  # the replacement
                    kill(name, "ray.kill")
                    killed.append(name)
            it = iter(source)


def stuck_after_row_99(batch: Any) -> Any:
    """Sleeps (for an hour) in every batch past row 99."""
    if max(batch.column("id").to_pylist()) > 99:
        time.sleep(3600)
    return batch


def test_a_stuck_actor_is_named_with_its_stack(cluster: Any, data: str) -> None:
    """The pool's stall report: the actor (number, pid, node) and its stack, taken while it
    runs the transform. (The first batch, with no stall bound, starts the actor.)"""
    work = BatchWork(Source(data, ["id"]), Order(1500), stuck_after_row_99, "numpy")
    tasks = read_tasks(0, Plan(1500, 100), per_read=1, batches=range(2))
    pool = ActorPool(work, 1)
    try:
        assert pool.ready(timeout=120)
        pool.submit(next(tasks))
        assert pool.take().batches[0]["id"].tolist() == list(range(100))
        pool.stall_timeout = 2
        pool.submit(next(tasks))
        with pytest.raises(Stalled) as raised:
            pool.take()
    finally:
        pool.close()
    stalled = raised.value
    assert stalled.worker.startswith("ray actor 0 (pid ") and "on node 127.0.0.1" in stalled.worker
    assert "in stuck_after_row_99" in stalled.stack  # (its code travelled by value: no line)
    assert stage_of(stalled.functions) == "transform"


def test_a_transform_the_nodes_cannot_import_is_named(
    cluster: Any, data: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A module on this process's path only: the actors cannot load the work, and the error
    says so and how to ship it (instead of actors dying one after another)."""
    (tmp_path / "only_here.py").write_text(
        textwrap.dedent(
            """
            def same(batch):
                return batch
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import only_here  # type: ignore[import-not-found]

    source = loader(data, worker_type="ray", num_workers=2, transform=only_here.same)
    with source, pytest.raises(ActorStartError, match=r"No module named 'only_here'.*py_modules"):
        deadline = time.monotonic() + 120  # (a bound, not a timing: it raises in seconds)
        while time.monotonic() < deadline:  # epochs, built here until the actors fail
            list(source)


class GateOver999:
    """A transform that waits for a file (at most 120 s) in batches past row 999."""

    def __init__(self, gate: Path) -> None:
        self.gate = gate

    def __call__(self, batch: Any) -> Any:
        deadline = time.monotonic() + 120  # (a bound: the test opens the gate in seconds)
        while max(batch.column("id").to_pylist()) > 999 and not self.gate.exists():
            if time.monotonic() > deadline:
                raise TimeoutError("the test never opened the gate")
            time.sleep(0.05)
        return batch


def test_a_lost_actors_read_runs_at_once_not_behind_another_actors_queue(
    cluster: Any, data: str, tmp_path: Path
) -> None:
    """Actor 0 dies holding the read due next while actor 1 is busy (held in a transform until
    the test opens a gate): the lost read's batches run on actor 1 at once, beside its task,
    so the next batch comes without waiting for actor 1's queue (before: sent to the back of
    that queue, the read waited behind the held task: Stalled)."""
    gate = tmp_path / "gate"
    work = BatchWork(Source(data, ["id"]), Order(1500), GateOver999(gate), "numpy")
    plan = Plan(1500, 100)
    due, held = (next(read_tasks(0, plan, 2, range(b, b + 2), ramp=False)) for b in (0, 10))
    pool = ActorPool(work, 2)
    try:
        ray.get([ray.get_actor(n).where.remote() for n in actor_names()], timeout=120)
        assert pool.ready(timeout=0) and len([a for a in pool.live if a.eligible]) == 2
        ray.kill(ray.get_actor(actor_names()[0]))  # (its death reaches the pool by its task)
        pool.submit(due)  # -> actor 0 (dead)
        pool.submit(held)  # -> actor 1, held at the gate
        pool.stall_timeout = 30
        first = batches_of_read(pool, 2)  # the lost read's, handed out as its parts come back
        gate.touch()
        second = batches_of_read(pool, 2)
    finally:
        gate.touch()
        pool.close()
    assert [b["id"].tolist() for b in first] == [list(range(0, 100)), list(range(100, 200))]
    assert [b["id"].tolist() for b in second] == [list(range(1000, 1100)), list(range(1100, 1200))]
    assert pool.rebuilt == 1


def batches_of_read(pool: ActorPool, count: int) -> list[Any]:
    """The next ``count`` batches from ``pool.take()``, which hands a lost read out in parts
    (one take per part back) and a whole read in one."""
    batches: list[Any] = []
    while len(batches) < count:
        batches += pool.take().batches
    return batches


def test_a_lost_reads_batches_are_handed_out_as_they_are_back(
    cluster: Any, data: str, tmp_path: Path
) -> None:
    """Actor 0 dies holding a read of two batches whose second waits at a gate: the pool hands
    out the first as soon as it is rebuilt, so the loop waits for its next batch, not for the
    read's last (before: ``take`` returned the read whole, after its last part: Stalled)."""
    gate = tmp_path / "gate"
    work = BatchWork(Source(data, ["id"]), Order(1500), GateOver999(gate), "numpy")
    lost = next(read_tasks(0, Plan(1500, 100), 2, range(9, 11), ramp=False))  # rows 900-1099
    pool = ActorPool(work, 2)
    try:
        ray.get([ray.get_actor(n).where.remote() for n in actor_names()], timeout=120)
        assert pool.ready(timeout=0) and len([a for a in pool.live if a.eligible]) == 2
        ray.kill(ray.get_actor(actor_names()[0]))  # (its death reaches the pool by its task)
        pool.submit(lost)  # -> actor 0 (dead): its two batches go to actor 1 at once
        pool.stall_timeout = 30
        first = pool.take()
        assert pool.in_flight == 1  # the read is taken with its last batch
        gate.touch()
        second = pool.take()
    finally:
        gate.touch()
        pool.close()
    assert [b["id"].tolist() for b in first.batches] == [list(range(900, 1000))]
    assert [b["id"].tolist() for b in second.batches] == [list(range(1000, 1100))]
    assert pool.in_flight == 0 and pool.rebuilt == 1


def test_an_actors_result_holds_each_rows_bytes_once(data: str) -> None:
    """(No cluster.) Without a transform a read's batches are row ranges of a few converted
    arrays (``TaskResult.slices``): the actor sends those alone, not the batches beside them
    (before: every row's bytes twice in the object), and the pool cuts the same batches."""
    work = BatchWork(Source(data, ["id", "x"]), Order(1500), None, "numpy")
    shipment = Shipment.of(work)
    actor = BatchActor(
        (shipment.data, [np.frombuffer(b.raw(), np.uint8) for b in shipment.buffers])
    )
    task = next(read_tasks(0, Plan(1500, 100), 8, range(0, 8), ramp=False))
    sent = actor.run(task)
    buffers: list[pickle.PickleBuffer] = []
    pickle.dumps(sent, protocol=5, buffer_callback=buffers.append)
    row_bytes = 800 * (8 + 64 * 4)  # id int64, x float32[64]
    assert row_bytes <= sum(b.raw().nbytes for b in buffers) < 1.1 * row_bytes
    got, local = sent.after_transport().batches, work(task).batches
    assert [digest(b) for b in got] == [digest(b) for b in local]


def test_actors_without_a_transform_deliver_the_thread_workers_batches(
    cluster: Any, data: str
) -> None:
    """The batches cut in this process from the arrays an actor sent are the batches."""
    settings: dict[str, Any] = {"batch_size": 100, "columns": ["id", "x"], "shuffle": True}
    with ll.Loader(data, **settings, num_workers=2) as local:
        expected = [digest(b) for b in local]
    source = ll.Loader(data, **settings, worker_type="ray", num_workers=2)
    with source:
        got = [digest(b) for b in warm(source)]
    assert got == expected
    assert source.stats(epoch=None).local_s == 0  # every batch came from an actor
