"""stats() on dashboards, through the real clients: a Prometheus scrape over HTTP on 127.0.0.1,
TensorBoard event files, W&B offline runs, Lightning's CSVLogger; and the slowest rank of a real
two-process gloo group."""

from __future__ import annotations

import csv
import json
import os
import socket
import struct
import subprocess
import sys
import textwrap
import time
import types
import urllib.request
from pathlib import Path

import pytest

import lanceloader as ll
import lanceloader.metrics as metrics

EVERY = 5  # small_uri, batch 50: 20 batches, a write after batches 5, 10, 15, 20
STEPS = [5, 10, 15, 20]


def loader_of(uri: str) -> ll.Loader:
    return ll.Loader(uri, batch_size=50, columns=["id", "x"], num_workers=2)


def test_prometheus_scrape_over_http(small_uri: str) -> None:
    from prometheus_client import CollectorRegistry, start_http_server
    from prometheus_client.parser import text_string_to_metric_families

    train, val = loader_of(small_uri), ll.Loader(small_uri, batch_size=100, columns=["id"])
    registry = CollectorRegistry()
    metrics.prometheus({"train": train, "val": val}, registry=registry)
    list(train)
    list(val)
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        with urllib.request.urlopen(url, timeout=30) as response:
            text = response.read().decode()
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    t = train.stats()

    def at(name: str, loader: str = "train", **labels: str) -> float:
        return samples[(name, tuple(sorted({"loader": loader, "rank": "0", **labels}.items())))]

    assert at("lanceloader_rows_total") == t.rows == 1000
    assert (
        at("lanceloader_rows_total", "val") == 1000 and at("lanceloader_batches_total", "val") == 10
    )
    assert at("lanceloader_batches_total") == t.batches == 20
    assert at("lanceloader_storage_bytes_total") == t.io_bytes > 0
    assert at("lanceloader_worker_seconds_total", stage="read") == pytest.approx(t.read_s)
    assert at("lanceloader_loop_seconds_total", state="waiting") == pytest.approx(t.wait_s)
    # the histogram: every batch counted once, cumulative buckets, the sum is the total wait
    assert at("lanceloader_batch_wait_seconds_count") == 20
    assert at("lanceloader_batch_wait_seconds_bucket", le="+Inf") == 20
    assert at("lanceloader_batch_wait_seconds_sum") == pytest.approx(t.wait_s)
    buckets = sorted(
        (float(dict(k[1])["le"]), v)
        for k, v in samples.items()
        if k[0] == "lanceloader_batch_wait_seconds_bucket" and dict(k[1])["loader"] == "train"
    )
    assert [v for _, v in buckets] == sorted(v for _, v in buckets)
    assert at("lanceloader_batch_wait_quantile_seconds", quantile="0.99") == pytest.approx(
        t.wait_p99_s
    )
    assert at("lanceloader_bottleneck_info", stage=t.bottleneck.stage) == 1


def test_prometheus_refuses_what_is_not_a_loader() -> None:
    from prometheus_client import CollectorRegistry

    with pytest.raises(TypeError, match="'val' is a str, not a lanceloader Loader"):
        metrics.prometheus({"val": "data/val.lance"}, registry=CollectorRegistry())


def test_prometheus_refuses_a_second_registration_of_the_same_series(small_uri: str) -> None:
    """Two collectors would expose every series twice (Prometheus rejects duplicate samples at
    scrape): the second call is refused, naming the fix, and the first stays as it was."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    registry = CollectorRegistry()
    train, val = loader_of(small_uri), ll.Loader(small_uri, batch_size=100, columns=["id"])
    first = metrics.prometheus(train, registry=registry)
    with pytest.raises(ValueError, match=r"already exposes.*registry\.unregister\(collector\)"):
        metrics.prometheus(val, registry=registry, name="val")
    list(train)
    text = generate_latest(registry).decode()
    samples = [
        (s.name, tuple(sorted(s.labels.items())))
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]
    assert (
        len(samples) == len(set(samples))
        and ("lanceloader_rows_total", (("loader", "train"), ("rank", "0"))) in samples
    )
    registry.unregister(first)  # the fix the error names: then another collector registers
    metrics.prometheus({"train": train, "val": val}, registry=registry)


def test_tensorboard_event_file(
    small_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # TensorBoard's own switch to its TF stub (what users without TensorFlow get): importing
    # TensorFlow would take 10 s of this test
    monkeypatch.setitem(sys.modules, "tensorboard.compat.notf", types.ModuleType("notf"))
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=str(tmp_path))
    loader = loader_of(small_uri)
    assert sum(len(b["id"]) for b in metrics.log_every(loader, writer, EVERY)) == 1000
    writer.close()
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    tags = events.Tags()["scalars"]
    assert {"lanceloader/rows_per_s", "lanceloader/wait_p99_ms", "lanceloader/read_share"} <= set(
        tags
    )
    batches = events.Scalars("lanceloader/batches")
    assert [e.step for e in batches] == STEPS and [e.value for e in batches] == STEPS
    assert all(e.value > 0 for e in events.Scalars("lanceloader/rows_per_s"))


def test_wandb_offline_run(small_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    # mode= as well as the environment: wandb may have read its settings before this test
    run = wandb.init(project="lanceloader-test", dir=str(tmp_path), mode="offline")
    try:
        loader = loader_of(small_uri)
        for _ in metrics.log_every(loader, run, EVERY):
            run.log({"loss": 1.0})  # the loop logs too: lanceloader does not fight over the step
    finally:
        run.finish()
    (path,) = tmp_path.glob("wandb/offline-run-*/*.wandb")
    # wandb-core may still be writing the file when finish() returns: wait for its exit record
    deadline = time.monotonic() + 60
    while not (done := read_wandb_run(path))[2] and time.monotonic() < deadline:
        time.sleep(0.1)
    history, summary, _ = done
    steps = [row["lanceloader/step"] for row in history if "lanceloader/step" in row]
    assert steps == STEPS
    assert len([row for row in history if "loss" in row]) == 20
    assert summary["lanceloader/batches"] == 20 and summary["lanceloader/step"] == 20
    assert summary["lanceloader/rows_per_s"] > 0 and "lanceloader/wait_p50_ms" in summary


def read_wandb_run(path: Path) -> tuple[list[dict], dict, bool]:
    """The history rows, the final summary and whether the run's exit is recorded, from an
    offline run's ``.wandb`` file: W&B's
    record log (LevelDB's log format: 32 KiB blocks of records with a 7-byte header, after a
    7-byte file header) of ``Record`` protobufs."""
    from wandb.proto import wandb_internal_pb2

    data, pos, block, part = path.read_bytes(), 7, 32768, b""
    assert data[:4] == b":W&B"
    history: list[dict] = []
    summary: dict = {}
    exited = False
    while pos + 7 <= len(data):
        left = block - pos % block
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if left < 7 or (length == 0 and kind == 0):  # the block's padding
            pos += left
            continue
        part += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind not in (1, 4):  # FIRST or MIDDLE piece of a record
            continue
        record = wandb_internal_pb2.Record()
        record.ParseFromString(part)
        part = b""
        kind_of = record.WhichOneof("record_type")
        items = (
            record.history.item
            if kind_of == "history"
            else record.summary.update
            if kind_of == "summary"
            else []
        )
        values = {
            item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in items
        }
        if kind_of == "history":
            history.append(values)
        elif kind_of == "summary":
            summary.update(values)
        exited = exited or kind_of == "exit"
    return history, summary, exited


def test_lightning_trainer_and_csv_logger(small_uri: str, tmp_path: Path) -> None:
    import lightning as L
    import torch
    from lightning.pytorch.loggers import CSVLogger

    class Model(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(64, 1)

        def training_step(self, batch: dict, index: int) -> torch.Tensor:
            return self.layer(batch["x"]).pow(2).mean()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    logger = CSVLogger(str(tmp_path), name="run")
    loader = ll.Loader(small_uri, batch_size=50, columns=["x"], output="torch", num_workers=2)
    trainer = L.Trainer(
        max_epochs=2,
        logger=logger,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
    )
    # Lightning stops an epoch at len() without asking for more: the wrapper ends the loader's
    # epoch with its last batch, so the second epoch is a full one
    trainer.fit(Model(), train_dataloaders=metrics.log_every(loader, logger, EVERY))
    logger.save()
    with open(Path(logger.log_dir) / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    steps = [5, 10, 15, 20, 25, 30, 35, 40]
    assert [int(r["step"]) for r in rows] == steps and loader.stats().batches == 40
    assert [float(r["lanceloader/batches"]) for r in rows] == steps
    assert all(float(r["lanceloader/rows_per_s"]) > 0 for r in rows)


def test_windows_add_up_and_a_break_closes_the_loader(small_uri: str) -> None:
    loader = loader_of(small_uri)
    written: list[dict[str, float]] = []
    logged = metrics.log_every(loader, lambda m, step: written.append(m), EVERY)
    assert len(logged) == 20
    for i, _ in enumerate(logged):
        if i == 11:
            break
    # two windows of 5 batches each: their rows add up to the rows of the 10 batches
    assert len(written) == 2 and logged.step == 12
    walls = [5 * 50 / m["lanceloader/rows_per_s"] for m in written]
    assert sum(walls) == pytest.approx(loader.stats().wall_s, rel=0.5)  # the 12th batch is after
    list(loader)  # the break closed the iterator: the loader continues the epoch
    assert loader.stats().rows == 1000


def test_log_every_wrapped_per_epoch_continues_the_steps_and_keeps_the_epoch_boundary(
    small_uri: str,
) -> None:
    """The natural loop wraps the loader in each epoch: the steps go on across epochs (one
    curve, not a vertical line per epoch), and on the last batch of an epoch the loader still
    stands in that epoch, as without the wrapper."""
    from lanceloader.integrations.metrics import totals_of

    loader, bare = loader_of(small_uri), loader_of(small_uri)
    steps: list[int] = []
    seen: list[tuple[int, int]] = []
    expected: list[tuple[int, int]] = []
    rates: list[tuple[float, tuple[int, float]]] = []  # (rows/s written, the totals then)

    def write(m: dict[str, float], step: int) -> None:
        steps.append(step)
        totals = totals_of(loader)
        rates.append((m["lanceloader/rows_per_s"], (totals.rows, totals.wall_s)))

    for epoch in range(3):
        for _ in metrics.log_every(loader, write, EVERY):
            seen.append((loader.epoch, loader.state_dict()["epoch"]))
        for _ in bare:
            expected.append((bare.epoch, bare.state_dict()["epoch"]))
        assert loader.epoch == epoch + 1
    assert seen == expected and seen[19] == (0, 0) and seen[20] == (1, 1)
    assert steps == list(range(EVERY, 61, EVERY))
    # Each window is the EVERY batches since the last write, across wrappers too.
    for (rate, (rows, wall)), (_, (rows_before, wall_before)) in zip(
        rates[1:], rates, strict=False
    ):
        assert rate == pytest.approx((rows - rows_before) / (wall - wall_before)), rates
    # An explicit step counts on from there, across the wrapper's epochs.
    logged = metrics.log_every(loader, lambda m, step: steps.append(step), EVERY, step=1000)
    list(logged), list(logged)
    assert steps[-8:] == list(range(1005, 1041, EVERY)) and logged.step == 1040


def test_across_ranks_refuses_what_is_not_a_loader_or_its_stats() -> None:
    with pytest.raises(TypeError, match=r"expected a lanceloader Loader .* got 'str'"):
        metrics.across_ranks("nope")


def test_log_every_refuses_bad_loggers(small_uri: str) -> None:
    import logging

    loader = loader_of(small_uri)
    with pytest.raises(TypeError, match=r"use Loader\(log_every=N\)"):
        metrics.log_every(loader, logging.getLogger("train"), 5)
    with pytest.raises(TypeError, match="cannot write scalars to 'int'"):
        metrics.log_every(loader, 3, 5)
    with pytest.raises(ValueError, match="every must be a positive int"):
        metrics.log_every(loader, print, 0)


RANK_SCRIPT = textwrap.dedent("""
    import json, os, sys, time
    import torch.distributed as dist
    import lanceloader as ll
    import lanceloader.metrics as metrics

    def slow(batch):
        time.sleep(0.02)
        return batch

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    loader = ll.Loader(sys.argv[1], batch_size=50, columns=["id"], num_workers=1,
                       transform=slow if rank == 1 else None)
    written = []
    for _ in metrics.log_every(loader, lambda m, step: written.append(m), every=5):
        pass
    waits = metrics.across_ranks(loader)
    out = {"ranks": [r.rank for r in waits.ranks], "slowest": waits.slowest.rank,
           "written": [m["lanceloader/slowest_rank"] for m in written],
           "batches": [r.batches for r in waits.ranks]}
    with open(os.path.join(sys.argv[2], f"rank{rank}.json"), "w") as f:
        json.dump(out, f)
    dist.barrier()
    dist.destroy_process_group()
""")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_slowest_rank_of_a_two_process_gloo_group(small_uri: str, tmp_path: Path) -> None:
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "WORLD_SIZE": "2",
        "GLOO_SOCKET_IFNAME": "lo",
        "OMP_NUM_THREADS": "1",
    }
    ranks = [
        subprocess.Popen(
            [sys.executable, str(script), small_uri, str(tmp_path)],
            env={**env, "RANK": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(2)
    ]
    outputs = []
    for p in ranks:
        try:
            outputs.append(p.communicate(timeout=180)[0])
        finally:
            p.kill()
    for r in range(2):
        assert (tmp_path / f"rank{r}.json").exists(), outputs[r][-3000:]
        out = json.loads((tmp_path / f"rank{r}.json").read_text())
        # rank 1's transform sleeps 20 ms per batch: its loop waited longest, on every rank's view
        assert out["ranks"] == [0, 1] and out["slowest"] == 1, out
        assert out["written"] == [1.0] * 2 and out["batches"] == [10, 10], out  # 1,000 rows / 2
