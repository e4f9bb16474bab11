"""Ray Train (local Ray, 2 CPU workers): the loader's state travels in Ray's checkpoints (every 5
steps), and a worker failure mid-epoch resumes from the last one at the exact sample, reaching the
same parameters as a run without failure.

The run without failure is computed in this process (``uninterrupted``: both ranks' batches, the
gradient of the mean of their losses, which is what DDP's averaging gives), not as a second Ray
Train run (that one cost about 55 s of the test's 140 s)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import lanceloader as ll
from lanceloader.demo import write_demo_dataset

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.integration


def make_train_loop(data: str, fail_marker: str | None):
    def train_loop(config: dict) -> None:
        import ray.train
        import torch
        import torch.nn.functional as F

        import lanceloader as ll

        torch.manual_seed(0)
        model = torch.nn.Linear(64, 10)
        optim = torch.optim.SGD(model.parameters(), lr=0.1)
        ddp = ray.train.torch.prepare_model(model)
        # rank and world size are detected from Ray Train (and torch.distributed, which agrees).
        loader = ll.Loader(
            data,
            batch_size=32,
            columns=["x", "label"],
            shuffle=True,
            drop_last=True,
            output="torch",
        )
        assert (loader.rank, loader.world_size) == (ray.train.get_context().get_world_rank(), 2)
        step = 0
        checkpoint = ray.train.get_checkpoint()
        if checkpoint:
            with checkpoint.as_directory() as d:
                saved = torch.load(os.path.join(d, "model.pt"))
                model.load_state_dict(saved["model"])
                optim.load_state_dict(saved["optim"])
                step = saved["step"]
                loader.load_state_dict(json.loads(Path(d, "loader.json").read_text()))
        while loader.epoch < 2:
            for batch in loader:
                loss = F.cross_entropy(ddp(batch["x"]), batch["label"].long())
                optim.zero_grad()
                loss.backward()
                optim.step()
                step += 1
                if fail_marker and step == 13 and not os.path.exists(fail_marker):
                    Path(fail_marker).touch()  # between checkpoints: steps 11-13 are redone
                    raise RuntimeError("simulated worker failure mid-epoch")
                if step % 5:
                    continue
                with tempfile.TemporaryDirectory() as d:
                    ckpt = None
                    if ray.train.get_context().get_world_rank() == 0:
                        torch.save(
                            {
                                "model": model.state_dict(),
                                "optim": optim.state_dict(),
                                "step": step,
                            },
                            os.path.join(d, "model.pt"),
                        )
                        Path(d, "loader.json").write_text(json.dumps(loader.state_dict()))
                        ckpt = ray.train.Checkpoint.from_directory(d)
                    ray.train.report({"step": step}, checkpoint=ckpt)
        if ray.train.get_context().get_world_rank() == 0:
            torch.save({"params": model.state_dict(), "step": step}, config["out"])

    return train_loop


def fit(data: str, tmp: Path, name: str, fail_marker: str | None) -> dict:
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    out = str(tmp / f"{name}.pt")
    trainer = TorchTrainer(
        make_train_loop(data, fail_marker),
        train_loop_config={"out": out},
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False, resources_per_worker={"CPU": 1}),
        run_config=RunConfig(
            name=name,
            storage_path=str(tmp / "ray_results"),
            failure_config=FailureConfig(max_failures=1),
        ),
    )
    trainer.fit()
    return torch.load(out)


def uninterrupted(data: str) -> dict:
    """What ``make_train_loop`` computes on 2 ranks without a failure, in this process: each
    step, rank 0's and rank 1's batches (the loader with an explicit rank), and one SGD step on
    the mean of their losses, whose gradient is the average of the ranks' gradients (DDP's
    all-reduce). Torch's global random state is restored afterwards."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = torch.nn.Linear(64, 10)
    optim = torch.optim.SGD(model.parameters(), lr=0.1)
    ranks = [
        ll.Loader(
            data,
            batch_size=32,
            columns=["x", "label"],
            shuffle=True,
            drop_last=True,
            output="torch",
            rank=r,
            world_size=2,
        )
        for r in range(2)
    ]
    step = 0
    for _ in range(2):
        for batches in zip(*ranks, strict=True):
            loss = sum(F.cross_entropy(model(b["x"]), b["label"].long()) for b in batches) / 2
            optim.zero_grad()
            loss.backward()
            optim.step()
            step += 1
    return {"params": model.state_dict(), "step": step}


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_ray_train_restores_the_loader_from_its_checkpoint(tmp_path: Path, local_ray) -> None:
    data = write_demo_dataset(tmp_path / "data.lance", rows=1280, fragments=2)
    reference = uninterrupted(data)
    marker = str(tmp_path / "failed-once")
    resumed = fit(data, tmp_path, "failing", marker)
    assert os.path.exists(marker)  # the failure did happen
    assert reference["step"] == resumed["step"] == 40  # 2 epochs of 1280 // 64
    for key, value in resumed["params"].items():
        torch.testing.assert_close(value, reference["params"][key], rtol=1e-5, atol=1e-6)


def test_the_guides_ray_train_script_runs_as_it_is(tmp_path) -> None:
    """docs/checkpoints.md's Ray Train script, copied out of the page and run unchanged."""
    import re
    import subprocess
    import sys

    page = (Path(__file__).parents[2] / "docs" / "checkpoints.md").read_text()
    script = re.search(r"```python\n(import tempfile\n\nimport ray\.train.*?)```", page, re.S)
    assert script, "the Ray Train script is no longer on the page"
    path = tmp_path / "ray_train_script.py"
    path.write_text(script.group(1))
    done = subprocess.run(
        [sys.executable, str(path)], cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "'step': " in done.stdout
