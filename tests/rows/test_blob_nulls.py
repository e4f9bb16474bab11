"""Nulls in a blob column are named as the loader reads the column, never as Lance's
internal descriptor struct."""

from __future__ import annotations

import lance
import lance.blob
import pyarrow as pa
import pytest

import lanceloader as ll


def test_nulls_of_a_blob_column_read_as_files_name_the_offsets_type(tmp_path) -> None:
    uri = str(tmp_path / "clips.lance")
    table = pa.table(
        {"id": pa.array(range(4)), "clip": lance.blob.blob_array([b"abc", None, b"de", b"f"])}
    )
    lance.write_dataset(table, uri, data_storage_version="2.2")
    with pytest.raises(ll.ConversionError) as err:
        ll.Loader(uri, batch_size=4, blobs={"clip": "file"}, output="numpy")
    message = str(err.value)
    assert "column 'clip' (int64) has 1 null values" in message, message
    assert "struct<" not in message and "blob_uri" not in message, message
    assert "filter='clip IS NOT NULL'" in message
    kept = ll.Loader(uri, batch_size=4, blobs={"clip": "file"}, filter="clip IS NOT NULL")
    assert [b["clip"].tolist() for b in kept] == [[0, 2, 3]]  # the rows' offsets


def test_no_fill_is_offered_for_a_blob_column_read_as_files(tmp_path) -> None:
    """Its values are row offsets: fill_nulls={'clip': 0} would open row 0's blob for a row
    that has none. Neither the construction-time error nor a batch's offers a fill; the batch's
    refuses the nulls even when the construction-time scan did not run (a transform)."""
    uri = str(tmp_path / "clips.lance")
    table = pa.table(
        {"id": pa.array(range(4)), "clip": lance.blob.blob_array([b"abc", None, b"de", b"f"])}
    )
    lance.write_dataset(table, uri, data_storage_version="2.2")
    with pytest.raises(ll.ConversionError) as err:
        ll.Loader(uri, batch_size=4, blobs={"clip": "file"}, output="numpy")
    assert "fill_nulls={" not in str(err.value) and "output='arrow'" in str(err.value)
    loader = ll.Loader(
        uri, batch_size=4, blobs={"clip": "file"}, transform=lambda b: b, output="numpy"
    )  # a transform: no scan at construction
    with pytest.raises(ll.ConversionError) as err:
        next(iter(loader))
    assert "fill_nulls={" not in str(err.value) and "another row's blob" in str(err.value)
    arrow = ll.Loader(uri, batch_size=4, blobs={"clip": "file"}, output="arrow")
    batch = next(iter(arrow))
    assert batch.column("clip").to_pylist() == [0, None, 2, 3]
    assert ll.blob_files(batch, "clip", rows=arrow.source)[1] is None
