"""A synthetic dataset for the demo, the benchmarks and the tests.

Columns: ``id`` (int64, equal to the row offset), ``label`` (int64 in [0, 10)), ``x``
(64 float32 as a fixed-size list, 256 B) and ``text`` (a short string). Deterministic for a given
number of rows.

Example::

    >>> import tempfile, os
    >>> path = write_demo_dataset(os.path.join(tempfile.mkdtemp(), "demo.lance"), rows=1000)
    >>> import lance; lance.dataset(path).count_rows()
    1000
"""

from __future__ import annotations

import os
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa

WORDS = ("lance", "loader", "fast", "shuffle", "resume", "tensor", "epoch", "batch", "fork", "seed")


def demo_table(rows: int, start: int = 0, seed: int = 0) -> pa.Table:
    """Rows ``start .. start + rows`` of the demo data."""
    rng = np.random.default_rng([seed, start])
    ids = np.arange(start, start + rows, dtype=np.int64)
    x = rng.standard_normal((rows, 64), dtype=np.float32)
    words = np.array(WORDS)
    text = [
        f"{a} {b} {i}"
        for i, a, b in zip(ids.tolist(), words[ids % 10], words[(ids // 10) % 10], strict=True)
    ]
    return pa.table(
        {
            "id": ids,
            "label": (ids % 10).astype(np.int64),
            "x": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), 64),
            "text": pa.array(text, pa.string()),
        }
    )


def write_demo_dataset(
    path: str | os.PathLike[str], rows: int = 300_000, fragments: int = 4, chunk: int = 250_000
) -> str:
    """Write the demo dataset at ``path`` (overwriting) and return its URI."""
    path = os.fspath(path)
    per_fragment = max(1, -(-rows // fragments))

    def batches() -> pa.RecordBatchReader:
        for start in range(0, rows, chunk):
            yield from demo_table(min(chunk, rows - start), start).to_batches()

    schema = demo_table(1).schema
    reader = pa.RecordBatchReader.from_batches(schema, batches())
    mode = "overwrite" if os.path.exists(path) else "create"
    lance.write_dataset(reader, path, mode=mode, max_rows_per_file=per_fragment)
    return path


def cached_demo_dataset(rows: int = 300_000) -> str:
    """The demo dataset in the user's cache directory, written on first use."""
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "lanceloader"
    path = cache / f"demo-{rows}.lance"
    if not (path / "_versions").exists():
        cache.mkdir(parents=True, exist_ok=True)
        write_demo_dataset(path, rows)
    return str(path)
