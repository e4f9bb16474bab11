"""The cache directory under damage and pressure: what it serves is checked (damaged bytes in a
piece or a plan, pieces swapped), a file truncated under a reader never kills it, the cap holds
at every instant under concurrent fills, a full disk, a read-only and a removed directory never
stop training, and every cache failure names the cache directory, never the dataset.

A full disk and a read-only directory are real: a tmpfs, and a read-only bind mount, in a mount
namespace of a child process (``unshare -m``, root only); where that is not allowed, the full
disk is emulated with ``RLIMIT_FSIZE`` in the child (writes fail with ``EFBIG``) and the
read-only case is skipped.
"""

from __future__ import annotations

import contextlib
import json
import logging
import multiprocessing
import os
import shutil
import struct
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

import numpy as np
import pytest

import lanceloader as ll
from lanceloader.demo import write_demo_dataset
from lanceloader.rows.cache import disk as disk_cache_module
from lanceloader.rows.cache import files as cache_files
from lanceloader.rows.cache import locks as locks_module
from lanceloader.rows.cache import pieces as cache_module
from lanceloader.rows.cache.files import CacheError
from lanceloader.rows.lance.source import Source

COLUMNS = ["id", "label", "x"]
ROWS = 6000
HERE = Path(__file__).resolve().parents[1]  # tests/


@pytest.fixture(scope="module")
def uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    """6,000 demo rows in 3 fragments: 6 pieces of 1,024 rows (2 per fragment) with
    ``small_pieces``."""
    return write_demo_dataset(tmp_path_factory.mktemp("damage") / "d.lance", rows=ROWS, fragments=3)


@pytest.fixture(autouse=True)
def small_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache_module, "PIECE_BYTES", 1)


def read_all(source: Source, positions: np.ndarray | None = None) -> dict[str, list]:
    positions = np.arange(source.num_rows) if positions is None else positions
    return source.read_table(positions).to_pydict()


def filled(uri: str, cache: Path, **kwargs) -> Source:
    """A source whose cache directory holds every piece (one sequential pass)."""
    source = Source(uri, columns=COLUMNS, cache=str(cache), cache_size=1 << 30, **kwargs)
    for start in range(0, source.num_rows, 1000):
        source.read_table(np.arange(start, min(start + 1000, source.num_rows)))
    return source


def pieces(cache: Path) -> list[Path]:
    return sorted(cache.glob("*.arrow"))


# --- what the cache serves is checked ----------------------------------------------------------


def test_random_bytes_written_into_a_piece_are_caught_and_read_again(uri, tmp_path):
    cache = tmp_path / "c"
    filled(uri, cache)
    want = read_all(Source(uri, columns=COLUMNS))
    rng = np.random.default_rng(0)
    for piece in pieces(cache):  # 8 random bytes in the middle: inside the `x` column's data
        with open(piece, "r+b") as file:
            file.seek(piece.stat().st_size // 2)
            file.write(rng.bytes(8))
    source = Source(uri, columns=COLUMNS, cache=str(cache), cache_size=1 << 30)
    assert read_all(source) == want
    assert source.cache.damaged == 6 and source.cache.fills == 6  # each dropped and filled
    assert read_all(source) == want and source.cache.damaged == 6  # and good from then on


def test_pieces_an_older_version_wrote_are_read_again_without_a_warning(uri, tmp_path, caplog):
    """Piece files with the trailer of lanceloader before XXH3 (a CRC-32 and the magic
    ``LLCACHE1``), as an upgrade finds them: each dropped and filled again, rows right, and
    neither counted as damaged nor warned about (an INFO line each)."""
    cache = tmp_path / "c"
    filled(uri, cache)
    want = read_all(Source(uri, columns=COLUMNS))
    for piece in pieces(cache):
        data = piece.read_bytes()
        payload = data[: -cache_files.TRAILER.size]
        _, extra, _, _ = cache_files.TRAILER.unpack(data[-cache_files.TRAILER.size :])
        old = struct.pack("<QQI8s", len(payload), extra, zlib.crc32(payload), b"LLCACHE1")
        piece.write_bytes(payload + old)
    source = Source(uri, columns=COLUMNS, cache=str(cache), cache_size=1 << 30)
    with caplog.at_level(logging.INFO, logger="lanceloader"):
        assert read_all(source) == want
    assert source.cache.damaged == 0 and source.cache.fills == 6
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert sum("older lanceloader" in r.getMessage() for r in caplog.records) == 6
    assert read_all(source) == want and source.cache.fills == 6  # the new files serve now


@pytest.mark.parametrize("worker_type", ["thread", "process"])
def test_damaged_pieces_are_counted_in_the_loaders_stats(uri, tmp_path, worker_type):
    """What the cache dropped reaches ``stats()`` (and its table), from threads and processes."""
    cache = tmp_path / "c"
    filled(uri, cache)
    for piece in pieces(cache)[:4]:
        with open(piece, "r+b") as file:
            file.seek(piece.stat().st_size // 2)
            file.write(b"\xff" * 8)
    loader = ll.Loader(
        uri,
        batch_size=500,
        columns=COLUMNS,
        cache=str(cache),
        cache_size=1 << 30,
        num_workers=2,
        worker_type=worker_type,
    )
    ids = [int(i) for batch in loader for i in batch["id"]]
    assert ids == list(range(ROWS))
    stats = loader.stats()
    assert stats.cache_damaged == 4
    assert "4 damaged cache files dropped and read again" in str(stats)


def mapped(source: Source) -> Source:
    """``source`` reading its directory as the automatic cache does (in memory: every piece
    read whole and held)."""
    source.cache = disk_cache_module.DiskCache(source.cache.root, source.cache.size, in_memory=True)
    return source


@pytest.mark.parametrize("kind", ["read", "mapped"])
def test_bytes_changed_between_two_reads_of_one_source_are_caught(uri, tmp_path, kind):
    cache = tmp_path / "c"
    source = filled(uri, cache)
    if kind == "mapped":
        read_all(mapped(source))  # every piece mapped before the damage
    want = read_all(Source(uri, columns=COLUMNS))
    piece = pieces(cache)[0]
    with open(piece, "r+b") as file:
        file.seek(piece.stat().st_size // 2)
        file.write(b"\xff" * 8)
    assert read_all(source) == want and source.cache.damaged == 1


@pytest.mark.parametrize("kind", ["read", "mapped"])
def test_two_piece_files_swapped_are_caught(uri, tmp_path, kind):
    cache = tmp_path / "c"
    filled(uri, cache)
    want = read_all(Source(uri, columns=COLUMNS))
    source = Source(uri, columns=COLUMNS, cache=str(cache), cache_size=1 << 30)
    if kind == "mapped":
        read_all(mapped(source))  # mapped before the swap: the renames are seen
        source.cache.damaged = 0
    a, b = pieces(cache)[0], pieces(cache)[3]
    a.rename(tmp_path / "swap")
    b.rename(a)
    (tmp_path / "swap").rename(b)
    assert read_all(source) == want
    assert source.cache.damaged == 2


@pytest.mark.parametrize("where", ["data", "header"])
def test_a_damaged_filter_plan_is_caught_and_scanned_again(uri, tmp_path, where):
    cache = tmp_path / "c"
    options = {"filter": "label < 5"}
    want = read_all(Source(uri, columns=COLUMNS, **options))
    first = Source(uri, columns=COLUMNS, cache=str(cache), **options)
    assert first.plan_origin == "scan"
    (plan,) = cache.glob("plan-*.npy")
    data = bytearray(plan.read_bytes())
    if where == "header":  # the header's dict left open: NumPy's parser raised TokenError
        at = data.index(b"}")
        data[at : at + 1] = b" "
    else:  # a row offset
        data[len(data) // 2] ^= 0x41
    plan.write_bytes(bytes(data))
    second = Source(uri, columns=COLUMNS, cache=str(cache), **options)
    assert second.plan_origin == "scan"  # not the damaged plan
    assert read_all(second) == want
    assert Source(uri, columns=COLUMNS, cache=str(cache), **options).plan_origin == "cache"


@pytest.mark.parametrize("kind", ["read", "mapped"])
def test_a_piece_file_grown_past_the_cap_is_damaged_not_read(uri, tmp_path, kind):
    """A piece file another process extended to 1 TiB (sparse): a whole read would allocate
    it; it is larger than any file the cache writes, so it is dropped and read again."""
    cache = tmp_path / "c"
    filled(uri, cache)
    want = read_all(Source(uri, columns=COLUMNS))
    os.truncate(pieces(cache)[0], 1 << 40)
    source = Source(uri, columns=COLUMNS, cache=str(cache), cache_size=1 << 30)
    if kind == "mapped":
        mapped(source)
    assert read_all(source) == want and source.cache.damaged == 1


# --- a file truncated under a reader ----------------------------------------------------------


def read_while_truncated(uri: str, cache: str, done, result) -> None:
    """In a fresh process: epochs of random reads through the cache until ``done``; the number
    of epochs and of wrong rows. A hang dumps the stacks and exits."""
    import faulthandler

    faulthandler.dump_traceback_later(60, exit=True)
    cache_module.PIECE_BYTES = 1
    plain = Source(uri, columns=["id", "x"])
    source = Source(uri, columns=["id", "x"], cache=cache, cache_size=1 << 30)
    want = plain.read_table(np.arange(ROWS))
    rng, epochs, wrong = np.random.default_rng(1), 0, 0
    while not done.is_set() or epochs < 3:
        order = rng.permutation(ROWS)
        got = source.read_table(order)
        wrong += int(not got.equals(want.take(order)))
        epochs += 1
    result.put((epochs, wrong))


def test_pieces_truncated_while_read_never_kill_the_reader(uri, tmp_path):
    """Real truncation (``os.truncate``) of the files a process is reading, over and over: on a
    mapped file that is SIGBUS; here the reader catches it, reads again, delivers right rows."""
    cache = tmp_path / "c"
    filled(uri, cache)
    context = multiprocessing.get_context("spawn")
    done, result = context.Event(), context.Queue()
    reader = context.Process(target=read_while_truncated, args=(uri, str(cache), done, result))
    reader.start()
    try:
        rng, deadline = np.random.default_rng(2), time.monotonic() + 3
        while time.monotonic() < deadline and reader.is_alive():
            for piece in pieces(cache):
                with contextlib.suppress(FileNotFoundError):  # dropped meanwhile
                    os.truncate(piece, int(rng.integers(0, max(1, piece.stat().st_size))))
            time.sleep(0.002)
        done.set()
        epochs, wrong = result.get(timeout=90)
    finally:
        done.set()
        reader.join(60)
        if reader.is_alive():
            reader.kill()
    assert reader.exitcode == 0, f"the reader died: exit {reader.exitcode}"
    assert epochs >= 3 and wrong == 0


# --- the cap --------------------------------------------------------------------------------


def directory_bytes(cache: Path) -> int:
    total = 0
    try:
        entries = list(os.scandir(cache))
    except FileNotFoundError:
        return 0
    for entry in entries:
        if entry.name.endswith(".lock"):
            continue
        with contextlib.suppress(FileNotFoundError):  # evicted meanwhile
            total += entry.stat().st_size
    return total


def fill_concurrently(uri: str, cache: str, cap: int, seed: int) -> None:
    """In a fresh process: an epoch of 4 threads through the capped directory."""
    cache_module.PIECE_BYTES = 1
    source = Source(uri, columns=COLUMNS, cache=cache, cache_size=cap)
    blocks = np.array_split(np.random.default_rng(seed).permutation(ROWS // 500) * 500, 8)
    threads = [
        threading.Thread(target=lambda b=b: [source.read_table(np.arange(s, s + 500)) for s in b])
        for b in blocks
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def test_the_cap_holds_at_every_instant_under_concurrent_fills(uri, tmp_path):
    """Two processes of 8 threads each fill a directory capped at 1.5 pieces; a thread polls its
    size (temporary reservations included) all along."""
    cache = tmp_path / "c"
    piece = 1024 * Source(uri, columns=COLUMNS).bytes_per_row
    cap = int(1.5 * piece)
    largest, stop = [0], threading.Event()

    def poll() -> None:
        while not stop.is_set():
            largest[0] = max(largest[0], directory_bytes(cache))
            time.sleep(0.0002)

    poller = threading.Thread(target=poll)
    poller.start()
    context = multiprocessing.get_context("spawn")
    try:
        workers = [
            context.Process(target=fill_concurrently, args=(uri, str(cache), cap, s))
            for s in range(2)
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(120)
            assert worker.exitcode == 0
    finally:
        stop.set()
        poller.join()
    assert 0 < largest[0] <= cap
    assert not list(cache.glob(".tmp-*"))  # no reservation stays behind


def test_a_cap_below_one_piece_reads_what_no_cache_reads_and_says_so(uri, tmp_path):
    """Pieces are never downloaded whole when they cannot be kept: the same Lance bytes as
    without a cache, and no row counted as served by the cache."""
    cache = str(tmp_path / "c")
    for positions in (np.arange(ROWS), np.random.default_rng(3).permutation(ROWS)):
        plain = Source(uri, columns=COLUMNS)
        small = Source(uri, columns=COLUMNS, cache=cache, cache_size=100_000)
        io_plain = io_small = cached = 0
        for chunk in np.array_split(positions, 12):
            a, b = plain.read_rows(chunk), small.read_rows(chunk)
            assert a.rows.equals(b.rows)
            io_plain, io_small, cached = (
                io_plain + a.io_bytes,
                io_small + b.io_bytes,
                cached + b.rows_cached,
            )
        assert io_small <= io_plain and cached == 0
        assert small.cache.used_bytes() <= 100_000


# --- a full disk, a read-only and a removed directory ----------------------------------------

CHILD = r"""
import json, logging, sys
import numpy as np
sys.path.insert(0, {tests!r})
from lanceloader.rows.cache import pieces as cache_module
from lanceloader.rows.lance.source import Source
cache_module.PIECE_BYTES = 1
logging.basicConfig(level=logging.WARNING, format="WARNING %(message)s")
uri, cache, size, options = {uri!r}, {cache!r}, {size!r}, {options!r}
plain = Source(uri, columns=["id", "label", "x"], **options)
source = Source(uri, columns=["id", "label", "x"], cache=cache, cache_size=size,
                **options)
right, iops, cached = 0, 0, 0
for epoch in range(2):
    order = np.random.default_rng(epoch).permutation(source.num_rows)
    for chunk in np.array_split(order, 6):
        read = source.read_rows(chunk)
        right += int(read.rows.equals(plain.read_table(chunk)))
        iops, cached = iops + read.io_iops, cached + read.rows_cached
print(json.dumps({{"right": right, "iops": iops, "cached": cached,
                  "plan": source.plan_origin}}))
"""


def can_mount() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode == 0


def run_child(
    uri: str, cache: str, size: int | None, options: dict, mount: str = "", fsize: int | None = None
) -> tuple[dict, str]:
    """The ``CHILD`` script in a fresh process (under ``mount``, shell commands run in a new
    mount namespace first; with ``fsize``, RLIMIT_FSIZE); its result and its log."""
    script = CHILD.format(tests=str(HERE), uri=uri, cache=cache, size=size, options=options)
    if fsize is not None:
        script = (
            f"import resource; resource.setrlimit(resource.RLIMIT_FSIZE, ({fsize}, "
            f"{fsize}))\n" + script
        )
    command = [sys.executable, "-c", script]
    if mount:
        command = ["unshare", "-m", "sh", "-c", f'{mount} && exec "$@"', "sh", *command]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=300, cwd=str(HERE.parent)
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


@pytest.mark.parametrize("disk", ["tmpfs", "file size limit"])
def test_a_full_disk_degrades_to_uncached_reads_with_one_warning(uri, tmp_path, disk):
    cache = tmp_path / "small"
    cache.mkdir()
    if disk == "tmpfs":
        if not can_mount():
            pytest.skip("no mount namespace here (needs root and unshare)")
        # 600 kB of tmpfs, a cap of 100 MB: the disk fills long before the cap
        result, log = run_child(
            uri, str(cache), 100 << 20, {}, mount=f"mount -t tmpfs -o size=600k tmpfs {cache}"
        )
    else:
        # no file may exceed 100 kB (a piece is 280 kB): every write fails with EFBIG
        result, log = run_child(uri, str(cache), 100 << 20, {}, fsize=100_000)
    assert result["right"] == 12  # every read right, none raised
    warnings = [line for line in log.splitlines() if line.startswith("WARNING")]
    assert len(warnings) == 1, log
    assert str(cache) in warnings[0] and "Fix:" in warnings[0]
    assert "dataset may be" not in log


def test_a_read_only_cache_with_every_piece_is_read(uri, tmp_path):
    if not can_mount():
        pytest.skip("no mount namespace here (needs root and unshare)")
    cache = tmp_path / "c"
    options = {"filter": "label < 7"}
    filled(uri, cache, **options)
    read_only = f"mount --bind {cache} {cache} && mount -o remount,bind,ro {cache}"
    result, log = run_child(uri, str(cache), 1 << 30, options, mount=read_only)
    assert result["right"] == 12 and result["iops"] == 0  # every row from the cache
    assert result["plan"] == "cache" and result["cached"] == 2 * 4200
    assert "WARNING" not in log


def test_a_read_only_cache_missing_pieces_reads_them_from_the_dataset(uri, tmp_path):
    if not can_mount():
        pytest.skip("no mount namespace here (needs root and unshare)")
    cache = tmp_path / "c"
    cache.mkdir()
    read_only = f"mount --bind {cache} {cache} && mount -o remount,bind,ro {cache}"
    result, log = run_child(uri, str(cache), 1 << 30, {"filter": "label < 7"}, mount=read_only)
    assert result["right"] == 12 and result["plan"] == "scan"
    warnings = [line for line in log.splitlines() if line.startswith("WARNING")]
    assert len(warnings) == 1 and str(cache) in warnings[0] and "read-only" in warnings[0]


def test_a_cache_directory_removed_while_in_use_is_made_again(uri, tmp_path, caplog):
    cache = tmp_path / "c"
    source = Source(uri, columns=COLUMNS, cache=str(cache), cache_size=1 << 30)
    want = read_all(Source(uri, columns=COLUMNS))
    source.read_table(np.arange(1000))
    shutil.rmtree(cache)
    with caplog.at_level(logging.WARNING, logger="lanceloader"):
        assert read_all(source) == want
    assert pieces(cache)  # made again, and filled
    assert str(cache) in caplog.text and "removed while in use" in caplog.text
    assert "dataset may be" not in caplog.text


def test_a_cache_failure_names_the_cache_directory_never_the_dataset(uri, tmp_path, monkeypatch):
    """A lock held by a stuck process: the error names the directory and the lock, through a
    Loader read as well, and is no dataset ReadError text."""
    cache = tmp_path / "c"
    source = Source(uri, columns=COLUMNS, cache=str(cache), cache_size=1 << 30)
    name = cache_module.piece_name(source.cached.fragment_keys[0], source.cached.piece_rows, 0)
    context = multiprocessing.get_context("spawn")
    ready = context.Event()
    from test_cache import hold_lock

    holder = context.Process(target=hold_lock, args=(str(cache), name, ready))
    holder.start()
    try:
        assert ready.wait(60)
        monkeypatch.setattr(locks_module, "LOCK_WAIT_S", 0.2)
        loader = ll.Loader(
            source.uri,
            batch_size=100,
            columns=COLUMNS,
            cache=str(cache),
            cache_size=1 << 30,
            num_workers=1,
        )
        with pytest.raises(ll.ReadError) as info:
            list(loader)
    finally:
        holder.kill()
        holder.join(10)
    text = str(info.value)
    assert isinstance(info.value, CacheError) and isinstance(info.value, TimeoutError)
    assert str(cache) in text and "fuser" in text
    assert "dataset may be" not in text and "restore" not in text
