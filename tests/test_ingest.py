"""convert(): every source kind into Lance and back (rows, types, labels, metadata), and each
bad input with a message naming it."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa
import pyarrow.csv
import pyarrow.dataset
import pyarrow.parquet as pq
import pytest
from PIL import Image

import lanceloader as ll
from lanceloader.demo import demo_table


def image_folder(root: Path, per_class: int = 3, broken: tuple[str, ...] = ()) -> Path:
    """root/<class>/<i>.jpg (and .png) for classes 'cat', 'dog'; ``broken`` files are garbage."""
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


def test_an_image_folder_round_trips(tmp_path):
    root = image_folder(tmp_path / "images")
    summary = ll.convert(root, tmp_path / "out.lance", progress=False)
    ds = lance.dataset(tmp_path / "out.lance")
    table = ds.to_table()
    assert summary.rows == 6 == table.num_rows and summary.skipped == ()
    assert table.schema.field("label").type == pa.int64()
    assert json.loads(ds.schema.metadata[b"lanceloader.classes"]) == ["cat", "dog"]
    rows = sorted(zip(table["path"].to_pylist(), table["label"].to_pylist(), strict=True))
    assert rows == [(f"{n}/{i}{'.png' if i % 2 else '.jpg'}", c) for c, n in
                    enumerate(["cat", "dog"]) for i in range(3)]
    first = table.filter(pa.compute.equal(table["path"], "dog/1.png"))["image"][0].as_py()
    assert first == (root / "dog" / "1.png").read_bytes()  # the bytes as they were
    batch = next(iter(ll.Loader(tmp_path / "out.lance", batch_size=6,
                                transform=ll.decode_images("image", size=(8, 8)))))
    assert batch["image"].shape == (6, 8, 8, 3)


def test_unreadable_images_are_skipped_and_listed_or_raise(tmp_path):
    root = image_folder(tmp_path / "images", broken=("dog/bad.jpg",))
    whole = (root / "cat" / "0.jpg").read_bytes()
    (root / "cat" / "cut.jpg").write_bytes(whole[: len(whole) // 2])  # truncated by a copy
    summary = ll.convert(root, tmp_path / "out.lance", progress=False)
    assert summary.rows == 6
    assert dict(summary.skipped).keys() == {"cat/cut.jpg", "dog/bad.jpg"}
    assert "truncated" in dict(summary.skipped)["cat/cut.jpg"]
    assert "skipped 2: cat/cut.jpg" in str(summary)
    with pytest.raises(ValueError, match=r"cannot read the image .*cut\.jpg.*truncated.*on_error='skip'"):
        ll.convert(root, tmp_path / "again.lance", on_error="raise", progress=False)


def test_resize_re_encodes_images(tmp_path):
    root = image_folder(tmp_path / "images")
    ll.convert(root, tmp_path / "out.lance", resize=4, progress=False)
    data = lance.dataset(tmp_path / "out.lance").to_table()["image"][0].as_py()
    with Image.open(io.BytesIO(data)) as image:
        assert image.format == "JPEG" and max(image.size) <= 4


def test_parquet_files_and_directories(tmp_path):
    table = demo_table(3000).select(["id", "label", "x"])
    table = table.set_column(1, "label", table["label"].cast(pa.int16()))
    folder = tmp_path / "pq"
    folder.mkdir()
    for i in range(3):
        pq.write_table(table.slice(1000 * i, 1000), folder / f"part-{i}.parquet")
    ll.convert(folder, tmp_path / "dir.lance", batch_rows=700, progress=False)
    ll.convert(folder / "part-1.parquet", tmp_path / "file.lance", progress=False)
    out = lance.dataset(tmp_path / "dir.lance").to_table()
    assert out["id"].to_pylist() == list(range(3000))
    assert out.schema.field("label").type == pa.int64()  # what cross_entropy wants
    assert out["x"].equals(table["x"])
    assert lance.dataset(tmp_path / "file.lance").to_table()["id"].to_pylist() == \
        list(range(1000, 2000))


def test_parquet_files_that_disagree_are_named(tmp_path):
    folder = tmp_path / "pq"
    folder.mkdir()
    pq.write_table(pa.table({"a": [1], "b": [1.0]}), folder / "one.parquet")
    pq.write_table(pa.table({"a": ["x"], "b": [1.0]}), folder / "two.parquet")
    with pytest.raises(ValueError, match=r"one\.parquet.*two\.parquet.*a: int64 vs string"):
        ll.convert(folder, tmp_path / "out.lance", progress=False)


def test_csv_dataframe_tables_and_pyarrow_datasets(tmp_path):
    import pandas as pd

    frame = pd.DataFrame({"x": np.arange(5.0), "label": np.arange(5, dtype=np.int32),
                          "name": list("abcde")})
    pyarrow.csv.write_csv(pa.Table.from_pandas(frame), tmp_path / "data.csv")
    sources = {
        "csv": tmp_path / "data.csv",
        "frame": frame,
        "table": pa.Table.from_pandas(frame, preserve_index=False),
        "batch": pa.RecordBatch.from_pandas(frame, preserve_index=False),
        "dataset": pyarrow.dataset.dataset(tmp_path / "data.csv", format="csv"),
        "reader": pa.Table.from_pandas(frame, preserve_index=False).to_reader(),
    }
    for name, source in sources.items():
        ll.convert(source, tmp_path / f"{name}.lance", progress=False)
        out = lance.dataset(tmp_path / f"{name}.lance").to_table()
        assert out["x"].to_pylist() == [0.0, 1.0, 2.0, 3.0, 4.0], name
        assert out["name"].to_pylist() == list("abcde"), name
        assert out.schema.field("label").type == pa.int64(), name


def test_a_hugging_face_dataset_object_and_saved_directory(tmp_path):
    datasets = pytest.importorskip("datasets")
    root = image_folder(tmp_path / "images")
    files = sorted(str(p) for p in root.rglob("*.jpg"))[:2]
    features = datasets.Features({"img": datasets.Image(), "label": datasets.ClassLabel(
        names=["cat", "dog"]), "text": datasets.Value("string")})
    hf = datasets.Dataset.from_dict({"img": files, "label": [0, 1], "text": ["a", "b"]},
                                    features=features)
    ll.convert(hf, tmp_path / "object.lance", progress=False)
    hf.save_to_disk(tmp_path / "saved")
    ll.convert(tmp_path / "saved", tmp_path / "saved.lance", progress=False)
    for name in ("object", "saved"):
        ds = lance.dataset(tmp_path / f"{name}.lance")
        table = ds.to_table()
        assert table["img"].to_pylist() == [Path(f).read_bytes() for f in files]
        assert table.schema.field("label").type == pa.int64()
        assert table["label"].to_pylist() == [0, 1]
        assert json.loads(ds.schema.metadata[b"lanceloader.classes"]) == ["cat", "dog"]


def test_an_existing_output_needs_a_mode(tmp_path):
    table = pa.table({"x": [1, 2]})
    out = tmp_path / "out.lance"
    ll.convert(table, out, progress=False)
    with pytest.raises(FileExistsError, match=r"mode='overwrite'.*mode='append'"):
        ll.convert(table, out, progress=False)
    ll.convert(table, out, mode="append", progress=False)
    assert lance.dataset(out).count_rows() == 4
    ll.convert(table, out, mode="overwrite", progress=False)
    assert lance.dataset(out).count_rows() == 2


@pytest.mark.parametrize(("source", "error", "says"), [
    ("missing", FileNotFoundError, "does not exist"),
    ({"x": 1}, TypeError, "cannot convert a builtins.dict"),
    ("empty", ValueError, "no Parquet or CSV files and no class folders"),
    ("lance", ValueError, "already a Lance dataset"),
])
def test_bad_sources_say_what_to_do(tmp_path, source, error, says):
    if source == "empty":
        (tmp_path / "empty").mkdir()
    if source == "lance":
        lance.write_dataset(pa.table({"x": [1]}), tmp_path / "lance")
    given = tmp_path / source if isinstance(source, str) else source
    with pytest.raises(error, match=says):
        ll.convert(given, tmp_path / "out.lance", progress=False)


def test_the_command_line(tmp_path):
    pq.write_table(pa.table({"x": [1, 2, 3]}), tmp_path / "in.parquet")
    done = subprocess.run([sys.executable, "-m", "lanceloader.cli", "convert",
                           str(tmp_path / "in.parquet"), str(tmp_path / "out.lance")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "wrote 3 rows" in done.stdout
    again = subprocess.run([sys.executable, "-m", "lanceloader.cli", "convert",
                            str(tmp_path / "in.parquet"), str(tmp_path / "out.lance")],
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and "--mode overwrite" in again.stderr
