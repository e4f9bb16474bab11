"""A followed table changed during a run (appends, deletes, compaction, at drawn points of drawn
epochs), the run interrupted at a drawn point and resumed on another number of ranks and batch
size: every epoch delivers exactly the global sequence of an uninterrupted one-rank run that
saw the same changes in the same epochs (Hypothesis draws the changes, the resume point, the
world sizes, the batch size and the order).

A change made during epoch ``e`` is adopted at epoch ``e + 1``'s start in both runs, whichever
step it came at; a resume in between reads the state's version though the table has a newer one.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import lance
import numpy as np
import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lanceloader as ll
from lanceloader.ordering.plan import Plan

EPOCHS = 3
ORDERS = {
    "sequential": {},
    "block": {"shuffle": True, "shuffle_block_size": 3, "shuffle_window": 2},
    "full": {"shuffle": True},
}
_tables = itertools.count()


@dataclass(frozen=True)
class Change:
    epoch: int
    at: float  # the share of the epoch's samples delivered before it (1.0: after the epoch)
    kind: str  # "append", "delete" or "compact"
    rows: int  # appended rows, or which residue of id % 7 is deleted


@dataclass(frozen=True)
class Resume:
    epoch: int
    at: float
    world_size: int
    batch_size: int


class Table:
    """A fresh table for one run, and the changes made to it in run order."""

    def __init__(self, root: Any, rows: int) -> None:
        self.uri = str(root / f"t{next(_tables)}.lance")
        self.next_id = 1000
        self.write(list(range(rows)), "create")

    def write(self, ids: list[int], mode: str) -> None:
        table = pa.table({"id": pa.array(ids, pa.int64())})
        lance.write_dataset(table, self.uri, mode=mode, max_rows_per_file=7)

    def change(self, change: Change) -> None:
        if change.kind == "append":
            self.write(list(range(self.next_id, self.next_id + change.rows)), "append")
            self.next_id += change.rows
        elif change.kind == "delete":
            lance.dataset(self.uri).delete(f"id % 7 = {change.rows % 7} AND id > 2")
        else:
            lance.dataset(self.uri).optimize.compact_files(target_rows_per_fragment=20)


class Rank0:
    """An agreement for ranks run in lock-step in one process, rank 0 first: rank 0's k-th call
    chooses (its newest version), every other rank's k-th call returns that choice."""

    def __init__(self) -> None:
        self.choices: list[int] = []
        self.calls: Counter[int] = Counter()

    def member(self, rank: int) -> Callable[[int], int]:
        def agree(newest: int) -> int:
            k = self.calls[rank]
            self.calls[rank] += 1
            if rank == 0:
                self.choices.append(newest)
            return self.choices[k]

        return agree


def loaders(uri: str, world: int, batch: int, order: str, seed: int) -> list[ll.Loader]:
    board = Rank0()
    return [
        ll.Loader(
            uri,
            batch_size=batch,
            follow=board.member(rank) if world > 1 else True,
            rank=rank,
            world_size=world,
            seed=seed,
            cache=None,
            num_workers=1,
            **ORDERS[order],
        )
        for rank in range(world)
    ]


def run(
    table: Table,
    changes: list[Change],
    world: int,
    batch: int,
    order: str,
    seed: int,
    resume: Resume | None = None,
) -> list[list[int]]:
    """Each epoch's ids in global sample order, the ranks' batches put in their places."""
    ranks = loaders(table.uri, world, batch, order, seed)
    pending = sorted(changes, key=lambda c: (c.epoch, c.at))
    epochs: list[list[int]] = []
    for epoch in range(EPOCHS):
        its = [iter(loader) for loader in ranks]  # an epoch's start: the newest version
        rows = ranks[0].source.num_rows
        assert {r.source.num_rows for r in ranks} == {rows}
        sequence = np.full(rows, -1, np.int64)
        start, step = ranks[0].sample, 0
        while True:
            done = ranks[0].sample
            while pending and pending[0].epoch == epoch and pending[0].at * rows <= done:
                table.change(pending.pop(0))
            if resume is not None and resume.epoch == epoch and resume.at * rows <= done:
                state = ranks[0].state_dict()
                assert all(r.state_dict() == state for r in ranks)
                for it in its:
                    it.close()
                ranks = loaders(table.uri, resume.world_size, resume.batch_size, order, seed)
                for r in ranks:
                    r.load_state_dict(state, allow_changes=("batch_size",))
                its = [iter(r) for r in ranks]
                start, step, resume = ranks[0].sample, 0, None
            got = [next(it, None) for it in its]
            if all(b is None for b in got):
                break
            for rank, b in enumerate(got):
                if b is not None:
                    plan = Plan(rows, ranks[rank].batch_size, len(ranks), rank, False, start)
                    sequence[plan.batch_samples(step)] = b["id"]
            step += 1
        while pending and pending[0].epoch == epoch:
            table.change(pending.pop(0))  # after the epoch's last batch
        assert (sequence >= 0).all(), "a sample of the epoch was never delivered"
        epochs.append(sequence.tolist())
    return epochs


change = st.builds(
    Change,
    st.integers(0, EPOCHS - 2),
    st.sampled_from([0.0, 0.3, 0.7, 1.0]),
    st.sampled_from(["append", "append", "delete", "compact"]),
    st.integers(1, 9),
)
resume = st.builds(
    Resume,
    st.integers(0, EPOCHS - 1),
    st.sampled_from([0.0, 0.2, 0.5, 0.9, 1.0]),
    st.integers(1, 3),
    st.integers(1, 5),
)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    rows=st.integers(5, 30),
    changes=st.lists(change, max_size=3),
    world=st.integers(1, 3),
    batch=st.integers(1, 5),
    order=st.sampled_from(sorted(ORDERS)),
    seed=st.integers(0, 3),
    at=resume,
)
def test_resume_with_adoptions_is_exact_on_any_world_size(
    tmp_path: Any,
    rows: int,
    changes: list[Change],
    world: int,
    batch: int,
    order: str,
    seed: int,
    at: Resume,
) -> None:
    reference = run(Table(tmp_path, rows), changes, 1, batch, order, seed)
    resumed = run(Table(tmp_path, rows), changes, world, batch, order, seed, at)
    assert resumed == reference
    for epoch in reference:
        assert len(set(epoch)) == len(epoch), "an id twice in one epoch"
