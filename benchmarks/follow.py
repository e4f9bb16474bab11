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
  records rows/s and CPU time. ``look``: an epoch start that finds nothing newer (the followed loader's only
  extra work on an unchanged table), timed beside each adoption. The followed loader looks for a newer version at each epoch's start (there
  is none: the same data). Orders: ``sequential`` (no cache) and ``full`` (``shuffle=True``,
  the automatic cache). A second pinned Loader runs beside them as a control (two identical
  loaders differ by this much here); the three rotate which goes first. Reported: the median
  of the per-repeat ratios to the pinned one, of rows/s and of this process's CPU seconds per
  row (all its threads: less moved by the other processes of a shared machine than the wall
  clock).
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


def throughput(uri: str, order: str, repeats: int) -> dict[str, list[tuple[float, float]]]:
    """Per repeat, (rows/s, CPU seconds of this process per million rows: every thread, Lance's
    too, less moved by the machine's other processes than the wall clock) of one epoch of each
    loader: pinned, a second pinned one (the control: how far two identical loaders differ
    here) and followed, their order rotated each repeat."""
    from lanceloader import Loader

    follows = {"pinned": False, "pinned again": False, "followed": True}
    loaders = {
        name: Loader(uri, batch_size=256, columns=COLUMNS, follow=follow, **ORDERS[order])
        for name, follow in follows.items()
    }
    for loader in loaders.values():  # warm: the cache filled, Lance's metadata read
        sum(len(b["id"]) for b in loader)
    got: dict[str, list[tuple[float, float]]] = {name: [] for name in loaders}
    names = list(loaders)
    for repeat in range(repeats):
        for name in names[repeat % 3 :] + names[: repeat % 3]:
            t, c = time.perf_counter(), time.process_time()
            rows = sum(len(b["id"]) for b in loaders[name])
            got[name].append((rows / (time.perf_counter() - t), (time.process_time() - c) / rows))
    return got


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
        got = throughput(str(uri), order, args.repeats)
        pinned = got["pinned"]
        followed, control = (
            [
                statistics.median(r[i] / p[i] for r, p in zip(got[name], pinned, strict=True))
                for i in (0, 1)
            ]
            for name in ("followed", "pinned again")
        )
        print(
            f"{order:<11} pinned {statistics.median(r for r, _ in pinned):>12,.0f} rows/s; "
            f"median ratios to it of rows/s and CPU s per row: followed {followed[0]:.3f} "
            f"{followed[1]:.3f}; pinned again (control) {control[0]:.3f} {control[1]:.3f}"
        )


if __name__ == "__main__":
    main()
