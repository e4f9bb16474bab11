"""Row hashes (what check_resume names rows by without an id column): a row's hash depends on
its contents alone — not on its batch, its place in it, the column order or the process — and
changes with any byte, in every kind of column and output."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest
import torch

from lanceloader.batch.row_hashes import batch_columns, row_hashes


def columns(n: int = 6, width: int = 5) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "x": rng.random((n, width)).astype(np.float32),
        "id": np.arange(n),
        "name": np.array([f"row {i}" for i in range(n)]),
    }


def test_a_row_hashes_the_same_in_any_batch_and_column_order() -> None:
    c = columns()
    whole = row_hashes(c)
    assert len(set(whole.tolist())) == len(whole)  # distinct rows, distinct hashes
    tail = row_hashes({k: c[k][3:][::-1] for k in reversed(list(c))})  # other batch, order
    assert tail.tolist() == whole[3:][::-1].tolist()


@pytest.mark.parametrize("column", ["x", "id", "name"])
def test_any_byte_changes_the_hash(column: str) -> None:
    c = columns()
    changed = {k: v.copy() for k, v in c.items()}
    if column == "x":
        changed["x"][2, -1] += 1e-3  # the last word of the row only
    else:
        changed[column][2] = changed[column][2] + 1 if column == "id" else "row 9"
    differ = row_hashes(changed) != row_hashes(c)
    assert differ.tolist() == [False, False, True, False, False, False]


@pytest.mark.parametrize("width", [600, 2000])  # 4,800 and 16,000 bytes a row: digested
def test_wide_rows_hash_by_contents(width: int) -> None:
    c = columns(width=width)
    changed = {**c, "x": c["x"].copy()}
    changed["x"][4, -1] += 1
    assert (row_hashes(changed) != row_hashes(c)).tolist() == [False] * 4 + [True, False]


def test_outputs_read_back_as_columns() -> None:
    c = columns()
    table = pa.table({"id": c["id"], "name": c["name"]})
    arrow = row_hashes(batch_columns(table))
    assert arrow[2:].tolist() == row_hashes(batch_columns(table.slice(2))).tolist()
    as_torch = {"id": torch.from_numpy(c["id"]), "x": torch.from_numpy(c["x"])}
    assert (
        row_hashes(batch_columns(as_torch)).tolist()
        == row_hashes({"id": c["id"], "x": c["x"]}).tolist()
    )
    lists = {"tokens": [[1, 2], [3], [], [4, 5, 6], [7], [8]]}
    ragged = row_hashes(batch_columns(lists))
    assert len(set(ragged.tolist())) == 6
    assert (
        ragged[:3].tolist() == row_hashes(batch_columns({"tokens": lists["tokens"][:3]})).tolist()
    )


def test_the_same_in_another_process() -> None:
    code = (
        "import numpy as np; from lanceloader.batch.row_hashes import row_hashes; "
        "print(row_hashes({'id': np.arange(3), 'name': np.array(['a', 'b', 'c'])}).tolist())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    here = row_hashes({"id": np.arange(3), "name": np.array(["a", "b", "c"])}).tolist()
    assert out.stdout.strip() == str(here)
