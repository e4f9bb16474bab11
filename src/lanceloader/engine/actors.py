"""Ray actor workers: batches built on other machines of a Ray cluster, exactly as local workers
build them.

A batch is a pure function of its task (:class:`~lanceloader.engine.work.BatchWork`: rows,
order, transform; ``random_map`` draws from the rows' keys), so any actor on any node builds
the same bytes, and a lost actor's task is built again elsewhere with the same result.

Contract of an :class:`ActorPool` (a :class:`~lanceloader.engine.pool.Pool`):

* ``num_workers`` Ray actors (:class:`BatchActor`), each created with the user's
  ``ray_options`` (``num_cpus``, ``resources``, ``scheduling_strategy``, ...: Ray places them),
  receive the batch work once: the bytes a process worker gets (a
  :class:`~lanceloader.engine.pickling.Shipment`, put once in Ray's object store; the rows' URIs
  and storage options travel inside it and are never printed). Then they get tasks; each
  answers with one object per task (a :class:`TaskResult` of NumPy batches, which Ray hands out
  zero-copy from its object store, read-only).
* ``submit`` gives a task to the live actor with the fewest unfinished tasks; ``take`` returns
  results in task order. Until an actor is up (it answered ``where()``: seconds, for its
  imports and the dataset it opens) the consumer builds the tasks itself, in ``take``, so the
  first batch comes as soon as a local worker's would; the actors take every task not yet
  built once one answers (``stats()``: ``local_s``). The caller bounds the tasks in flight
  (:class:`~lanceloader.engine.pool.Ordered`), so a slow training loop never lets actors fill
  memory: at most that many reads' results exist. Finished results are pulled to this node
  ahead of their turn (``fetch_local``).
* An actor that dies (``ray.kill``, its process killed, its node gone: ``RayActorError``,
  ``WorkerCrashedError``, a lost object) is dropped: its unfinished tasks, split into one task
  per batch (:mod:`~lanceloader.engine.parts`), go to the least busy live actors in task order
  through ``run_now`` (a concurrency group of its own: they run at once, beside the task an
  actor is running, not behind its queue), or are built in this process while none is ready;
  ``take`` hands a lost read's batches out as they are back, in order (the loop waits for its
  next batch, not for the read's last). A replacement starts (at
  most ``num_workers`` in the pool's life) and takes tasks once it answers. Nothing is lost or
  repeated: each task's result is taken once, at its turn. With no live actor left and none to
  start, :class:`ActorsLostError`.
* Every wait is bounded: no result for ``stall_timeout`` seconds raises
  :class:`~lanceloader.engine.threads.Stalled` naming the actor (number, pid, node) with its
  stack (asked of the actor through a second concurrency group), or saying it never started.
  The wait wakes every :data:`POLL_S` for signals and dead actors.
* ``discard()`` cancels the tasks in flight (a running one finishes, its result dropped) and
  keeps the actors: a loader keeps them across epochs (:func:`actor_pool`). ``close()``
  (idempotent; also on garbage collection) kills every actor at once.

Ray must be connected (``ray.init(address=...)``, or a Ray Train worker); otherwise
:func:`connect` calls ``ray.init()``, as Ray Data does (the cluster at ``RAY_ADDRESS``, or a
local one).
"""

from __future__ import annotations

import logging
import os
import pickle
import time
import uuid
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import ray
import ray.exceptions

from lanceloader.arguments import check_ray_options
from lanceloader.engine.batch_actor import CONCURRENCY_GROUPS, BatchActor, cause_of, connect
from lanceloader.engine.parts import merge
from lanceloader.engine.pickling import Shipment
from lanceloader.engine.pool import KeptPool
from lanceloader.engine.stalls import ActorsLostError, ActorStartError
from lanceloader.engine.threads import Stalled, check_same_process
from lanceloader.engine.work import BatchWork, TaskResult

_logger = logging.getLogger("lanceloader")

POLL_S = 0.2  # the consumer's wait wakes this often: Ctrl-C, dead actors
STACK_WAIT_S = 2.0  # how long a stalled actor gets to send its stack
# What says an actor (its process, its node, or a result on it) is gone: its task is rebuilt.
LOST = (
    ray.exceptions.RayActorError,
    ray.exceptions.WorkerCrashedError,
    ray.exceptions.ObjectLostError,
    ray.exceptions.NodeDiedError,
)


@dataclass
class _Actor:
    """One actor of the pool: its handle, where it runs once known, and its unfinished tasks."""

    number: int
    handle: Any
    started: Any  # the ref of its where(): ready once the actor is up
    eligible: bool = False  # takes tasks: once it answered where() (it is up)
    pid: int = 0
    node: str = ""
    dead: bool = False
    unfinished: int = 0

    def name(self) -> str:
        where = f"pid {self.pid} on node {self.node}" if self.pid else "not started yet"
        return f"ray actor {self.number} ({where})"


@dataclass
class _Part:
    """One batch of a lost actor's task, sent at once to a live actor (None: built here);
    handed out as soon as it and the parts before it are back (its result or its error)."""

    task: Any
    actor: _Actor | None = None
    ref: Any = None
    result: TaskResult | None = None
    error: BaseException | None = None

    @property
    def back(self) -> bool:
        return self.result is not None or self.error is not None


@dataclass
class _Task:
    """A task in flight: its place in order, the actor on it (None: built here, or its parts),
    its ref; once its actor is lost, its batches as parts (:mod:`~lanceloader.engine.parts`)
    not yet handed out."""

    index: int
    task: Any
    actor: _Actor | None
    ref: Any
    sent: float
    parts: list[_Part] = field(default_factory=list)


class ActorPool:
    """Results of ``work`` over the tasks submitted, in order, from ``num_workers`` Ray actors
    (see the module text)."""

    def __init__(
        self,
        work: BatchWork | Shipment,
        num_workers: int,
        stall_timeout: float | None = None,
        ray_options: Mapping[str, Any] | None = None,
    ) -> None:
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1 Ray actor, got {num_workers}")
        connect()
        self.stall_timeout = stall_timeout
        self.shipment = work if isinstance(work, Shipment) else Shipment.of(work)
        self._local: BatchWork | None = None if isinstance(work, Shipment) else work
        self._options = check_ray_options(ray_options)
        self.owner = os.getpid()
        self._closed = False
        self._name = f"lanceloader-{uuid.uuid4().hex[:8]}"  # its actors': {name}-{number}
        self._replacements = self._replacements_total = num_workers
        self._class = ray.remote(concurrency_groups=CONCURRENCY_GROUPS)(BatchActor)  # type: ignore[call-overload]
        # once, shared by every actor: the pickle and its arrays (Ray keeps NumPy zero-copy)
        arrays = [np.frombuffer(b.raw(), np.uint8) for b in self.shipment.buffers]
        self._work_ref = ray.put((self.shipment.data, arrays))
        self._actors = [self._start(i) for i in range(num_workers)]
        self._pending: deque[_Task] = deque()
        self._done: dict[int, tuple[Any, BaseException | None]] = {}
        self._submitted = 0
        self.rebuilt = 0  # tasks sent again after their actor was lost
        self._built_here = 0  # tasks built in this process (no actor up for them)

    @property
    def num_workers(self) -> int:
        """The actors asked for (replacements take the place of dead ones)."""
        return self._replacements_total

    def _start(self, number: int) -> _Actor:
        handle = self._class.options(
            **self._options, max_restarts=0, name=f"{self._name}-{number}"
        ).remote(self._work_ref)
        return _Actor(number, handle, handle.where.remote())

    # --- submitting --------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        """Tasks submitted and not yet handed out."""
        return len(self._pending)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def live(self) -> list[_Actor]:
        return [a for a in self._actors if not a.dead]

    def submit(self, task: Any) -> None:
        """Send ``task`` to the least busy live actor (built here when none is ready)."""
        pending = _Task(self._submitted, task, None, None, time.monotonic())
        self._check_started()
        self._send(pending)
        self._pending.append(pending)
        self._submitted += 1

    def _send(self, pending: _Task) -> None:
        ready = [a for a in self._actors if a.eligible and not a.dead]
        if not ready:
            pending.actor, pending.ref = None, None
            return
        actor = min(
            ready, key=lambda a: (a.unfinished, (a.number - pending.index) % len(self._actors))
        )
        actor.unfinished += 1
        pending.actor, pending.ref = actor, actor.handle.run.remote(pending.task)

    def _check_started(self) -> None:
        """Mark the actors that answered where(): they take tasks from then on, those built
        here meanwhile included (all but one being built now: this runs in the consumer)."""
        waiting = {a.started: a for a in self._actors if not a.pid and not a.dead}
        if not waiting:
            return
        up, _ = ray.wait(list(waiting), num_returns=len(waiting), timeout=0, fetch_local=True)
        for ref in up:
            actor = waiting[ref]
            try:
                actor.pid, actor.node = ray.get(ref)
                actor.eligible = True
            except LOST as exc:
                self._lost(actor, exc)
        if up and any(a.eligible and not a.dead for a in self._actors):
            for pending in self._pending:
                if pending.index in self._done:
                    continue
                if pending.actor is None and not pending.parts:
                    self._send(pending)
                for part in pending.parts:
                    if part.actor is None and not part.back:
                        self._send_part(part)

    def ready(self, timeout: float | None = None) -> bool:
        """Wait until an actor is up (at most ``timeout`` seconds); whether one is."""
        waiting = [a.started for a in self._actors if not a.dead]
        if waiting:
            ray.wait(waiting, num_returns=1, timeout=timeout, fetch_local=True)
        self._check_started()
        return any(a.eligible and not a.dead for a in self._actors)

    # --- handing out ---------------------------------------------------------------------

    def take(self) -> Any:
        """The oldest task's result (its error re-raised), waiting at most ``stall_timeout``;
        a lost task's batches are handed out as they are back (the parts ready, in order),
        the task taken with its last."""
        check_same_process(self.owner)
        self._check_started()
        head = self._pending[0]
        deadline = None if self.stall_timeout is None else time.monotonic() + self.stall_timeout
        while head.index not in self._done:
            if head.actor is None and not head.parts:  # no actor was ready for it: built here
                self._done[head.index] = (self._build_here(head.task), None)
                break
            if head.parts:
                first = head.parts[0]
                if first.actor is None and not first.back:  # no actor was ready for it
                    first.result = self._build_here(first.task)
                if first.back:
                    return self._hand_out(head)
            left = POLL_S if deadline is None else min(POLL_S, deadline - time.monotonic())
            if left <= 0:
                raise self._stalled(head)
            self._collect(left)
        self._pending.popleft()
        result, error = self._done.pop(head.index)
        if error is not None:
            raise error
        return result

    def _hand_out(self, head: _Task) -> TaskResult:
        """The parts of ``head`` back at its front, as one result (the first part's error
        raised); the task is taken with its last part."""
        ready = 0
        while ready < len(head.parts) and head.parts[ready].result is not None:
            ready += 1
        if not ready:  # its first part's error: the task's
            self._pending.popleft()
            error = head.parts[0].error
            assert error is not None
            raise error
        results = [p.result for p in head.parts[:ready] if p.result is not None]
        del head.parts[:ready]
        if not head.parts:
            self._pending.popleft()
        return merge(results)

    def _build_here(self, task: Any) -> TaskResult:
        """``task``'s result, built in this process (no actor was ready for it)."""
        if not self._built_here:
            _logger.info("lanceloader: no Ray actor up: this process builds batches")
        self._built_here += 1
        result = self._local_work()(task).after_transport()
        result.seconds["local"] = sum(result.seconds.values())  # (stats: local_s)
        return result

    def _local_work(self) -> BatchWork:
        """The work, in this process: for tasks no actor is ready to take."""
        if self._local is None:
            self._local = pickle.loads(self.shipment.data, buffers=self.shipment.buffers)
        return self._local

    def _collect(self, timeout: float) -> None:
        """Take the results that are here within ``timeout`` (and start pulling the rest)."""
        self._check_started()
        sent: dict[Any, tuple[_Task, _Part | None]] = {}
        for pending in self._pending:
            if pending.index in self._done:
                continue
            if pending.ref is not None:
                sent[pending.ref] = (pending, None)
            sent.update({p.ref: (pending, p) for p in pending.parts if p.ref is not None})
        if not sent:
            return
        refs = list(sent)
        first, _ = ray.wait(refs, num_returns=1, timeout=timeout, fetch_local=True)
        if not first:
            return
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=True)
        for ref in ready:  # (each checked: not sent again meanwhile, after its actor died)
            pending, part = sent[ref]
            if part is not None and part.ref is ref:
                self._receive_part(part)
            elif part is None and pending.ref is ref:
                self._receive(pending)

    def _receive(self, pending: _Task) -> None:
        actor = pending.actor
        assert actor is not None
        got = self._get(actor, pending.ref)
        if got is None:
            return
        self._done[pending.index] = got
        pending.ref = None

    def _receive_part(self, part: _Part) -> None:
        actor = part.actor
        assert actor is not None
        got = self._get(actor, part.ref)
        if got is None:
            return
        part.result, part.error = got
        part.ref = None

    def _get(self, actor: _Actor, ref: Any) -> tuple[Any, BaseException | None] | None:
        """The ready object ``ref`` of ``actor``'s: (result, None), or (None, the work's error,
        noted with the actor); None when the actor was lost (its tasks are sent again)."""
        t0 = time.perf_counter()
        try:
            result = ray.get(ref).after_transport()  # (the batches cut from their arrays)
        except LOST as exc:
            self._lost(actor, exc)
            return None
        except ray.exceptions.RayTaskError as exc:  # the work raised: the user's error
            error = exc.cause if isinstance(exc.cause, BaseException) else exc
            if error is not exc and hasattr(error, "add_note"):
                error.add_note(f"in {actor.name()}:\n{exc}")
            actor.unfinished -= 1
            return None, error
        # the consumer's time to get it: what was not pulled yet, deserializing
        result.seconds["transfer"] = time.perf_counter() - t0
        actor.unfinished -= 1
        return result, None

    def _send_part(self, part: _Part) -> None:
        """Send ``part`` to the least busy ready actor, to run at once (built here if none)."""
        ready = [a for a in self._actors if a.eligible and not a.dead]
        if not ready:
            part.actor, part.ref = None, None
            return
        actor = min(ready, key=lambda a: (a.unfinished, a.number))
        actor.unfinished += 1
        part.actor, part.ref = actor, actor.handle.run_now.remote(part.task)

    def _lost(self, actor: _Actor, exc: BaseException) -> None:
        """``actor`` is gone: its unfinished tasks go to the others (in order), a replacement
        starts; with no live actor and none to start, :class:`ActorsLostError`. An actor that
        could not load the work raises :class:`ActorStartError` at once (another would fail
        the same way)."""
        if getattr(exc, "actor_init_failed", False):
            raise ActorStartError(
                f"{actor.name()} could not load the batch work: {cause_of(exc)}. Every module "
                "the rows and the transform use must be importable on the cluster's nodes: "
                "install it there, ship it with ray_options={'runtime_env': {'py_modules': "
                "[module]}}, or define the transform in the training script (what __main__ "
                "defines travels by value)"
            ) from exc
        if not actor.dead:
            actor.dead = True
            _logger.warning(
                "lanceloader: %s died (%s): its unfinished batches are built again at once "
                "by the other actors, one task per batch, in order",
                actor.name(),
                type(exc).__name__,
            )
            if self._replacements > 0:
                self._replacements -= 1
                self._actors.append(self._start(len(self._actors)))
        if not self.live:
            raise ActorsLostError(
                f"all {len(self._actors)} Ray actors of this loader died (the last: "
                f"{actor.name()}: {cause_of(exc)}), and no "
                "more are started in their place. Check the cluster (`ray status`): nodes "
                "lost, out of memory; or use worker_type='process' or 'thread'"
            ) from exc
        for pending in self._pending:  # its tasks' batches, each at once on a live actor
            if pending.index in self._done:
                continue
            if pending.actor is actor:
                self.rebuilt += 1
                pending.actor, pending.ref = None, None
                pending.parts = [_Part(task) for task in pending.task.split()]
            for part in pending.parts:
                if not part.back and part.actor in (actor, None):
                    self._send_part(part)

    def _stalled(self, head: _Task) -> Stalled:
        assert self.stall_timeout is not None
        waiting = [p.actor for p in head.parts if not p.back and p.actor is not None]
        actor = head.actor or waiting[0]
        if not actor.pid:  # started since the last look?
            ray.wait([actor.started], timeout=STACK_WAIT_S, fetch_local=True)
            self._check_started()
        if not actor.pid:
            stack = (
                "(the actor has not started: Ray has not placed it, or it is still starting; "
                f"it asks for {self._options}: `ray status` shows pending actors and the "
                "cluster's free resources)\n"
            )
        else:
            try:
                stack = ray.get(actor.handle.stack.remote(), timeout=STACK_WAIT_S)
            except Exception as exc:  # a stack is a hint: its absence says why
                stack = f"(no stack: {type(exc).__name__})\n"
        functions = [line.split(" in ")[-1] for line in stack.splitlines() if ", in " in line]
        return Stalled(self.stall_timeout, head.task, actor.name(), stack, functions[::-1])

    def discard(self) -> None:
        """Forget every task in flight: queued ones are cancelled, a running one finishes and
        its result is dropped; the actors stay, with what they opened, for the next stream."""
        for pending in self._pending:
            for ref in [pending.ref, *(p.ref for p in pending.parts)]:
                if ref is not None:
                    ray.cancel(ref)
        for actor in self._actors:
            actor.unfinished = 0
        self._pending.clear()
        self._done.clear()

    def close(self) -> None:
        """Kill every actor at once; results not handed out are dropped. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._pending.clear()
        self._done.clear()
        if self.owner != os.getpid() or not ray.is_initialized():
            return
        for actor in self._actors:
            if not actor.dead:
                ray.kill(actor.handle, no_restart=True)

    def __del__(self) -> None:
        if hasattr(self, "_actors"):
            self.close()


def actor_pool(
    work: BatchWork,
    num_workers: int,
    stall_timeout: float | None,
    ray_options: Mapping[str, Any] | None,
    kept: KeptPool | None,
) -> ActorPool:
    """The actors a stream's tasks run on: the loader's (``kept``, started by its first stream,
    kept across epochs while the work is the same: an actor starts in seconds), or a pool of
    the stream's own."""
    if kept is None:
        return ActorPool(work, num_workers, stall_timeout, ray_options)
    pool = kept.pool_for(
        work, num_workers, lambda shipment, n: ActorPool(shipment, n, None, ray_options)
    )
    assert isinstance(pool, ActorPool)
    pool.stall_timeout = stall_timeout  # the consumer's wait: no actor holds it
    return pool
