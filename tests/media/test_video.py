"""Video probing and frame-accurate clip decoding from byte ranges (lanceloader.media.video).

Real videos, encoded here by PyAV (tests/mediagen.py): every frame carries its index in its
pixels, so a clip's frames are checked against both a plain decode of the whole file and the
frame numbers themselves."""

from __future__ import annotations

import dataclasses
import io

import av
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lanceloader.media.keyframes import clean_keyframes
from lanceloader.media.video import (
    MissingBytes,
    VideoError,
    VideoInfo,
    clip_byte_ranges,
    decode_clip,
    decode_whole,
    index_fields,
    index_values,
    info_from_row,
    probe_video,
)
from mediagen import frame_index_of, vfr_pts, write_video

FRAMES = 48
VIDEOS = {
    # name: (write_video keywords, GOP length)
    "bframes.mp4": ({"gop": 8, "bframes": 2}, 8),
    "moov-at-end.mp4": ({"gop": 6, "bframes": 0, "faststart": False}, 6),
    "bframes.mkv": ({"gop": 12, "bframes": 3}, 12),
    "with-audio.mov": ({"gop": 10, "bframes": 1, "faststart": False, "audio": True}, 10),
    "yuv444.mp4": ({"gop": 8, "bframes": 2, "pix_fmt": "yuv444p"}, 8),
}


class Videos(dict):
    """name → (bytes, probe, every frame decoded from the whole file); a short repr for
    hypothesis' reports."""

    def __repr__(self) -> str:
        return f"Videos({sorted(self)})"


@pytest.fixture(scope="module")
def videos(tmp_path_factory) -> Videos:
    folder = tmp_path_factory.mktemp("videos")
    out = Videos()
    for name, (keywords, _) in VIDEOS.items():
        data = write_video(folder / name, FRAMES, 24, (48, 64), **keywords).read_bytes()
        out[name] = (data, probe_video(data), decode_whole(data, 0, FRAMES))
    return out


def gop_bytes(data: bytes, info: VideoInfo, first: int, last: int) -> int:
    """Bytes of GOPs ``first`` … ``last``: from one's keyframe to the next keyframe after the
    other, or to the end of the media data (the moov box after it, or the file's end)."""
    ends = [*info.keyframe_offsets.tolist()]
    ends.append(info.header[0] if info.header[0] > ends[-1] else len(data))
    return ends[last + 1] - ends[first]


def parts_of(data: bytes, ranges: list[tuple[int, int]]) -> list[tuple[int, bytes]]:
    return [(offset, data[offset : offset + length]) for offset, length in ranges]


def test_probe_finds_every_frame_and_keyframe(videos):
    for name, (_, gop) in VIDEOS.items():
        data, info, whole = videos[name]
        assert info.frames == FRAMES and info.fps == 24.0 and info.codec == "h264"
        assert (info.height, info.width) == (48, 64)
        assert info.duration_s == pytest.approx(FRAMES / 24)
        assert info.keyframes.tolist() == list(range(0, FRAMES, gop)), name
        assert (info.keyframe_offsets > 0).all() and (info.keyframe_offsets < len(data)).all()
        assert [frame_index_of(frame) for frame in whole] == list(range(FRAMES)), name


def test_moov_box_is_located_at_start_or_end_and_absent_for_mkv(videos):
    data, info, _ = videos["bframes.mp4"]
    offset, length = info.header
    assert data[offset + 4 : offset + 8] == b"moov" and offset < info.keyframe_offsets[0]
    data, info, _ = videos["moov-at-end.mp4"]
    offset, length = info.header
    assert data[offset + 4 : offset + 8] == b"moov" and offset + length == len(data)
    data, info, _ = videos["bframes.mkv"]
    assert info.header is None and not info.ranged
    assert clip_byte_ranges(info, len(data), 13, 4, 2) == [(0, len(data))]


def test_a_fragmented_mp4_is_read_whole(tmp_path):
    data = write_video(tmp_path / "f.mp4", 20, 10, (48, 64), gop=5, fragmented=True).read_bytes()
    info = probe_video(data)
    assert b"moof" in data and info.header is None and info.keyframes.tolist() == [0, 5, 10, 15]
    assert clip_byte_ranges(info, len(data), 11, 3, 2) == [(0, len(data))]
    clip = decode_clip([(0, data)], len(data), info, 11, 3, 2)
    assert [frame_index_of(frame) for frame in clip] == [11, 13, 15]


@settings(max_examples=40, deadline=None)
@given(
    name=st.sampled_from(sorted(VIDEOS)),
    start=st.integers(0, FRAMES - 1),
    frames=st.integers(1, 12),
    stride=st.integers(1, 9),
)
def test_clip_from_its_ranges_equals_the_whole_file_decode(videos, name, start, frames, stride):
    data, info, whole = videos[name]
    start = min(start, FRAMES - 1 - (frames - 1) * stride)
    if start < 0:
        return
    wanted = list(range(start, start + frames * stride, stride))
    ranges = clip_byte_ranges(info, len(data), start, frames, stride)
    clip = decode_clip(parts_of(data, ranges), len(data), info, start, frames, stride)
    assert [frame_index_of(frame) for frame in clip] == wanted
    assert (clip == whole[wanted]).all()
    if info.ranged:  # bytes read ≤ 2× the bytes of the GOPs the clip spans
        spanned = gop_bytes(data, info, info.gop_of(wanted[0]), info.gop_of(wanted[-1]))
        assert sum(length for _, length in ranges) <= 2 * spanned


@settings(max_examples=25, deadline=None)
@given(
    name=st.sampled_from(sorted(VIDEOS)),
    start=st.integers(0, FRAMES - 1),
    frames=st.integers(1, 8),
    stride=st.integers(1, 5),
    channels_first=st.booleans(),
    resize=st.sampled_from([None, (24, 32)]),
)
def test_a_clip_decoded_into_a_given_buffer_in_either_layout_equals_the_reference(
    videos, name, start, frames, stride, channels_first, resize
):
    data, info, _ = videos[name]
    start = min(start, FRAMES - 1 - (frames - 1) * stride)
    if start < 0:
        return
    height, width = resize or (info.height, info.width)
    shape = (frames, 3, height, width) if channels_first else (frames, height, width, 3)
    batch = np.full((3, *shape), 7, np.uint8)  # the clip's place in a batch: the middle one
    ranges = clip_byte_ranges(info, len(data), start, frames, stride)
    clip = decode_clip(parts_of(data, ranges), len(data), info, start, frames, stride,
                       resize=resize, out=batch[1], channels_first=channels_first)  # fmt: skip
    assert clip is batch[1] or np.shares_memory(clip, batch[1])
    want = decode_whole(data, start, frames, stride, resize=resize)  # packed RGB, channels last
    got = batch[1].transpose(0, 2, 3, 1) if channels_first else batch[1]
    assert np.array_equal(got, want), (name, start, frames, stride, channels_first, resize)
    assert (batch[0] == 7).all() and (batch[2] == 7).all()  # nothing written outside its place


def test_concurrent_decodes_share_the_cores_and_one_alone_takes_them_all(videos):
    """A decode that starts while another runs takes the cores the other leaves (two cores:
    one FFmpeg thread; frame threads on busy cores only cost CPU time); one alone takes all."""
    import threading

    from lanceloader.media import decoder as media

    chosen: list[int] = []
    both_in = threading.Barrier(2, timeout=30)

    class Recording(media.PyAVDecoder):
        def _decode(self, *args):
            chosen.append(args[-1])
            both_in.wait()  # both decodes are counted in before either finishes
            return super()._decode(*args)

    data, info, _ = videos["bframes.mp4"]

    def decode() -> None:
        decode_clip([(0, data)], len(data), info, 3, 4, decoder=Recording())

    cores = media._DECODES.cores
    threads = [threading.Thread(target=decode) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert chosen == [cores, max(1, cores // 2)], chosen
    chosen.clear()
    both_in = threading.Barrier(1, timeout=30)
    decode()
    assert chosen == [cores], "a decode alone takes every core"


def test_resize_matches_the_reference_and_keeps_frame_identity(videos):
    data, info, _ = videos["bframes.mp4"]
    ranges = clip_byte_ranges(info, len(data), 9, 4, 3)
    clip = decode_clip(parts_of(data, ranges), len(data), info, 9, 4, 3, resize=(24, 32))
    assert clip.shape == (4, 24, 32, 3)
    assert (clip == decode_whole(data, 9, 4, 3, resize=(24, 32))).all()
    assert [frame_index_of(frame) for frame in clip] == [9, 12, 15, 18]


@pytest.mark.parametrize("name", ["bframes.mp4", "moov-at-end.mp4"])
def test_a_withheld_part_is_asked_for_then_served(videos, name):
    data, info, whole = videos[name]
    ranges = clip_byte_ranges(info, len(data), 20, 3, 1)
    for withheld in range(len(ranges)):
        parts = parts_of(data, ranges[:withheld] + ranges[withheld + 1 :])
        with pytest.raises(MissingBytes) as caught:
            decode_clip(parts, len(data), info, 20, 3, 1)
        offset, length = ranges[withheld]
        missing = caught.value
        assert offset <= missing.offset and missing.offset + missing.length <= offset + length
        parts.append((missing.offset, data[missing.offset : missing.offset + missing.length]))
        while True:  # serve what is asked for until the clip decodes
            try:
                clip = decode_clip(parts, len(data), info, 20, 3, 1)
                break
            except MissingBytes as again:
                parts.append((again.offset, data[again.offset : again.offset + again.length]))
        assert (clip == whole[20:23]).all()


def test_index_columns_round_trip_through_arrow(videos):
    for data, info, _ in videos.values():
        table = pa.Table.from_pylist([index_values(info, "clip")], pa.schema(index_fields("clip")))
        back = info_from_row(table.to_pylist()[0], "clip")
        assert index_values(back, "clip") == index_values(info, "clip")
        assert clip_byte_ranges(back, len(data), 5, 3, 4) == clip_byte_ranges(
            info, len(data), 5, 3, 4
        )
    with pytest.raises(KeyError, match="video_keyframes"):
        info_from_row({"video_frames": 3})


def test_open_gop_keyframes_are_left_out_of_the_index():
    # decode order: I0 P3 B1 B2 | I6(open: B4 B5 follow it and show before it) B4 B5 P9 B7 B8
    pts = [0, 3, 1, 2, 6, 4, 5, 9, 7, 8]
    keys = [True, False, False, False, True, False, False, False, False, False]
    ordinals, offsets = clean_keyframes(*map(np.array, (pts, range(10), keys)))
    assert ordinals.tolist() == [0] and offsets.tolist() == [0]
    closed = [0, 3, 1, 2, 4, 7, 5, 6]
    keys = [True, False, False, False, True, False, False, False]
    ordinals, offsets = clean_keyframes(*map(np.array, (closed, range(8), keys)))
    assert ordinals.tolist() == [0, 4] and offsets.tolist() == [0, 4]


def test_damaged_files_raise_an_error_naming_the_problem(videos, tmp_path):
    with pytest.raises(VideoError, match="not a readable video"):
        probe_video(b"this is not a video at all" * 100)
    data, _, _ = videos["bframes.mp4"]  # moov first: cut the media data short
    with pytest.raises(VideoError, match="truncated"):
        probe_video(data[: len(data) // 2])
    data, _, _ = videos["moov-at-end.mp4"]  # moov last: cut it off
    path = tmp_path / "cut.mp4"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(VideoError, match=r"cut\.mp4.*not a readable video"):
        probe_video(path)


def test_bad_clip_arguments_name_the_fix(videos):
    data, info, _ = videos["bframes.mp4"]
    with pytest.raises(ValueError, match="start at most 38"):
        clip_byte_ranges(info, len(data), 40, 4, 3)
    with pytest.raises(ValueError, match=r"stride=0: pass an integer ≥ 1"):
        clip_byte_ranges(info, len(data), 0, 4, 0)
    with pytest.raises(ValueError, match=r"resize=\(24,\): pass \(height, width\)"):
        decode_clip([(0, data)], len(data), info, 0, 2, resize=(24,))


# The shapes real files come in (phones, screen recorders, cameras, editors), each with a
# variable frame rate unless its name says cfr: (write_video keywords).
SHAPED = 36
B2 = {"gop": 8, "bframes": 2}  # closed GOPs of 8, two B-frames between references
SHAPES = {
    "vfr.mp4": {"gop": 8, "bframes": 0, "pts": vfr_pts(SHAPED)},
    "vfr-bframes.mp4": {**B2, "pts": vfr_pts(SHAPED, seed=1)},
    "vfr-bframes.mkv": {**B2, "pts": vfr_pts(SHAPED, seed=2)},
    "vfr-moov-at-end.mov": {
        "gop": 6, "bframes": 1, "faststart": False, "pts": vfr_pts(SHAPED, seed=3)
    },
    "vfr-fragmented.mp4": {**B2, "fragmented": True, "pts": vfr_pts(SHAPED, seed=4)},
    "vfr-first-pts-5s.mp4": {**B2, "pts": vfr_pts(SHAPED, first=5000, seed=5)},
    "cfr-first-pts.mp4": {**B2, "pts": [1234 + 40 * i for i in range(SHAPED)]},
    "vfr-10bit.mp4": {**B2, "pix_fmt": "yuv420p10le", "pts": vfr_pts(SHAPED, seed=6)},
    "vfr-audio-first.mp4": {
        **B2, "audio": True, "audio_first": True, "pts": vfr_pts(SHAPED, seed=7)
    },
    "cfr-audio-first-moov-at-end.mov": {
        **B2, "audio": True, "audio_first": True, "faststart": False
    },
    "vfr-rotated.mp4": {**B2, "rotation": 90, "pts": vfr_pts(SHAPED, seed=8)},
    "vfr-yuv422-one-gop.mp4": {
        "gop": SHAPED, "bframes": 3, "pix_fmt": "yuv422p", "pts": vfr_pts(SHAPED, seed=9)
    },
    "cfr-gray-long-gop.mp4": {"gop": 30, "bframes": 2, "pix_fmt": "gray"},
    "vfr-nv12-long-gop.mkv": {
        "gop": 30, "bframes": 2, "pix_fmt": "nv12", "pts": vfr_pts(SHAPED, seed=10)
    },
}  # fmt: skip


@pytest.fixture(scope="module")
def shaped(tmp_path_factory) -> Videos:
    folder = tmp_path_factory.mktemp("shaped")
    out = Videos()
    for name, keywords in SHAPES.items():
        data = write_video(folder / name, SHAPED, 24, (48, 64), **keywords).read_bytes()
        out[name] = (data, probe_video(data), decode_whole(data, 0, SHAPED))
    return out


@pytest.mark.parametrize("index", ["pts", "pts not recorded"])
@pytest.mark.parametrize("name", sorted(SHAPES))
def test_every_clip_start_of_real_file_shapes_equals_the_whole_file_decode(shaped, name, index):
    """Every start of a 3-frame clip at strides 1 and 3, decoded from its byte ranges alone,
    is the whole-file decode's frames: at a variable frame rate (which made every clip after
    the first GOP raise MissingBytes for bytes outside its ranges), and so on. "pts not
    recorded": an index written before the keyframes' timestamps were (seeks by frame rate)."""
    data, info, whole = shaped[name]
    if index != "pts":
        info = dataclasses.replace(info, keyframe_pts=None)
    assert info.frames == SHAPED and [frame_index_of(f) for f in whole] == list(range(SHAPED))
    assert info.ranged == (name.endswith((".mp4", ".mov")) and "fragmented" not in name)
    for stride in (1, 3):
        for start in range(SHAPED - 2 * stride):
            wanted = list(range(start, start + 3 * stride, stride))
            ranges = clip_byte_ranges(info, len(data), start, 3, stride)
            clip = decode_clip(parts_of(data, ranges), len(data), info, start, 3, stride)
            assert np.array_equal(clip, whole[wanted]), (name, start, stride)


def test_variable_frame_rate_keyframes_keep_their_timestamps(shaped):
    """The probe records each keyframe's presentation timestamp (what a decode seeks to), and
    a rotated video's frames come as coded: the rotation is not applied."""
    data, info, _ = shaped["vfr-first-pts-5s.mp4"]
    assert info.keyframe_pts is not None and len(info.keyframe_pts) == len(info.keyframes)
    pts = np.array(vfr_pts(SHAPED, first=5000, seed=5))
    scale = info.keyframe_pts[0] / 5000  # the track's time base: units per millisecond
    assert np.allclose(info.keyframe_pts / scale, pts[info.keyframes])
    data, info, whole = shaped["vfr-rotated.mp4"]
    with av.open(io.BytesIO(data)) as container:
        assert next(container.decode(video=0)).rotation == 90  # the file says: turn it
    assert (info.height, info.width) == (48, 64) and whole.shape[1:] == (48, 64, 3)


@pytest.mark.parametrize("aim", ["a keyframe late", "a keyframe early", "the start"])
def test_a_seek_landing_off_its_keyframe_is_corrected(shaped, aim):
    """Seek targets that land on another keyframe (what a variable frame rate does to a
    demuxer seeking on decode times) still give the whole-file decode's frames: a landing
    past the keyframe seeks again before it, one before it reads on to it."""
    data, info, whole = shaped["vfr-bframes.mp4"]
    pts = info.keyframe_pts
    wrong = {
        "a keyframe late": np.append(pts[1:], pts[-1] + 10**6),  # lands on the next one
        "a keyframe early": np.insert(pts[:-1], 0, pts[0]),  # on the one before
        "the start": np.full_like(pts, pts[0]),  # on the first: reads on through the file
    }[aim]
    aimed = dataclasses.replace(info, keyframe_pts=wrong)
    for start in range(SHAPED - 2):
        ranges = clip_byte_ranges(aimed, len(data), start, 3, 1)
        clip = decode_clip(parts_of(data, ranges), len(data), aimed, start, 3)
        assert np.array_equal(clip, whole[start : start + 3]), (aim, start)


def test_an_index_whose_keyframe_is_no_packet_is_an_error_naming_the_fix(shaped):
    data, info, _ = shaped["vfr.mp4"]
    offsets = info.keyframe_offsets.copy()
    offsets[2] += 1  # no packet starts there
    broken = dataclasses.replace(info, keyframe_offsets=offsets)
    with pytest.raises(VideoError, match=r"no packet at byte \d+, where the index puts keyframe "
                       r"16: the index does not match the file; probe it again"):  # fmt: skip
        decode_clip([(0, data)], len(data), broken, 17, 2)
