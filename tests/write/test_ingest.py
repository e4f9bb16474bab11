"""convert(): every source kind into Lance and back (rows, types, labels, metadata), and each
bad input with a message naming it."""

from __future__ import annotations

import io
import json
import os
import re
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
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

import lanceloader as ll
from lanceloader.demo import demo_table
from media_datasets import image_folder


def test_an_image_folder_round_trips(tmp_path):
    root = image_folder(tmp_path / "images")
    summary = ll.convert(root, tmp_path / "out.lance", progress=False)
    ds = lance.dataset(tmp_path / "out.lance")
    table = ds.to_table()
    assert summary.rows == 6 == table.num_rows and summary.skipped == ()
    assert table.schema.field("label").type == pa.int64()
    assert json.loads(ds.schema.metadata[b"lanceloader.classes"]) == ["cat", "dog"]
    rows = sorted(zip(table["path"].to_pylist(), table["label"].to_pylist(), strict=True))
    assert rows == [
        (f"{n}/{i}{'.png' if i % 2 else '.jpg'}", c)
        for c, n in enumerate(["cat", "dog"])
        for i in range(3)
    ]
    first = table.filter(pa.compute.equal(table["path"], "dog/1.png"))["image"][0].as_py()
    assert first == (root / "dog" / "1.png").read_bytes()  # the bytes as they were
    batch = next(
        iter(
            ll.Loader(
                tmp_path / "out.lance",
                batch_size=6,
                transform=ll.decode_images("image", size=(8, 8)),
            )
        )
    )
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
    with pytest.raises(
        ValueError, match=r"cannot read the image .*cut\.jpg.*truncated.*on_error='skip'"
    ):
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
    assert lance.dataset(tmp_path / "file.lance").to_table()["id"].to_pylist() == list(
        range(1000, 2000)
    )


def test_parquet_files_that_disagree_are_named(tmp_path):
    folder = tmp_path / "pq"
    folder.mkdir()
    pq.write_table(pa.table({"a": [1], "b": [1.0]}), folder / "one.parquet")
    pq.write_table(pa.table({"a": ["x"], "b": [1.0]}), folder / "two.parquet")
    with pytest.raises(ValueError, match=r"one\.parquet.*two\.parquet.*a: int64 vs string"):
        ll.convert(folder, tmp_path / "out.lance", progress=False)


def test_csv_dataframe_tables_and_pyarrow_datasets(tmp_path):
    import pandas as pd

    frame = pd.DataFrame(
        {"x": np.arange(5.0), "label": np.arange(5, dtype=np.int32), "name": list("abcde")}
    )
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
    features = datasets.Features(
        {
            "img": datasets.Image(),
            "label": datasets.ClassLabel(names=["cat", "dog"]),
            "text": datasets.Value("string"),
        }
    )
    hf = datasets.Dataset.from_dict(
        {"img": files, "label": [0, 1], "text": ["a", "b"]}, features=features
    )
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


@pytest.mark.parametrize(
    ("source", "error", "says"),
    [
        ("missing", FileNotFoundError, "does not exist"),
        ({"x": 1}, TypeError, "cannot convert a builtins.dict"),
        ("empty", ValueError, "no Parquet or CSV files and no class folders"),
        ("lance", ValueError, "already a Lance dataset"),
    ],
)
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
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "lanceloader.cli",
            "convert",
            str(tmp_path / "in.parquet"),
            str(tmp_path / "out.lance"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "wrote 3 rows" in done.stdout
    again = subprocess.run(
        [
            sys.executable,
            "-m",
            "lanceloader.cli",
            "convert",
            str(tmp_path / "in.parquet"),
            str(tmp_path / "out.lance"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 2 and "--mode overwrite" in again.stderr


# --- issue 24: what convert reads, stores and leaves behind, and how its errors say where ----


@pytest.fixture(autouse=True)
def cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run records and locks go to this test's own cache directory (subprocesses too)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_a_conversion_never_reads_its_own_output_or_any_lance_dataset(tmp_path):
    """A second conversion of a folder holding the first's output took it for a class: every
    later label shifted by one."""
    root = image_folder(tmp_path / "images")
    ll.convert(root, root / "all.lance", progress=False)  # 'all' sorts before the classes
    summary = ll.convert(root, root / "again.lance", progress=False)
    first, again = (lance.dataset(root / n) for n in ("all.lance", "again.lance"))
    assert json.loads(again.schema.metadata[b"lanceloader.classes"]) == ["cat", "dog"]
    assert again.to_table().equals(first.to_table())
    assert dict(summary.skipped)["all.lance"].startswith("a Lance dataset")
    folder = tmp_path / "pq"
    folder.mkdir()
    pq.write_table(pa.table({"x": [1, 2]}), folder / "a.parquet")
    ll.convert(folder, folder / "out.lance", progress=False)
    ll.convert(folder, folder / "out.lance", mode="overwrite", progress=False)
    assert lance.dataset(folder / "out.lance").to_table()["x"].to_pylist() == [1, 2]


def noisy_image(path: Path, fmt: str) -> bytes:
    """A 64x64 image of noise (so its compressed data is ~10 KB), saved and returned."""
    pixels = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path, format=fmt)
    return path.read_bytes()


def test_an_image_with_a_garbage_middle_is_refused_unless_checks_are_off(tmp_path):
    """Start and end markers intact, the middle third random: it was stored, and failed only
    in training."""
    root = image_folder(tmp_path / "images")
    rng = np.random.default_rng(1)
    for name, fmt in (("noise.jpg", "JPEG"), ("noise.png", "PNG")):
        data = bytearray(noisy_image(root / "dog" / name, fmt))
        third = len(data) // 3
        data[third : 2 * third] = rng.integers(0, 256, third, dtype=np.uint8).tobytes()
        (root / "dog" / name).write_bytes(bytes(data))
    summary = ll.convert(root, tmp_path / "out.lance", progress=False)
    why = dict(summary.skipped)
    assert re.search(r"a JPEG (with garbage|truncated or damaged|damaged)", why["dog/noise.jpg"]), (
        why
    )
    assert "CRC does not match" in why["dog/noise.png"]
    decoded = ll.convert(root, tmp_path / "decoded.lance", check_images="decode", progress=False)
    assert dict(decoded.skipped).keys() == {"dog/noise.jpg", "dog/noise.png"}
    unchecked = ll.convert(root, tmp_path / "raw.lance", check_images="none", progress=False)
    assert unchecked.rows == 8 and unchecked.skipped == ()
    # the command line has the same choice
    from lanceloader.cli import main

    assert main(["convert", str(root), str(tmp_path / "cli.lance"), "--quiet"]) == 0
    assert lance.dataset(str(tmp_path / "cli.lance")).count_rows() == 6
    assert (
        main(
            [
                "convert",
                str(root),
                str(tmp_path / "cli-raw.lance"),
                "--quiet",
                "--check-images",
                "none",
            ]
        )
        == 0
    )
    assert lance.dataset(str(tmp_path / "cli-raw.lance")).count_rows() == 8


KILLED_CONVERT = """
import json, os, signal, sys
import numpy as np
import pyarrow as pa
import lanceloader as ll

out, mode, kill_after = sys.argv[1], sys.argv[2], int(sys.argv[3])
options = json.loads(sys.argv[4]) if len(sys.argv) > 4 else None
schema = pa.schema([("id", pa.int64()), ("payload", pa.binary())])

def batches():
    for i in range(12):
        if i == kill_after:
            os.kill(os.getpid(), signal.SIGKILL)
        yield pa.record_batch([pa.array(np.arange(i * 500, (i + 1) * 500)),
                               pa.array([bytes(200)] * 500, pa.binary())], schema=schema)

summary = ll.convert(pa.RecordBatchReader.from_batches(schema, batches()), out, mode=mode,
                     max_rows_per_file=1000, progress=False, storage_options=options)
print(getattr(summary, "removed", (0, 0))[0])
"""


@pytest.mark.parametrize("mode", ["create", "overwrite"])
def test_a_killed_conversion_leaves_no_unreferenced_file_after_the_rerun(tmp_path, mode):
    """SIGKILLed during its write and run again: the dataset was exact, but the killed run's
    data files stayed, referenced by no version, and nothing removed them."""
    script = tmp_path / "run.py"
    script.write_text(KILLED_CONVERT)
    out = tmp_path / "out.lance"

    def run(kill_after: int) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, str(script), str(out), mode, str(kill_after)],
            capture_output=True,
            text=True,
            timeout=300,
        )

    if mode == "overwrite":
        assert run(-1).returncode == 0
    killed = run(9)
    assert killed.returncode == -9, killed.stderr
    assert len(os.listdir(out / "data")) >= 3  # files written before the kill
    again = run(-1)
    assert again.returncode == 0, again.stderr
    ds = lance.dataset(out)
    referenced = {
        os.path.basename(f.path)
        for v in ds.versions()
        for frag in ds.checkout_version(v["version"]).get_fragments()
        for f in frag.data_files()
    }
    assert set(os.listdir(out / "data")) == referenced
    assert ds.to_table()["id"].to_pylist() == list(range(6000))
    assert int(again.stdout.split()[-1]) >= 3  # the summary counts what it removed


def test_a_killed_conversion_to_s3_leaves_no_unreferenced_object_after_the_rerun(s3, tmp_path):
    """The same on an S3 server: the rerun has Lance remove what the killed run wrote."""
    import boto3

    script = tmp_path / "run.py"
    script.write_text(KILLED_CONVERT)
    bucket = s3.bucket()
    out = f"s3://{bucket}/out.lance"

    def run(kill_after: int) -> subprocess.CompletedProcess:
        return subprocess.run(
            [
                sys.executable,
                str(script),
                out,
                "create",
                str(kill_after),
                json.dumps(s3.storage_options),
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )

    options = s3.storage_options
    client = boto3.client(
        "s3",
        endpoint_url=s3.endpoint,
        region_name="us-east-1",
        aws_access_key_id=options["access_key_id"],
        aws_secret_access_key=options["secret_access_key"],
    )

    def data_objects() -> set[str]:
        listed = client.list_objects_v2(Bucket=bucket, Prefix="out.lance/data/")
        return {item["Key"].rsplit("/", 1)[-1] for item in listed.get("Contents", [])}

    assert run(9).returncode == -9
    assert len(data_objects()) >= 3
    again = run(-1)
    assert again.returncode == 0, again.stderr
    ds = lance.dataset(out, storage_options=options)
    referenced = {
        os.path.basename(f.path) for frag in ds.get_fragments() for f in frag.data_files()
    }
    assert data_objects() == referenced and ds.count_rows() == 6000
    assert int(again.stdout.split()[-1]) >= 3


def test_parquet_files_that_differ_in_order_or_nullability_say_how(tmp_path):
    folder = tmp_path / "pq"
    folder.mkdir()
    pq.write_table(pa.table({"a": [1], "b": [1.0]}), folder / "one.parquet")
    pq.write_table(pa.table({"b": [1.0], "a": [1]}), folder / "two.parquet")
    with pytest.raises(ValueError, match=r"one\.parquet.*two\.parquet.*column order: a, b vs b, a"):
        ll.convert(folder, tmp_path / "out.lance", progress=False)
    pq.write_table(
        pa.table(
            {"a": [1], "b": [1.0]},
            schema=pa.schema([pa.field("a", pa.int64(), nullable=False), ("b", pa.float64())]),
        ),
        folder / "two.parquet",
    )
    with pytest.raises(ValueError, match=r"two\.parquet.*a: nullable vs not null"):
        ll.convert(folder, tmp_path / "out.lance", progress=False)


def test_a_garbage_parquet_file_is_named(tmp_path):
    folder = tmp_path / "pq"
    folder.mkdir()
    pq.write_table(pa.table({"a": [1]}), folder / "good.parquet")
    (folder / "junk.parquet").write_bytes(b"not parquet at all" * 10)
    with pytest.raises(ValueError, match=r"'[^']*junk\.parquet' is not a readable Parquet file"):
        ll.convert(folder, tmp_path / "out.lance", progress=False)


def test_csv_errors_name_the_file_and_the_column(tmp_path):
    folder = tmp_path / "csv"
    folder.mkdir()
    for name in ("a", "b"):
        (folder / f"{name}.csv").write_text("x,y\n1,2\n3,4\n")
    (folder / "c.csv").write_text("x,y\n1,2\n3,4,5\n")  # a ragged row in the 3rd of 3 files
    with pytest.raises(ValueError, match=r"c\.csv.*Expected 2 columns, got 3.*fix or remove"):
        ll.convert(folder, tmp_path / "out.lance", progress=False)
    late = tmp_path / "late.csv"  # the type changes after the first 4 MiB pyarrow infers from
    with open(late, "w") as file:
        file.write("x,y\n" + "1,2\n" * 1_200_000 + "oops,2\n")
    with pytest.raises(
        ValueError,
        match=r"late\.csv.*after its first [\d,]+.*column 'x' was "
        r"read as int64.*column_types",
    ):
        ll.convert(late, tmp_path / "late.lance", progress=False)


def test_a_single_image_is_not_read_as_csv(tmp_path):
    """`lanceloader convert some.jpg out.lance` parsed the JPEG as CSV and printed its bytes."""
    noisy_image(tmp_path / "some.jpg", "JPEG")
    (tmp_path / "photo.dat").write_bytes((tmp_path / "some.jpg").read_bytes())
    with pytest.raises(ValueError, match=r"photo\.dat' is a single image"):
        ll.convert(tmp_path / "photo.dat", tmp_path / "x.lance", progress=False)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "lanceloader.cli",
            "convert",
            str(tmp_path / "some.jpg"),
            str(tmp_path / "out.lance"),
        ],
        capture_output=True,
        timeout=120,
    )
    assert done.returncode == 2
    err = done.stderr.decode("utf-8")  # text, not the JPEG's bytes
    assert "some.jpg' is a single image" in err
    assert all(c.isprintable() or c in "\n\t" for c in err), err


def test_an_existing_directory_that_is_not_a_lance_dataset_is_refused(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(
        FileExistsError,
        match=r"mine' is a directory that is not a Lance "
        r"dataset and not empty.*'notes.txt'",
    ):
        ll.convert(pa.table({"x": [1]}), out, progress=False)
    assert os.listdir(out) == ["notes.txt"]
    (out / "notes.txt").unlink()
    assert ll.convert(pa.table({"x": [1]}), out, progress=False).rows == 1  # empty: fine


def test_object_store_outputs_get_tailored_errors(s3):
    with pytest.raises(
        OSError,
        match=r"cannot write the Lance dataset 's3://nosuchbucket/o\.lance'"
        r": the bucket 'nosuchbucket' does not exist",
    ):
        ll.convert(
            pa.table({"x": [1]}),
            "s3://nosuchbucket/o.lance",
            storage_options=s3.storage_options,
            progress=False,
        )
    from lanceloader.write.convert import write_error

    # what Lance says with no storage_options (it would ask AWS: not from a test)
    said = OSError(
        "LanceError(IO): Generic S3 error: Failed to resolve region for bucket 'b', "
        "/home/runner/work/lance/lance/rust/lance-io/src/object_store/providers/aws.rs"
        ":342:13"
    )
    assert "no storage_options were given" in str(write_error(said, "s3://b/o.lance", None))


WRITERS = """
import sys
import pyarrow as pa
import lanceloader as ll
from lanceloader.demo import write_demo_dataset

base = sys.argv[1]
ll.convert(pa.table({"x": [1, 2]}), base + "/c.lance", mode="overwrite", progress=False)
ll.convert(pa.table({"x": [1, 2]}), base + "/a.lance", mode="append", progress=False)
uri = write_demo_dataset(base + "/d.lance", rows=100)
ll.materialize(ll.Loader(uri, batch_size=10, columns=["id"]), base + "/m.lance")
ll.materialize(ll.Loader(uri, batch_size=10, columns=["id"]), base + "/o.lance",
               mode="overwrite")
print("done")
"""


def test_writers_do_not_print_lances_no_existing_dataset_warning(tmp_path):
    """Lance warned 'No existing dataset at ..., it will be created' on stderr for every
    convert(mode="overwrite") and materialize into a new path."""
    done = subprocess.run(
        [sys.executable, "-c", WRITERS, str(tmp_path)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0 and done.stdout.strip() == "done", done.stderr
    assert "No existing dataset" not in done.stderr, done.stderr


def late_text_csv(path: Path, fixed: bool = False) -> Path:
    """A CSV whose column x turns to text after the first 4 MiB pyarrow infers types from."""
    with open(path, "w") as file:
        file.write("x,y\n" + "1,2\n" * 1_200_000 + ("3,2\n" if fixed else "oops,2\n"))
    return path


def test_a_failed_conversion_can_be_run_again_into_the_same_output(tmp_path):
    """A CSV that failed half-way left an empty data/ behind; after fixing the file, the same
    call was refused as 'a write that never committed ... remove the directory'."""
    late = late_text_csv(tmp_path / "late.csv")
    out = tmp_path / "late.lance"
    with pytest.raises(ValueError, match=r"late\.csv.*column 'x'"):
        ll.convert(late, out, progress=False)
    assert not out.exists()  # nothing of the failed run is left
    late_text_csv(late, fixed=True)
    assert ll.convert(late, out, progress=False).rows == 1_200_001
    # Appending to a dataset: the failed run's files go, the dataset's stay.
    late_text_csv(late)
    before = sorted(os.listdir(out / "data"))
    with pytest.raises(ValueError, match=r"late\.csv"):
        ll.convert(late, out, mode="append", progress=False)
    assert sorted(os.listdir(out / "data")) == before
    assert lance.dataset(out).count_rows() == 1_200_001


KILLED_INTO = """
import os, signal, sys
import numpy as np
import pyarrow as pa
import lanceloader as ll

schema = pa.schema([("id", pa.int64())])

def batches():
    for i in range(6):
        if i == 4:
            os.kill(os.getpid(), signal.SIGKILL)
        yield pa.record_batch([pa.array(np.arange(i * 100, (i + 1) * 100))], schema=schema)

ll.convert(pa.RecordBatchReader.from_batches(schema, batches()), sys.argv[1],
           max_rows_per_file=100, progress=False)
"""


def test_a_killed_conversion_inside_the_image_root_is_not_a_class(tmp_path):
    """Killed before its commit, a convert into root/out left a data/ of Lance files and no
    _versions/: the next conversion of root read 'out' as a class and shifted later labels."""
    root = tmp_path / "imgs"
    for name in ("a", "z"):
        (root / name).mkdir(parents=True)
        Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(root / name / "0.png")
    script = tmp_path / "run.py"
    script.write_text(KILLED_INTO)
    killed = subprocess.run(
        [sys.executable, str(script), str(root / "out")], capture_output=True, timeout=300
    )
    assert killed.returncode == -9, killed.stderr
    assert os.listdir(root / "out") == ["data"] and os.listdir(root / "out" / "data")
    summary = ll.convert(root, tmp_path / "imgs.lance", progress=False)
    ds = lance.dataset(tmp_path / "imgs.lance")
    assert json.loads(ds.schema.metadata[b"lanceloader.classes"]) == ["a", "z"]
    assert ds.to_table()["label"].to_pylist() == [0, 1]
    assert "unfinished Lance write" in dict(summary.skipped)["out"]


def test_links_are_followed_and_loops_skipped_and_listed(tmp_path):
    """A class folder linked to the root became a class holding a second copy of every image;
    a linked sub-folder of images was left out, and neither was said."""
    root = image_folder(tmp_path / "images")
    elsewhere = tmp_path / "more"
    elsewhere.mkdir()
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(elsewhere / "x.png")
    (root / "cat" / "more").symlink_to(elsewhere)  # a linked folder of images: followed
    (root / "dog" / "again").symlink_to(root / "dog")  # a loop below a class
    (root / "loop").symlink_to(root)  # a 'class' that is the root itself
    summary = ll.convert(root, tmp_path / "out.lance", progress=False)
    ds = lance.dataset(tmp_path / "out.lance")
    assert json.loads(ds.schema.metadata[b"lanceloader.classes"]) == ["cat", "dog"]
    table = ds.to_table()
    assert sorted(table["path"].to_pylist()) == sorted(
        [f"{c}/{i}.{'png' if i % 2 else 'jpg'}" for c in ("cat", "dog") for i in range(3)]
        + ["cat/more/x.png"]
    )
    skipped = dict(summary.skipped)
    assert skipped["loop"] == "a link back to the root folder (.), a loop: not followed"
    assert skipped["dog/again"] == "a link back to 'dog', a loop: not followed"
    tables = tmp_path / "tables"  # the same walk finds Parquet files
    (tables / "part").mkdir(parents=True)
    pq.write_table(pa.table({"x": [1, 2]}), tables / "part" / "a.parquet")
    (tables / "linked").symlink_to(tables / "part")
    (tables / "part" / "up").symlink_to(tables)
    done = ll.convert(tables, tmp_path / "t.lance", progress=False)
    assert lance.dataset(tmp_path / "t.lance").to_table()["x"].to_pylist() == [1, 2, 1, 2]
    assert [item for item, _ in done.skipped] == ["linked/up", "part/up"]


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    parents=st.lists(st.integers(0, 10), min_size=1, max_size=6),
    links=st.lists(st.tuples(st.integers(0, 10), st.integers(0, 10)), max_size=5),
)
def test_the_walk_follows_links_ends_and_never_loops(tmp_path_factory, parents, links):
    """Any tree of folders with links between them: the walk ends, finds every file of the
    real tree, and never goes down a link into a folder already on its own path."""
    from lanceloader.write.folders import walk

    root = tmp_path_factory.mktemp("tree")
    folders = [root]
    for i, parent in enumerate(parents):  # folder i+1 under an earlier folder
        folders.append(folders[parent % len(folders)] / f"d{i}")
        folders[-1].mkdir()
    for folder in folders:
        (folder / "f").touch()
    for k, (source, target) in enumerate(links):
        (folders[source % len(folders)] / f"l{k}").symlink_to(folders[target % len(folders)])
    skipped: list[tuple[str, str]] = []
    seen = list(walk(root, skipped, root=root))
    found = {os.path.realpath(os.path.join(folder, "f")) for folder, names in seen if "f" in names}
    assert found == {os.path.realpath(folder / "f") for folder in folders}
    for folder, _ in seen:  # no real folder twice on one path
        chain, path = [], Path(folder)
        while True:
            chain.append(os.path.realpath(path))
            if path == root:
                break
            path = path.parent
        assert len(chain) == len(set(chain)), folder
    for item, why in skipped:
        assert why.endswith("a loop: not followed")
        target = os.path.realpath(root / item)
        assert any(target == os.path.realpath(p) for p in (root / item).parents), item
