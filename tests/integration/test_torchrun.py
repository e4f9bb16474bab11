"""torchrun (gloo, CPU): train, SIGKILL mid-epoch, resume on 1 and on 2 ranks, same parameters.

The uninterrupted reference run is the example's ``main`` in this process, on one rank: the
example keeps the global batch whatever the number of ranks, so its result is the one a 2-rank
run reaches (the resumed runs are compared with it on 1 and on 2 ranks), and it costs no torchrun
start (three interpreters importing torch)."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lanceloader.demo import write_demo_dataset

pytestmark = pytest.mark.integration
EXAMPLE = Path(__file__).parents[2] / "examples" / "train_resume.py"


# torch 2.13 keeps a DDP model's gloo process group, and its threads, alive after
# destroy_process_group(); at interpreter exit they race the C++ teardown, and now and then a rank
# aborts with this libstdc++ message after all its work is done. A six-line DDP script without
# lanceloader does the same (about 1 run in 14 on a loaded 2-core machine).
TEARDOWN_ABORT = "terminate called without an active exception"


def finished_then_aborted(done: subprocess.CompletedProcess[str], nproc: int) -> bool:
    """Every rank printed its last line, and what failed afterwards was torch's exit abort."""
    finished = all(f"rank {r}: done at step" in done.stdout for r in range(nproc))
    return finished and TEARDOWN_ABORT in done.stdout + done.stderr and "SIGABRT" in done.stderr


def run(nproc: int, data: str, ckpt: Path, out: Path | None = None, kill_at: int = -1) -> int:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        str(EXAMPLE),
        "--data",
        data,
        "--ckpt",
        str(ckpt),
        "--kill-at-step",
        str(kill_at),
    ]
    if out is not None:
        cmd += ["--out", str(out)]
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONFAULTHANDLER": "1",
    }  # a crash prints every thread's stack
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    if done.returncode and kill_at < 0:  # an unexpected failure: show what torchrun said
        print(done.stdout[-3000:], done.stderr[-6000:], sep="\n")
        if finished_then_aborted(done, nproc):
            print("every rank finished; the abort came from torch's teardown at exit (see above)")
            return 0
    return done.returncode


def run_here(data: str, ckpt: Path, out: Path) -> None:
    """The example's ``main`` in this process, on one rank, uninterrupted (torch's global random
    state restored afterwards)."""
    spec = importlib.util.spec_from_file_location("train_resume", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    with torch.random.fork_rng():
        example.main(["--data", data, "--ckpt", str(ckpt), "--out", str(out)])


def params(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path)["params"]


def test_sigkill_then_resume_on_one_and_two_ranks(tmp_path: Path) -> None:
    data = write_demo_dataset(tmp_path / "data.lance", rows=1600, fragments=2)
    run_here(data, tmp_path / "full", tmp_path / "full.pt")
    reference = params(tmp_path / "full.pt")
    assert torch.load(tmp_path / "full.pt")["step"] == 50  # 2 epochs of 1600 // 64 steps

    rc = run(2, data, tmp_path / "killed", kill_at=17)  # mid-epoch 0
    assert rc != 0
    assert torch.load(tmp_path / "killed" / "checkpoint.pt")["step"] == 17
    shutil.copytree(tmp_path / "killed", tmp_path / "killed2")

    for nproc, ckpt in [(1, tmp_path / "killed"), (2, tmp_path / "killed2")]:
        out = tmp_path / f"resumed{nproc}.pt"
        assert run(nproc, data, ckpt, out) == 0
        assert torch.load(out)["step"] == 50
        for name, value in params(out).items():
            torch.testing.assert_close(value, reference[name], rtol=1e-5, atol=1e-6)


PLAN_SCRIPT = """
import sys
import torch.distributed as dist
import lanceloader as ll

dist.init_process_group("gloo")
data, cache = sys.argv[1], sys.argv[2]
options = dict(batch_size=8, filter="label = 3", splits={"a": 0.5, "b": 0.5}, split="a")
shared = ll.Loader(data, cache=cache, **options)
alone = ll.Loader(data, **options)
ids = sorted(int(i) for b in shared for i in b["id"])
assert ids == sorted(int(i) for b in alone for i in b["id"])
print(f"rank {dist.get_rank()}: cache {shared.source.plan_origin}, "
      f"alone {alone.source.plan_origin}, rows {len(ids)}", flush=True)
dist.destroy_process_group()
"""


def test_two_ranks_scan_a_filter_plan_once_through_the_cache(tmp_path: Path) -> None:
    """The planning scan of filter + split: once per machine with cache=, once per rank
    without."""
    data = write_demo_dataset(tmp_path / "data.lance", rows=4000, fragments=2)
    script = tmp_path / "plan.py"
    script.write_text(PLAN_SCRIPT)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(script),
        data,
        str(tmp_path / "cache"),
    ]
    done = subprocess.run(
        cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=240
    )
    # the ranks share one stdout pipe: a line may land in the middle of the other's
    lines = sorted(re.findall(r"rank \d+: cache \w+, alone \w+, rows \d+", done.stdout))
    if len(lines) < 2:
        print(done.stdout[-3000:], done.stderr[-6000:], sep="\n")
    assert len(lines) == 2 and (done.returncode == 0 or TEARDOWN_ABORT in done.stderr)
    origins = [line.split(": ")[1] for line in lines]
    assert sorted(o.split(",")[0] for o in origins) == ["cache cache", "cache scan"]
    assert all("alone scan" in o for o in origins)
