"""Checkpoints: resume at the exact sample, on any number of ranks, at O(1) cost."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lanceloader as ll
from conftest import ids_of

MODES = {
    "sequential": {},
    "block": {"shuffle": True, "shuffle_block_size": 8, "shuffle_window": 3},
    "full": {"shuffle": True},
}
FIXTURE_SETTINGS = settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def remainder(loader: ll.Loader) -> list[list[int]]:
    return [b["id"].tolist() for b in loader]


@FIXTURE_SETTINGS
@given(
    mode=st.sampled_from(sorted(MODES)),
    use_filter=st.booleans(),
    drop_last=st.booleans(),
    workers=st.integers(1, 4),
    prefetch=st.integers(1, 8),
    batch_size=st.integers(1, 130),
    data=st.data(),
)
def test_resume_at_a_random_point_gives_the_same_stream(
    small_uri: str, mode, use_filter, drop_last, workers, prefetch, batch_size, data
) -> None:
    def make(**kw):
        return ll.Loader(
            small_uri,
            batch_size=batch_size,
            filter="label != 3" if use_filter else None,
            drop_last=drop_last,
            seed=11,
            **MODES[mode],
            **kw,
        )

    reference = remainder(make())
    stop = data.draw(st.integers(0, len(reference)))
    loader = make(num_workers=workers, prefetch=prefetch)
    it = iter(loader)
    for _ in range(stop):
        next(it)
    state = loader.state_dict()
    del it
    resumed = make(num_workers=workers, prefetch=prefetch)
    resumed.load_state_dict(json.loads(json.dumps(state)))
    rest = iter(resumed)
    assert len(resumed) == len(reference) and len(rest) == len(reference) - stop
    assert remainder(rest) == reference[stop:]  # at the end of the epoch: nothing
    assert resumed.epoch == 1 and remainder(resumed) == remainder(_at_epoch(make(), 1))


def _at_epoch(loader: ll.Loader, epoch: int) -> ll.Loader:
    loader.set_epoch(epoch)
    return loader


@pytest.mark.parametrize("n_ranks, m_ranks", [(1, 2), (2, 1), (2, 3), (3, 2), (4, 1), (1, 4)])
@pytest.mark.parametrize("mode", MODES)
def test_elastic_resume_n_to_m_ranks(small_uri: str, n_ranks: int, m_ranks: int, mode: str) -> None:
    def make(rank: int, world: int) -> ll.Loader:
        return ll.Loader(
            small_uri, batch_size=40, rank=rank, world_size=world, seed=5, **MODES[mode]
        )

    uninterrupted = ids_of(make(0, 1))
    loaders = [make(r, n_ranks) for r in range(n_ranks)]
    iters = [iter(ld) for ld in loaders]
    steps = 5
    for it in iters:
        for _ in range(steps):
            next(it)
    states = [ld.state_dict() for ld in loaders]
    assert all(s == states[0] for s in states)  # every rank agrees
    done = states[0]["sample"]
    assert done == steps * 40 * n_ranks
    after = []
    for r in range(m_ranks):
        resumed = make(r, m_ranks)
        resumed.load_state_dict(states[0])
        after.extend(ids_of(resumed))
    rest = uninterrupted[done:]
    assert set(after) == set(rest)
    assert len(after) - len(rest) < m_ranks  # at most padding of the last global batch


def test_unused_exhausted_and_epoch_boundary_states(small_uri: str) -> None:
    loader = ll.Loader(small_uri, batch_size=300, shuffle=True)
    assert (loader.state_dict()["epoch"], loader.state_dict()["sample"]) == (0, 0)
    epoch0 = ids_of(loader)
    state = loader.state_dict()
    assert (state["epoch"], state["sample"]) == (1, 0)
    fresh = ll.Loader(small_uri, batch_size=300, shuffle=True)
    fresh.load_state_dict(state)
    assert fresh.epoch == 1 and ids_of(fresh) != epoch0
    it = iter(loader)
    for _ in range(len(loader)):
        next(it)
    end = loader.state_dict()  # all batches taken, StopIteration not yet seen: the end of epoch 1
    assert (end["epoch"], end["sample"]) == (1, 1000)
    assert next(it, None) is None
    assert (loader.state_dict()["epoch"], loader.state_dict()["sample"]) == (2, 0)


def test_break_then_state_is_where_the_loop_stopped(small_uri: str) -> None:
    loader = ll.Loader(small_uri, batch_size=100)
    for i, _ in enumerate(loader):
        if i == 3:
            break
    assert loader.state_dict()["sample"] == 400  # batches 0..3 were handed out


def test_state_mismatches_name_both_sides(small_uri: str) -> None:
    state = ll.Loader(small_uri, batch_size=10, shuffle=True, seed=1).state_dict()
    with pytest.raises(
        ll.StateMismatchError, match="order setting 'seed': state has 1, this loader has 2"
    ):
        ll.Loader(small_uri, batch_size=10, shuffle=True, seed=2).load_state_dict(state)
    with pytest.raises(ll.StateMismatchError, match="batch_size: state has 10, this loader has 20"):
        ll.Loader(small_uri, batch_size=20, shuffle=True, seed=1).load_state_dict(state)
    ll.Loader(small_uri, batch_size=20, shuffle=True, seed=1).load_state_dict(
        state, allow_changes=("batch_size",)
    )
    with pytest.raises(ValueError, match="cannot be allowed"):
        ll.Loader(small_uri, batch_size=10, shuffle=True, seed=1).load_state_dict(
            state, allow_changes=("seed",)
        )
    with pytest.raises(ll.StateMismatchError, match="order setting 'filter'"):
        ll.Loader(small_uri, batch_size=10, shuffle=True, seed=1, filter="id < 5").load_state_dict(
            state
        )
    with pytest.raises(ll.StateMismatchError, match="state has no 'format' key"):
        ll.Loader(small_uri, batch_size=10).load_state_dict({"epoch": 1})


def test_state_from_another_version_is_refused(tmp_path) -> None:
    from lanceloader.demo import demo_table, write_demo_dataset

    uri = write_demo_dataset(tmp_path / "v.lance", rows=100, fragments=1)
    state = ll.Loader(uri, batch_size=10).state_dict()
    import lance

    lance.write_dataset(demo_table(10, start=100), uri, mode="append")
    with pytest.raises(
        ll.StateMismatchError,
        match=r"state has version 1 of .*, this loader reads version 2 .*\(pass version=1",
    ):
        ll.Loader(uri, batch_size=10).load_state_dict(state)
    ll.Loader(uri, batch_size=10, version=1).load_state_dict(state)


def test_new_batch_size_resumes_at_the_same_sample(small_uri: str) -> None:
    old = ll.Loader(small_uri, batch_size=64, shuffle=True)
    it = iter(old)
    for _ in range(3):
        next(it)
    state = old.state_dict()
    new = ll.Loader(small_uri, batch_size=100, shuffle=True)
    new.load_state_dict(state, allow_changes=("batch_size",))
    it.close()
    old.set_epoch(0)
    assert ids_of(new) == ids_of(old)[192:]


def test_state_is_small_fast_and_resume_cost_does_not_grow(medium_uri: str) -> None:
    loader = ll.Loader(medium_uri, batch_size=256, shuffle=True)
    state = loader.state_dict()
    assert len(json.dumps(state)) < 1024
    # O(1) resume: the first batch after a resume near the end is one batch, not a replay.
    near_end = dict(state, sample=19_000)
    resumed = ll.Loader(medium_uri, batch_size=256, shuffle=True)
    resumed.load_state_dict(near_end)
    assert len(iter(resumed)) == -(-1000 // 256)
    assert (
        ids_of(resumed)
        == ids_of(_at_epoch(ll.Loader(medium_uri, batch_size=256, shuffle=True), 0))[19_000:]
    )


def test_save_and_load_state_files_atomically(tmp_path, small_uri: str) -> None:
    loader = ll.Loader(small_uri, batch_size=10)
    next(iter(loader))
    path = tmp_path / "ckpt" / "loader.json"
    ll.save_state(path, loader.state_dict())
    assert ll.load_state(path) == loader.state_dict()
    assert [p.name for p in path.parent.iterdir()] == ["loader.json"]  # no temp file left
    with pytest.raises(FileNotFoundError, match="no loader state at"):
        ll.load_state(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ValueError, match="not a loader state"):
        ll.load_state(tmp_path / "bad.json")


# --- the cursor under any interleaving ----------------------------------------------------------

OPS = st.lists(
    st.sampled_from(["iter", "next", "next", "next", "break", "close", "resume", "gc"]), max_size=40
)


@FIXTURE_SETTINGS
@given(ops=OPS, mode=st.sampled_from(sorted(MODES)))
def test_any_interleaving_delivers_the_uninterrupted_stream(small_uri: str, ops, mode) -> None:
    """iter/next/break/close/state_dict+load_state_dict/GC in any order: over the whole run,
    exactly the batches of an uninterrupted run, in its order (nothing lost or repeated, no
    epoch skipped)."""
    import gc

    def make() -> ll.Loader:
        return ll.Loader(
            small_uri, batch_size=300, columns=["id"], seed=4, num_workers=1, **MODES[mode]
        )

    epochs = 3
    uninterrupted = make()
    reference = [b for _ in range(epochs) for b in remainder(uninterrupted)]
    loader, it, delivered = make(), None, []
    for op in ops:
        if op == "iter":
            # a live iterator with batches left is in use; one that handed out the last batch
            # ends its epoch at the next iter() (a loop that stops at len(), as Lightning's)
            if it is not None and it.live and len(it) > 0:
                with pytest.raises(ll.LoaderInUseError):
                    iter(loader)
            else:
                it = iter(loader)
        elif op == "next" and it is not None:
            batch = next(it, None)
            if batch is not None:
                delivered.append(batch["id"].tolist())
        elif op == "break":
            it = None
        elif op == "close" and it is not None:
            it.close()
        elif op == "resume":
            state = json.loads(json.dumps(loader.state_dict()))
            loader, it = make(), None
            loader.load_state_dict(state)
        elif op == "gc":
            gc.collect()
        if loader.epoch >= epochs:
            break
    if it is not None:
        it.close()
    while loader.epoch < epochs:
        delivered += remainder(loader)
    assert delivered == reference[: len(delivered)] and len(delivered) >= len(reference)


# --- checkpoint identity and damaged states ------------------------------------------------------


def test_recreated_dataset_at_the_same_uri_is_refused(tmp_path) -> None:
    import shutil

    from lanceloader.demo import write_demo_dataset

    uri = write_demo_dataset(tmp_path / "d.lance", rows=100, fragments=2)
    state = ll.Loader(uri, batch_size=10).state_dict()
    shutil.rmtree(uri)
    write_demo_dataset(tmp_path / "d.lance", rows=100, fragments=2)  # same version, same rows
    with pytest.raises(
        ll.StateMismatchError,
        match=r"dataset identity: .*both version 1.*"
        r"different data",
    ):
        ll.Loader(uri, batch_size=10).load_state_dict(state)


def test_copied_dataset_resumes_when_the_user_says_so(tmp_path) -> None:
    import shutil

    from lanceloader.demo import write_demo_dataset

    uri = write_demo_dataset(tmp_path / "a.lance", rows=100, fragments=2)
    loader = ll.Loader(uri, batch_size=10, columns=["id"], shuffle=True)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    copy = str(tmp_path / "elsewhere" / "b.lance")
    shutil.copytree(uri, copy)
    moved = ll.Loader(copy, batch_size=10, columns=["id"], shuffle=True)
    with pytest.raises(
        ll.StateMismatchError,
        match=r"same dataset .* copied or moved. Pass "
        r"allow_changes=\('uri',\)",
    ):
        moved.load_state_dict(state)
    moved.load_state_dict(state, allow_changes=("uri",))
    assert remainder(moved) == remainder(it)


def test_appended_then_version_mismatch_names_the_fix(tmp_path) -> None:
    import lance

    from lanceloader.demo import demo_table, write_demo_dataset

    uri = write_demo_dataset(tmp_path / "v.lance", rows=100, fragments=1)
    state = ll.Loader(uri, batch_size=10).state_dict()
    lance.write_dataset(demo_table(100), uri, mode="overwrite")
    with pytest.raises(ll.StateMismatchError, match=r"pass version=1"):
        ll.Loader(uri, batch_size=10).load_state_dict(state)
    ll.Loader(uri, batch_size=10, version=1).load_state_dict(state)


def _state(small_uri: str) -> dict:
    loader = ll.Loader(small_uri, batch_size=10, shuffle=True)
    next(iter(loader))
    return loader.state_dict()


@pytest.mark.parametrize(
    "key",
    [
        "format",
        "uri",
        "version",
        "dataset",
        "order",
        "fingerprint",
        "batch_size",
        "world_size",
        "drop_last",
        "columns",
        "epoch",
        "sample",
    ],
)
def test_a_state_missing_a_key_names_it(small_uri: str, key: str) -> None:
    state = _state(small_uri)
    del state[key]
    with pytest.raises(ll.StateMismatchError, match=f"no '{key}' key|no key '{key}'"):
        ll.Loader(small_uri, batch_size=10, shuffle=True).load_state_dict(state)


@pytest.mark.parametrize(
    "key,value",
    [
        ("epoch", "1"),
        ("sample", 1.5),
        ("sample", True),
        ("drop_last", 0),
        ("order", [1]),
        ("columns", "id"),
        ("version", "1"),
        ("fingerprint", None),
        ("batch_size", None),
    ],
)
def test_a_state_key_of_the_wrong_type_names_it(small_uri: str, key: str, value) -> None:
    state = dict(_state(small_uri), **{key: value})
    with pytest.raises(ll.StateMismatchError, match=rf"state\['{key}'\] must be"):
        ll.Loader(small_uri, batch_size=10, shuffle=True).load_state_dict(state)


def test_edited_states_and_unknown_formats_are_refused(small_uri: str) -> None:
    state = _state(small_uri)
    make = lambda: ll.Loader(small_uri, batch_size=10, shuffle=True)  # noqa: E731
    for edited in (
        dict(state, fingerprint="0" * 16),
        dict(state, dataset="0" * 16),
        dict(state, order=dict(state["order"], seed=7)),
    ):
        with pytest.raises(ll.StateMismatchError, match="edited or damaged"):
            make().load_state_dict(edited)
    with pytest.raises(ll.StateMismatchError, match=r"state\['order'\] has no key 'seed'"):
        make().load_state_dict(
            dict(state, order={k: v for k, v in state["order"].items() if k != "seed"})
        )
    with pytest.raises(ll.StateMismatchError, match=r"reads formats 1 and 2.*upgrade lanceloader"):
        make().load_state_dict(dict(state, format=99))
    for position in ({"sample": 1001}, {"sample": -1}, {"epoch": -1}):
        with pytest.raises(ll.StateMismatchError, match="outside the stream"):
            make().load_state_dict(dict(state, **position))


def test_format_1_states_still_load(small_uri: str, caplog) -> None:
    from lanceloader.state.format import _fingerprint_v1

    state = _state(small_uri)
    old = {k: v for k, v in state.items() if k != "dataset"}
    old.update(format=1, fingerprint=_fingerprint_v1(state["order"]))
    resumed = ll.Loader(small_uri, batch_size=10, shuffle=True)
    with caplog.at_level("WARNING", logger="lanceloader"):
        resumed.load_state_dict(old)
    assert "format-1 loader state" in caplog.text
    assert resumed.state_dict() == state
