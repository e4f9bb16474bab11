"""torchrun (gloo, CPU, 2 ranks): a followed table appended between the two ranks' looks at an
epoch's start; both read rank 0's version (``follow=True`` broadcasts it through
``torch.distributed``), so the epoch's rows are dealt out once.

Rank 1 appends while rank 0 waits in the broadcast (it sleeps first, so rank 0 has looked by
then): without the agreement rank 0 would read the old version and rank 1 the new one, and the
ranks' rows would overlap. A slower machine only makes the race less likely, never the test
fail."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import lance
import pyarrow as pa
import pytest

pytest.importorskip("torch")
pytestmark = pytest.mark.integration

SCRIPT = """
import json, sys, time
import lance, pyarrow as pa, torch.distributed as dist
import lanceloader as ll

uri, out = sys.argv[1], sys.argv[2]
dist.init_process_group("gloo")
rank = dist.get_rank()
loader = ll.Loader(uri, batch_size=4, columns=["id"], shuffle=True, follow=True, num_workers=1)
epochs = [[i for b in loader for i in b["id"].tolist()]]
dist.barrier()
if rank == 1:
    time.sleep(2)   # rank 0 has looked and waits in the broadcast
    ids = list(range(1000, 1010))
    table = pa.table({"id": pa.array(ids, pa.int64())})
    lance.write_dataset(table, uri, mode="append")
epochs.append([i for b in loader for i in b["id"].tolist()])
dist.barrier()
epochs.append([i for b in loader for i in b["id"].tolist()])  # both adopt the append now
with open(f"{out}/rank{rank}.json", "w") as f:
    json.dump({"epochs": epochs, "state": loader.state_dict()}, f)
dist.destroy_process_group()
"""


def test_ranks_read_rank0s_version_through_torch_distributed(tmp_path: Path) -> None:
    uri = str(tmp_path / "t.lance")
    lance.write_dataset(pa.table({"id": pa.array(range(40), pa.int64())}), uri)
    script = tmp_path / "follow_ranks.py"
    script.write_text(SCRIPT)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    done = subprocess.run(
        [*cmd, str(script), uri, str(tmp_path)],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=240,
    )
    ranks = [tmp_path / f"rank{r}.json" for r in range(2)]
    if done.returncode and not all(p.exists() for p in ranks):
        raise AssertionError(done.stdout[-3000:] + done.stderr[-6000:])
    runs = [json.loads(p.read_text()) for p in ranks]
    assert runs[0]["state"] == runs[1]["state"]
    expected = [set(range(40)), set(range(40)), set(range(40)) | set(range(1000, 1010))]
    for epoch, rows in enumerate(expected):
        got = runs[0]["epochs"][epoch] + runs[1]["epochs"][epoch]
        assert sorted(got) == sorted(rows), f"epoch {epoch}"
