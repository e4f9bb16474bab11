"""What a process worker gets, and how: by value (``cloudpickle``) for what ``__main__``, a
notebook cell, a lambda or a closure defines, by name for what an importable module holds; and
what cannot travel at all (a lock, an open file, a connection) named before any worker starts."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import pickle
import types
from collections.abc import Iterator

import cloudpickle
import xxhash


def dumps(obj: object) -> bytes:
    """``obj`` as bytes a worker (or the consumer) loads with plain ``pickle.loads``: by value
    for what ``__main__`` or a notebook cell defined, lambdas and closures (``cloudpickle``), by
    name for what an importable module holds."""
    return cloudpickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def check_picklable(obj: object, what: str) -> None:
    """Fail before any worker starts if ``obj`` cannot be sent to a worker process.

    Functions and classes reach the workers by value (``cloudpickle``), wherever they were
    defined; what cannot be copied to another process at all (a lock, an open file, a live
    connection or generator) is named here, with where it sits and the fix.

    >>> check_picklable(lambda batch: batch, "transform <lambda>")  # lambdas travel by value
    >>> import threading
    >>> lock = threading.Lock()
    >>> check_picklable(lambda batch: lock and batch, "transform <lambda>")
    Traceback (most recent call last):
    ...
    TypeError: transform <lambda> cannot be sent to worker processes: its global 'lock' (a lock) cannot be pickled (cannot pickle '_thread.lock' object). ...
    """
    try:
        dumps(obj)
    except Exception as exc:
        where, part = unpicklable_part(obj)
        found = f"{where} (a {type(part).__name__})" if where else f"a {type(part).__name__}"
        raise TypeError(
            f"{what} cannot be sent to worker processes: its {found} cannot be pickled ({exc}). "
            "Process workers get a copy of the transform (functions, classes and the globals "
            "they use, by value); what belongs to one process (locks, open files, connections, "
            "generators, clients) cannot be copied: create it inside the transform, on its first "
            "call in each worker, or use worker_type='thread'"
        ) from exc


def unpicklable_part(obj: object, depth: int = 6) -> tuple[str, object]:
    """The innermost part of ``obj`` that cannot be pickled, and where it sits (``"closure
    variable 'log'"``, ``"attribute 'client'"``); ``("", obj)`` when no part alone fails.

    >>> import threading
    >>> class Holder:
    ...     def __init__(self):
    ...         self.lock = threading.Lock()
    >>> unpicklable_part([Holder()])[0]
    "item 0 → attribute 'lock'"
    """
    if depth == 0:
        return "", obj
    for where, part in _parts(obj):
        try:
            dumps(part)
        except Exception:
            inner, innermost = unpicklable_part(part, depth - 1)
            return (f"{where} → {inner}" if inner else where), innermost
    return "", obj


def _parts(obj: object) -> Iterator[tuple[str, object]]:
    """What ``obj`` holds that pickling it pickles: items, attributes, a function's closure
    variables and the globals it uses."""
    if isinstance(obj, list | tuple):
        yield from ((f"item {i}", v) for i, v in enumerate(obj))
    elif isinstance(obj, dict):
        yield from ((f"key {k!r}", v) for k, v in obj.items())
    elif isinstance(obj, types.FunctionType):
        cells = obj.__closure__ or ()
        for name, cell in zip(obj.__code__.co_freevars, cells, strict=True):
            with contextlib.suppress(ValueError):  # an empty cell
                yield f"closure variable {name!r}", cell.cell_contents
        for name in obj.__code__.co_names:
            if name in obj.__globals__:
                yield f"global {name!r}", obj.__globals__[name]
    elif isinstance(obj, functools.partial):
        yield "partial function", obj.func
        yield from ((f"argument {i}", v) for i, v in enumerate(obj.args))
        yield from ((f"argument {k!r}", v) for k, v in obj.keywords.items())
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        yield from ((f"field {f.name!r}", getattr(obj, f.name)) for f in dataclasses.fields(obj))
    elif hasattr(obj, "__dict__") and not isinstance(obj, type | types.ModuleType):
        yield from ((f"attribute {k!r}", v) for k, v in vars(obj).items())


# Arrays at least this large leave a worker's pickle (out of band: Shipment).
OUT_OF_BAND_BYTES = 64 * 1024


@dataclasses.dataclass(frozen=True)
class Shipment:
    """What a process pool gives each worker at start: ``obj`` pickled (:func:`dumps`) with its
    large buffers (NumPy arrays of at least :data:`OUT_OF_BAND_BYTES`: a filter's row list, a
    table of fragments) left out of band, so the pool writes them once into shared memory and
    the bytes sent to each worker stay small whatever the dataset's size
    (:func:`~lanceloader.engine.transport.ship`).

    Two shipments are equal when a worker given one holds what a worker given the other holds:
    the same pickle and buffers of the same bytes (compared by their XXH3-64 digests, taken
    when the shipment is made: an array changed in place since is a different shipment).

    >>> import numpy as np
    >>> rows = np.arange(100_000)
    >>> a, b = Shipment.of({"rows": rows}), Shipment.of({"rows": rows.copy()})
    >>> len(a.data) < 200, len(a.buffers), a == b
    (True, 1, True)
    >>> rows[7] = -1
    >>> a == Shipment.of({"rows": rows})
    False
    """

    data: bytes
    buffers: tuple[pickle.PickleBuffer, ...] = dataclasses.field(compare=False)
    digests: tuple[int, ...]

    @classmethod
    def of(cls, obj: object) -> Shipment:
        buffers: list[pickle.PickleBuffer] = []

        def out_of_band(buffer: pickle.PickleBuffer) -> bool:
            if buffer.raw().nbytes < OUT_OF_BAND_BYTES:
                return True  # in band
            buffers.append(buffer)
            return False

        data = cloudpickle.dumps(obj, protocol=5, buffer_callback=out_of_band)
        digests = tuple(xxhash.xxh3_64_intdigest(b.raw()) for b in buffers)
        return cls(data, tuple(buffers), digests)
