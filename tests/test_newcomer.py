"""Newcomer mistakes are caught with a message that names the fix (issue: the first hour)."""

from __future__ import annotations

import io
import warnings

import lance
import numpy as np
import pyarrow as pa
import pytest
from PIL import Image

import lanceloader as ll
import lanceloader.pipeline as pipeline


@pytest.fixture
def images_uri(tmp_path) -> str:
    data = []
    for i in range(8):
        buf = io.BytesIO()
        Image.new("RGB", (4, 4), (i, 0, 0)).save(buf, format="PNG")
        data.append(buf.getvalue())
    uri = str(tmp_path / "images.lance")
    lance.write_dataset(
        pa.table({"image": pa.array(data, pa.binary()), "label": np.arange(8)}), uri
    )
    return uri


def test_encoded_bytes_to_tensors_point_at_decode_images(images_uri) -> None:
    pytest.importorskip("torch")
    with pytest.raises(ll.ConversionError, match=r"transform=ll\.decode_images\('image'\)"):
        ll.Loader(images_uri, batch_size=4, output="torch")
    # The fixes it names work: decode, leave the column out, or ask for the bytes on purpose.
    decoded = next(
        iter(
            ll.Loader(
                images_uri,
                batch_size=4,
                output="torch",
                transform=ll.decode_images("image", layout="CHW"),
            )
        )
    )
    assert tuple(decoded["image"].shape) == (4, 3, 4, 4)
    assert next(iter(ll.Loader(images_uri, batch_size=4, columns=["label"], output="torch")))
    raw = next(iter(ll.Loader(images_uri, batch_size=4, output=ll.Conversion(output="torch"))))
    assert isinstance(raw["image"][0], bytes)


def test_a_dataloader_batch_size_over_an_iterable_dataset_is_refused(small_uri) -> None:
    torch = pytest.importorskip("torch")
    from lanceloader.torch import IterableDataset

    ds = IterableDataset(small_uri, batch_size=16, columns=["id"])
    with pytest.raises(ValueError, match="batch_size=None"):
        next(iter(torch.utils.data.DataLoader(ds, batch_size=4)))
    batch = next(iter(torch.utils.data.DataLoader(ds, batch_size=None)))
    assert tuple(batch["id"].shape) == (16,)


def test_more_process_workers_than_cores_is_hinted_once(small_uri, monkeypatch) -> None:
    monkeypatch.setattr(pipeline, "_hinted", set())
    cores = pipeline.usable_cores()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ll.Loader(small_uri, worker_type="process", num_workers=cores + 1)
        ll.Loader(small_uri, worker_type="process", num_workers=cores + 1)
        ll.Loader(small_uri, worker_type="process", num_workers=cores)
    hints = [w for w in caught if "process workers on" in str(w.message)]
    assert len(hints) == 1
    assert hints[0].filename == __file__  # it points at the user's line
    assert f"num_workers={cores} or fewer" in str(hints[0].message)


def test_demo_labels_are_what_cross_entropy_takes(small_uri) -> None:
    batch = next(iter(ll.Loader(small_uri, batch_size=4, columns=["label"])))
    assert batch["label"].dtype == np.int64
