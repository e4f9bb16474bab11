"""Memory between reads: glibc's malloc told to keep what a read freed for the next read, once
per process (a worker process of ours, and the training process when thread workers read)."""

from __future__ import annotations

import ctypes
import os

# glibc's mallopt parameters, and what a worker sets them to (reuse_freed_memory).
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 32 << 20  # glibc's largest: blocks up to 32 MiB come from the heap, reused
TRIM_THRESHOLD = 256 << 20  # a worker process: free memory a heap keeps for the next reads
#: the training process (thread workers): the ceiling of glibc's own dynamic trim threshold
#: (twice the largest mmap threshold), reached in any process that frees a 32 MiB block
TRAINING_TRIM_THRESHOLD = 64 << 20
_memory_kept = False


def reuse_freed_memory(trim_threshold: int = TRIM_THRESHOLD) -> bool:
    """Let glibc's malloc keep the memory a read freed for the next read: once per process, in
    a worker process of ours (``TRIM_THRESHOLD``) and, when thread workers read, in the
    training process (:data:`TRAINING_TRIM_THRESHOLD`, from ``Stream``). True when set here;
    never where the user set ``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_`` or
    ``GLIBC_TUNABLES`` (their choice wins), a no-op without glibc (musl, macOS).

    Why: Lance allocates each read's buffers afresh, and glibc's thresholds (128 KiB at first)
    hand them back to the kernel, so the next read page-faults its whole output again (the
    measured faults: docs/performance.md, "Memory between reads"). The values are those glibc's
    own rule reaches after any 32 MiB block is freed; a block above 32 MiB is still returned at
    once. The cost: resident memory stays nearer its peak, by at most the trim threshold.

    >>> MMAP_THRESHOLD >> 20, TRIM_THRESHOLD >> 20, TRAINING_TRIM_THRESHOLD >> 20  # MiB
    (32, 256, 64)
    """
    global _memory_kept
    if _memory_kept:
        return False
    _memory_kept = True
    if any(
        k in os.environ
        for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")
    ):
        return False
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    if not hasattr(libc, "gnu_get_libc_version"):  # glibc only, not musl or macOS
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(M_TRIM_THRESHOLD, trim_threshold)
    )
