"""Small media for tests: Lance datasets of real videos and audio (made by ``mediagen.py``) for
tests that need clips, and folders of images for ``convert``."""

from __future__ import annotations

import shutil
from pathlib import Path

import lance
import lance.blob
import numpy as np
import pyarrow as pa

from mediagen import write_audio, write_video


def video_dataset(
    folder: Path, frames: list[int], size: tuple[int, int] = (32, 48), gop: int = 5
) -> str:
    """Videos of ``frames`` frames each, with a path column and the keyframe index, two to a
    fragment."""
    from lanceloader.media import video

    datas = [
        write_video(folder / f"v{i}.mp4", n, 12, size, gop=gop).read_bytes()
        for i, n in enumerate(frames)
    ]
    rows = [video.index_values(video.probe_video(d), "video") for d in datas]
    index = pa.Table.from_pylist(rows, schema=pa.schema(video.index_fields("video")))
    table = pa.table(
        {"path": [f"v{i}.mp4" for i in range(len(datas))], "video": lance.blob.blob_array(datas)}
    )
    for name in index.column_names:
        table = table.append_column(name, index.column(name))
    out = str(folder / "videos.lance")
    lance.write_dataset(table, out, data_storage_version="2.2", max_rows_per_file=2)
    return out


def audio_dataset(folder: Path, seconds: list[float], rate: int = 8000) -> str:
    """WAV files of ``seconds`` each, mono, with a name column."""
    for i, s in enumerate(seconds):
        write_audio(folder / f"a{i}.wav", s, rate, 1)
    table = pa.table(
        {
            "name": [f"a{i}" for i in range(len(seconds))],
            "audio": lance.blob.blob_array(
                [(folder / f"a{i}.wav").read_bytes() for i in range(len(seconds))]
            ),
        }
    )
    out = str(folder / "audio.lance")
    shutil.rmtree(out, ignore_errors=True)
    lance.write_dataset(table, out, data_storage_version="2.2")
    return out


def image_folder(root: Path, per_class: int = 3, broken: tuple[str, ...] = ()) -> Path:
    """root/<class>/<i>.jpg (and .png) for classes 'cat', 'dog'; ``broken`` files are garbage."""
    from PIL import Image

    for c, name in enumerate(["cat", "dog"]):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            image = Image.fromarray(np.full((8 + i, 10, 3), 40 * c + i, np.uint8))
            suffix = ".png" if i % 2 else ".jpg"
            image.save(root / name / f"{i}{suffix}")
    for relative in broken:
        (root / relative).write_bytes(b"not an image")
    (root / "cat" / "notes.txt").write_text("ignored")
    return root
