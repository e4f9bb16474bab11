"""The image and text training examples run end to end and learn."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

# Arrow memory is read-only; the loader silences torch's warning about wrapping it once per process,
# but pytest resets warning filters for every test.
pytestmark = pytest.mark.filterwarnings("ignore:The given NumPy array is not writable")


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", ["train_images", "train_text"])
def test_example_learns(name: str) -> None:
    result = load(name).main(["--rows", "256", "--steps", "20", "--batch-size", "32"])
    assert result["last_loss"] < 0.5 * result["first_loss"], result


def test_example_runs_as_a_script() -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "train_text.py"), "--rows", "128", "--steps", "5"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "5 steps: loss" in done.stdout
