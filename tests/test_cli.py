from __future__ import annotations

import subprocess
import sys

from lanceloader.cli import main


def test_demo_reports_every_mode(small_uri: str, capsys) -> None:
    assert main(["demo", small_uri, "--batch-size", "100"]) == 0
    out = capsys.readouterr().out
    for mode in ("sequential", "block shuffle", "full shuffle"):
        assert mode in out
    assert "rows/s" in out and "first batch" in out


def test_demo_writes_its_dataset_into_the_cache(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert main(["demo", "--rows", "3000"]) == 0
    assert (tmp_path / "lanceloader" / "demo-3000.lance" / "_versions").is_dir()


def test_bad_uri_is_a_one_line_error_with_exit_code_2(tmp_path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "lanceloader.cli", "demo", str(tmp_path / "missing.lance")],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.startswith("lanceloader demo: error: no Lance dataset at")
    assert len(result.stderr.strip().splitlines()) == 1
