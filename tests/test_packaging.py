"""The wheel and sdist build, install in a fresh venv, and the README's quick start runs there."""

from __future__ import annotations

import re
import subprocess
import sys
import sysconfig
import tarfile
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_wheel_installs_in_a_fresh_venv_and_runs_the_quick_start(tmp_path) -> None:
    pytest.importorskip("build")
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = dist.glob("*.whl")
    (sdist,) = dist.glob("*.tar.gz")
    names = zipfile.ZipFile(wheel).namelist()
    assert "lanceloader/loader.py" in names and "lanceloader/py.typed" in names
    assert "lanceloader/rows/protocol.py" in names  # the stage folders are packaged
    assert any(n.endswith("entry_points.txt") for n in names)
    with tarfile.open(sdist) as tar:
        files = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert {"pyproject.toml", "README.md", "src/lanceloader/rows/mix.py"} <= files
    env = tmp_path / "venv"
    venv.create(env)  # without pip: ensurepip costs ~8 s of CPU; this pip installs into it
    python = env / "bin" / "python"
    # The dependencies (pylance, pyarrow, numpy, tqdm, xxhash, ...) come from this environment through a
    # .pth file, so nothing is downloaded; lanceloader itself comes only from the wheel.
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    )
    Path(site.stdout.strip(), "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--no-deps",
            "--no-index",
            "-q",
            str(wheel),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    readme = (ROOT / "README.md").read_text()
    quick_start = re.search(r"```python\n(.*?)```", readme, re.S).group(1)
    work = tmp_path / "work"
    work.mkdir()
    script = "import lanceloader, sys\nassert lanceloader.__file__.startswith(sys.prefix)\n"
    run = subprocess.run(
        [str(python), "-c", script + quick_start],
        cwd=work,
        text=True,
        capture_output=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    assert "(256, 64)" in run.stdout and "bottleneck" in run.stdout
    cli = subprocess.run(
        [str(env / "bin" / "lanceloader"), "inspect", "data/train.lance"],
        cwd=work,
        text=True,
        capture_output=True,
        timeout=120,
    )
    assert cli.returncode == 0 and "10,000" in cli.stdout, cli.stderr
