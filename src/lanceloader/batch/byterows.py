"""Binary columns as one buffer plus offsets: :class:`ByteRows` (what ``binary``,
``large_binary``, ``binary_view``, ``fixed_size_binary`` and Lance blob columns become for
``output="numpy"``, ``"torch"`` and ``"jax"``) and :func:`byte_rows`, which views an Arrow
array's buffers as one without a copy.

>>> byte_rows(pa.array([b"ab", b"cde"])).offsets.tolist()
[0, 2, 5]
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa


@dataclass(frozen=True, eq=False, slots=True)
class ByteRows:
    """The rows of a binary column as one contiguous ``uint8`` buffer plus ``int64`` offsets:
    row ``i`` is ``data[offsets[i]:offsets[i + 1]]``. What a binary column (``binary``,
    ``large_binary``, ``binary_view``, ``fixed_size_binary``, Lance blobs) becomes for
    ``output="numpy"``, ``"torch"`` and ``"jax"``: no Python object per row; ``data`` views
    Arrow's buffer without a copy where the column has no nulls.

    It reads like the list of ``bytes`` it replaces: ``len()``, ``rows[i]`` (a ``bytes`` copy
    of row ``i``; ``rows.view(i)`` is the zero-copy ``uint8`` array), iteration, ``rows[a:b]``
    (a ``ByteRows`` viewing the same buffer) and ``==`` with a list of bytes; ``to_list()``
    gives the list. It is not a ``list`` (``isinstance(rows, list)`` is False) and not a
    registered ``Sequence``, so torch's collate functions pass it through whole. It pickles as
    its two arrays (the rows' bytes only, never the rest of a buffer it views), and process
    workers send both through shared memory like any array.

    Invariants, checked when it is built from two arrays: ``data`` is 1-D ``uint8``,
    ``offsets`` 1-D ``int64`` of ``len(rows) + 1`` values, non-decreasing, from 0 to
    ``len(data)``.

    >>> rows = ByteRows.from_list([b"ab", b"", b"cde"])
    >>> len(rows), rows[2], rows.offsets.tolist(), rows == [b"ab", b"", b"cde"]
    (3, b'cde', [0, 2, 2, 5], True)
    >>> rows[1:].to_list(), bytes(rows.view(0))
    ([b'', b'cde'], b'ab')
    >>> ByteRows(np.zeros(3, np.uint8), np.array([0, 2]))
    Traceback (most recent call last):
    ...
    ValueError: ByteRows offsets must end at len(data) = 3, got 2; build it with ByteRows.from_list(rows) or pass the buffer the offsets index
    """

    data: np.ndarray
    offsets: np.ndarray

    def __post_init__(self) -> None:
        # Anything but two arrays is kept as given: a transport (engine/transport.py) rebuilds
        # a ByteRows from placeholders before it puts the arrays back.
        if isinstance(self.data, np.ndarray) and isinstance(self.offsets, np.ndarray):
            _check_byte_rows(self.data, self.offsets)

    @classmethod
    def from_list(cls, rows: Iterable[bytes | bytearray | memoryview]) -> ByteRows:
        """``rows`` (bytes-like values) copied into one buffer.

        >>> ByteRows.from_list([b"x", bytearray(b"yz")]).to_list()
        [b'x', b'yz']
        """
        parts = [bytes(r) for r in rows]
        offsets = np.zeros(len(parts) + 1, np.int64)
        np.cumsum([len(p) for p in parts], out=offsets[1:])
        return _byte_rows(np.frombuffer(b"".join(parts), np.uint8), offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step != 1:
                return ByteRows.from_list(self[i] for i in range(start, stop, step))
            stop = max(start, stop)
            lo, hi = int(self.offsets[start]), int(self.offsets[stop])
            return _byte_rows(self.data[lo:hi], self.offsets[start : stop + 1] - lo)
        return self.view(index).tobytes()

    def view(self, index: int) -> np.ndarray:
        """Row ``index`` as a ``uint8`` array viewing ``data`` (no copy).

        >>> ByteRows.from_list([b"ab"]).view(-1).tolist()
        [97, 98]
        """
        i = operator.index(index)
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"row {index} of a ByteRows of {n} rows")
        i %= n
        return self.data[self.offsets[i] : self.offsets[i + 1]]

    def __iter__(self) -> Iterator[bytes]:
        data = self.data
        for lo, hi in itertools.pairwise(self.offsets.tolist()):
            yield data[lo:hi].tobytes()

    def to_list(self) -> list[bytes]:
        """The rows as a list of ``bytes`` (one copy each): what ``Conversion(binary="list")``
        gives."""
        return list(self)

    @property
    def lengths(self) -> np.ndarray:
        """Each row's length in bytes, ``int64``."""
        return np.diff(self.offsets)

    @property
    def nbytes(self) -> int:
        """The bytes this holds: the rows' bytes plus the offsets."""
        return int(self.data.nbytes + self.offsets.nbytes)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ByteRows):
            return bool(
                np.array_equal(self.offsets, other.offsets)
                and np.array_equal(self.data, other.data)
            )
        if isinstance(other, list | tuple):
            return len(other) == len(self) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable buffers, like a list

    def __repr__(self) -> str:
        return f"ByteRows({len(self)} rows, {len(self.data):,} bytes)"


def _check_byte_rows(data: np.ndarray, offsets: np.ndarray) -> None:
    fix = "build it with ByteRows.from_list(rows) or pass the buffer the offsets index"
    if data.ndim != 1 or data.dtype != np.uint8:
        raise ValueError(
            f"ByteRows data must be a 1-D uint8 array, got {data.dtype} with shape "
            f"{data.shape}; view it with data.reshape(-1).view(np.uint8)"
        )
    if offsets.ndim != 1 or offsets.dtype != np.int64 or len(offsets) < 1:
        raise ValueError(
            f"ByteRows offsets must be a 1-D int64 array of rows + 1 values, got "
            f"{offsets.dtype} with shape {offsets.shape}; {fix}"
        )
    if offsets[0] != 0 or offsets[-1] != len(data):
        end = "start at 0" if offsets[0] != 0 else f"end at len(data) = {len(data)}"
        got = offsets[0] if offsets[0] != 0 else offsets[-1]
        raise ValueError(f"ByteRows offsets must {end}, got {got}; {fix}")
    if len(offsets) > 1 and (np.diff(offsets) < 0).any():
        raise ValueError(f"ByteRows offsets must not decrease; {fix}")


def _byte_rows(data: np.ndarray, offsets: np.ndarray) -> ByteRows:
    """A :class:`ByteRows` of arrays known to keep its invariants (no check: per batch)."""
    rows = object.__new__(ByteRows)
    object.__setattr__(rows, "data", data)
    object.__setattr__(rows, "offsets", offsets)
    return rows


def byte_rows(arr: pa.Array) -> ByteRows:
    """A binary array without nulls (of any binary type) as :class:`ByteRows`, viewing its data
    buffer (no copy; ``binary_view`` is cast to ``large_binary`` first, one copy in Arrow).
    The offsets are copied to ``int64`` from 0 unless they already are (``large_binary`` from
    the buffer's start). Nulls are the caller's: they must be filled or refused before.

    >>> byte_rows(pa.array([b"ab", b"c", b"def"]).slice(1)).to_list()
    [b'c', b'def']
    >>> byte_rows(pa.array([b"ab", b"cd"], pa.binary(2))).offsets.tolist()
    [0, 2, 4]
    """
    if arr.null_count:
        raise ValueError(
            f"byte_rows takes arrays without nulls, got {arr.null_count}; fill "
            "them first (pyarrow.compute.fill_null)"
        )
    n = len(arr)
    if pa.types.is_fixed_size_binary(arr.type):
        width = arr.type.byte_width
        buffer = arr.buffers()[1]
        data = (
            np.frombuffer(buffer, np.uint8, n * width, arr.offset * width)
            if n and width
            else np.empty(0, np.uint8)
        )
        return _byte_rows(data, np.arange(n + 1, dtype=np.int64) * width)
    if not (pa.types.is_binary(arr.type) or pa.types.is_large_binary(arr.type)):
        arr = arr.cast(pa.large_binary())  # binary_view: no one buffer to view
    buffers = arr.buffers()
    wide = pa.types.is_large_binary(arr.type)
    if n == 0 or buffers[1] is None:
        return _byte_rows(np.empty(0, np.uint8), np.zeros(n + 1, np.int64))
    offsets = np.frombuffer(
        buffers[1], np.int64 if wide else np.int32, n + 1, arr.offset * (8 if wide else 4)
    )
    first, last = int(offsets[0]), int(offsets[-1])
    data = (
        np.frombuffer(buffers[2], np.uint8, last - first, first)
        if last > first
        else np.empty(0, np.uint8)
    )
    if not wide or first:
        offsets = offsets.astype(np.int64) - first if first else offsets.astype(np.int64)
    return _byte_rows(data, offsets)


def without_views(arr: pa.Array) -> pa.Array:
    """``binary_view``/``string_view`` as ``large_binary``/``large_string`` (one copy); other
    arrays as they are."""
    t = pa.types
    if hasattr(t, "is_binary_view") and t.is_binary_view(arr.type):
        return arr.cast(pa.large_binary())
    if hasattr(t, "is_string_view") and t.is_string_view(arr.type):
        return arr.cast(pa.large_string())
    return arr


def is_binary(typ: pa.DataType) -> bool:
    t = pa.types
    return (
        t.is_binary(typ)
        or t.is_large_binary(typ)
        or t.is_fixed_size_binary(typ)
        or (hasattr(t, "is_binary_view") and t.is_binary_view(typ))
    )
