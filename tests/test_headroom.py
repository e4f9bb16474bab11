"""ll.headroom: the loader's cost to a step, measured with the user's step, loader left in place.

No timed assertions: the cases are built so that the answer is far from any bound (a step that
sleeps, so its floor is known; a loader whose transform sleeps far longer than the step, so the
wait dominates whatever the machine's load)."""

from __future__ import annotations

import time

import numpy as np
import pytest

import lanceloader as ll


def _sleepy(seconds: float):
    def transform(batch):
        time.sleep(seconds)
        return batch

    return transform


def test_a_loader_slower_than_the_step_is_named_the_limit(small_uri):
    loader = ll.Loader(
        small_uri, batch_size=16, columns=["id"], num_workers=1, transform=_sleepy(0.03)
    )
    report = ll.headroom(loader, lambda batch: time.sleep(0.001), steps=6, warmup=1)
    # one worker building a batch in 30 ms against a 1 ms step: the step waits most of the time
    assert report.wait_share > 0.5
    assert report.speedup > 3
    assert report.verdict.startswith("the loader")
    assert "exposed wait" in str(report) and "infinitely fast loader" in str(report)


def test_a_step_slower_than_the_loader_is_named_the_limit(small_uri):
    loader = ll.Loader(small_uri, batch_size=16, columns=["id"], num_workers=1)
    report = ll.headroom(loader, lambda batch: time.sleep(0.03), steps=6, warmup=2)
    assert report.floor_step_s >= 0.03
    assert report.speedup < 1.5
    assert report.loader_cpu_s >= 0


def test_the_loader_is_left_where_it_was_and_its_batches_come_again(small_uri):
    loader = ll.Loader(small_uri, batch_size=8, columns=["id"], shuffle=True, seed=4)
    iterator = iter(loader)
    first = next(iterator)["id"].tolist()
    iterator.close()
    state = loader.state_dict()
    seen = []
    report = ll.headroom(loader, lambda batch: seen.append(batch["id"].tolist()), steps=3, warmup=1)
    assert loader.state_dict() == state
    rest = [batch["id"].tolist() for batch in loader]
    assert len(seen) == 1 + 3 + 3  # warmup, fed, then the same batches replayed for the floor
    assert seen[:4] == rest[:4]  # warmup and measured steps are delivered again, in order
    assert seen[4:] == seen[1:4]
    assert first not in rest  # the batch taken before stays taken
    assert report.steps == 3


def test_the_floor_replays_the_fed_batches(small_uri):
    loader = ll.Loader(small_uri, batch_size=8, columns=["id"])
    seen = []
    ll.headroom(loader, lambda batch: seen.append(np.array(batch["id"])), steps=4, warmup=0)
    fed, replayed = seen[:4], seen[4:]
    assert all(np.array_equal(a, b) for a, b in zip(fed, replayed, strict=True))


def test_too_few_batches_and_bad_arguments_are_named(small_uri):
    loader = ll.Loader(small_uri, batch_size=10_000, columns=["id"])
    with pytest.raises(ValueError, match="needs 3 batches"):
        ll.headroom(loader, lambda batch: None, steps=2, warmup=1)
    assert loader.state_dict()["sample"] == 0
    with pytest.raises(TypeError, match="step_fn must be callable"):
        ll.headroom(loader, "train", steps=2)
    with pytest.raises(ValueError, match="steps must be >= 1"):
        ll.headroom(loader, lambda batch: None, steps=0)


def test_cpu_the_step_spends_on_threads_of_its_own_is_not_the_loaders(small_uri):
    """A step that burns 20 ms of CPU on a helper thread (as torch's intra-op threads do): the
    loader's CPU counts its own threads, Lance's and its worker processes, not the step's
    helpers (this process's CPU less the step's thread counted all 20 ms as the loader's)."""
    import concurrent.futures

    helper = concurrent.futures.ThreadPoolExecutor(1)

    def burn() -> None:
        began = time.thread_time()
        while time.thread_time() - began < 0.02:
            pass

    loader = ll.Loader(small_uri, batch_size=16, columns=["id"], num_workers=1)
    report = ll.headroom(loader, lambda batch: helper.submit(burn).result(), steps=6, warmup=1)
    helper.shutdown()
    assert report.loader_cpu_s < 0.01, str(report)  # a 16-row read: far under the 20 ms


def test_a_live_iterator_is_named_and_the_loader_left_as_it_was(small_uri):
    """headroom on a loader whose iterator is live refuses at its own iter(), not in the
    restore (whose error named load_state_dict(), a call the user never made)."""
    loader = ll.Loader(small_uri, batch_size=8, columns=["id"])
    iterator = iter(loader)
    next(iterator)
    with pytest.raises(ll.LoaderInUseError, match=r"^iter\(\)"):
        ll.headroom(loader, lambda batch: None, steps=2, warmup=0)
    assert next(iterator) is not None  # the live iterator goes on
    iterator.close()


def test_a_replay_slower_than_the_fed_steps_is_not_blamed_on_the_loader():
    """The step's own time varied more than the loader cost (5 steps of 1 ms, a floor slower
    than the fed steps): the verdict is not 'the loader', and the report says no faster."""
    report = ll.Headroom(
        steps=5,
        fed_step_s=1.14e-3,
        floor_step_s=1.27e-3,
        wait_s=0.07e-3,
        compute_fed_s=1.07e-3,
        compute_floor_s=1.27e-3,
        loader_cpu_s=0.5e-3,
        workers_counted=True,
    )
    assert not report.verdict.startswith("the loader"), report.verdict
    assert "0.90x faster" not in str(report)


def test_a_loader_without_a_state_is_refused_naming_what_to_pass(small_uri):
    """A torch DataLoader (what a newcomer from PyTorch passes) cannot be put back where it
    was: a TypeError naming what headroom needs and what to pass, not an AttributeError."""
    pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    from lanceloader.torch import BatchSampler, MapDataset, collate

    ds = MapDataset(small_uri, columns=["id"])
    torch_loader = DataLoader(ds, batch_sampler=BatchSampler(ds, batch_size=8), collate_fn=collate)
    with pytest.raises(TypeError, match=r"state_dict\(\).*DataLoader.*ll\.Loader"):
        ll.headroom(torch_loader, lambda batch: None, steps=2)
