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


def assert_equal_output_after_checkpoint(make_loader) -> None:
    """Checkpoint after every step of an epoch; a fresh loader must continue identically."""
    reference = make_loader()
    full = remainder(reference) + remainder(reference)  # two epochs
    per_epoch = len(full) // 2
    loader = make_loader()
    keys = None
    for step in range(2 * per_epoch + 1):
        state = loader.state_dict()
        assert json.loads(json.dumps(state)) == state
        keys = keys or set(state)
        assert set(state) == keys
        resumed = make_loader()
        resumed.load_state_dict(state)
        assert resumed.state_dict() == state  # get/set/get does not drift
        rest = remainder(resumed) if step < 2 * per_epoch else []
        expect = full[step:per_epoch] if step < per_epoch else full[step:]
        assert rest == expect, f"step {step}"
        if step < 2 * per_epoch:
            if step % per_epoch == 0:
                it = iter(loader)
            next(it)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("drop_last", [False, True])
def test_checkpoint_at_every_step(small_uri: str, mode: str, drop_last: bool) -> None:
    assert_equal_output_after_checkpoint(
        lambda: ll.Loader(small_uri, batch_size=150, drop_last=drop_last, seed=2, **MODES[mode])
    )


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
        return ll.Loader(small_uri, batch_size=batch_size, filter="label != 3" if use_filter else None,
                         drop_last=drop_last, seed=11, **MODES[mode], **kw)

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
    assert len(resumed) == len(reference) - stop or stop == len(reference)
    if stop < len(reference):
        assert remainder(resumed) == reference[stop:]
    else:  # a finished epoch resumes at the start of the next one
        assert resumed.epoch == 1 and remainder(resumed) == remainder(_at_epoch(make(), 1))


def _at_epoch(loader: ll.Loader, epoch: int) -> ll.Loader:
    loader.set_epoch(epoch)
    return loader


@pytest.mark.parametrize("n_ranks, m_ranks", [(1, 2), (2, 1), (2, 3), (3, 2), (4, 1), (1, 4)])
@pytest.mark.parametrize("mode", MODES)
def test_elastic_resume_n_to_m_ranks(small_uri: str, n_ranks: int, m_ranks: int, mode: str) -> None:
    def make(rank: int, world: int) -> ll.Loader:
        return ll.Loader(small_uri, batch_size=40, rank=rank, world_size=world, seed=5, **MODES[mode])

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
    assert loader.state_dict()["epoch"] == 2  # all batches taken, even before StopIteration


def test_break_then_state_is_where_the_loop_stopped(small_uri: str) -> None:
    loader = ll.Loader(small_uri, batch_size=100)
    for i, _ in enumerate(loader):
        if i == 3:
            break
    assert loader.state_dict()["sample"] == 400  # batches 0..3 were handed out


def test_state_mismatches_name_both_sides(small_uri: str) -> None:
    state = ll.Loader(small_uri, batch_size=10, shuffle=True, seed=1).state_dict()
    with pytest.raises(ll.StateMismatchError, match="order setting 'seed': state has 1, this loader has 2"):
        ll.Loader(small_uri, batch_size=10, shuffle=True, seed=2).load_state_dict(state)
    with pytest.raises(ll.StateMismatchError, match="batch_size: state has 10, this loader has 20"):
        ll.Loader(small_uri, batch_size=20, shuffle=True, seed=1).load_state_dict(state)
    ll.Loader(small_uri, batch_size=20, shuffle=True, seed=1).load_state_dict(state, allow_changes=("batch_size",))
    with pytest.raises(ValueError, match="cannot be allowed"):
        ll.Loader(small_uri, batch_size=10, shuffle=True, seed=1).load_state_dict(state, allow_changes=("seed",))
    with pytest.raises(ll.StateMismatchError, match="order setting 'filter'"):
        ll.Loader(small_uri, batch_size=10, shuffle=True, seed=1, filter="id < 5").load_state_dict(state)
    with pytest.raises(TypeError, match=r"expected a state from Loader\.state_dict"):
        ll.Loader(small_uri, batch_size=10).load_state_dict({"epoch": 1})


def test_state_from_another_version_is_refused(tmp_path) -> None:
    from lanceloader.demo import demo_table, write_demo_dataset

    uri = write_demo_dataset(tmp_path / "v.lance", rows=100, fragments=1)
    state = ll.Loader(uri, batch_size=10).state_dict()
    import lance

    lance.write_dataset(demo_table(10, start=100), uri, mode="append")
    with pytest.raises(ll.StateMismatchError, match=r"version 1, this loader reads .* version 2 \(pass version=1"):
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
    assert len(resumed) == -(-1000 // 256)
    assert ids_of(resumed) == ids_of(_at_epoch(ll.Loader(medium_uri, batch_size=256, shuffle=True), 0))[19_000:]


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
