"""State: a loader's position as a small JSON-safe dict, checked when it is loaded back.

The state of a loader is ``(dataset version, order settings, epoch, next global sample)``.
Because the order is a pure function of its settings (``order.py``) and the plan is a pure
function of the start sample (``plan.py``), that is all it takes to continue at the exact sample,
without reading anything that was already delivered, on any number of ranks.

Format 1::

    {"format": 1, "uri": "...", "version": 3,
     "order": {"rows": 1000, "filter": null, "splits": null, "split": null, "split_key": null,
               "shuffle": true, "block_size": 1, "window": 1, "seed": 0},
     "fingerprint": "9f86d081884c7d65",
     "batch_size": 256, "world_size": 2, "drop_last": false, "columns": ["x", "label"],
     "epoch": 1, "sample": 512}

``sample`` counts global samples of ``epoch`` consumed by all ranks together (batches handed to
the training loop, never merely prefetched). What may differ on load:

* ``world_size``: always (elastic resume).
* ``batch_size``, ``drop_last``, ``columns``: only when named in ``allow_changes``; the remaining
  samples of the epoch are the same, cut into batches of the new size.
* the dataset version and the order settings: never; they define which sample is next.

Example::

    >>> state = {"format": 1, "epoch": 2, "sample": 0}
    >>> is_state_like(state)
    True
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

FORMAT = 1
CHANGEABLE = ("batch_size", "drop_last", "columns")


class StateMismatchError(ValueError):
    """A state saved by a loader whose dataset or order differs from this one."""


def order_settings(source: Any, order: Any, num_rows: int | None = None) -> dict[str, Any]:
    """The settings that define an order (``state["order"]``): of a ``Source`` (or None, for
    samplers over a plain length) and an ``Order``."""
    return {
        "rows": order.num_rows if num_rows is None else num_rows,
        "filter": source.filter if source else None,
        "splits": source.splits if source else None,
        "split": source.split if source else None,
        "split_key": source.split_key if source else None,
        "shuffle": order.shuffle,
        "block_size": order.block_size,
        "window": order.window,
        "seed": order.seed,
    }


def fingerprint(order_settings: dict[str, Any]) -> str:
    """A short stable hash of the settings that define the order."""
    blob = json.dumps(order_settings, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.blake2b(blob, digest_size=8).hexdigest()


def is_state_like(state: object) -> bool:
    return isinstance(state, dict) and "format" in state and "epoch" in state and "sample" in state


def check_state(
    saved: dict[str, Any], current: dict[str, Any], allow_changes: tuple[str, ...] = ()
) -> None:
    """Raise :class:`StateMismatchError` naming both sides of every difference that matters."""
    if not is_state_like(saved):
        raise TypeError(
            f"expected a state from Loader.state_dict(), got {type(saved).__name__} "
            f"with keys {sorted(saved) if isinstance(saved, dict) else '-'}"
        )
    if saved["format"] != FORMAT:
        raise StateMismatchError(
            f"state format {saved['format']} is not supported by this version (format {FORMAT})"
        )
    unknown = [k for k in allow_changes if k not in CHANGEABLE]
    if unknown:
        raise ValueError(
            f"allow_changes={unknown} cannot be allowed: only {CHANGEABLE} keep the order sound; "
            "a different dataset version, filter, split, shuffle or seed defines another order"
        )
    problems = []
    if (saved["uri"], saved["version"]) != (current["uri"], current["version"]):
        problems.append(
            f"dataset: state has {saved['uri']!r} version {saved['version']}, this loader reads "
            f"{current['uri']!r} version {current['version']} (pass version={saved['version']} "
            "to Loader to read the same version)"
        )
    for key in sorted(set(saved["order"]) | set(current["order"])):
        a, b = saved["order"].get(key), current["order"].get(key)
        if a != b:
            problems.append(f"order setting {key!r}: state has {a!r}, this loader has {b!r}")
    for key in CHANGEABLE:
        if key not in allow_changes and saved.get(key) != current.get(key):
            problems.append(
                f"{key}: state has {saved.get(key)!r}, this loader has {current.get(key)!r} "
                f"(pass allow_changes=({key!r},) to resume with the new value)"
            )
    if problems:
        raise StateMismatchError(
            "cannot load this state into this loader:\n  " + "\n  ".join(problems)
        )


def save_state(path: str | os.PathLike[str], state: dict[str, Any]) -> None:
    """Write ``state`` as JSON to ``path`` atomically (a reader never sees a partial file).

    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "loader.json")
    >>> save_state(path, {"format": 1, "epoch": 0, "sample": 256})
    >>> load_state(path)["sample"]
    256
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(state, f, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_state(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a state written by :func:`save_state`."""
    try:
        with open(path) as f:
            state = json.load(f)
    except FileNotFoundError:
        raise FileNotFoundError(f"no loader state at {os.fspath(path)!r}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{os.fspath(path)!r} is not a loader state (invalid JSON: {exc})") from exc
    if not is_state_like(state):
        raise ValueError(f"{os.fspath(path)!r} holds JSON that is not a loader state")
    return state
