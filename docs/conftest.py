"""The guide's copy-pasteable blocks run in the tests, as they are.

A ```` ```python ```` block right after a ``<!-- test -->`` line (invisible on the site) is part
of its page's script: the page's marked blocks run in order, in one namespace, in a fresh
temporary working directory, exactly as a reader pasting them into a file would run them.
``>>>`` blocks are doctests (pytest's ``--doctest-glob``) and run separately.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

MARK = "<!-- test -->"
BLOCK = re.compile(r"^<!-- test -->\n```python\n(.*?)^```", re.S | re.M)


def page_blocks(text: str) -> list[tuple[int, str]]:
    """The marked blocks of a page and the line each starts on (1-based).

    >>> page_blocks("# t\\n<!-- test -->\\n```python\\nx = 1\\n```\\n")
    [(4, 'x = 1\\n')]
    """
    return [(text.count("\n", 0, m.start(1)) + 1, m.group(1)) for m in BLOCK.finditer(text)]


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    if file_path.suffix == ".md" and MARK in file_path.read_text():
        return PageScripts.from_parent(parent, path=file_path)
    return None


class PageScripts(pytest.File):
    """A page with marked blocks: one test, its script."""

    def collect(self) -> Iterator[pytest.Item]:
        yield PageScript.from_parent(self, name="python blocks")


class PageScript(pytest.Item):
    """Runs a page's marked blocks in order, in one namespace, in a temporary directory."""

    def runtest(self) -> None:
        namespace: dict[str, Any] = {"__name__": "__main__"}
        before = os.getcwd()
        with tempfile.TemporaryDirectory() as work:
            os.chdir(work)
            try:
                for line, code in page_blocks(self.path.read_text()):
                    # Blank lines first, so tracebacks show the page's own line numbers.
                    exec(compile("\n" * (line - 1) + code, str(self.path), "exec"), namespace)
            finally:
                os.chdir(before)

    def reportinfo(self) -> tuple[Path, int, str]:
        return self.path, 0, f"{self.path.name}: python blocks"
