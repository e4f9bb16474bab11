"""Arguments: checks of user input shared by every public class, each error naming the argument,
the value and the fix.

>>> check_int("batch_size", 0, minimum=1)
Traceback (most recent call last):
...
ValueError: batch_size must be >= 1, got 0
"""

from __future__ import annotations


def check_int(name: str, value: object, minimum: int | None) -> None:
    """``value`` must be an int (not a bool) of at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


def check_numbers(*, batch_size: int, shuffle_block_size: int, seed: int,
                  **optional: int | None) -> None:
    """The integer options of a ``Loader`` or sampler: ``batch_size`` and ``shuffle_block_size``
    >= 1, ``seed`` any int, and each of ``optional`` either None (its default) or >= 1."""
    check_int("batch_size", batch_size, minimum=1)
    check_int("shuffle_block_size", shuffle_block_size, minimum=1)
    check_int("seed", seed, minimum=None)
    for name, value in optional.items():
        if value is not None:
            check_int(name, value, minimum=1)
