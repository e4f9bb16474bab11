"""Fork safety: a child forked after Lance ran never calls Lance itself, and never hangs."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
import warnings

import numpy as np
import pytest

import lanceloader as ll
from lanceloader.lifecycle import forksafe


def in_fork_child(fn, timeout: float = 60.0):
    """Run ``fn`` in a forked child; return its result or raise its error. A hang fails."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(r)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                payload = ("ok", fn())
        except BaseException as exc:
            payload = ("error", f"{type(exc).__name__}: {exc}")
        os.write(w, pickle.dumps(payload))
        os._exit(0)
    os.close(w)
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail(f"fork child hung for {timeout} s")
        time.sleep(0.02)
    data = b""
    while chunk := os.read(r, 1 << 20):
        data += chunk
    os.close(r)
    assert os.WIFEXITED(status), f"fork child died with status {status}"
    kind, value = pickle.loads(data)
    if kind == "error":
        raise RuntimeError(value)
    return value


def test_a_child_of_a_lance_using_process_is_tainted(small_uri: str) -> None:
    ll.Source(small_uri).read(np.arange(3))  # Lance ran here: its runtime threads exist
    assert forksafe.lance_runtime_threads() > 0
    assert in_fork_child(forksafe.tainted) is True
    assert in_fork_child(lambda: in_fork_child(forksafe.tainted)) is True  # and grandchildren


def test_a_child_of_a_process_that_only_imported_lance_is_clean() -> None:
    code = textwrap.dedent("""
        import os, lance, lanceloader.lifecycle.forksafe as f
        pid = os.fork()
        if pid == 0:
            os._exit(0 if not f.tainted() else 1)
        print(os.waitpid(pid, 0)[1])
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "0", out.stderr


@pytest.mark.parametrize("background_scan", [False, True])
def test_a_tainted_child_reads_through_a_clean_process(
    small_uri: str, background_scan: bool
) -> None:
    src = ll.Source(small_uri, columns=["id", "x"], filter="id >= 10")
    src.read(np.arange(100))
    scan = None
    if background_scan:  # a Lance scan running on another thread at fork time
        import threading

        stop = threading.Event()

        def scan_forever() -> None:
            while not stop.is_set():
                for _ in src.dataset.to_batches(batch_size=64):
                    pass

        scan = threading.Thread(target=scan_forever, daemon=True)
        scan.start()
        time.sleep(0.05)
    try:
        got = in_fork_child(lambda: src.read(np.array([0, 989, 5])).column("id").to_pylist())
    finally:
        if scan is not None:
            stop.set()
            scan.join()
    assert got == [10, 999, 15]


def test_a_loader_iterates_in_a_tainted_child(small_uri: str) -> None:
    loader = ll.Loader(small_uri, batch_size=100, shuffle=True, columns=["id"])
    expected = [b["id"].tolist() for b in loader]  # epoch 0, in the parent
    loader.set_epoch(0)
    got = in_fork_child(lambda: [b["id"].tolist() for b in loader])
    assert got == expected


def test_opening_lance_in_a_tainted_child_is_a_clear_error(small_uri: str) -> None:
    ll.Source(small_uri).read(np.arange(3))
    with pytest.raises(RuntimeError, match="forked from a process that had already used Lance"):
        in_fork_child(lambda: ll.Source(small_uri))
