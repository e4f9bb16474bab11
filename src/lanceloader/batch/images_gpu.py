"""GPU image decode (``decode_images(device="cuda")``): a worker thread decodes the batch's JPEGs
on the GPU in one batched call (torchvision's ``decode_jpeg(list, device=...)``) on a CUDA
stream of its own, then resizes and normalises there with torch ops (:func:`finish_images`,
tested on the CPU too); what the GPU refuses is decoded on the CPU and joins the batch before
the resize."""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any

import numpy as np
import pyarrow as pa

from lanceloader.batch.encoded import CHANNELS, JPEG_MAGIC, encoded_column, row_views
from lanceloader.batch.tensors import import_framework
from lanceloader.batch.transforms import ErrorPolicy, row_at

# The GPU path's largest mean absolute difference per image from the CPU path, in levels of 255
# (uint8, resized): the CPU path's simplejpeg scales JPEGs down while decoding (DCT scaling)
# and differs from its Pillow backend by as much (5.8 for 256x256 to 224x224, measured); the GPU
# decodes whole, then resizes as Pillow does (bilinear, antialiased): within 1.2 of backend="pil"
# on the CPU (tests/engine/test_device.py).
DEVICE_TOLERANCE = 6.0


def check_device(device: str | None) -> str | None:
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


def decode_on_device(d: Any, batch: pa.RecordBatch, errors: ErrorPolicy) -> dict[str, Any]:
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
                    array = d.decode_one(encoded[i], None, None)
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
            CHANNELS[d.mode],
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
