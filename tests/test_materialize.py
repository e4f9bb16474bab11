"""materialize(): the loader's epoch as a new dataset, with the same rows; resumable after a
SIGKILL, never a half version visible, never resumed with another transform; lineage recorded
and shown; nothing of its own left inside the dataset."""

from __future__ import annotations

import io
import json
import os
import re
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
from lanceloader.write.materialize import Job, progress_path

SETTINGS = dict(
    batch_size=100,
    columns=["id", "label", "x"],
    filter="label < 7",
    splits={"a": 0.8, "b": 0.2},
    split="a",
    shuffle=True,
    seed=4,
)


@pytest.fixture(autouse=True)
def cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Progress records and locks go to this test's own cache directory (subprocesses too)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_demo_dataset(tmp_path_factory.mktemp("m") / "d.lance", rows=5000, fragments=3)


def test_the_copy_holds_the_loaders_epoch_in_order(uri, tmp_path):
    loader = ll.Loader(uri, **SETTINGS)
    want = ll.Loader(uri, **SETTINGS)
    for epoch in (0, 1):
        copy = ll.materialize(
            loader, tmp_path / f"e{epoch}.lance", epoch=epoch, rows_per_fragment=1000
        )
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
    order = ll.Loader(
        uri, batch_size=100, columns=["id"], shuffle=True, seed=9, shuffle_block_size=100
    )
    firsts = [int(b["id"][0]) for b in order]
    out = tmp_path / "out.lance"
    env = {**os.environ, "KILL_AT_ID": str(firsts[27])}  # during the 6th piece of 500 rows
    killed = subprocess.run(
        [sys.executable, str(script), uri, str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert killed.returncode == -9, killed.stderr
    with pytest.raises((ValueError, OSError)):
        lance.dataset(out)  # no version visible
    progress = json.loads(progress_path(str(out)).read_text())
    assert 1 <= len(progress["pieces"]) <= 5
    env["KILL_AT_ID"] = "-1"
    resumed = subprocess.run(
        [sys.executable, str(script), uri, str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr
    assert not progress_path(str(out)).exists()
    whole = tmp_path / "whole.lance"
    clean = subprocess.run(
        [sys.executable, str(script), uri, str(whole)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert clean.returncode == 0, clean.stderr
    got, want = lance.dataset(out), lance.dataset(whole)
    assert got.version == 1 and got.to_table().equals(want.to_table())
    assert got.count_rows() == 5000


def test_a_second_run_into_the_same_output_fails_at_once(uri, tmp_path):
    loader = ll.Loader(uri, batch_size=100, columns=["id"])
    out = tmp_path / "busy.lance"
    # A run in progress holds the lock.
    with (
        Job.start(loader, out, 0, "create", 1000),
        pytest.raises(RuntimeError, match="another materialize is writing"),
    ):
        ll.materialize(loader, out)
    assert ll.materialize(loader, out).count_rows() == 5000  # released: the next run proceeds


def test_modes_and_an_empty_epoch(uri, tmp_path):
    loader = ll.Loader(uri, batch_size=100, columns=["id"])
    ll.materialize(loader, tmp_path / "o.lance")
    with pytest.raises(FileExistsError, match="mode='overwrite'"):
        ll.materialize(loader, tmp_path / "o.lance")
    again = ll.materialize(
        ll.Loader(uri, batch_size=100, columns=["id"], filter="id < 10"),
        tmp_path / "o.lance",
        mode="overwrite",
    )
    assert again.version == 2 and again.count_rows() == 10
    with pytest.raises(ValueError, match="no rows"):
        ll.materialize(ll.Loader(uri, batch_size=10, filter="id < 0"), tmp_path / "e.lance")
    with pytest.raises(ValueError, match="mode must be one of"):
        ll.materialize(loader, tmp_path / "x.lance", mode="append")


def test_changed_settings_are_refused_naming_both_or_restarted(uri, tmp_path):
    """A record of an unfinished run with other settings is refused (it was silently dropped,
    leaving its pieces' files behind); restart=True removes those files and starts over."""
    out = tmp_path / "o.lance"

    def fail_in_piece_two(batch):
        if int(batch.column("id")[0].as_py()) >= 1000:
            raise RuntimeError("worker lost")
        return batch

    with pytest.raises(RuntimeError, match="worker lost"):
        ll.materialize(
            ll.Loader(
                uri, batch_size=100, columns=["id"], filter="id < 4000", transform=fail_in_piece_two
            ),
            out,
            rows_per_fragment=500,
        )
    first = set(os.listdir(out / "data"))
    assert len(first) == 2  # two pieces written and recorded
    other = ll.Loader(uri, batch_size=100, columns=["id"])
    with pytest.raises(
        ValueError,
        match=r"other settings: filter: 'id < 4000' then, None now; "
        r"transform: .*fail_in_piece_two.* then, None now.*"
        r"restart=True",
    ):
        ll.materialize(other, out, rows_per_fragment=500)
    copy = ll.materialize(other, out, rows_per_fragment=500, restart=True)
    assert copy.to_table()["id"].to_pylist() == list(range(5000))
    assert not first & set(os.listdir(out / "data"))  # the old pieces' files are gone


def test_nothing_of_its_own_is_left_inside_the_dataset(uri, tmp_path, cache_home):
    """Only Lance's files in the committed copy (its .lock file stayed there), and the lock
    and record in the cache directory are gone too."""
    out = tmp_path / "clean.lance"
    ll.materialize(ll.Loader(uri, batch_size=100, columns=["id"]), out, rows_per_fragment=1000)
    names = {p.relative_to(out).parts[0] for p in out.rglob("*")}
    assert names <= {"_versions", "_transactions", "data", "_indices", "_deletions"}, names
    assert not [p for p in cache_home.rglob("*") if p.is_file()]


def test_a_transform_counts_by_its_value():
    """The resume check's identity: class and parameters, function code and plain closure
    values; a closure's lists are state (a counter), not parameters."""

    def scaled(factor):
        return lambda batch: batch * factor

    from lanceloader.write.identity import transform_identity

    calls: list[int] = []

    def counting(batch):
        calls.append(1)
        return batch

    ident = lambda t: transform_identity(t)[1]  # noqa: E731
    decode = ll.decode_images("image", dtype="float32", mean=[0.5] * 3, std=[0.25] * 3)
    assert ident(decode) == ident(
        ll.decode_images("image", dtype="float32", mean=[0.5] * 3, std=[0.25] * 3)
    )
    assert ident(decode) != ident(
        ll.decode_images("image", dtype="float32", mean=[0.0] * 3, std=[0.25] * 3)
    )
    assert "mean=(0.5, 0.5, 0.5)" in transform_identity(decode)[0]
    assert ident(scaled(1.0)) == ident(scaled(1.0)) != ident(scaled(2.0))
    before = ident(counting)
    counting(None)
    assert ident(counting) == before  # its list grew: state, not a parameter
    assert ident(ll.compose(decode, counting)) != ident(ll.compose(counting, decode))
    assert ident(ll.map_rows(str)) != ident(ll.map_rows(repr))


CHANGED = """
import os, signal, sys
import lanceloader as ll

class Scale:
    def __init__(self, factor):
        self.factor = factor

    def __call__(self, batch):
        ids = batch["id"].to_numpy()
        return {"id": ids, "scaled": ids * self.factor}

def die_late(batch):
    if int(batch["id"][0]) == int(os.environ["KILL_AT_ID"]):
        os.kill(os.getpid(), signal.SIGKILL)
    return batch

uri, out, kind, value = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
if kind == "decode":
    first = ll.decode_images("image", dtype="float32", mean=[value] * 3, std=[0.25] * 3)
else:
    first = Scale(value)
loader = ll.Loader(uri, batch_size=20, columns=["id", "image"], num_workers=1,
                   transform=ll.compose(first, die_late))
try:
    ll.materialize(loader, out, rows_per_fragment=40)
except ValueError as exc:
    print(exc)
    sys.exit(3)
"""


@pytest.mark.parametrize(
    ("kind", "then", "now", "says"),
    [
        (
            "decode",
            0.5,
            0.0,
            (r"mean=\(0\.5, 0\.5, 0\.5\).* then, .*mean=\(0\.0, 0\.0, 0\.0\).* now"),
        ),
        ("scale", 1.0, 2.0, r"Scale\(factor=1\.0\).* then, .*Scale\(factor=2\.0\).* now"),
    ],
)
def test_a_killed_run_is_not_resumed_with_another_transform(tmp_path, kind, then, now, says):
    """Killed half-way and rerun with other parameters, it mixed rows transformed both ways
    (the resume check knew the transform by its class name only)."""
    from PIL import Image

    def png(i: int) -> bytes:
        buf = io.BytesIO()
        Image.fromarray(np.full((4, 4, 3), i, np.uint8)).save(buf, format="PNG")
        return buf.getvalue()

    data = tmp_path / "imgs.lance"
    lance.write_dataset(
        pa.table({"id": np.arange(200), "image": [png(i) for i in range(200)]}), data
    )
    script = tmp_path / "run.py"
    script.write_text(CHANGED)
    out = tmp_path / "copy.lance"
    env = {**os.environ, "KILL_AT_ID": "100"}  # in the 3rd piece of 40 rows

    def run(value: float) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, str(script), str(data), str(out), kind, str(value)],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )

    assert run(then).returncode == -9
    env["KILL_AT_ID"] = "-1"
    refused = run(now)
    assert refused.returncode == 3, refused.stderr
    assert re.search(says, refused.stdout), refused.stdout
    with pytest.raises((ValueError, OSError)):
        lance.dataset(out)  # nothing committed
    resumed = run(then)  # the first run's transform resumes it
    assert resumed.returncode == 0, resumed.stderr
    lineage = json.loads(lance.dataset(out).schema.metadata[b"lanceloader.lineage"])
    assert str(then) in lineage["transform"] and lineage["transform_id"]


def test_a_mix_and_a_packed_loader_materialise_their_epoch(tmp_path):
    """The pretraining stream (mixed, packed) written once holds exactly what it delivers."""
    uris = {}
    for name, rows in (("a", 100), ("b", 300)):
        uris[name] = str(tmp_path / f"{name}.lance")
        lance.write_dataset(
            pa.table(
                {
                    "id": np.arange(rows) + (1000 if name == "a" else 2000),
                    "input_ids": pa.array(
                        [[i] * (i % 7 + 1) for i in range(rows)], pa.list_(pa.int32())
                    ),
                }
            ),
            uris[name],
        )
    mix = ll.Mix(
        {
            "a": ll.Loader(uris["a"], columns=["id"], shuffle=True, seed=1),
            "b": ll.Loader(uris["b"], columns=["id"]),
        },
        weights={"a": 1, "b": 3},
        source_column="source",
    )
    mixed = ll.Loader(mix, batch_size=16)
    copy = ll.materialize(mixed, tmp_path / "mix.lance", progress=False).to_table()
    assert copy["id"].to_pylist() == np.concatenate([b["id"] for b in mixed]).tolist()
    assert copy["source"].to_pylist() == (copy["id"].to_numpy() // 1000 - 1).tolist()
    packed = ll.Loader(
        uris["b"], columns=["input_ids"], batch_size=4, pack=ll.pack("input_ids", seq_len=16)
    )
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

    lance.write_dataset(
        pa.table({"id": np.arange(20), "image": [png(i) for i in range(20)]}),
        tmp_path / "imgs.lance",
    )
    decode = ll.decode_images("image", size=(8, 8), layout="CHW")
    loader = ll.Loader(tmp_path / "imgs.lance", batch_size=8, transform=decode)
    ll.materialize(loader, tmp_path / "decoded.lance")
    for output in ("numpy", "torch"):
        copy = ll.Loader(tmp_path / "decoded.lance", batch_size=8, output=output)
        got, want = list(copy), list(loader)
        assert [tuple(b["image"].shape) for b in got] == [(8, 3, 8, 8)] * 2 + [(4, 3, 8, 8)]
        for a, b in zip(got, want, strict=True):
            assert np.array_equal(np.asarray(a["image"]), b["image"])
