"""The states of a Grain pipeline over an :class:`~lanceloader.grain.IterDataset`, read back:
where each ``mp_prefetch`` worker stands, and how many batches the pipeline delivered.

Under ``mp_prefetch(num_workers=N)`` Grain keeps one state per worker inside its own interleave
state (``"iterators_in_use_states"``, one per worker, in worker order); each is our worker's
state (a Loader state at the pipeline's origin plus ``"grain": {"worker", "workers",
"delivered"}``), or a plain Loader state at the origin for a worker that has delivered nothing
yet. Grain takes one batch from each worker in turn, so when every operation between the
IterDataset and ``mp_prefetch`` gives one element per batch, worker ``w`` has delivered
``ceil((T - w) / N)`` of the pipeline's ``T`` batches, and ``T`` is their sum.
"""

from __future__ import annotations

from typing import Any

from lanceloader.state.format import StateMismatchError

PLACE_KEYS = ("worker", "workers", "delivered")


def worker_states(state: Any) -> list[dict[str, Any]]:
    """Our worker states inside a Grain pipeline's ``state``, in worker order: one for a state
    without ``mp_prefetch``, one per worker under it (a Loader state is found under any
    operation that nests its parent's state).

    >>> loader_state = {"format": 2, "fingerprint": "f", "epoch": 0, "sample": 8}
    >>> len(worker_states(loader_state)), len(worker_states({"iterators_in_use_states": [
    ...     {"parent": loader_state}, loader_state]}))
    (1, 2)
    """
    if not isinstance(state, dict):
        raise StateMismatchError(
            f"expected a Grain pipeline's state (a dict from its iterator's get_state()), got "
            f"{type(state).__name__}"
        )
    if "fingerprint" in state:
        return [state]
    per_worker = state.get("iterators_in_use_states")
    if per_worker is None:  # an operation that nests its parent's state
        nested = [v for v in state.values() if isinstance(v, dict)]
        return worker_states(nested[0]) if len(nested) == 1 else _not_ours(state)
    found = [_leaf(s) for s in per_worker]
    if any(s is None for s in found):
        return _not_ours(state)
    return found  # type: ignore[return-value]


def _leaf(state: Any) -> dict[str, Any] | None:
    while isinstance(state, dict) and "fingerprint" not in state:
        nested = [v for v in state.values() if isinstance(v, dict)]
        state = nested[0] if len(nested) == 1 else None
    return state if isinstance(state, dict) else None


def _not_ours(state: dict[str, Any]) -> list[dict[str, Any]]:
    raise StateMismatchError(
        f"this state (keys {sorted(state)}) holds no lanceloader IterDataset state for each "
        "mp_prefetch worker: pass the state of a Grain pipeline over a "
        "lanceloader.grain.IterDataset, as its iterator's get_state() returned it"
    )


def batches_delivered(states: list[dict[str, Any]]) -> int:
    """The batches a pipeline delivered from its origin, from its worker states (see the
    module's text); refuses states whose workers do not take turns (an operation between the
    IterDataset and ``mp_prefetch`` that drops or merges batches, such as ``filter``).

    >>> place = lambda w, d: {"fingerprint": "f", "grain": {"worker": w, "workers": 2, "delivered": d}}
    >>> batches_delivered([place(0, 3), place(1, 2)]), batches_delivered([place(0, 0), {"fingerprint": "f"}])
    (5, 0)
    >>> batches_delivered([place(0, 3), place(1, 1)])
    Traceback (most recent call last):
    ...
    lanceloader.state.format.StateMismatchError: the mp_prefetch workers delivered [3, 1] batches, not in turns (a filter or another operation that drops or merges batches stands between the IterDataset and mp_prefetch), so no single Loader place continues this pipeline: restore it into a pipeline with mp_prefetch(num_workers=2)
    """
    workers = len(states)
    delivered = []
    for w, state in enumerate(states):
        place = state.get("grain", {"worker": w, "workers": workers, "delivered": 0})
        if not (isinstance(place, dict) and all(type(place.get(k)) is int for k in PLACE_KEYS)):
            raise StateMismatchError(
                f"state['grain'] must be a dict of ints {PLACE_KEYS}, got {place!r}: use the "
                "state as get_state() returned it"
            )
        if (place["worker"], place["workers"]) != (w, workers):
            raise StateMismatchError(
                f"worker {w} of {workers} holds the state of worker {place['worker']} of "
                f"{place['workers']}: use the state as get_state() returned it"
            )
        delivered.append(place["delivered"])
    total = sum(delivered)
    if delivered != [(total - w + workers - 1) // workers for w in range(workers)]:
        raise StateMismatchError(
            f"the mp_prefetch workers delivered {delivered} batches, not in turns (a filter or "
            "another operation that drops or merges batches stands between the IterDataset "
            "and mp_prefetch), so no single Loader place continues this pipeline: restore it "
            f"into a pipeline with mp_prefetch(num_workers={workers})"
        )
    return total
