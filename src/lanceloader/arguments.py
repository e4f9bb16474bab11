"""Arguments: checks of user input shared by every public class, each error naming the argument,
the value and the fix.

>>> check_int("batch_size", 0, minimum=1)
Traceback (most recent call last):
...
ValueError: batch_size must be >= 1, got 0
>>> check_bool("shuffle", "False")
Traceback (most recent call last):
...
TypeError: shuffle must be True or False, got the str 'False' (a non-empty string is truthy, so 'False' would mean True)
"""

from __future__ import annotations

import importlib.util
import math
import numbers
from collections.abc import Mapping

import numpy as np

# stall_timeout and the like: the waits they bound (threading, multiprocessing) overflow far
# above this; None means no limit.
MAX_SECONDS = 1e6


def check_int(name: str, value: object, minimum: int | None) -> None:
    """``value`` must be an int (not a bool) of at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


def check_bool(name: str, value: object) -> None:
    """``value`` must be ``True`` or ``False`` (NumPy's bool too): ``"False"`` and ``"no"`` are
    truthy strings, and ``1``/``0`` hide mistakes of argument order."""
    if isinstance(value, bool | np.bool_):
        return
    hint = ""
    if isinstance(value, str):
        hint = f" (a non-empty string is truthy, so {value!r} would mean True)"
    raise TypeError(f"{name} must be True or False, got the {type(value).__name__} {value!r}{hint}")


def check_optional_str(name: str, value: object, example: str) -> None:
    """``value`` must be None or a string; ``example`` shows a valid one."""
    if value is not None and not isinstance(value, str):
        raise TypeError(
            f"{name} must be a string such as {example}, or None; got the "
            f"{type(value).__name__} {value!r}"
        )


def check_storage_options(value: object) -> None:
    """``storage_options`` must be None or a mapping of str to str (what Lance accepts)."""
    example = "{'aws_region': 'us-east-1'}"
    if value is None:
        return
    if not isinstance(value, Mapping):
        raise TypeError(
            f"storage_options must be a dict of str to str such as {example}, or "
            f"None; got the {type(value).__name__} {value!r}"
        )
    bad = {k: v for k, v in value.items() if not isinstance(k, str) or not isinstance(v, str)}
    if bad:
        raise TypeError(
            f"storage_options must map str to str (write numbers and booleans as "
            f"strings, e.g. {{'allow_http': 'true'}}); these entries are not: {bad!r}"
        )


def check_seconds(name: str, value: object) -> None:
    """``value`` must be None (no limit) or a positive, finite number of seconds."""
    if value is None:
        return
    if isinstance(value, bool | np.bool_) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"{name} must be a number of seconds or None (no limit), got the "
            f"{type(value).__name__} {value!r}"
        )
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be > 0 seconds (or None for no limit), got {value}")
    if value > MAX_SECONDS:
        raise ValueError(
            f"{name}={value:g} s is more than {MAX_SECONDS:g} s (11 days); pass None for no limit"
        )


def check_numbers(
    *, batch_size: int, shuffle_block_size: int, seed: int, **optional: int | None
) -> None:
    """The integer options of a ``Loader`` or sampler: ``batch_size`` and ``shuffle_block_size``
    >= 1, ``seed`` any int, and each of ``optional`` either None (its default) or >= 1."""
    check_int("batch_size", batch_size, minimum=1)
    check_int("shuffle_block_size", shuffle_block_size, minimum=1)
    check_int("seed", seed, minimum=None)
    for name, value in optional.items():
        if value is not None:
            check_int(name, value, minimum=1)


# The actor options ``ray_options`` takes (Ray's own names: ``ray.remote``'s options), and the
# default: one CPU per actor.
RAY_OPTIONS = ("num_cpus", "num_gpus", "memory", "resources", "scheduling_strategy", "runtime_env")
DEFAULT_RAY_OPTIONS: dict[str, object] = {"num_cpus": 1}


def check_ray_options(options: object) -> dict[str, object]:
    """The Ray actor options of ``ray_options`` (defaults: one CPU per actor), checked without
    importing Ray.

    >>> check_ray_options({"num_cpus": 2, "scheduling_strategy": "SPREAD"})
    {'num_cpus': 2, 'scheduling_strategy': 'SPREAD'}
    >>> check_ray_options({"cpus": 2})
    Traceback (most recent call last):
    ...
    ValueError: ray_options got 'cpus': it takes num_cpus, num_gpus, memory, resources, scheduling_strategy, runtime_env (Ray's actor options), e.g. ray_options={'num_cpus': 2, 'resources': {'decode': 1}, 'scheduling_strategy': 'SPREAD'}
    """
    if options is None:
        return dict(DEFAULT_RAY_OPTIONS)
    if not isinstance(options, Mapping):
        raise TypeError(
            f"ray_options must be a dict of Ray actor options, got the {type(options).__name__} "
            f"{options!r}"
        )
    unknown = [k for k in options if k not in RAY_OPTIONS]
    if unknown:
        raise ValueError(
            f"ray_options got {', '.join(map(repr, unknown))}: it takes {', '.join(RAY_OPTIONS)} "
            "(Ray's actor options), e.g. ray_options={'num_cpus': 2, 'resources': "
            "{'decode': 1}, 'scheduling_strategy': 'SPREAD'}"
        )
    return {**DEFAULT_RAY_OPTIONS, **options}


def check_ray_workers(num_workers: int | None, ray_options: object) -> None:
    """Ray actors: their number given (they are another machine's cores, which this one cannot
    count), their options Ray's, and Ray installed."""
    check_ray_options(ray_options)
    if num_workers is None:
        raise ValueError(
            "worker_type='ray' needs num_workers= (the number of Ray actors that build "
            "batches, e.g. num_workers=8; each takes ray_options, default {'num_cpus': 1})"
        )
    if importlib.util.find_spec("ray") is None:
        raise ImportError("worker_type='ray' needs Ray: pip install 'ray>=2.40'")
