"""lanceloader.torch: MapDataset, collate, Sampler, BatchSampler, IterableDataset.

Multi-process tests use a forkserver that has imported lanceloader.torch but never opened Lance
(workers start in milliseconds and are fork-safe), one spawn case for both collates, and one fresh
subprocess for fork (this test process has used Lance, so its fork children would all be tainted).
Every DataLoader with workers has a timeout, so a hang fails instead of blocking.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import subprocess
import sys
import textwrap

import lance
import numpy as np
import pyarrow as pa
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, default_collate
from torchdata.stateful_dataloader import StatefulDataLoader

import lanceloader as ll
import lanceloader.integrations.torch as integration
from lanceloader.integrations.torch import collation
from lanceloader.integrations.torch.collation import SHM_DIR, SharedBatch, pack_for_transfer
from lanceloader.lifecycle.lifetime import shm_name
from lanceloader.ordering.order import Order
from lanceloader.ordering.plan import Plan
from lanceloader.torch import BatchSampler, IterableDataset, MapDataset, Rows, Sampler, collate

MODES = {
    "sequential": {},
    "block": {"shuffle": True, "shuffle_block_size": 16, "shuffle_window": 4},
    "full": {"shuffle": True},
}
pytestmark = [
    pytest.mark.filterwarnings("ignore:The given NumPy array is not writable"),
    pytest.mark.filterwarnings("ignore:'set_vital' is deprecated"),
]
TIMEOUT = 60  # seconds a DataLoader worker may take for one batch before the test fails
FAST = settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def batch_ids(batches) -> list[list[int]]:
    return [b["id"].tolist() for b in batches]


def loader_batches(uri: str, epoch: int = 0, **kwargs) -> list[list[int]]:
    loader = ll.Loader(uri, **{"columns": ["id"], **kwargs})
    loader.set_epoch(epoch)
    return batch_ids(loader)


def reference(
    n: int,
    batch: int,
    world: int,
    rank: int,
    drop_last: bool,
    mode: str,
    seed: int = 0,
    epoch: int = 0,
    start: int = 0,
) -> list[list[int]]:
    """The spec: Order.positions of Plan.batch_samples."""
    kw = MODES[mode]
    block = kw.get("shuffle_block_size", 1)
    window = kw.get("shuffle_window", 8 if block > 1 else 1)
    order = Order(n, kw.get("shuffle", False), block, window, seed)
    plan = Plan(n, batch, world, rank, drop_last, start)
    return [order.positions(epoch, plan.batch_samples(b)).tolist() for b in range(len(plan))]


# --- MapDataset ----------------------------------------------------------------------------------


def test_map_dataset_rows_and_batches(small_uri: str) -> None:
    ds = MapDataset(small_uri, columns=["id", "x", "text"])
    assert len(ds) == 1000
    row = ds[7]
    assert row["id"].item() == 7 and row["id"].ndim == 0
    assert row["x"].shape == (64,) and isinstance(row["text"], str)
    rows = ds.__getitems__([5, 999, 5, 0])
    assert isinstance(rows, Rows) and isinstance(rows, list) and len(rows) == 4
    assert list.__len__(rows) == 0  # nothing cut into rows yet
    fast, slow = collate(rows), default_collate(rows)
    assert fast is rows.batch and fast["id"].tolist() == [5, 999, 5, 0]
    assert slow.keys() == fast.keys()
    for name in ("id", "x"):
        assert torch.equal(fast[name], slow[name])
    assert slow["text"] == fast["text"]
    assert pickle.loads(pickle.dumps(rows))[1]["id"].item() == 999  # pickles as a plain list


def test_map_dataset_filter_split_transform_and_outputs(small_uri: str) -> None:
    ds = MapDataset(small_uri, columns=["id"], filter="id % 3 = 0")
    assert len(ds) == 334 and ds[2]["id"].item() == 6
    train = MapDataset(small_uri, columns=["id"], splits={"a": 0.5, "b": 0.5}, split="a")
    val = MapDataset(small_uri, columns=["id"], splits={"a": 0.5, "b": 0.5}, split="b")
    ids = collate(train.__getitems__(range(len(train))))["id"].tolist()
    ids += collate(val.__getitems__(range(len(val))))["id"].tolist()
    assert sorted(ids) == list(range(1000))

    def double(batch: pa.RecordBatch) -> pa.RecordBatch:
        return pa.record_batch({"id2": pa.compute.multiply(batch.column("id"), 2)})

    assert collate(MapDataset(small_uri, columns=["id"], transform=double).__getitems__([3]))[
        "id2"
    ].tolist() == [6]
    assert isinstance(MapDataset(small_uri, columns=["id"], output="numpy")[1]["id"], np.int64)
    assert MapDataset(small_uri, columns=["id"], output="python")[1] == {"id": 1}
    arrow = MapDataset(small_uri, columns=["id"], output="arrow")
    assert collate(arrow.__getitems__([4, 2])).column("id").to_pylist() == [4, 2]
    opaque = MapDataset(small_uri, columns=["id"], transform=lambda b: b.num_rows)
    assert collate(opaque.__getitems__([1, 2])) == 2  # passed through untouched
    with pytest.raises(TypeError, match=r"collate_fn=lanceloader\.torch\.collate"):
        default_collate(opaque.__getitems__([1, 2]))


def test_map_dataset_clear_errors(small_uri: str) -> None:
    ds = MapDataset(small_uri, columns=["id"])
    with pytest.raises(IndexError, match=r"index -1 is out of range .* 1000 rows .*negative"):
        ds[-1]
    with pytest.raises(IndexError, match="index 1000 is out of range"):
        ds.__getitems__([0, 1000])
    with pytest.raises(TypeError, match="index must be an int, got '3'"):
        ds["3"]
    with pytest.raises(TypeError, match="indices must be a flat sequence of ints"):
        ds.__getitems__([[1, 2]])
    with pytest.raises(TypeError, match=r"transform must be a function .* a list of them, or None"):
        MapDataset(small_uri, transform=3)
    with pytest.raises(ValueError, match="on_error must be 'raise', 'skip' or a function"):
        MapDataset(small_uri, on_error="ignore")
    with pytest.raises(ValueError, match=r"unknown columns \['nope'\]"):
        MapDataset(small_uri, columns=["nope"])
    with pytest.raises(ValueError, match="output must be one of"):
        MapDataset(small_uri, output="jpeg")

    def broken(batch):
        raise KeyError("boom")

    with pytest.raises(KeyError) as info:
        MapDataset(small_uri, columns=["id"], transform=broken).__getitems__([8, 9])
    assert "preparing rows [8, 9]" in str(info.value.__notes__)


def test_map_dataset_transform_lists_and_skipped_rows(small_uri: str) -> None:
    import lanceloader as ll

    add = ll.map_rows(lambda row: {"id": row["id"] + 1})
    inverse = ll.map_rows(lambda row: {"id": row["id"], "inv": 100 // (row["id"] % 10)})
    ds = MapDataset(small_uri, columns=["id"], transform=[add, inverse], on_error="skip")
    direct = collate(ds.__getitems__([8, 9, 10]))  # 9 + 1 = 10: 100 // 0 fails, row skipped
    assert direct["id"].tolist() == [9, 11] and direct["inv"].tolist() == [11, 100]
    sampler = BatchSampler(ds, batch_size=10)  # read ahead: the same policy in its thread
    ids = [b["id"].tolist() for b in DataLoader(ds, batch_sampler=sampler, collate_fn=collate)]
    assert len(ids) == 100 and all(len(b) == 9 for b in ids)
    assert sorted(i for b in ids for i in b) == [i for i in range(1, 1001) if i % 10]
    lenient = MapDataset(
        small_uri, columns=["id"], transform=[add, inverse], on_error="skip", max_skip_fraction=1.0
    )  # a batch of one row may lose it
    with pytest.raises(
        IndexError,
        match=r"row 9 was skipped: its transform failed and "
        r"on_error='skip'",
    ):
        lenient[9]
    strict = MapDataset(small_uri, columns=["id"], transform=[add, inverse])
    with pytest.raises(ZeroDivisionError):
        strict.__getitems__([9])


def test_read_ahead_serves_only_the_rows_asked_for(small_uri: str) -> None:
    ds = MapDataset(small_uri, columns=["id"])
    sampler = BatchSampler(ds, batch_size=50, shuffle=True, seed=1)
    batches = list(sampler)
    assert all(b.batch == i and b.epoch == 0 for i, b in enumerate(batches))
    assert pickle.loads(pickle.dumps(batches[3])).plan == batches[3].plan
    order = [3, 4, 5, 0, 9, 10, 2, 19]  # skips and jumps back: the stream restarts
    for i in order:
        assert collate(ds.__getitems__(batches[i]))["id"].tolist() == list(batches[i])
    batches[7].sort()  # changed after the sampler made it: read as asked
    assert collate(ds.__getitems__(batches[7]))["id"].tolist() == sorted(batches[7])


def test_read_ahead_error_surfaces_at_its_own_batch(small_uri: str) -> None:
    def fail_on_id_500(batch: pa.RecordBatch) -> pa.RecordBatch:
        if 500 in batch.column("id").to_pylist():
            raise ValueError("bad row 500")
        return batch

    # Read ahead in reads of batches [0], [1, 2], [3, 4], [5, 6] (two at most with a transform):
    # the fourth fails for batch 5.
    ds = MapDataset(small_uri, columns=["id"], transform=fail_on_id_500)
    sampler = BatchSampler(ds, batch_size=100)
    delivered = []
    with pytest.raises(ValueError, match="bad row 500") as info:
        for batch in DataLoader(ds, batch_sampler=sampler, collate_fn=collate):
            delivered.append(batch["id"][0].item())
    assert delivered == [0, 100, 200, 300, 400]
    assert "preparing rows [500, 501" in " ".join(info.value.__notes__)


@pytest.mark.parametrize("collate_fn", [None, collate], ids=["default", "custom"])
def test_dataloader_in_process_matches_loader(small_uri: str, collate_fn) -> None:
    ds = MapDataset(small_uri, columns=["id", "x"])
    sampler = BatchSampler(ds, batch_size=64, shuffle=True, seed=5)
    loader = DataLoader(ds, batch_sampler=sampler, collate_fn=collate_fn)
    assert len(loader) == 16
    assert batch_ids(loader) == loader_batches(small_uri, batch_size=64, shuffle=True, seed=5)
    assert batch_ids(loader) == loader_batches(small_uri, 1, batch_size=64, shuffle=True, seed=5)


def both_collates(rows: Rows) -> tuple[dict, dict]:
    """torch's default collate and ours on the same rows, in the same worker."""
    return default_collate(rows), collate(rows)


@pytest.mark.parametrize(
    "context,collate_fn",
    [("forkserver", None), ("forkserver", collate), ("spawn", both_collates)],
    ids=["forkserver-default", "forkserver-custom", "spawn-default-and-custom"],
)
def test_dataloader_workers(small_uri: str, forkserver, context: str, collate_fn) -> None:
    ds = MapDataset(small_uri, columns=["id", "x", "text"])
    sampler = BatchSampler(ds, batch_size=100, shuffle=True, shuffle_block_size=8, seed=2)
    loader = DataLoader(
        ds,
        batch_sampler=sampler,
        collate_fn=collate_fn,
        num_workers=2,
        timeout=TIMEOUT,
        multiprocessing_context=forkserver if context == "forkserver" else context,
    )
    outputs = list(loader)
    expected = loader_batches(small_uri, batch_size=100, shuffle=True, shuffle_block_size=8, seed=2)
    for batches in zip(*outputs, strict=True) if collate_fn is both_collates else [outputs]:
        assert batch_ids(batches) == expected
        assert batches[0]["x"].shape == (100, 64) and len(batches[0]["text"]) == 100
        assert (batches[0]["id"].dtype, batches[0]["x"].dtype) == (torch.int64, torch.float32)


def leftover_batch_files() -> list[str]:
    """Batch files for this (training) process: the name starts with its pid."""
    return sorted(p.name for p in SHM_DIR.glob(f"lanceloader-batch-{os.getpid()}-*"))


def test_shared_batch_round_trip_keeps_every_value() -> None:
    batch = {
        "i": torch.arange(5),
        "b": torch.ones(5, 2, dtype=torch.bfloat16),
        "n": np.arange(5, dtype=np.uint16),
        "s": ["a", "b", "c", "d", "e"],
        "empty": torch.zeros(0, 3),
        "nested": {"f": torch.full((5,), 0.5), "o": np.array(["x"])},
        "grad": torch.zeros(2, requires_grad=True),
        "view": torch.arange(10)[::2],
    }
    rebuild, args = SharedBatch(batch).__reduce__()
    assert len(leftover_batch_files()) == 1  # one file per batch, whatever the columns
    out = rebuild(*args)
    assert leftover_batch_files() == [] and type(out) is dict
    for key in ("i", "b", "empty", "view"):
        assert out[key].dtype == batch[key].dtype and torch.equal(out[key], batch[key])
    assert out["n"].dtype == np.uint16 and out["n"].tolist() == [0, 1, 2, 3, 4]
    assert out["s"] == batch["s"] and out["nested"]["o"].tolist() == ["x"]
    assert torch.equal(out["nested"]["f"], batch["nested"]["f"])
    assert out["grad"].requires_grad  # left to torch's own pickling
    assert pack_for_transfer(batch) is batch  # not in a DataLoader worker: nothing to do


DTYPES = [
    torch.int8,
    torch.uint8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.bool,
]


@st.composite
def batch_values(draw, depth: int = 0):
    rows = draw(st.integers(0, 5))
    kind = draw(st.sampled_from(["tensor", "numpy", "text"] + (["dict"] if depth < 2 else [])))
    if kind == "dict":
        keys = draw(st.lists(st.sampled_from("abcd"), min_size=1, max_size=3, unique=True))
        return {k: draw(batch_values(depth + 1)) for k in keys}
    if kind == "text":
        return [draw(st.text(max_size=3)) for _ in range(rows)]
    shape = (rows, *draw(st.lists(st.integers(1, 3), max_size=2)))
    values = torch.randint(0, 100, shape).to(draw(st.sampled_from(DTYPES)))
    if draw(st.booleans()) and values.ndim > 1:
        values = values.transpose(0, -1)  # not contiguous: travels as a copy
    return values.numpy() if kind == "numpy" and values.dtype != torch.bfloat16 else values


def same(a, b) -> bool:
    if isinstance(a, dict):
        return type(b) is dict and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    return a == b


@FAST
@given(batch=st.dictionaries(st.sampled_from("xyz"), batch_values(), min_size=1))
def test_shared_batch_round_trips_any_batch(batch) -> None:
    rebuild, args = SharedBatch(batch).__reduce__()
    assert same(batch, rebuild(*args)) and leftover_batch_files() == []


def test_what_shared_batch_cannot_pack_travels_the_torch_way(monkeypatch) -> None:
    class Tagged(torch.Tensor):
        pass

    odd = {
        "f8": torch.zeros(3).to(torch.float8_e4m3fn),  # no NumPy dtype
        "sub": torch.arange(3).as_subclass(Tagged),  # a subclass keeps its type
        "rows": [torch.arange(2), torch.arange(3)],  # lists are left to torch
        "conj": torch.tensor([1 + 2j]).conj(),  # lazily conjugated: packed resolved
        "plain": torch.arange(4),
    }
    rebuild, args = SharedBatch(odd).__reduce__()
    out = rebuild(*args)
    assert out["f8"].dtype == torch.float8_e4m3fn and type(out["sub"]) is Tagged
    assert [r.tolist() for r in out["rows"]] == [[0, 1], [0, 1, 2]]
    assert out["conj"].tolist() == [1 - 2j] and out["plain"].tolist() == [0, 1, 2, 3]
    assert leftover_batch_files() == []

    def full(path, arrays):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(collation, "write_arrays", full)
    rebuild, args = SharedBatch({"plain": torch.arange(4)}).__reduce__()
    assert rebuild is dict and rebuild(*args)["plain"].tolist() == [0, 1, 2, 3]  # never lost
    assert leftover_batch_files() == []


def test_shared_batch_is_written_as_default_convert_leaves_it() -> None:
    shared = SharedBatch({"n": np.arange(3), "s": ["a", "b", "c"]})
    converted = torch.utils.data.default_convert(shared)  # DataLoader's batch_size=None collate
    assert type(converted) is SharedBatch and leftover_batch_files() == []  # nothing written yet
    rebuild, args = converted.__reduce__()
    out = rebuild(*args)
    assert isinstance(out["n"], torch.Tensor) and out["n"].tolist() == [0, 1, 2]
    assert out["s"] == ["a", "b", "c"] and leftover_batch_files() == []


def test_iterable_batches_cross_from_workers_as_files(small_uri, forkserver) -> None:
    ds = IterableDataset(small_uri, 100, columns=["id", "x"], output="numpy", num_workers=1)
    loader = DataLoader(
        ds, batch_size=None, num_workers=2, multiprocessing_context=forkserver, timeout=TIMEOUT
    )
    before = collation.batches_received
    batches = list(loader)
    assert collation.batches_received - before == len(batches) == 10  # all came as files
    assert [b["id"].tolist() for b in batches] == loader_batches(small_uri, batch_size=100)
    assert isinstance(batches[0]["x"], torch.Tensor)  # default_convert's work is kept
    assert leftover_batch_files() == []


def test_batches_cross_from_workers_as_files_and_none_is_left(small_uri, forkserver) -> None:
    ds = MapDataset(small_uri, columns=["id", "x", "text"])
    sampler = BatchSampler(ds, batch_size=50, shuffle=True, seed=3)
    loader = DataLoader(
        ds,
        batch_sampler=sampler,
        collate_fn=collate,
        num_workers=2,
        timeout=TIMEOUT,
        multiprocessing_context=forkserver,
        prefetch_factor=4,
    )
    before = collation.batches_received
    it = iter(loader)
    first = [next(it) for _ in range(3)]
    assert collation.batches_received - before >= 3  # they came as files
    assert type(first[0]) is dict and first[0]["x"].shape == (50, 64)
    del it  # a break: workers stop with batches still in flight, which they delete
    assert leftover_batch_files() == []
    expected = loader_batches(small_uri, epoch=1, batch_size=50, shuffle=True, seed=3)
    assert batch_ids(loader) == expected  # the next epoch, whole
    assert leftover_batch_files() == []


FORK_SCRIPT = textwrap.dedent(
    """
    import json, pickle, sys
    from torch.utils.data import DataLoader
    from lanceloader.torch import BatchSampler, IterableDataset, collate

    with open(sys.argv[1], "rb") as f:
        ds = pickle.load(f)   # built in another process: this one has not opened Lance
    out = {}

    def run(name, dataset, **kw):
        loader = DataLoader(dataset, num_workers=2, multiprocessing_context="fork", timeout=60,
                            **kw)
        out[name] = [b["id"].tolist() for b in loader]

    for name, fn in (("clean default", None), ("clean custom", collate)):
        run(name, ds, batch_sampler=BatchSampler(ds, batch_size=100, shuffle=True, seed=1),
            collate_fn=fn)
    ds[0]                     # Lance runs in this process now: fork children are tainted
    run("tainted map", ds, batch_sampler=BatchSampler(ds, batch_size=100, shuffle=True, seed=1),
        collate_fn=collate)
    iterable = IterableDataset(ds.source.uri, 100, columns=["id"], shuffle=True, seed=1)
    run("tainted iterable", iterable, batch_size=None)
    print(json.dumps(out))
    """
)


def test_fork_workers_clean_parent_reads_directly_tainted_parent_via_clean_reader(
    small_uri: str, tmp_path
) -> None:
    """With fork, workers of a parent that never opened Lance read themselves; workers of one
    that did are tainted and read through lanceloader's clean reader (a warning, no hang)."""
    path = tmp_path / "ds.pkl"
    path.write_bytes(pickle.dumps(MapDataset(small_uri, columns=["id"])))
    done = subprocess.run(
        [sys.executable, "-c", FORK_SCRIPT, str(path)], capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    expected = loader_batches(small_uri, batch_size=100, shuffle=True, seed=1)
    assert out == dict.fromkeys(out, expected) and len(out) == 4
    # Said once, by the parent, at the user's line (the script's), with the fix; Lance's own
    # warning (at every fork, the safe ones too) is not shown.
    assert done.stderr.count("forking a process that has already run Lance") == 1, done.stderr
    assert re.search(r"<string>:\d+: RuntimeWarning: lanceloader: forking", done.stderr)
    assert "multiprocessing_context='forkserver'" in done.stderr
    assert "lance is not fork-safe" not in done.stderr


KILLED_WORKER_SCRIPT = textwrap.dedent(
    """
    import json, multiprocessing, os, signal, sys, time
    from pathlib import Path
    from torch.utils.data import DataLoader
    from lanceloader.torch import BatchSampler, MapDataset, collate

    if __name__ == "__main__":
        ds = MapDataset(sys.argv[1], columns=["id", "x"])
        loader = DataLoader(ds, batch_sampler=BatchSampler(ds, batch_size=10), collate_fn=collate,
                            num_workers=2, prefetch_factor=8, timeout=60,
                            multiprocessing_context=multiprocessing.get_context("spawn"))
        it = iter(loader)
        next(it)
        time.sleep(2)  # the workers fill their queues: batches in flight, as files
        pids = [w.pid for w in it._workers]
        files = lambda: [p.name for p in Path("/dev/shm").glob("lanceloader-batch-*")
                         if any(f"-{pid}-" in p.name for pid in pids)]
        in_flight = len(files())
        os.kill(pids[0], signal.SIGKILL)
        try:
            for _ in it:
                pass
        except RuntimeError as exc:
            error = str(exc)
        print(json.dumps({"pid": os.getpid(), "pids": pids, "in_flight": in_flight,
                          "error": error}))
    """
)


def test_training_process_deletes_its_workers_leftovers_at_exit() -> None:
    code = textwrap.dedent(
        """
        import os
        from pathlib import Path
        import lanceloader.integrations.torch.collation  # registers the exit clean-up
        from lanceloader.lifecycle.lifetime import shm_name
        for owner in (os.getpid(), os.getppid()):  # left by killed workers
            Path("/dev/shm", shm_name("batch", owner, 999, "abc", 0)).write_bytes(b"x")
        print(os.getpid())
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    pid = int(done.stdout.split()[-1])
    assert not (SHM_DIR / shm_name("batch", pid, 999, "abc", 0)).exists()
    other = SHM_DIR / shm_name("batch", os.getpid(), 999, "abc", 0)  # the script's parent
    assert other.exists()  # another (live) training process's files are not ours to delete
    other.unlink()


def test_killed_dataloader_worker_leaves_no_batch_files(small_uri: str, tmp_path) -> None:
    script = tmp_path / "killed_worker.py"
    script.write_text(KILLED_WORKER_SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script), small_uri], capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    # torch reports the death from its SIGCHLD handler or from its next queue poll, whichever
    # comes first: "is killed by signal: Killed." or "exited unexpectedly".
    assert out["in_flight"] > 0 and re.search(
        r"killed by signal|exited unexpectedly", out["error"]
    ), out["error"]
    left = [p.name for p in SHM_DIR.glob(f"lanceloader-batch-{out['pid']}-*")]
    # What was sent was taken (and deleted) by the training process; the surviving worker
    # deleted its own at exit, and the training process, at its exit, the killed worker's.
    assert left == []


# --- samplers ------------------------------------------------------------------------------------


@FAST
@given(
    n=st.integers(0, 300),
    batch=st.integers(1, 40),
    world=st.integers(1, 4),
    drop_last=st.booleans(),
    mode=st.sampled_from(sorted(MODES)),
    seed=st.integers(0, 3),
)
def test_batch_sampler_is_order_of_plan_on_every_rank(n, batch, world, drop_last, mode, seed):
    per_rank = []
    for rank in range(world):
        s = BatchSampler(
            n,
            batch_size=batch,
            rank=rank,
            world_size=world,
            drop_last=drop_last,
            seed=seed,
            **MODES[mode],
        )
        got = list(s)
        assert got == reference(n, batch, world, rank, drop_last, mode, seed)
        assert len(got) == len(s) == len(reference(n, batch, world, 0, drop_last, mode, seed))
        per_rank.append(got)
    flat = sorted(i for rank in per_rank for b in rank for i in b)
    if not drop_last:
        assert sorted(set(flat)) == list(range(n))


@FAST
@given(
    n=st.integers(0, 300),
    world=st.integers(1, 4),
    drop_last=st.booleans(),
    mode=st.sampled_from(sorted(MODES)),
)
def test_sampler_is_distributed_sampler_slicing_of_our_order(n, world, drop_last, mode):
    lists = [
        list(Sampler(n, rank=r, world_size=world, drop_last=drop_last, **MODES[mode]))
        for r in range(world)
    ]
    assert len({len(x) for x in lists}) <= 1
    for r, got in enumerate(lists):
        assert got == [b[0] for b in reference(n, 1, world, r, drop_last, mode)]
    if not drop_last:
        assert sorted({i for x in lists for i in x}) == list(range(n))


@FAST
@given(n=st.integers(1, 200), data=st.data())
def test_plan_samples_equals_plan(n, data) -> None:
    batch, world = data.draw(st.integers(1, 20)), data.draw(st.integers(1, 4))
    plan = Plan(n, batch, world, data.draw(st.integers(0, world - 1)), data.draw(st.booleans()))
    lo = data.draw(st.integers(0, len(plan)))
    batches = range(lo, data.draw(st.integers(lo, len(plan))), data.draw(st.integers(1, 5)))
    samples, sizes = plan.samples(batches)
    expected = [plan.batch_samples(b) for b in batches]
    assert sizes == [len(s) for s in expected]
    assert samples.tolist() == [i for s in expected for i in s.tolist()]


def test_epochs_advance_per_iteration_and_unstarted_iterators_do_not_count() -> None:
    s = BatchSampler(50, batch_size=10, shuffle=True, seed=4)
    iter(s), iter(s)  # made but never advanced, as DataLoader does
    e0 = list(s)
    assert s.epoch == 1
    e1 = list(s)
    assert e0 == reference(50, 10, 1, 0, False, "full", 4, 0) and e0 != e1
    assert e1 == reference(50, 10, 1, 0, False, "full", 4, 1)
    it = iter(s)
    next(it)
    assert s.epoch == 3  # a started iteration counts, finished or not
    s.set_epoch(0)
    assert list(s) == e0


@FAST
@given(
    n=st.integers(1, 300),
    batch=st.integers(1, 30),
    world=st.integers(1, 3),
    new_world=st.integers(1, 3),
    mode=st.sampled_from(sorted(MODES)),
    data=st.data(),
)
def test_sampler_resume_exact_and_elastic(n, batch, world, new_world, mode, data) -> None:
    def make(rank: int, w: int) -> BatchSampler:
        return BatchSampler(n, batch_size=batch, rank=rank, world_size=w, seed=1, **MODES[mode])

    samplers = [make(r, world) for r in range(world)]
    iters = [iter(s) for s in samplers]
    steps = data.draw(st.integers(0, len(samplers[0])))
    for it in iters:
        for _ in range(steps):
            next(it)
    states = [s.state_dict() for s in samplers]
    assert all(st == states[0] for st in states)  # every rank saves the same state
    state = json.loads(json.dumps(states[0]))
    resumed = make(0, world)
    resumed.load_state_dict(state)
    assert list(resumed) == list(iters[0])  # the exact rest
    # Elastic: on new_world ranks, the global batches interleave the rest of the same order.
    order = reference(n, n, 1, 0, False, mode, seed=1)[0]
    rest = order[state["sample"] :]
    ranks = [make(r, new_world) for r in range(new_world)]
    for r in ranks:
        r.load_state_dict(state)
    per_rank = [list(r) for r in ranks]
    merged = [i for batches in zip(*per_rank, strict=True) for b in batches for i in b]
    assert merged[: len(rest)] == rest


def test_sampler_state_is_a_loader_state(small_uri: str) -> None:
    ds = MapDataset(small_uri, columns=["id"])
    sampler = BatchSampler(ds, batch_size=100, shuffle=True, seed=3)
    loader = ll.Loader(small_uri, batch_size=100, columns=["id"], shuffle=True, seed=3)
    it = iter(sampler)
    next(it), next(it)
    state = sampler.state_dict()
    assert state["format"] == 2 and state["sample"] == 200
    assert state["fingerprint"] == loader.state_dict()["fingerprint"]
    rest = list(it)
    loader.load_state_dict(state)
    assert batch_ids(loader) == rest
    other = BatchSampler(len(ds), batch_size=50, shuffle=True, seed=3)  # from a length
    other.load_state_dict(state, allow_changes=("batch_size",))
    assert len(other) == 16
    assert [i for b in other for i in b] == [i for b in rest for i in b]


def test_sampler_clear_errors(small_uri: str) -> None:
    with pytest.raises(ValueError, match="batch_size must be >= 1, got 0"):
        BatchSampler(10, batch_size=0)
    with pytest.raises(ValueError, match="pass both rank= and world_size="):
        Sampler(10, rank=1)
    with pytest.raises(ValueError, match=r"rank must lie in \[0, world_size=2\), got 2"):
        Sampler(10, rank=2, world_size=2)
    with pytest.raises(TypeError, match="data_source_or_len must be"):
        Sampler(1.5)
    with pytest.raises(ValueError, match="data_source_or_len must be >= 0"):
        Sampler(-1)
    with pytest.raises(ValueError, match="shuffle_block_size must be >= 1"):
        Sampler(10, shuffle=True, shuffle_block_size=0)
    state = BatchSampler(10, batch_size=2, shuffle=True, seed=0).state_dict()
    with pytest.raises(ll.StateMismatchError, match="'seed': state has 0, this loader has 1"):
        BatchSampler(10, batch_size=2, shuffle=True, seed=1).load_state_dict(state)
    with pytest.raises(ll.StateMismatchError, match="batch_size: state has 2"):
        BatchSampler(10, batch_size=3, shuffle=True, seed=0).load_state_dict(state)
    with pytest.raises(ll.StateMismatchError, match="state has no 'format' key"):
        Sampler(10).load_state_dict({"epoch": 1})
    with pytest.raises(TypeError, match="samplers index map-style datasets; IterableDataset"):
        Sampler(IterableDataset(small_uri, 10))


# --- StatefulDataLoader: map-style ---------------------------------------------------------------


def _map_loader(ds, workers: int, forkserver=None, **kw) -> StatefulDataLoader:
    sampler = BatchSampler(ds, batch_size=64, shuffle=True, shuffle_block_size=4, seed=9, **kw)
    extra = {"multiprocessing_context": forkserver, "timeout": TIMEOUT} if workers else {}
    return StatefulDataLoader(
        ds, batch_sampler=sampler, collate_fn=collate, num_workers=workers, **extra
    )


def _check_resume(make, expected, expected_next, stop: int, finish: bool = False) -> None:
    """Stop after ``stop`` batches (and see the end of the epoch if ``finish``), save, resume in a
    fresh loader: the rest of the epoch, then the next epoch. A state saved after the loop saw
    the end resumes at the next epoch (torchdata's rule)."""
    first = make()
    it = iter(first)
    got = [next(it)["id"].tolist() for _ in range(stop)]
    if finish:
        assert next(it, None) is None
    state = first.state_dict()
    del it, first
    resumed = make()
    resumed.load_state_dict(state)
    if not finish:
        assert got + batch_ids(resumed) == expected
    if expected_next is not None:
        assert batch_ids(resumed) == expected_next


@FAST
@given(data=st.data())
def test_stateful_dataloader_map_resume_in_process(small_uri: str, data) -> None:
    ds = MapDataset(small_uri, columns=["id"])
    args = {"batch_size": 64, "shuffle": True, "shuffle_block_size": 4, "seed": 9}
    expected = [loader_batches(small_uri, e, **args) for e in (0, 1)]
    stop = data.draw(st.integers(0, len(expected[0])))
    finish = stop == len(expected[0]) and data.draw(st.booleans())
    _check_resume(lambda: _map_loader(ds, 0), expected[0], expected[1], stop, finish)


@pytest.mark.parametrize("stop,finish", [(5, False), (16, False), (16, True)])
def test_stateful_dataloader_map_resume_with_workers(small_uri, forkserver, stop, finish) -> None:
    ds = MapDataset(small_uri, columns=["id"])
    args = {"batch_size": 64, "shuffle": True, "shuffle_block_size": 4, "seed": 9}
    expected = [loader_batches(small_uri, e, **args) for e in (0, 1)]
    make = lambda: _map_loader(ds, 2, forkserver)  # noqa: E731
    _check_resume(make, expected[0], expected[1], stop, finish)


def test_stateful_dataloader_with_per_sample_sampler(small_uri: str) -> None:
    """torchdata wraps a sampler in its own stateful BatchSampler, which saves ours."""
    ds = MapDataset(small_uri, columns=["id"])
    order = list(Sampler(ds, shuffle=True, shuffle_block_size=8, seed=4))
    expected = [order[i : i + 64] for i in range(0, len(order), 64)]

    def make() -> StatefulDataLoader:
        sampler = Sampler(ds, shuffle=True, shuffle_block_size=8, seed=4)
        return StatefulDataLoader(ds, sampler=sampler, batch_size=64, collate_fn=collate)

    for stop in (0, 7):
        _check_resume(make, expected, None, stop)


# --- IterableDataset -----------------------------------------------------------------------------

ITER_ARGS = {"columns": ["id"], "shuffle": True, "seed": 2, "output": "torch", "num_workers": 1}


def test_iterable_in_process_matches_loader_and_advances(small_uri: str) -> None:
    ds = IterableDataset(small_uri, 96, **ITER_ARGS)
    loader = DataLoader(ds, batch_size=None)
    assert len(loader) == len(ds) == 11
    assert batch_ids(loader) == loader_batches(small_uri, 0, batch_size=96, **ITER_ARGS)
    assert batch_ids(loader) == loader_batches(small_uri, 1, batch_size=96, **ITER_ARGS)
    ds.set_epoch(0)
    assert batch_ids(loader) == loader_batches(small_uri, 0, batch_size=96, **ITER_ARGS)


@pytest.mark.parametrize("workers", [2, 3])
def test_iterable_worker_striding_in_process(small_uri, monkeypatch, workers) -> None:
    """Worker w delivers batches w, w + W, ...: round-robin gives the Loader's order."""
    ds = IterableDataset(small_uri, 64, rank=1, world_size=2, drop_last=False, **ITER_ARGS)
    per_worker = []
    for w in range(workers):
        monkeypatch.setattr(integration.iterable, "_worker_slot", lambda w=w: (w, workers))
        per_worker.append(batch_ids(iter(ds)))
        ds.set_epoch(0)
    merged = [b for group in _round_robin(per_worker) for b in group]
    assert merged == loader_batches(small_uri, batch_size=64, rank=1, world_size=2, **ITER_ARGS)


def _round_robin(lists):
    longest = max(map(len, lists))
    return [[x[i] for x in lists if i < len(x)] for i in range(longest)]


def test_iterable_dataloader_workers_in_order_and_epochs(small_uri: str, forkserver) -> None:
    ds = IterableDataset(small_uri, 96, **ITER_ARGS)
    loader = DataLoader(
        ds,
        batch_size=None,
        num_workers=2,
        persistent_workers=True,
        multiprocessing_context=forkserver,
        timeout=TIMEOUT,
    )
    for epoch in (0, 1):
        assert batch_ids(loader) == loader_batches(small_uri, epoch, batch_size=96, **ITER_ARGS)


@pytest.mark.parametrize(
    "workers,persistent,stops",
    [
        (0, False, ((0, False), (4, False), (11, False), (11, True))),
        (2, True, ((3, False), (11, False), (11, True))),
        (2, False, ((6, False),)),
    ],
)
def test_stateful_dataloader_iterable_resume(small_uri, forkserver, workers, persistent, stops):
    expected = [loader_batches(small_uri, e, batch_size=96, **ITER_ARGS) for e in (0, 1)]
    extra = {"multiprocessing_context": forkserver, "timeout": TIMEOUT} if workers else {}

    def make() -> StatefulDataLoader:
        ds = IterableDataset(small_uri, 96, **ITER_ARGS)
        return StatefulDataLoader(
            ds, batch_size=None, num_workers=workers, persistent_workers=persistent, **extra
        )

    # Fresh (not persistent) workers copy the dataset each epoch: the next epoch needs set_epoch.
    following = expected[1] if persistent or not workers else None
    for stop, finish in stops:
        _check_resume(make, expected[0], following, stop, finish)


def test_iterable_state_is_a_loader_state_and_errors(small_uri: str, monkeypatch) -> None:
    ds = IterableDataset(small_uri, 100, **ITER_ARGS)
    it = iter(ds)
    next(it), next(it), next(it)
    state = ds.state_dict()
    assert "worker" not in state and state["sample"] == 300
    loader = ll.Loader(small_uri, batch_size=100, **ITER_ARGS)
    loader.load_state_dict(state)
    assert batch_ids(loader) == batch_ids(it)
    monkeypatch.setattr(integration.iterable, "_worker_slot", lambda: (1, 2))
    worker_state = IterableDataset(small_uri, 100, **ITER_ARGS).state_dict()
    assert worker_state["worker"] == {"id": 1, "count": 2, "start": 0, "batches": 0}
    monkeypatch.setattr(integration.iterable, "_worker_slot", lambda: (0, 3))
    with pytest.raises(ll.StateMismatchError, match="saved by DataLoader worker 1 of 2"):
        IterableDataset(small_uri, 100, **ITER_ARGS).load_state_dict(worker_state)
    with pytest.raises(ValueError, match="worker_type='process': IterableDataset reads on threads"):
        IterableDataset(small_uri, 100, worker_type="process")


def test_iterable_error_names_the_real_batch(small_uri: str, monkeypatch) -> None:
    def fail_on_id_500(batch: pa.RecordBatch) -> pa.RecordBatch:
        if 500 in batch.column("id").to_pylist():
            raise ValueError("bad row")
        return batch

    monkeypatch.setattr(integration.iterable, "_worker_slot", lambda: (1, 2))
    ds = IterableDataset(small_uri, 100, columns=["id"], transform=fail_on_id_500, num_workers=1)
    with pytest.raises(ValueError, match="bad row") as info:
        list(ds)  # worker 1 of 2 reads batches 1, 3, 5, ...: id 500 is in batch 5
    assert "preparing batch 5 of epoch 0" in " ".join(info.value.__notes__)


def test_iterable_keeps_conversion_options_and_error_policy(tmp_path) -> None:
    import lance

    uri = str(tmp_path / "holes.lance")
    lance.write_dataset(
        pa.table({"id": pa.array(range(6)), "score": pa.array([1.0, None, 3.0, None, 5.0, 6.0])}),
        uri,
    )
    conversion = ll.Conversion(output="torch", fill_nulls={"score": -1.0})
    ds = IterableDataset(uri, 3, output=conversion, num_workers=1)
    assert [b["score"].tolist() for b in ds] == [[1.0, -1.0, 3.0], [-1.0, 5.0, 6.0]]
    halve = ll.map_rows(lambda row: {"id": row["id"], "half": 6 // (row["id"] % 3)})
    skipping = IterableDataset(
        uri, 3, columns=["id"], transform=halve, on_error="skip", output="torch", num_workers=1
    )
    assert [b["id"].tolist() for b in skipping] == [[1, 2], [4, 5]]


def test_importing_lanceloader_does_not_import_torch() -> None:
    code = "import sys, lanceloader, lanceloader.integrations; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "False", done.stderr


def test_iterable_dataset_and_read_ahead_record_stats(small_uri: str) -> None:
    """Every path through the engine records what it did (the IterableDataset used to record
    nothing)."""
    ds = IterableDataset(small_uri, 100, **ITER_ARGS)
    assert sum(len(b["id"]) for b in DataLoader(ds, batch_size=None)) == 1000
    stats = ds.stats()
    assert (stats.batches, stats.rows, stats.rows_read) == (10, 1000, 1000)
    mapped = MapDataset(small_uri, columns=["id"])
    loader = DataLoader(
        mapped, batch_sampler=BatchSampler(mapped, batch_size=100), collate_fn=collate
    )
    assert sum(len(b["id"]) for b in loader) == 1000
    assert mapped.stats().rows == 1000


def test_map_dataset_binary_columns_reach_default_collate_as_bytes(tmp_path) -> None:
    """A binary column converts to ll.ByteRows; torch's default collate cuts it into one bytes
    object per row (it raised 'cannot split a ByteRows')."""
    payloads = [bytes([i]) * (i + 1) for i in range(40)]
    uri = str(tmp_path / "raw.lance")
    lance.write_dataset(
        pa.table({"id": list(range(40)), "raw": pa.array(payloads, pa.binary())}), uri
    )
    ds = MapDataset(uri)
    assert ds[3]["raw"] == payloads[3]
    batches = list(DataLoader(ds, batch_size=16, shuffle=False))
    assert [b for batch in batches for b in batch["raw"]] == payloads
