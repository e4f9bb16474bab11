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


class VideoError(ValueError):
    """A video that cannot be probed or decoded; the message names the problem and the fix."""


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


class VideoDecoder(Protocol):
    """What decodes frames: PyAV's FFmpeg (``PyAVDecoder``) today; a GPU decoder later.

    ``decode_frames(file, info, ordinals, resize, out)`` writes the frames ``ordinals`` (rising)
    of the video in ``file`` as uint8 RGB into ``out`` — ``[len, H, W, 3]`` (channels last) or
    ``[len, 3, H, W]`` (``channels_first``) — and returns it, decoding each run of GOPs from its keyframe
    (``info``) forward, after ``file.require`` of every byte it uses (so it may raise
    ``MissingBytes``).
    """

    def decode_frames(
        self,
        file: SparseFile,
        info: VideoInfo,
        ordinals: np.ndarray,
        resize: tuple[int, int] | None,
        out: np.ndarray,
        channels_first: bool = False,
    ) -> np.ndarray: ...


class _Decodes:
    """How many decodes run now in this process: what ``PyAVDecoder(threads=0)`` divides the
    cores by (two worker threads decoding at once take one FFmpeg thread each; one decoding
    alone, at the tail of an epoch or while the other waits for its bytes, takes both cores)."""

    def __init__(self) -> None:
        import threading

        self._lock, self.running = threading.Lock(), 0
        try:
            self.cores = len(os.sched_getaffinity(0))
        except AttributeError:  # not on Linux
            self.cores = os.cpu_count() or 1

    def __enter__(self) -> int:
        """Count this decode in; the FFmpeg threads it may use."""
        with self._lock:
            self.running += 1
            return max(1, self.cores // self.running)

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self.running -= 1


_DECODES = _Decodes()
# gbrp's planes in RGB order: unscaled frames of these formats are converted to planar RGB by
# swscale (bit-identical to packed rgb24: tests/test_video.py checks both formats), so a
# channels-first clip is filled with three contiguous copies per frame instead of a transposing
# copy (3x less time per frame at 480x640). Scaled, the two differ: packed, then transposed.
_RGB_PLANES = (2, 0, 1)
_PLANAR_EXACT = frozenset({"yuv420p", "yuv444p"})


@dataclass(frozen=True)
class PyAVDecoder:
    """Decodes with PyAV's bundled FFmpeg on the calling thread plus ``threads`` FFmpeg threads
    of ``thread_type``. ``threads=0`` (the default) takes the cores not taken by the other
    decodes running in this process at the time a decode starts (``cores // decodes``, at least
    one): several worker threads decoding at once run one thread each (frame threads on busy
    cores cost CPU time for nothing: single-threaded decoding took 0.85-0.9x the CPU time per
    clip), and a decode running alone (the tail of an epoch, or while the other workers wait
    for their bytes) gets the idle cores: ``"AUTO"`` (frame and slice threads) then decoded
    16-frame clips of a 360p H.264 video 1.2-1.5x faster than one thread (x264 writes one slice
    per frame, so slice threads alone run one thread); the delay frame threads add is drained
    at the end of each run of GOPs. Process workers each count their own decodes only.
    Holds nothing between calls.

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
        if isinstance(self.threads, bool) or not isinstance(self.threads, int) or self.threads < 0:
            raise ValueError(
                f"threads={self.threads!r}: pass 0 (the cores other decodes leave) or more"
            )

    def decode_frames(
        self,
        file: SparseFile,
        info: VideoInfo,
        ordinals: np.ndarray,
        resize: tuple[int, int] | None,
        out: np.ndarray,
        channels_first: bool = False,
    ) -> np.ndarray:
        with _DECODES as free:
            return self._decode(file, info, ordinals, resize, out, channels_first,
                                self.threads or free)  # fmt: skip

    def _decode(
        self,
        file: SparseFile,
        info: VideoInfo,
        ordinals: np.ndarray,
        resize: tuple[int, int] | None,
        out: np.ndarray,
        channels_first: bool,
        threads: int,
    ) -> np.ndarray:
        import av
        from av.video.reformatter import VideoReformatter

        if info.ranged:
            file.require(0, int(info.keyframe_offsets[0]))
            file.require(*info.header)  # type: ignore[misc]
        else:
            file.require(0, file.size)
        height, width = resize if resize is not None else (info.height, info.width)
        shape = (len(ordinals), 3, height, width) if channels_first else (
            len(ordinals), height, width, 3)  # fmt: skip
        if out.shape != shape or out.dtype != np.uint8:
            raise ValueError(
                f"out has shape {out.shape} and type {out.dtype}: pass a uint8 array of shape "
                f"{shape} for this clip"
            )
        reformatter = VideoReformatter()  # keeps one swscale context for the clip's frames
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
            stream.codec_context.thread_count = threads
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
                        _put_rgb(reformatter, frame, out[index], width, height, channels_first)
                        filled += 1
                    if ordinal >= run[-1]:
                        break
        if filled != len(ordinals):
            raise VideoError(
                f"the video gave {filled} of the clip's {len(ordinals)} frames: its keyframe "
                "index does not match the file; probe it again with probe_video"
            )
        return out


def _put_rgb(
    reformatter: Any, frame: Any, out: np.ndarray, width: int, height: int, channels_first: bool
) -> None:
    """``frame`` as RGB of ``height × width`` into ``out`` (``[H, W, 3]`` or ``[3, H, W]``):
    one swscale conversion (one thread: the workers keep the cores busy) and one copy. Channels
    first, unscaled from :data:`_PLANAR_EXACT`: planar RGB copied plane by plane (no transposing
    copy); otherwise packed RGB transposed into place, so the pixels are always packed rgb24's."""
    if not channels_first:
        rgb = reformatter.reformat(frame, width=width, height=height, format="rgb24", threads=1)
        out[...] = rgb.to_ndarray()
    elif frame.format.name in _PLANAR_EXACT and (frame.height, frame.width) == (height, width):
        planar = reformatter.reformat(frame, format="gbrp", threads=1)
        for channel, index in enumerate(_RGB_PLANES):
            plane = planar.planes[index]
            out[channel] = np.frombuffer(plane, np.uint8).reshape(height, plane.line_size)[
                :, :width
            ]
    else:
        rgb = reformatter.reformat(frame, width=width, height=height, format="rgb24", threads=1)
        out[...] = rgb.to_ndarray().transpose(2, 0, 1)


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
