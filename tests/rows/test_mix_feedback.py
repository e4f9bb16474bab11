"""Feedback and schedules on real loaders: set_weights during an epoch lands at its step whatever
the loader read ahead (thread and process workers), a state carries the calls to any world
size, stats() shows what each source delivered per piece within ±1 of the promise, and bad
calls name the problem and the fix."""

from __future__ import annotations

import lance
import numpy as np
import pyarrow as pa
import pytest

import lanceloader as ll

BATCH = 4


@pytest.fixture(scope="module")
def uris(tmp_path_factory) -> dict[str, str]:
    """Three datasets whose ids say where they come from: 1000 + row, 2000 + row, 3000 + row."""
    root = tmp_path_factory.mktemp("feedback")
    out = {}
    for base, (name, rows) in enumerate([("a", 30), ("b", 50), ("c", 70)], start=1):
        out[name] = str(root / f"{name}.lance")
        lance.write_dataset(pa.table({"id": np.arange(rows) + 1000 * base}), out[name])
    return out


def mix(uris, weights=None) -> ll.Mix:
    sources = {n: ll.Loader(u, shuffle=True, seed=k) for k, (n, u) in enumerate(uris.items())}
    return ll.Mix(sources, weights=weights or {"a": 1, "b": 1, "c": 1}, samples_per_epoch=60)


CALLS = [  # (made after this many steps, for this step, weights)
    (2, 2, {"a": 1, "b": 0, "c": 0}),
    (3, 5, {"a": 0, "b": 1, "c": 0}),
    (6, 30, {"a": 0, "b": 0, "c": 1}),  # in the next epoch
    (8, 9, {"a": 1, "b": 3, "c": 0}),
]


def ids_per_step(loader: ll.Loader, steps: int, calls=()) -> list[list[int]]:
    """``steps`` steps of ``loader`` (across epochs), making ``calls`` as the loop reaches them."""
    out: list[list[int]] = []
    pending = sorted(calls, key=lambda c: c[0])
    while len(out) < steps:
        for batch in loader:
            out.append(batch["id"].tolist())
            while pending and pending[0][0] == len(out):
                _, step, weights = pending.pop(0)
                loader.set_weights(weights, step=step)
            if len(out) == steps:
                break
    loader.close()
    return out


@pytest.mark.parametrize("worker_type", ["thread", "process"])
def test_calls_during_an_epoch_land_at_their_step(uris, worker_type) -> None:
    """The stream with calls made as the loop goes equals the stream with the same calls made
    before it began (nothing read ahead), and each call's weights start at its step."""
    workers = {"num_workers": 2, "worker_type": worker_type}
    during = ids_per_step(ll.Loader(mix(uris), BATCH, **workers), 36, CALLS)
    upfront = ll.Loader(mix(uris), BATCH, num_workers=1)
    for _, step, weights in CALLS:
        upfront.set_weights(weights, step=step)
    assert during == ids_per_step(upfront, 36)
    source = [[i // 1000 for i in batch] for batch in during]
    assert source[1] != [1] * BATCH and source[2:5] == [[1] * BATCH] * 3
    assert source[5:9] == [[2] * BATCH] * 4 and source[30:] == [[3] * BATCH] * 6
    assert (
        sorted(i for batch in source[9:15] for i in batch) == [1] * 6 + [2] * 18
    )  # 1:3 from step 9, ±1 a step


def test_a_state_carries_the_calls_to_another_world_size(uris) -> None:
    """Calls before a checkpoint, one still pending: 2 ranks, then 3 ranks from the state, give
    each source's own stream once (0 repeats, 0 drops) and the pending call at its step."""
    ranks = [ll.Loader(mix(uris), 2, rank=r, world_size=2, num_workers=1) for r in range(2)]
    for loader in ranks:
        loader.set_weights({"a": 1, "b": 0, "c": 1}, step=1)
        loader.set_weights({"a": 0, "b": 1, "c": 0}, step=7)  # pending at the checkpoint
    its = [iter(loader) for loader in ranks]
    first = [[next(it)["id"].tolist() for it in its] for _ in range(4)]
    states = [loader.state_dict() for loader in ranks]
    assert states[0] == states[1] and states[0]["order"]["mix"]["feedback"]
    after = [ll.Loader(mix(uris), 2, rank=r, world_size=3, num_workers=1) for r in range(3)]
    for loader in after:
        loader.load_state_dict(states[0])
        assert loader.step == 4
    its = [iter(loader) for loader in after]
    rest = [[next(it)["id"].tolist() for it in its] for _ in range(5)]
    steps = [
        [i for batch in group for i in batch] for group in first + rest
    ]  # global batches: 4, 4, 4, 4, 6, ...
    assert [len(s) for s in steps] == [4] * 4 + [6] * 5
    assert {i // 1000 for s in steps[1:4] for i in s} == {1, 3}
    assert {i // 1000 for s in steps[7:] for i in s} == {2}
    alone = {n: ll.Loader(u, 100, shuffle=True, seed=k) for k, (n, u) in enumerate(uris.items())}
    for k, (name, loader) in enumerate(alone.items(), start=1):
        own = [i for s in steps for i in s if i // 1000 == k]
        expected = [i for b in loader for i in b["id"].tolist()]
        assert own == expected[: len(own)], f"source {name}: repeats, drops or another order"


def test_stats_show_each_sources_rows_per_piece_within_one_of_the_promise(uris) -> None:
    schedule = ll.Schedule({0: {"a": 1, "b": 1, "c": 1}, 3: {"a": 1, "b": 2, "c": 5}}, {3: 2})
    loader = ll.Loader(mix(uris, schedule), BATCH, num_workers=1)
    loader.set_weights({"a": 0, "b": 1, "c": 1}, step=9)
    ids_per_step(loader, 12)
    shares = loader.stats().mix
    assert [s.step for s in shares] == [0, 3, 4, 9]
    assert sum(sum(s.rows.values()) for s in shares) == 12 * BATCH
    for share in shares:
        for name, rows in share.rows.items():
            assert abs(rows - share.promised[name]) < 1, (share, name)
    assert shares[-1].weights == {"a": 0.0, "b": 0.5, "c": 0.5}
    assert "mix from step 9" in str(loader.stats())


def test_bad_calls_name_the_problem_and_the_fix(uris) -> None:
    loader = ll.Loader(mix(uris), BATCH, num_workers=1)
    ids_per_step(loader, 3)
    with pytest.raises(ValueError, match=r"step in the past.*step=3 or later"):
        loader.set_weights({"a": 1, "b": 1, "c": 1}, step=2)
    with pytest.raises(ValueError, match="one weight per source"):
        loader.set_weights({"a": 1, "web": 1}, step=5)
    with pytest.raises(ValueError, match="finite number >= 0"):
        loader.set_weights({"a": -1, "b": 1, "c": 1}, step=5)
    with pytest.raises(ValueError, match="must not all be 0"):
        loader.set_weights({"a": 0, "b": 0, "c": 0}, step=5)
    plain = ll.Loader(uris["a"], BATCH)
    with pytest.raises(ValueError, match="not a mix"):
        plain.set_weights({"a": 1})
    with pytest.raises(ValueError, match=r"reads no ll\.Mix"):
        _ = plain.step
    with pytest.raises(ValueError, match=r"stage at step 4.*one weight per source"):
        mix(uris, ll.Schedule({0: {"a": 1, "b": 1, "c": 1}, 4: {"a": 1}}))


def test_a_state_of_other_weights_needs_allow_changes(uris) -> None:
    schedule = ll.Schedule({0: {"a": 1, "b": 1, "c": 1}, 5: {"a": 0, "b": 0, "c": 1}})
    loader = ll.Loader(mix(uris, schedule), BATCH, num_workers=1)
    ids_per_step(loader, 2)
    state = loader.state_dict()
    other = ll.Loader(mix(uris), BATCH, num_workers=1)
    with pytest.raises(ll.StateMismatchError, match=r"allow_changes=\('weights',\)"):
        other.load_state_dict(state)
    other.load_state_dict(state, allow_changes=("weights",))
    got = ids_per_step(other, 6)
    assert {i // 1000 for s in got[3:] for i in s} == {1, 2, 3}  # the new schedule: no stage 5


def test_the_ledger_names_each_rows_source_and_its_weight(uris) -> None:
    schedule = ll.Schedule({0: {"a": 1, "b": 1, "c": 2}, 4: {"a": 0, "b": 1, "c": 1}}, {4: 2})
    loader = ll.Loader(mix(uris, schedule), BATCH, num_workers=1)
    loader.set_weights({"a": 1, "b": 0, "c": 0}, step=17)  # in epoch 1 (15 steps an epoch)
    got = ids_per_step(loader, 20)
    ledger = ll.Ledger(loader)
    expected = {  # a ramp of 2 steps: half-way at step 4, there at step 5
        0: {"a": 0.25, "b": 0.25, "c": 0.5},
        4: {"a": 0.125, "b": 0.375, "c": 0.5},
        5: {"a": 0.0, "b": 0.5, "c": 0.5},
        17: {"a": 1.0, "b": 0.0, "c": 0.0},
    }
    for step, batch in enumerate(got):
        rows = ledger.manifest([step])
        names = rows["source"].to_pylist()
        assert names == ["abc"[i // 1000 - 1] for i in batch]
        stage = max(s for s in expected if s <= step)
        assert rows["source_weight"].to_pylist() == [expected[stage][n] for n in names]


def test_metrics_give_each_sources_weight_share_and_rows(uris) -> None:
    import lanceloader.metrics as metrics

    loader = ll.Loader(mix(uris), BATCH, num_workers=1)
    loader.set_weights({"a": 3, "b": 1, "c": 0}, step=2)
    written: list[dict[str, float]] = []
    for _ in metrics.log_every(loader, lambda m, step: written.append(m), every=5):
        pass
    last = written[-1]
    assert last["lanceloader/mix/a/weight"] == 0.75 and last["lanceloader/mix/c/weight"] == 0
    assert last["lanceloader/mix/a/share"] == 0.75  # 13 steps of 4 from step 2: 39 and 13
    assert abs(last["lanceloader/mix/c/rows"] - 8 / 3) < 1  # a third of the first 2 steps'
    assert sum(last[f"lanceloader/mix/{n}/rows"] for n in "abc") == 60
    prometheus_client = pytest.importorskip("prometheus_client")
    registry = prometheus_client.CollectorRegistry()
    metrics.prometheus(loader, registry=registry)
    labels = {"loader": "train", "rank": "0", "source": "b"}
    assert registry.get_sample_value("lanceloader_mix_weight", labels) == 0.25
    rows_b = sum(s.rows["b"] for s in loader.mix_shares())
    assert registry.get_sample_value("lanceloader_mix_rows", labels) == rows_b


def test_many_calls_fold_into_the_anchor_and_deliver_the_same_stream(uris) -> None:
    """70 calls, one a step (past the 64 a state holds: the run is anchored again), during the
    epochs, equal the same calls made before the run began; the state holds at most 65."""
    rng = np.random.default_rng(7)
    calls = [
        (
            s,
            s + 1,
            dict(zip("abc", (rng.integers(0, 4, 3) + np.eye(3)[s % 3]).tolist(), strict=True)),
        )
        for s in range(1, 71)
    ]
    during = ll.Loader(mix(uris), BATCH, num_workers=2)
    got = ids_per_step(during, 75, calls)
    assert len(during.state_dict()["order"]["mix"]["feedback"]) <= 65
    upfront = ll.Loader(mix(uris), BATCH, num_workers=1)
    for _, step, weights in calls:
        upfront.set_weights(weights, step=step)
    assert got == ids_per_step(upfront, 75)
