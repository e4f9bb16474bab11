from __future__ import annotations

import os
import pickle

import lance
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lanceloader.demo import demo_table
from lanceloader.rows.lance.source import Source


def ids(batch: pa.RecordBatch) -> list[int]:
    return batch.column("id").to_pylist()


@settings(
    max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None
)
@given(st.lists(st.integers(0, 999), max_size=300))
def test_read_returns_exactly_the_requested_rows_in_order(
    small_uri: str, positions: list[int]
) -> None:
    src = Source(small_uri, columns=["id", "x"])
    batch = src.read(np.array(positions, dtype=np.int64))
    assert ids(batch) == positions
    expected = lance.dataset(small_uri).take(positions, columns=["x"]) if positions else None
    if expected is not None:
        assert batch.column("x").to_pylist() == expected.column("x").to_pylist()


def test_long_runs_and_scattered_rows_mix(small_uri: str) -> None:
    src = Source(small_uri, columns=["id"])
    positions = np.concatenate([np.arange(900, 1000), [5, 3], np.arange(0, 400)[::-1], [999, 999]])
    assert ids(src.read(positions)) == positions.tolist()


def test_reads_match_lance_take_with_deletions(deleted_uri: str) -> None:
    src = Source(deleted_uri, columns=["id"])
    ds = lance.dataset(deleted_uri)
    assert src.num_rows == ds.count_rows()
    everything = np.arange(src.num_rows)
    assert (
        ids(src.read(everything))
        == ds.take(everything.tolist(), columns=["id"]).column("id").to_pylist()
    )
    assert all(i % 7 != 3 for i in ids(src.read(everything)))


def test_filter_is_applied_once_and_maps_positions(small_uri: str) -> None:
    src = Source(small_uri, columns=["id"], filter="id % 3 = 0")
    assert src.num_rows == 334
    assert ids(src.read(np.array([0, 1, 333]))) == [0, 3, 999]


def test_filter_with_deletions(deleted_uri: str) -> None:
    src = Source(deleted_uri, columns=["id"], filter="id >= 100")
    got = ids(src.read(np.arange(src.num_rows)))
    assert got == [i for i in range(100, 500) if i % 7 != 3]


def test_source_is_pinned_to_its_version(tmp_path) -> None:
    uri = str(tmp_path / "pinned.lance")
    lance.write_dataset(demo_table(100), uri)
    src = Source(uri, columns=["id"])
    lance.write_dataset(demo_table(50, start=100), uri, mode="append")
    assert src.num_rows == 100
    clone = pickle.loads(pickle.dumps(src))
    assert clone.num_rows == 100 and clone.dataset.version == src.version
    assert ids(clone.read(np.arange(100))) == list(range(100))
    lance.write_dataset(demo_table(10, start=1000), uri, mode="overwrite")
    assert ids(pickle.loads(pickle.dumps(src)).read(np.array([0, 99]))) == [0, 99]
    assert Source(uri, version=1).num_rows == 100


def test_pickles_as_plain_parameters(small_uri: str) -> None:
    src = Source(small_uri, columns=["id"], filter="id < 10")
    state = src.__getstate__()
    assert state["_ds"] is None and state["_fragments"] is None
    assert len(pickle.dumps(src)) < 10_000


def test_accepts_an_open_dataset(small_uri: str) -> None:
    ds = lance.dataset(small_uri)
    assert Source(ds).num_rows == 1000 and Source(ds).version == ds.version


def test_empty_read_has_the_projected_schema(small_uri: str) -> None:
    batch = Source(small_uri, columns=["label", "id"]).read(np.zeros(0, dtype=np.int64))
    assert batch.num_rows == 0 and batch.schema.names == ["label", "id"]


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"columns": ["id", "nope"]}, ValueError, r"unknown columns \['nope'\].*available columns"),
        ({"columns": "id"}, TypeError, r"use \['id'\]"),
        ({"columns": []}, ValueError, "columns is empty"),
        ({"filter": "nope > 3"}, ValueError, "filter 'nope > 3' is not a valid"),
        ({"filter": "id >"}, ValueError, "not a valid Lance SQL"),
        ({"version": 99}, ValueError, r"no version 99; available versions: \[1\]"),
        ({"splits": {"a": 0.5, "b": 0.5}}, ValueError, "needs split="),
        ({"split": "a"}, ValueError, "needs splits="),
        ({"splits": {"a": 0.5, "b": 0.4}, "split": "a"}, ValueError, "sum to 1"),
        ({"splits": {"a": 1.0}, "split": "b"}, ValueError, "not one of the splits"),
        ({"splits": {"a": 1.0}, "split": "a", "split_key": "zz"}, ValueError, "unknown split_key"),
    ],
)
def test_bad_inputs_name_the_problem(small_uri: str, kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        Source(small_uri, **kwargs)


def test_missing_dataset_names_the_path(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match=r"no Lance dataset at .*missing\.lance"):
        Source(str(tmp_path / "missing.lance"))


def test_splits_partition_rows_and_compose_with_filter(small_uri: str) -> None:
    fractions = {"train": 0.8, "val": 0.15, "test": 0.05}
    parts = {
        name: set(
            ids(
                Source(small_uri, columns=["id"], splits=fractions, split=name).read(
                    np.arange(Source(small_uri, splits=fractions, split=name).num_rows)
                )
            )
        )
        for name in fractions
    }
    assert set().union(*parts.values()) == set(range(1000))
    assert sum(len(p) for p in parts.values()) == 1000
    assert 700 < len(parts["train"]) < 900
    filtered = Source(small_uri, columns=["id"], filter="id < 500", splits=fractions, split="val")
    assert set(ids(filtered.read(np.arange(filtered.num_rows)))) == {
        i for i in parts["val"] if i < 500
    }


def test_split_by_key_column_follows_the_key(tmp_path) -> None:
    uri = str(tmp_path / "keys.lance")
    table = pa.table({"user": [f"u{i % 50}" for i in range(1000)], "id": list(range(1000))})
    lance.write_dataset(table, uri)
    src = Source(uri, splits={"train": 0.5, "val": 0.5}, split="val", split_key="user")
    users = set(src.read(np.arange(src.num_rows)).column("user").to_pylist())
    other = Source(uri, splits={"train": 0.5, "val": 0.5}, split="train", split_key="user")
    assert users.isdisjoint(set(other.read(np.arange(other.num_rows)).column("user").to_pylist()))


def test_a_column_named_twice_is_refused_as_such(small_uri: str) -> None:
    """columns=["id", "id"] raised a ReadError blaming a damaged data file."""
    with pytest.raises(ValueError, match=r"columns names \['id'\] more than once"):
        Source(small_uri, columns=["id", "id"])


def test_a_relative_path_and_an_absolute_one_are_one_dataset(
    small_uri: str, tmp_path, monkeypatch
) -> None:
    """A state saved with a relative path was refused from another working directory (as a
    moved dataset). Local paths are named absolute, symlinks resolved."""
    import lanceloader as ll

    link = tmp_path / "link.lance"
    link.symlink_to(small_uri)
    monkeypatch.chdir(os.path.dirname(small_uri))
    loader = ll.Loader(os.path.basename(small_uri), batch_size=10)
    next(iter(loader))
    state = loader.state_dict()
    assert state["uri"] == os.path.realpath(small_uri)
    monkeypatch.chdir(tmp_path)
    for uri in (small_uri, "link.lance"):
        other = ll.Loader(uri, batch_size=10)
        other.load_state_dict(state)
        assert other.state_dict() == state
    old = {**state, "uri": os.path.relpath(small_uri)}  # a state of a relative path, as before
    ll.Loader(small_uri, batch_size=10).load_state_dict(old)
