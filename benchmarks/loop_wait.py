"""The training loop's own time in ``next()``: the exposed wait of the default loader feeding a
step, old code against new, and the floors it is measured against.

Method
------
* The workload is ``benchmarks/step.py``'s images (JPEGs of 128x128 decoded and resized to
  64x64 by ``decode_images``, batches of 32, block shuffle, ``cache="auto"``), fed to step.py's
  ``sleep`` accelerator of ``--step-ms`` per batch: ``--warmup`` steps, then ``--steps``
  measured, epoch after epoch (125 batches each). Exposed wait = wall - the steps' time
  (step.py's ``run_once``), per step.
* Cases: ``default`` (the loader as a user gets it: thread workers, tuned), ``process`` (2
  process workers), ``fixed`` (2 threads, ``prefetch=8``: the default's depth, not tuned),
  ``all-sent`` (``prefetch=100000``: every read sent at the start, so ``next()`` never sends
  one) and ``bare`` (a generator over batches made beforehand: the floor of any Python loop).
* Each case runs in a fresh interpreter; with ``--compare DIR`` the same case on the code in
  ``DIR/src`` (a ``git worktree`` of an older commit) alternates with this checkout's,
  ``--rounds`` times. Printed: one JSON line per run, then the medians per code and case.

Usage::

    python benchmarks/loop_wait.py --cases default,process --compare /tmp/old --rounds 4
    python benchmarks/loop_wait.py --cases default,all-sent,bare --step-ms 15
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

RUN = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
import step
from pathlib import Path
case, step_ms, warmup, steps = sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
makers = step.workloads(Path(sys.argv[6]), False)
acc = step.Accelerator("sleep", 0)
settings = {
    "default": {"num_workers": None, "worker_type": "thread", "prefetch": None},
    "process": {"num_workers": 2, "worker_type": "process", "prefetch": None},
    "fixed": {"num_workers": 2, "worker_type": "thread", "prefetch": 8},
    "all-sent": {"num_workers": 2, "worker_type": "thread", "prefetch": 100000},
    "bare": {"num_workers": 2, "worker_type": "thread", "prefetch": None},
}
setting = {**settings[case], "rows_per_read": None, "cache": "auto"}
class Args: pass
args = Args(); args.warmup, args.steps = warmup, steps
if case == "bare":
    made = list(makers["images"](setting))
    def batches():
        while True:
            yield from made
    it = batches()
    for _ in range(warmup):
        next(it); acc.step(step_ms / 1e3)
    busy, t0 = 0.0, time.perf_counter()
    for _ in range(steps):
        next(it); s0 = time.perf_counter(); acc.step(step_ms / 1e3); busy += time.perf_counter() - s0
    out = {"wait_ms_per_step": (time.perf_counter() - t0 - busy) / steps * 1e3}
else:
    out = step.run_once(makers["images"], setting, acc, step_ms / 1e3, args)
print(json.dumps(out))
"""


def run(src: Path, case: str, args: argparse.Namespace) -> dict[str, float]:
    """One case in a fresh interpreter on the code in ``src``."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    argv = [str(HERE), case, str(args.step_ms), str(args.warmup), str(args.steps), str(args.data)]
    done = subprocess.run(
        [sys.executable, "-c", RUN, *argv], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", default="default")
    parser.add_argument("--step-ms", type=float, default=15.0)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--compare", type=Path, help="a checkout of older code to alternate with")
    parser.add_argument("--data", type=Path, default=HERE / "data" / "step")
    args = parser.parse_args()
    codes = {"new": HERE.parent / "src"}
    if args.compare:
        codes["old"] = args.compare / "src"
    waits: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.rounds):
        for case in args.cases.split(","):
            for code, src in codes.items():
                out = run(src, case, args)
                print(json.dumps({"code": code, "case": case, **out}), flush=True)
                waits.setdefault((code, case), []).append(out["wait_ms_per_step"])
    print(f"load average {os.getloadavg()[0]:.1f}; step {args.step_ms:g} ms")
    for (code, case), values in waits.items():
        median = statistics.median(values)
        share = 100 * median / args.step_ms
        print(f"{code:4s} {case:9s} exposed wait {median:.3f} ms a step ({share:.1f}%)")


if __name__ == "__main__":
    main()
