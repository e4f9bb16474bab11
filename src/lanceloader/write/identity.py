"""What makes two transforms the same: :func:`transform_identity`, which ``materialize``
records in a copy's lineage and compares before it resumes an unfinished run (a rerun with
another transform would mix rows transformed two ways).

>>> transform_identity(len)[0], len(transform_identity(len)[1])
('len', 24)
"""

from __future__ import annotations

import functools
import hashlib
import types
from typing import Any

import numpy as np

from lanceloader.batch.transforms import Compose, MapRows, transform_name

_PLAIN = (type(None), bool, int, float, complex, str, bytes)
_STATE = (list, dict, set, bytearray)  # a closure's containers: counters, caches (not compared)
IDENTITY_DEPTH = 8  # deeper objects count by their type


def transform_identity(transform: Any) -> tuple[str, str]:
    """``(description, identity)`` of ``transform``: a readable description with its parameters
    and a hash of its value. Two transforms are the same (a materialize resumes) when their
    identities are equal, which is when, compared recursively:

    * an object has the same class and the same state (what pickle saves: ``__getstate__()``,
      by default its attributes), lists, tuples and dicts the same items, NumPy arrays the same
      bytes; a ``functools.partial`` the same function and arguments;
    * a function has the same module, name and code (bytecode, constants, names; not its line
      numbers), defaults, and the same plain values (numbers, strings, bytes, tuples of them,
      functions, objects) in its closure and the module globals it reads. Lists, dicts and
      sets in its closure are its state (counters, caches) and count by type only.

    >>> import lanceloader as ll
    >>> a = transform_identity(ll.decode_images("image", dtype="float32", mean=[0.5] * 3))
    >>> b = transform_identity(ll.decode_images("image", dtype="float32", mean=[0.0] * 3))
    >>> a[1] != b[1], "mean=(0.5, 0.5, 0.5)" in a[0]
    (True, True)
    """
    identity = repr(_value(transform, 0, frozenset()))
    return (_describe(transform), hashlib.blake2b(identity.encode(), digest_size=12).hexdigest())


def _qualified(kind: Any) -> str:
    return f"{getattr(kind, '__module__', '?')}.{getattr(kind, '__qualname__', kind)}"


def _value(obj: Any, depth: int, seen: frozenset[int]) -> Any:
    """``obj`` as nested tuples of plain values (see :func:`transform_identity`)."""
    if isinstance(obj, _PLAIN):
        return obj
    if depth > IDENTITY_DEPTH or id(obj) in seen:
        return ("...", _qualified(type(obj)))
    seen = seen | {id(obj)}
    depth += 1
    if isinstance(obj, list | tuple):
        return (type(obj).__name__, tuple(_value(x, depth, seen) for x in obj))
    if isinstance(obj, dict):
        return (
            "dict",
            tuple(
                sorted(
                    ((repr(k), _value(v, depth, seen)) for k, v in obj.items()),
                    key=lambda kv: kv[0],
                )
            ),
        )
    if isinstance(obj, set | frozenset):
        return (type(obj).__name__, tuple(sorted(repr(_value(x, depth, seen)) for x in obj)))
    if isinstance(obj, np.ndarray | np.generic):
        array = np.ascontiguousarray(obj)
        return (
            "ndarray",
            str(array.dtype),
            array.shape,
            hashlib.blake2b(array.tobytes(), digest_size=12).hexdigest(),
        )
    if isinstance(obj, types.FunctionType):
        return _function_value(obj, depth, seen)
    if isinstance(obj, types.MethodType):
        return ("method", _value(obj.__func__, depth, seen), _value(obj.__self__, depth, seen))
    if isinstance(obj, functools.partial):
        return (
            "partial",
            _value(obj.func, depth, seen),
            _value(obj.args, depth, seen),
            _value(obj.keywords, depth, seen),
        )
    if isinstance(obj, type | types.BuiltinFunctionType | types.ModuleType):
        return ("named", _qualified(obj) if not isinstance(obj, types.ModuleType) else obj.__name__)
    try:
        state = obj.__getstate__()
    except Exception:
        state = None
    return ("object", _qualified(type(obj)), _value(state, depth, seen))


def _function_value(fn: types.FunctionType, depth: int, seen: frozenset[int]) -> Any:
    code = fn.__code__
    closure = tuple(
        ("state", _qualified(type(v))) if isinstance(v, _STATE) else _value(v, depth, seen)
        for v in (_cell(c) for c in fn.__closure__ or ())
    )
    read = tuple(
        (name, _value(fn.__globals__[name], depth, seen))
        for name in sorted(_names(code))
        if name in fn.__globals__ and isinstance(fn.__globals__[name], (*_PLAIN, tuple))
    )
    return (
        "function",
        fn.__module__,
        fn.__qualname__,
        _code(code),
        _value(fn.__defaults__, depth, seen),
        _value(fn.__kwdefaults__, depth, seen),
        closure,
        read,
    )


def _cell(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return None


def _code(code: types.CodeType) -> Any:
    """A code object without its place (file, line numbers)."""
    return (
        code.co_code,
        code.co_names,
        tuple(_code(c) if isinstance(c, types.CodeType) else repr(c) for c in code.co_consts),
    )


def _names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names


def _describe(transform: Any, limit: int = 400) -> str:
    """``transform`` for people: its name and, for an object, its public parameters."""
    if isinstance(transform, Compose):
        text = "compose(" + ", ".join(_describe(t, limit) for t in transform.stages) + ")"
    elif isinstance(transform, MapRows):
        text = f"map_rows({_describe(transform.fn, limit)})"
    elif isinstance(transform, types.FunctionType | types.BuiltinFunctionType | type):
        text = transform_name(transform)
    elif isinstance(transform, functools.partial):
        arguments = [repr(a) for a in transform.args] + [
            f"{k}={v!r}" for k, v in transform.keywords.items()
        ]
        text = f"partial({_describe(transform.func, limit)}, {', '.join(arguments)})"
    else:
        state = getattr(transform, "__dict__", {})
        shown = ", ".join(f"{k}={v!r}" for k, v in state.items() if not k.startswith("_"))
        text = f"{type(transform).__qualname__}({shown})"
    return text if len(text) <= limit else text[:limit] + "..."
