"""Process workers: ordered results through shared memory; deaths, errors and Ctrl-C handled."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import workerfns
from conftest import lanceloader_threads
from lanceloader.engine.pickling import check_picklable
from lanceloader.engine.pool import Ordered
from lanceloader.engine.processes import ProcessPool, WorkerDiedError


def shm_files() -> set[str]:
    """Shared-memory files of the process pools this process ran (named by its pid)."""
    return {p.name for p in Path("/dev/shm").glob(f"lanceloader-pool-{os.getpid()}-*")}


def ordered(fn, tasks, num_workers: int, depth: int) -> Ordered:
    """The results of ``tasks`` from a pool of its own (closed at the end)."""
    return Ordered(ProcessPool(fn, num_workers), tasks, depth)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def alive(pid: int) -> bool:
    """Running (not gone, not a zombie waiting to be reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_results_come_in_order_with_arrays_from_shared_memory() -> None:
    with ordered(workerfns.echo, iter(range(30)), num_workers=2, depth=4) as pool:
        results = list(pool)
    assert [r["x"] for r in results] == list(range(30))
    assert all(r["value"].shape == (100, 4) and r["value"][0, 0] == r["x"] for r in results)
    assert results[5]["tag"] == ["5"]
    assert results[5]["value"].flags.writeable  # a private mapping, safe to hand to torch
    assert shm_files() == set()


@pytest.mark.parametrize(
    "fn, status",
    [(workerfns.die_on, "was killed by SIGKILL"), (workerfns.exit_on, "exited with status 123")],
)
def test_a_dead_worker_is_reported_quickly_and_nothing_leaks(fn, status: str) -> None:
    before_fds = open_fds()
    pool = ordered(fn, iter(range(20)), num_workers=2, depth=4)
    pids = pool.pool.pids
    start = time.monotonic()
    with pytest.raises(WorkerDiedError, match=rf"worker process 1 \(pid \d+\) {status}"):
        list(pool)
    assert time.monotonic() - start < 2
    pool.close()
    assert shm_files() == set()
    assert not any(alive(pid) for pid in pids)
    assert open_fds() <= before_fds + 1  # the forkserver's socket may stay open


def test_an_exception_keeps_its_type_and_the_worker_traceback() -> None:
    with pytest.raises(ValueError, match="bad task 3") as info:
        list(ordered(workerfns.raise_on, iter(range(10)), 2, 2))
    notes = "\n".join(info.value.__notes__)
    assert "in worker process 1" in notes and "raise_on" in notes


def test_close_mid_way_stops_every_worker() -> None:
    pool = ordered(workerfns.slow, iter(range(100)), 2, 4)
    next(pool)
    pids = pool.pool.pids
    start = time.monotonic()
    pool.close()
    pool.close()
    assert time.monotonic() - start < 3
    assert not any(alive(pid) for pid in pids)
    assert shm_files() == set()


def test_what_cannot_be_copied_is_named_before_start_and_lambdas_travel_by_value() -> None:
    lock = threading.Lock()
    with pytest.raises(
        TypeError,
        match=r"cannot be sent to worker processes.*_thread.lock.*"
        r"create it inside the transform",
    ):
        check_picklable(lambda x: lock, "transform <lambda>")
    with ordered(lambda x: {"value": np.full(3, x * 2)}, iter(range(4)), 2, 2) as pool:
        assert [r["value"].tolist() for r in pool] == [[0, 0, 0], [2, 2, 2], [4, 4, 4], [6, 6, 6]]


def start_pool_script(tmp_path, then: str) -> tuple[subprocess.Popen, list[int]]:
    """Run a script that starts a 2-worker pool of slow tasks, prints its worker PIDs, then runs
    ``then`` (indented code); returns the process, in its own session, and the worker PIDs."""
    script = tmp_path / "run.py"
    script.write_text(
        textwrap.dedent(f"""
        import signal, sys, time
        # Ctrl-C as a script started from a shell has it, whatever this test process inherited
        # to it (a blocked or ignored SIGINT is inherited across fork and exec)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {{signal.SIGINT}})
        signal.signal(signal.SIGINT, signal.default_int_handler)
        sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})
        import workerfns
        from lanceloader.engine.pool import Ordered
        from lanceloader.engine.processes import ProcessPool
        if __name__ == "__main__":
            pool = Ordered(ProcessPool(workerfns.slow, 2), iter(range(1000)), 4)
            print("pids", *pool.pool.pids, flush=True)
    """)
        + textwrap.indent(textwrap.dedent(then), "    ")
    )
    proc = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    return proc, [int(p) for p in proc.stdout.readline().split()[1:]]


def test_ctrl_c_gives_a_prompt_keyboard_interrupt_and_no_orphans(tmp_path) -> None:
    proc, pids = start_pool_script(
        tmp_path,
        """
        try:
            for _ in pool:
                pass
        except KeyboardInterrupt:
            pool.close()
            print("interrupted", flush=True)
    """,
    )
    time.sleep(0.5)
    sent = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)  # like Ctrl-C: the whole process group gets SIGINT
    out, _ = proc.communicate(timeout=10)
    assert "interrupted" in out and time.monotonic() - sent < 3
    assert not any(alive(pid) for pid in pids)


def test_workers_exit_when_the_consumer_is_killed(tmp_path) -> None:
    proc, pids = start_pool_script(tmp_path, "time.sleep(60)")
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    assert not any(alive(p) for p in pids)


def test_a_task_that_cannot_be_sent_fails_in_the_consumer_not_as_a_wait() -> None:
    """Tasks are pickled in the consumer (feeder threads only write the bytes), so an
    unpicklable one raises there, at once, and the pool is stopped."""
    tasks = iter([1, lambda: 2])  # a lambda cannot be pickled
    with pytest.raises(Exception, match="pickle") as info:
        ordered(workerfns.echo, tasks, num_workers=1, depth=2)
    assert "lambda" in str(info.value)
    assert lanceloader_threads() == [] and shm_files() == set()
