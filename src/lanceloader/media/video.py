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
in :mod:`lanceloader.media.keyframes`, imported here; probing and decoding use PyAV (imported
when first called), behind a small ``VideoDecoder`` protocol that leaves room for another
decoder (a GPU one).

What "frame-accurate" assumes: frame *i* is the *i*-th frame in presentation order (as
``decode_whole``, a plain decode of the whole file, numbers them). A decode starts at a keyframe
whose ordinal the index records and counts the frames the decoder returns from there, so it does
not depend on a constant frame rate. The index keeps only keyframes a decode can start from and
stop before: no frame after one in decode order is shown before it (closed GOPs; an open GOP's
keyframe is left out of the index, so its clips read the GOP before it too). The seek itself
aims at the middle between a keyframe's and the next frame's time at the average rate, so a
strongly variable frame rate can land on another keyframe: an earlier one costs a
``MissingBytes`` retry, a later one raises ``VideoError``.

Memory: one decode holds the parts it is given, PyAV's 32 KiB read buffer, the decoder's reference
frames (at most 16 + its threads, each ``width × height × 1.5`` bytes for 4:2:0) and the output
(``frames × height × width × 3`` bytes). Nothing is kept between calls.

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

import bisect
import io
import os
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from lanceloader.media.keyframes import (
    VideoInfo,
    clean_keyframes,
    clip_byte_ranges,
    clip_frames,
    gop_end,
    gop_runs,
    index_fields,
    index_values,
    info_from_row,
    mp4_header,
)

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


class VideoError(ValueError):
    """A video that cannot be probed or decoded; the message names the problem and the fix."""


class MissingBytes(Exception):
    """A decode needed bytes ``[offset, offset + length)`` that are not in its parts.

    Read them (``clip_byte_ranges`` lists what a clip needs; a video whose index does not match
    the file can need more) and call again with them added.

    Example:
        >>> MissingBytes(100, 20)
        MissingBytes(offset=100, length=20)
    """

    def __init__(self, offset: int, length: int) -> None:
        super().__init__(offset, length)
        self.offset, self.length = offset, length

    def __str__(self) -> str:
        return (
            f"bytes [{self.offset}, {self.offset + self.length}) of the video are not in the "
            "parts given: read them and decode again with them added"
        )

    def __repr__(self) -> str:
        return f"MissingBytes(offset={self.offset}, length={self.length})"


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
    )


# ---- decoding -------------------------------------------------------------------------------


class SparseFile(io.RawIOBase):
    r"""A read-only, seekable file of ``size`` bytes of which only ``parts`` are present.

    Reads never fail: a gap reads as zeros. That is on purpose: FFmpeg's reader, asked to seek less
    than ~32 KiB ahead, reads forward through the bytes instead, so it reads gaps it then skips.
    What a decoder *uses* is checked with ``require`` first, which raises ``MissingBytes`` for any
    byte not present: so a missing byte is asked for, never decoded as a zero.

    Example:
        >>> file = SparseFile([(0, b"abc"), (10, b"xyz")], size=20)
        >>> file.read(5), file.read(2), file.seek(11), file.read(8)
        (b'abc', b'\x00\x00', 11, b'yz')
        >>> file.require(0, 3)
        >>> file.require(2, 10)
        Traceback (most recent call last):
        ...
        lanceloader.media.video.MissingBytes: bytes [3, 10) of the video are not in the parts given: read them and decode again with them added
    """

    def __init__(self, parts: list[tuple[int, bytes]], size: int) -> None:
        super().__init__()
        self._parts = sorted((int(offset), bytes(data)) for offset, data in parts)
        for (offset, data), (after, _) in zip(self._parts, self._parts[1:], strict=False):
            if offset + len(data) > after:
                raise ValueError(
                    f"parts at bytes {offset} and {after} overlap: pass disjoint parts"
                )
        if self._parts and self._parts[-1][0] + len(self._parts[-1][1]) > size:
            raise ValueError(f"a part runs past size={size}: pass the file's size in bytes")
        self._starts = [offset for offset, _ in self._parts]
        self.size, self._position = size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self.size}[whence]
        self._position = max(base + offset, 0)
        return self._position

    def _part_at(self, position: int) -> tuple[int, int]:
        """(start, end) of the part holding ``position``, or of the gap there (start < 0)."""
        index = bisect.bisect_right(self._starts, position) - 1
        if index >= 0 and position < self._starts[index] + len(self._parts[index][1]):
            return self._starts[index], self._starts[index] + len(self._parts[index][1])
        following = self._starts[index + 1] if index + 1 < len(self._starts) else self.size
        return -1, following

    def read(self, n: int = -1) -> bytes:
        position = self._position
        if position >= self.size:
            return b""
        n = self.size - position if n is None or n < 0 else min(n, self.size - position)
        start, end = self._part_at(position)
        if start < 0:
            chunk = bytes(min(n, end - position))
        else:
            data = self._parts[bisect.bisect_right(self._starts, position) - 1][1]
            chunk = data[position - start : position - start + n]
        self._position += len(chunk)
        return chunk

    def readinto(self, buffer: Any) -> int:
        chunk = self.read(len(buffer))
        buffer[: len(chunk)] = chunk
        return len(chunk)

    def require(self, offset: int, length: int) -> None:
        """Raise ``MissingBytes`` for the first missing run of bytes in ``[offset, offset + length)``."""
        position, end = offset, min(offset + length, self.size)
        while position < end:
            start, stop = self._part_at(position)
            if start < 0:
                raise MissingBytes(position, min(stop, end) - position)
            position = stop


class VideoDecoder(Protocol):
    """What decodes frames: PyAV's FFmpeg (``PyAVDecoder``) today; a GPU decoder later.

    ``decode_frames(file, info, ordinals, resize)`` returns the frames ``ordinals`` (rising) of the
    video in ``file`` as uint8 RGB [len, H, W, 3], decoding each run of GOPs from its keyframe
    (``info``) forward, after ``file.require`` of every byte it uses (so it may raise
    ``MissingBytes``).
    """

    def decode_frames(
        self,
        file: SparseFile,
        info: VideoInfo,
        ordinals: np.ndarray,
        resize: tuple[int, int] | None,
    ) -> np.ndarray: ...


@dataclass(frozen=True)
class PyAVDecoder:
    """Decodes with PyAV's bundled FFmpeg on the calling thread plus ``threads`` FFmpeg threads
    (0: one per core) of ``thread_type``. ``"AUTO"`` (frame and slice threads) is the default:
    x264 writes one slice per frame, so slice threads alone run one thread, while frame threads
    decoded 16-frame clips of a 360p H.264 video 1.2-1.5x faster than one thread (medians of 5
    runs, two runs, on 2 shared cores); the delay frame threads add is drained at the end of
    each run of GOPs. With several decoding workers,
    ``threads=1`` avoids oversubscribing the cores. Holds nothing between calls.

    Example:
        >>> PyAVDecoder().thread_type, PyAVDecoder(threads=1).threads
        ('AUTO', 1)
        >>> PyAVDecoder("fast")
        Traceback (most recent call last):
        ...
        ValueError: thread_type='fast': pass 'AUTO', 'FRAME', 'SLICE' or 'NONE'
    """

    thread_type: str = "AUTO"
    threads: int = 0

    def __post_init__(self) -> None:
        if self.thread_type not in ("AUTO", "FRAME", "SLICE", "NONE"):
            raise ValueError(
                f"thread_type={self.thread_type!r}: pass 'AUTO', 'FRAME', 'SLICE' or 'NONE'"
            )
        if not isinstance(self.threads, int) or self.threads < 0:
            raise ValueError(f"threads={self.threads!r}: pass 0 (one per core) or more")

    def decode_frames(
        self,
        file: SparseFile,
        info: VideoInfo,
        ordinals: np.ndarray,
        resize: tuple[int, int] | None,
    ) -> np.ndarray:
        import av

        if info.ranged:
            file.require(0, int(info.keyframe_offsets[0]))
            file.require(*info.header)  # type: ignore[misc]
        else:
            file.require(0, file.size)
        height, width = resize if resize is not None else (info.height, info.width)
        out = np.empty((len(ordinals), height, width, 3), dtype=np.uint8)
        filled = 0
        wanted = {int(o): i for i, o in enumerate(ordinals)}
        seekable = bool((info.keyframe_offsets >= 0).all())
        runs = gop_runs(info, ordinals) if seekable else [(0, len(info.keyframes) - 1)]
        gops = np.searchsorted(info.keyframes, ordinals, side="right") - 1
        try:
            # Opening reads on past the head for stream information (FFmpeg's
            # find_stream_info); the limits keep that to one packet, from a gap: zeros, unused.
            container = av.open(
                file,
                mode="r",
                buffer_size=32768,
                options={"probesize": "32", "analyzeduration": "1"},
            )
        except av.error.FFmpegError as error:
            raise VideoError(
                f"the video cannot be opened ({error}); the file is damaged"
            ) from error
        with container:
            stream = container.streams.video[0]
            for other in container.streams:
                if other is not stream:
                    other.discard = av.stream.Discard.all
            stream.codec_context.thread_type = self.thread_type
            stream.codec_context.thread_count = self.threads
            for number, (first, last) in enumerate(runs):
                keyframe = int(info.keyframes[first])
                if number or keyframe:
                    stream.codec_context.flush_buffers()
                    container.seek(_seek_target(stream, info, keyframe), stream=stream)
                run = ordinals[(gops >= first) & (gops <= last)]
                end = gop_end(info, last, file.size) if info.ranged else file.size
                frames = _run_frames(container, stream, file, info, end, seeked=number or keyframe)
                for count, (ordinal, frame) in enumerate(frames):
                    if count == 0 and ordinal > run[0]:
                        raise VideoError(
                            f"seeking landed on frame {ordinal}, after the clip's frame {run[0]}: "
                            "the frame rate varies too much for the index; decode the whole file"
                        )
                    index = wanted.get(ordinal)
                    if index is not None:
                        out[index] = frame.to_ndarray(format="rgb24", width=width, height=height)
                        filled += 1
                    if ordinal >= run[-1]:
                        break
        if filled != len(ordinals):
            raise VideoError(
                f"the video gave {filled} of the clip's {len(ordinals)} frames: its keyframe "
                "index does not match the file; probe it again with probe_video"
            )
        return out


def _seek_target(stream: Any, info: VideoInfo, keyframe: int) -> int:
    """A timestamp (stream time base) between keyframe ``keyframe`` and the frame after it."""
    start = stream.start_time or 0
    return start + round((keyframe + 0.5) / info.fps / float(stream.time_base))


def _run_frames(
    container: Any, stream: Any, file: SparseFile, info: VideoInfo, end: int, seeked: int
) -> Any:
    """(ordinal, frame) in presentation order from the current place to the packet at byte
    ``end`` (then the decoder is drained). Every packet's bytes are ``require``d before they are
    decoded. After a seek the first packet's offset names the keyframe (its ordinal in ``info``)."""
    import av

    ordinal = None if seeked else 0
    try:
        for packet in container.demux(stream):
            done = packet.size == 0 or (packet.pos is not None and packet.pos >= end)
            if done:
                frames = stream.codec_context.decode(None)
            else:
                if packet.pos is not None and packet.pos >= 0:
                    file.require(packet.pos, packet.size)
                if ordinal is None:
                    ordinal = _landed(info, packet.pos)
                frames = packet.decode()
            for frame in frames:
                yield ordinal, frame
                ordinal += 1  # type: ignore[operator]
            if done:
                return
    except av.error.FFmpegError as error:
        raise VideoError(f"the video cannot be decoded ({error}); the file is damaged") from error


def _landed(info: VideoInfo, position: int | None) -> int:
    """The ordinal of the keyframe whose packet is at byte ``position``."""
    found = np.flatnonzero(info.keyframe_offsets == (-1 if position is None else position))
    if len(found) == 0:
        raise VideoError(
            f"decoding started at byte {position}, which is no keyframe in the index: the index "
            "does not match the file; probe it again with probe_video"
        )
    return int(info.keyframes[found[0]])


def decode_clip(
    parts: list[tuple[int, bytes]],
    size: int,
    info: VideoInfo,
    start: int,
    frames: int,
    stride: int = 1,
    resize: tuple[int, int] | None = None,
    decoder: VideoDecoder | None = None,
) -> np.ndarray:
    """Frames ``start, start + stride, …`` (``frames`` of them) as uint8 RGB ``[frames, H, W, 3]``
    (``resize=(h, w)``: scaled by FFmpeg's swscale), decoded from only ``parts`` — (offset,
    bytes) pieces of a ``size``-byte file, normally those ``clip_byte_ranges`` names.

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
    """
    ordinals = clip_frames(info, start, frames, stride)
    if resize is not None and (
        len(resize) != 2 or not all(isinstance(v, (int, np.integer)) and v > 0 for v in resize)
    ):
        raise ValueError(f"resize={resize!r}: pass (height, width), two positive integers")
    return (decoder or PyAVDecoder()).decode_frames(SparseFile(parts, size), info, ordinals, resize)


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
