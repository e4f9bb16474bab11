"""check_resume: does *this* loader resume exactly? A differential check users run before a long job.

:func:`check_resume` builds the user's loader with ``make_loader(rank, world_size)`` and runs:

* **the reference**: one uninterrupted run of ``epochs`` epochs on ``world_sizes[0]`` ranks in
  lock-step. Each delivered row is filed under its global sample of the epoch's order (which
  :class:`~lanceloader.ordering.plan.Plan` deals out to ranks); its state after every step is
  kept (JSON round-tripped, as a checkpoint file would hold it);
* **interrupted runs**, kill-free: each starts from the reference's state at a random step
  (seeded; O(1) positioning: a run does not replay from step 0, its first load is its first
  resume), then ``resumes`` times iterates a random number of steps (0 to an epoch's, so
  stretches cross epoch ends; a save lands mid-epoch, at an epoch's end before
  ``StopIteration`` or after it), takes every rank's ``state_dict()``, builds fresh loaders on a
  world size drawn from ``world_sizes`` (N -> M), ``load_state_dict``s and continues.

Every row an interrupted run delivers is compared with the reference's row at the same global
sample: by the ``ids`` column, or without one by a hash of the row's contents (every column);
``contents=True`` compares the hash as well. Batch boundaries may differ after a world size
change (the plan of a resumed epoch starts at the resume's sample); samples are what must match.
A chain of resumes catches a state that stops advancing after a load (datasets#8308: the second
resume restarts from the first). The first divergence ends the check; :class:`ResumeReport`
says where (run, epoch, step, rank, samples, rows expected and got, the run's resumes).

What it cannot see: randomness a transform draws outside ``ll.random_map`` (no per-sample
seed), data changed outside the loader, and the training loop's own state (docs/check-resume.md).

Example::

    >>> import tempfile
    >>> import lanceloader as ll
    >>> from lanceloader.demo import write_demo_dataset
    >>> uri = write_demo_dataset(tempfile.mkdtemp() + "/demo.lance", rows=200)
    >>> def make_loader(rank, world_size):
    ...     return ll.Loader(uri, batch_size=16, columns=["id"], shuffle=True, rank=rank,
    ...                      world_size=world_size, num_workers=1)
    >>> report = ll.check_resume(make_loader, runs=5, world_sizes=(1, 2), ids="id")
    >>> report.ok, report.runs, report.samples_compared > 0
    (True, 5, True)
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lanceloader.batch.row_hashes import batch_columns, row_hashes
from lanceloader.ordering.plan import Plan
from lanceloader.resume_report import ResumeDivergence, ResumeReport, row_names

_END = object()  # what next(iterator, _END) gives at an epoch's end
MAX_POINTS = 5_000  # reference states kept to start runs from (every k-th step beyond)


def check_resume(
    make_loader: Callable[[int, int], Any],
    *,
    runs: int = 100,
    world_sizes: Sequence[int] = (1, 2),
    resumes: int = 3,
    epochs: int = 2,
    ids: str | None = None,
    contents: bool = False,
    allow_changes: Sequence[str] = (),
    max_steps: int | None = None,
    on_step: Callable[[Any], None] | None = None,
    seed: int = 0,
) -> ResumeReport:
    """Check that ``make_loader``'s loader resumes exactly (the module's text says how).

    Args:
        make_loader: ``make_loader(rank, world_size)`` builds a fresh loader of rank ``rank``
            of ``world_size`` (an ``ll.Loader``, or anything with ``plan()``, ``__iter__``,
            ``state_dict()`` and ``load_state_dict()``), as the training job builds it.
        runs: interrupted runs, each a chain of ``resumes`` + 1 loads.
        world_sizes: the reference runs on the first; each stretch of a run on one drawn from all.
        resumes: save -> rebuild -> load cycles per run after its first load (>= 1).
        epochs: epochs of the reference; runs stay within them.
        ids: a column holding a row's id; ``None``: a row is named by a hash of its contents.
        contents: with ``ids``, compare the contents' hash too (a right id with wrong data).
        allow_changes: passed to ``load_state_dict`` (e.g. ``("batch_size",)`` when the
            factory keeps the global batch by changing the per-rank one).
        max_steps: the longest stretch between resumes; default half an epoch's steps (a run
            then spans about ``resumes / 4`` epochs and starts where it fits in the reference).
        on_step: called with each rank's loader before each of its batches, in the reference
            and in every interrupted run: what the training loop does to the loader, e.g.
            ``loader.set_weights(...)`` at a step. A function of the loader's position (such
            as ``loader.step``), as a loop replaying its checkpointed feedback would be.
        seed: draws the runs (run ``i`` depends on ``(seed, i)`` only).

    Returns a :class:`ResumeReport`; ``report.raise_if_failed()`` raises on a divergence.
    Errors building the loader or in the reference run are raised; an error while resuming or
    delivering after a resume is the report's divergence.
    """
    sizes = _check_arguments(runs, world_sizes, resumes, epochs)
    began, cpu = time.perf_counter(), time.process_time()
    steps = _Steps(make_loader, (ids, contents), on_step)
    reference = _Reference.record(steps, sizes[0], epochs)
    checker = _Runs(steps, reference, sizes, tuple(allow_changes), max_steps, seed)
    divergence = None
    done = 0
    for run in range(runs):
        done += 1
        divergence = checker.run(run, resumes)
        if divergence is not None:
            break
    took = (time.perf_counter() - began, time.process_time() - cpu)
    return ResumeReport(done, *checker.counts(), epochs, sizes, *took, divergence)


def _check_arguments(
    runs: int, world_sizes: Sequence[int], resumes: int, epochs: int
) -> tuple[int, ...]:
    for name, value, least in (("runs", runs, 1), ("resumes", resumes, 1), ("epochs", epochs, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(
                f"check_resume: {name} must be a whole number >= {least}, got {value!r}"
            )
    sizes = tuple(world_sizes)
    if not sizes or any(isinstance(w, bool) or not isinstance(w, int) or w < 1 for w in sizes):
        raise ValueError(
            f"check_resume: world_sizes must be whole numbers >= 1, e.g. (1, 2, 4); got {world_sizes!r}"
        )
    return sizes


# --- naming delivered rows ---------------------------------------------------------------------


class _Steps:
    """How the check builds loaders, takes a step (``on_step``, then ``next``), and names the
    rows delivered: the ``ids`` column's value, or a hash of the row's contents."""

    def __init__(
        self,
        make: Callable[[int, int], Any],
        keys: tuple[str | None, bool],
        on_step: Callable[[Any], None] | None,
    ) -> None:
        self.make, self.on_step = make, on_step
        self.ids, self.contents = keys[0], keys[1] or keys[0] is None

    def build(self, world: int) -> list[Any]:
        """Fresh loaders of every rank of ``world``, checked to be those ranks."""
        loaders = [self.make(r, world) for r in range(world)]
        for r, loader in enumerate(loaders):
            got = (getattr(loader, "rank", r), getattr(loader, "world_size", world))
            if got != (r, world):
                raise ValueError(
                    f"check_resume: make_loader({r}, {world}) built a loader of rank {got[0]} "
                    f"of {got[1]}: pass rank=rank, world_size=world_size to the Loader"
                )
        return loaders

    def take(self, loader: Any, iterator: Any) -> Any:
        """The loader's next batch (``_END`` at the epoch's end), ``on_step`` called first."""
        if self.on_step is not None:
            self.on_step(loader)
        return next(iterator, _END)

    def rows(self, batch: Any) -> tuple[np.ndarray | None, np.ndarray | None]:
        """``(ids, hashes)`` of a batch's rows (either ``None`` when not compared)."""
        columns = batch_columns(batch)
        named = None
        if self.ids is not None:
            if self.ids not in columns:
                raise ValueError(
                    f"check_resume: ids={self.ids!r} is not a column of the batches (they have "
                    f"{sorted(columns)}): name a column the loader delivers, or ids=None to "
                    "name rows by a hash of their contents"
                )
            named = columns[self.ids]
        return named, row_hashes(columns) if self.contents else None


# --- the reference --------------------------------------------------------------------------


@dataclass
class _Point:
    """A place of the reference run to start interrupted runs from: its every rank's state."""

    epoch: int
    sample: int
    step: int  # global steps of the epoch delivered
    states: list[dict[str, Any]]


@dataclass
class _Epoch:
    """The rows the reference delivered in one epoch, by global sample."""

    num_samples: int
    ids: np.ndarray | None = None
    hashes: np.ndarray | None = None
    covered: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, bool))

    def __post_init__(self) -> None:
        self.covered = np.zeros(self.num_samples, bool)

    def put(self, samples: np.ndarray, ids: np.ndarray | None, hashes: np.ndarray | None) -> None:
        if ids is not None:
            if self.ids is None:
                kind = ids.dtype if ids.dtype.kind in "biu" else object
                self.ids = np.zeros(self.num_samples, kind)
            self.ids[samples] = ids
        if hashes is not None:
            if self.hashes is None:
                self.hashes = np.zeros(self.num_samples, np.uint64)
            self.hashes[samples] = hashes
        self.covered[samples] = True

    def names(self, samples: np.ndarray) -> list[Any]:
        """How the report shows the rows at ``samples``: ids, or short hashes."""
        pick = [None if a is None else a[samples] for a in (self.ids, self.hashes)]
        return row_names(*pick)

    def where(self, ids: np.ndarray | None, hashes: np.ndarray | None) -> list[int | None]:
        """The samples of this epoch that hold these rows (``None``: not in the epoch)."""
        mine, theirs = (self.ids, ids) if ids is not None else (self.hashes, hashes)
        assert mine is not None and theirs is not None
        first: dict[Any, int] = {}
        for s in np.flatnonzero(self.covered).tolist():
            first.setdefault(mine[s], s)
        return [first.get(v) for v in theirs.tolist()]


@dataclass
class _Reference:
    """The uninterrupted run: its rows per epoch and its states at each step."""

    epochs: list[_Epoch]
    points: list[_Point]
    steps_per_epoch: int
    stride: int = 1  # steps between two points kept

    @classmethod
    def record(cls, steps: _Steps, world: int, epochs: int) -> _Reference:
        loaders = steps.build(world)
        out = cls([], [], 0)
        try:
            for e in range(epochs):
                out.points.append(_Point(e, 0, 0, _states(loaders)))
                iterators = [iter(loader) for loader in loaders]  # follow=True adopts here
                plans = [loader.plan(0) for loader in loaders]
                epoch = _Epoch(plans[0].num_samples)
                out.epochs.append(epoch)
                out.steps_per_epoch = max(out.steps_per_epoch, len(plans[0]))
                for k in range(len(plans[0])):
                    for r, (loader, it) in enumerate(zip(loaders, iterators, strict=True)):
                        batch = steps.take(loader, it)
                        if batch is _END:
                            raise ValueError(
                                f"check_resume: the reference run's rank {r} ended epoch {e} "
                                f"after {k} of the {len(plans[0])} batches its plan() promised"
                            )
                        epoch.put(plans[r].batch_samples(k), *steps.rows(batch))
                    out.points.append(
                        _Point(e, plans[0].samples_done(k + 1), k + 1, _states(loaders))
                    )
                if any(next(it, _END) is not _END for it in iterators):
                    raise ValueError(
                        f"check_resume: the reference run delivered more than the "
                        f"{len(plans[0])} batches of epoch {e} its plan() promised"
                    )
        finally:
            _close(loaders)
        if out.steps_per_epoch == 0:
            raise ValueError(
                f"check_resume: the loader delivered no batch in {epochs} epochs on "
                f"{world} ranks: nothing to resume (is its dataset, filter or split empty?)"
            )
        out.stride = -(-len(out.points) // MAX_POINTS)
        out.points = out.points[:: out.stride]
        return out


def _states(loaders: list[Any]) -> list[dict[str, Any]]:
    """Every rank's state as a checkpoint file holds it (JSON round-tripped)."""
    return [json.loads(json.dumps(loader.state_dict())) for loader in loaders]


def _close(loaders: list[Any]) -> None:
    for loader in loaders:
        if hasattr(loader, "close"):
            loader.close()


# --- the interrupted runs -------------------------------------------------------------------


class _Runs:
    """Interrupted runs against one reference; counts what they compared."""

    def __init__(
        self,
        steps: _Steps,
        reference: _Reference,
        world_sizes: tuple[int, ...],
        allow_changes: tuple[str, ...],
        max_steps: int | None,
        seed: int,
    ) -> None:
        self.steps, self.reference = steps, reference
        self.world_sizes, self.allow, self.seed = world_sizes, allow_changes, seed
        half = reference.steps_per_epoch // 2
        self.max_steps = max(1, half if max_steps is None else max_steps)
        self.loads = self.elastic = self.compared = self.not_comparable = 0
        self.schedule: list[str] = []  # the current run's stretches, for its report

    def counts(self) -> tuple[int, int, int, int]:
        """Loads, of those onto another world size, samples compared, samples not comparable."""
        return self.loads, self.elastic, self.compared, self.not_comparable

    def run(self, run: int, resumes: int) -> ResumeDivergence | None:
        """One chain of ``resumes`` + 1 loads from a random reference point."""
        rng = np.random.default_rng([self.seed, run])
        points = self.reference.points
        reach = resumes * self.max_steps // 2 // self.reference.stride  # a run's mean, in points
        point = points[rng.integers(max(1, len(points) - reach))]
        states, e, s, step = point.states, point.epoch, point.sample, point.step
        self.schedule.clear()
        for load in range(1, resumes + 2):
            if e >= len(self.reference.epochs):
                return None  # the run reached the reference's end
            world = int(rng.choice(self.world_sizes))
            budget = int(rng.integers(1 if load == resumes + 1 else 0, self.max_steps + 1))
            here = _Stretch(self, run, load, world, e, s, step)
            self.schedule.append(
                f"{len(states)} -> {world} ranks at epoch {e}, sample {s}; {budget} steps"
            )
            found = here.resume(states) or here.deliver(budget, rng)
            if found is not None:
                return found
            saved = here.save()
            if isinstance(saved, ResumeDivergence):
                return saved
            states, e, s, step = saved, here.epoch, here.sample, here.step
        return None


class _Stretch:
    """One stretch of a run: fresh loaders on ``world`` ranks, loaded, stepped in lock-step."""

    def __init__(
        self, runs: _Runs, run: int, load: int, world: int, e: int, s: int, step: int
    ) -> None:
        self.runs, self.run, self.load, self.world = runs, run, load, world
        self.epoch, self.sample, self.step = e, s, step
        self.loaders: list[Any] = []

    def diverged(self, rank: int, what: str, **rows: Any) -> ResumeDivergence:
        _close(self.loaders)
        return ResumeDivergence(
            self.run,
            self.load,
            self.epoch,
            self.step,
            rank,
            self.world,
            what,
            schedule=list(self.runs.schedule),
            **rows,
        )

    def resume(self, states: list[dict[str, Any]]) -> ResumeDivergence | None:
        self.loaders = self.runs.steps.build(self.world)
        self.plans = [loader.plan(0) for loader in self.loaders]  # fresh: the factory's batching
        self.runs.loads += 1
        self.runs.elastic += len(states) != self.world
        extra = {"allow_changes": self.runs.allow} if self.runs.allow else {}
        for r, loader in enumerate(self.loaders):
            try:
                loader.load_state_dict(states[r % len(states)], **extra)
            except Exception as exc:  # the loader's error, reported where it happened
                return self.diverged(r, f"load_state_dict raised {type(exc).__name__}: {exc}")
        return None

    def deliver(self, budget: int, rng: np.random.Generator) -> ResumeDivergence | None:
        """Step every rank ``budget`` times (across epoch ends), comparing every row."""
        epochs = self.runs.reference.epochs
        while self.epoch < len(epochs):
            ref = epochs[self.epoch]
            plans = [
                dataclasses.replace(p, num_samples=ref.num_samples, start=self.sample)
                for p in self.plans
            ]
            iterators = []
            for r, loader in enumerate(self.loaders):
                try:
                    iterators.append(iter(loader))
                except Exception as exc:  # the loader's error, reported
                    return self.diverged(r, f"iter() raised {type(exc).__name__}: {exc}")
            for k in range(len(plans[0])):
                if budget == 0:
                    return None  # saved mid-epoch
                for r, (loader, it) in enumerate(zip(self.loaders, iterators, strict=True)):
                    try:
                        batch = self.runs.steps.take(loader, it)
                    except Exception as exc:  # the loader's (or on_step's) error, reported
                        return self.diverged(
                            r, f"its next batch raised {type(exc).__name__}: {exc}"
                        )
                    found = self.compare(r, plans[r], k, batch)
                    if found is not None:
                        return found
                budget -= 1
                self.step += 1
                self.sample = plans[0].samples_done(k + 1)
            if budget == 0 and rng.random() < 0.5:
                return None  # saved at the epoch's end, before StopIteration
            for r, it in enumerate(iterators):
                if next(it, _END) is not _END:
                    return self.diverged(r, f"delivered a batch past the end of epoch {self.epoch}")
            self.epoch, self.sample, self.step = self.epoch + 1, 0, 0
        return None

    def compare(self, rank: int, plan: Plan, k: int, batch: Any) -> ResumeDivergence | None:
        samples = plan.batch_samples(k)
        if batch is _END:
            return self.diverged(
                rank,
                f"the epoch ended {len(plan) - k} batches early (at sample {plan.samples_done(k)} "
                f"of {plan.num_samples})",
                samples=samples.tolist(),
            )
        ref = self.runs.reference.epochs[self.epoch]
        ids, hashes = self.runs.steps.rows(batch)
        covered = ref.covered[samples]
        same = len(row_names(ids, hashes)) == len(samples)
        for mine, got in ((ref.ids, ids), (ref.hashes, hashes)):
            if same and mine is not None and got is not None:
                same = bool(np.array_equal(mine[samples[covered]], got[covered]))
        if not same:
            return self.diverged(
                rank,
                "the rows differ from the uninterrupted run's",
                samples=samples.tolist(),
                expected=ref.names(samples),
                got=row_names(ids, hashes),
                got_samples=ref.where(ids, hashes),
            )
        self.runs.compared += int(covered.sum())
        self.runs.not_comparable += int(len(samples) - covered.sum())
        return None

    def save(self) -> list[dict[str, Any]] | ResumeDivergence:
        """Every rank's state (they must agree), then the loaders closed."""
        try:
            states = _states(self.loaders)
        except (TypeError, ValueError) as exc:
            return self.diverged(0, f"state_dict() is not JSON-safe: {exc}")
        _close(self.loaders)
        for r, state in enumerate(states[1:], 1):
            if state != states[0]:
                differ = sorted(k for k in {*state, *states[0]} if state.get(k) != states[0].get(k))
                return self.diverged(r, f"its state differs from rank 0's in {differ}")
        return states
