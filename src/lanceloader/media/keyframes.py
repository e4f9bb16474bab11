"""The keyframe index of a video and the plan of a clip: pure functions, no PyAV, no Lance.

``VideoInfo`` is what :func:`lanceloader.media.video.probe_video` finds; ``index_fields``,
``index_values`` and ``info_from_row`` are its columns in a dataset (``convert`` writes them
beside a video blob column); ``clip_byte_ranges`` the bytes a clip needs. Every name here is
also importable from :mod:`lanceloader.media.video`.

Example:
    >>> info = VideoInfo(frames=20, fps=10.0, duration_s=2.0, codec="h264", width=64, height=48,
    ...     keyframes=np.array([0, 10]), keyframe_offsets=np.array([40, 5000]), header=(9000, 200))
    >>> clip_byte_ranges(info, 9200, start=12, frames=4, stride=2)
    [(0, 40), (5000, 4200)]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

__all__ = [
    "VideoInfo",
    "clean_keyframes",
    "clip_byte_ranges",
    "clip_frames",
    "gop_end",
    "gop_runs",
    "index_fields",
    "index_values",
    "info_from_row",
    "mp4_header",
]

# Top-level MP4/MOV boxes (ISO/IEC 14496-12 and QuickTime); any other first box: not MP4.
_MP4_BOXES = {
    b"ftyp", b"moov", b"mdat", b"free", b"skip", b"wide", b"pdin", b"uuid", b"meta",
    b"styp", b"sidx", b"moof", b"mfra", b"prft", b"emsg", b"pnot", b"junk",
}  # fmt: skip


@dataclass(frozen=True, eq=False)
class VideoInfo:
    """What ``probe_video`` finds, enough to plan and decode any clip.

    ``keyframes``: presentation ordinals of the keyframes a decode may start at (int64, rising,
    the first is 0); ``keyframe_offsets``: the byte offset of each one's packet (``-1`` where the
    container does not say); ``keyframe_pts``: each one's presentation timestamp in the stream's
    time base, what a decode seeks to (``None`` in an index written before they were recorded:
    a decode then aims at ``(keyframe + 0.5) / fps`` and corrects its landing); ``header``: (offset, length) of an MP4/MOV ``moov`` box, or ``None``
    where ranged reads are not possible (another container, a fragmented MP4): a clip then reads
    the whole file.

    Example:
        >>> info = VideoInfo(frames=10, fps=5.0, duration_s=2.0, codec="h264", width=64,
        ...     height=48, keyframes=np.array([0, 5]), keyframe_offsets=np.array([40, 900]),
        ...     header=(1500, 300))
        >>> info.gop_of(7)
        1
    """

    frames: int
    fps: float
    duration_s: float
    codec: str
    width: int
    height: int
    keyframes: np.ndarray
    keyframe_offsets: np.ndarray
    header: tuple[int, int] | None
    keyframe_pts: np.ndarray | None = None

    def gop_of(self, ordinal: int) -> int:
        """The index in ``keyframes`` of the keyframe at or before frame ``ordinal``."""
        return int(np.searchsorted(self.keyframes, ordinal, side="right")) - 1

    @property
    def ranged(self) -> bool:
        """Whether a clip can be decoded from byte ranges (else it needs the whole file)."""
        return self.header is not None and bool((self.keyframe_offsets >= 0).all())


def mp4_header(read_at: Any, size: int) -> tuple[int, int] | None:
    """(offset, length) of the ``moov`` box of an MP4/MOV file of ``size`` bytes, walking its
    top-level boxes through ``read_at(offset, n) -> bytes``; ``None`` when the file is not MP4,
    has no ``moov`` or is fragmented (``moof``: its index is spread through the file).

    Example:
        >>> box = lambda kind, n: (8 + n).to_bytes(4, "big") + kind + bytes(n)
        >>> data = box(b"ftyp", 8) + box(b"mdat", 100) + box(b"moov", 20)
        >>> mp4_header(lambda offset, n: data[offset : offset + n], len(data))
        (124, 28)
    """
    offset, moov = 0, None
    while offset + 8 <= size:
        head = read_at(offset, 16)
        length, kind = int.from_bytes(head[:4], "big"), head[4:8]
        if offset == 0 and kind not in _MP4_BOXES:
            return None
        if length == 1:
            length = int.from_bytes(head[8:16], "big")
        elif length == 0:
            length = size - offset
        if length < 8 or not kind.isascii():
            return None
        if kind == b"moof":
            return None
        if kind == b"moov":
            moov = (offset, min(length, size - offset))
        offset += length
    return moov


def clean_keyframes(
    pts: np.ndarray, positions: np.ndarray, keys: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Keyframes (presentation ordinal, byte offset) that a decode can start at: no later packet
    in decode order is shown before them. Arrays are in decode order."""
    ordinal = np.empty(len(pts), dtype=np.int64)
    ordinal[np.argsort(pts, kind="stable")] = np.arange(len(pts))
    later_min = np.minimum.accumulate(ordinal[::-1])[::-1]  # min ordinal from here on
    after = np.append(later_min[1:], np.iinfo(np.int64).max)
    clean = keys & (after > ordinal)
    clean[0] = True  # decoding starts at the first packet whatever its flags say
    chosen = np.flatnonzero(clean)
    order = np.argsort(ordinal[chosen], kind="stable")
    return ordinal[chosen][order].astype(np.int64), positions[chosen][order].astype(np.int64)


# ---- the index as columns -------------------------------------------------------------------


def index_fields(column: str) -> list[pa.Field]:
    """The columns ``convert`` writes beside the video blob column ``column``.

    Example:
        >>> [field.name for field in index_fields("video")][:3]
        ['video_frames', 'video_fps', 'video_duration']
    """
    return [
        pa.field(f"{column}_frames", pa.int64()),
        pa.field(f"{column}_fps", pa.float64()),
        pa.field(f"{column}_duration", pa.float64()),
        pa.field(f"{column}_codec", pa.string()),
        pa.field(f"{column}_width", pa.int32()),
        pa.field(f"{column}_height", pa.int32()),
        pa.field(f"{column}_keyframes", pa.list_(pa.int64())),
        pa.field(f"{column}_keyframe_offsets", pa.list_(pa.int64())),
        pa.field(f"{column}_header_offset", pa.int64()),
        pa.field(f"{column}_header_length", pa.int64()),
        pa.field(f"{column}_keyframe_pts", pa.list_(pa.int64())),
    ]


def index_values(info: VideoInfo, column: str = "video") -> dict[str, Any]:
    """``info`` as one row of ``index_fields(column)``: plain Python values (``header`` ``None``
    becomes nulls).

    Example:
        >>> info = VideoInfo(10, 5.0, 2.0, "h264", 64, 48, np.array([0, 5]), np.array([40, 900]),
        ...     None)
        >>> index_values(info)["video_keyframes"], index_values(info)["video_header_offset"]
        ([0, 5], None)
    """
    offset, length = info.header if info.header is not None else (None, None)
    return {
        f"{column}_frames": info.frames,
        f"{column}_fps": info.fps,
        f"{column}_duration": info.duration_s,
        f"{column}_codec": info.codec,
        f"{column}_width": info.width,
        f"{column}_height": info.height,
        f"{column}_keyframes": info.keyframes.tolist(),
        f"{column}_keyframe_offsets": info.keyframe_offsets.tolist(),
        f"{column}_header_offset": offset,
        f"{column}_header_length": length,
        f"{column}_keyframe_pts": None if info.keyframe_pts is None else info.keyframe_pts.tolist(),
    }


def info_from_row(row: dict[str, Any], column: str = "video") -> VideoInfo:
    """The inverse of ``index_values``: a ``VideoInfo`` from a row holding the index columns.

    Example:
        >>> info = VideoInfo(10, 5.0, 2.0, "h264", 64, 48, np.array([0, 5]), np.array([40, 900]),
        ...     (1000, 64))
        >>> info_from_row(index_values(info)).header
        (1000, 64)
    """
    optional = {f"{column}_keyframe_pts"}  # not in indexes written before it was recorded
    missing = [f.name for f in index_fields(column) if f.name not in row and f.name not in optional]
    if missing:
        raise KeyError(
            f"the row lacks the video index columns {missing}: write the dataset with "
            "lanceloader.convert, or probe the video with probe_video"
        )
    offset, length = row[f"{column}_header_offset"], row[f"{column}_header_length"]
    pts = row.get(f"{column}_keyframe_pts")
    return VideoInfo(
        frames=int(row[f"{column}_frames"]),
        fps=float(row[f"{column}_fps"]),
        duration_s=float(row[f"{column}_duration"]),
        codec=str(row[f"{column}_codec"]),
        width=int(row[f"{column}_width"]),
        height=int(row[f"{column}_height"]),
        keyframes=np.asarray(row[f"{column}_keyframes"], dtype=np.int64),
        keyframe_offsets=np.asarray(row[f"{column}_keyframe_offsets"], dtype=np.int64),
        header=None if offset is None else (int(offset), int(length)),
        keyframe_pts=None if pts is None else np.asarray(pts, dtype=np.int64),
    )


# ---- planning a clip ------------------------------------------------------------------------


def clip_frames(info: VideoInfo, start: int, frames: int, stride: int) -> np.ndarray:
    """The frame ordinals of a clip (int64), checked against the video's length.

    Example:
        >>> info = VideoInfo(10, 5.0, 2.0, "h264", 64, 48, np.array([0, 5]), np.array([40, 900]),
        ...     None)
        >>> clip_frames(info, 1, 3, 4).tolist()
        [1, 5, 9]
    """
    for name, value, low in (("start", start, 0), ("frames", frames, 1), ("stride", stride, 1)):
        if not isinstance(value, (int, np.integer)) or value < low:
            raise ValueError(f"{name}={value!r}: pass an integer ≥ {low}")
    last = start + (frames - 1) * stride
    if last >= info.frames:
        raise ValueError(
            f"a clip of {frames} frames from frame {start} at stride {stride} ends at frame "
            f"{last}, past the video's {info.frames} frames: start at most "
            f"{info.frames - 1 - (frames - 1) * stride}"
        )
    return start + stride * np.arange(frames, dtype=np.int64)


def gop_runs(info: VideoInfo, ordinals: np.ndarray) -> list[tuple[int, int]]:
    """Runs (first GOP, last GOP) of consecutive GOPs holding the ordinals."""
    gops = np.unique(np.searchsorted(info.keyframes, ordinals, side="right") - 1)
    runs: list[tuple[int, int]] = []
    for gop in gops.tolist():
        if runs and runs[-1][1] + 1 == gop:
            runs[-1] = (runs[-1][0], gop)
        else:
            runs.append((gop, gop))
    return runs


def gop_end(info: VideoInfo, gop: int, size: int) -> int:
    """Where GOP ``gop``'s bytes end: the next keyframe's packet, else the end of the media data
    (the ``moov`` box when it follows the data, else the file's end)."""
    if gop + 1 < len(info.keyframe_offsets):
        return int(info.keyframe_offsets[gop + 1])
    if info.header is not None and info.header[0] > info.keyframe_offsets[gop]:
        return info.header[0]
    return size


def _merge(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted (offset, length) ranges with overlapping or touching ones joined."""
    merged: list[list[int]] = []
    for offset, length in sorted(r for r in ranges if r[1] > 0):
        if merged and offset <= merged[-1][0] + merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], offset + length - merged[-1][0])
        else:
            merged.append([offset, length])
    return [(offset, length) for offset, length in merged]


def clip_byte_ranges(
    info: VideoInfo, size: int, start: int, frames: int, stride: int = 1
) -> list[tuple[int, int]]:
    """The (offset, length) ranges, sorted and disjoint, that decoding a clip needs from a file of
    ``size`` bytes: the file's head up to its first frame (MP4: ``ftyp``, and ``moov`` when it
    comes first), the ``moov`` box, and each run of GOPs holding the clip's frames (a GOP with none
    of them, at a long stride, is skipped). Without ranged reads (``info.header`` is ``None``):
    the whole file.

    Example:
        >>> info = VideoInfo(10, 5.0, 2.0, "h264", 64, 48, np.array([0, 5]), np.array([40, 900]),
        ...     (1500, 300))
        >>> clip_byte_ranges(info, 1800, start=6, frames=2, stride=1)
        [(0, 40), (900, 900)]
    """
    ordinals = clip_frames(info, start, frames, stride)
    if not info.ranged:
        return [(0, size)]
    ranges = [(0, int(info.keyframe_offsets[0])), info.header]
    for first, last in gop_runs(info, ordinals):
        offset = int(info.keyframe_offsets[first])
        ranges.append((offset, gop_end(info, last, size) - offset))
    return _merge(ranges)
