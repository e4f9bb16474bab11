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
import multiprocessing
import threading
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lanceloader.batch.byterows import byte_rows
from lanceloader.batch.tensors import import_framework
from lanceloader.batch.transforms import (
    BatchTransform,
    ErrorPolicy,
    check_column,
    row_at,
    tensor_array,
    with_column,
)

_CHANNELS = {"RGB": 3, "L": 1}
JPEG_MAGIC = b"\xff\xd8\xff"


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
        decode = self._decode
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

    def _decode(
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
        backend: ``"auto"`` decodes JPEGs with simplejpeg (measured ~1.8-2x faster than
            Pillow on 128x128 JPEGs, ``benchmarks/transforms.py``) when it is installed, and
            everything else with Pillow; ``"pil"`` or ``"simplejpeg"`` force one.
        output_column: where the ``[N, H, W, C]`` tensor goes; default replaces ``column``.
        layout: ``"HWC"`` (default, ``[N, H, W, C]``) or ``"CHW"`` (``[N, C, H, W]``, what
            PyTorch's convolutions take).
        device: ``"cuda"`` (or ``"cuda:N"``) decodes the JPEGs on that GPU and resizes and
            normalises there (see the module text): the transform then returns a dict whose
            ``output_column`` is a CUDA tensor, so put it last, use thread workers (the
            default) and ``output="torch"``. Needs torchvision and CUDA. Within a few levels
            of 255 of the CPU path (:data:`DEVICE_TOLERANCE`), the same in every run.

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
        output_column or column, layout, _check_device(device),
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

# The GPU path's largest mean absolute difference per image from the CPU path, in levels of 255
# (uint8, resized): the CPU path's simplejpeg scales JPEGs down while decoding (DCT scaling)
# and differs from its Pillow backend by as much (5.8 for 256x256 to 224x224, measured); the GPU
# decodes whole, then resizes as Pillow does (bilinear, antialiased): within 1.2 of backend="pil"
# on the CPU (tests/test_device.py).
DEVICE_TOLERANCE = 6.0


def _check_device(device: str | None) -> str | None:
    """``None``/``"cpu"``: the CPU path; ``"cuda[:N]"``: that GPU, resolved to an index now, in
    the constructing (training) thread, whose current device a bare "cuda" means."""
    if device is None or device == "cpu":
        return None
    if not isinstance(device, str) or not device.startswith("cuda"):
        raise ValueError(f"device must be None, 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    torch = import_framework("torch")
    try:
        import torchvision.io  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            f"decode_images(device={device!r}) decodes with torchvision: pip install torchvision "
            f"(the build matching torch {torch.__version__}, from the same index), or decode on "
            "the CPU with device=None"
        ) from exc
    if not torch.cuda.is_available():
        raise ValueError(
            f"decode_images(device={device!r}) but this machine has no CUDA device "
            f"(torch {torch.__version__}); decode on the CPU with device=None"
        )
    target = torch.device(device)
    index = torch.cuda.current_device() if target.index is None else target.index
    return f"cuda:{index}"


_streams = threading.local()  # each worker thread decodes on a CUDA stream of its own


def _thread_stream(device: Any) -> Any:
    torch = import_framework("torch")
    streams = _streams.__dict__.setdefault("by_device", {})
    if device.index not in streams:
        streams[device.index] = torch.cuda.Stream(device)
    return streams[device.index]


def decode_on_device(d: DecodeImages, batch: pa.RecordBatch, errors: ErrorPolicy) -> dict[str, Any]:
    """:meth:`DecodeImages.apply` on the GPU ``d.device``: the batch as a dict whose
    ``d.output_column`` is a CUDA tensor and whose other columns are Arrow (kept rows)."""
    if multiprocessing.current_process().name.startswith("lanceloader-process-"):
        raise RuntimeError(
            f"decode_images(device={d.device!r}) runs in thread workers: a process worker "
            "cannot hand CUDA tensors to the training process; pass worker_type='thread' (the "
            "default), or decode on the CPU with device=None"
        )
    torch = import_framework("torch")
    source = f"decode_images({d.column!r})"
    col = encoded_column(batch, d.column)
    device = torch.device(d.device)
    cuda = device.type == "cuda"  # else only the CPU fallback runs (what the tests can run)
    encoded = row_views(col)  # torch is imported: its warning for read-only buffers is off
    images: list[Any] = [None] * len(encoded)
    jpegs = [i for i, e in enumerate(encoded) if cuda and e is not None and _gpu_decodable(e)]
    stream = _thread_stream(device) if cuda else None
    with (
        torch.cuda.device(device) if cuda else nullcontext(),
        torch.cuda.stream(stream) if cuda else nullcontext(),
    ):
        on_gpu = [torch.from_numpy(encoded[i]) for i in jpegs]
        for i, image in zip(jpegs, gpu_decode(on_gpu, d.mode, device), strict=True):
            images[i] = image
        first: tuple[int, ...] | None = None
        for i in range(len(images)):
            try:
                if images[i] is None:  # not a JPEG, or refused by the GPU: the CPU path
                    array = d._decode(encoded[i], None, None)
                    images[i] = torch.from_numpy(array).permute(2, 0, 1).to(device)
                first = first or tuple(images[i].shape)
                if d.size is None and tuple(images[i].shape) != first:
                    raise ValueError(
                        f"image is {images[i].shape[2]}x{images[i].shape[1]}, the batch's first "
                        f"is {first[2]}x{first[1]}; pass size=(H, W) to resize every image"
                    )
            except Exception as exc:
                images[i] = None
                errors.row_failed(exc, i, lambda i=i: row_at(batch, i), source)
        kept = [i for i, image in enumerate(images) if image is not None]
        out = finish_images(
            [images[i] for i in kept],
            d.size,
            d.dtype,
            d.mean,
            d.std,
            d.layout,
            _CHANNELS[d.mode],
            device,
        )
        if cuda:  # the loop reads it on its own stream: until the device stage records that
            # one (Loader(device=...)), keep the memory from this stream's reuse until the
            # default stream is done with it.
            out.record_stream(torch.cuda.default_stream(device))
    if stream is not None:
        stream.synchronize()  # this worker waits, so the batch it hands over is complete
    rows = batch if len(kept) == batch.num_rows else batch.take(pa.array(kept, pa.int64()))
    columns: dict[str, Any] = {name: rows.column(name) for name in rows.schema.names}
    columns[d.output_column] = out
    return columns


def encoded_column(batch: pa.RecordBatch, name: str) -> pa.Array:
    """Column ``name`` of ``batch``, the encoded images: ``binary`` or ``large_binary`` as it
    is, ``binary_view`` copied into one buffer (``large_binary``, in Arrow); anything else
    raises naming the column and its type.

    >>> batch = pa.record_batch({"image": pa.array([b"x"], pa.binary_view())})
    >>> encoded_column(batch, "image").type
    DataType(large_binary)
    """
    if name in batch.schema.names and pa.types.is_binary_view(batch.schema.field(name).type):
        return batch.column(name).cast(pa.large_binary())
    return check_column(batch, name, ("binary", "large_binary"), "decode_images")


def row_views(col: pa.Array) -> list[np.ndarray | None]:
    """Each row of a binary column as a ``uint8`` array viewing the Arrow buffer (no copy;
    ``None`` for a null): what the decoders read, so no row becomes a ``bytes`` object.
    A ``binary_view`` column is first copied into one buffer (its rows may lie in many).

    >>> [bytes(v) if v is not None else v for v in row_views(pa.array([b"ab", None, b"c"]))]
    [b'ab', None, b'c']
    """
    if pa.types.is_binary_view(col.type):  # no one buffer to view: one copy, in Arrow
        col = col.cast(pa.large_binary())
    if not col.null_count:
        rows = byte_rows(col)
        return [
            rows.data[lo:hi]
            for lo, hi in zip(rows.offsets[:-1].tolist(), rows.offsets[1:].tolist(), strict=True)
        ]
    rows = byte_rows(pc.fill_null(col, pa.scalar(b"", col.type)))
    valid = col.is_valid().to_numpy(zero_copy_only=False).tolist()
    return [rows.view(i) if ok else None for i, ok in enumerate(valid)]


# Start-of-frame markers: the segment that says how many colour components a JPEG has.
_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


def _gpu_decodable(data: np.ndarray) -> bool:
    """A JPEG of 1 or 3 components (4 is CMYK or YCCK, which the CPU path converts right):
    the segments are walked by their lengths up to the frame header.

    >>> header = bytes.fromhex("ffd8 ffc0 0011 08 0001 0001 03")  # SOF0: 1x1, 3 components
    >>> _gpu_decodable(np.frombuffer(header, np.uint8))
    True
    """
    if len(data) < 4 or bytes(data[:3]) != JPEG_MAGIC:
        return False
    i = 2
    while i + 9 < len(data):
        if data[i] != 0xFF:
            return False  # not at a marker: let the decoders judge
        marker = int(data[i + 1])
        if marker in _SOF:
            return int(data[i + 9]) in (1, 3)
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        i += 2 + (int(data[i + 2]) << 8 | int(data[i + 3]))
    return False


def gpu_decode(encoded: list[Any], mode: str, device: Any) -> list[Any]:
    """JPEGs (uint8 CPU tensors) as ``[C, H, W]`` uint8 tensors on ``device``, in one batched
    call; ``None`` for each that the GPU decoder refuses (a refusal fails the whole call, which
    is then retried one image at a time)."""
    if not encoded:
        return []
    from torchvision.io import ImageReadMode, decode_jpeg

    read_mode = ImageReadMode.RGB if mode == "RGB" else ImageReadMode.GRAY
    try:
        return list(decode_jpeg(encoded, mode=read_mode, device=device))
    except RuntimeError:
        out: list[Any] = []
        for data in encoded:
            try:
                out.append(decode_jpeg(data, mode=read_mode, device=device))
            except RuntimeError:
                out.append(None)
        return out


def finish_images(
    images: list[Any],
    size: tuple[int, int] | None,
    dtype: str,
    mean: Sequence[float] | None,
    std: Sequence[float] | None,
    layout: str,
    channels: int,
    device: Any = None,
) -> Any:
    """``[C, H, W]`` uint8 tensors (on any device) as one batch tensor, as the CPU path makes
    it: resized to ``size`` (bilinear, antialiased, rounded to uint8), then ``float32``
    normalised ``(pixel / 255 - mean) / std``, in ``layout``. Torch ops only, so the GPU path's
    arithmetic is tested on the CPU too.

    >>> import torch
    >>> finish_images([torch.full((3, 4, 4), 255, dtype=torch.uint8)], (2, 2), "float32",
    ...               [0.5] * 3, [0.5] * 3, "HWC", 3).shape
    torch.Size([1, 2, 2, 3])
    """
    torch = import_framework("torch")
    if not images:
        h, w = size or (1, 1)
        out = torch.empty((0, channels, h, w), dtype=torch.uint8, device=device)
    else:
        if size is not None:
            images = [
                image if tuple(image.shape[1:]) == size else _resize_tensor(image, size)
                for image in images
            ]
        out = torch.stack(images)
    if dtype == "float32":
        m = torch.tensor(mean if mean is not None else [0.0] * channels, device=out.device)
        s = torch.tensor(std if std is not None else [1.0] * channels, device=out.device)
        out = out.to(torch.float32) * (1.0 / (255.0 * s)).view(1, -1, 1, 1) - (m / s).view(
            1, -1, 1, 1
        )
    return out.permute(0, 2, 3, 1).contiguous() if layout == "HWC" else out


def _resize_tensor(image: Any, size: tuple[int, int]) -> Any:
    torch = import_framework("torch")
    resized = torch.nn.functional.interpolate(
        image[None].to(torch.float32),
        size=size,
        mode="bilinear",
        antialias=True,
        align_corners=False,
    )
    return resized[0].round_().clamp_(0, 255).to(torch.uint8)
