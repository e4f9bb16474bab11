"""Stats reconcile exactly, the verdict names the stage that was made slow and never advises
what is set or what cannot help, the wait percentiles match the loop's clock, traces are valid."""

from __future__ import annotations

import hashlib
import json
import logging
import statistics
import time

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lanceloader as ll
from lanceloader.engine.stats import new_counters
from lanceloader.engine.verdict import IDLE_SHARE, STAGE_SHARE, usable_cores, verdict


def sleepy(batch: pa.RecordBatch) -> pa.RecordBatch:
    time.sleep(0.01)
    return batch


def hashing(batch: pa.RecordBatch) -> pa.RecordBatch:
    """CPU work that releases the GIL (hashlib does, for large inputs): threads fill cores."""
    hashlib.sha256(bytes(8_000_000)).digest()
    return batch


def pure_python(batch: pa.RecordBatch) -> pa.RecordBatch:
    """CPU work that holds the GIL."""
    total = 0
    for i in range(100_000):
        total += i
    return batch


def cheap(batch: pa.RecordBatch) -> pa.RecordBatch:
    """A transform that costs more than reading the id column, and little beside the rest."""
    time.sleep(0.003)
    return batch


def test_rows_reconcile_after_a_full_epoch_and_after_a_break(small_uri: str) -> None:
    loader = ll.Loader(small_uri, batch_size=64, shuffle=True, num_workers=2)
    list(loader)
    s = loader.stats(epoch=-1)
    assert (s.batches, s.rows) == (16, 1000)
    assert s.rows_read == s.rows + s.rows_skipped and s.rows_undelivered == 0
    assert s.nbytes > 1000 * (8 + 4 + 256)  # id, label, x, and the text column's bytes
    for i, _ in enumerate(loader):
        if i == 2:
            break
    loader.close()
    last = loader.stats(epoch=-1)
    assert last.rows == 192 and last.rows_read == last.rows + last.rows_undelivered
    total = loader.stats()
    assert total.epochs == 2 and total.rows == 1192


def test_io_counters_come_from_lance(medium_uri: str) -> None:
    loader = ll.Loader(medium_uri, batch_size=500, columns=["x"])
    list(loader)
    s = loader.stats()
    assert s.io_bytes >= 20_000 * 256  # at least the float payload was read from storage
    assert s.io_iops > 0 and s.io_bandwidth > 0
    assert s.rows_per_s > 0 and s.bytes_per_s > 0


def test_verdict_slow_transform(small_uri: str) -> None:
    loader = ll.Loader(small_uri, batch_size=50, transform=sleepy, num_workers=1)
    list(loader)
    s = loader.stats()
    v = s.bottleneck
    assert v.stage == "decode/transform", str(s)
    # a sleeping transform holds no GIL: more threads help, process workers are not the fix
    assert "worker_type='process'" not in v.suggestion, str(s)
    idle = s.cores_busy is not None and 1 - s.cores_busy >= IDLE_SHARE
    assert ("num_workers=2" in v.suggestion) == idle, str(s)


def test_verdict_never_advises_process_workers_when_they_are_set(small_uri: str) -> None:
    # the issue's misfire: a transform-bound run on worker_type="process" was told to use
    # worker_type="process"
    loader = ll.Loader(
        small_uri, batch_size=50, transform=pure_python, num_workers=2, worker_type="process"
    )
    list(loader)
    s = loader.stats()
    assert "worker_type='process'" not in s.bottleneck.suggestion, str(s)
    told = loader.recorder.snapshot(workers=2, worker_type="process")
    assert "worker_type='process'" not in told.bottleneck.suggestion, str(told)
    assert "2 process workers" in str(told)


def test_no_more_workers_when_the_workers_fill_the_cores(small_uri: str) -> None:
    # the issue's misfire: "add workers up to the number of cores" with as many workers as
    # cores; here the workers keep every core busy (hashing releases the GIL). 100 batches: in
    # a run of 20 (0.13 s) the first read and the workers' start left the cores 26-32% idle
    # one run in four, above IDLE_SHARE
    cores = usable_cores()
    loader = ll.Loader(small_uri, batch_size=10, transform=hashing, num_workers=cores)
    list(loader)
    s = loader.stats()
    assert s.bottleneck.stage == "decode/transform", str(s)
    assert "num_workers" not in s.bottleneck.suggestion, str(s)
    assert "more workers" not in s.bottleneck.suggestion, str(s)


def test_a_stage_is_blamed_only_above_its_share_of_worker_time(small_uri: str) -> None:
    # the issue's misfire: a process-worker run blamed "decode/transform", which used 3% of the
    # workers' time
    loader = ll.Loader(
        small_uri,
        batch_size=10,
        columns=["id"],
        transform=cheap,
        num_workers=2,
        worker_type="process",
    )
    list(loader)
    s = loader.stats()
    stages = {
        "storage I/O": "read",
        "storage latency": "read",
        "cache reads": "read",
        "decode/transform": "transform",
        "conversion": "convert",
    }
    # Which stage limits a live run depends on the machine's load (a busy machine stretches the
    # 3 ms sleep); the rule does not: a stage is named only above its share of worker time.
    if s.bottleneck.stage in stages:  # a stage named: it held the workers at least half the time
        stage = stages[s.bottleneck.stage]
        reads = -(-len(loader) // loader.batches_per_read)
        assert getattr(s, f"{stage}_s") >= STAGE_SHARE * s.wall_s * min(2, reads), str(s)
    assert "% of their time in transform" in s.bottleneck.evidence, str(s)


def test_wait_percentiles_match_the_loops_own_clock(small_uri: str) -> None:
    # one worker, one batch per read, a 10 ms transform: the loop waits ~10 ms per batch
    loader = ll.Loader(
        small_uri, batch_size=50, transform=sleepy, num_workers=1, rows_per_read=50, prefetch=1
    )
    began = time.perf_counter()
    waits, it = [], iter(loader)
    started = time.perf_counter() - began  # the first batch's wait includes starting (iter())
    while True:
        t0 = time.perf_counter()
        try:
            next(it)
        except StopIteration:
            break
        waits.append(time.perf_counter() - t0)
    s = loader.stats()
    assert sum(s.wait_histogram) == s.batches == len(waits) == 20
    cuts = statistics.quantiles(waits, n=100, method="inclusive")
    for ours, theirs in ((s.wait_p50_s, statistics.median(waits)), (s.wait_p95_s, cuts[94])):
        assert theirs / 1.3 <= ours <= theirs * 1.3 + 1e-4, (ours, theirs, waits)
    assert s.first_wait_s <= max(*waits, waits[0] + started) and "wait per batch" in str(s)


def test_the_issues_process_run_does_not_blame_a_transform_of_3_percent() -> None:
    # the issue's numbers: 2 process workers, the loop waited 95%, the transform used 3% of the
    # workers' time, reading 2%: the wait is the hand-off, not the transform
    c = new_counters()
    c.update(
        batches=100,
        wall_s=2.0,
        wait_s=1.9,
        read_s=0.08,
        transform_s=0.12,
        convert_s=0.01,
        depth_sum=400,
        depth_samples=100,
        first_wait_s=0.2,
    )
    v = verdict(c, workers=2, shuffle_random=False, worker_type="process", cores=2)
    assert v.stage == "hand-off" and "worker_type='thread'" in v.suggestion, v


def counters(
    waited: float,
    read: float,
    transform: float,
    convert: float,
    first: float,
    busy: float | None,
    own: float | None,
) -> dict[str, float]:
    c = new_counters()
    c.update(
        batches=20,
        wall_s=10.0,
        wait_s=10.0 * waited,
        read_s=read,
        transform_s=transform,
        convert_s=convert,
        first_wait_s=10.0 * waited * first,
        depth_samples=10,
        depth_sum=20,
        rows_read=1000,
        io_bytes=1 << 30,
        io_iops=10,
    )
    if busy is not None:
        c.update(cores_busy_s=2 * 10.0 * busy, cores_all_s=2 * 10.0)
    if own is not None:
        c.update(cpu_s=10.0 * own, cpu_wall_s=10.0)
    return c


share = st.floats(0, 1)


@settings(max_examples=300, deadline=None)
@given(
    waited=share,
    read=st.floats(0, 20),
    transform=st.floats(0, 20),
    convert=st.floats(0, 20),
    first=share,
    busy=st.none() | share,
    own=st.none() | st.floats(0, 2),
    workers=st.integers(1, 4),
    worker_type=st.sampled_from([None, "thread", "process"]),
    random=st.booleans(),
)
def test_verdict_rules_hold_for_any_counters(
    waited, read, transform, convert, first, busy, own, workers, worker_type, random
) -> None:
    c = counters(waited, read, transform, convert, first, busy, own)
    v = verdict(c, workers, random, worker_type, cores=2)
    if worker_type == "process":  # never advises what is set
        assert "worker_type='process'" not in v.suggestion, v
    if worker_type == "thread":
        assert "worker_type='thread'" not in v.suggestion, v
    idle = (1 - busy >= IDLE_SHARE) if busy is not None else workers < 2
    if not idle:  # more workers only when cores are idle
        assert "num_workers" not in v.suggestion and "more workers" not in v.suggestion, v
    stage = {
        "decode/transform": transform,
        "conversion": convert,
        "storage I/O": read,
        "storage latency": read,
        "cache reads": read,
    }.get(v.stage)
    if stage is not None:  # a stage is blamed only above its share of the workers' time
        assert stage >= STAGE_SHARE * 10.0 * min(workers, 10), v
    if waited < 0.1:
        assert v.stage == "training loop"


def test_the_gil_verdict_and_the_idle_workers_verdicts() -> None:
    gil = counters(0.9, 1.0, 18.0, 0.5, 0.0, busy=0.5, own=1.0)
    assert "worker_type='process'" in verdict(gil, 2, False, "thread", cores=2).suggestion
    assert "worker_type='process'" not in verdict(gil, 2, False, "process", cores=2).suggestion
    # the same CPU on cores that other processes keep busy: no claim about the GIL
    crowded = counters(0.9, 1.0, 18.0, 0.5, 0.0, busy=1.0, own=1.0)
    assert "GIL" not in verdict(crowded, 2, False, "thread", cores=2).evidence
    startup = verdict(counters(0.9, 0.5, 0.1, 0.1, 0.8, None, None), 2, False, "process", 2)
    assert startup.stage == "startup" and "worker_type='thread'" in startup.suggestion
    handoff = verdict(counters(0.9, 0.5, 0.6, 0.1, 0.0, None, None), 2, False, "process", 2)
    assert handoff.stage == "hand-off" and "worker_type='thread'" in handoff.suggestion


def test_verdict_slow_training_loop(small_uri: str) -> None:
    loader = ll.Loader(small_uri, batch_size=50)
    for _ in loader:
        time.sleep(0.01)
    assert loader.stats().bottleneck.stage == "training loop", str(loader.stats())


def test_verdict_full_shuffle_is_io_bound(medium_uri: str) -> None:
    # cache=None: reads from the dataset itself (the automatic cache would serve them)
    loader = ll.Loader(medium_uri, batch_size=64, shuffle=True, columns=["id", "x"], cache=None)
    list(loader)
    v = loader.stats().bottleneck
    assert v.stage == "storage I/O", str(loader.stats())
    assert "shuffle_block_size" in v.suggestion


def test_print_is_a_table_with_the_verdict(small_uri: str) -> None:
    loader = ll.Loader(small_uri, batch_size=100)
    list(loader)
    text = str(loader.stats())
    for label in ("throughput", "storage I/O", "loop waited", "bottleneck:"):
        assert label in text
    assert json.loads(json.dumps(loader.stats().to_dict()))["rows"] == 1000


def test_trace_has_a_lane_per_worker_and_one_for_the_loop(small_uri: str, tmp_path) -> None:
    loader = ll.Loader(small_uri, batch_size=50, num_workers=2, transform=lambda b: b)
    path = tmp_path / "run.json"
    with loader.trace(path):
        list(loader)
    events = json.loads(path.read_text())["traceEvents"]
    lanes = {e["args"]["name"] for e in events if e["ph"] == "M"}
    assert "MainThread" in lanes and any(name.startswith("lanceloader-worker") for name in lanes)
    spans = [e for e in events if e["ph"] == "X"]
    assert {"read", "transform", "convert", "wait for batch", "training step"} <= {
        e["name"] for e in spans
    }
    assert sorted(e["args"]["batch"] for e in spans if e["name"] == "transform") == list(range(20))
    # after the block, tracing is off again
    list(loader)
    assert not loader.recorder.tracing


def test_log_every(small_uri: str, caplog) -> None:
    loader = ll.Loader(small_uri, batch_size=100, log_every=5)
    with caplog.at_level(logging.INFO, logger="lanceloader"):
        list(loader)
    lines = [r.getMessage() for r in caplog.records if r.name == "lanceloader"]
    assert len(lines) == 2 and lines[0].startswith("epoch 0: 5/10 batches")


# --- stats true for every kind of rows: clips, process start-up, packed mixes ----------------


def test_clip_decoding_is_booked_as_decode_not_storage_io(tmp_path) -> None:
    """A clip read decodes inside the read: stats() books those seconds as decode, the verdict
    never blames storage or advises a block shuffle for it, and a trace shows decode spans."""
    pytest.importorskip("av")
    from media_datasets import video_dataset

    uri = video_dataset(tmp_path, [40, 36, 44, 30], size=(96, 128), gop=8)
    loader = ll.Loader(
        uri, batch_size=4, shuffle=True, clips=ll.video_clips(frames=8), num_workers=2
    )
    with loader.trace(tmp_path / "trace.json"):
        for _ in loader:
            time.sleep(0)
    stats = loader.stats()
    assert stats.decode_s > 0.5 * (stats.read_s + stats.decode_s), (stats.decode_s, stats.read_s)
    assert stats.bottleneck.stage != "storage I/O"
    assert "block shuffle" not in stats.bottleneck.suggestion
    assert "decode" in str(stats)
    names = {e["name"] for e in json.loads((tmp_path / "trace.json").read_text())["traceEvents"]}
    assert {"read", "decode"} <= names
    c = new_counters()  # a run whose workers decoded clips most of the time: the decode verdict
    c.update(batches=20, wall_s=1.0, wait_s=0.9, read_s=0.1, decode_s=1.6, depth_samples=20)
    found = verdict(c, workers=2, shuffle_random=True, worker_type="thread", cores=2)
    assert found.stage == "decode" and "size=" in found.suggestion
    assert "block shuffle" not in found.suggestion


def test_process_workers_start_up_is_in_the_first_wait_and_the_epoch_rate(medium_uri) -> None:
    """iter() starts the worker processes: that time is the first batch's wait and part of the
    epoch's wall time, so rows/s is what the loop measured from iter() to the last batch."""
    loader = ll.Loader(
        medium_uri,
        batch_size=1000,
        columns=["id"],
        worker_type="process",
        num_workers=2,
        cache=None,
    )
    began = time.perf_counter()
    iterator = iter(loader)
    started = time.perf_counter() - began
    rows = sum(len(b["id"]) for b in iterator)
    wall = time.perf_counter() - began
    stats = loader.stats(epoch=0)
    assert stats.first_wait_s >= 0.95 * started - 0.001, (stats.first_wait_s, started)
    assert abs(stats.rows_per_s - rows / wall) <= 0.1 * rows / wall, (stats.rows_per_s, rows / wall)
    if stats.first_wait_s >= 0.5 * stats.wait_s and stats.bottleneck.stage not in (
        "training loop",
        "storage I/O",
        "conversion",
    ):
        assert stats.bottleneck.stage == "startup"


def test_iters_own_work_is_the_first_wait_and_in_the_epochs_wall_time(
    small_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What iter() does before the stream starts (a followed table's version check: Lance I/O)
    is the loop's wait too: stats() counted the epoch from the stream's start, so a slow check
    was in neither the first wait nor the wall time (the composition test's wall-time identity
    failed by 8 ms on a followed table)."""
    loader = ll.Loader(small_uri, batch_size=100, columns=["id"], follow=True, num_workers=1)
    source = loader.source
    checked = type(source).at_epoch_start

    def slow_check(self, epoch):  # the version check, made slow (0.2 s) the same each time
        time.sleep(0.2)
        return checked(self, epoch)

    monkeypatch.setattr(type(source), "at_epoch_start", slow_check)
    began = time.perf_counter()
    rows = sum(len(b["id"]) for b in loader)
    wall = time.perf_counter() - began
    stats = loader.stats(epoch=-1)
    assert rows == 1000 and stats.first_wait_s >= 0.2, stats.first_wait_s
    assert abs(stats.wall_s - wall) <= 0.1 * wall, (stats.wall_s, wall)


def test_a_packed_mix_counts_rows_from_the_cache_in_its_own_rows(tmp_path) -> None:
    """Packed rows count as packed rows read, and as packed rows from the cache: at most 100%
    of them (documents were counted against packed rows: '1395% of rows from the cache'), in
    stats() and in Prometheus alike."""
    import lance
    import numpy as np

    docs = [list(range(d * 100, d * 100 + 1 + d % 7)) for d in range(400)]
    uri = str(tmp_path / "tokens.lance")
    lance.write_dataset(
        pa.table({"input_ids": pa.array(docs, pa.list_(pa.int32()))}), uri, max_rows_per_file=100
    )
    source = {
        name: ll.Loader(
            uri,
            columns=["input_ids"],
            cache=str(tmp_path / name),
            pack=ll.pack("input_ids", 64, pad_id=-1),
            shuffle=True,
        )
        for name in ("a", "b")
    }
    loader = ll.Loader(ll.Mix(source), batch_size=8)
    for _ in range(3):
        assert sum(len(b["input_ids"]) for b in loader) > 0
    stats = loader.stats()
    assert 0 < stats.rows_cached <= stats.rows_read == stats.rows
    assert f"{100 * stats.rows_cached / stats.rows_read:.0f}% of rows from the cache" in str(stats)
    prometheus = pytest.importorskip("prometheus_client")
    from lanceloader import metrics

    registry = prometheus.CollectorRegistry()
    metrics.prometheus(loader, registry=registry)
    value = {s.name: s.value for m in registry.collect() for s in m.samples}
    cached = [v for k, v in value.items() if k.endswith("rows_cached_total")]
    read = [v for k, v in value.items() if k.endswith("rows_read_total")]
    assert cached and read and cached[0] <= read[0] and np.isclose(read[0], stats.rows_read)
