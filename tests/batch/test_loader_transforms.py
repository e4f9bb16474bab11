"""Transforms and conversion options through the Loader: error policy, composition, placement."""

from __future__ import annotations

import lance
import numpy as np
import pyarrow as pa
import pytest
import torch

import lanceloader as ll


def fail_on_sevens(row: dict) -> dict:
    if row["id"] % 7 == 0:
        raise ValueError(f"corrupt row {row['id']}")
    return {"id": row["id"]}


def test_skip_policy_drops_bad_rows_counts_them_and_keeps_batch_counts(small_uri: str) -> None:
    loaders = [
        ll.Loader(
            small_uri,
            batch_size=50,
            columns=["id"],
            rank=r,
            world_size=2,
            transform=ll.map_rows(fail_on_sevens),
            on_error="skip",
        )
        for r in range(2)
    ]
    per_rank = [list(loader) for loader in loaders]
    assert len(per_rank[0]) == len(per_rank[1]) == len(loaders[0])
    ids = sorted(int(i) for batches in per_rank for b in batches for i in b["id"])
    assert ids == [i for i in range(1000) if i % 7]
    skipped = sum(loader.stats().rows_skipped for loader in loaders)
    assert skipped == len([i for i in range(1000) if i % 7 == 0])
    s = loaders[0].stats()
    assert s.rows_read == s.rows + s.rows_skipped


def test_raise_policy_names_the_batch_and_the_row(small_uri: str) -> None:
    loader = ll.Loader(
        small_uri, batch_size=50, columns=["id"], transform=ll.map_rows(fail_on_sevens)
    )
    with pytest.raises(ValueError, match="corrupt row 0") as info:
        list(loader)
    notes = "\n".join(info.value.__notes__)
    assert "batch 0 of epoch 0" in notes and "row 0" in notes


def test_skip_budget_stops_a_broken_pipeline(small_uri: str) -> None:
    def always_fails(row: dict) -> dict:
        raise KeyError("broken")

    loader = ll.Loader(
        small_uri,
        batch_size=50,
        columns=["id"],
        transform=ll.map_rows(always_fails),
        on_error="skip",
        max_skip_fraction=0.2,
    )
    with pytest.raises(ll.TooManyRowErrors, match="over the skip budget"):
        list(loader)


def test_a_list_of_transforms_is_applied_in_order(small_uri: str) -> None:
    add = ll.map_rows(lambda row: {"id": row["id"] + 1})
    double = ll.map_rows(lambda row: {"id": row["id"] * 2})
    batch = next(iter(ll.Loader(small_uri, batch_size=3, columns=["id"], transform=[add, double])))
    assert batch["id"].tolist() == [2, 4, 6]


def test_conversion_options_reach_the_workers(tmp_path) -> None:
    uri = str(tmp_path / "nulls.lance")
    lance.write_dataset(
        pa.table(
            {
                "score": pa.array([1.0, None, 3.0, None]),
                "tags": pa.array([[1], [2, 3], [], [4, 5, 6]]),
            }
        ),
        uri,
    )
    conv = ll.Conversion(output="numpy", fill_nulls={"score": -1.0}, pad_value=-9)
    batch = next(iter(ll.Loader(uri, batch_size=4, output=conv)))
    assert batch["score"].tolist() == [1.0, -1.0, 3.0, -1.0]
    assert batch["tags"].tolist() == [[1, -9, -9], [2, 3, -9], [-9, -9, -9], [4, 5, 6]]
    assert batch["tags_lengths"].tolist() == [1, 2, 0, 3]
    with pytest.raises(ll.ConversionError, match=r"column 'score'.*null"):
        list(ll.Loader(uri, batch_size=4))


def test_pin_memory_without_cuda_warns_once_and_still_delivers(small_uri: str) -> None:
    with pytest.warns(RuntimeWarning, match="pin_memory=True has no effect without CUDA"):
        loader = ll.Loader(small_uri, batch_size=10, columns=["x"], output="torch", pin_memory=True)
    batch = next(iter(loader))
    assert isinstance(batch["x"], torch.Tensor) and not batch["x"].is_pinned()
    cpu = next(
        iter(ll.Loader(small_uri, batch_size=10, columns=["x"], output="torch", device="cpu"))
    )
    assert cpu["x"].device.type == "cpu"
    np.testing.assert_array_equal(cpu["x"].numpy(), batch["x"].numpy())


def test_nested_list_columns_reach_the_loop_as_python_lists(tmp_path) -> None:
    uri = str(tmp_path / "nested.lance")
    words = [["w", str(i)] if i % 3 else [] for i in range(10)]
    lance.write_dataset(pa.table({"id": pa.array(range(10)), "words": pa.array(words)}), uri)
    loader = ll.Loader(uri, batch_size=4, output="torch", rows_per_read=8)  # reads cut in batches
    batches = list(loader)
    assert [b["words"] for b in batches] == [words[0:4], words[4:8], words[8:10]]
    assert torch.cat([b["id"] for b in batches]).tolist() == list(range(10))
