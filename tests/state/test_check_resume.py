"""ll.check_resume: it finds the resume bugs users hit (each injected by a small subclass of a real
Loader over a real Lance dataset) and passes the loader's correct compositions.

The bugs: an off-by-one at resume; a state frozen after the first resume (HF datasets#8308:
the second resume restarts from the first); an epoch's end resumed as the next epoch (verl#7401); a mixture's stage transition one step early after a
resume (levanter#876, with ``ll.Schedule``). The compositions (a Hypothesis property): plain, block or full shuffle,
filtered, split, packed, a Mix (with a schedule, feedback through ``on_step``), thread workers,
on N -> M world sizes, keeping the global batch or not, with drop_last.
"""

from __future__ import annotations

from typing import Any

import lance
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lanceloader as ll

ROWS = 240
MIX_SAMPLES = 120  # a mix epoch's samples (fixed, so a weight change keeps the epoch's length)
STAGE_STEP = 4  # levanter#876's stage 2 starts at this global step
STAGES = ({"a": 3, "b": 1}, {"a": 1, "b": 3})
ORDERS = {
    "sequential": {},
    "block": {"shuffle": True, "shuffle_block_size": 8, "shuffle_window": 2},
    "full": {"shuffle": True},
}


@pytest.fixture(scope="module")
def uris(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Two datasets: ``a`` (ids 0..239) and ``b`` (ids 10,000..10,159), 3 fragments each, with a
    column ``v`` to filter on and token lists to pack."""
    root = tmp_path_factory.mktemp("check_resume")
    out = {}
    for name, first, rows in (("a", 0, ROWS), ("b", 10_000, 160)):
        rng = np.random.default_rng(first)
        ids = np.arange(first, first + rows)
        tokens = [
            list(range(i * 100, i * 100 + n))
            for i, n in zip(ids, rng.integers(1, 20, rows), strict=True)
        ]
        table = pa.table(
            {"id": ids, "v": ids % 10, "tokens": pa.array(tokens, pa.list_(pa.int64()))}
        )
        out[name] = str(root / f"{name}.lance")
        lance.write_dataset(table, out[name], max_rows_per_file=-(-rows // 3))
    return out


def loader(uri: str, rank: int, world: int, cls: type = ll.Loader, **kw: Any) -> Any:
    kw = {"batch_size": 8, "columns": ["id", "v"], "num_workers": 1, **kw}
    return cls(uri, rank=rank, world_size=world, **kw)


# --- the injected bugs ---------------------------------------------------------------------


class OffByOne(ll.Loader):
    """Resumes one sample past the state's (a mid-epoch state: the end of an epoch stays)."""

    def load_state_dict(self, state: dict[str, Any], allow_changes: tuple[str, ...] = ()) -> None:
        if state["sample"] < state["order"]["rows"]:
            state = {**state, "sample": state["sample"] + 1}
        super().load_state_dict(state, allow_changes)


class Frozen(ll.Loader):
    """datasets#8308: after the first resume, state_dict() keeps returning the loaded state."""

    def load_state_dict(self, state: dict[str, Any], allow_changes: tuple[str, ...] = ()) -> None:
        super().load_state_dict(state, allow_changes)
        self.frozen = state

    def state_dict(self) -> dict[str, Any]:
        return getattr(self, "frozen", None) or super().state_dict()


class SkipsTheEpochEnd(ll.Loader):
    """verl#7401-like: a state saved at an epoch's end (its last batch delivered, no
    ``StopIteration`` yet) resumes at the next epoch's start, so the loop's next ``for`` over
    the loader runs that next epoch as the one it was in, and an epoch is lost."""

    def load_state_dict(self, state: dict[str, Any], allow_changes: tuple[str, ...] = ()) -> None:
        if state["sample"] == state["order"]["rows"]:
            state = {**state, "epoch": state["epoch"] + 1, "sample": 0}
        super().load_state_dict(state, allow_changes)


class FailsAfterResume(ll.Loader):
    """Loads, then fails at the first batch (a state that cannot be read back, say)."""

    def load_state_dict(self, state: dict[str, Any], allow_changes: tuple[str, ...] = ()) -> None:
        super().load_state_dict(state, allow_changes)
        self.loaded = True

    def __iter__(self) -> Any:
        for batch in super().__iter__():
            if getattr(self, "loaded", False):
                raise RuntimeError("no such fragment")
            yield batch


@pytest.mark.parametrize("ids", ["id", None])
def test_a_correct_loader_passes(uris: dict[str, str], ids: str | None) -> None:
    report = ll.check_resume(
        lambda r, w: loader(uris["a"], r, w, shuffle=True, seed=3),
        runs=30,
        world_sizes=(2, 1, 3),
        ids=ids,
    )
    assert report.raise_if_failed().ok, report
    assert report.runs == 30 and report.loads >= 60 and report.elastic > 0
    assert report.samples_compared > 30 * 8 and report.not_comparable == 0
    assert str(report).startswith("check_resume: OK: every row as in the uninterrupted run.")
    assert "interrupted runs 30, resumes " in str(report)


@pytest.mark.parametrize("ids", ["id", None])
def test_it_finds_an_off_by_one_at_resume(uris: dict[str, str], ids: str | None) -> None:
    report = ll.check_resume(
        lambda r, w: loader(uris["a"], r, w, cls=OffByOne, shuffle=True), ids=ids, runs=30
    )
    found = report.divergence
    assert not report.ok and found is not None
    assert found.what == "the rows differ from the uninterrupted run's"
    assert found.got_samples[:-1] == [s + 1 for s in found.samples[:-1]]  # one sample on
    assert found.load == 1 and len(found.got) == len(found.expected) == len(found.samples)
    with pytest.raises(ll.ResumeCheckError, match=r"(?s)FAILED: run \d+, load 1: epoch"):
        report.raise_if_failed()


def test_it_finds_a_state_frozen_after_the_first_resume(uris: dict[str, str]) -> None:
    report = ll.check_resume(lambda r, w: loader(uris["a"], r, w, cls=Frozen), ids="id", runs=30)
    found = report.divergence
    assert found is not None and found.load >= 2, report  # the first resume is fine
    assert found.what == "the rows differ from the uninterrupted run's"
    assert found.got_samples[0] is not None and found.got_samples[0] < found.samples[0]  # again
    assert f"{found.load}. " in str(found)  # the stretch that went wrong is listed


def test_it_finds_an_epoch_skipped_at_its_end(uris: dict[str, str]) -> None:
    report = ll.check_resume(lambda r, w: loader(uris["a"], r, w, cls=SkipsTheEpochEnd), runs=30)
    found = report.divergence
    assert found is not None, str(report)
    assert found.what == f"delivered a batch past the end of epoch {found.epoch}"


def add_noise(batch: pa.RecordBatch) -> pa.RecordBatch:
    """A transform with its own randomness: no per-sample seed, other values on every run."""
    return batch.append_column("noise", pa.array(np.random.default_rng().random(len(batch))))


@pytest.mark.parametrize("contents", [False, True])
def test_a_transform_s_own_randomness_shows_in_contents_only(
    uris: dict[str, str], contents: bool
) -> None:
    report = ll.check_resume(
        lambda r, w: loader(uris["a"], r, w, transform=add_noise),
        runs=3,
        ids="id",
        contents=contents,
    )
    assert report.ok is not contents, str(report)


def test_an_error_after_a_resume_is_the_finding(uris: dict[str, str]) -> None:
    report = ll.check_resume(lambda r, w: loader(uris["a"], r, w, cls=FailsAfterResume), runs=5)
    found = report.divergence
    assert found is not None and found.load == 1, report
    assert found.what == "its next batch raised RuntimeError: no such fragment"


# --- mixture schedules and feedback (levanter#876: a stage transition one step early) --------


def mix(uris: dict[str, str], weights: Any) -> ll.Mix:
    sources = {n: ll.Loader(u, columns=["id", "v"], shuffle=True) for n, u in uris.items()}
    return ll.Mix(sources, weights=weights, samples_per_epoch=MIX_SAMPLES)


class EarlyStage(ll.Loader):
    """levanter#876: a resumed run's stage 2 starts one step before the schedule's stage (the
    uninterrupted run follows the schedule)."""

    def load_state_dict(self, state: dict[str, Any], allow_changes: tuple[str, ...] = ()) -> None:
        super().load_state_dict(state, allow_changes)
        if self.step < STAGE_STEP - 1:
            self.set_weights(STAGES[1], step=STAGE_STEP - 1)


def staged(uris: dict[str, str], rank: int, world: int, cls: type = ll.Loader) -> Any:
    """A two-stage mixture (``ll.Schedule``) keeping a global batch of 16 on any world size:
    the schedule counts steps, which are then the same samples on every world size."""
    schedule = ll.Schedule({0: STAGES[0], STAGE_STEP: STAGES[1]})
    return loader(mix(uris, schedule), rank, world, cls=cls, batch_size=16 // world, columns=None)


@pytest.mark.parametrize("early", [False, True])
def test_it_finds_a_stage_transition_one_step_early(uris: dict[str, str], early: bool) -> None:
    report = ll.check_resume(
        lambda r, w: staged(uris, r, w, EarlyStage if early else ll.Loader),
        runs=30,
        world_sizes=(1, 2, 4),
        allow_changes=("batch_size",),
        ids="id",
    )
    if not early:
        assert report.ok, str(report)
        return
    found = report.divergence
    assert found is not None, report
    assert found.epoch == 0 and found.samples[0] // 16 == STAGE_STEP - 1  # the step before


def feedback(loader: ll.Loader) -> None:
    """A training loop's feedback, as replayed from its checkpoint: weights set at steps."""
    for step, weights in ((3, {"a": 1, "b": 1}), (11, {"a": 1, "b": 5})):
        if loader.step == step:
            loader.set_weights(weights)


def test_feedback_on_a_schedule_resumes_exactly(uris: dict[str, str]) -> None:
    report = ll.check_resume(
        lambda r, w: staged(uris, r, w),
        runs=20,
        world_sizes=(2, 1, 4),
        allow_changes=("batch_size",),
        on_step=feedback,
        ids="id",
    )
    assert report.ok, str(report)
    assert report.elastic > 0


# --- correct compositions --------------------------------------------------------------------


@st.composite
def compositions(draw: st.DrawFn) -> dict[str, Any]:
    return {
        "order": draw(st.sampled_from(sorted(ORDERS))),
        "filter": draw(st.sampled_from([None, "v <> 3"])),
        "split": draw(st.booleans()),
        "pack": draw(st.booleans()),
        "mix": draw(st.booleans()),
        "workers": draw(st.integers(1, 2)),
        "world_sizes": tuple(draw(st.lists(st.integers(1, 3), min_size=1, max_size=3))),
        "drop_last": draw(st.booleans()),
        "seed": draw(st.integers(0, 3)),
        "schedule": draw(st.booleans()),  # a mix's: two stages, the second ramped
        "feedback": draw(st.booleans()),  # a mix's: set_weights at steps (on_step)
        "keep_global": draw(st.booleans()),  # the global batch on every world size
    }


def build(uris: dict[str, str], c: dict[str, Any], rank: int, world: int) -> ll.Loader:
    rows = {
        "filter": c["filter"],
        "splits": {"train": 0.8, "val": 0.2} if c["split"] else None,
        "split": "train" if c["split"] else None,
        **({"pack": ll.pack("tokens", 24), "columns": ["tokens"]} if c["pack"] else {}),
        **ORDERS[c["order"]],
        "seed": c["seed"],
    }
    if c["mix"]:
        sources = {n: ll.Loader(u, **{"columns": ["id", "v"], **rows}) for n, u in uris.items()}
        stages = {0: {"a": 2, "b": 1}, 3: {"a": 1, "b": 2}}
        weights = ll.Schedule(stages, ramps={3: 2}) if c["schedule"] else stages[0]
        data: Any = ll.Mix(sources, weights=weights)
        rows = {"columns": None}
    else:
        data = uris["a"]
    batch = 12 // world if steps_count(c) else 6
    return loader(
        data,
        rank,
        world,
        batch_size=batch,
        num_workers=c["workers"],
        drop_last=c["drop_last"],
        **rows,
    )


def steps_count(c: dict[str, Any]) -> bool:
    """Whether the loader keeps the global batch: weights that change at global steps are the
    same samples on every world size only so (the schedule counts steps)."""
    return c["keep_global"] or (c["mix"] and (c["schedule"] or c["feedback"]))


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(c=compositions())
def test_every_correct_composition_passes(uris: dict[str, str], c: dict[str, Any]) -> None:
    report = ll.check_resume(
        lambda r, w: build(uris, c, r, w),
        runs=4,
        world_sizes=c["world_sizes"],
        allow_changes=("batch_size",) if steps_count(c) else (),
        on_step=feedback if c["mix"] and c["feedback"] else None,
        seed=c["seed"],
    )
    assert report.ok, str(report)
    assert report.samples_compared > 0


class GrowsOnce:
    """A loader following its table (``follow=``), which gets 20 rows appended once, when the
    first loader to reach epoch 1 starts it: the reference run, built before any other."""

    def __init__(self, uri: str, rank: int, world: int) -> None:
        self.uri, self.rank, self.world_size = uri, rank, world
        self.inner = loader(uri, rank, world, columns=["id"], shuffle=True, follow=agree)

    def __iter__(self) -> Any:
        if self.inner.epoch == 1 and lance.dataset(self.uri).count_rows() == ROWS:
            rows = np.arange(ROWS, ROWS + 20)
            lance.write_dataset(pa.table({"id": rows}), self.uri, mode="append")
        return iter(self.inner)

    def plan(self, start: int = 0) -> ll.Plan:
        return self.inner.plan(start)

    def state_dict(self) -> dict[str, Any]:
        return self.inner.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state)

    def close(self) -> None:
        self.inner.close()


def agree(newest: int) -> int:
    """Every rank of the check is in this process and sees the same table: its newest version."""
    return newest


def test_a_followed_growing_table_resumes_exactly(tmp_path: Any) -> None:
    uri = str(tmp_path / "grows.lance")
    lance.write_dataset(pa.table({"id": np.arange(ROWS)}), uri, max_rows_per_file=100)
    report = ll.check_resume(
        lambda r, w: GrowsOnce(uri, r, w), runs=20, world_sizes=(1, 2, 3), epochs=3, ids="id"
    )
    assert report.ok, str(report)
    assert lance.dataset(uri).count_rows() == ROWS + 20  # grown once, read in epochs 1 and 2
    assert report.samples_compared >= 20 * 8


def test_process_workers_pass(uris: dict[str, str]) -> None:
    report = ll.check_resume(
        lambda r, w: loader(uris["a"], r, w, shuffle=True, num_workers=2, worker_type="process"),
        runs=2,
        world_sizes=(1, 2),
        resumes=2,
        ids="id",
        contents=True,
    )
    assert report.ok, str(report)


def test_bad_arguments_name_the_fix(uris: dict[str, str]) -> None:
    make = lambda r, w: loader(uris["a"], r, w)  # noqa: E731
    with pytest.raises(ValueError, match=r"world_sizes must be whole numbers >= 1"):
        ll.check_resume(make, world_sizes=(0,))
    with pytest.raises(ValueError, match=r"resumes must be a whole number >= 1, got 0"):
        ll.check_resume(make, resumes=0)
    with pytest.raises(ValueError, match=r"runs must be a whole number >= 1, got 0"):
        ll.check_resume(make, runs=0)
    with pytest.raises(ValueError, match=r"delivered no batch in 2 epochs on 1 ranks"):
        ll.check_resume(lambda r, w: loader(uris["a"], r, w, filter="v > 10"))
    with pytest.raises(ValueError, match=r"ids='nope' is not a column .*\['id', 'v'\]"):
        ll.check_resume(make, ids="nope", runs=1)
    with pytest.raises(ValueError, match=r"built a loader of rank 0 of 1: pass rank=rank"):
        ll.check_resume(lambda r, w: loader(uris["a"], 0, 1), world_sizes=(2,))
