"""Decoding a clip's frames from a sparse file: the ``VideoDecoder`` protocol and PyAV's.

:func:`lanceloader.media.video.decode_clip` calls a decoder; this module is how PyAV's does it.
For each run of GOPs holding the clip's frames it seeks to the run's keyframe by its
presentation timestamp (``VideoInfo.keyframe_pts``, the probe's; an index without them, from
a dataset converted before they were recorded, aims at ``(keyframe + 0.5) / fps``), then
checks where the demuxer landed by the packet's byte offset: on the keyframe's packet it
decodes; on an earlier packet (an MP4 demuxer seeks on decode times, which a variable frame
rate with B-frames moves away from the presentation times) it reads on, without decoding or
needing those packets' bytes, to the keyframe; past it, it seeks to the keyframe before, and
so on back to the first. So a clip never depends on a constant frame rate: frame *i* is the
*i*-th frame the decoder returns from the keyframe of ordinal *k*, counted from *k*.

Every packet decoded is ``require``d from the :class:`~lanceloader.media.sparse.SparseFile`
first (``MissingBytes`` for a byte not given). Nothing is kept between calls.

Example:
    >>> PyAVDecoder().thread_type
    'AUTO'
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from lanceloader.media.keyframes import VideoInfo, gop_end, gop_runs
from lanceloader.media.sparse import SparseFile

__all__ = ["PyAVDecoder", "VideoDecoder", "VideoError"]


class VideoError(ValueError):
    """A video that cannot be probed or decoded; the message names the problem and the fix."""


class VideoDecoder(Protocol):
    """What decodes frames: PyAV's FFmpeg (``PyAVDecoder``) today; a GPU decoder later.

    ``decode_frames(file, info, ordinals, resize, out)`` writes the frames ``ordinals`` (rising)
    of the video in ``file`` as uint8 RGB into ``out`` — ``[len, H, W, 3]`` (channels last) or
    ``[len, 3, H, W]`` (``channels_first``) — and returns it, decoding each run of GOPs from its
    keyframe (``info``) forward, after ``file.require`` of every byte it uses (so it may raise
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
# swscale (bit-identical to packed rgb24: tests/media/test_video.py checks both formats), so a
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
    cores cost CPU time for nothing), and a decode running alone (the tail of an epoch, or while
    the other workers wait for their bytes) gets the idle cores, with ``"AUTO"`` (frame and
    slice threads: x264 writes one slice per frame, so slice threads alone run one thread)
    (docs/performance.md, "Video decoding threads"); the delay frame threads add is drained
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
        with _open_sparse(file) as container:
            stream = container.streams.video[0]
            stream.codec_context.thread_type = self.thread_type
            stream.codec_context.thread_count = threads
            for number, (first, last) in enumerate(runs):
                keyframe = int(info.keyframes[first])
                packets = (
                    _seek_to(container, stream, info, first)
                    if number or keyframe
                    else container.demux(stream)
                )
                run = ordinals[(gops >= first) & (gops <= last)]
                end = gop_end(info, last, file.size) if info.ranged else file.size
                for ordinal, frame in _run_frames(packets, stream, file, end, keyframe):
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


def _open_sparse(file: SparseFile) -> Any:
    """PyAV's container of ``file``, its streams other than the first video one discarded."""
    import av

    try:
        # Opening reads on past the head for stream information (FFmpeg's find_stream_info);
        # the limits keep that to one packet, from a gap: zeros, unused.
        container = av.open(
            file, mode="r", buffer_size=32768, options={"probesize": "32", "analyzeduration": "1"}
        )
    except av.error.FFmpegError as error:
        raise VideoError(f"the video cannot be opened ({error}); the file is damaged") from error
    stream = container.streams.video[0]
    for other in container.streams:
        if other is not stream:
            other.discard = av.stream.Discard.all
    return container


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


def _seek_target(stream: Any, info: VideoInfo, gop: int) -> int:
    """The timestamp (stream time base) to seek to for keyframe ``gop``: its presentation
    timestamp from the probe, else (an index without them) the middle between it and the next
    frame at the average rate."""
    if info.keyframe_pts is not None:
        return int(info.keyframe_pts[gop])
    keyframe = int(info.keyframes[gop])
    return (stream.start_time or 0) + round((keyframe + 0.5) / info.fps / float(stream.time_base))


def _seek_to(container: Any, stream: Any, info: VideoInfo, gop: int) -> Iterator[Any]:
    """The demuxer's packets from keyframe ``gop``'s packet on (the decoder flushed first).

    Seeks to the keyframe's time; a landing on an earlier packet reads on to it (packets
    skipped are neither decoded nor ``require``d); a landing past it seeks to the keyframe
    before, and so on (at most ``gop + 1`` seeks). Raises ``VideoError`` when the file has no
    packet at the keyframe's offset (an index that does not match the file)."""
    import av

    wanted = int(info.keyframe_offsets[gop])
    stream.codec_context.flush_buffers()
    for back in range(gop, -1, -1):
        try:
            container.seek(_seek_target(stream, info, back), stream=stream)
        except av.error.FFmpegError as error:
            raise VideoError(
                f"the video cannot be seeked ({error}); the file is damaged"
            ) from error
        packets, landed = container.demux(stream), True
        for packet in packets:
            position = -1 if packet.pos is None else packet.pos
            if position == wanted and packet.size:
                return itertools.chain([packet], packets)
            if packet.size == 0 or position > wanted:
                break
            landed = False  # an earlier packet: read on to the keyframe
        if not landed:
            break  # read on from an earlier packet past the keyframe's offset (or to the end)
    raise VideoError(
        f"the video has no packet at byte {wanted}, where the index puts keyframe "
        f"{int(info.keyframes[gop])}: the index does not match the file; probe it again "
        "with probe_video"
    )


def _run_frames(
    packets: Iterator[Any], stream: Any, file: SparseFile, end: int, first: int
) -> Iterator[tuple[int, Any]]:
    """(ordinal, frame) in presentation order from ``packets`` (the first a keyframe of ordinal
    ``first``) to the packet at byte ``end`` (then the decoder is drained). Every packet's bytes
    are ``require``d before they are decoded."""
    import av

    ordinal = first
    try:
        for packet in packets:
            done = packet.size == 0 or (packet.pos is not None and packet.pos >= end)
            if done:
                frames = stream.codec_context.decode(None)
            else:
                if packet.pos is not None and packet.pos >= 0:
                    file.require(packet.pos, packet.size)
                frames = packet.decode()
            for frame in frames:
                yield ordinal, frame
                ordinal += 1
            if done:
                return
        for frame in stream.codec_context.decode(None):  # the demuxer ended without a flush
            yield ordinal, frame
            ordinal += 1
    except av.error.FFmpegError as error:
        raise VideoError(f"the video cannot be decoded ({error}); the file is damaged") from error
