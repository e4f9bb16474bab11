"""check_resume's cost: 1,000 interrupted runs of a 10k-row loader (issue 45's target: <= 10
minutes on the project's 2-core machine).

Method: a demo dataset of ``--rows`` rows (default 10,000), a shuffled ``Loader`` of batch 100
per rank (``--ids id``: the id column; without it, a hash of each row's contents), thread
workers; ``ll.check_resume`` with ``--runs`` runs (default 1,000) of 3 resumes over 2 epochs on
world sizes 1, 2 and 4. Prints the report: wall seconds, this process's CPU seconds, resumes and
samples compared. One measurement (it is long); the machine's load is what it is.

    python benchmarks/check_resume.py [--rows 10000] [--runs 1000] [--ids id]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import lanceloader as ll
from lanceloader.demo import write_demo_dataset


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=10_000)
    p.add_argument("--runs", type=int, default=1_000)
    p.add_argument("--ids", default=None, help="a column naming rows; default a content hash")
    p.add_argument("--json", type=Path, help="write the figures here")
    args = p.parse_args()
    uri = write_demo_dataset(Path(tempfile.mkdtemp()) / "bench.lance", rows=args.rows)

    def make_loader(rank: int, world_size: int) -> ll.Loader:
        return ll.Loader(
            uri,
            batch_size=100,
            columns=["id", "x", "label"],
            shuffle=True,
            rank=rank,
            world_size=world_size,
            num_workers=1,
        )

    report = ll.check_resume(make_loader, runs=args.runs, world_sizes=(1, 2, 4), ids=args.ids)
    print(report)
    if args.json:
        figures = {k: v for k, v in vars(report).items() if k != "divergence"}
        args.json.write_text(json.dumps({**figures, "rows": args.rows, "ok": report.ok}))


if __name__ == "__main__":
    main()
