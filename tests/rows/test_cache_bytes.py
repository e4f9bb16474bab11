"""Byte ranges that are not rows (``fetch_bytes``): one ``make()`` per key across threads and
processes, damage dropped and made again, within the cap, bad input named."""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path

import pytest

from lanceloader.rows.cache.disk import DiskCache
from lanceloader.rows.cache.pieces import MemoryCache

# --- byte ranges that are not rows (fetch_bytes) ----------------------------------------------


def fetch_counted(root: str, key: str, log: str, start) -> bytes:
    """In a fresh process: fetch ``key``; each make() appends a line to ``log`` (slowly, so the
    others arrive while it runs)."""
    start.wait(60)

    def make() -> bytes:
        with open(log, "a") as file:
            file.write(f"{os.getpid()}\n")
        time.sleep(0.3)
        return key.encode() * 1000

    return DiskCache(root, 1 << 20).fetch_bytes(key, make)


def test_processes_fetching_one_key_make_it_once(tmp_path):
    root, log = str(tmp_path), str(tmp_path / "log")
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager, context.Pool(3) as pool:
        start = manager.Event()
        results = pool.starmap_async(fetch_counted, [(root, "clip-1", log, start)] * 3)
        start.set()
        got = results.get(120)
    assert got == [b"clip-1" * 1000] * 3
    assert len(Path(log).read_text().split()) == 1


@pytest.mark.parametrize("kind", ["disk", "memory"])
def test_threads_fetching_one_key_make_it_once(tmp_path, kind):
    from concurrent.futures import ThreadPoolExecutor

    cache = DiskCache(tmp_path, 1 << 20) if kind == "disk" else MemoryCache(1 << 20)
    made = []

    def make() -> bytes:
        made.append(1)
        time.sleep(0.1)
        return b"range"

    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda _: cache.fetch_bytes("k", make), range(4)))
    assert got == [b"range"] * 4 and len(made) == 1 and cache.fills == 1


def test_damaged_bytes_are_dropped_counted_and_made_again(tmp_path):
    cache = DiskCache(tmp_path, 1 << 20)
    cache.fetch_bytes("k", lambda: b"a" * 5000)
    (path,) = tmp_path.glob("*.bin")
    data = bytearray(path.read_bytes())
    data[10] ^= 0xFF  # one flipped byte, same length
    path.write_bytes(bytes(data))
    other = DiskCache(tmp_path, 1 << 20)  # another process's view: checks the changed file
    assert other.fetch_bytes("k", lambda: b"a" * 5000) == b"a" * 5000
    assert (other.damaged, other.fills) == (1, 1)
    path.write_bytes(path.read_bytes()[:-3])  # truncated
    assert other.fetch_bytes("k", lambda: b"b" * 5000) == b"b" * 5000
    assert (other.damaged, other.fills) == (2, 2)


def test_fetched_bytes_stay_within_the_cap_least_recently_used_out(tmp_path):
    cache = DiskCache(tmp_path, 10_000)
    for key in "abc":
        cache.fetch_bytes(key, lambda key=key: key.encode() * 3000)
        time.sleep(0.01)
    assert cache.used_bytes() <= 10_000
    cache.fetch_bytes("a", lambda: b"?")  # read: now the most recent
    cache.fetch_bytes("d", lambda: b"d" * 3000)  # evicts b, the least recently used
    assert cache.used_bytes() <= 10_000
    assert cache.fetch_bytes("a", lambda: b"?") == b"a" * 3000
    assert cache.fetch_bytes("b", lambda: b"new") == b"new"
    assert cache.fetch_bytes("big", lambda: b"x" * 20_000) == b"x" * 20_000  # not kept
    assert cache.fetch_bytes("big", lambda: b"y" * 20_000) == b"y" * 20_000  # made again
    assert cache.not_kept == 2 and cache.used_bytes() <= 10_000
    memory = MemoryCache(10_000)
    for key in "abcd":
        memory.fetch_bytes(key, lambda key=key: key.encode() * 3000)
    assert memory.used_bytes() <= 10_000
    assert memory.fetch_bytes("a", lambda: b"new") == b"new"  # evicted first


def test_fetch_bytes_bad_input_names_the_fix(tmp_path):
    for cache in (DiskCache(tmp_path, 1 << 20), MemoryCache(1 << 20)):
        with pytest.raises(TypeError, match="str key"):
            cache.fetch_bytes(7, lambda: b"")
        with pytest.raises(TypeError, match="must return bytes"):
            cache.fetch_bytes("k", lambda: "text")
        assert cache.fetch_bytes("k", lambda: bytearray(b"ok")) == b"ok"
