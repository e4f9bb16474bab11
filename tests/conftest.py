"""Shared fixtures: real Lance datasets written in temporary directories."""

from __future__ import annotations

import gc
import threading

import lance
import pyarrow as pa
import pytest

from lanceloader.demo import demo_table, write_demo_dataset


@pytest.fixture(scope="session")
def small_uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    """1,000 demo rows in 3 fragments (id == row offset)."""
    return write_demo_dataset(tmp_path_factory.mktemp("small") / "small.lance", rows=1000, fragments=3)


@pytest.fixture(scope="session")
def medium_uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    """20,000 demo rows in 4 fragments."""
    return write_demo_dataset(tmp_path_factory.mktemp("medium") / "medium.lance", rows=20_000)


@pytest.fixture
def deleted_uri(tmp_path) -> str:
    """500 rows in fragments of 64, with every row whose id % 7 == 3 deleted."""
    uri = str(tmp_path / "deleted.lance")
    ds = lance.write_dataset(demo_table(500), uri, max_rows_per_file=64)
    ds.delete("id % 7 = 3")
    return uri


def lanceloader_threads() -> list[threading.Thread]:
    """Live lanceloader threads, after collecting what earlier tests left unreachable."""
    gc.collect()
    return [t for t in threading.enumerate() if t.name.startswith("lanceloader")]


def ids_of(batches) -> list[int]:
    out: list[int] = []
    for b in batches:
        col = b["id"] if not isinstance(b, pa.RecordBatch) else b.column("id")
        out.extend(col.tolist() if hasattr(col, "tolist") else col.to_pylist())
    return out
