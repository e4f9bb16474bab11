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
