"""The ledger: the rows of (epoch, step, rank) computed from the order match what the loader
delivered, for every order, a filter and a split, a mix, a pack, and across N->M resumes."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lanceloader as ll
from lanceloader.cli import main
from lanceloader.demo import write_demo_dataset
from lanceloader.ordering.order import Order
from lanceloader.state.cursor import Cursor
from lanceloader.state.format import StreamSpec, order_settings
from lanceloader.state.history import History, Segment

ORDERS = {
    "sequential": {},
    "block": {"shuffle": True, "shuffle_block_size": 8, "shuffle_window": 3},
    "full": {"shuffle": True},
}


def lance_ids(uri: str) -> dict[int, tuple[int, int]]:
    """Lance's own answer: each row's ``id`` -> (row offset, ``_rowid``) at the latest version."""
    t = lance.dataset(uri).to_table(columns=["id", "_rowoffset", "_rowid"])
    return {
        i: (o, r)
        for i, o, r in zip(
            t["id"].to_pylist(), t["_rowoffset"].to_pylist(), t["_rowid"].to_pylist(), strict=True
        )
    }


def delivered(loaders: list[ll.Loader], epochs: int, record: dict, column: str = "id") -> None:
    """Run ``loaders`` (one per rank, lock-step) for ``epochs`` epochs from where they stand,
    recording each rank's batches by (epoch, step, rank); a resumed epoch continues the step
    count already in ``record``."""
    for _ in range(epochs):
        epoch = loaders[0].epoch
        first = 1 + max((s for e, s, _ in record if e == epoch), default=-1)
        iters = [iter(loader) for loader in loaders]
        for step in itertools.count(first):
            batches = [next(it, None) for it in iters]
            if batches[0] is None:
                assert all(b is None for b in batches)
                break
            for rank, batch in enumerate(batches):
                record[epoch, step, rank] = batch


def stop_after(loaders: list[ll.Loader], steps: int, record: dict) -> dict:
    """Deliver ``steps`` more steps (recorded) and return the state then."""
    epoch = loaders[0].epoch
    first = 1 + max((s for e, s, _ in record if e == epoch), default=-1)
    iters = [iter(loader) for loader in loaders]
    for step in range(first, first + steps):
        for rank, it in enumerate(iters):
            record[epoch, step, rank] = next(it)
    for it in iters:
        it.close()
    states = [loader.state_dict() for loader in loaders]
    assert all(s == states[0] for s in states)
    return states[0]


def ranks(uri: str, world: int, batch_size: int, **kw) -> list[ll.Loader]:
    return [
        ll.Loader(uri, batch_size, rank=r, world_size=world, num_workers=1, **kw)
        for r in range(world)
    ]


def assert_ledger_matches(
    ledger: ll.Ledger, record: dict, truth: dict[int, tuple[int, int]]
) -> None:
    """Every recorded batch's rows are the ledger's, row offsets and Lance row ids alike."""
    assert record
    for (epoch, step, rank), batch in record.items():
        rows = ledger.rows(epoch, step, rank)
        expect = [truth[i] for i in batch["id"].tolist()]
        got = list(zip(rows["row_offset"].to_pylist(), rows["row_id"].to_pylist(), strict=True))
        assert got == expect, (epoch, step, rank)


# --- the pure history ---------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(rows=st.integers(0, 60), data=st.data())
def test_history_matches_a_cursor_run_with_elastic_resumes(rows: int, data) -> None:
    """A run of cursors (ranks, batch size and drop_last changing at each resume) took exactly
    the samples the history of its states says, at every (epoch, step, rank) and global step.
    Catches: steps numbered from the resume instead of the epoch, a segment's plan started at
    the wrong sample, a global step counted over the wrong epochs."""
    order = order_settings(None, Order(rows))
    batchings = data.draw(
        st.lists(
            st.tuples(st.integers(1, 7), st.integers(1, 4), st.booleans()), min_size=1, max_size=4
        )
    )
    record: dict[tuple[int, int, int], list[int]] = {}
    steps_by_global: list[tuple[int, int]] = []
    resumed: list[dict] = []
    cursor, step = None, 0
    for k, (batch_size, world, drop_last) in enumerate(batchings):
        spec = StreamSpec(rows, order, batch_size, world, drop_last=drop_last)
        if cursor is not None:
            state = cursor.state_dict()
            resumed.append(state)
            cursor = Cursor(spec)
            cursor.load_state_dict(state, ("batch_size", "drop_last"))
        else:
            cursor = Cursor(spec)
        for _ in range(data.draw(st.integers(0, 12), label=f"steps of segment {k}")):
            if cursor.at_end:
                cursor.end_epoch()
                step = 0
                if cursor.at_end:  # an epoch without steps (drop_last)
                    break
            for rank in range(world):
                plan = StreamSpec(rows, order, batch_size, world, rank, drop_last).plan(
                    cursor.start
                )
                record[cursor.epoch, step, rank] = plan.batch_samples(cursor.done).tolist()
            steps_by_global.append((cursor.epoch, step))
            cursor.advance()
            step += 1
    assert cursor is not None
    history = History.of_states(cursor.state_dict(), resumed)
    for (epoch, s, rank), samples in record.items():
        assert history.batch_samples(epoch, s, rank).tolist() == samples
    for g, (epoch, s) in enumerate(steps_by_global):
        assert history.locate(g) == (epoch, s)
        assert history.global_step(epoch, s) == g


def test_a_state_alone_that_hides_a_change_of_batching_is_refused() -> None:
    """2 ranks x 4 took 5 steps (sample 40), then 3 ranks x 4 one more (sample 52): 52 is not a
    whole number of 12-sample steps, so the state alone cannot say which rows early steps read."""
    order = order_settings(None, Order(100))
    state = StreamSpec(100, order, 4, 3).state(epoch=0, sample=52)
    with pytest.raises(ValueError, match="resumed_from"):
        History.of_states(state)
    before = StreamSpec(100, order, 4, 2).state(epoch=0, sample=40)
    assert History.of_states(state, [before]).world_size(0, 4) == 2


def test_history_errors_name_the_step_and_the_ranks() -> None:
    history = History(10, (Segment(0, 0, 4, 2),))
    with pytest.raises(IndexError, match="epoch 0 has 2 steps"):
        history.batch_samples(0, 2)
    with pytest.raises(ValueError, match="ran on 2 rank"):
        history.batch_samples(0, 0, rank=2)
    with pytest.raises(ValueError, match="epoch must be a whole number"):
        history.batch_samples(-1, 0)


# --- what the loader delivered -----------------------------------------------------------


@pytest.mark.parametrize("order", ORDERS)
def test_ledger_is_what_every_order_delivered_with_filter_and_split(
    order: str, deleted_uri: str
) -> None:
    """Two ranks, two epochs, rows deleted from the dataset (offsets and ids differ from
    ``id``), a filter and a split: each batch's rows are the ledger's row offsets and ids."""
    kw = dict(
        columns=["id"],
        filter="label != 3",
        splits={"a": 0.7, "b": 0.3},
        split="a",
        seed=5,
        **ORDERS[order],
    )
    loaders = ranks(deleted_uri, 2, 16, **kw)
    record: dict = {}
    delivered(loaders, 2, record)
    assert_ledger_matches(ll.Ledger(loaders[0]), record, lance_ids(deleted_uri))


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    order=st.sampled_from(sorted(ORDERS)),
    seed=st.integers(0, 2**31),
    batch_size=st.integers(1, 70),
    world=st.integers(1, 4),
    data=st.data(),
)
def test_ledger_property_against_the_loader(
    small_uri: str, order: str, seed: int, batch_size: int, world: int, data
) -> None:
    """Any order, seed, batch size and world size: step s of epoch e on rank r is the batch the
    rank's loader delivered there."""
    rank = data.draw(st.integers(0, world - 1), label="rank")
    epoch = data.draw(st.integers(0, 3), label="epoch")
    loader = ll.Loader(
        small_uri,
        batch_size,
        columns=["id"],
        rank=rank,
        world_size=world,
        seed=seed,
        num_workers=1,
        **ORDERS[order],
    )
    step = data.draw(st.integers(0, len(loader) - 1), label="step")
    loader.set_epoch(epoch)
    batch = next(itertools.islice(iter(loader), step, None))
    rows = ll.Ledger(loader).rows(epoch, step, rank)
    assert rows["row_offset"].to_pylist() == batch["id"].tolist()
    assert rows["index"].to_pylist() == list(range(len(batch["id"])))


def test_ledger_across_two_to_three_to_one_rank_resumes(small_uri: str) -> None:
    """2 ranks mid-epoch -> 3 ranks (a new batch size) into the next epoch -> 1 rank: the ledger
    from the last loader and the states the run resumed from gives every step's rows, and so
    does the ledger from the last saved state alone with them."""
    kw = dict(columns=["id"], shuffle=True, shuffle_block_size=8, seed=3)
    record: dict = {}
    first = stop_after(ranks(small_uri, 2, 16, **kw), 9, record)  # sample 288
    three = ranks(small_uri, 3, 10, **kw)
    for loader in three:
        loader.load_state_dict(first, allow_changes=("batch_size",))
    with pytest.raises(ValueError, match="resumed_from"):  # 288 is no whole number of 3 x 10
        ll.Ledger(three[0])
    delivered(three, 1, record)  # rest of epoch 0
    second = stop_after(three, 5, record)  # into epoch 1
    one = ranks(small_uri, 1, 10, **kw)
    one[0].load_state_dict(second)
    delivered(one, 2, record)  # epochs 1 and 2
    truth = lance_ids(small_uri)
    assert_ledger_matches(ll.Ledger(one[0], resumed_from=[first, second]), record, truth)
    latest = ll.Ledger.from_state(one[0].state_dict(), resumed_from=[first, second])
    assert_ledger_matches(latest, record, truth)
    assert {latest.world_size(e, s) for e, s, _ in record} == {1, 2, 3}


def test_ledger_of_a_mix_names_each_rows_source_and_its_stream(tmp_path: Path) -> None:
    """A mix of a shuffled small source (repeated: its source epochs advance) and a
    block-shuffled filtered one: each delivered row's source and offset are the ledger's."""
    a = write_demo_dataset(tmp_path / "a.lance", rows=40, fragments=2)
    b = write_demo_dataset(tmp_path / "b.lance", rows=300, fragments=3)
    mix = ll.Mix(
        {
            "b": ll.Loader(
                b, columns=["id"], filter="label < 8", shuffle=True, shuffle_block_size=4
            ),
            "a": ll.Loader(a, columns=["id"], shuffle=True, seed=1),
        },
        weights={"a": 1, "b": 2},
        samples_per_epoch="all_exhausted",
        source_column="src",
    )
    loaders = [ll.Loader(mix, 12, rank=r, world_size=2, num_workers=1) for r in range(2)]
    record: dict = {}
    delivered(loaders, 2, record)
    ledger = ll.Ledger(loaders[0])
    truth = {"b": lance_ids(b), "a": lance_ids(a)}
    label = {"b": 0, "a": 1}
    source_epochs = set()
    for (epoch, step, rank), batch in record.items():
        rows = ledger.rows(epoch, step, rank)
        names = rows["source"].to_pylist()
        assert [label[n] for n in names] == batch["src"].tolist()
        expect = [truth[n][i] for n, i in zip(names, batch["id"].tolist(), strict=True)]
        got = list(zip(rows["row_offset"].to_pylist(), rows["row_id"].to_pylist(), strict=True))
        assert got == expect
        source_epochs |= {
            (n, e) for n, e in zip(names, rows["source_epoch"].to_pylist(), strict=True)
        }
        assert set(rows["uri"].to_pylist()) <= {
            mix.sources[0].source.uri,
            mix.sources[1].source.uri,
        }
    assert ("a", 2) in source_epochs  # the small source repeated, each time in a new order
    with pytest.raises(ValueError, match="Mix"):
        ll.Ledger.from_state(loaders[0].state_dict())


def token_dataset(path: Path, docs: int = 120) -> str:
    """Documents of 1-80 tokens; token j of document d is ``d * 1000 + j``."""
    lengths = np.random.default_rng(7).integers(1, 81, docs)
    tokens = [[d * 1000 + j for j in range(n)] for d, n in enumerate(lengths.tolist())]
    lance.write_dataset(
        pa.table({"tokens": pa.array(tokens, pa.list_(pa.int32()))}), path, max_rows_per_file=50
    )
    return str(path)


def test_ledger_of_packed_rows_gives_documents_and_token_ranges(tmp_path: Path) -> None:
    """Each delivered packed row's segments are the ledger's documents (offsets and Lance ids)
    and token ranges, long documents split included, under a shuffle."""
    uri = token_dataset(tmp_path / "tokens.lance")
    ds = lance.dataset(uri)
    ids = ds.to_table(columns=["_rowid"])["_rowid"].to_pylist()
    loader = ll.Loader(
        uri,
        3,
        columns=["tokens"],
        pack=ll.pack("tokens", 32, window=16),
        shuffle=True,
        seed=2,
        num_workers=1,
    )
    ledger = ll.Ledger(loader)
    for epoch in range(2):
        for step, batch in enumerate(loader):
            rows = ledger.rows(epoch, step).to_pylist()
            for tokens, segments, row in zip(
                batch["tokens"], batch["segment_ids"], rows, strict=True
            ):
                pieces = [tokens[segments == s] for s in range(1, segments.max() + 1)]
                assert row["document_offsets"] == [int(p[0]) // 1000 for p in pieces]
                assert row["token_starts"] == [int(p[0]) % 1000 for p in pieces]
                assert row["token_counts"] == [len(p) for p in pieces]
                assert row["document_ids"] == [ids[d] for d in row["document_offsets"]]
                assert row["row_offset"] is None and row["position"] is not None


# --- from a saved state, errors, the command line -----------------------------------------


def test_from_state_refuses_another_dataset_and_other_streams(
    small_uri: str, tmp_path: Path
) -> None:
    state = ll.Loader(small_uri, 10, shuffle=True).state_dict()
    other = write_demo_dataset(tmp_path / "other.lance", rows=1000, fragments=3)
    with pytest.raises(ll.StateMismatchError, match=r"identity|not the stream"):
        ll.Ledger.from_state(state, uri=other)
    loader = ll.Loader(small_uri, 10, shuffle=True, seed=1)
    with pytest.raises(ll.StateMismatchError, match="seed"):
        ll.Ledger(loader, resumed_from=[state])
    with pytest.raises(TypeError, match=r"\[state\]"):
        ll.Ledger(loader, resumed_from=state)
    with pytest.raises(IndexError, match="epoch 0 has 100 steps"):
        ll.Ledger(loader).rows(0, 100)


def test_cli_writes_the_manifest_of_a_step_range(small_uri: str, tmp_path: Path, capsys) -> None:
    """``lanceloader ledger`` writes the ledger's rows for global steps as JSON lines and as
    CSV; a step past the epoch's end is a one-line error with exit code 2."""
    loader = ll.Loader(
        small_uri, 64, columns=["id"], filter="id % 3 = 0", shuffle=True, world_size=2, rank=1
    )
    path = tmp_path / "loader.json"
    ll.save_state(path, loader.state_dict())
    expect = ll.Ledger(loader).manifest(range(2, 5))
    assert set(expect["epoch"].to_pylist()) == {0, 1}  # 3 steps an epoch: crosses epochs
    assert main(["ledger", str(path), "--steps", "2:5", "--out", str(tmp_path / "m.jsonl")]) == 0
    lines = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert lines == expect.to_pylist()
    assert (
        main(
            ["ledger", str(path), "--epoch", "1", "--steps", "2", "--rank", "0", "--format", "csv"]
        )
        == 0
    )
    out = capsys.readouterr().out.splitlines()
    assert out[0].split(",")[:6] == ["epoch", "step", "global_step", "rank", "index", "sample"]
    at = out[0].split(",").index("row_offset")
    offsets = [int(line.split(",")[at]) for line in out[1:]]
    assert offsets == ll.Ledger(loader).rows(1, 2, 0)["row_offset"].to_pylist()
    code = main(["ledger", str(path), "--epoch", "0", "--steps", "3"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("lanceloader ledger: error: epoch 0 has 3 steps"), err


def test_ledger_of_a_mix_after_a_weight_change(tmp_path: Path) -> None:
    """Weights changed at a resume: the new loader's ledger gives the rows of the steps after
    it (its sources continue with offsets), the old loader's those before; mixing the two
    histories is refused with that advice."""
    a = write_demo_dataset(tmp_path / "a.lance", rows=200, fragments=2)
    b = write_demo_dataset(tmp_path / "b.lance", rows=200, fragments=2)

    def mix_loader(weights: dict[str, int]) -> ll.Loader:
        mix = ll.Mix(
            {
                "a": ll.Loader(a, columns=["id"], shuffle=True),
                "b": ll.Loader(b, columns=["id"], shuffle=True, seed=4),
            },
            weights=weights,
            source_column="src",
        )
        return ll.Loader(mix, 10, num_workers=1)

    before: dict = {}
    old = mix_loader({"a": 1, "b": 2})
    state = stop_after([old], 4, before)
    new = mix_loader({"a": 1, "b": 1})
    new.load_state_dict(state, allow_changes=("weights",))
    after: dict = {}
    delivered([new], 1, after)
    after = {(e, s + 4, r): batch for (e, s, r), batch in after.items()}  # steps 4 on
    truth = {"a": lance_ids(a), "b": lance_ids(b)}
    for ledger, record in ((ll.Ledger(old), before), (ll.Ledger(new), after)):
        for (epoch, step, rank), batch in record.items():
            rows = ledger.rows(epoch, step, rank)
            names = rows["source"].to_pylist()
            assert [{"a": 0, "b": 1}[n] for n in names] == batch["src"].tolist()
            assert rows["row_offset"].to_pylist() == [
                truth[n][i][0] for n, i in zip(names, batch["id"].tolist(), strict=True)
            ]
    with pytest.raises(ll.StateMismatchError, match="weights changed at that resume"):
        ll.Ledger(new, resumed_from=[state])


def test_ledger_of_clips_names_each_clips_video_and_start(tmp_path: Path) -> None:
    """Clips as samples: each ledger row is the clip's media row (offset, id) and its first
    frame, equal to what the loader delivered (every-window and per-epoch random clips, also in
    a mix), and ``from_state`` rebuilds the clips from a state alone."""
    import lance.blob

    from mediagen import write_video

    datas = [
        write_video(tmp_path / f"v{i}.mp4", n, 12, (32, 48), gop=6).read_bytes()
        for i, n in enumerate([14, 9, 11])
    ]
    uri = str(tmp_path / "videos.lance")
    table = pa.table({"id": [0, 1, 2], "video": lance.blob.blob_array(datas)})
    lance.write_dataset(table, uri, data_storage_version="2.2")

    def delivered(loader: ll.Loader, epochs: int) -> list[list[tuple[int, int]]]:
        out = []
        for _ in range(epochs):
            for b in loader:
                out.append(list(zip(b["id"].tolist(), b["clip_start"].tolist(), strict=True)))
        return out

    for clips in (
        ll.video_clips(frames=2, stride=2, step=3),
        ll.video_clips(frames=2, per_video=2),
    ):
        loader = ll.Loader(uri, batch_size=3, shuffle=True, seed=4, clips=clips)
        got = delivered(loader, 2)
        ledger, rebuilt = ll.Ledger(loader), ll.Ledger.from_state(loader.state_dict())
        steps = ledger.steps_in_epoch(0)
        for led in (ledger, rebuilt):
            rows = [led.rows(e, s) for e in range(2) for s in range(steps)]
            assert [
                list(zip(r["row_offset"].to_pylist(), r["clip_start"].to_pylist(), strict=True))
                for r in rows
            ] == got

    video = ll.Loader(uri, batch_size=1, clips=ll.video_clips(frames=2, per_video=1))
    mix = ll.Loader(
        ll.Mix({"a": video, "b": video}, weights={"a": 1, "b": 1}), batch_size=4, seed=1
    )
    batch = next(iter(mix))
    rows = ll.Ledger(mix).rows(0, 0)
    assert rows["clip_start"].to_pylist() == batch["clip_start"].tolist()
    assert rows["row_offset"].to_pylist() == batch["id"].tolist()
