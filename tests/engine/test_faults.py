"""Faults: the loader stops at once, never waits forever, names what broke and leaks nothing,
even when the training process is SIGKILLed. Real processes, real signals, real damaged files.

Time bounds here are correctness bounds (no hang, no waiting for busy work), several times the
measured times; the speed itself is measured in ``benchmarks/faults.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa
import pytest

import lanceloader as ll
import workerfns
from conftest import lanceloader_threads
from lanceloader.lifecycle.lifetime import NAMESPACE, SHM_DIR, alive, owner_of, shm_name
from lanceloader.rows.lance.source import Source

TESTS = str(Path(__file__).resolve().parents[1])  # tests/
STOP_BOUND_S = 1.0  # control is back this soon after break / an error / Ctrl-C (target 0.5 s)
GONE_BOUND_S = 5.0  # nothing is left this long after the training process is SIGKILLed


def shm_files(owner: int) -> list[str]:
    return sorted(
        p.name for p in SHM_DIR.glob(f"lanceloader-*-{owner}-*") if owner_of(p.name) == owner
    )


def fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def wait_until(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


class Leaks:
    """What this process holds before a test; ``check`` asserts it is back to that: no
    lanceloader thread, no worker process, no /dev/shm file of ours, no new fd, bounded RSS."""

    def __init__(self) -> None:
        lanceloader_threads()  # (collects what earlier tests left unreachable)
        self.fds, self.rss = fd_count(), rss_mb()

    def check(self, pids: list[int] = (), within: float = GONE_BOUND_S) -> None:
        workerfns.gate.set()  # thread workers left to finish their task detached end it now
        assert wait_until(lambda: not lanceloader_threads(), within), lanceloader_threads()
        assert wait_until(lambda: not any(alive(p) for p in pids), within), pids
        assert shm_files(os.getpid()) == []
        assert wait_until(lambda: fd_count() <= self.fds, within), (fd_count(), self.fds)
        assert rss_mb() - self.rss < 300, (rss_mb(), self.rss)
        workerfns.gate.clear()


def pool_pids(loader: ll.Loader) -> list[int]:
    it = loader._live.current()
    pool = it.stream._pool if it is not None else None
    return list(getattr(pool, "pids", []))


# --- stopping with busy workers ---------------------------------------------------------------


def busy_loader(uri: str, worker_type: str, workers: int) -> ll.Loader:
    """Every worker busy (for 20 s) right after the first batch."""
    return ll.Loader(
        uri,
        batch_size=10,
        columns=["id"],
        transform=workerfns.slow_after_first,
        num_workers=workers,
        worker_type=worker_type,
        prefetch=2 * workers,
    )


@pytest.mark.parametrize("workers", [1, 2, 4])
@pytest.mark.parametrize("worker_type", ["thread", "process"])
@pytest.mark.parametrize("how", ["break", "error", "ctrl-c"])
def test_stop_returns_at_once_whatever_the_workers_do(
    small_uri: str, how: str, worker_type: str, workers: int
) -> None:
    workerfns.gate.clear()
    loader = busy_loader(small_uri, worker_type, workers)
    leaks = Leaks()
    pids: list[int] = []
    if how == "break":
        for batch in loader:
            assert batch["id"][0] == 0
            pids = pool_pids(loader)
            time.sleep(0.3)  # the workers are on their slow batches now
            stopped = time.perf_counter()
            break
        del batch  # a batch from a process worker holds its shared-memory mapping (and an fd)
    elif how == "error":
        with pytest.raises(RuntimeError, match="the training step failed"):
            for batch in loader:
                assert batch["id"][0] == 0
                pids = pool_pids(loader)
                time.sleep(0.3)
                stopped = time.perf_counter()
                raise RuntimeError("the training step failed")
        del batch
    else:
        it = iter(loader)
        next(it)
        pids = pool_pids(loader)
        sent: list[float] = []

        def interrupt() -> None:
            sent.append(time.perf_counter())
            os.kill(os.getpid(), signal.SIGINT)

        # Python's own Ctrl-C handler, as in a training script (an earlier test may have
        # installed another one in this process: Ray Train does).
        previous = signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            threading.Timer(0.3, interrupt).start()
            with pytest.raises(KeyboardInterrupt):
                next(it)  # waits for a batch that takes 20 s
        finally:
            signal.signal(signal.SIGINT, previous)
        stopped = sent[0]
    took = time.perf_counter() - stopped
    assert took < STOP_BOUND_S, f"{how}: control came back after {took:.2f} s"
    assert worker_type == "thread" or len(pids) == workers
    leaks.check(pids)
    # The cursor kept its place: the next iteration continues after the first batch.
    assert loader.state_dict()["sample"] == 10


# --- stalls -------------------------------------------------------------------------------------


@pytest.mark.parametrize("worker_type", ["thread", "process"])
def test_a_stuck_transform_raises_stall_error_with_its_stack(
    small_uri: str, worker_type: str
) -> None:
    workerfns.gate.clear()
    loader = ll.Loader(
        small_uri,
        batch_size=10,
        columns=["id"],
        transform=workerfns.stuck,
        num_workers=2,
        worker_type=worker_type,
        stall_timeout=1.0,
    )
    leaks = Leaks()
    it = iter(loader)
    pids = pool_pids(loader)
    started = time.perf_counter()
    with pytest.raises(ll.StallError) as info:
        next(it)
    assert 1.0 <= time.perf_counter() - started < 1.0 + 3.0
    error = info.value
    assert isinstance(error, TimeoutError)
    message = str(error)
    assert "batch 0 of epoch 0" in message and "stage 'transform'" in message
    assert (
        "worker thread lanceloader-worker-" if worker_type == "thread" else "worker process 0 (pid"
    ) in message
    assert "in stuck" in message
    assert "in stuck" in error.stack and error.stage == "transform" and error.batch == 0
    assert not it.live
    leaks.check(pids)


def test_a_stopped_worker_process_raises_stall_error(small_uri: str) -> None:
    loader = ll.Loader(
        small_uri,
        batch_size=10,
        columns=["id"],
        num_workers=1,
        worker_type="process",
        prefetch=1,
        rows_per_read=10,
        stall_timeout=1.0,
    )
    leaks = Leaks()
    it = iter(loader)
    next(it)
    [pid] = pool_pids(loader)
    os.kill(pid, signal.SIGSTOP)
    try:
        with pytest.raises(ll.StallError, match=r"stopped \(state T\)") as info:
            for _ in range(len(loader)):  # what was sent before the stop still arrives
                next(it)
        assert f"pid {pid}" in str(info.value)
    finally:
        if alive(pid):  # the loader killed it, unless the test failed
            os.kill(pid, signal.SIGCONT)
    leaks.check([pid])


def test_stall_timeout_none_waits_and_healthy_runs_never_stall(small_uri: str) -> None:
    loader = ll.Loader(small_uri, batch_size=100, stall_timeout=None)
    assert sum(len(b["id"]) for b in loader) == 1000
    assert ll.Loader(small_uri).stall_timeout == 300.0


# --- the training process is SIGKILLed ----------------------------------------------------------

OWN_POOL_TRAINER = textwrap.dedent(
    """
    import json, os, sys, time
    from multiprocessing import forkserver, resource_tracker
    sys.path.insert(0, {tests!r})
    import lanceloader as ll
    import workerfns

    if __name__ == "__main__":
        busy = sys.argv[2] == "busy"
        loader = ll.Loader(sys.argv[1], batch_size=10, columns=["id", "x"], num_workers=2,
                           worker_type="process", prefetch=8,
                           transform=workerfns.slow_after_first if busy else None)
        it = iter(loader)
        next(it)
        time.sleep(1.0)  # the workers are busy, or have written the batches they prefetch
        print(json.dumps({{"pid": os.getpid(), "workers": it.stream._pool.pids,
                          "forkserver": forkserver._forkserver._forkserver_pid,
                          "tracker": resource_tracker._resource_tracker._pid}}), flush=True)
        time.sleep(600)
    """
)

DATALOADER_TRAINER = textwrap.dedent(
    """
    import json, multiprocessing, os, sys, time
    from multiprocessing import forkserver, resource_tracker
    from torch.utils.data import DataLoader
    from lanceloader.torch import BatchSampler, IterableDataset, MapDataset, collate

    if __name__ == "__main__":
        ctx = multiprocessing.get_context(sys.argv[3])
        if sys.argv[3] == "forkserver":  # the recipe of docs/fork-safety.md
            ctx.set_forkserver_preload(["numpy", "pyarrow", "lance", "lanceloader.torch"])
        if sys.argv[2] == "iterable":
            ds = IterableDataset(sys.argv[1], batch_size=10, columns=["id", "x"], output="torch")
            loader = DataLoader(ds, batch_size=None, num_workers=2, prefetch_factor=4,
                                multiprocessing_context=ctx)
        else:
            ds = MapDataset(sys.argv[1], columns=["id", "x"])
            loader = DataLoader(ds, batch_sampler=BatchSampler(ds, batch_size=10),
                                collate_fn=collate, num_workers=2, prefetch_factor=4,
                                multiprocessing_context=ctx)
        it = iter(loader)
        next(it)
        time.sleep(2.0)  # the workers fill their queues: batches in flight, as files
        print(json.dumps({"pid": os.getpid(), "workers": [w.pid for w in it._workers],
                          "forkserver": forkserver._forkserver._forkserver_pid,
                          "tracker": resource_tracker._resource_tracker._pid}), flush=True)
        sys.stdout.close()  # (a tainted worker's clean reader must not hold the test's pipe)
        time.sleep(600)
    """
)


def descendants(pid: int) -> set[int]:
    """Every process started, directly or not, by ``pid`` (a forkserver's children included: the
    forkserver is a child of the process that started it)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            except OSError:
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def kill_trainer_and_check(script: str, *args: str) -> dict:
    trainer = subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = trainer.stdout.readline()
        assert line, trainer.stderr.read()[-3000:]
        info = json.loads(line)
        processes = {*info["workers"], info["forkserver"], info["tracker"]} - {None}
        processes |= descendants(trainer.pid)  # and the clean readers of tainted workers
        assert processes >= set(info["workers"]) and all(alive(p) for p in processes)
        info["processes"] = sorted(processes)
        left_before = shm_files(info["pid"])
        trainer.kill()  # SIGKILL: no finally, no atexit, no finalizer runs in the trainer
        killed = time.monotonic()
        gone = wait_until(
            lambda: not any(alive(p) for p in processes) and not shm_files(info["pid"]),
            GONE_BOUND_S,
        )
        assert gone, {"alive": [p for p in processes if alive(p)], "files": shm_files(info["pid"])}
        info["took"], info["files_before"] = time.monotonic() - killed, left_before
        return info
    finally:
        trainer.kill()
        trainer.wait(10)


@pytest.mark.parametrize("state", ["busy", "files-in-flight"])
def test_nothing_outlives_a_killed_trainer_with_process_workers(
    medium_uri: str, state: str
) -> None:
    info = kill_trainer_and_check(OWN_POOL_TRAINER.format(tests=TESTS), medium_uri, state)
    if state == "files-in-flight":
        assert info["files_before"], "the test needs batches in flight, as files"


@pytest.mark.parametrize(
    "dataset, context", [("iterable", "forkserver"), ("map", "forkserver"), ("map", "fork")]
)
def test_nothing_outlives_a_killed_trainer_with_dataloader_workers(
    medium_uri: str, dataset: str, context: str
) -> None:
    """The forkserver recipe, and ``fork``: there the workers are tainted and read through
    clean reader processes of their own, which must go too."""
    pytest.importorskip("torch")
    info = kill_trainer_and_check(DATALOADER_TRAINER, medium_uri, dataset, context)
    assert info["files_before"], "the test needs batches in flight, as files"
    if context == "fork":
        assert len(info["processes"]) > len(info["workers"])  # the clean readers


def test_the_next_pool_removes_files_a_killed_trainer_left(small_uri: str) -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    pid = int(dead.stdout)
    orphan = SHM_DIR / shm_name("pool", pid, "abcd1234", pid, 0)
    live = SHM_DIR / shm_name("pool", os.getppid(), "abcd1234", 1, 0)  # a live owner's file
    # The same dead pid in another PID namespace (a container sharing /dev/shm) is not ours to
    # judge: there it may be alive.
    foreign = SHM_DIR / f"lanceloader-pool-{pid}-1{NAMESPACE}-abcd1234-{pid}-0"
    for path in (orphan, live, foreign):
        path.write_bytes(b"x")
    try:
        loader = ll.Loader(small_uri, batch_size=100, num_workers=1, worker_type="process")
        assert len(list(loader)) == 10
        assert not orphan.exists() and live.exists() and foreign.exists()
    finally:
        for path in (orphan, live, foreign):
            path.unlink(missing_ok=True)


# --- damaged data files -------------------------------------------------------------------------


def damage(uri: str, how: str) -> str:
    """Damage the data file of fragment 1 of ``uri``; returns the file's path."""
    fragment = lance.dataset(uri).get_fragments()[1]
    path = os.path.join(uri, "data", fragment.metadata.files[0].path)
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        if how == "truncated":
            f.truncate(size // 2)
        elif how == "zero-length":
            f.truncate(0)
        elif how == "overwritten-middle":  # strings: Lance checks their offsets and UTF-8
            f.seek(size // 2)
            f.write(b"\xff" * 4096)
        elif how == "overwritten-footer":
            f.seek(size - 64)
            f.write(b"\xff" * 64)
    return path


@pytest.fixture(scope="module")
def text_uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    """2,000 rows of text in 2 fragments: the middle of a data file is string data."""
    uri = str(tmp_path_factory.mktemp("text") / "text.lance")
    table = pa.table(
        {
            "id": pa.array(range(2000), pa.int64()),
            "text": [f"row {i} " + "lorem ipsum " * (i % 20) for i in range(2000)],
        }
    )
    lance.write_dataset(table, uri, max_rows_per_file=1000)
    return uri


@pytest.mark.parametrize("worker_type", ["thread", "process"])
@pytest.mark.parametrize(
    "how", ["truncated", "zero-length", "overwritten-middle", "overwritten-footer"]
)
def test_a_damaged_data_file_raises_read_error_naming_where(
    text_uri: str, tmp_path: Path, how: str, worker_type: str
) -> None:
    uri = str(tmp_path / "damaged.lance")
    shutil.copytree(text_uri, uri)
    damage(uri, how)
    loader = ll.Loader(
        uri,
        batch_size=100,
        columns=["text"],
        num_workers=2,
        worker_type=worker_type,
        rows_per_read=500,
    )
    leaks = Leaks()
    with pytest.raises(ll.ReadError) as info:
        for _ in loader:
            pids = pool_pids(loader) or []
    error = info.value
    message = str(error)
    assert isinstance(error, OSError) and isinstance(error, Exception)
    assert repr(uri) in message and "(version 1)" in message
    assert "fragment 1 rows" in message and 1 in error.fragments  # (and 0, when read with it)
    assert (
        error.batches is not None
        and f"batch{'es' if len(error.batches) > 1 else ''} {error.batches.start}" in message
        and error.epoch == 0
    )
    assert ".rs:" not in message  # no Rust source paths
    assert error.__cause__ is not None
    leaks.check(pids)


def test_a_damaged_first_fragment_raises_read_error_at_construction(
    text_uri: str, tmp_path: Path
) -> None:
    uri = str(tmp_path / "damaged.lance")
    shutil.copytree(text_uri, uri)
    fragment = lance.dataset(uri).get_fragments()[0]
    os.truncate(os.path.join(uri, "data", fragment.metadata.files[0].path), 100)
    with pytest.raises(ll.ReadError, match="fragment 0 rows 0-255") as info:
        ll.Loader(uri, columns=["text"])  # the loader samples the first rows to size its reads
    assert info.value.batches is None and info.value.__cause__ is not None


def test_a_read_across_fragments_names_only_the_damaged_one(tmp_path: Path) -> None:
    """A read of 3 fragments' rows, the middle one's file cut short: the error names that
    fragment and its rows alone (Lance's error did not say which file failed), with the
    fragment's own error as the cause; a read of undamaged fragments still reads."""
    uri = str(tmp_path / "three.lance")
    lance.write_dataset(
        pa.table({"id": np.arange(3000), "text": [f"row {i}" for i in range(3000)]}),
        uri,
        max_rows_per_file=1000,
    )
    middle = lance.dataset(uri).get_fragments()[1]
    os.truncate(os.path.join(uri, "data", middle.metadata.files[0].path), 100)
    source = Source(uri, ["id", "text"])
    with pytest.raises(ll.ReadError) as info:
        source.read_rows(np.arange(500, 2500))
    assert info.value.fragments == (1,) and info.value.rows == (1000, 1999, 1000)
    assert "fragment 1 rows 0-999" in str(info.value) and "fragment 0" not in str(info.value)
    assert info.value.__cause__ is not None
    assert source.read_rows(np.arange(2000, 3000)).rows.num_rows == 1000


# --- transforms that break the batch ------------------------------------------------------------


@pytest.mark.parametrize("worker_type", ["thread", "process"])
@pytest.mark.parametrize(
    "transform, expected",
    [
        (workerfns.first_row_only, "returned 1 rows for a batch of 8"),
        (workerfns.unequal_columns, "columns of unequal length: {'id': 8, 'label': 1}"),
        (workerfns.returns_none, "returned None instead of a batch"),
    ],
)
def test_a_transform_that_breaks_the_batch_raises(
    small_uri: str, worker_type: str, transform, expected: str
) -> None:
    loader = ll.Loader(
        small_uri,
        batch_size=8,
        columns=["id", "label"],
        transform=transform,
        num_workers=2,
        worker_type=worker_type,
    )
    with pytest.raises(ll.TransformOutputError) as info:
        list(loader)
    assert expected in str(info.value) and transform.__name__ in str(info.value)
    assert isinstance(info.value, ValueError)
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "batch 0 of epoch 0" in notes and "fragment 0 rows 0-7" in notes


def test_skipping_rows_keeps_counts_exact(small_uri: str) -> None:
    skip_odd = ll.map_rows(workerfns.fail_on_odd_id)
    loader = ll.Loader(
        small_uri, batch_size=10, columns=["id"], transform=skip_odd, on_error="skip"
    )
    delivered = sum(len(b["id"]) for b in loader)
    stats = loader.stats()
    assert delivered == 500 and stats.rows == 500 and stats.rows_skipped == 500


# --- bad arguments ------------------------------------------------------------------------------

BAD_LOADER_ARGUMENTS = [
    # (argument, value, error type, what the message says)
    ("shuffle", "False", TypeError, "shuffle must be True or False, got the str 'False'"),
    ("drop_last", "no", TypeError, "drop_last must be True or False"),
    ("pin_memory", 1, TypeError, "pin_memory must be True or False"),
    ("storage_options", ["a"], TypeError, "storage_options must be a dict of str to str"),
    ("storage_options", {"timeout": 5}, TypeError, "storage_options must map str to str"),
    ("filter", 5, TypeError, "filter must be a string such as 'label = 3'"),
    ("filter", "no_such_column > 1", ValueError, "filter 'no_such_column > 1' is not a valid"),
    ("version", True, TypeError, "version must be a version number"),
    ("version", 99, ValueError, "has no version 99"),
    ("split", 3, TypeError, "split must be a string"),
    ("columns", "id", TypeError, "columns must be a list of names"),
    ("columns", ["nope"], ValueError, "unknown columns ['nope']"),
    ("batch_size", 0, ValueError, "batch_size must be >= 1"),
    ("batch_size", 2.5, TypeError, "batch_size must be an int"),
    ("num_workers", "2", TypeError, "num_workers must be an int"),
    ("seed", None, TypeError, "seed must be an int"),
    ("worker_type", "processes", ValueError, "worker_type must be 'thread', 'process' or 'ray'"),
    ("stall_timeout", 0, ValueError, "stall_timeout must be > 0 seconds"),
    ("stall_timeout", "60", TypeError, "stall_timeout must be a number of seconds"),
    ("on_error", "ignore", ValueError, "on_error must be 'raise', 'skip'"),
    ("output", "pandas", ValueError, "output"),
    ("transform", 3, TypeError, "transform must be a function"),
]


@pytest.mark.parametrize(
    "argument, value, error, says",
    BAD_LOADER_ARGUMENTS,
    ids=[f"{a}={v!r}" for a, v, _, _ in BAD_LOADER_ARGUMENTS],
)
def test_bad_argument_names_itself(small_uri: str, argument: str, value, error, says) -> None:
    with pytest.raises(error) as info:
        ll.Loader(small_uri, **{argument: value})
    message = str(info.value)
    assert says in message and ".rs:" not in message


def test_bad_arguments_of_the_torch_classes(small_uri: str) -> None:
    pytest.importorskip("torch")
    from lanceloader.torch import BatchSampler, MapDataset, Sampler

    with pytest.raises(TypeError, match="shuffle must be True or False"):
        BatchSampler(10, batch_size=2, shuffle="yes")
    with pytest.raises(TypeError, match="drop_last must be True or False"):
        Sampler(10, drop_last="no")
    with pytest.raises(TypeError, match="read_ahead must be True or False"):
        MapDataset(small_uri, read_ahead="no")


def test_what_is_not_a_lance_dataset_gets_told_how_to_convert(tmp_path: Path) -> None:
    import pandas as pd
    import pyarrow.csv
    import pyarrow.dataset
    import pyarrow.parquet as pq

    table = pa.table({"id": [1, 2, 3]})
    pq.write_table(table, tmp_path / "data.parquet")
    (tmp_path / "shards").mkdir()
    pq.write_table(table, tmp_path / "shards" / "part-0.parquet")
    pyarrow.csv.write_csv(table, tmp_path / "data.csv")
    (tmp_path / "notes.txt").write_text("hello")
    cases = [
        (
            pd.DataFrame({"id": [1]}),
            TypeError,
            "got a pandas.DataFrame. Write it to Lance once "
            "with lanceloader.convert(df, 'data.lance')",
        ),
        (table, TypeError, "got a pyarrow.Table"),
        ({"id": [1]}, TypeError, "got a dict"),
        (
            str(tmp_path / "data.parquet"),
            FileNotFoundError,
            f"is a Parquet file, not a Lance dataset (a directory with _versions/). Convert it once:"
            f" lanceloader.convert('{tmp_path}/data.parquet', '{tmp_path}/data.lance') (or on the "
            f"command line: lanceloader convert {tmp_path}/data.parquet {tmp_path}/data.lance)",
        ),
        (str(tmp_path / "shards"), FileNotFoundError, "is a directory of Parquet files"),
        (str(tmp_path / "data.csv"), FileNotFoundError, "lanceloader.convert("),
        (str(tmp_path / "notes.txt"), FileNotFoundError, "is a file; a Lance dataset is a dir"),
        (
            str(tmp_path / "missing.lance"),
            FileNotFoundError,
            f"no Lance dataset at '{tmp_path}/missing.lance'",
        ),
    ]
    for dataset, error, says in cases:
        with pytest.raises(error) as info:
            ll.Loader(dataset)
        assert says in str(info.value), str(info.value)
        assert ".rs:" not in str(info.value)
    # The advice works as written.
    ll.convert(str(tmp_path / "data.parquet"), str(tmp_path / "data.lance"), progress=False)
    assert len(list(ll.Loader(str(tmp_path / "data.lance"), batch_size=2))) == 2
    ll.convert(str(tmp_path / "shards"), str(tmp_path / "shards.lance"), progress=False)
    assert len(list(ll.Loader(str(tmp_path / "shards.lance"), batch_size=2))) == 2


def test_an_empty_selection_warns_and_gives_empty_epochs(
    small_uri: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("WARNING", logger="lanceloader"):
        loader = ll.Loader(small_uri, filter="id < 0")
    assert "filter 'id < 0' matches none of its 1000 rows" in caplog.text
    assert "every epoch is empty" in caplog.text and list(loader) == []
    caplog.clear()
    empty = str(tmp_path / "empty.lance")
    lance.write_dataset(pa.table({"id": pa.array([], pa.int64())}), empty)
    with caplog.at_level("WARNING", logger="lanceloader"):
        assert list(ll.Loader(empty)) == []
    assert "the dataset has no rows" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="lanceloader"):
        ll.Loader(small_uri, filter="id >= 0")
    assert caplog.text == ""


def test_review_cases_numpy_values_metadata_and_opt_out(small_uri: str) -> None:
    """Valid input the checks must not reject, and the errors' life across processes."""
    import pickle

    import numpy as np

    from lanceloader.batch.transforms import check_output_rows

    loader = ll.Loader(
        small_uri,
        batch_size=100,
        shuffle=np.True_,
        version=np.int64(1),
        stall_timeout=np.float64(60),
    )
    assert len(loader) == 10 and loader.order.shuffle
    with pytest.raises(ValueError, match="pass None for no limit"):
        ll.Loader(small_uri, stall_timeout=1e9)
    # Entries that are not columns (an image size, class weights) are not rows.
    check_output_rows(len, {"id": [1, 2], "size": (224, 224), "weights": [1.0] * 10}, 2, ["id"])

    def pack(batch):
        return batch.slice(0, 1)

    pack.changes_rows = True  # a transform that changes the row count on purpose
    assert sum(len(b["id"]) for b in ll.Loader(small_uri, batch_size=100, transform=pack)) == 10
    # torch re-raises a DataLoader worker's error as type(exc)(message); pickling keeps fields.
    assert str(ll.ReadError("formatted")) == "formatted"
    assert str(ll.StallError("formatted")) == "formatted"
    stall = pickle.loads(
        pickle.dumps(ll.StallError("m", batch=3, epoch=1, stage="read", worker="w", stack="s"))
    )
    assert (stall.batch, stall.stage, str(stall)) == (3, "read", "m")
    # a ReadError's kinds cross a process as themselves (a process worker's error)
    from lanceloader.rows.cache.files import CacheLockTimeout

    for kind in (ll.ReadError, ll.ClipError):
        error = pickle.loads(pickle.dumps(kind("bad bytes", uri="u", version=2, where="w")))
        assert type(error) is kind and (error.uri, error.version) == ("u", 2)
        assert "bad bytes" in str(error)
    held = pickle.loads(pickle.dumps(CacheLockTimeout("held", root="/d")))
    assert type(held) is CacheLockTimeout and held.root == "/d"


def test_a_stuck_process_worker_with_a_big_task_queued_still_stalls_in_time(
    medium_uri: str,
) -> None:
    """A queued task of a big read (10,000 positions: 80 KB) does not fit in the pipe while the
    worker is stuck on its first: the loop must not wait on that pipe (it used to, forever)."""
    workerfns.gate.clear()
    loader = ll.Loader(
        medium_uri,
        batch_size=5000,
        columns=["id"],
        transform=workerfns.stuck,
        num_workers=1,
        worker_type="process",
        stall_timeout=1.0,
    )
    leaks = Leaks()
    started = time.perf_counter()
    with pytest.raises(ll.StallError, match="stage 'transform'"):
        next(iter(loader))
    assert time.perf_counter() - started < 1.0 + 3.0
    leaks.check()


EXIT_SCRIPT = textwrap.dedent(
    """
    import sys
    import lanceloader as ll
    loader = ll.Loader(sys.argv[1], batch_size=64, shuffle=True, num_workers=2,
                       columns=["id", "x"])
    if sys.argv[2] == "live":
        it = iter(loader)          # still referenced when the interpreter exits
        for _ in range(int(sys.argv[3])):
            next(it)
    else:
        for i, _ in enumerate(loader):
            if i == int(sys.argv[3]):
                break              # closed, its busy workers detached
    print("done")
    """
)


@pytest.mark.parametrize("how", ["live", "break"])
def test_exiting_with_reads_in_flight_exits_cleanly(medium_uri: str, how: str) -> None:
    """A daemon worker still inside Lance when the interpreter finalizes used to abort the
    process (exit 134, "FATAL: exception not rethrown"); the pools now finish their reads at
    exit, within a bound."""
    for batches in (3, 40, 120):
        done = subprocess.run(
            [sys.executable, "-c", EXIT_SCRIPT, medium_uri, how, str(batches)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert (done.returncode, done.stdout.strip()) == (0, "done"), done.stderr[-2000:]
