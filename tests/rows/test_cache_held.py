"""The pieces a process holds (checked copies, never mapped): within 256 MiB on a disk, within a
share of the memory available for a directory in memory (the automatic cache, ``/dev/shm``);
the held pieces stay under a shuffle over more than fit; rows are copied out of them."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
from test_cache import COLUMNS, ROWS, loader_of, rows_of

from lanceloader.demo import write_demo_dataset
from lanceloader.rows.cache import auto as autocache_module
from lanceloader.rows.cache import held as held_module
from lanceloader.rows.cache import pieces as cache_module
from lanceloader.rows.cache.disk import DiskCache
from lanceloader.rows.cache.files import in_memory_filesystem
from lanceloader.rows.cache.held import HeldPieces
from lanceloader.rows.cache.pieces import make_cache
from lanceloader.rows.lance.source import Source


@pytest.fixture(scope="module")
def uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    """6,000 demo rows in 3 fragments of 2,000 (as ``test_cache.py``'s)."""
    return write_demo_dataset(tmp_path_factory.mktemp("cache") / "d.lance", rows=ROWS, fragments=3)


@pytest.fixture
def small_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pieces of 1,024 rows (the minimum): 2 of each 2,000-row fragment, the second short."""
    monkeypatch.setattr(cache_module, "PIECE_BYTES", 1)


def test_a_shuffle_over_more_pieces_than_are_held_keeps_the_held_ones(
    uri, tmp_path, small_pieces, monkeypatch
):
    """Room in memory for 3 of the 6 pieces, each read wanting all 6: least-recently-used
    eviction dropped each piece just before its next use and read all 6 whole for every read;
    now the 3 held stay and only the other 3 are read from their files."""
    loader = loader_of(
        uri, cache=str(tmp_path / "c"), shuffle=True, rows_per_read=1000, num_workers=1
    )
    rows_of(loader)
    cache = loader.source.cache
    assert not cache.in_memory
    piece = max(table.nbytes for _, table, _ in cache.held._tables.values())
    monkeypatch.setattr(held_module, "HELD_BYTES", 3 * piece + piece // 2)
    cache.held, cache.reads_whole = HeldPieces(cache._root_text, False), 0
    assert sorted(rows_of(loader)[0]) == list(range(ROWS))
    assert len(cache.held) == 3
    assert cache.reads_whole <= 3 * 6 + 3  # 6 reads: 3 unheld pieces each, the first 3 once


@pytest.mark.parametrize("worker_type", ["thread", "process"])
def test_the_automatic_cache_holds_its_pieces_beyond_the_disk_budget(
    uri, tmp_path, small_pieces, monkeypatch, worker_type
):
    """Pieces of a directory on a disk held in a process are capped (``HELD_BYTES``); a full
    shuffle over more pieces than that reads every piece beyond it whole, for every read (the
    second epoch of the default shuffle of 1M rows ran at 0.13x a scan). The automatic cache's
    directory is in memory: its pieces are held within a share of the memory available, so
    none is read again from its file, in threads or processes, and every row is the one Lance
    has, in the same order."""
    monkeypatch.setattr(autocache_module, "AUTO_SHM_DIR", tmp_path)
    monkeypatch.setattr(held_module, "HELD_BYTES", 1)  # no room on a disk's budget
    plain = loader_of(uri, shuffle=True, cache=None)
    loader = loader_of(
        uri, shuffle=True, rows_per_read=1000, num_workers=1, worker_type=worker_type
    )
    cache = loader.source.cache
    assert isinstance(cache, DiskCache) and cache.in_memory
    assert rows_of(loader) == rows_of(plain)  # the first epoch fills the directory
    if worker_type == "thread":
        cache.reads_whole = 0
    assert rows_of(loader) == rows_of(plain)
    assert loader.stats(epoch=-1).rows_cached == ROWS
    if worker_type == "thread":  # process workers each have their own copy of the cache
        assert cache.reads_whole == 0 and len(cache.held) == 6  # held since they were filled
    assert pickle.loads(pickle.dumps(cache)).in_memory  # workers too


@pytest.fixture
def shm_dir():
    """A fresh directory under /dev/shm (tmpfs), removed afterwards; skipped without one."""
    import shutil
    import tempfile

    if not in_memory_filesystem("/dev/shm"):
        pytest.skip("no tmpfs at /dev/shm on this machine")
    path = tempfile.mkdtemp(dir="/dev/shm", prefix="lanceloader-test-")
    try:
        yield Path(path)
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_a_directory_given_in_memory_holds_its_pieces_and_reads_each_once(
    uri, shm_dir, small_pieces, monkeypatch
):
    """``cache="/dev/shm/..."`` (what the guide and the process-worker error advise) was read
    with ``pread`` and held within ``HELD_BYTES``: a full shuffle over more than that read every
    piece whole for every read (2M rows of 272 B: epoch 2 at 0.62M rows/s). A directory on
    tmpfs is held like the automatic cache: each piece read whole once, checked and held, and
    the rows are Lance's, in the same order."""
    monkeypatch.setattr(held_module, "HELD_BYTES", 1)  # no room on a disk's budget
    plain = loader_of(uri, shuffle=True, cache=None)
    loader = loader_of(
        uri, shuffle=True, rows_per_read=1000, num_workers=1, cache=str(shm_dir / "given")
    )
    cache = loader.source.cache
    assert isinstance(cache, DiskCache) and cache.in_memory
    assert rows_of(loader) == rows_of(plain)  # the first epoch fills the directory
    cache.held, cache.reads_whole = HeldPieces(cache._root_text, True), 0  # as a new process
    assert rows_of(loader) == rows_of(plain)
    assert loader.stats(epoch=-1).rows_cached == ROWS
    assert cache.reads_whole == 6 and len(cache.held) == 6


def test_a_directory_given_on_a_disk_is_held_within_the_disk_budget(tmp_path):
    """A directory on a disk keeps the per-process budget of ``HELD_BYTES``."""
    if in_memory_filesystem(tmp_path):
        pytest.skip("the temporary directory is on tmpfs here")
    cache = make_cache(str(tmp_path / "c"), 1 << 20)
    assert not cache.in_memory and cache.held.room() == held_module.HELD_BYTES


def test_a_path_is_in_memory_by_the_longest_mount_point_holding_it(tmp_path):
    mounts = tmp_path / "mounts"
    mounts.write_text(
        "/dev/vda / ext4 rw 0 0\n"
        "tmpfs /dev/shm tmpfs rw 0 0\n"
        "/dev/vdb /dev/shm/disk ext4 rw 0 0\n"
        "none /mnt/my\\040ram ramfs rw 0 0\n"
        "tmpfs /run tmpfs rw 0 0\n"
    )

    def on(path: str) -> bool:
        return in_memory_filesystem(path, str(mounts))

    assert on("/dev/shm") and on("/dev/shm/lance-cache") and on("/mnt/my ram/c")
    assert not on("/dev/shm/disk/c") and not on("/dev/shmx/c") and not on("/data")
    assert not in_memory_filesystem("/dev/shm", str(tmp_path / "missing"))  # not Linux: a disk


def test_rows_of_a_piece_held_for_a_directory_in_memory_are_copied_out(uri, tmp_path, small_pieces):
    """Consecutive rows of one piece were a slice of it: of a piece every read of the process
    shares, which a torch tensor wraps as writable, so an in-place write would change it."""
    source = Source(uri, columns=COLUMNS, cache=str(tmp_path / "c"), cache_size=1 << 30)
    want = source.read_table(np.arange(ROWS))  # fills every piece
    source.cache = DiskCache(source.cache.root, source.cache.size, in_memory=True)
    table = source.read_table(np.arange(10, 110))  # consecutive rows of one piece
    assert len(source.cache.held) and table.equals(want.slice(10, 100))
    assert all(
        buffer.is_mutable
        for column in table.columns
        for chunk in column.chunks
        for buffer in chunk.buffers()
        if buffer is not None
    )


def test_a_fresh_process_takes_a_few_rows_of_pieces_it_does_not_hold_from_the_dataset(
    uri, shm_dir, small_pieces
):
    """A fresh worker's first read of a filled directory in memory took a few rows of every
    piece and copied and checked each piece whole (100M rows, 8 workers: 2.1 s to the first
    batch); now a sliver of a piece not held is read whole only on the fill credit, else from
    the dataset, and the rows are the same. Later reads earn the credit and hold the pieces."""
    plain = loader_of(uri, shuffle=True, cache=None).source
    loader = loader_of(
        uri, shuffle=True, rows_per_read=1000, num_workers=1, cache=str(shm_dir / "given")
    )
    rows_of(loader)  # fills every piece
    source, cache = loader.source, loader.source.cache
    cache.held, cache.reads_whole = HeldPieces(cache._root_text, True), 0  # as a new process
    source.cached.fill_credit = 0.0
    few = np.random.default_rng(1).choice(ROWS, 24, replace=False)  # a sliver of each piece
    read = source.read_rows(few)
    assert read.rows.equals(plain.read_rows(few).rows)
    assert cache.reads_whole == 0 and read.rows_cached == 0
    many = np.random.default_rng(2).permutation(ROWS)[:3000]
    assert source.read_rows(many).rows.equals(plain.read_rows(many).rows)
    assert cache.reads_whole > 0 and len(cache.held) == cache.reads_whole
