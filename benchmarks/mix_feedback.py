"""Mix feedback: what ``Loader.set_weights`` costs the training loop, with many sources.

Method
------
* ``--sources`` (default 100) Lance datasets of ``--rows`` rows each (default 2,000: ``id``
  and 16 float32), written under a temporary directory, mixed by ``ll.Mix`` with equal
  weights; ``Loader(mix, batch_size=256, num_workers=2)``.
* The training loop: ``--steps`` steps (default 300). At every step it takes a batch and then
  calls ``set_weights`` with new random weights (an exponentiated-gradient update of per-source
  losses, as in the guide's example) for a step ``--lead`` steps ahead (default: past the
  read-ahead, so the live iterator keeps what it read; ``--lead 0`` names the next step and
  makes it read again). Each call is timed with ``perf_counter`` around ``set_weights`` alone.
* Also timed: ``state_dict()`` after the run (its feedback entries: at most 64, folded into
  the anchor every 64 calls), and the same loop without calls (batches/s with and without).
* A warm-up run first (not counted), then ``--repeats`` runs with calls and as many without,
  alternated. Reported: the calls' median, p90 and max (ms; medians over the runs), the
  folding calls (every 64th) apart, ``state_dict()``'s time and the state's size in bytes,
  and the median ratio of steps/s with calls to without. Target (issue 45): median < 1 ms
  with 100 sources.

Usage::

    python benchmarks/mix_feedback.py                   # 100 sources, 300 steps
    python benchmarks/mix_feedback.py --sources 10 --steps 100
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

import lance
import numpy as np
import pyarrow as pa

import lanceloader as ll


def write_sources(root: str, sources: int, rows: int) -> dict[str, str]:
    uris = {}
    for k in range(sources):
        uri = f"{root}/s{k:03d}.lance"
        x = np.random.default_rng(k).random((rows, 16), dtype=np.float32)
        lance.write_dataset(
            pa.table(
                {
                    "id": np.arange(rows) + k * 1_000_000,
                    "x": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), 16),
                }
            ),
            uri,
        )
        uris[f"s{k:03d}"] = uri
    return uris


def loader_of(uris: dict[str, str]) -> ll.Loader:
    sources = {n: ll.Loader(u, shuffle=True, seed=1) for n, u in uris.items()}
    return ll.Loader(ll.Mix(sources), batch_size=256, num_workers=2)


def run(uris: dict[str, str], steps: int, lead: int | None, calls: bool) -> dict[str, object]:
    """``steps`` steps of the loop; with ``calls``, a set_weights call after each."""
    loader = loader_of(uris)
    names = list(uris)
    rng = np.random.default_rng(0)
    log_w = np.zeros(len(names))
    timings: list[float] = []
    it = iter(loader)
    began = time.perf_counter()
    for _ in range(steps):
        batch = next(it, None)
        if batch is None:
            it = iter(loader)
            batch = next(it)
        if not calls:
            continue
        losses = rng.random(len(names))  # per-source losses the model reports
        log_w += 0.1 * losses  # exponentiated gradient
        w = np.exp(log_w - log_w.max())
        w = 0.9 * w / w.sum() + 0.1 / len(names)  # smoothed towards uniform
        ahead = lead if lead is not None else loader.prefetch + loader.batches_per_read + 1
        weights = dict(zip(names, w.tolist(), strict=True))
        t = time.perf_counter()
        loader.set_weights(weights, step=loader.step + ahead)
        timings.append(time.perf_counter() - t)
    wall = time.perf_counter() - began
    t = time.perf_counter()
    state = loader.state_dict()
    state_s = time.perf_counter() - t
    loader.close()
    out: dict[str, object] = {"steps_per_s": steps / wall, "state_bytes": len(json.dumps(state))}
    if timings:
        regular = [x for i, x in enumerate(timings) if (i + 1) % 64]
        folding = [x for i, x in enumerate(timings) if not (i + 1) % 64]
        out.update(
            median_ms=1e3 * statistics.median(regular),
            p90_ms=1e3 * float(np.quantile(regular, 0.9)),
            max_ms=1e3 * max(regular),
            folding_ms=[round(1e3 * x, 2) for x in folding],
            state_dict_ms=1e3 * state_s,
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sources", type=int, default=100)
    parser.add_argument("--rows", type=int, default=2_000)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lead", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        uris = write_sources(root, args.sources, args.rows)
        run(uris, args.steps // 3, args.lead, calls=True)  # warm-up: caches filled, not counted
        runs: dict[bool, list[dict[str, object]]] = {False: [], True: []}
        for repeat in range(args.repeats):  # alternated, so drift hits both alike
            for calls in (repeat % 2 == 0, repeat % 2 != 0):
                runs[calls].append(run(uris, args.steps, args.lead, calls))
    print(f"{args.sources} sources, {args.steps} steps of 256 rows, a call after each step")
    med = lambda key, rs: statistics.median(float(r[key]) for r in rs)  # noqa: E731
    for key in ("median_ms", "p90_ms", "max_ms", "state_dict_ms", "state_bytes"):
        print(f"  {key}: {med(key, runs[True]):.3f} (median of {args.repeats} runs)")
    print(f"  folding calls (ms): {[r['folding_ms'] for r in runs[True]]}")
    ratio = statistics.median(
        float(a["steps_per_s"]) / float(b["steps_per_s"])
        for a, b in zip(runs[True], runs[False], strict=True)
    )
    print(f"  steps/s with calls / without: {ratio:.2f} (median of the runs' ratios)")


if __name__ == "__main__":
    main()
