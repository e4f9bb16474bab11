"""Row hashes: a 64-bit name for each row of a delivered batch, from its contents.

What :func:`lanceloader.check_resume` compares when the rows carry no id column: a batch in any
``output`` (a dict of NumPy arrays, torch or TensorFlow tensors or JAX arrays, an Arrow record
batch or table, Python lists, a tuple) is read back as NumPy columns, and each row hashed over
every column's name, dtype, shape and bytes. The hash is the same in every process and run (no
Python ``hash`` salt), so two runs' rows compare by value.

Example::

    >>> import numpy as np
    >>> batch = {"x": np.arange(6).reshape(3, 2), "label": np.array([1, 0, 1])}
    >>> h = row_hashes(batch_columns(batch))
    >>> same = row_hashes(batch_columns({"x": np.array([[0, 1]]), "label": [1]}))
    >>> len(h), bool(h[0] == same[0]), bool(h[0] == h[2])
    (3, True, False)
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa

_PRIME = np.uint64(0x100000001B3)  # FNV-1a's 64-bit prime: mixes a row's words
_MIX = np.uint64(0xBF58476D1CE4E5B9)  # splitmix64's multiplier
WIDE_ROW_BYTES = 4096  # rows wider than this are hashed one digest a row


def batch_columns(batch: Any) -> dict[str, np.ndarray]:
    """A batch (dict of arrays or tensors, Arrow batch or table, tuple) as NumPy columns."""
    if isinstance(batch, pa.RecordBatch | pa.Table):
        return {n: batch.column(n).to_numpy(zero_copy_only=False) for n in batch.column_names}
    if isinstance(batch, Mapping):
        items = [(str(k), v) for k, v in batch.items()]
    elif isinstance(batch, tuple | list):
        items = [(str(i), v) for i, v in enumerate(batch)]
    else:
        items = [("", batch)]
    return {name: _numpy(value) for name, value in items}


def _numpy(value: Any) -> np.ndarray:
    if isinstance(value, pa.Array | pa.ChunkedArray):
        return value.to_numpy(zero_copy_only=False)
    if hasattr(value, "detach"):  # torch (bfloat16 has no NumPy type: compared as float32)
        value = value.detach().cpu()
        value = value.float() if str(value.dtype) == "torch.bfloat16" else value
    if hasattr(value, "numpy") and not isinstance(value, np.ndarray):  # torch, TensorFlow
        value = value.numpy()
    try:
        return np.asarray(value)
    except ValueError:  # ragged lists
        out = np.empty(len(value), object)
        out[:] = list(value)
        return out


def row_hashes(columns: Mapping[str, np.ndarray]) -> np.ndarray:
    """A 64-bit hash of each row over every column (names, dtypes, shapes and bytes), the same
    in every process and run."""
    n = len(next(iter(columns.values()))) if columns else 0
    h = np.full(n, 0x9E3779B97F4A7C15, np.uint64)
    for name in sorted(columns):
        h = (h ^ _column_hashes(name, columns[name], n)) * _PRIME
    return h


def _column_hashes(name: str, a: np.ndarray, n: int) -> np.ndarray:
    seed = np.uint64(_digest(f"{name}:{a.dtype.str}:{a.shape[1:]}".encode()))
    if n == 0 or a.ndim == 0 or len(a) != n:
        return np.full(n, seed, np.uint64) ^ np.uint64(_digest(repr(a).encode()))
    if a.dtype.kind == "O":
        return np.array([_digest(_canonical(v)) for v in a], np.uint64) ^ seed
    rows = np.ascontiguousarray(a).reshape(n, -1).view(np.uint8).reshape(n, -1)
    if rows.shape[1] > WIDE_ROW_BYTES:  # images: a digest a row beats a (rows x words) product
        return np.array([_digest(r.tobytes()) for r in rows], np.uint64) ^ seed
    words = -(-rows.shape[1] // 8)
    padded = np.zeros((n, words * 8), np.uint8)
    padded[:, : rows.shape[1]] = rows
    # multilinear: each word times its own odd key, summed mod 2^64; then mixed (splitmix64)
    h = (padded.view(np.uint64) * _keys(words)).sum(axis=1, dtype=np.uint64) ^ seed
    h ^= h >> np.uint64(31)
    h *= _MIX
    return h ^ (h >> np.uint64(29))


@functools.cache
def _keys(words: int) -> np.ndarray:
    """Fixed odd 64-bit keys, one per word of a row (the same in every process)."""
    keys = np.random.default_rng(0x5EED).integers(0, 2**64 - 1, words, np.uint64, endpoint=True)
    return keys | np.uint64(1)


def _digest(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def _canonical(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, np.ndarray):
        return f"{value.dtype.str}{value.shape}".encode() + value.tobytes()
    return repr(value).encode()
