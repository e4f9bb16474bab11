"""The one checkpoint conformance check every stateful class passes (after Grain's
``assert_equal_output_after_checkpoint`` and tf.data's ``CheckpointTestBase``).

A stateful object is anything with ``iter()`` (one epoch per iteration), ``state_dict()`` and
``load_state_dict()``: a Loader, a sampler, an IterableDataset, a StatefulDataLoader.
"""

from __future__ import annotations

import copy
import gc
import json
from collections.abc import Callable
from typing import Any


def run(obj: Any, iterations: int, value: Callable[[Any], Any]) -> list[list[Any]]:
    """What ``iterations`` iterations of ``obj`` deliver, one list per iteration."""
    return [[value(b) for b in obj] for _ in range(iterations)]


def assert_checkpoint_conformance(
    make: Callable[[], Any],
    value: Callable[[Any], Any] = lambda b: b,
    epochs: int = 2,
    breaks: tuple[int, ...] = (1, 2, 1),
) -> None:
    """Restore at every step of ``epochs`` short epochs and compare the rest of the stream.

    * unused object, every position mid-epoch, the end of each epoch (last batch delivered,
      ``StopIteration`` not yet seen: resumes to an empty remainder, then the next epoch), after
      ``StopIteration``, and exhausted;
    * an object whose iterations were broken out of several times (``breaks`` batches each),
      the broken iterators closed or collected: the resumed object continues as the original;
    * every state JSON-safe, with the same keys and value types at every step, and
      ``load_state_dict(s); state_dict() == s`` (get, set, get without drift).
    """
    reference = run(make(), epochs, value)
    assert all(reference), f"every epoch needs batches: {reference}"
    first_types: list[dict[str, type]] = []  # of the first state checked

    def check(state: dict[str, Any], expected: list[list[Any]], where: str) -> None:
        assert json.loads(json.dumps(state)) == state, f"{where}: not JSON-safe"
        types = {k: type(v) for k, v in state.items()}
        first_types[:] = first_types or [types]
        assert types == first_types[0], f"{where}: keys or types changed: {types}"
        resumed = make()
        resumed.load_state_dict(copy.deepcopy(state))
        assert resumed.state_dict() == state, f"{where}: get/set/get drifted"
        got = run(resumed, len(expected), value)
        assert got == expected, f"{where}: resumed stream differs"

    obj = make()
    check(obj.state_dict(), reference, "unused")
    for e in range(epochs):
        it = iter(obj)
        for j in range(len(reference[e])):
            next(it)
            rest = [reference[e][j + 1 :], *reference[e + 1 :]]
            where = f"epoch {e}, after batch {j}" + (" (end of epoch)" if not rest[0] else "")
            check(obj.state_dict(), rest, where)
        assert next(it, StopIteration) is StopIteration, f"epoch {e} delivered too much"
        check(obj.state_dict(), reference[e + 1 :], f"epoch {e}, after StopIteration")
        del it
    check(obj.state_dict(), [], "exhausted")

    broken = make()
    for n in breaks:
        it = iter(broken)
        for _ in range(n):
            next(it)
        if hasattr(it, "close"):
            it.close()
        del it
        gc.collect()
    state = broken.state_dict()
    resumed = make()
    resumed.load_state_dict(copy.deepcopy(state))
    assert run(resumed, epochs, value) == run(broken, epochs, value), "after breaks"
