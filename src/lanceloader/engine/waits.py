"""The loop's wait per batch as a histogram (10 buckets per decade from 1 µs to 10⁴ s), and its
percentiles: what ``stats()`` reports as p50/p95/p99 and the metrics exporters as a histogram."""

from __future__ import annotations

import math
from collections.abc import Sequence

WAIT_PER_DECADE = 10
WAIT_EDGES = tuple(1e-6 * 10 ** (i / WAIT_PER_DECADE) for i in range(10 * WAIT_PER_DECADE + 1))
WAIT_KEYS = tuple(f"wait_bucket_{i}" for i in range(len(WAIT_EDGES) + 1))


def wait_bucket(wait_s: float) -> int:
    """The histogram bucket of a wait: bucket ``i`` (1 to 100) holds waits in
    ``[WAIT_EDGES[i - 1], WAIT_EDGES[i])``, bucket 0 those under 1 µs, bucket 101 those of
    10⁴ s and more. One ``log10``: it runs once per batch.

    >>> wait_bucket(1e-7), wait_bucket(1e-3), wait_bucket(1.5e-3), wait_bucket(1e9)
    (0, 31, 32, 101)
    """
    if wait_s < 1e-6:
        return 0
    i = int(_log10(wait_s) * 10.0 + 61.0)
    return i if i < 101 else 101


_log10 = math.log10


def wait_percentile(histogram: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile (0..1) of the waits in a histogram of :func:`wait_bucket` counts,
    interpolated geometrically inside its bucket (within a factor 10^0.1 = 1.26 of the truth);
    ``None`` when it is empty.

    >>> h = [0] * len(WAIT_KEYS)
    >>> for w in (0.001, 0.001, 0.001, 0.1):
    ...     h[wait_bucket(w)] += 1
    >>> round(wait_percentile(h, 0.5), 4), round(wait_percentile(h, 0.99), 3)
    (0.0012, 0.125)
    """
    return wait_percentiles(histogram, (q,))[0]


def wait_percentiles(histogram: Sequence[float], qs: Sequence[float]) -> list[float | None]:
    """:func:`wait_percentile` of each of ``qs`` (ascending), in one pass over the buckets."""
    n = sum(histogram)
    if not n:
        return [None] * len(qs)
    out: list[float | None] = []
    targets = iter(qs)
    q = next(targets, None)
    seen = 0.0
    last = len(WAIT_EDGES)
    for i, count in enumerate(histogram):
        while q is not None and count and seen + count >= q * n:
            if i == 0:
                out.append(WAIT_EDGES[0])
            elif i == last:
                out.append(WAIT_EDGES[-1])
            else:
                lo, hi = WAIT_EDGES[i - 1], WAIT_EDGES[i]
                out.append(lo * (hi / lo) ** ((q * n - seen) / count))
            q = next(targets, None)
        if q is None:
            return out
        seen += count
    return out + [WAIT_EDGES[-1]] * (len(qs) - len(out))
