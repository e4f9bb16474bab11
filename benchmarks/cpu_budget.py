"""The CPU budget and the self-tuner: what the loader uses, and what it delivers.

Method
------
* Workload: ``benchmarks/step.py``'s images (JPEGs of 128x128 decoded and resized to 64x64 in
  the workers, batches of 32, block shuffle), read by 4 thread workers.
* ``budget``: the loop takes batches as fast as they come (the worst case for a budget), for
  ``--seconds`` per run, with ``cpu_budget`` None, 0.5, 1 and 2. A sampler reads this
  process's and its children's CPU (``psutil``) every 0.25 s; reported: the most cores used
  over any 5 s window (every window of consecutive samples 5 s apart), the mean, and rows/s.
* ``heavy``: the case where the budget must bind on a 2-core machine: ``--heavy-workers`` (4)
  process workers (more on a machine others load, so the loader's share exceeds 1.3 cores), each
  batch's transform burning ``BURN_S`` of CPU in pure Python (no I/O, no GIL shared with the
  loop), the loop taking batches as fast as they come and doing nothing with them; budgets None
  and 1 (and ``--heavy-budgets``), measured as ``budget`` is (the workers are this process's
  descendants, so the sampler counts them).
* ``tune``: step.py's accelerator (``sleep``, 15 ms per batch) fed by the default loader (tuned:
  the loader chose its workers and prefetch), the same with ``tune=False``, ``tune=True`` with 4
  workers, and fixed settings (1, 2, 4 workers); after ``--warmup`` steps (the tuner works
  during them), ``--steps`` steps: utilisation, loader CPU s per step, rows/s. With
  ``--accelerator burn`` one process spins for each step, and ``step_stretch`` says how much
  the loader's CPU stretched the step itself (busy time over the step's time, less 1).
* The runs alternate within each of ``--repeats`` rounds; medians.

Usage::

    python benchmarks/cpu_budget.py                    # both parts
    python benchmarks/cpu_budget.py --parts budget --seconds 12 --repeats 1
    python benchmarks/cpu_budget.py --parts heavy --seconds 15 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil

import lanceloader as ll

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import step  # noqa: E402  (benchmarks/step.py: the data, the accelerator, one run)

WINDOW_S = 5.0
SAMPLE_S = 0.25
BURN_S = 0.02  # CPU seconds a heavy batch's transform burns


def image_loader(uri: str, **engine: Any) -> ll.Loader:
    return ll.Loader(
        uri,
        batch_size=32,
        shuffle=True,
        shuffle_block_size=64,
        transform=ll.decode_images("image", size=64),
        cache=None,
        **engine,
    )


class Sampler(threading.Thread):
    """This process's and its descendants' CPU seconds, every ``SAMPLE_S``, until ``stop``;
    a process that ended (a worker killed when a stream stops early) keeps what it used."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.samples: list[tuple[float, float]] = []
        self.done = threading.Event()
        self._seen: dict[int, float] = {}  # pid -> its CPU seconds when last read

    def cpu(self) -> float:
        me = psutil.Process()
        for proc in [me, *me.children(recursive=True)]:
            try:
                t = proc.cpu_times()
            except psutil.Error:
                continue
            self._seen[proc.pid] = t.user + t.system
        return sum(self._seen.values())

    def run(self) -> None:
        while not self.done.is_set():
            self.samples.append((time.perf_counter(), self.cpu()))
            self.done.wait(SAMPLE_S)
        self.samples.append((time.perf_counter(), self.cpu()))

    def worst_window(self) -> float:
        """The most cores used over any window of at least ``WINDOW_S`` seconds."""
        worst, j = 0.0, 0
        for i, (t0, c0) in enumerate(self.samples):
            j = max(j, i)
            while j < len(self.samples) and self.samples[j][0] - t0 < WINDOW_S:
                j += 1
            if j == len(self.samples):
                break
            t1, c1 = self.samples[j]
            worst = max(worst, (c1 - c0) / (t1 - t0))
        return worst


def burn(batch: Any) -> Any:
    """A CPU-heavy transform: ``BURN_S`` of this thread's CPU in pure Python."""
    began = time.thread_time()
    while time.thread_time() - began < BURN_S:
        pass
    return batch


def heavy_loader(uri: str, budget: float | None, workers: int) -> ll.Loader:
    return ll.Loader(
        uri,
        batch_size=32,
        columns=["label"],
        transform=burn,
        num_workers=workers,
        worker_type="process",
        cache=None,
        cpu_budget=budget,
    )


def budget_run(uri: str, budget: float | None, seconds: float, heavy: int = 0) -> dict[str, float]:
    """One run of ``seconds``; ``heavy``: that many process workers burning CPU (0: images)."""
    if heavy:
        loader = heavy_loader(uri, budget, heavy)
    else:
        loader = image_loader(uri, num_workers=4, cpu_budget=budget)
    sampler = Sampler()
    rows, t0 = 0, time.perf_counter()
    sampler.start()
    try:
        while time.perf_counter() - t0 < seconds:
            for batch in loader:
                rows += len(batch["label"])
                if time.perf_counter() - t0 >= seconds:
                    break
    finally:
        sampler.done.set()
        sampler.join()
        loader.close()
    (s0, c0), (s1, c1) = sampler.samples[0], sampler.samples[-1]
    return {
        "worst_5s_cores": sampler.worst_window(),
        "mean_cores": (c1 - c0) / (s1 - s0),
        "rows_per_s": rows / (s1 - s0),
    }


def tune_run(uri: str, engine: dict[str, Any], acc: Any, args: Any) -> dict[str, float]:
    made: list[ll.Loader] = []

    def make(_: dict[str, Any]) -> ll.Loader:
        made.append(image_loader(uri, **engine))
        return made[-1]

    got = step.run_once(make, {}, acc, step.STEP_MS["images"] / 1e3, args)
    got["rows_per_s"] = 32 / (got["slowdown"] * step.STEP_MS["images"] / 1e3)
    # busy / step's time - 1: how much the loader's CPU stretched the step itself (burn)
    got["step_stretch"] = got["utilisation"] * got["slowdown"] - 1
    tuner = made[0]._governor.tuner if made[0]._governor else None
    if tuner is not None:
        got["reads_in_flight"] = tuner.active
        print(f"    {made[0].stats().governor}", file=sys.stderr)
    return got


def medians(runs: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", type=Path, default=HERE / "data" / "step")
    parser.add_argument("--parts", default="budget,heavy,tune")
    parser.add_argument("--heavy-budgets", default="1")
    parser.add_argument("--heavy-workers", type=int, default=4)
    parser.add_argument("--engines", default="", help="the tune part's settings, ';'-separated")
    parser.add_argument("--accelerator", default="sleep", help="the tune part's: sleep or burn")
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    args.data_dir.mkdir(parents=True, exist_ok=True)
    uri = step.image_dataset(args.data_dir, 4000)
    report: dict[str, Any] = {}
    if "budget" in args.parts:
        budgets: list[float | None] = [None, 0.25, 0.5, 1.0, 2.0]
        runs: dict[str, list[dict[str, float]]] = {str(b): [] for b in budgets}
        for _ in range(args.repeats):
            for b in budgets:
                runs[str(b)].append(budget_run(uri, b, args.seconds))
                print(f"  budget {b}: {runs[str(b)][-1]}", file=sys.stderr)
        report["budget"] = {k: medians(v) for k, v in runs.items()}
    if "heavy" in args.parts:
        heavy_budgets: list[float | None] = [
            None,
            *(float(b) for b in args.heavy_budgets.split(",")),
        ]
        heavy: dict[str, list[dict[str, float]]] = {str(b): [] for b in heavy_budgets}
        for _ in range(args.repeats):
            for b in heavy_budgets:
                heavy[str(b)].append(budget_run(uri, b, args.seconds, heavy=args.heavy_workers))
                print(f"  heavy, budget {b}: {heavy[str(b)][-1]}", file=sys.stderr)
        report["heavy"] = {k: medians(v) for k, v in heavy.items()}
        report["heavy_worst_of_runs"] = {
            k: max(r["worst_5s_cores"] for r in v) for k, v in heavy.items()
        }
    if "tune" in args.parts:
        engines: dict[str, dict[str, Any]] = {
            "default (tuned)": {},
            "default, tune=False": {"tune": False},
            "tune=True, 4 workers": {"num_workers": 4, "tune": True},
            **{f"fixed, {n} workers": {"num_workers": n} for n in (1, 2, 4)},
        }
        if args.engines:
            engines = {k: v for k, v in engines.items() if k in args.engines.split(";")}
        acc = step.Accelerator(args.accelerator, 1)
        tuned: dict[str, list[dict[str, float]]] = {k: [] for k in engines}
        try:
            for _ in range(args.repeats):
                for name, engine in engines.items():
                    tuned[name].append(tune_run(uri, engine, acc, args))
                    print(f"  {name}: {tuned[name][-1]}", file=sys.stderr)
        finally:
            acc.close()
        report["tune"] = {k: medians(v) for k, v in tuned.items()}
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text)


if __name__ == "__main__":
    main()
