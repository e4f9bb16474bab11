"""torchrun (gloo, CPU, 2 ranks): set_weights checks, with one small all-gather, that every
rank made the same calls; the same calls pass and deliver each rank its slice, a call that
differs on rank 1 is refused on both ranks, naming it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa
import pytest

pytest.importorskip("torch")
pytestmark = pytest.mark.integration

SCRIPT = """
import json, sys
import torch.distributed as dist
import lanceloader as ll

a, b, out = sys.argv[1], sys.argv[2], sys.argv[3]
dist.init_process_group("gloo")
rank = dist.get_rank()
mix = ll.Mix({"a": ll.Loader(a), "b": ll.Loader(b)}, samples_per_epoch=40)
loader = ll.Loader(mix, batch_size=2, num_workers=1)
loader.set_weights({"a": 1, "b": 0}, step=2)
ids = [b["id"].tolist() for b, _ in zip(loader, range(4))]
try:
    loader.set_weights({"a": 1, "b": 3 if rank == 0 else 2}, step=6)
    error = None
except ValueError as exc:
    error = str(exc)
with open(f"{out}/rank{rank}.json", "w") as f:
    json.dump({"ids": ids, "error": error}, f)
dist.destroy_process_group()
"""


def test_ranks_that_call_set_weights_differently_are_refused(tmp_path: Path) -> None:
    uris = []
    for base in (1000, 2000):
        uris.append(str(tmp_path / f"{base}.lance"))
        lance.write_dataset(pa.table({"id": np.arange(30) + base}), uris[-1])
    script = tmp_path / "feedback_ranks.py"
    script.write_text(SCRIPT)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    done = subprocess.run(
        [*cmd, str(script), *uris, str(tmp_path)],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    steps = [ranks[0]["ids"][s] + ranks[1]["ids"][s] for s in range(4)]
    assert [sorted({i // 1000 for i in step}) for step in steps] == [[1, 2], [1, 2], [1], [1]]
    for rank in ranks:
        assert rank["error"] is not None and "ranks [1] made other weight calls" in rank["error"]
