"""The progress record of a ``materialize`` run: which pieces of the epoch are written, with
which settings, and what was in the output before. It lives in this machine's cache directory
(:func:`progress_path`), never inside the dataset, so the output can be removed or changed
behind its back: every recorded piece is checked against the output before it is trusted
(:func:`whole_pieces`), and a piece whose files are missing or not what was recorded is
written again.

Format (JSON, ``"format": 2``): ``fingerprint`` (a hash of the settings), ``lineage`` (the
settings), ``per_piece`` (batches per piece), ``doubts`` (where the transform's identity is
not sure: such a run is never resumed), ``before`` (the output's data files when the first run
began: name to bytes) and ``pieces`` (number to ``{"fragments": [metadata as JSON], "schema":
IPC hex}``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from lance.file import LanceFileReader
from lance.fragment import FragmentMetadata

from lanceloader.write.runs import (
    data_files,
    leftover_files,
    local_path,
    record_path,
    remove_files,
    save_json,
)

FORMAT = 2


def progress_path(out: str) -> Path:
    """Where a run into ``out`` records its pieces: in this machine's cache directory
    (``$XDG_CACHE_HOME`` or ``~/.cache``, then ``lanceloader/materialize/``), named by a hash of
    the output's location (a local path with symlinks resolved, or the URI); never inside the
    dataset."""
    return record_path("materialize", out)


def load(
    path: Path, settings: dict[str, Any], out: str, restart: bool
) -> tuple[dict[str, Any], tuple[int, int]]:
    """The record to go on with: that of an unfinished run with the same ``settings``
    (``fingerprint``, ``lineage``, ``per_piece``, ``doubts``), or a new one. A record of a run
    with other settings, or whose transform's identity is not sure, is refused (``ValueError``
    naming why, offering ``restart``), or with ``restart`` discarded: its pieces' data files
    are removed, and their (files, bytes) returned."""
    fresh = {"format": FORMAT, **settings, "before": data_files(out), "pieces": {}}
    try:
        state = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return fresh, (0, 0)
    if "before" in state:  # what was there before the first run stays out of its leftovers
        fresh["before"] = state["before"]
    if not state.get("pieces"):
        return fresh, (0, 0)
    doubts = [*state.get("doubts", []), *settings["doubts"]]
    if state.get("fingerprint") == settings["fingerprint"] and not doubts:
        return state, (0, 0)
    if restart:
        return fresh, remove_pieces(out, state["pieces"])
    if state.get("fingerprint") == settings["fingerprint"]:
        raise ValueError(_unsure(out, path, state, doubts))
    raise ValueError(_other_settings(out, path, state, settings))


def whole_pieces(
    out: str, pieces: dict[str, Any], storage_options: dict[str, str] | None = None
) -> list[str]:
    """The numbers of the recorded ``pieces`` whose data files are all in ``out`` and what was
    recorded: a Lance file of the recorded rows (and, locally, bytes)."""
    return [
        number
        for number, piece in pieces.items()
        if all(_whole(out, fragment, storage_options) for fragment in piece["fragments"])
    ]


def _whole(out: str, fragment: dict[str, Any], storage_options: dict[str, str] | None) -> bool:
    metadata = FragmentMetadata.from_json(json.dumps(fragment))
    path = local_path(out)
    for file in metadata.files:
        name = os.path.basename(file.path)
        if path is not None:
            try:
                if os.stat(os.path.join(path, "data", name)).st_size != file.file_size_bytes:
                    return False
            except OSError:
                return False
        try:
            rows = LanceFileReader(
                f"{out.rstrip('/')}/data/{name}", storage_options=storage_options
            ).num_rows()
        except Exception:  # missing, unreadable or not a Lance file: written again
            return False
        if rows != metadata.physical_rows:
            return False
    return True


def piece_files(pieces: dict[str, Any]) -> set[str]:
    """The data file names of the recorded ``pieces``."""
    return {
        os.path.basename(file["path"])
        for piece in pieces.values()
        for fragment in piece["fragments"]
        for file in fragment["files"]
    }


def remove_leftovers(
    out: str, state: dict[str, Any], storage_options: dict[str, str] | None = None
) -> tuple[int, int]:
    """Remove the local data files of ``out`` that earlier runs of this record wrote and
    nothing keeps (not there before the first run, in no recorded piece, in no version: a
    piece cut short by a kill or an error). Returns (files, bytes) removed."""
    keep = set(state.get("before", data_files(out))) | piece_files(state["pieces"])
    return remove_files(out, leftover_files(out, keep, storage_options))


def remove_pieces(out: str, pieces: dict[str, Any]) -> tuple[int, int]:
    """Delete the data files of the recorded (uncommitted) ``pieces`` of a local output (an
    object store's are left to Lance's ``cleanup_old_versions``). Returns (files, bytes)."""
    path = local_path(out)
    if path is None:
        return 0, 0
    files = data_files(out)
    names = {name: files[name] for name in piece_files(pieces) if name in files}
    return remove_files(out, names)


def save(path: Path, state: dict[str, Any]) -> None:
    """Save the record (atomically: a kill leaves the old record or the new one)."""
    save_json(path, state)


def _unsure(out: str, path: Path, state: dict[str, Any], doubts: list[str]) -> str:
    return (
        f"an unfinished materialize into {out!r} ({len(state['pieces'])} pieces written, "
        f"recorded in {os.fspath(path)!r}) cannot be resumed: its transform's value cannot be "
        f"read entirely ({'; '.join(doubts[:5])}), so this run's transform may differ from the "
        "one that wrote those pieces and would mix rows transformed two ways. Pass "
        "restart=True to discard its pieces and start over (or keep such things out of the "
        "transform's reach: give it plain values, arrays or objects pickle can save)"
    )


def _other_settings(out: str, path: Path, state: dict[str, Any], settings: dict[str, Any]) -> str:
    """Why the run recorded in ``state`` cannot be resumed with ``settings``: what differs."""
    then = {**state.get("lineage", {}), "batches per piece": state.get("per_piece")}
    now = {**settings["lineage"], "batches per piece": settings["per_piece"]}
    if (
        then.get("transform_id") != now["transform_id"]
        and then.get("transform") == now["transform"]
    ):  # the same description, another value (code, closure, globals, hidden state)
        then["transform"] = f"{then['transform']} (identity {then['transform_id']})"
        now["transform"] = f"{now['transform']} (identity {now['transform_id']})"
    differ = [
        f"{key}: {then.get(key)!r} then, {now[key]!r} now"
        for key in now
        if key != "transform_id"
        and json.dumps(then.get(key), default=str, sort_keys=True)
        != json.dumps(now[key], default=str, sort_keys=True)
    ]
    return (
        f"an unfinished materialize into {out!r} ({len(state['pieces'])} pieces written, "
        f"recorded in {os.fspath(path)!r}) had other settings: {'; '.join(differ)}. Rerun "
        "it with its settings to resume it, or pass restart=True to discard its pieces and "
        "start over with these"
    )
