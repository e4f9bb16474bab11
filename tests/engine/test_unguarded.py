"""Process workers from a script without an ``if __name__ == "__main__":`` guard.

The script runs as a real subprocess (its own ``__main__``), defines its transform (a function
and a class instance) at top level, uses Lance first (``peek()``: the fork-safe path, so workers
must come from the forkserver), then iterates on process workers. Before, every worker re-ran the
script: its top-level side effect ran once per worker, and the loop died with multiprocessing's
bootstrapping ``RuntimeError`` and ``WorkerDiedError``.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = """
import lanceloader as ll
print("MARKER", flush=True)  # top-level side effect: must happen exactly once

OFFSET = 1000

def add_offset(batch):
    return {"id": batch["id"].to_numpy() + OFFSET}

class Scale:
    def __init__(self, k):
        self.k = k

    def __call__(self, batch):
        return {"id": batch["id"] * self.k}

loader = ll.Loader(URI, batch_size=100, columns=["id"], worker_type="process",
                   num_workers=2, transform=[add_offset, Scale(3)])
peeked = loader.peek()["id"].tolist()  # Lance ran in this process before the workers start
ids = [i for batch in loader for i in batch["id"].tolist()]
print("PEEK", peeked == ids[:100], flush=True)
print("IDS", ids == [(i + 1000) * 3 for i in range(1000)], flush=True)

class Tag:  # a result value and an error of classes the workers only have by value
    def __init__(self, first):
        self.first = first

class BadBatch(Exception):
    pass

def tag(batch):
    ids = batch["id"].to_numpy()
    if ids[0] == 500:
        raise BadBatch("batch of id 500")
    return {"id": ids, "tag": Tag(int(ids[0]))}

tagged = iter(ll.Loader(URI, batch_size=100, columns=["id"], worker_type="process",
                        num_workers=2, transform=tag))
first = next(tagged)["tag"]
print("TAG", type(first) is Tag and first.first == 0, flush=True)
try:
    list(tagged)
except BadBatch as exc:
    print("RAISED", exc, flush=True)
"""


def test_unguarded_script_runs_its_top_level_once_and_iterates(small_uri: str, tmp_path) -> None:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT.replace("URI", repr(small_uri))))
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("MARKER") == 1, done.stdout
    assert "PEEK True" in done.stdout and "IDS True" in done.stdout, done.stdout
    assert "TAG True" in done.stdout and "RAISED batch of id 500" in done.stdout, done.stdout
    assert "bootstrapping" not in done.stderr


def test_unguarded_module_run_with_dash_m_is_not_imported_again(small_uri: str, tmp_path) -> None:
    """``python -m train``: multiprocessing would import the module by name in each worker
    (``init_main_from_name``); the workers must not."""
    (tmp_path / "train.py").write_text(textwrap.dedent(SCRIPT.replace("URI", repr(small_uri))))
    done = subprocess.run(
        [sys.executable, "-m", "train"], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("MARKER") == 1, done.stdout
    assert "IDS True" in done.stdout, done.stdout
