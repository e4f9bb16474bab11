from __future__ import annotations

import gc
import itertools
import os
import pickle

import lance
import numpy as np
import pyarrow as pa
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lanceloader as ll
from conftest import ids_of, lanceloader_threads

MODES = {
    "sequential": {},
    "block": {"shuffle": True, "shuffle_block_size": 16, "shuffle_window": 4},
    "full": {"shuffle": True},
}


@pytest.mark.parametrize("mode", MODES)
def test_each_mode_covers_every_row_once(small_uri: str, mode: str) -> None:
    loader = ll.Loader(small_uri, batch_size=64, **MODES[mode])
    got = ids_of(loader)
    assert sorted(got) == list(range(1000))
    assert len(loader) == 16
    if mode == "sequential":
        assert got == list(range(1000))
    else:
        assert got != list(range(1000))


@pytest.mark.parametrize("mode", MODES)
def test_epochs_advance_by_themselves_and_set_epoch_replays(small_uri: str, mode: str) -> None:
    loader = ll.Loader(small_uri, batch_size=100, seed=3, **MODES[mode])
    e0, e1 = ids_of(loader), ids_of(loader)
    assert loader.epoch == 2
    if mode != "sequential":
        assert e0 != e1
    loader.set_epoch(0)
    assert ids_of(loader) == e0


def test_order_is_a_function_of_the_seed_only(small_uri: str) -> None:
    a = ids_of(ll.Loader(small_uri, batch_size=32, shuffle=True, seed=7))
    b = ids_of(ll.Loader(small_uri, batch_size=32, shuffle=True, seed=7, num_workers=1, prefetch=1))
    c = ids_of(ll.Loader(small_uri, batch_size=32, shuffle=True, seed=8))
    assert a == b != c


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    mode=st.sampled_from(sorted(MODES)),
    workers=st.integers(1, 4),
    prefetch=st.integers(1, 8),
    rows_per_read=st.sampled_from([1, 50, 300, 5000]),
)
def test_results_never_depend_on_workers_prefetch_or_read_size(
    small_uri: str, mode: str, workers: int, prefetch: int, rows_per_read: int
) -> None:
    reference = [b["id"].tolist() for b in ll.Loader(small_uri, batch_size=48, **MODES[mode])]
    loader = ll.Loader(
        small_uri,
        batch_size=48,
        num_workers=workers,
        prefetch=prefetch,
        rows_per_read=rows_per_read,
        **MODES[mode],
    )
    assert [b["id"].tolist() for b in loader] == reference


def test_filter_columns_and_batches(small_uri: str) -> None:
    loader = ll.Loader(small_uri, batch_size=10, columns=["id", "x"], filter="label < 5")
    batches = list(loader)
    assert set(batches[0]) == {"id", "x"}
    assert batches[0]["x"].shape == (10, 64) and batches[0]["x"].dtype == np.float32
    got = ids_of(batches)
    assert got == [i for i in range(1000) if i % 10 < 5]


@pytest.mark.parametrize(
    "drop_last, sizes", [(False, [300, 300, 300, 100]), (True, [300, 300, 300])]
)
def test_drop_last(small_uri: str, drop_last: bool, sizes: list[int]) -> None:
    loader = ll.Loader(small_uri, batch_size=300, drop_last=drop_last)
    assert [len(b["id"]) for b in loader] == sizes and len(loader) == len(sizes)


def test_ranks_split_every_global_batch(small_uri: str) -> None:
    per_rank = [
        ids_of(ll.Loader(small_uri, batch_size=50, rank=r, world_size=3, shuffle=True))
        for r in range(3)
    ]
    flat = [i for ids in per_rank for i in ids]
    assert sorted(flat) == list(
        range(1000)
    )  # 1000 = 6 full global batches of 150 + 100 evenly split
    assert (
        len({len(ll.Loader(small_uri, batch_size=50, rank=r, world_size=3)) for r in range(3)}) == 1
    )


def test_output_formats(small_uri: str) -> None:
    torch_batch = next(
        iter(ll.Loader(small_uri, batch_size=8, output="torch", columns=["id", "x"]))
    )
    assert isinstance(torch_batch["x"], torch.Tensor) and torch_batch["x"].shape == (8, 64)
    arrow_batch = next(iter(ll.Loader(small_uri, batch_size=8, output="arrow")))
    assert isinstance(arrow_batch, pa.RecordBatch) and arrow_batch.num_rows == 8
    py_batch = next(
        iter(ll.Loader(small_uri, batch_size=2, output="python", columns=["id", "text"]))
    )
    assert py_batch["id"] == [0, 1] and isinstance(py_batch["text"][0], str)


def test_transform_runs_per_batch_in_the_pool(small_uri: str) -> None:
    def double(batch: pa.RecordBatch) -> dict:
        return {"id2": batch.column("id").to_numpy() * 2}

    batches = list(ll.Loader(small_uri, batch_size=100, transform=double))
    assert np.concatenate([b["id2"] for b in batches]).tolist() == [2 * i for i in range(1000)]


def test_transform_error_names_the_batch(small_uri: str) -> None:
    def fail_on_500(batch: pa.RecordBatch) -> pa.RecordBatch:
        if 500 in batch.column("id").to_pylist():
            raise ZeroDivisionError("bad row")
        return batch

    before = set(lanceloader_threads())  # (another test's loader may still read ahead)
    loader = ll.Loader(small_uri, batch_size=100, transform=fail_on_500)
    with pytest.raises(ZeroDivisionError, match="bad row") as info:
        list(loader)
    assert any("batch 5 of epoch 0" in note for note in info.value.__notes__)
    assert set(lanceloader_threads()) - before == set()


def test_early_break_leaves_no_thread_behind(small_uri: str) -> None:
    before = set(lanceloader_threads())  # (another test's loader may still read ahead)
    loader = ll.Loader(small_uri, batch_size=10, shuffle=True, num_workers=2)
    for i in range(1000):
        for j, _ in enumerate(loader):
            if j == i % 3:
                break
    gc.collect()
    assert set(lanceloader_threads()) - before == set()


@pytest.mark.parametrize("worker_type", ["thread", "process"])
def test_a_second_live_iterator_is_an_error_and_the_first_goes_on(small_uri, worker_type) -> None:
    loader = ll.Loader(
        small_uri, batch_size=100, columns=["id"], num_workers=2, worker_type=worker_type
    )
    expected = ids_of(ll.Loader(small_uri, batch_size=100, columns=["id"]))
    first = iter(loader)
    got = ids_of([next(first)])
    misuses = [
        lambda: iter(loader),
        lambda: list(zip(loader, loader, strict=False)),
        lambda: [b for _ in loader for b in loader],  # a nested loop over the same loader
        lambda: [list(itertools.islice(loader, 2)) for _ in range(1)],
        lambda: loader.set_epoch(0),
        lambda: loader.load_state_dict(loader.state_dict()),
    ]
    for misuse in misuses:
        with pytest.raises(
            ll.LoaderInUseError,
            match=r"delivering epoch 0, 1 of 10 batches.*"
            r"peek\(\).*close\(\).*second Loader",
        ):
            misuse()
    got += ids_of(first)  # the first iterator was never disturbed
    assert got == expected and loader.epoch == 1
    assert loader.peek()["id"].tolist() == list(range(100))  # peek never moves the cursor
    assert ids_of(loader) == expected


def test_zip_and_nested_loops_inside_a_loop_raise(small_uri: str) -> None:
    loader = ll.Loader(small_uri, batch_size=100, columns=["id"])
    with pytest.raises(ll.LoaderInUseError):
        for _ in loader:
            for _ in loader:
                pass
    with pytest.raises(ll.LoaderInUseError):
        for _a, _b in zip(loader, loader, strict=False):
            pass
    # the outer loop died after its first batch (zip before any) and was collected: the epoch
    # continues there
    assert ids_of(loader) == list(range(100, 1000))


def test_broken_closed_or_collected_iterators_leave_the_cursor_where_they_stopped(
    small_uri: str,
) -> None:
    loader = ll.Loader(small_uri, batch_size=100, columns=["id"], shuffle=True, seed=1)
    expected = ids_of(ll.Loader(small_uri, batch_size=100, columns=["id"], shuffle=True, seed=1))
    got = ids_of([next(iter(loader))])  # logged a sample the wrong way: it is consumed
    for _ in loader:  # break
        break
    got += expected[100:200]
    it = iter(loader)
    got += ids_of([next(it), next(it)])
    it.close()
    assert next(it, None) is None and len(it) == 0  # a closed iterator yields nothing more
    with loader:
        got += ids_of(itertools.islice(loader, 1))
    rest = iter(loader)
    assert len(loader) == 10 and len(rest) == 5
    assert got + ids_of(rest) == expected and loader.epoch == 1


def test_end_of_epoch_is_a_state_of_its_own(small_uri: str) -> None:
    loader = ll.Loader(small_uri, batch_size=400, columns=["id"])
    it = iter(loader)
    for _ in range(len(loader)):
        next(it)
    del it  # the loop never saw StopIteration
    assert loader.epoch == 0 and loader.state_dict()["sample"] == 1000
    assert ids_of(loader) == [] and loader.epoch == 1  # the empty rest of epoch 0
    assert len(ids_of(loader)) == 1000


def test_loader_pickles_and_keeps_its_pinned_version(small_uri: str) -> None:
    loader = ll.Loader(small_uri, batch_size=100, shuffle=True, filter="id < 500")
    it = iter(loader)
    next(it)
    clone = pickle.loads(pickle.dumps(loader))
    loader.close()
    assert clone.source.version == loader.source.version and clone.source.num_rows == 500
    clone.set_epoch(0)
    loader.set_epoch(0)
    assert ids_of(clone) == ids_of(loader)


def test_iterator_in_fork_child_fails_clearly(small_uri: str) -> None:
    loader = ll.Loader(small_uri, batch_size=10)
    it = iter(loader)
    next(it)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never touch Lance; only check the error
        try:
            next(it)
            os.write(w, b"no error")
        except RuntimeError as exc:
            os.write(w, b"ok" if "cannot be used in process" in str(exc) else str(exc).encode())
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(r, 1000) == b"ok"
    it.close()


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"batch_size": 0}, ValueError, "batch_size must be >= 1, got 0"),
        ({"batch_size": 2.5}, TypeError, "batch_size must be an int"),
        ({"shuffle_block_size": 0}, ValueError, "shuffle_block_size"),
        ({"num_workers": 0}, ValueError, "num_workers must be >= 1"),
        ({"prefetch": 0}, ValueError, "prefetch must be >= 1"),
        ({"rank": 2, "world_size": 2}, ValueError, r"rank must lie in \[0, world_size=2\)"),
        ({"worker_type": "fiber"}, ValueError, "worker_type must be"),
        ({"output": "pandas"}, ValueError, "output must be one of"),
        ({"transform": 3}, TypeError, "transform must be a function"),
        ({"on_error": "ignore"}, ValueError, "on_error must be"),
        ({"pin_memory": True}, ValueError, "need output=.torch."),
        ({"output": "torch", "device": "cuda"}, ValueError, "no CUDA device"),
        ({"columns": ["tags"]}, ValueError, "unknown columns"),
    ],
)
def test_bad_arguments_name_the_fix(small_uri: str, kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        ll.Loader(small_uri, **kwargs)


def _same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    return a == b


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("output", ["numpy", "torch"])
def test_converting_whole_reads_equals_converting_each_batch(
    small_uri: str, mode: str, output: str
) -> None:
    # Without a transform, each read is converted once and sliced; an identity transform forces
    # per-batch conversion. Both must deliver the same arrays.
    def per_batch(batch: pa.RecordBatch) -> pa.RecordBatch:
        return batch

    fast = ll.Loader(small_uri, batch_size=37, output=output, **MODES[mode])
    slow = ll.Loader(small_uri, batch_size=37, output=output, transform=per_batch, **MODES[mode])
    for a, b in zip(fast, slow, strict=True):
        if output == "torch":
            a = {k: v.numpy() if isinstance(v, torch.Tensor) else v for k, v in a.items()}
            b = {k: v.numpy() if isinstance(v, torch.Tensor) else v for k, v in b.items()}
        assert _same(a, b)


def test_reads_of_large_rows_stay_under_the_byte_cap(tmp_path) -> None:
    """Reads are sized in bytes as well as rows: 100 KB rows give reads of at most READ_BYTES_MOST
    (16 MiB, as they are fewer than READ_ROWS_LEAST), so the memory in flight stays bounded
    whatever the row size."""
    import lance

    from lanceloader.engine.sizing import READ_BYTES, READ_BYTES_MOST, READ_ROWS_LEAST

    blobs = [bytes([i % 256]) * 100_000 for i in range(600)]
    uri = str(tmp_path / "blobs.lance")
    lance.write_dataset(pa.table({"id": np.arange(600), "blob": pa.array(blobs, pa.binary())}), uri)
    loader = ll.Loader(uri, batch_size=16, num_workers=2)
    assert 95_000 < loader.source.bytes_per_row < 110_000
    rows_per_read = loader.batches_per_read * loader.batch_size
    assert rows_per_read * loader.source.bytes_per_row <= READ_BYTES_MOST
    # as many batches as fit (one more would not), not 65,536 rows' worth nor 8 MiB's 83
    assert (rows_per_read + loader.batch_size) * loader.source.bytes_per_row > READ_BYTES_MOST
    assert READ_BYTES // loader.source.bytes_per_row < rows_per_read < READ_ROWS_LEAST
    assert ids_of(loader) == list(range(600))


# --- a dropped one-batch peek (next(iter(loader))) is said once --------------------------------


def _dropped_peek_warnings(caplog) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "lanceloader" and r.levelname == "WARNING" and "peek()" in r.getMessage()
    ]


def test_next_of_a_fresh_iterator_then_a_loop_warns_once_with_the_batches_left(
    small_uri: str, caplog
) -> None:
    loader = ll.Loader(small_uri, batch_size=100, columns=["id"])
    with caplog.at_level("WARNING", logger="lanceloader"):
        sample = next(iter(loader))  # to log a sample: consumes batch 0
        trained = ids_of(loader)
        assert sample["id"][0] == 0 and len(trained) == 900
        (message,) = _dropped_peek_warnings(caplog)
        assert "continues epoch 0 with 9 of its 10 batches left" in message
        assert "handed batch 0 to a next() call" in message
        next(iter(loader))  # again in epoch 1: said once per loader
        ids_of(loader)
    assert len(_dropped_peek_warnings(caplog)) == 1


def test_loops_that_break_and_resume_and_moved_cursors_stay_quiet(small_uri: str, caplog) -> None:
    loader = ll.Loader(small_uri, batch_size=100, columns=["id"])
    with caplog.at_level("WARNING", logger="lanceloader"):
        for _ in loader:  # a loop that breaks after one batch, on purpose
            break
        for i, _ in enumerate(loader):  # ... and after three
            if i == 2:
                break
        it = iter(loader)  # stepped by hand, more than once
        next(it), next(it)
        del it
        assert len(ids_of(loader)) == 400
        next(iter(loader))  # then the cursor is moved on purpose
        loader.set_epoch(1)
        assert len(ids_of(loader)) == 1000
        next(iter(loader))
        loader.load_state_dict(ll.Loader(small_uri, batch_size=100, columns=["id"]).state_dict())
        assert len(ids_of(loader)) == 1000
    assert _dropped_peek_warnings(caplog) == []


def test_a_loop_that_stops_at_len_gets_the_next_epoch(tmp_path) -> None:
    """Lightning's loop takes len(loader) batches and never asks for the StopIteration, holding
    its iterator: the next iter() is the next epoch, whole, not a LoaderInUseError or an empty
    rest of the last one."""
    from lanceloader.demo import write_demo_dataset

    uri = write_demo_dataset(tmp_path / "d.lance", rows=1000)
    loader = ll.Loader(uri, batch_size=100, columns=["id"])
    first = iter(loader)
    ids = [int(i) for _ in range(len(loader)) for i in next(first)["id"]]
    second = iter(loader)  # `first` still referenced, never exhausted
    assert ids == list(range(1000)) and second.epoch == 1
    assert [int(i) for b in second for i in b["id"]] == list(range(1000))
    assert loader.epoch == 2
    stuck = iter(loader)  # epoch 2, one batch taken: still in use
    next(stuck)
    with pytest.raises(ll.LoaderInUseError):
        iter(loader)


def test_lightning_trains_two_whole_epochs_on_a_plain_loader(tmp_path) -> None:
    L = pytest.importorskip("lightning")
    from lanceloader.demo import write_demo_dataset

    uri = write_demo_dataset(tmp_path / "d.lance", rows=500)
    seen: list[int] = []

    class Model(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(64, 1)

        def training_step(self, batch: dict, index: int) -> torch.Tensor:
            seen.extend(int(i) for i in batch["id"])
            return self.layer(batch["x"]).pow(2).mean()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    loader = ll.Loader(uri, batch_size=100, columns=["id", "x"], output="torch", shuffle=True)
    L.Trainer(
        max_epochs=2,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
    ).fit(Model(), train_dataloaders=loader)
    assert len(seen) == 1000 and sorted(seen[:500]) == sorted(seen[500:]) == list(range(500))
    assert seen[:500] != seen[500:]  # two epochs, two orders


def test_batches_sliced_in_one_pass_are_the_rows_batch_by_batch_slicing_gives() -> None:
    """The one-pass slicing of a read's converted chunks (``work._slice_all``) hands out what
    slicing batch by batch does, and declines (appending nothing) a batch across two chunks."""
    from lanceloader.engine.work import TaskResult, _slice_all, _slice_of, _slice_rows

    ids = np.arange(100)
    chunks = [(0, 40, {"id": ids[:50]}, 10), (40, 100, {"id": ids[50:]}, 0)]  # base 10: rows 10..
    sizes = [16, 24, 30, 30]
    result = TaskResult([], [], [], {})
    assert _slice_all(result, chunks, sizes, 8.0)
    offsets = np.cumsum([0, *sizes[:-1]])
    by_batch = [
        _slice_rows(*(lambda c, b: (c, b, b + n))(*_slice_of(chunks, int(o), n)))
        for o, n in zip(offsets, sizes, strict=True)
    ]
    assert [b["id"].tolist() for b in result.batches] == [b["id"].tolist() for b in by_batch]
    assert result.rows == sizes and result.nbytes == [128, 192, 240, 240]
    spanning = TaskResult([], [], [], {})
    assert not _slice_all(spanning, chunks, [32, 32, 36], 8.0)  # rows 32-63 cross row 40
    assert spanning.batches == [] and spanning.rows == []


def test_torch_batches_sliced_from_tensors_made_once_per_chunk_equal_per_batch_tensors(
    small_uri: str,
) -> None:
    """With torch output, a read's chunks become tensors once and batches are slices of them:
    the same values, dtypes and shapes as converting batch by batch (a transform converts
    per batch), in order and in a full shuffle through the cache."""
    torch = pytest.importorskip("torch")
    for kw in ({}, {"shuffle": True, "cache": "memory"}):
        per_chunk = list(ll.Loader(small_uri, batch_size=48, output="torch", **kw))
        per_batch = list(
            ll.Loader(small_uri, batch_size=48, output="torch", transform=lambda b: b, **kw)
        )
        assert len(per_chunk) == len(per_batch)
        for a, b in zip(per_chunk, per_batch, strict=True):
            assert a.keys() == b.keys()
            for k in a:
                assert type(a[k]) is type(b[k])
                if isinstance(a[k], torch.Tensor):
                    assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k])
                else:  # text stays NumPy or a list
                    assert np.asarray(a[k]).tolist() == np.asarray(b[k]).tolist()
            assert any(isinstance(v, torch.Tensor) for v in a.values())


def test_a_column_torch_refuses_still_raises_with_its_fix_when_reads_slice_in_one_pass(
    tmp_path,
) -> None:
    """A uint64 column with torch output: the one-pass conversion declines, and the batch by
    batch path raises the ConversionError naming the column and the cast that fixes it."""
    pytest.importorskip("torch")
    uri = str(tmp_path / "u64.lance")
    lance.write_dataset(pa.table({"id": pa.array(np.arange(100), pa.uint64())}), uri)
    with pytest.raises(ll.ConversionError, match=r"column 'id' is uint64.*casts=\{'id'"):
        next(iter(ll.Loader(uri, batch_size=10, output="torch", cache=None)))
    batch = next(
        iter(
            ll.Loader(
                uri,
                batch_size=10,
                cache=None,
                output=ll.Conversion(output="torch", casts={"id": "int64"}),
            )
        )
    )
    assert batch["id"].tolist() == list(range(10))
