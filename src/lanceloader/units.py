"""Sizes as people read them, for messages: ``inspect``'s columns and the automatic cache's
choice (``stats().cache``) say bytes the same way."""

from __future__ import annotations


def format_bytes(n: float) -> str:
    """Decimal units: ``format_bytes(256_000) == '256.0 kB'``.

    >>> format_bytes(999), format_bytes(256_000), format_bytes(3.2e9)
    ('999 B', '256.0 kB', '3.2 GB')
    """
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")
