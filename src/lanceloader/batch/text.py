"""Text: tokenisation with a ``tokenizers`` tokenizer, batch by batch, in the worker pool.

:func:`tokenize` encodes a whole batch with one ``encode_batch`` call (Rust, all cores of the
worker) and returns Arrow: ``input_ids`` (+ ``attention_mask``) padded (to the longest
row of the batch, or to ``max_length``) or as ragged lists.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pyarrow as pa

from lanceloader.batch.transforms import (
    BatchTransform,
    ErrorPolicy,
    check_column,
    row_at,
    tensor_array,
    with_column,
)


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
        col = check_column(batch, self.column, ("string", "large_string"), "tokenize")
        if col.null_count:
            source = f"tokenize({self.column!r})"
            for i in np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False)).tolist():
                null = ValueError(f"column {self.column!r} is null in this row")
                errors.row_failed(null, i, lambda i=i: row_at(batch, i), source)
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
            batch = with_column(batch, name, array)
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
