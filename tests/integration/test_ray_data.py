"""Ray Data (a local Ray with 2 CPUs): lanceloader.ray.materialize and convert give the same
rows as the single-machine versions."""

from __future__ import annotations

import json

import lance
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import lanceloader as ll
from lanceloader.demo import demo_table, write_demo_dataset
from media_datasets import image_folder

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def local_ray():
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}},
    )
    yield
    ray.shutdown()


def make_double_x():
    """A transform defined in a function: Ray's workers cannot import the test module, so it
    travels by value (cloudpickle), as a user's transform in a script would."""

    def double_x(batch: pa.RecordBatch) -> pa.RecordBatch:
        x = np.stack(batch.column("x").to_numpy(zero_copy_only=False)) * 2
        return pa.record_batch(
            {
                "id": batch.column("id"),
                "x": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), 64),
            }
        )

    return double_x


def test_materialize_on_ray_equals_one_machine(local_ray, tmp_path):
    import lanceloader.ray

    uri = write_demo_dataset(tmp_path / "d.lance", rows=3000, fragments=3)
    loader = ll.Loader(
        uri,
        batch_size=100,
        columns=["id", "x"],
        filter="label != 2",
        shuffle=True,
        seed=7,
        transform=make_double_x(),
    )
    here = ll.materialize(loader, tmp_path / "here.lance", rows_per_fragment=500)
    there = lanceloader.ray.materialize(
        loader, tmp_path / "there.lance", rows_per_fragment=500, concurrency=2
    )
    assert there.version == 1 and there.dataset.to_table().equals(here.dataset.to_table())
    assert there.fragments == here.fragments == 6
    facts = json.loads(there.dataset.schema.metadata[b"lanceloader.lineage"])
    assert facts == json.loads(here.dataset.schema.metadata[b"lanceloader.lineage"])


def test_convert_on_ray_equals_one_machine(local_ray, tmp_path):
    import lanceloader.ray

    root = image_folder(tmp_path / "images", per_class=5, broken=("cat/bad.jpg",))
    here = ll.convert(root, tmp_path / "here.lance", progress=False)
    there = lanceloader.ray.convert(root, tmp_path / "there.lance", files_per_task=3)
    a, b = lance.dataset(tmp_path / "here.lance"), lance.dataset(tmp_path / "there.lance")
    assert b.to_table().equals(a.to_table()) and there.rows == here.rows == 10
    assert [s[0] for s in there.skipped] == [s[0] for s in here.skipped] == ["cat/bad.jpg"]
    assert b.schema.metadata[b"lanceloader.classes"] == a.schema.metadata[b"lanceloader.classes"]

    folder = tmp_path / "pq"
    folder.mkdir()
    table = demo_table(900).select(["id", "label", "x"])
    for i in range(3):
        pq.write_table(table.slice(300 * i, 300), folder / f"part-{i}.parquet")
    ll.convert(folder, tmp_path / "pq-here.lance", progress=False)
    lanceloader.ray.convert(folder, tmp_path / "pq-there.lance")
    assert (
        lance.dataset(tmp_path / "pq-there.lance")
        .to_table()
        .equals(lance.dataset(tmp_path / "pq-here.lance").to_table())
    )


def test_ray_writes_to_object_storage(local_ray, s3, tmp_path, monkeypatch):
    """Ray Data tasks write a copy and a conversion straight to the S3 server (the tasks get
    storage_options), with the same rows as on local disk."""
    import lanceloader.ray

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    uri = write_demo_dataset(tmp_path / "d.lance", rows=1000, fragments=2)
    loader = ll.Loader(uri, batch_size=100, columns=["id", "x"], shuffle=True, seed=3)
    bucket = s3.bucket()
    copy = lanceloader.ray.materialize(
        loader,
        f"s3://{bucket}/copy.lance",
        rows_per_fragment=500,
        concurrency=2,
        storage_options=s3.storage_options,
    )
    here = ll.materialize(loader, tmp_path / "here.lance")
    assert copy.dataset.to_table().equals(here.dataset.to_table())
    root = image_folder(tmp_path / "images", per_class=3)
    summary = lanceloader.ray.convert(
        root, f"s3://{bucket}/images.lance", files_per_task=2, storage_options=s3.storage_options
    )
    there = lance.dataset(summary.uri, storage_options=s3.storage_options).to_table()
    here = lance.dataset(ll.convert(root, tmp_path / "images.lance", progress=False).uri)
    assert there.select(["image", "label", "path"]).equals(
        here.to_table().select(["image", "label", "path"])
    )
