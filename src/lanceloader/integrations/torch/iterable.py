"""``IterableDataset``: whole batches from the Loader pipeline, split across DataLoader
workers, resumable through torchdata's ``StatefulDataLoader``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import lance
import torch
import torch.utils.data

from lanceloader.integrations.torch.collation import pack_for_transfer
from lanceloader.integrations.torch.map import _worker_slot
from lanceloader.integrations.torch.samplers import _Cursor
from lanceloader.loader import Loader, check_int
from lanceloader.plan import Plan, read_tasks
from lanceloader.prefetch import OrderedPrefetcher
from lanceloader.state import StateMismatchError, check_state


class IterableDataset(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
    """Whole batches from a :class:`~lanceloader.Loader`, split across DataLoader workers.

    Use with ``DataLoader(ds, batch_size=None, num_workers=N)``: worker ``w`` of ``N`` delivers
    the loader's batches ``w, w + N, w + 2N, ...`` (reading several of them per Lance call on a
    thread of its own, and sending each batch as one shared-memory file), and the
    DataLoader takes one batch from each worker in turn, so what it yields is exactly what the
    ``Loader`` would deliver, batch for batch. With ``num_workers=0`` it runs the same code in
    the training process, on the Loader's ``num_workers`` threads.

    Each iteration is one epoch; the epoch advances by itself in the process that iterates (the
    training process, or persistent workers). Without ``persistent_workers`` a DataLoader gives
    each epoch fresh copies of this object: call ``set_epoch(epoch)`` before each epoch then.

    ``state_dict()``/``load_state_dict()`` follow torchdata's ``StatefulDataLoader`` protocol: in
    each worker they hold that worker's place, so the DataLoader's state resumes at the exact batch
    (with the same number of workers). A state taken without workers is a ``Loader`` state and
    resumes on any number of ranks or workers.

    Args:
        dataset: URI or ``lance.LanceDataset``.
        batch_size: rows per batch on each rank.
        **loader_kwargs: any other :class:`~lanceloader.Loader` argument (order, filter, columns,
            transform, output, rank and world size). ``num_workers`` sets the reading threads
            of each process: default all cores in the training process, 1 in a DataLoader
            worker. Threads only: DataLoader workers are the processes.

    >>> import tempfile
    >>> from lanceloader.demo import write_demo_dataset
    >>> uri = write_demo_dataset(tempfile.mkdtemp() + "/demo.lance", rows=10, fragments=2)
    >>> ds = IterableDataset(uri, batch_size=4, columns=["id"], output="torch")
    >>> loader = torch.utils.data.DataLoader(ds, batch_size=None)
    >>> len(loader), [b["id"].tolist() for b in loader]
    (3, [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]])
    """

    def __init__(
        self,
        dataset: str | os.PathLike[str] | lance.LanceDataset,
        batch_size: int = 256,
        **loader_kwargs: Any,
    ) -> None:
        if loader_kwargs.get("worker_type", "thread") != "thread":
            raise ValueError(
                f"worker_type={loader_kwargs['worker_type']!r}: IterableDataset reads on threads "
                "inside DataLoader workers, which are the processes; drop worker_type and set "
                "the DataLoader's num_workers"
            )
        self.loader = Loader(dataset, batch_size, **loader_kwargs)
        self._threads: int | None = loader_kwargs.get("num_workers")
        self._cursor = _Cursor()

    def __len__(self) -> int:
        """Batches of this rank in the next epoch (fewer when resuming mid-epoch)."""
        c = self._cursor
        start, done = (c.start, c.done) if c.fresh else (0, 0)
        return len(self.loader.plan(start)) - done

    @property
    def epoch(self) -> int:
        """The epoch the next iteration delivers."""
        return self._cursor.epoch if self._cursor.fresh else self._cursor.epoch + 1

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration deliver ``epoch`` from its start."""
        check_int("epoch", epoch, minimum=0)
        self._cursor = replace(self._cursor, epoch=epoch, start=0, done=0, fresh=True)

    def __iter__(self) -> Iterator[Any]:
        # Every iter() is an iteration (DataLoaders call it once per epoch and worker); the first
        # after construction, set_epoch or load_state_dict continues where that put the cursor,
        # even when nothing is left (a worker restored after it had finished delivers nothing).
        c = self._cursor
        if not c.fresh:
            c.next_epoch()
        c.fresh, c.token = False, c.token + 1
        worker, workers = _worker_slot()
        plan = self.loader.plan(c.start)
        batches = range(worker + c.done * workers, len(plan), workers)
        return self._run(c, c.token, c.epoch, plan, batches)

    def _run(self, c: _Cursor, token: int, epoch: int, plan: Plan, batches: range) -> Iterator[Any]:
        if not batches:
            return
        loader = self.loader
        work = loader._work()  # conversion options and the error policy included
        in_worker = torch.utils.data.get_worker_info() is not None
        threads = self._threads or (1 if in_worker else loader.num_workers)
        per_read = loader.batches_per_read
        depth = loader.reads_in_flight(threads)  # this process's threads, not all the cores
        tasks = read_tasks(epoch, plan, per_read, batches,
                           window_rows=loader.order.window_rows)
        prefetcher = OrderedPrefetcher(work, tasks, threads, depth)
        try:
            for result in prefetcher:
                for batch in result.batches:
                    if c.token == token:
                        c.done += 1
                    yield pack_for_transfer(batch)
        finally:
            prefetcher.close()

    def state_dict(self) -> dict[str, Any]:
        """Where this copy is: a ``Loader`` state, plus this worker's place inside a DataLoader
        worker (``"worker": {"id", "count", "start", "batches"}``). JSON-safe, ``format`` 1."""
        c = self._cursor
        worker, workers = _worker_slot()
        state = self.loader.state_dict()
        state["epoch"] = c.epoch
        if workers == 1:
            state["sample"] = self.loader.plan(c.start).samples_done(c.done)
        else:
            state["sample"] = c.start
            state["worker"] = {"id": worker, "count": workers, "start": c.start, "batches": c.done}
        return state

    def load_state_dict(self, state: dict[str, Any], allow_changes: tuple[str, ...] = ()) -> None:
        """Continue at the state: the next iteration starts there (see :meth:`state_dict`)."""
        check_state(state, self.loader.state_dict(), tuple(allow_changes))
        check_int("state['epoch']", state["epoch"], minimum=0)
        start, done = self._start_of(state)
        self._cursor = replace(
            self._cursor, epoch=state["epoch"], start=start, done=done, fresh=True
        )

    def _start_of(self, state: dict[str, Any]) -> tuple[int, int]:
        saved = state.get("worker")
        slot = _worker_slot()
        if saved is None:
            check_int("state['sample']", state["sample"], minimum=0)
            if state["sample"] > self.loader.source.num_rows:
                raise StateMismatchError(
                    f"state sample {state['sample']} is beyond the "
                    f"{self.loader.source.num_rows} rows of an epoch"
                )
            return state["sample"], 0
        same = (saved["id"], saved["count"]) == slot and (
            state["batch_size"], state["world_size"], state["drop_last"]
        ) == (self.loader.batch_size, self.loader.world_size, self.loader.drop_last)
        if not same:
            raise StateMismatchError(
                f"this state was saved by DataLoader worker {saved['id']} of {saved['count']} "
                f"(batch_size={state['batch_size']}, world_size={state['world_size']}); it resumes "
                f"only there, but this is worker {slot[0]} of {slot[1]} (batch_size="
                f"{self.loader.batch_size}, world_size={self.loader.world_size}). Load the "
                "StatefulDataLoader's state into a StatefulDataLoader with the same num_workers"
            )
        return saved["start"], saved["batches"]

    def __repr__(self) -> str:
        return f"IterableDataset({self.loader!r})"
