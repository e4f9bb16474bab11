"""Faults: how fast the training loop gets control back, and how fast a killed trainer's helpers
are gone. Each measurement runs in a fresh process; ``--src`` points at another checkout's
``src`` to measure it the same way (before/after).

Cases (medians of ``--repeats``):

``stop``
    ``break`` and Ctrl-C (SIGINT while the loop waits for a batch) with 4 busy workers of each
    type: a transform that takes 20 s for every batch after the first. Seconds from the
    ``break`` (or the signal) until the loop has control back, with the pool stopped.
``killed trainer``
    A trainer with 2 process workers (``Loader(worker_type="process")``) or 2 DataLoader workers
    started by the documented forkserver recipe (``IterableDataset``) is SIGKILLed with batches
    in flight. Seconds until its workers, the forkserver and its ``/dev/shm`` files are all gone
    (``> 60`` when they were still there after a minute).

The hot-path cost of the checks is ``make bench`` (``benchmarks/throughput.py``) run with both
checkouts.

Usage::

    python benchmarks/faults.py                       # this checkout
    python benchmarks/faults.py --src /tmp/base/src   # another one, e.g. a git worktree
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

STOP_CHILD = textwrap.dedent("""
    import os, signal, sys, threading, time
    import lanceloader as ll

    def slow_after_first(batch):
        if 0 not in batch.column("id").to_pylist():
            time.sleep(20)
        return batch

    if __name__ == "__main__":
        uri, how, worker_type = sys.argv[1], sys.argv[2], sys.argv[3]
        loader = ll.Loader(uri, batch_size=10, columns=["id"], transform=slow_after_first,
                           num_workers=4, worker_type=worker_type, prefetch=8)
        if how == "break":
            for batch in loader:
                time.sleep(0.5)  # every worker is on a slow batch now
                start = time.perf_counter()
                break
        else:
            it = iter(loader)
            next(it)
            sent = []
            def interrupt():
                sent.append(time.perf_counter())
                os.kill(os.getpid(), signal.SIGINT)
            threading.Timer(0.5, interrupt).start()
            try:
                next(it)
            except KeyboardInterrupt:
                pass
            start = sent[0]
        print(time.perf_counter() - start, flush=True)
        os._exit(0)  # do not wait for detached threads at exit: only the loop's time counts
""")

TRAINER_CHILD = textwrap.dedent("""
    import json, multiprocessing, os, sys, time
    from multiprocessing import forkserver

    if __name__ == "__main__":
        uri, kind = sys.argv[1], sys.argv[2]
        if kind == "process":
            import lanceloader as ll
            loader = ll.Loader(uri, batch_size=10, columns=["id", "x"], num_workers=2,
                               worker_type="process", prefetch=8)
            it = iter(loader)
            next(it)
            workers = it.stream._pool.pids
        else:
            from torch.utils.data import DataLoader
            from lanceloader.torch import IterableDataset
            ctx = multiprocessing.get_context("forkserver")
            ctx.set_forkserver_preload(["numpy", "pyarrow", "lance", "lanceloader.torch"])
            ds = IterableDataset(uri, batch_size=10, columns=["id", "x"], output="torch")
            dl = DataLoader(ds, batch_size=None, num_workers=2, prefetch_factor=4,
                            multiprocessing_context=ctx)
            it = iter(dl)
            next(it)
            workers = [w.pid for w in it._workers]
        time.sleep(2.0)  # batches in flight, as files
        print(json.dumps({"pid": os.getpid(), "processes": workers +
                          [forkserver._forkserver._forkserver_pid]}), flush=True)
        time.sleep(600)
""")


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except OSError:
        return False


def files_of(pid: int) -> list[str]:
    return [p.name for p in Path("/dev/shm").glob("lanceloader-*") if f"-{pid}-" in p.name]


def run_stop(script: Path, env: dict[str, str], uri: str, how: str, worker_type: str) -> float:
    done = subprocess.run(
        [sys.executable, str(script), uri, how, worker_type],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    return float(done.stdout.split()[-1])


def run_killed(script: Path, env: dict[str, str], uri: str, kind: str) -> float:
    trainer = subprocess.Popen(
        [sys.executable, str(script), uri, kind],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = trainer.stdout.readline()
        if not line:
            raise RuntimeError(trainer.stderr.read()[-2000:])
        info = json.loads(line)
        trainer.kill()
        killed = time.monotonic()
        while time.monotonic() - killed < 60:
            if not any(alive(p) for p in info["processes"]) and not files_of(info["pid"]):
                return time.monotonic() - killed
            time.sleep(0.02)
        for pid in info["processes"]:  # clean up after a checkout that leaks
            if alive(pid):
                os.kill(pid, 9)
        for name in files_of(info["pid"]):
            (Path("/dev/shm") / name).unlink(missing_ok=True)
        return float("inf")
    finally:
        trainer.kill()
        trainer.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--src", default=str(Path(__file__).resolve().parents[1] / "src"))
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": args.src}
    work = Path(tempfile.mkdtemp(prefix="faults-bench-"))
    uri = str(work / "demo.lance")
    subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from lanceloader.demo import "
            "write_demo_dataset; write_demo_dataset(sys.argv[1], rows=20_000)",
            uri,
        ],
        env=env,
        check=True,
    )
    (work / "stop.py").write_text(STOP_CHILD)
    (work / "trainer.py").write_text(TRAINER_CHILD)
    results: dict[str, float] = {}
    for how in ("break", "ctrl-c"):
        for worker_type in ("thread", "process"):
            times = [
                run_stop(work / "stop.py", env, uri, how, worker_type) for _ in range(args.repeats)
            ]
            results[f"stop {how}, 4 busy {worker_type} workers (s)"] = statistics.median(times)
    for kind in ("process", "dataloader-forkserver"):
        times = [run_killed(work / "trainer.py", env, uri, kind) for _ in range(args.repeats)]
        results[f"killed trainer ({kind}): all gone after (s)"] = statistics.median(times)
    print(f"src: {args.src}")
    for name, value in results.items():
        shown = "> 60 (still there)" if value == float("inf") else f"{value:.3f}"
        print(f"{name:<58} {shown}")


if __name__ == "__main__":
    main()
