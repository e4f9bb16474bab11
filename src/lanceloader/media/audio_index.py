"""Audio byte index: where each stretch of a file's audio lies, found once per file.

:func:`probe_audio_index` demuxes a file (no decoding) into an :class:`AudioIndex`: seek points
(the first sample and byte offset of a frame, ending with the end of the audio data), the
bytes a decoder needs besides the frames (``header``) and the samples a decode must start
before a window (``preroll``: MP3's bit reservoir). ``ll.convert`` stores it as the columns of
:func:`index_fields`; ``ll.audio_clips`` reads them back (:func:`indexes_from_table`) and
:mod:`lanceloader.media.audio_ranges` plans and decodes windows from it (the formats: there).

A file of more than :data:`MAX_SEEK_POINTS` frames keeps every k-th frame's point (k the
smallest that fits), so the index stays at most 64 KiB per file (a long file's window then reads
up to k - 1 frames more on each side).

Example:
    >>> import io, numpy as np, soundfile
    >>> flac = io.BytesIO()
    >>> soundfile.write(flac, np.zeros(20000), 16000, format="FLAC")
    >>> info, index = probe_audio_index(flac.getvalue())
    >>> index.format, index.header, index.seek_samples.tolist()
    ('flac', (0, 42), [0, 4096, 8192, 12288, 16384, 20000])
"""

from __future__ import annotations

import io
import itertools
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from lanceloader.media.audio import AudioInfo, AudioReader, _kind

MAX_SEEK_POINTS = 4096  # per file: 64 KiB of index (two int64 lists)
FLAC_HEADER = 42  # "fLaC", a metadata block header (4 bytes) and STREAMINFO (34)
# Bytes per sample of the WAV codecs read by byte range (little-endian PCM).
PCM_WIDTHS = {"pcm_u8": 1, "pcm_s16": 2, "pcm_s24": 3, "pcm_s32": 4, "pcm_f32": 4, "pcm_f64": 8}


@dataclass(frozen=True, eq=False)
class AudioIndex:
    """Where a file's audio lies (see the module's text).

    ``format``: ``"wav"``, ``"flac"``, ``"mp3"`` or ``"whole"`` (no ranged reads);
    ``seek_samples``/``seek_offsets``: int64, rising: the first sample (at the file's rate,
    after the encoder's delay) and the byte offset of each seek point's frame, the last one the
    end of the audio data; ``header``: (offset, length) of the bytes a decoder needs besides
    the frames (length 0: none); ``preroll``: samples to decode before a window (MP3).

    Example:
        >>> index = AudioIndex("wav", np.array([0, 800]), np.array([44, 1644]), (0, 0), 0)
        >>> index.ranged, WHOLE.ranged
        (True, False)
    """

    format: str
    seek_samples: np.ndarray
    seek_offsets: np.ndarray
    header: tuple[int, int]
    preroll: int

    @property
    def ranged(self) -> bool:
        """Whether a window reads only its bytes (else the whole file)."""
        return self.format != "whole" and len(self.seek_offsets) >= 2


WHOLE = AudioIndex("whole", np.zeros(0, np.int64), np.zeros(0, np.int64), (0, 0), 0)


def probe_audio_index(data: bytes) -> tuple[AudioInfo, AudioIndex]:
    """The file's :class:`~lanceloader.media.audio.AudioInfo` (as ``probe_audio``) and its
    :class:`AudioIndex` (``WHOLE`` for a format without ranged reads). Raises ``ValueError`` for
    a file that cannot be read, naming it.

    >>> import io, numpy as np, soundfile
    >>> wav = io.BytesIO(); soundfile.write(wav, np.zeros((800, 2)), 16000, format="WAV")
    >>> info, index = probe_audio_index(wav.getvalue())
    >>> index.format, index.seek_offsets.tolist(), info.frames
    ('wav', [44, 3244], 800)
    """
    with AudioReader(data) as reader:
        info = reader.info
    view = memoryview(data).cast("B")
    kind = _kind(view)
    if kind == "wav" and info.codec in PCM_WIDTHS:
        return info, _wav_index(view, info)
    if kind in ("flac", "mp3") and info.frames > 0:
        return info, _packet_index(view, info, kind)
    return info, WHOLE


def _wav_index(view: memoryview, info: AudioInfo) -> AudioIndex:
    """The data chunk's bounds from the RIFF chunks (``WHOLE`` for RF64 or an odd layout)."""
    if bytes(view[:4]) != b"RIFF":
        return WHOLE
    at, block = 12, 0
    while at + 8 <= len(view):
        name, size = bytes(view[at : at + 4]), struct.unpack("<I", view[at + 4 : at + 8])[0]
        if name == b"fmt " and size >= 16:
            block = struct.unpack("<H", view[at + 20 : at + 22])[0]
        if name == b"data":
            width = PCM_WIDTHS[info.codec] * info.channels
            if block != width:
                return WHOLE  # not plain interleaved PCM of the codec's width
            first = at + 8
            end = first + info.frames * block
            return AudioIndex("wav", np.array([0, info.frames]), np.array([first, end]), (0, 0), 0)
        at += 8 + size + (size & 1)
    return WHOLE


def _packet_index(view: memoryview, info: AudioInfo, kind: str) -> AudioIndex:
    """Seek points from PyAV's demuxer (position and timestamp of every packet)."""
    import av

    samples, offsets, sizes = [], [], []
    with av.open(io.BytesIO(bytes(view))) as container:
        stream = container.streams.audio[0]
        origin, base, rate = stream.start_time or 0, stream.time_base, info.sample_rate
        for packet in container.demux(stream):
            if not packet.size or packet.pos is None or packet.pos < 0 or packet.pts is None:
                continue
            samples.append(round((packet.pts - origin) * base * rate))
            offsets.append(int(packet.pos))
            sizes.append(int(packet.size))
    if not offsets or any(b <= a for a, b in itertools.pairwise(offsets)):
        return WHOLE  # positions unknown or not rising: read the whole file
    # An MP3 frame holds 1152 samples (MPEG-1) or 576 (MPEG-2 and 2.5); FLAC ends at the file's.
    per_frame = 1152 if (view[offsets[0] + 1] >> 3) & 3 == 3 else 576
    samples.append(samples[-1] + per_frame if kind == "mp3" else info.frames)
    offsets.append(offsets[-1] + sizes[-1])
    preroll = 0
    if kind == "mp3":
        frames_back = _mp3_frames_back(view, offsets[:-1], sizes)
        if frames_back == 0:
            return WHOLE  # a packet that is not one whole frame: no ranged reads
        preroll = frames_back * per_frame
    every = -(-(len(offsets) - 1) // (MAX_SEEK_POINTS - 1))  # keep every k-th frame's point
    keep = [*range(0, len(offsets) - 1, every), len(offsets) - 1]
    return AudioIndex(
        kind,
        np.array([samples[i] for i in keep], np.int64),
        np.array([offsets[i] for i in keep], np.int64),
        (0, FLAC_HEADER) if kind == "flac" else (0, 0),
        int(preroll),
    )


_MP3_KBPS = {
    True: (0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320),  # MPEG-1
    False: (0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160),  # MPEG-2 and 2.5
}
_MP3_RATES = {3: (44100, 48000, 32000), 2: (22050, 24000, 16000), 0: (11025, 12000, 8000)}


def mp3_frame_length(header: bytes) -> int:
    """The length in bytes of the MPEG audio layer III frame that starts with ``header`` (its
    4 bytes), or 0 where they are not one (another layer, a free or bad bitrate or rate).

    >>> mp3_frame_length(bytes.fromhex("fffb9064")), mp3_frame_length(b"ID3\x04")
    (417, 0)
    """
    if len(header) < 4 or header[0] != 0xFF or header[1] & 0xE0 != 0xE0:
        return 0
    version, layer = (header[1] >> 3) & 3, (header[1] >> 1) & 3
    bitrate, rate, padding = header[2] >> 4, (header[2] >> 2) & 3, (header[2] >> 1) & 1
    if layer != 1 or version == 1 or bitrate in (0, 15) or rate == 3:
        return 0
    mpeg1 = version == 3
    per_frame = 144 if mpeg1 else 72  # bytes per (kbit/s / kHz): 1152 or 576 samples
    return per_frame * _MP3_KBPS[mpeg1][bitrate] * 1000 // _MP3_RATES[version][rate] + padding


def _mp3_frames_back(view: memoryview, offsets: list[int], sizes: list[int]) -> int:
    """The most frames any frame's exact decode must start before it. Frame j's output is
    its MDCT overlapped with frame j-1's, through a synthesis filter whose history (480
    samples) is frame j-1's output, itself overlapped with frame j-2's: frames j-2 to j need
    their main data, which ``main_data_begin`` places up to 511 bytes back in earlier frames
    (the bit reservoir). 0 where a packet is not one whole frame by its header (ranged reads
    are then not used)."""
    needs = []  # the first frame whose main data frame j's reservoir reaches into
    main_sizes: list[int] = []
    for j, (at, size) in enumerate(zip(offsets, sizes, strict=True)):
        header = bytes(view[at : at + 6])
        if mp3_frame_length(header) != size:
            return 0
        mpeg1 = (header[1] >> 3) & 3 == 3
        crc = 0 if header[1] & 1 else 2
        mono = (header[3] >> 6) & 3 == 3
        side = (17 if mono else 32) if mpeg1 else (9 if mono else 17)
        first = view[at + 4 + crc]
        begin = ((first << 1) | (view[at + 5 + crc] >> 7)) if mpeg1 else first
        k, have = j, 0
        while have < begin and k > 0:
            k -= 1
            have += main_sizes[k]
        needs.append(k)
        main_sizes.append(max(0, size - 4 - crc - side))
    back = 2
    for j in range(2, len(needs)):
        back = max(back, j - min(needs[j - 2 : j + 1]))
    return back


# --- the index as columns -----------------------------------------------------------------

_FIELDS = [
    ("seek_samples", pa.list_(pa.int64())),
    ("seek_offsets", pa.list_(pa.int64())),
    ("header_offset", pa.int64()),
    ("header_length", pa.int64()),
    ("preroll", pa.int64()),
]
INFO_FIELDS = [
    ("sample_rate", pa.int64()),
    ("channels", pa.int64()),
    ("frames", pa.int64()),
    ("duration", pa.float64()),
    ("codec", pa.string()),
]


def index_fields(column: str) -> list[pa.Field]:
    """The columns ``convert`` writes beside the audio blob column ``column``: the file's info
    and its byte index.

    >>> [f.name for f in index_fields("audio")][4:7]
    ['audio_codec', 'audio_seek_samples', 'audio_seek_offsets']
    """
    return [pa.field(f"{column}_{name}", typ) for name, typ in (*INFO_FIELDS, *_FIELDS)]


def index_values(info: AudioInfo, index: AudioIndex, column: str) -> dict[str, Any]:
    """One row of :func:`index_fields`.

    >>> info = AudioInfo(8000, 1, 800, 0.1, "pcm_s16")
    >>> index_values(info, WHOLE, "audio")["audio_seek_offsets"]
    []
    """
    values = {
        "sample_rate": info.sample_rate,
        "channels": info.channels,
        "frames": info.frames,
        "duration": info.duration_s,
        "codec": info.codec,
        "seek_samples": index.seek_samples.tolist(),
        "seek_offsets": index.seek_offsets.tolist(),
        "header_offset": index.header[0],
        "header_length": index.header[1],
        "preroll": index.preroll,
    }
    return {f"{column}_{name}": value for name, value in values.items()}


def index_from_row(row: dict[str, Any], column: str) -> tuple[AudioInfo, AudioIndex]:
    """The info and index of one row of :func:`index_fields` (its ``to_pylist()`` dict).

    >>> info = AudioInfo(8000, 1, 800, 0.1, "pcm_s16")
    >>> index = AudioIndex("wav", np.array([0, 800]), np.array([44, 1644]), (0, 0), 0)
    >>> back = index_from_row(index_values(info, index, "a"), "a")
    >>> back[0] == info, back[1].format, back[1].seek_offsets.tolist()
    (True, 'wav', [44, 1644])
    """
    c = f"{column}_"
    info = AudioInfo(
        int(row[c + "sample_rate"]),
        int(row[c + "channels"]),
        int(row[c + "frames"]),
        float(row[c + "duration"]),
        str(row[c + "codec"]),
    )
    offsets = np.asarray(_or_empty(row[c + "seek_offsets"]), np.int64)
    codec = info.codec
    fmt = (
        "whole"
        if len(offsets) < 2
        else "flac"
        if codec == "flac"
        else "mp3"
        if codec == "mp3"
        else "wav"
        if codec in PCM_WIDTHS
        else "whole"
    )
    return info, AudioIndex(
        fmt,
        np.asarray(_or_empty(row[c + "seek_samples"]), np.int64),
        offsets,
        (int(row[c + "header_offset"]), int(row[c + "header_length"])),
        int(row[c + "preroll"]),
    )


def _or_empty(values: Any) -> Any:
    return [] if values is None else values


def indexes_from_table(table: pa.Table, column: str) -> list[tuple[AudioInfo, AudioIndex]]:
    """:func:`index_from_row` of every row of a table of :func:`index_fields` columns, reading
    the seek lists as NumPy views of the Arrow buffers (no Python int per seek point).

    >>> info = AudioInfo(8000, 1, 800, 0.1, "pcm_s16")
    >>> index = AudioIndex("wav", np.array([0, 800]), np.array([44, 1644]), (0, 0), 0)
    >>> table = pa.Table.from_pylist([index_values(info, index, "a")] * 2)
    >>> [(i.frames, x.seek_offsets.tolist()) for i, x in indexes_from_table(table, "a")]
    [(800, [44, 1644]), (800, [44, 1644])]
    """
    c = f"{column}_"
    scalars = table.select([c + n for n, _ in INFO_FIELDS] + [c + n for n, _ in _FIELDS[2:]])
    rows = scalars.to_pylist()
    lists = {}
    for name in ("seek_samples", "seek_offsets"):
        array = table.column(c + name).combine_chunks().cast(pa.list_(pa.int64()))
        bounds = array.offsets.to_numpy()
        values = array.values.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
        lists[name] = [values[bounds[i] : bounds[i + 1]] for i in range(len(array))]
    out = []
    for i, row in enumerate(rows):
        row[c + "seek_samples"] = lists["seek_samples"][i]
        row[c + "seek_offsets"] = lists["seek_offsets"][i]
        out.append(index_from_row(row, column))
    return out
