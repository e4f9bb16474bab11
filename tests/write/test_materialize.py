"""materialize(): the loader's epoch as a new dataset, with the same rows; resumable after a
SIGKILL, never a half version visible, never resumed with another transform; lineage recorded
and shown; nothing of its own left inside the dataset."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
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
        ).dataset
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
    copy = ll.materialize(loader, tmp_path / "c.lance").dataset
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
    assert ll.materialize(loader, out).rows == 5000  # released: the next run proceeds


def test_modes_and_an_empty_epoch(uri, tmp_path, cache_home):
    loader = ll.Loader(uri, batch_size=100, columns=["id"])
    ll.materialize(loader, tmp_path / "o.lance")
    with pytest.raises(FileExistsError, match="mode='overwrite'"):
        ll.materialize(loader, tmp_path / "o.lance")
    again = ll.materialize(
        ll.Loader(uri, batch_size=100, columns=["id"], filter="id < 10"),
        tmp_path / "o.lance",
        mode="overwrite",
    )
    assert again.version == 2 and again.rows == 10
    with pytest.raises(ValueError, match="no rows"):
        ll.materialize(ll.Loader(uri, batch_size=10, filter="id < 0"), tmp_path / "e.lance")
    assert not [p for p in cache_home.rglob("*") if p.is_file()]  # no record of nothing
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
    assert copy.dataset.to_table()["id"].to_pylist() == list(range(5000))
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
    """The resume check's identity: class and parameters, function code and closure values;
    a closure's list counts by its items (a counter that has grown is another transform)."""

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
    assert ident(counting) != before  # its list grew: the transform may act otherwise
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
    copy = ll.materialize(mixed, tmp_path / "mix.lance", progress=False).dataset.to_table()
    assert copy["id"].to_pylist() == np.concatenate([b["id"] for b in mixed]).tolist()
    assert copy["source"].to_pylist() == (copy["id"].to_numpy() // 1000 - 1).tolist()
    packed = ll.Loader(
        uris["b"], columns=["input_ids"], batch_size=4, pack=ll.pack("input_ids", seq_len=16)
    )
    rows = ll.materialize(packed, tmp_path / "packed.lance", progress=False).dataset.to_table()
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


RESUMED = """
import json, os, signal, sys
import lanceloader as ll

def die_late(batch):
    if int(batch.column("id")[0].as_py()) == int(os.environ["KILL_AT_ID"]):
        os.kill(os.getpid(), signal.SIGKILL)
    return batch

uri, out = sys.argv[1], sys.argv[2]
loader = ll.Loader(uri, batch_size=100, columns=["id", "x"], shuffle=True, seed=3,
                   num_workers=1, transform=die_late)
summary = ll.materialize(loader, out, rows_per_fragment=500)
print(json.dumps({"rows": summary.rows, "pieces": summary.pieces, "resumed": summary.resumed,
                  "redone": summary.redone, "fragments": summary.fragments,
                  "text": str(summary)}))
"""


@pytest.mark.parametrize("damage", ["removed", "truncated"])
def test_a_resumed_run_writes_again_the_pieces_whose_files_are_gone(uri, tmp_path, damage):
    """Killed half-way, its output removed (rm -rf), run again: it trusted the record in the
    cache directory, committed fragments whose data files did not exist, and every read of
    the copy then failed 'Not found'."""
    script = tmp_path / "run.py"
    script.write_text(RESUMED)
    order = ll.Loader(uri, batch_size=100, columns=["id"], shuffle=True, seed=3)
    firsts = [int(b["id"][0]) for b in order]
    out = tmp_path / "out.lance"

    def run(kill_at: int) -> subprocess.CompletedProcess:
        env = {**os.environ, "KILL_AT_ID": str(kill_at)}
        return subprocess.run(
            [sys.executable, str(script), uri, str(out)],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )

    assert run(firsts[27]).returncode == -9  # during the 6th piece of 500 rows
    recorded = json.loads(progress_path(str(out)).read_text())["pieces"]
    assert len(recorded) == 5
    if damage == "removed":
        shutil.rmtree(out)
    else:  # one recorded file cut short: not what was recorded
        name = recorded["2"]["fragments"][0]["files"][0]["path"]
        with open(out / "data" / name, "r+b") as file:
            file.truncate(100)
    done = run(-1)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    redone = 5 if damage == "removed" else 1
    assert (summary["resumed"], summary["redone"]) == (5 - redone, redone), summary
    pieces = "1 piece" if redone == 1 else f"{redone} pieces"
    assert f"wrote again {pieces} whose files were missing or changed" in summary["text"]
    got = lance.dataset(out)
    assert got.version == 1 and got.count_rows() == 5000 == summary["rows"]
    want = ll.materialize(
        ll.Loader(uri, batch_size=100, columns=["id", "x"], shuffle=True, seed=3),
        tmp_path / "whole.lance",
        rows_per_fragment=500,
    )
    assert got.to_table().equals(want.dataset.to_table())  # every file there, every row read
    kept = {os.path.basename(f.path) for fr in got.get_fragments() for f in fr.data_files()}
    assert set(os.listdir(out / "data")) == kept  # the cut-short and damaged files are gone


def test_the_summary_says_what_was_written_and_keeps_the_dataset(uri, tmp_path):
    """materialize returned a bare LanceDataset where convert returns a readable summary."""
    summary = ll.materialize(
        ll.Loader(uri, batch_size=100, columns=["id"]), tmp_path / "s.lance", rows_per_fragment=1000
    )
    assert isinstance(summary, ll.MaterializeSummary)
    assert (summary.rows, summary.fragments, summary.pieces, summary.version) == (5000, 5, 5, 1)
    assert summary.uri == str(tmp_path / "s.lance") and summary.resumed == 0
    assert summary.nbytes == sum(p.stat().st_size for p in (tmp_path / "s.lance/data").iterdir())
    assert summary.dataset.count_rows() == 5000 == lance.dataset(summary.uri).count_rows()
    assert str(summary).startswith(
        f"materialized 5,000 rows in 5 fragments ({summary.nbytes / 1e6:,.1f} MB) to "
        f"{summary.uri!r}, version 1"
    )


GLOBALS = """
import os, signal, sys, types
import numpy as np
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
import config
import lanceloader as ll

uri, out, kind, value = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
K = [value]
A = np.array([value])
NS = types.SimpleNamespace(k=value)

def die_late(batch):
    if int(batch["id"][0]) == int(os.environ["KILL_AT_ID"]):
        os.kill(os.getpid(), signal.SIGKILL)
    return batch["id"].to_numpy()

def factor():
    return K[0]

def by_list(batch):
    return {"y": die_late(batch) * K[0]}

def by_array(batch):
    return {"y": die_late(batch) * A[0]}

def by_namespace(batch):
    return {"y": die_late(batch) * NS.k}

def by_helper(batch):
    return {"y": die_late(batch) * factor()}

def by_config(batch):
    return {"y": die_late(batch) * config.K}

transform = {"list": by_list, "array": by_array, "namespace": by_namespace,
             "helper": by_helper, "config": by_config}[kind]
loader = ll.Loader(uri, batch_size=100, columns=["id"], num_workers=1, transform=transform)
try:
    ll.materialize(loader, out, rows_per_fragment=500)
except ValueError as exc:
    print(exc)
    sys.exit(3)
"""


@pytest.mark.parametrize("kind", ["list", "array", "namespace", "helper", "config"])
def test_a_changed_global_the_transform_reads_is_another_transform(uri, tmp_path, kind):
    """A module global list K = [1.0] (or an array, a SimpleNamespace, a helper function, an
    attribute of an imported config module) read by the transform: killed half-way, changed
    to 2.0 and rerun, the copy held 2,700 rows x1 and 2,300 rows x2."""
    script = tmp_path / "run.py"
    script.write_text(GLOBALS)
    out = tmp_path / "out.lance"

    def run(value: float, kill_at: int) -> subprocess.CompletedProcess:
        (tmp_path / "config.py").write_text(f"K = {value}\n")
        env = {**os.environ, "KILL_AT_ID": str(kill_at), "PYTHONDONTWRITEBYTECODE": "1"}
        return subprocess.run(
            [sys.executable, str(script), uri, str(out), kind, str(value)],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )

    assert run(1.0, 2700).returncode == -9  # in the 6th piece of 500 rows
    refused = run(2.0, -1)
    assert refused.returncode == 3, refused.stderr
    assert "had other settings: transform" in refused.stdout
    assert "restart=True" in refused.stdout
    with pytest.raises((ValueError, OSError)):
        lance.dataset(out)  # nothing committed
    resumed = run(1.0, -1)  # the same value again: the pieces are reused
    assert resumed.returncode == 0, resumed.stderr
    assert lance.dataset(out).to_table()["y"].to_pylist() == [float(i) for i in range(5000)]


class Shift:
    offset = 1.0  # a class attribute the method reads

    def __init__(self, scale: float) -> None:
        self.scale = scale

    def __call__(self, batch):
        return batch * self.scale + self.offset


def test_closures_defaults_class_attributes_and_methods_count_by_value(monkeypatch):
    """Siblings of the globals hole: what a transform reads through its closure, defaults,
    its class, or the object a method is bound to, counts by value."""
    from lanceloader.write.identity import identify

    def ident(t):
        found = identify(t)
        assert found.doubts == ()
        return found.identity

    weights = [1.0]

    def closed(batch):
        return batch * weights[0]

    def defaulted(batch, table=np.array([1.0])):  # noqa: B008 (a default read as a value)
        return batch * table[0]

    shift = Shift(2.0)
    rng = np.random.default_rng(0)
    before = [ident(t) for t in (closed, defaulted, shift, shift.__call__, rng.permutation)]
    weights[0] = 2.0
    defaulted.__defaults__[0][0] = 2.0
    monkeypatch.setattr(Shift, "offset", 2.0)
    rng.random()  # the generator the bound method uses moved on
    after = [ident(t) for t in (closed, defaulted, shift, shift.__call__, rng.permutation)]
    assert [a != b for a, b in zip(before, after, strict=True)] == [True] * 5
    assert ident(Shift(2.0)) == ident(Shift(2.0)) != ident(Shift(3.0))


def test_a_transform_whose_value_cannot_be_read_is_never_resumed(uri, tmp_path):
    """When the identity cannot be sure (here: a lock it holds), an unfinished run is refused,
    offering restart=True, instead of being resumed with what may be another transform."""
    import threading

    from lanceloader.write.identity import identify

    lock = threading.Lock()
    flag = tmp_path / "fail"
    flag.touch()

    def locked(batch):
        with lock:
            if flag.exists() and int(batch.column("id")[0].as_py()) >= 1000:
                raise RuntimeError("worker lost")
        return batch

    assert "a _thread.lock that cannot be read" in identify(locked).doubts[0]
    out = tmp_path / "o.lance"
    loader = ll.Loader(uri, batch_size=100, columns=["id"], transform=locked)
    with pytest.raises(RuntimeError, match="worker lost"):
        ll.materialize(loader, out, rows_per_fragment=500)
    flag.unlink()
    with pytest.raises(ValueError, match=r"cannot be resumed.*_thread\.lock.*restart=True"):
        ll.materialize(loader, out, rows_per_fragment=500)
    summary = ll.materialize(loader, out, rows_per_fragment=500, restart=True)
    assert summary.rows == 5000 and summary.resumed == 0 and summary.removed[0] == 2


SCALE = [1.0]  # read by a mix source's transform


def scaled(batch):
    return pa.table({"id": batch.column("id"), "y": pc.multiply(batch.column("id"), SCALE[0])})


def test_a_mix_sources_transforms_are_part_of_what_must_match(tmp_path, monkeypatch):
    """A mix's sources run their own transforms; the copy's settings left them out, so a
    rerun with another one resumed and mixed rows transformed two ways."""
    from lanceloader.write.materialize import lineage

    for name in ("a", "b"):
        lance.write_dataset(pa.table({"id": np.arange(50)}), tmp_path / f"{name}.lance")

    def mixed() -> ll.Loader:
        mix = ll.Mix(
            {
                "a": ll.Loader(tmp_path / "a.lance", transform=scaled),
                "b": ll.Loader(tmp_path / "b.lance", transform=scaled),
            },
            weights={"a": 1, "b": 1},
        )
        return ll.Loader(mix, batch_size=10)

    before = lineage(mixed(), 0)
    monkeypatch.setattr(sys.modules[__name__], "SCALE", [2.0])
    after = lineage(mixed(), 0)
    assert before["source_transforms"]["a"]["transform"] == "scaled"
    assert before["source_transforms"] != after["source_transforms"]


def test_an_error_in_the_middle_of_a_piece_is_raised_as_itself_and_the_rerun_goes_on(uri, tmp_path):
    """The transform's error half-way through a piece came out as Lance's OSError ('C Data
    interface error: ... boom'); the same call after it must go on from the recorded pieces."""
    flag = tmp_path / "fail"
    flag.touch()

    def fails_once(batch):
        if flag.exists() and int(batch.column("id")[0].as_py()) == 1700:  # 3rd batch of piece 3
            raise RuntimeError("worker lost")
        return batch

    loader = ll.Loader(uri, batch_size=100, columns=["id"], transform=fails_once, num_workers=1)
    out = tmp_path / "o.lance"
    with pytest.raises(RuntimeError, match="worker lost"):
        ll.materialize(loader, out, rows_per_fragment=500)
    flag.unlink()
    summary = ll.materialize(loader, out, rows_per_fragment=500)
    assert (summary.resumed, summary.redone, summary.rows) == (3, 0, 5000)
    assert summary.dataset.to_table()["id"].to_pylist() == list(range(5000))
    kept = {
        os.path.basename(f.path) for fr in summary.dataset.get_fragments() for f in fr.data_files()
    }
    assert set(os.listdir(out / "data")) == kept
