"""The shared-memory transport of process workers' results: what one task's file holds."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from lanceloader.engine.transport import pack, unpack


def packed_size(result, tmp_path: Path) -> tuple[object, int]:
    """``result`` after a trip through a file, and that file's size."""
    path = Path("/dev/shm") / f"lanceloader-test-{os.getpid()}-{tmp_path.name}"
    skeleton, layout = pack(result, path)
    size = path.stat().st_size if layout else 0
    return unpack(skeleton, layout, path), size


def test_row_slices_of_one_array_are_written_once(tmp_path: Path, monkeypatch) -> None:
    """A read's batches are row slices of one converted array per column: the file holds each
    array once, in one write (before: one per batch and column, 32 here), and every batch
    comes back as it was."""
    writes = []
    pwrite = os.pwrite
    monkeypatch.setattr(os, "pwrite", lambda *args: writes.append(1) or pwrite(*args))
    x = np.arange(4096 * 8, dtype=np.float32).reshape(4096, 8)
    ids = np.arange(4096, dtype=np.int64)
    batches = [{"x": x[i : i + 256], "id": ids[i : i + 256]} for i in range(0, 4096, 256)]
    back, size = packed_size({"batches": batches, "n": 16}, tmp_path)
    assert size <= x.nbytes + ids.nbytes + 64 and len(writes) == 2
    assert back["n"] == 16 and len(back["batches"]) == 16
    for sent, got in zip(batches, back["batches"], strict=True):
        assert np.array_equal(sent["x"], got["x"]) and got["x"].dtype == np.float32
        assert np.array_equal(sent["id"], got["id"]) and got["id"].shape == (256,)


def test_a_small_slice_of_a_large_array_goes_alone(tmp_path: Path) -> None:
    big = np.arange(1_000_000, dtype=np.int64)
    back, size = packed_size({"a": big[10:20], "b": big[::2][:5], "own": np.ones(3)}, tmp_path)
    assert size < 1024  # not the 8 MB it is a slice of
    assert back["a"].tolist() == list(range(10, 20)) and back["b"].tolist() == [0, 2, 4, 6, 8]
    assert back["own"].tolist() == [1.0, 1.0, 1.0]


def test_a_read_of_many_batches_travels_as_one_array_per_chunk_and_column(tmp_path: Path) -> None:
    """A process worker's result sends each converted chunk's columns once, cut to the rows its
    batches take, and the consumer cuts the batches (before: one array per batch and column,
    each found, placed and rebuilt: 24 here); every batch comes back as it was, in order."""
    from lanceloader.engine.transport import take_apart
    from lanceloader.engine.work import TaskResult, _slice_all

    def chunk(n: int, first: int) -> dict[str, np.ndarray]:
        ids = np.arange(first, first + n, dtype=np.int64)
        return {"id": ids, "x": np.repeat(ids, 4).astype(np.float32).reshape(n, 4)}

    big = chunk(10_000, 0)  # only rows 2,000-2,512 of it are read
    chunks = [(0, 512, big, 2_000), (512, 1_536, chunk(1_024, 50_000), 0)]
    sent = TaskResult([], [], [], {})
    assert _slice_all(sent, chunks, [128] * 12, 40.0)
    batches = list(sent.batches)
    compact = sent.for_transport()  # what ForTransport sends
    assert len(take_apart(compact).layout) <= 2 * 2 + 1  # and the batches' bounds
    back, size = packed_size(compact, tmp_path)
    back = back.after_transport()  # what the stream makes of it
    assert size <= 1_536 * 40 + 8 * 3 * 12 + 4 * 64  # the rows read, not the whole chunk
    assert back.slices is None and len(back.batches) == 12
    for want, got in zip(batches, back.batches, strict=True):
        assert np.array_equal(want["id"], got["id"]) and np.array_equal(want["x"], got["x"])
        assert got["x"].dtype == np.float32 and got["x"].shape == (128, 4)
