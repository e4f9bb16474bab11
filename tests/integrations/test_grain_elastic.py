"""A Grain pipeline's state restored into another number of mp_prefetch workers: exactly (no
batch lost or repeated), or a StateMismatchError naming the fix, never Grain's IndexError."""

from __future__ import annotations

import copy
import json

import grain
import pytest

import lanceloader as ll
from lanceloader.grain import IterDataset

SETTINGS = {
    "batch_size": 70,
    "columns": ["id"],
    "shuffle": True,
    "shuffle_block_size": 16,
    "seed": 5,
    "filter": "label != 3",
}  # 3 batches per epoch, the last one short
HEAD = 4  # batches taken before the state: mid-epoch 1


def pipeline(uri: str, workers: int | None, mapped: bool = False) -> grain.IterDataset:
    """Two epochs of the Loader's batches, through a map when ``mapped``, under
    ``mp_prefetch(num_workers=workers)`` (``None``: no mp_prefetch)."""
    ds = IterDataset(uri, num_epochs=2, **SETTINGS)
    if mapped:
        ds = ds.map(lambda b: {"id": b["id"] + 0})
    if workers is None:
        return ds
    return ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers))


def ids(batches) -> list[list[int]]:
    return [b["id"].tolist() for b in batches]


def saved_state(uri: str, workers: int | None, mapped: bool) -> dict:
    """The pipeline's state after :data:`HEAD` batches, as JSON gives it back."""
    it = iter(pipeline(uri, workers, mapped))
    try:
        for _ in range(HEAD):
            next(it)
        return json.loads(json.dumps(it.get_state()))
    finally:
        it.close()


@pytest.mark.slow
@pytest.mark.parametrize(("saved", "restored"), [(2, [1, None]), (1, [2])])
def test_a_state_restores_exactly_into_another_number_of_workers(
    small_uri: str, saved: int, restored: list[int | None]
) -> None:
    """Grain alone: 2 -> 1 raised a bare IndexError in its interleave, and 1 -> 2 set worker 0
    only, so worker 1 started over and batches repeated. A map between the IterDataset and
    mp_prefetch keeps it; no mp_prefetch at all takes the state too."""
    loader = ll.Loader(small_uri, **SETTINGS)
    expected = [b["id"].tolist() for _ in range(2) for b in loader]
    state = saved_state(small_uri, saved, mapped=saved == 2)
    for workers in restored:
        it = iter(pipeline(small_uri, workers, mapped=workers == 1))
        try:
            it.set_state(copy.deepcopy(state))
            assert ids(it) == expected[HEAD:], workers
        finally:
            it.close()


@pytest.mark.slow
def test_a_state_no_single_place_continues_is_refused_naming_the_fix(small_uri: str) -> None:
    """Workers that did not take turns (a filter before mp_prefetch) leave no one place to
    continue from in another layout: our error, before Grain's set_state."""
    state = saved_state(small_uri, 2, mapped=False)
    uneven = copy.deepcopy(state)
    uneven["iterators_in_use_states"][1]["grain"]["delivered"] = 0
    it = iter(pipeline(small_uri, 1))
    with pytest.raises(ll.StateMismatchError, match=r"not in turns .*num_workers=2"):
        it.set_state(uneven)
    with pytest.raises(ll.StateMismatchError, match="holds no lanceloader IterDataset state"):
        it.set_state({**state, "iterators_in_use_states": [{"x": 1}, {"y": 2}]})
    it.close()
