"""Packing: no token lost or repeated, document boundaries right, exact resume, equal ranks."""

from __future__ import annotations

import json

import lance
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lanceloader as ll
from lanceloader.rows.packing import pack_plan, pack_tokens


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 40), max_size=120),
    seq_len=st.integers(1, 24),
    window=st.integers(1, 50),
    long=st.sampled_from(["split", "drop"]),
    algorithm=st.sampled_from(["best_fit", "first_fit"]),
)
def test_every_token_is_packed_once(lengths, seq_len, window, long, algorithm) -> None:
    lengths = np.array(lengths, dtype=np.int64)
    plan = pack_plan(lengths, seq_len, window, long, algorithm)
    covered = {d: np.zeros(n, np.int64) for d, n in enumerate(lengths.tolist())}
    for r in range(plan.num_rows):
        pieces = plan.row(r)
        assert pieces and sum(n for _, _, n in pieces) <= seq_len
        assert len({d // window for d, _, _ in pieces}) == 1  # a row packs one window
        for d, offset, n in pieces:
            assert n > 0
            covered[d][offset : offset + n] += 1
    for d, n in enumerate(lengths.tolist()):
        expect = 0 if long == "drop" and n > seq_len else 1
        assert np.all(covered[d] == expect), (d, n)
    dropped = lengths[lengths > seq_len] if long == "drop" else lengths[:0]
    assert (plan.dropped_documents, plan.dropped_tokens) == (len(dropped), int(dropped.sum()))
    assert plan.tokens == int(lengths.sum()) - plan.dropped_tokens


@given(lengths=st.lists(st.integers(1, 30), min_size=1, max_size=60), seq_len=st.integers(30, 64))
def test_rows_are_never_fewer_than_the_tokens_need_nor_worse_than_one_per_document(
    lengths, seq_len
) -> None:
    plan = pack_plan(np.array(lengths), seq_len, window=len(lengths))
    assert -(-sum(lengths) // seq_len) <= plan.num_rows <= len(lengths)


def test_pack_tokens_marks_documents() -> None:
    ids, seg, pos = pack_tokens(
        np.arange(20),
        np.array([0, 10, 4]),
        np.array([3, 2, 4]),
        np.array([2, 1]),
        seq_len=5,
        pad_id=-1,
    )
    assert ids.tolist() == [[0, 1, 2, 10, 11], [4, 5, 6, 7, -1]]
    assert seg.tolist() == [[1, 1, 1, 2, 2], [1, 1, 1, 1, 0]]
    assert pos.tolist() == [[0, 1, 2, 0, 1], [0, 1, 2, 3, 0]]


@pytest.fixture(scope="module")
def tokens_uri(tmp_path_factory) -> tuple[str, np.ndarray]:
    """600 documents of 1-150 tokens; token t of document d is d * 1000 + t."""
    lengths = np.random.default_rng(5).integers(1, 150, 600)
    docs = [list(range(d * 1000, d * 1000 + n)) for d, n in enumerate(lengths.tolist())]
    uri = str(tmp_path_factory.mktemp("pack") / "tokens.lance")
    lance.write_dataset(
        pa.table({"input_ids": pa.array(docs, pa.list_(pa.int32())), "id": np.arange(600)}),
        uri,
        max_rows_per_file=200,
    )
    return uri, lengths


def _documents(batches) -> dict[int, list[int]]:
    """Tokens regrouped by document: pieces are runs of one segment id; positions count within."""
    out: dict[int, list[int]] = {}
    for b in batches:
        for ids, seg, pos in zip(b["input_ids"], b["segment_ids"], b["position_ids"], strict=True):
            for s in np.unique(seg[seg > 0]):
                piece = ids[seg == s]
                assert pos[seg == s].tolist() == list(range(len(piece)))
                assert len({int(t) // 1000 for t in piece}) == 1  # one document per segment
                out.setdefault(int(piece[0]) // 1000, []).extend(piece.tolist())
            assert np.all(ids[seg == 0] == -1)
    return {d: sorted(t) for d, t in out.items()}


def _loader(uri, **kw) -> ll.Loader:
    return ll.Loader(
        uri, columns=["input_ids"], pack=ll.pack("input_ids", 128, window=64, pad_id=-1), **kw
    )


def test_packed_epoch_holds_every_document_once(tokens_uri) -> None:
    uri, lengths = tokens_uri
    loader = _loader(uri, batch_size=16, shuffle=True, seed=1)
    docs = _documents(loader)
    assert docs == {d: list(range(d * 1000, d * 1000 + n)) for d, n in enumerate(lengths)}
    stats = loader.stats()
    assert stats.padding_fraction == pytest.approx(loader.packing.padding_fraction)
    assert 0 < stats.padding_fraction < 0.05
    assert "are padding" in str(stats)


@settings(max_examples=12, deadline=None)
@given(
    cut=st.integers(1, 30),
    batch=st.integers(1, 8),
    before=st.integers(1, 3),
    after=st.integers(1, 3),
)
def test_packed_resume_continues_exactly(tokens_uri, cut, batch, before, after) -> None:
    uri, _ = tokens_uri
    whole = [
        b["input_ids"]
        for b in _loader(
            uri, batch_size=batch * before, shuffle=True, shuffle_block_size=4, num_workers=1
        )
    ]
    whole = np.concatenate(whole)
    ranks = [
        _loader(
            uri,
            batch_size=batch,
            shuffle=True,
            shuffle_block_size=4,
            num_workers=1,
            rank=r,
            world_size=before,
        )
        for r in range(before)
    ]
    assert len({len(r) for r in ranks}) == 1  # equal batch counts on every rank
    its = [iter(r) for r in ranks]
    got = []
    for _ in range(min(cut, len(ranks[0]) - 1)):
        got += [next(it)["input_ids"] for it in its]
    state = ranks[0].state_dict()
    assert len(json.dumps(state)) <= 2048
    for r in ranks:
        r.close()
    resumed = [
        _loader(
            uri,
            batch_size=batch,
            shuffle=True,
            shuffle_block_size=4,
            num_workers=1,
            rank=r,
            world_size=after,
        )
        for r in range(after)
    ]
    for r in resumed:
        r.load_state_dict(state)
    for group in zip(*[iter(r) for r in resumed], strict=True):
        got += [b["input_ids"] for b in group]
    got = np.concatenate(got)
    n = len(whole)
    # A last global batch smaller than the world wraps around (torch's DistributedSampler rule).
    assert np.array_equal(got[:n], whole) or (
        len(got) > n and np.array_equal(got[: n - 1], whole[: n - 1])
    )


def test_process_workers_and_drop_mode(tokens_uri) -> None:
    uri, lengths = tokens_uri
    threads = [b["input_ids"] for b in _loader(uri, batch_size=8, shuffle=True)]
    procs = [
        b["input_ids"]
        for b in _loader(uri, batch_size=8, shuffle=True, worker_type="process", num_workers=2)
    ]
    assert all(np.array_equal(a, b) for a, b in zip(threads, procs, strict=True))
    drop = ll.Loader(
        uri, columns=["input_ids"], pack=ll.pack("input_ids", 100, long_documents="drop")
    )
    assert drop.packing.dropped_documents == int((lengths > 100).sum())
    assert set(_documents_ids(drop)) == {d for d, n in enumerate(lengths) if n <= 100}


def _documents_ids(loader) -> set[int]:
    out = set()
    for b in loader:
        ids = b["input_ids"][b["segment_ids"] > 0]
        out |= {int(t) // 1000 for t in ids}
    return out


def test_bad_packing_is_named(tokens_uri) -> None:
    uri, _ = tokens_uri
    with pytest.raises(ValueError, match=r"columns=\['input_ids'\]"):
        ll.Loader(uri, pack=ll.pack("input_ids", 64))
    with pytest.raises(TypeError, match="list of token ids"):
        ll.Loader(uri, columns=["id"], pack=ll.pack("id", 64))
    with pytest.raises(ValueError, match="seq_len"):
        ll.pack("input_ids", 0)
    with pytest.raises(TypeError, match=r"ll\.pack"):
        ll.Loader(uri, pack={"column": "input_ids"})
    with pytest.raises(ValueError, match=r"pad_id=4900000000 does not fit .* int32"):
        ll.Loader(uri, columns=["input_ids"], pack=ll.pack("input_ids", 64, pad_id=70000**2))


def test_null_tokens_are_refused_with_their_documents(tmp_path) -> None:
    """A null token was packed as -9223372036854775808 with only a NumPy warning."""
    uri = tmp_path / "nulls.lance"
    lance.write_dataset(
        pa.table({"t": pa.array([[1, 2], [1, None, 3], None, [4]], pa.list_(pa.int64()))}), uri
    )
    with pytest.raises(ValueError, match=r"1 null tokens, in the documents at positions \[1\]"):
        ll.Loader(uri, pack=ll.pack("t", 4))


def test_packing_lengths_are_shared_through_the_cache_directory(
    tokens_uri, tmp_path, monkeypatch
) -> None:
    import lanceloader.rows.packed as packing

    uri, _ = tokens_uri
    cache = tmp_path / "cache"
    first = ll.Loader(uri, columns=["input_ids"], cache=cache, pack=ll.pack("input_ids", 128))
    assert len(list(cache.glob("lengths-*.npy"))) == 1

    def no_scan(*args):
        raise AssertionError("the lengths were read again instead of coming from the cache")

    monkeypatch.setattr(packing, "document_lengths", no_scan)
    again = ll.Loader(uri, columns=["input_ids"], cache=cache, pack=ll.pack("input_ids", 128))
    assert np.array_equal(first.packing.starts, again.packing.starts)
    assert np.array_equal(first.packing.doc, again.packing.doc)
