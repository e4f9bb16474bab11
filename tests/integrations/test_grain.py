"""lanceloader.grain with the real Grain package: rows, orders, worker processes, checkpoints."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import textwrap

import grain
import lance
import numpy as np
import pytest
from etils import epath
from hypothesis import given, settings
from hypothesis import strategies as st

import lanceloader as ll
from conftest import ids_of, lanceloader_threads
from lanceloader.demo import demo_table, write_demo_dataset
from lanceloader.grain import DataSource, IterDataset
from lanceloader.integrations.grain import stream_place

FILTER = "label != 3"


def test_data_source_rows_are_the_datasets_rows_after_filter_split_and_projection(
    small_uri: str,
) -> None:
    source = DataSource(
        small_uri,
        columns=["id", "x", "text"],
        filter=FILTER,
        splits={"train": 0.8, "val": 0.2},
        split="val",
    )
    loader = ll.Loader(
        small_uri,
        batch_size=64,
        columns=["id", "x", "text"],
        filter=FILTER,
        splits={"train": 0.8, "val": 0.2},
        split="val",
    )
    expected = ids_of(loader)
    table = lance.dataset(small_uri).to_table(filter=FILTER)
    assert set(expected) < set(table["id"].to_pylist())  # the split took a part
    assert len(source) == len(expected)
    rows = [source[i] for i in range(len(source))]
    assert [r["id"].item() for r in rows] == expected
    assert set(rows[0]) == {"id", "x", "text"}
    by_id = {i: k for k, i in enumerate(table["id"].to_pylist())}
    for r in rows[:5]:
        k = by_id[r["id"].item()]
        np.testing.assert_array_equal(r["x"], np.asarray(table["x"][k].as_py(), np.float32))
        assert r["text"] == table["text"][k].as_py()
    batched = source._getitems([7, 0, 7, len(source) - 1])  # Grain's batched read
    assert [r["id"].item() for r in batched] == [
        expected[7],
        expected[0],
        expected[7],
        expected[-1],
    ]
    # What Grain's pipeline makes of it: stacked batches of the same rows.
    ds = grain.MapDataset.source(source).batch(32)
    assert np.concatenate([b["id"] for b in ds]).tolist() == expected


def test_data_source_pipeline_with_mp_prefetch_workers_reads_every_row_once_and_resumes(
    tmp_path,
) -> None:
    uri = write_demo_dataset(tmp_path / "d.lance", rows=300, fragments=3)
    source = DataSource(uri, columns=["id"], filter=FILTER)

    def pipeline() -> grain.IterDataset:
        ds = grain.MapDataset.source(source).shuffle(seed=3).batch(20).to_iter_dataset()
        return ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=2))

    it = iter(pipeline())
    head = [next(it)["id"].tolist() for _ in range(5)]
    state = json.loads(json.dumps(it.get_state()))
    rest = [b["id"].tolist() for b in it]
    it.close()
    ids = [i for b in head + rest for i in b]
    expected = lance.dataset(uri).to_table(filter=FILTER)["id"].to_pylist()
    assert sorted(ids) == sorted(expected) and ids != sorted(ids)  # each once, shuffled
    resumed = iter(pipeline())
    resumed.set_state(state)
    assert [b["id"].tolist() for b in resumed] == rest
    resumed.close()


def test_grain_dataloader_refuses_a_state_of_another_dataset_version(tmp_path) -> None:
    uri = write_demo_dataset(tmp_path / "d.lance", rows=40)
    sampler = grain.samplers.IndexSampler(
        40, shard_options=grain.sharding.NoSharding(), shuffle=True, num_epochs=1, seed=0
    )

    def loader(version: int) -> grain.DataLoader:
        return grain.DataLoader(
            data_source=DataSource(uri, columns=["id"], version=version),
            sampler=sampler,
            worker_count=0,
        )

    it = iter(loader(1))
    first = [int(next(it)["id"]) for _ in range(10)]
    state = it.get_state()
    again = iter(loader(1))
    again.set_state(state)
    assert len({int(r["id"]) for r in again} | set(first)) == 40  # the same rows go on
    lance.write_dataset(demo_table(5), uri, mode="append")
    newer = iter(loader(2))
    with pytest.raises(ValueError, match="version=2"):
        newer.set_state(state)


def reference_stream(uri: str, epochs: int, **kwargs) -> list[list[int]]:
    loader = ll.Loader(uri, **kwargs)
    return [b["id"].tolist() for _ in range(epochs) for b in loader]


SETTINGS = {
    "batch_size": 70,
    "columns": ["id"],
    "shuffle": True,
    "shuffle_block_size": 16,
    "seed": 5,
    "filter": FILTER,
}  # 3 batches per epoch, the last one short


def test_iter_dataset_yields_the_loaders_batches_epoch_after_epoch(small_uri: str) -> None:
    small = {**SETTINGS, "batch_size": 300}
    expected = reference_stream(small_uri, 3, **small)
    assert len(expected) == 9 and expected[:3] != expected[3:6]
    got = [b["id"].tolist() for b in IterDataset(small_uri, num_epochs=3, **small)]
    assert got == expected
    loader = ll.Loader(small_uri, **small)
    from_loader = IterDataset(loader, num_epochs=2).map(lambda b: b["id"].tolist())
    assert list(from_loader) == expected[:6]  # a Grain .map on top
    assert loader.epoch == 0  # the Loader's own cursor did not move


def test_iterator_state_resumes_exactly_at_every_step_across_epochs(small_uri: str) -> None:
    small = {**SETTINGS, "batch_size": 300}
    expected = reference_stream(small_uri, 2, **small)

    def fresh() -> grain.DatasetIterator:
        return iter(IterDataset(small_uri, num_epochs=2, **small))

    it = fresh()
    states = [it.get_state()]
    for _ in expected:
        next(it)
        states.append(it.get_state())
    assert next(it, None) is None
    it.close()
    types = {k: type(v) for k, v in states[0].items()}
    for k, state in enumerate(states):
        assert json.loads(json.dumps(state)) == state
        assert {key: type(v) for key, v in state.items()} == types
        resumed = fresh()
        resumed.set_state(copy.deepcopy(state))
        assert resumed.get_state() == state, f"step {k}: get/set/get drifted"
        assert [b["id"].tolist() for b in resumed] == expected[k:], f"step {k}"
    # A state taken mid-epoch is a Loader state: a Loader continues the same epoch.
    loader = ll.Loader(small_uri, **small)
    loader.load_state_dict(states[4])
    assert [b["id"].tolist() for b in loader] == expected[4:6]
    assert lanceloader_threads() == []


def test_mp_prefetch_over_iter_dataset_keeps_the_loaders_order_and_resumes_across_epochs(
    small_uri: str, tmp_path
) -> None:
    expected = reference_stream(small_uri, 3, **SETTINGS)
    per_epoch = len(expected) // 3
    assert per_epoch % 2 == 1  # odd: the workers' turns shift at each epoch boundary

    def pipeline() -> grain.IterDataset:
        ds = IterDataset(small_uri, num_epochs=3, **SETTINGS)
        return ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=2))

    it = iter(pipeline())
    cut = per_epoch + 1  # mid-epoch 1, after an epoch boundary
    head = [next(it)["id"].tolist() for _ in range(cut)]
    handler = grain.checkpoint.CheckpointHandler()  # what Orbax saves a Grain iterator with
    handler.save(epath.Path(tmp_path), item=it)
    rest = [b["id"].tolist() for b in it]
    it.close()
    assert head + rest == expected
    resumed = handler.restore(epath.Path(tmp_path), item=iter(pipeline()))
    assert [b["id"].tolist() for b in resumed] == rest
    resumed.close()


def test_a_state_of_another_dataset_or_worker_layout_is_refused_naming_the_fix(
    small_uri: str, tmp_path
) -> None:
    other = write_demo_dataset(tmp_path / "other.lance", rows=1000, fragments=3)
    it = iter(IterDataset(small_uri, **SETTINGS))
    next(it)
    state = it.get_state()
    it.close()
    with pytest.raises(ll.StateMismatchError, match="dataset"):
        iter(IterDataset(other, **SETTINGS)).set_state(state)
    with pytest.raises(ll.StateMismatchError, match="seed"):
        iter(IterDataset(small_uri, **{**SETTINGS, "seed": 6})).set_state(state)
    # Grain calls set_slice in each mp_prefetch worker; a worker's state needs the same layout.
    two = IterDataset(small_uri, **SETTINGS)
    two.set_slice(slice(0, None, 2))
    worker_state = iter(two).get_state()
    assert worker_state["grain"] == {"worker": 0, "workers": 2, "delivered": 0}
    three = IterDataset(small_uri, **SETTINGS)
    three.set_slice(slice(0, None, 3))
    with pytest.raises(ll.StateMismatchError, match=r"mp_prefetch\(num_workers=2\)"):
        iter(three).set_state(worker_state)
    with pytest.raises(ll.StateMismatchError, match="expected a state dict"):
        iter(IterDataset(small_uri, **SETTINGS)).set_state(None)
    torch_state = {**state, "worker": {"id": 0, "count": 2, "start": 0, "batches": 1}}
    with pytest.raises(ll.StateMismatchError, match="torch"):
        iter(IterDataset(small_uri, **SETTINGS)).set_state(torch_state)
    with pytest.raises(ValueError, match="output='numpy'"):
        IterDataset(small_uri, output="jax", **{**SETTINGS}).set_slice(slice(1, None, 2))
    with pytest.raises(TypeError, match="set them on the Loader"):
        IterDataset(ll.Loader(small_uri), batch_size=8)
    with pytest.raises(ValueError, match="drop sequential_slice"):
        IterDataset(small_uri, **SETTINGS).set_slice(slice(0, None, 2), sequential_slice=True)
    with pytest.raises(ValueError, match="ragged='list'"):
        DataSource(small_uri, output=ll.Conversion(output="numpy"))
    with pytest.raises(ValueError, match=r"jax\.device_put"):
        DataSource(small_uri, output="jax")


@settings(max_examples=200, deadline=None)
@given(
    epoch=st.integers(0, 3),
    start=st.integers(0, 50),
    first_len=st.integers(0, 5),
    epoch_len=st.integers(1, 5),
    index=st.integers(0, 40),
)
def test_stream_place_is_the_index_th_batch_of_the_concatenated_epochs(
    epoch: int, start: int, first_len: int, epoch_len: int, index: int
) -> None:
    stream = [(epoch, start, b) for b in range(first_len)]
    e = epoch + 1
    while len(stream) <= index:
        stream += [(e, 0, b) for b in range(epoch_len)]
        e += 1
    assert stream_place(epoch, start, first_len, epoch_len, index) == stream[index]


def test_data_source_hands_out_a_binary_column_as_bytes_per_row(tmp_path) -> None:
    """A binary column converts to ll.ByteRows; Grain's records get one bytes object each."""
    import pyarrow as pa

    payloads = [bytes([i]) * (i + 2) for i in range(30)]
    uri = str(tmp_path / "raw.lance")
    lance.write_dataset(pa.table({"raw": pa.array(payloads, pa.large_binary())}), uri)
    source = DataSource(uri)
    assert [source[i]["raw"] for i in range(len(source))] == payloads


def test_data_source_reads_blob_columns_and_video_clips_by_index(tmp_path) -> None:
    """A DataSource takes ``blobs=`` and ``clips=`` as a Loader does: a blob column's rows are
    their payloads (or offsets with "file"), and with clips an index is a clip whose frames are
    the video's (every frame carries its index in its pixels); per-video draws are refused."""
    import lance.blob
    import pyarrow as pa

    from mediagen import frame_index_of, write_video

    datas = [
        write_video(tmp_path / f"v{i}.mp4", n, 12, (48, 64), gop=6).read_bytes()
        for i, n in enumerate([14, 9])
    ]
    uri = str(tmp_path / "videos.lance")
    paths = [f"v{i}.mp4" for i in range(2)]
    table = pa.table({"path": paths, "video": lance.blob.blob_array(datas)})
    lance.write_dataset(table, uri, data_storage_version="2.2")

    assert [DataSource(uri)[i]["video"] for i in range(2)] == datas
    assert DataSource(uri, blobs={"video": "file"})[1]["video"] == 1  # the row offset

    clips = DataSource(uri, clips=ll.video_clips("video", frames=3, stride=2, step=4))
    got = [
        (clips[i]["path"], [frame_index_of(f.transpose(1, 2, 0)) for f in clips[i]["video"]])
        for i in range(len(clips))
    ]
    assert got == [
        ("v0.mp4", [0, 2, 4]),
        ("v0.mp4", [4, 6, 8]),
        ("v0.mp4", [8, 10, 12]),
        ("v1.mp4", [0, 2, 4]),
        ("v1.mp4", [4, 6, 8]),
    ]
    with pytest.raises(ValueError, match="per_video"):
        DataSource(uri, clips=ll.video_clips("video", frames=3, per_video=1))


PIPELINE_SCRIPT = textwrap.dedent("""
    import json, sys

    import grain
    import jax  # noqa: F401  (with JAX imported, Grain 0.2.18 read an unparsed absl flag)

    import lanceloader as ll
    from lanceloader.grain import IterDataset

    S = dict(batch_size=70, columns=["id"], shuffle=True, shuffle_block_size=16, seed=5,
             filter="label != 3")


    def firsts(batches):
        return [int(b["id"][0]) for b in batches]


    def run(ds, workers):
        it = iter(ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers)))
        try:
            return firsts(it)
        finally:
            it.close()


    def main(uri, out):
        loader = ll.Loader(uri, **S)
        expected = [int(b["id"][0]) for _ in range(2) for b in loader]
        it = iter(IterDataset(uri, num_epochs=2, **S).mp_prefetch(
            grain.MultiprocessingOptions(num_workers=2)))
        head = [int(next(it)["id"][0]) for _ in range(5)]
        state = json.loads(json.dumps(it.get_state()))
        rest = firsts(it)
        it.close()
        ds = IterDataset(uri, num_epochs=2, **S)  # 1 worker, from the pipeline's Loader state
        ds.loader.load_state_dict(ds.loader_state(state))
        resumed = run(ds, 1)
        keep = lambda b: int(b["id"][0]) % 2 == 0
        after = IterDataset(uri, num_epochs=2, **S).mp_prefetch(
            grain.MultiprocessingOptions(num_workers=2)).filter(keep)
        it = iter(after)
        filter_after = firsts(it)
        it.close()
        filter_before = run(IterDataset(uri, num_epochs=2, **S).filter(keep), 2)
        with open(out, "w") as f:
            json.dump({"expected": expected, "head": head, "rest": rest, "resumed": resumed,
                       "after": filter_after, "before": filter_before}, f)


    if __name__ == "__main__":
        main(sys.argv[1], sys.argv[2])
""")


def test_mp_prefetch_in_a_script_needs_no_workaround_prints_nothing_and_resumes_anywhere(
    small_uri: str, tmp_path
) -> None:
    """A plain script (JAX imported, no absl flags parsed, pipelines in a function, iterators
    closed) runs mp_prefetch pipelines and prints nothing: no absl error, no tracebacks, no
    leaked shared memory at exit. Its batches are the Loader's; a state of 2 workers continues
    with 1 through the Loader state; a filter after mp_prefetch keeps the Loader's order,
    one before it gives the same batches in another order (as the guide says)."""
    script = tmp_path / "train.py"
    script.write_text(PIPELINE_SCRIPT)
    out = tmp_path / "out.json"
    run = subprocess.run(
        [sys.executable, str(script), small_uri, str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert run.returncode == 0 and run.stderr == "" and run.stdout == "", run.stderr[-3000:]
    got = json.loads(out.read_text())
    expected = got["expected"]
    assert got["head"] + got["rest"] == expected
    assert got["resumed"] == expected[5:]
    kept = [i for i in expected if i % 2 == 0]
    assert got["after"] == kept
    assert sorted(got["before"]) == sorted(kept) and got["before"] != kept


def test_loader_state_of_worker_states_continues_the_stream_or_names_why_not(
    small_uri: str,
) -> None:
    """The Loader state of an mp_prefetch pipeline is the origin plus the batches its workers
    delivered in turns (Grain's interleave state holds one state per worker); workers that did
    not take turns (a filter before mp_prefetch) are refused, naming the fix."""
    expected = reference_stream(small_uri, 2, **SETTINGS)

    def worker_state(worker: int, delivered: int) -> dict:
        ds = IterDataset(small_uri, num_epochs=2, **SETTINGS)
        ds.set_slice(slice(worker, None, 2))
        it = iter(ds)
        got = [next(it)["id"].tolist() for _ in range(delivered)]
        assert got == expected[worker : 2 * delivered : 2][:delivered]
        it.close()
        return json.loads(json.dumps(it.get_state()))

    for head in (0, 3, 4):  # before any batch, mid-epoch, past the epoch's end (3 per epoch)
        states = [worker_state(0, (head + 1) // 2), worker_state(1, head // 2)]
        ds = IterDataset(small_uri, num_epochs=2, **SETTINGS)
        ds.loader.load_state_dict(ds.loader_state({"iterators_in_use_states": states}))
        assert [b["id"].tolist() for b in ds] == expected[head:], head
    uneven = {"iterators_in_use_states": [worker_state(0, 2), worker_state(1, 0)]}
    with pytest.raises(ll.StateMismatchError, match=r"not in turns .*num_workers=2"):
        IterDataset(small_uri, num_epochs=2, **SETTINGS).loader_state(uneven)
    with pytest.raises(ll.StateMismatchError, match="holds no lanceloader IterDataset state"):
        IterDataset(small_uri, **SETTINGS).loader_state({"iterators_in_use_states": [{}, {}]})
