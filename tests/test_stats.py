"""Stats reconcile exactly, the verdict names the stage that was made slow, traces are valid."""

from __future__ import annotations

import json
import logging
import time

import pyarrow as pa

import lanceloader as ll


def sleepy(batch: pa.RecordBatch) -> pa.RecordBatch:
    time.sleep(0.01)
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
    v = loader.stats().bottleneck
    assert v.stage == "decode/transform", str(loader.stats())
    assert "worker_type='process'" in v.suggestion


def test_verdict_slow_training_loop(small_uri: str) -> None:
    loader = ll.Loader(small_uri, batch_size=50)
    for _ in loader:
        time.sleep(0.01)
    assert loader.stats().bottleneck.stage == "training loop", str(loader.stats())


def test_verdict_full_shuffle_is_io_bound(medium_uri: str) -> None:
    loader = ll.Loader(medium_uri, batch_size=64, shuffle=True, columns=["id", "x"])
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
    assert {"read", "transform", "convert", "wait for batch", "training step"} <= {e["name"] for e in spans}
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
