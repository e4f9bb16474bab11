"""A mix's reads keep their memory: freeing a read of several Lance calls no longer gives its
pages back to the kernel for the next read to fault in afresh (``reuse_freed_memory``)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import lance
import numpy as np
import pyarrow as pa
import pytest

from lanceloader.engine import memory

CHILD = textwrap.dedent(
    """
    import json, resource, sys
    import lanceloader as ll
    import lanceloader.engine.stream as stream
    if sys.argv[2] == "control":  # glibc's thresholds left as they are
        stream.reuse_freed_memory = lambda trim: False
    mix = ll.Mix({n: ll.Loader(f"{sys.argv[1]}/{n}.lance", cache=None) for n in "pqr"},
                 run_length=64)
    loader = ll.Loader(mix, batch_size=64, num_workers=1, rows_per_read=3 * 4096)
    faults = []
    for epoch in range(4):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        rows = sum(len(b["id"]) for b in loader)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    print(json.dumps({"rows": rows, "faults": sum(faults[1:])}))  # after the first epoch
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_an_epoch_of_a_mix_does_not_fault_its_reads_in_afresh(tmp_path) -> None:
    """Reads of 3 calls of 4,096 rows of 264 B (1 MiB each), 4 epochs: glibc's thresholds
    rise only as far as the largest block freed (1 MiB), so freeing a read (3 MiB) gave its
    pages back and every read faulted them in again (2,300-4,000 faults an epoch, measured);
    kept, 9-280."""
    rng = np.random.default_rng(0)
    for name in "pqr":
        x = rng.standard_normal((40_000, 64), dtype=np.float32).reshape(-1)
        table = pa.table(
            {"id": np.arange(40_000), "x": pa.FixedSizeListArray.from_arrays(pa.array(x), 64)}
        )
        lance.write_dataset(table, tmp_path / f"{name}.lance")
    runs = {}
    for kind in ("control", "retained"):
        out = subprocess.run(
            [sys.executable, "-c", CHILD, str(tmp_path), kind],
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        )
        runs[kind] = json.loads(out.stdout.strip().splitlines()[-1])
    assert runs["control"]["rows"] == runs["retained"]["rows"] == 120_000
    if runs["control"]["faults"] < 3_000:
        pytest.skip(f"this allocator keeps freed reads by itself: {runs}")
    assert runs["retained"]["faults"] * 5 < runs["control"]["faults"], runs


def test_the_thresholds_are_glibcs_own_ceiling_and_the_users_settings_win(monkeypatch) -> None:
    """Set once per process; never over the user's own ``MALLOC_*`` settings."""
    calls = []

    class Mallopt:  # takes argtypes and restype, as a ctypes function does
        def __call__(self, option, value):
            calls.append((option, value))
            return 1

    class Libc:
        gnu_get_libc_version = None
        mallopt = Mallopt()

    monkeypatch.setattr(memory.ctypes, "CDLL", lambda name: Libc())
    monkeypatch.setattr(memory, "_memory_kept", False)
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "131072")
    assert not memory.reuse_freed_memory(memory.TRAINING_TRIM_THRESHOLD) and calls == []
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_")
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    monkeypatch.setattr(memory, "_memory_kept", False)
    assert memory.reuse_freed_memory(memory.TRAINING_TRIM_THRESHOLD)
    assert calls == [(-3, 32 << 20), (-1, 64 << 20)]
    assert not memory.reuse_freed_memory() and len(calls) == 2  # once per process
