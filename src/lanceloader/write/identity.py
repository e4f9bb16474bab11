"""What makes two transforms the same: :func:`transform_identity`, which ``materialize``
records in a copy's lineage and compares before it resumes an unfinished run (a rerun with
another transform would mix rows transformed two ways), and :func:`identify`, which also says
where the identity cannot be sure (then a resume is refused rather than risked).

>>> transform_identity(len)[0], len(transform_identity(len)[1])
('len', 24)
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import sys
import types
from typing import Any

import numpy as np

from lanceloader.batch.transforms import Compose, MapRows, transform_name

_PLAIN = (type(None), bool, int, float, complex, str, bytes)
IDENTITY_DEPTH = 12  # deeper than this, the identity is not sure
IDENTITY_NODES = 200_000  # values looked at, at most (then: not sure)
LIBRARY_FOLDERS = ("site-packages", "dist-packages")
_CLASS_SKIP = frozenset(  # a class's attributes that are not its behaviour (or are caches)
    {
        "__dict__",
        "__weakref__",
        "__module__",
        "__doc__",
        "__qualname__",
        "__slotnames__",
        "__firstlineno__",
        "__static_attributes__",
        "__abstractmethods__",
        "_abc_impl",
    }
)
_DESCRIPTORS = (
    types.MemberDescriptorType,
    types.GetSetDescriptorType,
    types.WrapperDescriptorType,
    types.MethodDescriptorType,
    types.MethodWrapperType,
    types.ClassMethodDescriptorType,
)


@dataclasses.dataclass(frozen=True)
class Identity:
    """A transform for people (``description``), its value as a hash (``identity``), and
    ``doubts``: each place the value could not be read (then two runs cannot be told the same:
    ``materialize`` refuses to resume), ``""`` where there is none."""

    description: str
    identity: str
    doubts: tuple[str, ...]


def transform_identity(transform: Any) -> tuple[str, str]:
    """``(description, identity)`` of ``transform``: a readable description with its parameters
    and a hash of its value (see :func:`identify` for what counts).

    >>> import lanceloader as ll
    >>> a = transform_identity(ll.decode_images("image", dtype="float32", mean=[0.5] * 3))
    >>> b = transform_identity(ll.decode_images("image", dtype="float32", mean=[0.0] * 3))
    >>> a[1] != b[1], "mean=(0.5, 0.5, 0.5)" in a[0]
    (True, True)
    """
    found = identify(transform)
    return found.description, found.identity


def identify(transform: Any) -> Identity:
    """The :class:`Identity` of ``transform``. Two transforms are the same when their values
    are equal, compared recursively:

    * lists, tuples, dicts and sets by their items (wherever they are: a list in a closure or a
      module global counts by its items, so a counter that has grown makes another transform),
      NumPy arrays by their bytes;
    * an object by its class and its state (what pickle saves: ``__reduce_ex__``); a class of
      yours (not of the standard library, an installed package or lanceloader) also by its
      methods' code and its class attributes;
    * a function by its module, name, code (not its line numbers), defaults, closure and every
      module global it reads (values, lists, arrays, objects, the functions it calls, and the
      attributes it reads from a module of yours, such as ``config.K``); a bound method by its
      function and its object; a ``functools.partial`` by its function and arguments;
    * a function, class or module of the standard library, an installed package or
      lanceloader by its name (a library's code counts by its version, not read here), and a
      function of such a library made by a factory also by its closure and defaults.

    What cannot be read (an object pickle refuses, such as a lock or an open file; nesting
    deeper than ``IDENTITY_DEPTH``; more than ``IDENTITY_NODES`` values) is a doubt. What a
    transform reads from the environment, files or the network does not count.
    """
    walk = _Walk()
    value = walk.value(transform, 0, "transform")
    identity = hashlib.blake2b(repr(value).encode(), digest_size=12).hexdigest()
    return Identity(_describe(transform), identity, tuple(walk.doubts))


def is_library(module_name: str | None) -> bool:
    """Whether the module ``module_name`` belongs to the standard library, an installed
    package or lanceloader (counted by name), rather than to the user (counted by value).

    >>> is_library("numpy.random"), is_library("os.path"), is_library("__main__")
    (True, True, False)
    """
    if not module_name or module_name == "__main__":  # a script, a notebook: the user's
        return False
    top = module_name.partition(".")[0]
    if top in sys.stdlib_module_names or top in ("builtins", "lanceloader"):
        return True
    file = getattr(sys.modules.get(module_name), "__file__", None)
    return file is not None and any(part in LIBRARY_FOLDERS for part in file.split(os.sep))


def _qualified(kind: Any) -> str:
    return f"{getattr(kind, '__module__', '?')}.{getattr(kind, '__qualname__', kind)}"


class _Walk:
    """One walk over a transform's value: what it saw (cycles), how much, and its doubts."""

    def __init__(self) -> None:
        self.doubts: list[str] = []
        self.nodes = 0
        self.open: set[int] = set()  # the values being walked (a cycle refers to one)

    def doubt(self, where: str, why: str) -> tuple[str, str]:
        if len(self.doubts) < 10:
            self.doubts.append(f"{where}: {why}")
        return ("unsure", where)

    def value(self, obj: Any, depth: int, where: str) -> Any:
        """``obj`` as nested tuples of plain values."""
        if isinstance(obj, _PLAIN):
            return obj
        self.nodes += 1
        if self.nodes > IDENTITY_NODES:
            return self.doubt(where, f"more than {IDENTITY_NODES:,} values to compare")
        if depth > IDENTITY_DEPTH:
            return self.doubt(where, f"nested deeper than {IDENTITY_DEPTH} levels")
        if id(obj) in self.open:
            return ("cycle", _qualified(type(obj)))
        self.open.add(id(obj))
        try:
            return self._value(obj, depth + 1, where)
        finally:
            self.open.discard(id(obj))

    def items(self, values: Any, depth: int, where: str) -> tuple[Any, ...]:
        return tuple(self.value(v, depth, f"{where}[{i}]") for i, v in enumerate(values))

    def _value(self, obj: Any, depth: int, where: str) -> Any:
        if isinstance(obj, list | tuple):
            return (type(obj).__name__, self.items(obj, depth, where))
        if isinstance(obj, dict):
            pairs = ((repr(k), self.value(v, depth, f"{where}[{k!r}]")) for k, v in obj.items())
            return ("dict", tuple(sorted(pairs, key=lambda kv: kv[0])))
        if isinstance(obj, set | frozenset):
            members = sorted(repr(self.value(x, depth, f"{where}{{}}")) for x in obj)
            return (type(obj).__name__, tuple(members))
        if isinstance(obj, np.ndarray | np.generic) and np.asarray(obj).dtype.hasobject:
            array = np.asarray(obj)  # its bytes are pointers: count its items
            return (
                "ndarray",
                str(array.dtype),
                array.shape,
                self.items(array.ravel(), depth, where),
            )
        if isinstance(obj, np.ndarray | np.generic):
            array = np.ascontiguousarray(obj)
            digest = hashlib.blake2b(array.tobytes(), digest_size=12).hexdigest()
            return ("ndarray", str(array.dtype), array.shape, digest)
        if isinstance(obj, types.FunctionType):
            return self.function(obj, depth, where)
        if isinstance(obj, types.MethodType):
            return (
                "method",
                self.value(obj.__func__, depth, where),
                self.value(obj.__self__, depth, f"{where}.__self__"),
            )
        if isinstance(obj, types.BuiltinFunctionType):
            owner = obj.__self__
            if owner is None or isinstance(owner, types.ModuleType):
                return ("named", _qualified(obj))
            return ("builtin method", obj.__name__, self.value(owner, depth, f"{where}.__self__"))
        if isinstance(obj, functools.partial):
            return (
                "partial",
                self.value(obj.func, depth, f"{where}.func"),
                self.value(obj.args, depth, f"{where}.args"),
                self.value(obj.keywords, depth, f"{where}.keywords"),
            )
        if isinstance(obj, types.ModuleType):
            return ("module", obj.__name__)
        if isinstance(obj, type):
            return self.kind(obj, depth, where)
        if isinstance(obj, staticmethod | classmethod):
            return (type(obj).__name__, self.value(obj.__func__, depth, where))
        if isinstance(obj, property):
            return ("property", self.items((obj.fget, obj.fset, obj.fdel), depth, where))
        if isinstance(obj, _DESCRIPTORS):  # slots, slot wrappers, method descriptors
            return ("named", _qualified(obj))
        return self.instance(obj, depth, where)

    def instance(self, obj: Any, depth: int, where: str) -> Any:
        """An object: its class and what pickle would save of it."""
        try:
            reduced = obj.__reduce_ex__(4)
        except Exception as exc:
            return self.doubt(where, f"a {_qualified(type(obj))} that cannot be read ({exc})")
        if isinstance(reduced, str):  # a global, saved by its name
            return ("global", _qualified(type(obj)), reduced)
        parts = list(reduced) + [None] * (5 - len(reduced))
        for i in (3, 4):  # list and dict items: iterators
            parts[i] = None if parts[i] is None else list(parts[i])
        state = self.items(parts, depth, where)
        return ("object", self.value(type(obj), depth, f"{where}.__class__"), state)

    def kind(self, cls: type, depth: int, where: str) -> Any:
        """A class: by name; one of the user's also by its own attributes (methods' code,
        class attributes), and those of its user-defined bases."""
        if is_library(getattr(cls, "__module__", None)):
            return ("named", _qualified(cls))
        own = tuple(
            (
                _qualified(base),
                tuple(
                    (name, self.value(attribute, depth, f"{_qualified(base)}.{name}"))
                    for name, attribute in sorted(vars(base).items())
                    if name not in _CLASS_SKIP
                ),
            )
            for base in cls.__mro__
            if not is_library(getattr(base, "__module__", None))
        )
        return ("class", _qualified(cls), own)

    def function(self, fn: types.FunctionType, depth: int, where: str) -> Any:
        name = fn.__qualname__
        closure = tuple(
            (var, self.value(_cell(cell), depth, f"{name}: closure {var!r}"))
            for var, cell in zip(fn.__code__.co_freevars, fn.__closure__ or (), strict=True)
        )
        defaults = (
            self.value(fn.__defaults__, depth, f"{name}: defaults"),
            self.value(fn.__kwdefaults__, depth, f"{name}: keyword defaults"),
        )
        if is_library(fn.__module__):  # by name, and what a factory gave it
            return ("library function", fn.__module__, name, defaults, closure)
        names = _names(fn.__code__)
        read = tuple(
            (var, self.global_value(fn.__globals__[var], names, depth, f"{name}: global {var!r}"))
            for var in sorted(names)
            if var in fn.__globals__
        )
        return ("function", fn.__module__, name, _code(fn.__code__), defaults, closure, read)

    def global_value(self, value: Any, names: set[str], depth: int, where: str) -> Any:
        """A module global a function reads; of a module of the user's, also the attributes
        the function names (``config.K``)."""
        if not isinstance(value, types.ModuleType) or is_library(value.__name__):
            return self.value(value, depth, where)
        read = tuple(
            (attr, self.value(getattr(value, attr), depth, f"{where}.{attr}"))
            for attr in sorted(names)
            if hasattr(value, attr) and not attr.startswith("__")
        )
        return ("module", value.__name__, read)


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
    """The global and attribute names a code object (and those inside it) reads."""
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
