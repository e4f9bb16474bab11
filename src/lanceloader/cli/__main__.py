"""``python -m lanceloader.cli``: the same as the ``lanceloader`` command."""

from __future__ import annotations

import sys

from lanceloader.cli import main

if __name__ == "__main__":
    sys.exit(main())
