"""Recycled shared memory for process workers' results (engine/segments.py): a segment is
written again only once every array of its last result is gone, in the consumer and in a
process forked from it; nothing is left in /dev/shm. A task's gathers write straight into a free segment."""

from __future__ import annotations

import gc
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import workerfns
from lanceloader.engine import segments as segments_module
from lanceloader.engine.pool import Ordered
from lanceloader.engine.processes import ProcessPool
from lanceloader.engine.segments import IDLE_PACKS, SLOTS, Leases, Segments
from lanceloader.rows.gather import gather_rows


def result(x: int, rows: int = 1000) -> dict:
    """A result like a read's: batches that are row slices of one array per column."""
    column = np.full((rows, 8), x, dtype=np.float32)
    return {"batches": [column[i : i + 100] for i in range(0, rows, 100)], "x": x}


def holds(back: dict, x: int) -> bool:
    return back["x"] == x and all(bool((b == x).all()) for b in back["batches"])


@pytest.fixture
def pair(tmp_path: Path):
    """A worker's segments and the consumer's leases, in this process."""
    base = Path("/dev/shm") / f"lanceloader-test-{os.getpid()}-{tmp_path.name}"
    yield Segments(base), Leases(), base
    for leftover in Path("/dev/shm").glob(f"{base.name}*"):
        leftover.unlink()


def test_a_segment_is_written_again_only_once_its_arrays_are_gone(pair) -> None:
    """Results dropped give their segment back (the next goes into memory used before);
    results held keep theirs unchanged while other results come and go."""
    segments, leases, base = pair
    wheres, kept = [], {}
    for x in range(40):
        back = leases.unpack(*(packed := segments.pack(result(x), base.with_suffix(f".{x}"))))
        wheres.append(packed[2])
        assert holds(back, x)
        if x % 10 == 0:
            kept[x] = back["batches"][3]  # one batch of the result, not the whole result
        del back
    gc.collect()
    assert all(bool((batch == x).all()) for x, batch in kept.items())
    slots = [w[1] for w in wheres]
    assert all(isinstance(w, tuple) for w in wheres)  # never a file of its own: slots free
    assert len(set(slots)) <= len(kept) + 1  # recycled: each held result pins one slot
    assert {w[1] for x, w in enumerate(wheres) if x in kept}.isdisjoint(
        w[1] for x, w in enumerate(wheres) if x > max(kept)
    )  # the slot of the last held result was never written after it
    assert list(Path("/dev/shm").glob(f"{base.name}*")) == []  # names unlinked when mapped


def test_with_every_slot_held_a_result_gets_a_file_of_its_own(pair) -> None:
    segments, leases, base = pair
    held = [
        leases.unpack(*segments.pack(result(x), base.with_suffix(f".{x}"))) for x in range(SLOTS)
    ]
    packed = segments.pack(result(99), base.with_suffix(".99"))
    assert isinstance(packed[2], str)  # the worker never waits for the consumer
    assert holds(leases.unpack(*packed), 99)
    assert all(holds(back, x) for x, back in enumerate(held))
    assert not Path(packed[2]).exists()


def test_a_larger_result_replaces_a_free_segment_too_small(pair) -> None:
    segments, leases, base = pair
    small = leases.unpack(*segments.pack(result(1, rows=100), base.with_suffix(".1")))
    del small
    big = leases.unpack(*(packed := segments.pack(result(2, rows=200_000), base.with_suffix(".2"))))
    assert holds(big, 2) and isinstance(packed[2], tuple)


def test_slots_held_at_a_fork_are_never_written_again(pair) -> None:
    """A process forked from the consumer holds a copy of its batches' mappings (shared with
    the worker): the parent dropping them must not let the worker overwrite them."""
    segments, leases, base = pair
    back = leases.unpack(*(first := segments.pack(result(7), base.with_suffix(".7"))))
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: wait until the parent let go and wrote more, then check
        os.close(write)
        os.read(read, 1)
        os._exit(0 if holds(back, 7) else 1)
    os.close(read)
    del back
    gc.collect()
    later = [segments.pack(result(x), base.with_suffix(f".{x}"))[2] for x in range(8, 20)]
    assert first[2][1] not in {w[1] for w in later if isinstance(w, tuple)}
    os.write(write, b"x")
    os.close(write)
    assert os.waitpid(pid, 0)[1] == 0


def test_a_pools_results_stay_intact_while_held_and_nothing_is_left() -> None:
    """Through real worker processes: every third result held to the end, the others dropped
    as they come; each held one is still what its worker sent."""
    prefix = f"lanceloader-pool-{os.getpid()}-"
    held = {}
    with Ordered(ProcessPool(workerfns.echo, 2), iter(range(60)), 4) as results:
        for r in results:
            if r["x"] % 3 == 0:
                held[r["x"]] = r["value"]
    assert sorted(held) == list(range(0, 60, 3))
    assert all(bool((value == x).all()) for x, value in held.items())
    assert list(Path("/dev/shm").glob(f"{prefix}*")) == []


def gathered(parts: list[pa.Table], x: int) -> dict:
    """A read through a cache: a gather of rows of ``parts``, converted, sliced in batches."""
    n = sum(len(p) for p in parts)
    table = gather_rows(
        parts, [None] * len(parts), [np.arange(n)[k :: len(parts)] for k in range(len(parts))], n
    )
    column = table.column("v").to_numpy()
    return {"batches": [column[i : i + 100] for i in range(0, n, 100)], "x": x}


def test_a_gather_in_a_task_writes_straight_into_the_segment(pair, monkeypatch) -> None:
    """Gathered columns lie in the segment the result travels in: nothing is copied into it;
    the rows come back as gathered."""
    segments, leases, base = pair
    parts = [pa.table({"v": np.arange(k, 4000, 2, dtype=np.int64)}) for k in range(2)]
    first = leases.unpack(*segments.pack(gathered(parts, 0), base.with_suffix(".0")))
    del first
    writes = []
    monkeypatch.setattr(segments_module, "write_into", lambda *a: writes.append(a))
    with segments.arena() as arena:
        assert arena is not None
        packed = segments.pack(gathered(parts, 1), base.with_suffix(".1"), arena)
    back = leases.unpack(*packed)
    assert writes == [] and back["x"] == 1
    assert np.concatenate(back["batches"]).tolist() == list(range(4000))


def test_a_gather_larger_than_the_last_result_still_goes_straight_into_a_segment(
    pair, monkeypatch
) -> None:
    """An epoch's first reads grow 4x each: the arena was the smallest free segment that held
    the last result, the larger gather did not fit it, and the whole result was written over
    into another segment; now the largest free segment is lent, and nothing is copied."""
    segments, leases, base = pair
    large = [pa.table({"v": np.arange(k, 4 << 20, 2, dtype=np.int64)}) for k in range(2)]
    small = [pa.table({"v": np.arange(k, 4000, 2, dtype=np.int64)}) for k in range(2)]
    big = leases.unpack(*segments.pack(gathered(large, 0), base.with_suffix(".0")))
    tiny = leases.unpack(*segments.pack(gathered(small, 1), base.with_suffix(".1")))
    del big, tiny  # two free segments now, 32 MiB and 1 MiB; the last result was small
    gc.collect()
    writes = []
    monkeypatch.setattr(segments_module, "write_into", lambda *a: writes.append(a))
    middle = [pa.table({"v": np.arange(k, 1 << 20, 2, dtype=np.int64)}) for k in range(2)]
    with segments.arena() as arena:
        assert arena is not None
        packed = segments.pack(gathered(middle, 2), base.with_suffix(".2"), arena)
    back = leases.unpack(*packed)
    assert writes == [] and back["x"] == 2
    assert np.array_equal(np.concatenate(back["batches"]), np.arange(1 << 20))


def test_a_segment_the_worker_still_views_is_not_lent_again(pair) -> None:
    """A buffer a task's gather made and the worker kept past its task (a cache of its own,
    say) is never written over by a later result, even once the consumer let go of it."""
    segments, leases, base = pair
    parts = [pa.table({"v": np.arange(1000, dtype=np.int64)})]
    leases.unpack(*segments.pack(gathered(parts, 0), base.with_suffix(".0")))
    gc.collect()
    with segments.arena() as arena:
        assert arena is not None
        kept = gathered(parts, 1)  # kept by the worker after its task
        packed = segments.pack(kept, base.with_suffix(".1"), arena)
    leases.unpack(*packed)  # and dropped by the consumer at once
    gc.collect()
    for x in range(2, 2 + 2 * SLOTS):
        with segments.arena() as arena:
            assert arena is None or arena.slot != packed[2][1]
            result = {"batches": [np.full(1000, x)], "x": x}
            where = segments.pack(result, base.with_suffix(f".{x}"), arena)
            assert where[2][1] != packed[2][1]
        leases.unpack(*where)
    assert np.concatenate(kept["batches"]).tolist() == list(range(1000))


def test_a_fresh_pools_first_task_runs_alone(tmp_path: Path) -> None:
    """New workers' first reads each open every file their rows lie in; all at once on few
    cores, they held the first batch back (2.2 s on 100M rows against 0.9 s on 1M). A fresh
    pool now sends its first task alone and the others once it is answered; later tasks
    (and a kept pool's next epochs) go out at once."""
    log = tmp_path / "log"
    tasks = [(x, str(log)) for x in range(6)]
    with Ordered(ProcessPool(workerfns.logged_sleep, 3), iter(tasks), 6) as results:
        assert [r["x"] for r in results] == list(range(6))
    runs = {
        int(x): (float(a), float(b)) for x, a, b in map(str.split, log.read_text().splitlines())
    }
    assert all(runs[x][0] >= runs[0][1] for x in range(1, 6))
    assert any(runs[x][0] < runs[y][1] for x in range(1, 6) for y in range(1, 6) if x != y)


def test_a_segment_idle_for_a_while_is_removed_and_unmapped(pair) -> None:
    """A worker keeps what its results at their peak needed, not for ever: a segment unused
    for IDLE_PACKS results goes, from the worker and from the consumer's mappings."""
    segments, leases, base = pair
    peak = [leases.unpack(*segments.pack(result(x), base.with_suffix(f".{x}"))) for x in range(3)]
    del peak
    gc.collect()
    for x in range(3, 3 + IDLE_PACKS + 2):
        back = leases.unpack(*(packed := segments.pack(result(x), base.with_suffix(f".{x}"))))
        assert holds(back, x)
        del back
    maps = Path("/proc/self/maps").read_text().splitlines()
    mapped = {line.split()[-2] for line in maps if f"{base.name}-seg" in line}  # "(deleted)"
    assert mapped == {packed[2][2]}


def test_a_write_that_fails_gives_its_slot_back(pair, monkeypatch) -> None:
    """The worker marks a slot held before writing; a write that fails (the error goes to the
    consumer as the task's) must not leave the slot held for ever."""
    segments, leases, base = pair
    first = segments.pack(result(0), base.with_suffix(".0"))
    leases.unpack(*first)
    gc.collect()

    def failing(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(segments_module, "write_into", failing)
    with pytest.raises(OSError, match="No space"):
        segments.pack(result(1), base.with_suffix(".1"))
    monkeypatch.undo()
    again = segments.pack(result(2), base.with_suffix(".2"))
    assert again[2][1] == first[2][1] and holds(leases.unpack(*again), 2)
