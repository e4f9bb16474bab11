"""``IterableDataset``: whole batches from the Loader pipeline, split across DataLoader
workers, resumable through torchdata's ``StatefulDataLoader``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import lance
import torch
import torch.utils.data

from lanceloader.arguments import check_int
from lanceloader.engine.stream import Stream
from lanceloader.integrations.torch.collation import pack_for_transfer, watch_training_process
from lanceloader.integrations.torch.map import _worker_slot
from lanceloader.loader import Loader
from lanceloader.rows.lance.follow import refuse_following
from lanceloader.state.cursor import Cursor
from lanceloader.state.format import StateMismatchError


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
        refuse_following(self.loader.source, "IterableDataset")
        self._threads: int | None = loader_kwargs.get("num_workers")
        # The cursor counts this process's batches: plan batches without DataLoader workers,
        # this worker's own batches inside one. ``_fresh``: the next iteration continues exactly
        # at the cursor (after construction, set_epoch, load_state_dict or an epoch's end);
        # otherwise it starts the next epoch (torch calls iter() once per epoch and worker).
        # ``_token`` names the newest iteration, the only one that moves the cursor.
        self._cursor = Cursor(self.loader.stream_spec)
        self._fresh, self._token = True, 0

    def __len__(self) -> int:
        """Batches of this rank in the next epoch (fewer when resuming mid-epoch)."""
        return self._cursor.remaining if self._fresh else len(self.loader)

    @property
    def epoch(self) -> int:
        """The epoch the next iteration delivers."""
        return self._cursor.epoch if self._fresh else self._cursor.epoch + 1

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration deliver ``epoch`` from its start."""
        check_int("epoch", epoch, minimum=0)
        self._cursor.seek(epoch)
        self._fresh = True

    def __iter__(self) -> Iterator[Any]:
        # Every iter() is an iteration (DataLoaders call it once per epoch and worker); the first
        # after construction, set_epoch or load_state_dict continues where that put the cursor,
        # even when nothing is left (a worker restored after it had finished delivers nothing).
        _refuse_auto_collation(sys._getframe(1), self.loader.batch_size)
        c = self._cursor
        if not self._fresh:
            c.end_epoch()
        self._fresh, self._token = False, self._token + 1
        worker, workers = _worker_slot()
        batches = range(worker + c.done * workers, len(c.plan), workers)
        return self._run(self._token, batches)

    def _run(self, token: int, batches: range) -> Iterator[Any]:
        c, loader = self._cursor, self.loader
        in_worker = torch.utils.data.get_worker_info() is not None
        if not batches:
            return
        watch_training_process()
        threads = self._threads or (1 if in_worker else loader.num_workers)
        stream = Stream(
            loader.reading(threads), c.epoch, c.plan, batches, loader.recorder, loader.log_every
        )
        try:
            for batch in stream:
                if self._token == token:
                    c.advance()
                yield pack_for_transfer(batch)
        finally:
            stream.close()
        # The cursor stays at the end of the epoch when it ends, as torchdata's
        # StatefulDataLoader expects: it marks the end itself and starts the next iteration.

    def stats(self, epoch: int | None = None) -> Any:
        """What this process's reads did (``Loader.stats``); inside DataLoader workers each
        worker process records its own."""
        return self.loader.stats(epoch)

    def state_dict(self) -> dict[str, Any]:
        """Where this copy is: a ``Loader`` state, plus this worker's place inside a DataLoader
        worker (``"worker": {"id", "count", "start", "batches"}``). JSON-safe, ``format`` 2."""
        c = self._cursor
        worker, workers = _worker_slot()
        if workers == 1:
            return c.state_dict()
        place = {"id": worker, "count": workers, "start": c.start, "batches": c.done}
        return c.spec.state(c.epoch, c.start, worker=place)

    def load_state_dict(self, state: dict[str, Any], allow_changes: tuple[str, ...] = ()) -> None:
        """Continue at the state: the next iteration starts there (see :meth:`state_dict`)."""
        cursor = Cursor(self._cursor.spec)
        cursor.load_state_dict(state, allow_changes)  # checks the "worker" entry too
        place = state.get("worker")
        if place is not None:
            self._check_worker(state, place)
            cursor.start, cursor.done = place["start"], place["batches"]
        self._cursor, self._fresh = cursor, True

    def _check_worker(self, state: dict[str, Any], saved: dict[str, Any]) -> None:
        slot = _worker_slot()
        spec = self._cursor.spec
        same = (saved["id"], saved["count"]) == slot and (
            state["batch_size"],
            state["world_size"],
            state["drop_last"],
        ) == (spec.batch_size, spec.world_size, spec.drop_last)
        if not same:
            raise StateMismatchError(
                f"this state was saved by DataLoader worker {saved['id']} of {saved['count']} "
                f"(batch_size={state['batch_size']}, world_size={state['world_size']}); it resumes "
                f"only there, but this is worker {slot[0]} of {slot[1]} (batch_size="
                f"{spec.batch_size}, world_size={spec.world_size}). Load the "
                "StatefulDataLoader's state into a StatefulDataLoader with the same num_workers"
            )

    def __repr__(self) -> str:
        return f"IterableDataset({self.loader!r})"


def _refuse_auto_collation(caller: Any, batch_size: int) -> None:
    """Raise when a DataLoader with its own ``batch_size`` iterates this dataset: it would stack
    that many of our batches into one (a 5-D batch of images) without a word. The DataLoader's
    fetcher calls ``iter()`` from its ``__init__``; its ``auto_collation`` says whether it
    batches."""
    fetcher = caller.f_locals.get("self") if caller is not None else None
    fetch = sys.modules.get("torch.utils.data._utils.fetch")
    if fetch is None or not isinstance(fetcher, getattr(fetch, "_IterableDatasetFetcher", ())):
        return
    if getattr(fetcher, "auto_collation", False):
        raise ValueError(
            "DataLoader(IterableDataset(...)) was given a batch_size: the dataset yields whole "
            f"batches (batch_size={batch_size} rows each), so the DataLoader would stack several "
            "of them into one. Pass batch_size=None to the DataLoader (and set the batch size "
            "on the IterableDataset)"
        )
