"""The automatic cache (``cache="auto"``, the default): shared by the processes of a machine,
removed when its last user dies (SIGKILL included), never kept alive by a forked child; chosen
for shuffles that fit, and why; never part of a state."""

from __future__ import annotations

import multiprocessing
import os
import re
import signal
import time
from pathlib import Path

import pytest
from test_cache import ORDERS, ROWS, loader_of, rows_of

from conftest import ids_of
from lanceloader.demo import write_demo_dataset
from lanceloader.rows.cache import auto as autocache_module
from lanceloader.rows.cache import pieces as cache_module
from lanceloader.rows.cache.disk import DiskCache
from lanceloader.rows.cache.pieces import make_cache


@pytest.fixture(scope="module")
def uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    """6,000 demo rows in 3 fragments of 2,000 (as ``test_cache.py``'s)."""
    return write_demo_dataset(tmp_path_factory.mktemp("cache") / "d.lance", rows=ROWS, fragments=3)


# --- the automatic cache (cache="auto", the default) ------------------------------------------


def auto_epoch(uri: str, shm: str, results) -> None:
    """In a fresh process: a default Loader (full shuffle) with the automatic cache's directory
    under ``shm``; reports its ids, downloads, choice and sweeper; then waits to be killed."""
    autocache_module.AUTO_SHM_DIR = Path(shm)
    cache_module.PIECE_BYTES = 1
    loader = loader_of(uri, shuffle=True)
    ids = rows_of(loader)[0]
    results.put(
        (
            sorted(ids) == list(range(ROWS)),
            loader.source.cache.fills,
            loader.source.cache_choice,
            autocache_module._sweepers[-1].pid,
        )
    )
    time.sleep(600)


def wait_gone(pid: int, bound_s: float = 60.0) -> None:
    """Wait (at most ``bound_s``) until process ``pid`` has exited."""
    from lanceloader.lifecycle.lifetime import alive

    deadline = time.monotonic() + bound_s
    while alive(pid):
        assert time.monotonic() < deadline, f"process {pid} still runs after {bound_s} s"
        time.sleep(0.05)


def test_two_processes_share_the_automatic_cache_and_the_last_ones_death_removes_it(uri, tmp_path):
    """Both SIGKILLed (no atexit, no finally): the directory stays while one of them uses it
    and is gone once the last is dead."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    users = []
    try:
        for _ in range(2):
            users.append(context.Process(target=auto_epoch, args=(uri, str(tmp_path), results)))
            users[-1].start()
            whole, fills, choice, users[-1].sweeper = results.get(timeout=120)
            assert whole and choice.startswith(f"auto: {tmp_path}"), choice
            assert fills == (6 if len(users) == 1 else 0)  # the second read the first's pieces
        (root,) = tmp_path.iterdir()
        assert len(list(root.glob("*.arrow"))) == 6
        os.kill(users[0].pid, signal.SIGKILL)
        users[0].join(10)
        wait_gone(users[0].sweeper)  # it ran, and left the directory to the other user
        assert len(list(root.glob("*.arrow"))) == 6
        os.kill(users[1].pid, signal.SIGKILL)
        users[1].join(10)
        wait_gone(users[1].sweeper)
        assert not root.exists()
    finally:
        for user in users:
            user.kill()
            user.join(10)


@pytest.mark.filterwarnings("ignore:lanceloader. forking a process:RuntimeWarning")
def test_a_forked_child_does_not_keep_the_automatic_cache_alive(tmp_path, monkeypatch):
    """A fork inherits the user's lock: held by a child that outlives its parent, the
    directory would stay after every user died. The child closes it."""
    import fcntl

    monkeypatch.setattr(autocache_module, "AUTO_SHM_DIR", tmp_path)
    autocache_module.auto_cache(True, False, 1000.0)
    lock = autocache_module.auto_cache_root() / autocache_module.USERS_LOCK
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # holds no lock now: report whether an exclusive one is possible after close
        os.close(read)
        os.write(write, b"ok" if not autocache_module._joined else b"kept")
        os._exit(0)
    os.close(write)
    assert os.read(read, 4) == b"ok"
    os.close(read)
    os.waitpid(child, 0)
    fd = os.open(lock, os.O_RDWR)
    try:  # this process's own shared lock still holds
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)


def test_leftovers_of_dead_users_are_removed_when_the_next_joins(tmp_path, monkeypatch):
    monkeypatch.setattr(autocache_module, "AUTO_SHM_DIR", tmp_path)
    root = autocache_module.auto_cache_root()
    root.mkdir()
    (root / "stale.arrow").write_bytes(b"x" * 1000)  # its users and sweepers all died
    cache, choice = autocache_module.auto_cache(True, False, 1000.0)
    assert isinstance(cache, DiskCache) and cache.root == root and "a shuffle" in choice
    assert not (root / "stale.arrow").exists()


@pytest.mark.parametrize(
    ("order", "chosen"), [("sequential", False), ("block", True), ("full", True)]
)
def test_the_default_caches_shuffles_that_fit_and_says_why(
    uri, tmp_path, monkeypatch, order, chosen
):
    monkeypatch.setattr(autocache_module, "AUTO_SHM_DIR", tmp_path)
    loader = loader_of(uri, **ORDERS[order])
    assert rows_of(loader) == rows_of(loader_of(uri, cache=None, **ORDERS[order]))
    assert isinstance(loader.source.cache, DiskCache) == chosen
    stats = loader.stats()
    assert stats.cache == loader.source.cache_choice
    assert re.search(rf"^cache +{re.escape(stats.cache)}$", str(stats), re.M), str(stats)
    if chosen:
        assert rows_of(loader)[0] and loader.stats(epoch=-1).rows_cached == ROWS
    else:
        assert "sequential read of local data gains nothing" in stats.cache
    monkeypatch.setattr(autocache_module, "AUTO_MEMORY_SHARE", 1e-9)  # a budget nothing fits
    small = loader_of(uri, **ORDERS[order])
    assert small.source.cache is None
    assert "exceed the budget" in small.source.cache_choice or not chosen
    assert loader_of(uri, cache=None, shuffle=True).source.cache is None


def test_a_cache_is_never_part_of_the_state(uri, tmp_path, monkeypatch):
    """A state taken with the automatic cache loads into a loader without one, and back."""
    monkeypatch.setattr(autocache_module, "AUTO_SHM_DIR", tmp_path)
    auto, off = loader_of(uri, shuffle=True), loader_of(uri, shuffle=True, cache=None)
    iterator = iter(auto)
    next(iterator)
    state = auto.state_dict()
    iterator.close()
    off.load_state_dict(state)
    assert ids_of(off) == ids_of(loader_of(uri, shuffle=True, cache=None))[100:]


def test_auto_is_for_loaders_only(uri):
    with pytest.raises(ValueError, match="cache='auto' is chosen by the Loader"):
        make_cache("auto", None)
