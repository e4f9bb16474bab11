"""The guide's copy-pasteable blocks run as they are.

A ```` ```python ```` block right after a ``<!-- test -->`` line (invisible on the site) is part
of its page's script: the page's marked blocks run in order, in one namespace, in a fresh
temporary working directory, exactly as a reader pasting them into a file would run them.
The guide has no ``>>>`` sessions (checked below); docstrings keep theirs (doctests).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"
MARK = "<!-- test -->"
BLOCK = re.compile(r"^<!-- test -->\n```python\n(.*?)^```", re.S | re.M)
PAGES = sorted(p for p in DOCS.glob("*.md") if MARK in p.read_text())


def page_blocks(text: str) -> list[tuple[int, str]]:
    """The marked blocks of a page and the line each starts on (1-based)."""
    return [(text.count("\n", 0, m.start(1)) + 1, m.group(1)) for m in BLOCK.finditer(text)]


def test_blocks_are_found_with_their_lines() -> None:
    text = "# t\n<!-- test -->\n```python\nx = 1\n```\n\n```python\ny = 2\n```\n"
    assert page_blocks(text) == [(4, "x = 1\n")]  # an unmarked block is not run
    assert PAGES, "no page has runnable blocks"


def test_guide_pages_have_no_prompts_to_strip() -> None:
    """Guide examples are plain blocks a reader can paste; ``>>>`` sessions are for docstrings."""
    prompted = [p.name for p in DOCS.glob("*.md") if re.search(r"^>>> ", p.read_text(), re.M)]
    assert not prompted, f"write these pages' examples as <!-- test --> blocks: {prompted}"


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_page_script_runs(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {"__name__": "__main__"}
    for line, code in page_blocks(page.read_text()):
        # Blank lines first, so a traceback points at the page's own line.
        exec(compile("\n" * (line - 1) + code, str(page), "exec"), namespace)
    assert os.getcwd() == str(tmp_path)
