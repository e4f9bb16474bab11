"""A Loader's batches as a Grain dataset: :class:`IterDataset`, its :class:`DatasetIterator`
(whose state is the Loader's), and :func:`stream_place` (where batch ``i`` of a stream lies)."""

from __future__ import annotations

import os
from typing import Any

import grain
import lance

from lanceloader.arguments import check_int
from lanceloader.engine.stream import Stream
from lanceloader.integrations.grain.elastic import ElasticSteps
from lanceloader.integrations.grain.processes import make_grain_flags_readable
from lanceloader.integrations.grain.states import batches_delivered, worker_states
from lanceloader.loader import Loader
from lanceloader.pipeline import TENSOR_OUTPUTS
from lanceloader.rows.lance.follow import refuse_following
from lanceloader.state.cursor import Cursor
from lanceloader.state.format import StateMismatchError


class IterDataset(ElasticSteps, grain.IterDataset):  # type: ignore[misc]
    """A :class:`~lanceloader.Loader`'s batches as a ``grain.IterDataset``, across epochs.

    Iterating yields the Loader's batches, epoch after epoch (``num_epochs`` of them, counted
    from epoch 0, so a restored pipeline stops where an uninterrupted one would; ``None``: no
    end), read in our orders with many batches per Lance call on the Loader's reading threads.
    Grain's ``.map``, ``.filter``, ``.prefetch`` and ``.mp_prefetch`` apply on top. The
    iterator's state is the Loader's (see the module's text); the Loader's own cursor does not
    move: the iterator holds its place.

    Under ``mp_prefetch(num_workers=N)`` each worker process reads every N-th batch on
    ``threads`` threads (default 1: the processes are the parallelism), and Grain takes one
    element from each worker in turn: the Loader's order as long as every operation between
    this dataset and ``mp_prefetch`` gives one element per batch (``map``). One that drops or
    merges batches there (``filter``, ``batch``) makes the workers' turns drift apart: the
    same batches, in another (still deterministic) order; put it after ``mp_prefetch`` to keep
    the Loader's order. Keep ``output="numpy"`` there (tensors are made in the training
    process) and thread workers (Grain's workers are the processes). A pipeline's state
    restores into any ``num_workers`` (``elastic.py``); :meth:`loader_state` turns it into the
    Loader state at its next batch.

    Args:
        dataset: a :class:`~lanceloader.Loader` (its settings, and its place: a new iterator
            starts where the Loader stands), or a URI or ``lance.LanceDataset`` to build one
            from.
        batch_size: rows per batch on each rank (with a URI; default 256).
        num_epochs: iterate until this epoch (exclusive); ``None`` never ends.
        threads: reading threads per process; default the Loader's ``num_workers`` in one
            process, 1 in each ``mp_prefetch`` worker.
        allow_changes: settings a restored state may differ in, as for
            ``Loader.load_state_dict`` (``"batch_size"``, ``"drop_last"``, ``"columns"``,
            ``"uri"``).
        **loader_kwargs: any other ``Loader`` argument (with a URI).

    >>> import tempfile
    >>> from lanceloader.demo import write_demo_dataset
    >>> uri = write_demo_dataset(tempfile.mkdtemp() + "/demo.lance", rows=10)
    >>> ds = IterDataset(uri, batch_size=4, columns=["id"], num_epochs=2, shuffle=True)
    >>> [b["id"].tolist() for b in ds]
    [[0, 1, 9, 5], [4, 2, 3, 7], [8, 6], [2, 5, 1, 3], [8, 9, 4, 6], [0, 7]]
    """

    def __init__(
        self,
        dataset: Loader | str | os.PathLike[str] | lance.LanceDataset,
        batch_size: int | None = None,
        *,
        num_epochs: int | None = 1,
        threads: int | None = None,
        allow_changes: tuple[str, ...] = (),
        **loader_kwargs: Any,
    ) -> None:
        super().__init__()
        make_grain_flags_readable()
        if isinstance(dataset, Loader):
            given = sorted(loader_kwargs) + ["batch_size"] * (batch_size is not None)
            if given:
                raise TypeError(
                    f"IterDataset(loader, {', '.join(given)}=...): a Loader carries its own "
                    "settings; set them on the Loader, or pass a URI instead of the Loader"
                )
            self.loader = dataset
        else:
            self.loader = Loader(
                dataset, 256 if batch_size is None else batch_size, **loader_kwargs
            )
        refuse_following(self.loader.source, "grain IterDataset")
        if num_epochs is not None:
            check_int("num_epochs", num_epochs, minimum=0)
        if threads is not None:
            check_int("threads", threads, minimum=1)
        self.num_epochs, self.threads = num_epochs, threads
        self.allow_changes = tuple(allow_changes)
        self.slot = (0, 1)  # (worker, workers) under mp_prefetch, set by Grain in the worker

    def set_slice(self, sl: slice, sequential_slice: bool = False) -> None:
        """Grain's in-place slicing (``mp_prefetch`` calls it in each worker, on its copy):
        this copy delivers batches ``sl.start, sl.start + sl.step, ...`` of the stream."""
        worker, workers = sl.start or 0, sl.step or 1
        if sl.stop is not None or not 0 <= worker < workers:
            raise ValueError(f"IterDataset takes a worker's slice(worker, None, workers), got {sl}")
        if sequential_slice:
            raise ValueError(
                "mp_prefetch(sequential_slice=True) over a lanceloader IterDataset: its workers "
                "take every N-th batch of the Loader's order (each read is many consecutive "
                "rows already); drop sequential_slice"
            )
        if self.loader.output in TENSOR_OUTPUTS:
            raise ValueError(
                f"output={self.loader.output!r} would make tensors in each of Grain's worker "
                "processes; use output='numpy' (the default) and make JAX arrays in the training "
                "process (jax.device_put, or a Grain .map after mp_prefetch)"
            )
        if self.loader.worker_type != "thread":
            raise ValueError(
                "worker_type='process' inside Grain's mp_prefetch workers: they are the "
                "processes; drop worker_type (threads read in each worker)"
            )
        self.slot = (worker, workers)

    def __iter__(self) -> DatasetIterator:
        return DatasetIterator(self)

    @property
    def _root(self) -> IterDataset:
        """The dataset a pipeline's elastic ``mp_prefetch`` restores through (``elastic.py``)."""
        return self

    def loader_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """The Loader state at the next batch of a pipeline over this dataset, from the state
        its iterator's ``get_state()`` returned, with or without ``mp_prefetch`` (of any number
        of workers): ``ds.loader.load_state_dict(ds.loader_state(state))`` and a new pipeline,
        with another ``num_workers`` or none, continues exactly there. Refuses a state whose
        workers did not take turns (a ``filter`` before ``mp_prefetch``), naming the fix.

        >>> import tempfile
        >>> from lanceloader.demo import write_demo_dataset
        >>> uri = write_demo_dataset(tempfile.mkdtemp() + "/demo.lance", rows=10)
        >>> ds = IterDataset(uri, batch_size=2, columns=["id"])
        >>> worker = lambda w, d: {**ds.loader.state_dict(), "grain": {"worker": w,
        ...                        "workers": 2, "delivered": d}}
        >>> state = {"iterators_in_use_states": [worker(0, 2), worker(1, 1)]}  # Grain's, cut
        >>> ds.loader_state(state)["sample"]   # 3 batches of 2 rows delivered
        6
        """
        states = worker_states(state)
        origins = [{k: v for k, v in s.items() if k != "grain"} for s in states]
        if any(o != origins[0] for o in origins):
            raise StateMismatchError(
                "the mp_prefetch workers' states start from different places: use the state "
                "as the pipeline's get_state() returned it"
            )
        it = DatasetIterator(self)
        it._worker, it._workers = 0, 1  # one stream: the place of batch T from the origin
        it._start(origins[0], delivered=batches_delivered(states))  # checks the origin
        return it.get_state()

    def __str__(self) -> str:
        return f"lanceloader.grain.IterDataset({self.loader!r}, num_epochs={self.num_epochs})"


class DatasetIterator(grain.DatasetIterator):  # type: ignore[misc]
    """An iterator of an :class:`IterDataset`: the Loader's batches from a place, with Grain's
    ``get_state``/``set_state`` (the Loader's state; see the module's text) and an idempotent
    ``close()`` (also on garbage collection) that stops its reading threads.

    Creating one reads nothing; the first ``next()`` starts a stream of reads. Its place is
    ``(origin, delivered)``: the stream's start and the batches handed on since, so a state is
    O(1) to take and to resume whatever the epoch.

    >>> import tempfile
    >>> from lanceloader.demo import write_demo_dataset
    >>> uri = write_demo_dataset(tempfile.mkdtemp() + "/demo.lance", rows=10)
    >>> it = iter(IterDataset(uri, batch_size=4, columns=["id"], num_epochs=2))
    >>> [next(it)["id"].tolist() for _ in range(3)], it.get_state()["epoch"]
    ([[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]], 1)
    >>> again = iter(IterDataset(uri, batch_size=4, columns=["id"], num_epochs=2))
    >>> again.set_state(it.get_state())
    >>> [b["id"].tolist() for b in again]
    [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    >>> again.set_state(dict(it.get_state(), fingerprint="0"))
    Traceback (most recent call last):
    ...
    lanceloader.state.format.StateMismatchError: state key 'fingerprint' is '0' but the state's dataset and order hash to '...': the state was edited or damaged. Use the state as state_dict() returned it
    """

    def __init__(self, dataset: IterDataset) -> None:
        super().__init__()
        self._dataset = dataset
        self._worker, self._workers = dataset.slot
        self._stream: Stream | None = None
        self._stream_at: tuple[int, int, int] | None = None  # (epoch, start, next batch)
        self._start(dataset.loader.state_dict(), delivered=0)  # the Loader's place

    def _start(self, state: dict[str, Any], delivered: int) -> None:
        cursor = Cursor(self._dataset.loader.stream_spec)
        if isinstance(state, dict):
            state = {k: v for k, v in state.items() if k != "grain"}
        cursor.load_state_dict(state, self._dataset.allow_changes)  # checks it, names problems
        self._cursor, self._delivered = cursor, delivered
        self._close_stream()

    # --- where the stream stands (pure arithmetic over the plans) -----------------------

    def _place(self) -> tuple[int, int, int]:
        """``(epoch, start, batch)`` of this iterator's next batch: global batch
        ``worker + delivered × workers`` of the stream from the origin."""
        return stream_place(
            self._cursor.epoch,
            self._cursor.start,
            len(self._cursor.plan),
            len(self._dataset.loader),
            self._worker + self._delivered * self._workers,
        )

    def __next__(self) -> Any:
        self._assert_not_closed()
        epoch, start, batch = self._place()
        end = self._dataset.num_epochs
        spec = self._cursor.spec
        plan = spec.plan(start)
        if (end is not None and epoch >= end) or batch >= len(plan):
            raise StopIteration
        if self._stream is None or self._stream_at != (epoch, start, batch):
            self._close_stream()
            loader = self._dataset.loader
            threads = self._dataset.threads or (1 if self._workers > 1 else loader.num_workers)
            self._stream = Stream(
                loader.reading(threads),
                epoch,
                plan,
                range(batch, len(plan), self._workers),
                loader.recorder,
                loader.log_every,
            )
        out = next(self._stream)
        self._delivered += 1
        self._stream_at = (epoch, start, batch + self._workers)
        return out

    def _close_stream(self) -> None:
        if self._stream is not None:
            self._stream.close()
        self._stream, self._stream_at = None, None

    # --- Grain's checkpoint ---------------------------------------------------------------

    def get_state(self) -> dict[str, Any]:
        """The Loader's state at the next batch (one process), or at the origin plus this
        worker's count (an ``mp_prefetch`` worker). JSON-safe."""
        c = self._cursor
        if self._workers == 1:
            epoch, start, batch = self._place()
            return c.spec.state(epoch, c.spec.plan(start).samples_done(batch))
        place = {"worker": self._worker, "workers": self._workers, "delivered": self._delivered}
        return c.spec.state(c.epoch, c.sample, grain=place)

    def set_state(self, state: dict[str, Any]) -> None:
        """Continue at ``state`` (from :meth:`get_state`, any Loader state, or an ``mp_prefetch``
        pipeline's state: its Loader state): the next batch is the one after the state's. Raises :class:`~lanceloader.StateMismatchError` for a state of
        another dataset, version, order or worker layout, naming the fix."""
        if isinstance(state, dict) and "worker" in state:
            raise StateMismatchError(
                "this state was saved by a torch DataLoader worker (it has a 'worker' entry); "
                "it resumes only in a torch StatefulDataLoader. Resume a Grain pipeline from "
                "its iterator's get_state(), or from a Loader's state_dict()"
            )
        if isinstance(state, dict) and "format" not in state and self._workers == 1:
            state = self._dataset.loader_state(state)  # a pipeline's (mp_prefetch's): its place
        place = state.get("grain") if isinstance(state, dict) else None
        if place is None:
            self._start(state, delivered=0)
            return
        keys = ("worker", "workers", "delivered")
        if not isinstance(place, dict) or not all(
            type(place.get(k)) is int and place[k] >= 0 for k in keys
        ):
            raise StateMismatchError(
                f"state['grain'] must be a dict of non-negative ints {keys}, got {place!r}; use "
                "the state as get_state() returned it"
            )
        if (place["worker"], place["workers"]) != (self._worker, self._workers):
            raise StateMismatchError(
                f"this state was saved by Grain mp_prefetch worker {place['worker']} of "
                f"{place['workers']}; it resumes only there, but this is worker {self._worker} "
                f"of {self._workers}. Call mp_prefetch on the IterDataset (or after its map, "
                "filter or batch): its state then restores into any number of workers; or "
                f"use mp_prefetch(num_workers={place['workers']}), or continue from the "
                "Loader state: ds.loader.load_state_dict(ds.loader_state(state))"
            )
        self._start(state, delivered=place["delivered"])

    def close(self) -> None:
        """Stop the reading threads (idempotent; also on garbage collection)."""
        self._close_stream()
        super().close()

    def __str__(self) -> str:
        return f"lanceloader.grain.DatasetIterator(worker {self._worker} of {self._workers})"


def stream_place(
    epoch: int, start: int, first_len: int, epoch_len: int, index: int
) -> tuple[int, int, int]:
    """Where batch ``index`` of a stream lies: ``(epoch, start, batch)``, batch ``batch`` of the
    plan of ``epoch`` that starts at global sample ``start``.

    The stream starts at ``start`` of ``epoch``, whose plan has ``first_len`` batches, and goes
    on with whole epochs of ``epoch_len`` batches. When epochs are empty (``epoch_len`` 0),
    every later index is in epoch ``epoch + 1``, past the end of its empty plan.

    >>> [stream_place(0, 8, 2, 3, i) for i in range(6)]
    [(0, 8, 0), (0, 8, 1), (1, 0, 0), (1, 0, 1), (1, 0, 2), (2, 0, 0)]
    """
    if index < first_len:
        return epoch, start, index
    if epoch_len == 0:
        return epoch + 1, 0, index - first_len
    full, batch = divmod(index - first_len, epoch_len)
    return epoch + 1 + full, 0, batch
