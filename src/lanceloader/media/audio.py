"""Audio: probe a file, decode an exact window of it, resample it, mix its channels.

Pure functions of a file's bytes (no Lance, no loader): :func:`probe_audio` reads what a file
holds, :func:`decode_audio_window` decodes ``length`` samples from sample ``start`` as float32
``[C, T]``. ``lanceloader.decode_audio`` (``batch/audio.py``) crops every row of a batch with
them; ``ll.audio_clips`` (``rows/clips/source.py``) makes every window of a file a sample.

Decoders, chosen per format by measurement (the timings: docs/performance.md, "Audio
decoding"; ``benchmarks/multimodal_audio.py`` measures the loader end to end):

* WAV, FLAC, AIFF, Vorbis: soundfile (libsndfile), seek then read; exact.
* MP3: soundfile from the file's start while the window ends within ``MP3_FROM_START_S``
  seconds, else PyAV: seek ``PREROLL_SAMPLES`` early, decode, and trim by the frames'
  timestamps (a flat cost anywhere in the file). libsndfile's own MP3 seek is not used: it
  lands up to ~220 samples off and decodes the first frames without their bit reservoir.
* Opus at 48 kHz: PyAV, seek early and trim as for MP3 (faster than soundfile).
  Opus whose header names another (input) rate: soundfile, which decodes at that rate (FFmpeg
  decodes Opus at 48 kHz only).
* Anything else (AAC, M4A, WMA, ...): PyAV as for Opus, placed by the container's timestamps.

Lossy decoders differ in the last bits (FFmpeg's MP3 and Opus decoders against libsndfile's
mpg123 and libopus: at most 2e-6 and 1.2e-3 apart, measured); the window's first sample is
always the file's sample ``start`` counted after the encoder's delay (the LAME header's, Opus's
pre-skip), as every decoder of the file counts it.

The window's samples are then checked, resampled (libswresample, with context on each side)
and mixed by :mod:`lanceloader.media.audio_window`, whose names are importable from here too;
:mod:`lanceloader.media.audio_ranges` decodes a window from only its byte ranges, to the same
samples.
"""

from __future__ import annotations

import io
import os
from fractions import Fraction
from typing import Any

import numpy as np

from lanceloader.media.audio_window import (
    RESAMPLE_CONTEXT,
    AudioInfo,
    _describe,
    check_window,
    finish_window,
    resample,
    window_span,
)

__all__ = [
    "COPY_BELOW_BYTES",
    "MP3_FROM_START_S",
    "PREROLL_SAMPLES",
    "RESAMPLE_CONTEXT",
    "AudioInfo",
    "AudioReader",
    "check_window",
    "decode_audio_window",
    "finish_window",
    "probe_audio",
    "resample",
    "window_span",
]

# An MP3 window that ends within this many seconds of the start is decoded from the start by
# soundfile (cost grows ~0.5 ms per second decoded); later ones seek with PyAV (~9 ms flat):
# they cross near 10-12 s (measured: docs/performance.md, "Audio decoding").
MP3_FROM_START_S = 10.0
# Samples decoded before a seek's target and thrown away: a PyAV seek lands on a packet at or
# before the target, and MP3's bit reservoir (up to 511 bytes back: ~5 frames at 32 kbit/s) and
# Opus's 80 ms of convergence need earlier packets decoded. 10 MP3 frames; measured exact from 4.
PREROLL_SAMPLES = 11_520

# Files up to this size are copied into io.BytesIO for the decoders; larger ones are read in
# place (_MemoryFile), so a crop of a long file never copies the whole file.
COPY_BELOW_BYTES = 1 << 20
OPUS_RATE = 48_000  # Opus's own rate; a file's header may name another (its input's)
_SOUNDFILE_SEEKS = {"wav", "flac", "aiff", "vorbis"}  # libsndfile seeks these exactly


def probe_audio(data: bytes | os.PathLike[str] | str) -> AudioInfo:
    """The sample rate, channels, length and codec of an audio file (its bytes or its path).

    WAV, FLAC, MP3, Ogg Opus and Vorbis are probed by libsndfile from their headers (an MP3
    without a Xing/LAME header is scanned frame by frame, which is still no decoding). Other
    formats (AAC, M4A, ...) are decoded whole by PyAV to count their samples: up to the end of
    the last frame, placed by its timestamp (an encoder's priming before time 0 is not counted,
    as windows never start there; its padding at the end may be, where the container does not
    say).

    >>> import io, numpy as np, soundfile
    >>> wav = io.BytesIO(); soundfile.write(wav, np.zeros((800, 2)), 16000, format="WAV")
    >>> probe_audio(wav.getvalue())
    AudioInfo(sample_rate=16000, channels=2, frames=800, duration_s=0.05, codec='pcm_s16')
    """
    with AudioReader(data) as reader:
        return reader.info


def decode_audio_window(
    data: bytes,
    start: int,
    length: int,
    *,
    sample_rate: int | None = None,
    channels: int | None = None,
) -> np.ndarray:
    """``length`` samples of an audio file from sample ``start``, as float32 ``[C, T]``.

    ``start`` and ``length`` count samples per channel at the file's own rate, and the window
    must lie within the file (else a ``ValueError`` naming the file's length and the window).
    ``sample_rate`` resamples the window (``T = round(length * sample_rate / native rate)``,
    the first sample at the window's start); ``channels=1`` mixes down to mono (the mean of the
    channels), ``channels=2`` duplicates a mono file (a file of more channels is refused: no
    mixing matrix is assumed). Values are in [-1, 1] as the decoder gives them. Decoders and
    their accuracy: module text.

    >>> import io, numpy as np, soundfile
    >>> wav = io.BytesIO()
    >>> soundfile.write(wav, np.arange(8, dtype=np.int16) * 4096, 8000, format="WAV", subtype="PCM_16")
    >>> decode_audio_window(wav.getvalue(), 2, 3) * 8
    array([[2., 3., 4.]], dtype=float32)
    >>> decode_audio_window(wav.getvalue(), 0, 8, sample_rate=4000, channels=2).shape
    (2, 4)
    """
    with AudioReader(data) as reader:
        return reader.window(start, length, sample_rate=sample_rate, channels=channels)


class AudioReader:
    """One open audio file: :attr:`info` and :meth:`window` without opening it twice (what
    ``decode_audio`` does per row). A context manager; :meth:`close` releases the decoders.

    >>> import io, numpy as np, soundfile
    >>> wav = io.BytesIO(); soundfile.write(wav, np.zeros(400), 8000, format="WAV")
    >>> with AudioReader(wav.getvalue()) as reader:
    ...     reader.info.frames, reader.window(100, 50).shape
    (400, (1, 50))
    """

    def __init__(self, data: bytes | os.PathLike[str] | str) -> None:
        self._source = _source(data)
        self._kind = _kind(self._source)
        self._soundfile: Any = None
        if self._kind == "other":
            self.info = _probe_pyav(self._source)
        else:
            import soundfile

            try:
                self._soundfile = soundfile.SoundFile(_file(self._source))
            except Exception as exc:  # libsndfile's error names no file: name ours
                raise ValueError(
                    f"cannot read {_describe(self._source)} as {self._kind} audio: {exc}; check "
                    "the file (a truncated or corrupt file, or another format)"
                ) from exc
            self.info = _info_soundfile(self._soundfile, self._kind)

    def __enter__(self) -> AudioReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the file's decoder (idempotent)."""
        if self._soundfile is not None:
            self._soundfile.close()
            self._soundfile = None

    def window(
        self,
        start: int,
        length: int,
        *,
        sample_rate: int | None = None,
        channels: int | None = None,
    ) -> np.ndarray:
        """:func:`decode_audio_window` of this file."""
        rate, target = check_window(self.info, start, length, sample_rate, channels, self._source)
        first, count = window_span(self.info, start, length, rate)
        return finish_window(self._read(first, count), self.info, start, length, rate, target)

    def _read(self, start: int, length: int) -> np.ndarray:
        if self._kind in _SOUNDFILE_SEEKS or (
            self._kind == "opus" and self.info.sample_rate != OPUS_RATE
        ):  # FFmpeg decodes Opus at 48 kHz only; libopus (soundfile) at the header's rate
            self._soundfile.seek(start)
            return _frames_read(
                _read_soundfile(self._soundfile, length), length, start, self._source
            )
        if self._kind == "mp3" and start + length <= MP3_FROM_START_S * self.info.sample_rate:
            self._soundfile.seek(0)  # libsndfile's MP3 seeks are inexact: decode from the start
            read = _read_soundfile(self._soundfile, start + length)
            return _frames_read(read[start:], length, start, self._source)
        return _read_pyav(self._source, start, length, self.info)


# --- which decoder --------------------------------------------------------------------------


def _source(data: bytes | os.PathLike[str] | str) -> memoryview | str:
    """A path, or the file's bytes as a memoryview (not copied: a row of an Arrow column is
    read where it lies)."""
    if isinstance(data, str | os.PathLike):
        path = os.fspath(data)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"no audio file at {path!r}")
        return path
    try:
        return memoryview(data).cast("B")  # bytes, a pyarrow.Buffer, a NumPy array, ...
    except TypeError:
        raise TypeError(
            f"audio must be the file's bytes or its path, got {type(data).__name__}; pass "
            "row['audio'] of a binary column, or a path"
        ) from None


def _kind(source: memoryview | str) -> str:
    """The format from the first bytes: 'wav', 'flac', 'aiff', 'mp3', 'opus', 'vorbis' or
    'other' (what PyAV reads)."""
    if isinstance(source, str):
        with open(source, "rb") as f:
            head = f.read(4096)
    else:
        head = bytes(source[:4096])
    if head[:4] in (b"RIFF", b"RF64") and head[8:12] == b"WAVE":
        return "wav"
    if head[:4] == b"fLaC":
        return "flac"
    if head[:4] == b"FORM" and head[8:12] in (b"AIFF", b"AIFC"):
        return "aiff"
    if head[:4] == b"OggS":
        return "opus" if b"OpusHead" in head else "vorbis" if b"\x01vorbis" in head else "other"
    if head[:3] == b"ID3" or (len(head) > 1 and head[0] == 0xFF and head[1] & 0xE6 == 0xE2):
        return "mp3"  # an ID3 tag, or an MPEG audio layer III frame sync
    return "other"


def _file(source: memoryview | str) -> Any:
    """A file object for the decoders: a path as is; a small file copied into ``io.BytesIO``
    (its C ``readinto`` made a 40 KB FLAC crop ~8% cheaper than :class:`_MemoryFile`), a
    large one read in place (a copy would cost more than the crop)."""
    if not isinstance(source, memoryview):
        return source
    return io.BytesIO(bytes(source)) if len(source) <= COPY_BELOW_BYTES else _MemoryFile(source)


class _MemoryFile(io.RawIOBase):
    """A read-only file over a buffer that never copies it whole (``io.BytesIO`` copies it):
    decoders read what they need into their own buffers (``readinto``).

    >>> f = _MemoryFile(memoryview(b"abcdef")); f.seek(2); f.read(3)
    2
    b'cde'
    """

    def __init__(self, buffer: memoryview) -> None:
        super().__init__()
        self._buffer = buffer
        self._position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, into: Any) -> int:
        target = memoryview(into).cast("B")
        count = max(0, min(len(target), len(self._buffer) - self._position))
        target[:count] = self._buffer[self._position : self._position + count]
        self._position += count
        return count

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        origin = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: len(self._buffer)}
        self._position = max(0, origin[whence] + offset)
        return self._position

    def tell(self) -> int:
        return self._position


_CODECS = {
    "FLAC": "flac",
    "MPEG_LAYER_III": "mp3",
    "OPUS": "opus",
    "VORBIS": "vorbis",
    "PCM_16": "pcm_s16",
    "PCM_24": "pcm_s24",
    "PCM_32": "pcm_s32",
    "PCM_U8": "pcm_u8",
    "PCM_S8": "pcm_s8",
    "FLOAT": "pcm_f32",
    "DOUBLE": "pcm_f64",
}


def _info_soundfile(f: Any, kind: str) -> AudioInfo:
    frames, rate = int(f.frames), int(f.samplerate)
    return AudioInfo(
        rate,
        int(f.channels),
        frames,
        frames / rate,
        "flac" if kind == "flac" else _CODECS.get(f.subtype, kind),
    )


def _probe_pyav(source: memoryview | str) -> AudioInfo:
    container, stream = _open_pyav(source)
    with container:
        ctx = stream.codec_context
        origin, base, rate = stream.start_time or 0, stream.time_base, ctx.sample_rate
        frames = 0  # the end of the last frame, placed by its timestamp as windows place it
        for frame in container.decode(stream):
            first = frames if frame.pts is None else round((frame.pts - origin) * base * rate)
            frames = max(frames, first + frame.samples)
        return AudioInfo(
            int(ctx.sample_rate), int(ctx.channels), frames, frames / ctx.sample_rate, ctx.name
        )


def _open_pyav(source: memoryview | str) -> tuple[Any, Any]:
    import av

    try:
        container = av.open(_file(source))
    except Exception as exc:
        raise ValueError(
            f"cannot open {_describe(source)} as audio: {exc}; check the file "
            "(a truncated or corrupt file, or not audio)"
        ) from exc
    if not container.streams.audio:
        container.close()
        raise ValueError(
            f"{_describe(source)} has no audio stream (a "
            f"{container.format.name} file); pass a column of audio files"
        )
    return container, container.streams.audio[0]


# --- reading --------------------------------------------------------------------------------


def _read_pyav(source: memoryview | str, start: int, length: int, info: AudioInfo) -> np.ndarray:
    """Samples ``[start, start + length)`` as ``[C, length]`` float32: seek before
    ``start - PREROLL_SAMPLES`` (or start at 0), decode, place frames by their timestamps. A
    seek that lands after its target (a container's coarse index) is retried from the start."""
    preroll = PREROLL_SAMPLES
    for _ in range(2):
        target = max(0, start - preroll)
        out = _decode_pyav_from(source, target, start, length, info)
        if out is not None:
            return out
        preroll = start  # the seek overshot: decode from the file's start
    raise ValueError(
        f"{_describe(source)}: decoding from the start still began after sample "
        f"{start}; the file's timestamps are broken"
    )


def _decode_pyav_from(
    source: memoryview | str, target: int, start: int, length: int, info: AudioInfo
) -> np.ndarray | None:
    container, stream = _open_pyav(source)
    rate = info.sample_rate
    with container:
        if stream.codec_context.sample_rate != rate:
            raise ValueError(
                f"{_describe(source)}: FFmpeg decodes it at "
                f"{stream.codec_context.sample_rate} Hz, its header says {rate} Hz"
            )
        origin = stream.start_time or 0
        base = stream.time_base
        if target > 0:
            container.seek(
                int(Fraction(target, rate) / base) + origin, stream=stream, backward=True
            )
        out = np.empty((info.channels, length), np.float32)
        done = 0
        for frame in container.decode(stream):
            at = start + done
            first = round((frame.pts - origin) * base * rate) if frame.pts is not None else None
            if first is None:
                raise ValueError(
                    f"{_describe(source)}: a decoded frame has no timestamp, so "
                    "the window cannot be placed exactly; convert the file"
                )
            if first > at:
                if done == 0:
                    return None  # landed past the window: the caller decodes from earlier
                raise ValueError(
                    f"{_describe(source)}: samples {at}..{first} are missing "
                    "(a gap in the stream); the file is damaged"
                )
            samples = _planar_float(frame, info.channels)
            skip = at - first
            if skip >= samples.shape[1]:
                continue
            take = min(samples.shape[1] - skip, length - done)
            out[:, done : done + take] = samples[:, skip : skip + take]
            done += take
            if done == length:
                return out
    raise ValueError(
        f"{_describe(source)} ended at sample {start + done}, inside the window "
        f"[{start}, {start + length}); its header claims {info.frames} samples: "
        "the file is truncated"
    )


def _planar_float(frame: Any, channels: int) -> np.ndarray:
    """A PyAV frame's samples as ``[C, n]`` float32 in [-1, 1], whatever its sample format."""
    array = frame.to_ndarray()
    if not frame.format.is_planar:
        array = array.reshape(-1, channels).T
    if array.dtype.kind == "f":
        return array.astype(np.float32, copy=False)
    if array.dtype == np.uint8:
        return (array.astype(np.float32) - 128.0) / 128.0
    return array.astype(np.float32) / float(2 ** (8 * array.dtype.itemsize - 1))


def _read_soundfile(f: Any, length: int) -> np.ndarray:
    """Up to ``length`` frames from ``f``'s position as ``[frames, C]`` float32, with
    libsndfile's ``sf_readf_float`` itself: ``SoundFile.read`` seeks again to where it already
    is after each read, which for FLAC is a second search of the file (a quarter of a crop's
    CPU: docs/performance.md, "Audio decoding"). Where soundfile's internals differ from
    0.12-0.14's, its ``read``."""
    import soundfile

    lib, ffi, handle = (
        getattr(soundfile, "_snd", None),
        getattr(soundfile, "_ffi", None),
        getattr(f, "_file", None),
    )
    if lib is None or ffi is None or handle is None or not hasattr(lib, "sf_readf_float"):
        return f.read(length, dtype="float32", always_2d=True)
    out = np.empty((length, f.channels), np.float32)
    done = lib.sf_readf_float(handle, ffi.cast("float *", out.ctypes.data), length)
    return out[:done]


def _frames_read(read: np.ndarray, length: int, start: int, source: memoryview | str) -> np.ndarray:
    if read.shape[0] != length:
        raise ValueError(
            f"{_describe(source)} ended at sample {start + read.shape[0]}, inside "
            f"the window [{start}, {start + length}): the file is truncated"
        )
    return np.ascontiguousarray(read.T)
