"""Synthetic media for the tests (shared by the video, audio and clip tests).

Every video frame carries its own index in its pixels, so a test can tell *which* frame a
decoder returned without trusting timestamps: the frame is a grid of ``INDEX_BITS`` blocks
(``GRID_ROWS`` × ``GRID_COLUMNS``), block *b* dark (gray 48) when bit *b* of the index is 0 and
light (gray 208) when it is 1, plus a little deterministic noise so that frames cost realistic
bytes. Lossy compression, any resize that keeps the grid's proportions and a colour conversion
keep every block's mean on its side of 128, which is all :func:`frame_index_of` reads.

Audio is a tone per channel (channel *c* at ``tone_hz(c)``), written as WAV/FLAC by soundfile
and MP3/Opus by PyAV; :func:`write_audio` returns the samples it synthesized.

Example:
    >>> import tempfile, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "v.mp4"
    >>> _ = write_video(path, frames=5, fps=10, size=(48, 64), gop=2)
    >>> import av
    >>> with av.open(str(path)) as c:
    ...     [frame_index_of(f.to_ndarray(format="rgb24")) for f in c.decode(video=0)]
    [0, 1, 2, 3, 4]
"""

from __future__ import annotations

import itertools
import os
from fractions import Fraction
from pathlib import Path

import numpy as np

GRID_ROWS = 3
GRID_COLUMNS = 4
INDEX_BITS = GRID_ROWS * GRID_COLUMNS  # frames 0 .. 4,095
DARK, LIGHT = 48, 208


def frame_pixels(index: int, size: tuple[int, int]) -> np.ndarray:
    """The RGB frame (``size`` = (height, width), uint8) that carries ``index`` in its blocks."""
    height, width = size
    if not 0 <= index < 2**INDEX_BITS:
        raise ValueError(f"frame index {index} does not fit in {INDEX_BITS} bits: use fewer frames")
    if height % 2 or width % 2 or height < 2 * GRID_ROWS or width < 2 * GRID_COLUMNS:
        raise ValueError(
            f"size={size!r}: height and width must be even and at least "
            f"{2 * GRID_ROWS}×{2 * GRID_COLUMNS} (yuv420p halves both)"
        )
    bits = (index >> np.arange(INDEX_BITS)) & 1
    grid = np.where(bits == 1, LIGHT, DARK).reshape(GRID_ROWS, GRID_COLUMNS)
    rows = np.minimum(np.arange(height) * GRID_ROWS // height, GRID_ROWS - 1)
    columns = np.minimum(np.arange(width) * GRID_COLUMNS // width, GRID_COLUMNS - 1)
    gray = grid[rows[:, None], columns[None, :]].astype(np.int16)
    noise = np.random.default_rng(index).integers(-24, 25, size=(height, width), dtype=np.int16)
    return np.repeat(np.clip(gray + noise, 0, 255).astype(np.uint8)[:, :, None], 3, axis=2)


def frame_index_of(frame: np.ndarray) -> int:
    """The index :func:`frame_pixels` put in ``frame`` ([H, W] or [H, W, C] uint8)."""
    gray = frame.mean(axis=2) if frame.ndim == 3 else frame.astype(np.float64)
    height, width = gray.shape
    index = 0
    for bit in range(INDEX_BITS):
        row, column = divmod(bit, GRID_COLUMNS)
        top, bottom = row * height // GRID_ROWS, (row + 1) * height // GRID_ROWS
        left, right = column * width // GRID_COLUMNS, (column + 1) * width // GRID_COLUMNS
        # the block's middle half: away from edges that compression and resizing blur
        dy, dx = max((bottom - top) // 4, 0), max((right - left) // 4, 0)
        block = gray[top + dy : bottom - dy or None, left + dx : right - dx or None]
        if block.mean() > (DARK + LIGHT) / 2:
            index |= 1 << bit
    return index


def write_video(
    path: str | os.PathLike,
    frames: int,
    fps: float,
    size: tuple[int, int],
    gop: int,
    codec: str = "libx264",
    pix_fmt: str = "yuv420p",
    *,
    bframes: int = 2,
    faststart: bool = True,
    audio: bool = False,
    fragmented: bool = False,
    pts: list[int] | None = None,
    audio_first: bool = False,
    rotation: int = 0,
) -> Path:
    """Write ``frames`` frames (``size`` = (height, width)) at ``fps``, a keyframe every ``gop``
    frames (closed GOPs, no scene-cut keyframes), with up to ``bframes`` B-frames between
    references; the container comes from the suffix (``.mp4``, ``.mov``, ``.mkv``, ``.webm``…).
    ``faststart=False`` leaves an MP4's ``moov`` box at the end of the file (the muxer's default);
    ``audio=True`` adds an AAC track of tones (48 kHz stereo), interleaved with the video;
    ``fragmented=True`` writes a fragmented MP4 (a ``moof`` box per GOP, an empty ``moov``).
    ``pts``: each frame's presentation time in milliseconds (rising; :func:`vfr_pts` makes a
    variable frame rate, a phone's or a screen recorder's), else ``fps`` from 0;
    ``audio_first=True`` puts the audio track (``audio=True``) before the video (stream 0);
    ``rotation``: degrees of a display matrix on the video track (a phone held upright).
    Frame *i* carries *i* (:func:`frame_index_of`). Creates the parent folder. Returns ``path``."""
    import av

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rate = Fraction(fps).limit_denominator(1001)
    options = {"movflags": "+faststart"} if faststart and path.suffix in {".mp4", ".mov"} else {}
    if fragmented:
        options = {"movflags": "+frag_keyframe+empty_moov"}
    if pts is not None and (len(pts) != frames or any(b <= a for a, b in itertools.pairwise(pts))):
        raise ValueError(f"pts: pass {frames} rising times in milliseconds, one per frame")
    with av.open(str(path), mode="w", options=options) as container:
        sound = None
        if audio and audio_first:
            sound = container.add_stream("aac", rate=48_000, layout="stereo")
        stream = container.add_stream(codec, rate=rate)
        if pts is not None:
            stream.codec_context.time_base = Fraction(1, 1000)
        if rotation:
            stream.set_display_rotation(rotation)
        stream.height, stream.width = size
        stream.pix_fmt = pix_fmt
        if codec == "libx264":
            stream.options = {
                "x264-params": f"keyint={gop}:min-keyint={gop}:scenecut=0:bframes={bframes}"
                ":open-gop=0",
                "preset": "ultrafast" if bframes == 0 else "veryfast",
            }
        else:
            stream.codec_context.gop_size = gop
            stream.codec_context.max_b_frames = bframes
        if audio and sound is None:
            sound = container.add_stream("aac", rate=48_000, layout="stereo")
        times = [i / float(rate) for i in range(frames)] if pts is None else [t / 1000 for t in pts]
        tones = audio_samples(times[-1] + 1 / float(rate) + 0.1, 48_000, 2).T.copy()
        written = 0  # audio samples muxed so far, kept up with the video
        for index in range(frames):
            frame = av.VideoFrame.from_ndarray(frame_pixels(index, size), format="rgb24")
            frame.pts = None if pts is None else pts[index]
            if pts is not None:
                frame.time_base = Fraction(1, 1000)
            container.mux(stream.encode(frame))
            while sound is not None and written < (times[index] + 1 / float(rate)) * 48_000:
                chunk = av.AudioFrame.from_ndarray(
                    np.ascontiguousarray(tones[:, written : written + 1024]), "fltp", "stereo"
                )
                chunk.sample_rate, chunk.pts = 48_000, written
                container.mux(sound.encode(chunk))
                written += 1024
        container.mux(stream.encode(None))
        if sound is not None:
            container.mux(sound.encode(None))
    return path


def vfr_pts(frames: int, first: int = 0, seed: int = 0) -> list[int]:
    """Presentation times (ms) of a variable frame rate: each frame lasts 10, 33, 100 or 250 ms
    (a screen recorder's bursts and pauses), drawn from ``seed``; the first at ``first``."""
    durations = np.random.default_rng(seed).choice([10, 33, 100, 250], size=frames)
    return (first + np.concatenate([[0], np.cumsum(durations[:-1])])).astype(int).tolist()


def tone_hz(channel: int) -> float:
    """The frequency of channel ``channel``'s tone in :func:`write_audio`."""
    return 220.0 * (channel + 1)


def audio_samples(seconds: float, sample_rate: int, channels: int) -> np.ndarray:
    """The float32 samples [frames, channels] in [-0.5, 0.5] that :func:`write_audio` encodes."""
    t = np.arange(round(seconds * sample_rate)) / sample_rate
    tones = [0.5 * np.sin(2 * np.pi * tone_hz(c) * t) for c in range(channels)]
    return np.stack(tones, axis=1).astype(np.float32)


def write_audio(
    path: str | os.PathLike, seconds: float, sample_rate: int, channels: int, fmt: str | None = None
) -> np.ndarray:
    """Write ``seconds`` of tones (:func:`audio_samples`) as ``fmt``: ``"wav"`` (PCM 16-bit) or
    ``"flac"`` through soundfile, ``"mp3"`` or ``"opus"`` (Ogg; sample rates 8, 12, 16, 24 or
    48 kHz) through PyAV. ``fmt=None`` takes the path's suffix. Returns the samples written
    ([frames, channels] float32; lossy formats decode to something close, with encoder delay)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fmt = (fmt or path.suffix.lstrip(".")).lower()
    samples = audio_samples(seconds, sample_rate, channels)
    if fmt in {"wav", "flac"}:
        import soundfile

        soundfile.write(str(path), samples, sample_rate, format=fmt.upper(), subtype="PCM_16")
        return samples
    codecs = {"mp3": ("libmp3lame", "mp3"), "opus": ("libopus", "ogg")}
    if fmt not in codecs:
        raise ValueError(f"fmt={fmt!r}: write_audio writes 'wav', 'flac', 'mp3' or 'opus'")
    import av

    codec, container_format = codecs[fmt]
    layout = {1: "mono", 2: "stereo"}.get(channels)
    if layout is None:
        raise ValueError(f"channels={channels}: MP3 and Opus here take 1 or 2 channels")
    with av.open(str(path), mode="w", format=container_format) as container:
        stream = container.add_stream(codec, rate=sample_rate, layout=layout)
        step = 1152
        for start in range(0, len(samples), step):
            chunk = np.ascontiguousarray(samples[start : start + step].T)
            frame = av.AudioFrame.from_ndarray(chunk, format="fltp", layout=layout)
            frame.sample_rate = sample_rate
            frame.pts = start
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    return samples
