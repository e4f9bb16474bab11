"""Audio: a column of encoded audio files to one ``[N, C, T]`` float32 crop column.

:func:`decode_audio` is a row-aware transform, like ``decode_images``: it runs in the worker
pool, decodes only each row's crop (``lanceloader.media.audio`` seeks where the format allows),
and returns Arrow (a fixed-shape tensor column), so it chains with the other transforms and
feeds every output format. A row that fails (corrupt file, or one of another rate or channel
count than the batch's first without ``sample_rate`` / ``channels``) is a row error: raised,
or skipped and counted under ``on_error``.

Random crops belong to the sample, not the worker: each row's offset is drawn from
``sample_rng(loader seed, seed, epoch, global sample)`` (the ``random_map`` rule), so worker
count, worker type and a resume never change a crop, and each epoch draws anew.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from lanceloader.batch.augment import sample_rng
from lanceloader.batch.row_keys import current_row_keys
from lanceloader.batch.transforms import (
    BatchTransform,
    ErrorPolicy,
    check_column,
    row_at,
    tensor_array,
    with_column,
)

CROPS = ("random", "start", "center")
SHORT = ("pad", "error")


@dataclass(frozen=True)
class DecodeAudio(BatchTransform):
    """Audio bytes to one ``[N, C, T]`` float32 column of crops; see :func:`decode_audio`."""

    column: str
    seconds: float
    crop: str
    sample_rate: int | None
    channels: int | None
    short: str
    seed: int
    output_column: str

    def apply(self, batch: pa.RecordBatch, errors: ErrorPolicy) -> pa.RecordBatch:
        from lanceloader.media.audio import AudioReader

        source = f"decode_audio({self.column!r})"
        col = check_column(batch, self.column, ("binary", "large_binary"), "decode_audio")
        keys = current_row_keys(batch.num_rows) if self.crop == "random" else None
        epochs = keys.epochs() if keys is not None else None
        out: np.ndarray | None = None
        kept: list[int] = []
        for i, file in enumerate(file_views(col)):
            try:
                if file is None:
                    raise ValueError(f"column {self.column!r} is null in this row")
                with AudioReader(file) as reader:
                    rng = (
                        None
                        if keys is None
                        else sample_rng(keys.seed, self.seed, int(epochs[i]), int(keys.samples[i]))
                    )
                    crop = self._crop(reader, rng)
                if out is None:
                    out = np.empty((len(col), *crop.shape), np.float32)
                elif crop.shape != out.shape[1:]:
                    raise ValueError(
                        f"this row's crop is [C, T] = {list(crop.shape)}, the batch's first is "
                        f"{list(out.shape[1:])}: the files differ in sample rate or channels; "
                        "pass sample_rate= and channels= to make every crop the same shape"
                    )
                out[len(kept)] = crop
                kept.append(i)
            except Exception as exc:
                errors.row_failed(exc, i, lambda i=i: row_at(batch, i), source)
        crops = (
            out[: len(kept)]
            if out is not None
            else np.empty((0, self.channels or 1, self._samples(self.sample_rate or 1)), np.float32)
        )
        rows = batch if len(kept) == batch.num_rows else batch.take(pa.array(kept, pa.int64()))
        return with_column(rows, self.output_column, tensor_array(crops))

    def _samples(self, rate: int) -> int:
        return round(self.seconds * rate)

    def _crop(self, reader: Any, rng: np.random.Generator | None) -> np.ndarray:
        """One row's crop as ``[C, T]``: the window at the file's rate, decoded, resampled,
        mixed, and padded with silence at the end where the file is shorter."""
        info = reader.info
        native = info.sample_rate
        target = self._samples(self.sample_rate or native)
        # Native samples to decode: enough for `target` output samples (the extra one a
        # rounding may add is cut below).
        length = (
            target
            if self.sample_rate in (None, native)
            else math.ceil(target * native / self.sample_rate)
        )
        if info.frames < length:
            if self.short == "error":
                raise ValueError(
                    f"the file is {info.duration_s:.3f} s ({info.frames} samples at {native} Hz), "
                    f"shorter than seconds={self.seconds}; pass short='pad' to pad it with "
                    "silence, or a smaller seconds"
                )
            offset, length = 0, info.frames
        elif self.crop == "start":
            offset = 0
        elif self.crop == "center":
            offset = (info.frames - length) // 2
        else:
            offset = int(rng.integers(0, info.frames - length + 1))
        window = reader.window(
            offset, length, sample_rate=self.sample_rate, channels=self.channels
        )[:, :target]
        if window.shape[1] < target:  # short="pad": silence after the file's end
            window = np.pad(window, ((0, 0), (0, target - window.shape[1])))
        return window


def file_views(col: pa.Array) -> list[memoryview | None]:
    """Each row of a binary column as a memoryview of the Arrow buffer it lies in (no copy;
    ``None`` for a null), so decoders read only the parts of a file they need.

    >>> [bytes(v) if v is not None else v for v in file_views(pa.array([b"ab", None, b"c"]))]
    [b'ab', None, b'c']
    """
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    offsets_type = np.int64 if pa.types.is_large_binary(col.type) else np.int32
    _, offsets_buffer, data_buffer = col.buffers()
    offsets = np.frombuffer(offsets_buffer, offsets_type)[col.offset : col.offset + len(col) + 1]
    data = memoryview(data_buffer) if data_buffer is not None else memoryview(b"")
    valid = col.is_valid().to_numpy(zero_copy_only=False)
    bounds = offsets.tolist()
    return [data[bounds[i] : bounds[i + 1]] if valid[i] else None for i in range(len(col))]


def decode_audio(
    column: str = "audio",
    seconds: float = 1.0,
    crop: str = "random",
    sample_rate: int | None = None,
    channels: int | None = None,
    *,
    short: str = "pad",
    seed: int = 0,
    output_column: str | None = None,
) -> DecodeAudio:
    """A transform that decodes a fixed-length crop of each row's audio file into one float32
    ``[N, C, T]`` tensor column (``T = round(seconds * rate)``).

    Args:
        column: binary column of audio files: WAV, FLAC, MP3, Ogg Opus or Vorbis, or anything
            PyAV (FFmpeg) reads; decoders and accuracy in ``lanceloader.media.audio``.
        seconds: the crop's length.
        crop: ``"random"`` (an offset drawn per sample from the loader's seed, ``seed``, the
            epoch and the sample: the same in every run, worker count and resume, new each
            epoch), ``"start"`` or ``"center"``.
        sample_rate: resample every crop to this rate (Hz); default the file's own, which must
            then be the same for every file of a batch.
        channels: ``1`` (the mean of the channels), ``2`` (a mono file duplicated) or the
            file's own (``None``, the same for every file of a batch).
        short: a file shorter than ``seconds``: ``"pad"`` (default) decodes all of it from the
            start and pads the crop with silence (zeros) at the end; ``"error"`` makes it a row
            error (raised, or skipped under ``on_error="skip"``).
        seed: a seed of this transform's own, mixed with the loader's (two ``decode_audio``
            with different seeds crop differently).
        output_column: where the crops go; default replaces ``column``.

    Each row's file is opened once, and only its crop is decoded where the format seeks.

    >>> import io, numpy as np, soundfile
    >>> wav = io.BytesIO(); soundfile.write(wav, np.zeros((8000, 2)), 8000, format="WAV")
    >>> batch = pa.record_batch({"audio": [wav.getvalue()] * 3})
    >>> decode_audio(seconds=0.5)(batch).column("audio").to_numpy_ndarray().shape
    (3, 2, 4000)
    >>> decode_audio(seconds=0.5, sample_rate=16000, channels=1)(batch).column(
    ...     "audio").to_numpy_ndarray().shape
    (3, 1, 8000)
    """
    for module, extra in (("soundfile", "soundfile"), ("av", "av")):
        try:
            __import__(module)
        except ImportError as exc:
            raise ImportError(
                f"decode_audio needs {extra}: pip install 'lanceloader[media]'"
            ) from exc
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int | float)
        or not math.isfinite(seconds)
        or seconds <= 0
    ):
        raise ValueError(f"seconds must be a number > 0 (the crop's length), got {seconds!r}")
    if crop not in CROPS:
        raise ValueError(f"crop must be one of {CROPS}, got {crop!r}")
    if short not in SHORT:
        raise ValueError(
            f"short must be 'pad' (silence after a short file) or 'error', got {short!r}"
        )
    if sample_rate is not None and (
        isinstance(sample_rate, bool) or not isinstance(sample_rate, int) or sample_rate <= 0
    ):
        raise ValueError(
            f"sample_rate must be None (each file's own) or an int > 0 (Hz), got {sample_rate!r}"
        )
    if channels not in (None, 1, 2) or isinstance(channels, bool):
        raise ValueError(
            f"channels must be None (each file's own), 1 (mono) or 2 (stereo), got {channels!r}"
        )
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"decode_audio: seed must be an int, got {seed!r}")
    if sample_rate is not None and round(seconds * sample_rate) < 1:
        raise ValueError(
            f"seconds={seconds} at sample_rate={sample_rate} is no sample; pass a longer crop"
        )
    return DecodeAudio(
        column, float(seconds), crop, sample_rate, channels, short, seed, output_column or column
    )
