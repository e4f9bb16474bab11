"""Audio windows: what a file holds (:class:`AudioInfo`), which samples a window needs decoded
and how they become the window: checked, resampled, mixed.

Pure NumPy and PyAV's libswresample, no decoder: :mod:`lanceloader.media.audio` decodes the
samples of a whole file, :mod:`lanceloader.media.audio_ranges` those of a window's byte ranges,
and both shape them here, so a window is the same whichever way its samples were read.

Resampling is libswresample's (through PyAV, no other dependency), run on the window plus up to
:data:`RESAMPLE_CONTEXT` samples of the file on each side (:func:`window_span`), so a window
resamples as the whole file would around it (no edge ringing inside the file). Its output is
exactly ``round(length * sample_rate / native rate)`` samples, the first at the window's start
time. Mono mixdown is the mean of the channels; stereo from mono duplicates the channel.

Example:
    >>> info = AudioInfo(8000, 2, 800, 0.1, "pcm_s16")
    >>> rate, channels = check_window(info, 100, 80, 16000, 1)
    >>> first, count = window_span(info, 100, 80, rate)
    >>> finish_window(np.zeros((2, count), np.float32), info, 100, 80, rate, channels).shape
    (1, 160)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# Input samples of context on each side of a resampled window (libswresample's filter reaches
# 16 output samples each way; 64 covers ratios up to 4:1, and more is scaled up below).
RESAMPLE_CONTEXT = 64


@dataclass(frozen=True)
class AudioInfo:
    """What an audio file holds, from :func:`probe_audio`.

    ``frames`` is samples per channel, the count every decoder of the file delivers (after the
    encoder's delay and padding are trimmed); ``codec`` a short name: ``"pcm_s16"``, ``"flac"``,
    ``"mp3"``, ``"opus"``, ``"vorbis"``, or FFmpeg's codec name for other formats.

    >>> AudioInfo(16000, 1, 8000, 0.5, "flac").duration_s
    0.5
    """

    sample_rate: int
    channels: int
    frames: int
    duration_s: float
    codec: str


def check_window(
    info: AudioInfo,
    start: int,
    length: int,
    sample_rate: int | None,
    channels: int | None,
    source: memoryview | str | None = None,
) -> tuple[int | None, int | None]:
    """The window's checked ``(sample_rate, channels)`` (``None``: the file's own); raises for a
    window outside the file or a bad rate or channel count, naming the fix.

    >>> check_window(AudioInfo(8000, 2, 800, 0.1, "flac"), 0, 80, 16000, 1)
    (16000, 1)
    """
    _check_window(start, length, info, source)
    return _check_rate(sample_rate), _check_channels(channels, info.channels)


def window_span(
    info: AudioInfo, start: int, length: int, sample_rate: int | None = None
) -> tuple[int, int]:
    """``(first, count)``: the samples of the file (at its own rate) a window needs decoded:
    the window itself, or with ``sample_rate`` also up to :data:`RESAMPLE_CONTEXT` (scaled)
    samples of the file on each side, the part before a whole number of resampling steps.

    >>> window_span(AudioInfo(44100, 1, 44100, 1.0, "flac"), 1000, 441, 16000)
    (559, 1074)
    """
    native = info.sample_rate
    if sample_rate is None or sample_rate == native:
        return start, length
    step_in = native // math.gcd(native, sample_rate)  # input samples per whole output step
    context = RESAMPLE_CONTEXT * max(1, math.ceil(native / sample_rate))
    before = min(start // step_in, math.ceil(context / step_in)) * step_in
    after = min(info.frames - start - length, context)
    return start - before, before + length + after


def finish_window(
    samples: np.ndarray,
    info: AudioInfo,
    start: int,
    length: int,
    sample_rate: int | None,
    channels: int | None,
) -> np.ndarray:
    """The window from the decoded ``samples`` of its :func:`window_span`: mixed to
    ``channels`` and resampled to ``sample_rate`` (mixed first: linear, so the same, and a mono
    resample costs half a stereo one).

    >>> info = AudioInfo(8000, 2, 800, 0.1, "pcm_s16")
    >>> finish_window(np.ones((2, 80), np.float32), info, 0, 80, None, 1).shape
    (1, 80)
    """
    native = info.sample_rate
    mixed = _mix(samples, channels)
    if sample_rate is None or sample_rate == native:
        return mixed
    first, _ = window_span(info, start, length, sample_rate)
    out = resample(mixed, native, sample_rate)
    skip = (start - first) * sample_rate // native  # exact: a whole number of input steps
    return out[:, skip : skip + round(length * sample_rate / native)]


def resample(samples: np.ndarray, native: int, rate: int) -> np.ndarray:
    """``[C, N]`` float32 samples at ``native`` Hz as ``[C, round(N * rate / native)]`` at
    ``rate`` Hz with libswresample (PyAV), the first output sample at the first input's time.
    Silence is taken to follow the samples (libswresample needs input past the last output
    sample's filter: a short input gives no output without it).

    >>> resample(np.ones((1, 441), np.float32), 44100, 16000).shape
    (1, 160)
    """
    import av

    count = round(samples.shape[1] * rate / native)
    silence = np.zeros(
        (samples.shape[0], 2 * RESAMPLE_CONTEXT * math.ceil(native / rate) + 64), np.float32
    )
    samples = np.concatenate([samples, silence], axis=1)
    outputs = []
    for channel in samples:  # one mono resampler per channel: any channel count
        resampler = av.AudioResampler(format="fltp", layout="mono", rate=rate)
        frame = av.AudioFrame.from_ndarray(
            np.ascontiguousarray(channel[None], np.float32), format="fltp", layout="mono"
        )
        frame.sample_rate = native
        pieces = [f.to_ndarray() for f in resampler.resample(frame)]
        pieces += [f.to_ndarray() for f in resampler.resample(None)]
        out = np.concatenate(pieces, axis=1) if pieces else np.zeros((1, 0), np.float32)
        outputs.append(out[0, :count])
    return np.stack(outputs) if outputs else np.zeros((0, count), np.float32)


def _describe(source: memoryview | str | None) -> str:
    if source is None:
        return "the audio file"
    return repr(source) if isinstance(source, str) else f"audio of {len(source)} bytes"


def _mix(samples: np.ndarray, channels: int | None) -> np.ndarray:
    if channels is None or channels == samples.shape[0]:
        return samples
    if channels == 1:
        return samples.mean(axis=0, keepdims=True, dtype=np.float32)
    return np.repeat(samples, 2, axis=0)  # mono to stereo (more channels were refused)


# --- checks ---------------------------------------------------------------------------------


def _check_window(
    start: int, length: int, info: AudioInfo, source: memoryview | str | None
) -> None:
    for name, value in (("start", start), ("length", length)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer):
            raise TypeError(f"{name} must be an int (samples per channel), got {value!r}")
    if start < 0 or length < 1 or start + length > info.frames:
        raise ValueError(
            f"the window [{start}, {start + length}) (start={start}, length={length}) does not "
            f"lie within {_describe(source)}: it has {info.frames} samples per channel "
            f"({info.duration_s:.3f} s at {info.sample_rate} Hz); pass 0 <= start and "
            f"start + length <= {info.frames}, length >= 1"
        )


def _check_rate(sample_rate: int | None) -> int | None:
    if sample_rate is None:
        return None
    if (
        isinstance(sample_rate, bool)
        or not isinstance(sample_rate, int | np.integer)
        or sample_rate <= 0
    ):
        raise ValueError(
            f"sample_rate must be None (the file's own) or an int > 0 (Hz), got {sample_rate!r}"
        )
    return int(sample_rate)


def _check_channels(channels: int | None, have: int) -> int | None:
    if channels is None:
        return None
    if channels not in (1, 2) or isinstance(channels, bool):
        raise ValueError(
            f"channels must be None (the file's own), 1 (mono) or 2 (stereo), got {channels!r}"
        )
    if channels == 2 and have > 2:
        raise ValueError(
            f"channels=2 but the file has {have} channels: no downmix matrix is "
            "assumed; pass channels=1 (the mean) or None (all of them)"
        )
    return channels
