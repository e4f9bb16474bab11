"""Checkpoint costs: the size and time of ``state_dict()``, and the time to the first batch after a
resume near the start vs near the end of an epoch, for every shuffle mode.

Method: one dataset of ``--rows`` rows (default 2M; reuses ``benchmarks/data`` when present).
For each mode, states at 1% and 99% of an epoch are loaded into fresh loaders, ``--repeats``
times interleaved, and the time from ``load_state_dict`` to the first batch is taken (median).
Targets (issue 3): state <= 1 KB and <= 100 us; resume at 99% within 1.2x of resume at 1%.

    python benchmarks/resume.py [--rows 2000000] [--repeats 7]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import lanceloader as ll
from lanceloader.demo import write_demo_dataset

MODES = {
    "sequential": {},
    "block shuffle": {"shuffle": True, "shuffle_block_size": 1024},
    "full shuffle": {"shuffle": True},
}


def dataset(rows: int, data_dir: Path) -> str:
    path = data_dir / f"demo-{rows}x8.lance"
    if not (path / "_versions").exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        write_demo_dataset(path, rows=rows, fragments=8)
    return str(path)


def time_to_first_batch(uri: str, settings: dict, state: dict) -> float:
    loader = ll.Loader(uri, batch_size=256, columns=["id", "label", "x"], **settings)
    start = time.perf_counter()
    loader.load_state_dict(state)
    next(iter(loader))
    elapsed = time.perf_counter() - start
    loader.close()
    return elapsed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--data-dir", type=Path, default=Path("benchmarks/data"))
    p.add_argument("--json", default="benchmarks/results/resume.json")
    args = p.parse_args()
    uri = dataset(args.rows, args.data_dir)

    loader = ll.Loader(uri, batch_size=256, shuffle=True)
    it = iter(loader)
    next(it)
    size = len(json.dumps(loader.state_dict()))
    start = time.perf_counter()
    for _ in range(10_000):
        loader.state_dict()
    state_us = (time.perf_counter() - start) / 10_000 * 1e6
    loader.close()
    print(f"state_dict(): {size} bytes of JSON, {state_us:.1f} us (targets <= 1024 B, <= 100 us)")

    report: dict = {"state_bytes": size, "state_dict_us": state_us, "modes": {}}
    print(f"\n{'mode':<14} {'resume at 1%':>13} {'resume at 99%':>14} {'ratio':>7}  target <= 1.2x")
    for mode, settings in MODES.items():
        base = ll.Loader(uri, batch_size=256, columns=["id", "label", "x"], **settings).state_dict()
        early = dict(base, sample=args.rows // 100 // 256 * 256)
        late = dict(base, sample=args.rows * 99 // 100 // 256 * 256)
        times: dict[str, list[float]] = {"1%": [], "99%": []}
        time_to_first_batch(uri, settings, early)  # warm-up
        for _ in range(args.repeats):
            times["1%"].append(time_to_first_batch(uri, settings, early))
            times["99%"].append(time_to_first_batch(uri, settings, late))
        e, lt = statistics.median(times["1%"]), statistics.median(times["99%"])
        print(f"{mode:<14} {e * 1e3:>11.1f}ms {lt * 1e3:>12.1f}ms {lt / e:>6.2f}x")
        report["modes"][mode] = {"early_s": times["1%"], "late_s": times["99%"], "ratio": lt / e}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
