"""Transforms: functions of a batch that run in the worker pool, before the output conversion.

A transform takes a ``pyarrow.RecordBatch`` and returns one, which the worker then converts to the
loader's output (``convert.py``); anything else it returns is passed through. The ready-made ones
here return Arrow, so they chain with :func:`compose` and feed every output format, zero-copy:

* :func:`map_rows` lifts ``fn(row: dict) -> dict`` to a batch transform;
* :func:`decode_images` turns JPEG/PNG bytes into one ``[N, H, W, C]`` tensor column;
* :func:`tokenize` turns text into ``input_ids`` (+ ``attention_mask``) with a ``tokenizers``
  tokenizer, padded or ragged.

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

import io
import itertools
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

Transform = Callable[[Any], Any]
OnError = str | Callable[[BaseException, Mapping[str, Any]], None]
DEFAULT_MAX_SKIP_FRACTION = 0.5


class TooManyRowErrors(RuntimeError):
    """More rows of one batch failed than the skip budget allows."""


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
        return Applied(transform.apply(batch, errors), errors.skipped)
    return Applied(transform(batch), 0)


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
        for stage in self.stages:
            batch = (
                stage.apply(batch, errors) if isinstance(stage, BatchTransform) else stage(batch)
            )
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
        results = []
        for i, row in enumerate(batch.to_pylist()):
            try:
                result = self.fn(row)
            except Exception as exc:
                errors.row_failed(exc, i, lambda row=row: row, source)
                continue
            if not isinstance(result, Mapping):
                raise TypeError(
                    f"{source} must return a dict of column name to value, got "
                    f"{type(result).__name__} for row {i}"
                )
            results.append(result)
        return rows_to_batch(results)


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


def _row(batch: pa.RecordBatch, index: int) -> dict[str, Any]:
    return batch.slice(index, 1).to_pylist()[0]


def _column(batch: pa.RecordBatch, name: str, kinds: tuple[str, ...], what: str) -> pa.Array:
    if name not in batch.schema.names:
        raise KeyError(f"{what} reads column {name!r}, which the batch lacks: {batch.schema.names}")
    col = batch.column(name)
    if not any(getattr(pa.types, f"is_{k}")(col.type) for k in kinds):
        raise TypeError(f"{what} needs column {name!r} to be {' or '.join(kinds)}, got {col.type}")
    return col


def _with_column(batch: pa.RecordBatch, name: str, array: pa.Array) -> pa.RecordBatch:
    if name in batch.schema.names:
        return batch.set_column(batch.schema.get_field_index(name), name, array)
    return batch.append_column(name, array)


# --- images ------------------------------------------------------------------------------------

_CHANNELS = {"RGB": 3, "L": 1}


@dataclass(frozen=True)
class DecodeImages(BatchTransform):
    """JPEG/PNG bytes to one ``[N, H, W, C]`` column; see :func:`decode_images`."""

    column: str
    size: tuple[int, int] | None
    mode: str
    dtype: str
    mean: tuple[float, ...] | None
    std: tuple[float, ...] | None
    backend: str
    output_column: str

    def apply(self, batch: pa.RecordBatch, errors: ErrorPolicy) -> pa.RecordBatch:
        source = f"decode_images({self.column!r})"
        col = _column(batch, self.column, ("binary", "large_binary"), "decode_images")
        out: np.ndarray | None = None
        kept: list[int] = []
        decode = self._decode
        for i, data in enumerate(col.to_pylist()):
            try:
                slot = out[len(kept)] if out is not None else None
                image = decode(data, slot)
                if out is None:
                    out = np.empty((len(col), *image.shape), np.uint8)
                    out[0] = image
                elif image is not slot:  # not decoded in place
                    if image.shape != slot.shape:
                        raise ValueError(
                            f"image is {image.shape[1]}x{image.shape[0]}, the batch's first is "
                            f"{slot.shape[1]}x{slot.shape[0]}; pass size=(H, W) to resize every "
                            "image"
                        )
                    slot[...] = image
                kept.append(i)
            except Exception as exc:
                errors.row_failed(exc, i, lambda i=i: _row(batch, i), source)
        h, w = self.size or (1, 1)
        images = out[: len(kept)] if out is not None else np.empty((0, h, w, _CHANNELS[self.mode]))
        if self.dtype == "float32":
            images = normalise(images, self.mean, self.std)
        rows = batch if len(kept) == batch.num_rows else batch.take(pa.array(kept, pa.int64()))
        return _with_column(
            rows, self.output_column, tensor_array(images.astype(self.dtype, copy=False))
        )

    def _decode(self, data: bytes | None, into: np.ndarray | None) -> np.ndarray:
        """One image as ``[H, W, C]`` uint8; decoded straight into ``into`` where it fits."""
        if data is None:
            raise ValueError(f"column {self.column!r} is null in this row")
        if self.backend != "pil" and data[:3] == b"\xff\xd8\xff":
            try:
                return _decode_simplejpeg(data, self.size, self.mode, into)
            except Exception:
                if self.backend == "simplejpeg":
                    raise
                # A JPEG that libjpeg-turbo's fast path refuses (e.g. CMYK): Pillow may manage.
        return _decode_pil(data, self.size, self.mode)


def decode_images(
    column: str = "image",
    size: int | tuple[int, int] | None = None,
    *,
    mode: str = "RGB",
    dtype: str = "uint8",
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    backend: str = "auto",
    output_column: str | None = None,
) -> DecodeImages:
    """A transform that decodes the encoded images of ``column`` into one tensor column.

    Args:
        column: binary column of JPEG or PNG bytes (anything Pillow opens).
        size: ``(H, W)`` (or one int for a square) to resize to (bilinear); default keep the
            size, which must then be the same for every image of a batch.
        mode: ``"RGB"`` (C=3) or ``"L"`` (grey, C=1); alpha is dropped.
        dtype: ``"uint8"`` (0..255) or ``"float32"``: ``(pixel / 255 - mean) / std`` per channel
            (mean and std in 0..1 units, e.g. ImageNet's 0.485, 0.456, 0.406 / 0.229, 0.224, 0.225).
        backend: ``"auto"`` decodes JPEGs with simplejpeg (measured ~1.8-2x faster than
            Pillow on 128x128 JPEGs, ``benchmarks/transforms.py``) when it is installed, and
            everything else with Pillow; ``"pil"`` or ``"simplejpeg"`` force one.
        output_column: where the ``[N, H, W, C]`` tensor goes; default replaces ``column``.

    A row whose image fails to decode is a row error (``on_error="skip"`` drops it).

    >>> import io, numpy as np; from PIL import Image
    >>> png = io.BytesIO(); Image.new("RGB", (4, 2), (255, 0, 0)).save(png, format="PNG")
    >>> out = decode_images("img")(pa.record_batch({"img": pa.array([png.getvalue()])}))
    >>> out.column("img").to_numpy_ndarray().shape
    (1, 2, 4, 3)
    """
    try:
        import PIL  # noqa: F401
    except ImportError as exc:
        raise ImportError("decode_images needs Pillow: pip install pillow") from exc
    if backend not in ("auto", "pil", "simplejpeg"):
        raise ValueError(f"backend must be 'auto', 'pil' or 'simplejpeg', got {backend!r}")
    if backend == "auto" and _simplejpeg() is None:
        backend = "pil"
    if backend == "simplejpeg" and _simplejpeg() is None:
        raise ImportError("backend='simplejpeg' needs simplejpeg: pip install simplejpeg")
    if mode not in _CHANNELS:
        raise ValueError(f"mode must be 'RGB' or 'L', got {mode!r}")
    if dtype not in ("uint8", "float32"):
        raise ValueError(f"dtype must be 'uint8' or 'float32', got {dtype!r}")
    channels = _CHANNELS[mode]
    stats = {n: _per_channel(n, v, channels) for n, v in (("mean", mean), ("std", std))}
    if dtype == "uint8" and (mean is not None or std is not None):
        raise ValueError("mean and std normalise floats: pass dtype='float32' with them")
    if stats["std"] is not None and 0 in stats["std"]:
        raise ValueError(f"std must not contain 0, got {std!r}")
    return DecodeImages(
        column, _check_size(size), mode, dtype, stats["mean"], stats["std"], backend,
        output_column or column,
    )  # fmt: skip


def normalise(
    images: np.ndarray, mean: Sequence[float] | None = None, std: Sequence[float] | None = None
) -> np.ndarray:
    """uint8 images ``[..., C]`` as float32 ``(pixel / 255 - mean) / std``, in three passes.

    >>> normalise(np.array([[0, 255]], np.uint8)[..., None], [0.5], [0.5]).ravel().tolist()
    [-1.0, 1.0]
    """
    channels = images.shape[-1]
    m = np.asarray(mean if mean is not None else [0.0] * channels, np.float32)
    s = np.asarray(std if std is not None else [1.0] * channels, np.float32)
    out = images.astype(np.float32)
    out *= 1.0 / (255.0 * s)
    out -= m / s
    return out


def _check_size(size: int | tuple[int, int] | None) -> tuple[int, int] | None:
    if size is None:
        return None
    pair = (size, size) if isinstance(size, int) else tuple(size)
    if len(pair) != 2 or not all(
        isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in pair
    ):
        raise ValueError(f"size must be None, an int or (height, width) of ints > 0, got {size!r}")
    return (pair[0], pair[1])


def _per_channel(
    name: str, value: Sequence[float] | None, channels: int
) -> tuple[float, ...] | None:
    if value is None:
        return None
    values = tuple(float(v) for v in value)
    if len(values) != channels:
        raise ValueError(f"{name} needs {channels} values (one per channel), got {value!r}")
    return values


def _simplejpeg() -> Any:
    try:
        import simplejpeg
    except ImportError:
        return None
    return simplejpeg


def _decode_simplejpeg(
    data: bytes, size: tuple[int, int] | None, mode: str, into: np.ndarray | None
) -> np.ndarray:
    simplejpeg = _simplejpeg()
    colorspace = "RGB" if mode == "RGB" else "GRAY"
    if into is not None and simplejpeg.decode_jpeg_header(data)[:2] == into.shape[:2]:
        # No allocation and no copy: ~7% faster for 128x128 images (benchmarks/transforms.py).
        simplejpeg.decode_jpeg(data, colorspace=colorspace, buffer=into)
        return into
    if size is None:
        return simplejpeg.decode_jpeg(data, colorspace=colorspace)
    # libjpeg-turbo scales by 1/8..1 while decoding: cheap, and never below the target size.
    image = simplejpeg.decode_jpeg(
        data, colorspace=colorspace, min_height=size[0], min_width=size[1]
    )
    return image if image.shape[:2] == size else _resize(image, size)


def _decode_pil(data: bytes, size: tuple[int, int] | None, mode: str) -> np.ndarray:
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        if size is not None:
            image.draft(mode, (size[1], size[0]))  # JPEG: scale down while decoding
        converted = image.convert(mode)
    if size is not None and converted.size != (size[1], size[0]):
        converted = converted.resize((size[1], size[0]), Image.Resampling.BILINEAR)
    array = np.asarray(converted)
    return array[..., None] if array.ndim == 2 else array


def _resize(image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    from PIL import Image

    pil = Image.fromarray(image[..., 0] if image.shape[2] == 1 else image)
    array = np.asarray(pil.resize((size[1], size[0]), Image.Resampling.BILINEAR))
    return array[..., None] if array.ndim == 2 else array


# --- text --------------------------------------------------------------------------------------


class Tokenize(BatchTransform):
    """Text to token ids with a ``tokenizers.Tokenizer``; see :func:`tokenize`."""

    def __init__(
        self, tokenizer: Any, column: str, max_length: int | None, padding: str, pad_id: int,
        dtype: str, prefix: str, keep_text: bool,
    ) -> None:  # fmt: skip
        from tokenizers import Tokenizer

        # A private copy: the user's tokenizer keeps its own padding and truncation settings.
        self.tokenizer = Tokenizer.from_str(tokenizer.to_str())
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()
        if max_length is not None:
            self.tokenizer.enable_truncation(max_length)
        if padding != "none":
            length = max_length if padding == "max_length" else None
            self.tokenizer.enable_padding(pad_id=pad_id, length=length)
        self.column, self.max_length, self.padding = column, max_length, padding
        self.pad_id, self.dtype, self.prefix, self.keep_text = pad_id, dtype, prefix, keep_text

    def __repr__(self) -> str:
        return (
            f"tokenize(column={self.column!r}, max_length={self.max_length}, "
            f"padding={self.padding!r}, pad_id={self.pad_id}, dtype={self.dtype!r})"
        )

    def apply(self, batch: pa.RecordBatch, errors: ErrorPolicy) -> pa.RecordBatch:
        col = _column(batch, self.column, ("string", "large_string"), "tokenize")
        if col.null_count:
            source = f"tokenize({self.column!r})"
            for i in np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False)).tolist():
                null = ValueError(f"column {self.column!r} is null in this row")
                errors.row_failed(null, i, lambda i=i: _row(batch, i), source)
            batch = batch.filter(col.is_valid())
            col = batch.column(self.column)
        encode = getattr(self.tokenizer, "encode_batch_fast", self.tokenizer.encode_batch)
        encodings = encode(col.to_pylist())
        ids_name, mask_name = self.prefix + "input_ids", self.prefix + "attention_mask"
        if self.padding == "none":
            columns = {ids_name: _ragged_ids(encodings, self.dtype)}
        else:
            width = max(1, self.max_length if self.padding == "max_length" else _longest(encodings))
            ids = _padded(encodings, "ids", width, self.pad_id, self.dtype)
            columns = {
                ids_name: ids,
                mask_name: _padded(encodings, "attention_mask", width, 0, self.dtype),
            }
        if not self.keep_text:
            batch = batch.drop_columns([self.column])
        for name, array in columns.items():
            batch = _with_column(batch, name, array)
        return batch


def tokenize(
    tokenizer: Any,
    column: str = "text",
    *,
    max_length: int | None = None,
    padding: str = "longest",
    pad_id: int | None = None,
    dtype: str = "int64",
    prefix: str = "",
    keep_text: bool = False,
) -> Tokenize:
    """A transform that tokenizes ``column`` with a ``tokenizers.Tokenizer`` (Rust, batched).

    Args:
        tokenizer: a ``tokenizers.Tokenizer`` (a copy is taken; yours is not changed).
        column: the text column; it is dropped from the batch unless ``keep_text``.
        max_length: truncate longer texts to this many tokens.
        padding: ``"longest"`` pads each batch to its longest text, ``"max_length"`` to
            ``max_length`` (static shapes for XLA); both add ``attention_mask`` (1 = token).
            ``"none"`` gives a variable-length ``input_ids`` list column, which the output
            conversion pads (``ragged="pad"``, adding ``input_ids_lengths``) or keeps as a list of
            arrays (``ragged="list"``).
        pad_id: the padding id; default the tokenizer's own, its ``[PAD]`` or ``<pad>`` token, or 0.
        dtype: ``"int64"`` (what torch embeddings like) or ``"int32"``.
        prefix: prepended to the new columns' names (``"question_input_ids"``).

    >>> from tokenizers import Tokenizer, models, pre_tokenizers
    >>> tok = Tokenizer(models.WordLevel({"[PAD]": 0, "hi": 1, "there": 2}, unk_token="[PAD]"))
    >>> tok.pre_tokenizer = pre_tokenizers.Whitespace()
    >>> out = tokenize(tok)(pa.record_batch({"text": ["hi there", "hi"]}))
    >>> out.column("input_ids").to_pylist(), out.column("attention_mask").to_pylist()
    ([[1, 2], [1, 0]], [[1, 1], [1, 0]])
    """
    if not (hasattr(tokenizer, "encode_batch") and hasattr(tokenizer, "to_str")):
        raise TypeError(
            f"tokenize needs a tokenizers.Tokenizer (pip install tokenizers), got "
            f"{type(tokenizer).__name__}; a transformers fast tokenizer has one as .backend_tokenizer"
        )
    if padding not in ("longest", "max_length", "none"):
        raise ValueError(f"padding must be 'longest', 'max_length' or 'none', got {padding!r}")
    if max_length is not None and (not isinstance(max_length, int) or max_length < 1):
        raise ValueError(f"max_length must be None or an int >= 1, got {max_length!r}")
    if padding == "max_length" and max_length is None:
        raise ValueError("padding='max_length' needs max_length=")
    if dtype not in ("int32", "int64"):
        raise ValueError(f"dtype must be 'int32' or 'int64', got {dtype!r}")
    if pad_id is None:
        pad_id = _default_pad_id(tokenizer)
    return Tokenize(tokenizer, column, max_length, padding, pad_id, dtype, prefix, keep_text)


def _default_pad_id(tokenizer: Any) -> int:
    if tokenizer.padding is not None:
        return int(tokenizer.padding["pad_id"])
    for token in ("[PAD]", "<pad>"):
        token_id = tokenizer.token_to_id(token)
        if token_id is not None:
            return int(token_id)
    return 0


def _longest(encodings: list[Any]) -> int:
    return max((len(e.ids) for e in encodings), default=0)


def _padded(encodings: list[Any], attr: str, width: int, pad: int, dtype: str) -> pa.Array:
    rows = np.array([getattr(e, attr) for e in encodings], dtype)
    if rows.ndim != 2:  # no rows at all
        rows = np.empty((0, width), dtype)
    if rows.shape[1] < width:  # only when every text is empty: pad to one column
        rows = np.pad(rows, ((0, 0), (0, width - rows.shape[1])), constant_values=pad)
    return tensor_array(rows)


def _ragged_ids(encodings: list[Any], dtype: str) -> pa.Array:
    lengths = np.fromiter((len(e.ids) for e in encodings), np.int64, count=len(encodings))
    total = int(lengths.sum())
    values = np.fromiter(itertools.chain.from_iterable(e.ids for e in encodings), dtype, total)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))


def _num_rows(batch: Any) -> int:
    return batch.num_rows if isinstance(batch, pa.RecordBatch | pa.Table) else 0


def _add_note(exc: BaseException, note: str) -> None:
    if hasattr(exc, "add_note"):  # Python >= 3.11
        exc.add_note(note)
