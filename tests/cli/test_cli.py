"""The command line: demo, bench (stats, JSON, plot, trace, transforms, splits, image
decoding), inspect (and what it says of images, Parquet and CSV), help, errors (Lance's paths
shown as given)."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from itertools import pairwise
from pathlib import Path

import lance
import pyarrow as pa
import pytest

from cli_run import assert_one_line_error, run_cli
from lanceloader import Loader, cli
from lanceloader.cli import main

HELPER = '''\
import time
calls = []

def slow_identity(batch):
    """Sleeps 1 ms per batch, records the batch size, returns the batch unchanged."""
    time.sleep(0.001)
    calls.append(batch.num_rows)
    return batch
'''


@pytest.fixture
def helper_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A transform module in a temporary current directory, as users would have one."""
    (tmp_path / "cli_test_transforms.py").write_text(HELPER)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # bench puts the cwd on sys.path
    monkeypatch.delitem(sys.modules, "cli_test_transforms", raising=False)
    return "cli_test_transforms"


# --- demo ------------------------------------------------------------------------------------


def test_demo_reports_every_mode(small_uri: str, capsys) -> None:
    assert main(["demo", small_uri, "--batch-size", "100"]) == 0
    out, err = capsys.readouterr()
    for mode in ("sequential", "block shuffle", "full shuffle"):
        assert mode in out
    assert "rows/s" in out and "first batch" in out
    assert "raw Lance" in out and "vs raw" in out and "Next:" in out  # a yardstick, a next step
    assert "1,000 rows of" in out and "batches of 100 rows" in out  # what was measured
    assert "sequential 3/3: 1,000 rows" in err and "\r" not in err  # a log, not bar soup
    # why a full shuffle runs near a scan here: said, not left for a newcomer to wonder about
    assert "block shuffle and full shuffle: read through the cache the loader chose" in out
    assert "cache=None turns it off): auto: " in out


def test_demo_writes_its_dataset_into_the_cache(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert main(["demo", "--rows", "3000"]) == 0
    assert (tmp_path / "lanceloader" / "demo-3000.lance" / "_versions").is_dir()


def test_bad_uri_is_a_one_line_error_with_exit_code_2(tmp_path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "lanceloader.cli", "demo", str(tmp_path / "missing.lance")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.startswith("lanceloader demo: error: no Lance dataset at")
    assert len(result.stderr.strip().splitlines()) == 1


# --- bench -----------------------------------------------------------------------------------


def test_bench_prints_the_stats_table_and_verdict(small_uri: str, capsys) -> None:
    code, out, err = run_cli(["bench", small_uri, "--batch-size", "100", "--workers", "2"], capsys)
    assert code == 0, err
    assert "1,000 rows, batch 100, sequential, 2 thread workers" in out
    assert "1,000 rows in 10 batches" in out
    for label in ("throughput", "storage I/O", "loop waited", "\nbottleneck: ", "places per batch"):
        assert label in out
    assert "epoch 0" in err  # the progress bar


def test_bench_json_reconciles_rows_per_epoch_and_over_time(
    small_uri: str, tmp_path: Path, capsys
) -> None:
    path = tmp_path / "stats.json"
    args = ["bench", small_uri, "--batch-size", "100", "--shuffle", "--block-size", "64"]
    args += ["--columns", "id,x", "--epochs", "2", "--max-batches", "3", "--json", str(path)]
    code, out, err = run_cli(args, capsys)
    assert code == 0, err
    assert "epoch 0: 300 rows" in out and "epoch 1: 300 rows" in out
    report = json.loads(path.read_text())
    stats = report["stats"]
    assert (stats["epochs"], stats["batches"], stats["rows"]) == (2, 6, 600)
    assert stats["rows_read"] == stats["rows"] + stats["rows_skipped"] + stats["rows_undelivered"]
    assert [e["rows"] for e in report["epochs"]] == [300, 300]
    assert report["settings"]["columns"] == ["id", "x"]
    assert report["settings"]["order"].startswith("block shuffle (64 rows")
    assert report["mixing"]["batches_per_read"] >= 1 and report["mixing"]["batch_size"] == 100
    series = report["series"]
    assert series[0]["rows"] == 0 and series[-1]["rows"] == 600
    assert all(a["t"] <= b["t"] and a["rows"] <= b["rows"] for a, b in pairwise(series))
    assert {p["epoch"] for p in series} == {0, 1}
    assert f"wrote --json {path}" in out


def test_bench_plot_writes_a_png(small_uri: str, tmp_path: Path, capsys) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / "stats.png"
    code, _, err = run_cli(["bench", small_uri, "--plot", str(path)], capsys)
    assert code == 0, err
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_plot_without_matplotlib_fails_before_running(
    small_uri: str, tmp_path: Path, capsys, monkeypatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    code, out, err = run_cli(["bench", small_uri, "--plot", str(tmp_path / "p.png")], capsys)
    assert_one_line_error(code, err, "bench", "--plot needs matplotlib", "pip install matplotlib")
    assert "delivered" not in out


def test_bench_trace_is_perfetto_json(small_uri: str, tmp_path: Path, capsys) -> None:
    path = tmp_path / "trace.json"
    code, _, err = run_cli(
        ["bench", small_uri, "--batch-size", "100", "--trace", str(path)], capsys
    )
    assert code == 0, err
    events = json.loads(path.read_text())["traceEvents"]
    assert {"read", "wait for batch"} <= {e["name"] for e in events if e["ph"] == "X"}


def test_bench_imports_a_transform_from_the_current_directory(
    small_uri: str, helper_module: str, capsys
) -> None:
    spec = f"{helper_module}:slow_identity"
    code, out, err = run_cli(
        ["bench", small_uri, "--batch-size", "100", "--transform", spec], capsys
    )
    assert code == 0, err
    assert sorted(sys.modules[helper_module].calls) == [100] * 10
    transform_line = next(line for line in out.splitlines() if line.startswith("transform"))
    assert not transform_line.startswith("transform    0.00 s"), out


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("nocolon", "--transform must be module:function"),
        (":f", "--transform must be module:function"),
        ("no_such_module_xyz:f", "cannot import module 'no_such_module_xyz'"),
        ("json:no_such_function", "'json' has no attribute 'no_such_function'"),
        ("json:__name__", "is a str, not a function"),
    ],
)
def test_bad_transform_specs_are_one_line_errors(
    small_uri: str, spec: str, fragment: str, capsys
) -> None:
    code, out, err = run_cli(["bench", small_uri, "--transform", spec], capsys)
    assert_one_line_error(code, err, "bench", fragment)
    assert "delivered" not in out


def test_a_transform_whose_import_fails_names_the_error(helper_module: str, small_uri, capsys):
    Path("broken_transforms.py").write_text("import no_such_dependency_xyz\n")
    code, _, err = run_cli(["bench", small_uri, "--transform", "broken_transforms:f"], capsys)
    assert_one_line_error(code, err, "bench", "ModuleNotFoundError", "no_such_dependency_xyz")


def test_ctrl_c_reports_what_ran_and_exits_130(small_uri: str, capsys, monkeypatch) -> None:
    class InterruptedBar(cli.bench.tqdm):
        def update(self, n: float | None = 1) -> bool | None:
            if self.n >= 2:
                raise KeyboardInterrupt
            return super().update(n)

    monkeypatch.setattr(cli.bench, "tqdm", InterruptedBar)
    code, out, _ = run_cli(["bench", small_uri, "--batch-size", "100", "--epochs", "2"], capsys)
    assert code == 130
    assert "interrupted" in out and "300 rows in 3 batches" in out


# --- inspect ---------------------------------------------------------------------------------


def test_inspect_describes_the_demo_dataset(small_uri: str, capsys) -> None:
    code, out, err = run_cli(["inspect", small_uri], capsys)
    assert code == 0, err
    assert f"dataset    {small_uri}" in out
    assert "rows       1,000\n" in out
    assert "fragments  3, 332 to 334 rows each" in out
    assert "on disk, from Lance's data statistics" in out
    assert "(inspected, latest)" in out
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ")}
    assert "int64" in lines["id"] and "yes: int64 [n]" in lines["id"]
    assert "fixed_size_list" in lines["x"] and "kB" in lines["x"]
    assert "yes: float32 [n, 64]" in lines["x"]
    assert "no: list of str" in lines["text"]


def test_inspect_reports_conversions_versions_and_deletions(tmp_path: Path, capsys) -> None:
    uri = str(tmp_path / "odd.lance")
    table = pa.table(
        {
            "score": pa.array([1.0, None, 3.0]),
            "tokens": pa.array([[1, 2], [3], []]),
            "tags": pa.array([{"a": 1}, {"b": 2}, {}], pa.map_(pa.string(), pa.int64())),
            "uid": pa.array([1, 2, 3], pa.uint64()),
        }
    )
    lance.write_dataset(table, uri)
    ds = lance.write_dataset(table, uri, mode="append")
    ds.tags.create("first", 1)
    ds.delete("uid = 3")
    code, out, err = run_cli(["inspect", uri, "--version", "first"], capsys)
    assert code == 0, err
    assert "rows       3\n" in out and "1  " in out and "(tag first, inspected)" in out
    assert "3  " in out and "(latest)" in out
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ")}
    assert "no: column 'score' (double) has 1 null values" in lines["score"]
    assert "yes: int64 [n, longest] padded, lengths in tokens_lengths" in lines["tokens"]
    assert "no: column 'tags' has Arrow type map<string, int64>" in lines["tags"]
    assert "yes: uint64 [n]; torch: column 'uid' is uint64" in lines["uid"]
    code, out, err = run_cli(["inspect", uri], capsys)
    assert code == 0, err
    assert "rows       4 (2 deleted)" in out


# --- help and errors -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ([], ["demo", "bench", "inspect", "examples:"]),
        (
            ["bench"],
            [
                "--transform MODULE:FUNCTION",
                "--max-batches N",
                "examples:",
                "--plot",
                "--split NAME",
                "--splits NAME=FRACTION",
                "--decode-images COLUMN",
                "--image-size PX|HxW",
            ],
        ),
        (["inspect"], ["--version V", "--sample-rows N", "examples:"]),
    ],
)
def test_help_texts_have_examples(command: list[str], expected: list[str], capsys) -> None:
    code, out, _ = run_cli([*command, "--help"], capsys)
    assert code == 0
    for text in expected:
        assert text in out
    assert "lanceloader " + (command[0] if command else "bench") + " data/train.lance" in out


@pytest.mark.parametrize(
    ("args", "command", "fragment"),
    [
        (["bench", "{missing}"], "bench", "no Lance dataset at"),
        (["inspect", "{missing}"], "inspect", "no Lance dataset at"),
        (["bench", "{uri}", "--columns", "id,nope"], "bench", "unknown columns ['nope']"),
        (["bench", "{uri}", "--filter", "nope >"], "bench", "is not a valid Lance SQL predicate"),
        (["bench", "{uri}", "--filter", "nope > 1"], "bench", "No field named nope"),
        (["bench", "{uri}", "--batch-size", "0"], "bench", "must be an integer >= 1, got '0'"),
        (["bench", "{uri}", "--epochs", "x"], "bench", "argument --epochs"),
        (["bench", "{uri}", "--block-size", "64"], "bench", "add --shuffle"),
        (["bench", "{uri}", "--worker-type", "fiber"], "bench", "invalid choice: 'fiber'"),
        (["bench", "{uri}", "--json", "/no/such/dir/x.json"], "bench", "does not exist"),
        (["bench"], "bench", "required: uri"),
        (["inspect", "{uri}", "--version", "99"], "inspect", "has no version 99"),
        (["inspect", "{uri}", "--version", "nosuchtag"], "inspect", "has no version 'nosuchtag'"),
    ],
)
def test_bad_input_is_a_one_line_error_with_exit_code_2(
    args: list[str], command: str, fragment: str, small_uri: str, tmp_path: Path, capsys
) -> None:
    missing = str(tmp_path / "missing.lance")
    args = [a.format(uri=small_uri, missing=missing) for a in args]
    code, out, err = run_cli(args, capsys)
    assert_one_line_error(code, err, command, fragment)
    assert ".rs:" not in err  # Lance's Rust source locations are dropped
    assert "delivered" not in out


def test_unknown_command_is_one_line(capsys) -> None:
    code, _, err = run_cli(["frobnicate"], capsys)
    assert code == 2 and err.startswith("lanceloader: error: argument command: invalid choice")
    assert len(err.strip().splitlines()) == 1


def test_the_entry_point_runs_bench(small_uri: str, tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "lanceloader.cli", "bench", small_uri, "--columns", "nope"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.startswith("lanceloader bench: error: unknown columns ['nope']")
    assert len(result.stderr.strip().splitlines()) == 1


# --- splits and image decoding in bench -------------------------------------------------------


def test_bench_reads_the_named_split_only(small_uri: str, tmp_path: Path, capsys) -> None:
    path = tmp_path / "stats.json"
    args = [
        "bench",
        small_uri,
        "--batch-size",
        "50",
        "--splits",
        "train=0.8,val=0.2",
        "--split",
        "val",
        "--json",
        str(path),
    ]
    code, out, err = run_cli(args, capsys)
    assert code == 0, err
    val = Loader(small_uri, splits={"train": 0.8, "val": 0.2}, split="val").source.num_rows
    assert 100 < val < 300  # a fifth of 1,000 rows
    assert f"{val:,} rows of split 'val', batch 50" in out
    report = json.loads(path.read_text())
    assert report["stats"]["rows"] == val
    assert report["settings"]["splits"] == {"train": 0.8, "val": 0.2}
    assert report["settings"]["split"] == "val"


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--split", "val"], "--split val needs --splits"),
        (["--splits", "train=0.8,val=0.2"], "--splits needs --split, one of train, val"),
        (["--splits", "train:0.8", "--split", "train"], "--splits must be NAME=FRACTION"),
        (["--splits", "train=0.8,val=0.3", "--split", "val"], "must sum to 1"),
        (["--splits", "train=0.8,val=0.2", "--split", "test"], "is not one of the splits"),
        (["--split-key", "id"], "--split-key needs --splits and --split"),
        (["--image-size", "8"], "add --decode-images COLUMN"),
        (["--decode-images", "image", "--image-size", "8x0"], "must be PX or HxW"),
    ],
)
def test_bad_split_and_decode_flags_are_one_line_errors(
    small_uri: str, args: list[str], fragment: str, capsys
) -> None:
    code, out, err = run_cli(["bench", small_uri, *args], capsys)
    assert code == 2 and fragment in err and len(err.strip().splitlines()) == 1, err
    assert "delivered" not in out


@pytest.fixture
def image_folder(tmp_path: Path) -> Path:
    """An ImageFolder tree of real JPEGs of different sizes: 2 classes x 4 images."""
    image = pytest.importorskip("PIL.Image")
    root = tmp_path / "images" / "train"
    for label in ("cat", "dog"):
        (root / label).mkdir(parents=True)
        for i in range(4):
            picture = image.new("RGB", (10 + i, 12), (40 * i, 100, 0))
            picture.save(root / label / f"{i}.jpg", format="JPEG")
    return root


def test_bench_decodes_images_with_decode_images(
    image_folder: Path, tmp_path: Path, capsys
) -> None:
    out_uri = str(tmp_path / "train.lance")
    assert main(["convert", str(image_folder), out_uri, "--quiet"]) == 0
    capsys.readouterr()
    args = [
        "bench",
        out_uri,
        "--batch-size",
        "4",
        "--columns",
        "image,label",
        "--decode-images",
        "image",
        "--image-size",
        "8x6",
        "--json",
        str(tmp_path / "s.json"),
    ]
    code, out, err = run_cli(args, capsys)
    assert code == 0, err
    assert "first batch: image uint8 [4, 8, 6, 3], label int64 [4]" in out
    report = json.loads((tmp_path / "s.json").read_text())
    assert report["first_batch"]["image"] == "uint8 [4, 8, 6, 3]"
    assert report["settings"]["decode_images"] == "image"
    assert report["stats"]["rows"] == 8
    # the images differ in size: without --image-size, one line that names the flag
    code, out, err = run_cli(["bench", out_uri, "--decode-images", "image"], capsys)
    last = err.strip().splitlines()[-1]  # after the progress bar of the run it stopped
    assert code == 2 and last.startswith("lanceloader bench: error: --decode-images image: "), err
    assert "image is 11x12" in last and "add --image-size" in last


# --- what inspect says of data that is not Lance yet ----------------------------------------


def table_sources(root: Path) -> dict[str, Path]:
    """A Parquet file, a CSV file, a folder of Parquet files and a folder of CSV files."""
    import pyarrow.csv
    import pyarrow.parquet as pq

    table = pa.table({"x": [1.0, 2.0, 3.0], "label": [0, 1, 0]})
    for folder in ("pq", "csv", "one_pq", "one_csv"):
        (root / folder).mkdir()
    pq.write_table(table, root / "one_pq" / "table.parquet")
    pyarrow.csv.write_csv(table, root / "one_csv" / "table.csv")
    for i in range(2):
        pq.write_table(table, root / "pq" / f"part-{i}.parquet")
        pyarrow.csv.write_csv(table, root / "csv" / f"part-{i}.csv")
    return {
        "a Parquet file": root / "one_pq" / "table.parquet",
        "a CSV file": root / "one_csv" / "table.csv",
        "a folder of Parquet files": root / "pq",
        "a folder of CSV files": root / "csv",
    }


def suggested_commands(err: str) -> tuple[list[str], list[str]]:
    """The convert command and the next one that an error suggests, as argument lists."""
    convert, _, then = err.split("convert it once: ", 1)[1].partition(", then: ")
    return shlex.split(convert), shlex.split(then)


def test_inspect_on_images_parquet_or_csv_says_the_convert_command(
    image_folder: Path, tmp_path: Path, capsys
) -> None:
    sources = {
        "a folder of images in the ImageFolder layout": image_folder,
        **table_sources(tmp_path),
    }
    for kind, path in sources.items():
        code, out, err = run_cli(["inspect", str(path)], capsys)
        assert_one_line_error(code, err, "inspect", f"is {kind}", "lanceloader convert ")
        assert "lance.write_dataset" not in err
        convert, then = suggested_commands(err)
        out_uri = str(path.with_suffix(".lance") if path.is_file() else f"{path}.lance")
        assert convert == ["lanceloader", "convert", str(path), out_uri], err
        assert then == ["lanceloader", "inspect", out_uri]
        assert main([*convert[1:], "--quiet"]) == 0  # the command works as printed
        code, out, err = run_cli(then[1:], capsys)
        assert code == 0 and f"dataset    {out_uri}" in out, err
    # a folder of something else gets the usual message, no convert advice
    (tmp_path / "notes" / "misc").mkdir(parents=True)
    (tmp_path / "notes" / "misc" / "readme.txt").write_text("hello")
    code, _, err = run_cli(["inspect", str(tmp_path / "notes")], capsys)
    assert_one_line_error(code, err, "inspect", "no Lance dataset at")
    assert "lanceloader convert" not in err


def test_bench_on_an_image_folder_says_the_convert_command(image_folder: Path, capsys) -> None:
    code, _, err = run_cli(["bench", f"{image_folder}/"], capsys)
    assert_one_line_error(
        code,
        err,
        "bench",
        f"lanceloader convert {image_folder}/ "
        f"{image_folder}.lance, then: lanceloader bench {image_folder}.lance",
    )


# --- Lance's messages show the path as the user gave it -------------------------------------


@pytest.mark.parametrize("spelling", ["relative", "dotted", "double slash"])
def test_lance_paths_in_errors_are_the_users_path(tmp_path: Path, spelling: str) -> None:
    (tmp_path / "sub").mkdir()
    given = {
        "relative": "sub/nope.lance",
        "dotted": f"{tmp_path}/sub/../sub/nope.lance",
        "double slash": f"{tmp_path}//sub/nope.lance",
    }[spelling]
    result = subprocess.run(
        [sys.executable, "-m", "lanceloader.cli", "inspect", given],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert result.returncode == 2, result.stderr
    assert f"Not found: {given}/_versions" in result.stderr
    # Lance's own spelling: the absolute, normalised path less its leading "/"
    lance_spelling = str(tmp_path / "sub" / "nope.lance").lstrip("/")
    assert f" {lance_spelling}" not in result.stderr


# --- ledger ---------------------------------------------------------------------------------


def saved_state(uri: str, tmp_path: Path) -> tuple[Loader, Path]:
    import lanceloader as ll

    loader = Loader(uri, batch_size=100, shuffle=True, seed=1)
    path = tmp_path / "state.json"
    ll.save_state(path, loader.state_dict())
    return loader, path


def test_ledger_out_csv_writes_csv_and_a_contradicting_format_is_refused(
    small_uri: str, tmp_path: Path, capsys
) -> None:
    import csv

    from lanceloader import Ledger

    loader, state = saved_state(small_uri, tmp_path)
    out = tmp_path / "spike.csv"
    code, _, err = run_cli(["ledger", str(state), "--steps", "0:2", "--out", str(out)], capsys)
    assert code == 0, err
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    expected = Ledger(loader).rows(epoch=0, step=0)["row_offset"].to_pylist()
    assert len(rows) == 200 and [int(r["row_offset"]) for r in rows[:100]] == expected
    jsonl = tmp_path / "spike.jsonl"
    code, _, err = run_cli(["ledger", str(state), "--steps", "0", "--out", str(jsonl)], capsys)
    assert code == 0 and json.loads(jsonl.read_text().splitlines()[0])["step"] == 0
    code, _, err = run_cli(
        ["ledger", str(state), "--steps", "0", "--out", str(out), "--format", "jsonl"], capsys
    )
    assert_one_line_error(code, err, "ledger", "names a CSV file but --format is jsonl")


def test_ledger_of_a_dataset_or_a_bad_file_names_what_it_expects(
    small_uri: str, tmp_path: Path, capsys
) -> None:
    binary = tmp_path / "model.pt"
    binary.write_bytes(bytes(range(256)) * 4)
    other = tmp_path / "config.json"
    other.write_text('{"lr": 0.1}')
    for path, fragment in [
        (small_uri, "is a Lance dataset, not a loader state"),
        (str(tmp_path), "is a folder, not a loader state"),
        (str(binary), "is not a loader state (not text)"),
        (str(other), "holds JSON that is not a loader state"),
    ]:
        code, _, err = run_cli(["ledger", path, "--steps", "0:2"], capsys)
        assert_one_line_error(
            code, err, "ledger", fragment, "ll.save_state(path, loader.state_dict())"
        )


def test_a_ledger_of_something_that_is_not_a_loader_is_a_type_error() -> None:
    import lanceloader as ll

    with pytest.raises(TypeError, match=r"got 'str'; for a saved state use ll\.Ledger\.from_state"):
        ll.Ledger("not a loader")
