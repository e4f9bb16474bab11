"""Runs of the writers (``convert``, ``materialize``): one at a time per output, their records
kept outside the dataset, and what a killed run left behind found and removed.

A run's lock and record live in this machine's cache directory (``$XDG_CACHE_HOME`` or
``~/.cache``, then ``lanceloader/<kind>/``), named by a hash of the output's location (a local
path with symlinks resolved, or the object-store URI less a trailing ``/``), so nothing of ours
is ever inside a dataset. The lock is a ``flock`` (released by the kernel when its holder dies,
even by SIGKILL); a run that finds it held fails at once, and the holder removes the lock file
when it is done.

A Lance write puts its data files into ``<out>/data/`` as it goes and makes them part of the
dataset only in its last step (the commit): a run killed before that leaves files that no
version refers to. :func:`leftover_files` finds them in a local output: files no version refers
to that were not there when the run began.

>>> import tempfile
>>> out = tempfile.mkdtemp() + "/d.lance"
>>> with OutputLock("convert", out, "another convert is writing it"):
...     data_files(out)
{}
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import lance

from lanceloader.rows.store import is_object_store
from lanceloader.write.folders import LANCE_ENTRIES

LOCK_ATTEMPTS = 10  # a lock file removed by its holder between our open and flock: try again


def local_path(out: str) -> str | None:
    """The absolute local path of ``out`` (symlinks resolved), or None for an object store.

    >>> local_path("s3://bucket/d.lance") is None, local_path("/tmp/../tmp/d.lance")
    (True, '/tmp/d.lance')
    """
    if is_object_store(out):
        return None
    return os.path.realpath(out.removeprefix("file://"))


def record_path(kind: str, out: str) -> Path:
    """Where a ``kind`` run into ``out`` keeps its record (``.json``) and lock (``.lock``):
    in this machine's cache directory, named by a hash of the output's location."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    where = local_path(out) or out.rstrip("/")
    name = hashlib.blake2b(where.encode(), digest_size=12).hexdigest()
    return base / "lanceloader" / kind / f"{name}.json"


class OutputLock:
    """The one run of ``kind`` into ``out`` on this machine, as a context manager: entering
    takes the lock or raises ``RuntimeError(busy)`` at once; leaving removes the lock file and
    releases it (a process that opened the file before it was removed sees, after its
    ``flock``, that the path names another file, and tries again)."""

    def __init__(self, kind: str, out: str, busy: str) -> None:
        self.path = record_path(kind, out).with_suffix(".lock")
        self.busy = busy
        self.file: Any = None

    def __enter__(self) -> OutputLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(LOCK_ATTEMPTS):
            file = open(self.path, "a+")
            try:
                fcntl.flock(file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                file.close()
                raise RuntimeError(f"{self.busy} (it holds {os.fspath(self.path)!r})") from None
            try:
                same = os.stat(self.path).st_ino == os.fstat(file.fileno()).st_ino
            except FileNotFoundError:
                same = False
            if same:
                self.file = file
                return self
            file.close()  # its holder removed it as we opened it: the next one is the lock
        raise RuntimeError(
            f"{self.busy}: its lock file {os.fspath(self.path)!r} keeps being replaced; try again"
        )

    def __exit__(self, *exc: object) -> None:
        if self.file is not None:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
            self.file.close()  # releases the flock
            self.file = None


def data_files(out: str) -> dict[str, int]:
    """The data files of the local output ``out`` (name: bytes); ``{}`` for an object store or
    an output without any."""
    path = local_path(out)
    if path is None:
        return {}
    try:
        with os.scandir(os.path.join(path, "data")) as entries:
            return {e.name: e.stat().st_size for e in entries if e.is_file()}
    except FileNotFoundError:
        return {}


def referenced_files(out: str, storage_options: dict[str, str] | None = None) -> set[str]:
    """The names of the data files that some version of the dataset at ``out`` refers to
    (none when there is no dataset)."""
    try:
        latest = lance.dataset(out, storage_options=storage_options)
    except (ValueError, OSError, RuntimeError):
        return set()
    names: set[str] = set()
    for version in latest.versions():
        dataset = latest.checkout_version(version["version"])
        for fragment in dataset.get_fragments():
            names.update(os.path.basename(f.path) for f in fragment.data_files())
    return names


def leftover_files(
    out: str, before: set[str] | dict[str, int], storage_options: dict[str, str] | None = None
) -> dict[str, int]:
    """The data files of the local output ``out`` that a run which began when ``before`` were
    there wrote and no version refers to (name: bytes)."""
    now = data_files(out)
    if not now:
        return {}
    keep = set(before) | referenced_files(out, storage_options)
    return {name: size for name, size in now.items() if name not in keep}


def remove_files(out: str, names: dict[str, int]) -> tuple[int, int]:
    """Delete the data files ``names`` of the local output ``out``; then, if the output holds
    no dataset and nothing else, its empty directories (a failed write can leave an empty
    ``data/`` even when it wrote no file). Returns (files, bytes) removed."""
    path = local_path(out)
    if path is None:
        return 0, 0
    for name in names:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(path, "data", name))
    with contextlib.suppress(OSError):  # only when empty
        os.rmdir(os.path.join(path, "data"))
        os.rmdir(path)
    return len(names), sum(names.values())


def remove_unfinished_write(out: str) -> tuple[int, int]:
    """Delete what an uncommitted Lance write left in the local output ``out`` that held
    nothing when the write began and holds no version now: Lance's own entries only (its
    ``data/`` files, ``_transactions/``, ...), then ``out`` itself if that empties it.
    Returns (data files, bytes) removed."""
    path = local_path(out)
    if path is None or dataset_version(out) is not None or not os.path.isdir(path):
        return 0, 0
    files = data_files(out)
    for entry in LANCE_ENTRIES & set(os.listdir(path)):
        target = os.path.join(path, entry)
        if os.path.isdir(target) and not os.path.islink(target):
            shutil.rmtree(target)
        else:
            os.unlink(target)
    with contextlib.suppress(OSError):  # only when empty
        os.rmdir(path)
    return len(files), sum(files.values())


def is_empty_output(out: str) -> bool:
    """Whether the local output ``out`` does not exist or is an empty directory (an object
    store: False, its listing is left to Lance)."""
    path = local_path(out)
    if path is None:
        return False
    return not os.path.lexists(path) or (os.path.isdir(path) and not os.listdir(path))


def dataset_version(uri: str, storage_options: dict[str, str] | None = None) -> int | None:
    """The latest version of the Lance dataset at ``uri``, or None when there is none."""
    try:
        return lance.dataset(uri, storage_options=storage_options).version
    except (ValueError, OSError, RuntimeError):
        return None


def save_json(path: Path, value: Any) -> None:
    """Write ``value`` to ``path`` atomically: a kill leaves the old record or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(value))
    os.replace(temporary, path)
