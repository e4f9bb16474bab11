"""Video: probe a file's keyframe index, and decode a clip frame-accurately from its byte ranges.

The flow for one clip (pure functions; the caller does the I/O, e.g. from a Lance blob column):

1. ``probe_video(data)`` (once per video; ``lanceloader.convert`` stores the result as columns,
   ``index_fields``/``index_values``/``info_from_row``): frame count, rate, codec, size, the
   keyframes (presentation ordinals) and the byte offset of each one's packet, and where an
   MP4/MOV file keeps its index (the ``moov`` box). Demuxing only, no decoding.
2. ``clip_byte_ranges(info, size, start, frames, stride)``: the (offset, length) ranges the clip
   needs: the file's head and ``moov`` box, and the GOPs that hold the clip's frames.
3. ``decode_clip(parts, size, info, start, frames, stride)``: decodes from only those parts. A
   byte it needs outside them raises ``MissingBytes(offset, length)``, which the caller can
   serve and retry: a missing byte is never decoded as a zero.

The index and the plan (``VideoInfo``, the index columns, ``clip_byte_ranges``) are pure and live
in :mod:`lanceloader.media.keyframes`; the decoding (``VideoDecoder``, ``PyAVDecoder``: seeking
to a keyframe and counting frames from it) in :mod:`lanceloader.media.decoder`; every name is
importable here. PyAV is imported when first called.

What "frame-accurate" assumes: frame *i* is the *i*-th frame in presentation order (as
``decode_whole``, a plain decode of the whole file, numbers them). A decode seeks to a keyframe
by its presentation timestamp (the probe records each one's), checks by the packet's byte
offset that it landed there (reading on from an earlier packet, seeking again before a later
one), and counts the frames the decoder returns from that keyframe's ordinal: so clips are
exact at a variable frame rate, with B-frames, a first timestamp other than 0, audio as the
first stream, the ``moov`` box at the end, and any pixel format FFmpeg converts to RGB. The
index keeps only keyframes a decode can start from and stop before: no frame after one in
decode order is shown before it (closed GOPs; an open GOP's keyframe is left out of the index,
so its clips read the GOP before it too). A rotation (a display matrix: phones) is not
applied: frames come as coded, as a plain PyAV decode gives them. A fragmented MP4 and
containers other than MP4/MOV are read whole.

Memory: one decode holds the parts it is given, PyAV's 32 KiB read buffer, the decoder's reference
frames (at most 16 + its threads, each ``width × height × 1.5`` bytes for 4:2:0), one converted
frame, and the output (``frames × height × width × 3`` bytes; ``decode_clip(out=...)`` writes
into the caller's, e.g. the clip's place in a batch, channels last or first). Nothing is kept
between calls.

Threads: a decode takes the cores the other decodes running in the process leave
(``PyAVDecoder``), so worker threads that each decode do not oversubscribe the cores.

Example:
    >>> import tempfile, pathlib, sys
    >>> sys.path.insert(0, "tests")
    >>> from mediagen import write_video, frame_index_of
    >>> path = write_video(pathlib.Path(tempfile.mkdtemp()) / "v.mp4", 24, 12, (48, 64), gop=6)
    >>> data = path.read_bytes()
    >>> info = probe_video(data)
    >>> info.frames, info.keyframes.tolist()
    (24, [0, 6, 12, 18])
    >>> ranges = clip_byte_ranges(info, len(data), start=7, frames=3, stride=2)
    >>> parts = [(offset, data[offset : offset + length]) for offset, length in ranges]
    >>> clip = decode_clip(parts, len(data), info, start=7, frames=3, stride=2)
    >>> clip.shape, [frame_index_of(frame) for frame in clip]
    ((3, 48, 64, 3), [7, 9, 11])
"""

from __future__ import annotations

import io
import os
from typing import Any

import numpy as np

from lanceloader.media.decoder import PyAVDecoder, VideoDecoder, VideoError
from lanceloader.media.keyframes import (
    VideoInfo,
    clean_keyframes,
    clip_byte_ranges,
    clip_frames,
    index_fields,
    index_values,
    info_from_row,
    mp4_header,
)
from lanceloader.media.sparse import MissingBytes, SparseFile

__all__ = [
    "MissingBytes",
    "PyAVDecoder",
    "SparseFile",
    "VideoDecoder",
    "VideoError",
    "VideoInfo",
    "clip_byte_ranges",
    "clip_frames",
    "decode_clip",
    "decode_whole",
    "index_fields",
    "index_values",
    "info_from_row",
    "mp4_header",
    "probe_video",
]


# ---- probing --------------------------------------------------------------------------------


def _open_input(data: bytes | os.PathLike | str) -> tuple[Any, int, Any]:
    """(what av.open takes, size in bytes, read_at) for bytes or a path."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        view = bytes(data)
        return io.BytesIO(view), len(view), lambda offset, n: view[offset : offset + n]
    path = os.fspath(data)
    size = os.path.getsize(path)

    def read_at(offset: int, n: int) -> bytes:
        with open(path, "rb") as file:
            file.seek(offset)
            return file.read(n)

    return path, size, read_at


def probe_video(data: bytes | os.PathLike | str) -> VideoInfo:
    """Probe a video (its bytes or a path) by demuxing its first video stream (no decoding).

    Raises ``VideoError`` naming the problem for a file that is not a readable video, has no
    video stream, or whose packets run past its end (a truncated file).

    Example:
        >>> import tempfile, pathlib, sys
        >>> sys.path.insert(0, "tests")
        >>> from mediagen import write_video
        >>> info = probe_video(write_video(pathlib.Path(tempfile.mkdtemp()) / "v.mp4", 10, 5,
        ...     (48, 64), gop=5))
        >>> info.frames, info.fps, info.codec, (info.height, info.width), info.header is not None
        (10, 5.0, 'h264', (48, 64), True)
    """
    import av

    source, size, read_at = _open_input(data)
    name = "the video" if isinstance(source, io.BytesIO) else repr(source)
    try:
        container = av.open(source)
    except (av.error.FFmpegError, ValueError) as error:
        raise VideoError(
            f"{name} is not a readable video ({error}); check that the file is complete and in "
            "a container FFmpeg reads (MP4, MOV, MKV, WebM, AVI, …)"
        ) from error
    with container:
        if not container.streams.video:
            raise VideoError(f"{name} has no video stream; pass video files only")
        stream = container.streams.video[0]
        for other in container.streams:
            if other is not stream:
                other.discard = av.stream.Discard.all
        pts, positions, keys, demuxed = [], [], [], 0
        try:
            for packet in container.demux(stream):
                demuxed += packet.size > 0
                if packet.size == 0 or packet.is_discard:
                    continue
                if packet.pts is None:
                    raise VideoError(f"{name} has a packet without a timestamp; remux it")
                if packet.pos is not None and packet.pos >= 0 and packet.pos + packet.size > size:
                    raise VideoError(
                        f"{name} is truncated: a packet at byte {packet.pos} runs past the end "
                        f"of the file ({size} bytes); copy the whole file again"
                    )
                pts.append(packet.pts)
                positions.append(-1 if packet.pos is None else packet.pos)
                keys.append(packet.is_keyframe)
        except av.error.FFmpegError as error:
            raise VideoError(f"{name} cannot be demuxed ({error}); the file is damaged") from error
        if not pts:
            raise VideoError(f"{name} has a video stream with no frames")
        if stream.frames and demuxed < stream.frames:
            raise VideoError(
                f"{name} is truncated: it holds {demuxed} of the {stream.frames} frames its "
                "index lists; copy the whole file again"
            )
        codec = stream.codec_context.name
        width, height = stream.codec_context.width, stream.codec_context.height
        rate = stream.average_rate or stream.guessed_rate
        time_base = stream.time_base
    keyframes, offsets = clean_keyframes(np.array(pts), np.array(positions), np.array(keys))
    keyframe_pts = np.sort(np.array(pts, dtype=np.int64))[keyframes]  # ordinal: rank by pts
    frames = len(pts)
    fps = float(rate) if rate else 0.0
    span = (max(pts) - min(pts)) * float(time_base) if time_base else 0.0
    if fps <= 0:
        fps = (frames - 1) / span if span > 0 else 1.0
    header = mp4_header(read_at, size)
    return VideoInfo(
        frames=frames,
        fps=fps,
        duration_s=frames / fps,
        codec=codec,
        width=width,
        height=height,
        keyframes=keyframes,
        keyframe_offsets=offsets,
        header=header,
        keyframe_pts=keyframe_pts,
    )


def decode_clip(
    parts: list[tuple[int, bytes]],
    size: int,
    info: VideoInfo,
    start: int,
    frames: int,
    stride: int = 1,
    resize: tuple[int, int] | None = None,
    decoder: VideoDecoder | None = None,
    *,
    out: np.ndarray | None = None,
    channels_first: bool = False,
) -> np.ndarray:
    """Frames ``start, start + stride, …`` (``frames`` of them) as uint8 RGB ``[frames, H, W, 3]``
    (``channels_first``: ``[frames, 3, H, W]``; ``resize=(h, w)``: scaled by FFmpeg's
    swscale), decoded from only ``parts`` — (offset, bytes) pieces of a ``size``-byte file,
    normally those ``clip_byte_ranges`` names. ``out``: an array of that shape to decode into
    (a clip's place in a batch: no copy after the colour conversion), else a new one.

    Raises ``MissingBytes(offset, length)`` when the decode needs bytes not given (read them and
    call again), ``VideoError`` for a damaged file or an index that does not match it.

    Example:
        >>> import tempfile, pathlib, sys
        >>> sys.path.insert(0, "tests")
        >>> from mediagen import write_video
        >>> data = write_video(pathlib.Path(tempfile.mkdtemp()) / "v.mp4", 12, 6, (48, 64),
        ...     gop=4).read_bytes()
        >>> decode_clip([(0, data)], len(data), probe_video(data), 5, 2, resize=(24, 32)).shape
        (2, 24, 32, 3)
        >>> batch = np.zeros((4, 2, 3, 48, 64), np.uint8)  # [N, F, C, H, W]: clip 1 goes in place
        >>> clip = decode_clip([(0, data)], len(data), probe_video(data), 5, 2, out=batch[1],
        ...     channels_first=True)
        >>> np.shares_memory(clip, batch), bool(batch[1].any()), bool(batch[0].any())
        (True, True, False)
    """
    ordinals = clip_frames(info, start, frames, stride)
    if resize is not None and (
        len(resize) != 2 or not all(isinstance(v, (int, np.integer)) and v > 0 for v in resize)
    ):
        raise ValueError(f"resize={resize!r}: pass (height, width), two positive integers")
    if out is None:
        height, width = resize if resize is not None else (info.height, info.width)
        shape = (frames, 3, height, width) if channels_first else (frames, height, width, 3)
        out = np.empty(shape, np.uint8)
    return (decoder or PyAVDecoder()).decode_frames(
        SparseFile(parts, size), info, ordinals, resize, out, channels_first
    )


def decode_whole(
    data: bytes | os.PathLike | str,
    start: int,
    frames: int,
    stride: int = 1,
    resize: tuple[int, int] | None = None,
) -> np.ndarray:
    """The reference decode: every frame of the whole file in presentation order, no seeking,
    keeping frames ``start, start + stride, …`` (``frames`` of them) as ``[frames, H, W, 3]``.

    Example:
        >>> import tempfile, pathlib, sys
        >>> sys.path.insert(0, "tests")
        >>> from mediagen import write_video, frame_index_of
        >>> path = write_video(pathlib.Path(tempfile.mkdtemp()) / "v.mkv", 8, 4, (48, 64), gop=4)
        >>> [frame_index_of(frame) for frame in decode_whole(path, 1, 3, 3)]
        [1, 4, 7]
    """
    import av

    source, _, _ = _open_input(data)
    wanted = {start + stride * i: i for i in range(frames)}
    out: list[np.ndarray | None] = [None] * frames
    with av.open(source) as container:
        stream = container.streams.video[0]
        for ordinal, frame in enumerate(container.decode(stream)):
            index = wanted.get(ordinal)
            if index is not None:
                height, width = resize if resize is not None else (frame.height, frame.width)
                out[index] = frame.to_ndarray(format="rgb24", width=width, height=height)
            if ordinal >= max(wanted):
                break
    if any(frame is None for frame in out):
        raise ValueError(
            f"the clip ends at frame {max(wanted)}, past the video's last frame: start earlier"
        )
    return np.stack(out)  # type: ignore[arg-type]
