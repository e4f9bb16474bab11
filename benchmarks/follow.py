"""Following a growing table (``Loader(follow=True)``): what adopting a version costs, and what
following costs a run whose table does not change.

Method
------
* Adoption: a table of the demo rows (``id``, ``label``, ``x`` of 64 float32, ``text``) in
  ``--fragments`` fragments (default 10,000 of 20 rows), written once under ``--dir``. One
  followed Loader (columns ``id``, ``label``, ``x``; ``cache=None``); each repeat appends one
  fragment of 20 rows, then times ``adopt``: ``loader.source.at_epoch_start(epoch)``, what an
  epoch's first ``iter()`` runs before its first read (open the newest version, build its rows,
  compare its fragments with the current ones); then ``construct``: a pinned
  ``Loader(uri, version=...)`` of that version, the floor an adoption cannot go under.
  Target (issue 45): adopt <= 2 s at 10,000 fragments.
* Throughput: a table of ``--rows`` demo rows (default 500,000, 8 fragments), two Loaders of
  the same data (batch 256, ``output="numpy"``), pinned and ``follow=True``, built once per
  order; each repeat runs one epoch of each, the two alternating which goes first, and
  records rows/s. ``look``: an epoch start that finds nothing newer (the followed loader's only
  extra work on an unchanged table), timed beside each adoption. The followed loader looks for a newer version at each epoch's start (there
  is none: the same data). Orders: ``sequential`` (no cache) and ``full`` (``shuffle=True``,
  the automatic cache). Reported: the median of the per-repeat ratios followed / pinned, of
  rows/s and of this process's CPU seconds per row (all its threads: less moved by the other
  processes of a shared machine than the wall clock).
  Target: within 5%.

Usage::

    python benchmarks/follow.py                          # 10,000 fragments, 500k rows, 7 repeats
    python benchmarks/follow.py --fragments 1000 --rows 100000 --repeats 3    # smoke run
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any

COLUMNS = ["id", "label", "x"]
ORDERS: dict[str, dict[str, Any]] = {"sequential": {}, "full": {"shuffle": True}}
HERE = Path(__file__).resolve().parent


def fragmented_table(root: Path, fragments: int, per_fragment: int = 20) -> str:
    """The table of ``fragments`` fragments under ``root`` (written on first use)."""
    import lance

    from lanceloader.write.demo import demo_table

    path = root / f"fragments-{fragments}.lance"
    if not (path / "_versions").exists():
        lance.write_dataset(
            demo_table(fragments * per_fragment), path, max_rows_per_file=per_fragment
        )
    return str(path)


def adoption(uri: str, repeats: int) -> dict[str, list[float]]:
    """Seconds of each adoption and of a pinned Loader's construction of the same version."""
    import lance

    from lanceloader import Loader
    from lanceloader.write.demo import demo_table

    loader = Loader(uri, batch_size=256, columns=COLUMNS, follow=True, cache=None)
    source, got = loader.source, {"adopt": [], "construct": [], "fragments": [], "look": []}
    for epoch in range(1, 2 * repeats + 1, 2):
        lance.write_dataset(demo_table(20), uri, mode="append")
        t = time.perf_counter()
        source = source.at_epoch_start(epoch)
        got["adopt"].append(time.perf_counter() - t)
        t = time.perf_counter()
        source = source.at_epoch_start(epoch + 1)  # nothing newer: one manifest read
        got["look"].append(time.perf_counter() - t)
        t = time.perf_counter()
        Loader(uri, batch_size=256, columns=COLUMNS, version=source.version, cache=None)
        got["construct"].append(time.perf_counter() - t)
        got["fragments"].append(len(source.fragment_positions()) - 1)
    return got


def throughput(uri: str, order: str, repeats: int) -> list[tuple[float, float, float, float]]:
    """(pinned, followed) rows/s of one epoch each, per repeat, alternating which runs first,
    then (pinned, followed) CPU seconds of this process (every thread, Lance's too) per
    million rows: less moved by other processes on the machine than the wall clock."""
    from lanceloader import Loader

    loaders = {
        follow: Loader(uri, batch_size=256, columns=COLUMNS, follow=follow, **ORDERS[order])
        for follow in (False, True)
    }
    for loader in loaders.values():  # warm: the cache filled, Lance's metadata read
        sum(len(b["id"]) for b in loader)
    pairs = []
    for repeat in range(repeats):
        speed, cpu = {}, {}
        for follow in (True, False) if repeat % 2 else (False, True):
            t, c = time.perf_counter(), time.process_time()
            rows = sum(len(b["id"]) for b in loaders[follow])
            speed[follow] = rows / (time.perf_counter() - t)
            cpu[follow] = (time.process_time() - c) / rows * 1e6
        pairs.append((speed[False], speed[True], cpu[False], cpu[True]))
    return pairs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--fragments", type=int, default=10_000)
    parser.add_argument("--rows", type=int, default=500_000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--dir", type=Path, default=HERE / "data" / "follow")
    args = parser.parse_args()
    import lance

    from lanceloader.write.demo import demo_table

    args.dir.mkdir(parents=True, exist_ok=True)
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    adopted = adoption(fragmented_table(args.dir, args.fragments), args.repeats)
    adopt, construct = (statistics.median(adopted[k]) for k in ("adopt", "construct"))
    print(
        f"adopt a version of {adopted['fragments'][0]:,}-{adopted['fragments'][-1]:,} "
        f"fragments: median {adopt:.3f} s (min {min(adopted['adopt']):.3f}, max "
        f"{max(adopted['adopt']):.3f}); a pinned Loader of it: {construct:.3f} s "
        f"({adopt / construct:.2f}x); an epoch start with nothing newer: "
        f"{statistics.median(adopted['look']) * 1000:.1f} ms"
    )
    uri = args.dir / f"rows-{args.rows}.lance"
    if not (uri / "_versions").exists():
        lance.write_dataset(demo_table(args.rows), uri, max_rows_per_file=-(-args.rows // 8))
    for order in ORDERS:
        pairs = throughput(str(uri), order, args.repeats)
        ratio = statistics.median(f / p for p, f, _, _ in pairs)
        pinned = statistics.median(p for p, _, _, _ in pairs)
        followed = statistics.median(f for _, f, _, _ in pairs)
        cpu = statistics.median(cf / cp for _, _, cp, cf in pairs)
        print(
            f"{order:<11} pinned {pinned:>12,.0f} rows/s  followed {followed:>12,.0f} rows/s  "
            f"median ratio followed/pinned {ratio:.3f}; CPU s per row followed/pinned {cpu:.3f}"
        )


if __name__ == "__main__":
    main()
