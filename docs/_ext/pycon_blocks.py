"""A Griffe extension for the API reference (mkdocs.yml): the docstrings' ``>>>`` examples become
``pycon`` code blocks.

The docstrings are written for doctest (the test suite runs them), as plain ``>>>`` lines or
reST ``Example::`` blocks; Markdown would show the first as nested quotes and read outputs such
as ``[[2, 3], [6, 7]]`` as links.
"""

from __future__ import annotations

from typing import Any

import griffe


def fence_examples(text: str) -> str:
    r"""``text`` with each run of ``>>>`` lines and their output fenced as ``pycon``.

    >>> fence_examples("Intro.\n>>> 1 + 1\n2\n\nMore.").splitlines()
    ['Intro.', '```pycon', '>>> 1 + 1', '2', '```', '', 'More.']
    """
    lines = text.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.lstrip().startswith(">>>"):
            out.append(line[:-2] + ":" if line.endswith("::") else line)
            i += 1
            continue
        indent = len(line) - len(line.lstrip())
        out.append(" " * indent + "```pycon")
        while i < len(lines) and lines[i].strip() and \
                len(lines[i]) - len(lines[i].lstrip()) >= indent:
            out.append(lines[i])
            i += 1
        out.append(" " * indent + "```")
    return "\n".join(out)


class PyconBlocks(griffe.Extension):
    """Fence the examples of every docstring as it is loaded."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = fence_examples(obj.docstring.value)
