"""Shared fixtures: real Lance datasets written in temporary directories."""

from __future__ import annotations

import gc
import multiprocessing
import os
import threading

# Ray servers the tests start bind 127.0.0.1 and are reached there: Ray reads this once, when it
# is first imported (else it swaps 127.0.0.1 for the machine's address, where nothing listens).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import lance
import pyarrow as pa
import pytest

from lanceloader.demo import demo_table, write_demo_dataset


def pytest_collection_finish(session: pytest.Session) -> None:
    """Move everything collection imported (torch, TensorFlow, JAX, Ray: ~570k objects) out of
    the garbage collector's sight: a full collection then scans only what the tests made, not
    the frameworks too (each ``gc.collect()`` of the tests, and each automatic one, took 0.5-0.9 s
    with them on a loaded 2-core machine; none after). Nothing a test creates is frozen, so
    whatever a test drops is still collected."""
    gc.collect()
    gc.freeze()


@pytest.fixture(scope="session")
def small_uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    """1,000 demo rows in 3 fragments (id == row offset)."""
    return write_demo_dataset(
        tmp_path_factory.mktemp("small") / "small.lance", rows=1000, fragments=3
    )


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


@pytest.fixture(scope="module")
def forkserver() -> multiprocessing.context.BaseContext:
    """multiprocessing's forkserver, preloading torch and ``lanceloader.torch`` besides Lance
    (imported, never opened), for torch DataLoader workers: they start in milliseconds and are
    fork-safe.

    The forkserver is one per process and its preload list counts only when it starts; an earlier
    test's process workers (``worker_type="process"``) start it with Lance's ``PRELOAD`` only, and
    then every DataLoader worker imported torch itself (~1.5 s each, dozens per module). So the
    running server is stopped and started again with torch, and stopped after the module, for the
    next user to start its own (its live children are not affected: they are processes of their
    own)."""
    from multiprocessing import forkserver as server

    from lanceloader.engine.processes import PRELOAD

    server._forkserver._stop()
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([*PRELOAD, "lanceloader.torch"])
    server.ensure_running()
    yield ctx
    server._forkserver._stop()


def lanceloader_threads() -> list[threading.Thread]:
    """Live lanceloader threads, after collecting what earlier tests left unreachable. Calls
    abandoned to an object store that is gone (``lanceloader-store-call``, left by the object
    store tests' dead stores: rows/store.py's reaching_store) end by themselves within Lance's
    timeouts and belong to no loader: they are not counted."""
    gc.collect()
    return [
        t
        for t in threading.enumerate()
        if t.name.startswith("lanceloader") and t.name != "lanceloader-store-call"
    ]


def ids_of(batches) -> list[int]:
    out: list[int] = []
    for b in batches:
        col = b["id"] if not isinstance(b, pa.RecordBatch) else b.column("id")
        out.extend(col.tolist() if hasattr(col, "tolist") else col.to_pylist())
    return out


class S3:
    """A real S3 server (moto, ``tests/s3server.py``) on 127.0.0.1 and what Lance needs to use
    it: ``storage_options``, a fresh bucket per ``uri()``, and the server's request counts."""

    def __init__(self) -> None:
        import subprocess
        import sys
        from pathlib import Path

        self._process = subprocess.Popen(
            [sys.executable, str(Path(__file__).parent / "s3server.py")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        port = self._process.stdout.readline().strip()
        if not port:
            raise RuntimeError("the S3 server did not start (is moto[server] installed?)")
        self.endpoint = f"http://127.0.0.1:{int(port)}"
        self.storage_options = {
            "endpoint": self.endpoint,
            "allow_http": "true",
            "region": "us-east-1",
            "access_key_id": "AKIDLANCELOADERTEST",
            "secret_access_key": "lanceloader-test-SECRET-key",
        }
        self._buckets = 0

    def bucket(self) -> str:
        """A new, empty bucket's name."""
        import urllib.request

        self._buckets += 1
        name = f"bucket{self._buckets}"
        urllib.request.urlopen(
            urllib.request.Request(f"{self.endpoint}/{name}", method="PUT"), timeout=30
        ).read()
        return name

    def write(self, table: pa.Table, name: str = "data.lance", **kwargs) -> str:
        """``table`` written as a Lance dataset in a new bucket; returns its ``s3://`` URI."""
        uri = f"s3://{self.bucket()}/{name}"
        lance.write_dataset(table, uri, storage_options=self.storage_options, **kwargs)
        return uri

    def requests(self, reset: bool = False) -> dict[str, int]:
        """Requests the server answered (by HTTP method) since the last reset."""
        import json
        import urllib.request

        request = urllib.request.Request(
            f"{self.endpoint}/__requests__", method="DELETE" if reset else "GET"
        )
        return json.loads(urllib.request.urlopen(request, timeout=30).read())

    def stop(self) -> None:
        self._process.stdin.close()  # the server exits when its stdin closes
        try:
            self._process.wait(10)
        except Exception:
            self._process.kill()
            self._process.wait()


@pytest.fixture(scope="session")
def s3():
    """The S3 server of this test session, stopped when the session ends."""
    pytest.importorskip("moto")
    server = S3()
    yield server
    server.stop()
