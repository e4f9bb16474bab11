"""Process workers from a real Jupyter kernel (nbclient + ipykernel), with a transform defined
in a notebook cell: a function and a class instance.

A notebook has no main file for a worker to import, so functions and classes defined in its
cells exist only in the kernel: before, they were pickled by name, a worker could not find them
and died at start-up (``WorkerDiedError ... exited with status 1``). They now reach the workers by
value.
"""

from __future__ import annotations

import json

import nbformat
from nbclient import NotebookClient

CELLS = [
    """
import json, time
import lanceloader as ll
""",
    """
OFFSET = 1000

def add_offset(batch):
    return {"id": batch["id"].to_numpy() + OFFSET}

class Scale:
    def __init__(self, k):
        self.k = k

    def __call__(self, batch):
        return {"id": batch["id"] * self.k}
""",
    """
start = time.perf_counter()
loader = ll.Loader(URI, batch_size=100, columns=["id"], worker_type="process", num_workers=2,
                   transform=[add_offset, Scale(3)])
it = iter(loader)
first = next(it)
first_batch_s = time.perf_counter() - start
ids = first["id"].tolist() + [i for batch in it for i in batch["id"].tolist()]
""",
    """
print(json.dumps({"ok": ids == [(i + 1000) * 3 for i in range(1000)],
                  "first_batch_s": first_batch_s}))
""",
]


def run_notebook(uri: str, path) -> dict:
    """Run the notebook in a fresh ``python3`` kernel; the last cell's JSON line."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c.replace("URI", repr(uri)).strip()) for c in CELLS]
    NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(path)}}
    ).execute()
    text = "".join(o.get("text", "") for o in nb.cells[-1].outputs if o.output_type == "stream")
    return json.loads(text.strip().splitlines()[-1])


def test_cell_defined_transform_runs_on_process_workers(small_uri: str, tmp_path) -> None:
    result = run_notebook(small_uri, tmp_path)
    assert result["ok"] is True
