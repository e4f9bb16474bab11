"""Images: JPEG/PNG bytes to one ``[N, H, W, C]`` tensor column, decoded in the worker pool.

:func:`decode_images` is a row-aware transform (a bad image is a row error, which
``on_error="skip"`` drops) that returns Arrow, so it chains with the other transforms and feeds
every output format. JPEGs go through simplejpeg (libjpeg-turbo) when it is installed, decoded
straight into the batch's array; everything else through Pillow.

With ``device="cuda"`` a worker thread decodes the batch's JPEGs on the GPU in one batched call
(torchvision's ``decode_jpeg(list, device=...)``, on a CUDA stream of the thread's own), then
resizes (bilinear, antialiased) and normalises there with torch ops; what the GPU decoder
refuses (PNG, CMYK, corrupt files) is decoded on the CPU as above, at full size, and joins the
batch before the resize, so every row goes through the same resize; a row that fails on the CPU
too is a row error as always. The result is a dict holding a CUDA tensor, ready for the step,
so this transform comes last. The worker waits for its stream before handing the batch over.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from lanceloader.batch.encoded import CHANNELS as _CHANNELS
from lanceloader.batch.encoded import JPEG_MAGIC, encoded_column, row_views
from lanceloader.batch.images_gpu import check_device, decode_on_device
from lanceloader.batch.transforms import (
    BatchTransform,
    ErrorPolicy,
    row_at,
    tensor_array,
    with_column,
)


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
    layout: str = "HWC"
    device: str | None = None  # "cuda:N": decode on that GPU

    def apply(self, batch: pa.RecordBatch, errors: ErrorPolicy) -> Any:
        if self.device is not None:
            return decode_on_device(self, batch, errors)
        source = f"decode_images({self.column!r})"
        col = encoded_column(batch, self.column)
        out: np.ndarray | None = None
        kept: list[int] = []
        decode = self.decode_one
        for i, data in enumerate(row_views(col)):  # no bytes object per row
            try:
                slot = out[len(kept)] if out is not None else None
                image = decode(data, slot, self.size)
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
                errors.row_failed(exc, i, lambda i=i: row_at(batch, i), source)
        h, w = self.size or (1, 1)
        images = out[: len(kept)] if out is not None else np.empty((0, h, w, _CHANNELS[self.mode]))
        if self.dtype == "float32":
            images = normalise(images, self.mean, self.std)
        if self.layout == "CHW":
            images = images.transpose(0, 3, 1, 2)  # made contiguous by tensor_array
        rows = batch if len(kept) == batch.num_rows else batch.take(pa.array(kept, pa.int64()))
        return with_column(
            rows, self.output_column, tensor_array(images.astype(self.dtype, copy=False))
        )

    def decode_one(
        self, data: bytes | np.ndarray | None, into: np.ndarray | None, size: tuple[int, int] | None
    ) -> np.ndarray:
        """One image (bytes, or a ``uint8`` array viewing them) as ``[H, W, C]`` uint8 of
        ``size`` (None: its own); decoded straight into ``into`` where it fits."""
        if data is None:
            raise ValueError(f"column {self.column!r} is null in this row")
        if self.backend != "pil" and bytes(data[:3]) == JPEG_MAGIC:
            try:
                return _decode_simplejpeg(data, size, self.mode, into)
            except Exception:
                if self.backend == "simplejpeg":
                    raise
                # A JPEG that libjpeg-turbo's fast path refuses (e.g. CMYK): Pillow may manage.
        return _decode_pil(data, size, self.mode)


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
    layout: str = "HWC",
    device: str | None = None,
) -> DecodeImages:
    """A transform that decodes the encoded images of ``column`` into one tensor column.

    Args:
        column: binary column of JPEG or PNG bytes (anything Pillow opens).
        size: ``(H, W)`` (or one int for a square) to resize to (bilinear); default keep the
            size, which must then be the same for every image of a batch.
        mode: ``"RGB"`` (C=3) or ``"L"`` (grey, C=1); alpha is dropped.
        dtype: ``"uint8"`` (0..255) or ``"float32"``: ``(pixel / 255 - mean) / std`` per channel
            (mean and std in 0..1 units, e.g. ImageNet's 0.485, 0.456, 0.406 / 0.229, 0.224, 0.225).
        backend: ``"auto"`` decodes JPEGs with simplejpeg (faster than Pillow on small JPEGs:
            docs/performance.md, "Image decoding") when it is installed, and everything else
            with Pillow; ``"pil"`` or ``"simplejpeg"`` force one.
        output_column: where the ``[N, H, W, C]`` tensor goes; default replaces ``column``.
        layout: ``"HWC"`` (default, ``[N, H, W, C]``) or ``"CHW"`` (``[N, C, H, W]``, what
            PyTorch's convolutions take).
        device: ``"cuda"`` (or ``"cuda:N"``) decodes the JPEGs on that GPU and resizes and
            normalises there (see the module text): the transform then returns a dict whose
            ``output_column`` is a CUDA tensor, so put it last, use thread workers (the
            default) and ``output="torch"``. Needs torchvision and CUDA. Within a few levels
            of 255 of the CPU path (:data:`~lanceloader.batch.images_gpu.DEVICE_TOLERANCE`), the same in every run.

    A row whose image fails to decode is a row error (``on_error="skip"`` drops it).

    >>> import io, numpy as np; from PIL import Image
    >>> png = io.BytesIO(); Image.new("RGB", (4, 2), (255, 0, 0)).save(png, format="PNG")
    >>> out = decode_images("img")(pa.record_batch({"img": pa.array([png.getvalue()])}))
    >>> out.column("img").to_numpy_ndarray().shape
    (1, 2, 4, 3)
    >>> decode_images("img", layout="CHW")(pa.record_batch({"img": [png.getvalue()]})).column(
    ...     "img").to_numpy_ndarray().shape
    (1, 3, 2, 4)
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
    if layout not in ("HWC", "CHW"):
        raise ValueError(f"layout must be 'HWC' or 'CHW', got {layout!r}")
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
        output_column or column, layout, check_device(device),
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
    data: bytes | np.ndarray, size: tuple[int, int] | None, mode: str, into: np.ndarray | None
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


def _decode_pil(data: bytes | np.ndarray, size: tuple[int, int] | None, mode: str) -> np.ndarray:
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


# --- on the GPU ----------------------------------------------------------------------------------
