"""Headroom analysis against the truth: ``ll.headroom`` on a step made 30% data-bound.

Method
------
* The step: ``step_fn`` sleeps ``--step-ms`` (a GPU step: the host idle). The loader: one thread
  worker whose transform sleeps ``step / (1 - --data-bound)`` per batch, one batch per read, so
  the loop waits ``--data-bound`` (0.3) of its wall time: training is 30% data-bound.
* The truth, measured in the same round: a plain loop of ``--steps`` steps fed by the same
  loader (its wall per step), and the same number of ``step_fn`` calls alone (the floor); the
  true speedup of an infinitely fast loader is their ratio, the true data-bound share
  ``1 - floor / fed``.
* The estimate: ``ll.headroom(loader, step_fn, steps=--steps)`` on a fresh loader: its
  ``speedup`` and ``wait_share``.
* ``--repeats`` rounds, truth and estimate alternating; reported: medians, and the estimate's
  error (estimate / truth - 1) per round, the worst of them too.

Usage::

    python benchmarks/headroom.py                 # 5 rounds of 60 steps of 50 ms
    python benchmarks/headroom.py --repeats 1 --steps 20
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import lanceloader as ll
from lanceloader.demo import write_demo_dataset


def make_loader(uri: str, batch_s: float) -> ll.Loader:
    def slow(batch: Any) -> Any:
        time.sleep(batch_s)
        return batch

    return ll.Loader(
        uri,
        batch_size=64,
        columns=["id"],
        transform=slow,
        num_workers=1,
        rows_per_read=64,
        prefetch=2,
        cache=None,
    )


def truth(uri: str, batch_s: float, step_s: float, steps: int) -> dict[str, float]:
    """The fed wall per step of a plain loop, and the step alone's."""
    loader = make_loader(uri, batch_s)
    batches = iter(loader)
    for _ in range(5):  # the same warm-up as headroom's
        next(batches)
        time.sleep(step_s)
    t0 = time.perf_counter()
    for _ in range(steps):
        next(batches)
        time.sleep(step_s)
    fed = (time.perf_counter() - t0) / steps
    loader.close()
    t0 = time.perf_counter()
    for _ in range(steps):
        time.sleep(step_s)
    floor = (time.perf_counter() - t0) / steps
    return {"speedup": fed / floor, "data_bound": 1 - floor / fed}


def estimate(uri: str, batch_s: float, step_s: float, steps: int) -> dict[str, float]:
    loader = make_loader(uri, batch_s)
    report = ll.headroom(loader, lambda batch: time.sleep(step_s), steps=steps)
    loader.close()
    return {"speedup": report.speedup, "data_bound": report.wait_share}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--step-ms", type=float, default=50.0)
    parser.add_argument("--data-bound", type=float, default=0.3)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    step_s = args.step_ms / 1e3
    batch_s = step_s / (1 - args.data_bound)
    uri = write_demo_dataset(tempfile.mkdtemp() + "/headroom.lance", rows=64 * (args.steps + 10))
    rounds = []
    for _ in range(args.repeats):
        true, est = (
            truth(uri, batch_s, step_s, args.steps),
            estimate(uri, batch_s, step_s, args.steps),
        )
        rounds.append(
            {
                "true_speedup": true["speedup"],
                "estimated_speedup": est["speedup"],
                "speedup_error": est["speedup"] / true["speedup"] - 1,
                "true_data_bound": true["data_bound"],
                "estimated_data_bound": est["data_bound"],
                "data_bound_error": est["data_bound"] / true["data_bound"] - 1,
            }
        )
        print({k: round(v, 3) for k, v in rounds[-1].items()}, flush=True)
    report: dict[str, Any] = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    report["worst_speedup_error"] = max(abs(r["speedup_error"]) for r in rounds)
    report["worst_data_bound_error"] = max(abs(r["data_bound_error"]) for r in rounds)
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text)


if __name__ == "__main__":
    main()
