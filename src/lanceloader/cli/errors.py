"""Bad input for the command line: :class:`CommandError`, which ``main`` prints as one line on
stderr with exit code 2, and the helpers that make such errors (among them
:func:`refuse_convertible`: a folder of images, Parquet or CSV given where a Lance dataset is
expected gets the ``lanceloader convert`` command that makes one).
"""

from __future__ import annotations

import contextlib
import os
import shlex
from collections.abc import Iterator
from pathlib import Path

from lanceloader.rows.dataset import ReadError, strip_rust_paths
from lanceloader.rows.store import is_object_store
from lanceloader.write.convert import IMAGE_SUFFIXES, is_lance_dataset
from lanceloader.write.media import media_kind

# What convert reads as tables (write/convert.py), by suffix.
TABLE_SUFFIXES = {".parquet": "Parquet", ".csv": "CSV", ".tsv": "CSV"}
# Entries of a folder looked at to recognise what it holds: a bound on a huge tree's cost.
ENTRIES_LOOKED_AT = 1000

# Errors of the library that mean "bad input": reported as one line, exit code 2.
INPUT_ERRORS = (ValueError, TypeError, FileNotFoundError, NotImplementedError, ReadError)


class CommandError(Exception):
    """A bad argument or bad input: ``main`` prints it as one line and returns 2."""


def one_line(message: object) -> str:
    """``message`` on one line: whitespace runs become one space, and the Rust source locations
    that Lance appends to its errors are dropped.

    >>> one_line("no field 'y'.\\n  Valid: x, /home/ci/lance/rust/src/scanner.rs:839:33)")
    "no field 'y'. Valid: x)"
    """
    return " ".join(strip_rust_paths(str(message)).split())


@contextlib.contextmanager
def input_errors() -> Iterator[None]:
    """Turn the library's bad-input errors raised inside the block into :class:`CommandError`."""
    try:
        yield
    except INPUT_ERRORS as exc:
        raise CommandError(str(exc)) from exc


def convertible_kind(path: str) -> str | None:
    """What ``lanceloader convert`` can make a Lance dataset of at local ``path``, in words, or
    ``None`` (a Lance dataset, an object-store URI, nothing there, or nothing convert reads).

    At most :data:`ENTRIES_LOOKED_AT` entries of a folder are looked at.

    >>> import tempfile
    >>> root = Path(tempfile.mkdtemp())
    >>> (root / "cat").mkdir(); _ = (root / "cat" / "1.jpg").write_bytes(b"")
    >>> convertible_kind(str(root))
    'a folder of images in the ImageFolder layout (root/<class>/<image>: 1 class folder)'
    >>> _ = (root / "t.parquet").write_bytes(b""); convertible_kind(str(root / "t.parquet"))
    'a Parquet file'
    """
    if is_object_store(path) or path.startswith("file://"):
        return None
    p = Path(path).expanduser()
    if p.is_file():
        kind = TABLE_SUFFIXES.get(p.suffix.lower())
        return f"a {kind} file" if kind else None
    if not p.is_dir() or (p / "_versions").is_dir():
        return None
    if (p / "dataset_info.json").exists() or (p / "state.json").exists():
        return "a Hugging Face dataset saved with save_to_disk"
    with contextlib.suppress(ValueError):  # mixed kinds: convert itself says so, naming them
        media = media_kind(p, is_lance_dataset)
        if media is not None:
            return f"a folder of {media} files"
    entries = list(_first_entries(p))
    folders = [e for e in entries if e.is_dir()]
    if folders:  # convert reads a folder with sub-folders as an image folder
        if any(_holds_an_image(f) for f in folders):
            return (
                f"a folder of images in the ImageFolder layout (root/<class>/<image>: "
                f"{len(folders)}{'+' if len(entries) >= ENTRIES_LOOKED_AT else ''} class "
                f"folder{'s' if len(folders) > 1 else ''})"
            )
        return None
    kinds = {
        TABLE_SUFFIXES[e.suffix.lower()] for e in entries if e.suffix.lower() in TABLE_SUFFIXES
    }
    return f"a folder of {kinds.pop()} files" if len(kinds) == 1 else None


def _first_entries(folder: Path) -> Iterator[Path]:
    """Up to :data:`ENTRIES_LOOKED_AT` entries of ``folder``, sorted by name."""
    with os.scandir(folder) as it:
        names = sorted(e.name for _, e in zip(range(ENTRIES_LOOKED_AT), it, strict=False))
    return (folder / name for name in names)


def _holds_an_image(folder: Path) -> bool:
    """Whether one of the first :data:`ENTRIES_LOOKED_AT` files under ``folder`` is an image."""
    seen = 0
    for _, _, names in os.walk(folder):
        for name in names:
            if os.path.splitext(name)[1].lower() in IMAGE_SUFFIXES:
                return True
            seen += 1
            if seen >= ENTRIES_LOOKED_AT:
                return False
    return False


def converted_path(path: str) -> str:
    """Where ``lanceloader convert`` should write ``path`` by default: beside it, ``.lance``.

    >>> converted_path("images/train/"), converted_path("data/table.parquet")
    ('images/train.lance', 'data/table.lance')
    """
    p = Path(path.rstrip("/") or "/")
    return str(
        p.with_suffix(".lance")
        if p.suffix.lower() in TABLE_SUFFIXES
        else p.with_name(p.name + ".lance")
    )


def refuse_convertible(path: str, command: str) -> None:
    """Raise :class:`CommandError` when ``path`` is something ``lanceloader convert`` reads
    (:func:`convertible_kind`) rather than a Lance dataset, with the exact command that
    converts it and the one to run next.

    >>> import tempfile
    >>> csv = Path(tempfile.mkdtemp()) / "my table.csv"
    >>> _ = csv.write_text("x\\n1\\n")
    >>> refuse_convertible(str(csv), "inspect")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    lanceloader.cli.errors.CommandError: '.../my table.csv' is a CSV file, not a Lance dataset (a directory with _versions/); convert it once: lanceloader convert '.../my table.csv' '.../my table.lance', then: lanceloader inspect '.../my table.lance'
    """
    kind = convertible_kind(path)
    if kind is None:
        return
    out = converted_path(path)
    raise CommandError(
        f"{path!r} is {kind}, not a Lance dataset (a directory with _versions/); convert it "
        f"once: lanceloader convert {shlex.quote(path)} {shlex.quote(out)}, then: "
        f"lanceloader {command} {shlex.quote(out)}"
    )
