"""Many fragments (issue 44): a table grown by appends reads like the same rows in a few fragments.

The cache cuts its pieces from units (a fragment, or a run of consecutive small ones), a run of
rows that crosses fragments is one read, the construction-time null scan stops past
``NULL_SCAN_FRAGMENTS`` fragments (the batch holding a null still refuses it), and the dataset
identity is the hash it was, made when first read (a state, a cache key), not at construction.
"""

from __future__ import annotations

import hashlib
import json
import pickle

import lance
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lanceloader as ll
from lanceloader.batch.checks import ConversionError
from lanceloader.rows.cache.disk import SUFFIX
from lanceloader.rows.cache.pieces import fragment_key
from lanceloader.rows.dataset import dataset_identity
from lanceloader.rows.lance import nulls
from lanceloader.rows.lance.fragments import Fragments
from lanceloader.rows.lance.source import Source
from lanceloader.rows.lance.units import cache_units, unit_metadata
from lanceloader.rows.protocol import DatasetName
from lanceloader.state.format import fingerprint


def appended(path, fragments: int, rows: int, nulls_at: tuple[int, ...] = ()) -> str:
    """A table appended to ``fragments`` times, ``rows`` rows each (one fragment each); ``score``
    is null at ``nulls_at``."""
    n = fragments * rows
    ids = np.arange(n, dtype=np.int64)
    score = pa.array([None if i in nulls_at else float(i) for i in range(n)], pa.float32())
    table = pa.table({"id": ids, "label": ids % 7, "score": score})
    for i in range(fragments):
        lance.write_dataset(table.slice(i * rows, rows), path, mode="append" if i else "create")
    return str(path)


@pytest.fixture(scope="module")
def many_uri(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("many") / "many.lance"
    uri = appended(path, 120, 50)
    lance.dataset(uri).delete("id % 13 = 5")  # deletion files in many fragments
    return uri


counts_strategy = st.lists(st.integers(0, 40), max_size=30)


@settings(max_examples=200, deadline=None)
@given(counts=counts_strategy, piece_rows=st.integers(1, 100), cut=st.integers(0, 30))
def test_units_cover_the_fragments_in_order_and_appends_change_the_last_only(
    counts, piece_rows, cut
) -> None:
    units, starts = cache_units(np.array(counts, dtype=np.int64), piece_rows)
    covered = [i for u in units for i in range(u.first, u.stop)]
    assert covered == list(range(len(counts)))
    assert starts.tolist() == [0, *np.cumsum(counts)[[u.stop - 1 for u in units]].tolist()]
    for u in units:
        assert u.stop - u.first == 1 or sum(counts[u.first : u.stop]) <= piece_rows
    cut = min(cut, len(counts))
    prefix, _ = cache_units(np.array(counts[:cut], dtype=np.int64), piece_rows)
    assert [(u.first, u.stop) for u in prefix[:-1]] == [(u.first, u.stop) for u in units][
        : max(len(prefix) - 1, 0)
    ]


def test_a_unit_of_one_fragment_keeps_the_fragments_piece_names(tmp_path) -> None:
    uri = appended(tmp_path / "big.lance", 3, 2000)
    lance.dataset(uri).delete("id = 2100")
    ds = lance.dataset(uri)
    fragments = ds.get_fragments()
    metas = [f.metadata for f in fragments]
    units, _ = cache_units(np.array([f.count_rows() for f in fragments]), 1000)
    schema = ds.schema
    named = [unit_metadata(metas[u.first : u.stop]) for u in units]
    assert [fragment_key(m, ["id"], schema) for m in named] == [
        fragment_key(m, ["id"], schema) for m in metas
    ]


def test_a_runs_piece_name_changes_with_any_of_its_fragments(tmp_path) -> None:
    uri = appended(tmp_path / "small.lance", 6, 10)

    def keys() -> list[str]:
        ds = lance.dataset(uri)
        fragments = ds.get_fragments()
        metas = [f.metadata for f in fragments]
        units, _ = cache_units(np.array([f.count_rows() for f in fragments]), 30)
        named = [unit_metadata(metas[u.first : u.stop]) for u in units]
        return [fragment_key(m, ["id"], ds.schema) for m in named]

    before = keys()
    assert len(before) == 2
    lance.dataset(uri).delete("id = 45")  # in the second run
    after = keys()
    assert after[0] == before[0] and after[1] != before[1]


def test_a_cache_over_many_small_fragments_keeps_few_pieces_and_the_right_rows(
    many_uri, tmp_path
) -> None:
    cache = tmp_path / "cache"
    src = Source(many_uri, columns=["id", "label"], cache=str(cache))
    expected = lance.dataset(many_uri).to_table(columns=["id"]).column("id").to_numpy()
    rng = np.random.default_rng(0)
    blocks = rng.permutation(-(-src.num_rows // 64))
    order = np.concatenate([np.arange(b * 64, min(src.num_rows, b * 64 + 64)) for b in blocks])
    got = np.concatenate(
        [src.read(order[i : i + 700]).column("id").to_numpy() for i in range(0, len(order), 700)]
    )
    np.testing.assert_array_equal(got, expected[order])
    pieces = [p for p in cache.iterdir() if p.name.endswith(SUFFIX)]
    assert 1 <= len(pieces) <= 2, pieces  # one piece per fragment was 120
    again = Source(many_uri, columns=["id", "label"], cache=str(cache))
    np.testing.assert_array_equal(
        again.read(order[:900]).column("id").to_numpy(), expected[order[:900]]
    )
    assert again.read_rows(order[:900]).rows_cached == 900


@pytest.fixture(scope="module")
def many_source(many_uri) -> Source:
    return Source(many_uri, columns=["id", "label"])


@settings(max_examples=40, deadline=None)
@given(lo=st.integers(0, 5500), length=st.integers(1, 5000))
def test_runs_across_fragments_read_the_rows_lance_has(many_uri, many_source, lo, length) -> None:
    hi = min(lo + length, many_source.num_rows)
    lo = min(lo, hi - 1)
    positions = np.arange(lo, hi)
    expected = lance.dataset(many_uri).take(positions, columns=["id", "label"])
    assert many_source.read_table(positions).to_pydict() == expected.to_pydict()


def test_the_null_scan_stops_past_its_fragment_cap_and_the_batch_refuses(
    tmp_path, monkeypatch
) -> None:
    uri = appended(tmp_path / "nulls.lance", 5, 20, nulls_at=(47,))
    with pytest.raises(ConversionError, match="Lance row 47"):  # 5 fragments: scanned
        ll.Loader(uri, batch_size=16, columns=["score"], output="numpy")
    monkeypatch.setattr(nulls, "NULL_SCAN_FRAGMENTS", 4)
    loader = ll.Loader(uri, batch_size=16, columns=["score"], output="numpy")  # not scanned
    with pytest.raises(ConversionError) as info:
        list(loader)
    assert "its row 15 is position 47" in "\n".join(info.value.__notes__)


def old_identity(uri: str) -> str:
    """The dataset identity by the formula before issue 44, through Lance's ``DataFile.path``
    (what states saved by older releases carry)."""
    ds = lance.dataset(uri)
    parts: list = [ds.schema.to_string(show_schema_metadata=False)]
    for f in ds.get_fragments():
        m = f.metadata
        d = m.deletion_file
        parts.append(
            [
                m.id,
                m.physical_rows,
                [str(x.path) for x in m.files],
                None if d is None else [d.id, d.num_deleted_rows],
            ]
        )
    blob = json.dumps(parts, separators=(",", ":"), default=str).encode()
    return hashlib.blake2b(blob, digest_size=8).hexdigest()


def test_the_dataset_identity_is_the_hash_it_was(many_uri) -> None:
    before = old_identity(many_uri)
    ds = lance.dataset(many_uri)
    fragments = ds.get_fragments()
    assert dataset_identity(ds.schema, fragments) == before
    assert dataset_identity(ds.schema, [f.metadata for f in fragments]) == before
    assert Source(many_uri, columns=["id"]).identity == before


def test_construction_reads_no_fragment_metadata_and_the_state_has_the_identity(
    many_uri, tmp_path
) -> None:
    loader = ll.Loader(
        many_uri, batch_size=64, columns=["id"], shuffle=True, cache=str(tmp_path / "c")
    )
    src = loader.source
    assert src.dataset_name.__dict__["identity"] is None  # not made at construction
    assert all(m is None for m in src._fragments._metadata)  # no fragment's metadata read
    next(iter(loader))  # a read names the pieces it uses (their units' metadata read)
    assert src.dataset_name.__dict__["identity"] is None  # nor made by an epoch's start
    assert loader.state_dict()["dataset"] == old_identity(many_uri)
    made = DatasetName(src.uri, src.version, old_identity(many_uri))
    assert src.dataset_name == made and hash(src.dataset_name) == hash(made)
    assert src.cached.fragment_keys == [
        fragment_key(unit_metadata(metas), ["id"], src.schema_table().schema)
        for metas in (
            [f.metadata for f in lance.dataset(many_uri).get_fragments()[u.first : u.stop]]
            for u in src._units
        )
    ]


def test_the_identity_is_the_same_across_opens_and_changes_with_the_data(tmp_path) -> None:
    uri = appended(tmp_path / "grows.lance", 3, 10)
    first = Source(uri, ["id"]).identity
    assert Source(uri, ["id"]).identity == first == old_identity(uri)
    assert Source(lance.dataset(uri), ["id"]).identity == first
    unpickled = pickle.loads(pickle.dumps(Source(uri, ["id"])))  # made after reopening
    assert unpickled.identity == first
    seen = {first}
    table = pa.table({"id": np.arange(5), "label": np.arange(5), "score": np.ones(5, "f4")})
    lance.write_dataset(table, uri, mode="append")
    versions = [lance.dataset(uri).version]
    lance.dataset(uri).delete("id = 3")
    versions.append(lance.dataset(uri).version)
    lance.write_dataset(lance.dataset(uri).to_table(), uri, mode="overwrite")  # the same rows
    versions.append(lance.dataset(uri).version)
    for version in versions:
        identity = Source(uri, ["id"], version=version).identity
        assert identity == old_identity_at(uri, version) and identity not in seen
        seen.add(identity)


def old_identity_at(uri: str, version: int) -> str:
    """The identity of ``uri`` at ``version`` made at once (:func:`dataset_identity`)."""
    ds = lance.dataset(uri, version=version)
    return dataset_identity(ds.schema, ds.get_fragments())


def test_a_state_saved_before_issue_44_loads_and_another_datasets_is_refused(tmp_path) -> None:
    uri = appended(tmp_path / "a.lance", 4, 25)
    other = appended(tmp_path / "b.lance", 4, 25)  # the same rows, other files
    loader = ll.Loader(uri, batch_size=10, columns=["id"], shuffle=True, seed=5)
    it = iter(loader)
    seen = [next(it)["id"] for _ in range(3)]
    state = loader.state_dict()
    old = {**state, "dataset": old_identity(uri)}  # as the release before saved it
    old["fingerprint"] = fingerprint(old["dataset"], old["version"], old["order"])
    assert old == state
    fresh = ll.Loader(uri, batch_size=10, columns=["id"], shuffle=True, seed=5)
    fresh.load_state_dict(old)  # its identity made here, by the check
    rest = [b["id"] for b in fresh]
    whole = [b["id"] for b in ll.Loader(uri, batch_size=10, columns=["id"], shuffle=True, seed=5)]
    assert [x.tolist() for x in seen + rest] == [x.tolist() for x in whole]
    elsewhere = ll.Loader(other, batch_size=10, columns=["id"], shuffle=True, seed=5)
    with pytest.raises(ll.StateMismatchError, match="dataset identity"):
        elsewhere.load_state_dict(old)


def test_live_rows_from_the_manifest_are_lances_counts_after_deletions(many_uri) -> None:
    fragments = lance.dataset(many_uri).get_fragments()
    rows = Fragments(lance.dataset(many_uri)).live_rows()
    assert rows.tolist() == [f.count_rows() for f in fragments]
    assert rows.sum() < 120 * 50  # deletions counted
    assert Source(many_uri, ["id"]).num_rows == lance.dataset(many_uri).count_rows()
