"""A Grain pipeline's state restored into another number of ``mp_prefetch`` workers, exactly.

Grain keeps one state per ``mp_prefetch`` worker and restores a state only into the same number
of workers: from 2 into 1 its interleave fails with a bare ``IndexError``, and from 1 into 2 it
sets worker 0 alone, so worker 1 starts over and batches repeat. The Loader resumes on any number
of ranks or workers from one place (its state at the next batch); so does a pipeline over an
:class:`~lanceloader.grain.IterDataset`: ``mp_prefetch`` called on the ``IterDataset``, or after
its ``map``, ``random_map``, ``map_with_index``, ``filter`` or ``batch`` (each returns a
:class:`Carried` dataset that keeps this), returns an :class:`ElasticPrefetch`. Its iterator's
``set_state`` hands Grain a state of its own number of workers unchanged; any other (a state of
another ``num_workers``, of a pipeline without ``mp_prefetch``, or a plain Loader state) becomes
the Loader state at the pipeline's next batch (``IterDataset.loader_state``: refuses workers
that did not take turns, naming the fix), given to each worker of a fresh state of this layout:
worker ``w`` then delivers batches ``w, w + N, ...`` from there, and no batch is lost or
repeated.

What runs where: all of it in the training process, before Grain's own ``set_state``; nothing
is read (the new state is arithmetic over the plans). ``mp_prefetch`` called on another Grain
dataset (one between the ``IterDataset`` and ``mp_prefetch`` that is not carried, such as
Grain's ``prefetch``) is Grain's own and restores only into the same ``num_workers``.
"""

from __future__ import annotations

import copy
from typing import Any

import grain

from lanceloader.integrations.grain.states import worker_states

CARRIED_STEPS = ("map", "random_map", "map_with_index", "filter", "batch")


class ElasticSteps:
    """Grain's steps that keep an elastic ``mp_prefetch`` (see the module's text); mixed into
    :class:`~lanceloader.grain.IterDataset` and :class:`Carried`, whose ``_root`` is the
    ``IterDataset`` the pipeline starts from."""

    _root: Any

    def map(self, *args: Any, **kwargs: Any) -> Carried:
        return Carried(super().map(*args, **kwargs), self._root)  # type: ignore[misc]

    def random_map(self, *args: Any, **kwargs: Any) -> Carried:
        return Carried(super().random_map(*args, **kwargs), self._root)  # type: ignore[misc]

    def map_with_index(self, *args: Any, **kwargs: Any) -> Carried:
        return Carried(super().map_with_index(*args, **kwargs), self._root)  # type: ignore[misc]

    def filter(self, *args: Any, **kwargs: Any) -> Carried:
        return Carried(super().filter(*args, **kwargs), self._root)  # type: ignore[misc]

    def batch(self, *args: Any, **kwargs: Any) -> Carried:
        return Carried(super().batch(*args, **kwargs), self._root)  # type: ignore[misc]

    def mp_prefetch(
        self,
        options: grain.MultiprocessingOptions | None = None,
        worker_init_fn: Any = None,
        sequential_slice: bool = False,
    ) -> Any:
        """Grain's ``mp_prefetch``, whose iterator restores a state of any number of workers
        (see the module's text); ``num_workers=0`` is this dataset itself, as in Grain."""
        options = options or grain.MultiprocessingOptions(num_workers=10)
        prefetched = super().mp_prefetch(options, worker_init_fn, sequential_slice)  # type: ignore[misc]
        if options.num_workers == 0:
            return prefetched
        return ElasticPrefetch(prefetched, self._root)


class Carried(ElasticSteps, grain.IterDataset):  # type: ignore[misc]
    """A Grain step over an ``IterDataset`` (``parent``), unchanged: it iterates as its parent
    does and keeps the elastic ``mp_prefetch`` for the steps after it."""

    def __init__(self, parent: Any, root: Any) -> None:
        super().__init__(parent)
        self._root = root

    def __iter__(self) -> Any:
        return self._parent.__iter__()

    def __str__(self) -> str:
        return f"lanceloader.grain.Carried({self._parent})"


class ElasticPrefetch(grain.IterDataset):  # type: ignore[misc]
    """Grain's ``mp_prefetch`` dataset (``parent``) over ``root``'s batches, whose iterator
    restores a state of any number of workers (see the module's text)."""

    def __init__(self, parent: Any, root: Any) -> None:
        super().__init__(parent)
        self._root = root

    def __iter__(self) -> ElasticIterator:
        return ElasticIterator(self._parent.__iter__(), self._root)

    def __str__(self) -> str:
        return f"lanceloader.grain.ElasticPrefetch({self._parent})"


class ElasticIterator(grain.DatasetIterator):  # type: ignore[misc]
    """Grain's ``mp_prefetch`` iterator (``parent``), with a ``set_state`` that takes a state
    of any number of workers; everything else is the parent's."""

    def __init__(self, parent: Any, root: Any) -> None:
        super().__init__(parent)
        self._root = root

    def __next__(self) -> Any:
        return next(self._parent)

    def get_state(self) -> dict[str, Any]:
        return self._parent.get_state()  # type: ignore[no-any-return]

    def set_state(self, state: dict[str, Any]) -> None:
        """Grain's restore for a state of this pipeline's number of workers; any other state
        is first made the Loader state at its next batch, given to every worker (exact)."""
        fresh = self._parent.get_state()  # this layout's state; reads nothing
        if _workers(state) != len(fresh["iterators_in_use_states"]):
            state = relaid(fresh, self._root.loader_state(state))
        self._parent.set_state(state)

    def __str__(self) -> str:
        return f"lanceloader.grain.ElasticIterator({self._parent})"


def _workers(state: Any) -> int | None:
    """The number of workers whose states ``state`` holds (None: not an mp_prefetch state)."""
    if isinstance(state, dict) and isinstance(state.get("iterators_in_use_states"), list):
        worker_states(state)  # ours, or the error naming what to pass
        return len(state["iterators_in_use_states"])
    return None


def relaid(fresh: dict[str, Any], loader_state: dict[str, Any]) -> dict[str, Any]:
    """``fresh`` (a new pipeline's interleave state) with every worker at ``loader_state``, the
    next batch first in turn: worker ``w`` delivers batches ``w, w + N, ...`` from there.

    >>> at = {"fingerprint": "f", "sample": 8}
    >>> fresh = {"next_index_in_cycle": 1, "iterators_in_use_states": [{"fingerprint": "f"},
    ...          {"parent": {"fingerprint": "f"}}], "exhausted": [0, 1]}
    >>> relaid(fresh, at)
    {'next_index_in_cycle': 0, 'iterators_in_use_states': [{'fingerprint': 'f', 'sample': 8}, {'parent': {'fingerprint': 'f', 'sample': 8}}], 'exhausted': [0, 0]}
    """
    state = copy.deepcopy(fresh)
    state["iterators_in_use_states"] = [
        _with_leaf(s, loader_state) for s in state["iterators_in_use_states"]
    ]
    state["next_index_in_cycle"] = 0
    state["exhausted"] = [0] * len(state["iterators_in_use_states"])
    return state


def _with_leaf(state: Any, leaf: dict[str, Any]) -> Any:
    """``state`` (a worker's, our Loader state possibly nested in steps' states) with the Loader
    state replaced by ``leaf``."""
    if not isinstance(state, dict) or "fingerprint" in state:
        return copy.deepcopy(leaf)
    nested = [k for k, v in state.items() if isinstance(v, dict)]
    if len(nested) != 1:
        worker_states(state)  # raises: not a state of ours
    return {**state, nested[0]: _with_leaf(state[nested[0]], leaf)}
