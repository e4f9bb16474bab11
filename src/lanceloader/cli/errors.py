"""Bad input for the command line: :class:`CommandError`, which ``main`` prints as one line on
stderr with exit code 2, and the helpers that make such errors.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from lanceloader.rows.dataset import ReadError, strip_rust_paths

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
