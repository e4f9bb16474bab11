"""Reading across an epoch's end (engine/ahead.py): the next epoch's first reads, sent while
an epoch's last reads run (from a loop's second epoch on), are used only by the iterator that
starts that epoch, change no batch, and are dropped (their threads stopped) by anything that
moves the loader elsewhere or stops the epoch before its end."""

from __future__ import annotations

import threading
import time

import pytest

import lanceloader as ll
from conftest import ids_of, lanceloader_threads


def noisy(row, rng):
    """A random draw per row: a batch made again by other workers must draw the same."""
    return {"id": row["id"], "noise": rng.integers(1 << 30)}


def loader(uri: str, **kwargs) -> ll.Loader:
    settings = dict(
        batch_size=16,
        shuffle=True,
        seed=3,
        num_workers=2,
        transform=ll.random_map(noisy),
        output="numpy",
        columns=["id"],
    )
    return ll.Loader(uri, **{**settings, **kwargs})


def epoch_of(loader: ll.Loader) -> list[tuple[int, int]]:
    return [(int(i), int(n)) for b in loader for i, n in zip(b["id"], b["noise"], strict=True)]


def test_epochs_read_ahead_are_the_epochs_of_fresh_loaders(small_uri: str) -> None:
    kept = loader(small_uri)
    for epoch in range(4):
        got = epoch_of(kept)
        fresh = loader(small_uri)
        fresh.set_epoch(epoch)
        assert got == epoch_of(fresh), epoch
        assert sorted(i for i, _ in got) == list(range(1000))


def test_a_loader_iterated_once_reads_nothing_ahead(small_uri: str) -> None:
    kept = loader(small_uri)
    assert sorted(i for i, _ in epoch_of(kept)) == list(range(1000))
    assert kept._ahead.ahead is None and not lanceloader_threads()


def test_the_next_iter_takes_the_reads_sent_ahead(small_uri: str) -> None:
    kept = loader(small_uri)
    epoch_of(kept)
    epoch_of(kept)  # the loop runs epoch after epoch: from here on it reads ahead
    ahead = kept._ahead.ahead
    assert ahead is not None and ahead.epoch == 2 and ahead.results.in_flight == 2
    it = iter(kept)
    assert it.stream._results is ahead.results and kept._ahead.ahead is None
    assert len(list(it)) == len(kept)


def test_a_loader_that_goes_elsewhere_drops_the_reads_ahead(small_uri: str) -> None:
    kept = loader(small_uri)
    expected = {}
    for epoch in (1, 2, 5, 6):
        fresh = loader(small_uri)
        fresh.set_epoch(epoch)
        expected[epoch] = epoch_of(fresh)
    state = kept.state_dict()  # epoch 0, its start

    epoch_of(kept)
    kept.set_epoch(5)  # not the epoch read ahead (1), which the next loop had not yet wanted
    epoch_of(kept)
    assert epoch_of(kept) == expected[5 + 1]  # epoch 6: read ahead
    assert kept._ahead.ahead is not None
    kept.set_epoch(5)  # not the epoch read ahead (7)
    assert kept._ahead.ahead is None
    assert epoch_of(kept) == expected[5]
    assert kept._ahead.ahead is None  # 5 after 6: not one epoch after another

    epoch_of(kept)  # 6, then 7 read ahead
    kept.load_state_dict(state)
    assert kept._ahead.ahead is None
    kept.set_epoch(1)
    assert epoch_of(kept) == expected[1]
    assert epoch_of(kept) == expected[2]

    kept.close()  # the reads ahead of epoch 3, and their threads
    assert kept._ahead.ahead is None
    deadline = time.monotonic() + 5
    while lanceloader_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not lanceloader_threads()


def test_set_epoch_to_the_epoch_read_ahead_keeps_it(small_uri: str) -> None:
    # the DistributedSampler habit: set_epoch(e) before each epoch's loop
    kept = loader(small_uri)
    for epoch in range(2):
        kept.set_epoch(epoch)
        epoch_of(kept)
    ahead = kept._ahead.ahead
    kept.set_epoch(2)
    assert kept._ahead.ahead is ahead is not None
    fresh = loader(small_uri)
    fresh.set_epoch(2)
    assert epoch_of(kept) == epoch_of(fresh)


def test_a_break_after_the_last_read_drops_the_read_ahead(small_uri: str) -> None:
    kept = loader(small_uri)
    epoch_of(kept)
    it = iter(kept)
    first = [next(it) for _ in range(len(kept) - 2)]  # past the last read's sending
    assert kept._ahead.ahead is not None
    del it  # a break: the loop may not come back
    assert kept._ahead.ahead is None
    rest = list(kept)  # the same epoch's last 2 batches
    fresh = loader(small_uri)
    fresh.set_epoch(1)
    assert ids_of(first + rest) == ids_of(list(fresh))
    fresh.set_epoch(2)
    assert epoch_of(kept) == epoch_of(fresh)


def test_process_workers_read_no_epoch_ahead(small_uri: str) -> None:
    # their pool is the loader's one kept pool, busy with this epoch's reads
    kept = loader(small_uri, transform=None, worker_type="process", num_workers=1)
    assert sorted(ids_of(list(kept))) == list(range(1000))
    assert kept._ahead.ahead is None
    kept.close()


class FailOn:
    """A transform that raises on the batch of exactly these ids."""

    def __init__(self, ids: list[int]) -> None:
        self.ids = ids

    def __call__(self, batch):
        if batch.column("id").to_pylist() == self.ids:
            raise RuntimeError("boom in a batch read ahead")
        return batch


def test_an_error_in_a_read_ahead_surfaces_in_the_epoch_that_reads_it(small_uri: str) -> None:
    fresh = loader(small_uri, transform=None)
    fresh.set_epoch(1)
    first_of_epoch_1 = [int(i) for i in fresh.peek()["id"]]
    kept = loader(small_uri, transform=FailOn(first_of_epoch_1))
    kept._ahead.last_epoch_started = -1  # as if epoch -1 ran: epoch 0 reads epoch 1 ahead
    assert len(list(kept)) == len(kept)  # epoch 0 whole, its read ahead failed unseen
    assert kept._ahead.ahead is not None
    with pytest.raises(RuntimeError, match="boom in a batch read ahead"):
        list(kept)
    assert kept._ahead.ahead is None


def test_an_error_in_the_epoch_drops_the_read_ahead(small_uri: str) -> None:
    fresh = loader(small_uri, transform=None)
    fresh.set_epoch(1)
    last_of_epoch_1 = [int(i) for i in list(fresh)[-1]["id"]]
    kept = loader(small_uri, transform=FailOn(last_of_epoch_1))
    list(kept)
    with pytest.raises(RuntimeError):
        list(kept)  # epoch 1: its last reads are sent, epoch 2 read ahead, then its error
    assert kept._ahead.ahead is None


def test_threads_of_reads_ahead_end_with_the_loader(small_uri: str) -> None:
    kept = loader(small_uri)
    epoch_of(kept)
    epoch_of(kept)
    assert kept._ahead.ahead is not None
    names = {t.name for t in threading.enumerate()}
    assert any(n.startswith("lanceloader-worker-") for n in names)
    del kept
    deadline = time.monotonic() + 5
    while lanceloader_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not lanceloader_threads()


def test_a_table_appended_to_after_the_read_ahead_gives_the_next_epoch_its_rows(tmp_path) -> None:
    # the read ahead was made from the old version; the next epoch reads the new one (follow)
    import lance
    import pyarrow as pa

    uri = str(tmp_path / "t.lance")

    def write(ids: range, mode: str) -> None:
        lance.write_dataset(pa.table({"id": pa.array(list(ids), pa.int64())}), uri, mode=mode)

    write(range(300), "create")
    kept = ll.Loader(uri, batch_size=10, shuffle=True, follow=True, num_workers=2, output="numpy")
    ids_of(list(kept))
    ids_of(list(kept))
    assert kept._ahead.ahead is not None and kept._ahead.ahead.epoch == 2
    write(range(1000, 1100), "append")
    got = ids_of(list(kept))
    fresh = ll.Loader(uri, batch_size=10, shuffle=True, follow=True, num_workers=2)
    fresh.set_epoch(2)
    assert got == ids_of(list(fresh))
    assert sorted(got) == [*range(300), *range(1000, 1100)]


def test_a_trace_begun_after_the_read_ahead_has_every_batch_s_spans(small_uri, tmp_path) -> None:
    import json

    kept = loader(small_uri, batch_size=50)
    epoch_of(kept)
    epoch_of(kept)
    assert kept._ahead.ahead is not None  # epoch 2's first reads, sent untraced
    with kept.trace(tmp_path / "run.json"):
        epoch_of(kept)
    events = json.loads((tmp_path / "run.json").read_text())["traceEvents"]
    traced = sorted(e["args"]["batch"] for e in events if e.get("name") == "transform")
    assert traced == list(range(20))
