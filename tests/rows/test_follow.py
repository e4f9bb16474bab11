"""Following a growing table (``Loader(follow=True)``, ``rows/lance/follow.py``), on real Lance
tables appended, deleted from, compacted and overwritten in temp dirs, some by another process
while the loader runs.

Every row has a unique ``id`` (its value says which write made it), so each test counts what an
epoch delivered: no id twice in an epoch, and exactly the rows of the version it read.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections import Counter
from datetime import timedelta
from typing import Any

import lance
import numpy as np
import pyarrow as pa
import pytest
from test_follow_resume import Rank0

import lanceloader as ll
from lanceloader.rows.lance.follow import Following, change_between, fragment_names
from lanceloader.state.format import StateMismatchError


def write(uri: str, ids: range | list[int], mode: str = "create", **kwargs: Any) -> None:
    ids = list(ids)
    table = pa.table({"id": pa.array(ids, pa.int64()), "x": pa.array(ids, pa.float32())})
    lance.write_dataset(table, uri, mode=mode, **kwargs)


def epoch_ids(loader: ll.Loader) -> list[int]:
    return [i for b in loader for i in b["id"].tolist()]


def once(ids: list[int]) -> set[int]:
    """The ids of an epoch, each asserted delivered once."""
    twice = [i for i, n in Counter(ids).items() if n > 1]
    assert not twice, f"delivered twice in one epoch: {twice[:10]}"
    return set(ids)


APPEND = """
import sys, lance, pyarrow as pa
uri, first, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ids = list(range(first, first + count))
table = pa.table({"id": pa.array(ids, pa.int64()), "x": pa.array(ids, pa.float32())})
lance.write_dataset(table, uri, mode="append")
"""


def append_from_another_process(uri: str, first: int, count: int) -> None:
    subprocess.run([sys.executable, "-c", APPEND, uri, str(first), str(count)], check=True)


@pytest.mark.parametrize("worker_type", ["thread", "process"])
def test_rows_appended_mid_epoch_come_next_epoch_none_twice(tmp_path, worker_type: str) -> None:
    """10% new rows appended by another process mid-epoch: 0 repeats in either epoch, the
    running epoch stays on its version, every new row delivered by the end of the next."""
    uri = str(tmp_path / "t.lance")
    write(uri, range(200), max_rows_per_file=20)
    loader = ll.Loader(
        uri,
        batch_size=10,
        columns=["id"],
        shuffle=True,
        follow=True,
        num_workers=2,
        worker_type=worker_type,
    )
    delivered, it = [], iter(loader)
    for _ in range(5):
        delivered += next(it)["id"].tolist()
    append_from_another_process(uri, 1000, 20)
    delivered += [i for b in it for i in b["id"].tolist()]
    assert once(delivered) == set(range(200))
    assert once(epoch_ids(loader)) == set(range(200)) | set(range(1000, 1020))
    assert loader.state_dict()["order"]["follow"]["adoptions"][-1] == [1, 2, 220, "append"]


def test_a_pinned_loader_does_not_follow(tmp_path) -> None:
    uri = str(tmp_path / "t.lance")
    write(uri, range(20))
    loader = ll.Loader(uri, batch_size=8, columns=["id"], num_workers=1)
    write(uri, range(100, 104), mode="append")
    assert once(epoch_ids(loader)) == once(epoch_ids(loader)) == set(range(20))
    assert "follow" not in loader.state_dict()["order"]


def test_filter_applies_to_appended_rows(tmp_path) -> None:
    uri = str(tmp_path / "t.lance")
    write(uri, range(20))
    loader = ll.Loader(uri, batch_size=4, filter="id % 2 = 0", follow=True, num_workers=1)
    assert once(epoch_ids(loader)) == set(range(0, 20, 2))
    write(uri, range(20, 30), mode="append")
    assert once(epoch_ids(loader)) == set(range(0, 30, 2))


def test_cache_serves_no_old_rows_after_append_delete_and_compaction(tmp_path) -> None:
    """The cache names a piece by its fragment's files and deletions: an appended fragment, a
    fragment with rows deleted and a compacted one are read anew, never from old pieces."""
    uri = str(tmp_path / "t.lance")
    write(uri, range(60), max_rows_per_file=20)
    cache = str(tmp_path / "cache")
    loader = ll.Loader(uri, batch_size=7, shuffle=True, cache=cache, follow=True, num_workers=2)
    assert once(epoch_ids(loader)) == set(range(60))
    write(uri, range(100, 110), mode="append")
    assert once(epoch_ids(loader)) == set(range(60)) | set(range(100, 110))
    lance.dataset(uri).delete("id < 5 OR id = 105")
    expected = set(range(5, 60)) | set(range(100, 110)) - {105}
    assert once(epoch_ids(loader)) == expected
    lance.dataset(uri).optimize.compact_files(target_rows_per_fragment=1000)
    assert once(epoch_ids(loader)) == expected
    changes = [a[3] for a in loader.state_dict()["order"]["follow"]["adoptions"]]
    assert changes == ["start", "append", "rewrite", "rewrite"]


def test_a_row_deleted_mid_epoch_stays_in_that_epoch_then_is_gone(tmp_path) -> None:
    """An epoch reads its version as a snapshot: a delete during it changes the next epoch."""
    uri = str(tmp_path / "t.lance")
    write(uri, range(30), max_rows_per_file=10)
    loader = ll.Loader(uri, batch_size=5, shuffle=True, follow=True, num_workers=1)
    it = iter(loader)
    got = next(it)["id"].tolist()
    gone = next(i for i in range(30) if i not in got)
    lance.dataset(uri).delete(f"id = {gone}")
    assert once(got + [i for b in it for i in b["id"].tolist()]) == set(range(30))
    assert once(epoch_ids(loader)) == set(range(30)) - {gone}


def test_overwrite_is_a_new_plan_over_the_new_rows(tmp_path) -> None:
    uri = str(tmp_path / "t.lance")
    write(uri, range(20))
    loader = ll.Loader(uri, batch_size=6, follow=True, num_workers=1)
    epoch_ids(loader)
    write(uri, range(500, 512), mode="overwrite")
    assert once(epoch_ids(loader)) == set(range(500, 512))


def test_overwrite_with_other_column_types_is_refused(tmp_path) -> None:
    uri = str(tmp_path / "t.lance")
    write(uri, range(20))
    loader = ll.Loader(uri, batch_size=6, follow=True, num_workers=1)
    epoch_ids(loader)
    lance.write_dataset(pa.table({"id": ["a"], "x": [1.0]}), uri, mode="overwrite")
    with pytest.raises(ValueError, match=r"changed the columns read.*follow=False"):
        iter(loader)


def test_a_delete_under_splits_by_offset_is_refused_by_column_kept(tmp_path) -> None:
    """Splits keyed by row offset would move rows between splits after a delete: refused, with
    the fix (split_key), which keeps every row in its split."""
    uri = str(tmp_path / "t.lance")
    write(uri, range(100))
    splits = {"train": 0.8, "val": 0.2}
    by_offset = ll.Loader(uri, batch_size=10, splits=splits, split="val", follow=True)
    by_id = ll.Loader(uri, batch_size=10, splits=splits, split="val", split_key="id", follow=True)
    val = once(epoch_ids(by_id))
    epoch_ids(by_offset)
    lance.dataset(uri).delete("id = 0")
    with pytest.raises(ValueError, match=r"keyed by row offset.*split_key='id'"):
        iter(by_offset)
    assert once(epoch_ids(by_id)) == val - {0}


def test_change_between_tells_appends_from_rewrites(tmp_path) -> None:
    uri = str(tmp_path / "t.lance")
    write(uri, range(30), max_rows_per_file=10)

    def names() -> list[Any]:
        return fragment_names([f.metadata for f in lance.dataset(uri).get_fragments()])

    v1 = names()
    write(uri, range(30, 35), mode="append")
    v2 = names()
    lance.dataset(uri).delete("id = 12")
    v3 = names()
    lance.dataset(uri).optimize.compact_files(target_rows_per_fragment=100)
    v4 = names()
    assert change_between(v1, v1).kind == "same"
    assert change_between(v1, v2) == ll_change("append", "1 fragments of 5 rows appended")
    assert change_between(v2, v3) == ll_change("rewrite", "rows deleted in fragments [1] (1)")
    compacted = change_between(v3, v4)
    assert compacted.kind == "rewrite" and "fragments gone" in compacted.detail
    assert change_between(v2, v1).kind == "rewrite"  # fragments gone (a restore)


def ll_change(kind: str, detail: str) -> Any:
    from lanceloader.rows.lance.follow import Change

    return Change(kind, detail)


def test_resume_reads_the_state_version_not_the_newest(tmp_path) -> None:
    """A state taken mid-epoch resumes on its version even when newer ones exist, on other
    ranks and batch sizes, and adopts the newest at the next epoch's start only."""
    uri = str(tmp_path / "t.lance")
    write(uri, range(40), max_rows_per_file=10)
    run = ll.Loader(uri, batch_size=4, shuffle=True, follow=True, num_workers=1)
    it = iter(run)
    head = [next(it)["id"].tolist() for _ in range(3)]
    state = run.state_dict()
    write(uri, range(100, 110), mode="append")
    rest = [b["id"].tolist() for b in it]
    board = Rank0()
    ranks = [
        ll.Loader(uri, batch_size=2, shuffle=True, follow=board.member(r), rank=r, world_size=2)
        for r in range(2)
    ]
    for loader in ranks:
        loader.load_state_dict(state, allow_changes=("batch_size",))
    resumed = sorted(i for loader in ranks for i in epoch_ids(loader))
    assert sorted(i for b in rest for i in b) == resumed
    assert once([i for b in head for i in b] + resumed) == set(range(40))
    nxt = [i for loader in ranks for i in epoch_ids(loader)]
    assert once(nxt) == set(range(40)) | set(range(100, 110)) == once(epoch_ids(run))


def test_a_state_at_an_epoch_start_that_looked_keeps_its_version(tmp_path) -> None:
    """A state saved after an epoch's start looked for a newer version (iter() begun, no batch
    yet) resumes that epoch on the version it found, though a newer one came since."""
    uri = str(tmp_path / "t.lance")
    write(uri, range(12))
    run = ll.Loader(uri, batch_size=4, follow=True, num_workers=1)
    epoch_ids(run)
    iter(run).close()  # epoch 1 started: it looked, found nothing newer
    state = run.state_dict()
    assert state["order"]["follow"]["checked"] == 1
    write(uri, range(50, 54), mode="append")
    resumed = ll.Loader(uri, batch_size=4, follow=True, num_workers=1)
    resumed.load_state_dict(state)
    assert once(epoch_ids(resumed)) == set(range(12)) == once(epoch_ids(run))
    assert once(epoch_ids(resumed)) == set(range(12)) | set(range(50, 54))


def test_peek_at_an_epoch_start_shows_the_adopted_version(tmp_path) -> None:
    uri = str(tmp_path / "t.lance")
    write(uri, range(4))
    loader = ll.Loader(uri, batch_size=10, columns=["id"], follow=True, num_workers=1)
    epoch_ids(loader)
    write(uri, [7, 8], mode="append")
    assert loader.peek()["id"].tolist() == [0, 1, 2, 3, 7, 8] == epoch_ids(loader)


def test_a_cleaned_up_state_version_is_named_with_the_fix(tmp_path) -> None:
    uri = str(tmp_path / "t.lance")
    write(uri, range(20))
    run = ll.Loader(uri, batch_size=4, follow=True, num_workers=1)
    next(iter(run))
    state = run.state_dict()
    write(uri, range(20, 30), mode="append")
    lance.dataset(uri).cleanup_old_versions(older_than=timedelta(0), delete_unverified=True)
    with pytest.raises(StateMismatchError, match=r"reads version 1 .*cleanup_old_versions"):
        ll.Loader(uri, batch_size=4, follow=True).load_state_dict(state)


def test_pinned_and_followed_states_do_not_mix(tmp_path) -> None:
    uri = str(tmp_path / "t.lance")
    write(uri, range(20))
    pinned = ll.Loader(uri, batch_size=4, num_workers=1).state_dict()
    followed = ll.Loader(uri, batch_size=4, follow=True, num_workers=1).state_dict()
    with pytest.raises(StateMismatchError, match="order setting 'follow'"):
        ll.Loader(uri, batch_size=4, follow=True).load_state_dict(pinned)
    with pytest.raises(StateMismatchError, match="order setting 'follow'"):
        ll.Loader(uri, batch_size=4).load_state_dict(followed)


def test_an_edited_history_is_refused(tmp_path) -> None:
    with pytest.raises(StateMismatchError, match="edited or damaged"):
        Following.of_settings({"checked": 0, "adoptions": [[1, 1, 10, "append"]]})
    with pytest.raises(StateMismatchError, match="edited or damaged"):
        Following.of_settings({"checked": 3, "adoptions": [[0, 1, 10, "grow"]]})
    with pytest.raises(StateMismatchError, match="edited or damaged"):
        Following.of_settings([[0, 1, 10, "start"]])


def test_state_grows_a_few_bytes_per_adoption(tmp_path) -> None:
    """The target is at most 1 KB per adoption; each is one [epoch, version, rows, change]."""
    uri = str(tmp_path / "t.lance")
    write(uri, range(10))
    loader = ll.Loader(uri, batch_size=100, follow=True, num_workers=1)
    sizes = []
    for k in range(6):
        epoch_ids(loader)  # epoch k reads the version the append before it made
        sizes.append(len(json.dumps(loader.state_dict())))
        write(uri, range(100 + k, 101 + k), mode="append")
    growth = np.diff(sizes)
    assert len(loader.state_dict()["order"]["follow"]["adoptions"]) == 6
    assert growth.max() <= 40, growth  # 30-odd bytes, far below 1 KB


def test_following_is_refused_where_it_is_not_supported(tmp_path) -> None:
    uri = str(tmp_path / "t.lance")
    write(uri, range(20))
    followed = ll.Loader(uri, batch_size=4, follow=True)
    with pytest.raises(ValueError, match="mix of followed tables is not supported"):
        ll.Loader(ll.Mix({"a": followed, "b": ll.Loader(uri, batch_size=4)}), batch_size=4)
    with pytest.raises(ValueError, match=r"Loader.*follow"):
        ll.Loader(ll.Mix({"a": uri}), batch_size=4, follow=True)
    with pytest.raises(TypeError, match="follow must be True or False"):
        ll.Loader(uri, follow="yes")


def test_the_grain_adapter_refuses_a_followed_loader(tmp_path) -> None:
    grain = pytest.importorskip("lanceloader.grain")
    uri = str(tmp_path / "t.lance")
    write(uri, range(20))
    with pytest.raises(ValueError, match=r"grain IterDataset.*follow=False"):
        grain.IterDataset(uri, batch_size=4, follow=True)


def test_a_recreated_table_is_refused_though_its_version_number_matches(tmp_path) -> None:
    """The state's identity is checked as for a pinned loader: a table re-created at the same
    path with the same version number is other data."""
    uri = str(tmp_path / "t.lance")
    write(uri, range(20))
    run = ll.Loader(uri, batch_size=4, follow=True, num_workers=1)
    next(iter(run))
    state = run.state_dict()
    shutil.rmtree(uri)
    write(uri, range(300, 320))
    with pytest.raises(StateMismatchError, match="dataset identity"):
        ll.Loader(uri, batch_size=4, follow=True).load_state_dict(state)


def test_ranks_agree_on_a_version_appended_between_their_looks(tmp_path) -> None:
    """An append lands after rank 0 built its Loader and before rank 1 did, then again between
    their epoch starts: with an agreement both read rank 0's version, so the epoch's rows are
    dealt out once; without one, several ranks are refused with the fix."""
    uri = str(tmp_path / "t.lance")
    write(uri, range(30))
    board = Rank0()

    def rank(r: int) -> ll.Loader:
        agree = board.member(r)
        return ll.Loader(uri, batch_size=4, follow=agree, rank=r, world_size=2, num_workers=1)

    first = rank(0)
    write(uri, range(100, 110), mode="append")
    ranks = [first, rank(1)]
    assert once([i for r in ranks for i in epoch_ids(r)]) == set(range(30))
    its = [iter(ranks[0])]
    write(uri, range(200, 210), mode="append")
    its.append(iter(ranks[1]))
    got = [i for it in its for b in it for i in b["id"].tolist()]
    assert once(got) == set(range(30)) | set(range(100, 110))
    with pytest.raises(ValueError, match=r"follow=True on 2 ranks.*torch.distributed"):
        ll.Loader(uri, batch_size=4, follow=True, rank=0, world_size=2)


def test_peek_on_several_ranks_waits_for_the_epoch_start(tmp_path) -> None:
    uri = str(tmp_path / "t.lance")
    write(uri, range(8))
    loader = ll.Loader(uri, batch_size=2, follow=Rank0().member(0), rank=0, world_size=2)
    assert loader.peek()["id"].tolist() == [0, 1]  # epoch 0: the version agreed at construction
    epoch_ids(loader)
    with pytest.raises(ValueError, match=r"peek\(\) at the start of epoch 1.*after iter\(\)"):
        loader.peek()


def test_a_history_over_epochs_of_several_versions_is_refused(tmp_path) -> None:
    """``History`` (the ledger's steps) assumes one version's epochs: a followed run that
    adopted another is refused rather than mapped onto the wrong samples or rows."""
    from lanceloader.state.history import History

    uri = str(tmp_path / "t.lance")
    write(uri, range(8))
    loader = ll.Loader(uri, batch_size=4, follow=True, num_workers=1)
    epoch_ids(loader)
    assert History.of_states(loader.state_dict()).num_samples == 8
    write(uri, range(8, 12), mode="append")
    epoch_ids(loader)
    with pytest.raises(ValueError, match=r"read versions \[1, 2\]"):
        History.of_states(loader.state_dict())


def test_set_epoch_back_reads_the_version_that_epoch_read(tmp_path) -> None:
    uri = str(tmp_path / "t.lance")
    write(uri, range(12))
    loader = ll.Loader(uri, batch_size=5, shuffle=True, follow=True, num_workers=1)
    first = epoch_ids(loader)
    write(uri, range(50, 55), mode="append")
    assert once(epoch_ids(loader)) == set(range(12)) | set(range(50, 55))
    loader.set_epoch(0)
    assert epoch_ids(loader) == first
    assert once(epoch_ids(loader)) == set(range(12)) | set(range(50, 55))  # epoch 1 again


def test_follow_on_an_object_store(s3) -> None:
    """On S3 (a real server): an append is adopted at the next epoch's start, the state
    resumes on its version, and the automatic cache (an object store's) serves no old rows."""
    ids = list(range(40))
    table = pa.table({"id": pa.array(ids, pa.int64()), "x": pa.array(ids, pa.float32())})
    uri = s3.write(table, max_rows_per_file=10)
    options = s3.storage_options

    def loader() -> ll.Loader:
        return ll.Loader(
            uri, batch_size=8, shuffle=True, follow=True, storage_options=options, num_workers=2
        )

    run = loader()
    assert once(epoch_ids(run)) == set(range(40))
    more = pa.table({"id": pa.array(range(90, 95), pa.int64()), "x": pa.array([0.0] * 5)})
    lance.write_dataset(more.cast(table.schema), uri, mode="append", storage_options=options)
    it = iter(run)
    head = next(it)["id"].tolist()
    state = run.state_dict()
    lance.dataset(uri, storage_options=options).delete("id < 3")
    resumed = loader()
    resumed.load_state_dict(state)
    assert once(head + epoch_ids(resumed)) == set(range(40)) | set(range(90, 95))
    assert once(epoch_ids(resumed)) == set(range(3, 40)) | set(range(90, 95))


def test_the_torch_iterable_dataset_refuses_a_followed_loader(tmp_path) -> None:
    torch_adapter = pytest.importorskip("lanceloader.torch")
    uri = str(tmp_path / "t.lance")
    write(uri, range(20))
    with pytest.raises(ValueError, match=r"IterableDataset.*follow=False"):
        torch_adapter.IterableDataset(uri, batch_size=4, follow=True)


def test_columns_added_keep_every_row_at_its_offset_and_in_its_split(tmp_path) -> None:
    """``add_columns`` writes data files beside each fragment's: not an append, but every row
    keeps its offset, so splits keyed by offset are kept (not refused as a delete is)."""
    uri = str(tmp_path / "t.lance")
    write(uri, range(50), max_rows_per_file=10)
    splits = {"train": 0.7, "val": 0.3}
    loader = ll.Loader(uri, batch_size=8, columns=["id"], splits=splits, split="val", follow=True)
    val = once(epoch_ids(loader))
    before = [f.metadata for f in lance.dataset(uri).get_fragments()]
    lance.dataset(uri).add_columns({"y": "id * 2"})
    after = [f.metadata for f in lance.dataset(uri).get_fragments()]
    assert change_between(fragment_names(before), fragment_names(after)).kind == "columns"
    assert once(epoch_ids(loader)) == val
    assert loader.state_dict()["order"]["follow"]["adoptions"][-1][3] == "columns"


def test_a_ledger_of_a_followed_state_names_its_rows(tmp_path) -> None:
    uri = str(tmp_path / "t.lance")
    write(uri, range(20))
    loader = ll.Loader(uri, batch_size=4, columns=["id"], shuffle=True, follow=True)
    first = next(iter(loader))["id"].tolist()
    ledger = ll.Ledger.from_state(loader.state_dict())
    assert ledger.rows(epoch=0, step=0)["row_offset"].to_pylist() == first


def test_version_given_is_the_first_epochs_then_the_newest(tmp_path) -> None:
    uri = str(tmp_path / "t.lance")
    write(uri, range(10))
    write(uri, range(10, 15), mode="append")
    loader = ll.Loader(uri, batch_size=4, version=1, follow=True, num_workers=1)
    assert once(epoch_ids(loader)) == set(range(10))
    assert once(epoch_ids(loader)) == set(range(15))


def test_peek_at_an_epochs_end_shows_the_next_epochs_version(tmp_path) -> None:
    """After an epoch's last batch (no StopIteration yet), peek() shows the next epoch's first
    batch as that epoch will read it: the newest version, adopted only when it starts."""
    uri = str(tmp_path / "t.lance")
    write(uri, range(4))
    loader = ll.Loader(uri, batch_size=10, columns=["id"], follow=True, num_workers=1)
    it = iter(loader)
    next(it)  # the epoch's only batch: the loader stands at its end
    write(uri, [7, 8], mode="append")
    assert loader.peek()["id"].tolist() == [0, 1, 2, 3, 7, 8]
    assert loader.state_dict()["order"]["follow"]["checked"] == 0  # nothing adopted by peek
    assert next(it, None) is None and epoch_ids(loader) == [0, 1, 2, 3, 7, 8]


def test_a_tf_dataset_of_a_followed_loader_grows_with_it(tmp_path) -> None:
    """``as_tf_dataset`` asserts no fixed cardinality on a followed loader: each iteration is an
    epoch, and an epoch after an append is longer."""
    pytest.importorskip("tensorflow")
    uri = str(tmp_path / "t.lance")
    write(uri, range(8))
    loader = ll.Loader(uri, batch_size=4, columns=["id"], follow=True, num_workers=1)
    dataset = ll.as_tf_dataset(loader)
    assert sorted(i for b in dataset for i in b["id"].numpy().tolist()) == list(range(8))
    write(uri, range(8, 12), mode="append")
    assert sorted(i for b in dataset for i in b["id"].numpy().tolist()) == list(range(12))


def test_a_followed_source_given_as_rows_to_several_ranks_needs_an_agreement(tmp_path) -> None:
    uri = str(tmp_path / "t.lance")
    write(uri, range(8))
    with pytest.raises(ValueError, match=r"Source\(follow=True\) given to a Loader of 2 ranks"):
        ll.Loader(ll.Source(uri, follow=True), batch_size=2, rank=0, world_size=2)
    agreed = ll.Source(uri, follow=Rank0().member(0))
    assert len(ll.Loader(agreed, batch_size=2, rank=0, world_size=2)) == 2
