"""Audio: probing, exact windows, resampling and channels (media/audio.py), and decode_audio
crops through a real Loader (batch/audio.py): shapes, the random_map rule across workers,
resumes and epochs, short and corrupt files under on_error.

Tolerances: WAV/FLAC hold 16-bit samples, so a window equals the written samples within
4e-5 (one step is 3.1e-5). MP3 and Opus are lossy: a window equals the analytic tones within
0.05 (the codec's error on these tones is 0.025-0.035), and the window's offset is checked
against a whole-file decode by libsndfile, within 1e-4 (MP3) and 5e-3 (Opus; FFmpeg's and
libopus's decoders differ by up to 1.2e-3): one sample off moves a 440 Hz tone by 0.03.
"""

from __future__ import annotations

import io
import math
from typing import Any

import lance
import numpy as np
import pyarrow as pa
import pytest
import soundfile
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lanceloader as ll
from lanceloader.media import audio as media_audio
from lanceloader.media import audio_index, audio_ranges
from lanceloader.media.audio import AudioInfo, decode_audio_window, probe_audio
from mediagen import audio_samples, tone_hz, write_audio

# "mp3-vbr": libsndfile's own MP3 (VBR), where libsndfile's seek lands off; Opus at 16 kHz is
# decoded at its header's rate, not FFmpeg's 48 kHz.
FORMATS = [
    ("wav", 16000, 2),
    ("flac", 22050, 1),
    ("mp3", 44100, 2),
    ("mp3-vbr", 44100, 2),
    ("opus", 48000, 2),
    ("opus", 16000, 1),
]
LOSSLESS_ATOL = 4e-5
LOSSY_ATOL = 0.05
OFFSET_ATOL = {"mp3": 1e-4, "opus": 5e-3}


@pytest.fixture(scope="module")
def media(tmp_path_factory) -> dict[tuple[str, int, int], tuple[bytes, np.ndarray]]:
    """Each format's 2 s of tones: the file's bytes and the samples written ([C, N])."""
    folder = tmp_path_factory.mktemp("audio")
    out = {}
    for name, rate, channels in FORMATS:
        path = folder / f"tones-{rate}-{channels}.{name}"
        if name == "mp3-vbr":
            samples = audio_samples(2.0, rate, channels)
            soundfile.write(path, samples, rate, format="MP3")
        else:
            samples = write_audio(path, 2.0, rate, channels)
        out[(name, rate, channels)] = (path.read_bytes(), samples.T)
    return out


def _tones(rate: int, channels: int, start_s: float, count: int) -> np.ndarray:
    t = start_s + np.arange(count) / rate
    return np.stack([0.5 * np.sin(2 * np.pi * tone_hz(c) * t) for c in range(channels)])


@pytest.mark.parametrize(("fmt", "rate", "channels"), FORMATS)
def test_probe_reads_each_format(media, fmt, rate, channels, tmp_path) -> None:
    data, written = media[(fmt, rate, channels)]
    fmt = fmt.removesuffix("-vbr")
    info = probe_audio(data)
    codec = {"wav": "pcm_s16"}.get(fmt, fmt)
    assert info == AudioInfo(rate, channels, written.shape[1], written.shape[1] / rate, codec)
    assert info.frames == written.shape[1]  # lossy: the encoder's delay and padding trimmed
    path = tmp_path / f"x.{fmt}"
    path.write_bytes(data)
    assert probe_audio(path) == info


@pytest.mark.parametrize(("fmt", "rate", "channels"), FORMATS)
def test_a_window_is_the_written_signal_from_its_exact_sample(
    media, fmt, rate, channels, monkeypatch
) -> None:
    # MP3 windows ending after 0.5 s take the PyAV seek path (the module's other MP3 path).
    monkeypatch.setattr(media_audio, "MP3_FROM_START_S", 0.5)
    data, written = media[(fmt, rate, channels)]
    fmt = fmt.removesuffix("-vbr")
    frames = written.shape[1]
    whole = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)[0].T
    length = rate // 10
    for start in (0, 777, rate + 3, frames - length):
        window = decode_audio_window(data, start, length)
        assert window.dtype == np.float32 and window.shape == (channels, length)
        if fmt in ("wav", "flac"):
            np.testing.assert_allclose(
                window, written[:, start : start + length], atol=LOSSLESS_ATOL
            )
        else:
            np.testing.assert_allclose(
                window, whole[:, start : start + length], atol=OFFSET_ATOL[fmt]
            )
            np.testing.assert_allclose(
                window, _tones(rate, channels, start / rate, length), atol=LOSSY_ATOL
            )


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_any_window_is_that_slice_of_the_whole_file(media, data, monkeypatch) -> None:
    monkeypatch.setattr(media_audio, "MP3_FROM_START_S", 0.5)  # both MP3 paths
    # read in place (as a file over 1 MiB is) or copied
    monkeypatch.setattr(media_audio, "COPY_BELOW_BYTES", data.draw(st.sampled_from([0, 1 << 20])))
    name, rate, channels = data.draw(st.sampled_from([("flac", 22050, 1), ("mp3-vbr", 44100, 2)]))
    encoded, _ = media[(name, rate, channels)]
    whole = _whole(encoded)
    start = data.draw(st.integers(0, whole.shape[1] - 1))
    length = data.draw(st.integers(1, whole.shape[1] - start))
    window = decode_audio_window(encoded, start, length)
    np.testing.assert_allclose(window, whole[:, start : start + length], atol=1e-4)
    to = data.draw(st.sampled_from([8000, 16000, 48000]))
    resampled = decode_audio_window(encoded, start, length, sample_rate=to, channels=1)
    assert resampled.shape == (1, round(length * to / rate))


_WHOLE: dict[int, np.ndarray] = {}


def _whole(encoded: bytes) -> np.ndarray:
    """The whole file decoded from its start by libsndfile (its reference decode)."""
    key = hash(encoded)
    if key not in _WHOLE:
        _WHOLE[key] = soundfile.read(io.BytesIO(encoded), dtype="float32", always_2d=True)[0].T
    return _WHOLE[key]


def test_other_formats_decode_through_pyav_at_their_timestamps() -> None:
    av = pytest.importorskip("av")
    written = audio_samples(1.5, 44100, 2)
    out = io.BytesIO()
    with av.open(out, mode="w", format="mp4") as container:  # AAC in MP4 (M4A)
        stream = container.add_stream("aac", rate=44100, layout="stereo")
        for start in range(0, len(written), 1024):
            frame = av.AudioFrame.from_ndarray(
                np.ascontiguousarray(written[start : start + 1024].T),
                format="fltp",
                layout="stereo",
            )
            frame.sample_rate, frame.pts = 44100, start
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    data = out.getvalue()
    info = probe_audio(data)
    assert (info.codec, info.sample_rate, info.channels) == ("aac", 44100, 2)
    assert len(written) <= info.frames < len(written) + 2048  # AAC pads its last frame
    start = 30_000  # past PREROLL_SAMPLES: a seek, then frames placed by their timestamps
    window = decode_audio_window(data, start, 4000)
    whole = decode_audio_window(data, 0, start + 4000)
    np.testing.assert_allclose(window, whole[:, start:], atol=1e-4)  # AAC state: 1.4e-5
    np.testing.assert_allclose(window, _tones(44100, 2, start / 44100, 4000), atol=LOSSY_ATOL)


def test_a_window_past_the_end_is_refused_naming_the_length(media) -> None:
    data, _ = media[("wav", 16000, 2)]
    with pytest.raises(ValueError, match=r"\[31000, 33000\).*32000 samples per channel"):
        decode_audio_window(data, 31000, 2000)
    with pytest.raises(ValueError, match="start=-1"):
        decode_audio_window(data, -1, 10)
    with pytest.raises(TypeError, match="bytes or its path"):
        decode_audio_window([0, 1], 0, 1)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("fmt", "rate", "channels", "to"),
    [("flac", 22050, 1, 16000), ("wav", 16000, 2, 44100), ("opus", 48000, 2, 16000)],
)
def test_resampling_gives_the_tone_at_the_new_rate(media, fmt, rate, channels, to) -> None:
    data, _ = media[(fmt, rate, channels)]
    start, length = rate // 2 + 7, rate // 4 + 1
    window = decode_audio_window(data, start, length, sample_rate=to)
    assert window.shape == (channels, round(length * to / rate))
    atol = 2e-3 if fmt != "opus" else LOSSY_ATOL
    np.testing.assert_allclose(
        window, _tones(to, channels, start / rate, window.shape[1]), atol=atol
    )
    mono = decode_audio_window(data, start, length, sample_rate=to, channels=1)
    np.testing.assert_allclose(mono[0], window.mean(0), atol=1e-5)
    # A window resamples as the whole file does around it (inside, and at the file's end),
    # where its start lies on the whole file's output grid (a multiple of `step` samples).
    frames = probe_audio(data).frames
    step = rate // math.gcd(rate, to)
    whole = decode_audio_window(data, 0, frames, sample_rate=to)
    for start in (step * 3, (frames - length) // step * step):
        part = decode_audio_window(
            data, start, frames - start if start > step * 3 else length, sample_rate=to
        )
        first = start * to // rate
        np.testing.assert_allclose(part, whole[:, first : first + part.shape[1]], atol=1e-4)


def test_mono_is_the_mean_and_stereo_duplicates_mono(media, tmp_path) -> None:
    data, written = media[("wav", 16000, 2)]
    mono = decode_audio_window(data, 100, 50, channels=1)
    np.testing.assert_allclose(mono[0], written[:, 100:150].mean(0), atol=LOSSLESS_ATOL)
    data1, written1 = media[("flac", 22050, 1)]
    stereo = decode_audio_window(data1, 100, 50, channels=2)
    assert stereo.shape == (2, 50) and (stereo[0] == stereo[1]).all()
    np.testing.assert_allclose(stereo[1], written1[0, 100:150], atol=LOSSLESS_ATOL)
    six = io.BytesIO()
    soundfile.write(six, np.zeros((100, 6)), 8000, format="WAV")
    with pytest.raises(ValueError, match=r"6 channels.*channels=1"):
        decode_audio_window(six.getvalue(), 0, 10, channels=2)


# --- decode_audio through a loader ----------------------------------------------------------

RATE = 8000


def _noise_wav(seed: int, seconds: float, rate: int = RATE, channels: int = 1) -> bytes:
    """Noise unique to ``seed``: every crop's samples tell where it was cut from."""
    samples = np.random.default_rng(seed).uniform(-0.5, 0.5, (round(seconds * rate), channels))
    out = io.BytesIO()
    soundfile.write(out, samples, rate, format="WAV", subtype="FLOAT")
    return out.getvalue()


@pytest.fixture(scope="module")
def audio_uri(tmp_path_factory) -> str:
    """24 rows: id, and a WAV of 0.3-0.5 s of noise (8 kHz mono) in ``audio``."""
    uri = str(tmp_path_factory.mktemp("audio-ds") / "audio.lance")
    files = [_noise_wav(i, 0.3 + 0.1 * (i % 3)) for i in range(24)]
    lance.write_dataset(
        pa.table({"id": pa.array(range(24), pa.int64()), "audio": pa.array(files, pa.binary())}),
        uri,
        max_rows_per_file=10,
    )
    return uri


def _crops(loader: ll.Loader, epochs: int = 1) -> dict[tuple[int, int], bytes]:
    out = {}
    for _ in range(epochs):
        epoch = loader.epoch
        for batch in loader:
            for i, crop in zip(batch["id"], batch["audio"], strict=True):
                out[(epoch, int(i))] = np.asarray(crop).tobytes()
    return out


def _loader(uri: str, **kw) -> ll.Loader:
    transform = kw.pop("transform", ll.decode_audio("audio", seconds=0.1))
    return ll.Loader(
        uri,
        batch_size=kw.pop("batch_size", 5),
        shuffle=kw.pop("shuffle", True),
        seed=3,
        transform=transform,
        **kw,
    )


@pytest.mark.parametrize("output", ["numpy", "torch"])
def test_decode_audio_gives_n_c_t_crops_of_each_file(audio_uri, output) -> None:
    if output == "torch":
        pytest.importorskip("torch")
    loader = _loader(
        audio_uri,
        output=output,
        batch_size=8,
        shuffle=False,
        transform=ll.decode_audio(
            "audio", seconds=0.1, crop="center", sample_rate=16000, channels=2
        ),
    )
    batch = next(iter(loader))
    assert tuple(batch["audio"].shape) == (8, 2, 1600)
    assert str(batch["audio"].dtype).endswith("float32")
    files = lance.dataset(audio_uri).to_table(columns=["audio"]).column("audio").to_pylist()
    frames = probe_audio(files[1]).frames
    expected = decode_audio_window(
        files[1], (frames - 800) // 2, 800, sample_rate=16000, channels=2
    )
    np.testing.assert_array_equal(np.asarray(batch["audio"][1]), expected)


def test_random_crops_belong_to_the_sample(audio_uri) -> None:
    base = _crops(_loader(audio_uri, num_workers=1), epochs=2)
    assert len(base) == 48
    assert _crops(_loader(audio_uri, num_workers=2, batch_size=3), epochs=2) == base
    assert _crops(_loader(audio_uri, num_workers=2, worker_type="process"), epochs=2) == base
    changed = sum(base[(0, i)] != base[(1, i)] for i in range(24))
    assert changed >= 20  # a new epoch crops anew (a 0.3 s file has 1,601 offsets)
    # A crop is a real window of its file: the noise is unique to each offset.
    files = lance.dataset(audio_uri).to_table(columns=["audio"]).column("audio").to_pylist()
    whole = decode_audio_window(files[5], 0, probe_audio(files[5]).frames)[0]
    crop = np.frombuffer(base[(0, 5)], np.float32)
    assert any((whole[o : o + 800] == crop).all() for o in range(len(whole) - 799))


def test_a_resumed_run_crops_as_the_uninterrupted_one(audio_uri) -> None:
    base = _crops(_loader(audio_uri, num_workers=1))
    loader = _loader(audio_uri, num_workers=2)
    it = iter(loader)
    seen = {}
    for _ in range(2):
        batch = next(it)
        seen.update(
            {
                (0, int(i)): np.asarray(c).tobytes()
                for i, c in zip(batch["id"], batch["audio"], strict=True)
            }
        )
    state = loader.state_dict()
    loader.close()
    resumed = _loader(audio_uri, num_workers=1)
    resumed.load_state_dict(state)
    seen.update(_crops(resumed))
    assert seen == base


def test_short_files_are_padded_with_silence_or_refused(audio_uri) -> None:
    # 0.45 s crops: files of 0.3 s and 0.4 s are short, those of 0.5 s are not.
    padded = _crops(
        _loader(
            audio_uri, shuffle=False, transform=ll.decode_audio("audio", seconds=0.45, crop="start")
        )
    )
    files = lance.dataset(audio_uri).to_table(columns=["audio"]).column("audio").to_pylist()
    crop = np.frombuffer(padded[(0, 0)], np.float32)  # row 0: 0.3 s = 2,400 samples
    np.testing.assert_array_equal(crop[:2400], decode_audio_window(files[0], 0, 2400)[0])
    assert crop.shape == (3600,) and not crop[2400:].any()
    strict = _loader(
        audio_uri,
        shuffle=False,
        on_error="skip",
        max_skip_fraction=1.0,
        transform=ll.decode_audio("audio", seconds=0.45, short="error"),
    )
    assert sorted(i for _, i in _crops(strict)) == [i for i in range(24) if i % 3 == 2]


def test_a_corrupt_file_is_reported_with_its_row(tmp_path) -> None:
    uri = str(tmp_path / "bad.lance")
    files = [_noise_wav(i, 0.2) for i in range(6)]
    files[2] = files[2][:60]  # a WAV header cut short
    files[4] = b"not audio at all"
    lance.write_dataset(
        pa.table({"id": pa.array(range(6), pa.int64()), "audio": pa.array(files, pa.binary())}), uri
    )
    told = []
    loader = ll.Loader(
        uri,
        batch_size=6,
        transform=ll.decode_audio("audio", seconds=0.1),
        on_error=lambda exc, row: told.append((row["id"], str(exc))),
        max_skip_fraction=1.0,
    )
    batch = next(iter(loader))
    assert batch["id"].tolist() == [0, 1, 3, 5] and batch["audio"].shape == (4, 1, 800)
    assert [i for i, _ in told] == [2, 4]
    assert "16 bytes" in told[1][1]  # the message names what it read
    raising = ll.Loader(uri, batch_size=6, transform=ll.decode_audio("audio", seconds=0.1))
    with pytest.raises(ValueError, match="audio of") as info:
        next(iter(raising))
    assert "row 2 of the batch" in "".join(getattr(info.value, "__notes__", []))


def test_files_of_other_rates_need_sample_rate(tmp_path) -> None:
    batch = pa.record_batch({"audio": [_noise_wav(0, 0.2), _noise_wav(1, 0.2, rate=16000)]})
    with pytest.raises(ValueError, match="pass sample_rate= and channels="):
        ll.decode_audio(seconds=0.1, crop="start")(batch)
    out = ll.decode_audio(seconds=0.1, crop="start", sample_rate=RATE)(batch)
    assert out.column("audio").to_numpy_ndarray().shape == (2, 1, 800)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"seconds": 0}, "seconds must be a number > 0"),
        ({"crop": "middle"}, "crop must be one of"),
        ({"sample_rate": 16000.0}, "sample_rate must be None"),
        ({"channels": 3}, "channels must be None"),
        ({"short": "drop"}, "short must be 'pad'"),
    ],
)
def test_bad_arguments_name_the_fix(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        ll.decode_audio(**kwargs)


# --- ranged reads: media/audio_ranges.py and ll.audio_clips ----------------------------------

# Each format's byte index: WAV (arithmetic), FLAC and MP3 (a seek point per frame); "mp3-vbr"
# at 16 kHz mono is libsndfile's low-bitrate MPEG-2 MP3, whose bit reservoir reaches ~14 frames
# back; Opus has no byte index (whole file).
RANGED = [
    ("wav", 16000, 2),
    ("flac", 22050, 1),
    ("flac", 44100, 2),
    ("mp3", 44100, 2),
    ("mp3-vbr", 44100, 2),
    ("mp3-vbr", 16000, 1),
    ("opus", 48000, 2),
]


@pytest.fixture(scope="module")
def ranged_media(
    tmp_path_factory,
) -> dict[tuple[str, int, int], tuple[bytes, Any, Any, np.ndarray]]:
    """Per format: the bytes of 2 s of tones, its info and byte index, and the whole file
    decoded from its start by the decoder the ranged reads use (PyAV for MP3 and Opus)."""
    folder = tmp_path_factory.mktemp("ranged")
    out = {}
    for name, rate, channels in RANGED:
        path = folder / f"tones-{rate}-{channels}.{name}"
        if name == "mp3-vbr":
            soundfile.write(path, audio_samples(2.0, rate, channels), rate, format="MP3")
        else:
            write_audio(path, 2.0, rate, channels)
        data = path.read_bytes()
        info, index = audio_ranges.probe_audio_index(data)
        with pytest.MonkeyPatch.context() as patch:  # MP3 by PyAV from the file's start
            patch.setattr(media_audio, "MP3_FROM_START_S", 0.0)
            whole = decode_audio_window(data, 0, info.frames)
        out[(name, rate, channels)] = (data, info, index, whole)
    return out


def _ranged_window(
    data: bytes, info, index, start: int, length: int, **kw
) -> tuple[np.ndarray, int]:
    """The window decoded from only its ranges, and the bytes those ranges hold."""
    first, count = media_audio.window_span(info, start, length, kw.get("sample_rate"))
    ranges = audio_ranges.window_byte_ranges(index, len(data), first, count)
    parts = [(o, data[o : o + n]) for o, n in ranges]
    window = audio_ranges.decode_window_from_ranges(parts, info, index, start, length, **kw)
    return window, sum(n for _, n in ranges)


def test_every_format_has_its_byte_index(ranged_media) -> None:
    formats = {key: index.format for key, (_, _, index, _) in ranged_media.items()}
    assert formats == {
        ("wav", 16000, 2): "wav",
        ("flac", 22050, 1): "flac",
        ("flac", 44100, 2): "flac",
        ("mp3", 44100, 2): "mp3",
        ("mp3-vbr", 44100, 2): "mp3",
        ("mp3-vbr", 16000, 1): "mp3",
        ("opus", 48000, 2): "whole",
    }
    _, info, index, _ = ranged_media[("wav", 16000, 2)]
    assert index.seek_offsets.tolist() == [44, 44 + info.frames * 4]  # 2 channels of 16 bits
    _, _, flac, _ = ranged_media[("flac", 22050, 1)]
    assert flac.header == (0, 42) and len(flac.seek_samples) > 5 and flac.preroll == 0
    _, _, low, _ = ranged_media[("mp3-vbr", 16000, 1)]
    assert low.preroll >= 8 * 576  # the reservoir of 36-byte frames reaches far back


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_a_ranged_window_is_the_whole_file_decode(ranged_media, data) -> None:
    key = data.draw(st.sampled_from(RANGED))
    encoded, info, index, whole = ranged_media[key]
    boundaries = [int(s) for s in index.seek_samples if 0 <= s < info.frames] or [0]
    start = data.draw(
        st.one_of(
            st.integers(0, info.frames - 1),
            st.sampled_from(boundaries).map(lambda s: max(0, s - 1)),  # across a frame's start
            st.sampled_from([0, info.frames - 1]),
        )
    )
    length = data.draw(st.one_of(st.integers(1, info.frames - start), st.just(info.frames - start)))
    window, _ = _ranged_window(encoded, info, index, start, length)
    if index.ranged:
        np.testing.assert_array_equal(window, whole[:, start : start + length])
    else:  # read whole, decoded as decode_audio_window does (Opus seeks: 4e-4 off a whole decode)
        np.testing.assert_array_equal(window, decode_audio_window(encoded, start, length))
    to = data.draw(st.sampled_from([None, 8000]))
    mono = data.draw(st.sampled_from([None, 1]))
    if to is not None or mono is not None:
        shaped, _ = _ranged_window(
            encoded, info, index, start, length, sample_rate=to, channels=mono
        )
        expected = decode_audio_window(encoded, start, length, sample_rate=to, channels=mono)
        atol = 0 if key[0] in ("wav", "flac") else 1e-5  # MP3: mpg123's and FFmpeg's last bits
        np.testing.assert_allclose(shaped, expected, atol=atol, rtol=0)


def test_a_ranged_window_reads_its_frames_the_header_and_at_most_two_frames_more(
    ranged_media,
) -> None:
    for key, (encoded, info, index, _) in ranged_media.items():
        if not index.ranged:
            continue
        data_bytes = int(index.seek_offsets[-1] - index.seek_offsets[0])
        frame_bytes = int(np.diff(index.seek_offsets).max())
        frame_samples = int(np.diff(index.seek_samples).max()) if key[0] != "wav" else 0
        preroll_bytes = -(-index.preroll // max(frame_samples, 1)) * frame_bytes
        for start in range(0, info.frames - info.sample_rate // 4, info.sample_rate // 7):
            length = info.sample_rate // 4
            _, read = _ranged_window(encoded, info, index, start, length)
            crop = data_bytes * length / info.frames
            extra = 0 if key[0] == "wav" else 2 * frame_bytes
            assert read <= crop + index.header[1] + extra + preroll_bytes, (key, start)
        assert read < len(encoded) / 2  # a window of an eighth of the file


def test_parts_that_are_not_the_windows_ranges_are_refused(ranged_media) -> None:
    encoded, info, index, _ = ranged_media[("flac", 22050, 1)]
    with pytest.raises(ValueError, match="window_byte_ranges"):
        audio_ranges.decode_window_from_ranges([(0, encoded)], info, index, 100, 10)
    damaged = bytearray(encoded)
    o, n = audio_ranges.window_byte_ranges(index, len(encoded), 5000, 100)[1]
    damaged[o : o + n] = bytes(n)  # the frames zeroed: no FLAC frame there
    parts = [
        (p, bytes(damaged[p : p + q]))
        for p, q in audio_ranges.window_byte_ranges(index, len(encoded), 5000, 100)
    ]
    with pytest.raises(ValueError, match="damaged or its index is stale"):
        audio_ranges.decode_window_from_ranges(parts, info, index, 5000, 100)


@pytest.fixture(scope="module")
def blob_uri(tmp_path_factory) -> tuple[str, dict[str, list[bytes]]]:
    """A Lance dataset of 6 s files (16 kHz mono) of WAV, FLAC and MP3 in a blob column, 2 per
    format, written by ll.convert (the byte index in columns)."""
    root = tmp_path_factory.mktemp("blobs")
    files: dict[str, list[bytes]] = {}
    for fmt in ("wav", "flac", "mp3"):
        for i in range(2):
            write_audio(root / "in" / fmt / f"{i}.{fmt}", 6.0, 16000, 1)
            files.setdefault(fmt, []).append((root / "in" / fmt / f"{i}.{fmt}").read_bytes())
    uri = str(root / "audio.lance")
    ll.convert(root / "in", uri, progress=False)
    return uri, files


def test_audio_clips_read_only_each_windows_bytes(blob_uri) -> None:
    uri, files = blob_uri
    loader = ll.Loader(  # only the clips: no other column's reads in the count
        uri, batch_size=4, columns=["audio"], clips=ll.audio_clips("audio", 1.0, per_file=3)
    )
    source = loader.source
    assert source.index.origin == "columns"  # convert wrote the byte index
    paths = lance.dataset(uri).to_table(columns=["path"]).column("path").to_pylist()
    source.read_rows(np.array([0]))  # opens the data file: its metadata, once per process
    for p in range(source.num_rows):
        media, start = source.windows.clip(p, seed=0, epoch=0)
        fmt, i = paths[media].split("/")[0], int(paths[media].split("/")[1][0])
        data = files[fmt][i]
        read = source.read_rows(np.array([p]))
        window = read.rows.column("audio").combine_chunks().to_numpy_ndarray()[0]
        np.testing.assert_allclose(window, decode_audio_window(data, start, 16000), atol=1e-5)
        # Lance reads the window's ranges and the blob's descriptor: a sixth of the file
        # (1 s of 6 s) plus the header and the frames at the edges, never the whole file.
        assert read.io_bytes <= len(data) / 6 + 4096 + 1024, (fmt, start, read.io_bytes)


def test_local_clip_ranges_are_read_from_the_files_not_through_lance(blob_uri, monkeypatch) -> None:
    """On a local dataset the windows' ranges come straight from the blob files (pread, no
    read_blob_ranges call: rows/lance/blob_files.py), and the crops are the ones Lance's ranged
    read gives, for every format."""
    uri, _ = blob_uri
    loader = ll.Loader(uri, batch_size=6, clips=ll.audio_clips("audio", 1.0, per_file=2))
    source = loader.source
    assert source.index.located is not None
    calls = []
    real = lance.LanceDataset.read_blob_ranges

    def counted(self, *args, **kwargs):
        calls.append(args)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(lance.LanceDataset, "read_blob_ranges", counted)
    positions = np.arange(source.num_rows)
    direct = source.read_rows(positions, epoch=1)
    assert calls == [] and direct.io_bytes > 0
    source.index.located = None  # what a dataset on an object store does
    through_lance = source.read_rows(positions, epoch=1)
    assert len(calls) == 1
    assert direct.rows.equals(through_lance.rows)


def test_a_long_files_sparser_seek_points_still_give_exact_windows(
    ranged_media, monkeypatch
) -> None:
    # A file of more than MAX_SEEK_POINTS frames keeps every k-th frame's point: a window then
    # decodes from a point up to k - 1 frames earlier (FLAC: several frames in one run; MP3:
    # frames split by their headers, the reservoir's preroll counted in samples).
    monkeypatch.setattr(audio_index, "MAX_SEEK_POINTS", 6)
    rng = np.random.default_rng(7)
    for key in [("flac", 22050, 1), ("mp3", 44100, 2), ("mp3-vbr", 16000, 1)]:
        encoded, info, dense, whole = ranged_media[key]
        _, index = audio_ranges.probe_audio_index(encoded)
        assert len(index.seek_offsets) <= 6 < len(dense.seek_offsets)
        for start in [0, info.frames - 500, *rng.integers(0, info.frames - 500, 6).tolist()]:
            window, _ = _ranged_window(encoded, info, index, int(start), 500)
            np.testing.assert_array_equal(window, whole[:, start : start + 500])


def test_flac_runs_decoded_together_equal_each_decoded_alone() -> None:
    """A read's FLAC windows decode in one FFmpeg call per kind of file (decode_flac_runs):
    files of different lengths and contents (other STREAMINFO frame sizes, lengths and MD5s)
    share a decoder, files at another rate or channel count get their own, and every window
    equals its decode alone; a damaged run gives None for its group (decoded alone, it names
    the error)."""
    rng = np.random.default_rng(3)
    files = []
    for seconds, rate, channels in [
        (2.0, 16000, 1),
        (3.3, 16000, 1),
        (1.1, 22050, 2),
        (2.5, 16000, 1),
    ]:
        sink = io.BytesIO()
        signal = rng.standard_normal((round(seconds * rate), channels)) * 0.2
        soundfile.write(sink, signal.clip(-1, 1), rate, format="FLAC")
        files.append(sink.getvalue())
    runs, alone = [], []
    for data in files:
        info, index = audio_ranges.probe_audio_index(data)
        for start in (0, int(rng.integers(0, info.frames - 800)), info.frames - 800):
            (h, hn), (o, n) = audio_ranges.window_byte_ranges(index, len(data), start, 800)
            samples = audio_ranges.flac_run_samples(index, start, 800)
            runs.append((data[h : h + hn], data[o : o + n], samples))
            parts = [(h, data[h : h + hn]), (o, data[o : o + n])]
            alone.append((parts, info, index, start))
    together = audio_ranges.decode_flac_runs(runs)
    for (parts, info, index, start), decoded, run in zip(alone, together, runs, strict=True):
        assert decoded is not None and decoded.shape[1] == run[2]
        window = audio_ranges.decode_window_from_ranges(parts, info, index, start, 800)
        given = audio_ranges.decode_window_from_ranges(
            parts, info, index, start, 800, decoded=decoded
        )
        np.testing.assert_array_equal(given, window)
    damaged = list(runs)
    header, frames, samples = damaged[4]
    damaged[4] = (header, frames[: len(frames) // 2], samples)  # a run cut short
    out = audio_ranges.decode_flac_runs(damaged)
    assert out[4] is None and out[6] is not None  # the 22,050 Hz file decodes apart
