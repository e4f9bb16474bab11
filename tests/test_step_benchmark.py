"""benchmarks/step.py --quick on tiny data: the report has every field, and each is sane (not
timed: the figures themselves come from a full run on a quiet machine)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "step.py"


@pytest.mark.slow  # 20-30 s: writes three small datasets, starts burner processes
def test_quick_step_benchmark_reports_sane_figures_for_every_workload(tmp_path) -> None:
    out = tmp_path / "report.json"
    run = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--data-dir", str(tmp_path), "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(out.read_text())
    cases = report["cases"]
    assert {(c["workload"], c["accelerator"]) for c in cases} == {
        (w, a) for w in ("images", "tokens", "clips") for a in ("sleep", "burn")
    }
    for case in cases:
        assert case["rows"], case
        for row in case["rows"]:
            assert set(row["setting"]) == {
                "num_workers",
                "worker_type",
                "prefetch",
                "rows_per_read",
                "cache",
            }
            assert 0 <= row["utilisation"] <= 1, row
            assert row["loader_cpu_s_per_step"] >= 0, row
            assert row["wait_ms_per_step"] >= 0 and row["slowdown"] >= 1, row
        cheapest = case["cheapest"]
        assert cheapest is None or (
            cheapest in case["rows"] and cheapest["utilisation"] >= report["target"]
        )
    assert "| images | sleep" in run.stdout and "loader CPU s/step" in run.stdout
