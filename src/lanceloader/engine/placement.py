"""Placement: pinned memory and device copies for torch batches, in the consumer.

Pinning page-locks a batch's tensors so a copy to a GPU can run asynchronously; ``device=``
copies each batch there with ``non_blocking=True`` on a side CUDA stream, then makes the
current stream wait for it, so the copy of batch *n+1* overlaps the training step on batch *n*.
On a machine without CUDA, pinning is skipped with one warning and a CUDA device is an error.

Example::

    >>> check_placement("numpy", pin_memory=False, device=None) is None
    True
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any


def check_placement(output: str, pin_memory: bool, device: str | None
                    ) -> Callable[[Any], Any] | None:
    """Validate ``pin_memory`` / ``device`` now; return the per-batch placement (or None)."""
    if not pin_memory and device is None:
        return None
    if output != "torch":
        raise ValueError(
            f"pin_memory= and device= need output='torch' (got output={output!r}); move "
            "arrays yourself, e.g. jax.device_put, for other frameworks"
        )
    import torch

    target = torch.device(device) if device is not None else None
    cuda = torch.cuda.is_available()
    if target is not None and target.type == "cuda" and not cuda:
        raise ValueError(
            f"device={device!r} but this machine has no CUDA device (torch "
            f"{torch.__version__}); use device=None or 'cpu'"
        )
    if pin_memory and not cuda:
        warnings.warn("pin_memory=True has no effect without CUDA; batches are not pinned",
                      RuntimeWarning, stacklevel=3)
        pin_memory = False
    stream = torch.cuda.Stream() if target is not None and target.type == "cuda" else None

    def place(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: place(v) for k, v in value.items()}
        if not isinstance(value, torch.Tensor):
            return value
        if pin_memory:
            value = value.pin_memory()
        if target is None:
            return value
        if stream is None:
            return value.to(target)
        with torch.cuda.stream(stream):
            moved = value.to(target, non_blocking=True)
        torch.cuda.current_stream().wait_stream(stream)
        moved.record_stream(torch.cuda.current_stream())
        return moved

    return place
