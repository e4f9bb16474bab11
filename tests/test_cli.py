"""The command line: demo, bench (stats, JSON, plot, trace, transforms), inspect, help, errors."""

from __future__ import annotations

import json
import subprocess
import sys
from itertools import pairwise
from pathlib import Path

import lance
import pyarrow as pa
import pytest

from lanceloader import cli
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


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """Exit code, stdout and stderr of ``lanceloader ARGS`` run in this process."""
    try:
        code = main(args)
    except SystemExit as exc:  # argparse: --help and usage errors
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_line_error(code: int, err: str, command: str, *fragments: str) -> None:
    assert code == 2, err
    assert err.startswith(f"lanceloader {command}: error: "), err
    assert len(err.strip().splitlines()) == 1, err
    for fragment in fragments:
        assert fragment in err, err


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
        (["bench"], ["--transform MODULE:FUNCTION", "--max-batches N", "examples:", "--plot"]),
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
