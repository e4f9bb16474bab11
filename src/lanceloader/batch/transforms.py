"""Transforms: functions of a batch that run in the worker pool, before the output conversion.

A transform takes a ``pyarrow.RecordBatch`` and returns one, which the worker then converts to the
loader's output (``conversion.py``); anything else it returns is passed through. The ready-made ones
here return Arrow, so they chain with :func:`compose` and feed every output format, zero-copy:

* :func:`map_rows` lifts ``fn(row: dict) -> dict`` to a batch transform;
* :func:`~lanceloader.batch.images.decode_images` (``images.py``) turns JPEG/PNG bytes into one
  ``[N, H, W, C]`` tensor column;
* :func:`~lanceloader.batch.text.tokenize` (``text.py``) turns text into ``input_ids`` (+
  ``attention_mask``) with a ``tokenizers`` tokenizer, padded or ragged.

Errors. Transforms are deterministic functions of their batch and hold no state, so any worker may
run them. :func:`apply_transform` runs one under an error policy: ``"raise"`` (the default) lets the
first error out; ``"skip"`` drops the rows that failed in a row-aware transform (the ones above,
or any :class:`BatchTransform`) and counts them, so a few corrupt images do not stop training; a
function ``on_error(exc, row)`` is told about each failed row, which is then skipped. The skip
budget is per batch: when more than ``max_skip_fraction`` of a batch's rows fail, the data or the
function is broken, and :class:`TooManyRowErrors` stops the loader with the first error chained.
Errors raised by a plain function of the whole batch always propagate: no row is to blame.

Example::

    >>> import pyarrow as pa
    >>> double = map_rows(lambda row: {"x": row["x"] * 2})
    >>> as_transform([double, double])(pa.record_batch({"x": [1, 2]})).to_pydict()
    {'x': [4, 8]}
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

from lanceloader.batch.row_keys import keys_if_set

Transform = Callable[[Any], Any]
OnError = str | Callable[[BaseException, Mapping[str, Any]], None]
DEFAULT_MAX_SKIP_FRACTION = 0.5


class TooManyRowErrors(RuntimeError):
    """More rows of one batch failed than the skip budget allows."""


class TransformOutputError(ValueError):
    """A transform returned something that is not a whole batch: ``None``, another number of
    rows than it was given (rows are dropped with ``on_error="skip"``, which keeps the counts
    exact), or columns of unequal length."""


@dataclass
class ErrorPolicy:
    """What a row-aware transform does with a row that failed; counts the rows it skips.

    >>> policy = ErrorPolicy("skip", rows=4)
    >>> policy.row_failed(ValueError("bad"), 2, lambda: {}, "demo"); policy.skipped
    1
    """

    on_error: OnError = "raise"
    rows: int = 0
    max_skip_fraction: float = DEFAULT_MAX_SKIP_FRACTION
    skipped: int = 0
    first_error: BaseException | None = field(default=None, repr=False)
    skipped_rows: list[int] = field(default_factory=list, repr=False)  # indices, in order

    def __post_init__(self) -> None:
        check_on_error(self.on_error, self.max_skip_fraction)

    def row_failed(
        self, exc: Exception, index: int, row: Callable[[], Mapping[str, Any]], source: str
    ) -> None:
        """Re-raise ``exc`` (policy ``"raise"``) or count row ``index`` as skipped."""
        if self.on_error == "raise":
            _add_note(exc, f"lanceloader: {source} failed on row {index} of the batch")
            raise exc
        if callable(self.on_error):
            self.on_error(exc, row())
        self.skipped += 1
        self.skipped_rows.append(index)
        self.first_error = self.first_error or exc
        budget = int(self.max_skip_fraction * self.rows)
        if self.skipped > budget:
            raise TooManyRowErrors(
                f"{self.skipped} of {self.rows} rows of this batch failed (the last in {source}), "
                f"over the skip budget of max_skip_fraction={self.max_skip_fraction} "
                f"({budget} rows); fix the data or the function, or raise max_skip_fraction "
                f"(1.0 never stops). First error: {self.first_error!r}"
            ) from self.first_error


class Applied(NamedTuple):
    """What :func:`apply_transform` returns: the transformed batch and the rows it skipped."""

    batch: Any
    skipped: int


class BatchTransform(ABC):
    """A transform that knows rows: it reports each failed row to an :class:`ErrorPolicy`.

    Calling it runs it with the ``"raise"`` policy; :func:`apply_transform` chooses another.
    """

    def __call__(self, batch: pa.RecordBatch) -> Any:
        return self.apply(batch, ErrorPolicy("raise", rows=_num_rows(batch)))

    @abstractmethod
    def apply(self, batch: pa.RecordBatch, errors: ErrorPolicy) -> Any:
        """``batch`` transformed; a row that fails goes to ``errors.row_failed``."""


def check_on_error(on_error: OnError, max_skip_fraction: float = DEFAULT_MAX_SKIP_FRACTION) -> None:
    """Validate an error policy, e.g. in a constructor, before any worker starts.

    >>> check_on_error("ignore")
    Traceback (most recent call last):
    ...
    ValueError: on_error must be 'raise', 'skip' or a function on_error(exc, row), got 'ignore'
    """
    if not (on_error in ("raise", "skip") or callable(on_error)):
        raise ValueError(
            f"on_error must be 'raise', 'skip' or a function on_error(exc, row), got {on_error!r}"
        )
    if isinstance(max_skip_fraction, bool) or not isinstance(max_skip_fraction, int | float):
        raise TypeError(f"max_skip_fraction must be a number, got {max_skip_fraction!r}")
    if not 0.0 <= max_skip_fraction <= 1.0:
        raise ValueError(
            f"max_skip_fraction must lie in [0, 1] (the share of a batch's rows that may be "
            f"skipped), got {max_skip_fraction}"
        )


def apply_transform(
    transform: Transform | None,
    batch: Any,
    on_error: OnError = "raise",
    *,
    max_skip_fraction: float = DEFAULT_MAX_SKIP_FRACTION,
) -> Applied:
    """Run ``transform`` on ``batch`` under an error policy; returns the result and rows skipped.

    >>> bad = map_rows(lambda row: {"x": 10 // row["x"]})
    >>> result, skipped = apply_transform(bad, pa.record_batch({"x": [1, 0, 5]}), "skip")
    >>> result.column("x").to_pylist(), skipped
    ([10, 2], 1)
    """
    if transform is None:
        return Applied(batch, 0)
    errors = ErrorPolicy(on_error, rows=_num_rows(batch), max_skip_fraction=max_skip_fraction)
    if isinstance(transform, BatchTransform):
        result = Applied(transform.apply(batch, errors), errors.skipped)
    else:
        result = Applied(transform(batch), 0)
    if isinstance(batch, pa.RecordBatch | pa.Table):
        check_output_rows(
            transform, result.batch, batch.num_rows - result.skipped, batch.schema.names
        )
    return result


def check_output_rows(
    transform: Transform, result: Any, expected: int, columns: Sequence[str] = ()
) -> None:
    """Raise :class:`TransformOutputError` unless ``result`` keeps the batch's ``expected``
    rows: a RecordBatch or Table by ``num_rows``; an array or tensor by its first dimension; a
    dict by the lengths of its entries named like the input's ``columns`` (all must agree), or,
    without such entries, of its arrays and lists when they all agree (other entries, e.g. an
    image size or class weights, are not rows). Other results (the user's own format) pass.

    A transform that changes the number of rows on purpose (packing sequences, multi-crop) says
    so with an attribute ``changes_rows = True``.

    >>> check_output_rows(len, {"x": [1, 2], "y": [3]}, 2, columns=["x", "y"])
    Traceback (most recent call last):
    ...
    lanceloader.batch.transforms.TransformOutputError: transform len returned columns of unequal length: {'x': 2, 'y': 1}; every column needs one value per row
    >>> check_output_rows(len, {"x": [1, 2], "size": (224, 224), "weights": [1, 1, 1]}, 2, ["x"])
    """
    if _changes_rows(transform):
        return
    name = transform_name(transform)
    if result is None:
        raise TransformOutputError(
            f"transform {name} returned None instead of a batch; return the batch it was given "
            "(or a new one) from the function"
        )
    if isinstance(result, Mapping):
        named = {k: n for k, v in result.items() if k in columns and (n := _length(v)) is not None}
        if len(set(named.values())) > 1:
            raise TransformOutputError(
                f"transform {name} returned columns of unequal length: {named}; every column "
                "needs one value per row"
            )
        others = {
            n
            for k, v in result.items()
            if k not in columns and not isinstance(v, tuple) and (n := _length(v)) is not None
        }
        rows = (
            next(iter(named.values()))
            if named
            else next(iter(others))
            if len(others) == 1
            else None
        )
    elif isinstance(result, pa.RecordBatch | pa.Table):
        rows = result.num_rows
    else:
        rows = _length(result) if hasattr(result, "shape") else None
    if rows is not None and rows != expected:
        raise TransformOutputError(
            f"transform {name} returned {rows} rows for a batch of {expected}; a transform must "
            "keep every row (so that batch sizes and stats stay exact): to drop rows that fail, "
            "raise in a row-aware transform (ll.map_rows, ...) with on_error='skip'; a transform "
            "that changes the row count on purpose sets the attribute changes_rows = True"
        )


def _changes_rows(transform: Transform) -> bool:
    if isinstance(transform, Compose):
        return any(_changes_rows(t) for t in transform.stages)
    return bool(getattr(transform, "changes_rows", False))


def _length(value: Any) -> int | None:
    """Rows of a column: the first dimension of an array or tensor, the length of a list or an
    Arrow array; None for scalars and strings."""
    shape = getattr(value, "shape", None)
    if shape is not None:
        return int(shape[0]) if len(shape) else None
    if isinstance(value, list | tuple | pa.Array | pa.ChunkedArray):
        return len(value)
    return None


def transform_name(transform: Transform) -> str:
    """How messages name ``transform``: its qualified name, with the stages of a composition.

    >>> transform_name(compose(len, map_rows(str)))
    'compose(len, map_rows(str))'
    """
    if isinstance(transform, Compose):
        return "compose(" + ", ".join(transform_name(t) for t in transform.stages) + ")"
    if isinstance(transform, MapRows):
        return f"map_rows({transform_name(transform.fn)})"
    return getattr(transform, "__qualname__", None) or type(transform).__name__


def as_transform(transform: Transform | Sequence[Any] | None) -> Transform | None:
    """``None``, a function, or a (nested) list of functions, as one transform or ``None``.

    >>> as_transform([]) is None, as_transform(len) is len
    (True, True)
    """
    if transform is None:
        return None
    if isinstance(transform, list | tuple):
        composed = compose(*transform)
        return composed if composed.stages else None
    if callable(transform):
        return transform
    raise TypeError(
        f"transform must be a function fn(batch) -> batch, a list of them, or None; got "
        f"{type(transform).__name__}"
    )


@dataclass(frozen=True)
class Compose(BatchTransform):
    """Transforms applied in order; the error policy reaches every row-aware stage."""

    stages: tuple[Transform, ...]

    def apply(self, batch: Any, errors: ErrorPolicy) -> Any:
        keys = keys_if_set()
        for stage in self.stages:
            before = len(errors.skipped_rows)
            batch = (
                stage.apply(batch, errors) if isinstance(stage, BatchTransform) else stage(batch)
            )
            if keys is not None and len(errors.skipped_rows) > before:  # rows left the batch
                keys.drop(errors.skipped_rows[before:])
        return batch


def compose(*transforms: Transform | Sequence[Any] | None) -> Compose:
    """One transform that applies ``transforms`` left to right (lists are flattened, None skipped).

    >>> compose(lambda b: b + 1, [lambda b: b * 10])(1)
    20
    """
    stages: list[Transform] = []
    for i, t in enumerate(transforms):
        if t is None:
            continue
        if isinstance(t, Compose):
            stages.extend(t.stages)
        elif isinstance(t, list | tuple):
            stages.extend(compose(*t).stages)
        elif callable(t):
            stages.append(t)
        else:
            raise TypeError(
                f"compose: stage {i} is a {type(t).__name__}, not callable; pass functions "
                "fn(batch) -> batch, or lists of them"
            )
    return Compose(tuple(stages))


# --- rows --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MapRows(BatchTransform):
    """``fn`` applied to each row (a dict); see :func:`map_rows`."""

    fn: Callable[[dict[str, Any]], Mapping[str, Any]]

    def apply(self, batch: pa.RecordBatch, errors: ErrorPolicy) -> pa.RecordBatch:
        source = f"map_rows({getattr(self.fn, '__name__', type(self.fn).__name__)})"
        return rows_to_batch(
            map_each(batch.to_pylist(), lambda i, row: self.fn(row), errors, source)
        )


def map_each(
    rows: Sequence[dict[str, Any]],
    call: Callable[[int, dict[str, Any]], Any],
    errors: ErrorPolicy,
    source: str,
) -> list[Mapping[str, Any]]:
    """``call(i, row)`` for each row: a row that raises goes to ``errors`` (skipped, or the
    error re-raised); a result that is not a dict is an error naming ``source`` and the row.
    The loop of the per-row transforms (:func:`map_rows`, ``ll.random_map``)."""
    results = []
    for i, row in enumerate(rows):
        try:
            result = call(i, row)
        except Exception as exc:
            errors.row_failed(exc, i, lambda row=row: row, source)
            continue
        if not isinstance(result, Mapping):
            raise TypeError(
                f"{source} must return a dict of column name to value, got "
                f"{type(result).__name__} for row {i}"
            )
        results.append(result)
    return results


def map_rows(fn: Callable[[dict[str, Any]], Mapping[str, Any]]) -> MapRows:
    """A batch transform that calls ``fn(row)`` for each row and assembles the returned dicts.

    Values may be numbers, str, bytes, lists or NumPy arrays; arrays of one shape become a
    tensor column (``[N, *shape]``). With ``on_error="skip"`` rows whose ``fn`` raises are dropped.
    Per-row Python is slow: prefer whole-batch functions where you can. ``fn`` must pickle
    (a module-level function) for process workers.

    >>> out = map_rows(lambda r: {"y": np.full(2, r["x"])})(pa.record_batch({"x": [1, 2]}))
    >>> out.column("y").type, out.column("y").to_pylist()
    (FixedSizeListType(fixed_size_list<item: int64>[2]), [[1, 1], [2, 2]])
    """
    if not callable(fn):
        raise TypeError(f"map_rows needs a function fn(row) -> dict, got {type(fn).__name__}")
    return MapRows(fn)


def rows_to_batch(rows: Sequence[Mapping[str, Any]]) -> pa.RecordBatch:
    """Rows (dicts with the same keys) as one RecordBatch; NumPy arrays of one shape are stacked.

    >>> rows_to_batch([{"a": 1, "b": "x"}, {"a": 2, "b": "y"}]).to_pydict()
    {'a': [1, 2], 'b': ['x', 'y']}
    """
    if not rows:
        return pa.RecordBatch.from_pydict({})
    names = list(rows[0])
    for i, row in enumerate(rows):
        if list(row) != names:
            raise ValueError(
                f"row {i} has keys {list(row)}, row 0 has {names}; return the same keys, in the "
                "same order, for every row"
            )
    arrays = [_arrow_column(name, [row[name] for row in rows]) for name in names]
    return pa.RecordBatch.from_arrays(arrays, names=names)


def _arrow_column(name: str, values: list[Any]) -> pa.Array:
    first = values[0]
    if isinstance(first, np.ndarray) and all(
        isinstance(v, np.ndarray) and v.shape == first.shape and v.dtype == first.dtype
        for v in values
    ):
        return tensor_array(np.stack(values))
    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise TypeError(
            f"column {name!r}: the values returned cannot become Arrow ({exc}); return numbers, "
            "str, bytes, lists, or NumPy arrays of one shape and dtype"
        ) from exc


def tensor_array(array: np.ndarray) -> pa.Array:
    """``[N, ...]`` as an Arrow column without a copy: 1-D values, fixed-size lists, or tensors.

    >>> tensor_array(np.zeros((2, 3, 4), np.uint8)).to_numpy_ndarray().shape
    (2, 3, 4)
    """
    array = np.ascontiguousarray(array)
    if array.ndim == 1:
        return pa.array(array)
    if array.size == 0 and array.shape[0] > 0:  # Arrow has no zero-width fixed-size list
        return pa.array([[]] * array.shape[0], pa.list_(pa.from_numpy_dtype(array.dtype)))
    if array.ndim == 2:
        return pa.FixedSizeListArray.from_arrays(pa.array(array.reshape(-1)), array.shape[1])
    return pa.FixedShapeTensorArray.from_numpy_ndarray(array)


def row_at(batch: pa.RecordBatch, index: int) -> dict[str, Any]:
    """Row ``index`` of ``batch`` as a dict: what an ``on_error`` function is shown."""
    return batch.slice(index, 1).to_pylist()[0]


def check_column(batch: pa.RecordBatch, name: str, kinds: tuple[str, ...], what: str) -> pa.Array:
    """Column ``name`` of ``batch``, which transform ``what`` needs to be one of ``kinds``."""
    if name not in batch.schema.names:
        raise KeyError(f"{what} reads column {name!r}, which the batch lacks: {batch.schema.names}")
    col = batch.column(name)
    if not any(getattr(pa.types, f"is_{k}")(col.type) for k in kinds):
        raise TypeError(f"{what} needs column {name!r} to be {' or '.join(kinds)}, got {col.type}")
    return col


def with_column(batch: pa.RecordBatch, name: str, array: pa.Array) -> pa.RecordBatch:
    """``batch`` with column ``name`` replaced by (or extended with) ``array``."""
    if name in batch.schema.names:
        return batch.set_column(batch.schema.get_field_index(name), name, array)
    return batch.append_column(name, array)


def _num_rows(batch: Any) -> int:
    return batch.num_rows if isinstance(batch, pa.RecordBatch | pa.Table) else 0


def _add_note(exc: BaseException, note: str) -> None:
    if hasattr(exc, "add_note"):  # Python >= 3.11
        exc.add_note(note)
