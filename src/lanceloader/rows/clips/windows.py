"""Which clips are the samples: the specs (``video_clips``, ``audio_clips``; plain, frozen,
picklable) and where each clip lies (``clip_windows``: pure NumPy, O(media) memory whatever the
number of clips). :mod:`lanceloader.rows.clips.source` reads them; its names are importable there too.

Example::

    >>> windows = clip_windows(np.array([10, 3, 7]), frames=4, stride=1, step=4)
    >>> windows.num_clips, [windows.clip(p) for p in range(windows.num_clips)]
    (3, [(0, 0), (0, 4), (2, 0)])
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from lanceloader.ordering.order import GOLDEN, derive_key, mix64

LAYOUTS = ("NFCHW", "NFHWC")


# --- the specs (plain, frozen, picklable) -------------------------------------------------


@dataclass(frozen=True)
class VideoClips:
    """Which video clips are the samples (what :func:`video_clips` returns)."""

    column: str = "video"
    frames: int = 16
    stride: int = 1
    step: int | None = None
    per_video: int | None = None
    size: tuple[int, int] | None = None
    layout: str = "NFCHW"

    kind = "video"

    @property
    def random_starts(self) -> bool:
        """Whether clips start at random places drawn per epoch (``per_video``)."""
        return self.per_video is not None

    @property
    def span(self) -> int:
        """Frames from a clip's first to its last, both included."""
        return (self.frames - 1) * self.stride + 1

    def settings(self) -> dict[str, Any]:
        return {
            "kind": "video",
            "column": self.column,
            "frames": self.frames,
            "stride": self.stride,
            "step": self.step,
            "per_video": self.per_video,
            "size": list(self.size) if self.size else None,
            "layout": self.layout,
        }


@dataclass(frozen=True)
class AudioClips:
    """Which audio windows are the samples (what :func:`audio_clips` returns)."""

    column: str = "audio"
    seconds: float = 1.0
    step: float | None = None
    per_file: int | None = None
    sample_rate: int | None = None
    channels: int | None = None

    kind = "audio"

    @property
    def random_starts(self) -> bool:
        """Whether windows start at random places drawn per epoch (``per_file``)."""
        return self.per_file is not None

    def settings(self) -> dict[str, Any]:
        return {
            "kind": "audio",
            "column": self.column,
            "seconds": self.seconds,
            "step": self.step,
            "per_file": self.per_file,
            "sample_rate": self.sample_rate,
            "channels": self.channels,
        }


def _positive_int(fn: str, name: str, value: Any, optional: bool = False) -> None:
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"{fn}: {name} must be an int >= 1{' or None' if optional else ''}, got {value!r}"
        )


def _column_name(fn: str, column: Any) -> None:
    if not isinstance(column, str) or not column:
        raise TypeError(f"{fn}: column must be the name of a media column, got {column!r}")


def video_clips(
    column: str = "video",
    frames: int = 16,
    stride: int = 1,
    *,
    step: int | None = None,
    per_video: int | None = None,
    size: tuple[int, int] | None = None,
    layout: str = "NFCHW",
) -> VideoClips:
    """Clips of ``frames`` frames, ``stride`` apart, of the videos in ``column``, as the samples;
    pass the result as ``Loader(..., clips=...)``.

    Args:
        column: a blob column of video files (``ll.convert("videos/", out)`` writes one, with
            the keyframe index beside it).
        frames: frames per clip.
        stride: frames between a clip's frames (1: consecutive).
        step: frames between the starts of consecutive clips of a video; default
            ``frames × stride`` (clips do not overlap). Not with ``per_video``.
        per_video: ``K`` clips per video per epoch at random starts drawn from the Loader's
            seed, the epoch and the clip's position (a different draw each epoch).
        size: ``(height, width)`` to resize every frame to; needed when the videos' sizes
            differ (a batch is one tensor).
        layout: ``"NFCHW"`` (default, ``[N, F, C, H, W]`` batches) or ``"NFHWC"``.

    >>> video_clips("video", frames=8, stride=2)
    VideoClips(column='video', frames=8, stride=2, step=None, per_video=None, size=None, layout='NFCHW')
    """
    fn = "video_clips"
    _column_name(fn, column)
    _positive_int(fn, "frames", frames)
    _positive_int(fn, "stride", stride)
    _positive_int(fn, "step", step, optional=True)
    _positive_int(fn, "per_video", per_video, optional=True)
    if step is not None and per_video is not None:
        raise ValueError(
            f"{fn}: step={step} and per_video={per_video} are two ways of choosing "
            "clips; give one (step: every clip, that far apart; per_video: K "
            "random clips per video per epoch)"
        )
    if size is not None:
        if (
            not isinstance(size, tuple | list)
            or len(size) != 2
            or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in size)
        ):
            raise ValueError(f"{fn}: size must be (height, width) in pixels, got {size!r}")
        size = (int(size[0]), int(size[1]))
    if layout not in LAYOUTS:
        raise ValueError(f"{fn}: layout must be 'NFCHW' or 'NFHWC', got {layout!r}")
    return VideoClips(column, frames, stride, step, per_video, size, layout)


def audio_clips(
    column: str = "audio",
    seconds: float = 1.0,
    *,
    step: float | None = None,
    per_file: int | None = None,
    sample_rate: int | None = None,
    channels: int | None = None,
) -> AudioClips:
    """Windows of ``seconds`` of the audio files in ``column``, as the samples; pass the result
    as ``Loader(..., clips=...)``.

    Args:
        column: a blob column of audio files (WAV, FLAC, MP3, Opus...); ``ll.convert`` of a
            folder writes one with its byte index, so a window reads only its bytes (WAV,
            FLAC, MP3; other formats whole: ``lanceloader.media.audio_ranges``).
        seconds: the window's length.
        step: seconds between the starts of consecutive windows; default ``seconds``.
        per_file: ``K`` windows per file per epoch at random starts (seed, epoch, position).
        sample_rate: resample every window to this rate; needed when the files' rates differ.
        channels: 1 (mixed down) or 2; needed when the files' channel counts differ.

    >>> audio_clips("audio", seconds=0.5, sample_rate=16000)
    AudioClips(column='audio', seconds=0.5, step=None, per_file=None, sample_rate=16000, channels=None)
    """
    fn = "audio_clips"
    _column_name(fn, column)
    for name, value in (("seconds", seconds), ("step", step)):
        if value is None and name == "step":
            continue
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or value <= 0
        ):
            raise ValueError(f"{fn}: {name} must be a number of seconds > 0, got {value!r}")
    _positive_int(fn, "per_file", per_file, optional=True)
    _positive_int(fn, "sample_rate", sample_rate, optional=True)
    if channels not in (None, 1, 2):
        raise ValueError(
            f"{fn}: channels must be 1 (mono), 2 (stereo) or None (the files' "
            f"own), got {channels!r}"
        )
    if step is not None and per_file is not None:
        raise ValueError(
            f"{fn}: step={step} and per_file={per_file} are two ways of choosing windows; give one"
        )
    return AudioClips(
        column,
        float(seconds),
        None if step is None else float(step),
        per_file,
        sample_rate,
        channels,
    )


Clips = VideoClips | AudioClips


# --- windows (pure) -----------------------------------------------------------------------


@dataclass(frozen=True)
class ClipWindows:
    """Where each clip lies: clip ``p`` is in media ``media(p)`` (a position of the inner
    source). Every-window clips start at ``(p - first[m]) × step[m]``; with ``per_media``, clips
    start at a frame (sample) drawn in ``[0, last_start[m]]`` per (seed, epoch, p). O(media)
    memory, whatever the number of clips.
    """

    counts: np.ndarray  # clips per media
    first: np.ndarray  # the first clip of each media (cumulative counts)
    last_start: np.ndarray  # the last frame (sample) a clip of each media may start at
    step: np.ndarray  # frames (samples) between a media's consecutive clip starts
    per_media: int | None = None

    @property
    def num_clips(self) -> int:
        return int(self.first[-1] + self.counts[-1]) if len(self.counts) else 0

    def media(self, positions: np.ndarray) -> np.ndarray:
        """The media (inner position) of each clip."""
        return np.searchsorted(self.first, np.asarray(positions, np.int64), side="right") - 1

    def starts(self, positions: np.ndarray, seed: int = 0, epoch: int = 0) -> np.ndarray:
        """The first frame (sample) of each clip: fixed, or drawn per (seed, epoch, position)."""
        positions = np.asarray(positions, dtype=np.int64)
        media = self.media(positions)
        if self.per_media is None:
            return (positions - self.first[media]) * self.step[media]
        return draw_below(self.last_start[media] + 1, positions, seed, epoch)

    def clip(self, position: int, seed: int = 0, epoch: int = 0) -> tuple[int, int]:
        """``(media, start)`` of one clip."""
        p = np.array([position], dtype=np.int64)
        return int(self.media(p)[0]), int(self.starts(p, seed, epoch)[0])


def draw_below(bounds: np.ndarray, positions: np.ndarray, seed: int, epoch: int) -> np.ndarray:
    """One integer in ``[0, bounds[i])`` per position, drawn from (seed, epoch, position) alone:
    the position's splitmix64 output under a key of (seed, epoch), scaled by 53 bits (a bias
    under 2^-20 for bounds below 2^33 samples). Vectorised: a read of 32 clips draws in
    microseconds, where a NumPy generator per clip took 30-50 µs each.

    >>> draw_below(np.array([10, 10]), np.array([3, 3]), seed=0, epoch=1).tolist()[0] < 10
    True
    >>> bool((draw_below(np.full(4, 5), np.arange(4), 0, 0) == draw_below(np.full(4, 5), np.arange(4), 0, 0)).all())
    True
    """
    bounds = np.asarray(bounds, np.int64)
    key = np.uint64(derive_key(int(seed), "clip-start", int(epoch)))
    z = mix64(np.asarray(positions, np.int64).astype(np.uint64) * GOLDEN + key)
    unit = (z >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))
    return np.minimum((unit * bounds).astype(np.int64), np.maximum(bounds - 1, 0))


def clip_windows(
    lengths: np.ndarray,
    frames: int | np.ndarray,
    stride: int = 1,
    step: int | np.ndarray | None = None,
    per_media: int | None = None,
) -> ClipWindows:
    """The clips of media of ``lengths`` frames (or samples): every window of ``frames`` at
    ``stride`` starting every ``step`` (default ``frames × stride``), or ``per_media`` per
    media. A media shorter than one clip has none. ``frames`` and ``step`` may be per media
    (audio windows of files at different rates).

    >>> w = clip_windows(np.array([5, 9]), frames=2, stride=2, per_media=3)
    >>> w.num_clips, w.media(np.arange(6)).tolist(), w.last_start.tolist()
    (6, [0, 0, 0, 1, 1, 1], [2, 6])
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    frames = np.broadcast_to(np.asarray(frames, dtype=np.int64), lengths.shape)
    span = (frames - 1) * stride + 1
    step = np.broadcast_to(
        np.asarray(frames * stride if step is None else step, np.int64), lengths.shape
    )
    last_start = lengths - span
    fits = last_start >= 0
    if per_media is not None:
        counts = np.where(fits, per_media, 0)
    else:
        counts = np.where(fits, last_start // np.maximum(step, 1) + 1, 0)
    first = np.cumsum(counts) - counts
    return ClipWindows(
        counts.astype(np.int64),
        first.astype(np.int64),
        np.maximum(last_start, 0),
        step.astype(np.int64),
        per_media,
    )


def refuse_random_starts(clips: VideoClips | AudioClips | None, reader: str, instead: str) -> None:
    """A reader by index (no epoch) takes every clip: refuse clips with random starts, naming
    the reader that has an epoch to draw them from (``instead``)."""
    if clips is not None and clips.random_starts:
        raise ValueError(
            f"{reader}(clips=...) takes every clip (an index has no epoch to draw "
            f"per_video/per_file starts from); use {instead} for random clips"
        )


def clips_of(settings: dict[str, Any]) -> VideoClips | AudioClips:
    """The clip spec whose ``settings()`` a state records (``state["order"]["clips"]``).

    >>> clips_of(VideoClips(frames=4, size=(8, 8)).settings()) == VideoClips(frames=4, size=(8, 8))
    True
    """
    values = {k: v for k, v in settings.items() if k != "kind"}
    if settings["kind"] == "video":
        size = values.pop("size")
        return VideoClips(**values, size=tuple(size) if size else None)
    return AudioClips(**values)
