"""The folders ``convert`` reads: an ImageFolder tree (``root/<class>/<image>``) or a tree of
Parquet and CSV files, walked with symbolic links followed (as torchvision's ``ImageFolder``
does), loops and Lance datasets left out and listed.

* **Links.** A link to a folder is read as the folder it names; a link back to a folder on its
  own path (the root, a class folder, any ancestor) would loop for ever, so it is skipped and
  listed with the folder it points to. Two links to one folder read it twice, under both names,
  as ``ImageFolder`` does.
* **Lance datasets.** A folder that is a Lance dataset, finished or not (named ``*.lance``, or
  holding ``_versions/`` or ``_transactions/``, or only Lance's own entries such as the
  ``data/`` of ``.lance`` files a killed write leaves), or the output of this conversion, is
  never read: not as a class, not as files. It is listed with :data:`LANCE_INPUT`.

Every folder left out goes to ``skipped`` as ``(path relative to the root, why)``.

>>> import os, tempfile
>>> root = tempfile.mkdtemp()
>>> for d in ("cat", "dog", "old.lance/_versions"):
...     os.makedirs(os.path.join(root, d))
>>> os.symlink(root, os.path.join(root, "dog", "loop"))
>>> skipped = []
>>> [p.name for p in class_folders(Path(root), skipped)], skipped
(['cat', 'dog'], [('old.lance', 'a Lance dataset or an unfinished Lance write (the output of a conversion?): never read as input')])
>>> list(walk(Path(root, "dog"), skipped, root=Path(root)))
[(...dog', [])]
>>> skipped[-1]
('dog/loop', 'a link back to the root folder (.), a loop: not followed')
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

LANCE_INPUT = (
    "a Lance dataset or an unfinished Lance write (the output of a conversion?): "
    "never read as input"
)
LANCE_ENTRIES = frozenset(
    {"data", "_versions", "_transactions", "_indices", "_deletions", "_refs", "_latest.manifest"}
)


def is_lance_dataset(path: Path, output: str | None = None) -> bool:
    """Whether the directory ``path`` is a Lance dataset, finished or not (see the module's
    text), or the output ``output`` (a real path) of this conversion: never read as input."""
    if path.suffix.lower() == ".lance":
        return True
    if output is not None and os.path.realpath(path) == output:
        return True
    if any(os.path.isdir(os.path.join(path, e)) for e in ("_versions", "_transactions")):
        return True
    if not os.path.isdir(os.path.join(path, "data")):  # a class folder, most often: no listing
        return False
    try:  # only Lance's entries, and a data/ of Lance files (or none yet): an unfinished write
        return set(os.listdir(path)) <= LANCE_ENTRIES and all(
            name.endswith(".lance") for name in os.listdir(os.path.join(path, "data"))
        )
    except OSError:
        return False


def walk(
    top: Path, skipped: list[tuple[str, str]], *, root: Path, output: str | None = None
) -> Iterator[tuple[str, list[str]]]:
    """``(folder, file names)`` of ``top`` and every folder under it, in sorted order, links
    followed; loops and Lance datasets skipped and listed (paths relative to ``root``)."""
    base = os.path.join(os.fspath(root), "")
    stack = [(os.fspath(top), (os.path.realpath(root), os.path.realpath(top)))]
    while stack:
        folder, ancestors = stack.pop()
        try:
            with os.scandir(folder) as scan:
                entries = sorted(scan, key=lambda e: e.name)
        except OSError as exc:
            skipped.append((folder.removeprefix(base), f"cannot list the folder ({exc})"))
            continue
        files, below = [], []
        for entry in entries:
            if entry.is_file():  # a link to a file counts as the file
                files.append(entry.name)
            elif entry.is_dir():
                real = os.path.realpath(entry.path)
                why = _left_out(Path(entry.path), real, ancestors, output)
                if why:
                    skipped.append((entry.path.removeprefix(base), why))
                else:
                    below.append((entry.path, (*ancestors, real)))
            elif entry.is_symlink():
                skipped.append((entry.path.removeprefix(base), "a broken link: not followed"))
        yield folder, files
        stack.extend(reversed(below))


def _left_out(path: Path, real: str, ancestors: tuple[str, ...], output: str | None) -> str:
    """Why the folder ``path`` (real path ``real``; ``ancestors``: the real paths of the root
    and the folders on the way to it) is not read, or ``""``."""
    if real in ancestors:
        where = (
            "the root folder (.)"
            if real == ancestors[0]
            else repr(real.removeprefix(ancestors[0] + os.sep))
        )
        return f"a link back to {where}, a loop: not followed"
    if is_lance_dataset(path, output):
        return LANCE_INPUT
    return ""


def class_folders(
    root: Path, skipped: list[tuple[str, str]], output: str | None = None
) -> list[Path]:
    """The class folders of the ImageFolder tree ``root``, sorted by name: its sub-folders
    (links followed), less loops and Lance datasets (listed in ``skipped``)."""
    folders = []
    real_root = os.path.realpath(root)
    with os.scandir(root) as scan:
        entries = sorted(scan, key=lambda e: e.name)
    for entry in entries:
        if not entry.is_dir():
            continue
        why = _left_out(Path(entry.path), os.path.realpath(entry.path), (real_root,), output)
        if why:
            skipped.append((entry.name, why))
        else:
            folders.append(Path(entry.path))
    return folders


def files_under(
    root: Path,
    suffixes: tuple[str, ...],
    skipped: list[tuple[str, str]],
    output: str | None = None,
    top: Path | None = None,
) -> list[str]:
    """The files under ``top`` (default ``root``) whose names end in one of ``suffixes``
    (lower case), sorted by path, found by :func:`walk`."""
    found = [
        os.path.join(folder, name)
        for folder, names in walk(top or root, skipped, root=root, output=output)
        for name in names
        if os.path.splitext(name)[1].lower() in suffixes
    ]
    return sorted(found)
