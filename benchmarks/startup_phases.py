"""Where the first batch's time goes with 8 process workers: a timeline of one start-up.

The case of ``benchmarks/startup.py`` (``Loader(uri, shuffle=True, worker_type="process",
num_workers=8)``, the default cache in an empty directory, the forkserver's imports before the
clock) on its two tables, with timestamps written by every process (the loader's and each
worker's) into one log: a ``sitecustomize`` in a temporary directory on ``PYTHONPATH`` wraps, in
each interpreter, the dataset's opening, ``Source.read_rows`` and ``read_offsets`` and the
result's packing; the loader marks ``iter()`` and the first batch. It prints,
per table, the medians over ``--repeats`` rounds (tables alternated) of:

- ``to_first_task``: ``iter()`` to the first worker's first ``read_rows`` (the pool's start:
  8 workers forked one after another, then the first task sent alone);
- ``open``: that worker opening the dataset (``lance.dataset`` and its fragments);
- ``take``: its first read less the open (Lance's take over the fragments the rows lie in);
- ``pack_to_batch``: the packed result to the first batch in the loader's hands (the answer
  unpacked, the held tasks sent, the next task pickled, the batch made).

``--experiments`` (alternated in each round) replaces a piece of the loader in every process,
to measure an idea without committing it: ``threads4`` splits every Lance ``take`` of 64 rows
or more into 4 takes of consecutive offsets on 4 threads (concurrent fragment groups);
``held-at-submit`` sends a fresh pool's held tasks at its next ``submit`` (or ``take``) after
the first answer, not at the answer.
Private names are wrapped: this is a measuring tool, to be fixed when they move.

    python benchmarks/startup_phases.py [--repeats 7] [--experiments none,threads4]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

HOOK = r"""
import functools, os, time
LOG = os.environ.get("STARTUP_PHASES_LOG")
if LOG:
    def mark(what):
        with open(LOG, "a") as f:
            f.write(f"{time.time():.6f} {os.getpid()} {what}\n")
    import builtins
    builtins.startup_phases_mark = mark
    def wrap(owner, name, label):
        original = getattr(owner, name)
        @functools.wraps(original)
        def timed(*args, **kwargs):
            mark(label + " start")
            try:
                return original(*args, **kwargs)
            finally:
                mark(label + " end")
        setattr(owner, name, timed)
    from lanceloader.engine import forkserver, processes, segments
    from lanceloader.rows.lance import pinned, source
    wrap(source.Source, "read_rows", "read_rows")
    wrap(source.Source, "read_offsets", "read_offsets")
    wrap(segments.Segments, "pack", "pack")
    opened = pinned.PinnedDataset.dataset.fget
    def dataset(self):
        fresh = self._ds is None or self._pid != os.getpid()
        mark("open start") if fresh else None
        ds = opened(self)
        mark("open end") if fresh else None
        return ds
    pinned.PinnedDataset.dataset = property(dataset)
    experiment = os.environ.get("STARTUP_PHASES_EXPERIMENT", "")
    if experiment == "threads4":
        from concurrent.futures import ThreadPoolExecutor
        import lance, numpy as np, pyarrow as pa
        threads, take = ThreadPoolExecutor(4), lance.LanceDataset.take
        def spread_take(self, indices, columns=None):
            indices = np.asarray(indices)
            if len(indices) < 64:
                return take(self, indices, columns)
            parts = np.array_split(indices, 4)
            return pa.concat_tables(threads.map(lambda p: take(self, p, columns), parts))
        lance.LanceDataset.take = spread_take
    elif experiment == "held-at-submit":
        pool = processes.ProcessPool
        answer, submit, take_result = pool._answer, pool.submit, pool.take
        def answered(self, worker, message):
            held = self._held
            self._held = None  # the answer sends nothing
            try:
                answer(self, worker, message)
            finally:
                self._held = held
                self._held_due = held is not None
        def release(self):
            if getattr(self, "_held_due", False):
                self._held_due = False
                self._send_held()
        def submitted(self, task):
            submit(self, task)
            release(self)
        def taken(self):
            release(self)
            return take_result(self)
        pool._answer, pool.submit, pool.take = answered, submitted, taken
    elif experiment:
        raise ValueError(f"unknown experiment {experiment!r}")
"""

CASE = r"""
import os, sys, tempfile
os.environ["LANCELOADER_AUTO_CACHE_DIR"] = tempfile.mkdtemp(dir="/dev/shm", prefix="llphases-")
import lanceloader as ll
from lanceloader.engine.forkserver import WorkerProcess, start_forkserver
start_forkserver()
ready = WorkerProcess(target=int)
ready.start(); ready.join()
startup_phases_mark("iter start")
loader = ll.Loader(sys.argv[1], batch_size=256, shuffle=True, worker_type="process",
                   num_workers=8)
next(iter(loader))
startup_phases_mark("first batch")
loader.close()
import shutil; shutil.rmtree(os.environ["LANCELOADER_AUTO_CACHE_DIR"], ignore_errors=True)
"""


def phases(log: Path) -> dict[str, float]:
    """The first worker's phases, in seconds, from one start-up's log."""
    events = [line.split(maxsplit=2) for line in log.read_text().splitlines()]
    marks = [(float(t), pid, what) for t, pid, what in events]
    start = next(t for t, _, what in marks if what == "iter start")
    end = next(t for t, _, what in marks if what == "first batch")
    first, worker = next((t, pid) for t, pid, what in marks if what == "read_rows start")

    def at(what: str) -> float:
        return next(t for t, pid, w in marks if pid == worker and w == what)

    opening = at("open end") - at("open start")
    return {
        "to_first_task": first - start,
        "open": opening,
        "take": at("read_offsets end") - at("read_offsets start") - opening,
        "pack_to_batch": end - at("pack end"),
        "total": end - start,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--small", type=int, default=1_000_000)
    parser.add_argument("--large", type=int, default=100_000_000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument(
        "--experiments",
        default="none",
        help="comma-separated, alternated in each round: none, threads4, held-at-submit",
    )
    parser.add_argument("--data-dir", type=Path, default=Path("/tmp/lanceloader-startup"))
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from startup import write_table

    args.data_dir.mkdir(parents=True, exist_ok=True)
    tables = {n: write_table(args.data_dir / f"ids-{n}.lance", n) for n in (args.small, args.large)}
    root = Path(__file__).resolve().parents[1]
    experiments = args.experiments.split(",")
    unknown = set(experiments) - {"none", "threads4", "held-at-submit"}
    if unknown:
        parser.error(f"unknown experiments {sorted(unknown)}: none, threads4, held-at-submit")
    results: dict[tuple[str, int], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "sitecustomize.py").write_text(HOOK)
        log = Path(tmp) / "log"
        env = {**os.environ, "PYTHONPATH": f"{tmp}:{root / 'src'}", "STARTUP_PHASES_LOG": str(log)}
        for _ in range(args.repeats):
            for rows, uri in tables.items():
                for experiment in experiments:
                    log.unlink(missing_ok=True)
                    done = subprocess.run(
                        [sys.executable, "-c", CASE, uri],
                        capture_output=True,
                        text=True,
                        env={**env, "STARTUP_PHASES_EXPERIMENT": experiment.replace("none", "")},
                    )
                    if done.returncode != 0:
                        raise RuntimeError(done.stderr[-3000:])
                    for name, seconds in phases(log).items():
                        results[experiment, rows][name].append(seconds)
    print(
        f"medians of {args.repeats} rounds, load average "
        f"(1 min) {load_before:.1f} at the start, {os.getloadavg()[0]:.1f} at the end\n"
    )
    names = list(next(iter(results.values())))
    print("| experiment | rows | " + " | ".join(f"{n} ms" for n in names) + " |")
    print("|---|---:|" + "---:|" * len(names))
    for (experiment, rows), figures in sorted(results.items()):
        cells = " | ".join(f"{statistics.median(figures[n]) * 1000:.0f}" for n in names)
        print(f"| {experiment} | {rows:,} | {cells} |")


if __name__ == "__main__":
    main()
