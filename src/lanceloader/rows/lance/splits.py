"""Splits: assign every row to exactly one named split, deterministically.

A row's split depends only on a 64-bit hash of its key (a key column's value, or its row offset
in the pinned version) and on the split fractions, never on the filter, the order, the number of
ranks or the machine. So ``train`` and ``val`` never overlap, and a row keeps its split when
other rows are appended or filtered out.

Example::

    >>> import numpy as np
    >>> keys = np.arange(1000)
    >>> train = split_mask(keys, {"train": 0.9, "val": 0.1}, "train")
    >>> val = split_mask(keys, {"train": 0.9, "val": 0.1}, "val")
    >>> bool((train ^ val).all()), bool(850 < train.sum() < 950)
    (True, True)
"""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa

from lanceloader.ordering.order import mix64

_SALT = np.uint64(0x5EED5EED5EED5EED)


def check_splits(splits: dict[str, float], split: str) -> None:
    """Raise a clear error for fractions that are not positive or do not sum to 1."""
    if not isinstance(splits, dict) or not splits:
        raise ValueError(f"splits must be a non-empty dict of name -> fraction, got {splits!r}")
    bad = {k: v for k, v in splits.items() if not isinstance(v, (int, float)) or v <= 0}
    if bad:
        raise ValueError(f"split fractions must be positive numbers, got {bad}")
    total = sum(splits.values())
    if abs(total - 1.0) > 1e-6:
        raise ValueError(f"split fractions must sum to 1, got {total} from {splits}")
    if split not in splits:
        raise ValueError(f"split={split!r} is not one of the splits {sorted(splits)}")


def key_hashes(keys: pa.Array | pa.ChunkedArray | np.ndarray) -> np.ndarray:
    """A uint64 hash per key: integers are mixed directly, anything else is hashed by its bytes."""
    if isinstance(keys, (pa.Array, pa.ChunkedArray)):
        if pa.types.is_integer(keys.type) and keys.null_count == 0:
            keys = keys.to_numpy()
        else:
            keys = [_bytes_hash(v) for v in keys.to_pylist()]
    return mix64(np.asarray(keys).astype(np.uint64) ^ _SALT)


def split_mask(
    keys: pa.Array | pa.ChunkedArray | np.ndarray, splits: dict[str, float], split: str
) -> np.ndarray:
    """Boolean mask of the keys that belong to ``split``."""
    check_splits(splits, split)
    # Top 53 bits of the hash as a float in [0, 1): uniform, and exact in a double.
    u = (key_hashes(keys) >> np.uint64(11)).astype(np.float64) / float(1 << 53)
    names = list(splits)
    edges = np.cumsum([splits[name] for name in names])
    edges[-1] = 1.0
    index = names.index(split)
    lo = 0.0 if index == 0 else edges[index - 1]
    return (u >= lo) & (u < edges[index])


def _bytes_hash(value: object) -> int:
    data = value if isinstance(value, bytes) else repr(value).encode()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")
