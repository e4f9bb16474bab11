"""Train, get killed, resume at the exact sample, on any number of ranks.

A tiny classifier trained with DistributedDataParallel on the CPU (gloo). After every step,
rank 0 saves the model, the optimiser and the loader's state in one checkpoint file, atomically.
Run it again with the same ``--ckpt`` and it continues where the checkpoint was taken, on as many
ranks as you give it: the global batch stays the same, so the result does too.

    python examples/train_resume.py --data demo.lance --ckpt /tmp/ckpt         # one process
    torchrun --nproc_per_node=2 examples/train_resume.py --data demo.lance --ckpt /tmp/ckpt

``--kill-at-step N`` makes rank 0 SIGKILL itself right after saving step N (for the tests).
"""

from __future__ import annotations

import argparse
import os
import signal
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

import lanceloader as ll


def save_checkpoint(
    path: Path, model: torch.nn.Module, optim: torch.optim.Optimizer, loader: ll.Loader, step: int
) -> None:
    """Model, optimiser and loader state in one file, replaced atomically."""
    tmp = path.with_suffix(".tmp")
    torch.save(
        {
            "model": model.state_dict(),
            "optim": optim.state_dict(),
            "loader": loader.state_dict(),
            "step": step,
        },
        tmp,
    )
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True)
    p.add_argument("--ckpt", required=True, help="directory for checkpoint.pt")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--global-batch-size", type=int, default=64)
    p.add_argument("--kill-at-step", type=int, default=-1)
    p.add_argument("--out", help="save the final parameters here (rank 0)")
    args = p.parse_args(argv)

    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        dist.init_process_group("gloo")
    world = dist.get_world_size() if distributed else 1
    rank = dist.get_rank() if distributed else 0

    torch.manual_seed(0)
    model = torch.nn.Linear(64, 10)
    optim = torch.optim.SGD(model.parameters(), lr=0.1)
    ddp = torch.nn.parallel.DistributedDataParallel(model) if distributed else model
    # rank and world size come from torch.distributed; each rank reads its slice of each
    # global batch, so the global batch (and the training) is the same on 1 or N ranks.
    loader = ll.Loader(
        args.data,
        batch_size=args.global_batch_size // world,
        columns=["x", "label"],
        shuffle=True,
        seed=0,
        drop_last=True,
        output="torch",
    )

    ckpt = Path(args.ckpt) / "checkpoint.pt"
    step = 0
    if ckpt.exists():
        saved = torch.load(ckpt)
        model.load_state_dict(saved["model"])
        optim.load_state_dict(saved["optim"])
        # The per-rank batch size changes with the number of ranks; the order does not.
        loader.load_state_dict(saved["loader"], allow_changes=("batch_size",))
        step = saved["step"]

    while loader.epoch < args.epochs:
        for batch in loader:
            loss = F.cross_entropy(ddp(batch["x"]), batch["label"].long())
            optim.zero_grad()
            loss.backward()
            optim.step()
            step += 1
            if rank == 0:
                ckpt.parent.mkdir(parents=True, exist_ok=True)
                save_checkpoint(ckpt, model, optim, loader, step)
                if step == args.kill_at_step:
                    os.kill(os.getpid(), signal.SIGKILL)
            if distributed:
                dist.barrier()  # no rank runs ahead of the checkpoint

    if rank == 0 and args.out:
        torch.save({"params": model.state_dict(), "step": step}, args.out)
    if distributed:
        dist.destroy_process_group()
    print(f"rank {rank}: done at step {step}", flush=True)


if __name__ == "__main__":
    main()
