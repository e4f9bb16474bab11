"""State: what a checkpoint of a stream records, and the checks it passes when it is loaded.

A stream is defined by a :class:`StreamSpec`: the dataset (URI, pinned version and *identity*),
the settings that define the order, and how the epoch is cut into batches. Its position is
``(epoch, sample)``, kept by :class:`~lanceloader.state.cursor.Cursor`. Because the order is a pure
function of its settings (``order.py``) and the plan a pure function of the start sample
(``plan.py``), spec and position are all it takes to continue at the exact sample, without reading
anything that was already delivered, on any number of ranks.

Format 2::

    {"format": 2, "uri": "/data/train.lance", "version": 3, "dataset": "5be1c4e0a9d2f7c3",
     "order": {"rows": 1000, "filter": null, "splits": null, "split": null, "split_key": null,
               "shuffle": true, "block_size": 1, "window": 1, "seed": 0},
     "fingerprint": "9f86d081884c7d65",
     "batch_size": 256, "world_size": 2, "drop_last": false, "columns": ["x", "label"],
     "epoch": 1, "sample": 512}

* ``dataset`` is the identity of the pinned version (:func:`lanceloader.rows.dataset.dataset_identity`):
  a hash of its fragments' data and deletion file names, row counts and the schema. Lance names
  every data file it writes uniquely, so a copy or a move of the dataset keeps the identity and a
  dataset re-created at the same URI (even with the same version number and row count) does not.
* ``fingerprint`` hashes ``dataset``, ``version`` and ``order``; it is verified on load, so a state
  whose dataset or order was edited by hand is refused.
* ``sample`` counts global samples of ``epoch`` consumed by all ranks together (batches handed to
  the training loop, never merely prefetched). ``sample == order["rows"]`` is the *end* of the
  epoch: its last batch was delivered but the loop has not yet seen ``StopIteration``; resuming
  there gives the empty remainder of that epoch, then the next one.

What may differ on load:

* ``world_size``: always (elastic resume).
* ``batch_size``, ``drop_last``, ``columns``: only when named in ``allow_changes``; the remaining
  samples of the epoch are the same, cut into batches of the new size.
* ``uri``: only when named in ``allow_changes`` (the dataset was copied or moved; its identity
  must still match).
* the dataset's version and identity and the order settings: never; they define which sample is
  next.

A state missing a key, with a key of the wrong type, or of an unknown format raises
:class:`StateMismatchError` naming the key. Format-1 states (no identity) still load: they are
checked by URI, version and order, and a warning says that the next ``state_dict()`` is format 2.

Example::

    >>> from lanceloader.ordering.order import Order
    >>> spec = StreamSpec(num_rows=10, order=order_settings(None, Order(10)), batch_size=4)
    >>> state = spec.state(epoch=0, sample=4)
    >>> state["format"], resume_point(state, spec)
    (2, (0, 4))
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lanceloader.ordering.plan import Plan

FORMAT = 2
CHANGEABLE = ("batch_size", "drop_last", "columns", "uri")

_logger = logging.getLogger("lanceloader")
_NONE = type(None)
# The keys of a state and the types each may have (bool is not an int here).
KEYS: dict[str, tuple[type, ...]] = {
    "format": (int,),
    "uri": (str, _NONE),
    "version": (int, _NONE),
    "dataset": (str, _NONE),
    "order": (dict,),
    "fingerprint": (str,),
    "batch_size": (int,),
    "world_size": (int,),
    "drop_last": (bool,),
    "columns": (list, _NONE),
    "epoch": (int,),
    "sample": (int,),
}
ORDER_KEYS: dict[str, tuple[type, ...]] = {
    "rows": (int,),
    "filter": (str, _NONE),
    "splits": (dict, _NONE),
    "split": (str, _NONE),
    "split_key": (str, _NONE),
    "shuffle": (bool,),
    "block_size": (int,),
    "window": (int,),
    "seed": (int,),
}
MIX_KEYS: dict[str, tuple[type, ...]] = {
    "sources": (dict,),
    "quotas": (dict,),
    "epoch": (str,),
    "source_column": (str, _NONE),
    "run_length": (int,),
}
# A mix's weights over the run (ordering/mixrun.py); states written before schedules have
# "offsets" instead.
MIX_RUN_KEYS: dict[str, tuple[type, ...]] = {
    "schedule": (list,),
    "feedback": (list,),
    "anchor": (dict,),
    "digest": (str,),
}
WORKER_KEYS: dict[str, tuple[type, ...]] = {
    "id": (int,),
    "count": (int,),
    "start": (int,),
    "batches": (int,),
}


class StateMismatchError(ValueError):
    """A state that cannot resume this stream: another dataset or order, or a damaged state."""


def order_settings(source: Any, order: Any, num_rows: int | None = None) -> dict[str, Any]:
    """The settings that define an order (``state["order"]``): the rows' ``settings()`` (filter
    and split, None where the rows have none; a packing adds ``"pack"`` and a mix ``"mix"``;
    ``source`` is None for samplers over a plain length) and the ``Order``'s."""
    no_filter = {"filter": None, "splits": None, "split": None, "split_key": None}
    rows = {**no_filter, **(source.settings() if source is not None else {})}
    return {
        "rows": order.num_rows if num_rows is None else num_rows,
        **rows,
        "shuffle": order.shuffle,
        "block_size": order.block_size,
        "window": order.window,
        "seed": order.seed,
    }


def fingerprint(dataset: str | None, version: int | None, order: dict[str, Any]) -> str:
    """A short stable hash of what defines the stream's samples: dataset identity, version and
    order settings."""
    blob = json.dumps(
        {"dataset": dataset, "version": version, "order": order},
        sort_keys=True,
        separators=(",", ":"),
    ).encode()
    return hashlib.blake2b(blob, digest_size=8).hexdigest()


def _fingerprint_v1(order: dict[str, Any]) -> str:
    blob = json.dumps(order, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.blake2b(blob, digest_size=8).hexdigest()


@dataclass(frozen=True)
class StreamSpec:
    """Everything a state records besides the position, and the plan of this rank.

    Built once by each stateful class (``Loader``, samplers, ``IterableDataset``); ``uri``,
    ``version`` and ``dataset`` are ``None`` for a sampler over a plain number of rows. With
    ``named`` (the rows' ``DatasetName``), the identity is read from it when a state is first
    made or checked (:attr:`identity`): Lance rows make it then, not at construction (every
    fragment's metadata: 20-30 ms over 2,000 fragments).
    """

    num_rows: int
    order: dict[str, Any]
    batch_size: int
    world_size: int = 1
    rank: int = 0
    drop_last: bool = False
    uri: str | None = None
    version: int | None = None
    dataset: str | None = None
    columns: tuple[str, ...] | None = None
    named: Any = field(default=None, compare=False, repr=False)

    @property
    def identity(self) -> str | None:
        """The dataset identity: ``dataset``, or ``named``'s."""
        return self.dataset if self.named is None else self.named.identity

    def plan(self, start: int = 0) -> Plan:
        """This rank's plan for an epoch that starts at global sample ``start``."""
        return Plan(
            self.num_rows, self.batch_size, self.world_size, self.rank, self.drop_last, start
        )

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.identity, self.version, self.order)

    def state(self, epoch: int, sample: int, **extra: Any) -> dict[str, Any]:
        """The state at ``(epoch, sample)``: the same keys at every position (plus ``extra``)."""
        return {
            "format": FORMAT,
            "uri": self.uri,
            "version": self.version,
            "dataset": self.identity,
            "order": dict(self.order),
            "fingerprint": self.fingerprint,
            "batch_size": self.batch_size,
            "world_size": self.world_size,
            "drop_last": self.drop_last,
            "columns": None if self.columns is None else list(self.columns),
            "epoch": epoch,
            "sample": sample,
            **extra,
        }


def resume_point(
    saved: Any, spec: StreamSpec, allow_changes: tuple[str, ...] | list[str] = ()
) -> tuple[int, int]:
    """Check ``saved`` against ``spec`` and return its ``(epoch, sample)``.

    Raises :class:`StateMismatchError` naming every difference that matters (both sides, and the
    fix where there is one), or the key that is missing or of the wrong type.
    """
    allow = tuple(allow_changes)
    unknown = [k for k in allow if k not in CHANGEABLE]
    if unknown:
        raise ValueError(
            f"allow_changes={unknown} cannot be allowed: only {CHANGEABLE} keep the order sound; "
            "a different dataset version, filter, split, shuffle or seed defines another order"
        )
    check_keys(saved)
    problems = _dataset_problems(saved, spec, allow)
    for key in sorted(set(saved["order"]) | set(spec.order)):
        a, b = saved["order"].get(key), spec.order.get(key)
        if a != b:
            problems.append(f"order setting {key!r}: state has {a!r}, this loader has {b!r}")
    current = spec.state(0, 0)
    for key in ("batch_size", "drop_last", "columns"):
        either_none = key == "columns" and None in (saved[key], current[key])  # a sampler's
        if key not in allow and saved[key] != current[key] and not either_none:
            problems.append(
                f"{key}: state has {saved[key]!r}, this loader has {current[key]!r} "
                f"(pass allow_changes=({key!r},) to resume with the new value)"
            )
    if problems:
        raise StateMismatchError(
            "cannot load this state into this loader:\n  " + "\n  ".join(problems)
        )
    epoch, sample = saved["epoch"], saved["sample"]
    if epoch < 0 or not 0 <= sample <= spec.num_rows:
        raise StateMismatchError(
            f"state position (epoch {epoch}, sample {sample}) is outside the stream: epochs "
            f"count from 0 and an epoch has samples 0 to {spec.num_rows}"
        )
    if saved["format"] == 1:
        _logger.warning(
            "loaded a format-1 loader state: it carries no dataset identity, so it was checked "
            "by URI, version and order only; state_dict() now writes format %d",
            FORMAT,
        )
    return epoch, sample


def check_keys(saved: Any) -> None:
    """Raise :class:`StateMismatchError` unless ``saved`` has every key, each of its type, a
    known format and an unedited fingerprint."""
    if not isinstance(saved, dict):
        raise StateMismatchError(
            f"expected a state dict from state_dict(), got {type(saved).__name__}"
        )
    if "format" not in saved:
        raise StateMismatchError(
            f"state has no 'format' key (keys: {sorted(saved)}); it was not made by "
            "state_dict() of lanceloader"
        )
    fmt = saved["format"]
    if fmt not in (1, FORMAT):
        raise StateMismatchError(
            f"state key 'format' is {fmt!r}; this version of lanceloader reads formats 1 and "
            f"{FORMAT}. A newer lanceloader wrote it: upgrade lanceloader to resume from it"
        )
    keys = {k: v for k, v in KEYS.items() if not (fmt == 1 and k == "dataset")}
    _check_types(saved, keys, "state")
    _check_types(saved["order"], ORDER_KEYS, "state['order']")
    if "mix" in saved["order"]:
        _check_mix(saved["order"]["mix"])
    if "worker" in saved:
        if not isinstance(saved["worker"], dict):
            raise StateMismatchError("state key 'worker' must be a dict")
        _check_types(saved["worker"], WORKER_KEYS, "state['worker']")
    if fmt == 1:
        expected = _fingerprint_v1(saved["order"])
    else:
        expected = fingerprint(saved["dataset"], saved["version"], saved["order"])
    if saved["fingerprint"] != expected:
        raise StateMismatchError(
            f"state key 'fingerprint' is {saved['fingerprint']!r} but the state's dataset and "
            f"order hash to {expected!r}: the state was edited or damaged. Use the state as "
            "state_dict() returned it"
        )


def _check_mix(mix: Any) -> None:
    """A mix section (``state["order"]["mix"]``) whose every part has its type: its sources'
    names in ``sources``, ``quotas`` and the anchor piece's quotas and base (or, written before
    schedules, ``offsets``), each an int."""
    where = "state['order']['mix']"
    if not isinstance(mix, dict):
        raise StateMismatchError(f"{where} must be a dict, got {type(mix).__name__}")
    _check_types(mix, MIX_KEYS, where)
    names = set(mix["sources"])
    per_source = {"quotas": mix["quotas"]}
    if "offsets" in mix:  # a state written before schedules
        per_source["offsets"] = mix["offsets"]
    else:
        _check_types(mix, MIX_RUN_KEYS, where)
        anchor = mix["anchor"]
        _check_types(anchor, {"step": (int,), "index": (int,), "piece": (dict,)}, where)
        piece = anchor["piece"]
        per_source.update(anchor_quotas=piece.get("quotas"), anchor_base=piece.get("base"))
    for key, values in per_source.items():
        if (
            not isinstance(values, dict)
            or set(values) != names
            or not all(type(v) is int for v in values.values())
        ):
            raise StateMismatchError(
                f"{where}[{key!r}] must give an int for each source {sorted(names)}, got "
                f"{values!r}: the state was edited or damaged"
            )
    if not all(
        isinstance(s, dict) and set(s) == {"dataset", "version", "order"}
        for s in mix["sources"].values()
    ):
        raise StateMismatchError(
            f"{where}['sources'] must hold each source's dataset, version "
            "and order: the state was edited or damaged"
        )


def _check_types(saved: dict[str, Any], keys: dict[str, tuple[type, ...]], where: str) -> None:
    for key, types in keys.items():
        if key not in saved:
            raise StateMismatchError(
                f"{where} has no key {key!r}; a state from state_dict() always has it "
                "(was it truncated or edited?)"
            )
        value = saved[key]
        if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
            names = " or ".join("None" if t is _NONE else t.__name__ for t in types)
            raise StateMismatchError(
                f"{where}[{key!r}] must be {names}, got {value!r} ({type(value).__name__})"
            )


def _dataset_problems(saved: dict[str, Any], spec: StreamSpec, allow: tuple[str, ...]) -> list[str]:
    if spec.uri is None:  # a sampler over a plain number of rows: no dataset to compare
        return []
    uri, version, identity = saved["uri"], saved["version"], saved.get("dataset")
    if saved["format"] == 1:
        if (uri, version) != (spec.uri, spec.version):
            return [
                f"dataset: state has {uri!r} version {version}, this loader reads "
                f"{spec.uri!r} version {spec.version}" + _version_hint(version)
            ]
        return []
    if version != spec.version:
        return [
            f"dataset version: state has version {version} of {uri!r}, this loader reads "
            f"version {spec.version} of {spec.uri!r}" + _version_hint(version)
        ]
    if identity != spec.identity:
        return [
            f"dataset identity: state has dataset {identity} at {uri!r}, this loader reads "
            f"dataset {spec.identity} at {spec.uri!r} (both version {version}): these are "
            "different data (re-created, or overwritten and cleaned up), so the state's "
            "samples do not exist here. Point the loader at the dataset the state came from, "
            "or start without the state"
        ]
    if not same_location(uri, spec.uri) and "uri" not in allow:
        return [
            f"dataset location: state has {uri!r}, this loader reads {spec.uri!r}; it is "
            f"the same dataset (identity {identity}, version {version}), copied or moved. "
            "Pass allow_changes=('uri',) to resume on it"
        ]
    return []


def local_uri(uri: str) -> str:
    """The name of the dataset at ``uri``: a local path made absolute with symlinks resolved
    (a relative path, an absolute one and a symlink to it name one dataset, so a state saved
    in one working directory resumes from another); object-store and ``file://`` URIs as
    written, less a trailing ``/``.

    >>> local_uri("s3://bucket/data.lance/"), local_uri("/data/../data/x.lance")
    ('s3://bucket/data.lance', '/data/x.lance')
    """
    if "://" in uri:
        return uri.rstrip("/")
    return os.path.realpath(uri)


def same_location(saved: str | None, current: str | None) -> bool:
    """Whether a state's dataset location is the loader's, both named by :func:`local_uri`
    (states written before locations were stored that way may hold a relative path).

    >>> same_location("s3://b/d.lance/", "s3://b/d.lance"), same_location("a/../x", "x")
    (True, True)
    """
    if saved is None or current is None:
        return saved == current
    return local_uri(saved) == local_uri(current)


def _version_hint(version: int | None) -> str:
    return (
        f" (pass version={version} to the loader to read the version the state was taken "
        "on, if the dataset still has it)"
    )


def save_state(path: str | os.PathLike[str], state: dict[str, Any]) -> None:
    """Write ``state`` as JSON to ``path`` atomically (a reader never sees a partial file).

    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "loader.json")
    >>> save_state(path, {"format": 2, "epoch": 0, "sample": 256})
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
    """Read a state written by :func:`save_state` (checked when it is loaded into a loader)."""
    try:
        with open(path) as f:
            state = json.load(f)
    except FileNotFoundError:
        raise FileNotFoundError(f"no loader state at {os.fspath(path)!r}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"{os.fspath(path)!r} is not a loader state (invalid JSON: {exc})"
        ) from exc
    if not (isinstance(state, dict) and "format" in state):
        raise ValueError(f"{os.fspath(path)!r} holds JSON that is not a loader state")
    return state
