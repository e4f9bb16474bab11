"""The media index of clips: per media row (the inner source's positions, in order), its blob's
size and what reading a clip needs to know of the file (frames, keyframes and their byte
offsets, the header; for audio the sample rate, channels and byte index). Built once, when the
:class:`~lanceloader.rows.clips.source.ClipSource` is made, in the process that makes it (the
Loader's); never during a read.

:func:`build_index` reads the ``{column}_frames``... index columns ``ll.convert`` writes
(:data:`INDEX_READ_ROWS` rows per ``take``), or, for a dataset without them, probes every file
once, reading it whole (:data:`PROBE_READ_BYTES` per ``read_blob_ranges`` call): a probed index
is cached beside the filter's plan with ``cache=`` a directory (``DiskCache``, key
``clip-index``), else probed again by each Loader. On a local dataset it also locates each blob
in the dataset's files (``rows/lance/blob_files.py``, from the descriptors read for the sizes; never
cached).

Who owns what: the :class:`MediaIndex` (one Arrow table of about
``videos × (3 × keyframes + 12) × 8`` bytes) belongs to its ``ClipSource``, read-only once
built; it travels to process workers pickled with it, and each read (:mod:`lanceloader.rows.clips.source`)
takes the rows of its own media from it. A file that cannot be probed is a :class:`ClipError`,
defined here where it is first raised (``rows/clips/source.py`` raises it for a clip that fails to
decode). This module imports nothing of ``rows/clips/source.py``, which builds on it; the lazy imports
of the media modules (:func:`import_video`, :func:`import_audio_ranges`) are shared from here.

Example::

    >>> index_names(VideoClips("video"))[:3]
    ['video_frames', 'video_fps', 'video_duration']
    >>> index = MediaIndex(pa.table({"size": [3, 5]}), "probe")
    >>> MediaIndex.from_bytes(index.to_bytes()).table.equals(index.table)
    True
"""

from __future__ import annotations

import io
import logging
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from lanceloader.rows.cache.disk import DiskCache
from lanceloader.rows.clips.windows import Clips, VideoClips
from lanceloader.rows.dataset import NOT_READ_FAILURES, ReadError
from lanceloader.rows.lance.blob_files import BlobLocations, blob_locations
from lanceloader.rows.lance.source import Source
from lanceloader.rows.protocol import empty_table

__all__ = [
    "AUDIO_INDEX",
    "INDEX_READ_ROWS",
    "PROBE_READ_BYTES",
    "VIDEO_INDEX",
    "ClipError",
    "MediaIndex",
    "build_index",
    "check_short_media",
    "import_audio_ranges",
    "import_video",
    "index_names",
]

_logger = logging.getLogger("lanceloader")
INDEX_READ_ROWS = 4096  # rows per read while building the index at construction
PROBE_READ_BYTES = 64 << 20  # bytes of media read per call while probing files without an index
VIDEO_INDEX = (
    "frames",
    "fps",
    "duration",
    "codec",
    "width",
    "height",
    "keyframes",
    "keyframe_offsets",
    "header_offset",
    "header_length",
    "keyframe_pts",
)
#: index columns a dataset may lack (converted before they were recorded): read when there
OPTIONAL_INDEX = ("keyframe_pts",)
AUDIO_INDEX = (  # media/audio_ranges.py index_fields: the info and the byte index
    "sample_rate",
    "channels",
    "frames",
    "duration",
    "codec",
    "seek_samples",
    "seek_offsets",
    "header_offset",
    "header_length",
    "preroll",
)


class ClipError(ReadError):
    """A clip could not be decoded (a corrupt or truncated file): names the clip, the Lance row,
    its position and the row's text columns (its path...); the decoder's error is
    ``__cause__``. A :class:`~lanceloader.ReadError`, so ``except ll.ReadError`` catches it.

    >>> issubclass(ClipError, ReadError), issubclass(ClipError, OSError)
    (True, True)
    """


# --- the media: what is specific to video or audio ----------------------------------------


def import_video() -> Any:
    """``lanceloader.media.video``, imported when clips are first used: it imports PyAV, which
    a loader of other rows never needs (and which costs ~100 ms at import)."""
    from lanceloader.media import video

    return video


def import_audio_ranges() -> Any:
    """``lanceloader.media.audio_ranges``, imported when audio clips are first used (as
    above)."""
    from lanceloader.media import audio_ranges

    return audio_ranges


@dataclass
class MediaIndex:
    """Per media (inner position): its blob's ``size`` in bytes and its index columns
    (``{column}_frames``...), as one Arrow table; where it came from (``"columns"``, ``"probe"``
    or ``"cache"``) and, when probed, the bytes read to probe."""

    table: pa.Table
    origin: str
    probed_bytes: int = 0
    #: where each media's blob lies in a local dataset's files (``rows/lance/blob_files.py``; None:
    #: ranges come from Lance's ``read_blob_ranges``); made from the descriptors, never cached
    located: BlobLocations | None = None

    def to_bytes(self) -> np.ndarray:
        sink = io.BytesIO()
        with pa.ipc.new_stream(sink, self.table.schema) as writer:
            writer.write_table(self.table)
        return np.frombuffer(sink.getvalue(), dtype=np.uint8)

    @classmethod
    def from_bytes(cls, data: np.ndarray) -> MediaIndex:
        return cls(pa.ipc.open_stream(pa.py_buffer(data.tobytes())).read_all(), "cache")


def index_names(spec: Clips) -> list[str]:
    names = VIDEO_INDEX if isinstance(spec, VideoClips) else AUDIO_INDEX
    return [f"{spec.column}_{name}" for name in names]


def _blob_descriptors(ds: Any, column: str, offsets: np.ndarray) -> pa.StructArray:
    """The descriptors of the blobs at Lance row ``offsets`` (kind, position, size...), as
    Lance scans a blob column."""
    parts = []
    for lo in range(0, len(offsets), INDEX_READ_ROWS):
        part = offsets[lo : lo + INDEX_READ_ROWS]
        col = ds.take(part.tolist(), columns=[column]).column(column).combine_chunks()
        parts.append(col.storage if isinstance(col, pa.ExtensionArray) else col)
    if not parts:
        return pa.array([], pa.struct([("size", pa.uint64())]))
    return pa.concat_arrays(parts)


def _whole_blobs(ds: Any, column: str, offsets: np.ndarray, sizes: np.ndarray):
    """``(i, bytes)`` of each blob, read in calls of about :data:`PROBE_READ_BYTES`."""
    lo = 0
    while lo < len(offsets):
        hi, total = lo, 0
        while hi < len(offsets) and (hi == lo or total + sizes[hi] <= PROBE_READ_BYTES):
            total += int(sizes[hi])
            hi += 1
        requests = [(int(o), 0, int(n)) for o, n in zip(offsets[lo:hi], sizes[lo:hi], strict=True)]
        for i, (_, _, data) in enumerate(ds.read_blob_ranges(column, requests, selector="indices")):
            yield lo + i, data
        lo = hi


def build_index(inner: Source, spec: Clips) -> MediaIndex:
    """The index of every media of ``inner`` (its positions, in order): read from the index
    columns when the dataset has them (``ll.convert`` writes them), else made by probing each
    file once (reading it whole: what a dataset without the columns costs, once per cache
    directory with ``cache=`` a directory, else once per Loader); with, on a local dataset,
    where each blob lies in its files (from the descriptors read for the sizes)."""
    ds = inner.dataset
    offsets = inner.row_offsets(np.arange(inner.num_rows))
    descriptors = _blob_descriptors(ds, spec.column, offsets)
    sizes = descriptors.field("size").to_numpy(zero_copy_only=False).astype(np.int64)
    index = _media_index(inner, spec, offsets, sizes)
    index.located = blob_locations(ds, spec.column, offsets, descriptors)
    return index


def _media_index(inner: Source, spec: Clips, offsets: np.ndarray, sizes: np.ndarray) -> MediaIndex:
    ds, names = inner.dataset, index_names(spec)
    optional = {f"{spec.column}_{name}" for name in OPTIONAL_INDEX}
    if all(name in ds.schema.names for name in names if name not in optional):
        names = [name for name in names if name in ds.schema.names]
        parts = [
            ds.take(offsets[lo : lo + INDEX_READ_ROWS].tolist(), columns=names)
            for lo in range(0, len(offsets), INDEX_READ_ROWS)
        ]
        table = pa.concat_tables(parts) if parts else empty_table(ds.schema).select(names)
        return MediaIndex(table.append_column("size", pa.array(sizes, pa.int64())), "columns")

    def probe_all() -> MediaIndex:
        rows, probed = [], 0
        for i, data in _whole_blobs(ds, spec.column, offsets, sizes):
            probed += len(data)
            rows.append(_probe(spec, data, inner, int(offsets[i])))
        table = pa.Table.from_pylist(rows) if rows else pa.table({})
        return MediaIndex(table.append_column("size", pa.array(sizes, pa.int64())), "probe", probed)

    if not isinstance(inner.cache, DiskCache):
        return probe_all()
    made: list[MediaIndex] = []

    def make() -> np.ndarray:
        made.append(probe_all())
        return made[0].to_bytes()

    data, _ = inner.cache.load_or_make(
        inner.cache_key("clip-index", spec.kind, spec.column, *index_names(spec)), make
    )
    return made[0] if made else MediaIndex.from_bytes(data)


def _probe(spec: Clips, data: bytes, inner: Source, offset: int) -> dict[str, Any]:
    """The index values of one file (``{column}_frames``...), probed from its bytes."""
    try:
        if isinstance(spec, VideoClips):
            media = import_video()
            return media.index_values(media.probe_video(data), spec.column)
        media = import_audio_ranges()
        return media.index_values(*media.probe_audio_index(data), spec.column)
    except NOT_READ_FAILURES:
        raise
    except Exception as exc:
        raise ClipError(
            f"{spec.kind} at Lance row {offset} "
            f"({inner.describe_offsets(np.array([offset]))}) could not be probed: "
            f"{type(exc).__name__}: {exc}; remove the row (filter=) or reconvert "
            "the files with ll.convert, which lists and skips bad files"
        ) from exc


# --- media shorter than one clip ----------------------------------------------------------


def check_short_media(inner: Source, spec: Clips, index: MediaIndex, counts: np.ndarray) -> int:
    """How many media are too short for one clip (``counts``: clips per media). None long
    enough (and some media): ``ValueError`` naming how many, the longest and the fix (every
    epoch would be empty); some: one warning saying how many are left out. Returns the count."""
    short = counts == 0
    if not short.any():
        return 0
    lengths = _seconds_or_frames(spec, index)
    kind = "videos" if isinstance(spec, VideoClips) else "audio files"
    if isinstance(spec, VideoClips):
        clip = (
            f"one clip of video_clips(frames={spec.frames}, stride={spec.stride}) "
            f"({spec.span} frames)"
        )
    else:
        clip = f"one window of audio_clips(seconds={spec.seconds:g})"
    if short.all():
        longest = int(np.argmax(lengths))
        raise ValueError(
            f"clips: all {len(counts)} {kind} of column {spec.column!r} are shorter than {clip}, "
            f"so every epoch would be empty; the longest, {_describe_media(inner, spec, longest)}, has "
            f"{_fit(spec, lengths[longest])}"
        )
    shortest = int(np.flatnonzero(short)[np.argmin(lengths[short])])
    _logger.warning(
        "clips: %d of the %d %s of column %r are shorter than %s: they have no clip and are left "
        "out of every epoch; the shortest has %s to keep them all",
        int(short.sum()), len(counts), kind, spec.column, clip, _fit(spec, lengths[shortest]),
    )  # fmt: skip
    return int(short.sum())


def _seconds_or_frames(spec: Clips, index: MediaIndex) -> np.ndarray:
    """Each media's length: frames (video), seconds (audio)."""
    frames = index.table.column(f"{spec.column}_frames").to_numpy(zero_copy_only=False)
    if isinstance(spec, VideoClips):
        return frames.astype(np.int64)
    rates = index.table.column(f"{spec.column}_sample_rate").to_numpy(zero_copy_only=False)
    return frames / np.maximum(rates, 1)


def _fit(spec: Clips, length: float) -> str:
    """``length`` (frames or seconds) and the clip setting that fits it."""
    if isinstance(spec, VideoClips):
        fits = (int(length) - 1) // spec.stride + 1
        more = " (or a smaller stride)" if spec.stride > 1 else ""
        return f"{int(length)} frames: pass video_clips(..., frames={fits}) or fewer{more}"
    seconds = math.floor(length * 1000) / 1000
    return f"{length:.3f} s: pass audio_clips(..., seconds={seconds:g}) or less"


def _describe_media(inner: Source, spec: Clips, position: int) -> str:
    """Media ``position`` for a message: its Lance row, fragment and text columns (its path),
    the index's left out."""
    offsets = inner.row_offsets(np.array([position], np.int64))
    index = set(index_names(spec))
    schema = inner.dataset.schema
    text = [f.name for f in schema if pa.types.is_string(f.type) and f.name not in index][:3]
    values = inner.dataset.take(offsets.tolist(), columns=text).to_pylist()[0] if text else {}
    shown = "".join(f", {name} {value!r}" for name, value in values.items())
    return f"Lance row {int(offsets[0])} ({inner.describe_offsets(offsets)}{shown})"
