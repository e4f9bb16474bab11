"""Audio by byte range: where each stretch of a file's audio lies, and a window decoded from
only those bytes.

The flow for one window (pure functions; the caller does the I/O, e.g. one Lance
``read_blob_ranges`` call for all the windows of a read):

1. :func:`probe_audio_index` (:mod:`lanceloader.media.audio_index`, whose names are
   importable from here too; once per file: ``ll.convert`` stores it as the columns of
   :func:`index_fields`, ``ll.audio_clips`` reads them back with :func:`index_from_row`): the
   file's :class:`~lanceloader.media.audio.AudioInfo` and its :class:`AudioIndex`: seek points
   (the first sample and the byte offset of a frame, ending with the end of the audio data),
   the bytes a decoder needs besides the frames (``header``) and the samples a decode must start
   before a window (``preroll``). Demuxing only, no decoding.
2. :func:`window_byte_ranges`: the ``(offset, length)`` ranges a window needs: the header and
   one run of frames, from the last seek point at or before ``start - preroll`` to the first at
   or after the window's end.
3. :func:`decode_window_from_ranges`: the window from those bytes alone, sample-exact: the same
   samples as :func:`~lanceloader.media.audio.decode_audio_window` of the whole file.

Per format:

* WAV (PCM, little-endian: 8/16/24/32-bit integers, 32/64-bit floats): pure arithmetic. Two
  seek points, the data chunk's start and end; a window is ``start × block_align`` bytes in,
  ``length × block_align`` long, no header; converted by NumPy as libsndfile converts (integers
  divided by 2^(bits-1), unsigned 8-bit centred).
* FLAC: a seek point per frame (PyAV's demuxer: each packet's position and timestamp); header:
  the ``fLaC`` marker and the STREAMINFO block (42 bytes, whatever pictures or padding follow);
  the frames decoded by FFmpeg's decoder (given the STREAMINFO) as one packet, from its
  start: FLAC frames are independent, so no preroll.
* MP3: a seek point per frame (PyAV's demuxer; samples count after the encoder's delay as every
  decoder counts them, so the first frames start before 0); no header (the LAME/Xing frame only
  says the delay, which the seek points hold); decoded by FFmpeg's MP3 decoder from the frames'
  bytes as one packet and placed from the end of the last frame. A frame's output
  needs the previous frame decoded (the overlap of the MDCT and the synthesis filter's history)
  with its main data, which the bit reservoir may keep up to 511 bytes back: ``preroll`` is the
  most samples any frame of the file needs decoded before it, from each frame's
  ``main_data_begin``, so the decode is exact.
* Opus, Vorbis, AIFF and anything else: no seek points; a window reads the whole file
  (:func:`window_byte_ranges` says so), as ``decode_audio`` does.

A long file's index keeps every k-th frame (:mod:`lanceloader.media.audio_index`): a window
then reads up to k - 1 frames more on each side.

Example:
    >>> import io, numpy as np, soundfile
    >>> flac = io.BytesIO()
    >>> soundfile.write(flac, np.sin(np.arange(160000) / 9), 16000, format="FLAC")
    >>> data = flac.getvalue()
    >>> info, index = probe_audio_index(data)
    >>> ranges = window_byte_ranges(index, len(data), start=20000, length=1600)
    >>> ranges[0], sum(n for _, n in ranges) < len(data) // 10
    ((0, 42), True)
    >>> parts = [(offset, data[offset : offset + n]) for offset, n in ranges]
    >>> window = decode_window_from_ranges(parts, info, index, 20000, 1600)
    >>> from lanceloader.media.audio import decode_audio_window
    >>> bool((window == decode_audio_window(data, 20000, 1600)).all())
    True
"""

from __future__ import annotations

import bisect
import io
import threading
from typing import Any

import numpy as np

from lanceloader.media.audio import (
    AudioInfo,
    AudioReader,
    _read_soundfile,
    check_window,
    finish_window,
    window_span,
)
from lanceloader.media.audio_index import (
    FLAC_HEADER,
    MAX_SEEK_POINTS,
    WHOLE,
    AudioIndex,
    index_fields,
    index_from_row,
    index_values,
    indexes_from_table,
    probe_audio_index,
)

__all__ = [  # the index's names too, so one import serves a reader of windows
    "FLAC_HEADER",
    "MAX_SEEK_POINTS",
    "WHOLE",
    "AudioIndex",
    "decode_flac_runs",
    "decode_flac_windows",
    "decode_window_from_ranges",
    "flac_run_samples",
    "index_fields",
    "index_from_row",
    "index_values",
    "indexes_from_table",
    "probe_audio_index",
    "window_byte_ranges",
    "window_span",
]


# WAV sample formats read by NumPy: codec -> (dtype, scale); pcm_s24 is widened first.
_PCM = {
    "pcm_u8": (np.uint8, 128.0),
    "pcm_s16": (np.dtype("<i2"), 32768.0),
    "pcm_s24": (np.dtype("<i4"), 2.0**31),
    "pcm_s32": (np.dtype("<i4"), 2.0**31),
    "pcm_f32": (np.dtype("<f4"), 1.0),
    "pcm_f64": (np.dtype("<f8"), 1.0),
}


# --- planning and decoding ------------------------------------------------------------------


def _frames_for(index: AudioIndex, start: int, length: int) -> tuple[int, int]:
    """The seek points ``(i, j)``: decode from point ``i`` to point ``j`` (exclusive end)."""
    samples = index.seek_samples
    i = max(0, bisect.bisect_right(samples, start - index.preroll) - 1)
    j = min(len(samples) - 1, bisect.bisect_left(samples, start + length))
    return i, max(j, i + 1)


def window_byte_ranges(
    index: AudioIndex, size: int, start: int, length: int
) -> list[tuple[int, int]]:
    """The ``(offset, length)`` ranges of a file of ``size`` bytes that the window of
    ``length`` samples from ``start`` needs (at the file's own rate: widen it by
    :func:`~lanceloader.media.audio.window_span` for a resampled window): the header, if any,
    and one run of frames; the whole file where the index has no seek points.

    >>> index = AudioIndex("flac", np.array([0, 4096, 8192, 9000]),
    ...     np.array([86, 1900, 3700, 4000]), (0, 42), 0)
    >>> window_byte_ranges(index, 4000, 5000, 100), window_byte_ranges(WHOLE, 4000, 0, 1)
    ([(0, 42), (1900, 1800)], [(0, 4000)])
    """
    if not index.ranged:
        return [(0, int(size))]
    if index.format == "wav":
        first, end = (int(v) for v in index.seek_offsets[:2])
        block = (end - first) // max(1, int(index.seek_samples[1]))
        return [(first + start * block, length * block)]
    i, j = _frames_for(index, start, length)
    lo, hi = int(index.seek_offsets[i]), int(index.seek_offsets[j])
    ranges = [(int(index.header[0]), int(index.header[1]))] if index.header[1] else []
    return [*ranges, (lo, hi - lo)]


def decode_window_from_ranges(
    parts: list[tuple[int, bytes]],
    info: AudioInfo,
    index: AudioIndex,
    start: int,
    length: int,
    *,
    sample_rate: int | None = None,
    channels: int | None = None,
    decoded: np.ndarray | None = None,
) -> np.ndarray:
    """The window of :func:`~lanceloader.media.audio.decode_audio_window` (same arguments and
    result, ``[C, T]`` float32) from ``parts``: ``(offset, bytes)`` of the ranges that
    :func:`window_byte_ranges` gave for the window's span
    (:func:`~lanceloader.media.audio.window_span`). A ``WHOLE`` index decodes the whole file,
    the one part. Raises ``ValueError`` for parts that are not those ranges, or bytes that do
    not decode to the window (a corrupt file or a stale index). ``decoded``: a FLAC window's
    run of frames already decoded (:func:`decode_flac_runs`), used instead of decoding it here.

    >>> wav = AudioIndex("wav", np.array([0, 4]), np.array([44, 52]), (0, 0), 0)
    >>> info = AudioInfo(8000, 1, 4, 0.0005, "pcm_s16")
    >>> decode_window_from_ranges([(46, b"\\x00\\x40\\x00\\xc0")], info, wav, 1, 2)
    array([[ 0.5, -0.5]], dtype=float32)
    """
    rate, target = check_window(info, start, length, sample_rate, channels)
    first, count = window_span(info, start, length, rate)
    if not index.ranged:
        if len(parts) != 1 or parts[0][0] != 0:
            raise ValueError("a file without a byte index is decoded from one part: all of it")
        with AudioReader(parts[0][1]) as reader:
            return reader.window(start, length, sample_rate=sample_rate, channels=channels)
    wanted = window_byte_ranges(index, 0, first, count)
    got = [(int(o), len(b)) for o, b in parts]
    if got != wanted:
        raise ValueError(
            f"the parts {got} are not the ranges {wanted} the samples [{first}, "
            f"{first + count}) need: pass the parts of window_byte_ranges(index, size, "
            f"{first}, {count})"
        )
    data = parts[-1][1]
    try:
        if index.format == "wav":
            samples = _pcm(data, info)
        elif index.format == "flac":
            samples = _flac(parts[0][1], data, index, first, count, decoded)
        else:
            samples = _mp3(data, index, info, first, count)
    except (ValueError, RuntimeError, OSError) as exc:  # PyAV's and libsndfile's errors
        raise ValueError(
            f"the {index.format} bytes of samples [{first}, {first + count}) do not decode "
            f"({type(exc).__name__}: {exc}): the file is damaged or its index is stale; "
            "reconvert it with ll.convert"
        ) from exc
    if samples.shape != (info.channels, count):
        raise ValueError(
            f"the bytes decoded to {samples.shape[1]} samples where the index places "
            f"{count} from sample {first}: the file is damaged or its index is stale; "
            "reconvert it with ll.convert"
        )
    return finish_window(samples, info, start, length, rate, target)


def _pcm(data: bytes, info: AudioInfo) -> np.ndarray:
    """Interleaved little-endian PCM as ``[C, n]`` float32, as libsndfile converts it."""
    dtype, scale = _PCM[info.codec]
    if info.codec == "pcm_s24":
        raw = np.frombuffer(data, np.uint8).reshape(-1, 3)
        wide = np.zeros((len(raw), 4), np.uint8)
        wide[:, 1:] = raw  # the 24 bits in the top of an int32
        values = wide.view("<i4").ravel()
    else:
        values = np.frombuffer(data, dtype)
    out = values.astype(np.float32)
    if info.codec == "pcm_u8":
        out -= 128.0
    if scale != 1.0:
        out *= np.float32(1.0 / scale)
    return np.ascontiguousarray(out.reshape(-1, info.channels).T)


def _flac(
    header: bytes,
    frames: bytes,
    index: AudioIndex,
    first: int,
    count: int,
    decoded: np.ndarray | None = None,
) -> np.ndarray:
    """The samples ``[first, first + count)`` from the STREAMINFO and a run of FLAC frames
    (independent of each other: no preroll), decoded by FFmpeg's decoder from one packet of
    them all (it decodes a packet's frames one after the other), or already decoded with the
    read's other windows (``decoded``: :func:`decode_flac_runs`). One packet per window, not
    one per frame, costs less CPU (docs/performance.md, "Audio decoding"). Where
    FFmpeg's samples are not 16 or 32-bit integers, libsndfile reads a small file of the header
    (marked the last metadata block) and the frames. Both give libsndfile's floats: integers
    divided by 2^(bits-1)."""
    i, _ = _frames_for(index, first, count)
    skip = first - int(index.seek_samples[i])
    samples = decoded if decoded is not None else _flac_frames(header[8:], frames)
    if samples is not None:
        return np.ascontiguousarray(samples[:, skip : skip + count])
    import soundfile

    head = bytearray(header)
    head[4] |= 0x80  # the last metadata block
    with soundfile.SoundFile(io.BytesIO(bytes(head) + frames)) as f:
        read = _read_soundfile(f, skip + count)
    return np.ascontiguousarray(read[skip:].T)


def flac_run_samples(index: AudioIndex, first: int, count: int) -> int:
    """The samples of the run of FLAC frames that the window ``[first, first + count)`` reads
    (:func:`window_byte_ranges`): from its first seek point to its last."""
    i, j = _frames_for(index, first, count)
    return int(index.seek_samples[j] - index.seek_samples[i])


def decode_flac_runs(runs: list[tuple[bytes, bytes, int]]) -> list[np.ndarray | None]:
    """Runs of FLAC frames, each ``(header, frames, samples)`` (the 42-byte ``fLaC`` and
    STREAMINFO header, the frames' bytes, the samples they hold: :func:`flac_run_samples`),
    decoded as ``[C, samples]`` float32: the runs of files recorded alike (one decoder,
    :func:`_flac_decoder`) in **one** packet through FFmpeg, split back at the runs' sample
    counts. A read's windows then cost one decode call, not one each: the Python around each
    call holds the GIL, which two workers' threads queue for (docs/performance.md, "Audio
    decoding"). ``None`` for a run whose group did not decode to exactly its samples (a
    damaged file) or to 16/32-bit integers: decode it alone, which names the error.

    >>> import io, soundfile
    >>> flac = io.BytesIO()
    >>> soundfile.write(flac, np.sin(np.arange(40000) / 9), 16000, format="FLAC")
    >>> data = flac.getvalue()
    >>> info, index = probe_audio_index(data)
    >>> runs = []
    >>> for start in (1000, 30000):
    ...     (h, hn), (o, n) = window_byte_ranges(index, len(data), start, 1600)
    ...     runs.append((data[h : h + hn], data[o : o + n], flac_run_samples(index, start, 1600)))
    >>> [r.shape for r in decode_flac_runs(runs)]
    [(1, 4096), (1, 4096)]
    """
    out: list[np.ndarray | None] = [None] * len(runs)
    groups: dict[bytes, list[int]] = {}
    for k, (header, _, _) in enumerate(runs):
        groups.setdefault(_decoder_key(header[8:]), []).append(k)
    for members in groups.values():
        frames = b"".join(runs[k][1] for k in members)
        try:
            samples = _flac_frames(runs[members[0]][0][8:], frames)
        except (ValueError, RuntimeError, OSError):  # PyAV's errors: a damaged run
            samples = None
        sizes = [runs[k][2] for k in members]
        if samples is None or samples.shape[1] != sum(sizes):
            continue
        for k, part in zip(members, np.split(samples, np.cumsum(sizes)[:-1], axis=1), strict=True):
            out[k] = part
    return out


def decode_flac_windows(
    windows: list[tuple[list[tuple[int, bytes]], AudioInfo, AudioIndex, int, int]],
    sample_rate: int | None = None,
) -> list[np.ndarray | None]:
    """For windows ``(parts, info, index, start, length)`` (the arguments of
    :func:`decode_window_from_ranges`, ``sample_rate`` too), the run of frames of each FLAC
    window read by range, decoded together with the others (:func:`decode_flac_runs`), to pass
    as its ``decoded``; ``None`` for other windows and for a run that did not decode."""
    out: list[np.ndarray | None] = [None] * len(windows)
    flac, runs = [], []
    for k, (parts, info, index, start, length) in enumerate(windows):
        if index.format == "flac" and index.ranged and len(parts) == 2:
            first, count = window_span(info, start, length, sample_rate)
            flac.append(k)
            runs.append((parts[0][1], parts[1][1], flac_run_samples(index, first, count)))
    for k, decoded in zip(flac, decode_flac_runs(runs) if runs else [], strict=True):
        out[k] = decoded
    return out


def _decoder_key(streaminfo: bytes) -> bytes:
    """What FFmpeg's FLAC decoder takes from a STREAMINFO to decode a frame: the block sizes,
    sample rate, channels and bits per sample (not the frame sizes, length or MD5 signature)."""
    return streaminfo[:4] + streaminfo[10:13] + bytes([streaminfo[13] & 0xF0])


_decoders = threading.local()


def _flac_decoder(streaminfo: bytes) -> Any:
    """This thread's FFmpeg FLAC decoder for streams like ``streaminfo``, made at its first use.
    Keyed by what the decoder takes from the STREAMINFO to decode a frame (block sizes, sample
    rate, channels, bits per sample), not by the frame sizes, length or MD5 signature, which
    differ from file to file: files recorded alike share one decoder (FLAC frames carry no
    state from one to the next), and making one, which holds the GIL (a quarter of a crop's
    GIL-held time, measured), happens once per thread. One per thread: a decoder is not safe
    to share."""
    import av

    key = _decoder_key(streaminfo)
    held = getattr(_decoders, "flac", None)
    if held is None or held[0] != key:
        codec = av.CodecContext.create("flac", "r")
        codec.extradata = streaminfo
        held = _decoders.flac = (key, codec, av.Packet)
    return held


def _flac_frames(streaminfo: bytes, frames: bytes) -> np.ndarray | None:
    """A run of FLAC frames decoded by FFmpeg as one packet, as ``[C, n]`` float32; ``None``
    for a sample format other than 16 or 32-bit integers. A decoder that fails is dropped (the
    next window makes a new one) and its error raised."""
    _, codec, packet = _flac_decoder(streaminfo)
    try:
        decoded = codec.decode(packet(frames))
    except BaseException:
        _decoders.flac = None
        raise
    if not decoded:
        return None
    fmt = decoded[0].format
    dtype = {"s16": np.int16, "s16p": np.int16, "s32": np.int32, "s32p": np.int32}.get(fmt.name)
    if dtype is None:
        return None
    channels = ((streaminfo[12] >> 1) & 7) + 1  # STREAMINFO: 3 bits after the sample rate
    if fmt.is_planar:
        ints = np.stack(
            [
                np.concatenate([np.frombuffer(f.planes[c], dtype, f.samples) for f in decoded])
                for c in range(channels)
            ]
        )
    else:
        ints = (
            np.concatenate(
                [np.frombuffer(f.planes[0], dtype, f.samples * channels) for f in decoded]
            )
            .reshape(-1, channels)
            .T
        )
    out = ints.astype(np.float32)
    out *= np.float32(1.0 / (32768.0 if dtype == np.int16 else 2.0**31))
    return out


def _mp3(data: bytes, index: AudioIndex, info: AudioInfo, first: int, count: int) -> np.ndarray:
    """FFmpeg's MP3 decoder over the frames, given as one packet (it decodes a packet's frames
    one after the other: the same samples as a packet per frame, at less CPU, and one call's
    Python instead of one per frame: docs/performance.md, "Audio decoding"), the output placed
    from the end of the last frame (the first frames' reservoir may be missing: they are the
    preroll, thrown away)."""
    import av

    from lanceloader.media.audio import _planar_float

    codec = av.CodecContext.create("mp3float", "r")
    frames = codec.decode(av.Packet(data)) + codec.decode(None)
    if frames and all(f.format.name == "fltp" for f in frames):  # mp3float's own: no copy
        decoded = np.stack(
            [
                np.concatenate([np.frombuffer(f.planes[c], np.float32, f.samples) for f in frames])
                for c in range(info.channels)
            ]
        )
    else:
        pieces = [_planar_float(frame, info.channels) for frame in frames]
        decoded = np.concatenate(pieces, axis=1) if pieces else np.zeros((info.channels, 0), "f4")
    _, j = _frames_for(index, first, count)
    end = int(index.seek_samples[j])  # the sample after the last frame's output
    skip = first - (end - decoded.shape[1])
    if skip < 0:
        return np.zeros((info.channels, 0), np.float32)  # fewer samples than the index says
    return np.ascontiguousarray(decoded[:, skip : skip + count])
