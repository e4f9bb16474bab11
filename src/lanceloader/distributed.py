"""Which rank am I, out of how many? Asked of the engines that already know.

Sources, in order of precedence: an initialised ``torch.distributed`` process group, Ray Train's
worker context, then the ``RANK`` / ``WORLD_SIZE`` environment variables (set by torchrun,
Accelerate, Lightning, SLURM wrappers). Every available source is consulted, and if two disagree
that is an error: a job whose ranks do not agree on the world size would deliver overlapping
data and hang at the end of an epoch.

Engines are only consulted when already imported: detecting a rank never imports torch or Ray.

Example::

    >>> detect_rank_world(environ={"RANK": "1", "WORLD_SIZE": "4"})
    (1, 4)
    >>> detect_rank_world(environ={})
    (0, 1)
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping


def _torch_distributed() -> tuple[int, int] | None:
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None


def _ray_train() -> tuple[int, int] | None:
    if "ray" not in sys.modules or "ray.train" not in sys.modules:
        return None
    try:
        import ray.train

        context = ray.train.get_context()
        return context.get_world_rank(), context.get_world_size()
    except Exception:  # not inside a Ray Train worker
        return None


def _environment(environ: Mapping[str, str]) -> tuple[int, int] | None:
    rank, world = environ.get("RANK"), environ.get("WORLD_SIZE")
    if rank is None and world is None:
        return None
    if rank is None or world is None:
        raise ValueError(
            f"environment has RANK={rank!r} and WORLD_SIZE={world!r}; set both or neither, "
            "or pass rank= and world_size= to the loader"
        )
    try:
        return int(rank), int(world)
    except ValueError:
        raise ValueError(
            f"environment RANK={rank!r} / WORLD_SIZE={world!r} are not integers"
        ) from None


def resolve_rank_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Both given: check them; neither: detect them. One without the other is an error.

    >>> resolve_rank_world(1, 2)
    (1, 2)
    """
    if (rank is None) != (world_size is None):
        raise ValueError(
            f"pass both rank= and world_size= (got rank={rank}, world_size={world_size}), "
            "or neither to detect them from torch.distributed, Ray Train or RANK/WORLD_SIZE"
        )
    if rank is None or world_size is None:
        rank, world_size = detect_rank_world()
    for name, value, minimum in (("world_size", world_size, 1), ("rank", rank, 0)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
        if value < minimum:
            raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if rank >= world_size:
        raise ValueError(f"rank must lie in [0, world_size={world_size}), got {rank}")
    return rank, world_size


def detect_rank_world(environ: Mapping[str, str] | None = None) -> tuple[int, int]:
    """``(rank, world_size)`` from the running engines; ``(0, 1)`` when there are none."""
    found = {
        "torch.distributed": _torch_distributed(),
        "Ray Train": _ray_train(),
        "RANK/WORLD_SIZE environment variables": _environment(
            os.environ if environ is None else environ
        ),
    }
    found = {name: rw for name, rw in found.items() if rw is not None}
    if len(set(found.values())) > 1:
        sides = ", ".join(f"{name} says rank {r} of {w}" for name, (r, w) in found.items())
        raise ValueError(
            f"rank sources disagree: {sides}; pass rank= and world_size= to the loader explicitly"
        )
    return next(iter(found.values()), (0, 1))
