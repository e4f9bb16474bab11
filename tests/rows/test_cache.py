"""The local cache (``cache=``): the same rows as without it, in every order and from any cache
state; keyed so that it never serves another dataset's, version's or projection's rows; within
its cap; one download per piece under concurrent fills (threads, processes, a killed filler);
plans shared through the directory."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lanceloader as ll
from conftest import ids_of
from lanceloader.demo import demo_table, write_demo_dataset
from lanceloader.engine.sizing import READ_BYTES, READ_BYTES_GATHER
from lanceloader.rows.cache import locks as locks_module
from lanceloader.rows.cache import pieces as cache_module
from lanceloader.rows.cache.disk import DiskCache
from lanceloader.rows.cache.files import TEMPORARY
from lanceloader.rows.cache.pieces import MemoryCache, make_cache
from lanceloader.rows.lance.source import Source

COLUMNS = ["id", "label", "x"]
ORDERS = {
    "sequential": {},
    "block": {"shuffle": True, "shuffle_block_size": 256, "shuffle_window": 4},
    "full": {"shuffle": True},
}
ROWS = 6000


@pytest.fixture(scope="module")
def uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    """6,000 demo rows in 3 fragments."""
    return write_demo_dataset(tmp_path_factory.mktemp("cache") / "d.lance", rows=ROWS, fragments=3)


@pytest.fixture
def small_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pieces of 1,024 rows (the minimum): 2 of each 2,000-row fragment, the second short."""
    monkeypatch.setattr(cache_module, "PIECE_BYTES", 1)


def loader_of(uri: str, **kwargs) -> ll.Loader:
    return ll.Loader(uri, batch_size=100, columns=COLUMNS, seed=5, **kwargs)


def rows_of(loader: ll.Loader) -> tuple[list[int], bytes]:
    """The ids delivered in one epoch, and the bytes of every row's ``x``."""
    ids, xs = [], []
    for batch in loader:
        ids.extend(batch["id"].tolist())
        xs.append(batch["x"])
    return ids, np.concatenate(xs).tobytes()


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("kind", ["directory", "memory", "directory, process workers"])
def test_every_order_delivers_what_it_delivers_without_a_cache(
    uri, tmp_path, small_pieces, order, kind
):
    cache = "memory" if kind == "memory" else str(tmp_path / "cache")
    worker_type = "process" if "process" in kind else "thread"
    plain = loader_of(uri, **ORDERS[order])
    cached = loader_of(uri, cache=cache, worker_type=worker_type, num_workers=2, **ORDERS[order])
    assert rows_of(cached) == rows_of(plain)
    first = cached.stats(epoch=-1)  # the first reads are small: their rows come from Lance
    assert first.rows_read == ROWS and 0 < first.rows_cached < ROWS
    assert rows_of(cached) == rows_of(plain)
    stats = cached.stats(epoch=-1)
    assert stats.rows_cached == stats.rows_read == ROWS
    assert stats.io_iops == 0  # the second epoch made no storage request at all


def test_a_second_loader_and_a_new_order_read_what_the_first_cached(uri, tmp_path, small_pieces):
    cache = str(tmp_path / "cache")
    rows_of(loader_of(uri, cache=cache))
    for order in ORDERS.values():  # another loader, another order: all local
        loader = loader_of(uri, cache=cache, **order)
        assert rows_of(loader) == rows_of(loader_of(uri, **order))
        assert loader.stats(epoch=0).io_iops == 0
        assert loader.source.cache.fills == 0


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    positions=st.lists(st.integers(0, ROWS - 1), max_size=300),
    warm=st.lists(st.integers(0, ROWS - 1), max_size=30),
)
def test_any_positions_from_any_cache_state_are_the_rows_lance_has(
    uri, tmp_path, small_pieces, positions, warm
):
    """Positions in any order, with duplicates, after any earlier reads filled some pieces."""
    plain = Source(uri, columns=COLUMNS)
    cached = Source(uri, columns=COLUMNS, cache=str(tmp_path / "prop"), cache_size=1 << 30)
    cached.read_table(np.array(warm, dtype=np.int64))
    got = cached.read_table(np.array(positions, dtype=np.int64))
    assert got.equals(plain.read_table(np.array(positions, dtype=np.int64)))


def test_filter_and_split_through_the_cache(uri, tmp_path, small_pieces):
    options = dict(
        filter="label < 5", splits={"train": 0.8, "val": 0.2}, split="train", shuffle=True
    )
    cached = loader_of(uri, cache=str(tmp_path / "c"), **options)
    plain = loader_of(uri, **options)
    assert rows_of(cached) == rows_of(plain)
    assert rows_of(cached) == rows_of(plain)
    assert cached.stats(epoch=-1).io_iops == 0


def test_a_sparse_filter_reads_from_lance_and_keeps_nothing(uri, tmp_path, small_pieces):
    """A piece with under 1/8 of its rows selected is not worth downloading whole."""
    loader = loader_of(uri, filter="id % 10 = 0", cache=str(tmp_path / "c"))
    assert rows_of(loader)[0] == list(range(0, ROWS, 10))
    assert loader.source.cache.fills == 0 and loader.stats().rows_cached == 0


def test_a_full_shuffle_bigger_than_the_cache_does_not_download_pieces(uri, tmp_path, small_pieces):
    """Each read wants a few rows of every piece: filling would thrash a too-small cache."""
    small = ll.Loader(
        uri,
        batch_size=100,
        columns=COLUMNS,
        shuffle=True,
        rows_per_read=100,
        cache=str(tmp_path / "c"),
        cache_size=500_000,
    )
    assert sorted(rows_of(small)[0]) == list(range(ROWS))
    assert small.source.cache.fills == 0


@pytest.mark.parametrize("kind", ["directory", "memory"])
def test_a_shuffled_read_of_local_data_fills_a_piece_per_rows_it_reads(
    uri, tmp_path, small_pieces, monkeypatch, kind
):
    """A full shuffle's first read wants a sliver of every piece; filling all of them before
    the first batch made it late. A read of local data fills one per ``ROWS_PER_FILL`` rows it
    reads (its largest groups first) and takes its other rows from Lance; the epoch still fills
    each piece once, and the next epoch reads nothing from Lance."""
    monkeypatch.setattr(cache_module, "ROWS_PER_FILL", 300)
    cache = "memory" if kind == "memory" else str(tmp_path / "c")
    plain = Source(uri, columns=COLUMNS)
    cached = Source(uri, columns=COLUMNS, cache=cache, cache_size=1 << 30)
    shuffled = np.random.default_rng(3).permutation(ROWS)
    first = shuffled[:299]  # a small first read (a batch): nothing filled, all from Lance
    assert cached.read_table(first).equals(plain.read_table(first))
    fills = [cached.cache.fills]
    for read in np.array_split(shuffled, 10):  # 600 rows: every one of the 6 pieces each time
        assert cached.read_table(read).equals(plain.read_table(read))
        fills.append(cached.cache.fills)
    assert fills[:4] == [0, 2, 4, 6] and fills[-1] == 6  # 2 a read, each piece once
    everything = cached.read_table(shuffled)
    assert everything.equals(plain.read_table(shuffled)) and cached.cache.fills == 6


def test_the_directory_stays_within_its_cap_and_rows_stay_right(uri, tmp_path, small_pieces):
    piece = 1024 * Source(uri, columns=COLUMNS).bytes_per_row
    cap = int(2.5 * piece) + 4096  # two pieces and a half: every epoch evicts
    loader = loader_of(uri, cache=str(tmp_path / "c"), cache_size=cap)
    for order in ORDERS.values():
        loader = loader_of(uri, cache=str(tmp_path / "c"), cache_size=cap, **order)
        assert rows_of(loader) == rows_of(loader_of(uri, **order))
        assert loader.source.cache.used_bytes() <= cap
    assert loader.source.cache.fills > 0


def test_a_piece_bigger_than_the_cache_is_used_and_not_kept(uri, tmp_path, small_pieces):
    loader = loader_of(uri, cache=str(tmp_path / "c"), cache_size=1000)
    assert rows_of(loader)[0] == list(range(ROWS))
    assert loader.source.cache.used_bytes() == 0


def test_memory_cache_stays_within_its_budget(uri, small_pieces):
    piece = 1024 * Source(uri, columns=COLUMNS).bytes_per_row
    loader = loader_of(uri, cache="memory", cache_size=int(2.5 * piece))
    assert rows_of(loader) == rows_of(loader_of(uri))
    assert 0 < loader.source.cache.used_bytes() <= 2.5 * piece


# --- keys: never another dataset's, version's or projection's rows ----------------------------


def test_two_datasets_share_a_directory_without_mixing(tmp_path, small_pieces):
    cache = str(tmp_path / "c")
    a = write_demo_dataset(tmp_path / "a.lance", rows=3000, fragments=2)
    table = demo_table(3000)
    b = str(tmp_path / "b.lance")
    lance.write_dataset(
        table.set_column(0, "id", pa.array(np.arange(3000) + 10**6)), b, max_rows_per_file=1500
    )
    for _ in range(2):
        assert rows_of(loader_of(a, cache=cache))[0] == list(range(3000))
        assert rows_of(loader_of(b, cache=cache))[0] == list(range(10**6, 10**6 + 3000))


def test_an_overwritten_dataset_at_the_same_uri_is_not_served_from_the_cache(
    tmp_path, small_pieces
):
    cache, uri = str(tmp_path / "c"), str(tmp_path / "d.lance")
    lance.write_dataset(demo_table(3000), uri, max_rows_per_file=1500)
    assert rows_of(loader_of(uri, cache=cache))[0] == list(range(3000))
    same_shape = demo_table(3000).set_column(0, "id", pa.array(np.arange(3000) + 7))
    lance.write_dataset(same_shape, uri, max_rows_per_file=1500, mode="overwrite")
    assert rows_of(loader_of(uri, cache=cache))[0] == list(range(7, 3007))
    assert rows_of(loader_of(uri, version=1, cache=cache))[0] == list(range(3000))


def test_deleted_rows_are_not_served_from_pieces_cached_before(tmp_path, small_pieces):
    cache, uri = str(tmp_path / "c"), str(tmp_path / "d.lance")
    lance.write_dataset(demo_table(3000), uri, max_rows_per_file=1500)
    rows_of(loader_of(uri, cache=cache))
    lance.dataset(uri).delete("id % 3 = 0")
    want = [i for i in range(3000) if i % 3]
    assert rows_of(loader_of(uri, cache=cache))[0] == want
    assert rows_of(loader_of(uri, cache=cache, version=1))[0] == list(range(3000))


def test_another_projection_gets_its_own_pieces(uri, tmp_path, small_pieces):
    cache = str(tmp_path / "c")
    rows_of(loader_of(uri, cache=cache))
    narrow = ll.Loader(uri, batch_size=100, columns=["id"], cache=cache)
    assert sorted(narrow.peek()) == ["id"]
    assert ids_of(narrow) == list(range(ROWS))


def test_an_appended_version_reuses_the_pieces_of_the_fragments_it_kept(tmp_path, small_pieces):
    cache, uri = str(tmp_path / "c"), str(tmp_path / "d.lance")
    lance.write_dataset(demo_table(2000), uri, max_rows_per_file=1000)
    first = loader_of(uri, cache=cache)
    rows_of(first)
    table = demo_table(3000).slice(2000)
    lance.write_dataset(table, uri, mode="append")
    second = loader_of(uri, cache=cache)
    assert rows_of(second)[0] == list(range(3000))
    assert second.source.cache.fills == 1  # the new fragment's only piece; the rest was cached


# --- concurrency and damage -----------------------------------------------------------------


def read_epoch(uri: str, cache: str, order: str) -> tuple[list[int], int]:
    """In a fresh process: one epoch through the shared directory; its ids and downloads."""
    cache_module.PIECE_BYTES = 1
    loader = loader_of(uri, cache=cache, **ORDERS[order])
    return rows_of(loader)[0], loader.source.cache.fills


@pytest.mark.parametrize("order", ["sequential", "full"])
def test_processes_filling_one_directory_download_each_piece_once(uri, tmp_path, order):
    cache = str(tmp_path / "c")
    context = multiprocessing.get_context("spawn")
    with context.Pool(4) as pool:
        results = pool.starmap(read_epoch, [(uri, cache, order)] * 4)
    want = rows_of(loader_of(uri, **ORDERS[order]))[0]
    assert all(ids == want for ids, _ in results)
    assert sum(fills for _, fills in results) == 6  # 3 fragments of 2 pieces, each once


def test_threads_filling_one_memory_cache_download_each_piece_once(uri, small_pieces):
    loader = loader_of(uri, cache="memory", shuffle=True, num_workers=4, rows_per_read=500)
    assert sorted(rows_of(loader)[0]) == list(range(ROWS))
    assert loader.source.cache.fills == 6


def hold_lock(root: str, name: str, ready) -> None:
    with DiskCache(root, 1 << 20)._lock(name, block=True):
        ready.set()
        time.sleep(600)


def test_a_filler_killed_while_holding_a_piece_does_not_block_the_others(tmp_path):
    """The kernel releases a dead holder's flock: the next filler waits for nobody."""
    root = str(tmp_path)
    context = multiprocessing.get_context("spawn")
    ready = context.Event()
    holder = context.Process(target=hold_lock, args=(root, "piece", ready))
    holder.start()
    assert ready.wait(60)
    cache = DiskCache(root, 1 << 20)
    assert cache.fill("piece", lambda: pa.table({"x": [1]}), block=False) is None  # held
    os.kill(holder.pid, signal.SIGKILL)
    holder.join(10)
    started = time.monotonic()
    table = cache.fill("piece", lambda: pa.table({"x": [1]}), block=True)
    assert table is not None and table.column("x").to_pylist() == [1]
    assert time.monotonic() - started < 5


def test_a_stuck_holder_makes_waiters_fail_with_a_bound(tmp_path, monkeypatch):
    """A holder that is alive but stuck: a blocking fill and a plan wait LOCK_WAIT_S, then
    raise naming the lock file, instead of hanging."""
    root = str(tmp_path)
    context = multiprocessing.get_context("spawn")
    ready = context.Event()
    holders = [
        context.Process(target=hold_lock, args=(root, name, ready)) for name in ("piece", "plan")
    ]
    try:
        for holder in holders:
            ready.clear()
            holder.start()
            assert ready.wait(60)
        monkeypatch.setattr(locks_module, "LOCK_WAIT_S", 0.3)
        cache = DiskCache(root, 1 << 20)
        started = time.monotonic()
        with pytest.raises(TimeoutError, match=r"\.piece\.lock.*seems stuck.*fuser"):
            cache.fill("piece", lambda: pa.table({"x": [1]}), block=True)
        with pytest.raises(TimeoutError, match=r"\.plan\.lock"):
            cache.load_or_make("plan", lambda: np.arange(3))
        assert 0.5 < time.monotonic() - started < 10
    finally:
        for holder in holders:
            holder.kill()
            holder.join(10)


def test_a_damaged_piece_is_filled_again_and_a_half_written_one_never_read(
    uri, tmp_path, small_pieces
):
    cache = str(tmp_path / "c")
    rows_of(loader_of(uri, cache=cache))
    pieces = sorted(Path(cache).glob("*.arrow"))
    assert len(pieces) == 6
    pieces[0].write_bytes(pieces[0].read_bytes()[:100])  # truncated by a failing disk
    leftover = Path(cache) / ".tmp-dead-writer"  # a writer died before its rename
    leftover.write_bytes(b"garbage")
    loader = loader_of(uri, cache=cache)
    assert rows_of(loader) == rows_of(loader_of(uri))
    assert loader.source.cache.fills == 1


def test_stale_temporary_files_are_removed_by_the_next_eviction(tmp_path):
    cache = DiskCache(tmp_path, 1 << 20)
    stale = tmp_path / f"{TEMPORARY}old"
    stale.write_bytes(b"x" * 100)
    os.utime(stale, (0, 0))
    cache.put("a", pa.table({"x": [1, 2]}))
    assert not stale.exists() and (tmp_path / "a.arrow").exists()


# --- plans: once per machine, not once per rank ------------------------------------------------


def test_a_filter_plan_is_scanned_once_and_shared_through_the_directory(uri, tmp_path):
    cache = str(tmp_path / "c")
    options = dict(filter="label = 3", splits={"a": 0.5, "b": 0.5}, split="a")
    first = loader_of(uri, cache=cache, **options)
    second = loader_of(uri, cache=cache, **options)
    assert (first.source.plan_origin, second.source.plan_origin) == ("scan", "cache")
    assert rows_of(second) == rows_of(first) == rows_of(loader_of(uri, **options))
    other = loader_of(uri, cache=cache, filter="label = 4")
    assert other.source.plan_origin == "scan"
    assert loader_of(uri, **options).source.plan_origin == "scan"  # no cache: no sharing
    assert loader_of(uri, cache=cache).source.plan_origin == "none"


# --- arguments ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cache", "size", "error", "says"),
    [
        (None, 100, ValueError, "cache_size= needs cache="),
        (3, None, TypeError, "cache must be 'auto', None, 'memory' or a directory"),
        ("memory", 0, ValueError, "cache_size must be a number of bytes >= 1"),
        ("memory", True, ValueError, "cache_size must be a number of bytes"),
        ("memory", 1.5, ValueError, "cache_size must be a number of bytes"),
    ],
)
def test_bad_cache_arguments_name_the_fix(cache, size, error, says):
    with pytest.raises(error, match=says):
        make_cache(cache, size)


def test_a_memory_cache_with_process_workers_asks_for_a_directory(uri):
    with pytest.raises(ValueError, match="/dev/shm"):
        loader_of(uri, cache="memory", worker_type="process")


def test_an_unwritable_cache_directory_is_a_clear_error(uri, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ValueError, match="cannot create the cache directory"):
        loader_of(uri, cache=str(blocker / "sub"))


def test_default_sizes_are_half_of_what_is_free(tmp_path):
    disk = make_cache(str(tmp_path), None)
    assert (
        isinstance(disk, DiskCache)
        and 0 < disk.size <= os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
    )
    memory = make_cache("memory", None)
    assert isinstance(memory, MemoryCache) and memory.size > 0


def test_stats_and_the_verdict_know_the_cache(uri, tmp_path):
    loader = loader_of(uri, cache="memory", shuffle=True)
    rows_of(loader)
    rows_of(loader)
    stats = loader.stats(epoch=-1)
    assert "100% of rows from the cache" in str(stats)
    assert stats.to_dict()["rows_cached"] == ROWS
    # Never storage: the reads were the cache's. Which other stage limits depends on the
    # machine's load (a read share under STAGE_SHARE is "hand-off" or "startup").
    assert stats.bottleneck.stage in {"training loop", "cache reads", "hand-off", "startup"}, (
        stats.bottleneck
    )
    assert "block shuffle" not in stats.bottleneck.suggestion  # no advice for storage


def test_map_dataset_reads_through_a_shared_directory(uri, tmp_path, small_pieces):
    torch = pytest.importorskip("torch")
    from lanceloader.torch import MapDataset

    cache = str(tmp_path / "c")
    first = MapDataset(uri, columns=["id"], cache=cache)
    rows = first.__getitems__(list(range(0, ROWS, 7)))
    assert [int(r["id"]) for r in rows] == list(range(0, ROWS, 7))
    second = MapDataset(uri, columns=["id"], cache=cache)
    got = [r["id"] for r in second.__getitems__([5, 4000, 3])]
    assert all(isinstance(g, torch.Tensor) for g in got) and [int(g) for g in got] == [5, 4000, 3]
    assert second.source.cache.fills == 0


def test_a_shuffle_through_a_cache_reads_more_per_read_than_an_ordered_one(tmp_path) -> None:
    """A shuffle's reads are sized as Lance takes (16,384 rows) only when they are Lance takes:
    through a cache a read gathers rows from every piece, and a larger read spreads the cost
    per piece and read (the automatic cache's second epoch: reads of 8 MiB ran 1.25-1.35x as
    fast as 16,384 rows, reads of 32 MiB 1.45-1.8x as fast as 8 MiB), within the gather bound."""
    uri = write_demo_dataset(str(tmp_path / "d.lance"), rows=100)
    plain = ll.Loader(uri, batch_size=256, shuffle=True, cache=None)
    cached = ll.Loader(uri, batch_size=256, shuffle=True, cache="memory")
    ordered = ll.Loader(uri, batch_size=256, cache=None)
    ordered_cached = ll.Loader(uri, batch_size=256, cache="memory")
    assert plain.batches_per_read * 256 == 16_384
    assert cached.batches_per_read > ordered.batches_per_read > plain.batches_per_read
    assert ordered_cached.batches_per_read == ordered.batches_per_read  # slices, not gathers
    assert ordered.batches_per_read * 256 * ordered.source.bytes_per_row <= READ_BYTES
    assert (
        READ_BYTES
        < cached.batches_per_read * 256 * cached.source.bytes_per_row
        <= READ_BYTES_GATHER
    )


def test_a_read_fills_its_largest_piece_before_a_sliver_of_another(uri, tmp_path, small_pieces):
    """A sequential read on a store begins with a few rows of the piece the read before it
    fills: it fills its own piece first, then takes those rows (it filled both, the sliver's
    first, while the read next to it waited: the first epoch through the automatic cache
    started its last fragment a round trip late). Rows 1,990-3,023: 34 rows of fragment 0's
    second piece, 1,024 of fragment 1's first."""
    source = Source(uri, COLUMNS, cache=str(tmp_path / "cache"))
    filled: list[str] = []
    fill_piece = source.cache.fill_piece

    def recording(name, load, block):
        filled.append(name)
        return fill_piece(name, load, block)

    source.cache.fill_piece = recording
    table = source.read(np.arange(1990, 3024))
    assert table.column("id").to_pylist() == list(range(1990, 3024))
    size = source.cached.piece_rows
    assert filled == [
        cache_module.piece_name(source.cached.fragment_keys[1], size, 0),
        cache_module.piece_name(source.cached.fragment_keys[0], size, 1),
    ]


@pytest.mark.parametrize("worker_type", ["thread", "process"])
def test_the_fills_of_every_worker_reach_the_loaders_stats(
    uri, tmp_path, small_pieces, worker_type
):
    """Process workers fill the cache in processes of their own: their fills were missing from
    the main process's stats (0 where thread workers showed every piece). Every piece is
    filled once, by some worker, and ``stats()`` counts it there, in both."""
    loader = loader_of(
        uri, cache=str(tmp_path / "c"), shuffle=True, num_workers=2, worker_type=worker_type
    )
    rows_of(loader)
    rows_of(loader)
    stats = loader.stats()
    assert stats.cache_fills == len(list((tmp_path / "c").glob("*.arrow"))) == 6
    assert "6 pieces filled into the cache" in str(stats)
