"""What Grain's ``mp_prefetch`` needs of the process that starts it: absl flags it can read, and
the shared memory of the last batches unlinked before that process exits.

Grain 0.2.18 reads the absl flag ``--grain_enable_multiprocess_worker_profiling`` unguarded when
``mp_prefetch`` starts its workers; in a program that never parsed absl flags (any script that
is not an absl app) with JAX imported, that read raises ``UnparsedFlagAccessError``
(google/grain#1355). Grain hands each batch over in shared memory and unlinks it on a thread
when the batch is freed; the batches freed as the program ends were left to the exit, which
cuts that thread short, and ``resource_tracker`` then warned of "leaked shared_memory objects".
"""

from __future__ import annotations

import atexit
import contextlib
import gc

from absl import flags

GRAIN_FLAGS = ("grain_enable_multiprocess_worker_profiling",)
UNLINK_WAIT_S = 10.0  # at exit, the longest wait for Grain's unlinks of the last batches


def make_grain_flags_readable() -> None:
    """Mark Grain's unguarded flags as given, with their defaults, while absl has parsed none:
    what Grain does itself in its workers (``process_prefetch._parse_debug_flags``). Nothing else
    changes: other flags stay unparsed, and a program that parses its flags later sets them."""
    if flags.FLAGS.is_parsed():
        return
    for name in GRAIN_FLAGS:
        if name in flags.FLAGS and not flags.FLAGS[name].present:
            flags.FLAGS[name].present = 1


def unlink_freed_batches() -> None:
    """At exit: let Grain's thread unlink the shared memory of the batches freed just before
    (one thread, so a no-op queued after them runs once they are done), within
    :data:`UNLINK_WAIT_S`. Batches still referenced at exit (module globals) are not freed yet:
    run the pipeline in a function."""
    try:
        from grain._src.python.ipc.shared_memory_array import SharedMemoryArray
    except ImportError:  # another Grain layout: nothing of ours to wait for
        return
    pool = getattr(SharedMemoryArray, "_del_thread_pool", None)
    if pool is None:  # no batch came through shared memory in this process
        return
    gc.collect()  # batches held only by reference cycles
    with contextlib.suppress(Exception):  # the exit goes on whatever happens here
        pool.apply_async(_nothing).get(timeout=UNLINK_WAIT_S)


def _nothing() -> None:
    return None


atexit.register(unlink_freed_batches)
