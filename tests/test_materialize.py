"""materialize(): the loader's epoch as a new dataset, with the same rows; resumable after a
SIGKILL, never a half version visible; lineage recorded and shown."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa
import pytest

import lanceloader as ll
from conftest import ids_of
from lanceloader.cli import main
from lanceloader.demo import write_demo_dataset
from lanceloader.write.materialize import PROGRESS_FILE, Job

SETTINGS = dict(batch_size=100, columns=["id", "label", "x"], filter="label < 7",
                splits={"a": 0.8, "b": 0.2}, split="a", shuffle=True, seed=4)


@pytest.fixture(scope="module")
def uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_demo_dataset(tmp_path_factory.mktemp("m") / "d.lance", rows=5000, fragments=3)


def test_the_copy_holds_the_loaders_epoch_in_order(uri, tmp_path):
    loader = ll.Loader(uri, **SETTINGS)
    want = ll.Loader(uri, **SETTINGS)
    for epoch in (0, 1):
        copy = ll.materialize(loader, tmp_path / f"e{epoch}.lance", epoch=epoch,
                              rows_per_fragment=1000)
        want.set_epoch(epoch)
        expected = [b for b in want]
        table = copy.to_table()
        assert table["id"].to_pylist() == ids_of(expected)
        x = np.concatenate([b["x"] for b in expected])
        assert np.array_equal(np.stack(table["x"].to_numpy(zero_copy_only=False)), x)
        assert len(copy.get_fragments()) == -(-table.num_rows // 1000)
    first = lance.dataset(tmp_path / "e0.lance").to_table()["id"].to_pylist()
    assert first != table["id"].to_pylist() and sorted(first) == sorted(table["id"].to_pylist())


def test_lineage_is_recorded_and_inspect_shows_it(uri, tmp_path, capsys):
    loader = ll.Loader(uri, **SETTINGS, transform=ll.map_rows(lambda row: row))
    copy = ll.materialize(loader, tmp_path / "c.lance")
    facts = json.loads(copy.schema.metadata[b"lanceloader.lineage"])
    assert facts["source"] == loader.source.uri and facts["version"] == loader.source.version
    assert facts["identity"] == loader.source.identity and facts["filter"] == "label < 7"
    assert facts["order"]["seed"] == 4 and facts["order"]["shuffle"] is True
    assert facts["transform"] and facts["split"] == "a" and facts["epoch"] == 0
    assert main(["inspect", str(tmp_path / "c.lance")]) == 0
    out = capsys.readouterr().out
    assert "materialised from" in out and loader.source.uri in out


def to_images(batch: pa.RecordBatch) -> dict:
    """A transform whose output is N-d arrays: x as 8x8 'images', plus the id."""
    x = np.stack(batch.column("x").to_numpy(zero_copy_only=False)).reshape(-1, 8, 8)
    return {"id": batch.column("id").to_numpy(), "image": x * 2}


def test_a_transform_returning_nd_arrays_is_stored_and_reads_back(uri, tmp_path):
    loader = ll.Loader(uri, batch_size=64, columns=["id", "x"], transform=to_images)
    ll.materialize(loader, tmp_path / "t.lance")
    batch = next(iter(ll.Loader(tmp_path / "t.lance", batch_size=64)))
    want = next(iter(loader))
    assert batch["image"].shape == (64, 8, 8)
    assert np.array_equal(batch["image"], want["image"])


KILLER = """
import os, signal, sys
import lanceloader as ll

def die_late(batch):
    if int(batch.column("id")[0].as_py()) == int(os.environ["KILL_AT_ID"]):
        os.kill(os.getpid(), signal.SIGKILL)
    return batch

uri, out = sys.argv[1], sys.argv[2]
settings = dict(batch_size=100, columns=["id", "label", "x"], shuffle=True, seed=9,
                shuffle_block_size=100, transform=die_late)
ll.materialize(ll.Loader(uri, num_workers=1, **settings), out, rows_per_fragment=500)
"""


def test_a_run_killed_midway_resumes_to_the_same_dataset(uri, tmp_path):
    script = tmp_path / "run.py"
    script.write_text(KILLER)
    order = ll.Loader(uri, batch_size=100, columns=["id"], shuffle=True, seed=9,
                      shuffle_block_size=100)
    firsts = [int(b["id"][0]) for b in order]
    out = tmp_path / "out.lance"
    env = {**os.environ, "KILL_AT_ID": str(firsts[27])}  # during the 6th piece of 500 rows
    killed = subprocess.run([sys.executable, str(script), uri, str(out)], env=env,
                            capture_output=True, text=True, timeout=300)
    assert killed.returncode == -9, killed.stderr
    with pytest.raises((ValueError, OSError)):
        lance.dataset(out)  # no version visible
    progress = json.loads((out / PROGRESS_FILE).read_text())
    assert 1 <= len(progress["pieces"]) <= 5
    env["KILL_AT_ID"] = "-1"
    resumed = subprocess.run([sys.executable, str(script), uri, str(out)], env=env,
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert not (out / PROGRESS_FILE).exists()
    whole = tmp_path / "whole.lance"
    clean = subprocess.run([sys.executable, str(script), uri, str(whole)], env=env,
                           capture_output=True, text=True, timeout=300)
    assert clean.returncode == 0, clean.stderr
    got, want = lance.dataset(out), lance.dataset(whole)
    assert got.version == 1 and got.to_table().equals(want.to_table())
    assert got.count_rows() == 5000


def test_a_second_run_into_the_same_output_fails_at_once(uri, tmp_path):
    loader = ll.Loader(uri, batch_size=100, columns=["id"])
    out = tmp_path / "busy.lance"
    # A run in progress holds the lock.
    with Job.start(loader, out, 0, "create", 1000), \
            pytest.raises(RuntimeError, match="another materialize is writing"):
        ll.materialize(loader, out)
    assert ll.materialize(loader, out).count_rows() == 5000  # released: the next run proceeds


def test_modes_and_an_empty_epoch(uri, tmp_path):
    loader = ll.Loader(uri, batch_size=100, columns=["id"])
    ll.materialize(loader, tmp_path / "o.lance")
    with pytest.raises(FileExistsError, match="mode='overwrite'"):
        ll.materialize(loader, tmp_path / "o.lance")
    again = ll.materialize(ll.Loader(uri, batch_size=100, columns=["id"], filter="id < 10"),
                           tmp_path / "o.lance", mode="overwrite")
    assert again.version == 2 and again.count_rows() == 10
    with pytest.raises(ValueError, match="no rows"):
        ll.materialize(ll.Loader(uri, batch_size=10, filter="id < 0"), tmp_path / "e.lance")
    with pytest.raises(ValueError, match="mode must be one of"):
        ll.materialize(loader, tmp_path / "x.lance", mode="append")


def test_changed_settings_do_not_reuse_pieces_of_another_run(uri, tmp_path):
    out = tmp_path / "o.lance"
    out.mkdir()
    (out / PROGRESS_FILE).write_text(json.dumps({"fingerprint": "other", "pieces": {"0": []}}))
    copy = ll.materialize(ll.Loader(uri, batch_size=100, columns=["id"]), out)
    assert copy.to_table()["id"].to_pylist() == list(range(5000))
    assert Path(out).exists()


def test_a_mix_and_a_packed_loader_materialise_their_epoch(tmp_path):
    """The pretraining stream (mixed, packed) written once holds exactly what it delivers."""
    uris = {}
    for name, rows in (("a", 100), ("b", 300)):
        uris[name] = str(tmp_path / f"{name}.lance")
        lance.write_dataset(pa.table({
            "id": np.arange(rows) + (1000 if name == "a" else 2000),
            "input_ids": pa.array([[i] * (i % 7 + 1) for i in range(rows)],
                                  pa.list_(pa.int32()))}), uris[name])
    mix = ll.Mix({"a": ll.Loader(uris["a"], columns=["id"], shuffle=True, seed=1),
                  "b": ll.Loader(uris["b"], columns=["id"])}, weights={"a": 1, "b": 3},
                 source_column="source")
    mixed = ll.Loader(mix, batch_size=16)
    copy = ll.materialize(mixed, tmp_path / "mix.lance", progress=False).to_table()
    assert copy["id"].to_pylist() == np.concatenate([b["id"] for b in mixed]).tolist()
    assert copy["source"].to_pylist() == (copy["id"].to_numpy() // 1000 - 1).tolist()
    packed = ll.Loader(uris["b"], columns=["input_ids"], batch_size=4,
                       pack=ll.pack("input_ids", seq_len=16))
    rows = ll.materialize(packed, tmp_path / "packed.lance", progress=False).to_table()
    want = [b for b in packed]
    for name in ("input_ids", "segment_ids", "position_ids"):
        got = np.stack(rows[name].to_numpy(zero_copy_only=False))
        assert np.array_equal(got, np.concatenate([b[name] for b in want]))


def test_a_decoded_chw_copy_reads_back_as_the_loader_made_it(tmp_path):
    """decode_images(layout="CHW") writes a fixed-shape tensor column with a permutation; the
    copy must open and give the arrays the loader gave (it raised NotImplementedError)."""
    from PIL import Image

    def png(i: int) -> bytes:
        buf = io.BytesIO()
        pixels = np.random.default_rng(i).integers(0, 256, (12, 10, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(buf, format="PNG")
        return buf.getvalue()

    lance.write_dataset(pa.table({"id": np.arange(20), "image": [png(i) for i in range(20)]}),
                        tmp_path / "imgs.lance")
    decode = ll.decode_images("image", size=(8, 8), layout="CHW")
    loader = ll.Loader(tmp_path / "imgs.lance", batch_size=8, transform=decode)
    ll.materialize(loader, tmp_path / "decoded.lance")
    for output in ("numpy", "torch"):
        copy = ll.Loader(tmp_path / "decoded.lance", batch_size=8, output=output)
        got, want = list(copy), list(loader)
        assert [tuple(b["image"].shape) for b in got] == [(8, 3, 8, 8)] * 2 + [(4, 3, 8, 8)]
        for a, b in zip(got, want, strict=True):
            assert np.array_equal(np.asarray(a["image"]), b["image"])
