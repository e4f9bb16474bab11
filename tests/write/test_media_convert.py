"""convert() from a folder of videos or of audio files (lanceloader.write.media), and the CLI's
``convert`` and ``inspect`` on such a folder. Real media, generated here (tests/mediagen.py),
real Lance datasets in temporary directories."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import lance
import pytest

from cli_run import assert_one_line_error, run_cli
from lanceloader.cli import main
from lanceloader.media.audio import probe_audio
from lanceloader.media.audio_ranges import probe_audio_index
from lanceloader.media.video import index_fields, index_values, probe_video
from lanceloader.rows.lance.blobs import blob_columns
from lanceloader.write.convert import CLASSES_KEY, convert
from mediagen import write_audio, write_video

AUDIO_COLUMNS = ["audio_sample_rate", "audio_channels", "audio_frames", "audio_duration"]
BYTE_INDEX = ["audio_seek_samples", "audio_seek_offsets", "audio_header_length", "audio_preroll"]


@pytest.fixture(scope="module")
def video_folder(tmp_path_factory) -> Path:
    """cat/ (two videos, one without faststart, one damaged), dog/ (an MKV), a stray note."""
    root = tmp_path_factory.mktemp("media") / "videos"
    write_video(root / "cat" / "a.mp4", 12, 12, (48, 64), gop=4)
    write_video(root / "cat" / "b.mp4", 10, 10, (48, 64), gop=5, faststart=False)
    data = (root / "cat" / "a.mp4").read_bytes()
    (root / "cat" / "broken.mp4").write_bytes(data[: len(data) // 2])
    write_video(root / "dog" / "c.mkv", 9, 6, (48, 64), gop=3)
    (root / "dog" / "notes.txt").write_text("shot on a phone")
    return root


def read_rows(uri: Path, *columns: str) -> list[dict]:
    return lance.dataset(uri).to_table(columns=list(columns)).to_pylist()


def test_a_video_folder_becomes_blobs_labels_and_the_keyframe_index(video_folder, tmp_path):
    out = tmp_path / "videos.lance"
    summary = convert(video_folder, out, progress=False)
    assert summary.rows == 3
    # the files written per label (the damaged one is skipped, not counted)
    assert summary.labelled == (("cat", 2), ("dog", 1))
    assert "; files per label: cat 2, dog 1;" in str(summary)
    reasons = dict(summary.skipped)
    assert "truncated" in reasons["cat/broken.mp4"]
    assert "not a video file" in reasons["dog/notes.txt"]
    ds = lance.dataset(out)
    assert blob_columns(ds.schema) == ["video"] and ds.data_storage_version == "2.2"
    assert json.loads(ds.schema.metadata[CLASSES_KEY]) == ["cat", "dog"]
    index = [f.name for f in index_fields("video")]
    rows = read_rows(out, "path", "label", *index)
    assert [(r["path"], r["label"]) for r in rows] == [("cat/a.mp4", 0), ("cat/b.mp4", 0),
                                                        ("dog/c.mkv", 1)]  # fmt: skip
    payloads = dict(ds.read_blobs("video", indices=[0, 1, 2]))
    for offset, row in enumerate(rows):
        data = (video_folder / row["path"]).read_bytes()
        assert payloads[offset] == data  # the bytes as they are, moov at the end too
        assert {k: row[k] for k in index} == index_values(probe_video(data))
    assert rows[1]["video_header_offset"] > rows[1]["video_keyframe_offsets"][-1]
    assert rows[2]["video_header_offset"] is None  # MKV: a clip reads the whole file


def test_an_audio_folder_becomes_blobs_and_its_audio_columns(tmp_path):
    root = tmp_path / "sounds"
    for fmt, rate in (("wav", 16_000), ("flac", 22_050), ("mp3", 44_100), ("opus", 48_000)):
        write_audio(root / f"tone.{fmt}", 0.5, rate, 2 if fmt != "wav" else 1)
    (root / "empty.wav").write_bytes(b"RIFF")
    summary = convert(root, tmp_path / "sounds.lance", progress=False)
    assert summary.rows == 4 and [name for name, _ in summary.skipped] == ["empty.wav"]
    rows = read_rows(tmp_path / "sounds.lance", "path", *AUDIO_COLUMNS, "audio_codec")
    for row in rows:
        info = probe_audio(root / row["path"])
        assert (row["audio_sample_rate"], row["audio_channels"], row["audio_frames"]) == (
            info.sample_rate, info.channels, info.frames)  # fmt: skip
        assert (row["audio_duration"], row["audio_codec"]) == (info.duration_s, info.codec)
    assert "label" not in lance.dataset(tmp_path / "sounds.lance").schema.names
    # The byte index of each file (media/audio_ranges.py), so audio_clips reads only a
    # window's bytes: what a probe of the file finds; Opus has none (read whole).
    ranged = read_rows(tmp_path / "sounds.lance", "path", *BYTE_INDEX)
    for row in ranged:
        _, index = probe_audio_index((root / row["path"]).read_bytes())
        assert row["audio_seek_offsets"] == index.seek_offsets.tolist()
        assert row["audio_seek_samples"] == index.seek_samples.tolist()
        assert (row["audio_header_length"], row["audio_preroll"]) == (
            index.header[1],
            index.preroll,
        )
        assert (len(row["audio_seek_offsets"]) >= 2) == (not row["path"].endswith(".opus"))


def test_a_labels_csv_is_joined_by_file_name_and_gaps_are_listed(tmp_path):
    root = tmp_path / "flat"
    for name in ("a", "b", "c"):
        write_video(root / f"{name}.mp4", 4, 4, (48, 64), gop=2)
    labels = tmp_path / "labels.csv"
    labels.write_text("file,label,speed\na.mp4,walk,1.5\nb.mp4,run,3.0\nzzz.mp4,walk,1.0\n")
    summary = convert(root, tmp_path / "out.lance", labels=labels, progress=False)
    assert summary.rows == 2
    assert summary.labelled == (("run", 1), ("walk", 1))  # zzz.mp4's walk matched no file
    assert "files per label: run 1, walk 1" in str(summary)
    assert dict(summary.skipped) == {
        "c.mp4": "no row in the labels file labels.csv",
        "labels.csv: zzz.mp4": "names no file in the folder",
    }
    ds = lance.dataset(tmp_path / "out.lance")
    assert json.loads(ds.schema.metadata[CLASSES_KEY]) == ["run", "walk"]
    assert read_rows(tmp_path / "out.lance", "path", "label", "speed") == [
        {"path": "a.mp4", "label": 1, "speed": 1.5},
        {"path": "b.mp4", "label": 0, "speed": 3.0},
    ]
    labels = tmp_path / "labels.json"  # JSON, keyed by relative path, with metadata columns
    labels.write_text(
        json.dumps({n: {"take": i} for i, n in enumerate(["a.mp4", "b.mp4", "c.mp4"])})
    )
    summary = convert(root, tmp_path / "json.lance", labels=labels, progress=False)
    assert [r["take"] for r in read_rows(tmp_path / "json.lance", "take")] == [0, 1, 2]
    assert summary.labelled == (("a row of labels.json", 3),)  # no label column: matches


def test_rerun_semantics_are_those_of_convert(video_folder, tmp_path):
    out = tmp_path / "videos.lance"
    convert(video_folder, out, progress=False)
    with pytest.raises(FileExistsError, match="mode='overwrite'"):
        convert(video_folder, out, progress=False)
    assert convert(video_folder, out, mode="append", progress=False).version == 2
    assert lance.dataset(out).count_rows() == 6
    convert(video_folder, out, mode="overwrite", progress=False)
    assert lance.dataset(out).count_rows() == 3


def test_bad_input_names_the_problem_and_the_fix(video_folder, tmp_path):
    with pytest.raises(ValueError, match=r"cannot read the video file .*broken\.mp4.*on_error"):
        convert(video_folder, tmp_path / "a.lance", on_error="raise", progress=False)
    mixed = tmp_path / "mixed"
    write_video(mixed / "a.mp4", 4, 4, (48, 64), gop=2)
    write_audio(mixed / "b.wav", 0.1, 8000, 1)
    with pytest.raises(ValueError, match=r"mixes kinds of files \(a\.mp4, b\.wav\)"):
        convert(mixed, tmp_path / "b.lance", progress=False)
    with pytest.raises(ValueError, match="resize=64 re-encodes images"):
        convert(video_folder, tmp_path / "c.lance", resize=64, progress=False)
    with pytest.raises(ValueError, match=r"has the columns .* add a column called one of"):
        (tmp_path / "bad.csv").write_text("clip,label\na.mp4,1\n")
        convert(video_folder, tmp_path / "d.lance", labels=tmp_path / "bad.csv", progress=False)
    (tmp_path / "clash.csv").write_text("file,video_fps\na.mp4,30\n")
    with pytest.raises(ValueError, match=r"columns \['video_fps'\], which convert writes"):
        convert(video_folder, tmp_path / "e.lance", labels=tmp_path / "clash.csv", progress=False)


def test_cli_converts_a_video_folder_and_inspect_says_how(video_folder, tmp_path, capsys):
    code, _, err = run_cli(["inspect", str(video_folder)], capsys)
    assert_one_line_error(code, err, "inspect", "is a folder of video files")
    command = shlex.split(err.split("convert it once: ", 1)[1].partition(", then: ")[0])
    assert command == ["lanceloader", "convert", str(video_folder), f"{video_folder}.lance"]
    out = tmp_path / "cli.lance"
    assert main(["convert", str(video_folder), str(out), "--quiet"]) == 0
    assert "skipped 2" in capsys.readouterr().out
    assert lance.dataset(out).count_rows() == 3


def test_cli_labels_join_a_csv_and_bench_says_how_to_convert(video_folder, tmp_path, capsys):
    labels = tmp_path / "labels.csv"
    labels.write_text("file,take\na.mp4,7\nb.mp4,8\nc.mkv,9\n")
    out = tmp_path / "labelled.lance"
    assert main(["convert", str(video_folder), str(out), "--labels", str(labels), "--quiet"]) == 0
    assert sorted(r["take"] for r in read_rows(out, "take")) == [7, 8, 9]
    code, _, err = run_cli(["bench", str(video_folder)], capsys)
    assert_one_line_error(code, err, "bench", "is a folder of video files")


def test_cli_bench_times_clips_and_windows_through_the_loader(video_folder, tmp_path, capsys):
    """``bench`` of a video dataset read raw blob bytes and could not time clips: --clips and
    --audio take video_clips' / audio_clips' settings and report clips (windows) per second."""
    out = tmp_path / "bench.lance"
    convert(video_folder, out, progress=False)
    code, _, err = run_cli(["bench", str(out), "--workers", "1"], capsys)  # the MKV's nulls
    assert_one_line_error(code, err, "bench", "has 1 null values", "'video' holds media files, "
                          "read here as raw bytes; add --clips frames=16,stride=2,size=112x112 to "
                          "time clips through the Loader")  # fmt: skip
    mp4 = ["--filter", "path != 'dog/c.mkv'", "--workers", "1"]  # no nulls: it runs
    code, text, err = run_cli(["bench", str(out), *mp4], capsys)
    assert code == 0 and "note: 'video' holds media files" in text, err
    args = ["bench", str(out), "--clips", "frames=4", "--batch-size", "2", "--workers", "1"]
    code, text, err = run_cli(args, capsys)
    assert code == 0, err
    assert "7 clips, batch 2" in text  # 12, 10 and 9 frames: 3 + 2 + 2 clips of 4
    assert "video uint8 [2, 4, 3, 48, 64]" in text and "clip_start" in text
    assert "clips: 7 in " in text and " clips/s" in text
    for bad, fragment in [
        (["--clips", "frames=four"], "--clips: frames='four' must be an integer"),
        (["--clips", "fps=4"], "'fps=4' is not KEY=VALUE with KEY one of column, frames"),
        (["--clips", "frames=4", "--audio", "seconds=1"], "--clips and --audio: give one"),
        (["--clips", "frames=500"], "all 3 videos of column 'video' are shorter than one clip"),
    ]:
        code, _, err = run_cli(["bench", str(out), *bad], capsys)
        assert_one_line_error(code, err, "bench", fragment)
    for i, seconds in enumerate([1.0, 0.6]):
        write_audio(tmp_path / "sounds" / f"s{i}.wav", seconds, 8000, 1)
    convert(tmp_path / "sounds", tmp_path / "sounds.lance", progress=False)
    args = ["bench", str(tmp_path / "sounds.lance"), "--audio", "seconds=0.25,sample_rate=4000"]
    code, text, err = run_cli([*args, "--batch-size", "3", "--workers", "1"], capsys)
    assert code == 0, err
    assert "6 windows, batch 3" in text and "audio float32 [3, 1, 1000]" in text
    assert "windows: 6 in " in text and " windows/s" in text
    code, text, _ = run_cli(["bench", "--help"], capsys)
    assert "--clips KEY=VALUE,..." in text and "--audio KEY=VALUE,..." in text
